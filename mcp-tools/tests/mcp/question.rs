//! ask_user_question: answered, timed out (and the late answer), cancelled.

use std::time::{Duration, Instant};

use chrono::Utc;
use schema::{InStatus, NewMessageIn};
use serde_json::{json, Value};

use crate::support::{outcome, routing, wait_until, Env, Server, TIMEOUT};

/// Sends an ask_user_question call without waiting; returns its request id.
fn ask(server: &mut Server, args: Value) -> Value {
    let id = json!(server.next_id());
    server.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                        "params": {"name": "ask_user_question", "arguments": args}}));
    id
}

/// Waits for the question row and returns its questionId.
fn question_id(env: &Env) -> String {
    let mut found = None;
    assert!(wait_until(TIMEOUT, || {
        found = env
            .db
            .all_messages_out()
            .unwrap()
            .into_iter()
            .find(|row| row.content.contains("ask_question"));
        found.is_some()
    }));
    let row = found.unwrap();
    let content: Value = serde_json::from_str(&row.content).unwrap();
    content["questionId"].as_str().unwrap().to_owned()
}

/// A server with one question waiting (60 s) and the runner `waiting_user`: the server, the
/// call's request id and the questionId.
fn waiting_question(env: &Env) -> (Server, Value, String) {
    env.batch(routing("slack", "C1", None), "in-1", None);
    let mut server = env.spawn().ready();
    let id = ask(
        &mut server,
        json!({"question": "Q?", "options": ["a", "b"], "timeout": 60}),
    );
    let question = question_id(env);
    assert!(wait_until(TIMEOUT, || env.runner_status() == "waiting_user"));
    (server, id, question)
}

fn answer_row(question: &str, value: &str) -> NewMessageIn {
    NewMessageIn::new(
        "system",
        json!({"type": "question_response", "questionId": question,
               "selectedOption": value, "userId": "u1"})
        .to_string(),
    )
}

#[test]
fn answered_by_a_system_row() {
    let env = Env::new();
    env.batch(routing("slack", "C1", Some("T1")), "in-1", Some("u1"));
    let mut server = env.spawn().ready();
    let id = ask(
        &mut server,
        json!({"question": "Deploy now?", "title": "Deploy",
               "options": ["Yes", {"label": "No", "selectedLabel": "Not now", "value": "no"}]}),
    );
    let question = question_id(&env);
    let row = env
        .db
        .all_messages_out()
        .unwrap()
        .into_iter()
        .find(|row| row.content.contains(&question))
        .unwrap();
    assert_eq!(row.kind, "chat-sdk");
    assert_eq!(row.routing, routing("slack", "C1", Some("T1")));
    assert_eq!(row.in_reply_to.as_deref(), Some("in-1"));
    let content: Value = serde_json::from_str(&row.content).unwrap();
    assert_eq!(
        content,
        json!({"operation": "ask_question", "questionId": question, "title": "Deploy",
               "question": "Deploy now?", "options": [
                   {"label": "Yes", "selectedLabel": "Yes", "value": "Yes"},
                   {"label": "No", "selectedLabel": "Not now", "value": "no"}]})
    );
    assert!(env
        .db
        .state(&format!("question:{question}"))
        .unwrap()
        .is_some());
    // Written in the question row's transaction: no wait needed.
    assert_eq!(env.runner_status(), "waiting_user");
    // The runner's poll holds the answer back while the question is open.
    let answer = env.db.insert_in(&answer_row(&question, "no")).unwrap();

    let started = Instant::now();
    let response = server.response(&id, TIMEOUT).expect("answer returned");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "event-driven, not a slow poll"
    );
    assert_eq!(outcome(&response).ok(), "no");
    let answer_row = env.db.message_in(&answer.id).unwrap().unwrap();
    assert_eq!(answer_row.status, InStatus::Completed.as_str());
    assert!(env
        .db
        .state(&format!("question:{question}"))
        .unwrap()
        .is_none());
    assert_eq!(env.runner_status(), "busy");
}

#[test]
fn answered_by_a_chat_row_while_the_runner_polls() {
    let env = Env::new();
    env.batch(routing("slack", "C1", None), "in-1", None);
    let mut server = env.spawn().ready();
    let id = ask(
        &mut server,
        json!({"question": "Colour?", "options": ["red", "blue"]}),
    );
    let question = question_id(&env);
    let answer = env
        .db
        .insert_in(&NewMessageIn::new(
            "chat",
            json!({"text": "blue", "senderId": "u1", "questionId": question,
                   "selectedOption": "blue"})
            .to_string(),
        ))
        .unwrap();
    // Meanwhile the runner's poll does not see it.
    let eligible = env.db.eligible(Utc::now(), false, 10).unwrap();
    assert!(eligible.rows.iter().all(|r| r.id != answer.id));
    let response = server.response(&id, TIMEOUT).unwrap();
    assert_eq!(outcome(&response).ok(), "blue");
}

