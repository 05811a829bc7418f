//! Hostile and unlucky input: each answered with its status and code, the DBs unchanged.

use host::serve::Limits;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::serve::support::{db_state, make_root, TestServer};

/// Sends `head` (request line and headers, without the blank line) and `body` on a fresh
/// connection, exactly as written; returns the status and the JSON body.
pub(crate) async fn raw(server: &TestServer, head: &str, body: &[u8]) -> (u16, Value) {
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    let request = format!(
        "{head}\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    // The server may answer (413) before the whole body is read and close: a failed write is
    // then expected.
    let _ = tcp.write_all(body).await;
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let json = text
        .split_once("\r\n\r\n")
        .and_then(|(_, body)| serde_json::from_str(body).ok())
        .unwrap_or(Value::Null);
    (status, json)
}

/// A case: what it is, the request head, the body, and the status, code and words expected.
type Case<'a> = (&'a str, String, Vec<u8>, u16, &'a str, &'a str);

fn error_code(json: &Value) -> &str {
    json["error"]["code"].as_str().unwrap_or("<none>")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_their_status_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tokens) = make_root(&dir);
    let server = TestServer::start(&root, Limits::default()).await;
    let alpha = server.db("alpha");
    let beta = server.db("beta");
    let before = (db_state(&alpha), db_state(&beta));
    let auth = format!("Authorization: Bearer {}", tokens.admin);
    let json = "Content-Type: application/json";
    let post = |path: &str| format!("POST {path} HTTP/1.1\r\n{auth}\r\n{json}");
    let messages = "/v1/sessions/alpha/messages";

    let cases: Vec<Case<'_>> = vec![
        (
            "malformed JSON",
            post(messages),
            b"{text: hi}".to_vec(),
            400,
            "bad_request",
            "bad JSON body",
        ),
        (
            "truncated JSON",
            post(messages),
            br#"{"text": "hi"#.to_vec(),
            400,
            "bad_request",
            "EOF",
        ),
        (
            "wrong type",
            post(messages),
            br#"{"text": 42}"#.to_vec(),
            400,
            "bad_request",
            "invalid type",
        ),
        (
            "unknown field",
            post(messages),
            br#"{"txet": "hi"}"#.to_vec(),
            400,
            "bad_request",
            "unknown field `txet`",
        ),
        (
            "unknown kind",
            post(messages),
            br#"{"kind": "fax"}"#.to_vec(),
            400,
            "bad_request",
            "unknown variant `fax`",
        ),
        (
            "a field of another kind",
            post(messages),
            br#"{"text": "hi", "prompt": "p"}"#.to_vec(),
            400,
            "bad_request",
            "--prompt does not apply",
        ),
        (
            "not an object",
            post(messages),
            b"[1,2]".to_vec(),
            400,
            "bad_request",
            "bad JSON body",
        ),
        (
            "empty body",
            post(messages),
            Vec::new(),
            400,
            "bad_request",
            "EOF",
        ),
        (
            "not JSON",
            format!("POST {messages} HTTP/1.1\r\n{auth}\r\nContent-Type: text/plain"),
            b"hi".to_vec(),
            415,
            "unsupported_media_type",
            "Content-Type",
        ),
        (
            "no content type",
            format!("POST {messages} HTTP/1.1\r\n{auth}"),
            br#"{"text":"hi"}"#.to_vec(),
            415,
            "unsupported_media_type",
            "Content-Type",
        ),
        (
            "unknown session",
            post("/v1/sessions/nosuch/messages"),
            br#"{"text":"hi"}"#.to_vec(),
            404,
            "not_found",
            "no session",
        ),
        (
            "dot dot",
            post("/v1/sessions/../messages"),
            br#"{"text":"hi"}"#.to_vec(),
            400,
            "bad_request",
            "bad session name",
        ),
        (
            "encoded dot dot",
            post("/v1/sessions/%2e%2e/messages"),
            br#"{"text":"hi"}"#.to_vec(),
            400,
            "bad_request",
            "bad session name",
        ),
        (
            "encoded slash",
            post("/v1/sessions/alpha%2F..%2Fbeta/messages"),
            br#"{"text":"hi"}"#.to_vec(),
            400,
            "bad_request",
            "bad session name",
        ),
        (
            "NUL",
            post("/v1/sessions/alpha%00/messages"),
            br#"{"text":"hi"}"#.to_vec(),
            400,
            "bad_request",
            "bad session name",
        ),
        (
            "300 bytes",
            post(&format!("/v1/sessions/{}/messages", "a".repeat(300))),
            br#"{"text":"hi"}"#.to_vec(),
            400,
            "bad_request",
            "bad session name",
        ),
        (
            "init traversal",
            post("/v1/sessions"),
            br#"{"name": "../evil"}"#.to_vec(),
            400,
            "bad_request",
            "bad session name",
        ),
        (
            "init dot",
            post("/v1/sessions"),
            br#"{"name": "."}"#.to_vec(),
            400,
            "bad_request",
            "bad session name",
        ),
        (
            "bad seq",
            post("/v1/sessions/alpha/messages/x1/delivered"),
            br#"{"status":"delivered"}"#.to_vec(),
            400,
            "bad_request",
            "bad seq",
        ),
        (
            "seq of no out row",
            post("/v1/sessions/alpha/messages/999/delivered"),
            br#"{"status":"delivered"}"#.to_vec(),
            404,
            "not_found",
            "no messages_out row",
        ),
        (
            "bad delivery status",
            post("/v1/sessions/alpha/messages/1/delivered"),
            br#"{"status":"lost"}"#.to_vec(),
            400,
            "bad_request",
            "unknown variant",
        ),
        (
            "answer to no question",
            post("/v1/sessions/alpha/answers"),
            br#"{"questionId":"q9","option":"a"}"#.to_vec(),
            400,
            "bad_request",
            "no question",
        ),
        (
            "sweep zero tries",
            post("/v1/sessions/alpha/sweep"),
            br#"{"maxTries":0}"#.to_vec(),
            400,
            "bad_request",
            "maxTries",
        ),
        (
            "interrupt with a field",
            post("/v1/sessions/alpha/interrupt"),
            br#"{"now":true}"#.to_vec(),
            400,
            "bad_request",
            "unknown field",
        ),
        (
            "bad Idempotency-Key",
            format!("POST {messages} HTTP/1.1\r\n{auth}\r\n{json}\r\nIdempotency-Key: a b"),
            br#"{"text":"hi"}"#.to_vec(),
            400,
            "bad_request",
            "Idempotency-Key",
        ),
        (
            "unknown route",
            format!("GET /v1/nothing HTTP/1.1\r\n{auth}"),
            Vec::new(),
            404,
            "not_found",
            "no route",
        ),
        (
            "wrong method",
            format!("DELETE /v1/sessions/alpha HTTP/1.1\r\n{auth}"),
            Vec::new(),
            405,
            "method_not_allowed",
            "DELETE",
        ),
        (
            "bad query value",
            format!("GET /v1/sessions/alpha/usage?by=week HTTP/1.1\r\n{auth}"),
            Vec::new(),
            400,
            "bad_request",
            "by",
        ),
        (
            "unknown query",
            format!("GET /v1/sessions/alpha/health?stale=1 HTTP/1.1\r\n{auth}"),
            Vec::new(),
            400,
            "bad_request",
            "unknown field",
        ),
        (
            "bad Last-Event-ID",
            format!("GET /v1/sessions/alpha/events HTTP/1.1\r\n{auth}\r\nLast-Event-ID: x"),
            Vec::new(),
            400,
            "bad_request",
            "Last-Event-ID",
        ),
    ];
    for (what, head, body, status, code, words) in cases {
        let (got, json) = raw(&server, &head, &body).await;
        assert_eq!(got, status, "{what}: {json}");
        assert_eq!(error_code(&json), code, "{what}: {json}");
        let message = json["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(words),
            "{what}: {message:?} lacks {words:?}"
        );
        assert!(
            !message.contains(&tokens.admin),
            "{what}: the token in {message:?}"
        );
    }
    // 10 MiB: refused from its Content-Length, and streamed without one (chunked).
    let big = vec![b' '; 10 * 1024 * 1024];
    let (got, json) = raw(&server, &post(messages), &big).await;
    assert_eq!(
        (got, error_code(&json)),
        (413, "payload_too_large"),
        "{json}"
    );
    // Without a Content-Length: chunked, 64 KiB at a time, until the server refuses.
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    let head = format!(
        "{}\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
        post(messages)
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let chunk = format!("10000\r\n{}\r\n", " ".repeat(0x10000));
    for _ in 0..160 {
        if tcp.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let _ = tcp.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
    assert!(!root.join("evil").exists() && !dir.path().join("evil").exists());
    assert_eq!(
        (db_state(&alpha), db_state(&beta)),
        before,
        "a refused request wrote"
    );
    // The server still serves.
    let (got, _) = raw(&server, &post(messages), br#"{"text":"still here"}"#).await;
    assert_eq!(got, 201);
    server.stop().await;
}
