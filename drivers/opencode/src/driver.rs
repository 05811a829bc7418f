//! One query's loop: the query's session (resolved in `server.rs`), the SSE event loop that
//! feeds [`super::translate::Turn`] and performs what it asks (posts, aborts, settling,
//! reconciliation), and the report of how the query ended.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use provider::driver::refusal;
use provider::{
    ApprovalAnswer, ApprovalRequest, Control, ErrorClass, InterruptReason, Prompt, PromptId,
    ProviderEvent, ProviderSettings, QueryHandle, QueryInput, Usage,
};

use super::approval::{self, Verdict};
use super::archiving;
use super::command;
use super::connection::{self, HttpError, PermissionReply, Server};
use super::protocol::{self, Event};
use super::server::{lock, resolve_session, Shared};
use super::translate::{Output, Turn};

/// How long an aborted run loop may take to settle before the restart is posted anyway.
const ABORT_SETTLE: Duration = Duration::from_secs(5);
/// Quiet time after an idle event before the loop counts as settled (an abort sends two idles
/// a few milliseconds apart).
const SETTLE_QUIET: Duration = Duration::from_millis(150);
/// How long a `/stop`ped run loop may take to go idle before the interrupt is reported as an
/// abort (the runner answers `/stop` within 2 s); other interrupts wait [`ABORT_SETTLE`].
const INTERRUPT_SETTLE: Duration = Duration::from_millis(1800);
/// How long a finished turn waits for the loop's idle before the next prompt goes in anyway.
const IDLE_WAIT: Duration = Duration::from_secs(3);
/// How many of the last messages to read when reconciling after an unexpected idle.
const RECONCILE_MESSAGES: usize = 20;
/// Pause between the two checks of a reconciliation.
const RECONCILE_PAUSE: Duration = Duration::from_millis(500);
/// At most one `Output` event per this interval goes to the runner.
const OUTPUT_INTERVAL: Duration = Duration::from_millis(500);

fn aborted_error() -> ProviderEvent {
    ProviderEvent::Error {
        message: "aborted".into(),
        retryable: false,
        classification: ErrorClass::Aborted,
        ends_turn: true,
        usage: None,
    }
}

/// `event` (an error that ends the turn) with what the turn cost until then.
fn with_usage(mut event: ProviderEvent, turn_usage: Option<Usage>) -> ProviderEvent {
    if let ProviderEvent::Error { usage, .. } = &mut event {
        *usage = turn_usage;
    }
    event
}

fn process_error(message: impl Into<String>) -> ProviderEvent {
    ProviderEvent::Error {
        message: message.into(),
        retryable: true,
        classification: ErrorClass::Process,
        ends_turn: true,
        usage: None,
    }
}

/// One query, from waiting for the server to releasing it.
pub(super) async fn run_query(
    shared: Arc<Shared>,
    input: QueryInput,
    handle: QueryHandle,
    stop: CancellationToken,
) {
    let mut slot = tokio::select! {
        slot = shared.slot.lock() => slot,
        _ = stop.cancelled() => {
            let _ = handle.events.send(aborted_error()).await;
            return;
        }
    };
    let server = match shared.ensure_server(&mut slot, &input).await {
        Ok(server) => server,
        Err(message) => {
            // The runner logs the error it becomes, once, with its class.
            tracing::debug!(error = %message, "cannot start opencode serve");
            let _ = handle
                .events
                .send(process_error(format!(
                    "cannot start opencode serve: {message}"
                )))
                .await;
            return;
        }
    };
    let (outcome, session_id) = Driver::start(&shared, server, input, handle, stop).await;
    if outcome == Outcome::KillServer {
        if let Some(mut server) = slot.take() {
            server.stop().await;
        }
        *lock(&shared.pid) = None;
        // Nothing to read from; the next archive of the session catches up.
        return;
    }
    let (Some(session_id), Some(api)) = (session_id, slot.as_ref().map(Server::api)) else {
        return;
    };
    // The stream is closed and the run loop settled. The archive lock is taken before the
    // server is released, so a shutdown (which needs the server first) waits for this archive;
    // the next query may run meanwhile, and its messages come after the cutoff.
    let job = archiving::Job {
        api,
        session_id,
        cutoff: shared.message_id(),
    };
    let guard = shared.archive.reserve();
    drop(slot);
    let settings = &shared.settings;
    shared
        .archive
        .run(guard, job, |job| archiving::archive_session(settings, job))
        .await;
}

