//! The client's errors, by layer: the URL and TLS setup, the connection, the API's own error
//! object, and decoding its answer.

use std::time::Duration;

/// What went wrong talking to `nanoclaw serve`.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not `http://HOST:PORT`, `https://HOST:PORT` or `unix:PATH`.
    #[error(
        "bad URL {url:?}: {reason} (expected http://HOST:PORT, https://HOST:PORT or unix:PATH)"
    )]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The TLS configuration could not be built (an unreadable or empty CA file, no roots), or
    /// the handshake refused the server (a certificate no trusted root signed).
    #[error("TLS: {0}")]
    Tls(String),
    /// The server could not be reached (refused, unreachable, reset mid-handshake). The cause
    /// is in the message, not a `source()`: printed as a chain it would show twice.
    #[error("cannot connect to {target}: {cause} (is `nanoclaw serve` running there?)")]
    Connect {
        /// The address tried.
        target: String,
        /// Why it failed.
        cause: std::io::Error,
    },
    /// The connection broke during the exchange.
    #[error("connection to {target} failed: {cause}")]
    Transport {
        /// The address.
        target: String,
        /// The HTTP layer's error.
        cause: hyper::Error,
    },
    /// No answer within the bound.
    #[error("{target}: no answer to {what} within {after:?}")]
    Timeout {
        /// The address.
        target: String,
        /// The request.
        what: String,
        /// The bound that passed.
        after: Duration,
    },
    /// The API answered with an error status and its `{"error": {"code", "message"}}`.
    #[error("{what}: the server answered {status} {code}: {message}")]
    Api {
        /// The request.
        what: String,
        /// The HTTP status.
        status: u16,
        /// The error code (`bad_request`, `unauthorized`, `not_found`, …; `http_<status>` when
        /// the body was no API error object).
        code: String,
        /// The message: it names the bad field or the fix.
        message: String,
        /// `Retry-After`, when the server sent one (with `503`).
        retry_after: Option<Duration>,
    },
    /// The answer was not the JSON the API promises.
    #[error("decoding the answer to {what}: {reason}")]
    Decode {
        /// The request.
        what: String,
        /// Why it could not be decoded.
        reason: String,
    },
}

impl ClientError {
    /// True for what a retry may cure: no connection, a broken one, no answer in time, or a
    /// `503` (the DB briefly not writable).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::Transport { .. } | Self::Timeout { .. } => true,
            Self::Api { status, .. } => *status == 503,
            Self::BadUrl { .. } | Self::Tls(_) | Self::Decode { .. } => false,
        }
    }

    /// The HTTP status, for an [`ClientError::Api`] error.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}
