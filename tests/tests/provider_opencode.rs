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
//!   and posted to `<dir>/<test>.jsonl` (see `provider/tests/fixtures/opencode/README.md`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use e2e::fake_model::Step;
use e2e::harness::{descendants, live_processes, processes_with, processes_with_env};
use e2e::provider_harness::{
    answer, ask_for, drain_for, ends_turn, final_errors, input, is_result, results, session_id,
    until_for, ProviderSetup, ProviderSpec, MARKER_VALUE, MARKER_VAR,
};
use e2e::scenarios;
use provider::opencode::OpenCodeProvider;
use provider::{
    AgentProvider, AgentQuery, ErrorClass, Prompt, ProviderError, ProviderEvent, ProviderSettings,
};
use schema::SessionDb;
use serde_json::json;

const KEY: &str = "sk-opencode-provider-test-key";
/// Model "fake-model" on Chat Completions; the marker is passed through to the CLI: the shell
/// must not see it.
const SPEC: ProviderSpec = ProviderSpec::openai("opencode", KEY);
/// How long to wait for each provider event (OpenCode's first prompt is slow to start).
const EVENT_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Harness (shared: e2e::provider_harness)
// ---------------------------------------------------------------------------------------------

/// Skips (CLI tests disabled) or re-executes in a child; `Some(cli)` = run the body here.
fn start(test: &str) -> Option<PathBuf> {
    e2e::provider_harness::start("opencode", test)
}

fn setup(name: &'static str, cli: PathBuf) -> ProviderSetup {
    SPEC.setup(name, cli)
}

trait Spawn {
    fn provider(&self) -> OpenCodeProvider;
}

impl Spawn for ProviderSetup {
    /// A provider; with `NANOCLAW_OPENCODE_CAPTURE=<dir>` it records what it read and posted to
    /// `<dir>/<name>.jsonl`.
    fn provider(&self) -> OpenCodeProvider {
        let provider = self.spawn(OpenCodeProvider::new);
        if let Some(path) = self.capture_path("NANOCLAW_OPENCODE_CAPTURE") {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).unwrap();
            }
            let _ = std::fs::remove_file(&path);
            provider.record_events(&path);
        }
        provider
    }
}

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

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// A text reply; the request carries the key, model, system prompt, user text and the
/// mcp-tools tools; later queries reuse the same server and session (no respawn), and a
/// send_message call through mcp-tools writes its row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_reply_with_the_generated_config() {
    let Some(cli) = start("text_reply_with_the_generated_config") else {
        return;
    };
    let s = setup("text_reply", cli);
    s.fake.push_all([
        Step::text("hello from the fake model").chunks(3),
        Step::text("second answer"),
        Step::tool_call(
            "send_message",
            json!({"text": "sent by the tool", "channel": "slack", "platformId": "C1"}),
        ),
        Step::text("done"),
    ]);
    let provider = s.provider();
    let events = ask(&provider, "<message id=\"1\">hi</message>", None).await;
    s.print_log();
    assert!(
        matches!(events[0], ProviderEvent::Init { .. }),
        "{events:#?}"
    );
    assert_eq!(
        results(&events),
        vec![("hello from the fake model".to_owned(), 0)]
    );
    assert!(final_errors(&events).is_empty(), "{events:#?}");
    let session = session_id(&events);
    assert!(session.starts_with("ses_"), "{session}");

    let requests = s.turns();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(request.model(), Some("fake-model"));
    assert!(
        request.system_text().contains("SYSTEM-MARKER-1"),
        "system prompt missing: {}",
        request.system_text()
    );
    assert_eq!(
        request.user_texts(),
        vec!["<message id=\"1\">hi</message>".to_owned()]
    );
    assert!(
        request.offers_mcp_tool("send_message"),
        "tools: {:?}",
        request.tool_names()
    );
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
    assert_eq!(results(&events), vec![("done".to_owned(), 0)]);
    assert!(
        events.iter().any(
            |e| matches!(e, ProviderEvent::Activity { tool: Some(t) } if t == "nanoclaw_send_message")
        ),
        "{events:#?}"
    );
    let rows = s.db.all_messages_out().unwrap();
    assert!(
        rows.iter()
            .any(|row| row.content.contains("sent by the tool")),
        "no messages_out row from send_message: {rows:#?}"
    );
    let requests = s.turns();
    assert_eq!(requests.len(), 4);
    assert!(
        requests[3].tail_is_tool_result(),
        "{}",
        requests[3].summary()
    );
    assert_eq!(provider.server_pid(), Some(pid), "still the same server");
    provider.shutdown().await;
    assert!(descendants(pid).is_empty(), "{:?}", descendants(pid));
}

