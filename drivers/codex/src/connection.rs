//! One `codex app-server` process and its JSON-RPC connection over stdio.
//!
//! A reader task parses every stdout line: responses go to the waiting request, server requests
//! are answered at once by policy ([`answer_server_request`]), except, under a tool policy, the
//! approval requests ([`GATED_METHODS`]), which the query task answers; notifications are queued
//! for the query task. A writer
//! task owns stdin. The connection outlives queries; a query takes the notification receiver
//! for its duration.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

use super::approval::GATED_METHODS;
use super::protocol::{answer_server_request, Message, RequestId, RpcErrorBody};
use procs::{CliCommand, CliProcess};
use provider::driver::text::head;
use provider::recording::Recording;
use provider::ProviderError;

/// How long a control request (`initialize`, `thread/*`, `turn/*`) may take.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Grace between TERM and KILL when stopping the process group.
pub(super) const TERMINATE_GRACE: Duration = Duration::from_secs(3);

/// Something app-server said that a query must handle.
#[derive(Debug, Clone)]
pub(super) enum Incoming {
    /// A notification.
    Notification {
        /// Method.
        method: String,
        /// Params.
        params: Value,
    },
    /// A server request: already answered, or (`pending`) waiting for the query's answer
    /// ([`AppServer::respond`]).
    ServerRequest {
        /// Method.
        method: String,
        /// The request's id and params when it waits for an answer.
        pending: Option<(RequestId, Value)>,
    },
    /// stdout closed: the process is gone.
    Exited,
}

/// Why a request did not succeed.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum RpcError {
    /// App-server answered with a JSON-RPC error.
    Server(RpcErrorBody),
    /// The connection closed (the process exited).
    Closed,
    /// No answer within [`REQUEST_TIMEOUT`].
    Timeout,
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcError::Server(body) => write!(f, "{} (code {})", body.message, body.code),
            RpcError::Closed => f.write_str("the codex app-server process exited"),
            RpcError::Timeout => write!(
                f,
                "codex app-server did not answer within {}s",
                REQUEST_TIMEOUT.as_secs()
            ),
        }
    }
}

type Pending = Arc<Mutex<HashMap<RequestId, oneshot::Sender<Result<Value, RpcError>>>>>;

/// A JSON-lines record of everything said on a connection (and the runner's controls), for
/// debugging and for capturing test fixtures: `{"in": <server line>}`, `{"out": <client line>}`,
/// `{"control": ...}`, `{"exit": true}`.
#[derive(Debug, Clone)]
pub(super) struct Transcript(Arc<(Mutex<std::fs::File>, Recording)>);

impl Transcript {
    /// Appends to the recording's file.
    pub(super) fn open(recording: Recording) -> std::io::Result<Self> {
        let file = fsguard::open_with(recording.path(), fsguard::Access::Append)?;
        Ok(Self(Arc::new((Mutex::new(file), recording))))
    }

    /// Writes one record.
    pub(super) fn record(&self, entry: Value) {
        use std::io::Write;
        let (file, recording) = &*self.0;
        let line = recording.scrub(entry.to_string());
        let mut file = lock(file);
        if let Err(err) = writeln!(file, "{line}") {
            tracing::debug!(%err, "codex transcript write failed");
        }
    }

    fn line(&self, direction: &str, line: &str) {
        let value = serde_json::from_str(line).unwrap_or_else(|_| Value::String(line.to_owned()));
        self.record(json!({ direction: value }));
    }
}

