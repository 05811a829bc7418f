//! End-to-end acceptance scenarios (issue 4) for the OpenCode provider: the real `agent-runner`
//! binary with `--provider opencode` drives the real pinned `opencode serve` against the fake
//! model server (Chat Completions), with the real `mcp-tools` and the host CLI `nanoclaw`,
//! inside a loopback-only network namespace when the machine allows it.
//!
//! Needs `cargo build --workspace --bins` (agent-runner, mcp-tools, nanoclaw) and the opencode
//! CLI (`scripts/install-clis.sh`); a missing CLI fails the tests unless
//! `NANOCLAW_SKIP_CLI_TESTS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use e2e::fake_model::{FakeModel, Step};
use e2e::harness::{
    chat_outs, descendants_matching, start_cli_test, system_actions, test_routing, text_of,
    Session, FAKE_KEY,
};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// Skips (CLI tests disabled), or re-runs the test in a loopback-only namespace; `true` = run
/// the body here.
fn start(test: &str) -> bool {
    start_cli_test("opencode", test)
}

/// The `opencode serve` processes under the runner.
fn servers(session: &Session) -> Vec<u32> {
    descendants_matching(session.runner_pid().unwrap(), "opencode serve")
}

/// The runner's formatted prompt wraps each message; the last user message of a request.
fn last_user_text(model: &FakeModel) -> String {
    model
        .model_requests()
        .pop()
        .and_then(|r| r.last_user_text())
        .unwrap_or_default()
}

/// Scenario 1: A chat message → the model's text reply → one `messages_out` row with the
/// routing copied.
#[test]
fn chat_message_gets_one_reply_with_the_routing() {
    if !start("chat_message_gets_one_reply_with_the_routing") {
        return;
    }
    let model =
        FakeModel::start_with_script([Step::text("Hello Ann, nice to meet you.").chunks(4)])
            .unwrap();
    let mut session = Session::new();
    session.start_runner("opencode", &model, &[]);
    let id = session.send_chat("hi there").id;
    let reply = session.wait_reply(&id, WAIT);
    session.wait_completed(&id, WAIT);
    assert_eq!(text_of(&reply), "Hello Ann, nice to meet you.");
    assert_eq!(reply.routing, test_routing());
    assert_eq!(chat_outs(&session).len(), 1, "{:#?}", session.outs());
    let request = model.model_requests().pop().unwrap();
    assert!(
        last_user_text(&model).contains("hi there"),
        "{}",
        request.summary()
    );
    assert_eq!(request.model(), Some("fake-model"));
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {FAKE_KEY}").as_str())
    );
    assert!(
        session
            .db
            .continuation("opencode")
            .unwrap()
            .is_some_and(|c| c.starts_with("ses_")),
        "the session id is the continuation"
    );
    session.stop_runner();
}

/// Scenario 2: The model calls send_message through mcp-tools → that row exists; the turn's
/// final text (the same words) is not delivered twice.
#[test]
fn send_message_tool_row_is_not_delivered_twice() {
    if !start("send_message_tool_row_is_not_delivered_twice") {
        return;
    }
    let model = FakeModel::start_with_script([
        Step::tool_call("send_message", json!({"text": "Report is ready."})),
        Step::text("Report is ready."),
    ])
    .unwrap();
    let mut session = Session::new();
    session.start_runner("opencode", &model, &[]);
    let id = session.send_chat("send me the report").id;
    session.wait_completed(&id, WAIT);
    let chats = chat_outs(&session);
    assert_eq!(chats.len(), 1, "{chats:#?}");
    assert_eq!(text_of(&chats[0]), "Report is ready.");
    assert_eq!(chats[0].routing, test_routing());
    let requests = model.model_requests();
    assert_eq!(requests.len(), 2);
    assert!(requests[1].tail_is_tool_result());
    session.stop_runner();
}

/// Scenario 3: Follow-up mid-turn: the first answer stalls, a second message arrives, the
/// model's next request contains it (abort-and-restart: the first stays in the history), both
/// messages end `completed` with one reply.
#[test]
fn follow_up_mid_turn_reaches_the_model_and_both_complete() {
    if !start("follow_up_mid_turn_reaches_the_model_and_both_complete") {
        return;
    }
    let model = FakeModel::start_with_script([
        Step::hang().timeout_ms(30_000),
        Step::text("Answering both."),
    ])
    .unwrap();
    let mut session = Session::new();
    session.start_runner("opencode", &model, &[]);
    let first = session.send_chat("first question").id;
    model.wait_for_model_requests(1, WAIT).unwrap();
    let second = session.send_chat("second question").id;
    session.wait_completed(&first, WAIT);
    session.wait_completed(&second, WAIT);
    let request = model.model_requests().pop().unwrap();
    let texts = request.user_texts();
    assert!(
        texts.iter().any(|t| t.contains("first question"))
            && texts.last().is_some_and(|t| t.contains("second question")),
        "{texts:?}"
    );
    let chats = chat_outs(&session);
    assert_eq!(chats.len(), 1, "{chats:#?}");
    assert_eq!(text_of(&chats[0]), "Answering both.");
    assert_eq!(model.model_requests().len(), 2, "one restart");
    session.stop_runner();
}

