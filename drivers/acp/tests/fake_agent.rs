//! The ACP driver against a scripted agent (`fake-acp-agent`, a real process speaking JSON-RPC
//! on its stdio): permissions decided by the policy (deny, allow, ask answered both ways, a
//! refusal after the runner's timeout, an interrupt while asking), cancel then continue, a
//! follow-up mid-turn, `session/load` and its fallback to a new session with a note, the agent
//! exiting or writing garbage mid-turn, a JSON-RPC error, an authentication requirement, a
//! stalled agent, extension requests, and no process left after shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use acp::{AcpProvider, AgentSpec};
use expect_test::{expect, Expect};
use provider::{
    AgentProvider, AgentQuery, ApprovalAnswer, ProviderEvent, ProviderSettings, QueryInput,
    ToolPolicy,
};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_fake-acp-agent");

/// The longest a query may take in these tests: every fault must end the turn well before.
const QUERY_BOUND: Duration = Duration::from_secs(15);

struct Fake {
    dir: tempfile::TempDir,
    settings: ProviderSettings,
}

impl Fake {
    fn new(config: Value) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("agent")).unwrap();
        let mut settings = ProviderSettings::for_workspace(dir.path(), "acp");
        settings.mcp_tools_path = PathBuf::from("/usr/local/bin/mcp-tools");
        settings
            .cli_env
            .insert("FAKE_ACP".into(), config.to_string());
        settings.cli_env.insert(
            "FAKE_ACP_LOG".into(),
            dir.path().join("sent.jsonl").display().to_string(),
        );
        settings.cli_env.insert(
            "FAKE_ACP_STATE".into(),
            dir.path().join("state").display().to_string(),
        );
        Self { dir, settings }
    }

    fn with_policy(mut self, policy: Value) -> Self {
        self.settings.tool_policy = ToolPolicy::from_json(&policy).unwrap();
        self
    }

    fn provider(&self) -> AcpProvider {
        AcpProvider::new(
            self.settings.clone(),
            AgentSpec::generic(&[BIN.to_owned()]).unwrap(),
        )
        .unwrap()
    }

    /// What the driver sent the agent, by method.
    fn sent(&self, method: &str) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("sent.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|m| m.get("method").and_then(Value::as_str) == Some(method))
            .collect()
    }
}

fn input(text: &str, continuation: Option<&str>) -> QueryInput {
    QueryInput {
        prompt: provider::Prompt::text(text),
        continuation: continuation.map(str::to_owned),
        ..QueryInput::default()
    }
}

/// Reads events until the stream closes, answering approval requests with `answer`.
async fn drain(
    query: &mut AgentQuery,
    mut answer: impl FnMut(&str) -> Option<ApprovalAnswer>,
) -> Vec<ProviderEvent> {
    let approver = query.approver();
    let mut events = Vec::new();
    let deadline = Instant::now() + QUERY_BOUND;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(event) = tokio::time::timeout(left, query.next_event()).await else {
            panic!("the query did not end within {QUERY_BOUND:?}: {events:#?}");
        };
        let Some(event) = event else { break };
        if let ProviderEvent::ApprovalRequest(request) = &event {
            if let Some(reply) = answer(&request.id) {
                approver.answer(&request.id, reply);
            }
        }
        if matches!(event, ProviderEvent::Result { .. }) {
            query.end();
        }
        events.push(event);
    }
    events
}

async fn run(provider: &AcpProvider, text: &str, continuation: Option<&str>) -> Vec<ProviderEvent> {
    let mut query = provider.query(input(text, continuation)).unwrap();
    drain(&mut query, |_| None).await
}

fn session_of(events: &[ProviderEvent]) -> String {
    events
        .iter()
        .find_map(|e| match e {
            ProviderEvent::Init { session_id } => Some(session_id.clone()),
            _ => None,
        })
        .expect("an Init event")
}

/// One line per event, session ids and pids hidden; throttled liveness events left out.
fn show(events: &[ProviderEvent]) -> String {
    let mut lines = Vec::new();
    for event in events {
        let line = match event {
            ProviderEvent::Output | ProviderEvent::Activity { tool: None, .. } => continue,
            ProviderEvent::Init { .. } => "Init".to_owned(),
            ProviderEvent::Error {
                message,
                classification,
                retryable,
                ..
            } => {
                let message = hide_ids(message);
                format!(
                    "Error {} retryable={retryable}: {message}",
                    classification.name()
                )
            }
            ProviderEvent::Progress { message } => format!("Progress: {}", hide_ids(message)),
            other => format!("{other:?}"),
        };
        lines.push(line);
    }
    lines.join("\n")
}

