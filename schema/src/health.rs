//! The health verdict of a session's runner, one function for `agent-runner health` (inside the
//! container, next to the live runner) and `nanoclaw health` (on the host): healthy when the
//! runner is alive and its turn makes progress, else the reason with the fix, in one line.
//!
//! [`check`] reads the DB through one read-only connection of its own: it takes no lock a
//! writer could wait on, writes nothing (no migration, no `journal_mode` switch, no
//! checkpoint) and starts nothing, so an orchestrator may run it every few seconds.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, ErrorCode, OpenFlags};

use crate::rows::{LastEvent, RunnerState};
use crate::time::parse_ts;

/// How long a turn may go without a provider event before `health` calls it stuck, by default:
/// above the runner's own CLI watchdog (`watchdogSecs`, 600 s), which should end a silent turn
/// first; a turn still silent after this means the runner itself is stuck.
pub const DEFAULT_MAX_TURN_SILENCE: Duration = Duration::from_secs(900);

/// How long `health` waits for a lock before calling the DB locked.
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(2);

/// Heartbeats a runner may miss before it counts as hung.
const MISSED_HEARTBEATS: u32 = 3;

/// The smallest stale-heartbeat limit: a loaded machine delays a heartbeat by seconds.
const MIN_STALE_HEARTBEAT: Duration = Duration::from_secs(15);

/// The limits a verdict applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthLimits {
    /// A heartbeat older than this means the runner is hung or dead.
    pub stale_heartbeat: Duration,
    /// A busy turn with no provider event for longer than this is stuck (zero: not checked).
    pub max_turn_silence: Duration,
    /// How long to wait for a lock before the DB counts as locked.
    pub lock_wait: Duration,
}

impl HealthLimits {
    /// The limits for a runner whose heartbeat ticks every `heartbeat`: stale after three missed
    /// heartbeats (at least 15 s).
    pub fn for_heartbeat(heartbeat: Duration, max_turn_silence: Duration) -> Self {
        Self {
            stale_heartbeat: (heartbeat * MISSED_HEARTBEATS).max(MIN_STALE_HEARTBEAT),
            max_turn_silence,
            lock_wait: DEFAULT_LOCK_WAIT,
        }
    }
}

/// A healthy runner: its status and the age of its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Healthy {
    /// `idle`, `busy`, `waiting_user` or `starting`.
    pub status: String,
    /// Seconds since the last heartbeat.
    pub heartbeat_age_secs: i64,
}

impl std::fmt::Display for Healthy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "healthy: runner {}, heartbeat {} s ago",
            self.status, self.heartbeat_age_secs
        )
    }
}

/// Why a runner is not healthy; each message is one line that names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unhealthy {
    /// No file at the DB path.
    #[error(
        "no session DB at {}: the host creates it (`nanoclaw init`) and mounts it; check \
         --db / SESSION_DB and the volume",
        path.display()
    )]
    MissingDb {
        /// The DB path.
        path: PathBuf,
    },
    /// The file cannot be read as a SQLite database.
    #[error(
        "the session DB {} is unusable ({cause}): restore it from a backup or start a new \
         session DB with `nanoclaw init`",
        path.display()
    )]
    Unusable {
        /// The DB path.
        path: PathBuf,
        /// What SQLite or the file system said.
        cause: String,
    },
    /// Another process holds the DB exclusively.
    #[error(
        "the session DB {} stayed locked for {} s: a process holds it exclusively; find it with \
         `fuser {}` and stop it",
        path.display(),
        waited.as_secs_f64(),
        path.display()
    )]
    Locked {
        /// The DB path.
        path: PathBuf,
        /// How long the check waited.
        waited: Duration,
    },
    /// The DB's folder is on a shared filesystem: refused before it is opened.
    #[error(transparent)]
    SharedFilesystem(#[from] fsguard::SharedFilesystem),
    /// The DB has no runner_state: no runner ever started on it.
    #[error("no runner has started on {}: start agent-runner with this DB", path.display())]
    NoRunner {
        /// The DB path.
        path: PathBuf,
    },
    /// The runner exited.
    #[error(
        "the runner stopped{}: start it again{}",
        since_secs.map(|s| format!(" {s} s ago")).unwrap_or_default(),
        if *processing > 0 {
            format!(" (it returns the {processing} row(s) left processing to the queue; or run \
                     `nanoclaw sweep`)")
        } else {
            String::new()
        }
    )]
    Stopped {
        /// Seconds since it stopped, when readable.
        since_secs: Option<i64>,
        /// Rows left `processing`.
        processing: i64,
    },
    /// The heartbeat is older than the limit: the runner is hung or dead.
    #[error(
        "the runner's heartbeat is {} old (limit {} s): the runner{} is hung or was killed; \
         restart it (the container)",
        age_secs.map_or_else(|| "unreadable".to_owned(), |age| format!("{age} s")),
        limit.as_secs(),
        pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default()
    )]
    StaleHeartbeat {
        /// Seconds since the last heartbeat (`None`: unreadable).
        age_secs: Option<i64>,
        /// The limit.
        limit: Duration,
        /// The runner's pid as recorded.
        pid: Option<i64>,
    },
    /// A turn has had no provider event for longer than the limit.
    #[error(
        "the turn has had no provider event for {silent_secs} s (limit {} s{}): the CLI or the \
         runner is stuck; check the model gateway, then restart the runner (its rows return to \
         the queue)",
        limit.as_secs(),
        last.as_ref().map(|e| format!("; last event: {}", e.what)).unwrap_or_default()
    )]
    SilentTurn {
        /// Seconds since the last provider event (or the turn's start).
        silent_secs: i64,
        /// The limit.
        limit: Duration,
        /// The last event of the turn, if any came.
        last: Option<LastEvent>,
    },
}

