//! Unit tests of the query state machine: synthetic sequences for the bookkeeping rules, and
//! replays of transcripts captured from the real `codex app-server` (fixtures under
//! `drivers/codex/tests/fixtures/codex/`).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use expect_test::{expect, Expect};
use serde_json::{json, Value};

use super::*;
use crate::command::APPROVAL_STOP_HOOK_STATUS;
use crate::protocol::{Message, RequestId, TurnError};

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
            Action::Respond { id, result } => writeln!(out, "respond {id:?} {result}"),
            Action::Note { text } => writeln!(out, "note {text:?}"),
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
        emit Activity { tool: Some("mcp__nanoclaw__send_message"), summary: None }
        emit ToolEnded { running: 0 }
        emit Output
        emit Text { text: "done" }
        emit Result { text: "done", covers: 0, usage: None }
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
        emit Text { text: "all three" }
        emit Output
        emit Result { text: "all three", covers: 2, usage: None }
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
        emit Result { text: "", covers: 0, usage: None }
        turn/start "two"
        emit Result { text: "", covers: 1, usage: None }
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
        emit Activity { tool: Some("Bash"), summary: None }
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
        emit Activity { tool: Some("Bash"), summary: None }
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
        emit Activity { tool: None, summary: None }
        emit Result { text: "", covers: 1, usage: None }
        turn/start "three"
        emit Result { text: "", covers: 2, usage: None }
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
        emit Result { text: "", covers: 0, usage: None }
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
        emit Error { message: "the turn was aborted", retryable: false, classification: Aborted, ends_turn: true, usage: None }
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
        emit Error { message: "the turn was aborted", retryable: false, classification: Aborted, ends_turn: true, usage: None }
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
        emit Error { message: "Reconnecting... 1/2 (exceeded retry limit, last status: 429 Too Many Requests)", retryable: true, classification: RateLimited { retry_after_secs: None }, ends_turn: false, usage: None }
        emit Error { message: "exceeded retry limit, last status: 429 Too Many Requests", retryable: true, classification: RateLimited { retry_after_secs: None }, ends_turn: true, usage: None }
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
        emit Error { message: "the codex app-server process exited (signal: 9 (SIGKILL))", retryable: true, classification: Process, ends_turn: true, usage: None }
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
    replay_with(fixture, steer, None)
}

