//! The turn: one query driven from its first prompt to its end.
//!
//! A [`Turn`] owns the state of one query (the prompts in flight, the progress clock, the stop
//! being served, the approvals asked, whether the batch is finished). [`Turn::next`] only waits
//! for the next [`TurnEvent`] and decides nothing; [`Runner::handle_event`] hands each event to
//! its one named handler, which decides, and returns the query's end when it ended (the shape
//! of rust-analyzer's `next_event` / `handle_event`).
//!
//! Invariant: a prompt is in `in_flight` from the moment the CLI has it until a result, a stop
//! or the query's failure accounts for it; the turn ends only when `in_flight` is empty
//! (`Done`) or its prompts are handed back (`Stopped`, `Failed`), never with a prompt dropped.

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::Result;
use provider::{
    AgentQuery, Approver, ErrorClass, InterruptReason, ProviderEvent, QueryInput, Usage,
};
use schema::{Alarm, DbWatcher, MessageIn};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::deadline::{Stall, TurnProgress, WAITING_SHOWN_AFTER};
use super::prepare::query_start;
use super::questions::Approvals;
use super::types::{InFlight, Prepared, QueryEnd, QueryStart, Runner};
use crate::progress::ProgressRows;
use crate::progress_limits::ProgressLimits;

/// How long the CLI may take to end a turn on its interrupt (`/stop`) before the runner aborts
/// the turn instead (the stop must take effect within seconds).
const STOP_GRACE: Duration = Duration::from_secs(3);
/// How long an aborted query may take to wind down before the runner goes on without it.
const ABORT_WIND_DOWN: Duration = Duration::from_secs(15);

/// The state of one running query.
pub(super) struct Turn {
    query: AgentQuery,
    /// Answers the CLI's approval requests.
    pub(super) approver: Approver,
    /// The prompts sent and not yet covered by a result, oldest first.
    pub(super) in_flight: VecDeque<InFlight>,
    /// Whether the query was told that no prompt follows (every prompt answered).
    ended: bool,
    /// The stored continuation: an `Init` naming the same session writes nothing.
    stored: Option<String>,
    /// The highest `messages_out` seq when the query started (see [`QueryStart`]).
    pub(super) start_seq: i64,
    /// The tool last written to `runner_state.current_tool`.
    current_tool: Option<String>,
    /// When the DB is looked at again without a change (the active poll).
    next_poll: Instant,
    limits: ProgressLimits,
    /// The progress clock, for the deadline and `waiting_on`.
    pub(super) progress: TurnProgress,
    progress_rows: ProgressRows,
    /// The stop rows being served and when the CLI's interrupt is given up on.
    stopping: Option<(Vec<MessageIn>, Instant)>,
    /// The progress deadline the alarm is set to, and its cause.
    deadline: Option<(Instant, Stall)>,
    alarms: Alarms,
    /// The approval questions the query waits on (issue 16).
    pub(super) approvals: Approvals,
    /// Whether the batch was finished with its last result ([`schema::SessionDb::complete_batch_at`])
    /// or a stop: `run_query` then does not finish it again, and events of the CLI winding down
    /// write no runner state.
    pub(super) batch_finished: bool,
    /// Whether the query is the first with a model chosen by `/model` (confirmed by its
    /// success, reverted by its failure).
    pub(super) model_on_trial: bool,
}

/// The turn's timers, one per thing it may wait out.
#[derive(Default)]
struct Alarms {
    deadline: Alarm,
    stop: Alarm,
    approval: Alarm,
    flush: Alarm,
    show: Alarm,
}

/// What a turn waits for; [`Runner::handle_event`] decides what it means.
pub(super) enum TurnEvent {
    /// The runner stops.
    Shutdown,
    /// The progress deadline passed (the cause).
    Deadline(Option<Stall>),
    /// The CLI did not end the turn within [`STOP_GRACE`] of its interrupt.
    StopGraceOver,
    /// An approval question's deadline passed.
    ApprovalDue,
    /// A throttled progress row is due.
    ProgressDue,
    /// The turn has been silent long enough to show `waiting_on`.
    ShowWaiting,
    /// The provider's next event (`None`: its stream closed).
    Provider(Option<ProviderEvent>),
    /// The DB changed, or the active poll came round.
    DbChanged,
}

/// How an attempt at a query ended, with what outlives its turn.
pub(super) struct Attempt {
    pub(super) end: QueryEnd,
    /// See [`Turn::batch_finished`].
    pub(super) batch_finished: bool,
    /// See [`Turn::model_on_trial`].
    pub(super) model_on_trial: bool,
}

