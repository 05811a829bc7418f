//! The Claude Code provider driven directly (no runner) against the REAL pinned `claude` CLI,
//! the scripted fake model server and the real `mcp-tools`.
//!
//! * The CLI: `$CLAUDE_PATH` or `<repo>/.cli/node_modules/.bin/claude` (`scripts/install-clis.sh`).
//!   A missing CLI FAILS the tests; `NANOCLAW_SKIP_CLI_TESTS=1` skips them instead.
//! * mcp-tools: `$MCP_TOOLS_PATH` or `<target>/debug/mcp-tools`, built on demand.
//! * Isolation: when `unshare -n` works (root here), each test re-executes itself inside a
//!   loopback-only network namespace (`NANOCLAW_NETNS=0` disables that), so nothing can leave
//!   the machine; the CLI runs with the traffic-off environment in any case.
//! * The stream-json fixtures of the unit tests are captured separately
//!   (`drivers/claude/tests/fixtures/claude/capture.py`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use claude::ClaudeProvider;
use e2e::fake_model::{Step, StepUsage};
use e2e::harness::claude_user_texts as user_texts;
use e2e::provider_harness::{
    answer, answer_approval, ask, ask_with, drain, ends_turn, final_errors, input,
    is_approval_request, is_result, query_until_approval, question_id, results, rules, session_id,
    tool_denials, until, EVENT_TIMEOUT,
};
use e2e::provider_scenarios::{
    assert_first_text_reply, setup, start, ApiErrorCase, ExpectedClass, WatchdogCase,
};
use e2e::secrets::shell_step;
use provider::{
    AgentProvider, ApprovalAnswer, ErrorClass, InterruptReason, MediaFile, Prompt, PromptId,
    ProviderEvent, QueryInput, Usage,
};
use serde_json::{json, Value};

/// The provider under test (its settings: `CliProvider::SPEC`).
type Cli = ClaudeProvider;

// ---------------------------------------------------------------------------------------------
// Scenarios shared with the other CLIs (e2e::provider_scenarios)
// ---------------------------------------------------------------------------------------------

e2e::provider_scenario_tests! { Cli;
    /// The model calls send_message: mcp-tools (spawned by Claude with the generated config)
    /// writes the row.
    send_message_through_mcp_tools_writes_a_row("mcp__nanoclaw__send_message");

    /// A stored continuation naming a session that does not exist: the provider says so,
    /// starts a new session, answers the same prompt and reports the new id.
    stale_continuation_starts_a_new_session("11111111-2222-4333-8444-555555555555", "not found");

    /// 500s and 429s: the CLI retries a bounded number of times (each retry is a non-final
    /// error), then the turn ends with a classified error; the process stays usable.
    api_errors_are_bounded_and_classified(
        api_error_cases(),
        Duration::from_secs(60),
        Some(Duration::from_secs(90))
    );

    /// The CLI is killed mid-turn: a retryable process error; the next query respawns it and
    /// resumes the same session.
    killed_cli_is_reported_and_the_next_query_resumes("process_killed", true);

    /// No output for the watchdog period during a turn: the process group is killed, a
    /// retryable watchdog error; the next query works.
    watchdog_kills_a_silent_turn(WatchdogCase {
        watchdog: Duration::from_secs(3),
        silence: Step::hang_before_response(),
        within: Duration::from_secs(15),
        idle_first: false,
        stops_the_process: true,
    });

    /// Abort interrupts the streaming turn and cancels a queued push, but keeps the process for
    /// the next query, which the model sees after the interruption note.
    abort_interrupts_the_turn_and_keeps_the_process(
        Step::text("a b c d e f g h").chunks(8).delay_ms(500),
        true
    );

    /// The agent's shell runs `env`: neither the API key nor a host secret is there (even an
    /// explicit passthrough does not beat the scrub patterns).
    shell_never_sees_the_api_key_or_host_secrets(
        Step::raw_tool_call("Bash", json!({"command": "env", "description": "list"}))
    );

    /// shutdown stops claude and everything it started (mcp-tools).
    shutdown_stops_claude_and_its_mcp_servers = shutdown_stops_the_cli_and_its_mcp_servers(true);
}

/// A 500 is retried once (`max_retries` 1: ONE retry notice, classified Api) and then a
/// non-retryable Api error naming the status; a 429 is a passing rate limit, not an exhausted
/// quota: retryable, with the CLI's wait, after rate-limit notices.
fn api_error_cases() -> Vec<ApiErrorCase> {
    vec![
        ApiErrorCase {
            label: "500",
            step: Step::error(500, "fake 500").retry_after_ms(50),
            class: ExpectedClass::Is(ErrorClass::Api),
            retryable: false,
            message_contains: Some("500"),
            requests: 2..=2,
            notices: 1..=1,
            notice_class: Some(ErrorClass::Api),
        },
        ApiErrorCase {
            label: "429",
            step: Step::error(429, "fake 429").retry_after_secs(1),
            class: ExpectedClass::RateLimitedWithReset,
            retryable: true,
            message_contains: None,
            requests: 2..=2,
            notices: 1..=usize::MAX,
            notice_class: Some(ErrorClass::RATE_LIMITED),
        },
    ]
}

