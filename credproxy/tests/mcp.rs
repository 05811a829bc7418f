//! The `/mcp/<name>` routes against a loopback MCP-like upstream that records what it receives:
//! the session token is checked and replaced by the configured headers, the MCP session headers
//! pass both ways, every method is forwarded, the SSE stream arrives event by event, redirects
//! are not followed and no error carries a secret.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use common::{client, held_stream, upstream as recording_upstream, Seen, UpstreamState};
use credproxy::{CredProxy, McpUpstream};

const SECRET: &str = "Bearer remote-secret-0123456789";

/// A loopback upstream: records every request; POST answers JSON with a session id, GET an SSE
/// stream whose second event waits for `release`, `/moved` a redirect.
async fn upstream() -> (String, Arc<UpstreamState>) {
    recording_upstream(mcp_answer).await
}

fn mcp_answer(seen: &Seen, state: &Arc<UpstreamState>) -> Response {
    if seen.path_and_query.starts_with("/moved") {
        return Response::builder()
            .status(307)
            .header("location", "https://elsewhere.example/mcp?k=leak")
            .body(Body::empty())
            .unwrap();
    }
    if seen.method == "GET" {
        return Response::builder()
            .status(200)
            .header("content-type", "text/event-stream")
            .body(held_stream(
                state,
                b"data: {\"n\":1}\n\n",
                b"data: {\"n\":2}\n\n",
            ))
            .unwrap();
    }
    let status = if seen.method == "DELETE" { 204 } else { 200 };
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("mcp-session-id", "session-42")
        .body(Body::from(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#))
        .unwrap()
}

async fn proxy_to(url: String) -> CredProxy {
    CredProxy::start_with(
        Vec::new(),
        vec![McpUpstream {
            name: "remote".into(),
            url,
            headers: vec![
                ("Authorization".into(), SECRET.into()),
                ("X-Tenant".into(), "t-1".into()),
            ],
        }],
    )
    .await
    .unwrap()
}

fn assert_no_token(seen: &Seen, token: &str) {
    for (name, value) in &seen.headers {
        assert!(
            !value.to_str().unwrap_or_default().contains(token),
            "the token left the proxy in {name}"
        );
    }
}

#[tokio::test]
async fn the_token_is_replaced_by_the_configured_headers_and_mcp_headers_pass_both_ways() {
    let (base, state) = upstream().await;
    let proxy = proxy_to(format!("{base}/v1/mcp?tenant=a")).await;
    let url = proxy.mcp_url("remote").unwrap();
    assert_eq!(url, format!("http://{}/mcp/remote", proxy.addr()));
    assert_eq!(proxy.mcp_url("other"), None);
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let response = client()
        .post(format!("{url}?x=1"))
        .bearer_auth(proxy.token())
        .header("mcp-session-id", "session-42")
        .header("mcp-protocol-version", "2025-06-18")
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["mcp-session-id"], "session-42");
    assert!(response.text().await.unwrap().contains("\"result\""));

    let deleted = client()
        .delete(&url)
        .bearer_auth(proxy.token())
        .header("mcp-session-id", "session-42")
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);

    let seen = state.seen.lock().unwrap().clone();
    let methods: Vec<&str> = seen.iter().map(|s| s.method.as_str()).collect();
    assert_eq!(methods, ["POST", "DELETE"]);
    let post = &seen[0];
    assert_eq!(post.path_and_query, "/v1/mcp?tenant=a&x=1");
    assert_eq!(&post.body[..], body.as_bytes());
    let h = &post.headers;
    assert_eq!(h["authorization"], SECRET);
    assert_eq!(h["x-tenant"], "t-1");
    assert_eq!(h["mcp-session-id"], "session-42");
    assert_eq!(h["mcp-protocol-version"], "2025-06-18");
    assert_eq!(h["accept"], "application/json, text/event-stream");
    assert_eq!(h["content-length"], body.len().to_string().as_str());
    assert_eq!(seen[1].headers["authorization"], SECRET);
    assert_eq!(seen[1].headers["mcp-session-id"], "session-42");
    for request in &seen {
        assert_no_token(request, proxy.token());
    }
}

