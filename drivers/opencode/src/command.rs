//! The `opencode serve` command line, its environment and the inline configuration
//! (`OPENCODE_CONFIG_CONTENT`, docs/contract/providers.md#opencode), plus the files the provider keeps in the private
//! home.
//!
//! Everything OpenCode is told lives here, so one snapshot test shows the whole setup.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::protocol::MCP_SERVER;
use procs::CliCommand;
use provider::settings::{McpServer, ProviderSettings};

/// Name of the model provider entry we define (`provider.nanoclaw`); models are
/// `nanoclaw/<model>`.
pub(super) const MODEL_PROVIDER: &str = "nanoclaw";

/// Used when no base URL is configured: the public OpenAI API (Chat Completions).
pub(super) const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// Used when no model is configured. OpenCode needs a model id for a custom provider.
pub(super) const DEFAULT_MODEL: &str = "gpt-4.1";

/// HTTP basic-auth user of the server (OpenCode's default, set explicitly).
pub(super) const SERVER_USER: &str = "opencode";

/// Added to `settings.tool_timeout` for OpenCode's MCP request timeout (its default is the MCP
/// SDK's 60 s), so OpenCode never gives up on a blocking tool (ask_user_question) before the
/// tool's own timeout fires.
pub(super) const TOOL_TIMEOUT_MARGIN: Duration = Duration::from_secs(60);

/// Where the provider keeps its own files inside the private home.
pub(super) fn state_dir(settings: &ProviderSettings) -> PathBuf {
    settings.home_dir.join(".nanoclaw")
}

/// The file holding the API key. OpenCode reads it through a `{file:…}` reference in the
/// config, so the key is not in any environment variable the agent's shell inherits. With the
/// runner's credential proxy it holds the session token, never the real key.
pub(super) fn api_key_file(settings: &ProviderSettings) -> PathBuf {
    state_dir(settings).join("openai-api-key")
}

/// OpenCode's global config dir under the private home.
pub(super) fn global_config_dir(settings: &ProviderSettings) -> PathBuf {
    settings.home_dir.join(".config").join("opencode")
}

/// MCP request timeout given to OpenCode, in milliseconds.
pub(super) fn mcp_timeout_ms(settings: &ProviderSettings) -> u64 {
    u64::try_from((settings.tool_timeout + TOOL_TIMEOUT_MARGIN).as_millis()).unwrap_or(u64::MAX)
}

/// The model id inside our provider entry.
pub(super) fn model(settings: &ProviderSettings) -> &str {
    settings.model.as_deref().unwrap_or(DEFAULT_MODEL)
}

