//! Test support shared by the archive's tests and the three history parsers' tests (feature
//! `testing` for the driver crates): the
//! histories captured from the real CLIs (`provider/tests/fixtures/archive/`) and a
//! one-line-per-entry outline of a transcript.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use expect_test::Expect;

use super::model::one_line;
use super::{RenderOptions, Transcript};

/// Claude's session file of a short conversation.
pub const CLAUDE: &str = include_str!("../../tests/fixtures/archive/claude_session.jsonl");
/// The same session after a `/compact`.
pub const CLAUDE_COMPACTED: &str =
    include_str!("../../tests/fixtures/archive/claude_session_compacted.jsonl");
/// The JSON Claude passed its `PreCompact` hook.
pub const CLAUDE_HOOK: &str =
    include_str!("../../tests/fixtures/archive/claude_precompact_hook.json");
/// `codex app-server`'s `thread/read` of the same conversation.
pub const CODEX: &str = include_str!("../../tests/fixtures/archive/codex_thread_read.json");
/// `opencode serve`'s messages of the same conversation.
pub const OPENCODE: &str = include_str!("../../tests/fixtures/archive/opencode_messages.json");

/// One line per entry, one per tool call.
pub fn outline(t: &Transcript) -> String {
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

/// Compares a transcript's outline with the expected one.
pub fn check(t: &Transcript, expect: Expect) {
    expect.assert_eq(&outline(t));
}

/// The instant of an RFC 3339 text.
pub fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

/// Render options for `tz`, messages cut at `max` characters, archived at a fixed instant.
pub fn opts(tz: &str, max: usize) -> RenderOptions {
    RenderOptions {
        max_message_chars: max,
        ..RenderOptions::new(tz.parse().unwrap(), at("2026-11-21T20:30:00Z"))
    }
}
