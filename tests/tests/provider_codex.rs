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

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use e2e::fake_model::{FakeModel, LoggedRequest, Step};
use provider::codex::CodexProvider;
use provider::{
    AgentProvider, AgentQuery, ErrorClass, Prompt, ProviderError, ProviderEvent, ProviderSettings,
    QueryInput,
};
use serde_json::json;

const KEY: &str = "sk-codex-provider-test-key";
/// Set in the test process's environment and passed through to the CLI: the shell must not see it.
const MARKER_VAR: &str = "NANOCLAW_MARKER_SECRET";
const MARKER_VALUE: &str = "marker-secret-0451";
const SYSTEM_PROMPT: &str = "You are the NanoClaw test agent. SYSTEM-MARKER-1.";
const EVENT_TIMEOUT: Duration = Duration::from_secs(40);

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The codex CLI, or `None` when CLI tests are skipped. Panics with instructions when missing.
fn codex_cli() -> Option<PathBuf> {
    if std::env::var("NANOCLAW_SKIP_CLI_TESTS").as_deref() == Ok("1") {
        eprintln!("NANOCLAW_SKIP_CLI_TESTS=1: skipping a codex CLI test");
        return None;
    }
    let path = std::env::var_os("CODEX_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cli/node_modules/.bin/codex"));
    assert!(
        path.exists(),
        "the codex CLI is missing at {}: run scripts/install-clis.sh (or set CODEX_PATH; \
         NANOCLAW_SKIP_CLI_TESTS=1 skips these tests)",
        path.display()
    );
    Some(path)
}

/// The mcp-tools binary, built once if needed.
fn mcp_tools() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(path) = std::env::var_os("MCP_TOOLS_PATH") {
            return PathBuf::from(path);
        }
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_root().join("target"));
        let path = target.join("debug/mcp-tools");
        if !path.exists() {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let status = Command::new(cargo)
                .args(["build", "-p", "mcp-tools"])
                .current_dir(repo_root())
                .status()
                .expect("run cargo build -p mcp-tools");
            assert!(status.success(), "cargo build -p mcp-tools failed");
        }
        assert!(path.exists(), "mcp-tools not found at {}", path.display());
        path
    })
    .clone()
}

