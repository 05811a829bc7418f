//! Remote MCP servers: config `mcpServers` entries of `"type": "http"` (streamable HTTP), beside
//! the stdio ones (`{command, args, env}`, no `type` or `"type": "stdio"`).
//!
//! ```json
//! {"mcpServers": {"tracker": {"type": "http", "url": "https://mcp.example/mcp",
//!   "headers": {"Authorization": "Bearer literal" | {"env": "NAME"} | {"file": "/run/secrets/x"}}}}}
//! ```
//!
//! The runner resolves the header values itself, once, at startup (before it drops privileges,
//! like the `_FILE` secrets): a variable that is unset or empty, or a file that cannot be read, is
//! an error naming the entry and the fix. A variable used as a source is scrubbed from everything
//! the runner starts ([`scrubbed_sources`]), and `agent-runner config` shows the sources, never
//! the values ([`redact`]). The credential proxy then serves each server with headers at
//! `/mcp/<name>` (`crate::model_proxy`), so the CLI holds only its session token.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use logging::redact::{mask, redact_url};
use serde_json::Value;

/// The name the runner's own MCP server has in every CLI: no configured server may take it.
const OWN_SERVER: &str = "nanoclaw";

/// Where a header's value comes from. `Debug` never shows a literal.
#[derive(Clone, PartialEq, Eq)]
pub enum HeaderSource {
    /// The value as written in the config.
    Literal(String),
    /// The runner's environment variable of this name.
    Env(String),
    /// The content of this file (a trailing newline removed).
    File(PathBuf),
}

impl fmt::Debug for HeaderSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderSource::Literal(_) => f.write_str("Literal(<redacted>)"),
            HeaderSource::Env(name) => f.debug_tuple("Env").field(name).finish(),
            HeaderSource::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

/// A remote MCP server as configured: checked, its header values not yet read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteServer {
    /// The streamable HTTP endpoint.
    pub url: String,
    /// The headers to send, by where their values come from.
    pub headers: BTreeMap<String, HeaderSource>,
}

/// A remote MCP server with its header values read ([`resolve`]). `Debug` shows the header names
/// only.
#[derive(Clone, PartialEq, Eq)]
pub struct ResolvedServer {
    /// The streamable HTTP endpoint.
    pub url: String,
    /// The headers with their values (secrets).
    pub headers: BTreeMap<String, String>,
}

impl fmt::Debug for ResolvedServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let masked: BTreeMap<&String, &str> =
            self.headers.keys().map(|k| (k, "<redacted>")).collect();
        f.debug_struct("ResolvedServer")
            .field("url", &redact_url(&self.url))
            .field("headers", &masked)
            .finish()
    }
}

/// True for an entry this module owns: any `type` other than `stdio` (an unknown type is then
/// refused here, by name, rather than as a stdio entry without a command).
pub(crate) fn is_remote(entry: &Value) -> bool {
    entry
        .get("type")
        .is_some_and(|kind| kind.as_str() != Some("stdio"))
}

/// The stdio entries of `mcpServers` (what `provider::McpServer` reads).
pub(crate) fn stdio_only(servers: Value) -> Value {
    match servers {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, entry)| !is_remote(entry))
                .collect(),
        ),
        other => other,
    }
}

/// The remote entries of `mcpServers`, checked (shapes, URL, names) without reading any value:
/// `agent-runner config` and the archive hook load the config too, where the sources may not be
/// readable (the hook runs in the CLI's scrubbed environment). `origin` names where the setting
/// came from.
pub(crate) fn parse(
    servers: Option<&Value>,
    origin: &str,
) -> Result<BTreeMap<String, RemoteServer>> {
    let Some(Value::Object(servers)) = servers else {
        return Ok(BTreeMap::new());
    };
    let mut out = BTreeMap::new();
    for (name, entry) in servers.iter().filter(|(_, entry)| is_remote(entry)) {
        let server =
            parse_one(name, entry).with_context(|| format!("mcpServers.{name} ({origin})"))?;
        out.insert(name.clone(), server);
    }
    Ok(out)
}

