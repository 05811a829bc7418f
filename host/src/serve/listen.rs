//! Listening and serving connections: TCP (plain or TLS by rustls) or a unix socket, at most
//! `max_connections` at a time (the rest wait in the kernel's backlog), each with bounded
//! header, idle and write times, and a clean stop when the shutdown future resolves.

use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Semaphore};

use super::conn::{Activity, Guarded, Registry};
use super::limits::Limits;

/// The most a connection's read buffer may hold (the request head must fit in it).
const READ_BUFFER_MAX: usize = 64 * 1024;

/// How long open connections get to finish after the shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A bound listener.
pub(crate) enum Bound {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

/// Binds a TCP address.
pub(crate) async fn bind_tcp(addr: SocketAddr) -> Result<Bound> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    Ok(Bound::Tcp(listener))
}

/// Binds a unix socket at `path`, mode `0600` from the start (bound under a temporary name,
/// then renamed). An existing socket is replaced only when nothing answers on it.
pub(crate) async fn bind_unix(path: &Path) -> Result<Bound> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            bail!(
                "{} exists and is not a socket: refused (remove it or choose another path)",
                path.display()
            );
        }
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            bail!(
                "another server answers on {}: stop it or choose another path",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let listener =
        UnixListener::bind(&tmp).with_context(|| format!("listening on {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 600 {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("placing the socket {}", path.display()))?;
    Ok(Bound::Unix(listener, path.to_path_buf()))
}

/// Loads a TLS server configuration (TLS 1.2 and 1.3, ring) from PEM files.
pub(crate) fn tls_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading --tls-cert {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("--tls-cert {}: not PEM certificates", cert.display()))?;
    if certs.is_empty() {
        bail!("--tls-cert {}: no certificate in it", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("--tls-key {}: no PEM private key in it", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("TLS versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the TLS certificate and key do not fit together")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Serves `app` on `bound` until `shutdown` resolves, then gives open connections
/// [`SHUTDOWN_GRACE`] to finish.
pub(crate) async fn serve(
    bound: Bound,
    app: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
    stop_tx: watch::Sender<bool>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let registry = Arc::new(Registry::default());
    let stop_rx = stop_tx.subscribe();
    let mut last_full_warning: Option<std::time::Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = accept(&bound) => accepted,
            () = &mut shutdown => break,
        };
        let Some(conn) = accepted else { continue };
        // At the limit, the oldest connection that never sent a byte makes room; without one,
        // this connection waits for a permit and the next ones in the kernel's backlog.
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let evicted = registry.evict_oldest_silent();
                if last_full_warning.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                    last_full_warning = Some(std::time::Instant::now());
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        evicted,
                        "serve: at --max-connections; closing the oldest connections that sent nothing, else new ones wait"
                    );
                }
                tokio::select! {
                    permit = permits.clone().acquire_owned() => permit.context("connection permits")?,
                    () = &mut shutdown => break,
                }
            }
        };
        let registered = registry.register();
        let app = app.clone();
        let tls = tls.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            let slot = registered.slot.clone();
            tokio::select! {
                () = run_connection(conn, tls, app, limits, stop, slot.activity.clone()) => {}
                () = slot.evict.notified() => {
                    tracing::debug!("serve: closed a silent connection to make room");
                }
            }
            drop(registered);
            drop(permit);
        });
    }
    tracing::info!(
        "serve: shutting down; open connections get {} s",
        SHUTDOWN_GRACE.as_secs()
    );
    let _ = stop_tx.send(true);
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, permits.acquire_many(all)).await;
    if let Bound::Unix(_, path) = &bound {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Serves one accepted connection, TLS first when configured; its IO (under TLS too) records
/// activity and bounds writes.
async fn run_connection(
    conn: Accepted,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: Router,
    limits: Limits,
    stop: watch::Receiver<bool>,
    activity: Arc<Activity>,
) {
    match (conn, tls) {
        (Accepted::Tcp(tcp), Some(tls)) => {
            let io = Guarded::new(tcp, activity.clone(), limits.write_timeout);
            match tokio::time::timeout(limits.header_timeout, tls.accept(io)).await {
                Ok(Ok(stream)) => serve_connection(stream, app, limits, stop, activity).await,
                Ok(Err(err)) => tracing::debug!(error = %err, "serve: TLS handshake failed"),
                Err(_) => tracing::debug!("serve: TLS handshake timed out"),
            }
        }
        (Accepted::Tcp(tcp), None) => {
            let io = Guarded::new(tcp, activity.clone(), limits.write_timeout);
            serve_connection(io, app, limits, stop, activity).await;
        }
        (Accepted::Unix(unix), _) => {
            let io = Guarded::new(unix, activity.clone(), limits.write_timeout);
            serve_connection(io, app, limits, stop, activity).await;
        }
    }
}

enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// The next connection; `None` after an error that concerns one connection or a shortage
/// (waited out).
async fn accept(bound: &Bound) -> Option<Accepted> {
    let accepted = match bound {
        Bound::Tcp(listener) => listener.accept().await.map(|(tcp, _)| {
            // Events are small writes: without TCP_NODELAY, Nagle holds each one back.
            let _ = tcp.set_nodelay(true);
            Accepted::Tcp(tcp)
        }),
        Bound::Unix(listener, _) => listener
            .accept()
            .await
            .map(|(unix, _)| Accepted::Unix(unix)),
    };
    match accepted {
        Ok(conn) => Some(conn),
        Err(err) => {
            // Out of file descriptors, most likely: wait for some to close.
            tracing::warn!(error = %err, "serve: cannot accept a connection; trying again in 100 ms");
            tokio::time::sleep(Duration::from_millis(100)).await;
            None
        }
    }
}

/// Serves one connection: HTTP/1.1 with a bounded read buffer and header time, closed when idle
/// or at shutdown.
async fn serve_connection<IO>(
    io: IO,
    app: Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
    activity: Arc<Activity>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(app);
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(READ_BUFFER_MAX)
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let check_every = (limits.idle_timeout / 4).max(Duration::from_millis(50));
    let mut closing = false;
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(err) = served {
                    tracing::trace!(error = %err, "serve: connection ended");
                }
                return;
            }
            () = tokio::time::sleep(check_every), if !closing => {
                if activity.idle_for() >= limits.idle_timeout {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
            changed = stop.changed(), if !closing => {
                if changed.is_err() || *stop.borrow() {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}
