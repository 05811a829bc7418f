//! Content shapes (docs/contract/content.md): parsing inbound JSON tolerantly, building outbound
//! JSON.
//!
//! Inbound content is read field by field ([`Fields`]): a field of an unexpected type (a numeric
//! `name`, an object where text belongs) is coerced or ignored and reported as a
//! [`FieldProblem`]; it never makes the rest of the message unreadable. Only content that is not
//! JSON, or not a JSON object where its kind needs one, is [`InboundContent::Unparsable`].

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Map, Value};

use crate::rows::InKind;

/// An attachment of a chat message.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// `image`, `file`, `photo`, `voice`, ...
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// File name as sent.
    pub name: Option<String>,
    /// Remote location.
    pub url: Option<String>,
    /// Path relative to the workspace root.
    pub local_path: Option<String>,
    /// Base64 body.
    pub data: Option<String>,
    /// MIME type.
    pub mime_type: Option<String>,
    /// Size in bytes as the sender declared it; informational only (limits apply to the bytes
    /// actually received).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// A quoted message.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ReplyTo {
    /// Id (seq or platform id) of the quoted message.
    pub id: Option<String>,
    /// Who wrote it.
    pub sender: Option<String>,
    /// What it said.
    pub text: Option<String>,
}

/// `chat` content.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatContent {
    /// Display name.
    pub sender: Option<String>,
    /// Platform user id.
    pub sender_id: Option<String>,
    /// Message text.
    pub text: String,
    /// Attachments.
    pub attachments: Vec<Attachment>,
    /// Sent by the bot itself.
    pub is_from_me: bool,
    /// Quoted message.
    pub reply_to: Option<ReplyTo>,
    /// Set when the chat row answers a question.
    pub question_id: Option<String>,
    /// The chosen option of an answer.
    pub selected_option: Option<Value>,
}

/// Author of a Chat SDK message.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatSdkAuthor {
    /// User id.
    pub user_id: Option<String>,
    /// Handle.
    pub user_name: Option<String>,
    /// Full name.
    pub full_name: Option<String>,
    /// A bot.
    pub is_bot: bool,
    /// The agent itself.
    pub is_me: bool,
}

/// `chat-sdk` content: a serialized Chat SDK message.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatSdkContent {
    /// Platform message id.
    pub id: Option<String>,
    /// Thread id.
    pub thread_id: Option<String>,
    /// Text.
    pub text: String,
    /// Author.
    pub author: ChatSdkAuthor,
    /// Metadata (`dateSent`, `edited`).
    pub metadata: Value,
    /// Attachments.
    pub attachments: Vec<Attachment>,
    /// Whether the agent was mentioned.
    pub is_mention: bool,
}

/// `task` content.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TaskContent {
    /// Instructions for the agent.
    pub prompt: String,
    /// Optional pre-agent bash script.
    pub script: Option<String>,
}

/// `webhook` content.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WebhookContent {
    /// e.g. `github`.
    pub source: Option<String>,
    /// e.g. `pull_request`.
    pub event: Option<String>,
    /// The delivery body.
    pub payload: Value,
}

/// An answer to an `ask_user_question` row, from a `system` or a `chat` row.
#[derive(Debug, Clone, PartialEq)]
pub struct QuestionAnswer {
    /// The question answered.
    pub question_id: String,
    /// The chosen value.
    pub selected_option: Value,
    /// Who answered.
    pub user_id: Option<String>,
}

/// Inbound content, parsed by kind. Parsing never fails: a field of an unexpected type is
/// coerced or ignored (see [`InboundContent::parse_with_problems`]), and content that cannot be
/// read at all becomes `Unparsable`.
#[derive(Debug, Clone, PartialEq)]
pub enum InboundContent {
    /// A chat message.
    Chat(ChatContent),
    /// A Chat SDK message.
    ChatSdk(ChatSdkContent),
    /// A task.
    Task(TaskContent),
    /// A webhook.
    Webhook(WebhookContent),
    /// A system row (action result or question answer), kept as JSON.
    System(Value),
    /// A kind this version does not know; its JSON is kept.
    Unknown {
        /// The kind column.
        kind: String,
        /// The content JSON.
        value: Value,
    },
    /// Content that is not JSON, or not a JSON object for a kind whose content is one: treated as
    /// `{"text": raw}`.
    Unparsable {
        /// The raw content column.
        raw: String,
        /// Why it could not be parsed.
        reason: String,
    },
}

