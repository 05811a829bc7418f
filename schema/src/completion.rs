//! Completing rows: replies and completions in one transaction, and the next occurrence of a
//! recurring task inserted by the transaction that completes the current one.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use rusqlite::{params, Transaction};
use serde_json::json;

use crate::cron::Schedule;
use crate::messages::{insert_in_tx, insert_out_tx, usable_rows};
use crate::rows::{InStatus, Inserted, MessageIn, NewMessageIn, NewMessageOut, OutKind};
use crate::sql::IN_COLUMNS;
use crate::tasks::SERIES_PAUSED_PREFIX;
use crate::time::format_ts;
use crate::{Error, Reads, SessionDb};

/// The completion's statement, built once: `prepare_cached` finds it by its text.
static COMPLETE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE messages_in AS m SET status = 'completed', status_changed = ?2
         WHERE m.status IN ('pending', 'processing') AND m.id IN (SELECT value FROM json_each(?1))
         RETURNING {IN_COLUMNS}"
    )
});

/// What [`SessionDb::complete_decided_at`] writes: the rows to complete, their replies and the
/// turn's ledger row.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The `messages_in` rows to complete.
    pub ids: Vec<String>,
    /// The replies written with the completion.
    pub replies: Vec<NewMessageOut>,
    /// The turn's ledger row, if any.
    pub usage: Option<crate::NewTurnUsage>,
}

impl SessionDb {
    /// Completes `ids` and writes `replies` in ONE transaction, so a crash can never leave a
    /// reply without its completion or the reverse. A completed occurrence of a recurring task
    /// gets its next occurrence inserted in the same transaction.
    pub fn complete(
        &self,
        ids: &[String],
        replies: &[NewMessageOut],
    ) -> Result<Vec<Inserted>, Error> {
        self.complete_at(ids, replies, Utc::now())
    }

    /// [`SessionDb::complete`] with an explicit "now" (next occurrences are computed from it).
    pub fn complete_at(
        &self,
        ids: &[String],
        replies: &[NewMessageOut],
        now: DateTime<Utc>,
    ) -> Result<Vec<Inserted>, Error> {
        self.complete_then(ids, replies, now, |_| Ok(()))
    }

    /// [`SessionDb::complete_at`] that also records the turn's `usage` in the ledger, and with
    /// `finish` ends the batch ([`SessionDb::complete_batch_at`]), all in ONE transaction.
    pub fn complete_with_usage_at(
        &self,
        ids: &[String],
        replies: &[NewMessageOut],
        usage: Option<&crate::NewTurnUsage>,
        now: DateTime<Utc>,
        finish: bool,
    ) -> Result<Vec<Inserted>, Error> {
        self.complete_replies_with_usage_at(ids, |_| Ok(replies.to_vec()), usage, now, finish)
    }

