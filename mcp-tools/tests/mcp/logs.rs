//! The server's stderr log (docs/logs.md): with `--log-format json` every line is one JSON
//! object naming the session; a startup error is written once, in either format.

use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::{Env, BIN};

/// Runs the server with stdin closed (it serves, reads end of input, exits) and `env` set.
fn run(env: &Env, vars: &[(&str, &str)], args: &[&str]) -> (bool, String) {
    let output = Command::new(BIN)
        .env_clear()
        .env("SESSION_DB", &env.db_path)
        .env("WORKSPACE_DIR", &env.workspace)
        .env("RUST_LOG", "info")
        .envs(vars.iter().copied())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(output.stdout.is_empty(), "stdout is the protocol's");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn json_lines(stderr: &str) -> Vec<Value> {
    stderr
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|err| panic!("not a JSON line ({err}): {line}\n{stderr}"))
        })
        .collect()
}

#[test]
fn json_lines_parse_and_name_the_session() {
    let env = Env::new();
    let session = env.db_path.display().to_string();
    for (vars, args) in [
        (&[][..], &["--log-format", "json"][..]),
        (&[("NANOCLAW_LOG_FORMAT", "json")][..], &[][..]),
    ] {
        let (ok, stderr) = run(&env, vars, args);
        assert!(ok, "{stderr}");
        let lines = json_lines(&stderr);
        assert!(
            lines.iter().any(|l| l["message"] == "serving MCP on stdio"),
            "{stderr}"
        );
        for line in &lines {
            assert_eq!(line["session"], session.as_str(), "{line}");
        }
    }
}

#[test]
fn a_startup_error_is_written_once() {
    let env = Env::new();
    for format in ["text", "json"] {
        let (ok, stderr) = run(&env, &[("TZ", "Mars/Olympus")], &["--log-format", format]);
        assert!(!ok);
        let mentions: Vec<&str> = stderr
            .lines()
            .filter(|line| line.contains("Mars/Olympus"))
            .collect();
        assert_eq!(mentions.len(), 1, "{format}: {stderr}");
        if format == "json" {
            let line = &json_lines(&stderr)[0];
            assert_eq!(line["level"], "ERROR");
            assert_eq!(line["target"], "mcp-tools");
            assert_eq!(line["session"], env.db_path.display().to_string().as_str());
        }
    }
}

#[test]
fn help_documents_rust_log_and_the_log_format() {
    let help = Command::new(BIN).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.contains("RUST_LOG=") && text.contains("--log-format"),
        "{text}"
    );
}
