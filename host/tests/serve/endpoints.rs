//! Each endpoint's happy path, its JSON in an inline snapshot.

use expect_test::expect;
use host::serve::Limits;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::serve::support::{agent_reply, client, make_root, redact, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_its_object() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tokens) = make_root(&dir);
    let server = TestServer::start(&root, Limits::default()).await;
    let http = client();
    let admin = |req: reqwest::RequestBuilder| req.bearer_auth(&tokens.admin);

    let health = http.get(server.at("/v1/health")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    expect![[r#"{"healthy":true}"#]].assert_eq(&health.text().await.unwrap());

    let created = admin(http.post(server.at("/v1/sessions")))
        .json(&json!({"name": "gamma", "routing": {"channelType": "slack", "platformId": "C1"},
                      "destinations": [{"name": "team", "channelType": "slack", "platformId": "C2"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let created: Value = created.json().await.unwrap();
    assert_eq!(created["db"]["created"], json!(true));
    assert_eq!(
        created["routing"],
        json!({"channelType":"slack","platformId":"C1","threadId":null})
    );
    assert!(root.join("gamma/session.db").is_file());
    let again = admin(http.post(server.at("/v1/sessions")))
        .json(&json!({"name": "gamma"}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::OK);

    let list: Value = admin(http.get(server.at("/v1/sessions")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    expect![[r#"
        {
          "sessions": [
            {
              "healthy": false,
              "name": "alpha",
              "runnerStatus": null
            },
            {
              "healthy": false,
              "name": "beta",
              "runnerStatus": null
            },
            {
              "healthy": false,
              "name": "gamma",
              "runnerStatus": null
            }
          ]
        }"#]]
    .assert_eq(&redact(&list));

    let sent = admin(http.post(server.at("/v1/sessions/gamma/messages")))
        .json(&json!({"text": "hello", "sender": "Ana"}))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), StatusCode::CREATED);
    let sent: Value = sent.json().await.unwrap();
    expect![[r#"
        {
          "id": "<id>",
          "kind": "chat",
          "processAfter": null,
          "routing": {
            "channelType": "slack",
            "platformId": "C1",
            "threadId": null
          },
          "seq": 2
        }"#]]
    .assert_eq(&redact(&sent));
    let db = server.db("gamma");
    let row = db
        .message_in(sent["id"].as_str().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(row.seq, Some(2));
    let content: Value = serde_json::from_str(&row.content).unwrap();
    assert_eq!(content["text"], json!("hello"));
    assert_eq!(content["sender"], json!("Ana"));

    let task = admin(http.post(server.at("/v1/sessions/gamma/messages")))
        .json(&json!({"kind": "task", "prompt": "report", "recurrence": "0 9 * * 1", "processAfter": "2030-01-01T00:00:00Z"}))
        .send()
        .await
        .unwrap();
    assert_eq!(task.status(), StatusCode::CREATED);
    let task: Value = task.json().await.unwrap();
    assert_eq!(task["kind"], json!("task"));
    assert_eq!(task["processAfter"], json!("2030-01-01T00:00:00.000Z"));

    let status: Value = admin(http.get(server.at("/v1/sessions/gamma")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["counts"]["pending"], json!(2), "{status}");
    assert_eq!(status["routing"]["platformId"], json!("C1"));
    assert_eq!(status["destinations"], json!(["team"]));

    let health: Value = admin(
        http.get(server.at("/v1/sessions/gamma/health?staleAfterSecs=30&maxTurnSilenceSecs=900")),
    )
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    expect![[r#"
        {
          "healthy": false,
          "reason": "no runner has started on <root>/gamma/session.db: start agent-runner with this DB"
        }"#]]
    .assert_eq(&redact(&health).replace(root.to_str().unwrap(), "<root>"));

    // A question from the agent, then its answer.
    let question = schema::NewMessageOut::new(
        schema::OutKind::ChatSdk,
        schema::Routing::default(),
        &json!({"operation": "ask_question", "questionId": "q1", "question": "Deploy?",
                "options": [{"label": "Yes", "value": "yes"}, {"label": "No", "value": "no"}]}),
    );
    let question_seq = db.insert_out(&question).unwrap().seq;
    let answered = admin(http.post(server.at("/v1/sessions/gamma/answers")))
        .json(&json!({"questionId": "q1", "option": "Yes", "userId": "u1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), StatusCode::CREATED);
    let answered: Value = answered.json().await.unwrap();
    expect![[r#"
        {
          "id": "<id>",
          "questionFound": true,
          "selectedOption": "yes",
          "seq": 6
        }"#]]
    .assert_eq(&redact(&answered));

    let delivered = admin(http.post(server.at(&format!(
        "/v1/sessions/gamma/messages/{question_seq}/delivered"
    ))))
    .json(&json!({"status": "failed", "reason": "channel archived"}))
    .send()
    .await
    .unwrap();
    assert_eq!(delivered.status(), StatusCode::OK);
    let delivered: Value = delivered.json().await.unwrap();
    expect![[r#"
        {
          "id": "<id>",
          "seq": 5,
          "status": "failed"
        }"#]]
    .assert_eq(&redact(&delivered));
    let record = db
        .delivered(delivered["id"].as_str().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(record.status, "failed");
    assert_eq!(record.reason.as_deref(), Some("channel archived"));
    let reply_seq = agent_reply(&db, "done");
    let ok = admin(http.post(server.at(&format!(
        "/v1/sessions/gamma/messages/{reply_seq}/delivered"
    ))))
    .json(&json!({"status": "delivered", "platformMessageId": "ts-1"}))
    .send()
    .await
    .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let out = db.message_out_by_seq(reply_seq).unwrap().unwrap();
    let record = db.delivered(&out.id).unwrap().unwrap();
    assert_eq!(record.platform_message_id.as_deref(), Some("ts-1"));

    let interrupted = admin(http.post(server.at("/v1/sessions/gamma/interrupt")))
        .send()
        .await
        .unwrap();
    assert_eq!(interrupted.status(), StatusCode::CREATED);
    let interrupted: Value = interrupted.json().await.unwrap();
    expect![[r#"
        {
          "id": "<id>",
          "runnerStatus": null,
          "seq": 8
        }"#]]
    .assert_eq(&redact(&interrupted));
    assert!(db
        .message_in(interrupted["id"].as_str().unwrap())
        .unwrap()
        .is_some());

    let usage: Value = admin(http.get(server.at("/v1/sessions/gamma/usage?by=model&since=7d")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(usage["by"], json!("model"), "{usage}");

    let swept = admin(http.post(server.at("/v1/sessions/gamma/sweep")))
        .json(&json!({"staleAfterSecs": 60, "maxTries": 3, "backoffSecs": 10}))
        .send()
        .await
        .unwrap();
    assert_eq!(swept.status(), StatusCode::OK);
    let swept: Value = swept.json().await.unwrap();
    expect![[r#"
        {
          "due": 3,
          "failed": [],
          "nextDue": "<nextDue>",
          "reset": []
        }"#]]
    .assert_eq(&redact(&swept));

    server.stop().await;
}
