//! The prompt formatter (docs/contract/prompt.md): turns the claimed rows of a batch into the text
//! the agent reads.
//!
//! Shape, in order:
//! - `<context timezone="…" />`, always the first line;
//! - the chat-like rows (`chat`, `chat-sdk`, unparsable content): one alone is a bare
//!   `<message>`, two or more are wrapped in `<messages>…</messages>`;
//! - every other row, one element each, in seq order: `<task>`, `<webhook>`, `<system_response>`,
//!   and `<message kind="…">` for a kind this version does not know.
//!
//! Text and attribute values are XML-escaped (`& < > "`, not `'`) so a message can never close
//! its element or forge another one (the escaping is `provider::prompt_xml`'s, which also reads
//! it back for replies and archives). JSON bodies (webhook payloads, script output, system
//! results, unknown kinds) are pretty-printed and escape only `& < >`: that is enough to keep the
//! element closed, and leaving `"` alone keeps them readable as JSON. Texts are never truncated;
//! only unparsable content is, to 4 KiB, after its base64 runs are left out ([`unparsable_text`]):
//! it is a malformed row, not something a person wrote, and may hold a whole attachment.
//!
//! Formatting does no I/O and cannot fail: a missing field drops its attribute, a bad timestamp
//! drops the `time` attribute, content that is not JSON reads as a chat message
//! (docs/contract/content.md#reading-rules).

use std::borrow::Cow;
use std::path::{Component, Path};

use chrono::{Datelike, Timelike};
use chrono_tz::Tz;
use provider::prompt_xml::{escape_body, escape_text, start_tag};
use schema::content::ReplyTo;
use schema::{Attachment, ChatContent, Destination, InboundContent, MessageIn, Routing};
use serde_json::Value;

/// One claimed row of a batch, with what the runner learned about it before formatting.
#[derive(Debug, Clone)]
pub struct PromptRow<'a> {
    /// The row as stored.
    pub row: &'a MessageIn,
    /// Its content, parsed once by the caller.
    pub content: InboundContent,
    /// Its attachments as resolved by the media module, in the content's order.
    pub attachments: Vec<AttachmentNote>,
    /// A task's pre-agent script `data` (docs/contract/prompt.md#task-scripts); `None` (or JSON
    /// `null`) when there is none.
    pub script_output: Option<Value>,
}

/// What the agent is told about one attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachmentNote {
    /// Saved on disk: `[file available at: <path>]`.
    Available {
        /// Absolute path inside the container.
        path: String,
    },
    /// Not on disk: `[attachment unavailable: <name> — <reason>]`, so a failed download is
    /// visible to the agent instead of silently missing.
    Unavailable {
        /// File name as sent.
        name: String,
        /// Why it is not there.
        reason: String,
    },
}

/// What the formatter needs besides the rows.
#[derive(Debug, Clone, Copy)]
pub struct FormatContext<'a> {
    /// Time zone the agent's user lives in (`TZ`); every time is shown in it.
    pub timezone: Tz,
    /// The destinations table, to name where a message came from (`from`).
    pub destinations: &'a [Destination],
}

/// Formats a batch of claimed rows (in seq order) into the prompt of docs/contract/prompt.md.
pub fn format_prompt(rows: &[PromptRow<'_>], ctx: &FormatContext<'_>) -> String {
    let mut chats = Vec::new();
    let mut others = Vec::new();
    for prompt_row in rows {
        match render_row(prompt_row, ctx) {
            Rendered::Chat(text) => chats.push(text),
            Rendered::Other(text) => others.push(text),
        }
    }

    let mut out = String::new();
    out.push_str("<context timezone=\"");
    out.push_str(&escape_text(ctx.timezone.name()));
    out.push_str("\" />");
    match chats.as_slice() {
        [] => {}
        [single] => {
            out.push('\n');
            out.push_str(single);
        }
        many => {
            out.push_str("\n<messages>");
            for chat in many {
                out.push('\n');
                out.push_str(chat);
            }
            out.push_str("\n</messages>");
        }
    }
    for other in &others {
        out.push('\n');
        out.push_str(other);
    }
    out
}

/// Formats a stored timestamp as local time in `tz`, e.g. `Feb 4, 2026, 1:30 PM`; `None` when
/// the timestamp is in no form the DB accepts.
pub fn format_time(ts: &str, tz: Tz) -> Option<String> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let local = schema::time::parse_ts(ts).ok()?.with_timezone(&tz);
    let year = local.year();
    if !(0..=9999).contains(&year) {
        // chrono's own `%Y` for years a stored timestamp rarely has (a sign, more digits).
        return Some(local.format("%b %-d, %Y, %-I:%M %p").to_string());
    }
    // What `%b %-d, %Y, %-I:%M %p` writes, without parsing that format at every message.
    let hour = local.hour();
    let hour12 = match hour % 12 {
        0 => 12,
        h => h,
    };
    Some(format!(
        "{} {}, {year:04}, {hour12}:{:02} {}",
        MONTHS[local.month0() as usize % 12],
        local.day(),
        local.minute(),
        if hour < 12 { "AM" } else { "PM" }
    ))
}

