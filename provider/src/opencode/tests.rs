//! Replays recorded OpenCode sessions (`provider/tests/fixtures/opencode/*.jsonl`, captured
//! from the real CLI against the fake model server) through [`Turn`] and snapshots the
//! translated events.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use expect_test::{expect, Expect};
use serde_json::Value;

use super::events::{Event, MessageWithParts};
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
        let record: Value = serde_json::from_str(line)
            .unwrap_or_else(|err| panic!("{name}:{}: {err}", number + 1));
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
                turn.as_mut().unwrap().posted(id, *prompts.iter().max().unwrap());
                out.push(format!("-- post {prompts:?}"));
            }
            "in" => {
                let event = Event::parse(&value.to_string()).unwrap();
                for output in turn.as_mut().unwrap().handle(&event) {
                    out.push(show(&output));
                }
            }
            "aborting" => turn.as_mut().unwrap().set_aborting(value.as_bool().unwrap()),
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
        Output::Event(ProviderEvent::Activity { tool }) => format!("activity {tool:?}"),
        Output::Event(event) => format!("{event:?}"),
        other => format!("{other:?}"),
    }
}

fn check(name: &str, expect: Expect) {
    expect.assert_eq(&replay(name));
}

#[test]
fn text_reply() {
    check("text_reply", expect![[""]]);
}

#[test]
fn mcp_tool_call() {
    check("mcp_tool_call", expect![[""]]);
}

#[test]
fn push_restart() {
    check("push_restart", expect![[""]]);
}

#[test]
fn push_during_tool() {
    check("push_during_tool", expect![[""]]);
}

#[test]
fn resume() {
    check("resume", expect![[""]]);
}

#[test]
fn stale_continuation() {
    check("stale_continuation", expect![[""]]);
}

#[test]
fn api_errors() {
    check("api_errors", expect![[""]]);
}

#[test]
fn killed_server() {
    check("killed_server", expect![[""]]);
}

#[test]
fn watchdog() {
    check("watchdog", expect![[""]]);
}

#[test]
fn abort() {
    check("abort", expect![[""]]);
}

#[test]
fn agent_shell() {
    check("agent_shell", expect![[""]]);
}
