//! `scripts/inspect.sh`: the MCP Inspector CLI against the built mcp-tools, as the README shows
//! it (tools/list, then a tool call on the scratch session it creates). Local only: the inspector
//! must have been installed with `scripts/install-inspector.sh` (scripts/test.sh does; the
//! script reuses it without the network). `NANOCLAW_SKIP_NPM_TESTS=1` skips this test.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use e2e::harness::{bin, repo_root};
use e2e::scenarios::ok;
use serde_json::Value;

fn inspect(args: &[&str]) -> Output {
    let runner = bin("mcp-tools");
    let bin_dir = runner.parent().unwrap_or(Path::new("."));
    ok(
        Command::new("bash")
            .arg(repo_root().join("scripts/inspect.sh"))
            .args(args)
            .env("NANOCLAW_BIN_DIR", bin_dir)
            .env_remove("SESSION_DB")
            .env_remove("WORKSPACE_DIR")
            .stdin(Stdio::null())
            .output(),
        "running scripts/inspect.sh",
    )
}

#[test]
fn inspect_sh_lists_the_tools_and_calls_one() {
    if std::env::var("NANOCLAW_SKIP_NPM_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("NANOCLAW_SKIP_NPM_TESTS=1: skipping the MCP Inspector script test");
        return;
    }
    let out = inspect(&[]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let listed: Value = ok(serde_json::from_str(&stdout), "tools/list as JSON");
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for tool in ["send_message", "ask_user_question", "schedule_task"] {
        assert!(names.contains(&tool), "{tool} is not listed: {names:?}");
    }

    let out = inspect(&[
        "--method",
        "tools/call",
        "--tool-name",
        "send_message",
        "--tool-arg",
        "text=hello from the inspector",
    ]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let called: Value = ok(serde_json::from_str(&stdout), "tools/call as JSON");
    assert_eq!(called["isError"], false, "{stdout}");
    // The row the call wrote to the scratch session, printed before the session is deleted.
    assert!(
        stderr.contains("hello from the inspector"),
        "the row is shown: {stderr}"
    );
}
