//! The parts of OpenCode's server protocol (`opencode serve`, v1 API) the provider reads: the
//! `GET /event` SSE items and the message records of `GET /session/{id}/message`.
//!
//! The structs are tolerant on purpose: only the fields the provider uses are typed,
//! everything else lands in `extra`, and an event type the provider does not know becomes
//! [`Event::Other`] instead of an error, so a new OpenCode release with more fields or events
//! still parses.

use serde::Deserialize;
use serde_json::{Map, Value};

/// Name of the mcp-tools server; OpenCode shows its tools to the model as `nanoclaw_<tool>`.
pub(super) const MCP_SERVER: &str = "nanoclaw";

/// One item of the `GET /event` stream: `{"id":"evt_…","type":…,"properties":{…}}`.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Envelope {
    /// Event type, such as `message.part.updated`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The payload; its shape depends on `kind`.
    #[serde(default)]
    pub properties: Value,
    /// Everything else (the event id); not read, kept for the `Debug` output in logs.
    #[serde(flatten)]
    #[allow(dead_code)]
    pub extra: Map<String, Value>,
}

/// Times of a message.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(super) struct MessageTime {
    /// Creation time (epoch ms).
    #[serde(default)]
    pub created: Option<f64>,
    /// Completion time (epoch ms); set once an assistant message is finished or failed.
    #[serde(default)]
    pub completed: Option<f64>,
}

/// The `data` of an OpenCode error (`APIError`, `MessageAbortedError`, ...).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(super) struct ErrorData {
    /// Human-readable message.
    #[serde(default)]
    pub message: Option<String>,
    /// HTTP status of a model API error.
    #[serde(default, rename = "statusCode")]
    pub status_code: Option<u16>,
    /// Whether OpenCode considered the API error retryable (its retries are over by now).
    #[serde(default, rename = "isRetryable")]
    pub is_retryable: Option<bool>,
    /// Everything else (response headers and body, url, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// An error attached to a session or a message: `{"name":"APIError","data":{…}}`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(super) struct ErrorInfo {
    /// Error class name: `APIError`, `ProviderAuthError`, `MessageAbortedError`,
    /// `MessageOutputLengthError`, `ContextOverflowError`, `UnknownError`, ...
    #[serde(default)]
    pub name: String,
    /// Details.
    #[serde(default)]
    pub data: ErrorData,
}

impl ErrorInfo {
    /// True for the error an abort leaves on the session and the aborted message.
    pub(super) fn is_abort(&self) -> bool {
        self.name == "MessageAbortedError"
    }

    /// The message, or the error name when there is none.
    pub(super) fn text(&self) -> String {
        match &self.data.message {
            Some(message) if !message.is_empty() => message.clone(),
            _ => self.name.clone(),
        }
    }
}

/// A user or assistant message record (`message.updated` `info`, or `info` of a listed message).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(super) struct MessageInfo {
    /// `msg_…`; ascending ids sort in creation order.
    pub id: String,
    /// `user` or `assistant`.
    #[serde(default)]
    pub role: String,
    /// The session.
    #[serde(default, rename = "sessionID")]
    pub session_id: String,
    /// Assistant messages: the user message this step answers (the latest user message when the
    /// step started, so a follow-up queued mid-turn moves it forward).
    #[serde(default, rename = "parentID")]
    pub parent_id: Option<String>,
    /// Assistant messages: why the step ended (`stop`, `tool-calls`, `length`, `unknown`, ...).
    #[serde(default)]
    pub finish: Option<String>,
    /// Creation and completion times.
    #[serde(default)]
    pub time: MessageTime,
    /// Set when the step failed or was aborted.
    #[serde(default)]
    pub error: Option<ErrorInfo>,
    /// Everything else (tokens, cost, model, path, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl MessageInfo {
    /// True for an assistant message.
    pub(super) fn is_assistant(&self) -> bool {
        self.role == "assistant"
    }

    /// True when the step is over (finished, failed or aborted).
    pub(super) fn is_completed(&self) -> bool {
        self.time.completed.is_some() || self.error.is_some()
    }

    /// The model that answered (`modelID`).
    pub(super) fn model_id(&self) -> Option<&str> {
        self.extra.get("modelID").and_then(Value::as_str)
    }

    /// True when OpenCode's run loop stops after this step: it finished for a reason other than
    /// tool calls (the loop then runs the tools and asks again) or `unknown` (a stream without
    /// `finish_reason`, which OpenCode retries).
    pub(super) fn ends_loop(&self) -> bool {
        match self.finish.as_deref() {
            Some("tool-calls" | "unknown") | None => false,
            Some(_) => true,
        }
    }
}

