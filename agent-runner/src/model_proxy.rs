//! The credential proxy's wiring: which upstream the selected CLI needs, and the settings that
//! point the CLI at the proxy with the session token instead of the real base URL and key.

use anyhow::{Context, Result};
use credproxy::{CredProxy, Upstream};
use provider::ProviderSettings;

use crate::config::Settings;

/// Starts the proxy for the selected provider when it has an API key configured and
/// `credentialProxy` is on. Without a key there is nothing to hide: no proxy, and the CLI uses
/// its own login (or its own base URL settings) as before. The mock calls no model API.
pub async fn start(settings: &Settings) -> Result<Option<CredProxy>> {
    let provider = settings.provider;
    let Some(model_api) = settings.model_api() else {
        return Ok(None);
    };
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
        return Ok(None);
    };
    if !settings.credential_proxy {
        tracing::warn!(
            "credentialProxy is off: the {provider} CLI gets the API key itself, where the agent can read it"
        );
        return Ok(None);
    }
    let upstream = Upstream::new(model_api.api, model_api.base_url.as_deref(), key.to_owned());
    let proxy = CredProxy::start(vec![upstream]).await.with_context(|| {
        format!("starting the credential proxy for {provider} (or set credentialProxy=false)")
    })?;
    Ok(Some(proxy))
}

/// Points `settings` at `proxy`: its URL for the CLI's base URL, its token for the CLI's key
/// (for the API the configured provider speaks).
pub fn apply(proxy: Option<&CredProxy>, settings: &mut ProviderSettings, configured: &Settings) {
    let (Some(proxy), Some(api)) = (proxy, configured.model_api().map(|m| m.api)) else {
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
        let proxy = start(&config).await.unwrap().unwrap();
        let mut settings = ProviderSettings::for_workspace(dir.path(), "claude");
        settings.base_url = config.anthropic.base_url.clone();
        settings.api_key = config.anthropic.api_key.as_ref().map(|k| k.expose().into());
        apply(Some(&proxy), &mut settings, &config);
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
        let (_dir, no_key) = config(&[("AGENT_PROVIDER", "codex")]);
        assert!(start(&no_key).await.unwrap().is_none());
        let (_dir, off) = config(&[
            ("AGENT_PROVIDER", "opencode"),
            ("OPENAI_API_KEY", "sk-real"),
            ("NANOCLAW_CREDENTIAL_PROXY", "false"),
        ]);
        assert!(start(&off).await.unwrap().is_none());
        let (_dir, mock) = config(&[("AGENT_PROVIDER", "mock"), ("OPENAI_API_KEY", "sk-real")]);
        assert!(start(&mock).await.unwrap().is_none());
        let (_dir, codex) = config(&[("AGENT_PROVIDER", "codex"), ("OPENAI_API_KEY", "sk-real")]);
        assert!(start(&codex).await.unwrap().is_some());
    }
}
