//! `session_state`: the key-value table, the providers' continuations stored in it, and the
//! keys a query starts from, kept in memory while nothing writes them ([`StartKeys`]).

use std::sync::Arc;

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, Transaction};

use crate::control::{MODEL_KEY, MODEL_PREVIOUS_KEY};
use crate::reads::Reads;
use crate::rows::lossy_text;
use crate::time::now_ts;
use crate::{Error, SessionDb};

/// Session-state key of a provider's continuation.
pub fn continuation_key(provider: &str) -> String {
    format!("continuation:{provider}")
}

impl SessionDb {
    /// A session_state value.
    pub fn state(&self, key: &str) -> Result<Option<String>, Error> {
        read_state(&*self.conn()?, key)
    }

    /// Sets a session_state value.
    pub fn set_state(&self, key: &str, value: &str) -> Result<(), Error> {
        self.write(|tx| set_state_tx(tx, key, value))
    }

    /// Deletes a session_state key; true when it existed.
    pub fn delete_state(&self, key: &str) -> Result<bool, Error> {
        self.write(|tx| delete_state_tx(tx, key))
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
}

/// The `session_state` keys every query starts from, as read in one snapshot, with the
/// `runner_state.start_keys_stamp` they were read under.
///
/// Each write to one of these keys gives the stamp a new random value in the same transaction
/// (triggers, whoever writes), so while a later snapshot shows the same stamp the keys are
/// unchanged and [`Reads::start_keys`] returns them without descending `session_state`: with
/// many keys that descent is several page reads at every message, since any other
/// connection's commit empties the reader's page cache (docs/decisions/db.md#D-DB-09).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartKeys {
    provider: String,
    /// `None` when there was no stamp (no runner row yet, or an older row): never reused.
    stamp: Option<i64>,
    /// The provider's continuation ([`continuation_key`]).
    pub continuation: Option<String>,
    /// The model `/model` chose ([`MODEL_KEY`]).
    pub model: Option<String>,
    /// The model before an unconfirmed `/model` ([`MODEL_PREVIOUS_KEY`]).
    pub model_previous: Option<String>,
}

impl Reads<'_> {
    /// A `session_state` value ([`SessionDb::state`]).
    pub fn state(&self, key: &str) -> Result<Option<String>, Error> {
        read_state(self.conn(), key)
    }

    /// The keys a query of `provider` starts from: `known` itself when it was read for the
    /// same provider under the stamp this snapshot shows, else read now.
    pub fn start_keys(
        &self,
        provider: &str,
        known: Option<&Arc<StartKeys>>,
    ) -> Result<Arc<StartKeys>, Error> {
        let stamp = start_keys_stamp(self.conn())?;
        if let Some(known) = known {
            if stamp.is_some() && known.stamp == stamp && known.provider == provider {
                return Ok(Arc::clone(known));
            }
        }
        Ok(Arc::new(StartKeys {
            provider: provider.to_owned(),
            stamp,
            continuation: self.state(&continuation_key(provider))?,
            model: self.state(MODEL_KEY)?,
            model_previous: self.state(MODEL_PREVIOUS_KEY)?,
        }))
    }
}

/// `runner_state.start_keys_stamp`: `None` without a runner row, or when a hand edit left
/// anything but an integer there (the keys are then read every time).
fn start_keys_stamp(conn: &Connection) -> Result<Option<i64>, Error> {
    Ok(conn
        .prepare_cached("SELECT start_keys_stamp FROM runner_state WHERE id = 1")?
        .query_row([], |r| {
            Ok(match r.get_ref(0)? {
                ValueRef::Integer(stamp) => Some(stamp),
                _ => None,
            })
        })
        .optional()?
        .flatten())
}

/// A session_state value, read on `conn` (inside the caller's transaction, when it is one). Any
/// storage type reads as text (a BLOB lossily, a number written out), so a value of the wrong
/// type is a wrong value for its reader to judge, never an error that stops every read of it.
pub(crate) fn read_state(conn: &Connection, key: &str) -> Result<Option<String>, Error> {
    Ok(conn
        .prepare_cached("SELECT value FROM session_state WHERE key = ?1")?
        .query_row([key], |r| r.get_ref(0).map(lossy_text))
        .optional()?
        .flatten())
}

/// Sets a session_state value inside the caller's transaction.
pub(crate) fn set_state_tx(tx: &Transaction<'_>, key: &str, value: &str) -> Result<(), Error> {
    tx.prepare_cached(
        "INSERT INTO session_state (key, value, updated_at) VALUES (?1, ?2, ?3)
         ON CONFLICT(key) DO UPDATE SET value = ?2, updated_at = ?3",
    )?
    .execute(params![key, value, now_ts()])?;
    Ok(())
}

