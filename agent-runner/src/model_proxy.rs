//! The credential proxy's wiring: which upstreams the selected CLI needs (its model API, the
//! remote MCP servers whose headers hold secrets), and the settings that point the CLI at the
//! proxy with the session token instead of the real base URL, key and headers.

use anyhow::{Context, Result};
use credproxy::{CredProxy, McpUpstream, Upstream};
use provider::{ProviderSettings, RemoteMcpServer};

use std::collections::BTreeMap;

use crate::config::Settings;
use crate::remote_mcp::ResolvedServer;

/// Starts the proxy when there is something to hide and `credentialProxy` is on: the selected
/// provider's API key, or remote MCP servers with headers (`remote`: the configured ones with
/// their values read, [`crate::remote_mcp::resolve`]). Without either: no proxy, and the CLI
/// uses its own login (or its own base URL settings) as before. The mock calls no model API and
/// gets no MCP servers.
pub async fn start(
    settings: &Settings,
    remote: &BTreeMap<String, ResolvedServer>,
) -> Result<Option<CredProxy>> {
    let model = model_upstream(settings);
    let mcp = mcp_upstreams(settings, remote);
    if model.is_none() && mcp.is_empty() {
        return Ok(None);
    }
    let provider = settings.provider;
    let proxy = CredProxy::start_with(model.into_iter().collect(), mcp)
        .await
        .with_context(|| {
            format!("starting the credential proxy for {provider} (or set credentialProxy=false)")
        })?;
    Ok(Some(proxy))
}

/// The remote MCP servers the proxy serves: those with headers (the others need no secret and
/// are reached directly). With `credentialProxy` off, none: the CLI gets the headers itself.
fn mcp_upstreams(
    settings: &Settings,
    remote: &BTreeMap<String, ResolvedServer>,
) -> Vec<McpUpstream> {
    if settings.provider == provider::ProviderKind::Mock {
        return Vec::new();
    }
    let with_headers = remote
        .iter()
        .filter(|(_, server)| !server.headers.is_empty());
    if !settings.credential_proxy {
        for (name, _) in with_headers {
            tracing::warn!(
                server = %name,
                "credentialProxy is off: the {} CLI gets the remote MCP server's headers in its config, where the agent can read them",
                settings.provider
            );
        }
        return Vec::new();
    }
    with_headers
        .map(|(name, server)| McpUpstream {
            name: name.clone(),
            url: server.url.clone(),
            headers: server
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        })
        .collect()
}

/// The model API upstream of the selected provider, when it has an API key and
/// `credentialProxy` is on (why not, logged).
fn model_upstream(settings: &Settings) -> Option<Upstream> {
    let provider = settings.provider;
    let model_api = settings.model_api()?;
    let Some(key) = model_api
        .api_key
        .as_ref()
        .map(|key| key.expose())
        .filter(|k| !k.trim().is_empty())
    else {
        match settings.missing_key_warning(std::env::vars()) {
            Some(warning) => tracing::warn!("{warning}"),
            None => tracing::info!(
                "no {} configured: no credential proxy, the {provider} CLI uses its own login",
                model_api.key_setting
            ),
        }
        return None;
    };
    if !settings.credential_proxy {
        tracing::warn!(
            "credentialProxy is off: the {provider} CLI gets the API key itself, where the agent can read it"
        );
        return None;
    }
    Some(Upstream::new(
        model_api.api,
        model_api.base_url.as_deref(),
        key.to_owned(),
    ))
}

