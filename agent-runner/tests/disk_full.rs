//! A full disk under the session DB (issue 9, point 5), with the real binary and the mock
//! provider: the DB lives on a small tmpfs that the test fills while a turn runs. The runner
//! must stay up, keep the reply in memory, and write it once space returns, without running the
//! turn again. Each test mounts its own tmpfs, in a private mount namespace when it can.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use schema::{NewMessageIn, SessionDb};
use serde_json::json;

/// Set in the copy of a test re-run inside a private mount namespace: where to mount.
const INNER_DIR: &str = "NANOCLAW_TEST_TMPFS_DIR";
/// Printed by that copy once its tmpfs is mounted (so the outer run knows the namespace worked).
const MOUNTED: &str = "tmpfs mounted for the disk-full test";
/// Printed by that copy when it could not mount.
const UNAVAILABLE: &str = "tmpfs unavailable for the disk-full test:";
/// Room for the DB, its WAL and the lock; the rest of the disk-full state is the filler.
const TMPFS_OPTIONS: &str = "size=4m,mode=0700";

fn mount_tmpfs(dir: &Path) -> Result<(), String> {
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", TMPFS_OPTIONS, "tmpfs"])
        .arg(dir)
        .output()
        .map_err(|err| format!("mount: {err}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "mount -t tmpfs: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Unmounts a plain (not namespaced) tmpfs mount on the way out, even when the test fails.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Runs `body` with a small tmpfs mounted on an empty folder. First choice: this test re-run
/// by `unshare --mount` in a private mount namespace, so the mount dies with it whatever
/// happens; then a plain mount, unmounted on drop; else the test is skipped with the reason.
fn with_small_tmpfs(test: &str, body: impl FnOnce(&Path)) {
    if let Ok(dir) = std::env::var(INNER_DIR) {
        let dir = PathBuf::from(dir);
        match mount_tmpfs(&dir) {
            Ok(()) => {
                eprintln!("{MOUNTED}");
                body(&dir);
            }
            Err(reason) => eprintln!("{UNAVAILABLE} {reason}"),
        }
        return;
    }
    let outer = tempfile::tempdir().unwrap();
    let dir = outer.path().join("tmpfs");
    std::fs::create_dir(&dir).unwrap();
    let mut reasons = Vec::new();
    let namespaced = Command::new("unshare")
        .args(["--mount", "--propagation", "private"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(INNER_DIR, &dir)
        .output();
    match namespaced {
        Ok(out) => {
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            if stderr.contains(MOUNTED) {
                eprint!("{stderr}");
                assert!(
                    out.status.success(),
                    "{test} failed in its mount namespace ({}):\n{stdout}\n{stderr}",
                    out.status
                );
                return;
            }
            reasons.push(format!("unshare --mount: {}", stderr.trim()));
        }
        Err(err) => reasons.push(format!("unshare: {err}")),
    }
    match mount_tmpfs(&dir) {
        Ok(()) => {
            let _unmount = Unmount(dir.clone());
            body(&dir);
        }
        Err(reason) => {
            reasons.push(reason);
            eprintln!(
                "SKIPPED {test}: no small tmpfs can be mounted here ({})",
                reasons.join("; ")
            );
        }
    }
}

/// The runner as a child process, killed if the test fails; its log is a file outside the
/// tmpfs (a full disk must not cost the log).
struct Runner {
    child: Child,
    log: PathBuf,
}

impl Runner {
    fn start(work: &Path, db: &Path, name: &str, env: &[(&str, &str)]) -> Self {
        let log = work.join(format!("{name}.log"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agent-runner"));
        cmd.arg("--workspace")
            .arg(work)
            .arg("--db")
            .arg(db)
            .arg("--provider")
            .arg("mock")
            .env("RUST_LOG", "info")
            .env("NANOCLAW_HEARTBEAT_SECS", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (key, value) in env {
            cmd.env(key, value);
        }
        Self {
            child: cmd.spawn().unwrap(),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics (with the log) when the runner has exited.
    fn assert_alive(&mut self, when: &str) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "the runner exited ({status}) {when}; its log:\n{}",
                self.log()
            );
        }
    }

    fn sigterm(&mut self) -> std::process::ExitStatus {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM).unwrap();
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "still running 5 s after SIGTERM; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes a filler file until the file system says it is full; returns its size.
fn fill(dir: &Path) -> (PathBuf, u64) {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0xA5u8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(err) if err.kind() == std::io::ErrorKind::StorageFull => break,
            Err(err) => panic!("filling the tmpfs: {err}"),
        }
    }
    (path, written)
}

const FULL_WARNING: &str = "session DB disk full";
const WRITABLE_AGAIN: &str = "session DB writable again";

/// Starts a runner on a DB in `fs`, sends one message and fills the disk once the turn is under
/// way (claimed, status busy, continuation written: the next write of the turn is the reply).
/// Returns the runner, the DB handle, the message id and the filler file.
fn turn_on_a_full_disk(
    fs: &Path,
    work: &Path,
    marker: &str,
) -> (Runner, SessionDb, String, PathBuf) {
    let db_path = fs.join("session.db");
    let db = SessionDb::open(&db_path).unwrap();
    let mut runner = Runner::start(
        work,
        &db_path,
        "runner-1",
        &[("NANOCLAW_MOCK_DELAY_MS", "1500")],
    );
    wait_until("the runner to start", Duration::from_secs(10), || {
        db.runner_state().unwrap().is_some()
    });
    let id = db
        .insert_in(&NewMessageIn::new(
            "chat",
            json!({"sender": "Ann", "text": marker}).to_string(),
        ))
        .unwrap()
        .id;
    wait_until("the turn to start", Duration::from_secs(10), || {
        db.runner_state().unwrap().unwrap().status == "busy"
            && db.continuation("mock").unwrap().is_some()
    });
    let (filler, size) = fill(fs);
    eprintln!("filled the tmpfs with {size} bytes while the turn runs");
    // The mock answers 1.5 s after the prompt: the reply write is what meets the full disk.
    wait_until("the disk-full warning", Duration::from_secs(10), || {
        runner.assert_alive("on a full disk");
        runner.log().contains(FULL_WARNING)
    });
    (runner, db, id, filler)
}

#[test]
fn a_full_disk_delays_the_reply_and_neither_kills_the_runner_nor_reruns_the_turn() {
    with_small_tmpfs(
        "a_full_disk_delays_the_reply_and_neither_kills_the_runner_nor_reruns_the_turn",
        |fs| {
            let work = tempfile::tempdir().unwrap();
            let marker = "full-disk marker 7f3a";
            let (mut runner, db, id, filler) = turn_on_a_full_disk(fs, work.path(), marker);
            // Past the mock's answer, several heartbeat ticks and write retries later.
            std::thread::sleep(Duration::from_millis(500));
            let stale = db.runner_state().unwrap().unwrap().heartbeat_at;
            std::thread::sleep(Duration::from_secs(3));
            runner.assert_alive("while the disk is full");
            let row = db.message_in(&id).unwrap().unwrap();
            assert_eq!(row.status, "processing");
            assert!(db.replies_to(&id).unwrap().is_empty());
            let state = db.runner_state().unwrap().unwrap();
            assert_eq!(
                state.heartbeat_at, stale,
                "the heartbeat was written on a full disk?"
            );
            assert_eq!(state.status, "busy");
            let log = runner.log();
            assert_eq!(
                log.matches(FULL_WARNING).count(),
                1,
                "the condition is logged once, not per retry or tick:\n{log}"
            );

            std::fs::remove_file(&filler).unwrap();
            let freed = Instant::now();
            wait_until(
                "the reply after space returns",
                Duration::from_secs(10),
                || db.message_in(&id).unwrap().unwrap().status == "completed",
            );
            eprintln!("reply written {:?} after space returned", freed.elapsed());
            runner.assert_alive("after space returned");
            let replies = db.replies_to(&id).unwrap();
            assert_eq!(replies.len(), 1, "{replies:?}");
            assert_eq!(db.all_messages_out().unwrap().len(), 1);
            assert_eq!(
                replies[0].content.matches(marker).count(),
                1,
                "the mock echoes one prompt: {}",
                replies[0].content
            );
            // Claimed once: the turn was not run again.
            assert_eq!(db.message_in(&id).unwrap().unwrap().tries, 1);
            wait_until("a fresh heartbeat", Duration::from_secs(5), || {
                db.runner_state().unwrap().unwrap().heartbeat_at != stale
            });
            // The line is logged after the write commits, by the log's writer thread: it may
            // trail what the DB already shows.
            wait_until("the writable-again line", Duration::from_secs(5), || {
                runner.log().contains(WRITABLE_AGAIN)
            });
            let log = runner.log();
            assert_eq!(log.matches(FULL_WARNING).count(), 1, "{log}");
            assert_eq!(log.matches(WRITABLE_AGAIN).count(), 1, "{log}");
            for line in log.lines().filter(|l| l.contains("session DB")) {
                eprintln!("runner: {line}");
            }

            let status = runner.sigterm();
            assert!(status.success(), "{status}: {}", runner.log());
            assert_eq!(db.runner_state().unwrap().unwrap().status, "stopped");
            let conn = db.dedicated_connection().unwrap();
            let check: String = conn
                .query_row("PRAGMA integrity_check", [], |r| r.get(0))
                .unwrap();
            assert_eq!(check, "ok");
        },
    );
}

#[test]
fn stopping_on_a_full_disk_leaves_the_turn_to_the_next_start() {
    with_small_tmpfs(
        "stopping_on_a_full_disk_leaves_the_turn_to_the_next_start",
        |fs| {
            let work = tempfile::tempdir().unwrap();
            let marker = "stopped while full 91c2";
            let (mut runner, db, id, filler) = turn_on_a_full_disk(fs, work.path(), marker);
            std::thread::sleep(Duration::from_millis(500));
            let status = runner.sigterm();
            // A requested stop is a clean exit even though `stopped` could not be written.
            assert!(status.success(), "{status}: {}", runner.log());
            assert!(runner
                .log()
                .contains("stopping while the session DB's disk is full"));
            // Crash semantics: the row stays processing, no reply; the next start resets it.
            assert_eq!(db.message_in(&id).unwrap().unwrap().status, "processing");
            assert!(db.replies_to(&id).unwrap().is_empty());

            std::fs::remove_file(&filler).unwrap();
            let db_path = fs.join("session.db");
            let mut second = Runner::start(work.path(), &db_path, "runner-2", &[]);
            wait_until(
                "the reply from the next start",
                Duration::from_secs(10),
                || db.message_in(&id).unwrap().unwrap().status == "completed",
            );
            assert_eq!(db.replies_to(&id).unwrap().len(), 1);
            assert_eq!(db.message_in(&id).unwrap().unwrap().tries, 2);
            assert!(second.sigterm().success());
        },
    );
}
