//! `send`: builds a `messages_in` row (content shapes of docs/contract/content.md) from a
//! [`SendRequest`] and inserts it with the next even seq.

use std::path::{Component, Path};

use anyhow::{bail, Context, Result};
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use schema::cron::Schedule;
use schema::time::format_ts;
use schema::{
    IdempotentInsert, InKind, InboundContent, Inserted, NewMessageIn, Routing, SessionDb,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::timefmt::parse_when;

/// Kind of the inbound row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SendKind {
    /// A chat message (`{"sender","senderId","text","attachments","isFromMe","replyTo"?}`).
    #[default]
    Chat,
    /// A serialized Chat SDK message.
    ChatSdk,
    /// A scheduled task (`{"prompt","script"?}`).
    Task,
    /// A webhook delivery (`{"source","event","payload"}`).
    Webhook,
    /// A host action result or a question answer (raw `--content` only).
    System,
}

impl SendKind {
    /// Parses a kind name: `chat`, `chat-sdk`, `task`, `webhook` or `system` (the schema's
    /// names, [`InKind::parse`]).
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match InKind::parse(name) {
            InKind::Chat => Self::Chat,
            InKind::ChatSdk => Self::ChatSdk,
            InKind::Task => Self::Task,
            InKind::Webhook => Self::Webhook,
            InKind::System => Self::System,
            InKind::Other(other) => {
                bail!("unknown kind {other:?}: expected chat, chat-sdk, task, webhook or system")
            }
        })
    }

    /// The schema's kind.
    pub fn in_kind(self) -> InKind {
        match self {
            Self::Chat => InKind::Chat,
            Self::ChatSdk => InKind::ChatSdk,
            Self::Task => InKind::Task,
            Self::Webhook => InKind::Webhook,
            Self::System => InKind::System,
        }
    }

    /// The `kind` column value.
    pub fn name(self) -> String {
        self.in_kind().as_str().to_owned()
    }
}

/// A quoted message for a chat reply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Quote {
    /// Id of the quoted message (its seq, or a platform id).
    pub id: String,
    /// Who wrote it; looked up by seq when `None`.
    pub sender: Option<String>,
    /// What it said; looked up by seq when `None`.
    pub text: Option<String>,
}

/// Everything `send` can be told. Fields that do not apply to `kind` must stay unset.
#[derive(Debug, Clone, Default)]
pub struct SendRequest {
    /// Kind of the row.
    pub kind: SendKind,
    /// Raw JSON content; replaces every content flag.
    pub content: Option<String>,
    /// Explicit row id (a UUID when `None`); lets a host retry a post without duplicating it.
    pub id: Option<String>,
    /// Chat text (chat, chat-sdk).
    pub text: Option<String>,
    /// Sender display name (chat, chat-sdk); `User` when `None`.
    pub sender: Option<String>,
    /// Sender platform id (chat, chat-sdk).
    pub sender_id: Option<String>,
    /// Quoted message (chat).
    pub reply_to: Option<Quote>,
    /// Attachments by path relative to the workspace root (chat, chat-sdk).
    pub attach_paths: Vec<String>,
    /// Attachments by URL (chat, chat-sdk).
    pub attach_urls: Vec<String>,
    /// Task instructions (task).
    pub prompt: Option<String>,
    /// Pre-agent bash script (task).
    pub script: Option<String>,
    /// 5-field cron expression (task).
    pub recurrence: Option<String>,
    /// Webhook source, e.g. `github` (webhook).
    pub source: Option<String>,
    /// Webhook event, e.g. `pull_request` (webhook).
    pub event: Option<String>,
    /// Webhook payload JSON (webhook); `{}` when `None`.
    pub payload: Option<String>,
    /// Routing overrides; unset fields come from `session_routing` (see [`resolve_routing`]).
    pub routing: Routing,
    /// Store `trigger=0` (context only).
    pub no_trigger: bool,
    /// Not due before this time (see [`parse_when`]).
    pub process_after: Option<String>,
    /// Only on the runner's first poll after start.
    pub on_wake: bool,
}