fn parse_one(name: &str, entry: &Value) -> Result<RemoteServer> {
    let kind = entry
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind != "http" {
        bail!(
            "type {} is not supported: use \"http\" (a streamable HTTP server: url, headers) or \
             \"stdio\" (command, args, env)",
            entry.get("type").map_or_else(String::new, Value::to_string)
        );
    }
    if !credproxy::valid_mcp_name(name) || name == OWN_SERVER {
        bail!(
            "the name must be letters, digits, '_' or '-' and not {OWN_SERVER:?} (it names the \
             server's tools, mcp__<name>__<tool>); rename the entry"
        );
    }
    let Value::Object(members) = entry else {
        bail!("expected an object {{\"type\": \"http\", \"url\": ..., \"headers\": {{..}}}}");
    };
    if let Some(unknown) = members
        .keys()
        .find(|key| !matches!(key.as_str(), "type" | "url" | "headers"))
    {
        bail!("unknown member {unknown:?}: an http entry has type, url and headers only");
    }
    let url = entry
        .get("url")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .context("url is missing: set the server's streamable HTTP endpoint, https://...")?;
    match reqwest::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {}
        Ok(parsed) => bail!(
            "url {} has scheme {}: use an http(s) URL",
            redact_url(url),
            parsed.scheme()
        ),
        Err(err) => bail!(
            "url {} is not an http(s) URL ({err}): use the full URL, https://...",
            redact_url(url)
        ),
    }
    let mut headers = BTreeMap::new();
    match entry.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(configured)) => {
            for (header, source) in configured {
                let source =
                    header_source(header, source).with_context(|| format!("headers.{header}"))?;
                headers.insert(header.clone(), source);
            }
        }
        Some(_) => bail!("headers must be an object of {{\"Header-Name\": value}}"),
    }
    Ok(RemoteServer {
        url: url.to_owned(),
        headers,
    })
}

/// One header's source; never names a value in an error.
fn header_source(header: &str, source: &Value) -> Result<HeaderSource> {
    if reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_err() {
        bail!("{header:?} is not a valid header name");
    }
    let reference = source.as_object().filter(|r| r.len() == 1).and_then(|r| {
        r.iter()
            .next()
            .and_then(|(k, v)| Some((k.as_str(), v.as_str()?)))
    });
    Ok(match (source, reference) {
        (Value::String(literal), _) => {
            check_value(literal.trim())?;
            HeaderSource::Literal(literal.trim().to_owned())
        }
        (_, Some(("env", name))) if !name.trim().is_empty() => {
            HeaderSource::Env(name.trim().to_owned())
        }
        (_, Some(("file", path))) if !path.trim().is_empty() => {
            HeaderSource::File(PathBuf::from(path.trim()))
        }
        _ => bail!(
            "expected a string, {{\"env\": \"NAME\"}} or {{\"file\": \"/path\"}}, got {}",
            redacted_source(source)
        ),
    })
}

/// Refuses a value HTTP cannot carry, without naming it.
fn check_value(value: &str) -> Result<()> {
    if value.is_empty() {
        bail!("the value is empty");
    }
    if reqwest::header::HeaderValue::from_str(value).is_err() {
        bail!("the value is not a valid header value (line breaks or control characters)");
    }
    Ok(())
}

