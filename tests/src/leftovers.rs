//! Scenarios of processes that outlive a run: after SIGKILL and a restart, or SIGTERM, nothing
//! the old run started remains (issue 10, point 3).
//!
//! The model makes the agent start background processes through its CLI's shell tool, each the
//! way an agent escapes its CLI's clean-up: a plain `&` job, `setsid` (a session of its own),
//! `nohup sh -c` and `env -i setsid` (no environment, so no session marker: only the runner's
//! ledger knows it). Their pids go to a file, so the test knows them. The processes are
//! `tail -f /dev/null`: Claude's Bash tool refuses a command that starts with `sleep N`.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::fake_model::{FakeModel, Step};
use crate::harness::{alive, processes_with_env, text_of, Session};
use crate::support::{ok, some, WAIT};

/// The bound the issue sets on a graceful stop leaving nothing behind.
const STOP_BOUND: Duration = Duration::from_secs(5);

/// How the background processes were started, in the order of their pids in the file.
const HOW: [&str; 4] = [
    "tail &",
    "setsid tail &",
    "nohup sh -c &",
    "env -i setsid tail &",
];

/// The shell command that starts the background processes and writes their pids to `pids`.
fn background_command(pids: &Path) -> String {
    let file = pids.display();
    format!(
        "tail -f /dev/null >/dev/null 2>&1 & echo $! > {file}.tmp; \
         setsid tail -f /dev/null >/dev/null 2>&1 & echo $! >> {file}.tmp; \
         nohup sh -c 'tail -f /dev/null' >/dev/null 2>&1 & echo $! >> {file}.tmp; \
         env -i setsid tail -f /dev/null >/dev/null 2>&1 & echo $! >> {file}.tmp; \
         mv {file}.tmp {file}; echo started"
    )
}

/// The model step that runs `command` with the CLI's builtin shell tool.
fn shell_step(provider: &str, command: &str) -> Step {
    match provider {
        "claude" => Step::raw_tool_call(
            "Bash",
            json!({"command": command, "description": "start background jobs"}),
        ),
        "codex" => Step::raw_tool_call("exec_command", json!({"cmd": command})),
        "opencode" => Step::raw_tool_call(
            "bash",
            json!({"command": command, "description": "start background jobs"}),
        ),
        other => panic!("no shell tool known for provider {other}: add it to shell_step"),
    }
}

/// The session marker the runner gives every process it starts (its DB's identity).
fn session_mark(session: &Session) -> String {
    use std::os::unix::fs::MetadataExt;
    let meta = ok(
        std::fs::metadata(session.workspace.join("session.db")),
        "the session DB",
    );
    format!("NANOCLAW_SESSION_MARK=db-{:x}-{:x}", meta.dev(), meta.ino())
}

/// Starts a runner (heartbeat 1 s, so the ledger is fresh), has the agent start the background
/// processes, and returns the pids still running after the turn (with how each was started).
fn start_background_processes(
    provider: &str,
    session: &mut Session,
    model: &FakeModel,
) -> Vec<(u32, &'static str)> {
    session.start_runner(provider, model, &[("NANOCLAW_HEARTBEAT_SECS", "1")]);
    let id = session.send_chat("start the background jobs").id;
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "Started.");
    let file = session.workspace.join("agent/leftover.pids");
    let Ok(text) = std::fs::read_to_string(&file) else {
        let results = model
            .model_requests()
            .iter()
            .flat_map(|r| r.tool_results())
            .collect::<Vec<_>>();
        panic!(
            "{provider}: the shell command wrote no pids; tool results: {results:?}\n{}",
            session.runner_log()
        );
    };
    let pids: Vec<u32> = text
        .split_whitespace()
        .map(|pid| ok(pid.parse::<u32>(), "a pid"))
        .collect();
    assert_eq!(pids.len(), HOW.len(), "pids: {text}");
    // Let the CLI's own clean-up of the tool call happen first.
    std::thread::sleep(Duration::from_millis(500));
    let running: Vec<(u32, &str)> = pids
        .into_iter()
        .zip(HOW)
        .filter(|(pid, _)| alive(*pid))
        .collect();
    eprintln!("{provider}: still running after the turn: {running:?}");
    // The escapes the CLI cannot clean up itself must be there, or the test proves nothing.
    for how in ["setsid tail &", "env -i setsid tail &"] {
        assert!(
            running.iter().any(|(_, h)| *h == how),
            "the `{how}` process is not running after the turn: {running:?}\n{}",
            session.runner_log()
        );
    }
    running
}

