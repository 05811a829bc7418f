//! A typed async client of the session API (docs/contract/api.md): one method per endpoint,
//! answering with the same report types the local functions return (`Sent`, `StatusReport`,
//! …), so a remote host renders them with the same code. `nanoclaw --url` is built on it.
//!
//! Transport: hyper over TCP, rustls or a unix socket, one connection per request
//! (`transport.rs`). Errors are typed by layer ([`ClientError`]); [`ClientError::is_retryable`]
//! says what a retry may cure. The event stream is parsed by [`sse`].

mod error;
pub mod sse;
mod transport;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use error::ClientError;
use sse::{SseEvent, SseParser};
use transport::{Lease, Transport};

use crate::api::{
    AnswerBody, DeliveredBody, DeliveredReport, ErrorBody, HealthQuery, InitBody, SendBody,
    SessionList, StatusEvent, SweepBody, UsageQuery, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED,
    LAST_EVENT_ID,
};
use crate::status::HealthReport;
use crate::{
    AnswerReport, InitReport, InterruptSent, Sent, StatusReport, SweepOutcome, UsageReport,
};

/// The longest answer body read (a `status` or `usage` object is a few KiB).
const MAX_BODY: usize = 16 * 1024 * 1024;

/// How a [`Client`] connects.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The bearer token (required by the server on TCP; not sent when `None`).
    pub token: Option<String>,
    /// A PEM file of extra trusted roots (https), beside the system's.
    pub ca_cert: Option<std::path::PathBuf>,
    /// The longest wait for a whole answer (not for the event stream, which is bounded by
    /// [`ClientOptions::stream_idle`]).
    pub request_timeout: Duration,
    /// An event stream silent this long is taken as dropped (the server sends a keep-alive at
    /// least every 15 s).
    pub stream_idle: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            token: None,
            ca_cert: None,
            request_timeout: Duration::from_secs(60),
            stream_idle: Duration::from_secs(45),
        }
    }
}

/// `GET /v1/health`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerHealth {
    /// True when the server answers and its sessions can be read.
    pub healthy: bool,
}

/// What `send` got back, and whether the server replayed a stored result for the same
/// idempotency key (an earlier attempt had written the row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendOutcome {
    /// The row written (by this request or the first with its key).
    pub sent: Sent,
    /// True when the answer was replayed (`Idempotent-Replayed: true`).
    pub replayed: bool,
}

/// A client of one `nanoclaw serve`.
#[derive(Debug, Clone)]
pub struct Client {
    transport: Transport,
    token: Option<String>,
    request_timeout: Duration,
    stream_idle: Duration,
}

impl Client {
    /// A client of the server at `url` (`http://HOST:PORT`, `https://HOST:PORT` or `unix:PATH`).
    /// Nothing is connected yet.
    pub fn new(url: &str, options: ClientOptions) -> Result<Self, ClientError> {
        let transport = Transport::parse(url, options.ca_cert.as_deref())?;
        Ok(Self {
            transport,
            token: options.token,
            request_timeout: options.request_timeout,
            stream_idle: options.stream_idle,
        })
    }

    /// The URL as given.
    pub fn url(&self) -> &str {
        self.transport.display()
    }

    /// True when the URL is TCP (http or https): the server asks for a token there.
    pub fn is_tcp(&self) -> bool {
        self.transport.is_tcp()
    }

    /// `GET /v1/health` (no token needed).
    pub async fn health(&self) -> Result<ServerHealth, ClientError> {
        self.get("/v1/health", "GET /v1/health").await
    }

    /// `GET /v1/sessions`: the sessions this token may see.
    pub async fn sessions(&self) -> Result<SessionList, ClientError> {
        self.get("/v1/sessions", "GET /v1/sessions").await
    }

    /// `POST /v1/sessions`: `init` (idempotent).
    pub async fn init(&self, body: &InitBody) -> Result<InitReport, ClientError> {
        self.post("/v1/sessions", Some(body), &[], "POST /v1/sessions")
            .await
            .map(|(report, _)| report)
    }

    /// `GET /v1/sessions/{name}`: `status`.
    pub async fn status(&self, session: &str) -> Result<StatusReport, ClientError> {
        let path = session_path(session, "");
        self.get(&path, &format!("GET {path}")).await
    }

