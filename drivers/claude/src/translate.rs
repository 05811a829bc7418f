//! Translation of Claude's stream-json output into [`ProviderEvent`]s, without any I/O, so it is
//! unit-tested against captured CLI output (`drivers/claude/tests/fixtures/claude/`).
//!
//! # Which prompts a result covers
//! A `result` line ends a *turn*, and a turn is not one prompt
//! (docs/contract/providers.md#claude-code): a prompt written while a tool runs is folded into the
//! running turn (the model sees it beside the tool result), while one written while text streams
//! waits and runs as a turn of its own. Every user message we write carries our own `uuid`, and
//! Claude 2.1.330 lists the uuids of every user message a turn consumed in the result's
//! `user_message_uuids`. So the rule is:
//!
//! > `covers` = the highest prompt id among the uuids that the results so far consumed.
//!
//! A result that consumed no new prompt of ours (a turn the CLI started by itself) produces no
//! `Result` event, since it answers nothing the runner sent. Without `user_message_uuids` (an
//! older CLI) the `started` states of `command_lifecycle` lines decide; without those too, every
//! prompt written so far minus the result's `queued_turn_count` counts as consumed.
//!
//! # What a turn cost
//! A result's `total_cost_usd` and `modelUsage` are the PROCESS's totals so far (measured: the
//! second turn of a process reports the sum of both), and its `usage` is zero after an
//! interrupt although the model was called. `model_usage_since_last_result` is exactly the
//! turn: tokens and cost are summed over its models, the model is the one with the most output
//! tokens. Without it (an older CLI) the tokens come from `usage` and the cost stays unknown
//! rather than a running total. Requests are the model messages the turn began
//! (`begun_message_ids`; `num_turns` counts loop rounds, one more than the requests when the
//! last round stopped at a limit or an interrupt), else `num_turns`.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::protocol::{
    ContentBlock, LifecycleLine, MessageLine, ModelUsage, OutLine, ResultLine, SystemLine,
    TurnUsage,
};
use provider::driver::activity::one_line_summary;
use provider::driver::classify::classify;
use provider::driver::text::shortened;
use provider::{ErrorClass, InterruptReason, PromptId, ProviderEvent, Usage};

/// Text of the CLI when `--resume` names a session it does not have.
const SESSION_NOT_FOUND: &[&str] = &[
    "No conversation found with session ID",
    "--resume requires a valid session ID",
];

/// What the driver must do besides forwarding events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Signal {
    /// A `result` line ended a turn.
    TurnEnded,
    /// The session given to `--resume` does not exist; start a new one.
    SessionNotFound(String),
    /// The CLI answered our control request `request_id`.
    ControlResponse {
        /// Our request id.
        request_id: String,
        /// Why it refused, when it did.
        error: Option<String>,
    },
    /// The CLI asked the host something; it must get an answer or it waits forever.
    ControlRequest {
        /// Its request id.
        request_id: String,
        /// Its subtype, for the log.
        subtype: String,
        /// The whole request (`hook_callback`, `elicitation`, ...).
        request: Value,
    },
}

/// The translation of one line.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Translated {
    /// Events for the runner, in order.
    pub events: Vec<ProviderEvent>,
    /// Something the driver acts on.
    pub signal: Option<Signal>,
}

impl Translated {
    fn event(event: ProviderEvent) -> Self {
        Self {
            events: vec![event],
            signal: None,
        }
    }

    fn activity() -> Self {
        Self::event(ProviderEvent::Activity {
            tool: None,
            summary: None,
        })
    }

    fn output() -> Self {
        Self::event(ProviderEvent::Output)
    }

    /// True when an event ends the query: an error that ends the turn, or a turn limit.
    pub(crate) fn ends_query(&self) -> bool {
        self.events.iter().any(|event| {
            matches!(
                event,
                ProviderEvent::Error {
                    ends_turn: true,
                    ..
                } | ProviderEvent::Interrupted { .. }
            )
        })
    }
}

