//! The session DB contract (docs/contract/db.md, content.md) shared by the host, the runner and
//! mcp-tools: schema, pragmas, typed rows, seq allocation, claims and completions, and change
//! notification. No other crate writes SQL for these tables.
//!
//! Map (the map of the whole code is ARCHITECTURE.md): tables, triggers and indexes (`sql.rs`),
//! typed rows (`rows.rs`), content shapes (`content.rs`), timestamps (`time.rs`), cron
//! (`cron.rs`), change notification (`watch.rs`, `watch/`), the health verdict (`health.rs`, a
//! read-only connection of its own), and the queries as topical `impl SessionDb` files: `db.rs`
//! (opening: pragmas, SQL functions, migrations, the pool, the `BEGIN IMMEDIATE` write,
//! `with_lock_wait`), `checkpoint.rs` (WAL checkpoints off the commit path), `messages.rs`
//! (both message tables, seq allocation), `queue.rs` (poll, claim, release, startup reset,
//! unusable rows, due times, counts), `completion.rs` (replies + completion, next occurrences),
//! `batch.rs` (the runner state around a query), `runner_state.rs`, `state.rs`
//! (`session_state`, continuations, the keys a query starts from), `reads.rs` (reads sharing one
//! transaction), `questions.rs`, `sweep.rs` (the host's retry policy), `destinations.rs`,
//! `delivered.rs`, `tasks.rs` (task series), `routing.rs` (destination routing), `status.rs`
//! (what `nanoclaw status` reads), `usage.rs` (the `turn_usage` ledger, written only in the
//! transaction of a turn's completion or `query_error` row, and its queries), `control.rs`
//! (the host's interrupt row, the `/model` key), `idempotency.rs` (the API's idempotency keys).
//!
//! Rules of every connection: `busy_timeout` first, then WAL, `synchronous=NORMAL`,
//! `foreign_keys=ON`; 64 cached statements with query-planner stability (QPSG), so a new bound
//! value never re-prepares a statement. Only the first connection of `SessionDb::open` may create
//! the file, so a DB deleted under a running process stays deleted. `eligible` applies every gate
//! in SQL (pending, due, `on_wake` only on the first poll, not an answer to an open question) and
//! the limit last. A pinned handle (`SessionDb::pinned`) runs its calls on a connection of its
//! own while that is free; its watcher ignores its own commits.

mod batch;
mod checkpoint;
mod completion;
pub mod content;
pub mod control;
pub mod cron;
pub mod db;
mod delivered;
mod destinations;
pub mod health;
pub mod idempotency;
mod messages;
mod questions;
mod queue;
mod reads;
pub mod routing;
pub mod rows;
mod runner_state;
mod sql;
mod state;
mod status;
mod sweep;
pub mod tasks;
#[cfg(test)]
mod test_support;
pub mod time;
pub mod usage;
pub mod watch;

pub use completion::Completion;
pub use content::{
    Attachment, ChatContent, ChatSdkContent, FieldProblem, InboundContent, QuestionAnswer,
    TaskContent, WebhookContent,
};
pub use db::{OpenOptions, SessionDb};
pub use destinations::find_destination;
pub use idempotency::IdempotentInsert;
pub use queue::{read_work, ClaimStarted, Eligible, QueueCounts, Work};
pub use reads::Reads;
pub use routing::DestinationRoute;
pub use rows::*;
pub use state::{continuation_key, StartKeys};
pub use sweep::{SweepPolicy, SweepReport};
pub use usage::{
    day_window, Figure, NewTurnUsage, UsageGroup, UsageGroupRow, UsageOutcome, UsageTotals,
};
pub use watch::{Alarm, DbWatcher, WatchMode};

use std::path::PathBuf;

