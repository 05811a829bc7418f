//! The tool policy, approval stops and MCP elicitations over Claude's control protocol
//! (docs/contract/providers.md#claude-code, measured with Claude Code 2.1.330).
//!
//! The process keeps `--permission-mode bypassPermissions`; when the settings need it, the
//! driver registers hook callbacks in the `initialize` control request:
//! * `PreToolUse` (the policy restricts something): the CLI asks before EVERY tool call, the
//!   read-only ones and those of subagents included, with the tool's name and input. The driver
//!   answers from [`provider::ToolPolicy::judge`]: nothing to say (the call runs), a `deny` with a
//!   reason (the model gets it as the tool's error result; for a command that could not be
//!   decided, why, see [`provider::driver::refusal`]), or, for `ask`, later, once the
//!   runner answered. The CLI waits for the answer up to the hook's `timeout`, set above
//!   `askTimeoutSeconds`; an answer that never comes, or an error, refuses the call
//!   (`onFailure: block`).
//! * `PostToolUse` (approval-stop tools configured): after a stop tool's result the answer is
//!   `continue: false`; the CLI then ends the turn without another model request (its result
//!   says `terminal_reason: hook_stopped`).
//!
//! The CLI also asks the host about MCP elicitations (`control_request` `elicitation`, an error
//! answer counts as `cancel`): they are declined, or with `elicitation: ask` and a one-field
//! schema asked in the chat.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::translate::tool_argument;
use provider::driver::activity::one_line_summary;
use provider::driver::refusal;
use provider::policy::Call;
use provider::{
    ApprovalAnswer, ApprovalKind, ApprovalRequest, Decision, ElicitationMode, ProviderEvent,
    ProviderSettings,
};

/// The callback id of the policy's `PreToolUse` hook.
const POLICY_HOOK: &str = "nanoclaw-policy";
/// The callback id of the approval stops' `PostToolUse` hook.
const STOP_HOOK: &str = "nanoclaw-approval-stop";
/// How much longer than `askTimeoutSeconds` the CLI waits for a `PreToolUse` answer: the runner
/// denies at the ask timeout, the CLI's own refusal is only the fallback.
const HOOK_TIMEOUT_MARGIN_SECS: u64 = 60;

/// The `hooks` of the `initialize` control request; `None` when nothing needs them (the CLI
/// then runs exactly as without a policy: no round trips).
pub(crate) fn initialize_hooks(settings: &ProviderSettings) -> Option<Value> {
    let mut hooks = Map::new();
    if !settings.tool_policy.allows_everything() {
        let timeout = settings.tool_policy.ask_timeout.as_secs() + HOOK_TIMEOUT_MARGIN_SECS;
        hooks.insert(
            "PreToolUse".into(),
            json!([{"hookCallbackIds": [POLICY_HOOK], "timeout": timeout, "onFailure": "block"}]),
        );
    }
    if !settings.approval_stop_tools.is_empty() {
        // No matcher: Claude reads one as a regex over tool names; the driver compares the
        // names itself.
        hooks.insert(
            "PostToolUse".into(),
            json!([{"hookCallbackIds": [STOP_HOOK]}]),
        );
    }
    (!hooks.is_empty()).then_some(Value::Object(hooks))
}

/// What the driver does with a control request of the CLI.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Answer now with this `response`, after passing `events` on to the runner.
    Answer {
        /// The control response's body.
        response: Value,
        /// Events for the runner (`ToolDenied`).
        events: Vec<ProviderEvent>,
    },
    /// Answer now; then the turn ends after this tool's result (an approval stop).
    Stop {
        /// The control response's body.
        response: Value,
    },
    /// Ask the runner ([`ProviderEvent::ApprovalRequest`]), answer when it answers.
    Ask(Pending),
    /// Refuse the request (a control error): nothing here handles it.
    Refuse(String),
}

/// A request waiting for the runner's answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pending {
    /// The event for the runner (its id is the CLI's request id).
    pub request: ApprovalRequest,
    /// The field of the elicitation's one-field form, for the reply.
    field: Option<String>,
}

