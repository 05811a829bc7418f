//! The runner beside its floor, in one run: `cargo bench -p agent-runner --bench runner_bench`.
//! Prints figures and ratios; asserts nothing about speed.
//!
//! **The floor** (`support/floor.rs`) is this bench re-executed as a minimal process that does
//! the DB work of a message and nothing else: it notices the insert through `schema::DbWatcher`
//! (as the runner does), claims in one transaction and writes reply + completion in one
//! transaction. Absolute times on a shared machine drift by 1.5-3x between runs, and within a
//! run: the runner and the floor therefore run at the same time, each on its own copy of the
//! DB, and the host serves them in turns of 10 messages, so the ratio `runner / floor` compares
//! the same minutes of the machine. Read the ratios.
//!
//! What it prints, for the runner (mock provider, release build) and the floor:
//! - **insert → reply p50/p99**: the host inserts a `chat` row and looks for the reply (gated by
//!   `PRAGMA data_version` on its own connection) after every write to the workspace's files,
//!   which an inotify watch wakes it for, until the reply row is visible. (A sleep of 100 µs
//!   between looks lasted ~0.2 ms on a virtual machine, so every time came out in steps
//!   ~0.2 ms apart: a process's p50 landed on one step or the next.) Phases:
//!   random gaps of 0-300 ms (the same seeded sequence for both), then a fixed pause of 0, 5,
//!   10, 20, 30, 50 ms after each reply. The first messages of a process are a warm-up, not
//!   counted; nor, at a fixed pause, is the first message of each turn (the other side's turn
//!   was its pause).
//! - **idle CPU**: CPU time (the sum of `/proc/<pid>/task/*/schedstat`, in ns) over
//!   `RUNNER_BENCH_IDLE_SECS` with nothing to do, as % of a core.
//! - **CPU per message, net of idle**: CPU used over all latency phases (utime + stime of
//!   `/proc/<pid>/stat`: 10 ms ticks, but it keeps the time of threads that ended), minus the
//!   idle rate times the phases' wall time (what the process would have used idle meanwhile:
//!   polls, heartbeats), divided by the messages. Summed over all phases so the 10 ms tick is small
//!   against the total.
//! - **cold start**: a message is waiting, the process is spawned; spawn → its reply visible.
//!   The median of `RUNNER_BENCH_COLD_RUNS` starts on the same DB.
//! - all of the above again on a DB holding **1,000,000 completed rows** in each table the
//!   runner reads per message (`messages_in`, `messages_out`, `delivered`, `session_state`;
//!   built in one transaction with a recursive CTE), and the ratio `1M / empty` per figure and
//!   process; its last column divides the runner's by the floor's, which is what the runner adds
//!   to the growth of the DB work itself. The four processes (runner and floor, empty and big
//!   DB) are measured interleaved.
//! - **RSS** (`VmRSS`) after 1,000 and after 10,000 sequential messages, runner (mock) and
//!   floor: the growth should stay under 1 MiB.
//! - **RSS with a real CLI** (Codex by default, against the fake model of
//!   `tests/src/fake_model/` on 127.0.0.1, inside a loopback-only network namespace when one
//!   can be made): the runner process only, the CLI's memory aside, after
//!   `RUNNER_BENCH_CLI_MESSAGES / 10` and after `RUNNER_BENCH_CLI_MESSAGES` messages, with the
//!   RSS at every tenth between (default 1,000, ~2 minutes; 10,000 take ~23 minutes with Codex,
//!   as its turns slow while the conversation grows). The fake model keeps only its last 16
//!   requests (each holds the whole conversation; unlimited, the log filled the machine's memory
//!   near the 3,500th message), see `docs/decisions/perf.md#D-PERF-08`. Needs
//!   `scripts/install-clis.sh` (mcp-tools is built when missing); `RUNNER_BENCH_CLI=none`
//!   skips it, `=opencode|claude` picks another CLI.
//!
//! - **The method's check:** `RUNNER_BENCH_TWO_FLOORS=1` starts a second floor in the runner's
//!   place; every ratio should then be near 1.00x. The host serves the sides in turns, each side
//!   taking each place in the order in turn: with a fixed order (and the host's old sleep),
//!   two floors measured 0.69-1.01x of each other at single pauses. The phases run in
//!   `RUNNER_BENCH_ROUNDS` rounds (default 10), each with freshly started processes: a single
//!   round's p50 ratio between two floors still ranged 0.81-1.29x (0.78-1.75x pinned), so the
//!   percentiles are over all rounds' messages, and the table shows each round's p50 ratio
//!   beside them. Pooled over 5 rounds of 80 messages, two pinned floors measured 0.95-1.16x
//!   at single pauses, so the defaults count twice as many messages over twice as many rounds.
//!
//! Knobs for a quick run: `RUNNER_BENCH_MESSAGES` (per latency phase over all rounds, default
//! 800; 0 skips the latency, CPU and cold-start tables),
//! `RUNNER_BENCH_RANDOM_MESSAGES` (the random-gap phase, default 400), `RUNNER_BENCH_IDLE_SECS`
//! (default 10), `RUNNER_BENCH_COLD_RUNS` (default 5), `RUNNER_BENCH_ROWS` (the big DB, default
//! 1,000,000; 0 skips it), `RUNNER_BENCH_RSS_MESSAGES` (default 10,000; 0 skips it).
//!
//! **Where the processes run** (`support/placement.rs`): the runner and the floor share one
//! CPU and the host that inserts and times runs on another, when this process may use two.
//! The host wakes at every write to the DB's files; placed by the scheduler on a 2-CPU machine,
//! it ran on the measured process's CPU often enough to widen the ratio's spread between
//! rounds and runs (`docs/decisions/perf.md#D-PERF-16`).
//! `RUNNER_BENCH_PIN=0` leaves the placement to the scheduler.
//!
//! **Two builds of the runner against each other:** `RUNNER_BENCH_BASELINE=<agent-runner
//! binary>` starts that binary, as the runner is started, in the floor's place: the ratios then
//! compare this build with the other in one run (a change's effect, measured as the floor's
//! ratios are). `RUNNER_BENCH_TIMES=<file>` appends every counted insert → reply time to the
//! file, one line each: `side phase round message ms` (sides and phases in the tables' order).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use schema::{NewMessageIn, SessionDb};
use serde_json::json;
use support::placement::Placement;
use support::{knob, percentile, procfs, XorShift};