impl InboundContent {
    /// Parses `content` of a row of `kind`; fields of unexpected types are coerced or ignored
    /// silently (use [`InboundContent::parse_with_problems`] to log them).
    pub fn parse(kind: &InKind, content: &str) -> Self {
        Self::parse_with_problems(kind, content).0
    }

    /// Parses `content` of a row of `kind`, also returning the fields that had an unexpected type
    /// and were coerced or ignored (at most 20, then a count), for the caller to log with the
    /// row's id. The rest of the content stands either way.
    pub fn parse_with_problems(kind: &InKind, content: &str) -> (Self, Vec<FieldProblem>) {
        let value: Value = match serde_json::from_str(content) {
            Ok(value) => value,
            Err(err) => {
                let unparsable = Self::Unparsable {
                    raw: content.to_owned(),
                    reason: format!("content is not JSON: {err}"),
                };
                return (unparsable, Vec::new());
            }
        };
        let mut problems = Problems::default();
        let read = match kind {
            InKind::Chat => read_object(&value, &mut problems).map(Self::Chat),
            InKind::ChatSdk => read_object(&value, &mut problems).map(Self::ChatSdk),
            InKind::Task => read_object(&value, &mut problems).map(Self::Task),
            InKind::Webhook => read_object(&value, &mut problems).map(Self::Webhook),
            InKind::System => Ok(Self::System(value)),
            InKind::Other(kind) => Ok(Self::Unknown {
                kind: kind.clone(),
                value,
            }),
        };
        let parsed = read.unwrap_or_else(|err| Self::Unparsable {
            raw: content.to_owned(),
            reason: format!("content does not fit kind {}: {err}", kind.as_str()),
        });
        (parsed, problems.finish())
    }

    /// The answer this row carries, if it is one (`system` `question_response`, or a chat row with
    /// `questionId` and `selectedOption`).
    pub fn question_answer(&self) -> Option<QuestionAnswer> {
        match self {
            Self::System(value) => {
                if value.get("type").and_then(Value::as_str) != Some("question_response") {
                    return None;
                }
                Some(QuestionAnswer {
                    question_id: value.get("questionId")?.as_str()?.to_owned(),
                    selected_option: value.get("selectedOption").cloned().unwrap_or(Value::Null),
                    user_id: value
                        .get("userId")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                })
            }
            Self::Chat(chat) => Some(QuestionAnswer {
                question_id: chat.question_id.clone()?,
                selected_option: chat.selected_option.clone()?,
                user_id: chat.sender_id.clone(),
            }),
            _ => None,
        }
    }

    /// The plain text a person typed, for chat kinds (used for command detection).
    pub fn chat_text(&self) -> Option<&str> {
        match self {
            Self::Chat(chat) => Some(&chat.text),
            Self::ChatSdk(sdk) => Some(&sdk.text),
            _ => None,
        }
    }

    /// The sender id, for chat kinds.
    pub fn sender_id(&self) -> Option<&str> {
        match self {
            Self::Chat(chat) => chat.sender_id.as_deref(),
            Self::ChatSdk(sdk) => sdk.author.user_id.as_deref(),
            _ => None,
        }
    }
}

/// Builders for `messages_out` content (docs/contract/content.md#messages_out).
pub mod out {
    use super::*;

    /// A chat reply or `send_message`: `{"text"}`.
    pub fn chat_text(text: &str) -> Value {
        json!({ "text": text })
    }

