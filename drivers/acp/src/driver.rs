//! The agent's lifetime and one query's loop: the live process (spawned and initialized, reused,
//! replaced when it died or broke the protocol), the session (the live one, `session/load` of
//! the stored one, or a new one with a recorded note) and the turn loop that feeds the runner's
//! controls and the agent's messages to the state machine in [`super::translate`] and performs
//! what it asks.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use super::archiving;
use super::command::{self, AgentSpec};
use super::connection::{lock, Agent, Incoming, RpcError};
use super::protocol::{
    initialize_params, permission_outcome, InitializeResult, NewSessionResult, PromptResult,
    RequestId, AUTH_REQUIRED,
};
use super::translate::{classify_rpc_error, Action, QueryState};
use provider::media::{native_kind, NativeKind};
use provider::{ErrorClass, Prompt, ProviderEvent, ProviderSettings, QueryHandle, QueryInput};

/// How long a stop (the runner's interrupt) waits for the cancelled prompt's answer before
/// stopping the agent: the runner promises the chat an answer within 2 s.
const STOP_DEADLINE: Duration = Duration::from_millis(1500);

/// How long an abort waits for the cancelled prompt's answer before stopping the agent.
const ABORT_DEADLINE: Duration = Duration::from_secs(5);

/// How long a cancelled prompt may still take to answer after the turn was reported stopped (a
/// slow agent, or one under load, keeps its process and session); past it the agent is stopped.
const LINGER: Duration = Duration::from_secs(5);

/// Extra watchdog time while a tool runs (an agent is silent during a blocking MCP tool).
const TOOL_WATCHDOG_MARGIN: Duration = Duration::from_secs(90);

/// What the provider and its queries share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) settings: ProviderSettings,
    pub(crate) spec: AgentSpec,
    /// The resolved program.
    pub(crate) program: PathBuf,
    pub(crate) slot: tokio::sync::Mutex<Option<Arc<Live>>>,
    pub(crate) archive: provider::archive::job::Archives<archiving::Job>,
}

/// A running, initialized agent.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) agent: Arc<Agent>,
    caps: InitializeResult,
    /// Sessions created or loaded in this process.
    sessions: Mutex<HashSet<String>>,
}

/// Why a query stopped before its turns could run.
#[derive(Debug)]
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

    fn event(self) -> ProviderEvent {
        ProviderEvent::Error {
            message: self.message,
            retryable: self.retryable,
            classification: self.classification,
            ends_turn: true,
            usage: None,
        }
    }
}

