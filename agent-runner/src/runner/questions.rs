//! The approval questions of a turn (issue 16): what is asked about a request, what an answer,
//! a timeout or a stop decides, and the `tool_decision` rows; no DB and no turn here (the
//! handlers are `runner/approval.rs`).

use std::collections::VecDeque;
use std::time::Duration;

use chrono::{DateTime, Utc};
use provider::{ApprovalAnswer, ApprovalKind};
use schema::content::out;
use schema::{NewMessageOut, OutKind, QuestionAnswer, WaitingOn};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::types::Target;

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
    pub(super) fn as_str(self) -> &'static str {
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
pub(super) enum Outcome {
    Answered(QuestionAnswer),
    TimedOut,
    Stopped,
}

/// A request the CLI waits on, asked in the chat.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) request_id: String,
    pub(super) question_id: String,
    pub(super) kind: ApprovalKind,
    /// When it was asked: `waiting_on.since` while it is the oldest waiting.
    pub(super) asked_at: DateTime<Utc>,
    pub(super) deadline: Instant,
    pub(super) target: Target,
}

/// The approvals of the running query.
#[derive(Debug)]
pub(super) struct Approvals {
    pub(super) pending: VecDeque<Pending>,
    /// Whether this runner switched `busy` → `waiting_user` (and switches it back).
    pub(super) swapped: bool,
    pub(super) ask_timeout: Duration,
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
    pub(super) fn waiting_on(&self) -> Option<WaitingOn> {
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
pub(super) fn question(request: &ApprovalKind, timeout: Duration) -> (String, String, Vec<Value>) {
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
pub(super) fn decide(
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
pub(super) fn decision_row(
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
