//! The state machine on scripted ACP traffic: what it sends and emits, as inline snapshots.

use super::*;
use expect_test::{expect, Expect};
use serde_json::json;

fn show(actions: &[Action]) -> String {
    actions
        .iter()
        .map(|action| match action {
            Action::Emit(event) => format!("emit {event:?}"),
            Action::Prompt { prompts } => format!(
                "prompt {:?}",
                prompts.iter().map(|p| p.text.as_str()).collect::<Vec<_>>()
            ),
            Action::Cancel => "cancel".to_owned(),
            Action::Respond { id, result } => format!("respond {id:?} {result}"),
            Action::Journal(record) => format!("journal {record}"),
            Action::Close => "close".to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn check(actions: &[Action], expected: Expect) {
    expected.assert_eq(&show(actions));
}

fn chunk(text: &str) -> Value {
    json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})
}

fn state() -> QueryState {
    QueryState::new(Prompt::text("hi")).with_policy(ToolPolicy::default(), vec!["nanoclaw".into()])
}

#[test]
fn chunks_and_tool_calls_become_text_activity_and_a_result() {
    let now = Instant::now();
    let mut state = state();
    let mut actions = state.begin();
    actions.extend(state.on_update(&chunk("Let me "), now));
    actions.extend(state.on_update(&chunk("look."), now));
    actions.extend(state.on_update(
        &json!({"sessionUpdate": "tool_call", "toolCallId": "mcp_nanoclaw_send_message-1",
                "kind": "other", "status": "in_progress", "rawInput": {"text": "hello"}}),
        now,
    ));
    actions.extend(state.on_update(
        &json!({"sessionUpdate": "plan", "entries": [{"content": "reply", "status": "pending"}]}),
        now,
    ));
    actions.extend(state.on_update(
        &json!({"sessionUpdate": "tool_call_update", "toolCallId": "mcp_nanoclaw_send_message-1",
                "status": "completed", "content": [{"type": "content", "content": {"type": "text", "text": "sent"}}]}),
        now,
    ));
    actions.extend(state.on_update(&chunk("Done."), now));
    actions.extend(state.on_prompt_answer(Ok(PromptResult {
        stop_reason: Some("end_turn".into()),
        usage: None,
        meta: Some(json!({"quota": {"token_count": {"input_tokens": 100, "output_tokens": 7}}})),
    })));
    actions.extend(state.on_control(Some(Control::End), now));
    check(
        &actions,
        expect![[r#"
            journal {"user":"hi"}
            prompt ["hi"]
            emit Output
            journal {"assistant":"Let me look."}
            emit Text { text: "Let me look." }
            journal {"id":"mcp_nanoclaw_send_message-1","input":{"text":"hello"},"tool":"mcp__nanoclaw__send_message"}
            emit Activity { tool: Some("mcp__nanoclaw__send_message"), summary: Some("{\"text\":\"hello\"}") }
            journal {"failed":false,"output":"mcp_nanoclaw_send_message-1","text":"sent"}
            emit ToolEnded { running: 0 }
            journal {"assistant":"Done."}
            emit Text { text: "Done." }
            emit Result { text: "Done.", covers: 0, usage: Some(Usage { input_tokens: Some(100), output_tokens: Some(7), cache_read_tokens: None, cache_write_tokens: None, reasoning_tokens: None, cost_usd: None, model: None, requests: None }) }
            close"#]],
    );
}

#[test]
fn a_push_while_a_tool_runs_waits_for_it_then_cancels_and_restarts_with_both() {
    let start = Instant::now();
    let mut state = state();
    let mut actions = state.begin();
    actions.extend(state.on_update(
        &json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "kind": "execute",
                "status": "in_progress", "rawInput": {"command": "make"}}),
        start,
    ));
    actions.extend(state.on_control(
        Some(Control::Push {
            id: 1,
            prompt: Prompt::text("also this"),
        }),
        start,
    ));
    // Within the grace nothing is cancelled; past it, the cancel goes.
    actions.extend(state.on_tick(start + Duration::from_secs(1)));
    actions.extend(state.on_tick(start + PUSH_TOOL_GRACE + Duration::from_secs(1)));
    actions.extend(state.on_prompt_answer(Ok(PromptResult {
        stop_reason: Some("cancelled".into()),
        usage: Some(json!({"inputTokens": 10, "outputTokens": 1, "totalTokens": 11})),
        meta: None,
    })));
    actions.extend(state.on_update(&chunk("both"), start));
    actions.extend(state.on_prompt_answer(Ok(PromptResult {
        stop_reason: Some("end_turn".into()),
        usage: Some(json!({"inputTokens": 20, "outputTokens": 2, "totalTokens": 22})),
        meta: None,
    })));
    check(
        &actions,
        expect![[r#"
            journal {"user":"hi"}
            prompt ["hi"]
            journal {"id":"t1","input":{"command":"make"},"tool":"Bash"}
            emit Activity { tool: Some("Bash"), summary: Some("make") }
            cancel
            journal {"user":"hi"}
            journal {"user":"also this"}
            prompt ["hi", "also this"]
            emit Output
            journal {"assistant":"both"}
            emit Text { text: "both" }
            emit Result { text: "both", covers: 1, usage: Some(Usage { input_tokens: Some(30), output_tokens: Some(3), cache_read_tokens: None, cache_write_tokens: None, reasoning_tokens: None, cost_usd: None, model: None, requests: None }) }"#]],
    );
}

#[test]
fn an_abort_reports_at_once_and_closes_when_the_prompt_answers() {
    let now = Instant::now();
    let mut state = state();
    let mut actions = state.begin();
    actions.extend(state.on_control(Some(Control::Abort), now));
    assert!(state.stopping());
    actions.extend(state.on_prompt_answer(Ok(PromptResult {
        stop_reason: Some("cancelled".into()),
        ..PromptResult::default()
    })));
    check(
        &actions,
        expect![[r#"
            journal {"user":"hi"}
            prompt ["hi"]
            emit Error { message: "the turn was aborted", retryable: false, classification: Aborted, ends_turn: true, usage: None }
            cancel
            close"#]],
    );
}

#[test]
fn permission_requests_after_a_cancel_are_cancelled() {
    let now = Instant::now();
    let mut state = state();
    let mut actions = state.begin();
    actions.extend(state.on_control(Some(Control::Interrupt), now));
    actions.extend(state.on_permission(
        RequestId::Int(7),
        &json!({"sessionId": "s", "toolCall": {"toolCallId": "t", "kind": "execute", "rawInput": {"command": "ls"}},
                "options": [{"optionId": "ok", "name": "ok", "kind": "allow_once"}]}),
    ));
    actions.extend(state.on_prompt_answer(Ok(PromptResult {
        stop_reason: Some("cancelled".into()),
        ..PromptResult::default()
    })));
    check(
        &actions,
        expect![[r#"
            journal {"user":"hi"}
            prompt ["hi"]
            cancel
            respond Int(7) {"outcome":{"outcome":"cancelled"}}
            emit Interrupted { covers: 0, usage: None, reason: Stopped }
            close"#]],
    );
}

#[test]
fn usage_where_the_agent_reports_it_else_none() {
    let parse = |value: Value| usage(&serde_json::from_value(value).unwrap());
    let shown = [
        parse(json!({"stopReason": "end_turn", "usage": {"inputTokens": 5, "outputTokens": 2, "totalTokens": 7, "cachedReadTokens": 1}})),
        parse(json!({"stopReason": "end_turn", "_meta": {"quota": {"token_count": {"input_tokens": 9, "output_tokens": 3}}}})),
        parse(json!({"stopReason": "end_turn"})),
        parse(json!({"stopReason": "end_turn", "usage": "garbage"})),
    ]
    .map(|u| format!("{u:?}"));
    expect![[r#"
        Some(Usage { input_tokens: Some(5), output_tokens: Some(2), cache_read_tokens: Some(1), cache_write_tokens: None, reasoning_tokens: None, cost_usd: None, model: None, requests: None })
        Some(Usage { input_tokens: Some(9), output_tokens: Some(3), cache_read_tokens: None, cache_write_tokens: None, reasoning_tokens: None, cost_usd: None, model: None, requests: None })
        None
        None"#]]
    .assert_eq(&shown.join("\n"));
}

#[test]
fn json_rpc_errors_are_classified() {
    let class = |code: i64, message: &str| {
        let (class, retryable) = classify_rpc_error(&RpcErrorBody {
            code,
            message: message.into(),
            data: None,
        });
        format!("{} {retryable}", class.name())
    };
    let shown = [
        class(AUTH_REQUIRED, "Authentication required"),
        class(-32603, "429 Too Many Requests: rate limit"),
        class(-32603, "You exceeded your current quota"),
        class(-32603, "something broke"),
    ];
    expect![[r#"
        Auth false
        RateLimited true
        Quota false
        Api true"#]]
    .assert_eq(&shown.join("\n"));
}
