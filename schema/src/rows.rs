//! Typed rows of every table, and the shapes used to insert them.

use serde::{Deserialize, Serialize};

/// Where a message goes or came from on the chat platform. Never shown to the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Routing {
    /// Platform kind, e.g. `slack`, `discord`, `agent`.
    pub channel_type: Option<String>,
    /// Channel or chat id on the platform.
    pub platform_id: Option<String>,
    /// Thread within the channel, if any.
    pub thread_id: Option<String>,
}

impl Routing {
    /// True when no field is set.
    pub fn is_empty(&self) -> bool {
        self.channel_type.is_none() && self.platform_id.is_none() && self.thread_id.is_none()
    }
}

/// Kind of a `messages_in` row. Unknown kinds are kept, not rejected, so nothing is lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InKind {
    /// A chat message from a platform adapter.
    Chat,
    /// A serialized Chat SDK message.
    ChatSdk,
    /// A scheduled task occurrence.
    Task,
    /// A webhook delivery.
    Webhook,
    /// A host action result or a question answer.
    System,
    /// A kind this version does not know.
    Other(String),
}

impl InKind {
    /// Parses the `kind` column.
    pub fn parse(value: &str) -> Self {
        match value {
            "chat" => Self::Chat,
            "chat-sdk" => Self::ChatSdk,
            "task" => Self::Task,
            "webhook" => Self::Webhook,
            "system" => Self::System,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The `kind` column value.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Chat => "chat",
            Self::ChatSdk => "chat-sdk",
            Self::Task => "task",
            Self::Webhook => "webhook",
            Self::System => "system",
            Self::Other(other) => other,
        }
    }
}

/// Kind of a `messages_out` row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutKind {
    /// Plain chat text (and edits, reactions, files).
    Chat,
    /// Chat SDK payloads: cards and questions.
    ChatSdk,
    /// An action for the host.
    System,
}

impl OutKind {
    /// The `kind` column value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::ChatSdk => "chat-sdk",
            Self::System => "system",
        }
    }
}

/// Lifecycle of a `messages_in` row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InStatus {
    /// Waiting to be claimed.
    Pending,
    /// Claimed by the runner.
    Processing,
    /// Done.
    Completed,
    /// Given up by the host.
    Failed,
    /// A paused task.
    Paused,
}

impl InStatus {
    /// The `status` column value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Processing => "processing",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Paused => "paused",
        }
    }

    /// Parses the `status` column; `None` for an unknown value.
    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "pending" => Self::Pending,
            "processing" => Self::Processing,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "paused" => Self::Paused,
            _ => return None,
        })
    }
}

/// A `messages_in` row as stored. Timestamps stay strings: a bad one must not hide the row.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageIn {
    /// Primary key.
    pub id: String,
    /// Agent-visible number (even).
    pub seq: Option<i64>,
    /// Raw `kind` column.
    pub kind: String,
    /// When the message was sent.
    pub timestamp: String,
    /// Raw `status` column.
    pub status: String,
    /// When the status last changed.
    pub status_changed: Option<String>,
    /// Not due before this instant.
    pub process_after: Option<String>,
    /// Cron expression for recurring tasks.
    pub recurrence: Option<String>,
    /// Series of a recurring task.
    pub series_id: Option<String>,
    /// How often the row was claimed.
    pub tries: i64,
    /// False: context only, never wakes the agent alone.
    pub trigger: bool,
    /// Where it came from.
    pub routing: Routing,
    /// JSON content, shape by kind.
    pub content: String,
    /// Agent-to-agent return path.
    pub source_session_id: Option<String>,
    /// Only delivered on the runner's first poll after start.
    pub on_wake: bool,
}

impl MessageIn {
    /// Parsed kind.
    pub fn kind(&self) -> InKind {
        InKind::parse(&self.kind)
    }

    pub(crate) fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            seq: row.get(1)?,
            kind: row.get(2)?,
            timestamp: row.get(3)?,
            status: row.get(4)?,
            status_changed: row.get(5)?,
            process_after: row.get(6)?,
            recurrence: row.get(7)?,
            series_id: row.get(8)?,
            tries: row.get(9)?,
            trigger: row.get::<_, i64>(10)? != 0,
            routing: Routing {
                platform_id: row.get(11)?,
                channel_type: row.get(12)?,
                thread_id: row.get(13)?,
            },
            content: row.get(14)?,
            source_session_id: row.get(15)?,
            on_wake: row.get::<_, i64>(16)? != 0,
        })
    }
}

/// A `messages_out` row as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageOut {
    /// Primary key.
    pub id: String,
    /// Agent-visible number (odd).
    pub seq: Option<i64>,
    /// The `messages_in.id` that triggered it.
    pub in_reply_to: Option<String>,
    /// When it was written.
    pub timestamp: String,
    /// Not to be delivered before this instant.
    pub deliver_after: Option<String>,
    /// Raw `kind` column.
    pub kind: String,
    /// Where it goes.
    pub routing: Routing,
    /// JSON content.
    pub content: String,
}