/// [`replay`] with the step limit the transcript was recorded with.
fn replay_with(fixture: &str, steer: bool, max_turns: Option<u32>) -> String {
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
    let mut thread_model: Option<String> = None;
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
                let model = sent["params"]["model"].as_str().map(str::to_owned);
                let mut fresh = QueryState::new(Prompt::text(text), steer)
                    .with_model(model.or_else(|| thread_model.clone()))
                    .with_max_turns(max_turns);
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
                "interrupt" => Some(Control::Interrupt),
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
                            thread_model = result["model"].as_str().map(str::to_owned);
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
                        actions = s.on_server_request(method, None, now);
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
    match crate::protocol::answer_server_request(
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
            emit Activity { tool: None, summary: None }
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Output
            emit Text { text: "hello from the fake model" }
            emit Result { text: "hello from the fake model", covers: 0, usage: Some(Usage { input_tokens: Some(10), output_tokens: Some(5), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: Some("fake-model"), requests: Some(1) }) }
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
            emit Activity { tool: None, summary: None }
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: Some("mcp__nanoclaw__send_message"), summary: None }
            emit ToolEnded { running: 0 }
            emit Output
            emit Text { text: "done" }
            emit Result { text: "done", covers: 0, usage: Some(Usage { input_tokens: Some(20), output_tokens: Some(10), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: Some("fake-model"), requests: Some(2) }) }
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
            emit Activity { tool: None, summary: None }
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            -- control Some(Push { id: 1, prompt: Prompt { text: "second message", media: [] } })
            turn/interrupt 05a8d37b1bac
            turn/start "first message\n\nsecond message"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Output
            emit Text { text: "answer to both" }
            emit Result { text: "answer to both", covers: 1, usage: Some(Usage { input_tokens: Some(10), output_tokens: Some(5), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: Some("fake-model"), requests: Some(1) }) }
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
            emit Activity { tool: None, summary: None }
            -- control Some(Push { id: 1, prompt: Prompt { text: "second message", media: [] } })
            turn/steer a208601aecd9 #1 "second message"
            emit Output
            emit Text { text: "steered answer" }
            emit Result { text: "steered answer", covers: 1, usage: Some(Usage { input_tokens: Some(10), output_tokens: Some(5), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: Some("fake-model"), requests: Some(1) }) }
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
            emit Activity { tool: None, summary: None }
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Error { message: "Reconnecting... 1/1 (We’re currently experiencing high demand, which may cause temporary errors.)", retryable: true, classification: Api, ends_turn: false, usage: None }
            emit Error { message: "We’re currently experiencing high demand, which may cause temporary errors.", retryable: false, classification: Api, ends_turn: true, usage: None }
            close
            -- query closed
            turn/start "trigger 429"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: None, summary: None }
            emit Error { message: "Reconnecting... 1/1 (exceeded retry limit, last status: 429 Too Many Requests)", retryable: true, classification: RateLimited { retry_after_secs: None }, ends_turn: false, usage: None }
            emit Error { message: "exceeded retry limit, last status: 429 Too Many Requests", retryable: true, classification: RateLimited { retry_after_secs: None }, ends_turn: true, usage: None }
            close
            -- query closed
            turn/start "trigger 401"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: None, summary: None }
            emit Error { message: "Reconnecting... 1/1 (unexpected status 401 Unauthorized: fake 401 error, url: http://127.0.0.1:38129/v1/responses)", retryable: true, classification: Auth, ends_turn: false, usage: None }
            emit Error { message: "unexpected status 401 Unauthorized: fake 401 error, url: http://127.0.0.1:38129/v1/responses", retryable: false, classification: Auth, ends_turn: true, usage: None }
            close
            -- query closed
            turn/start "are you there?"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: None, summary: None }
            emit Output
            emit Text { text: "back to normal" }
            emit Result { text: "back to normal", covers: 0, usage: Some(Usage { input_tokens: Some(10), output_tokens: Some(5), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: Some("fake-model"), requests: Some(1) }) }
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
            emit Activity { tool: None, summary: None }
            emit Output
            emit Text { text: "fresh answer" }
            emit Result { text: "fresh answer", covers: 0, usage: Some(Usage { input_tokens: Some(10), output_tokens: Some(5), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: Some("fake-model"), requests: Some(1) }) }
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
            emit Activity { tool: None, summary: None }
            -- control Some(Abort)
            emit Error { message: "the turn was aborted", retryable: false, classification: Aborted, ends_turn: true, usage: None }
            turn/interrupt 99b8f4c2f070
            close
            -- query closed
            turn/start "next one"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: None, summary: None }
            emit Output
            emit Text { text: "next" }
            emit Result { text: "next", covers: 0, usage: Some(Usage { input_tokens: Some(10), output_tokens: Some(5), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: Some("fake-model"), requests: Some(1) }) }
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
            emit Activity { tool: None, summary: None }
            -- process exited
            emit Error { message: "the codex app-server process exited", retryable: true, classification: Process, ends_turn: true, usage: None }
            close
            -- query closed
            emit Init { session_id: "c29a7b139bab" }
            turn/start "still there?"
            emit Activity { tool: None, summary: None }
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Output
            emit Text { text: "after the crash" }
            emit Result { text: "after the crash", covers: 0, usage: Some(Usage { input_tokens: Some(10), output_tokens: Some(5), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: Some("fake-model"), requests: Some(1) }) }
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
            emit Activity { tool: None, summary: None }
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Output
            emit Text { text: "first answer" }
            emit Result { text: "first answer", covers: 0, usage: Some(Usage { input_tokens: Some(10), output_tokens: Some(5), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: Some("fake-model"), requests: Some(1) }) }
            -- control Some(End)
            close
            -- query closed
            -- process exited
            emit Init { session_id: "e442442f2bca" }
            turn/start "which word?"
            emit Activity { tool: None, summary: None }
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Output
            emit Text { text: "second answer" }
            emit Result { text: "second answer", covers: 0, usage: Some(Usage { input_tokens: Some(10), output_tokens: Some(5), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: Some("fake-model"), requests: Some(1) }) }
            -- control Some(End)
            close
            -- query closed
            -- process exited
            emit Init { session_id: "e442442f2bca" }
            turn/start "and now?"
            emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
            emit Activity { tool: None, summary: None }
            emit Output
            emit Text { text: "third answer" }
            emit Result { text: "third answer", covers: 0, usage: Some(Usage { input_tokens: Some(10), output_tokens: Some(5), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: Some("fake-model"), requests: Some(1) }) }
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
            emit Activity { tool: None, summary: None }
            emit Activity { tool: Some("Bash"), summary: Some("env") }
            emit ToolEnded { running: 0 }
            emit Output
            emit Text { text: "listed" }
            emit Result { text: "listed", covers: 0, usage: Some(Usage { input_tokens: Some(20), output_tokens: Some(10), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: Some("fake-model"), requests: Some(2) }) }
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
            wire::classify_error(&error(info.clone(), message)),
            class,
            "{info} {message}"
        );
    }
}

/// A `thread/tokenUsage/updated` of turn `t1`: one response's figures and the thread total.
fn token_usage(last: Value, total: Value) -> Value {
    json!({ "threadId": "th", "turnId": "t1", "tokenUsage": { "last": last, "total": total } })
}

