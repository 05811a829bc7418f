//! Typed rows of every table, and the shapes used to insert them.

use rusqlite::types::ValueRef;
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

    /// Reads a row selected with `IN_COLUMNS` whatever the storage types of its columns: a host
    /// writing through another driver can store text as BLOB or numbers as TEXT, and a strict read
    /// would fail every query that meets the row (the whole queue stuck behind it). Text columns
    /// are read lossily, integers and flags leniently ([`lenient_int`], [`lenient_flag`]); only an
    /// id that is not text or a seq that is not an integer make the row [`InRow::Unusable`]. Fails
    /// only on a column index error (a bug).
    pub(crate) fn read(row: &rusqlite::Row<'_>) -> rusqlite::Result<InRow> {
        let raw = |index: usize| row.get_ref(index);
        let rowid: i64 = row.get(17)?;
        let routing = Routing {
            platform_id: lossy_text(raw(11)?),
            channel_type: lossy_text(raw(12)?),
            thread_id: lossy_text(raw(13)?),
        };
        let id = match raw(0)? {
            ValueRef::Text(bytes) => std::str::from_utf8(bytes).ok().map(str::to_owned),
            _ => None,
        };
        let Some(id) = id else {
            let value = raw(0)?;
            return Ok(InRow::Unusable(UnusableRow {
                rowid,
                id: None,
                column: "id",
                value: describe(value),
                reason: format!("the id is {}, not text", type_name(value)),
                routing,
            }));
        };
        let seq = match raw(1)? {
            ValueRef::Null => None,
            value => match lenient_int(value) {
                Some(seq) => Some(seq),
                None => {
                    return Ok(InRow::Unusable(UnusableRow {
                        rowid,
                        id: Some(id),
                        column: "seq",
                        value: describe(value),
                        reason: format!("the seq is {}, not an integer", type_name(value)),
                        routing,
                    }))
                }
            },
        };
        Ok(InRow::Usable(
            rowid,
            Self {
                id,
                seq,
                kind: lossy_text(raw(2)?).unwrap_or_default(),
                timestamp: lossy_text(raw(3)?).unwrap_or_default(),
                status: lossy_text(raw(4)?).unwrap_or_default(),
                status_changed: lossy_text(raw(5)?),
                process_after: lossy_text(raw(6)?),
                recurrence: lossy_text(raw(7)?),
                series_id: lossy_text(raw(8)?),
                tries: lenient_int(raw(9)?).unwrap_or(0),
                trigger: lenient_flag(raw(10)?, true),
                routing,
                // Not valid text: read lossily, so it parses if it is JSON stored as BLOB and is
                // passed on as unparsable content otherwise.
                content: lossy_text(raw(14)?).unwrap_or_default(),
                source_session_id: lossy_text(raw(15)?),
                on_wake: lenient_flag(raw(16)?, false),
            },
        ))
    }
}

/// What reading a `messages_in` row gave (see [`MessageIn::read`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum InRow {
    /// A row the runner can serve, with its rowid.
    Usable(i64, MessageIn),
    /// A row nobody can address or order.
    Unusable(UnusableRow),
}

/// A `messages_in` row the queue cannot use: its id is not text, its seq is not an integer, or
/// (for the runner's poll) its `process_after` cannot be read. The runner's poll takes such a row
/// out of the queue (status `failed`, a warning and a `row_unusable` system row, see
/// `SessionDb::eligible`); read-only listings leave it out.
#[derive(Debug, Clone, PartialEq)]
pub struct UnusableRow {
    /// SQLite's rowid: the one handle on a row whose id is unreadable.
    pub rowid: i64,
    /// The id, when it is text.
    pub id: Option<String>,
    /// The column at fault.
    pub column: &'static str,
    /// Its value as text (`<BLOB of 3 bytes>` when it is no text).
    pub value: String,
    /// Why the row cannot be used.
    pub reason: String,
    /// The row's routing, so the host can tell the chat it came from.
    pub routing: Routing,
}

/// A column as text whatever its storage type: invalid UTF-8 (in TEXT or BLOB) is replaced, numbers
/// are written out; `None` for NULL.
pub(crate) fn lossy_text(value: ValueRef<'_>) -> Option<String> {
    match value {
        ValueRef::Null => None,
        ValueRef::Integer(number) => Some(number.to_string()),
        ValueRef::Real(number) => Some(number.to_string()),
        ValueRef::Text(bytes) | ValueRef::Blob(bytes) => {
            Some(String::from_utf8_lossy(bytes).into_owned())
        }
    }
}

/// An integer column read leniently: an INTEGER, a REAL without a fraction, or TEXT holding a
/// decimal integer (surrounding spaces allowed); `None` for anything else.
pub(crate) fn lenient_int(value: ValueRef<'_>) -> Option<i64> {
    // 2^63: the first REAL above every i64 (`i64::MAX as f64` rounds up to it).
    const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
    match value {
        ValueRef::Integer(number) => Some(number),
        ValueRef::Real(number)
            if number.fract() == 0.0 && (-TWO_POW_63..TWO_POW_63).contains(&number) =>
        {
            Some(number as i64)
        }
        ValueRef::Text(bytes) => std::str::from_utf8(bytes).ok()?.trim().parse().ok(),
        _ => None,
    }
}

