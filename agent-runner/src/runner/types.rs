//! The types the runner's files share: the [`Runner`] itself, its options and clock, and the
//! stages a batch goes through (polled, claimed, gated, prepared, started, in flight, ended).
//! A leaf: the files of the folder import it, it imports none of them but `db.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use chrono_tz::Tz;
use provider::{AgentProvider, ErrorClass, InterruptReason, Prompt, PromptId};
use schema::{
    CurrentBatch, DbWatcher, Destination, FieldProblem, InboundContent, MessageIn, Routing,
    StartKeys,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::budget::{Budget, BudgetOptions};
use crate::last_event::LastEventCell;
use crate::ledger::TurnLedger;
use crate::media::MediaLimits;
use crate::script::ScriptLimits;
use crate::system_prompt::PromptSources;
use crate::turn_control::TurnControlOptions;
use crate::turn_log::TurnLog;

use super::db::RunnerDb;
use crate::progress_limits::ProgressLimits;

/// The runner's notion of "now", injectable so timer tests can run on paused tokio time.
pub type Clock = Arc<dyn Fn() -> chrono::DateTime<Utc> + Send + Sync>;

/// The wall clock.
pub fn system_clock() -> Clock {
    Arc::new(Utc::now)
}

/// A clock that starts at `start` and advances with tokio's clock (so `tokio::time::pause()`
/// and `advance()` move it).
pub fn tokio_clock(start: chrono::DateTime<Utc>) -> Clock {
    let origin = Instant::now();
    Arc::new(move || start + chrono::Duration::from_std(origin.elapsed()).unwrap_or_default())
}

/// The reply to `/clear`.
pub const CLEARED_REPLY: &str = "Session cleared.";

/// Everything the loop needs besides the DB and the provider.
#[derive(Clone)]
pub struct RunnerOptions {
    /// Time zone of prompts and schedules.
    pub timezone: Tz,
    /// Workspace root.
    pub workspace: PathBuf,
    /// Rows per prompt (the limit applied after the filters).
    pub max_messages: usize,
    /// Idle poll fallback (≤ 1 s).
    pub idle_poll: Duration,
    /// Poll during a query (≤ 500 ms).
    pub active_poll: Duration,
    /// runner_state heartbeat (≤ 10 s).
    pub heartbeat: Duration,
    /// Re-runs of a query after a retryable error.
    pub query_retries: u32,
    /// Where each query's system prompt comes from; it is rebuilt when a query starts (files
    /// re-read, destinations from the DB). `None`: queries get no system prompt.
    pub prompt_sources: Option<PromptSources>,
    /// The agent's working directory (pre-agent scripts run there).
    pub agent_dir: PathBuf,
    /// Environment of pre-agent scripts.
    pub script_env: BTreeMap<String, String>,
    /// Pre-agent script limits.
    pub script_limits: ScriptLimits,
    /// Attachment download limits.
    pub media_limits: MediaLimits,
    /// "Now" for due times and schedules.
    pub clock: Clock,
    /// The progress deadline of a turn (see [`ProgressLimits`]).
    pub progress: ProgressLimits,
    /// The model endpoint the CLI talks to (the configured base URL), named in `query_error`
    /// rows and in what a turn waits on.
    pub model_endpoint: String,
    /// Stopping turns and progress rows (`stopCommand`, `stoppedReply`, `progress`).
    pub turn_control: TurnControlOptions,
    /// Spending limits (`maxCostUsdPerSession`, `maxCostUsdPerDay`, `maxTokensPerDay`).
    pub budgets: BudgetOptions,
    /// How long an approval question waits for the user (`toolPolicy.askTimeoutSeconds`).
    pub ask_timeout: Duration,
}

/// When a turn that makes no progress is ended (zero turns a limit off). Model output is
/// streamed text or thinking, a tool call, a tool's end, a result, or a CLI progress notice;
impl std::fmt::Debug for RunnerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerOptions")
            .field("workspace", &self.workspace)
            .field("timezone", &self.timezone)
            .finish()
    }
}

