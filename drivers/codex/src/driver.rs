//! The app-server's lifetime and one query's loop: the live process (spawned, reused, replaced
//! for another session), the session's thread (started, resumed or replaced, with the system
//! prompt kept current) and the turn loop that feeds the runner's controls and app-server's
//! notifications to the state machine in [`super::translate`] and performs what it asks.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::archiving;
use super::command;
use super::connection::{AppServer, Incoming, RpcError, Transcript};
use super::protocol::{self, ThreadResponse, TurnResponse};
use super::translate::{Action, QueryState};
use provider::{ErrorClass, ProviderEvent, ProviderSettings, QueryHandle, QueryInput};

/// How long an abort waits for Codex to confirm the interrupted turn before killing the process.
const ABORT_DEADLINE: Duration = Duration::from_secs(5);

/// How long a stop (the runner's interrupt, the step limit) waits for Codex to end the turn
/// before stopping the process: the runner promises the chat an answer within 2 s, and Codex
/// answers `turn/interrupt` in about 10 ms (measured).
const STOP_DEADLINE: Duration = Duration::from_millis(1500);

/// Extra watchdog time while a tool runs: Codex itself is silent during a blocking MCP tool.
const TOOL_WATCHDOG_MARGIN: Duration = Duration::from_secs(30);

/// What the provider and its queries share.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) settings: ProviderSettings,
    /// The binary actually executed (the native one behind the npm launcher when found).
    pub(super) program: PathBuf,
    /// What the settings named (for error messages).
    pub(super) configured: PathBuf,
    pub(super) server: tokio::sync::Mutex<Option<Arc<AppServer>>>,
    pub(super) transcript: std::sync::Mutex<Option<Transcript>>,
    /// Held by the transcript archive that runs (`archiving.rs`).
    pub(super) archive: provider::archive::job::Archives<archiving::Job>,
    /// Waited before each `turn/interrupt` (zero but in tests: [`super::CodexProvider::delay_interrupts`]).
    pub(super) interrupt_delay: std::sync::Mutex<Duration>,
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

pub(super) async fn run_query(shared: Arc<Shared>, input: QueryInput, mut handle: QueryHandle) {
    let server = match session_server(&shared, &input).await {
        Ok(server) => server,
        Err(failure) => {
            let _ = handle.events.send(error_event(failure)).await;
            return;
        }
    };
    // One query at a time on the connection; a previous query that is still winding down (an
    // abort waiting for its turn to end) finishes first.
    let mut incoming = server.incoming.lock().await;
    let Some((thread_id, thread_model)) =
        open_session(&shared, &server, &mut incoming, &input, &handle).await
    else {
        return;
    };
    let settings = &shared.settings;
    // Sent with every turn: `turn/start`'s model sticks to the thread, so a query without a
    // choice of its own goes back to the configured model (and an unknown one is not kept).
    let turn_model = input.model.clone().or_else(|| settings.model.clone());
    let mut state = query_state(settings, input.prompt, turn_model.clone().or(thread_model));
    let mut actions: std::collections::VecDeque<Action> = state.begin().into();
    let mut ticker = watchdog_ticker(settings);
    let mut control_open = true;
    let mut abort_started: Option<Instant> = None;
    let mut stop_started: Option<Instant> = None;
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
                    let model = turn_model.as_deref();
                    actions.extend(start_turn(&mut state, &server, &thread_id, model, input).await);
                }
                Action::Steer { turn_id, id, input } => {
                    last_request = Instant::now();
                    let next = steer(&mut state, &server, &thread_id, turn_id, id, input).await;
                    actions.extend(next);
                }
                Action::Interrupt { turn_id } => {
                    let next = interrupt(&shared, &mut state, &server, &thread_id, turn_id).await;
                    actions.extend(next);
                }
                Action::Respond { id, result } => server.respond(id, result),
                Action::Note { text } => note(&server, &thread_id, &text).await,
                Action::Close => {}
            }
        }
        if state.is_closed() {
            // The archive lock is taken before the stream closes, so a shutdown or another
            // session the runner starts next waits for this query's archive.
            let guard = shared.archive.reserve();
            drop(incoming);
            drop(handle);
            archive(&shared, guard, &server, thread_id).await;
            return;
        }
        if state.aborting() && abort_started.is_none() {
            abort_started = Some(Instant::now());
        }
        if state.stopping() && stop_started.is_none() {
            stop_started = Some(Instant::now());
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
                actions.extend(on_incoming(&shared, &server, &mut state, &thread_id, message).await);
            }
            _ = ticker.tick() => {
                let now = Instant::now();
                if stop_started.is_some_and(|since| now.duration_since(since) > STOP_DEADLINE) {
                    stop_timed_out(&shared, &server, &mut state, &handle).await;
                    drop(incoming);
                    drop(handle);
                    server.terminate().await;
                    return;
                }
                if abort_started.is_some_and(|since| now.duration_since(since) > ABORT_DEADLINE) {
                    tracing::warn!("codex did not end the aborted turn in time; stopping app-server");
                    server.terminate().await;
                    forget_server(&shared, &server).await;
                    return;
                }
                // While an approval waits for the user, Codex waits too: its silence is not a hang.
                if state.turn_active() && !state.aborting() && !state.awaiting_approval() {
                    let limit = watchdog_limit(settings, &state);
                    let silence = server.silence().min(last_request.elapsed());
                    if silence > limit {
                        tracing::warn!(silent_secs = silence.as_secs(), "codex watchdog fired; stopping app-server");
                        server.terminate().await;
                        forget_server(&shared, &server).await;
                        let _ = handle.events.send(watchdog_error(silence, &mut state)).await;
                        return;
                    }
                }
                actions.extend(state.on_tick(now));
            }
        }
    }
}

