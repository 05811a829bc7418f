//! Startup configuration: every setting can come from a flag (`--set key=value` or a named
//! flag), an environment variable, `/workspace/config.json`, or a default, in that order of
//! precedence. One table describes every field, so the sources never drift apart and
//! `agent-runner config` can show where each value came from.
//!
//! Two layers, as ripgrep's flags → low-level → high-level arguments: [`Config::load`] resolves
//! the table into values with their sources (what `agent-runner config` prints), then
//! [`Config::settings`] turns them, once, into the typed [`Settings`] the rest of the runner
//! reads. Nothing outside this module reads a setting by its key.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use chrono_tz::Tz;
use credproxy::Api;
use provider::process::EnvPolicy;
use provider::{McpServer, MockSettings, ProviderKind};
use serde_json::Value;

use crate::media::MediaLimits;
use crate::runner::ProgressLimits;
use crate::script::ScriptLimits;

/// What a field holds, for parsing env and flag strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Path,
    Number,
    Bool,
    /// Comma-separated in env and flags, an array in the file.
    List,
    /// JSON in env and flags, an object in the file.
    Object,
    /// Any JSON value.
    Json,
}

/// One configurable field.
struct Field {
    /// Key in config.json and in `--set`.
    key: &'static str,
    /// Environment variable.
    env: &'static str,
    kind: Kind,
    /// Masked when printed.
    secret: bool,
    /// Default as text (empty = unset).
    default: &'static str,
    help: &'static str,
}

const fn field(
    key: &'static str,
    env: &'static str,
    kind: Kind,
    default: &'static str,
    help: &'static str,
) -> Field {
    Field {
        key,
        env,
        kind,
        secret: false,
        default,
        help,
    }
}

const fn secret(key: &'static str, env: &'static str, help: &'static str) -> Field {
    Field {
        key,
        env,
        kind: Kind::Text,
        secret: true,
        default: "",
        help,
    }
}

