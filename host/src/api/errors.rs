//! The error body every non-2xx answer carries: `{"error": {"code", "message"}}`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What went wrong, one code per HTTP status of docs/contract/api.md#errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: malformed or truncated JSON, a wrong type, an unknown field, a bad query value, a
    /// bad session name.
    BadRequest,
    /// 401: no token, an unknown or revoked token.
    Unauthorized,
    /// 403: the token's scope forbids it (read-only sending, `init` without `'*'`).
    Forbidden,
    /// 404: an unknown session or one the token may not see, an unknown route or row.
    NotFound,
    /// 405: a known path with another method.
    MethodNotAllowed,
    /// 413: a body above `--max-body`.
    PayloadTooLarge,
    /// 415: a body that is not `application/json`.
    UnsupportedMediaType,
    /// 422: an `Idempotency-Key` repeated with another body.
    IdempotencyKeyReused,
    /// 500: a fault of the server (its log has the cause).
    Internal,
    /// 503: the DB cannot be written now (disk full, locked past its busy timeout).
    Unavailable,
    /// A code this client does not know (a newer server).
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// The HTTP status this code is sent with.
    pub fn status(self) -> u16 {
        match self {
            Self::BadRequest => 400,
            Self::Unauthorized => 401,
            Self::Forbidden => 403,
            Self::NotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::PayloadTooLarge => 413,
            Self::UnsupportedMediaType => 415,
            Self::IdempotencyKeyReused => 422,
            Self::Internal | Self::Unknown => 500,
            Self::Unavailable => 503,
        }
    }
}

/// The error's code and its message (names the bad field or the fix, never a token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable code.
    pub code: ErrorCode,
    /// For the operator.
    pub message: String,
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

impl ErrorBody {
    /// An error body with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            error: ErrorDetail {
                code,
                message: message.into(),
            },
        }
    }
}
