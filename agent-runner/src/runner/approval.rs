//! Approvals through the chat (issue 16; docs/contract/db.md#approvals): a tool call the policy
//! marks `ask`, or an MCP elicitation with `elicitation: ask`, becomes a question row through
//! the same path as mcp-tools' `ask_user_question` (`SessionDb::post_question`, so
//! `nanoclaw answer` works unchanged), the status is `waiting_user` while any waits, and the
//! answer, the timeout (`askTimeoutSeconds`) or a stop decides. Each decision on a tool call is
//! a `tool_decision` system row, as is each call the policy refused without asking
//! (`ToolDenied`).
//!
//! The turn loop keeps reading events and DB changes meanwhile: the requests wait here, the
//! loop's DB wake-up looks for their answers and a timer arm ends them at their deadline.

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::Result;
use chrono::{DateTime, Utc};
use provider::{ApprovalAnswer, ApprovalKind, ApprovalRequest, Approver};
use schema::content::out;
use schema::{NewMessageOut, OutKind, QuestionAnswer, RunnerStatus, WaitingOn};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::{InFlight, Runner, Target, TurnProgress};

/// The longest argument an approval question shows whole; beyond, its start with a visible
/// mark (a 1 MB heredoc would otherwise be one chat message).
const MAX_ARGUMENT_CHARS: usize = 2000;
/// The option that lets a tool call run.
const APPROVE: &str = "Approve";
/// The option that refuses it.
const DENY: &str = "Deny";
/// What the model is told when the user chose Deny.
const DENIED_BY_USER: &str = "denied by the user";

/// Who decided a tool call: the `by` of a `tool_decision` row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum By {
    /// The user's answer.
    User,
    /// No answer within `askTimeoutSeconds`.
    Timeout,
    /// The policy, without asking.
    Policy,
    /// The turn was stopped (or ended) while the question was open.
    Stop,
}

impl By {
    fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Timeout => "timeout",
            Self::Policy => "policy",
            Self::Stop => "stop",
        }
    }
}

/// How a wait ended.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Answered(QuestionAnswer),
    TimedOut,
    Stopped,
}

/// A request the CLI waits on, asked in the chat.
#[derive(Debug)]
struct Pending {
    request_id: String,
    question_id: String,
    kind: ApprovalKind,
    /// When it was asked: `waiting_on.since` while it is the oldest waiting.
    asked_at: DateTime<Utc>,
    deadline: Instant,
    target: Target,
}

/// The approvals of the running query.
#[derive(Debug)]
pub(super) struct Approvals {
    pending: VecDeque<Pending>,
    /// Whether this runner switched `busy` → `waiting_user` (and switches it back).
    swapped: bool,
    ask_timeout: Duration,
}

impl Approvals {
    /// No request waiting; each one asked waits at most `ask_timeout`.
    pub(super) fn new(ask_timeout: Duration) -> Self {
        Self {
            pending: VecDeque::new(),
            swapped: false,
            ask_timeout,
        }
    }

    /// Whether a request waits for the user.
    pub(super) fn waiting(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The earliest deadline of a waiting request.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.pending.iter().map(|p| p.deadline).min()
    }

    /// What `runner_state.waiting_on` says while requests wait: the oldest one.
    fn waiting_on(&self) -> Option<WaitingOn> {
        let first = self.pending.front()?;
        let (subject, endpoint) = match &first.kind {
            ApprovalKind::ToolCall { tool, .. } => {
                (tool.clone(), format!("the user's approval of {tool}"))
            }
            ApprovalKind::Elicitation { server, .. } => (
                format!("{server} asks"),
                format!("the user's answer to {server}"),
            ),
        };
        Some(WaitingOn {
            endpoint,
            since: schema::time::format_ts(first.asked_at),
            notices: 0,
            last_notice: None,
            budget: None,
            approval: Some(subject),
            question_id: Some(first.question_id.clone()),
        })
    }
}

