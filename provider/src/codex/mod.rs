//! Codex provider: one long-lived `codex app-server` (JSON-RPC over stdio, PROTOCOLS §2.3).
//!
//! * Process: spawned on the first query (or after it died, was killed by the watchdog, or
//!   another session is wanted), kept across queries and turns. One session (thread) per
//!   process: a thread stays loaded with its MCP servers even after `thread/unsubscribe`, so a
//!   new session after `/clear` gets a fresh process. Configuration is entirely `-c` overrides
//!   plus a private `CODEX_HOME` ([`config`]).
//! * Binary: when the resolved `codex` is the npm launcher (`bin/codex.js`), the native binary
//!   it would exec is run directly ([`config::native_binary`]): no node process, no node needed
//!   at run time, and the same signals and process group.
//! * Session: the continuation is the Codex thread id. `thread/start` with the system prompt as
//!   developer instructions, or `thread/resume` (a thread Codex does not know → a fresh thread,
//!   announced with a `Progress` and a new `Init`).
//! * Turns: `turn/start`; text comes from `agentMessage` items; `turn/completed` ends a turn.
//! * Follow-ups: abort-and-restart by default (`turn/interrupt`, then one `turn/start` with every
//!   prompt not yet answered), or native `turn/steer` with `settings.codex_steer`
//!   ([`turn::QueryState`]).
//! * Archiving (issue 5): after a query's stream is closed, the thread is read back with
//!   `thread/read` and its new entries written as Markdown to `<agent dir>/conversations/`
//!   (`archiving.rs`); a side job that never fails or delays a query.
//!
//! The system prompt after a resume: Codex 0.169 keeps the developer instructions recorded when
//! the thread started and ignores new ones on `thread/resume` (and `-c developer_instructions`).
//! The original instructions stay in the thread's history, so they do reach the model after a
//! resume; when the system prompt changed since, the new one is appended to the history as a
//! developer message with `thread/inject_items`. What each thread last received is recorded
//! under `CODEX_HOME/nanoclaw/instructions/`.

mod archiving;
pub mod config;
pub mod protocol;
pub mod rpc;
pub mod turn;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::Value;

use self::protocol::{ThreadResponse, TurnResponse};
use self::rpc::{AppServer, Incoming, RpcError, Transcript};
use self::turn::{Action, QueryState};
use crate::process::resolve_cli;
use crate::{
    AgentProvider, AgentQuery, ErrorClass, ProviderError, ProviderEvent, ProviderSettings,
    QueryHandle, QueryInput,
};

/// The setting that names the Codex binary.
pub const PATH_SETTING: &str = "CODEX_PATH";

/// How long an abort waits for Codex to confirm the interrupted turn before killing the process.
pub const ABORT_DEADLINE: Duration = Duration::from_secs(5);

/// Extra watchdog time while a tool runs: Codex itself is silent during a blocking MCP tool.
const TOOL_WATCHDOG_MARGIN: Duration = Duration::from_secs(30);

/// The Codex provider.
#[derive(Debug, Clone)]
pub struct CodexProvider {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    settings: ProviderSettings,
    /// The binary actually executed (the native one behind the npm launcher when found).
    program: PathBuf,
    /// What the settings named (for error messages).
    configured: PathBuf,
    server: tokio::sync::Mutex<Option<Arc<AppServer>>>,
    transcript: std::sync::Mutex<Option<Transcript>>,
    /// Held by the transcript archive that runs (`archiving.rs`).
    archive: crate::archive_job::ArchiveLock,
}

impl CodexProvider {
    /// A provider for these settings. Fails with [`ProviderError::Spawn`] naming `CODEX_PATH`
    /// when the CLI cannot be found. No process starts before the first query.
    pub fn new(settings: ProviderSettings) -> Result<Self, ProviderError> {
        let configured = resolve_cli(
            "codex",
            settings.cli_path.as_deref(),
            PATH_SETTING,
            Some(&settings.workspace),
        )?;
        let program = config::native_binary(&configured).unwrap_or_else(|| configured.clone());
        tracing::info!(configured = %configured.display(), program = %program.display(), "codex provider ready");
        Ok(Self {
            shared: Arc::new(Shared {
                settings,
                program,
                configured,
                server: tokio::sync::Mutex::new(None),
                transcript: std::sync::Mutex::new(None),
                archive: crate::archive_job::ArchiveLock::default(),
            }),
        })
    }