fn figures(input: u64, cached: u64, output: u64, reasoning: u64) -> Value {
    json!({
        "inputTokens": input, "cachedInputTokens": cached, "cacheWriteInputTokens": 0,
        "outputTokens": output, "reasoningOutputTokens": reasoning,
        "totalTokens": input + output,
    })
}

fn usage_of(events: &[Action]) -> Vec<Option<Usage>> {
    events
        .iter()
        .filter_map(|action| match action {
            Action::Emit(
                ProviderEvent::Result { usage, .. }
                | ProviderEvent::Interrupted { usage, .. }
                | ProviderEvent::Error {
                    usage,
                    ends_turn: true,
                    ..
                },
            ) => Some(usage.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn usage_sums_each_response_once_in_the_ledgers_terms() {
    let now = Instant::now();
    let mut s = QueryState::new(Prompt::text("one"), false).with_model(Some("gpt-x".into()));
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    // Step 1: a tool call; Codex's input includes the cached tokens, output the reasoning.
    log.extend(s.on_notification(
        "item/started",
        &item(
            "commandExecution",
            "c1",
            json!({"command": "/bin/bash -lc 'ls -la'"}),
        ),
        now,
    ));
    log.extend(s.on_notification(
        "item/completed",
        &item("commandExecution", "c1", json!({})),
        now,
    ));
    let first = figures(100, 40, 30, 12);
    log.extend(s.on_notification(
        "thread/tokenUsage/updated",
        &token_usage(first.clone(), first.clone()),
        now,
    ));
    // The same total again (sent along with a rate-limit update): not a new response.
    log.extend(s.on_notification(
        "thread/tokenUsage/updated",
        &token_usage(first.clone(), first),
        now,
    ));
    // Step 2: the final text.
    log.extend(s.on_notification(
        "thread/tokenUsage/updated",
        &token_usage(figures(150, 100, 7, 0), figures(250, 140, 37, 12)),
        now,
    ));
    log.extend(s.on_notification("turn/completed", &completed("t1", "completed"), now));
    assert_eq!(
        usage_of(&log),
        vec![Some(Usage {
            input_tokens: Some(60 + 50),
            output_tokens: Some(37),
            cache_read_tokens: Some(140),
            cache_write_tokens: Some(0),
            reasoning_tokens: Some(12),
            cost_usd: None,
            model: Some("gpt-x".into()),
            requests: Some(2),
        })]
    );
    // The next turn starts from nothing.
    log = s.on_control(push(1, "two"), now);
    log.extend(s.on_turn_started("t2".into(), now));
    log.extend(s.on_notification("turn/completed", &completed("t2", "completed"), now));
    assert_eq!(usage_of(&log), vec![None], "no figures: unknown, not 0");
}

#[test]
fn a_reroute_names_the_new_model_and_a_failed_turn_carries_its_usage() {
    let now = Instant::now();
    let mut s = QueryState::new(Prompt::text("one"), false).with_model(Some("a".into()));
    s.begin();
    s.on_turn_started("t1".into(), now);
    s.on_notification(
        "model/rerouted",
        &json!({"threadId": "th", "turnId": "t1", "fromModel": "a", "toModel": "b", "reason": "x"}),
        now,
    );
    let step = figures(10, 0, 5, 0);
    s.on_notification(
        "thread/tokenUsage/updated",
        &token_usage(step.clone(), step),
        now,
    );
    let log = s.on_notification("turn/completed", &completed("t1", "failed"), now);
    let usage = usage_of(&log).pop().flatten().unwrap();
    assert_eq!(
        (usage.model.as_deref(), usage.requests),
        (Some("b"), Some(1))
    );
}

#[test]
fn interrupt_stops_the_turn_and_leaves_unsent_pushes_uncovered() {
    let now = Instant::now();
    let mut s = QueryState::new(Prompt::text("one"), false);
    let mut log = s.begin();
    // Before turn/start answered: the interrupt waits for the turn id.
    log.extend(s.on_control(Some(Control::Interrupt), now));
    assert!(s.stopping());
    log.extend(s.on_turn_started("t1".into(), now));
    // Pushed after the stop: not consumed, the runner runs it again.
    log.extend(s.on_control(push(1, "two"), now));
    let step = figures(10, 0, 5, 0);
    log.extend(s.on_notification(
        "thread/tokenUsage/updated",
        &token_usage(step.clone(), step),
        now,
    ));
    log.extend(s.on_notification("turn/completed", &completed("t1", "interrupted"), now));
    expect![[r#"
        turn/start "one"
        turn/interrupt t1
        emit Activity { tool: None, summary: None }
        emit Interrupted { covers: 0, usage: Some(Usage { input_tokens: Some(10), output_tokens: Some(5), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: None, requests: Some(1) }), reason: Stopped }
        close
    "#]]
    .assert_eq(&render(&log));
    assert!(s.is_closed() && !s.stopping());
}

#[test]
fn interrupt_of_a_push_restart_covers_the_push_only_once_the_model_responded() {
    let now = Instant::now();
    let restart = || {
        let mut s = QueryState::new(Prompt::text("one"), false);
        let mut log = s.begin();
        log.extend(s.on_turn_started("t1".into(), now));
        log.extend(s.on_control(push(1, "two"), now));
        log.extend(s.on_notification("turn/completed", &completed("t1", "interrupted"), now));
        log.extend(s.on_turn_started("t2".into(), now));
        log.extend(s.on_control(push(2, "three"), now));
        (s, log)
    };
    let t2_interrupted =
        json!({"threadId": "th", "turn": {"id": "t2", "status": "interrupted", "items": []}});
    // The model stalls on the restart: the push it never acted on is left to the runner.
    let (mut s, mut log) = restart();
    log.extend(s.on_control(Some(Control::Interrupt), now));
    log.extend(s.on_notification("turn/completed", &t2_interrupted, now));
    expect![[r#"
        turn/start "one"
        turn/interrupt t1
        turn/start "one\n\ntwo"
        turn/interrupt t2
        emit Interrupted { covers: 0, usage: None, reason: Stopped }
        close
    "#]]
    .assert_eq(&render(&log));

    // The model was working on both: the push is covered; the later one is not.
    let (mut s, _) = restart();
    s.on_notification(
        "item/started",
        &json!({"turnId": "t2", "item": {"type": "commandExecution", "id": "c", "command": "ls"}}),
        now,
    );
    s.on_control(Some(Control::Interrupt), now);
    expect![[r#"
        emit Interrupted { covers: 1, usage: None, reason: Stopped }
        close
    "#]]
    .assert_eq(&render(&s.on_notification(
        "turn/completed",
        &t2_interrupted,
        now,
    )));
}

#[test]
fn interrupt_between_turns_or_after_the_answer_ends_the_query() {
    let now = Instant::now();
    // Between turns: nothing runs.
    let mut s = QueryState::new(Prompt::text("one"), false);
    s.begin();
    s.on_turn_started("t1".into(), now);
    s.on_notification("turn/completed", &completed("t1", "completed"), now);
    expect![[r#"
        emit Interrupted { covers: 0, usage: None, reason: Stopped }
        close
    "#]]
    .assert_eq(&render(&s.on_control(Some(Control::Interrupt), now)));

    // The turn completed before the interrupt landed: its answer stands, the query ends.
    let mut s = QueryState::new(Prompt::text("one"), false);
    s.begin();
    s.on_turn_started("t1".into(), now);
    let mut log = s.on_control(Some(Control::Interrupt), now);
    log.extend(s.on_notification("turn/completed", &completed("t1", "completed"), now));
    expect![[r#"
        turn/interrupt t1
        emit Result { text: "", covers: 0, usage: None }
        close
    "#]]
    .assert_eq(&render(&log));

    // Codex never answers: the driver's deadline ends the turn the same way.
    let mut s = QueryState::new(Prompt::text("one"), false);
    s.begin();
    s.on_turn_started("t1".into(), now);
    s.on_control(Some(Control::Interrupt), now);
    expect![[r#"
        emit Interrupted { covers: 0, usage: None, reason: Stopped }
        close
    "#]]
    .assert_eq(&render(&s.on_stop_timeout()));
    assert!(s.on_stop_timeout().is_empty(), "once");
}

#[test]
fn max_turns_interrupts_a_step_that_asks_for_more() {
    let now = Instant::now();
    let step = figures(10, 0, 5, 0);
    let mut s = QueryState::new(Prompt::text("one"), false).with_max_turns(Some(2));
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    for (n, total) in [(1, figures(10, 0, 5, 0)), (2, figures(20, 0, 10, 0))] {
        let id = format!("c{n}");
        log.extend(s.on_notification(
            "item/started",
            &item(
                "mcpToolCall",
                &id,
                json!({"server": "nanoclaw", "tool": "send_message"}),
            ),
            now,
        ));
        log.extend(s.on_notification("item/completed", &item("mcpToolCall", &id, json!({})), now));
        log.extend(s.on_notification(
            "thread/tokenUsage/updated",
            &token_usage(step.clone(), total),
            now,
        ));
    }
    log.extend(s.on_notification("turn/completed", &completed("t1", "interrupted"), now));
    expect![[r#"
        turn/start "one"
        emit Activity { tool: Some("mcp__nanoclaw__send_message"), summary: None }
        emit ToolEnded { running: 0 }
        emit Activity { tool: Some("mcp__nanoclaw__send_message"), summary: None }
        emit ToolEnded { running: 0 }
        turn/interrupt t1
        emit Interrupted { covers: 0, usage: Some(Usage { input_tokens: Some(20), output_tokens: Some(10), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: None, requests: Some(2) }), reason: MaxTurns }
        close
    "#]]
    .assert_eq(&render(&log));

    // A last step that only answers is within the limit.
    let mut s = QueryState::new(Prompt::text("one"), false).with_max_turns(Some(1));
    s.begin();
    s.on_turn_started("t1".into(), now);
    let log = s.on_notification(
        "thread/tokenUsage/updated",
        &token_usage(step.clone(), step),
        now,
    );
    assert!(
        !log.iter().any(|a| matches!(a, Action::Interrupt { .. })),
        "{log:?}"
    );
    assert!(!s.stopping());
}

#[test]
fn text_is_emitted_when_its_item_completes_before_the_next_tool() {
    let now = Instant::now();
    let mut s = QueryState::new(Prompt::text("one"), false);
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    log.extend(s.on_notification(
        "item/completed",
        &item(
            "agentMessage",
            "m1",
            json!({"text": "<message to=\"ops\">on it</message>"}),
        ),
        now,
    ));
    log.extend(s.on_notification(
        "item/started",
        &item(
            "commandExecution",
            "c1",
            json!({"command": "/bin/bash -lc 'sleep 5'"}),
        ),
        now,
    ));
    log.extend(s.on_notification(
        "item/completed",
        &item("agentMessage", "m2", json!({"text": "   "})),
        now,
    ));
    expect![[r#"
        turn/start "one"
        emit Text { text: "<message to=\"ops\">on it</message>" }
        emit Output
        emit Activity { tool: Some("Bash"), summary: Some("sleep 5") }
    "#]]
    .assert_eq(&render(&log));
}

#[test]
fn tool_names_and_summaries_are_canonical() {
    let long = "é".repeat(200);
    let cases = [
        json!({"type": "commandExecution", "command": "/bin/bash -lc 'ls -la /tmp'"}),
        json!({"type": "commandExecution", "command": "bash -c \"echo hi\""}),
        json!({"type": "commandExecution", "command": "/bin/bash -lc 'echo '\\''x'\\'''"}),
        json!({"type": "commandExecution", "command": format!("/bin/bash -lc '{long}'")}),
        json!({"type": "commandExecution", "command": "/bin/bash -lc 'cat <<EOF\nline two\nEOF'"}),
        json!({"type": "fileChange", "changes": [
            {"path": "/w/new.txt", "kind": {"type": "add"}, "diff": ""},
            {"path": "/w/other.txt", "kind": {"type": "add"}, "diff": ""}]}),
        json!({"type": "fileChange", "changes": [
            {"path": "/w/new.txt", "kind": {"type": "add"}, "diff": ""},
            {"path": "/w/old.txt", "kind": {"type": "update", "move_path": null}, "diff": ""}]}),
        json!({"type": "webSearch", "query": "rust sqlite wal"}),
        json!({"type": "webSearch", "query": ""}),
        json!({"type": "mcpToolCall", "server": "nanoclaw", "tool": "send_message"}),
        json!({"type": "imageView", "path": "/w/a.png"}),
    ];
    let rendered: Vec<String> = cases
        .into_iter()
        .map(|raw| {
            let item: crate::protocol::Item = serde_json::from_value(raw).unwrap();
            let summary = item.tool_summary();
            if let Some(s) = &summary {
                assert!(s.chars().count() <= 120 && !s.contains('\n'), "{s}");
            }
            format!(
                "{:?} {:?}",
                item.tool_name(),
                summary.map(|s| s.chars().count().to_string()
                    + " "
                    + &s.chars().take(20).collect::<String>())
            )
        })
        .collect();
    expect![[r#"
        Some("Bash") Some("11 ls -la /tmp")
        Some("Bash") Some("7 echo hi")
        Some("Bash") Some("16 'echo '\\''x'\\'''")
        Some("Bash") Some("120 éééééééééééééééééééé")
        Some("Bash") Some("9 cat <<EOF")
        Some("Write") Some("10 /w/new.txt")
        Some("Edit") Some("10 /w/new.txt")
        Some("WebSearch") Some("15 rust sqlite wal")
        Some("WebSearch") None
        Some("mcp__nanoclaw__send_message") None
        Some("Read") Some("8 /w/a.png")"#]]
    .assert_eq(&rendered.join("\n"));
}

#[test]
fn replay_usage() {
    check(
        "usage.jsonl",
        false,
        expect![[r#"
        emit Init { session_id: "9e9e9030ed87" }
        turn/start "run it"
        emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
        emit Activity { tool: None, summary: None }
        emit Activity { tool: Some("Bash"), summary: Some("echo hi") }
        emit ToolEnded { running: 0 }
        emit Output
        emit Text { text: "done" }
        emit Result { text: "done", covers: 0, usage: Some(Usage { input_tokens: Some(127), output_tokens: Some(39), cache_read_tokens: Some(264), cache_write_tokens: Some(0), reasoning_tokens: Some(11), cost_usd: None, model: Some("fake-model"), requests: Some(2) }) }
        -- control Some(End)
        close
        -- query closed
        -- process exited
    "#]],
    );
}

#[test]
fn replay_max_turns() {
    // Recorded with maxTurnsPerQuery = 2.
    expect![[r#"
        emit Init { session_id: "064343d00158" }
        turn/start "loop"
        emit Activity { tool: None, summary: None }
        emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
        emit Activity { tool: Some("Bash"), summary: Some("echo one") }
        emit ToolEnded { running: 0 }
        emit Activity { tool: Some("Bash"), summary: Some("echo two") }
        emit ToolEnded { running: 0 }
        turn/interrupt e5b04caa2d56
        emit Interrupted { covers: 0, usage: Some(Usage { input_tokens: Some(20), output_tokens: Some(10), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: Some("fake-model"), requests: Some(2) }), reason: MaxTurns }
        close
        -- query closed
        turn/start "again"
        emit Progress { message: "codex deprecationNotice: Full-history hydration is deprecated for paginated threads; omit `includeTurns` or set it to `false`, then page with `thread/turns/list` and `thread/items/list`." }
        emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
        emit Activity { tool: None, summary: None }
        emit Output
        emit Text { text: "next answer" }
        emit Result { text: "next answer", covers: 0, usage: Some(Usage { input_tokens: Some(10), output_tokens: Some(5), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: Some("fake-model"), requests: Some(1) }) }
        -- control Some(End)
        close
        -- query closed
        -- process exited
    "#]].assert_eq(&replay_with("max_turns.jsonl", false, Some(2)));
}

#[test]
fn replay_text_before_tool() {
    check(
        "text_before_tool.jsonl",
        false,
        expect![[r#"
        emit Init { session_id: "1855b8010a9f" }
        turn/start "deploy"
        emit Progress { message: "codex warning: Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." }
        emit Activity { tool: None, summary: None }
        emit Output
        emit Text { text: "<message to=\"ops\">deploying</message>" }
        emit Activity { tool: Some("Bash"), summary: Some("sleep 3") }
        emit ToolEnded { running: 0 }
        emit Text { text: "all done" }
        emit Result { text: "all done", covers: 0, usage: Some(Usage { input_tokens: Some(20), output_tokens: Some(10), cache_read_tokens: Some(0), cache_write_tokens: Some(0), reasoning_tokens: Some(0), cost_usd: None, model: Some("fake-model"), requests: Some(2) }) }
        -- control Some(End)
        close
        -- query closed
        -- process exited
    "#]],
    );
}

fn gated_state() -> QueryState {
    let rules = |list: &[&str]| {
        list.iter()
            .map(|r| provider::ToolRule::parse(r).unwrap())
            .collect()
    };
    let policy = ToolPolicy {
        deny: rules(&["Bash(rm *)"]),
        ask: rules(&["Bash", "Write"]),
        ..ToolPolicy::default()
    };
    QueryState::new(Prompt::text("one"), false).with_approvals(
        policy,
        ElicitationMode::Ask,
        vec!["mcp__nanoclaw__present_plan".into()],
    )
}

fn command_approval(id: i64, line: &str) -> Option<(RequestId, Value)> {
    Some((
        RequestId::Int(id),
        json!({ "threadId": "th", "turnId": "t1", "itemId": "c1", "command": line }),
    ))
}

/// A denied call is declined at once (and reported); an asked one waits for the runner's
/// answer, pauses the watchdog, and is answered as the runner says.
#[test]
fn approvals_are_judged_asked_and_answered() {
    let now = Instant::now();
    let method = "item/commandExecution/requestApproval";
    let mut s = gated_state();
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    log.extend(s.on_server_request(
        method,
        command_approval(6, "/bin/bash -lc 'rm -rf target'"),
        now,
    ));
    log.extend(s.on_server_request(method, command_approval(7, "/bin/bash -lc 'touch a'"), now));
    assert!(s.awaiting_approval());
    log.extend(s.on_control(
        Some(Control::Approval {
            id: "codex-7".into(),
            answer: ApprovalAnswer::Allow,
        }),
        now,
    ));
    assert!(!s.awaiting_approval());
    // A file change names its item only: the paths come from the item.
    log.extend(s.on_notification(
        "item/started",
        &item(
            "fileChange",
            "p1",
            json!({"changes": [{"path": "/w/new.txt", "kind": {"type": "add"}}]}),
        ),
        now,
    ));
    log.extend(s.on_server_request(
        "item/fileChange/requestApproval",
        Some((RequestId::Int(8), json!({ "itemId": "p1" }))),
        now,
    ));
    log.extend(s.on_control(
        Some(Control::Approval {
            id: "codex-8".into(),
            answer: ApprovalAnswer::Deny {
                reason: "denied by the user".into(),
            },
        }),
        now,
    ));
    // An elicitation with one choice, answered with the user's reply.
    log.extend(s.on_server_request(
        "mcpServer/elicitation/request",
        Some((
            RequestId::Str("e1".into()),
            json!({ "serverName": "forms", "message": "Color?", "_meta": null,
                    "requestedSchema": {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "blue"]}}} }),
        )),
        now,
    ));
    log.extend(s.on_control(
        Some(Control::Approval {
            id: "codex-\"e1\"".into(),
            answer: ApprovalAnswer::Reply("blue".into()),
        }),
        now,
    ));
    expect![[r#"
        turn/start "one"
        emit ToolDenied { tool: "Bash", summary: Some("rm -rf target") }
        respond Int(6) {"decision":"decline"}
        emit ApprovalRequest(ApprovalRequest { id: "codex-7", kind: ToolCall { tool: "Bash", summary: Some("touch a"), argument: Some("touch a"), undecidable: None } })
        respond Int(7) {"decision":"accept"}
        emit Activity { tool: Some("Write"), summary: Some("/w/new.txt") }
        emit ApprovalRequest(ApprovalRequest { id: "codex-8", kind: ToolCall { tool: "Write", summary: Some("/w/new.txt"), argument: Some("/w/new.txt"), undecidable: None } })
        respond Int(8) {"decision":"decline"}
        emit ApprovalRequest(ApprovalRequest { id: "codex-\"e1\"", kind: Elicitation { server: "forms", message: "Color?", options: ["red", "blue"] } })
        respond Str("e1") {"_meta":null,"action":"accept","content":{"color":"blue"}}
    "#]]
    .assert_eq(&render(&log));
}

/// Issue 41: under an `ask` rule only, a command that cannot be decided is asked with why; a
/// Deny (the user's or the timeout's) reaches the model as a developer note saying to write the
/// command literally, then the decline (which carries no reason). An approved one runs as is.
#[test]
fn an_undecidable_command_asked_and_refused_tells_the_model_why() {
    let now = Instant::now();
    let method = "item/commandExecution/requestApproval";
    let policy = ToolPolicy {
        ask: vec![provider::ToolRule::parse("Bash(rm *)").unwrap()],
        ..ToolPolicy::default()
    };
    let mut s = QueryState::new(Prompt::text("one"), false).with_approvals(
        policy,
        ElicitationMode::Decline,
        Vec::new(),
    );
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    let line = "/bin/bash -lc 'X=rm; $X -rf target'";
    log.extend(s.on_server_request(method, command_approval(7, line), now));
    log.extend(s.on_control(
        Some(Control::Approval {
            id: "codex-7".into(),
            answer: ApprovalAnswer::Deny {
                reason: "denied by the user".into(),
            },
        }),
        now,
    ));
    log.extend(s.on_server_request(method, command_approval(8, line), now));
    log.extend(s.on_control(
        Some(Control::Approval {
            id: "codex-8".into(),
            answer: ApprovalAnswer::Allow,
        }),
        now,
    ));
    log.extend(s.on_server_request(method, command_approval(9, "/bin/bash -lc 'ls'"), now));
    expect![[r#"
        turn/start "one"
        emit ApprovalRequest(ApprovalRequest { id: "codex-7", kind: ToolCall { tool: "Bash", summary: Some("X=rm; $X -rf target"), argument: Some("X=rm; $X -rf target"), undecidable: Some("the command could not be decided: the program name is not a literal ($X): write the command literally") } })
        note "denied by the user; the command could not be decided: the program name is not a literal ($X): write the command literally"
        respond Int(7) {"decision":"decline"}
        emit ApprovalRequest(ApprovalRequest { id: "codex-8", kind: ToolCall { tool: "Bash", summary: Some("X=rm; $X -rf target"), argument: Some("X=rm; $X -rf target"), undecidable: Some("the command could not be decided: the program name is not a literal ($X): write the command literally") } })
        respond Int(8) {"decision":"accept"}
        respond Int(9) {"decision":"accept"}
    "#]]
    .assert_eq(&render(&log));
}

/// An approval still open when the turn is stopped is declined before the interrupt; a request
/// arriving after the stop is declined at once.
#[test]
fn open_approvals_are_declined_when_the_turn_stops_or_the_query_closes() {
    let now = Instant::now();
    let method = "item/commandExecution/requestApproval";
    let mut s = gated_state();
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    log.extend(s.on_server_request(method, command_approval(7, "/bin/bash -lc 'touch a'"), now));
    log.extend(s.on_control(Some(Control::Interrupt), now));
    assert!(!s.awaiting_approval());
    log.extend(s.on_server_request(method, command_approval(9, "/bin/bash -lc 'touch b'"), now));
    log.extend(s.on_notification("turn/completed", &completed("t1", "interrupted"), now));
    expect![[r#"
        turn/start "one"
        emit ApprovalRequest(ApprovalRequest { id: "codex-7", kind: ToolCall { tool: "Bash", summary: Some("touch a"), argument: Some("touch a"), undecidable: None } })
        respond Int(7) {"decision":"decline"}
        turn/interrupt t1
        respond Int(9) {"decision":"decline"}
        emit Interrupted { covers: 0, usage: None, reason: Stopped }
        close
    "#]]
    .assert_eq(&render(&log));

    let mut s = gated_state();
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    log.extend(s.on_server_request(method, command_approval(7, "/bin/bash -lc 'touch a'"), now));
    log.extend(s.on_control(None, now));
    log.extend(s.on_notification("turn/completed", &completed("t1", "interrupted"), now));
    expect![[r#"
        turn/start "one"
        emit ApprovalRequest(ApprovalRequest { id: "codex-7", kind: ToolCall { tool: "Bash", summary: Some("touch a"), argument: Some("touch a"), undecidable: None } })
        respond Int(7) {"decision":"decline"}
        emit Error { message: "the turn was aborted", retryable: false, classification: Aborted, ends_turn: true, usage: None }
        turn/interrupt t1
        close
    "#]]
    .assert_eq(&render(&log));
}

/// The result of an approval-stop tool interrupts the turn; its completion ends the query with
/// `Interrupted(ApprovalStop)` after a note that carries the real result. A failed call or
/// another tool does not stop.
#[test]
fn approval_stop_tool_result_ends_the_turn() {
    let now = Instant::now();
    let mut s = gated_state();
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    for (id, tool, status) in [
        ("c1", "send_message", "completed"),
        ("c2", "present_plan", "failed"),
        ("c3", "present_plan", "completed"),
    ] {
        log.extend(s.on_notification(
            "item/started",
            &item(
                "mcpToolCall",
                id,
                json!({"server": "nanoclaw", "tool": tool}),
            ),
            now,
        ));
        log.extend(s.on_notification(
            "item/completed",
            &item(
                "mcpToolCall",
                id,
                json!({"server": "nanoclaw", "tool": tool, "status": status,
                       "result": {"content": [{"type": "text", "text": "plan shown"}]}}),
            ),
            now,
        ));
    }
    log.extend(s.on_notification("turn/completed", &completed("t1", "interrupted"), now));
    expect![[r#"
        turn/start "one"
        emit Activity { tool: Some("mcp__nanoclaw__send_message"), summary: None }
        emit ToolEnded { running: 0 }
        emit Activity { tool: Some("mcp__nanoclaw__present_plan"), summary: None }
        emit ToolEnded { running: 0 }
        emit Activity { tool: Some("mcp__nanoclaw__present_plan"), summary: None }
        emit ToolEnded { running: 0 }
        turn/interrupt t1
        note "The call c3 of mcp__nanoclaw__present_plan completed and the turn was then ended for the user's review (Codex records the call as aborted; it was not). Its result: plan shown"
        emit Interrupted { covers: 0, usage: None, reason: ApprovalStop }
        close
    "#]]
    .assert_eq(&render(&log));
}

/// Our approval-stop hook starting (Codex holds the turn for it) stops the turn even when no
/// `completed` stop-tool item came first; another hook does not.
#[test]
fn approval_stop_hook_start_ends_the_turn() {
    let now = Instant::now();
    let mut s = gated_state();
    let mut log = s.begin();
    log.extend(s.on_turn_started("t1".into(), now));
    let hook = |status: &str| {
        json!({"threadId": "th", "turnId": "t1", "run": {"eventName": "postToolUse",
               "statusMessage": status, "status": "running"}})
    };
    log.extend(s.on_notification("hook/started", &hook("someone else's"), now));
    log.extend(s.on_notification("hook/started", &hook(APPROVAL_STOP_HOOK_STATUS), now));
    log.extend(s.on_notification("turn/completed", &completed("t1", "interrupted"), now));
    expect![[r#"
        turn/start "one"
        emit Activity { tool: None, summary: None }
        turn/interrupt t1
        emit Interrupted { covers: 0, usage: None, reason: ApprovalStop }
        close
    "#]]
    .assert_eq(&render(&log));
}
