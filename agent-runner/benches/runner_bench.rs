//! Runner benchmark with the mock provider: host insert → reply row latency (p50/p99 over 500
//! messages), a burst of 1,000 messages (messages/s), CPU used over 30 s idle, and peak RSS.
//! Prints figures; asserts nothing about speed. Run: `cargo bench -p agent-runner --bench runner_bench`
//! (`RUNNER_BENCH_IDLE_SECS` shortens the idle phase).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use schema::{NewMessageIn, SessionDb};
use serde_json::json;

fn chat(text: &str) -> NewMessageIn {
    NewMessageIn::new("chat", json!({"sender": "Bench", "text": text}).to_string())
}

/// CPU ticks (user + system) of a process.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn status_kb(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    let log = std::fs::File::create(dir.path().join("runner.log")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent-runner"))
        .arg("--workspace")
        .arg(dir.path())
        .arg("--provider")
        .arg("mock")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let pid = child.id();
    let started = Instant::now();
    while db.runner_state().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "runner did not start"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // 1. Latency: one message at a time, insert → its reply row visible to the host.
    let mut latencies = Vec::with_capacity(500);
    for i in 0..520 {
        let sent = Instant::now();
        let id = db.insert_in(&chat(&format!("latency {i}"))).unwrap().id;
        loop {
            if !db.replies_to(&id).unwrap().is_empty() {
                break;
            }
            assert!(
                sent.elapsed() < Duration::from_secs(10),
                "no reply for {id}"
            );
            std::thread::sleep(Duration::from_micros(50));
        }
        if i >= 20 {
            latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
        }
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    println!(
        "latency insert→reply over {} messages: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (targets: p50 ≤ 5 ms, p99 ≤ 50 ms)",
        latencies.len(),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(0.0)
    );

    // 2. Burst: 1,000 messages inserted at once, until every one is completed.
    let burst = Instant::now();
    for i in 0..1000 {
        db.insert_in(&chat(&format!("burst {i}"))).unwrap();
    }
    let inserted = burst.elapsed();
    loop {
        let counts = db.counts(chrono::Utc::now()).unwrap();
        if counts.pending == 0 && counts.processing == 0 {
            break;
        }
        assert!(
            burst.elapsed() < Duration::from_secs(120),
            "burst did not finish"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = burst.elapsed().as_secs_f64();
    println!(
        "burst of 1000 messages: all completed in {:.3} s ({:.0} messages/s; inserting took {:.3} s)",
        took,
        1000.0 / took,
        inserted.as_secs_f64()
    );

    // 3. Idle CPU.
    let idle_secs: u64 = std::env::var("RUNNER_BENCH_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    std::thread::sleep(Duration::from_secs(1));
    let ticks_per_sec = 100.0; // USER_HZ on Linux
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(idle_secs));
    let used = (cpu_ticks(pid) - before) as f64 / ticks_per_sec;
    println!(
        "idle CPU over {idle_secs} s: {:.3} s of CPU = {:.3} % of a core (target ≤ 0.5 %)",
        used,
        used / idle_secs as f64 * 100.0
    );

    // 4. Peak RSS.
    println!(
        "peak RSS (VmHWM): {:.1} MB, current RSS {:.1} MB (target ≤ 20 MB)",
        status_kb(pid, "VmHWM:") as f64 / 1024.0,
        status_kb(pid, "VmRSS:") as f64 / 1024.0
    );
    nix_kill(pid);
    let _ = child.wait();
}

fn nix_kill(pid: u32) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status();
}
