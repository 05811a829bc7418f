//! The Agent Client Protocol on the wire (JSON-RPC 2.0, one message per line on the agent's
//! stdio; docs/contract/providers.md#acp): the few shapes the driver reads, tolerant as codex-rs'
//! types are (unknown fields ignored, unknown variants kept as `Other`, every field defaulted),
//! and the params it writes.

use serde::Deserialize;
use serde_json::{json, Value};

use provider::settings::{McpServer, RemoteMcpServer};

/// The protocol version the driver speaks (ACP's `protocolVersion`, an integer).
pub(crate) const PROTOCOL_VERSION: u64 = 1;

/// The name under which mcp-tools is handed to the agent (`mcp__nanoclaw__send_message`).
pub(crate) const MCP_SERVER: &str = "nanoclaw";

/// JSON-RPC "method not found": the answer to an agent request the driver does not serve
/// (`fs/*`, `terminal/*`, extensions such as `craft/drainMidTurnQueue`).
pub(crate) const METHOD_NOT_FOUND: i64 = -32601;

/// ACP's "authentication required" error code.
pub(crate) const AUTH_REQUIRED: i64 = -32000;

/// A JSON-RPC id: agents use numbers, strings are allowed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(untagged)]
pub(crate) enum RequestId {
    /// A number.
    Int(i64),
    /// A string.
    Text(String),
}

/// Any JSON-RPC message; which fields are set says what it is.
#[derive(Debug, Deserialize)]
pub(crate) struct Message {
    #[serde(default)]
    pub(crate) id: Option<RequestId>,
    #[serde(default)]
    pub(crate) method: Option<String>,
    #[serde(default)]
    pub(crate) params: Option<Value>,
    #[serde(default)]
    pub(crate) result: Option<Value>,
    #[serde(default)]
    pub(crate) error: Option<RpcErrorBody>,
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct RpcErrorBody {
    #[serde(default)]
    pub(crate) code: i64,
    #[serde(default)]
    pub(crate) message: String,
    #[serde(default)]
    pub(crate) data: Option<Value>,
}

impl RpcErrorBody {
    /// The message with the data's own message when the agent put the real cause there.
    pub(crate) fn describe(&self) -> String {
        let detail = self
            .data
            .as_ref()
            .and_then(|d| d.get("message").and_then(Value::as_str).or(d.as_str()))
            .filter(|d| !d.is_empty() && *d != self.message);
        match detail {
            Some(detail) => format!("{}: {detail}", self.message),
            None => self.message.clone(),
        }
    }
}

/// `initialize`'s answer: what the agent can do.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct InitializeResult {
    pub(crate) protocol_version: Option<Value>,
    pub(crate) agent_capabilities: AgentCapabilities,
    pub(crate) auth_methods: Vec<AuthMethod>,
}

/// `agentCapabilities`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct AgentCapabilities {
    pub(crate) load_session: bool,
    pub(crate) prompt_capabilities: PromptCapabilities,
    pub(crate) mcp_capabilities: McpCapabilities,
}

/// `promptCapabilities`: the content blocks a prompt may carry beside text.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct PromptCapabilities {
    pub(crate) image: bool,
}

/// `mcpCapabilities`: the MCP transports beside stdio.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct McpCapabilities {
    pub(crate) http: bool,
}

/// One of `authMethods` (named in the error when the agent wants a login).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct AuthMethod {
    pub(crate) id: String,
    pub(crate) name: String,
}

/// `session/new`'s answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NewSessionResult {
    pub(crate) session_id: String,
}

/// `session/prompt`'s answer: why the turn stopped, and usage where the agent reports it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct PromptResult {
    pub(crate) stop_reason: Option<String>,
    pub(crate) usage: Option<Value>,
    #[serde(rename = "_meta")]
    pub(crate) meta: Option<Value>,
}

/// `session/update`'s `update`, by its `sessionUpdate` tag. Shapes the driver does not read
/// (`available_commands_update`, `current_mode_update`, ...) are `Other`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Update {
    /// A piece of the reply.
    MessageChunk(String),
    /// A piece of the model's thinking.
    ThoughtChunk(String),
    /// A piece of the user's message (replayed by `session/load`).
    UserChunk(String),
    /// A tool call started (or was announced).
    ToolCall(ToolCall),
    /// A tool call changed (status, output).
    ToolCallChanged(ToolCall),
    /// The agent's plan.
    Plan(Vec<String>),
    /// Usage reported during the turn (a newer ACP `usage_update`).
    Usage(Value),
    /// Anything else.
    Other(String),
}