impl MessageOut {
    pub(crate) fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            seq: row.get(1)?,
            in_reply_to: row.get(2)?,
            timestamp: row.get(3)?,
            deliver_after: row.get(4)?,
            kind: row.get(5)?,
            routing: Routing {
                platform_id: row.get(6)?,
                channel_type: row.get(7)?,
                thread_id: row.get(8)?,
            },
            content: row.get(9)?,
        })
    }
}

/// A `messages_in` row to insert. `id` and `timestamp` default to a fresh UUID and now.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessageIn {
    /// Id; a UUID when `None`.
    pub id: Option<String>,
    /// Kind column.
    pub kind: String,
    /// Send time; now when `None`.
    pub timestamp: Option<String>,
    /// Initial status (normally pending).
    pub status: InStatus,
    /// Not due before.
    pub process_after: Option<String>,
    /// Cron expression.
    pub recurrence: Option<String>,
    /// Series id; for a new task series, the row's own id (see `series_is_self`).
    pub series_id: Option<String>,
    /// When true, `series_id` is set to the row's own id.
    pub series_is_self: bool,
    /// Wakes the agent.
    pub trigger: bool,
    /// Routing.
    pub routing: Routing,
    /// JSON content.
    pub content: String,
    /// Agent-to-agent return path.
    pub source_session_id: Option<String>,
    /// Only on first poll.
    pub on_wake: bool,
}

impl NewMessageIn {
    /// A pending, triggering row of `kind` with `content` and no routing.
    pub fn new(kind: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            id: None,
            kind: kind.into(),
            timestamp: None,
            status: InStatus::Pending,
            process_after: None,
            recurrence: None,
            series_id: None,
            series_is_self: false,
            trigger: true,
            routing: Routing::default(),
            content: content.into(),
            source_session_id: None,
            on_wake: false,
        }
    }
}

/// A `messages_out` row to insert.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessageOut {
    /// Id; a UUID when `None`.
    pub id: Option<String>,
    /// Triggering inbound id.
    pub in_reply_to: Option<String>,
    /// Not before.
    pub deliver_after: Option<String>,
    /// Kind.
    pub kind: OutKind,
    /// Where it goes.
    pub routing: Routing,
    /// JSON content.
    pub content: String,
}

impl NewMessageOut {
    /// A row of `kind` with `content` (JSON value) routed to `routing`.
    pub fn new(kind: OutKind, routing: Routing, content: &serde_json::Value) -> Self {
        Self {
            id: None,
            in_reply_to: None,
            deliver_after: None,
            kind,
            routing,
            content: content.to_string(),
        }
    }

    /// Sets `in_reply_to`.
    pub fn replying_to(mut self, in_reply_to: Option<String>) -> Self {
        self.in_reply_to = in_reply_to;
        self
    }
}

/// Id and seq of a row just written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Inserted {
    /// Primary key.
    pub id: String,
    /// Allocated seq.
    pub seq: i64,
}

/// A `destinations` row: a name the agent can address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Destination {
    /// Name the agent uses (`<message to="name">`).
    pub name: String,
    /// Human-readable name.
    pub display_name: Option<String>,
    /// `channel` or `agent`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Platform kind.
    pub channel_type: Option<String>,
    /// Platform channel id.
    pub platform_id: Option<String>,
    /// Target agent group, for agent destinations.
    pub agent_group_id: Option<String>,
}

impl Destination {
    /// The routing a message to this destination carries.
    pub fn routing(&self) -> Routing {
        Routing {
            channel_type: self.channel_type.clone(),
            platform_id: self.platform_id.clone(),
            thread_id: None,
        }
    }
}

/// What the host recorded about a delivered `messages_out` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    /// The delivered row.
    pub message_out_id: String,
    /// The platform's id for it, for edits and reactions.
    pub platform_message_id: Option<String>,
    /// Delivery status.
    pub status: String,
    /// When.
    pub delivered_at: String,
}

/// Runner status for the host's idle detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerStatus {
    /// Booting.
    Starting,
    /// Waiting for messages.
    Idle,
    /// A query runs.
    Busy,
    /// `ask_user_question` blocks.
    WaitingUser,
    /// Exited.
    Stopped,
}

impl RunnerStatus {
    /// Column value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Idle => "idle",
            Self::Busy => "busy",
            Self::WaitingUser => "waiting_user",
            Self::Stopped => "stopped",
        }
    }
}

/// The `runner_state` row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunnerState {
    /// Raw status.
    pub status: String,
    /// Runner pid.
    pub pid: Option<i64>,
    /// Provider name.
    pub provider: Option<String>,
    /// Tool the agent is in, if known.
    pub current_tool: Option<String>,
    /// Last heartbeat.
    pub heartbeat_at: String,
    /// Last status change.
    pub updated_at: String,
}

/// Routing and reply target of the batch the runner is working on, stored as `current_batch` so
/// mcp-tools (another process) routes tool output the same way.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CurrentBatch {
    /// Routing of the batch's origin.
    #[serde(flatten)]
    pub routing: Routing,
    /// `messages_in.id` replies refer to.
    pub in_reply_to: Option<String>,
    /// Every claimed id in the batch (the host's sweep leaves these alone while the runner lives).
    #[serde(default)]
    pub ids: Vec<String>,
    /// Sender id of the last chat message in the batch, for admin checks.
    #[serde(default)]
    pub sender_id: Option<String>,
}