/// Messages each process answers before anything is counted.
const WARM_UP: usize = 20;
/// Fixed pauses after each reply, in ms.
const PAUSES_MS: [u64; 6] = [0, 5, 10, 20, 30, 50];
/// The longest the host waits for a write to the DB's files before it looks for the reply
/// anyway (a safety net: every commit writes the `-wal` file, which wakes it first).
const HOST_LOOK_AT_LEAST: Duration = Duration::from_millis(1);
/// The longest any single reply may take before the bench gives up.
const REPLY_TIMEOUT: Duration = Duration::from_secs(120);

fn chat(text: &str) -> NewMessageIn {
    NewMessageIn::new("chat", json!({"sender": "Bench", "text": text}).to_string())
}

/// Who answers: the runner under test or the floor.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Who {
    Floor,
    Runner,
}

impl Who {
    /// Starts it on `<workspace>/session.db` (which exists), on the measured processes' CPU
    /// when [`placement`] pins them; the runner logs to a file there.
    fn spawn(self, workspace: &Path) -> Child {
        let mut command = self.command(workspace);
        if let Some(placement) = placement() {
            placement.measured(&mut command);
        }
        command.spawn().unwrap()
    }

    fn command(self, workspace: &Path) -> Command {
        match self {
            Who::Floor => match std::env::var_os("RUNNER_BENCH_BASELINE") {
                Some(baseline) => mock_runner(workspace, Path::new(&baseline)),
                None => support::floor::command(&workspace.join("session.db")),
            },
            // The method's own check: a second floor in the runner's place should measure 1.00x.
            Who::Runner if knob("RUNNER_BENCH_TWO_FLOORS", 0) == 1 => {
                support::floor::command(&workspace.join("session.db"))
            }
            Who::Runner => mock_runner(workspace, &runner_exe()),
        }
    }
}

/// `exe` (an agent-runner build) with the mock provider on `workspace`, logging to
/// `runner.log` there.
fn mock_runner(workspace: &Path, exe: &Path) -> Command {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(workspace.join("runner.log"))
        .unwrap();
    let mut env = BTreeMap::new();
    env.insert("PATH".to_owned(), std::env::var("PATH").unwrap_or_default());
    env.insert(
        "HOME".to_owned(),
        workspace.join(".host-home").display().to_string(),
    );
    env.insert("RUST_LOG".to_owned(), "warn".to_owned());
    env.insert("TZ".to_owned(), "UTC".to_owned());
    runner_command(exe, workspace, "mock", &env, log)
}