/// The question row's title, text and options for `request`, `timeout` its deadline in words.
fn question(request: &ApprovalKind, timeout: Duration) -> (String, String, Vec<Value>) {
    let secs = timeout.as_secs();
    match request {
        ApprovalKind::ToolCall {
            tool,
            summary,
            argument,
            undecidable,
        } => {
            let shown = argument.as_deref().or(summary.as_deref());
            // Asked because the policy could not tell what the command runs (issue 41): the
            // user decides knowing that no rule could judge it.
            let why = match undecidable {
                Some(reason) => format!(
                    "The runner could not tell what this command runs: {}. A rule asks about \
                     such commands; approve only if you can tell what it does.\n\n",
                    user_reason(reason)
                ),
                None => String::new(),
            };
            let text = match shown.map(str::trim).filter(|a| !a.is_empty()) {
                Some(argument) => format!(
                    "The agent wants to use {tool}:\n\n{}\n\n{why}Approve or Deny (no answer \
                     within {secs} s: denied).",
                    capped(argument)
                ),
                None => format!(
                    "The agent wants to use {tool} (its arguments are unknown).\n\n{why}Approve \
                     or Deny (no answer within {secs} s: denied)."
                ),
            };
            let options = [APPROVE, DENY]
                .iter()
                .map(|o| out::question_option(o, o, o))
                .collect();
            (format!("Approve {tool}?"), text, options)
        }
        // Free text is a question without options: `nanoclaw answer` then takes any text.
        ApprovalKind::Elicitation {
            server,
            message,
            options,
        } => (
            format!("{server} asks"),
            format!(
                "{}\n\n(no answer within {secs} s: declined)",
                capped(message.trim())
            ),
            options
                .iter()
                .map(|o| out::question_option(o, o, o))
                .collect(),
        ),
    }
}

/// The policy's reason for an undecidable command (crate `provider`, worded for the model:
/// "the command could not be decided: <why>: write the command literally") as the user reads
/// it: the why alone.
fn user_reason(reason: &str) -> &str {
    let why = reason
        .strip_prefix("the command could not be decided: ")
        .unwrap_or(reason);
    why.strip_suffix(": write the command literally")
        .unwrap_or(why)
}

/// `text` whole, or its first [`MAX_ARGUMENT_CHARS`] characters and a mark saying how much was
/// left out.
fn capped(text: &str) -> String {
    let total = text.chars().count();
    if total <= MAX_ARGUMENT_CHARS {
        return text.to_owned();
    }
    let head: String = text.chars().take(MAX_ARGUMENT_CHARS).collect();
    format!(
        "{head}\n[… {} more characters not shown]",
        total - MAX_ARGUMENT_CHARS
    )
}

/// The answer for the CLI and, for a tool call, the decision (`allow`/`deny`, by whom).
fn decide(
    kind: &ApprovalKind,
    outcome: &Outcome,
    timeout: Duration,
) -> (ApprovalAnswer, Option<(bool, By)>) {
    let timed_out = || format!("no answer within {} s", timeout.as_secs());
    match (kind, outcome) {
        (ApprovalKind::ToolCall { .. }, Outcome::Answered(answer)) => {
            // Anything but Approve (an answer forced with `--force`) is the safe side.
            if answer_text(&answer.selected_option)
                .trim()
                .eq_ignore_ascii_case(APPROVE)
            {
                (ApprovalAnswer::Allow, Some((true, By::User)))
            } else {
                let reason = DENIED_BY_USER.to_owned();
                (ApprovalAnswer::Deny { reason }, Some((false, By::User)))
            }
        }
        (ApprovalKind::ToolCall { .. }, Outcome::TimedOut) => (
            ApprovalAnswer::Deny {
                reason: timed_out(),
            },
            Some((false, By::Timeout)),
        ),
        (ApprovalKind::ToolCall { .. }, Outcome::Stopped) => (
            ApprovalAnswer::Deny {
                reason: "the turn was stopped before the user answered".to_owned(),
            },
            Some((false, By::Stop)),
        ),
        (ApprovalKind::Elicitation { .. }, Outcome::Answered(answer)) => (
            ApprovalAnswer::Reply(answer_text(&answer.selected_option)),
            None,
        ),
        (ApprovalKind::Elicitation { .. }, Outcome::TimedOut) => (
            ApprovalAnswer::Deny {
                reason: timed_out(),
            },
            None,
        ),
        (ApprovalKind::Elicitation { .. }, Outcome::Stopped) => (
            ApprovalAnswer::Deny {
                reason: "the turn was stopped before the user answered".to_owned(),
            },
            None,
        ),
    }
}

