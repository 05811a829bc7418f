//! Scenario 7, the question round trip every CLI runs alike: the agent asks with
//! `ask_user_question`, the user answers with `nanoclaw answer` while the tool blocks. Its own
//! module because the stall scenarios (`stalls.rs`) run it with a lowered progress limit too;
//! re-exported by `scenarios.rs`.

use std::time::Duration;

use serde_json::json;

use crate::fake_model::Step;
use crate::harness::{text_of, Session};
use crate::support::{fake_model, ok, some, WAIT};

/// Scenario 7: ask_user_question round trip, answered with the host CLI `nanoclaw answer` while
/// the tool blocks for `hold`; the answer reaches the model. Codex and OpenCode hold 65 s: past
/// their default 60 s MCP tool timeouts (OpenCode: the answer is no "timed out" either).
pub fn ask_user_question_answered_with_nanoclaw_answer(provider: &str, hold: Duration) {
    ask_user_question_answered_with_env(provider, hold, &[]);
}

/// Scenario 7 with the runner's extra environment (e.g. a lowered progress limit).
pub fn ask_user_question_answered_with_env(
    provider: &str,
    hold: Duration,
    extra_env: &[(&str, &str)],
) {
    let model = fake_model([
        Step::tool_call(
            "ask_user_question",
            json!({"question": "Deploy to production?", "options": ["Yes", "No"]}),
        ),
        Step::text("Deploying now."),
    ]);
    let mut session = Session::new();
    session.start_runner(provider, &model, extra_env);
    let id = session.send_chat("deploy it").id;
    let question = session.wait_question(WAIT);
    let question_id = some(question["questionId"].as_str(), "a question id").to_owned();
    if provider == "claude" {
        assert_eq!(question["question"], "Deploy to production?");
    }
    // mcp-tools switches the status in the question row's own transaction.
    assert_eq!(
        some(
            ok(session.db.runner_state(), "reading the runner state"),
            "a runner state"
        )
        .status,
        "waiting_user"
    );
    std::thread::sleep(hold);
    let waiter = match provider {
        "claude" => "claude",
        "codex" => "Codex",
        "opencode" => "OpenCode",
        other => other,
    };
    assert_eq!(
        model.model_requests().len(),
        1,
        "{waiter} still waits for the tool"
    );
    session.answer_question(&question_id, "Yes");
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "Deploying now.");
    let request = some(model.model_requests().pop(), "a model request");
    let results = request.tool_results().join("\n");
    assert!(
        results.contains("Yes"),
        "the answer reached the model: {results}"
    );
    if provider == "opencode" {
        assert!(!results.to_lowercase().contains("timed out"), "{results}");
    }
    session.stop_runner();
}