/// Scenario 4: Restart: the runner is killed and started again; the next message resumes the
/// same OpenCode session (the model's request carries the earlier history).
#[test]
fn restart_resumes_the_same_session() {
    if !start("restart_resumes_the_same_session") {
        return;
    }
    let model =
        FakeModel::start_with_script([Step::text("Noted: PAPAYA."), Step::text("It was PAPAYA.")])
            .unwrap();
    let mut session = Session::new();
    session.start_runner("opencode", &model, &[]);
    let id = session.send_chat("remember PAPAYA").id;
    session.wait_completed(&id, WAIT);
    let stored = session
        .db
        .continuation("opencode")
        .unwrap()
        .expect("continuation stored");
    session.kill_runner();

    session.start_runner("opencode", &model, &[]);
    let id = session.send_chat("what was the word?").id;
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "It was PAPAYA.");
    assert_eq!(
        session.db.continuation("opencode").unwrap().as_deref(),
        Some(stored.as_str())
    );
    let request = model.model_requests().pop().unwrap();
    let texts = request.user_texts();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(
        texts[0].contains("remember PAPAYA") && texts[1].contains("what was the word?"),
        "{texts:?}"
    );
    session.stop_runner();
}

/// Scenario 5: Model API 500 and 429 (with `retry-after-ms`): bounded retries, an Error, a
/// `query_error` system row, the rows left for the host's sweep; the next message is answered.
#[test]
fn api_errors_write_query_error_and_leave_rows_for_the_sweep() {
    if !start("api_errors_write_query_error_and_leave_rows_for_the_sweep") {
        return;
    }
    let model = FakeModel::start().unwrap();
    let mut session = Session::new();
    session.start_runner("opencode", &model, &[]);
    let mut failed = Vec::new();
    for (status, class) in [(500, "Api"), (429, "Quota")] {
        // OpenCode's retries are hard-coded with a growing backoff; it honours retry-after-ms.
        let step = Step::error(status, format!("fake {status} error")).retry_after_ms(300);
        model.set_script(std::iter::repeat_n(step, 10));
        model.clear_log();
        let started = Instant::now();
        let id = session.send_chat(&format!("trigger {status}")).id;
        session.wait_until("a query_error row", WAIT, |s| {
            system_actions(s, "query_error").len() == failed.len() + 1
        });
        let elapsed = started.elapsed();
        let requests = model.model_requests().len();
        eprintln!("{status}: {requests} requests in {elapsed:.1?}");
        assert_eq!(
            requests, 2,
            "{status}: bounded retries (NANOCLAW_CLI_MAX_RETRIES=1)"
        );
        let row = system_actions(&session, "query_error").pop().unwrap();
        let error = &row["payload"];
        assert_eq!(error["classification"], class, "{row}");
        assert_eq!(error["retryable"], false);
        assert_eq!(error["provider"], "opencode");
        assert!(error["messageIds"].to_string().contains(&id), "{error}");
        assert_eq!(
            session.row(&id).status,
            "processing",
            "left for the host's sweep"
        );
        failed.push(id);
    }
    model.set_script([Step::text("All good now.")]);
    let id = session.send_chat("hello again").id;
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "All good now.");
    for id in &failed {
        assert_eq!(session.row(id).status, "processing");
    }
    session.stop_runner();
}

