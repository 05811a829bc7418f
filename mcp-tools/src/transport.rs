//! The stdio transport: newline-delimited JSON-RPC 2.0, with a gate in front of rmcp.
//!
//! Why not rmcp's own `(stdin, stdout)` transport: every request must get an answer at once,
//! including ones the server does not serve. Claude Code probes `server/discover` before
//! `initialize` and waits about 3 s on a server that does not answer
//! (docs/contract/tools.md#protocol-rules); rmcp would answer that probe with an error that depends
//! on the probe's `_meta`, would answer a request whose params do not fit its types with an id-less
//! error (leaving the client waiting), and stops serving if a notification arrives before
//! `initialize`. So each line is looked at here first:
//!
//! - not JSON → JSON-RPC `-32700` (id null); not an object → `-32600`;
//! - a request for a method this server does not serve (anything but `initialize` and `ping`
//!   before `initialize`; anything but those and `tools/list`, `tools/call` after it) →
//!   `-32601` with the request's id, at once;
//! - a request whose params do not fit → `-32602` with its id;
//! - a notification before `initialize` → dropped;
//! - everything else goes to rmcp.
//!
//! The server therefore speaks the `initialize` lifecycle (protocol versions up to
//! 2025-11-25), which is what Claude Code, Codex and OpenCode fall back to or use.
//! At most [`MAX_IN_FLIGHT`] requests are with rmcp at a time: beyond that, stdin is not read
//! until one is answered (or cancelled), so a client that pipelines thousands of calls meets
//! the pipe's backpressure instead of making the server hold thousands of tasks (its memory
//! would stay grown after the burst).
//! Reads are cancellation-safe (rmcp polls `receive` inside a `select!`): a partial line stays
//! buffered for the next call. Direct error replies are written by a spawned task, so a
//! cancelled `receive` can never leave half a line on stdout.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;

use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, Notify};

/// Longest accepted line (a 10 MB text with JSON escapes fits).
pub const MAX_LINE_BYTES: usize = 32 * 1024 * 1024;

/// The most requests handed to rmcp and not answered yet; generous, since a request may wait
/// long (`ask_user_question`), yet small enough to bound what a burst costs.
pub const MAX_IN_FLIGHT: usize = 64;

/// Methods served after `initialize`.
const SERVED: [&str; 4] = ["initialize", "ping", "tools/list", "tools/call"];
/// Methods served before `initialize`.
const SERVED_BEFORE_INIT: [&str; 2] = ["initialize", "ping"];

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

type SharedWriter<W> = Arc<Mutex<Option<W>>>;

/// Newline-delimited JSON-RPC over a reader and a writer (stdin/stdout), gated as described in
/// the module docs.
pub struct LineTransport<R, W> {
    reader: BufReader<R>,
    line: Vec<u8>,
    discarding: bool,
    writer: SharedWriter<W>,
    initialized: bool,
    /// Ids (their JSON text) of the requests with rmcp and not answered yet.
    in_flight: Arc<std::sync::Mutex<HashSet<String>>>,
    /// Signalled when an id leaves `in_flight`.
    slot_freed: Arc<Notify>,
    /// The most requests in flight at once since `in_flight` was last empty: a burst of
    /// [`crate::memory::BURST_REQUESTS`] or more gives the heap back when it is answered.
    burst: usize,
}

enum Read {
    Line,
    Oversized,
    Eof,
}