impl Pending {
    /// The control response's body for `answer`.
    pub(crate) fn response(&self, answer: &ApprovalAnswer) -> Value {
        match (&self.request.kind, answer) {
            // A command asked about because it could not be decided: the refusal says why, so
            // that the model writes it literally (issue 41).
            (ApprovalKind::ToolCall { undecidable, .. }, ApprovalAnswer::Deny { reason }) => {
                deny(&refusal::not_approved(reason, undecidable.as_deref()))
            }
            // `Reply` to a tool call is no approval: refused, on the safe side.
            (ApprovalKind::ToolCall { undecidable, .. }, ApprovalAnswer::Reply(text)) => deny(
                &refusal::not_approved(&format!("not approved ({text})"), undecidable.as_deref()),
            ),
            (ApprovalKind::ToolCall { .. }, ApprovalAnswer::Allow) => json!({}),
            (ApprovalKind::Elicitation { .. }, ApprovalAnswer::Reply(text)) => match &self.field {
                Some(field) => json!({"action": "accept", "content": {field: text}}),
                None => json!({"action": "decline"}),
            },
            // Only a reply answers a question: anything else declines it (as Codex does).
            (ApprovalKind::Elicitation { .. }, _) => json!({"action": "decline"}),
        }
    }

    /// The answer when the query ends before the runner's: the call is refused.
    pub(crate) fn unanswered(&self) -> Value {
        self.response(&ApprovalAnswer::Deny {
            reason: "the turn ended before the user answered".into(),
        })
    }
}

/// Decides what to do with control request `request_id` (its `request` body).
pub(crate) fn on_request(settings: &ProviderSettings, request_id: &str, request: &Value) -> Action {
    let subtype = request
        .get("subtype")
        .and_then(Value::as_str)
        .unwrap_or("?");
    match subtype {
        "hook_callback" => on_hook(settings, request_id, request),
        "elicitation" => on_elicitation(settings.elicitation, request_id, request),
        other => Action::Refuse(format!("this host answers no {other} requests")),
    }
}

fn on_hook(settings: &ProviderSettings, request_id: &str, request: &Value) -> Action {
    let input = request.get("input").unwrap_or(&Value::Null);
    let tool = input
        .get("tool_name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let tool_input = input.get("tool_input").unwrap_or(&Value::Null);
    match request.get("callback_id").and_then(Value::as_str) {
        Some(POLICY_HOOK) => {
            let argument = tool_argument(tool, tool_input);
            let call = Call {
                tool: tool.to_owned(),
                summary: argument.as_deref().and_then(one_line_summary),
                argument,
            };
            let verdict = call.judge(&settings.tool_policy);
            let undecidable = verdict.undecidable.as_deref();
            match verdict.decision {
                Decision::Allow => Action::Answer {
                    response: json!({}),
                    events: Vec::new(),
                },
                Decision::Deny => Action::Answer {
                    response: deny(&refusal::message(tool, undecidable)),
                    events: vec![refusal::event(call, undecidable)],
                },
                Decision::Ask => Action::Ask(Pending {
                    request: ApprovalRequest {
                        id: request_id.to_owned(),
                        kind: call.ask(verdict.undecidable),
                    },
                    field: None,
                }),
            }
        }
        Some(STOP_HOOK) if settings.approval_stop_tools.iter().any(|t| t == tool) => Action::Stop {
            response: json!({
                "continue": false,
                "stopReason": format!("{tool} is an approval stop: the turn ends with its result"),
            }),
        },
        Some(STOP_HOOK) => Action::Answer {
            response: json!({}),
            events: Vec::new(),
        },
        _ => Action::Refuse("unknown hook callback".into()),
    }
}

fn on_elicitation(mode: ElicitationMode, request_id: &str, request: &Value) -> Action {
    let decline = Action::Answer {
        response: json!({"action": "decline"}),
        events: Vec::new(),
    };
    if mode == ElicitationMode::Decline {
        return decline;
    }
    let form = request
        .get("mode")
        .and_then(Value::as_str)
        .unwrap_or("form");
    let Some((field, options)) = (form == "form")
        .then(|| {
            provider::driver::elicitation::single_string_field(request.get("requested_schema"))
        })
        .flatten()
    else {
        return decline;
    };
    let text = |key| request.get(key).and_then(Value::as_str).unwrap_or_default();
    Action::Ask(Pending {
        request: ApprovalRequest {
            id: request_id.to_owned(),
            kind: ApprovalKind::Elicitation {
                server: text("mcp_server_name").to_owned(),
                message: text("message").to_owned(),
                options,
            },
        },
        field: Some(field),
    })
}

/// A `PreToolUse` answer that refuses the call; the model gets `reason` as the tool's error.
fn deny(reason: &str) -> Value {
    json!({"hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "permissionDecision": "deny",
        "permissionDecisionReason": reason,
    }})
}

