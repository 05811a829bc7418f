//! End-to-end harness: a session workspace laid out like the container's, the real
//! `agent-runner` binary driving a real CLI against the fake model server, the real `mcp-tools`
//! and the host CLI `nanoclaw`, all on loopback (inside a loopback-only network namespace when
//! the machine allows it).
//!
//! ```text
//! #[test]
//! fn chat_reply() {
//!     if !e2e::harness::run_in_loopback_netns("chat_reply") { return; }
//!     let Some(cli) = e2e::harness::cli("claude", "CLAUDE_PATH") else { return };
//!     let model = FakeModel::start_with_script([Step::text("hi")]).unwrap();
//!     let mut session = Session::new();
//!     session.start_runner("claude", &model, &[]);
//!     let id = session.send_chat("hello").id;
//!     let reply = session.wait_reply(&id, Duration::from_secs(60));
//! }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use schema::{Inserted, MessageIn, MessageOut, NewMessageIn, Routing, SessionDb};
use serde_json::{json, Value};

use crate::fake_model::{FakeModel, LoggedRequest};

/// The model name every provider is pointed at (unknown to the CLIs on purpose:
/// docs/contract/providers.md#codex).
pub const FAKE_MODEL: &str = "fake-model";
/// The API key given to every CLI.
pub const FAKE_KEY: &str = "sk-fake-e2e";

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The cargo target dir: `$CARGO_TARGET_DIR` or `<repo>/target`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

/// A binary of this workspace (`agent-runner`, `mcp-tools`, `nanoclaw`), from the target dir the
/// tests were built into. `cargo build --workspace --bins` must have run (scripts/test.sh does).
pub fn bin(name: &str) -> PathBuf {
    let path = target_dir().join("debug").join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}

/// The mcp-tools binary: `$MCP_TOOLS_PATH`, or `<target>/debug/mcp-tools`, built once
/// (`cargo build -p mcp-tools`) when it is missing.
pub fn mcp_tools() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(path) = std::env::var_os("MCP_TOOLS_PATH") {
            return PathBuf::from(path);
        }
        let path = target_dir().join("debug/mcp-tools");
        if !path.exists() {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let status = match Command::new(cargo)
                .args(["build", "-p", "mcp-tools"])
                .current_dir(repo_root())
                .status()
            {
                Ok(status) => status,
                Err(err) => panic!("cannot run cargo build -p mcp-tools: {err}"),
            };
            assert!(status.success(), "cargo build -p mcp-tools failed");
        }
        assert!(path.exists(), "mcp-tools not found at {}", path.display());
        path
    })
    .clone()
}

/// Each CLI provider and the variable naming its binary (the ACP agents' presets `gemini` and
/// `qwen` too: issue 44).
pub const CLI_ENV_VARS: [(&str, &str); 5] = [
    ("claude", "CLAUDE_PATH"),
    ("codex", "CODEX_PATH"),
    ("opencode", "OPENCODE_PATH"),
    ("gemini", "GEMINI_PATH"),
    ("qwen", "QWEN_PATH"),
];

/// The variable naming the CLI binary of `provider` (`CLAUDE_PATH`, …). Panics for a provider
/// without a CLI.
pub fn cli_env_var(provider: &str) -> &'static str {
    match CLI_ENV_VARS.iter().find(|(name, _)| *name == provider) {
        Some((_, var)) => var,
        None => panic!("no CLI known for provider {provider}: add it to CLI_ENV_VARS"),
    }
}

/// [`cli`] for a provider: `provider_cli("codex")` = `cli("codex", "CODEX_PATH")`.
pub fn provider_cli(provider: &str) -> Option<PathBuf> {
    cli(provider, cli_env_var(provider))
}

/// The start of a test that drives `provider`'s real CLI through the runner: false when CLI
/// tests are skipped, or when the test `test` (its exact name) was re-run inside a loopback-only
/// namespace (see [`run_in_loopback_netns`]); true = run the body here.
pub fn start_cli_test(provider: &str, test: &str) -> bool {
    provider_cli(provider).is_some() && run_in_loopback_netns(test)
}