impl Turn {
    /// Waits for the next event; decides nothing. The alarms are set from the turn's state.
    pub(super) async fn next(
        &mut self,
        stop: &CancellationToken,
        watcher: &mut DbWatcher,
    ) -> TurnEvent {
        self.deadline = self.progress.deadline(&self.limits);
        let alarms = &mut self.alarms;
        alarms.deadline.set(self.deadline.map(|(at, _)| at));
        alarms.stop.set(self.stopping.as_ref().map(|(_, at)| *at));
        alarms.approval.set(self.approvals.next_deadline());
        // Once the batch is finished (idle), the CLI winding down shows nothing.
        let open = !self.batch_finished;
        alarms
            .flush
            .set(self.progress_rows.flush_at().filter(|_| open));
        alarms.show.set(self.progress.show_at().filter(|_| open));
        let watch = !self.ended || self.approvals.waiting();
        let poll_in = self.next_poll.saturating_duration_since(Instant::now());
        tokio::select! {
            _ = stop.cancelled() => TurnEvent::Shutdown,
            () = alarms.deadline.ring() => TurnEvent::Deadline(self.deadline.map(|(_, stall)| stall)),
            () = alarms.stop.ring() => TurnEvent::StopGraceOver,
            () = alarms.approval.ring() => TurnEvent::ApprovalDue,
            () = alarms.flush.ring() => TurnEvent::ProgressDue,
            () = alarms.show.ring() => TurnEvent::ShowWaiting,
            event = self.query.next_event() => TurnEvent::Provider(event),
            _ = watcher.wait(poll_in), if watch => TurnEvent::DbChanged,
        }
    }

    /// The prompts not covered, for a retry or the next turn.
    fn uncovered(&mut self) -> Vec<Prepared> {
        std::mem::take(&mut self.in_flight)
            .into_iter()
            .map(|f| f.prepared)
            .collect()
    }

    /// The id the model certainly saw: the first prompt's.
    fn first_id(&self) -> Option<provider::PromptId> {
        self.in_flight.front().map(|f| f.id)
    }

    /// Aborts the query and lets the provider wind the CLI down (interrupt, or restart it)
    /// before the next query; bounded, the CLI may not answer.
    async fn abort_and_wind_down(&mut self) {
        self.query.abort();
        let query = &mut self.query;
        let _ = tokio::time::timeout(ABORT_WIND_DOWN, async {
            while query.next_event().await.is_some() {}
        })
        .await;
    }

    /// The query failed with the prompts still in flight.
    fn failed(&mut self, message: String, retryable: bool, class: ErrorClass) -> QueryEnd {
        QueryEnd::Failed {
            message,
            retryable,
            classification: class,
            uncovered: self.uncovered(),
        }
    }
}

impl Runner {
    /// Runs one attempt at a query: opens its turn (what it starts from, the CLI's query), drives
    /// it to its end inside the turn's log span, then withdraws the questions still open.
    pub(super) async fn attempt(
        &mut self,
        first: Prepared,
        start: Option<QueryStart>,
        stop: &CancellationToken,
    ) -> Result<Attempt> {
        use tracing::Instrument;
        let span = self.log.start(&first.seqs);
        let mut turn = match self
            .open_turn(first, start)
            .instrument(span.clone())
            .await?
        {
            Ok(turn) => turn,
            Err(attempt) => return Ok(attempt),
        };
        let end = self.drive(&mut turn, stop).instrument(span).await?;
        // Questions still open when the query ended (it failed, or the runner stops): the
        // driver denied their calls; the chat learns it and the questions are withdrawn.
        self.withdraw_approvals(&mut turn, false).await?;
        Ok(Attempt {
            end,
            batch_finished: turn.batch_finished,
            model_on_trial: turn.model_on_trial,
        })
    }

