//! End-to-end acceptance scenarios (issue 4) for the Claude provider: the real `agent-runner`
//! binary with `--provider claude` drives the real pinned `claude -p` stream-json process against
//! the fake model server, with the real `mcp-tools` and the host CLI `nanoclaw`, inside a
//! loopback-only network namespace when the machine allows it.
//!
//! Needs `cargo build --workspace --bins` (agent-runner, mcp-tools, nanoclaw) and the claude CLI
//! (`scripts/install-clis.sh`); a missing CLI fails the tests unless `NANOCLAW_SKIP_CLI_TESTS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use e2e::fake_model::{FakeModel, Step};
use e2e::harness::claude_user_texts as user_texts;
use e2e::harness::{
    chat_outs, descendants_matching, start_cli_test, system_actions, test_routing, text_of,
    Session, FAKE_KEY,
};
use schema::NewMessageIn;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// Skips (CLI tests disabled), or re-runs the test in a loopback-only namespace; `true` = run
/// the body here.
fn start(test: &str) -> bool {
    start_cli_test("claude", test)
}

/// The `claude` processes under the runner (its command line carries `--input-format`).
fn claude_pids(session: &Session) -> Vec<u32> {
    descendants_matching(session.runner_pid().unwrap(), "--input-format stream-json")
}

/// Scenario 1: A chat message → the model's text reply → one `messages_out` row with the routing copied.
#[test]
fn chat_message_gets_one_reply_with_the_routing() {
    if !start("chat_message_gets_one_reply_with_the_routing") {
        return;
    }
    let model =
        FakeModel::start_with_script([Step::text("Hello Ann, nice to meet you.").chunks(4)])
            .unwrap();
    let mut session = Session::new();
    session.start_runner("claude", &model, &[]);
    let id = session.send_chat("hi there").id;
    let reply = session.wait_reply(&id, WAIT);
    session.wait_completed(&id, WAIT);
    assert_eq!(text_of(&reply), "Hello Ann, nice to meet you.");
    assert_eq!(reply.routing, test_routing());
    assert_eq!(chat_outs(&session).len(), 1, "{:#?}", session.outs());
    let request = model.model_requests().pop().unwrap();
    assert!(
        user_texts(&request).last().unwrap().contains("hi there"),
        "{:?}",
        user_texts(&request)
    );
    assert_eq!(request.model(), Some("fake-model"));
    assert_eq!(request.header("x-api-key"), Some(FAKE_KEY));
    assert!(request.offers_mcp_tool("send_message"));
    session.stop_runner();
}

/// Scenario 2: The model calls send_message through mcp-tools → that row exists; the turn's final text
/// (the same words) is not delivered twice.
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
    session.start_runner("claude", &model, &[]);
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

/// Scenario 3: Follow-up mid-turn: the first answer stalls, a second message arrives and is pushed; the
/// model's next request contains it, both messages end `completed`. Claude queues a prompt
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

/// Scenario 3b: Follow-up while a tool runs: Claude folds it into the running turn (the model sees it
/// beside the tool result), one reply answers both and both rows complete together.
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

