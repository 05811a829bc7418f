//! The credential proxy's wiring: which upstream the selected CLI needs, and the settings that
//! point the CLI at the proxy with the session token instead of the real base URL and key.

use anyhow::{Context, Result};
use credproxy::{Api, CredProxy, Upstream};
use provider::ProviderSettings;

use crate::config::Config;

/// The API a provider's CLI speaks and the config keys of its base URL and key; `None` for
/// providers that call no model API (mock).
fn api_of(provider: &str) -> Option<(Api, &'static str, &'static str)> {
    match provider {
        "claude" => Some((Api::Anthropic, "anthropicBaseUrl", "anthropicApiKey")),
        "codex" | "opencode" => Some((Api::OpenAi, "openaiBaseUrl", "openaiApiKey")),
        _ => None,
    }
}

/// Starts the proxy for `provider` when it has an API key configured and `credentialProxy` is
/// on. Without a key there is nothing to hide: no proxy, and the CLI uses its own login (or its
/// own base URL settings) as before.
pub async fn start(config: &Config, provider: &str) -> Result<Option<CredProxy>> {
    let Some((api, base_url, api_key)) = api_of(provider) else {
        return Ok(None);
    };
    let Some(key) = config.text(api_key).filter(|k| !k.trim().is_empty()) else {
        tracing::info!(
            "no {api_key} configured: no credential proxy, the {provider} CLI uses its own login"
        );
        return Ok(None);
    };
    if !config.flag("credentialProxy") {
        tracing::warn!(
            "credentialProxy is off: the {provider} CLI gets the API key itself, where the agent can read it"
        );
        return Ok(None);
    }
    let upstream = Upstream::new(api, config.text(base_url).as_deref(), key);
    let proxy = CredProxy::start(vec![upstream]).await.with_context(|| {
        format!("starting the credential proxy for {provider} (or set credentialProxy=false)")
    })?;
    Ok(Some(proxy))
}

/// Points `settings` at `proxy`: its URL for the CLI's base URL, its token for the CLI's key.
pub fn apply(proxy: Option<&CredProxy>, settings: &mut ProviderSettings, provider: &str) {
    let (Some(proxy), Some((api, ..))) = (proxy, api_of(provider)) else {
        return;
    };
    if proxy.serves(api) {
        settings.base_url = Some(proxy.base_url(api));
        settings.api_key = Some(proxy.token().to_owned());
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
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::config::Inputs;

    fn config(env: &[(&str, &str)]) -> (tempfile::TempDir, Config) {
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
        let config = Config::load(&inputs).unwrap();
        (dir, config)
    }

    #[tokio::test]
    async fn with_a_key_the_cli_gets_the_proxy_and_a_token() {
        let (dir, config) = config(&[
            ("ANTHROPIC_API_KEY", "sk-real"),
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/"),
        ]);
        let proxy = start(&config, "claude").await.unwrap().unwrap();
        let mut settings = ProviderSettings::for_workspace(dir.path(), "claude");
        settings.base_url = config.text("anthropicBaseUrl");
        settings.api_key = config.text("anthropicApiKey");
        apply(Some(&proxy), &mut settings, "claude");
        assert_eq!(settings.api_key.as_deref(), Some(proxy.token()));
        assert_eq!(
            settings.base_url,
            Some(format!("http://{}/anthropic", proxy.addr()))
        );
        assert!(!format!("{settings:?}").contains("sk-real"));
        assert!(settings.cli_env["NO_PROXY"].contains("127.0.0.1"));
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
        let (_dir, no_key) = config(&[]);
        assert!(start(&no_key, "codex").await.unwrap().is_none());
        let (_dir, off) = config(&[
            ("OPENAI_API_KEY", "sk-real"),
            ("NANOCLAW_CREDENTIAL_PROXY", "false"),
        ]);
        assert!(start(&off, "opencode").await.unwrap().is_none());
        let (_dir, mock) = config(&[("OPENAI_API_KEY", "sk-real")]);
        assert!(start(&mock, "mock").await.unwrap().is_none());
        assert!(start(&mock, "codex").await.unwrap().is_some());
    }
}
