//! Replays recorded OpenCode sessions (`provider/tests/fixtures/opencode/*.jsonl`, captured
//! from the real CLI against the fake model server) through [`Turn`] and snapshots the
//! translated events.

use std::path::PathBuf;

use expect_test::{expect, Expect};
use serde_json::Value;

use super::protocol::{Event, MessageWithParts};
use super::translate::{Output, Turn};
use crate::ProviderEvent;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/opencode")
        .join(format!("{name}.jsonl"))
}

/// Replays a recording: `query` starts a new [`Turn`], `post` registers a posted message,
/// `in` feeds an SSE payload, `aborting` and `messages` (a reconciliation read) do what the
/// driver did; `push`, `end` and `abort` are the runner's controls. Returns one line per
/// control and per translated output.
fn replay(name: &str) -> String {
    let text = std::fs::read_to_string(fixture(name))
        .unwrap_or_else(|err| panic!("{}: {err}", fixture(name).display()));
    let mut turn: Option<Turn> = None;
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let record: Value =
            serde_json::from_str(line).unwrap_or_else(|err| panic!("{name}:{}: {err}", number + 1));
        let (kind, value) = record
            .as_object()
            .and_then(|o| o.iter().next())
            .map(|(k, v)| (k.as_str(), v.clone()))
            .unwrap();
        match kind {
            "query" => {
                let session = value["session"].as_str().unwrap();
                let retries = value["max_retries"].as_u64().unwrap() as u32;
                turn = Some(Turn::new(session, retries));
                out.push("-- query".to_owned());
            }
            "post" => {
                let prompts: Vec<u64> = serde_json::from_value(value["prompts"].clone()).unwrap();
                let id = value["message_id"].as_str().unwrap();
                turn.as_mut()
                    .unwrap()
                    .posted(id, *prompts.iter().max().unwrap());
                out.push(format!("-- post {prompts:?}"));
            }
            "in" => {
                let event = Event::parse(&value.to_string()).unwrap();
                for output in turn.as_mut().unwrap().handle(&event) {
                    out.push(show(&output));
                }
            }
            "aborting" => turn
                .as_mut()
                .unwrap()
                .set_aborting(value.as_bool().unwrap()),
            "messages" => {
                let messages: Vec<MessageWithParts> = serde_json::from_value(value).unwrap();
                out.push("-- reconcile".to_owned());
                for output in turn.as_mut().unwrap().reconcile(&messages) {
                    out.push(show(&output));
                }
            }
            "push" | "end" | "abort" => out.push(format!("-- {kind}")),
            other => panic!("{name}:{}: unknown record {other}", number + 1),
        }
    }
    // Consecutive identical lines (activity while streaming, idles) are counted, not repeated.
    let mut lines: Vec<(String, usize)> = Vec::new();
    for line in out {
        match lines.last_mut() {
            Some((last, count)) if *last == line => *count += 1,
            _ => lines.push((line, 1)),
        }
    }
    lines
        .into_iter()
        .map(|(line, count)| {
            if count > 1 {
                format!("{line} x{count}\n")
            } else {
                format!("{line}\n")
            }
        })
        .collect()
}

fn show(output: &Output) -> String {
    match output {
        Output::Event(ProviderEvent::Activity { tool, .. }) => format!("activity {tool:?}"),
        Output::Event(event) => format!("{event:?}"),
        other => format!("{other:?}"),
    }
}

fn check(name: &str, expect: Expect) {
    expect.assert_eq(&replay(name));
}

