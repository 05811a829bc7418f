//! The query state machine: what to send to app-server and which events to emit, given the
//! runner's controls and app-server's notifications. It does no I/O (the driver in `driver.rs`
//! does), so the translation is unit-tested against captured app-server output.
//!
//! Prompt bookkeeping: prompt 0 is the query's first prompt, pushes are 1, 2, ... A prompt is
//! *covered* once a turn that contained it completed: the input of `turn/start` when the turn
//! completes normally, a steered input once Codex echoed it as a `userMessage` item of that turn.
//! `Result.covers` is the highest covered id, so it never claims a prompt the model has not seen.
//!
//! Usage: Codex sends `thread/tokenUsage/updated` once per model response, with the response's
//! figures (`last`) and the thread's running total; a repeat of the same total is not a new
//! response. The figures are summed until a turn-ending event carries them (a turn restarted
//! for a push passes them on to the turn that answers), and the responses are counted as the
//! turn's requests, which is also what `maxTurnsPerQuery` limits.
//!
//! Stopping (the runner's interrupt, the step limit, or an approval-stop tool's result):
//! `turn/interrupt`, then the turn's `turn/completed` (interrupted) answers with `Interrupted`
//! and the query closes; the process and the thread stay. Pushes that did not reach the model
//! are not covered.
//!
//! Approvals (under a tool policy, `approvals.rs`): a gated server request is answered at once
//! when the policy allows or denies it (a denial also emits `ToolDenied`), or becomes an
//! `ApprovalRequest` answered when the runner's `Control::Approval` comes. Requests still open
//! when the turn is stopped, aborted or the query closes are declined.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::approvals::{self, Reply, Verdict};
use super::command::APPROVAL_STOP_HOOK_STATUS;
use super::protocol::{
    input_text, user_input, AgentMessageDelta, ErrorNotification, ItemNotification,
    MessageNotification, ModelRerouted, RequestId, TokenBreakdown, TokenUsageNotification,
    TurnError, TurnNotification,
};
use provider::driver::classify::classify;
use provider::driver::refusal;
use provider::policy::Call;
use provider::{
    ApprovalAnswer, ApprovalKind, ApprovalRequest, Control, ElicitationMode, ErrorClass,
    InterruptReason, Prompt, PromptId, ProviderEvent, ToolPolicy, Usage,
};

/// How long a push waits for a running tool before interrupting anyway. Interrupting while a
/// tool runs loses its result from the model's view (Codex records "aborted by user") even if the
/// tool finished its work, e.g. a `send_message` that was written: the model could send it again.
pub(super) const PUSH_TOOL_GRACE: Duration = Duration::from_secs(10);

/// At most one `Activity { tool: None }` per this interval (deltas arrive per token).
pub(super) const ACTIVITY_INTERVAL: Duration = Duration::from_secs(1);

/// What the driver must do.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Action {
    /// Send an event to the runner.
    Emit(ProviderEvent),
    /// Send `turn/start` with this input, then call [`QueryState::on_turn_started`] or
    /// [`QueryState::on_request_failed`].
    StartTurn {
        /// The `input` array.
        input: Vec<Value>,
    },
    /// Send `turn/steer`; on an error response call [`QueryState::on_steer_failed`].
    Steer {
        /// The active turn (`expectedTurnId`).
        turn_id: String,
        /// The pushed prompt.
        id: PromptId,
        /// The `input` array.
        input: Vec<Value>,
    },
    /// Send `turn/interrupt`.
    Interrupt {
        /// The turn to interrupt.
        turn_id: String,
    },
    /// Append a developer note to the thread's history (`thread/inject_items`), before the
    /// events that follow.
    Note {
        /// The note.
        text: String,
    },
    /// Answer the server request `id` (an approval) with `result`.
    Respond {
        /// The request's JSON-RPC id.
        id: RequestId,
        /// The result.
        result: Value,
    },
    /// The query is over: drop the event sender.
    Close,
}

/// An approval request waiting for the runner's answer.
#[derive(Debug)]
struct OpenApproval {
    rpc_id: RequestId,
    reply: Reply,
    /// Why the call's command could not be decided, when that is why it is asked: a refusal
    /// then tells the model (a note, as for a policy deny).
    undecidable: Option<String>,
}

