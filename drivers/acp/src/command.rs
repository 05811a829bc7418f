//! Which agent runs and how: the generic `acpCommand`, the presets (`gemini`, `qwen`), the
//! command line and environment, the MCP servers handed over at `session/new`, and the files the
//! driver keeps in the agent's private home. Everything an agent is told lives here.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::protocol::{http_server, stdio_server, MCP_SERVER};
use procs::CliCommand;
use provider::settings::{set_default_env, McpServer, ProviderSettings};

/// How an agent is told its model, its key and its base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wiring {
    /// The flag before the model name (`-m`), when the model goes on the command line.
    pub(crate) model_flag: Option<&'static str>,
    /// The variable holding the model name, when the model goes in the environment.
    pub(crate) model_env: Option<&'static str>,
    /// The variable holding the API key.
    pub(crate) key_env: Option<&'static str>,
    /// The variable holding the model API's base URL.
    pub(crate) base_url_env: Option<&'static str>,
    /// Settings written to the private home before the first start: (path under HOME, JSON),
    /// kept when the operator already wrote the file.
    pub(crate) home_files: &'static [(&'static str, &'static str)],
    /// Variables the agent needs (set unless the operator set them).
    pub(crate) defaults: &'static [(&'static str, &'static str)],
}

/// The agent a provider drives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSpec {
    /// The provider's name (`acp`, `gemini`, `qwen`): the continuation key's suffix and the
    /// private home's folder.
    pub(crate) provider: &'static str,
    /// The program as configured (`gemini`, a path).
    pub(crate) program: String,
    /// Its arguments (`--acp`).
    pub(crate) args: Vec<String>,
    /// The setting that names the program (`GEMINI_PATH`, `ACP_COMMAND`), for error messages.
    pub(crate) path_setting: &'static str,
    /// Whether `settings.cli_path` overrides the program (the presets' `GEMINI_PATH`).
    pub(crate) path_override: bool,
    pub(crate) wiring: Wiring,
}

/// Why an `acpCommand` cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("acpCommand is empty: set ACP_COMMAND to the agent's command line as a JSON array, e.g. ACP_COMMAND='[\"opencode\",\"acp\"]' (or \"acpCommand\" in config.json)")]
pub struct EmptyCommand;

impl AgentSpec {
    /// Any ACP agent: `argv` is its command line (`["opencode", "acp"]`). The driver tells it
    /// nothing beyond ACP: its model and key come from its own configuration (`cliEnv`).
    pub fn generic(argv: &[String]) -> Result<Self, EmptyCommand> {
        let (program, args) = argv.split_first().ok_or(EmptyCommand)?;
        if program.trim().is_empty() {
            return Err(EmptyCommand);
        }
        Ok(Self {
            provider: "acp",
            program: program.clone(),
            args: args.to_vec(),
            path_setting: "ACP_COMMAND",
            path_override: false,
            wiring: Wiring {
                model_flag: None,
                model_env: None,
                key_env: None,
                base_url_env: None,
                home_files: &[],
                defaults: &[],
            },
        })
    }

    /// Gemini CLI (`gemini --acp`, `GEMINI_PATH`): the Gemini API key in `GEMINI_API_KEY`, its
    /// base URL in `GOOGLE_GEMINI_BASE_URL`, the model with `-m`; API-key authentication selected
    /// in its settings and the workspace trusted (without it the folder is untrusted and the
    /// approval mode silently falls back).
    pub fn gemini() -> Self {
        Self {
            provider: "gemini",
            program: "gemini".into(),
            args: vec!["--acp".into()],
            path_setting: "GEMINI_PATH",
            path_override: true,
            wiring: Wiring {
                model_flag: Some("-m"),
                model_env: None,
                key_env: Some("GEMINI_API_KEY"),
                base_url_env: Some("GOOGLE_GEMINI_BASE_URL"),
                home_files: &[(
                    ".gemini/settings.json",
                    r#"{"security":{"auth":{"selectedType":"gemini-api-key"}}}"#,
                )],
                defaults: &[("GEMINI_CLI_TRUST_WORKSPACE", "true")],
            },
        }
    }

    /// Qwen Code (`qwen --acp`, `QWEN_PATH`): the OpenAI-compatible API (`OPENAI_API_KEY`,
    /// `OPENAI_BASE_URL`, `OPENAI_MODEL`), its managed auto-memory off (it would send model
    /// requests of its own after every turn).
    pub fn qwen() -> Self {
        Self {
            provider: "qwen",
            program: "qwen".into(),
            args: vec!["--acp".into()],
            path_setting: "QWEN_PATH",
            path_override: true,
            wiring: Wiring {
                model_flag: None,
                model_env: Some("OPENAI_MODEL"),
                key_env: Some("OPENAI_API_KEY"),
                base_url_env: Some("OPENAI_BASE_URL"),
                home_files: &[(
                    ".qwen/settings.json",
                    r#"{"security":{"auth":{"selectedType":"openai"}},"memory":{"enableManagedAutoMemory":false}}"#,
                )],
                defaults: &[],
            },
        }
    }

