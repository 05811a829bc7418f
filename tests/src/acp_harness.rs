//! The ACP agents (Gemini CLI, Qwen Code) against the fake model, without the runner: how each is
//! configured to run offline (environment, settings file, flags: docs/contract/acp-agents.md) and
//! a small Agent Client Protocol client (JSON-RPC 2.0, one message a line over stdio) that drives
//! `gemini --acp` / `qwen --acp` the way a host does.
//!
//! ```text
//! let sandbox = AgentSandbox::new(AcpAgent::Gemini, &model, false);
//! let mut client = AcpClient::spawn(sandbox.acp_command(&bin), "gemini acp");
//! let init = client.call("initialize", json!({"protocolVersion": 1}), WAIT, |_| Reply::Refuse);
//! ```
//!
//! The client answers the agent's own requests (`session/request_permission`, Qwen's
//! `craft/drainMidTurnQueue`) with a caller-supplied policy, and records every message it reads,
//! so a test asserts on the notifications (`session/update`) of a prompt.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::fake_model::{FakeModel, MCP_SERVER};
use crate::harness::{FAKE_KEY, FAKE_MODEL};

/// An ACP agent CLI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcpAgent {
    /// Gemini CLI (`@google/gemini-cli`): the Gemini API.
    Gemini,
    /// Qwen Code (`@qwen-code/qwen-code`): OpenAI Chat Completions.
    Qwen,
}

impl AcpAgent {
    /// The binary name in `.cli/node_modules/.bin`.
    pub fn name(self) -> &'static str {
        match self {
            AcpAgent::Gemini => "gemini",
            AcpAgent::Qwen => "qwen",
        }
    }

    /// The variable that overrides the binary's path (as `CLAUDE_PATH` does for Claude).
    pub fn path_var(self) -> &'static str {
        match self {
            AcpAgent::Gemini => "GEMINI_PATH",
            AcpAgent::Qwen => "QWEN_PATH",
        }
    }

    /// The pinned binary (see [`crate::harness::cli`]), or `None` when CLI tests are skipped.
    pub fn cli(self) -> Option<PathBuf> {
        crate::harness::cli(self.name(), self.path_var())
    }

    /// The agent's settings folder under HOME.
    fn settings_dir(self) -> &'static str {
        match self {
            AcpAgent::Gemini => ".gemini",
            AcpAgent::Qwen => ".qwen",
        }
    }

    /// `$HOME/<dir>/settings.json` for an offline, unattended run:
    /// - Gemini: the API-key auth method (without it a non-interactive run exits 41 "Invalid
    ///   auth method selected."), no usage statistics, no update checks.
    /// - Qwen: no managed auto-memory and no follow-up suggestions (each is a model request
    ///   after every turn that offers the whole tool list), no usage statistics.
    ///
    /// `mcp` adds MCP servers in the settings' own form (the `-p` mode has no other way; over
    /// ACP they come with `session/new`).
    pub fn settings(self, mcp: Option<&McpServer>) -> Value {
        let mut settings = match self {
            AcpAgent::Gemini => json!({
                "security": {"auth": {"selectedType": "gemini-api-key"}},
                "privacy": {"usageStatisticsEnabled": false},
                "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
            }),
            AcpAgent::Qwen => json!({
                "memory": {"enableManagedAutoMemory": false},
                "ui": {"enableFollowupSuggestions": false},
                "privacy": {"usageStatisticsEnabled": false},
            }),
        };
        if let Some(server) = mcp {
            settings["mcpServers"] = json!({
                server.name.clone(): {"command": server.command, "args": server.args}
            });
        }
        settings
    }

    /// The environment (on top of a cleared one) that points the agent at `model`.
    pub fn env(self, model: &FakeModel) -> Vec<(&'static str, String)> {
        match self {
            AcpAgent::Gemini => vec![
                ("GOOGLE_GEMINI_BASE_URL", model.url()),
                ("GEMINI_API_KEY", FAKE_KEY.to_owned()),
                // Without it `--yolo` is silently the default approval mode: the folder is
                // not trusted.
                ("GEMINI_CLI_TRUST_WORKSPACE", "true".to_owned()),
            ],
            AcpAgent::Qwen => vec![
                ("OPENAI_BASE_URL", model.openai_base_url()),
                ("OPENAI_API_KEY", FAKE_KEY.to_owned()),
                ("OPENAI_MODEL", FAKE_MODEL.to_owned()),
                ("QWEN_CODE_SUPPRESS_YOLO_WARNING", "1".to_owned()),
            ],
        }
    }

    /// The flags that start an ACP session: Gemini takes the model on the command line; Qwen
    /// starts in its `auto` mode (an LLM classifier request before tool calls) unless told
    /// `default` (every non-read-only tool asks the client).
    pub fn acp_args(self) -> Vec<&'static str> {
        match self {
            AcpAgent::Gemini => vec!["--acp", "-m", FAKE_MODEL],
            AcpAgent::Qwen => vec!["--acp", "--approval-mode", "default"],
        }
    }

    /// The flags of a one-shot `-p` run with JSON output, every tool allowed.
    pub fn prompt_args(self, prompt: &str) -> Vec<String> {
        let mut args: Vec<String> = match self {
            AcpAgent::Gemini => vec!["-m".into(), FAKE_MODEL.into()],
            AcpAgent::Qwen => Vec::new(),
        };
        args.extend(["-p".into(), prompt.into(), "--yolo".into()]);
        args.extend(["-o".into(), "json".into()]);
        args
    }
}

