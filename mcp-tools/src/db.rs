//! The session DB seen from async tools: every rusqlite call runs on the blocking pool, never on
//! the reactor, and at most as many run at once as the pool has connections (so 200 concurrent
//! calls queue here instead of parking 200 threads on the pool).

use std::sync::Arc;

use schema::SessionDb;
use tokio::sync::Semaphore;

use crate::error::{ToolError, ToolResult};

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
