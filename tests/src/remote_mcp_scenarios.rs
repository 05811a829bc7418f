//! The remote MCP scenario (issue 16, point 5), for every CLI: a streamable-HTTP MCP server on
//! loopback ([`crate::remote_mcp`]) configured with an `Authorization` header taken from the
//! runner's environment is listed to the model and called by the CLI; the header reaches the
//! server; its value is nowhere the agent can look (the environments and command lines of the
//! CLI and everything it started, the workspace's files), nor in the runner's log or
//! `agent-runner config`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::fake_model::{FakeModel, Step};
use crate::harness::{bin, descendants, text_of, Session};
use crate::remote_mcp::{RemoteMcp, ECHO_MARKER, ECHO_TOOL};
use crate::scenarios::{ok, some, WAIT};

/// The remote MCP scenarios, declared once: `remote_mcp_scenario_tests! { CLI }` in each
/// `tests/tests/e2e_<cli>.rs`.
#[macro_export]
macro_rules! remote_mcp_scenario_tests {
    ($cli:expr) => {
        /// Issue 16: a remote MCP server on loopback is listed and called; its auth header
        /// (from the runner's environment) reaches it and is nowhere the agent can look.
        #[test]
        fn remote_mcp_server_is_called_with_its_secret_header() {
            if $crate::harness::start_cli_test(
                $cli,
                stringify!(remote_mcp_server_is_called_with_its_secret_header),
            ) {
                $crate::remote_mcp_scenarios::remote_mcp_server_is_called_with_its_secret_header(
                    $cli,
                );
            }
        }
    };
}

/// The server's name in the config (its tools are `mcp__tracker__<tool>`).
const SERVER: &str = "tracker";

/// The variable the header comes from: set in the runner's environment only. Its name matches
/// no default scrub pattern, and the runner is told to pass it through: only the rule that a
/// header's source is scrubbed keeps it from the CLI.
const SOURCE_VAR: &str = "REMOTE_MCP_AUTH";

/// The header's value; the searches look for [`SECRET_MARKER`], a part of it.
const SECRET_VALUE: &str = "Bearer remote-mcp-secret-6b2e90";
const SECRET_MARKER: &str = "remote-mcp-secret-6b2e90";

/// The model step that calls the remote server's `tool` in `provider`'s naming.
fn remote_tool_step(provider: &str, tool: &str, arguments: serde_json::Value) -> Step {
    match provider {
        "claude" => Step::raw_tool_call(format!("mcp__{SERVER}__{tool}"), arguments),
        "codex" => Step::raw_tool_call(tool, arguments).namespace(format!("mcp__{SERVER}")),
        "opencode" => Step::raw_tool_call(format!("{SERVER}_{tool}"), arguments),
        other => panic!("no MCP tool naming known for provider {other}"),
    }
}

/// The name the model sees the remote `tool` offered under ([`crate::fake_model::LoggedRequest::tool_names`]).
fn offered_name(provider: &str, tool: &str) -> String {
    match provider {
        "opencode" => format!("{SERVER}_{tool}"),
        _ => format!("mcp__{SERVER}__{tool}"),
    }
}

/// NUL-separated `/proc/<pid>/<file>` as text (empty when the process is gone).
fn proc_text(pid: u32, file: &str) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/{file}")).unwrap_or_default())
        .replace('\0', "\n")
}

