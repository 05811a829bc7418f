//! Replies: results, message blocks, progress rows and a stopped turn's answer, each written
//! with the completion of the rows it answers.

use std::collections::{HashSet, VecDeque};

use anyhow::Result;
use provider::{InterruptReason, PromptId, Usage};
use schema::content::out;
use schema::{
    Completion, DestinationRoute, MessageIn, NewMessageOut, OutKind, Reads, UsageOutcome,
};

use crate::reply;
use crate::turn_control::{self as control};

use super::prepare::target_of;
use super::turn::Turn;
use super::types::{InFlight, Prepared, QueryEnd, Runner, Target};

impl Runner {
    /// Ends a stopped turn: the prompts the model saw (ids up to `covers`) are completed with
    /// one reply (`stoppedReply`, or for the step limit a note) to the batch's routing, with the
    /// stop rows and the batch's end, in ONE transaction; the others are returned to run next.
    /// Of the prompts the model saw, the first is the stopped turn's own and the reply answers
    /// it; a later one (a push the CLI folded into the stopped request) that no reply answers
    /// yet runs next as well ([`answered_by_the_stop`]): a message the model saw and never
    /// answered is not lost, and runs again once, as the first prompt of the next turn.
    pub(super) async fn finish_stopped(
        &mut self,
        turn: &mut Turn,
        covers: Option<PromptId>,
        stops: Vec<MessageIn>,
        usage: Option<Usage>,
        reason: InterruptReason,
    ) -> Result<QueryEnd> {
        let (seen, uncovered): (Vec<_>, Vec<_>) = std::mem::take(&mut turn.in_flight)
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
        turn.batch_finished = true;
        // The prompts seen and left unanswered run first, in their order, then the unseen ones.
        let (covered, run_again): (Vec<_>, Vec<_>) = seen
            .into_iter()
            .zip(answered)
            .partition(|(_, answered)| *answered);
        self.log
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
    pub(super) fn ledger_row(
        &mut self,
        usage: Option<&Usage>,
        outcome: UsageOutcome,
        message_ids: Vec<String>,
        series_id: Option<String>,
    ) -> schema::NewTurnUsage {
        let row = self
            .ledger
            .row(self.provider.name(), usage, outcome, message_ids, series_id);
        self.log.used(Some(&row));
        row
    }

    /// Delivers the `<message to>` blocks of a piece of text the agent just wrote, at once
    /// (routed and checked for repeats like a result's replies); its rows stay in progress
    /// until a result covers them.
    pub(super) async fn deliver_blocks(
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
    pub(super) async fn write_progress(
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
    pub(super) async fn write_result(
        &mut self,
        turn: &mut Turn,
        text: &str,
        covered: Vec<Prepared>,
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
        let start_seq = turn.start_seq;
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
        turn.batch_finished |= last;
        tracing::debug!(replies = written.len(), seqs = ?written.iter().map(|w| w.seq).collect::<Vec<_>>(), "turn answered");
        Ok(())
    }
}

/// The reply rows of a result's messages (blocking: DB reads): a bare message goes to the
/// batch's `target`, a `<message to="name">` where `route_to_destination` sends it, answering
/// the row it names (not at all to an unknown name); a message already sent this turn (a `messages_out` row after
/// `start_seq` with the same routing and text) is not written twice.
pub(super) fn reply_rows(
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

/// Which of a stopped turn's prompts the stop answers (completes), by position: the first, the
/// turn's own, which the stop's reply answers; and each later one (a push the model saw) that a
/// reply already answers (`replied`: the row ids some `chat` row answers, `Reads::answered`).
/// The others run next: a message whose turn was stopped before any reply to it was delivered
/// starts the next turn, where it comes first and so is answered by a stop of that turn: once.
pub(super) fn answered_by_the_stop<T>(
    prompts: &[(Vec<String>, T)],
    replied: &HashSet<String>,
) -> Vec<bool> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, (ids, _))| i == 0 || ids.iter().any(|id| replied.contains(id)))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

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
}
