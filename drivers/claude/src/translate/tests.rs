//! Translation of captured Claude Code output (`drivers/claude/tests/fixtures/claude/*.jsonl`, see
//! `capture.py` there) and the shape of what the provider writes to stdin.

use std::path::PathBuf;

use expect_test::{expect, Expect};

use super::{Signal, Translator};
use crate::approval;
use crate::media;
use crate::protocol;
use provider::{MediaFile, Prompt, ProviderEvent, ProviderSettings, ToolRule, Usage};

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
    check_with(name, prompts, None, expect);
}

/// [`check`], answering the CLI's control requests as the driver does for `settings`
/// ([`approval::on_request`], shown after the request's line).
fn check_with(name: &str, prompts: u64, settings: Option<&ProviderSettings>, expect: Expect) {
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
                Signal::ControlResponse { request_id, error } => match error {
                    Some(error) => format!("-- control response {request_id} refused: {error}"),
                    None => format!("-- control response {request_id}"),
                },
                Signal::ControlRequest {
                    request_id,
                    subtype,
                    request,
                } => {
                    let mut line = format!("-- control request {request_id} {subtype}");
                    if let Some(settings) = settings {
                        let action = approval::on_request(settings, &request_id, &request);
                        if let approval::Action::Stop { .. } = action {
                            translator.approval_stop();
                        }
                        line.push_str(&format!("\n   -> {action:?}"));
                    }
                    line
                }
            });
        }
    }
    flush(&mut out, &mut idle_activity);
    out.push(format!(
        "== all covered: {}, outstanding: {}, seen: {}",
        translator.all_covered(),
        translator.outstanding(),
        translator.seen_by_model()
    ));
    expect.assert_eq(&(out.join("\n") + "\n"));
}

fn render(event: &ProviderEvent) -> String {
    match event {
        ProviderEvent::Init { session_id } => format!("Init {session_id}"),
        ProviderEvent::Result {
            text,
            covers,
            usage,
        } => format!("Result covers={covers} {text:?}{}", show_usage(usage)),
        ProviderEvent::Error {
            message,
            retryable,
            classification,
            ends_turn,
            usage,
        } => format!(
            "Error {classification:?} retryable={retryable} ends_turn={ends_turn}: {message}{}",
            show_usage(usage)
        ),
        ProviderEvent::Progress { message } => format!("Progress: {message}"),
        ProviderEvent::Activity { tool, summary } => match summary {
            Some(summary) => format!("Activity({}) {summary:?}", tool.as_deref().unwrap_or("-")),
            None => format!("Activity({})", tool.as_deref().unwrap_or("-")),
        },
        ProviderEvent::Output => "Output".to_owned(),
        ProviderEvent::Text { text } => format!("Text {text:?}"),
        ProviderEvent::Interrupted {
            covers,
            reason,
            usage,
        } => {
            format!(
                "Interrupted covers={covers} {reason:?}{}",
                show_usage(usage)
            )
        }
        ProviderEvent::ToolEnded { running } => format!("ToolEnded running={running}"),
        ProviderEvent::ApprovalRequest(request) => format!("ApprovalRequest {request:?}"),
        ProviderEvent::ToolDenied { tool, summary } => format!("ToolDenied({tool}) {summary:?}"),
        ProviderEvent::ToolUndecidable {
            tool,
            summary,
            reason,
        } => format!("ToolUndecidable({tool}) {summary:?} {reason:?}"),
    }
}

