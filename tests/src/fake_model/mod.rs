//! A scripted fake model server for end-to-end tests (each CLI's endpoint:
//! docs/contract/providers.md).
//!
//! One loopback HTTP server stands in for the four model APIs the agent CLIs speak:
//!
//! | path | API | client |
//! |---|---|---|
//! | `POST /v1/messages` (Claude appends `?beta=true`) | Anthropic Messages, SSE | Claude Code |
//! | `POST /v1/responses` | OpenAI Responses, SSE | Codex |
//! | `POST /v1/chat/completions` | OpenAI Chat Completions, SSE | OpenCode, Qwen Code |
//! | `POST /v1beta/models/{model}:streamGenerateContent` (`?alt=sse`) or `:generateContent` | Gemini API, SSE or JSON | Gemini CLI |
//!
//! Anything else is answered with 404 (and logged).
//!
//! # Script
//! Each test pushes a queue of [`Step`]s. **Every model request that offers tools consumes the
//! next step, in arrival order**, whatever API it came from. The server keeps no conversation
//! state: when the script is empty the reply is the default text (`"ok"`, see
//! [`FakeModel::set_default_text`]). So the usual "call a tool, then answer" turn is
//! `[Step::tool_call("send_message", json!({"text":"hi"}))]`: the request that carries the tool
//! result finds the script empty and gets the final text. Queue an explicit step to answer it
//! differently.
//!
//! Requests *without* tools whose system prompt is a title generator (OpenCode's title request)
//! get [`TITLE_TEXT`] and consume no step. Requests *without* tools that ask for JSON (Gemini
//! `generationConfig.responseMimeType: "application/json"`; Chat `response_format` of type
//! `json_object` / `json_schema`: Gemini CLI's next-speaker check and model router) get a JSON
//! value shaped by the request's schema ([`schema_instance`]: every property, the first enum
//! value, false) and consume no step either ([`ReplyKind::Structured`]). So do Qwen Code's side
//! queries, which offer one tool, [`QWEN_SCHEMA_TOOL`], and get a call of it with such JSON as
//! its arguments (its auto-mode classifier: `{"shouldBlock": false}`). A request without tools that is not a title request
//! (for example Claude started with `--tools ""`) consumes a step like any other.
//!
//! Retries consume steps too: `[Step::error(500, "x"), Step::text("recovered")]` makes the first
//! attempt fail and the retry succeed.
//!
//! # Tool names
//! [`Step::ToolCall`] takes the bare MCP tool name of the `nanoclaw` server and maps it per API
//! (docs/contract/tools.md): Anthropic `tool_use` named `mcp__nanoclaw__<name>`; Responses
//! `function_call` with `name:<name>` and `namespace:"mcp__nanoclaw"`; Chat `nanoclaw_<name>`
//! (OpenCode's naming); Gemini `functionCall` named `mcp_nanoclaw_<name>`. Qwen Code hides MCP
//! tools behind its own `tool_call` tool: [`Step::qwen_mcp_call`] scripts that.
//! [`Step::RawToolCall`] sends the name as is (builtin tools: Claude `Bash`, Codex
//! `exec_command`, OpenCode `bash`, Gemini CLI and Qwen Code `run_shell_command`), with an
//! optional Responses `namespace`.
//!
//! # Usage
//! Every reply reports token usage in its API's own shape, from the step's [`StepUsage`]
//! ([`Step::usage`]) or else the default ([`DEFAULT_USAGE`], [`FakeModel::set_default_usage`]).
//! A [`StepUsage`] counts like Anthropic: `input` excludes cache reads and writes, `output`
//! includes `reasoning`. Anthropic: `message_start.message.usage` {`input_tokens`,
//! `cache_creation_input_tokens`, `cache_read_input_tokens`, `output_tokens` (at most 1 there)},
//! then `message_delta.usage` {`output_tokens`} (cumulative, as Anthropic documents); no
//! reasoning figure (Anthropic reports none apart). Responses: `response.completed.response.usage`
//! with `input_tokens` = input + cache reads (OpenAI counts cached tokens inside input),
//! `input_tokens_details.cached_tokens`, `output_tokens`, `output_tokens_details.reasoning_tokens`,
//! `total_tokens`; no cache-write figure (OpenAI reports none). Chat Completions: the same
//! figures as `prompt_tokens`, `completion_tokens`, `total_tokens`,
//! `prompt_tokens_details.cached_tokens`, `completion_tokens_details.reasoning_tokens`, in a final
//! chunk with empty `choices` when the request asks for it with
//! `stream_options.include_usage` (as OpenAI does; OpenCode asks), and always in a
//! non-streaming body. Gemini: `usageMetadata` {`promptTokenCount` (cache reads included),
//! `cachedContentTokenCount`, `candidatesTokenCount` (output without reasoning),
//! `thoughtsTokenCount`, `totalTokenCount`} on the last chunk.
//!
//! # Models
//! [`FakeModel::set_known_models`] restricts the accepted `model` names (default: any). A
//! request naming another model consumes no step and gets a 404 in its API's error shape
//! (Anthropic `not_found_error` "model: X"; OpenAI `invalid_request_error` / `model_not_found`
//! "The model `X` does not exist"; Gemini `NOT_FOUND` "models/X is not found for API version
//! v1beta"), logged as [`ReplyKind::UnknownModel`]. Gemini names the model in the path.
//!
//! # Log
//! Every request is logged ([`LoggedRequest`]: path, query, lowercased headers, parsed JSON body,
//! time, and what was replied) before the reply starts. [`LoggedRequest`] has helpers that read
//! the system prompt, user texts and tool results in each API's shape.
//!
//! The server runs on its own thread with its own tokio runtime, so it works the same from sync
//! tests, `#[tokio::test]` (even current-thread ones that block on a child process) and plain
//! binaries. It stops on [`FakeModel::shutdown`] or drop.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener as StdTcpListener};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::Response;
use axum::Router;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

mod anthropic;
mod chat;
mod gemini;
mod reply;
mod responses;

pub use gemini::{schema_instance, GEMINI_PREFIX};
pub use reply::StepUsage;
use reply::{unix_now, Block, Frame, Pause, Plan, Reply};

/// Name of the MCP server whose tools [`Step::ToolCall`] calls.
pub const MCP_SERVER: &str = "nanoclaw";
/// Default reply when the script is empty.
pub const DEFAULT_TEXT: &str = "ok";
/// Reply to title-generation requests (no tools, "title generator" system prompt).
pub const TITLE_TEXT: &str = "Title";
/// The one tool of Qwen Code's structured side queries (module docs, "Script").
pub const QWEN_SCHEMA_TOOL: &str = "respond_in_schema";
/// Usage reported by a reply whose step scripts none (and by default-text and title replies):
/// the figures the fake model always sent before usage was scriptable.
pub const DEFAULT_USAGE: StepUsage = StepUsage {
    input: 10,
    output: 5,
    cache_read: 0,
    cache_write: 0,
    reasoning: 0,
};
/// Usage for tests that check figures end to end: every figure different, so a swapped or
/// dropped one shows.
pub const SAMPLE_USAGE: StepUsage = StepUsage {
    input: 1200,
    output: 80,
    cache_read: 300,
    cache_write: 50,
    reasoning: 20,
};
/// Default time a [`Step::Hang`] waits for [`FakeModel::release_hangs`].
pub const DEFAULT_HANG_TIMEOUT_MS: u64 = 60_000;

const MAX_BODY: usize = 64 * 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// APIs
// ---------------------------------------------------------------------------------------------