    /// Records every JSON-RPC line and control of later app-server processes to `path` (JSON
    /// lines; see [`Transcript`]). For debugging and for capturing test fixtures.
    pub fn record_transcript(&self, path: &Path) -> Result<(), ProviderError> {
        let transcript = Transcript::open(path).map_err(|err| {
            ProviderError::Other(format!("cannot open {}: {err}", path.display()))
        })?;
        *rpc_lock(&self.shared.transcript) = Some(transcript);
        Ok(())
    }

    /// The binary that is executed.
    pub fn program(&self) -> &Path {
        &self.shared.program
    }

    /// The pid of the running app-server, if any (tests kill it to simulate a crash).
    pub async fn pid(&self) -> Option<u32> {
        let server = self.shared.server.lock().await;
        server.as_ref().filter(|s| s.is_alive()).map(|s| s.pid())
    }
}

impl AgentProvider for CodexProvider {
    fn name(&self) -> &'static str {
        "codex"
    }

    fn query(&self, input: QueryInput) -> Result<AgentQuery, ProviderError> {
        if !self.shared.program.is_file() {
            return Err(ProviderError::Spawn(format!(
                "the codex CLI at {} is gone; fix {PATH_SETTING} or reinstall the codex CLI",
                self.shared.configured.display()
            )));
        }
        let (query, handle) = AgentQuery::channel();
        tokio::spawn(run_query(self.shared.clone(), input, handle));
        Ok(query)
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let server = self.shared.server.lock().await.take();
            if let Some(server) = server {
                // The last query's archive reads the thread from this process.
                crate::archive_job::wait_idle(&self.shared.archive, "codex").await;
                server.terminate().await;
            }
        })
    }
}

/// Why a query stopped before its turns could run.
struct Failure {
    message: String,
    classification: ErrorClass,
    retryable: bool,
}

impl Failure {
    fn process(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            classification: ErrorClass::Process,
            retryable: true,
        }
    }
}