/// Every field. Paths default relative to the workspace (resolved after the workspace is known).
const FIELDS: &[Field] = &[
    field(
        "sessionDb",
        "SESSION_DB",
        Kind::Path,
        "session.db",
        "the session DB",
    ),
    field(
        "createSessionDb",
        "NANOCLAW_CREATE_DB",
        Kind::Bool,
        "false",
        "create an empty session DB when none exists (normally the host creates it: nanoclaw init)",
    ),
    field(
        "provider",
        "AGENT_PROVIDER",
        Kind::Text,
        "claude",
        "claude | codex | opencode | mock",
    ),
    field(
        "assistantName",
        "NANOCLAW_ASSISTANT_NAME",
        Kind::Text,
        "Assistant",
        "the agent's name",
    ),
    field(
        "timezone",
        "TZ",
        Kind::Text,
        "UTC",
        "IANA time zone for prompts and schedules",
    ),
    field(
        "adminUserId",
        "NANOCLAW_ADMIN_USER_ID",
        Kind::Text,
        "",
        "user id allowed to register agent groups",
    ),
    field(
        "maxMessagesPerPrompt",
        "NANOCLAW_MAX_MESSAGES_PER_PROMPT",
        Kind::Number,
        "10",
        "rows per prompt",
    ),
    field(
        "model",
        "NANOCLAW_MODEL",
        Kind::Text,
        "",
        "model for the selected provider (CLAUDE_MODEL / CODEX_MODEL / OPENCODE_MODEL win)",
    ),
    field(
        "claudeModel",
        "CLAUDE_MODEL",
        Kind::Text,
        "",
        "Claude model",
    ),
    field("codexModel", "CODEX_MODEL", Kind::Text, "", "Codex model"),
    field(
        "opencodeModel",
        "OPENCODE_MODEL",
        Kind::Text,
        "",
        "OpenCode model",
    ),
    field(
        "effort",
        "NANOCLAW_EFFORT",
        Kind::Text,
        "",
        "reasoning effort, where the CLI has one",
    ),
    field(
        "anthropicBaseUrl",
        "ANTHROPIC_BASE_URL",
        Kind::Text,
        "",
        "Anthropic API base URL (Claude)",
    ),
    secret(
        "anthropicApiKey",
        "ANTHROPIC_API_KEY",
        "Anthropic API key (Claude)",
    ),
    field(
        "openaiBaseUrl",
        "OPENAI_BASE_URL",
        Kind::Text,
        "",
        "OpenAI-compatible base URL (Codex, OpenCode)",
    ),
    secret(
        "openaiApiKey",
        "OPENAI_API_KEY",
        "OpenAI-compatible API key (Codex, OpenCode)",
    ),
    field(
        "credentialProxy",
        "NANOCLAW_CREDENTIAL_PROXY",
        Kind::Bool,
        "true",
        "serve the model API on 127.0.0.1 and give the CLI a session token, never the API key (false: the CLI gets the key)",
    ),
    field(
        "claudePath",
        "CLAUDE_PATH",
        Kind::Path,
        "",
        "claude CLI (default: PATH, then .cli/)",
    ),
    field(
        "codexPath",
        "CODEX_PATH",
        Kind::Path,
        "",
        "codex CLI (default: PATH, then .cli/)",
    ),
    field(
        "opencodePath",
        "OPENCODE_PATH",
        Kind::Path,
        "",
        "opencode CLI (default: PATH, then .cli/)",
    ),
    field(
        "mcpToolsPath",
        "MCP_TOOLS_PATH",
        Kind::Path,
        "",
        "mcp-tools binary (default: beside agent-runner)",
    ),
    field(
        "mcpServers",
        "NANOCLAW_MCP_SERVERS",
        Kind::Object,
        "",
        "extra MCP servers {name: {command, args, env}}",
    ),
    field(
        "envScrubPatterns",
        "NANOCLAW_ENV_SCRUB",
        Kind::List,
        "*_TOKEN,*_SECRET,*_SECRET_*,*_PASSWORD,DATABASE_URL,*_DATABASE_URL,*_PRIVATE_KEY",
        "variables never passed to the CLI",
    ),
    field(
        "envPassthrough",
        "NANOCLAW_ENV_PASSTHROUGH",
        Kind::List,
        "",
        "extra variables passed to the CLI",
    ),
    field(
        "runAs",
        "NANOCLAW_RUN_AS",
        Kind::Text,
        "",
        "started as root: read secrets, then drop to this user (name, uid or uid:gid)",
    ),
    field(
        "agentDir",
        "NANOCLAW_AGENT_DIR",
        Kind::Path,
        "agent",
        "the agent's working directory",
    ),
    field(
        "globalDir",
        "NANOCLAW_GLOBAL_DIR",
        Kind::Path,
        "global",
        "global instructions (CLAUDE.md)",
    ),
    field(
        "extraDir",
        "NANOCLAW_EXTRA_DIR",
        Kind::Path,
        "extra",
        "additional directories root",
    ),
    field(
        "downloadsDir",
        "NANOCLAW_DOWNLOADS_DIR",
        Kind::Path,
        "downloads",
        "inbound attachments",
    ),
    field(
        "homeDir",
        "NANOCLAW_HOME_DIR",
        Kind::Path,
        ".home",
        "private CLI homes (kept for resume)",
    ),
    field(
        "idlePollMs",
        "NANOCLAW_IDLE_POLL_MS",
        Kind::Number,
        "1000",
        "idle poll fallback (max 1000)",
    ),
    field(
        "activePollMs",
        "NANOCLAW_ACTIVE_POLL_MS",
        Kind::Number,
        "500",
        "poll during a query (max 500)",
    ),
    field(
        "heartbeatSecs",
        "NANOCLAW_HEARTBEAT_SECS",
        Kind::Number,
        "5",
        "runner_state heartbeat (max 10)",
    ),
    field(
        "watchdogSecs",
        "NANOCLAW_WATCHDOG_SECS",
        Kind::Number,
        "600",
        "kill a CLI silent this long mid-turn",
    ),
    field(
        "progressNoticeSecs",
        "NANOCLAW_PROGRESS_NOTICE_SECS",
        Kind::Number,
        "60",
        "end a turn whose CLI reports retries/reconnects with no model output for this long (0 = off)",
    ),
    field(
        "progressSilenceSecs",
        "NANOCLAW_PROGRESS_SILENCE_SECS",
        Kind::Number,
        "120",
        "end a turn with no model output for this long while no tool runs (0 = off)",
    ),
    field(
        "maxTurnSecs",
        "NANOCLAW_MAX_TURN_SECS",
        Kind::Number,
        "10800",
        "hard cap on one turn's total duration, tools included (0 = off)",
    ),
    field(
        "cliRequestTimeoutSecs",
        "NANOCLAW_CLI_REQUEST_TIMEOUT_SECS",
        Kind::Number,
        "600",
        "the CLI's own model request timeout (Claude API_TIMEOUT_MS, OpenCode timeout)",
    ),
    field(
        "cliStreamIdleSecs",
        "NANOCLAW_CLI_STREAM_IDLE_SECS",
        Kind::Number,
        "90",
        "the CLI's own wait for the next stream event (Codex stream_idle_timeout_ms)",
    ),
    field(
        "cliEnv",
        "NANOCLAW_CLI_ENV",
        Kind::Object,
        "",
        "variables added to the CLI's environment {NAME: value}; win over the runner's defaults (e.g. API_TIMEOUT_MS), scrub patterns apply",
    ),
    field(
        "toolTimeoutSecs",
        "NANOCLAW_TOOL_TIMEOUT_SECS",
        Kind::Number,
        "300",
        "longest blocking MCP tool wait",
    ),
    field(
        "queryRetries",
        "NANOCLAW_QUERY_RETRIES",
        Kind::Number,
        "2",
        "re-runs of a query after a retryable error",
    ),
    field(
        "cliMaxRetries",
        "NANOCLAW_CLI_MAX_RETRIES",
        Kind::Number,
        "2",
        "the CLI's own API retries",
    ),
    field(
        "scriptTimeoutSecs",
        "NANOCLAW_SCRIPT_TIMEOUT_SECS",
        Kind::Number,
        "30",
        "pre-agent script timeout",
    ),
    field(
        "maxAttachmentBytes",
        "NANOCLAW_MAX_ATTACHMENT_BYTES",
        Kind::Number,
        "26214400",
        "largest attachment download",
    ),
    field(
        "downloadTimeoutSecs",
        "NANOCLAW_DOWNLOAD_TIMEOUT_SECS",
        Kind::Number,
        "30",
        "attachment download timeout",
    ),
    field(
        "codexSteer",
        "NANOCLAW_CODEX_STEER",
        Kind::Bool,
        "false",
        "Codex follow-ups via turn/steer",
    ),
    field(
        "mockDelayMs",
        "NANOCLAW_MOCK_DELAY_MS",
        Kind::Number,
        "0",
        "mock provider: think time per prompt",
    ),
    field(
        "mockScript",
        "NANOCLAW_MOCK_SCRIPT",
        Kind::Json,
        "",
        "mock provider: steps [{\"step\":\"echo\"|\"reply\"|\"fail\",..}]",
    ),
    field(
        "mockEchoSystemPrompt",
        "NANOCLAW_MOCK_ECHO_SYSTEM",
        Kind::Bool,
        "false",
        "mock provider: echo the system prompt, a --- line, then the prompt",
    ),
];