/// Scenario 6: The CLI process is killed mid-turn: Error, the runner survives (and retries on
/// a new server), the next message is answered.
#[test]
fn killed_cli_mid_turn_runner_survives() {
    if !start("killed_cli_mid_turn_runner_survives") {
        return;
    }
    let model = FakeModel::start_with_script([Step::hang().timeout_ms(60_000)]).unwrap();
    model.set_default_text("Recovered.");
    let mut session = Session::new();
    session.start_runner("opencode", &model, &[]);
    let first = session.send_chat("this turn will crash").id;
    model.wait_for_model_requests(1, WAIT).unwrap();
    let before = servers(&session);
    assert_eq!(before.len(), 1, "one opencode serve under the runner");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(before[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    model.release_hangs();
    // The runner retries the retryable process error on a new server.
    session.wait_completed(&first, WAIT);
    assert!(session.runner_pid().is_some());
    let second = session.send_chat("are you still there?").id;
    let reply = session.wait_reply(&second, WAIT);
    assert_eq!(text_of(&reply), "Recovered.");
    let now = servers(&session);
    assert_eq!(now.len(), 1);
    assert_ne!(now[0], before[0], "a new server");
    assert!(
        session.runner_log().contains("exited"),
        "the process error is logged"
    );
    session.stop_runner();
}

/// Scenario 7: ask_user_question round trip, answered with `nanoclaw answer` after 65 s: past
/// the MCP SDK's 60 s request timeout that OpenCode uses unless configured (measured), so this
/// proves the generated MCP timeout. Slow by nature: the only such OpenCode test.
#[test]
fn ask_user_question_answered_after_65s_with_nanoclaw_answer() {
    if !start("ask_user_question_answered_after_65s_with_nanoclaw_answer") {
        return;
    }
    let model = FakeModel::start_with_script([
        Step::tool_call(
            "ask_user_question",
            json!({"question": "Deploy to production?", "options": ["Yes", "No"]}),
        ),
        Step::text("Deploying now."),
    ])
    .unwrap();
    let mut session = Session::new();
    session.start_runner("opencode", &model, &[]);
    let id = session.send_chat("deploy it").id;
    let question = session.wait_question(WAIT);
    let question_id = question["questionId"].as_str().unwrap().to_owned();
    assert_eq!(
        session.db.runner_state().unwrap().unwrap().status,
        "waiting_user"
    );
    std::thread::sleep(Duration::from_secs(65));
    assert_eq!(
        model.model_requests().len(),
        1,
        "OpenCode still waits for the tool"
    );
    let out = session.nanoclaw(&["answer", "--question", &question_id, "--option", "Yes"]);
    assert!(
        out.status.success(),
        "nanoclaw answer: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "Deploying now.");
    let request = model.model_requests().pop().unwrap();
    let results = request.tool_results().join("\n");
    assert!(
        results.contains("Yes"),
        "the answer reached the model: {results}"
    );
    assert!(!results.to_lowercase().contains("timed out"), "{results}");
    session.stop_runner();
}

/// Scenario 8: A marker secret in the runner's environment is absent from the environment of a
/// shell command the agent runs; so is the model API key (OpenCode reads it from a file).
#[test]
fn shell_command_never_sees_secrets() {
    if !start("shell_command_never_sees_secrets") {
        return;
    }
    let model = FakeModel::start_with_script([
        Step::raw_tool_call(
            "bash",
            json!({"command": "env", "description": "print env"}),
        ),
        Step::text("Here is the environment."),
    ])
    .unwrap();
    let mut session = Session::new();
    session.start_runner(
        "opencode",
        &model,
        &[
            ("DEPLOY_TOKEN", "marker-token-7781"),
            ("DB_PASSWORD", "marker-password-5512"),
        ],
    );
    let id = session.send_chat("show me env").id;
    session.wait_completed(&id, WAIT);
    let request = model.model_requests().pop().unwrap();
    let env = request.tool_results().join("\n");
    assert!(env.contains("HOME="), "the shell ran env: {env}");
    for secret in ["marker-token-7781", "marker-password-5512", FAKE_KEY] {
        assert!(
            !env.contains(secret),
            "{secret} reached the agent's shell:\n{env}"
        );
    }
    session.stop_runner();
}

/// Scenario 9: A stored continuation naming a session that no longer exists → a fresh session,
/// the message answered, the stored continuation replaced.
#[test]
fn stale_continuation_is_replaced_by_a_fresh_session() {
    if !start("stale_continuation_is_replaced_by_a_fresh_session") {
        return;
    }
    let model = FakeModel::start_with_script([Step::text("Fresh start.")]).unwrap();
    let mut session = Session::new();
    let stale = "ses_0000000000000000000000stale";
    session.db.set_continuation("opencode", stale).unwrap();
    session.start_runner("opencode", &model, &[]);
    let id = session.send_chat("hello?").id;
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "Fresh start.");
    let stored = session.db.continuation("opencode").unwrap().unwrap();
    assert_ne!(stored, stale);
    assert!(stored.starts_with("ses_"), "{stored}");
    assert!(
        session.runner_log().contains("not found"),
        "the fresh start is logged"
    );
    assert!(system_actions(&session, "query_error").is_empty());
    session.stop_runner();
}

/// A graceful stop leaves no OpenCode process behind (the server's group and its shells).
#[test]
fn stop_leaves_no_opencode_process() {
    if !start("stop_leaves_no_opencode_process") {
        return;
    }
    let model = FakeModel::start_with_script([Step::text("Up.")]).unwrap();
    let mut session = Session::new();
    session.start_runner("opencode", &model, &[]);
    let id = session.send_chat("are you up?").id;
    session.wait_completed(&id, WAIT);
    let server = servers(&session);
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