/// A stdio MCP server as both agents take it.
#[derive(Clone, Debug)]
pub struct McpServer {
    /// The server's name (the agents prefix its tools with it).
    pub name: String,
    /// The program.
    pub command: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

impl McpServer {
    /// mcp-tools as the `nanoclaw` server on `db` (a session DB it creates) and `workspace`.
    pub fn mcp_tools(db: &Path, workspace: &Path) -> McpServer {
        McpServer {
            name: MCP_SERVER.to_owned(),
            command: crate::harness::mcp_tools(),
            args: vec![
                "--db".into(),
                db.display().to_string(),
                "--workspace".into(),
                workspace.display().to_string(),
            ],
        }
    }

    /// The ACP form (`session/new`'s `mcpServers` entry).
    pub fn acp(&self) -> Value {
        json!({"name": self.name, "command": self.command, "args": self.args, "env": []})
    }
}

/// A private HOME and work folder for one agent run, with the agent's settings written.
pub struct AgentSandbox {
    _dir: tempfile::TempDir,
    /// The agent.
    pub agent: AcpAgent,
    /// The agent's HOME.
    pub home: PathBuf,
    /// The working folder (the ACP session's `cwd`).
    pub work: PathBuf,
    /// A session DB for mcp-tools.
    pub db: PathBuf,
    /// The agent's TMPDIR (Gemini CLI writes its error reports there, `/tmp` by default).
    pub tmp: PathBuf,
    env: Vec<(&'static str, String)>,
}

impl AgentSandbox {
    /// A sandbox for `agent` against `model`; `settings_mcp` puts mcp-tools (on this sandbox's
    /// DB) in the settings file too.
    pub fn new(agent: AcpAgent, model: &FakeModel, settings_mcp: bool) -> AgentSandbox {
        let dir = match tempfile::Builder::new().prefix("nanoclaw-acp-").tempdir() {
            Ok(dir) => dir,
            Err(err) => panic!("temp dir: {err}"),
        };
        let home = dir.path().join("home");
        let work = dir.path().join("work");
        let db = dir.path().join("session.db");
        let tmp = dir.path().join("tmp");
        let settings_dir = home.join(agent.settings_dir());
        for d in [&settings_dir, &work, &tmp] {
            if let Err(err) = std::fs::create_dir_all(d) {
                panic!("{}: {err}", d.display());
            }
        }
        let mcp = settings_mcp.then(|| McpServer::mcp_tools(&db, &work));
        let settings = agent.settings(mcp.as_ref());
        if let Err(err) = std::fs::write(settings_dir.join("settings.json"), settings.to_string()) {
            panic!("settings.json: {err}");
        }
        AgentSandbox {
            _dir: dir,
            agent,
            home,
            work,
            db,
            tmp,
            env: agent.env(model),
        }
    }

