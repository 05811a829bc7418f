//! The provider-level scenarios shared by the CLI providers: each is an async function generic
//! over the provider under test ([`CliProvider`]: Claude, Codex, OpenCode) that takes what
//! really differs between the CLIs as data (scripted steps, expected classifications, retry
//! counts, the notices that appear). The suites `provider_<cli>.rs` declare one test per
//! (scenario, CLI) with [`provider_scenario_tests!`], plus the tests only one CLI has.
//!
//! Adding a provider: one [`CliProvider`] impl below and one `provider_scenario_tests!` entry
//! per scenario.

use std::future::Future;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use claude::ClaudeProvider;
use codex::CodexProvider;
use opencode::OpenCodeProvider;
use provider::recording::Recording;
use provider::{
    AgentProvider, AgentQuery, ErrorClass, Prompt, ProviderError, ProviderEvent, ProviderSettings,
};
use serde_json::json;

use crate::fake_model::{LoggedRequest, Step};
use crate::harness::{alive, cli_env_var, descendants};
use crate::provider_harness::{
    ask_for, drain_for, final_errors, input, is_result, results, session_id, until_for, ModelApi,
    ProviderSetup, ProviderSpec, EVENT_TIMEOUT, MARKER_VALUE, MARKER_VAR,
};
use crate::scenarios::{kill_pid, ok, some, user_texts};

