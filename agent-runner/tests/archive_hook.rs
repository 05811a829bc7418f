//! `agent-runner archive-hook` run as Claude runs it: the built binary, the hook JSON on stdin
//! (the real PreCompact payload captured in `provider/tests/fixtures/archive/`, its
//! `transcript_path` pointed at a copy of the captured session file).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const HOOK: &str =
    include_str!("../../provider/tests/fixtures/archive/claude_precompact_hook.json");
const SESSION: &str = include_str!("../../provider/tests/fixtures/archive/claude_session.jsonl");
const COMPACTED: &str =
    include_str!("../../provider/tests/fixtures/archive/claude_session_compacted.jsonl");
const SLUG: &str = "can-you-check-the-build-tell-me-if-it-s-green";

/// A private workspace with the transcript copied in, and the hook JSON pointing at it.
fn setup(transcript: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("session.jsonl");
    std::fs::write(&path, transcript).unwrap();
    let mut hook: Value = serde_json::from_str(HOOK).unwrap();
    hook["transcript_path"] = Value::String(path.display().to_string());
    (dir, hook.to_string())
}

/// Runs `sh -c <command>` (as Claude runs a hook command) with `stdin`, in `workspace`.
fn run_shell(command: &str, stdin: &str, workspace: &Path) -> Output {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(command)
        .env("WORKSPACE_DIR", workspace)
        .env_remove("NANOCLAW_CONFIG")
        .env("RUST_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn runner() -> String {
    shell_quote(env!("CARGO_BIN_EXE_agent-runner"))
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

fn hook(args: &str, stdin: &str, workspace: &Path) -> Output {
    let output = run_shell(
        &format!("{} archive-hook {args}", runner()),
        stdin,
        workspace,
    );
    assert!(
        output.status.success(),
        "exit status {:?}: {}",
        output.status,
        stderr(&output)
    );
    output
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The archive names in `dir`, sorted, with the date prefix checked and removed.
fn archives(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let (date, rest) = name.split_at(11);
            assert!(
                date.len() == 11
                    && date.as_bytes()[4] == b'-'
                    && date.as_bytes()[7] == b'-'
                    && date.ends_with('-'),
                "{name}"
            );
            rest.to_owned()
        })
        .collect()
}

#[test]
fn archives_the_transcript_and_never_overwrites() {
    let (dir, input) = setup(SESSION);
    let conversations = dir.path().join("conversations");
    let args = format!(
        "--conversations-dir {} --timezone America/Los_Angeles",
        shell_quote(&conversations.display().to_string())
    );

    let output = hook(&args, &input, dir.path());
    assert!(
        stderr(&output).contains("transcript archived"),
        "{}",
        stderr(&output)
    );
    assert_eq!(archives(&conversations), [format!("{SLUG}.md")]);
    let first = std::fs::read_dir(&conversations)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let text = std::fs::read_to_string(&first).unwrap();
    assert!(text.starts_with("<!-- nanoclaw-archive {\"provider\":\"claude\",\"session\":\"1c42be55-1c59-4cda-b3df-58149ba01880\"} -->\n# Can you check the build & tell me if it's green?\n"), "{text}");
    assert!(text.contains("(America/Los_Angeles)"), "{text}");
    assert!(text.contains("- 🔧 Bash({\"command\":\"sleep 2; echo build ok\",\"description\":\"check the build\"}) → build ok"), "{text}");
    assert!(text.contains("[… 803 more characters]"), "{text}");
    assert!(text.contains("Nothing else for now."), "{text}");

    // The same hook again (Claude compacts twice on one day): a second file, the first intact.
    hook(&args, &input, dir.path());
    assert_eq!(
        archives(&conversations),
        [format!("{SLUG}-2.md"), format!("{SLUG}.md")]
    );
    assert_eq!(std::fs::read_to_string(&first).unwrap(), text);
}

#[test]
fn defaults_to_the_workspace_conversations_folder() {
    let (dir, input) = setup(SESSION);
    // The hook command the Claude provider installs, from `claude_hook_settings`, minus the
    // folder: the default is <workspace>/agent/conversations.
    let settings = claude::claude_hook_settings(
        Path::new(env!("CARGO_BIN_EXE_agent-runner")),
        &dir.path().join("agent/conversations"),
        "UTC",
    );
    let command = settings["hooks"]["PreCompact"][0]["hooks"][0]["command"]
        .as_str()
        .unwrap();
    let output = run_shell(command, &input, dir.path());
    assert!(output.status.success(), "{}", stderr(&output));
    let output = hook("--timezone UTC", &input, dir.path());
    assert!(
        stderr(&output).contains("transcript archived"),
        "{}",
        stderr(&output)
    );
    assert_eq!(
        archives(&dir.path().join("agent/conversations")),
        [format!("{SLUG}-2.md"), format!("{SLUG}.md")]
    );
}

#[test]
fn after_a_compaction_only_the_new_part_is_archived() {
    let (dir, input) = setup(COMPACTED);
    let conversations = dir.path().join("c");
    let args = format!(
        "--conversations-dir {}",
        shell_quote(&conversations.display().to_string())
    );
    // Only the compaction notice and CLI notes follow the boundary: nothing to archive.
    let output = hook(&args, &input, dir.path());
    assert!(
        stderr(&output).contains("nothing to archive"),
        "{}",
        stderr(&output)
    );
    assert!(!conversations.exists());
    hook(&format!("{args} --full"), &input, dir.path());
    let names = archives(&conversations);
    assert_eq!(names, [format!("{SLUG}.md")]);
    let text = std::fs::read_to_string(
        conversations
            .read_dir()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path(),
    )
    .unwrap();
    assert!(
        text.contains("Conversation compacted (manual, 15 tokens before)"),
        "{text}"
    );

    // A later transcript: the part since the boundary only, named after its first prompt.
    let later = format!(
        "{COMPACTED}{}\n{}\n",
        r#"{"type":"user","message":{"role":"user","content":"<message id=\"10\" sender=\"Jane\">Deploy it please</message>"},"uuid":"u-10","timestamp":"2026-11-22T09:00:00.000Z","sessionId":"1c42be55-1c59-4cda-b3df-58149ba01880"}"#,
        r#"{"type":"assistant","message":{"id":"m-10","role":"assistant","content":[{"type":"text","text":"Deployed."}]},"uuid":"a-10","timestamp":"2026-11-22T09:00:01.000Z","sessionId":"1c42be55-1c59-4cda-b3df-58149ba01880"}"#
    );
    std::fs::write(dir.path().join("session.jsonl"), later).unwrap();
    hook(&args, &input, dir.path());
    let names = archives(&conversations);
    assert!(
        names.contains(&"deploy-it-please.md".to_owned()),
        "{names:?}"
    );
    let path = conversations
        .read_dir()
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with("deploy-it-please.md"))
        .unwrap();
    let text = std::fs::read_to_string(path).unwrap();
    assert!(
        text.contains("Conversation compacted")
            && text.contains("Deployed.")
            && !text.contains("Nothing else for now."),
        "{text}"
    );
}