/// The state of a tool part.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(super) struct ToolState {
    /// `pending`, `running`, `completed` or `error`.
    #[serde(default)]
    pub status: String,
    /// Error text of a failed call.
    #[serde(default)]
    pub error: Option<String>,
    /// Everything else (input, output, time, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One part of a message (`message.part.updated` `part`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(super) struct Part {
    /// `prt_…`.
    #[serde(default)]
    pub id: String,
    /// The message it belongs to.
    #[serde(default, rename = "messageID")]
    pub message_id: String,
    /// The session.
    #[serde(default, rename = "sessionID")]
    pub session_id: String,
    /// `text`, `reasoning`, `tool`, `step-start`, `step-finish`, `file`, `compaction`, ...
    #[serde(default, rename = "type")]
    pub kind: String,
    /// Text of a `text` or `reasoning` part (the whole text so far).
    #[serde(default)]
    pub text: Option<String>,
    /// Set on text OpenCode added itself (not model output).
    #[serde(default)]
    pub synthetic: Option<bool>,
    /// Set on text parts that must not be shown.
    #[serde(default)]
    pub ignored: Option<bool>,
    /// Tool name of a `tool` part (`nanoclaw_send_message`, `bash`, ...).
    #[serde(default)]
    pub tool: Option<String>,
    /// Tool call id.
    #[serde(default, rename = "callID")]
    pub call_id: Option<String>,
    /// Tool state.
    #[serde(default)]
    pub state: Option<ToolState>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Part {
    /// A text part the model finished: OpenCode sets `time.end` when the text block ends (before
    /// a tool call of the same step starts).
    pub(super) fn text_ended(&self) -> bool {
        self.extra
            .get("time")
            .and_then(|time| time.get("end"))
            .is_some_and(|end| !end.is_null())
    }

    /// The `reason` of a `step-finish` part (`tool-calls`, `stop`, `length`, `unknown`, ...).
    pub(super) fn finish_reason(&self) -> Option<&str> {
        self.extra.get("reason").and_then(Value::as_str)
    }

    /// The arguments of a tool call (`state.input`; `{}` while it is pending).
    pub(super) fn tool_input(&self) -> Option<&Value> {
        self.state
            .as_ref()
            .and_then(|state| state.extra.get("input"))
    }

    /// What a `step-finish` part says one model request cost, in OpenCode's own counting
    /// (`tokens.input` excludes cache reads and writes, `tokens.output` excludes reasoning;
    /// `cost` from its model table). A field that is absent or not a number is `None`.
    pub(super) fn step_figures(&self) -> StepFigures {
        let tokens = self.extra.get("tokens");
        let count = |path: &[&str]| {
            path.iter()
                .try_fold(tokens?, |value, key| value.get(key))
                .and_then(Value::as_u64)
        };
        StepFigures {
            input: count(&["input"]),
            output: count(&["output"]),
            reasoning: count(&["reasoning"]),
            cache_read: count(&["cache", "read"]),
            cache_write: count(&["cache", "write"]),
            cost: self
                .extra
                .get("cost")
                .and_then(Value::as_f64)
                .filter(|cost| cost.is_finite()),
        }
    }
}

