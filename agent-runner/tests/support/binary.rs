//! The `agent-runner` binary as the process tests run it, shared by the test files that spawn
//! it (each includes this file with `#[path]`).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// `agent-runner --workspace <workspace> --provider mock` at `RUST_LOG=info`, stdin and stdout
/// closed, stderr appended to `log` (a pipe nobody drains would block it). Callers add
/// arguments and environment, then spawn.
pub(crate) fn mock_runner(workspace: &Path, log: &Path) -> Command {
    runner_at(
        Path::new(env!("CARGO_BIN_EXE_agent-runner")),
        workspace,
        log,
    )
}

/// [`mock_runner`] with the `agent-runner` binary at `program`.
pub(crate) fn runner_at(program: &Path, workspace: &Path, log: &Path) -> Command {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut cmd = Command::new(program);
    cmd.arg("--workspace")
        .arg(workspace)
        .arg("--provider")
        .arg("mock")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    cmd
}

/// Waits for `cond`, failing the test after `timeout`.
pub(crate) fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends SIGTERM to `child`.
pub(crate) fn sigterm(child: &Child) {
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
}

/// `PRAGMA integrity_check` of the DB at `db`, from a connection of its own.
pub(crate) fn integrity_check(db: &Path) -> String {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap()
}