#[test]
fn missing_cli_is_a_spawn_error_naming_claude_path() {
    e2e::provider_scenarios::missing_cli_is_a_spawn_error_naming_its_path::<Cli>();
}

// ---------------------------------------------------------------------------------------------
// Tests only Claude has
// ---------------------------------------------------------------------------------------------

/// A text reply; what the model was sent (key, model, system prompt, tools) follows from the
/// generated command line; a second query reuses the same process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_reply_with_the_generated_command() {
    let Some(cli) = start::<Cli>("text_reply_with_the_generated_command") else {
        return;
    };
    let s = setup::<Cli>("claude", cli);
    s.fake.push_all([
        Step::text("hello from the fake model").chunks(3),
        Step::text("second reply"),
    ]);
    let provider = s.provider::<Cli>();
    let events = ask(&provider, "<message id=\"1\">hi</message>", None).await;
    s.print_log();
    let init = events
        .iter()
        .position(|e| matches!(e, ProviderEvent::Init { .. }));
    let result = events.iter().position(is_result);
    assert!(
        init.is_some() && init < result,
        "Init before the result: {events:#?}"
    );
    let request = assert_first_text_reply::<Cli>(&s, &events, "/v1/messages");
    let session = session_id(&events);
    let pid = provider
        .pid()
        .await
        .expect("claude stays alive between queries");
    let tools = request.tool_names();
    for banned in claude::DISALLOWED_TOOLS {
        assert!(
            !tools.iter().any(|t| t == banned),
            "{banned} offered: {tools:?}"
        );
    }
    assert!(tools.iter().any(|t| t == "Bash"), "{tools:?}");

    // The next query on the same session: same process, same session, history kept.
    let events = ask(
        &provider,
        "<message id=\"3\">again</message>",
        Some(&session),
    )
    .await;
    assert_eq!(results(&events), vec![("second reply".to_owned(), 0)]);
    assert_eq!(session_id(&events), session);
    assert_eq!(
        provider.pid().await,
        Some(pid),
        "no respawn between queries"
    );
    let request = s.fake.model_requests().pop().unwrap();
    assert_eq!(
        user_texts(&request),
        vec![
            "<message id=\"1\">hi</message>".to_owned(),
            "<message id=\"3\">again</message>".to_owned()
        ]
    );
    // The session lives in the private HOME.
    assert!(s.settings.home_dir.join(".claude/projects").is_dir());
    provider.shutdown().await;
}

/// A push written while a tool runs is folded into the running turn: the model's next request
/// carries it, and ONE result covers both prompts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_during_a_tool_joins_the_running_turn() {
    let Some(cli) = start::<Cli>("push_during_a_tool_joins_the_running_turn") else {
        return;
    };
    let s = setup::<Cli>("claude", cli);
    s.fake.push_all([
        Step::raw_tool_call("Bash", json!({"command": "sleep 2", "description": "wait"})),
        Step::text("answered both"),
    ]);
    let provider = s.provider::<Cli>();
    let mut query = provider.query(input("first message", None)).unwrap();
    let mut events = until(
        &mut query,
        |e| matches!(e, ProviderEvent::Activity { tool: Some(t), .. } if t == "Bash"),
    )
    .await;
    assert_eq!(query.push(Prompt::text("second message")).unwrap(), 1);
    events.extend(until(&mut query, ends_turn).await);
    query.end();
    events.extend(drain(&mut query).await);
    s.print_log();
    assert_eq!(results(&events), vec![("answered both".to_owned(), 1)]);
    let requests = s.fake.model_requests();
    assert_eq!(requests.len(), 2);
    assert!(
        requests[1].system_text().contains("second message"),
        "the follow-up reaches the model mid-turn: {}",
        requests[1].system_text()
    );
    provider.shutdown().await;
}