    /// mcp-tools on this sandbox's DB and work folder.
    pub fn mcp_tools(&self) -> McpServer {
        McpServer::mcp_tools(&self.db, &self.work)
    }

    /// `bin` with a cleared environment (PATH, the private HOME and TMPDIR, the agent's
    /// variables) in the work folder.
    pub fn command(&self, bin: &Path) -> Command {
        let mut cmd = Command::new(bin);
        cmd.env_clear()
            .current_dir(&self.work)
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.home)
            .env("TMPDIR", &self.tmp)
            .env("LANG", "C.UTF-8")
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())));
        cmd
    }

    /// `bin --acp …`.
    pub fn acp_command(&self, bin: &Path) -> Command {
        let mut cmd = self.command(bin);
        cmd.args(self.agent.acp_args());
        cmd
    }
}

/// What the client answers a request from the agent with.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A JSON-RPC result.
    Result(Value),
    /// A JSON-RPC error "method not found" (what a client says to an extension it does not
    /// know).
    Refuse,
}

impl Reply {
    /// The answer to a `session/request_permission` that picks the first option of `kind`
    /// (`allow_once`, `reject_once`, …), or cancels when there is none.
    pub fn pick(request: &Value, kind: &str) -> Reply {
        let option = request
            .pointer("/params/options")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|o| o.get("kind").and_then(Value::as_str) == Some(kind))
            .and_then(|o| o.get("optionId").cloned());
        Reply::Result(match option {
            Some(id) => json!({"outcome": {"outcome": "selected", "optionId": id}}),
            None => json!({"outcome": {"outcome": "cancelled"}}),
        })
    }
}

/// A running ACP agent and the messages read from it.
pub struct AcpClient {
    child: Child,
    /// `None` once closed ([`AcpClient::close`]).
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_id: u64,
    /// Every message read from the agent (responses, requests, notifications), in order.
    pub received: Vec<Value>,
    /// Lines that were not JSON (the protocol allows none).
    pub garbage: Vec<String>,
    label: String,
    stderr: PathBuf,
}

