//! End-to-end acceptance scenarios (issue 4) for the Codex provider: the real `agent-runner`
//! binary with `--provider codex` drives the real pinned `codex app-server` against the fake
//! model server, with the real `mcp-tools` and the host CLI `nanoclaw`, inside a loopback-only
//! network namespace when the machine allows it.
//!
//! The scenarios are shared by every CLI (`e2e::scenarios`, with Codex's arms there: its
//! `exec_command` shell tool, a steered follow-up, up to 4 requests per failing turn); each test
//! here runs one of them for Codex.
//!
//! Needs `cargo build --workspace --bins` (agent-runner, mcp-tools, nanoclaw) and the codex CLI
//! (`scripts/install-clis.sh`); a missing CLI fails the tests unless `NANOCLAW_SKIP_CLI_TESTS=1`.

use std::time::Duration;

use e2e::harness::start_cli_test;
use e2e::scenarios;

const CLI: &str = "codex";

/// Skips (CLI tests disabled), or re-runs the test in a loopback-only namespace; `true` = run
/// the body here.
fn start(test: &str) -> bool {
    start_cli_test(CLI, test)
}

/// Scenario 1: A chat message → the model's text reply → one `messages_out` row with the routing copied.
#[test]
fn chat_message_gets_one_reply_with_the_routing() {
    if start("chat_message_gets_one_reply_with_the_routing") {
        scenarios::chat_message_gets_one_reply_with_the_routing(CLI);
    }
}

/// Scenario 2: The model calls send_message through mcp-tools → that row exists; the turn's final text
/// (the same words) is not delivered twice.
#[test]
fn send_message_tool_row_is_not_delivered_twice() {
    if start("send_message_tool_row_is_not_delivered_twice") {
        scenarios::send_message_tool_row_is_not_delivered_twice(CLI);
    }
}

/// Scenario 3: Follow-up mid-turn: the first answer stalls, a second message arrives, the model's next
/// request contains it, both messages end `completed`.
#[test]
fn follow_up_mid_turn_reaches_the_model_and_both_complete() {
    if start("follow_up_mid_turn_reaches_the_model_and_both_complete") {
        scenarios::follow_up_mid_turn_reaches_the_model_and_both_complete(CLI);
    }
}

/// Scenario 4: Restart: the runner is killed and started again; the next message resumes the same Codex
/// thread (the model's request carries the earlier history).
#[test]
fn restart_resumes_the_same_session() {
    if start("restart_resumes_the_same_session") {
        scenarios::restart_resumes_the_same_session(CLI);
    }
}

/// Scenario 5: Model API 500 and 429 (with retry headers): bounded retries, an Error, a `query_error`
/// system row, the rows left for the host's sweep; the next message is answered normally.
#[test]
fn api_errors_write_query_error_and_leave_rows_for_the_sweep() {
    if start("api_errors_write_query_error_and_leave_rows_for_the_sweep") {
        scenarios::api_errors_write_query_error_and_leave_rows_for_the_sweep(CLI);
    }
}

/// Scenario 6: The CLI process is killed mid-turn: Error, the runner survives, the next message is
/// answered.
#[test]
fn killed_cli_mid_turn_runner_survives() {
    if start("killed_cli_mid_turn_runner_survives") {
        scenarios::killed_cli_mid_turn_runner_survives(CLI);
    }
}

/// Scenario 7: ask_user_question round trip, answered with `nanoclaw answer` after 65 s: past Codex's
/// (documented) default 60 s MCP tool timeout. Slow by nature: the only such Codex test.
#[test]
fn ask_user_question_answered_after_65s_with_nanoclaw_answer() {
    if start("ask_user_question_answered_after_65s_with_nanoclaw_answer") {
        scenarios::ask_user_question_answered_with_nanoclaw_answer(CLI, Duration::from_secs(65));
    }
}

/// Scenario 8: A marker secret in the runner's environment is absent from the environment of a shell
/// command the agent runs; so is the model API key.
#[test]
fn shell_command_never_sees_secrets() {
    if start("shell_command_never_sees_secrets") {
        scenarios::shell_command_never_sees_secrets(CLI);
    }
}

/// Scenario 9: A stored continuation naming a session that no longer exists → a fresh session, the
/// message answered, the stored continuation replaced.
#[test]
fn stale_continuation_is_replaced_by_a_fresh_session() {
    if start("stale_continuation_is_replaced_by_a_fresh_session") {
        scenarios::stale_continuation_is_replaced_by_a_fresh_session(CLI);
    }
}