/// The figures of one `step-finish` part, as OpenCode counts them (see [`Part::step_figures`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct StepFigures {
    /// Input tokens, cache reads and writes excluded.
    pub input: Option<u64>,
    /// Output tokens, reasoning excluded.
    pub output: Option<u64>,
    /// Reasoning tokens.
    pub reasoning: Option<u64>,
    /// Input tokens read from the cache.
    pub cache_read: Option<u64>,
    /// Input tokens written to the cache.
    pub cache_write: Option<u64>,
    /// Cost in USD from OpenCode's model table (0 for a model without prices).
    pub cost: Option<f64>,
}

/// `session.status` `status`: `{"type":"busy"|"idle"}` or
/// `{"type":"retry","attempt":n,"message":"…","next":<epoch ms>}`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(super) struct Status {
    /// `busy`, `idle` or `retry`.
    #[serde(default, rename = "type")]
    pub kind: String,
    /// Retry number (1 after the first failure).
    #[serde(default)]
    pub attempt: Option<u32>,
    /// The error being retried.
    #[serde(default)]
    pub message: Option<String>,
    /// When the next attempt starts (epoch ms).
    #[serde(default)]
    pub next: Option<f64>,
}

/// A listed message: `{"info":{…},"parts":[…]}` (`GET /session/{id}/message`).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct MessageWithParts {
    /// The message.
    pub info: MessageInfo,
    /// Its parts.
    #[serde(default)]
    pub parts: Vec<Part>,
}

/// The SSE events the provider acts on.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Event {
    /// First event of every `/event` connection.
    Connected,
    /// Sent every few seconds; proves the server is alive, says nothing about a turn.
    Heartbeat,
    /// A message was created or changed.
    MessageUpdated(MessageInfo),
    /// A message part was created or changed.
    PartUpdated(Part),
    /// Streaming text of a part (`message.part.delta`).
    PartDelta {
        /// The session.
        session_id: String,
        /// The part.
        part_id: String,
        /// The streamed text when the growing field is the part's `text` (the part's own
        /// updates carry its text only when it ends, see `Turn`).
        text_delta: Option<String>,
    },
    /// `session.status`.
    Status {
        /// The session.
        session_id: String,
        /// Busy, idle or retrying.
        status: Status,
    },
    /// `session.idle`: the run loop of the session stopped.
    Idle {
        /// The session.
        session_id: String,
    },
    /// `session.error`: the run loop failed (or was aborted).
    SessionError {
        /// The session, when the error belongs to one.
        session_id: Option<String>,
        /// The error.
        error: ErrorInfo,
    },
    /// `session.compacted`: the conversation was summarized to fit the context.
    Compacted {
        /// The session.
        session_id: String,
    },
    /// `permission.asked` or `question.asked`: OpenCode waits for a person.
    Asked {
        /// The event type.
        kind: String,
        /// The session.
        session_id: String,
        /// Request id.
        request_id: Option<String>,
        /// The payload, for the log.
        properties: Value,
    },
    /// Anything else (catalog, plugin, diff, session.updated, ...).
    Other {
        /// The event type.
        kind: String,
        /// `properties.sessionID`, when present.
        session_id: Option<String>,
    },
}

impl Event {
    /// Parses one SSE `data` payload.
    pub(super) fn parse(data: &str) -> Result<Event, serde_json::Error> {
        let envelope: Envelope = serde_json::from_str(data)?;
        Ok(Event::from_envelope(envelope))
    }

