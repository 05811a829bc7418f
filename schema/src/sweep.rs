//! The host's sweep: retry policy for rows a runner left `processing`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::{params, OptionalExtension, Transaction};

use crate::rows::{lenient_int, lossy_text, CurrentBatch};
use crate::time::format_ts;
use crate::{Error, SessionDb};

/// The host's retry policy for [`SessionDb::sweep`].
#[derive(Debug, Clone)]
pub struct SweepPolicy {
    /// A `processing` row unchanged for this long is stale.
    pub stale_after: Duration,
    /// After this many tries a stale row becomes `failed`.
    pub max_tries: i64,
    /// Delay before retry `n` is `backoff * 2^(n-1)`.
    pub backoff: Duration,
}

impl Default for SweepPolicy {
    fn default() -> Self {
        Self {
            stale_after: Duration::from_secs(600),
            max_tries: 5,
            backoff: Duration::from_secs(30),
        }
    }
}

/// What a sweep changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SweepReport {
    /// Rows back to `pending` (with a backoff `process_after`).
    pub reset: Vec<String>,
    /// Rows given up as `failed`.
    pub failed: Vec<String>,
}

impl SessionDb {
    /// The host's sweep: stale `processing` rows back to `pending` with exponential backoff, or
    /// `failed` after `max_tries`. Rows of the batch a live runner is working on are left alone
    /// (a heartbeat fresher than `stale_after` and status busy or waiting_user).
    pub fn sweep(&self, policy: &SweepPolicy, now: DateTime<Utc>) -> Result<SweepReport, Error> {
        let stale_before = now - chrono::Duration::from_std(policy.stale_after).unwrap_or_default();
        self.write(|tx| {
            let active: Vec<String> = active_batch_ids(tx, stale_before)?;
            // Read leniently and changed by rowid: a row with a BLOB id or TEXT tries must not
            // stop the sweep.
            let mut stmt = tx.prepare(
                "SELECT rowid, id, tries FROM messages_in WHERE status = 'processing'
                 AND (status_changed IS NULL OR ts_millis(status_changed) IS NULL
                      OR ts_millis(status_changed) <= ts_millis(?1))",
            )?;
            let stale: Vec<(i64, String, i64)> = stmt
                .query_map([format_ts(stale_before)], |r| {
                    Ok((
                        r.get(0)?,
                        lossy_text(r.get_ref(1)?).unwrap_or_default(),
                        lenient_int(r.get_ref(2)?).unwrap_or(0),
                    ))
                })?
                .collect::<Result<_, _>>()?;
            let mut report = SweepReport::default();
            for (rowid, id, tries) in stale.into_iter().filter(|(_, id, _)| !active.contains(id)) {
                if tries >= policy.max_tries {
                    tx.execute(
                        "UPDATE messages_in SET status = 'failed', status_changed = ?2 WHERE rowid = ?1",
                        params![rowid, format_ts(now)],
                    )?;
                    report.failed.push(id);
                } else {
                    let exponent = u32::try_from(tries.clamp(1, 16) - 1).unwrap_or(0);
                    let delay = policy.backoff.saturating_mul(2u32.saturating_pow(exponent));
                    let retry_at = now + chrono::Duration::from_std(delay).unwrap_or_default();
                    tx.execute(
                        "UPDATE messages_in SET status = 'pending', status_changed = ?2, process_after = ?3
                         WHERE rowid = ?1",
                        params![rowid, format_ts(now), format_ts(retry_at)],
                    )?;
                    report.reset.push(id);
                }
            }
            Ok(report)
        })
    }
}

/// Ids of the batch a live runner holds: empty unless the runner is busy or waiting with a
/// heartbeat newer than `stale_before`. One read of the runner's row for both; a batch of any
/// storage type reads as text, and one that does not parse holds nothing.
fn active_batch_ids(
    tx: &Transaction<'_>,
    stale_before: DateTime<Utc>,
) -> Result<Vec<String>, Error> {
    let row = tx
        .query_row(
            "SELECT status IN ('busy', 'waiting_user') AND ts_millis(heartbeat_at) > ts_millis(?1),
               current_batch
             FROM runner_state WHERE id = 1",
            [format_ts(stale_before)],
            |r| Ok((r.get::<_, Option<bool>>(0)?, r.get_ref(1).map(lossy_text)?)),
        )
        .optional()?;
    let Some((Some(true), Some(batch))) = row else {
        return Ok(Vec::new());
    };
    Ok(serde_json::from_str::<CurrentBatch>(&batch)
        .map(|batch| batch.ids)
        .unwrap_or_default())
}
