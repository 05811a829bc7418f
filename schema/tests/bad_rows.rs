//! Rows the host wrote wrong (storage types, seqs at the limit, compact or unreadable times):
//! one bad row never blocks the queue, seqs never wrap, every time form compares right.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use chrono::{DateTime, Utc};
use schema::time::{format_ts, parse_ts};
use schema::{
    Error, InStatus, NewMessageIn, NewMessageOut, OutKind, Routing, SessionDb, SweepPolicy,
};
use serde_json::{json, Value};

fn open() -> (tempfile::TempDir, SessionDb) {
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    (dir, db)
}

fn chat(text: &str) -> NewMessageIn {
    NewMessageIn::new("chat", json!({"text": text}).to_string())
}

fn at(text: &str) -> DateTime<Utc> {
    parse_ts(text).unwrap()
}

/// Inserts a pending chat row with raw SQL; the arguments are SQL expressions for `id`, `seq`,
/// `content`, `tries`, `trigger` (as another driver might store them).
fn raw_row(db: &SessionDb, id: &str, seq: &str, content: &str, tries: &str, trigger: &str) {
    let conn = db.dedicated_connection().unwrap();
    conn.execute_batch(&format!(
        "INSERT INTO messages_in (id, seq, kind, timestamp, status, tries, trigger, content, platform_id)
         VALUES ({id}, {seq}, 'chat', '2026-01-01T00:00:00.000Z', 'pending', {tries}, {trigger},
                 {content}, 'C-bad')"
    ))
    .unwrap();
}

/// `status` of the row matching `where_sql`, read with raw SQL (the typed readers leave unusable
/// rows out).
fn raw_status(db: &SessionDb, where_sql: &str) -> String {
    let conn = db.dedicated_connection().unwrap();
    conn.query_row(
        &format!("SELECT status FROM messages_in WHERE {where_sql}"),
        [],
        |r| r.get(0),
    )
    .unwrap()
}

/// The payloads of `row_unusable` system rows.
fn unusable_reports(db: &SessionDb) -> Vec<Value> {
    db.all_messages_out()
        .unwrap()
        .into_iter()
        .filter(|row| row.kind == "system")
        .map(|row| serde_json::from_str::<Value>(&row.content).unwrap())
        .filter(|content| content["action"] == "row_unusable")
        .map(|content| content["payload"].clone())
        .collect()
}

fn texts(rows: &[schema::MessageIn]) -> Vec<String> {
    rows.iter()
        .map(|row| {
            serde_json::from_str::<Value>(&row.content)
                .ok()
                .and_then(|v| v["text"].as_str().map(str::to_owned))
                .unwrap_or_else(|| row.content.clone())
        })
        .collect()
}

#[test]
fn content_that_is_not_text_is_read_lossily_and_served() {
    let (_dir, db) = open();
    db.insert_in(&chat("before")).unwrap();
    // JSON stored as a BLOB (a driver writing bytes), invalid UTF-8 in TEXT, and a binary BLOB.
    raw_row(
        &db,
        "'blob-json'",
        "4",
        "CAST('{\"text\":\"as blob\"}' AS BLOB)",
        "0",
        "1",
    );
    raw_row(
        &db,
        "'bad-utf8'",
        "6",
        "CAST(X'7B2274657874223A2261FF62227D' AS TEXT)",
        "0",
        "1",
    );
    raw_row(&db, "'binary'", "8", "X'00FF10'", "0", "1");
    db.insert_in(&chat("after")).unwrap();

    let eligible = db.eligible(Utc::now(), false, 10).unwrap();
    let got = texts(&eligible.rows);
    assert_eq!(got[0], "before");
    assert_eq!(got[1], "as blob");
    assert_eq!(got[2], "a\u{FFFD}b");
    assert_eq!(got[3], "\u{0}\u{FFFD}\u{10}");
    assert_eq!(got[4], "after");
    assert!(eligible.wakes);
    // Served like any row: claimed and completed.
    let ids: Vec<String> = eligible.rows.iter().map(|r| r.id.clone()).collect();
    assert_eq!(db.claim(&ids).unwrap().len(), 5);
    db.complete(&ids, &[]).unwrap();
    assert_eq!(db.counts(Utc::now()).unwrap().pending, 0);
    assert!(unusable_reports(&db).is_empty());
}