async fn run_query(shared: Arc<Shared>, input: QueryInput, mut handle: QueryHandle) {
    let mut server = match live_server(&shared).await {
        Ok(server) => server,
        Err(failure) => {
            let _ = handle.events.send(error_event(failure)).await;
            return;
        }
    };
    // One session per process: a thread stays loaded (with its MCP servers) after
    // `thread/unsubscribe` (measured), so another session (after `/clear`) gets a fresh process.
    let other_session = {
        let threads = rpc_lock(&server.threads);
        !threads.is_empty()
            && !input
                .continuation
                .as_ref()
                .is_some_and(|id| threads.contains_key(id))
    };
    if other_session {
        tracing::info!(
            pid = server.pid(),
            "another session: restarting codex app-server"
        );
        // The previous session's archive reads its thread from this process.
        crate::archive_job::wait_idle(&shared.archive, "codex").await;
        server.terminate().await;
        forget_server(&shared, &server).await;
        server = match live_server(&shared).await {
            Ok(server) => server,
            Err(failure) => {
                let _ = handle.events.send(error_event(failure)).await;
                return;
            }
        };
    }
    // One query at a time on the connection; a previous query that is still winding down (an
    // abort waiting for its turn to end) finishes first.
    let mut incoming = server.incoming.lock().await;
    // Notifications left from an earlier query (late thread status, token usage) are stale.
    while let Ok(stale) = incoming.try_recv() {
        if matches!(stale, Incoming::Exited) {
            let _ = handle
                .events
                .send(error_event(Failure::process(
                    "the codex app-server process exited",
                )))
                .await;
            return;
        }
    }
    let thread_id = match open_thread(&shared, &server, &input, &handle).await {
        Ok(id) => id,
        Err(failure) => {
            let _ = handle.events.send(error_event(failure)).await;
            return;
        }
    };
    if handle
        .events
        .send(ProviderEvent::Init {
            session_id: thread_id.clone(),
        })
        .await
        .is_err()
    {
        return;
    }

    let settings = &shared.settings;
    let mut state = QueryState::new(input.prompt, settings.codex_steer);
    let mut actions: std::collections::VecDeque<Action> = state.begin().into();
    let tick = (settings.watchdog / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut control_open = true;
    let mut abort_started: Option<Instant> = None;
    // The watchdog measures silence since the later of Codex's last output and our last
    // request: an app-server idle between queries is not a hung turn.
    let mut last_request = Instant::now();

    loop {
        // Perform everything the state machine asked for, in order.
        while let Some(action) = actions.pop_front() {
            match action {
                Action::Emit(event) => {
                    if handle.events.send(event).await.is_err() {
                        // The runner dropped the query: same as an abort.
                        control_open = false;
                        actions.extend(state.on_control(None, Instant::now()));
                    }
                }
                Action::StartTurn { input } => {
                    last_request = Instant::now();
                    let params = serde_json::json!({ "threadId": thread_id, "input": input });
                    let next = match server.request("turn/start", params).await {
                        Ok(result) => match serde_json::from_value::<TurnResponse>(result) {
                            Ok(response) => state.on_turn_started(response.turn.id, Instant::now()),
                            Err(err) => state.on_request_failed(
                                format!("unexpected turn/start answer: {err}"),
                                ErrorClass::Other,
                                true,
                            ),
                        },
                        Err(err) => request_failed(&mut state, &server, "turn/start", err).await,
                    };
                    actions.extend(next);
                }
                Action::Steer { turn_id, id, input } => {
                    last_request = Instant::now();
                    let params = serde_json::json!({ "threadId": thread_id, "expectedTurnId": turn_id, "input": input });
                    match server.request("turn/steer", params).await {
                        Ok(_) => {}
                        Err(RpcError::Server(body)) => {
                            tracing::info!(id, error = %body.message, "turn/steer refused; the push goes to the next turn");
                            actions.extend(state.on_steer_failed(id));
                        }
                        Err(err) => actions
                            .extend(request_failed(&mut state, &server, "turn/steer", err).await),
                    }
                }
                Action::Interrupt { turn_id } => {
                    let params = serde_json::json!({ "threadId": thread_id, "turnId": turn_id });
                    match server.request("turn/interrupt", params).await {
                        Ok(_) => {}
                        // The turn ended meanwhile; its turn/completed is on the way.
                        Err(RpcError::Server(body)) => {
                            tracing::debug!(error = %body.message, "turn/interrupt refused")
                        }
                        Err(err) => actions.extend(
                            request_failed(&mut state, &server, "turn/interrupt", err).await,
                        ),
                    }
                }
                Action::Close => {}
            }
        }
        if state.is_closed() {
            // The archive lock is taken before the stream closes, so a shutdown or another
            // session the runner starts next waits for this query's archive.
            let guard = crate::archive_job::reserve(&shared.archive);
            drop(incoming);
            drop(handle);
            archiving::archive_thread(&shared.archive, guard, settings, &server, &thread_id).await;
            return;
        }
        if state.aborting() && abort_started.is_none() {
            abort_started = Some(Instant::now());
        }

        tokio::select! {
            control = handle.control.recv(), if control_open => {
                if control.is_none() {
                    control_open = false;
                }
                if let Some(t) = rpc_lock(&shared.transcript).as_ref() {
                    t.record(control_record(control.as_ref()));
                }
                actions.extend(state.on_control(control, Instant::now()));
            }
            message = incoming.recv() => {
                let now = Instant::now();
                match message {
                    Some(Incoming::Notification { method, params }) => {
                        if belongs_to(&params, &thread_id) {
                            actions.extend(state.on_notification(&method, &params, now));
                        }
                    }
                    Some(Incoming::ServerRequest { method }) => actions.extend(state.on_server_request(&method, now)),
                    Some(Incoming::Exited) | None => {
                        let detail = exit_detail(&server).await;
                        forget_server(&shared, &server).await;
                        actions.extend(state.on_exit(&detail));
                    }
                }
            }
            _ = ticker.tick() => {
                let now = Instant::now();
                if let Some(since) = abort_started {
                    if now.duration_since(since) > ABORT_DEADLINE {
                        tracing::warn!("codex did not end the aborted turn in time; stopping app-server");
                        server.terminate().await;
                        forget_server(&shared, &server).await;
                        return;
                    }
                }
                if state.turn_active() && !state.aborting() {
                    let limit = if state.tool_running() {
                        settings.watchdog.max(settings.tool_timeout + config::TOOL_TIMEOUT_MARGIN + TOOL_WATCHDOG_MARGIN)
                    } else {
                        settings.watchdog
                    };
                    let silence = server.silence().min(last_request.elapsed());
                    if silence > limit {
                        tracing::warn!(silent_secs = silence.as_secs(), "codex watchdog fired; stopping app-server");
                        server.terminate().await;
                        forget_server(&shared, &server).await;
                        let _ = handle
                            .events
                            .send(ProviderEvent::Error {
                                message: format!("codex produced no output for {}s during a turn", silence.as_secs()),
                                retryable: true,
                                classification: ErrorClass::Watchdog,
                                ends_turn: true,
                            })
                            .await;
                        return;
                    }
                }
                actions.extend(state.on_tick(now));
            }
        }
    }
}

/// A request failed: a refusal ends the turn, a broken connection is a process failure.
async fn request_failed(
    state: &mut QueryState,
    server: &AppServer,
    method: &str,
    err: RpcError,
) -> Vec<Action> {
    match err {
        RpcError::Server(body) => state.on_request_failed(
            format!("codex refused {method}: {}", body.message),
            ErrorClass::Other,
            true,
        ),
        RpcError::Closed => state.on_exit(""),
        RpcError::Timeout => {
            server.terminate().await;
            state.on_request_failed(
                format!("codex app-server did not answer {method}; stopped it"),
                ErrorClass::Process,
                true,
            )
        }
    }
}

/// Notifications name their thread; those of other threads (an earlier session still loaded)
/// are not ours.
fn belongs_to(params: &Value, thread_id: &str) -> bool {
    match params.get("threadId").and_then(Value::as_str) {
        Some(id) => id == thread_id,
        None => true,
    }
}

async fn exit_detail(server: &AppServer) -> String {
    match server.exit_status().await {
        Some(status) => format!(" ({status})"),
        None => String::new(),
    }
}

fn control_record(control: Option<&crate::Control>) -> Value {
    use serde_json::json;
    match control {
        Some(crate::Control::Push { id, prompt }) => {
            json!({ "control": "push", "id": id, "text": prompt.text })
        }
        Some(crate::Control::End) => json!({ "control": "end" }),
        Some(crate::Control::Abort) => json!({ "control": "abort" }),
        None => json!({ "control": "dropped" }),
    }
}

/// The live app-server, spawning one when there is none (or it died).
async fn live_server(shared: &Shared) -> Result<Arc<AppServer>, Failure> {
    let mut slot = shared.server.lock().await;
    if let Some(server) = slot.as_ref() {
        if server.is_alive() {
            return Ok(server.clone());
        }
        tracing::info!(
            pid = server.pid(),
            "codex app-server is gone; starting a new one"
        );
        server.terminate().await;
        *slot = None;
    }
    let settings = &shared.settings;
    for dir in [&settings.home_dir, &config::codex_home(settings)] {
        std::fs::create_dir_all(dir)
            .map_err(|err| Failure::process(format!("cannot create {}: {err}", dir.display())))?;
    }
    let command = config::command(&shared.program, settings, std::env::vars());
    let transcript = rpc_lock(&shared.transcript).clone();
    let server = AppServer::start(&command, transcript)
        .await
        .map_err(|err| Failure::process(err.to_string()))?;
    *slot = Some(server.clone());
    Ok(server)
}

async fn forget_server(shared: &Shared, server: &Arc<AppServer>) {
    let mut slot = shared.server.lock().await;
    if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, server)) {
        *slot = None;
    }
}