/// Readies the connection for this query and opens its thread: the thread's id and model, or
/// `None` when the query already ended (its error sent, or the runner gone).
async fn open_session(
    shared: &Shared,
    server: &AppServer,
    incoming: &mut tokio::sync::mpsc::UnboundedReceiver<Incoming>,
    input: &QueryInput,
    handle: &QueryHandle,
) -> Option<(String, Option<String>)> {
    if !drain_stale(server, incoming) {
        let _ = handle
            .events
            .send(error_event(Failure::process(
                "the codex app-server process exited",
            )))
            .await;
        return None;
    }
    let (thread_id, thread_model) = match open_thread(shared, server, input, handle).await {
        Ok(opened) => opened,
        Err(failure) => {
            let _ = handle.events.send(error_event(failure)).await;
            return None;
        }
    };
    handle
        .events
        .send(ProviderEvent::Init {
            session_id: thread_id.clone(),
        })
        .await
        .ok()?;
    Some((thread_id, thread_model))
}

/// The state machine of a query answering `prompt` with `model`, under `settings`.
fn query_state(
    settings: &ProviderSettings,
    prompt: provider::Prompt,
    model: Option<String>,
) -> QueryState {
    QueryState::new(prompt, settings.codex_steer)
        .with_max_turns(settings.max_turns_per_query)
        .with_model(model)
        .with_approvals(
            settings.tool_policy.clone(),
            settings.elicitation,
            settings.approval_stop_tools.clone(),
        )
}

/// Adds the approval-stop note to the thread; a failure is logged, the query goes on.
async fn note(server: &AppServer, thread_id: &str, text: &str) {
    let params = protocol::inject_instructions_params(thread_id, text);
    if let Err(err) = server.request("thread/inject_items", params).await {
        tracing::warn!(%err, "could not add the approval-stop note to the thread");
    }
}

/// Archives the closed query's thread, holding `guard` (taken before the stream closed).
async fn archive(
    shared: &Shared,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    server: &Arc<AppServer>,
    thread_id: String,
) {
    let job = archiving::Job {
        server: Arc::clone(server),
        thread_id,
    };
    let settings = &shared.settings;
    shared
        .archive
        .run(guard, job, |job| archiving::archive_thread(settings, job))
        .await;
}

/// The app-server for this query: a live one, or a fresh one when the live one holds another
/// session's thread.
async fn session_server(shared: &Shared, input: &QueryInput) -> Result<Arc<AppServer>, Failure> {
    let server = live_server(shared).await?;
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
    if !other_session {
        return Ok(server);
    }
    tracing::info!(
        pid = server.pid(),
        "another session: restarting codex app-server"
    );
    // The previous session's archive reads its thread from this process.
    shared.archive.wait_idle("codex").await;
    server.terminate().await;
    forget_server(shared, &server).await;
    live_server(shared).await
}

