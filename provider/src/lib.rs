//! The `AgentProvider` trait (docs/contract/providers.md) and its implementations. The provider
//! owns how it talks to its CLI; the runner owns what to send.
//!
//! A provider is long-lived (one CLI process across turns where the CLI allows it). Each batch of
//! messages becomes one [`AgentQuery`]: the runner sends the first prompt with
//! [`AgentProvider::query`], pushes follow-ups with [`AgentQuery::push`], reads
//! [`ProviderEvent`]s, and calls [`AgentQuery::end`] once every prompt it sent is answered.
//!
//! Map (the map of the whole code is ARCHITECTURE.md). Each driver (`claude/`, `codex/`,
//! `opencode/`) has one layout of private modules: `mod.rs` (the provider type, thin),
//! `command.rs` (launch and configuration: args, env, config files), `protocol.rs` (wire types,
//! tolerant serde), `translate.rs` (wire → `ProviderEvent`, no I/O, tested on captures),
//! `driver.rs` (the live process and the turn loop), `history.rs` (the history parser for
//! archives); where a CLI needs them, `connection.rs` (Codex's JSON-RPC, OpenCode's HTTP and
//! SSE), `archiving.rs` (history read back after a query), `media.rs` (Claude's native blocks),
//! `approval.rs` (Claude's policy, approval stops and elicitations over hook callbacks),
//! `approvals.rs` (Codex's approval requests), `hooks.rs` (trusting Codex's holding
//! `PostToolUse` hook), `permission.rs` (OpenCode's `permission` config, its decisions and the
//! approval-stop plugin). Shared, one owner each: `policy.rs` and `policy/` (what a rule means;
//! `types.rs` its vocabulary, `shell.rs` the Bash parser, `word.rs` a parsed word, `wrappers.rs`
//! the programs that run commands, `paths.rs` a file tool's path, `json.rs` the policy's written
//! form), `refusal.rs` (the wording of a refusal),
//! `classify.rs` (error classes, and the `auth_hint` in place of a CLI's login advice),
//! `redact.rs` (masking secrets), `elicitation.rs` (single-string elicitation schemas),
//! `media.rs` (native media types and caps), `kind.rs` (the list of providers), `usage.rs`,
//! `activity.rs` (an activity's summary), `text.rs` (cutting text), `mock.rs` (echo, scripted
//! approvals; keeps the latest `MOCK_KEPT` prompts), `process.rs` (process hygiene), `reaper.rs`
//! (the runner reaps everything it starts), `settings.rs` (`ProviderSettings`), `prompt_xml.rs`
//! (the prompt's XML, written and read), `archive/` (`model.rs`, `render.rs`, `store.rs`,
//! `job.rs`: transcripts, appended and never replaced, through `fsguard`).

pub mod archive;
pub mod driver;
mod kind;
pub mod media;
pub mod mock;
pub mod policy;
pub mod prompt_xml;
mod query;
pub mod recording;
pub mod settings;
mod usage;

use std::path::PathBuf;

use futures::future::BoxFuture;

pub use kind::{ProviderKind, UnknownProvider};
pub use mock::MockSettings;
pub use policy::{Decision, ToolPolicy, ToolRule, Verdict};
pub use query::{AgentQuery, Approver, Control, QueryHandle};
pub use settings::{ElicitationMode, McpServer, ProviderSettings, RemoteMcpServer};
pub use usage::Usage;

/// A file the agent should see natively (images and PDFs for Claude), next to the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaFile {
    /// Where the file is on disk.
    pub path: PathBuf,
    /// Its MIME type (`image/png`, `application/pdf`, ...).
    pub mime_type: String,
}

/// One prompt: formatted text plus native media.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prompt {
    /// The formatted prompt (docs/contract/prompt.md).
    pub text: String,
    /// Files to attach natively where the provider supports it.
    pub media: Vec<MediaFile>,
}

impl Prompt {
    /// A text-only prompt.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            media: Vec::new(),
        }
    }
}

/// What a query starts from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryInput {
    /// The first prompt of the query.
    pub prompt: Prompt,
    /// The provider session to resume (the stored `continuation:<provider>`).
    pub continuation: Option<String>,
    /// The system prompt to apply (global + group CLAUDE.md + the runner addendum).
    pub system_prompt: Option<String>,
    /// The model for this query (the session's `/model` choice), over the configured one;
    /// each CLI applies it by its own means.
    pub model: Option<String>,
}

/// Numbers the prompts of one query: 0 is the first prompt, pushes count up from 1.
pub type PromptId = u64;

