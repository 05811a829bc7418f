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
//!   transcript to `<dir>/<test>.jsonl` (see `drivers/codex/tests/fixtures/codex/README.md`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use codex::CodexProvider;
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

/// Each archive after a query reads back only the newest turns (one `thread/turns/list` page,
/// newest first), never the whole thread, so what archiving costs the runner does not grow with
/// the conversation; the archives still hold every query once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_archive_reads_only_the_newest_turns() {
    let Some(cli) = start::<Cli>("each_archive_reads_only_the_newest_turns") else {
        return;
    };
    const QUERIES: usize = 6;
    let s = setup::<Cli>("archive_pages", cli);
    s.fake
        .push_all((1..=QUERIES).map(|n| Step::text(format!("answer number {n}"))));
    let provider = s.provider::<Cli>();
    let rpc = s.dir.path().join("rpc.jsonl");
    provider
        .record_transcript(provider::recording::Recording::new(&rpc))
        .unwrap();
    let mut thread: Option<String> = None;
    for n in 1..=QUERIES {
        let text = format!("<message id=\"{n}\">question number {n}</message>");
        let events = ask(&provider, &text, thread.as_deref()).await;
        thread = Some(session_id(&events));
    }
    // Shutting down waits for the last query's archive.
    provider.shutdown().await;
    s.print_log();

    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&rpc)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let requests = |method: &str| -> Vec<serde_json::Value> {
        lines
            .iter()
            .filter(|l| l["out"]["method"] == method)
            .map(|l| l["out"].clone())
            .collect()
    };
    let pages = requests("thread/turns/list");
    // One archive per query (fewer if queries ended while one ran: they share the next).
    let archives = requests("thread/read").len();
    assert!((1..=QUERIES).contains(&archives), "{archives} archives");
    assert_eq!(pages.len(), archives, "one page per archive: {pages:#?}");
    assert!(
        requests("thread/read")
            .iter()
            .all(|r| r["params"]["includeTurns"] == json!(false)),
        "the whole thread is never read: {:#?}",
        requests("thread/read")
    );
    let last_id = &pages[archives - 1]["id"];
    let answer = lines
        .iter()
        .find(|l| &l["in"]["id"] == last_id && l["in"]["result"].is_object())
        .map(|l| l["in"]["result"].clone())
        .unwrap();
    let turns = answer["data"].as_array().unwrap();
    assert!(turns.len() < QUERIES, "a page, not the thread: {answer:#}");
    assert!(
        turns[0].to_string().contains("question number 6"),
        "newest first: {answer:#}"
    );

    let conversations = s.settings.agent_dir.join("conversations");
    let mut archived = String::new();
    for entry in std::fs::read_dir(&conversations).unwrap() {
        archived += &std::fs::read_to_string(entry.unwrap().path()).unwrap();
    }
    for n in 1..=QUERIES {
        // (The prompt in its XML: the first one is also the archive's title.)
        for text in [
            format!(">question number {n}<"),
            format!("answer number {n}"),
        ] {
            assert_eq!(archived.matches(&text).count(), 1, "{text}: {archived}");
        }
    }
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

// ---------------------------------------------------------------------------------------------
// Tool policy, approvals, approval stops (issue 16)
// ---------------------------------------------------------------------------------------------

fn policy(deny: &[&str], ask: &[&str]) -> provider::ToolPolicy {
    let rules = |list: &[&str]| {
        list.iter()
            .map(|r| provider::ToolRule::parse(r).unwrap())
            .collect()
    };
    provider::ToolPolicy {
        deny: rules(deny),
        ask: rules(ask),
        ..provider::ToolPolicy::default()
    }
}

/// Codex's shell tool running `command`.
fn shell(command: &str) -> Step {
    Step::raw_tool_call("exec_command", json!({ "cmd": command }))
}

/// The approval requests among the events.
fn approval_requests(events: &[ProviderEvent]) -> Vec<provider::ApprovalRequest> {
    events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::ApprovalRequest(request) => Some(request.clone()),
            _ => None,
        })
        .collect()
}

