//! The session DB: opening (pragmas, schema, migrations), the pool, and every query the host,
//! the runner and mcp-tools share.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use r2d2::{Pool, PooledConnection};
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::functions::FunctionFlags;
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use serde_json::json;

use crate::cron::Schedule;
use crate::rows::*;
use crate::sql::{COLUMNS, INDEXES, IN_COLUMNS, OUT_COLUMNS, SCHEMA};
use crate::time::{format_ts, now_ts, parse_ts};
use crate::Error;

/// How long a connection waits for another writer before `SQLITE_BUSY`.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Options for [`SessionDb::open_with`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Busy timeout, set first on every connection.
    pub busy_timeout: Duration,
    /// Maximum pooled connections.
    pub pool_size: u32,
    /// Time zone for cron schedules.
    pub timezone: Tz,
    /// Create tables and add missing columns (writers); readers may skip it.
    pub migrate: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            pool_size: 4,
            timezone: Tz::UTC,
            migrate: true,
        }
    }
}

/// Applies the connection pragmas in the order SPEC §3 requires: busy_timeout first, so that
/// switching to WAL (which needs a lock) already waits instead of failing. Then registers the
/// SQL functions the shared queries use (see [`register_functions`]).
pub fn configure_connection(conn: &Connection, busy_timeout: Duration) -> rusqlite::Result<()> {
    conn.busy_timeout(busy_timeout)?;
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;",
    )?;
    register_functions(conn)
}

/// Registers the SQL functions through which queries read stored values exactly as Rust does,
/// so SQL and Rust never disagree about a row:
/// - `ts_millis(x)`: the instant `x` names, as Unix milliseconds, read by [`parse_ts`] (every
///   form it accepts, e.g. the `+0200` offsets that SQLite's `julianday()` rejects); NULL when `x`
///   is NULL or no readable time.
/// - `flag_of(x, default)`: a 0/1 flag column read as `MessageIn::read` reads it (`'true'`,
///   `' 1 '`, …; `default` for an unreadable value).
pub fn register_functions(conn: &Connection) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8
        | FunctionFlags::SQLITE_DETERMINISTIC
        | FunctionFlags::SQLITE_INNOCUOUS;
    conn.create_scalar_function("ts_millis", 1, flags, |ctx| {
        Ok(lossy_text(ctx.get_raw(0))
            .and_then(|text| parse_ts(&text).ok())
            .map(|at| at.timestamp_millis()))
    })?;
    conn.create_scalar_function("flag_of", 2, flags, |ctx| {
        let default = lenient_flag(ctx.get_raw(1), false);
        Ok(lenient_flag(ctx.get_raw(0), default))
    })
}

/// A handle on one session DB: a small pool of configured connections. Cheap to clone.
#[derive(Clone)]
pub struct SessionDb {
    pool: Pool<SqliteConnectionManager>,
    path: PathBuf,
    timezone: Tz,
    busy_timeout: Duration,
}

impl std::fmt::Debug for SessionDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionDb")
            .field("path", &self.path)
            .finish()
    }
}

/// The rows a poll may hand to the agent, after every gate of SPEC §5.2.
#[derive(Debug, Clone, Default)]
pub struct Eligible {
    /// Up to `limit` rows, in seq order.
    pub rows: Vec<MessageIn>,
    /// Whether they may wake the agent: one of them has `trigger=1`, or a triggering row is
    /// eligible beyond the limit (then these older context rows go first).
    pub wakes: bool,
}

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
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SweepReport {
    /// Rows back to `pending` (with a backoff `process_after`).
    pub reset: Vec<String>,
    /// Rows given up as `failed`.
    pub failed: Vec<String>,
}

/// Counts for `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
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

/// Session-state key prefix for open questions.
pub const QUESTION_KEY_PREFIX: &str = "question:";
/// Session-state key of the batch being worked on.
pub const CURRENT_BATCH_KEY: &str = "current_batch";
/// Session-state key prefix of paused task series.
pub const SERIES_PAUSED_PREFIX: &str = "series_paused:";

/// Session-state key of a provider's continuation.
pub fn continuation_key(provider: &str) -> String {
    format!("continuation:{provider}")
}

