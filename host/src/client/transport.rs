//! HTTP/1.1 over TCP, TLS (rustls) or a unix socket. Requests with a JSON answer reuse a
//! kept-alive connection ([`Transport::send_kept`]): a library user sending many requests paid
//! a connect (and a TLS handshake) each, which was most of a send's time over `serve` (issue
//! 40). An event stream holds a connection of its own ([`Transport::send`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper::{Request, Response, Uri};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use super::ClientError;

/// How long a TCP connect and TLS handshake (or a unix connect) may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Idle connections kept for reuse at most (one per request a caller had in flight at once).
const MAX_IDLE: usize = 8;

/// How long an idle connection is reused: well below `serve`'s idle timeout (60 s by default),
/// so that the server rarely closes one just as a request goes out on it.
const IDLE_REUSE: Duration = Duration::from_secs(20);

/// How long a kept connection may take to be ready for the next request (its last answer was
/// read to its end, so it is at once unless the server closed it).
const READY_WAIT: Duration = Duration::from_millis(200);

/// Connections whose last answer was read to its end, newest last, with when they went idle.
type IdleConnections = Arc<Mutex<Vec<(http1::SendRequest<Full<Bytes>>, Instant)>>>;

/// A kept-alive connection lent to one exchange: [`Lease::release`] after its answer was read
/// to its end puts it back for the next request; dropped unreleased (an answer not read to its
/// end), the connection closes.
pub(crate) struct Lease {
    sender: http1::SendRequest<Full<Bytes>>,
    idle: IdleConnections,
}

impl Lease {
    /// The answer was read to its end: the connection serves the next request.
    pub(crate) fn release(self) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() >= MAX_IDLE {
            idle.remove(0);
        }
        idle.push((self.sender, Instant::now()));
    }
}

/// Where the server is.
#[derive(Clone)]
enum Target {
    Tcp {
        host: String,
        port: u16,
    },
    Tls {
        host: String,
        port: u16,
        connector: TlsConnector,
        server_name: ServerName<'static>,
    },
    Unix(PathBuf),
}

/// A parsed server URL and how to connect to it.
#[derive(Clone)]
pub(crate) struct Transport {
    target: Target,
    /// `Host` header value.
    authority: String,
    /// A path prefix in the URL (behind a proxy), without a trailing `/`.
    base_path: String,
    /// The URL as given, for messages.
    display: String,
    /// Kept-alive connections, shared by the clones of this transport.
    idle: IdleConnections,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display)
    }
}

