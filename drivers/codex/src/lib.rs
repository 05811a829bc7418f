//! Codex provider: one long-lived `codex app-server` (JSON-RPC over stdio,
//! docs/contract/providers.md#codex).
//!
//! * Process: spawned on the first query (or after it died, was killed by the watchdog, or
//!   another session is wanted), kept across queries and turns. One session (thread) per
//!   process: a thread stays loaded with its MCP servers even after `thread/unsubscribe`, so a
//!   new session after `/clear` gets a fresh process. Configuration is entirely `-c` overrides
//!   plus a private `CODEX_HOME` ([`command`]).
//! * Binary: when the resolved `codex` is the npm launcher (`bin/codex.js`), the native binary
//!   it would exec is run directly ([`command::native_binary`]): no node process, no node needed
//!   at run time, and the same signals and process group.
//! * Session: the continuation is the Codex thread id. `thread/start` with the system prompt as
//!   developer instructions, or `thread/resume` (a thread Codex does not know → a fresh thread,
//!   announced with a `Progress` and a new `Init`).
//! * Turns: `turn/start`; text comes from `agentMessage` items; `turn/completed` ends a turn.
//! * Follow-ups: abort-and-restart by default (`turn/interrupt`, then one `turn/start` with every
//!   prompt not yet answered), or native `turn/steer` with `settings.codex_steer`
//!   ([`translate::QueryState`]).
//! * Archiving (issue 5): after a query's stream is closed, the turns since the last archived
//!   entry are read back with `thread/turns/list` (newest first, one page as a rule) and their
//!   new entries written as Markdown to `<agent dir>/conversations/` (`archiving.rs`); a side
//!   job that never fails or delays a query.
//!
//! The system prompt after a resume: Codex 0.169 keeps the developer instructions recorded when
//! the thread started and ignores new ones on `thread/resume` (and `-c developer_instructions`).
//! The original instructions stay in the thread's history, so they do reach the model after a
//! resume; when the system prompt changed since, the new one is appended to the history as a
//! developer message with `thread/inject_items`. What each thread last received is recorded
//! under `CODEX_HOME/nanoclaw/instructions/`.

mod approval;
mod archiving;
mod command;
mod connection;
mod driver;
mod history;
mod hooks;
mod protocol;
mod translate;

use std::sync::Arc;

use futures::future::BoxFuture;

use self::connection::Transcript;
use self::driver::{rpc_lock, Shared};
use procs::resolve_cli;
use provider::recording::Recording;
use provider::{AgentProvider, AgentQuery, ProviderError, ProviderSettings, QueryInput};

/// The setting (env variable) that names the `codex` binary.
const CLI_PATH_SETTING: &str = "CODEX_PATH";

/// The Codex provider.
#[derive(Debug, Clone)]
pub struct CodexProvider {
    shared: Arc<Shared>,
}

impl CodexProvider {
    /// A provider for these settings. Fails with [`ProviderError::Spawn`] naming `CODEX_PATH`
    /// when the CLI cannot be found. No process starts before the first query.
    pub fn new(settings: ProviderSettings) -> Result<Self, ProviderError> {
        let configured = resolve_cli(
            "codex",
            settings.cli_path.as_deref(),
            CLI_PATH_SETTING,
            Some(&settings.workspace),
        )?;
        let program = command::native_binary(&configured).unwrap_or_else(|| configured.clone());
        tracing::info!(configured = %configured.display(), program = %program.display(), "codex provider ready");
        Ok(Self {
            shared: Arc::new(Shared {
                settings,
                program,
                configured,
                server: tokio::sync::Mutex::new(None),
                transcript: std::sync::Mutex::new(None),
                archive: provider::archive::job::Archives::default(),
                interrupt_delay: std::sync::Mutex::new(std::time::Duration::ZERO),
            }),
        })
    }

    /// Makes the driver wait this long before each `turn/interrupt` it sends. A test hook: it
    /// plays a driver slowed by load, to show that an approval stop holds Codex until the
    /// interrupt comes (the approval-stop hook, `command.rs`).
    pub fn delay_interrupts(&self, delay: std::time::Duration) {
        *rpc_lock(&self.shared.interrupt_delay) = delay;
    }

    /// Records every JSON-RPC line and control of later app-server processes to the
    /// recording's file (JSON lines; see [`Transcript`]). For debugging and for capturing test
    /// fixtures.
    pub fn record_transcript(&self, recording: Recording) -> Result<(), ProviderError> {
        let path = recording.path().to_owned();
        let transcript = Transcript::open(recording).map_err(|err| {
            ProviderError::Other(format!("cannot open {}: {err}", path.display()))
        })?;
        *rpc_lock(&self.shared.transcript) = Some(transcript);
        Ok(())
    }

    /// The pid of the running app-server, if any (tests kill it to simulate a crash).
    pub async fn pid(&self) -> Option<u32> {
        let server = self.shared.server.lock().await;
        server.as_ref().filter(|s| s.is_alive()).map(|s| s.pid())
    }
}

impl AgentProvider for CodexProvider {
    fn name(&self) -> &'static str {
        "codex"
    }

    fn query(&self, input: QueryInput) -> Result<AgentQuery, ProviderError> {
        if !self.shared.program.is_file() {
            return Err(ProviderError::Spawn(format!(
                "the codex CLI at {} is gone; fix {CLI_PATH_SETTING} or reinstall the codex CLI",
                self.shared.configured.display()
            )));
        }
        let (query, handle) = AgentQuery::channel();
        tokio::spawn(driver::run_query(self.shared.clone(), input, handle));
        Ok(query.with_auth_hint(self.shared.settings.auth_hint.clone()))
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let server = self.shared.server.lock().await.take();
            if let Some(server) = server {
                // The last query's archive reads the thread from this process.
                self.shared.archive.wait_idle("codex").await;
                server.terminate().await;
            }
        })
    }
}
