//! ACP provider: any agent that speaks the Agent Client Protocol (JSON-RPC 2.0 over its stdio,
//! docs/contract/providers.md#acp), one long-lived process per provider. Gemini CLI (`gemini`)
//! and Qwen Code (`qwen`) are presets of it; `acp` runs any `acpCommand` (e.g. `opencode acp`)
//! with nothing specific to it.
//!
//! * Process: spawned on the first query (or after it died, hung or broke the protocol) in its
//!   own process group through `procs`, HOME its private home, and `initialize`d advertising no
//!   file-system or terminal capability ([`protocol::initialize_params`]): the agent uses its
//!   own tools, whose calls the tool policy judges at `session/request_permission`.
//! * Session: the continuation is the ACP session id. `session/new` with the agent dir as `cwd`
//!   and the MCP servers (mcp-tools always, the configured stdio servers, the remote ones when the
//!   agent takes HTTP); after a restart `session/load` when the agent offers it; otherwise, or
//!   when it fails, a new session announced with a `Progress` and a new `Init`. The system prompt
//!   travels as a leading text block whenever the session has not received it yet.
//! * Turns: one `session/prompt` each; `session/update`s build the reply and the progress
//!   ([`translate`]); follow-ups are abort-and-restart (`session/cancel`, one prompt with both);
//!   the runner's interrupt is `session/cancel` and the session lives on.
//! * Faults: the agent exiting, a line that is not JSON-RPC, a JSON-RPC error, an
//!   authentication requirement and silence past the watchdog each end the turn with a
//!   classified error; a broken or hung agent is stopped (its whole process group) and the next
//!   query starts a new one.
//! * Archiving (issue 5): the driver keeps a journal per session and archives what is new after
//!   each query (`archiving.rs`, `history.rs`).

mod approval;
mod archiving;
mod command;
mod connection;
mod driver;
mod history;
mod protocol;
mod tools;
mod translate;

use std::sync::Arc;

use futures::future::BoxFuture;

pub use command::{AgentSpec, EmptyCommand};
use driver::Shared;
use procs::resolve_cli;
use provider::{AgentProvider, AgentQuery, ProviderError, ProviderSettings, QueryInput};

/// The ACP provider.
#[derive(Debug, Clone)]
pub struct AcpProvider {
    shared: Arc<Shared>,
}

impl AcpProvider {
    /// A provider running `spec`'s agent. Fails with [`ProviderError::Spawn`] naming the
    /// setting to fix when the program cannot be found. No process starts before the first
    /// query.
    pub fn new(settings: ProviderSettings, spec: AgentSpec) -> Result<Self, ProviderError> {
        let explicit = if spec.path_override {
            settings.cli_path.clone()
        } else {
            None
        }
        .or_else(|| {
            spec.program
                .contains('/')
                .then(|| spec.program.clone().into())
        });
        let program = resolve_cli(
            spec.program_name(),
            explicit.as_deref(),
            spec.path_setting,
            Some(&settings.workspace),
        )?;
        tracing::info!(provider = spec.provider, program = %program.display(), args = ?spec.args, "ACP provider ready");
        // ACP reports no model steps and no tool results the driver could hold the turn at.
        if let Some(max) = settings.max_turns_per_query {
            tracing::warn!(
                max,
                "maxTurnsPerQuery is not enforced for ACP agents (ACP reports no model steps)"
            );
        }
        if spec.provider == "acp" && !settings.tool_policy.allows_everything() {
            tracing::warn!(
                "toolPolicy restricts tools, but an ACP agent asks permission only where its own \
                 configuration says so: configure the agent to ask (e.g. OpenCode's permission \
                 \"ask\") for the calls the policy must see"
            );
        }
        if !settings.approval_stop_tools.is_empty() {
            tracing::warn!(tools = ?settings.approval_stop_tools, "approvalStopTools are not supported for ACP agents yet; those tools run like any other");
        }
        Ok(Self {
            shared: Arc::new(Shared {
                settings,
                spec,
                program,
                slot: tokio::sync::Mutex::new(None),
                archive: provider::archive::job::Archives::default(),
            }),
        })
    }

    /// The pid of the running agent (the leader of its process group), if any.
    pub async fn pid(&self) -> Option<u32> {
        let slot = self.shared.slot.lock().await;
        slot.as_ref()
            .filter(|live| live.agent.is_alive())
            .map(|live| live.agent.pid())
    }
}

impl AgentProvider for AcpProvider {
    fn name(&self) -> &'static str {
        self.shared.spec.provider
    }

    fn query(&self, input: QueryInput) -> Result<AgentQuery, ProviderError> {
        if !self.shared.program.is_file() {
            return Err(ProviderError::Spawn(format!(
                "the ACP agent at {} is gone; fix {} or reinstall it",
                self.shared.program.display(),
                self.shared.spec.path_setting
            )));
        }
        let (query, handle) = AgentQuery::channel();
        tokio::spawn(driver::run_query(self.shared.clone(), input, handle));
        Ok(query.with_auth_hint(self.shared.settings.auth_hint.clone()))
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let live = self.shared.slot.lock().await.take();
            if let Some(live) = live {
                self.shared.archive.wait_idle("the ACP agent").await;
                live.agent.terminate().await;
            }
        })
    }
}