#[test]
fn numbers_stored_as_text_are_read_and_unreadable_flags_take_the_column_default() {
    let (_dir, db) = open();
    // INTEGER affinity converts numeric text to integers, but keeps any other text as TEXT.
    let conn = db.dedicated_connection().unwrap();
    raw_row(
        &db,
        "'text-numbers'",
        "2",
        "'{\"text\":\"t\"}'",
        "'three'",
        "'true'",
    );
    conn.execute_batch(
        "UPDATE messages_in SET on_wake = 'no idea' WHERE id = 'text-numbers';
         INSERT INTO messages_in (id, seq, kind, timestamp, content, trigger)
           VALUES ('context', 4, 'chat', '2026-01-01 00:00:00', '{\"text\":\"c\"}', 'FALSE');",
    )
    .unwrap();
    let rows = db.eligible(Utc::now(), false, 10).unwrap().rows;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        (rows[0].tries, rows[0].trigger, rows[0].on_wake),
        (0, true, false)
    );
    assert!(!rows[1].trigger, "'FALSE' is a false flag");
    // The claim counts a try on top of the unreadable value.
    let claimed = db.claim(&["text-numbers".to_owned()]).unwrap();
    assert_eq!(claimed[0].tries, 1);
}

#[test]
fn a_row_without_a_usable_id_or_seq_is_taken_out_and_the_rest_is_served() {
    let (_dir, db) = open();
    let good = chat("good 1");
    db.insert_in(&good).unwrap();
    raw_row(&db, "'seq-text'", "'abc'", "'{\"text\":\"x\"}'", "0", "1");
    raw_row(&db, "'seq-real'", "5.5", "'{\"text\":\"x\"}'", "0", "1");
    raw_row(&db, "'seq-blob'", "X'01'", "'{\"text\":\"x\"}'", "0", "1");
    raw_row(&db, "X'DEAD'", "10", "'{\"text\":\"x\"}'", "0", "1");
    raw_row(&db, "NULL", "12", "'{\"text\":\"x\"}'", "0", "1");
    // The host can still insert next to them (a TEXT seq sorts above every number).
    let second = db.insert_in(&chat("good 2")).unwrap();
    assert_eq!(second.seq, 14);
    // The host's readers work next to them.
    assert_eq!(db.counts(Utc::now()).unwrap().pending, 7);
    assert!(db.next_due().unwrap().is_some());
    assert_eq!(
        db.messages_in_with_status(InStatus::Pending).unwrap().len(),
        2
    );

    let eligible = db.eligible(Utc::now(), false, 10).unwrap();
    assert_eq!(texts(&eligible.rows), vec!["good 1", "good 2"]);
    for id in ["seq-text", "seq-real", "seq-blob"] {
        assert_eq!(raw_status(&db, &format!("id = '{id}'")), "failed", "{id}");
    }
    assert_eq!(raw_status(&db, "seq = 10"), "failed");
    assert_eq!(raw_status(&db, "seq = 12"), "failed");

    let reports = unusable_reports(&db);
    assert_eq!(reports.len(), 5, "{reports:?}");
    let seq_text = reports.iter().find(|r| r["id"] == "seq-text").unwrap();
    assert_eq!(seq_text["column"], "seq");
    assert_eq!(seq_text["value"], "abc");
    assert_eq!(seq_text["status"], "failed");
    assert!(
        seq_text["reason"].as_str().unwrap().contains("TEXT"),
        "{seq_text}"
    );
    let blob_id = reports
        .iter()
        .find(|r| r["value"] == "<BLOB of 2 bytes>")
        .unwrap();
    assert_eq!(
        (&blob_id["id"], &blob_id["column"]),
        (&Value::Null, &json!("id"))
    );
    assert!(blob_id["rowid"].as_i64().is_some());
    // The system row goes where the bad row came from, replying to it when it has an id.
    let out = db.replies_to("seq-text").unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].routing.platform_id.as_deref(), Some("C-bad"));

    // Out of the queue for good: the next poll finds only the good rows, reports nothing new.
    assert_eq!(db.eligible(Utc::now(), false, 10).unwrap().rows.len(), 2);
    assert_eq!(unusable_reports(&db).len(), 5);
    let counts = db.counts(Utc::now()).unwrap();
    assert_eq!((counts.pending, counts.failed), (2, 5));
}

#[test]
fn bad_rows_do_not_use_up_the_limit() {
    let (_dir, db) = open();
    for seq in [2, 4] {
        raw_row(
            &db,
            &format!("'bad-{seq}'"),
            &format!("{seq}.5"),
            "'{}'",
            "0",
            "1",
        );
    }
    db.insert_in(&chat("good")).unwrap();
    // Limit 1: the bad rows come first in seq order; they are taken out and the poll reads on.
    let rows = db.eligible(Utc::now(), false, 1).unwrap().rows;
    assert_eq!(texts(&rows), vec!["good"]);
    assert_eq!(db.counts(Utc::now()).unwrap().failed, 2);

    let (_dir, db) = open();
    db.insert_in(&chat("context")).map(|_| ()).unwrap();
    let conn = db.dedicated_connection().unwrap();
    conn.execute_batch("UPDATE messages_in SET trigger = 0")
        .unwrap();
    for seq in [4, 6] {
        raw_row(
            &db,
            &format!("'bad-{seq}'"),
            &format!("{seq}.5"),
            "'{}'",
            "0",
            "1",
        );
    }
    db.insert_in(&chat("trigger")).unwrap();
    // Limit 1: the context row, and it wakes because the triggering row behind the two bad
    // ones is eligible; the bad ones are taken out on the way.
    let eligible = db.eligible(Utc::now(), false, 1).unwrap();
    assert_eq!(texts(&eligible.rows), vec!["context"]);
    assert!(eligible.wakes);
    assert_eq!(db.counts(Utc::now()).unwrap().failed, 2);
}

