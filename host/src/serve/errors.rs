//! API errors: one type every handler returns, rendered as `{"error": {"code", "message"}}`
//! with the status of its code (docs/contract/api.md#errors).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api::{ErrorBody, ErrorCode};

/// Seconds a `503` asks the client to wait before retrying.
const RETRY_AFTER_SECS: u32 = 2;

/// An error answer.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Forbidden, message)
    }

    pub(crate) fn unauthorized() -> Self {
        Self::new(
            ErrorCode::Unauthorized,
            "a valid token is needed: send `Authorization: Bearer <token>` (make one with `nanoclaw token add`)",
        )
    }

    /// The answer for an error of the library: a DB that cannot be written now is `503`, another
    /// DB fault `500` (logged, not shown), anything else a refused request (`400`, its message
    /// names the field).
    pub(crate) fn from_library(err: anyhow::Error) -> Self {
        if let Some(refused) = err.chain().find_map(schema::shared_filesystem) {
            // The operator's fault, not the client's: logged with the fix, `500` without paths.
            tracing::error!(error = %refused, "serve: a session DB on a shared filesystem");
            return Self::new(
                ErrorCode::Internal,
                "this session's DB is on a shared filesystem, which the server refuses; the \
                 server's log has the fix",
            );
        }
        let db_error = err.chain().find_map(|c| c.downcast_ref::<schema::Error>());
        match db_error {
            Some(db) if db.is_busy() || db.is_disk_full() => Self::new(
                ErrorCode::Unavailable,
                format!("the session DB cannot be written now ({db}); retry later"),
            ),
            Some(db) if db.is_constraint() => Self::bad_request(format!(
                "{err:#} (a row with this id exists already: give another id)"
            )),
            Some(_) => {
                tracing::error!(error = format!("{err:#}"), "serve: session DB error");
                Self::new(
                    ErrorCode::Internal,
                    "the session DB failed; the server's log has the cause",
                )
            }
            None => Self::bad_request(format!("{err:#}")),
        }
    }

    /// The HTTP status.
    pub(crate) fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut response = (status, Json(ErrorBody::new(self.code, self.message))).into_response();
        let headers = response.headers_mut();
        match self.code {
            ErrorCode::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ErrorCode::Unavailable => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
            }
            _ => {}
        }
        response
    }
}

/// A task that failed to run (panicked or cancelled).
impl From<tokio::task::JoinError> for ApiError {
    fn from(err: tokio::task::JoinError) -> Self {
        tracing::error!(error = %err, "serve: a blocking task failed");
        Self::new(
            ErrorCode::Internal,
            "the request's task failed; the server's log has the cause",
        )
    }
}
