//! send_file: the copy into the outbox, the row, and every refusal.

use serde_json::{json, Value};

use crate::support::{routing, Env};

#[test]
fn copies_into_the_outbox_then_writes_the_row() {
    let env = Env::new();
    env.batch(routing("slack", "C1", None), "in-1", None);
    std::fs::create_dir_all(env.agent_dir().join("out")).unwrap();
    std::fs::write(env.agent_dir().join("out/report.csv"), "a,b\n1,2\n").unwrap();
    let mut server = env.spawn().ready();

    let sent = server.call(
        "send_file",
        json!({"path": "out/report.csv", "text": "Here it is"}),
    );
    assert!(
        sent.text.starts_with("File report.csv sent"),
        "{}",
        sent.text
    );
    let row = env.db.message_out_by_seq(sent.seq()).unwrap().unwrap();
    let content: Value = serde_json::from_str(&row.content).unwrap();
    assert_eq!(
        content,
        json!({"text": "Here it is", "files": ["report.csv"]})
    );
    assert_eq!(row.routing, routing("slack", "C1", None));
    assert_eq!(row.in_reply_to.as_deref(), Some("in-1"));
    let copy = env
        .workspace
        .join("outbox")
        .join(&row.id)
        .join("report.csv");
    assert_eq!(std::fs::read_to_string(copy).unwrap(), "a,b\n1,2\n");

    // Absolute paths inside the readable roots, and a chosen name.
    std::fs::create_dir_all(env.workspace.join("downloads/m1")).unwrap();
    let download = env.workspace.join("downloads/m1/photo.jpg");
    std::fs::write(&download, [0xFF, 0xD8, 0xFF]).unwrap();
    let sent = server.call(
        "send_file",
        json!({"path": download.to_str().unwrap(), "filename": "holiday.jpg"}),
    );
    let row = env.db.message_out_by_seq(sent.seq()).unwrap().unwrap();
    let content: Value = serde_json::from_str(&row.content).unwrap();
    assert_eq!(content, json!({"text": "", "files": ["holiday.jpg"]}));
    let copy = env
        .workspace
        .join("outbox")
        .join(&row.id)
        .join("holiday.jpg");
    assert_eq!(std::fs::read(copy).unwrap(), [0xFF, 0xD8, 0xFF]);
}

#[test]
fn refuses_missing_directories_escapes_and_bad_names() {
    let env = Env::new();
    env.session_routing("slack", "C1");
    let agent = env.agent_dir();
    std::fs::write(agent.join("ok.txt"), "fine").unwrap();
    std::fs::create_dir_all(agent.join("folder")).unwrap();
    let secret = env.dir.path().join("secret.txt");
    std::fs::write(&secret, "top secret").unwrap();
    std::os::unix::fs::symlink(&secret, agent.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(env.dir.path(), agent.join("up")).unwrap();
    let mut server = env.spawn().ready();

    let cases: [(Value, &str); 9] = [
        (json!({"path": "nope.txt"}), "no such file: nope.txt"),
        (json!({"path": "folder"}), "is a directory"),
        (json!({"path": "link.txt"}), "outside the folders"),
        (json!({"path": "up/secret.txt"}), "outside the folders"),
        (json!({"path": "../session.db"}), "is the session database"),
        (
            json!({"path": secret.to_str().unwrap()}),
            "outside the folders",
        ),
        (
            json!({"path": "ok.txt", "filename": "../evil.txt"}),
            "not a plain file name",
        ),
        (
            json!({"path": "ok.txt", "filename": "a/b.txt"}),
            "not a plain file name",
        ),
        (json!({"path": ""}), "path is empty"),
    ];
    for (args, expected) in cases {
        let err = server.call("send_file", args.clone()).err();
        assert!(err.contains(expected), "{args}: {err}");
    }
    assert!(
        env.db.all_messages_out().unwrap().is_empty(),
        "no row for a refusal"
    );
    assert!(
        !env.workspace.join("outbox").exists()
            || std::fs::read_dir(env.workspace.join("outbox"))
                .unwrap()
                .next()
                .is_none()
    );
}

#[test]
fn refuses_files_over_the_size_limit() {
    let env = Env::new();
    env.session_routing("slack", "C1");
    std::fs::write(env.agent_dir().join("big.bin"), vec![7u8; 2048]).unwrap();
    std::fs::write(env.agent_dir().join("small.bin"), vec![7u8; 1024]).unwrap();
    let mut server = env
        .spawn_with(&[("NANOCLAW_MAX_FILE_BYTES", "1024")])
        .ready();
    let err = server.call("send_file", json!({"path": "big.bin"})).err();
    assert!(
        err.contains("too large: 2048 bytes, the limit is 1024 bytes"),
        "{err}"
    );
    server.call("send_file", json!({"path": "small.bin"})).ok();
}

/// Issue 9.1: the session DB's files are refused by identity, through a symlink or a hard link
/// inside the agent folder, and the refusal does not cost mcp-tools its DB locks (opening and
/// closing one would): every acknowledged row is still there after the processes close.
#[test]
fn refuses_the_session_db_through_links_and_keeps_every_row() {
    let env = Env::new();
    env.session_routing("slack", "C1");
    let agent = env.agent_dir();
    let mut server = env.spawn().ready();
    // -wal and -shm exist while connections are open (the test's and the server's).
    let db = env.db_path.display().to_string();
    std::os::unix::fs::symlink(&env.db_path, agent.join("db-symlink.txt")).unwrap();
    std::fs::hard_link(&env.db_path, agent.join("db-hardlink.txt")).unwrap();
    std::os::unix::fs::symlink(format!("{db}-shm"), agent.join("shm-symlink.txt")).unwrap();
    std::fs::hard_link(format!("{db}-wal"), agent.join("wal-hardlink.txt")).unwrap();
    let links = [
        "db-symlink.txt",
        "db-hardlink.txt",
        "shm-symlink.txt",
        "wal-hardlink.txt",
    ];
    for i in 0..5 {
        server
            .call("send_message", json!({"text": format!("row {i}")}))
            .ok();
        for link in links {
            let err = server.call("send_file", json!({"path": link})).err();
            assert!(err.contains("is the session database"), "{link}: {err}");
        }
    }
    drop(server);
    let Env { db, db_path, .. } = env;
    drop(db);
    let reopened = schema::SessionDb::open(&db_path).unwrap();
    let texts: Vec<String> = reopened
        .all_messages_out()
        .unwrap()
        .iter()
        .map(|row| serde_json::from_str::<Value>(&row.content).unwrap()["text"].to_string())
        .collect();
    assert_eq!(
        texts,
        (0..5).map(|i| format!("\"row {i}\"")).collect::<Vec<_>>()
    );
    let conn = rusqlite::Connection::open(&db_path).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}
