//! Transcript archiving (issue 5): the conversation, written as Markdown to
//! `/workspace/agent/conversations/<YYYY-MM-DD>-<slug>.md`, never overwriting an earlier archive.
//!
//! The module has three layers, all plain functions:
//!
//! * a small model ([`Transcript`], [`Entry`], [`ToolCallSummary`]) and three tolerant parsers
//!   of the history each CLI keeps: [`from_claude_jsonl`] (the session file Claude writes,
//!   `$HOME/.claude/projects/<cwd>/<id>.jsonl`), [`from_codex_thread`] (the result of
//!   `codex app-server`'s `thread/read`) and [`from_opencode_messages`] (`opencode serve`'s
//!   `GET /session/{id}/message`). Unknown record shapes are skipped, never an error;
//! * [`render_markdown`]: a header (title, provider, session id, archive time), then one
//!   `### <sender> — <time>` section per speaker change, long messages truncated
//!   ([`RenderOptions::max_message_chars`]), tool calls summarised as
//!   `- 🔧 name(input) → output` bullets ([`TOOL_EXCERPT_CHARS`] each side);
//! * the writers: [`write_archive`] always creates a NEW file (`<date>-<slug>.md`, then
//!   `-2`, `-3`, …; created atomically with its whole content, so a reader never sees half a
//!   file and an existing archive is never replaced), and [`archive_new_entries`] writes only
//!   what earlier archives of the same session do not hold yet.
//!
//! # How each provider uses it
//!
//! * **Claude**: before Claude compacts its context, its `PreCompact` hook runs
//!   `agent-runner archive-hook`, which reads the hook JSON on stdin (`session_id`,
//!   `transcript_path`, `trigger`, …), parses the transcript file with [`from_claude_jsonl`],
//!   keeps [`Transcript::since_last_compaction`] (the part an earlier PreCompact has not
//!   archived yet) and calls [`write_archive`]. The provider only passes the hook in `--settings`:
//!   [`claude_precompact_hooks`] is the value of the `"hooks"` key (the slot
//!   `provider/src/claude/command.rs` keeps for it), [`claude_hook_settings`] the whole
//!   `--settings` object, e.g.
//!   `{"hooks":{"PreCompact":[{"matcher":"","hooks":[{"type":"command","command":"'/usr/local/bin/agent-runner' archive-hook --conversations-dir '/workspace/agent/conversations' --timezone 'UTC'"}]}]}}`.
//!   The hook never fails noisily: any problem is printed on stderr and it exits 0, so
//!   compaction always goes ahead.
//! * **Codex**: after a query ends (`turn/completed`), send `thread/read` with
//!   [`codex_thread_read_params`], parse the result with [`from_codex_thread`] and call
//!   [`archive_new_entries`].
//! * **OpenCode**: after a query ends (`session.idle`), `GET` [`opencode_messages_path`], parse
//!   the array with [`from_opencode_messages`] and call [`archive_new_entries`].
//!
//! [`archive_new_entries`] is for archiving after every query: it finds the newest archive of
//! the same session in the folder (its first line records provider and session id), reads the
//! marker at its end (the id of the last entry archived) and writes only the entries after it:
//! appended to today's archive of that session when there is one (appending never loses what
//! is there), otherwise into a new file made by the same rules as [`write_archive`]. A marker
//! whose entry is no longer in the history archives everything again: a duplicate rather than
//! a loss. Archiving is a side job: log its error and carry on, never fail the query.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use serde_json::{json, Value};

/// Default limit of one message's text in the archive; the rest is replaced by a
/// `[… N more characters]` note.
pub const MAX_MESSAGE_CHARS: usize = 4_000;

/// Limit of a tool call's input and of its output excerpt, in characters.
pub const TOOL_EXCERPT_CHARS: usize = 200;

/// Longest file-name slug, in characters.
pub const MAX_SLUG_CHARS: usize = 50;

/// The slug when neither the title nor a user message gives one.
pub const FALLBACK_SLUG: &str = "conversation";

/// First line of every archive: `<!-- nanoclaw-archive {"provider":…,"session":…} -->`.
const HEADER_MARKER: &str = "<!-- nanoclaw-archive ";

/// Closes every archive write: `<!-- nanoclaw-archive-through {"entry":…} -->`.
const THROUGH_MARKER: &str = "<!-- nanoclaw-archive-through ";

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
    /// OpenCode message id): what [`archive_new_entries`] remembers.
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
    /// of the first user entry (see [`prompt_text`]).
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

/// How [`render_markdown`] formats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderOptions {
    /// Times are shown, and the file name's date taken, in this zone.
    pub tz: Tz,
    /// The archive time shown in the header.
    pub archived_at: DateTime<Utc>,
    /// Heading of the agent's entries (default `Assistant`).
    pub assistant_name: Option<String>,
    /// Longer texts are truncated with a `[… N more characters]` note.
    pub max_message_chars: usize,
}

impl RenderOptions {
    /// Defaults for an archive written at `archived_at` in `tz`.
    pub fn new(tz: Tz, archived_at: DateTime<Utc>) -> Self {
        Self {
            tz,
            archived_at,
            assistant_name: None,
            max_message_chars: MAX_MESSAGE_CHARS,
        }
    }

    fn local(&self, at: DateTime<Utc>) -> String {
        self.tz
            .from_utc_datetime(&at.naive_utc())
            .format("%Y-%m-%d %H:%M")
            .to_string()
    }

    fn date(&self) -> String {
        self.tz
            .from_utc_datetime(&self.archived_at.naive_utc())
            .format("%Y-%m-%d")
            .to_string()
    }

    fn speaker(&self, entry: &Entry) -> String {
        if let Some(sender) = entry.sender.as_deref().filter(|s| !s.is_empty()) {
            return sender.to_owned();
        }
        match (entry.role, self.assistant_name.as_deref()) {
            (Role::Assistant, Some(name)) if !name.is_empty() => name.to_owned(),
            (role, _) => role.label().to_owned(),
        }
    }
}

