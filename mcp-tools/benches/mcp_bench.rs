//! Benchmark of the `mcp-tools` binary as a client sees it. Prints, does not assert:
//!
//! - spawn → first `tools/list` response (initialize, initialized and tools/list written at
//!   once right after spawn), over many spawns: p50 / p90 / max;
//! - `send_message` round trip (request written → response read), sequential: p50 / p99;
//! - throughput of 1,000 pipelined send_message calls;
//! - RSS (`VmRSS`) of a server after 1,000 calls, sequential and pipelined (each on a fresh
//!   server), against the target of 8 MiB, with the peak (`VmHWM`), the RSS right after
//!   `initialize` (the part no call explains) and the split anonymous / file-backed (the
//!   binary's code pages, shared through the page cache, are most of the total).
//!
//! Run: `cargo bench -p mcp-tools --bench mcp_bench` (release profile).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
#[path = "../tests/mcp/support.rs"]
mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::{Env, TIMEOUT};

const SPAWNS: usize = 40;
const WARMUP: usize = 100;
const CALLS: usize = 1_000;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The most a server may hold after 1,000 calls (issue 12).
const RSS_TARGET_KIB: u64 = 8 * 1024;

fn print_rss(what: &str, after_init: u64, pid: u32) {
    let rss = rss_kib(pid, "VmRSS:");
    println!(
        "RSS after {what}: {rss} KiB = {:.2} MiB (target ≤ 8 MiB: {:.2}x of it; peak {} KiB; {} KiB after initialize, +{} KiB since)",
        rss as f64 / 1024.0,
        rss as f64 / RSS_TARGET_KIB as f64,
        rss_kib(pid, "VmHWM:"),
        after_init,
        rss.saturating_sub(after_init)
    );
    // File-backed pages are the binary's code and libc, shared through the page cache; the
    // anonymous part is what the server allocated.
    println!(
        "    of which anonymous {} KiB, file-backed {} KiB; {} threads",
        rss_kib(pid, "RssAnon:"),
        rss_kib(pid, "RssFile:"),
        rss_kib(pid, "Threads:")
    );
}

fn main() {
    // `cargo bench` passes flags like `--bench`; nothing to parse.
    let env = Env::new();
    env.session_routing("slack", "C-bench");
    println!("mcp-tools benchmark ({})", support::BIN);

    // 1. spawn -> first tools/list response.
    let mut startup = Vec::with_capacity(SPAWNS);
    for _ in 0..SPAWNS {
        let started = Instant::now();
        let mut server = env.spawn();
        server.send(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}}}),
        );
        server.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        server.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
        let listed = server
            .response(&json!(2), TIMEOUT)
            .expect("tools/list answered");
        startup.push(started.elapsed());
        assert_eq!(listed["result"]["tools"].as_array().map(Vec::len), Some(14));
    }
    startup.sort();
    println!(
        "spawn -> first tools/list response: p50 {}  p90 {}  max {}  ({SPAWNS} spawns)",
        ms(percentile(&startup, 0.5)),
        ms(percentile(&startup, 0.9)),
        ms(*startup.last().unwrap())
    );

    // 2. sequential send_message round trips.
    let mut server = env.spawn().ready();
    let pid = server.child.id();
    let after_init = rss_kib(pid, "VmRSS:");
    println!("RSS after initialize: {after_init} KiB");
    for i in 0..WARMUP {
        server
            .call("send_message", json!({"text": format!("warmup {i}")}))
            .ok();
    }
    let mut trips = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let started = Instant::now();
        let result = server.call("send_message", json!({"text": format!("message {i}")}));
        trips.push(started.elapsed());
        assert!(!result.is_error, "{}", result.text);
    }
    trips.sort();
    println!(
        "send_message round trip: p50 {}  p99 {}  max {}  ({CALLS} sequential calls)",
        ms(percentile(&trips, 0.5)),
        ms(percentile(&trips, 0.99)),
        ms(*trips.last().unwrap())
    );
    print_rss(
        &format!("{} sequential calls", WARMUP + CALLS),
        after_init,
        pid,
    );

    // 3. pipelined throughput, on a fresh server so its RSS is that of pipelined calls alone.
    let mut server = env.spawn().ready();
    let pid = server.child.id();
    let after_init = rss_kib(pid, "VmRSS:");
    let started = Instant::now();
    let ids: Vec<_> = (0..CALLS)
        .map(|i| {
            let id = json!(format!("pipe-{i}"));
            server.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "send_message", "arguments": {"text": format!("pipelined {i}")}}}));
            id
        })
        .collect();
    for id in &ids {
        server.response(id, TIMEOUT).expect("pipelined response");
    }
    let elapsed = started.elapsed();
    println!(
        "pipelined: {CALLS} send_message calls in {} ({:.0} calls/s)",
        ms(elapsed),
        CALLS as f64 / elapsed.as_secs_f64()
    );
    print_rss(&format!("{CALLS} pipelined calls"), after_init, pid);
}
