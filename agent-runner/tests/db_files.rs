//! Issue 9.1: input that names the session DB's own files (through a symlink or a hard link)
//! never makes the runner open them. Opening and closing one would drop the runner's SQLite
//! locks; the host's next connection close would then delete the WAL under the running runner.
//! Each case runs the real binary against a host that, like a real one, opens and closes its
//! connection for every message, and checks that every message is answered and the DB intact.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/binary.rs"]
mod binary;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use schema::{NewMessageIn, SessionDb};
use serde_json::{json, Value};

const MESSAGES: usize = 6;

#[derive(Clone, Copy, Debug)]
enum Link {
    Symlink,
    HardLink,
}

fn link(target: &Path, at: &Path, how: Link) {
    match how {
        Link::Symlink => std::os::unix::fs::symlink(target, at).unwrap(),
        Link::HardLink => std::fs::hard_link(target, at).unwrap(),
    }
}

fn runner(workspace: &Path) -> Child {
    binary::mock_runner(workspace, &workspace.join("runner.log"))
        .env("NANOCLAW_MOCK_ECHO_SYSTEM", "true")
        .env("NANOCLAW_MAX_MESSAGES_PER_PROMPT", "1")
        .spawn()
        .unwrap()
}

/// A host's short-lived connection: opened for one call and closed again, as `nanoclaw send`
/// does. Its close is what deletes the WAL when the runner has lost its locks.
fn with_db<T>(db: &Path, f: impl FnOnce(&SessionDb) -> T) -> T {
    let handle = SessionDb::open(db).unwrap();
    f(&handle)
}

fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    binary::wait_until(what, Duration::from_secs(20), cond);
}

/// The workspace of one case, with its DB created (and closed) by "the host".
fn workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("agent")).unwrap();
    let db = dir.path().join("session.db");
    with_db(&db, |_| ());
    (dir, db)
}

/// Starts the runner, waits for its `-wal` and `-shm` (they exist while it runs; a hard link
/// must be made to the live ones), runs `plant`, then sends `MESSAGES` messages one at a time
/// (each built by `content`), waits for each answer, checks the answers and the DB's integrity,
/// and returns the reply texts.
fn converse(
    workspace: &Path,
    db: &Path,
    plant: impl FnOnce(),
    content: impl Fn(usize) -> Value,
) -> Vec<String> {
    let mut child = runner(workspace);
    wait_until("the runner's -wal and -shm", || {
        ["session.db-wal", "session.db-shm"]
            .iter()
            .all(|f| workspace.join(f).exists())
    });
    plant();
    let mut replies = Vec::new();
    for i in 0..MESSAGES {
        let row = NewMessageIn::new("chat", content(i).to_string());
        let id = with_db(db, |db| db.insert_in(&row).unwrap().id);
        wait_until(&format!("the answer to message {i}"), || {
            with_db(db, |db| db.replies_to(&id).unwrap().len() == 1)
        });
        let reply = with_db(db, |db| db.replies_to(&id).unwrap().remove(0));
        let text: Value = serde_json::from_str(&reply.content).unwrap();
        replies.push(text["text"].as_str().unwrap_or_default().to_owned());
    }
    binary::sigterm(&child);
    assert!(child.wait().unwrap().success(), "{}", log(workspace));
    with_db(db, |handle| {
        assert_eq!(handle.all_messages_out().unwrap().len(), MESSAGES);
    });
    assert_eq!(binary::integrity_check(db), "ok");
    replies
}

fn log(workspace: &Path) -> String {
    std::fs::read_to_string(workspace.join("runner.log")).unwrap_or_default()
}

fn chat(i: usize) -> Value {
    json!({"sender": "Ann", "text": format!("message {i}")})
}

/// `agent/CLAUDE.md` imports a link to the DB file `file`; the runner rebuilds the system
/// prompt (reading the import) for every one of the messages.
fn import_case(file: &str, how: Link) {
    let (dir, db) = workspace();
    let name = format!("notes-{file}.md");
    let claude_md = format!("# Instructions\n\n@{name}\n");
    std::fs::write(dir.path().join("agent/CLAUDE.md"), claude_md).unwrap();
    let plant = || {
        link(
            &dir.path().join(file),
            &dir.path().join("agent").join(&name),
            how,
        )
    };
    let replies = converse(dir.path(), &db, plant, chat);
    for reply in &replies {
        assert!(
            reply.contains("unreadable import") && reply.contains("session database"),
            "the import is refused with a note in place: {reply}"
        );
    }
    assert!(log(dir.path()).contains("refused to open a session DB file"));
}

#[test]
fn an_import_of_the_db_through_a_symlink_is_refused() {
    import_case("session.db", Link::Symlink);
}

#[test]
fn an_import_of_the_db_through_a_hard_link_is_refused() {
    import_case("session.db", Link::HardLink);
}

#[test]
fn an_import_of_the_shm_through_a_symlink_is_refused() {
    import_case("session.db-shm", Link::Symlink);
}

#[test]
fn an_import_of_the_shm_through_a_hard_link_is_refused() {
    import_case("session.db-shm", Link::HardLink);
}

/// Every message carries an attachment whose `localPath` is a link to the DB file `file`.
fn attachment_case(file: &str, how: Link) {
    let (dir, db) = workspace();
    let name = format!("photo-{file}.png");
    let plant = || link(&dir.path().join(file), &dir.path().join(&name), how);
    let replies = converse(dir.path(), &db, plant, |i| {
        json!({
            "sender": "Ann",
            "text": format!("message {i}"),
            "attachments": [{"name": "photo.png", "localPath": name}],
        })
    });
    for reply in &replies {
        assert!(
            reply.contains("[attachment unavailable:") && reply.contains("session database"),
            "the attachment is refused in the prompt: {reply}"
        );
    }
}

#[test]
fn an_attachment_naming_the_db_through_a_symlink_is_refused() {
    attachment_case("session.db", Link::Symlink);
}

#[test]
fn an_attachment_naming_the_db_through_a_hard_link_is_refused() {
    attachment_case("session.db", Link::HardLink);
}

#[test]
fn an_attachment_naming_the_shm_through_a_symlink_is_refused() {
    attachment_case("session.db-shm", Link::Symlink);
}

#[test]
fn an_attachment_naming_the_wal_through_a_hard_link_is_refused() {
    attachment_case("session.db-wal", Link::HardLink);
}
