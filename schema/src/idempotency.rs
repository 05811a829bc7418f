//! `api_idempotency`: the keys of `nanoclaw serve`'s idempotent inserts (docs/contract/api.md,
//! db.md). A key is stored in the transaction that inserts its row, so a retried request finds
//! either both or neither, across restarts of the server.

use chrono::{DateTime, Utc};
use rusqlite::{params, OptionalExtension};

use crate::messages::insert_in_tx;
use crate::rows::{Inserted, NewMessageIn};
use crate::time::format_ts;
use crate::{Error, SessionDb};

/// How long a key is kept: a retry later than this inserts again.
pub const KEEP_KEYS: chrono::Duration = chrono::Duration::days(7);

/// What an idempotent insert did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotentInsert {
    /// The key was new: the row was inserted and the key stored with `response`.
    Inserted {
        /// The new row.
        inserted: Inserted,
        /// The response stored with the key.
        response: String,
    },
    /// The key was there with the same fingerprint: nothing was written.
    Replayed {
        /// The response stored the first time.
        response: String,
    },
    /// The key was there with another fingerprint (another request body): nothing was written.
    Reused,
}

impl SessionDb {
    /// Inserts `row` unless `key` was used before (within [`KEEP_KEYS`] of `now`), in one
    /// transaction: a new key is stored with `fingerprint` and the response `respond` builds
    /// from the inserted row. Keys older than [`KEEP_KEYS`] are deleted first.
    pub fn insert_in_idempotent(
        &self,
        row: &NewMessageIn,
        key: &str,
        fingerprint: &str,
        now: DateTime<Utc>,
        respond: impl FnOnce(&Inserted) -> String,
    ) -> Result<IdempotentInsert, Error> {
        self.write(|tx| {
            tx.prepare_cached("DELETE FROM api_idempotency WHERE created_at < ?1")?
                .execute([format_ts(now - KEEP_KEYS)])?;
            let stored: Option<(String, String)> = tx
                .prepare_cached(
                    "SELECT fingerprint, response FROM api_idempotency WHERE key = ?1",
                )?
                .query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            if let Some((stored_fingerprint, response)) = stored {
                return Ok(if stored_fingerprint == fingerprint {
                    IdempotentInsert::Replayed { response }
                } else {
                    IdempotentInsert::Reused
                });
            }
            let inserted = insert_in_tx(tx, row)?;
            let response = respond(&inserted);
            tx.prepare_cached(
                "INSERT INTO api_idempotency (key, fingerprint, message_id, seq, response, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                key,
                fingerprint,
                inserted.id,
                inserted.seq,
                response,
                format_ts(now)
            ])?;
            Ok(IdempotentInsert::Inserted { inserted, response })
        })
    }

    /// The number of stored idempotency keys.
    pub fn idempotency_keys(&self) -> Result<i64, Error> {
        let conn = self.conn()?;
        Ok(conn.query_row("SELECT COUNT(*) FROM api_idempotency", [], |r| r.get(0))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::older_db;

    fn temp_db() -> (tempfile::TempDir, SessionDb) {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open(dir.path().join("session.db")).unwrap();
        (dir, db)
    }

    fn row() -> NewMessageIn {
        NewMessageIn::new("chat", r#"{"text":"hi"}"#)
    }

    #[test]
    fn a_key_inserts_once_then_replays_or_refuses() {
        let (_dir, db) = temp_db();
        let now = Utc::now();
        let first = db
            .insert_in_idempotent(&row(), "k1", "f1", now, |i| format!("{}", i.seq))
            .unwrap();
        let IdempotentInsert::Inserted { inserted, response } = first else {
            panic!("{first:?}")
        };
        assert_eq!(response, inserted.seq.to_string());
        let again = db
            .insert_in_idempotent(&row(), "k1", "f1", now, |_| unreachable!())
            .unwrap();
        assert_eq!(again, IdempotentInsert::Replayed { response });
        let other = db
            .insert_in_idempotent(&row(), "k1", "f2", now, |_| unreachable!())
            .unwrap();
        assert_eq!(other, IdempotentInsert::Reused);
        assert_eq!(db.max_seq().unwrap(), inserted.seq);
    }

    #[test]
    fn keys_older_than_a_week_are_pruned() {
        let (_dir, db) = temp_db();
        let then = Utc::now() - chrono::Duration::days(8);
        db.insert_in_idempotent(&row(), "old", "f", then, |_| String::new())
            .unwrap();
        assert_eq!(db.idempotency_keys().unwrap(), 1);
        let now = Utc::now();
        let out = db
            .insert_in_idempotent(&row(), "old", "f", now, |_| "new".into())
            .unwrap();
        assert!(matches!(out, IdempotentInsert::Inserted { .. }), "{out:?}");
        assert_eq!(db.idempotency_keys().unwrap(), 1);
    }

    #[test]
    fn an_older_db_gains_the_table_and_the_delivery_reason() {
        let dir = tempfile::tempdir().unwrap();
        let db = older_db(
            &dir,
            "CREATE TABLE delivered (message_out_id TEXT PRIMARY KEY, platform_message_id TEXT,
               status TEXT NOT NULL DEFAULT 'delivered', delivered_at TEXT NOT NULL);",
        );
        db.record_delivery("o1", None, "failed", Some("platform said 403"))
            .unwrap();
        let delivered = db.delivered("o1").unwrap().unwrap();
        assert_eq!(delivered.reason.as_deref(), Some("platform said 403"));
        assert_eq!(delivered.status, "failed");
        assert_eq!(db.idempotency_keys().unwrap(), 0);
    }
}
