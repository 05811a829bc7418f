//! The archive's data model: a conversation as the archive sees it ([`Transcript`] of
//! [`Entry`]s with [`ToolCallSummary`]s), and the [`Builder`] every CLI's history parser fills
//! (`claude/history.rs`, `codex/history.rs`, `opencode/history.rs`), so the three merge
//! messages, tool calls and results by one rule.

use std::collections::HashMap;

use crate::prompt_xml::{self, Scanner};
use chrono::{DateTime, Utc};
use serde_json::Value;

/// Limit of a tool call's input and of its output excerpt, in characters.
pub const TOOL_EXCERPT_CHARS: usize = 200;

/// Who wrote an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A prompt the runner sent (the chat users' messages, tasks, webhooks).
    User,
    /// The agent.
    Assistant,
    /// Notices: compaction, interrupted or failed turns, CLI commands.
    System,
    /// A tool result whose call is not in the history.
    Tool,
}

impl Role {
    /// The heading used when the entry names no sender.
    pub fn label(self) -> &'static str {
        match self {
            Role::User => "User",
            Role::Assistant => "Assistant",
            Role::System => "System",
            Role::Tool => "Tool",
        }
    }
}

/// One tool call, summarised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallSummary {
    /// The tool's name as the CLI calls it (`Bash`, `mcp__nanoclaw__send_message`, `bash`, …).
    pub name: String,
    /// The input on one line, at most [`TOOL_EXCERPT_CHARS`] characters.
    pub input_excerpt: String,
    /// The output on one line, at most [`TOOL_EXCERPT_CHARS`] characters; `None` while no
    /// result is in the history.
    pub output_excerpt: Option<String>,
    /// The tool reported an error (or the call was declined or failed).
    pub is_error: bool,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Who wrote it.
    pub role: Role,
    /// The display name: the chat senders of a runner prompt (`John, Jane`), else `None`.
    pub sender: Option<String>,
    /// The text (may be empty when the entry only holds tool calls).
    pub text: String,
    /// Tool calls made after the text, in order.
    pub tool_calls: Vec<ToolCallSummary>,
    /// When the CLI recorded it.
    pub at: Option<DateTime<Utc>>,
    /// The id of the last CLI record merged into this entry (Claude line uuid, Codex item id,
    /// OpenCode message id): what the store's end marker remembers.
    pub id: Option<String>,
    /// This entry marks a context compaction: what came before was summarised.
    pub compaction: bool,
}

impl Entry {
    /// An entry with just a role and text.
    pub fn new(role: Role, text: impl Into<String>) -> Self {
        Self {
            role,
            sender: None,
            text: text.into(),
            tool_calls: Vec::new(),
            at: None,
            id: None,
            compaction: false,
        }
    }
}

/// A conversation read from a CLI's history.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Transcript {
    /// The CLI's session or thread id.
    pub session_id: String,
    /// `claude`, `codex` or `opencode`.
    pub provider: String,
    /// A title the CLI gave the conversation, if any.
    pub title: Option<String>,
    /// The messages, oldest first.
    pub entries: Vec<Entry>,
}

impl Transcript {
    /// Whether there is nothing to archive.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether entry `id` is here whole: entries merge (an answer takes the steps and tool
    /// calls after it), so an entry read from part of a history is only known whole when
    /// another entry comes before it. Readers of the newest part of a history read further
    /// back until this holds.
    pub fn holds_whole(&self, id: &str) -> bool {
        self.entries
            .iter()
            .rposition(|e| e.id.as_deref() == Some(id))
            .is_some_and(|i| i > 0)
    }

    /// The part from the last compaction marker on (everything when there is none): what an
    /// earlier PreCompact hook has not archived yet. The marker and the summary after it stay,
    /// as context.
    pub fn since_last_compaction(&self) -> Transcript {
        let start = self.entries.iter().rposition(|e| e.compaction).unwrap_or(0);
        Transcript {
            entries: self.entries[start..].to_vec(),
            ..self.clone()
        }
    }

