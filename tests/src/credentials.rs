//! Scenarios of the credential proxy: the CLI talks to the runner's loopback proxy with a
//! per-session token; only the proxy holds the real model key (issue 10, point 4).

use std::path::Path;

use crate::fake_model::Step;
use crate::harness::{descendants, text_of, Session, FAKE_KEY};
use crate::support::{ok, some, WAIT};

/// `NAME=value` entries of `/proc/<pid>/environ` (empty when the process is gone).
fn environ(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|e| !e.is_empty())
        .map(|e| String::from_utf8_lossy(e).into_owned())
        .collect()
}

/// The value of `name` in `env`.
fn env_value<'a>(env: &'a [String], name: &str) -> Option<&'a str> {
    env.iter()
        .find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
}

/// Every regular file under `dir` (recursively, links not followed) with its bytes.
fn files_under(dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            files_under(&path, out);
        } else if kind.is_file() {
            if let Ok(bytes) = std::fs::read(&path) {
                out.push((path.display().to_string(), bytes));
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

/// The token a 64-hex-digit string is.
fn is_token(text: &str) -> bool {
    text.len() == 64 && text.chars().all(|c| c.is_ascii_hexdigit())
}

/// A chat message is answered through the proxy: the fake model receives the REAL key (the
/// header each CLI's API uses), never the token; the CLI and everything it started hold the
/// token and the proxy's loopback URL in their environment and home files, never the real key;
/// after the runner stops, the proxy's port is closed.
pub fn model_key_stays_with_the_runner(provider: &str) {
    let model = ok(
        crate::fake_model::FakeModel::start_with_script([Step::text(
            "Answered through the proxy.",
        )]),
        "starting the fake model",
    );
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let id = session.send_chat("hello through the proxy").id;
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "Answered through the proxy.");
    let runner = some(session.runner_pid(), "the runner's pid");

    // The token, where each provider hands it to its CLI (all of it runs while the CLI lives).
    let home = session.workspace.join(".home").join(provider);
    let find_cli = || {
        descendants(runner)
            .into_iter()
            // (Codex's command line names mcp-tools too, as its MCP server.)
            .find(|(_, cmd)| {
                !cmd.split(' ')
                    .next()
                    .is_some_and(|program| program.ends_with("/mcp-tools"))
            })
            .map(|(pid, _)| pid)
    };
    session.wait_until("the CLI process", WAIT, |_| find_cli().is_some());
    let cli_pid = some(
        find_cli(),
        "the CLI process (the runner's first descendant)",
    );
    let cli_env = environ(cli_pid);
    let (token, proxy_url) = match provider {
        "claude" => {
            let token = ok(
                std::fs::read_to_string(home.join(".nanoclaw/anthropic-api-key")),
                "Claude's key file",
            );
            let url = some(
                env_value(&cli_env, "ANTHROPIC_BASE_URL"),
                "ANTHROPIC_BASE_URL in the CLI's environment",
            )
            .to_owned();
            (token, url)
        }
        "codex" => {
            let token = some(
                env_value(&cli_env, "NANOCLAW_CODEX_API_KEY"),
                "the key variable in Codex's environment",
            )
            .to_owned();
            let cmdline = ok(
                std::fs::read(format!("/proc/{cli_pid}/cmdline")),
                "Codex's command line",
            );
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let url = some(
                cmdline
                    .split("base_url=\"")
                    .nth(1)
                    .and_then(|rest| rest.split('"').next()),
                &format!("base_url in Codex's command line: {cmdline}"),
            )
            .to_owned();
            (token, url)
        }
        "opencode" => {
            let token = ok(
                std::fs::read_to_string(home.join(".nanoclaw/openai-api-key")),
                "OpenCode's key file",
            );
            let config = some(
                env_value(&cli_env, "OPENCODE_CONFIG_CONTENT"),
                "OPENCODE_CONFIG_CONTENT",
            );
            let config: serde_json::Value = ok(serde_json::from_str(config), "OpenCode's config");
            let url = some(
                config
                    .pointer("/provider/nanoclaw/options/baseURL")
                    .and_then(|v| v.as_str()),
                &format!("baseURL in OpenCode's config: {config}"),
            )
            .to_owned();
            (token, url)
        }
        other => panic!("no token location known for provider {other}"),
    };
    assert!(is_token(&token), "a 256-bit hex session token: {token:?}");
    let api = if provider == "claude" {
        "anthropic"
    } else {
        "openai"
    };
    assert!(
        proxy_url.starts_with("http://127.0.0.1:") && proxy_url.ends_with(&format!("/{api}")),
        "the CLI's base URL is the runner's proxy: {proxy_url}"
    );
    assert!(
        !proxy_url.starts_with(&format!("{}/", model.url())),
        "the CLI does not talk to the gateway directly: {proxy_url}"
    );

    // The real key reached the model, through the proxy; the token never did.
    let requests = model.requests();
    assert!(!requests.is_empty(), "the model was asked");
    for request in &requests {
        let (header, expected) = match provider {
            "claude" => ("x-api-key", FAKE_KEY.to_owned()),
            _ => ("authorization", format!("Bearer {FAKE_KEY}")),
        };
        assert_eq!(
            request.header(header),
            Some(expected.as_str()),
            "{} {} carries the real key",
            request.method,
            request.path
        );
        for (name, value) in &request.headers {
            assert!(
                !value.contains(&token),
                "the token reached the model in {name}"
            );
        }
    }

    // Nothing the CLI started holds the real key; the CLI's environment or home holds the token.
    let mut seen_token = false;
    let mut pids = vec![cli_pid];
    pids.extend(descendants(cli_pid).into_iter().map(|(pid, _)| pid));
    for pid in pids {
        for entry in environ(pid) {
            assert!(
                !entry.contains(FAKE_KEY),
                "process {pid} has the real key in its environment: {entry}"
            );
            seen_token |= entry.contains(&token);
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !contains(&cmdline, FAKE_KEY),
            "process {pid} has the real key in its argv"
        );
    }
    let mut files = Vec::new();
    files_under(&session.workspace, &mut files);
    assert!(
        files
            .iter()
            .any(|(path, _)| path.starts_with(&home.display().to_string())),
        "the CLI's home has files"
    );
    for (path, bytes) in &files {
        assert!(!contains(bytes, FAKE_KEY), "{path} holds the real key");
        seen_token |= path.starts_with(&home.display().to_string()) && contains(bytes, &token);
    }
    assert!(
        seen_token,
        "the CLI got the token (environment or home files)"
    );
    let log = session.runner_log();
    assert!(log.contains("credential proxy listening"), "{log}");

    // The token is worthless once the run ends: the proxy's port closes with the runner.
    session.stop_runner();
    // Read once stopped: a log line still queued in the runner's writer thread counts too.
    assert!(
        !session.runner_log().contains(&token),
        "the token is never logged"
    );
    let addr = some(
        proxy_url
            .strip_prefix("http://")
            .and_then(|rest| rest.split('/').next()),
        "the proxy's address",
    );
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the proxy at {addr} still accepts connections after the runner stopped"
    );
}
