//! The runner loop (docs/contract/db.md#status): poll (woken by DB changes, with the polls as
//! fallback), claim, prepare (commands, scripts, attachments, formatting), query the provider, push
//! follow-ups, and write replies together with the completion of the rows they answer.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use chrono::Utc;
use chrono_tz::Tz;
use provider::{
    AgentProvider, ErrorClass, InterruptReason, Prompt, PromptId, ProviderEvent, QueryInput, Usage,
};
use schema::content::out;
use schema::{
    Alarm, Completion, CurrentBatch, DbWatcher, Destination, DestinationRoute, FieldProblem,
    InKind, InboundContent, MessageIn, NewMessageOut, OutKind, Reads, Routing, RunnerStatus,
    SessionDb, StartKeys, UsageOutcome, WaitingOn,
};
use serde_json::json;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::budget::{Budget, BudgetOptions};
use crate::format::{self, FormatContext, PromptRow};
use crate::last_event::LastEventCell;
use crate::ledger::TurnLedger;
use crate::media::{resolve_attachments, MediaLimits};
use crate::progress::ProgressRows;
use crate::reply;
use crate::script::{run_script, ScriptLimits, ScriptOutcome};
use crate::system_prompt::{build_system_prompt, PromptSources};
use crate::turn_control::{self as control, TurnCommand, TurnControlOptions};
use crate::turn_log::{Outcome, TurnLog};

mod approval;

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

pub use crate::progress_limits::ProgressLimits;

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
struct Target {
    routing: Routing,
    in_reply_to: Option<String>,
    sender_id: Option<String>,
}

