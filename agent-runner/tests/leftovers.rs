//! No process outlives its session (issue 10, point 3), with the mock provider: a task script
//! leaves background processes that escaped its process group; the one that kept its environment
//! (and so the run's marker) is killed when the script ends, the one that cleared it survives:
//! SIGTERM kills it within 5 s, and after a SIGKILL of the runner the next run kills it at
//! startup (from the ledger). And the runner as PID 1 of a PID namespace reaps every orphan and
//! stops on SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::binary;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use binary::wait_until;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use schema::{NewMessageIn, SessionDb};
use serde_json::json;

/// Kills the runners and the recorded leftovers if a test fails half-way.
#[derive(Default)]
struct Cleanup {
    children: Vec<Child>,
    pids: Vec<i32>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for pid in &self.pids {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
    }
}

/// The state letter of `pid` (`None` when it does not exist).
fn state(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().next().map(str::to_owned)
}

/// True while `pid` runs (a zombie runs nothing).
fn running(pid: i32) -> bool {
    state(pid).is_some_and(|s| s != "Z" && s != "X")
}

/// Zombie children of `parent`.
fn zombies_of(parent: u32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() == Some(&"Z") && fields.get(1) == Some(&parent.to_string().as_str()) {
            found.push(pid);
        }
    }
    found
}

fn runner(workspace: &Path, n: usize) -> Child {
    std::fs::create_dir_all(workspace.join("agent")).unwrap();
    binary::mock_runner(workspace, &workspace.join(format!("runner-{n}.log")))
        .env("NANOCLAW_HEARTBEAT_SECS", "1")
        .spawn()
        .unwrap()
}

fn logs(workspace: &Path) -> String {
    (0..3)
        .filter_map(|n| std::fs::read_to_string(workspace.join(format!("runner-{n}.log"))).ok())
        .collect::<Vec<_>>()
        .join("\n----- restart -----\n")
}

/// A task whose script leaves two background processes outside its process group, one with an
/// empty environment (no marker: only the ledger knows it), writes their pids to `pids` and
/// skips the agent.
///
/// The script ends only once both have left its group (each leads its own session): until
/// `setsid` runs they are still in the group, and the group kill at the script's end would take
/// them with it on a loaded machine, leaving nothing to test.
fn leaving_task(pids: &Path) -> NewMessageIn {
    let script = format!(
        "setsid sleep 300 >/dev/null 2>&1 & a=$!\n\
         env -i setsid sleep 301 >/dev/null 2>&1 & b=$!\n\
         sid() {{ cut -d' ' -f6 /proc/$1/stat; }}\n\
         for i in $(seq 1 1000); do\n\
           [ \"$(sid $a)\" = \"$a\" ] && [ \"$(sid $b)\" = \"$b\" ] && break\n\
           sleep 0.01\n\
         done\n\
         echo \"$a $b\" > {0}.tmp && mv {0}.tmp {0}\n\
         echo '{{\"wakeAgent\": false}}'\n",
        pids.display()
    );
    let mut task = NewMessageIn::new(
        "task",
        json!({"prompt": "check", "script": script}).to_string(),
    );
    task.series_is_self = true;
    task
}

/// Inserts the task, waits for it to complete and returns the pids its script left running.
fn run_leaving_task(db: &SessionDb, pids_file: &PathBuf, cleanup: &mut Cleanup) -> Vec<i32> {
    let id = db.insert_in(&leaving_task(pids_file)).unwrap().id;
    wait_until("the task to complete", Duration::from_secs(20), || {
        db.message_in(&id).unwrap().unwrap().status == "completed"
    });
    let pids: Vec<i32> = std::fs::read_to_string(pids_file)
        .unwrap()
        .split_whitespace()
        .map(|pid| pid.parse().unwrap())
        .collect();
    cleanup.pids.extend(&pids);
    assert_eq!(pids.len(), 2);
    // The marked one was killed when the script ended; the one without an environment (no
    // marker) outlived it: only the runner's ledger and its stop know it.
    wait_until(
        "the marked leftover to be killed with the script",
        Duration::from_secs(2),
        || !running(pids[0]),
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        running(pids[1]),
        "the script's unmarked leftover {} is not running",
        pids[1]
    );
    vec![pids[1]]
}

