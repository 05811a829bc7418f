//! Replays recorded OpenCode sessions (`drivers/opencode/tests/fixtures/opencode/*.jsonl`, captured
//! from the real CLI against the fake model server) through [`Turn`] and snapshots the
//! translated events.

use std::path::PathBuf;

use expect_test::{expect, Expect};
use serde_json::Value;

use super::{Output, Turn};
use crate::protocol::{Event, MessageWithParts};
use provider::ProviderEvent;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/opencode")
        .join(format!("{name}.jsonl"))
}

/// Replays a recording: `query` starts a new [`Turn`] (with its max-turns limit), `post`
/// registers a posted message, `in` feeds an SSE payload, `aborting` and `messages` (a
/// reconciliation read) do what the driver did; `push`, `end`, `abort` and `interrupt` are the
/// runner's controls. Returns one line per
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
                let mut new_turn = Turn::new(session, retries);
                new_turn.set_max_turns(value["max_turns"].as_u64().map(|max| max as u32));
                let stops: Vec<String> =
                    serde_json::from_value(value["approval_stops"].clone()).unwrap_or_default();
                new_turn.set_approval_stops(&stops);
                turn = Some(new_turn);
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
            "push" | "end" | "abort" | "interrupt" | "approval" => out.push(format!("-- {kind}")),
            // The driver's answer to a `permission.asked` (its id differs per capture).
            "permission_reply" => out.push(format!("-- reply {}", value["reply"])),
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
        Output::Event(ProviderEvent::Activity { tool, summary }) => match summary {
            Some(summary) => format!("activity {tool:?} {summary:?}"),
            None => format!("activity {tool:?}"),
        },
        Output::Event(ProviderEvent::Result {
            text,
            covers,
            usage,
        }) => format!("Result {{ text: {text:?}, covers: {covers} }}{}", usage_text(usage)),
        Output::Event(ProviderEvent::Error {
            message,
            retryable,
            classification,
            ends_turn,
            usage,
        }) => format!(
            "Error {{ message: {message:?}, retryable: {retryable}, classification: {classification:?}, ends_turn: {ends_turn} }}{}",
            usage_text(usage)
        ),
        Output::Event(event) => format!("{event:?}"),
        Output::Permission { asked, part } => format!(
            "permission.asked {} {:?} call={:?}",
            asked.permission,
            asked.metadata,
            part.as_ref().map(|(tool, input)| format!("{tool} {input}"))
        ),
        other => format!("{other:?}"),
    }
}

