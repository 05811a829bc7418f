//! Values into the typed [`Settings`], once: building them is the configuration's validation.
//! Each nested shape is read by the owner of its type: `toolPolicy` by
//! [`ToolPolicy::from_json`](provider::ToolPolicy::from_json), the remote entries of
//! `mcpServers` by [`crate::remote_mcp::parse`], the other tool settings by `tool_settings.rs`,
//! the rest by their types' `Deserialize`. Errors name the key, where its value came from and
//! the form expected.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use credproxy::Api;
use logging::redact::{self, Secret};
use procs::EnvPolicy;
use provider::{McpServer, MockSettings, ProviderKind};

use super::fields::FIELDS;
use super::settings::{CliPaths, Dirs, EnvVars, ModelApi, Models, Settings};
use super::tool_settings;
use super::values::Values;
use crate::budget::BudgetLimits;
use crate::media::MediaLimits;
use crate::progress::{ProgressMode, ProgressOptions};
use crate::progress_limits::ProgressLimits;
use crate::script::ScriptLimits;
use crate::turn_control::TurnControlOptions;

/// What the shapes only a command that runs refuses build into ([`Late::build`]).
struct Late {
    mcp_servers: BTreeMap<String, McpServer>,
    cli_env: EnvVars,
    mock: MockSettings,
    log_format: logging::LogFormat,
}

impl Late {
    /// `mcpServers`' stdio entries, `cliEnv`, the mock's JSON and `logFormat`, in that order.
    fn build(values: &Values) -> Result<Late> {
        Ok(Late {
            mcp_servers: stdio_mcp_servers(values)?,
            cli_env: cli_env(values)?,
            mock: mock(values)?,
            log_format: values
                .text("logFormat")
                .unwrap_or_default()
                .parse()
                .with_context(|| format!("logFormat ({})", values.source_of("logFormat")))?,
        })
    }
}

