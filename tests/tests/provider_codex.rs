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

use std::path::PathBuf;
use std::time::{Duration, Instant};

use e2e::fake_model::Step;
use e2e::harness::codex_user_texts as user_texts;
use e2e::harness::{descendants, live_processes};
use e2e::provider_harness::{
    ask, drain, final_errors, input, is_result, results, session_id, until, ProviderSetup,
    ProviderSpec, MARKER_VALUE, MARKER_VAR,
};
use provider::codex::CodexProvider;
use provider::{AgentProvider, ErrorClass, Prompt, ProviderError, ProviderEvent, ProviderSettings};
use serde_json::json;

const KEY: &str = "sk-codex-provider-test-key";
/// Model "fake-model" on the Responses API; the marker is passed through to the CLI: the shell
/// must not see it.
const SPEC: ProviderSpec = ProviderSpec::openai("codex", KEY);

// ---------------------------------------------------------------------------------------------
// Harness (shared: e2e::provider_harness)
// ---------------------------------------------------------------------------------------------

/// Skips (CLI tests disabled) or re-executes in a child; `Some(cli)` = run the body here.
fn start(test: &str) -> Option<PathBuf> {
    e2e::provider_harness::start("codex", test)
}

fn setup(name: &'static str, cli: PathBuf) -> ProviderSetup {
    SPEC.setup(name, cli)
}

trait Spawn {
    fn provider(&self) -> CodexProvider;
}