/// Reads every header value: from `env` (the runner's environment) and from files. Called once
/// by the runner at startup, before it drops privileges (a root-only secret file stays
/// readable); a missing source is an error naming the entry and the fix.
pub fn resolve(
    servers: &BTreeMap<String, RemoteServer>,
    env: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, ResolvedServer>> {
    let mut out = BTreeMap::new();
    for (name, server) in servers {
        let mut headers = BTreeMap::new();
        for (header, source) in &server.headers {
            let value = read_source(source, env)
                .with_context(|| format!("mcpServers.{name}.headers.{header}"))?;
            headers.insert(header.clone(), value);
        }
        out.insert(
            name.clone(),
            ResolvedServer {
                url: server.url.clone(),
                headers,
            },
        );
    }
    Ok(out)
}

fn read_source(source: &HeaderSource, env: &BTreeMap<String, String>) -> Result<String> {
    let value = match source {
        HeaderSource::Literal(value) => return Ok(value.clone()),
        HeaderSource::Env(name) => env
            .get(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .with_context(|| {
                format!(
                    "the environment variable {name} is unset or empty: set it in the runner's \
                     environment (it is kept from the agent's)"
                )
            })?,
        HeaderSource::File(path) => {
            let text = fsguard::read_to_string(path).with_context(|| {
                format!(
                    "cannot read the secret file {}: check that it is mounted there and that \
                     the runner's user can read it (a runner started as root reads it before it \
                     drops to runAs)",
                    path.display()
                )
            })?;
            // Secret files usually end with a newline, which no header may hold.
            let text = text.trim_end_matches(['\n', '\r']).trim();
            if text.is_empty() {
                bail!("the secret file {} is empty", path.display());
            }
            text.to_owned()
        }
    };
    check_value(&value)?;
    Ok(value)
}

/// A header source as shown: a reference (`{"env": ..}`, `{"file": ..}`) as it is, a literal
/// masked, and every string in anything else masked.
fn redacted_source(source: &Value) -> Value {
    let is_reference = |reference: &serde_json::Map<String, Value>| {
        reference.len() == 1
            && reference
                .iter()
                .all(|(k, v)| matches!(k.as_str(), "env" | "file") && v.is_string())
    };
    match source {
        Value::String(literal) => Value::String(mask(literal)),
        Value::Object(reference) if is_reference(reference) => source.clone(),
        Value::Object(reference) => Value::Object(
            reference
                .iter()
                .map(|(k, v)| (k.clone(), redacted_source(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redacted_source).collect()),
        other => other.clone(),
    }
}

/// `shown` (the `mcpServers` value as the generic redaction shows it) with the headers of every
/// remote entry of `original` replaced by their sources, literal values masked whatever the
/// header's name.
pub(crate) fn redact(original: &Value, shown: Value) -> Value {
    let (Value::Object(original), Value::Object(mut shown)) = (original, shown.clone()) else {
        return shown;
    };
    for (name, entry) in original.iter().filter(|(_, entry)| is_remote(entry)) {
        let (Some(headers), Some(Value::Object(out))) = (entry.get("headers"), shown.get_mut(name))
        else {
            continue;
        };
        out.insert("headers".into(), redacted_source(headers));
    }
    Value::Object(shown)
}

/// The headers whose values are written in the config itself (`mcpServers.<name>.headers.<H>`),
/// for the warning about secrets in a config.json the agent can read.
pub(crate) fn literal_headers(
    servers: &BTreeMap<String, RemoteServer>,
) -> impl Iterator<Item = String> + '_ {
    servers.iter().flat_map(|(name, server)| {
        server
            .headers
            .iter()
            .filter(|(_, source)| matches!(source, HeaderSource::Literal(_)))
            .map(move |(header, _)| format!("mcpServers.{name}.headers.{header}"))
    })
}

/// The scrub patterns with every variable a remote server's header comes from added (exact
/// names): the value must not reach the CLI, mcp-tools or scripts, even through
/// `envPassthrough` or `cliEnv`.
pub(crate) fn scrubbed_sources(
    mut patterns: Vec<String>,
    servers: &BTreeMap<String, RemoteServer>,
) -> Vec<String> {
    let sources = servers.values().flat_map(|s| s.headers.values());
    for source in sources {
        if let HeaderSource::Env(name) = source {
            if !patterns.contains(name) {
                patterns.push(name.clone());
            }
        }
    }
    patterns
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn parse_err(servers: Value) -> String {
        format!("{:#}", parse(Some(&servers), "config.json").unwrap_err())
    }

    fn resolve_err(servers: Value, env: &BTreeMap<String, String>) -> String {
        let parsed = parse(Some(&servers), "config.json").unwrap();
        format!("{:#}", resolve(&parsed, env).unwrap_err())
    }

    #[test]
    fn headers_resolve_from_literals_env_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("header-value");
        std::fs::write(&file, "file-secret-value\n").unwrap();
        let servers = json!({
            "stdio": {"command": "npx"},
            "typed-stdio": {"type": "stdio", "command": "npx"},
            "remote": {"type": "http", "url": "https://mcp.example/mcp", "headers": {
                "Authorization": {"env": "REMOTE_TOKEN"},
                "X-Literal": "literal-value",
                "X-File": {"file": file.display().to_string()},
            }},
            "open": {"type": "http", "url": "http://127.0.0.1:9/mcp"},
        });
        let parsed = parse(Some(&servers), "config.json").unwrap();
        assert_eq!(parsed.keys().collect::<Vec<_>>(), ["open", "remote"]);
        let resolved = resolve(&parsed, &env(&[("REMOTE_TOKEN", "Bearer env-secret")])).unwrap();
        let remote = &resolved["remote"];
        assert_eq!(remote.url, "https://mcp.example/mcp");
        assert_eq!(remote.headers["Authorization"], "Bearer env-secret");
        assert_eq!(remote.headers["X-Literal"], "literal-value");
        assert_eq!(remote.headers["X-File"], "file-secret-value");
        assert!(resolved["open"].headers.is_empty());
        let debug = format!("{parsed:?} {resolved:?}");
        assert!(
            !debug.contains("secret") && !debug.contains("literal-value"),
            "{debug}"
        );
        let stdio = stdio_only(servers);
        assert_eq!(
            stdio.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["stdio", "typed-stdio"]
        );
    }

    #[test]
    fn missing_sources_are_named_with_the_fix_when_resolved() {
        let http = |headers: Value| json!({"s": {"type": "http", "url": "https://x/mcp", "headers": headers}});
        let text = resolve_err(
            http(json!({"Authorization": {"env": "UNSET_VAR"}})),
            &env(&[]),
        );
        assert!(
            text.contains("mcpServers.s.headers.Authorization")
                && text.contains("UNSET_VAR is unset or empty"),
            "{text}"
        );
        let text = resolve_err(
            http(json!({"X": {"file": "/nonexistent/secret"}})),
            &env(&[]),
        );
        assert!(
            text.contains("cannot read the secret file /nonexistent/secret"),
            "{text}"
        );
        let text = resolve_err(
            http(json!({"X": {"env": "BAD"}})),
            &env(&[("BAD", "a\u{7f}b-secret")]),
        );
        assert!(
            text.contains("not a valid header value") && !text.contains("b-secret"),
            "{text}"
        );
    }

    #[test]
    fn bad_entries_are_refused_by_name_without_their_values() {
        let http = |headers: Value| json!({"s": {"type": "http", "url": "https://x/mcp", "headers": headers}});
        let text = parse_err(http(json!({"X": {"vault": "literal-secret"}})));
        assert!(text.contains("mcpServers.s (config.json)"), "{text}");
        assert!(text.contains("expected a string, {\"env\""), "{text}");
        assert!(!text.contains("literal-secret"), "{text}");
        let text = parse_err(http(json!({"X": "a\nb-secret"})));
        assert!(
            text.contains("not a valid header value") && !text.contains("b-secret"),
            "{text}"
        );
        let text = parse_err(http(json!({"Bad Name": "v"})));
        assert!(text.contains("not a valid header name"), "{text}");
        let text = parse_err(json!({"s": {"type": "http", "url": "mcp.example/mcp"}}));
        assert!(
            text.contains("url mcp.example/mcp is not an http(s) URL"),
            "{text}"
        );
        let text = parse_err(json!({"s": {"type": "http", "url": "ftp://x/mcp"}}));
        assert!(text.contains("scheme ftp"), "{text}");
        let text = parse_err(json!({"s": {"type": "http"}}));
        assert!(text.contains("url is missing"), "{text}");
        let text = parse_err(json!({"s": {"type": "sse", "url": "https://x"}}));
        assert!(text.contains("type \"sse\" is not supported"), "{text}");
        let text = parse_err(json!({"s": {"type": "http", "url": "https://x", "command": "npx"}}));
        assert!(text.contains("unknown member \"command\""), "{text}");
        let text = parse_err(json!({"nanoclaw": {"type": "http", "url": "https://x"}}));
        assert!(text.contains("rename the entry"), "{text}");
        let text = parse_err(json!({"a/b": {"type": "http", "url": "https://x"}}));
        assert!(text.contains("rename the entry"), "{text}");
    }

    #[test]
    fn shown_entries_keep_sources_and_mask_literals() {
        let original = json!({
            "remote": {"type": "http", "url": "https://mcp.example/mcp", "headers": {
                "Authorization": {"env": "REMOTE_TOKEN"},
                "X-Custom": "literal-secret-value",
                "X-File": {"file": "/run/secrets/x"},
            }},
            "stdio": {"command": "npx", "env": {"LOG_LEVEL": "debug"}},
        });
        let shown = redact(&original, logging::redact::redact_value(&original));
        expect_test::expect![[r#"{"remote":{"headers":{"Authorization":{"env":"REMOTE_TOKEN"},"X-Custom":"lite…**** (20 chars)","X-File":{"file":"/run/secrets/x"}},"type":"http","url":"https://mcp.example/mcp"},"stdio":{"command":"npx","env":{"LOG_LEVEL":"debug"}}}"#]]
            .assert_eq(&shown.to_string());
    }

    #[test]
    fn the_config_shows_sources_and_loads_without_reading_them() {
        use crate::config::{Config, Inputs};
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            json!({"mcpServers": {"tracker": {"type": "http", "url": "https://mcp.example/mcp",
                "headers": {"Authorization": {"env": "REMOTE_MCP_TOKEN"},
                            "X-Tenant": {"file": "/nonexistent/tenant"},
                            "X-Api": "literal-secret-value"}}}})
            .to_string(),
        )
        .unwrap();
        // The archive hook loads this in the CLI's environment, where the variable is scrubbed
        // and the file may be root-only: loading reads neither.
        let config = Config::load(&Inputs {
            workspace: dir.path().to_path_buf(),
            ..Inputs::default()
        })
        .unwrap();
        let settings = config.settings().unwrap();
        let tracker = &settings.remote_mcp_servers["tracker"];
        assert_eq!(
            tracker.headers["Authorization"],
            HeaderSource::Env("REMOTE_MCP_TOKEN".into())
        );
        let shown = format!(
            "{}\n{}\n{settings:?}",
            config.describe(),
            config.describe_json()
        );
        assert!(!shown.contains("secret-value"), "{shown}");
        assert!(shown.contains(r#"{"env":"REMOTE_MCP_TOKEN"}"#), "{shown}");
        assert!(
            settings.env_policy.is_scrubbed("REMOTE_MCP_TOKEN"),
            "a source variable never reaches the CLI"
        );
        // The literal sits in a config.json the agent can read: warned about, by name only.
        let warnings = config.exposed_secrets();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("mcpServers.tracker.headers.X-Api")
                && !warnings[0].contains("secret-value"),
            "{warnings:?}"
        );
    }

    #[test]
    fn source_variables_join_the_scrub_patterns_once() {
        let server = RemoteServer {
            url: "https://x".into(),
            headers: BTreeMap::from([
                ("A".to_owned(), HeaderSource::Env("REMOTE_TOKEN".into())),
                ("B".to_owned(), HeaderSource::Env("SHARED_KEY".into())),
                ("C".to_owned(), HeaderSource::Literal("v".into())),
            ]),
        };
        let servers = BTreeMap::from([("a".to_owned(), server)]);
        assert_eq!(
            scrubbed_sources(vec!["*_TOKEN".into(), "SHARED_KEY".into()], &servers),
            ["*_TOKEN", "SHARED_KEY", "REMOTE_TOKEN"]
        );
    }
}