/// The thread of this query: the live one, a resumed one, or a new one.
async fn open_thread(
    shared: &Shared,
    server: &AppServer,
    input: &QueryInput,
    handle: &QueryHandle,
) -> Result<String, Failure> {
    let settings = &shared.settings;
    let cwd = settings.agent_dir.display().to_string();
    let system_prompt = input.system_prompt.as_deref();
    if let Some(stored) = input.continuation.as_deref() {
        let loaded = rpc_lock(&server.threads).get(stored).cloned();
        if let Some(instructions) = loaded {
            update_instructions(
                shared,
                server,
                stored,
                instructions.as_deref(),
                system_prompt,
            )
            .await?;
            return Ok(stored.to_owned());
        }
        let params = protocol::thread_resume_params(stored, &cwd, system_prompt);
        match server.request("thread/resume", params).await {
            Ok(result) => {
                let response: ThreadResponse = serde_json::from_value(result).map_err(|err| {
                    Failure::process(format!("unexpected thread/resume answer: {err}"))
                })?;
                let id = response.thread.id;
                let recorded = read_instructions(settings, &id);
                rpc_lock(&server.threads).insert(id.clone(), recorded.clone());
                update_instructions(shared, server, &id, recorded.as_deref(), system_prompt)
                    .await?;
                tracing::info!(thread = %id, "codex thread resumed");
                return Ok(id);
            }
            Err(RpcError::Server(body)) => {
                tracing::warn!(thread = stored, error = %body.message, "stored codex thread cannot be resumed");
                let notice = ProviderEvent::Progress {
                    message: format!(
                        "stored session {stored} not found ({}); starting a new one",
                        body.message
                    ),
                };
                let _ = handle.events.send(notice).await;
            }
            Err(err) => return Err(Failure::process(format!("thread/resume failed: {err}"))),
        }
    }
    let result = server
        .request(
            "thread/start",
            protocol::thread_start_params(&cwd, system_prompt),
        )
        .await
        .map_err(|err| match err {
            RpcError::Server(body) => Failure {
                message: format!("codex refused thread/start: {}", body.message),
                classification: ErrorClass::Other,
                retryable: true,
            },
            other => Failure::process(format!("thread/start failed: {other}")),
        })?;
    let response: ThreadResponse = serde_json::from_value(result)
        .map_err(|err| Failure::process(format!("unexpected thread/start answer: {err}")))?;
    let id = response.thread.id;
    rpc_lock(&server.threads).insert(id.clone(), system_prompt.map(str::to_owned));
    write_instructions(settings, &id, system_prompt);
    tracing::info!(thread = %id, "codex thread started");
    Ok(id)
}

