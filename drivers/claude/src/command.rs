//! The `claude` command line, environment and the files it reads
//! (docs/contract/providers.md#claude-code).
//!
//! Files live in `<private HOME>/.nanoclaw/` and are rewritten at every spawn:
//! * `mcp.json`: the MCP servers (`nanoclaw` = mcp-tools, plus the config's extra servers);
//! * `system-prompt.md`: the query's system prompt, read through `--append-system-prompt-file`
//!   (no argv size limit);
//! * `anthropic-api-key` (mode 0600): the API key, read by the `apiKeyHelper` of `--settings`.
//!   With the runner's credential proxy (whenever a key is configured) this is the session
//!   token and the base URL the proxy's; the real key stays in the runner.
//!   The key thus never sits in the CLI's environment, which every `Bash` command the agent runs
//!   inherits (`CLAUDE_CODE_SUBPROCESS_ENV_SCRUB` would scrub it too, but needs bubblewrap).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::quote::shell_quote;
use procs::CliCommand;
use provider::settings::set_default_env;
use provider::ProviderSettings;

/// Built-in tools that do not fit a headless container session, checked against the `tools` of
/// a captured `system/init` (Claude Code 2.1.330):
/// * `AskUserQuestion`: nobody answers it in `-p` mode; the agent asks through
///   `mcp__nanoclaw__ask_user_question`, which reaches the chat;
/// * `CronCreate`/`CronDelete`/`CronList`, `ScheduleWakeup`: schedules that fire inside the CLI
///   process, lost with it and invisible to the host (use `mcp__nanoclaw__schedule_task`);
/// * `Monitor`, `Workflow`: background work that starts turns of its own later, when no query
///   is listening;
/// * `EnterPlanMode`/`ExitPlanMode`: plan approval needs a person at the terminal;
/// * `EnterWorktree`/`ExitWorktree`: the agent directory is the workspace, not a git checkout;
/// * `SendMessage`/`ListAgents`: messages to other Claude sessions, easily mistaken for
///   `mcp__nanoclaw__send_message`, the only way to reach the user.
pub const DISALLOWED_TOOLS: &[&str] = &[
    "AskUserQuestion",
    "CronCreate",
    "CronDelete",
    "CronList",
    "ScheduleWakeup",
    "Monitor",
    "Workflow",
    "EnterPlanMode",
    "ExitPlanMode",
    "EnterWorktree",
    "ExitWorktree",
    "SendMessage",
    "ListAgents",
];

/// Slash commands Claude handles itself in `-p` stream-json mode (checked against the
/// `commands` of the `initialize` control response and by running each): `/compact` compacts
/// the conversation (its result text is empty), `/context` and `/cost` (also `/usage`) answer
/// with a report as the result text, without a model call.
pub(super) const NATIVE_COMMANDS: &[&str] = &["/compact", "/context", "/cost", "/usage"];

/// The MCP server name of mcp-tools.
pub(crate) const NANOCLAW_SERVER: &str = "nanoclaw";

/// How much longer than the longest blocking MCP tool (ask_user_question) Claude waits for an MCP
/// tool call before giving up on it.
pub(crate) const TOOL_TIMEOUT_MARGIN: Duration = Duration::from_secs(60);

/// The files a spawn reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LaunchFiles {
    /// The MCP config.
    pub mcp_config: PathBuf,
    /// The system prompt, when the query has one.
    pub system_prompt: Option<PathBuf>,
    /// The API key, when the settings have one.
    pub api_key: Option<PathBuf>,
}

/// What one spawn differs in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Launch {
    /// The session to resume.
    pub resume: Option<String>,
    /// The system prompt to append to Claude's own.
    pub system_prompt: Option<String>,
    /// The model (the session's `/model` choice), over `settings.model`.
    pub model: Option<String>,
}

/// The folder of the provider's own files inside the private HOME.
pub(crate) fn files_dir(settings: &ProviderSettings) -> PathBuf {
    settings.home_dir.join(".nanoclaw")
}