    /// `GET /v1/sessions/{name}/health`: the runner's health (unhealthy is an answer, not an
    /// error).
    pub async fn session_health(
        &self,
        session: &str,
        query: &HealthQuery,
    ) -> Result<HealthReport, ClientError> {
        let mut params = Vec::new();
        if let Some(secs) = query.stale_after_secs {
            params.push(("staleAfterSecs", secs.to_string()));
        }
        if let Some(secs) = query.max_turn_silence_secs {
            params.push(("maxTurnSilenceSecs", secs.to_string()));
        }
        let path = session_path(session, "/health") + &query_string(&params);
        self.get(&path, &format!("GET {path}")).await
    }

    /// `POST /v1/sessions/{name}/messages`: `send`. With `idempotency_key`, a repeat of the
    /// request answers the first result and writes nothing (see [`Client::send_retrying`]).
    pub async fn send(
        &self,
        session: &str,
        body: &SendBody,
        idempotency_key: Option<&str>,
    ) -> Result<SendOutcome, ClientError> {
        let path = session_path(session, "/messages");
        let headers: Vec<(&str, &str)> = idempotency_key
            .map(|key| (IDEMPOTENCY_KEY, key))
            .into_iter()
            .collect();
        let (sent, response) = self
            .post(&path, Some(body), &headers, &format!("POST {path}"))
            .await?;
        let replayed = response
            .headers()
            .get(IDEMPOTENT_REPLAYED)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true"));
        Ok(SendOutcome { sent, replayed })
    }

    /// [`Client::send`] with one new idempotency key, retried with backoff on what
    /// [`ClientError::is_retryable`] for up to `retry_for`: a restart of the server in between
    /// neither loses the message nor writes it twice.
    pub async fn send_retrying(
        &self,
        session: &str,
        body: &SendBody,
        retry_for: Duration,
    ) -> Result<SendOutcome, ClientError> {
        let key = uuid::Uuid::new_v4().to_string();
        retrying(retry_for, "send", || self.send(session, body, Some(&key))).await
    }

    /// `GET /v1/sessions/{name}/events`: the event stream after `after` (a seq; `Last-Event-ID`
    /// is sent with it, so a resumed stream starts there).
    pub async fn events(&self, session: &str, after: i64) -> Result<EventStream, ClientError> {
        let path =
            session_path(session, "/events") + &query_string(&[("after", after.to_string())]);
        let what = format!("GET {path}");
        let request = self.request(
            Method::GET,
            &path,
            None,
            &[(LAST_EVENT_ID, &after.to_string())],
        )?;
        // A connection of its own: the stream holds it for as long as it is read.
        let response = self
            .within_timeout(self.transport.send(request), &what)
            .await?;
        let response = self.check(response, &what).await?;
        Ok(EventStream {
            body: response.into_body(),
            parser: SseParser::default(),
            pending: std::collections::VecDeque::new(),
            idle: self.stream_idle,
            what,
            target: self.transport.display().to_owned(),
        })
    }

    /// `POST /v1/sessions/{name}/messages/{seq}/delivered`.
    pub async fn delivered(
        &self,
        session: &str,
        seq: i64,
        body: &DeliveredBody,
    ) -> Result<DeliveredReport, ClientError> {
        let path = session_path(session, &format!("/messages/{seq}/delivered"));
        self.post(&path, Some(body), &[], &format!("POST {path}"))
            .await
            .map(|(report, _)| report)
    }

    /// `POST /v1/sessions/{name}/answers`: `answer`.
    pub async fn answer(
        &self,
        session: &str,
        body: &AnswerBody,
    ) -> Result<AnswerReport, ClientError> {
        let path = session_path(session, "/answers");
        self.post(&path, Some(body), &[], &format!("POST {path}"))
            .await
            .map(|(report, _)| report)
    }

    /// `POST /v1/sessions/{name}/interrupt`.
    pub async fn interrupt(&self, session: &str) -> Result<InterruptSent, ClientError> {
        let path = session_path(session, "/interrupt");
        self.post::<(), _>(&path, None, &[], &format!("POST {path}"))
            .await
            .map(|(report, _)| report)
    }

    /// `GET /v1/sessions/{name}/usage`.
    pub async fn usage(
        &self,
        session: &str,
        query: &UsageQuery,
    ) -> Result<UsageReport, ClientError> {
        let mut params = Vec::new();
        if let Some(by) = &query.by {
            params.push(("by", by.clone()));
        }
        if let Some(since) = &query.since {
            params.push(("since", since.clone()));
        }
        let path = session_path(session, "/usage") + &query_string(&params);
        self.get(&path, &format!("GET {path}")).await
    }

