//! End-to-end acceptance scenarios (issue 4) for the Claude provider: the real `agent-runner`
//! binary with `--provider claude` drives the real pinned `claude -p` stream-json process against
//! the fake model server, with the real `mcp-tools` and the host CLI `nanoclaw`, inside a
//! loopback-only network namespace when the machine allows it.
//!
//! The scenarios are shared by every CLI (`e2e::scenarios`, with Claude's arms there: its `Bash`
//! tool, `x-api-key`, the parent-death check on restart); each test here runs one of them for
//! Claude. Claude's own follow-up behaviour (a queued follow-up gets its own turn; one sent while
//! a tool runs joins the running turn) and its native image block are tested here directly.
//!
//! Needs `cargo build --workspace --bins` (agent-runner, mcp-tools, nanoclaw) and the claude CLI
//! (`scripts/install-clis.sh`); a missing CLI fails the tests unless `NANOCLAW_SKIP_CLI_TESTS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use e2e::fake_model::{FakeModel, Step};
use e2e::harness::claude_user_texts as user_texts;
use e2e::harness::{chat_outs, start_cli_test, system_actions, test_routing, text_of, Session};
use e2e::scenarios::WAIT;
use schema::NewMessageIn;
use serde_json::json;

const CLI: &str = "claude";

/// Skips (CLI tests disabled), or re-runs the test in a loopback-only namespace; `true` = run
/// the body here.
fn start(test: &str) -> bool {
    start_cli_test(CLI, test)
}

e2e::scenario_tests! { CLI;
    /// Scenario 1: A chat message → the model's text reply → one `messages_out` row with the
    /// routing copied.
    chat_message_gets_one_reply_with_the_routing();

    /// Scenario 2: The model calls send_message through mcp-tools → that row exists; the turn's
    /// final text (the same words) is not delivered twice.
    send_message_tool_row_is_not_delivered_twice();

    /// Scenario 4: Restart: the runner is killed and started again; the next message resumes the
    /// same Claude session (the model's request carries the earlier history).
    restart_resumes_the_same_session();

    /// Scenario 5: Model API 500 and 429 (with retry headers): bounded retries, an Error, a
    /// `query_error` system row, the rows left for the host's sweep; the next message is answered
    /// normally.
    api_errors_write_query_error_and_leave_rows_for_the_sweep();

    /// Scenario 6: The CLI process is killed mid-turn: Error, the runner survives, the next message
    /// is answered.
    killed_cli_mid_turn_runner_survives();

    /// Scenario 7: ask_user_question round trip, answered with the host CLI `nanoclaw answer` while
    /// the tool blocks; the answer reaches the model.
    ask_user_question_answered_with_nanoclaw_answer(Duration::from_secs(3));

    /// Scenario 8: A marker secret in the runner's environment is absent from the environment of a
    /// shell command the agent runs; so is the model API key (Claude reads it through apiKeyHelper,
    /// not its environment).
    shell_command_never_sees_secrets();

    /// Scenario 9: A stored continuation naming a session that no longer exists → a fresh session,
    /// the message answered, the stored continuation replaced.
    stale_continuation_is_replaced_by_a_fresh_session();
}

/// Scenario 3: Follow-up mid-turn: the first answer stalls, a second message arrives and is pushed;
/// the model's next request contains it, both messages end `completed`. Claude queues a prompt
/// written while the answer streams, so each message gets its own turn and reply.
#[test]
fn follow_up_mid_turn_reaches_the_model_and_both_complete() {
    if !start("follow_up_mid_turn_reaches_the_model_and_both_complete") {
        return;
    }
    let model = FakeModel::start_with_script([
        Step::stall(3_000, Step::text("First answer.")),
        Step::text("Second answer."),
    ])
    .unwrap();
    let mut session = Session::new();
    session.start_runner("claude", &model, &[]);
    let first = session.send_chat("first question").id;
    model.wait_for_model_requests(1, WAIT).unwrap();
    let second = session.send_chat("second question").id;
    session.wait_completed(&first, WAIT);
    session.wait_completed(&second, WAIT);
    let requests = model.model_requests();
    assert_eq!(requests.len(), 2, "one turn each");
    let last = user_texts(&requests[1]).pop().unwrap();
    assert!(last.contains("second question"), "{last}");
    let chats = chat_outs(&session);
    let texts: Vec<String> = chats.iter().map(text_of).collect();
    assert_eq!(texts, vec!["First answer.", "Second answer."], "{chats:#?}");
    assert_eq!(
        session.db.replies_to(&second).unwrap().len(),
        1,
        "the second reply answers the second message"
    );
    session.stop_runner();
}