/// An answer's value as text (strings without quotes).
fn answer_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// A `tool_decision` row routed like the batch's replies; `undecidable`: why the call's command
/// could not be decided, when the policy refused or asked about it for that (the payload's
/// `undecidable`).
fn decision_row(
    tool: &str,
    summary: Option<&str>,
    allowed: bool,
    by: By,
    undecidable: Option<&str>,
    target: &Target,
) -> NewMessageOut {
    let mut payload = json!({
        "tool": tool,
        "summary": summary,
        "decision": if allowed { "allow" } else { "deny" },
        "by": by.as_str(),
    });
    if let Some(reason) = undecidable {
        payload["undecidable"] = json!(reason);
    }
    let content = out::system_action("tool_decision", payload);
    NewMessageOut::new(OutKind::System, target.routing.clone(), &content)
        .replying_to(target.in_reply_to.clone())
}

/// Where the rows of the running query go: like the batch's replies (the newest prompt's).
fn target_of(in_flight: &VecDeque<InFlight>) -> Target {
    in_flight
        .back()
        .map(|f| f.prepared.target.clone())
        .unwrap_or_default()
}

impl TurnProgress {
    /// The CLI waits for the user (`true`) or goes on (`false`: the model's silence starts now).
    fn set_asking(&mut self, asking: bool, now: Instant, wall: DateTime<Utc>) {
        if self.asking && !asking {
            self.output(now, wall);
        }
        if asking {
            // `waiting_on` names the approval now: model output must not clear it.
            self.shown = false;
        }
        self.asking = asking;
    }
}

impl Runner {
    /// Asks the user about `request` in the chat; the CLI waits until [`Runner::settle`].
    pub(super) async fn ask_approval(
        &mut self,
        request: ApprovalRequest,
        in_flight: &VecDeque<InFlight>,
        progress: &mut TurnProgress,
    ) -> Result<()> {
        let timeout = self.approvals.ask_timeout;
        let (title, text, options) = question(&request.kind, timeout);
        let question_id = uuid::Uuid::new_v4().to_string();
        let target = target_of(in_flight);
        let content = out::ask_question(&question_id, &title, &text, &options);
        let row = NewMessageOut::new(OutKind::ChatSdk, target.routing.clone(), &content)
            .replying_to(target.in_reply_to.clone());
        let now = (self.options.clock)();
        let deadline = now + chrono::Duration::from_std(timeout).unwrap_or_default();
        match &request.kind {
            ApprovalKind::ToolCall { tool, .. } => {
                tracing::info!(%tool, question = %question_id, "asking the user to approve a tool call")
            }
            ApprovalKind::Elicitation { server, .. } => {
                tracing::info!(%server, question = %question_id, "asking the user for an MCP elicitation")
            }
        }
        let first = !self.approvals.waiting();
        self.approvals.pending.push_back(Pending {
            request_id: request.id,
            question_id: question_id.clone(),
            kind: request.kind,
            asked_at: now,
            deadline: Instant::now() + timeout,
            target,
        });
        // Once the batch is finished (idle), the CLI winding down shows nothing. Written
        // before the question, so whoever sees the question sees `waiting_on` name it.
        let waiting = (!self.batch_finished)
            .then(|| self.approvals.waiting_on())
            .flatten();
        let posted = self
            .call(move |db| {
                if let Some(waiting) = &waiting {
                    db.set_waiting_on(Some(waiting))?;
                }
                db.post_question(&question_id, deadline, &row, first)
            })
            .await;
        let (_, switched) = match posted {
            Ok(posted) => posted,
            Err(err) => {
                // Not asked: nothing for an answer or a deadline to settle.
                self.approvals.pending.pop_back();
                return Err(err);
            }
        };
        progress.set_asking(true, Instant::now(), now);
        if first {
            self.approvals.swapped = switched;
        }
        Ok(())
    }

