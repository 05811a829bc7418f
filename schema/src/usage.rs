//! The usage ledger (`turn_usage`): one row per ended turn, written in the transaction that
//! writes the turn's replies and completion (or its `query_error` row), so a crash never
//! records a turn twice or loses one (docs/contract/db.md#turn_usage).

use chrono::{DateTime, Utc};
use rusqlite::{params, Transaction};

use crate::time::format_ts;
use crate::Error;

/// How a turn recorded in the ledger ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageOutcome {
    /// It answered (a `Result`).
    Result,
    /// It failed (an `Error` that ended it).
    Error,
    /// It was stopped (`/stop`, an interrupt, `maxTurnsPerQuery`, shutdown).
    Aborted,
}

impl UsageOutcome {
    /// The name stored in `turn_usage.outcome`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Result => "result",
            Self::Error => "error",
            Self::Aborted => "aborted",
        }
    }
}

/// One ledger row to write. Token and cost figures the CLI did not report are `None` (NULL),
/// never 0.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTurnUsage {
    /// `claude`, `codex`, `opencode` or `mock`.
    pub provider: String,
    /// The model that answered, when known.
    pub model: Option<String>,
    /// Input tokens (cache reads and writes not included).
    pub input_tokens: Option<u64>,
    /// Output tokens.
    pub output_tokens: Option<u64>,
    /// Tokens read from the prompt cache.
    pub cache_read_tokens: Option<u64>,
    /// Tokens written to the prompt cache.
    pub cache_write_tokens: Option<u64>,
    /// Reasoning tokens.
    pub reasoning_tokens: Option<u64>,
    /// Cost in US dollars, when the CLI computed one.
    pub cost_usd: Option<f64>,
    /// Model requests (steps) of the turn.
    pub requests: Option<u64>,
    /// How long the turn took.
    pub duration_ms: Option<u64>,
    /// How it ended.
    pub outcome: UsageOutcome,
    /// The `messages_in` ids the turn answered (or tried to).
    pub message_ids: Vec<String>,
    /// The task series the turn ran for, when it ran one.
    pub series_id: Option<String>,
}

/// Writes `usage` inside the caller's transaction.
pub(crate) fn insert_usage_tx(
    tx: &Transaction<'_>,
    usage: &NewTurnUsage,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    // SQLite integers are i64; a figure beyond that is not a real count, it is stored as NULL
    // rather than wrapped.
    let int = |v: Option<u64>| v.and_then(|v| i64::try_from(v).ok());
    tx.prepare_cached(
        "INSERT INTO turn_usage (created_at, provider, model, input_tokens, output_tokens,
           cache_read_tokens, cache_write_tokens, reasoning_tokens, cost_usd, requests,
           duration_ms, outcome, message_ids, series_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    )?
    .execute(params![
        format_ts(now),
        usage.provider,
        usage.model,
        int(usage.input_tokens),
        int(usage.output_tokens),
        int(usage.cache_read_tokens),
        int(usage.cache_write_tokens),
        int(usage.reasoning_tokens),
        usage.cost_usd.filter(|c| c.is_finite()),
        int(usage.requests),
        int(usage.duration_ms),
        usage.outcome.as_str(),
        serde_json::to_string(&usage.message_ids)?,
        usage.series_id,
    ])?;
    Ok(())
}

impl crate::SessionDb {
    /// Records a turn that wrote nothing else (a turn stopped before it answered).
    pub fn record_usage(&self, usage: &NewTurnUsage, now: DateTime<Utc>) -> Result<(), Error> {
        self.write(|tx| insert_usage_tx(tx, usage, now))
    }
}