/// Points `settings` at `proxy`: its URL for the CLI's base URL, its token for the CLI's key
/// (for the API the configured provider speaks), and fills `remote_mcp_servers`: a server the
/// proxy serves at its `/mcp/<name>` URL with the token as `Authorization: Bearer`, any other
/// of `remote` (no headers, or `credentialProxy` off) as configured.
pub fn apply(
    proxy: Option<&CredProxy>,
    settings: &mut ProviderSettings,
    configured: &Settings,
    remote: &BTreeMap<String, ResolvedServer>,
) {
    if configured.provider != provider::ProviderKind::Mock {
        settings.remote_mcp_servers = remote
            .iter()
            .map(|(name, server)| {
                let remote = match proxy.and_then(|proxy| Some((proxy, proxy.mcp_url(name)?))) {
                    Some((proxy, url)) => RemoteMcpServer {
                        url,
                        headers: [(
                            "Authorization".to_owned(),
                            format!("Bearer {}", proxy.token()),
                        )]
                        .into(),
                    },
                    None => RemoteMcpServer {
                        url: server.url.clone(),
                        headers: server.headers.clone(),
                    },
                };
                (name.clone(), remote)
            })
            .collect();
    }
    let Some(proxy) = proxy else {
        return;
    };
    let api = configured.model_api().map(|m| m.api);
    if let Some(api) = api.filter(|api| proxy.serves(*api)) {
        settings.base_url = Some(proxy.base_url(api));
        settings.api_key = Some(logging::redact::Secret::new(proxy.token()));
    }
    // An operator's HTTP(S)_PROXY (passed to the CLI for the gateway) must not capture the
    // CLI's requests to the loopback proxy; the runner's own client still uses it upstream.
    for name in ["NO_PROXY", "no_proxy"] {
        let existing = settings
            .cli_env
            .get(name)
            .cloned()
            .or_else(|| std::env::var(name).ok());
        settings
            .cli_env
            .insert(name.to_owned(), with_loopback(existing.as_deref()));
    }
}