/// `usage` on one line (nothing without one), `?` for a figure not reported.
fn show_usage(usage: &Option<Usage>) -> String {
    let Some(usage) = usage else {
        return String::new();
    };
    let n = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
    format!(
        " [in={} out={} cache_read={} cache_write={} reasoning={} cost={} model={} requests={}]",
        n(usage.input_tokens),
        n(usage.output_tokens),
        n(usage.cache_read_tokens),
        n(usage.cache_write_tokens),
        n(usage.reasoning_tokens),
        usage
            .cost_usd
            .map_or_else(|| "?".to_owned(), |c| format!("{c:.6}")),
        usage.model.as_deref().unwrap_or("?"),
        n(usage.requests),
    )
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
            Output ×4
            Text "done"
            Output ×4
            Result covers=0 "done" [in=20 out=10 cache_read=0 cache_write=0 reasoning=0 cost=0.000280 model=claude-opus-5-5 requests=2]
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false, seen: 0
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
            Activity(Bash) "sleep 2"
            Output ×3
            Activity ×1
            ToolEnded running=0
            Activity ×2
            Output ×3
            Text "answered both"
            Output ×4
            Activity ×1
            Result covers=1 "answered both" [in=20 out=10 cache_read=0 cache_write=0 reasoning=0 cost=0.000280 model=claude-opus-5-5 requests=2]
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false, seen: 1
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
            Output ×3
            Text "one two three four"
            Output ×4
            Result covers=0 "one two three four" [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-opus-5-5 requests=1]
            -- turn ended
            Activity ×3
            Output ×3
            Text "second answer"
            Output ×4
            Result covers=1 "second answer" [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-opus-5-5 requests=1]
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false, seen: 1
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
            Output ×3
            Text "both at once"
            Output ×4
            Result covers=0 "both at once" [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-opus-5-5 requests=1]
            -- turn ended
            Activity ×3
            Output ×3
            Text "ok"
            Output ×4
            Result covers=1 "ok" [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-opus-5-5 requests=1]
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false, seen: 1
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
            Error RateLimited { retry_after_secs: Some(2) } retryable=true ends_turn=true: API Error: Request rejected (429) · fake 429 [in=0 out=0 cache_read=0 cache_write=0 reasoning=0 cost=0.000000 model=? requests=0]
            -- turn ended
            Activity ×1
            == all covered: false, outstanding: false, seen: 0
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
            Output ×3
            Text "recovered"
            Output ×4
            Result covers=0 "recovered" [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-opus-5-5 requests=1]
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false, seen: 0
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
            Error Auth retryable=false ends_turn=true: Failed to authenticate. API Error: 401 fake 401 [in=0 out=0 cache_read=0 cache_write=0 reasoning=0 cost=0.000000 model=? requests=0]
            -- turn ended
            Activity ×1
            == all covered: false, outstanding: false, seen: 0
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
            Error Api retryable=false ends_turn=true: API Error: 500 fake 500. This is a server-side issue, usually temporary — try again in a moment. If it persists, check your inference gateway (127.0.0.1:46519). [in=0 out=0 cache_read=0 cache_write=0 reasoning=0 cost=0.000000 model=? requests=0]
            -- turn ended
            Activity ×3
            Output ×3
            Text "answer to the queued prompt"
            Output ×4
            Result covers=1 "answer to the queued prompt" [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-opus-5-5 requests=1]
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false, seen: 1
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
            Text "a b "
            Output ×1
            Activity ×1
            Output ×3
            Error Other retryable=false ends_turn=true: claude interrupted the turn (aborted_streaming) [in=10 out=1 cache_read=0 cache_write=0 reasoning=0 cost=0.000060 model=claude-opus-5-5 requests=1]
            -- turn ended
            Activity ×4
            Output ×3
            Text "after the interrupt"
            Output ×4
            Result covers=2 "after the interrupt" [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-opus-5-5 requests=1]
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false, seen: 2
        "#]],
    );
}

