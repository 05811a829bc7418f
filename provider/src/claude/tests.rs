//! Translation of captured Claude Code output (`provider/tests/fixtures/claude/*.jsonl`, see
//! `capture.py` there) and the shape of what the provider writes to stdin.

use std::path::PathBuf;

use expect_test::{expect, Expect};

use super::media;
use super::protocol;
use super::translate::{Signal, Translator};
use crate::{MediaFile, Prompt, ProviderEvent};

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/claude")
        .join(format!("{name}.jsonl"));
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The uuid `capture.py` put on prompt `n`.
fn uuid(n: u64) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

/// Runs a fixture through a translator that wrote `prompts` prompts, and renders the events and
/// signals one per line (runs of `Activity(None)` folded into one line with a count).
fn check(name: &str, prompts: u64, expect: Expect) {
    let mut translator = Translator::new();
    for id in 0..prompts {
        translator.register(&uuid(id), id);
    }
    let mut out: Vec<String> = Vec::new();
    // A run of the same liveness event (`Activity(None)` or `Output`) and its length.
    let mut idle_activity: (&str, usize) = ("", 0);
    let flush = |out: &mut Vec<String>, run: &mut (&str, usize)| {
        if run.1 > 0 {
            out.push(format!("{} ×{}", run.0, run.1));
            *run = ("", 0);
        }
    };
    for line in fixture(name).lines() {
        let translated = translator.on_line(line);
        for event in translated.events {
            let folded = match event {
                ProviderEvent::Activity { tool: None, .. } => Some("Activity"),
                ProviderEvent::Output => Some("Output"),
                _ => None,
            };
            if let Some(label) = folded {
                if idle_activity.0 != label {
                    flush(&mut out, &mut idle_activity);
                }
                idle_activity = (label, idle_activity.1 + 1);
                continue;
            }
            flush(&mut out, &mut idle_activity);
            out.push(render(&event));
        }
        if let Some(signal) = translated.signal {
            flush(&mut out, &mut idle_activity);
            out.push(match signal {
                Signal::TurnEnded => "-- turn ended".to_owned(),
                Signal::SessionNotFound(message) => format!("-- session not found: {message}"),
                Signal::ControlResponse { request_id } => {
                    format!("-- control response {request_id}")
                }
                Signal::ControlRequest {
                    request_id,
                    subtype,
                } => {
                    format!("-- control request {request_id} {subtype}")
                }
            });
        }
    }
    flush(&mut out, &mut idle_activity);
    out.push(format!(
        "== all covered: {}, outstanding: {}",
        translator.all_covered(),
        translator.outstanding()
    ));
    expect.assert_eq(&(out.join("\n") + "\n"));
}

fn render(event: &ProviderEvent) -> String {
    match event {
        ProviderEvent::Init { session_id } => format!("Init {session_id}"),
        ProviderEvent::Result { text, covers, .. } => format!("Result covers={covers} {text:?}"),
        ProviderEvent::Error {
            message,
            retryable,
            classification,
            ends_turn,
            ..
        } => format!(
            "Error {classification:?} retryable={retryable} ends_turn={ends_turn}: {message}"
        ),
        ProviderEvent::Progress { message } => format!("Progress: {message}"),
        ProviderEvent::Activity { tool, .. } => {
            format!("Activity({})", tool.as_deref().unwrap_or("-"))
        }
        ProviderEvent::Output => "Output".to_owned(),
        ProviderEvent::Text { text } => format!("Text {text:?}"),
        ProviderEvent::Interrupted { covers, reason, .. } => {
            format!("Interrupted covers={covers} {reason:?}")
        }
        ProviderEvent::ToolEnded { running } => format!("ToolEnded running={running}"),
    }
}