/// Scenario 4: Restart: the runner is killed and started again; the next message resumes the same Claude
/// session (the model's request carries the earlier history).
#[test]
fn restart_resumes_the_same_session() {
    if !start("restart_resumes_the_same_session") {
        return;
    }
    let model =
        FakeModel::start_with_script([Step::text("Noted: PAPAYA."), Step::text("It was PAPAYA.")])
            .unwrap();
    let mut session = Session::new();
    session.start_runner("claude", &model, &[]);
    let id = session.send_chat("remember PAPAYA").id;
    session.wait_completed(&id, WAIT);
    let stored = session
        .db
        .continuation("claude")
        .unwrap()
        .expect("continuation stored");
    let old = claude_pids(&session);
    assert_eq!(old.len(), 1);
    session.kill_runner();
    // The parent-death signal takes claude down with the runner.
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{}/cmdline", old[0])).exists()
        && std::fs::read(format!("/proc/{}/cmdline", old[0])).is_ok_and(|c| !c.is_empty())
    {
        assert!(
            Instant::now() < deadline,
            "claude outlived the killed runner"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    session.start_runner("claude", &model, &[]);
    let id = session.send_chat("what was the word?").id;
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "It was PAPAYA.");
    assert_eq!(
        session.db.continuation("claude").unwrap().as_deref(),
        Some(stored.as_str())
    );
    let request = model.model_requests().pop().unwrap();
    let texts = user_texts(&request);
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(
        texts[0].contains("remember PAPAYA") && texts[1].contains("what was the word?"),
        "{texts:?}"
    );
    session.stop_runner();
}

/// Scenario 5: Model API 500 and 429 (with retry headers): bounded retries, an Error, a `query_error`
/// system row, the rows left for the host's sweep; the next message is answered normally.
#[test]
fn api_errors_write_query_error_and_leave_rows_for_the_sweep() {
    if !start("api_errors_write_query_error_and_leave_rows_for_the_sweep") {
        return;
    }
    let model = FakeModel::start().unwrap();
    let mut session = Session::new();
    session.start_runner("claude", &model, &[]);
    let mut failed = Vec::new();
    for (status, class) in [(500, "Api"), (429, "Quota")] {
        let step = if status == 429 {
            Step::error(429, "fake 429 error").retry_after_secs(1)
        } else {
            Step::error(500, "fake 500 error").retry_after_ms(50)
        };
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
            "{status}: one try and one retry (NANOCLAW_CLI_MAX_RETRIES=1)"
        );
        let row = system_actions(&session, "query_error").pop().unwrap();
        let error = &row["payload"];
        assert_eq!(error["classification"], class, "{row}");
        assert_eq!(error["retryable"], false);
        assert_eq!(error["provider"], "claude");
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

/// Scenario 6: The CLI process is killed mid-turn: Error, the runner survives, the next message is
/// answered.
#[test]
fn killed_cli_mid_turn_runner_survives() {
    if !start("killed_cli_mid_turn_runner_survives") {
        return;
    }
    let model = FakeModel::start_with_script([Step::hang().timeout_ms(60_000)]).unwrap();
    model.set_default_text("Recovered.");
    let mut session = Session::new();
    session.start_runner("claude", &model, &[]);
    let first = session.send_chat("this turn will crash").id;
    model.wait_for_model_requests(1, WAIT).unwrap();
    let claude = claude_pids(&session);
    assert_eq!(claude.len(), 1, "one claude under the runner");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(claude[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    model.release_hangs();
    // The runner retries the retryable process error on a new claude, resuming the session.
    session.wait_completed(&first, WAIT);
    assert!(session.runner_pid().is_some());
    let second = session.send_chat("are you still there?").id;
    let reply = session.wait_reply(&second, WAIT);
    assert_eq!(text_of(&reply), "Recovered.");
    let now = claude_pids(&session);
    assert_eq!(now.len(), 1);
    assert_ne!(now[0], claude[0], "a new claude");
    assert!(
        session.runner_log().contains("claude exited"),
        "the process error is logged"
    );
    session.stop_runner();
}

/// Scenario 7: ask_user_question round trip, answered with the host CLI `nanoclaw answer` while the tool
/// blocks; the answer reaches the model.
#[test]
fn ask_user_question_answered_with_nanoclaw_answer() {
    if !start("ask_user_question_answered_with_nanoclaw_answer") {
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
    session.start_runner("claude", &model, &[]);
    let id = session.send_chat("deploy it").id;
    let question = session.wait_question(WAIT);
    let question_id = question["questionId"].as_str().unwrap().to_owned();
    assert_eq!(question["question"], "Deploy to production?");
    session.wait_until("waiting_user", WAIT, |s| {
        s.db.runner_state()
            .ok()
            .flatten()
            .is_some_and(|r| r.status == "waiting_user")
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        model.model_requests().len(),
        1,
        "claude still waits for the tool"
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
    session.stop_runner();
}

/// Scenario 8: A marker secret in the runner's environment is absent from the environment of a shell
/// command the agent runs; so is the model API key (Claude reads it through apiKeyHelper, not
/// its environment).
#[test]
fn shell_command_never_sees_secrets() {
    if !start("shell_command_never_sees_secrets") {
        return;
    }
    let model = FakeModel::start_with_script([
        Step::raw_tool_call("Bash", json!({"command": "env", "description": "list"})),
        Step::text("Here is the environment."),
    ])
    .unwrap();
    let mut session = Session::new();
    session.start_runner(
        "claude",
        &model,
        &[
            ("DEPLOY_TOKEN", "marker-token-7781"),
            ("STRIPE_SECRET", "marker-secret-5510"),
        ],
    );
    let id = session.send_chat("show me env").id;
    session.wait_completed(&id, WAIT);
    let request = model.model_requests().pop().unwrap();
    let env = request.tool_results().join("\n");
    assert!(env.contains("HOME="), "the shell ran env: {env}");
    for secret in ["marker-token-7781", "marker-secret-5510", FAKE_KEY] {
        assert!(
            !env.contains(secret),
            "{secret} reached the agent's shell:\n{env}"
        );
    }
    assert_eq!(
        request.header("x-api-key"),
        Some(FAKE_KEY),
        "the model still gets the key"
    );
    session.stop_runner();
}

/// Scenario 9: A stored continuation naming a session that no longer exists → a fresh session, the
/// message answered, the stored continuation replaced.
#[test]
fn stale_continuation_is_replaced_by_a_fresh_session() {
    if !start("stale_continuation_is_replaced_by_a_fresh_session") {
        return;
    }
    let model = FakeModel::start_with_script([Step::text("Fresh start.")]).unwrap();
    let mut session = Session::new();
    let stale = "11111111-2222-4333-8444-555555555555";
    session.db.set_continuation("claude", stale).unwrap();
    session.start_runner("claude", &model, &[]);
    let id = session.send_chat("hello?").id;
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "Fresh start.");
    let stored = session.db.continuation("claude").unwrap().unwrap();
    assert_ne!(stored, stale);
    assert!(
        session.runner_log().contains("not found"),
        "the fresh start is logged"
    );
    assert!(system_actions(&session, "query_error").is_empty());
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