/// Interrupt (with `cancel_queued`) while a tool runs: the push written during the tool was
/// still queued (the model had not seen it) and is cancelled, never run later; the model saw
/// prompt 0 only, which is what an interrupted query covers. Prompt 2 afterwards runs normally.
#[test]
fn interrupt_during_a_tool_cancels_the_unseen_push() {
    check(
        "interrupt_during_tool",
        3,
        expect![[r#"
            Activity ×2
            Init 8c6acd24-41fa-44c5-9951-939c3150e810
            Activity ×1
            Output ×3
            Activity(Bash) "sleep 5"
            Output ×3
            Activity ×1
            Error Other retryable=true ends_turn=true: claude dropped prompt 1 (cancelled) before the model saw it
            -- control response nanoclaw-1
            ToolEnded running=0
            Activity ×1
            Error Other retryable=false ends_turn=true: claude interrupted the turn (aborted_tools) [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-opus-5-5 requests=1]
            -- turn ended
            Activity ×4
            Output ×3
            Text "after the interrupt"
            Output ×4
            Result covers=2 "after the interrupt" [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-opus-5-5 requests=1]
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false, seen: 2
        "#]],
    );
}

/// Text before a tool call arrives as its own `Text` at once, before the tool runs; the tool
/// call says what it runs (the command's first line, cut to 120 characters).
#[test]
fn text_then_tool_then_text() {
    check(
        "text_then_tool",
        1,
        expect![[r#"
            Activity ×2
            Init 5aae2f90-8e04-4e25-ae21-579f9df10442
            Activity ×1
            Output ×3
            Text "<message to=\"ops\">deploying</message>"
            Output ×4
            Activity(Bash) "sleep 1 && echo xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…"
            Output ×3
            ToolEnded running=0
            Activity ×1
            Output ×3
            Text "all done"
            Output ×4
            Result covers=0 "all done" [in=20 out=10 cache_read=0 cache_write=0 reasoning=0 cost=0.000280 model=claude-opus-5-5 requests=2]
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false, seen: 0
        "#]],
    );
}

/// Issue 16: `--disallowedTools Bash(rm *)` refuses `rm -rf target`: Claude's own
/// `permission_denied` line is a `ToolDenied` with the call's summary; the turn goes on.
#[test]
fn a_cli_refusal_is_a_tool_denied() {
    check(
        "permission_denied",
        1,
        expect![[r#"
            Activity ×2
            Init a54558c2-d73c-4e03-87aa-6463c87378a6
            Activity ×1
            Output ×3
            Activity(Bash) "rm -rf target"
            Output ×2
            ToolDenied(Bash) Some("rm -rf target")
            Output ×1
            ToolEnded running=0
            Activity ×1
            Output ×3
            Text "done"
            Output ×4
            Result covers=0 "done" [in=20 out=10 cache_read=0 cache_write=0 reasoning=0 cost=0.000280 model=claude-opus-5-5 requests=2]
            -- turn ended
            == all covered: true, outstanding: true, seen: 0
        "#]],
    );
}

/// Issue 16: the `PreToolUse` hook lets `echo hi` run, the `PostToolUse` hook of an
/// approval-stop tool answers `continue: false`: the turn ends at the tool result with an
/// empty `success` result (`terminal_reason: hook_stopped`), which is
/// `Interrupted { ApprovalStop }`; the next prompt is an ordinary turn of the same session.
#[test]
fn an_approval_stop_ends_the_turn_after_the_tool_result() {
    let mut settings = ProviderSettings::for_workspace("/w", "claude");
    settings.tool_policy.ask =
        vec![ToolRule::parse("Bash(rm *)").unwrap_or_else(|e| panic!("{e}"))];
    settings.approval_stop_tools = vec!["Bash".into()];
    check_with(
        "approval_stop",
        2,
        Some(&settings),
        expect![[r#"
            -- control response init1
            Activity ×2
            Init 8fbff281-05fb-4c0c-843e-10c091b8d8f0
            Activity ×1
            Output ×3
            Activity(Bash) "echo hi"
            -- control request def952cd-6918-4d15-a6c4-216690568ea5 hook_callback
               -> Answer { response: Object {}, events: [] }
            Output ×3
            -- control request 73bbc803-43f7-4fbe-ba88-e88a7650af67 hook_callback
               -> Stop { response: Object {"continue": Bool(false), "stopReason": String("Bash is an approval stop: the turn ends with its result")} }
            ToolEnded running=0
            Interrupted covers=0 ApprovalStop [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-opus-5-5 requests=1]
            -- turn ended
            Activity ×4
            Output ×3
            Text "after-tool"
            Output ×4
            Result covers=1 "after-tool" [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-opus-5-5 requests=1]
            -- turn ended
            == all covered: true, outstanding: true, seen: 1
        "#]],
    );
}

/// `--max-turns 1` stops a turn that wants a second request: `Interrupted { MaxTurns }` with
/// the prompt it consumed and the cost of the one request, not an error.
#[test]
fn max_turns_is_an_interruption() {
    check(
        "max_turns",
        1,
        expect![[r#"
            Activity ×2
            Init cf65bf42-cff1-4b30-a51c-8ecccddc3a53
            Activity ×1
            Output ×3
            Activity(Bash) "echo one"
            Output ×3
            ToolEnded running=0
            Interrupted covers=0 MaxTurns [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-opus-5-5 requests=1]
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false, seen: 0
        "#]],
    );
}

/// `set_model` between turns: Claude answers the control request (after checking the model
/// with a one-token request of its own) and the next turn runs on the new model.
#[test]
fn set_model_between_turns() {
    check(
        "set_model",
        2,
        expect![[r#"
            Activity ×2
            Init fe5340bd-5d66-4916-afa8-c771c8ae5406
            Activity ×1
            Output ×3
            Text "first model"
            Output ×4
            Result covers=0 "first model" [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-first-model requests=1]
            -- turn ended
            Activity ×2
            -- control response nanoclaw-1
            Activity ×3
            Output ×3
            Text "ok"
            Output ×4
            Result covers=1 "ok" [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-other-model requests=1]
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false, seen: 1
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
            == all covered: false, outstanding: true, seen: 0
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
            Output ×3
            Text "first answer"
            Output ×4
            Result covers=0 "first answer" [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-opus-5-5 requests=1]
            -- turn ended
            Activity ×3
            Progress: compacting the conversation
            Progress: compaction success
            Progress: conversation compacted (manual), 15 tokens before, 2446 after
            Activity ×2
            Result covers=1 "" [in=10 out=5 cache_read=0 cache_write=0 reasoning=0 cost=0.000140 model=claude-opus-5-5 requests=0]
            -- turn ended
            Activity ×1
            == all covered: true, outstanding: false, seen: 1
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
        .set_len(provider::media::MAX_IMAGE_BYTES + 1)
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
    expect![[r#"{"request":{"model":"claude-x","subtype":"set_model"},"request_id":"nanoclaw-2","type":"control_request"}"#]]
    .assert_eq(&protocol::set_model("nanoclaw-2", Some("claude-x")).to_string());
    expect![[r#"{"response":{"error":"no","request_id":"req-7","subtype":"error"},"type":"control_response"}"#]]
    .assert_eq(&protocol::control_error("req-7", "no").to_string());
}

/// The usage rules on hand-made result lines: several models are summed and the one with the
/// most output names the turn; without `model_usage_since_last_result` (an older CLI) the tokens
/// come from `usage`, the running total `total_cost_usd` is NOT taken as the turn's cost, and
/// `num_turns` counts the requests.
#[test]
fn usage_of_result_lines() {
    let usage_of = |line: &str| {
        let mut translator = Translator::new();
        translator.register(&uuid(0), 0);
        let events = translator.on_line(line).events;
        match events.as_slice() {
            [ProviderEvent::Result { usage, .. }] => show_usage(usage),
            other => panic!("{other:?}"),
        }
    };
    let models = r#"{"type":"result","subtype":"success","is_error":false,"result":"x","user_message_uuids":["00000000-0000-4000-8000-000000000000"],"total_cost_usd":9.0,"begun_message_ids":["a","b","c"],"model_usage_since_last_result":{"claude-big":{"inputTokens":100,"outputTokens":50,"cacheReadInputTokens":30,"cacheCreationInputTokens":20,"thinkingTokens":5,"costUSD":0.5},"claude-small":{"inputTokens":10,"outputTokens":2,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"costUSD":0.01}}}"#;
    expect![[r#" [in=110 out=52 cache_read=30 cache_write=20 reasoning=5 cost=0.510000 model=claude-big requests=3]"#]]
        .assert_eq(&usage_of(models));
    let older = r#"{"type":"result","subtype":"success","is_error":false,"result":"x","user_message_uuids":["00000000-0000-4000-8000-000000000000"],"total_cost_usd":9.0,"num_turns":2,"usage":{"input_tokens":7,"output_tokens":3},"modelUsage":{"claude-a":{"outputTokens":1},"claude-b":{"outputTokens":9}}}"#;
    expect![[
        r#" [in=7 out=3 cache_read=? cache_write=? reasoning=? cost=? model=claude-b requests=2]"#
    ]]
    .assert_eq(&usage_of(older));
    let nothing = r#"{"type":"result","subtype":"success","is_error":false,"result":"x","user_message_uuids":["00000000-0000-4000-8000-000000000000"]}"#;
    assert_eq!(usage_of(nothing), "", "no figures: no usage");
}
