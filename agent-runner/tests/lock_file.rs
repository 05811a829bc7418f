//! The runner's `<db>.lock` pid file is in the DB's folder, which the agent can write: a link
//! planted there is replaced, never followed (it once truncated whatever it pointed to, the
//! session DB included).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::binary;

use std::time::Duration;

use binary::wait_until;
use schema::{NewMessageIn, SessionDb};
use serde_json::json;

#[test]
fn a_lock_file_linked_to_the_db_or_another_file_is_replaced_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("agent")).unwrap();
    let db_path = dir.path().join("session.db");
    let db = SessionDb::open(&db_path).unwrap();
    let first = db
        .insert_in(&NewMessageIn::new(
            "chat",
            json!({"sender": "Ann", "text": "before"}).to_string(),
        ))
        .unwrap()
        .id;
    let lock = dir.path().join("session.db.lock");
    let victim = dir.path().join("notes.txt");
    for (n, target) in [&victim, &db_path].into_iter().enumerate() {
        std::fs::write(&victim, "precious").unwrap();
        let _ = std::fs::remove_file(&lock);
        std::os::unix::fs::symlink(target, &lock).unwrap();
        let mut runner =
            binary::mock_runner(dir.path(), &dir.path().join(format!("runner-{n}.log")))
                .spawn()
                .unwrap();
        wait_until("the runner to start", Duration::from_secs(20), || {
            db.runner_state()
                .unwrap()
                .is_some_and(|s| s.pid == Some(i64::from(runner.id())) && s.status != "starting")
        });
        binary::sigterm(&runner);
        runner.wait().unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(binary::integrity_check(&db_path), "ok");
        assert!(
            db.message_in(&first).unwrap().is_some(),
            "the DB lost its rows"
        );
        assert!(!std::fs::symlink_metadata(&lock).unwrap().is_symlink());
    }
}