/// Declares one `#[tokio::test]` per shared provider scenario for the provider type `$cli` (a
/// [`CliProvider`]). Each test starts with [`start`] under its own name (skip, or re-run alone
/// in a child process), then awaits the scenario with the CLI's path and the extra arguments.
/// An entry is `name(args);` for the scenario of the same name, or `name = scenario(args);`
/// when the test's name names the CLI (e.g. `shutdown_stops_codex_and_its_mcp_servers`).
#[macro_export]
macro_rules! provider_scenario_tests {
    (@one $cli:ty; [$(#[$attr:meta])*] $test:ident [$scenario:ident] ($($arg:expr),*)) => {
        $(#[$attr])*
        #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            if let Some(cli) = $crate::provider_scenarios::start::<$cli>(stringify!($test)) {
                $crate::provider_scenarios::$scenario::<$cli>(cli $(, $arg)*).await;
            }
        }
    };
    (@one $cli:ty; [$(#[$attr:meta])*] $test:ident [] ($($arg:expr),*)) => {
        $crate::provider_scenario_tests!(@one $cli; [$(#[$attr])*] $test [$test] ($($arg),*));
    };
    ($cli:ty; $($(#[$attr:meta])* $test:ident $(= $scenario:ident)? ($($arg:expr),*);)*) => {
        $(
            $crate::provider_scenario_tests!(
                @one $cli; [$(#[$attr])*] $test [$($scenario)?] ($($arg),*)
            );
        )*
    };
}

// ---------------------------------------------------------------------------------------------
// The providers under test
// ---------------------------------------------------------------------------------------------

/// A CLI provider as its tests build and observe it.
pub trait CliProvider: AgentProvider + Sized {
    /// How its tests set it up (the provider's name, API, model and key).
    const SPEC: ProviderSpec;
    /// How long to wait for each provider event.
    const EVENT_TIMEOUT: Duration = EVENT_TIMEOUT;
    /// Whether [`CliProvider::cli_pid`] answers while a turn runs (Claude's waits for the
    /// query that holds the process to finish).
    const PID_DURING_A_TURN: bool = true;

    /// The provider from `settings` (its `new`).
    fn create(settings: ProviderSettings) -> Result<Self, ProviderError>;

    /// The provider for a test's setup; a CLI with a capture variable records its protocol
    /// where the variable says.
    fn spawn(setup: &ProviderSetup) -> Self {
        setup.spawn(Self::create)
    }

    /// The pid of the live CLI process (`claude`, `codex app-server`, `opencode serve`); see
    /// [`CliProvider::PID_DURING_A_TURN`].
    fn cli_pid(&self) -> impl Future<Output = Option<u32>> + Send;
}

impl CliProvider for ClaudeProvider {
    const SPEC: ProviderSpec = ProviderSpec {
        provider: "claude",
        api: ModelApi::Anthropic,
        model: "claude-test-model",
        api_key: "sk-claude-provider-test-key",
        // Passed through explicitly where a test needs it.
        pass_marker: false,
    };
    const PID_DURING_A_TURN: bool = false;

    fn create(settings: ProviderSettings) -> Result<Self, ProviderError> {
        Self::new(settings)
    }

    async fn cli_pid(&self) -> Option<u32> {
        self.pid().await
    }
}

impl CliProvider for CodexProvider {
    /// Model "fake-model" on the Responses API; the marker is passed through to the CLI: the
    /// shell must not see it.
    const SPEC: ProviderSpec = ProviderSpec::openai("codex", "sk-codex-provider-test-key");

    fn create(settings: ProviderSettings) -> Result<Self, ProviderError> {
        Self::new(settings)
    }

    /// With `NANOCLAW_CODEX_CAPTURE=<dir>` the provider records its JSON-RPC transcript to
    /// `<dir>/<name>.jsonl`.
    fn spawn(setup: &ProviderSetup) -> Self {
        let provider = setup.spawn(Self::create);
        if let Some(path) = setup.capture_path("NANOCLAW_CODEX_CAPTURE") {
            ok(
                provider.record_transcript(fixture_recording(path)),
                "recording the transcript",
            );
        }
        provider
    }

    async fn cli_pid(&self) -> Option<u32> {
        self.pid().await
    }
}

impl CliProvider for OpenCodeProvider {
    /// Model "fake-model" on Chat Completions; the marker is passed through to the CLI: the
    /// shell must not see it.
    const SPEC: ProviderSpec = ProviderSpec::openai("opencode", "sk-opencode-provider-test-key");
    /// OpenCode's first prompt is slow to start.
    const EVENT_TIMEOUT: Duration = Duration::from_secs(60);

    fn create(settings: ProviderSettings) -> Result<Self, ProviderError> {
        Self::new(settings)
    }

    /// With `NANOCLAW_OPENCODE_CAPTURE=<dir>` the provider records what it read and posted to
    /// `<dir>/<name>.jsonl`.
    fn spawn(setup: &ProviderSetup) -> Self {
        let provider = setup.spawn(Self::create);
        if let Some(path) = setup.capture_path("NANOCLAW_OPENCODE_CAPTURE") {
            if let Some(dir) = path.parent() {
                ok(std::fs::create_dir_all(dir), "creating the capture folder");
            }
            // A leftover capture of an earlier run would be appended to.
            let _ = std::fs::remove_file(&path);
            provider.record_events(fixture_recording(path));
        }
        provider
    }

    async fn cli_pid(&self) -> Option<u32> {
        self.server_pid()
    }
}

/// A capture for a fixture: the checkout's path (its `target/` build of `mcp-tools`, its `.cli/`
/// install of the CLI) is written as a placeholder, since fixtures are committed.
fn fixture_recording(path: PathBuf) -> Recording {
    Recording::new(path).hiding_checkout(&crate::harness::repo_root())
}

/// Skips (CLI tests disabled) or re-runs `test` alone in a child process
/// ([`crate::provider_harness::start`]); `Some(cli)` = the CLI's path, run the body here.
pub fn start<P: CliProvider>(test: &str) -> Option<PathBuf> {
    crate::provider_harness::start(P::SPEC.provider, test)
}

/// [`ProviderSpec::setup`] for `P`: `name` names the test's capture files.
pub fn setup<P: CliProvider>(name: &'static str, cli: PathBuf) -> ProviderSetup {
    P::SPEC.setup(name, cli)
}

impl ProviderSetup {
    /// The provider `P` for this setup ([`CliProvider::spawn`]).
    pub fn provider<P: CliProvider>(&self) -> P {
        P::spawn(self)
    }
}

/// One query until its result or final error, then the rest of the stream, waiting
/// `P::EVENT_TIMEOUT` at most for each event.
async fn ask<P: CliProvider>(
    provider: &P,
    text: &str,
    continuation: Option<&str>,
) -> Vec<ProviderEvent> {
    ask_for(provider, input(text, continuation), P::EVENT_TIMEOUT).await
}

/// Events until the stream closes, waiting `P::EVENT_TIMEOUT` at most for each.
async fn drain<P: CliProvider>(query: &mut AgentQuery) -> Vec<ProviderEvent> {
    drain_for(query, P::EVENT_TIMEOUT).await
}

/// The query `text` was sent as (a panic when the provider refuses it).
fn query<P: CliProvider>(provider: &P, text: &str, continuation: Option<&str>) -> AgentQuery {
    ok(
        provider.query(input(text, continuation)),
        "starting a query",
    )
}

/// The last model request of the turns so far.
fn last_turn(s: &ProviderSetup) -> LoggedRequest {
    some(s.turns().pop(), "a model request")
}

/// The header that carries the API key to the model, and its value for `spec`.
fn key_header(spec: &ProviderSpec) -> (&'static str, String) {
    match spec.api {
        ModelApi::Anthropic => ("x-api-key", spec.api_key.to_owned()),
        ModelApi::OpenAi => ("authorization", format!("Bearer {}", spec.api_key)),
    }
}

// ---------------------------------------------------------------------------------------------
// Checks shared by scenarios and CLI-specific tests
// ---------------------------------------------------------------------------------------------

/// The checks of a first turn answering `<message id="1">hi</message>` with "hello from the
/// fake model": that one result and no error; ONE model request, to `path`, carrying the key,
/// the model, the system prompt, the user text and the mcp-tools tools. Returns the request.
pub fn assert_first_text_reply<P: CliProvider>(
    s: &ProviderSetup,
    events: &[ProviderEvent],
    path: &str,
) -> LoggedRequest {
    assert_eq!(
        results(events),
        vec![("hello from the fake model".to_owned(), 0)]
    );
    assert!(final_errors(events).is_empty(), "{events:#?}");
    let mut requests = s.turns();
    assert_eq!(requests.len(), 1);
    let request = requests.remove(0);
    assert_eq!(request.path, path);
    let (header, value) = key_header(&P::SPEC);
    assert_eq!(request.header(header), Some(value.as_str()));
    assert_eq!(request.model(), Some(P::SPEC.model));
    assert!(
        request.system_text().contains("SYSTEM-MARKER-1"),
        "system prompt missing: {}",
        request.system_text()
    );
    assert_eq!(
        user_texts(P::SPEC.provider, &request),
        vec!["<message id=\"1\">hi</message>".to_owned()]
    );
    assert!(
        request.offers_mcp_tool("send_message"),
        "MCP tools sent directly: {:?}",
        request.tool_names()
    );
    request
}

/// The checks of a turn in which the model called send_message ("sent by the tool") and then
/// answered "done": that result, the CLI's report of the tool `tool`, the row mcp-tools wrote,
/// `turns` model requests so far, the last one carrying the tool's result. Returns the
/// requests.
pub fn assert_send_message_wrote_a_row(
    s: &ProviderSetup,
    events: &[ProviderEvent],
    tool: &str,
    turns: usize,
) -> Vec<LoggedRequest> {
    assert_eq!(results(events), vec![("done".to_owned(), 0)]);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ProviderEvent::Activity { tool: Some(t), .. } if t == tool)),
        "{events:#?}"
    );
    let rows = ok(s.db.all_messages_out(), "reading messages_out");
    assert!(
        rows.iter()
            .any(|row| row.content.contains("sent by the tool")),
        "no messages_out row from send_message: {rows:#?}"
    );
    let requests = s.turns();
    assert_eq!(requests.len(), turns);
    let last = some(requests.last(), "a model request");
    assert!(last.tail_is_tool_result(), "{}", last.summary());
    requests
}

/// A query "hello again" continuing `stale`, a session that does not exist: a notice naming
/// it and containing `notice`, the answer "fresh answer" (the script's next step) and no
/// error, in a new session with the system prompt and no history. Returns the new session.
pub async fn assert_stale_continuation_replaced<P: CliProvider>(
    s: &ProviderSetup,
    provider: &P,
    stale: &str,
    notice: &str,
) -> String {
    let events = ask(provider, "hello again", Some(stale)).await;
    s.print_log();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ProviderEvent::Progress { message }
            if message.contains(stale) && message.contains(notice))),
        "{events:#?}"
    );
    let session = session_id(&events);
    assert_ne!(session, stale);
    assert_eq!(results(&events), vec![("fresh answer".to_owned(), 0)]);
    assert!(final_errors(&events).is_empty(), "{events:#?}");
    let request = last_turn(s);
    assert_eq!(
        user_texts(P::SPEC.provider, &request),
        vec!["hello again".to_owned()]
    );
    assert!(request.system_text().contains("SYSTEM-MARKER-1"));
    session
}

/// A session answered once ("remember the word PAPAYA"), the provider shut down, and a new
/// provider (the runner restarted) resuming it with "which word?": the same session, the
/// answer "second answer" (the script's second step), the history and the system prompt
/// reach the model. Returns the new provider and the session.
pub async fn resume_after_a_restart<P: CliProvider>(s: &ProviderSetup) -> (P, String) {
    let provider = s.provider::<P>();
    let first = ask(&provider, "remember the word PAPAYA", None).await;
    let session = session_id(&first);
    provider.shutdown().await;

    let provider = s.provider::<P>();
    let second = ask(&provider, "which word?", Some(&session)).await;
    assert_eq!(session_id(&second), session);
    assert_eq!(results(&second), vec![("second answer".to_owned(), 0)]);
    let request = last_turn(s);
    assert_eq!(
        user_texts(P::SPEC.provider, &request),
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
    (provider, session)
}

/// A query "and now?" continuing `session` with a new system prompt (SYSTEM-MARKER-2): it
/// ends with a result, and the model's request carries the new prompt. Returns the request's
/// system text.
pub async fn system_prompt_change_reaches_the_model<P: CliProvider>(
    s: &ProviderSetup,
    provider: &P,
    session: &str,
) -> String {
    let mut changed = input("and now?", Some(session));
    changed.system_prompt = Some("SYSTEM-MARKER-2 replaces the old prompt.".into());
    let mut query = ok(provider.query(changed), "starting a query");
    until_for(&mut query, P::EVENT_TIMEOUT, is_result).await;
    query.end();
    drain::<P>(&mut query).await;
    let system = last_turn(s).system_text();
    assert!(system.contains("SYSTEM-MARKER-2"), "{system}");
    system
}

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

/// The model calls send_message: mcp-tools (spawned by the CLI with the generated config)
/// writes the row; the CLI reports the call as the tool `tool` and sends the model the tool's
/// result, not an error.
pub async fn send_message_through_mcp_tools_writes_a_row<P: CliProvider>(cli: PathBuf, tool: &str) {
    let s = setup::<P>("mcp_tool_call", cli);
    s.fake.push_all([
        Step::tool_call(
            "send_message",
            json!({"text": "sent by the tool", "channel": "slack", "platformId": "C1"}),
        ),
        Step::text("done"),
    ]);
    let provider = s.provider::<P>();
    let events = ask(&provider, "please send", None).await;
    s.print_log();
    let requests = assert_send_message_wrote_a_row(&s, &events, tool, 2);
    assert!(
        requests[1]
            .tool_results()
            .iter()
            .all(|r| !r.contains("rror")),
        "{:?}",
        requests[1].tool_results()
    );
    provider.shutdown().await;
}

/// A stored continuation naming a session that does not exist (`stale`, in the CLI's id
/// shape): the provider says so (a notice naming the id and containing `notice`), starts a new
/// session with the system prompt, answers the same prompt and reports the new id.
pub async fn stale_continuation_starts_a_new_session<P: CliProvider>(
    cli: PathBuf,
    stale: &str,
    notice: &str,
) {
    let s = setup::<P>("stale_continuation", cli);
    s.fake.push(Step::text("fresh answer"));
    let provider = s.provider::<P>();
    assert_stale_continuation_replaced(&s, &provider, stale, notice).await;
    provider.shutdown().await;
}

/// The classification a turn-ending error must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpectedClass {
    /// Exactly this class.
    Is(ErrorClass),
    /// A rate limit that says when to retry, whatever the wait (the CLI adds jitter).
    RateLimitedWithReset,
}

impl ExpectedClass {
    fn matches(self, class: ErrorClass) -> bool {
        match self {
            Self::Is(expected) => class == expected,
            Self::RateLimitedWithReset => matches!(
                class,
                ErrorClass::RateLimited {
                    retry_after_secs: Some(_)
                }
            ),
        }
    }
}

/// One failing turn of [`api_errors_are_bounded_and_classified`] and what the provider must
/// make of it.
#[derive(Debug, Clone)]
pub struct ApiErrorCase {
    /// What the case is called in the prompt and in messages (`500`, `dropped connection`).
    pub label: &'static str,
    /// The fake model's answer to every request of the turn.
    pub step: Step,
    /// The classification of the one turn-ending error.
    pub class: ExpectedClass,
    /// Whether that error is retryable (by the runner, after the CLI's own retries).
    pub retryable: bool,
    /// What its message must contain, where the CLI passes the API's message on.
    pub message_contains: Option<&'static str>,
    /// How many model requests the turn makes (the CLI's bounded retries).
    pub requests: RangeInclusive<usize>,
    /// How many retry notices (`Error{ends_turn: false, retryable: true}`) the turn shows ...
    pub notices: RangeInclusive<usize>,
    /// ... counting only those of this class (compared by name: any rate limit), if given.
    pub notice_class: Option<ErrorClass>,
}

/// Model API errors: each case's turn makes a bounded number of requests (the CLI's own
/// retries, `max_retries` 1), shows the expected retry notices and ends with ONE classified
/// error within `each_within` (all of them and the recovery within `all_within`, if given);
/// the next prompt is answered normally on the same session. The request counts are the bound
/// under test; the times are a safety net against a retry loop, generous enough for a loaded
/// 2-core machine (a 30 s limit failed there at 32 s).
pub async fn api_errors_are_bounded_and_classified<P: CliProvider>(
    cli: PathBuf,
    cases: Vec<ApiErrorCase>,
    each_within: Duration,
    all_within: Option<Duration>,
) {
    let s = setup::<P>("api_errors", cli);
    let provider = s.provider::<P>();
    let mut session = None;
    let all = Instant::now();
    for case in cases {
        let label = case.label;
        s.fake.clear_log();
        s.fake
            .set_script(std::iter::repeat_n(case.step.clone(), 10));
        let started = Instant::now();
        let events = ask(&provider, &format!("trigger {label}"), session.as_deref()).await;
        let elapsed = started.elapsed();
        session = Some(session_id(&events));
        s.print_log();
        let errors = final_errors(&events);
        assert_eq!(errors.len(), 1, "{label}: {events:#?}");
        assert!(case.class.matches(errors[0].0), "{label}: {errors:?}");
        assert_eq!(errors[0].1, case.retryable, "{label}: {errors:?}");
        if let Some(text) = case.message_contains {
            assert!(errors[0].2.contains(text), "{label}: {errors:?}");
        }
        assert!(results(&events).is_empty(), "{label}: {events:#?}");
        let notices = events
            .iter()
            .filter(|e| match e {
                ProviderEvent::Error {
                    ends_turn: false,
                    retryable: true,
                    classification,
                    ..
                } => case
                    .notice_class
                    .is_none_or(|class| class.name() == classification.name()),
                _ => false,
            })
            .count();
        let requests = s.turns().len();
        eprintln!("{label}: {requests} requests, {notices} retry notices, {elapsed:.2?}");
        assert!(
            case.requests.contains(&requests),
            "{label}: bounded retries, got {requests} requests"
        );
        assert!(
            case.notices.contains(&notices),
            "{label}: {notices} retry notices: {events:#?}"
        );
        assert!(elapsed < each_within, "{label}: took {elapsed:?}");
    }
    // The next message is answered normally, on the same session.
    s.fake.clear_log();
    s.fake.set_script([Step::text("recovered")]);
    let events = ask(&provider, "are you there?", session.as_deref()).await;
    s.print_log();
    assert_eq!(results(&events), vec![("recovered".to_owned(), 0)]);
    assert_eq!(Some(session_id(&events)), session);
    assert_eq!(s.turns().len(), 1);
    if let Some(limit) = all_within {
        assert!(all.elapsed() < limit, "bounded: {:?}", all.elapsed());
    }
    provider.shutdown().await;
}

/// The CLI process is killed mid-turn (the session's first turn, or its second when
/// `answer_first`): ONE retryable `Process` error; the next query respawns the CLI and resumes
/// the same session (with the history of the turn before the crash). `capture` names the
/// capture file.
pub async fn killed_cli_is_reported_and_the_next_query_resumes<P: CliProvider>(
    cli: PathBuf,
    capture: &'static str,
    answer_first: bool,
) {
    let s = setup::<P>(capture, cli);
    if answer_first {
        s.fake.push(Step::text("before the crash"));
    }
    s.fake.push_all([
        Step::hang().timeout_ms(30_000),
        Step::text("after the crash"),
    ]);
    let provider = s.provider::<P>();
    let mut session = None;
    let mut pid = None;
    if answer_first {
        session = Some(session_id(&ask(&provider, "before the crash", None).await));
        pid = provider.cli_pid().await;
    }
    let mut doomed = query(&provider, "during the crash", session.as_deref());
    let session = match session {
        Some(session) => session,
        None => session_id(
            &until_for(&mut doomed, P::EVENT_TIMEOUT, |e| {
                matches!(e, ProviderEvent::Init { .. })
            })
            .await,
        ),
    };
    s.wait_turns(usize::from(answer_first) + 1).await;
    if pid.is_none() && P::PID_DURING_A_TURN {
        pid = provider.cli_pid().await;
    }
    let pid = some(pid, "the CLI's pid");
    kill_pid(pid);
    let events = drain::<P>(&mut doomed).await;
    let errors = final_errors(&events);
    assert_eq!(errors.len(), 1, "{events:#?}");
    assert_eq!(errors[0].0, ErrorClass::Process);
    assert!(errors[0].1, "a crash is retryable");
    s.fake.release_hangs();

    let events = ask(&provider, "after the crash", Some(&session)).await;
    s.print_log();
    assert_eq!(results(&events), vec![("after the crash".to_owned(), 0)]);
    assert_eq!(session_id(&events), session, "resumed the same session");
    assert_ne!(provider.cli_pid().await, Some(pid), "a new process");
    if answer_first {
        let texts = user_texts(P::SPEC.provider, &last_turn(&s));
        assert_eq!(
            texts.first().map(String::as_str),
            Some("before the crash"),
            "{texts:?}"
        );
        assert_eq!(
            texts.last().map(String::as_str),
            Some("after the crash"),
            "{texts:?}"
        );
    }
}

/// How [`watchdog_kills_a_silent_turn`] runs for a CLI.
#[derive(Debug, Clone)]
pub struct WatchdogCase {
    /// `settings.watchdog`.
    pub watchdog: Duration,
    /// The silent answer (a hang before or after the response headers).
    pub silence: Step,
    /// The turn ends within this.
    pub within: Duration,
    /// First two quick queries with an idle pause longer than the watchdog in between: a CLI
    /// that sat idle between queries is not hung.
    pub idle_first: bool,
    /// The provider reports no live process right after the watchdog error.
    pub stops_the_process: bool,
}

/// No output for the watchdog period during a turn: ONE retryable `Watchdog` error (the CLI
/// stopped); the next query works.
pub async fn watchdog_kills_a_silent_turn<P: CliProvider>(cli: PathBuf, case: WatchdogCase) {
    let mut s = setup::<P>("watchdog", cli);
    s.settings.watchdog = case.watchdog;
    if case.idle_first {
        s.fake
            .push_all([Step::text("quick"), Step::text("still quick")]);
    }
    s.fake.push_all([case.silence, Step::text("alive again")]);
    let provider = s.provider::<P>();
    let mut session = None;
    if case.idle_first {
        let events = ask(&provider, "quick one", None).await;
        session = Some(session_id(&events));
        tokio::time::sleep(case.watchdog + Duration::from_secs(1)).await;
        let events = ask(&provider, "after idling", session.as_deref()).await;
        assert_eq!(
            results(&events),
            vec![("still quick".to_owned(), 0)],
            "{events:#?}"
        );
    }

    let started = Instant::now();
    let events = ask(&provider, "hang please", session.as_deref()).await;
    let errors = final_errors(&events);
    assert_eq!(errors.len(), 1, "{events:#?}");
    assert_eq!(errors[0].0, ErrorClass::Watchdog);
    assert!(errors[0].1, "retryable");
    assert!(started.elapsed() < case.within, "{:?}", started.elapsed());
    if case.stops_the_process {
        assert_eq!(
            provider.cli_pid().await,
            None,
            "the hung process is stopped"
        );
    }
    s.fake.release_hangs();
    let events = ask(&provider, "hello?", Some(&session_id(&events))).await;
    s.print_log();
    assert_eq!(results(&events), vec![("alive again".to_owned(), 0)]);
    provider.shutdown().await;
}

/// Abort interrupts the turn (the model's answer `answer`, still under way) within 3 s, with
/// ONE `Aborted` error and no result, and keeps the process for the next query, which the model
/// sees; with `push_queued`, a push queued behind the turn is cancelled with it.
pub async fn abort_interrupts_the_turn_and_keeps_the_process<P: CliProvider>(
    cli: PathBuf,
    answer: Step,
    push_queued: bool,
) {
    let s = setup::<P>("abort", cli);
    s.fake.push_all([answer, Step::text("after the abort")]);
    let provider = s.provider::<P>();
    let mut query = query(&provider, "long answer please", None);
    let mut events = until_for(&mut query, P::EVENT_TIMEOUT, |e| {
        matches!(e, ProviderEvent::Init { .. })
    })
    .await;
    s.wait_turns(1).await;
    let before = if P::PID_DURING_A_TURN {
        provider.cli_pid().await
    } else {
        None
    };
    if push_queued {
        ok(query.push(Prompt::text("queued behind")), "pushing");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let aborted = Instant::now();
    query.abort();
    events.extend(drain::<P>(&mut query).await);
    assert!(
        aborted.elapsed() < Duration::from_secs(3),
        "{:?}",
        aborted.elapsed()
    );
    let errors = final_errors(&events);
    assert_eq!(errors.len(), 1, "{events:#?}");
    assert_eq!(errors[0].0, ErrorClass::Aborted);
    assert!(results(&events).is_empty(), "{events:#?}");
    let pid = some(provider.cli_pid().await, "the process survives an abort");
    if let Some(before) = before {
        assert_eq!(pid, before, "the same process");
    }
    let session = session_id(&events);
    let events = ask(&provider, "next question", Some(&session)).await;
    s.print_log();
    assert_eq!(results(&events), vec![("after the abort".to_owned(), 0)]);
    assert_eq!(provider.cli_pid().await, Some(pid));
    let requests = s.turns();
    assert_eq!(requests.len(), 2, "the queued push never ran");
    let texts = user_texts(P::SPEC.provider, &requests[1]).join("\n");
    assert!(texts.contains("next question"), "{texts}");
    assert!(!texts.contains("queued behind"), "{texts}");
    provider.shutdown().await;
}

/// The agent's shell runs `env` (the CLI's own shell tool call `shell`): neither the API key
/// nor a host secret is there, even with the secret's variable passed through explicitly (the
/// scrub patterns win); `TZ` is; the model still gets the key.
pub async fn shell_never_sees_the_api_key_or_host_secrets<P: CliProvider>(
    cli: PathBuf,
    shell: Step,
) {
    let mut s = setup::<P>("shell_env", cli);
    assert_eq!(
        std::env::var(MARKER_VAR).as_deref(),
        Ok(MARKER_VALUE),
        "the child has the marker"
    );
    if !P::SPEC.pass_marker {
        s.settings.env_policy.passthrough.push(MARKER_VAR.into());
    }
    s.fake.push_all([shell, Step::text("listed")]);
    let provider = s.provider::<P>();
    let events = ask(&provider, "run env", None).await;
    s.print_log();
    assert_eq!(results(&events), vec![("listed".to_owned(), 0)]);
    let request = last_turn(&s);
    let output = request.tool_results().join("\n");
    let key = P::SPEC.api_key;
    assert!(output.contains("HOME="), "the shell ran env: {output}");
    assert!(output.contains("TZ=UTC"), "TZ reaches the shell: {output}");
    assert!(
        !output.contains(key),
        "the API key reached the shell: {output}"
    );
    assert!(
        !output.contains(MARKER_VALUE),
        "a host secret reached the shell: {output}"
    );
    let (header, value) = key_header(&P::SPEC);
    assert_eq!(
        request.header(header),
        Some(value.as_str()),
        "the model still gets the key"
    );
    provider.shutdown().await;
}

/// `shutdown` stops the CLI and the one mcp-tools it started (the CLI may start it in a process
/// group of its own); with `closed_afterwards`, the provider takes no query afterwards.
pub async fn shutdown_stops_the_cli_and_its_mcp_servers<P: CliProvider>(
    cli: PathBuf,
    closed_afterwards: bool,
) {
    let s = setup::<P>("shutdown", cli);
    s.fake.push(Step::text("bye"));
    let provider = s.provider::<P>();
    ask(&provider, "hi", None).await;
    let pid = some(provider.cli_pid().await, "the CLI's pid");
    let children = descendants(pid);
    let name = P::SPEC.provider;
    eprintln!("{name} {pid}: descendants {children:?}");
    let mcp: Vec<u32> = children
        .iter()
        .filter(|(_, cmd)| cmd.contains("mcp-tools"))
        .map(|(p, _)| *p)
        .collect();
    assert_eq!(mcp.len(), 1, "one mcp-tools under {name}: {children:?}");
    provider.shutdown().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!alive(pid), "{name} left running");
    for p in &mcp {
        assert!(!alive(*p), "mcp-tools {p} left running");
    }
    if closed_afterwards {
        assert!(matches!(
            provider.query(input("after", None)),
            Err(ProviderError::Closed)
        ));
    }
    drop(s.dir);
}

/// A CLI path that does not exist: creating the provider is a spawn error naming the variable
/// that sets the path (`CLAUDE_PATH`, ...). Needs no CLI.
pub fn missing_cli_is_a_spawn_error_naming_its_path<P: CliProvider>() {
    let name = P::SPEC.provider;
    let mut settings = ProviderSettings::for_workspace("/nonexistent-workspace", name);
    settings.cli_path = Some(format!("/nonexistent/{name}").into());
    match P::create(settings) {
        Err(ProviderError::Spawn(message)) => {
            assert!(message.contains(cli_env_var(name)), "{message}")
        }
        Err(other) => panic!("expected a spawn error, got {other:?}"),
        Ok(_) => panic!("expected a spawn error, got a provider"),
    }
}
