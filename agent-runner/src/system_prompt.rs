//! The system prompt (docs/contract/prompt.md#system-prompt): the instruction files of the session
//! with their `@path` imports inlined, then a runner addendum that tells the agent who it is, how
//! its replies are delivered, which destinations exist and which `nanoclaw` tools it has.
//!
//! Instruction files, in order, each optional:
//! 1. `<globalDir>/CLAUDE.md` (`/workspace/global/CLAUDE.md`, mounted read-only),
//! 2. `<agentDir>/CLAUDE.md` (`/workspace/agent/CLAUDE.md`, the agent group's instructions),
//! 3. `<agentDir>/CLAUDE.local.md` (local notes beside them).
//!
//! Imports: a line that is exactly `@some/path.md` (surrounding whitespace allowed, no whitespace
//! inside the path) is replaced by that file's text, recursively. A relative path resolves
//! against the folder of the file that imports it; an absolute path is taken as is. Whatever the
//! form, the file must lie (after resolving symlinks) inside the workspace or inside the global or
//! agent folder, so an import cannot read `/etc/passwd` or a host secret into the prompt. Lines
//! inside fenced code blocks (```` ``` ```` or `~~~`) are text, never imports. What cannot be
//! inlined becomes an HTML comment in its place, and a log warning, so the agent and the operator
//! both see it: `<!-- missing import: x.md -->`, `<!-- import cycle: x.md -->`,
//! `<!-- import depth limit reached: x.md -->`, `<!-- import outside the workspace: x.md -->`,
//! `<!-- import is not a file: x.md -->`, `<!-- import too large: x.md (… bytes) -->`,
//! `<!-- unreadable import: x.md (…) -->`. A file imported twice without a cycle is inlined twice.
//! One prompt inlines at most [`MAX_IMPORTS`] imports and [`MAX_INSTRUCTION_BYTES`] of
//! instruction text in all: past either, an import becomes `<!-- import limit reached: x.md -->`
//! or `<!-- instruction size limit reached: x.md -->`, with one warning per prompt. So a
//! file that imports a big file many times cannot make the prompt (or the time to build it,
//! which runs on the runner's loop thread) grow without bound.
//!
//! The prompt is rebuilt at the start of every query (the files are re-read and the destinations
//! come from the DB), so instruction edits and destination changes made by the host mid-session
//! reach the agent at its next query. The text depends only on the files, the destinations and
//! the configuration (no clock), so an unchanged session gives byte-identical prompts and a
//! provider that restarts its CLI when the prompt changes does not restart needlessly.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use schema::Destination;

use crate::config::Settings;

/// Deepest import chain followed: a top-level file is depth 0, a file it imports depth 1, ...
pub const MAX_IMPORT_DEPTH: usize = 5;

/// Largest instruction or imported file inlined, in bytes; a bigger one becomes a note.
pub const MAX_FILE_BYTES: u64 = 256 * 1024;

/// Most import lines one system prompt follows (all its files together); the later ones become
/// notes without touching the file system.
pub const MAX_IMPORTS: usize = 100;

/// Most instruction text one system prompt inlines, in bytes (its files and imports together).
pub const MAX_INSTRUCTION_BYTES: usize = 1024 * 1024;

/// The MCP tools of server `nanoclaw` (mcp-tools), with the one line the addendum gives each.
pub const TOOLS: &[(&str, &str)] = &[
    (
        "send_message",
        "send a chat message now, to the current conversation or to a destination (`to`)",
    ),
    (
        "send_file",
        "send a file (a path relative to your working directory) to the chat",
    ),
    (
        "send_card",
        "send a rich card (title, sections, buttons) with a plain-text fallback",
    ),
    (
        "ask_user_question",
        "ask a multiple-choice question and wait for the answer",
    ),
    (
        "edit_message",
        "replace the text of one of your earlier messages, by its number",
    ),
    (
        "add_reaction",
        "react to a message with an emoji, by its number",
    ),
    (
        "send_to_agent",
        "send a message to another agent group; its reply comes back as a message",
    ),
    (
        "schedule_task",
        "schedule instructions for later: once at a time, or on a 5-field cron recurrence",
    ),
    (
        "list_tasks",
        "list scheduled tasks with their ids and next runs",
    ),
    (
        "update_task",
        "change a scheduled task's prompt, script, next run or recurrence",
    ),
    ("cancel_task", "cancel a scheduled task for good"),
    ("pause_task", "pause a scheduled task until resume_task"),
    ("resume_task", "resume a paused task"),
    (
        "register_agent_group",
        "admin only: ask the host to register a new agent group for a chat channel",
    ),
];