/// The model API a request was made to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// Anthropic Messages (`/v1/messages`), Claude Code.
    Anthropic,
    /// OpenAI Responses (`/v1/responses`), Codex.
    Responses,
    /// OpenAI Chat Completions (`/v1/chat/completions`), OpenCode and Qwen Code.
    Chat,
    /// The Gemini API (`/v1beta/models/{model}:streamGenerateContent`), Gemini CLI.
    Gemini,
}

impl Api {
    /// All APIs.
    pub const ALL: [Api; 4] = [Api::Anthropic, Api::Responses, Api::Chat, Api::Gemini];

    /// The request path of this API; for Gemini the prefix ([`GEMINI_PREFIX`]) the model and
    /// method follow (see [`Api::request_path`]).
    pub fn path(self) -> &'static str {
        match self {
            Api::Anthropic => "/v1/messages",
            Api::Responses => "/v1/responses",
            Api::Chat => "/v1/chat/completions",
            Api::Gemini => GEMINI_PREFIX,
        }
    }

    /// The path a client posts to: [`Api::path`], or for Gemini
    /// `/v1beta/models/{model}:streamGenerateContent` (`stream`) or `…:generateContent` (the
    /// others say `stream` in the body).
    pub fn request_path(self, model: &str, stream: bool) -> String {
        match self {
            Api::Gemini if stream => format!("{GEMINI_PREFIX}{model}:streamGenerateContent"),
            Api::Gemini => format!("{GEMINI_PREFIX}{model}:generateContent"),
            _ => self.path().to_owned(),
        }
    }

    /// The API served at `path` (without query), if any.
    pub fn from_path(path: &str) -> Option<Api> {
        if gemini::split_path(path).is_some() {
            return Some(Api::Gemini);
        }
        Api::ALL
            .into_iter()
            .filter(|a| *a != Api::Gemini)
            .find(|a| a.path() == path)
    }

    /// The tool name the model emits for the `nanoclaw` MCP tool `tool` in this API, and the
    /// Responses namespace (docs/contract/providers.md#codex).
    pub fn mcp_tool_name(self, tool: &str) -> (String, Option<String>) {
        match self {
            Api::Anthropic => (format!("mcp__{MCP_SERVER}__{tool}"), None),
            Api::Responses => (tool.to_string(), Some(format!("mcp__{MCP_SERVER}"))),
            Api::Chat => (format!("{MCP_SERVER}_{tool}"), None),
            Api::Gemini => (format!("mcp_{MCP_SERVER}_{tool}"), None),
        }
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Api::Anthropic => "anthropic",
            Api::Responses => "responses",
            Api::Chat => "chat",
            Api::Gemini => "gemini",
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Script steps
// ---------------------------------------------------------------------------------------------

/// One scripted model reply. Build with the constructors ([`Step::text`], [`Step::tool_call`],
/// …) and the modifiers ([`Step::chunks`], [`Step::delay_ms`], [`Step::usage`],
/// [`Step::retry_after_ms`], …).
/// Steps also (de)serialize as JSON objects tagged by `"kind"` (used by the `fake-model` binary),
/// e.g. `{"kind":"text","text":"hi","chunks":3}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Step {
    /// Stream `text`, split into `chunks` deltas (at least 1) with `delay_ms` between them.
    Text {
        /// The whole text.
        text: String,
        /// How many deltas it is split into.
        #[serde(default = "one")]
        chunks: usize,
        /// Pause between deltas.
        #[serde(default)]
        delay_ms: u64,
        /// The usage the reply reports (`None`: the server's default).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<StepUsage>,
    },
    /// Call the `nanoclaw` MCP tool `name` (bare name, mapped per API, see the module docs).
    ToolCall {
        /// The bare tool name (`send_message`).
        name: String,
        /// The call's arguments.
        arguments: Value,
        /// The usage the reply reports (`None`: the server's default).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<StepUsage>,
    },
    /// Call a tool by its raw name (a CLI builtin: Claude `Bash`, Codex `exec_command`, OpenCode
    /// `bash`). `namespace` is only sent on the Responses API.
    RawToolCall {
        /// The tool name as the CLI knows it.
        name: String,
        /// The call's arguments.
        arguments: Value,
        /// The Responses API's tool namespace, if any.
        #[serde(default)]
        namespace: Option<String>,
        /// The usage the reply reports (`None`: the server's default).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<StepUsage>,
    },
    /// One reply made of several content blocks, in order: each entry must be a `Text`,
    /// `ToolCall` or `RawToolCall` (others are ignored). E.g. some text and then a tool call, or
    /// two parallel tool calls. The reply reports its own `usage`; the entries' are ignored.
    Reply {
        /// The blocks, in order.
        steps: Vec<Step>,
        /// The usage the reply reports (`None`: the server's default).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<StepUsage>,
    },
    /// Answer with HTTP `status` and the API's JSON error shape carrying `message` (or `body`
    /// verbatim), plus `retry-after` / `retry-after-ms` headers when set.
    Error {
        /// The HTTP status.
        status: u16,
        /// The error message inside the API's error shape.
        message: String,
        /// A body sent verbatim instead of the API's error shape.
        #[serde(default)]
        body: Option<Value>,
        /// The `retry-after` header, in seconds.
        #[serde(default)]
        retry_after_secs: Option<u64>,
        /// The `retry-after-ms` header.
        #[serde(default)]
        retry_after_ms: Option<u64>,
    },
    /// Hang: with `after_first_event` the response headers and the first SSE event(s) are sent
    /// first (Anthropic `message_start`; Responses `response.created` + `response.in_progress`;
    /// Chat the role chunk); without it nothing at all is sent. The connection stays open until
    /// [`FakeModel::release_hangs`] or `timeout_ms`; then the reply completes normally as the
    /// default text.
    Hang {
        /// Send the headers and the first SSE event(s) before hanging.
        #[serde(default)]
        after_first_event: bool,
        /// When the hang ends by itself.
        #[serde(default = "default_hang_timeout")]
        timeout_ms: u64,
    },
    /// Pause `ms` after the first SSE event(s) (see [`Step::Hang`]), then continue with `then`.
    /// For an `Error` (or a non-streaming request) the pause happens before the response.
    Stall {
        /// The pause.
        ms: u64,
        /// What follows it.
        then: Box<Step>,
    },
    /// Close the connection mid-stream: with `after_first_event` after the headers and the first
    /// SSE event(s), otherwise right after the response headers.
    Drop {
        /// Close after the first SSE event(s) instead of right after the headers.
        #[serde(default)]
        after_first_event: bool,
    },
    /// Send the response headers (200, `text/event-stream`) and then nothing, not even a first
    /// event, until [`FakeModel::release_hangs`] or `timeout_ms`; then the default text. A
    /// gateway that accepted the request and stalls.
    HangAfterHeaders {
        /// When the hang ends by itself.
        #[serde(default = "default_hang_timeout")]
        timeout_ms: u64,
    },
}

fn one() -> usize {
    1
}

fn default_hang_timeout() -> u64 {
    DEFAULT_HANG_TIMEOUT_MS
}

impl Step {
    /// Text in one chunk.
    pub fn text(text: impl Into<String>) -> Step {
        Step::Text {
            text: text.into(),
            chunks: 1,
            delay_ms: 0,
            usage: None,
        }
    }

    /// Qwen Code's way to the `nanoclaw` MCP tool `name`: its MCP tools are deferred, not
    /// offered to the model, which calls them through Qwen's own `tool_call` tool
    /// (`{"name":"mcp__nanoclaw__<name>","arguments":{..}}`).
    pub fn qwen_mcp_call(name: &str, arguments: Value) -> Step {
        Step::raw_tool_call(
            "tool_call",
            json!({"name": format!("mcp__{MCP_SERVER}__{name}"), "arguments": arguments}),
        )
    }

