//! Transcript archiving (issue 5): the conversation, written as Markdown to
//! `/workspace/agent/conversations/<YYYY-MM-DD>-<slug>.md`, never overwriting an earlier archive.
//!
//! The pieces, each a module of its own:
//!
//! * `model`: a small model ([`Transcript`], [`Entry`], [`ToolCallSummary`]) and the builder
//!   that the history parsers fill. Each CLI's parser lives next to its driver, in its
//!   `history.rs`: Claude's session file (`$HOME/.claude/projects/<cwd>/<id>.jsonl`,
//!   [`from_claude_jsonl`]), the turns of `codex app-server`'s `thread/turns/list`, and `opencode
//!   serve`'s `GET /session/{id}/message`. Unknown record shapes are skipped, never an error.
//!   Prompts in a history are the runner's XML, read back with [`crate::prompt_xml`];
//! * `render`: [`render_markdown`], a header (title, provider, session id, archive time), then
//!   one `### <sender> — <time>` section per speaker change, long messages truncated
//!   ([`RenderOptions::max_message_chars`]), tool calls summarised as
//!   `- 🔧 name(input) → output` bullets ([`TOOL_EXCERPT_CHARS`] each side);
//! * `store`: [`write_archive`] always creates a NEW file (`<date>-<slug>.md`, then `-2`, `-3`,
//!   …; created atomically with its whole content, so a reader never sees half a file and an
//!   existing archive is never replaced), and `archive_new_entries` writes only what earlier
//!   archives of the same session do not hold yet;
//! * `job`: archiving as a side job after each query (Codex, OpenCode).
//!
//! # How each provider uses it
//!
//! * **Claude**: before Claude compacts its context, its `PreCompact` hook runs
//!   `agent-runner archive-hook`, which reads the hook JSON on stdin (`session_id`,
//!   `transcript_path`, `trigger`, …), parses the transcript file with [`from_claude_jsonl`],
//!   keeps [`Transcript::since_last_compaction`] (the part an earlier PreCompact has not
//!   archived yet) and calls [`write_archive_with`]. The provider only passes the hook in
//!   `--settings` (built in `claude/history.rs`; [`claude_hook_settings`] is the whole
//!   `--settings` object), e.g.
//!   `{"hooks":{"PreCompact":[{"matcher":"","hooks":[{"type":"command","command":"'/usr/local/bin/agent-runner' archive-hook --conversations-dir '/workspace/agent/conversations' --timezone 'UTC'"}]}]}}`.
//!   The hook never fails noisily: any problem is printed on stderr and it exits 0, so
//!   compaction always goes ahead.
//! * **Codex**: after a query ends (`turn/completed`), the driver reads the turns since the
//!   last archived entry (`archived_through`) with `thread/turns/list`, newest first, parses
//!   the result (`codex/history.rs`) and hands it to the job.
//! * **OpenCode**: after a query ends (`session.idle`), the driver reads the session's messages,
//!   parses them (`opencode/history.rs`) and hands them to the job.
//!
//! Archiving after every query finds the newest archive of the same session in the folder (its
//! first line records provider and session id), reads the marker at its end (the id of the last
//! entry archived) and writes only the entries after it: appended to today's archive of that
//! session when there is one (appending never loses what is there), otherwise into a new file
//! made by the same rules as [`write_archive`]. A marker whose entry is no longer in the history
//! archives everything again: a duplicate rather than a loss. Archiving is a side job: log its
//! error and carry on, never fail the query.

pub mod job;
pub mod model;
mod render;
mod store;

#[cfg(any(test, feature = "testing"))]
// Test support only (the feature `testing`): a fixture that does not parse is a failed test.
#[allow(clippy::unwrap_used)]
pub mod fixtures;

pub use model::{Entry, Role, ToolCallSummary, Transcript, TOOL_EXCERPT_CHARS};
pub use render::{parse_tz, render_markdown, RenderOptions, MAX_MESSAGE_CHARS, THROUGH_MARKER};
pub use store::{archive_new_entries, archived_through};
pub use store::{write_archive, write_archive_with};
