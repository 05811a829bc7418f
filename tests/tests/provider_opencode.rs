//! The OpenCode provider driven directly (no runner) against the REAL pinned `opencode` CLI
//! (`opencode serve`), the scripted fake model server and the real `mcp-tools`.
//!
//! * The CLI: `$OPENCODE_PATH` or `<repo>/.cli/node_modules/.bin/opencode`
//!   (`scripts/install-clis.sh`). A missing CLI FAILS the tests; `NANOCLAW_SKIP_CLI_TESTS=1`
//!   skips them instead.
//! * mcp-tools: `$MCP_TOOLS_PATH` or `<target>/debug/mcp-tools`, built on demand.
//! * Isolation: when `unshare -n` works (root here), each test re-executes itself inside a
//!   loopback-only network namespace (`NANOCLAW_NETNS=0` disables that), so nothing can leave
//!   the machine; the CLI runs with the traffic-off configuration in any case.
//! * Fixtures: with `NANOCLAW_OPENCODE_CAPTURE=<dir>` each test records what the provider read
//!   and posted to `<dir>/<test>.jsonl` (see `drivers/opencode/tests/fixtures/opencode/README.md`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use e2e::fake_model::{Step, StepUsage};
use e2e::harness::{descendants, live_processes, processes_with, processes_with_env};
use e2e::provider_harness::{
    answer, ask_for, drain_for, ends_turn, final_errors, input, query_until_approval, results,
    session_id, tool_denials, tool_policy, until_for, AskedCall, MARKER_VALUE, MARKER_VAR,
};
use e2e::provider_scenarios::{
    assert_first_text_reply, assert_send_message_wrote_a_row, assert_stale_continuation_replaced,
    resume_after_a_restart, setup, start, system_prompt_change_reaches_the_model, ApiErrorCase,
    CliProvider, ExpectedClass, WatchdogCase,
};
use e2e::scenarios;
use e2e::secrets::shell_step;
use opencode::OpenCodeProvider;
use provider::{
    AgentProvider, AgentQuery, ErrorClass, InterruptReason, Prompt, ProviderEvent, Usage,
};
use schema::SessionDb;
use serde_json::json;

/// The provider under test (its settings: `CliProvider::SPEC`).
type Cli = OpenCodeProvider;
const KEY: &str = Cli::SPEC.api_key;
/// How long to wait for each provider event (OpenCode's first prompt is slow to start).
const EVENT_TIMEOUT: Duration = Cli::EVENT_TIMEOUT;

// ---------------------------------------------------------------------------------------------
// Scenarios shared with the other CLIs (e2e::provider_scenarios)
// ---------------------------------------------------------------------------------------------

e2e::provider_scenario_tests! { Cli;
    /// 500 and 429 (with `retry-after-ms`) are retried `max_retries` times, then a
    /// non-retryable error; 401 fails at once; the next prompt is answered normally.
    api_errors_are_bounded_and_classified(api_error_cases(), Duration::from_secs(60), None);

    /// The server killed mid-turn: a retryable Process error; the next query respawns the
    /// server and resumes the session.
    killed_server_mid_turn_is_a_retryable_process_error =
        killed_cli_is_reported_and_the_next_query_resumes("killed_server", true);

    /// No session event for `watchdog`: the server is killed, a retryable Watchdog error; the
    /// next query works on a new server.
    watchdog_kills_a_silent_turn(WatchdogCase {
        watchdog: Duration::from_secs(6),
        silence: Step::hang().timeout_ms(40_000),
        within: Duration::from_secs(40),
        idle_first: false,
        // `server_pid` still names a process right after the error (measured): not checked.
        stops_the_process: false,
    });
}

/// (status, class, retryable, model requests); a dropped connection mid-stream is an Api error.
/// A 429 is a passing rate limit: retryable by the runner, with the wait the CLI was told.
/// Every case but the 401 shows a retry notice; the API's message is passed on.
fn api_error_cases() -> Vec<ApiErrorCase> {
    // Long enough for the abort after the retry notice to land before OpenCode's next try,
    // even on a loaded machine.
    let error = |status: u16, message| {
        Step::error(status, message).retry_after_ms(scenarios::OPENCODE_RETRY_AFTER_MS)
    };
    let case = |label, step, class, retryable, message_contains, requests: usize| ApiErrorCase {
        label,
        step,
        class: ExpectedClass::Is(class),
        retryable,
        message_contains,
        requests: requests..=requests,
        notices: if label == "401" {
            0..=usize::MAX
        } else {
            1..=usize::MAX
        },
        notice_class: None,
    };
    let rate_limited = ErrorClass::RateLimited {
        retry_after_secs: Some(scenarios::OPENCODE_RETRY_AFTER_MS.div_ceil(1000)),
    };
    vec![
        case(
            "500",
            error(500, "fake 500 error"),
            ErrorClass::Api,
            false,
            Some("fake 500 error"),
            2,
        ),
        case(
            "429",
            error(429, "fake 429 error"),
            rate_limited,
            true,
            Some("fake 429 error"),
            2,
        ),
        case(
            "401",
            error(401, "fake 401 error"),
            ErrorClass::Auth,
            false,
            Some("fake 401 error"),
            1,
        ),
        case(
            "dropped connection",
            Step::drop_connection(),
            ErrorClass::Api,
            false,
            None,
            2,
        ),
    ]
}

