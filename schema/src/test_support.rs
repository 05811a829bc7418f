//! Helpers shared by this crate's unit tests.

use crate::SessionDb;

/// The one integer `sql` selects on `conn` (a count, in these tests).
pub(crate) fn count(conn: &rusqlite::Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// A DB made by an older version (`sql` run on a bare file in `dir`), then opened as today's
/// code opens it.
pub(crate) fn older_db(dir: &tempfile::TempDir, sql: &str) -> SessionDb {
    let path = dir.path().join("session.db");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(sql)
        .unwrap();
    SessionDb::open(&path).unwrap()
}