#[tokio::test]
async fn the_sse_stream_arrives_event_by_event() {
    let (base, state) = upstream().await;
    let proxy = proxy_to(format!("{base}/mcp")).await;
    let sent = client()
        .get(proxy.mcp_url("remote").unwrap())
        .bearer_auth(proxy.token())
        .header("accept", "text/event-stream")
        .send();
    let response = tokio::time::timeout(Duration::from_secs(10), sent)
        .await
        .expect("the stream starts while the server still holds it open")
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let (first, rest) = common::read_held(response, &state).await;
    assert!(
        first.contains("\"n\":1") && !first.contains("\"n\":2"),
        "{first}"
    );
    assert!(rest.contains("\"n\":2"), "{rest}");
    assert_eq!(
        state.seen.lock().unwrap()[0].headers["authorization"],
        SECRET
    );
}

#[tokio::test]
async fn wrong_token_or_unknown_server_is_refused_and_nothing_is_forwarded() {
    let (base, state) = upstream().await;
    let proxy = proxy_to(format!("{base}/mcp")).await;
    let url = proxy.mcp_url("remote").unwrap();
    let none = client().post(&url).body("{}").send().await.unwrap();
    assert_eq!(none.status(), 401);
    let wrong = client()
        .post(&url)
        .bearer_auth(format!("{}0", &proxy.token()[1..]))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let body: serde_json::Value = serde_json::from_str(&wrong.text().await.unwrap()).unwrap();
    assert_eq!(body["jsonrpc"], "2.0");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("wrong session token"));
    // The configured secret is no token either.
    let secret = client()
        .post(&url)
        .header("authorization", SECRET)
        .send()
        .await
        .unwrap();
    assert_eq!(secret.status(), 401);
    let unknown = client()
        .post(format!("http://{}/mcp/other", proxy.addr()))
        .bearer_auth(proxy.token())
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let text = unknown.text().await.unwrap();
    assert!(
        text.contains("\\\"other\\\"") && text.contains("remote"),
        "{text}"
    );
    assert!(state.seen.lock().unwrap().is_empty(), "nothing forwarded");
}

/// POSTs `{}` to the proxy's `remote` route with the token; the answer's text, after checking
/// its status.
async fn post_expecting(proxy: &CredProxy, status: u16) -> String {
    let response = client()
        .post(proxy.mcp_url("remote").unwrap())
        .bearer_auth(proxy.token())
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), status);
    response.text().await.unwrap()
}

#[tokio::test]
async fn redirects_are_not_followed_and_errors_hold_no_secret() {
    let (base, state) = upstream().await;
    let proxy = proxy_to(format!("{base}/moved")).await;
    let text = post_expecting(&proxy, 502).await;
    assert!(text.contains("redirects are not followed"), "{text}");
    assert!(text.contains("https://elsewhere.example/mcp"), "{text}");
    assert!(!text.contains("leak") && !text.contains(SECRET), "{text}");
    assert_eq!(state.seen.lock().unwrap().len(), 1, "one request, not two");

    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let proxy = proxy_to(format!(
        "http://user:pw-secret@127.0.0.1:{port}/mcp?k=q-secret"
    ))
    .await;
    let text = post_expecting(&proxy, 502).await;
    assert!(text.contains(&format!("127.0.0.1:{port}/mcp")), "{text}");
    assert!(!text.contains("secret"), "{text}");
}

#[tokio::test]
async fn an_unusable_server_fails_at_start_without_its_values() {
    let err = CredProxy::start_with(
        Vec::new(),
        vec![McpUpstream {
            name: "remote".into(),
            url: "mcp.example/mcp".into(),
            headers: vec![("Authorization".into(), SECRET.into())],
        }],
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("remote MCP server \"remote\""), "{err}");
    assert!(!err.contains(SECRET), "{err}");
}
