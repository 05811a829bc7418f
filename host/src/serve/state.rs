//! What the router's handlers share: the server's [`AppState`], and the small helpers every
//! handler file uses (a bounded echo of untrusted text, the query string). A leaf, so that
//! `auth`, `audit`, `sse` and the handlers import it and not each other.

use std::time::Duration;

use axum::extract::Query;
use axum::http::Uri;
use serde::de::DeserializeOwned;

use super::errors::ApiError;
use super::sessions::{DbCache, Served};
use super::tokens::TokenStore;

/// What every handler shares.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) served: Served,
    pub(crate) dbs: DbCache,
    /// `None` on a unix socket: no token is asked for.
    pub(crate) tokens: Option<TokenStore>,
    pub(crate) max_body: usize,
    pub(crate) body_timeout: Duration,
    pub(crate) keep_alive_every: Duration,
    pub(crate) sse_buffer: usize,
    /// How long an event stream's full buffer may stay full.
    pub(crate) write_timeout: Duration,
    /// How long a request waits for another process's lock on its DB.
    pub(crate) db_lock_wait: Duration,
    /// Turns true at shutdown: event streams end, so connections can close cleanly.
    pub(crate) stopping: tokio::sync::watch::Receiver<bool>,
}

/// At most 80 characters of untrusted text, escaped, for an error message.
pub(crate) fn shorten(text: &str) -> String {
    let escaped = format!("{text:?}");
    if escaped.chars().count() > 80 {
        format!("{}…", escaped.chars().take(80).collect::<String>())
    } else {
        escaped
    }
}

/// The query string as `T` (`400` naming the bad value).
pub(crate) fn query<T: DeserializeOwned>(uri: &Uri) -> Result<T, ApiError> {
    Query::<T>::try_from_uri(uri)
        .map(|Query(value)| value)
        .map_err(|rejection| ApiError::bad_request(format!("bad query: {}", rejection.body_text())))
}
