//! Markdown rendering of a [`Transcript`]: a header (title, provider, session id, archive
//! time), then one `### <sender> — <time>` section per speaker change, long messages truncated
//! ([`RenderOptions::max_message_chars`]), tool calls summarised as `- 🔧 name(input) → output`
//! bullets. The first line and the closing marker are what the store reads back to find a
//! session's archives and what they already hold.

use std::fmt::Write as _;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use serde_json::json;

use super::model::{one_line, Entry, Role, Transcript};

/// `[… N more characters]` note.
pub const MAX_MESSAGE_CHARS: usize = 4_000;

/// First line of every archive: `<!-- nanoclaw-archive {"provider":…,"session":…} -->`.
pub(crate) const HEADER_MARKER: &str = "<!-- nanoclaw-archive ";

/// Closes every archive write: `<!-- nanoclaw-archive-through {"entry":…} -->`.
pub const THROUGH_MARKER: &str = "<!-- nanoclaw-archive-through ";

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

    pub(crate) fn date(&self) -> String {
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

/// The whole archive: header, entries, and the closing marker the store reads to append only new entries.
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
pub(crate) fn render_entries(entries: &[Entry], opts: &RenderOptions) -> String {
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
            let body = crate::driver::text::head(text, opts.max_message_chars);
            let more = text[body.len()..].chars().count();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::fixtures::opts;

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
    fn timezones_fall_back_to_utc() {
        assert_eq!(parse_tz(":Europe/Paris"), chrono_tz::Europe::Paris);
        assert_eq!(parse_tz("Mars/Olympus"), Tz::UTC);
        assert_eq!(parse_tz(""), Tz::UTC);
    }
}