    /// [`SessionDb::complete_with_usage_at`] with the replies made by `replies` inside the
    /// writing transaction, from what it reads there (what was sent already, where a
    /// destination is): one transaction where a read before it took a second, and what the
    /// replies are decided on cannot change before they are written. Returns what was written.
    pub fn complete_replies_with_usage_at(
        &self,
        ids: &[String],
        replies: impl FnOnce(&Reads<'_>) -> Result<Vec<NewMessageOut>, Error>,
        usage: Option<&crate::NewTurnUsage>,
        now: DateTime<Utc>,
        finish: bool,
    ) -> Result<Vec<Inserted>, Error> {
        let ids_json = serde_json::to_string(ids)?;
        let timezone = self.timezone();
        self.write(|tx| {
            let replies = replies(&Reads::new(tx))?;
            let written = complete_tx(tx, &ids_json, &replies, now, timezone)?;
            if let Some(usage) = usage {
                crate::usage::insert_usage_tx(tx, usage, now)?;
            }
            if finish {
                crate::batch::finish_batch_tx(tx, None)?;
            }
            Ok(written)
        })
    }

    /// A completion whose rows, replies and ledger row are all decided by `decide` inside the
    /// writing transaction, from what it reads there; with `finish` the batch ends in it too
    /// ([`SessionDb::complete_batch_at`]). Returns what was written and `decide`'s own answer. A
    /// stopped turn decides this way which of its prompts a reply answered (docs/contract/db.md).
    pub fn complete_decided_at<T>(
        &self,
        decide: impl FnOnce(&Reads<'_>) -> Result<(Completion, T), Error>,
        now: DateTime<Utc>,
        finish: bool,
    ) -> Result<(Vec<Inserted>, T), Error> {
        let timezone = self.timezone();
        self.write(|tx| {
            let (completion, decided) = decide(&Reads::new(tx))?;
            let ids_json = serde_json::to_string(&completion.ids)?;
            let written = complete_tx(tx, &ids_json, &completion.replies, now, timezone)?;
            if let Some(usage) = &completion.usage {
                crate::usage::insert_usage_tx(tx, usage, now)?;
            }
            if finish {
                crate::batch::finish_batch_tx(tx, None)?;
            }
            Ok((written, decided))
        })
    }

    /// [`SessionDb::complete_at`], then `also` in the same transaction.
    pub(crate) fn complete_then(
        &self,
        ids: &[String],
        replies: &[NewMessageOut],
        now: DateTime<Utc>,
        also: impl FnOnce(&Transaction<'_>) -> Result<(), Error>,
    ) -> Result<Vec<Inserted>, Error> {
        let ids_json = serde_json::to_string(ids)?;
        let timezone = self.timezone();
        self.write(|tx| {
            let written = complete_tx(tx, &ids_json, replies, now, timezone)?;
            also(tx)?;
            Ok(written)
        })
    }
}

/// [`SessionDb::complete_at`] inside the caller's transaction (`ids_json`: the ids as a JSON
/// array, as `json_each` reads them).
fn complete_tx(
    tx: &Transaction<'_>,
    ids_json: &str,
    replies: &[NewMessageOut],
    now: DateTime<Utc>,
    timezone: Tz,
) -> Result<Vec<Inserted>, Error> {
    let mut written = Vec::with_capacity(replies.len());
    for reply in replies {
        written.push(insert_out_tx(tx, reply)?);
    }
    let completed = usable_rows(
        tx.prepare_cached(&COMPLETE_SQL)?
            .query_map(params![ids_json, format_ts(now)], MessageIn::read)?,
    )?;
    for row in completed.iter().filter(|row| row.recurrence.is_some()) {
        schedule_next_occurrence(tx, row, now, timezone)?;
    }
    Ok(written)
}

/// Inserts the next occurrence of the recurring task `row` (just completed) and clears the
/// completed row's recurrence, inside the completing transaction. A paused series gets its next
/// occurrence as `paused`; an invalid cron stops the series with a `system` row saying why; a
/// series that already has a pending or paused occurrence is not forked.
pub(crate) fn schedule_next_occurrence(
    tx: &Transaction<'_>,
    row: &MessageIn,
    now: DateTime<Utc>,
    timezone: Tz,
) -> Result<(), Error> {
    let Some(expr) = row.recurrence.as_deref() else {
        return Ok(());
    };
    let series_id = row.series_id.clone().unwrap_or_else(|| row.id.clone());
    tx.execute(
        "UPDATE messages_in SET recurrence = NULL WHERE id = ?1",
        [&row.id],
    )?;
    let already: bool = tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM messages_in WHERE series_id = ?1 AND id <> ?2
                        AND status IN ('pending', 'paused'))",
        params![series_id, row.id],
        |r| r.get(0),
    )?;
    if already {
        return Ok(());
    }
    let next = Schedule::parse(expr).and_then(|schedule| schedule.next_after(now, timezone));
    let next = match next {
        Ok(next) => next,
        Err(err) => {
            tracing::warn!(task = %series_id, %err, "recurring task stopped: invalid cron");
            let content = crate::content::out::system_action(
                "task_series_stopped",
                json!({ "taskId": series_id, "reason": err.to_string() }),
            );
            insert_out_tx(
                tx,
                &NewMessageOut::new(OutKind::System, row.routing.clone(), &content)
                    .replying_to(Some(row.id.clone())),
            )?;
            return Ok(());
        }
    };
    let paused: bool = tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM session_state WHERE key = ?1)",
        [format!("{SERIES_PAUSED_PREFIX}{series_id}")],
        |r| r.get(0),
    )?;
    let mut next_row = NewMessageIn::new(row.kind.clone(), row.content.clone());
    next_row.status = if paused {
        InStatus::Paused
    } else {
        InStatus::Pending
    };
    next_row.process_after = Some(format_ts(next));
    next_row.recurrence = Some(expr.to_owned());
    next_row.series_id = Some(series_id);
    next_row.trigger = row.trigger;
    next_row.routing = row.routing.clone();
    next_row.source_session_id = row.source_session_id.clone();
    insert_in_tx(tx, &next_row)?;
    Ok(())
}
