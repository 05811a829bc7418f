//! Relative paths (issue 46): started in one folder with a relative `--db` and `WORKSPACE_DIR`,
//! the server makes both absolute once, against that folder. It writes to the session DB there,
//! tells the agent (whose CLI starts it in the agent's folder) the absolute folder its relative
//! paths start at, and its log names the DB whole.

use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::support::{routing, Env, Server, BIN};

#[test]
fn a_relative_db_and_workspace_are_made_absolute_against_the_working_directory() {
    let env = Env::new();
    env.batch(routing("slack", "C1", None), "in-1", None);
    std::fs::write(env.agent_dir().join("notes.txt"), "notes").unwrap();
    // The folder the relative paths are given in (`workspace/` is inside it).
    let cwd = env.dir.path().canonicalize().unwrap();
    let log = cwd.join("mcp-tools.log");
    let mut command = Command::new(BIN);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("WORKSPACE_DIR", "./workspace")
        .env("TZ", "UTC")
        .env("RUST_LOG", "info")
        .args(["--db", "workspace/session.db", "--log-format", "json"])
        .current_dir(&cwd);
    let stderr = Stdio::from(std::fs::File::create(&log).unwrap());
    let mut server = Server::spawn_with_stderr(command, stderr).ready();

    let sent = server.call("send_message", json!({"text": "hello"}));
    let row = env.db.message_out_by_seq(sent.seq()).unwrap();
    assert!(
        row.is_some(),
        "the row is in the DB of {}",
        env.db_path.display()
    );

    let missing = server
        .call("send_file", json!({"path": "missing.txt"}))
        .err();
    let agent = cwd.join("workspace/agent");
    assert!(
        missing.ends_with(&format!("relative paths start at {})", agent.display())),
        "{missing}"
    );
    let sent = server.call("send_file", json!({"path": "notes.txt"}));
    let row = env.db.message_out_by_seq(sent.seq()).unwrap().unwrap();
    let copy = cwd.join("workspace/outbox").join(&row.id).join("notes.txt");
    assert_eq!(std::fs::read_to_string(copy).unwrap(), "notes");

    server.close_stdin();
    assert!(server.child.wait().unwrap().success());
    let text = std::fs::read_to_string(&log).unwrap();
    let db = cwd.join("workspace/session.db");
    for line in text.lines() {
        let line: Value = serde_json::from_str(line).unwrap();
        assert_eq!(line["session"], db.display().to_string().as_str(), "{text}");
    }
    assert!(
        text.contains(&format!("\"db\":\"{}\"", db.display())),
        "{text}"
    );
}