#[test]
fn missing_cli_is_a_spawn_error_naming_opencode_path() {
    e2e::provider_scenarios::missing_cli_is_a_spawn_error_naming_its_path::<Cli>();
}

// ---------------------------------------------------------------------------------------------
// Helpers and tests only OpenCode has
// ---------------------------------------------------------------------------------------------

/// Events until the stream closes ([`EVENT_TIMEOUT`] per event).
async fn drain(query: &mut AgentQuery) -> Vec<ProviderEvent> {
    drain_for(query, EVENT_TIMEOUT).await
}

/// Events until (and including) the first one matching `stop` ([`EVENT_TIMEOUT`] per event).
async fn until(
    query: &mut AgentQuery,
    stop: impl Fn(&ProviderEvent) -> bool,
) -> Vec<ProviderEvent> {
    until_for(query, EVENT_TIMEOUT, stop).await
}

/// One query until its result or error; then `end` and the rest of the stream.
async fn ask(
    provider: &OpenCodeProvider,
    text: &str,
    continuation: Option<&str>,
) -> Vec<ProviderEvent> {
    ask_for(provider, input(text, continuation), EVENT_TIMEOUT).await
}

/// Waits (30 s at most) for the question row mcp-tools writes; returns its question id.
async fn question_id(db: &SessionDb) -> String {
    e2e::provider_harness::question_id(db, Duration::from_secs(30)).await
}

/// Archives after each query read only the session's last messages (16, then more only when
/// the last archived entry is not among them); over a history longer than that first read, the
/// archives still hold every query once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archives_over_a_long_history_hold_every_query_once() {
    let Some(cli) = start::<Cli>("archives_over_a_long_history_hold_every_query_once") else {
        return;
    };
    const QUERIES: usize = 12;
    let s = setup::<Cli>("archive_long", cli);
    s.fake
        .push_all((1..=QUERIES).map(|n| Step::text(format!("answer number {n}"))));
    let provider = s.provider::<Cli>();
    let mut session: Option<String> = None;
    for n in 1..=QUERIES {
        let text = format!("<message id=\"{n}\">question number {n}</message>");
        let events = ask(&provider, &text, session.as_deref()).await;
        session = Some(session_id(&events));
    }
    // Shutting down waits for the last query's archive.
    provider.shutdown().await;
    s.print_log();
    let conversations = s.settings.agent_dir.join("conversations");
    let mut archived = String::new();
    for entry in std::fs::read_dir(&conversations).unwrap() {
        archived += &std::fs::read_to_string(entry.unwrap().path()).unwrap();
    }
    let mut at = 0;
    for n in 1..=QUERIES {
        // (The prompt in its XML: the first one is also the archive's title.)
        for text in [
            format!(">question number {n}<"),
            format!("answer number {n}\n"),
        ] {
            assert_eq!(archived.matches(&text).count(), 1, "{text}: {archived}");
            let found = archived.find(&text).unwrap();
            assert!(
                found > at,
                "{text} comes after what came before it: {archived}"
            );
            at = found;
        }
    }
}

/// A text reply; the request carries the key, model, system prompt, user text and the
/// mcp-tools tools; later queries reuse the same server and session (no respawn), and a
/// send_message call through mcp-tools writes its row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_reply_with_the_generated_config() {
    let Some(cli) = start::<Cli>("text_reply_with_the_generated_config") else {
        return;
    };
    let s = setup::<Cli>("text_reply", cli);
    s.fake.push_all([
        Step::text("hello from the fake model").chunks(3),
        Step::text("second answer"),
        Step::tool_call(
            "send_message",
            json!({"text": "sent by the tool", "channel": "slack", "platformId": "C1"}),
        ),
        Step::text("done"),
    ]);
    let provider = s.provider::<Cli>();
    let events = ask(&provider, "<message id=\"1\">hi</message>", None).await;
    s.print_log();
    assert!(
        matches!(events[0], ProviderEvent::Init { .. }),
        "{events:#?}"
    );
    let request = assert_first_text_reply::<Cli>(&s, &events, "/v1/chat/completions");
    let session = session_id(&events);
    assert!(session.starts_with("ses_"), "{session}");
    assert!(
        !request.tool_names().iter().any(|t| t == "question"),
        "the built-in question tool is off: {:?}",
        request.tool_names()
    );
    assert!(s
        .settings
        .home_dir
        .join(".local/share/opencode/opencode.db")
        .is_file());

    // The next query reuses the running server and the session.
    let pid = provider.server_pid().unwrap();
    let events = ask(&provider, "and again", Some(&session)).await;
    assert_eq!(session_id(&events), session);
    assert_eq!(results(&events), vec![("second answer".to_owned(), 0)]);
    assert_eq!(provider.server_pid(), Some(pid), "no respawn per query");
    let request = s.turns().pop().unwrap();
    assert_eq!(
        request.user_texts(),
        vec![
            "<message id=\"1\">hi</message>".to_owned(),
            "and again".to_owned()
        ]
    );

    // send_message through mcp-tools.
    let events = ask(&provider, "please send", Some(&session)).await;
    s.print_log();
    assert_send_message_wrote_a_row(&s, &events, "mcp__nanoclaw__send_message", 4);
    assert_eq!(provider.server_pid(), Some(pid), "still the same server");
    provider.shutdown().await;
    assert!(descendants(pid).is_empty(), "{:?}", descendants(pid));
}

