//! The Codex provider driven directly (no runner) against the REAL pinned `codex` CLI
//! (`codex app-server`), the scripted fake model server and the real `mcp-tools`.
//!
//! * The CLI: `$CODEX_PATH` or `<repo>/.cli/node_modules/.bin/codex` (`scripts/install-clis.sh`).
//!   A missing CLI FAILS the tests; `NANOCLAW_SKIP_CLI_TESTS=1` skips them instead.
//! * mcp-tools: `$MCP_TOOLS_PATH` or `<target>/debug/mcp-tools`, built on demand.
//! * Isolation: when `unshare -n` works (root here), each test re-executes itself inside a
//!   loopback-only network namespace (`NANOCLAW_NETNS=0` disables that), so nothing can leave
//!   the machine; the CLI runs with the traffic-off configuration in any case.
//! * Fixtures: with `NANOCLAW_CODEX_CAPTURE=<dir>` each test records the provider's JSON-RPC
//!   transcript to `<dir>/<test>.jsonl` (see `provider/tests/fixtures/codex/README.md`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use e2e::fake_model::{Step, StepUsage};
use e2e::harness::codex_user_texts as user_texts;
use e2e::harness::{descendants, live_processes};
use e2e::provider_harness::{
    ask, ask_with, drain, drain_for, ends_turn, final_errors, input, is_result, results,
    session_id, until, ProviderSetup,
};
use e2e::provider_scenarios::{
    assert_first_text_reply, resume_after_a_restart, setup, start,
    system_prompt_change_reaches_the_model, ApiErrorCase, ExpectedClass, WatchdogCase,
};
use provider::codex::CodexProvider;
use provider::{AgentProvider, ErrorClass, InterruptReason, Prompt, ProviderEvent, Usage};
use serde_json::json;

/// The provider under test (its settings: `CliProvider::SPEC`).
type Cli = CodexProvider;

// ---------------------------------------------------------------------------------------------
// Scenarios shared with the other CLIs (e2e::provider_scenarios)
// ---------------------------------------------------------------------------------------------

e2e::provider_scenario_tests! { Cli;
    /// The model calls send_message: mcp-tools writes the row.
    send_message_through_mcp_tools_writes_a_row("mcp__nanoclaw__send_message");

    /// A stored thread that no longer exists: a notice, a new thread, the same prompt answered.
    stale_continuation_starts_a_new_session(
        "01a1fdf0-9061-7652-b74d-000000000000",
        "starting a new one"
    );

    /// 500, 429 (with `retry-after`) and 401: bounded retries, one classified error each; the
    /// next message is answered normally, on the same thread.
    api_errors_are_bounded_and_classified(api_error_cases(), Duration::from_secs(60), None);

    /// The app-server killed during the session's first turn: a retryable Process error; the
    /// next query resumes the thread in a new process.
    killed_cli_is_reported_and_the_next_query_resumes("process_killed", false);

    /// A silent turn is stopped by the 2 s watchdog; an app-server that sat idle longer than
    /// the watchdog between queries is not hung.
    watchdog_kills_a_silent_turn(WatchdogCase {
        watchdog: Duration::from_secs(2),
        silence: Step::hang_before_response().timeout_ms(30_000),
        within: Duration::from_secs(15),
        idle_first: true,
        stops_the_process: true,
    });

    /// Abort interrupts a hanging turn and keeps the app-server.
    abort_interrupts_the_turn_and_keeps_the_process(Step::hang().timeout_ms(20_000), false);

    /// The agent's `exec_command env` sees neither the API key nor a host secret.
    shell_never_sees_the_api_key_or_host_secrets(
        Step::raw_tool_call("exec_command", json!({"cmd": "env"}))
    );

    /// Codex starts each MCP server in a process group of its own (measured), so the provider
    /// must stop them beyond the group kill. (Unlike Claude's, Codex's provider does not refuse
    /// a query after shutdown.)
    shutdown_stops_codex_and_its_mcp_servers = shutdown_stops_the_cli_and_its_mcp_servers(false);
}