/// The pinned CLI `name` (from `env_var` or `.cli/node_modules/.bin`), or `None` when
/// `NANOCLAW_SKIP_CLI_TESTS=1`. Panics with a clear message when it is missing.
pub fn cli(name: &str, env_var: &str) -> Option<PathBuf> {
    if std::env::var("NANOCLAW_SKIP_CLI_TESTS").as_deref() == Ok("1") {
        eprintln!("NANOCLAW_SKIP_CLI_TESTS=1: skipping the {name} CLI test");
        return None;
    }
    let path = std::env::var_os(env_var)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cli/node_modules/.bin").join(name));
    assert!(
        path.exists(),
        "the {name} CLI is missing at {}: run scripts/install-clis.sh (or set {env_var}; \
         NANOCLAW_SKIP_CLI_TESTS=1 skips these tests)",
        path.display()
    );
    Some(path)
}

/// A command prefix that runs its argument in a fresh loopback-only network namespace
/// (`unshare -n`, else `unshare -rn`), or `None` when neither works here.
pub fn netns_prefix() -> Option<&'static [&'static str]> {
    static PREFIX: OnceLock<Option<&'static [&'static str]>> = OnceLock::new();
    *PREFIX.get_or_init(|| {
        const CANDIDATES: [&[&str]; 2] = [&["unshare", "-n"], &["unshare", "-rn"]];
        CANDIDATES.into_iter().find(|p| {
            Command::new(p[0])
                .args(&p[1..])
                .args(["sh", "-c", "ip link set lo up"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    })
}

/// True when the caller should run the test body in this process (already inside the
/// namespace, or none can be made). Otherwise re-runs the test `test` (its exact name) of the
/// current test binary inside a fresh loopback-only network namespace, asserts it passed there,
/// and returns false.
pub fn run_in_loopback_netns(test: &str) -> bool {
    let test = &qualified_test_name(test);
    if std::env::var_os("NANOCLAW_IN_NETNS").is_some() {
        eprintln!("[{test}] running inside a loopback-only network namespace");
        return true;
    }
    if std::env::var("NANOCLAW_NETNS").as_deref() == Ok("0") {
        eprintln!("[{test}] NANOCLAW_NETNS=0: running without a network namespace");
        return true;
    }
    let Some(prefix) = netns_prefix() else {
        eprintln!(
            "[{test}] no network namespace available: running with the traffic-off settings only"
        );
        return true;
    };
    let Ok(exe) = std::env::current_exe() else {
        return true;
    };
    let started = Instant::now();
    let out = rerun_exact(
        test,
        &exe,
        Some(prefix),
        &[("NANOCLAW_IN_NETNS", "1")],
        "inside the namespace",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "----- {test} inside `{}` ({:.1?}) -----\n{stdout}{stderr}",
        prefix.join(" "),
        started.elapsed()
    );
    assert!(
        out.status.success(),
        "{test} failed inside the loopback-only namespace"
    );
    assert!(
        ran_exactly(&stdout, test),
        "{test} did not run inside the namespace"
    );
    false
}

/// The full libtest name of the running test `test` (its bare function name): its module path
/// too (`e2e_mock::mock_session_through_the_harness`), which `--exact` needs now that a crate's
/// test files are modules of one binary (issue 42). libtest runs each test on a thread named
/// after its full name; `test` itself when the thread says otherwise.
pub fn qualified_test_name(test: &str) -> String {
    match std::thread::current().name() {
        Some(name) if name == test || name.ends_with(&format!("::{test}")) => name.to_owned(),
        _ => test.to_owned(),
    }
}

/// Runs the test `test` (exact name, alone, `--nocapture`) of the test binary `exe` with `env`,
/// under `prefix` (a loopback-only namespace, see [`netns_prefix`]) when given; its output.
pub fn rerun_exact(
    test: &str,
    exe: &Path,
    prefix: Option<&[&str]>,
    env: &[(&str, &str)],
    where_: &str,
) -> Output {
    let mut cmd = match prefix {
        Some(prefix) => {
            let mut cmd = Command::new(prefix[0]);
            cmd.args(&prefix[1..])
                .args(["sh", "-c", "ip link set lo up && exec \"$@\"", "sh"])
                .arg(exe);
            cmd
        }
        None => Command::new(exe),
    };
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    match cmd.output() {
        Ok(out) => out,
        Err(err) => panic!("cannot re-run {test} {where_}: {err}"),
    }
}

/// True when the libtest output `stdout` shows that `test`, and only it, ran and passed.
pub fn ran_exactly(stdout: &str, test: &str) -> bool {
    stdout.contains(&format!("test {test} ... ok")) && stdout.contains("1 passed")
}

/// The routing every test message carries.
pub fn test_routing() -> Routing {
    Routing {
        channel_type: Some("slack".into()),
        platform_id: Some("C-e2e".into()),
        thread_id: Some("T-1".into()),
    }
}

/// A session workspace, its DB, and (once started) the runner process.
pub struct Session {
    _dir: tempfile::TempDir,
    /// The workspace root (like the container's /workspace).
    pub workspace: PathBuf,
    /// The session DB.
    pub db: SessionDb,
    runner: Option<Child>,
    starts: usize,
}

impl Default for Session {
    fn default() -> Self {
        Self::new()
    }
}

impl Session {
    /// Creates the workspace tree (agent/, global/, extra/, downloads/, outbox/) and the DB.
    pub fn new() -> Self {
        let dir = match tempfile::Builder::new().prefix("nanoclaw-e2e-").tempdir() {
            Ok(dir) => dir,
            Err(err) => panic!("temp dir: {err}"),
        };
        let workspace = dir.path().to_path_buf();
        for sub in [
            "agent/conversations",
            "global",
            "extra",
            "downloads",
            "outbox",
        ] {
            if let Err(err) = std::fs::create_dir_all(workspace.join(sub)) {
                panic!("creating {sub}: {err}");
            }
        }
        let db = match SessionDb::open(workspace.join("session.db")) {
            Ok(db) => db,
            Err(err) => panic!("session DB: {err}"),
        };
        if let Err(err) = db.set_session_routing(&test_routing()) {
            panic!("session routing: {err}");
        }
        Self {
            _dir: dir,
            workspace,
            db,
            runner: None,
            starts: 0,
        }
    }

    /// The environment the runner gets for `provider` against `model`.
    pub fn runner_env(&self, provider: &str, model: &FakeModel) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        for (name, value) in std::env::vars() {
            if ["PATH", "LANG", "TMPDIR", "USER", "LOGNAME"].contains(&name.as_str()) {
                env.insert(name, value);
            }
        }
        let mut set = |k: &str, v: String| {
            env.insert(k.to_owned(), v);
        };
        set(
            "HOME",
            self.workspace.join(".host-home").display().to_string(),
        );
        set("AGENT_PROVIDER", provider.to_owned());
        set("RUST_LOG", "info".into());
        set("TZ", "UTC".into());
        set("ANTHROPIC_BASE_URL", model.url());
        set("ANTHROPIC_API_KEY", FAKE_KEY.into());
        set("OPENAI_BASE_URL", model.openai_base_url());
        set("OPENAI_API_KEY", FAKE_KEY.into());
        set("CLAUDE_MODEL", FAKE_MODEL.into());
        set("CODEX_MODEL", FAKE_MODEL.into());
        set("OPENCODE_MODEL", FAKE_MODEL.into());
        // The ACP agents (issue 44): their model variables, and Gemini CLI's own endpoint and
        // key variables (it speaks the Gemini API: e2e::acp_harness::AcpAgent::env).
        set("GEMINI_MODEL", FAKE_MODEL.into());
        set("QWEN_MODEL", FAKE_MODEL.into());
        set("GOOGLE_GEMINI_BASE_URL", model.url());
        set("GEMINI_API_KEY", FAKE_KEY.into());
        set("MCP_TOOLS_PATH", mcp_tools().display().to_string());
        set("NANOCLAW_CLI_MAX_RETRIES", "1".into());
        // OpenCode's background plugin install honours this; keep it on loopback.
        set("NPM_CONFIG_REGISTRY", format!("{}/npm/", model.url()));
        for (name, var) in CLI_ENV_VARS {
            if let Some(path) = std::env::var_os(var) {
                set(var, PathBuf::from(path).display().to_string());
            } else {
                let local = repo_root().join(".cli/node_modules/.bin").join(name);
                if local.exists() {
                    set(var, local.display().to_string());
                }
            }
        }
        env
    }

    /// Starts `agent-runner --workspace <ws> --provider <provider>` against `model`, with
    /// `extra_env` on top; its log goes to `<ws>/runner-<n>.log`. Waits until it reports idle.
    pub fn start_runner(&mut self, provider: &str, model: &FakeModel, extra_env: &[(&str, &str)]) {
        assert!(self.runner.is_none(), "a runner is already running");
        let log_path = self.workspace.join(format!("runner-{}.log", self.starts));
        self.starts += 1;
        let log = match std::fs::File::create(&log_path) {
            Ok(log) => log,
            Err(err) => panic!("runner log: {err}"),
        };
        let mut cmd = Command::new(bin("agent-runner"));
        cmd.arg("--workspace")
            .arg(&self.workspace)
            .arg("--provider")
            .arg(provider);
        cmd.env_clear().envs(self.runner_env(provider, model));
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        let child = match cmd.spawn() {
            Ok(child) => child,
            Err(err) => panic!("spawning agent-runner: {err}"),
        };
        let pid = child.id();
        self.runner = Some(child);
        self.wait_until("the runner to start", Duration::from_secs(20), |s| {
            s.db.runner_state()
                .ok()
                .flatten()
                .is_some_and(|r| r.pid == Some(i64::from(pid)) && r.status != "starting")
        });
    }

    /// The runner's pid, if running.
    pub fn runner_pid(&self) -> Option<u32> {
        self.runner.as_ref().map(Child::id)
    }

    /// SIGKILLs the runner (a crash).
    pub fn kill_runner(&mut self) {
        if let Some(mut child) = self.runner.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERMs the runner and waits for it (a graceful stop); SIGKILL after 10 s.
    pub fn stop_runner(&mut self) {
        let _ = self.stop_runner_timed();
    }

    /// [`Session::stop_runner`], returning how long the runner took to exit after the SIGTERM
    /// and its exit status (`None` when it had to be killed after 10 s, or was not running).
    pub fn stop_runner_timed(&mut self) -> Option<(Duration, std::process::ExitStatus)> {
        let mut child = self.runner.take()?;
        let started = Instant::now();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = started + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some((started.elapsed(), status));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Every runner log so far, concatenated.
    pub fn runner_log(&self) -> String {
        (0..self.starts)
            .filter_map(|n| {
                std::fs::read_to_string(self.workspace.join(format!("runner-{n}.log"))).ok()
            })
            .collect::<Vec<_>>()
            .join("\n----- restart -----\n")
    }

    /// Inserts a chat message from "Ann" with the test routing.
    pub fn send_chat(&self, text: &str) -> Inserted {
        let mut row = NewMessageIn::new(
            "chat",
            json!({"sender": "Ann", "senderId": "u-ann", "text": text}).to_string(),
        );
        row.routing = test_routing();
        self.insert(row)
    }

    /// Inserts any row.
    pub fn insert(&self, row: NewMessageIn) -> Inserted {
        match self.db.insert_in(&row) {
            Ok(inserted) => inserted,
            Err(err) => panic!("insert: {err}"),
        }
    }

    /// A `messages_in` row.
    pub fn row(&self, id: &str) -> MessageIn {
        match self.db.message_in(id) {
            Ok(Some(row)) => row,
            other => panic!("row {id}: {other:?}"),
        }
    }

    /// Every `messages_out` row.
    pub fn outs(&self) -> Vec<MessageOut> {
        self.db.all_messages_out().unwrap_or_default()
    }

    /// The first runner log line that `matches`, waited for up to `timeout`: the runner writes
    /// its log from a thread of its own, so a line can trail the DB writes that followed it.
    pub fn wait_log_line(
        &self,
        what: &str,
        timeout: Duration,
        matches: impl Fn(&str) -> bool,
    ) -> String {
        let mut found = None;
        self.wait_until(what, timeout, |s| {
            found = s
                .runner_log()
                .lines()
                .find(|l| matches(l))
                .map(str::to_owned);
            found.is_some()
        });
        found.unwrap_or_default()
    }

    /// Waits for `cond`, panicking with the runner log on timeout.
    pub fn wait_until(&self, what: &str, timeout: Duration, mut cond: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + timeout;
        while !cond(self) {
            if Instant::now() >= deadline {
                panic!(
                    "timed out after {timeout:?} waiting for {what}\n--- runner log ---\n{}",
                    self.runner_log()
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Waits until the row `id` is completed.
    pub fn wait_completed(&self, id: &str, timeout: Duration) {
        self.wait_until(&format!("message {id} completed"), timeout, |s| {
            s.row(id).status == "completed"
        });
    }

    /// Waits for the first chat reply to `id` and returns it.
    pub fn wait_reply(&self, id: &str, timeout: Duration) -> MessageOut {
        self.wait_until(&format!("a reply to {id}"), timeout, |s| {
            s.db.replies_to(id)
                .unwrap_or_default()
                .iter()
                .any(|o| o.kind == "chat")
        });
        match self
            .db
            .replies_to(id)
            .unwrap_or_default()
            .into_iter()
            .find(|o| o.kind == "chat")
        {
            Some(reply) => reply,
            None => panic!("reply vanished"),
        }
    }

    /// Waits for the question row mcp-tools writes for `ask_user_question`; returns its
    /// content (`questionId`, `question`, …).
    pub fn wait_question(&self, timeout: Duration) -> Value {
        self.wait_until("the question row", timeout, |s| {
            s.outs()
                .iter()
                .any(|o| content(o).get("questionId").is_some())
        });
        match self
            .outs()
            .iter()
            .map(content)
            .find(|c| c.get("questionId").is_some())
        {
            Some(question) => question,
            None => panic!("the question row vanished"),
        }
    }

    /// Writes `config` as the session's config.json, atomically (a running runner reads it
    /// again: it must never see half a file).
    pub fn write_config(&self, config: &Value) {
        let tmp = self.workspace.join("config.json.tmp");
        if let Err(err) = std::fs::write(&tmp, config.to_string()) {
            panic!("writing config.json: {err}");
        }
        if let Err(err) = std::fs::rename(&tmp, self.workspace.join("config.json")) {
            panic!("replacing config.json: {err}");
        }
    }

    /// Answers the question `question_id` with `option` through the host CLI (`nanoclaw answer`),
    /// as a user would; panics when the CLI fails.
    pub fn answer_question(&self, question_id: &str, option: &str) {
        let out = self.nanoclaw(&["answer", "--question", question_id, "--option", option]);
        assert!(
            out.status.success(),
            "nanoclaw answer: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs the host CLI `nanoclaw` against this session's DB.
    pub fn nanoclaw(&self, args: &[&str]) -> Output {
        match Command::new(bin("nanoclaw"))
            .args(args)
            .env("SESSION_DB", self.workspace.join("session.db"))
            .output()
        {
            Ok(out) => out,
            Err(err) => panic!("nanoclaw: {err}"),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stop_runner();
    }
}

/// The `text` of a chat `messages_out` row.
pub fn text_of(row: &MessageOut) -> String {
    serde_json::from_str::<Value>(&row.content)
        .ok()
        .and_then(|v| v.get("text").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default()
}

/// The JSON content of a `messages_out` row (`Null` when it is not JSON).
pub fn content(row: &MessageOut) -> Value {
    serde_json::from_str(&row.content).unwrap_or(Value::Null)
}

/// The session's chat `messages_out` rows, in order.
pub fn chat_outs(session: &Session) -> Vec<MessageOut> {
    session
        .outs()
        .into_iter()
        .filter(|o| o.kind == "chat")
        .collect()
}

/// The contents of the session's `system` rows whose `action` is `action` (`query_error`, …).
pub fn system_actions(session: &Session, action: &str) -> Vec<Value> {
    session
        .outs()
        .iter()
        .filter(|o| o.kind == "system")
        .map(content)
        .filter(|c| c.get("action").and_then(Value::as_str) == Some(action))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// What the model was sent
// ---------------------------------------------------------------------------------------------

/// Prints one summary line per request the fake model got.
pub fn print_requests(model: &FakeModel) {
    for r in model.requests() {
        eprintln!("    {}", r.summary());
    }
}

/// Our texts in a request Claude sent: every text block of a user message, except Claude's own
/// `<system-reminder>` blocks (which it puts into the first user message).
pub fn claude_user_texts(request: &LoggedRequest) -> Vec<String> {
    let mut texts = Vec::new();
    for message in request.body["messages"].as_array().into_iter().flatten() {
        if message["role"] != "user" {
            continue;
        }
        match &message["content"] {
            Value::String(text) => texts.push(text.clone()),
            Value::Array(blocks) => texts.extend(
                blocks
                    .iter()
                    .filter(|b| b["type"] == "text")
                    .filter_map(|b| b["text"].as_str().map(str::to_owned)),
            ),
            _ => {}
        }
    }
    texts
        .into_iter()
        .filter(|t| !t.starts_with("<system-reminder>"))
        .collect()
}

/// Our texts in a request Codex sent: [`LoggedRequest::user_texts`] without Codex's own
/// `<environment_context>` message.
pub fn codex_user_texts(request: &LoggedRequest) -> Vec<String> {
    request
        .user_texts()
        .into_iter()
        .filter(|t| !t.starts_with("<environment_context>"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------

/// Live (non-zombie) processes: (pid, ppid, pgid, command line with spaces for NULs).
pub fn live_processes() -> Vec<(u32, u32, u32, String)> {
    let entries = match std::fs::read_dir("/proc") {
        Ok(entries) => entries,
        Err(err) => panic!("reading /proc: {err}"),
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the ")" of the command name: state ppid pgrp ...
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() == Some(&"Z") {
            continue;
        }
        let field = |i: usize| fields.get(i).and_then(|f| f.parse().ok()).unwrap_or(0);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        out.push((pid, field(1), field(2), cmdline));
    }
    out
}

/// The live descendants of `root` (pid and command line).
pub fn descendants(root: u32) -> Vec<(u32, String)> {
    let all = live_processes();
    let mut found: Vec<(u32, String)> = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for (pid, ppid, _, cmd) in &all {
            if *ppid == parent && *pid != root && !found.iter().any(|(p, _)| p == pid) {
                found.push((*pid, cmd.clone()));
                frontier.push(*pid);
            }
        }
    }
    found
}

/// The pids of the live descendants of `root` whose command line contains `needle`.
pub fn descendants_matching(root: u32, needle: &str) -> Vec<u32> {
    descendants(root)
        .into_iter()
        .filter(|(_, cmd)| cmd.contains(needle))
        .map(|(pid, _)| pid)
        .collect()
}

/// True while `pid` is a live (non-zombie) process.
pub fn alive(pid: u32) -> bool {
    live_processes().iter().any(|(p, ..)| *p == pid)
}

/// Live processes whose command line contains `needle`.
pub fn processes_with(needle: &str) -> Vec<(u32, String)> {
    live_processes()
        .into_iter()
        .filter(|(_, _, _, cmd)| cmd.contains(needle))
        .map(|(pid, _, _, cmd)| (pid, cmd))
        .collect()
}

/// Live processes whose environment has the entry `entry` (`NAME=value`).
pub fn processes_with_env(entry: &str) -> Vec<u32> {
    live_processes()
        .into_iter()
        .map(|(pid, ..)| pid)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .unwrap_or_default()
                .split(|b| *b == 0)
                .any(|e| e == entry.as_bytes())
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Transcript archives
// ---------------------------------------------------------------------------------------------

/// The `.md` files in `dir` (e.g. `<workspace>/agent/conversations`), sorted by name.
pub fn archives(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "md"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Every archive's text in `dir`, concatenated in name order.
pub fn archives_text(dir: &Path) -> String {
    archives(dir)
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Today's date in `tz` as `YYYY-MM-DD`, from `date` (the e2e crate has no time-zone library).
pub fn today_in(tz: &str) -> String {
    match Command::new("date").arg("+%Y-%m-%d").env("TZ", tz).output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        Err(err) => panic!("running date: {err}"),
    }
}