/// A follow-up while the model streams: abort-and-restart; the restart carries the follow-up,
/// the history keeps the first message, and one result covers both. Then an abort interrupts
/// a turn at once, closes the stream and keeps the server for the next query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_mid_turn_restarts_and_abort_interrupts() {
    let Some(cli) = start::<Cli>("push_mid_turn_restarts_and_abort_interrupts") else {
        return;
    };
    let s = setup::<Cli>("push_restart", cli);
    s.fake.push_all([
        Step::hang().timeout_ms(30_000),
        Step::text("answer to both"),
        Step::hang().timeout_ms(30_000),
        Step::text("after the abort"),
    ]);
    let provider = s.provider::<Cli>();
    let mut query = provider.query(input("first message", None)).unwrap();
    let init = until(&mut query, |e| matches!(e, ProviderEvent::Init { .. })).await;
    s.wait_turns(1).await;
    assert_eq!(query.push(Prompt::text("second message")).unwrap(), 1);
    let mut events = until(&mut query, ends_turn).await;
    query.end();
    events.extend(drain(&mut query).await);
    s.print_log();
    assert_eq!(results(&events), vec![("answer to both".to_owned(), 1)]);
    assert!(final_errors(&events).is_empty(), "{events:#?}");
    let requests = s.turns();
    assert_eq!(requests.len(), 2, "one restart");
    assert_eq!(
        requests[1].user_texts(),
        vec!["first message".to_owned(), "second message".to_owned()],
        "the aborted message stays in the history; the restart adds the follow-up"
    );
    assert!(requests[1].system_text().contains("SYSTEM-MARKER-1"));

    // Abort.
    let session = session_id(&init);
    let pid = provider.server_pid().unwrap();
    let mut query = provider.query(input("long task", Some(&session))).unwrap();
    s.wait_turns(3).await;
    let started = Instant::now();
    query.abort();
    let events = drain(&mut query).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        final_errors(&events),
        vec![(ErrorClass::Aborted, false, "aborted".to_owned())]
    );
    let events = ask(&provider, "next", Some(&session)).await;
    s.print_log();
    assert_eq!(results(&events), vec![("after the abort".to_owned(), 0)]);
    assert_eq!(provider.server_pid(), Some(pid), "same server");
    provider.shutdown().await;
}

/// A follow-up while a tool blocks (ask_user_question): queued into the running turn, so the
/// question is not cancelled; the model gets the answer, then the follow-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_while_a_tool_runs_is_queued_into_the_turn() {
    let Some(cli) = start::<Cli>("push_while_a_tool_runs_is_queued_into_the_turn") else {
        return;
    };
    let s = setup::<Cli>("push_during_tool", cli);
    s.fake.push_all([
        Step::tool_call(
            "ask_user_question",
            json!({"question": "Deploy now?", "options": ["Yes", "No"]}),
        ),
        Step::text("deploying, and noted"),
    ]);
    let provider = s.provider::<Cli>();
    let mut query = provider.query(input("ask me", None)).unwrap();
    until(&mut query, |e| matches!(e, ProviderEvent::Activity { tool: Some(t), .. } if t == "mcp__nanoclaw__ask_user_question")).await;
    let question = question_id(&s.db).await;
    assert_eq!(query.push(Prompt::text("also: use staging")).unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    answer(&s.db, &question, "Yes");
    let mut events = until(&mut query, ends_turn).await;
    query.end();
    events.extend(drain(&mut query).await);
    s.print_log();
    assert_eq!(
        results(&events),
        vec![("deploying, and noted".to_owned(), 1)]
    );
    let requests = s.turns();
    assert_eq!(requests.len(), 2, "no abort, no restart");
    let last = &requests[1];
    assert!(
        last.tool_results().join("\n").contains("Yes"),
        "{:?}",
        last.tool_results()
    );
    assert_eq!(
        last.user_texts(),
        vec!["ask me".to_owned(), "also: use staging".to_owned()]
    );
    provider.shutdown().await;
}