impl Target {
    /// The `current_batch` record of a query on `ids` answered to this target.
    fn batch(&self, ids: Vec<String>) -> CurrentBatch {
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
struct Polled {
    /// The claimed rows, cut into work items.
    work: Vec<Work>,
    /// When nothing was taken: the earliest `process_after` of a pending row later than the
    /// poll, so the idle wait ends when it falls due.
    next_due: Option<chrono::DateTime<Utc>>,
}

/// A claimed row with its content, parsed once: the claim reads it to see whether the batch
/// starts there, the cut into work items for commands, the gate for scripts and the prompt
/// for its text. The parse's problems are logged by the gate.
#[derive(Debug)]
struct Claimed {
    row: MessageIn,
    content: InboundContent,
    problems: Vec<FieldProblem>,
}

/// A row's content parsed, with the fields that had an unexpected type.
type Parsed = (InboundContent, Vec<FieldProblem>);

/// `row`'s content, parsed (a content that is no JSON parses as `Unparsable`, never fails).
fn parse_content(row: &MessageIn) -> Parsed {
    InboundContent::parse_with_problems(&row.kind(), &row.content)
}

/// A unit of work cut from a claimed batch, processed in seq order.
#[derive(Debug)]
enum Work {
    /// Rows that go to the agent as one prompt.
    Prompt(Vec<Claimed>),
    /// `/clear`.
    Clear(MessageIn),
    /// A command the CLI handles natively, sent raw as its own query.
    Native(MessageIn, String),
    /// The stop command or the host's interrupt row (`true`: answered, the chat command); it
    /// stops a running turn at once (see `drive_query`), and is answered here when none runs.
    Stop(MessageIn, bool),
    /// `/model NAME` (`None`: `/model` alone).
    Model(MessageIn, Option<String>),
}

/// The rows of a batch that passed script gating, to be rendered into a prompt.
#[derive(Debug)]
struct Gated {
    /// The rows, in seq order.
    rows: Vec<MessageIn>,
    /// Per row: its parsed content and a task's pre-agent script `data`.
    parsed: Vec<(InboundContent, Option<serde_json::Value>)>,
}

/// A prompt ready for the provider, with the rows it answers.
#[derive(Debug)]
struct Prepared {
    prompt: Prompt,
    row_ids: Vec<String>,
    /// The rows' seqs, for the log (`turn_log`).
    seqs: Vec<i64>,
    target: Target,
    /// The task series the rows run for (the first one's), for the ledger.
    series_id: Option<String>,
}

/// What a query starts from in the DB, read in one transaction: the claim's, or a read
/// transaction of its own (`read_start`); the system prompt is built from it later.
#[derive(Debug)]
struct StartReads {
    /// For the prompt and the system prompt.
    destinations: Vec<Destination>,
    /// Everything else; its `system_prompt` is still `None`.
    query: QueryStart,
    /// The `session_state` keys `query` took its continuation and model from, for the next
    /// query's start.
    keys: Arc<StartKeys>,
}

/// What a query starts from.
#[derive(Debug)]
struct QueryStart {
    continuation: Option<String>,
    /// The highest `messages_out` seq when the query starts: its replies are checked for
    /// repeats among the rows after it (what the turn sent).
    start_seq: i64,
    system_prompt: Option<String>,
    /// The session's model (`/model`), if set.
    model: Option<String>,
    /// A `/model` switch whose first turn has not succeeded yet.
    model_on_trial: bool,
}

/// A prompt sent in the active query and not yet covered by a result.
#[derive(Debug)]
struct InFlight {
    id: PromptId,
    prepared: Prepared,
}

/// How a query ended.
enum QueryEnd {
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

/// The agent-runner: one per session DB.
pub struct Runner {
    db: SessionDb,
    /// The same DB with a connection of its own for the calls made on the runtime's thread
    /// ([`Runner::call_inline`]), which the watcher also checks: the runner's claims and
    /// replies do not wake its own loop (SessionDb::pinned).
    inline_db: SessionDb,
    provider: Arc<dyn AgentProvider>,
    options: RunnerOptions,
    watcher: DbWatcher,
    first_poll: bool,
    /// Work cut from batches that must wait for the active query to end.
    deferred: VecDeque<Work>,
    /// Cancelled when the runner stops; DB calls waiting for disk space watch it.
    stop: CancellationToken,
    /// Whether the DB's disk is full, shared with the heartbeat (logged once per episode).
    disk_full: Arc<DiskFull>,
    /// The batch the last poll's claim started in its transaction ([`batch_at_claim`]);
    /// `run_query` does not start it again.
    started: Option<CurrentBatch>,
    /// What the query of that batch starts from, read in the same transaction; `render`
    /// takes it for the batch's rows.
    start_reads: Option<StartReads>,
    /// The `session_state` keys the last query started from, reused while their stamp holds
    /// ([`schema::StartKeys`]).
    start_keys: Option<Arc<StartKeys>>,
    /// Whether the running query's batch was finished with its last result
    /// ([`SessionDb::complete_batch_at`]): `run_query` then does not finish it again, and
    /// events of the CLI winding down write no runner state.
    batch_finished: bool,
    /// The turn's last provider event, written by the heartbeat.
    last_event: Arc<LastEventCell>,
    /// The running turn's log span and `turn ended` line.
    turn: TurnLog,
    /// The running turn's ledger row in the making.
    ledger: TurnLedger,
    /// Spending limits and what was spent (issue 14).
    budget: Budget,
    /// Whether the running query is the first with a model chosen by `/model` (confirmed by
    /// its success, reverted by its failure).
    model_on_trial: bool,
    /// The running query's approval questions (issue 16).
    approvals: approval::Approvals,
}

impl Runner {
    /// Creates the loop. The caller has taken the lock and opened the DB.
    pub fn new(
        db: SessionDb,
        provider: Arc<dyn AgentProvider>,
        options: RunnerOptions,
    ) -> Result<Self> {
        let inline_db = db
            .pinned()
            .context("opening the runner's inline connection")?;
        let watcher = DbWatcher::new(&inline_db).context("watching the session DB")?;
        let budget = Budget::new(options.budgets.clone(), options.timezone);
        let approvals = approval::Approvals::new(options.ask_timeout);
        Ok(Self {
            db,
            inline_db,
            provider,
            options,
            watcher,
            first_poll: true,
            deferred: VecDeque::new(),
            stop: CancellationToken::new(),
            disk_full: Arc::default(),
            started: None,
            start_reads: None,
            start_keys: None,
            batch_finished: false,
            last_event: Arc::default(),
            turn: TurnLog::default(),
            ledger: TurnLedger::default(),
            budget,
            model_on_trial: false,
            approvals,
        })
    }

    /// Runs until `shutdown` resolves: startup recovery, heartbeat, then the poll loop. On the
    /// way out the query is aborted, the CLI's process group killed and the status `stopped`.
    pub async fn run(mut self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        let stop = self.stop.clone();
        let stop_on_signal = stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            stop_on_signal.cancel();
        });

        let reset = self
            .call(|db| db.reset_processing())
            .await
            .context("startup recovery")?;
        if !reset.is_empty() {
            tracing::info!(
                count = reset.len(),
                "reset rows left processing by a previous run"
            );
        }
        self.call(|db| db.set_current_batch(None)).await?;
        self.call(|db| db.set_waiting_on(None)).await?;
        let provider_name = self.provider.name();
        self.call(move |db| {
            db.set_runner_state(
                RunnerStatus::Idle,
                Some(std::process::id()),
                Some(provider_name),
            )
        })
        .await?;
        let heartbeat = spawn_heartbeat(
            self.db.clone(),
            self.options.heartbeat,
            stop.clone(),
            self.disk_full.clone(),
            self.last_event.clone(),
        );

        let result = self.poll_loop(&stop).await;

        self.provider.shutdown().await;
        stop.cancel();
        let _ = heartbeat.await;
        // On a full disk `stopped` cannot be written: the host then sees the last status with a
        // stale heartbeat, as after a crash, and that is no reason to exit non-zero.
        let final_state = self
            .call(|db| db.set_runner_status(RunnerStatus::Stopped))
            .await
            .or_else(|err| match err.is::<StoppedWhileDiskFull>() {
                true => Ok(()),
                false => Err(err),
            });
        tracing::info!("runner stopped");
        result.and(final_state)
    }

    async fn poll_loop(&mut self, stop: &CancellationToken) -> Result<()> {
        loop {
            if stop.is_cancelled() {
                return Ok(());
            }
            // No query starts while a spending limit is reached (crate::budget).
            if let Some(wait) = self.budget_hold().await? {
                tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    _ = self.watcher.wait(wait) => {}
                }
                continue;
            }
            if let Some(work) = self.deferred.pop_front() {
                let stopped = self.process(work, stop).await.or_else(stopped_while_full)?;
                if stopped {
                    return Ok(());
                }
                continue;
            }
            let now = (self.options.clock)();
            let claimed = self.claim_work(now, self.first_poll, true).await;
            self.first_poll = false;
            let next_due = match claimed {
                Ok(polled) if !polled.work.is_empty() => {
                    self.deferred.extend(polled.work);
                    continue;
                }
                Ok(polled) => polled.next_due,
                Err(err) if err.is::<StoppedWhileDiskFull>() => return Ok(()),
                Err(err) => {
                    tracing::error!(error = %format!("{err:#}"), "poll failed; retrying");
                    None
                }
            };
            let wait = self.idle_wait(next_due);
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = self.watcher.wait(wait) => {}
            }
        }
    }

    /// How long to sleep when idle: the idle poll, or less when a row falls due sooner
    /// (`next_due`, read by the poll: see [`Polled::next_due`]).
    fn idle_wait(&self, next_due: Option<chrono::DateTime<Utc>>) -> Duration {
        let idle = self.options.idle_poll;
        match next_due {
            Some(due) => {
                let until = (due - (self.options.clock)())
                    .to_std()
                    .unwrap_or(Duration::ZERO);
                idle.min(until.max(Duration::from_millis(5)))
            }
            _ => idle,
        }
    }

    /// Cuts claimed rows into work items in seq order: commands split the rows around them.
    fn split_work(&self, rows: Vec<Claimed>) -> Vec<Work> {
        let native = self.provider.native_commands();
        let mut work = Vec::new();
        let mut current = Vec::new();
        let stop_word = &self.options.turn_control.stop_word;
        for Claimed {
            row,
            content,
            problems,
        } in rows
        {
            if let Some(command) = control::command_of(&content, stop_word) {
                if !current.is_empty() {
                    work.push(Work::Prompt(std::mem::take(&mut current)));
                }
                work.push(match command {
                    TurnCommand::Stop { reply } => Work::Stop(row, reply),
                    TurnCommand::Model(name) => Work::Model(row, name),
                });
                continue;
            }
            match command_of(&content, native) {
                None => current.push(Claimed {
                    row,
                    content,
                    problems,
                }),
                Some(native_text) => {
                    if !current.is_empty() {
                        work.push(Work::Prompt(std::mem::take(&mut current)));
                    }
                    work.push(match native_text {
                        None => Work::Clear(row),
                        Some(text) => Work::Native(row, text),
                    });
                }
            }
        }
        if !current.is_empty() {
            work.push(Work::Prompt(current));
        }
        work
    }

    /// Processes one work item; true when shutdown was requested.
    async fn process(&mut self, work: Work, stop: &CancellationToken) -> Result<bool> {
        match work {
            Work::Clear(row) => {
                self.clear_session(row).await?;
                Ok(false)
            }
            Work::Native(row, text) => {
                let prepared = Prepared {
                    prompt: Prompt::text(text),
                    row_ids: vec![row.id.clone()],
                    seqs: row.seq.into_iter().collect(),
                    target: target_of(std::slice::from_ref(&row)),
                    series_id: row.series_id.clone(),
                };
                self.run_query(prepared, None, stop).await
            }
            Work::Prompt(rows) => match self.prepare(rows, true).await? {
                Some((prepared, start)) => self.run_query(prepared, start, stop).await,
                None => Ok(false),
            },
            Work::Stop(row, reply) => {
                let text = reply.then_some(control::NOTHING_RUNNING_REPLY);
                self.answer_command(row, text.map(str::to_owned)).await?;
                Ok(false)
            }
            Work::Model(row, name) => {
                let reply = self
                    .call(move |db| match &name {
                        Some(name) => control::switch_model(db, name),
                        None => control::current_model(db),
                    })
                    .await?;
                self.answer_command(row, Some(reply)).await?;
                Ok(false)
            }
        }
    }

    /// Completes a runner command's row with its reply (none: completed silently), in one
    /// transaction.
    async fn answer_command(&self, row: MessageIn, reply: Option<String>) -> Result<()> {
        let replies: Vec<NewMessageOut> = reply
            .into_iter()
            .map(|text| {
                NewMessageOut::new(OutKind::Chat, row.routing.clone(), &out::chat_text(&text))
                    .replying_to(Some(row.id.clone()))
            })
            .collect();
        let ids = vec![row.id.clone()];
        let now = (self.options.clock)();
        self.call(move |db| db.complete_at(&ids, &replies, now))
            .await?;
        tracing::info!(row = %row.id, seq = ?row.seq, "runner command answered");
        Ok(())
    }

    async fn clear_session(&mut self, row: MessageIn) -> Result<()> {
        let provider = self.provider.name();
        // The live CLI holds the old session; stopping it makes the next query start fresh.
        self.provider.shutdown().await;
        self.call(move |db| db.clear_continuation(provider)).await?;
        let reply = NewMessageOut::new(
            OutKind::Chat,
            row.routing.clone(),
            &out::chat_text(CLEARED_REPLY),
        )
        .replying_to(Some(row.id.clone()));
        let ids = vec![row.id.clone()];
        let replies = [reply];
        self.call(move |db| db.complete(&ids, &replies)).await?;
        tracing::info!(row = %row.id, seq = ?row.seq, "session cleared");
        Ok(())
    }

    /// Turns claimed rows into a prompt: script gating, then rendering. `None` when nothing is
    /// left for the agent. With `start` (a new query, not a follow-up), also what the query
    /// starts from, read with the prompt's destinations.
    async fn prepare(
        &mut self,
        rows: Vec<Claimed>,
        start: bool,
    ) -> Result<Option<(Prepared, Option<QueryStart>)>> {
        match self.gate(rows).await? {
            Some(gated) => Ok(Some(self.render(gated, start).await?)),
            None => Ok(None),
        }
    }

    /// Script gating: which claimed rows go to the agent. A task's pre-agent script may skip
    /// its row or fail; that row is completed here without the agent. Context-only rows (no
    /// triggering row, or none left after the scripts) go back to `pending` to wait for a
    /// triggering row. `None` when nothing is left for the agent.
    async fn gate(&mut self, rows: Vec<Claimed>) -> Result<Option<Gated>> {
        if rows.is_empty() {
            return Ok(None);
        }
        if !rows.iter().any(|claimed| claimed.row.trigger) {
            // Context-only rows wait for a triggering row; they were claimed with others.
            self.release_rows(rows.iter().map(|claimed| &claimed.row))
                .await?;
            return Ok(None);
        }
        let mut kept = Vec::with_capacity(rows.len());
        let mut parsed = Vec::with_capacity(rows.len());
        let mut finished_early = Vec::new();
        for Claimed {
            row,
            content,
            problems,
        } in rows
        {
            let kind = row.kind();
            for problem in &problems {
                tracing::warn!(
                    row = %row.id,
                    field = %problem.field,
                    issue = %problem.issue,
                    "content field of an unexpected type; the rest of the message stands"
                );
            }
            if let InboundContent::Unparsable { reason, .. } = &content {
                tracing::warn!(row = %row.id, %reason, "unparsable content; passing it on as text");
            }
            if let InKind::Other(kind) = &kind {
                tracing::warn!(row = %row.id, %kind, "unknown message kind; passing it on labelled");
            }
            // (A row whose process_after cannot be read never gets here: the poll takes it out of
            // the queue, see `SessionDb::eligible`.)
            let mut script_output = None;
            if let Some(script) = pre_agent_script(&content) {
                let Some(outcome) = self.run_pre_agent_script(&row.id, script).await else {
                    // The claimed rows stay `processing` for the next start's recovery, as
                    // after a query.
                    return Ok(None);
                };
                match outcome {
                    ScriptOutcome::Wake { data } => {
                        script_output = Some(data.unwrap_or(serde_json::Value::Null))
                    }
                    ScriptOutcome::Skip => {
                        tracing::info!(
                            task = %row.id,
                            "pre-agent script: wakeAgent=false; task completed without the agent"
                        );
                        finished_early.push((row, None));
                        continue;
                    }
                    ScriptOutcome::Failed { reason } => {
                        tracing::warn!(
                            task = %row.id,
                            %reason,
                            "pre-agent script failed; task skipped"
                        );
                        finished_early.push((row, Some(reason)));
                        continue;
                    }
                }
            }
            parsed.push((content, script_output));
            kept.push(row);
        }
        for (row, failure) in finished_early {
            self.finish_without_agent(row, failure).await?;
        }
        if !kept.iter().any(|row| row.trigger) {
            // Scripts removed every triggering row; context rows wait for the next one.
            self.release_rows(&kept).await?;
            return Ok(None);
        }
        Ok(Some(Gated { rows: kept, parsed }))
    }

    /// Runs a task's pre-agent script; `None` when the runner stops meanwhile. Shutdown must
    /// not wait out the script's timeout (Docker allows 10 s): dropping the run SIGKILLs its
    /// process group at once.
    async fn run_pre_agent_script(&self, task_id: &str, script: &str) -> Option<ScriptOutcome> {
        let run = run_script(
            script,
            &self.options.agent_dir,
            &self.options.script_env,
            &self.options.script_limits,
        );
        tokio::select! {
            outcome = run => Some(outcome),
            () = self.stop.cancelled() => {
                tracing::info!(task = %task_id, "stopping: pre-agent script killed");
                None
            }
        }
    }

    /// What a query starts from, read now in one read transaction (when the claim did not).
    async fn read_start(&mut self) -> Result<StartReads> {
        let provider = self.provider.name();
        let known = self.start_keys.clone();
        let reads = self
            .call_inline(move |db| db.read_in(|reads| read_start(reads, provider, known.as_ref())))
            .await?;
        self.start_keys = Some(Arc::clone(&reads.keys));
        Ok(reads)
    }

    /// Puts claimed rows back to `pending` (without counting a try).
    async fn release_rows<'a>(&self, rows: impl IntoIterator<Item = &'a MessageIn>) -> Result<()> {
        let ids: Vec<String> = rows.into_iter().map(|r| r.id.clone()).collect();
        if !ids.is_empty() {
            self.call(move |db| db.release(&ids)).await?;
        }
        Ok(())
    }

    /// Rendering: the gated rows with their attachments, formatted as one prompt. With
    /// `start` (a new query), what the query starts from comes with it: read by the claim when
    /// it started these very rows' batch, else now, in one read transaction with the
    /// destinations. The system prompt lists the same destinations as the prompt.
    async fn render(
        &mut self,
        gated: Gated,
        start: bool,
    ) -> Result<(Prepared, Option<QueryStart>)> {
        let Gated { rows: kept, parsed } = gated;
        let (destinations, query_start) = if start {
            let claimed = self.start_reads.take().filter(|_| {
                self.started.as_ref().is_some_and(|batch| {
                    batch.ids.len() == kept.len()
                        && batch.ids.iter().zip(&kept).all(|(id, row)| *id == row.id)
                })
            });
            let reads = match claimed {
                Some(reads) => reads,
                None => self.read_start().await?,
            };
            let (destinations, start) = query_start(reads, self.options.prompt_sources.as_ref());
            (destinations, Some(start))
        } else {
            (
                self.call_inline(|db| Ok(destinations_or_none(db.destinations())))
                    .await?,
                None,
            )
        };
        let mut media = Vec::new();
        let mut prompt_rows = Vec::with_capacity(kept.len());
        for (row, (content, script_output)) in kept.iter().zip(parsed) {
            let attachments = match &content {
                InboundContent::Chat(chat) => chat.attachments.clone(),
                InboundContent::ChatSdk(sdk) => sdk.attachments.clone(),
                _ => Vec::new(),
            };
            let notes = if attachments.is_empty() {
                Vec::new()
            } else {
                let resolved = resolve_attachments(
                    &row.id,
                    &attachments,
                    &self.options.workspace,
                    &self.options.media_limits,
                )
                .await;
                media.extend(resolved.media);
                resolved.notes
            };
            prompt_rows.push(PromptRow {
                row,
                content,
                attachments: notes,
                script_output,
            });
        }
        let context = FormatContext {
            timezone: self.options.timezone,
            destinations: &destinations,
        };
        let text = format::format_prompt(&prompt_rows, &context);
        let target = target_parsed(&kept, prompt_rows.iter().map(|row| &row.content));
        let prepared = Prepared {
            prompt: Prompt { text, media },
            row_ids: kept.iter().map(|r| r.id.clone()).collect(),
            seqs: kept.iter().filter_map(|r| r.seq).collect(),
            target,
            series_id: kept.iter().find_map(|r| r.series_id.clone()),
        };
        Ok((prepared, query_start))
    }

    /// Completes a task row whose pre-agent script said not to wake the agent, or failed; a
    /// failure is also written as a `task_skipped` system row so the host can show it. The next
    /// occurrence of a recurring task is inserted in the same transaction.
    async fn finish_without_agent(&self, row: MessageIn, failure: Option<String>) -> Result<()> {
        let mut rows = Vec::new();
        if let Some(reason) = failure {
            let task_id = row.series_id.clone().unwrap_or_else(|| row.id.clone());
            let content = out::system_action(
                "task_skipped",
                json!({ "taskId": task_id, "reason": reason }),
            );
            rows.push(
                NewMessageOut::new(OutKind::System, row.routing.clone(), &content)
                    .replying_to(Some(row.id.clone())),
            );
        }
        let ids = vec![row.id];
        let now = (self.options.clock)();
        self.call(move |db| db.complete_at(&ids, &rows, now))
            .await?;
        Ok(())
    }

    /// Runs one query to its end, with retries; true when shutdown was requested. `start`:
    /// what the first attempt starts from, when it was read with the prompt (a retry reads it
    /// again).
    async fn run_query(
        &mut self,
        first: Prepared,
        mut start: Option<QueryStart>,
        stop: &CancellationToken,
    ) -> Result<bool> {
        /// What comes after a query's batch is finished.
        enum Next {
            /// Return from `run_query` (true: shutdown requested).
            Return(bool),
            /// Run the uncovered prompts (merged) again after the backoff.
            Retry(Box<Prepared>, Duration),
        }
        let mut attempt = 0u32;
        let mut prepared = first;
        loop {
            let batch = prepared.target.batch(prepared.row_ids.clone());
            // The poll's claim may have started this very batch in its transaction.
            if self.started.take().as_ref() != Some(&batch) {
                self.call(move |db| db.start_batch(&batch)).await?;
            }
            self.batch_finished = false;
            self.ledger.start();
            let span = self.turn.start(&prepared.seqs);
            let provider = self.provider.name();
            let end = self
                .drive_query(prepared, start.take(), stop)
                .instrument(span)
                .await?;
            // Questions still open when the query ended (it failed, or the runner stops): the
            // driver denied their calls; the chat learns it and the questions are withdrawn.
            self.withdraw_approvals(None, None).await?;
            let (report, next) = match end {
                QueryEnd::Done => {
                    if std::mem::take(&mut self.model_on_trial) {
                        self.call(control::confirm_model).await?;
                    }
                    self.turn.end(provider, Outcome::Answered);
                    (None, Next::Return(false))
                }
                QueryEnd::Shutdown => {
                    self.turn.end(provider, Outcome::Stopped);
                    (None, Next::Return(true))
                }
                QueryEnd::Stopped { uncovered, reason } => {
                    let outcome = match reason {
                        InterruptReason::ApprovalStop => Outcome::ApprovalStop,
                        InterruptReason::Stopped | InterruptReason::MaxTurns => {
                            Outcome::Interrupted
                        }
                    };
                    self.turn.end(provider, outcome);
                    // Prompts pushed and never seen by the model start the next turn.
                    match merge(uncovered) {
                        Some(merged) => (None, Next::Retry(Box::new(merged), Duration::ZERO)),
                        None => (None, Next::Return(false)),
                    }
                }
                QueryEnd::Failed {
                    message,
                    retryable,
                    classification,
                    uncovered,
                } => {
                    if classification == ErrorClass::InvalidSession {
                        let provider = self.provider.name();
                        self.call(move |db| db.clear_continuation(provider)).await?;
                    }
                    // A `/model` switch whose first turn failed: back to the previous model,
                    // the error as the reply, and the turn again at once.
                    let refused = self.model_on_trial
                        && self.revert_model(&message, uncovered.last()).await?;
                    // A turn that made no progress already waited its deadline out (the CLI's
                    // own retries included): running it again would multiply that bound, so it
                    // goes to the host at once. A rate limit is waited out here only when its
                    // reset is near.
                    let retry_after = classification.retry_after();
                    let runner_retries = retryable
                        && classification != ErrorClass::NoProgress
                        && retry_after.is_none_or(|after| after <= MAX_RATE_LIMIT_WAIT);
                    let merged = merge(uncovered);
                    if let Some(failed) = &merged {
                        let row = self.ledger_row(
                            None,
                            UsageOutcome::Error,
                            failed.row_ids.clone(),
                            failed.series_id.clone(),
                        );
                        self.ledger.failed(row);
                    }
                    match merged {
                        None => {
                            self.turn.end(provider, Outcome::Answered);
                            (None, Next::Return(false))
                        }
                        Some(merged) if refused => {
                            let backoff = Duration::ZERO;
                            let class = classification;
                            self.turn.end(
                                provider,
                                Outcome::Retrying {
                                    attempt,
                                    backoff,
                                    class,
                                    error: &message,
                                },
                            );
                            (None, Next::Retry(Box::new(merged), backoff))
                        }
                        Some(merged) if runner_retries && attempt < self.options.query_retries => {
                            attempt += 1;
                            let backoff = Duration::from_secs(1 << (attempt - 1).min(5))
                                .max(retry_after.unwrap_or_default());
                            self.turn.end(
                                provider,
                                Outcome::Retrying {
                                    attempt,
                                    backoff,
                                    class: classification,
                                    error: &message,
                                },
                            );
                            (None, Next::Retry(Box::new(merged), backoff))
                        }
                        Some(merged) => {
                            self.turn.end(
                                provider,
                                Outcome::Failed {
                                    class: classification,
                                    error: &message,
                                },
                            );
                            let report =
                                self.query_error_row(&merged, &message, retryable, classification);
                            (Some(report), Next::Return(false))
                        }
                    }
                }
            };
            // Runner state back to idle, with a failed query's report, in one transaction;
            // unless the last result already did (a query that answered everything).
            let failed = self.ledger.take_failed();
            if report.is_some() || failed.is_some() || !std::mem::take(&mut self.batch_finished) {
                let now = (self.options.clock)();
                let budget = self.budget.clone();
                self.call(move |db| {
                    let written =
                        db.finish_batch_with_usage(report.as_ref(), failed.as_ref(), now)?;
                    if let Some(failed) = &failed {
                        budget.recorded(failed, now);
                    }
                    Ok(written)
                })
                .await?;
            }
            match next {
                Next::Return(shutdown) => return Ok(shutdown),
                Next::Retry(merged, backoff) => {
                    tokio::select! {
                        _ = stop.cancelled() => return Ok(true),
                        _ = sleep(backoff) => {}
                    }
                    // Running it again is a new query: not while a limit is reached; its rows
                    // wait in the queue for the hold (crate::budget).
                    if self.budget.reached((self.options.clock)()) {
                        let ids = merged.row_ids.clone();
                        self.call(move |db| db.release(&ids)).await?;
                        return Ok(false);
                    }
                    prepared = *merged;
                }
            }
        }
    }

    /// The `query_error` system row of a failed query; its rows stay `processing` for the
    /// host's sweep.
    fn query_error_row(
        &self,
        prepared: &Prepared,
        message: &str,
        retryable: bool,
        classification: ErrorClass,
    ) -> NewMessageOut {
        let mut payload = json!({
            "message": message,
            "classification": classification.name(),
            "retryable": retryable,
            "messageIds": prepared.row_ids,
            "provider": self.provider.name(),
            "endpoint": self.options.model_endpoint,
        });
        if let Some(after) = classification.retry_after() {
            // When the rate limit resets: the host's sweep should not retry before.
            let at = (self.options.clock)() + chrono::Duration::from_std(after).unwrap_or_default();
            payload["retryAfterSecs"] = json!(after.as_secs());
            payload["retryAt"] = json!(schema::time::format_ts(at));
        }
        let content = out::system_action("query_error", payload);
        NewMessageOut::new(OutKind::System, prepared.target.routing.clone(), &content)
            .replying_to(prepared.target.in_reply_to.clone())
    }

    /// Sends the first prompt, pushes follow-ups, handles events until every prompt is covered.
    async fn drive_query(
        &mut self,
        first: Prepared,
        start: Option<QueryStart>,
        stop: &CancellationToken,
    ) -> Result<QueryEnd> {
        let start = match start {
            Some(start) => start,
            None => {
                let reads = self.read_start().await?;
                query_start(reads, self.options.prompt_sources.as_ref()).1
            }
        };
        let QueryStart {
            continuation,
            start_seq,
            system_prompt,
            model,
            model_on_trial,
        } = start;
        self.model_on_trial = model_on_trial;
        // The stored continuation: an `Init` naming the same session writes nothing.
        let mut stored = continuation.clone();
        let input = QueryInput {
            prompt: first.prompt.clone(),
            continuation,
            system_prompt,
            model,
        };
        let mut query = match self.provider.query(input) {
            Ok(query) => query,
            Err(err) => {
                return Ok(QueryEnd::Failed {
                    message: err.to_string(),
                    retryable: false,
                    classification: ErrorClass::Process,
                    uncovered: vec![first],
                })
            }
        };
        let approver = query.approver();
        let mut in_flight = VecDeque::from([InFlight {
            id: 0,
            prepared: first,
        }]);
        let mut ended = false;
        let mut current_tool: Option<String> = None;
        let mut next_poll = Instant::now() + self.options.active_poll;
        let limits = self.options.progress;
        let mut progress = TurnProgress::new(Instant::now(), (self.options.clock)());
        let mut progress_rows =
            ProgressRows::new(self.options.turn_control.progress, Instant::now());
        // The stop rows being served and when the CLI's interrupt is given up on.
        let mut stopping: Option<(Vec<MessageIn>, Instant)> = None;
        let mut deadline_alarm = Alarm::new();
        let mut stop_alarm = Alarm::new();
        let mut approval_alarm = Alarm::new();
        let mut flush_alarm = Alarm::new();
        let mut show_alarm = Alarm::new();
        loop {
            if !ended && !in_flight.is_empty() {
                let stops = self.take_stops();
                if !stops.is_empty() {
                    match &mut stopping {
                        Some((rows, _)) => rows.extend(stops),
                        None => {
                            tracing::info!(
                                rows = stops.len(),
                                "stop requested: interrupting the turn"
                            );
                            query.interrupt();
                            // Approvals still asked are denied (`by: "stop"`) after the
                            // interrupt: the CLI must not go on with a refusal first.
                            self.withdraw_approvals(Some(&approver), Some(&mut progress))
                                .await?;
                            stopping = Some((stops, Instant::now() + STOP_GRACE));
                            // An `ask_user_question` of the turn is withdrawn with it.
                            let withdrawn = self.call(|db| db.close_open_questions()).await?;
                            if withdrawn > 0 {
                                tracing::info!(
                                    withdrawn,
                                    "open questions withdrawn with the stopped turn"
                                );
                            }
                        }
                    }
                }
            }
            let deadline = progress.deadline(&limits);
            deadline_alarm.set(deadline.map(|(at, _)| at));
            stop_alarm.set(stopping.as_ref().map(|(_, at)| *at));
            approval_alarm.set(self.approvals.next_deadline());
            flush_alarm.set(progress_rows.flush_at().filter(|_| !self.batch_finished));
            // Once the batch is finished (idle), the CLI winding down shows nothing.
            show_alarm.set(progress.show_at().filter(|_| !self.batch_finished));
            tokio::select! {
                _ = stop.cancelled() => {
                    query.abort();
                    return Ok(QueryEnd::Shutdown);
                }
                () = deadline_alarm.ring() => {
                    let Some((_, stall)) = deadline else { continue };
                    let message = progress.message(stall, Instant::now(), &limits, &self.options.model_endpoint);
                    // Logged once, as the turn's end (class `NoProgress`).
                    tracing::debug!(?stall, "progress deadline: ending the turn");
                    query.abort();
                    // Let the provider wind the CLI down (interrupt, or restart it) before the
                    // next query; bounded, the CLI may not answer.
                    let _ = tokio::time::timeout(ABORT_WIND_DOWN, async {
                        while query.next_event().await.is_some() {}
                    })
                    .await;
                    if in_flight.is_empty() {
                        return Ok(QueryEnd::Done);
                    }
                    return Ok(QueryEnd::Failed {
                        message,
                        retryable: true,
                        classification: ErrorClass::NoProgress,
                        uncovered: in_flight.into_iter().map(|f| f.prepared).collect(),
                    });
                }
                () = stop_alarm.ring() => {
                    tracing::warn!(grace = ?STOP_GRACE, "the CLI did not end the turn on its interrupt; aborting the turn");
                    query.abort();
                    let _ = tokio::time::timeout(ABORT_WIND_DOWN, async {
                        while query.next_event().await.is_some() {}
                    })
                    .await;
                    let stops = stopping.take().map(|(rows, _)| rows).unwrap_or_default();
                    let covers = in_flight.front().map(|f| f.id);
                    return self.finish_stopped(in_flight, covers, stops, None, InterruptReason::Stopped).await;
                }
                () = approval_alarm.ring() => {
                    self.expire_approvals(&approver, &mut progress).await?;
                }
                () = flush_alarm.ring() => {
                    if let Some(payload) = progress_rows.flush(Instant::now()) {
                        self.write_progress(payload, &in_flight).await?;
                    }
                }
                () = show_alarm.ring() => {
                    progress.shown = true;
                    let waiting = progress.waiting_on(&self.options.model_endpoint);
                    tracing::info!(
                        endpoint = %waiting.endpoint,
                        notices = waiting.notices,
                        "waiting on the model: no output for {} s",
                        WAITING_SHOWN_AFTER.as_secs()
                    );
                    self.call(move |db| db.set_waiting_on(Some(&waiting))).await?;
                }
                event = query.next_event() => {
                    let Some(event) = event else {
                        if let Some((stops, _)) = stopping.take() {
                            // The stream closed without `Interrupted` (a driver that aborts):
                            // the model saw the first prompt at least.
                            let covers = in_flight.front().map(|f| f.id);
                            return self.finish_stopped(in_flight, covers, stops, None, InterruptReason::Stopped).await;
                        }
                        if in_flight.is_empty() {
                            return Ok(QueryEnd::Done);
                        }
                        return Ok(QueryEnd::Failed {
                            message: format!("{} ended the query without answering", self.provider.name()),
                            retryable: true,
                            classification: ErrorClass::Process,
                            uncovered: in_flight.into_iter().map(|f| f.prepared).collect(),
                        });
                    };
                    let now = Instant::now();
                    self.last_event.note(&event, (self.options.clock)());
                    let moved = progress.note(&event);
                    let finished = self.batch_finished;
                    if let Some(payload) = progress_rows.note(&event, now).filter(|_| !finished) {
                        self.write_progress(payload, &in_flight).await?;
                    }
                    // While an approval waits, `waiting_on` names it: the user holds the turn,
                    // whatever the CLI reports meanwhile.
                    if let (ProviderEvent::Error { ends_turn: false, .. }, false, false) = (&event, finished, progress.asking) {
                        let waiting = progress.waiting_on(&self.options.model_endpoint);
                        self.call(move |db| db.set_waiting_on(Some(&waiting))).await?;
                    }
                    if moved && progress.output(now, (self.options.clock)()) && !finished {
                        self.call(|db| db.set_waiting_on(None)).await?;
                    }
                    match event {
                        ProviderEvent::Output | ProviderEvent::ToolEnded { .. } => {}
                        ProviderEvent::ApprovalRequest(request) => {
                            self.ask_approval(request, &in_flight, &mut progress).await?;
                        }
                        ProviderEvent::ToolDenied { tool, summary } => {
                            self.record_denied(&tool, summary.as_deref(), None, &in_flight).await?;
                        }
                        ProviderEvent::ToolUndecidable { tool, summary, reason } => {
                            self.record_denied(&tool, summary.as_deref(), Some(&reason), &in_flight)
                                .await?;
                        }
                        ProviderEvent::Text { text } => {
                            if !finished {
                                self.deliver_blocks(&text, &in_flight, start_seq).await?;
                            }
                        }
                        ProviderEvent::Interrupted { covers, usage, reason } => {
                            let stops = stopping.take().map(|(rows, _)| rows).unwrap_or_default();
                            return self.finish_stopped(in_flight, Some(covers), stops, usage, reason).await;
                        }
                        ProviderEvent::Init { session_id } => {
                            if stored.as_deref() != Some(session_id.as_str()) {
                                let provider = self.provider.name();
                                stored = Some(session_id.clone());
                                self.call(move |db| db.set_continuation(provider, &session_id)).await?;
                            }
                        }
                        ProviderEvent::Result { text, covers, usage } => {
                            let mut covered = Vec::new();
                            while in_flight.front().is_some_and(|f| f.id <= covers) {
                                if let Some(done) = in_flight.pop_front() {
                                    covered.push(done.prepared);
                                }
                            }
                            self.turn.answered(covered.iter().flat_map(|p| p.seqs.iter().copied()));
                            if covered.is_empty() {
                                tracing::debug!(covers, "result for prompts already answered");
                            } else {
                                // Every prompt answered: no follow-up is pushed after this
                                // (`ended`), so the batch ends with this write.
                                let last = in_flight.is_empty() && !ended;
                                self.write_result(&text, covered, start_seq, last, usage).await?;
                            }
                            if in_flight.is_empty() && !ended {
                                query.end();
                                ended = true;
                            }
                        }
                        ProviderEvent::Error { message, retryable, classification, ends_turn, usage } => {
                            if !ends_turn {
                                tracing::warn!(error = %message, class = classification.name(), "provider reported an error; it keeps trying");
                                continue;
                            }
                            if in_flight.is_empty() {
                                tracing::warn!(error = %message, class = classification.name(), "error after every prompt was answered");
                                return Ok(QueryEnd::Done);
                            }
                            if let Some((stops, _)) = stopping.take() {
                                tracing::debug!(error = %message, "the stopped turn ended with an error");
                                let covers = in_flight.front().map(|f| f.id);
                                return self.finish_stopped(in_flight, covers, stops, usage, InterruptReason::Stopped).await;
                            }
                            self.ledger.ended_with(usage);
                            return Ok(QueryEnd::Failed {
                                message,
                                retryable,
                                classification,
                                uncovered: in_flight.into_iter().map(|f| f.prepared).collect(),
                            });
                        }
                        ProviderEvent::Progress { message } => tracing::info!(%message, "provider progress"),
                        ProviderEvent::Activity { tool, .. } => {
                            if tool.is_some() && tool != current_tool && !finished {
                                current_tool = tool.clone();
                                self.call(move |db| db.set_current_tool(tool.as_deref())).await?;
                            }
                        }
                    }
                }
                changed = self.watcher.wait(next_poll.saturating_duration_since(Instant::now())), if !ended || self.approvals.waiting() => {
                    let _ = changed;
                    next_poll = Instant::now() + self.options.active_poll;
                    self.poll_approvals(&approver, &mut progress).await?;
                    if ended {
                        continue;
                    }
                    if let Some(prepared) = self.follow_up().await? {
                        let mut ids = in_flight.iter().flat_map(|f| f.prepared.row_ids.clone()).collect::<Vec<_>>();
                        ids.extend(prepared.row_ids.iter().cloned());
                        // The batch widens to the follow-up; the status stays (busy, or
                        // waiting_user while a question is open).
                        let batch = prepared.target.batch(ids);
                        self.call(move |db| db.set_current_batch(Some(&batch))).await?;
                        match query.push(prepared.prompt.clone()) {
                            Ok(id) => {
                                self.turn.pushed(&prepared.seqs);
                                tracing::info!(prompt = id, rows = prepared.row_ids.len(), "pushed a follow-up");
                                in_flight.push_back(InFlight { id, prepared });
                            }
                            Err(err) => {
                                tracing::warn!(%err, "push failed; the rows run after this query");
                                let ids = prepared.row_ids.clone();
                                self.call(move |db| db.release(&ids)).await?;
                            }
                        }
                    }
                }
            }
        }
    }

    /// While a spending limit is reached (crate::budget): nothing is claimed, work claimed
    /// before goes back to `pending`, one `budget_exceeded` row per window is addressed to the
    /// rows held back, and `waiting_on` names the budget. `Some(wait)`: the queue is held; look
    /// again after `wait` or a DB change (a raised limit in config.json is read then).
    async fn budget_hold(&mut self) -> Result<Option<Duration>> {
        if !self.budget.is_active() {
            return Ok(None);
        }
        let now = (self.options.clock)();
        self.budget.reload_if_changed();
        // With no limit set (only the reload may set one), there is nothing to ask the DB.
        let exhausted = if self.budget.has_limit() {
            let budget = self.budget.clone();
            self.call_inline(move |db| budget.exhausted(db, now))
                .await?
        } else {
            None
        };
        let Some(exhausted) = exhausted else {
            if self.budget.release() {
                tracing::info!("spending limit no longer reached: serving the queue again");
                self.call(|db| db.set_waiting_on(None)).await?;
            }
            return Ok(None);
        };
        if self.budget.hold() {
            tracing::warn!(
                limit = exhausted.limit,
                max = %exhausted.max,
                spent = %exhausted.spent,
                window = exhausted.window,
                "spending limit reached: no new query until it resets or is raised"
            );
            let waiting = exhausted.waiting_on(now);
            self.call(move |db| db.set_waiting_on(Some(&waiting)))
                .await?;
        }
        // Work claimed before the limit was reached waits in the queue, not in memory.
        let held: Vec<String> = self.deferred.drain(..).flat_map(work_rows).collect();
        if !held.is_empty() {
            self.call(move |db| db.release(&held)).await?;
        }
        let (first_poll, limit) = (self.first_poll, self.options.max_messages);
        let budget = self.budget.clone();
        let notice = exhausted.clone();
        self.call_inline(move |db| {
            let eligible = db.eligible(now, first_poll, limit)?;
            if !eligible.wakes {
                return Ok(());
            }
            let target = target_of(&eligible.rows);
            let to = (target.routing, target.in_reply_to);
            if let Some(row) = budget.notice(db, &notice, to)? {
                db.insert_out(&row)?;
            }
            Ok(())
        })
        .await?;
        Ok(Some(exhausted.wait(now, self.options.idle_poll)))
    }

    /// Claims rows that arrived mid-turn, through the same gates, and prepares the part that can
    /// go into the running query. Commands and what follows them wait for the query to end;
    /// with a stop among the rows nothing is pushed (the stop is taken by `take_stops`).
    async fn follow_up(&mut self) -> Result<Option<Prepared>> {
        let now = (self.options.clock)();
        let work = self.claim_work(now, false, false).await?.work;
        if work.iter().any(|w| matches!(w, Work::Stop(..))) {
            self.deferred.extend(work);
            return Ok(None);
        }
        let mut work = work.into_iter();
        let first = work.next();
        self.deferred.extend(work);
        match first {
            // A reached budget: the running turn takes no more; the rows wait (crate::budget).
            Some(Work::Prompt(rows)) if self.budget.reached(now) => {
                self.deferred.push_front(Work::Prompt(rows));
                Ok(None)
            }
            Some(Work::Prompt(rows)) => Ok(self
                .prepare(rows, false)
                .await?
                .map(|(prepared, _)| prepared)),
            Some(other) => {
                self.deferred.push_front(other);
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// One poll, in one DB call: the eligible rows at `now` (every gate of
    /// docs/contract/db.md#the-poll), claimed and cut into work items; nothing when they may not
    /// wake the agent, and then when the next row falls due. With `start` (not mid-query), a
    /// claim whose rows go to the agent as they are also starts their batch
    /// ([`batch_at_claim`]), remembered in `self.started` for `run_query`.
    async fn claim_work(
        &mut self,
        now: chrono::DateTime<Utc>,
        first_poll: bool,
        start: bool,
    ) -> Result<Polled> {
        let limit = self.options.max_messages;
        let native = self.provider.native_commands();
        let stop_word = self.options.turn_control.stop_word.clone();
        let provider = self.provider.name();
        let known = self.start_keys.clone();
        let (claimed, started, next_due) = self
            .call_inline(move |db| {
                let eligible = db.eligible(now, first_poll, limit)?;
                if !eligible.wakes {
                    // Only due times after this poll count: rows already due were seen by it
                    // and wait for something other than time (a triggering row, a question
                    // to close), so they must neither make the loop spin nor hide a later
                    // task's due time.
                    return Ok((Vec::new(), None, db.next_due_after(now)?));
                }
                let ids: Vec<String> = eligible.rows.into_iter().map(|r| r.id).collect();
                // The claim that starts a batch also reads what its query starts from, in its
                // own transaction (docs/decisions.md, "The query's start read by the claim").
                // The rows' contents are parsed once: in the claim when it may start a batch, else
                // right after it.
                let mut parsed = None;
                let (rows, started) = db.claim_starting(&ids, |rows, reads| {
                    if !start {
                        return Ok(None);
                    }
                    let contents: Vec<Parsed> = rows.iter().map(parse_content).collect();
                    let batch = batch_at_claim(rows, &contents, native, &stop_word);
                    parsed = Some(contents);
                    match batch {
                        // A failed read leaves the claim standing: `render` reads again, and
                        // an error there surfaces as any query start's does.
                        Some(batch) => Ok(Some((
                            batch,
                            read_start(reads, provider, known.as_ref()).ok(),
                        ))),
                        None => Ok(None),
                    }
                })?;
                let contents = parsed.unwrap_or_else(|| rows.iter().map(parse_content).collect());
                let claimed: Vec<Claimed> = rows
                    .into_iter()
                    .zip(contents)
                    .map(|(row, (content, problems))| Claimed {
                        row,
                        content,
                        problems,
                    })
                    .collect();
                Ok((claimed, started, None))
            })
            .await?;
        (self.started, self.start_reads) = match started {
            Some((batch, reads)) => (Some(batch), reads),
            None => (None, None),
        };
        if let Some(reads) = &self.start_reads {
            self.start_keys = Some(Arc::clone(&reads.keys));
        }
        Ok(Polled {
            work: self.split_work(claimed),
            next_due,
        })
    }

    /// After a failed turn with a model chosen by `/model`: the session goes back to the
    /// previous model and the error is the reply (to `prepared`'s target); true when a switch
    /// was reverted.
    async fn revert_model(&mut self, error: &str, prepared: Option<&Prepared>) -> Result<bool> {
        self.model_on_trial = false;
        let target = prepared.map(|p| p.target.clone()).unwrap_or_default();
        let error = error.to_owned();
        let reverted = self
            .call(move |db| {
                let Some((refused, restored)) = control::revert_model(db)? else {
                    return Ok(false);
                };
                let text = control::model_refused_reply(&refused, restored.as_deref(), &error);
                let reply =
                    NewMessageOut::new(OutKind::Chat, target.routing.clone(), &out::chat_text(&text))
                        .replying_to(target.in_reply_to.clone());
                db.insert_out(&reply)?;
                tracing::warn!(model = %refused, error = %error, "the model chosen by /model failed; the session keeps its previous model");
                Ok(true)
            })
            .await?;
        Ok(reverted)
    }

    /// Takes the stop rows waiting among the deferred work (claimed by a follow-up poll, or with
    /// the rows of the running query).
    fn take_stops(&mut self) -> Vec<MessageIn> {
        if !self.deferred.iter().any(|w| matches!(w, Work::Stop(..))) {
            return Vec::new();
        }
        let mut stops = Vec::new();
        self.deferred.retain_mut(|work| match work {
            Work::Stop(row, _) => {
                stops.push(row.clone());
                false
            }
            _ => true,
        });
        stops
    }

    /// Ends a stopped turn: the prompts the model saw (ids up to `covers`) are completed with
    /// one reply (`stoppedReply`, or for the step limit a note) to the batch's routing, with the
    /// stop rows and the batch's end, in ONE transaction; the others are returned to run next.
    /// Of the prompts the model saw, the first is the stopped turn's own and the reply answers
    /// it; a later one (a push the CLI folded into the stopped request) that no reply answers
    /// yet runs next as well ([`answered_by_the_stop`]): a message the model saw and never
    /// answered is not lost, and runs again once, as the first prompt of the next turn.
    async fn finish_stopped(
        &mut self,
        in_flight: VecDeque<InFlight>,
        covers: Option<PromptId>,
        stops: Vec<MessageIn>,
        usage: Option<Usage>,
        reason: InterruptReason,
    ) -> Result<QueryEnd> {
        let (seen, uncovered): (Vec<_>, Vec<_>) = in_flight
            .into_iter()
            .partition(|f| covers.is_some_and(|covers| f.id <= covers));
        let seen: Vec<Prepared> = seen.into_iter().map(|f| f.prepared).collect();
        // The reply goes to the stopped batch; when the model had seen none of the running
        // prompts (all run next), to the chat stop command itself (the host's row gets none).
        let chat_stop = stops
            .iter()
            .rev()
            .find(|row| row.kind == "chat")
            .map(|row| target_of(std::slice::from_ref(row)));
        let text = match reason {
            InterruptReason::Stopped => self.options.turn_control.stopped_reply.clone(),
            InterruptReason::MaxTurns => control::MAX_TURNS_REPLY.to_owned(),
            InterruptReason::ApprovalStop => String::new(),
        };
        // The ledger row of the stopped turn (its `message_ids`: the rows it answered), written
        // with the completion and counted by the budget once written, as a result's is.
        let series_id = seen.iter().find_map(|p| p.series_id.clone());
        // An approval stop is the turn's answer (its tool's result), not an abort.
        let outcome = match reason {
            InterruptReason::ApprovalStop => UsageOutcome::Result,
            InterruptReason::Stopped | InterruptReason::MaxTurns => UsageOutcome::Aborted,
        };
        let all_seen: Vec<String> = seen.iter().flat_map(|p| p.row_ids.clone()).collect();
        let ledger = self.ledger_row(usage.as_ref(), outcome, all_seen, series_id);
        let prompts: Vec<(Vec<String>, Target)> = seen
            .iter()
            .map(|p| (p.row_ids.clone(), p.target.clone()))
            .collect();
        let stop_ids: Vec<String> = stops.iter().map(|row| row.id.clone()).collect();
        let now = (self.options.clock)();
        let budget = self.budget.clone();
        let (_, (answered, ledger)) = self
            .call(move |db| {
                let written = db.complete_decided_at(
                    |reads| {
                        let ids: Vec<String> =
                            prompts.iter().flat_map(|(ids, _)| ids.clone()).collect();
                        let replied: HashSet<String> = reads.answered(&ids)?.into_iter().collect();
                        let answered = answered_by_the_stop(&prompts, &replied);
                        let kept = prompts.iter().zip(&answered).filter(|(_, a)| **a);
                        let target = kept
                            .clone()
                            .next_back()
                            .map(|((_, target), _)| target.clone())
                            .or_else(|| chat_stop.clone());
                        let replies: Vec<NewMessageOut> = target
                            .filter(|_| !text.trim().is_empty())
                            .map(|target| {
                                NewMessageOut::new(
                                    OutKind::Chat,
                                    target.routing,
                                    &out::chat_text(&text),
                                )
                                .replying_to(target.in_reply_to)
                            })
                            .into_iter()
                            .collect();
                        let mut ledger = ledger.clone();
                        ledger.message_ids = kept.flat_map(|((ids, _), _)| ids.clone()).collect();
                        let mut ids = ledger.message_ids.clone();
                        ids.extend(stop_ids.iter().cloned());
                        let completion = Completion {
                            ids,
                            replies,
                            usage: Some(ledger.clone()),
                        };
                        Ok((completion, (answered, ledger)))
                    },
                    now,
                    true,
                )?;
                budget.recorded(&written.1 .1, now);
                Ok(written)
            })
            .await?;
        self.batch_finished = true;
        // The prompts seen and left unanswered run first, in their order, then the unseen ones.
        let (covered, run_again): (Vec<_>, Vec<_>) = seen
            .into_iter()
            .zip(answered)
            .partition(|(_, answered)| *answered);
        self.turn
            .answered(covered.iter().flat_map(|(p, _)| p.seqs.iter().copied()));
        let run_again: Vec<Prepared> = run_again.into_iter().map(|(p, _)| p).collect();
        if !run_again.is_empty() {
            tracing::info!(
                rows = run_again.iter().map(|p| p.row_ids.len()).sum::<usize>(),
                "pushed rows the model saw and no reply answered run next"
            );
        }
        let uncovered: Vec<Prepared> = run_again
            .into_iter()
            .chain(uncovered.into_iter().map(|f| f.prepared))
            .collect();
        tracing::info!(
            ?reason,
            answered = ledger.message_ids.len(),
            run_next = uncovered.iter().map(|p| p.row_ids.len()).sum::<usize>(),
            "turn stopped"
        );
        Ok(QueryEnd::Stopped { uncovered, reason })
    }

    /// A turn's ledger row, built by the one ledger helper (`crate::ledger`), its tokens noted
    /// for the turn's log line.
    fn ledger_row(
        &mut self,
        usage: Option<&Usage>,
        outcome: UsageOutcome,
        message_ids: Vec<String>,
        series_id: Option<String>,
    ) -> schema::NewTurnUsage {
        let row = self
            .ledger
            .row(self.provider.name(), usage, outcome, message_ids, series_id);
        self.turn.used(Some(&row));
        row
    }

    /// Delivers the `<message to>` blocks of a piece of text the agent just wrote, at once
    /// (routed and checked for repeats like a result's replies); its rows stay in progress
    /// until a result covers them.
    async fn deliver_blocks(
        &self,
        piece: &str,
        in_flight: &VecDeque<InFlight>,
        start_seq: i64,
    ) -> Result<()> {
        let blocks = reply::parse_blocks(piece);
        let Some(last) = in_flight.back().filter(|_| !blocks.is_empty()) else {
            return Ok(());
        };
        let target = last.prepared.target.clone();
        let ids: Vec<String> = in_flight
            .iter()
            .flat_map(|f| f.prepared.row_ids.iter().cloned())
            .collect();
        let now = (self.options.clock)();
        let written = self
            .call_inline(move |db| {
                // Completing no row: the replies alone, in one transaction.
                db.complete_replies_with_usage_at(
                    &[],
                    |reads| reply_rows(reads, &blocks, &target, &ids, start_seq),
                    None,
                    now,
                    false,
                )
            })
            .await?;
        tracing::debug!(replies = written.len(), "message blocks delivered mid-turn");
        Ok(())
    }

    /// Writes a progress row (`payload`: tool, summary, elapsedMs) routed like the running
    /// batch's replies.
    async fn write_progress(
        &self,
        payload: serde_json::Value,
        in_flight: &VecDeque<InFlight>,
    ) -> Result<()> {
        let Some(last) = in_flight.back() else {
            return Ok(());
        };
        let content = out::system_action("progress", payload);
        let row = NewMessageOut::new(
            OutKind::System,
            last.prepared.target.routing.clone(),
            &content,
        )
        .replying_to(last.prepared.target.in_reply_to.clone());
        self.call_inline(move |db| db.insert_out(&row)).await?;
        Ok(())
    }

    /// Writes the reply of covered prompts and completes their rows in ONE transaction.
    async fn write_result(
        &mut self,
        text: &str,
        covered: Vec<Prepared>,
        start_seq: i64,
        last: bool,
        usage: Option<Usage>,
    ) -> Result<()> {
        let target = covered.last().map(|p| p.target.clone()).unwrap_or_default();
        let ids: Vec<String> = covered
            .iter()
            .flat_map(|p| p.row_ids.iter().cloned())
            .collect();
        let series_id = covered.iter().find_map(|p| p.series_id.clone());
        let ledger = self.ledger_row(usage.as_ref(), UsageOutcome::Result, ids.clone(), series_id);
        let outgoing = reply::parse_reply(text);
        let now = (self.options.clock)();
        let budget = self.budget.clone();
        // Routing, the duplicate check and the write in one DB call; the ledger row and, for
        // the query's last result, the batch's finish go in the same transaction.
        let written = self
            .call_inline(move |db| {
                let written = db.complete_replies_with_usage_at(
                    &ids,
                    |reads| reply_rows(reads, &outgoing, &target, &ids, start_seq),
                    Some(&ledger),
                    now,
                    last,
                )?;
                budget.recorded(&ledger, now);
                Ok(written)
            })
            .await?;
        self.batch_finished |= last;
        tracing::debug!(replies = written.len(), seqs = ?written.iter().map(|w| w.seq).collect::<Vec<_>>(), "turn answered");
        Ok(())
    }

    /// Runs a blocking DB call off the async workers. A call that fails because the disk is
    /// full is retried (backoff 100 ms doubling to 5 s) until it succeeds or the runner stops:
    /// what it writes (a reply, a completion, a claim) waits in memory, so a turn is never run
    /// again for want of space. Once stopping, it gives up with [`StoppedWhileDiskFull`].
    async fn call<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&SessionDb) -> Result<T, schema::Error> + Send + Sync + 'static,
    {
        self.call_on(DbThread::Blocking, f).await
    }

    /// [`Runner::call`] on the runtime's own thread: for the per-message calls that take
    /// well under a millisecond (the poll with its claim, the destinations a prompt names, a
    /// query's start, a result's write), where the hand-off to a blocking thread and back cost
    /// more CPU and latency than the call (docs/decisions.md, "The runner's hot path").
    async fn call_inline<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&SessionDb) -> Result<T, schema::Error> + Send + Sync + 'static,
    {
        self.call_on(DbThread::Inline, f).await
    }

    async fn call_on<T, F>(&self, on: DbThread, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&SessionDb) -> Result<T, schema::Error> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        let mut backoff = DISK_FULL_FIRST_RETRY;
        let mut waited = false;
        loop {
            let outcome = match on {
                DbThread::Inline => {
                    match schema::db::with_lock_wait(INLINE_LOCK_WAIT, || f(&self.inline_db)) {
                        // Another writer holds the lock: wait for it on a blocking thread,
                        // where the connection's busy timeout applies (nothing was written).
                        Err(err) if err.is_busy() => {
                            tracing::debug!(%err, "DB lock held: the call waits off the runtime's thread");
                            let db = self.db.clone();
                            let attempt = Arc::clone(&f);
                            tokio::task::spawn_blocking(move || attempt(&db))
                                .await
                                .context("a DB task panicked")?
                        }
                        outcome => outcome,
                    }
                }
                DbThread::Blocking => {
                    let db = self.db.clone();
                    let attempt = Arc::clone(&f);
                    tokio::task::spawn_blocking(move || attempt(&db))
                        .await
                        .context("a DB task panicked")?
                }
            };
            let err = match outcome {
                Ok(value) => {
                    if waited {
                        self.disk_full.cleared();
                    }
                    return Ok(value);
                }
                Err(err) if err.is_disk_full() => err,
                Err(err) => return Err(err.into()),
            };
            self.disk_full.hit(&err);
            waited = true;
            if self.stop.is_cancelled() {
                return Err(anyhow::Error::from(err).context(StoppedWhileDiskFull));
            }
            tokio::select! {
                _ = self.stop.cancelled() => {
                    return Err(anyhow::Error::from(err).context(StoppedWhileDiskFull));
                }
                _ = sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(DISK_FULL_MAX_RETRY);
        }
    }
}