/// Everything that can go wrong talking to the session DB.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// SQLite failed (locked, corrupt, constraint, ...).
    #[error("session DB: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The DB file could not be opened as a SQLite database (not a database, unreadable).
    #[error("cannot open the session DB {}: {cause}", path.display())]
    Open {
        /// The DB file.
        path: PathBuf,
        /// What SQLite said (not a `source`: its own chain repeats the same words).
        cause: rusqlite::Error,
    },
    /// No connection could be had from the pool.
    #[error("session DB connection pool: {0}")]
    Pool(#[from] r2d2::Error),
    /// The DB's folder does not exist.
    #[error("the folder of the session DB does not exist: {0}")]
    MissingDirectory(PathBuf),
    /// A timestamp in none of the accepted forms.
    #[error("bad timestamp {value:?}: {reason}")]
    BadTimestamp {
        /// The text.
        value: String,
        /// Why.
        reason: String,
    },
    /// An invalid cron expression.
    #[error("bad cron expression {expr:?}: {reason}")]
    BadCron {
        /// The expression.
        expr: String,
        /// Why.
        reason: String,
    },
    /// No seq is left: the next one of the wanted parity would pass `i64::MAX`. Allocation
    /// refuses rather than wrap to a negative number (which would also collide later).
    #[error(
        "no seq left in the session DB: the highest seq is {max} and seqs stop at {}; \
         start a new session DB",
        i64::MAX
    )]
    SeqExhausted {
        /// The highest seq found in either table.
        max: i64,
    },
    /// An unknown IANA time zone.
    #[error("unknown time zone {0:?} (expected an IANA name like America/New_York)")]
    BadTimeZone(String),
    /// JSON (de)serialization of a stored value failed.
    #[error("session DB JSON value: {0}")]
    Json(#[from] serde_json::Error),
    /// A named row does not exist.
    #[error("{0}")]
    NotFound(String),
    /// An I/O error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The DB's folder is on a shared filesystem (9p, virtiofs, FUSE, NFS, SMB, ...): refused
    /// before anything is opened or created (`fsguard::refuse_shared_filesystem`).
    #[error(transparent)]
    SharedFilesystem(#[from] fsguard::SharedFilesystem),
}

/// The shared-filesystem refusal `err` is or carries, if any: what the binaries look for in an
/// error's chain to exit with [`fsguard::SHARED_FILESYSTEM_EXIT`]. It sees through this crate's
/// [`Error`] and [`health::Unhealthy`], which show the refusal as their own message.
pub fn shared_filesystem<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a fsguard::SharedFilesystem> {
    if let Some(refused) = err.downcast_ref::<fsguard::SharedFilesystem>() {
        return Some(refused);
    }
    match err.downcast_ref::<Error>() {
        Some(Error::SharedFilesystem(refused)) => return Some(refused),
        Some(_) => return None,
        None => {}
    }
    match err.downcast_ref::<health::Unhealthy>() {
        Some(health::Unhealthy::SharedFilesystem(refused)) => Some(refused),
        _ => None,
    }
}

impl Error {
    /// True when a call gave up waiting for another connection's lock (`SQLITE_BUSY` or
    /// `SQLITE_LOCKED`): after the busy timeout, or the wait [`db::with_lock_wait`] set.
    pub fn is_busy(&self) -> bool {
        match self {
            Error::Sqlite(err) => matches!(
                err.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
            _ => false,
        }
    }

    /// True when a write broke a constraint (a row id that exists already).
    pub fn is_constraint(&self) -> bool {
        match self {
            Error::Sqlite(err) => matches!(
                err.sqlite_error_code(),
                Some(rusqlite::ErrorCode::ConstraintViolation)
            ),
            _ => false,
        }
    }

    /// True when a write failed for lack of space: `SQLITE_FULL` (the file system returned
    /// ENOSPC, or `max_page_count` was reached), or an I/O error saying the storage is full.
    /// Writers wait for space on it instead of giving up (docs/decisions/db.md#D-DB-02).
    /// A quota (EDQUOT) reaches SQLite as `SQLITE_IOERR_WRITE`, which is indistinguishable from
    /// a failing disk, so it is not counted here.
    pub fn is_disk_full(&self) -> bool {
        match self {
            Error::Sqlite(err) => err.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull),
            Error::Io(err) => matches!(
                err.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            ),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {

    use super::Error;

    #[test]
    fn a_write_past_max_page_count_is_disk_full_and_other_errors_are_not() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x BLOB); PRAGMA max_page_count = 3;")
            .unwrap();
        let full = conn
            .execute("INSERT INTO t VALUES (zeroblob(100000))", [])
            .unwrap_err();
        assert!(Error::from(full).is_disk_full());
        let syntax = conn
            .execute("INSERT INTO nowhere VALUES (1)", [])
            .unwrap_err();
        assert!(!Error::from(syntax).is_disk_full());
        let io = std::io::Error::from(std::io::ErrorKind::StorageFull);
        assert!(Error::from(io).is_disk_full());
        assert!(!Error::NotFound("x".into()).is_disk_full());
    }

    #[test]
    fn the_shared_filesystem_refusal_is_found_through_each_wrapper() {
        let refused = fsguard::SharedFilesystem {
            db: "/mnt/s/session.db".into(),
            folder: "/mnt/s".into(),
            fs_name: "virtiofs".into(),
            kind: fsguard::SharedKind::VmShare,
            mount_point: Some("/mnt/s".into()),
        };
        let as_error = Error::from(refused.clone());
        let as_unhealthy = crate::health::Unhealthy::from(refused.clone());
        // Each shows the refusal's own words, once.
        assert_eq!(as_error.to_string(), refused.to_string());
        assert_eq!(as_unhealthy.to_string(), refused.to_string());
        for err in [
            &refused as &(dyn std::error::Error + 'static),
            &as_error,
            &as_unhealthy,
        ] {
            assert_eq!(super::shared_filesystem(err), Some(&refused));
        }
        assert_eq!(super::shared_filesystem(&Error::NotFound("x".into())), None);
        let other = crate::health::Unhealthy::NoRunner {
            path: "/mnt/s/session.db".into(),
        };
        assert_eq!(super::shared_filesystem(&other), None);
    }
}