impl<R, W> LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    /// A transport reading requests from `reader` and writing responses to `writer`.
    pub fn new(reader: R, writer: W) -> Self {
        Self {
            reader: BufReader::with_capacity(64 * 1024, reader),
            line: Vec::new(),
            discarding: false,
            writer: Arc::new(Mutex::new(Some(writer))),
            initialized: false,
            in_flight: Arc::default(),
            slot_freed: Arc::default(),
            burst: 0,
        }
    }

    fn in_flight(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Tracks a message going to rmcp: a request takes a slot, a cancellation frees one (rmcp
    /// answers no cancelled request).
    fn track(&mut self, method: Option<&str>, id: Option<&Value>, params: Option<&Value>) {
        match (method, id) {
            (Some(_), Some(id)) => {
                let mut in_flight = self.in_flight();
                in_flight.insert(id.to_string());
                let now = in_flight.len();
                drop(in_flight);
                self.burst = self.burst.max(now);
            }
            (Some("notifications/cancelled"), None) => {
                if let Some(request) = params.and_then(|p| p.get("requestId")) {
                    if self.in_flight().remove(&request.to_string()) {
                        self.slot_freed.notify_one();
                    }
                }
            }
            _ => {}
        }
    }

    /// Reads one line into `self.line`, bounded by [`MAX_LINE_BYTES`]. Cancellation-safe.
    async fn read_line(&mut self) -> std::io::Result<Read> {
        loop {
            let (consumed, done) = {
                let available = self.reader.fill_buf().await?;
                if available.is_empty() {
                    return Ok(Read::Eof);
                }
                let newline = available.iter().position(|b| *b == b'\n');
                let take = newline.map_or(available.len(), |i| i + 1);
                if self.discarding {
                    if newline.is_some() {
                        self.discarding = false;
                    }
                    (take, None)
                } else if self.line.len() + take > MAX_LINE_BYTES {
                    self.line.clear();
                    self.discarding = newline.is_none();
                    (take, Some(Read::Oversized))
                } else {
                    self.line.extend_from_slice(&available[..take]);
                    (take, newline.map(|_| Read::Line))
                }
            };
            self.reader.consume(consumed);
            if let Some(done) = done {
                return Ok(done);
            }
        }
    }

    /// Sends a JSON-RPC error without involving rmcp.
    fn reply_error(&self, id: Value, code: i64, message: String) {
        tracing::debug!(%id, code, error = %message, "answering in the transport");
        let reply = json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": { "code": code, "message": message },
        });
        let mut bytes = reply.to_string().into_bytes();
        bytes.push(b'\n');
        let writer = self.writer.clone();
        tokio::spawn(async move {
            if let Err(err) = write_line(&writer, &bytes).await {
                tracing::warn!(%err, "could not write an error reply");
            }
        });
    }

    /// Decides what to do with one line: `Some` goes to rmcp.
    fn gate(&mut self, line: &[u8]) -> Option<ClientJsonRpcMessage> {
        let line = line
            .strip_prefix(b"\xEF\xBB\xBF".as_slice())
            .unwrap_or(line);
        let value: Value = match serde_json::from_slice(line) {
            Ok(value) => value,
            Err(err) => {
                self.reply_error(Value::Null, PARSE_ERROR, format!("Parse error: {err}"));
                return None;
            }
        };
        let Value::Object(object) = &value else {
            self.reply_error(
                Value::Null,
                INVALID_REQUEST,
                "Invalid Request: expected one JSON-RPC object per line".into(),
            );
            return None;
        };
        let method = object
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let id = object.get("id").cloned();
        match (&method, &id) {
            (Some(method), Some(id)) => {
                let served: &[&str] = if self.initialized {
                    &SERVED
                } else {
                    &SERVED_BEFORE_INIT
                };
                if !served.contains(&method.as_str()) {
                    let message = if !self.initialized && SERVED.contains(&method.as_str()) {
                        format!("Method not found: {method} (send initialize first)")
                    } else {
                        format!("Method not found: {method}")
                    };
                    self.reply_error(id.clone(), METHOD_NOT_FOUND, message);
                    return None;
                }
                if method == "tools/call" {
                    if let Err(problem) = check_call_params(object.get("params")) {
                        self.reply_error(
                            id.clone(),
                            INVALID_PARAMS,
                            format!("Invalid params for tools/call: {problem}"),
                        );
                        return None;
                    }
                }
            }
            (Some(method), None) if !self.initialized => {
                tracing::debug!(%method, "dropping a notification sent before initialize");
                return None;
            }
            (None, _) if !self.initialized => {
                tracing::debug!("dropping a response sent before initialize");
                return None;
            }
            _ => {}
        }
        let params = object.get("params").cloned();
        match serde_json::from_value::<ClientJsonRpcMessage>(value) {
            Ok(message) => {
                self.track(method.as_deref(), id.as_ref(), params.as_ref());
                if method.as_deref() == Some("initialize") {
                    self.initialized = true;
                }
                Some(message)
            }
            Err(err) => {
                match (method, id) {
                    (Some(method), Some(id)) => self.reply_error(
                        id,
                        INVALID_PARAMS,
                        format!("Invalid params for {method}: {err}"),
                    ),
                    _ => tracing::debug!(%err, "dropping a message that does not fit JSON-RPC"),
                }
                None
            }
        }
    }
}

/// `tools/call` params must name the tool and carry the arguments as an object (rmcp would
/// otherwise take a malformed call for an unknown method).
fn check_call_params(params: Option<&Value>) -> Result<(), &'static str> {
    let Some(Value::Object(params)) = params else {
        return Err("params must be an object with `name` and `arguments`");
    };
    match params.get("name") {
        Some(Value::String(name)) if !name.is_empty() => {}
        _ => return Err("`name` (the tool to call) is missing or not a string"),
    }
    match params.get("arguments") {
        None | Some(Value::Null | Value::Object(_)) => Ok(()),
        Some(_) => Err("`arguments` must be an object"),
    }
}

async fn write_line<W: AsyncWrite + Unpin>(
    writer: &Mutex<Option<W>>,
    bytes: &[u8],
) -> std::io::Result<()> {
    let mut guard = writer.lock().await;
    let Some(writer) = guard.as_mut() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            "transport closed",
        ));
    };
    writer.write_all(bytes).await?;
    writer.flush().await
}

