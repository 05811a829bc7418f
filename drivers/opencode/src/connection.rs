//! One running `opencode serve`: the process, its HTTP API (v1 routes, docs/contract/providers.md#opencode) and the
//! `GET /event` SSE stream.
//!
//! Every request has a timeout: very early requests to a starting server have been seen to hang
//! for minutes (measured, see docs/contract/providers.md#opencode), so readiness is polled with short
//! timeouts and later calls give up instead of blocking a turn.

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use procs::reaper::kill_marked;
use procs::{CliCommand, CliProcess};
use provider::driver::text::shortened;

use super::command::SERVER_USER;

/// How long `opencode serve` may take to print its "listening" line and answer the health check
/// (about 1.3 s idle, 3–4 s measured on a busy 2-core VM).
pub(super) const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Timeout of one health probe; a probe that hangs is retried.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
/// Connect timeout of every request (loopback: a slow connect means a dead server).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Timeout of an ordinary API call.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the SSE stream may take to deliver `server.connected`.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(15);
/// Grace between TERM and KILL when stopping the server.
pub(super) const STOP_GRACE: Duration = Duration::from_secs(3);

/// A failed API call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum HttpError {
    /// 404: the session (or request) does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// Any other non-success status.
    #[error("HTTP {status}: {body}")]
    Status {
        /// The status code.
        status: u16,
        /// The response body (truncated).
        body: String,
    },
    /// Connection failure, timeout, or an unreadable response.
    #[error("{0}")]
    Transport(String),
}

/// The answer to a `permission.asked` request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PermissionReply<'a> {
    /// The call runs (this once).
    Once,
    /// The call is refused; the model gets this message.
    Reject(&'a str),
}

/// The running server.
#[derive(Debug)]
pub(super) struct Server {
    process: CliProcess,
    api: Api,
    log_tasks: Vec<JoinHandle<()>>,
}

/// The server's HTTP API: base URL, basic-auth password and client. Cheap to clone, so a side
/// job (the transcript archive) can read from the server while the next query holds it.
#[derive(Debug, Clone)]
pub(super) struct Api {
    base: String,
    password: String,
    client: reqwest::Client,
}