/// A new provider (the runner restarted) resumes the stored session with its history and the
/// system prompt; a stored session that no longer exists (or an id that is not an OpenCode
/// session) is replaced by a new one, with a notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_after_restart_and_stale_continuation() {
    let Some(cli) = start::<Cli>("resume_after_restart_and_stale_continuation") else {
        return;
    };
    let s = setup::<Cli>("resume", cli);
    s.fake.push_all([
        Step::text("first answer"),
        Step::text("second answer"),
        Step::text("third answer"),
        Step::text("fresh answer"),
        Step::text("fresh again"),
    ]);
    // A new provider (the runner restarted) resumes the stored session.
    let (provider, session) = resume_after_a_restart::<Cli>(&s).await;

    // A changed system prompt reaches the model on the next prompt.
    let system = system_prompt_change_reaches_the_model(&s, &provider, &session).await;
    assert!(!system.contains("SYSTEM-MARKER-1"), "{system}");

    // A stored session that no longer exists.
    let stale = "ses_0000000000000000000000stale";
    let new_id =
        assert_stale_continuation_replaced(&s, &provider, stale, "starting a new one").await;
    assert_ne!(new_id, session);

    // An id that does not even look like an OpenCode session (another provider's).
    let events = ask(&provider, "and once more", Some("thread-from-codex")).await;
    assert_ne!(session_id(&events), "thread-from-codex");
    assert_eq!(results(&events), vec![("fresh again".to_owned(), 0)]);
    s.print_log();
    provider.shutdown().await;
}

/// The agent's shell sees neither host secrets nor the model API key; shutdown also kills a
/// shell command OpenCode started in a process group of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_shell_is_scrubbed_and_shutdown_kills_it() {
    let Some(cli) = start::<Cli>("agent_shell_is_scrubbed_and_shutdown_kills_it") else {
        return;
    };
    assert_eq!(std::env::var(MARKER_VAR).as_deref(), Ok(MARKER_VALUE));
    let s = setup::<Cli>("agent_shell", cli);
    s.fake.push_all([
        Step::raw_tool_call(
            "bash",
            json!({"command": "env", "description": "print env"}),
        ),
        Step::text("env shown"),
        Step::raw_tool_call(
            "bash",
            json!({"command": "sleep 471; echo late", "description": "sleep"}),
        ),
    ]);
    let provider = s.provider::<Cli>();
    let events = ask(&provider, "show me the environment", None).await;
    assert_eq!(results(&events), vec![("env shown".to_owned(), 0)]);
    let output = s.turns().pop().unwrap().tool_results().join("\n");
    assert!(output.contains("HOME="), "the env output: {output}");
    assert!(
        !output.contains(MARKER_VALUE),
        "host secret leaked: {output}"
    );
    assert!(!output.contains(KEY), "API key leaked: {output}");

    let mut query = provider
        .query(input("sleep a while", Some(&session_id(&events))))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while processes_with("sleep 471").is_empty() {
        assert!(Instant::now() < deadline, "the shell command never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = provider.server_pid().unwrap();
    let started = Instant::now();
    provider.shutdown().await;
    eprintln!("shutdown took {:.2?}", started.elapsed());
    drain(&mut query).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        processes_with("sleep 471").is_empty(),
        "{:?}",
        processes_with("sleep 471")
    );
    assert!(live_processes().iter().all(|(p, ..)| *p != pid));
    let db = format!("SESSION_DB={}", s.settings.session_db.display());
    assert!(
        processes_with_env(&db).is_empty(),
        "mcp-tools outlived shutdown"
    );
    s.print_log();
}

// ---------------------------------------------------------------------------------------------
// Usage, interrupts, text as it is written, the model per query (issues 14 and 15)
// ---------------------------------------------------------------------------------------------

/// The `Usage` of the (one) result.
fn result_usage(events: &[ProviderEvent]) -> Usage {
    let usages: Vec<&Option<Usage>> = events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::Result { usage, .. } => Some(usage),
            _ => None,
        })
        .collect();
    assert_eq!(usages.len(), 1, "{events:#?}");
    usages[0].clone().expect("a result with usage")
}

/// An `Interrupted` event (or an error that ends the turn: a failure to interrupt).
fn ends_interrupted(event: &ProviderEvent) -> bool {
    matches!(event, ProviderEvent::Interrupted { .. }) || ends_turn(event)
}

