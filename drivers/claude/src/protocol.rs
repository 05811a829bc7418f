//! What `claude -p --input-format stream-json --output-format stream-json --verbose` reads and
//! writes, one JSON object per line (docs/contract/providers.md#claude-code, measured with Claude
//! Code 2.1.330).
//!
//! The output structs are tolerant on purpose: every field is optional or defaulted and the rest
//! lands in `extra`, so a new field in a CLI release never breaks parsing. A line whose `type` is
//! unknown parses as [`OutLine::Other`] and is logged, not treated as an error.

// Fields that are parsed but not read yet (`extra`, raw stream events) stay for the `Debug`
// output in logs and for the next feature that needs them.
#![allow(dead_code)]

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Map, Value};

/// One stdout line, by its `type`.
#[derive(Debug)]
pub(crate) enum OutLine {
    /// `system` with a `subtype` (`init`, `api_retry`, `status`, `compact_boundary`, ...).
    System(SystemLine),
    /// A complete assistant content block (one event per block, at `content_block_stop`).
    Assistant(MessageLine),
    /// User-role content the CLI added (tool results, interrupt notes, compaction summaries).
    User(MessageLine),
    /// The end of a turn.
    Result(ResultLine),
    /// A raw Anthropic SSE event (`--include-partial-messages`).
    StreamEvent(StreamEventLine),
    /// The answer to one of our control requests.
    ControlResponse(ControlResponseLine),
    /// The CLI asks the host something (permission prompt, hook callback); it must be answered.
    ControlRequest(ControlRequestLine),
    /// A queued prompt changed state (`queued`, `started`, `completed`, `cancelled`, ...).
    CommandLifecycle(LifecycleLine),
    /// Any other `type`; kept for the log.
    Other(String),
}

impl OutLine {
    /// Parses one line. `Err` carries a description for the log.
    pub(crate) fn parse(line: &str) -> Result<OutLine, String> {
        let value: Value = serde_json::from_str(line).map_err(|err| format!("not JSON ({err})"))?;
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        fn typed<T: for<'de> Deserialize<'de>>(value: Value, kind: &str) -> Result<T, String> {
            serde_json::from_value(value).map_err(|err| format!("bad `{kind}` line ({err})"))
        }
        Ok(match kind.as_str() {
            "system" => OutLine::System(typed(value, &kind)?),
            "assistant" => OutLine::Assistant(typed(value, &kind)?),
            "user" => OutLine::User(typed(value, &kind)?),
            "result" => OutLine::Result(typed(value, &kind)?),
            "stream_event" => OutLine::StreamEvent(typed(value, &kind)?),
            "control_response" => OutLine::ControlResponse(typed(value, &kind)?),
            "control_request" => OutLine::ControlRequest(typed(value, &kind)?),
            "command_lifecycle" => OutLine::CommandLifecycle(typed(value, &kind)?),
            _ => OutLine::Other(kind),
        })
    }
}