fn netns_available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        Command::new("unshare")
            .args(["-n", "sh", "-c", "ip link set lo up"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Returns true when the caller should run the test body in this process. Otherwise re-runs
/// `test` alone in a child process (inside a loopback-only network namespace when possible)
/// with the marker secret in its environment, asserts it passed, and returns false.
fn in_child(test: &str) -> bool {
    if std::env::var_os("NANOCLAW_IN_CHILD").is_some() {
        return true;
    }
    let netns = std::env::var("NANOCLAW_NETNS").as_deref() != Ok("0") && netns_available();
    let exe = std::env::current_exe().unwrap();
    let mut cmd = if netns {
        let mut cmd = Command::new("unshare");
        cmd.args(["-n", "sh", "-c", "ip link set lo up && exec \"$@\"", "sh"])
            .arg(exe);
        cmd
    } else {
        Command::new(exe)
    };
    let started = Instant::now();
    let out = cmd
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("NANOCLAW_IN_CHILD", "1")
        .env(MARKER_VAR, MARKER_VALUE)
        .stdin(Stdio::null())
        .output()
        .expect("re-run the test in a child process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("----- {test} (loopback-only netns: {netns}) -----\n{stdout}{stderr}");
    eprintln!("----- {test}: {:.2?} -----", started.elapsed());
    assert!(out.status.success(), "{test} failed in the child process");
    assert!(
        stdout.contains(&format!("test {test} ... ok")),
        "{test} did not run in the child process"
    );
    false
}

/// Skips (CLI tests disabled) or re-executes in a child; `Some(cli)` = run the body here.
fn start(test: &str) -> Option<PathBuf> {
    let cli = codex_cli()?;
    in_child(test).then_some(cli)
}

struct Setup {
    name: &'static str,
    dir: tempfile::TempDir,
    fake: FakeModel,
    settings: ProviderSettings,
    db: schema::db::SessionDb,
}

fn setup(name: &'static str, cli: PathBuf) -> Setup {
    let dir = tempfile::Builder::new()
        .prefix("nanoclaw-codex-")
        .tempdir()
        .unwrap();
    let workspace = dir.path().to_path_buf();
    let fake = FakeModel::start().unwrap();
    let mut settings = ProviderSettings::for_workspace(&workspace, "codex");
    std::fs::create_dir_all(&settings.agent_dir).unwrap();
    let db = schema::db::SessionDb::open(&settings.session_db).unwrap();
    settings.cli_path = Some(cli);
    settings.mcp_tools_path = mcp_tools();
    settings.model = Some("fake-model".into());
    settings.base_url = Some(fake.openai_base_url());
    settings.api_key = Some(KEY.into());
    settings.max_retries = 1;
    settings.watchdog = Duration::from_secs(60);
    settings.env_policy.passthrough.push(MARKER_VAR.into());
    Setup {
        name,
        dir,
        fake,
        settings,
        db,
    }
}

impl Setup {
    fn provider(&self) -> CodexProvider {
        let provider = CodexProvider::new(self.settings.clone()).unwrap();
        if let Some(dir) = std::env::var_os("NANOCLAW_CODEX_CAPTURE") {
            let path = Path::new(&dir).join(format!("{}.jsonl", self.name));
            provider.record_transcript(&path).unwrap();
        }
        provider
    }

    fn print_log(&self) {
        for r in self.fake.requests() {
            eprintln!("    {}", r.summary());
        }
    }
}

fn input(text: &str, continuation: Option<&str>) -> QueryInput {
    QueryInput {
        prompt: Prompt::text(text),
        continuation: continuation.map(str::to_owned),
        system_prompt: Some(SYSTEM_PROMPT.into()),
    }
}

/// Events until the stream closes.
async fn drain(query: &mut AgentQuery) -> Vec<ProviderEvent> {
    let mut events = Vec::new();
    loop {
        match tokio::time::timeout(EVENT_TIMEOUT, query.next_event()).await {
            Ok(Some(event)) => {
                eprintln!("  event: {event:?}");
                events.push(event);
            }
            Ok(None) => return events,
            Err(_) => panic!("no event for {EVENT_TIMEOUT:?}; so far: {events:#?}"),
        }
    }
}

/// Events until (and including) the first one matching `stop`.
async fn until(
    query: &mut AgentQuery,
    stop: impl Fn(&ProviderEvent) -> bool,
) -> Vec<ProviderEvent> {
    let mut events = Vec::new();
    loop {
        match tokio::time::timeout(EVENT_TIMEOUT, query.next_event()).await {
            Ok(Some(event)) => {
                eprintln!("  event: {event:?}");
                let done = stop(&event);
                events.push(event);
                if done {
                    return events;
                }
            }
            Ok(None) => panic!("the stream closed early: {events:#?}"),
            Err(_) => panic!("no event for {EVENT_TIMEOUT:?}; so far: {events:#?}"),
        }
    }
}

fn is_result(event: &ProviderEvent) -> bool {
    matches!(event, ProviderEvent::Result { .. })
}

fn session_id(events: &[ProviderEvent]) -> String {
    events
        .iter()
        .rev()
        .find_map(|e| match e {
            ProviderEvent::Init { session_id } => Some(session_id.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no Init in {events:#?}"))
}

fn results(events: &[ProviderEvent]) -> Vec<(String, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::Result { text, covers } => Some((text.clone(), *covers)),
            _ => None,
        })
        .collect()
}

fn final_errors(events: &[ProviderEvent]) -> Vec<(ErrorClass, bool, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::Error {
                classification,
                retryable,
                ends_turn: true,
                message,
            } => Some((*classification, *retryable, message.clone())),
            _ => None,
        })
        .collect()
}

/// One query answered with a text; returns the events (stream closed after `end`).
async fn ask(
    provider: &CodexProvider,
    text: &str,
    continuation: Option<&str>,
) -> Vec<ProviderEvent> {
    let mut query = provider.query(input(text, continuation)).unwrap();
    let mut events = until(&mut query, |e| {
        is_result(e)
            || matches!(
                e,
                ProviderEvent::Error {
                    ends_turn: true,
                    ..
                }
            )
    })
    .await;
    query.end();
    events.extend(drain(&mut query).await);
    events
}

fn user_texts(request: &LoggedRequest) -> Vec<String> {
    request
        .user_texts()
        .into_iter()
        .filter(|t| !t.starts_with("<environment_context>"))
        .collect()
}

/// Live (non-zombie) processes: pid → (ppid, pgid, command line).
fn live_processes() -> Vec<(u32, u32, u32, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the ")" of the command name: state ppid pgrp ...
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() == Some(&"Z") {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        out.push((
            pid,
            fields[1].parse().unwrap_or(0),
            fields[2].parse().unwrap_or(0),
            cmdline,
        ));
    }
    out
}

/// The live descendants of `root` (pid and command line).
fn descendants(root: u32) -> Vec<(u32, String)> {
    let all = live_processes();
    let mut found: Vec<(u32, String)> = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for (pid, ppid, _, cmd) in &all {
            if *ppid == parent && !found.iter().any(|(p, _)| p == pid) {
                found.push((*pid, cmd.clone()));
                frontier.push(*pid);
            }
        }
    }
    found
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
    for (status, retry_after, class) in [
        (500, false, ErrorClass::Api),
        (429, true, ErrorClass::Quota),
        (401, false, ErrorClass::Auth),
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
            (class, false),
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
