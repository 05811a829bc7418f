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

const CLI: &str = "codex";

e2e::scenario_tests! { CLI;
    /// Scenario 1: A chat message → the model's text reply → one `messages_out` row with the
    /// routing copied.
    chat_message_gets_one_reply_with_the_routing();

    /// Scenario 2: The model calls send_message through mcp-tools → that row exists; the turn's
    /// final text (the same words) is not delivered twice.
    send_message_tool_row_is_not_delivered_twice();

    /// Scenario 3: Follow-up mid-turn: the first answer stalls, a second message arrives, the
    /// model's next request contains it, both messages end `completed`.
    follow_up_mid_turn_reaches_the_model_and_both_complete();

    /// Scenario 4: Restart: the runner is killed and started again; the next message resumes the
    /// same Codex thread (the model's request carries the earlier history).
    restart_resumes_the_same_session();

    /// Scenario 5: Model API 500 and 429 (with retry headers): bounded retries, an Error, a
    /// `query_error` system row, the rows left for the host's sweep; the next message is answered
    /// normally.
    api_errors_write_query_error_and_leave_rows_for_the_sweep();

    /// Scenario 6: The CLI process is killed mid-turn: Error, the runner survives, the next message
    /// is answered.
    killed_cli_mid_turn_runner_survives();

    /// Scenario 7: ask_user_question round trip, answered with `nanoclaw answer` after 65 s: past
    /// Codex's (documented) default 60 s MCP tool timeout. Slow by nature: the only such Codex
    /// test.
    ask_user_question_answered_after_65s_with_nanoclaw_answer =
        ask_user_question_answered_with_nanoclaw_answer(Duration::from_secs(65));

    /// Scenario 8: A marker secret in the runner's environment is absent from the environment of a
    /// shell command the agent runs; so is the model API key.
    shell_command_never_sees_secrets();

    /// Scenario 9: A stored continuation naming a session that no longer exists → a fresh session,
    /// the message answered, the stored continuation replaced.
    stale_continuation_is_replaced_by_a_fresh_session();

    /// Issue 13: no key and the gateway's 401: the start warns and the `query_error` names
    /// OPENAI_API_KEY.
    without_a_key_the_gateways_401_names_the_variable();
}

// Issue 10: the fault scenarios every CLI runs alike (tests/src/stalls.rs, stops.rs,
// leftovers.rs, credentials.rs, secrets.rs), declared in `e2e::fault_scenario_tests!`.
e2e::fault_scenario_tests! { CLI; model_key_test = model_key_stays_with_the_runner_codex }

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