/// Default notes when no media module resolved the attachments: one with a `localPath` is
/// available at `<workspace>/<localPath>` (no I/O: the file is assumed to be there), any other is
/// unavailable with the reason `not downloaded`. A `localPath` that climbs out of the workspace
/// (`..`, or an absolute path elsewhere) is reported unavailable rather than handed to the agent.
pub fn default_attachment_notes(atts: &[Attachment], workspace: &Path) -> Vec<AttachmentNote> {
    atts.iter()
        .map(|att| {
            let Some(local) = att.local_path.as_deref().filter(|p| !p.is_empty()) else {
                return AttachmentNote::Unavailable {
                    name: attachment_name(att),
                    reason: "not downloaded".to_owned(),
                };
            };
            let local = Path::new(local);
            let climbs = local
                .components()
                .any(|c| matches!(c, Component::ParentDir | Component::Prefix(_)));
            let path = if local.is_absolute() {
                local.starts_with(workspace).then(|| local.to_path_buf())
            } else {
                Some(workspace.join(local))
            };
            match path {
                Some(path) if !climbs => AttachmentNote::Available {
                    path: path.to_string_lossy().into_owned(),
                },
                _ => AttachmentNote::Unavailable {
                    name: attachment_name(att),
                    reason: "local path outside the workspace".to_owned(),
                },
            }
        })
        .collect()
}

/// The name shown for an attachment: its own name, else the last segment of where it lives.
fn attachment_name(att: &Attachment) -> String {
    let last_segment = |s: &str| {
        s.rsplit(['/', '\\'])
            .next()
            .filter(|seg| !seg.is_empty())
            .map(str::to_owned)
    };
    att.name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| att.local_path.as_deref().and_then(last_segment))
        .or_else(|| {
            att.url
                .as_deref()
                .map(|u| u.split(['?', '#']).next().unwrap_or(u))
                .and_then(last_segment)
        })
        .unwrap_or_else(|| "attachment".to_owned())
}

/// Most bytes of unparsable content shown: enough to see what the row was (all of it is in the DB
/// and the log line); more would only crowd the prompt.
const MAX_UNPARSABLE_BYTES: usize = 4096;

/// Shortest run of base64 characters treated as encoded data rather than text.
const MIN_BASE64_RUN: usize = 100;

/// A line of line-wrapped base64 (MIME wraps at 76) is at least this long; shorter pieces
/// between line breaks (a list of words) are not joined into one run.
const MIN_BASE64_LINE: usize = 40;

/// Unparsable content as the agent reads it: runs of base64 (an attachment's `data`, also cut off
/// or line-wrapped) replaced by a note, then cut at [`MAX_UNPARSABLE_BYTES`].
fn unparsable_text(raw: &str) -> Cow<'_, str> {
    let text = omit_base64(raw);
    if text.len() <= MAX_UNPARSABLE_BYTES {
        return text;
    }
    let mut end = MAX_UNPARSABLE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!(
        "{}… [{} more bytes not shown]",
        &text[..end],
        text.len() - end
    ))
}

/// Replaces each run of at least [`MIN_BASE64_RUN`] base64 characters (either alphabet, `=`
/// padding, line breaks between lines of at least [`MIN_BASE64_LINE`]) with
/// `[base64 data left out: N characters]`.
fn omit_base64(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let is_base64 =
        |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'-' | b'_');
    let mut out = String::new();
    // Bytes of `text` already copied to `out` (or replaced).
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if !is_base64(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        let mut end;
        loop {
            let line_start = i;
            while i < bytes.len() && is_base64(bytes[i]) {
                i += 1;
            }
            end = i;
            let line_break = line_break_len(&bytes[i..]);
            let continues = bytes.get(i + line_break).is_some_and(|&b| is_base64(b));
            if line_break == 0 || !continues || i - line_start < MIN_BASE64_LINE {
                break;
            }
            i += line_break;
        }
        if end - start >= MIN_BASE64_RUN {
            // Base64 characters are ASCII, so `start` and `end` are char boundaries.
            out.push_str(&text[copied..start]);
            out.push_str(&format!(
                "[base64 data left out: {} characters]",
                end - start
            ));
            copied = end;
        }
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

/// Length of the line break `rest` starts with: a real one or its JSON escape (`\n`); 0 for none.
fn line_break_len(rest: &[u8]) -> usize {
    [&b"\r\n"[..], b"\n", b"\r", br"\r\n", br"\n", br"\r"]
        .iter()
        .find(|line_break| rest.starts_with(line_break))
        .map_or(0, |line_break| line_break.len())
}

/// A row rendered as one element, sorted into the chat block or the trailing list.
enum Rendered {
    Chat(String),
    Other(String),
}

/// The parts of a chat-like row that the `<message>` element shows.
struct ChatView<'a> {
    sender: Option<&'a str>,
    text: Cow<'a, str>,
    reply_to: Option<&'a ReplyTo>,
    /// Set when the row's kind is not a chat kind (unparsable content of a task, ...), so the
    /// agent still sees what the row was.
    kind: Option<&'a str>,
}