impl<R, W> Transport<RoleServer> for LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let answered = match &item {
            rmcp::model::JsonRpcMessage::Response(response) => Some(&response.id),
            rmcp::model::JsonRpcMessage::Error(error) => error.id.as_ref(),
            _ => None,
        };
        if let Some(id) = answered.and_then(|id| serde_json::to_value(id).ok()) {
            let mut in_flight = self.in_flight();
            if in_flight.remove(&id.to_string()) {
                self.slot_freed.notify_one();
            }
            let idle = in_flight.is_empty();
            drop(in_flight);
            // The last answer of a burst: its tasks and buffers are freed (the last one's
            // nearly), so their pages go back before the client sees the answer.
            if idle && std::mem::take(&mut self.burst) >= crate::memory::BURST_REQUESTS {
                crate::memory::release_free_heap();
            }
        }
        let writer = self.writer.clone();
        let bytes = serialize(&item);
        async move { write_line(&writer, &bytes?).await }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            // A stored permit or the next answer wakes this; cancelling it loses nothing.
            while self.in_flight().len() >= MAX_IN_FLIGHT {
                self.slot_freed.notified().await;
            }
            match self.read_line().await {
                Ok(Read::Eof) => return None,
                Ok(Read::Oversized) => {
                    tracing::warn!(limit = MAX_LINE_BYTES, "discarding an oversized message");
                    self.reply_error(
                        Value::Null,
                        INVALID_REQUEST,
                        format!("Invalid Request: message longer than {MAX_LINE_BYTES} bytes"),
                    );
                }
                Ok(Read::Line) => {
                    let mut line = std::mem::take(&mut self.line);
                    while matches!(line.last(), Some(b'\n' | b'\r')) {
                        line.pop();
                    }
                    let gated = if line.iter().all(u8::is_ascii_whitespace) {
                        None
                    } else {
                        self.gate(&line)
                    };
                    // Keep the buffer for the next line, unless a huge message grew it.
                    line.clear();
                    if line.capacity() > 1024 * 1024 {
                        line = Vec::new();
                    }
                    self.line = line;
                    if gated.is_some() {
                        return gated;
                    }
                }
                Err(err) => {
                    tracing::error!(%err, "reading stdin failed");
                    return None;
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        let mut guard = self.writer.lock().await;
        if let Some(mut writer) = guard.take() {
            writer.flush().await?;
        }
        Ok(())
    }
}

fn serialize(item: &ServerJsonRpcMessage) -> std::io::Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec(item)?;
    bytes.push(b'\n');
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn call(id: usize) -> String {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "send_message", "arguments": {}}});
        format!("{call}\n")
    }

    #[tokio::test]
    async fn stops_reading_at_max_in_flight_until_one_is_answered() {
        let (mut client, server_in) = tokio::io::duplex(1 << 20);
        let mut transport = LineTransport::new(server_in, tokio::io::sink());
        transport.initialized = true;
        for id in 0..=MAX_IN_FLIGHT {
            client.write_all(call(id).as_bytes()).await.unwrap();
        }
        for _ in 0..MAX_IN_FLIGHT {
            assert!(transport.receive().await.is_some());
        }
        let blocked = tokio::time::timeout(Duration::from_millis(100), transport.receive()).await;
        assert!(
            blocked.is_err(),
            "read past {MAX_IN_FLIGHT} unanswered requests"
        );

        let answer: ServerJsonRpcMessage = serde_json::from_value(
            json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -1, "message": "done"}}),
        )
        .unwrap();
        transport.send(answer).await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(5), transport.receive()).await;
        assert!(matches!(next, Ok(Some(_))), "not read after an answer");
    }

    #[tokio::test]
    async fn a_cancelled_request_frees_its_slot() {
        let (mut client, server_in) = tokio::io::duplex(1 << 20);
        let mut transport = LineTransport::new(server_in, tokio::io::sink());
        transport.initialized = true;
        // One slot short of the cap, a cancellation, then two more requests.
        for id in 0..MAX_IN_FLIGHT - 1 {
            client.write_all(call(id).as_bytes()).await.unwrap();
        }
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 5}});
        client
            .write_all(format!("{cancel}\n").as_bytes())
            .await
            .unwrap();
        client.write_all(call(1000).as_bytes()).await.unwrap();
        client.write_all(call(1001).as_bytes()).await.unwrap();
        for _ in 0..MAX_IN_FLIGHT - 1 {
            assert!(transport.receive().await.is_some());
        }
        // The cancellation, then both requests: the cancelled one's slot makes room.
        let next = tokio::time::timeout(Duration::from_secs(5), async {
            for _ in 0..3 {
                assert!(transport.receive().await.is_some());
            }
        })
        .await;
        assert!(
            next.is_ok(),
            "the request after a cancellation was not read"
        );
    }
}
