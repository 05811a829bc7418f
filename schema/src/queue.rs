//! The runner's queue: which pending rows a poll may take, claiming them, putting them back,
//! taking unusable rows out, and when the next row falls due.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use rusqlite::{params, OptionalExtension, Transaction};
use serde_json::json;

use crate::batch::start_batch_tx;
use crate::messages::{insert_out_tx, split_rows};
use crate::rows::{
    lossy_text, CurrentBatch, InRow, InStatus, MessageIn, NewMessageOut, OutKind, UnusableRow,
};
use crate::sql::{with_status, IN_COLUMNS};
use crate::time::{format_ts, now_ts, parse_ts};
use crate::{Error, Reads, SessionDb};

/// The rows a poll may hand to the agent, after every gate of docs/contract/db.md#the-poll.
#[derive(Debug, Clone, Default)]
pub struct Eligible {
    /// Up to `limit` rows, in seq order.
    pub rows: Vec<MessageIn>,
    /// Whether they may wake the agent: one of them has `trigger=1`, or a triggering row is
    /// eligible beyond the limit (then these older context rows go first).
    pub wakes: bool,
}

/// Counts for `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueCounts {
    /// `pending` rows.
    pub pending: i64,
    /// `pending` rows due now.
    pub due: i64,
    /// `processing` rows.
    pub processing: i64,
    /// `paused` rows.
    pub paused: i64,
    /// `failed` rows.
    pub failed: i64,
}

/// The predicate that makes a pending row eligible (docs/contract/db.md#the-poll), with `?1` = now in Unix
/// milliseconds (converted once per poll, not once per row) and `?2` = first poll. Times compare through `ts_millis()`, flags read through `flag_of()` (see
/// [`register_functions`]). A row whose `process_after` cannot be read is selected too: the poll
/// takes it out of the queue ([`SessionDb::eligible`]) rather than run it on a guess or leave it
/// pending unseen.
const ELIGIBLE_WHERE: &str = "m.status = 'pending'
  AND (m.process_after IS NULL OR ts_millis(m.process_after) IS NULL
       OR ts_millis(m.process_after) <= ?1)
  AND (NOT flag_of(m.on_wake, 0) OR ?2)
  AND NOT (json_valid(m.content)
       AND ((m.kind = 'system' AND json_extract(m.content, '$.type') = 'question_response')
            OR (m.kind = 'chat' AND json_extract(m.content, '$.selectedOption') IS NOT NULL))
       AND EXISTS (SELECT 1 FROM session_state s
                   WHERE s.key = 'question:' || json_extract(m.content, '$.questionId')
                     AND (json_extract(s.value, '$.deadline') IS NULL
                          OR ts_millis(json_extract(s.value, '$.deadline')) > ?1)))";

/// The poll's statements, built once: `prepare_cached` finds them by their text, and a text
/// formatted per poll would be an allocation and a copy on every wake-up.
pub(crate) static ELIGIBLE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT {IN_COLUMNS} FROM messages_in m WHERE {ELIGIBLE_WHERE} ORDER BY m.seq LIMIT ?3")
});
/// Whether a triggering row is eligible beyond the poll's limit (see [`Eligible::wakes`]).
static TRIGGER_BEYOND_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {IN_COLUMNS} FROM messages_in m
         WHERE {ELIGIBLE_WHERE} AND flag_of(m.trigger, 1)
         ORDER BY m.seq LIMIT 1"
    )
});
/// The claim's statement, built once (see [`ELIGIBLE_SQL`]).
static CLAIM_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE messages_in AS m SET status = 'processing', tries = tries + 1, status_changed = ?2
         WHERE m.status = 'pending' AND m.id IN (SELECT value FROM json_each(?1))
         RETURNING {IN_COLUMNS}"
    )
});

/// What a supervisor reads to decide whether a session needs a runner (`nanoclaw fleet`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Work {
    /// The oldest due time of work a runner would take now: a row a first poll would hand to
    /// the agent and that wakes it (`trigger`), or a `processing` row (a runner died holding
    /// it). `None` when there is none.
    pub due_since: Option<DateTime<Utc>>,
    /// The next instant something may become due: the earliest later `process_after` of a
    /// pending row, or the deadline of an open question (its held-back answer is released then).
    pub next_at: Option<DateTime<Utc>>,
    /// The latest deadline of an open question (`ask_user_question` waits until then).
    pub question_deadline: Option<DateTime<Utc>>,
}

