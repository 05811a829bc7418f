//! `mcp-tools`: the MCP server (`nanoclaw`, over stdio) that the agent CLIs spawn to act on the
//! world (docs/contract/tools.md). Every tool writes or updates rows in the session DB through the
//! `schema` crate; no SQL lives here.
//!
//! - [`config`]: flags and environment.
//! - [`transport`]: newline-delimited JSON-RPC on stdio, answering what rmcp should not see.
//! - [`server`]: the tool router and `ServerHandler` (rmcp).
//! - [`tools`]: the tools' bodies, by concern (messages, files, question, tasks, routing, times).
//! - [`memory`]: what the process asks of malloc to stay small.
//!
//! The binary (`main.rs`) only parses flags, sets up logging on stderr (stdout is the
//! protocol), opens the DB and calls [`serve`].

pub mod config;
pub mod db;
pub mod error;
pub mod memory;
pub mod params;
pub mod server;
pub mod tools;
pub mod transport;

use std::future::Future;
use std::time::Duration;

use rmcp::ServiceExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

pub use config::{Args, Config};
pub use server::NanoclawServer;

/// How long a shutdown waits for `ask_user_question` calls to clean up.
const CLEANUP_GRACE: Duration = Duration::from_secs(3);

/// Why serving stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The MCP handshake failed.
    #[error("MCP handshake failed: {0}")]
    Handshake(String),
    /// The service task failed.
    #[error("MCP service failed: {0}")]
    Service(String),
}

/// Serves `server` on `reader`/`writer` until the client closes the stream or `shutdown`
/// resolves; then waits briefly for running questions to clean up. A client that goes away
/// before `initialize` is a normal end.
pub async fn serve<R, W, F>(
    server: NanoclawServer,
    reader: R,
    writer: W,
    shutdown: F,
) -> Result<(), ServeError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
    F: Future<Output = ()>,
{
    let ct = CancellationToken::new();
    let transport = transport::LineTransport::new(reader, writer);
    let starting = server.clone().serve_with_ct(transport, ct.clone());
    tokio::pin!(shutdown);
    let running = tokio::select! {
        running = starting => match running {
            Ok(running) => running,
            Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => {
                tracing::info!("client closed the connection before initialize");
                return Ok(());
            }
            Err(err) => return Err(ServeError::Handshake(err.to_string())),
        },
        () = &mut shutdown => {
            ct.cancel();
            return Ok(());
        }
    };
    let waiting = running.waiting();
    tokio::pin!(waiting);
    let quit = tokio::select! {
        quit = &mut waiting => quit,
        () = &mut shutdown => {
            tracing::info!("shutting down");
            ct.cancel();
            waiting.await
        }
    };
    server.wait_idle(CLEANUP_GRACE).await;
    match quit {
        Ok(reason) => {
            tracing::info!(?reason, "MCP session ended");
            Ok(())
        }
        Err(err) => Err(ServeError::Service(err.to_string())),
    }
}
