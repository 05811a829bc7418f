//! `sweep`: the host's retry policy over the queue (stale claims back to `pending` with backoff,
//! exhausted ones `failed`), reporting what is due afterwards so the host knows whether to wake
//! the container.

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use schema::time::format_ts;
use schema::{SessionDb, SweepPolicy, SweepReport};
use serde::{Deserialize, Serialize};

use crate::timefmt::until;

/// A `processing` row unchanged this long is stale (`nanoclaw sweep --stale-after`'s default).
pub const DEFAULT_STALE_AFTER_SECS: u64 = 600;

/// What a sweep changed and what is due after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepOutcome {
    /// Rows reset and failed.
    #[serde(flatten)]
    pub report: SweepReport,
    /// Pending rows due now, after the sweep.
    pub due: i64,
    /// Earliest due time of a pending row after the sweep (RFC 3339 UTC, not before `now`).
    pub next_due: Option<String>,
}

/// Runs [`SessionDb::sweep`] with `policy` at `now`.
pub fn sweep(db: &SessionDb, policy: &SweepPolicy, now: DateTime<Utc>) -> Result<SweepOutcome> {
    let report = db.sweep(policy, now).context("sweeping messages_in")?;
    let due = db.counts(now).context("counting messages_in")?.due;
    let next_due = db
        .next_due()
        .context("reading the next due time")?
        .map(|at| format_ts(at.max(now)));
    Ok(SweepOutcome {
        report,
        due,
        next_due,
    })
}

impl SweepOutcome {
    /// Readable lines.
    pub fn render(&self, now: DateTime<Utc>) -> String {
        let mut out = String::new();
        let list = |ids: &[String]| {
            if ids.is_empty() {
                String::new()
            } else {
                format!(": {}", ids.join(", "))
            }
        };
        out.push_str(&format!(
            "reset  {} stale processing row(s) to pending{}\n",
            self.report.reset.len(),
            list(&self.report.reset)
        ));
        out.push_str(&format!(
            "failed {} row(s) out of tries{}\n",
            self.report.failed.len(),
            list(&self.report.failed)
        ));
        let next = match self
            .next_due
            .as_deref()
            .and_then(|at| schema::time::parse_ts(at).ok().map(|p| (at, p)))
        {
            Some((at, parsed)) => format!("next due {at} ({})", until(parsed, now)),
            None => "nothing pending".to_owned(),
        };
        out.push_str(&format!("due now {}; {next}\n", self.due));
        out
    }
}