    /// `send_file`: `{"text","files":[name]}`.
    pub fn chat_files(text: &str, files: &[String]) -> Value {
        json!({ "text": text, "files": files })
    }

    /// An edit of an earlier message.
    pub fn edit(message_id: &str, text: &str) -> Value {
        json!({ "operation": "edit", "messageId": message_id, "text": text })
    }

    /// A reaction to a message.
    pub fn reaction(message_id: &str, emoji: &str) -> Value {
        json!({ "operation": "reaction", "messageId": message_id, "emoji": emoji })
    }

    /// A card (kind `chat-sdk`).
    pub fn card(card: &Value, fallback_text: Option<&str>) -> Value {
        json!({ "operation": "card", "card": card, "fallbackText": fallback_text })
    }

    /// A question (kind `chat-sdk`).
    pub fn ask_question(
        question_id: &str,
        title: &str,
        question: &str,
        options: &[Value],
    ) -> Value {
        json!({
            "operation": "ask_question",
            "questionId": question_id,
            "title": title,
            "question": question,
            "options": options,
        })
    }

    /// One option of an [`ask_question`] row: what the user sees (`label`), what the chat shows
    /// once chosen (`selected_label`) and what the answer carries (`value`).
    pub fn question_option(label: &str, selected_label: &str, value: &str) -> Value {
        json!({ "label": label, "selectedLabel": selected_label, "value": value })
    }

    /// A host action (kind `system`).
    pub fn system_action(action: &str, payload: Value) -> Value {
        json!({ "action": action, "payload": payload })
    }
}

/// A field of inbound content whose value had an unexpected type. The field was coerced (a number
/// where text belongs is read as its digits) or ignored; the rest of the content stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldProblem {
    /// Where the field is, e.g. `attachments[0].name`.
    pub field: String,
    /// What it held and what was done, e.g. `a number, read as text`.
    pub issue: String,
}

impl fmt::Display for FieldProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.issue)
    }
}

/// Most problems listed for one row; a row with thousands of bad fields must not become
/// thousands of log lines.
const MAX_PROBLEMS: usize = 20;

/// The problems found while reading one row.
#[derive(Default)]
struct Problems {
    list: Vec<FieldProblem>,
    /// Problems beyond [`MAX_PROBLEMS`], only counted.
    more: usize,
}

impl Problems {
    fn note(&mut self, field: String, found: &Value, action: &str) {
        if self.list.len() < MAX_PROBLEMS {
            self.list.push(FieldProblem {
                field,
                issue: format!("{}, {action}", json_type(found)),
            });
        } else {
            self.more += 1;
        }
    }

    fn finish(mut self) -> Vec<FieldProblem> {
        if self.more > 0 {
            self.list.push(FieldProblem {
                field: "…".to_owned(),
                issue: format!("{} more fields coerced or ignored", self.more),
            });
        }
        self.list
    }
}

/// What a JSON value is ("a number", "an object", ...), for error and problem texts: never the
/// value itself, which may be 300 KB of base64 and would end up in logs.
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Content JSON that is not an object where its kind needs one.
#[derive(Debug)]
struct NotAnObject(&'static str);

impl fmt::Display for NotAnObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "expected a JSON object, found {}", self.0)
    }
}

/// A content shape read field by field from a JSON object.
trait ReadLeniently: Sized {
    fn read(fields: &mut Fields<'_, '_>) -> Self;
}

fn read_object<T: ReadLeniently>(value: &Value, problems: &mut Problems) -> Result<T, NotAnObject> {
    match value {
        Value::Object(map) => Ok(T::read(&mut Fields {
            map,
            path: String::new(),
            problems,
        })),
        other => Err(NotAnObject(json_type(other))),
    }
}