/// Why we interrupted the active turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// Abort-and-restart for a follow-up.
    Push,
    /// The runner aborted (or dropped) the query.
    Abort,
    /// The runner's interrupt or the step limit: the turn ends with `Interrupted`.
    Stop(InterruptReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interrupt {
    None,
    /// Wanted, not sent yet (turn id unknown, or a tool is running) since this instant.
    Wanted(Cause, Instant),
    Sent(Cause),
}

#[derive(Debug)]
struct ActiveTurn {
    /// Known once `turn/start` answered.
    id: Option<String>,
    /// The prompts of `turn/start`.
    started_with: Vec<(PromptId, Prompt)>,
    /// Pushes sent with `turn/steer`: (id, prompt, expected userMessage text, echoed yet).
    steered: Vec<(PromptId, Prompt, String, bool)>,
    interrupt: Interrupt,
    /// Running tool items: item id → tool name.
    tools: BTreeMap<String, String>,
    /// Agent message text streamed so far, per item.
    deltas: HashMap<String, String>,
    /// The last completed agent message of the turn.
    last_message: Option<String>,
    /// The final error announced by an `error` notification (willRetry = false).
    error: Option<TurnError>,
    /// Model responses of this turn so far (one `thread/tokenUsage/updated` each).
    requests: u32,
    /// A tool started since the last counted response: that response asked for another step.
    step_called_tools: bool,
    /// The highest prompt this turn answers when stopped before the model responded: its own
    /// prompts, or for a restart those of the turn it replaces (the pushes that caused the
    /// restart were not acted on, so a stop leaves them to the runner to run again).
    own: Option<PromptId>,
    /// The model produced something in this turn (text, reasoning, a tool call, a response).
    responded: bool,
}

impl ActiveTurn {
    fn new(started_with: Vec<(PromptId, Prompt)>) -> Self {
        Self {
            id: None,
            started_with,
            steered: Vec::new(),
            interrupt: Interrupt::None,
            tools: BTreeMap::new(),
            deltas: HashMap::new(),
            last_message: None,
            error: None,
            requests: 0,
            step_called_tools: false,
            own: None,
            responded: false,
        }
    }

    /// The highest prompt a stop of this turn covers: every prompt of `turn/start` once the
    /// model responded (else the turn's [`own`](Self::own) ones), and the steered ones Codex
    /// echoed.
    fn seen(&self) -> Option<PromptId> {
        let started = if self.responded {
            self.started_with.iter().map(|(id, _)| *id).max()
        } else {
            self.own
        };
        let echoed = self
            .steered
            .iter()
            .filter(|(_, _, _, echoed)| *echoed)
            .map(|(id, ..)| *id);
        started.into_iter().chain(echoed).max()
    }

    fn owns(&self, turn_id: Option<&str>) -> bool {
        match (turn_id, self.id.as_deref()) {
            (Some(theirs), Some(ours)) => theirs == ours,
            // Events without a turn id belong to whatever runs; before turn/start answered,
            // nothing else can be running on this thread.
            _ => true,
        }
    }
}

/// The state of one query (see the module docs).
#[derive(Debug)]
pub(super) struct QueryState {
    steer: bool,
    /// Prompts waiting for the next `turn/start`, by id.
    queue: Vec<(PromptId, Prompt)>,
    active: Option<ActiveTurn>,
    /// The runner said `End`.
    ended: bool,
    /// The Aborted error was emitted; waiting for the turn to wind down.
    aborted: bool,
    closed: bool,
    covered: Option<PromptId>,
    last_activity: Option<Instant>,
    /// When the last `Output` was emitted (throttled like activity).
    last_output: Option<Instant>,
    /// The step limit of a turn (`maxTurnsPerQuery`).
    max_turns: Option<u32>,
    /// The model named in usage (the query's, the configured or the thread's; a reroute's).
    model: Option<String>,
    /// Usage counted and not yet reported by a turn-ending event.
    usage: Option<Usage>,
    /// The thread total of the last counted response (repeats are not new responses).
    last_total: Option<TokenBreakdown>,
    /// The turn is being stopped (the runner's interrupt or the step limit).
    stop: Option<InterruptReason>,
    /// What the turn interrupted for a push covered: the restart's own prompts.
    restart_base: Option<PromptId>,
    /// The tool policy the gated requests are judged by.
    policy: ToolPolicy,
    /// What general MCP elicitations get.
    elicitation: ElicitationMode,
    /// MCP tools (canonical names) whose result ends the turn.
    stop_tools: Vec<String>,
    /// Approval requests the runner has not answered, by our id.
    approvals: BTreeMap<String, OpenApproval>,
    /// The result of the approval-stop tool that stopped the turn: Codex records the
    /// interrupted call as "aborted by user", so the model is told the real result in a note.
    stop_result: Option<String>,
    /// The files of `fileChange` items seen, by item id (their approval requests name the item
    /// only).
    file_changes: HashMap<String, Vec<Call>>,
}

impl QueryState {
    /// The running turn, if a notification for `turn_id` belongs to it.
    fn active_turn(&mut self, turn_id: Option<&str>) -> Option<&mut ActiveTurn> {
        self.active.as_mut().filter(|t| t.owns(turn_id))
    }

    /// A query whose first prompt is `first`; `steer` selects native `turn/steer` for pushes.
    pub(super) fn new(first: Prompt, steer: bool) -> Self {
        Self {
            steer,
            queue: vec![(0, first)],
            active: None,
            ended: false,
            aborted: false,
            closed: false,
            covered: None,
            last_activity: None,
            last_output: None,
            max_turns: None,
            model: None,
            usage: None,
            last_total: None,
            stop: None,
            restart_base: None,
            policy: ToolPolicy::default(),
            elicitation: ElicitationMode::Decline,
            stop_tools: Vec::new(),
            approvals: BTreeMap::new(),
            stop_result: None,
            file_changes: HashMap::new(),
        }
    }

    /// Judges approval requests by `policy`, answers general elicitations per `elicitation`,
    /// and ends the turn after the result of a tool in `stop_tools`.
    pub(super) fn with_approvals(
        mut self,
        policy: ToolPolicy,
        elicitation: ElicitationMode,
        stop_tools: Vec<String>,
    ) -> Self {
        self.policy = policy;
        self.elicitation = elicitation;
        self.stop_tools = stop_tools;
        self
    }

    /// True while an approval request waits for the runner (the CLI waits too: the watchdog
    /// must not count it).
    pub(super) fn awaiting_approval(&self) -> bool {
        !self.approvals.is_empty()
    }

    /// Interrupts a turn whose model asks for another step after `max` responses.
    pub(super) fn with_max_turns(mut self, max: Option<u32>) -> Self {
        self.max_turns = max;
        self
    }

    /// The model that usage names until Codex reports a reroute.
    pub(super) fn with_model(mut self, model: Option<String>) -> Self {
        self.model = model;
        self
    }

    /// The usage counted and not yet reported (for an error the driver reports itself).
    pub(super) fn take_usage(&mut self) -> Option<Usage> {
        let mut usage = self.usage.take()?;
        if usage.model.is_none() {
            usage.model.clone_from(&self.model);
        }
        Some(usage)
    }

    /// The first actions: start the first turn.
    pub(super) fn begin(&mut self) -> Vec<Action> {
        let mut actions = Vec::new();
        self.next_turn(&mut actions);
        actions
    }

    /// True once [`Action::Close`] was produced.
    pub(super) fn is_closed(&self) -> bool {
        self.closed
    }

    /// True while a turn runs (the watchdog applies).
    pub(super) fn turn_active(&self) -> bool {
        self.active.is_some()
    }

    /// True while a tool runs in the active turn (the watchdog allows for the tool timeout).
    pub(super) fn tool_running(&self) -> bool {
        self.active
            .as_ref()
            .is_some_and(|turn| !turn.tools.is_empty())
    }

    /// True after an abort, until the turn has ended.
    pub(super) fn aborting(&self) -> bool {
        self.aborted && !self.closed
    }

    /// True while a turn is being stopped (interrupt or step limit), until it has ended.
    pub(super) fn stopping(&self) -> bool {
        self.stop.is_some() && !self.closed
    }

    /// Codex did not end a stopped turn in time (the driver stops the process): the turn ends
    /// here, as it would have.
    pub(super) fn on_stop_timeout(&mut self) -> Vec<Action> {
        let mut actions = Vec::new();
        if let Some(reason) = self.stop.filter(|_| !self.closed) {
            let seen = self.active.as_ref().and_then(ActiveTurn::seen);
            self.interrupted(reason, seen, &mut actions);
        }
        actions
    }

    /// A control from the runner; `None` = the runner dropped the query (abort).
    pub(super) fn on_control(&mut self, control: Option<Control>, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        // While stopping, the turn's end closes the query: later pushes are not consumed (the
        // runner runs them again) and an abort adds nothing.
        if self.closed || self.aborted || self.stop.is_some() {
            return actions;
        }
        match control {
            Some(Control::Push { id, prompt }) => self.on_push(id, prompt, now, &mut actions),
            Some(Control::End) => {
                self.ended = true;
                if self.active.is_none() && self.queue.is_empty() {
                    self.close(&mut actions);
                }
            }
            Some(Control::Interrupt) => self.on_stop(InterruptReason::Stopped, now, &mut actions),
            Some(Control::Approval { id, answer }) => self.on_approval(&id, &answer, &mut actions),
            Some(Control::Abort) | None => self.on_abort(now, &mut actions),
        }
        actions
    }

    /// The runner's answer to an approval request.
    fn on_approval(&mut self, id: &str, answer: &ApprovalAnswer, actions: &mut Vec<Action>) {
        match self.approvals.remove(id) {
            Some(open) => {
                // Codex's decline carries no reason: why a command asked about because it could
                // not be decided was refused reaches the model as a developer note (issue 41).
                if let (Some(why), ApprovalAnswer::Deny { reason }) =
                    (open.undecidable.as_deref(), answer)
                {
                    actions.push(Action::Note {
                        text: refusal::not_approved(reason, Some(why)),
                    });
                }
                actions.push(Action::Respond {
                    id: open.rpc_id,
                    result: open.reply.result(answer),
                });
            }
            None => tracing::debug!(id, "answer to an approval request that is not open"),
        }
    }

    /// Declines every approval request still open (the turn ends without the runner's answer).
    fn decline_open_approvals(&mut self, actions: &mut Vec<Action>) {
        for (id, open) in std::mem::take(&mut self.approvals) {
            tracing::info!(
                id,
                "approval request unanswered at the end of the turn: declined"
            );
            actions.push(Action::Respond {
                id: open.rpc_id,
                result: open.reply.refusal(),
            });
        }
    }

    /// Stops the turn through Codex's own interrupt; `turn/completed` (interrupted) answers.
    fn on_stop(&mut self, reason: InterruptReason, now: Instant, actions: &mut Vec<Action>) {
        self.stop = Some(reason);
        self.decline_open_approvals(actions);
        let Some(turn) = self.active.as_mut() else {
            // Between turns: nothing runs, everything the query had was answered.
            self.interrupted(reason, None, actions);
            return;
        };
        turn.interrupt = match turn.interrupt {
            Interrupt::Sent(_) => Interrupt::Sent(Cause::Stop(reason)),
            _ => Interrupt::Wanted(Cause::Stop(reason), now),
        };
        self.maybe_interrupt(now, actions);
    }

    /// The stopped turn ended: `Interrupted` covering what the model saw, and the query closes.
    fn interrupted(
        &mut self,
        reason: InterruptReason,
        seen: Option<PromptId>,
        actions: &mut Vec<Action>,
    ) {
        let covers = seen.into_iter().chain(self.covered).max().unwrap_or(0);
        self.covered = Some(covers);
        actions.push(Action::Emit(ProviderEvent::Interrupted {
            covers,
            usage: self.take_usage(),
            reason,
        }));
        self.close(actions);
    }

    fn on_push(&mut self, id: PromptId, prompt: Prompt, now: Instant, actions: &mut Vec<Action>) {
        let Some(turn) = self.active.as_mut() else {
            self.queue.push((id, prompt));
            self.next_turn(actions);
            return;
        };
        if self.steer && turn.interrupt == Interrupt::None {
            if let Some(turn_id) = turn.id.clone() {
                let input = user_input([&prompt]);
                let text = input_text(&input);
                turn.steered.push((id, prompt, text, false));
                actions.push(Action::Steer { turn_id, id, input });
                return;
            }
        }
        self.queue.push((id, prompt));
        if turn.interrupt == Interrupt::None {
            turn.interrupt = Interrupt::Wanted(Cause::Push, now);
        }
        self.maybe_interrupt(now, actions);
    }

    fn on_abort(&mut self, now: Instant, actions: &mut Vec<Action>) {
        self.aborted = true;
        self.decline_open_approvals(actions);
        let usage = self.take_usage();
        actions.push(Action::Emit(ProviderEvent::Error {
            message: "the turn was aborted".into(),
            retryable: false,
            classification: ErrorClass::Aborted,
            ends_turn: true,
            usage,
        }));
        match self.active.as_mut() {
            None => self.close(actions),
            Some(turn) => {
                match turn.interrupt {
                    // Already interrupting: the completion closes the query.
                    Interrupt::Sent(_) => turn.interrupt = Interrupt::Sent(Cause::Abort),
                    _ => turn.interrupt = Interrupt::Wanted(Cause::Abort, now),
                }
                self.maybe_interrupt(now, actions);
            }
        }
    }

    /// Sends a wanted interrupt when it can go: the turn id is known, and for a push no tool is
    /// running (or the grace period is over).
    fn maybe_interrupt(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let Some(turn) = self.active.as_mut() else {
            return;
        };
        let Interrupt::Wanted(reason, since) = turn.interrupt else {
            return;
        };
        let Some(turn_id) = turn.id.clone() else {
            return;
        };
        let tool_busy =
            !turn.tools.is_empty() && now.saturating_duration_since(since) < PUSH_TOOL_GRACE;
        if reason == Cause::Push && tool_busy {
            return;
        }
        turn.interrupt = Interrupt::Sent(reason);
        actions.push(Action::Interrupt { turn_id });
    }

    /// Periodic check (deferred interrupts).
    pub(super) fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        self.maybe_interrupt(now, &mut actions);
        actions
    }

    /// `turn/start` answered with this turn id.
    pub(super) fn on_turn_started(&mut self, turn_id: String, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        if let Some(turn) = self.active.as_mut() {
            turn.id = Some(turn_id);
        }
        self.maybe_interrupt(now, &mut actions);
        actions
    }

    /// A request of this query failed (`turn/start` refused, or the connection broke): the turn
    /// cannot run.
    pub(super) fn on_request_failed(
        &mut self,
        message: String,
        classification: ErrorClass,
        retryable: bool,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        if !self.closed {
            if !self.aborted {
                let usage = self.take_usage();
                actions.push(Action::Emit(ProviderEvent::Error {
                    message,
                    retryable,
                    classification,
                    ends_turn: true,
                    usage,
                }));
            }
            self.close(&mut actions);
        }
        actions
    }

    /// `turn/steer` was refused (the turn ended meanwhile): the push goes to the next turn unless
    /// the turn already echoed it.
    pub(super) fn on_steer_failed(&mut self, id: PromptId) -> Vec<Action> {
        let Some(turn) = self.active.as_mut() else {
            return Vec::new();
        };
        if let Some(pos) = turn
            .steered
            .iter()
            .position(|(sid, _, _, echoed)| *sid == id && !echoed)
        {
            let (sid, prompt, _, _) = turn.steered.remove(pos);
            // The turn is ending; its completion starts the next one with this prompt.
            self.enqueue(vec![(sid, prompt)]);
        }
        Vec::new()
    }

    /// The app-server process exited.
    pub(super) fn on_exit(&mut self, detail: &str) -> Vec<Action> {
        if self.active.is_none() && self.queue.is_empty() {
            // Between turns nothing is lost: end the query quietly; the next one respawns.
            let mut actions = Vec::new();
            self.close(&mut actions);
            return actions;
        }
        let message = format!("the codex app-server process exited{detail}");
        self.on_request_failed(message, ErrorClass::Process, true)
    }

    /// A server→client request: already answered by the connection, or (`pending`) an
    /// approval request to judge.
    pub(super) fn on_server_request(
        &mut self,
        method: &str,
        pending: Option<(RequestId, Value)>,
        now: Instant,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let Some((rpc_id, params)) = pending else {
            tracing::debug!(method, "codex server request answered");
            self.activity(now, &mut actions);
            return actions;
        };
        let calls = params
            .get("itemId")
            .and_then(Value::as_str)
            .and_then(|item| self.file_changes.get(item))
            .cloned()
            .unwrap_or_default();
        let verdict = approvals::judge(method, &params, calls, &self.policy, self.elicitation);
        if self.closed || self.aborted || self.stop.is_some() {
            // Nobody will answer any more: only what needs no one stands.
            let result = match verdict {
                Verdict::Answer { result, .. } => result,
                Verdict::Ask { reply, .. } => reply.refusal(),
            };
            actions.push(Action::Respond { id: rpc_id, result });
            return actions;
        }
        match verdict {
            Verdict::Answer {
                result,
                denied,
                undecidable,
            } => {
                if let Some(call) = denied {
                    tracing::info!(tool = %call.tool, argument = ?call.argument, ?undecidable, "tool call denied by the policy");
                    // Codex's decline carries no reason (the model reads "rejected by user"):
                    // why a command could not be decided reaches the model as a developer note
                    // in the thread, before the decline lets the turn go on.
                    if let Some(reason) = undecidable.as_deref() {
                        actions.push(Action::Note {
                            text: refusal::message(&call.tool, Some(reason)),
                        });
                    }
                    actions.push(Action::Emit(refusal::event(call, undecidable.as_deref())));
                }
                actions.push(Action::Respond { id: rpc_id, result });
            }
            Verdict::Ask { kind, reply, .. } => {
                let id = format!(
                    "codex-{}",
                    serde_json::to_string(&rpc_id).unwrap_or_default()
                );
                let undecidable = match &kind {
                    ApprovalKind::ToolCall { undecidable, .. } => undecidable.clone(),
                    ApprovalKind::Elicitation { .. } => None,
                };
                self.approvals.insert(
                    id.clone(),
                    OpenApproval {
                        rpc_id,
                        reply,
                        undecidable,
                    },
                );
                actions.push(Action::Emit(ProviderEvent::ApprovalRequest(
                    ApprovalRequest { id, kind },
                )));
            }
        }
        self.last_activity = Some(now);
        actions
    }

    /// A notification from app-server.
    pub(super) fn on_notification(
        &mut self,
        method: &str,
        params: &Value,
        now: Instant,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.closed {
            return actions;
        }
        match method {
            "turn/completed" => {
                if let Some(n) = parse::<TurnNotification>(method, params) {
                    self.on_turn_completed(n, &mut actions);
                }
            }
            "item/started" => {
                if let Some(n) = parse::<ItemNotification>(method, params) {
                    self.on_item(n, true, now, &mut actions);
                }
            }
            "item/completed" => {
                if let Some(n) = parse::<ItemNotification>(method, params) {
                    self.on_item(n, false, now, &mut actions);
                }
            }
            "item/agentMessage/delta" => {
                if let Some(delta) = parse::<AgentMessageDelta>(method, params) {
                    if let Some(turn) = self.active_turn(delta.turn_id.as_deref()) {
                        turn.deltas
                            .entry(delta.item_id)
                            .or_default()
                            .push_str(&delta.delta);
                    }
                }
                self.output(now, &mut actions);
            }
            // Reasoning streamed by the model.
            m if m.starts_with("item/reasoning/") => self.output(now, &mut actions),
            "error" => {
                if let Some(n) = parse::<ErrorNotification>(method, params) {
                    self.on_error(n, &mut actions);
                }
            }
            // "Model metadata for `fake-model` not found" and friends: worth a log line, never an
            // error.
            "warning" | "configWarning" | "deprecationNotice" | "guardianWarning" => {
                if let Some(n) = parse::<MessageNotification>(method, params) {
                    actions.push(progress(format!("codex {method}: {}", n.message)));
                }
            }
            "thread/compacted" => {
                actions.push(progress("codex compacted the conversation context".into()))
            }
            "model/rerouted" => {
                if let Some(to) = parse::<ModelRerouted>(method, params).and_then(|n| n.to_model) {
                    self.model = Some(to);
                }
                actions.push(progress(format!("codex rerouted the model: {params}")))
            }
            "thread/tokenUsage/updated" => {
                if let Some(n) = parse::<TokenUsageNotification>(method, params) {
                    self.on_token_usage(n, now, &mut actions);
                }
                self.activity(now, &mut actions);
            }
            "mcpServer/startupStatus/updated" => {
                let status = params.get("status").and_then(Value::as_str).unwrap_or("");
                if status == "failed" || params.get("error").is_some_and(|e| !e.is_null()) {
                    let name = params.get("name").and_then(Value::as_str).unwrap_or("?");
                    let error = params
                        .get("error")
                        .map(Value::to_string)
                        .unwrap_or_default();
                    actions.push(progress(format!(
                        "MCP server {name} failed to start: {error}"
                    )));
                }
            }
            // Our approval-stop hook holds Codex after a stop tool's result (`command.rs`). The
            // tool's `item/completed` normally stopped the turn already; this covers a call
            // Codex ran the hook for without reporting it `completed`, which would otherwise
            // wait for the hook's own time limit.
            "hook/started" => {
                let ours = params.pointer("/run/statusMessage").and_then(Value::as_str)
                    == Some(APPROVAL_STOP_HOOK_STATUS);
                if ours && !self.aborted && self.stop.is_none() && self.active.is_some() {
                    tracing::info!("approval-stop hook holds codex; interrupting the turn");
                    self.on_stop(InterruptReason::ApprovalStop, now, &mut actions);
                } else {
                    self.activity(now, &mut actions);
                }
            }
            "turn/started"
            | "thread/started"
            | "thread/status/changed"
            | "account/rateLimits/updated"
            | "thread/readState/changed"
            | "remoteControl/status/changed"
            | "serverRequest/resolved"
            | "thread/goal/cleared" => self.activity(now, &mut actions),
            other => {
                tracing::debug!(method = other, "codex notification not translated");
                self.activity(now, &mut actions);
            }
        }
        actions
    }

    fn on_item(
        &mut self,
        n: ItemNotification,
        started: bool,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        if self.active_turn(n.turn_id.as_deref()).is_none() {
            return;
        }
        let item = n.item;
        if started && item.kind == "fileChange" {
            self.file_changes.insert(item.id.clone(), item.file_calls());
        }
        let Some(turn) = self.active_turn(n.turn_id.as_deref()) else {
            return;
        };
        if let Some(tool) = item.tool_name() {
            if started {
                turn.tools.insert(item.id.clone(), tool.clone());
                turn.step_called_tools = true;
                turn.responded = true;
                actions.push(Action::Emit(ProviderEvent::Activity {
                    tool: Some(tool),
                    summary: item.tool_summary(),
                }));
                self.last_activity = Some(now);
            } else {
                let ended = turn.tools.remove(&item.id).is_some();
                let running = turn.tools.len();
                if ended {
                    actions.push(Action::Emit(ProviderEvent::ToolEnded { running }));
                } else {
                    self.activity(now, actions);
                }
                self.file_changes.remove(&item.id);
                // An approval-stop tool returned its result: the turn ends here, before the
                // model reads it.
                let returned = item.kind == "mcpToolCall"
                    && item.extra.get("status").and_then(Value::as_str) == Some("completed");
                if returned
                    && self.stop_tools.contains(&tool)
                    && !self.aborted
                    && self.stop.is_none()
                {
                    tracing::info!(%tool, "approval-stop tool returned; interrupting the turn");
                    self.stop_result = Some(format!(
                        "The call {} of {tool} completed and the turn was then ended for the \
                         user's review (Codex records the call as aborted; it was not). Its \
                         result: {}",
                        item.id,
                        item.result_text()
                    ));
                    self.on_stop(InterruptReason::ApprovalStop, now, actions);
                    return;
                }
                // A push waiting for this tool may go now.
                self.maybe_interrupt(now, actions);
            }
            return;
        }
        match item.kind.as_str() {
            "userMessage" => {
                let text = item.user_text();
                if let Some(entry) = turn
                    .steered
                    .iter_mut()
                    .find(|(_, _, expected, echoed)| !echoed && *expected == text)
                {
                    entry.3 = true;
                }
            }
            "agentMessage" if !started => {
                let text = item
                    .text
                    .clone()
                    .or_else(|| turn.deltas.get(&item.id).cloned())
                    .unwrap_or_default();
                turn.last_message = Some(text.clone());
                // Delivered at once: a tool call may follow, and the runner sends the text's
                // `<message to>` blocks now rather than after the turn.
                if !text.trim().is_empty() && !self.aborted {
                    actions.push(Action::Emit(ProviderEvent::Text { text }));
                }
                self.output(now, actions);
                return;
            }
            "agentMessage" | "reasoning" => {
                self.output(now, actions);
                return;
            }
            _ => {}
        }
        self.activity(now, actions);
    }

    /// A model response's figures: summed once (a repeated total is no new response) and
    /// counted as a step; a step that called tools past the limit stops the turn.
    fn on_token_usage(
        &mut self,
        n: TokenUsageNotification,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        let figures = n.token_usage;
        if figures.total.is_some() && figures.total == self.last_total {
            return;
        }
        let Some(turn) = self
            .active
            .as_mut()
            .filter(|t| t.owns(n.turn_id.as_deref()))
        else {
            return;
        };
        turn.requests = turn.requests.saturating_add(1);
        turn.responded = true;
        let asked_for_more = std::mem::take(&mut turn.step_called_tools);
        let over_limit = self.max_turns.is_some_and(|max| turn.requests >= max)
            && asked_for_more
            && matches!(turn.interrupt, Interrupt::None);
        self.last_total = figures.total;
        let mut step = figures.last.map(|last| last.usage()).unwrap_or_default();
        step.requests = Some(1);
        self.usage.get_or_insert_with(Usage::default).add(&step);
        if over_limit && !self.aborted && self.stop.is_none() {
            tracing::info!(
                max = self.max_turns,
                "codex turn reached maxTurnsPerQuery; interrupting"
            );
            self.on_stop(InterruptReason::MaxTurns, now, actions);
        }
    }

    fn on_error(&mut self, n: ErrorNotification, actions: &mut Vec<Action>) {
        let Some(turn) = self.active_turn(n.turn_id.as_deref()) else {
            return;
        };
        if n.will_retry {
            // Codex retries by itself (bounded by request/stream_max_retries): informational.
            actions.push(Action::Emit(ProviderEvent::Error {
                message: n.error.describe(),
                retryable: true,
                classification: classify_error(&n.error),
                ends_turn: false,
                usage: None,
            }));
        } else {
            // turn/completed (failed) follows and carries the same error; report it once, there.
            turn.error = Some(n.error);
        }
    }

    fn on_turn_completed(&mut self, n: TurnNotification, actions: &mut Vec<Action>) {
        let Some(turn) = self.active.as_ref() else {
            return;
        };
        if !turn.owns(Some(&n.turn.id)) {
            tracing::debug!(turn = %n.turn.id, "completion of another turn ignored");
            return;
        }
        let Some(turn) = self.active.take() else {
            return;
        };
        match n.turn.status.as_str() {
            "completed" => {
                let text = turn
                    .last_message
                    .clone()
                    .or_else(|| final_message(&n.turn.items))
                    .unwrap_or_default();
                let mut covered: Vec<PromptId> =
                    turn.started_with.iter().map(|(id, _)| *id).collect();
                let mut requeue = Vec::new();
                for (id, prompt, _, echoed) in turn.steered {
                    if echoed {
                        covered.push(id);
                    } else {
                        requeue.push((id, prompt));
                    }
                }
                self.enqueue(requeue);
                let covers = covered.into_iter().chain(self.covered).max().unwrap_or(0);
                self.covered = Some(covers);
                if !self.aborted {
                    let usage = self.take_usage();
                    actions.push(Action::Emit(ProviderEvent::Result {
                        text,
                        covers,
                        usage,
                    }));
                }
                if self.stop.is_some() {
                    // The turn finished before the interrupt landed: its answer stands, and
                    // the query ends as a stop would end it (pushes not covered run again).
                    self.close(actions);
                } else {
                    self.after_turn(actions);
                }
            }
            "interrupted" => match turn.interrupt {
                Interrupt::Sent(Cause::Stop(reason)) => {
                    if let Some(text) = self.stop_result.take() {
                        actions.push(Action::Note { text });
                    }
                    let seen = turn.seen();
                    self.interrupted(reason, seen, actions);
                }
                Interrupt::Sent(Cause::Push) if !self.aborted => {
                    // Everything the interrupted turn held runs again, with the pushes, as one turn.
                    self.restart_base = turn.seen();
                    let mut again = turn.started_with;
                    again.extend(
                        turn.steered
                            .into_iter()
                            .map(|(id, prompt, _, _)| (id, prompt)),
                    );
                    self.enqueue(again);
                    self.after_turn(actions);
                }
                _ if self.aborted => self.close(actions),
                _ => {
                    let usage = self.take_usage();
                    actions.push(Action::Emit(ProviderEvent::Error {
                        message: "codex interrupted the turn".into(),
                        retryable: true,
                        classification: ErrorClass::Other,
                        ends_turn: true,
                        usage,
                    }));
                    self.close(actions);
                }
            },
            status => {
                if !self.aborted {
                    let error = n.turn.error.or(turn.error).unwrap_or_else(|| TurnError {
                        message: format!("the turn ended with status {status:?}"),
                        ..Default::default()
                    });
                    let classification = classify_error(&error);
                    let usage = self.take_usage();
                    actions.push(Action::Emit(ProviderEvent::Error {
                        message: error.describe(),
                        // A rate limit passes; anything else was retried by Codex already.
                        retryable: matches!(classification, ErrorClass::RateLimited { .. }),
                        classification,
                        ends_turn: true,
                        usage,
                    }));
                }
                self.close(actions);
            }
        }
    }

    /// After a turn ended normally: the next turn, or the end of the query.
    fn after_turn(&mut self, actions: &mut Vec<Action>) {
        if self.aborted {
            self.close(actions);
        } else if !self.queue.is_empty() {
            self.next_turn(actions);
        } else if self.ended {
            self.close(actions);
        }
    }

    fn next_turn(&mut self, actions: &mut Vec<Action>) {
        if self.active.is_some() || self.queue.is_empty() {
            return;
        }
        let prompts = std::mem::take(&mut self.queue);
        let input = user_input(prompts.iter().map(|(_, p)| p));
        let own = self
            .restart_base
            .take()
            .or_else(|| prompts.iter().map(|(id, _)| *id).max());
        let mut turn = ActiveTurn::new(prompts);
        turn.own = own;
        self.active = Some(turn);
        actions.push(Action::StartTurn { input });
    }

    fn enqueue(&mut self, prompts: Vec<(PromptId, Prompt)>) {
        self.queue.extend(prompts);
        self.queue.sort_by_key(|(id, _)| *id);
        self.queue.dedup_by_key(|(id, _)| *id);
    }

    fn close(&mut self, actions: &mut Vec<Action>) {
        self.decline_open_approvals(actions);
        if !self.closed {
            self.closed = true;
            self.active = None;
            actions.push(Action::Close);
        }
    }

    fn activity(&mut self, now: Instant, actions: &mut Vec<Action>) {
        if self.active.is_none() {
            return;
        }
        if self
            .last_activity
            .is_some_and(|last| now.saturating_duration_since(last) < ACTIVITY_INTERVAL)
        {
            return;
        }
        self.last_activity = Some(now);
        actions.push(Action::Emit(ProviderEvent::Activity {
            tool: None,
            summary: None,
        }));
    }
}

