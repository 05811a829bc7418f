//! The MCP server `nanoclaw`: the tool router (descriptions written for the model) and the
//! `ServerHandler`. Tool bodies live in [`crate::tools`].

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ProtocolVersion, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::db::Db;
use crate::error::ToolResult;
use crate::params::*;
use crate::tools::{self, Ctx, Waiting};

/// Name the server announces; the CLIs show its tools as `mcp__nanoclaw__<tool>` and similar.
pub const SERVER_NAME: &str = "nanoclaw";

/// Newest protocol version served: the last one with the `initialize` lifecycle (see
/// [`crate::transport`]).
pub const MAX_PROTOCOL_VERSION: ProtocolVersion = ProtocolVersion::V_2025_11_25;

const INSTRUCTIONS: &str = "Tools for talking to the people in this chat session: send messages, \
files and cards, ask a question and wait for the answer, react to or edit messages, message \
other agents, and schedule tasks that wake you later. Plain replies you write at the end of a \
turn are delivered automatically; use send_message for progress updates during long work or to \
reach another destination.";

/// The server. Cheap to clone.
#[derive(Clone)]
pub struct NanoclawServer {
    ctx: Ctx,
    router: Arc<ToolRouter<NanoclawServer>>,
}

impl NanoclawServer {
    /// A server over `db` with `config`.
    pub fn new(db: schema::SessionDb, config: Config) -> Self {
        Self {
            ctx: Ctx {
                db: Db::new(db, crate::db::DB_CONCURRENCY),
                config: Arc::new(config),
                waiting: Arc::new(Waiting::default()),
            },
            router: Arc::new(Self::tool_router()),
        }
    }

    /// Waits (at most `limit`) until no `ask_user_question` is mid-way, so a shutdown still
    /// closes its question and restores the runner's status.
    pub async fn wait_idle(&self, limit: Duration) {
        self.ctx.waiting.wait_idle(limit).await;
    }

    /// Every tool's name, in the router's order.
    pub fn tool_names(&self) -> Vec<String> {
        self.router
            .list_all()
            .into_iter()
            .map(|t| t.name.into_owned())
            .collect()
    }
}

/// Logs a tool's outcome and turns its error into the text of an error result.
fn finish(tool: &str, result: ToolResult) -> Result<String, String> {
    match result {
        Ok(text) => {
            tracing::debug!(tool, %text, "tool call done");
            Ok(text)
        }
        Err(err) => {
            tracing::info!(tool, %err, "tool call refused or failed");
            Err(err.to_string())
        }
    }
}