impl Settings {
    /// The typed settings of `values`: the one place values become types. The outer error is
    /// a mistake every command refuses (the load fails); the inner one, as its `{:#}` text, a
    /// shape only a command that runs refuses ([`Late`]). Both name the key, where its value
    /// came from and the form expected.
    pub(super) fn build(values: &Values) -> Result<std::result::Result<Settings, String>> {
        // The checks every command makes, in this order: with several mistakes, the first one
        // named is the same as before the checks became the building.
        let provider = provider_kind(values)?;
        let timezone_name = values.timezone_name();
        let timezone = schema::cron::parse_tz(&timezone_name)
            .with_context(|| format!("timezone ({})", values.source_of("timezone")))?;
        let turn_control = turn_control(values)?;
        let tool_policy = tool_settings::tool_policy(values)?;
        let approval_stop_tools = tool_settings::approval_stop_tools(values)?;
        let elicitation = tool_settings::elicitation(values)?;
        let remote_mcp_servers = crate::remote_mcp::parse(
            values.get("mcpServers").map(|(value, _)| value),
            &values.source_of("mcpServers"),
        )?;
        let anthropic = model_api(
            values,
            Api::Anthropic,
            "anthropicBaseUrl",
            "anthropicApiKey",
        )?;
        let openai = model_api(values, Api::OpenAi, "openaiBaseUrl", "openaiApiKey")?;
        let gemini = model_api(values, Api::Gemini, "geminiBaseUrl", "geminiApiKey")?;
        let late = match Late::build(values) {
            Ok(late) => late,
            Err(err) => return Ok(Err(format!("{err:#}"))),
        };
        Ok(Ok(Settings {
            workspace: values.workspace.clone(),
            session_db: values.path("sessionDb").context("sessionDb is not set")?,
            create_session_db: values.flag("createSessionDb"),
            provider,
            assistant_name: values.text("assistantName"),
            timezone,
            timezone_name,
            admin_user_id: values.text("adminUserId"),
            // The load checked every range: the conversions below cannot saturate.
            max_messages_per_prompt: usize::try_from(values.number("maxMessagesPerPrompt"))
                .unwrap_or(usize::MAX),
            models: Models {
                any: values.text("model"),
                claude: values.text("claudeModel"),
                codex: values.text("codexModel"),
                opencode: values.text("opencodeModel"),
                gemini: values.text("geminiModel"),
                qwen: values.text("qwenModel"),
            },
            effort: values.text("effort"),
            anthropic,
            openai,
            gemini,
            credential_proxy: values.flag("credentialProxy"),
            cli_paths: CliPaths {
                claude: values.program("claudePath"),
                codex: values.program("codexPath"),
                opencode: values.program("opencodePath"),
                gemini: values.program("geminiPath"),
                qwen: values.program("qwenPath"),
            },
            acp_command: acp_command(values, provider)?,
            mcp_tools_path: values.program("mcpToolsPath"),
            mcp_servers: late.mcp_servers,
            env_policy: EnvPolicy {
                passthrough: values.list("envPassthrough"),
                scrub_patterns: crate::remote_mcp::scrubbed_sources(
                    values.list("envScrubPatterns"),
                    &remote_mcp_servers,
                ),
            },
            remote_mcp_servers,
            run_as: values.text("runAs"),
            dirs: Dirs {
                agent: values.path_or_default("agentDir"),
                global: values.path_or_default("globalDir"),
                extra: values.path("extraDir"),
                downloads: values.path_or_default("downloadsDir"),
                home: values.path_or_default("homeDir"),
            },
            idle_poll: values.millis("idlePollMs"),
            active_poll: values.millis("activePollMs"),
            heartbeat: values.secs("heartbeatSecs"),
            watchdog: values.secs("watchdogSecs"),
            progress: ProgressLimits {
                notice: values.secs("progressNoticeSecs"),
                silence: values.secs("progressSilenceSecs"),
                max_turn: values.secs("maxTurnSecs"),
            },
            health_max_turn_silence: values.secs("healthMaxTurnSilenceSecs"),
            cli_request_timeout: values.secs("cliRequestTimeoutSecs"),
            cli_stream_idle: values.secs("cliStreamIdleSecs"),
            cli_env: late.cli_env,
            tool_timeout: values.secs("toolTimeoutSecs"),
            query_retries: u32::try_from(values.number("queryRetries")).unwrap_or(u32::MAX),
            cli_max_retries: u32::try_from(values.number("cliMaxRetries")).unwrap_or(u32::MAX),
            script: ScriptLimits {
                timeout: values.secs("scriptTimeoutSecs"),
                ..ScriptLimits::default()
            },
            media: MediaLimits {
                max_bytes: values.number("maxAttachmentBytes"),
                timeout: values.secs("downloadTimeoutSecs"),
                ..MediaLimits::default()
            },
            codex_steer: values.flag("codexSteer"),
            mock: late.mock,
            budgets: budget_limits(values),
            max_turns_per_query: u32::try_from(values.number("maxTurnsPerQuery"))
                .ok()
                .filter(|n| *n > 0),
            log_format: late.log_format,
            turn_control,
            tool_policy,
            approval_stop_tools,
            elicitation,
        }))
    }
}

/// `provider`: one of the provider kinds.
fn provider_kind(values: &Values) -> Result<ProviderKind> {
    let provider = values.text("provider").unwrap_or_default();
    match provider.parse::<ProviderKind>() {
        Ok(kind) => Ok(kind),
        Err(_) => bail!(
            "provider {provider:?} ({}) is not one of {}",
            values.source_of("provider"),
            ProviderKind::names(", ")
        ),
    }
}

/// `acpCommand`: the ACP agent's argv, a non-empty array of strings; required by `provider: acp`.
fn acp_command(values: &Values, provider: ProviderKind) -> Result<Vec<String>> {
    const FIX: &str = "set ACP_COMMAND to the agent's command line as a JSON array of strings, \
                       e.g. ACP_COMMAND='[\"opencode\", \"acp\"]' (or \"acpCommand\" in config.json)";
    let argv = match values.get("acpCommand").map(|(value, _)| value) {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(value) => match serde_json::from_value::<Vec<String>>(value.clone()) {
            Ok(argv) => argv,
            Err(_) => bail!(
                "acpCommand ({}) = {value} is not an array of strings: {FIX}",
                values.source_of("acpCommand")
            ),
        },
    };
    if provider == ProviderKind::Acp && argv.first().is_none_or(|p| p.trim().is_empty()) {
        bail!("provider acp needs the agent's command (acpCommand is unset or empty): {FIX}");
    }
    Ok(argv)
}