    /// Call the `nanoclaw` MCP tool `name` (bare name, e.g. `"send_message"`).
    pub fn tool_call(name: impl Into<String>, arguments: Value) -> Step {
        Step::ToolCall {
            name: name.into(),
            arguments,
            usage: None,
        }
    }

    /// Call a tool by its raw name (no namespace; see [`Step::namespace`]).
    pub fn raw_tool_call(name: impl Into<String>, arguments: Value) -> Step {
        Step::RawToolCall {
            name: name.into(),
            arguments,
            namespace: None,
            usage: None,
        }
    }

    /// Several content blocks in one reply.
    pub fn reply(steps: impl IntoIterator<Item = Step>) -> Step {
        Step::Reply {
            steps: steps.into_iter().collect(),
            usage: None,
        }
    }

    /// An HTTP error with the API's error shape.
    pub fn error(status: u16, message: impl Into<String>) -> Step {
        Step::Error {
            status,
            message: message.into(),
            body: None,
            retry_after_secs: None,
            retry_after_ms: None,
        }
    }

    /// Hang after the first SSE event(s) until released (or [`DEFAULT_HANG_TIMEOUT_MS`]).
    pub fn hang() -> Step {
        Step::Hang {
            after_first_event: true,
            timeout_ms: DEFAULT_HANG_TIMEOUT_MS,
        }
    }

    /// Hang before sending anything (not even headers) until released.
    pub fn hang_before_response() -> Step {
        Step::Hang {
            after_first_event: false,
            timeout_ms: DEFAULT_HANG_TIMEOUT_MS,
        }
    }

    /// Pause `ms` after the first event(s), then reply with `then`.
    pub fn stall(ms: u64, then: Step) -> Step {
        Step::Stall {
            ms,
            then: Box::new(then),
        }
    }

    /// Headers, then nothing until released (see [`Step::HangAfterHeaders`]).
    pub fn hang_after_headers() -> Step {
        Step::HangAfterHeaders {
            timeout_ms: DEFAULT_HANG_TIMEOUT_MS,
        }
    }

    /// Close the connection after the first SSE event(s).
    pub fn drop_connection() -> Step {
        Step::Drop {
            after_first_event: true,
        }
    }

    /// Close the connection right after the response headers.
    pub fn drop_before_first_event() -> Step {
        Step::Drop {
            after_first_event: false,
        }
    }

    /// Text: split into `n` chunks.
    #[must_use]
    pub fn chunks(mut self, n: usize) -> Step {
        if let Step::Text { chunks, .. } = &mut self {
            *chunks = n.max(1);
        }
        self
    }

    /// Text: wait `ms` between chunks.
    #[must_use]
    pub fn delay_ms(mut self, ms: u64) -> Step {
        if let Step::Text { delay_ms, .. } = &mut self {
            *delay_ms = ms;
        }
        self
    }

    /// Content (text, tool call, reply; through a [`Step::Stall`]): the usage this reply
    /// reports instead of the server's default.
    #[must_use]
    pub fn usage(mut self, figures: StepUsage) -> Step {
        if let Some(slot) = self.usage_slot() {
            *slot = Some(figures);
        }
        self
    }

    /// Where a content step keeps its usage (a stall's is its content's).
    fn usage_slot(&mut self) -> Option<&mut Option<StepUsage>> {
        match self {
            Step::Text { usage, .. }
            | Step::ToolCall { usage, .. }
            | Step::RawToolCall { usage, .. }
            | Step::Reply { usage, .. } => Some(usage),
            Step::Stall { then, .. } => then.usage_slot(),
            _ => None,
        }
    }

    /// The usage a content step scripts, if any.
    fn scripted_usage(&self) -> Option<StepUsage> {
        match self {
            Step::Text { usage, .. }
            | Step::ToolCall { usage, .. }
            | Step::RawToolCall { usage, .. }
            | Step::Reply { usage, .. } => *usage,
            Step::Stall { then, .. } => then.scripted_usage(),
            _ => None,
        }
    }

    /// Raw tool call: the Responses `namespace`.
    #[must_use]
    pub fn namespace(mut self, ns: impl Into<String>) -> Step {
        if let Step::RawToolCall { namespace, .. } = &mut self {
            *namespace = Some(ns.into());
        }
        self
    }

    /// Error: `retry-after: <secs>` header.
    #[must_use]
    pub fn retry_after_secs(mut self, secs: u64) -> Step {
        if let Step::Error {
            retry_after_secs, ..
        } = &mut self
        {
            *retry_after_secs = Some(secs);
        }
        self
    }

    /// Error: `retry-after-ms: <ms>` header.
    #[must_use]
    pub fn retry_after_ms(mut self, ms: u64) -> Step {
        if let Step::Error { retry_after_ms, .. } = &mut self {
            *retry_after_ms = Some(ms);
        }
        self
    }

    /// Error: send `body` verbatim instead of the API's error shape.
    #[must_use]
    pub fn body(mut self, value: Value) -> Step {
        if let Step::Error { body, .. } = &mut self {
            *body = Some(value);
        }
        self
    }

    /// Hang: give up waiting after `ms` (then the default text completes the reply).
    #[must_use]
    pub fn timeout_ms(mut self, ms: u64) -> Step {
        if let Step::Hang { timeout_ms, .. } | Step::HangAfterHeaders { timeout_ms } = &mut self {
            *timeout_ms = ms;
        }
        self
    }

    /// Wrap this step in a [`Step::Stall`] of `ms`.
    #[must_use]
    pub fn stalled(self, ms: u64) -> Step {
        Step::stall(ms, self)
    }

