//! End-to-end tests of the `nanoclaw` binary: each spawns the built CLI against a temp
//! workspace and checks the rows through the `schema` crate and the printed output.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use chrono::Utc;
use schema::time::parse_ts;
use schema::{MessageIn, NewMessageOut, OutKind, Routing, RunnerStatus, SessionDb};
use serde_json::{json, Value};
use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_nanoclaw");

fn nanoclaw(db: Option<&Path>, args: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    command
        .env_remove("SESSION_DB")
        .env_remove("RUST_LOG")
        .env("TZ", "UTC");
    if let Some(db) = db {
        command.arg("--db").arg(db);
    }
    command.args(args).output().expect("running nanoclaw")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[track_caller]
fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "expected success, got {:?}\nstdout: {}\nstderr: {}",
        output.status,
        stdout(&output),
        stderr(&output)
    );
    stdout(&output)
}

/// Runs and expects failure; returns stderr.
#[track_caller]
fn fails(output: Output) -> String {
    assert!(
        !output.status.success(),
        "expected failure, got success\nstdout: {}",
        stdout(&output)
    );
    stderr(&output)
}

/// A workspace with routing `slack:C123` and a destination; returns (dir, db path).
fn workspace() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    ok(nanoclaw(
        None,
        &[
            "init",
            "--workspace",
            ws.to_str().unwrap(),
            "--routing",
            "slack:C123",
            "--destination",
            "team=slack:C9:Team room",
        ],
    ));
    (dir, ws.join("session.db"))
}

/// Parses `id=<uuid> seq=<n>` and returns the row.
fn sent_row(db: &SessionDb, out: &str) -> MessageIn {
    let id = out
        .split_whitespace()
        .find_map(|part| part.strip_prefix("id="))
        .unwrap_or_else(|| panic!("no id in {out:?}"));
    let seq: i64 = out
        .split_whitespace()
        .find_map(|part| part.strip_prefix("seq="))
        .unwrap_or_else(|| panic!("no seq in {out:?}"))
        .parse()
        .unwrap();
    let row = db.message_in(id).unwrap().expect("row exists");
    assert_eq!(row.seq, Some(seq));
    assert_eq!(seq % 2, 0, "messages_in seq must be even");
    row
}

fn content(row: &MessageIn) -> Value {
    serde_json::from_str(&row.content).unwrap()
}

fn slack(platform_id: &str, thread: Option<&str>) -> Routing {
    Routing {
        channel_type: Some("slack".into()),
        platform_id: Some(platform_id.into()),
        thread_id: thread.map(str::to_owned),
    }
}

