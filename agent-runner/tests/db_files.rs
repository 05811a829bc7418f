//! Issue 9.1: input that names the session DB's own files (through a symlink or a hard link)
//! never makes the runner open them. Opening and closing one would drop the runner's SQLite
//! locks; the host's next connection close would then delete the WAL under the running runner.
//! Each case runs the real binary against a host that, like a real one, opens and closes its
//! connection for every message, and checks that every message is answered and the DB intact.
//!
//! Issue 46: a link to the live files is planted only once the runner holds them (its
//! descriptors name them), so the link names the inode the runner protects, not one a closing
//! connection is about to delete. A link to an earlier `-wal` or `-shm` (kept alive by the link
//! after the last connection deleted it) is refused too, by its header: the earlier WAL holds
//! database pages.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::binary;

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

/// The workspace of one case, with an empty DB file (the runner makes the schema). Not made
/// through `SessionDb`: its pool may still be opening a connection after it is dropped, and
/// that connection's late close could delete a `-wal` a case has just linked.
fn workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("agent")).unwrap();
    let db = dir.path().join("session.db");
    std::fs::File::create(&db).unwrap();
    (dir, db)
}

/// Whether process `pid` has a descriptor on each of `files` (by path).
fn holds_open(pid: u32, files: &[PathBuf]) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let targets: Vec<PathBuf> = fds
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .collect();
    files.iter().all(|file| targets.contains(file))
}

/// When a case plants its link.
enum Plant<F> {
    /// Once the runner holds its `-wal` and `-shm` open: the link names the live files.
    WhenHeld(F),
    /// The case planted it before the runner started.
    Before,
}

/// Starts the runner, plants the link as `plant` says, then sends `MESSAGES` messages one at a
/// time (each built by `content`), waits for each answer, checks the answers and the DB's
/// integrity, and returns the reply texts.
fn converse<F: FnOnce()>(
    workspace: &Path,
    db: &Path,
    plant: Plant<F>,
    content: impl Fn(usize) -> Value,
) -> Vec<String> {
    let mut child = runner(workspace);
    if let Plant::WhenHeld(plant) = plant {
        // The runner holds these for its whole run (its pinned connection), so a link made now
        // names the inodes it protects, whichever connection created them.
        let files = ["session.db-wal", "session.db-shm"].map(|f| workspace.join(f));
        wait_until("the runner holding its -wal and -shm", || {
            holds_open(child.id(), &files)
        });
        plant();
    }
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
    let replies = converse(dir.path(), &db, Plant::WhenHeld(plant), chat);
    assert_imports_refused(dir.path(), &replies);
}

fn assert_imports_refused(workspace: &Path, replies: &[String]) {
    for reply in replies {
        assert!(
            reply.contains("unreadable import") && reply.contains("session database"),
            "the import is refused with a note in place: {reply}"
        );
    }
    assert!(log(workspace).contains("refused to open a session DB file"));
}

/// Makes the DB's `-wal` and `-shm` with a connection of its own, links `file` (one of them)
/// at `at`, and closes the connection: as the last one, it deletes both, and the link keeps
/// the earlier file (the WAL with the row's page). Planted before the runner starts.
fn plant_earlier(db: &Path, file: &str, at: &Path) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; CREATE TABLE notes(x); INSERT INTO notes VALUES ('a secret row');",
    )
    .unwrap();
    std::fs::hard_link(db.with_file_name(file), at).unwrap();
    drop(conn);
    assert!(
        !db.with_file_name(file).exists(),
        "the last close deleted {file}"
    );
    assert!(at.exists(), "the link keeps the earlier {file}");
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

/// An import of an earlier `-shm`, deleted by the last close before the runner started and
/// kept by a hard link: refused by its header.
#[test]
fn an_import_of_an_earlier_shm_kept_by_a_hard_link_is_refused() {
    let (dir, db) = workspace();
    let name = "notes-earlier-shm.md";
    std::fs::write(
        dir.path().join("agent/CLAUDE.md"),
        format!("# Instructions\n\n@{name}\n"),
    )
    .unwrap();
    plant_earlier(&db, "session.db-shm", &dir.path().join("agent").join(name));
    let replies = converse(dir.path(), &db, Plant::<fn()>::Before, chat);
    assert_imports_refused(dir.path(), &replies);
}

/// Every message carries an attachment whose `localPath` is a link to the DB file `file`.
fn attachment_case(file: &str, how: Link) {
    let (dir, db) = workspace();
    let name = format!("photo-{file}.png");
    let plant = || link(&dir.path().join(file), &dir.path().join(&name), how);
    let replies = converse(dir.path(), &db, Plant::WhenHeld(plant), attachment(&name));
    assert_attachments_refused(&replies);
}

/// A chat message whose attachment's `localPath` is `local`.
fn attachment(local: &str) -> impl Fn(usize) -> Value + '_ {
    move |i| {
        json!({
            "sender": "Ann",
            "text": format!("message {i}"),
            "attachments": [{"name": "photo.png", "localPath": local}],
        })
    }
}

fn assert_attachments_refused(replies: &[String]) {
    for reply in replies {
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

/// The leak issue 46 names: an earlier `-wal`, deleted by the last close before the runner
/// started and kept by a hard link, holds database pages; as an attachment it is refused by
/// its header, never offered to the agent.
#[test]
fn an_attachment_naming_an_earlier_wal_kept_by_a_hard_link_is_refused() {
    let (dir, db) = workspace();
    let name = "photo-earlier-wal.png";
    plant_earlier(&db, "session.db-wal", &dir.path().join(name));
    let replies = converse(dir.path(), &db, Plant::<fn()>::Before, attachment(name));
    assert_attachments_refused(&replies);
}