    fn describe(&self) -> String {
        match self {
            Step::Text { text, .. } => format!("text {text:?}"),
            Step::ToolCall { name, .. } => format!("tool_call {name}"),
            Step::RawToolCall { name, .. } => format!("raw_tool_call {name}"),
            Step::Reply { steps, .. } => {
                let parts: Vec<String> = steps.iter().map(Step::describe).collect();
                format!("reply [{}]", parts.join(", "))
            }
            Step::Error { status, .. } => format!("error {status}"),
            Step::Hang {
                after_first_event, ..
            } => format!("hang (after_first_event={after_first_event})"),
            Step::Stall { ms, then } => format!("stall {ms}ms then {}", then.describe()),
            Step::Drop { after_first_event } => {
                format!("drop (after_first_event={after_first_event})")
            }
            Step::HangAfterHeaders { .. } => "hang after the headers".to_owned(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Request log
// ---------------------------------------------------------------------------------------------

/// How the server answered a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyKind {
    /// The script step with this index (0-based, counting all steps ever consumed).
    Step(usize),
    /// The script was empty: default text.
    Default,
    /// A title request (no tools): [`TITLE_TEXT`], no step consumed.
    Title,
    /// A request without tools asking for JSON (module docs, "Script"): a value shaped by its
    /// schema, no step consumed.
    Structured,
    /// Unknown path or method: 404.
    NotFound,
    /// A model not in [`FakeModel::set_known_models`]: 404 in the API's shape, no step consumed.
    UnknownModel,
}

/// One logged HTTP request.
#[derive(Clone, Debug)]
pub struct LoggedRequest {
    /// 0-based arrival order.
    pub seq: usize,
    /// The API, or `None` for a request answered with 404.
    pub api: Option<Api>,
    /// The HTTP method.
    pub method: String,
    /// The path, without the query string.
    pub path: String,
    /// The raw query string (`beta=true` for Claude), if any.
    pub query: Option<String>,
    /// Headers with lowercased names; repeated headers are joined with `", "`.
    pub headers: BTreeMap<String, String>,
    /// The parsed JSON body (`Value::Null` if the body is not JSON, see `raw_body`).
    pub body: Value,
    /// The body as (lossy) UTF-8 text.
    pub raw_body: String,
    /// Wall-clock arrival time.
    pub at: SystemTime,
    /// Arrival time since the server started.
    pub since_start: Duration,
    /// What the server replied.
    pub reply: ReplyKind,
    /// Human-readable description of the reply (e.g. `text "ok"`).
    pub reply_description: String,
    /// Whether the reply's whole content was handed to the connection: a stream up to its last
    /// event, or a JSON body; never an error, a drop, or a reply still streaming or hanging. A
    /// test that must act once the model has answered waits for it.
    pub sent_whole: bool,
}

impl LoggedRequest {
    /// A header value (name is case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// The `model` the request names (what a `/model` switch must change): the body's, or for
    /// Gemini the path's.
    pub fn model(&self) -> Option<&str> {
        if self.api == Some(Api::Gemini) {
            return gemini::split_path(&self.path).map(|(model, _)| model);
        }
        self.body.get("model").and_then(Value::as_str)
    }

    /// Whether the client asked for SSE (`"stream": true`; Gemini: `:streamGenerateContent`).
    pub fn is_stream(&self) -> bool {
        if self.api == Some(Api::Gemini) {
            return gemini::split_path(&self.path).is_some_and(|(_, stream)| stream);
        }
        self.body.get("stream").and_then(Value::as_bool) == Some(true)
    }

    /// Whether this is a model request (not a 404) that consumed a step or got the default.
    pub fn is_model_turn(&self) -> bool {
        matches!(self.reply, ReplyKind::Step(_) | ReplyKind::Default)
    }

    /// Whether the request offers any tool.
    pub fn has_tools(&self) -> bool {
        self.body
            .get("tools")
            .and_then(Value::as_array)
            .is_some_and(|t| !t.is_empty())
    }

    /// Names of the offered tools. Responses namespace tools are flattened to
    /// `<namespace>__<name>` (so the `nanoclaw` tool `send_message` is
    /// `mcp__nanoclaw__send_message` there, as in Claude); Chat tools use `function.name`;
    /// Gemini's are the `functionDeclarations` of every `tools` entry.
    pub fn tool_names(&self) -> Vec<String> {
        let mut out = Vec::new();
        for tool in array(&self.body, "tools") {
            if let Some(declarations) = tool.get("functionDeclarations") {
                for d in declarations.as_array().into_iter().flatten() {
                    collect_tool_names(d, None, &mut out);
                }
                continue;
            }
            collect_tool_names(tool, None, &mut out);
        }
        out
    }

    /// Whether the request offers the `nanoclaw` MCP tool `tool` under its per-API name.
    pub fn offers_mcp_tool(&self, tool: &str) -> bool {
        let want = format!("mcp__{MCP_SERVER}__{tool}");
        let chat = format!("{MCP_SERVER}_{tool}");
        let gemini = format!("mcp_{MCP_SERVER}_{tool}");
        self.tool_names()
            .iter()
            .any(|n| *n == want || *n == chat || *n == gemini)
    }

    /// All system-prompt text, blocks joined with `"\n"`: Anthropic top-level `system` plus
    /// `role:"system"` entries of `messages`; Responses `instructions` plus `developer`/`system`
    /// input messages; Chat `system`/`developer` messages.
    pub fn system_text(&self) -> String {
        let mut parts = Vec::new();
        match self.api {
            Some(Api::Anthropic) => {
                if let Some(system) = self.body.get("system") {
                    push_nonempty(&mut parts, content_text(system));
                }
                for m in messages(&self.body) {
                    if role(m) == Some("system") {
                        push_nonempty(&mut parts, content_text(m.get("content")));
                    }
                }
            }
            Some(Api::Responses) => {
                if let Some(i) = self.body.get("instructions") {
                    push_nonempty(&mut parts, content_text(i));
                }
                for item in array(&self.body, "input") {
                    if matches!(role(item), Some("developer" | "system")) {
                        push_nonempty(&mut parts, content_text(item.get("content")));
                    }
                }
            }
            Some(Api::Chat) => {
                for m in messages(&self.body) {
                    if matches!(role(m), Some("developer" | "system")) {
                        push_nonempty(&mut parts, content_text(m.get("content")));
                    }
                }
            }
            Some(Api::Gemini) => {
                if let Some(system) = self.body.get("systemInstruction") {
                    push_nonempty(&mut parts, content_text(system.get("parts")));
                }
            }
            None => {}
        }
        parts.join("\n")
    }

    /// The text of each user message, in order (text blocks joined with `"\n"`; tool results
    /// are not user text, see [`LoggedRequest::tool_results`]; messages with no text are
    /// skipped). For Codex this includes the `<environment_context>` user message; for Gemini
    /// CLI the `<session_context>` part that starts the first user content.
    pub fn user_texts(&self) -> Vec<String> {
        let (items, key): (&[Value], &str) = match self.api {
            Some(Api::Responses) => (array(&self.body, "input"), "content"),
            Some(Api::Gemini) => (array(&self.body, "contents"), "parts"),
            Some(_) => (messages(&self.body), "content"),
            None => (&[], "content"),
        };
        items
            .iter()
            .filter(|m| role(m) == Some("user"))
            .filter(|m| m.get("type").is_none_or(|t| t == "message"))
            .map(|m| content_text(m.get(key)))
            .filter(|t| !t.is_empty())
            .collect()
    }

    /// The text of the last user message that has text.
    pub fn last_user_text(&self) -> Option<String> {
        self.user_texts().pop()
    }

    /// The text of every tool result in the conversation, in order: Anthropic `tool_result`
    /// blocks, Responses `*_call_output` items, Chat `role:"tool"` messages, Gemini
    /// `functionResponse` parts (their `response` as JSON text).
    pub fn tool_results(&self) -> Vec<String> {
        let mut out = Vec::new();
        match self.api {
            Some(Api::Anthropic) => {
                for m in messages(&self.body) {
                    for block in m
                        .get("content")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        if block.get("type").and_then(Value::as_str) == Some("tool_result") {
                            out.push(content_text(block.get("content")));
                        }
                    }
                }
            }
            Some(Api::Responses) => {
                for item in array(&self.body, "input") {
                    if item
                        .get("type")
                        .and_then(Value::as_str)
                        .is_some_and(|t| t.ends_with("_call_output"))
                    {
                        out.push(content_text(item.get("output")));
                    }
                }
            }
            Some(Api::Chat) => {
                for m in messages(&self.body) {
                    if role(m) == Some("tool") {
                        out.push(content_text(m.get("content")));
                    }
                }
            }
            Some(Api::Gemini) => {
                for content in array(&self.body, "contents") {
                    for part in array(content, "parts") {
                        if let Some(response) = part.pointer("/functionResponse/response") {
                            out.push(response.to_string());
                        }
                    }
                }
            }
            None => {}
        }
        out
    }

    /// Whether the conversation ends with a tool result (ignoring trailing Anthropic
    /// `role:"system"` entries).
    pub fn tail_is_tool_result(&self) -> bool {
        match self.api {
            Some(Api::Anthropic) => messages(&self.body)
                .iter()
                .rev()
                .find(|m| role(m) != Some("system"))
                .is_some_and(|m| {
                    role(m) == Some("user")
                        && m.get("content")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                            .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
                }),
            Some(Api::Responses) => array(&self.body, "input").last().is_some_and(|i| {
                i.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| t.ends_with("_call_output"))
            }),
            Some(Api::Chat) => messages(&self.body)
                .last()
                .is_some_and(|m| role(m) == Some("tool")),
            Some(Api::Gemini) => array(&self.body, "contents").last().is_some_and(|c| {
                array(c, "parts")
                    .iter()
                    .any(|p| p.get("functionResponse").is_some())
            }),
            None => false,
        }
    }

    /// The JSON schema of a request that asks for JSON (module docs, "Script"), or `None`. A
    /// request asking for JSON without a schema gets `Some(Value::Null)`.
    pub fn structured_schema(&self) -> Option<Value> {
        self.structured().map(|(schema, _)| schema)
    }

    /// The schema of a structured request, and the tool the answer must call when the request
    /// asks for its JSON as a tool call (Qwen Code's side queries offer one tool,
    /// `respond_in_schema`, with `tool_choice: "required"`).
    fn structured(&self) -> Option<(Value, Option<String>)> {
        if let [tool] = array(&self.body, "tools") {
            let name = tool.pointer("/function/name").and_then(Value::as_str);
            if self.api == Some(Api::Chat) && name == Some(QWEN_SCHEMA_TOOL) {
                let schema = tool
                    .pointer("/function/parameters")
                    .cloned()
                    .unwrap_or(Value::Null);
                return Some((schema, Some(QWEN_SCHEMA_TOOL.to_owned())));
            }
        }
        if self.has_tools() {
            return None;
        }
        let schema = match self.api {
            Some(Api::Gemini) => {
                let config = self.body.get("generationConfig")?;
                if config.get("responseMimeType").and_then(Value::as_str)
                    != Some("application/json")
                {
                    return None;
                }
                Some(
                    config
                        .get("responseJsonSchema")
                        .or_else(|| config.get("responseSchema"))
                        .cloned()
                        .unwrap_or(Value::Null),
                )
            }
            Some(Api::Chat) => {
                let format = self.body.get("response_format")?;
                match format.get("type").and_then(Value::as_str) {
                    Some("json_schema") => Some(
                        format
                            .pointer("/json_schema/schema")
                            .cloned()
                            .unwrap_or(Value::Null),
                    ),
                    Some("json_object") => Some(Value::Null),
                    _ => None,
                }
            }
            _ => None,
        };
        schema.map(|schema| (schema, None))
    }

    /// Whether this is a title-generation request: no tools, and a system prompt that mentions
    /// a title generator (OpenCode's `small_model` call).
    pub fn is_title_request(&self) -> bool {
        !self.has_tools()
            && self
                .system_text()
                .to_lowercase()
                .contains("title generator")
    }

    /// One-line summary for logs.
    pub fn summary(&self) -> String {
        let q = self
            .query
            .as_deref()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        format!(
            "#{} +{:.3}s {} {}{} model={:?} tools={} last_user={:?} -> {}",
            self.seq,
            self.since_start.as_secs_f64(),
            self.method,
            self.path,
            q,
            self.model().unwrap_or_default(),
            self.tool_names().len(),
            self.last_user_text().map(|t| {
                // The end of the text: Claude puts reminders before the prompt.
                let chars: Vec<char> = t.chars().collect();
                chars[chars.len().saturating_sub(60)..]
                    .iter()
                    .collect::<String>()
            }),
            self.reply_description,
        )
    }
}

fn collect_tool_names(tool: &Value, ns: Option<&str>, out: &mut Vec<String>) {
    if tool.get("type").and_then(Value::as_str) == Some("namespace") {
        let inner_ns = tool.get("name").and_then(Value::as_str);
        for t in array(tool, "tools") {
            collect_tool_names(t, inner_ns, out);
        }
        return;
    }
    let name = tool
        .get("name")
        .and_then(Value::as_str)
        .or_else(|| tool.pointer("/function/name").and_then(Value::as_str));
    if let Some(name) = name {
        match ns {
            Some(ns) => out.push(format!("{ns}__{name}")),
            None => out.push(name.to_string()),
        }
    }
}

fn array<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn messages(body: &Value) -> &[Value] {
    array(body, "messages")
}

fn role(m: &Value) -> Option<&str> {
    m.get("role").and_then(Value::as_str)
}

fn push_nonempty(parts: &mut Vec<String>, s: String) {
    if !s.is_empty() {
        parts.push(s);
    }
}

/// Text of a content value: a string, or an array of strings / blocks with a `text` field
/// (`text`, `input_text`, `output_text`; other blocks such as images or tool results are
/// skipped), joined with `"\n"`.
fn content_text<'a>(content: impl Into<Option<&'a Value>>) -> String {
    match content.into() {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => {
            let parts: Vec<&str> = items
                .iter()
                .filter_map(|b| match b {
                    Value::String(s) => Some(s.as_str()),
                    Value::Object(_) => {
                        let ty = b.get("type").and_then(Value::as_str).unwrap_or("text");
                        if matches!(ty, "text" | "input_text" | "output_text") {
                            b.get("text").and_then(Value::as_str)
                        } else {
                            None
                        }
                    }
                    _ => None,
                })
                .collect();
            parts.join("\n")
        }
        _ => String::new(),
    }
}