    /// Records a call the policy refused without asking (`tool_decision`, `by: "policy"`), with
    /// why its command could not be decided when that is why it was refused.
    pub(super) async fn record_denied(
        &self,
        tool: &str,
        summary: Option<&str>,
        undecidable: Option<&str>,
        in_flight: &VecDeque<InFlight>,
    ) -> Result<()> {
        tracing::info!(%tool, ?undecidable, "tool call denied by the policy");
        let row = decision_row(
            tool,
            summary,
            false,
            By::Policy,
            undecidable,
            &target_of(in_flight),
        );
        self.call_inline(move |db| db.insert_out(&row)).await?;
        Ok(())
    }

    /// Takes the answers that arrived (on a DB change) and settles their requests.
    pub(super) async fn poll_approvals(
        &mut self,
        approver: &Approver,
        progress: &mut TurnProgress,
    ) -> Result<()> {
        if !self.approvals.waiting() {
            return Ok(());
        }
        let ids: Vec<String> = self
            .approvals
            .pending
            .iter()
            .map(|p| p.question_id.clone())
            .collect();
        let answers = self
            .call(move |db| {
                let mut answers = Vec::new();
                for id in &ids {
                    if let Some((_, answer)) = db.take_answer(id)? {
                        answers.push((id.clone(), answer));
                    }
                }
                Ok(answers)
            })
            .await?;
        let mut settled = Vec::new();
        for (id, answer) in answers {
            if let Some(at) = self
                .approvals
                .pending
                .iter()
                .position(|p| p.question_id == id)
            {
                if let Some(pending) = self.approvals.pending.remove(at) {
                    settled.push((pending, Outcome::Answered(answer)));
                }
            }
        }
        self.settle(settled, Some(approver), Some(progress)).await
    }

    /// Denies the requests whose deadline passed.
    pub(super) async fn expire_approvals(
        &mut self,
        approver: &Approver,
        progress: &mut TurnProgress,
    ) -> Result<()> {
        let now = Instant::now();
        let (due, waiting): (VecDeque<_>, VecDeque<_>) =
            std::mem::take(&mut self.approvals.pending)
                .into_iter()
                .partition(|p| p.deadline <= now);
        self.approvals.pending = waiting;
        let settled = due.into_iter().map(|p| (p, Outcome::TimedOut)).collect();
        self.settle(settled, Some(approver), Some(progress)).await
    }

    /// Denies every waiting request (`by: "stop"`): the turn was stopped, or the query ended
    /// without them (`approver` `None`: the driver denied them already).
    pub(super) async fn withdraw_approvals(
        &mut self,
        approver: Option<&Approver>,
        progress: Option<&mut TurnProgress>,
    ) -> Result<()> {
        let settled = std::mem::take(&mut self.approvals.pending)
            .into_iter()
            .map(|p| (p, Outcome::Stopped))
            .collect();
        self.settle(settled, approver, progress).await
    }