/// An IANA zone name (`TZ`, a leading `:` allowed) or UTC, with a warning, when it is unknown.
pub fn parse_tz(name: &str) -> Tz {
    let name = name.trim().trim_start_matches(':');
    match name.parse::<Tz>() {
        Ok(tz) => tz,
        Err(_) => {
            if !name.is_empty() {
                tracing::warn!(timezone = name, "unknown time zone; archiving in UTC");
            }
            Tz::UTC
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------

/// The whole archive: header, entries, and the closing marker [`archive_new_entries`] reads.
pub fn render_markdown(transcript: &Transcript, opts: &RenderOptions) -> String {
    let mut out = String::new();
    let meta = json!({"provider": transcript.provider, "session": transcript.session_id});
    let _ = writeln!(out, "{HEADER_MARKER}{meta} -->");
    let title = transcript
        .headline()
        .map(|h| one_line(&h, 100))
        .unwrap_or_else(|| "Conversation".to_owned());
    let _ = writeln!(out, "# {title}\n");
    let _ = writeln!(out, "- Provider: {}", transcript.provider);
    let _ = writeln!(out, "- Session: {}", transcript.session_id);
    let _ = writeln!(
        out,
        "- Archived: {} ({})",
        opts.local(opts.archived_at),
        opts.tz.name()
    );
    if let Some(first) = transcript.entries.iter().find_map(|e| e.at) {
        let _ = writeln!(out, "- Started: {}", opts.local(first));
    }
    out.push_str("\n---\n");
    out.push_str(&render_entries(&transcript.entries, opts));
    out
}

/// The entries and the closing marker, for a new archive or for appending to one.
fn render_entries(entries: &[Entry], opts: &RenderOptions) -> String {
    let mut out = String::new();
    let mut previous: Option<(Role, String)> = None;
    for entry in entries {
        let speaker = opts.speaker(entry);
        let same = previous
            .as_ref()
            .is_some_and(|(r, s)| *r == entry.role && *s == speaker);
        if !same || entry.compaction {
            let at = entry
                .at
                .map(|at| format!(" — {}", opts.local(at)))
                .unwrap_or_default();
            let _ = write!(out, "\n### {speaker}{at}\n");
        }
        previous = Some((entry.role, speaker));
        let text = entry.text.trim();
        if !text.is_empty() {
            let (body, more) = truncate(text, opts.max_message_chars);
            if entry.role == Role::User && body.starts_with('<') {
                let fence = fence_for(body);
                let _ = write!(out, "\n{fence}xml\n{body}\n{fence}\n");
            } else {
                let _ = write!(out, "\n{body}\n");
            }
            if more > 0 {
                let _ = write!(out, "\n[… {more} more characters]\n");
            }
        }
        if !entry.tool_calls.is_empty() {
            out.push('\n');
            for call in &entry.tool_calls {
                let _ = write!(out, "- 🔧 {}({})", call.name, call.input_excerpt);
                match (&call.output_excerpt, call.is_error) {
                    (Some(output), true) => {
                        let _ = write!(out, " → ❌ {output}");
                    }
                    (None, true) => out.push_str(" → ❌"),
                    (Some(output), false) => {
                        let _ = write!(out, " → {output}");
                    }
                    (None, false) => {}
                }
                out.push('\n');
            }
        }
    }
    if let Some(id) = entries
        .last()
        .and_then(|e| e.id.as_deref())
        .filter(|id| !id.contains("--"))
    {
        let _ = writeln!(out, "\n{THROUGH_MARKER}{} -->", json!({ "entry": id }));
    }
    out
}

/// A code fence longer than any backtick run in `text`.
fn fence_for(text: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    "`".repeat(longest.max(2) + 1)
}

/// The first `max` characters and how many were left out.
fn truncate(text: &str, max: usize) -> (&str, usize) {
    match text.char_indices().nth(max) {
        Some((cut, _)) => (&text[..cut], text[cut..].chars().count()),
        None => (text, 0),
    }
}

/// Whitespace runs collapsed to one space, at most `max` characters (`…` marks a cut).
fn one_line(text: &str, max: usize) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match joined.char_indices().nth(max.saturating_sub(1)) {
        Some((cut, _)) if joined.chars().count() > max => format!("{}…", &joined[..cut]),
        _ => joined,
    }
}

/// A JSON value as a one-line excerpt: a string as itself, anything else as compact JSON.
fn value_excerpt(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => one_line(s, TOOL_EXCERPT_CHARS),
        other => one_line(&other.to_string(), TOOL_EXCERPT_CHARS),
    }
}

// ---------------------------------------------------------------------------------------------
// Slugs and the runner's prompt XML
// ---------------------------------------------------------------------------------------------

/// A file-name slug: lowercase ASCII letters and digits, words joined by `-`, at most
/// [`MAX_SLUG_CHARS`] (cut at a word boundary when one is near), [`FALLBACK_SLUG`] when
/// nothing is left.
pub fn slug(text: &str) -> String {
    let mut slug = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    if slug.len() > MAX_SLUG_CHARS {
        let cut = &slug[..=MAX_SLUG_CHARS];
        slug = match cut.rfind('-') {
            Some(dash) if dash >= MAX_SLUG_CHARS / 2 => cut[..dash].to_owned(),
            _ => slug[..MAX_SLUG_CHARS].to_owned(),
        };
    }
    let slug = slug.trim_matches('-');
    if slug.is_empty() {
        FALLBACK_SLUG.to_owned()
    } else {
        slug.to_owned()
    }
}

/// The human text of a prompt: for the runner's XML (SPEC §6) the text content of the first
/// `<message>` element, without quoted messages and attachment notes; otherwise the text with
/// every tag removed. Entities are decoded and whitespace collapsed.
pub fn prompt_text(prompt: &str) -> String {
    let body = first_element(prompt, "message").unwrap_or(prompt);
    let mut text = body.to_owned();
    while let Some(inner) = first_element_span(&text, "quoted_message") {
        text.replace_range(inner, " ");
    }
    let stripped = strip_tags(&text);
    let kept: Vec<&str> = stripped
        .lines()
        .map(str::trim)
        .filter(|l| !(l.starts_with('[') && l.ends_with(']')))
        .collect();
    one_line(&decode_entities(&kept.join("\n")), 400)
}

/// The chat senders of a runner prompt (`sender="…"` of each `<message>`), in order, without
/// repeats, joined with `, `.
fn prompt_senders(prompt: &str) -> Option<String> {
    let mut names: Vec<String> = Vec::new();
    let mut rest = prompt;
    while let Some(start) = rest.find("<message ") {
        let tag_end = rest[start..]
            .find('>')
            .map(|i| start + i)
            .unwrap_or(rest.len());
        let tag = &rest[start..tag_end];
        if let Some(name) = attribute(tag, "sender") {
            let name = decode_entities(name);
            if !name.is_empty() && !names.contains(&name) {
                names.push(name);
            }
        }
        rest = &rest[tag_end..];
    }
    (!names.is_empty()).then(|| names.join(", "))
}

/// The value of `name="…"` in a start tag.
fn attribute<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    let len = tag[start..].find('"')?;
    Some(&tag[start..start + len])
}

/// The content of the first `<name …>…</name>` element.
fn first_element<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let open = find_start_tag(text, name)?;
    let content_start = open + text[open..].find('>')? + 1;
    let close = format!("</{name}>");
    let len = text[content_start..]
        .find(&close)
        .unwrap_or(text.len() - content_start);
    Some(&text[content_start..content_start + len])
}

/// The byte range of the first whole `<name …>…</name>` element.
fn first_element_span(text: &str, name: &str) -> Option<std::ops::Range<usize>> {
    let open = find_start_tag(text, name)?;
    let close = format!("</{name}>");
    let end = text[open..]
        .find(&close)
        .map(|i| open + i + close.len())
        .unwrap_or(text.len());
    Some(open..end)
}

/// Where `<name>` or `<name ` starts.
fn find_start_tag(text: &str, name: &str) -> Option<usize> {
    let needle = format!("<{name}");
    let mut from = 0;
    while let Some(i) = text[from..].find(&needle) {
        let at = from + i;
        match text[at + needle.len()..].chars().next() {
            Some(' ' | '>' | '/' | '\n' | '\t') => return Some(at),
            _ => from = at + needle.len(),
        }
    }
    None
}

/// Every `<…>` removed (each replaced by a space).
fn strip_tags(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_tag = false;
    for c in text.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                out.push(' ');
            }
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out
}

