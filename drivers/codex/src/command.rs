//! The `codex app-server` command line and environment (docs/contract/providers.md#codex).
//!
//! All configuration goes through `-c key=value` overrides (the value is TOML) and a private
//! `CODEX_HOME`, so nothing depends on a `config.toml` someone may have left in the home dir and
//! the whole configuration is visible in one place (and in one snapshot test).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use procs::CliCommand;
use provider::settings::{McpServer, ProviderSettings};

/// Name of the model provider entry we define (`model_providers.nanoclaw`).
pub(super) const MODEL_PROVIDER: &str = "nanoclaw";

/// The variable that carries the API key to Codex (`env_key` of our model provider). Codex reads
/// it itself; the shell environment policy keeps it away from the agent's commands. With the
/// runner's credential proxy it holds the session token, never the real key.
pub(super) const API_KEY_VAR: &str = "NANOCLAW_CODEX_API_KEY";

/// Used when no base URL is configured: the public OpenAI API.
pub(super) const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// Added to `settings.tool_timeout` for every MCP server's `tool_timeout_sec`, so Codex never
/// gives up on a blocking tool (ask_user_question) before the tool's own timeout fires.
pub(super) const TOOL_TIMEOUT_MARGIN: Duration = Duration::from_secs(60);

/// How long Codex waits for an MCP server to start.
pub(super) const MCP_STARTUP_TIMEOUT_SECS: u64 = 30;

/// `CODEX_HOME` inside the private home dir. It is Codex's default location under `HOME`, so a
/// person inspecting the home dir finds sessions where they expect them.
pub(super) fn codex_home(settings: &ProviderSettings) -> PathBuf {
    settings.home_dir.join(".codex")
}

/// Builds the complete `codex app-server` invocation for `program` (already resolved).
pub(super) fn command(
    program: &Path,
    settings: &ProviderSettings,
    parent_env: impl IntoIterator<Item = (String, String)>,
) -> CliCommand {
    CliCommand::new(program, &settings.agent_dir)
        .args(["app-server".to_owned()])
        .args(config_args(settings))
        .envs(environment(settings, parent_env))
}