/// Scenario 3b: Follow-up while a tool runs: Claude folds it into the running turn (the model sees
/// it beside the tool result), one reply answers both and both rows complete together.
#[test]
fn follow_up_during_a_tool_joins_the_running_turn() {
    if !start("follow_up_during_a_tool_joins_the_running_turn") {
        return;
    }
    let model = FakeModel::start_with_script([
        Step::raw_tool_call("Bash", json!({"command": "sleep 3", "description": "wait"})),
        Step::text("Answering both."),
    ])
    .unwrap();
    let mut session = Session::new();
    session.start_runner("claude", &model, &[]);
    let first = session.send_chat("first question").id;
    model.wait_for_model_requests(1, WAIT).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let second = session.send_chat("second question").id;
    session.wait_completed(&first, WAIT);
    session.wait_completed(&second, WAIT);
    let requests = model.model_requests();
    assert_eq!(requests.len(), 2, "one turn for both");
    assert!(
        requests[1].system_text().contains("second question"),
        "the follow-up reached the model mid-turn: {}",
        requests[1].system_text()
    );
    let chats = chat_outs(&session);
    assert_eq!(chats.len(), 1, "{chats:#?}");
    assert_eq!(text_of(&chats[0]), "Answering both.");
    session.stop_runner();
}

/// Issue 6: an image attachment reaches Claude as a native image block beside the prompt text.
#[test]
fn image_attachment_reaches_the_model_natively() {
    if !start("image_attachment_reaches_the_model_natively") {
        return;
    }
    // A 1×1 PNG.
    const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVQI12P4z8AAAAMBAQAY3Y2wAAAAAElFTkSuQmCC";
    let model = FakeModel::start_with_script([Step::text("A red pixel.")]).unwrap();
    let mut session = Session::new();
    session.start_runner("claude", &model, &[]);
    let mut row = NewMessageIn::new(
        "chat",
        json!({
            "sender": "Ann", "senderId": "u-ann", "text": "what is this?",
            "attachments": [{"type": "image", "name": "pixel.png", "mimeType": "image/png", "data": PNG}]
        })
        .to_string(),
    );
    row.routing = test_routing();
    let id = session.insert(row).id;
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "A red pixel.");
    let request = model.model_requests().pop().unwrap();
    let last_user = request.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap()
        .clone();
    let blocks = last_user["content"].as_array().unwrap();
    assert!(
        blocks.iter().any(|b| b["type"] == "image"
            && b["source"]["media_type"] == "image/png"
            && b["source"]["data"] == PNG),
        "{last_user:#}"
    );
    assert!(
        user_texts(&request)
            .iter()
            .any(|t| t.contains("what is this?") && t.contains("pixel.png")),
        "{:?}",
        user_texts(&request)
    );
    session.stop_runner();
}

// Issue 10: the fault scenarios every CLI runs alike (tests/src/stalls.rs, stops.rs,
// leftovers.rs, credentials.rs, secrets.rs), declared in `e2e::fault_scenario_tests!`.
e2e::fault_scenario_tests! { CLI; model_key_test = model_key_stays_with_the_runner_claude }

// Issue 14: usage and budgets (tests/src/usage_scenarios.rs), declared in
// `e2e::usage_scenario_tests!`.
e2e::usage_scenario_tests! { CLI }

// Issue 15: turn control (tests/src/turn_scenarios.rs), declared in `e2e::turn_scenario_tests!`.
e2e::turn_scenario_tests! { CLI }

// Issue 16: tool policy, approvals, approval stops (tests/src/policy_scenarios.rs), declared in
// `e2e::policy_scenario_tests!`.
e2e::policy_scenario_tests! { CLI }

/// Issue 13: Claude selected without its key warns at start naming the variable, and the
/// message's `query_error` says the same instead of Claude's "Please run /login" (advice a
/// runner's user cannot follow). Claude refuses before any request: the model is never called.
#[test]
fn without_a_key_the_start_warns_and_the_query_error_names_the_variable() {
    if !start("without_a_key_the_start_warns_and_the_query_error_names_the_variable") {
        return;
    }
    let model = FakeModel::start().unwrap();
    let mut session = Session::new();
    // An empty variable is unset (the harness sets a key).
    session.start_runner(CLI, &model, &[("ANTHROPIC_API_KEY", "")]);
    session.wait_log_line("the missing-key warning", WAIT, |l| {
        l.contains("WARN")
            && l.contains("no API key for the claude CLI (anthropicApiKey is unset)")
            && l.contains("set ANTHROPIC_API_KEY, or ANTHROPIC_API_KEY_FILE")
    });
    let id = session.send_chat("hello").id;
    session.wait_until("a query_error row", WAIT, |s| {
        !system_actions(s, "query_error").is_empty()
    });
    let row = system_actions(&session, "query_error").remove(0);
    let error = &row["payload"];
    assert_eq!(error["classification"], "Auth", "{row}");
    assert!(error["messageIds"].to_string().contains(&id), "{row}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message
            .starts_with("Not logged in: no API key reached the claude CLI: set ANTHROPIC_API_KEY")
            && !message.contains("/login"),
        "{message}"
    );
    assert!(model.model_requests().is_empty());
    session.stop_runner();
}

// Issue 16: a remote MCP server behind the runner's proxy (tests/src/remote_mcp_scenarios.rs),
// declared in `e2e::remote_mcp_scenario_tests!`.
e2e::remote_mcp_scenario_tests! { CLI }

// Issue 40: the host side only through `nanoclaw --url` (tests/src/api_scenarios.rs), declared
// in `e2e::api_scenario_tests!`.
e2e::api_scenario_tests! { CLI }
