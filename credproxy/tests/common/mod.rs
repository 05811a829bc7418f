//! The loopback upstream the proxy tests forward to: it records every request and answers with
//! what the test's responder makes of it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Router;
use tokio::sync::{mpsc, Notify};

/// One request the upstream received.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) method: String,
    pub(crate) path_and_query: String,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// What the upstream saw, and the gate of its held streams.
#[derive(Default)]
pub(crate) struct UpstreamState {
    pub(crate) seen: Mutex<Vec<Seen>>,
    /// A [`held_stream`]'s second chunk waits for this.
    pub(crate) release: Notify,
}

/// Makes the upstream's answer to a request.
pub(crate) type Responder = fn(&Seen, &Arc<UpstreamState>) -> Response;

/// A loopback upstream answering with `respond`; its base URL and state.
pub(crate) async fn upstream(respond: Responder) -> (String, Arc<UpstreamState>) {
    let state = Arc::new(UpstreamState::default());
    let app = Router::new()
        .fallback(record)
        .with_state((Arc::clone(&state), respond));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), state)
}

async fn record(
    State((state, respond)): State<(Arc<UpstreamState>, Responder)>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let seen = Seen {
        method: parts.method.to_string(),
        path_and_query: parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers: parts.headers,
        body,
    };
    state.seen.lock().unwrap().push(seen.clone());
    respond(&seen, &state)
}

/// A streamed body: `first` at once, `second` once `state.release` is notified.
pub(crate) fn held_stream(
    state: &Arc<UpstreamState>,
    first: &'static [u8],
    second: &'static [u8],
) -> Body {
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let state = Arc::clone(state);
    tokio::spawn(async move {
        let _ = tx.send(Ok(Bytes::from_static(first))).await;
        state.release.notified().await;
        let _ = tx.send(Ok(Bytes::from_static(second))).await;
    });
    Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder().build().unwrap()
}

/// Reads a [`held_stream`] through `response`: its first chunk (which must come while the
/// upstream still holds the second: a proxy that buffers never delivers it), then, after
/// releasing the upstream, the rest.
pub(crate) async fn read_held(
    response: reqwest::Response,
    state: &UpstreamState,
) -> (String, String) {
    use futures::StreamExt;
    let limit = std::time::Duration::from_secs(10);
    let mut stream = response.bytes_stream();
    let first = tokio::time::timeout(limit, stream.next())
        .await
        .expect("the first chunk arrives while the upstream is still streaming")
        .unwrap()
        .unwrap();
    state.release.notify_one();
    let mut rest = Vec::new();
    while let Some(chunk) = tokio::time::timeout(limit, stream.next()).await.unwrap() {
        rest.extend_from_slice(&chunk.unwrap());
    }
    (
        String::from_utf8_lossy(&first).into_owned(),
        String::from_utf8_lossy(&rest).into_owned(),
    )
}
