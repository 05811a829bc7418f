//! The session DB contract (SPEC §3, §4) shared by the host, the runner and mcp-tools: schema,
//! pragmas, typed rows, seq allocation, claims and completions, and change notification. No
//! other crate writes SQL for these tables.

pub mod content;
pub mod cron;
pub mod db;
pub mod rows;
mod sql;
pub mod tasks;
pub mod time;
pub mod watch;

pub use content::{
    Attachment, ChatContent, ChatSdkContent, InboundContent, QuestionAnswer, TaskContent,
    WebhookContent,
};
pub use db::{
    continuation_key, Eligible, OpenOptions, QueueCounts, SessionDb, SweepPolicy, SweepReport,
};
pub use rows::*;
pub use watch::DbWatcher;

use std::path::PathBuf;

/// Everything that can go wrong talking to the session DB.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// SQLite failed (locked, corrupt, constraint, ...).
    #[error("session DB: {0}")]
    Sqlite(#[from] rusqlite::Error),
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
    /// An unknown IANA time zone.
    #[error("unknown time zone {0:?} (expected an IANA name like America/New_York)")]
    BadTimeZone(String),
    /// JSON (de)serialization of a stored value failed.
    #[error("session DB JSON value: {0}")]
    Json(#[from] serde_json::Error),
    /// A named row does not exist.
    #[error("{0}")]
    NotFound(String),
    /// File watching failed.
    #[error("watching the session DB folder: {0}")]
    Watch(#[from] notify::Error),
    /// An I/O error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
