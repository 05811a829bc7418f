//! A small remote MCP server for tests: streamable HTTP (rmcp's server) on 127.0.0.1, with the
//! tool `remote_echo {text}` whose result carries [`ECHO_MARKER`] (so a test sees the tool really
//! ran, and its result reached the model), recording every HTTP request's method and headers (so
//! a test can assert which auth header arrived) and every tool call's text.
//!
//! It runs on a thread of its own with its own runtime, like the fake model: usable from sync
//! tests and from async ones alike. It stops when dropped. More tools (an elicitation for
//! Codex's tests) go into [`RemoteTools`] as more `#[tool]` methods.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{schemars, tool, tool_handler, tool_router, ServerHandler};
use serde::Deserialize;

/// The name the server announces.
pub const SERVER_NAME: &str = "nanoclaw-test-remote";

/// The path the server answers on (`http://127.0.0.1:<port>/mcp`).
pub const MCP_PATH: &str = "/mcp";

/// The tool a test calls.
pub const ECHO_TOOL: &str = "remote_echo";

/// What every `remote_echo` result starts with.
pub const ECHO_MARKER: &str = "remote-echo-result-5c1f";

/// One HTTP request the server received.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// `POST`, `GET` or `DELETE`.
    pub method: String,
    /// The path and query.
    pub path: String,
    /// Headers by lower-case name (repeated ones joined with `, `).
    pub headers: BTreeMap<String, String>,
}

#[derive(Default)]
struct Recorded {
    requests: Mutex<Vec<SeenRequest>>,
    calls: Mutex<Vec<String>>,
}

impl Recorded {
    fn requests(&self) -> std::sync::MutexGuard<'_, Vec<SeenRequest>> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn calls(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `remote_echo`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct EchoArgs {
    /// The text to echo back.
    pub text: String,
}

/// The tools, one instance per MCP session.
#[derive(Clone)]
pub struct RemoteTools {
    recorded: Arc<Recorded>,
    router: Arc<ToolRouter<RemoteTools>>,
}

#[tool_router]
impl RemoteTools {
    /// Echoes `text` after [`ECHO_MARKER`], and records the call.
    #[tool(description = "Echo a text back from the remote test server.")]
    async fn remote_echo(&self, Parameters(args): Parameters<EchoArgs>) -> String {
        self.recorded.calls().push(args.text.clone());
        format!("{ECHO_MARKER}: {}", args.text)
    }
}

#[tool_handler(router = self.router)]
impl ServerHandler for RemoteTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(SERVER_NAME, "0.1.0"))
    }
}

async fn record(State(recorded): State<Arc<Recorded>>, request: Request, next: Next) -> Response {
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in request.headers() {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        headers
            .entry(name.as_str().to_owned())
            .and_modify(|joined| {
                joined.push_str(", ");
                joined.push_str(&value);
            })
            .or_insert(value);
    }
    recorded.requests().push(SeenRequest {
        method: request.method().to_string(),
        path: request
            .uri()
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers,
    });
    next.run(request).await
}

/// The running server. Stops on drop.
pub struct RemoteMcp {
    addr: SocketAddr,
    recorded: Arc<Recorded>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RemoteMcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteMcp")
            .field("addr", &self.addr)
            .finish()
    }
}

impl RemoteMcp {
    /// Starts on `127.0.0.1:0`.
    pub fn start() -> std::io::Result<RemoteMcp> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let recorded = Arc::new(Recorded::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let tools_recorded = Arc::clone(&recorded);
        let app_recorded = Arc::clone(&recorded);
        let thread = std::thread::Builder::new()
            .name("remote-mcp".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let config = StreamableHttpServerConfig::default();
                    let cancel = config.cancellation_token.clone();
                    let service = StreamableHttpService::new(
                        move || {
                            Ok(RemoteTools {
                                recorded: Arc::clone(&tools_recorded),
                                router: Arc::new(RemoteTools::tool_router()),
                            })
                        },
                        Arc::new(LocalSessionManager::default()),
                        config,
                    );
                    let app = axum::Router::new()
                        .nest_service(MCP_PATH, service)
                        .layer(middleware::from_fn_with_state(app_recorded, record));
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(err) => {
                            eprintln!("remote MCP test server: {err}");
                            return;
                        }
                    };
                    let served = axum::serve(listener, app)
                        .with_graceful_shutdown(async move {
                            let _ = stopped.await;
                            cancel.cancel();
                        })
                        .await;
                    if let Err(err) = served {
                        eprintln!("remote MCP test server: {err}");
                    }
                });
            })?;
        Ok(RemoteMcp {
            addr,
            recorded,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The server's streamable HTTP endpoint.
    pub fn url(&self) -> String {
        format!("http://{}{MCP_PATH}", self.addr)
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.recorded.requests().clone()
    }

    /// The values of header `name` (lower case) over every request, in order.
    pub fn header_values(&self, name: &str) -> Vec<String> {
        self.recorded
            .requests()
            .iter()
            .filter_map(|r| r.headers.get(name).cloned())
            .collect()
    }

    /// The texts `remote_echo` was called with.
    pub fn echo_calls(&self) -> Vec<String> {
        self.recorded.calls().clone()
    }
}

impl Drop for RemoteMcp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Open SSE streams end with the cancellation; the thread then returns.
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One JSON-RPC POST as a streamable HTTP client sends it; the reply's text (SSE or JSON).
    async fn post(
        client: &reqwest::Client,
        url: &str,
        session: Option<&str>,
        body: serde_json::Value,
    ) -> (Option<String>, String) {
        let mut request = client
            .post(url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("authorization", "Bearer test-auth-value")
            .body(body.to_string());
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        let response = request.send().await.expect("the server answers");
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (session, response.text().await.expect("a body"))
    }

    #[tokio::test]
    async fn lists_and_runs_the_echo_tool_and_records_the_headers() {
        let server = RemoteMcp::start().expect("the server starts");
        let client = reqwest::Client::new();
        let url = server.url();
        let (session, init) = post(
            &client,
            &url,
            None,
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}}),
        )
        .await;
        assert!(init.contains(SERVER_NAME), "{init}");
        let session = session.expect("a session id");
        post(
            &client,
            &url,
            Some(&session),
            serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .await;
        let (_, tools) = post(
            &client,
            &url,
            Some(&session),
            serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        )
        .await;
        assert!(tools.contains(ECHO_TOOL), "{tools}");
        let (_, called) = post(
            &client,
            &url,
            Some(&session),
            serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": ECHO_TOOL, "arguments": {"text": "hi"}}}),
        )
        .await;
        assert!(called.contains(&format!("{ECHO_MARKER}: hi")), "{called}");
        assert_eq!(server.echo_calls(), ["hi"]);
        let auth = server.header_values("authorization");
        assert_eq!(auth.len(), 4, "every request recorded: {auth:?}");
        assert!(auth.iter().all(|v| v == "Bearer test-auth-value"));
        assert!(server
            .requests()
            .iter()
            .all(|r| r.method == "POST" && r.path == MCP_PATH));
    }
}
