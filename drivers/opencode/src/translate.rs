//! Translation of one query's OpenCode events into [`ProviderEvent`]s.
//!
//! [`Turn`] is a pure state machine: the driver tells it which user messages it posted (with
//! the message ids it chose and the highest prompt id each carries) and feeds it the SSE events
//! of the session; it answers with provider events and with what the driver must do. It never
//! counts `session.idle` events (an abort produces two) and never relies on event timing: a
//! turn's result is tied to the user message it answers through the assistant message's
//! `parentID`.
//!
//! * Result: at `session.idle`, each assistant message of ours that completed without error
//!   and whose finish ends OpenCode's run loop (`stop`, `length`, ... but not
//!   `tool-calls`/`unknown`) and was not reported yet. Its text parts are the result text;
//!   `covers` is the highest prompt carried by a posted message up to its `parentID` (a
//!   follow-up queued into a running loop moves `parentID` forward, so the final answer covers
//!   it too). Results wait for the idle because OpenCode serializes an event's payload when it
//!   sends it: a `message.updated` may already show the step finished before its text parts
//!   arrive (seen with a fast model).
//! * Error: `session.error` (or an error on one of our assistant messages), classified by HTTP
//!   status; `MessageAbortedError` while the driver aborts on purpose is ignored.
//! * Retries: `session.status` `retry` becomes an informational error; past `max_retries` the
//!   turn fails and the driver aborts OpenCode's remaining retries (they are hard-coded to 5
//!   with growing backoff, docs/contract/providers.md#opencode).
//! * Usage: every `step-finish` part of our answers (one per model request; SSE repeats part
//!   updates, so they are kept by part id) is summed once into the usage of the result, error or
//!   interruption that ends its turn. A result takes the steps of its own message and earlier.
//! * Text: a text part is complete when OpenCode sets its `time.end` (or, failing that, when a
//!   tool call of the same message starts, or at the result): each one becomes one
//!   `ProviderEvent::Text`, before the tool call's `Activity`.
//! * Tools: OpenCode's tool names become the canonical vocabulary (`bash` → `Bash`, an MCP
//!   server's `<server>_<tool>` → `mcp__<server>__<tool>`), announced once the call's arguments
//!   are known (the part's first update is `pending` with empty input).
//! * maxTurnsPerQuery: when the turn's step count reaches the limit and the step ended in tool
//!   calls (the turn goes on), the driver aborts the run loop and reports `Interrupted`.

use std::collections::{BTreeMap, HashSet};

use serde_json::Value;

use provider::driver::activity::one_line_summary;
use provider::driver::classify::classify;
use provider::{ErrorClass, PromptId, ProviderEvent, Usage};

use super::approval::{self, Asked};
use super::protocol::{
    ErrorInfo, Event, MessageInfo, MessageWithParts, Part, StepFigures, MCP_SERVER,
};
use super::tools::{argument_field, canonical_tool};

/// What the driver has to do after an event, besides forwarding provider events.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Output {
    /// Forward this to the runner.
    Event(ProviderEvent),
    /// The session's run loop stopped (`session.idle`).
    Idle,
    /// The turn failed on our side (too many retries): abort OpenCode's run loop.
    AbortSession,
    /// The turn reached `maxTurnsPerQuery` model requests and goes on (tool calls): abort the
    /// run loop and report `Interrupted { reason: MaxTurns }`.
    MaxTurns,
    /// OpenCode waits for a person (`question.asked`): answer it.
    Asked {
        /// `question.asked`.
        kind: String,
        /// The request id.
        request_id: String,
    },
    /// OpenCode asks whether a tool call may run (`permission.asked`): decide it by the policy.
    Permission {
        /// The request.
        asked: Asked,
        /// The call's tool part as last seen: OpenCode's tool name and its input.
        part: Option<(String, Value)>,
    },
    /// A tool of `approvalStopTools` completed: end the turn (`Interrupted { ApprovalStop }`).
    ApprovalStop,
}

/// A user message the driver posted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Posted {
    message_id: String,
    prompt: PromptId,
}