/// What `send` wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sent {
    /// Row id.
    pub id: String,
    /// Allocated (even) seq.
    pub seq: i64,
    /// Kind column.
    pub kind: String,
    /// Normalised `process_after`, if any.
    pub process_after: Option<String>,
    /// Routing stored on the row.
    pub routing: Routing,
    /// Notes for the user (e.g. the first run of a recurring task).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Validates `request`, builds the row and inserts it.
pub fn send(db: &SessionDb, request: &SendRequest) -> Result<Sent> {
    let (row, notes) = prepare(db, request)?;
    let Inserted { id, seq } = db.insert_in(&row).context("inserting the message")?;
    Ok(sent(row, notes, id, seq))
}

/// What [`send_with_key`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyedSend {
    /// The key was new: the row was inserted; `json` is `sent` as JSON, stored with the key.
    Sent {
        /// The result.
        sent: Sent,
        /// Its JSON, as stored.
        json: String,
    },
    /// The key was used before with the same fingerprint: nothing was written; the first
    /// result's JSON.
    Replayed(String),
    /// The key was used before with another fingerprint: nothing was written.
    Reused,
}

/// [`send`] under an idempotency key (docs/contract/api.md#idempotency): the key is stored with
/// `fingerprint` (a hash of the request) and the result in the transaction that inserts the
/// row, so a repeated key writes nothing and gets the first result.
pub fn send_with_key(
    db: &SessionDb,
    request: &SendRequest,
    key: &str,
    fingerprint: &str,
) -> Result<KeyedSend> {
    let (row, notes) = prepare(db, request)?;
    let mut first = None;
    let outcome = db
        .insert_in_idempotent(&row, key, fingerprint, Utc::now(), |inserted| {
            let result = sent(row.clone(), notes, inserted.id.clone(), inserted.seq);
            let json = serde_json::to_string(&result).unwrap_or_default();
            first = Some(result);
            json
        })
        .context("inserting the message")?;
    Ok(match (outcome, first) {
        (IdempotentInsert::Inserted { response, .. }, Some(sent)) => KeyedSend::Sent {
            sent,
            json: response,
        },
        (IdempotentInsert::Inserted { .. }, None) => bail!("an inserted row without its result"),
        (IdempotentInsert::Replayed { response }, _) => KeyedSend::Replayed(response),
        (IdempotentInsert::Reused, _) => KeyedSend::Reused,
    })
}

fn sent(row: NewMessageIn, notes: Vec<String>, id: String, seq: i64) -> Sent {
    Sent {
        id,
        seq,
        kind: row.kind,
        process_after: row.process_after,
        routing: row.routing,
        notes,
    }
}

/// Builds the row and warns about attachments missing from the workspace.
fn prepare(db: &SessionDb, request: &SendRequest) -> Result<(NewMessageIn, Vec<String>)> {
    let (row, notes) = build_row(db, request, Utc::now(), cron_timezone()?)?;
    if let Some(workspace) = db.path().parent() {
        for path in &request.attach_paths {
            if !workspace.join(path).exists() {
                tracing::warn!(
                    path,
                    workspace = %workspace.display(),
                    "attachment not found under the workspace; the runner will report it as missing"
                );
            }
        }
    }
    Ok((row, notes))
}

/// The time zone cron schedules are evaluated in: `TZ` (an IANA name), else UTC. The runner
/// uses the same variable, so both agree on a series' next run.
pub fn cron_timezone() -> Result<Tz> {
    match std::env::var("TZ") {
        Ok(name) if !name.trim().is_empty() => {
            let name = name.trim().trim_start_matches(':');
            schema::cron::parse_tz(name).context("TZ")
        }
        _ => Ok(Tz::UTC),
    }
}