/// How a query ended, for the server's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The server is fine; keep it for the next query.
    KeepServer,
    /// The server is dead, hung or unusable: stop it (the next query starts a new one).
    KillServer,
}

/// Why the event loop stopped.
#[derive(Debug, Clone, PartialEq)]
enum Exit {
    /// Every prompt is answered and the runner said End.
    Done,
    /// The turn failed (the error was sent).
    Failed,
    /// The runner aborted or dropped the query.
    Aborted,
    /// The runner interrupted the turn, or it reached `maxTurnsPerQuery`.
    Interrupted(InterruptReason),
    /// The provider is shutting down.
    Shutdown,
    /// No session event for too long.
    Watchdog(Duration),
    /// The SSE stream ended or broke.
    Lost(String),
}

/// A pending restart (or a post waiting for the loop's idle).
#[derive(Debug, Clone, Copy)]
struct Settle {
    deadline: Instant,
    quiet_until: Option<Instant>,
}

impl Settle {
    fn next_check(&self) -> Instant {
        match self.quiet_until {
            Some(quiet) => quiet.min(self.deadline),
            None => self.deadline,
        }
    }
}

struct Driver<'a> {
    shared: &'a Shared,
    server: &'a mut Server,
    turn: Turn,
    events: Option<mpsc::Sender<ProviderEvent>>,
    control: mpsc::UnboundedReceiver<Control>,
    stop: CancellationToken,
    system: Option<String>,
    /// The model every prompt names (the query's `/model` choice or the configured one), so a
    /// prompt never inherits another message's model.
    model: String,
    /// Set when the turn must end as interrupted (the max-turns limit was reached).
    interrupt: Option<InterruptReason>,
    unsent: Vec<(PromptId, Prompt)>,
    settle: Option<Settle>,
    ended: bool,
    /// The run loop went idle after our last post.
    loop_idle: bool,
    /// The server stopped answering requests: replace it after this query.
    kill_server: bool,
    last_activity: Instant,
    /// When the last `Output` went to the runner.
    last_output_sent: Option<Instant>,
    /// `permission.asked` requests waiting for the runner's answer, by id, each with why its
    /// command could not be decided when that is why it is asked (for the refusal).
    pending: BTreeMap<String, Option<String>>,
}

impl<'a> Driver<'a> {
    /// Runs the query; returns the server's fate and the session when a prompt was posted to it
    /// (the session to archive).
    async fn start(
        shared: &'a Shared,
        server: &'a mut Server,
        input: QueryInput,
        handle: QueryHandle,
        stop: CancellationToken,
    ) -> (Outcome, Option<String>) {
        let QueryHandle { events, control } = handle;
        let system = system_text(&shared.settings, input.system_prompt.as_deref());
        let model = input
            .model
            .clone()
            .unwrap_or_else(|| command::model(&shared.settings).to_owned());
        if !input.prompt.media.is_empty() {
            tracing::debug!(
                files = input.prompt.media.len(),
                "OpenCode gets attachments as the paths in the prompt text"
            );
        }
        let session_id = match resolve_session(server, input.continuation.as_deref(), &events).await
        {
            Ok(id) => id,
            Err((message, server_broken)) => {
                let _ = events.send(process_error(message)).await;
                // A server that does not answer is replaced on the next query.
                let outcome = if server_broken {
                    Outcome::KillServer
                } else {
                    Outcome::KeepServer
                };
                return (outcome, None);
            }
        };
        if events
            .send(ProviderEvent::Init {
                session_id: session_id.clone(),
            })
            .await
            .is_err()
        {
            return (Outcome::KeepServer, None);
        }
        let mut stream = match server.subscribe().await {
            Ok(stream) => stream,
            Err(err) => {
                let _ = events
                    .send(process_error(format!(
                        "cannot read OpenCode's event stream: {err}"
                    )))
                    .await;
                return (Outcome::KillServer, None);
            }
        };
        shared.record(json!({ "query": {
            "session": session_id,
            "max_retries": shared.settings.max_retries,
            "max_turns": shared.settings.max_turns_per_query,
            "approval_stops": shared.settings.approval_stop_tools,
        } }));
        let mut turn = Turn::new(session_id, shared.settings.max_retries);
        turn.set_max_turns(shared.settings.max_turns_per_query);
        turn.add_mcp_servers(
            shared
                .settings
                .extra_mcp_servers
                .keys()
                .chain(shared.settings.remote_mcp_servers.keys()),
        );
        turn.set_approval_stops(&shared.settings.approval_stop_tools);
        let mut driver = Driver {
            shared,
            server,
            turn,
            events: Some(events),
            control,
            stop,
            system,
            model,
            interrupt: None,
            unsent: vec![(0, input.prompt)],
            settle: None,
            ended: false,
            loop_idle: true,
            kill_server: false,
            last_activity: Instant::now(),
            last_output_sent: None,
            pending: BTreeMap::new(),
        };
        driver.flush().await;
        let exit = driver.run(&mut stream).await;
        let session_id = driver.turn.session_id().to_owned();
        (driver.finish(exit, &mut stream).await, Some(session_id))
    }