pub(crate) async fn run_query(shared: Arc<Shared>, input: QueryInput, mut handle: QueryHandle) {
    let Some((live, agent, mut incoming)) = acquire_connection(&shared, &mut handle).await else {
        return;
    };
    let Some((session_id, servers)) =
        start_session(&shared, &live, &mut incoming, &input, &handle).await
    else {
        return;
    };
    let settings = &shared.settings;
    let model = input.model.clone().or_else(|| settings.model.clone());
    if input.model.is_some() && input.model != settings.model {
        tracing::info!(
            model = ?input.model,
            "ACP has no per-prompt model; the agent keeps the model it was started with"
        );
    }
    let mut system = pending_instructions(settings, &session_id, input.system_prompt.as_deref());
    let mut state = QueryState::new(input.prompt)
        .with_policy(
            settings
                .tool_policy
                .clone()
                .with_workspace(settings.agent_dir.clone()),
            servers,
        )
        .with_model(model);
    let mut actions: std::collections::VecDeque<Action> = state.begin().into();
    let mut ticker = watchdog_ticker(settings);
    let mut control_open = true;
    let mut prompt_id: Option<RequestId> = None;
    let mut stop_started: Option<Instant> = None;
    let mut last_request = Instant::now();
    // The agent broke the protocol or hung: it is replaced after the query.
    let mut replace = false;
    // A stop or abort ended the turn before the agent answered the cancel.
    let mut linger = false;
    loop {
        while let Some(action) = actions.pop_front() {
            match action {
                Action::Emit(event) => {
                    if handle.events.send(event).await.is_err() {
                        control_open = false;
                        actions.extend(state.on_control(None, Instant::now()));
                    }
                }
                Action::Prompt { prompts } => {
                    last_request = Instant::now();
                    let turn = TurnRefs {
                        shared: &shared,
                        live: &live,
                        session_id: &session_id,
                    };
                    match send_prompt(turn, &prompts, &mut system) {
                        Some(id) => prompt_id = Some(id),
                        None => actions.extend(state.on_exit(&exit_detail(&agent).await)),
                    }
                }
                Action::Cancel => {
                    tracing::info!(session = %session_id, "session/cancel");
                    agent.notify("session/cancel", json!({ "sessionId": session_id }));
                }
                Action::Respond { id, result } => agent.respond(id, result),
                Action::Journal(record) => archiving::journal(settings, &session_id, record),
                Action::Close => {}
            }
        }
        if state.is_closed() {
            let ending = Ending {
                replace,
                linger,
                prompt_id: prompt_id.take(),
            };
            finish_query(&shared, &live, incoming, handle, session_id, ending).await;
            return;
        }
        if state.stopping() && stop_started.is_none() {
            stop_started = Some(Instant::now());
        }
        let stop_deadline = stop_deadline(&state, stop_started);
        tokio::select! {
            _ = sleep_until(stop_deadline) => {
                tracing::warn!(
                    "the agent did not end the cancelled prompt in time; the turn ends, its answer is awaited apart"
                );
                linger = true;
                actions.extend(state.on_stop_timeout());
            }
            control = handle.control.recv(), if control_open => {
                if control.is_none() {
                    control_open = false;
                }
                actions.extend(state.on_control(control, Instant::now()));
            }
            message = incoming.recv() => {
                let turn = TurnRefs { shared: &shared, live: &live, session_id: &session_id };
                actions.extend(on_incoming(message, &mut state, turn, &mut prompt_id, &mut replace).await);
            }
            _ = ticker.tick() => {
                if stop_started.is_none() {
                    if let Some(fired) = watchdog_fired(settings, &mut state, &agent, last_request) {
                        replace = true;
                        actions.extend(fired);
                        continue;
                    }
                }
                actions.extend(state.on_tick(Instant::now()));
            }
        }
    }
}

/// Sends the prompt blocks of `prompts` (with the instructions not yet given); the request's
/// id, or `None` when the agent is gone.
fn send_prompt(
    turn: TurnRefs<'_>,
    prompts: &[Prompt],
    system: &mut Option<String>,
) -> Option<RequestId> {
    let blocks = prompt_blocks(
        prompts,
        system.as_deref(),
        turn.live.caps.agent_capabilities.prompt_capabilities.image,
    );
    let params = json!({ "sessionId": turn.session_id, "prompt": blocks });
    let id = turn.live.agent.send("session/prompt", params)?;
    if let Some(text) = system.take() {
        record_instructions(&turn.shared.settings, turn.session_id, &text);
    }
    Some(id)
}

/// The stop's own deadline once a stop or abort started: the watchdog's ticks (up to 1 s
/// apart) would overshoot it.
fn stop_deadline(state: &QueryState, stop_started: Option<Instant>) -> Option<Instant> {
    stop_started.map(|since| {
        since
            + if state.stop_requested() {
                STOP_DEADLINE
            } else {
                ABORT_DEADLINE
            }
    })
}

/// The watchdog: a turn (not waiting for an approval) whose agent was silent past its limit
/// fails as `Watchdog`; the actions of that failure, or `None`.
fn watchdog_fired(
    settings: &ProviderSettings,
    state: &mut QueryState,
    agent: &Agent,
    last_request: Instant,
) -> Option<Vec<Action>> {
    if !state.turn_active() || state.awaiting_approval() {
        return None;
    }
    let limit = watchdog_limit(settings, state);
    let silence = agent.silence().min(last_request.elapsed());
    if silence <= limit {
        return None;
    }
    tracing::warn!(
        silent_secs = silence.as_secs(),
        "ACP watchdog fired; stopping the agent"
    );
    let mut fired = Vec::new();
    state.fail(
        format!(
            "the agent produced no output for {}s during a turn",
            silence.as_secs()
        ),
        ErrorClass::Watchdog,
        true,
        &mut fired,
    );
    Some(fired)
}