/// One model request of ours (a `step-finish` part).
#[derive(Debug)]
struct Step {
    message_id: String,
    figures: StepFigures,
    /// Already summed into a result, error or interruption.
    taken: bool,
}

/// One query's view of an OpenCode session.
#[derive(Debug)]
pub(super) struct Turn {
    session_id: String,
    max_retries: u32,
    posted: Vec<Posted>,
    /// Assistant messages answering one of our messages, by id.
    assistants: BTreeMap<String, MessageInfo>,
    /// Text parts of those messages, in creation order: message id -> [(part id, text)].
    texts: BTreeMap<String, Vec<(String, String)>>,
    /// Parts already reported as activity.
    seen_parts: HashSet<String>,
    /// The message of every part seen: part id -> message id.
    part_owners: BTreeMap<String, String>,
    /// Tool parts that are pending or running: part id -> tool name.
    tools: BTreeMap<String, String>,
    /// Assistant messages already turned into a result.
    reported: HashSet<String>,
    covered: Option<PromptId>,
    /// The driver aborts OpenCode's loop on purpose (to restart it with a follow-up).
    aborting: bool,
    /// After such an abort, until OpenCode answers the restart: a late `MessageAbortedError`
    /// still belongs to our abort.
    abort_grace: bool,
    /// Assistant messages that were running when we aborted.
    aborted: HashSet<String>,
    failed: bool,
    last_retry: u32,
    /// `step-finish` parts of our answers, by part id.
    steps: BTreeMap<String, Step>,
    /// Text parts already sent as `ProviderEvent::Text`.
    texts_sent: HashSet<String>,
    /// Tool parts already announced as `Activity`.
    tools_announced: HashSet<String>,
    max_turns: Option<u32>,
    max_turns_reached: bool,
    /// The MCP servers whose tools OpenCode names `<server>_<tool>`, longest name first.
    mcp_servers: Vec<String>,
    /// Tool calls by `callID` once their input is known (past `pending`): OpenCode's tool name
    /// and the input (for `permission.asked`).
    calls: BTreeMap<String, (String, Value)>,
    /// `permission.asked` requests that came before their call's input, by `callID`.
    early_asks: BTreeMap<String, Asked>,
    /// Canonical names of the approval-stop tools.
    approval_stops: Vec<String>,
    /// Tool parts already reported as denied or as an approval stop.
    tools_concluded: HashSet<String>,
    /// An approval-stop tool is running: the abort its result brings (the plugin's, see
    /// `approval::approval_stop_plugin`) ends the turn as an approval stop, not an error.
    stop_running: bool,
    /// The turn ended by an approval stop (reported once).
    stopped: bool,
}

impl Turn {
    /// A turn on `session_id`; OpenCode's retries beyond `max_retries` fail the turn.
    pub(super) fn new(session_id: impl Into<String>, max_retries: u32) -> Self {
        Self {
            session_id: session_id.into(),
            max_retries,
            posted: Vec::new(),
            assistants: BTreeMap::new(),
            texts: BTreeMap::new(),
            seen_parts: HashSet::new(),
            part_owners: BTreeMap::new(),
            tools: BTreeMap::new(),
            reported: HashSet::new(),
            covered: None,
            aborting: false,
            abort_grace: false,
            aborted: HashSet::new(),
            failed: false,
            last_retry: 0,
            steps: BTreeMap::new(),
            texts_sent: HashSet::new(),
            tools_announced: HashSet::new(),
            max_turns: None,
            max_turns_reached: false,
            mcp_servers: vec![MCP_SERVER.to_owned()],
            calls: BTreeMap::new(),
            early_asks: BTreeMap::new(),
            approval_stops: Vec::new(),
            tools_concluded: HashSet::new(),
            stop_running: false,
            stopped: false,
        }
    }

    /// The canonical MCP tool names after whose result the turn ends (`approvalStopTools`).
    pub(super) fn set_approval_stops(&mut self, tools: &[String]) {
        self.approval_stops = tools.to_vec();
    }