    /// `POST /v1/sessions/{name}/sweep`.
    pub async fn sweep(
        &self,
        session: &str,
        body: &SweepBody,
    ) -> Result<SweepOutcome, ClientError> {
        let path = session_path(session, "/sweep");
        self.post(&path, Some(body), &[], &format!("POST {path}"))
            .await
            .map(|(report, _)| report)
    }

    async fn get<T: DeserializeOwned>(&self, path: &str, what: &str) -> Result<T, ClientError> {
        let request = self.request(Method::GET, path, None, &[])?;
        let (response, lease) = self.exchange(request, what).await?;
        let response = self.check(response, what).await?;
        let bytes = self.read_body(response.into_body(), what).await?;
        lease.release();
        decode(&bytes, what)
    }

    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: Option<&B>,
        headers: &[(&str, &str)],
        what: &str,
    ) -> Result<(T, Response<()>), ClientError> {
        let body = match body {
            Some(body) => serde_json::to_vec(body).map_err(|err| ClientError::Decode {
                what: what.to_owned(),
                reason: format!("encoding the request: {err}"),
            })?,
            None => b"{}".to_vec(),
        };
        let request = self.request(Method::POST, path, Some(body), headers)?;
        let (response, lease) = self.exchange(request, what).await?;
        let response = self.check(response, what).await?;
        let (parts, body) = response.into_parts();
        let bytes = self.read_body(body, what).await?;
        lease.release();
        Ok((decode(&bytes, what)?, Response::from_parts(parts, ())))
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, &str)],
    ) -> Result<Request<Full<Bytes>>, ClientError> {
        let mut builder = Request::builder()
            .method(method)
            .uri(self.transport.path(path))
            .header(HOST, self.transport.authority())
            .header(ACCEPT, "application/json, text/event-stream");
        if let Some(token) = &self.token {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                ClientError::BadUrl {
                    url: self.transport.display().to_owned(),
                    reason: "the token holds characters a header cannot carry".to_owned(),
                }
            })?;
            value.set_sensitive(true);
            builder = builder.header(AUTHORIZATION, value);
        }
        if body.is_some() {
            builder = builder.header(CONTENT_TYPE, "application/json");
        }
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|err| ClientError::BadUrl {
                url: self.transport.display().to_owned(),
                reason: format!("building the request {path}: {err}"),
            })
    }

    /// Sends on a kept-alive connection and waits for the answer's head within the request
    /// timeout; release the lease once the answer's body is read to its end (an error answer
    /// leaves it unreleased: that connection closes).
    async fn exchange(
        &self,
        request: Request<Full<Bytes>>,
        what: &str,
    ) -> Result<(Response<Incoming>, Lease), ClientError> {
        self.within_timeout(self.transport.send_kept(request), what)
            .await
    }

    /// `exchange` within the request timeout.
    async fn within_timeout<T>(
        &self,
        exchange: impl std::future::Future<Output = Result<T, ClientError>>,
        what: &str,
    ) -> Result<T, ClientError> {
        tokio::time::timeout(self.request_timeout, exchange)
            .await
            .map_err(|_| ClientError::Timeout {
                target: self.transport.display().to_owned(),
                what: what.to_owned(),
                after: self.request_timeout,
            })?
    }

    /// A 2xx answer as is; any other status as [`ClientError::Api`] with the API's error.
    async fn check(
        &self,
        response: Response<Incoming>,
        what: &str,
    ) -> Result<Response<Incoming>, ClientError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = response
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let bytes = self
            .read_body(response.into_body(), what)
            .await
            .unwrap_or_default();
        let (code, message) = match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) => (
                serde_json::to_value(body.error.code)
                    .ok()
                    .and_then(|code| code.as_str().map(str::to_owned))
                    .unwrap_or_else(|| format!("http_{}", status.as_u16())),
                body.error.message,
            ),
            Err(_) => (
                format!("http_{}", status.as_u16()),
                String::from_utf8_lossy(&bytes[..bytes.len().min(500)]).into_owned(),
            ),
        };
        Err(ClientError::Api {
            what: what.to_owned(),
            status: status.as_u16(),
            code,
            message,
            retry_after,
        })
    }

    async fn read_body(&self, mut body: Incoming, what: &str) -> Result<Vec<u8>, ClientError> {
        let mut bytes = Vec::new();
        let read = async {
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|source| ClientError::Transport {
                    target: self.transport.display().to_owned(),
                    cause: source,
                })?;
                if let Some(data) = frame.data_ref() {
                    if bytes.len() + data.len() > MAX_BODY {
                        return Err(ClientError::Decode {
                            what: what.to_owned(),
                            reason: format!("an answer above {MAX_BODY} bytes"),
                        });
                    }
                    bytes.extend_from_slice(data);
                }
            }
            Ok(())
        };
        tokio::time::timeout(self.request_timeout, read)
            .await
            .map_err(|_| ClientError::Timeout {
                target: self.transport.display().to_owned(),
                what: what.to_owned(),
                after: self.request_timeout,
            })??;
        Ok(bytes)
    }
}