/// Opens (or loads) the ACP session, drops what a load replayed and announces the session;
/// `None` (the error already sent, a dead agent forgotten) when that fails.
async fn start_session(
    shared: &Shared,
    live: &Arc<Live>,
    incoming: &mut tokio::sync::mpsc::UnboundedReceiver<Incoming>,
    input: &QueryInput,
    handle: &QueryHandle,
) -> Option<(String, Vec<String>)> {
    let agent = live.agent.clone();
    let (session_id, servers) = match open_session(shared, live, input, handle).await {
        Ok(opened) => opened,
        Err(failure) => {
            if failure.classification == ErrorClass::Process {
                agent.terminate().await;
                forget(shared, live).await;
            }
            let _ = handle.events.send(failure.event()).await;
            return None;
        }
    };
    // `session/load` replays the history as updates: not this query's.
    if !drain_stale(&agent, incoming) {
        forget(shared, live).await;
        let _ = handle
            .events
            .send(Failure::process("the agent process exited while loading the session").event())
            .await;
        return None;
    }
    if handle
        .events
        .send(ProviderEvent::Init {
            session_id: session_id.clone(),
        })
        .await
        .is_err()
    {
        return None;
    }
    Some((session_id, servers))
}

/// What a closing query still has to settle with the agent.
struct Ending {
    /// The agent broke the protocol or hung: it is replaced.
    replace: bool,
    /// A stop or abort ended the turn before the agent answered the cancel.
    linger: bool,
    /// The prompt still unanswered.
    prompt_id: Option<RequestId>,
}

/// The query's view of its agent, for the handlers outside the loop.
#[derive(Clone, Copy)]
struct TurnRefs<'a> {
    shared: &'a Shared,
    live: &'a Arc<Live>,
    session_id: &'a str,
}

/// The live agent and its incoming stream, for this query alone; `None` (the error already
/// sent) when no agent can be had. An agent that died while this query waited for it is
/// replaced once.
async fn acquire_connection(
    shared: &Shared,
    handle: &mut QueryHandle,
) -> Option<(
    Arc<Live>,
    Arc<Agent>,
    tokio::sync::OwnedMutexGuard<tokio::sync::mpsc::UnboundedReceiver<Incoming>>,
)> {
    // One query at a time on the connection; an agent that died (or was stopped after a
    // cancelled prompt lingered too long) while this query waited for it is replaced once.
    let mut attempt = 0;
    loop {
        attempt += 1;
        let live = match live_agent(shared).await {
            Ok(live) => live,
            Err(failure) => {
                let _ = handle.events.send(failure.event()).await;
                return None;
            }
        };
        let agent = live.agent.clone();
        let mut incoming = agent.incoming.clone().lock_owned().await;
        if agent.is_alive() && drain_stale(&agent, &mut incoming) {
            return Some((live, agent, incoming));
        }
        drop(incoming);
        forget(shared, &live).await;
        if attempt == 2 {
            let _ = handle
                .events
                .send(Failure::process("the agent process exited between queries").event())
                .await;
            return None;
        }
    }
}

/// Ends a closed query: replaces a broken agent, waits (bounded) for a cancelled prompt's
/// answer so the next query never reads it, then archives the transcript.
async fn finish_query(
    shared: &Shared,
    live: &Arc<Live>,
    mut incoming: tokio::sync::OwnedMutexGuard<tokio::sync::mpsc::UnboundedReceiver<Incoming>>,
    handle: QueryHandle,
    session_id: String,
    ending: Ending,
) {
    let agent = live.agent.clone();
    let mut replace = ending.replace;
    let guard = shared.archive.reserve();
    if replace {
        // Forgotten before the stream closes: the next query starts a new agent.
        forget(shared, live).await;
    }
    drop(handle);
    if let (true, Some(id)) = (ending.linger, ending.prompt_id) {
        // The runner has its answer; the connection stays ours until the cancelled
        // prompt answers, so the next query never reads this one's leftovers.
        if !await_answer(&agent, &mut incoming, &id, LINGER).await {
            tracing::warn!(
                secs = LINGER.as_secs(),
                "the cancelled prompt did not answer; stopping the agent"
            );
            replace = true;
            forget(shared, live).await;
        }
    }
    if replace {
        // Stopped before the connection is let go: a query waiting for it then sees
        // a dead agent and starts a new one.
        agent.terminate().await;
    }
    drop(incoming);
    let job = archiving::Job {
        provider: shared.spec.provider,
        session_id,
    };
    shared
        .archive
        .run(guard, job, |job| {
            archiving::archive_session(&shared.settings, job)
        })
        .await;
}