#[test]
fn claim_takes_out_a_row_spoiled_after_the_poll() {
    let (_dir, db) = open();
    let id = db.insert_in(&chat("soon spoiled")).unwrap().id;
    let other = db.insert_in(&chat("fine")).unwrap().id;
    let rows = db.eligible(Utc::now(), false, 10).unwrap().rows;
    assert_eq!(rows.len(), 2);
    let conn = db.dedicated_connection().unwrap();
    conn.execute("UPDATE messages_in SET seq = 'oops' WHERE id = ?1", [&id])
        .unwrap();
    let claimed = db.claim(&[id.clone(), other.clone()]).unwrap();
    assert_eq!(
        claimed.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        vec![other]
    );
    assert_eq!(raw_status(&db, &format!("id = '{id}'")), "failed");
    assert_eq!(unusable_reports(&db).len(), 1);
}

#[test]
fn the_sweep_and_the_host_readers_work_next_to_bad_processing_rows() {
    let (_dir, db) = open();
    let id = db.insert_in(&chat("stale")).unwrap().id;
    db.claim(std::slice::from_ref(&id)).unwrap();
    let conn = db.dedicated_connection().unwrap();
    conn.execute(
        "UPDATE messages_in SET tries = 'many', content = CAST(content AS BLOB),
           status_changed = '2020-01-01T00:00:00+0000' WHERE id = ?1",
        [&id],
    )
    .unwrap();
    let report = db.sweep(&SweepPolicy::default(), Utc::now()).unwrap();
    assert_eq!(report.reset, vec![id.clone()]);
    let row = db.message_in(&id).unwrap().unwrap();
    assert_eq!(
        (row.status.as_str(), row.content.as_str()),
        ("pending", r#"{"text":"stale"}"#)
    );
}

#[test]
fn seq_allocation_refuses_to_pass_the_maximum() {
    let (_dir, db) = open();
    let conn = db.dedicated_connection().unwrap();
    conn.execute(
        "INSERT INTO messages_in (id, seq, kind, timestamp, content) VALUES ('top', ?1, 'chat', ?2, '{}')",
        rusqlite::params![i64::MAX - 1, format_ts(Utc::now())],
    )
    .unwrap();
    // The last odd seq is i64::MAX itself: a reply still gets it.
    let reply = NewMessageOut::new(OutKind::Chat, Routing::default(), &json!({"text": "last"}))
        .replying_to(Some("top".into()));
    assert_eq!(db.insert_out(&reply).unwrap().seq, i64::MAX);
    // Then nothing is left, for either parity, and nothing is written.
    match db.insert_in(&chat("one more")) {
        Err(Error::SeqExhausted { max }) => assert_eq!(max, i64::MAX),
        other => panic!("expected SeqExhausted, got {other:?}"),
    }
    let err = db.insert_out(&reply).unwrap_err();
    assert!(matches!(err, Error::SeqExhausted { .. }), "{err}");
    assert!(err.to_string().contains("no seq left"), "{err}");
    // A completion with a reply is refused whole: the row stays as it was.
    let err = db.complete(&["top".to_owned()], &[reply]).unwrap_err();
    assert!(matches!(err, Error::SeqExhausted { .. }), "{err}");
    assert_eq!(db.message_in("top").unwrap().unwrap().status, "pending");
    let ins = db.all_messages_in().unwrap();
    let outs = db.all_messages_out().unwrap();
    assert_eq!((ins.len(), outs.len()), (1, 1));
    assert!(ins
        .iter()
        .map(|r| r.seq)
        .chain(outs.iter().map(|r| r.seq))
        .all(|s| s.unwrap() > 0));
}

#[test]
fn seq_allocation_at_an_even_maximum_refuses_the_next_even_seq() {
    let (_dir, db) = open();
    let conn = db.dedicated_connection().unwrap();
    conn.execute(
        "INSERT INTO messages_out (id, seq, timestamp, kind, content) VALUES ('top', ?1, ?2, 'chat', '{}')",
        rusqlite::params![i64::MAX, format_ts(Utc::now())],
    )
    .unwrap();
    assert_eq!(db.max_seq().unwrap(), i64::MAX);
    assert!(matches!(
        db.insert_in(&chat("no room")),
        Err(Error::SeqExhausted { .. })
    ));
}

#[test]
fn compact_offsets_compare_as_the_times_they_name() {
    let (_dir, db) = open();
    // 09:00 at +02:00 is 07:00Z; written three ways.
    let mut ids = Vec::new();
    for after in [
        "2027-06-01T09:00:00+0200",
        "2027-06-01T09:00:00+02",
        "2027-06-01 09:00:00+0200",
    ] {
        let mut row = NewMessageIn::new("task", json!({"prompt": after}).to_string());
        row.series_is_self = true;
        row.process_after = Some(after.into());
        ids.push(db.insert_in(&row).unwrap().id);
    }
    let before = at("2027-06-01T06:59:59Z");
    assert!(db.eligible(before, false, 10).unwrap().rows.is_empty());
    assert_eq!(db.counts(before).unwrap().due, 0);
    assert_eq!(db.next_due().unwrap(), Some(at("2027-06-01T07:00:00Z")));
    assert_eq!(
        db.next_due_after(before).unwrap(),
        Some(at("2027-06-01T07:00:00Z"))
    );
    let series = db.task_series().unwrap();
    assert_eq!(
        series[0].next_run(before, db.timezone()),
        Some(at("2027-06-01T07:00:00Z"))
    );

    let due = at("2027-06-01T07:00:00Z");
    let rows = db.eligible(due, false, 10).unwrap().rows;
    assert_eq!(rows.iter().map(|r| r.id.clone()).collect::<Vec<_>>(), ids);
    assert_eq!(db.counts(due).unwrap().due, 3);
    assert_eq!(db.next_due_after(due).unwrap(), None);
}

#[test]
fn an_unreadable_process_after_never_runs_it_is_taken_out_with_a_report() {
    let (_dir, db) = open();
    let mut task = NewMessageIn::new("task", json!({"prompt": "report"}).to_string());
    task.series_is_self = true;
    task.process_after = Some("next tuesday".into());
    task.routing.platform_id = Some("C1".into());
    let bad = db.insert_in(&task).unwrap().id;
    let mut empty = chat("empty means no time");
    empty.process_after = Some(" ".into());
    let empty = db.insert_in(&empty).unwrap().id;
    let good = db.insert_in(&chat("due")).unwrap().id;
    // Counted as due so a host wakes the runner, whose poll takes it out.
    assert_eq!(db.counts(Utc::now()).unwrap().due, 3);

    let rows = db.eligible(Utc::now(), false, 10).unwrap().rows;
    assert_eq!(
        rows.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        vec![empty, good]
    );
    assert_eq!(db.message_in(&bad).unwrap().unwrap().status, "failed");
    let reports = unusable_reports(&db);
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0]["id"], json!(bad));
    assert_eq!(reports[0]["column"], "process_after");
    assert_eq!(reports[0]["value"], "next tuesday");
    let out = db.replies_to(&bad).unwrap();
    assert_eq!(out[0].routing.platform_id.as_deref(), Some("C1"));
    assert_eq!(db.counts(Utc::now()).unwrap().due, 2);
}

