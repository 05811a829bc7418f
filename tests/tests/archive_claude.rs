//! Transcript archiving (issue 5) for the Claude provider, end to end: the real `agent-runner`
//! starts the real pinned `claude` with the `PreCompact` hook in `--settings`; a `/compact` chat
//! message (a native command, sent raw as its own query) makes Claude compact, which runs the
//! hook, which runs `agent-runner archive-hook`, which writes the conversation as Markdown into
//! `<workspace>/agent/conversations/`.
//!
//! Needs `cargo build --workspace --bins` and the claude CLI (`scripts/install-clis.sh`); a
//! missing CLI fails the tests unless `NANOCLAW_SKIP_CLI_TESTS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use e2e::fake_model::{FakeModel, Step};
use e2e::harness::{archives, start_cli_test, text_of, today_in, Session};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

fn start(test: &str) -> bool {
    start_cli_test("claude", test)
}

/// `/compact` runs Claude's PreCompact hook, configured by the provider through `--settings`:
/// the runner's own `archive-hook` writes the conversation before it is summarised (the user's
/// text, the tool call, the reply), in the configured time zone and with the assistant's name.
#[test]
fn compact_archives_the_conversation_through_the_precompact_hook() {
    if !start("compact_archives_the_conversation_through_the_precompact_hook") {
        return;
    }
    let model = FakeModel::start_with_script([
        Step::tool_call("send_message", json!({"text": "Writing it down."})),
        Step::text("Noted: the launch is on Friday at noon."),
        // Claude's compaction request: the summary.
        Step::text("<summary>Ann said the launch is on Friday at noon.</summary>"),
        Step::text("The rooftop it is."),
        Step::text("<summary>Launch on Friday at noon, on the rooftop.</summary>"),
    ])
    .unwrap();
    let mut session = Session::new();
    session.start_runner(
        "claude",
        &model,
        &[
            ("NANOCLAW_ASSISTANT_NAME", "Andy"),
            ("TZ", "America/New_York"),
        ],
    );
    let conversations = session.workspace.join("agent/conversations");
    let id = session
        .send_chat("remember that the launch is on Friday")
        .id;
    session.wait_completed(&id, WAIT);
    let replies: Vec<String> = session
        .outs()
        .iter()
        .filter(|o| o.kind == "chat")
        .map(text_of)
        .collect();
    assert_eq!(
        replies,
        [
            "Writing it down.",
            "Noted: the launch is on Friday at noon."
        ]
    );
    assert!(
        archives(&conversations).is_empty(),
        "no archive before compaction"
    );

    let compact = session.send_chat("/compact").id;
    session.wait_completed(&compact, WAIT);
    session.wait_until("an archive", WAIT, |_| !archives(&conversations).is_empty());
    let files = archives(&conversations);
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    let today = today_in("America/New_York");
    assert!(
        name.starts_with(&format!("{today}-")) && name.contains("remember-that-the-launch"),
        "{name}"
    );
    let text = std::fs::read_to_string(&files[0]).unwrap();
    eprintln!("----- {name} -----\n{text}");
    assert!(
        text.starts_with("<!-- nanoclaw-archive {\"provider\":\"claude\""),
        "{text}"
    );
    assert!(
        text.contains("### Ann"),
        "the sender heads the user's message: {text}"
    );
    assert!(
        text.contains("remember that the launch is on Friday"),
        "{text}"
    );
    assert!(text.contains("### Andy"), "the assistant's name: {text}");
    assert!(
        text.contains("- 🔧 mcp__nanoclaw__send_message({\"text\":\"Writing it down.\"})"),
        "the tool call, summarised: {text}"
    );
    assert!(
        text.contains("Noted: the launch is on Friday at noon."),
        "{text}"
    );
    assert!(text.contains("(America/New_York)"), "{text}");
    assert!(
        !text.contains("Ann said the launch"),
        "the archive holds the conversation before the summary: {text}"
    );
    // The compaction request reached the model after the hook ran.
    assert_eq!(
        model.model_requests().len(),
        3,
        "tool call, answer, compaction"
    );

    // Later compactions write new files with what came since; earlier archives stay as they are.
    let id = session.send_chat("the venue is the rooftop").id;
    session.wait_completed(&id, WAIT);
    let compact = session.send_chat("/compact").id;
    session.wait_completed(&compact, WAIT);
    session.wait_until("a second archive", WAIT, |_| {
        archives(&conversations).len() == 2
    });
    assert_eq!(std::fs::read_to_string(&files[0]).unwrap(), text);
    let second = archives(&conversations)
        .into_iter()
        .find(|p| *p != files[0])
        .unwrap();
    let second_text = std::fs::read_to_string(&second).unwrap();
    eprintln!("----- {} -----\n{second_text}", second.display());
    assert!(
        second_text.contains("the venue is the rooftop"),
        "{second_text}"
    );
    assert!(second_text.contains("The rooftop it is."), "{second_text}");
    assert!(
        !second_text.contains("remember that the launch is on Friday"),
        "only what came since the last compaction: {second_text}"
    );
    session.stop_runner();
}
