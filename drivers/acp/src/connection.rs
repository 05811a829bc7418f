//! One ACP agent process and its JSON-RPC connection over stdio (one message per line).
//!
//! A reader task parses every stdout line, in order: answers to the driver's control requests
//! (`initialize`, `session/new`, `session/load`) go to the waiting call; the answer to
//! `session/prompt` and everything the query must handle (notifications, permission requests,
//! a line that is not JSON-RPC, the end of the stream) are queued as [`Incoming`], so a
//! prompt's answer is never handled before the updates the agent sent ahead of it. Other agent
//! requests (`fs/*`, `terminal/*`: not advertised; extensions) are answered at once with
//! "method not found". A writer task owns stdin; stderr is logged and its last lines kept for
//! error messages. The process runs in its own process group through `procs`, so stopping it
//! stops every process it started.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

use super::protocol::{Message, RequestId, RpcErrorBody, METHOD_NOT_FOUND};
use procs::{CliCommand, CliProcess};
use provider::driver::text::head;

/// How long a control request (`initialize`, `session/new`, `session/load`) may take: an agent
/// starts its MCP servers in `session/new`.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Grace between TERM and KILL when stopping the process group.
pub(crate) const TERMINATE_GRACE: Duration = Duration::from_secs(3);

/// The longest line the driver reads (a base64 image echoed back is the largest thing); a
/// longer one is a malformed line.
const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

/// Stderr lines kept for error messages.
const STDERR_KEPT: usize = 8;

/// Something the agent said that a query must handle.
#[derive(Debug, Clone)]
pub(crate) enum Incoming {
    /// A notification (`session/update`).
    Notification { method: String, params: Value },
    /// A request waiting for the query's answer (`session/request_permission`).
    Request {
        id: RequestId,
        method: String,
        params: Value,
    },
    /// The answer to a request sent with [`Agent::send`] (`session/prompt`).
    Answer {
        id: RequestId,
        result: Result<Value, RpcErrorBody>,
    },
    /// A line that is not JSON-RPC (cut to 300 bytes).
    Malformed(String),
    /// stdout closed: the process is gone.
    Exited,
}

/// Why a control request did not succeed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RpcError {
    /// The agent answered with a JSON-RPC error.
    Server(RpcErrorBody),
    /// The connection closed (the process exited).
    Closed,
    /// No answer within [`REQUEST_TIMEOUT`].
    Timeout,
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcError::Server(body) => write!(f, "{} (code {})", body.describe(), body.code),
            RpcError::Closed => f.write_str("the agent process exited"),
            RpcError::Timeout => write!(
                f,
                "the agent did not answer within {}s",
                REQUEST_TIMEOUT.as_secs()
            ),
        }
    }
}

/// Where an answer goes.
#[derive(Debug)]
enum Waiter {
    Call(oneshot::Sender<Result<Value, RpcError>>),
    Queue,
}

type Pending = Arc<Mutex<HashMap<RequestId, Waiter>>>;

