//! A loopback credential proxy: the runner serves the CLI's model endpoint itself, so the real
//! model API key never reaches a file or an environment the agent can read.
//!
//! The CLI gets `http://127.0.0.1:<port>/<route>` as its base URL and a per-session random token
//! as its API key. Every request must carry the token (`x-api-key` or `Authorization: Bearer`),
//! compared in constant time; the proxy strips it, adds the real key and forwards the request to
//! the configured gateway, then streams the response back chunk by chunk as it arrives (SSE stays
//! live). The request body goes up the same way, chunk by chunk with its `content-length`: a
//! CLI sends the whole conversation with every request, so a proxy that read whole bodies would
//! hold (and leave malloc holding) memory that grows with the conversation. Nothing reads a
//! whole body. One route per upstream API:
//!
//! * `/anthropic/…` → the Anthropic base URL + the rest of the path (Claude appends
//!   `/v1/messages`); the real key goes out as `x-api-key`, or as `Authorization: Bearer` when the
//!   CLI authenticated that way (gateways that take bearer tokens);
//! * `/openai/…` → the OpenAI-compatible base URL + the rest (Codex appends `/responses`,
//!   OpenCode `/chat/completions`), with `Authorization: Bearer <key>`;
//! * `/gemini/…` → the Gemini API base URL + the rest (Gemini CLI appends
//!   `/v1beta/models/<model>:streamGenerateContent`), the token taken from and the real key
//!   sent as `x-goog-api-key` (the Google GenAI client's header).
//!
//! Only the model endpoints the CLIs use are forwarded (see [`Api::allowed_paths`]): the agent can
//! read the token, and the proxy should not lend it the key's other powers (files, batches of
//! other APIs, admin). The token dies with the proxy: it is made per start and the proxy stops
//! with the runner.
//!
//! Remote MCP servers whose headers hold secrets are served the same way at `/mcp/<name>`
//! ([`McpUpstream`], [`CredProxy::start_with`]): the CLI connects with the token as
//! `Authorization: Bearer`, the proxy adds the server's configured headers.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures::TryStreamExt;

mod mcp;

pub use mcp::{valid_name as valid_mcp_name, McpUpstream, MCP_PREFIX};

/// The largest request body forwarded. The CLIs' requests are JSON conversations (tens of KB,
/// a few MB with images); the APIs themselves refuse more than 32 MB.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

/// How long the proxy waits for a TCP (and TLS) connection to the gateway.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Token bytes from the OS RNG (256 bits, sent as 64 hex digits).
const TOKEN_BYTES: usize = 32;

/// Why the proxy cannot start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configured base URL is not an absolute http(s) URL.
    #[error("{api} base URL {url:?} is not an http(s) URL ({reason}); fix the base URL setting")]
    BadBaseUrl {
        /// Which upstream.
        api: Api,
        /// The configured value.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The OS random number generator failed (no token can be made).
    #[error("cannot draw the session token from the OS RNG: {0}")]
    Rng(String),
    /// The loopback listener could not be opened.
    #[error("cannot listen on 127.0.0.1: {0}")]
    Bind(#[source] std::io::Error),
    /// A remote MCP server's URL, name or headers cannot be used (the header values are never
    /// named).
    #[error("remote MCP server {name:?}: {reason}; fix its mcpServers entry")]
    BadMcpServer {
        /// The server's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The HTTP client for the gateway could not be built (TLS setup).
    #[error("cannot build the upstream HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// An upstream API the proxy serves, one route prefix each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    /// Anthropic Messages (Claude).
    Anthropic,
    /// OpenAI Responses and Chat Completions (Codex, OpenCode, Qwen Code).
    OpenAi,
    /// The Gemini API, `generateContent` and `streamGenerateContent` (Gemini CLI).
    Gemini,
}

impl Api {
    /// The route prefix, without slashes (`anthropic`, `openai`).
    pub fn prefix(self) -> &'static str {
        match self {
            Api::Anthropic => "anthropic",
            Api::OpenAi => "openai",
            Api::Gemini => "gemini",
        }
    }

    /// The public API's base URL, used when none is configured.
    pub fn default_base_url(self) -> &'static str {
        match self {
            Api::Anthropic => "https://api.anthropic.com",
            Api::OpenAi => "https://api.openai.com/v1",
            Api::Gemini => "https://generativelanguage.googleapis.com",
        }
    }

    /// The paths (after the base URL) that are forwarded, with everything below them: the model
    /// endpoints the CLIs call (docs/contract/providers.md: Claude `/v1/messages?beta=true`, Codex
    /// `/responses`, OpenCode `/chat/completions`) and the model lists.
    pub fn allowed_paths(self) -> &'static [&'static str] {
        match self {
            Api::Anthropic => &["/v1/messages", "/v1/models"],
            Api::OpenAi => &["/responses", "/chat/completions", "/models"],
            // `models/<model>:generateContent`, `:streamGenerateContent`, `:countTokens`.
            Api::Gemini => &["/v1beta/models", "/v1/models"],
        }
    }

    fn from_prefix(prefix: &str) -> Option<Self> {
        [Api::Anthropic, Api::OpenAi, Api::Gemini]
            .into_iter()
            .find(|api| api.prefix() == prefix)
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.prefix())
    }
}