    /// The text the title and the file name come from: the title, else the first chat message
    /// of the first user entry (see `prompt_text`).
    pub fn headline(&self) -> Option<String> {
        if let Some(title) = self
            .title
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            return Some(title.to_owned());
        }
        self.entries
            .iter()
            .filter(|e| e.role == Role::User)
            .map(|e| prompt_text(&e.text))
            .find(|t| !t.is_empty())
    }
}

/// The human text of a prompt: for the runner's XML (docs/contract/prompt.md) the text content
/// of the first `<message>` element, without quoted messages and attachment notes; otherwise the
/// text with every tag removed. Entities are decoded and whitespace collapsed.
pub fn prompt_text(prompt: &str) -> String {
    let body = prompt_xml::element_content(prompt, "message").unwrap_or(prompt);
    let mut text = body.to_owned();
    while let Some(quote) = Scanner::new(&text).first_element(0, "quoted_message") {
        text.replace_range(quote.open.start..quote.end, " ");
    }
    let stripped = prompt_xml::strip_tags(&text);
    let kept: Vec<&str> = stripped
        .lines()
        .map(str::trim)
        .filter(|l| !(l.starts_with('[') && l.ends_with(']')))
        .collect();
    one_line(&prompt_xml::unescape(&kept.join("\n")), 400)
}

/// The chat senders of a runner prompt (`sender="…"` of each `<message>`), in order, without
/// repeats, joined with `, `.
fn prompt_senders(prompt: &str) -> Option<String> {
    let scanner = Scanner::new(prompt);
    let mut names: Vec<String> = Vec::new();
    let mut pos = 0;
    while let Some(tag) = scanner.find_start(pos, "message") {
        if let Some(name) = prompt_xml::attribute(scanner.tag_text(&tag), "sender") {
            if !name.is_empty() && !names.contains(&name) {
                names.push(name);
            }
        }
        pos = tag.end;
    }
    (!names.is_empty()).then(|| names.join(", "))
}

/// Whitespace runs collapsed to one space, at most `max` characters (`…` marks a cut).
pub fn one_line(text: &str, max: usize) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match joined.char_indices().nth(max.saturating_sub(1)) {
        Some((cut, _)) if joined.chars().count() > max => format!("{}…", &joined[..cut]),
        _ => joined,
    }
}

/// A JSON value as a one-line excerpt: a string as itself, anything else as compact JSON.
pub fn value_excerpt(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => one_line(s, TOOL_EXCERPT_CHARS),
        other => one_line(&other.to_string(), TOOL_EXCERPT_CHARS),
    }
}

/// Collects entries: assistant text and tool calls merge into the current assistant entry in
/// order (text after a tool call starts a new entry, so the order survives), tool results find
/// their call by id.
#[derive(Default)]
pub struct Builder {
    /// The entries collected so far, in order.
    pub entries: Vec<Entry>,
    calls: HashMap<String, (usize, usize)>,
}

impl Builder {
    /// A user prompt (the runner's XML, read back into text and senders).
    pub fn user(&mut self, text: &str, at: Option<DateTime<Utc>>, id: Option<&str>) {
        if text.trim().is_empty() {
            return;
        }
        let mut entry = Entry::new(Role::User, text.trim());
        entry.sender = prompt_senders(text);
        self.push(entry, at, id);
    }

    /// A system entry (a compaction summary, a notice).
    pub fn system(
        &mut self,
        text: &str,
        at: Option<DateTime<Utc>>,
        id: Option<&str>,
        compaction: bool,
    ) {
        let mut entry = Entry::new(Role::System, text.trim());
        entry.compaction = compaction;
        self.push(entry, at, id);
    }

    /// Assistant text: joins the current assistant entry unless a tool call came after it.
    pub fn assistant(&mut self, text: &str, at: Option<DateTime<Utc>>, id: Option<&str>) {
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        if let Some(last) = self.entries.last_mut() {
            if last.role == Role::Assistant && last.tool_calls.is_empty() {
                last.text.push_str("\n\n");
                last.text.push_str(text);
                update_id(last, id);
                return;
            }
        }
        self.push(Entry::new(Role::Assistant, text), at, id);
    }

