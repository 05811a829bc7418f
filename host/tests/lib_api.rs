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