    async fn run(&mut self, stream: &mut connection::EventStream) -> Exit {
        loop {
            if self.turn.failed() {
                return Exit::Failed;
            }
            if let Some(reason) = self.interrupt {
                return Exit::Interrupted(reason);
            }
            if self.ended
                && self.turn.all_covered()
                && self.unsent.is_empty()
                && self.settle.is_none()
            {
                return Exit::Done;
            }
            if self.events.is_none() {
                return Exit::Aborted;
            }
            let limit = self.watchdog_limit();
            let watchdog = tokio::time::Instant::from_std(self.last_activity + limit);
            let settle_at = self
                .settle
                .map(|s| tokio::time::Instant::from_std(s.next_check()));
            tokio::select! {
                _ = self.stop.cancelled() => return Exit::Shutdown,
                item = stream.next() => match item {
                    Some(Ok(data)) => self.on_data(&data).await,
                    Some(Err(err)) => return Exit::Lost(format!("OpenCode's event stream broke: {err}")),
                    None => return Exit::Lost("OpenCode's event stream ended".into()),
                },
                control = self.control.recv() => match control {
                    Some(Control::Push { id, prompt }) => {
                        self.shared.record(json!({ "push": id }));
                        self.on_push(id, prompt).await;
                    }
                    Some(Control::End) => {
                        self.shared.record(json!({ "end": true }));
                        self.ended = true;
                    }
                    Some(Control::Interrupt) => {
                        self.shared.record(json!({ "interrupt": true }));
                        return Exit::Interrupted(InterruptReason::Stopped);
                    }
                    Some(Control::Approval { id, answer }) => {
                        self.shared.record(json!({ "approval": id }));
                        self.on_approval(&id, answer).await;
                    }
                    // A closed control channel means the runner dropped the query.
                    Some(Control::Abort) | None => {
                        self.shared.record(json!({ "abort": true }));
                        return Exit::Aborted;
                    }
                },
                _ = tokio::time::sleep_until(watchdog) => return Exit::Watchdog(limit),
                _ = async {
                    match settle_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => self.on_settle_tick().await,
            }
        }
    }

    /// The watchdog: `settings.watchdog`, or the MCP timeout while a tool runs (a blocking
    /// tool such as ask_user_question is silent for up to `settings.tool_timeout`).
    fn watchdog_limit(&self) -> Duration {
        watchdog_limit(
            &self.shared.settings,
            self.turn.tool_running(),
            !self.pending.is_empty(),
        )
    }

    /// Tells the turn (and the recording) whether we abort on purpose.
    fn set_aborting(&mut self, aborting: bool) {
        self.turn.set_aborting(aborting);
        self.shared.record(json!({ "aborting": aborting }));
    }

    async fn send(&mut self, event: ProviderEvent) {
        if event == ProviderEvent::Output {
            // One per interval is enough for the runner's progress deadline (deltas come per
            // token).
            let now = Instant::now();
            if self
                .last_output_sent
                .is_some_and(|last| now.duration_since(last) < OUTPUT_INTERVAL)
            {
                return;
            }
            self.last_output_sent = Some(now);
        }
        if let Some(events) = &self.events {
            if events.send(event).await.is_err() {
                // The runner dropped the query: same as an abort.
                self.events = None;
            }
        }
    }

    async fn on_data(&mut self, data: &str) {
        let raw: Value = serde_json::from_str(data).unwrap_or_else(|_| json!(data));
        self.shared.record(json!({ "in": raw }));
        let event = match Event::parse(data) {
            Ok(event) => event,
            Err(err) => {
                tracing::debug!(%err, %data, "unreadable OpenCode event");
                return;
            }
        };
        if event.session_id() == Some(self.turn.session_id()) {
            self.last_activity = Instant::now();
            if let Some(settle) = &mut self.settle {
                if settle.quiet_until.is_some() {
                    settle.quiet_until = Some(Instant::now() + SETTLE_QUIET);
                }
            }
        }
        match &event {
            Event::Other { kind, session_id } => {
                tracing::trace!(%kind, ?session_id, "OpenCode event");
            }
            Event::SessionError {
                session_id: None,
                error,
            } => {
                tracing::warn!(error = %error.text(), "OpenCode reported an error outside a session")
            }
            _ => {}
        }
        for output in self.turn.handle(&event) {
            self.on_output(output).await;
        }
    }

    async fn on_output(&mut self, output: Output) {
        match output {
            Output::Event(event) => {
                match &event {
                    ProviderEvent::Result { covers, text, .. } => {
                        tracing::debug!(covers, chars = text.len(), "OpenCode turn answered");
                    }
                    ProviderEvent::Error {
                        message, ends_turn, ..
                    // The runner logs each error event once, with its class: not here too.
                    } => tracing::debug!(error = %message, ends_turn, "OpenCode error"),
                    _ => {}
                }
                self.send(event).await;
            }
            Output::Idle => self.on_idle().await,
            Output::MaxTurns => {
                tracing::info!(
                    max_turns = self.shared.settings.max_turns_per_query,
                    "the OpenCode turn reached maxTurnsPerQuery; stopping it"
                );
                self.interrupt = Some(InterruptReason::MaxTurns);
            }
            Output::AbortSession => {
                self.set_aborting(true);
                self.loop_idle = false;
                let session = self.turn.session_id().to_owned();
                if let Err(err) = self.server.abort(&session).await {
                    tracing::warn!(%err, "cannot abort OpenCode's retries");
                }
            }
            Output::Asked { kind, request_id } => {
                tracing::warn!(%kind, %request_id, "OpenCode waits for a decision; answering it");
                if let Err(err) = self.server.answer(&kind, &request_id).await {
                    tracing::warn!(%err, "cannot answer OpenCode's request");
                }
            }
            Output::Permission { asked, part } => self.on_permission(asked, part).await,
            Output::ApprovalStop => {
                tracing::info!("an approval-stop tool returned; ending the OpenCode turn");
                self.interrupt = Some(InterruptReason::ApprovalStop);
            }
        }
    }

    /// A `permission.asked`: decided by the tool policy (`approval.rs`); an `ask` goes to the
    /// runner and waits for its answer. An unrestricted policy answers `once` as before.
    async fn on_permission(&mut self, asked: approval::Asked, part: Option<(String, Value)>) {
        let policy = &self.shared.settings.tool_policy;
        if policy.allows_everything() {
            self.send(ProviderEvent::Progress {
                message: "OpenCode asked for a decision (permission.asked); answering it".into(),
            })
            .await;
            self.reply(&asked.id, PermissionReply::Once).await;
            return;
        }
        let part = part.as_ref().map(|(tool, input)| (tool.as_str(), input));
        match approval::decide(policy, &asked, part, self.turn.mcp_servers()) {
            Verdict::Allow => self.reply(&asked.id, PermissionReply::Once).await,
            Verdict::Deny(call, undecidable) => {
                tracing::info!(tool = %call.tool, ?undecidable, "tool call denied by the policy");
                let message = match undecidable.as_deref() {
                    Some(reason) => refusal::message(&call.tool, Some(reason)),
                    None => approval::POLICY_DENIAL.to_owned(),
                };
                self.reply(&asked.id, PermissionReply::Reject(&message))
                    .await;
                self.send(refusal::event(call, undecidable.as_deref()))
                    .await;
            }
            Verdict::Ask(call, undecidable) => {
                tracing::info!(tool = %call.tool, request = %asked.id, ?undecidable, "tool call waits for the user's approval");
                self.pending.insert(asked.id.clone(), undecidable.clone());
                self.send(ProviderEvent::ApprovalRequest(ApprovalRequest {
                    id: asked.id,
                    kind: call.ask(undecidable),
                }))
                .await;
            }
        }
    }

    /// The runner's answer to a request this query sent.
    async fn on_approval(&mut self, id: &str, answer: ApprovalAnswer) {
        let Some(undecidable) = self.pending.remove(id) else {
            tracing::debug!(request = id, "an answer to no pending OpenCode request");
            return;
        };
        // The wait is over: the watchdog counts from here.
        self.last_activity = Instant::now();
        match rejection(&answer, undecidable.as_deref()) {
            None => self.reply(id, PermissionReply::Once).await,
            Some(message) => self.reply(id, PermissionReply::Reject(&message)).await,
        }
    }

    /// Refuses every request still waiting for the runner (the query ends without its answer).
    async fn reject_pending(&mut self, reason: &str) {
        for (id, undecidable) in std::mem::take(&mut self.pending) {
            tracing::info!(request = %id, "an approval still pending is denied: {reason}");
            let message = refusal::not_approved(reason, undecidable.as_deref());
            self.reply(&id, PermissionReply::Reject(&message)).await;
        }
    }

    async fn reply(&mut self, request_id: &str, reply: PermissionReply<'_>) {
        self.shared.record(
            json!({ "permission_reply": { "id": request_id, "reply": format!("{reply:?}") } }),
        );
        match self.server.reply_permission(request_id, reply).await {
            Ok(()) => {}
            // Gone with an aborted loop.
            Err(HttpError::NotFound(_)) => {
                tracing::debug!(
                    request = request_id,
                    "OpenCode's permission request is gone"
                );
            }
            Err(err) => {
                tracing::warn!(%err, request = request_id, "cannot answer OpenCode's permission request");
            }
        }
    }

    async fn on_idle(&mut self) {
        self.loop_idle = true;
        if let Some(settle) = &mut self.settle {
            settle.quiet_until = Some(Instant::now() + SETTLE_QUIET);
            return;
        }
        if self.turn.failed() || self.turn.all_covered() {
            return;
        }
        self.reconcile().await;
    }

    /// The run loop stopped without answering our latest prompt: read the messages (events may
    /// have been missed); if the prompt is still unanswered, fail the turn so the runner
    /// retries it.
    async fn reconcile(&mut self) {
        let session = self.turn.session_id().to_owned();
        // Twice, a moment apart: a loop that was about to start for our prompt is busy by then.
        for check in 0..2 {
            if check > 0 {
                tokio::time::sleep(RECONCILE_PAUSE).await;
            }
            match self.server.is_busy(&session).await {
                Ok(true) => return,
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(%err, "cannot read OpenCode's session status");
                    return;
                }
            }
            let listed = self
                .server
                .messages(&session, RECONCILE_MESSAGES)
                .await
                .map_err(|err| err.to_string())
                .and_then(|raw| {
                    self.shared.record(json!({ "messages": raw }));
                    serde_json::from_value::<Vec<protocol::MessageWithParts>>(raw)
                        .map_err(|err| format!("unreadable message list: {err}"))
                });
            match listed {
                Ok(messages) => {
                    for output in self.turn.reconcile(&messages) {
                        if let Output::Event(event) = output {
                            self.send(event).await;
                        }
                    }
                }
                Err(err) => tracing::warn!(%err, "cannot read OpenCode's messages"),
            }
            if self.turn.all_covered() || self.turn.failed() {
                return;
            }
        }
        if !self.turn.all_covered() && !self.turn.failed() {
            self.turn.fail();
            let usage = self.turn.take_usage();
            self.send(ProviderEvent::Error {
                message: "OpenCode stopped without answering the prompt".into(),
                retryable: true,
                classification: ErrorClass::Other,
                ends_turn: true,
                usage,
            })
            .await;
        }
    }

