//! `watch`: follows `messages_out` as rows arrive, woken by [`DbWatcher`] with a fallback poll,
//! and renders rows as readable lines or JSON objects.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use schema::{DbWatcher, MessageOut, SessionDb};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::init::format_routing;
use crate::system_rows::{BudgetExceeded, Progress, ToolDecision};

/// Rows read per query.
const PAGE: usize = 200;

/// The longest wait between two reads when no change notification arrives.
pub const MAX_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// How to follow `messages_out`.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// Start after this seq (0: from the first row).
    pub after: i64,
    /// Keep waiting for new rows after the existing ones.
    pub follow: bool,
    /// Stop after this many rows.
    pub until_count: Option<usize>,
    /// Stop after this long; an error when `until_count` was not reached by then.
    pub timeout: Option<Duration>,
    /// Record every row handed out in `delivered` (status `delivered`, no platform id), unless
    /// it is already recorded.
    pub mark_delivered: bool,
    /// Fallback poll interval (capped at [`MAX_POLL_INTERVAL`]).
    pub poll_interval: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            after: 0,
            follow: true,
            until_count: None,
            timeout: None,
            mark_delivered: false,
            poll_interval: MAX_POLL_INTERVAL,
        }
    }
}

/// Why a watch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEnd {
    /// `follow` was off and every existing row was handed out.
    CaughtUp,
    /// `until_count` rows were handed out.
    CountReached,
    /// The timeout passed (without an `until_count`).
    TimedOut,
}

/// Result of a watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchSummary {
    /// Rows handed out.
    pub rows: usize,
    /// Seq of the last row handed out (or the start point).
    pub last_seq: i64,
    /// Why it stopped.
    pub end: WatchEnd,
}

/// Hands each `messages_out` row after `options.after` to `on_row`, in seq order, waiting for
/// new rows while `options.follow` is set. Read-only unless `mark_delivered`. Cancel by
/// dropping the future.
pub async fn watch(
    db: &SessionDb,
    options: &WatchOptions,
    mut on_row: impl FnMut(&MessageOut) -> Result<()>,
) -> Result<WatchSummary> {
    // Created before the first read, so a commit between that read and the wait still wakes us.
    let mut watcher = DbWatcher::new(db).context("watching the session DB")?;
    let started = Instant::now();
    let deadline = options.timeout.map(|timeout| started + timeout);
    let poll = options
        .poll_interval
        .clamp(Duration::from_millis(1), MAX_POLL_INTERVAL);
    let mut summary = WatchSummary {
        rows: 0,
        last_seq: options.after,
        end: WatchEnd::CaughtUp,
    };
    loop {
        let rows = db
            .messages_out_after(summary.last_seq, PAGE)
            .context("reading messages_out")?;
        let full_page = rows.len() == PAGE;
        for row in rows {
            if let Some(seq) = row.seq {
                summary.last_seq = seq;
            }
            on_row(&row)?;
            if options.mark_delivered && db.delivered(&row.id)?.is_none() {
                db.mark_delivered(&row.id, None, "delivered")
                    .with_context(|| format!("marking {} delivered", row.id))?;
            }
            summary.rows += 1;
            if options
                .until_count
                .is_some_and(|count| summary.rows >= count)
            {
                summary.end = WatchEnd::CountReached;
                return Ok(summary);
            }
        }
        if full_page {
            continue;
        }
        if !options.follow {
            summary.end = WatchEnd::CaughtUp;
            return Ok(summary);
        }
        let mut wait = poll;
        if let Some(deadline) = deadline {
            let now = Instant::now();
            if now >= deadline {
                if let Some(count) = options.until_count {
                    bail!(
                        "timed out after {:.1}s: {} of {count} messages_out rows arrived (last seq {})",
                        started.elapsed().as_secs_f64(),
                        summary.rows,
                        summary.last_seq
                    );
                }
                summary.end = WatchEnd::TimedOut;
                return Ok(summary);
            }
            wait = wait.min(deadline - now);
        }
        watcher.wait(wait).await;
    }
}

/// The highest seq in `messages_out` (0 when empty): start a watch there to see only new rows.
pub fn latest_out_seq(db: &SessionDb) -> Result<i64> {
    let mut after = i64::MIN;
    loop {
        let rows = db
            .messages_out_after(after, PAGE)
            .context("reading messages_out")?;
        let last = rows.last().and_then(|row| row.seq);
        match last {
            Some(seq) if rows.len() == PAGE => after = seq,
            Some(seq) => return Ok(seq),
            None => return Ok(after.max(0)),
        }
    }
}

