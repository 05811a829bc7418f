//! `GET /v1/openapi.json`: the OpenAPI 3.1 document, generated from the handlers' annotations
//! and the wire types' schemas.

use axum::response::{IntoResponse, Response};
use axum::Json;
use utoipa::OpenApi;

use super::auth::Caller;
use super::{handlers, sse};
use crate::api;

#[derive(OpenApi)]
#[openapi(
    info(title = "nanoclaw session API", description = "docs/contract/api.md"),
    paths(
        handlers::server_health,
        document,
        handlers::list_sessions,
        handlers::create_session,
        handlers::session_status,
        handlers::session_health,
        handlers::send_message,
        sse::events,
        handlers::record_delivery,
        handlers::answer,
        handlers::interrupt,
        handlers::usage,
        handlers::sweep,
    ),
    components(schemas(
        api::ErrorBody,
        api::ErrorDetail,
        api::ErrorCode,
        api::SendBody,
        api::SendKindBody,
        api::QuoteBody,
        api::InitBody,
        api::RoutingBody,
        api::DestinationBody,
        api::DeliveredBody,
        api::DeliveredReport,
        api::DeliveryStatus,
        api::AnswerBody,
        api::SweepBody,
        api::SessionList,
        api::SessionItem,
        api::StatusEvent,
        crate::AnswerReport,
        crate::status::HealthReport,
    ))
)]
struct ApiDoc;

/// The document as JSON.
pub(crate) fn json() -> serde_json::Value {
    serde_json::to_value(ApiDoc::openapi()).unwrap_or_default()
}

/// `GET /v1/openapi.json`.
#[utoipa::path(get, path = "/v1/openapi.json", responses((status = 200, description = "this document")))]
pub(crate) async fn document(_caller: Caller) -> Response {
    Json(json()).into_response()
}
