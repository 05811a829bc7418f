//! The library API driven in-process, as another crate's tests would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use host::{InitOptions, SendKind, SendRequest, WatchEnd, WatchOptions};
use schema::{NewMessageOut, OutKind, Routing};
use serde_json::json;

#[tokio::test]
async fn init_send_and_watch_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let report = host::init(&InitOptions {
        workspace: dir.path().join("ws"),
        routing: Some(host::parse_routing("slack:C1").unwrap()),
        ..InitOptions::default()
    })
    .unwrap();
    let db = host::open_existing(&report.db.path).unwrap();

    let sent = host::send(
        &db,
        &SendRequest {
            kind: SendKind::Task,
            prompt: Some("check the build".into()),
            process_after: Some("+1h".into()),
            ..SendRequest::default()
        },
    )
    .unwrap();
    assert_eq!(sent.seq % 2, 0);
    assert_eq!(sent.routing.platform_id.as_deref(), Some("C1"));
    let status = host::status(&db, chrono::Utc::now(), &host::status::default_limits()).unwrap();
    assert_eq!(status.tasks.len(), 1);
    assert_eq!(status.counts.due, 0);

    let writer = db.clone();
    let replier = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        writer
            .insert_out(&NewMessageOut::new(
                OutKind::Chat,
                Routing::default(),
                &json!({"text": "done"}),
            ))
            .unwrap();
    });
    let mut seen = Vec::new();
    let summary = host::watch(
        &db,
        &WatchOptions {
            until_count: Some(1),
            timeout: Some(Duration::from_secs(5)),
            ..WatchOptions::default()
        },
        |row| {
            seen.push(host::render_row(row));
            Ok(())
        },
    )
    .await
    .unwrap();
    replier.await.unwrap();
    assert_eq!(summary.end, WatchEnd::CountReached);
    assert_eq!(seen, vec![format!("[seq {}] done", summary.last_seq)]);
}

/// `value` serialized, read back as `T` and serialized again: the same JSON (what a client of
/// the API gets is what the server had).
fn round_trips<T: serde::Serialize + serde::de::DeserializeOwned>(value: &T) -> serde_json::Value {
    let json = serde_json::to_value(value).unwrap();
    let back: T =
        serde_json::from_value(json.clone()).unwrap_or_else(|err| panic!("{err}: {json:#}"));
    assert_eq!(serde_json::to_value(&back).unwrap(), json);
    json
}

#[test]
fn every_report_round_trips_through_its_json() {
    let dir = tempfile::tempdir().unwrap();
    let init = host::init(&InitOptions {
        workspace: dir.path().join("ws"),
        routing: Some(host::parse_routing("slack:C1:T2").unwrap()),
        destinations: vec![host::parse_destination("team=slack:C9:The team").unwrap()],
        ..InitOptions::default()
    })
    .unwrap();
    round_trips(&init);
    let db = host::open_existing(&init.db.path).unwrap();
    let sent = host::send(
        &db,
        &SendRequest {
            kind: SendKind::Task,
            prompt: Some("weekly report".into()),
            recurrence: Some("0 9 * * 1".into()),
            ..SendRequest::default()
        },
    )
    .unwrap();
    assert!(
        !sent.notes.is_empty(),
        "a recurring task's first run is noted"
    );
    let back: host::Sent = serde_json::from_value(round_trips(&sent)).unwrap();
    assert_eq!(back, sent);
    db.set_runner_state(schema::RunnerStatus::Busy, Some(4242), Some("mock"))
        .unwrap();
    db.insert_out(&NewMessageOut::new(
        OutKind::ChatSdk,
        Routing::default(),
        &json!({"operation":"ask_question","questionId":"q1","title":"Deploy",
                "question":"Pick one","options":[{"label":"A","value":"a"}]}),
    ))
    .unwrap();
    for content in [
        json!({"action":"query_error","payload":{"message":"boom","retryable":true}}),
        json!({"action":"progress","payload":{"tool":"Bash","summary":"cargo test","elapsedSecs":12}}),
    ] {
        db.insert_out(&NewMessageOut::new(
            OutKind::System,
            Routing::default(),
            &content,
        ))
        .unwrap();
    }
    db.record_usage(
        &schema::NewTurnUsage {
            provider: "claude".into(),
            model: Some("claude-model".into()),
            input_tokens: Some(1000),
            output_tokens: Some(250),
            cache_read_tokens: None,
            cache_write_tokens: None,
            reasoning_tokens: None,
            cost_usd: Some(0.0421),
            requests: Some(1),
            duration_ms: Some(2500),
            outcome: schema::UsageOutcome::Result,
            message_ids: vec!["in-1".into()],
            series_id: None,
        },
        chrono::Utc::now(),
    )
    .unwrap();
    let now = chrono::Utc::now();
    let status = host::status(&db, now, &host::status::default_limits()).unwrap();
    let json = round_trips(&status);
    assert!(
        json["runner"].is_object() && json["lastError"].is_object(),
        "{json:#}"
    );
    let back: host::StatusReport = serde_json::from_value(json).unwrap();
    assert_eq!(back.render(now), status.render(now));
    for by in [
        None,
        Some(schema::UsageGroup::Model),
        Some(schema::UsageGroup::Day),
    ] {
        let usage = host::usage(&db, &host::UsageRequest { by, since: None }).unwrap();
        let back: host::UsageReport = serde_json::from_value(round_trips(&usage)).unwrap();
        assert_eq!(back.render(), usage.render());
    }
    let answered = host::answer(
        &db,
        &host::AnswerRequest {
            question_id: "q1".into(),
            option: "A".into(),
            ..host::AnswerRequest::default()
        },
    )
    .unwrap();
    assert!(answered.question.is_some());
    let back: host::Answered = serde_json::from_value(round_trips(&answered)).unwrap();
    assert_eq!(back, answered);
    let report: host::AnswerReport =
        serde_json::from_value(round_trips(&answered.report())).unwrap();
    assert_eq!(report, answered.report());
    let interrupt = host::interrupt(&db).unwrap();
    let back: host::InterruptSent = serde_json::from_value(round_trips(&interrupt)).unwrap();
    assert_eq!(
        (back.id, back.seq, back.runner_status),
        (interrupt.id, interrupt.seq, interrupt.runner_status)
    );
    let outcome = host::sweep(&db, &schema::SweepPolicy::default(), now).unwrap();
    let back: host::SweepOutcome = serde_json::from_value(round_trips(&outcome)).unwrap();
    assert_eq!(back, outcome);
    let health =
        host::status::HealthReport::check(&init.db.path, &host::status::default_limits(), now);
    let back: host::status::HealthReport = serde_json::from_value(round_trips(&health)).unwrap();
    assert_eq!(back, health);
}
