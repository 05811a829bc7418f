//! Support for the provider-level tests: a provider (`ClaudeProvider`, `CodexProvider`, …)
//! driven directly (no runner) against its REAL pinned CLI, the scripted fake model server and
//! the real `mcp-tools`.
//!
//! * [`start`]: skips when `NANOCLAW_SKIP_CLI_TESTS=1`, else re-runs the test alone in a child
//!   process (inside a loopback-only network namespace when possible) with the marker secret
//!   [`MARKER_VAR`]=[`MARKER_VALUE`] in its environment; `Some(cli)` = run the body here.
//! * [`ProviderSpec::setup`]: a workspace, a fresh [`FakeModel`] and [`ProviderSettings`]
//!   pointing the CLI at it ([`ProviderSetup`]).
//! * Events: [`ask`], [`ask_with`], [`until`], [`drain`] (with `_for` variants taking the
//!   timeout), and [`results`], [`final_errors`], [`session_id`] to read them.
//!
//! ```ignore
//! const SPEC: ProviderSpec = ProviderSpec::openai("codex", "sk-codex-provider-test-key");
//!
//! #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//! async fn text_reply() {
//!     let Some(cli) = start("codex", "text_reply") else { return };
//!     let s = SPEC.setup("text_reply", cli);
//!     s.fake.push(Step::text("hi"));
//!     let provider = s.spawn(CodexProvider::new);
//!     let events = ask(&provider, "hello", None).await;
//!     assert_eq!(results(&events), vec![("hi".to_owned(), 0)]);
//!     provider.shutdown().await;
//! }
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use provider::{
    AgentProvider, AgentQuery, ApprovalAnswer, ApprovalKind, ApprovalRequest, ErrorClass, Prompt,
    ProviderError, ProviderEvent, ProviderSettings, QueryInput,
};
use schema::{NewMessageIn, SessionDb};
use serde_json::{json, Value};

use crate::fake_model::{FakeModel, LoggedRequest};
use crate::harness::{
    mcp_tools, netns_prefix, print_requests, provider_cli, qualified_test_name, ran_exactly,
    rerun_exact, FAKE_MODEL,
};

/// The system prompt of [`input`].
pub const SYSTEM_PROMPT: &str = "You are the NanoClaw test agent. SYSTEM-MARKER-1.";
/// Set in the child's environment by [`in_child`]: neither the CLI's shell nor the model may
/// see it (it matches the default scrub pattern `*_SECRET`).
pub const MARKER_VAR: &str = "NANOCLAW_MARKER_SECRET";
/// The value of [`MARKER_VAR`].
pub const MARKER_VALUE: &str = "marker-secret-0451";
/// How long [`until`] and [`drain`] wait for the next event.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(40);

// ---------------------------------------------------------------------------------------------
// Re-running in a child
// ---------------------------------------------------------------------------------------------

/// True when the caller should run the test body in this process. Otherwise re-runs `test`
/// (its exact name) alone in a child process (inside a loopback-only network namespace when
/// possible, unless `NANOCLAW_NETNS=0`) with the marker secret in its environment, asserts it
/// passed, and returns false.
pub fn in_child(test: &str) -> bool {
    if std::env::var_os("NANOCLAW_IN_CHILD").is_some() {
        return true;
    }
    let test = &qualified_test_name(test);
    let prefix = if std::env::var("NANOCLAW_NETNS").as_deref() == Ok("0") {
        None
    } else {
        netns_prefix()
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => panic!("the current test executable: {err}"),
    };
    let started = Instant::now();
    let out = rerun_exact(
        test,
        &exe,
        prefix,
        &[("NANOCLAW_IN_CHILD", "1"), (MARKER_VAR, MARKER_VALUE)],
        "in a child process",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let netns = prefix.is_some();
    eprintln!("----- {test} (loopback-only netns: {netns}) -----\n{stdout}{stderr}");
    eprintln!("----- {test}: {:.2?} -----", started.elapsed());
    assert!(out.status.success(), "{test} failed in the child process");
    assert!(
        ran_exactly(&stdout, test),
        "{test} did not run in the child process"
    );
    false
}

/// Skips (CLI tests disabled) or re-executes in a child ([`in_child`]); `Some(cli)` = the CLI
/// of `provider`, run the body here.
pub fn start(provider: &str, test: &str) -> Option<PathBuf> {
    let cli = provider_cli(provider)?;
    in_child(test).then_some(cli)
}

// ---------------------------------------------------------------------------------------------
// Setup
// ---------------------------------------------------------------------------------------------

/// Which of the fake model's APIs the provider is pointed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelApi {
    /// Anthropic Messages: `base_url` = [`FakeModel::url`].
    Anthropic,
    /// OpenAI Responses / Chat Completions: `base_url` = [`FakeModel::openai_base_url`].
    OpenAi,
}