impl QueryState {
    /// The model produced output: an `Output` for the runner's progress deadline, at most one
    /// per [`ACTIVITY_INTERVAL`] (it also counts as activity for the watchdog).
    fn output(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let Some(turn) = self.active.as_mut() else {
            return;
        };
        turn.responded = true;
        self.last_activity = Some(now);
        if self
            .last_output
            .is_some_and(|last| now.saturating_duration_since(last) < ACTIVITY_INTERVAL)
        {
            return;
        }
        self.last_output = Some(now);
        actions.push(Action::Emit(ProviderEvent::Output));
    }
}

fn progress(message: String) -> Action {
    Action::Emit(ProviderEvent::Progress { message })
}

fn parse<T: serde::de::DeserializeOwned>(method: &str, params: &Value) -> Option<T> {
    match serde_json::from_value(params.clone()) {
        Ok(value) => Some(value),
        Err(err) => {
            tracing::warn!(method, %err, "unexpected codex notification shape; ignored");
            None
        }
    }
}

/// Classifies a Codex error for the runner: the upstream status and text through the shared
/// rules ([`classify`]), Codex's own error kinds where there is no status.
fn classify_error(error: &TurnError) -> ErrorClass {
    let text = error.describe();
    let status = error.http_status();
    if status.is_some() {
        return classify(status, &text, None).unwrap_or(ErrorClass::Api);
    }
    let kind = error.codex_error_info.as_ref().and_then(Value::as_str);
    match kind {
        Some("unauthorized") => return ErrorClass::Auth,
        Some("rateLimitExceeded") => return ErrorClass::RATE_LIMITED,
        Some("usageLimitExceeded" | "sessionBudgetExceeded") => return ErrorClass::Quota,
        _ => {}
    }
    if let Some(class) = classify(None, &text, None) {
        return class;
    }
    match kind {
        Some("sandboxError" | "threadRollbackFailed" | "tooManyDenials") => ErrorClass::Other,
        Some(_) => ErrorClass::Api,
        // "Missing environment variable: `NANOCLAW_CODEX_API_KEY`." comes without a kind.
        None if error.message.contains("Missing environment variable") => ErrorClass::Auth,
        None => ErrorClass::Api,
    }
}

/// The last agent message among a turn's summary items.
fn final_message(items: &[Value]) -> Option<String> {
    items
        .iter()
        .rev()
        .find(|item| item.get("type").and_then(Value::as_str) == Some("agentMessage"))
        .and_then(|item| item.get("text").and_then(Value::as_str))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests;
