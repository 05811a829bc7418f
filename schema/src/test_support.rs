//! Helpers shared by this crate's unit tests.

use crate::SessionDb;

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