/// A running agent.
#[derive(Debug)]
pub(crate) struct Agent {
    process: tokio::sync::Mutex<CliProcess>,
    pid: u32,
    writer: mpsc::UnboundedSender<String>,
    pending: Pending,
    next_id: AtomicI64,
    alive: Arc<AtomicBool>,
    last_output: Arc<Mutex<Instant>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// The queue of what queries handle; a query holds the lock for its whole run, which also
    /// keeps two queries from interleaving on one connection.
    pub(crate) incoming: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Incoming>>>,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Agent {
    /// Spawns the agent (its own process group) with the reader, writer and stderr tasks.
    pub(crate) fn spawn(command: &CliCommand) -> Result<Arc<Self>, procs::SpawnError> {
        let mut process = CliProcess::spawn(command)?;
        let pid = process.pid();
        let (Some(stdin), Some(stdout)) = (process.stdin.take(), process.stdout.take()) else {
            return Err(procs::SpawnError("the agent has no stdin or stdout".into()));
        };
        let stderr_pipe = process.stderr.take();
        tracing::info!(pid, program = %command.program.display(), args = ?command.args, "ACP agent started");

        let (writer, mut lines) = mpsc::unbounded_channel::<String>();
        let (incoming_tx, incoming_rx) = mpsc::unbounded_channel();
        let pending: Pending = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let last_output = Arc::new(Mutex::new(Instant::now()));
        let stderr = Arc::new(Mutex::new(VecDeque::new()));

        tokio::spawn(async move {
            let mut stdin = stdin;
            while let Some(line) = lines.recv().await {
                tracing::trace!(pid, %line, "acp <<");
                let written = async {
                    stdin.write_all(line.as_bytes()).await?;
                    stdin.write_all(b"\n").await?;
                    stdin.flush().await
                };
                if let Err(err) = written.await {
                    tracing::debug!(pid, %err, "ACP agent stdin closed");
                    break;
                }
            }
        });

        if let Some(pipe) = stderr_pipe {
            let (last_output, stderr) = (last_output.clone(), stderr.clone());
            tokio::spawn(async move {
                let mut lines = BufReader::new(pipe).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    *lock(&last_output) = Instant::now();
                    tracing::debug!(pid, "agent stderr: {line}");
                    let mut kept = lock(&stderr);
                    if kept.len() == STDERR_KEPT {
                        kept.pop_front();
                    }
                    kept.push_back(head(&line, 300).to_owned());
                }
            });
        }

        {
            let (writer, pending, alive, last_output) = (
                writer.clone(),
                pending.clone(),
                alive.clone(),
                last_output.clone(),
            );
            tokio::spawn(async move {
                let mut reader = BufReader::new(stdout);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match read_line(&mut reader, &mut buf).await {
                        Ok(0) => break,
                        Ok(_) => {
                            *lock(&last_output) = Instant::now();
                            let line = String::from_utf8_lossy(&buf);
                            let line = line.trim_end_matches(['\n', '\r']);
                            if line.trim().is_empty() {
                                continue;
                            }
                            dispatch(pid, line, &writer, &pending, &incoming_tx);
                        }
                        Err(err) => {
                            tracing::warn!(pid, %err, "reading the ACP agent's stdout failed");
                            let _ = incoming_tx.send(Incoming::Malformed(err.to_string()));
                            break;
                        }
                    }
                }
                alive.store(false, Ordering::SeqCst);
                for (_, waiter) in lock(&pending).drain() {
                    if let Waiter::Call(tx) = waiter {
                        let _ = tx.send(Err(RpcError::Closed));
                    }
                }
                let _ = incoming_tx.send(Incoming::Exited);
                tracing::info!(pid, "ACP agent stdout closed");
            });
        }