/// Where the system prompt's parts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptSources {
    /// Workspace root (`/workspace`); imports may read files inside it.
    pub workspace: PathBuf,
    /// Folder of the global `CLAUDE.md` (config `globalDir`).
    pub global_dir: PathBuf,
    /// The agent group folder with `CLAUDE.md` and `CLAUDE.local.md` (config `agentDir`).
    pub agent_dir: PathBuf,
    /// The agent's name (config `assistantName`).
    pub assistant_name: String,
    /// IANA time zone name of prompt times and schedules (config `timezone`).
    pub timezone: String,
}

impl PromptSources {
    /// Sources for a workspace laid out like the container's, with the default name and UTC.
    pub fn for_workspace(workspace: impl Into<PathBuf>) -> Self {
        let workspace = workspace.into();
        Self {
            global_dir: workspace.join("global"),
            agent_dir: workspace.join("agent"),
            assistant_name: "Assistant".into(),
            timezone: "UTC".into(),
            workspace,
        }
    }

    /// Sources from the settings (`globalDir`, `agentDir`, `assistantName`, `timezone`); a
    /// blank name is the default one.
    pub fn from_settings(settings: &Settings) -> Self {
        let defaults = Self::for_workspace(&settings.workspace);
        Self {
            global_dir: settings.dirs.global.clone(),
            agent_dir: settings.dirs.agent.clone(),
            assistant_name: settings
                .assistant_name
                .clone()
                .filter(|name| !name.trim().is_empty())
                .unwrap_or(defaults.assistant_name),
            timezone: settings.timezone_name.clone(),
            workspace: defaults.workspace,
        }
    }

    /// The instruction files, in prompt order, each with the label shown above its text.
    pub fn instruction_files(&self) -> Vec<(&'static str, PathBuf)> {
        vec![
            ("global instructions", self.global_dir.join("CLAUDE.md")),
            ("agent group instructions", self.agent_dir.join("CLAUDE.md")),
            ("local instructions", self.agent_dir.join("CLAUDE.local.md")),
        ]
    }
}

/// The whole system prompt: each existing instruction file (imports inlined) under a comment
/// naming it, then the runner addendum. Reads the instruction files; never fails (what cannot be
/// read is a note in the text and a log warning).
pub fn build_system_prompt(sources: &PromptSources, destinations: &[Destination]) -> String {
    let mut parts = Vec::new();
    let mut budget = Budget::default();
    for (label, path) in sources.instruction_files() {
        if let Some(text) = instructions_within(sources, &path, &mut budget) {
            parts.push(format!(
                "<!-- {label}: {} -->\n{text}",
                display_path(sources, &path)
            ));
        }
    }
    budget.warn_refused();
    parts.push(addendum(sources, destinations));
    if parts.len() == 1 {
        // No instruction file: the addendum alone, not copied again.
        return parts.pop().unwrap_or_default();
    }
    parts.join("\n\n")
}

/// One top-level instruction file with its imports inlined, trimmed; `None` when it does not
/// exist or holds only whitespace.
pub fn instructions(sources: &PromptSources, path: &Path) -> Option<String> {
    let mut budget = Budget::default();
    let text = instructions_within(sources, path, &mut budget);
    budget.warn_refused();
    text
}

/// [`instructions`], counting what it reads against `budget` (shared by a prompt's files).
fn instructions_within(
    sources: &PromptSources,
    path: &Path,
    budget: &mut Budget,
) -> Option<String> {
    // One `statx` for the usual missing file, where resolving the path took a `readlink` per
    // component (the prompt is built at every query's start).
    if let Err(err) = std::fs::symlink_metadata(path) {
        if err.kind() == std::io::ErrorKind::NotFound {
            return None;
        }
    }
    let canonical = match path.canonicalize() {
        Ok(canonical) => canonical,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return None,
        Err(err) => {
            tracing::warn!(path = %path.display(), %err, "cannot read an instruction file; left out of the system prompt");
            return None;
        }
    };
    let text = match read_limited(&canonical) {
        Ok(text) => text,
        Err(note) => {
            tracing::warn!(path = %path.display(), problem = %note, "instruction file left out of the system prompt");
            return None;
        }
    };
    if !budget.take_bytes(text.len()) {
        tracing::warn!(
            path = %path.display(),
            limit = MAX_INSTRUCTION_BYTES,
            "instruction file left out of the system prompt: the instructions' size limit is reached"
        );
        return None;
    }
    let mut expander = Expander {
        roots: allowed_roots(sources),
        stack: Vec::new(),
        budget,
    };
    let expanded = expander.expand(&canonical, &text, 0);
    let trimmed = expanded.trim();
    (!trimmed.is_empty()).then(|| trimmed.to_owned())
}