/// `Deserialize` through [`ReadLeniently`], so `serde_json::from_str::<TaskContent>` is as
/// tolerant as [`InboundContent::parse`]: only a non-object fails.
macro_rules! deserialize_leniently {
    ($($shape:ty),* $(,)?) => {$(
        impl<'de> Deserialize<'de> for $shape {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let value = Value::deserialize(deserializer)?;
                read_object(&value, &mut Problems::default()).map_err(serde::de::Error::custom)
            }
        }
    )*};
}

deserialize_leniently!(
    Attachment,
    ReplyTo,
    ChatContent,
    ChatSdkAuthor,
    ChatSdkContent,
    TaskContent,
    WebhookContent,
);

impl ReadLeniently for Attachment {
    fn read(f: &mut Fields<'_, '_>) -> Self {
        Self {
            kind: f.string("type"),
            // A number is a plausible file name (`12345`); a number as a type, URL, path, body
            // or MIME type is nothing, so those take strings only.
            name: f.text("name"),
            url: f.string("url"),
            local_path: f.string("localPath"),
            data: f.string("data"),
            mime_type: f.string("mimeType"),
            size: f.count("size"),
        }
    }
}

impl ReadLeniently for ReplyTo {
    fn read(f: &mut Fields<'_, '_>) -> Self {
        Self {
            id: f.id("id"),
            sender: f.text("sender"),
            text: f.text("text"),
        }
    }
}

impl ReadLeniently for ChatContent {
    fn read(f: &mut Fields<'_, '_>) -> Self {
        Self {
            sender: f.text("sender"),
            sender_id: f.id("senderId"),
            text: f.text("text").unwrap_or_default(),
            attachments: f.list("attachments"),
            is_from_me: f.flag("isFromMe"),
            reply_to: f.object("replyTo"),
            question_id: f.string("questionId"),
            selected_option: f.any("selectedOption"),
        }
    }
}

impl ReadLeniently for ChatSdkAuthor {
    fn read(f: &mut Fields<'_, '_>) -> Self {
        Self {
            user_id: f.id("userId"),
            user_name: f.text("userName"),
            full_name: f.text("fullName"),
            is_bot: f.flag("isBot"),
            is_me: f.flag("isMe"),
        }
    }
}

impl ReadLeniently for ChatSdkContent {
    fn read(f: &mut Fields<'_, '_>) -> Self {
        Self {
            id: f.id("id"),
            thread_id: f.id("threadId"),
            text: f.text("text").unwrap_or_default(),
            author: f.object("author").unwrap_or_default(),
            metadata: f.any("metadata").unwrap_or_default(),
            attachments: f.list("attachments"),
            is_mention: f.flag("isMention"),
        }
    }
}

impl ReadLeniently for TaskContent {
    fn read(f: &mut Fields<'_, '_>) -> Self {
        Self {
            prompt: f.text("prompt").unwrap_or_default(),
            // Strings only: a coerced number would be run as a command.
            script: f.string("script"),
        }
    }
}

impl ReadLeniently for WebhookContent {
    fn read(f: &mut Fields<'_, '_>) -> Self {
        Self {
            source: f.text("source"),
            event: f.text("event"),
            payload: f.any("payload").unwrap_or_default(),
        }
    }
}

/// Reads one JSON object's fields. A field of an unexpected type is coerced or ignored and
/// noted; it never fails the object. `null` counts as absent.
struct Fields<'a, 'p> {
    map: &'a Map<String, Value>,
    /// Where this object is inside the content: `""` at the top, `attachments[0]`, `author`.
    path: String,
    problems: &'p mut Problems,
}