        Ok(Arc::new(Self {
            process: tokio::sync::Mutex::new(process),
            pid,
            writer,
            pending,
            next_id: AtomicI64::new(1),
            alive,
            last_output,
            stderr,
            incoming: Arc::new(tokio::sync::Mutex::new(incoming_rx)),
        }))
    }

    /// The process id (also its process group id).
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// False once stdout closed.
    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Time since the agent last wrote anything (stdout or stderr).
    pub(crate) fn silence(&self) -> Duration {
        lock(&self.last_output).elapsed()
    }

    /// The agent's last stderr lines, joined (for error messages).
    pub(crate) fn stderr_tail(&self) -> String {
        lock(&self.stderr)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(" | ")
    }

    fn register(&self, waiter: Waiter) -> Option<RequestId> {
        let id = RequestId::Int(self.next_id.fetch_add(1, Ordering::SeqCst));
        lock(&self.pending).insert(id.clone(), waiter);
        if !self.is_alive() {
            lock(&self.pending).remove(&id);
            return None;
        }
        Some(id)
    }

    fn write(&self, message: Value) -> bool {
        self.writer.send(message.to_string()).is_ok()
    }

    /// Sends a control request and waits for its answer (at most [`REQUEST_TIMEOUT`]).
    pub(crate) async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let (tx, rx) = oneshot::channel();
        let id = self.register(Waiter::Call(tx)).ok_or(RpcError::Closed)?;
        let message = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        if !self.write(message) {
            lock(&self.pending).remove(&id);
            return Err(RpcError::Closed);
        }
        match tokio::time::timeout(REQUEST_TIMEOUT, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(RpcError::Closed),
            Err(_) => {
                lock(&self.pending).remove(&id);
                Err(RpcError::Timeout)
            }
        }
    }

    /// Sends a request whose answer comes as [`Incoming::Answer`]; `None` when the agent is gone.
    pub(crate) fn send(&self, method: &str, params: Value) -> Option<RequestId> {
        let id = self.register(Waiter::Queue)?;
        let message = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        if !self.write(message) {
            lock(&self.pending).remove(&id);
            return None;
        }
        Some(id)
    }

    /// Answers an agent request.
    pub(crate) fn respond(&self, id: RequestId, result: Value) {
        tracing::info!(pid = self.pid, ?id, %result, "answered an ACP agent request");
        self.write(json!({ "jsonrpc": "2.0", "id": id, "result": result }));
    }

    /// Sends a notification.
    pub(crate) fn notify(&self, method: &str, params: Value) {
        self.write(json!({ "jsonrpc": "2.0", "method": method, "params": params }));
    }

    /// The exit status, if the leader has exited (waits briefly: stdout closes just before).
    pub(crate) async fn exit_status(&self) -> Option<std::process::ExitStatus> {
        let mut process = self.process.lock().await;
        for _ in 0..10 {
            if let Some(status) = process.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Stops the whole process group (TERM, grace, KILL) and reaps the leader.
    pub(crate) async fn terminate(&self) {
        let mut process = self.process.lock().await;
        let status = process.terminate(TERMINATE_GRACE).await;
        self.alive.store(false, Ordering::SeqCst);
        tracing::info!(pid = self.pid, ?status, "ACP agent stopped");
    }
}

/// Reads one line into `buf`, at most [`MAX_LINE_BYTES`] (an error past it).
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(buf.len());
        }
        let (used, done) = match available.iter().position(|b| *b == b'\n') {
            Some(at) => (at + 1, true),
            None => (available.len(), false),
        };
        buf.extend_from_slice(&available[..used]);
        reader.consume(used);
        if done {
            return Ok(buf.len());
        }
        if buf.len() > MAX_LINE_BYTES {
            return Err(std::io::Error::other(format!(
                "a line longer than {MAX_LINE_BYTES} bytes"
            )));
        }
    }
}

/// Routes one stdout line.
fn dispatch(
    pid: u32,
    line: &str,
    writer: &mpsc::UnboundedSender<String>,
    pending: &Pending,
    incoming: &mpsc::UnboundedSender<Incoming>,
) {
    tracing::trace!(pid, %line, "acp >>");
    let message: Message = match serde_json::from_str(line) {
        Ok(message) => message,
        Err(err) => {
            tracing::warn!(pid, %err, line = %head(line, 300), "the ACP agent wrote a line that is not JSON-RPC");
            let _ = incoming.send(Incoming::Malformed(head(line, 300).to_owned()));
            return;
        }
    };
    match (message.id, message.method) {
        (Some(id), Some(method)) => {
            let params = message.params.unwrap_or(Value::Null);
            if method == "session/request_permission" {
                let _ = incoming.send(Incoming::Request { id, method, params });
                return;
            }
            tracing::info!(pid, %method, "agent request the runner does not serve: method not found");
            let reply = json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": { "code": METHOD_NOT_FOUND, "message": format!("method not found: {method}") },
            });
            let _ = writer.send(reply.to_string());
        }
        (Some(id), None) => {
            let result = match message.error {
                Some(error) => Err(error),
                None => Ok(message.result.unwrap_or(Value::Null)),
            };
            match lock(pending).remove(&id) {
                Some(Waiter::Call(tx)) => {
                    let _ = tx.send(result.map_err(RpcError::Server));
                }
                Some(Waiter::Queue) => {
                    let _ = incoming.send(Incoming::Answer { id, result });
                }
                None => tracing::debug!(pid, ?id, "an answer nobody waits for"),
            }
        }
        (None, Some(method)) => {
            let params = message.params.unwrap_or(Value::Null);
            let _ = incoming.send(Incoming::Notification { method, params });
        }
        (None, None) => {
            tracing::warn!(pid, line = %head(line, 300), "an ACP line without id or method");
            let _ = incoming.send(Incoming::Malformed(head(line, 300).to_owned()));
        }
    }
}
