//! The audit line every mutating request writes (log target `nanoclaw::audit`, INFO).

/// Writes `token=<name> session=<name> action=<action> status=<status> id=<row id>`.
pub(crate) fn record(token: &str, session: &str, action: &str, status: u16, id: Option<&str>) {
    tracing::info!(
        target: "nanoclaw::audit",
        "token={token} session={session} action={action} status={status} id={}",
        id.unwrap_or("-")
    );
}

/// The action and session a mutating request's path names (`None` for a read or no route).
pub(crate) fn action_of(method: &axum::http::Method, path: &str) -> Option<(&'static str, String)> {
    if method != axum::http::Method::POST {
        return None;
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let action = match parts.as_slice() {
        ["v1", "sessions"] => return Some(("init", "-".to_owned())),
        ["v1", "sessions", _, "messages"] => "send",
        ["v1", "sessions", _, "messages", _, "delivered"] => "delivered",
        ["v1", "sessions", _, "answers"] => "answer",
        ["v1", "sessions", _, "interrupt"] => "interrupt",
        ["v1", "sessions", _, "sweep"] => "sweep",
        _ => return None,
    };
    let session = parts.get(2).copied().unwrap_or("-");
    let session = if crate::api::valid_session_name(session) {
        session.to_owned()
    } else {
        super::state::shorten(session)
    };
    Some((action, session))
}

/// Writes the audit line of a mutating request refused before its handler ran (no or a bad
/// token: `401`); the handlers write the others.
pub(crate) async fn refused_before_handler(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let action = action_of(request.method(), request.uri().path());
    let response = next.run(request).await;
    if response.status() == axum::http::StatusCode::UNAUTHORIZED {
        if let Some((action, session)) = action {
            record("-", &session, action, 401, None);
        }
    }
    response
}