/// Builds the row `request` describes without inserting it. Returns notes for the user.
pub fn build_row(
    db: &SessionDb,
    request: &SendRequest,
    now: DateTime<Utc>,
    timezone: Tz,
) -> Result<(NewMessageIn, Vec<String>)> {
    check_flags(request)?;
    let mut notes = Vec::new();
    let kind = request.kind;
    let routing = resolve_routing(db, &request.routing)?;
    let content = match &request.content {
        Some(raw) => raw_content(kind, raw)?,
        None => match kind {
            SendKind::Chat => chat_content(db, request)?,
            SendKind::ChatSdk => chat_sdk_content(request, &routing, now)?,
            SendKind::Task => task_content(request)?,
            SendKind::Webhook => webhook_content(request)?,
            SendKind::System => bail!(
                "--kind system needs --content JSON (for a question answer use `nanoclaw answer`)"
            ),
        },
    };
    let mut row = NewMessageIn::new(kind.name(), content.to_string());
    row.id = request.id.clone();
    if kind == SendKind::ChatSdk && request.content.is_none() {
        // The serialized message carries its own id: make it the row id too.
        row.id = content.get("id").and_then(Value::as_str).map(str::to_owned);
    }
    if let Some(id) = &row.id {
        if id.trim().is_empty() {
            bail!("--id must not be empty");
        }
    }
    row.trigger = !request.no_trigger;
    row.on_wake = request.on_wake;
    row.routing = routing;
    if let Some(text) = &request.process_after {
        row.process_after = Some(format_ts(parse_when(text, now).context("--process-after")?));
    }
    if kind == SendKind::Task {
        row.series_is_self = true;
        if let Some(expr) = &request.recurrence {
            let schedule = Schedule::parse(expr).context("--recurrence")?;
            row.recurrence = Some(schedule.expr().to_owned());
            if row.process_after.is_none() {
                let first = schedule.next_after(now, timezone).context("--recurrence")?;
                row.process_after = Some(format_ts(first));
                notes.push(format!(
                    "first run at {} (next match of {:?} in {timezone}; give --process-after to choose)",
                    format_ts(first),
                    schedule.expr()
                ));
            }
        }
    }
    Ok((row, notes))
}

/// Routing for a new row: with `--channel-type` or `--platform-id` the given fields alone;
/// with only `--thread-id` the session routing in that thread; with none the session routing.
pub fn resolve_routing(db: &SessionDb, given: &Routing) -> Result<Routing> {
    if given.channel_type.is_some() || given.platform_id.is_some() {
        return Ok(given.clone());
    }
    let mut routing = db
        .session_routing()
        .context("reading the session routing")?
        .unwrap_or_default();
    if given.thread_id.is_some() {
        routing.thread_id = given.thread_id.clone();
    }
    Ok(routing)
}

/// Refuses flags that do not apply to the kind, so a typo never silently drops input.
fn check_flags(request: &SendRequest) -> Result<()> {
    use SendKind::*;
    let kind = request.kind;
    let flags: [(&str, bool, &[SendKind]); 12] = [
        ("--text", request.text.is_some(), &[Chat, ChatSdk]),
        ("--sender", request.sender.is_some(), &[Chat, ChatSdk]),
        ("--sender-id", request.sender_id.is_some(), &[Chat, ChatSdk]),
        ("--reply-to", request.reply_to.is_some(), &[Chat]),
        (
            "--attach-path",
            !request.attach_paths.is_empty(),
            &[Chat, ChatSdk],
        ),
        (
            "--attach-url",
            !request.attach_urls.is_empty(),
            &[Chat, ChatSdk],
        ),
        ("--prompt", request.prompt.is_some(), &[Task]),
        ("--script", request.script.is_some(), &[Task]),
        ("--recurrence", request.recurrence.is_some(), &[Task]),
        ("--source", request.source.is_some(), &[Webhook]),
        ("--event", request.event.is_some(), &[Webhook]),
        ("--payload", request.payload.is_some(), &[Webhook]),
    ];
    for (flag, set, kinds) in flags {
        if set && !kinds.contains(&kind) {
            let names: Vec<String> = kinds.iter().map(|k| k.name()).collect();
            bail!(
                "{flag} does not apply to --kind {} (it is for {})",
                kind.name(),
                names.join(", ")
            );
        }
        if set && request.content.is_some() && flag != "--recurrence" {
            bail!("{flag} cannot be combined with --content (the raw JSON is the whole content)");
        }
    }
    Ok(())
}