/// The `-c` overrides, in a stable order.
pub(super) fn config_args(settings: &ProviderSettings) -> Vec<String> {
    let mut overrides: Vec<(String, String)> = Vec::new();
    let mut set = |key: &str, value: String| overrides.push((key.to_owned(), value));

    set("model_provider", toml_str(MODEL_PROVIDER));
    if let Some(model) = &settings.model {
        set("model", toml_str(model));
    }
    if let Some(effort) = &settings.effort {
        set("model_reasoning_effort", toml_str(effort));
    }
    let base_url = settings.base_url.as_deref().unwrap_or(DEFAULT_BASE_URL);
    let mut provider = vec![
        ("name", toml_str("NanoClaw")),
        ("base_url", toml_str(base_url)),
        // "chat" is rejected at config load by this Codex version.
        ("wire_api", toml_str("responses")),
    ];
    if settings.api_key.is_some() {
        provider.push(("env_key", toml_str(API_KEY_VAR)));
    }
    // Both retry kinds multiply (docs/contract/providers.md#codex): with N each a 500 costs
    // (N+1)^2 requests, a few seconds for the default N = 2, instead of Codex's 30 requests over
    // 25 s.
    provider.push(("request_max_retries", settings.max_retries.to_string()));
    provider.push(("stream_max_retries", settings.max_retries.to_string()));
    // A stream that stops sending events fails after this (Codex's default is 5 minutes), and
    // Codex's retry notice then names the cause before the runner's progress deadline does.
    provider.push((
        "stream_idle_timeout_ms",
        settings.stream_idle_timeout.as_millis().to_string(),
    ));
    set(
        &format!("model_providers.{MODEL_PROVIDER}"),
        inline_table(&provider),
    );

    // Without a tool policy nobody is there to approve anything, and the container is the
    // sandbox. With one, Codex hands every call to the driver (`approval.rs`).
    // 0.169 refuses `untrusted` in the config ("no longer supported") but honours it in
    // `thread/start` / `thread/resume`, which set it for the thread; `on-request` here is only
    // the fallback, never `never`.
    let config_policy = match approval_policy(settings) {
        "never" => "never",
        _ => "on-request",
    };
    set("approval_policy", toml_str(config_policy));
    set("sandbox_mode", toml_str("danger-full-access"));
    // Codex's web search runs at the model provider, past any approval: off unless allowed.
    if settings.tool_policy.decide("WebSearch", None) != provider::Decision::Allow {
        set("web_search", toml_str("disabled"));
    }
    // Traffic off: plugins make Codex resolve chatgpt.com and github.com on every start
    // (docs/contract/providers.md#codex); analytics and the update check would phone home too.
    set("features.plugins", "false".into());
    set("analytics.enabled", "false".into());
    set("check_for_update_on_startup", "false".into());

    // Extra directories the agent may use. With danger-full-access Codex reads and writes
    // everywhere anyway; the writable roots matter if the sandbox mode is ever tightened, and
    // app-server has no `--add-dir`.
    if !settings.extra_dirs.is_empty() {
        let roots: Vec<String> = settings
            .extra_dirs
            .iter()
            .map(|d| toml_str(&d.display().to_string()))
            .collect();
        set(
            "sandbox_workspace_write.writable_roots",
            format!("[{}]", roots.join(", ")),
        );
    }

    // The agent's shell gets the CLI's environment minus our API key and anything that looks like
    // a secret. Codex's default excludes (*KEY*, *SECRET*, *TOKEN*) are OFF unless
    // ignore_default_excludes=false, so the key would otherwise reach `env` in the shell.
    set("shell_environment_policy.inherit", toml_str("all"));
    set(
        "shell_environment_policy.ignore_default_excludes",
        "false".into(),
    );
    let mut excludes = vec![API_KEY_VAR.to_owned()];
    excludes.extend(settings.env_policy.scrub_patterns.iter().cloned());
    let excludes: Vec<String> = excludes.iter().map(|p| toml_str(p)).collect();
    set(
        "shell_environment_policy.exclude",
        format!("[{}]", excludes.join(", ")),
    );

    let tool_timeout = (settings.tool_timeout + TOOL_TIMEOUT_MARGIN).as_secs();
    let nanoclaw = McpServer {
        command: settings.mcp_tools_path.display().to_string(),
        args: Vec::new(),
        env: settings.mcp_tools_env(),
    };
    set("mcp_servers.nanoclaw", mcp_server(&nanoclaw, tool_timeout));
    for (name, server) in &settings.extra_mcp_servers {
        let key = config_key(name);
        if key == "nanoclaw" {
            tracing::warn!(
                "extra MCP server named nanoclaw ignored: the name is reserved for mcp-tools"
            );
            continue;
        }
        set(
            &format!("mcp_servers.{key}"),
            mcp_server(server, tool_timeout),
        );
    }

    overrides
        .into_iter()
        .flat_map(|(key, value)| ["-c".to_owned(), format!("{key}={value}")])
        .collect()
}

/// The thread's approval policy (`thread/start`, `thread/resume`): `never` without a tool
/// policy (every call runs), `untrusted` with one: Codex then asks for
/// every command (known-safe ones included), file change and MCP tool call, and forwards MCP
/// elicitations instead of declining them.
pub(super) fn approval_policy(settings: &ProviderSettings) -> &'static str {
    if super::approval::gated(&settings.tool_policy, settings.elicitation) {
        "untrusted"
    } else {
        "never"
    }
}

/// `CODEX_HOME/config.toml`: the remote MCP servers, kept off the command line because their
/// headers (the credential proxy's session token, or a literal secret) must not show in the
/// process list. Everything else is a `-c` override.
pub(super) fn config_file(settings: &ProviderSettings) -> String {
    let tool_timeout = (settings.tool_timeout + TOOL_TIMEOUT_MARGIN).as_secs();
    let mut text = String::from("# Written by the NanoClaw agent-runner at every start.\n");
    for (name, server) in &settings.remote_mcp_servers {
        let key = config_key(name);
        if key == "nanoclaw"
            || settings
                .extra_mcp_servers
                .keys()
                .any(|n| config_key(n) == key)
        {
            tracing::warn!(server = %name, "remote MCP server ignored: its name is taken");
            continue;
        }
        text.push_str(&format!(
            "\n[mcp_servers.{key}]\nurl = {}\nstartup_timeout_sec = {MCP_STARTUP_TIMEOUT_SECS}\ntool_timeout_sec = {tool_timeout}\n",
            toml_str(&server.url)
        ));
        if !server.headers.is_empty() {
            text.push_str(&format!("\n[mcp_servers.{key}.http_headers]\n"));
            for (header, value) in &server.headers {
                text.push_str(&format!("{} = {}\n", toml_str(header), toml_str(value)));
            }
        }
    }
    text.push_str(&approval_stop_hook(&settings.approval_stop_tools));
    text
}