/// Where the measured processes and the host run, decided once (`RUNNER_BENCH_PIN`).
fn placement() -> Option<Placement> {
    static PLACEMENT: OnceLock<Option<Placement>> = OnceLock::new();
    *PLACEMENT.get_or_init(|| match Placement::from_env() {
        Ok(placement) => placement,
        Err(why) => {
            println!("(the processes are placed by the scheduler: {why})");
            None
        }
    })
}

/// The runner this run measures: a copy of the release build taken at the start (see
/// [`support::floor::pinned_copy`]), or the build itself when no copy could be made.
fn runner_exe() -> PathBuf {
    runner_exe_cell()
        .get_or_init(|| PathBuf::from(env!("CARGO_BIN_EXE_agent-runner")))
        .clone()
}

fn runner_exe_cell() -> &'static OnceLock<PathBuf> {
    static PINNED: OnceLock<PathBuf> = OnceLock::new();
    &PINNED
}

/// Copies the runner and this bench (the floor) aside for the whole run, in `dir`.
fn pin_binaries(dir: &Path) -> std::io::Result<()> {
    support::floor::pin_executable(dir)?;
    let runner = support::floor::pinned_copy(
        Path::new(env!("CARGO_BIN_EXE_agent-runner")),
        dir,
        "agent-runner",
    )?;
    let _ = runner_exe_cell().set(runner);
    Ok(())
}

/// `<exe> --workspace <ws> --provider <provider>` (`exe`: the release build of this package,
/// [`runner_exe`], or another build) with exactly `env`, stderr to `log`.
fn runner_command(
    exe: &Path,
    workspace: &Path,
    provider: &str,
    env: &BTreeMap<String, String>,
    log: std::fs::File,
) -> Command {
    let mut command = Command::new(exe);
    command
        .arg("--workspace")
        .arg(workspace)
        .arg("--provider")
        .arg(provider)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    command
}

/// SIGTERM, then SIGKILL after 10 s; waits for it.
fn stop(mut child: Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The host side: inserts messages and notices replies.
struct Host {
    /// The workspace: its `runner.log` is shown when a reply does not come.
    workspace: PathBuf,
    db: SessionDb,
    /// Its own connection for `PRAGMA data_version` and the reply lookup.
    conn: rusqlite::Connection,
    /// A watch on the workspace folder: a write to any of the DB's files wakes the host.
    writes: inotify::Inotify,
    events: Vec<u8>,
    sent: u64,
}

impl Host {
    fn open(workspace: &Path) -> Host {
        let db = SessionDb::open(workspace.join("session.db")).unwrap();
        let conn = db.dedicated_connection().unwrap();
        let writes = inotify::Inotify::init().unwrap();
        writes
            .watches()
            .add(workspace, inotify::WatchMask::MODIFY)
            .unwrap();
        Host {
            workspace: workspace.to_owned(),
            db,
            conn,
            writes,
            events: vec![0; 4096],
            sent: 0,
        }
    }

    /// Forgets the writes seen so far (a look follows).
    fn drain_writes(&mut self) {
        // `read_events` fails with `WouldBlock` once nothing is queued.
        while let Ok(mut events) = self.writes.read_events(&mut self.events) {
            if events.next().is_none() {
                break;
            }
        }
    }

    /// Sleeps until a file in the workspace is written, at most [`HOST_LOOK_AT_LEAST`].
    fn wait_for_a_write(&self) {
        let mut fds = [libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&self.writes),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one `pollfd` that outlives the call, over a descriptor `self` owns.
        unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                1,
                HOST_LOOK_AT_LEAST.as_millis() as libc::c_int,
            )
        };
    }

    fn data_version(&self) -> i64 {
        self.conn
            .query_row("PRAGMA data_version", [], |r| r.get(0))
            .unwrap()
    }

    fn has_reply(&self, id: &str) -> bool {
        self.conn
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM messages_out WHERE in_reply_to = ?1)")
            .unwrap()
            .query_row([id], |r| r.get(0))
            .unwrap()
    }

    /// Inserts one message; its id.
    fn insert(&mut self) -> String {
        self.sent += 1;
        self.db
            .insert_in(&chat(&format!("bench {}", self.sent)))
            .unwrap()
            .id
    }

    /// Waits until `id` has a reply; panics after [`REPLY_TIMEOUT`].
    fn wait_reply(&mut self, id: &str, since: Instant) {
        let mut version = i64::MIN;
        loop {
            // Before the look: a write after it is still queued for the wait below.
            self.drain_writes();
            let now = self.data_version();
            if now != version {
                version = now;
                if self.has_reply(id) {
                    return;
                }
            }
            if since.elapsed() >= REPLY_TIMEOUT {
                let log =
                    std::fs::read_to_string(self.workspace.join("runner.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                panic!(
                    "no reply to message {} ({id}) within {REPLY_TIMEOUT:?}; the runner's log ends:\n{}",
                    self.sent,
                    tail.join("\n")
                );
            }
            self.wait_for_a_write();
        }
    }

    /// Inserts one message and waits for its reply; insert → reply.
    fn round_trip(&mut self) -> Duration {
        let sent = Instant::now();
        let id = self.insert();
        self.wait_reply(&id, sent);
        sent.elapsed()
    }
}