/// A `system` line. Which fields are set depends on `subtype`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct SystemLine {
    pub subtype: String,
    pub session_id: Option<String>,
    /// `init`: the MCP servers and whether they connected.
    pub mcp_servers: Vec<McpServerStatus>,
    /// `init`: the model in use.
    pub model: Option<String>,
    /// `status`: `"compacting"`, `"requesting"` or null.
    pub status: Option<String>,
    /// `status`: set when a compaction finished (`success` / `failed`).
    pub compact_result: Option<String>,
    /// `status`: why a compaction failed.
    pub compact_error: Option<String>,
    /// `compact_boundary`: trigger and token counts.
    pub compact_metadata: Option<CompactMetadata>,
    /// `api_retry`: attempt number.
    pub attempt: Option<u64>,
    /// `api_retry`: the CLI's retry budget.
    pub max_retries: Option<u64>,
    /// `api_retry`: delay before the next attempt.
    pub retry_delay_ms: Option<u64>,
    /// `api_retry`: HTTP status, when there was a response.
    pub error_status: Option<u16>,
    /// `api_retry`: a category string (`rate_limit`, `server_error`, ...); `api_error`: an object.
    pub error: Option<Value>,
    /// `informational`: the text.
    pub content: Option<String>,
    /// `informational`: `info`, `notice`, `suggestion` or `warning`.
    pub level: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One entry of `system/init` `mcp_servers`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct McpServerStatus {
    pub name: String,
    pub status: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `compact_boundary` details.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct CompactMetadata {
    pub trigger: Option<String>,
    pub pre_tokens: Option<u64>,
    pub post_tokens: Option<u64>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// An `assistant` or `user` line.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct MessageLine {
    pub message: Message,
    /// Set on lines of a subagent (the Agent/Task tool).
    pub parent_tool_use_id: Option<String>,
    pub session_id: Option<String>,
    /// Assistant: the error category of a synthetic API error message.
    pub error: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The `message` of an assistant or user line.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Message {
    /// A string (user text) or a list of content blocks.
    pub content: Value,
    pub model: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Message {
    /// The content blocks (none when `content` is a plain string).
    pub(crate) fn blocks(&self) -> Vec<ContentBlock> {
        match &self.content {
            Value::Array(items) => items
                .iter()
                .filter_map(|item| ContentBlock::deserialize(item).ok())
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// One content block (`text`, `thinking`, `tool_use`, `tool_result`, ...).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ContentBlock {
    #[serde(rename = "type")]
    pub kind: String,
    /// `tool_use`: its id.
    pub id: Option<String>,
    /// `tool_use`: the tool name (`Bash`, `mcp__nanoclaw__send_message`, ...).
    pub name: Option<String>,
    /// `tool_result`: the `tool_use` it answers.
    pub tool_use_id: Option<String>,
    /// `text`: the text.
    pub text: Option<String>,
    /// `tool_use`: the call's arguments (`command`, `file_path`, ...).
    pub input: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A `result` line: the end of a turn.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ResultLine {
    /// `success`, `error_during_execution`, `error_max_turns`, ... An API error keeps
    /// `success` with `is_error: true`.
    pub subtype: String,
    pub is_error: bool,
    /// The final text (the API error text when `is_error`).
    pub result: Option<String>,
    /// Error details of `error_*` subtypes (`No conversation found with session ID: ...`).
    pub errors: Vec<String>,
    pub session_id: Option<String>,
    /// HTTP status of the API error that ended the turn.
    pub api_error_status: Option<u16>,
    /// `completed`, `api_error`, `aborted_streaming`, `aborted_tools`, ...
    pub terminal_reason: Option<String>,
    /// Our `uuid`s of every user message this turn consumed, in consumption order.
    pub user_message_uuids: Option<Vec<String>>,
    /// Prompts still queued behind this turn.
    pub queued_turn_count: Option<u64>,
    /// Agent loop iterations (counts a tool round even when no new request followed it).
    pub num_turns: Option<u64>,
    /// The ids of the model messages this turn began: one per model request.
    pub begun_message_ids: Option<Vec<String>>,
    /// This turn's tokens (zero after an interrupt: see `model_usage_since_last_result`).
    pub usage: Option<TurnUsage>,
    /// The process's cost SO FAR (cumulative over its turns), not this turn's.
    pub total_cost_usd: Option<f64>,
    /// Per model, cumulative over the process's turns.
    #[serde(rename = "modelUsage")]
    pub model_usage: Option<BTreeMap<String, ModelUsage>>,
    /// Per model, since the previous result: exactly this turn, interrupted ones included.
    pub model_usage_since_last_result: Option<BTreeMap<String, ModelUsage>>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A result's `usage` (Anthropic's usage fields, summed over the turn's requests).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct TurnUsage {
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub cache_read_input_tokens: Option<u64>,
    pub cache_creation_input_tokens: Option<u64>,
    pub output_tokens_details: Option<OutputTokensDetails>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `usage.output_tokens_details`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct OutputTokensDetails {
    pub thinking_tokens: Option<u64>,
}

/// One model's entry of `modelUsage` / `model_usage_since_last_result`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct ModelUsage {
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub cache_read_input_tokens: Option<u64>,
    pub cache_creation_input_tokens: Option<u64>,
    pub thinking_tokens: Option<u64>,
    #[serde(rename = "costUSD")]
    pub cost_usd: Option<f64>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A `stream_event` line.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StreamEventLine {
    pub event: Value,
    pub parent_tool_use_id: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A `control_response` line.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ControlResponseLine {
    pub response: ControlResponse,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The body of a `control_response`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ControlResponse {
    /// `success` or `error`.
    pub subtype: String,
    pub request_id: String,
    pub response: Option<Value>,
    pub error: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ControlResponse {
    /// Why the CLI refused our request; `None` when it succeeded.
    pub(crate) fn refusal(&self) -> Option<String> {
        (self.subtype != "success").then(|| {
            self.error
                .clone()
                .unwrap_or_else(|| "refused without a reason".to_owned())
        })
    }
}

/// A `control_request` line from the CLI.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ControlRequestLine {
    pub request_id: String,
    pub request: Value,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ControlRequestLine {
    /// The request's `subtype` (`can_use_tool`, `hook_callback`, ...).
    pub(crate) fn subtype(&self) -> &str {
        self.request
            .get("subtype")
            .and_then(Value::as_str)
            .unwrap_or("?")
    }
}

/// A `command_lifecycle` line: what happened to one of our uuid-stamped prompts.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct LifecycleLine {
    /// The `uuid` we put on the user message.
    pub command_uuid: String,
    /// `queued`, `started`, `completed`, `cancelled`, `discarded` or `refused`.
    pub state: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl LifecycleLine {
    /// True when the prompt will not be worked on any more.
    pub(crate) fn is_terminal(&self) -> bool {
        matches!(
            self.state.as_str(),
            "completed" | "cancelled" | "discarded" | "refused"
        )
    }
}

/// A user message for stdin. `uuid` is ours: the CLI echoes it in `command_lifecycle` lines and
/// in the `user_message_uuids` of the result that consumed it, which is how prompts are matched
/// to turns.
pub(crate) fn user_message(uuid: &str, content: Vec<Value>) -> Value {
    json!({
        "type": "user",
        "message": {"role": "user", "content": content},
        "parent_tool_use_id": null,
        "session_id": "",
        "uuid": uuid,
    })
}

/// An interrupt that also cancels every prompt of ours still queued, so nothing runs after the
/// query is closed.
pub(crate) fn interrupt(request_id: &str) -> Value {
    json!({
        "type": "control_request",
        "request_id": request_id,
        "request": {"subtype": "interrupt", "cancel_queued": true},
    })
}

/// Switches the running process to `model` (`None`: back to the model it was started with).
/// Claude checks the name with a one-token request first and refuses a model the API refuses.
pub(crate) fn set_model(request_id: &str, model: Option<&str>) -> Value {
    json!({
        "type": "control_request",
        "request_id": request_id,
        "request": {"subtype": "set_model", "model": model},
    })
}

/// The SDK host's `initialize`: registers the hook callbacks the CLI then asks us about
/// (`hook_callback` control requests, [`super::approval`]).
pub(crate) fn initialize(request_id: &str, hooks: &Value) -> Value {
    json!({
        "type": "control_request",
        "request_id": request_id,
        "request": {"subtype": "initialize", "hooks": hooks},
    })
}

/// Our answer to the CLI's control request `request_id`.
pub(crate) fn control_success(request_id: &str, response: Value) -> Value {
    json!({
        "type": "control_response",
        "response": {"subtype": "success", "request_id": request_id, "response": response},
    })
}

/// A refusal of a control request the CLI sent us that nothing here answers.
pub(crate) fn control_error(request_id: &str, message: &str) -> Value {
    json!({
        "type": "control_response",
        "response": {"subtype": "error", "request_id": request_id, "error": message},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_types_and_fields_are_tolerated() {
        assert!(matches!(
            OutLine::parse(r#"{"type":"keep_alive","x":1}"#),
            Ok(OutLine::Other(kind)) if kind == "keep_alive"
        ));
        let Ok(OutLine::Result(result)) = OutLine::parse(
            r#"{"type":"result","subtype":"success","is_error":false,"result":"hi","brand_new":{"a":1}}"#,
        ) else {
            panic!("not a result");
        };
        assert_eq!(result.result.as_deref(), Some("hi"));
        assert!(result.extra.contains_key("brand_new"));
        assert!(OutLine::parse("not json").is_err());
    }

    #[test]
    fn status_may_be_null() {
        let Ok(OutLine::System(system)) = OutLine::parse(
            r#"{"type":"system","subtype":"status","status":null,"compact_result":"success"}"#,
        ) else {
            panic!("not a system line");
        };
        assert_eq!(system.status, None);
        assert_eq!(system.compact_result.as_deref(), Some("success"));
    }
}
