//! The session DB contract: migrations, seq allocation, claims, completions, sweeps, gates.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use schema::time::{format_ts, parse_ts};
use schema::{NewMessageIn, NewMessageOut, OutKind, Routing, RunnerStatus, SessionDb, SweepPolicy};
use serde_json::json;

fn open() -> (tempfile::TempDir, SessionDb) {
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    (dir, db)
}

fn chat(text: &str) -> NewMessageIn {
    NewMessageIn::new("chat", json!({"text": text}).to_string())
}

#[test]
fn pragmas_are_set_on_every_connection() {
    let (_dir, db) = open();
    let conn = db.dedicated_connection().unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    let sync: i64 = conn
        .query_row("PRAGMA synchronous", [], |r| r.get(0))
        .unwrap();
    let timeout: i64 = conn
        .query_row("PRAGMA busy_timeout", [], |r| r.get(0))
        .unwrap();
    assert_eq!((mode.as_str(), sync), ("wal", 1));
    assert!(timeout >= 1000, "{timeout}");
}

#[test]
fn an_older_db_gets_missing_columns_and_keeps_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE messages_in (id TEXT PRIMARY KEY, seq INTEGER UNIQUE, kind TEXT NOT NULL,
               timestamp TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending', content TEXT NOT NULL);
             INSERT INTO messages_in (id, seq, kind, timestamp, content)
               VALUES ('old-1', 2, 'chat', '2026-01-01 10:00:00', '{\"text\":\"from before\"}');
             CREATE TABLE runner_state (id INTEGER PRIMARY KEY CHECK (id = 1), status TEXT NOT NULL,
               heartbeat_at TEXT NOT NULL, updated_at TEXT NOT NULL);",
        )
        .unwrap();
    }
    let db = SessionDb::open(&path).unwrap();
    let row = db.message_in("old-1").unwrap().unwrap();
    assert_eq!((row.trigger, row.on_wake, row.tries), (true, false, 0));
    assert!(db
        .eligible(Utc::now(), false, 10)
        .unwrap()
        .rows
        .iter()
        .any(|r| r.id == "old-1"));
    db.set_runner_state(RunnerStatus::Idle, Some(7), Some("mock"))
        .unwrap();
    assert_eq!(
        db.runner_state().unwrap().unwrap().provider.as_deref(),
        Some("mock")
    );
    // Opening again is a no-op.
    SessionDb::open(&path).unwrap();
}

/// An older runner kept its batch as a `session_state` key: the migration moves it into
/// `runner_state.current_batch`, so mcp-tools still routes by it and the sweep still spares
/// its rows, and the key goes.
#[test]
fn an_older_runners_batch_moves_from_session_state_into_the_runner_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let stored = r#"{"channelType":"slack","platformId":"C1","threadId":null,"inReplyTo":"m1","ids":["m1"],"senderId":"U1"}"#;
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE session_state (key TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at TEXT NOT NULL);
             CREATE TABLE runner_state (id INTEGER PRIMARY KEY CHECK (id = 1), status TEXT NOT NULL,
               pid INTEGER, provider TEXT, current_tool TEXT, heartbeat_at TEXT NOT NULL,
               updated_at TEXT NOT NULL, waiting_on TEXT, last_event TEXT);
             INSERT INTO runner_state (id, status, pid, heartbeat_at, updated_at)
               VALUES (1, 'busy', 7, '2026-01-01T10:00:00.000Z', '2026-01-01T10:00:00.000Z');",
        )
        .unwrap();
        conn.execute(
            "INSERT INTO session_state VALUES ('current_batch', ?1, '2026-01-01T10:00:00.000Z')",
            [stored],
        )
        .unwrap();
    }
    let db = SessionDb::open(&path).unwrap();
    let batch = db.current_batch().unwrap().expect("the batch moved");
    assert_eq!(batch.ids, vec!["m1".to_owned()]);
    assert_eq!(batch.routing.platform_id.as_deref(), Some("C1"));
    assert_eq!(batch.sender_id.as_deref(), Some("U1"));
    assert_eq!(db.state("current_batch").unwrap(), None);
    // Opening again moves nothing back and loses nothing.
    let db = SessionDb::open(&path).unwrap();
    assert_eq!(db.current_batch().unwrap(), Some(batch));
}