/// Appends the system prompt to the thread's history when it differs from what the thread
/// last received (see the module docs).
async fn update_instructions(
    shared: &Shared,
    server: &AppServer,
    thread_id: &str,
    recorded: Option<&str>,
    wanted: Option<&str>,
) -> Result<(), Failure> {
    let Some(wanted) = wanted else { return Ok(()) };
    if recorded == Some(wanted) {
        return Ok(());
    }
    match server
        .request(
            "thread/inject_items",
            protocol::inject_instructions_params(thread_id, wanted),
        )
        .await
    {
        Ok(_) => {
            tracing::info!(
                thread = thread_id,
                "system prompt changed; appended to the codex thread"
            );
            rpc_lock(&server.threads).insert(thread_id.to_owned(), Some(wanted.to_owned()));
            write_instructions(&shared.settings, thread_id, Some(wanted));
            Ok(())
        }
        Err(RpcError::Server(body)) => {
            // Not fatal: the thread still has its original instructions.
            tracing::warn!(thread = thread_id, error = %body.message, "could not update the system prompt");
            Ok(())
        }
        Err(err) => Err(Failure::process(format!(
            "thread/inject_items failed: {err}"
        ))),
    }
}

fn instructions_path(settings: &ProviderSettings, thread_id: &str) -> PathBuf {
    let safe: String = thread_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    config::codex_home(settings)
        .join("nanoclaw/instructions")
        .join(format!("{safe}.txt"))
}

fn read_instructions(settings: &ProviderSettings, thread_id: &str) -> Option<String> {
    fsguard::read_to_string(&instructions_path(settings, thread_id)).ok()
}

fn write_instructions(settings: &ProviderSettings, thread_id: &str, instructions: Option<&str>) {
    let path = instructions_path(settings, thread_id);
    let result = match instructions {
        Some(text) => path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| fsguard::write_private(&path, text.as_bytes())),
        None => match std::fs::remove_file(&path) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        },
    };
    if let Err(err) = result {
        tracing::warn!(path = %path.display(), %err, "cannot record the thread's instructions");
    }
}

fn rpc_lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn error_event(failure: Failure) -> ProviderEvent {
    ProviderEvent::Error {
        message: failure.message,
        retryable: failure.retryable,
        classification: failure.classification,
        ends_turn: true,
    }
}