/// A `NO_PROXY` list that includes the loopback names, keeping the entries it had.
fn with_loopback(existing: Option<&str>) -> String {
    let mut entries: Vec<&str> = existing
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    for loopback in ["127.0.0.1", "localhost"] {
        if !entries.contains(&loopback) {
            entries.push(loopback);
        }
    }
    entries.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Inputs};

    fn config(env: &[(&str, &str)]) -> (tempfile::TempDir, Settings) {
        let dir = tempfile::tempdir().unwrap();
        let inputs = Inputs {
            workspace: dir.path().to_path_buf(),
            config_file: None,
            flags: Vec::new(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        let settings = Config::load(&inputs).unwrap().settings().unwrap();
        (dir, settings)
    }

    #[tokio::test]
    async fn with_a_key_the_cli_gets_the_proxy_and_a_token() {
        let (dir, config) = config(&[
            ("ANTHROPIC_API_KEY", "sk-real"),
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/"),
        ]);
        let proxy = start(&config, &BTreeMap::new()).await.unwrap().unwrap();
        let mut settings = ProviderSettings::for_workspace(dir.path(), "claude");
        settings.base_url = config.anthropic.base_url.clone();
        settings.api_key = config.anthropic.api_key.clone();
        apply(Some(&proxy), &mut settings, &config, &BTreeMap::new());
        assert_eq!(
            settings
                .api_key
                .as_ref()
                .map(logging::redact::Secret::expose),
            Some(proxy.token())
        );
        assert_eq!(
            settings.base_url,
            Some(format!("http://{}/anthropic", proxy.addr()))
        );
        assert!(!format!("{settings:?}").contains("sk-real"));
        assert!(settings.cli_env["NO_PROXY"].contains("127.0.0.1"));
    }

    const REMOTE: &str = r#"{"tracker": {"type": "http", "url": "https://mcp.example/mcp",
        "headers": {"Authorization": {"env": "REMOTE_MCP_TOKEN"}}},
        "open": {"type": "http", "url": "https://open.example/mcp"}}"#;

    /// The configured remote servers of `settings` with their values read from `env`.
    fn resolved(settings: &Settings, env: &[(&str, &str)]) -> BTreeMap<String, ResolvedServer> {
        let env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        crate::remote_mcp::resolve(&settings.remote_mcp_servers, &env).unwrap()
    }

    #[tokio::test]
    async fn remote_servers_with_headers_go_through_the_proxy_even_without_a_key() {
        let vars = [
            ("AGENT_PROVIDER", "codex"),
            ("NANOCLAW_MCP_SERVERS", REMOTE),
            ("REMOTE_MCP_TOKEN", "Bearer remote-secret-value"),
            ("NANOCLAW_ENV_PASSTHROUGH", "REMOTE_MCP_TOKEN"),
        ];
        let (dir, config) = config(&vars);
        let remote = resolved(&config, &vars);
        let proxy = start(&config, &remote)
            .await
            .unwrap()
            .expect("a proxy for the headers");
        let mut settings = ProviderSettings::for_workspace(dir.path(), "codex");
        apply(Some(&proxy), &mut settings, &config, &remote);
        let tracker = &settings.remote_mcp_servers["tracker"];
        assert_eq!(tracker.url, format!("http://{}/mcp/tracker", proxy.addr()));
        assert_eq!(
            tracker.headers,
            [(
                "Authorization".to_owned(),
                format!("Bearer {}", proxy.token())
            )]
            .into()
        );
        let open = &settings.remote_mcp_servers["open"];
        assert_eq!(open.url, "https://open.example/mcp");
        assert!(open.headers.is_empty());
        // No model key: the CLI keeps its own base URL and key settings.
        assert_eq!(settings.api_key, None);
        assert!(!format!("{settings:?} {config:?} {proxy:?} {remote:?}").contains("remote-secret"));
        // The source variable never reaches the CLI, even when passed through by name.
        let env = config.env_policy.inherited([
            (
                "REMOTE_MCP_TOKEN".to_owned(),
                "Bearer remote-secret-value".to_owned(),
            ),
            ("PATH".to_owned(), "/bin".to_owned()),
        ]);
        assert_eq!(env.keys().collect::<Vec<_>>(), ["PATH"]);
    }

    #[tokio::test]
    async fn proxy_off_or_no_headers_means_the_cli_reaches_the_server_itself() {
        let vars = [
            ("AGENT_PROVIDER", "claude"),
            ("NANOCLAW_MCP_SERVERS", REMOTE),
            ("REMOTE_MCP_TOKEN", "Bearer remote-secret-value"),
            ("NANOCLAW_CREDENTIAL_PROXY", "false"),
        ];
        let (dir, off) = config(&vars);
        let remote = resolved(&off, &vars);
        assert!(start(&off, &remote).await.unwrap().is_none());
        let mut settings = ProviderSettings::for_workspace(dir.path(), "claude");
        apply(None, &mut settings, &off, &remote);
        let tracker = &settings.remote_mcp_servers["tracker"];
        assert_eq!(tracker.url, "https://mcp.example/mcp");
        assert_eq!(
            tracker.headers["Authorization"],
            "Bearer remote-secret-value"
        );
        let vars = [
            ("AGENT_PROVIDER", "claude"),
            (
                "NANOCLAW_MCP_SERVERS",
                r#"{"open": {"type": "http", "url": "https://open.example/mcp"}}"#,
            ),
        ];
        let (_dir, open_only) = config(&vars);
        let remote = resolved(&open_only, &vars);
        assert!(start(&open_only, &remote).await.unwrap().is_none());
    }

    #[test]
    fn no_proxy_keeps_its_entries_and_adds_loopback() {
        assert_eq!(with_loopback(None), "127.0.0.1,localhost");
        assert_eq!(
            with_loopback(Some("corp.example, localhost")),
            "corp.example,localhost,127.0.0.1"
        );
    }

    #[tokio::test]
    async fn no_key_or_proxy_off_or_mock_means_no_proxy() {
        let (_dir, no_key) = config(&[("AGENT_PROVIDER", "codex")]);
        assert!(start(&no_key, &BTreeMap::new()).await.unwrap().is_none());
        let (_dir, off) = config(&[
            ("AGENT_PROVIDER", "opencode"),
            ("OPENAI_API_KEY", "sk-real"),
            ("NANOCLAW_CREDENTIAL_PROXY", "false"),
        ]);
        assert!(start(&off, &BTreeMap::new()).await.unwrap().is_none());
        let (_dir, mock) = config(&[("AGENT_PROVIDER", "mock"), ("OPENAI_API_KEY", "sk-real")]);
        assert!(start(&mock, &BTreeMap::new()).await.unwrap().is_none());
        let (_dir, codex) = config(&[("AGENT_PROVIDER", "codex"), ("OPENAI_API_KEY", "sk-real")]);
        assert!(start(&codex, &BTreeMap::new()).await.unwrap().is_some());
    }
}
