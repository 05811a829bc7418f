//! `mcp-tools` refuses a session DB on a FUSE mount (exit 78, the filesystem and the fix named)
//! and serves one on tmpfs (docs/contract/db.md, "Where the DB may live"). The FUSE case mounts
//! a real bindfs (scripts/install-test-tools.sh) and needs root; where the machine cannot mount,
//! it says so and skips that case.

use std::process::Stdio;

use fsguard::testing::{tmpfs_dir, FuseMount};
use serde_json::json;

use crate::support::{routing, Env};

#[test]
fn a_session_on_fuse_is_refused_with_exit_78_and_the_fix() {
    let env = Env::new();
    env.session_routing("slack", "C1");
    let mount_point = env.dir.path().join("mnt");
    std::fs::create_dir_all(&mount_point).unwrap();
    let mount = match FuseMount::bindfs(&env.workspace, &mount_point) {
        Ok(mount) => mount,
        Err(why) => {
            eprintln!("SKIPPED: the FUSE case of mcp-tools' shared-filesystem check: {why}");
            return;
        }
    };
    // Stdin at its end: a server that served instead would exit 0 at once.
    let out = env
        .command(&[])
        .env("SESSION_DB", mount_point.join("session.db"))
        .env("WORKSPACE_DIR", &mount_point)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("is on fuse.bindfs (a FUSE filesystem")
            && err.contains("run `nanoclaw serve` there"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "it answered on stdio");
    drop(mount);
    assert!(env.db.messages_out_after(0, 10).unwrap().is_empty());
}

#[test]
fn a_session_on_tmpfs_is_served() {
    let tmp = match tmpfs_dir() {
        Ok(tmp) => tmp,
        Err(why) => {
            eprintln!("SKIPPED: the tmpfs case of mcp-tools' shared-filesystem check: {why}");
            return;
        }
    };
    let env = Env::in_dir(tmp, "UTC");
    env.session_routing("slack", "C1");
    let mut server = env.spawn().ready();
    let sent = server.call("send_message", json!({"text": "from tmpfs"}));
    let row = env.db.message_out_by_seq(sent.seq()).unwrap().unwrap();
    assert_eq!(row.routing, routing("slack", "C1", None));
}