/// Raw `--content`: must be a JSON object that fits the kind's shape.
fn raw_content(kind: SendKind, raw: &str) -> Result<Value> {
    let value: Value = serde_json::from_str(raw).context("--content is not valid JSON")?;
    if !value.is_object() {
        bail!("--content must be a JSON object, got {raw}");
    }
    // The runner reads a field of the wrong type leniently; the host writes none in the first
    // place.
    let (parsed, problems) = InboundContent::parse_with_problems(&kind.in_kind(), raw);
    if let InboundContent::Unparsable { reason, .. } = parsed {
        bail!("--content does not fit --kind {}: {reason}", kind.name());
    }
    if !problems.is_empty() {
        let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
        bail!(
            "--content does not fit --kind {}: {}",
            kind.name(),
            problems.join("; ")
        );
    }
    Ok(value)
}

fn required<'a>(value: &'a Option<String>, flag: &str, kind: SendKind) -> Result<&'a str> {
    match value.as_deref() {
        Some(text) if !text.trim().is_empty() => Ok(text),
        _ => bail!("--kind {} needs {flag} (or --content JSON)", kind.name()),
    }
}

fn chat_content(db: &SessionDb, request: &SendRequest) -> Result<Value> {
    let text = required(&request.text, "--text", SendKind::Chat)?;
    let mut content = Map::new();
    content.insert(
        "sender".into(),
        json!(request.sender.as_deref().unwrap_or("User")),
    );
    if let Some(id) = &request.sender_id {
        content.insert("senderId".into(), json!(id));
    }
    content.insert("text".into(), json!(text));
    content.insert("attachments".into(), Value::Array(attachments(request)?));
    content.insert("isFromMe".into(), json!(false));
    if let Some(quote) = &request.reply_to {
        let (sender, text) = fill_quote(db, quote)?;
        content.insert(
            "replyTo".into(),
            json!({ "id": quote.id, "sender": sender, "text": text }),
        );
    }
    Ok(Value::Object(content))
}

/// Completes a quote from the DB when its id is a seq and sender or text were not given.
fn fill_quote(db: &SessionDb, quote: &Quote) -> Result<(Option<String>, Option<String>)> {
    if quote.id.trim().is_empty() {
        bail!("--reply-to must not be empty");
    }
    let (mut sender, mut text) = (quote.sender.clone(), quote.text.clone());
    if sender.is_some() && text.is_some() {
        return Ok((sender, text));
    }
    let Ok(seq) = quote.id.trim().parse::<i64>() else {
        return Ok((sender, text));
    };
    if seq % 2 == 0 {
        if let Some(row) = db.message_in_by_seq(seq).context("looking up --reply-to")? {
            if let InboundContent::Chat(chat) = InboundContent::parse(&row.kind(), &row.content) {
                sender = sender.or(chat.sender);
                text = text.or(Some(chat.text));
            }
        }
    } else if let Some(row) = db
        .message_out_by_seq(seq)
        .context("looking up --reply-to")?
    {
        let value: Value = serde_json::from_str(&row.content).unwrap_or(Value::Null);
        if let Some(found) = value.get("text").and_then(Value::as_str) {
            text = text.or(Some(found.to_owned()));
        }
    }
    Ok((sender, text))
}

fn chat_sdk_content(request: &SendRequest, routing: &Routing, now: DateTime<Utc>) -> Result<Value> {
    let text = required(&request.text, "--text", SendKind::ChatSdk)?;
    let sender = request.sender.as_deref().unwrap_or("User");
    let id = request
        .id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    Ok(json!({
        "_type": "chat:Message",
        "id": id,
        "threadId": routing.thread_id,
        "text": text,
        "author": {
            "userId": request.sender_id,
            "userName": sender,
            "fullName": sender,
            "isBot": false,
            "isMe": false,
        },
        "metadata": { "dateSent": format_ts(now), "edited": false },
        "attachments": attachments(request)?,
        "isMention": true,
    }))
}