/// The requests waiting for the runner, by the CLI's request id.
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    pending: BTreeMap<String, Pending>,
}

impl Waiting {
    /// Records `pending` until its answer.
    pub(crate) fn insert(&mut self, pending: Pending) {
        self.pending.insert(pending.request.id.clone(), pending);
    }

    /// Takes request `id` out; `None` when it is not waiting (answered or denied already).
    pub(crate) fn take(&mut self, id: &str) -> Option<Pending> {
        self.pending.remove(id)
    }

    /// True while a request waits: the CLI is silent by design meanwhile.
    pub(crate) fn any(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Takes every waiting request out (the query ends: each is refused).
    pub(crate) fn drain(&mut self) -> Vec<Pending> {
        std::mem::take(&mut self.pending).into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use provider::{ToolPolicy, ToolRule};

    fn settings(deny: &[&str], ask: &[&str]) -> ProviderSettings {
        let mut settings = ProviderSettings::for_workspace("/w", "claude");
        let rules = |list: &[&str]| list.iter().map(|r| ToolRule::parse(r).unwrap()).collect();
        settings.tool_policy = ToolPolicy {
            deny: rules(deny),
            ask: rules(ask),
            ..ToolPolicy::default()
        };
        settings
    }

    /// A `hook_callback` as Claude 2.1.330 sends it (captured, trimmed).
    fn hook(callback: &str, event: &str, tool: &str, input: Value) -> Value {
        json!({"subtype": "hook_callback", "callback_id": callback, "input": {
            "session_id": "s", "cwd": "/w/agent", "permission_mode": "bypassPermissions",
            "hook_event_name": event, "tool_name": tool, "tool_input": input,
            "tool_use_id": "toolu_1"}, "tool_use_id": "toolu_1"})
    }

    fn bash(command: &str) -> Value {
        json!({"command": command, "description": "x"})
    }

    #[test]
    fn hooks_are_registered_only_when_needed() {
        let mut settings = ProviderSettings::for_workspace("/w", "claude");
        assert_eq!(initialize_hooks(&settings), None);
        settings.tool_policy.ask = vec![ToolRule::parse("Bash").unwrap()];
        settings.approval_stop_tools = vec!["mcp__nanoclaw__send_message".into()];
        expect![[r#"{"PostToolUse":[{"hookCallbackIds":["nanoclaw-approval-stop"]}],"PreToolUse":[{"hookCallbackIds":["nanoclaw-policy"],"onFailure":"block","timeout":360}]}"#]]
            .assert_eq(&initialize_hooks(&settings).unwrap().to_string());
    }

    #[test]
    fn the_policy_answers_each_tool_call() {
        let settings = settings(&["Bash(rm *)"], &["Bash(git push*)", "Read"]);
        let decide = |tool: &str, input: Value| {
            format!(
                "{:?}",
                on_request(
                    &settings,
                    "req-1",
                    &hook(POLICY_HOOK, "PreToolUse", tool, input)
                )
            )
        };
        expect![[r#"Answer { response: Object {}, events: [] }"#]]
            .assert_eq(&decide("Bash", bash("ls -la")));
        expect![[r#"Answer { response: Object {"hookSpecificOutput": Object {"hookEventName": String("PreToolUse"), "permissionDecision": String("deny"), "permissionDecisionReason": String("denied by the tool policy: this Bash call may not run; do not retry it")}}, events: [ToolDenied { tool: "Bash", summary: Some("cd x && rm -rf target") }] }"#]]
            .assert_eq(&decide("Bash", bash("cd x && rm -rf target")));
        expect![[r#"Ask(Pending { request: ApprovalRequest { id: "req-1", kind: ToolCall { tool: "Bash", summary: Some("git push origin"), argument: Some("git push origin\n--force"), undecidable: None } }, field: None })"#]]
            .assert_eq(&decide("Bash", bash("git push origin\n--force")));
        // A program name that is not a literal: refused with the reason (issue 41).
        expect![[r#"Answer { response: Object {"hookSpecificOutput": Object {"hookEventName": String("PreToolUse"), "permissionDecision": String("deny"), "permissionDecisionReason": String("denied by the tool policy: the command could not be decided: the program name is not a literal ($X): write the command literally")}}, events: [ToolUndecidable { tool: "Bash", summary: Some("X=rm; $X -rf target"), reason: "the command could not be decided: the program name is not a literal ($X): write the command literally" }] }"#]].assert_eq(&decide("Bash", bash("X=rm; $X -rf target")));
        // Read-only tools are asked about too (the hook sees every call).
        expect![[r#"Ask(Pending { request: ApprovalRequest { id: "req-1", kind: ToolCall { tool: "Read", summary: Some("/etc/passwd"), argument: Some("/etc/passwd"), undecidable: None } }, field: None })"#]]
            .assert_eq(&decide("Read", json!({"file_path": "/etc/passwd"})));
    }

    #[test]
    fn mcp_calls_are_matched_on_their_json_arguments() {
        let settings = settings(&["mcp__github__*"], &["mcp__nanoclaw__send_message"]);
        let request = hook(
            POLICY_HOOK,
            "PreToolUse",
            "mcp__nanoclaw__send_message",
            json!({"text": "hi"}),
        );
        expect![[r#"Ask(Pending { request: ApprovalRequest { id: "r", kind: ToolCall { tool: "mcp__nanoclaw__send_message", summary: Some("{\"text\":\"hi\"}"), argument: Some("{\"text\":\"hi\"}"), undecidable: None } }, field: None })"#]]
            .assert_eq(&format!("{:?}", on_request(&settings, "r", &request)));
        let request = hook(POLICY_HOOK, "PreToolUse", "mcp__github__x", json!({}));
        assert!(matches!(
            on_request(&settings, "r", &request),
            Action::Answer { events, .. } if events.len() == 1
        ));
    }

    #[test]
    fn answers_written_back() {
        let settings = settings(&[], &["Bash"]);
        let Action::Ask(pending) = on_request(
            &settings,
            "r",
            &hook(POLICY_HOOK, "PreToolUse", "Bash", bash("ls")),
        ) else {
            panic!("not asked");
        };
        let show = |answer| pending.response(&answer).to_string();
        expect!["{}"].assert_eq(&show(ApprovalAnswer::Allow));
        expect![[r#"{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny","permissionDecisionReason":"denied by the user"}}"#]]
            .assert_eq(&show(ApprovalAnswer::Deny {
                reason: "denied by the user".into(),
            }));
        expect![[r#"{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny","permissionDecisionReason":"the turn ended before the user answered"}}"#]]
            .assert_eq(&pending.unanswered().to_string());
    }

    /// Issue 41: under an `ask` rule only, a command that cannot be decided is asked, the
    /// question carries why, and a refusal (the user's, the timeout's, the turn's end) tells the
    /// model to write the command literally.
    #[test]
    fn an_undecidable_command_under_an_ask_rule_is_asked_with_its_reason() {
        let settings = settings(&[], &["Bash(rm *)"]);
        let request = hook(
            POLICY_HOOK,
            "PreToolUse",
            "Bash",
            bash("X=rm; $X -rf target"),
        );
        let Action::Ask(pending) = on_request(&settings, "r", &request) else {
            panic!("not asked");
        };
        expect![[r#"ApprovalRequest { id: "r", kind: ToolCall { tool: "Bash", summary: Some("X=rm; $X -rf target"), argument: Some("X=rm; $X -rf target"), undecidable: Some("the command could not be decided: the program name is not a literal ($X): write the command literally") } }"#]]
            .assert_eq(&format!("{:?}", pending.request));
        let show = |answer| pending.response(&answer).to_string();
        expect![[r#"{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny","permissionDecisionReason":"denied by the user; the command could not be decided: the program name is not a literal ($X): write the command literally"}}"#]]
            .assert_eq(&show(ApprovalAnswer::Deny {
                reason: "denied by the user".into(),
            }));
        expect![[r#"{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny","permissionDecisionReason":"no answer within 300 s; the command could not be decided: the program name is not a literal ($X): write the command literally"}}"#]]
            .assert_eq(&show(ApprovalAnswer::Deny {
                reason: "no answer within 300 s".into(),
            }));
        expect![[r#"{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny","permissionDecisionReason":"the turn ended before the user answered; the command could not be decided: the program name is not a literal ($X): write the command literally"}}"#]]
            .assert_eq(&pending.unanswered().to_string());
        expect!["{}"].assert_eq(&show(ApprovalAnswer::Allow));
    }

    #[test]
    fn approval_stops_end_the_turn_after_their_tool_only() {
        let mut settings = settings(&[], &[]);
        settings.approval_stop_tools = vec!["mcp__nanoclaw__send_message".into()];
        let stop = |tool: &str| {
            on_request(
                &settings,
                "r",
                &hook(STOP_HOOK, "PostToolUse", tool, json!({})),
            )
        };
        expect![[r#"Stop { response: Object {"continue": Bool(false), "stopReason": String("mcp__nanoclaw__send_message is an approval stop: the turn ends with its result")} }"#]]
            .assert_eq(&format!("{:?}", stop("mcp__nanoclaw__send_message")));
        assert!(matches!(stop("Bash"), Action::Answer { .. }));
        assert!(matches!(
            on_request(&settings, "r", &json!({"subtype": "can_use_tool"})),
            Action::Refuse(_)
        ));
    }

    #[test]
    fn elicitations_are_declined_or_asked_when_simple() {
        let mut settings = settings(&[], &[]);
        // As Claude 2.1.330 forwards an MCP server's `elicitation/create` (captured).
        let request = json!({"subtype": "elicitation", "mcp_server_name": "deploy",
            "message": "Which environment?", "mode": "form",
            "requested_schema": {"type": "object", "properties": {
                "env": {"type": "string", "enum": ["staging", "production"]}},
                "required": ["env"]},
            "property_order": ["env"]});
        expect![[r#"Answer { response: Object {"action": String("decline")}, events: [] }"#]]
            .assert_eq(&format!("{:?}", on_request(&settings, "e", &request)));
        settings.elicitation = ElicitationMode::Ask;
        let Action::Ask(pending) = on_request(&settings, "e", &request) else {
            panic!("not asked");
        };
        expect![[r#"ApprovalRequest { id: "e", kind: Elicitation { server: "deploy", message: "Which environment?", options: ["staging", "production"] } }"#]]
            .assert_eq(&format!("{:?}", pending.request));
        expect![[r#"{"action":"accept","content":{"env":"staging"}}"#]].assert_eq(
            &pending
                .response(&ApprovalAnswer::Reply("staging".into()))
                .to_string(),
        );
        expect![[r#"{"action":"decline"}"#]].assert_eq(&pending.unanswered().to_string());
        // Two fields, or a URL to open: declined.
        let two = json!({"subtype": "elicitation", "requested_schema": {"properties": {
            "a": {"type": "string"}, "b": {"type": "string"}}}});
        let url = json!({"subtype": "elicitation", "mode": "url", "url": "https://x"});
        for request in [two, url] {
            assert!(matches!(
                on_request(&settings, "e", &request),
                Action::Answer { response, .. } if response == json!({"action": "decline"})
            ));
        }
    }
}