/// A tool call as `tool_call` and `tool_call_update` (and `session/request_permission`'s
/// `toolCall`) describe it; every field optional, an update names only what changed.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct ToolCall {
    pub(crate) tool_call_id: String,
    pub(crate) title: Option<String>,
    pub(crate) kind: Option<String>,
    pub(crate) status: Option<String>,
    pub(crate) raw_input: Option<Value>,
    pub(crate) raw_output: Option<Value>,
    pub(crate) content: Option<Value>,
    pub(crate) locations: Option<Vec<Location>>,
}

/// A file a tool call touches.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub(crate) struct Location {
    pub(crate) path: String,
}

impl ToolCall {
    /// The call has finished (`completed` or `failed`).
    pub(crate) fn finished(&self) -> bool {
        matches!(self.status.as_deref(), Some("completed" | "failed"))
    }

    /// The text of its `content` blocks and raw output, for the transcript.
    pub(crate) fn output_text(&self) -> Option<String> {
        let mut text = String::new();
        if let Some(items) = self.content.as_ref().and_then(Value::as_array) {
            for item in items {
                let block = item.get("content").unwrap_or(item);
                if let Some(t) = block.get("text").and_then(Value::as_str) {
                    text.push_str(t);
                }
            }
        }
        if text.is_empty() {
            match &self.raw_output {
                Some(Value::String(s)) => text.push_str(s),
                Some(Value::Null) | None => {}
                Some(other) => text.push_str(&other.to_string()),
            }
        }
        (!text.is_empty()).then_some(text)
    }
}

/// Reads a `session/update`'s `update` object; `None` when it is not an object with a tag.
pub(crate) fn parse_update(update: &Value) -> Option<Update> {
    let tag = update.get("sessionUpdate").and_then(Value::as_str)?;
    let text = || {
        update
            .get("content")
            .and_then(|c| c.get("text"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let call = || serde_json::from_value::<ToolCall>(update.clone()).ok();
    Some(match tag {
        "agent_message_chunk" => Update::MessageChunk(text()),
        "agent_thought_chunk" => Update::ThoughtChunk(text()),
        "user_message_chunk" => Update::UserChunk(text()),
        "tool_call" => Update::ToolCall(call()?),
        "tool_call_update" => Update::ToolCallChanged(call()?),
        "plan" => Update::Plan(
            update
                .get("entries")
                .and_then(Value::as_array)
                .map(|entries| {
                    entries
                        .iter()
                        .filter_map(|e| e.get("content").and_then(Value::as_str))
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
        ),
        "usage_update" => Update::Usage(update.clone()),
        other => Update::Other(other.to_owned()),
    })
}

/// `session/request_permission`'s params.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct PermissionRequest {
    pub(crate) session_id: String,
    pub(crate) tool_call: ToolCall,
    pub(crate) options: Vec<PermissionOption>,
}

/// One answer the agent offers.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct PermissionOption {
    pub(crate) option_id: String,
    pub(crate) name: String,
    pub(crate) kind: String,
}

/// The `initialize` params: protocol version 1, and no file-system or terminal capability: the
/// runner could not hold such calls to the tool policy, so the agent uses its own tools, whose
/// calls reach the policy through `session/request_permission`.
pub(crate) fn initialize_params() -> Value {
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "clientCapabilities": {
            "fs": { "readTextFile": false, "writeTextFile": false },
            "terminal": false,
        },
        "clientInfo": { "name": "nanoclaw", "version": env!("CARGO_PKG_VERSION") },
    })
}

/// An `McpServer` entry for stdio: `{name, command, args, env: [{name, value}]}`.
pub(crate) fn stdio_server(name: &str, server: &McpServer) -> Value {
    let env: Vec<Value> = server
        .env
        .iter()
        .map(|(k, v)| json!({ "name": k, "value": v }))
        .collect();
    json!({ "name": name, "command": server.command, "args": server.args, "env": env })
}

/// An `McpServer` entry for streamable HTTP: `{type: "http", name, url, headers}`.
pub(crate) fn http_server(name: &str, server: &RemoteMcpServer) -> Value {
    let headers: Vec<Value> = server
        .headers
        .iter()
        .map(|(k, v)| json!({ "name": k, "value": v }))
        .collect();
    json!({ "type": "http", "name": name, "url": server.url, "headers": headers })
}

/// The answer to a permission request: the chosen option, or `cancelled` when the agent
/// offered none that fits (or the turn is being cancelled).
pub(crate) fn permission_outcome(option_id: Option<&str>) -> Value {
    match option_id {
        Some(id) => json!({ "outcome": { "outcome": "selected", "optionId": id } }),
        None => json!({ "outcome": { "outcome": "cancelled" } }),
    }
}
