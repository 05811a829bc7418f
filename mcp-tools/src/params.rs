//! Tool parameters. The JSON schemas that `tools/list` shows are generated from these structs;
//! the doc comments become the parameter descriptions the model reads.
//!
//! Deserialization is deliberately tolerant where models are sloppy (a number sent as a string,
//! a card sent as a JSON string, an empty string for an omitted optional field): the tool
//! validates and explains instead of failing on shape alone.

use rmcp::schemars::{JsonSchema, Schema};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

/// Parameters of `send_message`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "rmcp::schemars", transform = tidy_schema)]
pub struct SendMessageParams {
    /// The message text (Markdown is fine). Must not be empty.
    pub text: String,
    /// Name of a destination to send to instead of the current conversation (the names appear as `from="..."` in incoming messages). Omit to reply where the current messages came from.
    #[serde(default)]
    pub to: Option<String>,
    /// Advanced: platform kind (e.g. `slack`, `discord`) to send to explicitly. Usually omitted.
    #[serde(default)]
    pub channel: Option<String>,
    /// Advanced: platform channel/chat id to send to explicitly. Usually omitted.
    #[serde(default)]
    pub platform_id: Option<String>,
    /// Advanced: thread id within the channel. Usually omitted.
    #[serde(default)]
    pub thread_id: Option<String>,
}

/// Parameters of `send_file`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "rmcp::schemars", transform = tidy_schema)]
pub struct SendFileParams {
    /// Path of the file to send: relative to your working folder `/workspace/agent`, or an absolute path inside `/workspace/agent`, `/workspace/extra` or `/workspace/downloads`.
    pub path: String,
    /// Optional caption sent with the file.
    #[serde(default)]
    pub text: Option<String>,
    /// Name the recipient sees (defaults to the file's own name). A plain name: no `/`, no `..`.
    #[serde(default)]
    pub filename: Option<String>,
    /// Destination name to send to instead of the current conversation.
    #[serde(default)]
    pub to: Option<String>,
}

/// Parameters of `send_card`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "rmcp::schemars", transform = tidy_schema)]
pub struct SendCardParams {
    /// The card as a JSON object in the chat platform's card format (Chat SDK card: title, sections, buttons, ...).
    #[schemars(with = "Map<String, Value>")]
    pub card: Value,
    /// Plain text shown where cards cannot be displayed.
    #[serde(default)]
    pub fallback_text: Option<String>,
    /// Destination name to send to instead of the current conversation.
    #[serde(default)]
    pub to: Option<String>,
}

/// One choice offered by `ask_user_question`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "rmcp::schemars", inline)]
pub struct QuestionOption {
    /// Button text.
    pub label: String,
    /// Text shown once this option is chosen (defaults to the label).
    #[serde(default)]
    pub selected_label: Option<String>,
    /// Value returned to you when this option is chosen (defaults to the label).
    #[serde(default)]
    pub value: Option<String>,
}

/// Parameters of `ask_user_question`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "rmcp::schemars", transform = tidy_schema)]
pub struct AskUserQuestionParams {
    /// The question to ask.
    pub question: String,
    /// The choices, as plain strings (`["Yes", "No"]`) or objects `{"label", "selectedLabel"?, "value"?}`. At least one.
    #[schemars(with = "Vec<QuestionOption>")]
    pub options: Value,
    /// Short title shown above the question.
    #[serde(default)]
    pub title: Option<String>,
    /// Seconds to wait for the answer (default 300, capped by the server's maximum).
    #[serde(default, deserialize_with = "lenient_f64")]
    #[schemars(with = "Option<f64>")]
    pub timeout: Option<f64>,
}

/// Parameters of `edit_message`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "rmcp::schemars", transform = tidy_schema)]
pub struct EditMessageParams {
    /// The message number (seq) of one of YOUR earlier messages, as returned by send_message.
    #[serde(deserialize_with = "lenient_i64")]
    #[schemars(with = "i64")]
    pub message_id: i64,
    /// The new text.
    pub text: String,
}

/// Parameters of `add_reaction`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "rmcp::schemars", transform = tidy_schema)]
pub struct AddReactionParams {
    /// The message number (seq): the `id` of an incoming message, or one returned by send_message.
    #[serde(deserialize_with = "lenient_i64")]
    #[schemars(with = "i64")]
    pub message_id: i64,
    /// The emoji, as the character (👍) or its name (`thumbsup`).
    pub emoji: String,
}

/// Parameters of `send_to_agent`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "rmcp::schemars", transform = tidy_schema)]
pub struct SendToAgentParams {
    /// Id of the agent group to message (or the name of an agent destination).
    pub agent_group_id: String,
    /// The message text.
    pub text: String,
    /// A specific session of that agent group, if you know one. Usually omitted.
    #[serde(default)]
    pub session_id: Option<String>,
}