/// Events until the query's first `ApprovalRequest`, and that request.
async fn first_approval(
    query: &mut provider::AgentQuery,
) -> (Vec<ProviderEvent>, provider::ApprovalRequest) {
    let events = until(query, |e| matches!(e, ProviderEvent::ApprovalRequest(_))).await;
    let request = approval_requests(&events).remove(0);
    (events, request)
}

/// Answers `request`, then reads the query to its end into `events`.
async fn answer_and_finish(
    query: &mut provider::AgentQuery,
    request: &provider::ApprovalRequest,
    answer: provider::ApprovalAnswer,
    events: &mut Vec<ProviderEvent>,
) {
    assert!(query.approver().answer(&request.id, answer));
    events.extend(until(query, ends_turn).await);
    query.end();
    events.extend(drain(query).await);
}

/// `deny: ["Bash(rm *)"]`: Codex (under `untrusted`) hands the command over, the driver
/// declines it: the directory survives, the model reads the refusal, the runner hears of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_command_never_runs_and_the_model_reads_the_refusal() {
    let Some(cli) = start::<Cli>("denied_command_never_runs_and_the_model_reads_the_refusal")
    else {
        return;
    };
    let mut s = setup::<Cli>("policy_deny", cli);
    s.settings.tool_policy = policy(&["Bash(rm *)"], &[]);
    let target = s.settings.agent_dir.join("target");
    std::fs::create_dir_all(&target).unwrap();
    s.fake
        .push_all([shell("rm -rf target"), Step::text("could not delete it")]);
    let provider = s.provider::<Cli>();
    let events = ask(&provider, "delete target", None).await;
    s.print_log();
    assert!(target.is_dir(), "the directory survives");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ProviderEvent::ToolDenied { tool, summary }
            if tool == "Bash" && summary.as_deref() == Some("rm -rf target"))),
        "{events:#?}"
    );
    assert!(approval_requests(&events).is_empty(), "{events:#?}");
    assert_eq!(
        results(&events),
        vec![("could not delete it".to_owned(), 0)]
    );
    let refusal = s.fake.model_requests()[1].tool_results();
    assert!(
        refusal.iter().any(|r| r.contains("rejected")),
        "{refusal:?}"
    );
    provider.shutdown().await;
}

/// `ask: ["Bash"]`: the command waits for the runner's answer (longer than the watchdog, which
/// must not fire meanwhile); Allow runs it, Deny leaves the file system alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asked_command_waits_for_the_answer() {
    let Some(cli) = start::<Cli>("asked_command_waits_for_the_answer") else {
        return;
    };
    let mut s = setup::<Cli>("policy_ask", cli);
    s.settings.tool_policy = policy(&[], &["Bash"]);
    s.settings.watchdog = Duration::from_secs(2);
    s.fake.push_all([
        shell("touch approved.txt"),
        Step::text("made it"),
        shell("touch refused.txt"),
        Step::text("was refused"),
    ]);
    let provider = s.provider::<Cli>();
    let mut thread = None;
    for (file, answer, reply) in [
        ("approved.txt", provider::ApprovalAnswer::Allow, "made it"),
        (
            "refused.txt",
            provider::ApprovalAnswer::Deny {
                reason: "denied by the user".into(),
            },
            "was refused",
        ),
    ] {
        let mut query = provider
            .query(input(&format!("make {file}"), thread.as_deref()))
            .unwrap();
        let (mut events, request) = first_approval(&mut query).await;
        thread = Some(session_id(&events));
        assert_eq!(
            request.kind,
            provider::ApprovalKind::ToolCall {
                tool: "Bash".into(),
                summary: Some(format!("touch {file}")),
                argument: Some(format!("touch {file}")),
                undecidable: None,
            }
        );
        // Longer than the watchdog: the CLI waits for the user, it is not hung. (The running
        // command already extends the watchdog to the tool timeout; the driver also pauses it
        // while an approval is open, for ask timeouts beyond that.)
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!s.settings.agent_dir.join(file).exists());
        answer_and_finish(&mut query, &request, answer, &mut events).await;
        assert_eq!(results(&events), vec![(reply.to_owned(), 0)], "{events:#?}");
    }
    s.print_log();
    assert!(s.settings.agent_dir.join("approved.txt").exists());
    assert!(!s.settings.agent_dir.join("refused.txt").exists());
    provider.shutdown().await;
}