#[test]
fn sigterm_kills_what_a_task_script_left_running_within_5s() {
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    let mut cleanup = Cleanup::default();
    cleanup.children.push(runner(dir.path(), 0));
    let pids = run_leaving_task(&db, &dir.path().join("left.pids"), &mut cleanup);
    let started = Instant::now();
    binary::sigterm(&cleanup.children[0]);
    wait_until("the runner to exit", Duration::from_secs(5), || {
        cleanup.children[0].try_wait().unwrap().is_some()
    });
    for pid in &pids {
        wait_until(
            &format!("leftover {pid} to be gone"),
            Duration::from_secs(5).saturating_sub(started.elapsed()),
            || !running(*pid),
        );
    }
    eprintln!(
        "SIGTERM: runner and leftovers gone after {:.2?}",
        started.elapsed()
    );
    assert_eq!(db.runner_state().unwrap().unwrap().status, "stopped");
    let log = logs(dir.path());
    assert!(
        log.contains("killed processes the session left running"),
        "{log}"
    );
}

#[test]
fn restart_after_sigkill_kills_what_the_old_run_left_running() {
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    let mut cleanup = Cleanup::default();
    cleanup.children.push(runner(dir.path(), 0));
    let pids = run_leaving_task(&db, &dir.path().join("left.pids"), &mut cleanup);
    // Two heartbeats: the ledger has recorded the unmarked leftover.
    std::thread::sleep(Duration::from_millis(2500));
    let mut old = cleanup.children.remove(0);
    old.kill().unwrap();
    old.wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    for pid in &pids {
        assert!(running(*pid), "{pid} died with the runner: nothing to test");
    }
    let started = Instant::now();
    cleanup.children.push(runner(dir.path(), 1));
    for pid in &pids {
        wait_until(
            &format!("leftover {pid} of the killed run to be gone"),
            Duration::from_secs(10),
            || !running(*pid),
        );
    }
    eprintln!(
        "restart: the old run's leftovers gone {:.2?} after the start",
        started.elapsed()
    );
    // The line is written after the kills, and the log lines go through a writer thread.
    let kill_line = "killed processes a previous run of this session left behind";
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut log = logs(dir.path());
    while !log.contains(kill_line) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        log = logs(dir.path());
    }
    assert!(log.contains(kill_line), "no log line of the kill:\n{log}");
    let line = log
        .lines()
        .find(|line| line.contains(kill_line))
        .unwrap_or_default();
    for pid in &pids {
        assert!(line.contains(&pid.to_string()), "{pid} not in {line}");
    }
    binary::sigterm(&cleanup.children[0]);
    wait_until("the runner to exit", Duration::from_secs(5), || {
        cleanup.children[0].try_wait().unwrap().is_some()
    });
}