/// The `statusMessage` of the approval-stop hook: `hook/started` carries it, which is how the
/// driver tells our hook from any other.
pub(super) const APPROVAL_STOP_HOOK_STATUS: &str = "NanoClaw approval stop";

/// How long the approval-stop hook holds Codex at most. The driver's `turn/interrupt` ends it
/// within milliseconds (Codex kills the hook with the turn); this only bounds the wait if the
/// driver is gone, after which Codex goes on as if there were no hook.
const APPROVAL_STOP_HOLD_SECS: u64 = 60;

/// A `PostToolUse` hook on the approval-stop tools that holds Codex after the tool's result until
/// the driver's `turn/interrupt` ends the turn, so the turn's next model request can never win
/// the race against the interrupt. Codex 0.169's own `continue: false` does not end the turn
/// (measured: Codex replaces the tool's output with the stop reason and asks the model again),
/// so the hook only waits. It loads only once trusted ([`super::hooks`]).
fn approval_stop_hook(tools: &[String]) -> String {
    if tools.is_empty() {
        return String::new();
    }
    let names: Vec<String> = tools.iter().map(|t| regex_literal(t)).collect();
    format!(
        "\n[[hooks.PostToolUse]]\nmatcher = {}\nhooks = [{{ type = \"command\", command = {}, \
         timeout = {}, statusMessage = {} }}]\n",
        toml_str(&format!("^(?:{})$", names.join("|"))),
        toml_str(&format!("cat >/dev/null; sleep {APPROVAL_STOP_HOLD_SECS}")),
        APPROVAL_STOP_HOLD_SECS + 30,
        toml_str(APPROVAL_STOP_HOOK_STATUS),
    )
}

/// `text` as a regex matching exactly it (Codex's hook matchers are regexes).
fn regex_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii_punctuation() && c != '_' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Writes [`config_file`] into the private `CODEX_HOME` (owner-only), and [`PROMPT_RULES`] as
/// `rules/nanoclaw.rules` while the driver judges the calls (removed otherwise: under `never` a
/// `prompt` rule would forbid the command).
pub(super) fn write_config_file(settings: &ProviderSettings) -> std::io::Result<()> {
    let home = codex_home(settings);
    fsguard::write_private(&home.join("config.toml"), config_file(settings).as_bytes())?;
    let rules = home.join("rules").join(PROMPT_RULES_FILE);
    if super::approval::gated(&settings.tool_policy, settings.elicitation) {
        std::fs::create_dir_all(home.join("rules"))?;
        fsguard::write_private(&rules, prompt_rules().as_bytes())
    } else {
        match std::fs::remove_file(&rules) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(err),
            _ => Ok(()),
        }
    }
}

/// The name of the exec-policy rules file in `CODEX_HOME/rules`.
const PROMPT_RULES_FILE: &str = "nanoclaw.rules";

/// The programs Codex 0.169 runs without asking under `untrusted` when every simple command of
/// the line is one of them with harmless options (its `is_known_safe_command`: `cat`, `ls`,
/// `grep`, `find` without `-exec`, `sed -n Np`, ...; `git` is not among them). A deny rule on
/// such a command (`Bash(cat *.env)`) would not hold, so [`prompt_rules`] makes Codex ask for
/// them too.
pub(super) const PROMPT_RULES: [&str; 30] = [
    "base64", "cat", "cd", "cut", "echo", "expr", "false", "find", "grep", "head", "id", "ls",
    "nl", "numfmt", "paste", "pwd", "rev", "rg", "sed", "seq", "stat", "tac", "tail", "tr", "true",
    "uname", "uniq", "wc", "which", "whoami",
];

/// An exec-policy rule (`CODEX_HOME/rules/*.rules`) that makes Codex ask (`prompt`) before any
/// of [`PROMPT_RULES`], by name or at `/bin` or `/usr/bin`: a matching rule
/// replaces Codex's known-safe shortcut, so under `untrusted` every command reaches the driver
/// (measured: docs/contract/providers.md#codex).
pub(super) fn prompt_rules() -> String {
    let mut names = Vec::new();
    for program in PROMPT_RULES {
        for prefix in ["", "/bin/", "/usr/bin/"] {
            names.push(toml_str(&format!("{prefix}{program}")));
        }
    }
    format!(
        "# Written by the NanoClaw agent-runner: every command goes to the tool policy.\n\
         prefix_rule(pattern = [[{}]], decision = \"prompt\", justification = \"the tool policy decides\")\n",
        names.join(", ")
    )
}

