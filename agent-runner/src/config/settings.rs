//! The typed settings the runner reads, and what they answer (the selected provider's model,
//! API and binary; the hint and warning about a missing API key). Built by `build.rs`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use chrono_tz::Tz;
use credproxy::Api;
use logging::redact::{self, Secret};
use procs::EnvPolicy;
use provider::{ElicitationMode, McpServer, MockSettings, ProviderKind, ToolPolicy};

use crate::budget::BudgetLimits;
use crate::media::MediaLimits;
use crate::progress_limits::ProgressLimits;
use crate::script::ScriptLimits;
use crate::turn_control::TurnControlOptions;

/// The typed configuration: every field of the table as the runner uses it, built once by
/// [`Config::load`](super::Config::load) and read through
/// [`Config::settings`](super::Config::settings).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Workspace root, absolute; so is every other path here but a bare program name.
    pub workspace: PathBuf,
    /// The session DB (`sessionDb`).
    pub session_db: PathBuf,
    /// Create an empty session DB when none exists (`createSessionDb`).
    pub create_session_db: bool,
    /// The provider to run (`provider`).
    pub provider: ProviderKind,
    /// The agent's name as configured (`assistantName`); blank is left to each reader.
    pub assistant_name: Option<String>,
    /// Time zone of prompts and schedules (`timezone`).
    pub timezone: Tz,
    /// Its name as configured (a leading `:` removed), given to the CLI and scripts as `TZ`.
    pub timezone_name: String,
    /// User id allowed to register agent groups (`adminUserId`).
    pub admin_user_id: Option<String>,
    /// Rows per prompt, at least 1 (`maxMessagesPerPrompt`).
    pub max_messages_per_prompt: usize,
    /// Model names; [`Settings::model`] picks the selected provider's.
    pub models: Models,
    /// Reasoning effort (`effort`).
    pub effort: Option<String>,
    /// The Anthropic API (Claude).
    pub anthropic: ModelApi,
    /// The OpenAI-compatible API (Codex, OpenCode).
    pub openai: ModelApi,
    /// The Gemini API (`geminiBaseUrl`, `geminiApiKey`): Gemini CLI.
    pub gemini: ModelApi,
    /// Serve the model API through the credential proxy (`credentialProxy`).
    pub credential_proxy: bool,
    /// Explicit CLI binaries; [`Settings::cli_path`] picks the selected provider's.
    pub cli_paths: CliPaths,
    /// The ACP agent's command line (`acpCommand`); the `acp` provider needs it.
    pub acp_command: Vec<String>,
    /// The mcp-tools binary (`mcpToolsPath`); beside agent-runner when `None`.
    pub mcp_tools_path: Option<PathBuf>,
    /// Extra MCP servers (`mcpServers`), the stdio ones.
    pub mcp_servers: BTreeMap<String, McpServer>,
    /// The remote (streamable HTTP) ones of `mcpServers`; their header values are read at
    /// startup ([`crate::remote_mcp::resolve`]).
    pub remote_mcp_servers: BTreeMap<String, crate::remote_mcp::RemoteServer>,
    /// Variables passed to and scrubbed from the CLI's and scripts' environment
    /// (`envPassthrough`, `envScrubPatterns`).
    pub env_policy: EnvPolicy,
    /// The user a runner started as root drops to (`runAs`).
    pub run_as: Option<String>,
    /// The workspace's folders.
    pub dirs: Dirs,
    /// Idle poll fallback, 10 ms ..= 1 s (`idlePollMs`).
    pub idle_poll: Duration,
    /// Poll during a query, 10 ms ..= 500 ms (`activePollMs`).
    pub active_poll: Duration,
    /// `runner_state` heartbeat, 1 s ..= 10 s (`heartbeatSecs`).
    pub heartbeat: Duration,
    /// Kill a CLI silent this long mid-turn (`watchdogSecs`).
    pub watchdog: Duration,
    /// The turn's progress deadlines (`progressNoticeSecs`, `progressSilenceSecs`,
    /// `maxTurnSecs`).
    pub progress: ProgressLimits,
    /// `agent-runner health`'s limit on a turn without provider events (`healthMaxTurnSilenceSecs`).
    pub health_max_turn_silence: Duration,
    /// The CLI's own model request timeout (`cliRequestTimeoutSecs`).
    pub cli_request_timeout: Duration,
    /// The CLI's own wait for the next stream event (`cliStreamIdleSecs`).
    pub cli_stream_idle: Duration,
    /// Variables added to the CLI's environment (`cliEnv`).
    pub cli_env: EnvVars,
    /// Longest blocking MCP tool wait (`toolTimeoutSecs`).
    pub tool_timeout: Duration,
    /// Re-runs of a query after a retryable error (`queryRetries`).
    pub query_retries: u32,
    /// The CLI's own API retries (`cliMaxRetries`).
    pub cli_max_retries: u32,
    /// Pre-agent scripts (`scriptTimeoutSecs`).
    pub script: ScriptLimits,
    /// Attachment downloads (`maxAttachmentBytes`, `downloadTimeoutSecs`).
    pub media: MediaLimits,
    /// Codex follow-ups via `turn/steer` (`codexSteer`).
    pub codex_steer: bool,
    /// The mock provider's own settings (`mockDelayMs`, `mockScript`, `mockEchoSystemPrompt`).
    pub mock: MockSettings,
    /// How log lines are written (`logFormat`).
    pub log_format: logging::LogFormat,
    /// The spending limits (`maxCostUsdPerSession`, `maxCostUsdPerDay`, `maxTokensPerDay`).
    pub budgets: BudgetLimits,
    /// Most model requests per turn (`maxTurnsPerQuery`); `None`: no limit.
    pub max_turns_per_query: Option<u32>,
    /// Stopping a turn and its progress rows (`stopCommand`, `stoppedReply`, `progress`,
    /// `progressIntervalSecs`).
    pub turn_control: TurnControlOptions,
    /// Which tool calls run, and how long an ask waits (`toolPolicy`).
    pub tool_policy: ToolPolicy,
    /// MCP tools after whose result the turn ends (`approvalStopTools`).
    pub approval_stop_tools: Vec<String>,
    /// What happens to general MCP elicitations (`elicitation`).
    pub elicitation: ElicitationMode,
}

