//! The rows of the usage ledger (`turn_usage`, docs/contract/db.md#turn_usage): one per ended
//! turn, written in the transaction of what the turn wrote (a result's replies and completion,
//! a failure's `query_error` row and batch end, a stopped turn's completion). Every path builds
//! its row here, so the figures, the duration and the rows answered mean the same everywhere.
//! A turn whose CLI reported no usage still gets a row, with NULL figures: the ledger counts
//! turns, and "unknown" stays apart from 0 (docs/decisions/loop.md#D-LOOP-05).

use std::time::Duration;

use provider::Usage;
use schema::{NewTurnUsage, UsageOutcome};
use tokio::time::Instant;

/// The running turn's clock and the usage of the error that ended it.
#[derive(Debug)]
pub(crate) struct TurnLedger {
    /// When the turn started: the query's start, or the previous result of the same query
    /// (each result ends a turn of the CLI).
    started: Instant,
    /// The usage of the `Error` that ended the turn, until its row is written.
    ending: Option<Usage>,
    /// A failed turn's row, written with the batch's end.
    failed: Option<NewTurnUsage>,
}

impl Default for TurnLedger {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            ending: None,
            failed: None,
        }
    }
}

impl TurnLedger {
    /// A query starts: its first turn's clock.
    pub(crate) fn start(&mut self) {
        *self = Self::default();
    }

    /// The turn ended with an error that reported `usage`.
    pub(crate) fn ended_with(&mut self, usage: Option<Usage>) {
        self.ending = usage;
    }

    /// The row of the turn that ends now, answering `message_ids`; the next turn's clock starts.
    /// `usage` is the turn's own (a result's, an interruption's); without it, the ending error's.
    pub(crate) fn row(
        &mut self,
        provider: &str,
        usage: Option<&Usage>,
        outcome: UsageOutcome,
        message_ids: Vec<String>,
        series_id: Option<String>,
    ) -> NewTurnUsage {
        let ending = self.ending.take();
        let now = Instant::now();
        let duration = now.saturating_duration_since(self.started);
        self.started = now;
        turn_usage(
            provider,
            usage.or(ending.as_ref()),
            outcome,
            duration,
            message_ids,
            series_id,
        )
    }

    /// Keeps a failed turn's row until the batch's end writes it.
    pub(crate) fn failed(&mut self, row: NewTurnUsage) {
        self.failed = Some(row);
    }

    /// The failed turn's row, once.
    pub(crate) fn take_failed(&mut self) -> Option<NewTurnUsage> {
        self.failed.take()
    }
}

/// The ledger row of one turn of `provider`.
pub(crate) fn turn_usage(
    provider: &str,
    usage: Option<&Usage>,
    outcome: UsageOutcome,
    duration: Duration,
    message_ids: Vec<String>,
    series_id: Option<String>,
) -> NewTurnUsage {
    let usage = usage.cloned().unwrap_or_default();
    NewTurnUsage {
        provider: provider.to_owned(),
        model: usage.model,
        input_tokens: usage.input_tokens,
        output_tokens: usage.output_tokens,
        cache_read_tokens: usage.cache_read_tokens,
        cache_write_tokens: usage.cache_write_tokens,
        reasoning_tokens: usage.reasoning_tokens,
        cost_usd: usage.cost_usd,
        requests: usage.requests,
        duration_ms: Some(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)),
        outcome,
        message_ids,
        series_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_row_carries_the_figures_the_duration_and_the_rows() {
        let mut ledger = TurnLedger::default();
        ledger.start();
        tokio::time::advance(Duration::from_millis(1500)).await;
        let usage = Usage {
            input_tokens: Some(10),
            cost_usd: Some(0.5),
            model: Some("m".into()),
            ..Usage::default()
        };
        let row = ledger.row(
            "mock",
            Some(&usage),
            UsageOutcome::Result,
            vec!["a".into()],
            Some("s1".into()),
        );
        assert_eq!(
            (row.input_tokens, row.output_tokens, row.cost_usd),
            (Some(10), None, Some(0.5))
        );
        assert_eq!(row.model.as_deref(), Some("m"));
        assert_eq!(row.duration_ms, Some(1500));
        assert_eq!(row.series_id.as_deref(), Some("s1"));
        // The next turn of the query counts from this result; an error's usage fills a row
        // that has none of its own.
        tokio::time::advance(Duration::from_millis(200)).await;
        ledger.ended_with(Some(Usage {
            output_tokens: Some(3),
            ..Usage::default()
        }));
        let failed = ledger.row("mock", None, UsageOutcome::Error, vec!["b".into()], None);
        assert_eq!(failed.duration_ms, Some(200));
        assert_eq!(failed.output_tokens, Some(3));
        assert_eq!(failed.outcome, UsageOutcome::Error);
        // Nothing reported: a row all the same, its figures unknown.
        let silent = ledger.row("mock", None, UsageOutcome::Aborted, vec![], None);
        assert_eq!((silent.input_tokens, silent.cost_usd), (None, None));
    }
}
