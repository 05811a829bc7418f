//! `nanoclaw fleet` with the process backend and real `agent-runner`s on the mock provider
//! (issue 45's lifecycle, scaled down): wake on a message and idle stop, a task due in seconds,
//! `--max-running` never exceeded, a runner killed mid-turn, the fleet killed and restarted.
//!
//! `agent-runner` is the one beside `nanoclaw` in the target dir (the fleet's default runner);
//! the workspace's test build builds it (scripts/test.sh).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use schema::{MessageOut, SessionDb};

const NANOCLAW: &str = env!("CARGO_BIN_EXE_nanoclaw");

fn agent_runner() -> PathBuf {
    let path = Path::new(NANOCLAW).with_file_name("agent-runner");
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build -p agent-runner` first",
        path.display()
    );
    path
}

fn nanoclaw(args: &[&str]) -> String {
    let out = Command::new(NANOCLAW).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "nanoclaw {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A root with sessions, and the fleet supervising it.
struct Fleet {
    root: PathBuf,
    _dir: tempfile::TempDir,
    child: Option<Child>,
    starts: usize,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Fleet {
    fn new(sessions: usize, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut fleet = Self::create(sessions, args, env);
        fleet.start();
        fleet
    }

    /// The root and its sessions; the fleet not started yet.
    fn create(sessions: usize, args: &[&str], env: &[(&str, &str)]) -> Self {
        assert!(agent_runner().is_file());
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        for n in 0..sessions {
            let folder = root.join(format!("s{n:02}"));
            nanoclaw(&["init", "--workspace", folder.to_str().unwrap()]);
        }
        Self {
            root,
            _dir: dir,
            child: None,
            starts: 0,
            args: args.iter().map(|a| a.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn start(&mut self) {
        assert!(self.child.is_none());
        let log = std::fs::File::create(
            self.root
                .parent()
                .unwrap()
                .join(format!("fleet-{}.log", self.starts)),
        )
        .unwrap();
        self.starts += 1;
        let mut cmd = Command::new(NANOCLAW);
        cmd.args(["fleet", "--root", self.root.to_str().unwrap()])
            .args(&self.args)
            .env("AGENT_PROVIDER", "mock")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        self.child = Some(cmd.spawn().unwrap());
        let started = self.starts;
        wait_until("the fleet's status file", Duration::from_secs(10), || {
            self.status_json().is_some_and(|s| {
                s["pid"].as_u64() == self.child.as_ref().map(|c| u64::from(c.id())) && started > 0
            })
        });
    }

    fn log(&self) -> String {
        (0..self.starts)
            .map(|n| {
                std::fs::read_to_string(self.root.parent().unwrap().join(format!("fleet-{n}.log")))
                    .unwrap_or_default()
            })
            .collect()
    }

    fn kill9(&mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    fn folder(&self, session: &str) -> PathBuf {
        self.root.join(session)
    }

    fn db(&self, session: &str) -> SessionDb {
        SessionDb::open(self.folder(session).join("session.db")).unwrap()
    }

    fn send(&self, session: &str, text: &str) -> String {
        let out = nanoclaw(&[
            "send",
            "--workspace",
            self.folder(session).to_str().unwrap(),
            "--json",
            "--text",
            text,
        ]);
        let sent: serde_json::Value = serde_json::from_str(&out).unwrap();
        sent["id"].as_str().unwrap().to_owned()
    }

    fn replies_to(&self, session: &str, id: &str) -> Vec<MessageOut> {
        self.db(session)
            .messages_out_after(0, 10_000)
            .unwrap()
            .into_iter()
            .filter(|row| row.in_reply_to.as_deref() == Some(id))
            .collect()
    }

    fn status_json(&self) -> Option<serde_json::Value> {
        let out = Command::new(NANOCLAW)
            .args([
                "fleet",
                "status",
                "--root",
                self.root.to_str().unwrap(),
                "--json",
            ])
            .output()
            .ok()?;
        serde_json::from_slice(&out.stdout).ok()
    }

    fn state_of(&self, session: &str) -> Option<(String, Option<u64>)> {
        let status = self.status_json()?;
        let line = status["sessions"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == session)?
            .clone();
        Some((
            line["state"].as_str()?.to_owned(),
            line["runner"]["pid"].as_u64(),
        ))
    }

    /// The live `agent-runner` processes of this root, by session: found in /proc, not in
    /// what the fleet says.
    fn runner_processes(&self) -> BTreeMap<String, Vec<u32>> {
        let mut found: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        let prefix = format!("{}/", self.root.display());
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if !alive(pid) {
                continue;
            }
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if !args.first().is_some_and(|a| a.ends_with("agent-runner")) {
                continue;
            }
            if let Some(session) = args
                .windows(2)
                .find(|w| w[0] == "--workspace")
                .and_then(|w| w[1].strip_prefix(&prefix).map(str::to_owned))
            {
                found.entry(session).or_default().push(pid);
            }
        }
        found
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // Runners of a fleet killed with SIGKILL and never restarted.
        for pids in self.runner_processes().values() {
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

/// Whether `pid` lives (a zombie does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ts(row: &MessageOut) -> DateTime<Utc> {
    schema::time::parse_ts(&row.timestamp).unwrap()
}

#[test]
fn a_message_wakes_a_stopped_session_which_stops_when_idle() {
    let fleet = Fleet::new(3, &["--idle-stop-secs", "2"], &[]);
    wait_until("the sessions read", Duration::from_secs(10), || {
        fleet
            .state_of("s00")
            .is_some_and(|(state, _)| state == "stopped")
    });
    assert!(fleet.runner_processes().is_empty(), "no work: no runner");
    let mut latencies = Vec::new();
    for round in 0..3 {
        let sent = Instant::now();
        let id = fleet.send("s00", &format!("hello {round}"));
        wait_until("the reply", Duration::from_secs(10), || {
            !fleet.replies_to("s00", &id).is_empty()
        });
        latencies.push(sent.elapsed());
        let replied = Instant::now();
        let pid = fleet.state_of("s00").and_then(|(_, pid)| pid);
        assert!(pid.is_some(), "a runner answered");
        wait_until("the idle stop", Duration::from_secs(10), || {
            fleet
                .state_of("s00")
                .is_some_and(|(state, pid)| state == "stopped" && pid.is_none())
        });
        let idle = replied.elapsed();
        assert!(
            idle >= Duration::from_millis(1800),
            "stopped after {idle:?}, before idleStopSecs"
        );
        assert!(!alive(pid.unwrap() as u32), "the runner process is gone");
        assert!(fleet.runner_processes().is_empty());
    }
    eprintln!("wake on a message to a reply: {latencies:?}");
    for latency in &latencies {
        assert!(
            *latency < Duration::from_secs(3),
            "a stopped session answered in {latency:?}"
        );
    }
    // The other sessions never had work, so never a runner.
    assert!(!fleet.root.join("@fleet/logs/s01.log").exists());
    let log = fleet.log();
    for line in [
        "from=\"stopped\" to=\"starting\" why=work due",
        "to=\"stopping\" why=idle for 2s",
        "from=\"stopping\" to=\"stopped\"",
    ] {
        assert!(log.contains(line), "no log line {line:?} in:\n{log}");
    }
}

#[test]
fn a_task_due_in_seconds_in_a_stopped_session_runs_on_time() {
    let fleet = Fleet::new(2, &["--idle-stop-secs", "30"], &[]);
    let due = Utc::now() + chrono::Duration::seconds(3);
    let out = nanoclaw(&[
        "send",
        "--workspace",
        fleet.folder("s01").to_str().unwrap(),
        "--json",
        "--kind",
        "task",
        "--prompt",
        "the nightly report",
        "--process-after",
        &schema::time::format_ts(due),
    ]);
    let id = serde_json::from_str::<serde_json::Value>(&out).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    std::thread::sleep(Duration::from_secs(1));
    let (state, pid) = fleet.state_of("s01").unwrap();
    assert_eq!(
        (state.as_str(), pid),
        ("stopped", None),
        "not before it is due"
    );
    wait_until("the task's reply", Duration::from_secs(15), || {
        !fleet.replies_to("s01", &id).is_empty()
    });
    let replied = ts(&fleet.replies_to("s01", &id)[0]);
    let late = replied - due;
    eprintln!(
        "the task ran {} ms after it was due",
        late.num_milliseconds()
    );
    assert!(late >= chrono::Duration::zero(), "ran before it was due");
    assert!(
        late < chrono::Duration::milliseconds(1500),
        "ran {late} after it was due"
    );
}

#[test]
fn max_running_is_never_exceeded_and_all_the_work_completes() {
    const SESSIONS: usize = 20;
    const MAX: usize = 4;
    let fleet = Fleet::new(
        SESSIONS,
        &["--max-running", "4", "--idle-stop-secs", "60"],
        // Turns of a second: each slot is busy long enough to be seen taken.
        &[("NANOCLAW_MOCK_DELAY_MS", "1000")],
    );
    let started = Instant::now();
    let ids: Vec<(String, String)> = (0..SESSIONS)
        .map(|n| {
            let session = format!("s{n:02}");
            let id = fleet.send(&session, "work");
            (session, id)
        })
        .collect();
    let mut most = 0;
    let mut answered_at = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let live = fleet.runner_processes();
        most = most.max(live.len());
        assert!(
            live.len() <= MAX,
            "{} runners at once: {live:?}",
            live.len()
        );
        assert!(live.values().all(|pids| pids.len() == 1), "{live:?}");
        let answered = ids
            .iter()
            .filter(|(session, id)| !fleet.replies_to(session, id).is_empty())
            .count();
        if answered == SESSIONS {
            break;
        }
        if answered > answered_at.len() {
            answered_at.push(started.elapsed());
        }
        assert!(
            Instant::now() < deadline,
            "{answered} of {SESSIONS} answered"
        );
        std::thread::sleep(Duration::from_millis(30));
    }
    eprintln!(
        "{SESSIONS} sessions, maxRunning {MAX}: all answered in {:?}, at most {most} runners at once",
        started.elapsed()
    );
    assert_eq!(most, MAX, "the slots were used");
    for (session, id) in &ids {
        assert_eq!(fleet.replies_to(session, id).len(), 1, "{session}");
    }
}

#[test]
fn a_runner_killed_mid_turn_is_restarted_answers_once_and_leaves_nothing() {
    let fleet = Fleet::new(
        1,
        &["--idle-stop-secs", "60"],
        &[("NANOCLAW_MOCK_DELAY_MS", "2000")],
    );
    let id = fleet.send("s00", "a long turn");
    let db = fleet.db("s00");
    wait_until("the turn", Duration::from_secs(10), || {
        db.runner_state()
            .unwrap()
            .is_some_and(|state| state.status == "busy")
    });
    let first = db.runner_state().unwrap().unwrap().pid.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_until(
        "the reply after the restart",
        Duration::from_secs(20),
        || !fleet.replies_to("s00", &id).is_empty(),
    );
    let second = db.runner_state().unwrap().unwrap().pid.unwrap();
    assert_ne!(first, second, "a new runner answered");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        fleet.replies_to("s00", &id).len(),
        1,
        "answered exactly once"
    );
    let status = fleet.status_json().unwrap();
    assert_eq!(status["sessions"][0]["crashes"], 1, "{status}");

    // A task's pre-agent script leaves a background job; the runner dies under it.
    let marker = fleet.root.parent().unwrap().join("job.pid");
    let script = format!(
        "sleep 300 & echo $! > {}; sleep 30; echo '{{\"wakeAgent\":false}}'",
        marker.display()
    );
    nanoclaw(&[
        "send",
        "--workspace",
        fleet.folder("s00").to_str().unwrap(),
        "--kind",
        "task",
        "--prompt",
        "check",
        "--script",
        &script,
    ]);
    wait_until(
        "the script's background job",
        Duration::from_secs(20),
        || std::fs::read_to_string(&marker).is_ok_and(|s| s.trim().parse::<u32>().is_ok()),
    );
    let job: u32 = std::fs::read_to_string(&marker)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(job));
    let runner = db.runner_state().unwrap().unwrap().pid.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runner as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let killed = Instant::now();
    wait_until(
        "the background job to be gone",
        Duration::from_secs(5),
        || !alive(job),
    );
    let gone = killed.elapsed();
    eprintln!("the dead runner's background job was gone {gone:?} after the kill");
    // The fleet killed it, not the next runner's start: that one waits out a 2 s backoff.
    assert!(
        fleet.runner_processes().is_empty(),
        "no runner yet: {:?}",
        fleet.runner_processes()
    );
    assert!(gone < Duration::from_millis(1500), "gone after {gone:?}");
    // (status.json is written just after the clean-up: wait for it, within the backoff.)
    wait_until("backing off", Duration::from_secs(2), || {
        fleet
            .state_of("s00")
            .is_some_and(|(state, _)| state == "backingOff")
    });
}

#[test]
fn a_fleet_killed_and_restarted_adopts_its_runners() {
    let mut fleet = Fleet::new(3, &["--idle-stop-secs", "120"], &[]);
    let mut ids = Vec::new();
    for session in ["s00", "s01", "s02"] {
        ids.push((session, fleet.send(session, "before")));
    }
    wait_until("the replies", Duration::from_secs(20), || {
        ids.iter()
            .all(|(s, id)| !fleet.replies_to(s, id).is_empty())
    });
    let before = fleet.runner_processes();
    assert_eq!(before.len(), 3, "{before:?}");
    fleet.kill9();
    assert_eq!(
        fleet.runner_processes(),
        before,
        "the runners outlive the fleet"
    );
    // Work that arrives while no fleet runs is not lost.
    let late = fleet.send("s01", "while the fleet was down");
    fleet.start();
    wait_until("the late reply", Duration::from_secs(20), || {
        !fleet.replies_to("s01", &late).is_empty()
    });
    let after = fleet.runner_processes();
    assert_eq!(after, before, "adopted: the same runners, no second one");
    for (session, pids) in &before {
        let (state, pid) = fleet.state_of(session).unwrap();
        assert!(state == "idle" || state == "running", "{session}: {state}");
        assert_eq!(pid, Some(u64::from(pids[0])));
    }
    assert!(fleet.log().contains("fleet: adopted a live runner"));
    // An adopted runner that dies is noticed and its session restarted on work.
    let pid = before["s02"][0];
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_until("the crash noticed", Duration::from_secs(10), || {
        fleet
            .state_of("s02")
            .is_some_and(|(_, runner)| runner != Some(u64::from(pid)))
    });
    let again = fleet.send("s02", "after the crash");
    wait_until("the reply", Duration::from_secs(20), || {
        !fleet.replies_to("s02", &again).is_empty()
    });
    let now = fleet.runner_processes();
    assert!(now.values().all(|pids| pids.len() == 1), "{now:?}");
}

#[test]
fn an_api_call_wakes_a_session_when_the_fleet_listens() {
    let mut fleet = Fleet::create(
        2,
        &["--listen", "127.0.0.1:0", "--idle-stop-secs", "30"],
        &[],
    );
    // The token first: the API refuses to start without its token file (ROOT/tokens.json).
    let root = fleet.root.to_str().unwrap().to_owned();
    let token = nanoclaw(&["token", "add", "host", "--sessions", "*", "--root", &root]);
    fleet.start();
    let mut addr = String::new();
    wait_until(
        "the API's address in the log",
        Duration::from_secs(10),
        || {
            addr = fleet
                .log()
                .lines()
                .find(|l| l.contains("fleet: serving the session API"))
                .and_then(|l| l.split("addr=").nth(1))
                .map(|a| a.trim().to_owned())
                .unwrap_or_default();
            !addr.is_empty()
        },
    );
    let token_file = fleet.root.parent().unwrap().join("token");
    std::fs::write(&token_file, token.trim()).unwrap();
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let url = format!("http://{addr}");
    let sent = Instant::now();
    let out = nanoclaw(&[
        "--url",
        &url,
        "--token-file",
        token_file.to_str().unwrap(),
        "--session",
        "s01",
        "--json",
        "send",
        "--text",
        "over the API",
    ]);
    let id = serde_json::from_str::<serde_json::Value>(&out).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_until("the reply", Duration::from_secs(10), || {
        !fleet.replies_to("s01", &id).is_empty()
    });
    eprintln!(
        "an API send to a stopped session answered in {:?}",
        sent.elapsed()
    );
    assert_eq!(fleet.runner_processes().keys().collect::<Vec<_>>(), ["s01"]);
}