/// Variables for the CLI's environment (`cliEnv`); `Debug` masks the values of names that look
/// like secrets (`logging::redact`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EnvVars(pub BTreeMap<String, String>);

impl fmt::Debug for EnvVars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        redact::redact_env(&self.0).fmt(f)
    }
}

/// Model names by provider.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Models {
    /// Any provider's model (`model`).
    pub any: Option<String>,
    /// Claude's (`claudeModel`).
    pub claude: Option<String>,
    /// Codex's (`codexModel`).
    pub codex: Option<String>,
    /// OpenCode's (`opencodeModel`).
    pub opencode: Option<String>,
    /// Gemini CLI's (`geminiModel`).
    pub gemini: Option<String>,
    /// Qwen Code's (`qwenModel`).
    pub qwen: Option<String>,
}

/// Explicit CLI binaries by provider; found on PATH or in `.cli/` when `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CliPaths {
    /// `claudePath`.
    pub claude: Option<PathBuf>,
    /// `codexPath`.
    pub codex: Option<PathBuf>,
    /// `opencodePath`.
    pub opencode: Option<PathBuf>,
    /// `geminiPath`.
    pub gemini: Option<PathBuf>,
    /// `qwenPath`.
    pub qwen: Option<PathBuf>,
}

/// A model API as configured: where it is and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelApi {
    /// The API's shape and route.
    pub api: Api,
    /// The base URL (`anthropicBaseUrl`, `openaiBaseUrl`); the API's default when `None`.
    pub base_url: Option<String>,
    /// The key (`anthropicApiKey`, `openaiApiKey`).
    pub api_key: Option<Secret>,
    /// The key's setting, named in log lines.
    pub key_setting: &'static str,
    /// The key setting's variable (`ANTHROPIC_API_KEY`), named in hints.
    pub key_variable: &'static str,
    /// Where the key came from (`from ANTHROPIC_API_KEY_FILE`), named in hints.
    pub key_origin: String,
}

impl ModelApi {
    /// How an operator gives the CLI its key (the same words at start and in a failed query).
    fn key_fix(&self) -> String {
        format!(
            "set {var}, or {var}_FILE naming a file that holds the key (or {key} in a \
             config.json outside the workspace), and restart the runner",
            var = self.key_variable,
            key = self.key_setting
        )
    }

    /// The base URL, or the API's public default.
    pub fn endpoint(&self) -> String {
        self.base_url
            .clone()
            .unwrap_or_else(|| self.api.default_base_url().to_owned())
    }
}

/// The workspace's folders (`agentDir`, `globalDir`, `extraDir`, `downloadsDir`, `homeDir`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirs {
    /// The agent's working directory.
    pub agent: PathBuf,
    /// Global instructions (`CLAUDE.md`).
    pub global: PathBuf,
    /// Root of the additional directories; none when set to `null` in config.json.
    pub extra: Option<PathBuf>,
    /// Inbound attachments. Not read yet: the runner saves attachments under
    /// `<workspace>/downloads`, which mcp-tools' `send_file` also assumes.
    pub downloads: PathBuf,
    /// Private CLI homes, one folder per provider.
    pub home: PathBuf,
}

