//! Reads that share one transaction: a read transaction of their own
//! ([`SessionDb::read_in`]) or the claim's write ([`SessionDb::claim_starting`]).

use rusqlite::Connection;

use crate::rows::{Destination, MessageOut};
use crate::{DestinationRoute, Error, SessionDb};

/// Reads inside one transaction: each sees the same snapshot, and SQLite takes its shared
/// locks once for all of them instead of once per statement (two `fcntl` calls each).
pub struct Reads<'c> {
    conn: &'c Connection,
}

impl<'c> Reads<'c> {
    /// Reads on `conn`, which is inside a transaction.
    pub(crate) fn new(conn: &'c Connection) -> Self {
        Self { conn }
    }

    /// The connection, inside the transaction.
    pub(crate) fn conn(&self) -> &'c Connection {
        self.conn
    }

    /// Every destination, by name ([`SessionDb::destinations`]).
    pub fn destinations(&self) -> Result<Vec<Destination>, Error> {
        crate::destinations::destinations_in(self.conn)
    }

    /// The highest seq of both message tables ([`SessionDb::max_seq`]).
    pub fn max_seq(&self) -> Result<i64, Error> {
        crate::messages::highest_seq(self.conn)
    }

    /// The highest seq of `messages_out` (0 when none): every row written from here on has a
    /// higher one, so it marks what a turn sends from its start
    /// ([`Reads::messages_out_after`]).
    pub fn max_out_seq(&self) -> Result<i64, Error> {
        crate::messages::highest_out_seq(self.conn)
    }

    /// `messages_out` rows with seq above `after` ([`SessionDb::messages_out_after`]).
    pub fn messages_out_after(&self, after: i64, limit: usize) -> Result<Vec<MessageOut>, Error> {
        crate::messages::messages_out_after_in(self.conn, after, limit)
    }

    /// The rows among `ids` that a `chat` or `chat-sdk` row of `messages_out` answers (its
    /// `in_reply_to`), in no particular order: what a stopped turn delivered to each of its
    /// prompts (`system` rows, progress and the like, answer nothing).
    pub fn answered(&self, ids: &[String]) -> Result<Vec<String>, Error> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = serde_json::to_string(ids)?;
        let mut stmt = self.conn.prepare_cached(
            "SELECT DISTINCT in_reply_to FROM messages_out
             WHERE in_reply_to IN (SELECT value FROM json_each(?1)) AND kind <> 'system'",
        )?;
        let rows = stmt.query_map([ids], |row| row.get::<_, String>(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Where a message to the destination `name` goes ([`SessionDb::route_to_destination`]).
    pub fn route_to_destination(
        &self,
        name: &str,
        batch: &[String],
        batch_reply: Option<&str>,
    ) -> Result<DestinationRoute, Error> {
        crate::routing::route_in(self.conn, name, batch, batch_reply)
    }
}

impl SessionDb {
    /// Runs `f` with reads that share one read transaction, on the pinned connection when it
    /// is free. The transaction ends however `f` ends (an error or a panic included).
    pub fn read_in<T>(&self, f: impl FnOnce(&Reads<'_>) -> Result<T, Error>) -> Result<T, Error> {
        // A connection handed out is never inside a transaction: the pinned one only when its
        // lock is free, pooled ones after their transactions ended.
        let conn = self.conn()?;
        // Cached statements: `BEGIN`/`COMMIT` are not parsed again at every call.
        conn.prepare_cached("BEGIN")?.execute([])?;
        /// Ends the read transaction when dropped.
        struct End<'c>(&'c Connection);
        impl Drop for End<'_> {
            fn drop(&mut self) {
                let ended = self
                    .0
                    .prepare_cached("COMMIT")
                    .and_then(|mut stmt| stmt.execute([]));
                if let Err(err) = ended {
                    // A read transaction has nothing to lose: roll it back.
                    tracing::debug!(%err, "ending a read transaction failed; rolling it back");
                    let _ = self.0.execute_batch("ROLLBACK");
                }
            }
        }
        let _end = End(&conn);
        f(&Reads::new(&conn))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use crate::{Error, SessionDb};

    /// The reads share one snapshot (a commit made meanwhile by another connection is not seen
    /// by the later reads), on the pinned connection, and the transaction ends however `f`
    /// ends.
    #[test]
    fn reads_share_one_snapshot_and_the_transaction_always_ends() {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open(dir.path().join("session.db")).unwrap();
        let pinned = db.pinned().unwrap();
        db.set_state("k", "before").unwrap();
        let pinned_conn = pinned.pinned_connection().unwrap();
        let in_transaction = || !pinned_conn.lock().unwrap().is_autocommit();

        let seen = pinned
            .read_in(|reads| {
                let first = reads.state("k")?;
                db.set_state("k", "after").unwrap();
                Ok((first, reads.state("k")?, db.state("k")?))
            })
            .unwrap();
        assert_eq!(
            seen,
            (
                Some("before".to_owned()),
                Some("before".to_owned()),
                Some("after".to_owned())
            )
        );
        assert!(!in_transaction(), "the read transaction was left open");
        assert_eq!(pinned.state("k").unwrap().as_deref(), Some("after"));

        let failed: Result<(), Error> = pinned.read_in(|reads| {
            reads.state("k")?;
            Err(Error::MissingDirectory("f failed".into()))
        });
        assert!(failed.is_err());
        assert!(
            !in_transaction(),
            "a failed f left the read transaction open"
        );

        // Without a pinned connection the reads share a pooled connection's transaction.
        let seen = db
            .read_in(|reads| {
                let first = reads.state("k")?;
                pinned.set_state("k", "later").unwrap();
                Ok((first, reads.state("k")?))
            })
            .unwrap();
        assert_eq!(seen.0, seen.1);
        assert_eq!(db.state("k").unwrap().as_deref(), Some("later"));
    }
}