/// Drops what an earlier query left (late thread status, token usage: stale) and declines an
/// approval request nobody judged. `false` when the app-server exited meanwhile.
fn drain_stale(
    server: &AppServer,
    incoming: &mut tokio::sync::mpsc::UnboundedReceiver<Incoming>,
) -> bool {
    while let Ok(stale) = incoming.try_recv() {
        if let Incoming::ServerRequest {
            method,
            pending: Some((id, _)),
        } = &stale
        {
            tracing::info!(%method, "approval request between queries: declined");
            let refusal = if method.starts_with("mcpServer/") {
                serde_json::json!({ "action": "decline", "content": null, "_meta": null })
            } else {
                serde_json::json!({ "decision": "decline" })
            };
            server.respond(id.clone(), refusal);
        }
        if matches!(stale, Incoming::Exited) {
            return false;
        }
    }
    true
}

/// `turn/start` on `thread_id` with `input` (and the query's model): what the state machine
/// does next.
async fn start_turn(
    state: &mut QueryState,
    server: &AppServer,
    thread_id: &str,
    model: Option<&str>,
    input: Vec<Value>,
) -> Vec<Action> {
    let mut params = serde_json::json!({ "threadId": thread_id, "input": input });
    if let Some(model) = model {
        params["model"] = Value::from(model);
    }
    match server.request("turn/start", params).await {
        Ok(result) => match serde_json::from_value::<TurnResponse>(result) {
            Ok(response) => state.on_turn_started(response.turn.id, Instant::now()),
            Err(err) => state.on_request_failed(
                format!("unexpected turn/start answer: {err}"),
                ErrorClass::Other,
                true,
            ),
        },
        Err(err) => request_failed(state, server, "turn/start", err).await,
    }
}

/// `turn/interrupt` of `turn_id` (after the test-only delay): what the state machine does next.
async fn interrupt(
    shared: &Shared,
    state: &mut QueryState,
    server: &AppServer,
    thread_id: &str,
    turn_id: String,
) -> Vec<Action> {
    let delay = *rpc_lock(&shared.interrupt_delay);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let params = serde_json::json!({ "threadId": thread_id, "turnId": turn_id });
    match server.request("turn/interrupt", params).await {
        Ok(_) => Vec::new(),
        // The turn ended meanwhile; its turn/completed is on the way.
        Err(RpcError::Server(body)) => {
            tracing::debug!(error = %body.message, "turn/interrupt refused");
            Vec::new()
        }
        Err(err) => request_failed(state, server, "turn/interrupt", err).await,
    }
}

/// `turn/steer` of `input` into `turn_id`; a refusal sends push `id` to the next turn.
async fn steer(
    state: &mut QueryState,
    server: &AppServer,
    thread_id: &str,
    turn_id: String,
    id: provider::PromptId,
    input: Vec<Value>,
) -> Vec<Action> {
    let params =
        serde_json::json!({ "threadId": thread_id, "expectedTurnId": turn_id, "input": input });
    match server.request("turn/steer", params).await {
        Ok(_) => Vec::new(),
        Err(RpcError::Server(body)) => {
            tracing::info!(id, error = %body.message, "turn/steer refused; the push goes to the next turn");
            state.on_steer_failed(id)
        }
        Err(err) => request_failed(state, server, "turn/steer", err).await,
    }
}

/// What the app-server sent (`None`: its stream ended): what the state machine does next.
async fn on_incoming(
    shared: &Shared,
    server: &Arc<AppServer>,
    state: &mut QueryState,
    thread_id: &str,
    message: Option<Incoming>,
) -> Vec<Action> {
    let now = Instant::now();
    match message {
        Some(Incoming::Notification { method, params }) => {
            if belongs_to(&params, thread_id) {
                state.on_notification(&method, &params, now)
            } else {
                Vec::new()
            }
        }
        Some(Incoming::ServerRequest { method, pending }) => {
            state.on_server_request(&method, pending, now)
        }
        Some(Incoming::Exited) | None => {
            let detail = exit_detail(server).await;
            forget_server(shared, server).await;
            state.on_exit(&detail)
        }
    }
}

/// A stopped turn did not end in time: forgets the app-server and sends the turn's last events.
async fn stop_timed_out(
    shared: &Shared,
    server: &Arc<AppServer>,
    state: &mut QueryState,
    handle: &QueryHandle,
) {
    tracing::warn!("codex did not end the stopped turn in time; stopping app-server");
    // Forgotten first, so the next query starts a new process (resuming the thread) instead of
    // reusing this one.
    forget_server(shared, server).await;
    for action in state.on_stop_timeout() {
        if let Action::Emit(event) = action {
            let _ = handle.events.send(event).await;
        }
    }
}

