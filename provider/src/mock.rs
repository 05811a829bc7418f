//! A provider for demos and unit tests: its result text is exactly the prompt it received, so a
//! person or a test sees what an agent would see. It answers one result per prompt (the first
//! and each push), honours `end`, `abort` and `interrupt`, and can be told to delay or fail and
//! what usage each turn reports.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::sleep;

use crate::{
    AgentProvider, AgentQuery, ApprovalAnswer, ApprovalKind, ApprovalRequest, Control, ErrorClass,
    InterruptReason, Prompt, PromptId, ProviderError, ProviderEvent, QueryHandle, QueryInput,
    Usage,
};

/// What the mock does with one prompt. In JSON (`NANOCLAW_MOCK_SCRIPT`):
/// `{"step":"echo","delayMs":100}`, `{"step":"reply","text":"hi","delayMs":0}`,
/// `{"step":"fail","message":"boom","retryable":true,"classification":"Api"}`,
/// `{"step":"ask","tool":"Bash","argument":"rm -rf target"}` (also `"parallel":[{"tool":"Write",
/// "argument":"notes.md"}]`, `"notice":"retrying"`, `"delayMs":100}`),
/// `{"step":"elicit","server":"deploy","message":"Which?","options":["a","b"]}`,
/// `{"step":"approvalStop","tool":"mcp__nanoclaw__send_message"}` (also `"untilPush":true`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(tag = "step", rename_all = "camelCase")]
pub enum MockStep {
    /// Reply with the prompt text after `delay`.
    Echo {
        /// Time to "think".
        #[serde(rename = "delayMs", default, deserialize_with = "millis")]
        delay: Duration,
    },
    /// Reply with this text instead of the prompt.
    Reply {
        /// The result text.
        text: String,
        /// Time to "think".
        #[serde(rename = "delayMs", default, deserialize_with = "millis")]
        delay: Duration,
    },
    /// End the turn with an error.
    Fail {
        /// The message.
        message: String,
        /// Whether it is retryable.
        #[serde(default)]
        retryable: bool,
        /// Its class.
        #[serde(default = "other_class")]
        classification: ErrorClass,
    },
    /// Write pieces of text and start tools (`Text` and `Activity` events, at once), then
    /// reply with `text` after `delay` (`{"step":"parts","parts":[{"text":".."},
    /// {"tool":"Bash","summary":"ls"}],"text":"done","delayMs":100}`).
    Parts {
        /// The pieces, in order.
        parts: Vec<MockPart>,
        /// The result text.
        text: String,
        /// Time to "think" after the pieces.
        #[serde(rename = "delayMs", default, deserialize_with = "millis")]
        delay: Duration,
    },
    /// Ask the runner to approve a tool call ([`ProviderEvent::ApprovalRequest`]) and wait for
    /// the answer; the result says what happened: `ran <tool>` when allowed, `refused <tool>:
    /// <reason>` when denied (with `parallel` calls, each call's outcome in order, joined by
    /// `; `).
    Ask {
        /// Canonical tool name.
        tool: String,
        /// The whole argument (the command line).
        #[serde(default)]
        argument: Option<String>,
        /// More calls asked at the same time, before any answer is awaited (a CLI running tool
        /// calls in parallel, as Claude does); the turn goes on once every one is answered.
        #[serde(default)]
        parallel: Vec<MockCall>,
        /// A retry notice of the CLI ([`ProviderEvent::Error`] with `ends_turn: false`) sent
        /// once the requests are out, while they wait.
        #[serde(default)]
        notice: Option<String>,
        /// Time to "think" after the answers, before the result.
        #[serde(rename = "delayMs", default, deserialize_with = "millis")]
        delay: Duration,
        /// Why the policy could not decide the (first) call's command, when that is why it is
        /// asked ([`ApprovalKind::ToolCall`]'s `undecidable`).
        #[serde(default)]
        undecidable: Option<String>,
    },
    /// An MCP elicitation ([`ApprovalKind::Elicitation`]); the result is `answered <text>` or
    /// `declined: <reason>`.
    Elicit {
        /// The MCP server's name.
        server: String,
        /// What it asks.
        message: String,
        /// The choices; empty for free text.
        #[serde(default)]
        options: Vec<String>,
    },
    /// Call an approval-stop tool: its `Activity`, then the turn ends with
    /// [`InterruptReason::ApprovalStop`] (no result text), as the CLI drivers do.
    ApprovalStop {
        /// The tool (canonical MCP name).
        tool: String,
        /// The tool returns only once the runner pushed a prompt (a message that came during
        /// the turn): the model never sees that prompt in this turn, as with a CLI whose
        /// approval stop ends the turn at the tool's result.
        #[serde(rename = "untilPush", default)]
        until_push: bool,
    },
}

