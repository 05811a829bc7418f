//! `Idempotency-Key`: a repeat gets the first answer and writes nothing, across a restart of
//! the server; the same key with another body is refused.

use host::serve::Limits;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::serve::support::{client, db_state, make_root, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_key_replays_the_first_answer_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tokens) = make_root(&dir);
    let server = TestServer::start(&root, Limits::default()).await;
    let http = client();
    let send = |url: String, key: &str, text: &str| {
        http.post(url)
            .bearer_auth(&tokens.alpha)
            .header("Idempotency-Key", key)
            .json(&json!({ "text": text }))
            .send()
    };
    let first = send(server.at("/v1/sessions/alpha/messages"), "key-1", "hello")
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first: Value = first.json().await.unwrap();
    let db = server.db("alpha");
    let after_first = db_state(&db);
    server.stop().await;

    let server = TestServer::start(&root, Limits::default()).await;
    let again = send(server.at("/v1/sessions/alpha/messages"), "key-1", "hello")
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: Value = again.json().await.unwrap();
    assert_eq!(again, first);
    assert_eq!(db_state(&db), after_first, "a replay wrote");

    let other = send(server.at("/v1/sessions/alpha/messages"), "key-1", "another")
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let other: Value = other.json().await.unwrap();
    assert_eq!(other["error"]["code"], "idempotency_key_reused");
    assert_eq!(db_state(&db), after_first);

    // Racing repeats: exactly one inserts, the others replay it.
    let racers: Vec<_> = (0..8)
        .map(|_| send(server.at("/v1/sessions/alpha/messages"), "key-2", "raced"))
        .collect();
    let answers = futures::future::join_all(racers).await;
    let mut created = 0;
    let mut ids = Vec::new();
    for answer in answers {
        let answer = answer.unwrap();
        if answer.status() == StatusCode::CREATED {
            created += 1;
        } else {
            assert_eq!(answer.status(), StatusCode::OK);
        }
        let body: Value = answer.json().await.unwrap();
        ids.push(body["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(created, 1);
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(db.max_seq().unwrap(), after_first.0 + 2);
    server.stop().await;
}