    /// Interprets an envelope. A payload that does not have the expected shape becomes
    /// [`Event::Other`] (logged by the caller), never an error.
    pub(super) fn from_envelope(envelope: Envelope) -> Event {
        let Envelope {
            kind, properties, ..
        } = envelope;
        let session_id = properties
            .get("sessionID")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let field = |name: &str| properties.get(name).cloned().unwrap_or(Value::Null);
        let parsed = match kind.as_str() {
            "server.connected" => Some(Event::Connected),
            "server.heartbeat" => Some(Event::Heartbeat),
            "message.updated" => serde_json::from_value(field("info"))
                .ok()
                .map(Event::MessageUpdated),
            "message.part.updated" => serde_json::from_value(field("part"))
                .ok()
                .map(Event::PartUpdated),
            "message.part.delta" => session_id.clone().map(|session_id| Event::PartDelta {
                session_id,
                part_id: properties
                    .get("partID")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                text_delta: properties
                    .get("delta")
                    .and_then(Value::as_str)
                    .filter(|_| properties.get("field").and_then(Value::as_str) == Some("text"))
                    .map(str::to_owned),
            }),
            "session.status" => match (session_id.clone(), serde_json::from_value(field("status")))
            {
                (Some(session_id), Ok(status)) => Some(Event::Status { session_id, status }),
                _ => None,
            },
            "session.idle" => session_id
                .clone()
                .map(|session_id| Event::Idle { session_id }),
            "session.error" => Some(Event::SessionError {
                session_id: session_id.clone(),
                error: serde_json::from_value(field("error")).unwrap_or_default(),
            }),
            "session.compacted" => session_id
                .clone()
                .map(|session_id| Event::Compacted { session_id }),
            "permission.asked" | "question.asked" => {
                session_id.clone().map(|session_id| Event::Asked {
                    kind: kind.clone(),
                    session_id,
                    request_id: properties
                        .get("id")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    properties: properties.clone(),
                })
            }
            _ => None,
        };
        parsed.unwrap_or(Event::Other { kind, session_id })
    }

    /// The session the event belongs to, if any.
    pub(super) fn session_id(&self) -> Option<&str> {
        match self {
            Event::Connected | Event::Heartbeat => None,
            Event::MessageUpdated(info) => Some(&info.session_id),
            Event::PartUpdated(part) => Some(&part.session_id),
            Event::PartDelta { session_id, .. }
            | Event::Status { session_id, .. }
            | Event::Idle { session_id }
            | Event::Compacted { session_id }
            | Event::Asked { session_id, .. } => Some(session_id),
            Event::SessionError { session_id, .. } | Event::Other { session_id, .. } => {
                session_id.as_deref()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_events_and_fields_are_tolerated() {
        let event = Event::parse(
            r#"{"id":"evt_1","type":"brand.new","properties":{"sessionID":"ses_1","x":1}}"#,
        )
        .unwrap();
        assert_eq!(
            event,
            Event::Other {
                kind: "brand.new".into(),
                session_id: Some("ses_1".into())
            }
        );
        let event = Event::parse(r#"{"type":"message.updated","properties":{"info":{"id":"msg_1","role":"assistant","sessionID":"ses_1","newField":{"a":1},"time":{"created":1,"completed":2},"finish":"stop"}}}"#).unwrap();
        let Event::MessageUpdated(info) = event else {
            panic!("not a message")
        };
        assert!(info.is_completed() && info.ends_loop());
        assert!(info.extra.contains_key("newField"));
    }

    #[test]
    fn malformed_payloads_become_other() {
        let event =
            Event::parse(r#"{"type":"message.updated","properties":{"info":"nonsense"}}"#).unwrap();
        assert_eq!(
            event,
            Event::Other {
                kind: "message.updated".into(),
                session_id: None
            }
        );
        assert!(Event::parse("not json").is_err());
    }

    #[test]
    fn session_errors_parse_api_details() {
        let event = Event::parse(r#"{"type":"session.error","properties":{"sessionID":"ses_1","error":{"name":"APIError","data":{"message":"fake 429 error","statusCode":429,"isRetryable":true,"responseHeaders":{}}}}}"#).unwrap();
        let Event::SessionError { session_id, error } = event else {
            panic!("not an error")
        };
        assert_eq!(session_id.as_deref(), Some("ses_1"));
        assert_eq!(error.data.status_code, Some(429));
        assert_eq!(error.text(), "fake 429 error");
        assert!(!error.is_abort());
    }
}
