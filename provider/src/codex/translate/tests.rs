//! Unit tests of the query state machine: synthetic sequences for the bookkeeping rules, and
//! replays of transcripts captured from the real `codex app-server` (fixtures under
//! `provider/tests/fixtures/codex/`).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use expect_test::{expect, Expect};
use serde_json::{json, Value};

use super::*;
use crate::codex::protocol::Message;

fn push(id: PromptId, text: &str) -> Option<Control> {
    Some(Control::Push {
        id,
        prompt: Prompt::text(text),
    })
}

/// One line per action, events in their Debug form.
fn render(actions: &[Action]) -> String {
    let mut out = String::new();
    for action in actions {
        match action {
            Action::Emit(event) => writeln!(out, "emit {event:?}"),
            Action::StartTurn { input } => writeln!(out, "turn/start {:?}", input_text(input)),
            Action::Steer { turn_id, id, input } => {
                writeln!(out, "turn/steer {turn_id} #{id} {:?}", input_text(input))
            }
            Action::Interrupt { turn_id } => writeln!(out, "turn/interrupt {turn_id}"),
            Action::Close => writeln!(out, "close"),
        }
        .unwrap();
    }
    out
}

fn item(kind: &str, id: &str, extra: Value) -> Value {
    let mut item = json!({ "type": kind, "id": id });
    item.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    json!({ "threadId": "th", "turnId": "t1", "item": item })
}

fn completed(turn: &str, status: &str) -> Value {
    json!({ "threadId": "th", "turn": { "id": turn, "status": status, "items": [] } })
}