/// One row as a JSON object: the columns in camelCase (as every `--json` output), with
/// `content` parsed (kept as a string when it is not JSON).
pub fn row_json(row: &MessageOut) -> Value {
    let content = serde_json::from_str::<Value>(&row.content)
        .unwrap_or_else(|_| Value::String(row.content.clone()));
    json!({
        "id": row.id,
        "seq": row.seq,
        "inReplyTo": row.in_reply_to,
        "timestamp": row.timestamp,
        "deliverAfter": row.deliver_after,
        "kind": row.kind,
        "channelType": row.routing.channel_type,
        "platformId": row.routing.platform_id,
        "threadId": row.routing.thread_id,
        "content": content,
    })
}

/// The row [`row_json`] made `object` from (what `watch` over the API renders). A `content`
/// string that is itself JSON was a JSON string (else [`row_json`] would have parsed it); any
/// other string is read as the stored text: [`row_json`] makes the text `abc` and the JSON
/// string `"abc"` alike, so such a row (never one the runner writes: its content is an object)
/// renders without the quotes.
pub fn row_from_json(object: &Value) -> Result<MessageOut> {
    let text = |name: &str| object.get(name).and_then(Value::as_str).map(str::to_owned);
    let Some(id) = text("id") else {
        bail!(
            "a row without an id: {}",
            crate::send::excerpt(&object.to_string(), 200)
        );
    };
    let content = match object.get("content") {
        Some(Value::String(stored)) if serde_json::from_str::<Value>(stored).is_err() => {
            stored.clone()
        }
        Some(value) => value.to_string(),
        None => String::new(),
    };
    Ok(MessageOut {
        id,
        seq: object.get("seq").and_then(Value::as_i64),
        in_reply_to: text("inReplyTo"),
        timestamp: text("timestamp").unwrap_or_default(),
        deliver_after: text("deliverAfter"),
        kind: text("kind").unwrap_or_default(),
        routing: schema::Routing {
            channel_type: text("channelType"),
            platform_id: text("platformId"),
            thread_id: text("threadId"),
        },
        content,
    })
}

/// One row as a readable line:
/// `[seq 7 → slack:C123] reply to 1f2e3d4c: Hello`, `[seq 9 → slack:C123] (question q1) Pick
/// one: [a] [b]`, `(edit 5) new text`, `(reaction 5) 👍`, `(card) …`, `(system query_error) {…}`.
pub fn render_row(row: &MessageOut) -> String {
    let seq = row
        .seq
        .map_or_else(|| "seq ?".to_owned(), |seq| format!("seq {seq}"));
    let target = if row.routing.is_empty() {
        String::new()
    } else {
        format!(" → {}", format_routing(&row.routing))
    };
    let mut line = format!("[{seq}{target}] ");
    if let Some(reply) = &row.in_reply_to {
        line.push_str(&format!("reply to {}: ", short_id(reply)));
    }
    line.push_str(&render_content(&row.kind, &row.content));
    if let Some(after) = &row.deliver_after {
        line.push_str(&format!(" (deliver after {after})"));
    }
    line
}

/// The first 8 characters of a UUID-like id; shorter ids whole.
pub fn short_id(id: &str) -> &str {
    match id.char_indices().nth(8) {
        Some((cut, _)) if id.len() > 12 => &id[..cut],
        _ => id,
    }
}

/// The content of a `messages_out` row of `kind`, in words.
pub fn render_content(kind: &str, content: &str) -> String {
    let Ok(value) = serde_json::from_str::<Value>(content) else {
        return content.to_owned();
    };
    let text = |key: &str| value.get(key).and_then(Value::as_str).unwrap_or_default();
    let id = |key: &str| match value.get(key) {
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
        None => "?".to_owned(),
    };
    if kind == "system" {
        return render_system(&value);
    }
    match value.get("operation").and_then(Value::as_str) {
        Some("edit") => format!("(edit {}) {}", id("messageId"), text("text")),
        Some("reaction") => format!("(reaction {}) {}", id("messageId"), text("emoji")),
        Some("card") => {
            let fallback = text("fallbackText");
            if fallback.is_empty() {
                format!("(card) {}", value.get("card").unwrap_or(&Value::Null))
            } else {
                format!("(card) {fallback}")
            }
        }
        Some("ask_question") => {
            let mut out = format!("(question {})", id("questionId"));
            let (title, question) = (text("title"), text("question"));
            if !title.is_empty() && title != question {
                out.push_str(&format!(" {title}:"));
            }
            out.push(' ');
            out.push_str(question);
            if !question.is_empty() && !question.ends_with(['?', ':', '.', '!']) {
                out.push(':');
            }
            for option in value
                .get("options")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                out.push_str(&format!(" [{}]", option_text(option)));
            }
            out
        }
        Some(other) => format!("({other}) {value}"),
        None => {
            let mut out = text("text").to_owned();
            if let Some(files) = value.get("files").and_then(Value::as_array) {
                let names: Vec<String> = files.iter().map(crate::answer::value_text).collect();
                if !out.is_empty() {
                    out.push(' ');
                }
                out.push_str(&format!("[files: {}]", names.join(", ")));
            }
            if out.is_empty() && value.get("text").is_none() {
                value.to_string()
            } else {
                out
            }
        }
    }
}

