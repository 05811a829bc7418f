//! What every CLI provider needs from the runner's configuration.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use procs::EnvPolicy;

/// An extra MCP server from the config, passed to the CLI beside `nanoclaw`. Its `Debug` masks
/// secrets ([`logging::redact`]): its environment usually holds a token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpServer {
    /// Executable.
    pub command: String,
    /// Arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment for the server.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("command", &self.command)
            .field("args", &logging::redact::redact_args(&self.args))
            .field("env", &logging::redact::redact_env(&self.env))
            .finish()
    }
}

/// A remote MCP server (config `mcpServers` entry of `type: "http"`), as the CLI must reach it:
/// streamable HTTP at `url` with `headers`. The runner resolves the configured secrets and, when
/// a header carries one, points `url` at its loopback proxy, which adds the real headers; the
/// CLI then only holds the proxy's session token. Its `Debug` masks the header values.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteMcpServer {
    /// The streamable HTTP endpoint the CLI connects to.
    pub url: String,
    /// Headers the CLI sends on every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

impl std::fmt::Debug for RemoteMcpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let masked: BTreeMap<&String, &str> =
            self.headers.keys().map(|k| (k, "<redacted>")).collect();
        f.debug_struct("RemoteMcpServer")
            .field("url", &self.url)
            .field("headers", &masked)
            .finish()
    }
}

/// What a driver does with an MCP elicitation that is not a tool-call approval (config
/// `elicitation`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ElicitationMode {
    /// Decline it (the default): nobody is asked.
    #[default]
    Decline,
    /// Ask the user in the chat when it is a simple choice or text
    /// ([`crate::ApprovalKind::Elicitation`]); decline anything else.
    Ask,
}

/// Settings shared by the Claude, Codex and OpenCode providers (the mock's own are
/// [`crate::MockSettings`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderSettings {
    /// Workspace root (`/workspace` in the container).
    pub workspace: PathBuf,
    /// The agent's working directory (`/workspace/agent`).
    pub agent_dir: PathBuf,
    /// The private HOME / config dir of the CLI (kept across restarts so sessions resume).
    pub home_dir: PathBuf,
    /// The session DB, given to mcp-tools.
    pub session_db: PathBuf,
    /// The mcp-tools binary.
    pub mcp_tools_path: PathBuf,
    /// IANA time zone, given to the CLI and mcp-tools as `TZ`.
    pub timezone: String,
    /// Admin user id, given to mcp-tools.
    pub admin_user_id: Option<String>,
    /// Model name override.
    pub model: Option<String>,
    /// Reasoning effort override, where the CLI has one.
    pub effort: Option<String>,
    /// Model API base URL (`ANTHROPIC_BASE_URL` / `OPENAI_BASE_URL`); the runner's credential
    /// proxy (`http://127.0.0.1:<port>/anthropic|openai`) when it runs one.
    pub base_url: Option<String>,
    /// Model API key (`ANTHROPIC_API_KEY` / `OPENAI_API_KEY`); the proxy's session token when
    /// the runner runs a credential proxy, so the CLI never holds the real key.
    pub api_key: Option<logging::redact::Secret>,
    /// Explicit CLI path (`CLAUDE_PATH`, ...); found on PATH or in `.cli/` when `None`.
    pub cli_path: Option<PathBuf>,
    /// Extra MCP servers by name.
    pub extra_mcp_servers: BTreeMap<String, McpServer>,
    /// Additional directories the agent may access (`/workspace/extra/*`).
    pub extra_dirs: Vec<PathBuf>,
    /// Environment allow-list and scrubbing.
    pub env_policy: EnvPolicy,
    /// A CLI that produces no event for this long during a turn is killed.
    pub watchdog: Duration,
    /// The longest an MCP tool may block (ask_user_question); CLI tool timeouts are set above it.
    pub tool_timeout: Duration,
    /// Bounded retries of the CLI's own API client.
    pub max_retries: u32,
    /// The CLI's own timeout of one model request (Claude `API_TIMEOUT_MS`, OpenCode's provider
    /// `timeout`).
    pub request_timeout: Duration,
    /// How long the CLI waits for the next event of a model stream (Codex
    /// `stream_idle_timeout_ms`).
    pub stream_idle_timeout: Duration,
    /// Variables the operator adds to the CLI's environment (config `cliEnv`). They win over
    /// the runner's tunable defaults (e.g. `API_TIMEOUT_MS`), not over what the provider needs
    /// to work (HOME, the key, its config); scrub patterns still apply.
    pub cli_env: BTreeMap<String, String>,
    /// Codex: follow-ups through native `turn/steer` instead of abort-and-restart.
    pub codex_steer: bool,
    /// Extra variables for mcp-tools (beside SESSION_DB, TZ, the admin id, WORKSPACE_DIR).
    pub mcp_env: BTreeMap<String, String>,
    /// The `agent-runner` binary, for hooks the CLI calls back into (Claude's `PreCompact` hook
    /// runs `agent-runner archive-hook`); no hook when `None`.
    pub runner_exe: Option<PathBuf>,
    /// The agent's display name (config `assistantName`), the heading of its messages in
    /// archived transcripts (`Assistant` when `None`).
    pub assistant_name: Option<String>,
    /// What to tell the user when the model API refuses authentication, in place of the CLI's
    /// own advice ("Please run /login"): which of the runner's settings provides the key. Set
    /// by the runner, which knows its settings' names; the error is left as it is when `None`.
    pub auth_hint: Option<String>,
    /// The most model requests (steps) one turn may make (config `maxTurnsPerQuery`): Claude's
    /// `--max-turns`; Codex and OpenCode count step events and interrupt the turn when reached
    /// ([`crate::InterruptReason::MaxTurns`]). `None`: no limit.
    pub max_turns_per_query: Option<u32>,
    /// Which tool calls may run (config `toolPolicy`); each driver translates it into its
    /// CLI's own mechanism and asks the runner for `ask` calls
    /// ([`crate::ProviderEvent::ApprovalRequest`]).
    pub tool_policy: crate::ToolPolicy,
    /// Canonical MCP tool names after whose result the turn ends (config `approvalStopTools`),
    /// with [`crate::InterruptReason::ApprovalStop`].
    pub approval_stop_tools: Vec<String>,
    /// What to do with general MCP elicitations (config `elicitation`).
    pub elicitation: ElicitationMode,
    /// Remote (streamable HTTP) MCP servers by name, beside `nanoclaw` and the stdio ones.
    pub remote_mcp_servers: BTreeMap<String, RemoteMcpServer>,
    /// The ACP agent's command line (config `acpCommand`), read by the `acp` provider only.
    pub acp_command: Vec<String>,
}