/// Whether `unshare -pf --mount-proc` works here (root, or user namespaces).
fn pid_namespaces_work() -> Result<(), String> {
    match Command::new("unshare")
        .args(["-pf", "--mount-proc", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
        Err(err) => Err(err.to_string()),
    }
}

#[test]
fn as_pid_1_the_runner_reaps_every_orphan_and_stops_on_sigterm() {
    if let Err(reason) = pid_namespaces_work() {
        // Needs root (as the tests here run) or unprivileged user namespaces.
        eprintln!("SKIPPED as_pid_1_…: unshare -pf --mount-proc does not work here: {reason}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    std::fs::create_dir_all(dir.path().join("agent")).unwrap();
    let log = std::fs::File::create(dir.path().join("runner-0.log")).unwrap();
    let mut cleanup = Cleanup::default();
    cleanup.children.push(
        Command::new("unshare")
            .args(["-pf", "--mount-proc"])
            .arg(env!("CARGO_BIN_EXE_agent-runner"))
            .arg("--workspace")
            .arg(dir.path())
            .args(["--provider", "mock"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let unshare = cleanup.children[0].id();
    // The runner: unshare's child, PID 1 inside.
    let mut runner_pid = None;
    wait_until("the runner to start", Duration::from_secs(10), || {
        runner_pid = binary_children(unshare).first().copied();
        runner_pid.is_some() && db.runner_state().unwrap().is_some()
    });
    let runner_pid = runner_pid.unwrap();
    // Orphans that exit: as PID 1 they become the runner's zombies unless it reaps them.
    let done = dir.path().join("orphans.done");
    let script = format!(
        "for i in 1 2 3 4 5; do setsid sh -c 'sleep 0.2' & done\n\
         (sleep 0.2 >/dev/null 2>&1 &)\n\
         setsid sleep 300 >/dev/null 2>&1 &\n\
         touch {}\n\
         echo '{{\"wakeAgent\": false}}'\n",
        done.display()
    );
    let mut task = NewMessageIn::new(
        "task",
        json!({"prompt": "orphans", "script": script}).to_string(),
    );
    task.series_is_self = true;
    let id = db.insert_in(&task).unwrap().id;
    wait_until("the task to complete", Duration::from_secs(20), || {
        db.message_in(&id).unwrap().unwrap().status == "completed"
    });
    assert!(done.exists());
    // The orphans exited after 0.2 s; give the reaper its SIGCHLDs (and its 1 s fallback).
    std::thread::sleep(Duration::from_millis(1500));
    let zombies = zombies_of(runner_pid);
    assert!(
        zombies.is_empty(),
        "zombies under the runner as PID 1: {zombies:?}\n{}",
        logs(dir.path())
    );
    let log = logs(dir.path());
    assert!(log.contains("is PID 1"), "{log}");
    let started = Instant::now();
    kill(Pid::from_raw(runner_pid as i32), Signal::SIGTERM).unwrap();
    let status = loop {
        if let Some(status) = cleanup.children[0].try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "PID 1 ignored SIGTERM\n{}",
            logs(dir.path())
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    eprintln!("PID 1 stopped {:.2?} after SIGTERM", started.elapsed());
    assert!(status.success(), "{status:?}\n{}", logs(dir.path()));
    assert_eq!(db.runner_state().unwrap().unwrap().status, "stopped");
}

/// The children of `parent`, from `/proc`.
fn binary_children(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if rest.split_whitespace().nth(1) == Some(&parent.to_string()) {
            found.push(pid);
        }
    }
    found
}

/// Start time (field 22 of `/proc/<pid>/stat`) of `pid`.
fn start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

#[test]
fn the_ledger_is_untrusted_input() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("session.db");
    let db = SessionDb::open(&db_path).unwrap();
    let id = db
        .insert_in(&NewMessageIn::new(
            "chat",
            json!({"sender": "Ann", "text": "hi"}).to_string(),
        ))
        .unwrap()
        .id;
    let mut cleanup = Cleanup::default();
    let mut spawn_sleep = || {
        let child = Command::new("sleep").arg("300").spawn().unwrap();
        let pid = child.id();
        cleanup.pids.push(pid as i32);
        (child, pid)
    };
    let (mut listed, listed_pid) = spawn_sleep();
    let (mut recycled, recycled_pid) = spawn_sleep();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    // A ledger the agent could have written: a process that still matches (killed), a pid whose
    // start time does not match (a recycled pid: spared) and this test (the runner's parent:
    // spared).
    let ledger = format!(
        "boot {}\n{listed_pid} {}\n{recycled_pid} {}\n{} {}\n",
        boot.trim(),
        start_time(listed_pid),
        start_time(recycled_pid) + 1,
        std::process::id(),
        start_time(std::process::id()),
    );
    std::fs::write(dir.path().join("session.db.procs"), ledger).unwrap();
    cleanup.children.push(runner(dir.path(), 0));
    wait_until("the answer", Duration::from_secs(20), || {
        db.message_in(&id).unwrap().unwrap().status == "completed"
    });
    wait_until(
        "the listed process to be killed",
        Duration::from_secs(5),
        || listed.try_wait().unwrap().is_some(),
    );
    assert!(
        recycled.try_wait().unwrap().is_none(),
        "a recycled pid was killed"
    );
    binary::sigterm(&cleanup.children[0]);
    wait_until("the runner to exit", Duration::from_secs(5), || {
        cleanup.children[0].try_wait().unwrap().is_some()
    });
    assert!(recycled.try_wait().unwrap().is_none(), "killed at the stop");

    // A ledger replaced by a link to the DB: refused on reading, replaced (not followed) on
    // writing, the DB intact.
    let ledger = dir.path().join("session.db.procs");
    std::fs::remove_file(&ledger).unwrap();
    std::os::unix::fs::symlink(&db_path, &ledger).unwrap();
    cleanup.children.push(runner(dir.path(), 1));
    let second = db
        .insert_in(&NewMessageIn::new(
            "chat",
            json!({"sender": "Ann", "text": "still fine?"}).to_string(),
        ))
        .unwrap()
        .id;
    wait_until("the second answer", Duration::from_secs(20), || {
        db.message_in(&second).unwrap().unwrap().status == "completed"
    });
    assert!(!std::fs::symlink_metadata(&ledger).unwrap().is_symlink());
    assert_eq!(binary::integrity_check(&db_path), "ok");
    assert!(logs(dir.path()).contains("refused"), "{}", logs(dir.path()));
    binary::sigterm(&cleanup.children[1]);
    wait_until("the runner to exit", Duration::from_secs(5), || {
        cleanup.children[1].try_wait().unwrap().is_some()
    });
    let _ = recycled.kill();
    let _ = recycled.wait();
}