/// One upstream: where requests of an [`Api`] go, and the real key they carry.
#[derive(Clone)]
pub struct Upstream {
    /// Which route.
    pub api: Api,
    /// The gateway's base URL (the CLI's usual base URL setting).
    pub base_url: String,
    /// The real API key.
    pub api_key: String,
}

impl Upstream {
    /// An upstream at `base_url`, or the public API when `None` or empty.
    pub fn new(api: Api, base_url: Option<&str>, api_key: impl Into<String>) -> Self {
        let base_url = base_url
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .unwrap_or(api.default_base_url())
            .trim_end_matches('/')
            .to_owned();
        Self {
            api,
            base_url,
            api_key: api_key.into().trim().to_owned(),
        }
    }
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("api", &self.api)
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .finish()
    }
}

struct Inner {
    upstreams: Vec<Upstream>,
    mcp: Vec<mcp::McpRoute>,
    token: String,
    client: reqwest::Client,
    open: AtomicBool,
}

/// A running proxy. Dropping it closes it: the token is refused from then on and the listener
/// stops.
pub struct CredProxy {
    addr: SocketAddr,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl fmt::Debug for CredProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredProxy")
            .field("addr", &self.addr)
            .field("upstreams", &self.inner.upstreams)
            .field(
                "mcp",
                &self.inner.mcp.iter().map(|r| &r.name).collect::<Vec<_>>(),
            )
            .field("token", &"<redacted>")
            .finish()
    }
}

impl CredProxy {
    /// Starts serving `upstreams` on 127.0.0.1 (ephemeral port) with a fresh token. Must run
    /// inside a tokio runtime; the server is a task of it.
    pub async fn start(upstreams: Vec<Upstream>) -> Result<Self, Error> {
        Self::start_with(upstreams, Vec::new()).await
    }

    /// Starts serving the model `upstreams` and the remote MCP servers `mcp` (each at
    /// [`CredProxy::mcp_url`]). Checks every upstream first: nothing listens when one is unusable.
    pub async fn start_with(
        upstreams: Vec<Upstream>,
        mcp: Vec<McpUpstream>,
    ) -> Result<Self, Error> {
        for upstream in &upstreams {
            check_base_url(upstream)?;
        }
        let mcp = mcp
            .into_iter()
            .map(mcp::McpRoute::new)
            .collect::<Result<Vec<_>, _>>()?;
        let token = new_token()?;
        let client = reqwest::Client::builder()
            // A redirect would be followed with the real key; the CLI sees it instead.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(Error::Client)?;
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(Error::Bind)?;
        let addr = listener.local_addr().map_err(Error::Bind)?;
        let inner = Arc::new(Inner {
            upstreams,
            mcp,
            token,
            client,
            open: AtomicBool::new(true),
        });
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&inner));
        let task = tokio::spawn(serve(listener, app));
        let routes: Vec<String> = inner
            .upstreams
            .iter()
            .map(|u| format!("/{} -> {}", u.api.prefix(), u.base_url))
            .chain(
                inner
                    .mcp
                    .iter()
                    .map(|r| format!("/{MCP_PREFIX}/{} (remote MCP server)", r.name)),
            )
            .collect();
        tracing::info!(
            listen = %addr,
            upstreams = %routes.join(", "),
            "credential proxy listening (the CLI gets a session token, not the API key)"
        );
        Ok(Self { addr, inner, task })
    }

    /// The address the proxy listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The session token the CLI must present instead of the key.
    pub fn token(&self) -> &str {
        &self.inner.token
    }

    /// The base URL the CLI gets for `api` (`http://127.0.0.1:<port>/<prefix>`).
    pub fn base_url(&self, api: Api) -> String {
        format!("http://{}/{}", self.addr, api.prefix())
    }

    /// The URL the CLI gets for the remote MCP server `name`
    /// (`http://127.0.0.1:<port>/mcp/<name>`), when the proxy serves it.
    pub fn mcp_url(&self, name: &str) -> Option<String> {
        self.inner
            .mcp
            .iter()
            .any(|r| r.name == name)
            .then(|| format!("http://{}/{MCP_PREFIX}/{name}", self.addr))
    }

    /// True when the proxy serves `api`.
    pub fn serves(&self, api: Api) -> bool {
        self.inner.upstreams.iter().any(|u| u.api == api)
    }
}