/// The inline configuration (`OPENCODE_CONFIG_CONTENT`). `key_file` is the file holding the
/// API key, when there is one. `extra_models` are declared beside the configured model: OpenCode
/// refuses a prompt for a model its provider entry does not list ("Model not found") without
/// asking the API, so a `/model` choice must be in the config of the running server.
pub(super) fn config(
    settings: &ProviderSettings,
    key_file: Option<&Path>,
    extra_models: &BTreeSet<String>,
) -> Value {
    let model = model(settings);
    let models: Map<String, Value> = std::iter::once(model)
        .chain(extra_models.iter().map(String::as_str))
        .map(|name| (name.to_owned(), json!({ "name": name, "tool_call": true })))
        .collect();
    let qualified = format!("{MODEL_PROVIDER}/{model}");
    let mut options = Map::new();
    options.insert(
        "baseURL".into(),
        json!(settings.base_url.as_deref().unwrap_or(DEFAULT_BASE_URL)),
    );
    if let Some(key_file) = key_file {
        options.insert(
            "apiKey".into(),
            json!(format!("{{file:{}}}", key_file.display())),
        );
    }
    // OpenCode's own bound on one model request, in ms.
    options.insert(
        "timeout".into(),
        json!(u64::try_from(settings.request_timeout.as_millis()).unwrap_or(u64::MAX)),
    );
    let timeout = mcp_timeout_ms(settings);
    let mut mcp = Map::new();
    for (name, server) in &settings.extra_mcp_servers {
        if name == MCP_SERVER {
            tracing::warn!(
                server = %name,
                "an extra MCP server uses the reserved name; it is replaced by mcp-tools"
            );
            continue;
        }
        mcp.insert(name.clone(), mcp_server(server, timeout));
    }
    let nanoclaw = McpServer {
        command: settings.mcp_tools_path.display().to_string(),
        args: Vec::new(),
        env: settings.mcp_tools_env(),
    };
    mcp.insert(MCP_SERVER.into(), mcp_server(&nanoclaw, timeout));
    for (index, (name, server)) in settings.remote_mcp_servers.iter().enumerate() {
        if name == MCP_SERVER || settings.extra_mcp_servers.contains_key(name) {
            tracing::warn!(server = %name, "a remote MCP server reuses a server's name; left out");
            continue;
        }
        mcp.insert(
            name.clone(),
            remote_mcp_server(settings, index, server, timeout),
        );
    }

    // Everything is allowed: nobody is there to answer a permission prompt, and the container
    // is the sandbox. The extra directories are listed as well, so they stay reachable if the
    // catch-all is ever narrowed. The built-in `question` tool would wait for an answer through
    // OpenCode's own API, which nobody watches: mcp-tools' ask_user_question is the way. (The
    // tool is only offered to the "cli"/"app"/"desktop" clients, see OPENCODE_CLIENT below;
    // the deny rule is a second guard.)
    let mut external = Map::new();
    for dir in &settings.extra_dirs {
        external.insert(format!("{}/*", dir.display()), json!("allow"));
    }
    let mut permission = Map::new();
    // A restricting tool policy replaces the catch-all (`approval.rs`).
    let servers = mcp_server_names(settings);
    match super::approval::config(&settings.tool_policy, &servers) {
        Some(entries) => permission.extend(entries),
        None => {
            permission.insert("*".into(), json!("allow"));
        }
    }
    if !external.is_empty() {
        permission.insert("external_directory".into(), Value::Object(external));
    }
    permission.insert("question".into(), json!("deny"));

    let mut config = json!({
        "model": qualified,
        "small_model": qualified,
        "autoupdate": false,
        "share": "disabled",
        "provider": {
            MODEL_PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "NanoClaw",
                "options": Value::Object(options),
                "models": Value::Object(models),
            }
        },
        "mcp": Value::Object(mcp),
        "permission": Value::Object(permission),
        "experimental": { "mcp_timeout": timeout },
    });
    if !approval_stop_names(settings).is_empty() {
        config["plugin"] = json!([format!(
            "file://{}",
            approval_stop_plugin_file(settings).display()
        )]);
    }
    config
}

