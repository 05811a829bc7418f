//! The official MCP Inspector CLI (`@modelcontextprotocol/inspector-cli`, pinned in
//! `scripts/install-inspector.sh`) lists the tools and calls send_message against the binary.
//!
//! The inspector must have been installed with `scripts/install-inspector.sh` (into
//! `.cli-inspector/`, or `NANOCLAW_INSPECTOR_DIR`). Without it this test fails, unless
//! `NANOCLAW_SKIP_NPM_TESTS=1`.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use crate::support::{Env, BIN};

const ENTRY: &str = "node_modules/@modelcontextprotocol/inspector-cli/build/cli.js";

/// The inspector's entry point, or `None` when the npm tests are skipped.
fn inspector() -> Option<PathBuf> {
    if std::env::var("NANOCLAW_SKIP_NPM_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("NANOCLAW_SKIP_NPM_TESTS=1: skipping the MCP Inspector test");
        return None;
    }
    let dir = std::env::var_os("NANOCLAW_INSPECTOR_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cli-inspector"));
    let entry = dir.join(ENTRY);
    assert!(
        entry.is_file(),
        "the MCP Inspector CLI is not installed at {}: run scripts/install-inspector.sh \
         (or set NANOCLAW_SKIP_NPM_TESTS=1 to skip this test)",
        entry.display()
    );
    Some(entry)
}

fn run(entry: &PathBuf, env: &Env, args: &[&str]) -> Output {
    let mut command = Command::new("node");
    // inspector-cli 1.0.3 checks for `../package.json` relative to the CURRENT folder but
    // imports it relative to its module, so it only starts from inside its own `build/`.
    let build_dir = entry.parent().expect("entry has a folder");
    command
        .current_dir(build_dir)
        .arg(entry)
        .arg("--cli")
        .arg(BIN)
        .args(args)
        .env("SESSION_DB", &env.db_path)
        .env("WORKSPACE_DIR", &env.workspace)
        .env("TZ", "UTC")
        .env("CI", "true");
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run node (is Node.js installed?)");
    // Bound the run: the inspector must not hang the test suite.
    let started = std::time::Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// The JSON document the inspector prints (it may print notices around it).
fn json_output(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let start = stdout.find('{').unwrap_or_else(|| {
        panic!(
            "no JSON from the inspector; stdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    serde_json::from_str(stdout[start..].trim())
        .unwrap_or_else(|err| panic!("inspector output is not JSON ({err}): {stdout}"))
}

#[test]
fn inspector_lists_tools_and_calls_send_message() {
    let Some(entry) = inspector() else { return };
    let env = Env::new();
    env.session_routing("slack", "C-inspector");

    let listed = run(&entry, &env, &["--method", "tools/list"]);
    assert!(
        listed.status.success(),
        "inspector tools/list failed: {}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let tools = json_output(&listed);
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 14, "{names:?}");
    assert!(names.contains(&"send_message") && names.contains(&"ask_user_question"));

    let called = run(
        &entry,
        &env,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "send_message",
            "--tool-arg",
            "text=hi",
        ],
    );
    assert!(
        called.status.success(),
        "inspector tools/call failed: {}",
        String::from_utf8_lossy(&called.stderr)
    );
    let result = json_output(&called);
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(
        result["content"][0]["text"], "Message sent (seq 1).",
        "{result}"
    );
    let rows = env.db.all_messages_out().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].content, r#"{"text":"hi"}"#);
    assert_eq!(rows[0].routing.platform_id.as_deref(), Some("C-inspector"));
}