/// Writes the files of a spawn (creating HOME, the agent directory and the files folder).
pub(crate) fn write_files(
    settings: &ProviderSettings,
    launch: &Launch,
) -> std::io::Result<LaunchFiles> {
    let dir = files_dir(settings);
    std::fs::create_dir_all(&dir)?;
    std::fs::create_dir_all(&settings.agent_dir)?;
    let mcp_config = dir.join("mcp.json");
    write_private(
        &mcp_config,
        mcp_config_json(settings).to_string().as_bytes(),
    )?;
    let system_prompt = match &launch.system_prompt {
        Some(text) => {
            let path = dir.join("system-prompt.md");
            write_private(&path, text.as_bytes())?;
            Some(path)
        }
        None => None,
    };
    let api_key = match settings
        .api_key
        .as_ref()
        .map(logging::redact::Secret::expose)
        .filter(|key| !key.is_empty())
    {
        Some(key) => {
            let path = dir.join("anthropic-api-key");
            write_private(&path, key.trim().as_bytes())?;
            Some(path)
        }
        None => None,
    };
    Ok(LaunchFiles {
        mcp_config,
        system_prompt,
        api_key,
    })
}

/// Replaces `path` with `data`, readable by the owner only (the MCP config may carry the extra
/// servers' credentials). Through fsguard: the agent can plant links in the CLI's home.
fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    fsguard::write_private(path, data)
}

/// The `--mcp-config` JSON: mcp-tools as `nanoclaw`, then the extra servers. The per-server
/// `timeout` (ms) of `nanoclaw` sits above the longest blocking tool, like `MCP_TOOL_TIMEOUT`.
pub(crate) fn mcp_config_json(settings: &ProviderSettings) -> Value {
    let mut servers = Map::new();
    servers.insert(
        NANOCLAW_SERVER.into(),
        json!({
            "type": "stdio",
            "command": settings.mcp_tools_path.display().to_string(),
            "args": [],
            "env": settings.mcp_tools_env(),
            "timeout": tool_timeout_ms(settings),
        }),
    );
    for (name, server) in &settings.extra_mcp_servers {
        if name == NANOCLAW_SERVER {
            tracing::warn!("an extra MCP server may not be named {NANOCLAW_SERVER}; ignored");
            continue;
        }
        servers.insert(
            name.clone(),
            json!({"type": "stdio", "command": server.command, "args": server.args, "env": server.env}),
        );
    }
    // Remote servers: streamable HTTP with the headers the runner gave (the proxy's token when
    // a header carries a secret). They live in this 0600 file, never on the command line.
    for (name, server) in &settings.remote_mcp_servers {
        if servers.contains_key(name) {
            tracing::warn!(server = %name, "a remote MCP server has the name of another server; ignored");
            continue;
        }
        servers.insert(
            name.clone(),
            json!({"type": "http", "url": server.url, "headers": server.headers}),
        );
    }
    json!({ "mcpServers": servers })
}

/// Milliseconds Claude waits for one MCP tool call.
pub(crate) fn tool_timeout_ms(settings: &ProviderSettings) -> u128 {
    (settings.tool_timeout + TOOL_TIMEOUT_MARGIN).as_millis()
}

/// The `--settings` JSON: the `apiKeyHelper` that reads the key file, and the hooks.
pub(crate) fn settings_json(settings: &ProviderSettings, files: &LaunchFiles) -> Value {
    let mut json = Map::new();
    if let Some(key) = &files.api_key {
        json.insert(
            "apiKeyHelper".into(),
            json!(format!("cat {}", shell_quote(&key.display().to_string()))),
        );
    }
    if let Some(hooks) = hooks(settings) {
        json.insert("hooks".into(), hooks);
    }
    Value::Object(json)
}

/// Issue 5: the `PreCompact` hook that archives the transcript before Claude compacts its
/// context, `{"PreCompact":[{"matcher":"","hooks":[{"type":"command","command":"'<runner>'
/// archive-hook --conversations-dir '<agent dir>/conversations' --timezone '<tz>' --workspace
/// '<workspace>' --set 'assistantName=<name>'"}]}]}`. The hook reads Claude's hook JSON on
/// stdin (the transcript path among it); everything else it needs is on its command line,
/// since Claude's environment does not carry the runner's configuration. `None` without a
/// runner binary to call.
fn hooks(settings: &ProviderSettings) -> Option<Value> {
    let runner = settings.runner_exe.as_deref()?;
    let mut hooks = super::history::claude_precompact_hooks(
        runner,
        &provider::archive::job::conversations_dir(settings),
        &settings.timezone,
    );
    if let Some(Value::String(command)) = hooks.pointer_mut("/PreCompact/0/hooks/0/command") {
        command.push_str(" --workspace ");
        command.push_str(&shell_quote(&settings.workspace.display().to_string()));
        if let Some(name) = settings.assistant_name.as_deref().filter(|n| !n.is_empty()) {
            command.push_str(" --set ");
            command.push_str(&shell_quote(&format!("assistantName={name}")));
        }
    }
    Some(hooks)
}

