//! Issue 16 in the runner, in-process against a real session DB and the mock provider: asks
//! become question rows answered the way `nanoclaw answer` answers (Approve, Deny, no answer,
//! `/stop`), refusals by the policy and approval stops are recorded, elicitations are asked.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use provider::mock::{MockCall, MockPart, MockStep};
use schema::{MessageOut, NewMessageIn};
use serde_json::{json, Value};

use crate::common;

use common::{routing, text_of, Fixture};

/// The content of `row` as JSON.
fn content(row: &MessageOut) -> Value {
    serde_json::from_str(&row.content).unwrap()
}

/// The contents of the `messages_out` rows whose `key` is `value`.
fn rows_where(f: &Fixture, key: &str, value: &str) -> Vec<Value> {
    let rows = f.outs();
    rows.iter()
        .map(content)
        .filter(|c| c[key] == value)
        .collect()
}

/// The `ask_question` rows.
fn questions(f: &Fixture) -> Vec<Value> {
    rows_where(f, "operation", "ask_question")
}

/// The payloads of the `tool_decision` rows.
fn decisions(f: &Fixture) -> Vec<Value> {
    let rows = rows_where(f, "action", "tool_decision");
    rows.into_iter().map(|c| c["payload"].clone()).collect()
}

/// The chat replies' texts.
fn replies(f: &Fixture) -> Vec<String> {
    let rows = f.outs();
    rows.iter()
        .filter(|row| row.kind == "chat")
        .map(text_of)
        .collect()
}

/// What `nanoclaw answer --question <id> --option <option>` inserts.
fn answer(f: &Fixture, question_id: &str, option: &str) -> String {
    let mut row = NewMessageIn::new(
        "system",
        json!({"type": "question_response", "questionId": question_id,
               "selectedOption": option, "userId": "u1"})
        .to_string(),
    );
    row.routing = routing();
    f.insert(row)
}

/// A mock step asking to run `tool` with `argument`, alone, at once.
fn ask(tool: &str, argument: &str) -> MockStep {
    MockStep::Ask {
        tool: tool.into(),
        argument: Some(argument.into()),
        parallel: Vec::new(),
        notice: None,
        delay: Duration::ZERO,
        undecidable: None,
    }
}

/// A mock step calling the approval-stop tool `send_message`; with `until_push`, its result
/// comes only once a prompt was pushed.
fn send_message_stop(until_push: bool) -> MockStep {
    MockStep::ApprovalStop {
        tool: "mcp__nanoclaw__send_message".into(),
        until_push,
    }
}

/// Asserts that the runner ran two queries, the second continuing the session of the first.
fn assert_second_query_continues(f: &Fixture) {
    let inputs = f.mock.inputs();
    assert_eq!(inputs.len(), 2);
    let session = f.db.continuation("mock").unwrap();
    assert!(session.is_some());
    assert_eq!(
        inputs[1].continuation, session,
        "the same session continues"
    );
}

/// A runner whose first turn asks to run `rm -rf target`, started with `ask_timeout`; returns
/// the chat row and the question once it is asked.
async fn asking(ask_timeout: Duration) -> (Fixture, String, Value) {
    let mut f = Fixture::new();
    f.mock.script([ask("Bash", "rm -rf target")]);
    f.start_with(|options| options.ask_timeout = ask_timeout);
    let id = f.chat("clean up");
    f.wait_for("the approval question", |f| !questions(f).is_empty())
        .await;
    let question = questions(&f).remove(0);
    (f, id, question)
}

/// The runner's status; empty before the runner wrote its state.
fn status(f: &Fixture) -> String {
    let state = f.db.runner_state().unwrap();
    state.map(|s| s.status).unwrap_or_default()
}

/// What `runner_state.waiting_on` says now.
fn waiting_on(f: &Fixture) -> Option<schema::WaitingOn> {
    f.db.runner_state().unwrap()?.waiting()
}