/// A tool call asked at the same time as an [`MockStep::Ask`]'s own.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct MockCall {
    /// Canonical tool name.
    pub tool: String,
    /// The whole argument.
    #[serde(default)]
    pub argument: Option<String>,
}

/// A piece of a [`MockStep::Parts`] turn: a text piece, a tool call (canonical name and
/// summary), or a call the policy refused (`{"denied":"Bash","summary":"rm -rf target"}`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(untagged)]
pub enum MockPart {
    /// A [`ProviderEvent::ToolDenied`].
    Denied {
        /// The tool refused.
        denied: String,
        /// What the call would have done.
        #[serde(default)]
        summary: Option<String>,
    },
    /// A `Text` event.
    Text {
        /// The complete piece.
        text: String,
    },
    /// An `Activity` event of a tool call.
    Tool {
        /// The tool's name.
        tool: String,
        /// What it does.
        #[serde(default)]
        summary: Option<String>,
    },
}

fn millis<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let ms = <u64 as serde::Deserialize>::deserialize(deserializer)?;
    Ok(Duration::from_millis(ms))
}

fn other_class() -> ErrorClass {
    ErrorClass::Other
}

/// What only the mock reads from the configuration (`mockDelayMs`, `mockScript`,
/// `mockEchoSystemPrompt`, `mockUsage`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MockSettings {
    /// Think time of echo replies that no script step covers.
    pub delay: Duration,
    /// Scripted steps for the first prompts (`[{"step":"echo"|"reply"|"fail", ...}]`).
    pub script: Vec<MockStep>,
    /// Echo replies start with the query's system prompt and a `---` line, so a test of the
    /// binary can see the system prompt the runner built.
    pub echo_system_prompt: bool,
    /// The usage every answered (or failed, or stopped) prompt reports when no queued figure
    /// ([`MockProvider::script_usage`]) applies; `None`: the mock reports none, like a CLI
    /// that says nothing.
    pub usage: Option<Usage>,
}

/// How many of the latest prompts and query inputs the mock keeps for inspection. A bound, so
/// a long-running mock (demos, benchmarks of 10,000 messages) does not grow with every message;
/// tests look at far fewer.
pub const MOCK_KEPT: usize = 64;

/// Shared, inspectable state of the mock.
#[derive(Debug, Default)]
pub struct MockState {
    /// The latest prompts received (first prompts and pushes), oldest first; at most
    /// [`MOCK_KEPT`].
    pub prompts: VecDeque<Prompt>,
    /// The latest query inputs received, oldest first; at most [`MOCK_KEPT`].
    pub inputs: VecDeque<QueryInput>,
    /// Steps to use for the next prompts; echo without delay when empty.
    pub script: VecDeque<MockStep>,
    /// Default delay for echo replies.
    pub default_delay: Duration,
    /// Echo replies are `<system prompt>\n---\n<prompt>` instead of the prompt alone. The system
    /// prompt is XML-escaped (`& < >`) in the echo: its `<message to="…">` and `<internal>`
    /// examples would otherwise be taken for reply blocks by the runner's reply parser.
    pub echo_system_prompt: bool,
    /// Usage reported by the next prompts' results, one per prompt, before `default_usage`.
    pub usage: VecDeque<Option<Usage>>,
    /// Usage reported when `usage` is empty.
    pub default_usage: Option<Usage>,
    /// Session counter for `Init` ids.
    sessions: u64,
}

/// The mock provider.
#[derive(Debug, Clone, Default)]
pub struct MockProvider {
    state: Arc<Mutex<MockState>>,
}

impl MockProvider {
    /// A mock that echoes immediately.
    pub fn new() -> Self {
        Self::default()
    }

    /// A mock configured by its settings (delay, script, echo mode).
    pub fn from_settings(settings: MockSettings) -> Self {
        let mock = Self::with_delay(settings.delay);
        mock.script(settings.script);
        mock.with_state(|state| {
            state.echo_system_prompt = settings.echo_system_prompt;
            state.default_usage = settings.usage;
        });
        mock
    }

