//! The table of routes of docs/contract/api.md#endpoints, and the answers for a path or a method
//! no route has. The handlers are in `handlers.rs`, `sse.rs` and `openapi.rs`.

use std::sync::Arc;

use axum::http::{Method, Uri};
use axum::routing::{get, post};
use axum::Router;

use super::audit;
use super::errors::ApiError;
use super::handlers;
use super::state::{shorten, AppState};

/// The API's routes.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/health", get(handlers::server_health))
        .route("/v1/openapi.json", get(super::openapi::document))
        .route(
            "/v1/sessions",
            get(handlers::list_sessions).post(handlers::create_session),
        )
        .route("/v1/sessions/{name}", get(handlers::session_status))
        .route("/v1/sessions/{name}/health", get(handlers::session_health))
        .route("/v1/sessions/{name}/messages", post(handlers::send_message))
        .route("/v1/sessions/{name}/events", get(super::sse::events))
        .route(
            "/v1/sessions/{name}/messages/{seq}/delivered",
            post(handlers::record_delivery),
        )
        .route("/v1/sessions/{name}/answers", post(handlers::answer))
        .route("/v1/sessions/{name}/interrupt", post(handlers::interrupt))
        .route("/v1/sessions/{name}/usage", get(handlers::usage))
        .route("/v1/sessions/{name}/sweep", post(handlers::sweep))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::middleware::from_fn(audit::refused_before_handler))
        .with_state(state)
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!(
        "no route {method} {} (the routes are in GET /v1/openapi.json)",
        shorten(uri.path())
    ))
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        crate::api::ErrorCode::MethodNotAllowed,
        format!(
            "{method} is not allowed on {} (the routes are in GET /v1/openapi.json)",
            shorten(uri.path())
        ),
    )
}