    async fn on_push(&mut self, id: PromptId, prompt: Prompt) {
        self.unsent.push((id, prompt));
        if self.settle.is_some() || self.turn.failed() {
            return;
        }
        if self.turn.all_covered() {
            if self.loop_idle {
                self.flush().await;
            } else {
                self.settle = Some(Settle {
                    deadline: Instant::now() + IDLE_WAIT,
                    quiet_until: None,
                });
            }
        } else if self.turn.tool_running() {
            tracing::info!(
                prompt = id,
                "follow-up queued into the running OpenCode turn"
            );
            self.flush().await;
        } else {
            tracing::info!(
                prompt = id,
                "follow-up: aborting the OpenCode turn to restart it"
            );
            self.set_aborting(true);
            let session = self.turn.session_id().to_owned();
            if let Err(err) = self.server.abort(&session).await {
                tracing::warn!(%err, "cannot abort the OpenCode turn; the follow-up is queued instead");
            }
            // The abort is done when the call returns; its idle events may still be in flight,
            // hence the quiet period (and the deadline if OpenCode stays busy).
            let quiet_until = match self.server.is_busy(&session).await {
                Ok(false) => Some(Instant::now() + SETTLE_QUIET),
                _ => None,
            };
            self.settle = Some(Settle {
                deadline: Instant::now() + ABORT_SETTLE,
                quiet_until,
            });
        }
    }