/// The CLI's environment: the allow-listed part of the runner's environment, then our own
/// variables, which win.
pub(super) fn environment(
    settings: &ProviderSettings,
    parent_env: impl IntoIterator<Item = (String, String)>,
) -> BTreeMap<String, String> {
    let mut env = settings.base_env(parent_env);
    env.insert("HOME".into(), settings.home_dir.display().to_string());
    env.insert(
        "CODEX_HOME".into(),
        codex_home(settings).display().to_string(),
    );
    env.insert("TZ".into(), settings.timezone.clone());
    if let Some(key) = &settings.api_key {
        env.insert(API_KEY_VAR.into(), key.expose().to_owned());
    }
    env
}

/// The native Codex binary behind the npm launcher, if `program` is that launcher.
///
/// `.cli/node_modules/.bin/codex` is `@openai/codex/bin/codex.js`, a node script that execs
/// `@openai/codex-<platform>/vendor/<triple>/bin/codex`. Running the native binary directly
/// saves a node start (and a dependency on node at run time); signals and the process group
/// behave the same since the launcher execs.
pub(super) fn native_binary(program: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(program).ok()?;
    if real.extension().and_then(|e| e.to_str()) != Some("js") {
        return None;
    }
    let (platform, triple) = match std::env::consts::ARCH {
        "x86_64" => ("codex-linux-x64", "x86_64-unknown-linux-musl"),
        "aarch64" => ("codex-linux-arm64", "aarch64-unknown-linux-musl"),
        _ => return None,
    };
    // real = <node_modules>/@openai/codex/bin/codex.js
    let package = real.parent()?.parent()?;
    let candidates = [
        package
            .parent()?
            .join(platform)
            .join("vendor")
            .join(triple)
            .join("bin/codex"),
        package
            .join("node_modules/@openai")
            .join(platform)
            .join("vendor")
            .join(triple)
            .join("bin/codex"),
        package.join("vendor").join(triple).join("bin/codex"),
    ];
    candidates.into_iter().find(|c| c.is_file())
}

