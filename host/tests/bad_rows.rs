//! The `nanoclaw` CLI next to rows stored with the wrong SQLite types or odd time forms:
//! `status`, `send`, `sweep` and `watch` keep working.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use schema::SessionDb;
use serde_json::Value;
use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_nanoclaw");

fn nanoclaw(db: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .env_remove("SESSION_DB")
        .env_remove("RUST_LOG")
        .env("TZ", "UTC")
        .arg("--db")
        .arg(db)
        .args(args)
        .output()
        .expect("running nanoclaw")
}

#[track_caller]
fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "expected success, got {:?}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// An initialized workspace whose DB holds bad rows in both tables, next to good ones.
fn workspace_with_bad_rows() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let init = Command::new(BIN)
        .env_remove("SESSION_DB")
        .args(["init", "--workspace", ws.to_str().unwrap()])
        .args(["--routing", "slack:C123"])
        .output()
        .unwrap();
    ok(init);
    let db_path = ws.join("session.db");
    let db = SessionDb::open(&db_path).unwrap();
    let conn = db.dedicated_connection().unwrap();
    conn.execute_batch(
        "INSERT INTO messages_in (id, seq, kind, timestamp, content)
           VALUES ('blob-content', 2, 'chat', '2026-01-01T00:00:00Z', CAST('{\"text\":\"b\"}' AS BLOB));
         INSERT INTO messages_in (id, seq, kind, timestamp, content)
           VALUES ('text-seq', 'four', 'task', '2026-01-01T00:00:00Z', '{\"prompt\":\"x\"}');
         INSERT INTO messages_in (id, seq, kind, timestamp, content, process_after)
           VALUES ('blob-time', 6, 'task', '2026-01-01T00:00:00Z', '{\"prompt\":\"blob time\"}',
                   CAST('2030-01-01T00:00:00Z' AS BLOB));
         INSERT INTO messages_in (id, seq, kind, timestamp, content, process_after)
           VALUES ('compact', 8, 'task', '2026-01-01T00:00:00Z', '{\"prompt\":\"compact time\"}',
                   '2030-01-01T09:00:00+0200');
         INSERT INTO messages_in (id, seq, kind, timestamp, status, status_changed, tries, content)
           VALUES ('stale', 10, 'chat', '2026-01-01T00:00:00Z', 'processing',
                   '2026-01-01T00:00:00+0000', 'lots', '{\"text\":\"s\"}');
         INSERT INTO messages_out (id, seq, timestamp, kind, content)
           VALUES ('out-blob', 1, '2026-01-01T00:00:00Z', 'chat', CAST('{\"text\":\"hi\"}' AS BLOB));
         INSERT INTO messages_out (id, seq, timestamp, kind, content)
           VALUES ('out-text-seq', 'three', '2026-01-01T00:00:00Z', 'chat', '{\"text\":\"odd\"}');",
    )
    .unwrap();
    (dir, db_path)
}

#[test]
fn status_send_sweep_and_watch_work_next_to_bad_rows() {
    let (_dir, db_path) = workspace_with_bad_rows();

    let report: Value =
        serde_json::from_str(&ok(nanoclaw(&db_path, &["--json", "status"]))).unwrap();
    assert_eq!(report["counts"]["pending"], 4, "{report}");
    let tasks = report["tasks"].as_array().unwrap();
    let compact = tasks.iter().find(|t| t["id"] == "compact").unwrap();
    assert_eq!(compact["nextRun"], "2030-01-01T07:00:00.000Z");
    let text = ok(nanoclaw(&db_path, &["status"]));
    assert!(text.contains("2030-01-01T07:00:00.000Z (in "), "{text}");

    // The next even seq above every numeric one (a TEXT seq is no number).
    let sent = ok(nanoclaw(&db_path, &["send", "--text", "hello"]));
    assert!(sent.contains("seq=12"), "{sent}");

    let swept: Value = serde_json::from_str(&ok(nanoclaw(
        &db_path,
        &["--json", "sweep", "--stale-after", "0"],
    )))
    .unwrap();
    assert_eq!(swept["reset"], serde_json::json!(["stale"]));

    // The BLOB content is read; the row whose seq is no number has no place in the stream.
    let watched = ok(nanoclaw(&db_path, &["watch", "--json", "--no-follow"]));
    let lines: Vec<Value> = watched
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{watched}");
    assert_eq!(lines[0]["id"], "out-blob");
    assert_eq!(lines[0]["content"], serde_json::json!({"text": "hi"}));
}
