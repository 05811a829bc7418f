//! The schema of docs/contract/db.md, its indexes, and the column migrations for older DBs.

use rusqlite::Transaction;

use crate::rows::InStatus;
use crate::Error;

/// Tables and indexes, idempotent.
///
/// `turn_usage.id` is a plain `INTEGER PRIMARY KEY`: with `AUTOINCREMENT` every ledger row also
/// rewrote its `sqlite_sequence` row, one more page in the WAL per turn. Nothing deletes ledger
/// rows, so ids count up and never repeat without it. An older DB's table keeps its
/// `AUTOINCREMENT` (`CREATE TABLE IF NOT EXISTS` leaves it; it takes rows the same way).
///
/// `session_state` is `WITHOUT ROWID`: one B-tree keyed on `key` instead of a table and a key
/// index. Every commit by another connection empties a connection's page cache, so the keys a
/// query's start reads cost a descent from the file each time; with one tree it is one descent
/// (with a million keys, 5.8 → 3.9 page reads per message). An older DB's table keeps its
/// rowids, read and written by the same statements.
pub(crate) const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS messages_in (
  id             TEXT PRIMARY KEY,
  seq            INTEGER UNIQUE,
  kind           TEXT NOT NULL,
  timestamp      TEXT NOT NULL,
  status         TEXT NOT NULL DEFAULT 'pending',
  status_changed TEXT,
  process_after  TEXT,
  recurrence     TEXT,
  series_id      TEXT,
  tries          INTEGER NOT NULL DEFAULT 0,
  trigger        INTEGER NOT NULL DEFAULT 1,
  platform_id    TEXT, channel_type TEXT, thread_id TEXT,
  content        TEXT NOT NULL,
  source_session_id TEXT,
  on_wake        INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS messages_out (
  id            TEXT PRIMARY KEY,
  seq           INTEGER UNIQUE,
  in_reply_to   TEXT,
  timestamp     TEXT NOT NULL,
  deliver_after TEXT,
  kind          TEXT NOT NULL,
  platform_id TEXT, channel_type TEXT, thread_id TEXT,
  content       TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS delivered (message_out_id TEXT PRIMARY KEY, platform_message_id TEXT,
  status TEXT NOT NULL DEFAULT 'delivered', delivered_at TEXT NOT NULL, reason TEXT);
CREATE TABLE IF NOT EXISTS destinations (name TEXT PRIMARY KEY, display_name TEXT, type TEXT NOT NULL,
  channel_type TEXT, platform_id TEXT, agent_group_id TEXT);
CREATE TABLE IF NOT EXISTS session_routing (id INTEGER PRIMARY KEY CHECK (id = 1),
  channel_type TEXT, platform_id TEXT, thread_id TEXT);
CREATE TABLE IF NOT EXISTS session_state (key TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at TEXT NOT NULL)
  WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS runner_state (id INTEGER PRIMARY KEY CHECK (id = 1),
  status TEXT NOT NULL,
  pid INTEGER, provider TEXT, current_tool TEXT, heartbeat_at TEXT NOT NULL, updated_at TEXT NOT NULL,
  waiting_on TEXT, last_event TEXT, current_batch TEXT, start_keys_stamp INTEGER);
CREATE TABLE IF NOT EXISTS turn_usage (id INTEGER PRIMARY KEY, created_at TEXT NOT NULL,
  provider TEXT NOT NULL, model TEXT, input_tokens INTEGER, output_tokens INTEGER,
  cache_read_tokens INTEGER, cache_write_tokens INTEGER, reasoning_tokens INTEGER, cost_usd REAL,
  requests INTEGER, duration_ms INTEGER, outcome TEXT NOT NULL, message_ids TEXT NOT NULL,
  series_id TEXT);
CREATE TABLE IF NOT EXISTS api_idempotency (key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL,
  message_id TEXT NOT NULL, seq INTEGER NOT NULL, response TEXT NOT NULL, created_at TEXT NOT NULL);
"#;

/// Indexes for the hot queries; created after migrations so their columns exist.
///
/// The two on `messages_in` are partial ([`OPEN_ROWS_INDEXES`]): a completed row is in neither,
/// so they grow with the open rows, not with the session's history, and a message's claim and
/// completion move its row within them at the same cost after a million completed rows. SQLite
/// uses a partial index only for a query whose WHERE implies the index's: a status query names
/// one status with `=` and a literal written in the statement, never a bound parameter or
/// `IN (…)`, which imply nothing here.
pub(crate) const INDEXES: &str = r#"
CREATE INDEX IF NOT EXISTS idx_messages_in_pending ON messages_in(status, seq)
  WHERE status = 'pending' OR status = 'processing' OR status = 'paused' OR status = 'failed';
CREATE INDEX IF NOT EXISTS idx_messages_in_series ON messages_in(series_id, status)
  WHERE series_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS idx_messages_out_reply ON messages_out(in_reply_to);
CREATE INDEX IF NOT EXISTS idx_turn_usage_created ON turn_usage(created_at);
"#;

/// Triggers that give `runner_state.start_keys_stamp` a new random value in the transaction
/// of every write to a `session_state` key a query starts from (`continuation:*`, `model`,
/// `model_previous`), whoever writes it: the runner, a hand edit, an older binary. The runner
/// keeps those keys in memory while the stamp is the one it read them under
/// ([`crate::StartKeys`]). Created after migrations, like [`INDEXES`], so the column exists.
pub(crate) const TRIGGERS: &str = r#"
CREATE TRIGGER IF NOT EXISTS session_state_start_keys_insert AFTER INSERT ON session_state
  WHEN NEW.key IN ('model', 'model_previous') OR NEW.key GLOB 'continuation:*'
  BEGIN UPDATE runner_state SET start_keys_stamp = random() WHERE id = 1; END;
CREATE TRIGGER IF NOT EXISTS session_state_start_keys_update AFTER UPDATE ON session_state
  WHEN NEW.key IN ('model', 'model_previous') OR NEW.key GLOB 'continuation:*'
    OR OLD.key IN ('model', 'model_previous') OR OLD.key GLOB 'continuation:*'
  BEGIN UPDATE runner_state SET start_keys_stamp = random() WHERE id = 1; END;
CREATE TRIGGER IF NOT EXISTS session_state_start_keys_delete AFTER DELETE ON session_state
  WHEN OLD.key IN ('model', 'model_previous') OR OLD.key GLOB 'continuation:*'
  BEGIN UPDATE runner_state SET start_keys_stamp = random() WHERE id = 1; END;
"#;

/// The partial indexes of [`INDEXES`], by table: an older DB holds them whole, and opening it
/// drops those so that [`INDEXES`] creates them partial.
pub(crate) const OPEN_ROWS_INDEXES: &[(&str, &str)] = &[
    ("messages_in", "idx_messages_in_pending"),
    ("messages_in", "idx_messages_in_series"),
];

/// Every column of every table with its declaration, for adding missing columns to an older DB.
pub(crate) const COLUMNS: &[(&str, &str, &str)] = &[
    ("messages_in", "seq", "INTEGER"),
    ("messages_in", "status", "TEXT NOT NULL DEFAULT 'pending'"),
    ("messages_in", "status_changed", "TEXT"),
    ("messages_in", "process_after", "TEXT"),
    ("messages_in", "recurrence", "TEXT"),
    ("messages_in", "series_id", "TEXT"),
    ("messages_in", "tries", "INTEGER NOT NULL DEFAULT 0"),
    ("messages_in", "trigger", "INTEGER NOT NULL DEFAULT 1"),
    ("messages_in", "platform_id", "TEXT"),
    ("messages_in", "channel_type", "TEXT"),
    ("messages_in", "thread_id", "TEXT"),
    ("messages_in", "source_session_id", "TEXT"),
    ("messages_in", "on_wake", "INTEGER NOT NULL DEFAULT 0"),
    ("messages_out", "seq", "INTEGER"),
    ("messages_out", "in_reply_to", "TEXT"),
    ("messages_out", "deliver_after", "TEXT"),
    ("messages_out", "platform_id", "TEXT"),
    ("messages_out", "channel_type", "TEXT"),
    ("messages_out", "thread_id", "TEXT"),
    ("delivered", "platform_message_id", "TEXT"),
    ("delivered", "status", "TEXT NOT NULL DEFAULT 'delivered'"),
    ("delivered", "reason", "TEXT"),
    ("destinations", "display_name", "TEXT"),
    ("destinations", "channel_type", "TEXT"),
    ("destinations", "platform_id", "TEXT"),
    ("destinations", "agent_group_id", "TEXT"),
    ("session_routing", "channel_type", "TEXT"),
    ("session_routing", "platform_id", "TEXT"),
    ("session_routing", "thread_id", "TEXT"),
    ("runner_state", "pid", "INTEGER"),
    ("runner_state", "provider", "TEXT"),
    ("runner_state", "current_tool", "TEXT"),
    ("runner_state", "waiting_on", "TEXT"),
    ("runner_state", "last_event", "TEXT"),
    ("runner_state", "current_batch", "TEXT"),
    ("runner_state", "start_keys_stamp", "INTEGER"),
];

/// Columns of `messages_in`, in the order `MessageIn::read` reads them; the rowid last, the one
/// handle on a row whose id is unreadable.
pub(crate) const IN_COLUMNS: &str =
    "id, seq, kind, timestamp, status, status_changed, process_after, \
     recurrence, series_id, tries, trigger, platform_id, channel_type, thread_id, content, \
     source_session_id, on_wake, rowid";

/// Columns of `messages_out`, in the order `MessageOut::from_row` reads them.
pub(crate) const OUT_COLUMNS: &str =
    "id, seq, in_reply_to, timestamp, deliver_after, kind, platform_id, channel_type, thread_id, content";

/// The `session_state` key that held the batch before it moved into `runner_state`.
const LEGACY_KEY: &str = "current_batch";

/// Migration, when `runner_state.current_batch` was just added to an older DB: the batch an
/// older runner stored as a `session_state` key moves into the column (the sweep then still
/// spares its rows), and the key goes.
pub(crate) fn move_batch_from_session_state_tx(tx: &Transaction<'_>) -> Result<(), Error> {
    tx.execute(
        "UPDATE runner_state SET current_batch =
           (SELECT value FROM session_state WHERE key = ?1) WHERE id = 1",
        [LEGACY_KEY],
    )?;
    tx.execute("DELETE FROM session_state WHERE key = ?1", [LEGACY_KEY])?;
    Ok(())
}

/// `select` (with no WHERE) limited to the `messages_in` rows with `status`, named in the text:
/// SQLite uses the partial status index only for a status it can read in the statement (see
/// `crate::sql::INDEXES`); a bound parameter reads every row ever received.
pub(crate) fn with_status(select: &str, status: InStatus) -> String {
    format!("{select} WHERE status = '{}'", status.as_str())
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use rusqlite::ffi;

    use super::*;
    use crate::rows::{InStatus, NewMessageIn};
    use crate::test_support::older_db;
    use crate::{SessionDb, SweepPolicy};

    /// Completed rows of history in [`with_history`]: a query that scans the table reads
    /// hundreds of pages, one that uses an index a handful.
    const HISTORY: u64 = 10_000;

    /// The most pages one call may read: a full scan of [`HISTORY`] reads far more.
    const PAGES_PER_CALL: i64 = 60;

    /// A DB holding `rows` completed messages and their replies, as after a long life, through
    /// a handle with its own connection (see [`pages_read`]).
    fn with_history(rows: u64) -> (tempfile::TempDir, SessionDb) {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open(dir.path().join("session.db")).unwrap();
        let series = format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows})"
        );
        let ts = "'2026-01-01T00:00:00.000Z'";
        db.dedicated_connection()
            .unwrap()
            .execute_batch(&format!(
                "BEGIN IMMEDIATE;
                 {series} INSERT INTO messages_in (id, seq, kind, timestamp, status, content)
                   SELECT 'old-in-' || i, 2 * i, 'chat', {ts}, 'completed',
                          '{{\"sender\":\"Old\",\"text\":\"an old message, number ' || i || '\"}}'
                   FROM n;
                 {series} INSERT INTO messages_out (id, seq, in_reply_to, timestamp, kind, content)
                   SELECT 'old-out-' || i, 2 * i + 1, 'old-in-' || i, {ts}, 'chat',
                          '{{\"text\":\"an old reply, number ' || i || '\"}}' FROM n;
                 COMMIT;"
            ))
            .unwrap();
        (dir, db.pinned().unwrap())
    }

    /// Pages the pinned connection of `db` fetched while `call` ran (from its cache or the
    /// file): what a query reads, whatever the OS caches.
    fn pages_read(db: &SessionDb, call: impl FnOnce()) -> i64 {
        let count = || {
            let pinned = db.pinned_connection().unwrap();
            let conn = pinned.lock().unwrap();
            [
                ffi::SQLITE_DBSTATUS_CACHE_HIT,
                ffi::SQLITE_DBSTATUS_CACHE_MISS,
            ]
            .into_iter()
            .map(|status| {
                let (mut current, mut highest) = (0, 0);
                // SAFETY: the handle is open while `conn` is held, and both outputs are
                // plain integers that outlive the call.
                let rc = unsafe {
                    ffi::sqlite3_db_status(conn.handle(), status, &mut current, &mut highest, 0)
                };
                assert_eq!(rc, ffi::SQLITE_OK);
                i64::from(current)
            })
            .sum::<i64>()
        };
        let before = count();
        call();
        count() - before
    }

    #[test]
    fn the_status_and_series_indexes_hold_open_rows_only() {
        let (_dir, db) = with_history(100);
        let conn = db.dedicated_connection().unwrap();
        for (table, index) in OPEN_ROWS_INDEXES {
            let partial = crate::db::index_partial(&conn, table, index)
                .unwrap()
                .unwrap();
            assert!(partial, "{index} holds every row");
        }
        // The entries on the indexes' pages (interior and leaf): none for the 100 completed
        // rows, which whole indexes hold one each.
        let entries: i64 = conn
            .query_row(
                "SELECT coalesce(sum(ncell), 0) FROM dbstat
                 WHERE name IN ('idx_messages_in_pending', 'idx_messages_in_series')",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(entries, 0);
    }

    #[test]
    fn an_older_db_gets_its_whole_indexes_rebuilt_partial() {
        let dir = tempfile::tempdir().unwrap();
        let db = older_db(
            &dir,
            &format!(
                "{SCHEMA}
                 CREATE INDEX idx_messages_in_pending ON messages_in(status, seq);
                 CREATE INDEX idx_messages_in_series ON messages_in(series_id, status);
                 INSERT INTO messages_in (id, seq, kind, timestamp, status, content)
                   VALUES ('a', 2, 'chat', '2026-01-01T00:00:00.000Z', 'pending', '{{}}')"
            ),
        );
        let conn = db.dedicated_connection().unwrap();
        let partial: Vec<(String, bool)> = conn
            .prepare("SELECT name, partial FROM pragma_index_list('messages_in') ORDER BY name")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let ours: Vec<_> = partial
            .iter()
            .filter(|(name, _)| name.starts_with("idx_"))
            .collect();
        assert_eq!(
            ours,
            [
                &("idx_messages_in_pending".to_owned(), true),
                &("idx_messages_in_series".to_owned(), true)
            ]
        );
        // The row is still found by the poll, through the rebuilt index.
        let eligible = db.eligible(Utc::now(), false, 10).unwrap();
        assert_eq!(eligible.rows.len(), 1);
    }

    /// Every call that finds `messages_in` rows by status or series reads a few pages, never
    /// the table: a completed row is in no status index, so a query SQLite cannot prove to
    /// ask for open rows only (`status IN (…)`, say) would scan every row ever received.
    #[test]
    fn calls_by_status_or_series_read_a_few_pages_after_a_long_history() {
        let (_dir, db) = with_history(HISTORY);
        let now = Utc::now();
        let mut task = NewMessageIn::new("task", r#"{"prompt":"report"}"#);
        task.series_is_self = true;
        task.process_after = Some("2030-01-01T00:00:00.000Z".to_owned());
        task.recurrence = Some("0 9 * * *".to_owned());
        let task = db.insert_in(&task).unwrap().id;
        let chat = db
            .insert_in(&NewMessageIn::new("chat", r#"{"text":"hi"}"#))
            .unwrap()
            .id;
        let mut largest = Vec::new();
        let mut check = |name: &str, call: &mut dyn FnMut()| {
            let pages = pages_read(&db, call);
            largest.push((pages, name.to_owned()));
        };
        check("eligible", &mut || {
            assert_eq!(db.eligible(now, false, 100).unwrap().rows.len(), 1);
        });
        check("counts", &mut || {
            assert_eq!(db.counts(now).unwrap().pending, 2);
        });
        check("next_due", &mut || {
            db.next_due().unwrap().unwrap();
        });
        check("next_due_after", &mut || {
            db.next_due_after(now).unwrap().unwrap();
        });
        check("work", &mut || {
            assert!(db.work(now).unwrap().due_since.is_some());
        });
        check("messages_in_with_status", &mut || {
            assert_eq!(
                db.messages_in_with_status(InStatus::Pending).unwrap().len(),
                2
            );
        });
        check("task_series", &mut || {
            assert_eq!(db.task_series().unwrap().len(), 1);
        });
        check("task", &mut || {
            db.task(&task).unwrap();
        });
        check("pause_task", &mut || {
            db.pause_task(&task).unwrap();
        });
        check("resume_task", &mut || {
            db.resume_task(&task, now).unwrap();
        });
        check("take_answer", &mut || {
            assert!(db.take_answer("no-such-question").unwrap().is_none());
        });
        check("claim", &mut || {
            assert_eq!(db.claim(std::slice::from_ref(&chat)).unwrap().len(), 1);
        });
        check("sweep", &mut || {
            db.sweep(&SweepPolicy::default(), now).unwrap();
        });
        check("release", &mut || {
            assert_eq!(db.release(std::slice::from_ref(&chat)).unwrap(), 1);
        });
        check("complete", &mut || {
            db.complete(std::slice::from_ref(&chat), &[]).unwrap();
        });
        check("reset_processing", &mut || {
            db.reset_processing().unwrap();
        });
        largest.sort();
        let (pages, name) = largest.last().unwrap();
        assert!(
            *pages <= PAGES_PER_CALL,
            "{name} read {pages} pages with {HISTORY} completed rows (pages per call: {largest:?})"
        );
    }
}