/// A running app-server.
#[derive(Debug)]
pub(super) struct AppServer {
    process: tokio::sync::Mutex<CliProcess>,
    pid: u32,
    writer: mpsc::UnboundedSender<String>,
    pending: Pending,
    next_id: AtomicI64,
    alive: Arc<AtomicBool>,
    last_output: Arc<Mutex<Instant>>,
    /// The notification queue; a query holds the lock for its whole run, which also keeps two
    /// queries from interleaving on one connection.
    pub incoming: tokio::sync::Mutex<mpsc::UnboundedReceiver<Incoming>>,
    /// Threads loaded in this process, with the developer instructions they carry.
    pub threads: Mutex<HashMap<String, Option<String>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl AppServer {
    /// Spawns the process and performs the `initialize` handshake. With `gated`, approval
    /// requests wait for the query task instead of being accepted.
    pub(super) async fn start(
        command: &CliCommand,
        transcript: Option<Transcript>,
        gated: bool,
    ) -> Result<Arc<Self>, ProviderError> {
        let mut process = CliProcess::spawn(command)?;
        let pid = process.pid();
        let stdin = process
            .stdin
            .take()
            .ok_or_else(|| ProviderError::Spawn("codex app-server: no stdin".into()))?;
        let stdout = process
            .stdout
            .take()
            .ok_or_else(|| ProviderError::Spawn("codex app-server: no stdout".into()))?;
        let stderr = process.stderr.take();
        tracing::info!(pid, program = %command.program.display(), "codex app-server started");

        let (writer, mut lines) = mpsc::unbounded_channel::<String>();
        let (incoming_tx, incoming_rx) = mpsc::unbounded_channel();
        let pending: Pending = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let last_output = Arc::new(Mutex::new(Instant::now()));

        let transcript_out = transcript.clone();
        tokio::spawn(async move {
            let mut stdin = stdin;
            while let Some(line) = lines.recv().await {
                tracing::trace!(pid, %line, "codex <<");
                if let Some(t) = &transcript_out {
                    t.line("out", &line);
                }
                let written = async {
                    stdin.write_all(line.as_bytes()).await?;
                    stdin.write_all(b"\n").await?;
                    stdin.flush().await
                };
                if let Err(err) = written.await {
                    tracing::debug!(pid, %err, "codex app-server stdin closed");
                    break;
                }
            }
        });

        if let Some(stderr) = stderr {
            let last_output = last_output.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    *lock(&last_output) = Instant::now();
                    tracing::debug!(pid, "codex stderr: {line}");
                }
            });
        }

        {
            let writer = writer.clone();
            let pending = pending.clone();
            let alive = alive.clone();
            let last_output = last_output.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(stdout).lines();
                loop {
                    match reader.next_line().await {
                        Ok(Some(line)) => {
                            *lock(&last_output) = Instant::now();
                            if let Some(t) = &transcript {
                                t.line("in", &line);
                            }
                            dispatch(pid, &line, gated, &writer, &pending, &incoming_tx);
                        }
                        Ok(None) => break,
                        Err(err) => {
                            tracing::warn!(pid, %err, "reading codex app-server stdout failed");
                            break;
                        }
                    }
                }
                alive.store(false, Ordering::SeqCst);
                for (_, waiter) in lock(&pending).drain() {
                    let _ = waiter.send(Err(RpcError::Closed));
                }
                if let Some(t) = &transcript {
                    t.record(json!({ "exit": true }));
                }
                let _ = incoming_tx.send(Incoming::Exited);
                tracing::info!(pid, "codex app-server stdout closed");
            });
        }

        let server = Arc::new(Self {
            process: tokio::sync::Mutex::new(process),
            pid,
            writer,
            pending,
            next_id: AtomicI64::new(1),
            alive,
            last_output,
            incoming: tokio::sync::Mutex::new(incoming_rx),
            threads: Mutex::new(HashMap::new()),
        });
        match server
            .request("initialize", super::protocol::initialize_params())
            .await
        {
            Ok(info) => tracing::debug!(pid, %info, "codex app-server initialized"),
            Err(err) => {
                server.terminate().await;
                return Err(ProviderError::Spawn(format!(
                    "codex app-server did not initialize: {err}"
                )));
            }
        }
        server.notify("initialized", None);
        Ok(server)
    }

    /// The process id (also its process group id).
    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    /// False once stdout closed.
    pub(super) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Time since the process last wrote anything (stdout or stderr).
    pub(super) fn silence(&self) -> Duration {
        lock(&self.last_output).elapsed()
    }

    /// Sends a request and waits for its answer (at most [`REQUEST_TIMEOUT`]).
    pub(super) async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = RequestId::Int(self.next_id.fetch_add(1, Ordering::SeqCst));
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id.clone(), tx);
        if !self.is_alive() {
            lock(&self.pending).remove(&id);
            return Err(RpcError::Closed);
        }
        let line = json!({ "id": id, "method": method, "params": params }).to_string();
        if self.writer.send(line).is_err() {
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

    /// Answers a server request that waited for the query ([`Incoming::ServerRequest`]).
    pub(super) fn respond(&self, id: RequestId, result: Value) {
        tracing::info!(pid = self.pid, ?id, %result, "answered codex server request");
        let _ = self
            .writer
            .send(json!({ "id": id, "result": result }).to_string());
    }

    /// Sends a notification.
    pub(super) fn notify(&self, method: &str, params: Option<Value>) {
        let mut message = json!({ "method": method });
        if let Some(params) = params {
            message["params"] = params;
        }
        let _ = self.writer.send(message.to_string());
    }

    /// The exit status, if the leader has exited (waits briefly: stdout closes just before).
    pub(super) async fn exit_status(&self) -> Option<std::process::ExitStatus> {
        let mut process = self.process.lock().await;
        for _ in 0..10 {
            if let Some(status) = process.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Stops the whole process group (TERM, grace, KILL) and reaps the leader. Codex starts each
    /// MCP server in a process group of its own; `CliProcess::terminate` also kills such
    /// descendants (a KILLed Codex would leave them to notice stdin EOF, which may take seconds).
    pub(super) async fn terminate(&self) {
        let mut process = self.process.lock().await;
        let status = process.terminate(TERMINATE_GRACE).await;
        self.alive.store(false, Ordering::SeqCst);
        tracing::info!(pid = self.pid, ?status, "codex app-server stopped");
    }
}

/// Routes one stdout line.
fn dispatch(
    pid: u32,
    line: &str,
    gated: bool,
    writer: &mpsc::UnboundedSender<String>,
    pending: &Pending,
    incoming: &mpsc::UnboundedSender<Incoming>,
) {
    tracing::trace!(pid, %line, "codex >>");
    let message: Message = match serde_json::from_str(line) {
        Ok(message) => message,
        Err(err) => {
            tracing::warn!(pid, %err, line = %head(line, 300), "codex app-server wrote a line that is not JSON-RPC");
            return;
        }
    };
    match (message.id, message.method) {
        (Some(id), Some(method)) => {
            let params = message.params.unwrap_or(Value::Null);
            if gated && GATED_METHODS.contains(&method.as_str()) {
                let pending = Some((id, params));
                let _ = incoming.send(Incoming::ServerRequest { method, pending });
                return;
            }
            // The legacy (v1) approvals carry no canonical call to judge: under a policy they
            // are refused (v2 threads never send them).
            let legacy = matches!(
                method.as_str(),
                "execCommandApproval" | "applyPatchApproval"
            );
            let answer = if gated && legacy {
                Ok(json!({ "decision": "denied" }))
            } else {
                answer_server_request(&method, &params)
            };
            let reply = match answer {
                Ok(result) => {
                    tracing::info!(pid, %method, %result, "answered codex server request");
                    json!({ "id": id, "result": result })
                }
                Err((code, text)) => {
                    tracing::warn!(pid, %method, "refused codex server request");
                    json!({ "id": id, "error": { "code": code, "message": text } })
                }
            };
            let _ = writer.send(reply.to_string());
            let _ = incoming.send(Incoming::ServerRequest {
                method,
                pending: None,
            });
        }
        (Some(id), None) => {
            let result = match message.error {
                Some(error) => Err(RpcError::Server(error)),
                None => Ok(message.result.unwrap_or(Value::Null)),
            };
            match lock(pending).remove(&id) {
                Some(waiter) => {
                    let _ = waiter.send(result);
                }
                None => tracing::debug!(pid, ?id, "codex response nobody waits for"),
            }
        }
        (None, Some(method)) => {
            let params = message.params.unwrap_or(Value::Null);
            let _ = incoming.send(Incoming::Notification { method, params });
        }
        (None, None) => {
            tracing::warn!(pid, line = %head(line, 300), "codex line without id or method")
        }
    }
}
