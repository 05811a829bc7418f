//! Remote MCP servers behind the proxy: `/mcp/<name>` forwards to the server's streamable HTTP
//! endpoint with the configured headers (the secrets), so the CLI holds only the session token.
//!
//! Every method is forwarded (POST for messages, GET for the server's SSE stream, DELETE to end a
//! session), bodies stream both ways, and the MCP headers (`Mcp-Session-Id`,
//! `MCP-Protocol-Version`, `Last-Event-ID`) pass through like any other end-to-end header.
//! Redirects are not followed (they would carry the secret elsewhere, or lose it): the CLI gets a
//! 502 naming where the server pointed. Errors are JSON-RPC error bodies with an HTTP status, as
//! MCP servers answer transport errors, and never carry a header value.

use std::fmt;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::{filtered, send, streamed_back, Error, Inner, DROPPED_REQUEST_HEADERS};

/// The route prefix of MCP upstreams (`/mcp/<name>`).
pub const MCP_PREFIX: &str = "mcp";

/// One remote MCP server the proxy serves at `/mcp/<name>`.
#[derive(Clone)]
pub struct McpUpstream {
    /// The server's name (config `mcpServers` key): letters, digits, `_` and `-`.
    pub name: String,
    /// Its streamable HTTP endpoint.
    pub url: String,
    /// The headers added to every request (the resolved secrets).
    pub headers: Vec<(String, String)>,
}

impl fmt::Debug for McpUpstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("McpUpstream")
            .field("name", &self.name)
            .field("url", &safe_url(&self.url))
            .field("headers", &names)
            .finish()
    }
}

/// A checked upstream: parsed URL and headers ready to insert.
pub(crate) struct McpRoute {
    pub(crate) name: String,
    url: reqwest::Url,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl McpRoute {
    /// Checks `upstream`: a valid route name, an http(s) URL, headers that HTTP can carry.
    pub(crate) fn new(upstream: McpUpstream) -> Result<Self, Error> {
        let bad = |reason: String| Error::BadMcpServer {
            name: upstream.name.clone(),
            reason,
        };
        if !valid_name(&upstream.name) {
            return Err(bad(
                "the name must be letters, digits, '_' or '-' (it is part of the route and of \
                 the tools' names)"
                    .into(),
            ));
        }
        let url = reqwest::Url::parse(&upstream.url)
            .map_err(|err| bad(format!("URL {}: {err}", safe_url(&upstream.url))))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad(format!("URL scheme {} is not http(s)", url.scheme())));
        }
        let mut headers = Vec::with_capacity(upstream.headers.len());
        for (name, value) in &upstream.headers {
            let header_name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| bad(format!("{name:?} is not a valid header name")))?;
            let mut header_value = HeaderValue::from_str(value.trim()).map_err(|_| {
                bad(format!(
                    "the value of header {name} is not a valid header value (control characters?)"
                ))
            })?;
            header_value.set_sensitive(true);
            headers.push((header_name, header_value));
        }
        Ok(Self {
            name: upstream.name,
            url,
            headers,
        })
    }

    /// The upstream URL without credentials or query, for messages and logs.
    fn endpoint(&self) -> String {
        safe_url(self.url.as_str())
    }
}

/// True for a remote MCP server name the proxy can route: letters, digits, `_` and `-` (a path
/// segment, and part of the tools' names `mcp__<name>__<tool>`).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `url` without user info or query (where secrets sit in URLs); unparsable: a placeholder.
fn safe_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut url) => {
            url.set_query(None);
            url.set_fragment(None);
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.to_string()
        }
        Err(_) => "<not a URL>".into(),
    }
}

/// A transport error as MCP servers send one: HTTP status and a JSON-RPC error body.
pub(crate) fn error(status: StatusCode, message: String) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32000, "message": message},
    });
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