/// Where a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A command-line flag.
    Flag,
    /// An environment variable.
    Env,
    /// The file named by a secret's `<VAR>_FILE` environment variable.
    EnvFile,
    /// config.json.
    File,
    /// The built-in default.
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Flag => "flag",
            Source::Env => "env",
            Source::EnvFile => "env file",
            Source::File => "config.json",
            Source::Default => "default",
        })
    }
}

/// The inputs of configuration, gathered by `main`.
#[derive(Debug, Default)]
pub struct Inputs {
    /// Workspace root from the flag or `WORKSPACE_DIR` (default `/workspace`).
    pub workspace: PathBuf,
    /// config.json path (`--config`, `NANOCLAW_CONFIG`, default `<workspace>/config.json`).
    pub config_file: Option<PathBuf>,
    /// `key=value` pairs from flags.
    pub flags: Vec<(String, String)>,
    /// The environment.
    pub env: BTreeMap<String, String>,
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Workspace root.
    pub workspace: PathBuf,
    /// config.json used (if it existed).
    pub config_file: Option<PathBuf>,
    values: BTreeMap<&'static str, (Value, Source)>,
}

impl Config {
    /// Resolves every field: flags > env > file > defaults, validating types and naming the
    /// field (and the file) on error.
    pub fn load(inputs: &Inputs) -> Result<Self> {
        let config_file = inputs
            .config_file
            .clone()
            .unwrap_or_else(|| inputs.workspace.join("config.json"));
        let file_values = read_file(&config_file)?;
        let mut values = BTreeMap::new();
        for field in FIELDS {
            let flag = inputs.flags.iter().rev().find(|(key, _)| key == field.key);
            let value = if let Some((_, text)) = flag {
                Some((
                    parse_text(field, text).with_context(|| format!("flag --set {}", field.key))?,
                    Source::Flag,
                ))
            } else if let Some((text, source)) = env_text(field, &inputs.env)? {
                Some((
                    parse_text(field, &text)
                        .with_context(|| format!("environment variable {}", field.env))?,
                    source,
                ))
            } else if let Some(value) = file_values.as_ref().and_then(|m| m.get(field.key)) {
                check_file_value(field, value).with_context(|| {
                    format!("{}: field \"{}\"", config_file.display(), field.key)
                })?;
                Some((value.clone(), Source::File))
            } else if !field.default.is_empty() {
                Some((parse_text(field, field.default)?, Source::Default))
            } else {
                None
            };
            if let Some(value) = value.filter(|(v, _)| !v.is_null()) {
                values.insert(field.key, value);
            }
        }
        for (key, _) in &inputs.flags {
            if !FIELDS.iter().any(|f| f.key == key) {
                bail!("unknown setting {key:?} in --set (see `agent-runner --help` for the keys)");
            }
        }
        let config = Self {
            workspace: inputs.workspace.clone(),
            config_file: file_values.is_some().then_some(config_file),
            values,
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<()> {
        let provider = self.text("provider").unwrap_or_default();
        if provider.parse::<ProviderKind>().is_err() {
            bail!(
                "provider {provider:?} ({}) is not one of {}",
                self.source_of("provider"),
                ProviderKind::names(", ")
            );
        }
        schema::cron::parse_tz(&self.timezone_name())
            .with_context(|| format!("timezone ({})", self.source_of("timezone")))?;
        if self.number("maxMessagesPerPrompt") == 0 {
            bail!(
                "maxMessagesPerPrompt ({}) must be at least 1",
                self.source_of("maxMessagesPerPrompt")
            );
        }
        Ok(())
    }

    fn source_of(&self, key: &str) -> String {
        let field = FIELDS.iter().find(|f| f.key == key);
        match (self.values.get(key), field) {
            (Some((_, Source::Env)), Some(field)) => format!("from {}", field.env),
            (Some((_, Source::EnvFile)), Some(field)) => format!("from {}_FILE", field.env),
            (Some((_, source)), _) => format!("from {source}"),
            _ => "unset".into(),
        }
    }

    /// A text field.
    fn text(&self, key: &str) -> Option<String> {
        match self.values.get(key) {
            Some((Value::String(text), _)) => Some(text.clone()),
            Some((Value::Number(n), _)) => Some(n.to_string()),
            Some((Value::Bool(b), _)) => Some(b.to_string()),
            _ => None,
        }
    }

    /// A numeric field (0 when unset).
    fn number(&self, key: &str) -> u64 {
        self.values
            .get(key)
            .and_then(|(v, _)| v.as_u64())
            .unwrap_or(0)
    }

    /// A boolean field.
    fn flag(&self, key: &str) -> bool {
        self.values
            .get(key)
            .and_then(|(v, _)| v.as_bool())
            .unwrap_or(false)
    }

    /// A list field.
    fn list(&self, key: &str) -> Vec<String> {
        match self.values.get(key) {
            Some((Value::Array(items), _)) => items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// An object field.
    fn object(&self, key: &str) -> Option<Value> {
        self.values.get(key).map(|(v, _)| v.clone())
    }

    /// A path field. Relative paths from a flag or the environment are taken as given (relative
    /// to the current directory, as a shell user expects); relative paths from config.json or a
    /// default are relative to the workspace.
    fn path(&self, key: &str) -> Option<PathBuf> {
        let (value, source) = self.values.get(key)?;
        let text = value.as_str()?;
        Some(match source {
            Source::Flag | Source::Env | Source::EnvFile => PathBuf::from(text),
            Source::File | Source::Default => self.workspace.join(text),
        })
    }

    /// A duration field given in seconds.
    fn secs(&self, key: &str) -> Duration {
        Duration::from_secs(self.number(key))
    }

    /// A duration field given in milliseconds.
    fn millis(&self, key: &str) -> Duration {
        Duration::from_millis(self.number(key))
    }

    /// The IANA time zone name.
    fn timezone_name(&self) -> String {
        self.text("timezone")
            .map(|tz| tz.trim_start_matches(':').to_owned())
            .unwrap_or_else(|| "UTC".into())
    }

    /// Warnings about secrets the agent can read: a secret that came from a config.json inside
    /// the workspace (the agent's user can read, even edit, everything there).
    pub fn exposed_secrets(&self) -> Vec<String> {
        let Some(file) = &self.config_file else {
            return Vec::new();
        };
        let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        if !canonical(file).starts_with(canonical(&self.workspace)) {
            return Vec::new();
        }
        FIELDS
            .iter()
            .filter(|f| f.secret)
            .filter(|f| matches!(self.values.get(f.key), Some((_, Source::File))))
            .map(|f| {
                format!(
                    "{} comes from {}, inside the workspace, where the agent can read it: move it \
                     to a file outside the workspace named by {}_FILE, or to {}",
                    f.key,
                    file.display(),
                    f.env,
                    f.env
                )
            })
            .collect()
    }

    /// Lines for `agent-runner config`: every field, its value (secrets masked) and source.
    pub fn describe(&self) -> String {
        let mut out = format!("workspace = {}\n", self.workspace.display());
        out.push_str(&format!(
            "config file = {}\n",
            self.config_file
                .as_ref()
                .map_or("(none)".into(), |p| p.display().to_string())
        ));
        for field in FIELDS {
            let (shown, source) = match self.values.get(field.key) {
                None => ("(unset)".to_owned(), String::new()),
                Some((value, source)) => {
                    let text = match value {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    let shown = if field.secret { mask(&text) } else { text };
                    let origin = match source {
                        Source::Env => format!("  [env {}]", field.env),
                        Source::EnvFile => format!("  [file from {}_FILE]", field.env),
                        other => format!("  [{other}]"),
                    };
                    (shown, origin)
                }
            };
            out.push_str(&format!("{} = {shown}{source}\n", field.key));
        }
        out
    }
}

/// The typed configuration: every field of the table as the runner uses it, made once by
/// [`Config::settings`].
#[derive(Debug, Clone)]
pub struct Settings {
    /// Workspace root.
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
    /// Serve the model API through the credential proxy (`credentialProxy`).
    pub credential_proxy: bool,
    /// Explicit CLI binaries; [`Settings::cli_path`] picks the selected provider's.
    pub cli_paths: CliPaths,
    /// The mcp-tools binary (`mcpToolsPath`); beside agent-runner when `None`.
    pub mcp_tools_path: Option<PathBuf>,
    /// Extra MCP servers (`mcpServers`).
    pub mcp_servers: BTreeMap<String, McpServer>,
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
    /// The CLI's own model request timeout (`cliRequestTimeoutSecs`).
    pub cli_request_timeout: Duration,
    /// The CLI's own wait for the next stream event (`cliStreamIdleSecs`).
    pub cli_stream_idle: Duration,
    /// Variables added to the CLI's environment (`cliEnv`).
    pub cli_env: BTreeMap<String, String>,
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
}

impl ModelApi {
    /// The base URL, or the API's public default.
    pub fn endpoint(&self) -> String {
        self.base_url
            .clone()
            .unwrap_or_else(|| self.api.default_base_url().to_owned())
    }
}

/// A secret value: masked by `Debug`, so logging settings never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&mask(&self.0))
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
            ProviderKind::Mock => &None,
        };
        own.clone().or_else(|| self.models.any.clone())
    }

    /// The model API the selected provider's CLI speaks; `None` for the mock, which calls none.
    pub fn model_api(&self) -> Option<&ModelApi> {
        match self.provider {
            ProviderKind::Claude => Some(&self.anthropic),
            ProviderKind::Codex | ProviderKind::OpenCode => Some(&self.openai),
            ProviderKind::Mock => None,
        }
    }

    /// The selected provider's explicit CLI binary.
    pub fn cli_path(&self) -> Option<PathBuf> {
        match self.provider {
            ProviderKind::Claude => self.cli_paths.claude.clone(),
            ProviderKind::Codex => self.cli_paths.codex.clone(),
            ProviderKind::OpenCode => self.cli_paths.opencode.clone(),
            ProviderKind::Mock => None,
        }
    }
}

impl Config {
    /// The typed settings: the one place values become types. Fails where the table cannot
    /// check a value's shape (`mcpServers`, `cliEnv`, `mockScript`), naming the key.
    pub fn settings(&self) -> Result<Settings> {
        // `load` validated these; parsing again keeps this free of unwraps.
        let provider = self
            .text("provider")
            .unwrap_or_default()
            .parse::<ProviderKind>()?;
        let timezone_name = self.timezone_name();
        let timezone = schema::cron::parse_tz(&timezone_name)
            .with_context(|| format!("timezone ({})", self.source_of("timezone")))?;
        let mcp_servers = match self.object("mcpServers") {
            Some(servers) => serde_json::from_value(servers)
                .context("mcpServers: expected {name: {command, args, env}}")?,
            None => BTreeMap::new(),
        };
        let cli_env = match self.object("cliEnv") {
            Some(env) => serde_json::from_value(env)
                .context("cliEnv: expected an object of {\"NAME\": \"value\"} strings")?,
            None => BTreeMap::new(),
        };
        let mock_script = match self.object("mockScript") {
            Some(script) => {
                serde_json::from_value(script).context("mockScript: expected [{\"step\": ...}]")?
            }
            None => Vec::new(),
        };
        let model_api = |api: Api, base_url: &str, api_key: &'static str| ModelApi {
            api,
            base_url: self.text(base_url),
            api_key: self.text(api_key).map(Secret),
            key_setting: api_key,
        };
        Ok(Settings {
            workspace: self.workspace.clone(),
            session_db: self.path("sessionDb").context("sessionDb is not set")?,
            create_session_db: self.flag("createSessionDb"),
            provider,
            assistant_name: self.text("assistantName"),
            timezone,
            timezone_name,
            admin_user_id: self.text("adminUserId"),
            max_messages_per_prompt: usize::try_from(self.number("maxMessagesPerPrompt"))
                .unwrap_or(10)
                .max(1),
            models: Models {
                any: self.text("model"),
                claude: self.text("claudeModel"),
                codex: self.text("codexModel"),
                opencode: self.text("opencodeModel"),
            },
            effort: self.text("effort"),
            anthropic: model_api(Api::Anthropic, "anthropicBaseUrl", "anthropicApiKey"),
            openai: model_api(Api::OpenAi, "openaiBaseUrl", "openaiApiKey"),
            credential_proxy: self.flag("credentialProxy"),
            // Taken as given, never relative to the workspace.
            cli_paths: CliPaths {
                claude: self.text("claudePath").map(PathBuf::from),
                codex: self.text("codexPath").map(PathBuf::from),
                opencode: self.text("opencodePath").map(PathBuf::from),
            },
            mcp_tools_path: self.text("mcpToolsPath").map(PathBuf::from),
            mcp_servers,
            env_policy: EnvPolicy {
                passthrough: self.list("envPassthrough"),
                scrub_patterns: self.list("envScrubPatterns"),
            },
            run_as: self.text("runAs"),
            dirs: Dirs {
                agent: self.path_or_default("agentDir"),
                global: self.path_or_default("globalDir"),
                extra: self.path("extraDir"),
                downloads: self.path_or_default("downloadsDir"),
                home: self.path_or_default("homeDir"),
            },
            idle_poll: self
                .millis("idlePollMs")
                .clamp(Duration::from_millis(10), Duration::from_secs(1)),
            active_poll: self
                .millis("activePollMs")
                .clamp(Duration::from_millis(10), Duration::from_millis(500)),
            heartbeat: self
                .secs("heartbeatSecs")
                .clamp(Duration::from_secs(1), Duration::from_secs(10)),
            watchdog: self.secs("watchdogSecs"),
            progress: ProgressLimits {
                notice: self.secs("progressNoticeSecs"),
                silence: self.secs("progressSilenceSecs"),
                max_turn: self.secs("maxTurnSecs"),
            },
            cli_request_timeout: self.secs("cliRequestTimeoutSecs"),
            cli_stream_idle: self.secs("cliStreamIdleSecs"),
            cli_env,
            tool_timeout: self.secs("toolTimeoutSecs"),
            query_retries: u32::try_from(self.number("queryRetries")).unwrap_or(2),
            cli_max_retries: u32::try_from(self.number("cliMaxRetries")).unwrap_or(2),
            script: ScriptLimits {
                timeout: self.secs("scriptTimeoutSecs"),
                ..ScriptLimits::default()
            },
            media: MediaLimits {
                max_bytes: self.number("maxAttachmentBytes"),
                timeout: self.secs("downloadTimeoutSecs"),
                ..MediaLimits::default()
            },
            codex_steer: self.flag("codexSteer"),
            mock: MockSettings {
                delay: self.millis("mockDelayMs"),
                script: mock_script,
                echo_system_prompt: self.flag("mockEchoSystemPrompt"),
            },
        })
    }

    /// A folder setting; its table default under the workspace when config.json set it to
    /// `null`.
    fn path_or_default(&self, key: &str) -> PathBuf {
        self.path(key).unwrap_or_else(|| {
            let default = FIELDS
                .iter()
                .find(|f| f.key == key)
                .map_or("", |f| f.default);
            self.workspace.join(default)
        })
    }
}

/// Help text listing every key, its variable and meaning (for `--help`).
pub fn keys_help() -> String {
    let mut out = String::from("Settings (flag --set KEY=VALUE > env > config.json > default):\n");
    for field in FIELDS {
        let default = if field.default.is_empty() {
            String::new()
        } else {
            format!(" [default: {}]", field.default)
        };
        out.push_str(&format!(
            "  {:<22} {:<34} {}{}\n",
            field.key, field.env, field.help, default
        ));
    }
    out.push_str(
        "Secrets (masked above) can come from a file instead: <VAR>_FILE=/path (e.g. \
         ANTHROPIC_API_KEY_FILE); setting both <VAR> and <VAR>_FILE is an error.\n",
    );
    out
}

/// Masks a secret, keeping a hint of its shape.
pub fn mask(secret: &str) -> String {
    if secret.chars().count() <= 8 {
        "****".into()
    } else {
        let head: String = secret.chars().take(4).collect();
        format!("{head}…**** ({} chars)", secret.chars().count())
    }
}

fn read_file(path: &Path) -> Result<Option<serde_json::Map<String, Value>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
    };
    let value: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", path.display()))?;
    let Value::Object(map) = value else {
        bail!(
            "{}: expected a JSON object at the top level",
            path.display()
        );
    };
    for key in map.keys() {
        if !FIELDS.iter().any(|f| f.key == key) {
            bail!(
                "{}: unknown field \"{key}\" (known fields: see `agent-runner --help`)",
                path.display()
            );
        }
    }
    Ok(Some(map))
}