/// The XML entities the runner escapes (`&amp; &lt; &gt; &quot; &apos; &#39;`).
fn decode_entities(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

// ---------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------

/// Writes the transcript into a NEW file `<dir>/<YYYY-MM-DD in tz>-<slug>.md` (`-2`, `-3`, …
/// when the name is taken: an existing archive is never replaced) and returns its path. The
/// folder is created when missing. The file appears atomically with its whole content. An
/// empty transcript still gets a file (header only): callers skip those.
pub fn write_archive(
    dir: &Path,
    transcript: &Transcript,
    now: DateTime<Utc>,
    tz: Tz,
) -> io::Result<PathBuf> {
    write_archive_with(dir, transcript, &RenderOptions::new(tz, now))
}

/// [`write_archive`] with explicit rendering options.
pub fn write_archive_with(
    dir: &Path,
    transcript: &Transcript,
    opts: &RenderOptions,
) -> io::Result<PathBuf> {
    let text = render_markdown(transcript, opts);
    let stem = format!(
        "{}-{}",
        opts.date(),
        slug(&transcript.headline().unwrap_or_default())
    );
    create_new_file(dir, &stem, text.as_bytes())
}

/// Archives the entries no earlier archive of this session holds (see the module docs):
/// appended to today's archive of the session when there is one, else in a new file. Returns
/// the file written, or `None` when there was nothing new.
pub fn archive_new_entries(
    dir: &Path,
    transcript: &Transcript,
    opts: &RenderOptions,
) -> io::Result<Option<PathBuf>> {
    if transcript.entries.is_empty() {
        return Ok(None);
    }
    let archives = session_archives(dir, transcript)?;
    let mut start = 0;
    if let Some(latest) = archives.iter().max_by_key(|a| (a.modified, a.path.clone())) {
        match last_marker(&latest.path)? {
            Some(id) => match transcript
                .entries
                .iter()
                .rposition(|e| e.id.as_deref() == Some(id.as_str()))
            {
                Some(i) => start = i + 1,
                None => tracing::warn!(
                    archive = %latest.path.display(),
                    entry = %id,
                    "the last archived entry is not in the history any more; archiving all of it"
                ),
            },
            None => tracing::warn!(
                archive = %latest.path.display(),
                "the session's last archive has no end marker; archiving the whole history"
            ),
        }
    }
    let new = &transcript.entries[start..];
    if new.is_empty() {
        return Ok(None);
    }
    let date = opts.date();
    let today = archives
        .iter()
        .filter(|a| {
            a.path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{date}-")))
        })
        .max_by_key(|a| (a.modified, a.path.clone()));
    if let Some(today) = today {
        // Through fsguard: an agent can replace an archive with a link to the session DB.
        let mut file = fsguard::open_with(&today.path, fsguard::Access::Append)?;
        file.write_all(render_entries(new, opts).as_bytes())?;
        file.sync_all()?;
        return Ok(Some(today.path.clone()));
    }
    let part = Transcript {
        entries: new.to_vec(),
        ..transcript.clone()
    };
    write_archive_with(dir, &part, opts).map(Some)
}

/// An archive file of one session.
struct SessionArchive {
    path: PathBuf,
    modified: std::time::SystemTime,
}

/// The `.md` files in `dir` whose first line names this provider and session.
fn session_archives(dir: &Path, transcript: &Transcript) -> io::Result<Vec<SessionArchive>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("md") {
            continue;
        }
        let Some((provider, session)) = read_header(&path) else {
            continue;
        };
        if provider == transcript.provider && session == transcript.session_id {
            let modified = entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            found.push(SessionArchive { path, modified });
        }
    }
    Ok(found)
}

/// Provider and session from an archive's first line.
fn read_header(path: &Path) -> Option<(String, String)> {
    use std::io::Read as _;
    let mut head = Vec::with_capacity(1024);
    fsguard::open(path)
        .ok()?
        .take(4096)
        .read_to_end(&mut head)
        .ok()?;
    let head = String::from_utf8_lossy(&head);
    let line = head.lines().next()?;
    let meta: Value =
        serde_json::from_str(line.strip_prefix(HEADER_MARKER)?.strip_suffix(" -->")?).ok()?;
    Some((
        meta["provider"].as_str()?.to_owned(),
        meta["session"].as_str()?.to_owned(),
    ))
}

/// The entry id of the last end marker in an archive.
fn last_marker(path: &Path) -> io::Result<Option<String>> {
    let text = fsguard::read_to_string(path)?;
    Ok(text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(THROUGH_MARKER)?.strip_suffix(" -->"))
        .and_then(|json| serde_json::from_str::<Value>(json).ok())
        .and_then(|v| v["entry"].as_str().map(str::to_owned)))
}

/// Creates `<dir>/<stem>.md`, or `<stem>-2.md`, … when taken, holding `content`. The content
/// goes to a temporary file first, which is then hard-linked to the final name: the link fails
/// when the name exists (never replacing it) and the file appears complete. Where hard links
/// are not supported, the final name is opened with `create_new` and written directly.
fn create_new_file(dir: &Path, stem: &str, content: &[u8]) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let nanos = Utc::now().timestamp_nanos_opt().unwrap_or_default();
    let tmp = dir.join(format!(".{stem}.{}.{nanos}.tmp", std::process::id()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        file.write_all(content)?;
        file.sync_all()?;
        drop(file);
        let mut link_works = true;
        for n in 1..=10_000u32 {
            let name = if n == 1 {
                format!("{stem}.md")
            } else {
                format!("{stem}-{n}.md")
            };
            let path = dir.join(name);
            if link_works {
                match std::fs::hard_link(&tmp, &path) {
                    Ok(()) => return Ok(path),
                    Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
                    Err(err) => {
                        tracing::debug!(error = %err, "hard link failed; writing the archive in place");
                        link_works = false;
                    }
                }
            }
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut file) => {
                    file.write_all(content)?;
                    file.sync_all()?;
                    return Ok(path);
                }
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(err) => return Err(err),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("every name for {stem} is taken"),
        ))
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

// ---------------------------------------------------------------------------------------------
// Building entries
// ---------------------------------------------------------------------------------------------

/// Collects entries: assistant text and tool calls merge into the current assistant entry in
/// order (text after a tool call starts a new entry, so the order survives), tool results find
/// their call by id.
#[derive(Default)]
struct Builder {
    entries: Vec<Entry>,
    calls: HashMap<String, (usize, usize)>,
}

impl Builder {
    fn user(&mut self, text: &str, at: Option<DateTime<Utc>>, id: Option<&str>) {
        if text.trim().is_empty() {
            return;
        }
        let mut entry = Entry::new(Role::User, text.trim());
        entry.sender = prompt_senders(text);
        self.push(entry, at, id);
    }