/// Timeout while waiting for requests.
#[derive(Debug)]
pub struct WaitTimeout {
    /// How long the wait lasted.
    pub waited: Duration,
    /// The requests logged when the wait gave up.
    pub got: Vec<LoggedRequest>,
}

impl fmt::Display for WaitTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "timed out after {:?} waiting for fake model requests; {} logged:",
            self.waited,
            self.got.len()
        )?;
        for r in &self.got {
            writeln!(f, "  {}", r.summary())?;
        }
        Ok(())
    }
}

impl std::error::Error for WaitTimeout {}

// ---------------------------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------------------------

struct Inner {
    script: VecDeque<Step>,
    consumed: usize,
    default_text: String,
    default_usage: StepUsage,
    /// `None`: every model name is accepted.
    known_models: Option<Vec<String>>,
    log: Vec<LoggedRequest>,
    /// `Some(n)`: the log keeps the last `n` requests ([`FakeModel::set_log_limit`]).
    log_limit: Option<usize>,
    next_seq: usize,
}

impl Inner {
    /// Drops the oldest requests beyond the log limit.
    fn trim_log(&mut self) {
        if let Some(limit) = self.log_limit {
            let excess = self.log.len().saturating_sub(limit);
            self.log.drain(..excess);
        }
    }
}

struct Shared {
    inner: Mutex<Inner>,
    started: Instant,
    ids: AtomicU64,
    release: watch::Sender<u64>,
    shutdown: watch::Sender<bool>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the request `seq` as answered whole ([`LoggedRequest::sent_whole`]).
    fn sent_whole(&self, seq: usize) {
        if let Some(entry) = self.lock().log.iter_mut().find(|r| r.seq == seq) {
            entry.sent_whole = true;
        }
    }
}

/// The running fake model server. Cheap accessors; stops on drop.
pub struct FakeModel {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for FakeModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeModel")
            .field("addr", &self.addr)
            .finish()
    }
}