    async fn on_settle_tick(&mut self) {
        let Some(settle) = self.settle else { return };
        let now = Instant::now();
        let quiet = settle.quiet_until.is_some_and(|quiet| now >= quiet);
        if !quiet && now < settle.deadline {
            return;
        }
        if !quiet {
            tracing::warn!(
                "OpenCode's run loop did not settle in time; posting the follow-up anyway"
            );
        }
        self.flush().await;
    }

    /// Posts every unsent prompt as one user message.
    async fn flush(&mut self) {
        self.settle = None;
        if self.turn.aborting() {
            self.set_aborting(false);
        }
        if self.unsent.is_empty() || self.turn.failed() {
            return;
        }
        let prompts = std::mem::take(&mut self.unsent);
        let highest = prompts.iter().map(|(id, _)| *id).max().unwrap_or_default();
        let text = prompts
            .iter()
            .map(|(_, prompt)| prompt.text.as_str())
            .collect::<Vec<_>>()
            .join("\n\n");
        let ids: Vec<PromptId> = prompts.iter().map(|(id, _)| *id).collect();
        for attempt in 0..2 {
            let message_id = self.shared.message_id();
            let mut body = json!({
                "messageID": message_id,
                "parts": [{ "type": "text", "text": text }],
                "model": { "providerID": command::MODEL_PROVIDER, "modelID": self.model },
            });
            if let Some(system) = &self.system {
                body["system"] = json!(system);
            }
            self.turn.posted(message_id.clone(), highest);
            self.shared
                .record(json!({ "post": { "message_id": message_id, "prompts": ids } }));
            self.loop_idle = false;
            self.last_activity = Instant::now();
            let session = self.turn.session_id().to_owned();
            match self.server.prompt(&session, body).await {
                Ok(()) => {
                    tracing::debug!(prompts = ?ids, message_id = %message_id, "prompt posted to OpenCode");
                    return;
                }
                Err(err) => {
                    self.turn.unpost(&message_id);
                    let retry = attempt == 0 && matches!(err, HttpError::Transport(_));
                    if retry && self.server.is_alive() {
                        tracing::warn!(%err, "posting to OpenCode failed; trying once more");
                        continue;
                    }
                    self.turn.fail();
                    // Nothing runs for the prompt; a server that does not answer is replaced.
                    self.loop_idle = true;
                    self.kill_server |= matches!(err, HttpError::Transport(_));
                    self.send(process_error(format!(
                        "cannot post the prompt to OpenCode: {err}"
                    )))
                    .await;
                    return;
                }
            }
        }
    }

