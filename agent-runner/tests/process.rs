//! The `agent-runner` binary as a process: crash recovery, the single-runner lock, SIGTERM, and
//! a concurrent writer hammering the DB.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::binary;

use binary::wait_until;

use std::collections::HashSet;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use schema::{NewMessageIn, SessionDb};
use serde_json::json;

/// Starts the runner; its log goes to `<workspace>/runner-<n>.log` (a pipe nobody drains would
/// block it).
fn runner(workspace: &Path, env: &[(&str, &str)]) -> Child {
    static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let mut cmd = binary::mock_runner(workspace, &workspace.join(format!("runner-{n}.log")));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

fn chat(text: &str) -> NewMessageIn {
    NewMessageIn::new("chat", json!({"sender": "Ann", "text": text}).to_string())
}

fn logs(workspace: &Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(workspace).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with("runner-") {
            all.push_str(&std::fs::read_to_string(entry.path()).unwrap());
        }
    }
    all
}

fn status_of(db: &SessionDb, id: &str) -> String {
    db.message_in(id).unwrap().unwrap().status
}

#[test]
fn sigkill_mid_turn_then_restart_gives_exactly_one_reply_each() {
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    // One message per prompt, each taking 1.2 s: kill after the first is answered, mid-turn.
    let slow = [
        ("NANOCLAW_MOCK_DELAY_MS", "1200"),
        ("NANOCLAW_MAX_MESSAGES_PER_PROMPT", "1"),
    ];
    let mut first = runner(dir.path(), &slow);
    let ids: Vec<String> = (0..3)
        .map(|i| db.insert_in(&chat(&format!("m{i}"))).unwrap().id)
        .collect();
    wait_until("the first answer", Duration::from_secs(10), || {
        status_of(&db, &ids[0]) == "completed"
    });
    assert_eq!(status_of(&db, &ids[1]), "processing");
    first.kill().unwrap();
    first.wait().unwrap();
    let mut second = runner(dir.path(), &[("NANOCLAW_MAX_MESSAGES_PER_PROMPT", "1")]);
    wait_until("every row completed", Duration::from_secs(15), || {
        ids.iter().all(|id| status_of(&db, id) == "completed")
    });
    for id in &ids {
        let replies = db.replies_to(id).unwrap();
        assert_eq!(
            replies.len(),
            1,
            "message {id} has {} replies",
            replies.len()
        );
    }
    assert_eq!(db.all_messages_out().unwrap().len(), 3);
    kill(Pid::from_raw(second.id() as i32), Signal::SIGTERM).unwrap();
    second.wait().unwrap();
}

#[test]
fn a_second_runner_exits_with_a_clear_message_and_the_first_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    let mut first = runner(dir.path(), &[]);
    wait_until("the first runner", Duration::from_secs(10), || {
        db.runner_state().unwrap().is_some()
    });
    let mut second = runner(dir.path(), &[]);
    let status = second.wait().unwrap();
    assert!(!status.success());
    let stderr = logs(dir.path());
    assert!(
        stderr.contains("another agent-runner") && stderr.contains(&first.id().to_string()),
        "{stderr}"
    );
    let id = db.insert_in(&chat("still there?")).unwrap().id;
    wait_until(
        "the first runner to answer",
        Duration::from_secs(10),
        || status_of(&db, &id) == "completed",
    );
    assert!(first.try_wait().unwrap().is_none());
    kill(Pid::from_raw(first.id() as i32), Signal::SIGTERM).unwrap();
    first.wait().unwrap();
}

#[test]
fn sigterm_stops_within_two_seconds_even_mid_turn() {
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    let mut child = runner(dir.path(), &[("NANOCLAW_MOCK_DELAY_MS", "60000")]);
    let id = db.insert_in(&chat("slow")).unwrap().id;
    wait_until("busy", Duration::from_secs(10), || {
        status_of(&db, &id) == "processing"
    });
    let started = Instant::now();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "still running 2 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status:?}");
    assert_eq!(db.runner_state().unwrap().unwrap().status, "stopped");
    // The row is left for the next start's recovery, not lost.
    assert_eq!(status_of(&db, &id), "processing");
    let children =
        std::fs::read_to_string(format!("/proc/{}/task/{}/children", child.id(), child.id()))
            .unwrap_or_default();
    assert!(children.trim().is_empty(), "children left: {children}");
}

#[test]
fn two_thousand_concurrent_inserts_no_busy_errors() {
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    let child = runner(dir.path(), &[]);
    // This test process is the other writer: it inserts as fast as it can while the runner works.
    let mut inserted = Vec::with_capacity(2000);
    for i in 0..2000 {
        inserted.push(db.insert_in(&chat(&format!("burst {i}"))).unwrap());
    }
    wait_until("all 2,000 completed", Duration::from_secs(120), || {
        db.counts(chrono::Utc::now()).unwrap().pending == 0
            && db.counts(chrono::Utc::now()).unwrap().processing == 0
    });
    let ins = db.all_messages_in().unwrap();
    assert_eq!(ins.len(), 2000);
    assert!(ins.iter().all(|r| r.status == "completed"));
    let outs = db.all_messages_out().unwrap();
    let mut seqs = HashSet::new();
    for row in &ins {
        assert_eq!(row.seq.unwrap() % 2, 0);
        assert!(seqs.insert(row.seq.unwrap()));
    }
    for row in &outs {
        assert_eq!(row.seq.unwrap() % 2, 1);
        assert!(seqs.insert(row.seq.unwrap()));
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let mut child = child;
    child.wait().unwrap();
    let stderr = logs(dir.path());
    let lower = stderr.to_lowercase();
    assert!(
        !lower.contains("busy") && !lower.contains("locked") && !lower.contains("error"),
        "{stderr}"
    );
}