/// A push written while the answer streams waits for a turn of its own: two results, covering
/// prompt 0 and then prompt 1, and never one for a prompt the model has not seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_during_text_gets_a_turn_of_its_own() {
    let Some(cli) = start::<Cli>("push_during_text_gets_a_turn_of_its_own") else {
        return;
    };
    let s = setup::<Cli>("claude", cli);
    s.fake.push_all([
        Step::text("one two three four").chunks(4).delay_ms(400),
        Step::text("second answer"),
    ]);
    let provider = s.provider::<Cli>();
    let mut query = provider.query(input("first message", None)).unwrap();
    s.fake
        .wait_for_requests_async(1, Duration::from_secs(20))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    query.push(Prompt::text("second message")).unwrap();
    let mut events = until(&mut query, is_result).await;
    assert_eq!(
        results(&events),
        vec![("one two three four".to_owned(), 0)],
        "the first result covers only the first prompt"
    );
    events.extend(until(&mut query, is_result).await);
    query.end();
    events.extend(drain(&mut query).await);
    s.print_log();
    assert_eq!(
        results(&events),
        vec![
            ("one two three four".to_owned(), 0),
            ("second answer".to_owned(), 1)
        ]
    );
    let last = s.fake.model_requests().pop().unwrap();
    assert_eq!(last.last_user_text().as_deref(), Some("second message"));
    provider.shutdown().await;
}

/// A new provider (runner restart) resumes the stored session: the model gets the earlier
/// history and the CURRENT system prompt; a system prompt change restarts the live process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_after_restart_keeps_history_and_applies_the_system_prompt() {
    let Some(cli) =
        start::<Cli>("resume_after_restart_keeps_history_and_applies_the_system_prompt")
    else {
        return;
    };
    let s = setup::<Cli>("claude", cli);
    s.fake.push_all([
        Step::text("noted"),
        Step::text("resumed"),
        Step::text("with the new prompt"),
    ]);
    let first = s.provider::<Cli>();
    let events = ask(&first, "remember the word PAPAYA", None).await;
    let session = session_id(&events);
    first.shutdown().await;

    let second = s.provider::<Cli>();
    let mut resumed = input("what was the word?", Some(&session));
    resumed.system_prompt = Some("SYSTEM-MARKER-2 after the restart".into());
    let events = ask_with(&second, resumed).await;
    s.print_log();
    assert_eq!(results(&events), vec![("resumed".to_owned(), 0)]);
    assert_eq!(session_id(&events), session, "the same session continues");
    let request = s.fake.model_requests().pop().unwrap();
    let texts = user_texts(&request);
    assert!(
        texts.iter().any(|t| t.contains("remember the word PAPAYA")),
        "history replayed: {texts:?}"
    );
    assert!(
        request.system_text().contains("SYSTEM-MARKER-2"),
        "the new system prompt applies after --resume: {}",
        request.system_text()
    );
    assert!(!request.system_text().contains("SYSTEM-MARKER-1"));

    // A different system prompt while the process lives: restart with --resume.
    let pid = second.pid().await.unwrap();
    let mut changed = input("and now?", Some(&session));
    changed.system_prompt = Some("SYSTEM-MARKER-3 changed".into());
    let events = ask_with(&second, changed).await;
    assert_eq!(
        results(&events),
        vec![("with the new prompt".to_owned(), 0)]
    );
    assert_ne!(
        second.pid().await,
        Some(pid),
        "restarted for the new prompt"
    );
    let request = s.fake.model_requests().pop().unwrap();
    assert!(request.system_text().contains("SYSTEM-MARKER-3"));
    assert!(user_texts(&request)
        .iter()
        .any(|t| t.contains("what was the word?")));
    second.shutdown().await;
}

/// Images and PDFs reach the model as native content blocks next to the text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_reach_the_model_natively() {
    let Some(cli) = start::<Cli>("media_reach_the_model_natively") else {
        return;
    };
    let s = setup::<Cli>("claude", cli);
    // A 1×1 PNG.
    let png: [u8; 69] = [
        0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44,
        0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x02, 0x00, 0x00, 0x00, 0x90,
        0x77, 0x53, 0xde, 0x00, 0x00, 0x00, 0x0c, 0x49, 0x44, 0x41, 0x54, 0x08, 0xd7, 0x63, 0xf8,
        0xcf, 0xc0, 0x00, 0x00, 0x03, 0x01, 0x01, 0x00, 0x18, 0xdd, 0x8d, 0xb0, 0x00, 0x00, 0x00,
        0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
    ];
    let image = s.dir.path().join("pixel.png");
    std::fs::write(&image, png).unwrap();
    let pdf = s.dir.path().join("doc.pdf");
    std::fs::write(&pdf, b"%PDF-1.4\n%%EOF\n").unwrap();
    s.fake.push(Step::text("nice picture"));
    let provider = s.provider::<Cli>();
    let events = ask_with(
        &provider,
        QueryInput {
            prompt: Prompt {
                text: "look [file available at: /workspace/downloads/1/pixel.png]".into(),
                media: vec![
                    MediaFile {
                        path: image,
                        mime_type: "image/png".into(),
                    },
                    MediaFile {
                        path: pdf,
                        mime_type: "application/pdf".into(),
                    },
                ],
            },
            continuation: None,
            system_prompt: None,
            model: None,
        },
    )
    .await;
    s.print_log();
    assert_eq!(results(&events), vec![("nice picture".to_owned(), 0)]);
    let request = s.fake.model_requests().pop().unwrap();
    let blocks: Vec<Value> = request.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .collect();
    let image_block = blocks
        .iter()
        .find(|b| b["type"] == "image")
        .unwrap_or_else(|| panic!("no image block: {blocks:#?}"));
    assert_eq!(image_block["source"]["media_type"], "image/png");
    assert_eq!(
        image_block["source"]["data"],
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVQI12P4z8AAAAMBAQAY3Y2wAAAAAElFTkSuQmCC"
    );
    assert!(blocks
        .iter()
        .any(|b| b["type"] == "document" && b["source"]["media_type"] == "application/pdf"));
    assert!(blocks
        .iter()
        .any(|b| b["type"] == "text" && b["text"].as_str().unwrap_or("").starts_with("look")));
    provider.shutdown().await;
}