/// The predicate that makes a pending row eligible (SPEC §5.2), with `?1` = now in Unix
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

impl SessionDb {
    /// Opens (creating if needed) the DB at `path` with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::open_with(path, OpenOptions::default())
    }

    /// Opens the DB at `path`: pragmas on every connection, schema and migrations once.
    pub fn open_with(path: impl AsRef<Path>, options: OpenOptions) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            if !parent.is_dir() {
                return Err(Error::MissingDirectory(parent.to_path_buf()));
            }
        }
        // Before the first connection: from now on this process never opens these files as
        // input (an open and close would drop the connections' locks; see `fsguard`).
        fsguard::protect_db(&path);
        let busy_timeout = options.busy_timeout;
        // One connection first, outside the pool: a file that is not a database (or cannot be
        // opened) fails here at once with its path, where the pool would retry until timeout.
        let first = Connection::open(&path)
            .and_then(|conn| {
                configure_connection(&conn, busy_timeout)?;
                conn.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))?;
                Ok(conn)
            })
            .map_err(|cause| Error::Open {
                path: path.clone(),
                cause,
            })?;
        let manager = SqliteConnectionManager::file(&path)
            .with_init(move |conn| configure_connection(conn, busy_timeout));
        let pool = Pool::builder()
            .max_size(options.pool_size.max(1))
            .min_idle(Some(1))
            .connection_timeout(busy_timeout.max(Duration::from_secs(1)))
            .build(manager)?;
        drop(first);
        let db = Self {
            pool,
            path,
            timezone: options.timezone,
            busy_timeout,
        };
        if options.migrate {
            db.migrate()?;
        }
        Ok(db)
    }

    /// Path of the DB file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Time zone used for cron schedules.
    pub fn timezone(&self) -> Tz {
        self.timezone
    }

    /// Opens a dedicated connection outside the pool (for `PRAGMA data_version` watching).
    pub fn dedicated_connection(&self) -> Result<Connection, Error> {
        let conn = Connection::open(&self.path)?;
        configure_connection(&conn, self.busy_timeout)?;
        Ok(conn)
    }

    pub(crate) fn conn(&self) -> Result<PooledConnection<SqliteConnectionManager>, Error> {
        Ok(self.pool.get()?)
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction: the write lock is taken up front, so a
    /// read-then-write never fails with `SQLITE_BUSY` on upgrade (CRATES.md, SQLite).
    pub(crate) fn write<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()?;
        Ok(out)
    }

    fn migrate(&self) -> Result<(), Error> {
        self.write(|tx| {
            tx.execute_batch(SCHEMA)?;
            for (table, column, decl) in COLUMNS {
                if !has_column(tx, table, column)? {
                    tracing::info!(
                        table,
                        column,
                        "adding missing column to an older session DB"
                    );
                    tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
                }
            }
            tx.execute_batch(INDEXES)?;
            Ok(())
        })
    }

    // ----- inserting ------------------------------------------------------------------------

    /// Inserts a `messages_in` row with the next even seq.
    pub fn insert_in(&self, row: &NewMessageIn) -> Result<Inserted, Error> {
        self.write(|tx| insert_in_tx(tx, row))
    }

    /// Inserts a `messages_out` row with the next odd seq.
    pub fn insert_out(&self, row: &NewMessageOut) -> Result<Inserted, Error> {
        self.write(|tx| insert_out_tx(tx, row))
    }

    // ----- reading --------------------------------------------------------------------------

    /// One `messages_in` row by id (`None` too for an [`UnusableRow`]).
    pub fn message_in(&self, id: &str) -> Result<Option<MessageIn>, Error> {
        let conn = self.conn()?;
        let sql = format!("SELECT {IN_COLUMNS} FROM messages_in m WHERE id = ?1");
        let row = conn.query_row(&sql, [id], MessageIn::read).optional()?;
        Ok(usable_rows(row.map(Ok))?.pop())
    }

    /// One `messages_in` row by seq (`None` too for an [`UnusableRow`]).
    pub fn message_in_by_seq(&self, seq: i64) -> Result<Option<MessageIn>, Error> {
        let conn = self.conn()?;
        let sql = format!("SELECT {IN_COLUMNS} FROM messages_in m WHERE seq = ?1");
        let row = conn.query_row(&sql, [seq], MessageIn::read).optional()?;
        Ok(usable_rows(row.map(Ok))?.pop())
    }

    /// One `messages_out` row by seq.
    pub fn message_out_by_seq(&self, seq: i64) -> Result<Option<MessageOut>, Error> {
        let conn = self.conn()?;
        let sql = format!("SELECT {OUT_COLUMNS} FROM messages_out WHERE seq = ?1");
        Ok(conn
            .query_row(&sql, [seq], MessageOut::from_row)
            .optional()?)
    }

    /// The highest seq in either table (0 for an empty DB).
    pub fn max_seq(&self) -> Result<i64, Error> {
        let conn = self.conn()?;
        highest_seq(&conn)
    }

    /// `messages_out` rows with seq above `after`, oldest first. A row whose seq is no number
    /// (TEXT, BLOB) has no place in that order and is left out: SQLite sorts it above every number,
    /// so it would come back after every `after` and a follower would print it forever.
    pub fn messages_out_after(&self, after: i64, limit: usize) -> Result<Vec<MessageOut>, Error> {
        let conn = self.conn()?;
        let sql = format!(
            "SELECT {OUT_COLUMNS} FROM messages_out
             WHERE seq > ?1 AND seq <= 9223372036854775807 ORDER BY seq LIMIT ?2"
        );
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params![after, limit as i64], MessageOut::from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// `messages_out` rows answering `in_reply_to`.
    pub fn replies_to(&self, in_reply_to: &str) -> Result<Vec<MessageOut>, Error> {
        let conn = self.conn()?;
        let sql =
            format!("SELECT {OUT_COLUMNS} FROM messages_out WHERE in_reply_to = ?1 ORDER BY seq");
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([in_reply_to], MessageOut::from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// `messages_in` rows with the given status, in seq order; [`UnusableRow`]s are left out.
    pub fn messages_in_with_status(&self, status: InStatus) -> Result<Vec<MessageIn>, Error> {
        let conn = self.conn()?;
        let sql = format!("SELECT {IN_COLUMNS} FROM messages_in m WHERE status = ?1 ORDER BY seq");
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = usable_rows(stmt.query_map([status.as_str()], MessageIn::read)?)?;
        Ok(rows)
    }

    /// Every `messages_in` row, in seq order (tests, diagnostics); [`UnusableRow`]s are left out.
    pub fn all_messages_in(&self) -> Result<Vec<MessageIn>, Error> {
        let conn = self.conn()?;
        let sql = format!("SELECT {IN_COLUMNS} FROM messages_in m ORDER BY seq");
        let mut stmt = conn.prepare(&sql)?;
        let rows = usable_rows(stmt.query_map([], MessageIn::read)?)?;
        Ok(rows)
    }

    /// Every `messages_out` row, in seq order.
    pub fn all_messages_out(&self) -> Result<Vec<MessageOut>, Error> {
        self.messages_out_after(i64::MIN, usize::MAX >> 1)
    }

    // ----- the runner's queue ---------------------------------------------------------------

    /// The rows a poll at `now` may take (SPEC §5.2): pending, due, `on_wake` only on the first
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
                let sql = format!(
                    "SELECT {IN_COLUMNS} FROM messages_in m WHERE {ELIGIBLE_WHERE}
                     ORDER BY m.seq LIMIT ?3"
                );
                let mut stmt = conn.prepare_cached(&sql)?;
                let read = stmt.query_map(params![now, first_poll, limit], MessageIn::read)?;
                let rows = queue_rows(read, &mut unusable)?;
                // Context rows only: they go first when a triggering row is eligible further on.
                let wakes = rows.iter().any(|row| row.trigger)
                    || (!rows.is_empty() && {
                        let sql = format!(
                            "SELECT {IN_COLUMNS} FROM messages_in m
                             WHERE {ELIGIBLE_WHERE} AND flag_of(m.trigger, 1)
                             ORDER BY m.seq LIMIT 1"
                        );
                        let mut stmt = conn.prepare_cached(&sql)?;
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
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids_json = serde_json::to_string(ids)?;
        self.write(|tx| {
            let sql = format!(
                "UPDATE messages_in AS m SET status = 'processing', tries = tries + 1, status_changed = ?2
                 WHERE m.status = 'pending' AND m.id IN (SELECT value FROM json_each(?1))
                 RETURNING {IN_COLUMNS}"
            );
            let mut stmt = tx.prepare_cached(&sql)?;
            let read = stmt.query_map(params![ids_json, now_ts()], MessageIn::read)?;
            let mut unusable = Vec::new();
            let mut rows = split_rows(read, &mut unusable)?;
            // A row changed by someone else since the poll read it: out of the queue too.
            quarantine_tx(tx, &unusable)?;
            rows.sort_by_key(|row| row.seq);
            Ok(rows)
        })
    }

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
        let ids_json = serde_json::to_string(ids)?;
        let timezone = self.timezone;
        self.write(|tx| {
            let mut written = Vec::with_capacity(replies.len());
            for reply in replies {
                written.push(insert_out_tx(tx, reply)?);
            }
            let sql = format!(
                "UPDATE messages_in AS m SET status = 'completed', status_changed = ?2
                 WHERE m.status IN ('pending', 'processing') AND m.id IN (SELECT value FROM json_each(?1))
                 RETURNING {IN_COLUMNS}"
            );
            let completed = usable_rows(
                tx.prepare_cached(&sql)?
                    .query_map(params![ids_json, format_ts(now)], MessageIn::read)?,
            )?;
            for row in completed.iter().filter(|row| row.recurrence.is_some()) {
                schedule_next_occurrence(tx, row, now, timezone)?;
            }
            Ok(written)
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

    /// Queue counts at `now`.
    pub fn counts(&self, now: DateTime<Utc>) -> Result<QueueCounts, Error> {
        let conn = self.conn()?;
        let count = |status: &str| -> Result<i64, Error> {
            Ok(conn.query_row(
                "SELECT COUNT(*) FROM messages_in WHERE status = ?1",
                [status],
                |r| r.get(0),
            )?)
        };
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
            pending: count("pending")?,
            due,
            processing: count("processing")?,
            paused: count("paused")?,
            failed: count("failed")?,
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
        let mut stmt = conn.prepare_cached(
            "SELECT ts_millis(process_after) AS at FROM messages_in
             WHERE status = 'pending' AND at > ?1 ORDER BY at LIMIT 1",
        )?;
        let first: Option<i64> = stmt
            .query_row([after.timestamp_millis()], |r| r.get(0))
            .optional()?;
        Ok(first.and_then(DateTime::<Utc>::from_timestamp_millis))
    }

    // ----- session_state --------------------------------------------------------------------

    /// A session_state value.
    pub fn state(&self, key: &str) -> Result<Option<String>, Error> {
        let conn = self.conn()?;
        Ok(conn
            .query_row(
                "SELECT value FROM session_state WHERE key = ?1",
                [key],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Sets a session_state value.
    pub fn set_state(&self, key: &str, value: &str) -> Result<(), Error> {
        self.write(|tx| set_state_tx(tx, key, value))
    }

    /// Deletes a session_state key; true when it existed.
    pub fn delete_state(&self, key: &str) -> Result<bool, Error> {
        self.write(|tx| Ok(tx.execute("DELETE FROM session_state WHERE key = ?1", [key])? > 0))
    }

    /// The stored continuation (session/thread id) of `provider`.
    pub fn continuation(&self, provider: &str) -> Result<Option<String>, Error> {
        self.state(&continuation_key(provider))
    }

    /// Stores the continuation of `provider`.
    pub fn set_continuation(&self, provider: &str, id: &str) -> Result<(), Error> {
        self.set_state(&continuation_key(provider), id)
    }

    /// Forgets the continuation of `provider`.
    pub fn clear_continuation(&self, provider: &str) -> Result<bool, Error> {
        self.delete_state(&continuation_key(provider))
    }

    /// The batch the runner is working on, if any.
    pub fn current_batch(&self) -> Result<Option<CurrentBatch>, Error> {
        match self.state(CURRENT_BATCH_KEY)? {
            None => Ok(None),
            Some(text) => Ok(Some(serde_json::from_str(&text)?)),
        }
    }

    /// Stores (or with `None` clears) the current batch.
    pub fn set_current_batch(&self, batch: Option<&CurrentBatch>) -> Result<(), Error> {
        match batch {
            Some(batch) => self.set_state(CURRENT_BATCH_KEY, &serde_json::to_string(batch)?),
            None => self.delete_state(CURRENT_BATCH_KEY).map(|_| ()),
        }
    }

    /// Records an open question that an `ask_user_question` call waits for until `deadline`;
    /// answers to it are held back from the agent until then.
    pub fn open_question(&self, question_id: &str, deadline: DateTime<Utc>) -> Result<(), Error> {
        let value = json!({ "deadline": format_ts(deadline) }).to_string();
        self.set_state(&format!("{QUESTION_KEY_PREFIX}{question_id}"), &value)
    }

    /// Asks a question in ONE transaction: records it as open until `deadline` (see
    /// [`SessionDb::open_question`]), writes the question row and, when `set_waiting` is true,
    /// switches `runner_state.status` from `busy` to `waiting_user`. A reader that sees the
    /// question row therefore also sees the waiting status. Returns the inserted row and whether
    /// the status was switched (false when the runner was not `busy`).
    pub fn post_question(
        &self,
        question_id: &str,
        deadline: DateTime<Utc>,
        row: &NewMessageOut,
        set_waiting: bool,
    ) -> Result<(Inserted, bool), Error> {
        let value = json!({ "deadline": format_ts(deadline) }).to_string();
        self.write(|tx| {
            set_state_tx(tx, &format!("{QUESTION_KEY_PREFIX}{question_id}"), &value)?;
            let inserted = insert_out_tx(tx, row)?;
            let switched = set_waiting
                && swap_runner_status_tx(tx, RunnerStatus::Busy, RunnerStatus::WaitingUser)?;
            Ok((inserted, switched))
        })
    }

    /// Closes an open question.
    pub fn close_question(&self, question_id: &str) -> Result<bool, Error> {
        self.delete_state(&format!("{QUESTION_KEY_PREFIX}{question_id}"))
    }

    /// Finds a pending answer to `question_id` and completes it, atomically. Returns the answer.
    pub fn take_answer(
        &self,
        question_id: &str,
    ) -> Result<Option<(MessageIn, crate::QuestionAnswer)>, Error> {
        self.write(|tx| {
            let sql = format!(
                "SELECT {IN_COLUMNS} FROM messages_in m WHERE m.status = 'pending'
                 AND m.kind IN ('system', 'chat') AND json_valid(m.content)
                 AND json_extract(m.content, '$.questionId') = ?1 ORDER BY m.seq"
            );
            let candidates =
                usable_rows(tx.prepare_cached(&sql)?.query_map([question_id], MessageIn::read)?)?;
            for row in candidates {
                let content = crate::InboundContent::parse(&row.kind(), &row.content);
                if let Some(answer) = content.question_answer() {
                    tx.execute(
                        "UPDATE messages_in SET status = 'completed', status_changed = ?2 WHERE id = ?1",
                        params![row.id, now_ts()],
                    )?;
                    return Ok(Some((row, answer)));
                }
            }
            Ok(None)
        })
    }

    // ----- runner_state ---------------------------------------------------------------------

    /// Writes the runner_state row (status, pid, provider), refreshing the heartbeat.
    pub fn set_runner_state(
        &self,
        status: RunnerStatus,
        pid: Option<u32>,
        provider: Option<&str>,
    ) -> Result<(), Error> {
        let now = now_ts();
        self.write(|tx| {
            tx.execute(
                "INSERT INTO runner_state (id, status, pid, provider, current_tool, heartbeat_at, updated_at)
                 VALUES (1, ?1, ?2, ?3, NULL, ?4, ?4)
                 ON CONFLICT(id) DO UPDATE SET status = ?1, pid = COALESCE(?2, pid),
                   provider = COALESCE(?3, provider), heartbeat_at = ?4, updated_at = ?4",
                params![status.as_str(), pid, provider, now],
            )?;
            Ok(())
        })
    }

    /// Changes only the status (keeps pid and provider), if the row exists.
    pub fn set_runner_status(&self, status: RunnerStatus) -> Result<(), Error> {
        self.set_runner_state(status, None, None)
    }

    /// Sets the status to `to` only when it is currently `from`; true when it changed.
    pub fn swap_runner_status(&self, from: RunnerStatus, to: RunnerStatus) -> Result<bool, Error> {
        self.write(|tx| swap_runner_status_tx(tx, from, to))
    }

    /// Records the tool the agent is in (or none).
    pub fn set_current_tool(&self, tool: Option<&str>) -> Result<(), Error> {
        self.write(|tx| {
            tx.execute(
                "UPDATE runner_state SET current_tool = ?1 WHERE id = 1",
                [tool],
            )?;
            Ok(())
        })
    }

    /// Records what a turn without progress waits on (or clears it with `None`).
    pub fn set_waiting_on(&self, waiting_on: Option<&WaitingOn>) -> Result<(), Error> {
        let json = waiting_on.map(serde_json::to_string).transpose()?;
        self.write(|tx| {
            tx.execute(
                "UPDATE runner_state SET waiting_on = ?1 WHERE id = 1",
                [json],
            )?;
            Ok(())
        })
    }

    /// Refreshes `heartbeat_at`.
    pub fn heartbeat(&self) -> Result<(), Error> {
        self.write(|tx| {
            tx.execute(
                "UPDATE runner_state SET heartbeat_at = ?1 WHERE id = 1",
                [now_ts()],
            )?;
            Ok(())
        })
    }

    /// The runner_state row, if a runner ever started.
    pub fn runner_state(&self) -> Result<Option<RunnerState>, Error> {
        let conn = self.conn()?;
        Ok(conn
            .query_row(
                "SELECT status, pid, provider, current_tool, heartbeat_at, updated_at, waiting_on
                 FROM runner_state WHERE id = 1",
                [],
                |r| {
                    Ok(RunnerState {
                        status: r.get(0)?,
                        pid: r.get(1)?,
                        provider: r.get(2)?,
                        current_tool: r.get(3)?,
                        heartbeat_at: r.get(4)?,
                        updated_at: r.get(5)?,
                        waiting_on: r.get(6)?,
                    })
                },
            )
            .optional()?)
    }

    // ----- host tables ----------------------------------------------------------------------

    /// Every destination, by name.
    pub fn destinations(&self) -> Result<Vec<Destination>, Error> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare_cached(
            "SELECT name, display_name, type, channel_type, platform_id, agent_group_id
             FROM destinations ORDER BY name",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(Destination {
                name: r.get(0)?,
                display_name: r.get(1)?,
                kind: r.get(2)?,
                channel_type: r.get(3)?,
                platform_id: r.get(4)?,
                agent_group_id: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// One destination by name, matched as [`crate::find_destination`] does.
    pub fn destination(&self, name: &str) -> Result<Option<Destination>, Error> {
        Ok(crate::find_destination(&self.destinations()?, name).cloned())
    }

    /// Inserts or replaces a destination (host).
    pub fn upsert_destination(&self, destination: &Destination) -> Result<(), Error> {
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO destinations (name, display_name, type, channel_type, platform_id, agent_group_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    destination.name,
                    destination.display_name,
                    destination.kind,
                    destination.channel_type,
                    destination.platform_id,
                    destination.agent_group_id
                ],
            )?;
            Ok(())
        })
    }

    /// The session's default routing.
    pub fn session_routing(&self) -> Result<Option<Routing>, Error> {
        let conn = self.conn()?;
        Ok(conn
            .query_row(
                "SELECT channel_type, platform_id, thread_id FROM session_routing WHERE id = 1",
                [],
                |r| {
                    Ok(Routing {
                        channel_type: r.get(0)?,
                        platform_id: r.get(1)?,
                        thread_id: r.get(2)?,
                    })
                },
            )
            .optional()?)
    }

    /// Sets the session's default routing (host).
    pub fn set_session_routing(&self, routing: &Routing) -> Result<(), Error> {
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO session_routing (id, channel_type, platform_id, thread_id)
                 VALUES (1, ?1, ?2, ?3)",
                params![routing.channel_type, routing.platform_id, routing.thread_id],
            )?;
            Ok(())
        })
    }

    /// What the host recorded for a delivered row.
    pub fn delivered(&self, message_out_id: &str) -> Result<Option<Delivered>, Error> {
        let conn = self.conn()?;
        Ok(conn
            .query_row(
                "SELECT message_out_id, platform_message_id, status, delivered_at FROM delivered WHERE message_out_id = ?1",
                [message_out_id],
                |r| {
                    Ok(Delivered {
                        message_out_id: r.get(0)?,
                        platform_message_id: r.get(1)?,
                        status: r.get(2)?,
                        delivered_at: r.get(3)?,
                    })
                },
            )
            .optional()?)
    }

    /// Records a delivery (host).
    pub fn mark_delivered(
        &self,
        message_out_id: &str,
        platform_message_id: Option<&str>,
        status: &str,
    ) -> Result<(), Error> {
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO delivered (message_out_id, platform_message_id, status, delivered_at)
                 VALUES (?1, ?2, ?3, ?4)",
                params![message_out_id, platform_message_id, status, now_ts()],
            )?;
            Ok(())
        })
    }
}