#[test]
fn seqs_are_unique_with_parity_across_tables_and_threads() {
    let (dir, db) = open();
    let path = dir.path().join("session.db");
    let mut handles = Vec::new();
    for t in 0..6 {
        let path = path.clone();
        handles.push(std::thread::spawn(move || {
            let db = SessionDb::open(&path).unwrap();
            let mut seqs = Vec::new();
            for i in 0..150 {
                let seq = if (t + i) % 2 == 0 {
                    db.insert_in(&chat("x")).unwrap().seq
                } else {
                    db.insert_out(&NewMessageOut::new(
                        OutKind::Chat,
                        Routing::default(),
                        &json!({"text": "y"}),
                    ))
                    .unwrap()
                    .seq
                };
                seqs.push(seq);
            }
            seqs
        }));
    }
    let mut all = HashSet::new();
    for handle in handles {
        for seq in handle.join().unwrap() {
            assert!(all.insert(seq), "duplicate seq {seq}");
        }
    }
    assert_eq!(all.len(), 900);
    assert!(db
        .all_messages_in()
        .unwrap()
        .iter()
        .all(|r| r.seq.unwrap() % 2 == 0));
    assert!(db
        .all_messages_out()
        .unwrap()
        .iter()
        .all(|r| r.seq.unwrap() % 2 == 1));
}

#[test]
fn timestamps_are_written_rfc3339_utc_millis() {
    let (_dir, db) = open();
    let id = db.insert_in(&chat("t")).unwrap().id;
    let row = db.message_in(&id).unwrap().unwrap();
    assert_eq!(
        row.timestamp.len(),
        "2026-11-21T10:00:00.000Z".len(),
        "{}",
        row.timestamp
    );
    assert!(row.timestamp.ends_with('Z'));
    assert_eq!(format_ts(parse_ts(&row.timestamp).unwrap()), row.timestamp);
}

#[test]
fn due_comparisons_accept_every_timestamp_form() {
    let (_dir, db) = open();
    let now = parse_ts("2026-11-21T12:00:00Z").unwrap();
    let mut ids = Vec::new();
    for after in [
        "2026-11-21 11:59:00",
        "2026-11-21T13:30:00+02:00",
        "2026-11-21T12:00:01.000Z",
        "2026-11-21T13:59:00+0200",
        "2026-11-21T14:00:00+02",
        "garbage",
    ] {
        let mut row = chat(after);
        row.process_after = Some(after.into());
        ids.push(db.insert_in(&row).unwrap().id);
    }
    let due: Vec<String> = db
        .eligible(now, false, 10)
        .unwrap()
        .rows
        .into_iter()
        .map(|r| r.id)
        .collect();
    // 11:59Z, 11:30Z, 11:59Z and 12:00Z are due, 12:00:01Z is not; garbage is never run: the
    // poll takes it out of the queue (see bad_rows.rs).
    let expected: Vec<String> = [0, 1, 3, 4].map(|i| ids[i].clone()).into();
    assert_eq!(due, expected);
    assert_eq!(db.message_in(&ids[5]).unwrap().unwrap().status, "failed");
}

#[test]
fn claim_complete_reset_and_release() {
    let (_dir, db) = open();
    let a = db.insert_in(&chat("a")).unwrap().id;
    let b = db.insert_in(&chat("b")).unwrap().id;
    let claimed = db.claim(&[a.clone(), b.clone()]).unwrap();
    assert_eq!(
        claimed.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        vec![a.clone(), b.clone()]
    );
    assert!(claimed
        .iter()
        .all(|r| r.status == "processing" && r.tries == 1));
    assert!(
        db.claim(std::slice::from_ref(&a)).unwrap().is_empty(),
        "claimed twice"
    );
    let reply = NewMessageOut::new(OutKind::Chat, Routing::default(), &json!({"text": "r"}))
        .replying_to(Some(a.clone()));
    let written = db.complete(std::slice::from_ref(&a), &[reply]).unwrap();
    assert_eq!(written.len(), 1);
    assert_eq!(db.message_in(&a).unwrap().unwrap().status, "completed");
    assert_eq!(db.reset_processing().unwrap(), vec![b.clone()]);
    assert_eq!(db.message_in(&b).unwrap().unwrap().status, "pending");
    db.claim(std::slice::from_ref(&b)).unwrap();
    db.release(std::slice::from_ref(&b)).unwrap();
    let row = db.message_in(&b).unwrap().unwrap();
    assert_eq!((row.status.as_str(), row.tries), ("pending", 1));
}