/// A runner row with values of the wrong storage type (whoever wrote them) is still read:
/// `status` and the health check judge what it says, where a failed read took both down (the
/// health check called a live runner's DB unusable).
#[test]
fn a_runner_row_of_the_wrong_types_is_read_and_judged() {
    use schema::health::{check, HealthLimits, Unhealthy};
    let (_dir, db) = open();
    db.set_runner_state(schema::RunnerStatus::Idle, Some(7), Some("mock"))
        .unwrap();
    let conn = db.dedicated_connection().unwrap();
    conn.execute_batch(
        "UPDATE runner_state SET status = X'69646C65', pid = 'seven', current_tool = 42
         WHERE id = 1",
    )
    .unwrap();
    let state = db.runner_state().unwrap().unwrap();
    assert_eq!(state.status, "idle", "a BLOB status is read as its text");
    assert_eq!(state.pid, None, "a pid that is no number is none");
    assert_eq!(state.current_tool.as_deref(), Some("42"));
    let limits = HealthLimits {
        stale_heartbeat: std::time::Duration::from_secs(60),
        max_turn_silence: std::time::Duration::ZERO,
        lock_wait: std::time::Duration::from_secs(1),
    };
    let verdict = check(db.path(), &limits, Utc::now());
    assert!(verdict.is_ok(), "{verdict:?}");
    // A heartbeat that is no time is a stale heartbeat, not an unusable DB.
    conn.execute_batch("UPDATE runner_state SET heartbeat_at = X'00FF' WHERE id = 1")
        .unwrap();
    let verdict = check(db.path(), &limits, Utc::now());
    assert!(
        matches!(
            verdict,
            Err(Unhealthy::StaleHeartbeat { age_secs: None, .. })
        ),
        "{verdict:?}"
    );
}
