//! The operator's log (issue 13, point 1; docs/logs.md): the `agent-runner` binary's stderr in
//! both formats. One `turn ended` line per turn with its fields, JSON lines that all parse and
//! name the session (and, inside a turn, its seqs), a fatal error and a provider error written
//! once, and the Claude CLI's argument line kept out of the INFO log.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::binary;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use binary::{mock_runner, sigterm, wait_until};
use schema::{NewMessageIn, SessionDb};
use serde_json::{json, Value};

fn chat(text: &str) -> NewMessageIn {
    NewMessageIn::new("chat", json!({"sender": "Ann", "text": text}).to_string())
}

/// Runs `runner` until every row of `ids` is completed (or, with `until` set, until the log
/// holds it), stops it with SIGTERM and returns its stderr.
fn run_until(
    mut runner: Command,
    log: &Path,
    db: &SessionDb,
    ids: &[String],
    until: Option<&str>,
) -> String {
    let mut child = runner.spawn().unwrap();
    wait_until("the turn", Duration::from_secs(20), || match until {
        Some(text) => std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains(text),
        None => ids
            .iter()
            .all(|id| db.message_in(id).unwrap().unwrap().status == "completed"),
    });
    sigterm(&child);
    child.wait().unwrap();
    std::fs::read_to_string(log).unwrap()
}

/// Every stderr line as JSON; fails on a line that is not one JSON object.
fn json_lines(stderr: &str) -> Vec<Value> {
    stderr
        .lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line)
                .unwrap_or_else(|err| panic!("not a JSON line ({err}): {line}\n{stderr}"));
            assert!(value.is_object(), "{line}");
            value
        })
        .collect()
}

fn seqs_of(db: &SessionDb, ids: &[String]) -> Value {
    json!(ids
        .iter()
        .map(|id| db.message_in(id).unwrap().unwrap().seq.unwrap())
        .collect::<Vec<_>>())
}

#[test]
fn json_lines_all_parse_and_carry_the_session_and_the_turn_seqs() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("session.db");
    let db = SessionDb::open(&db_path).unwrap();
    let ids: Vec<String> = ["one", "two"]
        .iter()
        .map(|text| db.insert_in(&chat(text)).unwrap().id)
        .collect();
    let log = dir.path().join("runner.log");
    let mut runner = mock_runner(dir.path(), &log);
    runner.arg("--log-format").arg("json");
    let stderr = run_until(runner, &log, &db, &ids, None);

    let lines = json_lines(&stderr);
    assert!(lines.len() >= 3, "{stderr}");
    for line in &lines {
        assert_eq!(
            line["session"],
            json!(db_path.display().to_string()),
            "{line}"
        );
        for key in ["timestamp", "level", "target", "message"] {
            assert!(line.get(key).is_some(), "{key} missing: {line}");
        }
    }
    let turns: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"] == "turn ended")
        .collect();
    assert_eq!(turns.len(), 1, "one prompt, one turn: {stderr}");
    let turn = turns[0];
    let seqs = seqs_of(&db, &ids);
    assert_eq!(turn["level"], "INFO");
    assert_eq!(turn["span"], "turn");
    assert_eq!(turn["seqs"], seqs, "{turn}");
    assert_eq!(turn["answered"], seqs, "{turn}");
    assert_eq!(turn["provider"], "mock");
    assert_eq!(turn["outcome"], "answered");
    assert!(turn["duration_ms"].is_u64(), "{turn}");
}