/// Longest text shown for one payload value.
const VALUE_SHOWN: usize = 200;

/// A system row (`{"action", "payload"}`, docs/contract/content.md#system-actions) in words; an
/// action this version does not know as its payload's fields, `key=value`.
fn render_system(value: &Value) -> String {
    let action = value
        .get("action")
        .and_then(Value::as_str)
        .unwrap_or("action");
    let payload = value.get("payload").unwrap_or(value);
    let text = |key: &str| match payload.get(key) {
        Some(Value::String(text)) => crate::send::excerpt(text, VALUE_SHOWN),
        Some(Value::Null) | None => String::new(),
        Some(other) => crate::send::excerpt(&other.to_string(), VALUE_SHOWN),
    };
    let or_unknown = |text: String| {
        if text.is_empty() {
            "?".to_owned()
        } else {
            text
        }
    };
    match action {
        "query_error" => {
            let class = or_unknown(text("classification"));
            let retry = match payload.get("retryable").and_then(Value::as_bool) {
                Some(true) => ", retryable",
                Some(false) => ", not retryable",
                None => "",
            };
            let mut out = format!(
                "(query error: {class}{retry}) {}",
                or_unknown(text("message"))
            );
            let ids: Vec<String> = payload
                .get("messageIds")
                .and_then(Value::as_array)
                .map(|ids| ids.iter().map(crate::answer::value_text).collect())
                .unwrap_or_default();
            if !ids.is_empty() {
                out.push_str(&format!("; left processing: {}", ids.join(", ")));
            }
            let retry_at = text("retryAt");
            if !retry_at.is_empty() {
                out.push_str(&format!("; retry not before {retry_at}"));
            }
            out
        }
        "task_skipped" | "task_series_stopped" => format!(
            "({} {}) {}",
            action.replace('_', " "),
            or_unknown(text("taskId")),
            or_unknown(text("reason"))
        ),
        "row_unusable" => format!(
            "(row unusable {}) {} = {}: {}; set {}",
            or_unknown(text("id")),
            or_unknown(text("column")),
            or_unknown(text("value")),
            or_unknown(text("reason")),
            or_unknown(text("status"))
        ),
        "progress" if let Some(progress) = Progress::from_payload(payload) => {
            format!("(progress {}) {}", progress.elapsed_text(), progress.text())
        }
        "tool_decision" => match ToolDecision::from_payload(payload) {
            Some(decision) => format!("(tool) {}", decision.text()),
            None => format!("(tool decision) {}", fields(payload)),
        },
        "budget_exceeded" => match BudgetExceeded::from_payload(payload) {
            Some(budget) => format!("(budget exceeded) {}", budget.text()),
            None => format!("(budget exceeded) {}", fields(payload)),
        },
        "progress" => {
            let message = ["message", "text", "status"]
                .into_iter()
                .map(text)
                .find(|text| !text.is_empty());
            match message {
                Some(message) => format!("(progress) {message}"),
                None => format!("(progress) {}", fields(payload)),
            }
        }
        other => format!("(system {other}) {}", fields(payload)),
    }
}

