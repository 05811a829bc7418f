//! The session DB seen from async tools: every rusqlite call runs on the blocking pool, never on
//! the reactor, and at most as many run at once as the pool has connections (so 200 concurrent
//! calls queue here instead of parking 200 threads on the pool).

use std::sync::Arc;

use schema::SessionDb;
use tokio::sync::Semaphore;

use crate::error::{ToolError, ToolResult};

/// DB calls at once, and connections in the pool (`main.rs` opens the DB with as many). The
/// server serves one client, whose calls each take well under a millisecond of DB time; every
/// extra connection, and the blocking thread that would use it, costs resident memory (its
/// stack, its SQLite page cache, its malloc arena) for concurrency that one client never uses
/// (issue 12: RSS ≤ 8 MiB after 1,000 pipelined calls).
pub const DB_CONCURRENCY: usize = 2;

/// Page cache per connection, KiB (SQLite's default is 2,000). The tools read a few rows at
/// a time, and writes by the runner in between empty the cache anyway; without a bound each
/// connection keeps every page it ever touched (issue 12).
pub const DB_CACHE_KIB: u32 = 64;

/// A [`SessionDb`] with an async front.
#[derive(Clone)]
pub struct Db {
    db: SessionDb,
    permits: Arc<Semaphore>,
}

impl Db {
    /// Wraps `db`, allowing `concurrency` blocking calls at once.
    pub fn new(db: SessionDb, concurrency: usize) -> Self {
        Self {
            db,
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
        }
    }

    /// The underlying handle (for blocking code).
    pub fn session(&self) -> &SessionDb {
        &self.db
    }

    /// Runs `f` with the DB on the blocking pool.
    pub async fn run<T, F>(&self, f: F) -> ToolResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&SessionDb) -> ToolResult<T> + Send + 'static,
    {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|err| ToolError::Internal(err.to_string()))?;
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db))
            .await
            .map_err(|err| ToolError::Internal(format!("DB task failed: {err}")))?
    }
}