#[test]
fn the_variable_and_the_config_file_select_json_too() {
    for how in ["env", "config.json"] {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open(dir.path().join("session.db")).unwrap();
        let ids = vec![db.insert_in(&chat("hello")).unwrap().id];
        let log = dir.path().join("runner.log");
        let mut runner = mock_runner(dir.path(), &log);
        match how {
            "env" => {
                runner.env("NANOCLAW_LOG_FORMAT", "json");
            }
            _ => {
                std::fs::write(dir.path().join("config.json"), r#"{"logFormat": "json"}"#).unwrap()
            }
        }
        let stderr = run_until(runner, &log, &db, &ids, None);
        let lines = json_lines(&stderr);
        assert_eq!(
            lines
                .iter()
                .filter(|l| l["message"] == "turn ended")
                .count(),
            1,
            "{how}: {stderr}"
        );
    }
}

#[test]
fn the_text_log_has_one_turn_line_per_turn() {
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    let log = dir.path().join("runner.log");
    let mut child = mock_runner(dir.path(), &log).spawn().unwrap();
    // Two messages, the second after the first was answered: two turns.
    let mut ids = Vec::new();
    for text in ["one", "two"] {
        let id = db.insert_in(&chat(text)).unwrap().id;
        wait_until("the answer", Duration::from_secs(20), || {
            db.message_in(&id).unwrap().unwrap().status == "completed"
        });
        ids.push(id);
    }
    sigterm(&child);
    child.wait().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    // Time and duration vary: the rest of each line is the snapshot.
    let turns: Vec<String> = stderr
        .lines()
        .filter(|line| line.contains("turn ended"))
        .map(|line| {
            let (_time, rest) = line.split_once(' ').unwrap();
            let (head, tail) = rest.split_once("duration_ms=").unwrap();
            format!(
                "<time>{head}duration_ms=<ms>{}",
                tail.trim_start_matches(char::is_numeric)
            )
        })
        .collect();
    let seqs = seqs_of(&db, &ids);
    assert_eq!(seqs, json!([2, 4]), "the snapshot names these seqs");
    expect_test::expect![[r#"
        [
            "<time> INFO turn{seqs=[2]}: turn ended provider=\"mock\" outcome=\"answered\" answered=[2] duration_ms=<ms>",
            "<time> INFO turn{seqs=[4]}: turn ended provider=\"mock\" outcome=\"answered\" answered=[4] duration_ms=<ms>",
        ]
    "#]]
    .assert_debug_eq(&turns);
}

#[test]
fn a_fatal_error_is_written_once() {
    let dir = tempfile::tempdir().unwrap();
    for format in ["text", "json"] {
        let output = Command::new(env!("CARGO_BIN_EXE_agent-runner"))
            .arg("--workspace")
            .arg(dir.path())
            .args(["--provider", "mock", "--log-format", format])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        let mentions: Vec<&str> = stderr
            .lines()
            .filter(|line| line.contains("does not exist"))
            .collect();
        assert_eq!(mentions.len(), 1, "{format}: {stderr}");
        match format {
            "text" => assert!(
                mentions[0].starts_with("agent-runner: the session DB"),
                "{stderr}"
            ),
            _ => {
                let lines = json_lines(&stderr);
                let last = lines.last().unwrap();
                assert_eq!(last["level"], "ERROR");
                assert_eq!(last["target"], "agent-runner");
                let db = dir.path().join("session.db");
                assert_eq!(last["session"], json!(db.display().to_string()));
            }
        }
    }
}

/// A CLI that fails at once: the turn fails without a model.
fn failing_cli(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("failing-cli");
    std::fs::write(&path, "#!/bin/sh\necho 'fake cli: refused' >&2\nexit 3\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The runner's stderr at INFO for one message answered by `provider` running `failing_cli`.
fn failed_turn_log(provider: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    let ids = vec![db.insert_in(&chat("hello")).unwrap().id];
    let cli = failing_cli(dir.path());
    let log = dir.path().join("runner.log");
    let mut runner = Command::new(env!("CARGO_BIN_EXE_agent-runner"));
    runner
        .arg("--workspace")
        .arg(dir.path())
        .args(["--provider", provider, "--set", "queryRetries=0", "--set"])
        .arg(format!("{provider}Path={}", cli.display()))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    run_until(runner, &log, &db, &ids, Some("turn ended"))
}

#[test]
fn a_failed_claude_turn_is_one_error_line_with_its_class_and_no_argument_line() {
    let stderr = failed_turn_log("claude");
    assert!(stderr.contains("starting claude"), "{stderr}");
    // The argument line (1.5 KB of flags) is DEBUG only.
    assert!(!stderr.contains("claude arguments"), "{stderr}");
    assert!(!stderr.contains("--output-format"), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("claude exited during the query"))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("ERROR") && errors[0].contains("class="),
        "{stderr}"
    );
}

#[test]
fn an_opencode_start_failure_is_logged_once() {
    let stderr = failed_turn_log("opencode");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("cannot start opencode serve"))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("outcome=\"failed\""), "{stderr}");
}

#[test]
fn help_documents_rust_log_and_the_log_format() {
    let help = Command::new(env!("CARGO_BIN_EXE_agent-runner"))
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.contains("RUST_LOG=") && text.contains("--log-format"),
        "{text}"
    );
}

/// A misspelled setting variable is ignored, so the runner names it at start with the setting
/// it resembles; the setting itself keeps its default meanwhile.
#[test]
fn a_misspelled_setting_variable_is_named_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();
    let log = dir.path().join("runner.log");
    let mut runner = mock_runner(dir.path(), &log);
    runner.env("NANOCLAW_MAX_TURN_SEC", "30");
    let id = db.insert_in(&chat("hello")).unwrap().id;
    let stderr = run_until(runner, &log, &db, &[id], None);
    let warning = stderr
        .lines()
        .find(|line| line.contains("NANOCLAW_MAX_TURN_SEC "))
        .unwrap_or_else(|| panic!("no line names the variable:\n{stderr}"));
    let (_time, rest) = warning.split_once(' ').unwrap();
    expect_test::expect![[r#" WARN NANOCLAW_MAX_TURN_SEC is set but no setting reads it, so it is ignored: did you mean NANOCLAW_MAX_TURN_SECS? (`agent-runner --help` lists every variable)"#]]
    .assert_eq(rest);
}
