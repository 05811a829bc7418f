//! Issue 9.4: the DB the runner serves is the DB the host writes. A missing DB is refused (or
//! created on request), a corrupt one fails at once, a deleted or replaced one makes the runner
//! exit (releasing its lock), and one runner owns a DB by identity, whatever name reaches it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::binary;

use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use schema::{NewMessageIn, SessionDb};
use serde_json::json;

/// Starts the runner on `db`, logging to `<dir>/<log>`.
fn runner(dir: &Path, db: &Path, log: &str, env: &[(&str, &str)]) -> Child {
    let mut cmd = binary::mock_runner(dir, &dir.join(log));
    cmd.arg("--db").arg(db).env("NANOCLAW_HEARTBEAT_SECS", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

fn wait_exit(child: &mut Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    binary::wait_until(what, Duration::from_secs(15), cond);
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn answered(db: &SessionDb, text: &str) -> bool {
    let id = db
        .insert_in(&NewMessageIn::new(
            "chat",
            json!({"sender": "Ann", "text": text}).to_string(),
        ))
        .unwrap()
        .id;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if db.message_in(&id).unwrap().unwrap().status == "completed" {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn running(db: &SessionDb, child: &Child) -> bool {
    db.runner_state()
        .ok()
        .flatten()
        .is_some_and(|s| s.pid == Some(i64::from(child.id())) && s.status == "idle")
}

#[test]
fn a_missing_db_is_refused_with_its_path_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("sesion.db");
    let mut child = runner(dir.path(), &db, "refused.log", &[]);
    assert!(!wait_exit(&mut child, Duration::from_secs(10)).success());
    let log = read(&dir.path().join("refused.log"));
    assert!(
        log.contains(&db.display().to_string()) && log.contains("nanoclaw init"),
        "{log}"
    );
    assert!(!db.exists(), "nothing was created");

    // Creating one is an explicit opt-in.
    let mut child = runner(
        dir.path(),
        &db,
        "created.log",
        &[("NANOCLAW_CREATE_DB", "true")],
    );
    let handle = {
        wait_until("the created DB", || db.exists());
        SessionDb::open(&db).unwrap()
    };
    wait_until("the runner idle", || running(&handle, &child));
    assert!(answered(&handle, "hello"));
    binary::sigterm(&child);
    assert!(wait_exit(&mut child, Duration::from_secs(5)).success());
}

#[test]
fn a_corrupt_db_fails_at_once_with_its_path_and_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("session.db");
    std::fs::write(&db, "this is not a database ".repeat(200)).unwrap();
    let started = Instant::now();
    let mut child = runner(dir.path(), &db, "runner.log", &[]);
    assert!(!wait_exit(&mut child, Duration::from_secs(20)).success());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    let log = read(&dir.path().join("runner.log"));
    let last = log.lines().last().unwrap_or_default();
    assert!(last.contains(&db.display().to_string()), "{log}");
    assert_eq!(
        last.matches("not a database").count(),
        1,
        "said once: {log}"
    );
}

/// Deleted (`replace = false`) or replaced by another DB (`replace = true`) while running.
fn db_gone_case(replace: bool) {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("session.db");
    let db = SessionDb::open(&db_path).unwrap();
    let mut first = runner(dir.path(), &db_path, "first.log", &[]);
    wait_until("the runner idle", || running(&db, &first));
    drop(db);
    if replace {
        let other = dir.path().join("other.db");
        drop(SessionDb::open(&other).unwrap());
        std::fs::rename(&other, &db_path).unwrap();
    } else {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", db_path.display()));
        }
    }
    let status = wait_exit(&mut first, Duration::from_secs(10));
    assert!(!status.success(), "{status:?}");
    let log = read(&dir.path().join("first.log"));
    let what = if replace {
        "was replaced"
    } else {
        "was deleted"
    };
    let last = log.lines().last().unwrap_or_default();
    assert!(last.contains(what), "the exit error says why: {log}");

    // The lock went with the old runner: a new one serves the DB at the path.
    let db = SessionDb::open(&db_path).unwrap();
    let mut second = runner(dir.path(), &db_path, "second.log", &[]);
    wait_until("the second runner idle", || running(&db, &second));
    assert!(answered(&db, "are you there?"));
    binary::sigterm(&second);
    assert!(wait_exit(&mut second, Duration::from_secs(5)).success());
}

#[test]
fn a_deleted_db_makes_the_runner_exit_and_release_the_lock() {
    db_gone_case(false);
}

#[test]
fn a_replaced_db_makes_the_runner_exit_and_release_the_lock() {
    db_gone_case(true);
}

#[test]
fn one_runner_per_db_whatever_name_reaches_it() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("session.db");
    let db = SessionDb::open(&db_path).unwrap();
    let mut first = runner(dir.path(), &db_path, "first.log", &[]);
    wait_until("the runner idle", || running(&db, &first));
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let symlink = elsewhere.join("via-symlink.db");
    std::os::unix::fs::symlink(&db_path, &symlink).unwrap();
    let hard = elsewhere.join("via-hardlink.db");
    std::fs::hard_link(&db_path, &hard).unwrap();
    for (alias, log) in [(&symlink, "symlink.log"), (&hard, "hardlink.log")] {
        let mut second = runner(&elsewhere, alias, log, &[]);
        assert!(!wait_exit(&mut second, Duration::from_secs(10)).success());
        let text = read(&elsewhere.join(log));
        assert!(
            text.contains("another agent-runner") && text.contains(&first.id().to_string()),
            "{text}"
        );
    }
    assert!(answered(&db, "still mine?"));
    assert!(
        running(&db, &first),
        "the first runner's state is untouched"
    );
    binary::sigterm(&first);
    assert!(wait_exit(&mut first, Duration::from_secs(5)).success());
}
