//! Claude Code provider: one long-lived `claude -p` stream-json process per session.
//!
//! * **Process.** `claude -p --input-format stream-json --output-format stream-json --verbose`
//!   stays alive across queries and turns ([`command`] has the whole command line and
//!   environment). A query reuses it when it is alive and was started for the query's
//!   continuation and system prompt; otherwise it is (re)started with `--resume <continuation>`
//!   (the system prompt applies on resume too: `--system-prompt-snapshot off`).
//! * **Prompts.** Every prompt (the first and each push) is a user line on stdin, stamped with a
//!   uuid of ours; images and PDFs go as native content blocks ([`media`]). A push written while
//!   a tool runs is folded into the running turn, one written while text streams runs as its own
//!   turn; results list the uuids they consumed, which gives `covers` ([`translate`]).
//! * **Events.** `system/init` → `Init` (first and on change), `result` → `Result` or, with
//!   `is_error`, `Error { ends_turn: true }`, or at `--max-turns` `Interrupted { MaxTurns }`,
//!   each with the turn's `Usage`; an assistant text block → `Text`, a tool call →
//!   `Activity { tool, summary }`; `system/api_retry` → `Error { ends_turn: false }`;
//!   compaction notices → `Progress`; everything → `Activity`.
//! * **Ending early.** `Abort`, `Interrupt` (→ `Interrupted { Stopped }`), a dropped query or an
//!   error result interrupt the CLI with `control_request` `interrupt` + `cancel_queued`, so
//!   nothing of the query runs after it ends; the process and session live on.
//! * **Model.** A query for another model than the live process runs switches it with
//!   `control_request` `set_model` (a refused model ends the query with the CLI's error).
//! * **Failures.** A process exit mid-turn → `Error { Process, retryable }` and a respawn on the
//!   next query; no output for `settings.watchdog` during a turn → the group is killed,
//!   `Error { Watchdog }`; a missing session on `--resume` → a new session for the same prompts,
//!   with a `Progress` notice and a new `Init`.
//! * **Tool policy** (issue 16, [`approval`]). With a restricting policy or approval-stop tools,
//!   the process gets an `initialize` control request with `PreToolUse` / `PostToolUse` hook
//!   callbacks: every tool call is decided by `ToolPolicy::judge` (deny →
//!   `ToolDenied`, or `ToolUndecidable` with the reason, ask → `ApprovalRequest`, answered on `Control::Approval`), a stop tool's result
//!   ends the turn (`Interrupted { ApprovalStop }`); MCP elicitations are declined or asked.
//!   Claude's own refusals (`--disallowedTools`) → `ToolDenied`.
//! * **Archiving** (issue 5). With `settings.runner_exe` set, `--settings` carries a
//!   `PreCompact` hook running `agent-runner archive-hook`, which writes the transcript to
//!   `<agent dir>/conversations/` before Claude compacts it (`/compact` or automatically).

mod approval;
mod command;
mod driver;
mod history;
mod media;
mod protocol;
mod quote;
mod translate;

use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

pub use command::DISALLOWED_TOOLS;
use command::NATIVE_COMMANDS;
pub use history::{claude_hook_settings, from_claude_jsonl};

use driver::Shared;
use procs::resolve_cli;
use provider::{AgentProvider, AgentQuery, ProviderError, ProviderSettings, QueryInput};

/// The setting (env variable) that names the `claude` binary.
const CLI_PATH_SETTING: &str = "CLAUDE_PATH";

/// The Claude Code provider.
#[derive(Debug, Clone)]
pub struct ClaudeProvider {
    shared: Arc<Shared>,
}

impl ClaudeProvider {
    /// A provider for `settings`: finds the CLI (a missing one is [`ProviderError::Spawn`]
    /// naming `CLAUDE_PATH`; each query looks it up again) and creates the private HOME.
    /// No process starts before the first query.
    pub fn new(settings: ProviderSettings) -> Result<Self, ProviderError> {
        let cli = Self::cli(&settings)?;
        std::fs::create_dir_all(&settings.home_dir).map_err(|err| {
            ProviderError::Other(format!(
                "cannot create the claude HOME {}: {err}",
                settings.home_dir.display()
            ))
        })?;
        tracing::debug!(cli = %cli.display(), "claude provider ready");
        Ok(Self {
            shared: Arc::new(Shared {
                settings,
                slot: Arc::new(tokio::sync::Mutex::new(None)),
                stop: CancellationToken::new(),
            }),
        })
    }

    /// The pid (and process group id) of the running `claude`, if one runs. Waits for a query
    /// that holds the process to finish.
    pub async fn pid(&self) -> Option<u32> {
        self.shared
            .slot
            .lock()
            .await
            .as_ref()
            .map(driver::Live::pid)
    }

    fn cli(settings: &ProviderSettings) -> Result<PathBuf, ProviderError> {
        resolve_cli(
            "claude",
            settings.cli_path.as_deref(),
            CLI_PATH_SETTING,
            None,
        )
        .map_err(ProviderError::from)
    }
}

impl AgentProvider for ClaudeProvider {
    fn name(&self) -> &'static str {
        "claude"
    }

    fn query(&self, input: QueryInput) -> Result<AgentQuery, ProviderError> {
        if self.shared.stop.is_cancelled() {
            return Err(ProviderError::Closed);
        }
        let program = Self::cli(&self.shared.settings)?;
        let (query, handle) = AgentQuery::channel();
        tokio::spawn(driver::run_query(
            Arc::clone(&self.shared),
            program,
            input,
            handle,
        ));
        Ok(query.with_auth_hint(self.shared.settings.auth_hint.clone()))
    }

    fn native_commands(&self) -> &'static [&'static str] {
        NATIVE_COMMANDS
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.shared.stop.cancel();
            // A running query sees the cancellation, stops its process and releases the slot.
            let mut slot = self.shared.slot.lock().await;
            if let Some(live) = slot.take() {
                live.terminate().await;
            }
        })
    }
}
