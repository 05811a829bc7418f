//! The ACP agents, Gemini CLI and Qwen Code, against the fake model, offline (issue 44): each in
//! its one-shot `-p` mode and over the Agent Client Protocol (`--acp`) with a small client
//! (`e2e::acp_harness`), without the runner. What they do is recorded in
//! docs/contract/acp-agents.md; these tests are its proof.
//!
//! Each run gets a private HOME with the agent's settings file, a cleared environment pointing it
//! at the fake model, and runs inside a loopback-only network namespace when the machine allows
//! it (as `fake_model_cli.rs`). The CLIs come from `.cli/` (`scripts/install-clis.sh gemini
//! qwen`) or `$GEMINI_PATH` / `$QWEN_PATH`; a missing one fails the test unless
//! `NANOCLAW_SKIP_CLI_TESTS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use e2e::acp_harness::{AcpAgent, AcpClient, AgentSandbox, Reply};
use e2e::fake_model::{Api, FakeModel, LoggedRequest, Step, SAMPLE_USAGE};
use e2e::harness::{print_requests, run_in_loopback_netns, FAKE_KEY};
use serde_json::{json, Value};

/// A safety net against a hung agent, not a speed check (a cold start is 3 to 6 s here).
const WAIT: Duration = Duration::from_secs(120);
/// A command that writes (so Qwen Code does not take it for read-only and asks for it too) and
/// prints a marker that is not in its own text; no `$(…)`, which Gemini CLI refuses as command
/// substitution.
const MARKER_CMD: &str = "printf 'fake-tool-%d' 42 | tee marker.txt";
const MARKER: &str = "fake-tool-42";

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Run {
    fn dump(&self) -> String {
        format!(
            "status: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }

    /// The JSON document on stdout (Gemini: an object; Qwen: an array of events).
    fn json(&self) -> Value {
        let start = self.stdout.find(['{', '[']).unwrap_or(0);
        serde_json::from_str(&self.stdout[start..])
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e})\n{}", self.dump()))
    }
}