/// An approval still open when the runner stops the turn is declined: the command never runs,
/// the turn ends as stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_approval_is_declined_when_the_turn_is_stopped() {
    let Some(cli) = start::<Cli>("open_approval_is_declined_when_the_turn_is_stopped") else {
        return;
    };
    let mut s = setup::<Cli>("policy_stop", cli);
    s.settings.tool_policy = policy(&[], &["Bash"]);
    s.fake
        .push_all([shell("touch never.txt"), Step::text("unexpected")]);
    let provider = s.provider::<Cli>();
    let mut query = provider.query(input("make it", None)).unwrap();
    until(&mut query, |e| {
        matches!(e, ProviderEvent::ApprovalRequest(_))
    })
    .await;
    query.interrupt();
    let events = drain_for(&mut query, Duration::from_secs(5)).await;
    s.print_log();
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
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!s.settings.agent_dir.join("never.txt").exists());
    provider.shutdown().await;
}

/// An approval-stop tool: its result is delivered (the row is written), the turn ends with
/// `Interrupted(ApprovalStop)` and no model request follows; the next prompt continues the
/// thread and the model then reads the tool's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_stop_tool_ends_the_turn_after_its_result() {
    approval_stop(
        "approval_stop_tool_ends_the_turn_after_its_result",
        Duration::ZERO,
    )
    .await;
}

/// The same with every `turn/interrupt` sent a second late (a driver slowed by load; Codex's
/// next model request follows the tool's result within ~20 ms): the approval-stop hook holds
/// Codex until the interrupt ends the turn, so still no model request follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_stop_holds_codex_until_a_late_interrupt() {
    approval_stop(
        "approval_stop_holds_codex_until_a_late_interrupt",
        Duration::from_millis(1000),
    )
    .await;
}

async fn approval_stop(test: &str, interrupt_delay: Duration) {
    let Some(cli) = start::<Cli>(test) else {
        return;
    };
    let mut s = setup::<Cli>("approval_stop", cli);
    s.settings.approval_stop_tools = vec!["mcp__nanoclaw__send_message".into()];
    s.fake.push_all([
        Step::tool_call("send_message", json!({ "text": "here is the plan" })),
        Step::text("must not be asked for"),
    ]);
    let provider = s.provider::<Cli>();
    provider.delay_interrupts(interrupt_delay);
    let mut query = provider.query(input("plan it", None)).unwrap();
    let mut events = until(&mut query, ends).await;
    query.end();
    events.extend(drain(&mut query).await);
    let thread = session_id(&events);
    // Time for a request that should not come.
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.print_log();
    let stopped: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::Interrupted { covers, reason, .. } => Some((*covers, *reason)),
            _ => None,
        })
        .collect();
    assert_eq!(
        stopped,
        vec![(0, InterruptReason::ApprovalStop)],
        "{events:#?}"
    );
    assert!(results(&events).is_empty(), "{events:#?}");
    assert_eq!(
        s.fake.model_requests().len(),
        1,
        "no request after the result"
    );
    let rows = s.db.all_messages_out().unwrap();
    assert!(
        rows.iter().any(|r| r.content.contains("here is the plan")),
        "{rows:?}"
    );

    provider.delay_interrupts(Duration::ZERO);
    s.fake.set_script([Step::text("continuing")]);
    let events = ask(&provider, "looks good", Some(&thread)).await;
    assert_eq!(session_id(&events), thread);
    assert_eq!(results(&events), vec![("continuing".to_owned(), 0)]);
    let request = s.fake.model_requests().pop().unwrap();
    // Codex records the interrupted call as aborted; the driver's note gives the model the
    // real result.
    let system = request.system_text();
    assert!(
        system.contains("ended for the user's review") && system.contains("Message sent (seq"),
        "{system}"
    );
    assert_eq!(
        user_texts(&request).last().map(String::as_str),
        Some("looks good")
    );
    provider.shutdown().await;
}