/// The scripted Chat Completions usage lands in `Result.usage` in OpenCode's figures (input
/// without cache reads, output with reasoning, no cost: our model has no prices); a turn of two
/// model requests (a tool call, then text) sums both, once. Its text before the tool call is a
/// `Text` event while the tool still runs; the tool is `Bash` with its command line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_and_text_before_the_tool_ends() {
    let Some(cli) = start::<Cli>("usage_and_text_before_the_tool_ends") else {
        return;
    };
    let s = setup::<Cli>("usage_text", cli);
    let first = StepUsage {
        input: 1000,
        output: 50,
        cache_read: 200,
        cache_write: 0,
        reasoning: 20,
    };
    let second = StepUsage {
        input: 300,
        output: 7,
        cache_read: 0,
        cache_write: 0,
        reasoning: 0,
    };
    s.fake.push_all([
        Step::text("one step").usage(first),
        Step::reply([
            Step::text("<message to=\"ops\">deploying</message>"),
            Step::raw_tool_call(
                "bash",
                json!({"command": "sleep 3; echo slept", "description": "sleep"}),
            ),
        ])
        .usage(first),
        Step::text("final line").usage(second),
    ]);
    let provider = s.provider::<Cli>();
    let events = ask(&provider, "one", None).await;
    let usage = result_usage(&events);
    assert_eq!(
        usage,
        Usage {
            input_tokens: Some(1000),
            output_tokens: Some(50),
            cache_read_tokens: Some(200),
            cache_write_tokens: Some(0),
            reasoning_tokens: Some(20),
            cost_usd: None,
            model: Some("fake-model".into()),
            requests: Some(1),
        }
    );

    let session = session_id(&events);
    let mut query = provider.query(input("two", Some(&session))).unwrap();
    let mut timed = Vec::new();
    loop {
        let event = tokio::time::timeout(EVENT_TIMEOUT, query.next_event())
            .await
            .expect("an event in time");
        let Some(event) = event else { break };
        let done = ends_turn(&event);
        timed.push((Instant::now(), event));
        if done {
            query.end();
        }
    }
    s.print_log();
    let events: Vec<ProviderEvent> = timed.iter().map(|(_, e)| e.clone()).collect();
    let at = |wanted: &dyn Fn(&ProviderEvent) -> bool| {
        timed
            .iter()
            .position(|(_, e)| wanted(e))
            .unwrap_or_else(|| panic!("missing event: {events:#?}"))
    };
    let text = at(&|e| matches!(e, ProviderEvent::Text { text } if text.contains("to=\"ops\"")));
    let bash = at(&|e| {
        matches!(e, ProviderEvent::Activity { tool: Some(t), summary: Some(c) }
            if t == "Bash" && c == "sleep 3; echo slept")
    });
    let ended = at(&|e| matches!(e, ProviderEvent::ToolEnded { .. }));
    let last = at(&|e| matches!(e, ProviderEvent::Text { text } if text == "final line"));
    assert!(text < bash && bash < ended && ended < last, "{events:#?}");
    assert!(
        timed[ended].0 - timed[text].0 >= Duration::from_secs(2),
        "the text came out while the tool ran: {events:#?}"
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, ProviderEvent::Text { .. }))
            .count(),
        2,
        "each piece once: {events:#?}"
    );
    assert_eq!(results(&events), vec![("final line".to_owned(), 0)]);
    let usage = result_usage(&events);
    assert_eq!(usage.input_tokens, Some(1300));
    assert_eq!(usage.output_tokens, Some(57));
    assert_eq!(usage.cache_read_tokens, Some(200));
    assert_eq!(usage.reasoning_tokens, Some(20));
    assert_eq!(usage.requests, Some(2));
    assert_eq!(usage.cost_usd, None);
    provider.shutdown().await;
}

/// An interrupt while the model stalls ends the turn through OpenCode's abort within 2 s
/// (`Interrupted{Stopped}`, covering the prompt the model saw); the server and the session live
/// on: the next query's request carries the earlier history. With `maxTurnsPerQuery` 1, a turn
/// whose first request ends in a tool call is stopped (`Interrupted{MaxTurns}`) with the usage
/// of that request; a one-request turn is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_and_max_turns_keep_the_session() {
    let Some(cli) = start::<Cli>("interrupt_and_max_turns_keep_the_session") else {
        return;
    };
    let mut s = setup::<Cli>("interrupt", cli);
    s.settings.max_turns_per_query = Some(1);
    s.fake.push_all([
        Step::text("warm"),
        Step::hang().timeout_ms(30_000),
        Step::text("after the stop"),
        Step::raw_tool_call("bash", json!({"command": "echo hi", "description": "echo"})),
        // Answers OpenCode's next request, if it is made before the abort lands.
        Step::hang().timeout_ms(30_000),
    ]);
    let provider = s.provider::<Cli>();
    let events = ask(&provider, "warm up", None).await;
    let session = session_id(&events);
    let pid = provider.server_pid().unwrap();

    let mut query = provider.query(input("long task", Some(&session))).unwrap();
    s.wait_turns(2).await;
    let started = Instant::now();
    query.interrupt();
    let events = drain(&mut query).await;
    let elapsed = started.elapsed();
    eprintln!("interrupted in {elapsed:.2?}");
    s.print_log();
    assert!(
        matches!(
            events.last(),
            Some(ProviderEvent::Interrupted {
                covers: 0,
                reason: InterruptReason::Stopped,
                ..
            })
        ),
        "{events:#?}"
    );
    assert!(
        elapsed < Duration::from_secs(2),
        "interrupted after {elapsed:?}"
    );
    assert!(final_errors(&events).is_empty(), "{events:#?}");

    let events = ask(&provider, "next", Some(&session)).await;
    assert_eq!(session_id(&events), session);
    assert_eq!(results(&events), vec![("after the stop".to_owned(), 0)]);
    assert_eq!(
        s.turns().pop().unwrap().user_texts(),
        vec![
            "warm up".to_owned(),
            "long task".to_owned(),
            "next".to_owned()
        ],
        "the same session, with its history"
    );
    assert_eq!(provider.server_pid(), Some(pid), "the server lives on");

    let mut query = provider.query(input("run it", Some(&session))).unwrap();
    let events = until(&mut query, ends_interrupted).await;
    let rest = drain(&mut query).await;
    assert!(rest.is_empty(), "the stream closes after it: {rest:#?}");
    match events.last() {
        Some(ProviderEvent::Interrupted {
            covers: 0,
            usage: Some(usage),
            reason: InterruptReason::MaxTurns,
        }) => assert_eq!(
            (usage.input_tokens, usage.requests),
            (Some(10), Some(1)),
            "{usage:?}"
        ),
        other => panic!("{other:?}: {events:#?}"),
    }
    s.fake.set_script([Step::text("after max turns")]);
    let events = ask(&provider, "and now", Some(&session)).await;
    s.print_log();
    assert_eq!(results(&events), vec![("after max turns".to_owned(), 0)]);
    assert!(s
        .turns()
        .pop()
        .unwrap()
        .tool_results()
        .join("\n")
        .contains("hi"));
    assert_eq!(provider.server_pid(), Some(pid), "the server lives on");
    provider.shutdown().await;
}

