//! `agent-runner` (`run` and `health`) refuses a session DB on a FUSE mount, exit 78 with the
//! filesystem and the fix named, and creates nothing there; on tmpfs it serves the session
//! (docs/contract/db.md, "Where the DB may live"). The FUSE case mounts a real bindfs
//! (scripts/install-test-tools.sh) and needs root; where the machine cannot mount, it says so
//! and skips that case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::binary;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use binary::{mock_runner, sigterm, wait_until};
use fsguard::testing::{tmpfs_dir, FuseMount};
use schema::{NewMessageIn, SessionDb};
use serde_json::json;

/// Kills the runner if a test fails before it exits.
struct Runner(Child);

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the runner to its end, at most 30 s: a runner that serves instead of refusing would
/// never end on its own.
fn run_to_end(mut command: Command) -> Output {
    let mut child = Runner(
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.0.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the runner did not exit: it served the DB"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let Runner(child) = &mut child;
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    Output {
        status: child.wait().unwrap(),
        stdout: Vec::new(),
        stderr: stderr.into_bytes(),
    }
}

fn runner(workspace: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agent-runner"));
    command
        .arg("--workspace")
        .arg(workspace)
        .arg("--provider")
        .arg("mock")
        .args(args)
        .env_remove("SESSION_DB")
        .env("RUST_LOG", "warn");
    command
}

/// The names in a folder, sorted: what a refused runner must not change.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn session_with_one_message(ws: &Path) -> String {
    std::fs::create_dir_all(ws.join("agent")).unwrap();
    let db = SessionDb::open(ws.join("session.db")).unwrap();
    db.insert_in(&NewMessageIn::new(
        "chat",
        json!({"sender": "Ann", "text": "hello"}).to_string(),
    ))
    .unwrap()
    .id
}

fn assert_refused(what: &str, out: &Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{what}: {err}");
    assert!(
        err.contains("is on fuse.bindfs (a FUSE filesystem")
            && err.contains("run `nanoclaw serve` there"),
        "{what}: {err}"
    );
}

#[test]
fn the_runner_refuses_a_session_on_fuse_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (source, mount_point) = (dir.path().join("src"), dir.path().join("mnt"));
    std::fs::create_dir_all(&mount_point).unwrap();
    let id = session_with_one_message(&source);
    let before = listing(&source);
    let mount = match FuseMount::bindfs(&source, &mount_point) {
        Ok(mount) => mount,
        Err(why) => {
            eprintln!("SKIPPED: the FUSE case of agent-runner's shared-filesystem check: {why}");
            return;
        }
    };
    assert_refused("run", &run_to_end(runner(&mount_point, &[])));
    assert_refused("health", &run_to_end(runner(&mount_point, &["health"])));
    // With createSessionDb, on a folder to be made: refused before the DB is created.
    let fresh = mount_point.join("fresh");
    std::fs::create_dir_all(&fresh).unwrap();
    assert_refused(
        "run with createSessionDb",
        &run_to_end(runner(
            &mount_point,
            &[
                "--db",
                fresh.join("session.db").to_str().unwrap(),
                "--set",
                "createSessionDb=true",
            ],
        )),
    );
    assert!(listing(&source.join("fresh")).is_empty());
    drop(mount);
    std::fs::remove_dir(source.join("fresh")).unwrap();
    // No lock file, `-wal` or `-shm` appeared; the message was never claimed.
    assert_eq!(listing(&source), before);
    let db = SessionDb::open(source.join("session.db")).unwrap();
    assert!(db.runner_state().unwrap().is_none());
    assert_eq!(db.message_in(&id).unwrap().unwrap().status, "pending");
}

#[test]
fn the_runner_serves_a_session_on_tmpfs() {
    let tmp = match tmpfs_dir() {
        Ok(tmp) => tmp,
        Err(why) => {
            eprintln!("SKIPPED: the tmpfs case of agent-runner's shared-filesystem check: {why}");
            return;
        }
    };
    let ws = tmp.path();
    let id = session_with_one_message(ws);
    let db = SessionDb::open(ws.join("session.db")).unwrap();
    let runner = Runner(
        mock_runner(ws, &ws.join("runner.log"))
            .args(["--set", "heartbeatSecs=1"])
            .spawn()
            .unwrap(),
    );
    wait_until("the reply", Duration::from_secs(30), || {
        !db.messages_out_after(0, 10).unwrap().is_empty()
    });
    let health = run_to_end(runner_health(ws));
    assert_eq!(
        health.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&health.stderr)
    );
    let mut runner = runner;
    sigterm(&runner.0);
    assert!(runner.0.wait().unwrap().success());
    assert_eq!(db.message_in(&id).unwrap().unwrap().status, "completed");
}

fn runner_health(ws: &Path) -> Command {
    let mut command = runner(ws, &["health"]);
    command.stdout(Stdio::null());
    command
}