/// One message from the agent during a turn, as the state machine's actions.
async fn on_incoming(
    message: Option<Incoming>,
    state: &mut QueryState,
    turn: TurnRefs<'_>,
    prompt_id: &mut Option<RequestId>,
    replace: &mut bool,
) -> Vec<Action> {
    let now = Instant::now();
    match message {
        Some(Incoming::Notification { method, params }) => {
            if method == "session/update" && belongs_to(&params, turn.session_id) {
                let update = params.get("update").cloned().unwrap_or(Value::Null);
                return state.on_update(&update, now).into_iter().collect();
            } else {
                tracing::debug!(%method, "agent notification ignored");
            }
        }
        Some(Incoming::Request { id, method, params }) => {
            tracing::debug!(%method, "agent request");
            if belongs_to(&params, turn.session_id) {
                return state.on_permission(id, &params).into_iter().collect();
            } else {
                turn.live.agent.respond(id, permission_outcome(None));
            }
        }
        Some(Incoming::Answer { id, result }) => {
            if prompt_id.as_ref() == Some(&id) {
                *prompt_id = None;
                let answer = result
                    .map(|value| serde_json::from_value::<PromptResult>(value).unwrap_or_default());
                return state.on_prompt_answer(answer).into_iter().collect();
            }
        }
        Some(Incoming::Malformed(line)) => {
            *replace = true;
            return state.on_malformed(&line).into_iter().collect();
        }
        Some(Incoming::Exited) | None => {
            let detail = exit_detail(&turn.live.agent).await;
            forget(turn.shared, turn.live).await;
            return state.on_exit(&detail).into_iter().collect();
        }
    }
    Vec::new()
}

/// The live agent, spawning and initializing one when there is none (or it died).
async fn live_agent(shared: &Shared) -> Result<Arc<Live>, Failure> {
    let mut slot = shared.slot.lock().await;
    if let Some(live) = slot.as_ref() {
        if live.agent.is_alive() {
            return Ok(live.clone());
        }
        tracing::info!(
            pid = live.agent.pid(),
            "the ACP agent is gone; starting a new one"
        );
        live.agent.terminate().await;
        *slot = None;
    }
    let settings = &shared.settings;
    command::prepare_home(&shared.spec, settings).map_err(|err| {
        Failure::process(format!(
            "cannot prepare the agent's home {}: {err}",
            settings.home_dir.display()
        ))
    })?;
    let command = command::command(&shared.program, &shared.spec, settings, std::env::vars());
    let agent = Agent::spawn(&command).map_err(|err| Failure::process(err.0))?;
    let caps = match agent.request("initialize", initialize_params()).await {
        Ok(value) => serde_json::from_value::<InitializeResult>(value).unwrap_or_default(),
        Err(err) => {
            let tail = agent.stderr_tail();
            agent.terminate().await;
            return Err(Failure::process(format!(
                "the ACP agent {} did not initialize: {err}{}",
                shared.spec.provider,
                if tail.is_empty() {
                    String::new()
                } else {
                    format!(" (stderr: {tail})")
                }
            )));
        }
    };
    tracing::info!(
        pid = agent.pid(),
        load_session = caps.agent_capabilities.load_session,
        image = caps.agent_capabilities.prompt_capabilities.image,
        mcp_http = caps.agent_capabilities.mcp_capabilities.http,
        protocol = ?caps.protocol_version,
        "ACP agent initialized"
    );
    let live = Arc::new(Live {
        agent,
        caps,
        sessions: Mutex::new(HashSet::new()),
    });
    *slot = Some(live.clone());
    Ok(live)
}