/// Reads the DB at `path` once, read-only, and returns the verdict at `now`.
pub fn check(path: &Path, limits: &HealthLimits, now: DateTime<Utc>) -> Result<Healthy, Unhealthy> {
    let (state, processing) = read(path, limits.lock_wait)?;
    verdict(path, state.as_ref(), processing, limits, now)
}

/// The verdict on a runner_state row (`None`: no runner ever started) with `processing` rows
/// left in the queue, at `now`.
pub fn verdict(
    path: &Path,
    state: Option<&RunnerState>,
    processing: i64,
    limits: &HealthLimits,
    now: DateTime<Utc>,
) -> Result<Healthy, Unhealthy> {
    let Some(state) = state else {
        return Err(Unhealthy::NoRunner {
            path: path.to_path_buf(),
        });
    };
    if state.status == "stopped" {
        return Err(Unhealthy::Stopped {
            since_secs: age_secs(&state.updated_at, now),
            processing,
        });
    }
    let heartbeat_age = age_secs(&state.heartbeat_at, now);
    let limit_secs = i64::try_from(limits.stale_heartbeat.as_secs()).unwrap_or(i64::MAX);
    let heartbeat_age_secs = match heartbeat_age {
        Some(age) if age <= limit_secs => age,
        _ => {
            return Err(Unhealthy::StaleHeartbeat {
                age_secs: heartbeat_age,
                limit: limits.stale_heartbeat,
                pid: state.pid,
            })
        }
    };
    if !limits.max_turn_silence.is_zero() {
        if let Some(silent_secs) = turn_silence_secs(state, now) {
            let limit = i64::try_from(limits.max_turn_silence.as_secs()).unwrap_or(i64::MAX);
            if silent_secs > limit {
                return Err(Unhealthy::SilentTurn {
                    silent_secs,
                    limit: limits.max_turn_silence,
                    last: turn_last_event(state),
                });
            }
        }
    }
    Ok(Healthy {
        status: state.status.clone(),
        heartbeat_age_secs,
    })
}

/// Seconds a busy turn has gone without a provider event: since its last event, or since the
/// turn began when none came yet. `None` when no turn is running (or while it waits on a
/// person: `waiting_user` is no silence of the model's).
pub fn turn_silence_secs(state: &RunnerState, now: DateTime<Utc>) -> Option<i64> {
    if state.status != "busy" {
        return None;
    }
    let began = parse_ts(&state.updated_at).ok();
    let last = turn_last_event(state).and_then(|event| parse_ts(&event.at).ok());
    let since = began.max(last)?;
    Some((now - since).num_seconds().max(0))
}