/// (status, retry-after header, class, retryable): a 429 is a passing rate limit, retryable by
/// the runner; Codex honours the header but does not report the wait. Up to 4 requests a turn;
/// Codex's retry notices are not checked.
fn api_error_cases() -> Vec<ApiErrorCase> {
    let case = |label, step, class, retryable| ApiErrorCase {
        label,
        step,
        class: ExpectedClass::Is(class),
        retryable,
        message_contains: None,
        requests: 1..=4,
        notices: 0..=usize::MAX,
        notice_class: None,
    };
    vec![
        case(
            "500",
            Step::error(500, "fake 500 error"),
            ErrorClass::Api,
            false,
        ),
        // Codex honours `retry-after` in seconds (it ignores `retry-after-ms`: no retry).
        case(
            "429",
            Step::error(429, "fake 429 error").retry_after_secs(1),
            ErrorClass::RATE_LIMITED,
            true,
        ),
        case(
            "401",
            Step::error(401, "fake 401 error"),
            ErrorClass::Auth,
            false,
        ),
    ]
}

#[test]
fn missing_cli_is_a_spawn_error_naming_codex_path() {
    e2e::provider_scenarios::missing_cli_is_a_spawn_error_naming_its_path::<Cli>();
}

// ---------------------------------------------------------------------------------------------
// Tests only Codex has
// ---------------------------------------------------------------------------------------------