impl ProviderSettings {
    /// Settings for a workspace laid out like the container's, with defaults elsewhere.
    pub fn for_workspace(workspace: impl Into<PathBuf>, provider: &str) -> Self {
        let workspace = workspace.into();
        Self {
            agent_dir: workspace.join("agent"),
            home_dir: workspace.join(".home").join(provider),
            session_db: workspace.join("session.db"),
            mcp_tools_path: PathBuf::from("mcp-tools"),
            timezone: "UTC".into(),
            admin_user_id: None,
            model: None,
            effort: None,
            base_url: None,
            api_key: None,
            cli_path: None,
            extra_mcp_servers: BTreeMap::new(),
            extra_dirs: Vec::new(),
            env_policy: EnvPolicy::default(),
            watchdog: Duration::from_secs(600),
            tool_timeout: Duration::from_secs(300),
            max_retries: 2,
            request_timeout: Duration::from_secs(600),
            stream_idle_timeout: Duration::from_secs(90),
            cli_env: BTreeMap::new(),
            codex_steer: false,
            mcp_env: BTreeMap::new(),
            runner_exe: None,
            assistant_name: None,
            auth_hint: None,
            max_turns_per_query: None,
            tool_policy: crate::ToolPolicy::default(),
            approval_stop_tools: Vec::new(),
            elicitation: ElicitationMode::Decline,
            remote_mcp_servers: BTreeMap::new(),
            acp_command: Vec::new(),
            workspace,
        }
    }

    /// The start of a CLI's environment: the allow-listed and passthrough part of `parent`, then
    /// the operator's `cliEnv`, minus scrubbed names (logged). The provider sets its own
    /// variables on top; its tunable defaults go in with [`set_default_env`] so that a value
    /// the operator passed through or set here wins.
    pub fn base_env(
        &self,
        parent: impl IntoIterator<Item = (String, String)>,
    ) -> BTreeMap<String, String> {
        let mut env = self.env_policy.inherited(parent);
        for (name, value) in &self.cli_env {
            if self.env_policy.is_scrubbed(name) {
                tracing::warn!(
                    variable = %name,
                    "cliEnv names a variable that matches a scrub pattern; not passed to the CLI \
                     (change envScrubPatterns to allow it)"
                );
                continue;
            }
            env.insert(name.clone(), value.clone());
        }
        env
    }

    /// The environment mcp-tools gets, whichever CLI spawns it.
    pub fn mcp_tools_env(&self) -> BTreeMap<String, String> {
        let mut env = self.mcp_env.clone();
        env.insert("SESSION_DB".into(), self.session_db.display().to_string());
        env.insert("WORKSPACE_DIR".into(), self.workspace.display().to_string());
        env.insert("TZ".into(), self.timezone.clone());
        // The CLIs' tool timeouts are set above this; mcp-tools caps ask_user_question with it.
        env.insert(
            "NANOCLAW_MAX_QUESTION_TIMEOUT".into(),
            self.tool_timeout.as_secs().to_string(),
        );
        if let Some(admin) = &self.admin_user_id {
            env.insert("NANOCLAW_ADMIN_USER_ID".into(), admin.clone());
        }
        env
    }
}

/// Sets a tunable default in a CLI's environment unless the operator already set it (through
/// `envPassthrough` or `cliEnv`).
pub fn set_default_env(env: &mut BTreeMap<String, String>, name: &str, value: String) {
    env.entry(name.to_owned()).or_insert(value);
}

#[cfg(test)]
mod tests {
    use logging::redact::Secret;

    /// The API key in the provider settings: a `Debug` of them (a log line, an error) must not
    /// show it; the drivers read it through `expose`.
    #[test]
    fn the_api_key_in_provider_settings_is_masked_when_printed() {
        let key = "sk-ant-api03-very-secret-key-value";
        let mut settings = crate::ProviderSettings::for_workspace("/workspace", "claude");
        settings.api_key = Some(Secret::new(key));
        let printed = format!("{settings:?} {settings:#?}");
        assert!(!printed.contains(key), "{printed}");
        assert!(printed.contains("sk-a…**** (34 chars)"), "{printed}");
        assert_eq!(settings.api_key.as_ref().map(Secret::expose), Some(key));
    }
}