/// ` usage[in out cache-read cache-write reasoning $cost model requests]`, `-` for unknown.
fn usage_text(usage: &Option<provider::Usage>) -> String {
    let Some(u) = usage else {
        return String::new();
    };
    let n = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    format!(
        " usage[in={} out={} cr={} cw={} rs={} cost={} model={} req={}]",
        n(u.input_tokens),
        n(u.output_tokens),
        n(u.cache_read_tokens),
        n(u.cache_write_tokens),
        n(u.reasoning_tokens),
        u.cost_usd.map_or("-".to_owned(), |c| c.to_string()),
        u.model.as_deref().unwrap_or("-"),
        n(u.requests)
    )
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
            Text { text: "hello from the fake model" }
            Result { text: "hello from the fake model", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
            Idle x2
            -- end
            -- query
            -- post [0]
            activity None
            Output x3
            Text { text: "second answer" }
            Result { text: "second answer", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
            Idle
            -- end
            -- query
            -- post [0]
            activity None
            Output
            activity Some("mcp__nanoclaw__send_message")
            ToolEnded { running: 0 }
            activity None
            Output x3
            Text { text: "done" }
            Result { text: "done", covers: 0 } usage[in=20 out=10 cr=0 cw=0 rs=0 cost=- model=fake-model req=2]
            Idle
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
            Text { text: "answer to both" }
            Result { text: "answer to both", covers: 1 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
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
            Text { text: "after the abort" }
            Result { text: "after the abort", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
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
            Output
            activity Some("mcp__nanoclaw__ask_user_question")
            -- push
            -- post [1]
            ToolEnded { running: 0 }
            activity None
            Output x3
            Text { text: "deploying, and noted" }
            Result { text: "deploying, and noted", covers: 1 } usage[in=20 out=10 cr=0 cw=0 rs=0 cost=- model=fake-model req=2]
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
            Text { text: "second answer" }
            Result { text: "second answer", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
            Idle x2
            -- end
            -- query
            -- post [0]
            activity None
            Output x3
            Text { text: "third answer" }
            Result { text: "third answer", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
            Idle x2
            -- end
            -- query
            -- post [0]
            activity None
            Output x3
            Text { text: "fresh answer" }
            Result { text: "fresh answer", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
            Idle x2
            -- end
            -- query
            -- post [0]
            activity None
            Output x3
            Text { text: "fresh again" }
            Result { text: "fresh again", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
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
            Text { text: "recovered" }
            Result { text: "recovered", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
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
            Text { text: "before the crash" }
            Result { text: "before the crash", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
            Idle x2
            -- end
            -- query
            -- post [0]
            -- query
            -- post [0]
            activity None
            Output x3
            Text { text: "after the crash" }
            Result { text: "after the crash", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
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
            Text { text: "alive again" }
            Result { text: "alive again", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
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
            Output
            activity Some("Bash") "env"
            ToolEnded { running: 0 }
            activity None
            Output x3
            Text { text: "env shown" }
            Result { text: "env shown", covers: 0 } usage[in=20 out=10 cr=0 cw=0 rs=0 cost=- model=fake-model req=2]
            Idle x2
            -- end
            -- query
            -- post [0]
            activity None
            Output
            activity Some("Bash") "sleep 471; echo late"
        "#]],
    );
}

/// Usage summed per turn (two requests: the reply's text and tool call, then the final line);
/// the text before the tool call is a `Text` before the tool's `Activity`, though OpenCode ends
/// that text part only after the tool started (its text is known from the deltas).
#[test]
fn usage_and_text() {
    check(
        "usage_text",
        expect![[r#"
        -- query
        -- post [0]
        activity None
        Output x3
        Text { text: "one step" }
        Result { text: "one step", covers: 0 } usage[in=1000 out=50 cr=200 cw=0 rs=20 cost=- model=fake-model req=1]
        Idle x2
        -- end
        -- query
        -- post [0]
        activity None
        Output x3
        Text { text: "<message to=\"ops\">deploying</message>" }
        activity Some("Bash") "sleep 3; echo slept"
        Output
        ToolEnded { running: 0 }
        activity None
        Output x3
        Text { text: "final line" }
        Result { text: "final line", covers: 0 } usage[in=1300 out=57 cr=200 cw=0 rs=20 cost=- model=fake-model req=2]
        Idle x2
        -- end
    "#]],
    );
}

/// An interrupt while the model stalls; a turn stopped by `maxTurnsPerQuery` 1 after its tool
/// call (the abort is the driver's); the session goes on.
#[test]
fn interrupt() {
    check(
        "interrupt",
        expect![[r#"
        -- query
        -- post [0]
        activity None
        Output x3
        Text { text: "warm" }
        Result { text: "warm", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
        Idle x2
        -- end
        -- query
        -- post [0]
        -- interrupt
        activity None
        Idle x4
        -- query
        -- post [0]
        activity None
        Output x3
        Text { text: "after the stop" }
        Result { text: "after the stop", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
        Idle x2
        -- end
        -- query
        -- post [0]
        activity None
        Output
        activity Some("Bash") "echo hi"
        ToolEnded { running: 0 }
        MaxTurns
        Idle x2
        -- query
        -- post [0]
        activity None
        Output x3
        Text { text: "after max turns" }
        Result { text: "after max turns", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
        Idle
        -- end
    "#]],
    );
}

/// A query on another model (its `modelID` in the usage), one on a model the API refuses.
#[test]
fn model_per_query() {
    check(
        "model_per_query",
        expect![[r#"
        -- query
        -- post [0]
        activity None
        Output x3
        Text { text: "large answer" }
        Result { text: "large answer", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model-large req=1]
        Idle
        -- end
        -- query
        -- post [0]
        Error { message: "APIError 404: The model `no-such-model` does not exist", retryable: false, classification: Api, ends_turn: true }
        Idle x4
        -- query
        -- post [0]
        activity None
        Output x3
        Text { text: "default answer" }
        Result { text: "default answer", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
        Idle x2
        -- end
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
        Text { text: "recovered" }
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
        Text { text: "first answer" }
        Result { text: "first answer", covers: 0 }
        Text { text: "second answer" }
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
        Text { text: "both done" }
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
        info.error = Some(crate::protocol::ErrorInfo {
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

/// A turn on [`SES`] whose first prompt was posted as `msg_u0`.
fn posted_turn() -> Turn {
    let mut turn = Turn::new(SES, 2);
    turn.posted("msg_u0", 0);
    turn
}

fn part_event(part: serde_json::Value) -> Event {
    let mut part = part;
    part["sessionID"] = SES.into();
    Event::parse(
        &serde_json::json!({"type": "message.part.updated", "properties": {"sessionID": SES, "part": part}})
            .to_string(),
    )
    .unwrap()
}

/// A `step-finish` part in OpenCode 1.18.33's shape.
fn step_finish(message: &str, part: &str, reason: &str, tokens: [u64; 5], cost: f64) -> Event {
    let [input, output, reasoning, read, write] = tokens;
    part_event(
        serde_json::json!({"id": part, "messageID": message, "type": "step-finish",
        "reason": reason, "cost": cost,
        "tokens": {"input": input, "output": output, "reasoning": reasoning,
                   "cache": {"read": read, "write": write}, "total": input + output}}),
    )
}

fn assistant_of(id: &str, parent: &str, model: &str, finish: Option<&str>) -> Event {
    let mut event = assistant(id, parent, finish, finish.is_some());
    if let Event::MessageUpdated(info) = &mut event {
        info.extra.insert("modelID".into(), model.into());
    }
    event
}

/// Each `step-finish` counts once (SSE repeats part updates); a turn's steps add up (reasoning
/// is part of output, as the APIs count it); OpenCode's cost of 0 (no prices) is unknown, a
/// priced step's cost is kept; the model is the answer's `modelID`.
#[test]
fn usage_sums_each_step_once() {
    let mut turn = posted_turn();
    let first = step_finish("msg_a0", "prt_s0", "tool-calls", [100, 7, 3, 40, 2], 0.0);
    let out = run(
        &mut turn,
        &[
            assistant_of("msg_a0", "msg_u0", "fake-model", None),
            first.clone(),
            first,
            assistant_of("msg_a0", "msg_u0", "fake-model", Some("tool-calls")),
            assistant_of("msg_a1", "msg_u0", "other-model", None),
            step_finish("msg_a1", "prt_s1", "stop", [20, 5, 0, 60, 0], 0.25),
            assistant_of("msg_a1", "msg_u0", "other-model", Some("stop")),
            idle(),
        ],
    );
    expect![[r#"
        Result { text: "", covers: 0 } usage[in=120 out=15 cr=100 cw=2 rs=3 cost=0.25 model=other-model req=2]
        Idle
    "#]]
    .assert_eq(&out);
    // Nothing is left for an error or interruption of the same query.
    assert_eq!(turn.take_usage(), None);

    // Zero cost everywhere: unknown, not free.
    let mut turn = posted_turn();
    run(
        &mut turn,
        &[
            assistant_of("msg_a0", "msg_u0", "fake-model", None),
            step_finish("msg_a0", "prt_s0", "stop", [10, 5, 0, 0, 0], 0.0),
        ],
    );
    let usage = turn.take_usage().unwrap();
    assert_eq!(usage.cost_usd, None);
    assert_eq!(usage.requests, Some(1));
}

/// A turn that fails carries the usage of the steps it made.
#[test]
fn an_error_carries_the_usage_so_far() {
    let mut turn = posted_turn();
    let error = Event::parse(
        &serde_json::json!({"type": "session.error", "properties": {"sessionID": SES,
        "error": {"name": "APIError", "data": {"message": "fake 400 error", "statusCode": 400}}}})
        .to_string(),
    )
    .unwrap();
    let out = run(
        &mut turn,
        &[
            assistant_of("msg_a0", "msg_u0", "fake-model", None),
            step_finish("msg_a0", "prt_s0", "tool-calls", [10, 5, 0, 0, 0], 0.0),
            error,
        ],
    );
    expect![[r#"
        Error { message: "APIError 400: fake 400 error", retryable: false, classification: Api, ends_turn: true } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
    "#]]
    .assert_eq(&out);
}

/// A finished text part is `Text` at once, before the tool call that follows; a text part
/// without `time.end` (its text known from the deltas only, as OpenCode sends it) is complete
/// when a tool call of its message runs. Each once, also when the final result repeats it. The
/// tool is announced with its canonical name and summary once its arguments are known (not
/// while `pending`).
#[test]
fn text_goes_out_before_the_tool_call() {
    let mut turn = posted_turn();
    let text = |part: &str, text: &str, ended: bool| {
        let mut value = serde_json::json!({"id": part, "messageID": "msg_a0", "type": "text",
            "text": text, "time": {"start": 1}});
        if ended {
            value["time"]["end"] = 2.into();
        }
        part_event(value)
    };
    let bash = |status: &str, input: serde_json::Value| {
        part_event(
            serde_json::json!({"id": "prt_t", "messageID": "msg_a0", "type": "tool",
            "tool": "bash", "callID": "call_1", "state": {"status": status, "input": input}}),
        )
    };
    let long = format!("echo {}\nsecond line", "é".repeat(200));
    let out = run(
        &mut turn,
        &[
            assistant_of("msg_a0", "msg_u0", "fake-model", None),
            text("prt_1", "", false),
            text("prt_1", "<message to=\"ops\">deploying</message>", true),
            text("prt_1", "<message to=\"ops\">deploying</message>", true),
            text("prt_2", "", false),
            Event::parse(
                &serde_json::json!({"type": "message.part.delta", "properties": {
                "sessionID": SES, "messageID": "msg_a0", "partID": "prt_2", "field": "text",
                "delta": "more"}})
                .to_string(),
            )
            .unwrap(),
            bash("pending", serde_json::json!({})),
            bash("running", serde_json::json!({"command": long})),
            bash("completed", serde_json::json!({"command": long})),
            assistant_of("msg_a0", "msg_u0", "fake-model", Some("stop")),
            idle(),
        ],
    );
    let summary = format!("echo {}…", "é".repeat(114));
    let expected = format!(
        "Output\nOutput\nText {{ text: \"<message to=\\\"ops\\\">deploying</message>\" }}\nOutput\nOutput\n\
         Output\nOutput\nText {{ text: \"more\" }}\nactivity Some(\"Bash\") {summary:?}\nToolEnded {{ running: 0 }}\n\
         Result {{ text: \"<message to=\\\"ops\\\">deploying</message>\\nmore\", covers: 0 }}\nIdle\n"
    );
    assert_eq!(out, expected);
    assert_eq!(summary.chars().count(), 120);
}

/// OpenCode's tool names in the canonical vocabulary, with what each call works on.
#[test]
fn tool_names_are_canonical() {
    let mut turn = Turn::new(SES, 2);
    turn.add_mcp_servers(&["search".to_owned(), "nanoclaw_extra".to_owned()]);
    turn.posted("msg_u0", 0);
    let mut events = vec![assistant_of("msg_a0", "msg_u0", "fake-model", None)];
    let calls = [
        ("read", serde_json::json!({"filePath": "/w/a.rs"})),
        (
            "write",
            serde_json::json!({"filePath": "/w/b.rs", "content": "x"}),
        ),
        ("edit", serde_json::json!({"filePath": "/w/c.rs"})),
        ("glob", serde_json::json!({"pattern": "**/*.rs"})),
        ("grep", serde_json::json!({"pattern": "fn main"})),
        (
            "webfetch",
            serde_json::json!({"url": "https://example.com"}),
        ),
        ("websearch", serde_json::json!({"query": "rust sqlite"})),
        ("nanoclaw_send_message", serde_json::json!({"text": "hi"})),
        ("nanoclaw_extra_lookup", serde_json::json!({})),
        ("search_find", serde_json::json!({})),
        ("todowrite", serde_json::json!({})),
    ];
    for (n, (tool, input)) in calls.iter().enumerate() {
        events.push(part_event(
            serde_json::json!({"id": format!("prt_{n}"), "messageID": "msg_a0",
            "type": "tool", "tool": tool, "callID": format!("call_{n}"),
            "state": {"status": "running", "input": input}}),
        ));
    }
    let out = run(&mut turn, &events);
    expect![[r#"
        activity Some("Read") "/w/a.rs"
        activity Some("Write") "/w/b.rs"
        activity Some("Edit") "/w/c.rs"
        activity Some("Glob") "**/*.rs"
        activity Some("Grep") "fn main"
        activity Some("WebFetch") "https://example.com"
        activity Some("WebSearch") "rust sqlite"
        activity Some("mcp__nanoclaw__send_message")
        activity Some("mcp__nanoclaw_extra__lookup")
        activity Some("mcp__search__find")
        activity Some("todowrite")
    "#]]
    .assert_eq(&out);
}

/// `maxTurnsPerQuery`: the step that reaches the limit and ends in tool calls asks the driver to
/// stop the turn (once, a repeated part update does not count again); a step that ends the turn
/// does not; the steps of an answered turn do not count for the next one.
#[test]
fn max_turns_stops_a_turn_that_goes_on() {
    let mut turn = posted_turn();
    turn.set_max_turns(Some(2));
    let first = step_finish("msg_a0", "prt_s0", "tool-calls", [10, 5, 0, 0, 0], 0.0);
    let out = run(
        &mut turn,
        &[
            assistant_of("msg_a0", "msg_u0", "fake-model", None),
            first.clone(),
            first,
            assistant_of("msg_a1", "msg_u0", "fake-model", None),
            step_finish("msg_a1", "prt_s1", "tool-calls", [10, 5, 0, 0, 0], 0.0),
            step_finish("msg_a1", "prt_s1", "tool-calls", [10, 5, 0, 0, 0], 0.0),
        ],
    );
    expect![[r#"
        MaxTurns
    "#]]
    .assert_eq(&out);
    // The model saw the first prompt, not a follow-up queued after it.
    turn.posted("msg_u1", 1);
    assert_eq!(turn.seen(), 0);
    let usage = turn.take_usage().unwrap();
    assert_eq!((usage.input_tokens, usage.requests), (Some(20), Some(2)));

    // Two steps, the second one ends the turn: no interruption.
    let mut turn = posted_turn();
    turn.set_max_turns(Some(2));
    let out = run(
        &mut turn,
        &[
            assistant_of("msg_a0", "msg_u0", "fake-model", None),
            step_finish("msg_a0", "prt_s0", "tool-calls", [10, 5, 0, 0, 0], 0.0),
            assistant_of("msg_a1", "msg_u0", "fake-model", None),
            step_finish("msg_a1", "prt_s1", "stop", [10, 5, 0, 0, 0], 0.0),
            assistant_of("msg_a1", "msg_u0", "fake-model", Some("stop")),
            idle(),
        ],
    );
    assert!(!out.contains("MaxTurns"), "{out}");
}

/// `deny: ["Bash(rm *)", "Read(*secret*)"]`, `ask: ["Bash(touch *)"]`: OpenCode's config refuses
/// `rm` itself (`ToolDenied` from the call's error); the read comes as `permission.asked` with the
/// call's input and is rejected with the policy's message; the asked `touch` is answered once
/// after the runner's approval, then rejected with the user's reason.
#[test]
fn tool_policy() {
    check(
        "tool_policy",
        expect![[r#"
            -- query
            -- post [0]
            activity None
            Output
            activity Some("Bash") "rm -rf target"
            ToolEnded { running: 0 }
            ToolDenied { tool: "Bash", summary: Some("rm -rf target") }
            activity None
            Output x3
            Text { text: "could not remove it" }
            Result { text: "could not remove it", covers: 0 } usage[in=20 out=10 cr=0 cw=0 rs=0 cost=- model=fake-model req=2]
            Idle x2
            -- end
            -- query
            -- post [0]
            activity None
            Output
            activity Some("Read") "/tmp/nanoclaw-opencode-hDXqMR/agent/secret.txt"
            permission.asked read Object {} call=Some("read {\"filePath\":\"/tmp/nanoclaw-opencode-hDXqMR/agent/secret.txt\"}")
            -- reply "Reject(\"denied by the tool policy\")"
            ToolEnded { running: 0 }
            activity None
            Output x3
            Text { text: "could not read it" }
            Result { text: "could not read it", covers: 0 } usage[in=20 out=10 cr=0 cw=0 rs=0 cost=- model=fake-model req=2]
            Idle x2
            -- end
            -- query
            -- post [0]
            activity None
            Output
            activity Some("Bash") "touch approved.txt"
            permission.asked bash Object {"command": String("touch approved.txt")} call=Some("bash {\"command\":\"touch approved.txt\",\"description\":\"run it\"}")
            -- approval
            -- reply "Once"
            ToolEnded { running: 0 }
            activity None
            Output x3
            Text { text: "touched" }
            Result { text: "touched", covers: 0 } usage[in=20 out=10 cr=0 cw=0 rs=0 cost=- model=fake-model req=2]
            Idle
            -- end
            -- query
            -- post [0]
            activity None
            Output
            activity Some("Bash") "touch refused.txt"
            permission.asked bash Object {"command": String("touch refused.txt")} call=Some("bash {\"command\":\"touch refused.txt\",\"description\":\"run it\"}")
            -- approval
            -- reply "Reject(\"denied by the user\")"
            ToolEnded { running: 0 }
            activity None
            Output x3
            Text { text: "was refused" }
            Result { text: "was refused", covers: 0 } usage[in=20 out=10 cr=0 cw=0 rs=0 cost=- model=fake-model req=2]
            Idle x2
            -- end
            -- query
            -- post [0]
            activity None
            Output
            activity Some("mcp__nanoclaw__send_message")
            permission.asked nanoclaw_send_message Object {} call=Some("nanoclaw_send_message {\"channel\":\"slack\",\"platformId\":\"C1\",\"text\":\"asked first\"}")
            -- approval
            -- reply "Once"
            ToolEnded { running: 0 }
            activity None
            Output x3
            Text { text: "sent" }
            Result { text: "sent", covers: 0 } usage[in=20 out=10 cr=0 cw=0 rs=0 cost=- model=fake-model req=2]
            Idle x2
            -- end
        "#]],
    );
}

/// `approvalStopTools: ["mcp__nanoclaw__send_message"]`: the call completes, the turn ends with
/// `ApprovalStop` (the plugin's abort is ours), and the next query answers normally.
#[test]
fn approval_stop() {
    check(
        "approval_stop",
        expect![[r#"
        -- query
        -- post [0]
        activity None
        Output x3
        Text { text: "warm" }
        Result { text: "warm", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
        Idle x2
        -- end
        -- query
        -- post [0]
        activity None
        Output
        activity Some("mcp__nanoclaw__send_message")
        ToolEnded { running: 0 }
        ApprovalStop
        Idle x2
        -- query
        -- post [0]
        activity None
        Output x3
        Text { text: "going ahead" }
        Result { text: "going ahead", covers: 0 } usage[in=10 out=5 cr=0 cw=0 rs=0 cost=- model=fake-model req=1]
        Idle x2
        -- end
    "#]],
    );
}
