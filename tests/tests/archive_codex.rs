//! Transcript archiving (issue 5) for the Codex provider, end to end: after each query the real
//! `agent-runner` reads the thread back from the real pinned `codex app-server` (`thread/read`)
//! and writes what no earlier archive holds as Markdown into `<workspace>/agent/conversations/`.
//!
//! Needs `cargo build --workspace --bins` and the codex CLI (`scripts/install-clis.sh`); a
//! missing CLI fails the tests unless `NANOCLAW_SKIP_CLI_TESTS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use e2e::fake_model::{FakeModel, Step};
use e2e::harness::archives_text as all_text;
use e2e::harness::{archives, start_cli_test, text_of, today_in, Session};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

fn start(test: &str) -> bool {
    start_cli_test("codex", test)
}

/// A query with a send_message call and a text answer is archived after it completes (the
/// user's text, the tool call summarised, the reply); the next query's entries are added to the
/// same day's archive of the session, without losing or repeating anything.
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
        "codex",
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
        name.starts_with(&format!("{}-", today_in("Asia/Tokyo")))
            && name.contains("is-the-pipeline-green"),
        "{name}"
    );
    let first_text = std::fs::read_to_string(&files[0]).unwrap();
    eprintln!("----- {name} after the first query -----\n{first_text}");
    assert!(
        first_text.starts_with("<!-- nanoclaw-archive {\"provider\":\"codex\""),
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
            "- 🔧 mcp__nanoclaw__send_message({\"text\":\"Checking the pipeline now.\"})"
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
    eprintln!("----- runner log -----\n{log}");
    assert_eq!(log.matches("codex transcript archived").count(), 2, "{log}");
}

/// After a restart the runner resumes the thread in a new app-server; the next archive holds
/// only the entries after the ones archived before the restart.
#[test]
fn archiving_after_a_restart_adds_only_the_new_entries() {
    if !start("archiving_after_a_restart_adds_only_the_new_entries") {
        return;
    }
    let model =
        FakeModel::start_with_script([Step::text("Noted: PAPAYA."), Step::text("It was PAPAYA.")])
            .unwrap();
    let mut session = Session::new();
    session.start_runner("codex", &model, &[]);
    let conversations = session.workspace.join("agent/conversations");
    let id = session.send_chat("remember PAPAYA").id;
    session.wait_completed(&id, WAIT);
    session.wait_until("the first archive", WAIT, |_| {
        all_text(&conversations).contains("Noted: PAPAYA.")
    });
    session.kill_runner();

    session.start_runner("codex", &model, &[]);
    let id = session.send_chat("what was the word?").id;
    session.wait_completed(&id, WAIT);
    session.wait_until("the second archive", WAIT, |_| {
        all_text(&conversations).contains("It was PAPAYA.")
    });
    let all = all_text(&conversations);
    for text in [
        ">remember PAPAYA</message>",
        "Noted: PAPAYA.",
        ">what was the word?</message>",
        "It was PAPAYA.",
    ] {
        assert_eq!(all.matches(text).count(), 1, "{text:?} once: {all}");
    }
    session.stop_runner();
}