/// Runs `attempt` until it succeeds, fails for good, or `retry_for` has passed: 100 ms, then
/// doubling up to 2 s between tries (or the server's `Retry-After`, when shorter than what is
/// left).
pub async fn retrying<T, F, Fut>(
    retry_for: Duration,
    what: &str,
    mut attempt: F,
) -> Result<T, ClientError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let deadline = tokio::time::Instant::now() + retry_for;
    let mut backoff = Duration::from_millis(100);
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(err) if err.is_retryable() => {
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    return Err(err);
                }
                let wait = match &err {
                    ClientError::Api {
                        retry_after: Some(after),
                        ..
                    } => *after,
                    _ => backoff,
                }
                .min(deadline - now);
                tracing::warn!(error = %err, retry_in_ms = wait.as_millis() as u64, "{what}: retrying");
                tokio::time::sleep(wait).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
            Err(err) => return Err(err),
        }
    }
}

fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, ClientError> {
    serde_json::from_slice(bytes).map_err(|err| ClientError::Decode {
        what: what.to_owned(),
        reason: err.to_string(),
    })
}

/// `/v1/sessions/{name}{rest}`, the name percent-encoded: whatever it holds, it stays one path
/// segment (the server refuses names outside `[A-Za-z0-9._-]` with `400`).
fn session_path(session: &str, rest: &str) -> String {
    format!("/v1/sessions/{}{rest}", encode(session))
}

fn query_string(params: &[(&str, String)]) -> String {
    if params.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = params
        .iter()
        .map(|(name, value)| format!("{name}={}", encode(value)))
        .collect();
    format!("?{}", pairs.join("&"))
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// One event of the stream.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiEvent {
    /// A `messages_out` row: its seq and its `watch --json` object.
    Message {
        /// The row's seq (the event's `id`).
        seq: i64,
        /// The `watch --json` object.
        row: Value,
    },
    /// The runner's status changed (or the stream started).
    Status(StatusEvent),
    /// Every row that existed when the stream opened has been sent.
    CaughtUp {
        /// The highest seq sent so far (the `after` asked for, when no row was sent).
        last_seq: i64,
    },
    /// An event this client does not know (a newer server): skipped by callers.
    Other(SseEvent),
}

/// An open event stream. Read with [`EventStream::next`]; drop to close.
#[derive(Debug)]
pub struct EventStream {
    body: Incoming,
    parser: SseParser,
    pending: std::collections::VecDeque<SseEvent>,
    idle: Duration,
    what: String,
    target: String,
}

impl EventStream {
    /// The next event; `None` when the server ended the stream. A stream silent for longer
    /// than the idle bound (no event, no keep-alive) is an error: the connection is gone.
    pub async fn next(&mut self) -> Option<Result<ApiEvent, ClientError>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(parse_event(event, &self.what));
            }
            let frame = match tokio::time::timeout(self.idle, self.body.frame()).await {
                Err(_) => {
                    return Some(Err(ClientError::Timeout {
                        target: self.target.clone(),
                        what: format!("{} (no keep-alive)", self.what),
                        after: self.idle,
                    }))
                }
                Ok(None) => return None,
                Ok(Some(Err(source))) => {
                    return Some(Err(ClientError::Transport {
                        target: self.target.clone(),
                        cause: source,
                    }))
                }
                Ok(Some(Ok(frame))) => frame,
            };
            if let Some(data) = frame.data_ref() {
                match self.parser.feed(data) {
                    Ok(events) => self.pending.extend(events),
                    Err(err) => {
                        return Some(Err(ClientError::Decode {
                            what: self.what.clone(),
                            reason: err.to_string(),
                        }))
                    }
                }
            }
        }
    }
}