fn task_content(request: &SendRequest) -> Result<Value> {
    let prompt = required(&request.prompt, "--prompt", SendKind::Task)?;
    let mut content = json!({ "prompt": prompt });
    if let Some(script) = &request.script {
        if script.trim().is_empty() {
            bail!("--script must not be empty");
        }
        content["script"] = json!(script);
    }
    Ok(content)
}

fn webhook_content(request: &SendRequest) -> Result<Value> {
    let source = required(&request.source, "--source", SendKind::Webhook)?;
    let payload: Value = match &request.payload {
        Some(raw) => serde_json::from_str(raw)
            .with_context(|| format!("--payload is not valid JSON: {}", excerpt(raw, 80)))?,
        None => json!({}),
    };
    Ok(json!({ "source": source, "event": request.event, "payload": payload }))
}

fn attachments(request: &SendRequest) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for path in &request.attach_paths {
        let relative = Path::new(path);
        if path.trim().is_empty()
            || relative.is_absolute()
            || relative
                .components()
                .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            bail!(
                "--attach-path {path:?} must be a path relative to the workspace root without `..` \
                 (e.g. downloads/report.pdf)"
            );
        }
        let name = relative
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.clone());
        out.push(attachment_json(&name, "localPath", path));
    }
    for url in &request.attach_urls {
        let lower = url.to_ascii_lowercase();
        if !(lower.starts_with("http://") || lower.starts_with("https://")) {
            bail!("--attach-url {url:?} must be an http:// or https:// URL");
        }
        let without_query = url.split(['?', '#']).next().unwrap_or(url);
        let name = without_query
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .filter(|n| !n.is_empty() && !n.contains(':'))
            .unwrap_or("attachment");
        out.push(attachment_json(name, "url", url));
    }
    Ok(out)
}

fn attachment_json(name: &str, key: &str, location: &str) -> Value {
    let mime = mime_type(name);
    let kind = match mime.map(|m| m.split('/').next().unwrap_or_default()) {
        Some("image") => "image",
        Some("audio") => "audio",
        Some("video") => "video",
        _ => "file",
    };
    let mut value = json!({ "type": kind, "name": name, key: location });
    if let Some(mime) = mime {
        value["mimeType"] = json!(mime);
    }
    value
}

fn mime_type(name: &str) -> Option<&'static str> {
    let ext = name.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "json" => "application/json",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "docx" => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "mp3" => "audio/mpeg",
        "ogg" => "audio/ogg",
        "wav" => "audio/wav",
        "mp4" => "video/mp4",
        "zip" => "application/zip",
        _ => return None,
    })
}

/// The first `max` characters of `text` on one line, with `…` when cut.
pub fn excerpt(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let flat = flat.trim();
    if flat.chars().count() <= max {
        flat.to_owned()
    } else {
        let cut: String = flat.chars().take(max.saturating_sub(1)).collect();
        format!("{}…", cut.trim_end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attachments_are_shaped_and_checked() {
        let request = SendRequest {
            attach_paths: vec!["downloads/a/photo.PNG".into()],
            attach_urls: vec!["https://example.com/files/report.pdf?x=1".into()],
            ..Default::default()
        };
        let values = attachments(&request).unwrap();
        assert_eq!(
            values[0],
            json!({"type":"image","name":"photo.PNG","localPath":"downloads/a/photo.PNG","mimeType":"image/png"})
        );
        assert_eq!(
            values[1],
            json!({"type":"file","name":"report.pdf","url":"https://example.com/files/report.pdf?x=1","mimeType":"application/pdf"})
        );
        for bad in ["/etc/passwd", "../x", "a/../../b", ""] {
            let request = SendRequest {
                attach_paths: vec![bad.into()],
                ..Default::default()
            };
            assert!(attachments(&request).is_err(), "{bad}");
        }
        let request = SendRequest {
            attach_urls: vec!["file:///etc/passwd".into()],
            ..Default::default()
        };
        assert!(attachments(&request).is_err());
    }

    #[test]
    fn excerpts() {
        assert_eq!(excerpt("short", 10), "short");
        assert_eq!(excerpt("line one\nline two", 12), "line one li…");
    }
}