/// A follow-up while the model streams: abort-and-restart; the restart carries the follow-up,
/// the history keeps the first message, and one result covers both. Then an abort interrupts
/// a turn at once, closes the stream and keeps the server for the next query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_mid_turn_restarts_and_abort_interrupts() {
    let Some(cli) = start("push_mid_turn_restarts_and_abort_interrupts") else {
        return;
    };
    let s = setup("push_restart", cli);
    s.fake.push_all([
        Step::hang().timeout_ms(30_000),
        Step::text("answer to both"),
        Step::hang().timeout_ms(30_000),
        Step::text("after the abort"),
    ]);
    let provider = s.provider();
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
    let Some(cli) = start("push_while_a_tool_runs_is_queued_into_the_turn") else {
        return;
    };
    let s = setup("push_during_tool", cli);
    s.fake.push_all([
        Step::tool_call(
            "ask_user_question",
            json!({"question": "Deploy now?", "options": ["Yes", "No"]}),
        ),
        Step::text("deploying, and noted"),
    ]);
    let provider = s.provider();
    let mut query = provider.query(input("ask me", None)).unwrap();
    until(&mut query, |e| matches!(e, ProviderEvent::Activity { tool: Some(t) } if t == "nanoclaw_ask_user_question")).await;
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
    let Some(cli) = start("resume_after_restart_and_stale_continuation") else {
        return;
    };
    let s = setup("resume", cli);
    s.fake.push_all([
        Step::text("first answer"),
        Step::text("second answer"),
        Step::text("third answer"),
        Step::text("fresh answer"),
        Step::text("fresh again"),
    ]);
    let provider = s.provider();
    let first = ask(&provider, "remember the word PAPAYA", None).await;
    let session = session_id(&first);
    provider.shutdown().await;

    // A new provider (the runner restarted) resumes the stored session.
    let provider = s.provider();
    let second = ask(&provider, "which word?", Some(&session)).await;
    assert_eq!(session_id(&second), session);
    assert_eq!(results(&second), vec![("second answer".to_owned(), 0)]);
    let request = s.turns().pop().unwrap();
    assert_eq!(
        request.user_texts(),
        vec![
            "remember the word PAPAYA".to_owned(),
            "which word?".to_owned()
        ],
        "history after resume"
    );
    assert!(
        request.system_text().contains("SYSTEM-MARKER-1"),
        "system prompt after resume"
    );

    // A changed system prompt reaches the model on the next prompt.
    let mut changed = input("and now?", Some(&session));
    changed.system_prompt = Some("SYSTEM-MARKER-2 replaces the old prompt.".into());
    let mut query = provider.query(changed).unwrap();
    until(&mut query, is_result).await;
    query.end();
    drain(&mut query).await;
    let request = s.turns().pop().unwrap();
    assert!(
        request.system_text().contains("SYSTEM-MARKER-2")
            && !request.system_text().contains("SYSTEM-MARKER-1"),
        "{}",
        request.system_text()
    );

    // A stored session that no longer exists.
    let stale = "ses_0000000000000000000000stale";
    let events = ask(&provider, "hello again", Some(stale)).await;
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ProviderEvent::Progress { message }
            if message.contains(stale) && message.contains("starting a new one"))),
        "{events:#?}"
    );
    let new_id = session_id(&events);
    assert_ne!(new_id, stale);
    assert_ne!(new_id, session);
    assert_eq!(results(&events), vec![("fresh answer".to_owned(), 0)]);
    assert!(final_errors(&events).is_empty());
    let request = s.turns().pop().unwrap();
    assert!(request.system_text().contains("SYSTEM-MARKER-1"));
    assert_eq!(request.user_texts(), vec!["hello again".to_owned()]);

    // An id that does not even look like an OpenCode session (another provider's).
    let events = ask(&provider, "and once more", Some("thread-from-codex")).await;
    assert_ne!(session_id(&events), "thread-from-codex");
    assert_eq!(results(&events), vec![("fresh again".to_owned(), 0)]);
    s.print_log();
    provider.shutdown().await;
}

