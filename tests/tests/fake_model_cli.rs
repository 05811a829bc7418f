//! The fake model server against the REAL pinned CLIs (Claude Code, Codex, OpenCode).
//!
//! The CLIs are looked up at `<repo>/.cli/node_modules/.bin/<name>` (install them with
//! `scripts/install-clis.sh`), or at `$CLAUDE_PATH` / `$CODEX_PATH` / `$OPENCODE_PATH`. A missing
//! CLI FAILS the test; set `NANOCLAW_SKIP_CLI_TESTS=1` to skip these tests instead.
//!
//! Isolation: each CLI gets a private HOME (and CODEX_HOME) in a temp dir, a cleared environment
//! with the traffic-off variables of docs/contract/providers.md, and its npm registry pointed at
//! the fake server (OpenCode's background plugin lookup then shows up as a 404 in the log instead
//! of leaving the machine). When `unshare -n` (or `unshare -rn`) works, each test re-executes
//! itself inside a loopback-only network namespace, so the fake server and the CLI share the
//! namespace and nothing can leave the machine. `NANOCLAW_NETNS=0` disables that.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use e2e::fake_model::{Api, FakeModel, ReplyKind, Step, SAMPLE_USAGE};
use e2e::harness::print_requests as print_log;
use e2e::harness::{cli, run_in_loopback_netns, FAKE_KEY};
use serde_json::{json, Value};

const KEY: &str = FAKE_KEY;
/// A safety net against a hung CLI, not a speed check: OpenCode's cold start alone took over 30 s
/// on a loaded 2-core machine (three runs start side by side).
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const MARKER_CMD: &str = "echo fake-tool-$((40+2))";
const MARKER: &str = "fake-tool-42";

// ---------------------------------------------------------------------------------------------
// Harness (CLI lookup and netns re-exec: e2e::harness)
// ---------------------------------------------------------------------------------------------

struct Sandbox {
    _dir: tempfile::TempDir,
    root: PathBuf,
    home: PathBuf,
    work: PathBuf,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempfile::Builder::new()
            .prefix("nanoclaw-e2e-")
            .tempdir()
            .unwrap();
        let root = dir.path().to_path_buf();
        let home = root.join("home");
        let work = root.join("work");
        std::fs::create_dir_all(home.join(".codex")).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        Sandbox {
            _dir: dir,
            root,
            home,
            work,
        }
    }

    /// The CLI with a cleared environment: PATH, a private HOME, and the npm registry pointed at
    /// the fake server.
    fn command(&self, bin: &Path, server: &FakeModel) -> Command {
        let mut cmd = Command::new(bin);
        cmd.env_clear()
            .current_dir(&self.work)
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.home)
            .env("LANG", "C.UTF-8")
            // OpenCode's background plugin install honours this (BUN_CONFIG_REGISTRY is ignored).
            .env("NPM_CONFIG_REGISTRY", format!("{}/npm/", server.url()));
        cmd
    }
}

struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

impl Run {
    /// Stdout lines that parse as JSON objects.
    fn json_lines(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(Value::is_object)
            .collect()
    }

