//! The time and size bounds of a server, read by the listener, the router and the CLI.

use std::time::Duration;

/// The time and size bounds of a server (docs/contract/api.md#serving).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Request body limit in bytes.
    pub max_body: usize,
    /// Open connections at most.
    pub max_connections: usize,
    /// Request headers (and a TLS handshake) must arrive within this.
    pub header_timeout: Duration,
    /// A request body must arrive within this.
    pub body_timeout: Duration,
    /// A connection that moved no byte this long is closed.
    pub idle_timeout: Duration,
    /// A write the peer takes no byte of this long ends the connection.
    pub write_timeout: Duration,
    /// A keep-alive comment on an event stream at least this often.
    pub keep_alive_every: Duration,
    /// Events buffered per event-stream client before it is dropped.
    pub sse_buffer: usize,
    /// A request waits at most this for another process's lock on its DB, then is `503`
    /// (instead of holding a blocking thread for SQLite's 30 s busy timeout).
    pub db_lock_wait: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body: 1024 * 1024,
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            keep_alive_every: Duration::from_secs(15),
            sse_buffer: 64,
            db_lock_wait: Duration::from_secs(5),
        }
    }
}