impl Transport {
    /// Parses `http://HOST[:PORT][/PREFIX]`, `https://…` or `unix:PATH`; `ca_cert` adds a PEM
    /// file of trusted roots to the system's (https only).
    pub(crate) fn parse(url: &str, ca_cert: Option<&Path>) -> Result<Self, ClientError> {
        let bad = |reason: &str| ClientError::BadUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        if let Some(path) = url.strip_prefix("unix:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(bad("no socket path after unix:"));
            }
            return Ok(Self {
                target: Target::Unix(PathBuf::from(path)),
                authority: "localhost".to_owned(),
                base_path: String::new(),
                display: url.to_owned(),
                idle: IdleConnections::default(),
            });
        }
        let uri: Uri = url.parse().map_err(|err| bad(&format!("{err}")))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(other) => return Err(bad(&format!("unknown scheme {other}"))),
            None => return Err(bad("no scheme")),
        };
        let host = uri.host().ok_or_else(|| bad("no host"))?.to_owned();
        if uri.query().is_some() {
            return Err(bad("a query has no meaning here"));
        }
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let authority = match uri.port_u16() {
            Some(port) => format!("{host}:{port}"),
            None => host.clone(),
        };
        let base_path = uri.path().trim_end_matches('/').to_owned();
        // `[::1]` in a URL is the address `::1`.
        let bare_host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(&host)
            .to_owned();
        let target = if tls {
            let server_name = ServerName::try_from(bare_host.clone())
                .map_err(|err| bad(&format!("host {bare_host}: {err}")))?;
            Target::Tls {
                host: bare_host,
                port,
                connector: TlsConnector::from(Arc::new(tls_config(ca_cert)?)),
                server_name,
            }
        } else {
            Target::Tcp {
                host: bare_host,
                port,
            }
        };
        Ok(Self {
            target,
            authority,
            base_path,
            display: url.to_owned(),
            idle: IdleConnections::default(),
        })
    }

    /// True over TCP (with or without TLS): a token is needed there.
    pub(crate) fn is_tcp(&self) -> bool {
        !matches!(self.target, Target::Unix(_))
    }

    /// The URL as given.
    pub(crate) fn display(&self) -> &str {
        &self.display
    }

    /// The request target for an API path (`/v1/…`).
    pub(crate) fn path(&self, api_path: &str) -> String {
        format!("{}{api_path}", self.base_path)
    }

    /// The `Host` header value.
    pub(crate) fn authority(&self) -> &str {
        &self.authority
    }

    /// Connects and sends one request on a connection of its own, which ends with the answer
    /// (an event stream: its body streams from the connection for as long as it is read).
    pub(crate) async fn send(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, ClientError> {
        let mut sender = self.connect_within().await?;
        sender
            .send_request(request)
            .await
            .map_err(|source| self.transport_error(source))
    }

    /// Sends one request on a kept-alive connection (a new one when none is idle and ready);
    /// the [`Lease`] gives the connection back once the answer was read to its end. A request
    /// a kept connection could not take (the server closed it meanwhile: nothing was sent) goes
    /// out on a new one.
    pub(crate) async fn send_kept(
        &self,
        mut request: Request<Full<Bytes>>,
    ) -> Result<(Response<Incoming>, Lease), ClientError> {
        while let Some(mut sender) = self.take_idle() {
            match tokio::time::timeout(READY_WAIT, sender.ready()).await {
                Ok(Ok(())) => {}
                // Closed by the server, or still busy: a new connection is cheaper than a wait.
                Ok(Err(_)) | Err(_) => continue,
            }
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, self.lease(sender))),
                Err(mut failed) => match failed.take_message() {
                    // Never written to the connection: safe to send on another.
                    Some(unsent) => request = unsent,
                    None => return Err(self.transport_error(failed.into_error())),
                },
            }
        }
        let mut sender = self.connect_within().await?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|source| self.transport_error(source))?;
        Ok((response, self.lease(sender)))
    }

    /// The newest idle connection that is not too old to reuse (older ones are closed).
    fn take_idle(&self) -> Option<http1::SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.retain(|(sender, since)| since.elapsed() < IDLE_REUSE && !sender.is_closed());
        idle.pop().map(|(sender, _)| sender)
    }

    fn lease(&self, sender: http1::SendRequest<Full<Bytes>>) -> Lease {
        Lease {
            sender,
            idle: self.idle.clone(),
        }
    }

    /// A new connection within [`CONNECT_TIMEOUT`].
    async fn connect_within(&self) -> Result<http1::SendRequest<Full<Bytes>>, ClientError> {
        match tokio::time::timeout(CONNECT_TIMEOUT, self.connect()).await {
            Ok(sender) => sender,
            Err(_) => Err(self.connect_error(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no connection within {CONNECT_TIMEOUT:?}"),
            ))),
        }
    }

    fn transport_error(&self, source: hyper::Error) -> ClientError {
        ClientError::Transport {
            target: self.display.clone(),
            cause: source,
        }
    }

    fn connect_error(&self, source: std::io::Error) -> ClientError {
        ClientError::Connect {
            target: self.display.clone(),
            cause: source,
        }
    }

    async fn connect(&self) -> Result<http1::SendRequest<Full<Bytes>>, ClientError> {
        match &self.target {
            Target::Tcp { host, port } => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(|err| self.connect_error(err))?;
                let _ = stream.set_nodelay(true);
                self.handshake(stream).await
            }
            Target::Tls {
                host,
                port,
                connector,
                server_name,
            } => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(|err| self.connect_error(err))?;
                let _ = stream.set_nodelay(true);
                let stream = connector
                    .connect(server_name.clone(), stream)
                    .await
                    .map_err(|err| {
                        // rustls reports a refused certificate (or another protocol fault) as
                        // InvalidData: no retry cures it. A reset mid-handshake is a connect
                        // error like any other.
                        if err.kind() == std::io::ErrorKind::InvalidData {
                            ClientError::Tls(format!(
                                "the TLS handshake with {} failed: {err} (a certificate no trusted root signed: pass its CA with --ca-cert PEM)",
                                self.display
                            ))
                        } else {
                            self.connect_error(err)
                        }
                    })?;
                self.handshake(stream).await
            }
            Target::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|err| self.connect_error(err))?;
                self.handshake(stream).await
            }
        }
    }

    async fn handshake<S>(&self, stream: S) -> Result<http1::SendRequest<Full<Bytes>>, ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (sender, connection) =
            http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|source| ClientError::Transport {
                    target: self.display.clone(),
                    cause: source,
                })?;
        // The connection ends when its sender is dropped and its last answer is done (an event
        // stream's, or a kept connection's closed as too old, or left unreleased).
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "API connection ended");
            }
        });
        Ok(sender)
    }
}