/// A turn's start mark is the highest `messages_out` seq: a newer `messages_in` row does not
/// move it, a row whose seq is no number is not counted, and every row written later is after
/// it.
#[test]
fn the_highest_out_seq_marks_what_is_sent_from_now_on() {
    let (_dir, db) = open();
    let mark = |db: &SessionDb| db.read_in(|reads| reads.max_out_seq()).unwrap();
    assert_eq!(mark(&db), 0, "no row yet");
    let out = NewMessageOut::new(OutKind::Chat, Routing::default(), &json!({"text": "x"}));
    let first = db.insert_out(&out).unwrap().seq;
    db.insert_in(&chat("newer")).unwrap();
    assert_eq!(mark(&db), first);
    assert!(db.max_seq().unwrap() > first, "the inbound row is higher");
    db.insert_out(&out).unwrap();
    let at = mark(&db);
    let after = db.insert_out(&out).unwrap().seq;
    let conn = rusqlite::Connection::open(db.path()).unwrap();
    conn.execute(
        "INSERT INTO messages_out (id, seq, timestamp, kind, content)
         VALUES ('bad', 'not a number', '2026-01-01T00:00:00.000Z', 'chat', '{}')",
        [],
    )
    .unwrap();
    assert_eq!(mark(&db), after, "a text seq is not counted");
    let sent = db
        .read_in(|reads| reads.messages_out_after(at, 10))
        .unwrap();
    assert_eq!(
        sent.iter().map(|row| row.seq).collect::<Vec<_>>(),
        vec![Some(after)]
    );
}

/// Replies made inside the completing transaction are decided on what it reads, and nothing
/// can be written between that read and their write: another writer waits for the lock.
#[test]
fn replies_made_inside_the_completion_read_what_they_are_written_with() {
    let (dir, db) = open();
    let a = db.insert_in(&chat("a")).unwrap().id;
    db.claim(std::slice::from_ref(&a)).unwrap();
    let sent = NewMessageOut::new(OutKind::Chat, Routing::default(), &json!({"text": "early"}));
    let start_seq = db.max_seq().unwrap();
    db.insert_out(&sent).unwrap();
    let other = SessionDb::open_with(
        dir.path().join("session.db"),
        schema::OpenOptions {
            busy_timeout: Duration::from_millis(50),
            ..Default::default()
        },
    )
    .unwrap();
    let written = db
        .complete_replies_with_usage_at(
            std::slice::from_ref(&a),
            |reads| {
                let seen = reads.messages_out_after(start_seq, 10)?;
                assert_eq!(seen.len(), 1, "the row sent before the transaction is read");
                let blocked = other.insert_out(&sent);
                assert!(
                    blocked.as_ref().is_err_and(|err| err.is_busy()),
                    "a write got between the read and the replies: {blocked:?}"
                );
                Ok(vec![NewMessageOut::new(
                    OutKind::Chat,
                    Routing::default(),
                    &json!({"text": format!("after {}", seen.len())}),
                )
                .replying_to(Some(a.clone()))])
            },
            None,
            Utc::now(),
            false,
        )
        .unwrap();
    assert_eq!(written.len(), 1);
    assert_eq!(db.message_in(&a).unwrap().unwrap().status, "completed");
    let replies = db.replies_to(&a).unwrap();
    assert_eq!(replies.len(), 1);
    assert!(replies[0].content.contains("after 1"), "{replies:?}");
}