fn hide_ids(text: &str) -> String {
    let text = match (text.find("(exit status"), text.find("(signal")) {
        (Some(at), _) | (None, Some(at)) => match text[at..].find(')') {
            Some(end) => format!("{}(<status>){}", &text[..at], &text[at + end + 1..]),
            None => text.to_owned(),
        },
        (None, None) => text.to_owned(),
    };
    text.split(' ')
        .map(|word| {
            if word.starts_with("fake-") {
                "<session>"
            } else {
                word
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn check(events: &[ProviderEvent], expected: Expect) {
    expected.assert_eq(&show(events));
}

const SHELL: &str = r#"{"toolCallId": "run_shell_command-1", "kind": "execute", "title": "rm -rf build", "rawInput": {"command": "rm -rf build"}}"#;

fn shell_turn() -> Value {
    json!({"turns": [[{"tool": serde_json::from_str::<Value>(SHELL).unwrap()},
                      {"permission": {"toolCallId": "run_shell_command-1"}},
                      {"toolDone": "run_shell_command-1"}]],
           "usage": {"inputTokens": 12, "outputTokens": 5, "totalTokens": 17}})
}

#[tokio::test]
async fn a_prompt_is_answered_with_usage_and_no_fs_or_terminal_capability() {
    let fake =
        Fake::new(json!({"usage": {"inputTokens": 12, "outputTokens": 5, "totalTokens": 17}}));
    let provider = fake.provider();
    let events = run(&provider, "hello", None).await;
    check(
        &events,
        expect![[r#"
            Init
            Text { text: "echo: hello" }
            Result { text: "echo: hello", covers: 0, usage: Some(Usage { input_tokens: Some(12), output_tokens: Some(5), cache_read_tokens: None, cache_write_tokens: None, reasoning_tokens: None, cost_usd: None, model: None, requests: None }) }"#]],
    );
    let init = &fake.sent("initialize")[0]["params"];
    assert_eq!(init["clientCapabilities"]["terminal"], json!(false));
    assert_eq!(
        init["clientCapabilities"]["fs"]["readTextFile"],
        json!(false)
    );
    assert_eq!(
        init["clientCapabilities"]["fs"]["writeTextFile"],
        json!(false)
    );
    let new = &fake.sent("session/new")[0]["params"];
    assert_eq!(
        new["cwd"],
        json!(fake.dir.path().join("agent").display().to_string())
    );
    assert_eq!(new["mcpServers"][0]["name"], json!("nanoclaw"));
    provider.shutdown().await;
}

#[tokio::test]
async fn a_denied_shell_command_is_refused_with_the_reject_option() {
    let fake = Fake::new(shell_turn()).with_policy(json!({"deny": ["Bash(rm *)"]}));
    let provider = fake.provider();
    let events = run(&provider, "clean up", None).await;
    check(
        &events,
        expect![[r#"
            Init
            Activity { tool: Some("Bash"), summary: Some("rm -rf build") }
            ToolDenied { tool: "Bash", summary: Some("rm -rf build") }
            ToolEnded { running: 0 }
            Text { text: "permission: cancel" }
            Result { text: "permission: cancel", covers: 0, usage: Some(Usage { input_tokens: Some(12), output_tokens: Some(5), cache_read_tokens: None, cache_write_tokens: None, reasoning_tokens: None, cost_usd: None, model: None, requests: None }) }"#]],
    );
    provider.shutdown().await;
}

#[tokio::test]
async fn an_allowed_shell_command_gets_allow_once_never_always() {
    let fake = Fake::new(shell_turn());
    let provider = fake.provider();
    let events = run(&provider, "build", None).await;
    assert!(
        events.contains(&ProviderEvent::Text {
            text: "permission: proceed_once".into()
        }),
        "{events:#?}"
    );
    provider.shutdown().await;
}

async fn asked(answer: ApprovalAnswer) -> Vec<ProviderEvent> {
    let fake = Fake::new(shell_turn()).with_policy(json!({"ask": ["Bash"]}));
    let provider = fake.provider();
    let mut query = provider.query(input("clean up", None)).unwrap();
    let events = drain(&mut query, |_| Some(answer.clone())).await;
    provider.shutdown().await;
    events
}

#[tokio::test]
async fn an_asked_call_approved_runs() {
    let events = asked(ApprovalAnswer::Allow).await;
    check(
        &events,
        expect![[r#"
            Init
            Activity { tool: Some("Bash"), summary: Some("rm -rf build") }
            ApprovalRequest(ApprovalRequest { id: "acp-1", kind: ToolCall { tool: "Bash", summary: Some("rm -rf build"), argument: Some("rm -rf build"), undecidable: None } })
            ToolEnded { running: 0 }
            Text { text: "permission: proceed_once" }
            Result { text: "permission: proceed_once", covers: 0, usage: Some(Usage { input_tokens: Some(12), output_tokens: Some(5), cache_read_tokens: None, cache_write_tokens: None, reasoning_tokens: None, cost_usd: None, model: None, requests: None }) }"#]],
    );
}

#[tokio::test]
async fn an_asked_call_refused_or_unanswered_in_time_is_rejected() {
    for reason in ["denied by the user", "no answer within 1 s"] {
        let events = asked(ApprovalAnswer::Deny {
            reason: reason.into(),
        })
        .await;
        assert!(
            events.contains(&ProviderEvent::Text {
                text: "permission: cancel".into()
            }),
            "{reason}: {events:#?}"
        );
    }
}

#[tokio::test]
async fn an_interrupt_while_asking_cancels_the_request_and_the_session_lives_on() {
    let fake = Fake::new(shell_turn()).with_policy(json!({"ask": ["Bash"]}));
    let provider = fake.provider();
    let mut query = provider.query(input("clean up", None)).unwrap();
    let mut interrupted = false;
    let approver_query = &mut query;
    let events = {
        let mut events = Vec::new();
        let deadline = Instant::now() + QUERY_BOUND;
        while let Ok(Some(event)) =
            tokio::time::timeout_at(deadline.into(), approver_query.next_event()).await
        {
            if matches!(event, ProviderEvent::ApprovalRequest(_)) && !interrupted {
                interrupted = true;
                approver_query.interrupt();
            }
            events.push(event);
        }
        events
    };
    let session = session_of(&events);
    assert!(
        matches!(
            events.last(),
            Some(ProviderEvent::Interrupted { covers: 0, .. })
        ),
        "{events:#?}"
    );
    // The next prompt continues the same session in the same process.
    let next = run(&provider, "again", Some(&session)).await;
    assert_eq!(session_of(&next), session);
    assert_eq!(fake.sent("session/new").len(), 1);
    provider.shutdown().await;
}

#[tokio::test]
async fn interrupt_is_session_cancel_and_the_next_prompt_continues() {
    let fake = Fake::new(json!({"turns": [[{"say": "working"}, {"waitCancel": true}]]}));
    let provider = fake.provider();
    let mut query = provider.query(input("long job", None)).unwrap();
    let mut events = vec![query.next_event().await.unwrap()];
    let session = session_of(&events);
    // Wait until the turn runs, then interrupt.
    loop {
        let event = query.next_event().await.unwrap();
        let output = matches!(event, ProviderEvent::Output);
        events.push(event);
        if output {
            break;
        }
    }
    let asked_at = Instant::now();
    query.interrupt();
    events.extend(drain(&mut query, |_| None).await);
    assert!(
        asked_at.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked_at.elapsed()
    );
    check(
        &events,
        expect![[r#"
            Init
            Interrupted { covers: 0, usage: None, reason: Stopped }"#]],
    );
    assert_eq!(fake.sent("session/cancel").len(), 1);
    let next = run(&provider, "next", Some(&session)).await;
    check(
        &next,
        expect![[r#"
            Init
            Text { text: "echo: next" }
            Result { text: "echo: next", covers: 0, usage: None }"#]],
    );
    assert_eq!(session_of(&next), session);
    provider.shutdown().await;
}

#[tokio::test]
async fn a_follow_up_mid_turn_cancels_and_one_prompt_carries_both() {
    let fake = Fake::new(json!({"turns": [[{"say": "thinking"}, {"waitCancel": true}]]}));
    let provider = fake.provider();
    let mut query = provider.query(input("first", None)).unwrap();
    loop {
        if matches!(query.next_event().await, Some(ProviderEvent::Output)) {
            break;
        }
    }
    query.push(provider::Prompt::text("second")).unwrap();
    let events = drain(&mut query, |_| None).await;
    check(
        &events,
        expect![[r#"
            Text { text: "echo: first + second" }
            Result { text: "echo: first + second", covers: 1, usage: None }"#]],
    );
    assert_eq!(fake.sent("session/cancel").len(), 1);
    assert_eq!(fake.sent("session/prompt").len(), 2);
    provider.shutdown().await;
}

#[tokio::test]
async fn after_a_restart_the_session_is_loaded_when_the_agent_can() {
    let fake = Fake::new(json!({"loadSession": true}));
    let first = fake.provider();
    let session = session_of(&run(&first, "one", None).await);
    first.shutdown().await;
    let second = fake.provider();
    let events = run(&second, "two", Some(&session)).await;
    check(
        &events,
        expect![[r#"
            Init
            Text { text: "echo: two" }
            Result { text: "echo: two", covers: 0, usage: None }"#]],
    );
    assert_eq!(session_of(&events), session);
    assert_eq!(fake.sent("session/load").len(), 1);
    assert_eq!(fake.sent("session/new").len(), 1);
    second.shutdown().await;
}

#[tokio::test]
async fn a_session_that_cannot_be_loaded_is_replaced_with_a_note() {
    let fake = Fake::new(json!({"loadSession": true, "loadFails": true}));
    let first = fake.provider();
    let session = session_of(&run(&first, "one", None).await);
    first.shutdown().await;
    let second = fake.provider();
    let events = run(&second, "two", Some(&session)).await;
    check(
        &events,
        expect![[r#"
            Progress: stored session <session> could not be resumed (No previous sessions found for this project.); starting a new one
            Init
            Text { text: "echo: two" }
            Result { text: "echo: two", covers: 0, usage: None }"#]],
    );
    assert_ne!(session_of(&events), session);
    second.shutdown().await;
    // An agent without loadSession is not asked at all.
    let fake = Fake::new(json!({}));
    let provider = fake.provider();
    let events = run(&provider, "three", Some("old-session")).await;
    assert!(
        matches!(&events[0], ProviderEvent::Progress { message } if message.contains("no loadSession capability")),
        "{events:#?}"
    );
    assert!(fake.sent("session/load").is_empty());
    provider.shutdown().await;
}

#[tokio::test]
async fn the_agent_exiting_mid_turn_ends_it_and_the_next_query_starts_a_new_agent() {
    let fake = Fake::new(json!({"turns": [[{"say": "partial"}, {"exit": 3}]]}));
    let provider = fake.provider();
    let events = run(&provider, "crash", None).await;
    let pid_gone = provider.pid().await;
    check(
        &events,
        expect![[r#"
            Init
            Error Process retryable=true: the agent process exited (<status>)"#]],
    );
    assert_eq!(pid_gone, None);
    let next = run(&provider, "again", None).await;
    assert!(
        matches!(next.last(), Some(ProviderEvent::Result { .. })),
        "{next:#?}"
    );
    provider.shutdown().await;
}

#[tokio::test]
async fn a_garbage_line_mid_turn_ends_it_and_the_agent_is_replaced() {
    let fake = Fake::new(
        json!({"turns": [[{"say": "partial"}, {"garbage": "Debugger attached."}, {"waitCancel": true}]]}),
    );
    let provider = fake.provider();
    let started = Instant::now();
    let events = run(&provider, "go", None).await;
    check(
        &events,
        expect![[r#"
            Init
            Error Process retryable=true: the agent wrote a line that is not JSON-RPC: Debugger attached."#]],
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(provider.pid().await, None, "the broken agent is stopped");
    provider.shutdown().await;
}

#[tokio::test]
async fn a_json_rpc_error_ends_the_turn_classified() {
    let fake = Fake::new(json!({"turns": [
        [{"error": {"code": -32603, "message": "Rate limit exceeded, retry later"}}],
        [{"error": {"code": -32603, "message": "Internal error", "data": {"message": "model exploded"}}}],
    ]}));
    let provider = fake.provider();
    let limited = run(&provider, "a", None).await;
    let session = session_of(&limited);
    let failed = run(&provider, "b", Some(&session)).await;
    check(
        &[limited, failed].concat(),
        expect![[r#"
            Init
            Error RateLimited retryable=true: the agent refused the prompt: Rate limit exceeded, retry later
            Init
            Error Api retryable=true: the agent refused the prompt: Internal error: model exploded"#]],
    );
    provider.shutdown().await;
}

#[tokio::test]
async fn an_authentication_requirement_is_an_auth_error_naming_the_fix() {
    let fake = Fake::new(json!({"authRequired": true}));
    let provider = fake.provider();
    let events = run(&provider, "hi", None).await;
    check(
        &events,
        expect![[r#"
            Error Auth retryable=false: the agent requires authentication (Authentication required; it offers api-key (API key)): give it an API key through its settings or cliEnv"#]],
    );
    provider.shutdown().await;
}

#[tokio::test]
async fn a_stalled_agent_is_stopped_by_the_watchdog() {
    let mut fake = Fake::new(json!({"turns": [[{"say": "…"}, {"waitCancel": true}]]}));
    fake.settings.watchdog = Duration::from_secs(1);
    let provider = fake.provider();
    let started = Instant::now();
    let events = run(&provider, "stall", None).await;
    check(
        &events,
        expect![[r#"
            Init
            Error Watchdog retryable=true: the agent produced no output for 1s during a turn"#]],
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(provider.pid().await, None);
    provider.shutdown().await;
}

#[tokio::test]
async fn an_extension_request_gets_method_not_found() {
    let fake = Fake::new(json!({"turns": [[{"ext": "craft/drainMidTurnQueue"}]]}));
    let provider = fake.provider();
    let events = run(&provider, "x", None).await;
    assert!(
        events.contains(&ProviderEvent::Text {
            text: "ext: -32601".into()
        }),
        "{events:#?}"
    );
    provider.shutdown().await;
}

#[tokio::test]
async fn no_agent_process_outlives_shutdown() {
    let fake = Fake::new(json!({}));
    let provider = fake.provider();
    run(&provider, "x", None).await;
    let pid = provider.pid().await.expect("a running agent");
    provider.shutdown().await;
    let alive = nix_alive(pid);
    assert!(!alive, "agent {pid} still runs after shutdown");
}

fn nix_alive(pid: u32) -> bool {
    // /proc/<pid> of a reaped process is gone.
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Starts a query on a turn that sleeps `sleep_ms` without reading its stdin (so the cancel is
/// read only after it), interrupts it once the turn runs: the events after the interrupt, the
/// time they took, the session and the agent's pid.
async fn interrupt_a_sleeping_turn(
    provider: &AcpProvider,
) -> (Vec<ProviderEvent>, Duration, String, Option<u32>) {
    let mut query = provider.query(input("long", None)).unwrap();
    let mut events = Vec::new();
    loop {
        let event = query.next_event().await.unwrap();
        let output = matches!(event, ProviderEvent::Output);
        events.push(event);
        if output {
            break;
        }
    }
    let session = session_of(&events);
    let pid = provider.pid().await;
    let asked_at = Instant::now();
    query.interrupt();
    let rest = drain(&mut query, |_| None).await;
    let took = asked_at.elapsed();
    (rest, took, session, pid)
}

#[tokio::test]
async fn a_cancel_answered_late_ends_the_turn_in_time_and_keeps_the_agent() {
    let fake = Fake::new(json!({"turns": [[{"say": "busy"}, {"sleep": 3000}]]}));
    let provider = fake.provider();
    let (rest, took, session, pid) = interrupt_a_sleeping_turn(&provider).await;
    assert!(took < Duration::from_millis(2000), "{took:?}");
    check(
        &rest,
        expect!["Interrupted { covers: 0, usage: None, reason: Stopped }"],
    );
    // The next query waits for the late answer, then continues the session in the same agent.
    let next = run(&provider, "again", Some(&session)).await;
    check(
        &next,
        expect![[r#"
            Init
            Text { text: "echo: again" }
            Result { text: "echo: again", covers: 0, usage: None }"#]],
    );
    assert_eq!(provider.pid().await, pid, "the slow agent is kept");
    provider.shutdown().await;
}

#[tokio::test]
async fn an_agent_that_never_answers_the_cancel_is_replaced() {
    let fake = Fake::new(json!({"turns": [[{"say": "busy"}, {"sleep": 60000}]]}));
    let provider = fake.provider();
    let (rest, took, session, pid) = interrupt_a_sleeping_turn(&provider).await;
    assert!(took < Duration::from_millis(2000), "{took:?}");
    check(
        &rest,
        expect!["Interrupted { covers: 0, usage: None, reason: Stopped }"],
    );
    // After the linger the agent is stopped; the next query starts a new one, which cannot load
    // sessions: a new session, with a note.
    let next = run(&provider, "again", Some(&session)).await;
    check(
        &next,
        expect![[r#"
            Progress: stored session <session> could not be resumed (the agent cannot load sessions (no loadSession capability)); starting a new one
            Init
            Text { text: "echo: again" }
            Result { text: "echo: again", covers: 0, usage: None }"#]],
    );
    let now = provider.pid().await;
    assert!(
        now.is_some() && now != pid,
        "a new agent: {pid:?} → {now:?}"
    );
    assert!(!nix_alive(pid.unwrap()), "the hung agent is gone");
    provider.shutdown().await;
}

#[tokio::test]
async fn images_are_blocks_only_when_the_agent_takes_them() {
    for image in [true, false] {
        let fake = Fake::new(json!({"image": image}));
        let picture = fake.dir.path().join("downloads-cat.png");
        std::fs::write(&picture, b"\x89PNG\r\n\x1a\nfake").unwrap();
        let provider = fake.provider();
        let mut query = provider
            .query(QueryInput {
                prompt: provider::Prompt {
                    text: "look at downloads-cat.png".into(),
                    media: vec![provider::MediaFile {
                        path: picture.clone(),
                        mime_type: "image/png".into(),
                    }],
                },
                ..QueryInput::default()
            })
            .unwrap();
        let events = drain(&mut query, |_| None).await;
        let expected = if image {
            "echo: look at downloads-cat.png + [image]"
        } else {
            "echo: look at downloads-cat.png"
        };
        assert!(
            events.contains(&ProviderEvent::Text {
                text: expected.into()
            }),
            "image={image}: {events:#?}"
        );
        provider.shutdown().await;
    }
}

#[tokio::test]
async fn the_system_prompt_leads_a_session_once_and_again_when_it_changes() {
    let fake = Fake::new(json!({}));
    let provider = fake.provider();
    let with_system = |text: &str, system: &str, continuation: Option<&str>| QueryInput {
        system_prompt: Some(system.to_owned()),
        ..input(text, continuation)
    };
    let mut first = provider
        .query(with_system("one", "Be brief.", None))
        .unwrap();
    let first = drain(&mut first, |_| None).await;
    let session = session_of(&first);
    let mut second = provider
        .query(with_system("two", "Be brief.", Some(&session)))
        .unwrap();
    let second = drain(&mut second, |_| None).await;
    let mut third = provider
        .query(with_system("three", "Be kind.", Some(&session)))
        .unwrap();
    let third = drain(&mut third, |_| None).await;
    let texts: Vec<String> = [first, second, third]
        .iter()
        .flat_map(|events| {
            events.iter().filter_map(|e| match e {
                ProviderEvent::Result { text, .. } => Some(text.clone()),
                _ => None,
            })
        })
        .collect();
    expect![[r#"
        echo: <system-instructions>
        Be brief.
        </system-instructions> + one
        echo: two
        echo: <system-instructions>
        Be kind.
        </system-instructions> + three"#]]
    .assert_eq(&texts.join("\n"));
    provider.shutdown().await;
}

#[tokio::test]
async fn each_query_is_archived_from_the_journal() {
    let fake = Fake::new(json!({"turns": [
        [{"say": "Checking."}, {"tool": {"toolCallId": "c1", "kind": "execute", "title": "ls", "rawInput": {"command": "ls"}}},
         {"toolDone": "c1"}, {"say": "Two files."}],
    ]}));
    let provider = fake.provider();
    let session = session_of(&run(&provider, "what is here?", None).await);
    run(&provider, "thanks", Some(&session)).await;
    provider.shutdown().await;
    let dir = fake.dir.path().join("agent/conversations");
    let archives: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        archives.len(),
        1,
        "one archive per session and day: {archives:?}"
    );
    let text = std::fs::read_to_string(&archives[0]).unwrap();
    for part in [
        "what is here?",
        "Checking.",
        "ls",
        "Two files.",
        "thanks",
        "echo: thanks",
    ] {
        assert!(text.contains(part), "{part:?} missing:\n{text}");
    }
    assert_eq!(
        text.matches("### User").count(),
        2,
        "each prompt once: appended, not rewritten:\n{text}"
    );
}