/// A native slash command goes raw: `/compact` compacts (progress notices, an empty result),
/// `/cost` answers without a model call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_commands_run_in_the_cli() {
    let Some(cli) = start::<Cli>("native_commands_run_in_the_cli") else {
        return;
    };
    let s = setup::<Cli>("claude", cli);
    s.fake.push_all([
        Step::text("first answer"),
        Step::text("<summary>what happened so far</summary>"),
    ]);
    let provider = s.provider::<Cli>();
    assert!(provider.native_commands().contains(&"/compact"));
    let events = ask(&provider, "hello", None).await;
    let session = session_id(&events);
    let events = ask(&provider, "/compact", Some(&session)).await;
    assert_eq!(results(&events), vec![(String::new(), 0)], "{events:#?}");
    assert!(
        events.iter().any(
            |e| matches!(e, ProviderEvent::Progress { message } if message.contains("compacted"))
        ),
        "{events:#?}"
    );
    let requests = s.fake.model_requests().len();
    let events = ask(&provider, "/cost", Some(&session)).await;
    s.print_log();
    let results = results(&events);
    assert_eq!(results.len(), 1, "{events:#?}");
    assert!(results[0].0.contains("cost"), "{results:?}");
    assert_eq!(
        s.fake.model_requests().len(),
        requests,
        "no model call for /cost"
    );
    provider.shutdown().await;
}

/// ask_user_question blocks in mcp-tools until the answer row arrives; Claude waits (its tool
/// timeout is set above the tool's) and the answer reaches the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn question_round_trip_through_mcp_tools() {
    let Some(cli) = start::<Cli>("question_round_trip_through_mcp_tools") else {
        return;
    };
    let s = setup::<Cli>("claude", cli);
    s.fake.push_all([
        Step::tool_call(
            "ask_user_question",
            json!({"question": "Deploy now?", "options": ["Yes", "No"]}),
        ),
        Step::text("deploying"),
    ]);
    let provider = s.provider::<Cli>();
    let mut query = provider.query(input("ask me", None)).unwrap();
    until(&mut query, |e| matches!(e, ProviderEvent::Activity { tool: Some(t), .. } if t.ends_with("ask_user_question"))).await;
    let question_id = question_id(&s.db, Duration::from_secs(20)).await;
    // The turn stays open while the question waits.
    let quiet = tokio::time::timeout(Duration::from_secs(3), query.next_event()).await;
    assert!(
        !matches!(
            quiet,
            Ok(Some(ProviderEvent::Result { .. }) | Some(ProviderEvent::Error { .. }) | None)
        ),
        "the turn ended while the question was open: {quiet:?}"
    );
    answer(&s.db, &question_id, "Yes");
    let mut events = until(&mut query, ends_turn).await;
    query.end();
    events.extend(drain(&mut query).await);
    s.print_log();
    assert_eq!(results(&events), vec![("deploying".to_owned(), 0)]);
    let request = s.fake.model_requests().pop().unwrap();
    let output = request.tool_results().join("\n");
    assert!(
        output.contains("Yes"),
        "the answer reached the model: {output}"
    );
    provider.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Usage, interrupt, text as it is written, turn limit, model per query (issues 14 and 15)
// ---------------------------------------------------------------------------------------------

/// Every `Interrupted` as (covers, reason, usage).
fn interruptions(events: &[ProviderEvent]) -> Vec<(PromptId, InterruptReason, Option<Usage>)> {
    events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::Interrupted {
                covers,
                reason,
                usage,
            } => Some((*covers, *reason, usage.clone())),
            _ => None,
        })
        .collect()
}

