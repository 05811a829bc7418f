//! `nanoclaw serve` against the same work on the local library, in the same run (issue 40,
//! "Acceptance, measured"): send → reply latency with the real runner and the mock provider,
//! one `serve` with 100 sessions and 100 open event streams (RSS, PSS, idle CPU beside a floor),
//! and sustained sends per second on one session. Release binaries for every figure.
//!
//! Run: `cargo build --release -p agent-runner && cargo bench -p host --bench serve_bench`
//! (the bench builds `target/release/agent-runner` itself with that command when it is missing).
//! Knobs: `SERVE_BENCH_MESSAGES` (latency messages per side, default 200),
//! `SERVE_BENCH_SESSIONS` (default 100), `SERVE_BENCH_IDLE_SECS` (idle CPU window, default 10),
//! `SERVE_BENCH_RATE_SECS` (each sends/s phase, default 3). Prints figures; asserts nothing
//! about speed. Loopback only; every process it starts is ended by its pid (a `Drop` guard).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../../agent-runner/benches/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use host::api::SendBody;
use host::client::{ApiEvent, Client, ClientOptions};
use host::{InitOptions, SendRequest, WatchOptions};
use support::procfs;
use support::{knob, percentile};
use tokio::sync::mpsc as amp;

const BIN: &str = env!("CARGO_BIN_EXE_nanoclaw");

/// Goals of issue 40.
const GOAL_P50_EXTRA_MS: f64 = 2.0;
const GOAL_P99_RATIO: f64 = 2.0;
const GOAL_RSS_MIB: f64 = 48.0;
const GOAL_IDLE_CPU_PCT: f64 = 0.5;

/// A process this bench started: SIGKILLed by its pid and reaped when dropped.
struct Proc(Child);