/// The reply rows of a result's messages (blocking: DB reads): a bare message goes to the
/// batch's `target`, a `<message to="name">` where `route_to_destination` sends it, answering
/// the row it names (not at all to an unknown name); a message already sent this turn (a `messages_out` row after
/// `start_seq` with the same routing and text) is not written twice.
fn reply_rows(
    reads: &Reads<'_>,
    outgoing: &[reply::Outgoing],
    target: &Target,
    ids: &[String],
    start_seq: i64,
) -> Result<Vec<NewMessageOut>, schema::Error> {
    let mut replies = Vec::new();
    if outgoing.is_empty() {
        return Ok(replies);
    }
    let sent_this_turn = reads.messages_out_after(start_seq, 10_000)?;
    for message in outgoing {
        let (routing, in_reply_to) = match &message.to {
            None => (target.routing.clone(), target.in_reply_to.clone()),
            Some(name) => {
                match reads.route_to_destination(name, ids, target.in_reply_to.as_deref())? {
                    DestinationRoute::Found {
                        routing,
                        in_reply_to,
                    } => (routing, in_reply_to),
                    DestinationRoute::Unknown { known } => {
                        tracing::warn!(destination = %name, ?known, "reply addressed to an unknown destination; not sent");
                        continue;
                    }
                }
            }
        };
        // A bare text (the batch's reply) equal to anything sent this turn, to whomever, is a
        // repeat too: the final text that restates a block or a `send_message`.
        let duplicate = sent_this_turn.iter().any(|row| {
            row.kind == "chat"
                && (row.routing == routing || message.to.is_none())
                && serde_json::from_str::<serde_json::Value>(&row.content)
                    .ok()
                    .and_then(|v| {
                        v.get("text")
                            .and_then(|t| t.as_str())
                            .map(|t| reply::same_text(t, &message.text))
                    })
                    .unwrap_or(false)
        });
        if duplicate {
            tracing::info!("result repeats a message already sent this turn; not written twice");
            continue;
        }
        replies.push(
            NewMessageOut::new(OutKind::Chat, routing, &out::chat_text(&message.text))
                .replying_to(in_reply_to),
        );
    }
    Ok(replies)
}

