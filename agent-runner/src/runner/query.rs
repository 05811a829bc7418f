//! A query and its retries: start its batch, run an attempt (crate::runner::turn), and decide
//! what follows its end. The retry policy is one pure function, [`retry_decision`].

use std::time::Duration;

use anyhow::Result;
use provider::{ErrorClass, InterruptReason};
use schema::content::out;
use schema::{NewMessageOut, OutKind, UsageOutcome};
use serde_json::json;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::turn::Attempt;
use super::types::{Prepared, QueryEnd, QueryStart, Runner};
use crate::turn_control as control;
use crate::turn_log::Outcome;

/// What comes after a query's batch is finished.
enum Next {
    /// Return from `run_query` (true: shutdown requested).
    Return(bool),
    /// Run the uncovered prompts (merged) again after the backoff.
    Retry(Box<Prepared>, Duration),
}

/// A failed attempt, as the retry policy sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Failure {
    /// Whether the provider called the error retryable.
    pub(super) retryable: bool,
    pub(super) class: ErrorClass,
    /// Whether a `/model` switch on trial was reverted because of it.
    pub(super) model_refused: bool,
}

/// What the runner does with a failed attempt's prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decision {
    /// Run them again after `backoff`, as retry number `attempt`.
    Retry { attempt: u32, backoff: Duration },
    /// Give up: a `query_error` row tells the host.
    Report,
}

/// The retry policy: a refused `/model` switch runs the turn again at once (on the previous
/// model, not counted); a retryable error is retried up to `max_retries` times with a backoff
/// of 1, 2, 4 ... s (at most 32 s, at least the rate limit's reset). A turn that made no
/// progress already waited its deadline out (the CLI's own retries included): running it again
/// would multiply that bound, so it goes to the host at once. A rate limit is waited out here
/// only when its reset is near ([`MAX_RATE_LIMIT_WAIT`]).
pub(super) fn retry_decision(failure: Failure, attempt: u32, max_retries: u32) -> Decision {
    if failure.model_refused {
        return Decision::Retry {
            attempt,
            backoff: Duration::ZERO,
        };
    }
    let retry_after = failure.class.retry_after();
    let runner_retries = failure.retryable
        && failure.class != ErrorClass::NoProgress
        && retry_after.is_none_or(|after| after <= MAX_RATE_LIMIT_WAIT);
    if !runner_retries || attempt >= max_retries {
        return Decision::Report;
    }
    let attempt = attempt + 1;
    let backoff =
        Duration::from_secs(1 << (attempt - 1).min(5)).max(retry_after.unwrap_or_default());
    Decision::Retry { attempt, backoff }
}