#[test]
fn text_reply() {
    check(
        "text_reply",
        expect![[r#"
            -- query
            -- post [0]
            activity None
            Output x5
            Result { text: "hello from the fake model", covers: 0 }
            Idle x2
            -- end
            -- query
            -- post [0]
            activity None
            Output x3
            Result { text: "second answer", covers: 0 }
            Idle x2
            -- end
            -- query
            -- post [0]
            activity None
            activity Some("nanoclaw_send_message")
            ToolEnded { running: 0 }
            activity None
            Output x3
            Result { text: "done", covers: 0 }
            Idle x2
            -- end
        "#]],
    );
}

#[test]
fn push_restart() {
    check(
        "push_restart",
        expect![[r#"
            -- query
            -- post [0]
            -- push
            activity None
            Idle x4
            -- post [1]
            activity None
            Output x3
            Result { text: "answer to both", covers: 1 }
            Idle x2
            -- end
            -- query
            -- post [0]
            -- abort
            activity None
            Idle x4
            -- query
            -- post [0]
            activity None
            Output x3
            Result { text: "after the abort", covers: 0 }
            Idle x2
            -- end
        "#]],
    );
}

#[test]
fn push_during_tool() {
    check(
        "push_during_tool",
        expect![[r#"
            -- query
            -- post [0]
            activity None
            activity Some("nanoclaw_ask_user_question")
            -- push
            -- post [1]
            ToolEnded { running: 0 }
            activity None
            Output x3
            Result { text: "deploying, and noted", covers: 1 }
            Idle x2
            -- end
        "#]],
    );
}

#[test]
fn resume() {
    check(
        "resume",
        expect![[r#"
            -- query
            -- post [0]
            activity None
            Output x3
            Result { text: "second answer", covers: 0 }
            Idle x2
            -- end
            -- query
            -- post [0]
            activity None
            Output x3
            Result { text: "third answer", covers: 0 }
            Idle x2
            -- end
            -- query
            -- post [0]
            activity None
            Output x3
            Result { text: "fresh answer", covers: 0 }
            Idle x2
            -- end
            -- query
            -- post [0]
            activity None
            Output x3
            Result { text: "fresh again", covers: 0 }
            Idle x2
            -- end
        "#]],
    );
}

#[test]
fn api_errors() {
    check(
        "api_errors",
        expect![[r#"
            -- query
            -- post [0]
            Error { message: "OpenCode retries the model API (retry 1): fake 500 error", retryable: true, classification: Api, ends_turn: false }
            AbortSession
            Error { message: "model API error after 1 retries: fake 500 error", retryable: false, classification: Api, ends_turn: true }
            Idle x2
            -- query
            -- post [0]
            Error { message: "OpenCode retries the model API (retry 1): fake 429 error", retryable: true, classification: RateLimited { retry_after_secs: None }, ends_turn: false }
            AbortSession
            Error { message: "model API error after 1 retries: fake 429 error", retryable: true, classification: RateLimited { retry_after_secs: None }, ends_turn: true }
            Idle x2
            -- query
            -- post [0]
            Error { message: "APIError 401: fake 401 error", retryable: false, classification: Auth, ends_turn: true }
            Idle x4
            -- query
            -- post [0]
            activity None
            Error { message: "OpenCode retries the model API (retry 1): Connection reset by server", retryable: true, classification: Api, ends_turn: false }
            activity None
            AbortSession
            Error { message: "model API error after 1 retries: Connection reset by server", retryable: false, classification: Api, ends_turn: true }
            Idle x2
            -- query
            -- post [0]
            activity None
            Output x3
            Result { text: "recovered", covers: 0 }
            Idle x2
            -- end
        "#]],
    );
}

#[test]
fn killed_server() {
    check(
        "killed_server",
        expect![[r#"
            -- query
            -- post [0]
            activity None
            Output x3
            Result { text: "before the crash", covers: 0 }
            Idle x2
            -- end
            -- query
            -- post [0]
            -- query
            -- post [0]
            activity None
            Output x3
            Result { text: "after the crash", covers: 0 }
            Idle x2
            -- end
        "#]],
    );
}

#[test]
fn watchdog() {
    check(
        "watchdog",
        expect![[r#"
            -- query
            -- post [0]
            activity None
            -- query
            -- post [0]
            activity None
            Output x3
            Result { text: "alive again", covers: 0 }
            Idle x2
            -- end
        "#]],
    );
}

#[test]
fn agent_shell() {
    check(
        "agent_shell",
        expect![[r#"
            -- query
            -- post [0]
            activity None
            activity Some("bash")
            ToolEnded { running: 0 }
            activity None
            Output x3
            Result { text: "env shown", covers: 0 }
            Idle x2
            -- end
            -- query
            -- post [0]
            activity None
            activity Some("bash")
        "#]],
    );
}

// ---------------------------------------------------------------------------------------------
// Orderings the captures above do not pin down, written in the shapes OpenCode 1.18.33 sends.
// ---------------------------------------------------------------------------------------------

const SES: &str = "ses_test";

fn assistant(id: &str, parent: &str, finish: Option<&str>, completed: bool) -> Event {
    let mut info = serde_json::json!({
        "id": id, "role": "assistant", "sessionID": SES, "parentID": parent,
        "time": {"created": 1},
    });
    if let Some(finish) = finish {
        info["finish"] = finish.into();
    }
    if completed {
        info["time"]["completed"] = 2.into();
    }
    Event::parse(&serde_json::json!({"type": "message.updated", "properties": {"sessionID": SES, "info": info}}).to_string()).unwrap()
}

fn text_part(message: &str, part: &str, text: &str) -> Event {
    Event::parse(&serde_json::json!({"type": "message.part.updated", "properties": {"sessionID": SES,
        "part": {"id": part, "messageID": message, "sessionID": SES, "type": "text", "text": text}}}).to_string()).unwrap()
}

fn tool_part(message: &str, part: &str, status: &str) -> Event {
    Event::parse(&serde_json::json!({"type": "message.part.updated", "properties": {"sessionID": SES,
        "part": {"id": part, "messageID": message, "sessionID": SES, "type": "tool",
                 "tool": "nanoclaw_ask_user_question", "callID": "call_1", "state": {"status": status}}}}).to_string()).unwrap()
}

fn idle() -> Event {
    Event::parse(
        &serde_json::json!({"type": "session.idle", "properties": {"sessionID": SES}}).to_string(),
    )
    .unwrap()
}

fn aborted_error() -> Event {
    Event::parse(
        &serde_json::json!({"type": "session.error", "properties": {"sessionID": SES,
        "error": {"name": "MessageAbortedError", "data": {"message": "Aborted"}}}})
        .to_string(),
    )
    .unwrap()
}

fn run(turn: &mut Turn, events: &[Event]) -> String {
    events
        .iter()
        .flat_map(|event| turn.handle(event))
        .map(|output| show(&output) + "\n")
        .collect()
}

/// A fast model: the step's `message.updated` already shows it finished before the text part
/// events arrive; the result waits for the idle and has the whole text.
#[test]
fn result_waits_for_the_idle_and_its_text() {
    let mut turn = Turn::new(SES, 2);
    turn.posted("msg_u0", 0);
    let out = run(
        &mut turn,
        &[
            assistant("msg_a0", "msg_u0", Some("stop"), true),
            text_part("msg_a0", "prt_1", ""),
            text_part("msg_a0", "prt_1", "recovered"),
            idle(),
        ],
    );
    expect![[r#"
        Output
        Output
        Result { text: "recovered", covers: 0 }
        Idle
    "#]]
    .assert_eq(&out);
    assert!(turn.all_covered());
}

/// A follow-up queued while the loop was finishing: OpenCode answers the first message and
/// then the follow-up in the same loop; both answers are results, in order.
#[test]
fn two_answers_in_one_loop_are_two_results() {
    let mut turn = Turn::new(SES, 2);
    turn.posted("msg_u0", 0);
    turn.posted("msg_u1", 1);
    let out = run(
        &mut turn,
        &[
            assistant("msg_a0", "msg_u0", None, false),
            text_part("msg_a0", "prt_1", "first answer"),
            assistant("msg_a0", "msg_u0", Some("stop"), true),
            assistant("msg_a1", "msg_u1", None, false),
            text_part("msg_a1", "prt_2", "second answer"),
            assistant("msg_a1", "msg_u1", Some("stop"), true),
            idle(),
        ],
    );
    expect![[r#"
        Output
        Output
        Result { text: "first answer", covers: 0 }
        Result { text: "second answer", covers: 1 }
        Idle
    "#]]
    .assert_eq(&out);
}

/// A follow-up queued into a running tool call moves `parentID` forward: the final answer
/// covers both prompts; the tool counts as running until its part completes.
#[test]
fn queued_follow_up_is_covered_by_the_final_answer() {
    let mut turn = Turn::new(SES, 2);
    turn.posted("msg_u0", 0);
    run(
        &mut turn,
        &[
            assistant("msg_a0", "msg_u0", None, false),
            tool_part("msg_a0", "prt_t", "running"),
        ],
    );
    assert!(turn.tool_running());
    turn.posted("msg_u1", 1);
    let out = run(
        &mut turn,
        &[
            tool_part("msg_a0", "prt_t", "completed"),
            assistant("msg_a0", "msg_u0", Some("tool-calls"), true),
            idle(),
            assistant("msg_a1", "msg_u1", None, false),
            text_part("msg_a1", "prt_2", "both done"),
            assistant("msg_a1", "msg_u1", Some("stop"), true),
            idle(),
        ],
    );
    assert!(!turn.tool_running());
    expect![[r#"
        ToolEnded { running: 0 }
        Idle
        Output
        Result { text: "both done", covers: 1 }
        Idle
    "#]]
    .assert_eq(&out);
}

/// Our own abort (restart with a follow-up): its `MessageAbortedError`s are ignored, also a
/// late one after the restart was posted, until OpenCode answers the restart.
#[test]
fn our_abort_is_not_an_error() {
    let mut turn = Turn::new(SES, 2);
    turn.posted("msg_u0", 0);
    run(&mut turn, &[assistant("msg_a0", "msg_u0", None, false)]);
    turn.set_aborting(true);
    let mut aborted = assistant("msg_a0", "msg_u0", None, true);
    if let Event::MessageUpdated(info) = &mut aborted {
        info.error = Some(super::protocol::ErrorInfo {
            name: "MessageAbortedError".into(),
            ..Default::default()
        });
    }
    let out = run(&mut turn, &[aborted_error(), idle(), aborted.clone()]);
    turn.set_aborting(false);
    turn.posted("msg_u1", 1);
    let late = run(&mut turn, &[aborted.clone(), aborted_error(), idle()]);
    assert!(!turn.failed(), "{out}{late}");
    // Once OpenCode works on the restart, an abort is someone else's: an error.
    let out = run(
        &mut turn,
        &[assistant("msg_a1", "msg_u1", None, false), aborted_error()],
    );
    expect![[r#"
        Error { message: "the OpenCode turn was aborted", retryable: true, classification: Other, ends_turn: true }
    "#]]
    .assert_eq(&out);
}

/// Events of other sessions are ignored.
#[test]
fn other_sessions_are_ignored() {
    let mut turn = Turn::new("ses_other", 2);
    turn.posted("msg_u0", 0);
    let out = run(
        &mut turn,
        &[assistant("msg_a0", "msg_u0", Some("stop"), true), idle()],
    );
    assert_eq!(out, "");
}