/// The runner addendum: the agent's name, the message and reply formats, the destinations and
/// the tools. Pure.
pub fn addendum(sources: &PromptSources, destinations: &[Destination]) -> String {
    let name = one_line(&sources.assistant_name);
    let tz = one_line(&sources.timezone);
    let mut out = String::with_capacity(4096);
    let _ = write!(
        out,
        "\
## NanoClaw runner

You are {name}. You run inside a NanoClaw container and talk with people through chat platforms: \
the host delivers their messages to you and delivers what you send.

### Incoming messages
- A prompt holds one `<message>` or several inside `<messages>`, with `sender` and `time` attributes; \
`from` names the destination a message came from when it is one of those listed below. Scheduled \
tasks arrive as `<task>`, webhooks as `<webhook>`, results of host actions as `<system_response>`.
- The `id` attribute is the message's number (seq). Tools that take a `messageId` (add_reaction, \
edit_message) take such a number; send_message returns the number of the message it sent.
- Times are in the {tz} time zone (the prompt's `<context timezone>`); schedule_task and the other \
task tools read and show times in that zone too.
- Files sent to you are saved to disk and shown as `[file available at: <path>]`.

### How your replies are delivered
- The final text of your turn is sent to the conversation the messages came from. An empty final \
text sends nothing.
- To send to a destination, wrap the text in `<message to=\"name\">…</message>`; each block goes to \
that destination. When your final text holds such blocks, only the blocks are sent and text \
outside them is dropped. A block to an unknown name is not sent.
- `<internal>…</internal>` is never sent, wherever it appears: use it for notes to yourself.
- To say something before your turn ends (progress, a heads-up before long work), use send_message, \
and do not repeat that text in your final reply.

### Destinations
"
    );
    if destinations.is_empty() {
        out.push_str(
            "No named destinations are configured: your replies go to the conversation the messages \
             came from.\n",
        );
    } else {
        out.push_str("| name | display name | type |\n|---|---|---|\n");
        for destination in destinations {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} |",
                cell(&destination.name),
                cell(destination.display_name.as_deref().unwrap_or("")),
                cell(&destination.kind),
            );
        }
        let example = one_line(&destinations[0].name);
        let _ = writeln!(
            out,
            "\nAddress one with `<message to=\"{example}\">…</message>` in your reply, or with \
             send_message and `to: \"{example}\"`."
        );
    }
    out.push_str(&TOOLS_SECTION);
    let len = out.trim_end().len();
    out.truncate(len);
    out
}

/// The addendum's last section, the same in every prompt: built once (the prompt is built at
/// every query's start).
static TOOLS_SECTION: LazyLock<String> = LazyLock::new(|| {
    let mut out = String::from(
        "\n### Tools (MCP server `nanoclaw`)\nYour CLI may show them with a prefix, e.g. \
         `mcp__nanoclaw__send_message`.\n",
    );
    for (tool, line) in TOOLS {
        let _ = writeln!(out, "- `{tool}`: {line}");
    }
    out
});

/// The folders imports may read from: the workspace, the global folder and the agent folder
/// (resolved, where they exist).
fn allowed_roots(sources: &PromptSources) -> Vec<PathBuf> {
    [&sources.workspace, &sources.global_dir, &sources.agent_dir]
        .into_iter()
        .filter_map(|dir| dir.canonicalize().ok())
        .collect()
}

/// What one system prompt has inlined so far, against [`MAX_IMPORTS`] and
/// [`MAX_INSTRUCTION_BYTES`].
#[derive(Debug, Default)]
struct Budget {
    imports: usize,
    bytes: usize,
    /// Imports turned into a note by a limit, for the prompt's one warning.
    refused: usize,
}