/// The question ids of the `ask_question` rows, oldest first.
fn question_ids(f: &Fixture) -> Vec<String> {
    questions(f)
        .iter()
        .map(|q| q["questionId"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_retry_notice_while_an_approval_waits_leaves_the_approval_shown() {
    let mut f = Fixture::new();
    f.mock.script([MockStep::Ask {
        tool: "Bash".into(),
        argument: Some("make deploy".into()),
        parallel: Vec::new(),
        notice: Some("API error (overloaded); retrying in 2 s".into()),
        // Long enough to see the state between the answer and the result.
        delay: Duration::from_secs(2),
        undecidable: None,
    }]);
    f.start_with(|options| options.ask_timeout = Duration::from_secs(60));
    let id = f.chat("deploy");
    // The runner handled the notice (the heartbeat shows it as the last event).
    f.wait_for("the notice as the last event", |f| {
        let state = f.db.runner_state().unwrap();
        let event = state.and_then(|s| s.last_event());
        event.is_some_and(|e| e.what.contains("overloaded"))
    })
    .await;
    let qid = question_ids(&f).remove(0);
    assert_eq!(status(&f), "waiting_user");
    let waiting = waiting_on(&f).expect("waiting_on is written");
    assert_eq!(
        (waiting.approval.as_deref(), waiting.question_id.as_deref()),
        (Some("Bash"), Some(qid.as_str())),
        "waiting_on still names the approval: {waiting:?}"
    );
    answer(&f, &qid, "Approve");
    f.wait_for("busy again, nothing waited on", |f| {
        status(f) == "busy" && waiting_on(f).is_none()
    })
    .await;
    f.wait_completed(&id).await;
    assert_eq!(replies(&f), ["ran Bash"]);
    f.stop().await;
}

#[tokio::test]
async fn two_approvals_at_once_wait_until_both_are_answered() {
    let mut f = Fixture::new();
    f.mock.script([MockStep::Ask {
        tool: "Bash".into(),
        argument: Some("make deploy".into()),
        parallel: vec![MockCall {
            tool: "Write".into(),
            argument: Some("notes.md".into()),
        }],
        notice: None,
        // Long enough to see the state between the last answer and the result.
        delay: Duration::from_secs(2),
        undecidable: None,
    }]);
    f.start_with(|options| options.ask_timeout = Duration::from_secs(60));
    let id = f.chat("deploy and note it");
    f.wait_for("two approval questions", |f| questions(f).len() == 2)
        .await;
    let titles: Vec<Value> = questions(&f).iter().map(|q| q["title"].clone()).collect();
    assert_eq!(titles, ["Approve Bash?", "Approve Write?"]);
    let ids = question_ids(&f);
    assert_eq!(status(&f), "waiting_user");

    // The newer one first: the older still waits, and is what waiting_on names.
    answer(&f, &ids[1], "Deny");
    f.wait_for("the Write decision", |f| decisions(f).len() == 1)
        .await;
    assert!(!f.db.question_open(&ids[1]).unwrap());
    assert!(f.db.question_open(&ids[0]).unwrap());
    assert_eq!(status(&f), "waiting_user", "one approval still waits");
    let waiting = waiting_on(&f).expect("waiting_on names the approval still open");
    assert_eq!(waiting.approval.as_deref(), Some("Bash"));
    assert_eq!(waiting.question_id.as_deref(), Some(ids[0].as_str()));

    answer(&f, &ids[0], "Approve");
    f.wait_for("busy again, nothing waited on", |f| {
        status(f) == "busy" && waiting_on(f).is_none()
    })
    .await;
    f.wait_completed(&id).await;
    // Each answer reached its own request.
    assert_eq!(replies(&f), ["ran Bash; refused Write: denied by the user"]);
    assert_eq!(
        decisions(&f),
        [
            json!({"tool": "Write", "summary": "notes.md", "decision": "deny", "by": "user"}),
            json!({"tool": "Bash", "summary": "make deploy", "decision": "allow", "by": "user"}),
        ]
    );
    assert!(!f.db.question_open(&ids[0]).unwrap());
    f.wait_for("idle", |f| status(f) == "idle").await;
    f.stop().await;
}

#[tokio::test]
async fn a_message_pushed_before_an_approval_stop_runs_next_in_the_same_session() {
    let mut f = Fixture::new();
    f.mock.script([send_message_stop(true)]);
    f.start();
    let first = f.chat("make a plan");
    f.wait_for("the turn running", |f| status(f) == "busy")
        .await;
    // Arrives during the turn: pushed to the running query, which stops before the model sees
    // it.
    let second = f.chat("also check the tests");
    f.wait_completed(&first).await;
    f.wait_completed(&second).await;
    let prompts: Vec<String> = f.mock.prompts().into_iter().map(|p| p.text).collect();
    assert_eq!(prompts.len(), 2, "{prompts:?}");
    assert!(prompts[1].contains("also check the tests"), "{prompts:?}");
    assert!(
        !prompts[1].contains("make a plan"),
        "the stopped prompt is not run again: {prompts:?}"
    );
    // One reply, to the pushed message only: the approval stop writes none.
    let chats: Vec<MessageOut> = f
        .outs()
        .into_iter()
        .filter(|row| row.kind == "chat")
        .collect();
    assert_eq!(chats.len(), 1, "{chats:?}");
    assert!(text_of(&chats[0]).contains("also check the tests"));
    assert_eq!(chats[0].in_reply_to.as_deref(), Some(second.as_str()));
    assert_second_query_continues(&f);
    f.stop().await;
}

#[tokio::test]
async fn an_ask_is_a_question_and_approve_lets_the_call_run() {
    let (mut f, id, question) = asking(Duration::from_secs(60)).await;
    assert_eq!(question["title"], "Approve Bash?");
    assert!(
        question["question"]
            .as_str()
            .unwrap()
            .contains("Bash:\n\nrm -rf target\n"),
        "{question}"
    );
    let labels: Vec<&str> = question["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["value"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["Approve", "Deny"]);
    let asked = f
        .outs()
        .into_iter()
        .find(|row| content(row)["operation"] == "ask_question")
        .unwrap();
    assert_eq!(asked.routing, routing(), "routed like the batch's replies");
    assert_eq!(asked.in_reply_to.as_deref(), Some(id.as_str()));
    assert_eq!(status(&f), "waiting_user");
    let waiting = f.db.runner_state().unwrap().unwrap().waiting();
    let waiting = waiting.expect("waiting_on names the approval");
    assert_eq!(waiting.approval.as_deref(), Some("Bash"));
    assert_eq!(waiting.endpoint, "the user's approval of Bash");
    let qid = question["questionId"].as_str().unwrap().to_owned();
    assert_eq!(waiting.question_id.as_deref(), Some(qid.as_str()));

    let answer_row = answer(&f, &qid, "Approve");
    f.wait_completed(&id).await;
    assert_eq!(replies(&f), ["ran Bash"]);
    assert_eq!(
        decisions(&f),
        [json!({"tool": "Bash", "summary": "rm -rf target", "decision": "allow", "by": "user"})]
    );
    assert_eq!(
        f.row(&answer_row).status,
        "completed",
        "the answer was taken"
    );
    assert!(!f.db.question_open(&qid).unwrap(), "the question is closed");
    assert_eq!(
        f.mock.prompts().len(),
        1,
        "the answer never reached the agent as a message"
    );
    f.wait_for("idle", |f| status(f) == "idle").await;
    f.stop().await;
}

#[tokio::test]
async fn deny_refuses_the_call_and_says_so() {
    let (mut f, id, question) = asking(Duration::from_secs(60)).await;
    answer(&f, question["questionId"].as_str().unwrap(), "Deny");
    f.wait_completed(&id).await;
    assert_eq!(replies(&f), ["refused Bash: denied by the user"]);
    assert_eq!(
        decisions(&f),
        [json!({"tool": "Bash", "summary": "rm -rf target", "decision": "deny", "by": "user"})]
    );
    f.stop().await;
}

/// Issue 41: a call asked about because its command could not be decided: the question says
/// the runner could not tell what it runs, and the row after the answer carries why.
#[tokio::test]
async fn an_undecidable_call_asked_says_so_in_the_question_and_the_row() {
    const WHY: &str = "the command could not be decided: the program name is not a literal ($X): write the command literally";
    let mut f = Fixture::new();
    f.mock.script([MockStep::Ask {
        tool: "Bash".into(),
        argument: Some("X=rm; $X -rf target".into()),
        parallel: Vec::new(),
        notice: None,
        delay: Duration::ZERO,
        undecidable: Some(WHY.into()),
    }]);
    f.start_with(|options| options.ask_timeout = Duration::from_secs(60));
    let id = f.chat("clean up");
    f.wait_for("the approval question", |f| !questions(f).is_empty())
        .await;
    let question = questions(&f).remove(0);
    let text = question["question"].as_str().unwrap();
    assert!(
        text.contains(
            "could not tell what this command runs: the program name is not a literal ($X)."
        ),
        "{text}"
    );
    answer(&f, question["questionId"].as_str().unwrap(), "Deny");
    f.wait_completed(&id).await;
    assert_eq!(
        decisions(&f),
        [
            json!({"tool": "Bash", "summary": "X=rm; $X -rf target", "decision": "deny",
                "by": "user", "undecidable": WHY})
        ]
    );
    f.stop().await;
}

#[tokio::test]
async fn no_answer_in_time_is_a_deny_by_timeout() {
    let (mut f, id, question) = asking(Duration::from_secs(1)).await;
    f.wait_completed(&id).await;
    assert_eq!(replies(&f), ["refused Bash: no answer within 1 s"]);
    assert_eq!(
        decisions(&f),
        [json!({"tool": "Bash", "summary": "rm -rf target", "decision": "deny", "by": "timeout"})]
    );
    let qid = question["questionId"].as_str().unwrap();
    assert!(!f.db.question_open(qid).unwrap());
    // A late answer is an ordinary message now: it reaches the agent.
    answer(&f, qid, "Approve");
    f.wait_for("the late answer as a prompt", |f| {
        f.mock.prompts().len() == 2
    })
    .await;
    f.stop().await;
}

#[tokio::test]
async fn a_stop_while_waiting_denies_and_withdraws_the_question() {
    let (mut f, id, question) = asking(Duration::from_secs(60)).await;
    let stop = f.chat("/stop");
    f.wait_completed(&stop).await;
    f.wait_completed(&id).await;
    assert_eq!(
        decisions(&f),
        [json!({"tool": "Bash", "summary": "rm -rf target", "decision": "deny", "by": "stop"})]
    );
    assert!(!f
        .db
        .question_open(question["questionId"].as_str().unwrap())
        .unwrap());
    assert_eq!(replies(&f), ["Stopped."]);
    f.stop().await;
}

#[tokio::test]
async fn waiting_for_the_user_is_no_model_silence() {
    let mut f = Fixture::new();
    f.mock.script([ask("Bash", "make deploy")]);
    f.start_with(|options| {
        options.ask_timeout = Duration::from_secs(30);
        options.progress.silence = Duration::from_secs(1);
    });
    let id = f.chat("deploy");
    f.wait_for("the approval question", |f| !questions(f).is_empty())
        .await;
    // Longer than the silence limit: the turn must still be waiting, not failed.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(status(&f), "waiting_user");
    let qid = questions(&f)[0]["questionId"].as_str().unwrap().to_owned();
    answer(&f, &qid, "Approve");
    f.wait_completed(&id).await;
    assert_eq!(replies(&f), ["ran Bash"]);
    assert!(rows_where(&f, "action", "query_error").is_empty());
    f.stop().await;
}

#[tokio::test]
async fn a_refusal_by_the_policy_is_recorded() {
    let mut f = Fixture::new();
    f.mock.script([MockStep::Parts {
        parts: vec![MockPart::Denied {
            denied: "Bash".into(),
            summary: Some("rm -rf target".into()),
        }],
        text: "could not".into(),
        delay: Duration::ZERO,
    }]);
    f.start();
    let id = f.chat("clean up");
    f.wait_completed(&id).await;
    assert_eq!(
        decisions(&f),
        [json!({"tool": "Bash", "summary": "rm -rf target", "decision": "deny", "by": "policy"})]
    );
    let row = f
        .outs()
        .into_iter()
        .find(|row| content(row)["action"] == "tool_decision")
        .unwrap();
    assert_eq!(row.routing, routing());
    assert_eq!(row.in_reply_to.as_deref(), Some(id.as_str()));
    f.stop().await;
}

#[tokio::test]
async fn an_approval_stop_completes_the_rows_without_a_reply_and_the_session_goes_on() {
    let mut f = Fixture::new();
    f.mock.script([send_message_stop(false)]);
    f.start();
    let first = f.chat("make a plan");
    f.wait_completed(&first).await;
    assert!(replies(&f).is_empty(), "{:?}", replies(&f));
    let outcome: String = rusqlite::Connection::open(f.dir.path().join("session.db"))
        .unwrap()
        .query_row("SELECT outcome FROM turn_usage", [], |r| r.get(0))
        .unwrap();
    assert_eq!(outcome, "result");
    let session = f.db.continuation("mock").unwrap();
    assert!(session.is_some());
    let second = f.chat("go ahead");
    f.wait_completed(&second).await;
    assert_eq!(replies(&f).len(), 1);
    assert!(replies(&f)[0].contains("go ahead"), "{:?}", replies(&f));
    assert_second_query_continues(&f);
    f.stop().await;
}

#[tokio::test]
async fn an_elicitation_is_asked_and_its_answer_returned() {
    let mut f = Fixture::new();
    f.mock.script([MockStep::Elicit {
        server: "deploy".into(),
        message: "Which environment?".into(),
        options: vec!["staging".into(), "production".into()],
    }]);
    f.start();
    let id = f.chat("ship it");
    f.wait_for("the question", |f| !questions(f).is_empty())
        .await;
    let question = questions(&f).remove(0);
    assert_eq!(question["title"], "deploy asks");
    answer(&f, question["questionId"].as_str().unwrap(), "staging");
    f.wait_completed(&id).await;
    assert_eq!(replies(&f), ["answered staging"]);
    assert!(decisions(&f).is_empty(), "an elicitation is no tool call");
    f.stop().await;
}