#[tool_router]
impl NanoclawServer {
    #[tool(
        description = "Send a chat message now, while you keep working. Use it for progress updates during \
        long work, to reach another destination (`to`), or to say something before a tool \
        that takes a while. Your final reply at the end of a turn is delivered anyway, so do \
        not repeat it here. By default the message goes to the conversation you are \
        answering. Returns the message's number (seq), which edit_message accepts."
    )]
    async fn send_message(
        &self,
        Parameters(p): Parameters<SendMessageParams>,
    ) -> Result<String, String> {
        finish(
            "send_message",
            tools::messages::send_message(&self.ctx, p).await,
        )
    }

    #[tool(
        description = "Send a file to the chat: a report, an image, an export you made. The file must be \
        inside your folders (relative paths start at /workspace/agent); it is copied, so you \
        may change or delete it afterwards. Directories, files over the size limit and paths \
        that lead outside your folders are refused. Returns the message's number (seq)."
    )]
    async fn send_file(&self, Parameters(p): Parameters<SendFileParams>) -> Result<String, String> {
        finish("send_file", tools::files::send_file(&self.ctx, p).await)
    }

    #[tool(
        description = "Send a rich card (title, sections, buttons) where the chat platform supports cards, \
        with fallbackText for the rest. For plain text use send_message; to ask the user to \
        choose and wait for the choice use ask_user_question."
    )]
    async fn send_card(&self, Parameters(p): Parameters<SendCardParams>) -> Result<String, String> {
        finish("send_card", tools::messages::send_card(&self.ctx, p).await)
    }

    #[tool(
        description = "Ask the user a multiple-choice question and WAIT for the answer (up to `timeout` \
        seconds, default 300). Use it when you cannot go on without a decision from the \
        user. Returns the value of the chosen option. If nobody answers in time the result \
        is an error saying so; a late answer then reaches you as an ordinary message."
    )]
    async fn ask_user_question(
        &self,
        Parameters(p): Parameters<AskUserQuestionParams>,
        cancel: CancellationToken,
    ) -> Result<String, String> {
        finish(
            "ask_user_question",
            tools::question::ask_user_question(&self.ctx, p, cancel).await,
        )
    }

    #[tool(
        description = "Replace the text of one of YOUR earlier messages (by the seq send_message returned), \
        e.g. to update a progress message in place instead of sending a new one."
    )]
    async fn edit_message(
        &self,
        Parameters(p): Parameters<EditMessageParams>,
    ) -> Result<String, String> {
        finish(
            "edit_message",
            tools::messages::edit_message(&self.ctx, p).await,
        )
    }

    #[tool(
        description = "React to a message with an emoji, e.g. 👀 to show you are on it or ✅ when done. The \
        message is given by its number: the `id` of an incoming message, or a seq a tool \
        returned."
    )]
    async fn add_reaction(
        &self,
        Parameters(p): Parameters<AddReactionParams>,
    ) -> Result<String, String> {
        finish(
            "add_reaction",
            tools::messages::add_reaction(&self.ctx, p).await,
        )
    }

    #[tool(
        description = "Send a message to another agent group (another agent with its own folder and \
        sessions). Its reply, if any, comes back to you later as an incoming message."
    )]
    async fn send_to_agent(
        &self,
        Parameters(p): Parameters<SendToAgentParams>,
    ) -> Result<String, String> {
        finish(
            "send_to_agent",
            tools::messages::send_to_agent(&self.ctx, p).await,
        )
    }

    #[tool(
        description = "Schedule a task that wakes you later with `prompt` as instructions: once at \
        `processAfter`, or repeatedly on a cron `recurrence` (times in the server's time \
        zone). Use it for reminders, follow-ups and recurring reports. Returns the task id \
        (needed by update_task, pause_task, resume_task and cancel_task) and the next run in \
        local time."
    )]
    async fn schedule_task(
        &self,
        Parameters(p): Parameters<ScheduleTaskParams>,
    ) -> Result<String, String> {
        finish(
            "schedule_task",
            tools::tasks::schedule_task(&self.ctx, p).await,
        )
    }

    #[tool(
        description = "List scheduled tasks (upcoming, paused, or running now) with their ids, next run in \
        local time, recurrence and prompt.",
        annotations(read_only_hint = true)
    )]
    async fn list_tasks(
        &self,
        Parameters(p): Parameters<ListTasksParams>,
    ) -> Result<String, String> {
        finish("list_tasks", tools::tasks::list_tasks(&self.ctx, p).await)
    }

    #[tool(
        description = "Change a scheduled task: its prompt, script, next run time (processAfter) or cron \
        recurrence. Only the fields you give change. A new recurrence moves the next run to \
        the next matching time unless you also give processAfter."
    )]
    async fn update_task(
        &self,
        Parameters(p): Parameters<UpdateTaskParams>,
    ) -> Result<String, String> {
        finish("update_task", tools::tasks::update_task(&self.ctx, p).await)
    }

    #[tool(
        description = "Cancel a scheduled task for good: its upcoming runs are deleted (a run in progress \
        finishes). To stop it only for a while, use pause_task.",
        annotations(destructive_hint = true)
    )]
    async fn cancel_task(&self, Parameters(p): Parameters<TaskIdParams>) -> Result<String, String> {
        finish("cancel_task", tools::tasks::cancel_task(&self.ctx, p).await)
    }

    #[tool(
        description = "Pause a scheduled task: none of its runs happen until you call resume_task (a run \
        in progress finishes first). To remove a task for good, use cancel_task."
    )]
    async fn pause_task(&self, Parameters(p): Parameters<TaskIdParams>) -> Result<String, String> {
        finish("pause_task", tools::tasks::pause_task(&self.ctx, p).await)
    }

    #[tool(
        description = "Resume a paused task. A repeating task whose time passed while paused runs at its \
        next scheduled time (missed runs are skipped); a one-time task that is overdue runs \
        now."
    )]
    async fn resume_task(&self, Parameters(p): Parameters<TaskIdParams>) -> Result<String, String> {
        finish("resume_task", tools::tasks::resume_task(&self.ctx, p).await)
    }

    #[tool(
        description = "Admin only: ask the host to register a new agent group serving a chat channel. \
        Refused unless the current message comes from the configured admin user. The host's \
        result arrives later as a system message."
    )]
    async fn register_agent_group(
        &self,
        Parameters(p): Parameters<RegisterAgentGroupParams>,
    ) -> Result<String, String> {
        finish(
            "register_agent_group",
            tools::messages::register_agent_group(&self.ctx, p).await,
        )
    }
}

#[tool_handler(router = self.router)]
impl ServerHandler for NanoclawServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(SERVER_NAME, env!("CARGO_PKG_VERSION")))
            .with_protocol_version(MAX_PROTOCOL_VERSION)
            .with_instructions(INSTRUCTIONS)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&MAX_PROTOCOL_VERSION))
    }
}
