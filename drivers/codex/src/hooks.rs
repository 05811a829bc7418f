//! Trusting the approval-stop hook that `command.rs` writes into the private `CODEX_HOME`.
//!
//! Codex 0.169 runs a hook from `config.toml` only once its hash is recorded as trusted
//! (`hooks.state."<key>".trusted_hash`), and the hash is Codex's own (of its normalized form of
//! the hook). So after every start the driver asks Codex (`hooks/list`) for the hash it computed
//! and records it with `config/batchWrite`, Codex's own way of trusting a hook (what its `/hooks`
//! screen does). `--dangerously-bypass-hook-trust` is not honoured by `app-server` and
//! `bypass_hook_trust`/`hooks.state` are ignored as `-c` overrides (measured). Only our hook, in
//! our config file, is ever trusted.

use std::path::Path;

use serde_json::{json, Value};

use super::command::{self, APPROVAL_STOP_HOOK_STATUS};
use super::connection::AppServer;
use provider::ProviderSettings;

/// Trusts the approval-stop hook if the settings have one. A failure is logged, not fatal: the
/// driver's interrupt still ends the turn, only without the hook's guarantee that no model
/// request slips in first.
pub(super) async fn trust_approval_stop_hook(server: &AppServer, settings: &ProviderSettings) {
    if settings.approval_stop_tools.is_empty() {
        return;
    }
    let config = command::codex_home(settings).join("config.toml");
    let params = json!({ "cwds": [settings.agent_dir.display().to_string()] });
    let listed = match server.request("hooks/list", params).await {
        Ok(listed) => listed,
        Err(err) => {
            tracing::warn!(%err, "codex hooks/list failed; approval stops rely on the interrupt alone");
            return;
        }
    };
    let Some(edits) = trust_edits(&listed, &config) else {
        tracing::warn!(
            listed = %listed,
            "codex does not list the approval-stop hook; approval stops rely on the interrupt alone"
        );
        return;
    };
    if edits.is_null() {
        return;
    }
    match server.request("config/batchWrite", edits).await {
        Ok(_) => tracing::debug!("codex approval-stop hook trusted"),
        Err(err) => tracing::warn!(
            %err,
            "trusting codex's approval-stop hook failed; approval stops rely on the interrupt alone"
        ),
    }
}

/// The `config/batchWrite` parameters that trust our hook, from a `hooks/list` result: `None`
/// when the hook is not listed, `Value::Null` when it is already trusted.
fn trust_edits(listed: &Value, config: &Path) -> Option<Value> {
    let config = config.display().to_string();
    let ours: Vec<&Value> = listed
        .get("data")?
        .as_array()?
        .iter()
        .filter_map(|entry| entry.get("hooks")?.as_array())
        .flatten()
        .filter(|hook| {
            hook.get("sourcePath").and_then(Value::as_str) == Some(config.as_str())
                && hook.get("statusMessage").and_then(Value::as_str)
                    == Some(APPROVAL_STOP_HOOK_STATUS)
        })
        .collect();
    if ours.is_empty() {
        return None;
    }
    let mut state = serde_json::Map::new();
    for hook in ours {
        if hook.get("trustStatus").and_then(Value::as_str) == Some("trusted") {
            continue;
        }
        let (Some(key), Some(hash)) = (
            hook.get("key").and_then(Value::as_str),
            hook.get("currentHash").and_then(Value::as_str),
        ) else {
            continue;
        };
        state.insert(key.to_owned(), json!({ "trusted_hash": hash }));
    }
    if state.is_empty() {
        return Some(Value::Null);
    }
    // No `filePath`: the user config, which is `config` (Codex allows no other).
    Some(json!({
        "edits": [{ "keyPath": "hooks.state", "value": state, "mergeStrategy": "upsert" }],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    /// A `hooks/list` answer as Codex 0.169 gives it (captured, trimmed), with another hook from
    /// a project file that must not be trusted.
    fn listed(trust: &str) -> Value {
        json!({ "data": [{ "cwd": "/w/agent", "errors": [], "warnings": [], "hooks": [
            {
                "key": "/w/home/.codex/config.toml:post_tool_use:0:0",
                "eventName": "postToolUse",
                "matcher": "^(?:mcp__nanoclaw__send_message)$",
                "statusMessage": APPROVAL_STOP_HOOK_STATUS,
                "sourcePath": "/w/home/.codex/config.toml",
                "source": "user",
                "currentHash": "sha256:0e59",
                "trustStatus": trust,
            },
            {
                "key": "/w/agent/.codex/config.toml:post_tool_use:0:0",
                "eventName": "postToolUse",
                "statusMessage": APPROVAL_STOP_HOOK_STATUS,
                "sourcePath": "/w/agent/.codex/config.toml",
                "source": "project",
                "currentHash": "sha256:bad",
                "trustStatus": "untrusted",
            },
        ]}]})
    }

    #[test]
    fn only_our_untrusted_hook_is_trusted() {
        let config = Path::new("/w/home/.codex/config.toml");
        let edits = trust_edits(&listed("untrusted"), config).unwrap_or_default();
        expect![[r#"{"edits":[{"keyPath":"hooks.state","mergeStrategy":"upsert","value":{"/w/home/.codex/config.toml:post_tool_use:0:0":{"trusted_hash":"sha256:0e59"}}}]}"#]]
            .assert_eq(&edits.to_string());
        // A changed hook (another tool list) is trusted again.
        assert!(trust_edits(&listed("modified"), config).is_some_and(|e| !e.is_null()));
        assert_eq!(trust_edits(&listed("trusted"), config), Some(Value::Null));
        assert_eq!(
            trust_edits(&listed("untrusted"), Path::new("/elsewhere/config.toml")),
            None
        );
        assert_eq!(trust_edits(&json!({ "data": [] }), config), None);
    }
}