fn parse_event(event: SseEvent, what: &str) -> Result<ApiEvent, ClientError> {
    let bad = |reason: String| ClientError::Decode {
        what: format!("{what}: a {} event", event.event),
        reason,
    };
    match event.event.as_str() {
        "message" => {
            let row: Value =
                serde_json::from_str(&event.data).map_err(|err| bad(err.to_string()))?;
            let seq = event
                .id
                .as_deref()
                .and_then(|id| id.parse::<i64>().ok())
                .or_else(|| row.get("seq").and_then(Value::as_i64))
                .ok_or_else(|| bad("no seq in its id or data".to_owned()))?;
            Ok(ApiEvent::Message { seq, row })
        }
        "status" => serde_json::from_str(&event.data)
            .map(ApiEvent::Status)
            .map_err(|err| bad(err.to_string())),
        "caught-up" => {
            let data: Value =
                serde_json::from_str(&event.data).map_err(|err| bad(err.to_string()))?;
            let last_seq = data
                .get("lastSeq")
                .and_then(Value::as_i64)
                .ok_or_else(|| bad("no lastSeq".to_owned()))?;
            Ok(ApiEvent::CaughtUp { last_seq })
        }
        _ => Ok(ApiEvent::Other(event)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_and_queries_are_encoded_as_one_segment() {
        assert_eq!(
            session_path("a.b_c-1", "/usage"),
            "/v1/sessions/a.b_c-1/usage"
        );
        assert_eq!(session_path("../x", ""), "/v1/sessions/..%2Fx");
        assert_eq!(
            query_string(&[
                ("since", "2026-01-01T00:00:00+01:00".to_owned()),
                ("by", "day".to_owned())
            ]),
            "?since=2026-01-01T00%3A00%3A00%2B01%3A00&by=day"
        );
    }

    fn api_error(status: u16, retry_after: Option<Duration>) -> ClientError {
        ClientError::Api {
            what: "POST /v1/sessions/main/messages".into(),
            status,
            code: "unavailable".into(),
            message: "the DB is locked".into(),
            retry_after,
        }
    }

    #[tokio::test]
    async fn a_503_is_retried_after_its_retry_after_and_a_404_is_not() {
        let mut tries = 0;
        let started = tokio::time::Instant::now();
        let result = retrying(Duration::from_secs(5), "send", || {
            tries += 1;
            let outcome = if tries < 3 {
                Err(api_error(503, Some(Duration::from_millis(50))))
            } else {
                Ok(tries)
            };
            async move { outcome }
        })
        .await;
        assert_eq!(result.unwrap(), 3);
        assert!(started.elapsed() >= Duration::from_millis(100));

        let mut tries = 0;
        let result: Result<(), _> = retrying(Duration::from_secs(5), "send", || {
            tries += 1;
            async { Err(api_error(404, None)) }
        })
        .await;
        assert_eq!(result.unwrap_err().status(), Some(404));
        assert_eq!(tries, 1, "a 404 is not retried");
    }

    #[tokio::test]
    async fn retries_end_with_the_last_error_once_their_time_is_up() {
        let started = tokio::time::Instant::now();
        let mut tries = 0;
        let result: Result<(), _> = retrying(Duration::from_millis(300), "send", || {
            tries += 1;
            async { Err(api_error(503, None)) }
        })
        .await;
        let took = started.elapsed();
        assert_eq!(result.unwrap_err().status(), Some(503));
        assert!(tries >= 2, "{tries} tries");
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(2),
            "{took:?}"
        );
    }

    #[test]
    fn events_parse_into_their_kinds() {
        let message = parse_event(
            SseEvent {
                event: "message".into(),
                data: r#"{"seq":7,"kind":"chat"}"#.into(),
                id: Some("7".into()),
            },
            "t",
        )
        .unwrap();
        assert!(matches!(message, ApiEvent::Message { seq: 7, .. }));
        let caught_up = parse_event(
            SseEvent {
                event: "caught-up".into(),
                data: r#"{"lastSeq":9}"#.into(),
                id: None,
            },
            "t",
        )
        .unwrap();
        assert_eq!(caught_up, ApiEvent::CaughtUp { last_seq: 9 });
        let broken = parse_event(
            SseEvent {
                event: "message".into(),
                data: "{".into(),
                id: Some("1".into()),
            },
            "t",
        );
        assert!(broken.is_err());
    }
}
