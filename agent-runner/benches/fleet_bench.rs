//! Fleet benchmark: a node running many sessions. Starts `FLEET_SIZE` (100) runners with the mock
//! provider on as many DBs and prints their total PSS, the idle CPU of all of them together, and
//! insert → reply p50/p99 over `FLEET_MESSAGES` (400) messages sent one at a time to random
//! sessions at random 0-20 ms gaps. Then the same with `NANOCLAW_WATCH=poll`, the fallback a
//! runner takes when no inotify instance is left. In each mode the floor (`support::floor`) and
//! one runner alone are measured first in the same run, and the ratios are printed.
//!
//! Prints figures; asserts nothing about speed. Run: `cargo bench -p agent-runner --bench
//! fleet_bench`; `FLEET_SIZE`, `FLEET_MESSAGES` and `FLEET_IDLE_SECS` (10) shorten it.
//!
//! Each runner holds one inotify instance, and the default `fs.inotify.max_user_instances` is
//! 128 per user: the runners that fall back are counted (`fell back`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use schema::{NewMessageIn, SessionDb};
use support::{knob, percentile, procfs, XorShift};

/// How often the host looks for a reply.
const HOST_POLL: Duration = Duration::from_micros(100);
/// The longest one reply may take before the bench gives up.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest gap between two messages (uniform from 0).
const MAX_GAP_MS: u64 = 20;
/// What a runner logs when it falls back to the `-wal` file check (schema's watch shortage).
const FALLBACK_LOG: &str = "no file notifications for the session DB";

/// How the processes learn of commits.
#[derive(Clone, Copy)]
enum Mode {
    Notify,
    Poll,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Notify => "inotify",
            Mode::Poll => "poll",
        }
    }

    fn apply(self, command: &mut Command) {
        if let Mode::Poll = self {
            command.env(schema::watch::WATCH_MODE_VAR, "poll");
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Who {
    Floor,
    Runner,
}

/// One session: its workspace, DB handle and the process answering it.
struct Session {
    workspace: PathBuf,
    db: SessionDb,
    child: Child,
}

impl Session {
    fn start(root: &Path, index: usize, who: Who, mode: Mode) -> Self {
        let workspace = root.join(format!("session-{index}"));
        std::fs::create_dir_all(&workspace).unwrap();
        let db_path = workspace.join("session.db");
        let db = SessionDb::open(&db_path).unwrap();
        let mut command = match who {
            Who::Floor => support::floor::command(&db_path),
            Who::Runner => {
                let log = std::fs::File::create(workspace.join("runner.log")).unwrap();
                let mut command = Command::new(env!("CARGO_BIN_EXE_agent-runner"));
                command
                    .arg("--workspace")
                    .arg(&workspace)
                    .arg("--provider")
                    .arg("mock")
                    .env_clear()
                    .env("PATH", std::env::var("PATH").unwrap_or_default())
                    .env("HOME", workspace.join(".home"))
                    .env("RUST_LOG", "warn")
                    .env("TZ", "UTC")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log);
                command
            }
        };
        mode.apply(&mut command);
        let child = command.spawn().unwrap();
        Self {
            workspace,
            db,
            child,
        }
    }

    /// Sends one message and waits for its reply; the time between.
    fn round_trip(&self, text: &str) -> Duration {
        let content = serde_json::json!({ "sender": "Bench", "text": text }).to_string();
        let sent = Instant::now();
        let id = self
            .db
            .insert_in(&NewMessageIn::new("chat", content))
            .unwrap()
            .id;
        while self.db.replies_to(&id).unwrap().is_empty() {
            assert!(
                sent.elapsed() < REPLY_TIMEOUT,
                "no reply for {id} in {}",
                self.workspace.display()
            );
            std::thread::sleep(HOST_POLL);
        }
        sent.elapsed()
    }

    fn fell_back(&self) -> bool {
        std::fs::read_to_string(self.workspace.join("runner.log"))
            .is_ok_and(|log| log.contains(FALLBACK_LOG))
    }

    fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one group of processes measured.
struct Figures {
    label: String,
    processes: usize,
    p50_ms: f64,
    p99_ms: f64,
    idle_cpu_percent: f64,
    pss_mib: f64,
    fds_per_process: f64,
    fell_back: usize,
}

/// Starts `count` sessions answered by `who`, warms each up, measures, and stops them.
fn measure(
    root: &Path,
    label: &str,
    count: usize,
    who: Who,
    mode: Mode,
    messages: usize,
) -> Figures {
    let root = root.join(label.replace(' ', "-"));
    let sessions: Vec<Session> = (0..count)
        .map(|index| Session::start(&root, index, who, mode))
        .collect();
    // The first reply of each session also waits for its process to start.
    for (index, session) in sessions.iter().enumerate() {
        session.round_trip(&format!("warm-up {index}"));
    }

    std::thread::sleep(Duration::from_secs(1));
    let idle_secs = knob("FLEET_IDLE_SECS", 10);
    let pids: Vec<u32> = sessions.iter().map(|s| s.child.id()).collect();
    let cpu = || {
        pids.iter()
            .map(|pid| procfs::cpu_time(*pid))
            .sum::<Duration>()
    };
    let before = cpu();
    std::thread::sleep(Duration::from_secs(idle_secs));
    let idle = cpu().saturating_sub(before);
    let pss: u64 = pids.iter().map(|pid| procfs::pss(*pid)).sum();
    let fds: usize = pids
        .iter()
        .map(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |entries| entries.count())
        })
        .sum();

    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut latencies: Vec<f64> = (0..messages)
        .map(|i| {
            let session = &sessions[rng.below(count as u64) as usize];
            let took = session.round_trip(&format!("message {i}"));
            std::thread::sleep(Duration::from_millis(rng.below(MAX_GAP_MS + 1)));
            took.as_secs_f64() * 1000.0
        })
        .collect();
    latencies.sort_by(|a, b| a.total_cmp(b));
    let fell_back = sessions.iter().filter(|s| s.fell_back()).count();
    for session in sessions {
        session.stop();
    }
    Figures {
        label: label.to_owned(),
        processes: count,
        p50_ms: percentile(&latencies, 0.50),
        p99_ms: percentile(&latencies, 0.99),
        idle_cpu_percent: idle.as_secs_f64() / idle_secs.max(1) as f64 * 100.0,
        pss_mib: pss as f64 / (1024.0 * 1024.0),
        fds_per_process: fds as f64 / count.max(1) as f64,
        fell_back,
    }
}