/// A stopped turn's completion decides in its own transaction which rows a reply answers
/// (`chat` and `chat-sdk` rows do, a `system` row does not) and completes only those: the
/// others stay `processing`, to run next.
#[test]
fn a_decided_completion_completes_only_what_it_read_as_answered() {
    let (_dir, db) = open();
    let ids: Vec<String> = ["first", "answered push", "silent push", "card push"]
        .into_iter()
        .map(|text| db.insert_in(&chat(text)).unwrap().id)
        .collect();
    db.claim(&ids).unwrap();
    let reply = |kind, to: &str| {
        NewMessageOut::new(kind, Routing::default(), &json!({"text": "r"}))
            .replying_to(Some(to.to_owned()))
    };
    db.insert_out(&reply(OutKind::Chat, &ids[1])).unwrap();
    db.insert_out(&reply(OutKind::System, &ids[2])).unwrap();
    db.insert_out(&reply(OutKind::ChatSdk, &ids[3])).unwrap();
    let (written, answered) = db
        .complete_decided_at(
            |reads| {
                let mut answered = reads.answered(&ids)?;
                answered.sort();
                assert!(reads.answered(&[])?.is_empty());
                let mut complete = vec![ids[0].clone()];
                complete.extend(answered.iter().cloned());
                let completion = schema::Completion {
                    ids: complete,
                    replies: vec![reply(OutKind::Chat, &ids[0])],
                    usage: None,
                };
                Ok((completion, answered))
            },
            Utc::now(),
            false,
        )
        .unwrap();
    assert_eq!(written.len(), 1);
    let mut expected = vec![ids[1].clone(), ids[3].clone()];
    expected.sort();
    assert_eq!(answered, expected);
    let status = |id: &str| db.message_in(id).unwrap().unwrap().status;
    assert_eq!(status(&ids[0]), "completed");
    assert_eq!(status(&ids[1]), "completed");
    assert_eq!(
        status(&ids[2]),
        "processing",
        "a system row answers nothing"
    );
    assert_eq!(status(&ids[3]), "completed");
}

#[test]
fn sweep_backs_off_then_fails_and_spares_a_live_runners_batch() {
    let (_dir, db) = open();
    let ids: Vec<String> = (0..3)
        .map(|i| db.insert_in(&chat(&format!("s{i}"))).unwrap().id)
        .collect();
    db.claim(&ids).unwrap();
    // ids[2] has used up its tries.
    for _ in 0..4 {
        db.release(&[ids[2].clone()]).unwrap();
        db.claim(&[ids[2].clone()]).unwrap();
        let conn = db.dedicated_connection().unwrap();
        conn.execute(
            "UPDATE messages_in SET tries = tries + 1 WHERE id = ?1",
            [&ids[2]],
        )
        .unwrap();
    }
    db.set_runner_state(RunnerStatus::Busy, Some(1), Some("mock"))
        .unwrap();
    db.set_current_batch(Some(&schema::CurrentBatch {
        ids: vec![ids[1].clone()],
        ..Default::default()
    }))
    .unwrap();
    let policy = SweepPolicy {
        stale_after: Duration::from_secs(60),
        max_tries: 5,
        backoff: Duration::from_secs(30),
    };
    let later = Utc::now() + chrono::Duration::seconds(61);
    // The runner's heartbeat is older than stale_after at `later`, so its batch is swept too.
    let report = db.sweep(&policy, later).unwrap();
    assert_eq!(report.failed, vec![ids[2].clone()]);
    assert!(report.reset.contains(&ids[0]) && report.reset.contains(&ids[1]));
    let row = db.message_in(&ids[0]).unwrap().unwrap();
    assert_eq!(row.status, "pending");
    let retry_at = parse_ts(row.process_after.as_deref().unwrap()).unwrap();
    let delay_ms = (retry_at - later).num_milliseconds();
    assert!(
        (29_999..=30_000).contains(&delay_ms),
        "first retry after one backoff: {delay_ms} ms"
    );

    // A long turn: claimed ten minutes ago, but the runner's heartbeat is fresh, so its batch is
    // left alone while a stale row outside the batch is swept.
    let long_ago = format_ts(Utc::now() - chrono::Duration::minutes(10));
    db.release(&[ids[0].clone()]).unwrap();
    db.claim(&[ids[0].clone(), ids[1].clone()]).unwrap();
    let conn = db.dedicated_connection().unwrap();
    conn.execute(
        "UPDATE messages_in SET status_changed = ?1, process_after = NULL",
        [&long_ago],
    )
    .unwrap();
    db.heartbeat().unwrap();
    let report = db.sweep(&policy, Utc::now()).unwrap();
    assert_eq!(report.reset, vec![ids[0].clone()]);
    assert!(
        !report.reset.contains(&ids[1]),
        "swept a live runner's batch: {report:?}"
    );
    assert_eq!(
        db.message_in(&ids[1]).unwrap().unwrap().status,
        "processing"
    );
}

