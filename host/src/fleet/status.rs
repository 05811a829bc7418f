//! `nanoclaw fleet status`: what the fleet process last wrote to `ROOT/@fleet/status.json` (on
//! every transition), shown as a table or JSON. The same file is what a restarted fleet reads
//! to adopt the runners still alive.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The fleet's own folder under the root. `@` is no session-name character, so it is never a
/// session folder.
pub const STATE_DIR: &str = "@fleet";

/// The status file of the fleet supervising `root`.
pub fn status_path(root: &Path) -> PathBuf {
    root.join(STATE_DIR).join("status.json")
}

/// A session's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SessionState {
    /// No runner, none needed (or queued for a slot: see `why`).
    Stopped,
    /// A runner was started and has not reported yet.
    Starting,
    /// A runner works (a turn, or work due).
    Running,
    /// A runner waits for work; it is stopped after `idleStopSecs`.
    Idle,
    /// A runner was asked to stop and has not exited yet.
    Stopping,
    /// The runner crashed; it is restarted after a delay.
    BackingOff,
    /// Five crashes in a row: retried later.
    Failed,
}

impl SessionState {
    /// The word the table shows.
    pub fn label(self) -> &'static str {
        match self {
            Self::Stopped => "stopped",
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Idle => "idle",
            Self::Stopping => "stopping",
            Self::BackingOff => "backing off",
            Self::Failed => "failed",
        }
    }
}

/// A runner process as the fleet knows it: its pid and start time (clock ticks since boot,
/// `/proc/<pid>/stat` field 22), which together name one process and never a recycled pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerRecord {
    /// Its pid.
    pub pid: u32,
    /// Its start time.
    pub started: u64,
}

/// One session's line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionStatus {
    /// The session's name (its folder under the root).
    pub name: String,
    /// Its state.
    pub state: SessionState,
    /// Since when (RFC 3339).
    pub since: String,
    /// Why, in words.
    pub why: String,
    /// The runner, while one lives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<RunnerRecord>,
    /// Crashes in a row.
    #[serde(default)]
    pub crashes: u32,
    /// The last crash's error (the runner's last log line, or its exit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// What `status.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetStatus {
    /// The fleet process.
    pub pid: u32,
    /// When it was written (RFC 3339).
    pub updated_at: String,
    /// Runners at most.
    pub max_running: usize,
    /// Idle seconds before a runner is stopped.
    pub idle_stop_secs: u64,
    /// How runners are isolated (`process group + ledger`, `cgroup`).
    pub isolation: String,
    /// Every supervised session, by name.
    pub sessions: Vec<SessionStatus>,
}