impl Server {
    /// Spawns `command` (an `opencode serve --port 0` invocation whose environment sets
    /// `OPENCODE_SERVER_PASSWORD=password`) and waits until it answers.
    pub(super) async fn start(command: &CliCommand, password: &str) -> Result<Server, String> {
        let started = Instant::now();
        let mut process = CliProcess::spawn(command).map_err(|err| err.to_string())?;
        // stdin stays unused; closing it early is harmless for `serve`.
        process.stdin.take();
        let (url_tx, url_rx) = oneshot::channel();
        let mut log_tasks = Vec::new();
        if let Some(stdout) = process.stdout.take() {
            log_tasks.push(tokio::spawn(read_stdout(stdout, url_tx)));
        }
        if let Some(stderr) = process.stderr.take() {
            log_tasks.push(tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::info!(target: "opencode", "{line}");
                }
            }));
        }
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .no_proxy()
            .build()
            .map_err(|err| format!("cannot build the HTTP client: {err}"))?;
        let mut server = Server {
            process,
            api: Api {
                base: String::new(),
                password: password.to_owned(),
                client,
            },
            log_tasks,
        };
        let url = tokio::select! {
            url = url_rx => url.map_err(|_| "opencode serve closed its output before listening".to_owned()),
            status = server.process.wait() => Err(format!("opencode serve exited at start ({})", describe(status))),
            _ = tokio::time::sleep(STARTUP_TIMEOUT) => Err(format!("opencode serve did not listen within {STARTUP_TIMEOUT:?}")),
        };
        let url = match url {
            Ok(url) => url,
            Err(err) => {
                server.stop().await;
                return Err(err);
            }
        };
        server.api.base = url.trim_end_matches('/').to_owned();
        if let Err(err) = server.wait_healthy(started).await {
            server.stop().await;
            return Err(err);
        }
        tracing::info!(
            url = %server.api.base,
            pid = server.process.pid(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "opencode serve is ready"
        );
        Ok(server)
    }

    /// Polls `GET /global/health` with short timeouts (an early probe may hang; the next one
    /// answers).
    async fn wait_healthy(&mut self, started: Instant) -> Result<(), String> {
        let mut last = String::from("no answer");
        while started.elapsed() < STARTUP_TIMEOUT {
            if let Some(status) = self.process.try_wait() {
                return Err(format!("opencode serve exited at start ({status})"));
            }
            match self
                .api
                .request(reqwest::Method::GET, "/global/health", None, HEALTH_TIMEOUT)
                .await
            {
                Ok(body) if body.get("healthy").and_then(Value::as_bool) == Some(true) => {
                    return Ok(())
                }
                Ok(body) => last = body.to_string(),
                Err(err) => last = err.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "opencode serve did not become healthy within {STARTUP_TIMEOUT:?}: {last}"
        ))
    }

    /// The leader's pid.
    pub(super) fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// True while the server process runs.
    pub(super) fn is_alive(&mut self) -> bool {
        self.process.try_wait().is_none()
    }

    /// Exit status text if the server exited.
    pub(super) fn exit_status(&mut self) -> Option<String> {
        self.process.try_wait().map(|status| status.to_string())
    }

    /// Exit status text once the server exits, waiting at most `limit` (its event stream can
    /// end a moment before the process is reaped).
    pub(super) async fn wait_exit(&mut self, limit: Duration) -> Option<String> {
        tokio::time::timeout(limit, self.process.wait())
            .await
            .ok()
            .flatten()
            .map(|status| status.to_string())
    }

    /// `GET /session/{id}`: `Ok(false)` when the session does not exist.
    pub(super) async fn session_exists(&self, session_id: &str) -> Result<bool, HttpError> {
        // Ids that do not look like session ids make OpenCode answer 500, not 404.
        if !session_id.starts_with("ses") || session_id.contains('/') {
            return Ok(false);
        }
        match self
            .api
            .request(
                reqwest::Method::GET,
                &format!("/session/{session_id}"),
                None,
                REQUEST_TIMEOUT,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(HttpError::NotFound(_)) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// `POST /session`: a new session's id.
    pub(super) async fn create_session(&self) -> Result<String, HttpError> {
        let body = self
            .api
            .request(
                reqwest::Method::POST,
                "/session",
                Some(serde_json::json!({})),
                REQUEST_TIMEOUT,
            )
            .await?;
        body.get("id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| {
                HttpError::Transport(format!("POST /session answered without an id: {body}"))
            })
    }

    /// `POST /session/{id}/prompt_async`: returns once OpenCode accepted the prompt (204).
    pub(super) async fn prompt(&self, session_id: &str, body: Value) -> Result<(), HttpError> {
        self.api
            .request(
                reqwest::Method::POST,
                &format!("/session/{session_id}/prompt_async"),
                Some(body),
                REQUEST_TIMEOUT,
            )
            .await
            .map(|_| ())
    }

    /// `POST /session/{id}/abort`.
    pub(super) async fn abort(&self, session_id: &str) -> Result<(), HttpError> {
        self.api
            .request(
                reqwest::Method::POST,
                &format!("/session/{session_id}/abort"),
                None,
                REQUEST_TIMEOUT,
            )
            .await
            .map(|_| ())
    }

    /// `GET /session/status`: true while the session's run loop is busy or retrying.
    pub(super) async fn is_busy(&self, session_id: &str) -> Result<bool, HttpError> {
        let body = self
            .api
            .request(
                reqwest::Method::GET,
                "/session/status",
                None,
                REQUEST_TIMEOUT,
            )
            .await?;
        Ok(body
            .get(session_id)
            .and_then(|status| status.get("type"))
            .and_then(Value::as_str)
            .is_some_and(|kind| kind != "idle"))
    }

    /// A handle on the HTTP API that outlives a borrow of the server (for the transcript
    /// archive, which runs after its query released the server).
    pub(super) fn api(&self) -> Api {
        self.api.clone()
    }

    /// The last `limit` messages of a session, oldest first (`[{info, parts}]`, see
    /// [`super::events::MessageWithParts`]), as JSON.
    pub(super) async fn messages(
        &self,
        session_id: &str,
        limit: usize,
    ) -> Result<Value, HttpError> {
        self.api
            .request(
                reqwest::Method::GET,
                &format!("/session/{session_id}/message?limit={limit}"),
                None,
                REQUEST_TIMEOUT,
            )
            .await
    }

    /// Answers a permission request ("once") or rejects a question, so a turn never waits for a
    /// person who is not there.
    pub(super) async fn answer(&self, kind: &str, request_id: &str) -> Result<(), HttpError> {
        let (path, body) = if kind == "permission.asked" {
            (
                format!("/permission/{request_id}/reply"),
                Some(serde_json::json!({"reply": "once"})),
            )
        } else {
            (format!("/question/{request_id}/reject"), None)
        };
        self.api
            .request(reqwest::Method::POST, &path, body, REQUEST_TIMEOUT)
            .await
            .map(|_| ())
    }

    /// `POST /permission/{id}/reply`: `once` lets the call run; `reject` with a `message`
    /// refuses it and gives the model the message (OpenCode's loop goes on; a reject without
    /// one would stop the loop).
    pub(super) async fn reply_permission(
        &self,
        request_id: &str,
        reply: PermissionReply<'_>,
    ) -> Result<(), HttpError> {
        let body = match reply {
            PermissionReply::Once => serde_json::json!({"reply": "once"}),
            PermissionReply::Reject(message) => {
                serde_json::json!({"reply": "reject", "message": message})
            }
        };
        self.api
            .request(
                reqwest::Method::POST,
                &format!("/permission/{request_id}/reply"),
                Some(body),
                REQUEST_TIMEOUT,
            )
            .await
            .map(|_| ())
    }

    /// Opens `GET /event` and waits for its `server.connected` event, so nothing posted after
    /// this returns can be missed.
    pub(super) async fn subscribe(&self) -> Result<EventStream, HttpError> {
        let api = &self.api;
        let response = api
            .client
            .get(format!("{}/event", api.base))
            .basic_auth(SERVER_USER, Some(&api.password))
            .header("accept", "text/event-stream")
            .send();
        let response = tokio::time::timeout(SUBSCRIBE_TIMEOUT, response)
            .await
            .map_err(|_| HttpError::Transport("GET /event did not answer".into()))?
            .map_err(|err| HttpError::Transport(format!("GET /event: {err}")))?;
        if !response.status().is_success() {
            return Err(HttpError::Status {
                status: response.status().as_u16(),
                body: String::new(),
            });
        }
        let mut stream = EventStream {
            response,
            buffer: Vec::new(),
        };
        let first = tokio::time::timeout(SUBSCRIBE_TIMEOUT, stream.next())
            .await
            .map_err(|_| HttpError::Transport("no server.connected on /event".into()))?;
        match first {
            Some(Ok(data)) if data.contains("server.connected") => Ok(stream),
            Some(Ok(data)) => {
                tracing::debug!(%data, "first /event item was not server.connected");
                Ok(stream)
            }
            Some(Err(err)) => Err(HttpError::Transport(err)),
            None => Err(HttpError::Transport("/event closed at once".into())),
        }
    }

    /// Stops the server: TERM to its process group, a grace period, KILL to the group; then
    /// kills what OpenCode started in process groups of its own (the agent's shell commands),
    /// found by the per-spawn password every child inherits.
    pub(super) async fn stop(&mut self) {
        let pid = self.process.pid();
        let status = self.process.terminate(STOP_GRACE).await;
        let stragglers = kill_marked(
            &format!("OPENCODE_SERVER_PASSWORD={}", self.api.password),
            true,
        )
        .len();
        for task in self.log_tasks.drain(..) {
            task.abort();
        }
        tracing::info!(pid, status = %describe(status), stragglers, "opencode serve stopped");
    }
}