/// Why a provider reported an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub enum ErrorClass {
    /// The model API failed (5xx, dropped connection); the CLI's own retries are exhausted or
    /// under way.
    Api,
    /// The account's quota or credit is exhausted (`insufficient_quota`, billing): retrying soon
    /// does not help; someone must act.
    Quota,
    /// A temporary rate limit (HTTP 429 without an exhausted quota): retry later, after
    /// `retry_after_secs` when the CLI or the gateway said.
    RateLimited {
        /// When to retry, in seconds from when the error was reported, if known.
        retry_after_secs: Option<u64>,
    },
    /// Authentication failed.
    Auth,
    /// The stored continuation names a session that does not exist: clear it.
    InvalidSession,
    /// The CLI process exited or could not be started.
    Process,
    /// The CLI produced no event for longer than the watchdog allows.
    Watchdog,
    /// The turn made no progress: retry notices without model output, or no model output at
    /// all, for longer than the runner's progress deadline (or the turn hit its total cap).
    NoProgress,
    /// The turn was aborted on request.
    Aborted,
    /// Anything else.
    Other,
}

impl ErrorClass {
    /// The class's name as written in `query_error` rows (`Api`, `RateLimited`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Api => "Api",
            Self::Quota => "Quota",
            Self::RateLimited { .. } => "RateLimited",
            Self::Auth => "Auth",
            Self::InvalidSession => "InvalidSession",
            Self::Process => "Process",
            Self::Watchdog => "Watchdog",
            Self::NoProgress => "NoProgress",
            Self::Aborted => "Aborted",
            Self::Other => "Other",
        }
    }

    /// When a rate limit says to retry, if it said.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::RateLimited {
                retry_after_secs: Some(secs),
            } => Some(std::time::Duration::from_secs(*secs)),
            _ => None,
        }
    }

    /// A rate limit whose reset time is unknown.
    pub const RATE_LIMITED: ErrorClass = ErrorClass::RateLimited {
        retry_after_secs: None,
    };
}

/// Events of a query, translated from the CLI's own protocol.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderEvent {
    /// The provider session id is known: persist it as the continuation at once.
    Init {
        /// Session or thread id.
        session_id: String,
    },
    /// A turn ended with this text. Every prompt with an id up to `covers` was consumed by the
    /// turns that have ended so far.
    Result {
        /// The final text of the turn (may be empty).
        text: String,
        /// Highest prompt id this and earlier results answered.
        covers: PromptId,
        /// What the turn cost, summed over its steps; `None` when the CLI said nothing.
        usage: Option<Usage>,
    },
    /// Something failed. `ends_turn: false` is informational (the CLI is retrying by itself).
    Error {
        /// Human-readable message.
        message: String,
        /// Whether running the same prompt again may succeed.
        retryable: bool,
        /// Classification.
        classification: ErrorClass,
        /// Whether the turn is over (no `Result` follows for it).
        ends_turn: bool,
        /// What the turn cost until it failed (only with `ends_turn`), when the CLI said.
        usage: Option<Usage>,
    },
    /// The turn ended because the runner asked ([`AgentQuery::interrupt`]) or a limit of the
    /// turn (`maxTurnsPerQuery`) was reached. Prompts up to `covers` were seen by the model;
    /// later pushes were not and were NOT consumed: the runner runs them again. The query's
    /// event stream closes after this event; the CLI process and its session live on.
    Interrupted {
        /// Highest prompt id the model saw (the first prompt, 0, always).
        covers: PromptId,
        /// What the turn cost until it stopped, when the CLI said.
        usage: Option<Usage>,
        /// Why: `stopped` (the runner's interrupt) or `max_turns` (the turn's step limit).
        reason: InterruptReason,
    },
    /// A piece of assistant text is complete (a Claude assistant message's text, a Codex
    /// agent-message item, an OpenCode text part), possibly before a tool call: the runner
    /// delivers its `<message to>` blocks at once. The turn's `Result.text` still carries the
    /// final text as before.
    Text {
        /// The complete text of that piece.
        text: String,
    },
    /// A notice for the log (compaction, retries, status); never a reply.
    Progress {
        /// What happened.
        message: String,
    },
    /// The agent is doing something (a tool call, streaming); refreshes liveness. A `tool`
    /// means a tool call started, which is also model output.
    Activity {
        /// Tool name, when a tool started, in the canonical vocabulary (`Bash`, `Read`,
        /// `Write`, `Edit`, `Glob`, `Grep`, `WebFetch`, `WebSearch`, `mcp__<server>__<tool>`;
        /// another builtin keeps its CLI's name).
        tool: Option<String>,
        /// What the tool call does, short: the command line (≤ 120 characters) or the path.
        summary: Option<String>,
    },
    /// The model produced output (streamed text or thinking, a message): the turn makes
    /// progress. The runner's progress deadline counts from the last one (or a tool's end).
    Output,
    /// A tool call ended; `running` tool calls of the turn are still running. While any runs,
    /// the progress deadline is paused (a tool may legitimately take long).
    ToolEnded {
        /// Tool calls still running in the turn.
        running: usize,
    },
    /// The CLI waits for a decision the runner must get from the user (a tool call the policy
    /// marks `ask`, or an MCP elicitation with `elicitation: ask`). The runner asks in the chat
    /// and answers with [`Approver::answer`] under the request's `id`; the CLI waits meanwhile
    /// (the driver's watchdog must not count the wait). Unanswered at the query's end, the
    /// driver denies it.
    ApprovalRequest(ApprovalRequest),
    /// The driver or the CLI refused a tool call by the policy without asking (a `deny` rule,
    /// or `default: deny`): the runner records it as a `tool_decision` row, `by: "policy"`.
    ToolDenied {
        /// Canonical tool name.
        tool: String,
        /// What the call would have done, short (as in `Activity`).
        summary: Option<String>,
    },
    /// As [`ProviderEvent::ToolDenied`], for a call refused because its command could not be
    /// decided (a program name that is not a literal, such as `$X`): the runner's
    /// `tool_decision` row also carries `undecidable` with the reason.
    ToolUndecidable {
        /// Canonical tool name.
        tool: String,
        /// What the call would have done, short (as in `Activity`).
        summary: Option<String>,
        /// Why the command could not be decided.
        reason: String,
    },
}