/// Deletes a session_state key inside the caller's transaction; true when it existed.
pub(crate) fn delete_state_tx(tx: &Transaction<'_>, key: &str) -> Result<bool, Error> {
    Ok(tx
        .prepare_cached("DELETE FROM session_state WHERE key = ?1")?
        .execute([key])?
        > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{count, older_db};

    /// `session_state` as an older version made it: a table with rowids beside its key index.
    const OLDER_SESSION_STATE: &str = "CREATE TABLE session_state (key TEXT PRIMARY KEY,
       value TEXT NOT NULL, updated_at TEXT NOT NULL);";

    /// A value of the wrong storage type (a hand edit wrote a BLOB) reads as text: the runner's
    /// query start, which reads the session's model, is not stopped by it.
    #[test]
    fn a_value_of_any_storage_type_reads_as_text() {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open(dir.path().join("session.db")).unwrap();
        let conn = db.dedicated_connection().unwrap();
        conn.execute_batch(
            "INSERT INTO session_state VALUES ('model', x'6f70757300ff', '2026-01-01T00:00:00.000Z');
             INSERT INTO session_state VALUES ('n', 42, '2026-01-01T00:00:00.000Z');",
        )
        .unwrap();
        assert_eq!(
            db.state("model").unwrap().as_deref(),
            Some("opus\0\u{fffd}")
        );
        assert_eq!(db.state("n").unwrap().as_deref(), Some("42"));
        assert_eq!(db.state("absent").unwrap(), None);
    }

    /// Whether `session_state` on `conn` has rowids (a table beside a key index).
    fn has_rowids(conn: &Connection) -> bool {
        conn.prepare("SELECT rowid FROM session_state").is_ok()
    }

    /// A new DB keeps `session_state` in one B-tree keyed on `key`: a read after another
    /// connection's commit (which empties this one's page cache) descends that tree alone, not
    /// a key index and then the table.
    #[test]
    fn a_new_db_keeps_session_state_in_one_tree_keyed_on_key() {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open(dir.path().join("session.db")).unwrap();
        db.set_state("model", "m").unwrap();
        let conn = db.dedicated_connection().unwrap();
        let indexes = count(
            &conn,
            "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'session_state'",
        );
        assert_eq!(indexes, 0, "session_state has a key index beside the table");
        assert!(!has_rowids(&conn), "session_state has rowids");
        assert_eq!(db.state("model").unwrap().as_deref(), Some("m"));
    }

    /// An older DB's `session_state` (a rowid table with a key index) is left as it is and
    /// reads, writes and deletes keys as before.
    #[test]
    fn an_older_session_state_with_rowids_keeps_working() {
        let dir = tempfile::tempdir().unwrap();
        let db = older_db(
            &dir,
            &format!(
                "{OLDER_SESSION_STATE}
                 INSERT INTO session_state VALUES ('model', 'old', '2026-01-01T00:00:00.000Z');"
            ),
        );
        assert!(has_rowids(&db.dedicated_connection().unwrap()));
        assert_eq!(db.state("model").unwrap().as_deref(), Some("old"));
        db.set_state("model", "new").unwrap();
        db.set_continuation("codex", "thread-1").unwrap();
        assert_eq!(db.state("model").unwrap().as_deref(), Some("new"));
        assert_eq!(
            db.continuation("codex").unwrap().as_deref(),
            Some("thread-1")
        );
        assert!(db.delete_state("model").unwrap());
        assert_eq!(db.state("model").unwrap(), None);
    }

    /// A DB with a runner row, as after the runner's start.
    fn with_runner(dir: &tempfile::TempDir) -> SessionDb {
        let db = SessionDb::open(dir.path().join("session.db")).unwrap();
        db.set_runner_state(crate::RunnerStatus::Idle, Some(1), Some("codex"))
            .unwrap();
        db
    }

    fn stamp(db: &SessionDb) -> Option<i64> {
        start_keys_stamp(&db.dedicated_connection().unwrap()).unwrap()
    }

    fn start_keys(
        db: &SessionDb,
        provider: &str,
        known: Option<&Arc<StartKeys>>,
    ) -> Arc<StartKeys> {
        db.read_in(|reads| reads.start_keys(provider, known))
            .unwrap()
    }

    /// Asserts that `keys`, passed as known, are not kept but read again.
    fn assert_read_again(db: &SessionDb, keys: &Arc<StartKeys>) {
        assert!(!Arc::ptr_eq(keys, &start_keys(db, "codex", Some(keys))));
    }

    /// Every way a start key can change gives the stamp a new value, whoever writes it (the
    /// writes below go through a connection of their own, as a hand edit would); other keys
    /// leave it as it is.
    #[test]
    fn every_write_to_a_start_key_gives_a_new_stamp_and_other_keys_keep_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = with_runner(&dir);
        let shell = db.dedicated_connection().unwrap();
        let ts = "'2026-01-01T00:00:00.000Z'";
        // The keys by the constants the runner reads them by: the triggers name them too.
        let continuation = continuation_key("codex");
        let changes = [
            format!("INSERT INTO session_state VALUES ('{continuation}', 't1', {ts})"),
            format!("INSERT INTO session_state VALUES ('{MODEL_KEY}', 'm', {ts})"),
            format!("INSERT INTO session_state VALUES ('{MODEL_PREVIOUS_KEY}', '', {ts})"),
            format!(
                "INSERT INTO session_state VALUES ('model', 'n', {ts})
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value"
            ),
            "UPDATE session_state SET value = 't2' WHERE key = 'continuation:codex'".to_owned(),
            "UPDATE session_state SET key = 'parked' WHERE key = 'model_previous'".to_owned(),
            "UPDATE session_state SET key = 'continuation:claude' WHERE key = 'parked'".to_owned(),
            "DELETE FROM session_state WHERE key = 'model'".to_owned(),
        ];
        let mut seen = vec![stamp(&db)];
        for change in &changes {
            shell.execute(change, []).unwrap();
            seen.push(stamp(&db));
        }
        assert!(seen.iter().all(Option::is_some), "{seen:?}");
        let mut distinct = seen.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            seen.len(),
            "a write kept the stamp: {seen:?}"
        );
        let before = stamp(&db);
        db.set_state("question:q-1", "{}").unwrap();
        db.set_state("series_paused:t-1", "1").unwrap();
        db.delete_state("question:q-1").unwrap();
        // Deleting a start key that is not there writes nothing.
        db.delete_state("model").unwrap();
        assert_eq!(stamp(&db), before);
        // The runner's own writes go through the same triggers.
        db.set_continuation("codex", "t3").unwrap();
        assert_ne!(stamp(&db), before);
    }

    /// The keys read under a stamp come back as they are (the same `Arc`, nothing read) while
    /// the stamp holds, and are read again once a write moved it.
    #[test]
    fn start_keys_are_kept_while_the_stamp_holds() {
        let dir = tempfile::tempdir().unwrap();
        let db = with_runner(&dir);
        db.set_continuation("codex", "t1").unwrap();
        db.set_state(MODEL_KEY, "m").unwrap();
        let first = start_keys(&db, "codex", None);
        assert_eq!(
            (
                first.continuation.as_deref(),
                first.model.as_deref(),
                first.model_previous.as_deref()
            ),
            (Some("t1"), Some("m"), None)
        );
        // Other rows change meanwhile (a message, a question): the keys are kept.
        db.set_state("question:q-1", "{}").unwrap();
        db.insert_in(&crate::NewMessageIn::new("chat", "{}"))
            .unwrap();
        let again = start_keys(&db, "codex", Some(&first));
        assert!(Arc::ptr_eq(&first, &again));
        // Another provider's keys are not these.
        let other = start_keys(&db, "claude", Some(&first));
        assert_eq!(other.continuation, None);
        // A hand edit moves the stamp: read again.
        db.dedicated_connection()
            .unwrap()
            .execute(
                "UPDATE session_state SET value = 'm2' WHERE key = 'model'",
                [],
            )
            .unwrap();
        let edited = start_keys(&db, "codex", Some(&first));
        assert!(!Arc::ptr_eq(&first, &edited));
        assert_eq!(edited.model.as_deref(), Some("m2"));
        // Anything but an integer in the column (a hand edit) means no stamp: never kept.
        db.dedicated_connection()
            .unwrap()
            .execute("UPDATE runner_state SET start_keys_stamp = 'x'", [])
            .unwrap();
        let unstamped = start_keys(&db, "codex", None);
        assert_read_again(&db, &unstamped);
    }

    /// An older DB's `runner_state` gets the stamp column and the triggers on open. Until the
    /// runner's start stamps its row the keys are read every time.
    #[test]
    fn an_older_runner_row_is_stamped_by_the_runners_start() {
        let dir = tempfile::tempdir().unwrap();
        let db = older_db(
            &dir,
            &format!(
                "{OLDER_SESSION_STATE}
             CREATE TABLE runner_state (id INTEGER PRIMARY KEY CHECK (id = 1),
               status TEXT NOT NULL, heartbeat_at TEXT NOT NULL, updated_at TEXT NOT NULL);
             INSERT INTO runner_state VALUES (1, 'idle', '2026-01-01T00:00:00.000Z',
               '2026-01-01T00:00:00.000Z');
             INSERT INTO session_state VALUES ('model', 'm', '2026-01-01T00:00:00.000Z');"
            ),
        );
        assert_eq!(stamp(&db), None);
        let unstamped = start_keys(&db, "codex", None);
        assert_eq!(unstamped.model.as_deref(), Some("m"));
        assert_read_again(&db, &unstamped);
        db.set_runner_state(crate::RunnerStatus::Idle, Some(1), Some("codex"))
            .unwrap();
        let stamped = stamp(&db);
        assert!(stamped.is_some());
        // A later status change keeps the stamp; a key's write moves it.
        db.set_runner_state(crate::RunnerStatus::Busy, None, None)
            .unwrap();
        assert_eq!(stamp(&db), stamped);
        db.set_state(MODEL_KEY, "n").unwrap();
        assert_ne!(stamp(&db), stamped);
    }
}
