//! The audit line every mutating request writes (log target `nanoclaw::audit`, INFO).

/// Writes `token=<name> session=<name> action=<action> status=<status> id=<row id>`.
pub(crate) fn record(token: &str, session: &str, action: &str, status: u16, id: Option<&str>) {
    tracing::info!(
        target: "nanoclaw::audit",
        "token={token} session={session} action={action} status={status} id={}",
        id.unwrap_or("-")
    );
}