/// A `current_batch` of the wrong storage type (a host or a hand edit wrote a BLOB) is a batch
/// that does not parse: the sweep still runs, and sweeps what is stale.
#[test]
fn a_current_batch_of_the_wrong_type_does_not_stop_the_sweep() {
    let (_dir, db) = open();
    let id = db.insert_in(&chat("stale")).unwrap().id;
    db.claim(std::slice::from_ref(&id)).unwrap();
    db.set_runner_state(RunnerStatus::Busy, Some(1), Some("mock"))
        .unwrap();
    let conn = db.dedicated_connection().unwrap();
    conn.execute("UPDATE runner_state SET current_batch = x'00ff'", [])
        .unwrap();
    conn.execute(
        "UPDATE messages_in SET status_changed = ?1",
        [format_ts(Utc::now() - chrono::Duration::minutes(10))],
    )
    .unwrap();
    let policy = SweepPolicy {
        stale_after: Duration::from_secs(60),
        max_tries: 5,
        backoff: Duration::from_secs(30),
    };
    let report = db.sweep(&policy, Utc::now()).unwrap();
    assert_eq!(report.reset, vec![id]);
    assert!(db.current_batch().is_err(), "a BLOB is no batch");
}

#[test]
fn answers_are_held_only_while_the_question_is_open() {
    let (_dir, db) = open();
    let answer = db
        .insert_in(&NewMessageIn::new(
            "system",
            json!({"type": "question_response", "questionId": "q1", "selectedOption": "a"})
                .to_string(),
        ))
        .unwrap()
        .id;
    let now = Utc::now();
    db.open_question("q1", now + chrono::Duration::seconds(30))
        .unwrap();
    assert!(db.eligible(now, false, 10).unwrap().rows.is_empty());
    // Past the deadline (a crashed waiter), the answer is an ordinary message again.
    let later = now + chrono::Duration::seconds(31);
    assert_eq!(db.eligible(later, false, 10).unwrap().rows[0].id, answer);
    let (row, taken) = db.take_answer("q1").unwrap().unwrap();
    assert_eq!(
        (row.id.as_str(), taken.selected_option.as_str()),
        (answer.as_str(), Some("a"))
    );
    assert!(db.take_answer("q1").unwrap().is_none(), "taken twice");
}

#[test]
fn a_posted_question_row_is_never_seen_without_its_state() {
    let (_dir, db) = open();
    db.set_runner_state(RunnerStatus::Busy, Some(1), Some("mock"))
        .unwrap();
    let deadline = Utc::now() + chrono::Duration::seconds(30);
    let mut row = NewMessageOut::new(
        OutKind::ChatSdk,
        Routing::default(),
        &json!({"type": "ask_question"}),
    );
    row.id = Some("question-row".into());
    let (inserted, switched) = db.post_question("q1", deadline, &row, true).unwrap();
    assert!(switched);
    assert_eq!(inserted.seq % 2, 1, "an odd messages_out seq");
    assert_eq!(db.runner_state().unwrap().unwrap().status, "waiting_user");
    assert!(
        db.state("question:q1").unwrap().is_some(),
        "recorded as open"
    );
    // Not busy (another question already switched it): the status is left alone.
    let mut second = row.clone();
    second.id = Some("question-row-2".into());
    let (_, switched) = db.post_question("q2", deadline, &second, true).unwrap();
    assert!(!switched);
    // A failed row write (its id is taken) leaves no open question and no status change.
    db.swap_runner_status(RunnerStatus::WaitingUser, RunnerStatus::Busy)
        .unwrap();
    assert!(db.post_question("q3", deadline, &row, true).is_err());
    assert!(db.state("question:q3").unwrap().is_none());
    assert_eq!(db.runner_state().unwrap().unwrap().status, "busy");
}

#[test]
fn next_due_and_counts() {
    let (_dir, db) = open();
    assert_eq!(db.next_due().unwrap(), None);
    let at = parse_ts("2030-01-01T09:00:00Z").unwrap();
    let mut later = chat("later");
    later.process_after = Some(format_ts(at));
    db.insert_in(&later).unwrap();
    assert_eq!(db.next_due().unwrap(), Some(at));
    db.insert_in(&chat("now")).unwrap();
    assert!(db.next_due().unwrap().unwrap() <= Utc::now());
    let counts = db.counts(Utc::now()).unwrap();
    assert_eq!((counts.pending, counts.due), (2, 1));
}
