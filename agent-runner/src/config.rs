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
pub use logging::redact::Secret;
use logging::redact::{self, mask};
use procs::EnvPolicy;
use provider::{
    Decision, ElicitationMode, McpServer, MockSettings, ProviderKind, ToolPolicy, ToolRule,
};
use serde_json::Value;

use crate::budget::{BudgetLimits, BudgetReload};
use crate::media::MediaLimits;
use crate::progress::{ProgressMode, ProgressOptions};
use crate::runner::ProgressLimits;
use crate::script::ScriptLimits;
use crate::turn_control::TurnControlOptions;

/// What a field holds, for parsing env and flag strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Path,
    Number,
    /// A non-negative decimal number (amounts of money).
    Decimal,
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
    /// The allowed values of a number, inclusive; a value outside is refused, never clamped.
    range: Option<(u64, u64)>,
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
        range: None,
    }
}

/// A number allowed only in `min..=max` (`u64::MAX`: no upper bound).
const fn ranged(
    key: &'static str,
    env: &'static str,
    default: &'static str,
    (min, max): (u64, u64),
    help: &'static str,
) -> Field {
    Field {
        key,
        env,
        kind: Kind::Number,
        secret: false,
        default,
        help,
        range: Some((min, max)),
    }
}

/// The longest timer setting, in seconds: 24 days. Claude and OpenCode run on Node, whose timers
/// hold at most 2^31-1 ms (24.8 days) and fire at once beyond; and a deadline `now + limit` must
/// not overflow.
const MAX_TIMER_SECS: u64 = 24 * 86_400;
/// The most retries of either kind: more keeps one failing query going for hours.
const MAX_RETRIES: u64 = 100;