#[test]
fn init_creates_the_tree_and_is_idempotent() {
    let (dir, db_path) = workspace();
    let ws = dir.path().join("ws");
    for folder in [
        "agent",
        "agent/conversations",
        "global",
        "extra",
        "downloads",
        "outbox",
    ] {
        assert!(ws.join(folder).is_dir(), "{folder}");
    }
    assert!(db_path.is_file());
    let db = SessionDb::open(&db_path).unwrap();
    db.insert_in(&schema::NewMessageIn::new("chat", r#"{"text":"keep me"}"#))
        .unwrap();

    let again = ok(nanoclaw(
        None,
        &[
            "init",
            "--workspace",
            ws.to_str().unwrap(),
            "--destination",
            "team=slack:C10",
            "--destination",
            "helper=agent:grp-1",
        ],
    ));
    assert!(!again.contains("created"), "{again}");
    assert!(again.contains("exists  session DB"), "{again}");
    assert_eq!(db.all_messages_in().unwrap().len(), 1, "rows survive");
    assert_eq!(db.session_routing().unwrap(), Some(slack("C123", None)));
    let destinations = db.destinations().unwrap();
    assert_eq!(destinations.len(), 2);
    let team = db.destination("team").unwrap().unwrap();
    assert_eq!(team.platform_id.as_deref(), Some("C10"));
    assert_eq!(team.kind, "channel");
    let helper = db.destination("helper").unwrap().unwrap();
    assert_eq!(
        (helper.kind.as_str(), helper.agent_group_id.as_deref()),
        ("agent", Some("grp-1"))
    );

    // --db elsewhere, JSON report; the workspace is still created.
    let other = dir.path().join("other");
    let custom_db = dir.path().join("dbs/custom.db");
    let report: Value = serde_json::from_str(&ok(nanoclaw(
        Some(&custom_db),
        &["--json", "init", "--workspace", other.to_str().unwrap()],
    )))
    .unwrap();
    assert_eq!(report["db"]["created"], json!(true));
    assert_eq!(report["folders"].as_array().unwrap().len(), 6);
    assert!(custom_db.is_file() && other.join("agent/conversations").is_dir());

    let err = fails(nanoclaw(None, &["init"]));
    assert!(err.contains("--workspace"), "{err}");
    let err = fails(nanoclaw(
        None,
        &[
            "init",
            "--workspace",
            ws.to_str().unwrap(),
            "--routing",
            "slack",
        ],
    ));
    assert!(err.contains("channel_type:platform_id"), "{err}");
}

#[test]
fn send_chat_writes_the_spec_shape() {
    let (_dir, db_path) = workspace();
    let db = SessionDb::open(&db_path).unwrap();
    let first = sent_row(
        &db,
        &ok(nanoclaw(
            Some(&db_path),
            &["send", "--text", "Check this PR", "--sender", "John"],
        )),
    );
    assert_eq!(first.kind, "chat");
    assert!(first.trigger && !first.on_wake);
    assert_eq!(first.status, "pending");
    assert_eq!(first.process_after, None);
    assert_eq!(first.routing, slack("C123", None), "session routing");
    assert_eq!(
        content(&first),
        json!({"sender":"John","text":"Check this PR","attachments":[],"isFromMe":false})
    );

    let first_seq = first.seq.unwrap().to_string();
    let reply = sent_row(
        &db,
        &ok(nanoclaw(
            Some(&db_path),
            &[
                "send",
                "--text",
                "Already on it",
                "--sender",
                "Jane",
                "--sender-id",
                "U2",
                "--reply-to",
                &first_seq,
                "--attach-path",
                "downloads/msg-4/data.xlsx",
                "--attach-url",
                "https://example.com/a/photo.jpg",
            ],
        )),
    );
    assert!(reply.seq > first.seq);
    assert_eq!(
        content(&reply),
        json!({
            "sender": "Jane",
            "senderId": "U2",
            "text": "Already on it",
            "attachments": [
                {"type":"file","name":"data.xlsx","localPath":"downloads/msg-4/data.xlsx",
                 "mimeType":"application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"},
                {"type":"image","name":"photo.jpg","url":"https://example.com/a/photo.jpg",
                 "mimeType":"image/jpeg"}
            ],
            "isFromMe": false,
            "replyTo": {"id": first_seq, "sender": "John", "text": "Check this PR"}
        })
    );

    // Context-only, delayed, in a thread of the session channel.
    let before = Utc::now();
    let delayed = sent_row(
        &db,
        &ok(nanoclaw(
            Some(&db_path),
            &[
                "send",
                "--text",
                "later",
                "--no-trigger",
                "--process-after",
                "+10m",
                "--thread-id",
                "T1",
                "--on-wake",
                "--reply-to",
                "p-77",
                "--quote-sender",
                "Bob",
                "--quote-text",
                "hi",
            ],
        )),
    );
    assert!(!delayed.trigger && delayed.on_wake);
    assert_eq!(delayed.routing, slack("C123", Some("T1")));
    assert_eq!(
        content(&delayed)["replyTo"],
        json!({"id":"p-77","sender":"Bob","text":"hi"})
    );
    let at = delayed.process_after.unwrap();
    assert!(
        at.ends_with('Z') && at.len() == "2026-11-21T10:00:00.000Z".len(),
        "{at}"
    );
    let delay = (parse_ts(&at).unwrap() - before).num_seconds();
    assert!((599..=605).contains(&delay), "{delay}");

    // Explicit routing replaces the session routing; absolute times are normalised to UTC ms.
    let routed = sent_row(
        &db,
        &ok(nanoclaw(
            Some(&db_path),
            &[
                "send",
                "--text",
                "hey",
                "--channel-type",
                "discord",
                "--platform-id",
                "42",
                "--process-after",
                "2030-01-01T09:00:00+01:00",
            ],
        )),
    );
    assert_eq!(
        routed.routing,
        Routing {
            channel_type: Some("discord".into()),
            platform_id: Some("42".into()),
            thread_id: None
        }
    );
    assert_eq!(
        routed.process_after.as_deref(),
        Some("2030-01-01T08:00:00.000Z")
    );
}

#[test]
fn send_other_kinds() {
    let (_dir, db_path) = workspace();
    let db = SessionDb::open(&db_path).unwrap();

    let task = sent_row(
        &db,
        &ok(nanoclaw(
            Some(&db_path),
            &[
                "send",
                "--kind",
                "task",
                "--prompt",
                "Summarise the inbox",
                "--script",
                "echo '{\"wakeAgent\":true}'",
                "--recurrence",
                "0 9 * * 1-5",
                "--process-after",
                "2030-01-01 09:00",
            ],
        )),
    );
    assert_eq!(task.kind, "task");
    assert_eq!(task.series_id.as_deref(), Some(task.id.as_str()));
    assert_eq!(task.recurrence.as_deref(), Some("0 9 * * 1-5"));
    assert_eq!(
        task.process_after.as_deref(),
        Some("2030-01-01T09:00:00.000Z")
    );
    assert_eq!(
        content(&task),
        json!({"prompt":"Summarise the inbox","script":"echo '{\"wakeAgent\":true}'"})
    );

    // A recurring task without --process-after first runs at the next cron match (TZ=UTC).
    let out = nanoclaw(
        Some(&db_path),
        &[
            "send",
            "--kind",
            "task",
            "--prompt",
            "hourly",
            "--recurrence",
            "0 * * * *",
        ],
    );
    assert!(stderr(&out).contains("first run at"), "{}", stderr(&out));
    let hourly = sent_row(&db, &ok(out));
    let first_run = parse_ts(hourly.process_after.as_deref().unwrap()).unwrap();
    assert!(first_run > Utc::now() && first_run <= Utc::now() + chrono::Duration::hours(1));
    assert_eq!(first_run.timestamp() % 3600, 0);

    let webhook = sent_row(
        &db,
        &ok(nanoclaw(
            Some(&db_path),
            &[
                "send",
                "--kind",
                "webhook",
                "--source",
                "github",
                "--event",
                "pull_request",
                "--payload",
                r#"{"action":"opened","number":7}"#,
            ],
        )),
    );
    assert_eq!(
        content(&webhook),
        json!({"source":"github","event":"pull_request","payload":{"action":"opened","number":7}})
    );

    let system_content = r#"{"action":"register_agent_group","status":"ok","result":{"id":"g1"}}"#;
    let system = sent_row(
        &db,
        &ok(nanoclaw(
            Some(&db_path),
            &["send", "--kind", "system", "--content", system_content],
        )),
    );
    assert_eq!(system.kind, "system");
    assert_eq!(
        content(&system),
        serde_json::from_str::<Value>(system_content).unwrap()
    );

    let sdk = sent_row(
        &db,
        &ok(nanoclaw(
            Some(&db_path),
            &[
                "send",
                "--kind",
                "chat-sdk",
                "--text",
                "@bot hi",
                "--sender",
                "Ann",
                "--sender-id",
                "U9",
            ],
        )),
    );
    let sdk_content = content(&sdk);
    assert_eq!(sdk.kind, "chat-sdk");
    assert_eq!(sdk_content["_type"], "chat:Message");
    assert_eq!(sdk_content["text"], "@bot hi");
    assert_eq!(
        sdk_content["author"],
        json!({"userId":"U9","userName":"Ann","fullName":"Ann","isBot":false,"isMe":false})
    );
    assert_eq!(sdk_content["metadata"]["edited"], json!(false));
    assert_eq!(sdk_content["id"], json!(sdk.id), "message id = row id");

    // --json prints the id and seq of the row.
    let printed: Value = serde_json::from_str(&ok(nanoclaw(
        Some(&db_path),
        &[
            "--json",
            "send",
            "--content",
            r#"{"text":"raw","sender":"X"}"#,
        ],
    )))
    .unwrap();
    let raw = db
        .message_in(printed["id"].as_str().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(printed["seq"], json!(raw.seq));
    assert_eq!(printed["kind"], "chat");

    let seqs: Vec<i64> = db
        .all_messages_in()
        .unwrap()
        .iter()
        .filter_map(|row| row.seq)
        .collect();
    assert!(seqs.iter().all(|seq| seq % 2 == 0), "{seqs:?}");
}

#[test]
fn send_rejects_bad_input() {
    let (dir, db_path) = workspace();
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "send",
                "--kind",
                "webhook",
                "--source",
                "gh",
                "--payload",
                "{oops",
            ],
            "--payload is not valid JSON",
        ),
        (
            &[
                "send",
                "--kind",
                "task",
                "--prompt",
                "x",
                "--recurrence",
                "0 0 9 * * 1",
            ],
            "bad cron expression",
        ),
        (
            &[
                "send",
                "--kind",
                "task",
                "--prompt",
                "x",
                "--recurrence",
                "61 * * * *",
            ],
            "bad cron expression",
        ),
        (
            &["send", "--text", "x", "--process-after", "next tuesday"],
            "bad time \"next tuesday\"",
        ),
        (
            &["send", "--text", "x", "--process-after", "+10 minutes"],
            "bad relative time",
        ),
        (&["send", "--kind", "email", "--text", "x"], "'email'"),
        (&["send", "--content", "{not json"], "not valid JSON"),
        (&["send", "--content", "[1,2]"], "JSON object"),
        (
            &["send", "--content", r#"{"text":5}"#],
            "does not fit --kind chat",
        ),
        (&["send"], "needs --text"),
        (&["send", "--kind", "task"], "needs --prompt"),
        (&["send", "--kind", "system"], "needs --content"),
        (&["send", "--prompt", "x"], "--prompt does not apply"),
        (
            &["send", "--text", "x", "--attach-path", "../etc/passwd"],
            "relative to the workspace",
        ),
        (
            &["send", "--text", "x", "--attach-url", "ftp://x/y"],
            "http",
        ),
    ];
    for (args, expected) in cases {
        let err = fails(nanoclaw(Some(&db_path), args));
        assert!(err.contains(expected), "{args:?}: {err}");
    }
    let db = SessionDb::open(&db_path).unwrap();
    assert!(db.all_messages_in().unwrap().is_empty(), "nothing written");

    let missing = dir.path().join("nope.db");
    let err = fails(nanoclaw(Some(&missing), &["send", "--text", "x"]));
    assert!(
        err.contains("no session DB") && err.contains("nanoclaw init"),
        "{err}"
    );
    assert!(!missing.exists());
    let err = fails(nanoclaw(None, &["status"]));
    assert!(err.contains("SESSION_DB"), "{err}");
}

fn out_row(db: &SessionDb, kind: OutKind, content: Value, reply_to: Option<&str>) -> i64 {
    db.insert_out(
        &NewMessageOut::new(kind, slack("C123", None), &content)
            .replying_to(reply_to.map(str::to_owned)),
    )
    .unwrap()
    .seq
}

#[test]
fn watch_prints_rows_written_by_another_process() {
    let (_dir, db_path) = workspace();
    let db = SessionDb::open(&db_path).unwrap();
    let started = Instant::now();
    let mut child = Command::new(BIN)
        .env_remove("SESSION_DB")
        .arg("--db")
        .arg(&db_path)
        .args(["watch", "--until-count", "2", "--json", "--timeout", "10"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let first = out_row(&db, OutKind::Chat, json!({"text":"one"}), Some("in-1"));
    std::thread::sleep(Duration::from_millis(100));
    let second = out_row(
        &db,
        OutKind::System,
        json!({"action":"query_error","payload":{"message":"boom"}}),
        None,
    );
    let inserted = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            inserted.elapsed() < Duration::from_secs(3),
            "watch did not return"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let woke_after = inserted.elapsed();
    eprintln!("watch returned {woke_after:?} after the second insert");
    let output = child.wait_with_output().unwrap();
    let text = ok(output);
    let lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(lines[0]["seq"], json!(first));
    assert_eq!(lines[0]["content"], json!({"text":"one"}));
    assert_eq!(lines[0]["inReplyTo"], "in-1");
    assert_eq!(lines[0]["channelType"], "slack");
    assert_eq!(lines[1]["seq"], json!(second));
    assert_eq!(lines[1]["kind"], "system");
    assert!(
        woke_after < Duration::from_millis(1500),
        "{woke_after:?} (total {:?})",
        started.elapsed()
    );
    assert!(
        db.delivered(lines[0]["id"].as_str().unwrap())
            .unwrap()
            .is_none(),
        "read-only"
    );
}

#[test]
fn watch_renders_filters_times_out_and_marks_delivered() {
    let (_dir, db_path) = workspace();
    let db = SessionDb::open(&db_path).unwrap();
    let chat = out_row(
        &db,
        OutKind::Chat,
        json!({"text":"Hello there"}),
        Some("1f2e3d4c-0000-4000-8000-000000000000"),
    );
    out_row(
        &db,
        OutKind::ChatSdk,
        json!({"operation":"ask_question","questionId":"q1","title":"Deploy",
               "question":"Pick one","options":[
                   {"label":"a","selectedLabel":"a","value":"a"},
                   {"label":"b","selectedLabel":"b","value":"b"}]}),
        None,
    );
    out_row(
        &db,
        OutKind::Chat,
        json!({"operation":"edit","messageId":chat.to_string(),"text":"new text"}),
        None,
    );
    out_row(
        &db,
        OutKind::System,
        json!({"action":"query_error","payload":{"retryable":false}}),
        None,
    );
    let text = ok(nanoclaw(Some(&db_path), &["watch", "--no-follow"]));
    let expected = format!(
        "[seq {chat} → slack:C123] reply to 1f2e3d4c: Hello there\n\
         [seq {} → slack:C123] (question q1) Deploy: Pick one: [a] [b]\n\
         [seq {} → slack:C123] (edit {chat}) new text\n\
         [seq {} → slack:C123] (query error: ?, not retryable) ?\n",
        chat + 2,
        chat + 4,
        chat + 6
    );
    assert_eq!(text, expected);

    let after = ok(nanoclaw(
        Some(&db_path),
        &["watch", "--no-follow", "--after", &(chat + 4).to_string()],
    ));
    assert_eq!(after.lines().count(), 1, "{after}");
    assert!(after.contains("query error"));
    let new_only = ok(nanoclaw(Some(&db_path), &["watch", "--new", "--no-follow"]));
    assert_eq!(new_only, "");

    let started = Instant::now();
    let err = fails(nanoclaw(
        Some(&db_path),
        &["watch", "--until-count", "10", "--timeout", "0.3"],
    ));
    assert!(
        err.contains("timed out") && err.contains("4 of 10"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    // A plain --timeout without a count just ends the follow.
    ok(nanoclaw(Some(&db_path), &["watch", "--timeout", "0.2"]));

    let marked = ok(nanoclaw(
        Some(&db_path),
        &["--json", "watch", "--no-follow", "--mark-delivered"],
    ));
    for line in marked.lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        let delivered = db.delivered(row["id"].as_str().unwrap()).unwrap().unwrap();
        assert_eq!(delivered.status, "delivered");
    }
    assert_eq!(marked.lines().count(), 4);
}

#[test]
fn answer_writes_a_question_response() {
    let (_dir, db_path) = workspace();
    let db = SessionDb::open(&db_path).unwrap();
    db.insert_out(&NewMessageOut::new(
        OutKind::ChatSdk,
        slack("C123", Some("T7")),
        &json!({"operation":"ask_question","questionId":"q-42","title":"Deploy?",
                "question":"Ship it?","options":[
                    {"label":"Yes, ship","selectedLabel":"Shipping","value":"yes"},
                    {"label":"No","selectedLabel":"Held","value":"no"}]}),
    ))
    .unwrap();

    let row = sent_row(
        &db,
        &ok(nanoclaw(
            Some(&db_path),
            &[
                "answer",
                "--question",
                "q-42",
                "--option",
                "yes",
                "--user-id",
                "U1",
            ],
        )),
    );
    assert_eq!(row.kind, "system");
    assert_eq!(
        content(&row),
        json!({"type":"question_response","questionId":"q-42","selectedOption":"yes","userId":"U1"})
    );
    assert_eq!(
        row.routing,
        slack("C123", Some("T7")),
        "routed like the question"
    );
    assert!(row.trigger);

    // A label maps to its value.
    let by_label = sent_row(
        &db,
        &ok(nanoclaw(
            Some(&db_path),
            &["answer", "--question", "q-42", "--option", "no"],
        )),
    );
    assert_eq!(content(&by_label)["selectedOption"], "no");
    assert!(content(&by_label).get("userId").is_none());

    let count = db.all_messages_in().unwrap().len();
    let err = fails(nanoclaw(
        Some(&db_path),
        &["answer", "--question", "q-unknown", "--option", "yes"],
    ));
    assert!(err.contains("no question \"q-unknown\""), "{err}");
    let err = fails(nanoclaw(
        Some(&db_path),
        &["answer", "--question", "q-42", "--option", "maybe"],
    ));
    assert!(err.contains("choose one of: yes (Yes, ship), no"), "{err}");
    assert_eq!(
        db.all_messages_in().unwrap().len(),
        count,
        "nothing written"
    );

    let forced = sent_row(
        &db,
        &ok(nanoclaw(
            Some(&db_path),
            &[
                "answer",
                "--question",
                "q-unknown",
                "--option",
                "yes",
                "--force",
            ],
        )),
    );
    assert_eq!(content(&forced)["questionId"], "q-unknown");
    assert_eq!(forced.routing, slack("C123", None), "session routing");
}

#[test]
fn sweep_resets_stale_rows_and_fails_exhausted_ones() {
    let (_dir, db_path) = workspace();
    let db = SessionDb::open(&db_path).unwrap();
    let a = db
        .insert_in(&schema::NewMessageIn::new("chat", r#"{"text":"a"}"#))
        .unwrap()
        .id;
    let b = db
        .insert_in(&schema::NewMessageIn::new("chat", r#"{"text":"b"}"#))
        .unwrap()
        .id;
    // a: claimed twice (tries 2); b: claimed once (tries 1).
    db.claim(std::slice::from_ref(&a)).unwrap();
    db.reset_processing().unwrap();
    db.claim(&[a.clone(), b.clone()]).unwrap();

    // Not stale yet under the default 600 s.
    let quiet: Value =
        serde_json::from_str(&ok(nanoclaw(Some(&db_path), &["--json", "sweep"]))).unwrap();
    assert_eq!(quiet["reset"], json!([]));
    assert_eq!(quiet["failed"], json!([]));

    let before = Utc::now();
    let report: Value = serde_json::from_str(&ok(nanoclaw(
        Some(&db_path),
        &[
            "--json",
            "sweep",
            "--stale-after",
            "0",
            "--max-tries",
            "2",
            "--backoff",
            "60",
        ],
    )))
    .unwrap();
    assert_eq!(report["reset"], json!([b]));
    assert_eq!(report["failed"], json!([a]));
    assert_eq!(report["due"], json!(0));
    let row_a = db.message_in(&a).unwrap().unwrap();
    let row_b = db.message_in(&b).unwrap().unwrap();
    assert_eq!(row_a.status, "failed");
    assert_eq!(row_b.status, "pending");
    let retry = parse_ts(row_b.process_after.as_deref().unwrap()).unwrap();
    let delay = (retry - before).num_seconds();
    assert!((59..=62).contains(&delay), "backoff {delay}");

    let text = ok(nanoclaw(Some(&db_path), &["sweep"]));
    assert!(text.contains("reset  0"), "{text}");
    assert!(text.contains("next due"), "{text}");
}

#[test]
fn status_reports_runner_counts_next_due_and_tasks() {
    let (_dir, db_path) = workspace();
    let text = ok(nanoclaw(Some(&db_path), &["status"]));
    assert!(text.contains("no runner has started"), "{text}");
    assert!(text.contains("nothing pending"), "{text}");
    assert!(text.contains("tasks       none"), "{text}");

    ok(nanoclaw(
        Some(&db_path),
        &[
            "send",
            "--kind",
            "task",
            "--prompt",
            "Write the weekly report for the team",
            "--recurrence",
            "0 9 * * 1",
            "--process-after",
            "+10m",
        ],
    ));
    let text = ok(nanoclaw(Some(&db_path), &["status"]));
    assert!(text.contains("1 pending (0 due)"), "{text}");
    assert!(text.contains("(in 9m 5"), "{text}");
    assert!(text.contains("every \"0 9 * * 1\""), "{text}");
    assert!(text.contains("Write the weekly report"), "{text}");

    let db = SessionDb::open(&db_path).unwrap();
    db.insert_in(&schema::NewMessageIn::new("chat", r#"{"text":"now"}"#))
        .unwrap();
    db.set_runner_state(RunnerStatus::Busy, Some(4242), Some("mock"))
        .unwrap();
    let text = ok(nanoclaw(Some(&db_path), &["status"]));
    assert!(
        text.contains("runner      busy for 0s, pid 4242, provider mock, heartbeat 0s ago"),
        "{text}"
    );
    assert!(
        text.contains("2 pending (1 due), 0 processing, 0 paused, 0 failed"),
        "{text}"
    );
    assert!(text.contains("(now)"), "{text}");

    let report: Value =
        serde_json::from_str(&ok(nanoclaw(Some(&db_path), &["--json", "status"]))).unwrap();
    assert_eq!(
        report["counts"],
        json!({"pending":2,"due":1,"processing":0,"paused":0,"failed":0})
    );
    assert_eq!(report["runner"]["status"], "busy");
    assert_eq!(report["runner"]["pid"], 4242);
    assert_eq!(report["runner"]["heartbeatStale"], false);
    assert_eq!(report["nextDueInSecs"], 0);
    let tasks = report["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0]["recurrence"], "0 9 * * 1");
    assert_eq!(tasks[0]["seriesId"], tasks[0]["id"]);
    assert_eq!(report["destinations"], json!(["team"]));
}

/// A ledger row of `provider` recorded at `at`, as the runner writes it.
fn record_turn(db: &SessionDb, provider: &str, cost_usd: Option<f64>, at: &str) {
    let usage = schema::NewTurnUsage {
        provider: provider.into(),
        model: Some(format!("{provider}-model")),
        input_tokens: Some(1000),
        output_tokens: Some(250),
        cache_read_tokens: Some(4000),
        cache_write_tokens: None,
        reasoning_tokens: None,
        cost_usd,
        requests: Some(1),
        duration_ms: Some(2500),
        outcome: schema::UsageOutcome::Result,
        message_ids: vec!["in-1".into()],
        series_id: None,
    };
    db.record_usage(&usage, parse_ts(at).unwrap()).unwrap();
}

#[test]
fn usage_prints_totals_breakdowns_and_json() {
    let (_dir, db_path) = workspace();
    expect_test::expect![[r#"
        usage of the whole session (days in UTC)
        no turn recorded
    "#]]
    .assert_eq(&ok(nanoclaw(Some(&db_path), &["usage"])));
    let db = SessionDb::open(&db_path).unwrap();
    record_turn(&db, "claude", Some(0.0421), "2026-11-19T23:00:00Z");
    record_turn(&db, "claude", Some(0.0133), "2026-11-20T09:00:00Z");
    record_turn(&db, "codex", None, "2026-11-20T10:00:00Z");
    expect_test::expect![[r#"
        usage of the whole session (days in UTC)
        turns       3
        tokens      15750 (input 3000, output 750, cache read 12000, cache write ?, reasoning ?)
        cost        $0.0554+?
        requests    3
        time        7s
        (? = not reported by the CLI; N+? = N from the turns that reported it)
    "#]]
    .assert_eq(&ok(nanoclaw(Some(&db_path), &["usage"])));
    expect_test::expect![[r#"
        usage since 2026-11-20T00:00:00.000Z (days in UTC)
        provider  turns  input  output  cache read  cache write  reasoning       cost
        claude        1   1000     250        4000            ?          ?    $0.0133
        codex         1   1000     250        4000            ?          ?          ?
        total         2   2000     500        8000            ?          ?  $0.0133+?
        (? = not reported by the CLI; N+? = N from the turns that reported it)
    "#]]
    .assert_eq(&ok(nanoclaw(
        Some(&db_path),
        &["usage", "--by", "provider", "--since", "2026-11-20"],
    )));
    let report: Value = serde_json::from_str(&ok(nanoclaw(
        Some(&db_path),
        &["--json", "usage", "--by", "day"],
    )))
    .unwrap();
    assert_eq!(
        keys(&report),
        ["by", "db", "groups", "since", "timeZone", "totals"]
    );
    let days: Vec<&Value> = report["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|group| &group["key"])
        .collect();
    assert_eq!(days, [&json!("2026-11-19"), &json!("2026-11-20")]);
    assert_eq!(
        report["totals"]["costUsd"],
        json!({"sum": 0.0554, "unreported": 1}),
        "the turn without a cost is counted apart, never as 0"
    );
    assert_eq!(
        report["groups"][0]["totals"]["cacheWriteTokens"],
        json!({"sum": null, "unreported": 1})
    );
    let err = fails(nanoclaw(Some(&db_path), &["usage", "--by", "week"]));
    assert!(
        err.contains("expected day, model, series or provider"),
        "{err}"
    );
    let err = fails(nanoclaw(Some(&db_path), &["usage", "--since", "last week"]));
    assert!(err.contains("bad --since \"last week\""), "{err}");
}

#[test]
fn interrupt_writes_the_row_the_runner_recognises() {
    let (_dir, db_path) = workspace();
    let db = SessionDb::open(&db_path).unwrap();
    let output = nanoclaw(Some(&db_path), &["interrupt"]);
    let note = stderr(&output);
    let row = sent_row(&db, &ok(output));
    assert!(note.contains("no runner has started"), "{note}");
    assert_eq!((row.kind.as_str(), row.trigger), ("system", true));
    assert_eq!(content(&row), json!({"action": "interrupt"}));
    assert!(schema::control::is_interrupt(&row.kind, &row.content));

    set_runner(&db, "busy", 5, 1);
    let output = nanoclaw(Some(&db_path), &["--json", "interrupt"]);
    assert_eq!(stderr(&output), "", "a running turn: nothing to note");
    let sent: Value = serde_json::from_str(&ok(output)).unwrap();
    assert_eq!(keys(&sent), ["id", "runnerStatus", "seq"]);
    assert_eq!(sent["runnerStatus"], "busy");
    let row = db
        .message_in(sent["id"].as_str().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(row.seq, sent["seq"].as_i64());
}

/// The write end of a pipe whose read end is already closed: every write fails with EPIPE.
fn dead_pipe() -> Stdio {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    writer.into()
}

#[test]
fn a_dead_stderr_pipe_never_panics() {
    // Issue 10: writing a log line or the final error to a broken stderr used to panic (101).
    let (_dir, db_path) = workspace();
    let run = |db: &Path| {
        Command::new(BIN)
            .env_remove("SESSION_DB")
            .env("RUST_LOG", "debug")
            .env("TZ", "UTC")
            .arg("--db")
            .arg(db)
            .arg("status")
            .stdin(Stdio::null())
            .stderr(dead_pipe())
            .output()
            .unwrap()
    };
    let output = run(&db_path);
    assert!(output.status.success(), "{:?}", output.status);
    assert!(
        stdout(&output).contains("nothing pending"),
        "{}",
        stdout(&output)
    );
    let output = run(&db_path.with_file_name("missing.db"));
    assert_eq!(output.status.code(), Some(1), "{:?}", output.status);
}

/// `nanoclaw` with `SESSION_DB` exported (as a stale shell would have it).
fn nanoclaw_with_env_db(env_db: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .env("SESSION_DB", env_db)
        .env_remove("RUST_LOG")
        .env("TZ", "UTC")
        .args(args)
        .output()
        .expect("running nanoclaw")
}

#[test]
fn the_workspace_implies_the_db_for_every_command_and_beats_a_stale_session_db() {
    let (dir, stale_db) = workspace();
    let b = dir.path().join("b");
    let b_arg = b.to_str().unwrap();
    let output = nanoclaw_with_env_db(&stale_db, &["init", "--workspace", b_arg]);
    let err = stderr(&output);
    let out = ok(output);
    let b_db = b.join("session.db");
    assert!(b_db.is_file(), "{out}");
    assert!(
        out.contains(&format!("created session DB {}", b_db.display())),
        "{out}"
    );
    assert_eq!(
        err.trim(),
        format!(
            "note: SESSION_DB={} is ignored: --workspace means the session DB {}",
            stale_db.display(),
            b_db.display()
        )
    );

    // init with only SESSION_DB says where the DB goes.
    let c_db = dir.path().join("c/session.db");
    std::fs::create_dir_all(c_db.parent().unwrap()).unwrap();
    let output = nanoclaw_with_env_db(&c_db, &["init"]);
    assert!(
        stderr(&output).contains(&format!(
            "note: the session DB is SESSION_DB={}",
            c_db.display()
        )),
        "{}",
        stderr(&output)
    );
    ok(output);

    // send, watch, status, sweep, answer and health all take --workspace.
    let sent = ok(nanoclaw_with_env_db(
        &stale_db,
        &[
            "send",
            "--workspace",
            b_arg,
            "--text",
            "to b",
            "--platform-id",
            "C1",
            "--channel-type",
            "slack",
        ],
    ));
    let b_session = SessionDb::open(&b_db).unwrap();
    assert_eq!(sent_row(&b_session, &sent).status, "pending");
    assert!(SessionDb::open(&stale_db)
        .unwrap()
        .all_messages_in()
        .unwrap()
        .is_empty());
    let status = ok(nanoclaw_with_env_db(
        &stale_db,
        &["status", "--workspace", b_arg],
    ));
    assert!(
        status.contains(&format!("session DB  {}", b_db.display())),
        "{status}"
    );
    assert!(status.contains("1 pending (1 due)"), "{status}");
    ok(nanoclaw_with_env_db(
        &stale_db,
        &["--workspace", b_arg, "watch", "--no-follow"],
    ));
    ok(nanoclaw_with_env_db(
        &stale_db,
        &["--workspace", b_arg, "sweep"],
    ));
    let health = fails(nanoclaw_with_env_db(
        &stale_db,
        &["health", "--workspace", b_arg],
    ));
    assert!(health.contains("no runner has started on"), "{health}");

    // --db and --workspace naming different DBs is refused outside init.
    let err = fails(nanoclaw(Some(&stale_db), &["status", "--workspace", b_arg]));
    assert!(err.contains("name different session DBs"), "{err}");
}

/// Sets the runner_state row's status and times (seconds before now).
fn set_runner(db: &SessionDb, status: &str, since_secs: i64, heartbeat_secs: i64) {
    db.set_runner_state(RunnerStatus::Idle, Some(4242), Some("mock"))
        .unwrap();
    let at = |secs: i64| schema::time::format_ts(Utc::now() - chrono::Duration::seconds(secs));
    db.dedicated_connection()
        .unwrap()
        .execute(
            "UPDATE runner_state SET status = ?1, updated_at = ?2, heartbeat_at = ?3",
            [status, &at(since_secs), &at(heartbeat_secs)],
        )
        .unwrap();
}

#[test]
fn health_exit_codes_and_reasons() {
    let (dir, db_path) = workspace();
    let health = |args: &[&str]| {
        let mut all = vec!["health"];
        all.extend_from_slice(args);
        nanoclaw(Some(&db_path), &all)
    };
    let err = fails(health(&[]));
    assert!(
        err.contains("nanoclaw: unhealthy: no runner has started on"),
        "{err}"
    );

    let db = SessionDb::open(&db_path).unwrap();
    set_runner(&db, "idle", 60, 2);
    let out = ok(health(&[]));
    assert_eq!(out.trim(), "healthy: runner idle, heartbeat 2 s ago");
    let json: Value =
        serde_json::from_str(&ok(nanoclaw(Some(&db_path), &["--json", "health"]))).unwrap();
    assert_eq!(
        json,
        json!({"healthy": true, "reason": "healthy: runner idle, heartbeat 2 s ago"})
    );

    set_runner(&db, "busy", 60, 40);
    let err = fails(health(&[]));
    assert!(err.contains("heartbeat is 40 s old (limit 30 s)"), "{err}");
    ok(health(&["--stale-after", "60"]));

    set_runner(&db, "busy", 1000, 2);
    let err = fails(health(&[]));
    assert!(
        err.contains("no provider event for 1000 s (limit 900 s)"),
        "{err}"
    );
    ok(health(&["--max-turn-silence", "0"]));
    db.heartbeat_with(Some(&schema::LastEvent {
        at: schema::time::format_ts(Utc::now()),
        what: "model output".into(),
    }))
    .unwrap();
    ok(health(&[]));

    set_runner(&db, "stopped", 30, 30);
    let err = fails(health(&[]));
    assert!(
        err.contains("the runner stopped 30 s ago: start it again"),
        "{err}"
    );
    let json: Value =
        serde_json::from_str(&stdout(&nanoclaw(Some(&db_path), &["--json", "health"]))).unwrap();
    assert_eq!(json["healthy"], false);

    let missing = dir.path().join("nowhere.db");
    let err = fails(nanoclaw(Some(&missing), &["health"]));
    assert!(err.contains("no session DB at"), "{err}");
    let corrupt = dir.path().join("corrupt.db");
    std::fs::write(&corrupt, vec![b'x'; 4096]).unwrap();
    let err = fails(nanoclaw(Some(&corrupt), &["health"]));
    assert!(
        err.contains("is unusable (file is not a database)"),
        "{err}"
    );
}

/// The keys of a JSON object, sorted.
fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {value}"))
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

/// Every key at any depth, except inside `content` (row content is the DB's, not the CLI's).
fn all_keys(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                out.push(key.clone());
                if key != "content" {
                    all_keys(inner, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| all_keys(item, out)),
        _ => {}
    }
}

#[test]
fn every_json_output_is_camel_case_with_the_documented_keys() {
    let (dir, db_path) = workspace();
    let json = |args: &[&str]| -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = ok(nanoclaw(Some(&db_path), &all));
        serde_json::from_str(out.lines().next().unwrap_or_default()).unwrap()
    };
    let init = {
        let ws = dir.path().join("ws2");
        let out = ok(nanoclaw(
            None,
            &[
                "--json",
                "init",
                "--workspace",
                ws.to_str().unwrap(),
                "--routing",
                "slack:C1",
                "--destination",
                "t=slack:C2",
            ],
        ));
        serde_json::from_str::<Value>(&out).unwrap()
    };
    assert_eq!(
        keys(&init),
        ["db", "destinations", "folders", "routing", "workspace"]
    );
    let sent = json(&["send", "--text", "hi", "--process-after", "+1d"]);
    assert_eq!(
        keys(&sent),
        ["id", "kind", "processAfter", "routing", "seq"]
    );
    let db = SessionDb::open(&db_path).unwrap();
    out_row(&db, OutKind::Chat, json!({"text": "reply"}), Some("in-1"));
    let watched = json(&["watch", "--no-follow"]);
    assert_eq!(
        keys(&watched),
        [
            "channelType",
            "content",
            "deliverAfter",
            "id",
            "inReplyTo",
            "kind",
            "platformId",
            "seq",
            "threadId",
            "timestamp"
        ]
    );
    out_row(
        &db,
        OutKind::ChatSdk,
        json!({"operation": "ask_question", "questionId": "q1", "title": "T", "question": "Q?",
               "options": [{"label": "A", "value": "a"}]}),
        None,
    );
    let answered = json(&["answer", "--question", "q1", "--option", "a"]);
    assert_eq!(
        keys(&answered),
        ["id", "questionFound", "selectedOption", "seq"]
    );
    let swept = json(&["sweep"]);
    assert_eq!(keys(&swept), ["due", "failed", "nextDue", "reset"]);
    set_runner(&db, "idle", 5, 1);
    let status = json(&["status"]);
    assert_eq!(
        keys(&status),
        [
            "budget",
            "counts",
            "db",
            "destinations",
            "health",
            "hints",
            "lastError",
            "model",
            "nextDue",
            "nextDueInSecs",
            "now",
            "processing",
            "progress",
            "routing",
            "runner",
            "tasks",
            "usage"
        ]
    );
    assert_eq!(keys(&status["usage"]), ["session", "today"]);
    assert_eq!(
        keys(&status["usage"]["today"]),
        [
            "aborted",
            "cacheReadTokens",
            "cacheWriteTokens",
            "costUsd",
            "durationMs",
            "errors",
            "inputTokens",
            "outputTokens",
            "reasoningTokens",
            "requests",
            "tokens",
            "turns"
        ]
    );
    let usage = json(&["usage", "--by", "model"]);
    assert_eq!(
        keys(&usage),
        ["by", "db", "groups", "since", "timeZone", "totals"]
    );
    let interrupted = json(&["interrupt"]);
    assert_eq!(
        keys(&status["runner"]),
        [
            "currentTool",
            "heartbeatAgeSecs",
            "heartbeatAt",
            "heartbeatStale",
            "lastEvent",
            "lastEventAgeSecs",
            "pid",
            "provider",
            "since",
            "sinceSecs",
            "status",
            "turnSilenceSecs",
            "waitingOn",
            "waitingSecs"
        ]
    );
    let health = json(&["health"]);
    assert_eq!(keys(&health), ["healthy", "reason"]);
    // No snake_case key anywhere in any output.
    let mut found = Vec::new();
    for value in [
        &init,
        &sent,
        &watched,
        &answered,
        &swept,
        &status,
        &health,
        &usage,
        &interrupted,
    ] {
        all_keys(value, &mut found);
    }
    let snake: Vec<&String> = found.iter().filter(|key| key.contains('_')).collect();
    assert!(snake.is_empty(), "snake_case keys: {snake:?}");
}

/// Relative paths (issue 46): started in one folder with a relative `--workspace`, `--db` and
/// `SESSION_DB`, `nanoclaw` makes each absolute once, against that folder: `init` reports the
/// absolute tree, `--db` and `--workspace` written differently name the same DB, and every
/// command finds the same session.
#[test]
fn relative_paths_are_made_absolute_against_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    let ws = cwd.join("ws");
    let run = |args: &[&str], session_db: Option<&str>| {
        let mut command = Command::new(BIN);
        command
            .current_dir(&cwd)
            .env_remove("SESSION_DB")
            .env_remove("RUST_LOG")
            .env("TZ", "UTC")
            .args(args);
        if let Some(db) = session_db {
            command.env("SESSION_DB", db);
        }
        command.output().expect("running nanoclaw")
    };
    let init = ok(run(
        &["init", "--workspace", "ws", "--routing", "slack:C1"],
        None,
    ));
    assert!(
        init.contains(&format!("workspace {}\n", ws.display()))
            && init.contains(&format!(" {}\n", ws.join("session.db").display())),
        "{init}"
    );
    let sent = ok(run(
        &[
            "--db",
            "./ws/session.db",
            "--workspace",
            "ws",
            "send",
            "--sender",
            "Ann",
            "--text",
            "hi",
        ],
        None,
    ));
    let db = SessionDb::open(ws.join("session.db")).unwrap();
    assert_eq!(content(&sent_row(&db, &sent))["text"], "hi");
    let status = ok(run(&["status", "--json"], Some("ws/./session.db")));
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        status["db"],
        ws.join("session.db").display().to_string().as_str()
    );
    assert_eq!(status["counts"]["pending"], 1, "{status}");
}