/// 500 and 429 (with `retry-after-ms`) are retried `max_retries` times, then a non-retryable
/// error; 401 fails at once; the next prompt is answered normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_are_bounded_and_classified() {
    let Some(cli) = start("api_errors_are_bounded_and_classified") else {
        return;
    };
    let s = setup("api_errors", cli);
    let provider = s.provider();
    let mut session = None;
    // (status, class, retryable, model requests); status 0 = the connection drops mid-stream.
    // A 429 is a passing rate limit: retryable by the runner, with the wait the CLI was told.
    let rate_limited = ErrorClass::RateLimited {
        retry_after_secs: Some(scenarios::OPENCODE_RETRY_AFTER_MS.div_ceil(1000)),
    };
    for (status, class, retryable, requests) in [
        (500, ErrorClass::Api, false, 2),
        (429, rate_limited, true, 2),
        (401, ErrorClass::Auth, false, 1),
        (0, ErrorClass::Api, false, 2),
    ] {
        s.fake.clear_log();
        let step = if status == 0 {
            Step::drop_connection()
        } else {
            // Long enough for the abort after the retry notice to land before OpenCode's
            // next try, even on a loaded machine.
            Step::error(status, format!("fake {status} error"))
                .retry_after_ms(scenarios::OPENCODE_RETRY_AFTER_MS)
        };
        s.fake.set_script(std::iter::repeat_n(step, 10));
        let started = Instant::now();
        let events = ask(&provider, &format!("trigger {status}"), session.as_deref()).await;
        session = Some(session_id(&events));
        s.print_log();
        let errors = final_errors(&events);
        assert_eq!(errors.len(), 1, "{events:#?}");
        assert_eq!(errors[0].0, class, "{errors:?}");
        assert_eq!(
            errors[0].1, retryable,
            "only a rate limit is retryable after the CLI's retries: {errors:?}"
        );
        if status != 0 {
            assert!(
                errors[0].2.contains(&format!("fake {status} error")),
                "{errors:?}"
            );
        }
        assert!(results(&events).is_empty());
        assert_eq!(s.turns().len(), requests, "bounded retries for {status}");
        assert!(started.elapsed() < Duration::from_secs(30));
        if status != 401 {
            assert!(
                events.iter().any(|e| matches!(
                    e,
                    ProviderEvent::Error {
                        ends_turn: false,
                        retryable: true,
                        ..
                    }
                )),
                "a retry notice: {events:#?}"
            );
        }
    }
    s.fake.set_script([Step::text("recovered")]);
    let events = ask(&provider, "are you there?", session.as_deref()).await;
    assert_eq!(results(&events), vec![("recovered".to_owned(), 0)]);
    provider.shutdown().await;
}

/// The server killed mid-turn: a retryable Process error; the next query respawns the server
/// and resumes the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_mid_turn_is_a_retryable_process_error() {
    let Some(cli) = start("killed_server_mid_turn_is_a_retryable_process_error") else {
        return;
    };
    let s = setup("killed_server", cli);
    s.fake.push_all([
        Step::text("before the crash"),
        Step::hang().timeout_ms(30_000),
        Step::text("after the crash"),
    ]);
    let provider = s.provider();
    let session = session_id(&ask(&provider, "first", None).await);
    let mut query = provider.query(input("second", Some(&session))).unwrap();
    s.wait_turns(2).await;
    let pid = provider.server_pid().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let events = drain(&mut query).await;
    let errors = final_errors(&events);
    assert_eq!(errors.len(), 1, "{events:#?}");
    assert_eq!(errors[0].0, ErrorClass::Process);
    assert!(errors[0].1, "retryable");
    s.fake.release_hangs();

    let events = ask(&provider, "third", Some(&session)).await;
    s.print_log();
    assert_eq!(session_id(&events), session, "resumed");
    assert_eq!(results(&events), vec![("after the crash".to_owned(), 0)]);
    assert_ne!(provider.server_pid(), Some(pid), "a new server");
    let request = s.turns().pop().unwrap();
    let texts = request.user_texts();
    assert_eq!(
        texts.first().map(String::as_str),
        Some("first"),
        "{texts:?}"
    );
    assert_eq!(texts.last().map(String::as_str), Some("third"), "{texts:?}");
    provider.shutdown().await;
}

/// No session event for `watchdog`: the server is killed, a retryable Watchdog error; the next
/// query works on a new server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_kills_a_silent_turn() {
    let Some(cli) = start("watchdog_kills_a_silent_turn") else {
        return;
    };
    let mut s = setup("watchdog", cli);
    s.settings.watchdog = Duration::from_secs(6);
    s.fake
        .push_all([Step::hang().timeout_ms(40_000), Step::text("alive again")]);
    let provider = s.provider();
    let started = Instant::now();
    let events = ask(&provider, "hang please", None).await;
    let errors = final_errors(&events);
    assert_eq!(errors.len(), 1, "{events:#?}");
    assert_eq!(errors[0].0, ErrorClass::Watchdog);
    assert!(errors[0].1, "retryable");
    assert!(started.elapsed() < Duration::from_secs(40));
    s.fake.release_hangs();
    let events = ask(&provider, "hello?", Some(&session_id(&events))).await;
    s.print_log();
    assert_eq!(results(&events), vec![("alive again".to_owned(), 0)]);
    provider.shutdown().await;
}

/// The agent's shell sees neither host secrets nor the model API key; shutdown also kills a
/// shell command OpenCode started in a process group of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_shell_is_scrubbed_and_shutdown_kills_it() {
    let Some(cli) = start("agent_shell_is_scrubbed_and_shutdown_kills_it") else {
        return;
    };
    assert_eq!(std::env::var(MARKER_VAR).as_deref(), Ok(MARKER_VALUE));
    let s = setup("agent_shell", cli);
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
    let provider = s.provider();
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

#[test]
fn missing_cli_is_a_spawn_error_naming_opencode_path() {
    let mut settings = ProviderSettings::for_workspace("/nonexistent-workspace", "opencode");
    settings.cli_path = Some("/nonexistent/opencode".into());
    match OpenCodeProvider::new(settings) {
        Err(ProviderError::Spawn(message)) => {
            assert!(message.contains("OPENCODE_PATH"), "{message}")
        }
        other => panic!("expected a spawn error, got {other:?}"),
    }
}