impl RunnerOptions {
    /// Defaults for a workspace laid out like the container's.
    pub fn for_workspace(workspace: impl Into<PathBuf>) -> Self {
        let workspace = workspace.into();
        Self {
            timezone: chrono_tz::UTC,
            max_messages: 10,
            idle_poll: Duration::from_secs(1),
            active_poll: Duration::from_millis(500),
            heartbeat: Duration::from_secs(5),
            query_retries: 2,
            prompt_sources: Some(PromptSources::for_workspace(&workspace)),
            agent_dir: workspace.join("agent"),
            script_env: BTreeMap::new(),
            script_limits: ScriptLimits::default(),
            media_limits: MediaLimits::default(),
            clock: system_clock(),
            progress: ProgressLimits::default(),
            model_endpoint: "the model API".to_owned(),
            turn_control: TurnControlOptions::default(),
            budgets: BudgetOptions::default(),
            ask_timeout: provider::policy::DEFAULT_ASK_TIMEOUT,
            workspace,
        }
    }
}

/// Where replies of a prompt go.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Target {
    pub(super) routing: Routing,
    pub(super) in_reply_to: Option<String>,
    pub(super) sender_id: Option<String>,
}

impl Target {
    /// The `current_batch` record of a query on `ids` answered to this target.
    pub(super) fn batch(&self, ids: Vec<String>) -> CurrentBatch {
        CurrentBatch {
            routing: self.routing.clone(),
            in_reply_to: self.in_reply_to.clone(),
            ids,
            sender_id: self.sender_id.clone(),
        }
    }
}

/// What one poll found.
#[derive(Debug, Default)]
pub(super) struct Polled {
    /// The claimed rows, cut into work items.
    pub(super) work: Vec<Work>,
    /// When nothing was taken: the earliest `process_after` of a pending row later than the
    /// poll, so the idle wait ends when it falls due.
    pub(super) next_due: Option<chrono::DateTime<Utc>>,
}

/// A claimed row with its content, parsed once: the claim reads it to see whether the batch
/// starts there, the cut into work items for commands, the gate for scripts and the prompt
/// for its text. The parse's problems are logged by the gate.
#[derive(Debug)]
pub(super) struct Claimed {
    pub(super) row: MessageIn,
    pub(super) content: InboundContent,
    pub(super) problems: Vec<FieldProblem>,
}

/// A row's content parsed, with the fields that had an unexpected type.
pub(super) type Parsed = (InboundContent, Vec<FieldProblem>);

/// `row`'s content, parsed (a content that is no JSON parses as `Unparsable`, never fails).
pub(super) fn parse_content(row: &MessageIn) -> Parsed {
    InboundContent::parse_with_problems(&row.kind(), &row.content)
}

/// A unit of work cut from a claimed batch, processed in seq order.
#[derive(Debug)]
pub(super) enum Work {
    /// Rows that go to the agent as one prompt.
    Prompt(Vec<Claimed>),
    /// `/clear`.
    Clear(MessageIn),
    /// A command the CLI handles natively, sent raw as its own query.
    Native(MessageIn, String),
    /// The stop command or the host's interrupt row (`true`: answered, the chat command); it
    /// stops a running turn at once (see `turn.rs`, `serve_stops`), and is answered here when none
    /// runs.
    Stop(MessageIn, bool),
    /// `/model NAME` (`None`: `/model` alone).
    Model(MessageIn, Option<String>),
}

/// The rows of a batch that passed script gating, to be rendered into a prompt.
#[derive(Debug)]
pub(super) struct Gated {
    /// The rows, in seq order.
    pub(super) rows: Vec<MessageIn>,
    /// Per row: its parsed content and a task's pre-agent script `data`.
    pub(super) parsed: Vec<(InboundContent, Option<serde_json::Value>)>,
}

