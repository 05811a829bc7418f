//! Who is calling: the bearer token's entry, or the unix socket's owner (the socket's mode is
//! the access control there).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::{header, request::Parts};

use super::errors::ApiError;
use super::state::AppState;
use super::tokens::TokenEntry;

/// The caller of a request.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// The token's name (`socket` on a unix socket): for audit lines only.
    pub(crate) name: String,
    /// The token's scope; `None` on a unix socket (everything).
    entry: Option<TokenEntry>,
}

impl Caller {
    /// True when the caller may see session `name`.
    pub(crate) fn sees(&self, name: &str) -> bool {
        self.entry.as_ref().is_none_or(|entry| entry.sees(name))
    }

    /// Refuses a read-only token a mutating request.
    pub(crate) fn require_write(&self) -> Result<(), ApiError> {
        match &self.entry {
            Some(entry) if entry.read_only => Err(ApiError::forbidden(format!(
                "token {:?} is read-only: this request writes (make a token without --read-only)",
                entry.name
            ))),
            _ => Ok(()),
        }
    }

    /// Refuses a token without `'*'` (creating sessions).
    pub(crate) fn require_all_sessions(&self) -> Result<(), ApiError> {
        self.require_write()?;
        match &self.entry {
            Some(entry) if !entry.sees_all() => Err(ApiError::forbidden(format!(
                "token {:?} is scoped to named sessions: creating one needs a token with --sessions '*'",
                entry.name
            ))),
            _ => Ok(()),
        }
    }
}

impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let Some(tokens) = &state.tokens else {
            return Ok(Self {
                name: "socket".to_owned(),
                entry: None,
            });
        };
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .ok_or_else(ApiError::unauthorized)?;
        // The file is stat'ed (and reread when it changed): blocking, but a stat is short.
        let entry = tokens
            .authenticate(token)
            .ok_or_else(ApiError::unauthorized)?;
        Ok(Self {
            name: entry.name.clone(),
            entry: Some(entry),
        })
    }
}