#[test]
fn one_turn_with_a_tool_and_text() {
    let now = Instant::now();
    let mut s = QueryState::new(Prompt::text("hello"), false);
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    log.extend(s.on_notification(
        "item/started",
        &item(
            "mcpToolCall",
            "c1",
            json!({"server": "nanoclaw", "tool": "send_message"}),
        ),
        now,
    ));
    log.extend(s.on_notification("item/completed", &item("mcpToolCall", "c1", json!({})), now));
    log.extend(s.on_notification(
        "item/agentMessage/delta",
        &json!({"turnId": "t1", "itemId": "m1", "delta": "do"}),
        now,
    ));
    log.extend(s.on_notification(
        "item/completed",
        &item("agentMessage", "m1", json!({"text": "done"})),
        now,
    ));
    log.extend(s.on_notification("turn/completed", &completed("t1", "completed"), now));
    log.extend(s.on_control(Some(Control::End), now));
    expect![[r#"
        turn/start "hello"
        emit Activity { tool: Some("mcp__nanoclaw__send_message") }
        emit ToolEnded { running: 0 }
        emit Output
        emit Result { text: "done", covers: 0 }
        close
    "#]]
    .assert_eq(&render(&log));
}

#[test]
fn push_interrupts_and_restarts_with_every_unanswered_prompt() {
    let now = Instant::now();
    let mut s = QueryState::new(Prompt::text("one"), false);
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    log.extend(s.on_control(push(1, "two"), now));
    log.extend(s.on_control(push(2, "three"), now));
    log.extend(s.on_notification("turn/completed", &completed("t1", "interrupted"), now));
    log.extend(s.on_turn_started("t2".into(), now));
    log.extend(s.on_control(Some(Control::End), now));
    log.extend(s.on_notification(
        "item/completed",
        &json!({"turnId": "t2", "item": {"type": "agentMessage", "id": "m", "text": "all three"}}),
        now,
    ));
    log.extend(s.on_notification("turn/completed", &completed("t2", "completed"), now));
    expect![[r#"
        turn/start "one"
        turn/interrupt t1
        turn/start "one\n\ntwo\n\nthree"
        emit Output
        emit Result { text: "all three", covers: 2 }
        close
    "#]]
    .assert_eq(&render(&log));
}

#[test]
fn a_turn_that_finishes_before_the_interrupt_answers_its_own_prompts_only() {
    let now = Instant::now();
    let mut s = QueryState::new(Prompt::text("one"), false);
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    log.extend(s.on_control(push(1, "two"), now));
    log.extend(s.on_notification("turn/completed", &completed("t1", "completed"), now));
    log.extend(s.on_turn_started("t2".into(), now));
    log.extend(s.on_notification("turn/completed", &completed("t2", "completed"), now));
    expect![[r#"
        turn/start "one"
        turn/interrupt t1
        emit Result { text: "", covers: 0 }
        turn/start "two"
        emit Result { text: "", covers: 1 }
    "#]]
    .assert_eq(&render(&log));
    assert!(!s.is_closed(), "the query stays open until End");
}

#[test]
fn push_waits_for_a_running_tool_then_interrupts() {
    let now = Instant::now();
    let mut s = QueryState::new(Prompt::text("one"), false);
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    log.extend(s.on_notification(
        "item/started",
        &item("commandExecution", "c1", json!({})),
        now,
    ));
    log.extend(s.on_control(push(1, "two"), now));
    log.extend(s.on_tick(now + Duration::from_secs(1)));
    log.push(Action::Emit(ProviderEvent::Progress {
        message: "-- tool done --".into(),
    }));
    log.extend(s.on_notification(
        "item/completed",
        &item("commandExecution", "c1", json!({})),
        now + Duration::from_secs(2),
    ));
    expect![[r#"
        turn/start "one"
        emit Activity { tool: Some("shell") }
        emit Progress { message: "-- tool done --" }
        emit ToolEnded { running: 0 }
        turn/interrupt t1
    "#]]
    .assert_eq(&render(&log));

    // A tool that runs on: the push interrupts after the grace period.
    let mut s = QueryState::new(Prompt::text("one"), false);
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    log.extend(s.on_notification(
        "item/started",
        &item("commandExecution", "c1", json!({})),
        now,
    ));
    log.extend(s.on_control(push(1, "two"), now));
    log.extend(s.on_tick(now + PUSH_TOOL_GRACE + Duration::from_millis(1)));
    expect![[r#"
        turn/start "one"
        emit Activity { tool: Some("shell") }
        turn/interrupt t1
    "#]]
    .assert_eq(&render(&log));
}

#[test]
fn steer_covers_a_push_once_codex_echoed_it() {
    let now = Instant::now();
    let mut s = QueryState::new(Prompt::text("one"), true);
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    log.extend(s.on_control(push(1, "two"), now));
    log.extend(s.on_control(push(2, "three"), now));
    // Only "two" made it into the turn.
    log.extend(s.on_notification(
        "item/started",
        &item(
            "userMessage",
            "u2",
            json!({"content": [{"type": "text", "text": "two", "text_elements": []}]}),
        ),
        now,
    ));
    log.extend(s.on_notification("turn/completed", &completed("t1", "completed"), now));
    log.extend(s.on_turn_started("t2".into(), now));
    log.extend(s.on_notification("turn/completed", &completed("t2", "completed"), now));
    expect![[r#"
        turn/steer t1 #1 "two"
        turn/steer t1 #2 "three"
        emit Activity { tool: None }
        emit Result { text: "", covers: 1 }
        turn/start "three"
        emit Result { text: "", covers: 2 }
    "#]]
    .assert_eq(&render(&log)[r#"turn/start "one""#.len() + 1..]);
}

#[test]
fn refused_steer_goes_to_the_next_turn() {
    let now = Instant::now();
    let mut s = QueryState::new(Prompt::text("one"), true);
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    log.extend(s.on_control(push(1, "two"), now));
    log.extend(s.on_steer_failed(1));
    log.extend(s.on_notification("turn/completed", &completed("t1", "completed"), now));
    expect![[r#"
        turn/start "one"
        turn/steer t1 #1 "two"
        emit Result { text: "", covers: 0 }
        turn/start "two"
    "#]]
    .assert_eq(&render(&log));
}

#[test]
fn abort_interrupts_reports_and_closes_after_the_turn_ended() {
    let now = Instant::now();
    let mut s = QueryState::new(Prompt::text("one"), false);
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    log.extend(s.on_control(Some(Control::Abort), now));
    assert!(s.aborting());
    log.extend(s.on_control(push(1, "ignored"), now));
    log.extend(s.on_notification("turn/completed", &completed("t1", "interrupted"), now));
    expect![[r#"
        turn/start "one"
        emit Error { message: "the turn was aborted", retryable: false, classification: Aborted, ends_turn: true }
        turn/interrupt t1
        close
    "#]]
    .assert_eq(&render(&log));

    // A dropped query (control channel closed) between turns.
    let mut s = QueryState::new(Prompt::text("one"), false);
    s.begin();
    s.on_turn_started("t1".into(), now);
    s.on_notification("turn/completed", &completed("t1", "completed"), now);
    expect![[r#"
        emit Error { message: "the turn was aborted", retryable: false, classification: Aborted, ends_turn: true }
        close
    "#]]
    .assert_eq(&render(&s.on_control(None, now)));
}

#[test]
fn failed_turn_reports_the_final_error_once() {
    let now = Instant::now();
    let mut s = QueryState::new(Prompt::text("one"), false);
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    let retry = json!({"threadId": "th", "turnId": "t1", "willRetry": true, "error": {
        "message": "Reconnecting... 1/2", "codexErrorInfo": {"responseStreamDisconnected": {"httpStatusCode": 429}},
        "additionalDetails": "exceeded retry limit, last status: 429 Too Many Requests"}});
    log.extend(s.on_notification("error", &retry, now));
    let fatal = json!({"message": "exceeded retry limit, last status: 429 Too Many Requests",
        "codexErrorInfo": {"responseTooManyFailedAttempts": {"httpStatusCode": 429}}});
    log.extend(s.on_notification(
        "error",
        &json!({"threadId": "th", "turnId": "t1", "willRetry": false, "error": fatal}),
        now,
    ));
    log.extend(s.on_notification(
        "turn/completed",
        &json!({"threadId": "th", "turn": {"id": "t1", "status": "failed", "error": fatal, "items": []}}),
        now,
    ));
    expect![[r#"
        turn/start "one"
        emit Error { message: "Reconnecting... 1/2 (exceeded retry limit, last status: 429 Too Many Requests)", retryable: true, classification: RateLimited { retry_after_secs: None }, ends_turn: false }
        emit Error { message: "exceeded retry limit, last status: 429 Too Many Requests", retryable: true, classification: RateLimited { retry_after_secs: None }, ends_turn: true }
        close
    "#]]
    .assert_eq(&render(&log));
}

#[test]
fn events_of_other_turns_are_ignored() {
    let now = Instant::now();
    let mut s = QueryState::new(Prompt::text("one"), false);
    s.begin();
    s.on_turn_started("t1".into(), now);
    let stale = json!({"threadId": "th", "turnId": "t0", "item": {"type": "agentMessage", "id": "m", "text": "old"}});
    assert!(render(&s.on_notification("item/completed", &stale, now)).is_empty());
    assert!(
        render(&s.on_notification("turn/completed", &completed("t0", "completed"), now)).is_empty()
    );
    assert!(s.turn_active());
}

#[test]
fn process_exit_ends_the_turn_retryably() {
    let now = Instant::now();
    let mut s = QueryState::new(Prompt::text("one"), false);
    s.begin();
    s.on_turn_started("t1".into(), now);
    expect![[r#"
        emit Error { message: "the codex app-server process exited (signal: 9 (SIGKILL))", retryable: true, classification: Process, ends_turn: true }
        close
    "#]]
    .assert_eq(&render(&s.on_exit(" (signal: 9 (SIGKILL))")));
}

// ---------------------------------------------------------------------------------------------
// Replays of captured transcripts
// ---------------------------------------------------------------------------------------------

/// Replays a transcript recorded by `CodexProvider::record_transcript` (see
/// `tests/fixtures/codex/README.md`) through a fresh [`QueryState`] per query, the way the
/// driver does, and renders the events and requests the state machine produced.
fn replay(fixture: &str, steer: bool) -> String {
    let path = format!(
        "{}/tests/fixtures/codex/{fixture}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{path}: {err}"));
    let now = Instant::now();
    let mut out = String::new();
    // Client request id → method, to route responses.
    let mut requests: HashMap<String, (String, Value)> = HashMap::new();
    let mut state: Option<QueryState> = None;
    let mut thread: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let entry: Value =
            serde_json::from_str(line).unwrap_or_else(|err| panic!("{path}:{}: {err}", n + 1));
        let mut actions = Vec::new();
        if let Some(sent) = entry.get("out") {
            let method = sent.get("method").and_then(Value::as_str).unwrap_or("");
            if let Some(id) = sent.get("id") {
                if !method.is_empty() {
                    requests.insert(id.to_string(), (method.to_owned(), sent["params"].clone()));
                }
            }
            if method == "turn/start" && state.is_none() {
                // A new query: its first prompt is the first turn's input.
                let text = input_text(sent["params"]["input"].as_array().unwrap());
                let mut fresh = QueryState::new(Prompt::text(text), steer);
                out.push_str(&render(&fresh.begin()));
                state = Some(fresh);
            }
            continue;
        }
        if let Some(control) = entry.get("control") {
            let control = match control.as_str().unwrap() {
                "push" => push(
                    entry["id"].as_u64().unwrap(),
                    entry["text"].as_str().unwrap(),
                ),
                "end" => Some(Control::End),
                "abort" => Some(Control::Abort),
                _ => None,
            };
            writeln!(out, "-- control {control:?}").unwrap();
            if let Some(s) = state.as_mut() {
                actions = s.on_control(control, now);
            }
        } else if entry.get("exit").is_some() {
            writeln!(out, "-- process exited").unwrap();
            if let Some(s) = state.as_mut() {
                actions = s.on_exit("");
            }
        } else if let Some(received) = entry.get("in") {
            let message: Message = serde_json::from_value(received.clone()).unwrap();
            match (&message.id, &message.method) {
                (Some(id), None) => {
                    let (method, _) = requests
                        .get(&serde_json::to_string(id).unwrap())
                        .cloned()
                        .unwrap_or_default();
                    match (method.as_str(), &message.result, &message.error) {
                        ("thread/start" | "thread/resume", Some(result), _) => {
                            let id = result["thread"]["id"].as_str().unwrap().to_owned();
                            writeln!(out, "emit Init {{ session_id: {:?} }}", short(&id)).unwrap();
                            thread = Some(id);
                        }
                        ("thread/resume", None, Some(error)) => {
                            writeln!(out, "-- thread/resume refused: {}", error.message).unwrap();
                        }
                        ("turn/start", Some(result), _) => {
                            if let Some(s) = state.as_mut() {
                                actions = s.on_turn_started(
                                    result["turn"]["id"].as_str().unwrap().to_owned(),
                                    now,
                                );
                            }
                        }
                        ("turn/steer", None, Some(error)) => {
                            writeln!(out, "-- turn/steer refused: {}", error.message).unwrap();
                        }
                        _ => {}
                    }
                }
                (Some(_), Some(method)) => {
                    writeln!(
                        out,
                        "-- server request {method} -> {}",
                        answer_for(method, &message)
                    )
                    .unwrap();
                    if let Some(s) = state.as_mut() {
                        actions = s.on_server_request(method, now);
                    }
                }
                (None, Some(method)) => {
                    let params = message.params.clone().unwrap_or(Value::Null);
                    let ours = params
                        .get("threadId")
                        .and_then(Value::as_str)
                        .is_none_or(|t| Some(t) == thread.as_deref());
                    if let (Some(s), true) = (state.as_mut(), ours) {
                        actions = s.on_notification(method, &params, now);
                    }
                }
                (None, None) => {}
            }
        }
        // Requests are not executed here (the transcript holds what really happened); show them
        // so the snapshot documents that the machine asked for what was sent.
        out.push_str(&render(&actions).replace(thread.as_deref().unwrap_or("\u{0}"), "<thread>"));
        if state.as_ref().is_some_and(QueryState::is_closed) {
            writeln!(out, "-- query closed").unwrap();
            state = None;
        }
    }
    shorten_turn_ids(&out)
}

fn answer_for(method: &str, message: &Message) -> String {
    match crate::codex::protocol::answer_server_request(
        method,
        message.params.as_ref().unwrap_or(&Value::Null),
    ) {
        Ok(v) => v.to_string(),
        Err((code, _)) => format!("error {code}"),
    }
}

/// Thread and turn ids are UUIDs (v7): keep the tail so the snapshot stays readable.
fn short(id: &str) -> String {
    id.rsplit('-').next().unwrap_or(id).to_owned()
}

fn shorten_turn_ids(text: &str) -> String {
    text.lines()
        .map(|line| {
            line.split(' ')
                .map(|word| {
                    if word.len() == 36 && word.matches('-').count() == 4 {
                        short(word)
                    } else {
                        word.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn check(fixture: &str, steer: bool, expect: Expect) {
    expect.assert_eq(&replay(fixture, steer));
}

#[test]
fn replay_text_reply() {
    check(
        "text_reply.jsonl",
        false,
        expect![[r#"
            emit Init { session_id: "919025ef9554" }
            turn/start "<message id=\"1\">hi</message>"
            emit Activity { tool: None }
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Output
            emit Result { text: "hello from the fake model", covers: 0 }
            -- control Some(End)
            close
            -- query closed
            -- process exited
        "#]],
    );
}

#[test]
fn replay_mcp_tool_call() {
    check(
        "mcp_tool_call.jsonl",
        false,
        expect![[r#"
            emit Init { session_id: "2ca158e75ed7" }
            turn/start "please send"
            emit Activity { tool: None }
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: Some("mcp__nanoclaw__send_message") }
            emit ToolEnded { running: 0 }
            emit Output
            emit Result { text: "done", covers: 0 }
            -- control Some(End)
            close
            -- query closed
            -- process exited
        "#]],
    );
}

#[test]
fn replay_push_restart() {
    check(
        "push_restart.jsonl",
        false,
        expect![[r#"
            emit Init { session_id: "af34261f0185" }
            turn/start "first message"
            emit Activity { tool: None }
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            -- control Some(Push { id: 1, prompt: Prompt { text: "second message", media: [] } })
            turn/interrupt 05a8d37b1bac
            turn/start "first message\n\nsecond message"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Output
            emit Result { text: "answer to both", covers: 1 }
            -- control Some(End)
            close
            -- query closed
            -- process exited
        "#]],
    );
}

#[test]
fn replay_push_steer() {
    check(
        "push_steer.jsonl",
        true,
        expect![[r#"
            emit Init { session_id: "dc0a1ae50460" }
            turn/start "first message"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: None }
            -- control Some(Push { id: 1, prompt: Prompt { text: "second message", media: [] } })
            turn/steer a208601aecd9 #1 "second message"
            emit Output
            emit Result { text: "steered answer", covers: 1 }
            -- control Some(End)
            close
            -- query closed
            -- process exited
        "#]],
    );
}

#[test]
fn replay_api_errors() {
    check(
        "api_errors.jsonl",
        false,
        expect![[r#"
            emit Init { session_id: "b4041b4a8b75" }
            turn/start "trigger 500"
            emit Activity { tool: None }
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Error { message: "Reconnecting... 1/1 (We’re currently experiencing high demand, which may cause temporary errors.)", retryable: true, classification: Api, ends_turn: false }
            emit Error { message: "We’re currently experiencing high demand, which may cause temporary errors.", retryable: false, classification: Api, ends_turn: true }
            close
            -- query closed
            turn/start "trigger 429"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: None }
            emit Error { message: "Reconnecting... 1/1 (exceeded retry limit, last status: 429 Too Many Requests)", retryable: true, classification: RateLimited { retry_after_secs: None }, ends_turn: false }
            emit Error { message: "exceeded retry limit, last status: 429 Too Many Requests", retryable: true, classification: RateLimited { retry_after_secs: None }, ends_turn: true }
            close
            -- query closed
            turn/start "trigger 401"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: None }
            emit Error { message: "Reconnecting... 1/1 (unexpected status 401 Unauthorized: fake 401 error, url: http://127.0.0.1:38129/v1/responses)", retryable: true, classification: Auth, ends_turn: false }
            emit Error { message: "unexpected status 401 Unauthorized: fake 401 error, url: http://127.0.0.1:38129/v1/responses", retryable: false, classification: Auth, ends_turn: true }
            close
            -- query closed
            turn/start "are you there?"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: None }
            emit Output
            emit Result { text: "back to normal", covers: 0 }
            -- control Some(End)
            close
            -- query closed
            -- process exited
        "#]],
    );
}

#[test]
fn replay_stale_continuation() {
    check(
        "stale_continuation.jsonl",
        false,
        expect![[r#"
            -- thread/resume refused: no rollout found for thread id 000000000000
            emit Init { session_id: "565fd74f7ba3" }
            turn/start "hello again"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: None }
            emit Output
            emit Result { text: "fresh answer", covers: 0 }
            -- control Some(End)
            close
            -- query closed
            -- process exited
        "#]],
    );
}

#[test]
fn replay_abort() {
    check(
        "abort.jsonl",
        false,
        expect![[r#"
            emit Init { session_id: "60807ee462d8" }
            turn/start "long task"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: None }
            -- control Some(Abort)
            emit Error { message: "the turn was aborted", retryable: false, classification: Aborted, ends_turn: true }
            turn/interrupt 99b8f4c2f070
            close
            -- query closed
            turn/start "next one"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: None }
            emit Output
            emit Result { text: "next", covers: 0 }
            -- control Some(End)
            close
            -- query closed
            -- process exited
        "#]],
    );
}

#[test]
fn replay_process_killed() {
    check(
        "process_killed.jsonl",
        false,
        expect![[r#"
            emit Init { session_id: "c29a7b139bab" }
            turn/start "doomed turn"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: None }
            -- process exited
            emit Error { message: "the codex app-server process exited", retryable: true, classification: Process, ends_turn: true }
            close
            -- query closed
            emit Init { session_id: "c29a7b139bab" }
            turn/start "still there?"
            emit Activity { tool: None }
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Output
            emit Result { text: "after the crash", covers: 0 }
            -- control Some(End)
            close
            -- query closed
            -- process exited
        "#]],
    );
}

#[test]
fn replay_resume() {
    check(
        "resume.jsonl",
        false,
        expect![[r#"
            emit Init { session_id: "e442442f2bca" }
            turn/start "remember the word PAPAYA"
            emit Activity { tool: None }
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Output
            emit Result { text: "first answer", covers: 0 }
            -- control Some(End)
            close
            -- query closed
            -- process exited
            emit Init { session_id: "e442442f2bca" }
            turn/start "which word?"
            emit Activity { tool: None }
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Output
            emit Result { text: "second answer", covers: 0 }
            -- control Some(End)
            close
            -- query closed
            -- process exited
            emit Init { session_id: "e442442f2bca" }
            turn/start "and now?"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: None }
            emit Output
            emit Result { text: "third answer", covers: 0 }
            -- control Some(End)
            close
            -- query closed
            -- process exited
        "#]],
    );
}

#[test]
fn replay_shell_env() {
    check(
        "shell_env.jsonl",
        false,
        expect![[r#"
            emit Init { session_id: "5f31034f5da2" }
            turn/start "run env"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: None }
            emit Activity { tool: Some("shell") }
            emit ToolEnded { running: 0 }
            emit Output
            emit Result { text: "listed", covers: 0 }
            -- control Some(End)
            close
            -- query closed
            -- process exited
        "#]],
    );
}

fn error(info: Value, message: &str) -> TurnError {
    TurnError {
        message: message.into(),
        codex_error_info: if info.is_null() { None } else { Some(info) },
        ..Default::default()
    }
}

#[test]
fn classification() {
    let cases = [
        (
            json!({"httpConnectionFailed": {"httpStatusCode": 401}}),
            "",
            ErrorClass::Auth,
        ),
        (
            json!({"responseTooManyFailedAttempts": {"httpStatusCode": 429}}),
            "",
            ErrorClass::RATE_LIMITED,
        ),
        (
            json!({"responseTooManyFailedAttempts": {"httpStatusCode": 429}}),
            "You exceeded your current quota, please check your plan and billing details.",
            ErrorClass::Quota,
        ),
        (
            Value::Null,
            "exceeded retry limit, last status: 429 Too Many Requests",
            ErrorClass::RATE_LIMITED,
        ),
        (json!("rateLimitExceeded"), "", ErrorClass::RATE_LIMITED),
        (
            json!({"responseStreamDisconnected": {"httpStatusCode": 500}}),
            "",
            ErrorClass::Api,
        ),
        (
            json!({"responseStreamDisconnected": {"httpStatusCode": null}}),
            "",
            ErrorClass::Api,
        ),
        (json!("internalServerError"), "", ErrorClass::Api),
        (json!("usageLimitExceeded"), "", ErrorClass::Quota),
        (json!("unauthorized"), "", ErrorClass::Auth),
        (
            Value::Null,
            "Missing environment variable: `NANOCLAW_CODEX_API_KEY`.",
            ErrorClass::Auth,
        ),
        (Value::Null, "stream disconnected", ErrorClass::Api),
    ];
    for (info, message, class) in cases {
        assert_eq!(
            classify_error(&error(info.clone(), message)),
            class,
            "{info} {message}"
        );
    }
}