impl Proc {
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `target/release/agent-runner` beside the bench's `nanoclaw`, built when missing.
fn runner_binary() -> PathBuf {
    let path = Path::new(BIN).with_file_name("agent-runner");
    if !path.exists() {
        println!("building the runner: cargo build --release -p agent-runner");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let status = Command::new(cargo)
            .args(["build", "--release", "-p", "agent-runner"])
            .status()
            .expect("running cargo");
        assert!(status.success(), "cargo build --release -p agent-runner");
    }
    assert!(path.exists(), "no runner at {}", path.display());
    path
}

/// `init` of `root/name` (routing `slack:C1`) by the library.
fn init_session(root: &Path, name: &str) -> PathBuf {
    let workspace = root.join(name);
    host::init(&InitOptions {
        workspace: workspace.clone(),
        routing: Some(host::parse_routing("slack:C1").unwrap()),
        ..Default::default()
    })
    .unwrap();
    workspace
}

/// A new token for every session of `root` (`nanoclaw token add`).
fn token(root: &Path) -> String {
    let output = Command::new(BIN)
        .env_remove("RUST_LOG")
        .args(["token", "add", "bench", "--sessions", "*", "--root"])
        .arg(root)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

/// `nanoclaw serve --root ROOT` on a free loopback port; its stderr is drained by a thread.
fn serve(root: &Path) -> (Proc, String) {
    let mut child = Command::new(BIN)
        .env_remove("RUST_LOG")
        .args(["serve", "--root"])
        .arg(root)
        .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let proc = Proc(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("serve did not say it listens");
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if entry["message"] == "serve: listening" {
            let addr = entry["addr"].as_str().unwrap().to_owned();
            return (proc, format!("http://{addr}"));
        }
    }
}

fn client(url: &str, token: &str) -> Client {
    Client::new(
        url,
        ClientOptions {
            token: Some(token.to_owned()),
            ..Default::default()
        },
    )
    .unwrap()
}

/// p50, p99, max of `times` (ms).
fn summary(times: &mut [f64]) -> (f64, f64, f64) {
    times.sort_by(f64::total_cmp);
    (
        percentile(times, 0.5),
        percentile(times, 0.99),
        percentile(times, 1.0),
    )
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

/// A follower of replies, already open before the send: each `(in_reply_to, seen at)`.
type Replies = amp::UnboundedReceiver<(String, Instant)>;

/// Waits for the reply to `id` (a `chat` row), skipping others.
async fn reply_to(replies: &mut Replies, id: &str) -> Instant {
    loop {
        let (to, at) = tokio::time::timeout(Duration::from_secs(30), replies.recv())
            .await
            .expect("no reply within 30 s")
            .expect("the follower ended");
        if to == id {
            return at;
        }
    }
}

/// The remote follower: one SSE stream of `session`, opened before this returns.
/// It returns once the stream said it caught up with the rows after `after`.
async fn remote_follower(
    client: &Client,
    session: &str,
    after: i64,
) -> (Replies, tokio::task::JoinHandle<()>) {
    let mut stream = client.events(session, after).await.unwrap();
    loop {
        match stream.next().await {
            Some(Ok(ApiEvent::CaughtUp { .. })) => break,
            Some(Ok(_)) => {}
            other => panic!("the event stream ended before catching up: {other:?}"),
        }
    }
    let (tx, rx) = amp::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Some(event) = stream.next().await {
            if let Ok(ApiEvent::Message { row, .. }) = event {
                if row["kind"] == "chat" {
                    if let Some(to) = row["inReplyTo"].as_str() {
                        let _ = tx.send((to.to_owned(), Instant::now()));
                    }
                }
            }
        }
    });
    (rx, task)
}

/// The local follower: `host::watch` with its DB watcher on its own connection.
fn local_follower(db_path: &Path) -> (Replies, tokio::task::JoinHandle<()>) {
    let db = host::open_existing(db_path).unwrap();
    let after = host::watch::latest_out_seq(&db).unwrap();
    let (tx, rx) = amp::unbounded_channel();
    let task = tokio::task::spawn_local(async move {
        let options = WatchOptions {
            after,
            ..Default::default()
        };
        let _ = host::watch(&db, &options, |row| {
            if row.kind == "chat" {
                if let Some(to) = &row.in_reply_to {
                    let _ = tx.send((to.clone(), Instant::now()));
                }
            }
            Ok(())
        })
        .await;
    });
    (rx, task)
}

fn chat(text: String) -> SendBody {
    SendBody {
        text: Some(text),
        ..Default::default()
    }
}

fn local_chat(text: String) -> SendRequest {
    SendRequest {
        text: Some(text),
        ..Default::default()
    }
}

/// Send → reply latency, remote and local in alternating blocks of the same run.
async fn latency(workspace: &Path, url: &str, token: &str, messages: usize) {
    let db_path = workspace.join("session.db");
    let log = std::fs::File::create(workspace.join("runner.log")).unwrap();
    let _runner = Proc(
        Command::new(runner_binary())
            .arg("--workspace")
            .arg(workspace)
            .args(["--provider", "mock"])
            .env("RUST_LOG", "info")
            .env("NANOCLAW_MOCK_DELAY_MS", "0")
            .env("NANOCLAW_MAX_MESSAGES_PER_PROMPT", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let client = client(url, token);
    let db = host::open_existing(&db_path).unwrap();
    let blocks = 4;
    let per_block = messages.div_ceil(blocks).max(1);
    let mut remote = Vec::with_capacity(messages);
    let mut local = Vec::with_capacity(messages);
    // One warm-up exchange each (runner start, first connections), not counted.
    for block in 0..=blocks {
        let count = if block == 0 { 1 } else { per_block };
        {
            let after = host::watch::latest_out_seq(&db).unwrap();
            let (mut replies, task) = remote_follower(&client, "lat", after).await;
            for i in 0..count {
                let started = Instant::now();
                let sent = client
                    .send("lat", &chat(format!("remote {block}.{i}")), None)
                    .await
                    .unwrap();
                let at = reply_to(&mut replies, &sent.sent.id).await;
                if block > 0 {
                    remote.push((at - started).as_secs_f64() * 1000.0);
                }
            }
            task.abort();
        }
        {
            let (mut replies, task) = local_follower(&db_path);
            // Let the watch make its first read before the first send.
            tokio::task::yield_now().await;
            for i in 0..count {
                let started = Instant::now();
                let sent = host::send(&db, &local_chat(format!("local {block}.{i}"))).unwrap();
                let at = reply_to(&mut replies, &sent.id).await;
                if block > 0 {
                    local.push((at - started).as_secs_f64() * 1000.0);
                }
            }
            task.abort();
        }
    }
    let (r50, r99, rmax) = summary(&mut remote);
    let (l50, l99, lmax) = summary(&mut local);
    println!(
        "\nsend → reply event, mock provider, zero think time ({} messages each, alternating \
         blocks of {per_block}):",
        remote.len()
    );
    println!("  local  (host::send + host::watch): p50 {l50:7.2} ms  p99 {l99:7.2} ms  max {lmax:7.2} ms");
    println!("  remote (client.send + SSE):        p50 {r50:7.2} ms  p99 {r99:7.2} ms  max {rmax:7.2} ms");
    println!(
        "  p50 remote - local {:+.2} ms (goal ≤ {GOAL_P50_EXTRA_MS} ms: {}); p99 remote / local \
         {:.2}x (goal ≤ {GOAL_P99_RATIO}x: {})",
        r50 - l50,
        verdict(r50 - l50 <= GOAL_P50_EXTRA_MS),
        r99 / l99,
        verdict(r99 / l99 <= GOAL_P99_RATIO),
    );
}

/// Sends per second on one session (no runner): local library, sequential and 8 threads;
/// the typed client (its kept-alive connection), reqwest keep-alive sequential and 8 concurrent.
async fn rate(workspace: &Path, url: &str, token: &str, secs: u64) {
    let db_path = workspace.join("session.db");
    let window = Duration::from_secs(secs);
    println!("\nsustained sends/s on one session (no runner, {secs} s each):");

    let local = |threads: usize| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let db_path = db_path.clone();
                std::thread::spawn(move || {
                    let db = host::open_existing(&db_path).unwrap();
                    let started = Instant::now();
                    let mut n = 0u64;
                    while started.elapsed() < window {
                        host::send(&db, &local_chat(format!("local {t}.{n}"))).unwrap();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum::<u64>() as f64 / secs as f64
    };
    let local_seq = local(1);
    let local_8 = local(8);
    println!("  local  host::send, 1 thread:                {local_seq:8.0}/s");
    println!("  local  host::send, 8 threads:               {local_8:8.0}/s");

    let typed = client(url, token);
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < window {
        typed
            .send("rate", &chat(format!("typed {n}")), None)
            .await
            .unwrap();
        n += 1;
    }
    let typed_seq = n as f64 / secs as f64;
    println!(
        "  remote typed client, sequential:           {typed_seq:8.0}/s ({:.2}x local)",
        typed_seq / local_seq
    );

    let keep_alive = |tasks: usize| {
        let http = reqwest::Client::new();
        let target = format!("{url}/v1/sessions/rate/messages");
        let token = token.to_owned();
        async move {
            let handles: Vec<_> = (0..tasks)
                .map(|t| {
                    let http = http.clone();
                    let target = target.clone();
                    let token = token.clone();
                    tokio::spawn(async move {
                        let started = Instant::now();
                        let mut n = 0u64;
                        while started.elapsed() < window {
                            let response = http
                                .post(&target)
                                .bearer_auth(&token)
                                .json(&serde_json::json!({"text": format!("ka {t}.{n}")}))
                                .send()
                                .await
                                .unwrap();
                            assert!(response.status().is_success(), "{response:?}");
                            let _ = response.bytes().await.unwrap();
                            n += 1;
                        }
                        n
                    })
                })
                .collect();
            let mut total = 0u64;
            for handle in handles {
                total += handle.await.unwrap();
            }
            total as f64 / secs as f64
        }
    };
    let ka_seq = keep_alive(1).await;
    println!(
        "  remote keep-alive (reqwest), sequential:    {ka_seq:8.0}/s ({:.2}x local)",
        ka_seq / local_seq
    );
    let ka_8 = keep_alive(8).await;
    println!(
        "  remote keep-alive (reqwest), 8 concurrent:  {ka_8:8.0}/s ({:.2}x local 8 threads)",
        ka_8 / local_8
    );
}

/// Resident figures and CPU of one process over the idle window.
struct Idle {
    rss: u64,
    pss: u64,
    hwm: u64,
    threads: usize,
    cpu_pct: f64,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Measures the processes over the same idle window of `secs`.
fn idle(pids: &[u32], secs: u64) -> Vec<Idle> {
    let before: Vec<_> = pids.iter().map(|&pid| procfs::thread_times(pid)).collect();
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let elapsed = started.elapsed();
    pids.iter()
        .zip(before)
        .map(|(&pid, before)| Idle {
            rss: procfs::rss(pid),
            pss: procfs::pss(pid),
            hwm: procfs::status_bytes(pid, "VmHWM:"),
            threads: procfs::thread_times(pid).len(),
            cpu_pct: procfs::cpu_time_since(pid, &before).as_secs_f64() / elapsed.as_secs_f64()
                * 100.0,
        })
        .collect()
}

/// One serve with `sessions` sessions and as many open streams, beside a serve with one
/// session and no stream, and an idle `sleep`, over the same idle window.
async fn fleet(base: &Path, sessions: usize, idle_secs: u64) {
    let root = base.join("fleet");
    for n in 0..sessions {
        init_session(&root, &format!("s{n:03}"));
    }
    let floor_root = base.join("floor");
    init_session(&floor_root, "only");
    let fleet_token = token(&root);
    let floor_token = token(&floor_root);
    let sleep = Proc(
        Command::new("sleep")
            .arg("3600")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (floor, floor_url) = serve(&floor_root);
    let (fleet, fleet_url) = serve(&root);
    // The floor answers one request, so its connection code paths are paged in too.
    client(&floor_url, &floor_token)
        .status("only")
        .await
        .unwrap();
    let fleet_client = client(&fleet_url, &fleet_token);
    let mut streams = Vec::with_capacity(sessions);
    for n in 0..sessions {
        let mut stream = fleet_client.events(&format!("s{n:03}"), 0).await.unwrap();
        streams.push(tokio::spawn(async move {
            while let Some(event) = stream.next().await {
                event.unwrap();
            }
        }));
    }
    // Settle: every stream's first status and caught-up events sent, the allocator quiet.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pids = [fleet.pid(), floor.pid(), sleep.pid()];
    let figures = tokio::task::spawn_blocking(move || idle(&pids, idle_secs))
        .await
        .unwrap();
    let alive = streams.iter().filter(|s| !s.is_finished()).count();
    let [served, floor_figures, sleep_figures] = &figures[..] else {
        unreachable!()
    };
    println!(
        "\none serve, {sessions} sessions, {alive} open event streams, idle over {idle_secs} s \
         (same window for each):"
    );
    for (name, f) in [
        (
            format!("serve, {sessions} sessions + {alive} streams"),
            served,
        ),
        (
            "serve, 1 session, 0 streams (floor)".to_owned(),
            floor_figures,
        ),
        ("sleep (process floor)".to_owned(), sleep_figures),
    ] {
        println!(
            "  {name:38} RSS {:6.1} MiB  PSS {:6.1} MiB  HWM {:6.1} MiB  {:2} threads  CPU {:6.3} % of a core",
            mib(f.rss),
            mib(f.pss),
            mib(f.hwm),
            f.threads,
            f.cpu_pct
        );
    }
    println!(
        "  serve RSS {:.1} MiB = {:.2}x the 1-session floor (+{:.1} MiB, {:.0} KiB per session + \
         stream); goal ≤ {GOAL_RSS_MIB} MiB: {}",
        mib(served.rss),
        served.rss as f64 / floor_figures.rss as f64,
        mib(served.rss.saturating_sub(floor_figures.rss)),
        served.rss.saturating_sub(floor_figures.rss) as f64 / 1024.0 / sessions.max(1) as f64,
        verdict(mib(served.rss) <= GOAL_RSS_MIB)
    );
    println!(
        "  serve idle CPU {:.3} % of a core (floor serve {:.3} %, sleep {:.3} %); goal ≤ \
         {GOAL_IDLE_CPU_PCT} %: {}",
        served.cpu_pct,
        floor_figures.cpu_pct,
        sleep_figures.cpu_pct,
        verdict(served.cpu_pct <= GOAL_IDLE_CPU_PCT)
    );
    for stream in streams {
        stream.abort();
    }
}

fn main() {
    let messages = knob("SERVE_BENCH_MESSAGES", 200) as usize;
    let sessions = knob("SERVE_BENCH_SESSIONS", 100) as usize;
    let idle_secs = knob("SERVE_BENCH_IDLE_SECS", 10).max(1);
    let rate_secs = knob("SERVE_BENCH_RATE_SECS", 3).max(1);
    runner_binary();
    println!(
        "serve_bench: release nanoclaw ({BIN}) and agent-runner, loopback HTTP, {} CPUs",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("served");
    std::fs::create_dir_all(&root).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local_set = tokio::task::LocalSet::new();
    local_set.block_on(&runtime, async {
        // Sessions exist before `serve` starts: it finds them at start.
        let lat = init_session(&root, "lat");
        let rate_session = init_session(&root, "rate");
        let token = token(&root);
        let (server, url) = serve(&root);
        latency(&lat, &url, &token, messages).await;
        rate(&rate_session, &url, &token, rate_secs).await;
        drop(server);
        fleet(dir.path(), sessions, idle_secs).await;
    });
}