#[test]
fn tool_call_then_text() {
    check(
        "tool_then_text",
        1,
        expect![[r#"
            Activity ×2
            Init a0cf3056-03aa-403e-b1e3-a6e4c390bca2
            Activity ×1
            Output ×3
            Activity(mcp__nanoclaw__send_message)
            Output ×3
            ToolEnded running=0
            Activity ×1
            Output ×8
            Result covers=0 "done"
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false
        "#]],
    );
}

/// A push written while a tool runs is folded into the running turn: one result covers both.
#[test]
fn push_during_a_tool_joins_the_turn() {
    check(
        "push_during_tool",
        2,
        expect![[r#"
            Activity ×2
            Init 3284712d-e3d0-403e-aba8-d970d38c646e
            Activity ×1
            Output ×3
            Activity(Bash)
            Output ×3
            Activity ×1
            ToolEnded running=0
            Activity ×2
            Output ×7
            Activity ×1
            Result covers=1 "answered both"
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false
        "#]],
    );
}

/// A push written while text streams waits for its own turn: two results, covering 0 then 1.
#[test]
fn push_during_text_gets_its_own_turn() {
    check(
        "push_during_text",
        2,
        expect![[r#"
            Activity ×2
            Init f8bf0888-08cd-4d38-b734-9056e1554b84
            Activity ×1
            Output ×3
            Activity ×1
            Output ×7
            Result covers=0 "one two three four"
            -- turn ended
            Activity ×3
            Output ×7
            Result covers=1 "second answer"
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false
        "#]],
    );
}

/// Two prompts written back to back before the first turn starts: two turns, in order.
#[test]
fn two_prompts_at_once_run_in_order() {
    check(
        "two_prompts_at_once",
        2,
        expect![[r#"
            Activity ×3
            Init 053a789c-e4c4-4c13-8865-2e98100552b7
            Activity ×1
            Output ×7
            Result covers=0 "both at once"
            -- turn ended
            Activity ×3
            Output ×7
            Result covers=1 "ok"
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false
        "#]],
    );
}

#[test]
fn rate_limit_retries_then_quota_error() {
    check(
        "rate_limited",
        1,
        expect![[r#"
            Activity ×2
            Init f03d6a2e-7f53-41a5-8145-ad53e8c29372
            Activity ×1
            Error RateLimited { retry_after_secs: Some(2) } retryable=true ends_turn=false: model API error (HTTP 429, rate_limit); claude retries (1/2) in 1029 ms
            Error RateLimited { retry_after_secs: Some(2) } retryable=true ends_turn=false: model API error (HTTP 429, rate_limit); claude retries (2/2) in 1093 ms
            Output ×1
            Error RateLimited { retry_after_secs: Some(2) } retryable=true ends_turn=true: API Error: Request rejected (429) · fake 429
            -- turn ended
            Activity ×1
            == all covered: false, outstanding: false
        "#]],
    );
}

#[test]
fn server_errors_then_recovery() {
    check(
        "server_error_recovered",
        1,
        expect![[r#"
            Activity ×2
            Init 11f66029-9ea9-45d8-943f-24efe9eeecee
            Activity ×1
            Error Api retryable=true ends_turn=false: model API error (HTTP 500, server_error); claude retries (1/2) in 532 ms
            Error Api retryable=true ends_turn=false: model API error (HTTP 500, server_error); claude retries (2/2) in 1239 ms
            Output ×7
            Result covers=0 "recovered"
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false
        "#]],
    );
}

#[test]
fn authentication_failure() {
    check(
        "auth_failed",
        1,
        expect![[r#"
            Activity ×2
            Init 6f5d4db0-f771-487e-8066-88a4c1cb78f1
            Activity ×1
            Error Auth retryable=true ends_turn=false: model API error (HTTP 401, authentication_failed); claude retries (1/1) in 584 ms
            Output ×1
            Error Auth retryable=false ends_turn=true: Failed to authenticate. API Error: 401 fake 401
            -- turn ended
            Activity ×1
            == all covered: false, outstanding: false
        "#]],
    );
}

/// An API error ends the first turn; the queued push then runs as its own turn. The driver closes
/// the query at the error and interrupts with `cancel_queued` first, so that turn never runs
/// there; here the translator sees the whole capture.
#[test]
fn server_error_with_a_queued_push() {
    check(
        "server_error_with_queued_push",
        2,
        expect![[r#"
            Activity ×2
            Init 03d8ba96-7292-4379-b214-6df906dc9621
            Activity ×2
            Output ×1
            Error Api retryable=false ends_turn=true: API Error: 500 fake 500. This is a server-side issue, usually temporary — try again in a moment. If it persists, check your inference gateway (127.0.0.1:46519).
            -- turn ended
            Activity ×3
            Output ×7
            Result covers=1 "answer to the queued prompt"
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false
        "#]],
    );
}

/// Interrupt with `cancel_queued`: the queued push is cancelled, the turn ends as an error;
/// prompt 2 written after it gets a turn of its own.
#[test]
fn interrupt_cancels_the_queue() {
    check(
        "interrupt",
        3,
        expect![[r#"
            Activity ×2
            Init 3be78286-e7a0-42ef-a9ee-704f050bd3e5
            Activity ×1
            Output ×3
            Activity ×1
            Output ×1
            Error Other retryable=true ends_turn=true: claude dropped prompt 1 (cancelled) before the model saw it
            -- control response nanoclaw-1
            Output ×1
            Activity ×1
            Output ×3
            Error Other retryable=false ends_turn=true: claude interrupted the turn (aborted_streaming)
            -- turn ended
            Activity ×4
            Output ×7
            Result covers=2 "after the interrupt"
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false
        "#]],
    );
}

#[test]
fn resume_of_a_missing_session() {
    check(
        "resume_not_found",
        1,
        expect![[r#"
        -- session not found: No conversation found with session ID: 11111111-2222-4333-8444-555555555555
        == all covered: false, outstanding: true
    "#]],
    );
}

/// `/compact` as a prompt: compaction notices are progress, never a reply; its result (empty
/// text) covers the command.
#[test]
fn compaction_is_progress() {
    check(
        "compact",
        2,
        expect![[r#"
            Activity ×2
            Init f202a382-3af6-492a-b38a-3161ec46ce81
            Activity ×1
            Output ×7
            Result covers=0 "first answer"
            -- turn ended
            Activity ×3
            Progress: compacting the conversation
            Progress: compaction success
            Progress: conversation compacted (manual), 15 tokens before, 2446 after
            Activity ×2
            Result covers=1 ""
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false
        "#]],
    );
}

#[tokio::test]
async fn user_message_with_media() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("pixel.png");
    std::fs::write(&png, [0x89, b'P', b'N', b'G']).unwrap();
    let pdf = dir.path().join("doc.pdf");
    std::fs::write(&pdf, b"%PDF-1.4").unwrap();
    let big = dir.path().join("huge.jpg");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(crate::media::MAX_IMAGE_BYTES + 1)
        .unwrap();
    let prompt = Prompt {
        text: "<message id=\"2\">see attached</message>".into(),
        media: vec![
            MediaFile {
                path: png,
                mime_type: "image/png".into(),
            },
            MediaFile {
                path: pdf,
                mime_type: "application/pdf".into(),
            },
            MediaFile {
                path: big,
                mime_type: "image/jpeg".into(),
            },
            MediaFile {
                path: dir.path().join("notes.txt"),
                mime_type: "text/plain".into(),
            },
            MediaFile {
                path: dir.path().join("missing.gif"),
                mime_type: "image/gif".into(),
            },
        ],
    };
    let line = protocol::user_message(&uuid(0), media::message_content(&prompt).await);
    expect![[r#"
        {
          "message": {
            "content": [
              {
                "source": {
                  "data": "iVBORw==",
                  "media_type": "image/png",
                  "type": "base64"
                },
                "type": "image"
              },
              {
                "source": {
                  "data": "JVBERi0xLjQ=",
                  "media_type": "application/pdf",
                  "type": "base64"
                },
                "type": "document"
              },
              {
                "text": "<message id=\"2\">see attached</message>",
                "type": "text"
              }
            ],
            "role": "user"
          },
          "parent_tool_use_id": null,
          "session_id": "",
          "type": "user",
          "uuid": "00000000-0000-4000-8000-000000000000"
        }"#]]
    .assert_eq(&serde_json::to_string_pretty(&line).unwrap());
}

#[test]
fn control_lines() {
    expect![[r#"{"request":{"cancel_queued":true,"subtype":"interrupt"},"request_id":"nanoclaw-1","type":"control_request"}"#]]
    .assert_eq(&protocol::interrupt("nanoclaw-1").to_string());
    expect![[r#"{"response":{"error":"no","request_id":"req-7","subtype":"error"},"type":"control_response"}"#]]
    .assert_eq(&protocol::control_error("req-7", "no").to_string());
}