/// The command line. Every variadic option (`--mcp-config`, `--allowedTools`,
/// `--disallowedTools`, `--add-dir`) gets one value and no positional argument ever follows,
/// so none can swallow another argument; prompts go through stdin.
pub(crate) fn args(
    settings: &ProviderSettings,
    launch: &Launch,
    files: &LaunchFiles,
) -> Vec<String> {
    let mut args: Vec<String> = [
        "-p",
        "--input-format",
        "stream-json",
        "--output-format",
        "stream-json",
        "--verbose",
        // Liveness for the watchdog while a long answer streams.
        "--include-partial-messages",
        "--permission-mode",
        "bypassPermissions",
        "--strict-mcp-config",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    args.push("--mcp-config".into());
    args.push(files.mcp_config.display().to_string());
    let mut allowed = vec![format!("mcp__{NANOCLAW_SERVER}__*")];
    let servers = settings
        .extra_mcp_servers
        .keys()
        .chain(settings.remote_mcp_servers.keys());
    for rule in servers.map(|name| format!("mcp__{name}__*")) {
        if !allowed.contains(&rule) {
            allowed.push(rule);
        }
    }
    args.push("--allowedTools".into());
    args.push(allowed.join(","));
    let mut disallowed: Vec<String> = DISALLOWED_TOOLS.iter().map(|t| (*t).to_owned()).collect();
    disallowed.extend(cli_deny_rules(settings));
    args.push("--disallowedTools".into());
    args.push(disallowed.join(","));
    args.push("--settings".into());
    args.push(settings_json(settings, files).to_string());
    let model = launch.model.as_deref().or(settings.model.as_deref());
    if let Some(model) = model.filter(|m| !m.is_empty()) {
        args.push("--model".into());
        args.push(model.to_owned());
    }
    // Claude's own step limit: the turn ends with an `error_max_turns` result.
    if let Some(turns) = settings.max_turns_per_query {
        args.push("--max-turns".into());
        args.push(turns.to_string());
    }
    if let Some(effort) = settings.effort.as_deref().filter(|e| !e.is_empty()) {
        args.push("--effort".into());
        args.push(effort.to_owned());
    }
    if let Some(path) = &files.system_prompt {
        args.push("--append-system-prompt-file".into());
        args.push(path.display().to_string());
    }
    // The default `on` records the first request's system prompt and replays it on every resume,
    // ignoring a new one: the prompt must apply after a resume too.
    args.push("--system-prompt-snapshot".into());
    args.push("off".into());
    for dir in &settings.extra_dirs {
        args.push("--add-dir".into());
        args.push(dir.display().to_string());
    }
    if let Some(session) = &launch.resume {
        args.push("--resume".into());
        args.push(session.clone());
    }
    args
}

/// The policy's deny rules that Claude's own `--disallowedTools` says the same way or wider, as
/// a second layer: the driver's `PreToolUse` hook sees every call first and decides by
/// [`provider::ToolPolicy::judge`]; Claude checks its list only on what the hook let through
/// (measured on 2.1.330, docs/contract/providers.md "Who judges a call"): a tool name (the tool
/// is then not offered to the model at all), `mcp__<server>__*`, and `Bash(<pattern>)` (Claude
/// reads `*` as any run of characters and `prefix:*` as ours; it also splits compound commands).
/// Path patterns of Read/Write/Edit (gitignore style in Claude) and the URL forms of WebFetch
/// differ, and a rule with a comma would split the list: those stay with the hook alone.
fn cli_deny_rules(settings: &ProviderSettings) -> Vec<String> {
    settings
        .tool_policy
        .deny
        .iter()
        .filter(|rule| {
            let server_wildcard = rule.tool.starts_with("mcp__")
                && rule.tool.ends_with("__*")
                && rule.tool.matches('*').count() == 1
                && rule.tool.matches("__").count() == 2;
            let plain_name = !rule.tool.contains('*') || server_wildcard;
            let pattern_ok = match &rule.pattern {
                None => true,
                Some(pattern) => rule.tool == "Bash" && !pattern.contains([',', '(', ')']),
            };
            plain_name && pattern_ok
        })
        .map(ToString::to_string)
        .collect()
}

/// The environment: the inherited allow-list (minus scrubbed names), then the provider's own
/// variables, which win.
pub(crate) fn env(
    settings: &ProviderSettings,
    launch: &Launch,
    parent: impl IntoIterator<Item = (String, String)>,
    is_root: bool,
) -> BTreeMap<String, String> {
    let mut env = settings.base_env(parent);
    // The key reaches Claude through apiKeyHelper only, never through the environment.
    env.remove("ANTHROPIC_API_KEY");
    let mut set = |name: &str, value: String| {
        env.insert(name.to_owned(), value);
    };
    set("HOME", settings.home_dir.display().to_string());
    set("TZ", settings.timezone.clone());
    if let Some(url) = settings.base_url.as_deref().filter(|u| !u.is_empty()) {
        set("ANTHROPIC_BASE_URL", url.trim_end_matches('/').to_owned());
    }
    // Traffic off, always (docs/contract/providers.md#claude-code): with these, Claude resolves no
    // host but the API's.
    set("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into());
    set("DISABLE_AUTOUPDATER", "1".into());
    set("DISABLE_TELEMETRY", "1".into());
    set("DISABLE_ERROR_REPORTING", "1".into());
    // MCP tool schemas go to the model directly instead of behind ToolSearch.
    set("ENABLE_TOOL_SEARCH", "false".into());
    set("CLAUDE_CODE_MAX_RETRIES", settings.max_retries.to_string());
    set("MCP_TOOL_TIMEOUT", tool_timeout_ms(settings).to_string());
    if is_root {
        // bypassPermissions refuses to run as root unless the CLI is told it is sandboxed.
        set("IS_SANDBOX", "1".into());
    }
    if launch.system_prompt.is_some() {
        // The runner's system prompt already holds the CLAUDE.md files; Claude would load the
        // agent directory's CLAUDE.md a second time.
        set("CLAUDE_CODE_DISABLE_CLAUDE_MDS", "1".into());
    }
    // Claude's own bound on one model request (its default is 10-15 minutes); an operator's
    // value (cliEnv or envPassthrough) wins.
    set_default_env(
        &mut env,
        "API_TIMEOUT_MS",
        settings.request_timeout.as_millis().to_string(),
    );
    env
}

/// The whole command for one spawn.
pub(crate) fn command(
    settings: &ProviderSettings,
    program: &Path,
    launch: &Launch,
    files: &LaunchFiles,
    parent: impl IntoIterator<Item = (String, String)>,
    is_root: bool,
) -> CliCommand {
    CliCommand::new(program, &settings.agent_dir)
        .args(args(settings, launch, files))
        .envs(env(settings, launch, parent, is_root))
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use provider::McpServer;

    fn settings() -> ProviderSettings {
        let mut settings = ProviderSettings::for_workspace("/workspace", "claude");
        settings.mcp_tools_path = "/usr/local/bin/mcp-tools".into();
        settings.timezone = "Europe/Berlin".into();
        settings.admin_user_id = Some("admin-1".into());
        settings.model = Some("claude-sonnet-4-5".into());
        settings.base_url = Some("http://127.0.0.1:18080/".into());
        settings.api_key = Some(logging::redact::Secret::new("sk-test"));
        settings.extra_dirs = vec!["/workspace/extra/docs".into()];
        settings.extra_mcp_servers.insert(
            "github".into(),
            McpServer {
                command: "/usr/bin/github-mcp".into(),
                args: vec!["stdio".into()],
                env: BTreeMap::from([("GITHUB_TOKEN".into(), "ghp_x".into())]),
            },
        );
        settings
    }

    fn files() -> LaunchFiles {
        LaunchFiles {
            mcp_config: "/workspace/.home/claude/.nanoclaw/mcp.json".into(),
            system_prompt: Some("/workspace/.home/claude/.nanoclaw/system-prompt.md".into()),
            api_key: Some("/workspace/.home/claude/.nanoclaw/anthropic-api-key".into()),
        }
    }

    #[test]
    fn command_line_and_environment() {
        let launch = Launch {
            resume: Some("5a50ee08-9c89-4e12-85b1-1d7ced515542".into()),
            system_prompt: Some("Be brief.".into()),
            model: None,
        };
        let mut settings = settings();
        settings.max_turns_per_query = Some(7);
        let parent = [
            ("PATH", "/usr/bin:/bin"),
            ("LANG", "C.UTF-8"),
            ("GITHUB_TOKEN", "host-secret"),
            ("ANTHROPIC_API_KEY", "from-the-runner"),
            ("HOME", "/root"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let command = command(
            &settings,
            Path::new("/opt/claude"),
            &launch,
            &files(),
            parent,
            true,
        );
        let mut text = format!("cwd: {}\n", command.cwd.display());
        text.push_str(&format!("{}\n", command.program.display()));
        for arg in &command.args {
            text.push_str(&format!("  {arg}\n"));
        }
        for (name, value) in &command.env {
            text.push_str(&format!("{name}={value}\n"));
        }
        expect![[r#"
            cwd: /workspace/agent
            /opt/claude
              -p
              --input-format
              stream-json
              --output-format
              stream-json
              --verbose
              --include-partial-messages
              --permission-mode
              bypassPermissions
              --strict-mcp-config
              --mcp-config
              /workspace/.home/claude/.nanoclaw/mcp.json
              --allowedTools
              mcp__nanoclaw__*,mcp__github__*
              --disallowedTools
              AskUserQuestion,CronCreate,CronDelete,CronList,ScheduleWakeup,Monitor,Workflow,EnterPlanMode,ExitPlanMode,EnterWorktree,ExitWorktree,SendMessage,ListAgents
              --settings
              {"apiKeyHelper":"cat '/workspace/.home/claude/.nanoclaw/anthropic-api-key'"}
              --model
              claude-sonnet-4-5
              --max-turns
              7
              --append-system-prompt-file
              /workspace/.home/claude/.nanoclaw/system-prompt.md
              --system-prompt-snapshot
              off
              --add-dir
              /workspace/extra/docs
              --resume
              5a50ee08-9c89-4e12-85b1-1d7ced515542
            ANTHROPIC_BASE_URL=http://127.0.0.1:18080
            API_TIMEOUT_MS=600000
            CLAUDE_CODE_DISABLE_CLAUDE_MDS=1
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1
            CLAUDE_CODE_MAX_RETRIES=2
            DISABLE_AUTOUPDATER=1
            DISABLE_ERROR_REPORTING=1
            DISABLE_TELEMETRY=1
            ENABLE_TOOL_SEARCH=false
            HOME=/workspace/.home/claude
            IS_SANDBOX=1
            LANG=C.UTF-8
            MCP_TOOL_TIMEOUT=360000
            PATH=/usr/bin:/bin
            TZ=Europe/Berlin
        "#]]
        .assert_eq(&text);
    }

    #[test]
    fn mcp_config() {
        let config = serde_json::to_string_pretty(&mcp_config_json(&settings())).unwrap();
        expect![[r#"
            {
              "mcpServers": {
                "github": {
                  "args": [
                    "stdio"
                  ],
                  "command": "/usr/bin/github-mcp",
                  "env": {
                    "GITHUB_TOKEN": "ghp_x"
                  },
                  "type": "stdio"
                },
                "nanoclaw": {
                  "args": [],
                  "command": "/usr/local/bin/mcp-tools",
                  "env": {
                    "NANOCLAW_ADMIN_USER_ID": "admin-1",
                    "NANOCLAW_MAX_QUESTION_TIMEOUT": "300",
                    "SESSION_DB": "/workspace/session.db",
                    "TZ": "Europe/Berlin",
                    "WORKSPACE_DIR": "/workspace"
                  },
                  "timeout": 360000,
                  "type": "stdio"
                }
              }
            }"#]]
        .assert_eq(&config);
    }

    #[test]
    fn minimal_launch_has_no_optional_flags() {
        let mut settings = ProviderSettings::for_workspace("/w", "claude");
        settings.max_retries = 0;
        let files = LaunchFiles {
            mcp_config: "/w/.home/claude/.nanoclaw/mcp.json".into(),
            system_prompt: None,
            api_key: None,
        };
        let launch = Launch::default();
        let args = args(&settings, &launch, &files);
        for flag in [
            "--resume",
            "--model",
            "--append-system-prompt-file",
            "--add-dir",
            "--effort",
            "--max-turns",
        ] {
            assert!(!args.iter().any(|a| a == flag), "{flag} in {args:?}");
        }
        assert!(args
            .windows(2)
            .any(|w| w[0] == "--settings" && w[1] == "{}"));
        let env = env(&settings, &launch, Vec::new(), false);
        assert!(!env.contains_key("IS_SANDBOX"));
        assert!(!env.contains_key("CLAUDE_CODE_DISABLE_CLAUDE_MDS"));
        assert_eq!(env["CLAUDE_CODE_MAX_RETRIES"], "0");
    }

    /// The session's `/model` choice is launched with `--model`, over the configured model.
    #[test]
    fn the_launch_model_wins_over_the_configured_one() {
        let launch = Launch {
            model: Some("claude-chosen".into()),
            ..Launch::default()
        };
        let args = args(&settings(), &launch, &files());
        let models: Vec<_> = args
            .windows(2)
            .filter(|w| w[0] == "--model")
            .map(|w| w[1].as_str())
            .collect();
        assert_eq!(models, ["claude-chosen"]);
    }

    /// Issue 10: `API_TIMEOUT_MS` is the runner's default, an operator's value (passed through
    /// or set in `cliEnv`) wins, the provider's own variables cannot be replaced, and scrub
    /// patterns still apply to `cliEnv`.
    #[test]
    fn the_operator_environment_wins_over_the_runner_defaults() {
        let launch = Launch::default();
        let mut settings = settings();
        let env = env(&settings, &launch, Vec::new(), false);
        assert_eq!(env["API_TIMEOUT_MS"], "600000");

        // Set in the runner's environment but not passed through: dropped (the old behaviour).
        let parent = || vec![("API_TIMEOUT_MS".to_owned(), "5000".to_owned())];
        let env = env_of(&settings, &launch, parent());
        assert_eq!(env["API_TIMEOUT_MS"], "600000");
        settings.env_policy.passthrough = vec!["API_TIMEOUT_MS".into()];
        let env = env_of(&settings, &launch, parent());
        assert_eq!(env["API_TIMEOUT_MS"], "5000");

        settings.cli_env = BTreeMap::from([
            ("API_TIMEOUT_MS".to_owned(), "7000".to_owned()),
            ("HOME".to_owned(), "/elsewhere".to_owned()),
            ("GH_TOKEN".to_owned(), "ghp_secret".to_owned()),
            (
                "NODE_OPTIONS".to_owned(),
                "--max-old-space-size=2048".to_owned(),
            ),
        ]);
        let env = env_of(&settings, &launch, parent());
        assert_eq!(
            env["API_TIMEOUT_MS"], "7000",
            "cliEnv wins over a passthrough"
        );
        assert_eq!(env["NODE_OPTIONS"], "--max-old-space-size=2048");
        assert_eq!(
            env["HOME"], "/workspace/.home/claude",
            "the provider's own stays"
        );
        assert!(!env.contains_key("GH_TOKEN"), "scrubbed");
    }

    fn env_of(
        settings: &ProviderSettings,
        launch: &Launch,
        parent: Vec<(String, String)>,
    ) -> BTreeMap<String, String> {
        env(settings, launch, parent, false)
    }

    #[test]
    fn files_are_written_privately() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mut settings = ProviderSettings::for_workspace(dir.path(), "claude");
        settings.api_key = Some(logging::redact::Secret::new("sk-secret\n"));
        let launch = Launch {
            resume: None,
            system_prompt: Some("prompt".into()),
            model: None,
        };
        let files = write_files(&settings, &launch).unwrap();
        let key = files.api_key.unwrap();
        assert_eq!(std::fs::read_to_string(&key).unwrap(), "sk-secret");
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::read_to_string(files.system_prompt.unwrap()).unwrap(),
            "prompt"
        );
        assert!(settings.agent_dir.is_dir());
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(files.mcp_config).unwrap()).unwrap();
        assert!(config["mcpServers"]["nanoclaw"].is_object());
    }

    #[test]
    fn precompact_hook_joins_the_api_key_helper() {
        let mut settings = settings();
        settings.runner_exe = Some("/usr/local/bin/agent-runner".into());
        settings.assistant_name = Some("Andy O'Neil".into());
        let json = serde_json::to_string_pretty(&settings_json(&settings, &files())).unwrap();
        expect![[r#"
            {
              "apiKeyHelper": "cat '/workspace/.home/claude/.nanoclaw/anthropic-api-key'",
              "hooks": {
                "PreCompact": [
                  {
                    "hooks": [
                      {
                        "command": "'/usr/local/bin/agent-runner' archive-hook --conversations-dir '/workspace/agent/conversations' --timezone 'Europe/Berlin' --workspace '/workspace' --set 'assistantName=Andy O'\\''Neil'",
                        "type": "command"
                      }
                    ],
                    "matcher": ""
                  }
                ]
              }
            }"#]]
        .assert_eq(&json);
        // Without a key file only the hook is there; without a runner binary, no hook.
        let no_key = LaunchFiles {
            api_key: None,
            ..files()
        };
        let only_hooks = settings_json(&settings, &no_key);
        assert_eq!(
            only_hooks.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["hooks"]
        );
        settings.runner_exe = None;
        assert!(settings_json(&settings, &files()).get("hooks").is_none());
    }

    /// Issue 16: deny rules Claude says the same way (or wider) join its own deny list; the
    /// others stay with the driver's hook. Remote MCP servers are allowed like the others.
    #[test]
    fn deny_rules_and_remote_servers_on_the_command_line() {
        let mut settings = settings();
        let rules = |list: &[&str]| {
            list.iter()
                .map(|r| provider::ToolRule::parse(r).unwrap())
                .collect()
        };
        settings.tool_policy.deny = rules(&[
            "Bash(rm *)",
            "Bash(git push:*)",
            "WebFetch",
            "mcp__github__*",
            "mcp__git*",
            "Read(/etc/*)",
            "Bash(a,b)",
        ]);
        settings.tool_policy.ask = rules(&["Bash"]);
        settings.remote_mcp_servers.insert(
            "docs".into(),
            provider::RemoteMcpServer {
                url: "http://127.0.0.1:4000/mcp/docs".into(),
                headers: BTreeMap::from([("Authorization".into(), "Bearer tok".into())]),
            },
        );
        let args = args(&settings, &Launch::default(), &files());
        let value = |flag: &str| {
            args.windows(2)
                .find(|w| w[0] == flag)
                .map(|w| w[1].clone())
                .unwrap_or_default()
        };
        expect!["mcp__nanoclaw__*,mcp__github__*,mcp__docs__*"].assert_eq(&value("--allowedTools"));
        expect!["AskUserQuestion,CronCreate,CronDelete,CronList,ScheduleWakeup,Monitor,Workflow,EnterPlanMode,ExitPlanMode,EnterWorktree,ExitWorktree,SendMessage,ListAgents,Bash(rm *),Bash(git push:*),WebFetch,mcp__github__*"]
            .assert_eq(&value("--disallowedTools"));
        // The mode stays: the hook decides, and bypassPermissions runs as root with IS_SANDBOX.
        assert_eq!(value("--permission-mode"), "bypassPermissions");
        // The remote server's header is in the MCP config file only.
        assert!(!args.iter().any(|a| a.contains("Bearer")), "{args:?}");
    }

    #[test]
    fn remote_mcp_servers_are_streamable_http_entries() {
        let mut settings = settings();
        for (name, url) in [
            ("docs", "http://127.0.0.1:4000/mcp/docs"),
            ("github", "http://x"),
        ] {
            settings.remote_mcp_servers.insert(
                name.into(),
                provider::RemoteMcpServer {
                    url: url.into(),
                    headers: BTreeMap::from([("Authorization".into(), "Bearer tok".into())]),
                },
            );
        }
        let config = mcp_config_json(&settings);
        // `github` is a stdio server already: the remote one of that name is left out.
        assert_eq!(config["mcpServers"]["github"]["type"], "stdio");
        expect![[r#"
            {
              "headers": {
                "Authorization": "Bearer tok"
              },
              "type": "http",
              "url": "http://127.0.0.1:4000/mcp/docs"
            }"#]]
        .assert_eq(&serde_json::to_string_pretty(&config["mcpServers"]["docs"]).unwrap());
    }
}