/// Runs `cmd` in its own process group; kills the group on timeout and after exit.
fn run(sandbox: &AgentSandbox, mut cmd: Command, label: &str) -> Run {
    use std::os::unix::process::CommandExt;
    let out = sandbox
        .home
        .join(format!("{}.stdout", label.replace(' ', "-")));
    let err = sandbox
        .home
        .join(format!("{}.stderr", label.replace(' ', "-")));
    cmd.stdin(Stdio::null())
        .stdout(File::create(&out).unwrap())
        .stderr(File::create(&err).unwrap())
        .process_group(0);
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {label}: {e}"));
    let pgid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > WAIT {
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            panic!(
                "{label} timed out after {WAIT:?}\n{}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
    eprintln!(
        "[{label}] exit {:?} in {:.2?}",
        status.code(),
        start.elapsed()
    );
    Run {
        status,
        stdout: std::fs::read_to_string(&out).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err).unwrap_or_default(),
    }
}

/// The texts of the `messages_out` rows mcp-tools wrote to the sandbox's session DB.
fn sent_texts(sandbox: &AgentSandbox) -> Vec<String> {
    let db = schema::SessionDb::open(&sandbox.db).unwrap();
    db.all_messages_out()
        .unwrap()
        .iter()
        .filter_map(|m| {
            serde_json::from_str::<Value>(&m.content)
                .ok()?
                .get("text")?
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

/// The shell call each agent's model makes (both have Gemini CLI's `run_shell_command`).
fn shell_step(agent: AcpAgent) -> Step {
    let mut args = json!({"command": MARKER_CMD, "description": "Print a marker"});
    if agent == AcpAgent::Qwen {
        args["is_background"] = json!(false);
    }
    Step::raw_tool_call("run_shell_command", args)
}

/// The call of mcp-tools' `send_message`: a Gemini function call named
/// `mcp_nanoclaw_send_message`; for Qwen its `tool_call` tool (MCP tools are deferred).
fn send_message_step(agent: AcpAgent, text: &str) -> Step {
    let args = json!({"text": text});
    match agent {
        AcpAgent::Gemini => Step::tool_call("send_message", args),
        AcpAgent::Qwen => Step::qwen_mcp_call("send_message", args),
    }
}

/// The model requests that carry a tool result with `needle`.
fn results_with(requests: &[LoggedRequest], needle: &str) -> usize {
    requests
        .iter()
        .filter(|r| r.tool_results().iter().any(|t| t.contains(needle)))
        .count()
}

// ---------------------------------------------------------------------------------------------
// One-shot `-p`
// ---------------------------------------------------------------------------------------------

#[test]
fn gemini_prompt_mode_against_fake_model() {
    let agent = AcpAgent::Gemini;
    let Some(bin) = agent.cli() else { return };
    if !run_in_loopback_netns("gemini_prompt_mode_against_fake_model") {
        return;
    }
    // 1. Text, streamed in chunks, with the scripted usage.
    {
        let model = FakeModel::start_with_script([Step::text("hello from the fake model")
            .chunks(3)
            .delay_ms(10)
            .usage(SAMPLE_USAGE)])
        .unwrap();
        let sandbox = AgentSandbox::new(agent, &model, false);
        let mut cmd = sandbox.command(&bin);
        cmd.args(agent.prompt_args("say hi"));
        let run = run(&sandbox, cmd, "gemini text");
        print_requests(&model);
        assert!(run.status.success(), "{}", run.dump());
        let out = run.json();
        assert_eq!(
            out["response"],
            "hello from the fake model",
            "{}",
            run.dump()
        );
        // Google's figures: the prompt with the cached tokens, candidates without thoughts.
        let tokens = &out["stats"]["models"]["fake-model"]["tokens"];
        assert_eq!(tokens["prompt"], 1500, "{tokens}");
        assert_eq!(tokens["cached"], 300, "{tokens}");
        assert_eq!(tokens["candidates"], 60, "{tokens}");
        assert_eq!(tokens["thoughts"], 20, "{tokens}");
        assert_eq!(tokens["total"], 1580, "{tokens}");
        let requests = model.model_requests();
        assert_eq!(requests.len(), 1, "one model request");
        let r = &requests[0];
        assert_eq!(r.api, Some(Api::Gemini));
        assert_eq!(r.path, "/v1beta/models/fake-model:streamGenerateContent");
        assert_eq!(r.query.as_deref(), Some("alt=sse"));
        assert_eq!(r.header("x-goog-api-key"), Some(FAKE_KEY));
        assert!(r
            .header("user-agent")
            .unwrap_or("")
            .starts_with("GeminiCLI"));
        assert!(r.system_text().contains("Gemini CLI"));
        assert!(r.last_user_text().unwrap_or_default().ends_with("say hi"));
        assert!(model.unknown_requests().is_empty());
    }
    // 2. A shell command and an MCP tool (mcp-tools from the settings file), then the text.
    {
        let model = FakeModel::start_with_script([
            shell_step(agent),
            send_message_step(agent, "hi from gemini"),
        ])
        .unwrap();
        model.set_default_text("done");
        let sandbox = AgentSandbox::new(agent, &model, true);
        let mut cmd = sandbox.command(&bin);
        cmd.args(agent.prompt_args("run the command"));
        let run = run(&sandbox, cmd, "gemini tools");
        print_requests(&model);
        assert!(run.status.success(), "{}", run.dump());
        assert_eq!(run.json()["response"], "done", "{}", run.dump());
        let requests = model.model_requests();
        assert_eq!(requests.len(), 3, "shell, MCP tool, text");
        assert!(requests[0]
            .tool_names()
            .contains(&"run_shell_command".to_owned()));
        assert!(requests[0].offers_mcp_tool("send_message"));
        assert!(requests[1].tail_is_tool_result());
        assert_eq!(
            std::fs::read_to_string(sandbox.work.join("marker.txt")).unwrap_or_default(),
            MARKER,
            "the command ran"
        );
        assert_eq!(
            results_with(&requests[1..2], MARKER),
            1,
            "the shell's output went back: {:?}",
            requests[1].tool_results()
        );
        assert!(requests[2].tail_is_tool_result());
        assert_eq!(sent_texts(&sandbox), ["hi from gemini"]);
    }
    // 3. 401: not retried; a failing exit, the error on stderr (and in the JSON output, which
    // Gemini CLI did not always write before exiting on a loaded machine), and the error report
    // it writes in TMPDIR (not /tmp: the sandbox's).
    {
        let model = FakeModel::start_with_script([Step::error(401, "fake 401 error")]).unwrap();
        let sandbox = AgentSandbox::new(agent, &model, false);
        let mut cmd = sandbox.command(&bin);
        cmd.args(agent.prompt_args("say hi"));
        let run = run(&sandbox, cmd, "gemini 401");
        print_requests(&model);
        assert!(!run.status.success(), "{}", run.dump());
        assert!(run.stderr.contains("fake 401 error"), "{}", run.dump());
        if !run.stdout.trim().is_empty() {
            let error = &run.json()["error"];
            assert_eq!(error["code"], 401, "{}", run.dump());
            assert!(
                error["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("fake 401 error"),
                "{error}"
            );
        }
        assert_eq!(model.requests().len(), 1, "not retried");
        let reports: Vec<_> = std::fs::read_dir(&sandbox.tmp)
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("gemini-client-error")
            })
            .collect();
        assert_eq!(reports.len(), 1, "the error report is in TMPDIR");
    }
}

#[test]
fn qwen_prompt_mode_against_fake_model() {
    let agent = AcpAgent::Qwen;
    let Some(bin) = agent.cli() else { return };
    if !run_in_loopback_netns("qwen_prompt_mode_against_fake_model") {
        return;
    }
    // 1. Text with the scripted usage.
    {
        let model = FakeModel::start_with_script([Step::text("hello from the fake model")
            .chunks(3)
            .delay_ms(10)
            .usage(SAMPLE_USAGE)])
        .unwrap();
        let sandbox = AgentSandbox::new(agent, &model, false);
        let mut cmd = sandbox.command(&bin);
        cmd.args(agent.prompt_args("say hi"));
        let run = run(&sandbox, cmd, "qwen text");
        print_requests(&model);
        assert!(run.status.success(), "{}", run.dump());
        let result = run
            .json()
            .as_array()
            .into_iter()
            .flatten()
            .rfind(|e| e["type"] == "result")
            .cloned()
            .unwrap_or_else(|| panic!("no result event\n{}", run.dump()));
        assert_eq!(result["is_error"], false, "{}", run.dump());
        assert_eq!(result["result"], "hello from the fake model");
        assert_eq!(
            result["usage"],
            json!({"input_tokens":1500,"output_tokens":80,"cache_read_input_tokens":300,
                   "total_tokens":1580}),
            "{}",
            run.dump()
        );
        let requests = model.model_requests();
        assert_eq!(requests.len(), 1, "one model request, no side queries");
        let r = &requests[0];
        assert_eq!(r.api, Some(Api::Chat));
        assert_eq!(r.model(), Some("fake-model"));
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {FAKE_KEY}").as_str())
        );
        assert!(r.is_stream());
        assert!(r.last_user_text().unwrap_or_default().ends_with("say hi"));
        assert!(model.unknown_requests().is_empty());
    }
    // 2. A shell command and an MCP tool through Qwen's `tool_call`, then the text.
    {
        let model = FakeModel::start_with_script([
            shell_step(agent),
            send_message_step(agent, "hi from qwen"),
        ])
        .unwrap();
        model.set_default_text("done");
        let sandbox = AgentSandbox::new(agent, &model, true);
        let mut cmd = sandbox.command(&bin);
        cmd.args(agent.prompt_args("run the command"));
        let run = run(&sandbox, cmd, "qwen tools");
        print_requests(&model);
        assert!(run.status.success(), "{}", run.dump());
        let requests = model.model_requests();
        assert_eq!(requests.len(), 3, "shell, MCP tool, text");
        let tools = requests[0].tool_names();
        assert!(tools.contains(&"run_shell_command".to_owned()), "{tools:?}");
        // Deferred: the MCP tool is not offered; tool_search / tool_call reach it.
        assert!(tools.contains(&"tool_call".to_owned()), "{tools:?}");
        assert!(tools.contains(&"tool_search".to_owned()), "{tools:?}");
        assert!(!requests[0].offers_mcp_tool("send_message"), "{tools:?}");
        assert_eq!(
            std::fs::read_to_string(sandbox.work.join("marker.txt")).unwrap_or_default(),
            MARKER,
            "the command ran"
        );
        assert_eq!(
            results_with(&requests[1..2], MARKER),
            1,
            "the shell's output went back: {:?}",
            requests[1].tool_results()
        );
        assert!(requests[2].tail_is_tool_result());
        assert_eq!(sent_texts(&sandbox), ["hi from qwen"]);
    }
    // 3. 401: not retried; an error result and exit 1.
    {
        let model = FakeModel::start_with_script([Step::error(401, "fake 401 error")]).unwrap();
        let sandbox = AgentSandbox::new(agent, &model, false);
        let mut cmd = sandbox.command(&bin);
        cmd.args(agent.prompt_args("say hi"));
        let run = run(&sandbox, cmd, "qwen 401");
        print_requests(&model);
        assert_eq!(run.status.code(), Some(1), "{}", run.dump());
        let result = run
            .json()
            .as_array()
            .into_iter()
            .flatten()
            .rfind(|e| e["type"] == "result")
            .cloned()
            .unwrap_or_else(|| panic!("no result event\n{}", run.dump()));
        assert_eq!(result["is_error"], true, "{result}");
        assert_eq!(
            result["error"]["message"],
            "[API Error: 401 fake 401 error]"
        );
        assert_eq!(model.requests().len(), 1, "not retried");
    }
}

// ---------------------------------------------------------------------------------------------
// ACP
// ---------------------------------------------------------------------------------------------

/// Answers the agent's requests: permissions with the first option of `kind`, anything else
/// (Qwen's `craft/drainMidTurnQueue`) refused.
fn permit(kind: &'static str) -> impl FnMut(&Value) -> Reply {
    move |request| match request["method"].as_str() {
        Some("session/request_permission") => Reply::pick(request, kind),
        _ => Reply::Refuse,
    }
}

/// The usage a prompt reported: Gemini in the result's `_meta.quota.token_count`; Qwen in
/// `_meta.usage` of its `agent_message_chunk` updates, one per model response (summed).
fn prompt_usage(agent: AcpAgent, client: &AcpClient, from: usize, result: &Value) -> (u64, u64) {
    match agent {
        AcpAgent::Gemini => {
            let count = &result["_meta"]["quota"]["token_count"];
            (
                count["input_tokens"].as_u64().unwrap_or(0),
                count["output_tokens"].as_u64().unwrap_or(0),
            )
        }
        AcpAgent::Qwen => client
            .updates_since(from)
            .iter()
            .filter_map(|u| u.pointer("/_meta/usage"))
            .fold((0, 0), |(i, o), u| {
                (
                    i + u["inputTokens"].as_u64().unwrap_or(0),
                    o + u["outputTokens"].as_u64().unwrap_or(0),
                )
            }),
    }
}

/// One ACP session: initialize, `session/new` with the work folder and mcp-tools, a prompt that
/// runs a shell command (asked for and allowed once) and an MCP tool, then answers with text
/// and reports usage; a prompt cancelled while the model hangs; a prompt after it that is
/// answered in the same session; a shell command the client rejects, which does not run.
fn acp_session(agent: AcpAgent) {
    let Some(bin) = agent.cli() else { return };
    let model = FakeModel::start_with_script([
        shell_step(agent),
        send_message_step(agent, "hi over acp"),
        Step::text("all done").usage(SAMPLE_USAGE),
        Step::hang(),
        Step::text("still here"),
        Step::raw_tool_call(
            "run_shell_command",
            json!({"command": "touch rejected.txt", "description": "Make a file"}),
        ),
    ])
    .unwrap();
    model.set_default_text("after the rejection");
    let sandbox = AgentSandbox::new(agent, &model, false);
    let label = format!("{} acp", agent.name());
    let mut client = AcpClient::spawn(sandbox.acp_command(&bin), &label);
    let started = Instant::now();

    let init = client.call(
        "initialize",
        json!({"protocolVersion": 1,
               "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false},
                                      "terminal": false}}),
        WAIT,
        permit("allow_once"),
    );
    assert_eq!(init["protocolVersion"], 1, "{init}");
    assert_eq!(init["agentCapabilities"]["loadSession"], true, "{init}");
    let session = client.call(
        "session/new",
        json!({"cwd": sandbox.work, "mcpServers": [sandbox.mcp_tools().acp()]}),
        WAIT,
        permit("allow_once"),
    );
    let session_id = session["sessionId"].as_str().unwrap().to_owned();
    eprintln!(
        "[{label}] session {session_id} after {:.2?}",
        started.elapsed()
    );

    // 1. Shell (permission asked, allowed once), MCP tool, text, usage.
    let from = client.received.len();
    let result = client.call(
        "session/prompt",
        json!({"sessionId": session_id, "prompt": [{"type": "text", "text": "run it"}]}),
        WAIT,
        permit("allow_once"),
    );
    print_requests(&model);
    assert_eq!(result["stopReason"], "end_turn", "{result}");
    assert_eq!(client.reply_text_since(from), "all done");
    let permissions = client.requests_since(from, "session/request_permission");
    let shell = permissions
        .iter()
        .find(|p| p["params"]["toolCall"]["kind"] == "execute")
        .unwrap_or_else(|| panic!("no permission asked for the shell\n{}", client.transcript()));
    assert!(
        shell["params"].to_string().contains("fake-tool-%d"),
        "the request names the command: {shell}"
    );
    let kinds: Vec<&str> = shell["params"]["options"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["kind"].as_str())
        .collect();
    assert!(
        kinds.contains(&"allow_once") && kinds.contains(&"reject_once"),
        "{kinds:?}"
    );
    assert_eq!(
        std::fs::read_to_string(sandbox.work.join("marker.txt")).unwrap(),
        MARKER
    );
    assert_eq!(sent_texts(&sandbox), ["hi over acp"]);
    let requests = model.model_requests();
    assert_eq!(requests.len(), 3, "shell, MCP tool, text");
    assert_eq!(
        results_with(&requests, MARKER),
        2,
        "the shell's output went back"
    );
    // Two unscripted replies (10 in, 5 out each) and the scripted one (1500 in with the cache
    // reads; 80 out, 20 of them reasoning): Gemini counts output without the thoughts, Qwen
    // with them (its `completion_tokens`).
    let output = match agent {
        AcpAgent::Gemini => 80 - 20 + 10,
        AcpAgent::Qwen => 80 + 10,
    };
    assert_eq!(
        prompt_usage(agent, &client, from, &result),
        (1500 + 20, output),
        "{result}\n{}",
        client.transcript()
    );

    // 2. Cancelled while the model hangs: stopReason cancelled.
    let id = client.send_request(
        "session/prompt",
        json!({"sessionId": session_id, "prompt": [{"type": "text", "text": "wait"}]}),
    );
    model.wait_for_model_requests(4, WAIT).unwrap();
    client.notify("session/cancel", json!({"sessionId": session_id}));
    let response = client.wait_response(id, WAIT, permit("allow_once"));
    assert_eq!(response["result"]["stopReason"], "cancelled", "{response}");

    // 3. The session lives on.
    let from = client.received.len();
    let result = client.call(
        "session/prompt",
        json!({"sessionId": session_id, "prompt": [{"type": "text", "text": "again"}]}),
        WAIT,
        permit("allow_once"),
    );
    assert_eq!(result["stopReason"], "end_turn", "{result}");
    assert_eq!(client.reply_text_since(from), "still here");
    let last = model.model_requests().pop().unwrap();
    assert!(last.last_user_text().unwrap_or_default().ends_with("again"));

    // 4. A shell command rejected: it does not run. Gemini CLI hands the model the rejection (a
    // tool result) and the turn ends with its answer; Qwen Code ends the turn at once, without
    // another model request.
    let before = model.model_requests().len();
    let from = client.received.len();
    let result = client.call(
        "session/prompt",
        json!({"sessionId": session_id, "prompt": [{"type": "text", "text": "make it"}]}),
        WAIT,
        permit("reject_once"),
    );
    print_requests(&model);
    assert_eq!(
        client
            .requests_since(from, "session/request_permission")
            .len(),
        1
    );
    assert!(!sandbox.work.join("rejected.txt").exists());
    assert_eq!(result["stopReason"], "end_turn", "{result}");
    let requests = model.model_requests();
    match agent {
        AcpAgent::Gemini => {
            assert_eq!(client.reply_text_since(from), "after the rejection");
            assert_eq!(requests.len(), before + 2);
            let last = &requests[requests.len() - 1];
            assert!(last.tail_is_tool_result());
            eprintln!("[{label}] the rejection: {:?}", last.tool_results().last());
        }
        AcpAgent::Qwen => {
            assert_eq!(client.reply_text_since(from), "");
            assert_eq!(requests.len(), before + 1, "no request after the rejection");
        }
    }
    assert!(client.garbage.is_empty(), "{:?}", client.garbage);
    eprintln!("[{label}] total {:.2?}", started.elapsed());
}

#[test]
fn gemini_acp_session_against_fake_model() {
    if AcpAgent::Gemini.cli().is_none()
        || !run_in_loopback_netns("gemini_acp_session_against_fake_model")
    {
        return;
    }
    acp_session(AcpAgent::Gemini);
}

#[test]
fn qwen_acp_session_against_fake_model() {
    if AcpAgent::Qwen.cli().is_none()
        || !run_in_loopback_netns("qwen_acp_session_against_fake_model")
    {
        return;
    }
    acp_session(AcpAgent::Qwen);
}

/// After the agent process ends (stdin closed, as a runner that stops), a new process is asked
/// to `session/load` the session (both advertise `loadSession`). Qwen Code loads it and carries
/// the history into the next request. Gemini CLI 0.61.0 mostly answers -32603 "No previous
/// sessions found for this project." (every quiet run; one run on a loaded machine loaded it:
/// docs/contract/acp-agents.md), so a runner must be ready to start a new session and say so:
/// the test takes either answer and then proves that fallback, a new session in the new
/// process that is answered.
fn acp_load_in_a_new_process(agent: AcpAgent) {
    let Some(bin) = agent.cli() else { return };
    let model = FakeModel::start_with_script([Step::text("noted")]).unwrap();
    model.set_default_text("loaded");
    let sandbox = AgentSandbox::new(agent, &model, false);
    let label = format!("{} acp load", agent.name());
    let init = json!({"protocolVersion": 1, "clientCapabilities": {}});
    let mut first = AcpClient::spawn(sandbox.acp_command(&bin), &label);
    first.call("initialize", init.clone(), WAIT, permit("allow_once"));
    let session = first.call(
        "session/new",
        json!({"cwd": sandbox.work, "mcpServers": []}),
        WAIT,
        permit("allow_once"),
    );
    let session_id = session["sessionId"].as_str().unwrap().to_owned();
    let result = first.call(
        "session/prompt",
        json!({"sessionId": session_id,
               "prompt": [{"type": "text", "text": "remember the word walrus"}]}),
        WAIT,
        permit("allow_once"),
    );
    assert_eq!(result["stopReason"], "end_turn", "{result}");
    let exit = first.close(Duration::from_secs(10));
    eprintln!("[{label}] first process ended: {exit:?}");

    let mut second = AcpClient::spawn(sandbox.acp_command(&bin), &label);
    let init = second.call("initialize", init, WAIT, permit("allow_once"));
    assert_eq!(init["agentCapabilities"]["loadSession"], true, "{init}");
    let id = second.send_request(
        "session/load",
        json!({"sessionId": session_id, "cwd": sandbox.work, "mcpServers": []}),
    );
    let response = second.wait_response(id, WAIT, permit("allow_once"));
    eprintln!("[{label}] session/load: {response}");
    match agent {
        AcpAgent::Gemini => {
            if response.get("result").is_none() {
                assert_eq!(response["error"]["code"], -32603, "{response}");
                assert!(
                    response["error"]
                        .to_string()
                        .contains("No previous sessions found"),
                    "{response}"
                );
            }
            let session = second.call(
                "session/new",
                json!({"cwd": sandbox.work, "mcpServers": []}),
                WAIT,
                permit("allow_once"),
            );
            let new_id = session["sessionId"].as_str().unwrap().to_owned();
            assert_ne!(new_id, session_id);
            let from = second.received.len();
            let result = second.call(
                "session/prompt",
                json!({"sessionId": new_id,
                       "prompt": [{"type": "text", "text": "which word?"}]}),
                WAIT,
                permit("allow_once"),
            );
            assert_eq!(result["stopReason"], "end_turn", "{result}");
            assert_eq!(second.reply_text_since(from), "loaded");
        }
        AcpAgent::Qwen => {
            assert!(response.get("result").is_some(), "{response}");
            let result = second.call(
                "session/prompt",
                json!({"sessionId": session_id,
                       "prompt": [{"type": "text", "text": "which word?"}]}),
                WAIT,
                permit("allow_once"),
            );
            assert_eq!(result["stopReason"], "end_turn", "{result}");
            let last = model.model_requests().pop().unwrap();
            let texts = last.user_texts().join("\n");
            assert!(
                texts.contains("walrus") && texts.ends_with("which word?"),
                "the history came back: {texts}"
            );
        }
    }
}

#[test]
fn gemini_acp_session_load_in_a_new_process() {
    if AcpAgent::Gemini.cli().is_none()
        || !run_in_loopback_netns("gemini_acp_session_load_in_a_new_process")
    {
        return;
    }
    acp_load_in_a_new_process(AcpAgent::Gemini);
}

#[test]
fn qwen_acp_session_load_in_a_new_process() {
    if AcpAgent::Qwen.cli().is_none()
        || !run_in_loopback_netns("qwen_acp_session_load_in_a_new_process")
    {
        return;
    }
    acp_load_in_a_new_process(AcpAgent::Qwen);
}

/// Qwen Code's own `auto` mode (no `--approval-mode`): before a tool call it asks the model,
/// through a side query offering only `respond_in_schema`, whether to block it. The fake model
/// answers `{"shouldBlock": false}` without consuming a step, the MCP tool runs without asking
/// the client, and the side query's usage is not reported to the client (two usage reports for
/// three model requests).
#[test]
fn qwen_acp_auto_mode_asks_the_model_before_a_tool() {
    let agent = AcpAgent::Qwen;
    let Some(bin) = agent.cli() else { return };
    if !run_in_loopback_netns("qwen_acp_auto_mode_asks_the_model_before_a_tool") {
        return;
    }
    let model = FakeModel::start_with_script([send_message_step(agent, "auto")]).unwrap();
    model.set_default_text("done");
    let sandbox = AgentSandbox::new(agent, &model, false);
    let mut cmd = sandbox.command(&bin);
    cmd.arg("--acp");
    let mut client = AcpClient::spawn(cmd, "qwen acp auto");
    client.call(
        "initialize",
        json!({"protocolVersion": 1}),
        WAIT,
        permit("reject_once"),
    );
    let session = client.call(
        "session/new",
        json!({"cwd": sandbox.work, "mcpServers": [sandbox.mcp_tools().acp()]}),
        WAIT,
        permit("reject_once"),
    );
    assert_eq!(session["modes"]["currentModeId"], "auto", "{session}");
    let session_id = session["sessionId"].as_str().unwrap().to_owned();
    let from = client.received.len();
    let result = client.call(
        "session/prompt",
        json!({"sessionId": session_id, "prompt": [{"type": "text", "text": "send it"}]}),
        WAIT,
        permit("reject_once"),
    );
    print_requests(&model);
    assert_eq!(result["stopReason"], "end_turn", "{result}");
    assert_eq!(client.reply_text_since(from), "done");
    assert!(client
        .requests_since(from, "session/request_permission")
        .is_empty());
    assert_eq!(sent_texts(&sandbox), ["auto"]);
    let side: Vec<_> = model
        .requests()
        .into_iter()
        .filter(|r| r.reply == e2e::fake_model::ReplyKind::Structured)
        .collect();
    assert_eq!(side.len(), 1, "one classifier query");
    assert_eq!(side[0].tool_names(), ["respond_in_schema"]);
    assert_eq!(model.model_requests().len(), 2);
    let reports = client
        .updates_since(from)
        .iter()
        .filter(|u| u.pointer("/_meta/usage").is_some())
        .count();
    assert_eq!(reports, 2, "the classifier's usage is not reported");
}
