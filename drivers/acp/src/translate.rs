//! The query state machine: what to send to the agent and which events to emit, given the
//! runner's controls and the agent's messages. It does no I/O (the driver in `driver.rs`
//! does), so the translation is unit-tested on scripted ACP traffic.
//!
//! Prompt bookkeeping: prompt 0 is the query's first prompt, pushes are 1, 2, ... A turn is one
//! `session/prompt`; its prompts are covered once its answer (`stopReason`) comes.
//! `Result.covers` is the highest covered id.
//!
//! Follow-ups: ACP has no way to add input to a running prompt, so a push is
//! abort-and-restart: `session/cancel`, and once the cancelled prompt answered, one prompt with
//! everything the cancelled turn held and the pushes (while a tool runs, the cancel waits up to
//! [`PUSH_TOOL_GRACE`], so a tool's result is not lost).
//!
//! Stopping (the runner's interrupt): `session/cancel`; the prompt's answer (`cancelled`, or a
//! normal end that came first) ends the query with `Interrupted`; the process and the session
//! stay. Aborting: the `Aborted` error at once, `session/cancel`, the query closes when the
//! prompt answered.
//!
//! Events: `agent_message_chunk` builds the reply (a `Text` when a piece of text is complete:
//! before a tool call and at the end), `tool_call` is `Activity` with the canonical tool,
//! a finished `tool_call_update` is `ToolEnded`, thoughts are `Output` (logged), a plan is
//! logged. Usage comes from the prompt's answer ([`usage`]), summed over a restarted turn.
//!
//! Permissions (`approval.rs`): decided at once by the policy, or an `ApprovalRequest` answered
//! when the runner's `Control::Approval` comes; requests still open when the turn is cancelled
//! or the query closes are answered `cancelled`, as ACP asks of a client that cancels.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::approval::{self, Verdict};
use super::protocol::{
    parse_update, permission_outcome, PermissionOption, PermissionRequest, PromptResult, RequestId,
    RpcErrorBody, ToolCall, Update, AUTH_REQUIRED,
};
use super::tools;
use provider::driver::classify::classify;
use provider::driver::refusal;
use provider::{
    ApprovalAnswer, ApprovalRequest, Control, ErrorClass, InterruptReason, Prompt, PromptId,
    ProviderEvent, ToolPolicy, Usage,
};

/// How long a push waits for a running tool before cancelling anyway (as Codex's driver).
pub(crate) const PUSH_TOOL_GRACE: Duration = Duration::from_secs(10);

/// At most one `Activity { tool: None }` or `Output` per this interval (chunks come per token).
pub(crate) const ACTIVITY_INTERVAL: Duration = Duration::from_secs(1);

/// What the driver must do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Send an event to the runner.
    Emit(ProviderEvent),
    /// Send `session/prompt` with these prompts (as content blocks); its answer comes back
    /// through [`QueryState::on_prompt_answer`].
    Prompt { prompts: Vec<Prompt> },
    /// Send `session/cancel`.
    Cancel,
    /// Answer the agent's request `id` with `result`.
    Respond { id: RequestId, result: Value },
    /// Add a record to the session's journal (the transcript archive reads it).
    Journal(Value),
    /// The query is over: drop the event sender.
    Close,
}