/// The destinations `read`; none, with a warning, when they could not be read (the prompt then
/// names no destination and the system prompt lists none).
fn destinations_or_none(read: Result<Vec<Destination>, schema::Error>) -> Vec<Destination> {
    read.unwrap_or_else(|err| {
        tracing::warn!("{err:#}: the prompt and the system prompt list no destinations");
        Vec::new()
    })
}

/// What a query starts from in the DB, read through `reads` (one snapshot); the
/// `session_state` keys are `known` while their stamp holds.
fn read_start(
    reads: &Reads<'_>,
    provider: &str,
    known: Option<&Arc<StartKeys>>,
) -> Result<StartReads, schema::Error> {
    let keys = reads.start_keys(provider, known)?;
    Ok(StartReads {
        destinations: destinations_or_none(reads.destinations()),
        query: QueryStart {
            continuation: keys.continuation.clone(),
            start_seq: reads.max_out_seq()?,
            system_prompt: None,
            model: keys.model.clone(),
            // A `/model` switch waits for its first successful turn.
            model_on_trial: keys.model_previous.is_some(),
        },
        keys,
    })
}

/// The query's start from what was read: the system prompt's files are re-read now, so
/// changes made mid-session reach the next query. On the runtime's thread: regular files
/// only, each capped, so this is bounded (docs/decisions.md, "The query's start on the
/// runtime's thread"). Also returns the destinations, for the prompt.
fn query_start(
    reads: StartReads,
    sources: Option<&PromptSources>,
) -> (Vec<Destination>, QueryStart) {
    let StartReads {
        destinations,
        mut query,
        ..
    } = reads;
    query.system_prompt = sources.map(|sources| build_system_prompt(sources, &destinations));
    (destinations, query)
}