/// The last provider event of the runner's current state (an event older than the state's start
/// belongs to an earlier turn).
pub fn turn_last_event(state: &RunnerState) -> Option<LastEvent> {
    let event = state.last_event()?;
    let at = parse_ts(&event.at).ok()?;
    match parse_ts(&state.updated_at) {
        Ok(began) if at < began => None,
        _ => Some(event),
    }
}

fn age_secs(stored: &str, now: DateTime<Utc>) -> Option<i64> {
    parse_ts(stored).ok().map(|at| (now - at).num_seconds())
}

/// The runner_state row and the count of `processing` rows, through a read-only connection.
fn read(path: &Path, lock_wait: Duration) -> Result<(Option<RunnerState>, i64), Unhealthy> {
    let unusable = |cause: String| Unhealthy::Unusable {
        path: path.to_path_buf(),
        cause,
    };
    // Even a read-only connection maps `-shm` and takes its locks (docs/contract/db.md,
    // "Where the DB may live").
    fsguard::refuse_shared_filesystem(path)?;
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return Err(unusable("not a regular file".into())),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Err(Unhealthy::MissingDb {
                path: path.to_path_buf(),
            })
        }
        Err(err) => return Err(unusable(err.to_string())),
    }
    let sqlite = |err: rusqlite::Error| match err.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => Unhealthy::Locked {
            path: path.to_path_buf(),
            waited: lock_wait,
        },
        _ if is_missing_table(&err) => Unhealthy::NoRunner {
            path: path.to_path_buf(),
        },
        _ => unusable(err.to_string()),
    };
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sqlite)?;
    conn.busy_timeout(lock_wait).map_err(sqlite)?;
    let state = crate::runner_state::read_runner_state(&conn).map_err(sqlite)?;
    let processing = crate::queue::count_with_status(&conn, crate::rows::InStatus::Processing)
        .or_else(|err| match is_missing_table(&err) {
            true => Ok(0),
            false => Err(err),
        })
        .map_err(sqlite)?;
    Ok((state, processing))
}