async fn forget(shared: &Shared, live: &Arc<Live>) {
    let mut slot = shared.slot.lock().await;
    if slot.as_ref().is_some_and(|l| Arc::ptr_eq(l, live)) {
        *slot = None;
    }
}

/// The query's session and the MCP servers' names: the live one, the stored one loaded, or a
/// new one (a stored one that could not be loaded is announced with a `Progress`).
async fn open_session(
    shared: &Shared,
    live: &Live,
    input: &QueryInput,
    handle: &QueryHandle,
) -> Result<(String, Vec<String>), Failure> {
    let settings = &shared.settings;
    let caps = &live.caps.agent_capabilities;
    let (servers, names) = command::mcp_servers(settings, caps.mcp_capabilities.http);
    if let Some(stored) = input.continuation.as_deref() {
        if lock(&live.sessions).contains(stored) {
            return Ok((stored.to_owned(), names));
        }
        let why = if caps.load_session {
            let params = command::load_session_params(settings, stored, &servers);
            match live.agent.request("session/load", params).await {
                Ok(_) => {
                    tracing::info!(session = stored, "ACP session loaded");
                    lock(&live.sessions).insert(stored.to_owned());
                    return Ok((stored.to_owned(), names));
                }
                Err(RpcError::Server(body)) => body.describe(),
                Err(err) => return Err(Failure::process(format!("session/load failed: {err}"))),
            }
        } else {
            "the agent cannot load sessions (no loadSession capability)".to_owned()
        };
        tracing::warn!(session = stored, %why, "the stored ACP session cannot be resumed; starting a new one");
        let notice = ProviderEvent::Progress {
            message: format!(
                "stored session {stored} could not be resumed ({why}); starting a new one"
            ),
        };
        let _ = handle.events.send(notice).await;
    }
    let params = command::new_session_params(settings, &servers);
    let value = live
        .agent
        .request("session/new", params)
        .await
        .map_err(|err| match err {
            RpcError::Server(body) if body.code == AUTH_REQUIRED => Failure {
                message: format!(
                    "the agent requires authentication ({}; it offers {}): give it an API key \
                     through its settings or cliEnv",
                    body.describe(),
                    auth_methods(&live.caps)
                ),
                classification: ErrorClass::Auth,
                retryable: false,
            },
            RpcError::Server(body) => {
                let (classification, retryable) = classify_rpc_error(&body);
                Failure {
                    message: format!("the agent refused session/new: {}", body.describe()),
                    classification: if classification == ErrorClass::Api {
                        ErrorClass::Other
                    } else {
                        classification
                    },
                    retryable,
                }
            }
            other => Failure::process(format!("session/new failed: {other}")),
        })?;
    let session: NewSessionResult = serde_json::from_value(value)
        .map_err(|err| Failure::process(format!("unexpected session/new answer: {err}")))?;
    tracing::info!(session = %session.session_id, "ACP session created");
    lock(&live.sessions).insert(session.session_id.clone());
    Ok((session.session_id, names))
}