    /// Starts the query on the first prompt: `Err` with the attempt's end when the provider
    /// could not start it.
    async fn open_turn(
        &mut self,
        first: Prepared,
        start: Option<QueryStart>,
    ) -> Result<Result<Turn, Attempt>> {
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
        let stored = continuation.clone();
        let input = QueryInput {
            prompt: first.prompt.clone(),
            continuation,
            system_prompt,
            model,
        };
        let query = match self.provider.query(input) {
            Ok(query) => query,
            Err(err) => {
                return Ok(Err(Attempt {
                    end: QueryEnd::Failed {
                        message: err.to_string(),
                        retryable: false,
                        classification: ErrorClass::Process,
                        uncovered: vec![first],
                    },
                    batch_finished: false,
                    model_on_trial,
                }))
            }
        };
        let now = Instant::now();
        Ok(Ok(Turn {
            approver: query.approver(),
            query,
            in_flight: VecDeque::from([InFlight {
                id: 0,
                prepared: first,
            }]),
            ended: false,
            stored,
            start_seq,
            current_tool: None,
            next_poll: now + self.options.active_poll,
            limits: self.options.progress,
            progress: TurnProgress::new(now, (self.options.clock)()),
            progress_rows: ProgressRows::new(self.options.turn_control.progress, now),
            stopping: None,
            deadline: None,
            alarms: Alarms::default(),
            approvals: Approvals::new(self.options.ask_timeout),
            batch_finished: false,
            model_on_trial,
        }))
    }

    /// Serves the turn's events until its end: sends follow-ups, answers, stops.
    async fn drive(&mut self, turn: &mut Turn, stop: &CancellationToken) -> Result<QueryEnd> {
        loop {
            self.serve_stops(turn).await?;
            let event = turn.next(stop, &mut self.watcher).await;
            if let Some(end) = self.handle_event(turn, event).await? {
                return Ok(end);
            }
        }
    }

    /// One handler per event; `Some` when the query ended.
    async fn handle_event(
        &mut self,
        turn: &mut Turn,
        event: TurnEvent,
    ) -> Result<Option<QueryEnd>> {
        match event {
            TurnEvent::Shutdown => {
                turn.query.abort();
                Ok(Some(QueryEnd::Shutdown))
            }
            TurnEvent::Deadline(stall) => Ok(match stall {
                Some(stall) => Some(self.on_deadline(turn, stall).await),
                None => None,
            }),
            TurnEvent::StopGraceOver => self.on_stop_grace_over(turn).await.map(Some),
            TurnEvent::ApprovalDue => {
                self.expire_approvals(turn).await?;
                Ok(None)
            }
            TurnEvent::ProgressDue => {
                if let Some(payload) = turn.progress_rows.flush(Instant::now()) {
                    self.write_progress(payload, &turn.in_flight).await?;
                }
                Ok(None)
            }
            TurnEvent::ShowWaiting => {
                self.on_show_waiting(turn).await?;
                Ok(None)
            }
            TurnEvent::Provider(None) => self.on_stream_closed(turn).await.map(Some),
            TurnEvent::Provider(Some(event)) => self.on_provider_event(turn, event).await,
            TurnEvent::DbChanged => {
                self.on_db_changed(turn).await?;
                Ok(None)
            }
        }
    }

    /// The stop rows claimed since the last event (the stop command, the host's interrupt
    /// row): the first interrupts the turn, later ones join it.
    async fn serve_stops(&mut self, turn: &mut Turn) -> Result<()> {
        if turn.ended || turn.in_flight.is_empty() {
            return Ok(());
        }
        let stops = self.take_stops();
        if stops.is_empty() {
            return Ok(());
        }
        if let Some((rows, _)) = &mut turn.stopping {
            rows.extend(stops);
            return Ok(());
        }
        tracing::info!(rows = stops.len(), "stop requested: interrupting the turn");
        turn.query.interrupt();
        // Approvals still asked are denied (`by: "stop"`) after the interrupt: the CLI must
        // not go on with a refusal first.
        self.withdraw_approvals(turn, true).await?;
        turn.stopping = Some((stops, Instant::now() + STOP_GRACE));
        // An `ask_user_question` of the turn is withdrawn with it.
        let withdrawn = self.call(|db| db.close_open_questions()).await?;
        if withdrawn > 0 {
            tracing::info!(withdrawn, "open questions withdrawn with the stopped turn");
        }
        Ok(())
    }

    /// The progress deadline passed: the turn ends (class `NoProgress`, logged once as the
    /// turn's end).
    async fn on_deadline(&mut self, turn: &mut Turn, stall: Stall) -> QueryEnd {
        let endpoint = &self.options.model_endpoint;
        let message = turn
            .progress
            .message(stall, Instant::now(), &turn.limits, endpoint);
        tracing::debug!(?stall, "progress deadline: ending the turn");
        turn.abort_and_wind_down().await;
        if turn.in_flight.is_empty() {
            return QueryEnd::Done;
        }
        turn.failed(message, true, ErrorClass::NoProgress)
    }