/// What `content` asks of the runner as a command: `None` for none, `Some(None)` for `/clear`,
/// `Some(Some(text))` for a command the CLI handles natively (`native`: its first words).
fn command_of(content: &InboundContent, native: &[&str]) -> Option<Option<String>> {
    let text = content
        .chat_text()
        .map(str::trim)
        .filter(|t| t.starts_with('/'))?;
    if text == "/clear" {
        Some(None)
    } else {
        let word = text.split_whitespace().next().unwrap_or(text);
        native.contains(&word).then(|| Some(text.to_owned()))
    }
}

/// A task's pre-agent script, if it has one.
fn pre_agent_script(content: &InboundContent) -> Option<&str> {
    match content {
        InboundContent::Task(task) => task.script.as_deref().filter(|s| !s.trim().is_empty()),
        _ => None,
    }
}

/// The batch a claim can start in its own transaction: when the claimed rows go to the agent
/// as one prompt exactly as they are (a triggering row among them, no command, no pre-agent
/// script), the batch `run_query` will start is known at the claim. Otherwise `None`: the batch
/// is started after gating, as before.
fn batch_at_claim(
    rows: &[MessageIn],
    contents: &[Parsed],
    native: &[&str],
    stop_word: &str,
) -> Option<CurrentBatch> {
    if !rows.iter().any(|row| row.trigger) {
        return None;
    }
    for (content, _) in contents {
        if command_of(content, native).is_some()
            || control::command_of(content, stop_word).is_some()
            || pre_agent_script(content).is_some()
        {
            return None;
        }
    }
    let target = target_parsed(rows, contents.iter().map(|(content, _)| content));
    Some(target.batch(rows.iter().map(|row| row.id.clone()).collect()))
}