#[derive(Clone, Copy)]
enum Pause {
    Random,
    Fixed(u64),
}

impl Pause {
    fn label(self) -> String {
        match self {
            Pause::Random => "random 0-300 ms".to_owned(),
            Pause::Fixed(ms) => format!("pause {ms} ms"),
        }
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    percentile(values, 0.5)
}

/// One process's figures on one DB.
struct Figures {
    /// (p50, p99) in ms per phase, in [`phases`] order, over the messages of all rounds.
    latency: Vec<(f64, f64)>,
    /// The p50 in ms of each round, per phase.
    round_p50: Vec<Vec<f64>>,
    idle_cpu_percent: f64,
    cpu_per_message_ms: f64,
    cold_start_ms: f64,
}

fn phases() -> Vec<Pause> {
    let mut phases = vec![Pause::Random];
    phases.extend(PAUSES_MS.map(Pause::Fixed));
    phases
}

/// Messages one process answers in a row before the other takes its turn. The first of each
/// turn is not counted at a fixed pause: the other's turn was its pause.
const TURN: usize = 10;

/// Every figure of each side (who, on the session DB of which workspace), measured
/// interleaved: all run at once, the host serves them in turns of [`TURN`] messages with the
/// same gaps, so a drift of the machine over the run shows in all alike. In `sides`' order.
///
/// The phases run in `RUNNER_BENCH_ROUNDS` rounds, each with freshly started processes, and
/// a phase's percentiles are over the messages of all rounds: two identical floors measured up
/// to 1.29x apart in a single round's phase (`docs/decisions/perf.md#D-PERF-13`), and pooled
/// rounds 0.95-1.06x.
fn measure(sides: &[(Who, &Path)]) -> Vec<Figures> {
    let rounds = knob("RUNNER_BENCH_ROUNDS", 10).max(1) as usize;
    let per_round = |total: u64| (total as usize).div_ceil(rounds).max(2 * TURN);
    let messages = per_round(knob("RUNNER_BENCH_MESSAGES", 800));
    let random_messages = per_round(knob("RUNNER_BENCH_RANDOM_MESSAGES", 400));
    let idle_secs = knob("RUNNER_BENCH_IDLE_SECS", 10).max(1);
    let mut hosts: Vec<Host> = sides.iter().map(|(_, ws)| Host::open(ws)).collect();
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut times = vec![vec![Vec::new(); phases().len()]; sides.len()];
    let mut round_p50 = vec![vec![Vec::with_capacity(rounds); phases().len()]; sides.len()];
    let mut idle_rate = vec![0.0; sides.len()];
    let mut net = vec![0.0; sides.len()];
    let mut answered = 0usize;
    let mut times_file = std::env::var_os("RUNNER_BENCH_TIMES").map(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap()
    });
    for round in 0..rounds {
        let children: Vec<Child> = sides.iter().map(|(who, ws)| who.spawn(ws)).collect();
        let pids: Vec<u32> = children.iter().map(Child::id).collect();
        for host in &mut hosts {
            for _ in 0..WARM_UP {
                host.round_trip();
            }
        }
        if round == 0 {
            // Idle, all at once: let the last reply's aftermath settle first.
            std::thread::sleep(Duration::from_secs(1));
            let before: Vec<_> = pids.iter().map(|pid| procfs::thread_times(*pid)).collect();
            std::thread::sleep(Duration::from_secs(idle_secs));
            for (side, (pid, before)) in pids.iter().zip(&before).enumerate() {
                idle_rate[side] =
                    procfs::cpu_time_since(*pid, before).as_secs_f64() / idle_secs as f64;
            }
        }
        let cpu_before: Vec<_> = pids.iter().map(|pid| procfs::cpu_time(*pid)).collect();
        let wall = Instant::now();
        for (phase, pause) in phases().into_iter().enumerate() {
            let count = match pause {
                Pause::Random => random_messages,
                Pause::Fixed(_) => messages,
            };
            // The same gaps for every side.
            let gaps: Vec<u64> = (0..count)
                .map(|_| match pause {
                    Pause::Random => rng.below(301),
                    Pause::Fixed(ms) => ms,
                })
                .collect();
            let mut this_round = vec![Vec::with_capacity(count); sides.len()];
            for (turn, start) in (0..count).step_by(TURN).enumerate() {
                // Each side takes each place in the serving order in turn: two identical floors
                // served always in the same order measured 0.69-1.01x of each other at single
                // pauses (`RUNNER_BENCH_TWO_FLOORS`), so a fixed order favours a side.
                for place in 0..hosts.len() {
                    let side = (turn + place) % hosts.len();
                    let host = &mut hosts[side];
                    for (k, gap) in gaps[start..count.min(start + TURN)].iter().enumerate() {
                        std::thread::sleep(Duration::from_millis(*gap));
                        let took = host.round_trip().as_secs_f64() * 1000.0;
                        if k > 0 || matches!(pause, Pause::Random) {
                            this_round[side].push(took);
                            if let Some(file) = &mut times_file {
                                writeln!(file, "{side} {phase} {round} {} {took:.4}", start + k)
                                    .unwrap();
                            }
                        }
                    }
                }
            }
            answered += count;
            for (side, mut took) in this_round.into_iter().enumerate() {
                took.sort_by(|a, b| a.total_cmp(b));
                round_p50[side][phase].push(percentile(&took, 0.5));
                times[side][phase].extend(took);
            }
        }
        let elapsed = wall.elapsed().as_secs_f64();
        for (side, pid) in pids.iter().enumerate() {
            let used = (procfs::cpu_time(*pid) - cpu_before[side]).as_secs_f64();
            net[side] += (used - idle_rate[side] * elapsed).max(0.0);
        }
        for child in children {
            stop(child);
        }
    }