    /// Reports how the query ended, closes the event stream, and leaves the session settled
    /// (idle) for the next query.
    async fn finish(mut self, exit: Exit, stream: &mut connection::EventStream) -> Outcome {
        tracing::debug!(?exit, "OpenCode query finished");
        // An abort (ours, by `report`) ends a call that waits for an approval, and no model
        // request follows; a reject first would let the loop go on to one. A query that ends
        // any other way rejects the requests first. A dead server has none left.
        let aborts = matches!(exit, Exit::Aborted | Exit::Interrupted(_));
        let server_gone = matches!(exit, Exit::Lost(_) | Exit::Watchdog(_) | Exit::Shutdown);
        if !aborts && !server_gone {
            self.reject_pending("the turn ended before an answer").await;
        }
        let outcome = self.report(exit, stream).await;
        if aborts {
            self.reject_pending("the turn ended before an answer").await;
        }
        if self.kill_server {
            Outcome::KillServer
        } else {
            outcome
        }
    }

    async fn report(&mut self, exit: Exit, stream: &mut connection::EventStream) -> Outcome {
        match exit {
            Exit::Done => {
                self.events = None;
                self.wait_idle(stream, IDLE_WAIT).await;
                Outcome::KeepServer
            }
            Exit::Failed => {
                self.events = None;
                self.wait_idle(stream, ABORT_SETTLE).await;
                Outcome::KeepServer
            }
            Exit::Aborted => {
                let usage = self.turn.take_usage();
                self.send(with_usage(aborted_error(), usage)).await;
                self.events = None;
                if !self.turn.all_covered() || !self.loop_idle {
                    self.set_aborting(true);
                    self.loop_idle = false;
                    if let Err(err) = self.server.abort(self.turn.session_id()).await {
                        tracing::warn!(%err, "cannot abort the OpenCode turn");
                    }
                }
                self.wait_idle(stream, ABORT_SETTLE).await;
                Outcome::KeepServer
            }
            Exit::Interrupted(reason) => self.interrupt(reason, stream).await,
            Exit::Shutdown => {
                let usage = self.turn.take_usage();
                self.send(with_usage(aborted_error(), usage)).await;
                Outcome::KillServer
            }
            Exit::Watchdog(limit) => {
                tracing::error!(?limit, "no output from OpenCode; killing it");
                let usage = self.turn.take_usage();
                self.send(ProviderEvent::Error {
                    message: format!(
                        "no output from OpenCode for {}s; killed it",
                        limit.as_secs()
                    ),
                    retryable: true,
                    classification: ErrorClass::Watchdog,
                    ends_turn: true,
                    usage,
                })
                .await;
                Outcome::KillServer
            }
            Exit::Lost(reason) => {
                let status = self.server.wait_exit(Duration::from_secs(1)).await;
                let message = match status {
                    Some(status) => format!("opencode serve exited ({status})"),
                    None => reason,
                };
                // The runner logs the error it becomes, once, with its class.
                tracing::debug!(error = %message, "lost the OpenCode server");
                let usage = self.turn.take_usage();
                self.send(with_usage(process_error(message), usage)).await;
                Outcome::KillServer
            }
        }
    }

