//! `agent-runner health` (issue 13, point 3): the exit code and the one-line reason in each case,
//! run beside a live runner (it takes no lock and starts nothing).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::binary;

use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::Duration;

use binary::{mock_runner, sigterm, wait_until};
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

fn health(workspace: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent-runner"))
        .arg("--workspace")
        .arg(workspace)
        .arg("--provider")
        .arg("mock")
        .args(args)
        .env_remove("SESSION_DB")
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

/// Exit code and the text of stdout and stderr together.
fn verdict(output: &Output) -> (i32, String) {
    (
        output.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

fn status(db: &SessionDb) -> Option<String> {
    db.runner_state().unwrap().map(|state| state.status)
}

#[test]
fn missing_and_corrupt_dbs_are_unhealthy_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let (code, text) = verdict(&health(dir.path(), &["health"]));
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("no session DB at") && text.contains("`nanoclaw init`"),
        "{text}"
    );
    std::fs::write(dir.path().join("session.db"), vec![b'x'; 4096]).unwrap();
    let (code, text) = verdict(&health(dir.path(), &["health"]));
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("is unusable (file is not a database): restore it"),
        "{text}"
    );
}

#[test]
fn a_live_runner_is_healthy_until_stale_or_stopped_and_a_silent_turn_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    std::fs::create_dir_all(ws.join("agent")).unwrap();
    let db = SessionDb::open(ws.join("session.db")).unwrap();
    let (code, text) = verdict(&health(ws, &["health"]));
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("no runner has started on"), "{text}");

    // A turn that takes 4 s: the mock gives no event meanwhile.
    let log = ws.join("runner.log");
    let runner = Runner(
        mock_runner(ws, &log)
            .args(["--set", "heartbeatSecs=1", "--set", "mockDelayMs=4000"])
            .spawn()
            .unwrap(),
    );
    wait_until("the runner to start", Duration::from_secs(20), || {
        status(&db).as_deref() == Some("idle")
    });
    let (code, text) = verdict(&health(ws, &["health"]));
    assert_eq!(code, 0, "{text}");
    assert!(
        text.starts_with("healthy: runner idle, heartbeat "),
        "{text}"
    );

    db.insert_in(&NewMessageIn::new(
        "chat",
        json!({"sender": "U", "text": "slow one"}).to_string(),
    ))
    .unwrap();
    wait_until("the turn to start", Duration::from_secs(20), || {
        status(&db).as_deref() == Some("busy")
    });
    std::thread::sleep(Duration::from_millis(2100));
    let (code, text) = verdict(&health(
        ws,
        &["--set", "healthMaxTurnSilenceSecs=1", "health"],
    ));
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("the turn has had no provider event for ") && text.contains(" s (limit 1 s"),
        "{text}"
    );
    // The default limit (900 s) lets the same turn be.
    let (code, text) = verdict(&health(ws, &["health"]));
    assert_eq!(code, 0, "{text}");
    assert!(
        text.starts_with("healthy: runner busy, heartbeat "),
        "{text}"
    );

    // After the reply the heartbeat records the turn's last event.
    wait_until("the reply", Duration::from_secs(20), || {
        !db.all_messages_out().unwrap().is_empty()
    });
    wait_until("last_event to be written", Duration::from_secs(5), || {
        db.runner_state()
            .unwrap()
            .and_then(|state| state.last_event())
            .is_some_and(|event| event.what == "turn result")
    });

    sigterm(&runner.0);
    wait_until("the runner to stop", Duration::from_secs(20), || {
        status(&db).as_deref() == Some("stopped")
    });
    drop(runner);
    let (code, text) = verdict(&health(ws, &["health"]));
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("the runner stopped"), "{text}");
}

#[test]
fn a_killed_runner_goes_stale() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    std::fs::create_dir_all(ws.join("agent")).unwrap();
    let db = SessionDb::open(ws.join("session.db")).unwrap();
    let mut runner = Runner(
        mock_runner(ws, &ws.join("runner.log"))
            .args(["--set", "heartbeatSecs=1"])
            .spawn()
            .unwrap(),
    );
    wait_until("the runner to start", Duration::from_secs(20), || {
        status(&db).as_deref() == Some("idle")
    });
    runner.0.kill().unwrap();
    runner.0.wait().unwrap();
    std::thread::sleep(Duration::from_millis(2100));
    let (code, text) = verdict(&health(ws, &["health", "--stale-after", "1"]));
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("the runner's heartbeat is ") && text.contains(" s old (limit 1 s)"),
        "{text}"
    );
    // The default limit is three heartbeats, at least 15 s.
    let (code, text) = verdict(&health(ws, &["health"]));
    assert_eq!(code, 0, "{text}");
}