    let cold_runs = knob("RUNNER_BENCH_COLD_RUNS", 5).max(1);
    let mut cold = vec![Vec::new(); sides.len()];
    for _ in 0..cold_runs {
        for (side, (who, ws)) in sides.iter().enumerate() {
            let id = hosts[side].insert();
            let spawned = Instant::now();
            let child = who.spawn(ws);
            hosts[side].wait_reply(&id, spawned);
            cold[side].push(spawned.elapsed().as_secs_f64() * 1000.0);
            stop(child);
        }
    }

    times
        .into_iter()
        .zip(round_p50)
        .zip(cold)
        .enumerate()
        .map(|(side, ((phases, round_p50), mut cold))| Figures {
            latency: phases
                .into_iter()
                .map(|mut took| {
                    took.sort_by(|a, b| a.total_cmp(b));
                    (percentile(&took, 0.5), percentile(&took, 0.99))
                })
                .collect(),
            round_p50,
            idle_cpu_percent: idle_rate[side] * 100.0,
            cpu_per_message_ms: net[side] * 1000.0 / answered.max(1) as f64,
            cold_start_ms: median(&mut cold),
        })
        .collect()
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() && b.is_finite() {
        format!("{:.2}x", a / b)
    } else {
        "n/a".to_owned()
    }
}

/// The runner-vs-floor table of one DB.
fn print_side_by_side(title: &str, runner: &Figures, floor: &Figures) {
    println!("\n== {title}: runner (mock) vs floor ==");
    println!(
        "{:<18} {:>11} {:>10} {:>7} {:>11} {:>10} {:>7}   p50 ratio by round",
        "insert→reply", "runner p50", "floor p50", "ratio", "runner p99", "floor p99", "ratio"
    );
    for (i, pause) in phases().into_iter().enumerate() {
        let (rp50, rp99) = runner.latency[i];
        let (fp50, fp99) = floor.latency[i];
        let by_round: Vec<String> = runner.round_p50[i]
            .iter()
            .zip(&floor.round_p50[i])
            .map(|(r, f)| ratio(*r, *f))
            .collect();
        println!(
            "{:<18} {:>8.2} ms {:>7.2} ms {:>7} {:>8.2} ms {:>7.2} ms {:>7}   {}",
            pause.label(),
            rp50,
            fp50,
            ratio(rp50, fp50),
            rp99,
            fp99,
            ratio(rp99, fp99),
            by_round.join(" ")
        );
    }
    println!(
        "{:<18} {:>8.3} ms {:>7.3} ms {:>7}   (CPU per message, net of idle, all phases)",
        "CPU / message",
        runner.cpu_per_message_ms,
        floor.cpu_per_message_ms,
        ratio(runner.cpu_per_message_ms, floor.cpu_per_message_ms)
    );
    println!(
        "{:<18} {:>8.4} %  {:>7.4} %  {:>7}   (% of one core)",
        "idle CPU",
        runner.idle_cpu_percent,
        floor.idle_cpu_percent,
        ratio(runner.idle_cpu_percent, floor.idle_cpu_percent)
    );
    println!(
        "{:<18} {:>8.1} ms {:>7.1} ms {:>7}   (spawn → reply, a message waiting; median)",
        "cold start",
        runner.cold_start_ms,
        floor.cold_start_ms,
        ratio(runner.cold_start_ms, floor.cold_start_ms)
    );
}