/// Every MCP server OpenCode gets, by name: mcp-tools, the stdio ones and the remote ones.
pub(super) fn mcp_server_names(settings: &ProviderSettings) -> Vec<String> {
    let mut names: Vec<String> = std::iter::once(MCP_SERVER.to_owned())
        .chain(settings.extra_mcp_servers.keys().cloned())
        .chain(settings.remote_mcp_servers.keys().cloned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// OpenCode's names of the approval-stop tools (MCP tools only; other names are ignored with a
/// warning when the server starts).
pub(super) fn approval_stop_names(settings: &ProviderSettings) -> Vec<String> {
    settings
        .approval_stop_tools
        .iter()
        .filter_map(|tool| super::approval::opencode_mcp_name(tool))
        .collect()
}

/// The approval-stop plugin's file (`approval::approval_stop_plugin`), written by
/// [`prepare_home`] when there are approval-stop tools.
pub(super) fn approval_stop_plugin_file(settings: &ProviderSettings) -> PathBuf {
    state_dir(settings).join("approval-stop.js")
}

/// The file holding the value of header `index` of remote server `server` (0600, read by
/// OpenCode through a `{file:…}` reference, so the value is in no environment variable the
/// agent's shell inherits, nor on a command line).
fn remote_header_file(settings: &ProviderSettings, server: usize, header: usize) -> PathBuf {
    state_dir(settings).join(format!("mcp-header-{server}-{header}"))
}

/// One `remote` (streamable HTTP) MCP server entry; header values by `{file:…}` reference.
/// OAuth discovery is off: the runner supplies the credentials.
fn remote_mcp_server(
    settings: &ProviderSettings,
    index: usize,
    server: &provider::settings::RemoteMcpServer,
    timeout_ms: u64,
) -> Value {
    let headers: Map<String, Value> = server
        .headers
        .keys()
        .enumerate()
        .map(|(n, name)| {
            let file = remote_header_file(settings, index, n);
            (name.clone(), json!(format!("{{file:{}}}", file.display())))
        })
        .collect();
    json!({
        "type": "remote",
        "url": server.url,
        "headers": Value::Object(headers),
        "oauth": false,
        "enabled": true,
        "timeout": timeout_ms,
    })
}

/// One `local` MCP server entry. `timeout` (ms) is OpenCode's request timeout for that server,
/// tool calls included (verified: a 2 s timeout cut a 3.5 s tool call).
fn mcp_server(server: &McpServer, timeout_ms: u64) -> Value {
    let mut command = vec![server.command.clone()];
    command.extend(server.args.iter().cloned());
    json!({
        "type": "local",
        "command": command,
        "environment": server.env,
        "enabled": true,
        "timeout": timeout_ms,
    })
}

/// The environment of `opencode serve`: the inherited allow-list (scrubbed), then the
/// provider's own variables. `disable_claude_md` stops OpenCode from loading CLAUDE.md files
/// itself (the runner's system prompt already carries them).
pub(super) fn environment(
    settings: &ProviderSettings,
    parent_env: impl IntoIterator<Item = (String, String)>,
    config: &Value,
    password: &str,
    disable_claude_md: bool,
) -> BTreeMap<String, String> {
    let mut env = settings.base_env(parent_env);
    let mut set = |name: &str, value: String| {
        env.insert(name.to_owned(), value);
    };
    set("HOME", settings.home_dir.display().to_string());
    set("TZ", settings.timezone.clone());
    set("OPENCODE_CONFIG_CONTENT", config.to_string());
    // Required on every route once set; random per spawn (see `Server::start`). It also marks
    // every process the server starts (they inherit it), which is how `stop` finds the agent's
    // shells that OpenCode puts in their own process groups.
    set("OPENCODE_SERVER_PASSWORD", password.to_owned());
    set("OPENCODE_SERVER_USERNAME", SERVER_USER.to_owned());
    // Not an interactive client: OpenCode then leaves out its built-in `question` tool (offered
    // only to the "cli", "app" and "desktop" clients) and the plan tool. Also shows in the
    // model requests' User-Agent.
    set("OPENCODE_CLIENT", "nanoclaw".into());
    // Traffic off (docs/contract/providers.md#opencode): no models.dev catalog, no update check, no sharing, no
    // language-server downloads. The background npm install is skipped by the files
    // `prepare_home` writes.
    set("OPENCODE_DISABLE_MODELS_FETCH", "1".into());
    set("OPENCODE_DISABLE_AUTOUPDATE", "1".into());
    set("OPENCODE_DISABLE_SHARE", "1".into());
    set("OPENCODE_DISABLE_LSP_DOWNLOAD", "1".into());
    if disable_claude_md {
        set("OPENCODE_DISABLE_CLAUDE_CODE", "1".into());
    }
    env
}

/// The whole `opencode serve` invocation. `--port 0` lets OpenCode pick a free port (it tries
/// 4096 first, then a random one) and the provider reads the real one from the "listening on"
/// line, so two runners never race for a port.
pub(super) fn command(
    program: &Path,
    settings: &ProviderSettings,
    env: BTreeMap<String, String>,
) -> CliCommand {
    CliCommand::new(program, &settings.agent_dir)
        .args(["serve", "--hostname", "127.0.0.1", "--port", "0"])
        .envs(env)
}

/// Creates the private home and the provider's files in it: the API key file (mode 0600) and
/// the markers that make OpenCode skip its background `npm install` of `@opencode-ai/plugin`
/// into the global config dir (it installs only when `node_modules` is missing or the lock file
/// lacks a dependency; that install would contact the npm registry on every start). Returns the
/// key file when there is a key.
pub(super) fn prepare_home(settings: &ProviderSettings) -> std::io::Result<Option<PathBuf>> {
    std::fs::create_dir_all(&settings.home_dir)?;
    std::fs::create_dir_all(&settings.agent_dir)?;
    let state = state_dir(settings);
    std::fs::create_dir_all(&state)?;
    let config_dir = global_config_dir(settings);
    std::fs::create_dir_all(config_dir.join("node_modules"))?;
    let lock = config_dir.join("package-lock.json");
    if !lock.exists() {
        use std::io::Write;
        fsguard::open_with(&lock, fsguard::Access::Truncate)?.write_all(
            br#"{"lockfileVersion":3,"packages":{"":{"dependencies":{"@opencode-ai/plugin":"*"}}}}"#,
        )?;
    }
    for (index, server) in settings.remote_mcp_servers.values().enumerate() {
        for (n, value) in server.headers.values().enumerate() {
            write_private(&remote_header_file(settings, index, n), value)?;
        }
    }
    let stops = approval_stop_names(settings);
    if stops.len() < settings.approval_stop_tools.len() {
        tracing::warn!(
            tools = ?settings.approval_stop_tools,
            "OpenCode ends turns only after MCP tools (mcp__<server>__<tool>); other approval-stop names are ignored"
        );
    }
    if !stops.is_empty() {
        write_private(
            &approval_stop_plugin_file(settings),
            &super::approval::approval_stop_plugin(&stops),
        )?;
    }
    let key_file = api_key_file(settings);
    match &settings.api_key {
        Some(key) => {
            write_private(&key_file, key.expose())?;
            Ok(Some(key_file))
        }
        None => {
            if key_file.exists() {
                std::fs::remove_file(&key_file)?;
            }
            Ok(None)
        }
    }
}

/// Writes `text` to `path`, readable by the owner only (through fsguard: the agent can plant
/// links in the CLI's home).
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    fsguard::write_private(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    fn settings() -> ProviderSettings {
        let mut settings = ProviderSettings::for_workspace("/workspace", "opencode");
        settings.mcp_tools_path = PathBuf::from("/usr/local/bin/mcp-tools");
        settings.base_url = Some("http://127.0.0.1:18080/v1".into());
        settings.api_key = Some(logging::redact::Secret::new("sk-test"));
        settings.timezone = "Europe/Berlin".into();
        settings.admin_user_id = Some("admin-1".into());
        settings.extra_dirs = vec![PathBuf::from("/workspace/extra/docs")];
        settings.extra_mcp_servers.insert(
            "search".into(),
            McpServer {
                command: "/usr/bin/search-mcp".into(),
                args: vec!["--stdio".into()],
                env: BTreeMap::from([("SEARCH_KEY".into(), "k".into())]),
            },
        );
        settings
    }

    #[test]
    fn inline_config() {
        let settings = settings();
        let config = config(
            &settings,
            Some(Path::new(
                "/workspace/.home/opencode/.nanoclaw/openai-api-key",
            )),
            &BTreeSet::from(["other-model".to_owned()]),
        );
        expect![[r#"
            {
              "autoupdate": false,
              "experimental": {
                "mcp_timeout": 360000
              },
              "mcp": {
                "nanoclaw": {
                  "command": [
                    "/usr/local/bin/mcp-tools"
                  ],
                  "enabled": true,
                  "environment": {
                    "NANOCLAW_ADMIN_USER_ID": "admin-1",
                    "NANOCLAW_MAX_QUESTION_TIMEOUT": "300",
                    "SESSION_DB": "/workspace/session.db",
                    "TZ": "Europe/Berlin",
                    "WORKSPACE_DIR": "/workspace"
                  },
                  "timeout": 360000,
                  "type": "local"
                },
                "search": {
                  "command": [
                    "/usr/bin/search-mcp",
                    "--stdio"
                  ],
                  "enabled": true,
                  "environment": {
                    "SEARCH_KEY": "k"
                  },
                  "timeout": 360000,
                  "type": "local"
                }
              },
              "model": "nanoclaw/gpt-4.1",
              "permission": {
                "*": "allow",
                "external_directory": {
                  "/workspace/extra/docs/*": "allow"
                },
                "question": "deny"
              },
              "provider": {
                "nanoclaw": {
                  "models": {
                    "gpt-4.1": {
                      "name": "gpt-4.1",
                      "tool_call": true
                    },
                    "other-model": {
                      "name": "other-model",
                      "tool_call": true
                    }
                  },
                  "name": "NanoClaw",
                  "npm": "@ai-sdk/openai-compatible",
                  "options": {
                    "apiKey": "{file:/workspace/.home/opencode/.nanoclaw/openai-api-key}",
                    "baseURL": "http://127.0.0.1:18080/v1",
                    "timeout": 600000
                  }
                }
              },
              "share": "disabled",
              "small_model": "nanoclaw/gpt-4.1"
            }"#]]
        .assert_eq(&serde_json::to_string_pretty(&Sorted(&config)).unwrap());
    }

    /// Serializes objects with sorted keys, whatever `serde_json`'s map order is (the
    /// `preserve_order` feature may be on through another crate).
    struct Sorted<'a>(&'a Value);

    impl serde::Serialize for Sorted<'_> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            match self.0 {
                Value::Object(map) => {
                    let sorted: std::collections::BTreeMap<&String, Sorted<'_>> =
                        map.iter().map(|(k, v)| (k, Sorted(v))).collect();
                    sorted.serialize(serializer)
                }
                Value::Array(items) => {
                    let items: Vec<Sorted<'_>> = items.iter().map(Sorted).collect();
                    items.serialize(serializer)
                }
                other => other.serialize(serializer),
            }
        }
    }

    #[test]
    fn environment_is_scrubbed_and_keyless() {
        let settings = settings();
        let config = config(&settings, None, &BTreeSet::new());
        let parent = [
            ("PATH".to_owned(), "/usr/bin".to_owned()),
            ("GITHUB_TOKEN".to_owned(), "secret".to_owned()),
            ("OPENAI_API_KEY".to_owned(), "sk-parent".to_owned()),
            ("HOME".to_owned(), "/root".to_owned()),
        ];
        let env = environment(&settings, parent, &config, "pw", true);
        let names: Vec<&str> = env.keys().map(String::as_str).collect();
        expect![[r#"
            [
                "HOME",
                "OPENCODE_CLIENT",
                "OPENCODE_CONFIG_CONTENT",
                "OPENCODE_DISABLE_AUTOUPDATE",
                "OPENCODE_DISABLE_CLAUDE_CODE",
                "OPENCODE_DISABLE_LSP_DOWNLOAD",
                "OPENCODE_DISABLE_MODELS_FETCH",
                "OPENCODE_DISABLE_SHARE",
                "OPENCODE_SERVER_PASSWORD",
                "OPENCODE_SERVER_USERNAME",
                "PATH",
                "TZ",
            ]
        "#]]
        .assert_debug_eq(&names);
        assert_eq!(env["HOME"], "/workspace/.home/opencode");
        assert!(!env
            .values()
            .any(|v| v.contains("sk-test") || v.contains("secret")));
    }

    #[test]
    fn command_line() {
        let settings = settings();
        let command = command(Path::new("/bin/opencode"), &settings, BTreeMap::new());
        assert_eq!(
            command.args,
            ["serve", "--hostname", "127.0.0.1", "--port", "0"]
        );
        assert_eq!(command.cwd, PathBuf::from("/workspace/agent"));
    }

    /// Remote MCP servers (header values by file reference), a restricting policy and an
    /// approval-stop tool: only the lines they change.
    #[test]
    fn remote_servers_policy_and_approval_stop() {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = ProviderSettings::for_workspace(dir.path(), "opencode");
        settings.remote_mcp_servers.insert(
            "docs".into(),
            provider::RemoteMcpServer {
                url: "http://127.0.0.1:9000/mcp/docs".into(),
                headers: BTreeMap::from([("Authorization".into(), "Bearer tok-123".into())]),
            },
        );
        settings.tool_policy.deny = vec![provider::ToolRule::parse("mcp__docs__delete").unwrap()];
        settings.approval_stop_tools = vec!["mcp__nanoclaw__send_message".into(), "Bash".into()];
        prepare_home(&settings).unwrap();
        let config = config(&settings, None, &BTreeSet::new());
        let root = dir.path().display().to_string();
        let show = |value: &Value| {
            serde_json::to_string_pretty(&Sorted(value))
                .unwrap()
                .replace(&root, "<ws>")
        };
        expect![[r#"
            {
              "enabled": true,
              "headers": {
                "Authorization": "{file:<ws>/.home/opencode/.nanoclaw/mcp-header-0-0}"
              },
              "oauth": false,
              "timeout": 360000,
              "type": "remote",
              "url": "http://127.0.0.1:9000/mcp/docs"
            }"#]]
        .assert_eq(&show(&config["mcp"]["docs"]));
        expect![[r#"
            {
              "*": "ask",
              "bash": {
                "*": "ask"
              },
              "docs_delete": "deny",
              "doom_loop": "allow",
              "edit": "allow",
              "external_directory": "allow",
              "glob": "allow",
              "grep": "allow",
              "question": "deny",
              "read": "allow",
              "webfetch": "allow",
              "websearch": "allow"
            }"#]]
        .assert_eq(&show(&config["permission"]));
        expect![[r#"
            [
              "file://<ws>/.home/opencode/.nanoclaw/approval-stop.js"
            ]"#]]
        .assert_eq(&show(&config["plugin"]));

        // The header value is in a private file, not in the config, the environment or the
        // command line.
        let header = state_dir(&settings).join("mcp-header-0-0");
        assert_eq!(std::fs::read_to_string(&header).unwrap(), "Bearer tok-123");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&header).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let env = environment(&settings, [], &config, "pw", true);
        assert!(!env.values().any(|v| v.contains("tok-123")), "{env:?}");
        let plugin = std::fs::read_to_string(approval_stop_plugin_file(&settings)).unwrap();
        assert!(
            plugin.contains(r#"new Set(["nanoclaw_send_message"])"#),
            "only MCP tools: {plugin}"
        );
        // Without approval-stop tools, no plugin.
        settings.approval_stop_tools.clear();
        assert!(config_without_plugin(&settings));
    }

    fn config_without_plugin(settings: &ProviderSettings) -> bool {
        config(settings, None, &BTreeSet::new())
            .get("plugin")
            .is_none()
    }

    #[test]
    fn home_gets_key_file_and_npm_markers() {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = ProviderSettings::for_workspace(dir.path(), "opencode");
        settings.api_key = Some(logging::redact::Secret::new("sk-file"));
        let key_file = prepare_home(&settings).unwrap().unwrap();
        assert_eq!(std::fs::read_to_string(&key_file).unwrap(), "sk-file");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(global_config_dir(&settings).join("node_modules").is_dir());
        assert!(global_config_dir(&settings)
            .join("package-lock.json")
            .is_file());
        settings.api_key = None;
        assert!(prepare_home(&settings).unwrap().is_none());
        assert!(!key_file.exists());
    }
}