/// Replies of a batch go to the latest triggering row's origin; it is also the `in_reply_to`.
fn target_of(rows: &[MessageIn]) -> Target {
    let contents: Vec<InboundContent> = rows
        .iter()
        .map(|row| InboundContent::parse(&row.kind(), &row.content))
        .collect();
    target_parsed(rows, contents.iter())
}

/// [`target_of`] with the rows' contents already parsed, in the rows' order: a row's content
/// is parsed once on its way to the prompt, not once per use.
fn target_parsed<'a>(
    rows: &[MessageIn],
    contents: impl DoubleEndedIterator<Item = &'a InboundContent>,
) -> Target {
    let origin = rows
        .iter()
        .rev()
        .find(|r| r.trigger)
        .or_else(|| rows.last());
    let sender_id = contents
        .rev()
        .find_map(|content| content.sender_id().map(str::to_owned));
    match origin {
        Some(row) => Target {
            routing: row.routing.clone(),
            in_reply_to: Some(row.id.clone()),
            sender_id,
        },
        None => Target::default(),
    }
}

/// Where a DB call of the loop runs.
#[derive(Debug, Clone, Copy)]
enum DbThread {
    /// On a blocking thread (`spawn_blocking`): calls that are rare or may wait long.
    Blocking,
    /// On the runtime's thread: the per-message sub-millisecond calls. A call that would wait
    /// more than [`INLINE_LOCK_WAIT`] for another writer's lock moves to a blocking thread, so
    /// the heartbeat, the CLI's I/O and the credential proxy, on the same thread, never wait
    /// behind a lock.
    Inline,
}