/// The `big / empty` table: each figure on the big DB against the empty one, per side, and
/// the first side's growth against the second's (the runner's against the floor's): what the
/// runner adds to the growth of the DB work itself (`docs/decisions/db.md#D-DB-08`).
fn print_scaling(rows: u64, empty: &[(&str, &Figures)], big: &[(&str, &Figures)]) {
    println!(
        "\n== {rows} completed rows per table vs an empty DB (ratio big / empty; target ≤ 1.10x) =="
    );
    print!("{:<18}", "");
    for (name, _) in empty {
        print!(
            " {:>10} {:>10} {:>7}",
            format!("{name} empty"),
            format!("{name} big"),
            "ratio"
        );
    }
    if let [(first, _), (second, _)] = empty {
        print!("  {:>9}", format!("{first}/{second}"));
    }
    println!();
    let line = |label: String, get: &dyn Fn(&Figures) -> f64| {
        print!("{label:<18}");
        let mut growth = Vec::with_capacity(empty.len());
        for ((_, e), (_, b)) in empty.iter().zip(big) {
            let (e, b) = (get(e), get(b));
            print!(" {e:>10.3} {b:>10.3} {:>7}", ratio(b, e));
            growth.push(b / e);
        }
        if let [first, second] = growth[..] {
            print!("  {:>9}", ratio(first, second));
        }
        println!();
    };
    for (i, pause) in phases().into_iter().enumerate() {
        line(format!("{} p50", pause.label()), &|f| f.latency[i].0);
        line(format!("{} p99", pause.label()), &|f| f.latency[i].1);
    }
    line("CPU/msg ms".to_owned(), &|f| f.cpu_per_message_ms);
    line("idle CPU %".to_owned(), &|f| f.idle_cpu_percent);
    line("cold start ms".to_owned(), &|f| f.cold_start_ms);
}

/// A workspace with an empty session DB.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("runner-bench-")
        .tempdir()
        .unwrap();
    SessionDb::open(dir.path().join("session.db")).unwrap();
    dir
}

/// Fills the DB with `rows` completed rows in each table the runner reads per message, in one
/// transaction. Seqs follow the contract (even in, odd out), so new rows are allocated above.
fn fill(db_path: &Path, rows: u64) {
    let conn = rusqlite::Connection::open(db_path).unwrap();
    conn.execute_batch("PRAGMA journal_mode=WAL; BEGIN IMMEDIATE;")
        .unwrap();
    let ts = "'2026-01-01T00:00:00.000Z'";
    let series =
        format!("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows})");
    for statement in [
        format!(
            "{series} INSERT INTO messages_in (id, seq, kind, timestamp, status, status_changed, tries, trigger, content)
             SELECT 'old-in-' || i, 2 * i, 'chat', {ts}, 'completed', {ts}, 1, 1,
                    '{{\"sender\":\"Bench\",\"text\":\"old ' || i || '\"}}' FROM n"
        ),
        format!(
            "{series} INSERT INTO messages_out (id, seq, in_reply_to, timestamp, kind, content)
             SELECT 'old-out-' || i, 2 * i - 1, 'old-in-' || i, {ts}, 'chat',
                    '{{\"text\":\"reply ' || i || '\"}}' FROM n"
        ),
        format!(
            "{series} INSERT INTO delivered (message_out_id, platform_message_id, status, delivered_at)
             SELECT 'old-out-' || i, 'p' || i, 'delivered', {ts} FROM n"
        ),
        format!(
            "{series} INSERT INTO session_state (key, value, updated_at)
             SELECT 'bench:' || i, '{{}}', {ts} FROM n"
        ),
    ] {
        conn.execute(&statement, []).unwrap();
    }
    conn.execute_batch("COMMIT; PRAGMA wal_checkpoint(TRUNCATE);")
        .unwrap();
}