/// How a provider test file sets its provider up (one `const` per file).
#[derive(Debug, Clone, Copy)]
pub struct ProviderSpec {
    /// `claude`, `codex`, `opencode`.
    pub provider: &'static str,
    /// The API the CLI talks to.
    pub api: ModelApi,
    /// `settings.model`.
    pub model: &'static str,
    /// `settings.api_key`.
    pub api_key: &'static str,
    /// Adds [`MARKER_VAR`] to `settings.env_policy.passthrough`.
    pub pass_marker: bool,
}

impl ProviderSpec {
    /// An OpenAI-API provider on [`FAKE_MODEL`], with the marker passed through to the CLI.
    pub const fn openai(provider: &'static str, api_key: &'static str) -> Self {
        Self {
            provider,
            api: ModelApi::OpenAi,
            model: FAKE_MODEL,
            api_key,
            pass_marker: true,
        }
    }

    /// A fresh workspace (under a temp dir), its session DB, a fresh fake model, and settings
    /// for `cli` against it: max_retries 1, a 60 s watchdog, the mcp-tools of this build.
    /// `name` names the test's capture files ([`ProviderSetup::capture_path`]).
    pub fn setup(&self, name: &'static str, cli: PathBuf) -> ProviderSetup {
        let dir = match tempfile::Builder::new()
            .prefix(&format!("nanoclaw-{}-", self.provider))
            .tempdir()
        {
            Ok(dir) => dir,
            Err(err) => panic!("temp dir: {err}"),
        };
        let fake = match FakeModel::start() {
            Ok(fake) => fake,
            Err(err) => panic!("fake model: {err}"),
        };
        let mut settings = ProviderSettings::for_workspace(dir.path(), self.provider);
        if let Err(err) = std::fs::create_dir_all(&settings.agent_dir) {
            panic!("creating {}: {err}", settings.agent_dir.display());
        }
        let db = match SessionDb::open(&settings.session_db) {
            Ok(db) => db,
            Err(err) => panic!("session DB: {err}"),
        };
        settings.cli_path = Some(cli);
        settings.mcp_tools_path = mcp_tools();
        settings.model = Some(self.model.into());
        settings.base_url = Some(match self.api {
            ModelApi::Anthropic => fake.url(),
            ModelApi::OpenAi => fake.openai_base_url(),
        });
        settings.api_key = Some(logging::redact::Secret::new(self.api_key));
        settings.max_retries = 1;
        settings.watchdog = Duration::from_secs(60);
        if self.pass_marker {
            settings.env_policy.passthrough.push(MARKER_VAR.into());
        }
        ProviderSetup {
            provider: self.provider,
            name,
            dir,
            fake,
            settings,
            db,
        }
    }
}

/// A provider test's workspace, fake model, settings and session DB ([`ProviderSpec::setup`]).
pub struct ProviderSetup {
    /// `claude`, `codex`, `opencode`.
    pub provider: &'static str,
    /// Names the capture files.
    pub name: &'static str,
    /// The workspace (dropping it removes it).
    pub dir: tempfile::TempDir,
    /// The fake model server.
    pub fake: FakeModel,
    /// The settings each [`ProviderSetup::spawn`] gets (change them before spawning).
    pub settings: ProviderSettings,
    /// The workspace's session DB (what mcp-tools writes).
    pub db: SessionDb,
}

impl ProviderSetup {
    /// A provider made by `new` (`ClaudeProvider::new`, …) from a copy of the settings.
    pub fn spawn<P>(&self, new: impl FnOnce(ProviderSettings) -> Result<P, ProviderError>) -> P {
        match new(self.settings.clone()) {
            Ok(provider) => provider,
            Err(err) => panic!("creating the {} provider: {err}", self.provider),
        }
    }

    /// `<$env_var>/<name>.jsonl` when the capture variable `env_var` is set (e.g.
    /// `NANOCLAW_CODEX_CAPTURE`).
    pub fn capture_path(&self, env_var: &str) -> Option<PathBuf> {
        std::env::var_os(env_var).map(|dir| Path::new(&dir).join(format!("{}.jsonl", self.name)))
    }

    /// Prints a summary of every request the fake model got.
    pub fn print_log(&self) {
        print_requests(&self.fake);
    }

    /// The model turns so far (no title requests).
    pub fn turns(&self) -> Vec<LoggedRequest> {
        self.fake.model_requests()
    }

