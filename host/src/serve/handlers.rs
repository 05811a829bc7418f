//! The handlers of docs/contract/api.md#endpoints (the table of routes is `router.rs`). Each
//! handler checks the caller's scope, then runs the library's operation on a blocking thread
//! (SQLite blocks).

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::audit;
use super::auth::Caller;
use super::errors::ApiError;
use super::state::{query, shorten, AppState};
use crate::api::{
    AnswerBody, DeliveredBody, DeliveredReport, HealthQuery, InitBody, SendBody, SessionItem,
    SessionList, SweepBody, UsageQuery, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED,
};
use crate::status::HealthReport;
use crate::KeyedSend;

/// `GET /v1/health`: the server answers (no token).
#[utoipa::path(get, path = "/v1/health", responses((status = 200, description = "the server answers", body = Object)))]
pub(crate) async fn server_health() -> Response {
    Json(serde_json::json!({ "healthy": true })).into_response()
}

impl AppState {
    /// The DB of session `name` as `caller` may see it: `400` for a bad name, `404` for an
    /// unknown session or one the caller may not see (not told apart).
    pub(crate) fn session_db_path(&self, caller: &Caller, name: &str) -> Result<PathBuf, ApiError> {
        if !crate::api::valid_session_name(name) {
            return Err(ApiError::bad_request(format!(
                "bad session name {}: expected 1 to 64 of A-Z a-z 0-9 . _ - (not . or ..)",
                shorten(name)
            )));
        }
        let unknown = || ApiError::not_found(format!("no session {name:?}"));
        if !caller.sees(name) {
            return Err(unknown());
        }
        self.served.db_path(name).ok_or_else(unknown)
    }
}

/// Runs `f` on the open DB at `path`, on a blocking thread, waiting at most the lock wait for
/// another process's lock (then `503`).
pub(crate) async fn with_db<T: Send + 'static>(
    state: &Arc<AppState>,
    path: PathBuf,
    f: impl FnOnce(&schema::SessionDb) -> anyhow::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || {
        schema::db::with_lock_wait(state.db_lock_wait, || {
            let db = state.dbs.get(&path)?;
            f(&db)
        })
    })
    .await?
    .map_err(ApiError::from_library)
}

/// The request body as `T`: `415` unless JSON, `413` above the limit, `400` for bad JSON or an
/// unknown field. An empty body is `{}` when `empty_ok`.
async fn json_body<T: DeserializeOwned>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    empty_ok: bool,
) -> Result<T, ApiError> {
    let too_large = || {
        ApiError::new(
            crate::api::ErrorCode::PayloadTooLarge,
            format!(
                "the body is larger than {} bytes (--max-body)",
                state.max_body
            ),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > state.max_body as u64) {
        return Err(too_large());
    }
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    let limited = http_body_util::Limited::new(body, state.max_body);
    let collected = tokio::time::timeout(state.body_timeout, limited.collect())
        .await
        .map_err(|_| {
            ApiError::bad_request(format!(
                "the body did not arrive within {} s",
                state.body_timeout.as_secs()
            ))
        })?;
    let bytes = match collected {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Err(err) => return Err(ApiError::bad_request(format!("reading the body: {err}"))),
    };
    if bytes.is_empty() && empty_ok {
        return serde_json::from_slice(b"{}").map_err(|err| ApiError::bad_request(err.to_string()));
    }
    if !is_json {
        return Err(ApiError::new(
            crate::api::ErrorCode::UnsupportedMediaType,
            "the body must be JSON: send `Content-Type: application/json`",
        ));
    }
    serde_json::from_slice(&bytes)
        .map_err(|err| ApiError::bad_request(format!("bad JSON body: {err}")))
}

/// `status`'s code for an audit line.
fn audited<T>(
    caller: &Caller,
    name: &str,
    action: &str,
    result: &Result<(StatusCode, Option<String>, T), ApiError>,
) {
    let (status, id) = match result {
        Ok((status, id, _)) => (status.as_u16(), id.as_deref()),
        Err(err) => (err.status().as_u16(), None),
    };
    let session = if name.is_empty() {
        "-".to_owned()
    } else if crate::api::valid_session_name(name) {
        name.to_owned()
    } else {
        shorten(name)
    };
    audit::record(&caller.name, &session, action, status, id);
}

fn respond<T: Serialize>(result: Result<(StatusCode, Option<String>, T), ApiError>) -> Response {
    match result {
        Ok((status, _, body)) => (status, Json(body)).into_response(),
        Err(err) => err.into_response(),
    }
}

/// `GET /v1/sessions`.
#[utoipa::path(get, path = "/v1/sessions", responses((status = 200, body = SessionList)))]
pub(crate) async fn list_sessions(
    State(state): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Json<SessionList>, ApiError> {
    let names: Vec<String> = state
        .served
        .names()
        .into_iter()
        .filter(|name| caller.sees(name))
        .collect();
    let state2 = state.clone();
    let sessions = tokio::task::spawn_blocking(move || {
        let now = Utc::now();
        names
            .into_iter()
            .filter_map(|name| {
                let path = state2.served.db_path(&name)?;
                let runner_status = state2
                    .dbs
                    .get(&path)
                    .ok()
                    .and_then(|db| db.runner_state().ok().flatten())
                    .map(|s| s.status);
                let healthy =
                    HealthReport::check(&path, &crate::status::default_limits(), now).healthy;
                Some(SessionItem {
                    name,
                    runner_status,
                    healthy,
                })
            })
            .collect()
    })
    .await?;
    Ok(Json(SessionList { sessions }))
}

/// `POST /v1/sessions`: `init` a session (tokens with `'*'` only).
#[utoipa::path(post, path = "/v1/sessions", request_body = InitBody,
    responses((status = 201, description = "created: init's object"), (status = 200, description = "it existed: init's object")))]