/// RSS of `who` after `total / 10` and after `total` sequential messages (pause 0), in bytes.
fn rss_growth(who: Who, total: usize) -> (u64, u64) {
    let dir = workspace();
    let mut host = Host::open(dir.path());
    let child = who.spawn(dir.path());
    let pid = child.id();
    let first = total / 10;
    let mut at_first = 0;
    for i in 1..=total {
        host.round_trip();
        if i == first {
            at_first = procfs::rss(pid);
        }
    }
    let at_total = procfs::rss(pid);
    stop(child);
    (at_first, at_total)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn print_rss(label: &str, total: usize, (first, last): (u64, u64)) {
    let growth = last as f64 - first as f64;
    println!(
        "{label:<28} after {:>6}: {:>7.2} MiB   after {total:>6}: {:>7.2} MiB   growth {:>+8.1} KiB ({:+.2} MiB; target within 1 MiB)",
        total / 10,
        mib(first),
        mib(last),
        growth / 1024.0,
        growth / (1024.0 * 1024.0)
    );
}

fn main() {
    support::floor::run_if_requested();
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // Kept until the end of the run (the CLI phase's child makes its own).
    let pinned = tempfile::Builder::new()
        .prefix("runner-bench-bin-")
        .tempdir()
        .unwrap();
    if let Err(err) = pin_binaries(pinned.path()) {
        println!(
            "(cannot copy the binaries aside; a rebuild during the run would disturb it: {err})"
        );
    }
    if std::env::var_os(CLI_CHILD).is_some() {
        cli_rss();
        return;
    }

    if knob("RUNNER_BENCH_MESSAGES", 800) > 0 {
        latency_and_cpu();
    }

    let total = knob("RUNNER_BENCH_RSS_MESSAGES", 10_000) as usize;
    if total > 0 {
        println!("\n== RSS (VmRSS) growth, sequential messages ==");
        print_rss("runner (mock)", total, rss_growth(Who::Runner, total));
        print_rss("floor", total, rss_growth(Who::Floor, total));
    }

    let cli = std::env::var("RUNNER_BENCH_CLI").unwrap_or_else(|_| "codex".to_owned());
    if cli != "none" {
        run_cli_rss(&cli);
    }
}

/// The latency, CPU and cold-start tables: the runner and the floor on an empty DB and, unless
/// `RUNNER_BENCH_ROWS=0`, on a big one, all four interleaved (each on its own copy of its DB),
/// so `big / empty` compares the same minutes too.
fn latency_and_cpu() {
    if knob("RUNNER_BENCH_TWO_FLOORS", 0) == 1 {
        println!("\n(RUNNER_BENCH_TWO_FLOORS=1: the runner's columns are a second floor)");
    }
    let runner_empty_ws = workspace();
    let floor_empty_ws = workspace();
    let rows = knob("RUNNER_BENCH_ROWS", 1_000_000);
    let big = (rows > 0).then(|| {
        let runner_big = workspace();
        let started = Instant::now();
        fill(&runner_big.path().join("session.db"), rows);
        let floor_big = copy_of(runner_big.path());
        println!(
            "\n(built {rows} rows in each of messages_in, messages_out, delivered, session_state, and a copy for the floor, in {:.1} s)",
            started.elapsed().as_secs_f64()
        );
        (runner_big, floor_big)
    });
    let mut sides = vec![
        (Who::Runner, runner_empty_ws.path()),
        (Who::Floor, floor_empty_ws.path()),
    ];
    if let Some((runner_big, floor_big)) = &big {
        sides.push((Who::Runner, runner_big.path()));
        sides.push((Who::Floor, floor_big.path()));
    }
    if let Some(baseline) = std::env::var_os("RUNNER_BENCH_BASELINE") {
        println!(
            "\n(RUNNER_BENCH_BASELINE: the floor's columns are the runner build {})",
            Path::new(&baseline).display()
        );
    }
    let figures = match placement() {
        Some(placement) => {
            println!(
                "\n(the runner and the floor on CPU {}, the host on CPU {}; RUNNER_BENCH_PIN=0 lets the scheduler place them)",
                placement.measured, placement.host
            );
            placement.as_host(|| measure(&sides))
        }
        None => measure(&sides),
    };
    print_side_by_side("empty DB", &figures[0], &figures[1]);
    if let [runner_empty, floor_empty, runner_big, floor_big] = &figures[..] {
        print_side_by_side(&format!("{rows} rows per table"), runner_big, floor_big);
        print_scaling(
            rows,
            &[("runner", runner_empty), ("floor", floor_empty)],
            &[("runner", runner_big), ("floor", floor_big)],
        );
    }
}

/// A workspace holding a copy of `workspace`'s session DB (checkpointed: no WAL beside it).
fn copy_of(workspace: &Path) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("runner-bench-")
        .tempdir()
        .unwrap();
    std::fs::copy(workspace.join("session.db"), dir.path().join("session.db")).unwrap();
    dir
}