/// A field's value from the environment: its variable, or for a secret the content of the file
/// named by `<VAR>_FILE` (read through fsguard, surrounding whitespace trimmed: secret files
/// usually end with a newline). Both set is an error: which one wins must never be a guess.
fn env_text(field: &Field, env: &BTreeMap<String, String>) -> Result<Option<(String, Source)>> {
    let direct = env.get(field.env).filter(|t| !t.is_empty());
    if !field.secret {
        return Ok(direct.map(|t| (t.clone(), Source::Env)));
    }
    let file_var = format!("{}_FILE", field.env);
    let Some(path) = env.get(&file_var).filter(|t| !t.is_empty()) else {
        return Ok(direct.map(|t| (t.clone(), Source::Env)));
    };
    if direct.is_some() {
        bail!(
            "both {} and {file_var} are set: unset one of them (the secret comes from the \
             environment or from a file, never both)",
            field.env
        );
    }
    let text = fsguard::read_to_string(Path::new(path)).with_context(|| {
        format!(
            "{file_var}: cannot read the secret file {path}; check that it is mounted there and \
             that the runner's user can read it (a runner started as root reads it before it \
             drops to runAs)"
        )
    })?;
    let text = text.trim();
    if text.is_empty() {
        bail!("{file_var}: the secret file {path} is empty");
    }
    Ok(Some((text.to_owned(), Source::EnvFile)))
}