/// rustls with the system's roots plus `ca_cert`'s; TLS 1.2 and 1.3 with ring (as the server).
fn tls_config(ca_cert: Option<&Path>) -> Result<ClientConfig, ClientError> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        // A system root rustls cannot parse is skipped, as browsers do.
        let _ = roots.add(cert);
    }
    if let Some(path) = ca_cert {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|err| {
                ClientError::Tls(format!("reading --ca-cert {}: {err}", path.display()))
            })?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| {
                ClientError::Tls(format!("reading --ca-cert {}: {err}", path.display()))
            })?;
        if certs.is_empty() {
            return Err(ClientError::Tls(format!(
                "--ca-cert {}: no certificate in it (expected PEM `BEGIN CERTIFICATE` blocks)",
                path.display()
            )));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|err| ClientError::Tls(format!("--ca-cert {}: {err}", path.display())))?;
        }
    }
    if roots.is_empty() {
        return Err(ClientError::Tls(
            "no trusted root certificates: the system has none readable; pass --ca-cert PEM"
                .to_owned(),
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| ClientError::Tls(err.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn urls_parse_into_their_targets() {
        let http = Transport::parse("http://127.0.0.1:7450", None).unwrap();
        assert!(http.is_tcp());
        assert_eq!(http.authority(), "127.0.0.1:7450");
        assert_eq!(http.path("/v1/health"), "/v1/health");
        let prefixed = Transport::parse("http://[::1]:80/nanoclaw/", None).unwrap();
        assert_eq!(prefixed.path("/v1/health"), "/nanoclaw/v1/health");
        assert!(matches!(&prefixed.target, Target::Tcp { host, port: 80 } if host == "::1"));
        let unix = Transport::parse("unix:/run/nanoclaw.sock", None).unwrap();
        assert!(!unix.is_tcp());
        assert!(
            matches!(&unix.target, Target::Unix(path) if path == Path::new("/run/nanoclaw.sock"))
        );
    }

    #[test]
    fn bad_urls_name_what_is_wrong() {
        for (url, want) in [
            ("ftp://x:1", "unknown scheme ftp"),
            ("127.0.0.1:7450", "bad URL"),
            ("unix:", "no socket path"),
            ("http://h:1/?a=b", "a query"),
        ] {
            let err = Transport::parse(url, None).unwrap_err().to_string();
            assert!(err.contains(want), "{url}: {err}");
        }
    }

    /// A loopback HTTP/1.1 server answering `{"healthy":true}` to every request, keeping
    /// connections alive when `keep_alive`; counts the connections it accepted.
    async fn counting_server(keep_alive: bool) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                let service = hyper::service::service_fn(|_request| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
                        r#"{"healthy":true}"#,
                    ))))
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .keep_alive(keep_alive)
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        (url, accepted)
    }

    /// Requests one after another share one connection: a connect per request was most of a
    /// send's time over `serve` (issue 40).
    #[tokio::test]
    async fn sequential_requests_reuse_one_connection() {
        use std::sync::atomic::Ordering;
        let (url, accepted) = counting_server(true).await;
        let client = crate::client::Client::new(&url, Default::default()).unwrap();
        for _ in 0..5 {
            assert!(client.health().await.unwrap().healthy);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    /// A kept connection the server closed is not used again: each request still succeeds, on
    /// a new connection.
    #[tokio::test]
    async fn a_connection_the_server_closed_is_replaced() {
        use std::sync::atomic::Ordering;
        let (url, accepted) = counting_server(false).await;
        let client = crate::client::Client::new(&url, Default::default()).unwrap();
        for _ in 0..3 {
            assert!(client.health().await.unwrap().healthy);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let pem = dir.path().join("ca.pem");
        std::fs::write(&pem, "not a certificate\n").unwrap();
        let err = Transport::parse("https://localhost:1", Some(&pem))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no certificate in it"), "{err}");
    }
}
