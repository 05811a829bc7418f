//! OpenCode provider: one long-lived `opencode serve` on loopback, `prompt_async` + `/event` SSE.
//!
//! # Lifecycle
//! The provider keeps one server process (its own process group, random basic-auth password,
//! configuration in `OPENCODE_CONFIG_CONTENT`, see [`command`]) across queries and respawns it
//! when it is gone. Queries run one at a time: each one takes the server, verifies or creates
//! the session (a stored continuation that no longer exists is replaced by a new session, with a
//! `Progress` notice and a new `Init`), subscribes to `GET /event` and posts its prompt with a
//! message id it chose itself, so every event can be tied to the prompt it answers.
//!
//! # Follow-ups
//! * While a tool call is running, a follow-up is posted at once: OpenCode queues it into the
//!   same run loop and the model sees it right after the tool result
//!   (docs/contract/providers.md#opencode), which keeps a blocking tool such as ask_user_question
//!   alive.
//! * Otherwise (the model is thinking or streaming) it is abort-and-restart
//!   (docs/contract/providers.md#opencode): `POST /session/{id}/abort`, wait until the aborted loop
//!   has settled (an idle event and a short quiet period, since an abort produces two idles), then
//!   one `prompt_async` with every follow-up that arrived meanwhile. The aborted message and its
//!   partial answer stay in OpenCode's history, so the restart sends only what the model has not
//!   seen.
//! * After the last result, a follow-up waits for the loop's idle before it is posted, so it
//!   never lands in a loop that is just exiting.
//!
//! # Results
//! A result is an assistant message answering one of the posted messages (its `parentID`),
//! finished with a reason that ends OpenCode's run loop, reported when the session goes idle
//! (see [`translate`]); `covers` follows from the message ids, never from counting events.
//!
//! # Interrupts, limits, usage (issues 14 and 15)
//! `interrupt()` and a turn past `maxTurnsPerQuery` (a step that ended in tool calls) end the
//! turn through `POST /session/{id}/abort`; once the loop is idle (1.8 s at most) the query
//! reports `Interrupted` and closes, the server and the session live on. Every prompt names its
//! model (the query's `/model` choice or the configured one); a name the running server's
//! config does not list restarts it once with the name declared. Usage is summed from the
//! `step-finish` parts (`translate.rs`).
//!
//! # Tool policy, approvals, approval stops, remote MCP (issue 16)
//! A restricting policy becomes OpenCode's `permission` config and every `permission.asked` is
//! decided by the policy (`approval.rs`): allowed → `once`, denied → `reject` with a message
//! (the model reads it, the turn goes on) and `ToolDenied`, asked → `ApprovalRequest`, replied
//! with the runner's answer; the watchdog waits for it. Approval-stop tools end the turn through
//! a server plugin that blocks the next model request (`Interrupted { ApprovalStop }`). Remote
//! MCP servers are `remote` entries whose header values OpenCode reads from private files.
//!
//! # Failures
//! The SSE stream ending means the server died (`Process`, retryable; the next query respawns
//! and resumes). No session event for `settings.watchdog` during a turn (longer while a tool
//! runs, up to the MCP timeout) kills the server (`Watchdog`). OpenCode's own model retries are
//! hard-coded; past `settings.max_retries` the provider aborts them and reports the error.
//!
//! # Archiving (issue 5)
//! After a query's stream is closed and its run loop settled, the session's history
//! (`GET /session/{id}/message`) is archived as Markdown to `<agent dir>/conversations/`
//! (`archiving.rs`): a side job that starts once the query released the server, so it never
//! fails or delays a query, and that shutdown waits for briefly before stopping the server.

mod approval;
mod archiving;
mod command;
mod connection;
mod driver;
mod history;
mod protocol;
mod server;
mod tools;
mod translate;

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use procs::resolve_cli;
use provider::recording::Recording;
use provider::{AgentProvider, AgentQuery, ProviderError, ProviderSettings, QueryInput};
use server::{lock, IdClock, Shared};

/// The setting (env variable) that names the `opencode` binary.
const CLI_PATH_SETTING: &str = "OPENCODE_PATH";

/// The OpenCode provider.
#[derive(Debug, Clone)]
pub struct OpenCodeProvider {
    shared: Arc<Shared>,
}

impl OpenCodeProvider {
    /// Resolves the `opencode` binary (`settings.cli_path`, `PATH`, or the project's `.cli`);
    /// the server starts with the first query.
    pub fn new(settings: ProviderSettings) -> Result<Self, ProviderError> {
        let program = resolve_cli(
            "opencode",
            settings.cli_path.as_deref(),
            CLI_PATH_SETTING,
            Some(&settings.workspace),
        )?;
        Ok(Self {
            shared: Arc::new(Shared {
                settings,
                program,
                slot: tokio::sync::Mutex::new(None),
                stop: Mutex::new(CancellationToken::new()),
                ids: Mutex::new(IdClock::default()),
                record: Mutex::new(None),
                pid: Mutex::new(None),
                extra_models: Mutex::new(Default::default()),
                archive: provider::archive::job::Archives::default(),
            }),
        })
    }

    /// Appends every SSE payload the provider reads and every prompt it posts to the
    /// recording's file (JSON lines). The fixtures under `drivers/opencode/tests/fixtures/opencode/`
    /// are such recordings.
    pub fn record_events(&self, recording: Recording) {
        *lock(&self.shared.record) = Some(recording);
    }

    /// Pid of the running server (the leader of its process group), if any.
    pub fn server_pid(&self) -> Option<u32> {
        *lock(&self.shared.pid)
    }
}

impl AgentProvider for OpenCodeProvider {
    fn name(&self) -> &'static str {
        "opencode"
    }

    fn query(&self, input: QueryInput) -> Result<AgentQuery, ProviderError> {
        if !self.shared.program.is_file() {
            return Err(ProviderError::Spawn(format!(
                "the opencode CLI at {} is gone; fix {CLI_PATH_SETTING} or reinstall it",
                self.shared.program.display()
            )));
        }
        let (query, handle) = AgentQuery::channel();
        let stop = lock(&self.shared.stop).clone();
        tokio::spawn(driver::run_query(self.shared.clone(), input, handle, stop));
        Ok(query.with_auth_hint(self.shared.settings.auth_hint.clone()))
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let stop = std::mem::take(&mut *lock(&self.shared.stop));
            stop.cancel();
            let mut slot = self.shared.slot.lock().await;
            if let Some(mut server) = slot.take() {
                // The last query's archive reads the history from this server.
                self.shared.archive.wait_idle("opencode").await;
                server.stop().await;
            }
            *lock(&self.shared.pid) = None;
        })
    }
}