fn render_row(prompt_row: &PromptRow<'_>, ctx: &FormatContext<'_>) -> Rendered {
    let row = prompt_row.row;
    match &prompt_row.content {
        InboundContent::Chat(chat) => {
            let view = ChatView {
                sender: non_empty(chat.sender.as_deref()),
                text: chat_text(chat),
                reply_to: chat.reply_to.as_ref(),
                kind: None,
            };
            Rendered::Chat(render_chat(prompt_row, &view, ctx))
        }
        InboundContent::ChatSdk(sdk) => {
            let view = ChatView {
                sender: non_empty(sdk.author.full_name.as_deref())
                    .or_else(|| non_empty(sdk.author.user_name.as_deref())),
                text: Cow::Borrowed(&sdk.text),
                reply_to: None,
                kind: None,
            };
            Rendered::Chat(render_chat(prompt_row, &view, ctx))
        }
        InboundContent::Unparsable { raw, .. } => {
            // docs/contract/content.md#reading-rules: unparsable content reads as `{"text": raw}`,
            // i.e. a chat message.
            let kind = row.kind.as_str();
            let view = ChatView {
                sender: None,
                text: unparsable_text(raw),
                reply_to: None,
                kind: (!matches!(kind, "chat" | "chat-sdk")).then_some(kind),
            };
            Rendered::Chat(render_chat(prompt_row, &view, ctx))
        }
        InboundContent::Task(task) => {
            // A task's moment is when it was due (`process_after`), which is what its schedule
            // meant; the row's own timestamp is when it was inserted, often much earlier.
            let time = row
                .process_after
                .as_deref()
                .and_then(|due| format_time(due, ctx.timezone))
                .or_else(|| format_time(&row.timestamp, ctx.timezone));
            let mut out = start_tag("task", &[("time", time.as_deref())]);
            match prompt_row.script_output.as_ref().filter(|v| !v.is_null()) {
                Some(data) => {
                    out.push_str("Script output:\n");
                    out.push_str(&json_body(data));
                    out.push_str("\n\nInstructions:\n");
                    out.push_str(&escape_text(&task.prompt));
                }
                None => out.push_str(&escape_text(&task.prompt)),
            }
            out.push_str("</task>");
            Rendered::Other(out)
        }
        InboundContent::Webhook(hook) => {
            let mut out = start_tag(
                "webhook",
                &[
                    ("source", hook.source.as_deref()),
                    ("event", hook.event.as_deref()),
                ],
            );
            if !hook.payload.is_null() {
                out.push_str(&json_body(&hook.payload));
            }
            out.push_str("</webhook>");
            Rendered::Other(out)
        }
        InboundContent::System(value) => Rendered::Other(render_system(value, &prompt_row.content)),
        InboundContent::Unknown { kind, value } => {
            let seq = row.seq.map(|s| s.to_string());
            let time = format_time(&row.timestamp, ctx.timezone);
            let mut out = start_tag(
                "message",
                &[
                    ("id", seq.as_deref()),
                    ("kind", Some(kind)),
                    ("from", source_name(&row.routing, ctx.destinations)),
                    ("time", time.as_deref()),
                ],
            );
            out.push_str(&json_body(value));
            out.push_str("</message>");
            Rendered::Other(out)
        }
    }
}

/// A chat's text; an answer to a question sent with no text shows the chosen option, so the
/// answer is not an empty message.
fn chat_text(chat: &ChatContent) -> Cow<'_, str> {
    match &chat.selected_option {
        Some(option) if chat.question_id.is_some() && chat.text.trim().is_empty() => {
            Cow::Owned(option_text(option))
        }
        _ => Cow::Borrowed(&chat.text),
    }
}

