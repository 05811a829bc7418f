//! The proxy against a loopback upstream that records what it receives: the token is checked
//! and stripped, the real key reaches the upstream, SSE streams through without buffering, and
//! an unreachable gateway is a 502 naming the endpoint.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use common::{client, held_stream, upstream as recording_upstream, Seen, UpstreamState};
use credproxy::{Api, CredProxy, Upstream};

const REAL_KEY: &str = "sk-real-upstream-key";

/// A loopback upstream: records every request; answers with an SSE stream whose first event goes
/// out at once and whose second waits for `release`.
async fn upstream() -> (String, Arc<UpstreamState>) {
    recording_upstream(sse_answer).await
}

fn sse_answer(_: &Seen, state: &Arc<UpstreamState>) -> Response {
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("x-upstream", "yes")
        .body(held_stream(
            state,
            b"event: first\ndata: {\"n\":1}\n\n",
            b"event: second\ndata: {\"n\":2}\n\n",
        ))
        .unwrap()
}

/// A proxy with the Anthropic route to `base`, holding the real key.
async fn anthropic_proxy(base: &str) -> CredProxy {
    CredProxy::start(vec![Upstream::new(Api::Anthropic, Some(base), REAL_KEY)])
        .await
        .unwrap()
}

async fn json_of(response: reqwest::Response) -> serde_json::Value {
    serde_json::from_str(&response.text().await.unwrap()).unwrap()
}

