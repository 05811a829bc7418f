//! App-server's side of the state machine: its notifications (items, token usage, errors, the
//! end of a turn) and its server→client requests (approvals), each turned into actions and
//! events. The runner's side (controls, pushes, stops) and the turn bookkeeping stay in
//! `translate.rs`.

use std::time::Instant;

use serde_json::Value;

use super::state::{Action, Cause, Interrupt, OpenApproval, QueryState};
use crate::approval::{self, Verdict};
use crate::command::APPROVAL_STOP_HOOK_STATUS;
use crate::protocol::{
    AgentMessageDelta, ErrorNotification, ItemNotification, MessageNotification, ModelRerouted,
    RequestId, TokenUsageNotification, TurnError, TurnNotification,
};
use provider::driver::classify::classify;
use provider::driver::refusal;
use provider::{
    ApprovalKind, ApprovalRequest, ErrorClass, InterruptReason, PromptId, ProviderEvent, Usage,
};

impl QueryState {
    /// A server→client request: already answered by the connection, or (`pending`) an
    /// approval request to judge.
    pub(crate) fn on_server_request(
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
        let verdict = approval::judge(method, &params, calls, &self.policy, self.elicitation);
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
    pub(crate) fn on_notification(
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

    pub(super) fn on_item(
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
    pub(super) fn on_token_usage(
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

    pub(super) fn on_error(&mut self, n: ErrorNotification, actions: &mut Vec<Action>) {
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

    pub(super) fn on_turn_completed(&mut self, n: TurnNotification, actions: &mut Vec<Action>) {
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
pub(super) fn classify_error(error: &TurnError) -> ErrorClass {
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

fn progress(message: String) -> Action {
    Action::Emit(ProviderEvent::Progress { message })
}