    fn dump(&self) -> String {
        format!(
            "status: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Run the CLI in its own process group with `stdin` (or /dev/null); kill the group on
/// timeout and after exit (members may outlive the leader).
fn run(sandbox: &Sandbox, mut cmd: Command, stdin: Option<&str>, label: &str) -> Run {
    use std::os::unix::process::CommandExt;
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let out_path = sandbox.root.join(format!("run{n}.stdout"));
    let err_path = sandbox.root.join(format!("run{n}.stderr"));
    let stdin = match stdin {
        Some(text) => {
            let p = sandbox.root.join(format!("run{n}.stdin"));
            std::fs::write(&p, text).unwrap();
            Stdio::from(File::open(p).unwrap())
        }
        None => Stdio::null(),
    };
    cmd.stdin(stdin)
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap())
        .process_group(0);
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {label}: {e}"));
    let pgid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > RUN_TIMEOUT {
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            let status = child.wait().unwrap();
            panic!(
                "{label} timed out after {RUN_TIMEOUT:?} ({status:?})\nstdout:\n{}\nstderr:\n{}",
                std::fs::read_to_string(&out_path).unwrap_or_default(),
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let elapsed = start.elapsed();
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
    let run = Run {
        status,
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        elapsed,
    };
    eprintln!(
        "[{label}] exit {:?} in {:.2?}",
        run.status.code(),
        run.elapsed
    );
    run
}

// ---------------------------------------------------------------------------------------------
// Claude Code
// ---------------------------------------------------------------------------------------------

fn claude_cmd(sandbox: &Sandbox, bin: &Path, server: &FakeModel, prompt: &str) -> Command {
    let mut cmd = sandbox.command(bin, server);
    cmd.env("ANTHROPIC_BASE_URL", server.url())
        .env("ANTHROPIC_API_KEY", KEY)
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .env("IS_SANDBOX", "1")
        .env("ENABLE_TOOL_SEARCH", "false")
        .env("CLAUDE_CODE_MAX_RETRIES", "0")
        // The prompt right after -p: several options are variadic
        // (docs/contract/providers.md#claude-code).
        .args(["-p", prompt, "--output-format", "json"])
        .args(["--strict-mcp-config", "--setting-sources", ""]);
    cmd
}

/// The `result` object printed by `claude -p --output-format json`.
fn claude_result(run: &Run) -> Value {
    run.json_lines()
        .into_iter()
        .rfind(|v| v["type"] == "result")
        .unwrap_or_else(|| panic!("no result object\n{}", run.dump()))
}

#[test]
fn claude_one_shot_against_fake_model() {
    let Some(bin) = cli("claude", "CLAUDE_PATH") else {
        return;
    };
    if !run_in_loopback_netns("claude_one_shot_against_fake_model") {
        return;
    }
    let total = Instant::now();

    // 1. Text, streamed in chunks.
    {
        let sandbox = Sandbox::new();
        let server = FakeModel::start_with_script([Step::text("hello from the fake model")
            .chunks(3)
            .delay_ms(10)
            .usage(SAMPLE_USAGE)])
        .unwrap();
        let mut cmd = claude_cmd(&sandbox, &bin, &server, "say hi");
        cmd.args(["--tools", ""]);
        let run = run(&sandbox, cmd, None, "claude text");
        print_log(&server);
        let result = claude_result(&run);
        assert!(run.status.success(), "{}", run.dump());
        assert_eq!(result["is_error"], false, "{}", run.dump());
        assert_eq!(result["result"], "hello from the fake model");
        // The scripted usage, read from Anthropic's message_start and message_delta.
        let usage = &result["usage"];
        assert_eq!(usage["input_tokens"], 1200, "{usage}");
        assert_eq!(usage["cache_creation_input_tokens"], 50, "{usage}");
        assert_eq!(usage["cache_read_input_tokens"], 300, "{usage}");
        assert_eq!(usage["output_tokens"], 80, "{usage}");
        assert!(result["total_cost_usd"].as_f64().is_some_and(|c| c > 0.0));
        let reqs = server.requests();
        assert_eq!(reqs.len(), 1, "exactly one model request");
        let r = &reqs[0];
        assert_eq!(r.api, Some(Api::Anthropic));
        assert_eq!(r.path, "/v1/messages");
        assert_eq!(r.query.as_deref(), Some("beta=true"));
        assert_eq!(r.header("x-api-key"), Some(KEY));
        assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
        assert!(r
            .header("user-agent")
            .unwrap_or("")
            .starts_with("claude-cli/"));
        assert!(r.is_stream());
        assert_eq!(r.last_user_text().as_deref(), Some("say hi"));
        assert!(!r.system_text().is_empty());
        assert_eq!(r.reply, ReplyKind::Step(0));
    }

    // 2. A builtin tool (Bash), then the final text from the default reply.
    {
        let sandbox = Sandbox::new();
        let server = FakeModel::start_with_script([Step::raw_tool_call(
            "Bash",
            json!({"command": MARKER_CMD}),
        )])
        .unwrap();
        server.set_default_text("done");
        let mut cmd = claude_cmd(&sandbox, &bin, &server, "run the command");
        cmd.args(["--tools", "Bash", "--permission-mode", "bypassPermissions"]);
        let run = run(&sandbox, cmd, None, "claude Bash tool");
        print_log(&server);
        let result = claude_result(&run);
        assert!(run.status.success(), "{}", run.dump());
        assert_eq!(result["result"], "done", "{}", run.dump());
        assert_eq!(result["num_turns"], 2);
        let reqs = server.model_requests();
        assert_eq!(reqs.len(), 2);
        assert!(reqs[0].tool_names().contains(&"Bash".to_string()));
        assert!(reqs[1].tail_is_tool_result());
        assert!(
            reqs[1].tool_results().iter().any(|t| t.contains(MARKER)),
            "tool result: {:?}",
            reqs[1].tool_results()
        );
    }

    // 3. 401 with retries off: one request, an error result, rc 1.
    {
        let sandbox = Sandbox::new();
        let server = FakeModel::start_with_script([Step::error(401, "fake 401 error")]).unwrap();
        let mut cmd = claude_cmd(&sandbox, &bin, &server, "say hi");
        cmd.args(["--tools", ""]);
        let run = run(&sandbox, cmd, None, "claude 401");
        print_log(&server);
        let result = claude_result(&run);
        assert_eq!(run.status.code(), Some(1), "{}", run.dump());
        assert_eq!(result["is_error"], true);
        assert_eq!(result["api_error_status"], 401);
        let text = result["result"].as_str().unwrap_or("");
        assert!(text.contains("fake 401 error"), "{text}");
        assert_eq!(server.requests().len(), 1);
    }
    eprintln!("claude total: {:.2?}", total.elapsed());
}

// ---------------------------------------------------------------------------------------------
// Codex
// ---------------------------------------------------------------------------------------------

fn codex_cmd(
    sandbox: &Sandbox,
    bin: &Path,
    server: &FakeModel,
    (request_retries, stream_retries): (u32, u32),
    prompt: &str,
) -> Command {
    let mut cmd = sandbox.command(bin, server);
    let provider = format!(
        "model_providers.fake={{name=\"Fake\", base_url=\"{}\", wire_api=\"responses\", \
         env_key=\"FAKE_LLM_API_KEY\", request_max_retries={request_retries}, stream_max_retries={stream_retries}}}",
        server.openai_base_url()
    );
    let overrides: [OsString; 9] = [
        "model_provider=\"fake\"".into(),
        "model=\"fake-model\"".into(),
        provider.into(),
        "approval_policy=\"never\"".into(),
        "sandbox_mode=\"danger-full-access\"".into(),
        "features.plugins=false".into(),
        "analytics.enabled=false".into(),
        "check_for_update_on_startup=false".into(),
        "history.persistence=\"none\"".into(),
    ];
    cmd.env("CODEX_HOME", sandbox.home.join(".codex"))
        .env("FAKE_LLM_API_KEY", KEY)
        .args(["exec", "--json", "--skip-git-repo-check"]);
    for o in overrides {
        cmd.arg("-c").arg(o);
    }
    cmd.arg(prompt);
    cmd
}

fn codex_agent_text(run: &Run) -> Option<String> {
    run.json_lines()
        .into_iter()
        .filter(|e| e["type"] == "item.completed" && e["item"]["type"] == "agent_message")
        .filter_map(|e| e["item"]["text"].as_str().map(str::to_string))
        .next_back()
}

#[test]
fn codex_exec_against_fake_model() {
    let Some(bin) = cli("codex", "CODEX_PATH") else {
        return;
    };
    if !run_in_loopback_netns("codex_exec_against_fake_model") {
        return;
    }
    let total = Instant::now();

    // 1. Text.
    {
        let sandbox = Sandbox::new();
        let server = FakeModel::start_with_script([Step::text("hello from the fake model")
            .chunks(3)
            .delay_ms(10)
            .usage(SAMPLE_USAGE)])
        .unwrap();
        let cmd = codex_cmd(&sandbox, &bin, &server, (0, 0), "say hi");
        let run = run(&sandbox, cmd, None, "codex text");
        print_log(&server);
        assert!(run.status.success(), "{}", run.dump());
        assert_eq!(
            codex_agent_text(&run).as_deref(),
            Some("hello from the fake model"),
            "{}",
            run.dump()
        );
        let completed = run
            .json_lines()
            .into_iter()
            .find(|e| e["type"] == "turn.completed")
            .unwrap_or_else(|| panic!("no turn.completed\n{}", run.dump()));
        // The scripted usage from response.completed, in Codex's terms (input with the cached
        // tokens, as OpenAI counts; no cache writes in the Responses API: Codex says 0).
        assert_eq!(
            completed["usage"],
            json!({"input_tokens":1500,"cached_input_tokens":300,"cache_write_input_tokens":0,
                   "output_tokens":80,"reasoning_output_tokens":20}),
            "{}",
            run.dump()
        );
        let reqs = server.requests();
        assert_eq!(reqs.len(), 1, "exactly one model request");
        let r = &reqs[0];
        assert_eq!(r.api, Some(Api::Responses));
        assert_eq!(r.path, "/v1/responses");
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {KEY}").as_str())
        );
        assert_eq!(r.header("originator"), Some("codex_exec"));
        assert!(r.is_stream());
        assert_eq!(r.model(), Some("fake-model"));
        assert_eq!(r.last_user_text().as_deref(), Some("say hi"));
        assert!(r.system_text().contains("Codex"), "developer prompt");
        assert!(r.tool_names().contains(&"exec_command".to_string()));
        assert!(server.unknown_requests().is_empty());
    }

    // 2. A builtin tool (exec_command, no namespace), then the default text.
    {
        let sandbox = Sandbox::new();
        let server = FakeModel::start_with_script([Step::raw_tool_call(
            "exec_command",
            json!({"cmd": MARKER_CMD}),
        )])
        .unwrap();
        server.set_default_text("done");
        let cmd = codex_cmd(&sandbox, &bin, &server, (0, 0), "run the command");
        let run = run(&sandbox, cmd, None, "codex exec_command tool");
        print_log(&server);
        assert!(run.status.success(), "{}", run.dump());
        assert_eq!(
            codex_agent_text(&run).as_deref(),
            Some("done"),
            "{}",
            run.dump()
        );
        let reqs = server.model_requests();
        assert_eq!(reqs.len(), 2);
        assert!(reqs[1].tail_is_tool_result());
        assert!(
            reqs[1].tool_results().iter().any(|t| t.contains(MARKER)),
            "tool result: {:?}",
            reqs[1].tool_results()
        );
    }

    // 3a. 429 with retry-after: 1, then text. Codex retries a 429 with retry-after under
    // stream_max_retries (request_max_retries does not apply; without retry-after there is no
    // retry at all).
    {
        let sandbox = Sandbox::new();
        let server = FakeModel::start_with_script([
            Step::error(429, "fake 429 error").retry_after_secs(1),
            Step::text("recovered"),
        ])
        .unwrap();
        let cmd = codex_cmd(&sandbox, &bin, &server, (0, 1), "say hi");
        let run = run(&sandbox, cmd, None, "codex 429 then ok");
        print_log(&server);
        assert!(run.status.success(), "{}", run.dump());
        assert_eq!(
            codex_agent_text(&run).as_deref(),
            Some("recovered"),
            "{}",
            run.dump()
        );
        let reqs = server.requests();
        assert_eq!(reqs.len(), 2);
        let gap = reqs[1].since_start - reqs[0].since_start;
        assert!(
            gap >= Duration::from_millis(900),
            "retry-after honoured: {gap:?}"
        );
    }

    // 3b. 401 with retries off: turn.failed, rc 1.
    {
        let sandbox = Sandbox::new();
        let server = FakeModel::start_with_script([Step::error(401, "fake 401 error")]).unwrap();
        let cmd = codex_cmd(&sandbox, &bin, &server, (0, 0), "say hi");
        let run = run(&sandbox, cmd, None, "codex 401");
        print_log(&server);
        assert_eq!(run.status.code(), Some(1), "{}", run.dump());
        let failed = run
            .json_lines()
            .into_iter()
            .find(|e| e["type"] == "turn.failed")
            .unwrap_or_else(|| panic!("no turn.failed\n{}", run.dump()));
        let msg = failed["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains("401"), "{msg}");
        assert_eq!(server.requests().len(), 1);
    }
    eprintln!("codex total: {:.2?}", total.elapsed());
}

// ---------------------------------------------------------------------------------------------
// OpenCode
// ---------------------------------------------------------------------------------------------

fn opencode_cmd(sandbox: &Sandbox, bin: &Path, server: &FakeModel) -> Command {
    let config = json!({
        "model": "fake/fake-model",
        "small_model": "fake/fake-model",
        "autoupdate": false,
        "share": "disabled",
        "provider": {"fake": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Fake LLM",
            "options": {"baseURL": server.openai_base_url(), "apiKey": KEY},
            "models": {"fake-model": {"name": "Fake Model", "tool_call": true}}}},
        "permission": {"*": "allow"}
    });
    let mut cmd = sandbox.command(bin, server);
    cmd.env("OPENCODE_CONFIG_CONTENT", config.to_string())
        .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
        .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
        .args(["run", "--format", "json"]);
    cmd
}

fn opencode_text(run: &Run) -> String {
    run.json_lines()
        .iter()
        .filter(|e| e["type"] == "text")
        .filter_map(|e| e["part"]["text"].as_str())
        .collect()
}

/// OpenCode's only non-model request is the background plugin lookup on the (redirected) npm
/// registry.
fn assert_only_registry_404s(server: &FakeModel) {
    for r in server.unknown_requests() {
        assert!(
            r.path.starts_with("/npm/"),
            "unexpected request {}",
            r.summary()
        );
    }
}

#[test]
fn opencode_run_against_fake_model() {
    let Some(bin) = cli("opencode", "OPENCODE_PATH") else {
        return;
    };
    if !run_in_loopback_netns("opencode_run_against_fake_model") {
        return;
    }
    let total = Instant::now();
    // `opencode run` costs about 3 s of startup each, so the three runs go in parallel (each has
    // its own sandbox and server); a panic in any of them fails the test.
    std::thread::scope(|scope| {
        scope.spawn(|| opencode_text_phase(&bin));
        scope.spawn(|| opencode_error_retry_and_tool_phase(&bin));
        scope.spawn(|| opencode_401_phase(&bin));
    });
    eprintln!("opencode total: {:.2?}", total.elapsed());
}

/// Text; the title request consumes no step.
fn opencode_text_phase(bin: &Path) {
    let sandbox = Sandbox::new();
    let server = FakeModel::start_with_script([Step::text("hello from the fake model")
        .chunks(3)
        .delay_ms(10)
        .usage(SAMPLE_USAGE)])
    .unwrap();
    let cmd = opencode_cmd(&sandbox, bin, &server);
    let run = run(&sandbox, cmd, Some("say hi"), "opencode text");
    print_log(&server);
    assert!(run.status.success(), "{}", run.dump());
    assert_eq!(
        opencode_text(&run),
        "hello from the fake model",
        "{}",
        run.dump()
    );
    // The scripted usage from the final usage chunk (OpenCode asks for it with
    // stream_options.include_usage), in OpenCode's terms: input without the cache reads,
    // output without the reasoning; cost 0 without prices in the model config.
    let finish = run
        .json_lines()
        .into_iter()
        .find(|e| e["type"] == "step_finish")
        .unwrap_or_else(|| panic!("no step_finish\n{}", run.dump()));
    assert_eq!(
        finish["part"]["tokens"],
        json!({"input":1200,"output":60,"reasoning":20,"cache":{"read":300,"write":0},
               "total":1580}),
        "{}",
        run.dump()
    );
    assert_eq!(finish["part"]["cost"], 0);
    let model = server.model_requests();
    assert_eq!(model.len(), 1, "one model request besides the title");
    let r = &model[0];
    assert_eq!(r.api, Some(Api::Chat));
    assert_eq!(r.path, "/v1/chat/completions");
    assert_eq!(
        r.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert!(r
        .header("user-agent")
        .unwrap_or("")
        .starts_with("opencode/"));
    assert!(r.is_stream());
    assert_eq!(
        r.body["stream_options"]["include_usage"], true,
        "OpenCode asks for the usage chunk"
    );
    assert_eq!(r.last_user_text().as_deref(), Some("say hi"));
    assert!(r.system_text().contains("opencode"));
    assert!(r.tool_names().contains(&"bash".to_string()));
    let titles = server
        .requests()
        .into_iter()
        .filter(|r| r.reply == ReplyKind::Title)
        .count();
    assert!(titles <= 1);
    assert_only_registry_404s(&server);
}

/// 500 with `retry-after-ms: 3000` is retried after that delay (longer than OpenCode's default
/// first backoff of 2 s ± 25%, so a lower bound proves the header was read even on a loaded
/// machine; use a small value such as 50 in tests that only need speed). The retry gets a
/// builtin tool call
/// (bash); the request carrying its result gets the default text.
fn opencode_error_retry_and_tool_phase(bin: &Path) {
    let sandbox = Sandbox::new();
    let server = FakeModel::start_with_script([
        Step::error(500, "fake 500 error").retry_after_ms(3000),
        Step::raw_tool_call(
            "bash",
            json!({"command": MARKER_CMD, "description": "Print a marker"}),
        ),
    ])
    .unwrap();
    server.set_default_text("done");
    let cmd = opencode_cmd(&sandbox, bin, &server);
    let run = run(
        &sandbox,
        cmd,
        Some("run the command"),
        "opencode 500, bash tool",
    );
    print_log(&server);
    assert!(run.status.success(), "{}", run.dump());
    let tool = run
        .json_lines()
        .into_iter()
        .find(|e| e["type"] == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use event\n{}", run.dump()));
    assert_eq!(tool["part"]["tool"], "bash");
    assert_eq!(tool["part"]["state"]["status"], "completed");
    assert!(tool["part"]["state"]["output"]
        .as_str()
        .unwrap_or("")
        .contains(MARKER));
    assert_eq!(opencode_text(&run), "done", "{}", run.dump());
    let model = server.model_requests();
    assert_eq!(model.len(), 3, "500, its retry (tool call), the final text");
    let gap = model[1].since_start - model[0].since_start;
    assert!(
        gap >= Duration::from_millis(2900),
        "retry-after-ms honoured (the default backoff is at most 2.5 s): {gap:?}"
    );
    assert!(!model[1].tail_is_tool_result());
    assert!(model[2].tail_is_tool_result());
    assert!(model[2].tool_results().iter().any(|t| t.contains(MARKER)));
    assert_only_registry_404s(&server);
}

/// 401: not retryable; an APIError event with our message; rc 1.
fn opencode_401_phase(bin: &Path) {
    let sandbox = Sandbox::new();
    let server = FakeModel::start_with_script([Step::error(401, "fake 401 error")]).unwrap();
    let cmd = opencode_cmd(&sandbox, bin, &server);
    let run = run(&sandbox, cmd, Some("say hi"), "opencode 401");
    print_log(&server);
    assert_eq!(run.status.code(), Some(1), "{}", run.dump());
    let err = run
        .json_lines()
        .into_iter()
        .find(|e| e["type"] == "error")
        .unwrap_or_else(|| panic!("no error event\n{}", run.dump()));
    assert_eq!(err["error"]["name"], "APIError");
    assert_eq!(err["error"]["data"]["statusCode"], 401);
    assert_eq!(err["error"]["data"]["message"], "fake 401 error");
    assert_eq!(server.model_requests().len(), 1);
}

// ---------------------------------------------------------------------------------------------
// The fake-model binary
// ---------------------------------------------------------------------------------------------

/// The binary reads usage and known models in its JSON/flag form, answers in each API's shape,
/// and prints the model each request named.
#[tokio::test]
async fn fake_model_binary_scripts_usage_and_refuses_unknown_models() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("steps.json");
    std::fs::write(
        &script,
        r#"[{"kind":"text","text":"scripted","usage":{"input":1200,"output":80,"cache_read":300,"cache_write":50,"reasoning":20}}]"#,
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fake-model"))
        .arg("--script")
        .arg(&script)
        .args([
            "--known-models",
            "m, m2",
            "--default-usage",
            r#"{"input":3,"output":2}"#,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let next_line = || rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let url = next_line();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let post = |path: &str, body: Value| {
        client
            .post(format!("{url}{path}"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let tools = json!([{"type":"function","name":"exec_command","parameters":{}}]);
    let text = post(
        "/v1/responses",
        json!({"model":"m","stream":true,"tools":tools,
               "input":[{"type":"message","role":"user","content":"x"}]}),
    )
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    let completed: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|d| d["type"] == "response.completed")
        .unwrap_or_else(|| panic!("no response.completed in {text}"));
    assert_eq!(
        completed["response"]["usage"],
        json!({"input_tokens":1500,"input_tokens_details":{"cached_tokens":300},
               "output_tokens":80,"output_tokens_details":{"reasoning_tokens":20},
               "total_tokens":1580})
    );
    let resp = post(
        "/v1/messages",
        json!({"model":"other","stream":true,"messages":[{"role":"user","content":"x"}]}),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), 404);
    let body: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"type":"error","error":{"type":"not_found_error","message":"model: other"}})
    );
    // The script is used up: the default usage from the flag.
    let body = json!({"model":"m2","stream":false,"messages":[{"role":"user","content":"x"}],
                      "tools":[{"type":"function","function":{"name":"bash"}}]});
    let body: Value = serde_json::from_str(
        &post("/v1/chat/completions", body)
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(body["usage"]["prompt_tokens"], 3);
    assert_eq!(body["usage"]["completion_tokens"], 2);
    let lines: Vec<String> = (0..3).map(|_| next_line()).collect();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        lines[0].contains(r#"model="m""#) && lines[0].contains("step 0"),
        "{lines:?}"
    );
    assert!(
        lines[1].contains(r#"model="other""#) && lines[1].contains(r#"404 unknown model "other""#),
        "{lines:?}"
    );
    assert!(
        lines[2].contains(r#"model="m2""#) && lines[2].contains("default text"),
        "{lines:?}"
    );
}