/// Per-query translation state.
#[derive(Debug, Default)]
pub(crate) struct Translator {
    /// Our uuid of each prompt written in this query.
    prompts: HashMap<String, PromptId>,
    /// The highest prompt id written.
    written: Option<PromptId>,
    /// The highest prompt id the model has consumed.
    consumed: Option<PromptId>,
    /// The highest `covers` reported in a `Result`.
    reported: Option<PromptId>,
    /// The highest prompt id the model has seen (started or consumed), even if its turn was
    /// interrupted afterwards.
    seen: Option<PromptId>,
    /// The session id last reported with `Init` in this query.
    session: Option<String>,
    /// Lifecycle state of each of our prompts on the current process.
    lifecycle: BTreeMap<PromptId, String>,
    /// Whether the CLI emits `command_lifecycle` lines at all.
    lifecycle_seen: bool,
    /// Main-thread tools that started and have no result yet (id → name).
    tools: HashMap<String, String>,
    /// The summary of each main-thread tool call of the turn (id → summary), for a refusal.
    summaries: HashMap<String, Option<String>>,
    /// The driver ended the turn after an approval-stop tool: its result is
    /// `Interrupted { ApprovalStop }`.
    approval_stop: bool,
    /// The delay of the last `api_retry` for a rate limit (Claude honours `retry-after`), the
    /// best known reset time when the CLI then gives up.
    rate_limit_delay_ms: Option<u64>,
}

impl Translator {
    /// A translator for a new query.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Records that prompt `id` was written with `uuid`.
    pub(crate) fn register(&mut self, uuid: &str, id: PromptId) {
        self.prompts.insert(uuid.to_owned(), id);
        self.written = self.written.max(Some(id));
        self.lifecycle.insert(id, "written".to_owned());
    }

    /// Forgets what the previous process did with our prompts (they are about to be written to a
    /// new one).
    pub(crate) fn new_process(&mut self) {
        self.lifecycle = self
            .prompts
            .values()
            .map(|id| (*id, "written".to_owned()))
            .collect();
        self.lifecycle_seen = false;
        self.tools.clear();
        self.summaries.clear();
        self.approval_stop = false;
        self.consumed = self.reported;
        self.seen = self.reported;
    }

    /// True when every prompt written is covered by a reported `Result`.
    pub(crate) fn all_covered(&self) -> bool {
        self.written.is_none() || self.reported >= self.written
    }

    /// True when a prompt of ours may still be queued or running in the CLI.
    pub(crate) fn outstanding(&self) -> bool {
        if self.lifecycle_seen {
            self.lifecycle.values().any(|state| !is_terminal(state))
        } else {
            !self.all_covered()
        }
    }

    /// The highest prompt id the model has seen: what an interrupted query covers. The first
    /// prompt always counts (`ProviderEvent::Interrupted`); a push still queued does not.
    pub(crate) fn seen_by_model(&self) -> PromptId {
        self.seen.max(self.consumed).max(self.reported).unwrap_or(0)
    }

    /// True while a main-thread tool runs (an MCP tool may block up to the tool timeout).
    pub(crate) fn tool_in_flight(&self) -> bool {
        !self.tools.is_empty()
    }

    /// The driver told the CLI to end the turn after a tool of `approvalStopTools`.
    pub(crate) fn approval_stop(&mut self) {
        self.approval_stop = true;
    }

    /// Translates one stdout line.
    pub(crate) fn on_line(&mut self, line: &str) -> Translated {
        match OutLine::parse(line) {
            Ok(parsed) => self.on_parsed(parsed),
            Err(err) => {
                tracing::warn!(%err, line = %shortened(line, 200), "unparsable line from claude");
                Translated::activity()
            }
        }
    }

    fn on_parsed(&mut self, line: OutLine) -> Translated {
        match line {
            OutLine::System(system) => self.on_system(system),
            OutLine::Assistant(message) => self.on_assistant(message),
            OutLine::User(message) => self.on_user(message),
            OutLine::Result(result) => self.on_result(result),
            // Streamed tokens (text, thinking, tool input) from the model.
            OutLine::StreamEvent(_) => Translated::output(),
            OutLine::CommandLifecycle(lifecycle) => self.on_lifecycle(lifecycle),
            OutLine::ControlResponse(response) => {
                if response.response.subtype != "success" {
                    tracing::warn!(
                        request_id = %response.response.request_id,
                        error = ?response.response.error,
                        "claude refused a control request"
                    );
                }
                Translated {
                    events: Vec::new(),
                    signal: Some(Signal::ControlResponse {
                        error: response.response.refusal(),
                        request_id: response.response.request_id,
                    }),
                }
            }
            OutLine::ControlRequest(request) => Translated {
                events: Vec::new(),
                signal: Some(Signal::ControlRequest {
                    subtype: request.subtype().to_owned(),
                    request_id: request.request_id,
                    request: request.request,
                }),
            },
            OutLine::Other(kind) => {
                tracing::debug!(%kind, "unknown line type from claude");
                Translated::activity()
            }
        }
    }