/// The longest an inline DB call waits for another connection's lock on the runtime's thread.
/// The host's and mcp-tools' transactions take well under it.
const INLINE_LOCK_WAIT: Duration = Duration::from_millis(20);

/// First wait before a write that failed on a full disk is tried again.
const DISK_FULL_FIRST_RETRY: Duration = Duration::from_millis(100);
/// Longest wait between two tries of a write on a full disk.
const DISK_FULL_MAX_RETRY: Duration = Duration::from_secs(5);

/// Whether the session DB's disk is full, shared by the loop and the heartbeat so the condition
/// is logged once when it starts and once when a write succeeds again, not per retry or tick.
#[derive(Debug, Default)]
struct DiskFull {
    since: std::sync::Mutex<Option<Instant>>,
}

impl DiskFull {
    /// A write failed for lack of space.
    fn hit(&self, err: &schema::Error) {
        let mut since = self.since.lock().unwrap_or_else(|p| p.into_inner());
        if since.is_none() {
            *since = Some(Instant::now());
            tracing::warn!(
                error = %err,
                "session DB disk full: writes are retried until space returns (results kept in \
                 memory, heartbeat stale meanwhile)"
            );
        }
    }

    /// A write succeeded.
    fn cleared(&self) {
        let since = self.since.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(since) = since {
            tracing::info!(
                waited_secs = since.elapsed().as_secs_f64(),
                "session DB writable again after a full disk"
            );
        }
    }
}

/// A DB write gave up waiting for disk space because the runner is stopping. The rows of the
/// turn stay `processing` and the next start puts them back to `pending`, as after a crash.
#[derive(Debug)]
struct StoppedWhileDiskFull;

impl std::fmt::Display for StoppedWhileDiskFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stopping while the session DB's disk is full")
    }
}

/// Turns [`StoppedWhileDiskFull`] into a normal stop (`Ok(true)`: shutdown requested), with a
/// log line; any other error passes through.
fn stopped_while_full(err: anyhow::Error) -> Result<bool> {
    if err.is::<StoppedWhileDiskFull>() {
        tracing::warn!(
            "stopping while the session DB's disk is full: unwritten results are dropped; rows \
             in progress stay processing and are retried at the next start"
        );
        Ok(true)
    } else {
        Err(err)
    }
}

/// A turn without model output is shown as waiting (`runner_state.waiting_on`) after this long,
/// or at once when the CLI reports a retry.
const WAITING_SHOWN_AFTER: Duration = Duration::from_secs(10);
/// How long the CLI may take to end a turn on its interrupt (`/stop`) before the runner aborts
/// the turn instead (the stop must take effect within seconds).
const STOP_GRACE: Duration = Duration::from_secs(3);
/// How long an aborted query may take to wind down before the runner goes on without it.
const ABORT_WIND_DOWN: Duration = Duration::from_secs(15);
/// The longest a rate limit's reset time is waited out by the runner's own retries; a later
/// reset goes to the host in the `query_error` row.
const MAX_RATE_LIMIT_WAIT: Duration = Duration::from_secs(60);

/// Why the progress deadline ended a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stall {
    /// Retry notices and no output.
    Notices,
    /// No output at all.
    Silence,
    /// The turn's total cap.
    TurnCap,
}

/// The progress of the running turn, for the progress deadline and `waiting_on`.
#[derive(Debug)]
struct TurnProgress {
    started: Instant,
    /// The last model output (or the turn's start, or a tool's end).
    last: Instant,
    /// The wall-clock time of `last`, for `waiting_on.since`.
    last_wall: chrono::DateTime<Utc>,
    /// Tool calls running.
    tools: usize,
    /// Retry notices since `last`.
    notices: u32,
    last_notice: Option<String>,
    /// Whether `waiting_on` is written (and must be cleared on output).
    shown: bool,
    /// Whether the CLI waits for the user's answer to an approval question: the silence is
    /// the user's, not the model's (only the turn's cap applies).
    asking: bool,
}

impl TurnProgress {
    fn new(now: Instant, wall: chrono::DateTime<Utc>) -> Self {
        Self {
            started: now,
            last: now,
            last_wall: wall,
            tools: 0,
            notices: 0,
            last_notice: None,
            shown: false,
            asking: false,
        }
    }

