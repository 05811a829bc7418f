//! The `agent-runner` binary next to rows a host wrote wrong: rows stored with the wrong SQLite
//! types sit before good ones, and every good one is still answered exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::binary;

use binary::wait_until;

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use schema::{NewMessageIn, SessionDb};
use serde_json::{json, Value};

/// Starts the runner on `<workspace>/session.db` with the mock provider, one message per prompt
/// (so each row gets its own reply); its log goes to `<workspace>/runner.log`.
fn runner(workspace: &Path) -> Child {
    binary::mock_runner(workspace, &workspace.join("runner.log"))
        .env("NANOCLAW_MAX_MESSAGES_PER_PROMPT", "1")
        .spawn()
        .unwrap()
}

/// Status of every row by SQL (the typed readers leave unusable rows out): (seq as text, status).
fn raw_statuses(db: &SessionDb) -> Vec<(String, String)> {
    let conn = db.dedicated_connection().unwrap();
    let mut stmt = conn
        .prepare("SELECT quote(seq), status FROM messages_in ORDER BY rowid")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn bad_rows_before_good_ones_never_block_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    // Before any good row, in seq order: content as BLOB (served), invalid UTF-8 content and
    // tries/trigger as text (served), then rows nobody can use: a TEXT seq, a REAL seq, a BLOB
    // id, and a process_after that is no time.
    let conn = db.dedicated_connection().unwrap();
    conn.execute_batch(
        "INSERT INTO messages_in (id, seq, kind, timestamp, content)
           VALUES ('blob-content', 2, 'chat', '2026-01-01T00:00:00Z',
                   CAST('{\"sender\":\"Ann\",\"text\":\"stored as blob\"}' AS BLOB));
         INSERT INTO messages_in (id, seq, kind, timestamp, content, tries, trigger)
           VALUES ('odd-types', 4, 'chat', '2026-01-01T00:00:00Z',
                   CAST(X'7B2273656E646572223A22416E6E222C2274657874223A226F6464FF227D' AS TEXT),
                   'none', 'true');
         INSERT INTO messages_in (id, seq, kind, timestamp, content)
           VALUES ('text-seq', 'six', 'chat', '2026-01-01T00:00:00Z', '{\"text\":\"x\"}');
         INSERT INTO messages_in (id, seq, kind, timestamp, content)
           VALUES ('real-seq', 7.5, 'chat', '2026-01-01T00:00:00Z', '{\"text\":\"x\"}');
         INSERT INTO messages_in (id, seq, kind, timestamp, content)
           VALUES (X'0102', 8, 'chat', '2026-01-01T00:00:00Z', '{\"text\":\"x\"}');
         INSERT INTO messages_in (id, seq, kind, timestamp, content, process_after)
           VALUES ('no-time', 10, 'task', '2026-01-01T00:00:00Z', '{\"prompt\":\"early?\"}',
                   'when pigs fly');",
    )
    .unwrap();
    let good: Vec<String> = (0..5)
        .map(|i| {
            let row = NewMessageIn::new(
                "chat",
                json!({"sender": "Ann", "text": format!("good {i}")}).to_string(),
            );
            db.insert_in(&row).unwrap().id
        })
        .collect();

    let mut child = runner(dir.path());
    let served: Vec<String> = ["blob-content".to_owned(), "odd-types".to_owned()]
        .into_iter()
        .chain(good.iter().cloned())
        .collect();
    wait_until("every usable row answered", Duration::from_secs(20), || {
        served
            .iter()
            .all(|id| db.message_in(id).unwrap().unwrap().status == "completed")
    });
    // More good rows after the bad ones were met are answered too.
    let late = db
        .insert_in(&NewMessageIn::new(
            "chat",
            json!({"sender": "Ann", "text": "late"}).to_string(),
        ))
        .unwrap()
        .id;
    wait_until("the late row answered", Duration::from_secs(10), || {
        db.message_in(&late).unwrap().unwrap().status == "completed"
    });
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    assert!(child.wait().unwrap().success());

    for id in served.iter().chain([&late]) {
        let replies: Vec<_> = db
            .replies_to(id)
            .unwrap()
            .into_iter()
            .filter(|row| row.kind == "chat")
            .collect();
        assert_eq!(replies.len(), 1, "{id} has {} replies", replies.len());
    }
    let statuses = raw_statuses(&db);
    let status_of = |seq: &str| {
        statuses
            .iter()
            .find(|(s, _)| s == seq)
            .map(|(_, status)| status.clone())
            .unwrap()
    };
    for seq in ["'six'", "7.5", "8", "10"] {
        assert_eq!(status_of(seq), "failed", "seq {seq}: {statuses:?}");
    }
    let reports: Vec<Value> = db
        .all_messages_out()
        .unwrap()
        .into_iter()
        .filter(|row| row.kind == "system")
        .map(|row| serde_json::from_str::<Value>(&row.content).unwrap())
        .filter(|content| content["action"] == "row_unusable")
        .map(|content| content["payload"].clone())
        .collect();
    let mut columns: Vec<&str> = reports
        .iter()
        .map(|r| r["column"].as_str().unwrap())
        .collect();
    columns.sort_unstable();
    assert_eq!(
        columns,
        ["id", "process_after", "seq", "seq"],
        "{reports:?}"
    );
    let log = std::fs::read_to_string(dir.path().join("runner.log")).unwrap();
    for needle in [
        "text-seq",
        "real-seq",
        "no-time",
        "when pigs fly",
        "taken out of the queue",
    ] {
        assert!(log.contains(needle), "log lacks {needle:?}:\n{log}");
    }
    assert_eq!(binary::integrity_check(db.path()), "ok");
}