impl Api {
    /// `GET /session/{id}/message?limit=N`: the last `limit` messages of a session, oldest
    /// first (`[{info, parts}]`; see [`super::history::from_opencode_messages`]), as JSON.
    pub(super) async fn last_messages(
        &self,
        session_id: &str,
        limit: usize,
        timeout: Duration,
    ) -> Result<Value, HttpError> {
        let path = format!(
            "{}?limit={limit}",
            super::history::opencode_messages_path(session_id)
        );
        self.request(reqwest::Method::GET, &path, None, timeout)
            .await
    }

    async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, HttpError> {
        let mut request = self
            .client
            .request(method.clone(), format!("{}{path}", self.base))
            .basic_auth(SERVER_USER, Some(&self.password))
            .timeout(timeout);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|err| {
            HttpError::Transport(format!("{method} {path}: {}", logging::error_chain(&err)))
        })?;
        let status = response.status();
        let text = response.text().await.map_err(|err| {
            HttpError::Transport(format!("{method} {path}: {}", logging::error_chain(&err)))
        })?;
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(HttpError::NotFound(shortened(&text, 500).into_owned()));
        }
        if !status.is_success() {
            return Err(HttpError::Status {
                status: status.as_u16(),
                body: shortened(&text, 500).into_owned(),
            });
        }
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).map_err(|err| {
            HttpError::Transport(format!("{method} {path}: unreadable answer: {err}"))
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // CliProcess kills the group on drop; the agent's detached shells need the marker scan.
        let _ = kill_marked(
            &format!("OPENCODE_SERVER_PASSWORD={}", self.api.password),
            true,
        );
        for task in self.log_tasks.drain(..) {
            task.abort();
        }
    }
}