#[test]
fn problems_are_logged_and_the_hook_still_succeeds() {
    let (dir, input) = setup(SESSION);
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, "x").unwrap();
    let missing: Value = serde_json::json!({"session_id": "s", "transcript_path": dir.path().join("gone.jsonl"), "hook_event_name": "PreCompact"});
    let cases: [(String, String, &str); 4] = [
        (
            "--conversations-dir /tmp/x".into(),
            "not json".into(),
            "not the expected JSON",
        ),
        (
            "--conversations-dir /tmp/x".into(),
            "{\"session_id\":\"s\"}".into(),
            "no transcript_path",
        ),
        (
            "--conversations-dir /tmp/x".into(),
            missing.to_string(),
            "reading the transcript",
        ),
        (
            format!(
                "--conversations-dir {}",
                shell_quote(&blocker.join("sub").display().to_string())
            ),
            input.clone(),
            "writing into",
        ),
    ];
    for (args, stdin, want) in cases {
        let output = hook(&args, &stdin, dir.path());
        let err = stderr(&output);
        assert!(
            err.contains("nothing archived") && err.contains(want),
            "{args} / {stdin}: {err}"
        );
    }
    // A broken config.json is reported, and the hook still archives with defaults.
    std::fs::write(dir.path().join("config.json"), "{broken").unwrap();
    let conversations: PathBuf = dir.path().join("ok");
    let output = hook(
        &format!(
            "--conversations-dir {}",
            shell_quote(&conversations.display().to_string())
        ),
        &input,
        dir.path(),
    );
    let err = stderr(&output);
    assert!(
        err.contains("configuration did not load") && err.contains("transcript archived"),
        "{err}"
    );
}