impl Drop for CredProxy {
    fn drop(&mut self) {
        self.inner.open.store(false, Ordering::SeqCst);
        self.task.abort();
    }
}

/// The most a connection's read buffer may hold. hyper's default (~400 KiB) lets the buffer grow
/// while reads fill it: a CLI sends its whole conversation with every request, so as the
/// conversation grew, each kept-alive connection's buffer grew towards 400 KiB and the runner's
/// RSS with it (issue 12, measured with Claude: +1 MiB over 2,000 messages). A body longer than
/// this streams through in more reads; the request head must fit in it.
pub const READ_BUFFER_MAX: usize = 64 * 1024;

/// Accepts connections on `listener` and serves each with `app` (HTTP/1.1, what the CLIs speak to
/// a plain `http://` base URL), its read buffer bounded by [`READ_BUFFER_MAX`].
async fn serve(listener: tokio::net::TcpListener, app: Router) {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(err) if is_connection_error(&err) => continue,
            Err(err) => {
                // Out of file descriptors, most likely: the CLI retries, so wait for some to close.
                tracing::error!(error = %err, "credential proxy: cannot accept a connection; trying again in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        // SSE events are small writes: without TCP_NODELAY, Nagle holds each one back until the
        // previous is acknowledged (40 ms with delayed ACKs, measured by the bench).
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(error = %err, "credential proxy: cannot set TCP_NODELAY");
        }
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let served = hyper::server::conn::http1::Builder::new()
                .max_buf_size(READ_BUFFER_MAX)
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                .await;
            if let Err(err) = served {
                tracing::trace!(error = %err, "credential proxy: connection ended");
            }
        });
    }
}

/// An accept error that concerns one connection only (the listener is fine).
fn is_connection_error(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

fn check_base_url(upstream: &Upstream) -> Result<(), Error> {
    let bad = |reason: String| Error::BadBaseUrl {
        api: upstream.api,
        url: upstream.base_url.clone(),
        reason,
    };
    let url = reqwest::Url::parse(&upstream.base_url).map_err(|err| bad(err.to_string()))?;
    match url.scheme() {
        "http" | "https" => {}
        other => return Err(bad(format!("scheme {other}"))),
    }
    if url.query().is_some() {
        return Err(bad("it has a query string".into()));
    }
    Ok(())
}

/// A fresh token: [`TOKEN_BYTES`] from the OS RNG, hex.
fn new_token() -> Result<String, Error> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes).map_err(|err| Error::Rng(err.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Equality whose time does not depend on where the inputs differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// How the CLI presented its token; the Anthropic upstream gets the key the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    ApiKeyHeader,
    Bearer,
    /// `x-goog-api-key` (the Gemini API).
    GoogApiKey,
}

fn presented_token(headers: &HeaderMap) -> Option<(&str, Scheme)> {
    if let Some(value) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some((value.trim(), Scheme::ApiKeyHeader));
    }
    if let Some(value) = headers.get("x-goog-api-key").and_then(|v| v.to_str().ok()) {
        return Some((value.trim(), Scheme::GoogApiKey));
    }
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some((token.trim(), Scheme::Bearer))
}

/// Headers that belong to one connection (RFC 9110 §7.6.1) or carry a credential, plus the
/// framing the client library recomputes.
const DROPPED_REQUEST_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "authorization",
    "x-api-key",
    "x-goog-api-key",
];

