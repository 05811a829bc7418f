//! Transcript archiving (issue 5) for the OpenCode provider, end to end: after each query the
//! real `agent-runner` reads the session back from the real pinned `opencode serve`
//! (`GET /session/{id}/message`) and writes what no earlier archive holds as Markdown into
//! `<workspace>/agent/conversations/`.
//!
//! Needs `cargo build --workspace --bins` and the opencode CLI (`scripts/install-clis.sh`); a
//! missing CLI fails the tests unless `NANOCLAW_SKIP_CLI_TESTS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::fake_model::{FakeModel, Step};
use e2e::harness::{cli, run_in_loopback_netns, text_of, Session};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

fn start(test: &str) -> bool {
    cli("opencode", "OPENCODE_PATH").is_some() && run_in_loopback_netns(test)
}

/// The `.md` files in `dir`, sorted by name.
fn archives(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "md"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Every archive's text, concatenated in name order.
fn all_text(dir: &Path) -> String {
    archives(dir)
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Today's date in `tz` as `YYYY-MM-DD`, from `date` (the e2e crate has no time-zone library).
fn today(tz: &str) -> String {
    let out = std::process::Command::new("date")
        .arg("+%Y-%m-%d")
        .env("TZ", tz)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A query with a send_message call and a text answer is archived after it completes (the
/// user's text, the tool call summarised, the reply); the next query's entries are added to the
/// same day's archive of the session, without losing, repeating or replacing anything.
#[test]
fn each_query_is_archived_without_losing_earlier_entries() {
    if !start("each_query_is_archived_without_losing_earlier_entries") {
        return;
    }
    let model = FakeModel::start_with_script([
        Step::tool_call(
            "send_message",
            json!({"text": "Checking the pipeline now."}),
        ),
        Step::text("The pipeline is green."),
        Step::text("Nothing else is pending."),
    ])
    .unwrap();
    let mut session = Session::new();
    session.start_runner(
        "opencode",
        &model,
        &[("NANOCLAW_ASSISTANT_NAME", "Andy"), ("TZ", "Asia/Tokyo")],
    );
    let conversations = session.workspace.join("agent/conversations");

    let first = session.send_chat("is the pipeline green?").id;
    session.wait_completed(&first, WAIT);
    let replies: Vec<String> = session
        .outs()
        .iter()
        .filter(|o| o.kind == "chat")
        .map(text_of)
        .collect();
    assert_eq!(
        replies,
        ["Checking the pipeline now.", "The pipeline is green."]
    );
    session.wait_until("the first archive", WAIT, |_| {
        all_text(&conversations).contains("The pipeline is green.")
    });
    let files = archives(&conversations);
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&format!("{}-", today("Asia/Tokyo")))
            && name.contains("is-the-pipeline-green"),
        "{name}"
    );
    let first_text = std::fs::read_to_string(&files[0]).unwrap();
    eprintln!("----- {name} after the first query -----\n{first_text}");
    assert!(
        first_text.starts_with("<!-- nanoclaw-archive {\"provider\":\"opencode\""),
        "{first_text}"
    );
    assert!(first_text.contains("### Ann"), "{first_text}");
    assert!(
        first_text.contains("is the pipeline green?"),
        "{first_text}"
    );
    assert!(first_text.contains("### Andy"), "{first_text}");
    assert!(
        first_text.contains(
            "- 🔧 nanoclaw_send_message({\"text\":\"Checking the pipeline now.\"}) → Message sent"
        ),
        "the tool call, summarised: {first_text}"
    );
    assert!(
        first_text.contains("The pipeline is green."),
        "{first_text}"
    );
    assert!(first_text.contains("(Asia/Tokyo)"), "{first_text}");

    let second = session.send_chat("anything else pending?").id;
    session.wait_completed(&second, WAIT);
    session.wait_until("the second query archived", WAIT, |_| {
        all_text(&conversations).contains("Nothing else is pending.")
    });
    let all = all_text(&conversations);
    eprintln!("----- every archive after the second query -----\n{all}");
    // Nothing lost, nothing repeated (the user texts inside their prompt XML, not the title).
    for text in [
        ">is the pipeline green?</message>",
        "Checking the pipeline now.",
        "The pipeline is green.",
        ">anything else pending?</message>",
        "Nothing else is pending.",
    ] {
        assert_eq!(all.matches(text).count(), 1, "{text:?} once: {all}");
    }
    let files = archives(&conversations);
    if files.len() == 1 {
        // The same day: appended to the first archive, which still starts with what it held.
        let text = std::fs::read_to_string(&files[0]).unwrap();
        assert!(text.starts_with(&first_text), "{text}");
    } else {
        // Midnight in Tokyo passed in between: a new file, the first one untouched.
        assert_eq!(files.len(), 2, "{files:?}");
        assert!(files
            .iter()
            .any(|f| std::fs::read_to_string(f).unwrap() == first_text));
    }
    assert_eq!(model.model_requests().len(), 3);
    session.stop_runner();
    let log = session.runner_log();
    for line in log.lines().filter(|l| {
        l.contains("archived") || l.contains("turn answered") || l.contains("transcript")
    }) {
        eprintln!("runner: {line}");
    }
    assert_eq!(
        log.matches("opencode transcript archived").count(),
        2,
        "{log}"
    );
}

/// After a restart the runner resumes the session in a new `opencode serve`; the next archive
/// holds only the entries after the ones archived before the restart.
#[test]
fn archiving_after_a_restart_adds_only_the_new_entries() {
    if !start("archiving_after_a_restart_adds_only_the_new_entries") {
        return;
    }
    let model =
        FakeModel::start_with_script([Step::text("Noted: PAPAYA."), Step::text("It was PAPAYA.")])
            .unwrap();
    let mut session = Session::new();
    session.start_runner("opencode", &model, &[]);
    let conversations = session.workspace.join("agent/conversations");
    let id = session.send_chat("remember PAPAYA").id;
    session.wait_completed(&id, WAIT);
    session.wait_until("the first archive", WAIT, |_| {
        all_text(&conversations).contains("Noted: PAPAYA.")
    });
    let first_text = all_text(&conversations);
    session.kill_runner();

    session.start_runner("opencode", &model, &[]);
    let id = session.send_chat("what was the word?").id;
    session.wait_completed(&id, WAIT);
    session.wait_until("the second archive", WAIT, |_| {
        all_text(&conversations).contains("It was PAPAYA.")
    });
    let all = all_text(&conversations);
    eprintln!("----- every archive after the restart -----\n{all}");
    for text in [
        ">remember PAPAYA</message>",
        "Noted: PAPAYA.",
        ">what was the word?</message>",
        "It was PAPAYA.",
    ] {
        assert_eq!(all.matches(text).count(), 1, "{text:?} once: {all}");
    }
    assert!(
        all.starts_with(&first_text),
        "the first archive kept: {all}"
    );
    session.stop_runner();
}
