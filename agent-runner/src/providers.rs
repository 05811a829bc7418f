//! The one place that knows every kind of provider: creating one by its name. The provider core
//! defines the trait and the kinds; each driver is a crate of its own (`claude`, `codex`,
//! `opencode`, `acp` with its presets `gemini` and `qwen`), and the mock lives in the core for demos and tests. A new driver adds its crate
//! and one arm here.

use std::sync::Arc;

use provider::{AgentProvider, MockSettings, ProviderError, ProviderKind, ProviderSettings};

/// Creates the provider of `kind` from the settings every provider shares; `mock` is read only
/// by the mock (its script, delay and echo mode).
pub(crate) fn create(
    kind: ProviderKind,
    settings: ProviderSettings,
    mock: MockSettings,
) -> Result<Arc<dyn AgentProvider>, ProviderError> {
    Ok(match kind {
        ProviderKind::Mock => Arc::new(provider::mock::MockProvider::from_settings(mock)),
        ProviderKind::Claude => Arc::new(claude::ClaudeProvider::new(settings)?),
        ProviderKind::Codex => Arc::new(codex::CodexProvider::new(settings)?),
        ProviderKind::OpenCode => Arc::new(opencode::OpenCodeProvider::new(settings)?),
        ProviderKind::Gemini => {
            Arc::new(acp::AcpProvider::new(settings, acp::AgentSpec::gemini())?)
        }
        ProviderKind::Qwen => Arc::new(acp::AcpProvider::new(settings, acp::AgentSpec::qwen())?),
        ProviderKind::Acp => {
            let spec = acp::AgentSpec::generic(&settings.acp_command)
                .map_err(|err| ProviderError::Other(err.to_string()))?;
            Arc::new(acp::AcpProvider::new(settings, spec)?)
        }
    })
}