#[test]
fn times_out_and_a_late_answer_is_an_ordinary_message() {
    let env = Env::new();
    env.batch(routing("slack", "C1", None), "in-1", None);
    let mut server = env.spawn().ready();
    let started = Instant::now();
    let id = ask(
        &mut server,
        json!({"question": "Still there?", "options": ["yes"], "timeout": 1}),
    );
    let question = question_id(&env);
    let response = server.response(&id, TIMEOUT).unwrap();
    let err = outcome(&response).err();
    assert!(err.contains("no answer within 1 seconds"), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(env
        .db
        .state(&format!("question:{question}"))
        .unwrap()
        .is_none());
    assert_eq!(env.runner_status(), "busy");

    let late = env.db.insert_in(&answer_row(&question, "yes")).unwrap();
    let eligible = env.db.eligible(Utc::now(), false, 10).unwrap();
    assert!(
        eligible.rows.iter().any(|row| row.id == late.id),
        "the runner hands the late answer to the agent"
    );
}

#[test]
fn the_timeout_is_capped_by_the_server_maximum() {
    let env = Env::new();
    env.session_routing("slack", "C1");
    let mut server = env
        .spawn_with(&[("NANOCLAW_MAX_QUESTION_TIMEOUT", "1")])
        .ready();
    let started = Instant::now();
    let id = ask(
        &mut server,
        json!({"question": "Q?", "options": ["a"], "timeout": 3600}),
    );
    let response = server.response(&id, TIMEOUT).unwrap();
    assert!(outcome(&response)
        .err()
        .contains("no answer within 1 seconds"));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn cancellation_closes_the_question_and_restores_the_status() {
    let env = Env::new();
    let (mut server, id, question) = waiting_question(&env);
    server.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": id, "reason": "user interrupted"}}),
    );
    assert!(wait_until(TIMEOUT, || {
        env.db
            .state(&format!("question:{question}"))
            .unwrap()
            .is_none()
    }));
    assert!(wait_until(TIMEOUT, || env.runner_status() == "busy"));
    // No response for a cancelled request, and the server keeps serving.
    let seq = server
        .call("send_message", json!({"text": "moving on"}))
        .seq();
    assert_eq!(seq % 2, 1);
    assert!(server.response(&id, Duration::from_millis(200)).is_none());
    // A late answer now reaches the agent as a message.
    let late = env.db.insert_in(&answer_row(&question, "a")).unwrap();
    let eligible = env.db.eligible(Utc::now(), false, 10).unwrap();
    assert!(eligible.rows.iter().any(|row| row.id == late.id));
}

#[test]
fn a_question_withdrawn_by_the_runner_ends_the_wait() {
    // `/stop` while the question waits: the runner closes the open questions.
    let env = Env::new();
    let (mut server, id, _question) = waiting_question(&env);
    let asked = Instant::now();
    assert_eq!(env.db.close_open_questions().unwrap(), 1);
    let response = server.response(&id, TIMEOUT).expect("the call returns");
    assert!(asked.elapsed() < Duration::from_secs(5));
    assert!(response.to_string().contains("withdrawn"), "{response}");
    assert!(wait_until(TIMEOUT, || env.runner_status() == "busy"));
}

#[test]
fn two_questions_at_once_keep_waiting_user_until_both_end() {
    let env = Env::new();
    env.batch(routing("slack", "C1", None), "in-1", None);
    let mut server = env.spawn().ready();
    let first = ask(
        &mut server,
        json!({"question": "One?", "options": ["x"], "timeout": 60}),
    );
    let second = ask(
        &mut server,
        json!({"question": "Two?", "options": ["y"], "timeout": 60}),
    );
    let mut ids = Vec::new();
    assert!(wait_until(TIMEOUT, || {
        ids = env
            .db
            .all_messages_out()
            .unwrap()
            .into_iter()
            .filter_map(|row| {
                let content: Value = serde_json::from_str(&row.content).ok()?;
                Some((
                    content["question"].as_str()?.to_owned(),
                    content["questionId"].as_str()?.to_owned(),
                ))
            })
            .collect::<Vec<_>>();
        ids.len() == 2
    }));
    let qid = |q: &str| ids.iter().find(|(text, _)| text == q).unwrap().1.clone();
    env.db.insert_in(&answer_row(&qid("One?"), "x")).unwrap();
    assert_eq!(
        outcome(&server.response(&first, TIMEOUT).unwrap()).ok(),
        "x"
    );
    assert_eq!(
        env.runner_status(),
        "waiting_user",
        "the other question still waits"
    );
    env.db.insert_in(&answer_row(&qid("Two?"), "y")).unwrap();
    assert_eq!(
        outcome(&server.response(&second, TIMEOUT).unwrap()).ok(),
        "y"
    );
    assert_eq!(env.runner_status(), "busy");
}

#[test]
fn bad_questions_are_refused() {
    let env = Env::new();
    env.session_routing("slack", "C1");
    let mut server = env.spawn().ready();
    for (args, expected) in [
        (
            json!({"question": "", "options": ["a"]}),
            "question is empty",
        ),
        (
            json!({"question": "Q", "options": []}),
            "offer at least one choice",
        ),
        (
            json!({"question": "Q", "options": "yes or no"}),
            "options must be a list",
        ),
        (
            json!({"question": "Q", "options": ["a", "a"]}),
            "appears twice",
        ),
        (
            json!({"question": "Q", "options": ["a"], "timeout": -5}),
            "positive number",
        ),
        (
            json!({"question": "Q", "options": ["a"], "timeout": "soon"}),
            "number of seconds",
        ),
        (json!({"question": "Q"}), "missing field `options`"),
    ] {
        let err = server.call("ask_user_question", args.clone()).err();
        assert!(err.contains(expected), "{args}: {err}");
    }
    assert!(env.db.all_messages_out().unwrap().is_empty());
}

#[test]
fn sigterm_while_waiting_cleans_up_before_exit() {
    let env = Env::new();
    env.batch(routing("slack", "C1", None), "in-1", None);
    let mut server = env.spawn().ready();
    ask(
        &mut server,
        json!({"question": "Q?", "options": ["a"], "timeout": 60}),
    );
    let question = question_id(&env);
    assert!(wait_until(TIMEOUT, || env.runner_status() == "waiting_user"));
    let status = std::process::Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let started = Instant::now();
    let exit = loop {
        if let Some(exit) = server.child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "did not exit on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit}");
    assert!(env
        .db
        .state(&format!("question:{question}"))
        .unwrap()
        .is_none());
    assert_eq!(env.runner_status(), "busy");
}