fn mcp_server(server: &McpServer, tool_timeout_secs: u64) -> String {
    let args: Vec<String> = server.args.iter().map(|a| toml_str(a)).collect();
    let env: Vec<(String, String)> = server
        .env
        .iter()
        .map(|(k, v)| (toml_str(k), toml_str(v)))
        .collect();
    let env = format!(
        "{{{}}}",
        env.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    inline_table(&[
        ("command", toml_str(&server.command)),
        ("args", format!("[{}]", args.join(", "))),
        ("env", env),
        ("startup_timeout_sec", MCP_STARTUP_TIMEOUT_SECS.to_string()),
        ("tool_timeout_sec", tool_timeout_secs.to_string()),
    ])
}

fn inline_table(entries: &[(&str, String)]) -> String {
    let body: Vec<String> = entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{{{}}}", body.join(", "))
}

/// A TOML basic string. JSON string escapes (`\" \\ \n \t \uXXXX`...) are all valid in TOML.
fn toml_str(value: &str) -> String {
    serde_json::Value::String(value.to_owned()).to_string()
}

/// A dotted-path segment Codex's `-c` parser accepts (it splits the key on dots).
fn config_key(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    fn settings() -> ProviderSettings {
        let mut s = ProviderSettings::for_workspace("/workspace", "codex");
        s.mcp_tools_path = "/usr/local/bin/mcp-tools".into();
        s.model = Some("fake-model".into());
        s.base_url = Some("http://127.0.0.1:18080/v1".into());
        s.api_key = Some(logging::redact::Secret::new("sk-test"));
        s.timezone = "America/Los_Angeles".into();
        s.admin_user_id = Some("admin-1".into());
        s.extra_dirs = vec!["/workspace/extra/docs".into()];
        s.extra_mcp_servers.insert(
            "web tools".into(),
            McpServer {
                command: "/opt/web".into(),
                args: vec!["--x".into()],
                env: BTreeMap::from([("A".into(), "1\"2".into())]),
            },
        );
        s
    }

    #[test]
    fn command_line() {
        let args = config_args(&settings());
        let text: Vec<String> = args.chunks(2).map(|pair| pair.join(" ")).collect();
        expect![[r#"
            -c model_provider="nanoclaw"
            -c model="fake-model"
            -c model_providers.nanoclaw={name="NanoClaw", base_url="http://127.0.0.1:18080/v1", wire_api="responses", env_key="NANOCLAW_CODEX_API_KEY", request_max_retries=2, stream_max_retries=2, stream_idle_timeout_ms=90000}
            -c approval_policy="never"
            -c sandbox_mode="danger-full-access"
            -c features.plugins=false
            -c analytics.enabled=false
            -c check_for_update_on_startup=false
            -c sandbox_workspace_write.writable_roots=["/workspace/extra/docs"]
            -c shell_environment_policy.inherit="all"
            -c shell_environment_policy.ignore_default_excludes=false
            -c shell_environment_policy.exclude=["NANOCLAW_CODEX_API_KEY", "*_TOKEN", "*_SECRET", "*_SECRET_*", "*_PASSWORD", "DATABASE_URL", "*_DATABASE_URL", "*_PRIVATE_KEY"]
            -c mcp_servers.nanoclaw={command="/usr/local/bin/mcp-tools", args=[], env={"NANOCLAW_ADMIN_USER_ID"="admin-1", "NANOCLAW_MAX_QUESTION_TIMEOUT"="300", "SESSION_DB"="/workspace/session.db", "TZ"="America/Los_Angeles", "WORKSPACE_DIR"="/workspace"}, startup_timeout_sec=30, tool_timeout_sec=360}
            -c mcp_servers.web_tools={command="/opt/web", args=["--x"], env={"A"="1\"2"}, startup_timeout_sec=30, tool_timeout_sec=360}"#]]
        .assert_eq(&text.join("\n"));
    }

    /// With a tool policy: approvals on (the thread's `untrusted`), web search off when not
    /// allowed; remote MCP servers go to the private config file, headers included, never to
    /// the command line.
    #[test]
    fn policy_and_remote_servers() {
        let mut s = settings();
        s.tool_policy.deny = vec![provider::ToolRule::parse("Bash(rm *)").unwrap()];
        s.tool_policy.ask = vec![provider::ToolRule::parse("WebSearch").unwrap()];
        s.remote_mcp_servers.insert(
            "docs.search".into(),
            provider::RemoteMcpServer {
                url: "http://127.0.0.1:9000/mcp/docs".into(),
                headers: BTreeMap::from([("Authorization".into(), "Bearer tok-1".into())]),
            },
        );
        s.remote_mcp_servers.insert(
            "web tools".into(),
            provider::RemoteMcpServer {
                url: "http://127.0.0.1:9000/taken".into(),
                headers: BTreeMap::new(),
            },
        );
        s.remote_mcp_servers.insert(
            "open".into(),
            provider::RemoteMcpServer {
                url: "https://mcp.example.com/mcp".into(),
                headers: BTreeMap::new(),
            },
        );
        assert_eq!(approval_policy(&s), "untrusted");
        let args = config_args(&s);
        let text: Vec<String> = args
            .chunks(2)
            .map(|pair| pair.join(" "))
            .filter(|line| line.contains("approval") || line.contains("web_search"))
            .collect();
        expect![[r#"
            -c approval_policy="on-request"
            -c web_search="disabled""#]]
        .assert_eq(&text.join("\n"));
        assert!(!args.join(" ").contains("tok-1"), "{args:?}");
        expect![[r##"
            # Written by the NanoClaw agent-runner at every start.

            [mcp_servers.docs_search]
            url = "http://127.0.0.1:9000/mcp/docs"
            startup_timeout_sec = 30
            tool_timeout_sec = 360

            [mcp_servers.docs_search.http_headers]
            "Authorization" = "Bearer tok-1"

            [mcp_servers.open]
            url = "https://mcp.example.com/mcp"
            startup_timeout_sec = 30
            tool_timeout_sec = 360
        "##]]
        .assert_eq(&config_file(&s));

        let plain = settings();
        assert_eq!(approval_policy(&plain), "never");
        assert!(!config_args(&plain).join(" ").contains("web_search"));
        let mut asks = settings();
        asks.elicitation = provider::ElicitationMode::Ask;
        assert_eq!(approval_policy(&asks), "untrusted");
    }

    /// The approval-stop tools get one `PostToolUse` hook matching exactly their names (a `.`
    /// or `-` in a name is no wildcard); without them there is none.
    #[test]
    fn approval_stop_hook_in_the_config_file() {
        let mut s = settings();
        assert!(!config_file(&s).contains("hooks"));
        s.approval_stop_tools = vec![
            "mcp__nanoclaw__send_message".into(),
            "mcp__docs-v1.2__publish".into(),
        ];
        expect![[r#"
            # Written by the NanoClaw agent-runner at every start.

            [[hooks.PostToolUse]]
            matcher = "^(?:mcp__nanoclaw__send_message|mcp__docs\\-v1\\.2__publish)$"
            hooks = [{ type = "command", command = "cat >/dev/null; sleep 60", timeout = 90, statusMessage = "NanoClaw approval stop" }]
        "#]]
        .assert_eq(&config_file(&s));
    }

    /// With a restricting policy `CODEX_HOME/rules/nanoclaw.rules` makes every known-safe
    /// program ask; without one the file is gone again (under `never` it would forbid them).
    #[test]
    fn known_safe_programs_are_asked_about_while_the_policy_judges() {
        let rules = prompt_rules();
        assert!(
            rules.contains(r#""cat", "/bin/cat", "/usr/bin/cat""#),
            "{rules}"
        );
        assert!(
            rules.contains(r#""whoami", "/bin/whoami", "/usr/bin/whoami"]]"#),
            "{rules}"
        );
        assert!(rules
            .ends_with("decision = \"prompt\", justification = \"the tool policy decides\")\n"));
        let dir = tempfile::tempdir().unwrap();
        let mut s = ProviderSettings::for_workspace(dir.path(), "codex");
        let file = codex_home(&s).join("rules").join(PROMPT_RULES_FILE);
        std::fs::create_dir_all(codex_home(&s)).unwrap();
        s.tool_policy.deny = vec![provider::ToolRule::parse("Bash(cat *)").unwrap()];
        write_config_file(&s).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), rules);
        s.tool_policy = provider::ToolPolicy::default();
        write_config_file(&s).unwrap();
        assert!(!file.exists());
        write_config_file(&s).unwrap();
    }

    #[test]
    fn environment_is_scrubbed_and_private() {
        let env = environment(
            &settings(),
            [
                ("PATH".to_owned(), "/bin".to_owned()),
                ("HOME".to_owned(), "/root".to_owned()),
                ("OPENAI_API_KEY".to_owned(), "sk-host".to_owned()),
                ("GITHUB_TOKEN".to_owned(), "ghp".to_owned()),
            ],
        );
        expect![[r#"
            {
                "CODEX_HOME": "/workspace/.home/codex/.codex",
                "HOME": "/workspace/.home/codex",
                "NANOCLAW_CODEX_API_KEY": "sk-test",
                "PATH": "/bin",
                "TZ": "America/Los_Angeles",
            }
        "#]]
        .assert_debug_eq(&env);
    }

    #[test]
    fn no_key_means_no_env_key() {
        let mut s = settings();
        s.api_key = None;
        s.base_url = None;
        let args = config_args(&s).join(" ");
        assert!(
            args.contains("base_url=\"https://api.openai.com/v1\""),
            "{args}"
        );
        assert!(!args.contains("env_key"), "{args}");
        assert!(!environment(&s, []).contains_key(API_KEY_VAR));
    }

    #[test]
    fn native_binary_behind_the_npm_launcher() {
        let dir = tempfile::tempdir().unwrap();
        let nm = dir.path().join("node_modules");
        let launcher = nm.join("@openai/codex/bin/codex.js");
        let native = nm.join("@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex");
        std::fs::create_dir_all(launcher.parent().unwrap()).unwrap();
        std::fs::create_dir_all(native.parent().unwrap()).unwrap();
        std::fs::write(&launcher, "#!/usr/bin/env node\n").unwrap();
        std::fs::write(&native, "").unwrap();
        std::fs::create_dir_all(nm.join(".bin")).unwrap();
        let bin = nm.join(".bin/codex");
        std::os::unix::fs::symlink("../@openai/codex/bin/codex.js", &bin).unwrap();
        if std::env::consts::ARCH == "x86_64" {
            assert_eq!(
                native_binary(&bin).unwrap(),
                std::fs::canonicalize(&native).unwrap()
            );
        }
        assert_eq!(native_binary(&native), None);
    }
}