/// A remote (streamable HTTP) MCP server from `remote_mcp_servers`: Codex lists and calls its
/// tool with the configured header, which is read from the private config file and never put
/// on the command line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_mcp_server_is_called_with_its_header() {
    use e2e::remote_mcp::{RemoteMcp, ECHO_MARKER, ECHO_TOOL};
    let Some(cli) = start::<Cli>("remote_mcp_server_is_called_with_its_header") else {
        return;
    };
    let mut s = setup::<Cli>("remote_mcp", cli);
    let remote = RemoteMcp::start().unwrap();
    let token = "Bearer codex-remote-token-81d2";
    s.settings.remote_mcp_servers.insert(
        "docs".into(),
        provider::RemoteMcpServer {
            url: remote.url(),
            headers: std::collections::BTreeMap::from([(
                "Authorization".to_owned(),
                token.to_owned(),
            )]),
        },
    );
    s.fake.push_all([
        Step::raw_tool_call(ECHO_TOOL, json!({ "text": "ping" })).namespace("mcp__docs"),
        Step::text("echoed"),
    ]);
    let provider = s.provider::<Cli>();
    let mut query = provider.query(input("call the remote tool", None)).unwrap();
    let mut events = until(&mut query, |e| matches!(e, ProviderEvent::Init { .. })).await;
    let pid = provider.pid().await.unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    events.extend(until(&mut query, ends_turn).await);
    query.end();
    events.extend(drain(&mut query).await);
    s.print_log();
    assert_eq!(
        results(&events),
        vec![("echoed".to_owned(), 0)],
        "{events:#?}"
    );
    let offered = s.fake.model_requests()[0].tool_names();
    assert!(
        offered.contains(&format!("mcp__docs__{ECHO_TOOL}")),
        "the remote tool is listed: {offered:?}"
    );
    assert_eq!(remote.echo_calls(), vec!["ping".to_owned()]);
    assert!(
        remote
            .header_values("authorization")
            .iter()
            .all(|v| v == token)
            && !remote.header_values("authorization").is_empty()
    );
    let results = s.fake.model_requests()[1].tool_results();
    assert!(
        results.iter().any(|r| r.contains(ECHO_MARKER)),
        "{results:?}"
    );
    let secret = "codex-remote-token-81d2".as_bytes();
    for (what, bytes) in [("command line", &cmdline), ("environment", &environ)] {
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret),
            "the header's value is in codex's {what}"
        );
    }
    provider.shutdown().await;
}

/// `elicitation: ask`: an MCP server's elicitation with one choice becomes an
/// `ApprovalRequest(Elicitation)`; the runner's `Reply` reaches the server as the chosen
/// value. (Codex first asks to approve the MCP call itself: the policy allows it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elicitation_is_asked_and_the_reply_reaches_the_server() {
    let Some(cli) = start::<Cli>("elicitation_is_asked_and_the_reply_reaches_the_server") else {
        return;
    };
    let mut s = setup::<Cli>("elicitation", cli);
    s.settings.elicitation = provider::ElicitationMode::Ask;
    s.settings.extra_mcp_servers.insert(
        "forms".into(),
        provider::McpServer {
            command: env!("CARGO_BIN_EXE_elicit-mcp").into(),
            args: Vec::new(),
            env: std::collections::BTreeMap::new(),
        },
    );
    s.fake.push_all([
        Step::raw_tool_call("pick_color", json!({})).namespace("mcp__forms"),
        Step::text("got it"),
    ]);
    let provider = s.provider::<Cli>();
    let mut query = provider.query(input("ask me a color", None)).unwrap();
    let (mut events, request) = first_approval(&mut query).await;
    assert_eq!(
        request.kind,
        provider::ApprovalKind::Elicitation {
            server: "forms".into(),
            message: "Pick a color".into(),
            options: vec!["red".into(), "blue".into()],
        }
    );
    let reply = provider::ApprovalAnswer::Reply("blue".into());
    answer_and_finish(&mut query, &request, reply, &mut events).await;
    s.print_log();
    assert_eq!(
        results(&events),
        vec![("got it".to_owned(), 0)],
        "{events:#?}"
    );
    let results = s.fake.model_requests()[1].tool_results();
    assert!(
        results.iter().any(|r| r.contains("picked: blue")),
        "{results:?}"
    );
    provider.shutdown().await;
}