fn parse_text(field: &Field, text: &str) -> Result<Value> {
    Ok(match field.kind {
        Kind::Text | Kind::Path => Value::String(text.to_owned()),
        Kind::Number => Value::from(
            text.trim()
                .parse::<u64>()
                .with_context(|| format!("{}: expected a whole number, got {text:?}", field.key))?,
        ),
        Kind::Bool => Value::Bool(match text.trim() {
            "1" | "true" | "yes" | "on" => true,
            "0" | "false" | "no" | "off" => false,
            other => bail!("{}: expected true or false, got {other:?}", field.key),
        }),
        Kind::List => Value::Array(
            text.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.to_owned()))
                .collect(),
        ),
        Kind::Object => {
            let value: Value = serde_json::from_str(text)
                .with_context(|| format!("{}: expected a JSON object", field.key))?;
            check_file_value(field, &value)?;
            value
        }
        Kind::Json => {
            serde_json::from_str(text).with_context(|| format!("{}: expected JSON", field.key))?
        }
    })
}

fn check_file_value(field: &Field, value: &Value) -> Result<()> {
    let ok = match field.kind {
        Kind::Text | Kind::Path => value.is_string() || value.is_null(),
        Kind::Number => value.is_u64(),
        Kind::Bool => value.is_boolean(),
        Kind::List => value
            .as_array()
            .is_some_and(|items| items.iter().all(Value::is_string)),
        Kind::Object => match value.as_object() {
            None => false,
            Some(servers) if field.key == "mcpServers" => servers
                .iter()
                .all(|(_, server)| server.get("command").is_some_and(Value::is_string)),
            Some(_) => true,
        },
        Kind::Json => true,
    };
    if !ok {
        let expected = match field.kind {
            Kind::Text | Kind::Path => "a string",
            Kind::Number => "a whole number",
            Kind::Bool => "true or false",
            Kind::List => "an array of strings",
            Kind::Object if field.key == "mcpServers" => {
                "an object of {\"command\": string, \"args\"?: [..], \"env\"?: {..}}"
            }
            Kind::Object => "an object",
            Kind::Json => "JSON",
        };
        bail!("expected {expected}, got {value}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(dir: &Path, flags: &[(&str, &str)], env: &[(&str, &str)]) -> Inputs {
        Inputs {
            workspace: dir.to_path_buf(),
            config_file: None,
            flags: flags
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        }
    }

    #[test]
    fn precedence_flag_env_file_default_for_every_field() {
        let dir = tempfile::tempdir().unwrap();
        for field in FIELDS {
            let sample = |n: u64| -> (String, Value) {
                match field.kind {
                    Kind::Text | Kind::Path => match field.key {
                        "provider" => {
                            let p = ["codex", "opencode", "mock"][n as usize % 3];
                            (p.into(), Value::from(p))
                        }
                        "timezone" => {
                            let z =
                                ["Europe/Paris", "Asia/Tokyo", "America/Denver"][n as usize % 3];
                            (z.into(), Value::from(z))
                        }
                        _ => (format!("v{n}"), Value::from(format!("v{n}"))),
                    },
                    Kind::Number => (format!("{}", n + 1), Value::from(n + 1)),
                    Kind::Bool => (
                        n.is_multiple_of(2).to_string(),
                        Value::from(n.is_multiple_of(2)),
                    ),
                    Kind::List => (
                        format!("a{n},b{n}"),
                        serde_json::json!([format!("a{n}"), format!("b{n}")]),
                    ),
                    Kind::Object => {
                        let v = serde_json::json!({ format!("s{n}"): { "command": "x" } });
                        (v.to_string(), v)
                    }
                    Kind::Json => {
                        let v = serde_json::json!([{ "step": "echo", "delayMs": n }]);
                        (v.to_string(), v)
                    }
                }
            };
            let (_, file_value) = sample(0);
            let (env_text, env_value) = sample(1);
            let (flag_text, flag_value) = sample(2);
            std::fs::write(
                dir.path().join("config.json"),
                serde_json::json!({ field.key: file_value }).to_string(),
            )
            .unwrap();
            let from_file = Config::load(&inputs(dir.path(), &[], &[])).unwrap();
            assert_eq!(
                from_file.values.get(field.key),
                Some(&(file_value.clone(), Source::File)),
                "{}",
                field.key
            );
            let from_env =
                Config::load(&inputs(dir.path(), &[], &[(field.env, &env_text)])).unwrap();
            assert_eq!(
                from_env.values.get(field.key),
                Some(&(env_value, Source::Env)),
                "{}",
                field.key
            );
            let from_flag = Config::load(&inputs(
                dir.path(),
                &[(field.key, &flag_text)],
                &[(field.env, &env_text)],
            ))
            .unwrap();
            assert_eq!(
                from_flag.values.get(field.key),
                Some(&(flag_value, Source::Flag)),
                "{}",
                field.key
            );
        }
        std::fs::remove_file(dir.path().join("config.json")).unwrap();
        let defaults = Config::load(&inputs(dir.path(), &[], &[])).unwrap();
        assert_eq!(defaults.number("maxMessagesPerPrompt"), 10);
        assert_eq!(
            defaults.values.get("provider").map(|v| v.1),
            Some(Source::Default)
        );
    }

    #[test]
    fn malformed_file_names_the_field_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, r#"{"maxMessagesPerPrompt": "ten"}"#).unwrap();
        let err = format!(
            "{:#}",
            Config::load(&inputs(dir.path(), &[], &[])).unwrap_err()
        );
        assert!(
            err.contains("maxMessagesPerPrompt") && err.contains("config.json"),
            "{err}"
        );
        std::fs::write(&path, r#"{"maxMesagesPerPrompt": 3}"#).unwrap();
        let err = format!(
            "{:#}",
            Config::load(&inputs(dir.path(), &[], &[])).unwrap_err()
        );
        assert!(
            err.contains("unknown field \"maxMesagesPerPrompt\""),
            "{err}"
        );
        std::fs::write(&path, r#"{"mcpServers": {"x": {"args": []}}}"#).unwrap();
        let err = format!(
            "{:#}",
            Config::load(&inputs(dir.path(), &[], &[])).unwrap_err()
        );
        assert!(
            err.contains("mcpServers") && err.contains("command"),
            "{err}"
        );
        std::fs::write(&path, "{not json").unwrap();
        let err = format!(
            "{:#}",
            Config::load(&inputs(dir.path(), &[], &[])).unwrap_err()
        );
        assert!(err.contains("not valid JSON"), "{err}");
        std::fs::write(&path, r#"{"timezone": "Mars/Olympus"}"#).unwrap();
        let err = format!(
            "{:#}",
            Config::load(&inputs(dir.path(), &[], &[])).unwrap_err()
        );
        assert!(
            err.contains("timezone") && err.contains("config.json"),
            "{err}"
        );
    }

    #[test]
    fn describe_masks_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::load(&inputs(
            dir.path(),
            &[],
            &[("ANTHROPIC_API_KEY", "sk-ant-very-secret-key")],
        ))
        .unwrap();
        let text = config.describe();
        assert!(!text.contains("very-secret"), "{text}");
        assert!(
            text.contains("anthropicApiKey = sk-a…**** (22 chars)  [env ANTHROPIC_API_KEY]"),
            "{text}"
        );
    }

    #[test]
    fn secrets_come_from_var_file_never_from_both() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("anthropic.key");
        std::fs::write(&key_file, "sk-ant-from-a-file-123\n").unwrap();
        let key_path = key_file.display().to_string();
        for field in FIELDS.iter().filter(|f| f.secret) {
            let var = format!("{}_FILE", field.env);
            let config =
                Config::load(&inputs(dir.path(), &[], &[(var.as_str(), &key_path)])).unwrap();
            assert_eq!(
                config.text(field.key).as_deref(),
                Some("sk-ant-from-a-file-123"),
                "{var}: the file's content, its newline trimmed"
            );
            assert_eq!(config.values[field.key].1, Source::EnvFile);
            assert!(
                config
                    .describe()
                    .contains(&format!("[file from {}_FILE]", field.env)),
                "{}",
                config.describe()
            );
            let both = Config::load(&inputs(
                dir.path(),
                &[],
                &[(var.as_str(), &key_path), (field.env, "sk-direct")],
            ))
            .unwrap_err();
            let both = format!("{both:#}");
            assert!(
                both.contains(field.env) && both.contains(&var) && both.contains("never both"),
                "{both}"
            );
            // An empty variable is unset (`docker run -e X=` to mask an inherited one).
            let empty = Config::load(&inputs(
                dir.path(),
                &[],
                &[(var.as_str(), &key_path), (field.env, "")],
            ))
            .unwrap();
            assert_eq!(
                empty.text(field.key).as_deref(),
                Some("sk-ant-from-a-file-123")
            );
            // A flag still wins (flags > env > config.json), without reading the file.
            let flag = Config::load(&inputs(
                dir.path(),
                &[(field.key, "sk-flag")],
                &[(var.as_str(), "/nonexistent/key")],
            ))
            .unwrap();
            assert_eq!(flag.text(field.key).as_deref(), Some("sk-flag"));
            let missing = format!(
                "{:#}",
                Config::load(&inputs(
                    dir.path(),
                    &[],
                    &[(var.as_str(), "/nonexistent/nanoclaw.key")]
                ))
                .unwrap_err()
            );
            assert!(
                missing.contains(&var) && missing.contains("/nonexistent/nanoclaw.key"),
                "the error names the variable and the file: {missing}"
            );
        }
        std::fs::write(&key_file, " \n").unwrap();
        let empty = format!(
            "{:#}",
            Config::load(&inputs(
                dir.path(),
                &[],
                &[("ANTHROPIC_API_KEY_FILE", &key_path)]
            ))
            .unwrap_err()
        );
        assert!(empty.contains("is empty"), "{empty}");
        // Not a secret: no *_FILE variant.
        let tz = Config::load(&inputs(dir.path(), &[], &[("TZ_FILE", &key_path)])).unwrap();
        assert_eq!(tz.timezone_name(), "UTC");
    }

    #[test]
    fn a_key_in_a_config_json_inside_the_workspace_is_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"openaiApiKey": "sk-in-the-workspace-000"}"#,
        )
        .unwrap();
        let warnings = Config::load(&inputs(dir.path(), &[], &[]))
            .unwrap()
            .exposed_secrets();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("openaiApiKey") && warnings[0].contains("OPENAI_API_KEY_FILE"),
            "{warnings:?}"
        );
        // The same file outside the workspace, or the key from the environment: no warning.
        let outside = tempfile::tempdir().unwrap();
        let mut elsewhere = inputs(outside.path(), &[], &[]);
        elsewhere.config_file = Some(dir.path().join("config.json"));
        assert!(Config::load(&elsewhere)
            .unwrap()
            .exposed_secrets()
            .is_empty());
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"assistantName": "Andy"}"#,
        )
        .unwrap();
        let env = Config::load(&inputs(
            dir.path(),
            &[],
            &[("OPENAI_API_KEY", "sk-env-0000")],
        ))
        .unwrap();
        assert!(env.exposed_secrets().is_empty());
    }

    /// A key added to the table but not to [`Settings`] would be read by nothing: set alone to a
    /// value that is not its default, every key must change the typed settings.
    #[test]
    fn every_field_reaches_the_typed_settings() {
        let dir = tempfile::tempdir().unwrap();
        let typed = |env: &[(&str, &str)]| {
            let config = Config::load(&inputs(dir.path(), &[], env)).unwrap();
            format!("{:?}", config.settings().unwrap())
        };
        let defaults = typed(&[]);
        for field in FIELDS {
            let sample = match (field.key, field.kind) {
                ("provider", _) => "codex".to_owned(),
                ("timezone", _) => "Asia/Tokyo".to_owned(),
                ("cliEnv", _) => r#"{"SAMPLE": "1"}"#.to_owned(),
                (_, Kind::Text) => "sample-text".to_owned(),
                (_, Kind::Path) => "/sample/path".to_owned(),
                (_, Kind::Number) => "7".to_owned(),
                (_, Kind::Bool) => (field.default != "true").to_string(),
                (_, Kind::List) => "SAMPLE_A,SAMPLE_B".to_owned(),
                (_, Kind::Object) => r#"{"sample": {"command": "x"}}"#.to_owned(),
                (_, Kind::Json) => r#"[{"step": "reply", "text": "sample"}]"#.to_owned(),
            };
            assert_ne!(
                typed(&[(field.env, &sample)]),
                defaults,
                "{} ({}={sample}) does not reach Settings",
                field.key,
                field.env
            );
        }
    }

    #[test]
    fn typed_settings_keep_the_defaults_and_the_shape_errors() {
        let dir = tempfile::tempdir().unwrap();
        let settings = Config::load(&inputs(dir.path(), &[], &[]))
            .unwrap()
            .settings()
            .unwrap();
        assert_eq!(settings.provider, ProviderKind::Claude);
        assert_eq!(settings.session_db, dir.path().join("session.db"));
        assert_eq!(settings.dirs.agent, dir.path().join("agent"));
        assert_eq!(settings.max_messages_per_prompt, 10);
        assert_eq!(settings.heartbeat, Duration::from_secs(5));
        assert_eq!(settings.env_policy, EnvPolicy::default());
        assert_eq!(
            settings.model_api().map(|m| m.endpoint()).as_deref(),
            Some("https://api.anthropic.com")
        );
        let secret = Config::load(&inputs(
            dir.path(),
            &[],
            &[("ANTHROPIC_API_KEY", "sk-ant-very-secret-key")],
        ))
        .unwrap()
        .settings()
        .unwrap();
        assert!(!format!("{secret:?}").contains("very-secret"));
        for (key, value, expected) in [
            ("cliEnv", r#"{"A": 1}"#, "cliEnv: expected an object"),
            (
                "mcpServers",
                r#"{"s": {"command": "x", "args": "no"}}"#,
                "mcpServers: expected",
            ),
            (
                "mockScript",
                r#"[{"step": "dance"}]"#,
                "mockScript: expected",
            ),
        ] {
            let err = Config::load(&inputs(dir.path(), &[(key, value)], &[]))
                .unwrap()
                .settings()
                .unwrap_err();
            assert!(format!("{err:#}").contains(expected), "{err:#}");
        }
    }

    #[test]
    fn the_provider_help_and_default_are_provider_kinds() {
        let provider = FIELDS.iter().find(|f| f.key == "provider").unwrap();
        assert_eq!(provider.help, ProviderKind::names(" | "));
        assert!(provider.default.parse::<ProviderKind>().is_ok());
    }
}