/// The scenario: see the module docs.
pub fn remote_mcp_server_is_called_with_its_secret_header(provider: &str) {
    let server = ok(RemoteMcp::start(), "starting the remote MCP test server");
    let model = ok(
        FakeModel::start_with_script([
            remote_tool_step(provider, ECHO_TOOL, json!({"text": "ping-remote"})),
            Step::text("The remote tool answered."),
        ]),
        "starting the fake model",
    );
    let mut session = Session::new();
    session.write_config(&json!({"mcpServers": {SERVER: {
        "type": "http",
        "url": server.url(),
        "headers": {"Authorization": {"env": SOURCE_VAR}},
    }}}));
    let env = [
        (SOURCE_VAR, SECRET_VALUE),
        ("NANOCLAW_ENV_PASSTHROUGH", SOURCE_VAR),
        ("RUST_LOG", "debug"),
    ];
    session.start_runner(provider, &model, &env);
    let id = session.send_chat("call the remote tool").id;
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "The remote tool answered.");

    // Listed: the model's first request offers the remote tool.
    let requests = model.model_requests();
    let first = some(requests.first(), "a model request");
    let offered = offered_name(provider, ECHO_TOOL);
    assert!(
        first.tool_names().contains(&offered),
        "the model is offered {offered}: {:?}",
        first.tool_names()
    );
    // Called, with the real header on every request the server got.
    assert_eq!(
        server.echo_calls(),
        ["ping-remote"],
        "the remote tool ran once"
    );
    let auth = server.header_values("authorization");
    assert!(!auth.is_empty(), "the server got requests");
    assert_eq!(
        auth.len(),
        server.requests().len(),
        "every request carries the header: {:?}",
        server.requests()
    );
    assert!(
        auth.iter().all(|value| value == SECRET_VALUE),
        "the configured header reached the server, never the proxy's token: {auth:?}"
    );
    // The result reached the model.
    assert!(
        requests
            .iter()
            .any(|r| r.tool_results().iter().any(|t| t.contains(ECHO_MARKER))),
        "the tool's result reached the model"
    );

    // The value is in no environment or command line of anything the runner started (the CLI
    // lives on between turns, with mcp-tools).
    let runner = some(session.runner_pid(), "the runner's pid");
    let started = descendants(runner);
    assert!(!started.is_empty(), "the CLI is running");
    for (pid, command) in &started {
        for file in ["environ", "cmdline"] {
            let text = proc_text(*pid, file);
            assert!(
                !text.contains(SECRET_MARKER),
                "process {pid} ({command}) holds the header's value in its {file}"
            );
            assert!(
                !text
                    .lines()
                    .any(|entry| entry.starts_with(&format!("{SOURCE_VAR}="))),
                "process {pid} ({command}) has {SOURCE_VAR} in its {file}"
            );
        }
    }
    // Nor in any file of the workspace (the CLI's config files, its home, the runner's log).
    let grep = ok(
        Command::new("grep")
            .args(["-rlF", SECRET_MARKER])
            .arg(&session.workspace)
            .output(),
        "grep over the workspace",
    );
    assert!(
        grep.stdout.is_empty(),
        "files holding the header's value: {}",
        String::from_utf8_lossy(&grep.stdout)
    );
    // Nor in `agent-runner config`, which shows the source instead.
    for args in [&["config"][..], &["config", "--json"][..]] {
        let shown = ok(
            Command::new(bin("agent-runner"))
                .arg("--workspace")
                .arg(&session.workspace)
                .args(args)
                .env(SOURCE_VAR, SECRET_VALUE)
                .output(),
            "agent-runner config",
        );
        let text = String::from_utf8_lossy(&shown.stdout);
        assert!(shown.status.success(), "agent-runner {args:?}: {shown:?}");
        assert!(!text.contains(SECRET_MARKER), "{text}");
        assert!(text.contains(SOURCE_VAR), "the source is shown: {text}");
    }
    session.stop_runner();
    // Read once stopped: a log line still queued in the runner's writer thread counts too.
    assert!(!session.runner_log().contains(SECRET_MARKER));

    // Without the variable the runner does not start, and says which entry needs what.
    let mut env = session.runner_env(provider, &model);
    env.remove(SOURCE_VAR);
    let mut runner = ok(
        Command::new(bin("agent-runner"))
            .arg("--workspace")
            .arg(&session.workspace)
            .env_clear()
            .envs(env)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn(),
        "starting agent-runner without the header's variable",
    );
    let started = Instant::now();
    while ok(runner.try_wait(), "waiting for agent-runner").is_none() {
        if started.elapsed() > WAIT {
            let _ = runner.kill();
            panic!("the runner started without the header's variable");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = ok(runner.wait_with_output(), "agent-runner's output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("mcpServers.{SERVER}.headers.Authorization"))
            && stderr.contains(&format!("{SOURCE_VAR} is unset")),
        "{stderr}"
    );
}