    /// Closes the questions of `settled`, writes their decision rows, answers the CLI, and
    /// once none waits, puts the status and `waiting_on` back.
    async fn settle(
        &mut self,
        settled: Vec<(Pending, Outcome)>,
        approver: Option<&Approver>,
        progress: Option<&mut TurnProgress>,
    ) -> Result<()> {
        if settled.is_empty() {
            return Ok(());
        }
        let timeout = self.approvals.ask_timeout;
        let mut questions = Vec::new();
        let mut rows = Vec::new();
        for (pending, outcome) in &settled {
            let (answer, decision) = decide(&pending.kind, outcome, timeout);
            questions.push(pending.question_id.clone());
            if let (
                ApprovalKind::ToolCall {
                    tool,
                    summary,
                    undecidable,
                    ..
                },
                Some((allowed, by)),
            ) = (&pending.kind, decision)
            {
                tracing::info!(
                    %tool,
                    decision = if allowed { "allow" } else { "deny" },
                    by = by.as_str(),
                    question = %pending.question_id,
                    ?undecidable,
                    "tool call decided"
                );
                rows.push(decision_row(
                    tool,
                    summary.as_deref(),
                    allowed,
                    by,
                    undecidable.as_deref(),
                    &pending.target,
                ));
            }
            if let Some(approver) = approver {
                if !approver.answer(&pending.request_id, answer) {
                    tracing::debug!(request = %pending.request_id, "the query ended before the answer");
                }
            }
        }
        let restore = !self.approvals.waiting() && std::mem::take(&mut self.approvals.swapped);
        let now = (self.options.clock)();
        let waiting = self.approvals.waiting_on();
        let batch_open = !self.batch_finished;
        self.call(move |db| {
            for id in &questions {
                db.close_question(id)?;
            }
            for row in &rows {
                db.insert_out(row)?;
            }
            if restore {
                db.swap_runner_status(RunnerStatus::WaitingUser, RunnerStatus::Busy)?;
            }
            if batch_open {
                db.set_waiting_on(waiting.as_ref())?;
            }
            Ok(())
        })
        .await?;
        if let Some(progress) = progress {
            progress.set_asking(self.approvals.waiting(), Instant::now(), now);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn bash(argument: &str) -> ApprovalKind {
        ApprovalKind::ToolCall {
            tool: "Bash".into(),
            summary: Some(argument.lines().next().unwrap_or_default().into()),
            argument: Some(argument.into()),
            undecidable: None,
        }
    }

    fn shown(kind: &ApprovalKind) -> String {
        let (title, text, options) = question(kind, Duration::from_secs(300));
        format!("{title}\n{text}\n{}", Value::from(options))
    }

    #[test]
    fn a_tool_call_question_names_the_tool_and_the_whole_argument() {
        expect![[r#"
            Approve Bash?
            The agent wants to use Bash:

            cd target && rm -rf build
            echo done

            Approve or Deny (no answer within 300 s: denied).
            [{"label":"Approve","selectedLabel":"Approve","value":"Approve"},{"label":"Deny","selectedLabel":"Deny","value":"Deny"}]"#]]
        .assert_eq(&shown(&bash("cd target && rm -rf build\necho done")));
        let unknown = ApprovalKind::ToolCall {
            tool: "mcp__github__create_issue".into(),
            summary: None,
            argument: None,
            undecidable: None,
        };
        expect![[r#"
            Approve mcp__github__create_issue?
            The agent wants to use mcp__github__create_issue (its arguments are unknown).

            Approve or Deny (no answer within 300 s: denied).
            [{"label":"Approve","selectedLabel":"Approve","value":"Approve"},{"label":"Deny","selectedLabel":"Deny","value":"Deny"}]"#]]
        .assert_eq(&shown(&unknown));
    }

    /// Issue 41: a command asked about because it could not be decided says so.
    #[test]
    fn an_undecidable_command_question_says_the_runner_could_not_tell() {
        let kind = ApprovalKind::ToolCall {
            tool: "Bash".into(),
            summary: Some("X=rm; $X -rf target".into()),
            argument: Some("X=rm; $X -rf target".into()),
            undecidable: Some(
                "the command could not be decided: the program name is not a literal ($X): \
                 write the command literally"
                    .into(),
            ),
        };
        expect![[r#"
            Approve Bash?
            The agent wants to use Bash:

            X=rm; $X -rf target

            The runner could not tell what this command runs: the program name is not a literal ($X). A rule asks about such commands; approve only if you can tell what it does.

            Approve or Deny (no answer within 300 s: denied).
            [{"label":"Approve","selectedLabel":"Approve","value":"Approve"},{"label":"Deny","selectedLabel":"Deny","value":"Deny"}]"#]]
        .assert_eq(&shown(&kind));
    }

    #[test]
    fn an_absurdly_long_argument_is_cut_with_a_visible_mark() {
        let long = format!("echo {}", "é".repeat(5000));
        let (_, text, _) = question(&bash(&long), Duration::from_secs(1));
        assert!(
            text.contains("[… 3005 more characters not shown]"),
            "{text}"
        );
        assert!(text.chars().count() < MAX_ARGUMENT_CHARS + 200);
    }

    #[test]
    fn an_elicitation_offers_its_options_or_free_text() {
        let choice = ApprovalKind::Elicitation {
            server: "deploy".into(),
            message: "Which environment?".into(),
            options: vec!["staging".into(), "production".into()],
        };
        expect![[r#"
            deploy asks
            Which environment?

            (no answer within 300 s: declined)
            [{"label":"staging","selectedLabel":"staging","value":"staging"},{"label":"production","selectedLabel":"production","value":"production"}]"#]]
        .assert_eq(&shown(&choice));
        let free = ApprovalKind::Elicitation {
            server: "deploy".into(),
            message: "Release notes?".into(),
            options: Vec::new(),
        };
        assert!(shown(&free).ends_with("\n[]"));
    }

    #[test]
    fn answers_timeouts_and_stops_decide() {
        let answered = |value: &str| {
            Outcome::Answered(QuestionAnswer {
                question_id: "q".into(),
                selected_option: Value::from(value),
                user_id: None,
            })
        };
        let timeout = Duration::from_secs(7);
        let call = bash("rm -rf target");
        let cases = [
            answered("Approve"),
            answered("approve"),
            answered("Deny"),
            answered("yes"),
            Outcome::TimedOut,
            Outcome::Stopped,
        ]
        .iter()
        .map(|o| format!("{:?}", decide(&call, o, timeout)))
        .collect::<Vec<_>>()
        .join("\n");
        expect![[r#"
            (Allow, Some((true, User)))
            (Allow, Some((true, User)))
            (Deny { reason: "denied by the user" }, Some((false, User)))
            (Deny { reason: "denied by the user" }, Some((false, User)))
            (Deny { reason: "no answer within 7 s" }, Some((false, Timeout)))
            (Deny { reason: "the turn was stopped before the user answered" }, Some((false, Stop)))"#]]
        .assert_eq(&cases);
        let elicitation = ApprovalKind::Elicitation {
            server: "s".into(),
            message: "m".into(),
            options: Vec::new(),
        };
        assert_eq!(
            decide(&elicitation, &answered("v1.2"), timeout),
            (ApprovalAnswer::Reply("v1.2".into()), None)
        );
    }

    #[test]
    fn a_decision_row_is_a_system_action_routed_like_the_replies() {
        let target = Target {
            routing: schema::Routing {
                channel_type: Some("slack".into()),
                platform_id: Some("C1".into()),
                thread_id: None,
            },
            in_reply_to: Some("m1".into()),
            sender_id: None,
        };
        let row = decision_row(
            "Bash",
            Some("rm -rf target"),
            false,
            By::Policy,
            None,
            &target,
        );
        expect![[r#"{"action":"tool_decision","payload":{"by":"policy","decision":"deny","summary":"rm -rf target","tool":"Bash"}}"#]]
            .assert_eq(&row.content);
        let row = decision_row(
            "Bash",
            Some("X=rm; $X -rf target"),
            false,
            By::Policy,
            Some("the program name is not a literal"),
            &target,
        );
        expect![[r#"{"action":"tool_decision","payload":{"by":"policy","decision":"deny","summary":"X=rm; $X -rf target","tool":"Bash","undecidable":"the program name is not a literal"}}"#]]
            .assert_eq(&row.content);
        assert_eq!(row.kind, OutKind::System);
        assert_eq!(row.in_reply_to.as_deref(), Some("m1"));
        assert_eq!(row.routing, target.routing);
    }
}
