//! The error a tool returns. Every variant becomes a tool result with `isError: true` whose
//! text the model reads, so messages say what was wrong and what to do instead.

/// Why a tool call did not work.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The arguments are not acceptable (empty text, bad date, unknown destination, ...).
    #[error("{0}")]
    Invalid(String),
    /// The session DB failed.
    #[error("{0}")]
    Db(#[from] schema::Error),
    /// A file operation failed.
    #[error("{0}")]
    Io(String),
    /// The call was cancelled by the client.
    #[error("cancelled: {0}")]
    Cancelled(String),
    /// A background task failed unexpectedly.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ToolError {
    /// A bad-argument error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::Invalid(message.into())
    }
}

/// Result of a tool's body.
pub type ToolResult<T = String> = Result<T, ToolError>;