    /// Waits (40 s at most) until the fake model has seen `n` model turns.
    pub async fn wait_turns(&self, n: usize) {
        if let Err(err) = self
            .fake
            .wait_until_async(Duration::from_secs(40), |log| {
                log.iter().filter(|r| r.is_model_turn()).count() >= n
            })
            .await
        {
            panic!("{err}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Queries and their events
// ---------------------------------------------------------------------------------------------

/// A text prompt with [`SYSTEM_PROMPT`].
pub fn input(text: &str, continuation: Option<&str>) -> QueryInput {
    QueryInput {
        prompt: Prompt::text(text),
        continuation: continuation.map(str::to_owned),
        system_prompt: Some(SYSTEM_PROMPT.into()),
        model: None,
    }
}

/// Events until the stream closes, waiting [`EVENT_TIMEOUT`] at most for each.
pub async fn drain(query: &mut AgentQuery) -> Vec<ProviderEvent> {
    drain_for(query, EVENT_TIMEOUT).await
}

/// Events until the stream closes, waiting `timeout` at most for each.
pub async fn drain_for(query: &mut AgentQuery, timeout: Duration) -> Vec<ProviderEvent> {
    let mut events = Vec::new();
    loop {
        match tokio::time::timeout(timeout, query.next_event()).await {
            Ok(Some(event)) => {
                eprintln!("  event: {event:?}");
                events.push(event);
            }
            Ok(None) => return events,
            Err(_) => panic!("no event for {timeout:?}; so far: {events:#?}"),
        }
    }
}

/// Events until (and including) the first one matching `stop`, waiting [`EVENT_TIMEOUT`] at
/// most for each; panics when the stream closes first.
pub async fn until(
    query: &mut AgentQuery,
    stop: impl Fn(&ProviderEvent) -> bool,
) -> Vec<ProviderEvent> {
    until_for(query, EVENT_TIMEOUT, stop).await
}

/// [`until`] waiting `timeout` at most for each event.
pub async fn until_for(
    query: &mut AgentQuery,
    timeout: Duration,
    stop: impl Fn(&ProviderEvent) -> bool,
) -> Vec<ProviderEvent> {
    let mut events = Vec::new();
    loop {
        match tokio::time::timeout(timeout, query.next_event()).await {
            Ok(Some(event)) => {
                eprintln!("  event: {event:?}");
                let done = stop(&event);
                events.push(event);
                if done {
                    return events;
                }
            }
            Ok(None) => panic!("the stream closed early: {events:#?}"),
            Err(_) => panic!("no event for {timeout:?}; so far: {events:#?}"),
        }
    }
}

/// One query with [`input`]`(text, continuation)`; see [`ask_with`].
pub async fn ask<P: AgentProvider + ?Sized>(
    provider: &P,
    text: &str,
    continuation: Option<&str>,
) -> Vec<ProviderEvent> {
    ask_with(provider, input(text, continuation)).await
}

/// One query until its result or final error ([`ends_turn`]); then `end` and the rest of the
/// stream. Returns every event.
pub async fn ask_with<P: AgentProvider + ?Sized>(
    provider: &P,
    input: QueryInput,
) -> Vec<ProviderEvent> {
    ask_for(provider, input, EVENT_TIMEOUT).await
}

/// [`ask_with`] waiting `timeout` at most for each event.
pub async fn ask_for<P: AgentProvider + ?Sized>(
    provider: &P,
    input: QueryInput,
    timeout: Duration,
) -> Vec<ProviderEvent> {
    let mut query = match provider.query(input) {
        Ok(query) => query,
        Err(err) => panic!("query: {err}"),
    };
    let mut events = until_for(&mut query, timeout, ends_turn).await;
    query.end();
    events.extend(drain_for(&mut query, timeout).await);
    events
}

/// A `Result` event.
pub fn is_result(event: &ProviderEvent) -> bool {
    matches!(event, ProviderEvent::Result { .. })
}

/// A `Result` or an `Error` that ends the turn.
pub fn ends_turn(event: &ProviderEvent) -> bool {
    is_result(event)
        || matches!(
            event,
            ProviderEvent::Error {
                ends_turn: true,
                ..
            }
        )
}

/// The session id of the last `Init`; panics when there is none.
pub fn session_id(events: &[ProviderEvent]) -> String {
    events
        .iter()
        .rev()
        .find_map(|e| match e {
            ProviderEvent::Init { session_id } => Some(session_id.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no Init in {events:#?}"))
}

/// Every `Result` as (text, covers).
pub fn results(events: &[ProviderEvent]) -> Vec<(String, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::Result { text, covers, .. } => Some((text.clone(), *covers)),
            _ => None,
        })
        .collect()
}

/// Every `ToolDenied` as (tool, summary).
pub fn tool_denials(events: &[ProviderEvent]) -> Vec<(String, Option<String>)> {
    events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::ToolDenied { tool, summary } => Some((tool.clone(), summary.clone())),
            _ => None,
        })
        .collect()
}

/// A tool call the CLI asks about (`ApprovalKind::ToolCall`) with its request's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AskedCall {
    /// The request's id, for `Approver::answer`.
    pub id: String,
    /// The tool's canonical name.
    pub tool: String,
    /// The call's one-line summary.
    pub summary: Option<String>,
    /// What the policy matches against (the command line, the path, the arguments' JSON).
    pub argument: Option<String>,
}

/// An `ApprovalRequest` event.
pub fn is_approval_request(event: &ProviderEvent) -> bool {
    matches!(event, ProviderEvent::ApprovalRequest(_))
}

/// The one tool-call `ApprovalRequest` of `events`; panics unless there is exactly one.
pub fn asked_call(events: &[ProviderEvent]) -> AskedCall {
    let mut asked: Vec<AskedCall> = events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::ApprovalRequest(ApprovalRequest {
                id,
                kind:
                    ApprovalKind::ToolCall {
                        tool,
                        summary,
                        argument,
                        ..
                    },
            }) => Some(AskedCall {
                id: id.clone(),
                tool: tool.clone(),
                summary: summary.clone(),
                argument: argument.clone(),
            }),
            _ => None,
        })
        .collect();
    match asked.pop() {
        Some(call) if asked.is_empty() => call,
        _ => panic!("not exactly one asked tool call: {events:#?}"),
    }
}

/// A query of `input` read until its first `ApprovalRequest` (waiting `timeout` at most for
/// each event): the query (still waiting for the answer), its events and the asked call.
pub async fn query_until_approval<P: AgentProvider + ?Sized>(
    provider: &P,
    input: QueryInput,
    timeout: Duration,
) -> (AgentQuery, Vec<ProviderEvent>, AskedCall) {
    let mut query = match provider.query(input) {
        Ok(query) => query,
        Err(err) => panic!("query: {err}"),
    };
    let events = until_for(&mut query, timeout, is_approval_request).await;
    let asked = asked_call(&events);
    (query, events, asked)
}

/// Answers the pending request `id` with `answer`, reads the turn to its end ([`ends_turn`]),
/// ends the query and reads the rest of the stream: every event after the answer.
pub async fn answer_approval(
    query: &mut AgentQuery,
    id: &str,
    answer: ApprovalAnswer,
    timeout: Duration,
) -> Vec<ProviderEvent> {
    assert!(query.approver().answer(id, answer), "{id} is not pending");
    let mut events = until_for(query, timeout, ends_turn).await;
    query.end();
    events.extend(drain_for(query, timeout).await);
    events
}

/// Every turn-ending `Error` as (classification, retryable, message).
pub fn final_errors(events: &[ProviderEvent]) -> Vec<(ErrorClass, bool, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::Error {
                classification,
                retryable,
                ends_turn: true,
                message,
                ..
            } => Some((*classification, *retryable, message.clone())),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// ask_user_question
// ---------------------------------------------------------------------------------------------

/// Waits (`timeout` at most) for the question row mcp-tools writes; returns its question id.
pub async fn question_id(db: &SessionDb, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let rows = db.all_messages_out().unwrap_or_default();
        let found = rows.iter().find_map(|row| {
            let content: Value = serde_json::from_str(&row.content).ok()?;
            content.get("questionId")?.as_str().map(str::to_owned)
        });
        if let Some(id) = found {
            return id;
        }
        assert!(Instant::now() < deadline, "no question row: {rows:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Answers the question `question_id` with `option` (the `question_response` system row the
/// host writes).
pub fn answer(db: &SessionDb, question_id: &str, option: &str) {
    let answer =
        json!({"type": "question_response", "questionId": question_id, "selectedOption": option});
    if let Err(err) = db.insert_in(&NewMessageIn::new("system", answer.to_string())) {
        panic!("inserting the answer: {err}");
    }
}

/// A tool policy of `deny` and `ask` rules (`Bash(rm *)`, `mcp__nanoclaw__*`), default allow.
pub fn tool_policy(deny: &[&str], ask: &[&str]) -> provider::ToolPolicy {
    provider::ToolPolicy {
        deny: rules(deny),
        ask: rules(ask),
        ..provider::ToolPolicy::default()
    }
}

/// Tool rules parsed from their config text (`Bash(rm *)`, `Read(/etc/*)`).
pub fn rules(list: &[&str]) -> Vec<provider::ToolRule> {
    list.iter()
        .map(|rule| match provider::ToolRule::parse(rule) {
            Ok(rule) => rule,
            Err(err) => panic!("{err}"),
        })
        .collect()
}
