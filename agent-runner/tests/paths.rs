//! Relative paths (issue 46): the runner started in one folder with a relative workspace (flag),
//! DB (environment) and home (`--set`) makes each absolute once, against that folder, and only
//! the absolute paths travel on: a pre-agent script (which runs in the agent's folder, as every
//! CLI does) finds the workspace's files through `WORKSPACE_DIR`, and `agent-runner config`
//! shows the paths the runner uses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::binary;

use std::process::{Command, Stdio};
use std::time::Duration;

use binary::wait_until;
use schema::{NewMessageIn, SessionDb};
use serde_json::{json, Value};

#[test]
fn relative_paths_are_made_absolute_against_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    let workspace = cwd.join("ws");
    std::fs::create_dir_all(workspace.join("agent")).unwrap();
    std::fs::write(workspace.join("agent/marker.txt"), "here").unwrap();
    std::fs::write(workspace.join("config.json"), "{}").unwrap();
    let db = SessionDb::open(workspace.join("session.db")).unwrap();

    // What the runner would use, from the same folder and inputs.
    let out = Command::new(env!("CARGO_BIN_EXE_agent-runner"))
        .args([
            "--workspace",
            "ws",
            "--set",
            "homeDir=./h",
            "config",
            "--json",
        ])
        .env("SESSION_DB", "ws/session.db")
        .env("NANOCLAW_CONFIG", "ws/config.json")
        .current_dir(&cwd)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let config: Value = serde_json::from_slice(&out.stdout).unwrap();
    let shown = |key: &str| {
        config["settings"][key]["value"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        config["workspace"],
        workspace.display().to_string().as_str()
    );
    assert_eq!(
        shown("sessionDb"),
        workspace.join("session.db").display().to_string()
    );
    assert_eq!(shown("homeDir"), cwd.join("h").display().to_string());

    // A task whose script reads a file of the workspace through WORKSPACE_DIR, and a chat.
    let script = r#"test -f "$WORKSPACE_DIR/agent/marker.txt" && printf '{"wakeAgent":true,"data":{"workspace":"%s"}}\n' "$WORKSPACE_DIR""#;
    let mut task = NewMessageIn::new(
        "task",
        json!({"prompt": "check", "script": script}).to_string(),
    );
    task.series_is_self = true;
    let task = db.insert_in(&task).unwrap().id;
    let chat = db
        .insert_in(&NewMessageIn::new(
            "chat",
            json!({"sender": "Ann", "text": "hello"}).to_string(),
        ))
        .unwrap()
        .id;
    let mut runner = binary::mock_runner("ws".as_ref(), &cwd.join("runner.log"))
        .env("SESSION_DB", "ws/session.db")
        .env("NANOCLAW_MAX_MESSAGES_PER_PROMPT", "1")
        .current_dir(&cwd)
        .spawn()
        .unwrap();
    let done = |id: &str| {
        db.message_in(id)
            .unwrap()
            .is_some_and(|row| row.status == "completed")
    };
    wait_until("both rows answered", Duration::from_secs(30), || {
        done(&task) && done(&chat)
    });
    binary::sigterm(&runner);
    runner.wait().unwrap();
    let replies: Vec<String> = db
        .messages_out_after(0, 100)
        .unwrap()
        .into_iter()
        .map(|row| {
            let content: Value = serde_json::from_str(&row.content).unwrap();
            content["text"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    let expected = format!(r#""workspace": "{}""#, workspace.display());
    assert!(
        replies.iter().any(|reply| reply.contains(&expected)),
        "no reply echoes the script's absolute WORKSPACE_DIR {expected}: {replies:#?}\n{}",
        std::fs::read_to_string(cwd.join("runner.log")).unwrap()
    );
    assert!(
        replies.iter().any(|reply| reply.contains("hello")),
        "{replies:#?}"
    );
}

/// A relative path needs the working directory: started in a deleted folder, the runner refuses
/// to start, naming the setting.
#[test]
fn a_relative_path_without_a_working_directory_is_refused_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("gone");
    std::fs::create_dir(&gone).unwrap();
    let out = Command::new("sh")
        .args([
            "-c",
            r#"cd "$1" && rmdir "$1" && exec "$2" --workspace ws config"#,
            "sh",
        ])
        .arg(&gone)
        .arg(env!("CARGO_BIN_EXE_agent-runner"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--workspace (WORKSPACE_DIR): cannot make the relative path ws absolute"),
        "{stderr}"
    );
}