impl Budget {
    /// Counts an import line; false when the prompt already followed [`MAX_IMPORTS`].
    fn take_import(&mut self) -> bool {
        self.imports += 1;
        self.imports <= MAX_IMPORTS
    }

    /// Counts `len` bytes of text; false (nothing counted) when they would pass
    /// [`MAX_INSTRUCTION_BYTES`].
    fn take_bytes(&mut self, len: usize) -> bool {
        if self.bytes.saturating_add(len) > MAX_INSTRUCTION_BYTES {
            return false;
        }
        self.bytes += len;
        true
    }

    fn warn_refused(&self) {
        if self.refused > 0 {
            tracing::warn!(
                refused = self.refused,
                imports = self.imports,
                max_imports = MAX_IMPORTS,
                max_bytes = MAX_INSTRUCTION_BYTES,
                "imports over the system prompt's limits were not inlined"
            );
        }
    }
}

/// Inlines the imports of one file at a time, remembering the chain being expanded.
struct Expander<'budget> {
    roots: Vec<PathBuf>,
    /// Canonical paths of the files being expanded, outermost first.
    stack: Vec<PathBuf>,
    budget: &'budget mut Budget,
}

impl Expander<'_> {
    /// `text` (the content of `canonical`) with its imports inlined.
    fn expand(&mut self, canonical: &Path, text: &str, depth: usize) -> String {
        self.stack.push(canonical.to_path_buf());
        let dir = canonical
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let mut fence = Fence::default();
        let mut lines = Vec::new();
        for line in text.lines() {
            if fence.update(line) {
                lines.push(line.to_owned());
                continue;
            }
            match import_target(line) {
                Some(target) => lines.push(self.import(&dir, target, depth + 1)),
                None => lines.push(line.to_owned()),
            }
        }
        self.stack.pop();
        lines.join("\n")
    }

    /// The text that replaces an import line: the file, expanded, or a note.
    fn import(&mut self, dir: &Path, target: &str, depth: usize) -> String {
        let note = |what: &str, detail: Option<String>| {
            let detail = detail.map(|d| format!(" ({d})")).unwrap_or_default();
            format!(
                "<!-- {what}: {}{} -->",
                comment_safe(target),
                comment_safe(&detail)
            )
        };
        let path = dir.join(target);
        if depth > MAX_IMPORT_DEPTH {
            tracing::warn!(
                import = target,
                limit = MAX_IMPORT_DEPTH,
                "import nested too deep; not inlined"
            );
            return note("import depth limit reached", None);
        }
        if !self.budget.take_import() {
            self.budget.refused += 1;
            return note("import limit reached", None);
        }
        let canonical = match path.canonicalize() {
            Ok(canonical) => canonical,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                tracing::warn!(import = target, path = %path.display(), "imported file is missing");
                return note("missing import", None);
            }
            Err(err) => {
                tracing::warn!(import = target, path = %path.display(), %err, "cannot read an imported file");
                return note("unreadable import", Some(err.to_string()));
            }
        };
        if !self.roots.iter().any(|root| canonical.starts_with(root)) {
            tracing::warn!(import = target, path = %canonical.display(), "import outside the workspace; not inlined");
            return note("import outside the workspace", None);
        }
        if self.stack.contains(&canonical) {
            tracing::warn!(import = target, path = %canonical.display(), "import cycle; not inlined again");
            return note("import cycle", None);
        }
        match read_limited(&canonical) {
            Ok(text) if !self.budget.take_bytes(text.len()) => {
                self.budget.refused += 1;
                note("instruction size limit reached", None)
            }
            Ok(text) => self.expand(&canonical, &text, depth).trim_end().to_owned(),
            Err(ReadProblem::NotAFile) => {
                tracing::warn!(import = target, "import is not a file");
                note("import is not a file", None)
            }
            Err(ReadProblem::TooLarge(bytes)) => {
                tracing::warn!(
                    import = target,
                    bytes,
                    limit = MAX_FILE_BYTES,
                    "imported file too large; not inlined"
                );
                note(
                    "import too large",
                    Some(format!("{bytes} bytes, limit {MAX_FILE_BYTES}")),
                )
            }
            Err(ReadProblem::Io(err)) => {
                tracing::warn!(import = target, %err, "cannot read an imported file");
                note("unreadable import", Some(err))
            }
        }
    }
}