/// Reads the status file of `root`.
pub fn read(root: &Path) -> Result<FleetStatus> {
    let path = status_path(root);
    let text = fsguard::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (is `nanoclaw fleet --root {}` running, or has it ever run?)",
            path.display(),
            root.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Writes the status file of `root` (whole, by rename).
pub(crate) fn write(root: &Path, status: &FleetStatus) -> Result<()> {
    let path = status_path(root);
    let text = serde_json::to_string_pretty(status)?;
    fsguard::write_private(&path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// Whether process `pid` lives.
pub(crate) fn alive(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(|pid| {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
            && procs_state(pid) != Some('Z')
    })
}

/// The state letter of `/proc/<pid>/stat`.
fn procs_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// `nanoclaw fleet status`: the table, or JSON (`fleetRunning` and each session's `forSecs`
/// added), at `now`; `fleet_running` says whether the fleet process lives.
pub fn render(status: &FleetStatus, now: DateTime<Utc>, fleet_running: bool, json: bool) -> String {
    let for_secs = |since: &str| {
        DateTime::parse_from_rfc3339(since)
            .map(|since| (now - since.with_timezone(&Utc)).num_seconds().max(0))
            .unwrap_or(0)
    };
    if json {
        let mut value = serde_json::to_value(status).unwrap_or_default();
        value["fleetRunning"] = fleet_running.into();
        if let Some(sessions) = value["sessions"].as_array_mut() {
            for (session, line) in sessions.iter_mut().zip(&status.sessions) {
                session["forSecs"] = for_secs(&line.since).into();
            }
        }
        return format!("{value}\n");
    }
    let live = status
        .sessions
        .iter()
        .filter(|s| s.runner.is_some())
        .count();
    let mut out = if fleet_running {
        format!(
            "fleet pid {}: {} of {} runners, idle stop {}s, isolation {}\n",
            status.pid, live, status.max_running, status.idle_stop_secs, status.isolation
        )
    } else {
        format!(
            "fleet NOT running (last pid {}, status of {}): start it with `nanoclaw fleet --root DIR`\n",
            status.pid, status.updated_at
        )
    };
    let width = status
        .sessions
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0)
        .max("SESSION".len());
    out.push_str(&format!(
        "{:<width$}  {:<11}  {:>7}  WHY\n",
        "SESSION", "STATE", "FOR"
    ));
    for session in &status.sessions {
        let mut why = session.why.clone();
        if let Some(runner) = session.runner {
            why.push_str(&format!(" (pid {})", runner.pid));
        }
        if let (Some(error), SessionState::BackingOff | SessionState::Failed) =
            (&session.last_error, session.state)
        {
            why.push_str(&format!("; last error: {error}"));
        }
        out.push_str(&format!(
            "{:<width$}  {:<11}  {:>7}  {}\n",
            session.name,
            session.state.label(),
            crate::timefmt::format_duration(for_secs(&session.since)),
            why
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn sample() -> FleetStatus {
        let line = |name: &str, state, since: &str, why: &str| SessionStatus {
            name: name.into(),
            state,
            since: since.into(),
            why: why.into(),
            runner: None,
            crashes: 0,
            last_error: None,
        };
        let mut running = line(
            "alpha",
            SessionState::Running,
            "2026-01-01T11:59:30Z",
            "turn running",
        );
        running.runner = Some(RunnerRecord {
            pid: 4242,
            started: 99,
        });
        let mut failed = line(
            "gamma",
            SessionState::Failed,
            "2026-01-01T11:00:00Z",
            "5 crashes in a row; retried at 12:10:00",
        );
        failed.crashes = 5;
        failed.last_error = Some("exit status 1: no provider configured".into());
        FleetStatus {
            pid: 7,
            updated_at: "2026-01-01T12:00:00Z".into(),
            max_running: 20,
            idle_stop_secs: 300,
            isolation: "process group + ledger".into(),
            sessions: vec![
                running,
                line(
                    "beta-long-name",
                    SessionState::Stopped,
                    "2026-01-01T10:00:00Z",
                    "no work; next due 2026-01-02T09:00:00Z",
                ),
                failed,
            ],
        }
    }

    fn noon() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-01-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn the_table() {
        expect![[r#"
            fleet pid 7: 1 of 20 runners, idle stop 300s, isolation process group + ledger
            SESSION         STATE            FOR  WHY
            alpha           running          30s  turn running (pid 4242)
            beta-long-name  stopped        2h 0m  no work; next due 2026-01-02T09:00:00Z
            gamma           failed         1h 0m  5 crashes in a row; retried at 12:10:00; last error: exit status 1: no provider configured
        "#]]
        .assert_eq(&render(&sample(), noon(), true, false));
        expect![[r#"
            fleet NOT running (last pid 7, status of 2026-01-01T12:00:00Z): start it with `nanoclaw fleet --root DIR`
            SESSION         STATE            FOR  WHY
            alpha           running          30s  turn running (pid 4242)
            beta-long-name  stopped        2h 0m  no work; next due 2026-01-02T09:00:00Z
            gamma           failed         1h 0m  5 crashes in a row; retried at 12:10:00; last error: exit status 1: no provider configured
        "#]]
        .assert_eq(&render(&sample(), noon(), false, false));
    }

    #[test]
    fn the_json() {
        expect![[r#"
            {"fleetRunning":true,"idleStopSecs":300,"isolation":"process group + ledger","maxRunning":20,"pid":7,"sessions":[{"crashes":0,"forSecs":30,"name":"alpha","runner":{"pid":4242,"started":99},"since":"2026-01-01T11:59:30Z","state":"running","why":"turn running"},{"crashes":0,"forSecs":7200,"name":"beta-long-name","since":"2026-01-01T10:00:00Z","state":"stopped","why":"no work; next due 2026-01-02T09:00:00Z"},{"crashes":5,"forSecs":3600,"lastError":"exit status 1: no provider configured","name":"gamma","since":"2026-01-01T11:00:00Z","state":"failed","why":"5 crashes in a row; retried at 12:10:00"}],"updatedAt":"2026-01-01T12:00:00Z"}
        "#]]
        .assert_eq(&render(&sample(), noon(), true, true));
    }
}