    /// The CLI did not end the turn on its interrupt: the turn is aborted and ends stopped.
    async fn on_stop_grace_over(&mut self, turn: &mut Turn) -> Result<QueryEnd> {
        tracing::warn!(grace = ?STOP_GRACE, "the CLI did not end the turn on its interrupt; aborting the turn");
        turn.abort_and_wind_down().await;
        let stops = turn
            .stopping
            .take()
            .map(|(rows, _)| rows)
            .unwrap_or_default();
        let covers = turn.first_id();
        self.finish_stopped(turn, covers, stops, None, InterruptReason::Stopped)
            .await
    }

    /// The turn has been silent for [`WAITING_SHOWN_AFTER`]: `waiting_on` names the model.
    async fn on_show_waiting(&mut self, turn: &mut Turn) -> Result<()> {
        turn.progress.shown = true;
        let waiting = turn.progress.waiting_on(&self.options.model_endpoint);
        tracing::info!(
            endpoint = %waiting.endpoint,
            notices = waiting.notices,
            "waiting on the model: no output for {} s",
            WAITING_SHOWN_AFTER.as_secs()
        );
        self.call(move |db| db.set_waiting_on(Some(&waiting)))
            .await?;
        Ok(())
    }

    /// The provider's stream closed.
    async fn on_stream_closed(&mut self, turn: &mut Turn) -> Result<QueryEnd> {
        if let Some((stops, _)) = turn.stopping.take() {
            // The stream closed without `Interrupted` (a driver that aborts): the model saw
            // the first prompt at least.
            let covers = turn.first_id();
            return self
                .finish_stopped(turn, covers, stops, None, InterruptReason::Stopped)
                .await;
        }
        if turn.in_flight.is_empty() {
            return Ok(QueryEnd::Done);
        }
        let message = format!("{} ended the query without answering", self.provider.name());
        Ok(turn.failed(message, true, ErrorClass::Process))
    }

    /// A provider event: what it says about progress, then its own handler.
    async fn on_provider_event(
        &mut self,
        turn: &mut Turn,
        event: ProviderEvent,
    ) -> Result<Option<QueryEnd>> {
        self.note_progress(turn, &event).await?;
        match event {
            ProviderEvent::Output | ProviderEvent::ToolEnded { .. } => {}
            ProviderEvent::ApprovalRequest(request) => self.ask_approval(turn, request).await?,
            ProviderEvent::ToolDenied { tool, summary } => {
                self.record_denied(&tool, summary.as_deref(), None, &turn.in_flight)
                    .await?;
            }
            ProviderEvent::ToolUndecidable {
                tool,
                summary,
                reason,
            } => {
                let summary = summary.as_deref();
                self.record_denied(&tool, summary, Some(&reason), &turn.in_flight)
                    .await?;
            }
            ProviderEvent::Text { text } => {
                if !turn.batch_finished {
                    self.deliver_blocks(&text, &turn.in_flight, turn.start_seq)
                        .await?;
                }
            }
            ProviderEvent::Interrupted {
                covers,
                usage,
                reason,
            } => {
                let stops = turn
                    .stopping
                    .take()
                    .map(|(rows, _)| rows)
                    .unwrap_or_default();
                let end = self
                    .finish_stopped(turn, Some(covers), stops, usage, reason)
                    .await?;
                return Ok(Some(end));
            }
            ProviderEvent::Init { session_id } => self.on_init(turn, session_id).await?,
            ProviderEvent::Result {
                text,
                covers,
                usage,
            } => self.on_result(turn, &text, covers, usage).await?,
            ProviderEvent::Error {
                message,
                retryable,
                classification,
                ends_turn,
                usage,
            } => {
                if !ends_turn {
                    tracing::warn!(error = %message, class = classification.name(), "provider reported an error; it keeps trying");
                    return Ok(None);
                }
                let end = self
                    .on_error(turn, message, retryable, classification, usage)
                    .await?;
                return Ok(Some(end));
            }
            ProviderEvent::Progress { message } => tracing::info!(%message, "provider progress"),
            ProviderEvent::Activity { tool, .. } => {
                if tool.is_some() && tool != turn.current_tool && !turn.batch_finished {
                    turn.current_tool = tool.clone();
                    self.call(move |db| db.set_current_tool(tool.as_deref()))
                        .await?;
                }
            }
        }
        Ok(None)
    }