    /// Ends the turn through OpenCode's abort: `POST /session/{id}/abort`, then the loop's idle
    /// (bounded by [`INTERRUPT_SETTLE`]) and `Interrupted` with the prompts the model saw and
    /// what the turn cost. A loop that does not settle in time is reported as an abort (as
    /// `Control::Abort` is) and given [`ABORT_SETTLE`]. The server and the session live on.
    async fn interrupt(
        &mut self,
        reason: InterruptReason,
        stream: &mut connection::EventStream,
    ) -> Outcome {
        let started = tokio::time::Instant::now();
        // Only a `/stop` has a 2 s answer to keep; an approval stop or the turn limit gives a
        // loaded machine's OpenCode the abort's settle time (1.8 s once turned an approval stop
        // into a failed turn in CI).
        let settle = match reason {
            InterruptReason::Stopped => INTERRUPT_SETTLE,
            InterruptReason::ApprovalStop | InterruptReason::MaxTurns => ABORT_SETTLE,
        };
        // Not sent yet: not seen, not covered; the runner runs them again.
        self.unsent.clear();
        self.settle = None;
        self.set_aborting(true);
        if !self.loop_idle {
            let session = self.turn.session_id().to_owned();
            match tokio::time::timeout(settle, self.server.abort(&session)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::warn!(%err, "cannot abort the OpenCode turn"),
                Err(_) => tracing::warn!("OpenCode did not answer the abort in time"),
            }
            let left = settle.saturating_sub(started.elapsed());
            self.wait_idle(stream, left).await;
        }
        if !self.loop_idle {
            tracing::warn!(
                ?reason,
                "OpenCode's run loop did not stop in time; reporting an abort"
            );
            let usage = self.turn.take_usage();
            self.send(with_usage(aborted_error(), usage)).await;
            self.events = None;
            self.wait_idle(stream, ABORT_SETTLE).await;
            return Outcome::KeepServer;
        }
        let covers = self.turn.seen();
        let usage = self.turn.take_usage();
        tracing::info!(
            ?reason,
            covers,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "OpenCode turn interrupted"
        );
        self.send(ProviderEvent::Interrupted {
            covers,
            usage,
            reason,
        })
        .await;
        self.events = None;
        Outcome::KeepServer
    }

    /// Reads events until the session's loop is idle (and quiet for a moment), or `limit`. The
    /// events still go through the turn, so the steps that finish meanwhile count in its usage.
    async fn wait_idle(&mut self, stream: &mut connection::EventStream, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        let mut quiet_until: Option<tokio::time::Instant> = None;
        if self.loop_idle {
            return;
        }
        loop {
            let wake = quiet_until.map_or(deadline, |quiet| quiet.min(deadline));
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep_until(wake) => return,
                item = stream.next() => match item {
                    Some(Ok(data)) => {
                        let raw: Value = serde_json::from_str(&data).unwrap_or_else(|_| json!(data));
                        self.shared.record(json!({ "in": raw }));
                        let Ok(event) = Event::parse(&data) else { continue };
                        if event.session_id() != Some(self.turn.session_id()) {
                            continue;
                        }
                        for output in self.turn.handle(&event) {
                            if let Output::Event(event) = output {
                                self.send(event).await;
                            }
                        }
                        if matches!(event, Event::Idle { .. }) {
                            self.loop_idle = true;
                            quiet_until = Some(tokio::time::Instant::now() + SETTLE_QUIET);
                        } else if quiet_until.is_some() {
                            quiet_until = Some(tokio::time::Instant::now() + SETTLE_QUIET);
                        }
                    }
                    _ => return,
                },
            }
        }
    }
}