/// Parameters of `schedule_task`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "rmcp::schemars", transform = tidy_schema)]
pub struct ScheduleTaskParams {
    /// What you should do when the task runs; you receive it as instructions then.
    pub prompt: String,
    /// When it runs (first): ISO 8601 local time without offset, e.g. `2026-11-23T09:00` (read in the server's time zone), or with an offset, e.g. `2026-11-23T14:00:00Z`. May be omitted for a recurring task: it then first runs at the next cron time.
    #[serde(default)]
    pub process_after: Option<String>,
    /// For a repeating task: a standard 5-field cron expression (minute hour day-of-month month day-of-week, Sunday = 0) in the server's time zone, e.g. `0 9 * * 1-5` for 9:00 on weekdays.
    #[serde(default)]
    pub recurrence: Option<String>,
    /// Optional bash script run before waking you; its last output line must be JSON `{"wakeAgent": true|false, "data"?: ...}`.
    #[serde(default)]
    pub script: Option<String>,
}

/// Parameters of `list_tasks`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "rmcp::schemars", transform = tidy_schema)]
pub struct ListTasksParams {
    /// Only tasks in this state: `scheduled`, `paused` or `running`. Omit for all.
    #[serde(default)]
    pub status: Option<String>,
}

/// Parameters naming one task.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "rmcp::schemars", transform = tidy_schema)]
pub struct TaskIdParams {
    /// The task id, as returned by schedule_task or shown by list_tasks.
    pub task_id: String,
}

/// Parameters of `update_task`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "rmcp::schemars", transform = tidy_schema)]
pub struct UpdateTaskParams {
    /// The task id, as returned by schedule_task or shown by list_tasks.
    pub task_id: String,
    /// New instructions.
    #[serde(default)]
    pub prompt: Option<String>,
    /// New script; an empty string removes the script.
    #[serde(default)]
    pub script: Option<String>,
    /// New time of the next run (same formats as schedule_task).
    #[serde(default)]
    pub process_after: Option<String>,
    /// New 5-field cron expression; an empty string makes the task run once only.
    #[serde(default)]
    pub recurrence: Option<String>,
}

/// Parameters of `register_agent_group`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(crate = "rmcp::schemars", transform = tidy_schema)]
pub struct RegisterAgentGroupParams {
    /// Display name of the new agent group.
    pub name: String,
    /// Folder name for the group's files: letters, digits, `.`, `_`, `-`.
    pub folder: String,
    /// Platform channel/chat id the group serves.
    pub platform_id: String,
    /// Platform kind, e.g. `slack`, `discord`, `telegram`.
    pub channel_type: String,
    /// When the agent responds (e.g. a mention pattern); passed to the host as given.
    #[serde(default)]
    pub trigger_rules: Option<Value>,
    /// How sessions are kept, e.g. `shared` or `per-thread`; passed to the host as given.
    #[serde(default)]
    pub session_mode: Option<String>,
}

/// Accepts an integer, or a string holding one (`"7"`, `"#7"`).
fn lenient_i64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    use serde::de::Error;
    match Value::deserialize(deserializer)? {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
            .ok_or_else(|| D::Error::custom(format!("expected a whole message number, got {n}"))),
        Value::String(s) => s
            .trim()
            .trim_start_matches('#')
            .parse()
            .map_err(|_| D::Error::custom(format!("expected a message number, got {s:?}"))),
        other => Err(D::Error::custom(format!(
            "expected a message number, got {other}"
        ))),
    }
}

/// Accepts a number, a string holding one, or null.
fn lenient_f64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<f64>, D::Error> {
    use serde::de::Error;
    match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => s
            .trim()
            .trim_end_matches('s')
            .parse()
            .map(Some)
            .map_err(|_| D::Error::custom(format!("expected a number of seconds, got {s:?}"))),
        Some(other) => Err(D::Error::custom(format!(
            "expected a number of seconds, got {other}"
        ))),
    }
}

/// `None` for a missing, empty or blank string; the trimmed text otherwise.
pub fn present(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// Makes a generated schema plain for every client: optional fields are typed by their value
/// (`"string"`, not `["string", "null"]`) without `"default": null`, and number formats are
/// dropped. Optional fields are still optional (absent from `required`).
fn tidy_schema(schema: &mut Schema) {
    if let Some(object) = schema.as_object_mut() {
        tidy_object(object);
    }
}

fn tidy_object(object: &mut Map<String, Value>) {
    if let Some(Value::Array(types)) = object.get("type") {
        let kept: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        if kept.len() == 1 {
            object.insert("type".into(), kept[0].clone());
        }
    }
    if object.get("default") == Some(&Value::Null) {
        object.remove("default");
    }
    if matches!(
        object.get("format").and_then(Value::as_str),
        Some("double" | "int64" | "uint" | "float")
    ) {
        object.remove("format");
    }
    for value in object.values_mut() {
        match value {
            Value::Object(child) => tidy_object(child),
            Value::Array(items) => {
                for item in items {
                    if let Value::Object(child) = item {
                        tidy_object(child);
                    }
                }
            }
            _ => {}
        }
    }
}