    fn on_system(&mut self, system: SystemLine) -> Translated {
        match system.subtype.as_str() {
            "init" => self.on_init(system),
            "api_retry" => self.on_api_retry(system),
            "api_error" => on_api_error(system),
            "status" => on_status(system),
            "compact_boundary" => on_compact_boundary(system),
            "informational" if system.level.as_deref() == Some("warning") => {
                Translated::event(ProviderEvent::Progress {
                    message: system.content.unwrap_or_default(),
                })
            }
            // The CLI refused a call by its own rule (`--disallowedTools`).
            "permission_denied" => self.on_permission_denied(&system),
            "model_fallback" | "model_refusal_fallback" | "model_refusal_no_fallback" => {
                Translated::event(ProviderEvent::Progress {
                    message: format!("claude reported {}", system.subtype),
                })
            }
            other => {
                tracing::trace!(subtype = %other, "claude system line");
                Translated::activity()
            }
        }
    }

    /// `system/init`: the session id (once per change) and any MCP server not connected.
    fn on_init(&mut self, system: SystemLine) -> Translated {
        let mut events = Vec::new();
        if let Some(id) = system.session_id.filter(|id| !id.is_empty()) {
            if self.session.as_deref() != Some(id.as_str()) {
                self.session = Some(id.clone());
                events.push(ProviderEvent::Init { session_id: id });
            }
        }
        for server in system
            .mcp_servers
            .iter()
            .filter(|s| s.status != "connected")
        {
            tracing::warn!(server = %server.name, status = %server.status, "MCP server not connected");
            events.push(ProviderEvent::Progress {
                message: format!("MCP server {} is {}", server.name, server.status),
            });
        }
        Translated {
            events,
            signal: None,
        }
    }

    /// `system/api_retry`: the CLI retries the model API itself; a rate limit keeps its delay.
    fn on_api_retry(&mut self, system: SystemLine) -> Translated {
        let category = system
            .error
            .as_ref()
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        let status = system
            .error_status
            .map_or_else(|| "no response".to_owned(), |s| format!("HTTP {s}"));
        let message = format!(
            "model API error ({status}, {category}); claude retries ({}/{}) in {} ms",
            system.attempt.unwrap_or(0),
            system.max_retries.unwrap_or(0),
            system.retry_delay_ms.unwrap_or(0),
        );
        let mut classification = classify_category(category)
            .unwrap_or_else(|| classify(system.error_status, "", None).unwrap_or(ErrorClass::Api));
        if let ErrorClass::RateLimited { .. } = classification {
            self.rate_limit_delay_ms = system.retry_delay_ms;
            classification = ErrorClass::RateLimited {
                retry_after_secs: retry_after_secs(system.retry_delay_ms),
            };
        }
        Translated::event(ProviderEvent::Error {
            message,
            retryable: true,
            classification,
            ends_turn: false,
            usage: None,
        })
    }