/// The oldest due time of a row that wakes the agent on a first poll (see [`ELIGIBLE_WHERE`]).
static WORK_DUE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT min(COALESCE(ts_millis(m.process_after), ts_millis(m.timestamp), 0))
         FROM messages_in m WHERE {ELIGIBLE_WHERE} AND flag_of(m.trigger, 1)"
    )
});

/// What [`SessionDb::claim_starting`] returns: the claimed rows, and the batch it started
/// with what its `start` read, if it started one.
pub type ClaimStarted<T> = (Vec<MessageIn>, Option<(CurrentBatch, T)>);

impl SessionDb {
    /// The rows a poll at `now` may take (docs/contract/db.md#the-poll): pending, due, `on_wake` only on the first
    /// poll, not an answer to a question still open; ordered by seq; `limit` applied last.
    ///
    /// A row met on the way that the queue cannot use (an [`UnusableRow`]: id not text, seq not
    /// an integer, or a `process_after` that is no readable time) is taken out of the queue
    /// first, so it never blocks the rows behind it and never runs on a guessed time: see
    /// `quarantine_tx`.
    pub fn eligible(
        &self,
        now: DateTime<Utc>,
        first_poll: bool,
        limit: usize,
    ) -> Result<Eligible, Error> {
        let now = now.timestamp_millis();
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        loop {
            let mut unusable = Vec::new();
            let (rows, wakes) = {
                let conn = self.conn()?;
                let mut stmt = conn.prepare_cached(&ELIGIBLE_SQL)?;
                let read = stmt.query_map(params![now, first_poll, limit], MessageIn::read)?;
                let rows = queue_rows(read, &mut unusable)?;
                // Context rows only: they go first when a triggering row is eligible further on.
                let wakes = rows.iter().any(|row| row.trigger)
                    || (!rows.is_empty() && {
                        let mut stmt = conn.prepare_cached(&TRIGGER_BEYOND_SQL)?;
                        let read = stmt.query_map(params![now, first_poll], MessageIn::read)?;
                        !queue_rows(read, &mut unusable)?.is_empty()
                    });
                (rows, wakes)
            };
            // Taking rows out may leave room under the limit for rows behind them: read again.
            // Each round takes at least one row out of `pending`, so this ends.
            if unusable.is_empty() || self.write(|tx| quarantine_tx(tx, &unusable))? == 0 {
                return Ok(if rows.is_empty() {
                    Eligible::default()
                } else {
                    Eligible { rows, wakes }
                });
            }
        }
    }

    /// Claims rows still `pending`: `processing`, `tries+1`, `status_changed=now`. Returns the
    /// claimed rows in seq order (rows someone else changed meanwhile are left out).
    pub fn claim(&self, ids: &[String]) -> Result<Vec<MessageIn>, Error> {
        Ok(self
            .claim_starting(ids, |_, _| Ok(None::<(CurrentBatch, ())>))?
            .0)
    }

