//! End-to-end acceptance scenarios (issue 4) for the OpenCode provider: the real `agent-runner`
//! binary with `--provider opencode` drives the real pinned `opencode serve` against the fake
//! model server (Chat Completions), with the real `mcp-tools` and the host CLI `nanoclaw`,
//! inside a loopback-only network namespace when the machine allows it.
//!
//! The scenarios are shared by every CLI (`e2e::scenarios`, with OpenCode's arms there: its
//! `bash` tool, abort-and-restart follow-ups, `ses_` session ids, a bearer key); each test here
//! runs one of them for OpenCode, plus [`stop_leaves_no_opencode_process`].
//!
//! Needs `cargo build --workspace --bins` (agent-runner, mcp-tools, nanoclaw) and the opencode
//! CLI (`scripts/install-clis.sh`); a missing CLI fails the tests unless
//! `NANOCLAW_SKIP_CLI_TESTS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use e2e::fake_model::{FakeModel, Step};
use e2e::harness::{descendants_matching, start_cli_test, Session};
use e2e::scenarios::{cli_pids, WAIT};

const CLI: &str = "opencode";

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

    /// Scenario 3: Follow-up mid-turn: the first answer stalls, a second message arrives, the
    /// model's next request contains it (abort-and-restart: the first stays in the history), both
    /// messages end `completed` with one reply.
    follow_up_mid_turn_reaches_the_model_and_both_complete();

    /// Scenario 4: Restart: the runner is killed and started again; the next message resumes the
    /// same OpenCode session (the model's request carries the earlier history).
    restart_resumes_the_same_session();

    /// Scenario 5: Model API 500 and 429 (with `retry-after-ms`): bounded retries, an Error, a
    /// `query_error` system row, the rows left for the host's sweep; the next message is answered.
    api_errors_write_query_error_and_leave_rows_for_the_sweep();

    /// Scenario 6: The CLI process is killed mid-turn: Error, the runner survives (and retries on
    /// a new server), the next message is answered.
    killed_cli_mid_turn_runner_survives();

    /// Scenario 7: ask_user_question round trip, answered with `nanoclaw answer` after 65 s: past
    /// the MCP SDK's 60 s request timeout that OpenCode uses unless configured (measured), so this
    /// proves the generated MCP timeout. Slow by nature: the only such OpenCode test.
    ask_user_question_answered_after_65s_with_nanoclaw_answer =
        ask_user_question_answered_with_nanoclaw_answer(Duration::from_secs(65));

    /// Issue 13: no key and the gateway's 401: the start warns and the `query_error` names
    /// OPENAI_API_KEY.
    without_a_key_the_gateways_401_names_the_variable();

    /// Scenario 8: A marker secret in the runner's environment is absent from the environment of a
    /// shell command the agent runs; so is the model API key (OpenCode reads it from a file).
    shell_command_never_sees_secrets();

    /// Scenario 9: A stored continuation naming a session that no longer exists → a fresh session,
    /// the message answered, the stored continuation replaced.
    stale_continuation_is_replaced_by_a_fresh_session();
}

/// A graceful stop leaves no OpenCode process behind (the server's group and its shells).
#[test]
fn stop_leaves_no_opencode_process() {
    if !start("stop_leaves_no_opencode_process") {
        return;
    }
    let model = FakeModel::start_with_script([Step::text("Up.")]).unwrap();
    let mut session = Session::new();
    session.start_runner(CLI, &model, &[]);
    let id = session.send_chat("are you up?").id;
    session.wait_completed(&id, WAIT);
    let server = cli_pids(&session, CLI);
    assert_eq!(server.len(), 1);
    let mcp = descendants_matching(server[0], "mcp-tools");
    assert_eq!(mcp.len(), 1, "mcp-tools runs under the server");
    session.stop_runner();
    std::thread::sleep(Duration::from_millis(300));
    for pid in server.iter().chain(&mcp) {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "{pid} outlived the runner: {stat}"
        );
    }
}

// Issue 10: the fault scenarios every CLI runs alike (tests/src/stalls.rs, stops.rs,
// leftovers.rs, credentials.rs, secrets.rs), declared in `e2e::fault_scenario_tests!`.
e2e::fault_scenario_tests! { CLI; model_key_test = model_key_stays_with_the_runner_opencode }

// Issue 14: usage and budgets (tests/src/usage_scenarios.rs), declared in
// `e2e::usage_scenario_tests!`.
e2e::usage_scenario_tests! { CLI }

// Issue 15: turn control (tests/src/turn_scenarios.rs), declared in `e2e::turn_scenario_tests!`.
e2e::turn_scenario_tests! { CLI }

// Issue 16: tool policy, approvals, approval stops (tests/src/policy_scenarios.rs), declared in
// `e2e::policy_scenario_tests!`.
e2e::policy_scenario_tests! { CLI }

// Issue 16: a remote MCP server behind the runner's proxy (tests/src/remote_mcp_scenarios.rs),
// declared in `e2e::remote_mcp_scenario_tests!`.
e2e::remote_mcp_scenario_tests! { CLI }

// Issue 40: the host side only through `nanoclaw --url` (tests/src/api_scenarios.rs), declared
// in `e2e::api_scenario_tests!`.
e2e::api_scenario_tests! { CLI }