/// Why the running prompt is being cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    Push,
    Abort,
    Stop(InterruptReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cancel {
    None,
    /// Wanted (waiting for a running tool) since this instant.
    Wanted(Cause, Instant),
    Sent(Cause),
}

/// A permission request waiting for the runner.
#[derive(Debug)]
struct OpenApproval {
    rpc_id: RequestId,
    options: Vec<PermissionOption>,
}

#[derive(Debug)]
struct Turn {
    prompts: Vec<(PromptId, Prompt)>,
    /// The highest prompt a stop of this turn covers before the model responded: its own, or
    /// for a restart those of the turn it replaces.
    own: Option<PromptId>,
    cancel: Cancel,
    /// Running tool calls: id → canonical name.
    tools: BTreeMap<String, String>,
    /// What the agent said about each call so far (a permission request or an update may name
    /// only the id).
    calls: BTreeMap<String, ToolCall>,
    /// The text piece being streamed.
    text: String,
    /// The last complete text piece.
    last_text: String,
    responded: bool,
}

impl Turn {
    fn new(prompts: Vec<(PromptId, Prompt)>, own: Option<PromptId>) -> Self {
        Self {
            prompts,
            own,
            cancel: Cancel::None,
            tools: BTreeMap::new(),
            calls: BTreeMap::new(),
            text: String::new(),
            last_text: String::new(),
            responded: false,
        }
    }

    fn seen(&self) -> Option<PromptId> {
        if self.responded {
            self.prompts.iter().map(|(id, _)| *id).max()
        } else {
            self.own
        }
    }
}

/// The state of one query (see the module docs).
#[derive(Debug)]
pub(crate) struct QueryState {
    queue: Vec<(PromptId, Prompt)>,
    active: Option<Turn>,
    ended: bool,
    aborted: bool,
    closed: bool,
    stop: Option<InterruptReason>,
    covered: Option<PromptId>,
    restart_base: Option<PromptId>,
    usage: Option<Usage>,
    model: Option<String>,
    policy: ToolPolicy,
    /// The MCP servers handed to the agent (for canonical names).
    servers: Vec<String>,
    approvals: BTreeMap<String, OpenApproval>,
    next_approval: u64,
    last_activity: Option<Instant>,
    last_output: Option<Instant>,
}

impl QueryState {
    /// A query whose first prompt is `first`.
    pub(crate) fn new(first: Prompt) -> Self {
        Self {
            queue: vec![(0, first)],
            active: None,
            ended: false,
            aborted: false,
            closed: false,
            stop: None,
            covered: None,
            restart_base: None,
            usage: None,
            model: None,
            policy: ToolPolicy::default(),
            servers: Vec::new(),
            approvals: BTreeMap::new(),
            next_approval: 1,
            last_activity: None,
            last_output: None,
        }
    }

    /// Judges permission requests by `policy`; `servers` are the MCP servers the agent got.
    pub(crate) fn with_policy(mut self, policy: ToolPolicy, servers: Vec<String>) -> Self {
        self.policy = policy;
        self.servers = servers;
        self
    }

    /// The model usage names.
    pub(crate) fn with_model(mut self, model: Option<String>) -> Self {
        self.model = model;
        self
    }

    /// The first actions: the first prompt.
    pub(crate) fn begin(&mut self) -> Vec<Action> {
        let mut actions = Vec::new();
        self.next_turn(&mut actions);
        actions
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// A prompt runs (the watchdog applies).
    pub(crate) fn turn_active(&self) -> bool {
        self.active.is_some()
    }

    pub(crate) fn tool_running(&self) -> bool {
        self.active.as_ref().is_some_and(|t| !t.tools.is_empty())
    }

    /// A permission request waits for the runner (the agent waits too).
    pub(crate) fn awaiting_approval(&self) -> bool {
        !self.approvals.is_empty()
    }

    /// A cancel was sent for an abort or a stop and its answer is awaited.
    pub(crate) fn stopping(&self) -> bool {
        !self.closed && (self.stop.is_some() || self.aborted)
    }

    /// The runner's interrupt is under way (an abort is not: it has no answer to keep in time).
    pub(crate) fn stop_requested(&self) -> bool {
        self.stop.is_some()
    }

    /// Usage counted and not yet reported.
    pub(crate) fn take_usage(&mut self) -> Option<Usage> {
        let mut usage = self.usage.take()?;
        if usage.model.is_none() {
            usage.model.clone_from(&self.model);
        }
        Some(usage)
    }

    /// A control from the runner; `None`: the runner dropped the query (abort).
    pub(crate) fn on_control(&mut self, control: Option<Control>, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.closed || self.aborted || self.stop.is_some() {
            // Approvals answered late are refused by the cancel already.
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
            Some(Control::Interrupt) => {
                self.stop = Some(InterruptReason::Stopped);
                self.cancel_turn(Cause::Stop(InterruptReason::Stopped), now, &mut actions);
            }
            Some(Control::Approval { id, answer }) => self.on_approval(&id, &answer, &mut actions),
            Some(Control::Abort) | None => {
                self.aborted = true;
                let usage = self.take_usage();
                actions.push(Action::Emit(ProviderEvent::Error {
                    message: "the turn was aborted".into(),
                    retryable: false,
                    classification: ErrorClass::Aborted,
                    ends_turn: true,
                    usage,
                }));
                self.cancel_turn(Cause::Abort, now, &mut actions);
            }
        }
        actions
    }

    fn on_push(&mut self, id: PromptId, prompt: Prompt, now: Instant, actions: &mut Vec<Action>) {
        self.queue.push((id, prompt));
        if self.active.is_none() {
            self.next_turn(actions);
        } else {
            self.cancel_turn(Cause::Push, now, actions);
        }
    }

    /// Cancels the running prompt for `cause` (at once, or for a push once no tool runs).
    fn cancel_turn(&mut self, cause: Cause, now: Instant, actions: &mut Vec<Action>) {
        let Some(turn) = self.active.as_mut() else {
            match cause {
                Cause::Stop(reason) => self.interrupted(reason, None, actions),
                _ => self.close(actions),
            }
            return;
        };
        turn.cancel = match turn.cancel {
            // A stop or an abort wins over a push already under way.
            Cancel::Sent(_) => Cancel::Sent(cause),
            Cancel::Wanted(Cause::Push, since) if cause == Cause::Push => {
                Cancel::Wanted(cause, since)
            }
            _ => Cancel::Wanted(cause, now),
        };
        self.maybe_cancel(now, actions);
    }

    fn maybe_cancel(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let Some(turn) = self.active.as_mut() else {
            return;
        };
        let Cancel::Wanted(cause, since) = turn.cancel else {
            return;
        };
        let tool_busy =
            !turn.tools.is_empty() && now.saturating_duration_since(since) < PUSH_TOOL_GRACE;
        if cause == Cause::Push && tool_busy {
            return;
        }
        turn.cancel = Cancel::Sent(cause);
        // ACP: the cancel first, then every open permission request answered `cancelled`.
        actions.push(Action::Cancel);
        self.refuse_open_approvals(actions);
    }

    /// Periodic check (a push waiting for a tool).
    pub(crate) fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        self.maybe_cancel(now, &mut actions);
        actions
    }

    /// The runner's answer to a permission request.
    fn on_approval(&mut self, id: &str, answer: &ApprovalAnswer, actions: &mut Vec<Action>) {
        let Some(open) = self.approvals.remove(id) else {
            tracing::debug!(id, "answer to a permission request that is not open");
            return;
        };
        let allow = !matches!(answer, ApprovalAnswer::Deny { .. });
        actions.push(Action::Respond {
            id: open.rpc_id,
            result: approval::answer(&open.options, allow),
        });
    }

    fn refuse_open_approvals(&mut self, actions: &mut Vec<Action>) {
        for (id, open) in std::mem::take(&mut self.approvals) {
            tracing::info!(
                id,
                "permission request unanswered as the turn ends: cancelled"
            );
            actions.push(Action::Respond {
                id: open.rpc_id,
                result: permission_outcome(None),
            });
        }
    }

    /// `session/request_permission` from the agent.
    pub(crate) fn on_permission(&mut self, rpc_id: RequestId, params: &Value) -> Vec<Action> {
        let mut actions = Vec::new();
        let request: PermissionRequest = match serde_json::from_value(params.clone()) {
            Ok(request) => request,
            Err(err) => {
                tracing::warn!(%err, "unreadable permission request: cancelled");
                actions.push(Action::Respond {
                    id: rpc_id,
                    result: permission_outcome(None),
                });
                return actions;
            }
        };
        let cancelling = self
            .active
            .as_ref()
            .is_none_or(|t| matches!(t.cancel, Cancel::Sent(_)));
        if self.closed || cancelling {
            actions.push(Action::Respond {
                id: rpc_id,
                result: permission_outcome(None),
            });
            return actions;
        }
        let mut tool = request.tool_call;
        if let Some(known) = self
            .active
            .as_ref()
            .and_then(|t| t.calls.get(&tool.tool_call_id))
        {
            tool = merged(known, &tool);
        }
        let call = tools::call(&tool, &self.servers);
        match approval::judge(call.clone(), &request.options, &self.policy) {
            Verdict::Answer { result, denied } => {
                if let Some((call, undecidable)) = denied {
                    tracing::info!(tool = %call.tool, "tool call denied by the policy");
                    actions.push(Action::Emit(refusal::event(call, undecidable.as_deref())));
                }
                actions.push(Action::Respond { id: rpc_id, result });
            }
            Verdict::Ask { kind } => {
                let id = format!("acp-{}", self.next_approval);
                self.next_approval += 1;
                tracing::info!(id, tool = %call.tool, "asking the runner about a tool call");
                self.approvals.insert(
                    id.clone(),
                    OpenApproval {
                        rpc_id,
                        options: request.options,
                    },
                );
                actions.push(Action::Emit(ProviderEvent::ApprovalRequest(
                    ApprovalRequest { id, kind },
                )));
            }
        }
        actions
    }

    /// A `session/update` notification's `update`.
    pub(crate) fn on_update(&mut self, update: &Value, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        let Some(update) = parse_update(update) else {
            tracing::debug!("session/update without a sessionUpdate tag; ignored");
            return actions;
        };
        if self.active.is_none() {
            tracing::debug!(?update, "session/update outside a prompt; ignored");
            return actions;
        }
        match update {
            Update::MessageChunk(text) => {
                if let Some(turn) = self.active.as_mut() {
                    turn.text.push_str(&text);
                }
                self.output(now, &mut actions);
            }
            Update::ThoughtChunk(text) => {
                tracing::debug!(thought = %text, "agent thought");
                self.output(now, &mut actions);
            }
            Update::Plan(entries) => {
                tracing::info!(plan = ?entries, "agent plan");
                self.output(now, &mut actions);
            }
            Update::ToolCall(call) => self.on_tool_call(call, now, &mut actions),
            Update::ToolCallChanged(update) => self.on_tool_update(update, now, &mut actions),
            Update::UserChunk(_) | Update::Usage(_) | Update::Other(_) => {
                self.activity(now, &mut actions)
            }
        }
        actions
    }

    fn on_tool_call(&mut self, call: ToolCall, now: Instant, actions: &mut Vec<Action>) {
        self.flush_text(actions);
        let canonical = tools::call(&call, &self.servers);
        let Some(turn) = self.active.as_mut() else {
            return;
        };
        turn.responded = true;
        let id = call.tool_call_id.clone();
        actions.push(Action::Journal(json!({
            "tool": canonical.tool,
            "id": id,
            "input": call.raw_input.clone().unwrap_or(Value::Null),
        })));
        if call.finished() {
            actions.push(Action::Journal(tool_output_record(&call)));
        } else {
            turn.tools.insert(id.clone(), canonical.tool.clone());
        }
        turn.calls.insert(id, call);
        self.last_activity = Some(now);
        actions.push(Action::Emit(ProviderEvent::Activity {
            tool: Some(canonical.tool),
            summary: canonical.summary,
        }));
    }

    fn on_tool_update(&mut self, update: ToolCall, now: Instant, actions: &mut Vec<Action>) {
        let Some(turn) = self.active.as_mut() else {
            return;
        };
        let merged = match turn.calls.get(&update.tool_call_id) {
            Some(known) => merged(known, &update),
            None => update,
        };
        let finished = merged.finished();
        let id = merged.tool_call_id.clone();
        turn.calls.insert(id.clone(), merged.clone());
        if finished && turn.tools.remove(&id).is_some() {
            let running = turn.tools.len();
            actions.push(Action::Journal(tool_output_record(&merged)));
            actions.push(Action::Emit(ProviderEvent::ToolEnded { running }));
            self.maybe_cancel(now, actions);
        } else {
            self.activity(now, actions);
        }
    }

    /// The answer to the running `session/prompt`: its result or the JSON-RPC error.
    pub(crate) fn on_prompt_answer(
        &mut self,
        answer: Result<PromptResult, RpcErrorBody>,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let Some(mut turn) = self.active.take() else {
            return actions;
        };
        let result = match answer {
            Ok(result) => result,
            Err(body) => {
                let (classification, retryable) = classify_rpc_error(&body);
                self.fail(
                    format!("the agent refused the prompt: {}", body.describe()),
                    classification,
                    retryable,
                    &mut actions,
                );
                return actions;
            }
        };
        if let Some(step) = usage(&result) {
            self.usage.get_or_insert_with(Usage::default).add(&step);
        }
        let stop_reason = result.stop_reason.as_deref().unwrap_or("end_turn");
        let cause = match turn.cancel {
            Cancel::Sent(cause) | Cancel::Wanted(cause, _) => Some(cause),
            Cancel::None => None,
        };
        if stop_reason == "cancelled" || cause == Some(Cause::Abort) {
            // Keep what was said for the transcript; it is no reply.
            let text = std::mem::take(&mut turn.text);
            journal_text(&text, &mut actions);
            match cause {
                Some(Cause::Push) if !self.aborted => {
                    self.restart_base = turn.seen();
                    let mut again = turn.prompts;
                    again.append(&mut self.queue);
                    again.sort_by_key(|(id, _)| *id);
                    again.dedup_by_key(|(id, _)| *id);
                    self.queue = again;
                    self.next_turn(&mut actions);
                }
                Some(Cause::Stop(reason)) => {
                    let seen = turn.seen();
                    self.interrupted(reason, seen, &mut actions);
                }
                _ if self.aborted => self.close(&mut actions),
                _ => self.fail(
                    "the agent cancelled the turn by itself".into(),
                    ErrorClass::Other,
                    true,
                    &mut actions,
                ),
            }
            return actions;
        }
        // The turn ended (before a wanted cancel took effect): its answer stands.
        let piece = std::mem::take(&mut turn.text);
        if !piece.trim().is_empty() {
            turn.last_text = piece.clone();
            journal_text(&piece, &mut actions);
            actions.push(Action::Emit(ProviderEvent::Text {
                text: piece.clone(),
            }));
        }
        match stop_reason {
            "end_turn" | "max_tokens" | "max_turn_requests" => {
                if stop_reason != "end_turn" {
                    tracing::warn!(stop_reason, "the agent ended the turn early");
                }
                let covers = turn
                    .prompts
                    .iter()
                    .map(|(id, _)| *id)
                    .chain(self.covered)
                    .max()
                    .unwrap_or(0);
                self.covered = Some(covers);
                let usage = self.take_usage();
                actions.push(Action::Emit(ProviderEvent::Result {
                    text: turn.last_text,
                    covers,
                    usage,
                }));
                if self.stop.is_some() {
                    self.close(&mut actions);
                } else {
                    self.after_turn(&mut actions);
                }
            }
            other => self.fail(
                format!("the agent stopped the turn: {other}"),
                ErrorClass::Other,
                false,
                &mut actions,
            ),
        }
        actions
    }

    /// The agent process exited (or its stream broke) with `detail`.
    pub(crate) fn on_exit(&mut self, detail: &str) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.active.is_none() && self.queue.is_empty() {
            self.close(&mut actions);
            return actions;
        }
        self.fail(
            format!("the agent process exited{detail}"),
            ErrorClass::Process,
            true,
            &mut actions,
        );
        actions
    }

    /// The agent wrote something that is not JSON-RPC: the stream cannot be trusted.
    pub(crate) fn on_malformed(&mut self, line: &str) -> Vec<Action> {
        let mut actions = Vec::new();
        self.fail(
            format!("the agent wrote a line that is not JSON-RPC: {line}"),
            ErrorClass::Process,
            true,
            &mut actions,
        );
        actions
    }

    /// A stopped turn did not end in time (the driver stops the agent): it ends here.
    pub(crate) fn on_stop_timeout(&mut self) -> Vec<Action> {
        let mut actions = Vec::new();
        if let Some(reason) = self.stop.filter(|_| !self.closed) {
            let seen = self.active.take().and_then(|t| t.seen());
            self.interrupted(reason, seen, &mut actions);
        } else if !self.closed {
            self.close(&mut actions);
        }
        actions
    }

    /// Ends the query with an error (none after an abort, which reported already).
    pub(crate) fn fail(
        &mut self,
        message: String,
        classification: ErrorClass,
        retryable: bool,
        actions: &mut Vec<Action>,
    ) {
        if self.closed {
            return;
        }
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
        self.close(actions);
    }

    fn interrupted(
        &mut self,
        reason: InterruptReason,
        seen: Option<PromptId>,
        actions: &mut Vec<Action>,
    ) {
        let covers = seen.into_iter().chain(self.covered).max().unwrap_or(0);
        self.covered = Some(covers);
        let usage = self.take_usage();
        actions.push(Action::Emit(ProviderEvent::Interrupted {
            covers,
            usage,
            reason,
        }));
        self.close(actions);
    }

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
        let own = self
            .restart_base
            .take()
            .or_else(|| prompts.iter().map(|(id, _)| *id).max());
        for (_, prompt) in &prompts {
            actions.push(Action::Journal(json!({ "user": prompt.text })));
        }
        actions.push(Action::Prompt {
            prompts: prompts.iter().map(|(_, p)| p.clone()).collect(),
        });
        self.active = Some(Turn::new(prompts, own));
    }

    fn close(&mut self, actions: &mut Vec<Action>) {
        self.refuse_open_approvals(actions);
        if !self.closed {
            self.closed = true;
            self.active = None;
            actions.push(Action::Close);
        }
    }

    /// The text piece streamed so far is complete (a tool call follows).
    fn flush_text(&mut self, actions: &mut Vec<Action>) {
        let Some(turn) = self.active.as_mut() else {
            return;
        };
        let piece = std::mem::take(&mut turn.text);
        if piece.trim().is_empty() {
            return;
        }
        turn.last_text = piece.clone();
        journal_text(&piece, actions);
        actions.push(Action::Emit(ProviderEvent::Text { text: piece }));
    }

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

    fn activity(&mut self, now: Instant, actions: &mut Vec<Action>) {
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

fn journal_text(text: &str, actions: &mut Vec<Action>) {
    if !text.trim().is_empty() {
        actions.push(Action::Journal(json!({ "assistant": text })));
    }
}

fn tool_output_record(call: &ToolCall) -> Value {
    json!({
        "output": call.tool_call_id,
        "text": call.output_text().unwrap_or_default(),
        "failed": call.status.as_deref() == Some("failed"),
    })
}

/// `update` over what was known of the call: the fields it names replace the known ones.
fn merged(known: &ToolCall, update: &ToolCall) -> ToolCall {
    ToolCall {
        tool_call_id: known.tool_call_id.clone(),
        title: update.title.clone().or_else(|| known.title.clone()),
        kind: update.kind.clone().or_else(|| known.kind.clone()),
        status: update.status.clone().or_else(|| known.status.clone()),
        raw_input: update.raw_input.clone().or_else(|| known.raw_input.clone()),
        raw_output: update
            .raw_output
            .clone()
            .or_else(|| known.raw_output.clone()),
        content: update.content.clone().or_else(|| known.content.clone()),
        locations: update.locations.clone().or_else(|| known.locations.clone()),
    }
}

/// A JSON-RPC error's class: ACP's "authentication required" and auth words are `Auth` (not
/// retryable: someone must give the agent a key), the shared text rules next, else `Api`.
pub(crate) fn classify_rpc_error(body: &RpcErrorBody) -> (ErrorClass, bool) {
    if body.code == AUTH_REQUIRED && body.message.to_lowercase().contains("auth") {
        return (ErrorClass::Auth, false);
    }
    let text = body.describe();
    let status = body
        .data
        .as_ref()
        .and_then(|d| d.get("status").or_else(|| d.get("statusCode")))
        .and_then(Value::as_u64)
        .and_then(|s| u16::try_from(s).ok());
    match classify(status, &text, None) {
        Some(ErrorClass::Auth) => (ErrorClass::Auth, false),
        Some(ErrorClass::Quota) => (ErrorClass::Quota, false),
        Some(class) => (class, true),
        None => (ErrorClass::Api, true),
    }
}

/// Usage from a prompt's answer, where the agent reports it: ACP's `usage` (`inputTokens`,
/// `outputTokens`, `cachedReadTokens`, `cachedWriteTokens`, `thoughtTokens`; OpenCode), or
/// Gemini CLI's `_meta.quota.token_count` (`input_tokens`, `output_tokens`). `None` when
/// neither is there: unreported, never 0.
pub(crate) fn usage(result: &PromptResult) -> Option<Usage> {
    let num = |v: &Value, keys: &[&str]| keys.iter().find_map(|k| v.get(*k)?.as_u64());
    if let Some(u) = result.usage.as_ref().filter(|u| u.is_object()) {
        let usage = Usage {
            input_tokens: num(u, &["inputTokens", "input_tokens"]),
            output_tokens: num(u, &["outputTokens", "output_tokens"]),
            cache_read_tokens: num(u, &["cachedReadTokens", "cacheReadTokens"]),
            cache_write_tokens: num(u, &["cachedWriteTokens", "cacheWriteTokens"]),
            reasoning_tokens: num(u, &["thoughtTokens", "reasoningTokens"]),
            ..Usage::default()
        };
        if !usage.is_empty() {
            return Some(usage);
        }
    }
    let counts = result
        .meta
        .as_ref()
        .and_then(|m| m.get("quota"))
        .and_then(|q| q.get("token_count"))?;
    let usage = Usage {
        input_tokens: num(counts, &["input_tokens", "inputTokens"]),
        output_tokens: num(counts, &["output_tokens", "outputTokens"]),
        ..Usage::default()
    };
    (!usage.is_empty()).then_some(usage)
}

#[cfg(test)]
mod tests;