    /// The MCP servers whose tools OpenCode names `<server>_<tool>`, longest name first.
    pub(super) fn mcp_servers(&self) -> &[String] {
        &self.mcp_servers
    }

    /// The most model requests one turn may make (`maxTurnsPerQuery`); `None`: no limit.
    pub(super) fn set_max_turns(&mut self, max_turns: Option<u32>) {
        self.max_turns = max_turns;
    }

    /// The MCP servers besides mcp-tools (`nanoclaw`), whose tools get `mcp__` names.
    pub(super) fn add_mcp_servers<'n>(&mut self, names: impl IntoIterator<Item = &'n String>) {
        self.mcp_servers.extend(names.into_iter().cloned());
        // `a_b` before `a`: the longest server name that prefixes a tool name owns it.
        self.mcp_servers
            .sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        self.mcp_servers.dedup();
    }

    /// The highest prompt the model has seen: the prompts posted up to the user message the
    /// latest answer replies to (and every covered one); the first prompt at least.
    pub(super) fn seen(&self) -> PromptId {
        let parent = self
            .assistants
            .values()
            .filter_map(|info| info.parent_id.as_deref())
            .max();
        let seen = parent.and_then(|parent| {
            self.posted
                .iter()
                .filter(|p| p.message_id.as_str() <= parent)
                .map(|p| p.prompt)
                .max()
        });
        seen.into_iter().chain(self.covered).max().unwrap_or(0)
    }

    /// The usage of every step not summed yet (for an error or interruption that ends the
    /// turn); `None` when OpenCode reported no step.
    pub(super) fn take_usage(&mut self) -> Option<Usage> {
        self.take_usage_upto(None)
    }

    /// Sums (once) the steps of messages up to `last` (ids sort in creation order), or all.
    fn take_usage_upto(&mut self, last: Option<&str>) -> Option<Usage> {
        let mut total: Option<Usage> = None;
        for step in self.steps.values_mut() {
            if step.taken || last.is_some_and(|last| step.message_id.as_str() > last) {
                continue;
            }
            step.taken = true;
            let model = self
                .assistants
                .get(&step.message_id)
                .and_then(MessageInfo::model_id);
            total
                .get_or_insert_with(Usage::default)
                .add(&step_usage(&step.figures, model));
        }
        total
    }

    /// The session.
    pub(super) fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Records a user message about to be posted; call it BEFORE the request, since events
    /// about the message may arrive before the response.
    pub(super) fn posted(&mut self, message_id: impl Into<String>, prompt: PromptId) {
        self.posted.push(Posted {
            message_id: message_id.into(),
            prompt,
        });
        self.last_retry = 0;
    }

    /// Forgets a message whose post failed.
    pub(super) fn unpost(&mut self, message_id: &str) {
        self.posted.retain(|p| p.message_id != message_id);
    }

    /// While true, `MessageAbortedError` is expected (the driver aborts to restart) and ignored;
    /// after it is set back to false, until OpenCode starts answering the next posted message.
    pub(super) fn set_aborting(&mut self, aborting: bool) {
        self.aborting = aborting;
        if aborting {
            self.abort_grace = true;
            self.tools.clear();
            let running = self
                .assistants
                .values()
                .filter(|info| !info.is_completed())
                .map(|info| info.id.clone());
            self.aborted.extend(running);
        }
    }

    /// True while the driver aborts on purpose.
    pub(super) fn aborting(&self) -> bool {
        self.aborting
    }

    /// The highest prompt posted so far.
    pub(super) fn last_posted(&self) -> Option<PromptId> {
        self.posted.iter().map(|p| p.prompt).max()
    }

    /// True when every posted prompt is covered by a result.
    pub(super) fn all_covered(&self) -> bool {
        match (self.last_posted(), self.covered) {
            (None, _) => true,
            (Some(last), Some(covered)) => covered >= last,
            (Some(_), None) => false,
        }
    }

    /// True while a tool call of ours is pending or running.
    pub(super) fn tool_running(&self) -> bool {
        !self.tools.is_empty()
    }

    /// True once the turn ended with an error.
    pub(super) fn failed(&self) -> bool {
        self.failed
    }

    /// Marks the turn failed (the driver reported the error itself).
    pub(super) fn fail(&mut self) {
        self.failed = true;
    }

    /// Handles one event.
    pub(super) fn handle(&mut self, event: &Event) -> Vec<Output> {
        if event.session_id() != Some(self.session_id.as_str()) {
            return Vec::new();
        }
        match event {
            Event::MessageUpdated(info) => self.message(info),
            Event::PartUpdated(part) => self.part(part),
            // Streamed text of one of our answers: the model makes progress.
            Event::PartDelta {
                part_id,
                text_delta,
                ..
            } if !self.failed
                && self
                    .part_owners
                    .get(part_id)
                    .is_some_and(|message| self.assistants.contains_key(message)) =>
            {
                if let Some(delta) = text_delta {
                    self.append_text(part_id, delta);
                }
                vec![Output::Event(ProviderEvent::Output)]
            }
            Event::Status { status, .. } if status.kind == "retry" => self.retry(
                status.attempt.unwrap_or(0),
                status.message.as_deref(),
                status.next,
            ),
            // OpenCode 1.18.33 sends both `session.status` idle and `session.idle` when a run
            // loop ends; either counts, in case a later version drops one. Handling an idle
            // twice is harmless.
            Event::Idle { .. } | Event::Status { .. } if is_idle(event) => {
                let mut out = self.results();
                out.push(Output::Idle);
                out
            }
            Event::SessionError { error, .. } => self.error(error),
            Event::Compacted { .. } => vec![Output::Event(ProviderEvent::Progress {
                message: "OpenCode compacted the conversation to fit the context window".into(),
            })],
            Event::Asked {
                kind, properties, ..
            } if kind == "permission.asked" => match Asked::parse(properties) {
                // OpenCode can ask before it publishes the call's input (measured with bash):
                // the decision waits for it, since the input is what the policy matches and
                // what the user approves. Permissions that are no tool call need no input.
                Some(asked) => match asked.call_id.clone() {
                    Some(call)
                        if !self.calls.contains_key(&call)
                            && !approval::is_not_a_tool(&asked.permission) =>
                    {
                        self.early_asks.insert(call, asked);
                        Vec::new()
                    }
                    call => {
                        let part = call.and_then(|call| self.calls.get(&call)).cloned();
                        vec![Output::Permission { asked, part }]
                    }
                },
                None => Vec::new(),
            },
            Event::Asked {
                kind, request_id, ..
            } => {
                let mut out = vec![Output::Event(ProviderEvent::Progress {
                    message: format!("OpenCode asked for a decision ({kind}); answering it"),
                })];
                if let Some(request_id) = request_id {
                    out.push(Output::Asked {
                        kind: kind.clone(),
                        request_id: request_id.clone(),
                    });
                }
                out
            }
            _ => Vec::new(),
        }
    }

    /// Feeds the authoritative message list (`GET /session/{id}/message`), for when events may
    /// have been missed; already reported results are not repeated.
    pub(super) fn reconcile(&mut self, messages: &[MessageWithParts]) -> Vec<Output> {
        let mut out = Vec::new();
        for message in messages {
            if message.info.session_id != self.session_id {
                continue;
            }
            let known = self.is_ours(&message.info);
            if !known {
                continue;
            }
            self.assistants
                .insert(message.info.id.clone(), message.info.clone());
            for part in &message.parts {
                self.track_part(part);
            }
            out.extend(self.message(&message.info));
        }
        out.extend(self.results());
        out
    }

    fn is_ours(&self, info: &MessageInfo) -> bool {
        info.is_assistant()
            && info
                .parent_id
                .as_deref()
                .is_some_and(|parent| self.posted.iter().any(|p| p.message_id == parent))
    }

    fn message(&mut self, info: &MessageInfo) -> Vec<Output> {
        if !self.is_ours(info) {
            return Vec::new();
        }
        self.assistants.insert(info.id.clone(), info.clone());
        let latest = self.posted.last().map(|p| p.message_id.as_str());
        if !self.aborting && info.parent_id.as_deref() == latest && !self.aborted.contains(&info.id)
        {
            self.abort_grace = false;
        }
        if !info.is_completed() {
            return Vec::new();
        }
        // A finished step's tools are over, whatever their last update said.
        let id = info.id.clone();
        let finished: Vec<String> = self
            .tools
            .keys()
            .filter(|part| self.part_owner(part) == Some(&id))
            .cloned()
            .collect();
        let mut out = Vec::new();
        if !finished.is_empty() {
            for part in finished {
                self.tools.remove(&part);
            }
            out.push(Output::Event(ProviderEvent::ToolEnded {
                running: self.tools.len(),
            }));
        }
        if let Some(error) = &info.error {
            if error.is_abort() && self.aborted.contains(&info.id) {
                return out;
            }
            out.extend(self.error(error));
        }
        out
    }

    /// Results for every finished answer not reported yet, oldest first. Called when the run
    /// loop is idle: only then are all its part events delivered (OpenCode serializes an
    /// event's payload when it sends it, so a `message.updated` can show a step as finished
    /// before the events of its text parts arrive).
    fn results(&mut self) -> Vec<Output> {
        if self.failed {
            return Vec::new();
        }
        let ready: Vec<MessageInfo> = self
            .assistants
            .values()
            .filter(|info| {
                info.is_completed()
                    && info.error.is_none()
                    && info.ends_loop()
                    && !self.reported.contains(&info.id)
            })
            .cloned()
            .collect();
        let mut out = Vec::new();
        for info in ready {
            self.reported.insert(info.id.clone());
            let parent = info.parent_id.clone().unwrap_or_default();
            let covers = self
                .posted
                .iter()
                .filter(|p| p.message_id <= parent)
                .map(|p| p.prompt)
                .max();
            let Some(covers) = covers else { continue };
            if self.covered.is_some_and(|covered| covered >= covers) {
                tracing::debug!(covers, message_id = %info.id, "OpenCode answered prompts already covered");
                continue;
            }
            self.covered = Some(covers);
            // Every piece of the answer goes out as Text before the result.
            out.extend(self.flush_texts(&info.id));
            let text = self
                .texts
                .get(&info.id)
                .map(|parts| {
                    parts
                        .iter()
                        .map(|(_, text)| text.trim())
                        .filter(|text| !text.is_empty())
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .unwrap_or_default();
            let usage = self.take_usage_upto(Some(&info.id));
            out.push(Output::Event(ProviderEvent::Result {
                text,
                covers,
                usage,
            }));
        }
        out
    }

    /// Which message a part belongs to.
    fn part_owner(&self, part_id: &str) -> Option<&String> {
        self.part_owners.get(part_id)
    }

    fn part(&mut self, part: &Part) -> Vec<Output> {
        if !self.assistants.contains_key(&part.message_id) {
            return Vec::new();
        }
        let was_running = self.tools.contains_key(&part.id);
        let new = self.track_part(part);
        let mut early = Vec::new();
        if let Some(call) = part
            .call_id
            .as_ref()
            .filter(|call| self.calls.contains_key(*call))
        {
            if let Some(asked) = self.early_asks.remove(call) {
                let part = self.calls.get(call).cloned();
                early.push(Output::Permission { asked, part });
            }
        }
        if self.failed {
            // OpenCode still waits for the answer.
            return early;
        }
        let mut out = Vec::new();
        match part.kind.as_str() {
            "tool" => {
                let pending = part.state.as_ref().is_none_or(|s| s.status == "pending");
                let announce = !pending && self.tools_announced.insert(part.id.clone());
                if announce {
                    // The text before a tool call is complete once the call runs.
                    out.extend(self.flush_texts(&part.message_id));
                    let raw = part.tool.as_deref().unwrap_or_default();
                    out.push(Output::Event(ProviderEvent::Activity {
                        tool: Some(canonical_tool(raw, &self.mcp_servers)),
                        summary: part.tool_input().and_then(|input| summary(raw, input)),
                    }));
                } else if pending && new {
                    // The call's arguments are streaming: model output.
                    out.push(Output::Event(ProviderEvent::Output));
                }
                if (was_running || announce) && !self.tools.contains_key(&part.id) {
                    out.push(Output::Event(ProviderEvent::ToolEnded {
                        running: self.tools.len(),
                    }));
                }
                out.extend(self.conclude_tool(part));
                out.append(&mut early);
            }
            // Text and reasoning grow with every update: each one is model output.
            "text" => {
                out.push(Output::Event(ProviderEvent::Output));
                if part.text_ended() {
                    out.extend(self.text_done(&part.message_id, &part.id));
                }
            }
            "reasoning" => out.push(Output::Event(ProviderEvent::Output)),
            "step-start" if new => out.push(Output::Event(ProviderEvent::Activity {
                tool: None,
                summary: None,
            })),
            "step-finish" if new => out.extend(self.check_max_turns(part)),
            _ => {}
        }
        out
    }

    /// A denial by OpenCode's `permission` config (`ToolDenied`), or a completed approval-stop
    /// tool (`ApprovalStop`); once per part.
    fn conclude_tool(&mut self, part: &Part) -> Option<Output> {
        let state = part.state.as_ref()?;
        let raw = part.tool.as_deref().unwrap_or_default();
        let tool = canonical_tool(raw, &self.mcp_servers);
        if self.approval_stops.contains(&tool) {
            // A stop tool that failed ends nothing: a later abort is someone else's.
            self.stop_running = state.status == "running";
        }
        let output = match state.status.as_str() {
            "error"
                if state
                    .error
                    .as_deref()
                    .is_some_and(approval::is_config_denial) =>
            {
                Output::Event(ProviderEvent::ToolDenied {
                    summary: part.tool_input().and_then(|input| summary(raw, input)),
                    tool,
                })
            }
            "completed" if self.approval_stops.contains(&tool) && !self.aborting => {
                return self.approval_stop();
            }
            _ => return None,
        };
        self.tools_concluded
            .insert(part.id.clone())
            .then_some(output)
    }

    /// `ApprovalStop`, once per turn.
    fn approval_stop(&mut self) -> Option<Output> {
        (!std::mem::replace(&mut self.stopped, true)).then_some(Output::ApprovalStop)
    }

    /// Adds streamed text to a text part. OpenCode 1.18.33 sends a text part's text in deltas
    /// and updates the part itself only when the text ends, which for a text followed by a tool
    /// call is after the call started running: the deltas are what is known by then.
    fn append_text(&mut self, part_id: &str, delta: &str) {
        let Some(message) = self.part_owners.get(part_id) else {
            return;
        };
        if let Some(entry) = self
            .texts
            .get_mut(message)
            .and_then(|parts| parts.iter_mut().find(|(id, _)| id == part_id))
        {
            entry.1.push_str(delta);
        }
    }

    /// `Text` for a finished text part, once; nothing for an empty one, for one that was cut
    /// by an abort (it is not a complete piece of text), or one that was already sent.
    fn text_done(&mut self, message_id: &str, part_id: &str) -> Option<Output> {
        if self.aborting || self.aborted.contains(message_id) {
            return None;
        }
        let text = self
            .texts
            .get(message_id)?
            .iter()
            .find(|(id, _)| id == part_id)
            .map(|(_, text)| text.clone())?;
        if text.trim().is_empty() || !self.texts_sent.insert(part_id.to_owned()) {
            return None;
        }
        Some(Output::Event(ProviderEvent::Text { text }))
    }

    /// `Text` for every text part of `message_id` not sent yet, in order.
    fn flush_texts(&mut self, message_id: &str) -> Vec<Output> {
        let parts: Vec<String> = self
            .texts
            .get(message_id)
            .map(|parts| parts.iter().map(|(id, _)| id.clone()).collect())
            .unwrap_or_default();
        parts
            .iter()
            .filter_map(|part| self.text_done(message_id, part))
            .collect()
    }

    /// After a new `step-finish`: `MaxTurns` when the turn's steps reached the limit and this
    /// step ended in tool calls (OpenCode would ask the model again).
    fn check_max_turns(&mut self, part: &Part) -> Option<Output> {
        let max = self.max_turns?;
        if self.max_turns_reached || self.aborting || part.finish_reason() != Some("tool-calls") {
            return None;
        }
        let steps = self.steps.values().filter(|step| !step.taken).count();
        if steps < usize::try_from(max).unwrap_or(usize::MAX) {
            return None;
        }
        self.max_turns_reached = true;
        Some(Output::MaxTurns)
    }

    /// Updates texts and tools from a part; true when the part is new.
    fn track_part(&mut self, part: &Part) -> bool {
        let new = self.seen_parts.insert(part.id.clone());
        self.part_owners
            .insert(part.id.clone(), part.message_id.clone());
        match part.kind.as_str() {
            "text" if part.synthetic != Some(true) && part.ignored != Some(true) => {
                let text = part.text.clone().unwrap_or_default();
                let parts = self.texts.entry(part.message_id.clone()).or_default();
                match parts.iter_mut().find(|(id, _)| *id == part.id) {
                    Some(entry) => entry.1 = text,
                    None => parts.push((part.id.clone(), text)),
                }
            }
            "step-finish" => {
                let figures = part.step_figures();
                self.steps
                    .entry(part.id.clone())
                    .and_modify(|step| step.figures = figures)
                    .or_insert_with(|| Step {
                        message_id: part.message_id.clone(),
                        figures,
                        taken: false,
                    });
            }
            "tool" => {
                let known = part.state.as_ref().is_some_and(|s| s.status != "pending");
                if let (Some(call), Some(input), true) = (&part.call_id, part.tool_input(), known) {
                    let tool = part.tool.clone().unwrap_or_default();
                    self.calls.insert(call.clone(), (tool, input.clone()));
                }
                let status = part.state.as_ref().map(|s| s.status.as_str()).unwrap_or("");
                match status {
                    "pending" | "running" if !self.aborting => {
                        self.tools
                            .insert(part.id.clone(), part.tool.clone().unwrap_or_default());
                    }
                    _ => {
                        if status == "error" {
                            tracing::debug!(
                                tool = part.tool.as_deref().unwrap_or(""),
                                error = part
                                    .state
                                    .as_ref()
                                    .and_then(|s| s.error.as_deref())
                                    .unwrap_or(""),
                                "OpenCode tool call failed (the model sees the error)"
                            );
                        }
                        self.tools.remove(&part.id);
                    }
                }
            }
            _ => {}
        }
        new
    }

    fn retry(&mut self, attempt: u32, message: Option<&str>, next: Option<f64>) -> Vec<Output> {
        if self.failed || self.aborting || attempt <= self.last_retry {
            return Vec::new();
        }
        self.last_retry = attempt;
        let message = message.unwrap_or("model API error");
        // OpenCode schedules the next attempt after the gateway's retry-after: the reset.
        let classification =
            classify(None, message, next.and_then(secs_until)).unwrap_or(ErrorClass::Api);
        if attempt > self.max_retries {
            self.failed = true;
            // Abort first: OpenCode's next attempt may be only the retry-after away.
            return vec![
                Output::AbortSession,
                Output::Event(ProviderEvent::Error {
                    message: format!(
                        "model API error after {} retries: {message}",
                        attempt.saturating_sub(1)
                    ),
                    // A rate limit passes; anything else was retried by OpenCode already.
                    retryable: matches!(classification, ErrorClass::RateLimited { .. }),
                    classification,
                    ends_turn: true,
                    usage: self.take_usage(),
                }),
            ];
        }
        vec![Output::Event(ProviderEvent::Error {
            message: format!("OpenCode retries the model API (retry {attempt}): {message}"),
            retryable: true,
            classification,
            ends_turn: false,
            usage: None,
        })]
    }

    fn error(&mut self, error: &ErrorInfo) -> Vec<Output> {
        if self.failed {
            return Vec::new();
        }
        if error.is_abort() && (self.aborting || self.abort_grace) {
            return Vec::new();
        }
        // The plugin aborts the loop inside the tool's `tool.execute.after`, so the abort can
        // arrive before the call's `completed` update.
        if error.is_abort() && (self.stop_running || self.stopped) {
            return self.approval_stop().into_iter().collect();
        }
        self.failed = true;
        let (classification, retryable) = classify_error(error);
        let message = match error.data.status_code {
            Some(status) => format!("{} {status}: {}", error.name, error.text()),
            None if error.is_abort() => "the OpenCode turn was aborted".to_owned(),
            None => format!("{}: {}", error.name, error.text()),
        };
        vec![Output::Event(ProviderEvent::Error {
            message,
            retryable,
            classification,
            ends_turn: true,
            usage: self.take_usage(),
        })]
    }
}

/// One step's figures as a [`Usage`]: OpenCode's `output` leaves reasoning out, ours counts it
/// (as the model APIs do); a cost of 0 is unknown, not free
/// (docs/decisions/opencode.md#D-OPENCODE-02: OpenCode prices a request from its model table,
/// which has no prices for the model we configure).
fn step_usage(figures: &StepFigures, model: Option<&str>) -> Usage {
    Usage {
        input_tokens: figures.input,
        output_tokens: figures
            .output
            .map(|output| output.saturating_add(figures.reasoning.unwrap_or(0))),
        cache_read_tokens: figures.cache_read,
        cache_write_tokens: figures.cache_write,
        reasoning_tokens: figures.reasoning,
        cost_usd: figures.cost.filter(|cost| *cost > 0.0),
        model: model.map(str::to_owned),
        requests: Some(1),
    }
}

/// What a tool call works on, from its arguments, one line cut to the summary's length.
fn summary(tool: &str, input: &Value) -> Option<String> {
    one_line_summary(input.get(argument_field(tool)?)?.as_str()?)
}

fn is_idle(event: &Event) -> bool {
    match event {
        Event::Idle { .. } => true,
        Event::Status { status, .. } => status.kind == "idle",
        _ => false,
    }
}

/// Classifies a terminal OpenCode error. Model API errors arrive after OpenCode's own retries,
/// so running the prompt again right away would not help: not retryable, except a rate limit,
/// which passes (after the reset the gateway named).
fn classify_error(error: &ErrorInfo) -> (ErrorClass, bool) {
    match error.name.as_str() {
        "APIError" => {
            let class = classify(
                error.data.status_code,
                &error.text(),
                retry_after_secs(error),
            )
            .unwrap_or(ErrorClass::Api);
            (class, matches!(class, ErrorClass::RateLimited { .. }))
        }
        "ProviderAuthError" => (ErrorClass::Auth, false),
        // Not ours (the driver ignores its own aborts): something else stopped the turn.
        "MessageAbortedError" => (ErrorClass::Other, true),
        // UnknownError (e.g. a connection that keeps failing), MessageOutputLengthError,
        // ContextOverflowError, ...: the model call failed.
        _ => (ErrorClass::Api, false),
    }
}

/// Whole seconds (rounded up) from now until `epoch_ms`; `None` when it is past or unreadable.
fn secs_until(epoch_ms: f64) -> Option<u64> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_millis() as f64;
    let left = epoch_ms - now_ms;
    (left.is_finite() && left > 0.0).then(|| ((left / 1000.0).ceil() as u64).min(86_400))
}

/// The gateway's `retry-after-ms` / `retry-after` (seconds) header of an API error, in whole
/// seconds (rounded up).
fn retry_after_secs(error: &ErrorInfo) -> Option<u64> {
    let headers = error.data.extra.get("responseHeaders")?.as_object()?;
    let header = |name: &str| {
        headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .and_then(|(_, value)| value.as_str())
            .and_then(|value| value.trim().parse::<f64>().ok())
            .filter(|value| value.is_finite() && *value >= 0.0)
    };
    let millis = header("retry-after-ms").or_else(|| header("retry-after").map(|s| s * 1000.0))?;
    // Bounded above by a day: a header is input.
    Some(((millis / 1000.0).ceil() as u64).min(86_400))
}

#[cfg(test)]
mod tests;