fn is_missing_table(err: &rusqlite::Error) -> bool {
    matches!(err, rusqlite::Error::SqliteFailure(_, Some(message)) if message.starts_with("no such table"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::format_ts;

    const SILENCE: Duration = Duration::from_secs(900);

    fn limits() -> HealthLimits {
        HealthLimits::for_heartbeat(Duration::from_secs(5), SILENCE)
    }

    fn now() -> DateTime<Utc> {
        parse_ts("2026-11-23T10:00:00.000Z").unwrap()
    }

    fn ago(secs: i64) -> String {
        format_ts(now() - chrono::Duration::seconds(secs))
    }

    fn state(status: &str, heartbeat_secs_ago: i64, since_secs_ago: i64) -> RunnerState {
        RunnerState {
            status: status.into(),
            pid: Some(42),
            provider: Some("claude".into()),
            current_tool: None,
            waiting_on: None,
            heartbeat_at: ago(heartbeat_secs_ago),
            updated_at: ago(since_secs_ago),
            last_event: None,
        }
    }

    fn event(secs_ago: i64, what: &str) -> Option<String> {
        Some(
            serde_json::to_string(&LastEvent {
                at: ago(secs_ago),
                what: what.into(),
            })
            .unwrap(),
        )
    }

    fn judge(state: Option<&RunnerState>, processing: i64) -> Result<Healthy, Unhealthy> {
        verdict(
            Path::new("/ws/session.db"),
            state,
            processing,
            &limits(),
            now(),
        )
    }

    #[test]
    fn the_stale_limit_follows_the_heartbeat_interval() {
        let limits = |secs| HealthLimits::for_heartbeat(Duration::from_secs(secs), SILENCE);
        assert_eq!(limits(10).stale_heartbeat, Duration::from_secs(30));
        assert_eq!(limits(1).stale_heartbeat, Duration::from_secs(15));
    }

    #[test]
    fn verdicts_in_each_state() {
        let healthy = judge(Some(&state("idle", 3, 600)), 0).unwrap();
        assert_eq!(
            healthy.to_string(),
            "healthy: runner idle, heartbeat 3 s ago"
        );
        judge(Some(&state("waiting_user", 3, 5000)), 0).unwrap();

        let err = judge(None, 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no runner has started on /ws/session.db: start agent-runner with this DB"
        );
        let err = judge(Some(&state("stopped", 300, 300)), 2).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the runner stopped 300 s ago: start it again (it returns the 2 row(s) left \
             processing to the queue; or run `nanoclaw sweep`)"
        );
        let err = judge(Some(&state("idle", 16, 600)), 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the runner's heartbeat is 16 s old (limit 15 s): the runner (pid 42) is hung or \
             was killed; restart it (the container)"
        );
        let mut unreadable = state("idle", 0, 0);
        unreadable.heartbeat_at = "soon".into();
        assert!(matches!(
            judge(Some(&unreadable), 0),
            Err(Unhealthy::StaleHeartbeat { age_secs: None, .. })
        ));
    }

    #[test]
    fn a_busy_turn_is_silent_from_its_last_event_or_its_start() {
        // No event yet: measured from the turn's start.
        let busy = state("busy", 1, 901);
        let err = judge(Some(&busy), 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the turn has had no provider event for 901 s (limit 900 s): the CLI or the runner \
             is stuck; check the model gateway, then restart the runner (its rows return to the \
             queue)"
        );
        // A recent event keeps a long turn healthy.
        let mut long = state("busy", 1, 5000);
        long.last_event = event(30, "tool Bash");
        judge(Some(&long), 1).unwrap();
        long.last_event = event(1000, "Reconnecting... 2/5");
        assert!(judge(Some(&long), 1)
            .unwrap_err()
            .to_string()
            .contains("for 1000 s (limit 900 s; last event: Reconnecting... 2/5)"));
        // An event of an earlier turn does not count for this one.
        let mut fresh = state("busy", 1, 10);
        fresh.last_event = event(2000, "model output");
        assert_eq!(turn_silence_secs(&fresh, now()), Some(10));
        assert_eq!(turn_last_event(&fresh), None);
        // Zero turns the check off; a person's silence is no model silence.
        let off = HealthLimits {
            max_turn_silence: Duration::ZERO,
            ..limits()
        };
        let path = Path::new("/ws/session.db");
        verdict(path, Some(&state("busy", 1, 5000)), 1, &off, now()).unwrap();
        assert_eq!(
            turn_silence_secs(&state("waiting_user", 1, 5000), now()),
            None
        );
    }

    #[test]
    fn check_reads_the_file_and_names_what_is_wrong_with_it() {
        use crate::{RunnerStatus, SessionDb};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("session.db");
        let limits = limits();
        let err = check(&path, &limits, Utc::now()).unwrap_err();
        assert!(matches!(err, Unhealthy::MissingDb { .. }), "{err}");

        let db = SessionDb::open(&path).unwrap();
        assert!(matches!(
            check(&path, &limits, Utc::now()),
            Err(Unhealthy::NoRunner { .. })
        ));
        db.set_runner_state(RunnerStatus::Idle, Some(7), Some("mock"))
            .unwrap();
        let healthy = check(&path, &limits, Utc::now()).unwrap();
        assert_eq!(healthy.status, "idle");
        // The check wrote nothing: no checkpoint, no change to the data.
        let before = db.runner_state().unwrap();
        check(&path, &limits, Utc::now()).unwrap();
        assert_eq!(db.runner_state().unwrap(), before);

        drop(db);
        // Held exclusively (a process in exclusive locking mode that wrote): locked, after the
        // wait.
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder
            .execute_batch(
                "PRAGMA locking_mode=EXCLUSIVE; BEGIN EXCLUSIVE;
                 UPDATE runner_state SET pid = 8;",
            )
            .unwrap();
        let quick = HealthLimits {
            lock_wait: Duration::from_millis(200),
            ..limits
        };
        let err = check(&path, &quick, Utc::now()).unwrap_err();
        assert!(matches!(err, Unhealthy::Locked { .. }), "{err}");
        assert!(err.to_string().contains("stayed locked for 0.2 s"), "{err}");
        drop(holder);

        let garbage = dir.path().join("garbage.db");
        std::fs::write(&garbage, vec![b'x'; 4096]).unwrap();
        let err = check(&garbage, &limits, Utc::now()).unwrap_err();
        assert!(matches!(err, Unhealthy::Unusable { .. }), "{err}");
        assert!(err.to_string().contains("not a database"), "{err}");
    }
}
