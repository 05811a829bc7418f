//! `session_state`: the key-value table, and the providers' continuations stored in it.

use rusqlite::{params, Connection, OptionalExtension, Transaction};

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
    use crate::test_support::older_db;

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
        let indexes: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'session_state'",
                [],
                |r| r.get(0),
            )
            .unwrap();
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
            "CREATE TABLE session_state (key TEXT PRIMARY KEY, value TEXT NOT NULL,
               updated_at TEXT NOT NULL);
             INSERT INTO session_state VALUES ('model', 'old', '2026-01-01T00:00:00.000Z');",
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
}