const fn secret(key: &'static str, env: &'static str, help: &'static str) -> Field {
    Field {
        key,
        env,
        kind: Kind::Text,
        secret: true,
        default: "",
        help,
        range: None,
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
    ranged(
        "maxMessagesPerPrompt",
        "NANOCLAW_MAX_MESSAGES_PER_PROMPT",
        "10",
        (1, 1000),
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
        "extra MCP servers {name: {command, args, env}} or remote {name: {\"type\": \"http\", \"url\", \"headers\": {\"H\": \"value\" | {\"env\": \"VAR\"} | {\"file\": \"/path\"}}}}",
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
    ranged(
        "idlePollMs",
        "NANOCLAW_IDLE_POLL_MS",
        "1000",
        (10, 1000),
        "idle poll fallback",
    ),
    ranged(
        "activePollMs",
        "NANOCLAW_ACTIVE_POLL_MS",
        "500",
        (10, 500),
        "poll during a query",
    ),
    ranged(
        "heartbeatSecs",
        "NANOCLAW_HEARTBEAT_SECS",
        "5",
        (1, 10),
        "runner_state heartbeat",
    ),
    ranged(
        "watchdogSecs",
        "NANOCLAW_WATCHDOG_SECS",
        "600",
        (1, MAX_TIMER_SECS),
        "kill a CLI silent this long mid-turn",
    ),
    ranged(
        "progressNoticeSecs",
        "NANOCLAW_PROGRESS_NOTICE_SECS",
        "60",
        (0, MAX_TIMER_SECS),
        "end a turn whose CLI reports retries/reconnects with no model output for this long (0 = off)",
    ),
    ranged(
        "progressSilenceSecs",
        "NANOCLAW_PROGRESS_SILENCE_SECS",
        "120",
        (0, MAX_TIMER_SECS),
        "end a turn with no model output for this long while no tool runs (0 = off)",
    ),
    ranged(
        "maxTurnSecs",
        "NANOCLAW_MAX_TURN_SECS",
        "10800",
        (0, MAX_TIMER_SECS),
        "hard cap on one turn's total duration, tools included (0 = off)",
    ),
    ranged(
        "healthMaxTurnSilenceSecs",
        "NANOCLAW_HEALTH_MAX_TURN_SILENCE_SECS",
        "900",
        (0, MAX_TIMER_SECS),
        "`agent-runner health` fails when a turn has had no provider event for this long (0 = off)",
    ),
    ranged(
        "cliRequestTimeoutSecs",
        "NANOCLAW_CLI_REQUEST_TIMEOUT_SECS",
        "600",
        (1, MAX_TIMER_SECS),
        "the CLI's own model request timeout (Claude API_TIMEOUT_MS, OpenCode timeout)",
    ),
    ranged(
        "cliStreamIdleSecs",
        "NANOCLAW_CLI_STREAM_IDLE_SECS",
        "90",
        (1, MAX_TIMER_SECS),
        "the CLI's own wait for the next stream event (Codex stream_idle_timeout_ms)",
    ),
    field(
        "cliEnv",
        "NANOCLAW_CLI_ENV",
        Kind::Object,
        "",
        "variables added to the CLI's environment {NAME: value}; win over the runner's defaults (e.g. API_TIMEOUT_MS), scrub patterns apply",
    ),
    ranged(
        "toolTimeoutSecs",
        "NANOCLAW_TOOL_TIMEOUT_SECS",
        "300",
        (1, MAX_TIMER_SECS),
        "longest blocking MCP tool wait",
    ),
    ranged(
        "queryRetries",
        "NANOCLAW_QUERY_RETRIES",
        "2",
        (0, MAX_RETRIES),
        "re-runs of a query after a retryable error",
    ),
    ranged(
        "cliMaxRetries",
        "NANOCLAW_CLI_MAX_RETRIES",
        "2",
        (0, MAX_RETRIES),
        "the CLI's own API retries",
    ),
    ranged(
        "scriptTimeoutSecs",
        "NANOCLAW_SCRIPT_TIMEOUT_SECS",
        "30",
        (1, MAX_TIMER_SECS),
        "pre-agent script timeout",
    ),
    field(
        "maxAttachmentBytes",
        "NANOCLAW_MAX_ATTACHMENT_BYTES",
        Kind::Number,
        "26214400",
        "largest attachment download",
    ),
    ranged(
        "downloadTimeoutSecs",
        "NANOCLAW_DOWNLOAD_TIMEOUT_SECS",
        "30",
        (1, MAX_TIMER_SECS),
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
        "maxCostUsdPerSession",
        "NANOCLAW_MAX_COST_USD_PER_SESSION",
        Kind::Decimal,
        "",
        "budget: no new query once the session's turns cost this many US dollars (unset or 0 = no limit; a turn without a reported cost counts 0)",
    ),
    field(
        "maxCostUsdPerDay",
        "NANOCLAW_MAX_COST_USD_PER_DAY",
        Kind::Decimal,
        "",
        "budget: the same per day in the timezone (unset or 0 = no limit)",
    ),
    field(
        "maxTokensPerDay",
        "NANOCLAW_MAX_TOKENS_PER_DAY",
        Kind::Number,
        "",
        "budget: no new query once the day's turns used this many tokens (input, output, cache reads and writes; unset or 0 = no limit)",
    ),
    ranged(
        "maxTurnsPerQuery",
        "NANOCLAW_MAX_TURNS_PER_QUERY",
        "0",
        (0, 10_000),
        "most model requests (steps) one turn may make; the turn is stopped there (0 = no limit)",
    ),
    field(
        "toolPolicy",
        "NANOCLAW_TOOL_POLICY",
        Kind::Object,
        "",
        "which tool calls run: {\"allow\": [..], \"deny\": [..], \"ask\": [..], \"default\": \"allow\"|\"deny\"|\"ask\", \"askTimeoutSeconds\": 300}, rules like Bash(git push*) or mcp__github__* (unset: everything runs)",
    ),
    field(
        "approvalStopTools",
        "NANOCLAW_APPROVAL_STOP_TOOLS",
        Kind::List,
        "",
        "MCP tools (mcp__<server>__<tool>) after whose result the turn ends; the next message continues the session",
    ),
    field(
        "elicitation",
        "NANOCLAW_ELICITATION",
        Kind::Text,
        "decline",
        "MCP elicitations that are no tool approval: decline | ask (a question in the chat)",
    ),
    field(
        "logFormat",
        logging::LOG_FORMAT_ENV,
        Kind::Text,
        "text",
        "log lines on stderr: text | json (one JSON object per line, docs/logs.md)",
    ),
    field(
        "stopCommand",
        "NANOCLAW_STOP_COMMAND",
        Kind::Text,
        "/stop",
        "a chat message of exactly this text stops the running turn (empty: no chat command)",
    ),
    field(
        "stoppedReply",
        "NANOCLAW_STOPPED_REPLY",
        Kind::Text,
        "Stopped.",
        "the reply to the rows of a stopped turn",
    ),
    field(
        "progress",
        "NANOCLAW_PROGRESS",
        Kind::Text,
        "off",
        "progress rows for the host while a turn runs: off | tools | text",
    ),
    ranged(
        "progressIntervalSecs",
        "NANOCLAW_PROGRESS_INTERVAL_SECS",
        "2",
        (1, MAX_TIMER_SECS),
        "at most one progress row per this many seconds",
    ),
    ranged(
        "mockDelayMs",
        "NANOCLAW_MOCK_DELAY_MS",
        "0",
        (0, MAX_TIMER_SECS * 1000),
        "mock provider: think time per prompt",
    ),
    field(
        "mockScript",
        "NANOCLAW_MOCK_SCRIPT",
        Kind::Json,
        "",
        "mock provider: steps [{\"step\":\"echo\"|\"reply\"|\"fail\"|\"parts\"|\"ask\"|\"elicit\"|\"approvalStop\",..}]",
    ),
    field(
        "mockEchoSystemPrompt",
        "NANOCLAW_MOCK_ECHO_SYSTEM",
        Kind::Bool,
        "false",
        "mock provider: echo the system prompt, a --- line, then the prompt",
    ),
    field(
        "mockUsage",
        "NANOCLAW_MOCK_USAGE",
        Kind::Json,
        "",
        "mock provider: the usage every turn reports {\"inputTokens\":..,\"costUsd\":..}",
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

/// The variable naming the startup file when `--config` does not.
const CONFIG_VAR: &str = "NANOCLAW_CONFIG";

/// Warnings about `NANOCLAW_*` variables in `names` that look like a misspelled setting: one
/// edit or two away from a setting's variable (or a secret's `<VAR>_FILE`), letter case aside,
/// and not a variable itself. Such a variable is ignored, so without a word the operator's
/// setting silently keeps its default. Other unknown `NANOCLAW_*` names stay unremarked: the
/// scripts, the tests and mcp-tools read variables of their own from the same environment.
fn misspelled_variables<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let known: Vec<String> = FIELDS
        .iter()
        .flat_map(|f| {
            let file = f.secret.then(|| format!("{}_FILE", f.env));
            std::iter::once(f.env.to_owned()).chain(file)
        })
        .chain(std::iter::once(CONFIG_VAR.to_owned()))
        .collect();
    let mut warnings = Vec::new();
    for name in names {
        let upper = name.to_ascii_uppercase();
        if !upper.starts_with("NANOCLAW") || known.iter().any(|k| k == name) {
            continue;
        }
        let closest = known
            .iter()
            .map(|k| (strsim::damerau_levenshtein(&upper, k), k))
            .filter(|(distance, _)| *distance <= 2)
            .min_by_key(|(distance, _)| *distance);
        if let Some((_, setting)) = closest {
            warnings.push(format!(
                "{name} is set but no setting reads it, so it is ignored: did you mean {setting}? \
                 (`agent-runner --help` lists every variable)"
            ));
        }
    }
    warnings
}

/// The inputs of configuration, gathered by `main`.
#[derive(Debug, Default)]
pub struct Inputs {
    /// Workspace root from the flag or `WORKSPACE_DIR` (default `/workspace`).
    pub workspace: PathBuf,
    /// config.json path from `--config`; otherwise `NANOCLAW_CONFIG` from `env` names it, else
    /// `<workspace>/config.json` (the only one that may be absent).
    pub config_file: Option<PathBuf>,
    /// `key=value` pairs from flags.
    pub flags: Vec<(String, String)>,
    /// The environment.
    pub env: BTreeMap<String, String>,
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Workspace root, absolute; so is every other path here but a bare program name.
    pub workspace: PathBuf,
    /// config.json used (if it existed).
    pub config_file: Option<PathBuf>,
    /// The config.json path looked at (it may be absent) and what named it, for
    /// [`Config::reread_file`].
    file_path: PathBuf,
    named_by: Option<&'static str>,
    values: BTreeMap<&'static str, (Value, Source)>,
    /// Warnings about the environment's misspelled setting variables ([`misspelled_variables`]).
    misspelled: Vec<String>,
}

impl Config {
    /// Resolves every field: flags > env > file > defaults, validating types and naming the
    /// field (and the file) on error.
    pub fn load(inputs: &Inputs) -> Result<Self> {
        // Every path is made absolute here, once, against this process's working directory
        // (docs/contract/config.md, "Paths"): the CLIs, scripts and mcp-tools start in the
        // agent's folder and would read a relative one against it.
        let workspace = fsguard::absolute("--workspace (WORKSPACE_DIR)", &inputs.workspace)?;
        let named = inputs.env.get(CONFIG_VAR).filter(|path| !path.is_empty());
        let (config_file, named_by) = match (&inputs.config_file, named) {
            (Some(path), _) => (fsguard::absolute("--config", path)?, Some("--config")),
            (None, Some(path)) => (
                fsguard::absolute(CONFIG_VAR, Path::new(path))?,
                Some(CONFIG_VAR),
            ),
            (None, None) => (workspace.join("config.json"), None),
        };
        let file_values = read_file(&config_file, named_by)?;
        let mut values = BTreeMap::new();
        for field in FIELDS {
            let flag = inputs.flags.iter().rev().find(|(key, _)| key == field.key);
            let value = if let Some((_, text)) = flag {
                let setting = format!("flag --set {}", field.key);
                let text = absolute_text(field, text, &setting)?;
                Some((parse_text(field, &text).context(setting)?, Source::Flag))
            } else if let Some((text, source)) = env_text(field, &inputs.env)? {
                let text = absolute_text(field, &text, field.env)?;
                Some((
                    parse_text(field, &text)
                        .with_context(|| format!("environment variable {}", field.env))?,
                    source,
                ))
            } else {
                file_or_default(field, file_values.as_ref(), &config_file)?
            };
            if let Some(value) = checked(field, value, &config_file)? {
                values.insert(field.key, value);
            }
        }
        for (key, _) in &inputs.flags {
            if !FIELDS.iter().any(|f| f.key == key) {
                bail!("unknown setting {key:?} in --set (see `agent-runner --help` for the keys)");
            }
        }
        let config = Self {
            workspace,
            config_file: file_values.is_some().then(|| config_file.clone()),
            file_path: config_file,
            named_by,
            values,
            misspelled: misspelled_variables(inputs.env.keys().map(String::as_str)),
        };
        config.validate()?;
        Ok(config)
    }

    /// This configuration with config.json read again as it is now: every value that came
    /// from the file or a default is taken afresh (flags and the environment still win), with
    /// the same checks as [`Config::load`]. Secret files are not read again (a runner that
    /// dropped privileges may not read them): only config.json. For the settings that apply
    /// while the runner runs (the budgets, docs/decisions.md).
    pub fn reread_file(&self) -> Result<Config> {
        let file_values = read_file(&self.file_path, self.named_by)?;
        let mut values = self.values.clone();
        for field in FIELDS {
            let fixed = matches!(
                values.get(field.key),
                Some((_, Source::Flag | Source::Env | Source::EnvFile))
            );
            if fixed {
                continue;
            }
            values.remove(field.key);
            let value = file_or_default(field, file_values.as_ref(), &self.file_path)?;
            if let Some(value) = checked(field, value, &self.file_path)? {
                values.insert(field.key, value);
            }
        }
        let config = Self {
            config_file: file_values.is_some().then(|| self.file_path.clone()),
            values,
            ..self.clone()
        };
        config.validate()?;
        Ok(config)
    }

    /// The spending limits (`maxCostUsdPerSession`, `maxCostUsdPerDay`, `maxTokensPerDay`);
    /// unset or 0 is no limit.
    pub fn budget_limits(&self) -> BudgetLimits {
        let cost = |key: &str| {
            self.values
                .get(key)
                .and_then(|(v, _)| v.as_f64())
                .filter(|usd| *usd > 0.0)
        };
        BudgetLimits {
            max_cost_usd_per_session: cost("maxCostUsdPerSession"),
            max_cost_usd_per_day: cost("maxCostUsdPerDay"),
            max_tokens_per_day: Some(self.number("maxTokensPerDay")).filter(|n| *n > 0),
        }
    }

    /// How the runner reads the limits again while it runs: config.json (the path looked at,
    /// even when absent at start) through [`Config::reread_file`].
    pub fn budget_reload(&self) -> BudgetReload {
        let config = self.clone();
        BudgetReload {
            file: self.file_path.clone(),
            load: std::sync::Arc::new(move || Ok(config.reread_file()?.budget_limits())),
        }
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
        if let Some(mode) = self.text("progress") {
            if let Err(err) = mode.parse::<ProgressMode>() {
                bail!("progress ({}): {err}", self.source_of("progress"));
            }
        }
        self.tool_policy()?;
        self.approval_stop_tools()?;
        self.elicitation()?;
        self.remote_mcp_servers()?;
        for key in ["anthropicBaseUrl", "openaiBaseUrl"] {
            let Some(url) = self.text(key) else { continue };
            let parsed = reqwest::Url::parse(&url);
            if !parsed.is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.has_host()) {
                bail!(
                    "{key} ({}) = {:?} is not an http(s) URL: write it whole, like \
                     https://gateway.example/v1",
                    self.source_of(key),
                    redact::redact_url(&url)
                );
            }
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

    /// A path field, absolute: one from a flag or the environment was made absolute against
    /// the current directory by [`Config::load`]; a relative one from config.json or a default
    /// is relative to the workspace (itself absolute).
    fn path(&self, key: &str) -> Option<PathBuf> {
        let (value, source) = self.values.get(key)?;
        let text = value.as_str()?;
        Some(match source {
            Source::Flag | Source::Env | Source::EnvFile => PathBuf::from(text),
            Source::File | Source::Default => in_workspace(&self.workspace, text),
        })
    }

    /// A program path (`claudePath`, `mcpToolsPath`, ...): a bare name (no `/`) is a command
    /// looked up in `PATH` and stays as it is; any other is a [`Config::path`].
    fn program(&self, key: &str) -> Option<PathBuf> {
        let text = self.text(key)?;
        if is_program(key) && is_command_name(&text) {
            return Some(PathBuf::from(text));
        }
        self.path(key)
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

    /// Warnings about variables of the environment that look like a misspelled setting's: each
    /// is ignored, so the setting keeps its default.
    pub fn misspelled_variables(&self) -> &[String] {
        &self.misspelled
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
        let mut warnings: Vec<String> = FIELDS
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
            .collect();
        if matches!(self.values.get("mcpServers"), Some((_, Source::File))) {
            let servers = self.remote_mcp_servers().unwrap_or_default();
            warnings.extend(crate::remote_mcp::literal_headers(&servers).map(|header| {
                format!(
                    "{header} is written in {}, inside the workspace, where the agent can read \
                     it: use {{\"env\": \"NAME\"}} or {{\"file\": \"/path\"}} outside the \
                     workspace instead",
                    file.display()
                )
            }));
        }
        warnings
    }

    /// A field's value as printed: a secret setting masked whole, any other with the secrets in
    /// it masked (`logging::redact`: members named like secrets, such as an MCP server's
    /// `GITHUB_TOKEN` or a `cliEnv` password, secret arguments, URL passwords).
    fn shown(field: &Field, value: &Value) -> Value {
        match value {
            Value::String(text) if field.secret => Value::String(mask(text)),
            other if field.secret => Value::String(mask(&other.to_string())),
            other if field.key == "mcpServers" => {
                crate::remote_mcp::redact(other, redact::redact_value(other))
            }
            other => redact::redact_value(other),
        }
    }

    /// `agent-runner config --json`: the workspace, the config file and every set field with
    /// its value (secrets masked as in [`Config::describe`]), source and variable.
    pub fn describe_json(&self) -> Value {
        let settings: serde_json::Map<String, Value> = FIELDS
            .iter()
            .filter_map(|field| {
                let (value, source) = self.values.get(field.key)?;
                let source = match source {
                    Source::Flag => "flag",
                    Source::Env => "env",
                    Source::EnvFile => "envFile",
                    Source::File => "configFile",
                    Source::Default => "default",
                };
                let entry = serde_json::json!({
                    "value": Self::shown(field, value),
                    "source": source,
                    "variable": if matches!(source, "envFile") {
                        format!("{}_FILE", field.env)
                    } else {
                        field.env.to_owned()
                    },
                });
                Some((field.key.to_owned(), entry))
            })
            .collect();
        serde_json::json!({
            "workspace": self.workspace.display().to_string(),
            "configFile": self.config_file.as_ref().map(|p| p.display().to_string()),
            "settings": settings,
        })
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
                    let shown = match Self::shown(field, value) {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
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
    /// Serve the model API through the credential proxy (`credentialProxy`).
    pub credential_proxy: bool,
    /// Explicit CLI binaries; [`Settings::cli_path`] picks the selected provider's.
    pub cli_paths: CliPaths,
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
        let remote_mcp_servers = self.remote_mcp_servers()?;
        let mcp_servers = match self.object("mcpServers") {
            Some(servers) => serde_json::from_value(crate::remote_mcp::stdio_only(servers))
                .context("mcpServers: expected {name: {command, args, env}}")?,
            None => BTreeMap::new(),
        };
        let cli_env = match self.object("cliEnv") {
            Some(env) => serde_json::from_value(env)
                .context("cliEnv: expected an object of {\"NAME\": \"value\"} strings")?,
            None => BTreeMap::new(),
        };
        let mock_usage = match self.object("mockUsage") {
            Some(usage) => Some(serde_json::from_value(usage).context(
                "mockUsage: expected {\"inputTokens\": n, \"costUsd\": x, ...} (camelCase figures)",
            )?),
            None => None,
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
            api_key: self.text(api_key).map(Secret::new),
            key_setting: api_key,
            key_variable: FIELDS
                .iter()
                .find(|f| f.key == api_key)
                .map_or("", |f| f.env),
            key_origin: self.source_of(api_key),
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
            // `load` checked every range: the conversions below cannot saturate.
            max_messages_per_prompt: usize::try_from(self.number("maxMessagesPerPrompt"))
                .unwrap_or(usize::MAX),
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
            cli_paths: CliPaths {
                claude: self.program("claudePath"),
                codex: self.program("codexPath"),
                opencode: self.program("opencodePath"),
            },
            mcp_tools_path: self.program("mcpToolsPath"),
            mcp_servers,
            env_policy: EnvPolicy {
                passthrough: self.list("envPassthrough"),
                scrub_patterns: crate::remote_mcp::scrubbed_sources(
                    self.list("envScrubPatterns"),
                    &remote_mcp_servers,
                ),
            },
            remote_mcp_servers,
            run_as: self.text("runAs"),
            dirs: Dirs {
                agent: self.path_or_default("agentDir"),
                global: self.path_or_default("globalDir"),
                extra: self.path("extraDir"),
                downloads: self.path_or_default("downloadsDir"),
                home: self.path_or_default("homeDir"),
            },
            idle_poll: self.millis("idlePollMs"),
            active_poll: self.millis("activePollMs"),
            heartbeat: self.secs("heartbeatSecs"),
            watchdog: self.secs("watchdogSecs"),
            progress: ProgressLimits {
                notice: self.secs("progressNoticeSecs"),
                silence: self.secs("progressSilenceSecs"),
                max_turn: self.secs("maxTurnSecs"),
            },
            health_max_turn_silence: self.secs("healthMaxTurnSilenceSecs"),
            cli_request_timeout: self.secs("cliRequestTimeoutSecs"),
            cli_stream_idle: self.secs("cliStreamIdleSecs"),
            cli_env: EnvVars(cli_env),
            tool_timeout: self.secs("toolTimeoutSecs"),
            query_retries: u32::try_from(self.number("queryRetries")).unwrap_or(u32::MAX),
            cli_max_retries: u32::try_from(self.number("cliMaxRetries")).unwrap_or(u32::MAX),
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
                usage: mock_usage,
            },
            budgets: self.budget_limits(),
            max_turns_per_query: u32::try_from(self.number("maxTurnsPerQuery"))
                .ok()
                .filter(|n| *n > 0),
            log_format: self
                .text("logFormat")
                .unwrap_or_default()
                .parse()
                .with_context(|| format!("logFormat ({})", self.source_of("logFormat")))?,
            turn_control: TurnControlOptions {
                stop_word: self.text("stopCommand").unwrap_or_default(),
                stopped_reply: self.text("stoppedReply").unwrap_or_default(),
                progress: ProgressOptions {
                    mode: self
                        .text("progress")
                        .unwrap_or_default()
                        .parse()
                        .map_err(anyhow::Error::msg)
                        .with_context(|| format!("progress ({})", self.source_of("progress")))?,
                    interval: self.secs("progressIntervalSecs"),
                },
            },
            tool_policy: self.tool_policy()?,
            approval_stop_tools: self.approval_stop_tools()?,
            elicitation: self.elicitation()?,
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
            in_workspace(&self.workspace, default)
        })
    }
}

/// The remote MCP servers of `mcpServers` (issue 16, point 5).
impl Config {
    /// The remote entries of `mcpServers`, checked; their values are not read here
    /// ([`crate::remote_mcp::parse`]).
    fn remote_mcp_servers(&self) -> Result<BTreeMap<String, crate::remote_mcp::RemoteServer>> {
        crate::remote_mcp::parse(
            self.values.get("mcpServers").map(|(value, _)| value),
            &self.source_of("mcpServers"),
        )
    }
}

/// The tool settings of issue 16 (`toolPolicy`, `approvalStopTools`, `elicitation`): shapes the
/// table cannot check, read by [`Config::validate`] (so `agent-runner config` refuses them too)
/// and by [`Config::settings`].
impl Config {
    /// `toolPolicy`; every rule read by [`ToolRule::parse`], the one owner of their form.
    fn tool_policy(&self) -> Result<ToolPolicy> {
        let Some(value) = self.object("toolPolicy") else {
            return Ok(ToolPolicy::default());
        };
        let origin = format!("toolPolicy ({})", self.source_of("toolPolicy"));
        let expected = "expected {\"allow\": [rules], \"deny\": [rules], \"ask\": [rules], \
                        \"default\": \"allow\"|\"deny\"|\"ask\", \"askTimeoutSeconds\": seconds}";
        let Value::Object(map) = value else {
            bail!("{origin}: {expected}");
        };
        let mut policy = ToolPolicy::default();
        for (key, value) in &map {
            match key.as_str() {
                "allow" | "deny" | "ask" => {
                    let Some(items) = value.as_array() else {
                        bail!("{origin}: {key} must be a list of rules, got {value}");
                    };
                    let mut rules = Vec::with_capacity(items.len());
                    for (index, item) in items.iter().enumerate() {
                        let Some(text) = item.as_str() else {
                            bail!("{origin}: {key}[{index}] must be a rule as text, got {item}");
                        };
                        rules.push(
                            ToolRule::parse(text)
                                .with_context(|| format!("{origin}: {key}[{index}]"))?,
                        );
                    }
                    match key.as_str() {
                        "allow" => policy.allow = rules,
                        "deny" => policy.deny = rules,
                        _ => policy.ask = rules,
                    }
                }
                "default" => {
                    policy.default = match value.as_str() {
                        Some("allow") => Decision::Allow,
                        Some("deny") => Decision::Deny,
                        Some("ask") => Decision::Ask,
                        _ => bail!(
                            "{origin}: default must be \"allow\", \"deny\" or \"ask\", got {value}"
                        ),
                    }
                }
                "askTimeoutSeconds" => {
                    let secs = value
                        .as_u64()
                        .filter(|secs| (1..=MAX_TIMER_SECS).contains(secs));
                    let Some(secs) = secs else {
                        bail!(
                            "{origin}: askTimeoutSeconds must be a whole number of seconds from 1 \
                             to {MAX_TIMER_SECS}, got {value}"
                        );
                    };
                    policy.ask_timeout = Duration::from_secs(secs);
                }
                other => bail!("{origin}: unknown key {other:?}; {expected}"),
            }
        }
        Ok(policy)
    }

    /// `approvalStopTools`: canonical MCP tool names, `mcp__<server>__<tool>`, no wildcards
    /// (the drivers compare names exactly).
    fn approval_stop_tools(&self) -> Result<Vec<String>> {
        let names = self.list("approvalStopTools");
        let name_chars = |part: &str| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        };
        for name in &names {
            let well_formed = name
                .strip_prefix("mcp__")
                .and_then(|rest| rest.split_once("__"))
                .is_some_and(|(server, tool)| name_chars(server) && name_chars(tool));
            if !well_formed {
                bail!(
                    "approvalStopTools ({}): {name:?} is not an MCP tool name; expected \
                     mcp__<server>__<tool>, e.g. mcp__nanoclaw__send_message (no wildcards)",
                    self.source_of("approvalStopTools")
                );
            }
        }
        Ok(names)
    }

    /// `elicitation`: `decline` or `ask`.
    fn elicitation(&self) -> Result<ElicitationMode> {
        match self.text("elicitation").as_deref().map(str::trim) {
            None | Some("decline") => Ok(ElicitationMode::Decline),
            Some("ask") => Ok(ElicitationMode::Ask),
            Some(other) => bail!(
                "elicitation ({}) = {other:?}: expected decline or ask",
                self.source_of("elicitation")
            ),
        }
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
        let range = range_text(field).map_or(String::new(), |r| format!(" [range: {r}]"));
        out.push_str(&format!(
            "  {:<22} {:<34} {}{default}{range}\n",
            field.key, field.env, field.help
        ));
    }
    out.push_str(
        "Secrets (masked above) can come from a file instead: <VAR>_FILE=/path (e.g. \
         ANTHROPIC_API_KEY_FILE); setting both <VAR> and <VAR>_FILE is an error.\n",
    );
    out
}

/// Reads config.json. Only the default file may be absent: a file named by `--config` or
/// `NANOCLAW_CONFIG` (`named_by`) that is not there is a typo or a volume not mounted, and
/// running on defaults instead would hide it.
fn read_file(
    path: &Path,
    named_by: Option<&str>,
) -> Result<Option<serde_json::Map<String, Value>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => match named_by {
            None => return Ok(None),
            Some(flag) => bail!(
                "the config file {} named by {flag} does not exist: fix the path (or mount the \
                 file), or drop {flag} to read the optional <workspace>/config.json",
                path.display()
            ),
        },
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

/// A field's value from config.json (checked against its kind) or its default; `None` when
/// neither sets it.
fn file_or_default(
    field: &Field,
    file_values: Option<&serde_json::Map<String, Value>>,
    config_file: &Path,
) -> Result<Option<(Value, Source)>> {
    if let Some(value) = file_values.and_then(|m| m.get(field.key)) {
        check_file_value(field, value)
            .with_context(|| format!("{}: field \"{}\"", config_file.display(), field.key))?;
        Ok(Some((value.clone(), Source::File)))
    } else if !field.default.is_empty() {
        Ok(Some((parse_text(field, field.default)?, Source::Default)))
    } else {
        Ok(None)
    }
}

/// A resolved value without `null` (unset), refused when out of its field's range (naming
/// where it came from).
fn checked(
    field: &Field,
    value: Option<(Value, Source)>,
    config_file: &Path,
) -> Result<Option<(Value, Source)>> {
    let Some(value) = value.filter(|(v, _)| !v.is_null()) else {
        return Ok(None);
    };
    check_range(field, &value.0).with_context(|| match value.1 {
        Source::Flag => format!("flag --set {}", field.key),
        Source::Env | Source::EnvFile => format!("environment variable {}", field.env),
        Source::File => format!("{}: field \"{}\"", config_file.display(), field.key),
        Source::Default => format!("the default of {}", field.key),
    })?;
    Ok(Some(value))
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
    let absolute = fsguard::absolute(&file_var, Path::new(path))?;
    let path = absolute.display();
    let text = fsguard::read_to_string(&absolute).with_context(|| {
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

/// A flag's or variable's `text`, made absolute against the current directory when `field` is a
/// path (not a bare command name: `claudePath=claude` is looked up in `PATH`); `setting` names
/// it in the error.
fn absolute_text(field: &Field, text: &str, setting: &str) -> Result<String> {
    if field.kind != Kind::Path || is_program(field.key) && is_command_name(text) {
        return Ok(text.to_owned());
    }
    let path = fsguard::absolute(setting, Path::new(text))?;
    path.into_os_string()
        .into_string()
        .map_err(|path| anyhow::anyhow!("{setting}: {path:?} is not valid UTF-8"))
}

/// The settings that name a program to run.
fn is_program(key: &str) -> bool {
    matches!(
        key,
        "claudePath" | "codexPath" | "opencodePath" | "mcpToolsPath"
    )
}

/// A program setting's value without a `/`: a command name, looked up in `PATH`.
fn is_command_name(text: &str) -> bool {
    !text.is_empty() && !text.contains('/')
}

/// `text` (a config.json value or a default) relative to the absolute `workspace`, normalised
/// lexically ([`fsguard::absolute_in`]); an empty value is the workspace itself.
fn in_workspace(workspace: &Path, text: &str) -> PathBuf {
    fsguard::absolute_in("workspace", workspace, Path::new(text))
        .unwrap_or_else(|_| workspace.to_path_buf())
}

fn parse_text(field: &Field, text: &str) -> Result<Value> {
    Ok(match field.kind {
        Kind::Text | Kind::Path => Value::String(text.to_owned()),
        Kind::Number => Value::from(
            text.trim()
                .parse::<u64>()
                .with_context(|| format!("{}: expected a whole number, got {text:?}", field.key))?,
        ),
        Kind::Decimal => {
            let amount = text
                .trim()
                .parse::<f64>()
                .with_context(|| format!("{}: expected a number, got {text:?}", field.key))?;
            let value = Value::from(amount);
            check_file_value(field, &value)?;
            value
        }
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

/// The unit of a number field, from its key's suffix.
fn unit(field: &Field) -> &'static str {
    if field.key.ends_with("Ms") {
        " ms"
    } else if field.key.ends_with("Secs") {
        " s"
    } else if field.key.ends_with("Bytes") {
        " bytes"
    } else {
        ""
    }
}

/// A number field's allowed values in words (`10 to 1000 ms`).
fn range_text(field: &Field) -> Option<String> {
    let (min, max) = field.range?;
    let unit = unit(field);
    Some(if max == u64::MAX {
        format!("at least {min}{unit}")
    } else if unit == " s" && max >= 86_400 && max % 86_400 == 0 {
        format!("{min} to {max} s ({} days)", max / 86_400)
    } else {
        format!("{min} to {max}{unit}")
    })
}

/// Refuses a number outside its field's range: a clamped value would run with a setting nobody
/// asked for and say nothing.
fn check_range(field: &Field, value: &Value) -> Result<()> {
    let (Some((min, max)), Some(n)) = (field.range, value.as_u64()) else {
        return Ok(());
    };
    if n < min || n > max {
        bail!(
            "{} = {n} is out of range: allowed {}; set a value in that range",
            field.key,
            range_text(field).unwrap_or_default()
        );
    }
    Ok(())
}

fn check_file_value(field: &Field, value: &Value) -> Result<()> {
    let ok = match field.kind {
        Kind::Text | Kind::Path => value.is_string() || value.is_null(),
        Kind::Number => value.is_u64(),
        Kind::Decimal => value
            .as_f64()
            .is_some_and(|amount| amount.is_finite() && amount >= 0.0),
        Kind::Bool => value.is_boolean(),
        Kind::List => value
            .as_array()
            .is_some_and(|items| items.iter().all(Value::is_string)),
        Kind::Object => match value.as_object() {
            None => false,
            Some(servers) if field.key == "mcpServers" => servers.iter().all(|(_, server)| {
                crate::remote_mcp::is_remote(server)
                    || server.get("command").is_some_and(Value::is_string)
            }),
            Some(_) => true,
        },
        Kind::Json => true,
    };
    if !ok {
        let expected = match field.kind {
            Kind::Text | Kind::Path => "a string",
            Kind::Number => "a whole number",
            Kind::Decimal => "a number at least 0",
            Kind::Bool => "true or false",
            Kind::List => "an array of strings",
            Kind::Object if field.key == "mcpServers" => {
                "an object of {\"command\": string, \"args\"?: [..], \"env\"?: {..}} or \
                 {\"type\": \"http\", \"url\": string, \"headers\"?: {..}}"
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

    /// `n` moved into the field's range.
    fn in_range(field: &Field, n: u64) -> u64 {
        let (min, max) = field.range.unwrap_or((0, u64::MAX));
        min.saturating_add(n).min(max)
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
                        "progress" => {
                            let mode = ["tools", "text", "off"][n as usize % 3];
                            (mode.into(), Value::from(mode))
                        }
                        "elicitation" => {
                            let mode = ["ask", "decline"][n as usize % 2];
                            (mode.into(), Value::from(mode))
                        }
                        "timezone" => {
                            let z =
                                ["Europe/Paris", "Asia/Tokyo", "America/Denver"][n as usize % 3];
                            (z.into(), Value::from(z))
                        }
                        key if key.ends_with("BaseUrl") => {
                            let url = format!("http://127.0.0.1:{}/v1", 9000 + n);
                            (url.clone(), Value::from(url))
                        }
                        // Absolute: a relative one from a flag or variable is made absolute.
                        _ if field.kind == Kind::Path => {
                            (format!("/p/v{n}"), Value::from(format!("/p/v{n}")))
                        }
                        _ => (format!("v{n}"), Value::from(format!("v{n}"))),
                    },
                    Kind::Number => {
                        let number = in_range(field, n + 1);
                        (number.to_string(), Value::from(number))
                    }
                    Kind::Decimal => {
                        let amount = n as f64 + 0.25;
                        (amount.to_string(), Value::from(amount))
                    }
                    Kind::Bool => (
                        n.is_multiple_of(2).to_string(),
                        Value::from(n.is_multiple_of(2)),
                    ),
                    Kind::List if field.key == "approvalStopTools" => (
                        format!("mcp__s{n}__a,mcp__s{n}__b"),
                        serde_json::json!([format!("mcp__s{n}__a"), format!("mcp__s{n}__b")]),
                    ),
                    Kind::List => (
                        format!("a{n},b{n}"),
                        serde_json::json!([format!("a{n}"), format!("b{n}")]),
                    ),
                    Kind::Object if field.key == "toolPolicy" => {
                        let v = serde_json::json!({ "deny": [format!("Bash(rm {n}*)")] });
                        (v.to_string(), v)
                    }
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
    fn relative_paths_are_made_absolute_once_against_the_cwd_or_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = std::env::current_dir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"homeDir": "./h", "codexPath": "bin/codex", "claudePath": "claude"}"#,
        )
        .unwrap();
        let mut relative = inputs(
            Path::new("ws"),
            &[
                ("sessionDb", "db/s.db"),
                ("mcpToolsPath", "./bin/mcp-tools"),
            ],
            &[("NANOCLAW_AGENT_DIR", "a"), ("OPENCODE_PATH", "opencode")],
        );
        relative.config_file = Some(dir.path().join("config.json"));
        let config = Config::load(&relative).unwrap();
        let settings = config.settings().unwrap();
        let ws = cwd.join("ws");
        assert_eq!(config.workspace, ws);
        // Flags and variables: against the current directory.
        assert_eq!(settings.session_db, cwd.join("db/s.db"));
        assert_eq!(settings.dirs.agent, cwd.join("a"));
        assert_eq!(settings.mcp_tools_path, Some(cwd.join("bin/mcp-tools")));
        // config.json and defaults: against the workspace.
        assert_eq!(settings.dirs.home, ws.join("h"));
        assert_eq!(settings.cli_paths.codex, Some(ws.join("bin/codex")));
        assert_eq!(settings.dirs.downloads, ws.join("downloads"));
        // A bare program name is looked up in PATH, from every source.
        assert_eq!(settings.cli_paths.claude, Some(PathBuf::from("claude")));
        assert_eq!(settings.cli_paths.opencode, Some(PathBuf::from("opencode")));
        // A relative --config, and a secret file, against the current directory too.
        let mut named = inputs(dir.path(), &[], &[]);
        named.config_file = Some(PathBuf::from("no/such.json"));
        let err = format!("{:#}", Config::load(&named).unwrap_err());
        assert!(
            err.contains(&cwd.join("no/such.json").display().to_string()),
            "{err}"
        );
        let env = [("ANTHROPIC_API_KEY_FILE", "no/such.key")];
        let err = format!(
            "{:#}",
            Config::load(&inputs(dir.path(), &[], &env)).unwrap_err()
        );
        assert!(
            err.contains(&cwd.join("no/such.key").display().to_string()),
            "{err}"
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
        std::fs::write(&path, "{}").unwrap();
        let err = Config::load(&inputs(
            dir.path(),
            &[],
            &[("ANTHROPIC_BASE_URL", "gateway.example:8080")],
        ))
        .unwrap_err();
        expect_test::expect![[r#"anthropicBaseUrl (from ANTHROPIC_BASE_URL) = "gateway.example:8080" is not an http(s) URL: write it whole, like https://gateway.example/v1"#]]
        .assert_eq(&format!("{err:#}"));
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
    fn a_named_config_file_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.json");
        let mut named = inputs(dir.path(), &[], &[]);
        named.config_file = Some(missing.clone());
        let err = format!("{:#}", Config::load(&named).unwrap_err());
        assert!(
            err.contains(&missing.display().to_string())
                && err.contains("named by --config")
                && err.contains("does not exist")
                && err.contains("drop --config"),
            "{err}"
        );
        let missing_text = missing.display().to_string();
        let by_env = inputs(dir.path(), &[], &[("NANOCLAW_CONFIG", &missing_text)]);
        let err = format!("{:#}", Config::load(&by_env).unwrap_err());
        assert!(err.contains("named by NANOCLAW_CONFIG"), "{err}");
        // The default file may be absent; an empty variable names nothing.
        Config::load(&inputs(dir.path(), &[], &[("NANOCLAW_CONFIG", "")])).unwrap();
        // A named file that exists is read, from the flag before the variable.
        std::fs::write(&missing, r#"{"assistantName": "Named"}"#).unwrap();
        let config = Config::load(&by_env).unwrap();
        assert_eq!(config.text("assistantName").as_deref(), Some("Named"));
        assert_eq!(config.config_file.as_deref(), Some(missing.as_path()));
    }

    #[test]
    fn out_of_range_values_are_refused_from_every_source_with_the_range() {
        let dir = tempfile::tempdir().unwrap();
        let config_file = dir.path().join("config.json");
        let ranged: Vec<&Field> = FIELDS.iter().filter(|f| f.range.is_some()).collect();
        assert!(
            ranged.len() >= 16,
            "every timer, poll and retry setting is ranged"
        );
        for field in ranged {
            let (min, max) = field.range.unwrap();
            let range = range_text(field).unwrap();
            assert!(
                parse_text(field, field.default)
                    .and_then(|v| check_range(field, &v))
                    .is_ok(),
                "{}: the default {} is outside {range}",
                field.key,
                field.default
            );
            let mut outside = vec![max.saturating_add(1)];
            if min > 0 {
                outside.push(min - 1);
            }
            for bad in outside.into_iter().filter(|&n| n > max || n < min) {
                let text = bad.to_string();
                std::fs::write(
                    &config_file,
                    serde_json::json!({ field.key: bad }).to_string(),
                )
                .unwrap();
                let from_file = Config::load(&inputs(dir.path(), &[], &[])).unwrap_err();
                std::fs::remove_file(&config_file).unwrap();
                let from_env =
                    Config::load(&inputs(dir.path(), &[], &[(field.env, &text)])).unwrap_err();
                let from_flag =
                    Config::load(&inputs(dir.path(), &[(field.key, &text)], &[])).unwrap_err();
                for (err, source) in [
                    (from_file, format!("config.json: field \"{}\"", field.key)),
                    (from_env, format!("environment variable {}", field.env)),
                    (from_flag, format!("flag --set {}", field.key)),
                ] {
                    let err = format!("{err:#}");
                    assert!(
                        err.contains(&source)
                            && err.contains(&format!("{} = {bad} is out of range", field.key))
                            && err.contains(&format!("allowed {range}"))
                            && err.contains("set a value in that range"),
                        "{err}"
                    );
                }
            }
            // The bounds themselves are allowed.
            for ok in [min, max] {
                let ok = ok.to_string();
                Config::load(&inputs(dir.path(), &[(field.key, &ok)], &[])).unwrap();
            }
        }
        let err = Config::load(&inputs(dir.path(), &[("idlePollMs", "5000")], &[])).unwrap_err();
        expect_test::expect![[r#"flag --set idlePollMs: idlePollMs = 5000 is out of range: allowed 10 to 1000 ms; set a value in that range"#]]
        .assert_eq(&format!("{err:#}"));
    }

    #[test]
    fn describe_masks_every_secret_in_text_and_json() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{
                "mcpServers": {"github": {"command": "npx", "args": ["server-github", "--token", "ghp_secretvalue0123456789"],
                                          "env": {"GITHUB_TOKEN": "ghp_secretvalue0123456789", "LOG_LEVEL": "debug"}}},
                "cliEnv": {"API_TIMEOUT_MS": "1000", "SEARCH_API_KEY": "search-key-0123456789"},
                "openaiBaseUrl": "https://bot:gateway-password@gateway.example/v1"
            }"#,
        )
        .unwrap();
        let config = Config::load(&inputs(
            dir.path(),
            &[],
            &[("ANTHROPIC_API_KEY", "sk-ant-very-secret-key")],
        ))
        .unwrap();
        let text = config.describe();
        let json = config.describe_json().to_string();
        for shown in [&text, &json] {
            for secret in [
                "very-secret",
                "secretvalue",
                "search-key-0",
                "gateway-password",
            ] {
                assert!(!shown.contains(secret), "{secret} in {shown}");
            }
        }
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                ["anthropicApiKey", "openaiBaseUrl", "mcpServers", "cliEnv"]
                    .iter()
                    .any(|k| l.starts_with(&format!("{k} =")))
            })
            .collect();
        expect_test::expect![[r#"
            anthropicApiKey = sk-a…**** (22 chars)  [env ANTHROPIC_API_KEY]
            openaiBaseUrl = https://bot:****@gateway.example/v1  [config.json]
            mcpServers = {"github":{"args":["server-github","--token","ghp_…**** (25 chars)"],"command":"npx","env":{"GITHUB_TOKEN":"ghp_…**** (25 chars)","LOG_LEVEL":"debug"}}}  [config.json]
            cliEnv = {"API_TIMEOUT_MS":"1000","SEARCH_API_KEY":"sear…**** (21 chars)"}  [config.json]"#]]
        .assert_eq(&lines.join("\n"));
        let json = config.describe_json();
        expect_test::expect![[
            r#"{"source":"env","value":"sk-a…**** (22 chars)","variable":"ANTHROPIC_API_KEY"}"#
        ]]
        .assert_eq(&json["settings"]["anthropicApiKey"].to_string());
        expect_test::expect![[r#"{"source":"configFile","value":{"API_TIMEOUT_MS":"1000","SEARCH_API_KEY":"sear…**** (21 chars)"},"variable":"NANOCLAW_CLI_ENV"}"#]]
            .assert_eq(&json["settings"]["cliEnv"].to_string());
        // The typed settings' Debug (what a log line would print) masks them too.
        let typed = format!("{:?}", config.settings().unwrap());
        for secret in ["very-secret", "secretvalue", "search-key-0"] {
            assert!(!typed.contains(secret), "{secret} in {typed}");
        }
    }

    #[test]
    fn a_cli_without_its_key_is_warned_about_naming_the_variable() {
        let dir = tempfile::tempdir().unwrap();
        let settings = |env: &[(&str, &str)]| {
            Config::load(&inputs(dir.path(), &[], env))
                .unwrap()
                .settings()
                .unwrap()
        };
        let claude = settings(&[]);
        let warning = claude.missing_key_warning(Vec::new()).unwrap();
        expect_test::expect![[r#"no API key for the claude CLI (anthropicApiKey is unset): every message will fail with "Not logged in". To give it one, set ANTHROPIC_API_KEY, or ANTHROPIC_API_KEY_FILE naming a file that holds the key (or anthropicApiKey in a config.json outside the workspace), and restart the runner"#]]
        .assert_eq(&warning);
        let hint = claude.auth_hint().unwrap();
        assert!(
            hint.contains("set ANTHROPIC_API_KEY, or ANTHROPIC_API_KEY_FILE"),
            "{hint}"
        );
        // A token in the runner's environment that the default scrub keeps from the CLI.
        let token = [("CLAUDE_CODE_OAUTH_TOKEN".to_owned(), "t".to_owned())];
        let warning = claude.missing_key_warning(token.clone()).unwrap();
        assert!(
            warning.contains("CLAUDE_CODE_OAUTH_TOKEN is set but never reaches the CLI"),
            "{warning}"
        );
        // The same token passed on deliberately: Claude logs in with it.
        let passed = settings(&[
            ("NANOCLAW_ENV_PASSTHROUGH", "CLAUDE_CODE_OAUTH_TOKEN"),
            ("NANOCLAW_ENV_SCRUB", "*_SECRET"),
        ]);
        assert_eq!(passed.missing_key_warning(token), None);
        for provider in ["codex", "opencode"] {
            let cli = settings(&[("AGENT_PROVIDER", provider)]);
            let warning = cli.missing_key_warning(Vec::new()).unwrap();
            assert!(
                warning.contains(&format!(
                    "no API key for the {provider} CLI (openaiApiKey is unset)"
                )) && warning.contains("set OPENAI_API_KEY, or OPENAI_API_KEY_FILE")
                    && warning.contains("(401)"),
                "{warning}"
            );
            let keyed = settings(&[("AGENT_PROVIDER", provider), ("OPENAI_API_KEY", "sk-x")]);
            assert_eq!(keyed.missing_key_warning(Vec::new()), None);
            let hint = keyed.auth_hint().unwrap();
            assert!(
                hint.contains("refused the key of openaiApiKey (from OPENAI_API_KEY)"),
                "{hint}"
            );
        }
        let mock = settings(&[("AGENT_PROVIDER", "mock")]);
        assert_eq!(mock.missing_key_warning(Vec::new()), None);
        assert_eq!(mock.auth_hint(), None);
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
                ("logFormat", _) => "json".to_owned(),
                ("progress", _) => "tools".to_owned(),
                ("timezone", _) => "Asia/Tokyo".to_owned(),
                ("cliEnv", _) => r#"{"SAMPLE": "1"}"#.to_owned(),
                ("mockUsage", _) => r#"{"inputTokens": 3}"#.to_owned(),
                ("toolPolicy", _) => r#"{"ask": ["Bash"], "askTimeoutSeconds": 5}"#.to_owned(),
                ("approvalStopTools", _) => "mcp__nanoclaw__send_message".to_owned(),
                ("elicitation", _) => "ask".to_owned(),
                (key, _) if key.ends_with("BaseUrl") => "http://127.0.0.1:9/v1".to_owned(),
                (_, Kind::Text) => "sample-text".to_owned(),
                (_, Kind::Path) => "/sample/path".to_owned(),
                (_, Kind::Number) => (7..)
                    .map(|n| in_range(field, n))
                    .find(|n| n.to_string() != field.default)
                    .unwrap_or_default()
                    .to_string(),
                (_, Kind::Decimal) => "0.5".to_owned(),
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
    fn budget_limits_are_read_again_from_the_file_and_flags_still_win() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json");
        std::fs::write(
            &file,
            r#"{"maxCostUsdPerDay": 0.5, "maxTokensPerDay": 100}"#,
        )
        .unwrap();
        let config =
            Config::load(&inputs(dir.path(), &[("maxCostUsdPerSession", "2.5")], &[])).unwrap();
        assert_eq!(
            config.budget_limits(),
            BudgetLimits {
                max_cost_usd_per_session: Some(2.5),
                max_cost_usd_per_day: Some(0.5),
                max_tokens_per_day: Some(100),
            }
        );
        std::fs::write(
            &file,
            r#"{"maxCostUsdPerDay": 3, "maxCostUsdPerSession": 9, "maxTokensPerDay": 0}"#,
        )
        .unwrap();
        let reload = config.budget_reload();
        assert_eq!(reload.file, file);
        assert_eq!(
            (reload.load)().unwrap(),
            BudgetLimits {
                max_cost_usd_per_session: Some(2.5),
                max_cost_usd_per_day: Some(3.0),
                max_tokens_per_day: None,
            },
            "the flag wins over the file; 0 is no limit"
        );
        std::fs::write(&file, r#"{"maxCostUsdPerDay": -1}"#).unwrap();
        let err = format!("{:#}", (reload.load)().unwrap_err());
        assert!(
            err.contains("maxCostUsdPerDay") && err.contains("a number at least 0"),
            "{err}"
        );
        let err = Config::load(&inputs(
            dir.path(),
            &[("maxCostUsdPerSession", "lots")],
            &[],
        ))
        .unwrap_err();
        assert!(format!("{err:#}").contains("expected a number"), "{err:#}");
    }

    #[test]
    fn the_provider_help_and_default_are_provider_kinds() {
        let provider = FIELDS.iter().find(|f| f.key == "provider").unwrap();
        assert_eq!(provider.help, ProviderKind::names(" | "));
        assert!(provider.default.parse::<ProviderKind>().is_ok());
    }

    #[test]
    fn the_tool_settings_are_typed_from_every_source() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"toolPolicy": {"allow": ["Read"], "deny": ["Bash(rm *)"], "ask": ["Bash",
                "mcp__github__*"], "default": "deny", "askTimeoutSeconds": 30},
                "approvalStopTools": ["mcp__nanoclaw__send_message"]}"#,
        )
        .unwrap();
        let settings = Config::load(&inputs(dir.path(), &[], &[("NANOCLAW_ELICITATION", "ask")]))
            .unwrap()
            .settings()
            .unwrap();
        let rule = |text: &str| ToolRule::parse(text).unwrap();
        assert_eq!(
            settings.tool_policy,
            ToolPolicy {
                allow: vec![rule("Read")],
                deny: vec![rule("Bash(rm *)")],
                ask: vec![rule("Bash"), rule("mcp__github__*")],
                default: Decision::Deny,
                ask_timeout: Duration::from_secs(30),
                workspace: None,
            }
        );
        assert_eq!(
            settings.approval_stop_tools,
            vec!["mcp__nanoclaw__send_message".to_owned()]
        );
        assert_eq!(settings.elicitation, ElicitationMode::Ask);
        std::fs::remove_file(dir.path().join("config.json")).unwrap();
        let defaults = Config::load(&inputs(dir.path(), &[], &[]))
            .unwrap()
            .settings()
            .unwrap();
        assert!(defaults.tool_policy.allows_everything());
        assert!(defaults.approval_stop_tools.is_empty());
        assert_eq!(defaults.elicitation, ElicitationMode::Decline);
    }

    #[test]
    fn bad_tool_settings_are_refused_naming_the_key_the_value_and_the_form() {
        let dir = tempfile::tempdir().unwrap();
        for (key, value, expected) in [
            (
                "toolPolicy",
                r#"{"deny": ["Bash(rm *"]}"#,
                "toolPolicy (from flag): deny[0]: tool rule \"Bash(rm *\": the pattern must end \
                 with `)` (expected Name or Name(pattern)",
            ),
            (
                "toolPolicy",
                r#"{"ask": ["Bash", "rm -rf"]}"#,
                "ask[1]: tool rule \"rm -rf\"",
            ),
            (
                "toolPolicy",
                r#"{"allow": "Bash"}"#,
                "allow must be a list of rules",
            ),
            (
                "toolPolicy",
                r#"{"default": "maybe"}"#,
                "default must be \"allow\", \"deny\" or \"ask\"",
            ),
            (
                "toolPolicy",
                r#"{"askTimeoutSeconds": 0}"#,
                "askTimeoutSeconds must be a whole number of seconds from 1",
            ),
            (
                "toolPolicy",
                r#"{"asks": ["Bash"]}"#,
                "unknown key \"asks\"",
            ),
            (
                "approvalStopTools",
                "send_message",
                "\"send_message\" is not an MCP tool name; expected mcp__<server>__<tool>",
            ),
            ("approvalStopTools", "mcp__nanoclaw__*", "(no wildcards)"),
            ("approvalStopTools", "mcp__nanoclaw", "not an MCP tool name"),
            ("elicitation", "accept", "expected decline or ask"),
        ] {
            let err = Config::load(&inputs(dir.path(), &[(key, value)], &[])).unwrap_err();
            assert!(
                format!("{err:#}").contains(expected),
                "{key}={value}: {err:#}"
            );
        }
        let err = Config::load(&inputs(
            dir.path(),
            &[],
            &[("NANOCLAW_APPROVAL_STOP_TOOLS", "mcp__a__b,Bash")],
        ))
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("approvalStopTools (from NANOCLAW_APPROVAL_STOP_TOOLS)"),
            "{err:#}"
        );
    }

    #[test]
    fn a_misspelled_setting_variable_is_named_with_the_setting_it_resembles() {
        let names = [
            "NANOCLAW_TOOL_POLICYY",
            "nanoclaw_model",
            "NANOCLAW_MAX_TURNS_PER_QUERRY",
            "ANTHROPIC_API_KEY_FIEL",
            // Settings, a secret file, other programs' variables: nothing to say.
            "NANOCLAW_TOOL_POLICY",
            "ANTHROPIC_API_KEY_FILE",
            "NANOCLAW_CONFIG",
            "NANOCLAW_SKIP_CLI_TESTS",
            "PATH",
        ];
        expect_test::expect![[r#"
            NANOCLAW_TOOL_POLICYY is set but no setting reads it, so it is ignored: did you mean NANOCLAW_TOOL_POLICY? (`agent-runner --help` lists every variable)
            nanoclaw_model is set but no setting reads it, so it is ignored: did you mean NANOCLAW_MODEL? (`agent-runner --help` lists every variable)
            NANOCLAW_MAX_TURNS_PER_QUERRY is set but no setting reads it, so it is ignored: did you mean NANOCLAW_MAX_TURNS_PER_QUERY? (`agent-runner --help` lists every variable)"#]]
        .assert_eq(&misspelled_variables(names).join("\n"));
    }

    /// Every `NANOCLAW_*` variable the project's own code, scripts and docs use (the tests',
    /// mcp-tools', the install scripts') must not be taken for a misspelled setting.
    #[test]
    fn no_variable_the_project_uses_is_taken_for_a_misspelling() {
        fn scan(dir: &Path, names: &mut std::collections::BTreeSet<String>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                if path.is_dir() {
                    if ![".git", "target", ".cli", "node_modules"].contains(&name.as_str()) {
                        scan(&path, names);
                    }
                    continue;
                }
                let Ok(text) = std::fs::read_to_string(&path) else {
                    continue;
                };
                for (at, _) in text.match_indices("NANOCLAW_") {
                    let variable: String = text[at..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    names.insert(variable.trim_end_matches('_').to_owned());
                }
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut names = std::collections::BTreeSet::new();
        scan(&root, &mut names);
        // The misspellings the tests make on purpose (here and in `tests/logs.rs`).
        for deliberate in [
            "NANOCLAW_TOOL_POLICYY",
            "NANOCLAW_MAX_TURNS_PER_QUERRY",
            "NANOCLAW_MAX_TURN_SEC",
        ] {
            assert!(names.remove(deliberate), "{deliberate} is no longer used");
        }
        assert!(
            names.contains("NANOCLAW_SKIP_CLI_TESTS"),
            "the scan found {names:?}"
        );
        assert_eq!(
            misspelled_variables(names.iter().map(String::as_str)),
            Vec::<String>::new()
        );
    }
}