/// Response headers not passed back: hop-by-hop ones, and the length (the body is re-framed).
const DROPPED_RESPONSE_HEADERS: &[&str] = &[
    "content-length",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// `headers` minus `dropped` and whatever the `Connection` header names.
fn filtered(headers: &HeaderMap, dropped: &[&str]) -> HeaderMap {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::new();
    for (name, value) in headers {
        let lower = name.as_str();
        if dropped.contains(&lower) || named.iter().any(|n| n == lower) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// True when `rest` is one of `allowed` or below it (whole path segments).
fn path_allowed(rest: &str, allowed: &[&str]) -> bool {
    allowed.iter().any(|prefix| {
        rest.strip_prefix(prefix)
            .is_some_and(|tail| tail.is_empty() || tail.starts_with('/'))
    })
}

/// The upstream URL for `rest` (and `query`), when its path, normalised as the client will send
/// it (`.`/`..` segments, their `%2e` forms and backslashes resolved), is still an allowed
/// endpoint below the base URL's path: `/responses/../files` must not reach `/files`.
fn target_url(
    base_url: &str,
    rest: &str,
    query: Option<&str>,
    allowed: &[&str],
) -> Option<reqwest::Url> {
    let base = reqwest::Url::parse(base_url).ok()?;
    let base_path = base.path().trim_end_matches('/');
    let mut url = reqwest::Url::parse(&format!("{base_url}{rest}")).ok()?;
    url.set_query(query);
    let below = url.path().strip_prefix(base_path)?;
    path_allowed(below, allowed).then_some(url)
}

/// An error in the shape of the route's API, so the CLI shows the message.
fn error(api: Option<Api>, status: StatusCode, kind: &str, message: String) -> Response {
    let body = match api {
        Some(Api::Anthropic) => serde_json::json!({
            "type": "error",
            "error": {"type": kind, "message": message},
        }),
        _ => serde_json::json!({
            "error": {"message": message, "type": kind, "code": kind},
        }),
    };
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}

async fn handle(State(inner): State<Arc<Inner>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path();
    let trimmed = path.trim_start_matches('/');
    let (prefix, rest) = match trimmed.find('/') {
        Some(at) => (&trimmed[..at], &trimmed[at..]),
        None => (trimmed, ""),
    };
    if prefix == MCP_PREFIX {
        let rest = rest.to_owned();
        return handle_mcp(&inner, &rest, parts, body).await;
    }
    let Some(api) = Api::from_prefix(prefix) else {
        return error(
            None,
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("credential proxy: no route for {path}; the routes are /anthropic/..., /openai/... and /mcp/<server>"),
        );
    };
    let Some(upstream) = inner.upstreams.iter().find(|u| u.api == api) else {
        return error(
            Some(api),
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("credential proxy: no {api} upstream is configured for this session (set its API key)"),
        );
    };
    let scheme = match session_token(&inner, api, &parts.headers, path) {
        Ok(scheme) => scheme,
        Err(refused) => return *refused,
    };
    let Some(url) = target_url(
        &upstream.base_url,
        rest,
        parts.uri.query(),
        api.allowed_paths(),
    ) else {
        return error(
            Some(api),
            StatusCode::FORBIDDEN,
            "permission_error",
            format!(
                "credential proxy: {rest} is not forwarded; only {} under /{}",
                api.allowed_paths().join(", "),
                api.prefix()
            ),
        );
    };
    let declared = declared_length(&parts.headers);
    if declared.is_some_and(|length| length > MAX_REQUEST_BYTES as u64) {
        return too_large(api);
    }
    let (body, over_limit) = limited_body(body);
    let endpoint = {
        let mut endpoint = url.clone();
        endpoint.set_query(None);
        endpoint.to_string()
    };
    let mut headers = filtered(&parts.headers, DROPPED_REQUEST_HEADERS);
    if let Some(length) = declared {
        // The streamed body has no length of its own; the client's keeps the request framed as
        // it was (some gateways refuse chunked uploads), and the client sends exactly that many.
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    match upstream_auth(api, scheme, upstream) {
        Ok((name, value)) => {
            headers.insert(name, value);
        }
        Err(refused) => return *refused,
    }
    tracing::debug!(method = %parts.method, endpoint = %endpoint, "credential proxy: forwarding");
    let upstream_response = match send(&inner, parts.method.clone(), url, headers, body).await {
        Ok(response) => response,
        Err(_) if over_limit.load(Ordering::SeqCst) => return too_large(api),
        Err(cause) => {
            tracing::warn!(endpoint = %endpoint, error = %cause, "credential proxy: the model gateway is unreachable");
            return error(
                Some(api),
                StatusCode::BAD_GATEWAY,
                "api_error",
                format!("credential proxy: cannot reach the model gateway at {endpoint}: {cause}"),
            );
        }
    };
    streamed_back(
        upstream_response,
        format!("the model gateway at {endpoint}"),
    )
}

/// The scheme the client presented the session's token in, or the refusal: the session ended,
/// no token, or a wrong one.
fn session_token(
    inner: &Inner,
    api: Api,
    headers: &HeaderMap,
    path: &str,
) -> Result<Scheme, Box<Response>> {
    if !inner.open.load(Ordering::SeqCst) {
        return Err(Box::new(error(
            Some(api),
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "credential proxy: the session has ended; its token is no longer valid".into(),
        )));
    }
    match presented_token(headers) {
        None => Err(Box::new(error(
            Some(api),
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "credential proxy: no session token; send it as x-api-key, x-goog-api-key or Authorization: Bearer"
                .into(),
        ))),
        Some((token, scheme)) => {
            if !constant_time_eq(token.as_bytes(), inner.token.as_bytes()) {
                tracing::warn!(path = %path, "credential proxy: refused a request with a wrong session token");
                return Err(Box::new(error(
                    Some(api),
                    StatusCode::UNAUTHORIZED,
                    "authentication_error",
                    "credential proxy: wrong session token (tokens are valid for one run of one session)".into(),
                )));
            }
            Ok(scheme)
        }
    }
}

/// The upstream's own credential, in the header the client used for the session token (an
/// Anthropic client's `x-api-key`, else `Authorization: Bearer`), marked sensitive.
fn upstream_auth(
    api: Api,
    scheme: Scheme,
    upstream: &Upstream,
) -> Result<(HeaderName, HeaderValue), Box<Response>> {
    let (name, value) = match (api, scheme) {
        (Api::Anthropic, Scheme::ApiKeyHeader) => (
            HeaderName::from_static("x-api-key"),
            upstream.api_key.clone(),
        ),
        (Api::Gemini, _) => (
            HeaderName::from_static("x-goog-api-key"),
            upstream.api_key.clone(),
        ),
        _ => (
            header::AUTHORIZATION,
            format!("Bearer {}", upstream.api_key),
        ),
    };
    match HeaderValue::from_str(&value) {
        Ok(mut value) => {
            value.set_sensitive(true);
            Ok((name, value))
        }
        Err(_) => Err(Box::new(error(
                Some(api),
                StatusCode::INTERNAL_SERVER_ERROR,
                "api_error",
                format!("credential proxy: the configured {api} API key is not a valid header value; fix the key setting"),
        ))),
    }
}

/// The request's `content-length`, when it has one that parses.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The request body as a stream for the upstream request, chunk by chunk as the CLI sends it,
/// failing once more than [`MAX_REQUEST_BYTES`] came; the flag tells that this was the failure.
fn limited_body(body: Body) -> (reqwest::Body, Arc<AtomicBool>) {
    use futures::StreamExt;
    let over_limit = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&over_limit);
    let mut forwarded = 0usize;
    let stream = body.into_data_stream().map(move |chunk| {
        let chunk = chunk.map_err(axum::BoxError::from)?;
        forwarded = forwarded.saturating_add(chunk.len());
        if forwarded > MAX_REQUEST_BYTES {
            flag.store(true, Ordering::SeqCst);
            return Err(axum::BoxError::from(format!(
                "the request body is over {MAX_REQUEST_BYTES} bytes"
            )));
        }
        Ok(chunk)
    });
    (reqwest::Body::wrap_stream(stream), over_limit)
}

/// The answer to a request body over [`MAX_REQUEST_BYTES`].
fn too_large(api: Api) -> Response {
    error(
        Some(api),
        StatusCode::PAYLOAD_TOO_LARGE,
        "request_too_large",
        format!(
            "credential proxy: the request body is over the limit of {MAX_REQUEST_BYTES} bytes"
        ),
    )
}

/// Sends a request upstream; on failure, its cause without the URL (the caller names the
/// endpoint once, without secrets).
async fn send(
    inner: &Inner,
    method: axum::http::Method,
    url: reqwest::Url,
    headers: HeaderMap,
    body: reqwest::Body,
) -> Result<reqwest::Response, String> {
    inner
        .client
        .request(method, url)
        .headers(headers)
        .body(body)
        .send()
        .await
        .map_err(|err| logging::error_chain(&err.without_url()))
}

/// The upstream's response passed back as it arrives: its status, its end-to-end headers, its
/// body chunk by chunk. A break mid-body is logged naming `upstream`.
fn streamed_back(upstream_response: reqwest::Response, upstream: String) -> Response {
    let status = upstream_response.status();
    let response_headers = filtered(upstream_response.headers(), DROPPED_RESPONSE_HEADERS);
    let stream = upstream_response.bytes_stream().inspect_err(move |err| {
        tracing::warn!(
            error = %logging::error_chain(err),
            "credential proxy: {upstream} broke off the response"
        );
    });
    let mut response = Response::new(Body::from_stream(stream));
    *response.status_mut() = status;
    *response.headers_mut() = response_headers;
    response
}

/// The `/mcp/<name>` route: the same token check as the model routes, then [`mcp::forward`].
async fn handle_mcp(inner: &Inner, rest: &str, parts: Parts, body: Body) -> Response {
    if !inner.open.load(Ordering::SeqCst) {
        return mcp::error(
            StatusCode::UNAUTHORIZED,
            "credential proxy: the session has ended; its token is no longer valid".into(),
        );
    }
    match presented_token(&parts.headers) {
        None => mcp::error(
            StatusCode::UNAUTHORIZED,
            "credential proxy: no session token; send it as Authorization: Bearer".into(),
        ),
        Some((token, _)) if !constant_time_eq(token.as_bytes(), inner.token.as_bytes()) => {
            tracing::warn!(route = %parts.uri.path(), "credential proxy: refused an MCP request with a wrong session token");
            mcp::error(
                StatusCode::UNAUTHORIZED,
                "credential proxy: wrong session token (tokens are valid for one run of one session)"
                    .into(),
            )
        }
        Some(_) => mcp::forward(inner, rest, parts, body).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_hex_of_256_bits() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn constant_time_eq_compares_whole_inputs() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(!constant_time_eq(b"", b"a"));
    }

    #[test]
    fn paths_are_allowed_by_whole_segments() {
        let allowed = Api::OpenAi.allowed_paths();
        assert!(path_allowed("/responses", allowed));
        assert!(path_allowed("/responses/compact", allowed));
        assert!(path_allowed("/chat/completions", allowed));
        assert!(!path_allowed("/responsesx", allowed));
        assert!(!path_allowed("/files", allowed));
        assert!(!path_allowed("", allowed));
        assert!(path_allowed("/v1/messages", Api::Anthropic.allowed_paths()));
        assert!(path_allowed(
            "/v1/messages/count_tokens",
            Api::Anthropic.allowed_paths()
        ));
    }

    #[test]
    fn dot_segments_cannot_leave_the_allowed_endpoints() {
        let allowed = Api::OpenAi.allowed_paths();
        let base = "http://gw.example/v1";
        let ok = target_url(base, "/responses", Some("a=1"), allowed).unwrap();
        assert_eq!(ok.as_str(), "http://gw.example/v1/responses?a=1");
        for rest in [
            "/responses/../files",
            "/responses/%2e%2e/files",
            "/responses/%2E%2E/%2e%2e/admin",
            "/chat/completions/../../files",
            "/responses\\..\\files",
            "/../../other/responses",
        ] {
            assert!(target_url(base, rest, None, allowed).is_none(), "{rest}");
        }
        let root = target_url(
            "https://api.anthropic.com",
            "/v1/messages",
            Some("beta=true"),
            Api::Anthropic.allowed_paths(),
        );
        assert_eq!(
            root.unwrap().as_str(),
            "https://api.anthropic.com/v1/messages?beta=true"
        );
    }

    #[test]
    fn bearer_and_api_key_headers_carry_the_token() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_static("Bearer tok"));
        assert_eq!(presented_token(&headers), Some(("tok", Scheme::Bearer)));
        headers.insert("x-api-key", HeaderValue::from_static("tok2"));
        assert_eq!(
            presented_token(&headers),
            Some(("tok2", Scheme::ApiKeyHeader))
        );
        let mut basic = HeaderMap::new();
        basic.insert("authorization", HeaderValue::from_static("Basic dXNlcg=="));
        assert_eq!(presented_token(&basic), None);
    }

    #[test]
    fn upstream_debug_hides_the_key() {
        let upstream = Upstream::new(Api::Anthropic, None, "sk-real");
        let text = format!("{upstream:?}");
        assert!(!text.contains("sk-real"), "{text}");
        assert_eq!(upstream.base_url, "https://api.anthropic.com");
    }
}
