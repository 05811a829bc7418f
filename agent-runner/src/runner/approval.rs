//! Approvals through the chat (issue 16; docs/contract/db.md#approvals): a tool call the policy
//! marks `ask`, or an MCP elicitation with `elicitation: ask`, becomes a question row through
//! the same path as mcp-tools' `ask_user_question` (`SessionDb::post_question`, so
//! `nanoclaw answer` works unchanged), the status is `waiting_user` while any waits, and the
//! answer, the timeout (`askTimeoutSeconds`) or a stop decides. Each decision on a tool call is
//! a `tool_decision` system row, as is each call the policy refused without asking
//! (`ToolDenied`).
//!
//! The turn loop keeps reading events and DB changes meanwhile: the requests wait here, the
//! loop's DB wake-up looks for their answers and a timer arm ends them at their deadline.

use std::collections::VecDeque;

use anyhow::Result;
use provider::{ApprovalKind, ApprovalRequest};
use schema::content::out;
use schema::{NewMessageOut, OutKind, RunnerStatus};
use tokio::time::Instant;

use super::questions::{decide, decision_row, question, By, Outcome, Pending};
use super::turn::Turn;
use super::types::{InFlight, Runner, Target};

/// Where the rows of the running query go: like the batch's replies (the newest prompt's).
fn target_of(in_flight: &VecDeque<InFlight>) -> Target {
    in_flight
        .back()
        .map(|f| f.prepared.target.clone())
        .unwrap_or_default()
}

impl Runner {
    /// Asks the user about `request` in the chat; the CLI waits until [`Runner::settle`].
    pub(super) async fn ask_approval(
        &self,
        turn: &mut Turn,
        request: ApprovalRequest,
    ) -> Result<()> {
        let timeout = turn.approvals.ask_timeout;
        let (title, text, options) = question(&request.kind, timeout);
        let question_id = uuid::Uuid::new_v4().to_string();
        let target = target_of(&turn.in_flight);
        let content = out::ask_question(&question_id, &title, &text, &options);
        let row = NewMessageOut::new(OutKind::ChatSdk, target.routing.clone(), &content)
            .replying_to(target.in_reply_to.clone());
        let now = (self.options.clock)();
        let deadline = now + chrono::Duration::from_std(timeout).unwrap_or_default();
        match &request.kind {
            ApprovalKind::ToolCall { tool, .. } => {
                tracing::info!(%tool, question = %question_id, "asking the user to approve a tool call")
            }
            ApprovalKind::Elicitation { server, .. } => {
                tracing::info!(%server, question = %question_id, "asking the user for an MCP elicitation")
            }
        }
        let first = !turn.approvals.waiting();
        turn.approvals.pending.push_back(Pending {
            request_id: request.id,
            question_id: question_id.clone(),
            kind: request.kind,
            asked_at: now,
            deadline: Instant::now() + timeout,
            target,
        });
        // Once the batch is finished (idle), the CLI winding down shows nothing. Written
        // before the question, so whoever sees the question sees `waiting_on` name it.
        let waiting = (!turn.batch_finished)
            .then(|| turn.approvals.waiting_on())
            .flatten();
        let posted = self
            .call(move |db| {
                if let Some(waiting) = &waiting {
                    db.set_waiting_on(Some(waiting))?;
                }
                db.post_question(&question_id, deadline, &row, first)
            })
            .await;
        let (_, switched) = match posted {
            Ok(posted) => posted,
            Err(err) => {
                // Not asked: nothing for an answer or a deadline to settle.
                turn.approvals.pending.pop_back();
                return Err(err);
            }
        };
        turn.progress.set_asking(true, Instant::now(), now);
        if first {
            turn.approvals.swapped = switched;
        }
        Ok(())
    }

    /// Records a call the policy refused without asking (`tool_decision`, `by: "policy"`), with
    /// why its command could not be decided when that is why it was refused.
    pub(super) async fn record_denied(
        &self,
        tool: &str,
        summary: Option<&str>,
        undecidable: Option<&str>,
        in_flight: &VecDeque<InFlight>,
    ) -> Result<()> {
        tracing::info!(%tool, ?undecidable, "tool call denied by the policy");
        let row = decision_row(
            tool,
            summary,
            false,
            By::Policy,
            undecidable,
            &target_of(in_flight),
        );
        self.call_inline(move |db| db.insert_out(&row)).await?;
        Ok(())
    }