    /// [`SessionDb::claim`], and when `start` makes a batch of the claimed rows, starts it in
    /// the same transaction ([`SessionDb::start_batch`]: `current_batch` and `busy`), with what
    /// `start` also read there (through `Reads`, in the claim's snapshot). The runner passes a
    /// `start` that returns a batch only when the claimed rows are known to go to the agent as
    /// they are (no pre-agent script, no command), so a message is claimed, its query started
    /// and what the query starts from read by one transaction. Returns the rows and the batch
    /// started with what was read, if any.
    pub fn claim_starting<T>(
        &self,
        ids: &[String],
        start: impl FnOnce(&[MessageIn], &Reads<'_>) -> Result<Option<(CurrentBatch, T)>, Error>,
    ) -> Result<ClaimStarted<T>, Error> {
        if ids.is_empty() {
            return Ok((Vec::new(), None));
        }
        let ids_json = serde_json::to_string(ids)?;
        self.write(|tx| {
            let rows = claim_tx(tx, &ids_json)?;
            let started = start(&rows, &Reads::new(tx))?;
            if let Some((batch, _)) = &started {
                start_batch_tx(tx, batch)?;
            }
            Ok((rows, started))
        })
    }

    /// Puts `processing` rows back to `pending` (startup recovery of the single runner).
    pub fn reset_processing(&self) -> Result<Vec<String>, Error> {
        self.write(|tx| {
            let mut stmt = tx.prepare(
                "UPDATE messages_in SET status = 'pending', status_changed = ?1
                 WHERE status = 'processing' RETURNING id",
            )?;
            let ids = stmt
                .query_map([now_ts()], |r| r.get_ref(0).map(lossy_text))?
                .filter_map(Result::transpose)
                .collect::<Result<_, _>>()?;
            Ok(ids)
        })
    }

    /// Puts the given `processing` rows back to `pending` without counting a try.
    pub fn release(&self, ids: &[String]) -> Result<usize, Error> {
        let ids_json = serde_json::to_string(ids)?;
        self.write(|tx| {
            Ok(tx.execute(
                "UPDATE messages_in SET status = 'pending', status_changed = ?2,
                   tries = MAX(tries - 1, 0)
                 WHERE status = 'processing' AND id IN (SELECT value FROM json_each(?1))",
                params![ids_json, now_ts()],
            )?)
        })
    }

    /// Queue counts at `now`.
    pub fn counts(&self, now: DateTime<Utc>) -> Result<QueueCounts, Error> {
        let conn = self.conn()?;
        let count = |status| -> Result<i64, Error> { Ok(count_with_status(&conn, status)?) };
        // An unreadable process_after counts as due: the runner's next poll must see the row to
        // take it out of the queue (`eligible`).
        let due = conn.query_row(
            "SELECT COUNT(*) FROM messages_in WHERE status = 'pending'
             AND (process_after IS NULL OR ts_millis(process_after) IS NULL
                  OR ts_millis(process_after) <= ts_millis(?1))",
            [format_ts(now)],
            |r| r.get(0),
        )?;
        Ok(QueueCounts {
            pending: count(InStatus::Pending)?,
            due,
            processing: count(InStatus::Processing)?,
            paused: count(InStatus::Paused)?,
            failed: count(InStatus::Failed)?,
        })
    }

    /// The earliest instant a pending row becomes due: `None` when nothing is pending, `now`
    /// (or earlier) when something is due already. A host uses it to wake a sleeping container.
    /// A row without a readable `process_after` is due at once (the runner's poll takes a row
    /// with an unreadable one out of the queue, see [`SessionDb::eligible`]).
    pub fn next_due(&self) -> Result<Option<DateTime<Utc>>, Error> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached(
            "SELECT ts_millis(process_after) FROM messages_in WHERE status = 'pending'
             ORDER BY COALESCE(ts_millis(process_after), -9223372036854775808) LIMIT 1",
        )?;
        let first: Option<Option<i64>> = stmt.query_row([], |r| r.get(0)).optional()?;
        Ok(first.map(|millis| {
            millis
                .and_then(DateTime::<Utc>::from_timestamp_millis)
                .unwrap_or(DateTime::<Utc>::MIN_UTC)
        }))
    }

    /// The earliest `process_after` of a pending row that is later than `after`: when a runner
    /// that polled at `after` must poll again because a row falls due. Rows due by `after` are
    /// left out (that poll saw them; they wait for something other than time), and so are rows
    /// without a readable time.
    pub fn next_due_after(&self, after: DateTime<Utc>) -> Result<Option<DateTime<Utc>>, Error> {
        let conn = self.conn()?;
        // An aggregate, not `ORDER BY at LIMIT 1`: sorting a computed value opened a temporary
        // B-tree on every idle poll.
        let mut stmt = conn.prepare_cached(
            "SELECT min(at) FROM (SELECT ts_millis(process_after) AS at FROM messages_in
                                  WHERE status = 'pending')
             WHERE at > ?1",
        )?;
        let first: Option<i64> = stmt.query_row([after.timestamp_millis()], |r| r.get(0))?;
        Ok(first.and_then(DateTime::<Utc>::from_timestamp_millis))
    }
}

impl SessionDb {
    /// What is due at `now` for a supervisor ([`Work`]).
    pub fn work(&self, now: DateTime<Utc>) -> Result<Work, Error> {
        let conn = self.conn()?;
        Ok(work_on(&conn, now)?)
    }
}

