//! `agent-runner archive-hook`: Claude's `PreCompact` hook (issue 5). Before Claude compacts its
//! context it runs this subcommand with the hook JSON on stdin (`{session_id, transcript_path,
//! cwd, hook_event_name: "PreCompact", trigger, custom_instructions}`, captured in
//! `provider/tests/fixtures/archive/claude_precompact_hook.json`); it reads the session file at
//! `transcript_path`, keeps the part since the last compaction (an earlier run archived what
//! came before; `--full` keeps everything) and writes it with
//! [`provider::archive::write_archive_with`] into the conversations folder as a new
//! `<YYYY-MM-DD>-<slug>.md` (never replacing a file).
//!
//! The hook must never get in the way of compaction: whatever goes wrong (bad stdin, a missing
//! transcript, an unwritable folder, a broken config) is logged on stderr and the process still
//! exits 0. The provider installs it through `--settings`, see
//! [`claude::claude_hook_settings`].

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use provider::archive::{self, RenderOptions};
use serde::Deserialize;

use crate::config::Settings;

/// The most hook JSON read from stdin (it is a few hundred bytes).
const MAX_STDIN_BYTES: u64 = 1 << 20;

/// `archive-hook` options.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ArchiveHookArgs {
    /// Folder of the archives [default: <agentDir>/conversations, i.e.
    /// /workspace/agent/conversations].
    #[arg(long, value_name = "DIR")]
    pub conversations_dir: Option<PathBuf>,
    /// IANA time zone of the file's date and the times shown [default: the configured TZ].
    #[arg(long, value_name = "TZ")]
    pub timezone: Option<String>,
    /// Archive the whole transcript, not only the part since the last compaction.
    #[arg(long)]
    pub full: bool,
}

/// The fields of Claude's hook input this uses.
#[derive(Debug, Clone, Deserialize)]
pub struct HookInput {
    /// Claude's session id.
    #[serde(default)]
    pub session_id: Option<String>,
    /// The session file (`$HOME/.claude/projects/<cwd>/<session id>.jsonl`).
    #[serde(default)]
    pub transcript_path: Option<PathBuf>,
    /// `PreCompact` (any other event archives the same way).
    #[serde(default)]
    pub hook_event_name: Option<String>,
    /// `manual` (`/compact`) or `auto`.
    #[serde(default)]
    pub trigger: Option<String>,
}

/// Where and how the archive is written.
#[derive(Debug, Clone)]
pub struct HookSettings {
    /// The conversations folder.
    pub conversations_dir: PathBuf,
    /// Time zone of the file date and the times shown.
    pub timezone: Tz,
    /// Heading of the agent's messages.
    pub assistant_name: Option<String>,
    /// Archive the whole transcript.
    pub full: bool,
}

impl HookSettings {
    /// Settings from the flags, then the configuration (when it loaded), then defaults under
    /// `workspace`.
    pub fn resolve(args: &ArchiveHookArgs, config: Option<&Settings>, workspace: &Path) -> Self {
        let agent_dir = config.map_or_else(|| workspace.join("agent"), |c| c.dirs.agent.clone());
        let tz_name = args
            .timezone
            .clone()
            .or_else(|| config.map(|c| c.timezone_name.clone()))
            .or_else(|| std::env::var("TZ").ok())
            .unwrap_or_else(|| "UTC".into());
        Self {
            conversations_dir: args
                .conversations_dir
                .clone()
                .unwrap_or_else(|| agent_dir.join("conversations")),
            timezone: archive::parse_tz(&tz_name),
            assistant_name: config.and_then(|c| c.assistant_name.clone()),
            full: args.full,
        }
    }
}

/// Runs the hook: reads stdin, archives, logs the outcome. Never fails.
pub fn main(args: &ArchiveHookArgs, config: Result<Settings>, workspace: &Path) {
    let config = match config {
        Ok(config) => Some(config),
        Err(err) => {
            tracing::warn!(
                "archive-hook: the configuration did not load ({err:#}); using defaults"
            );
            None
        }
    };
    let settings = HookSettings::resolve(args, config.as_ref(), workspace);
    let mut stdin = String::new();
    if let Err(err) = std::io::stdin()
        .take(MAX_STDIN_BYTES)
        .read_to_string(&mut stdin)
    {
        tracing::error!(
            "archive-hook: cannot read the hook input on stdin: {err}; nothing archived"
        );
        return;
    }
    match archive(&stdin, &settings, Utc::now()) {
        Ok(Some((path, entries))) => tracing::info!(
            path = %path.display(),
            entries,
            "archive-hook: transcript archived"
        ),
        Ok(None) => tracing::info!("archive-hook: nothing to archive"),
        Err(err) => tracing::error!("archive-hook: nothing archived: {err:#}"),
    }
}

/// Archives the transcript named by the hook input `input`; returns the file written and the
/// number of entries in it, or `None` when there was nothing to archive.
pub fn archive(
    input: &str,
    settings: &HookSettings,
    now: DateTime<Utc>,
) -> Result<Option<(PathBuf, usize)>> {
    let hook: HookInput = serde_json::from_str(input.trim())
        .context("the hook input on stdin is not the expected JSON")?;
    let Some(path) = hook
        .transcript_path
        .as_deref()
        .filter(|p| !p.as_os_str().is_empty())
    else {
        bail!("the hook input has no transcript_path");
    };
    tracing::debug!(
        event = hook.hook_event_name.as_deref().unwrap_or("?"),
        trigger = hook.trigger.as_deref().unwrap_or("?"),
        transcript = %path.display(),
        "archive-hook"
    );
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the transcript {}", path.display()))?;
    let mut transcript = claude::from_claude_jsonl(&text);
    if transcript.session_id.is_empty() {
        transcript.session_id = hook.session_id.unwrap_or_default();
    }
    if !settings.full {
        transcript = transcript.since_last_compaction();
    }
    if !transcript
        .entries
        .iter()
        .any(|e| e.role != archive::Role::System)
    {
        return Ok(None);
    }
    let opts = RenderOptions {
        assistant_name: settings.assistant_name.clone(),
        ..RenderOptions::new(settings.timezone, now)
    };
    let written = archive::write_archive_with(&settings.conversations_dir, &transcript, &opts)
        .with_context(|| format!("writing into {}", settings.conversations_dir.display()))?;
    Ok(Some((written, transcript.entries.len())))
}