/// Set when this bench runs as the real-CLI RSS phase (inside the namespace when possible).
const CLI_CHILD: &str = "RUNNER_BENCH_CLI_CHILD";

/// Runs [`cli_rss`] in a child of this bench inside a loopback-only network namespace (as the
/// e2e tests do), or here when none can be made.
fn run_cli_rss(cli: &str) {
    // The pinned copy of this bench (a rebuild may have replaced the original).
    let exe = support::floor::command(Path::new(""))
        .get_program()
        .to_owned();
    let mut command = match e2e::harness::netns_prefix() {
        Some(prefix) => {
            let mut command = Command::new(prefix[0]);
            command
                .args(&prefix[1..])
                .args(["sh", "-c", "ip link set lo up && exec \"$@\"", "sh"])
                .arg(&exe)
                .env("NANOCLAW_IN_NETNS", "1");
            command
        }
        None => {
            println!("(no loopback-only network namespace: the CLI runs with its traffic-off settings only)");
            Command::new(&exe)
        }
    };
    let status = command
        .arg("--bench")
        .env(CLI_CHILD, cli)
        .stdin(Stdio::null())
        .status();
    if !matches!(status, Ok(status) if status.success()) {
        println!("(the real-CLI RSS phase failed: {status:?})");
    }
}

/// The runner's RSS with a real CLI against the fake model, the CLI's memory aside.
fn cli_rss() {
    let cli = std::env::var(CLI_CHILD).unwrap_or_else(|_| "codex".to_owned());
    let total = knob("RUNNER_BENCH_CLI_MESSAGES", 1_000) as usize;
    let Some(_) = e2e::harness::provider_cli(&cli) else {
        println!("(NANOCLAW_SKIP_CLI_TESTS=1: no real-CLI RSS figure)");
        return;
    };
    let model = e2e::fake_model::FakeModel::start().unwrap();
    model.set_default_text("pong");
    // Every logged request holds the whole conversation: unlimited, the log took this bench's
    // memory (and the machine's) near the 3,500th message.
    model.set_log_limit(Some(16));
    let session = e2e::harness::Session::new();
    let env = session.runner_env(&cli, &model);
    let mut env: BTreeMap<String, String> = env;
    env.insert("RUST_LOG".to_owned(), "info".to_owned());
    let log = std::fs::File::create(session.workspace.join("runner.log")).unwrap();
    let child = runner_command(&runner_exe(), &session.workspace, &cli, &env, log)
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut host = Host::open(&session.workspace);
    let started = Instant::now();
    let first = total / 10;
    let (mut at_first, mut cli_at_first) = (0, 0);
    // The runner's RSS at every tenth of the run: a step while caches fill differs from a climb.
    let mut curve = Vec::new();
    for i in 1..=total {
        host.round_trip();
        if i == first {
            at_first = procfs::rss(pid);
            cli_at_first = descendants_rss(pid);
        }
        if first > 0 && i % first == 0 {
            curve.push(format!("{i}: {:.2}", mib(procfs::rss(pid))));
        }
    }
    let at_total = procfs::rss(pid);
    let cli_at_total = descendants_rss(pid);
    let took = started.elapsed();
    stop(child);
    println!(
        "\n== RSS with a real CLI ({cli} against the fake model; {total} messages in {:.0} s) ==",
        took.as_secs_f64()
    );
    print_rss(&format!("runner ({cli})"), total, (at_first, at_total));
    println!(
        "{:<28} after {:>6}: {:>7.2} MiB   after {total:>6}: {:>7.2} MiB   (the CLI and its children, aside)",
        format!("{cli} CLI"),
        total / 10,
        mib(cli_at_first),
        mib(cli_at_total),
    );
    println!("runner RSS (MiB) by messages: {}", curve.join(", "));
}

/// Summed RSS of every descendant of `pid` (the CLI, mcp-tools, …).
fn descendants_rss(pid: u32) -> u64 {
    e2e::harness::descendants(pid)
        .into_iter()
        .map(|(child, _)| procfs::rss(child))
        .sum()
}