/// [`SessionDb::work`] and the runner row of the DB at `path`, on a read-only connection of
/// its own that is closed after the read: no pool, no migration, no write (a supervisor of many
/// sessions reads each one when its `-wal` file changes, and must not wake itself by a write).
pub fn read_work(
    path: &std::path::Path,
    now: DateTime<Utc>,
    lock_wait: std::time::Duration,
) -> Result<(Work, Option<crate::RunnerState>), Error> {
    // Even a read-only connection maps `-shm` and takes its locks.
    fsguard::refuse_shared_filesystem(path)?;
    let conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(lock_wait)?;
    crate::db::register_functions(&conn)?;
    let work = work_on(&conn, now)?;
    let runner = crate::runner_state::read_runner_state(&conn)?;
    Ok((work, runner))
}

/// The queries of [`SessionDb::work`] on `conn`.
fn work_on(conn: &rusqlite::Connection, now: DateTime<Utc>) -> rusqlite::Result<Work> {
    let now_ms = now.timestamp_millis();
    let millis = |ms: Option<i64>| ms.and_then(DateTime::<Utc>::from_timestamp_millis);
    let due: Option<i64> = conn
        .prepare_cached(&WORK_DUE_SQL)?
        .query_row(params![now_ms, true], |r| r.get(0))?;
    let processing: Option<i64> = conn
        .prepare_cached(
            "SELECT min(COALESCE(ts_millis(status_changed), 0)) FROM messages_in
             WHERE status = 'processing'",
        )?
        .query_row([], |r| r.get(0))?;
    let due_since = match (due, processing) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let deadline: Option<i64> = conn
        .prepare_cached(
            "SELECT max(ts_millis(json_extract(value, '$.deadline'))) FROM session_state
             WHERE substr(key, 1, 9) = 'question:' AND json_valid(value)",
        )?
        .query_row([], |r| r.get(0))?;
    let next_row: Option<i64> = conn
        .prepare_cached(
            "SELECT min(at) FROM (SELECT ts_millis(process_after) AS at FROM messages_in
                                  WHERE status = 'pending')
             WHERE at > ?1",
        )?
        .query_row([now_ms], |r| r.get(0))?;
    let next_at = match (next_row, deadline.filter(|d| *d > now_ms)) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Ok(Work {
        due_since: millis(due_since),
        next_at: millis(next_at),
        question_deadline: millis(deadline),
    })
}

/// The claim of [`SessionDb::claim`] inside the caller's transaction.
fn claim_tx(tx: &Transaction<'_>, ids_json: &str) -> Result<Vec<MessageIn>, Error> {
    let mut stmt = tx.prepare_cached(&CLAIM_SQL)?;
    let read = stmt.query_map(params![ids_json, now_ts()], MessageIn::read)?;
    let mut unusable = Vec::new();
    let mut rows = split_rows(read, &mut unusable)?;
    // A row changed by someone else since the poll read it: out of the queue too.
    quarantine_tx(tx, &unusable)?;
    rows.sort_by_key(|row| row.seq);
    Ok(rows)
}

/// [`split_rows`] for the runner's queue, where a row whose `process_after` is no readable time
/// is unusable too: run now, a future task could fire early; left pending, it would wait
/// forever unseen. An empty `process_after` means no time.
fn queue_rows(
    rows: impl IntoIterator<Item = rusqlite::Result<InRow>>,
    unusable: &mut Vec<UnusableRow>,
) -> Result<Vec<MessageIn>, Error> {
    let mut usable = Vec::new();
    for row in rows {
        let (rowid, row) = match row? {
            InRow::Usable(rowid, row) => (rowid, row),
            InRow::Unusable(row) => {
                unusable.push(row);
                continue;
            }
        };
        let after = row
            .process_after
            .as_deref()
            .filter(|at| !at.trim().is_empty());
        match after.map(parse_ts) {
            Some(Err(err)) => unusable.push(UnusableRow {
                rowid,
                id: Some(row.id.clone()),
                column: "process_after",
                value: after.unwrap_or_default().chars().take(200).collect(),
                reason: format!(
                    "process_after is no readable time, so when the row is due is unknown ({err})"
                ),
                routing: row.routing,
            }),
            _ => usable.push(row),
        }
    }
    Ok(usable)
}