    /// `system/permission_denied`: the tool and, when known, its call's summary.
    fn on_permission_denied(&self, system: &SystemLine) -> Translated {
        let tool = system
            .extra
            .get("tool_name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let summary = system
            .extra
            .get("tool_use_id")
            .and_then(Value::as_str)
            .and_then(|id| self.summaries.get(id).cloned().flatten());
        Translated::event(ProviderEvent::ToolDenied { tool, summary })
    }

    fn on_assistant(&mut self, line: MessageLine) -> Translated {
        if line.parent_tool_use_id.is_some() {
            // A subagent's work: liveness only, its tools are not the session's current tool.
            return Translated::activity();
        }
        // One line per content block, emitted when the block is complete: a text block is
        // delivered before the tool call that follows it runs. The CLI's own API error message
        // (`error` set) is no text of the model's: the error result reports it.
        let synthetic = line.error.is_some();
        let mut events = Vec::new();
        let mut tool = false;
        for block in line.message.blocks() {
            match block.kind.as_str() {
                "tool_use" => {
                    tool = true;
                    let summary = tool_summary(&block);
                    let name = block.name.unwrap_or_default();
                    if let Some(id) = block.id {
                        self.tools.insert(id.clone(), name.clone());
                        self.summaries.insert(id, summary.clone());
                    }
                    events.push(ProviderEvent::Activity {
                        tool: Some(name),
                        summary,
                    });
                }
                "text" if !synthetic => {
                    if let Some(text) = block.text.filter(|text| !text.trim().is_empty()) {
                        events.push(ProviderEvent::Text { text });
                    }
                }
                _ => {}
            }
        }
        if !tool {
            events.push(ProviderEvent::Output);
        }
        Translated {
            events,
            signal: None,
        }
    }

    fn on_user(&mut self, line: MessageLine) -> Translated {
        let mut ended = false;
        if line.parent_tool_use_id.is_none() {
            for block in line.message.blocks() {
                if let Some(id) = block.tool_use_id {
                    ended |= self.tools.remove(&id).is_some();
                }
            }
        }
        if ended {
            Translated::event(ProviderEvent::ToolEnded {
                running: self.tools.len(),
            })
        } else {
            Translated::activity()
        }
    }

    fn on_lifecycle(&mut self, line: LifecycleLine) -> Translated {
        let Some(&id) = self.prompts.get(&line.command_uuid) else {
            return Translated::activity();
        };
        self.lifecycle_seen = true;
        if matches!(line.state.as_str(), "started" | "completed") {
            self.seen = self.seen.max(Some(id));
        }
        let before = self.lifecycle.insert(id, line.state.clone());
        let seen_by_model = matches!(before.as_deref(), Some("started" | "completed"));
        if line.is_terminal() && line.state != "completed" && !seen_by_model {
            // A later result must not cover a prompt the model never saw: end the turn so the
            // runner runs it again. (After our own interrupt the driver ignores this.)
            return Translated::event(ProviderEvent::Error {
                message: format!(
                    "claude dropped prompt {id} ({}) before the model saw it",
                    line.state
                ),
                retryable: true,
                classification: ErrorClass::Other,
                ends_turn: true,
                usage: None,
            });
        }
        Translated::activity()
    }

    fn on_result(&mut self, result: ResultLine) -> Translated {
        self.tools.clear();
        self.summaries.clear();
        let approval_stop = std::mem::take(&mut self.approval_stop);
        let errors = result.errors.join("; ");
        if let Some(pattern) = SESSION_NOT_FOUND
            .iter()
            .find(|p| errors.contains(*p) || result.result.as_deref().unwrap_or("").contains(*p))
        {
            tracing::debug!(pattern, "resume failed");
            return Translated {
                events: Vec::new(),
                signal: Some(Signal::SessionNotFound(if errors.is_empty() {
                    result.result.unwrap_or_default()
                } else {
                    errors
                })),
            };
        }
        self.consume(&result);
        let usage = turn_usage(&result);
        let mut translated = Translated {
            events: Vec::new(),
            signal: Some(Signal::TurnEnded),
        };
        // `--max-turns` or an approval stop (the `PostToolUse` answer `continue: false`,
        // measured: a `success` result with `terminal_reason: hook_stopped`, no text) ended the
        // turn: not a failure of the prompts it consumed.
        let stopped = if result.subtype == "error_max_turns" {
            Some(InterruptReason::MaxTurns)
        } else if approval_stop && !result.is_error {
            Some(InterruptReason::ApprovalStop)
        } else {
            None
        };
        if let Some(reason) = stopped {
            let covers = self.seen_by_model();
            self.reported = self.reported.max(Some(covers));
            translated.events.push(ProviderEvent::Interrupted {
                covers,
                usage,
                reason,
            });
            return translated;
        }
        if result.is_error {
            let interrupted = result
                .terminal_reason
                .as_deref()
                .filter(|reason| reason.starts_with("aborted"));
            let message = match (result.result.as_deref(), errors.is_empty(), interrupted) {
                (Some(text), _, _) if !text.is_empty() => text.to_owned(),
                (_, _, Some(reason)) => format!("claude interrupted the turn ({reason})"),
                (_, false, _) => errors,
                _ => format!(
                    "claude ended the turn with {} ({})",
                    result.subtype,
                    result
                        .terminal_reason
                        .as_deref()
                        .unwrap_or("no reason given")
                ),
            };
            let retry_after = retry_after_secs(self.rate_limit_delay_ms);
            let classification = classify(result.api_error_status, &message, retry_after)
                .unwrap_or_else(|| {
                    // Claude's own wording for a model call it gave up on.
                    if message.to_lowercase().contains("api error") {
                        ErrorClass::Api
                    } else {
                        ErrorClass::Other
                    }
                });
            translated.events.push(ProviderEvent::Error {
                message,
                // A rate limit passes; anything else was retried by Claude already.
                retryable: matches!(classification, ErrorClass::RateLimited { .. }),
                classification,
                ends_turn: true,
                usage,
            });
            return translated;
        }
        match self.consumed {
            Some(covers) if self.reported.is_none_or(|reported| covers > reported) => {
                self.reported = Some(covers);
                translated.events.push(ProviderEvent::Result {
                    text: result.result.unwrap_or_default(),
                    covers,
                    usage,
                });
            }
            _ => {
                tracing::info!(
                    text = %shortened(result.result.as_deref().unwrap_or(""), 200),
                    "claude ended a turn that answered no new prompt"
                );
                translated.events.push(ProviderEvent::Activity {
                    tool: None,
                    summary: None,
                });
            }
        }
        translated
    }

    /// Updates `consumed` from a result (see the module docs for the rule).
    fn consume(&mut self, result: &ResultLine) {
        let from_result = result.user_message_uuids.as_ref().map(|uuids| {
            uuids
                .iter()
                .filter_map(|uuid| self.prompts.get(uuid).copied())
                .max()
        });
        let consumed = match from_result {
            Some(max) => max,
            None if self.lifecycle_seen => self
                .lifecycle
                .iter()
                .filter(|(_, state)| state.as_str() != "written" && state.as_str() != "queued")
                .map(|(id, _)| *id)
                .max(),
            None => self
                .written
                .map(|written| written.saturating_sub(result.queued_turn_count.unwrap_or(0))),
        };
        self.consumed = self.consumed.max(consumed);
    }
}

/// `system/api_error`: a model API error the CLI reports and retries.
fn on_api_error(system: SystemLine) -> Translated {
    let error = system.error.unwrap_or_default();
    let status = error
        .get("status")
        .and_then(Value::as_u64)
        .and_then(|s| u16::try_from(s).ok());
    let message = error
        .get("formatted")
        .or_else(|| error.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("model API error")
        .to_owned();
    Translated::event(ProviderEvent::Error {
        message,
        retryable: true,
        classification: classify(status, "", None).unwrap_or(ErrorClass::Api),
        ends_turn: false,
        usage: None,
    })
}

/// `system/status`: compaction starting or its result; otherwise liveness.
fn on_status(system: SystemLine) -> Translated {
    if let Some(result) = system.compact_result {
        let message = match system.compact_error {
            Some(error) => format!("compaction {result}: {error}"),
            None => format!("compaction {result}"),
        };
        Translated::event(ProviderEvent::Progress { message })
    } else if system.status.as_deref() == Some("compacting") {
        Translated::event(ProviderEvent::Progress {
            message: "compacting the conversation".into(),
        })
    } else {
        Translated::activity()
    }
}

/// `system/compact_boundary`: the conversation was compacted, with its token counts.
fn on_compact_boundary(system: SystemLine) -> Translated {
    let meta = system.compact_metadata.unwrap_or_default();
    let mut message = format!(
        "conversation compacted ({})",
        meta.trigger.as_deref().unwrap_or("unknown trigger")
    );
    if let Some(pre) = meta.pre_tokens {
        message.push_str(&format!(", {pre} tokens before"));
    }
    if let Some(post) = meta.post_tokens {
        message.push_str(&format!(", {post} after"));
    }
    Translated::event(ProviderEvent::Progress { message })
}

/// What the turn a result ends cost (module docs, "What a turn cost"); `None` when the line
/// says nothing about it.
fn turn_usage(result: &ResultLine) -> Option<Usage> {
    let mut usage = match result.model_usage_since_last_result.as_ref() {
        Some(models) if !models.is_empty() => {
            let mut usage = Usage::default();
            for model in models.values() {
                usage.add(&Usage {
                    input_tokens: model.input_tokens,
                    output_tokens: model.output_tokens,
                    cache_read_tokens: model.cache_read_input_tokens,
                    cache_write_tokens: model.cache_creation_input_tokens,
                    reasoning_tokens: model.thinking_tokens,
                    cost_usd: model.cost_usd,
                    ..Usage::default()
                });
            }
            usage.model = busiest_model(models);
            usage
        }
        since_last => {
            let mut usage = result.usage.as_ref().map(tokens).unwrap_or_default();
            usage.model = result.model_usage.as_ref().and_then(busiest_model);
            // Present but empty: the turn used no model (it failed before any answer), which
            // cost nothing; absent: the only cost is the process's running total.
            if since_last.is_some() {
                usage.cost_usd = Some(0.0);
            }
            usage
        }
    };
    usage.requests = match &result.begun_message_ids {
        Some(ids) => u64::try_from(ids.len()).ok(),
        None => result.num_turns,
    };
    (!usage.is_empty()).then_some(usage)
}

/// The token figures of a result's `usage`.
fn tokens(turn: &TurnUsage) -> Usage {
    Usage {
        input_tokens: turn.input_tokens,
        output_tokens: turn.output_tokens,
        cache_read_tokens: turn.cache_read_input_tokens,
        cache_write_tokens: turn.cache_creation_input_tokens,
        reasoning_tokens: turn
            .output_tokens_details
            .as_ref()
            .and_then(|details| details.thinking_tokens),
        ..Usage::default()
    }
}

/// The model that wrote the most output tokens (a turn may call a small model on the side).
fn busiest_model(models: &BTreeMap<String, ModelUsage>) -> Option<String> {
    models
        .iter()
        .max_by_key(|(_, usage)| usage.output_tokens.unwrap_or(0))
        .map(|(name, _)| name.clone())
}

/// What a tool call works on, from its input: the command line, the path, the pattern, the
/// URL or the query; `None` for any other tool.
fn tool_summary(block: &ContentBlock) -> Option<String> {
    let name = block.name.as_deref()?;
    if name.starts_with("mcp__") {
        return None;
    }
    one_line_summary(&tool_argument(name, block.input.as_ref()?)?)
}

/// The whole argument the tool policy matches a call of `tool` on
/// ([`provider::ToolPolicy::decide`]): the command line, the path, the pattern, the URL, the
/// query, or an MCP tool's compact JSON input; `None` for any other tool.
pub(super) fn tool_argument(tool: &str, input: &Value) -> Option<String> {
    if tool.starts_with("mcp__") {
        return Some(input.to_string());
    }
    let field = match tool {
        "Bash" => "command",
        "Read" | "Write" | "Edit" => "file_path",
        "Glob" | "Grep" => "pattern",
        "WebFetch" => "url",
        "WebSearch" => "query",
        _ => return None,
    };
    input.get(field)?.as_str().map(str::to_owned)
}

fn is_terminal(state: &str) -> bool {
    matches!(state, "completed" | "cancelled" | "discarded" | "refused")
}

/// Class of an `api_retry` / assistant `error` category.
fn classify_category(category: &str) -> Option<ErrorClass> {
    match category {
        "authentication_failed"
        | "oauth_org_not_allowed"
        | "account_on_hold"
        | "verification_required"
        | "cloud_credential_error" => Some(ErrorClass::Auth),
        "rate_limit" => Some(ErrorClass::RATE_LIMITED),
        "billing_error" => Some(ErrorClass::Quota),
        "server_error" | "overloaded" | "unknown" | "invalid_request" | "model_not_found"
        | "max_output_tokens" => Some(ErrorClass::Api),
        _ => None,
    }
}

/// Claude's retry delay (its reading of `retry-after`) in whole seconds.
fn retry_after_secs(delay_ms: Option<u64>) -> Option<u64> {
    delay_ms.map(|ms| ms.div_ceil(1000))
}

#[cfg(test)]
mod tests;