/// `QueryInput.model` names the model of the request to the model API; an unknown model is the
/// API's error (the fake refuses it with a 404), and the next query without a choice is back on
/// the configured model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_per_query() {
    let Some(cli) = start::<Cli>("model_per_query") else {
        return;
    };
    let s = setup::<Cli>("model_per_query", cli);
    s.fake
        .set_known_models(Some(["fake-model", "fake-model-large"]));
    s.fake
        .push_all([Step::text("large answer"), Step::text("default answer")]);
    let provider = s.provider::<Cli>();
    let mut large = input("big question", None);
    large.model = Some("fake-model-large".into());
    let events = ask_for(&provider, large, EVENT_TIMEOUT).await;
    assert_eq!(results(&events), vec![("large answer".to_owned(), 0)]);
    assert_eq!(s.turns().pop().unwrap().model(), Some("fake-model-large"));
    assert_eq!(
        result_usage(&events).model.as_deref(),
        Some("fake-model-large")
    );
    let session = session_id(&events);

    let mut unknown = input("who are you", Some(&session));
    unknown.model = Some("no-such-model".into());
    let events = ask_for(&provider, unknown, EVENT_TIMEOUT).await;
    s.print_log();
    let errors = final_errors(&events);
    assert_eq!(errors.len(), 1, "{events:#?}");
    assert!(errors[0].2.contains("no-such-model"), "{errors:?}");

    let events = ask(&provider, "and you", Some(&session)).await;
    assert_eq!(results(&events), vec![("default answer".to_owned(), 0)]);
    assert_eq!(s.turns().pop().unwrap().model(), Some("fake-model"));
    provider.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Tool policy, approvals and approval stops (issue 16)
// ---------------------------------------------------------------------------------------------

/// The model step that runs `command` in OpenCode's shell tool.
fn bash(command: &str) -> Step {
    shell_step("opencode", command)
}

/// A query on `session` until its `ApprovalRequest`: the query, its events and the asked call.
async fn until_approval(
    provider: &OpenCodeProvider,
    text: &str,
    session: Option<&str>,
) -> (AgentQuery, Vec<ProviderEvent>, AskedCall) {
    query_until_approval(provider, input(text, session), EVENT_TIMEOUT).await
}

/// Answers request `id`, then reads the turn to its end and ends the query: its events.
async fn answer_approval(
    query: &mut AgentQuery,
    id: &str,
    answer: provider::ApprovalAnswer,
) -> Vec<ProviderEvent> {
    e2e::provider_harness::answer_approval(query, id, answer, EVENT_TIMEOUT).await
}

