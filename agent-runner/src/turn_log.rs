//! The operator's line per turn (docs/logs.md): one `turn ended` line when a query attempt ends,
//! and the `turn` span that gives every line logged during it the message seqs it concerns.

use std::time::Duration;

use provider::ErrorClass;
use schema::NewTurnUsage;
use tokio::time::Instant;
use tracing::{Level, Span};

/// How a turn (one query attempt) ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome<'a> {
    /// Every prompt of the turn was answered.
    Answered,
    /// The runner is stopping; the rows go back to `pending` at the next start.
    Stopped,
    /// The turn was interrupted (`/stop`, the host's interrupt, the step limit): what the model
    /// saw is answered, the rest runs next.
    Interrupted,
    /// An approval-stop tool returned its result: the turn ended there, answered by the tool
    /// (issue 16); the session goes on with the next message.
    ApprovalStop,
    /// Failed; the runner runs the unanswered prompts again after `backoff`.
    Retrying {
        attempt: u32,
        backoff: Duration,
        class: ErrorClass,
        error: &'a str,
    },
    /// Failed; the unanswered rows are left `processing` for the host's sweep (`query_error`).
    Failed { class: ErrorClass, error: &'a str },
}

impl Outcome<'_> {
    /// The `outcome` field.
    fn name(&self) -> &'static str {
        match self {
            Outcome::Answered => "answered",
            Outcome::Stopped => "stopped",
            Outcome::Interrupted => "interrupted",
            Outcome::ApprovalStop => "approval_stop",
            Outcome::Retrying { .. } => "retrying",
            Outcome::Failed { .. } => "failed",
        }
    }
}

/// The running turn: its span, its seqs and what it answered so far.
#[derive(Debug)]
pub(crate) struct TurnLog {
    span: Span,
    started: Instant,
    /// Seqs of every row the turn carries (first prompt and pushed follow-ups).
    seqs: Vec<i64>,
    /// Seqs of the rows a result covered.
    answered: Vec<i64>,
    /// Input and output tokens of the turn's ledger rows, where reported.
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

impl Default for TurnLog {
    fn default() -> Self {
        Self {
            span: Span::none(),
            started: Instant::now(),
            seqs: Vec::new(),
            answered: Vec::new(),
            input_tokens: None,
            output_tokens: None,
        }
    }
}

impl TurnLog {
    /// Starts a turn on the rows `seqs`; the returned span is to be entered around the query.
    pub(crate) fn start(&mut self, seqs: &[i64]) -> Span {
        // ERROR level only so that the span exists whatever RUST_LOG keeps: its fields must
        // reach every line of the turn, warnings and errors included.
        self.span = tracing::error_span!("turn", seqs = ?seqs);
        self.started = Instant::now();
        self.seqs = seqs.to_vec();
        self.answered.clear();
        (self.input_tokens, self.output_tokens) = (None, None);
        self.span.clone()
    }

    /// Rows pushed into the running turn: the lines that follow carry their seqs too.
    pub(crate) fn pushed(&mut self, seqs: &[i64]) {
        self.seqs.extend_from_slice(seqs);
        self.span.record("seqs", tracing::field::debug(&self.seqs));
    }

    /// Rows a result covered (their replies are written).
    pub(crate) fn answered(&mut self, seqs: impl IntoIterator<Item = i64>) {
        self.answered.extend(seqs);
    }

    /// A ledger row of the turn: its tokens go on the `turn ended` line (summed over the
    /// turn's results; absent when no row reported them).
    pub(crate) fn used(&mut self, row: Option<&NewTurnUsage>) {
        let Some(row) = row else { return };
        let add = |total: Option<u64>, more: Option<u64>| match (total, more) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            (a, b) => a.or(b),
        };
        self.input_tokens = add(self.input_tokens, row.input_tokens);
        self.output_tokens = add(self.output_tokens, row.output_tokens);
    }

    /// The `turn ended` line: INFO when answered or stopped, WARN when retried, ERROR when the
    /// rows go to the host's sweep, with the error's class and text (the one line of that error).
    pub(crate) fn end(&mut self, provider: &str, outcome: Outcome<'_>) {
        let duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let answered = std::mem::take(&mut self.answered);
        let (input_tokens, output_tokens) = (self.input_tokens.take(), self.output_tokens.take());
        let name = outcome.name();
        // Fields of a failure only; `None` is left out of the line.
        let (level, class, error, attempt, retry_in_ms) = match outcome {
            Outcome::Answered | Outcome::Stopped | Outcome::Interrupted | Outcome::ApprovalStop => {
                (Level::INFO, None, None, None, None)
            }
            Outcome::Retrying {
                attempt,
                backoff,
                class,
                error,
            } => (
                Level::WARN,
                Some(class.name()),
                Some(error),
                Some(attempt),
                Some(u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX)),
            ),
            Outcome::Failed { class, error } => {
                (Level::ERROR, Some(class.name()), Some(error), None, None)
            }
        };
        let in_turn = self.span.enter();
        // One field list for the three levels (a tracing level must be a constant).
        macro_rules! turn_ended {
            ($level:expr) => {
                tracing::event!(
                    $level,
                    provider,
                    outcome = name,
                    answered = ?answered,
                    duration_ms,
                    input_tokens,
                    output_tokens,
                    class,
                    error,
                    attempt,
                    retry_in_ms,
                    "turn ended"
                )
            };
        }
        match level {
            Level::ERROR => turn_ended!(Level::ERROR),
            Level::WARN => turn_ended!(Level::WARN),
            _ => turn_ended!(Level::INFO),
        }
        drop(in_turn);
        // Closed now, after the turn's replies are written, not when the next turn starts:
        // that is on the way from a message's claim to its reply.
        self.span = Span::none();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tracing_subscriber::layer::{Context, SubscriberExt};
    use tracing_subscriber::Layer;

    use super::*;

    /// Counts the spans closed.
    struct Closes(Arc<AtomicUsize>);

    impl<S: tracing::Subscriber> Layer<S> for Closes {
        fn on_close(&self, _id: tracing::Id, _ctx: Context<'_, S>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_turns_span_is_closed_when_the_turn_ends_not_when_the_next_starts() {
        let closed = Arc::new(AtomicUsize::new(0));
        let subscriber = tracing_subscriber::registry().with(Closes(Arc::clone(&closed)));
        tracing::subscriber::with_default(subscriber, || {
            let mut turn = TurnLog::default();
            drop(turn.start(&[2, 4]));
            assert_eq!(
                closed.load(Ordering::SeqCst),
                0,
                "the turn holds its span while it runs"
            );
            turn.end("mock", Outcome::Answered);
            // Closing it is not left to the next turn's start, which is on the way from that
            // turn's claim to its reply.
            assert_eq!(
                closed.load(Ordering::SeqCst),
                1,
                "the span outlived its turn"
            );
        });
    }
}
