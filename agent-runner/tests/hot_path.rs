//! What one message costs the runner in writes (issue 12): a message answered on its own is
//! claimed with its batch started in one transaction, and answered (replies, completion, batch
//! finished) in one more. Counted from the commits in the session DB's WAL, so every write of
//! any connection of the runner counts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_runner::runner::{Runner, RunnerOptions};
use provider::mock::MockProvider;
use schema::{NewMessageIn, SessionDb};
use serde_json::json;
use tokio::sync::oneshot;

/// Commits in the WAL file `wal` (frames of the current WAL generation whose "database size
/// after commit" field is set). The WAL is not checkpointed back to its start in these few
/// writes (the auto-checkpoint waits for 1,000 pages).
fn wal_commits(wal: &Path) -> usize {
    let bytes = std::fs::read(wal).unwrap();
    let header = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    let page_size = header(8) as usize;
    let salts = (header(16), header(20));
    let mut commits = 0;
    let mut at = 32;
    while at + 24 + page_size <= bytes.len() {
        if (header(at + 8), header(at + 12)) != salts {
            break;
        }
        if header(at + 4) != 0 {
            commits += 1;
        }
        at += 24 + page_size;
    }
    commits
}

fn chat(text: &str) -> NewMessageIn {
    NewMessageIn::new("chat", json!({"sender": "Ann", "text": text}).to_string())
}

/// Waits until `id` is answered and the runner is idle again without a batch.
async fn answered_and_idle(db: &SessionDb, id: &str) {
    let started = Instant::now();
    loop {
        let replied = !db.replies_to(id).unwrap().is_empty();
        let idle = db
            .runner_state()
            .unwrap()
            .is_some_and(|state| state.status == "idle");
        if replied && idle && db.current_batch().unwrap().is_none() {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{id} not answered"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_costs_the_runner_two_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("session.db");
    let db = SessionDb::open(&path).unwrap();
    let mut options = RunnerOptions::for_workspace(dir.path());
    // No heartbeat inside the measured window.
    options.heartbeat = Duration::from_secs(3600);
    options.idle_poll = Duration::from_millis(100);
    let runner = Runner::new(db.clone(), Arc::new(MockProvider::new()), options).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(runner.run(async move {
        let _ = stopped.await;
    }));

    // The first message also stores the CLI's session (the continuation); later ones resume
    // it and write nothing for it.
    let first = db.insert_in(&chat("first")).unwrap().id;
    answered_and_idle(&db, &first).await;
    let wal = dir.path().join("session.db-wal");
    let before = wal_commits(&wal);

    let second = db.insert_in(&chat("second")).unwrap().id;
    answered_and_idle(&db, &second).await;
    // Idle polls in between write nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let runner_commits = wal_commits(&wal) - before - 1;
    assert_eq!(
        runner_commits, 2,
        "the runner's commits for one message (claim + start, reply + completion + finish)"
    );

    let _ = stop.send(());
    task.await.unwrap().unwrap();
}