    /// A tool call of the current assistant entry.
    pub fn tool(
        &mut self,
        call_id: Option<&str>,
        call: ToolCallSummary,
        at: Option<DateTime<Utc>>,
        id: Option<&str>,
    ) {
        let index = match self.entries.last_mut() {
            Some(last) if last.role == Role::Assistant => {
                update_id(last, id);
                self.entries.len() - 1
            }
            _ => {
                self.push(Entry::new(Role::Assistant, ""), at, id);
                self.entries.len() - 1
            }
        };
        let entry = &mut self.entries[index];
        if let Some(call_id) = call_id {
            self.calls
                .insert(call_id.to_owned(), (index, entry.tool_calls.len()));
        }
        entry.tool_calls.push(call);
    }

    /// A tool's result, matched to its call by id.
    pub fn output(
        &mut self,
        call_id: &str,
        output: &str,
        is_error: bool,
        at: Option<DateTime<Utc>>,
        id: Option<&str>,
    ) {
        let excerpt = one_line(output, TOOL_EXCERPT_CHARS);
        if let Some(&(e, c)) = self.calls.get(call_id) {
            if let Some(entry) = self.entries.get_mut(e) {
                update_id(entry, id);
                if let Some(call) = entry.tool_calls.get_mut(c) {
                    call.output_excerpt = Some(excerpt);
                    call.is_error |= is_error;
                    return;
                }
            }
        }
        let mut entry = Entry::new(Role::Tool, "");
        entry.tool_calls.push(ToolCallSummary {
            name: format!("result of {call_id}"),
            input_excerpt: String::new(),
            output_excerpt: Some(excerpt),
            is_error,
        });
        self.push(entry, at, id);
    }

    fn push(&mut self, mut entry: Entry, at: Option<DateTime<Utc>>, id: Option<&str>) {
        entry.at = at;
        entry.id = id.map(str::to_owned);
        self.entries.push(entry);
    }
}

/// Makes `id` the entry's id (the last record merged into it), when there is one.
pub fn update_id(entry: &mut Entry, id: Option<&str>) {
    if let Some(id) = id {
        entry.id = Some(id.to_owned());
    }
}

/// A tool call with its input as an excerpt and no result yet.
pub fn summary(name: impl Into<String>, input: &Value) -> ToolCallSummary {
    ToolCallSummary {
        name: name.into(),
        input_excerpt: value_excerpt(input),
        output_excerpt: None,
        is_error: false,
    }
}

/// A time from Unix milliseconds.
pub fn millis(value: &Value) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(value.as_i64()?)
}

/// A time from Unix seconds.
pub fn seconds(value: &Value) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(value.as_i64()?, 0)
}

/// A time from an RFC 3339 string.
pub fn rfc3339(value: &Value) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(value.as_str()?)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// A string value, trimmed, when it is not empty.
pub fn nonempty(value: &Value) -> Option<String> {
    value
        .as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_text_takes_the_first_message() {
        let cases = [
            (
                "<context timezone=\"UTC\" />\n<messages>\n<message id=\"2\" sender=\"John\">Check &amp; fix</message>\n<message id=\"4\">second</message>\n</messages>",
                "Check & fix",
            ),
            (
                "<message id=\"4\" sender=\"Jane\" reply_to=\"2\">\n  <quoted_message from=\"John\">Check this PR</quoted_message>\nAlready on it\n[file available at: /workspace/downloads/msg-4/data.xlsx]</message>",
                "Already on it",
            ),
            ("<context timezone=\"UTC\" />\n<task time=\"x\">Script output:\n{}\n\nInstructions:\nWater the plants</task>", "Script output: {} Instructions: Water the plants"),
            ("plain text, no XML", "plain text, no XML"),
            ("<messages-not-a-message>hi</messages-not-a-message>", "hi"),
        ];
        for (prompt, want) in cases {
            assert_eq!(prompt_text(prompt), want, "{prompt:?}");
        }
        assert_eq!(
            prompt_senders("<message sender=\"A &amp; B\">x</message><message sender=\"C\">y</message><message sender=\"A &amp; B\">z</message>"),
            Some("A & B, C".into())
        );
    }
}