#[tokio::test]
async fn missing_or_wrong_token_is_401_and_nothing_is_forwarded() {
    let (base, state) = upstream().await;
    let proxy = anthropic_proxy(&base).await;
    let url = format!("{}/v1/messages", proxy.base_url(Api::Anthropic));

    let none = client().post(&url).body("{}").send().await.unwrap();
    assert_eq!(none.status(), 401);
    let body = json_of(none).await;
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "authentication_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("no session token"), "{message}");

    let wrong = client()
        .post(&url)
        .header("x-api-key", format!("{}0", &proxy.token()[1..]))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let message = json_of(wrong).await["error"]["message"].to_string();
    assert!(message.contains("wrong session token"), "{message}");

    // The real key is no token either.
    let key = client()
        .post(&url)
        .header("authorization", format!("Bearer {REAL_KEY}"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(key.status(), 401);
    assert!(state.seen.lock().unwrap().is_empty(), "nothing forwarded");
}

#[tokio::test]
async fn anthropic_headers_are_rewritten_and_the_real_key_reaches_the_upstream() {
    let (base, state) = upstream().await;
    let proxy = anthropic_proxy(&base).await;
    state.release.notify_one();
    let response = client()
        .post(format!(
            "{}/v1/messages?beta=true",
            proxy.base_url(Api::Anthropic)
        ))
        .header("x-api-key", proxy.token())
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "claude-code-20250219")
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .header("user-agent", "claude-cli/2.1.330 (external, sdk-cli)")
        .header("x-stainless-retry-count", "0")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "per-connection")
        .body(r#"{"model":"m","stream":true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-upstream"], "yes");
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let text = response.text().await.unwrap();
    assert!(text.contains("event: first") && text.contains("event: second"));

    let seen = state.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path_and_query, "/v1/messages?beta=true");
    assert_eq!(&request.body[..], br#"{"model":"m","stream":true}"#);
    let h = &request.headers;
    assert_eq!(h["x-api-key"], REAL_KEY);
    assert!(h.get("authorization").is_none());
    assert_eq!(h["anthropic-version"], "2023-06-01");
    assert_eq!(h["anthropic-beta"], "claude-code-20250219");
    assert_eq!(h["content-type"], "application/json");
    assert_eq!(h["accept"], "text/event-stream");
    assert_eq!(h["user-agent"], "claude-cli/2.1.330 (external, sdk-cli)");
    assert_eq!(h["x-stainless-retry-count"], "0");
    assert!(
        h.get("x-hop").is_none(),
        "a header named by Connection is hop-by-hop"
    );
    for (name, value) in h {
        let value = value.to_str().unwrap_or_default();
        assert!(
            !value.contains(proxy.token()),
            "the token left the proxy in {name}"
        );
    }
}

#[tokio::test]
async fn openai_routes_get_the_real_key_as_bearer() {
    let (base, state) = upstream().await;
    let proxy = CredProxy::start(vec![Upstream::new(
        Api::OpenAi,
        Some(&format!("{base}/v1/")),
        REAL_KEY,
    )])
    .await
    .unwrap();
    for path in ["/responses", "/chat/completions"] {
        state.release.notify_one();
        let response = client()
            .post(format!("{}{path}", proxy.base_url(Api::OpenAi)))
            .bearer_auth(proxy.token())
            .header("openai-beta", "responses=v1")
            .header("x-stainless-os", "Linux")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        response.text().await.unwrap();
    }
    let seen = state.seen.lock().unwrap().clone();
    let paths: Vec<&str> = seen.iter().map(|s| s.path_and_query.as_str()).collect();
    assert_eq!(paths, ["/v1/responses", "/v1/chat/completions"]);
    for request in &seen {
        assert_eq!(
            request.headers["authorization"],
            format!("Bearer {REAL_KEY}")
        );
        assert!(request.headers.get("x-api-key").is_none());
        assert_eq!(request.headers["openai-beta"], "responses=v1");
        assert_eq!(request.headers["x-stainless-os"], "Linux");
    }
    // A route without an upstream, and a path outside the model endpoints, are refused.
    let anthropic = client()
        .post(format!("{}/v1/messages", proxy.base_url(Api::Anthropic)))
        .bearer_auth(proxy.token())
        .send()
        .await
        .unwrap();
    assert_eq!(anthropic.status(), 404);
    let files = client()
        .get(format!("{}/files", proxy.base_url(Api::OpenAi)))
        .bearer_auth(proxy.token())
        .send()
        .await
        .unwrap();
    assert_eq!(files.status(), 403);
    let message = json_of(files).await["error"]["message"].to_string();
    assert!(message.contains("/files is not forwarded"), "{message}");
    assert_eq!(
        state.seen.lock().unwrap().len(),
        2,
        "refusals are not forwarded"
    );
}

#[tokio::test]
async fn sse_chunks_arrive_before_the_upstream_finishes() {
    let (base, state) = upstream().await;
    let proxy = anthropic_proxy(&base).await;
    let sent = client()
        .post(format!("{}/v1/messages", proxy.base_url(Api::Anthropic)))
        .header("x-api-key", proxy.token())
        .body("{}")
        .send();
    let response = tokio::time::timeout(Duration::from_secs(10), sent)
        .await
        .expect("the response starts while the upstream is still streaming")
        .unwrap();
    assert_eq!(response.status(), 200);
    let (first, rest) = common::read_held(response, &state).await;
    assert!(first.contains("event: first"), "{first:?}");
    assert!(!first.contains("event: second"));
    assert!(rest.contains("event: second"), "{rest:?}");
}

#[tokio::test]
async fn unreachable_gateway_is_a_502_naming_the_endpoint() {
    // A port nobody listens on: bind, note it, close.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let base = format!("http://127.0.0.1:{port}/v1");
    let proxy = CredProxy::start(vec![Upstream::new(Api::OpenAi, Some(&base), REAL_KEY)])
        .await
        .unwrap();
    let response = client()
        .post(format!("{}/responses?x=1", proxy.base_url(Api::OpenAi)))
        .bearer_auth(proxy.token())
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    let message = json_of(response).await["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains(&format!("{base}/responses")),
        "names the endpoint: {message}"
    );
    assert!(
        message.to_lowercase().contains("refused"),
        "names the cause: {message}"
    );
    assert!(!message.contains(REAL_KEY));
}

#[tokio::test]
async fn the_token_is_worthless_in_another_run_and_after_the_proxy_stops() {
    let (base, state) = upstream().await;
    let first = anthropic_proxy(&base).await;
    let second = anthropic_proxy(&base).await;
    assert_ne!(first.token(), second.token());
    let other_run = client()
        .post(format!("{}/v1/messages", second.base_url(Api::Anthropic)))
        .header("x-api-key", first.token())
        .send()
        .await
        .unwrap();
    assert_eq!(other_run.status(), 401);

    let url = format!("{}/v1/messages", first.base_url(Api::Anthropic));
    let token = first.token().to_owned();
    drop(first);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = client().post(&url).header("x-api-key", &token).send().await;
    assert!(
        after.is_err() || after.is_ok_and(|r| r.status() == 401),
        "a stopped proxy forwards nothing"
    );
    assert!(state.seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_base_url_that_is_no_url_fails_at_start() {
    let err = CredProxy::start(vec![Upstream::new(
        Api::OpenAi,
        Some("api.openai.com/v1"),
        REAL_KEY,
    )])
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("openai base URL"), "{text}");
    assert!(!text.contains(REAL_KEY));
}

#[tokio::test]
async fn a_bearer_client_on_the_anthropic_route_gets_the_key_as_bearer() {
    let (base, state) = upstream().await;
    let proxy = anthropic_proxy(&base).await;
    state.release.notify_one();
    let response = client()
        .post(format!("{}/v1/messages", proxy.base_url(Api::Anthropic)))
        .bearer_auth(proxy.token())
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap();
    let seen = state.seen.lock().unwrap().clone();
    assert_eq!(
        seen[0].headers["authorization"],
        format!("Bearer {REAL_KEY}")
    );
    assert!(seen[0].headers.get("x-api-key").is_none());
}

/// A loopback upstream on the OpenAI route that reports each request body's first chunk as it
/// arrives (before reading the rest) and its `content-length` header, then answers with how many
/// body bytes it got in all.
async fn chunk_reporting_upstream() -> (
    String,
    tokio::sync::mpsc::UnboundedReceiver<(usize, Option<String>)>,
) {
    use futures::StreamExt;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let tx = tx.clone();
        async move {
            let length = request
                .headers()
                .get("content-length")
                .map(|v| v.to_str().unwrap().to_owned());
            let mut body = request.into_body().into_data_stream();
            let mut total = 0;
            if let Some(Ok(first)) = body.next().await {
                total += first.len();
                let _ = tx.send((first.len(), length));
            }
            while let Some(Ok(chunk)) = body.next().await {
                total += chunk.len();
            }
            total.to_string()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1"), rx)
}

/// A request body fed by the test: what is sent on the returned channel, then the end.
fn fed_body() -> (
    tokio::sync::mpsc::Sender<Result<Vec<u8>, std::io::Error>>,
    reqwest::Body,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (tx, reqwest::Body::wrap_stream(stream))
}

/// The request body goes up as it arrives: the gateway has its first part while the CLI still
/// holds the rest (a proxy that read whole bodies would hold the whole conversation in memory
/// with every request), and a body of known length keeps its `content-length`.
#[tokio::test]
async fn request_bodies_stream_up_and_keep_their_length() {
    let (base, mut firsts) = chunk_reporting_upstream().await;
    let proxy = CredProxy::start(vec![Upstream::new(Api::OpenAi, Some(&base), REAL_KEY)])
        .await
        .unwrap();
    let url = format!("{}/responses", proxy.base_url(Api::OpenAi));
    let (feed, body) = fed_body();
    let sent = tokio::spawn(
        client()
            .post(&url)
            .bearer_auth(proxy.token())
            .body(body)
            .send(),
    );
    feed.send(Ok(b"{\"input\":[".to_vec())).await.unwrap();
    let (first, length) = tokio::time::timeout(Duration::from_secs(10), firsts.recv())
        .await
        .expect("the gateway gets the first part while the client still holds the rest")
        .unwrap();
    assert_eq!(first, 10);
    assert_eq!(length, None, "a streamed upload stays chunked");
    feed.send(Ok(vec![b' '; 300_000])).await.unwrap();
    feed.send(Ok(b"]}".to_vec())).await.unwrap();
    drop(feed);
    let response = sent.await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "300012");

    let response = client()
        .post(&url)
        .bearer_auth(proxy.token())
        .body(vec![b'x'; 3 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), (3 << 20).to_string());
    let (_, length) = firsts.recv().await.unwrap();
    assert_eq!(length.as_deref(), Some("3145728"));
}

/// A body over the limit, streamed (no length to refuse up front), is a 413 naming the limit.
#[tokio::test]
async fn a_request_body_over_the_limit_is_a_413() {
    let (base, _firsts) = chunk_reporting_upstream().await;
    let proxy = CredProxy::start(vec![Upstream::new(Api::OpenAi, Some(&base), REAL_KEY)])
        .await
        .unwrap();
    let (feed, body) = fed_body();
    let sent = tokio::spawn(
        client()
            .post(format!("{}/responses", proxy.base_url(Api::OpenAi)))
            .bearer_auth(proxy.token())
            .body(body)
            .send(),
    );
    let chunk = vec![b' '; 1 << 20];
    for _ in 0..=credproxy::MAX_REQUEST_BYTES >> 20 {
        if feed.send(Ok(chunk.clone())).await.is_err() {
            break;
        }
    }
    drop(feed);
    let response = sent.await.unwrap().unwrap();
    assert_eq!(response.status(), 413);
    let message = json_of(response).await["error"]["message"].to_string();
    assert!(message.contains("over the limit"), "{message}");
}

/// The Gemini route (Gemini CLI): the token comes as `x-goog-api-key` and the real key leaves
/// the same way; only the model endpoints are forwarded.
#[tokio::test]
async fn the_gemini_route_swaps_the_goog_api_key() {
    let (base, state) = upstream().await;
    let proxy = CredProxy::start(vec![Upstream::new(Api::Gemini, Some(&base), REAL_KEY)])
        .await
        .unwrap();
    state.release.notify_one();
    let response = client()
        .post(format!(
            "{}/v1beta/models/gemini-test:streamGenerateContent?alt=sse",
            proxy.base_url(Api::Gemini)
        ))
        .header("x-goog-api-key", proxy.token())
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap();
    let seen = state.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].path_and_query,
        "/v1beta/models/gemini-test:streamGenerateContent?alt=sse"
    );
    assert_eq!(seen[0].headers["x-goog-api-key"], REAL_KEY);
    assert!(seen[0].headers.get("authorization").is_none());
    // The real key is no token, and other Gemini endpoints (files, tuning) are not forwarded.
    let key = client()
        .post(format!(
            "{}/v1beta/models/m:generateContent",
            proxy.base_url(Api::Gemini)
        ))
        .header("x-goog-api-key", REAL_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(key.status(), 401);
    let files = client()
        .get(format!("{}/v1beta/files", proxy.base_url(Api::Gemini)))
        .header("x-goog-api-key", proxy.token())
        .send()
        .await
        .unwrap();
    assert_eq!(files.status(), 403);
    assert_eq!(
        state.seen.lock().unwrap().len(),
        1,
        "refusals are not forwarded"
    );
}