fn model_for(session: &Session, provider: &str) -> FakeModel {
    let command = background_command(&session.workspace.join("agent/leftover.pids"));
    ok(
        FakeModel::start_with_script([shell_step(provider, &command), Step::text("Started.")]),
        "starting the fake model",
    )
}

/// Kills the leftovers a failed assertion would leave on the machine.
struct KillOnDrop(Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// (a) The agent's background processes survive a SIGKILL of the runner (they left the CLI's
/// process group); the next runner of the session kills every one of them at startup (the
/// `env -i` one through the ledger) and logs their pids.
pub fn sigkill_then_restart_leaves_no_process_of_the_old_run(provider: &str) {
    let mut session = Session::new();
    let model = model_for(&session, provider);
    let running = start_background_processes(provider, &mut session, &model);
    let _guard = KillOnDrop(running.iter().map(|(pid, _)| *pid).collect());
    // Two heartbeats: the ledger holds the unmarked process.
    std::thread::sleep(Duration::from_millis(2500));
    session.kill_runner();
    std::thread::sleep(Duration::from_millis(300));
    let orphaned: Vec<_> = running.iter().filter(|(pid, _)| alive(*pid)).collect();
    assert!(
        !orphaned.is_empty(),
        "every background process died with the runner: nothing to test"
    );
    model.set_default_text("Fresh start.");
    let restarted = Instant::now();
    session.start_runner(provider, &model, &[]);
    let deadline = restarted + Duration::from_secs(5);
    loop {
        let left: Vec<_> = running.iter().filter(|(pid, _)| alive(*pid)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{provider}: processes of the old run still alive 5 s after the restart: {left:?}\n{}",
            session.runner_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "{provider}: the old run's processes were gone {:.2?} after the restart",
        restarted.elapsed()
    );
    let line = session.wait_log_line("the kill's log line", WAIT, |l| {
        l.contains("killed processes a previous run of this session left behind")
    });
    for (pid, how) in &orphaned {
        assert!(
            line.contains(&pid.to_string()),
            "{how} ({pid}) is not in: {line}"
        );
    }
    // The restarted runner still works.
    let id = session.send_chat("still there?").id;
    assert_eq!(text_of(&session.wait_reply(&id, WAIT)), "Fresh start.");
    session.stop_runner();
}

/// (b) SIGTERM: within 5 s nothing the run started remains, neither the agent's background
/// processes nor anything carrying the session's marker, and the status is `stopped`.
pub fn sigterm_leaves_no_process_of_the_run_within_5s(provider: &str) {
    let mut session = Session::new();
    let model = model_for(&session, provider);
    let running = start_background_processes(provider, &mut session, &model);
    let _guard = KillOnDrop(running.iter().map(|(pid, _)| *pid).collect());
    let mark = session_mark(&session);
    let marked = processes_with_env(&mark);
    assert!(
        !marked.is_empty(),
        "no process carries the session marker {mark}"
    );
    let stopping = Instant::now();
    let (took, status) = some(
        session.stop_runner_timed(),
        "the runner to exit within 10 s of SIGTERM",
    );
    assert!(status.success(), "exit {status}\n{}", session.runner_log());
    loop {
        let left: Vec<_> = running.iter().filter(|(pid, _)| alive(*pid)).collect();
        let marked = processes_with_env(&mark);
        if left.is_empty() && marked.is_empty() {
            break;
        }
        assert!(
            stopping.elapsed() < STOP_BOUND,
            "{provider}: 5 s after SIGTERM still alive: {left:?}, marked {marked:?}\n{}",
            session.runner_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "{provider}: runner exited {took:.2?} after SIGTERM; nothing of the run left after {:.2?}",
        stopping.elapsed()
    );
    let state = some(
        ok(session.db.runner_state(), "reading the runner state"),
        "a runner state",
    );
    assert_eq!(state.status, "stopped");
}