/// The watchdog's clock: a quarter of its limit, between 100 ms and 1 s; late ticks are not
/// made up.
fn watchdog_ticker(settings: &ProviderSettings) -> tokio::time::Interval {
    let tick = (settings.watchdog / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker
}

/// The silence the watchdog allows now: a running tool gets its own timeout and margins.
fn watchdog_limit(settings: &ProviderSettings, state: &QueryState) -> Duration {
    if state.tool_running() {
        settings
            .watchdog
            .max(settings.tool_timeout + command::TOOL_TIMEOUT_MARGIN + TOOL_WATCHDOG_MARGIN)
    } else {
        settings.watchdog
    }
}

/// The error a fired watchdog ends the turn with.
fn watchdog_error(silence: Duration, state: &mut QueryState) -> ProviderEvent {
    ProviderEvent::Error {
        message: format!(
            "codex produced no output for {}s during a turn",
            silence.as_secs()
        ),
        retryable: true,
        classification: ErrorClass::Watchdog,
        ends_turn: true,
        usage: state.take_usage(),
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

fn control_record(control: Option<&provider::Control>) -> Value {
    use serde_json::json;
    match control {
        Some(provider::Control::Push { id, prompt }) => {
            json!({ "control": "push", "id": id, "text": prompt.text })
        }
        Some(provider::Control::End) => json!({ "control": "end" }),
        Some(provider::Control::Abort) => json!({ "control": "abort" }),
        Some(provider::Control::Interrupt) => json!({ "control": "interrupt" }),
        Some(provider::Control::Approval { id, answer }) => {
            json!({ "control": "approval", "id": id, "answer": format!("{answer:?}") })
        }
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
    for dir in [&settings.home_dir, &command::codex_home(settings)] {
        std::fs::create_dir_all(dir)
            .map_err(|err| Failure::process(format!("cannot create {}: {err}", dir.display())))?;
    }
    command::write_config_file(settings)
        .map_err(|err| Failure::process(format!("cannot write codex's config.toml: {err}")))?;
    let command = command::command(&shared.program, settings, std::env::vars());
    let transcript = rpc_lock(&shared.transcript).clone();
    let gated = super::approval::gated(&settings.tool_policy, settings.elicitation);
    let server = AppServer::start(&command, transcript, gated)
        .await
        .map_err(|err| Failure::process(err.to_string()))?;
    super::hooks::trust_approval_stop_hook(&server, settings).await;
    *slot = Some(server.clone());
    Ok(server)
}

async fn forget_server(shared: &Shared, server: &Arc<AppServer>) {
    let mut slot = shared.server.lock().await;
    if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, server)) {
        *slot = None;
    }
}

/// The thread of this query: the live one, a resumed one, or a new one; with the model Codex
/// named when it opened the thread.
async fn open_thread(
    shared: &Shared,
    server: &AppServer,
    input: &QueryInput,
    handle: &QueryHandle,
) -> Result<(String, Option<String>), Failure> {
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
            return Ok((stored.to_owned(), None));
        }
        let params = protocol::thread_resume_params(
            stored,
            &cwd,
            system_prompt,
            command::approval_policy(settings),
        );
        match server.request("thread/resume", params).await {
            Ok(result) => {
                let response: ThreadResponse = serde_json::from_value(result).map_err(|err| {
                    Failure::process(format!("unexpected thread/resume answer: {err}"))
                })?;
                let model = response.model();
                let id = response.thread.id;
                let recorded = read_instructions(settings, &id);
                rpc_lock(&server.threads).insert(id.clone(), recorded.clone());
                update_instructions(shared, server, &id, recorded.as_deref(), system_prompt)
                    .await?;
                tracing::info!(thread = %id, "codex thread resumed");
                return Ok((id, model));
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
            protocol::thread_start_params(&cwd, system_prompt, command::approval_policy(settings)),
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
    let model = response.model();
    let id = response.thread.id;
    rpc_lock(&server.threads).insert(id.clone(), system_prompt.map(str::to_owned));
    write_instructions(settings, &id, system_prompt);
    tracing::info!(thread = %id, "codex thread started");
    Ok((id, model))
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
    command::codex_home(settings)
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

pub(super) fn rpc_lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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
        usage: None,
    }
}