/// The stdio entries of `mcpServers` (the remote ones are [`crate::remote_mcp::parse`]'s).
fn stdio_mcp_servers(values: &Values) -> Result<BTreeMap<String, McpServer>> {
    Ok(match values.object("mcpServers") {
        Some(servers) => serde_json::from_value(crate::remote_mcp::stdio_only(servers))
            .context("mcpServers: expected {name: {command, args, env}}")?,
        None => BTreeMap::new(),
    })
}

/// `cliEnv`: variables for the CLI's environment.
fn cli_env(values: &Values) -> Result<EnvVars> {
    Ok(EnvVars(match values.object("cliEnv") {
        Some(env) => serde_json::from_value(env)
            .context("cliEnv: expected an object of {\"NAME\": \"value\"} strings")?,
        None => BTreeMap::new(),
    }))
}

/// Stopping a turn and its progress rows (`stopCommand`, `stoppedReply`, `progress`,
/// `progressIntervalSecs`).
fn turn_control(values: &Values) -> Result<TurnControlOptions> {
    let mode = values.text("progress").unwrap_or_default();
    let mode = match mode.parse::<ProgressMode>() {
        Ok(mode) => mode,
        Err(err) => bail!("progress ({}): {err}", values.source_of("progress")),
    };
    Ok(TurnControlOptions {
        stop_word: values.text("stopCommand").unwrap_or_default(),
        stopped_reply: values.text("stoppedReply").unwrap_or_default(),
        progress: ProgressOptions {
            mode,
            interval: values.secs("progressIntervalSecs"),
        },
    })
}

/// A model API: its base URL (`base_url`, refused unless a whole http(s) URL) and its key
/// (`api_key`), with the key's variable and origin for hints.
fn model_api(
    values: &Values,
    api: Api,
    base_url: &'static str,
    api_key: &'static str,
) -> Result<ModelApi> {
    let url = values.text(base_url);
    if let Some(url) = &url {
        let parsed = reqwest::Url::parse(url);
        if !parsed.is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.has_host()) {
            bail!(
                "{base_url} ({}) = {:?} is not an http(s) URL: write it whole, like \
                 https://gateway.example/v1",
                values.source_of(base_url),
                redact::redact_url(url)
            );
        }
    }
    Ok(ModelApi {
        api,
        base_url: url,
        api_key: values.text(api_key).map(Secret::new),
        key_setting: api_key,
        key_variable: FIELDS
            .iter()
            .find(|f| f.key == api_key)
            .map_or("", |f| f.env),
        key_origin: values.source_of(api_key),
    })
}

/// The mock provider's own settings (`mockDelayMs`, `mockScript`, `mockEchoSystemPrompt`,
/// `mockUsage`).
fn mock(values: &Values) -> Result<MockSettings> {
    let usage = match values.object("mockUsage") {
        Some(usage) => Some(serde_json::from_value(usage).context(
            "mockUsage: expected {\"inputTokens\": n, \"costUsd\": x, ...} (camelCase figures)",
        )?),
        None => None,
    };
    let script = match values.object("mockScript") {
        Some(script) => {
            serde_json::from_value(script).context("mockScript: expected [{\"step\": ...}]")?
        }
        None => Vec::new(),
    };
    Ok(MockSettings {
        delay: values.millis("mockDelayMs"),
        script,
        echo_system_prompt: values.flag("mockEchoSystemPrompt"),
        usage,
    })
}

/// The spending limits (`maxCostUsdPerSession`, `maxCostUsdPerDay`, `maxTokensPerDay`); unset
/// or 0 is no limit.
pub(super) fn budget_limits(values: &Values) -> BudgetLimits {
    let cost = |key: &str| {
        values
            .get(key)
            .and_then(|(v, _)| v.as_f64())
            .filter(|usd| *usd > 0.0)
    };
    BudgetLimits {
        max_cost_usd_per_session: cost("maxCostUsdPerSession"),
        max_cost_usd_per_day: cost("maxCostUsdPerDay"),
        max_tokens_per_day: Some(values.number("maxTokensPerDay")).filter(|n| *n > 0),
    }
}