impl AcpClient {
    /// Spawns `cmd` in its own process group with piped stdin/stdout; stderr goes to a file
    /// beside the temp dir (shown by [`AcpClient::stderr`]).
    pub fn spawn(mut cmd: Command, label: &str) -> AcpClient {
        use std::os::unix::process::CommandExt;
        let stderr = std::env::temp_dir().join(format!(
            "nanoclaw-acp-{}-{}.stderr",
            std::process::id(),
            label.replace(' ', "-")
        ));
        let err_file = match std::fs::File::create(&stderr) {
            Ok(f) => f,
            Err(err) => panic!("{}: {err}", stderr.display()),
        };
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err_file)
            .process_group(0);
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(err) => panic!("spawn {label}: {err}"),
        };
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            panic!("{label}: no pipes");
        };
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        AcpClient {
            child,
            stdin: Some(stdin),
            lines,
            next_id: 0,
            received: Vec::new(),
            garbage: Vec::new(),
            label: label.to_owned(),
            stderr,
        }
    }

    /// What the agent wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn write(&mut self, message: &Value) {
        let line = format!("{message}\n");
        let Some(stdin) = self.stdin.as_mut() else {
            panic!("{}: stdin is closed", self.label);
        };
        if let Err(err) = stdin
            .write_all(line.as_bytes())
            .and_then(|()| stdin.flush())
        {
            panic!(
                "{}: writing to the agent: {err}\n{}",
                self.label,
                self.stderr()
            );
        }
    }

    /// Sends a request; its id.
    pub fn send_request(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    /// Sends a notification.
    pub fn notify(&mut self, method: &str, params: Value) {
        self.write(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Reads messages until the response to `id`, answering the agent's requests with
    /// `answer`; panics after `timeout` (with what was read). Returns the whole response
    /// (`result` or `error`).
    pub fn wait_response(
        &mut self,
        id: u64,
        timeout: Duration,
        mut answer: impl FnMut(&Value) -> Reply,
    ) -> Value {
        let start = Instant::now();
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => panic!(
                    "{}: no response to request {id} within {timeout:?}; read:\n{}\nstderr:\n{}",
                    self.label,
                    self.transcript(),
                    self.stderr()
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "{}: the agent closed stdout before answering request {id}; read:\n{}\n\
                     stderr:\n{}",
                    self.label,
                    self.transcript(),
                    self.stderr()
                ),
            };
            let Ok(message) = serde_json::from_str::<Value>(&line) else {
                self.garbage.push(line);
                continue;
            };
            self.received.push(message.clone());
            let method = message.get("method").and_then(Value::as_str);
            match (method, message.get("id")) {
                (Some(_), Some(request_id)) => {
                    let reply = match answer(&message) {
                        Reply::Result(result) => {
                            json!({"jsonrpc": "2.0", "id": request_id, "result": result})
                        }
                        Reply::Refuse => json!({"jsonrpc": "2.0", "id": request_id,
                            "error": {"code": -32601, "message": "method not found"}}),
                    };
                    self.write(&reply);
                }
                (None, Some(got)) if got.as_u64() == Some(id) => return message,
                _ => {}
            }
        }
    }

    /// [`AcpClient::send_request`] then [`AcpClient::wait_response`]; the `result`, or a panic
    /// with the error.
    pub fn call(
        &mut self,
        method: &str,
        params: Value,
        timeout: Duration,
        answer: impl FnMut(&Value) -> Reply,
    ) -> Value {
        let id = self.send_request(method, params);
        let response = self.wait_response(id, timeout, answer);
        match response.get("result") {
            Some(result) => result.clone(),
            None => panic!("{}: {method} failed: {response}", self.label),
        }
    }

    /// The `session/update` payloads read so far (`params.update`), from index `from` of
    /// [`AcpClient::received`].
    pub fn updates_since(&self, from: usize) -> Vec<Value> {
        self.received[from.min(self.received.len())..]
            .iter()
            .filter(|m| m.get("method").and_then(Value::as_str) == Some("session/update"))
            .filter_map(|m| m.pointer("/params/update").cloned())
            .collect()
    }

    /// The text of the `agent_message_chunk` updates from index `from`, joined.
    pub fn reply_text_since(&self, from: usize) -> String {
        self.updates_since(from)
            .iter()
            .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
            .filter_map(|u| u.pointer("/content/text").and_then(Value::as_str))
            .collect()
    }

    /// The agent's requests (those with a `method` and an `id`) named `method`, from `from`.
    pub fn requests_since(&self, from: usize, method: &str) -> Vec<Value> {
        self.received[from.min(self.received.len())..]
            .iter()
            .filter(|m| {
                m.get("method").and_then(Value::as_str) == Some(method) && m.get("id").is_some()
            })
            .cloned()
            .collect()
    }

    /// One line per message read (cut to 300 characters), for failure output.
    pub fn transcript(&self) -> String {
        self.received
            .iter()
            .map(|m| {
                let s = m.to_string();
                let cut: String = s.chars().take(300).collect();
                format!("  <- {cut}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Ends the agent as a host that shuts down does: stdin closed, up to `grace` to exit, then
    /// the process group killed. Its exit status, if it exited by itself.
    pub fn close(mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        drop(self.stdin.take());
        let start = Instant::now();
        while start.elapsed() < grace {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The agent's process id (its process group's too).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for AcpClient {
    /// Kills the agent's whole process group (its shell commands and MCP servers too).
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr);
    }
}
