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
//! Approvals (under a tool policy, `approval.rs`): a gated server request is answered at once
//! when the policy allows or denies it (a denial also emits `ToolDenied`), or becomes an
//! `ApprovalRequest` answered when the runner's `Control::Approval` comes. Requests still open
//! when the turn is stopped, aborted or the query closes are declined.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::protocol::{input_text, user_input};
use provider::driver::refusal;
use provider::{
    ApprovalAnswer, Control, ElicitationMode, ErrorClass, InterruptReason, Prompt, PromptId,
    ProviderEvent, ToolPolicy, Usage,
};

pub(super) use state::{Action, QueryState};
use state::{ActiveTurn, Cause, Interrupt};

/// How long a push waits for a running tool before interrupting anyway. Interrupting while a
/// tool runs loses its result from the model's view (Codex records "aborted by user") even if the
/// tool finished its work, e.g. a `send_message` that was written: the model could send it again.
pub(super) const PUSH_TOOL_GRACE: Duration = Duration::from_secs(10);

/// At most one `Activity { tool: None }` per this interval (deltas arrive per token).
pub(super) const ACTIVITY_INTERVAL: Duration = Duration::from_secs(1);

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

mod state;
mod wire;

#[cfg(test)]
mod tests;