    /// A mock that echoes after `delay`.
    pub fn with_delay(delay: Duration) -> Self {
        let mock = Self::default();
        mock.with_state(|state| state.default_delay = delay);
        mock
    }

    /// Queues steps for the next prompts.
    pub fn script(&self, steps: impl IntoIterator<Item = MockStep>) {
        self.with_state(|state| state.script.extend(steps));
    }

    /// Queues the usage the next prompts report (on their result, failure or interruption),
    /// one per prompt; the settings' `usage` applies after them.
    pub fn script_usage(&self, usage: impl IntoIterator<Item = Option<Usage>>) {
        self.with_state(|state| state.usage.extend(usage));
    }

    /// The prompts received so far, oldest first (the latest [`MOCK_KEPT`]).
    pub fn prompts(&self) -> Vec<Prompt> {
        self.with_state(|state| state.prompts.iter().cloned().collect())
    }

    /// The query inputs received so far, oldest first (the latest [`MOCK_KEPT`]).
    pub fn inputs(&self) -> Vec<QueryInput> {
        self.with_state(|state| state.inputs.iter().cloned().collect())
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut MockState) -> T) -> T {
        let mut guard = match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    /// The step for `prompt` and the usage it reports.
    fn next_step(&self, prompt: &Prompt) -> (MockStep, Option<Usage>) {
        self.with_state(|state| {
            keep_latest(&mut state.prompts, prompt.clone());
            let step = state.script.pop_front().unwrap_or(MockStep::Echo {
                delay: state.default_delay,
            });
            let usage = state
                .usage
                .pop_front()
                .unwrap_or_else(|| state.default_usage.clone());
            (step, usage)
        })
    }
}

