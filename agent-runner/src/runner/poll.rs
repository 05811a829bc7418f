//! The loop and the claim: poll, claim, cut into work items, and serve them in seq order.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use chrono::Utc;
use provider::Prompt;
use schema::content::out;
use schema::{CurrentBatch, InboundContent, MessageIn, NewMessageOut, OutKind};
use tokio_util::sync::CancellationToken;

use crate::turn_control::{self as control, TurnCommand};

use super::db::{stopped_while_full, StoppedWhileDiskFull};
use super::prepare::{pre_agent_script, read_start, target_of, target_parsed};
use super::types::{
    parse_content, Claimed, ClaimedStart, Parsed, Polled, Prepared, Runner, Work, CLEARED_REPLY,
};

impl Runner {
    pub(super) async fn poll_loop(&mut self, stop: &CancellationToken) -> Result<()> {
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
    pub(super) fn idle_wait(&self, next_due: Option<chrono::DateTime<Utc>>) -> Duration {
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
    pub(super) fn split_work(&self, rows: Vec<Claimed>) -> Vec<Work> {
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
    pub(super) async fn process(&mut self, work: Work, stop: &CancellationToken) -> Result<bool> {
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
    pub(super) async fn answer_command(&self, row: MessageIn, reply: Option<String>) -> Result<()> {
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

    pub(super) async fn clear_session(&mut self, row: MessageIn) -> Result<()> {
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

    /// While a spending limit is reached (crate::budget): nothing is claimed, work claimed
    /// before goes back to `pending`, one `budget_exceeded` row per window is addressed to the
    /// rows held back, and `waiting_on` names the budget. `Some(wait)`: the queue is held; look
    /// again after `wait` or a DB change (a raised limit in config.json is read then).
    pub(super) async fn budget_hold(&mut self) -> Result<Option<Duration>> {
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
    pub(super) async fn follow_up(&mut self) -> Result<Option<Prepared>> {
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
    /// ([`batch_at_claim`]), remembered in `self.claimed_start` for `run_query`.
    pub(super) async fn claim_work(
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
                // own transaction (docs/decisions/perf.md#D-PERF-11).
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
        self.claimed_start = started.map(|(batch, reads)| ClaimedStart { batch, reads });
        if let Some(reads) = self.claimed_start.as_ref().and_then(|c| c.reads.as_ref()) {
            self.start_keys = Some(Arc::clone(&reads.keys));
        }
        Ok(Polled {
            work: self.split_work(claimed),
            next_due,
        })
    }

    /// Takes the stop rows waiting among the deferred work (claimed by a follow-up poll, or with
    /// the rows of the running query).
    pub(super) fn take_stops(&mut self) -> Vec<MessageIn> {
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
}

/// What `content` asks of the runner as a command: `None` for none, `Some(None)` for `/clear`,
/// `Some(Some(text))` for a command the CLI handles natively (`native`: its first words).
pub(super) fn command_of(content: &InboundContent, native: &[&str]) -> Option<Option<String>> {
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

/// The batch a claim can start in its own transaction: when the claimed rows go to the agent
/// as one prompt exactly as they are (a triggering row among them, no command, no pre-agent
/// script), the batch `run_query` will start is known at the claim. Otherwise `None`: the batch
/// is started after gating, as before.
pub(super) fn batch_at_claim(
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

/// The ids of the rows a work item carries.
pub(super) fn work_rows(work: Work) -> Vec<String> {
    match work {
        Work::Prompt(rows) => rows.into_iter().map(|claimed| claimed.row.id).collect(),
        Work::Clear(row) | Work::Native(row, _) | Work::Stop(row, _) | Work::Model(row, _) => {
            vec![row.id]
        }
    }
}