/// `deny: ["Bash(rm *)", "Read(*secret*)"]`, `ask: ["Bash(touch *)"]` against the real CLI:
/// OpenCode refuses `rm -rf target` by its own config (the directory survives, the model gets
/// the refusal, `ToolDenied`); a read the config asks about is refused by the driver with the
/// policy's message; an asked `touch` waits for the answer: Allow
/// runs it, Deny leaves the file system as it was and the model gets the reason; every turn
/// goes on to the model's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_policy_denies_and_asks() {
    let Some(cli) = start::<Cli>("tool_policy_denies_and_asks") else {
        return;
    };
    let mut s = setup::<Cli>("tool_policy", cli);
    s.settings.tool_policy = tool_policy(
        &["Bash(rm *)", "Read(*secret*)"],
        &["Bash(touch *)", "mcp__nanoclaw__send_message"],
    );
    let agent = s.settings.agent_dir.clone();
    std::fs::create_dir_all(agent.join("target")).unwrap();
    std::fs::write(agent.join("secret.txt"), "the secret").unwrap();
    let secret = agent.join("secret.txt").display().to_string();
    s.fake.push_all([
        bash("rm -rf target"),
        Step::text("could not remove it"),
        Step::raw_tool_call("read", json!({"filePath": secret})),
        Step::text("could not read it"),
        bash("touch approved.txt"),
        Step::text("touched"),
        bash("touch refused.txt"),
        Step::text("was refused"),
        Step::tool_call(
            "send_message",
            json!({"text": "asked first", "channel": "slack", "platformId": "C1"}),
        ),
        Step::text("sent"),
    ]);
    let provider = s.provider::<Cli>();

    let events = ask(&provider, "clean up", None).await;
    let session = session_id(&events);
    assert_eq!(
        results(&events),
        vec![("could not remove it".to_owned(), 0)]
    );
    assert_eq!(
        tool_denials(&events),
        vec![("Bash".to_owned(), Some("rm -rf target".to_owned()))]
    );
    assert!(agent.join("target").is_dir(), "the directory survives");
    let refusal = s.turns().pop().unwrap().tool_results().join("\n");
    assert!(refusal.contains("prevents you from using"), "{refusal}");

    let events = ask(&provider, "read the secret", Some(&session)).await;
    assert_eq!(results(&events), vec![("could not read it".to_owned(), 0)]);
    assert_eq!(
        tool_denials(&events),
        vec![("Read".to_owned(), Some(secret.clone()))]
    );
    let refusal = s.turns().pop().unwrap().tool_results().join("\n");
    assert!(refusal.contains("denied by the tool policy"), "{refusal}");
    assert!(!refusal.contains("the secret"), "{refusal}");

    // Ask, answered Allow a moment later (the watchdog's part: `driver.rs`'s unit test; OpenCode
    // reports the tool running during the wait, which extends it too).
    let (mut query, _, asked) = until_approval(&provider, "touch one", Some(&session)).await;
    assert_eq!(
        (asked.tool.as_str(), asked.argument.as_deref()),
        ("Bash", Some("touch approved.txt"))
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!agent.join("approved.txt").exists(), "waits for the answer");
    let events = answer_approval(&mut query, &asked.id, provider::ApprovalAnswer::Allow).await;
    assert_eq!(results(&events), vec![("touched".to_owned(), 0)]);
    assert!(agent.join("approved.txt").is_file());

    // Ask, answered Deny: nothing runs, the model gets the reason and goes on.
    let (mut query, _, asked) = until_approval(&provider, "touch two", Some(&session)).await;
    let reason = "denied by the user".to_owned();
    let deny = provider::ApprovalAnswer::Deny { reason };
    let events = answer_approval(&mut query, &asked.id, deny).await;
    s.print_log();
    assert_eq!(results(&events), vec![("was refused".to_owned(), 0)]);
    assert!(!agent.join("refused.txt").exists());
    let refusal = s.turns().pop().unwrap().tool_results().join("\n");
    assert!(refusal.contains("denied by the user"), "{refusal}");

    // An MCP tool asked about: the user sees its arguments (OpenCode asks before it publishes
    // them; the request waits for them).
    let (mut query, _, asked) = until_approval(&provider, "send it", Some(&session)).await;
    assert_eq!(asked.tool, "mcp__nanoclaw__send_message");
    let argument: serde_json::Value = serde_json::from_str(&asked.argument.unwrap()).unwrap();
    assert_eq!(argument["text"], "asked first", "{argument}");
    let events = answer_approval(&mut query, &asked.id, provider::ApprovalAnswer::Allow).await;
    assert_eq!(results(&events), vec![("sent".to_owned(), 0)]);
    let rows = s.db.all_messages_out().unwrap();
    assert!(
        rows.iter().any(|row| row.content.contains("asked first")),
        "{rows:#?}"
    );
    provider.shutdown().await;
}

/// An approval asked and never answered: the query's abort rejects it, and the next prompt of
/// the session is answered normally (the request does not linger in OpenCode).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_approval_is_denied_when_the_query_ends() {
    let Some(cli) = start::<Cli>("an_unanswered_approval_is_denied_when_the_query_ends") else {
        return;
    };
    let mut s = setup::<Cli>("unanswered_approval", cli);
    s.settings.tool_policy = tool_policy(&[], &["Bash"]);
    let agent = s.settings.agent_dir.clone();
    s.fake
        .push_all([bash("touch never.txt"), Step::text("next answer")]);
    let provider = s.provider::<Cli>();
    let (mut query, events, asked) = until_approval(&provider, "touch it", None).await;
    let session = session_id(&events);
    query.abort();
    let events = drain(&mut query).await;
    assert!(
        matches!(
            events.last(),
            Some(ProviderEvent::Error {
                classification: ErrorClass::Aborted,
                ..
            })
        ),
        "{events:#?}"
    );
    // A late answer changes nothing.
    query
        .approver()
        .answer(&asked.id, provider::ApprovalAnswer::Allow);
    assert!(!agent.join("never.txt").exists());
    assert_eq!(s.turns().len(), 1, "no model request after the abort");
    let events = ask(&provider, "hello", Some(&session)).await;
    s.print_log();
    assert_eq!(results(&events), vec![("next answer".to_owned(), 0)]);
    assert!(!agent.join("never.txt").exists());
    assert_eq!(s.turns().len(), 2);
    provider.shutdown().await;
}