fn auth_methods(caps: &InitializeResult) -> String {
    if caps.auth_methods.is_empty() {
        return "no authentication method".into();
    }
    caps.auth_methods
        .iter()
        .map(|m| {
            if m.name.is_empty() {
                m.id.clone()
            } else {
                format!("{} ({})", m.id, m.name)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Drops what an earlier query or a replay left and refuses a permission request nobody
/// judged. `false` when the agent exited meanwhile.
fn drain_stale(
    agent: &Agent,
    incoming: &mut tokio::sync::mpsc::UnboundedReceiver<Incoming>,
) -> bool {
    while let Ok(stale) = incoming.try_recv() {
        match stale {
            Incoming::Request { id, .. } => {
                tracing::info!("permission request between queries: cancelled");
                agent.respond(id, permission_outcome(None));
            }
            Incoming::Exited => return false,
            _ => {}
        }
    }
    true
}

/// The system prompt to send before the first prompt: when the session has not received this
/// one yet (ACP has no system prompt of its own, so it travels as a leading text block).
fn pending_instructions(
    settings: &ProviderSettings,
    session_id: &str,
    wanted: Option<&str>,
) -> Option<String> {
    let wanted = wanted.filter(|w| !w.trim().is_empty())?;
    let recorded = fsguard::read_to_string(&command::instructions_path(settings, session_id)).ok();
    (recorded.as_deref() != Some(wanted)).then(|| wanted.to_owned())
}

fn record_instructions(settings: &ProviderSettings, session_id: &str, text: &str) {
    let path = command::instructions_path(settings, session_id);
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| fsguard::write_private(&path, text.as_bytes()));
    if let Err(err) = written {
        tracing::warn!(path = %path.display(), %err, "cannot record the session's instructions");
    }
}

/// The prompt as ACP content blocks: the instructions first when due, each prompt's text, and
/// its images as `image` blocks when the agent takes them (else the text names the saved file,
/// as for OpenCode).
pub(crate) fn prompt_blocks(prompts: &[Prompt], system: Option<&str>, image: bool) -> Vec<Value> {
    let mut blocks = Vec::new();
    if let Some(system) = system {
        blocks.push(json!({
            "type": "text",
            "text": format!("<system-instructions>\n{system}\n</system-instructions>"),
        }));
    }
    for prompt in prompts {
        blocks.push(json!({ "type": "text", "text": prompt.text }));
        if !image {
            continue;
        }
        for media in &prompt.media {
            let Some((mime, NativeKind::Image)) = native_kind(&media.mime_type) else {
                continue;
            };
            match fsguard::read(&media.path) {
                Ok(bytes) if (bytes.len() as u64) <= NativeKind::Image.max_bytes() => {
                    blocks.push(json!({
                        "type": "image",
                        "mimeType": mime,
                        "data": base64::engine::general_purpose::STANDARD.encode(bytes),
                    }));
                }
                Ok(_) => {
                    tracing::info!(path = %media.path.display(), "image too large for a block; named in the text")
                }
                Err(err) => {
                    tracing::warn!(path = %media.path.display(), %err, "cannot read an attachment; named in the text")
                }
            }
        }
    }
    blocks
}

fn belongs_to(params: &Value, session_id: &str) -> bool {
    match params.get("sessionId").and_then(Value::as_str) {
        Some(id) => id == session_id,
        None => true,
    }
}

async fn exit_detail(agent: &Agent) -> String {
    let status = agent.exit_status().await;
    let tail = agent.stderr_tail();
    let mut detail = String::new();
    if let Some(status) = status {
        detail.push_str(&format!(" ({status})"));
    }
    if !tail.is_empty() {
        detail.push_str(&format!("; stderr: {tail}"));
    }
    detail
}

/// Waits (at most `limit`) for the answer to request `id`, answering permission requests
/// `cancelled` meanwhile; false when it did not come (or the agent exited).
async fn await_answer(
    agent: &Agent,
    incoming: &mut tokio::sync::mpsc::UnboundedReceiver<Incoming>,
    id: &RequestId,
    limit: Duration,
) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, incoming.recv()).await {
            Ok(Some(Incoming::Answer { id: answered, .. })) if &answered == id => return true,
            Ok(Some(Incoming::Request { id, .. })) => agent.respond(id, permission_outcome(None)),
            Ok(Some(Incoming::Exited | Incoming::Malformed(_)) | None) | Err(_) => return false,
            Ok(Some(_)) => {}
        }
    }
}

/// Sleeps until `deadline`; never without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

fn watchdog_ticker(settings: &ProviderSettings) -> tokio::time::Interval {
    let tick = (settings.watchdog / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker
}

fn watchdog_limit(settings: &ProviderSettings, state: &QueryState) -> Duration {
    if state.tool_running() {
        settings
            .watchdog
            .max(settings.tool_timeout + TOOL_WATCHDOG_MARGIN)
    } else {
        settings.watchdog
    }
}