/// Reads the server's stdout: the first "listening on http://…" line gives the URL.
async fn read_stdout(stdout: tokio::process::ChildStdout, url_tx: oneshot::Sender<String>) {
    let mut url_tx = Some(url_tx);
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::debug!(target: "opencode", "{line}");
        if let Some(url) = listening_url(&line) {
            if let Some(tx) = url_tx.take() {
                let _ = tx.send(url);
            }
        }
    }
}

/// Parses "opencode server listening on http://127.0.0.1:4096".
pub(super) fn listening_url(line: &str) -> Option<String> {
    let start = line.find("listening on ")? + "listening on ".len();
    let url = line[start..].split_whitespace().next()?;
    url.starts_with("http://").then(|| url.to_owned())
}

/// The `GET /event` stream: yields the `data` payload of each SSE event.
pub(super) struct EventStream {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream").finish_non_exhaustive()
    }
}

impl EventStream {
    /// The next event's `data` (one SSE event may span several `data:` lines, joined with a
    /// newline); `None` when the stream ended, `Err` on a transport error.
    pub(super) async fn next(&mut self) -> Option<Result<String, String>> {
        loop {
            if let Some(data) = self.take_event() {
                return Some(Ok(data));
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                Ok(None) => return None,
                Err(err) => return Some(Err(logging::error_chain(&err))),
            }
        }
    }

    /// Removes one complete event from the buffer, if there is one with data.
    fn take_event(&mut self) -> Option<String> {
        loop {
            let (end, skip) = find_event_end(&self.buffer)?;
            let raw: Vec<u8> = self.buffer.drain(..end + skip).take(end).collect();
            let text = String::from_utf8_lossy(&raw);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(|data| data.strip_prefix(' ').unwrap_or(data))
                .collect();
            if !data.is_empty() {
                return Some(data.join("\n"));
            }
        }
    }
}

/// Position and length of the first blank-line separator (`\n\n` or `\r\n\r\n`).
fn find_event_end(buffer: &[u8]) -> Option<(usize, usize)> {
    let lf = buffer.windows(2).position(|w| w == b"\n\n").map(|p| (p, 2));
    let crlf = buffer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| (p, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

fn describe(status: Option<std::process::ExitStatus>) -> String {
    status.map_or_else(|| "unknown status".to_owned(), |status| status.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_listening_line() {
        assert_eq!(
            listening_url("opencode server listening on http://127.0.0.1:46497").as_deref(),
            Some("http://127.0.0.1:46497")
        );
        assert_eq!(
            listening_url("Warning: OPENCODE_SERVER_PASSWORD is not set"),
            None
        );
    }

    #[test]
    fn sse_events_split_on_blank_lines() {
        assert_eq!(find_event_end(b"data: a\n\ndata: b"), Some((7, 2)));
        assert_eq!(find_event_end(b"data: a\r\n\r\n"), Some((7, 4)));
        assert_eq!(find_event_end(b"data: a\n"), None);
    }
}
