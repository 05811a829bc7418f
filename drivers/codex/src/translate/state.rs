//! The state of one query, shared by both sides of the state machine: the runner's side
//! (`translate.rs`: controls, pushes, stops, turn bookkeeping) and app-server's side (`wire.rs`:
//! notifications and server requests). Below both, so neither imports the other.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde_json::Value;

use crate::approval::Reply;
use crate::protocol::{RequestId, TokenBreakdown, TurnError};
use provider::policy::Call;
use provider::{
    ElicitationMode, InterruptReason, Prompt, PromptId, ProviderEvent, ToolPolicy, Usage,
};

/// What the driver must do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
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
pub(super) struct OpenApproval {
    pub(super) rpc_id: RequestId,
    pub(super) reply: Reply,
    /// Why the call's command could not be decided, when that is why it is asked: a refusal
    /// then tells the model (a note, as for a policy deny).
    pub(super) undecidable: Option<String>,
}

/// Why we interrupted the active turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cause {
    /// Abort-and-restart for a follow-up.
    Push,
    /// The runner aborted (or dropped) the query.
    Abort,
    /// The runner's interrupt or the step limit: the turn ends with `Interrupted`.
    Stop(InterruptReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Interrupt {
    None,
    /// Wanted, not sent yet (turn id unknown, or a tool is running) since this instant.
    Wanted(Cause, Instant),
    Sent(Cause),
}

#[derive(Debug)]
pub(super) struct ActiveTurn {
    /// Known once `turn/start` answered.
    pub(super) id: Option<String>,
    /// The prompts of `turn/start`.
    pub(super) started_with: Vec<(PromptId, Prompt)>,
    /// Pushes sent with `turn/steer`: (id, prompt, expected userMessage text, echoed yet).
    pub(super) steered: Vec<(PromptId, Prompt, String, bool)>,
    pub(super) interrupt: Interrupt,
    /// Running tool items: item id → tool name.
    pub(super) tools: BTreeMap<String, String>,
    /// Agent message text streamed so far, per item.
    pub(super) deltas: HashMap<String, String>,
    /// The last completed agent message of the turn.
    pub(super) last_message: Option<String>,
    /// The final error announced by an `error` notification (willRetry = false).
    pub(super) error: Option<TurnError>,
    /// Model responses of this turn so far (one `thread/tokenUsage/updated` each).
    pub(super) requests: u32,
    /// A tool started since the last counted response: that response asked for another step.
    pub(super) step_called_tools: bool,
    /// The highest prompt this turn answers when stopped before the model responded: its own
    /// prompts, or for a restart those of the turn it replaces (the pushes that caused the
    /// restart were not acted on, so a stop leaves them to the runner to run again).
    pub(super) own: Option<PromptId>,
    /// The model produced something in this turn (text, reasoning, a tool call, a response).
    pub(super) responded: bool,
}

impl ActiveTurn {
    pub(super) fn new(started_with: Vec<(PromptId, Prompt)>) -> Self {
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
    pub(super) fn seen(&self) -> Option<PromptId> {
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

    pub(super) fn owns(&self, turn_id: Option<&str>) -> bool {
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
pub(crate) struct QueryState {
    pub(super) steer: bool,
    /// Prompts waiting for the next `turn/start`, by id.
    pub(super) queue: Vec<(PromptId, Prompt)>,
    pub(super) active: Option<ActiveTurn>,
    /// The runner said `End`.
    pub(super) ended: bool,
    /// The Aborted error was emitted; waiting for the turn to wind down.
    pub(super) aborted: bool,
    pub(super) closed: bool,
    pub(super) covered: Option<PromptId>,
    pub(super) last_activity: Option<Instant>,
    /// When the last `Output` was emitted (throttled like activity).
    pub(super) last_output: Option<Instant>,
    /// The step limit of a turn (`maxTurnsPerQuery`).
    pub(super) max_turns: Option<u32>,
    /// The model named in usage (the query's, the configured or the thread's; a reroute's).
    pub(super) model: Option<String>,
    /// Usage counted and not yet reported by a turn-ending event.
    pub(super) usage: Option<Usage>,
    /// The thread total of the last counted response (repeats are not new responses).
    pub(super) last_total: Option<TokenBreakdown>,
    /// The turn is being stopped (the runner's interrupt or the step limit).
    pub(super) stop: Option<InterruptReason>,
    /// What the turn interrupted for a push covered: the restart's own prompts.
    pub(super) restart_base: Option<PromptId>,
    /// The tool policy the gated requests are judged by.
    pub(super) policy: ToolPolicy,
    /// What general MCP elicitations get.
    pub(super) elicitation: ElicitationMode,
    /// MCP tools (canonical names) whose result ends the turn.
    pub(super) stop_tools: Vec<String>,
    /// Approval requests the runner has not answered, by our id.
    pub(super) approvals: BTreeMap<String, OpenApproval>,
    /// The result of the approval-stop tool that stopped the turn: Codex records the
    /// interrupted call as "aborted by user", so the model is told the real result in a note.
    pub(super) stop_result: Option<String>,
    /// The files of `fileChange` items seen, by item id (their approval requests name the item
    /// only).
    pub(super) file_changes: HashMap<String, Vec<Call>>,
}
