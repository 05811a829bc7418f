//! Benchmark of the `mcp-tools` binary as a client sees it. Prints, does not assert:
//!
//! - spawn → first `tools/list` response (initialize, initialized and tools/list written at
//!   once right after spawn), over many spawns: p50 / p90 / max;
//! - `send_message` round trip (request written → response read), sequential: p50 / p99;
//! - RSS of the server after 1,000 calls;
//! - throughput of 1,000 pipelined send_message calls.
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
    println!("RSS after initialize: {} KiB", rss_kib(pid, "VmRSS:"));
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
    println!(
        "RSS after {} calls: {} KiB (peak {} KiB)",
        WARMUP + CALLS,
        rss_kib(pid, "VmRSS:"),
        rss_kib(pid, "VmHWM:")
    );

    // 3. pipelined throughput.
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
    println!(
        "RSS after {} calls: {} KiB (peak {} KiB)",
        WARMUP + 2 * CALLS,
        rss_kib(pid, "VmRSS:"),
        rss_kib(pid, "VmHWM:")
    );
}