/// Forwards a request whose token was checked to the server named by `rest` (`/<name>`).
pub(crate) async fn forward(inner: &Inner, rest: &str, parts: Parts, body: Body) -> Response {
    let name = rest.trim_start_matches('/').trim_end_matches('/');
    let Some(route) = inner.mcp.iter().find(|route| route.name == name) else {
        let known: Vec<&str> = inner.mcp.iter().map(|r| r.name.as_str()).collect();
        return error(
            StatusCode::NOT_FOUND,
            format!(
                "credential proxy: no remote MCP server {name:?} in this session (configured: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ),
        );
    };
    let mut url = route.url.clone();
    if let Some(query) = parts.uri.query() {
        // The CLI's query joins the configured one (which may hold a key of its own).
        let joined = match route.url.query() {
            Some(configured) => format!("{configured}&{query}"),
            None => query.to_owned(),
        };
        url.set_query(Some(&joined));
    }
    let mut headers = filtered(&parts.headers, DROPPED_REQUEST_HEADERS);
    // The body streams through unread: it keeps the CLI's own length (servers may refuse a
    // chunked POST).
    if let Some(length) = parts.headers.get(header::CONTENT_LENGTH) {
        headers.insert(header::CONTENT_LENGTH, length.clone());
    }
    for (name, value) in &route.headers {
        headers.insert(name.clone(), value.clone());
    }
    let endpoint = route.endpoint();
    tracing::debug!(method = %parts.method, server = %route.name, endpoint = %endpoint, "credential proxy: forwarding to a remote MCP server");
    let body = reqwest::Body::wrap_stream(body.into_data_stream());
    let upstream = match send(inner, parts.method.clone(), url, headers, body).await {
        Ok(response) => response,
        Err(cause) => {
            tracing::warn!(server = %route.name, endpoint = %endpoint, error = %cause, "credential proxy: the remote MCP server is unreachable");
            return error(
                StatusCode::BAD_GATEWAY,
                format!(
                    "credential proxy: cannot reach the MCP server {} at {endpoint}: {cause}",
                    route.name
                ),
            );
        }
    };
    let status = upstream.status();
    if status.is_redirection() {
        let location = upstream
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map_or_else(|| "(no Location)".to_owned(), safe_url);
        tracing::warn!(server = %route.name, endpoint = %endpoint, %status, %location, "credential proxy: the remote MCP server redirected; not followed");
        return error(
            StatusCode::BAD_GATEWAY,
            format!(
                "credential proxy: the MCP server {} answered {status} to {location}; redirects \
                 are not followed (they would carry its credentials elsewhere): configure the \
                 final URL",
                route.name
            ),
        );
    }
    streamed_back(
        upstream,
        format!("the remote MCP server {} at {endpoint}", route.name),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_path_segments() {
        assert!(valid_name("github"));
        assert!(valid_name("my-server_2"));
        assert!(!valid_name(""));
        assert!(!valid_name("a/b"));
        assert!(!valid_name("a b"));
        assert!(!valid_name(".."));
    }

    #[test]
    fn safe_url_drops_credentials_and_query() {
        assert_eq!(
            safe_url("https://user:pw@mcp.example/v1/mcp?key=secret#x"),
            "https://mcp.example/v1/mcp"
        );
        assert_eq!(safe_url("not a url"), "<not a URL>");
    }

    #[test]
    fn debug_shows_header_names_only() {
        let upstream = McpUpstream {
            name: "gh".into(),
            url: "https://mcp.example/mcp?token=secret-q".into(),
            headers: vec![("Authorization".into(), "Bearer secret-h".into())],
        };
        let text = format!("{upstream:?}");
        assert!(text.contains("Authorization"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }

    #[test]
    fn bad_upstreams_are_refused_without_their_values() {
        let with = |url: &str, header: (&str, &str)| McpUpstream {
            name: "gh".into(),
            url: url.into(),
            headers: vec![(header.0.into(), header.1.into())],
        };
        let err = |u| {
            McpRoute::new(u)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let text = err(with("ftp://x/mcp", ("A", "b")));
        assert!(text.contains("scheme ftp"), "{text}");
        let text = err(with("https://x/mcp", ("A", "line\nbreak-secret")));
        assert!(
            text.contains("header A") && !text.contains("secret"),
            "{text}"
        );
        let text = err(with("https://x/mcp", ("Bad Name", "v")));
        assert!(text.contains("header name"), "{text}");
        let text = err(McpUpstream {
            name: "a/b".into(),
            ..with("https://x/mcp", ("A", "b"))
        });
        assert!(text.contains("the name must be"), "{text}");
    }
}