/// Takes unusable rows out of the queue, inside the writing transaction: each still `pending` or
/// `processing` becomes `failed` (terminal, so it is never claimed again; the host's status and
/// sweep already count and show that status), a warning names it and the reason, and a `system`
/// row `{"action":"row_unusable","payload":{…}}` tells the host (`id`, `rowid`, `column`,
/// `value`, `reason`, `status`). Returns how many rows it took out (a row someone changed
/// meanwhile is left alone).
pub(crate) fn quarantine_tx(tx: &Transaction<'_>, rows: &[UnusableRow]) -> Result<usize, Error> {
    let mut taken = 0;
    for row in rows {
        let changed = tx.execute(
            "UPDATE messages_in SET status = 'failed', status_changed = ?2
             WHERE rowid = ?1 AND status IN ('pending', 'processing')",
            params![row.rowid, now_ts()],
        )?;
        if changed == 0 {
            continue;
        }
        tracing::warn!(
            id = ?row.id,
            rowid = row.rowid,
            column = row.column,
            value = %row.value,
            reason = %row.reason,
            "messages_in row cannot be used: taken out of the queue as failed"
        );
        let content = crate::content::out::system_action(
            "row_unusable",
            json!({
                "id": row.id,
                "rowid": row.rowid,
                "column": row.column,
                "value": row.value,
                "reason": row.reason,
                "status": InStatus::Failed.as_str(),
            }),
        );
        insert_out_tx(
            tx,
            &NewMessageOut::new(OutKind::System, row.routing.clone(), &content)
                .replying_to(row.id.clone()),
        )?;
        taken += 1;
    }
    Ok(taken)
}

/// The number of `messages_in` rows with `status`, through `conn` (also `health`'s read-only
/// connection).
pub(crate) fn count_with_status(
    conn: &rusqlite::Connection,
    status: InStatus,
) -> rusqlite::Result<i64> {
    conn.query_row(
        &with_status("SELECT COUNT(*) FROM messages_in", status),
        [],
        |r| r.get(0),
    )
}

#[cfg(test)]
mod work_tests {
    use chrono::{Duration, TimeZone, Utc};

    use crate::rows::NewMessageIn;
    use crate::time::format_ts;
    use crate::SessionDb;

    #[test]
    fn work_is_what_would_wake_the_agent_and_when_more_comes_due() {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open(dir.path().join("session.db")).unwrap();
        let now = Utc.with_ymd_and_hms(2030, 1, 1, 12, 0, 0).unwrap();
        let at = |secs: i64| format_ts(now + Duration::seconds(secs));
        assert_eq!(db.work(now).unwrap(), super::Work::default());

        // Context only (trigger = 0): nothing wakes the agent, nothing comes due.
        let mut context = NewMessageIn::new("chat", r#"{"text":"fyi"}"#);
        context.trigger = false;
        context.timestamp = Some(at(-60));
        db.insert_in(&context).unwrap();
        // A task due in 30 s: not due, but the next wake.
        let mut task = NewMessageIn::new("task", r#"{"prompt":"report"}"#);
        task.process_after = Some(at(30));
        db.insert_in(&task).unwrap();
        let work = db.work(now).unwrap();
        assert_eq!(
            (work.due_since, work.next_at),
            (None, Some(now + Duration::seconds(30)))
        );

        // A chat sent 5 s ago is due since then; at 30 s the task is too, the older one first.
        let mut chat = NewMessageIn::new("chat", r#"{"text":"hi"}"#);
        chat.timestamp = Some(at(-5));
        let chat = db.insert_in(&chat).unwrap().id;
        assert_eq!(
            db.work(now).unwrap().due_since,
            Some(now - Duration::seconds(5))
        );
        let later = now + Duration::seconds(31);
        assert_eq!(
            db.work(later).unwrap().due_since,
            Some(now - Duration::seconds(5))
        );
        assert_eq!(db.work(later).unwrap().next_at, None);

        // A row a dead runner held (`processing`) is work too.
        db.claim(std::slice::from_ref(&chat)).unwrap();
        assert!(db.work(now).unwrap().due_since.is_some());

        // An open question: its deadline is the next wake while it is ahead.
        db.open_question("q1", now + Duration::seconds(10)).unwrap();
        let work = db.work(now).unwrap();
        assert_eq!(work.question_deadline, Some(now + Duration::seconds(10)));
        assert_eq!(work.next_at, Some(now + Duration::seconds(10)));
        // The same, read-only from the path, with the runner row.
        let (read, runner) =
            super::read_work(db.path(), now, std::time::Duration::from_secs(1)).unwrap();
        assert_eq!((read, runner), (work, db.runner_state().unwrap()));
    }
}