/// An object's fields as `key=value`, strings unquoted, long values cut; anything else as JSON.
fn fields(payload: &Value) -> String {
    let Some(map) = payload.as_object() else {
        return crate::send::excerpt(&payload.to_string(), VALUE_SHOWN);
    };
    map.iter()
        .map(|(key, value)| {
            let value = match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            format!("{key}={}", crate::send::excerpt(&value, VALUE_SHOWN))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn option_text(option: &Value) -> String {
    let Some(map) = option.as_object() else {
        return crate::answer::value_text(option);
    };
    let label = map.get("label").and_then(Value::as_str);
    let value = map.get("value").map(crate::answer::value_text);
    match (label, value) {
        (Some(label), Some(value)) if label != value => format!("{label} = {value}"),
        (Some(label), _) => label.to_owned(),
        (None, Some(value)) => value,
        (None, None) => option.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use schema::Routing;

    fn row(kind: &str, content: Value) -> MessageOut {
        MessageOut {
            id: "o".into(),
            seq: Some(7),
            in_reply_to: Some("1f2e3d4c-aaaa-bbbb-cccc-000000000000".into()),
            timestamp: "2026-11-21T10:00:00.000Z".into(),
            deliver_after: None,
            kind: kind.into(),
            routing: Routing {
                channel_type: Some("slack".into()),
                platform_id: Some("C123".into()),
                thread_id: None,
            },
            content: content.to_string(),
        }
    }

    #[test]
    fn a_row_read_back_from_its_json_renders_and_serializes_the_same() {
        let mut stored_text = row("chat", json!({}));
        stored_text.content = "not { json".into();
        stored_text.deliver_after = Some("2026-11-21T10:05:00.000Z".into());
        stored_text.seq = None;
        let json_string = row("chat", json!("a JSON string"));
        let back = row_from_json(&row_json(&json_string)).ok();
        assert_eq!(back.as_ref().map(row_json), Some(row_json(&json_string)));
        for original in [
            row("chat", json!({"text": "Hello"})),
            row("chat", json!("{\"looks\": \"like json\"}")),
            row(
                "system",
                json!({"action": "query_error", "message": "boom"}),
            ),
            stored_text,
        ] {
            let object = row_json(&original);
            let back = match row_from_json(&object) {
                Ok(back) => back,
                Err(err) => panic!("{object}: {err}"),
            };
            assert_eq!(row_json(&back), object);
            assert_eq!(render_row(&back), render_row(&original));
        }
        assert!(row_from_json(&json!({"seq": 1})).is_err());
    }

    #[test]
    fn readable_lines() {
        assert_eq!(
            render_row(&row("chat", json!({"text":"Hello"}))),
            "[seq 7 → slack:C123] reply to 1f2e3d4c: Hello"
        );
        let question = json!({"operation":"ask_question","questionId":"q1","title":"Pick one",
            "question":"Pick one","options":[{"label":"a","value":"a"},{"label":"Bee","value":"b"}]});
        assert_eq!(
            render_content("chat-sdk", &question.to_string()),
            "(question q1) Pick one: [a] [Bee = b]"
        );
        assert_eq!(
            render_content(
                "chat",
                &json!({"operation":"edit","messageId":5,"text":"new"}).to_string()
            ),
            "(edit 5) new"
        );
        assert_eq!(
            render_content("chat", &json!({"text":"see","files":["a.png"]}).to_string()),
            "see [files: a.png]"
        );
        assert_eq!(render_content("chat", "not json"), "not json");
        assert_eq!(short_id("msg-4"), "msg-4");
    }

    #[test]
    fn every_system_row_reads_as_words() {
        let rows = [
            json!({"action": "query_error", "payload": {
                "message": "model API error (HTTP 502): upstream connect error",
                "classification": "gateway_error", "retryable": true,
                "messageIds": ["in-1", "in-2"], "provider": "claude",
                "endpoint": "http://127.0.0.1:9"}}),
            json!({"action": "query_error", "payload": {
                "message": "rate limited", "classification": "rate_limited", "retryable": true,
                "messageIds": ["in-3"], "retryAfterSecs": 120,
                "retryAt": "2026-11-23T10:02:00.000Z"}}),
            json!({"action": "task_skipped", "payload": {
                "taskId": "task-1", "reason": "script exited with status 3"}}),
            json!({"action": "task_series_stopped", "payload": {
                "taskId": "task-2", "reason": "bad cron expression \"61 * * * *\""}}),
            json!({"action": "row_unusable", "payload": {
                "id": "in-9", "rowid": 9, "column": "process_after", "value": "soon",
                "reason": "not a time", "status": "failed"}}),
            json!({"action": "progress", "payload": {"message": "compacting the conversation"}}),
            json!({"action": "progress", "payload": {"step": 2, "of": 5}}),
            json!({"action": "progress", "payload": {
                "tool": "Bash", "summary": "cargo test --workspace", "elapsedMs": 1234}}),
            json!({"action": "progress", "payload": {
                "tool": "mcp__nanoclaw__send_message", "elapsedMs": 95000}}),
            json!({"action": "progress", "payload": {"tool": "Read", "summary": "src/main.rs"}}),
            json!({"action": "progress", "payload": {
                "tool": null, "summary": "Let me look at the tests first.", "elapsedMs": 800}}),
            json!({"action": "budget_exceeded", "payload": {
                "limit": "maxCostUsdPerSession", "spent": 0.0123, "max": 0.01,
                "window": "session", "resetsAt": null}}),
            json!({"action": "budget_exceeded", "payload": {
                "limit": "maxTokensPerDay", "spent": 120500, "max": 100000,
                "window": "day", "resetsAt": "2026-11-24T05:00:00.000Z"}}),
            json!({"action": "budget_exceeded", "payload": {"window": "day"}}),
            json!({"action": "tool_decision", "payload": {
                "tool": "Bash", "summary": "rm -rf target", "decision": "deny", "by": "user"}}),
            json!({"action": "tool_decision", "payload": {
                "tool": "Bash", "summary": "git push", "decision": "allow", "by": "user"}}),
            json!({"action": "tool_decision", "payload": {
                "tool": "Bash", "summary": "make deploy", "decision": "deny", "by": "timeout"}}),
            json!({"action": "tool_decision", "payload": {
                "tool": "mcp__github__create_issue", "summary": null, "decision": "deny",
                "by": "policy"}}),
            json!({"action": "tool_decision", "payload": {
                "tool": "Write", "summary": "src/lib.rs", "decision": "deny", "by": "stop"}}),
            json!({"action": "tool_decision", "payload": {
                "tool": "Bash", "summary": "X=rm; $X -rf target", "decision": "deny",
                "by": "policy", "undecidable": "the program name $X is not a literal"}}),
            json!({"action": "tool_decision", "payload": {
                "tool": "Bash", "summary": "X=rm; $X -rf target", "decision": "deny",
                "by": "user", "undecidable": "the command could not be decided: the program \
                name is not a literal ($X): write the command literally"}}),
            json!({"action": "tool_decision", "payload": {"tool": "Bash"}}),
            json!({"action": "register_agent_group", "payload": {
                "name": "research", "folder": "research", "requestedBy": "U1"}}),
            json!({"action": "query_error"}),
        ];
        let lines: Vec<String> = rows
            .iter()
            .map(|row| render_content("system", &row.to_string()))
            .collect();
        expect_test::expect![[r#"
            (query error: gateway_error, retryable) model API error (HTTP 502): upstream connect error; left processing: in-1, in-2
            (query error: rate_limited, retryable) rate limited; left processing: in-3; retry not before 2026-11-23T10:02:00.000Z
            (task skipped task-1) script exited with status 3
            (task series stopped task-2) bad cron expression "61 * * * *"
            (row unusable in-9) process_after = soon: not a time; set failed
            (progress) compacting the conversation
            (progress) of=5 step=2
            (progress 1.2s) Bash: cargo test --workspace
            (progress 1m 35s) mcp__nanoclaw__send_message
            (progress ?) Read: src/main.rs
            (progress 0.8s) writing: Let me look at the tests first.
            (budget exceeded) maxCostUsdPerSession: spent $0.0123 of $0.0100 in this session; service resumes when the limit is raised
            (budget exceeded) maxTokensPerDay: spent 120500 tokens of 100000 tokens today; service resumes at 2026-11-24T05:00:00.000Z, or when the limit is raised
            (budget exceeded) window=day
            (tool) Bash: rm -rf target — denied by the user
            (tool) Bash: git push — allowed by the user
            (tool) Bash: make deploy — denied: no answer in time
            (tool) mcp__github__create_issue — denied by the tool policy
            (tool) Write: src/lib.rs — denied: the turn was stopped before the answer
            (tool) Bash: X=rm; $X -rf target — denied by the tool policy (not decidable: the program name $X is not a literal)
            (tool) Bash: X=rm; $X -rf target — denied by the user (not decidable: the program name is not a literal ($X): write the command literally)
            (tool decision) tool=Bash
            (system register_agent_group) folder=research name=research requestedBy=U1
            (query error: ?) ?"#]]
        .assert_eq(&lines.join("\n"));
    }

    #[test]
    fn questions_and_replies_read_as_words() {
        let question = row(
            "chat-sdk",
            json!({"operation": "ask_question", "questionId": "q-7", "title": "Deploy",
                "question": "Ship it now?", "options": [
                    {"label": "Yes", "selectedLabel": "Shipping", "value": "yes"},
                    {"label": "Later", "value": "later"}]}),
        );
        let edit = row(
            "chat",
            json!({"operation": "reaction", "messageId": "p-1", "emoji": "eyes"}),
        );
        let lines = [render_row(&question), render_row(&edit)];
        expect_test::expect![[r#"
            [seq 7 → slack:C123] reply to 1f2e3d4c: (question q-7) Deploy: Ship it now? [Yes = yes] [Later = later]
            [seq 7 → slack:C123] reply to 1f2e3d4c: (reaction p-1) eyes"#]]
        .assert_eq(&lines.join("\n"));
    }
}