impl Spawn for ProviderSetup {
    /// A provider; with `NANOCLAW_CODEX_CAPTURE=<dir>` it records its JSON-RPC transcript to
    /// `<dir>/<name>.jsonl`.
    fn provider(&self) -> CodexProvider {
        let provider = self.spawn(CodexProvider::new);
        if let Some(path) = self.capture_path("NANOCLAW_CODEX_CAPTURE") {
            provider.record_transcript(&path).unwrap();
        }
        provider
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_reply_with_the_generated_config() {
    let Some(cli) = start("text_reply_with_the_generated_config") else {
        return;
    };
    let s = setup("text_reply", cli);
    s.fake
        .push(Step::text("hello from the fake model").chunks(3));
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
    // The unknown-slug warning is a notice, not an error.
    assert!(
        events.iter().any(|e| matches!(e, ProviderEvent::Progress { message } if message.contains("Model metadata"))),
        "{events:#?}"
    );

    let requests = s.fake.model_requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.path, "/v1/responses");
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
        user_texts(request),
        vec!["<message id=\"1\">hi</message>".to_owned()]
    );
    assert!(
        request.offers_mcp_tool("send_message"),
        "tools: {:?}",
        request.tool_names()
    );
    // The private CODEX_HOME holds the session.
    assert!(s.settings.home_dir.join(".codex/sessions").is_dir());
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_message_through_mcp_tools_writes_a_row() {
    let Some(cli) = start("send_message_through_mcp_tools_writes_a_row") else {
        return;
    };
    let s = setup("mcp_tool_call", cli);
    s.fake.push_all([
        Step::tool_call(
            "send_message",
            json!({"text": "sent by the tool", "channel": "slack", "platformId": "C1"}),
        ),
        Step::text("done"),
    ]);
    let provider = s.provider();
    let events = ask(&provider, "please send", None).await;
    s.print_log();
    assert_eq!(results(&events), vec![("done".to_owned(), 0)]);
    assert!(
        events.iter().any(|e| matches!(e, ProviderEvent::Activity { tool: Some(t) } if t == "mcp__nanoclaw__send_message")),
        "{events:#?}"
    );
    let rows = s.db.all_messages_out().unwrap();
    assert!(
        rows.iter()
            .any(|row| row.content.contains("sent by the tool")),
        "no messages_out row from send_message: {rows:#?}"
    );
    let requests = s.fake.model_requests();
    assert_eq!(requests.len(), 2);
    assert!(
        requests[1].tail_is_tool_result(),
        "{}",
        requests[1].summary()
    );
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_mid_turn_restarts_with_every_unanswered_prompt() {
    let Some(cli) = start("push_mid_turn_restarts_with_every_unanswered_prompt") else {
        return;
    };
    let s = setup("push_restart", cli);
    s.fake.push_all([
        Step::hang().timeout_ms(20_000),
        Step::text("answer to both"),
    ]);
    let provider = s.provider();
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
    let Some(cli) = start("steer_mode_injects_the_push_into_the_running_turn") else {
        return;
    };
    let mut s = setup("push_steer", cli);
    s.settings.codex_steer = true;
    s.fake.push_all([
        Step::hang().timeout_ms(20_000),
        Step::text("steered answer"),
    ]);
    let provider = s.provider();
    let mut query = provider.query(input("first message", None)).unwrap();
    until(&mut query, |e| matches!(e, ProviderEvent::Init { .. })).await;
    s.fake
        .wait_for_model_requests(1, Duration::from_secs(20))
        .unwrap();
    query.push(Prompt::text("second message")).unwrap();
    let mut events = until(&mut query, is_result).await;
    query.end();
    events.extend(drain(&mut query).await);
    s.print_log();
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
    let Some(cli) = start("resume_after_restart_keeps_history_and_system_prompt") else {
        return;
    };
    let s = setup("resume", cli);
    s.fake.push_all([
        Step::text("first answer"),
        Step::text("second answer"),
        Step::text("third answer"),
    ]);
    let provider = s.provider();
    let first = ask(&provider, "remember the word PAPAYA", None).await;
    let thread = session_id(&first);
    provider.shutdown().await;

    // A new provider (the runner restarted) resumes the stored thread.
    let provider = s.provider();
    let second = ask(&provider, "which word?", Some(&thread)).await;
    assert_eq!(session_id(&second), thread);
    assert_eq!(results(&second), vec![("second answer".to_owned(), 0)]);
    let request = s.fake.model_requests().pop().unwrap();
    assert_eq!(
        user_texts(&request),
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

    // A changed system prompt reaches the model after a resume too.
    provider.shutdown().await;
    let provider = s.provider();
    let mut changed = input("and now?", Some(&thread));
    changed.system_prompt = Some("SYSTEM-MARKER-2 replaces the old prompt.".into());
    let mut query = provider.query(changed).unwrap();
    until(&mut query, is_result).await;
    query.end();
    drain(&mut query).await;
    let request = s.fake.model_requests().pop().unwrap();
    assert!(
        request.system_text().contains("SYSTEM-MARKER-2"),
        "{}",
        request.system_text()
    );
    s.print_log();
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_continuation_starts_a_new_session() {
    let Some(cli) = start("stale_continuation_starts_a_new_session") else {
        return;
    };
    let s = setup("stale_continuation", cli);
    s.fake.push(Step::text("fresh answer"));
    let provider = s.provider();
    let stale = "01a1fdf0-9061-7652-b74d-000000000000";
    let events = ask(&provider, "hello again", Some(stale)).await;
    s.print_log();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ProviderEvent::Progress { message }
            if message.contains(stale) && message.contains("starting a new one"))),
        "{events:#?}"
    );
    let new_id = session_id(&events);
    assert_ne!(new_id, stale);
    assert_eq!(results(&events), vec![("fresh answer".to_owned(), 0)]);
    assert!(final_errors(&events).is_empty());
    let request = s.fake.model_requests().pop().unwrap();
    assert!(request.system_text().contains("SYSTEM-MARKER-1"));
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_are_bounded_and_classified() {
    let Some(cli) = start("api_errors_are_bounded_and_classified") else {
        return;
    };
    let s = setup("api_errors", cli);
    let provider = s.provider();
    let mut thread = None;
    // (status, retry-after header, class, retryable): a 429 is a passing rate limit, retryable
    // by the runner; Codex honours the header but does not report the wait.
    for (status, retry_after, class, retryable) in [
        (500, false, ErrorClass::Api, false),
        (
            429,
            true,
            ErrorClass::RateLimited {
                retry_after_secs: None,
            },
            true,
        ),
        (401, false, ErrorClass::Auth, false),
    ] {
        s.fake.clear_log();
        let mut step = Step::error(status, format!("fake {status} error"));
        if retry_after {
            // Codex honours `retry-after` in seconds (it ignores `retry-after-ms`: no retry).
            step = step.retry_after_secs(1);
        }
        s.fake.set_script(std::iter::repeat_n(step, 10));
        let started = Instant::now();
        let events = ask(&provider, &format!("trigger {status}"), thread.as_deref()).await;
        let elapsed = started.elapsed();
        thread = Some(session_id(&events));
        let errors = final_errors(&events);
        assert_eq!(errors.len(), 1, "{status}: {events:#?}");
        assert_eq!(
            (errors[0].0, errors[0].1),
            (class, retryable),
            "{status}: {events:#?}"
        );
        assert!(results(&events).is_empty());
        let retries = events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    ProviderEvent::Error {
                        ends_turn: false,
                        ..
                    }
                )
            })
            .count();
        let requests = s.fake.model_requests().len();
        eprintln!("{status}: {requests} requests, {retries} retry notices, {elapsed:.2?}");
        assert!(
            (1..=4).contains(&requests),
            "{status}: bounded retries, got {requests} requests"
        );
        assert!(
            elapsed < Duration::from_secs(20),
            "{status}: took {elapsed:?}"
        );
    }
    // The next message is answered normally, on the same thread.
    s.fake.set_script([Step::text("back to normal")]);
    let events = ask(&provider, "are you there?", thread.as_deref()).await;
    assert_eq!(results(&events), vec![("back to normal".to_owned(), 0)]);
    assert_eq!(Some(session_id(&events)), thread);
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_cli_is_reported_and_the_next_query_resumes() {
    let Some(cli) = start("killed_cli_is_reported_and_the_next_query_resumes") else {
        return;
    };
    let s = setup("process_killed", cli);
    s.fake.push_all([
        Step::hang().timeout_ms(20_000),
        Step::text("after the crash"),
    ]);
    let provider = s.provider();
    let mut query = provider.query(input("doomed turn", None)).unwrap();
    let init = until(&mut query, |e| matches!(e, ProviderEvent::Init { .. })).await;
    let thread = session_id(&init);
    s.fake
        .wait_for_model_requests(1, Duration::from_secs(20))
        .unwrap();
    let pid = provider.pid().await.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let events = drain(&mut query).await;
    let errors = final_errors(&events);
    assert_eq!(errors.len(), 1, "{events:#?}");
    assert_eq!((errors[0].0, errors[0].1), (ErrorClass::Process, true));
    s.fake.release_hangs();

    let events = ask(&provider, "still there?", Some(&thread)).await;
    s.print_log();
    assert_eq!(results(&events), vec![("after the crash".to_owned(), 0)]);
    assert_eq!(session_id(&events), thread, "resumed the same thread");
    assert_ne!(provider.pid().await, Some(pid), "a new process");
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_kills_a_silent_turn() {
    let Some(cli) = start("watchdog_kills_a_silent_turn") else {
        return;
    };
    let mut s = setup("watchdog", cli);
    s.settings.watchdog = Duration::from_secs(2);
    s.fake.push_all([
        Step::text("quick"),
        Step::text("still quick"),
        Step::hang_before_response().timeout_ms(30_000),
        Step::text("awake"),
    ]);
    let provider = s.provider();
    // An app-server that sat idle longer than the watchdog between queries is not hung.
    let events = ask(&provider, "quick one", None).await;
    let thread = session_id(&events);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let events = ask(&provider, "after idling", Some(&thread)).await;
    assert_eq!(
        results(&events),
        vec![("still quick".to_owned(), 0)],
        "{events:#?}"
    );

    let started = Instant::now();
    let mut query = provider.query(input("hang please", Some(&thread))).unwrap();
    let events = drain(&mut query).await;
    let errors = final_errors(&events);
    assert_eq!(errors.len(), 1, "{events:#?}");
    assert_eq!((errors[0].0, errors[0].1), (ErrorClass::Watchdog, true));
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(provider.pid().await, None, "the process group was stopped");
    s.fake.release_hangs();
    let events = ask(&provider, "again", Some(&session_id(&events))).await;
    assert_eq!(results(&events), vec![("awake".to_owned(), 0)]);
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_interrupts_the_turn_and_keeps_the_process() {
    let Some(cli) = start("abort_interrupts_the_turn_and_keeps_the_process") else {
        return;
    };
    let s = setup("abort", cli);
    s.fake
        .push_all([Step::hang().timeout_ms(20_000), Step::text("next")]);
    let provider = s.provider();
    let mut query = provider.query(input("long task", None)).unwrap();
    let init = until(&mut query, |e| matches!(e, ProviderEvent::Init { .. })).await;
    s.fake
        .wait_for_model_requests(1, Duration::from_secs(20))
        .unwrap();
    let pid = provider.pid().await;
    let started = Instant::now();
    query.abort();
    let events = drain(&mut query).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let errors = final_errors(&events);
    assert_eq!(errors.len(), 1, "{events:#?}");
    assert_eq!(errors[0].0, ErrorClass::Aborted);
    assert_eq!(provider.pid().await, pid, "the CLI stays alive");
    let events = ask(&provider, "next one", Some(&session_id(&init))).await;
    assert_eq!(results(&events), vec![("next".to_owned(), 0)]);
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_never_sees_the_api_key_or_host_secrets() {
    let Some(cli) = start("shell_never_sees_the_api_key_or_host_secrets") else {
        return;
    };
    let s = setup("shell_env", cli);
    assert_eq!(
        std::env::var(MARKER_VAR).as_deref(),
        Ok(MARKER_VALUE),
        "the child has the marker"
    );
    s.fake.push_all([
        Step::raw_tool_call("exec_command", json!({"cmd": "env"})),
        Step::text("listed"),
    ]);
    let provider = s.provider();
    let events = ask(&provider, "run env", None).await;
    s.print_log();
    assert_eq!(results(&events), vec![("listed".to_owned(), 0)]);
    let request = s.fake.model_requests().pop().unwrap();
    let output = request.tool_results().join("\n");
    assert!(output.contains("HOME="), "the shell ran env: {output}");
    assert!(output.contains("TZ=UTC"), "TZ reaches the shell: {output}");
    assert!(
        !output.contains(KEY),
        "the API key reached the shell: {output}"
    );
    assert!(
        !output.contains(MARKER_VALUE),
        "a host secret reached the shell: {output}"
    );
    provider.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_codex_and_its_mcp_servers() {
    let Some(cli) = start("shutdown_stops_codex_and_its_mcp_servers") else {
        return;
    };
    let s = setup("shutdown", cli);
    s.fake.push(Step::text("bye"));
    let provider = s.provider();
    ask(&provider, "hi", None).await;
    let pid = provider.pid().await.unwrap();
    let children = descendants(pid);
    eprintln!("codex {pid}: descendants {children:?}");
    // Codex starts each MCP server in a process group of its own (measured), so the provider
    // must stop them beyond the group kill.
    let mcp: Vec<u32> = children
        .iter()
        .filter(|(_, cmd)| cmd.contains("mcp-tools"))
        .map(|(p, _)| *p)
        .collect();
    assert_eq!(mcp.len(), 1, "one mcp-tools under codex: {children:?}");
    provider.shutdown().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let alive: Vec<_> = live_processes()
        .into_iter()
        .filter(|(p, ..)| *p == pid || mcp.contains(p))
        .collect();
    assert!(alive.is_empty(), "left running after shutdown: {alive:?}");
    drop(s.dir);
}

/// `/clear` makes the runner drop the continuation: the new thread gets a fresh app-server (a
/// loaded thread keeps its MCP server running even after `thread/unsubscribe`), and the old
/// thread can still be resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_session_gets_a_fresh_process_and_old_ones_resume() {
    let Some(cli) = start("new_session_gets_a_fresh_process_and_old_ones_resume") else {
        return;
    };
    let s = setup("new_session", cli);
    s.fake
        .push_all([Step::text("one"), Step::text("two"), Step::text("three")]);
    let provider = s.provider();
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

#[test]
fn missing_cli_is_a_spawn_error_naming_codex_path() {
    let mut settings = ProviderSettings::for_workspace("/nonexistent-workspace", "codex");
    settings.cli_path = Some("/nonexistent/codex".into());
    match CodexProvider::new(settings) {
        Err(ProviderError::Spawn(message)) => assert!(message.contains("CODEX_PATH"), "{message}"),
        other => panic!("expected a spawn error, got {other:?}"),
    }
}
