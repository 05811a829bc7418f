//! `nanoclaw`'s stderr (docs/logs.md): with `--log-format json` (or `NANOCLAW_LOG_FORMAT`) every
//! line is one JSON object naming the session DB, notes and the error included; an error is
//! written once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_nanoclaw");

fn nanoclaw(db: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(BIN)
        .env_remove("SESSION_DB")
        .env_remove("NANOCLAW_LOG_FORMAT")
        .envs(env.iter().copied())
        .arg("--db")
        .arg(db)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Every stderr line, parsed; each must name `db` as the session.
fn json_lines(output: &Output, db: &Path) -> Vec<Value> {
    let stderr = String::from_utf8_lossy(&output.stderr);
    stderr
        .lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line)
                .unwrap_or_else(|err| panic!("not a JSON line ({err}): {line}\n{stderr}"));
            assert_eq!(
                value["session"],
                db.display().to_string().as_str(),
                "{line}"
            );
            value
        })
        .collect()
}

#[test]
fn json_stderr_lines_parse_and_name_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("session.db");
    let json = ["--log-format", "json"];
    let init = nanoclaw(&db, &[], &["init", json[0], json[1]]);
    assert!(init.status.success(), "{init:?}");
    json_lines(&init, &db);

    // A note: an answer to a question nobody asked, sent anyway.
    let env = [("NANOCLAW_LOG_FORMAT", "json")];
    let answer = nanoclaw(
        &db,
        &env,
        &["answer", "--question", "q-1", "--option", "yes", "--force"],
    );
    assert!(answer.status.success(), "{answer:?}");
    let notes = json_lines(&answer, &db);
    assert!(
        notes
            .iter()
            .any(|l| l["message"].as_str().unwrap().contains("no such question")),
        "{notes:?}"
    );

    // The error: once, at level ERROR.
    let missing = dir.path().join("missing").join("session.db");
    let status = nanoclaw(&missing, &[], &["status", json[0], json[1]]);
    assert!(!status.status.success());
    let lines = json_lines(&status, &missing);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["level"], "ERROR");
    assert_eq!(lines[0]["target"], "nanoclaw");
}

#[test]
fn help_documents_rust_log_and_the_log_format() {
    let dir = tempfile::tempdir().unwrap();
    let help = nanoclaw(&dir.path().join("session.db"), &[], &["--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.contains("RUST_LOG=") && text.contains("--log-format"),
        "{text}"
    );
}
