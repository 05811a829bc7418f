//! Signals always stop the runner (issue 10): with stderr on a pipe whose reader died, and in the
//! middle of a pre-agent task script.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use schema::{NewMessageIn, SessionDb};
use serde_json::json;

/// Kills the runner if a test fails before it exits.
struct Runner(Child);

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Runner {
    fn start(workspace: &Path, stderr: Stdio, rust_log: &str) -> Self {
        std::fs::create_dir_all(workspace.join("agent")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_agent-runner"))
            .arg("--workspace")
            .arg(workspace)
            .arg("--provider")
            .arg("mock")
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        Self(child)
    }

    /// Sends SIGTERM and returns the exit status, failing if it takes 2 s or more.
    fn sigterm_within_two_seconds(&mut self) -> ExitStatus {
        let started = Instant::now();
        kill(Pid::from_raw(self.0.id() as i32), Signal::SIGTERM).unwrap();
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "still running 2 s after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The write end of a pipe whose read end is already closed: every write fails with EPIPE.
fn dead_pipe() -> Stdio {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    writer.into()
}

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn status_of(db: &SessionDb, id: &str) -> String {
    db.message_in(id).unwrap().unwrap().status
}

/// Whether `pid` is gone (a zombie counts: it runs nothing and is reaped by whoever adopted it).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

#[test]
fn sigterm_stops_the_runner_when_stderr_is_a_dead_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    let mut runner = Runner::start(dir.path(), dead_pipe(), "info");
    let id = db
        .insert_in(&NewMessageIn::new(
            "chat",
            json!({"sender": "Ann", "text": "hello?"}).to_string(),
        ))
        .unwrap()
        .id;
    wait_until("the answer", Duration::from_secs(10), || {
        status_of(&db, &id) == "completed"
    });
    assert_eq!(db.replies_to(&id).unwrap().len(), 1);
    let status = runner.sigterm_within_two_seconds();
    assert!(status.success(), "{status:?}");
    assert_eq!(db.runner_state().unwrap().unwrap().status, "stopped");
}

#[test]
fn sigterm_stops_the_runner_after_its_stderr_reader_died() {
    // `agent-runner 2>&1 | tee log`, then Ctrl-C kills tee: stderr breaks while running.
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    let mut runner = Runner::start(dir.path(), writer.into(), "info");
    wait_until("the runner to start", Duration::from_secs(10), || {
        db.runner_state().unwrap().is_some()
    });
    drop(reader);
    let id = db
        .insert_in(&NewMessageIn::new(
            "chat",
            json!({"sender": "Ann", "text": "still there?"}).to_string(),
        ))
        .unwrap()
        .id;
    wait_until("the answer", Duration::from_secs(10), || {
        status_of(&db, &id) == "completed"
    });
    let status = runner.sigterm_within_two_seconds();
    assert!(status.success(), "{status:?}");
    assert_eq!(db.runner_state().unwrap().unwrap().status, "stopped");
}

#[test]
fn sigterm_during_a_task_script_kills_the_script_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    let pids = dir.path().join("script.pids");
    let script = format!(
        "sleep 60 & echo \"$$ $!\" > {}.tmp && mv {0}.tmp {0}; wait; echo '{{\"wakeAgent\": true}}'",
        pids.display()
    );
    let mut task = NewMessageIn::new(
        "task",
        json!({"prompt": "check", "script": script}).to_string(),
    );
    task.series_is_self = true;
    let mut runner = Runner::start(dir.path(), Stdio::null(), "info");
    let id = db.insert_in(&task).unwrap().id;
    wait_until("the script to start", Duration::from_secs(10), || {
        pids.exists()
    });
    let pids: Vec<i32> = std::fs::read_to_string(&pids)
        .unwrap()
        .split_whitespace()
        .map(|pid| pid.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "bash and its sleep");
    let status = runner.sigterm_within_two_seconds();
    assert!(status.success(), "{status:?}");
    assert_eq!(db.runner_state().unwrap().unwrap().status, "stopped");
    // Interrupted before a verdict: left for the next start's recovery, which reruns it.
    assert_eq!(status_of(&db, &id), "processing");
    for pid in pids {
        wait_until(
            &format!("script process {pid} to be gone"),
            Duration::from_secs(1),
            || gone(pid),
        );
    }
}