/// What the model is told when the runner's `answer` refuses an asked call (`None`: approved);
/// `undecidable`: why the call's command could not be decided, when that is why it was asked.
fn rejection(answer: &ApprovalAnswer, undecidable: Option<&str>) -> Option<String> {
    let reason = match answer {
        ApprovalAnswer::Allow => return None,
        ApprovalAnswer::Deny { reason } => reason.as_str(),
        // Tool calls are approved or denied; anything else is no approval.
        ApprovalAnswer::Reply(_) => "not approved",
    };
    Some(refusal::not_approved(reason, undecidable))
}

/// How long a turn may go without a session event: `settings.watchdog`; while a tool runs, at
/// least the MCP timeout (a blocking tool such as ask_user_question is silent for up to
/// `settings.tool_timeout`); while a permission request waits for the runner, at least the ask
/// timeout plus the watchdog (OpenCode waits silently; the runner answers, a deny at the
/// latest, within the ask timeout).
fn watchdog_limit(
    settings: &ProviderSettings,
    tool_running: bool,
    approval_pending: bool,
) -> Duration {
    let mut limit = settings.watchdog;
    if tool_running {
        limit = limit.max(settings.tool_timeout + command::TOOL_TIMEOUT_MARGIN);
    }
    if approval_pending {
        limit = limit.max(settings.tool_policy.ask_timeout + settings.watchdog);
    }
    limit
}

/// The `system` text of every prompt: the runner's system prompt plus the extra directories.
/// It goes with every prompt because OpenCode applies the system text of the latest user
/// message, which also makes it survive a server restart.
fn system_text(settings: &ProviderSettings, system_prompt: Option<&str>) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(prompt) = system_prompt.filter(|p| !p.trim().is_empty()) {
        parts.push(prompt.to_owned());
    }
    if !settings.extra_dirs.is_empty() {
        let dirs: Vec<String> = settings
            .extra_dirs
            .iter()
            .map(|dir| format!("- {}", dir.display()))
            .collect();
        parts.push(format!(
            "Additional directories you may read and write:\n{}",
            dirs.join("\n")
        ));
    }
    (!parts.is_empty()).then(|| parts.join("\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 41: an asked call whose command could not be decided is refused with why (write
    /// the command literally); any other keeps the runner's reason as it is.
    #[test]
    fn a_refused_undecidable_call_tells_the_model_why() {
        let why = "the command could not be decided: the program name is not a literal ($X): write the command literally";
        let denied = ApprovalAnswer::Deny {
            reason: "denied by the user".into(),
        };
        let cases = [
            rejection(&denied, Some(why)),
            rejection(&denied, None),
            rejection(&ApprovalAnswer::Reply("maybe".into()), Some(why)),
            rejection(&ApprovalAnswer::Allow, Some(why)),
        ];
        expect_test::expect![[r#"
            [
                Some(
                    "denied by the user; the command could not be decided: the program name is not a literal ($X): write the command literally",
                ),
                Some(
                    "denied by the user",
                ),
                Some(
                    "not approved; the command could not be decided: the program name is not a literal ($X): write the command literally",
                ),
                None,
            ]
        "#]]
        .assert_debug_eq(&cases);
    }

    #[test]
    fn the_watchdog_waits_for_a_pending_approval() {
        let mut settings = ProviderSettings::for_workspace("/workspace", "opencode");
        settings.watchdog = Duration::from_secs(60);
        settings.tool_timeout = Duration::from_secs(30);
        settings.tool_policy.ask_timeout = Duration::from_secs(600);
        let secs = |settings: &ProviderSettings, running, pending| {
            watchdog_limit(settings, running, pending).as_secs()
        };
        assert_eq!(
            [
                secs(&settings, false, false),
                secs(&settings, true, false),
                secs(&settings, true, true),
                secs(&settings, false, true)
            ],
            [60, 90, 660, 660]
        );
        settings.tool_policy.ask_timeout = Duration::from_secs(5);
        assert_eq!(
            secs(&settings, true, true),
            90,
            "never shorter than the running tool's"
        );
    }
}