/// A query "first message" whose first answer hangs; "second message" is pushed (prompt 1)
/// once the model has the request, and the model then answers `answer`. Returns the provider
/// and every event of the query.
async fn push_while_the_model_hangs(
    s: &ProviderSetup,
    answer: &str,
) -> (CodexProvider, Vec<ProviderEvent>) {
    s.fake
        .push_all([Step::hang().timeout_ms(20_000), Step::text(answer)]);
    let provider = s.provider::<Cli>();
    let mut query = provider.query(input("first message", None)).unwrap();
    until(&mut query, |e| matches!(e, ProviderEvent::Init { .. })).await;
    s.fake
        .wait_for_model_requests(1, Duration::from_secs(20))
        .unwrap();
    assert_eq!(query.push(Prompt::text("second message")).unwrap(), 1);
    let mut events = until(&mut query, is_result).await;
    query.end();
    events.extend(drain(&mut query).await);
    s.print_log();
    (provider, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_reply_with_the_generated_config() {
    let Some(cli) = start::<Cli>("text_reply_with_the_generated_config") else {
        return;
    };
    let s = setup::<Cli>("text_reply", cli);
    s.fake
        .push(Step::text("hello from the fake model").chunks(3));
    let provider = s.provider::<Cli>();
    let events = ask(&provider, "<message id=\"1\">hi</message>", None).await;
    s.print_log();

    assert!(
        matches!(events[0], ProviderEvent::Init { .. }),
        "{events:#?}"
    );
    assert_first_text_reply::<Cli>(&s, &events, "/v1/responses");
    // The unknown-slug warning is a notice, not an error.
    assert!(
        events.iter().any(|e| matches!(e, ProviderEvent::Progress { message } if message.contains("Model metadata"))),
        "{events:#?}"
    );
    // The private CODEX_HOME holds the session.
    assert!(s.settings.home_dir.join(".codex/sessions").is_dir());
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_mid_turn_restarts_with_every_unanswered_prompt() {
    let Some(cli) = start::<Cli>("push_mid_turn_restarts_with_every_unanswered_prompt") else {
        return;
    };
    let s = setup::<Cli>("push_restart", cli);
    let (provider, events) = push_while_the_model_hangs(&s, "answer to both").await;
    assert_eq!(results(&events), vec![("answer to both".to_owned(), 1)]);
    let requests = s.fake.model_requests();
    assert_eq!(requests.len(), 2, "one restart");
    let last = user_texts(&requests[1]);
    assert_eq!(
        last.last().map(String::as_str),
        Some("first message\n\nsecond message"),
        "{last:?}"
    );
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steer_mode_injects_the_push_into_the_running_turn() {
    let Some(cli) = start::<Cli>("steer_mode_injects_the_push_into_the_running_turn") else {
        return;
    };
    let mut s = setup::<Cli>("push_steer", cli);
    s.settings.codex_steer = true;
    let (provider, events) = push_while_the_model_hangs(&s, "steered answer").await;
    assert_eq!(results(&events), vec![("steered answer".to_owned(), 1)]);
    let requests = s.fake.model_requests();
    let last = user_texts(requests.last().unwrap());
    assert_eq!(
        last,
        vec!["first message".to_owned(), "second message".to_owned()]
    );
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_after_restart_keeps_history_and_system_prompt() {
    let Some(cli) = start::<Cli>("resume_after_restart_keeps_history_and_system_prompt") else {
        return;
    };
    let s = setup::<Cli>("resume", cli);
    s.fake.push_all([
        Step::text("first answer"),
        Step::text("second answer"),
        Step::text("third answer"),
    ]);
    // A new provider (the runner restarted) resumes the stored thread.
    let (provider, thread) = resume_after_a_restart::<Cli>(&s).await;

    // A changed system prompt reaches the model after a resume too.
    provider.shutdown().await;
    let provider = s.provider::<Cli>();
    system_prompt_change_reaches_the_model(&s, &provider, &thread).await;
    s.print_log();
    provider.shutdown().await;
}

/// `/clear` makes the runner drop the continuation: the new thread gets a fresh app-server (a
/// loaded thread keeps its MCP server running even after `thread/unsubscribe`), and the old
/// thread can still be resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_session_gets_a_fresh_process_and_old_ones_resume() {
    let Some(cli) = start::<Cli>("new_session_gets_a_fresh_process_and_old_ones_resume") else {
        return;
    };
    let s = setup::<Cli>("new_session", cli);
    s.fake
        .push_all([Step::text("one"), Step::text("two"), Step::text("three")]);
    let provider = s.provider::<Cli>();
    let first = session_id(&ask(&provider, "first session", None).await);
    let pid = provider.pid().await.unwrap();
    let second_events = ask(&provider, "second session", None).await;
    let second = session_id(&second_events);
    assert_ne!(first, second);
    let new_pid = provider.pid().await.unwrap();
    assert_ne!(new_pid, pid, "a fresh process");
    assert!(
        live_processes().iter().all(|(p, ..)| *p != pid),
        "the old process is gone"
    );
    let mcp: Vec<_> = descendants(new_pid)
        .into_iter()
        .filter(|(_, cmd)| cmd.contains("mcp-tools"))
        .collect();
    assert_eq!(
        mcp.len(),
        1,
        "only the current thread's mcp-tools runs: {mcp:?}"
    );
    let request = s.fake.model_requests().pop().unwrap();
    assert_eq!(
        user_texts(&request),
        vec!["second session".to_owned()],
        "no history of the first"
    );

    let events = ask(&provider, "back to the first", Some(&first)).await;
    assert_eq!(session_id(&events), first);
    let request = s.fake.model_requests().pop().unwrap();
    assert_eq!(
        user_texts(&request),
        vec!["first session".to_owned(), "back to the first".to_owned()]
    );
    provider.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Usage, stop, text as it is written, step limit, model per query (issues 14 and 15)
// ---------------------------------------------------------------------------------------------

/// The events' turn-ending usage figures (`Result`, `Interrupted`, final `Error`).
fn turn_usage(events: &[ProviderEvent]) -> Vec<Option<Usage>> {
    events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::Result { usage, .. }
            | ProviderEvent::Interrupted { usage, .. }
            | ProviderEvent::Error {
                usage,
                ends_turn: true,
                ..
            } => Some(usage.clone()),
            _ => None,
        })
        .collect()
}

/// A turn-ending event (result, error or interrupt).
fn ends(event: &ProviderEvent) -> bool {
    ends_turn(event) || matches!(event, ProviderEvent::Interrupted { .. })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_of_a_two_step_turn_is_summed_once() {
    let Some(cli) = start::<Cli>("usage_of_a_two_step_turn_is_summed_once") else {
        return;
    };
    let s = setup::<Cli>("usage", cli);
    let tool = StepUsage {
        input: 120,
        output: 30,
        cache_read: 64,
        cache_write: 0,
        reasoning: 11,
    };
    let text = StepUsage {
        input: 7,
        output: 9,
        cache_read: 200,
        cache_write: 0,
        reasoning: 0,
    };
    s.fake.push_all([
        Step::raw_tool_call("exec_command", json!({"cmd": "echo hi"})).usage(tool),
        Step::text("done").usage(text),
    ]);
    let provider = s.provider::<Cli>();
    let events = ask(&provider, "run it", None).await;
    s.print_log();
    assert_eq!(results(&events).len(), 1, "{events:#?}");
    assert_eq!(
        turn_usage(&events),
        vec![Some(Usage {
            input_tokens: Some(127),
            output_tokens: Some(39),
            cache_read_tokens: Some(264),
            // Codex reports the figure (0: the Responses API has none).
            cache_write_tokens: Some(0),
            reasoning_tokens: Some(11),
            cost_usd: None,
            model: Some("fake-model".into()),
            requests: Some(2),
        })]
    );
    // The tool is named in the canonical vocabulary, with its command line.
    assert!(
        events.iter().any(|e| matches!(e, ProviderEvent::Activity { tool: Some(t), summary: Some(c) } if t == "Bash" && c == "echo hi")),
        "{events:#?}"
    );
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_ends_a_stalled_turn_and_the_thread_lives_on() {
    let Some(cli) = start::<Cli>("interrupt_ends_a_stalled_turn_and_the_thread_lives_on") else {
        return;
    };
    let s = setup::<Cli>("interrupt", cli);
    // The push restarts the turn (abort-and-restart), which may reach the model before the
    // stop: that request stalls too.
    s.fake.push_all([
        Step::hang().timeout_ms(30_000),
        Step::hang().timeout_ms(30_000),
    ]);
    let provider = s.provider::<Cli>();
    let mut query = provider.query(input("first message", None)).unwrap();
    let thread = session_id(&until(&mut query, |e| matches!(e, ProviderEvent::Init { .. })).await);
    s.fake
        .wait_for_model_requests(1, Duration::from_secs(20))
        .unwrap();
    let pid = provider.pid().await.unwrap();
    // Pushed while the model stalls; the restarted turn (both prompts) stalls too; then the
    // stop: the push, never acted on, is not covered (the runner runs it again).
    assert_eq!(query.push(Prompt::text("pushed message")).unwrap(), 1);
    s.fake
        .wait_for_model_requests(2, Duration::from_secs(20))
        .unwrap();
    let asked = std::time::Instant::now();
    query.interrupt();
    let events = drain_for(&mut query, Duration::from_secs(5)).await;
    let took = asked.elapsed();
    s.print_log();
    assert!(took < Duration::from_secs(2), "stopped in {took:?}");
    let stopped: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::Interrupted { covers, reason, .. } => Some((*covers, *reason)),
            _ => None,
        })
        .collect();
    assert_eq!(stopped, vec![(0, InterruptReason::Stopped)], "{events:#?}");
    assert!(results(&events).is_empty(), "{events:#?}");
    assert_eq!(provider.pid().await, Some(pid), "the app-server lives on");

    // The next query continues the same thread: the model sees the earlier message.
    s.fake.set_script([Step::text("after the stop")]);
    s.fake.release_hangs();
    let events = ask(&provider, "next message", Some(&thread)).await;
    assert_eq!(session_id(&events), thread);
    assert_eq!(results(&events), vec![("after the stop".to_owned(), 0)]);
    let request = s.fake.model_requests().pop().unwrap();
    let texts = user_texts(&request);
    assert_eq!(
        texts.first().map(String::as_str),
        Some("first message"),
        "{texts:?}"
    );
    assert_eq!(
        texts.last().map(String::as_str),
        Some("next message"),
        "{texts:?}"
    );
    assert_eq!(provider.pid().await, Some(pid), "the same process");
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_is_delivered_before_the_tool_ends() {
    let Some(cli) = start::<Cli>("text_is_delivered_before_the_tool_ends") else {
        return;
    };
    let s = setup::<Cli>("text_before_tool", cli);
    let block = "<message to=\"ops\">deploying</message>";
    s.fake.push_all([
        Step::reply([
            Step::text(block),
            Step::raw_tool_call("exec_command", json!({"cmd": "sleep 3"})),
        ]),
        Step::text("all done"),
    ]);
    let provider = s.provider::<Cli>();
    let mut query = provider.query(input("deploy", None)).unwrap();
    let before = until(&mut query, |e| matches!(e, ProviderEvent::Text { .. })).await;
    let text_at = std::time::Instant::now();
    let mut rest = until(&mut query, ends).await;
    let ended_at = std::time::Instant::now();
    query.end();
    rest.extend(drain(&mut query).await);
    s.print_log();
    assert!(
        matches!(before.last(), Some(ProviderEvent::Text { text }) if text == block),
        "{before:#?}"
    );
    assert!(
        !before
            .iter()
            .any(|e| matches!(e, ProviderEvent::ToolEnded { .. })),
        "the text came before the tool ended: {before:#?}"
    );
    assert!(
        ended_at - text_at > Duration::from_secs(2),
        "the text came while the tool ran"
    );
    assert_eq!(results(&rest), vec![("all done".to_owned(), 0)]);
    let texts: Vec<_> = rest
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, vec!["all done"], "each piece once");
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_turns_interrupts_a_turn_that_asks_for_more() {
    let Some(cli) = start::<Cli>("max_turns_interrupts_a_turn_that_asks_for_more") else {
        return;
    };
    let mut s = setup::<Cli>("max_turns", cli);
    s.settings.max_turns_per_query = Some(2);
    s.fake.push_all([
        Step::raw_tool_call("exec_command", json!({"cmd": "echo one"})),
        Step::raw_tool_call("exec_command", json!({"cmd": "echo two"})),
        Step::raw_tool_call("exec_command", json!({"cmd": "echo three"})),
    ]);
    let provider = s.provider::<Cli>();
    let pid;
    let thread;
    {
        let mut query = provider.query(input("loop", None)).unwrap();
        let events = drain_for(&mut query, Duration::from_secs(30)).await;
        s.print_log();
        thread = session_id(&events);
        let stopped: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                ProviderEvent::Interrupted { reason, usage, .. } => {
                    Some((*reason, usage.as_ref().and_then(|u| u.requests)))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            stopped,
            vec![(InterruptReason::MaxTurns, Some(2))],
            "{events:#?}"
        );
        assert!(results(&events).is_empty(), "{events:#?}");
        pid = provider.pid().await.unwrap();
    }
    // The third request may have started before the interrupt; no fourth one.
    let requests = s.fake.model_requests().len();
    assert!((2..=3).contains(&requests), "{requests} requests");
    // The thread and the process live on.
    s.fake.set_script([Step::text("next answer")]);
    let events = ask(&provider, "again", Some(&thread)).await;
    assert_eq!(session_id(&events), thread);
    assert_eq!(results(&events), vec![("next answer".to_owned(), 0)]);
    assert_eq!(provider.pid().await, Some(pid));
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_query_model_reaches_the_request_and_an_unknown_one_is_an_error() {
    let Some(cli) =
        start::<Cli>("the_query_model_reaches_the_request_and_an_unknown_one_is_an_error")
    else {
        return;
    };
    let s = setup::<Cli>("model", cli);
    s.fake.set_known_models(Some(["fake-model", "other-model"]));
    s.fake
        .push_all([Step::text("from other"), Step::text("from default")]);
    let provider = s.provider::<Cli>();
    let mut chosen = input("use the other model", None);
    chosen.model = Some("other-model".into());
    let events = ask_with(&provider, chosen).await;
    let thread = session_id(&events);
    assert_eq!(results(&events), vec![("from other".to_owned(), 0)]);
    assert_eq!(
        turn_usage(&events)[0]
            .as_ref()
            .and_then(|u| u.model.clone())
            .as_deref(),
        Some("other-model")
    );
    assert_eq!(
        s.fake.model_requests().pop().unwrap().model(),
        Some("other-model")
    );

    // An unknown model: the API's refusal is the turn's error.
    let mut unknown = input("use a bad model", Some(&thread));
    unknown.model = Some("no-such-model".into());
    let events = ask_with(&provider, unknown).await;
    let errors = final_errors(&events);
    assert_eq!(errors.len(), 1, "{events:#?}");
    assert!(errors[0].2.contains("no-such-model"), "{errors:?}");

    // Without a choice the configured model answers again (turn/start's model sticks to the
    // thread, so it is sent every turn).
    let events = ask(&provider, "back to default", Some(&thread)).await;
    s.print_log();
    assert_eq!(results(&events), vec![("from default".to_owned(), 0)]);
    assert_eq!(
        s.fake.model_requests().pop().unwrap().model(),
        Some("fake-model")
    );
    provider.shutdown().await;
}