/// A decision the CLI waits for ([`ProviderEvent::ApprovalRequest`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRequest {
    /// The driver's id of the request, unique within the query; given back in the answer.
    pub id: String,
    /// What is asked.
    pub kind: ApprovalKind,
}

/// What an [`ApprovalRequest`] asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalKind {
    /// May this tool call run? Answered with [`ApprovalAnswer::Allow`] or
    /// [`ApprovalAnswer::Deny`].
    ToolCall {
        /// Canonical tool name (`Bash`, `mcp__github__create_issue`).
        tool: String,
        /// What the call does, short (≤ 120 characters, as in `Activity`).
        summary: Option<String>,
        /// The whole argument the policy matched (the full command line, the path), so the user
        /// approves what actually runs; `None` when unknown.
        argument: Option<String>,
        /// Set when the policy asks because the command could not be decided (issue 41: a
        /// program name that is not a literal, under an `ask` rule with a pattern): why. The
        /// question says so, the `tool_decision` row carries it, and a refusal tells the model
        /// to write the command literally.
        undecidable: Option<String>,
    },
    /// An MCP server asks the user something (Codex elicitation). Answered with
    /// [`ApprovalAnswer::Reply`] (the chosen option or the text) or [`ApprovalAnswer::Deny`]
    /// (declined).
    Elicitation {
        /// The MCP server's name.
        server: String,
        /// Its message to the user.
        message: String,
        /// The allowed answers when the schema is a single choice; empty for free text.
        options: Vec<String>,
    },
}

/// The runner's answer to an [`ApprovalRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalAnswer {
    /// The call may run.
    Allow,
    /// Refused (or declined); `reason` is what the model is told.
    Deny {
        /// Why, for the model (`denied by the user`, `no answer within 300 s`).
        reason: String,
    },
    /// The user's answer to an elicitation.
    Reply(String),
}

/// Why a turn was interrupted ([`ProviderEvent::Interrupted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterruptReason {
    /// The runner asked (`/stop`, `nanoclaw interrupt`, an approval stop).
    Stopped,
    /// The turn reached `maxTurnsPerQuery` model requests.
    MaxTurns,
    /// A tool of `approvalStopTools` returned its result: the turn ends there, with no model
    /// output after it, and the next user message continues the session. No reply is written
    /// for it (the tool's result is the turn's output).
    ApprovalStop,
}

/// Errors starting a query.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The CLI binary could not be found or started.
    #[error("{0}")]
    Spawn(String),
    /// The query is closed (ended, aborted, or the provider stopped).
    #[error("the query is closed")]
    Closed,
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

impl From<procs::SpawnError> for ProviderError {
    fn from(err: procs::SpawnError) -> Self {
        Self::Spawn(err.0)
    }
}

/// A coding-agent CLI driven through one interface.
pub trait AgentProvider: Send + Sync {
    /// `claude`, `codex`, `opencode`, `gemini`, `qwen`, `acp` or `mock`: also the suffix of the
    /// continuation key.
    fn name(&self) -> &'static str;

    /// Starts a query with its first prompt. Events arrive on the returned handle.
    fn query(&self, input: QueryInput) -> Result<AgentQuery, ProviderError>;

    /// Slash commands the CLI handles natively; such a chat message goes raw as its own query.
    fn native_commands(&self) -> &'static [&'static str] {
        &[]
    }

    /// Stops every process the provider started (the whole process group) and waits for them.
    fn shutdown(&self) -> BoxFuture<'_, ()>;
}
