//! The field table: every setting's key, variable, kind, default, range and help, and how a
//! flag's, variable's or file's text becomes a value of the field's kind. The one list the
//! sources, `--help`, `agent-runner config` and the contract's table follow.

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// What a field holds, for parsing env and flag strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
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
pub(super) struct Field {
    /// Key in config.json and in `--set`.
    pub(super) key: &'static str,
    /// Environment variable.
    pub(super) env: &'static str,
    pub(super) kind: Kind,
    /// Masked when printed.
    pub(super) secret: bool,
    /// Default as text (empty = unset).
    pub(super) default: &'static str,
    pub(super) help: &'static str,
    /// The allowed values of a number, inclusive; a value outside is refused, never clamped.
    pub(super) range: Option<(u64, u64)>,
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
pub(super) const MAX_TIMER_SECS: u64 = 24 * 86_400;
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
pub(super) const FIELDS: &[Field] = &[
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
        "claude | codex | opencode | gemini | qwen | acp | mock",
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
        "model for the selected provider (CLAUDE_MODEL / CODEX_MODEL / OPENCODE_MODEL / GEMINI_MODEL / QWEN_MODEL win)",
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
        "geminiModel",
        "GEMINI_MODEL",
        Kind::Text,
        "",
        "Gemini CLI model (provider gemini)",
    ),
    field(
        "qwenModel",
        "QWEN_MODEL",
        Kind::Text,
        "",
        "Qwen Code model (provider qwen)",
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
        "OpenAI-compatible base URL (Codex, OpenCode, Qwen Code)",
    ),
    secret(
        "openaiApiKey",
        "OPENAI_API_KEY",
        "OpenAI-compatible API key (Codex, OpenCode, Qwen Code)",
    ),
    field(
        "geminiBaseUrl",
        "GOOGLE_GEMINI_BASE_URL",
        Kind::Text,
        "",
        "Gemini API base URL (Gemini CLI)",
    ),
    secret("geminiApiKey", "GEMINI_API_KEY", "Gemini API key (Gemini CLI)"),
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
        "geminiPath",
        "GEMINI_PATH",
        Kind::Path,
        "",
        "gemini CLI (default: PATH, then .cli/)",
    ),
    field(
        "qwenPath",
        "QWEN_PATH",
        Kind::Path,
        "",
        "qwen CLI (default: PATH, then .cli/)",
    ),
    field(
        "acpCommand",
        "ACP_COMMAND",
        Kind::Json,
        "",
        "provider acp: the agent's command line as a JSON array, e.g. [\"opencode\", \"acp\"]",
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

/// The settings that name a program to run.
pub(super) fn is_program(key: &str) -> bool {
    matches!(
        key,
        "claudePath" | "codexPath" | "opencodePath" | "geminiPath" | "qwenPath" | "mcpToolsPath"
    )
}

/// A program setting's value without a `/`: a command name, looked up in `PATH`.
pub(super) fn is_command_name(text: &str) -> bool {
    !text.is_empty() && !text.contains('/')
}

pub(super) fn parse_text(field: &Field, text: &str) -> Result<Value> {
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
pub(super) fn range_text(field: &Field) -> Option<String> {
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
pub(super) fn check_range(field: &Field, value: &Value) -> Result<()> {
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

pub(super) fn check_file_value(field: &Field, value: &Value) -> Result<()> {
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
