//! One HTTP/1.1 exchange per connection over TCP, TLS (rustls) or a unix socket. A CLI makes
//! one request (or holds one event stream) at a time, so there is no pool to keep healthy; a
//! library user that sends many requests pays one connect each (loopback: well under 1 ms).

use std::path::{Path, PathBuf};
use std::sync::Arc;
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
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use super::ClientError;

/// How long a TCP connect and TLS handshake (or a unix connect) may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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

    /// Connects and sends one request; the answer's body streams from the connection.
    pub(crate) async fn send(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, ClientError> {
        let mut sender = match tokio::time::timeout(CONNECT_TIMEOUT, self.connect()).await {
            Ok(sender) => sender?,
            Err(_) => {
                return Err(self.connect_error(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no connection within {CONNECT_TIMEOUT:?}"),
                )))
            }
        };
        sender
            .send_request(request)
            .await
            .map_err(|source| ClientError::Transport {
                target: self.display.clone(),
                cause: source,
            })
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
        // The connection ends with the exchange (the sender is dropped after one request).
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