/// A 0/1 flag column read leniently: a number (non-zero is true), TEXT holding an integer or
/// `true`/`false` (any case); `default` (the column's default) for anything else. The SQL gates
/// read flags through the same function (`flag_of()`, see `db::configure_connection`).
pub(crate) fn lenient_flag(value: ValueRef<'_>, default: bool) -> bool {
    match value {
        ValueRef::Real(number) => number != 0.0,
        ValueRef::Text(bytes) => {
            let text = std::str::from_utf8(bytes).unwrap_or_default().trim();
            if text.eq_ignore_ascii_case("true") {
                true
            } else if text.eq_ignore_ascii_case("false") {
                false
            } else {
                lenient_int(value).map_or(default, |number| number != 0)
            }
        }
        value => lenient_int(value).map_or(default, |number| number != 0),
    }
}

/// SQLite's name of a value's storage type.
fn type_name(value: ValueRef<'_>) -> &'static str {
    match value {
        ValueRef::Null => "NULL",
        ValueRef::Integer(_) => "INTEGER",
        ValueRef::Real(_) => "REAL",
        ValueRef::Text(bytes) if std::str::from_utf8(bytes).is_err() => "TEXT that is not UTF-8",
        ValueRef::Text(_) => "TEXT",
        ValueRef::Blob(_) => "BLOB",
    }
}

/// A value for a log line or a system row: text as itself (cut at 200 characters), other types
/// named.
fn describe(value: ValueRef<'_>) -> String {
    match value {
        ValueRef::Text(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => text.chars().take(200).collect(),
            Err(_) => format!("<TEXT of {} bytes, not UTF-8>", bytes.len()),
        },
        ValueRef::Blob(bytes) => format!("<BLOB of {} bytes>", bytes.len()),
        other => lossy_text(other).unwrap_or_else(|| "NULL".to_owned()),
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
    /// Reads a row selected with `OUT_COLUMNS`, tolerating wrong storage types like
    /// [`MessageIn::read`] (a seq that is no integer reads as `None`), so one bad row never
    /// stops a reader such as the host's `watch`. Fails only on a column index error.
    pub(crate) fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        let text = |index: usize| row.get_ref(index).map(lossy_text);
        Ok(Self {
            id: text(0)?.unwrap_or_default(),
            seq: lenient_int(row.get_ref(1)?),
            in_reply_to: text(2)?,
            timestamp: text(3)?.unwrap_or_default(),
            deliver_after: text(4)?,
            kind: text(5)?.unwrap_or_default(),
            routing: Routing {
                platform_id: text(6)?,
                channel_type: text(7)?,
                thread_id: text(8)?,
            },
            content: text(9)?.unwrap_or_default(),
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
    /// The channel a message to this destination goes to (no thread: see
    /// [`SessionDb::route_to_destination`](crate::SessionDb::route_to_destination), which adds
    /// one). An agent destination without a channel of its own is channel type `agent` with its
    /// agent group id as platform id.
    pub fn routing(&self) -> Routing {
        let mut routing = Routing {
            channel_type: self.channel_type.clone(),
            platform_id: self.platform_id.clone(),
            thread_id: None,
        };
        if self.kind == "agent" {
            if routing.channel_type.is_none() {
                routing.channel_type = Some("agent".into());
            }
            if routing.platform_id.is_none() {
                routing.platform_id = self.agent_group_id.clone();
            }
        }
        routing
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
    /// Why a `failed` delivery failed, as the host said.
    pub reason: Option<String>,
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
    /// What a turn that makes no progress waits on, as stored: JSON of a [`WaitingOn`] (read it
    /// with [`RunnerState::waiting`]); `None` while output flows.
    pub waiting_on: Option<String>,
    /// Last heartbeat.
    pub heartbeat_at: String,
    /// Last status change.
    pub updated_at: String,
    /// The running turn's last provider event, as stored: JSON of a [`LastEvent`] (read it with
    /// [`RunnerState::last_event`]). Written with the heartbeat, so up to one heartbeat late.
    pub last_event: Option<String>,
}

impl RunnerState {
    /// What the turn waits on, when the stored value can be read.
    pub fn waiting(&self) -> Option<WaitingOn> {
        serde_json::from_str(self.waiting_on.as_deref()?).ok()
    }

    /// The last provider event, when the stored value can be read.
    pub fn last_event(&self) -> Option<LastEvent> {
        serde_json::from_str(self.last_event.as_deref()?).ok()
    }
}

/// The last event a provider reported during a turn (model output, a tool call, a retry
/// notice): what `status` shows and what `health` measures a turn's silence from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastEvent {
    /// When it came, RFC 3339 UTC.
    pub at: String,
    /// What it was, in words (`model output`, `tool Bash`, a retry notice's text).
    pub what: String,
}

/// What a turn that makes no progress waits on: written by the runner while the model gives no
/// output (retry notices, silence), cleared when output resumes or the turn ends. Also what an
/// idle runner waits on while a spending limit holds the queue (`budget` set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitingOn {
    /// The model endpoint (the configured base URL).
    pub endpoint: String,
    /// Since when no output came, RFC 3339 UTC.
    pub since: String,
    /// Retry or reconnect notices of the CLI since then.
    pub notices: u32,
    /// The last of those notices.
    #[serde(default)]
    pub last_notice: Option<String>,
    /// The spending limit (its config key, `maxCostUsdPerDay`) that holds the queue, when the
    /// runner waits on a budget rather than on the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
    /// What the user is asked to approve (`Bash`, or `github asks` for an MCP elicitation),
    /// when the turn waits on an approval question rather than on the model (issue 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<String>,
    /// The approval question's id, for `nanoclaw answer --question`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question_id: Option<String>,
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