impl Settings {
    /// The selected provider's model: its own setting, else `model`.
    pub fn model(&self) -> Option<String> {
        let own = match self.provider {
            ProviderKind::Claude => &self.models.claude,
            ProviderKind::Codex => &self.models.codex,
            ProviderKind::OpenCode => &self.models.opencode,
            ProviderKind::Gemini => &self.models.gemini,
            ProviderKind::Qwen => &self.models.qwen,
            ProviderKind::Acp | ProviderKind::Mock => &None,
        };
        own.clone().or_else(|| self.models.any.clone())
    }

    /// The model API the selected provider's CLI speaks; `None` for the mock, which calls none.
    pub fn model_api(&self) -> Option<&ModelApi> {
        match self.provider {
            ProviderKind::Claude => Some(&self.anthropic),
            ProviderKind::Codex | ProviderKind::OpenCode | ProviderKind::Qwen => Some(&self.openai),
            ProviderKind::Gemini => Some(&self.gemini),
            // A generic ACP agent's API is known only to its own configuration (cliEnv).
            ProviderKind::Acp | ProviderKind::Mock => None,
        }
    }

    /// What to tell the user when the selected provider's model API refuses authentication
    /// (`ProviderSettings::auth_hint`, in place of a CLI's "Please run /login"); `None` for the
    /// mock.
    pub fn auth_hint(&self) -> Option<String> {
        let api = self.model_api()?;
        Some(match &api.api_key {
            None => format!(
                "no API key reached the {} CLI: {}",
                self.provider,
                api.key_fix()
            ),
            Some(_) => format!(
                "the model API at {} refused the key of {} ({}): check the key and the base URL",
                redact::redact_url(&api.endpoint()),
                api.key_setting,
                api.key_origin
            ),
        })
    }

    /// The warning to log at start when the selected CLI gets no API key: Claude then fails
    /// every message with "Not logged in", Codex and OpenCode send requests without a key, which
    /// a gateway that needs one refuses. `None` when a key is configured, for the mock, and when
    /// Claude has a credential of its own: a token variable that reaches it (`cliEnv`, or
    /// `envPassthrough` and not scrubbed) or a login stored in its home. `env` is the runner's
    /// environment.
    pub fn missing_key_warning(
        &self,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Option<String> {
        let api = self.model_api()?;
        if api.api_key.is_some() {
            return None;
        }
        let env: BTreeMap<String, String> = env.into_iter().collect();
        let own_credentials: &[&str] = match self.provider {
            ProviderKind::Claude => &["ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"],
            _ => &[],
        };
        let reaching = self.env_policy.inherited(env.clone());
        let reaches = |name: &&str| {
            reaching.contains_key(*name)
                || (self.cli_env.0.contains_key(*name) && !self.env_policy.is_scrubbed(name))
        };
        let login_file = self
            .dirs
            .home
            .join(self.provider.name())
            .join(".claude/.credentials.json");
        if own_credentials.iter().any(reaches)
            || (self.provider == ProviderKind::Claude && login_file.is_file())
        {
            return None;
        }
        let consequence = match self.provider {
            ProviderKind::Claude => "every message will fail with \"Not logged in\"".to_owned(),
            _ => format!(
                "its model requests carry no key, which a gateway that needs one refuses \
                 (401); nothing to do if {} needs none",
                redact::redact_url(&api.endpoint())
            ),
        };
        let mut warning = format!(
            "no API key for the {} CLI ({} is unset): {consequence}. To give it one, {}",
            self.provider,
            api.key_setting,
            api.key_fix()
        );
        for name in own_credentials
            .iter()
            .filter(|name| env.contains_key(**name))
        {
            warning.push_str(&format!(
                ". {name} is set but never reaches the CLI (the runner reads the key from {} \
                 only)",
                api.key_variable
            ));
        }
        Some(warning)
    }

    /// The selected provider's explicit CLI binary.
    pub fn cli_path(&self) -> Option<PathBuf> {
        match self.provider {
            ProviderKind::Claude => self.cli_paths.claude.clone(),
            ProviderKind::Codex => self.cli_paths.codex.clone(),
            ProviderKind::OpenCode => self.cli_paths.opencode.clone(),
            ProviderKind::Gemini => self.cli_paths.gemini.clone(),
            ProviderKind::Qwen => self.cli_paths.qwen.clone(),
            ProviderKind::Acp | ProviderKind::Mock => None,
        }
    }
}