    fn system(
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

    fn assistant(&mut self, text: &str, at: Option<DateTime<Utc>>, id: Option<&str>) {
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

    fn tool(
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

    fn output(
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

fn update_id(entry: &mut Entry, id: Option<&str>) {
    if let Some(id) = id {
        entry.id = Some(id.to_owned());
    }
}

fn summary(name: impl Into<String>, input: &Value) -> ToolCallSummary {
    ToolCallSummary {
        name: name.into(),
        input_excerpt: value_excerpt(input),
        output_excerpt: None,
        is_error: false,
    }
}

fn millis(value: &Value) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(value.as_i64()?)
}

fn seconds(value: &Value) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(value.as_i64()?, 0)
}

fn rfc3339(value: &Value) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(value.as_str()?)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn nonempty(value: &Value) -> Option<String> {
    value
        .as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

// ---------------------------------------------------------------------------------------------
// Claude
// ---------------------------------------------------------------------------------------------

/// Where Claude keeps a session: `<home>/.claude/projects/<cwd, every character but ASCII
/// letters and digits replaced by ->/<session id>.jsonl` (PROTOCOLS §1.4; the hook also passes
/// it as `transcript_path`).
pub fn claude_transcript_path(home: &Path, cwd: &Path, session_id: &str) -> PathBuf {
    let project: String = cwd
        .to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    home.join(".claude")
        .join("projects")
        .join(project)
        .join(format!("{session_id}.jsonl"))
}

/// The `"hooks"` value of Claude's `--settings` that archives before each compaction:
/// `{"PreCompact":[{"matcher":"","hooks":[{"type":"command","command":"'<runner>' archive-hook
/// --conversations-dir '<dir>' --timezone '<tz>'"}]}]}`.
pub fn claude_precompact_hooks(
    runner_exe: &Path,
    conversations_dir: &Path,
    timezone: &str,
) -> Value {
    let command = format!(
        "{} archive-hook --conversations-dir {} --timezone {}",
        shell_quote(&runner_exe.to_string_lossy()),
        shell_quote(&conversations_dir.to_string_lossy()),
        shell_quote(timezone),
    );
    json!({"PreCompact": [{"matcher": "", "hooks": [{"type": "command", "command": command}]}]})
}

/// A whole `--settings` object holding just [`claude_precompact_hooks`].
pub fn claude_hook_settings(runner_exe: &Path, conversations_dir: &Path, timezone: &str) -> Value {
    json!({"hooks": claude_precompact_hooks(runner_exe, conversations_dir, timezone)})
}

/// `'text'` for `sh`.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Parses the session file Claude writes (one JSON record per line). Kept: user prompts
/// (including follow-ups folded into a running turn, recorded as `queued_command` attachments),
/// assistant text and tool calls with their results, compaction boundaries and summaries,
/// interruptions, slash commands. Skipped: meta and sidechain records, thinking, attachments,
/// bookkeeping lines, anything unknown.
pub fn from_claude_jsonl(text: &str) -> Transcript {
    let mut transcript = Transcript {
        provider: "claude".into(),
        ..Transcript::default()
    };
    let mut b = Builder::default();
    for line in text.lines() {
        let Ok(record) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if transcript.session_id.is_empty() {
            if let Some(id) =
                nonempty(&record["sessionId"]).or_else(|| nonempty(&record["session_id"]))
            {
                transcript.session_id = id;
            }
        }
        if record["isSidechain"] == Value::Bool(true) {
            continue;
        }
        let at = rfc3339(&record["timestamp"]);
        let id = record["uuid"].as_str();
        match record["type"].as_str().unwrap_or_default() {
            "summary" => {
                transcript.title = nonempty(&record["summary"]).or(transcript.title.take())
            }
            "custom-title" | "ai-title" => {
                if let Some(title) = ["customTitle", "aiTitle", "title"]
                    .iter()
                    .find_map(|k| nonempty(&record[*k]))
                {
                    transcript.title = Some(title);
                }
            }
            "user" => claude_user(&mut b, &record, at, id),
            // One record per content block: the builder merges them in order.
            "assistant" => claude_assistant(&mut b, &record, at, id),
            "attachment" => {
                let attachment = &record["attachment"];
                if attachment["type"] == "queued_command"
                    && attachment["commandMode"]
                        .as_str()
                        .is_none_or(|m| m == "prompt")
                {
                    let prompt = claude_text(&attachment["prompt"]);
                    b.user(
                        &prompt,
                        at.or_else(|| rfc3339(&attachment["timestamp"])),
                        id,
                    );
                }
            }
            "system" if record["subtype"] == "compact_boundary" => {
                let meta = &record["compactMetadata"];
                let mut text = "Conversation compacted".to_owned();
                let trigger = meta["trigger"].as_str();
                let tokens = meta["preTokens"].as_u64();
                match (trigger, tokens) {
                    (Some(t), Some(n)) => text.push_str(&format!(" ({t}, {n} tokens before)")),
                    (Some(t), None) => text.push_str(&format!(" ({t})")),
                    (None, Some(n)) => text.push_str(&format!(" ({n} tokens before)")),
                    (None, None) => {}
                }
                b.system(&text, at, id, true);
            }
            _ => {}
        }
    }
    transcript.entries = b.entries;
    transcript
}

fn claude_user(b: &mut Builder, record: &Value, at: Option<DateTime<Utc>>, id: Option<&str>) {
    if record["isMeta"] == Value::Bool(true) {
        return;
    }
    let content = &record["message"]["content"];
    if record["isCompactSummary"] == Value::Bool(true) {
        let summary = claude_text(content);
        match b.entries.last_mut() {
            Some(last) if last.compaction && last.role == Role::System => {
                last.text.push_str("\n\n");
                last.text.push_str(summary.trim());
                update_id(last, id);
            }
            _ => b.system(&summary, at, id, false),
        }
        return;
    }
    if let Some(text) = content.as_str() {
        claude_user_text(b, text, at, id);
        return;
    }
    let Some(blocks) = content.as_array() else {
        return;
    };
    let mut texts = Vec::new();
    for block in blocks {
        match block["type"].as_str().unwrap_or_default() {
            "text" => texts.push(block["text"].as_str().unwrap_or_default().to_owned()),
            "image" => texts.push("[image]".to_owned()),
            "document" => texts.push("[document]".to_owned()),
            "tool_result" => {
                let call_id = block["tool_use_id"].as_str().unwrap_or_default();
                let output = claude_text(&block["content"]);
                let is_error = block["is_error"] == Value::Bool(true);
                b.output(call_id, &output, is_error, at, id);
            }
            _ => {}
        }
    }
    let text = texts.join("\n\n");
    if !text.trim().is_empty() {
        claude_user_text(b, &text, at, id);
    }
}

/// A user text: a prompt, or one of the CLI's own notes (interruptions, slash commands).
fn claude_user_text(b: &mut Builder, text: &str, at: Option<DateTime<Utc>>, id: Option<&str>) {
    let trimmed = text.trim();
    if trimmed.starts_with("[Request interrupted by user") {
        b.system("Interrupted", at, id, false);
    } else if trimmed.starts_with("<local-command-caveat>") {
    } else if trimmed.starts_with("<command-name>") {
        let name = first_element(trimmed, "command-name")
            .unwrap_or_default()
            .trim();
        let args = first_element(trimmed, "command-args")
            .unwrap_or_default()
            .trim();
        let command = if args.is_empty() {
            name.to_owned()
        } else {
            format!("{name} {args}")
        };
        b.system(&format!("Command: {command}"), at, id, false);
    } else if trimmed.starts_with("<local-command-stdout>")
        || trimmed.starts_with("<local-command-stderr>")
    {
        let output = decode_entities(strip_tags(trimmed).trim());
        if !output.is_empty() {
            b.system(&output, at, id, false);
        }
    } else {
        b.user(trimmed, at, id);
    }
}

fn claude_assistant(b: &mut Builder, record: &Value, at: Option<DateTime<Utc>>, id: Option<&str>) {
    let content = &record["message"]["content"];
    if record["isApiErrorMessage"] == Value::Bool(true) {
        b.system(
            &format!("API error: {}", claude_text(content)),
            at,
            id,
            false,
        );
        return;
    }
    if let Some(text) = content.as_str() {
        b.assistant(text, at, id);
        return;
    }
    for block in content.as_array().map(Vec::as_slice).unwrap_or_default() {
        match block["type"].as_str().unwrap_or_default() {
            "text" => b.assistant(block["text"].as_str().unwrap_or_default(), at, id),
            "tool_use" | "server_tool_use" => {
                let name = block["name"].as_str().unwrap_or("tool");
                b.tool(block["id"].as_str(), summary(name, &block["input"]), at, id);
            }
            "web_search_tool_result" | "web_fetch_tool_result" => {
                let call_id = block["tool_use_id"].as_str().unwrap_or_default();
                b.output(call_id, &claude_text(&block["content"]), false, at, id);
            }
            _ => {}
        }
    }
}

/// Text of a string or of content blocks (`text` blocks joined, images as `[image]`).
fn claude_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|block| match block["type"].as_str() {
                Some("text") => block["text"].as_str().map(str::to_owned),
                Some("image") => Some("[image]".to_owned()),
                Some("document") => Some("[document]".to_owned()),
                None => block.as_str().map(str::to_owned),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Codex
// ---------------------------------------------------------------------------------------------

/// The params of the `thread/read` request whose result [`from_codex_thread`] parses.
pub fn codex_thread_read_params(thread_id: &str) -> Value {
    json!({"threadId": thread_id, "includeTurns": true})
}

/// Parses `codex app-server`'s `thread/read` result (`{thread: {id, name, turns: [{items}]}}`;
/// the bare thread object works too). Kept: user messages, agent messages, MCP tool calls,
/// commands, file changes, dynamic tool calls, web searches, plans, compactions, failed and
/// interrupted turns. Skipped: reasoning and anything unknown.
pub fn from_codex_thread(value: &Value) -> Transcript {
    let thread = if value["thread"].is_object() {
        &value["thread"]
    } else {
        value
    };
    let mut b = Builder::default();
    for turn in thread["turns"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let turn_at = seconds(&turn["startedAt"]);
        for item in turn["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let at = millis(&item["startedAtMs"]).or(turn_at);
            codex_item(&mut b, item, at);
        }
        let turn_id = turn["id"].as_str().unwrap_or_default();
        let end_at = seconds(&turn["completedAt"]).or(turn_at);
        match turn["status"].as_str() {
            Some("failed") => {
                let message = turn["error"]["message"].as_str().unwrap_or("unknown error");
                b.system(
                    &format!("Turn failed: {message}"),
                    end_at,
                    Some(&format!("{turn_id}:failed")),
                    false,
                );
            }
            Some("interrupted") => b.system(
                "Interrupted",
                end_at,
                Some(&format!("{turn_id}:interrupted")),
                false,
            ),
            _ => {}
        }
    }
    Transcript {
        session_id: thread["id"].as_str().unwrap_or_default().to_owned(),
        provider: "codex".into(),
        title: nonempty(&thread["name"]),
        entries: b.entries,
    }
}

fn codex_item(b: &mut Builder, item: &Value, at: Option<DateTime<Utc>>) {
    let id = item["id"].as_str();
    match item["type"].as_str().unwrap_or_default() {
        "userMessage" => {
            let parts: Vec<String> = item["content"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .filter_map(|input| match input["type"].as_str()? {
                    "text" => input["text"].as_str().map(str::to_owned),
                    "image" => Some("[image]".to_owned()),
                    "localImage" => Some(format!(
                        "[image: {}]",
                        input["path"].as_str().unwrap_or_default()
                    )),
                    _ => None,
                })
                .collect();
            b.user(&parts.join("\n\n"), at, id);
        }
        "agentMessage" => b.assistant(item["text"].as_str().unwrap_or_default(), at, id),
        "plan" => b.assistant(
            &format!("Plan:\n{}", item["text"].as_str().unwrap_or_default()),
            at,
            id,
        ),
        "mcpToolCall" => {
            let name = format!(
                "mcp__{}__{}",
                item["server"].as_str().unwrap_or_default(),
                item["tool"].as_str().unwrap_or_default()
            );
            b.tool(id, summary(name, &item["arguments"]), at, id);
            if let Some(message) = item["error"]["message"].as_str() {
                b.output(id.unwrap_or_default(), message, true, at, id);
            } else if item["result"].is_object() {
                let output = codex_content_text(&item["result"]["content"]);
                b.output(id.unwrap_or_default(), &output, codex_failed(item), at, id);
            } else if codex_failed(item) {
                b.output(id.unwrap_or_default(), "", true, at, id);
            }
        }
        "commandExecution" => {
            b.tool(id, summary("shell", &item["command"]), at, id);
            let failed = codex_failed(item) || item["exitCode"].as_i64().is_some_and(|c| c != 0);
            if let Some(output) = item["aggregatedOutput"].as_str() {
                b.output(id.unwrap_or_default(), output, failed, at, id);
            } else if failed {
                b.output(id.unwrap_or_default(), "", true, at, id);
            }
        }
        "fileChange" => {
            let files: Vec<String> = item["changes"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|c| {
                    let kind = c["kind"]["type"]
                        .as_str()
                        .or(c["kind"].as_str())
                        .unwrap_or("change");
                    format!("{kind} {}", c["path"].as_str().unwrap_or_default())
                })
                .collect();
            b.tool(
                id,
                summary("apply_patch", &Value::String(files.join(", "))),
                at,
                id,
            );
            let status = item["status"].as_str().unwrap_or_default();
            b.output(id.unwrap_or_default(), status, codex_failed(item), at, id);
        }
        "dynamicToolCall" => {
            let name = match item["namespace"].as_str() {
                Some(ns) => format!("{ns}.{}", item["tool"].as_str().unwrap_or_default()),
                None => item["tool"].as_str().unwrap_or("tool").to_owned(),
            };
            b.tool(id, summary(name, &item["arguments"]), at, id);
            let failed = codex_failed(item) || item["success"] == Value::Bool(false);
            if item["contentItems"].is_array() || failed {
                let output = codex_content_text(&item["contentItems"]);
                b.output(id.unwrap_or_default(), &output, failed, at, id);
            }
        }
        "functionCallOutput" => {
            let name = item["name"].as_str().unwrap_or("tool");
            b.tool(id, summary(name, &Value::Null), at, id);
            let output = match &item["output"] {
                Value::String(s) => s.clone(),
                other => codex_content_text(other),
            };
            b.output(id.unwrap_or_default(), &output, false, at, id);
        }
        "webSearch" => b.tool(id, summary("web_search", &item["query"]), at, id),
        "imageView" => b.tool(id, summary("view_image", &item["path"]), at, id),
        "contextCompaction" => b.system("Conversation compacted", at, id, true),
        "enteredReviewMode" => b.system("Review started", at, id, false),
        "exitedReviewMode" => b.system("Review finished", at, id, false),
        _ => {}
    }
}

fn codex_failed(item: &Value) -> bool {
    matches!(item["status"].as_str(), Some("failed" | "declined"))
}

/// Text of MCP/dynamic tool content items (`text`, `inputText`, `input_text`).
fn codex_content_text(content: &Value) -> String {
    content
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|c| match c["type"].as_str()? {
            "text" | "inputText" | "input_text" => c["text"].as_str().map(str::to_owned),
            "image" | "inputImage" | "input_image" => Some("[image]".to_owned()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------------------------
// OpenCode
// ---------------------------------------------------------------------------------------------

/// The path (under the server's base URL) whose JSON [`from_opencode_messages`] parses.
pub fn opencode_messages_path(session_id: &str) -> String {
    format!("/session/{session_id}/message")
}

/// Parses `opencode serve`'s `GET /session/{id}/message` (`[{info: {id, sessionID, role, time,
/// error?}, parts: [...]}]`). Kept: text parts (not `synthetic` or `ignored` ones), tool parts
/// with their state, file parts, compactions, message errors. Skipped: reasoning, step markers,
/// patches, snapshots, anything unknown. Consecutive steps of one answer become one section.
pub fn from_opencode_messages(value: &Value) -> Transcript {
    let messages = value
        .as_array()
        .or_else(|| value["messages"].as_array())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut b = Builder::default();
    let mut session_id = String::new();
    for message in messages {
        let info = &message["info"];
        if session_id.is_empty() {
            session_id = info["sessionID"].as_str().unwrap_or_default().to_owned();
        }
        let at = millis(&info["time"]["created"]);
        let id = info["id"].as_str();
        let role = info["role"].as_str().unwrap_or_default();
        let parts = message["parts"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        if role == "user" {
            let mut texts = Vec::new();
            for part in parts {
                if part["synthetic"] == Value::Bool(true) || part["ignored"] == Value::Bool(true) {
                    continue;
                }
                match part["type"].as_str().unwrap_or_default() {
                    "text" => texts.push(part["text"].as_str().unwrap_or_default().to_owned()),
                    "file" => texts.push(format!(
                        "[file: {}]",
                        part["filename"]
                            .as_str()
                            .or(part["url"].as_str())
                            .unwrap_or_default()
                    )),
                    "compaction" => b.system("Conversation compacted", at, id, true),
                    _ => {}
                }
            }
            b.user(&texts.join("\n\n"), at, id);
            continue;
        }
        if role != "assistant" {
            continue;
        }
        if info["summary"] == Value::Bool(true) {
            // The summary an OpenCode compaction writes.
            let text: Vec<&str> = parts.iter().filter_map(|p| p["text"].as_str()).collect();
            b.system(&format!("Summary:\n{}", text.join("\n\n")), at, id, false);
            continue;
        }
        for part in parts {
            let part_at = millis(&part["time"]["start"]).or(at);
            match part["type"].as_str().unwrap_or_default() {
                "text" if part["synthetic"] != Value::Bool(true) => {
                    b.assistant(part["text"].as_str().unwrap_or_default(), part_at, id)
                }
                "tool" => {
                    let state = &part["state"];
                    let call_id = part["callID"].as_str().or(part["id"].as_str());
                    let name = part["tool"].as_str().unwrap_or("tool");
                    let started = millis(&state["time"]["start"]).or(at);
                    b.tool(call_id, summary(name, &state["input"]), started, id);
                    let call_id = call_id.unwrap_or_default();
                    match state["status"].as_str() {
                        Some("completed") => b.output(
                            call_id,
                            &value_excerpt(&state["output"]),
                            false,
                            started,
                            id,
                        ),
                        Some("error") => {
                            b.output(call_id, &value_excerpt(&state["error"]), true, started, id)
                        }
                        _ => {}
                    }
                }
                "file" => b.assistant(
                    &format!(
                        "[file: {}]",
                        part["filename"]
                            .as_str()
                            .or(part["url"].as_str())
                            .unwrap_or_default()
                    ),
                    part_at,
                    id,
                ),
                _ => {}
            }
        }
        if info["error"].is_object() {
            let error = &info["error"];
            let name = error["name"].as_str().unwrap_or("Error");
            let text = match error["data"]["message"].as_str() {
                Some(message) => format!("{name}: {message}"),
                None => name.to_owned(),
            };
            b.system(&text, millis(&info["time"]["completed"]).or(at), id, false);
        }
    }
    Transcript {
        session_id,
        provider: "opencode".into(),
        title: None,
        entries: b.entries,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use expect_test::{expect, Expect};

    use super::*;

    const CLAUDE: &str = include_str!("../tests/fixtures/archive/claude_session.jsonl");
    const CLAUDE_COMPACTED: &str =
        include_str!("../tests/fixtures/archive/claude_session_compacted.jsonl");
    const CLAUDE_HOOK: &str = include_str!("../tests/fixtures/archive/claude_precompact_hook.json");
    const CODEX: &str = include_str!("../tests/fixtures/archive/codex_thread_read.json");
    const OPENCODE: &str = include_str!("../tests/fixtures/archive/opencode_messages.json");

    fn codex() -> Transcript {
        from_codex_thread(&serde_json::from_str(CODEX).unwrap())
    }

    fn opencode() -> Transcript {
        from_opencode_messages(&serde_json::from_str(OPENCODE).unwrap())
    }

    /// One line per entry, one per tool call.
    fn outline(t: &Transcript) -> String {
        let mut out = format!("{} {} title={:?}\n", t.provider, t.session_id, t.title);
        for e in &t.entries {
            let at =
                e.at.map(|at| at.format("%H:%M:%S%.3f").to_string())
                    .unwrap_or_default();
            let sender = e
                .sender
                .as_deref()
                .map(|s| format!(" [{s}]"))
                .unwrap_or_default();
            let compaction = if e.compaction { " COMPACTION" } else { "" };
            let id = e.id.as_deref().unwrap_or("-");
            let _ = writeln!(
                out,
                "{:?}{sender} {at} {id}{compaction}: {}",
                e.role,
                one_line(&e.text, 70)
            );
            for c in &e.tool_calls {
                let error = if c.is_error { " ERROR" } else { "" };
                let _ = writeln!(
                    out,
                    "  🔧 {}({}) → {:?}{error}",
                    c.name,
                    one_line(&c.input_excerpt, 60),
                    c.output_excerpt
                );
            }
        }
        out
    }

    fn check(t: &Transcript, expect: Expect) {
        expect.assert_eq(&outline(t));
    }

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn opts(tz: &str, max: usize) -> RenderOptions {
        RenderOptions {
            max_message_chars: max,
            ..RenderOptions::new(tz.parse().unwrap(), at("2026-11-21T20:30:00Z"))
        }
    }

    #[test]
    fn claude_session_file_parses() {
        check(
            &from_claude_jsonl(CLAUDE_COMPACTED),
            expect![[r#"
                claude 1c42be55-1c59-4cda-b3df-58149ba01880 title=None
                User [John, Jane] 12:17:45.025 4fcf039a-b57d-4ab2-a48c-95fa7d980f73: <context timezone="UTC" /> <messages> <message id="2" from="slack-mai…
                Assistant 12:17:45.589 ea287a2b-85b0-4a83-aa1c-da675667cbdf: 
                  🔧 mcp__nanoclaw__send_message({"text":"Hi team! Checking the build now."}) → Some("message sent")
                  🔧 Bash({"command":"sleep 2; echo build ok","description":"check th…) → Some("build ok")
                User [John] 12:17:46.446 871870a4-7278-4679-91be-2ba6c69021c0: <context timezone="UTC" /> <message id="6" sender="John" time="Feb 4,…
                Assistant 12:17:48.051 72921db0-b90b-47dc-b722-18cf03d036b5: The build is green: `echo build ok` printed build ok. All checks pass…
                User [Jane] 12:17:48.175 bcdfe0d1-b273-437c-b944-74ffea670bae: <context timezone="UTC" /> <message id="8" sender="Jane" time="Feb 4,…
                Assistant 12:17:48.245 5cff14ea-6c8e-42a2-b716-93a9d91f4f93: Nothing else for now.
                System 12:17:48.465 e0f896d0-de83-4584-80cc-347fbc6e8266 COMPACTION: Conversation compacted (manual, 15 tokens before) This session is bei…
                System 12:17:48.363 eda171c4-5789-496b-a928-95254d5ce99b: Command: /compact
                System 12:17:48.582 827e0501-18d5-4427-9968-390b1faa3542: Compacted PreCompact [tee /tmp/archive-claude-4tb17a59/hook.json | py…
            "#]],
        );
    }

    #[test]
    fn claude_since_last_compaction_keeps_the_marker_and_what_follows() {
        check(
            &from_claude_jsonl(CLAUDE_COMPACTED).since_last_compaction(),
            expect![[r#"
                claude 1c42be55-1c59-4cda-b3df-58149ba01880 title=None
                System 12:17:48.465 e0f896d0-de83-4584-80cc-347fbc6e8266 COMPACTION: Conversation compacted (manual, 15 tokens before) This session is bei…
                System 12:17:48.363 eda171c4-5789-496b-a928-95254d5ce99b: Command: /compact
                System 12:17:48.582 827e0501-18d5-4427-9968-390b1faa3542: Compacted PreCompact [tee /tmp/archive-claude-4tb17a59/hook.json | py…
            "#]],
        );
        let whole = from_claude_jsonl(CLAUDE);
        assert_eq!(
            whole.since_last_compaction(),
            whole,
            "no marker: everything"
        );
    }

    #[test]
    fn codex_thread_read_parses() {
        check(
            &codex(),
            expect![[r#"
            codex 01a1fe0a-f503-74f0-ba0e-e1241b980a77 title=None
            User [John, Jane] 12:18:13.495 01a1fe0a-f576-7972-871d-f99b56b794e1: <context timezone="UTC" /> <messages> <message id="2" from="slack-mai…
            Assistant 12:18:13.564 call_fake6: 
              🔧 mcp__nanoclaw__send_message({"text":"Hi team! Checking the build now."}) → Some("message sent")
              🔧 shell(/bin/bash -lc 'echo build ok') → Some("build ok")
            Assistant 12:18:13.713 msg_fake8: The build is green: `echo build ok` printed build ok.
            User [John] 12:18:13.781 01a1fe0a-f68e-7f41-a252-2936e087df96: <context timezone="UTC" /> <message id="6" sender="John" time="Feb 4,…
            Assistant 12:18:13.801 msg_fake10: Nothing else for now.
        "#]],
        );
    }

    #[test]
    fn opencode_messages_parse() {
        check(
            &opencode(),
            expect![[r#"
            opencode ses_e01f4e94fffeKFELGILgUCv7Se title=None
            User [John, Jane] 12:18:22.364 msg_1fe0b181c001S74Jt8Pzz61Ere: <context timezone="UTC" /> <messages> <message id="2" from="slack-mai…
            Assistant 12:18:25.509 msg_1fe0b24970011X0mEn9ZpQpDql: 
              🔧 nanoclaw_send_message({"text":"Hi team! Checking the build now."}) → Some("message sent")
              🔧 bash({"command":"echo build ok","description":"check the build"}) → Some("build ok")
            Assistant 12:18:27.060 msg_1fe0b29ae0015E2sh3L6gOyRn3: The build is green: `echo build ok` printed build ok.
            User [John] 12:18:27.117 msg_1fe0b2aad001TajGbj0G1rgDzh: <context timezone="UTC" /> <message id="6" sender="John" time="Feb 4,…
            Assistant 12:18:27.287 msg_1fe0b2ad90012w5HMG3wswiU2v: Nothing else for now.
        "#]],
        );
    }

    #[test]
    fn unknown_shapes_are_skipped() {
        let t = from_claude_jsonl(
            "not json\n{}\n[1,2]\n{\"type\":\"user\",\"message\":{\"content\":42}}\n",
        );
        assert!(t.is_empty());
        assert!(from_codex_thread(&json!(null)).is_empty());
        assert!(from_codex_thread(
            &json!({"thread": {"turns": [{"items": [{"type": "future"}, 7]}]}})
        )
        .is_empty());
        assert!(from_opencode_messages(&json!({"x": 1})).is_empty());
        assert!(
            from_opencode_messages(&json!([{"info": {"role": "tool"}, "parts": "x"}])).is_empty()
        );
    }

    #[test]
    fn renders_the_claude_session() {
        let md = render_markdown(
            &from_claude_jsonl(CLAUDE),
            &opts("America/Los_Angeles", 120),
        );
        expect![[r#"
            <!-- nanoclaw-archive {"provider":"claude","session":"1c42be55-1c59-4cda-b3df-58149ba01880"} -->
            # Can you check the build & tell me if it's green?

            - Provider: claude
            - Session: 1c42be55-1c59-4cda-b3df-58149ba01880
            - Archived: 2026-11-21 12:30 (America/Los_Angeles)
            - Started: 2026-11-21 04:17

            ---

            ### John, Jane — 2026-11-21 04:17

            ```xml
            <context timezone="UTC" />
            <messages>
            <message id="2" from="slack-main" sender="John" time="Feb 4, 2026, 10:00 AM">Can y
            ```

            [… 161 more characters]

            ### Assistant — 2026-11-21 04:17

            - 🔧 mcp__nanoclaw__send_message({"text":"Hi team! Checking the build now."}) → message sent
            - 🔧 Bash({"command":"sleep 2; echo build ok","description":"check the build"}) → build ok

            ### John — 2026-11-21 04:17

            ```xml
            <context timezone="UTC" />
            <message id="6" sender="John" time="Feb 4, 2026, 10:05 AM">Thanks! Anything else?</message>
            ```

            ### Assistant — 2026-11-21 04:17

            The build is green: `echo build ok` printed build ok. All checks passed. All checks passed. All checks passed. All check

            [… 4683 more characters]

            ### Jane — 2026-11-21 04:17

            ```xml
            <context timezone="UTC" />
            <message id="8" sender="Jane" time="Feb 4, 2026, 10:07 AM">Great, see you tomorrow</message>
            ```

            ### Assistant — 2026-11-21 04:17

            Nothing else for now.

            <!-- nanoclaw-archive-through {"entry":"5cff14ea-6c8e-42a2-b716-93a9d91f4f93"} -->
        "#]].assert_eq(&md);
        // With the default limit, the 4,803-character answer keeps its first 4,000.
        let md = render_markdown(&from_claude_jsonl(CLAUDE), &opts("UTC", MAX_MESSAGE_CHARS));
        assert!(md.contains("\n[… 803 more characters]\n"), "{md}");
    }

    #[test]
    fn renders_the_codex_thread() {
        let mut options = opts("Europe/Berlin", MAX_MESSAGE_CHARS);
        options.assistant_name = Some("Andy".into());
        expect![[r#"
            <!-- nanoclaw-archive {"provider":"codex","session":"01a1fe0a-f503-74f0-ba0e-e1241b980a77"} -->
            # Can you check the build & tell me if it's green?

            - Provider: codex
            - Session: 01a1fe0a-f503-74f0-ba0e-e1241b980a77
            - Archived: 2026-11-21 21:30 (Europe/Berlin)
            - Started: 2026-11-21 13:18

            ---

            ### John, Jane — 2026-11-21 13:18

            ```xml
            <context timezone="UTC" />
            <messages>
            <message id="2" from="slack-main" sender="John" time="Feb 4, 2026, 10:00 AM">Can you check the build &amp; tell me if it's green?</message>
            <message id="4" sender="Jane" time="Feb 4, 2026, 10:01 AM">And say hi to the team</message>
            </messages>
            ```

            ### Andy — 2026-11-21 13:18

            - 🔧 mcp__nanoclaw__send_message({"text":"Hi team! Checking the build now."}) → message sent
            - 🔧 shell(/bin/bash -lc 'echo build ok') → build ok

            The build is green: `echo build ok` printed build ok.

            ### John — 2026-11-21 13:18

            ```xml
            <context timezone="UTC" />
            <message id="6" sender="John" time="Feb 4, 2026, 10:05 AM">Thanks! Anything else?</message>
            ```

            ### Andy — 2026-11-21 13:18

            Nothing else for now.

            <!-- nanoclaw-archive-through {"entry":"msg_fake10"} -->
        "#]].assert_eq(&render_markdown(&codex(), &options));
    }

    #[test]
    fn renders_the_opencode_session() {
        expect![[r#"
            <!-- nanoclaw-archive {"provider":"opencode","session":"ses_e01f4e94fffeKFELGILgUCv7Se"} -->
            # Can you check the build & tell me if it's green?

            - Provider: opencode
            - Session: ses_e01f4e94fffeKFELGILgUCv7Se
            - Archived: 2026-11-21 20:30 (UTC)
            - Started: 2026-11-21 12:18

            ---

            ### John, Jane — 2026-11-21 12:18

            ```xml
            <context timezone="UTC" />
            <messages>
            <message id="2" from="slack-main" sender="John" time="Feb 4, 2026, 10:00 AM">Can you check the build &amp; tell me if it's green?</message>
            <message id="4" sender="Jane" time="Feb 4, 2026, 10:01 AM">And say hi to the team</message>
            </messages>
            ```

            ### Assistant — 2026-11-21 12:18

            - 🔧 nanoclaw_send_message({"text":"Hi team! Checking the build now."}) → message sent
            - 🔧 bash({"command":"echo build ok","description":"check the build"}) → build ok

            The build is green: `echo build ok` printed build ok.

            ### John — 2026-11-21 12:18

            ```xml
            <context timezone="UTC" />
            <message id="6" sender="John" time="Feb 4, 2026, 10:05 AM">Thanks! Anything else?</message>
            ```

            ### Assistant — 2026-11-21 12:18

            Nothing else for now.

            <!-- nanoclaw-archive-through {"entry":"msg_1fe0b2ad90012w5HMG3wswiU2v"} -->
        "#]].assert_eq(&render_markdown(&opencode(), &opts("UTC", MAX_MESSAGE_CHARS)));
    }

    #[test]
    fn user_prompts_with_backticks_get_a_longer_fence() {
        let mut t = Transcript::default();
        t.entries.push(Entry::new(
            Role::User,
            "<message id=\"2\">run ```rm```</message>",
        ));
        let md = render_markdown(&t, &opts("UTC", MAX_MESSAGE_CHARS));
        assert!(
            md.contains("\n````xml\n<message id=\"2\">run ```rm```</message>\n````\n"),
            "{md}"
        );
    }

    #[test]
    fn slugs() {
        let cases = [
            (
                "Can you check the build & tell me if it's green?",
                "can-you-check-the-build-tell-me-if-it-s-green",
            ),
            (
                "  ¿Qué tal?  Ünïcode → ascii only ",
                "qu-tal-n-code-ascii-only",
            ),
            ("", "conversation"),
            ("!!! ???", "conversation"),
            (
                "a very long first message that goes on and on about nothing at all really",
                "a-very-long-first-message-that-goes-on-and-on",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(slug(text), want, "{text:?}");
            assert!(slug(text).len() <= MAX_SLUG_CHARS);
        }
        assert_eq!(
            slug(&"x".repeat(80)),
            "x".repeat(50),
            "no word boundary: a hard cut"
        );
    }

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

    #[test]
    fn write_archive_never_replaces_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let conversations = dir.path().join("agent/conversations");
        let now = at("2026-02-04T23:30:00Z");
        let tz: Tz = "Asia/Tokyo".parse().unwrap(); // already Feb 5 there
        let t = codex();
        let first = write_archive(&conversations, &t, now, tz).unwrap();
        let name = "2026-02-05-can-you-check-the-build-tell-me-if-it-s-green";
        assert_eq!(first, conversations.join(format!("{name}.md")));
        let content = std::fs::read_to_string(&first).unwrap();
        let second = write_archive(&conversations, &t, now, tz).unwrap();
        assert_eq!(second, conversations.join(format!("{name}-2.md")));
        let other = Transcript {
            session_id: "another".into(),
            ..t.clone()
        };
        let third = write_archive(&conversations, &other, now, tz).unwrap();
        assert_eq!(third, conversations.join(format!("{name}-3.md")));
        assert_eq!(std::fs::read_to_string(&first).unwrap(), content);
        assert_eq!(std::fs::read_to_string(&second).unwrap(), content);
        let mut names: Vec<String> = std::fs::read_dir(&conversations)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 3, "no temporary file is left: {names:?}");
    }

    #[test]
    fn archive_new_entries_writes_each_entry_once() {
        let dir = tempfile::tempdir().unwrap();
        let full = opencode();
        let mut first_query = full.clone();
        first_query.entries.truncate(3);
        let day1 = RenderOptions::new(Tz::UTC, at("2026-02-04T10:00:00Z"));
        let path = archive_new_entries(dir.path(), &first_query, &day1)
            .unwrap()
            .unwrap();
        assert!(path.ends_with("2026-02-04-can-you-check-the-build-tell-me-if-it-s-green.md"));
        assert_eq!(
            archive_new_entries(dir.path(), &first_query, &day1).unwrap(),
            None,
            "nothing new"
        );

        // The next query the same day: appended to the same file.
        let mut second_query = full.clone();
        second_query.entries.truncate(4);
        assert_eq!(
            archive_new_entries(dir.path(), &second_query, &day1).unwrap(),
            Some(path.clone())
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.matches("### John, Jane —").count(), 1, "{text}");
        assert_eq!(text.matches("### John —").count(), 1, "{text}");
        assert_eq!(text.matches("Thanks! Anything else?").count(), 1, "{text}");
        assert_eq!(text.matches(THROUGH_MARKER).count(), 2, "{text}");

        // The next day: a new file with only the new entries, named after their first prompt.
        let day2 = RenderOptions::new(Tz::UTC, at("2026-02-05T08:00:00Z"));
        let next = archive_new_entries(dir.path(), &full, &day2)
            .unwrap()
            .unwrap();
        assert!(
            next.ends_with("2026-02-05-conversation.md"),
            "{}",
            next.display()
        );
        let text = std::fs::read_to_string(&next).unwrap();
        assert!(
            text.contains("Nothing else for now.") && !text.contains("Thanks! Anything else?"),
            "{text}"
        );
        assert_eq!(archive_new_entries(dir.path(), &full, &day2).unwrap(), None);

        // Another session is independent; an unknown cursor archives everything again.
        let other = Transcript {
            session_id: "ses_other".into(),
            ..full.clone()
        };
        assert!(archive_new_entries(dir.path(), &other, &day2)
            .unwrap()
            .is_some());
        let mut rewritten = full.clone();
        for e in &mut rewritten.entries {
            e.id = e.id.as_ref().map(|id| format!("{id}-new"));
        }
        let again = archive_new_entries(dir.path(), &rewritten, &day2)
            .unwrap()
            .unwrap();
        assert_eq!(again, next, "appended to today's file");
        assert_eq!(
            std::fs::read_to_string(&again)
                .unwrap()
                .matches("Thanks! Anything else?")
                .count(),
            1
        );
    }

    #[test]
    fn claude_paths_and_hook_settings() {
        let hook: Value = serde_json::from_str(CLAUDE_HOOK).unwrap();
        let transcript = hook["transcript_path"].as_str().unwrap();
        let home = &transcript[..transcript.find("/.claude/").unwrap()];
        let path = claude_transcript_path(
            Path::new(home),
            Path::new(hook["cwd"].as_str().unwrap()),
            hook["session_id"].as_str().unwrap(),
        );
        assert_eq!(path, Path::new(transcript));
        let settings = claude_hook_settings(
            Path::new("/usr/local/bin/agent-runner"),
            Path::new("/workspace/agent/conversations"),
            "America/Los_Angeles",
        );
        expect![[r#"
            {
              "hooks": {
                "PreCompact": [
                  {
                    "hooks": [
                      {
                        "command": "'/usr/local/bin/agent-runner' archive-hook --conversations-dir '/workspace/agent/conversations' --timezone 'America/Los_Angeles'",
                        "type": "command"
                      }
                    ],
                    "matcher": ""
                  }
                ]
              }
            }"#]].assert_eq(&serde_json::to_string_pretty(&settings).unwrap());
        let quoted = claude_precompact_hooks(Path::new("/opt/it's/runner"), Path::new("/w"), "UTC");
        assert_eq!(
            quoted["PreCompact"][0]["hooks"][0]["command"],
            r"'/opt/it'\''s/runner' archive-hook --conversations-dir '/w' --timezone 'UTC'"
        );
    }

    #[test]
    fn timezones_fall_back_to_utc() {
        assert_eq!(parse_tz(":Europe/Paris"), chrono_tz::Europe::Paris);
        assert_eq!(parse_tz("Mars/Olympus"), Tz::UTC);
        assert_eq!(parse_tz(""), Tz::UTC);
    }

    /// Issue 9.1: archive files the agent replaced with links to the session DB's files are
    /// neither read nor appended to; the DB and its locks are untouched and the entries go to a
    /// new file.
    #[test]
    fn archive_links_to_the_session_db_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (db, conn) = fsguard::testing::wal_db(dir.path());
        let shm = dir.path().join("session.db-shm");
        let before = std::fs::read(&db).unwrap();
        let archives = dir.path().join("conversations");
        std::fs::create_dir(&archives).unwrap();
        let full = opencode();
        let day = RenderOptions::new(Tz::UTC, at("2026-02-04T10:00:00Z"));
        let name = "2026-02-04-can-you-check-the-build-tell-me-if-it-s-green.md";
        std::os::unix::fs::symlink(&shm, archives.join(name)).unwrap();
        std::fs::hard_link(&db, archives.join("2026-02-04-a.md")).unwrap();
        let written = archive_new_entries(&archives, &full, &day)
            .unwrap()
            .unwrap();
        assert!(
            written.ends_with(name.replace(".md", "-2.md")),
            "{}",
            written.display()
        );
        assert!(fsguard::testing::locked_by_another_process(&shm));
        assert_eq!(std::fs::read(&db).unwrap(), before);
        assert_eq!(
            conn.query_row("SELECT x FROM t", [], |r| r.get::<_, i64>(0))
                .unwrap(),
            1
        );
    }
}