impl Runner {
    /// Runs one query to its end, with retries; true when shutdown was requested. `start`:
    /// what the first attempt starts from, when it was read with the prompt (a retry reads it
    /// again).
    pub(super) async fn run_query(
        &mut self,
        first: Prepared,
        mut start: Option<QueryStart>,
        stop: &CancellationToken,
    ) -> Result<bool> {
        let mut attempt = 0u32;
        let mut prepared = first;
        loop {
            let batch = prepared.target.batch(prepared.row_ids.clone());
            // The poll's claim may have started this very batch in its transaction.
            let claimed = self.claimed_start.take().map(|claimed| claimed.batch);
            if claimed.as_ref() != Some(&batch) {
                self.call(move |db| db.start_batch(&batch)).await?;
            }
            self.ledger.start();
            let Attempt {
                end,
                batch_finished,
                model_on_trial,
            } = self.attempt(prepared, start.take(), stop).await?;
            let (report, next) = self.after_end(end, model_on_trial, &mut attempt).await?;
            // Runner state back to idle, with a failed query's report, in one transaction;
            // unless the last result already did (a query that answered everything).
            let failed = self.ledger.take_failed();
            if report.is_some() || failed.is_some() || !batch_finished {
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

    /// What follows a query's end: its `turn ended` line, and a failure's report or a retry.
    async fn after_end(
        &mut self,
        end: QueryEnd,
        model_on_trial: bool,
        attempt: &mut u32,
    ) -> Result<(Option<NewMessageOut>, Next)> {
        let provider = self.provider.name();
        Ok(match end {
            QueryEnd::Done => {
                if model_on_trial {
                    self.call(control::confirm_model).await?;
                }
                self.log.end(provider, Outcome::Answered);
                (None, Next::Return(false))
            }
            QueryEnd::Shutdown => {
                self.log.end(provider, Outcome::Stopped);
                (None, Next::Return(true))
            }
            QueryEnd::Stopped { uncovered, reason } => {
                let outcome = match reason {
                    InterruptReason::ApprovalStop => Outcome::ApprovalStop,
                    InterruptReason::Stopped | InterruptReason::MaxTurns => Outcome::Interrupted,
                };
                self.log.end(provider, outcome);
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
                    self.call(move |db| db.clear_continuation(provider)).await?;
                }
                // A `/model` switch whose first turn failed: back to the previous model, the
                // error as the reply, and the turn again at once.
                let model_refused =
                    model_on_trial && self.revert_model(&message, uncovered.last()).await?;
                let failure = Failure {
                    retryable,
                    class: classification,
                    model_refused,
                };
                self.after_failure(failure, &message, uncovered, attempt)
            }
        })
    }

    /// What follows a failed attempt: [`retry_decision`] on its uncovered prompts.
    fn after_failure(
        &mut self,
        failure: Failure,
        message: &str,
        uncovered: Vec<Prepared>,
        attempt: &mut u32,
    ) -> (Option<NewMessageOut>, Next) {
        let provider = self.provider.name();
        let Some(merged) = merge(uncovered) else {
            self.log.end(provider, Outcome::Answered);
            return (None, Next::Return(false));
        };
        let row = self.ledger_row(
            None,
            UsageOutcome::Error,
            merged.row_ids.clone(),
            merged.series_id.clone(),
        );
        self.ledger.failed(row);
        let class = failure.class;
        match retry_decision(failure, *attempt, self.options.query_retries) {
            Decision::Retry {
                attempt: retry,
                backoff,
            } => {
                *attempt = retry;
                let error = message;
                let outcome = Outcome::Retrying {
                    attempt: retry,
                    backoff,
                    class,
                    error,
                };
                self.log.end(provider, outcome);
                (None, Next::Retry(Box::new(merged), backoff))
            }
            Decision::Report => {
                self.log.end(
                    provider,
                    Outcome::Failed {
                        class,
                        error: message,
                    },
                );
                let report = self.query_error_row(&merged, message, failure.retryable, class);
                (Some(report), Next::Return(false))
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

    /// After a failed turn with a model chosen by `/model`: the session goes back to the
    /// previous model and the error is the reply (to `prepared`'s target); true when a switch
    /// was reverted.
    async fn revert_model(&mut self, error: &str, prepared: Option<&Prepared>) -> Result<bool> {
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
}

/// The longest a rate limit's reset time is waited out by the runner's own retries; a later
/// reset goes to the host in the `query_error` row.
const MAX_RATE_LIMIT_WAIT: Duration = Duration::from_secs(60);

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

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(retryable: bool, class: ErrorClass) -> Failure {
        Failure {
            retryable,
            class,
            model_refused: false,
        }
    }

    fn retry(attempt: u32, secs: u64) -> Decision {
        Decision::Retry {
            attempt,
            backoff: Duration::from_secs(secs),
        }
    }

    #[test]
    fn a_retryable_error_is_retried_with_a_doubling_backoff_then_reported() {
        let api = failure(true, ErrorClass::Api);
        assert_eq!(retry_decision(api, 0, 2), retry(1, 1));
        assert_eq!(retry_decision(api, 1, 2), retry(2, 2));
        assert_eq!(retry_decision(api, 2, 2), Decision::Report);
        assert_eq!(retry_decision(api, 0, 0), Decision::Report);
        // The backoff stops doubling at 32 s.
        assert_eq!(retry_decision(api, 6, 10), retry(7, 32));
        assert_eq!(retry_decision(api, 9, 10), retry(10, 32));
    }

    #[test]
    fn an_error_that_is_not_retryable_is_reported_at_once() {
        assert_eq!(
            retry_decision(failure(false, ErrorClass::Auth), 0, 2),
            Decision::Report
        );
        assert_eq!(
            retry_decision(failure(false, ErrorClass::Api), 0, 2),
            Decision::Report
        );
    }

    #[test]
    fn a_turn_without_progress_goes_to_the_host_at_once() {
        assert_eq!(
            retry_decision(failure(true, ErrorClass::NoProgress), 0, 2),
            Decision::Report
        );
    }

    #[test]
    fn a_rate_limit_is_waited_out_only_when_its_reset_is_near() {
        let limited = |secs| {
            failure(
                true,
                ErrorClass::RateLimited {
                    retry_after_secs: Some(secs),
                },
            )
        };
        assert_eq!(retry_decision(limited(30), 0, 2), retry(1, 30));
        assert_eq!(retry_decision(limited(60), 1, 2), retry(2, 60));
        assert_eq!(retry_decision(limited(61), 0, 2), Decision::Report);
        let unknown = failure(
            true,
            ErrorClass::RateLimited {
                retry_after_secs: None,
            },
        );
        assert_eq!(retry_decision(unknown, 0, 2), retry(1, 1));
    }

    #[test]
    fn a_refused_model_switch_runs_again_at_once_without_counting() {
        let refused = Failure {
            retryable: false,
            class: ErrorClass::Api,
            model_refused: true,
        };
        assert_eq!(retry_decision(refused, 0, 2), retry(0, 0));
        assert_eq!(retry_decision(refused, 2, 2), retry(2, 0));
    }
}