/// A prompt ready for the provider, with the rows it answers.
#[derive(Debug)]
pub(super) struct Prepared {
    pub(super) prompt: Prompt,
    pub(super) row_ids: Vec<String>,
    /// The rows' seqs, for the log (`turn_log`).
    pub(super) seqs: Vec<i64>,
    pub(super) target: Target,
    /// The task series the rows run for (the first one's), for the ledger.
    pub(super) series_id: Option<String>,
}

/// What a query starts from in the DB, read in one transaction: the claim's, or a read
/// transaction of its own (`read_start`); the system prompt is built from it later.
#[derive(Debug)]
pub(super) struct StartReads {
    /// For the prompt and the system prompt.
    pub(super) destinations: Vec<Destination>,
    /// Everything else; its `system_prompt` is still `None`.
    pub(super) query: QueryStart,
    /// The `session_state` keys `query` took its continuation and model from, for the next
    /// query's start.
    pub(super) keys: Arc<StartKeys>,
}

/// What a query starts from.
#[derive(Debug)]
pub(super) struct QueryStart {
    pub(super) continuation: Option<String>,
    /// The highest `messages_out` seq when the query starts: its replies are checked for
    /// repeats among the rows after it (what the turn sent).
    pub(super) start_seq: i64,
    pub(super) system_prompt: Option<String>,
    /// The session's model (`/model`), if set.
    pub(super) model: Option<String>,
    /// A `/model` switch whose first turn has not succeeded yet.
    pub(super) model_on_trial: bool,
}

/// A prompt sent in the active query and not yet covered by a result.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) id: PromptId,
    pub(super) prepared: Prepared,
}

/// How a query ended.
pub(super) enum QueryEnd {
    /// Every prompt answered.
    Done,
    /// Shutdown requested.
    Shutdown,
    /// The turn was stopped (the stop command, the host's interrupt row, the turn's step
    /// limit, or an approval-stop tool): the prompts the model saw are answered; the others
    /// (`uncovered`) run next.
    Stopped {
        uncovered: Vec<Prepared>,
        reason: InterruptReason,
    },
    /// Failed; the uncovered prompts are returned for a retry.
    Failed {
        message: String,
        retryable: bool,
        classification: ErrorClass,
        uncovered: Vec<Prepared>,
    },
}

/// A batch a poll's claim started in its own transaction (`poll::batch_at_claim`).
#[derive(Debug)]
pub(super) struct ClaimedStart {
    /// The batch; `run_query` does not start it again.
    pub(super) batch: CurrentBatch,
    /// What its query starts from, read in the same transaction; `render` takes it for the
    /// batch's rows.
    pub(super) reads: Option<StartReads>,
}

/// The agent-runner: one per session DB.
pub struct Runner {
    /// The DB calls' connections and their wait on a full disk.
    pub(super) db: RunnerDb,
    pub(super) provider: Arc<dyn AgentProvider>,
    pub(super) options: RunnerOptions,
    pub(super) watcher: DbWatcher,
    pub(super) first_poll: bool,
    /// Work cut from batches that must wait for the active query to end.
    pub(super) deferred: VecDeque<Work>,
    /// Cancelled when the runner stops; DB calls waiting for disk space watch it.
    pub(super) stop: CancellationToken,
    /// The batch the last poll's claim started in its transaction, with what its query starts
    /// from.
    pub(super) claimed_start: Option<ClaimedStart>,
    /// The `session_state` keys the last query started from, reused while their stamp holds
    /// ([`schema::StartKeys`]).
    pub(super) start_keys: Option<Arc<StartKeys>>,
    /// The turn's last provider event, written by the heartbeat.
    pub(super) last_event: Arc<LastEventCell>,
    /// The running turn's log span and `turn ended` line.
    pub(super) log: TurnLog,
    /// The running turn's ledger row in the making.
    pub(super) ledger: TurnLedger,
    /// Spending limits and what was spent (issue 14).
    pub(super) budget: Budget,
}