impl<'a> Fields<'a, '_> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|value| !value.is_null())
    }

    fn path_of(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn note(&mut self, key: &str, found: &Value, action: &str) {
        let field = self.path_of(key);
        self.problems.note(field, found, action);
    }

    /// Text: a string, or a number or boolean as its JSON text.
    fn text(&mut self, key: &str) -> Option<String> {
        match self.get(key)? {
            Value::String(text) => Some(text.clone()),
            scalar @ (Value::Number(_) | Value::Bool(_)) => {
                self.note(key, scalar, "read as text");
                Some(scalar.to_string())
            }
            other => {
                self.note(key, other, "ignored");
                None
            }
        }
    }

    /// An id: a string or a number, both normal (platforms disagree), so not noted.
    fn id(&mut self, key: &str) -> Option<String> {
        match self.get(key)? {
            Value::String(id) => Some(id.clone()),
            Value::Number(id) => Some(id.to_string()),
            other => {
                self.note(key, other, "ignored");
                None
            }
        }
    }

    /// A string only; anything else is ignored.
    fn string(&mut self, key: &str) -> Option<String> {
        match self.get(key)? {
            Value::String(text) => Some(text.clone()),
            other => {
                self.note(key, other, "ignored");
                None
            }
        }
    }

    /// A boolean; `"true"`/`"false"` (any case) and `1`/`0` are read as one, anything else is
    /// `false`.
    fn flag(&mut self, key: &str) -> bool {
        let value = match self.get(key) {
            None => return false,
            Some(Value::Bool(flag)) => return *flag,
            Some(value) => value,
        };
        let read = match value {
            Value::String(text) => match text.trim().to_ascii_lowercase().as_str() {
                "true" => Some(true),
                "false" => Some(false),
                _ => None,
            },
            Value::Number(number) => match number.as_u64() {
                Some(0) => Some(false),
                Some(1) => Some(true),
                _ => None,
            },
            _ => None,
        };
        match read {
            Some(flag) => {
                self.note(
                    key,
                    value,
                    if flag {
                        "read as true"
                    } else {
                        "read as false"
                    },
                );
                flag
            }
            None => {
                self.note(key, value, "ignored");
                false
            }
        }
    }

    /// A whole number ≥ 0: a JSON number, or a string of digits.
    fn count(&mut self, key: &str) -> Option<u64> {
        let value = self.get(key)?;
        if let Some(count) = value.as_u64() {
            return Some(count);
        }
        let read = value.as_str().and_then(|text| text.trim().parse().ok());
        let action = if read.is_some() {
            "read as a number"
        } else {
            "ignored"
        };
        self.note(key, value, action);
        read
    }

    /// Any JSON value.
    fn any(&self, key: &str) -> Option<Value> {
        self.get(key).cloned()
    }

    /// A nested object; anything else is ignored.
    fn object<T: ReadLeniently>(&mut self, key: &str) -> Option<T> {
        match self.get(key)? {
            Value::Object(map) => Some(T::read(&mut Fields {
                map,
                path: self.path_of(key),
                problems: self.problems,
            })),
            other => {
                self.note(key, other, "ignored");
                None
            }
        }
    }

    /// A list of objects: an item that is not an object is left out; a single object is read as
    /// a list of one.
    fn list<T: ReadLeniently>(&mut self, key: &str) -> Vec<T> {
        let path = self.path_of(key);
        match self.get(key) {
            None => Vec::new(),
            Some(Value::Array(items)) => {
                let mut read = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let path = format!("{path}[{i}]");
                    match item {
                        Value::Object(map) => read.push(T::read(&mut Fields {
                            map,
                            path,
                            problems: self.problems,
                        })),
                        other => self.problems.note(path, other, "ignored"),
                    }
                }
                read
            }
            Some(found @ Value::Object(map)) => {
                self.problems
                    .note(path.clone(), found, "read as a list of one");
                vec![T::read(&mut Fields {
                    map,
                    path,
                    problems: self.problems,
                })]
            }
            Some(other) => {
                self.problems.note(path, other, "ignored");
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unparsable_is_kept_raw() {
        let parsed = InboundContent::parse(&InKind::Chat, "{not json");
        assert!(matches!(parsed, InboundContent::Unparsable { ref raw, .. } if raw == "{not json"));
        for not_an_object in [r#"["text", 5]"#, r#""hello""#, "5", "null"] {
            let parsed = InboundContent::parse(&InKind::Chat, not_an_object);
            assert!(
                matches!(parsed, InboundContent::Unparsable { ref raw, .. } if raw == not_an_object),
                "{parsed:?}"
            );
        }
        let (parsed, _) = InboundContent::parse_with_problems(&InKind::Task, "[1]");
        let InboundContent::Unparsable { reason, .. } = parsed else {
            panic!("{parsed:?}");
        };
        assert_eq!(
            reason,
            "content does not fit kind task: expected a JSON object, found an array"
        );
    }

    #[test]
    fn answers_from_system_and_chat() {
        let system = InboundContent::parse(
            &InKind::System,
            r#"{"type":"question_response","questionId":"q1","selectedOption":"yes"}"#,
        );
        assert_eq!(
            system.question_answer().map(|a| a.question_id),
            Some("q1".to_owned())
        );
        let chat = InboundContent::parse(
            &InKind::Chat,
            r#"{"text":"Yes","senderId":42,"questionId":"q2","selectedOption":"y"}"#,
        );
        let answer = chat.question_answer();
        assert_eq!(answer.as_ref().map(|a| a.question_id.as_str()), Some("q2"));
        assert_eq!(answer.and_then(|a| a.user_id), Some("42".to_owned()));
        let plain = InboundContent::parse(&InKind::Chat, r#"{"text":"hi","questionId":"q3"}"#);
        assert_eq!(plain.question_answer(), None);
    }

    /// Parses chat content that must come out as a chat message.
    fn chat(content: Value) -> ChatContent {
        match InboundContent::parse(&InKind::Chat, &content.to_string()) {
            InboundContent::Chat(chat) => chat,
            other => panic!("not read as a chat message: {other:?}"),
        }
    }

    #[test]
    fn numeric_attachment_name_is_read_as_text() {
        let chat = chat(json!({"sender": "Ann", "senderId": 7, "text": "the scan",
            "attachments": [{"type": "file", "name": 12345, "data": "aGk="}]}));
        assert_eq!(chat.sender.as_deref(), Some("Ann"));
        assert_eq!(chat.text, "the scan");
        assert_eq!(chat.attachments.len(), 1);
        assert_eq!(chat.attachments[0].name.as_deref(), Some("12345"));
        assert_eq!(chat.attachments[0].data.as_deref(), Some("aGk="));
    }

    #[test]
    fn numeric_mime_type_is_ignored() {
        let chat = chat(json!({"sender": "Ann", "text": "voice note",
            "attachments": [{"type": "voice", "mimeType": 42, "data": "aGk="},
                            {"name": "b.txt", "mimeType": "text/plain", "data": "aGk="}]}));
        assert_eq!(chat.sender.as_deref(), Some("Ann"));
        assert_eq!(chat.text, "voice note");
        assert_eq!(chat.attachments[0].mime_type, None);
        assert_eq!(chat.attachments[0].kind.as_deref(), Some("voice"));
        assert_eq!(chat.attachments[0].data.as_deref(), Some("aGk="));
        assert_eq!(chat.attachments[1].mime_type.as_deref(), Some("text/plain"));
    }

    #[test]
    fn object_valued_fields_are_ignored() {
        let chat = chat(json!({"sender": "Ann", "text": "hi", "isFromMe": {"no": 1},
            "replyTo": "not an object",
            "attachments": [{"name": {"first": "a"}, "url": ["x"], "data": "aGk="}]}));
        assert_eq!(chat.sender.as_deref(), Some("Ann"));
        assert_eq!(chat.text, "hi");
        assert!(!chat.is_from_me);
        assert_eq!(chat.reply_to, None);
        let attachment = &chat.attachments[0];
        assert_eq!((&attachment.name, &attachment.url), (&None, &None));
        assert_eq!(attachment.data.as_deref(), Some("aGk="));
    }

    #[test]
    fn size_as_a_string_is_read_as_a_number() {
        let chat = chat(json!({"sender": "Ann", "text": "hi", "attachments": [
            {"name": "a.txt", "size": "2048", "data": "aGk="},
            {"name": "b.txt", "size": 12},
            {"name": "c.txt", "size": "big"}]}));
        assert_eq!(chat.sender.as_deref(), Some("Ann"));
        assert_eq!(chat.text, "hi");
        let sizes: Vec<Option<u64>> = chat.attachments.iter().map(|a| a.size).collect();
        assert_eq!(sizes, [Some(2048), Some(12), None]);
        assert_eq!(chat.attachments[0].data.as_deref(), Some("aGk="));
    }

    /// Every coerced or ignored field is reported with its path; ids may be numbers silently.
    #[test]
    fn problems_name_each_field() {
        let content = json!({
            "sender": "Ann", "senderId": 7, "text": 5, "isFromMe": "TRUE",
            "replyTo": {"id": 3, "text": ["x"]},
            "attachments": [{"name": 1, "mimeType": 2, "size": "3", "data": {"x": 1}}, "x.png"],
        });
        let (parsed, problems) =
            InboundContent::parse_with_problems(&InKind::Chat, &content.to_string());
        let InboundContent::Chat(chat) = parsed else {
            panic!("{parsed:?}");
        };
        assert_eq!(chat.text, "5");
        assert!(chat.is_from_me);
        assert_eq!(chat.sender_id.as_deref(), Some("7"));
        assert_eq!(chat.attachments.len(), 1);
        let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
        expect_test::expect![[r#"
            [
                "text: a number, read as text",
                "attachments[0].name: a number, read as text",
                "attachments[0].data: an object, ignored",
                "attachments[0].mimeType: a number, ignored",
                "attachments[0].size: a string, read as a number",
                "attachments[1]: a string, ignored",
                "isFromMe: a string, read as true",
                "replyTo.text: an array, ignored",
            ]
        "#]]
        .assert_debug_eq(&problems);
    }

    #[test]
    fn problems_are_capped() {
        let attachments: Vec<Value> = (0..100).map(|_| json!({"name": 1})).collect();
        let content = json!({"text": "hi", "attachments": attachments}).to_string();
        let (_, problems) = InboundContent::parse_with_problems(&InKind::Chat, &content);
        assert_eq!(problems.len(), MAX_PROBLEMS + 1);
        assert_eq!(
            problems.last().map(ToString::to_string).as_deref(),
            Some("…: 80 more fields coerced or ignored")
        );
    }

    #[test]
    fn other_kinds_are_read_field_by_field() {
        let sdk = InboundContent::parse(
            &InKind::ChatSdk,
            &json!({"id": 99, "threadId": 5, "text": "hey", "isMention": 1,
                    "author": {"userId": 1, "fullName": "Jane", "isBot": "no"},
                    "attachments": {"type": "image", "url": "https://x.example/a.png"}})
            .to_string(),
        );
        let InboundContent::ChatSdk(sdk) = sdk else {
            panic!("{sdk:?}");
        };
        assert_eq!(sdk.id.as_deref(), Some("99"));
        assert_eq!(sdk.thread_id.as_deref(), Some("5"));
        assert_eq!(sdk.author.full_name.as_deref(), Some("Jane"));
        assert!(sdk.is_mention && !sdk.author.is_bot);
        assert_eq!(sdk.attachments.len(), 1);
        // `serde_json::from_str` of a shape is just as tolerant.
        let task: TaskContent =
            serde_json::from_str(r#"{"prompt": 5, "script": 7}"#).unwrap_or_default();
        assert_eq!(
            task,
            TaskContent {
                prompt: "5".to_owned(),
                script: None
            }
        );
        let webhook = InboundContent::parse(
            &InKind::Webhook,
            r#"{"source": 1, "event": "push", "payload": [1]}"#,
        );
        assert_eq!(
            webhook,
            InboundContent::Webhook(WebhookContent {
                source: Some("1".to_owned()),
                event: Some("push".to_owned()),
                payload: json!([1]),
            })
        );
    }
}
