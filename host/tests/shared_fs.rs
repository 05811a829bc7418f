//! `nanoclaw` refuses a session DB on a FUSE mount (exit 78, the filesystem and the fix named)
//! and serves one on tmpfs (docs/contract/db.md, "Where the DB may live"). The FUSE case mounts
//! a real bindfs (scripts/install-test-tools.sh) and needs root; where the machine cannot mount,
//! it says so and skips that case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use expect_test::expect;
use fsguard::testing::{tmpfs_dir, FuseMount};

const BIN: &str = env!("CARGO_BIN_EXE_nanoclaw");

fn nanoclaw(workspace: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .env_remove("SESSION_DB")
        .env_remove("RUST_LOG")
        .env("TZ", "UTC")
        .arg("--workspace")
        .arg(workspace)
        .args(args)
        .output()
        .expect("running nanoclaw")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The names in a folder, sorted: what a refused command must not change.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

const COMMANDS: &[&[&str]] = &[
    &["init"],
    &["send", "--text", "hello", "--sender", "Ann"],
    &["status"],
    &["health"],
    &["watch", "--no-follow"],
    &["usage"],
    &["sweep"],
    &["interrupt"],
];

#[test]
fn every_command_refuses_a_session_on_fuse_with_exit_78_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let (source, mount_point) = (dir.path().join("src"), dir.path().join("mnt"));
    std::fs::create_dir_all(&mount_point).unwrap();
    // A session made on a local disk, then reached through FUSE.
    let init = nanoclaw(&source, &["init"]);
    assert!(init.status.success(), "{}", stderr(&init));
    let send = nanoclaw(&source, &["send", "--text", "before", "--sender", "Ann"]);
    assert!(send.status.success(), "{}", stderr(&send));
    let before = listing(&source);
    let mount = match FuseMount::bindfs(&source, &mount_point) {
        Ok(mount) => mount,
        Err(why) => {
            eprintln!("SKIPPED: the FUSE case of nanoclaw's shared-filesystem check: {why}");
            return;
        }
    };
    for args in COMMANDS {
        let out = nanoclaw(&mount_point, args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(78), "nanoclaw {args:?}: {err}");
        assert!(
            err.contains("fuse.bindfs") && err.contains("nanoclaw serve"),
            "{args:?}: {err}"
        );
    }
    // `serve` next to such a DB is in the wrong place: it refuses to start, for one session or a
    // root on the mount (a unix socket: no token file needed to get that far).
    let socket = format!("unix:{}", dir.path().join("serve.sock").display());
    let served = mount_point.display().to_string();
    for flag in ["--workspace", "--root"] {
        let out = Command::new(BIN)
            .env_remove("RUST_LOG")
            .args(["serve", flag, &served, "--listen", &socket])
            .output()
            .expect("running nanoclaw serve");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(78), "serve {flag}: {err}");
        assert!(
            err.contains("fuse.bindfs") && err.contains("nanoclaw serve"),
            "{err}"
        );
    }
    // `fleet` starts runners next to the DBs: a root on the mount is refused the same way.
    let out = Command::new(BIN)
        .env_remove("RUST_LOG")
        .args(["fleet", "--root", &served])
        .output()
        .expect("running nanoclaw fleet");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "fleet --root: {err}");
    assert!(err.contains("fuse.bindfs"), "{err}");
    // A root on a local disk with the shared folder under it: served, and the shared session is
    // answered `500` without its path (the fix is in serve's log).
    let sock = dir.path().join("root.sock");
    let mut serve = Command::new(BIN)
        .env_remove("RUST_LOG")
        .args(["serve", "--root"])
        .arg(dir.path())
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning nanoclaw serve");
    let started = std::time::Instant::now();
    while !sock.exists() && started.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let url = format!("unix:{}", sock.display());
    let remote = Command::new(BIN)
        .env_remove("RUST_LOG")
        .args(["--url", &url, "--session", "mnt", "status"])
        .output()
        .expect("running nanoclaw --url");
    // Ended by its pid (Child::kill); its log so far is what the test reads.
    let _ = serve.kill();
    let serve_out = serve.wait_with_output().expect("serve's output");
    let (remote_err, serve_log) = (stderr(&remote), stderr(&serve_out));
    assert!(!remote.status.success());
    assert!(
        remote_err.contains("500") && remote_err.contains("shared filesystem"),
        "{remote_err}"
    );
    assert!(!remote_err.contains(&served), "{remote_err}");
    assert!(serve_log.contains("fuse.bindfs"), "{serve_log}");
    // `--json` health says the same in its reason.
    let health = nanoclaw(&mount_point, &["--json", "health"]);
    assert_eq!(health.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&health.stdout).contains("fuse.bindfs"));
    // A new workspace inside the mount: refused before any folder is made.
    let fresh = nanoclaw(&mount_point.join("new/ws"), &["init"]);
    assert_eq!(fresh.status.code(), Some(78), "{}", stderr(&fresh));
    let shown = stderr(&fresh)
        .replace(
            &std::fs::canonicalize(&mount_point)
                .unwrap()
                .display()
                .to_string(),
            "<mnt>",
        )
        .replace(&mount_point.display().to_string(), "<mnt>");
    expect![[r#"
        nanoclaw: error: refusing the session DB <mnt>/new/ws/session.db: its folder <mnt> is on fuse.bindfs (a FUSE filesystem, mounted at <mnt>), and SQLite's WAL needs every process that opens the DB on one kernel (on such folders it reports `database is locked` or I/O errors, or silently corrupts the DB). Fix: keep the session folder on a local filesystem of the VM or pod that runs agent-runner (a named volume, an emptyDir), run `nanoclaw serve` there, next to the DB, and talk to it over HTTP with `nanoclaw --url` from outside. This check has no switch
    "#]]
    .assert_eq(&shown);
    drop(mount);
    // Nothing was opened or created: no `-wal`, `-shm` or folder appeared, the row is alone.
    assert_eq!(listing(&source), before);
    let status = nanoclaw(&source, &["--json", "status"]);
    assert!(status.status.success(), "{}", stderr(&status));
    let watch = nanoclaw(&source, &["watch", "--no-follow"]);
    assert!(watch.status.success(), "{}", stderr(&watch));
    let db = schema::SessionDb::open(source.join("session.db")).unwrap();
    assert_eq!(db.counts(chrono::Utc::now()).unwrap().pending, 1);
}

#[test]
fn every_command_serves_a_session_on_tmpfs() {
    let tmp = match tmpfs_dir() {
        Ok(tmp) => tmp,
        Err(why) => {
            eprintln!("SKIPPED: the tmpfs case of nanoclaw's shared-filesystem check: {why}");
            return;
        }
    };
    let ws = tmp.path().join("ws");
    for args in COMMANDS {
        let out = nanoclaw(&ws, args);
        let code = out.status.code();
        // `health` without a runner is unhealthy (1), every other command succeeds.
        let want = if args[0] == "health" {
            Some(1)
        } else {
            Some(0)
        };
        assert_eq!(code, want, "nanoclaw {args:?}: {}", stderr(&out));
    }
    // The `send` and the `interrupt` rows.
    let db = schema::SessionDb::open(ws.join("session.db")).unwrap();
    assert_eq!(db.counts(chrono::Utc::now()).unwrap().pending, 2);
}