    /// Model output: the clock starts again; true when `waiting_on` must be cleared.
    fn output(&mut self, now: Instant, wall: chrono::DateTime<Utc>) -> bool {
        self.last = now;
        self.last_wall = wall;
        self.notices = 0;
        self.last_notice = None;
        std::mem::replace(&mut self.shown, false)
    }

    /// Notes what `event` says about the turn's progress (tools running, retry notices); true
    /// when the turn moved and the silence clock starts again ([`TurnProgress::output`]).
    fn note(&mut self, event: &ProviderEvent) -> bool {
        match event {
            // `Init`: the CLI is up and its session open. Its start-up (seconds for OpenCode's
            // server, more on a loaded machine) is not the model's silence.
            ProviderEvent::Output | ProviderEvent::Init { .. } | ProviderEvent::Progress { .. } => {
                true
            }
            ProviderEvent::Result { .. } => {
                self.tools = 0;
                true
            }
            ProviderEvent::Activity { tool: Some(_), .. } => {
                self.tools += 1;
                true
            }
            ProviderEvent::ToolEnded { running } => {
                self.tools = *running;
                true
            }
            ProviderEvent::Error {
                message,
                ends_turn: false,
                ..
            } => {
                self.notice(message);
                // The caller writes `waiting_on` now, unless it names an approval (which
                // model output must then not clear).
                self.shown |= !self.asking;
                false
            }
            _ => false,
        }
    }

    /// A retry or reconnect notice of the CLI.
    fn notice(&mut self, message: &str) {
        self.notices = self.notices.saturating_add(1);
        self.last_notice = Some(message.to_owned());
    }

    /// The next deadline and its cause, if any applies.
    fn deadline(&self, limits: &ProgressLimits) -> Option<(Instant, Stall)> {
        let on = |limit: Duration| (!limit.is_zero()).then_some(limit);
        let mut candidates = Vec::new();
        if let Some(cap) = on(limits.max_turn) {
            candidates.push((self.started + cap, Stall::TurnCap));
        }
        if self.tools == 0 && !self.asking {
            if let Some(silence) = on(limits.silence) {
                candidates.push((self.last + silence, Stall::Silence));
            }
            if let Some(notice) = on(limits.notice).filter(|_| self.notices > 0) {
                candidates.push((self.last + notice, Stall::Notices));
            }
        }
        candidates.into_iter().min_by_key(|(at, _)| *at)
    }

    /// When `waiting_on` should be written, if it is not yet.
    fn show_at(&self) -> Option<Instant> {
        (!self.shown && self.tools == 0 && !self.asking).then(|| self.last + WAITING_SHOWN_AFTER)
    }

    fn waiting_on(&self, endpoint: &str) -> WaitingOn {
        WaitingOn {
            endpoint: endpoint.to_owned(),
            since: schema::time::format_ts(self.last_wall),
            notices: self.notices,
            last_notice: self.last_notice.clone(),
            budget: None,
            approval: None,
            question_id: None,
        }
    }

    /// The `query_error` message of a stall: the endpoint, the cause, and the setting.
    fn message(
        &self,
        stall: Stall,
        now: Instant,
        limits: &ProgressLimits,
        endpoint: &str,
    ) -> String {
        let quiet = now.saturating_duration_since(self.last).as_secs();
        match stall {
            Stall::Notices => format!(
                "no progress: the model at {endpoint} gave no output for {quiet} s while the CLI \
                 kept retrying ({} retry notices; last: {}); ended by progressNoticeSecs={}",
                self.notices,
                self.last_notice.as_deref().unwrap_or("?"),
                limits.notice.as_secs()
            ),
            Stall::Silence => format!(
                "no progress: the model at {endpoint} gave no output for {quiet} s (stream \
                 stalled: no data, or no answer to the request); ended by progressSilenceSecs={}",
                limits.silence.as_secs()
            ),
            Stall::TurnCap => format!(
                "the turn ran for {} s, its cap (maxTurnSecs={}); the model is at {endpoint}",
                now.saturating_duration_since(self.started).as_secs(),
                limits.max_turn.as_secs()
            ),
        }
    }
}

/// The ids of the rows a work item carries.
fn work_rows(work: Work) -> Vec<String> {
    match work {
        Work::Prompt(rows) => rows.into_iter().map(|claimed| claimed.row.id).collect(),
        Work::Clear(row) | Work::Native(row, _) | Work::Stop(row, _) | Work::Model(row, _) => {
            vec![row.id]
        }
    }
}

/// Which of a stopped turn's prompts the stop answers (completes), by position: the first, the
/// turn's own, which the stop's reply answers; and each later one (a push the model saw) that a
/// reply already answers (`replied`: the row ids some `chat` row answers, `Reads::answered`).
/// The others run next: a message whose turn was stopped before any reply to it was delivered
/// starts the next turn, where it comes first and so is answered by a stop of that turn: once.
fn answered_by_the_stop<T>(prompts: &[(Vec<String>, T)], replied: &HashSet<String>) -> Vec<bool> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, (ids, _))| i == 0 || ids.iter().any(|id| replied.contains(id)))
        .collect()
}

/// Merges unanswered prompts into one, for a retry.
fn merge(prepared: Vec<Prepared>) -> Option<Prepared> {
    let mut iter = prepared.into_iter();
    let mut merged = iter.next()?;
    for next in iter {
        merged.prompt.text.push_str("\n\n");
        merged.prompt.text.push_str(&next.prompt.text);
        merged.prompt.media.extend(next.prompt.media);
        merged.row_ids.extend(next.row_ids);
        merged.seqs.extend(next.seqs);
        merged.target = next.target;
        merged.series_id = merged.series_id.or(next.series_id);
    }
    Some(merged)
}

/// Refreshes `heartbeat_at` every `every`. On a full disk the refresh fails: that is logged once
/// (through `disk_full`), the host sees the heartbeat go stale, and fresh again once a write fits.
fn spawn_heartbeat(
    db: SessionDb,
    every: Duration,
    stop: CancellationToken,
    disk_full: Arc<DiskFull>,
    last_event: Arc<LastEventCell>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(every);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticker.tick() => {
                    let db = db.clone();
                    let event = last_event.take_new();
                    match tokio::task::spawn_blocking(move || db.heartbeat_with(event.as_ref())).await {
                        Ok(Ok(())) => disk_full.cleared(),
                        Ok(Err(err)) if err.is_disk_full() => disk_full.hit(&err),
                        Ok(Err(err)) => tracing::warn!(%err, "heartbeat failed"),
                        Err(err) => tracing::warn!(%err, "heartbeat task failed"),
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ProgressLimits = ProgressLimits {
        notice: Duration::from_secs(60),
        silence: Duration::from_secs(120),
        max_turn: Duration::from_secs(3600),
    };

    fn at(progress: &TurnProgress, secs: u64) -> Instant {
        progress.started + Duration::from_secs(secs)
    }

    /// A stop answers its turn's own prompt (the first seen) and the pushes a reply already
    /// answers; a push the model saw without a reply runs next.
    #[test]
    fn a_stop_answers_the_turns_prompt_and_the_pushes_already_answered() {
        let prompt = |ids: &[&str]| (ids.iter().map(|id| (*id).to_owned()).collect(), ());
        let prompts = [
            prompt(&["a"]),
            prompt(&["b", "c"]),
            prompt(&["d"]),
            prompt(&["e"]),
        ];
        let replied: HashSet<String> = ["c", "e"].into_iter().map(str::to_owned).collect();
        assert_eq!(
            answered_by_the_stop(&prompts, &replied),
            [true, true, false, true]
        );
        assert_eq!(
            answered_by_the_stop(&prompts, &HashSet::new()),
            [true, false, false, false]
        );
        assert!(answered_by_the_stop::<()>(&[], &replied).is_empty());
    }

    #[test]
    fn silence_ends_a_turn_after_the_silence_limit() {
        let progress = TurnProgress::new(Instant::now(), Utc::now());
        assert_eq!(
            progress.deadline(&LIMITS),
            Some((at(&progress, 120), Stall::Silence))
        );
    }

    #[test]
    fn the_cli_start_up_is_not_model_silence() {
        // The CLI took 30 s to start (OpenCode's server on a loaded machine): its `Init`
        // starts the silence clock again.
        let mut progress = TurnProgress::new(Instant::now(), Utc::now());
        let init = ProviderEvent::Init {
            session_id: "s-1".to_owned(),
        };
        assert!(progress.note(&init), "Init moves the turn");
        progress.output(at(&progress, 30), Utc::now());
        assert_eq!(
            progress.deadline(&LIMITS),
            Some((at(&progress, 150), Stall::Silence))
        );
    }

    #[test]
    fn retry_notices_shorten_the_deadline_and_output_resets_it() {
        let mut progress = TurnProgress::new(Instant::now(), Utc::now());
        progress.notice("Reconnecting... 1/5 (connection refused)");
        assert_eq!(
            progress.deadline(&LIMITS),
            Some((at(&progress, 60), Stall::Notices))
        );
        let message = progress.message(Stall::Notices, at(&progress, 61), &LIMITS, "http://gw");
        assert!(message.contains("http://gw"), "{message}");
        assert!(message.contains("connection refused"), "{message}");
        assert!(message.contains("progressNoticeSecs=60"), "{message}");
        progress.shown = true;
        assert!(
            progress.output(at(&progress, 30), Utc::now()),
            "clears waiting_on"
        );
        assert_eq!(
            progress.deadline(&LIMITS),
            Some((at(&progress, 150), Stall::Silence))
        );
    }

    #[test]
    fn a_notice_while_an_approval_waits_leaves_waiting_on_to_the_approval() {
        let mut progress = TurnProgress::new(Instant::now(), Utc::now());
        progress.asking = true;
        let notice = ProviderEvent::Error {
            message: "retrying".into(),
            retryable: true,
            classification: ErrorClass::Api,
            ends_turn: false,
            usage: None,
        };
        assert!(!progress.note(&notice));
        assert!(!progress.shown, "the notice does not take waiting_on over");
        assert!(
            !progress.output(at(&progress, 1), Utc::now()),
            "output does not clear the approval's waiting_on"
        );
    }

    #[test]
    fn a_running_tool_pauses_the_deadline_but_not_the_turn_cap() {
        let mut progress = TurnProgress::new(Instant::now(), Utc::now());
        progress.tools = 1;
        progress.notice("retrying");
        assert_eq!(
            progress.deadline(&LIMITS),
            Some((at(&progress, 3600), Stall::TurnCap))
        );
        assert_eq!(progress.show_at(), None);
        let off = ProgressLimits {
            max_turn: Duration::ZERO,
            ..LIMITS
        };
        assert_eq!(progress.deadline(&off), None);
    }
}