/// `<message id from sender time reply_to>[quote]text[attachments]</message>`.
fn render_chat(prompt_row: &PromptRow<'_>, view: &ChatView<'_>, ctx: &FormatContext<'_>) -> String {
    let row = prompt_row.row;
    let seq = row.seq.map(|s| s.to_string());
    let time = format_time(&row.timestamp, ctx.timezone);
    let reply_id = view.reply_to.and_then(|r| non_empty(r.id.as_deref()));
    let mut out = start_tag(
        "message",
        &[
            ("id", seq.as_deref()),
            ("kind", view.kind),
            ("from", source_name(&row.routing, ctx.destinations)),
            ("sender", view.sender),
            ("time", time.as_deref()),
            ("reply_to", reply_id),
        ],
    );

    let mut lines: Vec<String> = Vec::new();
    if !view.text.trim().is_empty() || prompt_row.attachments.is_empty() {
        lines.push(escape_text(&view.text).into_owned());
    }
    for note in &prompt_row.attachments {
        lines.push(match note {
            AttachmentNote::Available { path } => {
                format!("[file available at: {}]", escape_text(path))
            }
            AttachmentNote::Unavailable { name, reason } => format!(
                "[attachment unavailable: {} — {}]",
                escape_text(name),
                escape_text(reason)
            ),
        });
    }
    // An empty quote says nothing (and reads like a blank message); `reply_to` keeps the link.
    let quote = view
        .reply_to
        .filter(|reply| reply.text.as_deref().is_some_and(|t| !t.trim().is_empty()));
    if let Some(reply) = quote {
        // The quote gets its own indented line so it reads as context, not as the new text.
        out.push_str("\n  ");
        out.push_str(&start_tag(
            "quoted_message",
            &[("from", non_empty(reply.sender.as_deref()))],
        ));
        out.push_str(&escape_text(reply.text.as_deref().unwrap_or_default()));
        out.push_str("</quoted_message>\n");
    }
    out.push_str(&lines.join("\n"));
    out.push_str("</message>");
    out
}

/// `<system_response>`: a host action result, or an answer to a question that no
/// `ask_user_question` call is waiting for any more.
fn render_system(value: &Value, content: &InboundContent) -> String {
    if let Some(answer) = content.question_answer() {
        let mut out = start_tag(
            "system_response",
            &[
                ("action", Some("question_response")),
                ("question_id", Some(&answer.question_id)),
                ("user_id", answer.user_id.as_deref()),
            ],
        );
        out.push_str("Selected option: ");
        out.push_str(&escape_text(&option_text(&answer.selected_option)));
        out.push_str("</system_response>");
        return out;
    }

    let field = |name: &str| value.get(name).and_then(attr_value);
    // A row without `action` still says what it is when it has a `type`.
    let (action, label_key) = match field("action") {
        Some(action) => (Some(action), "action"),
        None => (field("type"), "type"),
    };
    let status = field("status");
    let mut out = start_tag(
        "system_response",
        &[("action", action.as_deref()), ("status", status.as_deref())],
    );
    let body = match value {
        Value::Object(map) => match map.get("result") {
            Some(result) => Some(result.clone()),
            // No `result`: show whatever else the row holds, so nothing is hidden.
            None => {
                let rest: serde_json::Map<String, Value> = map
                    .iter()
                    .filter(|(k, _)| *k != label_key && *k != "status")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                (!rest.is_empty()).then_some(Value::Object(rest))
            }
        },
        other => Some(other.clone()),
    };
    if let Some(body) = body.filter(|b| !b.is_null()) {
        out.push_str(&json_body(&body));
    }
    out.push_str("</system_response>");
    out
}

/// The name of the destination a row came from: channel type and platform id both match; for
/// an agent-to-agent row (`channel_type` `agent`), the platform id names the agent group.
fn source_name<'a>(routing: &Routing, destinations: &'a [Destination]) -> Option<&'a str> {
    let channel_type = routing.channel_type.as_deref()?;
    let platform_id = routing.platform_id.as_deref()?;
    destinations
        .iter()
        .find(|d| {
            d.channel_type.as_deref() == Some(channel_type)
                && d.platform_id.as_deref() == Some(platform_id)
        })
        .or_else(|| {
            destinations.iter().find(|d| {
                channel_type == "agent" && d.agent_group_id.as_deref() == Some(platform_id)
            })
        })
        .map(|d| d.name.as_str())
}

/// A JSON scalar as an attribute value; `null`, objects and arrays have none.
fn attr_value(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Bool(_) | Value::Number(_) => Some(value.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

/// A chosen option as text: a string as it is, anything else as compact JSON.
fn option_text(option: &Value) -> String {
    match option {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn non_empty(value: Option<&str>) -> Option<&str> {
    value.filter(|v| !v.trim().is_empty())
}

/// Pretty JSON as an element body: `& < >` escaped so it cannot close its element.
fn json_body(value: &Value) -> String {
    // Serializing a `Value` cannot fail (its keys are strings); the fallback only keeps this
    // free of `unwrap`.
    let json = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    escape_body(&json).into_owned()
}

#[cfg(test)]
mod tests;
