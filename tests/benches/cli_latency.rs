//! Per-CLI latency through the whole stack: host insert → reply row, with the real runner, the
//! real CLI and mcp-tools, against the fake model server (so the figure is our overhead plus the
//! CLI's own time, not a model's). The first message includes the CLI's start-up.
//! Run: `cargo build --workspace --bins && cargo bench -p e2e --bench cli_latency`
//! (`CLI_LATENCY_MESSAGES`, default 8; `CLI_LATENCY_ONLY=claude,codex`). Prints figures only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use e2e::fake_model::FakeModel;
use e2e::harness::{cli, run_in_loopback_netns, Session};

fn measure(provider: &str, messages: usize) {
    let model = FakeModel::start().unwrap();
    model.set_default_text("pong");
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let mut times = Vec::with_capacity(messages);
    for i in 0..messages {
        let sent = Instant::now();
        let id = session.send_chat(&format!("ping {i}")).id;
        // Poll every 2 ms (the harness's own wait polls every 25 ms, too coarse for this).
        while session
            .db
            .replies_to(&id)
            .unwrap()
            .iter()
            .all(|o| o.kind != "chat")
        {
            assert!(
                sent.elapsed() < Duration::from_secs(120),
                "no reply from {provider}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        times.push(sent.elapsed().as_secs_f64() * 1000.0);
    }
    session.stop_runner();
    let first = times[0];
    let mut rest: Vec<f64> = times[1..].to_vec();
    rest.sort_by(|a, b| a.total_cmp(b));
    let median = rest.get(rest.len() / 2).copied().unwrap_or(first);
    println!(
        "{provider:>8}: insert→reply first message {first:.0} ms (includes CLI start-up); \
         next {} messages: median {median:.0} ms, min {:.0} ms, max {:.0} ms",
        rest.len(),
        rest.first().copied().unwrap_or(first),
        rest.last().copied().unwrap_or(first),
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // Re-runs itself inside a loopback-only namespace; the figures print from in there.
    if std::env::var_os("NANOCLAW_IN_NETNS").is_none()
        && std::env::var("NANOCLAW_NETNS").as_deref() != Ok("0")
    {
        let exe = std::env::current_exe().unwrap();
        let status = std::process::Command::new("unshare")
            .args(["-n", "sh", "-c", "ip link set lo up && exec \"$@\"", "sh"])
            .arg(exe)
            .arg("--bench")
            .env("NANOCLAW_IN_NETNS", "1")
            .status();
        match status {
            Ok(status) if status.success() => return,
            _ => eprintln!(
                "no loopback-only namespace; measuring with the traffic-off settings only"
            ),
        }
    }
    let _ = run_in_loopback_netns; // the same isolation the e2e tests use
    let messages: usize = std::env::var("CLI_LATENCY_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let only = std::env::var("CLI_LATENCY_ONLY").unwrap_or_else(|_| "claude,codex,opencode".into());
    for (provider, var) in [
        ("claude", "CLAUDE_PATH"),
        ("codex", "CODEX_PATH"),
        ("opencode", "OPENCODE_PATH"),
    ] {
        if !only.split(',').any(|p| p == provider) {
            continue;
        }
        if cli(provider, var).is_some() {
            measure(provider, messages);
        }
    }
}