/// A turn of a text block with a tool call (one message), then a final text: the text arrives
/// as `Text` before the tool ends, the tool call names its command, and the result carries the
/// sum of the two requests' scripted usage, once, with the model and a cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_before_a_tool_and_the_usage_of_a_multi_step_turn() {
    let Some(cli) = start::<Cli>("text_before_a_tool_and_the_usage_of_a_multi_step_turn") else {
        return;
    };
    let s = setup::<Cli>("claude", cli);
    let first = StepUsage {
        input: 100,
        output: 40,
        cache_read: 7,
        cache_write: 3,
        reasoning: 0,
    };
    let second = StepUsage {
        input: 200,
        output: 60,
        cache_read: 11,
        cache_write: 0,
        reasoning: 0,
    };
    s.fake.push_all([
        Step::reply([
            Step::text("<message to=\"ops\">deploying</message>"),
            Step::raw_tool_call("Bash", json!({"command": "sleep 2", "description": "wait"})),
        ])
        .usage(first),
        Step::text("all done").usage(second),
    ]);
    let provider = s.provider::<Cli>();
    let events = ask(&provider, "deploy", None).await;
    s.print_log();
    let text = events
        .iter()
        .position(|e| matches!(e, ProviderEvent::Text { text } if text.contains("deploying")));
    let tool = events.iter().position(|e| {
        matches!(e, ProviderEvent::Activity { tool: Some(t), summary } if t == "Bash" && summary.as_deref() == Some("sleep 2"))
    });
    let ended = events
        .iter()
        .position(|e| matches!(e, ProviderEvent::ToolEnded { .. }));
    assert!(
        text.is_some() && tool.is_some() && text < ended && tool < ended,
        "Text and the Bash activity (with its command) before the tool's end: {events:#?}"
    );
    let usage = events
        .iter()
        .find_map(|e| match e {
            ProviderEvent::Result { text, usage, .. } if text == "all done" => usage.clone(),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no result with usage: {events:#?}"));
    assert_eq!(usage.input_tokens, Some(300), "{usage:?}");
    assert_eq!(usage.output_tokens, Some(100), "{usage:?}");
    assert_eq!(usage.cache_read_tokens, Some(18), "{usage:?}");
    assert_eq!(usage.cache_write_tokens, Some(3), "{usage:?}");
    assert_eq!(usage.requests, Some(2), "{usage:?}");
    assert_eq!(
        usage.model.as_deref(),
        Some("claude-test-model"),
        "{usage:?}"
    );
    assert!(
        usage.cost_usd.is_some(),
        "Claude prices every turn: {usage:?}"
    );

    // The next turn of the same process reports its own figures, not a running total.
    s.fake.push(Step::text("second").usage(first));
    let session = session_id(&events);
    let events = ask(&provider, "again", Some(&session)).await;
    let usage = events
        .iter()
        .find_map(|e| match e {
            ProviderEvent::Result { usage, .. } => usage.clone(),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no result with usage: {events:#?}"));
    assert_eq!(
        (usage.input_tokens, usage.output_tokens, usage.requests),
        (Some(100), Some(40), Some(1)),
        "{usage:?}"
    );
    provider.shutdown().await;
}

/// The runner's interrupt while the model stalls, with a push written meanwhile: `Interrupted
/// { Stopped }` within 2 s covering the first prompt only (the model never saw the push, which
/// Claude cancels instead of running it later); the process survives and the next query
/// continues the same session with its history, without the push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_during_a_stall_keeps_the_process_and_the_session() {
    let Some(cli) = start::<Cli>("interrupt_during_a_stall_keeps_the_process_and_the_session")
    else {
        return;
    };
    let s = setup::<Cli>("claude", cli);
    s.fake
        .push_all([Step::hang(), Step::text("after the stop")]);
    let provider = s.provider::<Cli>();
    let mut query = provider.query(input("first question", None)).unwrap();
    let mut events = until(&mut query, |e| matches!(e, ProviderEvent::Init { .. })).await;
    s.wait_turns(1).await;
    assert_eq!(query.push(Prompt::text("pushed meanwhile")).unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopped = Instant::now();
    query.interrupt();
    events.extend(drain(&mut query).await);
    let took = stopped.elapsed();
    s.fake.release_hangs();
    assert!(took < Duration::from_secs(2), "interrupted in {took:?}");
    let interrupted = interruptions(&events);
    assert_eq!(interrupted.len(), 1, "{events:#?}");
    assert_eq!(interrupted[0].0, 0, "the push was not seen: {events:#?}");
    assert_eq!(interrupted[0].1, InterruptReason::Stopped);
    assert!(
        results(&events).is_empty() && final_errors(&events).is_empty(),
        "{events:#?}"
    );
    assert!(
        matches!(events.last(), Some(ProviderEvent::Interrupted { .. })),
        "the stream closes after Interrupted: {events:#?}"
    );
    let pid = provider.pid().await.expect("the process survives");
    let session = session_id(&events);
    let events = ask(&provider, "next question", Some(&session)).await;
    s.print_log();
    assert_eq!(results(&events), vec![("after the stop".to_owned(), 0)]);
    assert_eq!(session_id(&events), session, "the same session");
    assert_eq!(provider.pid().await, Some(pid), "the same process");
    let request = s.turns().pop().unwrap();
    let texts = user_texts(&request).join("\n");
    assert!(texts.contains("first question"), "history kept: {texts}");
    assert!(texts.contains("next question"), "{texts}");
    assert!(
        !texts.contains("pushed meanwhile"),
        "the push never ran: {texts}"
    );
    provider.shutdown().await;
}

/// `maxTurnsPerQuery` is Claude's `--max-turns`: a turn that wants more requests ends with
/// `Interrupted { MaxTurns }` (not an error) covering its prompt, with the cost of the request
/// it made; the process and the session live on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_turns_ends_the_turn_as_interrupted() {
    let Some(cli) = start::<Cli>("max_turns_ends_the_turn_as_interrupted") else {
        return;
    };
    let mut s = setup::<Cli>("claude", cli);
    s.settings.max_turns_per_query = Some(1);
    s.fake.push_all([
        Step::raw_tool_call("Bash", json!({"command": "echo one", "description": "one"})),
        Step::text("next answer"),
    ]);
    let provider = s.provider::<Cli>();
    let mut query = provider.query(input("loop", None)).unwrap();
    let events = drain(&mut query).await;
    let interrupted = interruptions(&events);
    assert_eq!(interrupted.len(), 1, "{events:#?}");
    let (covers, reason, usage) = &interrupted[0];
    assert_eq!((*covers, *reason), (0, InterruptReason::MaxTurns));
    let usage = usage.clone().expect("the usage of the one request");
    assert_eq!(
        (usage.requests, usage.input_tokens, usage.output_tokens),
        (Some(1), Some(10), Some(5))
    );
    assert!(final_errors(&events).is_empty(), "{events:#?}");
    assert_eq!(s.turns().len(), 1, "one request only");
    let pid = provider.pid().await.expect("the process lives on");
    let session = session_id(&events);
    let events = ask(&provider, "and now?", Some(&session)).await;
    s.print_log();
    assert_eq!(results(&events), vec![("next answer".to_owned(), 0)]);
    assert_eq!(provider.pid().await, Some(pid), "the same process");
    provider.shutdown().await;
}

/// `QueryInput.model` switches the live process with Claude's `set_model` (no restart): the
/// next request names the new model; a model the API refuses ends that query with the API's
/// error and the process keeps its model; no model goes back to the configured one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_per_query_switches_by_set_model() {
    let Some(cli) = start::<Cli>("model_per_query_switches_by_set_model") else {
        return;
    };
    let s = setup::<Cli>("claude", cli);
    s.fake
        .set_known_models(Some(["claude-test-model", "claude-other-model"]));
    let provider = s.provider::<Cli>();
    let last_model = || {
        s.fake
            .model_requests()
            .iter()
            .rev()
            .find(|r| r.has_tools())
            .and_then(|r| r.model().map(str::to_owned))
    };
    let with_model = |text: &str, session: &str, model: Option<&str>| {
        let mut input = input(text, Some(session));
        input.model = model.map(str::to_owned);
        input
    };
    let events = ask(&provider, "first", None).await;
    assert_eq!(results(&events).len(), 1, "{events:#?}");
    assert_eq!(last_model().as_deref(), Some("claude-test-model"));
    let session = session_id(&events);
    let pid = provider.pid().await.unwrap();

    let events = ask_with(
        &provider,
        with_model("second", &session, Some("claude-other-model")),
    )
    .await;
    assert_eq!(results(&events).len(), 1, "{events:#?}");
    assert_eq!(last_model().as_deref(), Some("claude-other-model"));
    assert_eq!(
        provider.pid().await,
        Some(pid),
        "switched without a restart"
    );

    let turns = s.turns().iter().filter(|r| r.has_tools()).count();
    let events = ask_with(
        &provider,
        with_model("third", &session, Some("claude-no-such-model")),
    )
    .await;
    s.print_log();
    let errors = final_errors(&events);
    assert_eq!(errors.len(), 1, "{events:#?}");
    assert!(
        errors[0].2.contains("claude-no-such-model"),
        "the error names the model: {errors:?}"
    );
    assert!(results(&events).is_empty(), "{events:#?}");
    assert_eq!(
        s.turns().iter().filter(|r| r.has_tools()).count(),
        turns,
        "the prompt did not run"
    );
    assert_eq!(provider.pid().await, Some(pid), "the process lives on");

    let events = ask_with(&provider, with_model("fourth", &session, None)).await;
    assert_eq!(results(&events).len(), 1, "{events:#?}");
    assert_eq!(
        last_model().as_deref(),
        Some("claude-test-model"),
        "back to the configured model"
    );
    let request = s.turns().pop().unwrap();
    let texts = user_texts(&request).join("\n");
    assert!(
        texts.contains("first") && texts.contains("second") && texts.contains("fourth"),
        "one session across the switches: {texts}"
    );
    provider.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Issue 16: the tool policy, approvals and approval stops
// ---------------------------------------------------------------------------------------------

/// `deny: ["Bash(rm *)", "Read(/etc/*)"]`: `rm -rf target` is refused by Claude's own deny
/// list, `Read /etc/hostname` by the driver's `PreToolUse` hook; the directory survives, each
/// refusal is one `ToolDenied`, and the model gets both refusals as tool results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_calls_do_not_run_and_the_model_gets_the_refusal() {
    let Some(cli) = start::<Cli>("denied_calls_do_not_run_and_the_model_gets_the_refusal") else {
        return;
    };
    let mut s = setup::<Cli>("claude", cli);
    s.settings.tool_policy.deny = rules(&["Bash(rm *)", "Read(/etc/*)"]);
    let target = s.settings.agent_dir.join("target");
    std::fs::create_dir_all(&target).unwrap();
    s.fake.push_all([
        shell_step("claude", "rm -rf target"),
        Step::raw_tool_call("Read", json!({"file_path": "/etc/hostname"})),
        Step::text("gave up"),
    ]);
    let provider = s.provider::<Cli>();
    let events = ask(&provider, "clean up", None).await;
    s.print_log();
    assert_eq!(results(&events), vec![("gave up".to_owned(), 0)]);
    assert!(target.is_dir(), "the directory survives");
    assert_eq!(
        tool_denials(&events),
        vec![
            ("Bash".to_owned(), Some("rm -rf target".to_owned())),
            ("Read".to_owned(), Some("/etc/hostname".to_owned())),
        ]
    );
    let requests = s.fake.model_requests();
    assert_eq!(requests.len(), 3);
    let refusals = requests[2].tool_results();
    assert!(
        refusals[0].contains("denied") && refusals[1].contains("tool policy"),
        "{refusals:?}"
    );
    provider.shutdown().await;
}

/// `ask: ["Bash"]`: the call waits for the runner's answer (an `ApprovalRequest` naming the
/// whole command); Allow runs it, Deny (next query, same process) leaves the file system
/// unchanged and the model gets the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asked_calls_wait_for_the_answer() {
    let Some(cli) = start::<Cli>("asked_calls_wait_for_the_answer") else {
        return;
    };
    let mut s = setup::<Cli>("claude", cli);
    s.settings.tool_policy.ask = rules(&["Bash"]);
    s.fake.push_all([
        shell_step("claude", "touch approved.txt"),
        Step::text("made it"),
        shell_step("claude", "touch refused.txt"),
        Step::text("could not"),
    ]);
    let provider = s.provider::<Cli>();
    let agent_dir = s.settings.agent_dir.clone();

    let mut session = None;
    for (file, answer, reply) in [
        ("approved.txt", ApprovalAnswer::Allow, "made it"),
        (
            "refused.txt",
            ApprovalAnswer::Deny {
                reason: "denied by the user".into(),
            },
            "could not",
        ),
    ] {
        let (mut query, mut events, asked) = query_until_approval(
            &provider,
            input("touch a file", session.as_deref()),
            EVENT_TIMEOUT,
        )
        .await;
        let touch = format!("touch {file}");
        assert_eq!(
            (
                asked.tool.as_str(),
                asked.summary.as_deref(),
                asked.argument.as_deref()
            ),
            ("Bash", Some(touch.as_str()), Some(touch.as_str()))
        );
        // The CLI waits: nothing ran, no further model request.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!agent_dir.join(file).exists());
        events.extend(answer_approval(&mut query, &asked.id, answer, EVENT_TIMEOUT).await);
        assert_eq!(results(&events), vec![(reply.to_owned(), 0)], "{events:#?}");
        session = Some(session_id(&events));
    }
    s.print_log();
    assert!(agent_dir.join("approved.txt").exists(), "approved: it ran");
    assert!(
        !agent_dir.join("refused.txt").exists(),
        "denied: it did not"
    );
    let last = s.fake.model_requests().pop().unwrap();
    let outputs = last.tool_results();
    assert!(
        outputs
            .last()
            .is_some_and(|r| r.contains("denied by the user")),
        "{outputs:?}"
    );
    provider.shutdown().await;
}

/// A call still waiting when the runner interrupts does not run and the CLI does not hang on
/// it: the turn ends `Interrupted { Stopped }` without another model request, and the next query
/// runs on the same process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_call_is_refused_when_the_turn_is_interrupted() {
    let Some(cli) = start::<Cli>("an_unanswered_call_is_refused_when_the_turn_is_interrupted")
    else {
        return;
    };
    let mut s = setup::<Cli>("claude", cli);
    s.settings.tool_policy.ask = rules(&["Bash"]);
    s.fake.push_all([
        shell_step("claude", "touch never.txt"),
        Step::text("after the stop"),
    ]);
    let provider = s.provider::<Cli>();
    let mut query = provider.query(input("touch it", None)).unwrap();
    let mut events = until(&mut query, is_approval_request).await;
    query.interrupt();
    events.extend(drain(&mut query).await);
    let pid = provider.pid().await;
    assert!(pid.is_some(), "the process outlives the interrupt");
    assert!(
        events.iter().any(|e| matches!(
            e,
            ProviderEvent::Interrupted {
                reason: InterruptReason::Stopped,
                ..
            }
        )),
        "{events:#?}"
    );
    assert!(!s.settings.agent_dir.join("never.txt").exists());
    assert_eq!(
        s.fake.model_requests().len(),
        1,
        "the refusal did not reach the model"
    );
    let events = ask(&provider, "carry on", Some(&session_id(&events))).await;
    s.print_log();
    assert_eq!(results(&events), vec![("after the stop".to_owned(), 0)]);
    assert_eq!(provider.pid().await, pid, "the process lives on");
    provider.shutdown().await;
}

/// `approvalStopTools: ["mcp__nanoclaw__send_message"]`: the turn ends right after the tool's
/// result (`Interrupted { ApprovalStop }` covering the prompt) with NO model request after it;
/// the process lives on and the next prompt continues the same session, with the tool result
/// in its history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_stop_ends_the_turn_after_the_tool_result() {
    let Some(cli) = start::<Cli>("an_approval_stop_ends_the_turn_after_the_tool_result") else {
        return;
    };
    let mut s = setup::<Cli>("claude", cli);
    s.settings.approval_stop_tools = vec!["mcp__nanoclaw__send_message".into()];
    s.fake.push_all([
        Step::tool_call(
            "send_message",
            json!({"text": "the plan: step 1", "channel": "slack", "platformId": "C1"}),
        ),
        Step::text("approved, carrying on"),
    ]);
    let provider = s.provider::<Cli>();
    let mut query = provider.query(input("make a plan", None)).unwrap();
    let events = drain(&mut query).await;
    assert!(
        matches!(
            events.last(),
            Some(ProviderEvent::Interrupted {
                covers: 0,
                reason: InterruptReason::ApprovalStop,
                usage: Some(_),
            })
        ),
        "{events:#?}"
    );
    assert!(
        results(&events).is_empty(),
        "no reply of its own: {events:#?}"
    );
    let session = session_id(&events);
    let pid = provider.pid().await;
    assert_eq!(
        s.fake.model_requests().len(),
        1,
        "no request after the tool result"
    );

    let events = ask(&provider, "approved", Some(&session)).await;
    s.print_log();
    assert_eq!(
        results(&events),
        vec![("approved, carrying on".to_owned(), 0)]
    );
    assert_eq!(session_id(&events), session);
    assert_eq!(provider.pid().await, pid, "the same process");
    let requests = s.fake.model_requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].last_user_text().as_deref(), Some("approved"));
    assert!(
        requests[1]
            .tool_results()
            .iter()
            .any(|r| !r.contains("rror")),
        "the tool's result is in the history: {:?}",
        requests[1].tool_results()
    );
    provider.shutdown().await;
}

/// With the policy's hooks to register, a stored continuation Claude does not have (it exits
/// before reading the `initialize`) still starts a new session for the same prompt, which then
/// runs under the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_continuation_with_a_policy_starts_a_new_session() {
    let Some(cli) = start::<Cli>("a_stale_continuation_with_a_policy_starts_a_new_session") else {
        return;
    };
    let mut s = setup::<Cli>("claude", cli);
    s.settings.tool_policy.deny = rules(&["Read(/etc/*)"]);
    s.fake.push(Step::text("fresh answer"));
    let provider = s.provider::<Cli>();
    e2e::provider_scenarios::assert_stale_continuation_replaced(
        &s,
        &provider,
        "11111111-2222-4333-8444-555555555555",
        "not found",
    )
    .await;
    provider.shutdown().await;
}