pub(crate) async fn create_session(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let mut name = String::new();
    let result = async {
        caller.require_all_sessions()?;
        let body: InitBody = json_body(&state, &headers, body, false).await?;
        name.clone_from(&body.name);
        let folder = state.served.folder(&body.name).ok_or_else(|| {
            if crate::api::valid_session_name(&body.name) {
                ApiError::not_found(format!(
                    "no session {:?}: this server serves one workspace (--workspace)",
                    body.name
                ))
            } else {
                ApiError::bad_request(format!(
                    "bad session name {}: expected 1 to 64 of A-Z a-z 0-9 . _ - (not . or ..)",
                    shorten(&body.name)
                ))
            }
        })?;
        if std::fs::symlink_metadata(&folder).is_ok_and(|m| !m.is_dir()) {
            return Err(ApiError::bad_request(format!(
                "{:?} exists and is not a session folder (a symlink or a file)",
                body.name
            )));
        }
        let options = body.init_options(folder).map_err(ApiError::from_library)?;
        let report = tokio::task::spawn_blocking(move || crate::init(&options))
            .await?
            .map_err(ApiError::from_library)?;
        let status = if report.db.created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        Ok((status, None, report))
    }
    .await;
    audited(&caller, &name, "init", &result);
    respond(result)
}

/// `GET /v1/sessions/{name}`: `status`'s object.
#[utoipa::path(get, path = "/v1/sessions/{name}", params(("name" = String, Path)),
    responses((status = 200, description = "status's object")))]
pub(crate) async fn session_status(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let path = state.session_db_path(&caller, &name)?;
    let report = with_db(&state, path, |db| {
        let now = Utc::now();
        crate::status(db, now, &crate::status::default_limits())
    })
    .await?;
    Ok(Json(report).into_response())
}

/// `GET /v1/sessions/{name}/health`.
#[utoipa::path(get, path = "/v1/sessions/{name}/health", params(("name" = String, Path), HealthQuery),
    responses((status = 200, body = HealthReport)))]
pub(crate) async fn session_health(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(name): Path<String>,
    uri: Uri,
) -> Result<Json<HealthReport>, ApiError> {
    let path = state.session_db_path(&caller, &name)?;
    let limits = query::<HealthQuery>(&uri)?.limits();
    let report =
        tokio::task::spawn_blocking(move || HealthReport::check(&path, &limits, Utc::now()))
            .await?;
    Ok(Json(report))
}

/// The fingerprint of a send body: a hash of its canonical JSON.
fn fingerprint(body: &SendBody) -> String {
    let canonical = serde_json::to_string(body).unwrap_or_default();
    Sha256::digest(canonical.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `POST /v1/sessions/{name}/messages`: `send`, idempotent with an `Idempotency-Key`.
#[utoipa::path(post, path = "/v1/sessions/{name}/messages", params(("name" = String, Path)),
    request_body = SendBody,
    responses((status = 201, description = "send's object"), (status = 200, description = "a replayed Idempotency-Key: the first answer"),
        (status = 422, body = crate::api::ErrorBody)))]
pub(crate) async fn send_message(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        let path = state.session_db_path(&caller, &name)?;
        caller.require_write()?;
        let key = match headers.get(IDEMPOTENCY_KEY) {
            None => None,
            Some(value) => match value.to_str() {
                Ok(key) if crate::api::valid_idempotency_key(key) => Some(key.to_owned()),
                _ => {
                    return Err(ApiError::bad_request(
                        "bad Idempotency-Key: expected 1 to 255 visible ASCII characters",
                    ))
                }
            },
        };
        let body: SendBody = json_body(&state, &headers, body, false).await?;
        let print = fingerprint(&body);
        let request: crate::SendRequest = body.into();
        let outcome = with_db(&state, path, move |db| match key {
            None => {
                let sent = crate::send(db, &request)?;
                let json = serde_json::to_string(&sent)?;
                Ok(KeyedSend::Sent { sent, json })
            }
            Some(key) => crate::send_with_key(db, &request, &key, &print),
        })
        .await?;
        Ok(match outcome {
            KeyedSend::Sent { sent, json } => (StatusCode::CREATED, Some(sent.id), (json, false)),
            KeyedSend::Replayed(json) => {
                let id = serde_json::from_str::<serde_json::Value>(&json)
                    .ok()
                    .and_then(|v| v.get("id").and_then(|id| id.as_str()).map(str::to_owned));
                (StatusCode::OK, id, (json, true))
            }
            KeyedSend::Reused => return Err(ApiError::new(
                crate::api::ErrorCode::IdempotencyKeyReused,
                "this Idempotency-Key was used with another body: use a new key for a new message",
            )),
        })
    }
    .await;
    audited(&caller, &name, "send", &result);
    match result {
        Ok((status, _, (json, replayed))) => {
            let mut response = (
                status,
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                json,
            )
                .into_response();
            if replayed {
                response
                    .headers_mut()
                    .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            }
            response
        }
        Err(err) => err.into_response(),
    }
}

