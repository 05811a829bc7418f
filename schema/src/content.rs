//! Content shapes of SPEC §4: parsing inbound JSON tolerantly, building outbound JSON.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::rows::InKind;

/// An attachment of a chat message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// `image`, `file`, ...
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// File name as sent.
    #[serde(default)]
    pub name: Option<String>,
    /// Remote location.
    #[serde(default)]
    pub url: Option<String>,
    /// Path relative to the workspace root.
    #[serde(default)]
    pub local_path: Option<String>,
    /// Base64 body.
    #[serde(default)]
    pub data: Option<String>,
    /// MIME type.
    #[serde(default)]
    pub mime_type: Option<String>,
}

/// A quoted message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplyTo {
    /// Id (seq or platform id) of the quoted message.
    #[serde(default, deserialize_with = "string_or_number")]
    pub id: Option<String>,
    /// Who wrote it.
    #[serde(default)]
    pub sender: Option<String>,
    /// What it said.
    #[serde(default)]
    pub text: Option<String>,
}

/// `chat` content.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatContent {
    /// Display name.
    #[serde(default)]
    pub sender: Option<String>,
    /// Platform user id.
    #[serde(default, deserialize_with = "string_or_number")]
    pub sender_id: Option<String>,
    /// Message text.
    #[serde(default)]
    pub text: String,
    /// Attachments.
    #[serde(default)]
    pub attachments: Vec<Attachment>,
    /// Sent by the bot itself.
    #[serde(default)]
    pub is_from_me: bool,
    /// Quoted message.
    #[serde(default)]
    pub reply_to: Option<ReplyTo>,
    /// Set when the chat row answers a question.
    #[serde(default)]
    pub question_id: Option<String>,
    /// The chosen option of an answer.
    #[serde(default)]
    pub selected_option: Option<Value>,
}

/// Author of a Chat SDK message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatSdkAuthor {
    /// User id.
    #[serde(default, deserialize_with = "string_or_number")]
    pub user_id: Option<String>,
    /// Handle.
    #[serde(default)]
    pub user_name: Option<String>,
    /// Full name.
    #[serde(default)]
    pub full_name: Option<String>,
    /// A bot.
    #[serde(default)]
    pub is_bot: bool,
    /// The agent itself.
    #[serde(default)]
    pub is_me: bool,
}

/// `chat-sdk` content: a serialized Chat SDK message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatSdkContent {
    /// Platform message id.
    #[serde(default, deserialize_with = "string_or_number")]
    pub id: Option<String>,
    /// Thread id.
    #[serde(default)]
    pub thread_id: Option<String>,
    /// Text.
    #[serde(default)]
    pub text: String,
    /// Author.
    #[serde(default)]
    pub author: ChatSdkAuthor,
    /// Metadata (`dateSent`, `edited`).
    #[serde(default)]
    pub metadata: Value,
    /// Attachments.
    #[serde(default)]
    pub attachments: Vec<Attachment>,
    /// Whether the agent was mentioned.
    #[serde(default)]
    pub is_mention: bool,
}

/// `task` content.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskContent {
    /// Instructions for the agent.
    #[serde(default)]
    pub prompt: String,
    /// Optional pre-agent bash script.
    #[serde(default)]
    pub script: Option<String>,
}

/// `webhook` content.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WebhookContent {
    /// e.g. `github`.
    #[serde(default)]
    pub source: Option<String>,
    /// e.g. `pull_request`.
    #[serde(default)]
    pub event: Option<String>,
    /// The delivery body.
    #[serde(default)]
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

/// Inbound content, parsed by kind. Parsing never fails: bad JSON becomes `Unparsable`.
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
    /// Content that is not JSON (or not the shape of its kind): treated as `{"text": raw}`.
    Unparsable {
        /// The raw content column.
        raw: String,
        /// Why it could not be parsed.
        reason: String,
    },
}

impl InboundContent {
    /// Parses `content` of a row of `kind`.
    pub fn parse(kind: &InKind, content: &str) -> Self {
        let value: Value = match serde_json::from_str(content) {
            Ok(value) => value,
            Err(err) => {
                return Self::Unparsable {
                    raw: content.to_owned(),
                    reason: format!("content is not JSON: {err}"),
                }
            }
        };
        let shaped = |err: serde_json::Error| Self::Unparsable {
            raw: content.to_owned(),
            reason: format!("content does not fit kind {}: {err}", kind.as_str()),
        };
        match kind {
            InKind::Chat => serde_json::from_value(value)
                .map(Self::Chat)
                .unwrap_or_else(shaped),
            InKind::ChatSdk => serde_json::from_value(value)
                .map(Self::ChatSdk)
                .unwrap_or_else(shaped),
            InKind::Task => serde_json::from_value(value)
                .map(Self::Task)
                .unwrap_or_else(shaped),
            InKind::Webhook => serde_json::from_value(value)
                .map(Self::Webhook)
                .unwrap_or_else(shaped),
            InKind::System => Self::System(value),
            InKind::Other(kind) => Self::Unknown {
                kind: kind.clone(),
                value,
            },
        }
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

/// Builders for `messages_out` content (SPEC §4).
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

    /// A host action (kind `system`).
    pub fn system_action(action: &str, payload: Value) -> Value {
        json!({ "action": action, "payload": payload })
    }
}

/// Accepts a string or a number where platforms disagree (user ids, message ids).
fn string_or_number<'de, D>(deserializer: D) -> Result<Option<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text),
        Some(other) => Some(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unparsable_is_kept_raw() {
        let parsed = InboundContent::parse(&InKind::Chat, "{not json");
        assert!(matches!(parsed, InboundContent::Unparsable { ref raw, .. } if raw == "{not json"));
        let wrong_shape = InboundContent::parse(&InKind::Chat, r#"{"text": 5}"#);
        assert!(
            matches!(wrong_shape, InboundContent::Unparsable { .. }),
            "{wrong_shape:?}"
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
}
