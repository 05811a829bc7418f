//! The runner loop (docs/contract/db.md#status): poll (woken by DB changes, with the polls as
//! fallback), claim, prepare (commands, scripts, attachments, formatting), query the provider, push
//! follow-ups, and write replies together with the completion of the rows they answer.
//!
//! By concern: `poll.rs` (loop and claim; runner commands; the budget hold; the follow-up claim
//! mid-turn), `prepare.rs` (gates, rendering, what a query starts from), `query.rs` (one attempt
//! per try; `retry_decision`, a pure function), `turn.rs` (a `Turn` owns one query's state;
//! `Turn::next` only waits for the next event, `Runner::handle_event` gives it to its one
//! handler), `deadline.rs` (the progress deadline), `replies.rs` (results, blocks mid-turn,
//! progress rows, a stopped turn's answer), `approval.rs` over `questions.rs` (asked tool calls
//! and elicitations), `db.rs` (`RunnerDb`: the full-disk wait, the heartbeat; `Runner::call` and
//! `call_inline` over it are here). The shared types live in `types.rs`, a leaf over `db.rs`
//! that no file names `mod.rs` for; the files import each other one way only: poll → db,
//! prepare; turn → deadline, prepare, questions; approval → questions, turn; replies → prepare,
//! turn; query → turn.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;

use anyhow::{Context, Result};
use provider::AgentProvider;
use schema::{DbWatcher, RunnerStatus, SessionDb};
use tokio_util::sync::CancellationToken;

use crate::budget::Budget;
use crate::ledger::TurnLedger;
use crate::turn_log::TurnLog;

mod approval;
mod db;
mod deadline;
mod poll;
mod prepare;
mod query;
mod questions;
mod replies;
mod turn;
mod types;

pub use crate::progress_limits::ProgressLimits;

use db::{DbThread, RunnerDb, StoppedWhileDiskFull};
pub use types::{system_clock, tokio_clock, Clock, Runner, RunnerOptions, CLEARED_REPLY};

impl Runner {
    /// Creates the loop. The caller has taken the lock and opened the DB.
    pub fn new(
        db: SessionDb,
        provider: Arc<dyn AgentProvider>,
        options: RunnerOptions,
    ) -> Result<Self> {
        let stop = CancellationToken::new();
        let db = RunnerDb::new(db, stop.clone())?;
        let watcher = DbWatcher::new(&db.inline_db).context("watching the session DB")?;
        let budget = Budget::new(options.budgets.clone(), options.timezone);
        Ok(Self {
            db,
            provider,
            options,
            watcher,
            first_poll: true,
            deferred: VecDeque::new(),
            stop,
            claimed_start: None,
            start_keys: None,
            last_event: Arc::default(),
            log: TurnLog::default(),
            ledger: TurnLedger::default(),
            budget,
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
        let heartbeat = self
            .db
            .heartbeat(self.options.heartbeat, Arc::clone(&self.last_event));

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
}

impl Runner {
    /// Runs a blocking DB call off the async workers. A call that fails because the disk is
    /// full is retried (backoff 100 ms doubling to 5 s) until it succeeds or the runner stops:
    /// what it writes (a reply, a completion, a claim) waits in memory, so a turn is never run
    /// again for want of space. Once stopping, it gives up with [`StoppedWhileDiskFull`].
    pub(super) async fn call<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&SessionDb) -> Result<T, schema::Error> + Send + Sync + 'static,
    {
        self.db.call_on(DbThread::Blocking, f).await
    }

    /// [`Runner::call`] on the runtime's own thread: for the per-message calls that take
    /// well under a millisecond (the poll with its claim, the destinations a prompt names, a
    /// query's start, a result's write), where the hand-off to a blocking thread and back cost
    /// more CPU and latency than the call (docs/decisions/perf.md#D-PERF-01).
    pub(super) async fn call_inline<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&SessionDb) -> Result<T, schema::Error> + Send + Sync + 'static,
    {
        self.db.call_on(DbThread::Inline, f).await
    }
}