    /// The provider's name (`acp`, `gemini`, `qwen`).
    pub fn provider(&self) -> &'static str {
        self.provider
    }

    /// The command name `resolve_cli` looks for: the file name of the program.
    pub(crate) fn program_name(&self) -> &str {
        Path::new(&self.program)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(&self.program)
    }
}

/// Where the driver keeps its own files inside the private home.
pub(crate) fn state_dir(settings: &ProviderSettings) -> PathBuf {
    settings.home_dir.join(".nanoclaw")
}

/// The agent's command: `program args… [model flag]`, run in the agent dir with HOME the
/// private home and the allow-listed environment plus `cliEnv`.
pub(crate) fn command(
    program: &Path,
    spec: &AgentSpec,
    settings: &ProviderSettings,
    parent: impl IntoIterator<Item = (String, String)>,
) -> CliCommand {
    let mut args = spec.args.clone();
    if let (Some(flag), Some(model)) = (spec.wiring.model_flag, settings.model.as_deref()) {
        args.extend([flag.to_owned(), model.to_owned()]);
    }
    let mut env = settings.base_env(parent);
    env.insert("HOME".into(), settings.home_dir.display().to_string());
    env.insert("TZ".into(), settings.timezone.clone());
    for (name, value) in spec.wiring.defaults {
        set_default_env(&mut env, name, (*value).to_owned());
    }
    let wired = [
        (spec.wiring.model_env, settings.model.clone()),
        (
            spec.wiring.key_env,
            settings.api_key.as_ref().map(|k| k.expose().to_owned()),
        ),
        (spec.wiring.base_url_env, settings.base_url.clone()),
    ];
    for (name, value) in wired {
        if let (Some(name), Some(value)) = (name, value) {
            env.insert(name.to_owned(), value);
        }
    }
    CliCommand::new(program, &settings.agent_dir)
        .args(args)
        .envs(env)
}

/// Writes the preset's settings files into the private home, unless they exist.
pub(crate) fn prepare_home(spec: &AgentSpec, settings: &ProviderSettings) -> std::io::Result<()> {
    std::fs::create_dir_all(&settings.home_dir)?;
    std::fs::create_dir_all(state_dir(settings))?;
    for (path, content) in spec.wiring.home_files {
        let file = settings.home_dir.join(path);
        if file.exists() {
            continue;
        }
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        fsguard::write_private(&file, content.as_bytes())?;
    }
    Ok(())
}

/// The MCP servers of `session/new` and `session/load`: mcp-tools (always), the configured
/// stdio servers, and the remote ones when the agent takes HTTP servers (else left out, with
/// a warning). Returns the list and the servers' names.
pub(crate) fn mcp_servers(settings: &ProviderSettings, http: bool) -> (Vec<Value>, Vec<String>) {
    let mut servers = Vec::new();
    let mut names = Vec::new();
    let nanoclaw = McpServer {
        command: settings.mcp_tools_path.display().to_string(),
        args: Vec::new(),
        env: settings.mcp_tools_env(),
    };
    servers.push(stdio_server(MCP_SERVER, &nanoclaw));
    names.push(MCP_SERVER.to_owned());
    for (name, server) in &settings.extra_mcp_servers {
        if name == MCP_SERVER {
            tracing::warn!(server = %name, "an extra MCP server uses the reserved name; it is replaced by mcp-tools");
            continue;
        }
        servers.push(stdio_server(name, server));
        names.push(name.clone());
    }
    for (name, server) in &settings.remote_mcp_servers {
        if names.contains(name) {
            tracing::warn!(server = %name, "a remote MCP server reuses a server's name; left out");
            continue;
        }
        if !http {
            tracing::warn!(server = %name, "the agent takes no HTTP MCP servers (mcpCapabilities.http); left out");
            continue;
        }
        servers.push(http_server(name, server));
        names.push(name.clone());
    }
    (servers, names)
}

/// `session/new`'s params.
pub(crate) fn new_session_params(settings: &ProviderSettings, servers: &[Value]) -> Value {
    json!({ "cwd": settings.agent_dir.display().to_string(), "mcpServers": servers })
}

/// `session/load`'s params.
pub(crate) fn load_session_params(
    settings: &ProviderSettings,
    session_id: &str,
    servers: &[Value],
) -> Value {
    json!({
        "sessionId": session_id,
        "cwd": settings.agent_dir.display().to_string(),
        "mcpServers": servers,
    })
}

/// The instructions file recorded per session (what the session last received).
pub(crate) fn instructions_path(settings: &ProviderSettings, session_id: &str) -> PathBuf {
    state_dir(settings)
        .join("instructions")
        .join(format!("{}.txt", safe_name(session_id)))
}

