//! Test support: a session DB and workspace in a temp folder, and a raw JSON-RPC client that
//! spawns the built `mcp-tools` binary and speaks newline-delimited JSON on its stdio.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use schema::{CurrentBatch, OpenOptions, Routing, RunnerStatus, SessionDb};
use serde_json::{json, Value};

/// Path of the binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_mcp-tools");

/// How long a test waits for one response.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(20);

/// A temp workspace (`agent/` inside) with a session DB.
pub(crate) struct Env {
    pub dir: tempfile::TempDir,
    pub workspace: PathBuf,
    pub db_path: PathBuf,
    pub db: SessionDb,
    pub tz: &'static str,
}

impl Env {
    pub(crate) fn new() -> Self {
        Self::with_tz("UTC")
    }

    pub(crate) fn with_tz(tz: &'static str) -> Self {
        Self::in_dir(tempfile::tempdir().unwrap(), tz)
    }

    /// The workspace in `dir` (e.g. a folder on tmpfs).
    pub(crate) fn in_dir(dir: tempfile::TempDir, tz: &'static str) -> Self {
        let workspace = dir.path().join("workspace");
        std::fs::create_dir_all(workspace.join("agent")).unwrap();
        let db_path = workspace.join("session.db");
        let db = SessionDb::open_with(
            &db_path,
            OpenOptions {
                timezone: schema::cron::parse_tz(tz).unwrap(),
                ..OpenOptions::default()
            },
        )
        .unwrap();
        Self {
            dir,
            workspace,
            db_path,
            db,
            tz,
        }
    }

    pub(crate) fn agent_dir(&self) -> PathBuf {
        self.workspace.join("agent")
    }

    /// Sets the session's default routing.
    pub(crate) fn session_routing(&self, channel: &str, platform: &str) {
        self.db
            .set_session_routing(&routing(channel, platform, None))
            .unwrap();
    }

    /// Stores a current batch as the runner would, and marks the runner busy.
    pub(crate) fn batch(&self, routing: Routing, in_reply_to: &str, sender: Option<&str>) {
        self.db
            .set_current_batch(Some(&CurrentBatch {
                routing,
                in_reply_to: Some(in_reply_to.to_owned()),
                ids: vec![in_reply_to.to_owned()],
                sender_id: sender.map(str::to_owned),
            }))
            .unwrap();
        self.db
            .set_runner_state(RunnerStatus::Busy, Some(1), Some("mock"))
            .unwrap();
    }

    pub(crate) fn runner_status(&self) -> String {
        self.db.runner_state().unwrap().unwrap().status
    }

    pub(crate) fn spawn(&self) -> Server {
        self.spawn_with(&[])
    }

    pub(crate) fn spawn_with(&self, env: &[(&str, &str)]) -> Server {
        Server::spawn(self.command(env))
    }

    /// The server command with the test environment and `env` on top.
    pub(crate) fn command(&self, env: &[(&str, &str)]) -> Command {
        let mut command = Command::new(BIN);
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("SESSION_DB", &self.db_path)
            .env("WORKSPACE_DIR", &self.workspace)
            .env("TZ", self.tz)
            .env("RUST_LOG", "warn");
        for (key, value) in env {
            command.env(key, value);
        }
        command
    }
}

pub(crate) fn routing(channel: &str, platform: &str, thread: Option<&str>) -> Routing {
    Routing {
        channel_type: Some(channel.to_owned()),
        platform_id: Some(platform.to_owned()),
        thread_id: thread.map(str::to_owned),
    }
}

/// A spawned server and a line reader on its stdout.
pub(crate) struct Server {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    pending: VecDeque<Value>,
    next_id: i64,
}

/// A `tools/call` result.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub text: String,
    pub is_error: bool,
}

impl Outcome {
    /// The text of a successful result (panics with the error text otherwise).
    pub(crate) fn ok(self) -> String {
        assert!(!self.is_error, "tool failed: {}", self.text);
        self.text
    }

    /// The text of an error result (panics on success).
    pub(crate) fn err(self) -> String {
        assert!(self.is_error, "tool unexpectedly succeeded: {}", self.text);
        self.text
    }

    /// The seq in "... (seq N)".
    pub(crate) fn seq(&self) -> i64 {
        let start = self.text.find("seq ").expect("no seq in result") + 4;
        self.text[start..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap()
    }
}

impl Server {
    pub(crate) fn spawn(command: Command) -> Self {
        Self::spawn_with_stderr(command, Stdio::inherit())
    }

    pub(crate) fn spawn_with_stderr(mut command: Command, stderr: Stdio) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn mcp-tools");
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            stdin: child.stdin.take(),
            child,
            lines,
            pending: VecDeque::new(),
            next_id: 100,
        }
    }

    /// A spawned server that already did the handshake.
    pub(crate) fn ready(mut self) -> Self {
        self.initialize();
        self
    }

    pub(crate) fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    pub(crate) fn send(&mut self, value: &Value) {
        self.send_raw(&value.to_string());
    }

    pub(crate) fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Next message from the server, within `timeout`.
    pub(crate) fn next_message(&mut self, timeout: Duration) -> Option<Value> {
        if let Some(value) = self.pending.pop_front() {
            return Some(value);
        }
        match self.lines.recv_timeout(timeout) {
            Ok(line) => Some(
                serde_json::from_str(&line)
                    .unwrap_or_else(|err| panic!("server wrote a non-JSON line ({err}): {line}")),
            ),
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => None,
        }
    }

    /// The response with `id`, keeping other messages for later.
    pub(crate) fn response(&mut self, id: &Value, timeout: Duration) -> Option<Value> {
        if let Some(pos) = self.pending.iter().position(|m| m.get("id") == Some(id)) {
            return self.pending.remove(pos);
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(_) => return None,
            };
            let value: Value = serde_json::from_str(&line)
                .unwrap_or_else(|err| panic!("server wrote a non-JSON line ({err}): {line}"));
            if value.get("id") == Some(id) {
                return Some(value);
            }
            self.pending.push_back(value);
        }
    }

    pub(crate) fn next_id(&mut self) -> i64 {
        self.next_id += 1;
        self.next_id
    }

    /// Sends a request and waits for its response.
    pub(crate) fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id();
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.response(&json!(id), TIMEOUT)
            .unwrap_or_else(|| panic!("no response to {method} within {TIMEOUT:?}"))
    }

    pub(crate) fn initialize(&mut self) -> Value {
        let response = self.request(
            "initialize",
            json!({
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "mcp-tools-tests", "version": "1"}
            }),
        );
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        response
    }

    /// Calls a tool and returns its result (panics on a JSON-RPC error).
    pub(crate) fn call(&mut self, tool: &str, arguments: Value) -> Outcome {
        let response = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        outcome(&response)
    }

    pub(crate) fn tools(&mut self) -> Vec<Value> {
        let response = self.request("tools/list", json!({}));
        response["result"]["tools"].as_array().unwrap().clone()
    }
}

/// The outcome inside a `tools/call` response.
pub(crate) fn outcome(response: &Value) -> Outcome {
    let result = response
        .get("result")
        .unwrap_or_else(|| panic!("JSON-RPC error instead of a result: {response}"));
    let text = result["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n");
    Outcome {
        text,
        is_error: result["isError"].as_bool().unwrap_or(false),
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` until it returns true or `timeout` passes.
pub(crate) fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    check()
}