/// Why a file was not read.
#[derive(Debug)]
enum ReadProblem {
    NotAFile,
    TooLarge(u64),
    Io(String),
}

impl std::fmt::Display for ReadProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadProblem::NotAFile => f.write_str("not a file"),
            ReadProblem::TooLarge(bytes) => {
                write!(f, "{bytes} bytes, over the limit of {MAX_FILE_BYTES}")
            }
            ReadProblem::Io(err) => f.write_str(err),
        }
    }
}

/// Reads a regular file of at most [`MAX_FILE_BYTES`], as UTF-8 (invalid bytes replaced).
/// Opened through `fsguard`: a CLAUDE.md or an import may name the session DB itself.
fn read_limited(path: &Path) -> Result<String, ReadProblem> {
    use std::io::Read;
    let io = |err: std::io::Error| ReadProblem::Io(err.to_string());
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(ReadProblem::NotAFile);
    }
    let file = fsguard::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len > MAX_FILE_BYTES {
        return Err(ReadProblem::TooLarge(len));
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The path of an import line (`@path`, alone on its line), if the line is one.
fn import_target(line: &str) -> Option<&str> {
    let target = line.trim().strip_prefix('@')?;
    (!target.is_empty() && !target.contains(char::is_whitespace)).then_some(target)
}

/// Fenced code block tracking (CommonMark: a run of at least three backticks or tildes, indented
/// at most three spaces; the closing run uses the same character, is at least as long and has
/// nothing after it).
#[derive(Debug, Default)]
struct Fence {
    open: Option<(char, usize)>,
}

impl Fence {
    /// Feeds one line; true when the line is inside a fence or is a fence line itself.
    fn update(&mut self, line: &str) -> bool {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let run = if indent <= 3 {
            fence_run(&line[indent..])
        } else {
            None
        };
        match (self.open, run) {
            (None, Some((ch, len, _))) => {
                self.open = Some((ch, len));
                true
            }
            (None, None) => false,
            (Some((open_ch, open_len)), Some((ch, len, rest)))
                if ch == open_ch && len >= open_len && rest.trim().is_empty() =>
            {
                self.open = None;
                true
            }
            (Some(_), _) => true,
        }
    }
}

/// A fence run at the start of `text`: its character, length and what follows it.
fn fence_run(text: &str) -> Option<(char, usize, &str)> {
    let ch = text.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = text.len() - text.trim_start_matches(ch).len();
    (len >= 3).then(|| (ch, len, &text[len..]))
}

/// The path shown in a label: relative to the workspace when inside it.
fn display_path(sources: &PromptSources, path: &Path) -> String {
    let shown = path
        .strip_prefix(&sources.workspace)
        .unwrap_or(path)
        .display()
        .to_string();
    comment_safe(&shown)
}

/// Text that cannot end an HTML comment.
fn comment_safe(text: &str) -> String {
    text.replace("--", "- -")
}

/// One line of text (newlines become spaces).
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A Markdown table cell.
fn cell(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    /// A workspace laid out like the container's, with `files` (path relative to it → text).
    fn workspace(files: &[(&str, &str)]) -> (tempfile::TempDir, PromptSources) {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let mut sources = PromptSources::for_workspace(dir.path());
        sources.assistant_name = "Andy".into();
        sources.timezone = "Europe/Berlin".into();
        (dir, sources)
    }

    /// The instruction part of the prompt (everything before the addendum).
    fn check_instructions(files: &[(&str, &str)], expect: Expect) {
        let (_dir, sources) = workspace(files);
        let prompt = build_system_prompt(&sources, &[]);
        let addendum = addendum(&sources, &[]);
        let instructions = prompt.strip_suffix(&addendum).unwrap();
        expect.assert_eq(instructions);
    }

    fn destination(name: &str, display: Option<&str>, kind: &str) -> Destination {
        Destination {
            name: name.into(),
            display_name: display.map(str::to_owned),
            kind: kind.into(),
            channel_type: Some("slack".into()),
            platform_id: Some(format!("C-{name}")),
            agent_group_id: None,
        }
    }

    #[test]
    fn global_group_and_local_in_order_with_nested_imports() {
        check_instructions(
            &[
                ("global/CLAUDE.md", "# Global\nBe kind.\n"),
                (
                    "agent/CLAUDE.md",
                    "# Group\n@docs/style.md\nAfter the import.\n",
                ),
                (
                    "agent/docs/style.md",
                    "Style: short sentences.\n  @../glossary/terms.md  \n",
                ),
                (
                    "agent/glossary/terms.md",
                    "Terms: a PR is a pull request.\n",
                ),
                (
                    "agent/CLAUDE.local.md",
                    "Local: the staging server is down.\n",
                ),
            ],
            expect![[r#"
                <!-- global instructions: global/CLAUDE.md -->
                # Global
                Be kind.

                <!-- agent group instructions: agent/CLAUDE.md -->
                # Group
                Style: short sentences.
                Terms: a PR is a pull request.
                After the import.

                <!-- local instructions: agent/CLAUDE.local.md -->
                Local: the staging server is down.

            "#]],
        );
    }

    #[test]
    fn cycles_missing_files_and_fenced_imports() {
        check_instructions(
            &[
                (
                    "agent/CLAUDE.md",
                    "@a.md\n@nope.md\n```md\n@a.md\n```\n~~~~\n@a.md\n~~~\n```\n~~~~\nend\n",
                ),
                ("agent/a.md", "A starts\n@b.md\nA ends"),
                ("agent/b.md", "B\n@a.md\n@CLAUDE.md"),
            ],
            expect![[r#"
                <!-- agent group instructions: agent/CLAUDE.md -->
                A starts
                B
                <!-- import cycle: a.md -->
                <!-- import cycle: CLAUDE.md -->
                A ends
                <!-- missing import: nope.md -->
                ```md
                @a.md
                ```
                ~~~~
                @a.md
                ~~~
                ```
                ~~~~
                end

            "#]],
        );
    }

    #[test]
    fn only_lines_that_are_exactly_one_path_import() {
        check_instructions(
            &[
                (
                    "agent/CLAUDE.md",
                    "Ask @bob about it.\n@ spaced.md\n@\nemail a@b.md\n\t@x.md\t\n    ```\n@x.md\n",
                ),
                ("agent/x.md", "X"),
            ],
            expect![[r#"
                <!-- agent group instructions: agent/CLAUDE.md -->
                Ask @bob about it.
                @ spaced.md
                @
                email a@b.md
                X
                    ```
                X

            "#]],
        );
    }

    #[test]
    fn absolute_imports_only_inside_the_workspace_and_depth_is_limited() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.md"), "SECRET").unwrap();
        let secret = outside.path().join("secret.md");
        let (dir, sources) = workspace(&[
            ("extra/notes/n.md", "Notes from extra."),
            ("agent/d1.md", "1\n@d2.md"),
            ("agent/d2.md", "2\n@d3.md"),
            ("agent/d3.md", "3\n@d4.md"),
            ("agent/d4.md", "4\n@d5.md"),
            ("agent/d5.md", "5\n@d6.md"),
            ("agent/d6.md", "6"),
        ]);
        let notes = dir.path().join("extra/notes/n.md");
        std::fs::write(
            dir.path().join("agent/CLAUDE.md"),
            format!(
                "@{}\n@{}\n@../../escape.md\n@d1.md\n@docs",
                notes.display(),
                secret.display()
            ),
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("agent/docs")).unwrap();
        let text = instructions(&sources, &dir.path().join("agent/CLAUDE.md")).unwrap();
        let text = text.replace(&secret.display().to_string(), "<outside>/secret.md");
        expect![[r#"
            Notes from extra.
            <!-- import outside the workspace: <outside>/secret.md -->
            <!-- missing import: ../../escape.md -->
            1
            2
            3
            4
            5
            <!-- import depth limit reached: d6.md -->
            <!-- import is not a file: docs -->"#]]
        .assert_eq(&text);
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_out_of_the_workspace_is_refused() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("key.md"), "KEY").unwrap();
        let (dir, sources) = workspace(&[("agent/CLAUDE.md", "@link.md")]);
        std::os::unix::fs::symlink(
            outside.path().join("key.md"),
            dir.path().join("agent/link.md"),
        )
        .unwrap();
        let text = instructions(&sources, &dir.path().join("agent/CLAUDE.md")).unwrap();
        assert_eq!(text, "<!-- import outside the workspace: link.md -->");
    }

    #[test]
    fn large_files_are_noted_not_inlined() {
        let big = "x".repeat(MAX_FILE_BYTES as usize + 1);
        let (dir, sources) = workspace(&[("agent/CLAUDE.md", "@big.md"), ("agent/big.md", &big)]);
        let text = instructions(&sources, &dir.path().join("agent/CLAUDE.md")).unwrap();
        assert_eq!(
            text,
            "<!-- import too large: big.md (262145 bytes, limit 262144) -->"
        );
    }

    #[test]
    fn a_prompt_inlines_a_bounded_number_of_imports_and_bytes() {
        // 200 KiB imported 10 times (2 MiB) and one small file imported 200 times: without the
        // limits the prompt held every copy.
        let big = "b".repeat(200 * 1024);
        let mut main = "@big.md\n".repeat(10);
        main.push_str(&"@small.md\n".repeat(200));
        let (dir, sources) = workspace(&[
            ("agent/CLAUDE.md", &main),
            ("agent/big.md", &big),
            ("agent/small.md", "s"),
        ]);
        let text = instructions(&sources, &dir.path().join("agent/CLAUDE.md")).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        // 1 MiB holds the CLAUDE.md and 5 copies of big.md; the 6th and later are notes.
        assert_eq!(lines.iter().filter(|line| **line == big).count(), 5);
        assert_eq!(
            lines[5..10],
            ["<!-- instruction size limit reached: big.md -->"; 5]
        );
        // 100 imports in all: 10 of big.md, then 90 of small.md; the other 110 are notes.
        assert_eq!(lines.iter().filter(|line| **line == "s").count(), 90);
        assert_eq!(
            lines
                .iter()
                .filter(|line| **line == "<!-- import limit reached: small.md -->")
                .count(),
            110
        );
        assert!(text.len() <= MAX_INSTRUCTION_BYTES + 110 * 64);
    }

    #[test]
    fn the_limits_are_shared_by_the_prompts_files() {
        // Each file alone is under the byte limit; together the third is over it.
        let big = "g".repeat(200 * 1024);
        let imports = "@big.md\n".repeat(2);
        let (_dir, sources) = workspace(&[
            ("global/CLAUDE.md", &imports),
            ("global/big.md", &big),
            ("agent/CLAUDE.md", &imports),
            ("agent/big.md", &big),
            ("agent/CLAUDE.local.md", &imports),
        ]);
        let prompt = build_system_prompt(&sources, &[]);
        assert_eq!(prompt.matches(big.as_str()).count(), 5);
        assert_eq!(
            prompt
                .matches("<!-- instruction size limit reached: big.md -->")
                .count(),
            1
        );
    }

    #[test]
    fn empty_files_are_left_out() {
        check_instructions(
            &[
                ("global/CLAUDE.md", " \n\n"),
                ("agent/CLAUDE.local.md", "local"),
            ],
            expect![[r#"
            <!-- local instructions: agent/CLAUDE.local.md -->
            local

        "#]],
        );
    }

    #[test]
    fn no_files_and_no_destinations_gives_only_the_addendum() {
        let (_dir, sources) = workspace(&[]);
        expect![[r#"
            ## NanoClaw runner

            You are Andy. You run inside a NanoClaw container and talk with people through chat platforms: the host delivers their messages to you and delivers what you send.

            ### Incoming messages
            - A prompt holds one `<message>` or several inside `<messages>`, with `sender` and `time` attributes; `from` names the destination a message came from when it is one of those listed below. Scheduled tasks arrive as `<task>`, webhooks as `<webhook>`, results of host actions as `<system_response>`.
            - The `id` attribute is the message's number (seq). Tools that take a `messageId` (add_reaction, edit_message) take such a number; send_message returns the number of the message it sent.
            - Times are in the Europe/Berlin time zone (the prompt's `<context timezone>`); schedule_task and the other task tools read and show times in that zone too.
            - Files sent to you are saved to disk and shown as `[file available at: <path>]`.

            ### How your replies are delivered
            - The final text of your turn is sent to the conversation the messages came from. An empty final text sends nothing.
            - To send to a destination, wrap the text in `<message to="name">…</message>`; each block goes to that destination. When your final text holds such blocks, only the blocks are sent and text outside them is dropped. A block to an unknown name is not sent.
            - `<internal>…</internal>` is never sent, wherever it appears: use it for notes to yourself.
            - To say something before your turn ends (progress, a heads-up before long work), use send_message, and do not repeat that text in your final reply.

            ### Destinations
            No named destinations are configured: your replies go to the conversation the messages came from.

            ### Tools (MCP server `nanoclaw`)
            Your CLI may show them with a prefix, e.g. `mcp__nanoclaw__send_message`.
            - `send_message`: send a chat message now, to the current conversation or to a destination (`to`)
            - `send_file`: send a file (a path relative to your working directory) to the chat
            - `send_card`: send a rich card (title, sections, buttons) with a plain-text fallback
            - `ask_user_question`: ask a multiple-choice question and wait for the answer
            - `edit_message`: replace the text of one of your earlier messages, by its number
            - `add_reaction`: react to a message with an emoji, by its number
            - `send_to_agent`: send a message to another agent group; its reply comes back as a message
            - `schedule_task`: schedule instructions for later: once at a time, or on a 5-field cron recurrence
            - `list_tasks`: list scheduled tasks with their ids and next runs
            - `update_task`: change a scheduled task's prompt, script, next run or recurrence
            - `cancel_task`: cancel a scheduled task for good
            - `pause_task`: pause a scheduled task until resume_task
            - `resume_task`: resume a paused task
            - `register_agent_group`: admin only: ask the host to register a new agent group for a chat channel"#]]
        .assert_eq(&build_system_prompt(&sources, &[]));
    }

    #[test]
    fn destinations_are_listed_with_how_to_address_them() {
        let (_dir, sources) = workspace(&[]);
        let destinations = [
            destination("ops", Some("Ops room"), "channel"),
            destination("research", None, "agent"),
            destination("odd", Some("a | b\nc"), "channel"),
        ];
        let prompt = build_system_prompt(&sources, &destinations);
        let start = prompt.find("### Destinations").unwrap();
        let end = prompt.find("### Tools").unwrap();
        expect![[r#"
            ### Destinations
            | name | display name | type |
            |---|---|---|
            | `ops` | Ops room | channel |
            | `research` |  | agent |
            | `odd` | a \| b c | channel |

            Address one with `<message to="ops">…</message>` in your reply, or with send_message and `to: "ops"`.

        "#]]
        .assert_eq(&prompt[start..end]);
    }

    #[test]
    fn the_same_inputs_give_the_same_prompt() {
        let (_dir, sources) = workspace(&[("agent/CLAUDE.md", "@a.md"), ("agent/a.md", "A")]);
        let destinations = [destination("ops", Some("Ops"), "channel")];
        assert_eq!(
            build_system_prompt(&sources, &destinations),
            build_system_prompt(&sources, &destinations)
        );
    }

    #[test]
    fn from_config_reads_the_paths_name_and_time_zone() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::config::Config::load(&crate::config::Inputs {
            workspace: dir.path().to_path_buf(),
            config_file: None,
            flags: vec![
                ("assistantName".into(), "Andy".into()),
                ("globalDir".into(), "/srv/global".into()),
            ],
            env: [("TZ".to_owned(), "Asia/Tokyo".to_owned())]
                .into_iter()
                .collect(),
        })
        .unwrap();
        let sources = PromptSources::from_settings(&config.settings().unwrap());
        assert_eq!(sources.global_dir, PathBuf::from("/srv/global"));
        assert_eq!(sources.agent_dir, dir.path().join("agent"));
        assert_eq!(sources.assistant_name, "Andy");
        assert_eq!(sources.timezone, "Asia/Tokyo");
    }

    /// The tool list matches the tools mcp-tools serves (each is a `#[tool]` method there).
    /// The addendum's tool list is the server's: the names mcp-tools' router really serves.
    #[tokio::test]
    async fn the_tool_list_is_the_servers_tool_list() {
        let dir = tempfile::tempdir().unwrap();
        let db_path = dir.path().join("session.db");
        let db = schema::SessionDb::open(&db_path).unwrap();
        let server = mcp_tools::server::NanoclawServer::new(
            db,
            mcp_tools::config::Config::new(db_path, dir.path().to_path_buf()),
        );
        let mut served = server.tool_names();
        served.sort();
        let mut listed: Vec<String> = TOOLS.iter().map(|(name, _)| (*name).to_owned()).collect();
        listed.sort();
        assert_eq!(
            listed, served,
            "the addendum's tools vs the tools mcp-tools serves"
        );
    }
}