impl AgentProvider for MockProvider {
    fn name(&self) -> &'static str {
        crate::ProviderKind::Mock.name()
    }

    fn query(&self, input: QueryInput) -> Result<AgentQuery, ProviderError> {
        let (query, handle) = AgentQuery::channel();
        let session_id = self.with_state(|state| {
            keep_latest(&mut state.inputs, input.clone());
            state.sessions += 1;
            input
                .continuation
                .clone()
                .unwrap_or_else(|| format!("mock-session-{}", state.sessions))
        });
        let echo_prefix = self.with_state(|state| state.echo_system_prompt).then(|| {
            format!(
                "{}\n---\n",
                crate::prompt_xml::escape_body(&input.system_prompt.unwrap_or_default())
            )
        });
        tokio::spawn(run_query(
            self.clone(),
            session_id,
            input.prompt,
            echo_prefix,
            handle,
        ));
        Ok(query)
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Answers prompts one after another; pushes queue behind the prompt being answered.
async fn run_query(
    mock: MockProvider,
    session_id: String,
    first: Prompt,
    echo_prefix: Option<String>,
    mut handle: QueryHandle,
) {
    if handle
        .events
        .send(ProviderEvent::Init { session_id })
        .await
        .is_err()
    {
        return;
    }
    let mut queue: VecDeque<(PromptId, Prompt)> = VecDeque::from([(0, first)]);
    let mut ended = false;
    // The last prompt answered: what an interruption between prompts covers.
    let mut answered: PromptId = 0;
    loop {
        let Some((id, prompt)) = queue.pop_front() else {
            if ended || !idle(&mut handle, &mut queue, answered).await {
                return;
            }
            continue;
        };
        let (step, usage) = mock.next_step(&prompt);
        let (text, delay) = match step {
            MockStep::Echo { delay } => match &echo_prefix {
                Some(prefix) => (format!("{prefix}{}", prompt.text), delay),
                None => (prompt.text.clone(), delay),
            },
            MockStep::Reply { text, delay } => (text, delay),
            MockStep::Parts { parts, text, delay } => {
                send_parts(&handle, parts).await;
                (text, delay)
            }
            MockStep::Ask {
                tool,
                argument,
                parallel,
                notice,
                delay,
                undecidable,
            } => {
                let asking = Asking {
                    id,
                    kinds: tool_calls(MockCall { tool, argument }, undecidable, parallel),
                    notice,
                };
                match asked(&mut handle, asking, &mut queue, &mut ended, usage.clone()).await {
                    Some(text) => (text, delay),
                    None => return,
                }
            }
            MockStep::Elicit {
                server,
                message,
                options,
            } => {
                let asking = Asking {
                    id,
                    kinds: vec![ApprovalKind::Elicitation {
                        server,
                        message,
                        options,
                    }],
                    notice: None,
                };
                match asked(&mut handle, asking, &mut queue, &mut ended, usage.clone()).await {
                    Some(text) => (text, Duration::ZERO),
                    None => return,
                }
            }
            MockStep::ApprovalStop { tool, until_push } => {
                approval_stop(&mut handle, &mut queue, id, tool, until_push, usage).await;
                return;
            }
            MockStep::Fail {
                message,
                retryable,
                classification,
            } => {
                let event = ProviderEvent::Error {
                    message,
                    retryable,
                    classification,
                    ends_turn: true,
                    usage,
                };
                let _ = handle.events.send(event).await;
                return;
            }
        };
        if !answer(&mut handle, &mut queue, &mut ended, delay, id, text, usage).await {
            return;
        }
        answered = id;
    }
}

/// Sends a `Parts` step's parts, in order.
async fn send_parts(handle: &QueryHandle, parts: Vec<MockPart>) {
    for part in parts {
        let event = match part {
            MockPart::Text { text } => ProviderEvent::Text { text },
            MockPart::Tool { tool, summary } => ProviderEvent::Activity {
                tool: Some(tool),
                summary,
            },
            MockPart::Denied { denied, summary } => ProviderEvent::ToolDenied {
                tool: denied,
                summary,
            },
        };
        let _ = handle.events.send(event).await;
    }
}

/// The approval requests of an `Ask` step: its own call first, then the parallel ones.
fn tool_calls(
    first: MockCall,
    undecidable: Option<String>,
    parallel: Vec<MockCall>,
) -> Vec<ApprovalKind> {
    std::iter::once((first, undecidable))
        .chain(parallel.into_iter().map(|call| (call, None)))
        .map(
            |(MockCall { tool, argument }, undecidable)| ApprovalKind::ToolCall {
                summary: argument
                    .as_deref()
                    .and_then(crate::driver::activity::one_line_summary),
                tool,
                argument,
                undecidable,
            },
        )
        .collect()
}

/// Between prompts: waits for the next control. `false` when the query ends.
async fn idle(
    handle: &mut QueryHandle,
    queue: &mut VecDeque<(PromptId, Prompt)>,
    answered: PromptId,
) -> bool {
    match handle.control.recv().await {
        Some(Control::Push { id, prompt }) => queue.push_back((id, prompt)),
        Some(Control::End) | None => return false,
        Some(Control::Abort) => {
            let _ = handle.events.send(aborted(None)).await;
            return false;
        }
        Some(Control::Interrupt) => {
            let _ = handle.events.send(interrupted(answered, None)).await;
            return false;
        }
        Some(Control::Approval { .. }) => {}
    }
    true
}

/// An `ApprovalStop` step: the tool runs (until a push when `until_push`), then the turn
/// stops as the approval policy would.
async fn approval_stop(
    handle: &mut QueryHandle,
    queue: &mut VecDeque<(PromptId, Prompt)>,
    id: PromptId,
    tool: String,
    until_push: bool,
    usage: Option<Usage>,
) {
    let _ = handle
        .events
        .send(ProviderEvent::Activity {
            tool: Some(tool),
            summary: None,
        })
        .await;
    // The tool runs until a prompt is pushed; the push stays queued, unseen.
    let mut running = until_push;
    while running {
        match handle.control.recv().await {
            Some(Control::Push { id, prompt }) => {
                queue.push_back((id, prompt));
                running = false;
            }
            // No push can come any more: the tool returns.
            Some(Control::End) => running = false,
            Some(Control::Approval { .. }) => {}
            Some(Control::Interrupt) => {
                let _ = handle.events.send(interrupted(id, usage)).await;
                return;
            }
            Some(Control::Abort) | None => {
                let _ = handle.events.send(aborted(usage)).await;
                return;
            }
        }
    }
    let _ = handle
        .events
        .send(ProviderEvent::Interrupted {
            covers: id,
            usage,
            reason: InterruptReason::ApprovalStop,
        })
        .await;
}

/// Answers prompt `id` with `text`: liveness, `delay` of thinking (taking controls meanwhile),
/// then the result. `false` when the turn or the query ended early.
async fn answer(
    handle: &mut QueryHandle,
    queue: &mut VecDeque<(PromptId, Prompt)>,
    ended: &mut bool,
    delay: Duration,
    id: PromptId,
    text: String,
    usage: Option<Usage>,
) -> bool {
    let _ = handle
        .events
        .send(ProviderEvent::Activity {
            tool: None,
            summary: None,
        })
        .await;
    // No timer for a zero delay: tokio rounds any sleep up to its next 1 ms tick, which was
    // most of the benchmark's insert → reply time. Controls sent meanwhile wait in the
    // channel for the loop above.
    let thinking = sleep(delay);
    tokio::pin!(thinking);
    while !delay.is_zero() {
        tokio::select! {
            _ = &mut thinking => break,
            control = handle.control.recv() => match control {
                Some(Control::Push { id, prompt }) => queue.push_back((id, prompt)),
                Some(Control::End) => *ended = true,
                // The model saw this prompt (and what it answered before); queued pushes
                // were not consumed.
                Some(Control::Interrupt) => {
                    let _ = handle.events.send(interrupted(id, usage)).await;
                    return false;
                }
                Some(Control::Approval { .. }) => {}
                Some(Control::Abort) | None => {
                    let _ = handle.events.send(aborted(usage)).await;
                    return false;
                }
            },
        }
    }
    handle
        .events
        .send(ProviderEvent::Result {
            text,
            covers: id,
            usage,
        })
        .await
        .is_ok()
}

/// What one step asks at once.
#[derive(Debug)]
struct Asking {
    /// The prompt being answered.
    id: PromptId,
    /// The requests, sent in this order.
    kinds: Vec<ApprovalKind>,
    /// A retry notice sent once the requests are out.
    notice: Option<String>,
}

/// Asks (see [`ask`]) and says what happened as the turn's result text (`ran Bash`, `refused
/// Bash: <reason>`, `answered <text>`, `declined: <reason>`; several requests' outcomes joined
/// by `; `); `None` when the query ended meanwhile (its last event sent).
async fn asked(
    handle: &mut QueryHandle,
    asking: Asking,
    queue: &mut VecDeque<(PromptId, Prompt)>,
    ended: &mut bool,
    usage: Option<Usage>,
) -> Option<String> {
    let id = asking.id;
    let tools: Vec<Option<String>> = asking
        .kinds
        .iter()
        .map(|kind| match kind {
            ApprovalKind::ToolCall { tool, .. } => Some(tool.clone()),
            ApprovalKind::Elicitation { .. } => None,
        })
        .collect();
    let answers = match ask(handle, asking, queue, ended).await {
        Asked::Answers(answers) => answers,
        over => {
            if let Some(event) = over.ending(id, usage) {
                let _ = handle.events.send(event).await;
            }
            return None;
        }
    };
    let outcomes: Vec<String> = tools
        .into_iter()
        .zip(answers)
        .map(|outcome| match outcome {
            (Some(tool), ApprovalAnswer::Allow) => format!("ran {tool}"),
            (Some(tool), ApprovalAnswer::Deny { reason }) => format!("refused {tool}: {reason}"),
            (None, ApprovalAnswer::Reply(text)) => format!("answered {text}"),
            (None, ApprovalAnswer::Deny { reason }) => format!("declined: {reason}"),
            (_, other) => format!("unexpected answer {other:?}"),
        })
        .collect();
    Some(outcomes.join("; "))
}

/// How an [`ask`] ended.
#[derive(Debug)]
enum Asked {
    /// The runner's answers, in the order of the requests.
    Answers(Vec<ApprovalAnswer>),
    /// The runner interrupted the turn meanwhile (the requests count as denied, as in every
    /// driver).
    Interrupted,
    /// The query was aborted meanwhile.
    Aborted,
}

impl Asked {
    /// The event that ends the query when the wait did not end with the answers.
    fn ending(&self, id: PromptId, usage: Option<Usage>) -> Option<ProviderEvent> {
        match self {
            Self::Answers(_) => None,
            Self::Interrupted => Some(interrupted(id, usage)),
            Self::Aborted => Some(aborted(usage)),
        }
    }
}

/// Sends every approval request of `asking` (then its notice) and waits until each one is
/// answered, in any order, queueing pushes and honouring `end`, `interrupt` and `abort`
/// meanwhile (a CLI waits the same way).
async fn ask(
    handle: &mut QueryHandle,
    asking: Asking,
    queue: &mut VecDeque<(PromptId, Prompt)>,
    ended: &mut bool,
) -> Asked {
    let mut waiting: Vec<(String, Option<ApprovalAnswer>)> = Vec::new();
    for (n, kind) in asking.kinds.into_iter().enumerate() {
        let request_id = format!("mock-approval-{}-{n}", asking.id);
        waiting.push((request_id.clone(), None));
        let request = ApprovalRequest {
            id: request_id,
            kind,
        };
        if handle
            .events
            .send(ProviderEvent::ApprovalRequest(request))
            .await
            .is_err()
        {
            return Asked::Aborted;
        }
    }
    if let Some(message) = asking.notice {
        let notice = ProviderEvent::Error {
            message,
            retryable: true,
            classification: ErrorClass::Api,
            ends_turn: false,
            usage: None,
        };
        if handle.events.send(notice).await.is_err() {
            return Asked::Aborted;
        }
    }
    while waiting.iter().any(|(_, answer)| answer.is_none()) {
        match handle.control.recv().await {
            Some(Control::Approval {
                id: answered,
                answer,
            }) => {
                // An answer to a request already answered (or not ours) changes nothing.
                if let Some((_, slot @ None)) = waiting.iter_mut().find(|(id, _)| *id == answered) {
                    *slot = Some(answer);
                }
            }
            Some(Control::Push { id, prompt }) => queue.push_back((id, prompt)),
            Some(Control::End) => *ended = true,
            Some(Control::Interrupt) => return Asked::Interrupted,
            Some(Control::Abort) | None => return Asked::Aborted,
        }
    }
    Asked::Answers(waiting.into_iter().filter_map(|(_, a)| a).collect())
}

/// Appends `item`, dropping the oldest beyond [`MOCK_KEPT`].
fn keep_latest<T>(kept: &mut VecDeque<T>, item: T) {
    if kept.len() >= MOCK_KEPT {
        kept.pop_front();
    }
    kept.push_back(item);
}

fn aborted(usage: Option<Usage>) -> ProviderEvent {
    ProviderEvent::Error {
        message: "aborted".into(),
        retryable: false,
        classification: ErrorClass::Aborted,
        ends_turn: true,
        usage,
    }
}

/// The runner's interrupt: the turn ends having seen prompts up to `covers`.
fn interrupted(covers: PromptId, usage: Option<Usage>) -> ProviderEvent {
    ProviderEvent::Interrupted {
        covers,
        usage,
        reason: InterruptReason::Stopped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A query of `mock` for a first prompt of `text`.
    fn start(mock: &MockProvider, text: impl Into<String>) -> AgentQuery {
        mock.query(QueryInput {
            prompt: Prompt::text(text),
            ..Default::default()
        })
        .unwrap()
    }

    /// The result texts among `events`.
    fn result_texts(events: &[ProviderEvent]) -> Vec<&str> {
        events
            .iter()
            .filter_map(|e| match e {
                ProviderEvent::Result { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The end of a first prompt's turn by an approval stop, without usage.
    fn approval_stopped() -> ProviderEvent {
        ProviderEvent::Interrupted {
            covers: 0,
            usage: None,
            reason: InterruptReason::ApprovalStop,
        }
    }

    async fn collect(query: &mut AgentQuery) -> Vec<ProviderEvent> {
        let mut events = Vec::new();
        while let Some(event) = query.next_event().await {
            events.push(event);
        }
        events
    }

    #[tokio::test]
    async fn echoes_each_prompt_and_honours_end() {
        let mock = MockProvider::with_delay(Duration::from_millis(20));
        let mut query = start(&mock, "one");
        assert_eq!(query.push(Prompt::text("two")).unwrap(), 1);
        query.end();
        let events = collect(&mut query).await;
        let results: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                ProviderEvent::Result { text, covers, .. } => Some((text.as_str(), *covers)),
                _ => None,
            })
            .collect();
        assert_eq!(results, vec![("one", 0), ("two", 1)]);
        assert!(matches!(events[0], ProviderEvent::Init { .. }));
    }

    #[tokio::test]
    async fn can_echo_the_system_prompt_escaped() {
        let mock = MockProvider::from_settings(MockSettings {
            echo_system_prompt: true,
            ..MockSettings::default()
        });
        let mut query = mock
            .query(QueryInput {
                prompt: Prompt::text("hi"),
                system_prompt: Some("Use <internal> & more".into()),
                ..Default::default()
            })
            .unwrap();
        query.end();
        let events = collect(&mut query).await;
        let text = events.iter().find_map(|e| match e {
            ProviderEvent::Result { text, .. } => Some(text.as_str()),
            _ => None,
        });
        assert_eq!(text, Some("Use &lt;internal&gt; &amp; more\n---\nhi"));
    }

    #[tokio::test]
    async fn abort_stops_a_slow_turn() {
        let mock = MockProvider::with_delay(Duration::from_secs(60));
        let mut query = start(&mock, "slow");
        query.abort();
        let events = tokio::time::timeout(Duration::from_secs(2), collect(&mut query))
            .await
            .unwrap();
        assert!(matches!(
            events.last(),
            Some(ProviderEvent::Error {
                classification: ErrorClass::Aborted,
                ..
            })
        ));
    }

    #[tokio::test]
    async fn scripted_failure_and_reply() {
        let mock = MockProvider::new();
        mock.script([
            MockStep::Fail {
                message: "boom".into(),
                retryable: true,
                classification: ErrorClass::Api,
            },
            MockStep::Reply {
                text: "fine".into(),
                delay: Duration::ZERO,
            },
        ]);
        let mut first = start(&mock, "a");
        let events = collect(&mut first).await;
        assert!(matches!(
            events.last(),
            Some(ProviderEvent::Error {
                retryable: true,
                ..
            })
        ));
        let mut second = start(&mock, "b");
        second.end();
        let events = collect(&mut second).await;
        assert!(events.contains(&ProviderEvent::Result {
            text: "fine".into(),
            covers: 0,
            usage: None
        }));
        assert_eq!(mock.prompts().len(), 2);
    }

    #[tokio::test]
    async fn scripted_usage_comes_with_each_result_then_the_default() {
        let every = Usage {
            input_tokens: Some(1),
            ..Usage::default()
        };
        let mock = MockProvider::from_settings(MockSettings {
            usage: Some(every.clone()),
            ..MockSettings::default()
        });
        let first = Usage {
            input_tokens: Some(100),
            output_tokens: Some(20),
            cost_usd: Some(0.25),
            requests: Some(2),
            model: Some("mock-model".into()),
            ..Usage::default()
        };
        mock.script_usage([Some(first.clone()), None]);
        let mut query = start(&mock, "a");
        query.push(Prompt::text("b")).unwrap();
        query.push(Prompt::text("c")).unwrap();
        query.end();
        let usages: Vec<_> = collect(&mut query)
            .await
            .into_iter()
            .filter_map(|e| match e {
                ProviderEvent::Result { usage, .. } => Some(usage),
                _ => None,
            })
            .collect();
        assert_eq!(usages, vec![Some(first), None, Some(every)]);
    }

    #[tokio::test]
    async fn interrupt_ends_the_turn_covering_what_the_model_saw() {
        let mock = MockProvider::with_delay(Duration::from_secs(60));
        mock.script_usage([Some(Usage {
            output_tokens: Some(5),
            ..Usage::default()
        })]);
        let mut query = start(&mock, "slow");
        query.push(Prompt::text("pushed")).unwrap();
        query.interrupt();
        let events = tokio::time::timeout(Duration::from_secs(2), collect(&mut query))
            .await
            .unwrap();
        assert_eq!(
            events.last(),
            Some(&ProviderEvent::Interrupted {
                covers: 0,
                usage: Some(Usage {
                    output_tokens: Some(5),
                    ..Usage::default()
                }),
                reason: InterruptReason::Stopped,
            }),
            "{events:?}"
        );
        assert_eq!(mock.prompts().len(), 1, "the push was not consumed");
    }

    #[tokio::test]
    async fn an_ask_waits_for_the_answer_and_an_approval_stop_ends_the_turn() {
        let mock = MockProvider::new();
        let script: Vec<MockStep> = serde_json::from_str(
            r#"[{"step": "ask", "tool": "Bash", "argument": "rm -rf target\nls"},
                {"step": "ask", "tool": "Bash"},
                {"step": "approvalStop", "tool": "mcp__nanoclaw__send_message"}]"#,
        )
        .unwrap();
        mock.script(script);
        let mut query = start(&mock, "a");
        let request = loop {
            match query.next_event().await {
                Some(ProviderEvent::ApprovalRequest(request)) => break request,
                Some(_) => {}
                None => panic!("no approval request"),
            }
        };
        assert_eq!(
            request.kind,
            ApprovalKind::ToolCall {
                tool: "Bash".into(),
                summary: Some("rm -rf target".into()),
                argument: Some("rm -rf target\nls".into()),
                undecidable: None,
            }
        );
        assert!(query.approver().answer(&request.id, ApprovalAnswer::Allow));
        query.end();
        let events = collect(&mut query).await;
        assert!(
            events.contains(&ProviderEvent::Result {
                text: "ran Bash".into(),
                covers: 0,
                usage: None
            }),
            "{events:?}"
        );
        // Interrupted while asked: the turn ends, the request unanswered.
        let mut query = start(&mock, "b");
        while !matches!(
            query.next_event().await,
            Some(ProviderEvent::ApprovalRequest(_)) | None
        ) {}
        query.interrupt();
        assert!(matches!(
            collect(&mut query).await.last(),
            Some(ProviderEvent::Interrupted {
                reason: InterruptReason::Stopped,
                ..
            })
        ));
        let mut query = start(&mock, "c");
        assert_eq!(collect(&mut query).await.last(), Some(&approval_stopped()));
    }

    #[tokio::test]
    async fn parallel_asks_wait_for_every_answer_in_any_order() {
        let mock = MockProvider::new();
        let script: Vec<MockStep> = serde_json::from_str(
            r#"[{"step": "ask", "tool": "Bash", "argument": "make", "notice": "retrying",
                 "parallel": [{"tool": "Write", "argument": "notes.md"}]}]"#,
        )
        .unwrap();
        mock.script(script);
        let mut query = start(&mock, "a");
        let mut requests = Vec::new();
        while requests.len() < 2 {
            match query.next_event().await {
                Some(ProviderEvent::ApprovalRequest(request)) => requests.push(request),
                Some(_) => {}
                None => panic!("fewer than two approval requests"),
            }
        }
        assert_ne!(requests[0].id, requests[1].id);
        assert!(matches!(
            query.next_event().await,
            Some(ProviderEvent::Error {
                ends_turn: false,
                ..
            })
        ));
        let approver = query.approver();
        let deny = ApprovalAnswer::Deny {
            reason: "no".into(),
        };
        assert!(approver.answer(&requests[1].id, deny.clone()));
        // A second answer to the same request is no answer to the other one.
        assert!(approver.answer(&requests[1].id, ApprovalAnswer::Allow));
        assert!(approver.answer(&requests[0].id, ApprovalAnswer::Allow));
        query.end();
        let events = collect(&mut query).await;
        assert_eq!(
            result_texts(&events),
            ["ran Bash; refused Write: no"],
            "{events:?}"
        );
    }

    #[tokio::test]
    async fn an_approval_stop_until_a_push_leaves_the_push_unseen() {
        let mock = MockProvider::new();
        mock.script([MockStep::ApprovalStop {
            tool: "mcp__nanoclaw__send_message".into(),
            until_push: true,
        }]);
        let mut query = start(&mock, "a");
        while !matches!(
            query.next_event().await,
            Some(ProviderEvent::Activity { tool: Some(_), .. }) | None
        ) {}
        assert_eq!(query.push(Prompt::text("b")).unwrap(), 1);
        assert_eq!(collect(&mut query).await.last(), Some(&approval_stopped()));
        assert_eq!(mock.prompts().len(), 1, "the push was not seen");
    }

    #[test]
    fn the_usage_of_a_script_reads_camel_case_json() {
        let usage: Usage =
            serde_json::from_str(r#"{"inputTokens": 7, "costUsd": 0.5, "model": "m"}"#).unwrap();
        assert_eq!(usage.input_tokens, Some(7));
        assert_eq!(usage.cost_usd, Some(0.5));
        assert_eq!(usage.output_tokens, None);
    }

    #[tokio::test]
    async fn keeps_only_the_latest_prompts_and_inputs() {
        let mock = MockProvider::new();
        let total = MOCK_KEPT + 10;
        for i in 0..total {
            let mut query = start(&mock, format!("p{i}"));
            query.end();
            collect(&mut query).await;
        }
        let prompts = mock.prompts();
        assert_eq!(prompts.len(), MOCK_KEPT);
        assert_eq!(prompts[0].text, format!("p{}", total - MOCK_KEPT));
        assert_eq!(prompts[MOCK_KEPT - 1].text, format!("p{}", total - 1));
        let inputs = mock.inputs();
        assert_eq!(inputs.len(), MOCK_KEPT);
        assert_eq!(inputs[MOCK_KEPT - 1].prompt.text, format!("p{}", total - 1));
    }
}