/// `POST /v1/sessions/{name}/messages/{seq}/delivered`.
#[utoipa::path(post, path = "/v1/sessions/{name}/messages/{seq}/delivered",
    params(("name" = String, Path), ("seq" = i64, Path)), request_body = DeliveredBody,
    responses((status = 200, body = DeliveredReport)))]
pub(crate) async fn record_delivery(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((name, seq)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        let path = state.session_db_path(&caller, &name)?;
        caller.require_write()?;
        let seq: i64 = seq.parse().map_err(|_| {
            ApiError::bad_request(format!("bad seq {}: expected an integer", shorten(&seq)))
        })?;
        let body: DeliveredBody = json_body(&state, &headers, body, false).await?;
        let report = with_db(&state, path, move |db| {
            let Some(row) = db.message_out_by_seq(seq)? else {
                return Ok(None);
            };
            db.record_delivery(
                &row.id,
                body.platform_message_id.as_deref(),
                body.status.as_str(),
                body.reason.as_deref(),
            )?;
            Ok(Some(DeliveredReport {
                seq,
                id: row.id,
                status: body.status,
            }))
        })
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no messages_out row with seq {seq}")))?;
        Ok((StatusCode::OK, Some(report.id.clone()), report))
    }
    .await;
    audited(&caller, &name, "delivered", &result);
    respond(result)
}

/// `POST /v1/sessions/{name}/answers`: `answer`.
#[utoipa::path(post, path = "/v1/sessions/{name}/answers", params(("name" = String, Path)),
    request_body = AnswerBody, responses((status = 201, body = crate::AnswerReport)))]
pub(crate) async fn answer(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        let path = state.session_db_path(&caller, &name)?;
        caller.require_write()?;
        let body: AnswerBody = json_body(&state, &headers, body, false).await?;
        let request: crate::AnswerRequest = body.into();
        let report = with_db(&state, path, move |db| {
            Ok(crate::answer(db, &request)?.report())
        })
        .await?;
        Ok((StatusCode::CREATED, Some(report.id.clone()), report))
    }
    .await;
    audited(&caller, &name, "answer", &result);
    respond(result)
}

/// `POST /v1/sessions/{name}/interrupt`: `interrupt`.
#[utoipa::path(post, path = "/v1/sessions/{name}/interrupt", params(("name" = String, Path)),
    responses((status = 201, description = "interrupt's object")))]
pub(crate) async fn interrupt(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        let path = state.session_db_path(&caller, &name)?;
        caller.require_write()?;
        let _: EmptyBody = json_body(&state, &headers, body, true).await?;
        let sent = with_db(&state, path, crate::interrupt).await?;
        Ok((StatusCode::CREATED, Some(sent.id.clone()), sent))
    }
    .await;
    audited(&caller, &name, "interrupt", &result);
    respond(result)
}

/// An empty JSON object (no field allowed).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EmptyBody {}

/// `GET /v1/sessions/{name}/usage`: `usage`.
#[utoipa::path(get, path = "/v1/sessions/{name}/usage", params(("name" = String, Path), UsageQuery),
    responses((status = 200, description = "usage's object")))]
pub(crate) async fn usage(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(name): Path<String>,
    uri: Uri,
) -> Result<Response, ApiError> {
    let path = state.session_db_path(&caller, &name)?;
    let query: UsageQuery = query(&uri)?;
    let report = with_db(&state, path, move |db| {
        let request = query.request(Utc::now(), db.timezone())?;
        crate::usage(db, &request)
    })
    .await?;
    Ok(Json(report).into_response())
}

/// `POST /v1/sessions/{name}/sweep`: `sweep`.
#[utoipa::path(post, path = "/v1/sessions/{name}/sweep", params(("name" = String, Path)),
    request_body = SweepBody, responses((status = 200, description = "sweep's object")))]
pub(crate) async fn sweep(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        let path = state.session_db_path(&caller, &name)?;
        caller.require_write()?;
        let body: SweepBody = json_body(&state, &headers, body, true).await?;
        let policy = body.policy().map_err(ApiError::from_library)?;
        let outcome = with_db(&state, path, move |db| {
            crate::sweep(db, &policy, Utc::now())
        })
        .await?;
        Ok((StatusCode::OK, None, outcome))
    }
    .await;
    audited(&caller, &name, "sweep", &result);
    respond(result)
}
