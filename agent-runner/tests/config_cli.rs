//! Configuration mistakes through the real binary (issue 13, point 4): each is refused with an
//! error naming the field, where it came from and the fix, before anything starts; and
//! `agent-runner config` (text and `--json`) masks every secret, wherever it sits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// `agent-runner --workspace <ws> <args>` in `<ws>` with a clean environment, its output
/// collected.
fn runner(workspace: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent-runner"))
        .current_dir(workspace)
        .arg("--workspace")
        .arg(workspace)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The refusal's last line on stderr (the binary's final words), with the workspace's path
/// replaced by `<ws>` so that it can be compared whole.
fn refusal(workspace: &Path, out: &Output) -> String {
    assert!(!out.status.success(), "accepted: {out:?}");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    let said = last
        .split_once("agent-runner: ")
        .map_or(last, |(_, said)| said);
    said.replace(&workspace.display().to_string(), "<ws>")
}

/// Arguments, environment, and the expected refusal.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], expect_test::Expect);

#[test]
fn each_config_mistake_is_refused_naming_the_field_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let cases: [Case; 5] = [
        (
            &["--set", "idlePollMs=5000", "config"],
            &[],
            expect_test::expect![[
                r#"flag --set idlePollMs: idlePollMs = 5000 is out of range: allowed 10 to 1000 ms; set a value in that range"#
            ]],
        ),
        (
            &["config"],
            &[("NANOCLAW_HEARTBEAT_SECS", "0")],
            expect_test::expect![[
                r#"environment variable NANOCLAW_HEARTBEAT_SECS: heartbeatSecs = 0 is out of range: allowed 1 to 10 s; set a value in that range"#
            ]],
        ),
        (
            &["--config", "missing.json", "config"],
            &[],
            expect_test::expect![[
                r#"the config file <ws>/missing.json named by --config does not exist: fix the path (or mount the file), or drop --config to read the optional <workspace>/config.json"#
            ]],
        ),
        (
            &["config"],
            &[("NANOCLAW_CONFIG", "/nonexistent/nanoclaw.json")],
            expect_test::expect![[
                r#"the config file /nonexistent/nanoclaw.json named by NANOCLAW_CONFIG does not exist: fix the path (or mount the file), or drop NANOCLAW_CONFIG to read the optional <workspace>/config.json"#
            ]],
        ),
        (
            &["--config", "ranges.json", "run"],
            &[],
            expect_test::expect![[
                r#"<ws>/ranges.json: field "queryRetries": queryRetries = 1000 is out of range: allowed 0 to 100; set a value in that range"#
            ]],
        ),
    ];
    std::fs::write(ws.join("ranges.json"), r#"{"queryRetries": 1000}"#).unwrap();
    for (args, env, expected) in cases {
        let mut args = args.to_vec();
        let ranges = ws.join("ranges.json").display().to_string();
        for arg in &mut args {
            if *arg == "ranges.json" {
                *arg = &ranges;
            }
        }
        expected.assert_eq(&refusal(ws, &runner(ws, &args, env)));
    }
    // `run` refuses before it touches anything: no DB, no lock.
    assert!(!ws.join("session.db").exists() && !ws.join("session.db.lock").exists());
}

#[test]
fn agent_runner_config_masks_every_secret_in_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    std::fs::write(
        ws.join("config.json"),
        r#"{"mcpServers": {"github": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"],
                                     "env": {"GITHUB_TOKEN": "ghp_0123456789abcdefghij"}}},
            "cliEnv": {"API_TIMEOUT_MS": "120000", "HTTPS_PROXY": "http://proxy-user:proxy-pass@proxy.internal:3128"}}"#,
    )
    .unwrap();
    let env = [("OPENAI_API_KEY", "sk-proj-0123456789abcdef")];
    let text = runner(ws, &["config"], &env);
    let json = runner(ws, &["config", "--json"], &env);
    assert!(
        text.status.success() && json.status.success(),
        "{text:?}\n{json:?}"
    );
    let text = String::from_utf8(text.stdout).unwrap();
    let json = String::from_utf8(json.stdout).unwrap();
    for secret in ["0123456789abcdefghij", "0123456789abcdef", "proxy-pass"] {
        assert!(
            !text.contains(secret) && !json.contains(secret),
            "{secret}:\n{text}\n{json}"
        );
    }
    let shown: Vec<&str> = text
        .lines()
        .filter(|l| {
            ["openaiApiKey =", "mcpServers =", "cliEnv ="]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .collect();
    expect_test::expect![[r#"
        openaiApiKey = sk-p…**** (24 chars)  [env OPENAI_API_KEY]
        mcpServers = {"github":{"args":["-y","@modelcontextprotocol/server-github"],"command":"npx","env":{"GITHUB_TOKEN":"ghp_…**** (24 chars)"}}}  [config.json]
        cliEnv = {"API_TIMEOUT_MS":"120000","HTTPS_PROXY":"http://proxy-user:****@proxy.internal:3128"}  [config.json]"#]]
    .assert_eq(&shown.join("\n"));
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    expect_test::expect![[r#"{"source":"configFile","value":{"github":{"args":["-y","@modelcontextprotocol/server-github"],"command":"npx","env":{"GITHUB_TOKEN":"ghp_…**** (24 chars)"}}},"variable":"NANOCLAW_MCP_SERVERS"}"#]]
    .assert_eq(&json["settings"]["mcpServers"].to_string());
    assert_eq!(json["settings"]["idlePollMs"]["value"], 1000);
    assert_eq!(json["settings"]["idlePollMs"]["source"], "default");
}