fn has_column(tx: &Transaction<'_>, table: &str, column: &str) -> Result<bool, Error> {
    let mut stmt = tx.prepare(&format!("PRAGMA table_info({table})"))?;
    let names = stmt.query_map([], |r| r.get::<_, String>(1))?;
    for name in names {
        if name? == column {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The highest numeric seq in either table; 0 when there is none (or only negative ones).
/// SQLite sorts TEXT and BLOB above every number, so a plain `MAX(seq)` would return a bad row's
/// text seq and fail every insert; the `seq <= i64::MAX` bound leaves such values out and still
/// reads the last entry of the seq index. A REAL seq counts rounded up.
fn highest_seq(conn: &Connection) -> Result<i64, Error> {
    let numeric = |value: ValueRef<'_>| match value {
        ValueRef::Integer(seq) => seq,
        // `as` saturates; the bound keeps the value at most i64::MAX anyway.
        ValueRef::Real(seq) => seq.ceil() as i64,
        _ => 0,
    };
    let (max_in, max_out) = conn.query_row(
        "SELECT
           (SELECT seq FROM messages_in WHERE seq <= 9223372036854775807 ORDER BY seq DESC LIMIT 1),
           (SELECT seq FROM messages_out WHERE seq <= 9223372036854775807 ORDER BY seq DESC LIMIT 1)",
        [],
        |r| Ok((numeric(r.get_ref(0)?), numeric(r.get_ref(1)?))),
    )?;
    Ok(max_in.max(max_out).max(0))
}

/// The next free seq of the given parity above every seq in both tables. Must run inside the
/// writing transaction so two writers can never take the same number. Checked: past `i64::MAX`
/// it is [`Error::SeqExhausted`], never a wrapped (negative, later colliding) number.
fn next_seq(tx: &Transaction<'_>, odd: bool) -> Result<i64, Error> {
    let max = highest_seq(tx)?;
    let exhausted = || Error::SeqExhausted { max };
    let mut next = max.checked_add(1).ok_or_else(exhausted)?;
    if (next % 2 == 1) != odd {
        next = next.checked_add(1).ok_or_else(exhausted)?;
    }
    Ok(next)
}

/// Rows read with `MessageIn::read`: the usable ones, in order; the others go to `unusable`.
fn split_rows(
    rows: impl IntoIterator<Item = rusqlite::Result<InRow>>,
    unusable: &mut Vec<UnusableRow>,
) -> Result<Vec<MessageIn>, Error> {
    let mut usable = Vec::new();
    for row in rows {
        match row? {
            InRow::Usable(_, row) => usable.push(row),
            InRow::Unusable(row) => unusable.push(row),
        }
    }
    Ok(usable)
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

/// The usable rows of a listing; [`UnusableRow`]s are left out (the runner's poll takes them
/// out of the queue, with a log line and a system row).
pub(crate) fn usable_rows(
    rows: impl IntoIterator<Item = rusqlite::Result<InRow>>,
) -> Result<Vec<MessageIn>, Error> {
    let mut unusable = Vec::new();
    let usable = split_rows(rows, &mut unusable)?;
    for row in unusable {
        tracing::debug!(rowid = row.rowid, id = ?row.id, reason = %row.reason, "unusable messages_in row left out");
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

pub(crate) fn insert_in_tx(tx: &Transaction<'_>, row: &NewMessageIn) -> Result<Inserted, Error> {
    let id = row
        .id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let seq = next_seq(tx, false)?;
    let timestamp = row.timestamp.clone().unwrap_or_else(now_ts);
    let series_id = if row.series_is_self {
        Some(id.clone())
    } else {
        row.series_id.clone()
    };
    tx.prepare_cached(
        "INSERT INTO messages_in (id, seq, kind, timestamp, status, status_changed, process_after,
           recurrence, series_id, tries, trigger, platform_id, channel_type, thread_id, content,
           source_session_id, on_wake)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
    )?
    .execute(params![
        id,
        seq,
        row.kind,
        timestamp,
        row.status.as_str(),
        now_ts(),
        row.process_after,
        row.recurrence,
        series_id,
        row.trigger,
        row.routing.platform_id,
        row.routing.channel_type,
        row.routing.thread_id,
        row.content,
        row.source_session_id,
        row.on_wake,
    ])?;
    Ok(Inserted { id, seq })
}

pub(crate) fn insert_out_tx(tx: &Transaction<'_>, row: &NewMessageOut) -> Result<Inserted, Error> {
    let id = row
        .id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let seq = next_seq(tx, true)?;
    tx.prepare_cached(
        "INSERT INTO messages_out (id, seq, in_reply_to, timestamp, deliver_after, kind,
           platform_id, channel_type, thread_id, content)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        id,
        seq,
        row.in_reply_to,
        now_ts(),
        row.deliver_after,
        row.kind.as_str(),
        row.routing.platform_id,
        row.routing.channel_type,
        row.routing.thread_id,
        row.content,
    ])?;
    Ok(Inserted { id, seq })
}

/// Sets `runner_state.status` to `to` if it is `from`; true when it was switched.
fn swap_runner_status_tx(
    tx: &Transaction<'_>,
    from: RunnerStatus,
    to: RunnerStatus,
) -> Result<bool, Error> {
    Ok(tx.execute(
        "UPDATE runner_state SET status = ?2, updated_at = ?3 WHERE id = 1 AND status = ?1",
        params![from.as_str(), to.as_str(), now_ts()],
    )? > 0)
}

pub(crate) fn set_state_tx(tx: &Transaction<'_>, key: &str, value: &str) -> Result<(), Error> {
    tx.execute(
        "INSERT INTO session_state (key, value, updated_at) VALUES (?1, ?2, ?3)
         ON CONFLICT(key) DO UPDATE SET value = ?2, updated_at = ?3",
        params![key, value, now_ts()],
    )?;
    Ok(())
}

/// Ids of the batch a live runner holds: empty unless the runner is busy or waiting with a
/// heartbeat newer than `stale_before`.
fn active_batch_ids(
    tx: &Transaction<'_>,
    stale_before: DateTime<Utc>,
) -> Result<Vec<String>, Error> {
    let live: bool = tx
        .query_row(
            "SELECT status IN ('busy', 'waiting_user') AND ts_millis(heartbeat_at) > ts_millis(?1)
             FROM runner_state WHERE id = 1",
            [format_ts(stale_before)],
            |r| r.get::<_, Option<bool>>(0),
        )
        .optional()?
        .flatten()
        .unwrap_or(false);
    if !live {
        return Ok(Vec::new());
    }
    let batch: Option<String> = tx
        .query_row(
            "SELECT value FROM session_state WHERE key = ?1",
            [CURRENT_BATCH_KEY],
            |r| r.get(0),
        )
        .optional()?;
    Ok(batch
        .and_then(|text| serde_json::from_str::<CurrentBatch>(&text).ok())
        .map(|batch| batch.ids)
        .unwrap_or_default())
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