/// The session's journal (the transcript archive's source).
pub(crate) fn journal_path(settings: &ProviderSettings, session_id: &str) -> PathBuf {
    state_dir(settings)
        .join("journal")
        .join(format!("{}.jsonl", safe_name(session_id)))
}

fn safe_name(session_id: &str) -> String {
    let safe: String = session_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        .take(128)
        .collect();
    if safe.is_empty() {
        "session".into()
    } else {
        safe
    }
}

/// The environment a test shows: every variable but the inherited ones.
#[cfg(test)]
pub(crate) fn shown_env(env: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    env.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use std::collections::BTreeMap;

    fn settings() -> ProviderSettings {
        let mut settings = ProviderSettings::for_workspace("/workspace", "gemini");
        settings.model = Some("gemini-test".into());
        settings.base_url = Some("http://127.0.0.1:9/gemini".into());
        settings.api_key = Some(logging::redact::Secret::new("token"));
        settings.mcp_tools_path = PathBuf::from("/usr/local/bin/mcp-tools");
        settings
    }

    #[test]
    fn presets_wire_model_key_and_url() {
        let settings = settings();
        let shown: Vec<String> = [AgentSpec::gemini(), AgentSpec::qwen()]
            .iter()
            .map(|spec| {
                let cmd = command(Path::new("/bin/agent"), spec, &settings, Vec::new());
                format!(
                    "{} {:?} {}",
                    spec.provider,
                    cmd.args,
                    shown_env(&cmd.env).join(" ")
                )
            })
            .collect();
        expect![[r#"
            gemini ["--acp", "-m", "gemini-test"] GEMINI_API_KEY=token GEMINI_CLI_TRUST_WORKSPACE=true GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:9/gemini HOME=/workspace/.home/gemini TZ=UTC
            qwen ["--acp"] HOME=/workspace/.home/gemini OPENAI_API_KEY=token OPENAI_BASE_URL=http://127.0.0.1:9/gemini OPENAI_MODEL=gemini-test TZ=UTC"#]]
        .assert_eq(&shown.join("\n"));
    }

    #[test]
    fn a_generic_agent_is_told_nothing_but_its_home() {
        let spec = AgentSpec::generic(&["opencode".into(), "acp".into()]).unwrap();
        let cmd = command(Path::new("/bin/opencode"), &spec, &settings(), Vec::new());
        assert_eq!(cmd.args, ["acp"]);
        expect!["HOME=/workspace/.home/gemini TZ=UTC"].assert_eq(&shown_env(&cmd.env).join(" "));
        assert_eq!(AgentSpec::generic(&[]), Err(EmptyCommand));
        assert_eq!(AgentSpec::generic(&[" ".into()]), Err(EmptyCommand));
    }

    #[test]
    fn mcp_servers_for_session_new() {
        let mut settings = settings();
        settings.extra_mcp_servers.insert(
            "github".into(),
            McpServer {
                command: "gh-mcp".into(),
                args: vec!["--stdio".into()],
                env: BTreeMap::from([("GH_TOKEN".into(), "t".into())]),
            },
        );
        settings.remote_mcp_servers.insert(
            "tracker".into(),
            provider::RemoteMcpServer {
                url: "http://127.0.0.1:7/mcp".into(),
                headers: BTreeMap::from([("X-Session".into(), "s".into())]),
            },
        );
        let (with_http, names) = mcp_servers(&settings, true);
        let (without_http, _) = mcp_servers(&settings, false);
        assert_eq!(names, ["nanoclaw", "github", "tracker"]);
        assert_eq!(
            without_http.len(),
            2,
            "no HTTP servers without the capability"
        );
        let mut shown = serde_json::to_string_pretty(&with_http).unwrap();
        shown = shown.replace(&settings.session_db.display().to_string(), "<db>");
        expect![[r#"
            [
              {
                "args": [],
                "command": "/usr/local/bin/mcp-tools",
                "env": [
                  {
                    "name": "NANOCLAW_MAX_QUESTION_TIMEOUT",
                    "value": "300"
                  },
                  {
                    "name": "SESSION_DB",
                    "value": "<db>"
                  },
                  {
                    "name": "TZ",
                    "value": "UTC"
                  },
                  {
                    "name": "WORKSPACE_DIR",
                    "value": "/workspace"
                  }
                ],
                "name": "nanoclaw"
              },
              {
                "args": [
                  "--stdio"
                ],
                "command": "gh-mcp",
                "env": [
                  {
                    "name": "GH_TOKEN",
                    "value": "t"
                  }
                ],
                "name": "github"
              },
              {
                "headers": [
                  {
                    "name": "X-Session",
                    "value": "s"
                  }
                ],
                "name": "tracker",
                "type": "http",
                "url": "http://127.0.0.1:7/mcp"
              }
            ]"#]]
        .assert_eq(&shown);
    }
}