impl FakeModel {
    /// Start on `127.0.0.1:0` with an empty script.
    pub fn start() -> std::io::Result<FakeModel> {
        FakeModel::start_on(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)))
    }

    /// Start on `127.0.0.1:0` with `steps` queued.
    pub fn start_with_script(steps: impl IntoIterator<Item = Step>) -> std::io::Result<FakeModel> {
        let server = FakeModel::start()?;
        server.push_all(steps);
        Ok(server)
    }

    /// Start on a given address (port 0 picks a free port).
    pub fn start_on(addr: SocketAddr) -> std::io::Result<FakeModel> {
        let listener = StdTcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (release, _) = watch::channel(0u64);
        let (shutdown, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                script: VecDeque::new(),
                consumed: 0,
                default_text: DEFAULT_TEXT.to_string(),
                default_usage: DEFAULT_USAGE,
                known_models: None,
                log: Vec::new(),
                log_limit: None,
                next_seq: 0,
            }),
            started: Instant::now(),
            ids: AtomicU64::new(0),
            release,
            shutdown,
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fake-model-{}", addr.port()))
            .spawn(move || run_server(runtime, listener, thread_shared))?;
        Ok(FakeModel {
            addr,
            shared,
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:PORT` (no trailing slash). Claude's `ANTHROPIC_BASE_URL`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:PORT/v1`: the OpenAI `base_url` / `baseURL` for Codex and OpenCode.
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queue one step at the end of the script.
    pub fn push(&self, step: Step) {
        self.shared.lock().script.push_back(step);
    }

    /// Queue steps at the end of the script.
    pub fn push_all(&self, steps: impl IntoIterator<Item = Step>) {
        self.shared.lock().script.extend(steps);
    }

    /// Replace the remaining script.
    pub fn set_script(&self, steps: impl IntoIterator<Item = Step>) {
        let mut inner = self.shared.lock();
        inner.script = steps.into_iter().collect();
    }

    /// Steps not consumed yet.
    pub fn remaining_steps(&self) -> usize {
        self.shared.lock().script.len()
    }

    /// Text used when the script is empty (default [`DEFAULT_TEXT`]).
    pub fn set_default_text(&self, text: impl Into<String>) {
        self.shared.lock().default_text = text.into();
    }

    /// Usage reported by replies whose step scripts none (default [`DEFAULT_USAGE`]).
    pub fn set_default_usage(&self, usage: StepUsage) {
        self.shared.lock().default_usage = usage;
    }

    /// Accept only requests naming one of `models` (`None`, the default: accept any). Others
    /// get a 404 in the API's error shape and consume no step (module docs, "Models").
    pub fn set_known_models<S: Into<String>>(&self, models: Option<impl IntoIterator<Item = S>>) {
        self.shared.lock().known_models = models.map(|m| m.into_iter().map(Into::into).collect());
    }

    /// Release every [`Step::Hang`] whose request has already arrived.
    pub fn release_hangs(&self) {
        self.shared.release.send_modify(|g| *g += 1);
    }

    /// How many replies were sent whole ([`LoggedRequest::sent_whole`]).
    pub fn completed_replies(&self) -> usize {
        self.filtered(|r| r.sent_whole).len()
    }

    /// All logged requests, in arrival order.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.shared.lock().log.clone()
    }

    /// Logged requests to one API (including title requests).
    pub fn requests_for(&self, api: Api) -> Vec<LoggedRequest> {
        self.filtered(|r| r.api == Some(api))
    }

    /// Logged model turns: requests that consumed a step or got the default text (no title
    /// requests, no 404s).
    pub fn model_requests(&self) -> Vec<LoggedRequest> {
        self.filtered(LoggedRequest::is_model_turn)
    }

    /// Requests answered with 404.
    pub fn unknown_requests(&self) -> Vec<LoggedRequest> {
        self.filtered(|r| r.reply == ReplyKind::NotFound)
    }

    fn filtered(&self, f: impl Fn(&LoggedRequest) -> bool) -> Vec<LoggedRequest> {
        self.shared
            .lock()
            .log
            .iter()
            .filter(|r| f(r))
            .cloned()
            .collect()
    }

    /// Keep only the last `limit` requests in the log (`None`, the default: every request).
    /// A long run needs it: every logged request holds its whole body, raw and parsed, and a
    /// CLI sends its whole conversation with each request, so an unlimited log grows with the
    /// square of the conversation (the bench's real-CLI phase filled 24 GiB near message 3,500).
    pub fn set_log_limit(&self, limit: Option<usize>) {
        let mut inner = self.shared.lock();
        inner.log_limit = limit;
        inner.trim_log();
    }

    /// Forget the logged requests (the seq numbers keep counting).
    pub fn clear_log(&self) {
        self.shared.lock().log.clear();
    }

    /// Block until at least `n` requests (of any kind) are logged.
    pub fn wait_for_requests(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<LoggedRequest>, WaitTimeout> {
        self.wait_until(timeout, |log| log.len() >= n)
    }

    /// Block until at least `n` model turns ([`LoggedRequest::is_model_turn`]: no title
    /// requests, no 404s) are logged; returns the whole log.
    pub fn wait_for_model_requests(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<LoggedRequest>, WaitTimeout> {
        self.wait_until(timeout, |log| {
            log.iter().filter(|r| r.is_model_turn()).count() >= n
        })
    }

    /// Block until `done(log)` holds (checked every 10 ms); returns the log.
    pub fn wait_until(
        &self,
        timeout: Duration,
        done: impl Fn(&[LoggedRequest]) -> bool,
    ) -> Result<Vec<LoggedRequest>, WaitTimeout> {
        let start = Instant::now();
        loop {
            if let Some(outcome) = self.check_log(start, timeout, &done) {
                return outcome;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Async version of [`FakeModel::wait_for_requests`].
    pub async fn wait_for_requests_async(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<LoggedRequest>, WaitTimeout> {
        self.wait_until_async(timeout, |log| log.len() >= n).await
    }

    /// Async version of [`FakeModel::wait_until`].
    pub async fn wait_until_async(
        &self,
        timeout: Duration,
        done: impl Fn(&[LoggedRequest]) -> bool,
    ) -> Result<Vec<LoggedRequest>, WaitTimeout> {
        let start = Instant::now();
        loop {
            if let Some(outcome) = self.check_log(start, timeout, &done) {
                return outcome;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// One check of a wait: `Some(Ok(log))` when `done` holds, `Some(Err(..))` past the timeout,
    /// `None` to keep waiting. Shared by the sync and async waits.
    fn check_log(
        &self,
        start: Instant,
        timeout: Duration,
        done: &impl Fn(&[LoggedRequest]) -> bool,
    ) -> Option<Result<Vec<LoggedRequest>, WaitTimeout>> {
        {
            let inner = self.shared.lock();
            if done(&inner.log) {
                return Some(Ok(inner.log.clone()));
            }
        }
        (start.elapsed() >= timeout).then(|| {
            Err(WaitTimeout {
                waited: start.elapsed(),
                got: self.requests(),
            })
        })
    }

    /// Stop the server: hung and stalled streams are released, connections are closed after a
    /// 0.5 s grace period, and the server thread is joined (about 1 s at most).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.shutdown.send_replace(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run_server(runtime: tokio::runtime::Runtime, listener: StdTcpListener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("fake-model: cannot register listener: {e}");
                return;
            }
        };
        let app = Router::new().fallback(handle).with_state(shared);
        let mut graceful_signal = shutdown.clone();
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = graceful_signal.wait_for(|s| *s).await;
        });
        let serve = std::future::IntoFuture::into_future(serve);
        tokio::pin!(serve);
        tokio::select! {
            res = &mut serve => {
                if let Err(e) = res {
                    eprintln!("fake-model: server error: {e}");
                }
            }
            _ = async {
                let _ = shutdown.wait_for(|s| *s).await;
                // Grace period for in-flight responses; hung streams end on the signal too.
                tokio::time::sleep(Duration::from_millis(500)).await;
            } => {}
        }
    });
    runtime.shutdown_timeout(Duration::from_millis(500));
}

// ---------------------------------------------------------------------------------------------
// Request handling
// ---------------------------------------------------------------------------------------------

/// What to do with one request, decided under the lock.
enum Action {
    NotFound,
    /// The model the request named.
    UnknownModel(String),
    Title,
    /// A JSON reply shaped by this schema: as text, or as a call of the named tool.
    Structured(Value, Option<String>),
    Step(Step),
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .unwrap_or_default();
    let raw_body = String::from_utf8_lossy(&bytes).into_owned();
    let body_json: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in &parts.headers {
        let v = String::from_utf8_lossy(value.as_bytes()).into_owned();
        headers
            .entry(name.as_str().to_ascii_lowercase())
            .and_modify(|e| {
                e.push_str(", ");
                e.push_str(&v);
            })
            .or_insert(v);
    }
    let path = parts.uri.path().to_string();
    let api = if parts.method == Method::POST {
        Api::from_path(&path)
    } else {
        None
    };

    let mut entry = LoggedRequest {
        seq: 0,
        api,
        method: parts.method.to_string(),
        path,
        query: parts.uri.query().map(str::to_string),
        headers,
        body: body_json,
        raw_body,
        at: SystemTime::now(),
        since_start: shared.started.elapsed(),
        reply: ReplyKind::NotFound,
        reply_description: "404".to_string(),
        sent_whole: false,
    };

    let release_gen = *shared.release.borrow();
    let (action, ctx, default_text) = {
        let mut inner = shared.lock();
        let unknown_model = inner
            .known_models
            .as_ref()
            .is_some_and(|known| !known.iter().any(|m| Some(m.as_str()) == entry.model()));
        let action = if api.is_none() {
            Action::NotFound
        } else if unknown_model {
            let named = entry.model().unwrap_or_default().to_string();
            entry.reply = ReplyKind::UnknownModel;
            entry.reply_description = format!("404 unknown model {named:?}");
            Action::UnknownModel(named)
        } else if entry.is_title_request() {
            entry.reply = ReplyKind::Title;
            entry.reply_description = format!("title {TITLE_TEXT:?}");
            Action::Title
        } else if let Some((schema, tool)) = entry.structured() {
            entry.reply = ReplyKind::Structured;
            entry.reply_description = "JSON shaped by the request's schema".to_owned();
            Action::Structured(schema, tool)
        } else if let Some(step) = inner.script.pop_front() {
            entry.reply = ReplyKind::Step(inner.consumed);
            entry.reply_description = format!("step {}: {}", inner.consumed, step.describe());
            inner.consumed += 1;
            Action::Step(step)
        } else {
            entry.reply = ReplyKind::Default;
            entry.reply_description = format!("default text {:?}", inner.default_text);
            Action::Step(Step::text(inner.default_text.clone()))
        };
        entry.seq = inner.next_seq;
        inner.next_seq += 1;
        let default_text = inner.default_text.clone();
        let is_stream = entry.is_stream();
        let model = entry.model().unwrap_or("fake-model").to_string();
        let include_usage = entry
            .body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        let seq = entry.seq;
        inner.log.push(entry);
        inner.trim_log();
        let ctx = api.map(|api| Ctx {
            seq,
            api,
            model,
            stream: is_stream,
            include_usage,
            default_usage: inner.default_usage,
            shared: shared.clone(),
            release_gen,
        });
        (action, ctx, default_text)
    };

    match (action, ctx) {
        (Action::NotFound, _) | (_, None) => not_found(),
        (Action::UnknownModel(named), Some(ctx)) => {
            let message = match ctx.api {
                Api::Anthropic => format!("model: {named}"),
                Api::Responses | Api::Chat => format!("The model `{named}` does not exist"),
                Api::Gemini => format!(
                    "models/{named} is not found for API version v1beta, or is not supported \
                     for generateContent."
                ),
            };
            ctx.error_response(404, &message, None, None, None)
        }
        (Action::Title, Some(ctx)) => {
            let plan = ctx.plan(vec![Block::text(TITLE_TEXT, 1, 0)], None);
            ctx.respond(plan).await
        }
        (Action::Structured(schema, tool), Some(ctx)) => {
            let json = schema_instance(&schema).to_string();
            let block = match tool {
                Some(name) => Block::Call {
                    name,
                    namespace: None,
                    arguments: json,
                },
                None => Block::text(json, 1, 0),
            };
            let plan = ctx.plan(vec![block], None);
            ctx.respond(plan).await
        }
        (Action::Step(step), Some(ctx)) => ctx.respond_step(step, &default_text).await,
    }
}

fn not_found() -> Response {
    let mut resp = Response::new(Body::from(
        json!({"error": {"type": "not_found_error", "message": "fake model: unknown route"}})
            .to_string(),
    ));
    *resp.status_mut() = StatusCode::NOT_FOUND;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Per-request reply context.
struct Ctx {
    /// The request's [`LoggedRequest::seq`].
    seq: usize,
    api: Api,
    model: String,
    stream: bool,
    include_usage: bool,
    /// Reported when the step scripts no usage.
    default_usage: StepUsage,
    shared: Arc<Shared>,
    release_gen: u64,
}

impl Ctx {
    /// A reply of `blocks` reporting `usage`, or the server's default.
    fn plan(&self, blocks: Vec<Block>, usage: Option<StepUsage>) -> Plan {
        Plan {
            blocks,
            usage: usage.unwrap_or(self.default_usage),
            ..Plan::default()
        }
    }

    async fn respond_step(self, step: Step, default_text: &str) -> Response {
        let default_block = || vec![Block::text(default_text, 1, 0)];
        match step {
            Step::Error {
                status,
                message,
                body,
                retry_after_secs,
                retry_after_ms,
            } => self.error_response(status, &message, body, retry_after_secs, retry_after_ms),
            Step::Hang {
                after_first_event: false,
                timeout_ms,
            } => {
                self.wait_pause(Pause::Release { timeout_ms }).await;
                let plan = self.plan(default_block(), None);
                self.respond(plan).await
            }
            Step::Hang {
                after_first_event: true,
                timeout_ms,
            } => {
                let mut plan = self.plan(default_block(), None);
                plan.pause = Some(Pause::Release { timeout_ms });
                self.respond(plan).await
            }
            Step::HangAfterHeaders { timeout_ms } => {
                if !self.stream {
                    self.wait_pause(Pause::Release { timeout_ms }).await;
                    let plan = self.plan(default_block(), None);
                    return self.respond(plan).await;
                }
                let mut frames = vec![Frame::Pause(Pause::Release { timeout_ms })];
                frames.extend(self.sse_frames(&self.plan(default_block(), None)));
                self.stream_response(frames)
            }
            Step::Drop { after_first_event } => {
                let plan = Plan {
                    abort_after_start: after_first_event,
                    abort_at_once: !after_first_event,
                    ..self.plan(Vec::new(), None)
                };
                self.respond(plan).await
            }
            Step::Stall { ms, then } => match *then {
                Step::Text { .. }
                | Step::ToolCall { .. }
                | Step::RawToolCall { .. }
                | Step::Reply { .. } => {
                    let mut plan = self.plan(self.blocks_of(&then), then.scripted_usage());
                    plan.pause = Some(Pause::Sleep(ms));
                    self.respond(plan).await
                }
                other => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Box::pin(self.respond_step(other, default_text)).await
                }
            },
            content => {
                let plan = self.plan(self.blocks_of(&content), content.scripted_usage());
                self.respond(plan).await
            }
        }
    }

    fn blocks_of(&self, step: &Step) -> Vec<Block> {
        match step {
            Step::Text {
                text,
                chunks,
                delay_ms,
                ..
            } => vec![Block::text(text.clone(), *chunks, *delay_ms)],
            Step::ToolCall {
                name, arguments, ..
            } => {
                let (name, namespace) = self.api.mcp_tool_name(name);
                vec![Block::Call {
                    name,
                    namespace,
                    arguments: arguments.to_string(),
                }]
            }
            Step::RawToolCall {
                name,
                arguments,
                namespace,
                ..
            } => vec![Block::Call {
                name: name.clone(),
                namespace: namespace.clone().filter(|_| self.api == Api::Responses),
                arguments: arguments.to_string(),
            }],
            Step::Reply { steps, .. } => steps.iter().flat_map(|s| self.blocks_of(s)).collect(),
            _ => Vec::new(),
        }
    }

    async fn wait_pause(&self, pause: Pause) {
        let mut shutdown = self.shared.shutdown.subscribe();
        let stop = async move {
            let _ = shutdown.wait_for(|s| *s).await;
        };
        match pause {
            Pause::Sleep(ms) => {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                    _ = stop => {}
                }
            }
            Pause::Release { timeout_ms } => {
                let mut release = self.shared.release.subscribe();
                let gen = self.release_gen;
                tokio::select! {
                    _ = release.wait_for(|g| *g > gen) => {}
                    _ = tokio::time::sleep(Duration::from_millis(timeout_ms)) => {}
                    _ = stop => {}
                }
            }
        }
    }

    fn error_response(
        &self,
        status: u16,
        message: &str,
        body: Option<Value>,
        retry_after_secs: Option<u64>,
        retry_after_ms: Option<u64>,
    ) -> Response {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = body.unwrap_or_else(|| error_body(self.api, status, message));
        let mut resp = Response::new(Body::from(body.to_string()));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = retry_after_secs {
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(ms) = retry_after_ms {
            h.insert("retry-after-ms", HeaderValue::from(ms));
        }
        resp
    }

    async fn respond(self, plan: Plan) -> Response {
        if !self.stream {
            if let Some(pause) = plan.pause {
                self.wait_pause(pause).await;
            }
            if plan.abort_after_start || plan.abort_at_once {
                return self.stream_response(vec![Frame::Abort]);
            }
            let body = self.json_body(&plan.blocks, &plan.usage);
            self.shared.sent_whole(self.seq);
            let mut resp = Response::new(Body::from(body.to_string()));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            return resp;
        }
        let frames = if plan.abort_at_once {
            vec![Frame::Abort]
        } else {
            self.sse_frames(&plan)
        };
        self.stream_response(frames)
    }

    fn stream_response(self, frames: Vec<Frame>) -> Response {
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let ctx = Arc::new(self);
        let producer = ctx.clone();
        tokio::spawn(async move {
            for frame in frames {
                match frame {
                    Frame::Data(s) => {
                        if tx.send(Ok(Bytes::from(s))).await.is_err() {
                            return; // client went away
                        }
                    }
                    Frame::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                    Frame::Pause(p) => producer.wait_pause(p).await,
                    Frame::Abort => {
                        // Let hyper flush what was sent so far: an error queued right behind
                        // data makes it drop the buffered bytes with the connection.
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        let _ = tx
                            .send(Err(std::io::Error::new(
                                std::io::ErrorKind::ConnectionAborted,
                                "fake model: scripted drop",
                            )))
                            .await;
                        return;
                    }
                }
            }
            producer.shared.sent_whole(producer.seq);
        });
        let mut resp = Response::new(Body::from_stream(stream));
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        resp
    }

    // ---- SSE rendering -----------------------------------------------------------------------

    fn sse_frames(&self, plan: &Plan) -> Vec<Frame> {
        let mut frames = Vec::new();
        let reply = self.reply();
        match self.api {
            Api::Anthropic => reply.anthropic_frames(plan, &mut frames),
            Api::Responses => reply.responses_frames(plan, &mut frames),
            Api::Chat => reply.chat_frames(plan, &mut frames),
            Api::Gemini => reply.gemini_frames(plan, &mut frames),
        }
        frames
    }

    /// What the API renderers need of this request.
    fn reply(&self) -> Reply<'_> {
        Reply::new(&self.model, self.include_usage, &self.shared.ids)
    }

    fn id(&self, prefix: &str) -> String {
        self.reply().id(prefix)
    }

    // ---- non-streaming JSON ------------------------------------------------------------------

    fn json_body(&self, blocks: &[Block], usage: &StepUsage) -> Value {
        let has_call = blocks.iter().any(|b| matches!(b, Block::Call { .. }));
        match self.api {
            Api::Anthropic => {
                let content: Vec<Value> = blocks
                    .iter()
                    .map(|b| match b {
                        Block::Text { text, .. } => json!({"type":"text","text":text}),
                        Block::Call {
                            name, arguments, ..
                        } => json!({"type":"tool_use","id":self.id("toolu"),"name":name,
                            "input": serde_json::from_str::<Value>(arguments)
                                .unwrap_or_else(|_| json!({}))}),
                    })
                    .collect();
                json!({"id":self.id("msg"),"type":"message","role":"assistant",
                       "model":self.model,"content":content,
                       "stop_reason": if has_call {"tool_use"} else {"end_turn"},
                       "stop_sequence":null,"usage": usage.anthropic(usage.output)})
            }
            Api::Responses => {
                let output: Vec<Value> = blocks
                    .iter()
                    .map(|b| match b {
                        Block::Text { text, .. } => json!({"id":self.id("msg"),"type":"message",
                            "status":"completed","role":"assistant",
                            "content":[{"type":"output_text","text":text,"annotations":[]}]}),
                        Block::Call {
                            name,
                            namespace,
                            arguments,
                        } => {
                            let mut item = json!({"id":self.id("fc"),"type":"function_call",
                                "status":"completed","name":name,"call_id":self.id("call"),
                                "arguments":arguments});
                            if let (Some(ns), Some(obj)) = (namespace, item.as_object_mut()) {
                                obj.insert("namespace".into(), Value::from(ns.clone()));
                            }
                            item
                        }
                    })
                    .collect();
                json!({"id":self.id("resp"),"object":"response","created_at":unix_now(),
                       "status":"completed","model":self.model,"output":output,
                       "usage": usage.responses()})
            }
            Api::Chat => {
                let text: String = blocks
                    .iter()
                    .filter_map(|b| match b {
                        Block::Text { text, .. } => Some(text.as_str()),
                        Block::Call { .. } => None,
                    })
                    .collect();
                let calls: Vec<Value> = blocks
                    .iter()
                    .filter_map(|b| match b {
                        Block::Call {
                            name, arguments, ..
                        } => Some(json!({"id":self.id("call"),"type":"function",
                            "function":{"name":name,"arguments":arguments}})),
                        Block::Text { .. } => None,
                    })
                    .collect();
                let mut message = json!({"role":"assistant",
                    "content": if text.is_empty() && has_call { Value::Null } else { Value::from(text) }});
                if has_call {
                    if let Some(obj) = message.as_object_mut() {
                        obj.insert("tool_calls".into(), Value::Array(calls));
                    }
                }
                json!({"id":self.id("chatcmpl"),"object":"chat.completion","created":unix_now(),
                       "model":self.model,
                       "choices":[{"index":0,"message":message,
                                   "finish_reason": if has_call {"tool_calls"} else {"stop"}}],
                       "usage": usage.chat()})
            }
            Api::Gemini => self.reply().gemini_body(blocks, usage),
        }
    }
}

/// The JSON error body in each API's shape.
fn error_body(api: Api, status: StatusCode, message: &str) -> Value {
    match api {
        Api::Anthropic => {
            let ty = match status.as_u16() {
                400 => "invalid_request_error",
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                413 => "request_too_large",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                _ => "api_error",
            };
            json!({"type":"error","error":{"type":ty,"message":message}})
        }
        Api::Responses | Api::Chat => {
            let (ty, code) = match status.as_u16() {
                400 => ("invalid_request_error", Value::Null),
                401 => ("invalid_request_error", Value::from("invalid_api_key")),
                403 => ("permission_error", Value::Null),
                404 => ("invalid_request_error", Value::from("model_not_found")),
                429 => ("rate_limit_error", Value::from("rate_limit_exceeded")),
                _ => ("server_error", Value::Null),
            };
            json!({"error":{"message":message,"type":ty,"param":null,"code":code}})
        }
        Api::Gemini => gemini::error_body(status, message),
    }
}

#[cfg(test)]
mod tests;