    /// Takes the answers that arrived (on a DB change) and settles their requests.
    pub(super) async fn poll_approvals(&self, turn: &mut Turn) -> Result<()> {
        if !turn.approvals.waiting() {
            return Ok(());
        }
        let ids: Vec<String> = turn
            .approvals
            .pending
            .iter()
            .map(|p| p.question_id.clone())
            .collect();
        let answers = self
            .call(move |db| {
                let mut answers = Vec::new();
                for id in &ids {
                    if let Some((_, answer)) = db.take_answer(id)? {
                        answers.push((id.clone(), answer));
                    }
                }
                Ok(answers)
            })
            .await?;
        let mut settled = Vec::new();
        for (id, answer) in answers {
            if let Some(at) = turn
                .approvals
                .pending
                .iter()
                .position(|p| p.question_id == id)
            {
                if let Some(pending) = turn.approvals.pending.remove(at) {
                    settled.push((pending, Outcome::Answered(answer)));
                }
            }
        }
        self.settle(turn, settled, true).await
    }

    /// Denies the requests whose deadline passed.
    pub(super) async fn expire_approvals(&self, turn: &mut Turn) -> Result<()> {
        let now = Instant::now();
        let (due, waiting): (VecDeque<_>, VecDeque<_>) =
            std::mem::take(&mut turn.approvals.pending)
                .into_iter()
                .partition(|p| p.deadline <= now);
        turn.approvals.pending = waiting;
        let settled = due.into_iter().map(|p| (p, Outcome::TimedOut)).collect();
        self.settle(turn, settled, true).await
    }

    /// Denies every waiting request (`by: "stop"`): the turn was stopped, or the query ended
    /// without them (`answer_cli` false: the driver denied them already).
    pub(super) async fn withdraw_approvals(&self, turn: &mut Turn, answer_cli: bool) -> Result<()> {
        let settled = std::mem::take(&mut turn.approvals.pending)
            .into_iter()
            .map(|p| (p, Outcome::Stopped))
            .collect();
        self.settle(turn, settled, answer_cli).await
    }

    /// Closes the questions of `settled`, writes their decision rows, answers the CLI (unless
    /// `answer_cli` is false: its query has ended), and once none waits, puts the status and
    /// `waiting_on` back.
    async fn settle(
        &self,
        turn: &mut Turn,
        settled: Vec<(Pending, Outcome)>,
        answer_cli: bool,
    ) -> Result<()> {
        if settled.is_empty() {
            return Ok(());
        }
        let timeout = turn.approvals.ask_timeout;
        let mut questions = Vec::new();
        let mut rows = Vec::new();
        for (pending, outcome) in &settled {
            let (answer, decision) = decide(&pending.kind, outcome, timeout);
            questions.push(pending.question_id.clone());
            if let (
                ApprovalKind::ToolCall {
                    tool,
                    summary,
                    undecidable,
                    ..
                },
                Some((allowed, by)),
            ) = (&pending.kind, decision)
            {
                tracing::info!(
                    %tool,
                    decision = if allowed { "allow" } else { "deny" },
                    by = by.as_str(),
                    question = %pending.question_id,
                    ?undecidable,
                    "tool call decided"
                );
                rows.push(decision_row(
                    tool,
                    summary.as_deref(),
                    allowed,
                    by,
                    undecidable.as_deref(),
                    &pending.target,
                ));
            }
            if answer_cli && !turn.approver.answer(&pending.request_id, answer) {
                tracing::debug!(request = %pending.request_id, "the query ended before the answer");
            }
        }
        let restore = !turn.approvals.waiting() && std::mem::take(&mut turn.approvals.swapped);
        let now = (self.options.clock)();
        let waiting = turn.approvals.waiting_on();
        let batch_open = !turn.batch_finished;
        self.call(move |db| {
            for id in &questions {
                db.close_question(id)?;
            }
            for row in &rows {
                db.insert_out(row)?;
            }
            if restore {
                db.swap_runner_status(RunnerStatus::WaitingUser, RunnerStatus::Busy)?;
            }
            if batch_open {
                db.set_waiting_on(waiting.as_ref())?;
            }
            Ok(())
        })
        .await?;
        let asking = turn.approvals.waiting();
        turn.progress.set_asking(asking, Instant::now(), now);
        Ok(())
    }
}
