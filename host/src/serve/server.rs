//! The server: where it listens ([`Listen`]), what it is given ([`ServeConfig`]), and the bound
//! [`Server`] that runs the router until shutdown. A module of its own so that `cli` and the
//! crate reach it without naming `serve/mod.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Result};

use super::limits::Limits;
use super::sessions::Served;

/// Where to listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A unix socket (mode `0600`; no token asked).
    Unix(PathBuf),
}

impl std::str::FromStr for Listen {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.strip_prefix("unix:") {
            Some(path) if !path.is_empty() => Ok(Self::Unix(PathBuf::from(path))),
            Some(_) => Err("unix: needs a path, e.g. unix:/run/nanoclaw.sock".to_owned()),
            None => text
                .parse()
                .map(Self::Tcp)
                .map_err(|_| format!("{text:?}: expected ADDR:PORT or unix:PATH")),
        }
    }
}

/// Everything a server is told.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The sessions.
    pub served: Served,
    /// Where to listen.
    pub listen: Listen,
    /// The token file (ignored on a unix socket).
    pub tokens: Option<PathBuf>,
    /// TLS certificate and key (PEM).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Allow plain HTTP on an address that is not loopback.
    pub plain_http: bool,
    /// Bounds.
    pub limits: Limits,
}

/// A server bound to its listener, ready to run.
pub struct Server {
    bound: super::listen::Bound,
    app: axum::Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
    local_addr: Option<SocketAddr>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Server {
    /// Checks the configuration, loads the tokens and TLS files, and binds the listener.
    pub async fn bind(config: ServeConfig) -> Result<Self> {
        let tls = match &config.tls {
            Some((cert, key)) => Some(super::listen::tls_acceptor(cert, key)?),
            None => None,
        };
        let tokens = match &config.listen {
            Listen::Unix(_) => None,
            Listen::Tcp(addr) => {
                if tls.is_none() && !addr.ip().is_loopback() {
                    if !config.plain_http {
                        bail!(
                            "refusing plain HTTP on {addr}, which is not loopback: tokens would cross the network in clear; give --tls-cert and --tls-key, or --plain-http behind a TLS-terminating proxy"
                        );
                    }
                    tracing::warn!(%addr, "serve: plain HTTP on an address that is not loopback (--plain-http): a TLS-terminating proxy must be in front");
                }
                let path = match (&config.tokens, &config.served) {
                    (Some(path), _) => path.clone(),
                    (None, Served::Root(root)) => root.join("tokens.json"),
                    (None, Served::Workspace { .. }) => bail!(
                        "--workspace on TCP needs --tokens FILE outside the workspace (the workspace is the agent's; it must not hold the keys)"
                    ),
                };
                let path = fsguard::absolute("--tokens", &path)?;
                config
                    .served
                    .token_file_allowed(&path)
                    .map_err(anyhow::Error::msg)?;
                Some(super::tokens::TokenStore::open(path)?)
            }
        };
        let bound = match &config.listen {
            Listen::Tcp(addr) => super::listen::bind_tcp(*addr).await?,
            Listen::Unix(path) => super::listen::bind_unix(path).await?,
        };
        let local_addr = match &bound {
            super::listen::Bound::Tcp(listener) => listener.local_addr().ok(),
            super::listen::Bound::Unix(..) => None,
        };
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let state = Arc::new(super::state::AppState {
            served: config.served.clone(),
            dbs: super::sessions::DbCache::default(),
            tokens,
            max_body: config.limits.max_body,
            body_timeout: config.limits.body_timeout,
            keep_alive_every: config.limits.keep_alive_every,
            sse_buffer: config.limits.sse_buffer.max(1),
            write_timeout: config.limits.write_timeout,
            db_lock_wait: config.limits.db_lock_wait,
            stopping: stop_rx,
        });
        Ok(Self {
            bound,
            app: super::router::router(state),
            tls,
            limits: config.limits,
            local_addr,
            stop: stop_tx,
        })
    }

    /// The TCP address it listens on (`None` on a unix socket).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Serves until `shutdown` resolves.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
        super::listen::serve(
            self.bound,
            self.app,
            self.tls,
            self.limits,
            self.stop,
            shutdown,
        )
        .await
    }
}