    /// What any provider event says about the turn's progress: the heartbeat's last event,
    /// the progress clock, the progress rows and `waiting_on`.
    async fn note_progress(&mut self, turn: &mut Turn, event: &ProviderEvent) -> Result<()> {
        let now = Instant::now();
        self.last_event.note(event, (self.options.clock)());
        let moved = turn.progress.note(event);
        let finished = turn.batch_finished;
        if let Some(payload) = turn.progress_rows.note(event, now).filter(|_| !finished) {
            self.write_progress(payload, &turn.in_flight).await?;
        }
        // While an approval waits, `waiting_on` names it: the user holds the turn, whatever
        // the CLI reports meanwhile.
        if let (
            ProviderEvent::Error {
                ends_turn: false, ..
            },
            false,
            false,
        ) = (event, finished, turn.progress.asking)
        {
            let waiting = turn.progress.waiting_on(&self.options.model_endpoint);
            self.call(move |db| db.set_waiting_on(Some(&waiting)))
                .await?;
        }
        if moved && turn.progress.output(now, (self.options.clock)()) && !finished {
            self.call(|db| db.set_waiting_on(None)).await?;
        }
        Ok(())
    }

    /// The CLI's session: stored as the continuation when it is a new one.
    async fn on_init(&mut self, turn: &mut Turn, session_id: String) -> Result<()> {
        if turn.stored.as_deref() != Some(session_id.as_str()) {
            let provider = self.provider.name();
            turn.stored = Some(session_id.clone());
            self.call(move |db| db.set_continuation(provider, &session_id))
                .await?;
        }
        Ok(())
    }

    /// A result covering the prompts up to `covers`: their reply is written with their
    /// completion; once every prompt is answered the query is told that none follows.
    async fn on_result(
        &mut self,
        turn: &mut Turn,
        text: &str,
        covers: provider::PromptId,
        usage: Option<Usage>,
    ) -> Result<()> {
        let mut covered = Vec::new();
        while turn.in_flight.front().is_some_and(|f| f.id <= covers) {
            if let Some(done) = turn.in_flight.pop_front() {
                covered.push(done.prepared);
            }
        }
        self.log
            .answered(covered.iter().flat_map(|p| p.seqs.iter().copied()));
        if covered.is_empty() {
            tracing::debug!(covers, "result for prompts already answered");
        } else {
            // Every prompt answered: no follow-up is pushed after this (`ended`), so the
            // batch ends with this write.
            let last = turn.in_flight.is_empty() && !turn.ended;
            self.write_result(turn, text, covered, last, usage).await?;
        }
        if turn.in_flight.is_empty() && !turn.ended {
            turn.query.end();
            turn.ended = true;
        }
        Ok(())
    }

    /// An error that ends the turn.
    async fn on_error(
        &mut self,
        turn: &mut Turn,
        message: String,
        retryable: bool,
        classification: ErrorClass,
        usage: Option<Usage>,
    ) -> Result<QueryEnd> {
        if turn.in_flight.is_empty() {
            tracing::warn!(error = %message, class = classification.name(), "error after every prompt was answered");
            return Ok(QueryEnd::Done);
        }
        if let Some((stops, _)) = turn.stopping.take() {
            tracing::debug!(error = %message, "the stopped turn ended with an error");
            let covers = turn.first_id();
            return self
                .finish_stopped(turn, covers, stops, usage, InterruptReason::Stopped)
                .await;
        }
        self.ledger.ended_with(usage);
        Ok(turn.failed(message, retryable, classification))
    }

    /// The DB changed (or the active poll came round): answers to approval questions, then
    /// rows that arrived mid-turn, pushed into the query as a follow-up.
    async fn on_db_changed(&mut self, turn: &mut Turn) -> Result<()> {
        turn.next_poll = Instant::now() + self.options.active_poll;
        self.poll_approvals(turn).await?;
        if turn.ended {
            return Ok(());
        }
        let Some(prepared) = self.follow_up().await? else {
            return Ok(());
        };
        let mut ids: Vec<String> = turn
            .in_flight
            .iter()
            .flat_map(|f| f.prepared.row_ids.clone())
            .collect();
        ids.extend(prepared.row_ids.iter().cloned());
        // The batch widens to the follow-up; the status stays (busy, or waiting_user while a
        // question is open).
        let batch = prepared.target.batch(ids);
        self.call(move |db| db.set_current_batch(Some(&batch)))
            .await?;
        match turn.query.push(prepared.prompt.clone()) {
            Ok(id) => {
                self.log.pushed(&prepared.seqs);
                tracing::info!(
                    prompt = id,
                    rows = prepared.row_ids.len(),
                    "pushed a follow-up"
                );
                turn.in_flight.push_back(InFlight { id, prepared });
            }
            Err(err) => {
                tracing::warn!(%err, "push failed; the rows run after this query");
                let ids = prepared.row_ids.clone();
                self.call(move |db| db.release(&ids)).await?;
            }
        }
        Ok(())
    }
}