/// `approvalStopTools: ["mcp__nanoclaw__send_message"]`: the tool runs (its row is written),
/// the turn ends `Interrupted { ApprovalStop }` with no model request after the tool result;
/// the next prompt continues the same session, whose history holds the call and its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_stop_ends_the_turn_after_the_tool_result() {
    let Some(cli) = start::<Cli>("an_approval_stop_ends_the_turn_after_the_tool_result") else {
        return;
    };
    let mut s = setup::<Cli>("approval_stop", cli);
    s.settings.approval_stop_tools = vec!["mcp__nanoclaw__send_message".into()];
    s.fake.push_all([
        Step::text("warm"),
        Step::tool_call(
            "send_message",
            json!({"text": "the plan: sent by the tool", "channel": "slack", "platformId": "C1"}),
        ),
        Step::text("must not be asked for"),
    ]);
    let provider = s.provider::<Cli>();
    let events = ask(&provider, "warm up", None).await;
    let session = session_id(&events);
    let pid = provider.server_pid().unwrap();

    let mut query = provider
        .query(input("present the plan", Some(&session)))
        .unwrap();
    let events = until(&mut query, ends_interrupted).await;
    let rest = drain(&mut query).await;
    assert!(rest.is_empty(), "the stream closes after it: {rest:#?}");
    // The step was cut by the abort: OpenCode reports no usage for it.
    assert!(
        matches!(
            events.last(),
            Some(ProviderEvent::Interrupted {
                covers: 0,
                reason: InterruptReason::ApprovalStop,
                ..
            })
        ),
        "{events:#?}"
    );
    assert!(results(&events).is_empty(), "{events:#?}");
    let rows = s.db.all_messages_out().unwrap();
    assert!(
        rows.iter()
            .any(|row| row.content.contains("the plan: sent by the tool")),
        "{rows:#?}"
    );
    // No request after the tool result, even a while later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.print_log();
    assert_eq!(
        s.turns().len(),
        2,
        "warm-up + the tool call, nothing after it"
    );

    s.fake.set_script([Step::text("going ahead")]);
    let events = ask(&provider, "approved", Some(&session)).await;
    s.print_log();
    assert_eq!(session_id(&events), session);
    assert_eq!(results(&events), vec![("going ahead".to_owned(), 0)]);
    let last = s.turns().pop().unwrap();
    assert_eq!(
        last.user_texts(),
        vec![
            "warm up".to_owned(),
            "present the plan".to_owned(),
            "approved".to_owned()
        ]
    );
    assert!(
        last.tool_results().join("\n").contains("Message sent"),
        "{:?}",
        last.tool_results()
    );
    assert_eq!(provider.server_pid(), Some(pid), "the server lives on");
    provider.shutdown().await;
}

/// A remote (streamable HTTP) MCP server in `remote_mcp_servers`: OpenCode lists its tool, the
/// model's call reaches it with the configured header (read from the private file the config
/// names), and its result reaches the model; the header's value is in no environment variable
/// of the server (and so of the agent's shells).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_mcp_server_is_listed_and_called_with_its_header() {
    let Some(cli) = start::<Cli>("a_remote_mcp_server_is_listed_and_called_with_its_header") else {
        return;
    };
    let remote = e2e::remote_mcp::RemoteMcp::start().unwrap();
    let mut s = setup::<Cli>("remote_mcp", cli);
    let secret = "Bearer remote-header-7f3a";
    s.settings.remote_mcp_servers.insert(
        "docs".into(),
        provider::RemoteMcpServer {
            url: remote.url(),
            headers: std::collections::BTreeMap::from([("Authorization".into(), secret.into())]),
        },
    );
    s.fake.push_all([
        Step::raw_tool_call(
            format!("docs_{}", e2e::remote_mcp::ECHO_TOOL),
            json!({"text": "over http"}),
        ),
        Step::text("done"),
    ]);
    let provider = s.provider::<Cli>();
    let events = ask(&provider, "call the remote tool", None).await;
    s.print_log();
    assert_eq!(results(&events), vec![("done".to_owned(), 0)]);
    assert!(
        events.iter().any(|e| matches!(e, ProviderEvent::Activity { tool: Some(t), .. } if t == "mcp__docs__remote_echo")),
        "{events:#?}"
    );
    let requests = s.turns();
    assert!(
        requests[0]
            .tool_names()
            .iter()
            .any(|t| t == "docs_remote_echo"),
        "{:?}",
        requests[0].tool_names()
    );
    assert!(
        requests[1]
            .tool_results()
            .join("\n")
            .contains(e2e::remote_mcp::ECHO_MARKER),
        "{:?}",
        requests[1].tool_results()
    );
    assert_eq!(remote.echo_calls(), vec!["over http".to_owned()]);
    let auth = remote.header_values("authorization");
    assert!(
        !auth.is_empty() && auth.iter().all(|v| v == secret),
        "{auth:?}"
    );
    let pid = provider.server_pid().unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(
        !String::from_utf8_lossy(&environ).contains("remote-header-7f3a"),
        "the header value is in the server's environment"
    );
    provider.shutdown().await;
}