fn main() {
    support::floor::run_if_requested();
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let size = knob("FLEET_SIZE", 100) as usize;
    let messages = knob("FLEET_MESSAGES", 400) as usize;
    let dir = tempfile::tempdir().unwrap();
    println!(
        "fleet of {size} runners (mock provider), {messages} messages one at a time to random sessions at 0-{MAX_GAP_MS} ms gaps, idle CPU over {} s",
        knob("FLEET_IDLE_SECS", 10)
    );
    println!(
        "{:<8} {:<7} {:>5} {:>8} {:>8} {:>9} {:>9} {:>10} {:>10} {:>7} {:>9}",
        "watch",
        "who",
        "procs",
        "p50 ms",
        "p99 ms",
        "p50/floor",
        "p99/floor",
        "idle CPU %",
        "PSS MiB",
        "fds/proc",
        "fell back"
    );
    for mode in [Mode::Notify, Mode::Poll] {
        let [floor, single, fleet] = [
            ("floor", 1, Who::Floor),
            ("runner", 1, Who::Runner),
            ("fleet", size, Who::Runner),
        ]
        .map(|(who_label, count, who)| {
            let label = format!("{} {who_label}", mode.name());
            measure(dir.path(), &label, count, who, mode, messages)
        });
        for figures in [&floor, &single, &fleet] {
            println!(
                "{:<8} {:<7} {:>5} {:>8.2} {:>8.2} {:>9.2} {:>9.2} {:>10.3} {:>10.1} {:>7.1} {:>9}",
                mode.name(),
                figures.label.split_once(' ').map_or("", |(_, who)| who),
                figures.processes,
                figures.p50_ms,
                figures.p99_ms,
                figures.p50_ms / floor.p50_ms,
                figures.p99_ms / floor.p99_ms,
                figures.idle_cpu_percent,
                figures.pss_mib,
                figures.fds_per_process,
                match figures.label.ends_with("floor") {
                    true => "-".to_owned(),
                    false => figures.fell_back.to_string(),
                },
            );
        }
    }
    println!(
        "(idle CPU %: of one core, all processes of the row together; PSS: sum of their smaps_rollup Pss; fds/proc: open descriptors per process at idle; fell back: runners that logged \"{FALLBACK_LOG}\")"
    );
}
