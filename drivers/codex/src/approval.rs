//! The tool policy at Codex's approval requests (docs/contract/providers.md#codex).
//!
//! When the policy restricts anything (or elicitations are asked), Codex runs with
//! `approval_policy = "untrusted"`: it then hands every command (known-safe ones like `ls`
//! included, measured on 0.169), every file change and every MCP tool call (as an elicitation
//! with `_meta.codex_approval_kind: "mcp_tool_call"`) to the client before running it, and
//! forwards MCP servers' own elicitations instead of declining them. Each request is judged here
//! with [`ToolPolicy::judge`]: allowed calls are accepted at once, denied ones declined (the
//! model reads "rejected by user"), `ask` ones become an [`ApprovalKind::ToolCall`] the runner
//! answers later.

use serde_json::{json, Value};

use super::protocol::shell_script;
use provider::policy::Call;
use provider::{ApprovalAnswer, ApprovalKind, Decision, ElicitationMode, ToolPolicy};

/// The server requests that wait for the query instead of being answered by the connection.
pub(super) const GATED_METHODS: [&str; 3] = [
    "item/commandExecution/requestApproval",
    "item/fileChange/requestApproval",
    "mcpServer/elicitation/request",
];

/// Whether Codex must hand calls to the driver: anything but "allow everything, decline
/// elicitations" needs the approval requests.
pub(super) fn gated(policy: &ToolPolicy, elicitation: ElicitationMode) -> bool {
    !policy.allows_everything() || elicitation == ElicitationMode::Ask
}

/// How an answer is written back: the request kinds answer in different shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reply {
    /// `{"decision": "accept" | "decline"}` (commands and file changes).
    Decision,
    /// An MCP tool-call approval elicitation: `accept` / `decline` without content.
    ToolApproval,
    /// A general elicitation answered with `content: {field: text}`.
    Elicitation {
        /// The schema's one property.
        field: String,
    },
}

impl Reply {
    /// The JSON-RPC result for `answer`.
    pub(super) fn result(&self, answer: &ApprovalAnswer) -> Value {
        let accepted = !matches!(answer, ApprovalAnswer::Deny { .. });
        match self {
            Reply::Decision => json!({ "decision": if accepted { "accept" } else { "decline" } }),
            Reply::ToolApproval if accepted => {
                json!({ "action": "accept", "content": null, "_meta": null })
            }
            Reply::Elicitation { field } => match answer {
                ApprovalAnswer::Reply(text) => {
                    json!({ "action": "accept", "content": { field.as_str(): text }, "_meta": null })
                }
                _ => decline_elicitation(),
            },
            Reply::ToolApproval => decline_elicitation(),
        }
    }

    /// The refusal (an unanswered request at the query's end).
    pub(super) fn refusal(&self) -> Value {
        self.result(&ApprovalAnswer::Deny {
            reason: String::new(),
        })
    }
}

fn decline_elicitation() -> Value {
    json!({ "action": "decline", "content": null, "_meta": null })
}

/// What to do with a gated request.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Verdict {
    /// Answer now; `denied` names the call the policy refused.
    Answer {
        /// The JSON-RPC result.
        result: Value,
        /// The refused call (for `ToolDenied`).
        denied: Option<Call>,
        /// Why the refused call's command could not be decided, when that is why (for
        /// `ToolUndecidable` and the note that tells the model).
        undecidable: Option<String>,
    },
    /// Ask the runner; answer with `reply` when it decided.
    Ask {
        /// What is asked.
        kind: ApprovalKind,
        /// How the answer is written back.
        reply: Reply,
        /// The call, when it is one (for the log).
        call: Option<Call>,
    },
}

/// Judges a gated request. `calls` are what the request is about (the driver finds a file
/// change's paths in its item); for an elicitation they are read from the request itself.
pub(super) fn judge(
    method: &str,
    params: &Value,
    calls: Vec<Call>,
    policy: &ToolPolicy,
    elicitation: ElicitationMode,
) -> Verdict {
    let (calls, reply) = match method {
        "mcpServer/elicitation/request" => match tool_approval(params) {
            Some(call) => (vec![call], Reply::ToolApproval),
            None => return general_elicitation(params, elicitation),
        },
        "item/commandExecution/requestApproval" => {
            let command = params.get("command").and_then(Value::as_str);
            let call = match command {
                Some(line) => {
                    let script = shell_script(line);
                    Call {
                        tool: "Bash".into(),
                        summary: provider::driver::activity::one_line_summary(&script),
                        argument: Some(script),
                    }
                }
                None => Call {
                    tool: "Bash".into(),
                    summary: None,
                    argument: None,
                },
            };
            (vec![call], Reply::Decision)
        }
        _ => (calls, Reply::Decision),
    };
    // A file change whose item was never seen: unknown, so the policy decides on the name.
    let calls = if calls.is_empty() {
        vec![Call {
            tool: "Edit".into(),
            summary: None,
            argument: None,
        }]
    } else {
        calls
    };
    // Several calls (a patch touching several files): the strictest decision of them.
    let rank = |d: Decision| match d {
        Decision::Allow => 0,
        Decision::Ask => 1,
        Decision::Deny => 2,
    };
    let (verdict, call) = calls
        .into_iter()
        .map(|call| (call.judge(policy), call))
        .max_by_key(|(verdict, _)| rank(verdict.decision))
        .unwrap_or((
            provider::policy::Verdict::decided(Decision::Deny),
            Call {
                tool: "Edit".into(),
                summary: None,
                argument: None,
            },
        ));
    match verdict.decision {
        Decision::Allow => Verdict::Answer {
            result: reply.result(&ApprovalAnswer::Allow),
            denied: None,
            undecidable: None,
        },
        Decision::Deny => Verdict::Answer {
            result: reply.refusal(),
            denied: Some(call),
            undecidable: verdict.undecidable,
        },
        Decision::Ask => Verdict::Ask {
            kind: call.clone().ask(verdict.undecidable),
            reply,
            call: Some(call),
        },
    }
}

/// An MCP tool-call approval (`_meta.codex_approval_kind: "mcp_tool_call"`) as a call.
fn tool_approval(params: &Value) -> Option<Call> {
    let meta = params.get("_meta")?;
    if meta.get("codex_approval_kind").and_then(Value::as_str) != Some("mcp_tool_call") {
        return None;
    }
    let server = params.get("serverName").and_then(Value::as_str)?;
    let tool = meta.get("tool_name").and_then(Value::as_str)?;
    let argument = meta.get("tool_params").map(Value::to_string);
    Some(Call {
        tool: format!("mcp__{server}__{tool}"),
        summary: argument
            .as_deref()
            .and_then(provider::driver::activity::one_line_summary),
        argument,
    })
}

/// An elicitation of the MCP server's own: asked when the mode says so and the schema is one
/// choice or one text field; declined otherwise.
fn general_elicitation(params: &Value, mode: ElicitationMode) -> Verdict {
    let decline = Verdict::Answer {
        result: decline_elicitation(),
        denied: None,
        undecidable: None,
    };
    if mode != ElicitationMode::Ask {
        return decline;
    }
    let Some((field, options)) =
        provider::driver::elicitation::single_string_field(params.get("requestedSchema"))
    else {
        return decline;
    };
    let server = params
        .get("serverName")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_owned();
    let message = params
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    Verdict::Ask {
        kind: ApprovalKind::Elicitation {
            server,
            message,
            options,
        },
        reply: Reply::Elicitation { field },
        call: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use provider::ToolRule;

    fn policy() -> ToolPolicy {
        let rules = |list: &[&str]| list.iter().map(|r| ToolRule::parse(r).unwrap()).collect();
        ToolPolicy {
            deny: rules(&["Bash(rm *)", "mcp__nanoclaw__schedule_task"]),
            ask: rules(&["Bash(git push*)", "Write", "mcp__github__*"]),
            ..ToolPolicy::default()
        }
    }

    fn file(tool: &str, path: &str) -> Call {
        Call {
            tool: tool.into(),
            summary: Some(path.into()),
            argument: Some(path.into()),
        }
    }

    /// Each request kind → the verdict and, for an ask, the answers written back.
    #[test]
    fn requests_become_answers_or_questions() {
        let command = |line: &str| {
            (
                "item/commandExecution/requestApproval",
                json!({ "command": line, "itemId": "c1" }),
                vec![],
            )
        };
        let tool = |server: &str, tool: &str| {
            (
                "mcpServer/elicitation/request",
                json!({ "serverName": server, "message": "Allow?", "requestedSchema": {"type": "object", "properties": {}},
                        "_meta": { "codex_approval_kind": "mcp_tool_call", "tool_name": tool, "tool_params": {"a": 1} } }),
                vec![],
            )
        };
        let elicit = |schema: Value| {
            (
                "mcpServer/elicitation/request",
                json!({ "serverName": "forms", "message": "Pick a color", "_meta": null, "requestedSchema": schema }),
                vec![],
            )
        };
        let cases = vec![
            command("/bin/bash -lc 'rm -rf target'"),
            command("/bin/bash -lc 'cd x && rm -rf y'"),
            command("/bin/bash -lc 'echo '\\''hi'\\''; rm -f z'"),
            command("/bin/bash -lc ls"),
            command("/bin/bash -lc 'git push origin main'"),
            command("/bin/bash -lc 'X=rm; $X -rf target'"),
            (
                "item/fileChange/requestApproval",
                json!({ "itemId": "p1" }),
                vec![file("Edit", "/w/a.rs")],
            ),
            (
                "item/fileChange/requestApproval",
                json!({ "itemId": "p1" }),
                vec![file("Write", "/w/new.txt"), file("Edit", "/w/a.rs")],
            ),
            (
                "item/fileChange/requestApproval",
                json!({ "itemId": "p9" }),
                vec![],
            ),
            tool("nanoclaw", "send_message"),
            tool("nanoclaw", "schedule_task"),
            tool("github", "create_issue"),
            elicit(
                json!({"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "blue"]}}}),
            ),
            elicit(json!({"type": "object", "properties": {"name": {"type": "string"}}})),
            elicit(json!({"type": "object", "properties": {"n": {"type": "number"}}})),
            elicit(
                json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}),
            ),
        ];
        let mut out = String::new();
        for (method, params, calls) in cases {
            for mode in [ElicitationMode::Decline, ElicitationMode::Ask] {
                if mode == ElicitationMode::Ask && params["_meta"].is_object() {
                    continue;
                }
                if mode == ElicitationMode::Ask && method != "mcpServer/elicitation/request" {
                    continue;
                }
                let line = match judge(method, &params, calls.clone(), &policy(), mode) {
                    Verdict::Answer {
                        result,
                        denied,
                        undecidable,
                    } => {
                        let why = undecidable.map(|u| format!(" undecidable={u:?}"));
                        format!(
                            "answer {result} denied={denied:?}{}",
                            why.unwrap_or_default()
                        )
                    }
                    Verdict::Ask { kind, reply, .. } => format!(
                        "ask {kind:?}\n    allow -> {}\n    deny -> {}\n    reply -> {}",
                        reply.result(&ApprovalAnswer::Allow),
                        reply.refusal(),
                        reply.result(&ApprovalAnswer::Reply("blue".into())),
                    ),
                };
                out.push_str(&format!("{method} {mode:?}\n  {line}\n"));
            }
        }
        expect![[r#"
            item/commandExecution/requestApproval Decline
              answer {"decision":"decline"} denied=Some(Call { tool: "Bash", summary: Some("rm -rf target"), argument: Some("rm -rf target") })
            item/commandExecution/requestApproval Decline
              answer {"decision":"decline"} denied=Some(Call { tool: "Bash", summary: Some("cd x && rm -rf y"), argument: Some("cd x && rm -rf y") })
            item/commandExecution/requestApproval Decline
              answer {"decision":"decline"} denied=Some(Call { tool: "Bash", summary: Some("echo 'hi'; rm -f z"), argument: Some("echo 'hi'; rm -f z") })
            item/commandExecution/requestApproval Decline
              answer {"decision":"accept"} denied=None
            item/commandExecution/requestApproval Decline
              ask ToolCall { tool: "Bash", summary: Some("git push origin main"), argument: Some("git push origin main"), undecidable: None }
                allow -> {"decision":"accept"}
                deny -> {"decision":"decline"}
                reply -> {"decision":"accept"}
            item/commandExecution/requestApproval Decline
              answer {"decision":"decline"} denied=Some(Call { tool: "Bash", summary: Some("X=rm; $X -rf target"), argument: Some("X=rm; $X -rf target") }) undecidable="the command could not be decided: the program name is not a literal ($X): write the command literally"
            item/fileChange/requestApproval Decline
              answer {"decision":"accept"} denied=None
            item/fileChange/requestApproval Decline
              ask ToolCall { tool: "Write", summary: Some("/w/new.txt"), argument: Some("/w/new.txt"), undecidable: None }
                allow -> {"decision":"accept"}
                deny -> {"decision":"decline"}
                reply -> {"decision":"accept"}
            item/fileChange/requestApproval Decline
              answer {"decision":"accept"} denied=None
            mcpServer/elicitation/request Decline
              answer {"_meta":null,"action":"accept","content":null} denied=None
            mcpServer/elicitation/request Decline
              answer {"_meta":null,"action":"decline","content":null} denied=Some(Call { tool: "mcp__nanoclaw__schedule_task", summary: Some("{\"a\":1}"), argument: Some("{\"a\":1}") })
            mcpServer/elicitation/request Decline
              ask ToolCall { tool: "mcp__github__create_issue", summary: Some("{\"a\":1}"), argument: Some("{\"a\":1}"), undecidable: None }
                allow -> {"_meta":null,"action":"accept","content":null}
                deny -> {"_meta":null,"action":"decline","content":null}
                reply -> {"_meta":null,"action":"accept","content":null}
            mcpServer/elicitation/request Decline
              answer {"_meta":null,"action":"decline","content":null} denied=None
            mcpServer/elicitation/request Ask
              ask Elicitation { server: "forms", message: "Pick a color", options: ["red", "blue"] }
                allow -> {"_meta":null,"action":"decline","content":null}
                deny -> {"_meta":null,"action":"decline","content":null}
                reply -> {"_meta":null,"action":"accept","content":{"color":"blue"}}
            mcpServer/elicitation/request Decline
              answer {"_meta":null,"action":"decline","content":null} denied=None
            mcpServer/elicitation/request Ask
              ask Elicitation { server: "forms", message: "Pick a color", options: [] }
                allow -> {"_meta":null,"action":"decline","content":null}
                deny -> {"_meta":null,"action":"decline","content":null}
                reply -> {"_meta":null,"action":"accept","content":{"name":"blue"}}
            mcpServer/elicitation/request Decline
              answer {"_meta":null,"action":"decline","content":null} denied=None
            mcpServer/elicitation/request Ask
              answer {"_meta":null,"action":"decline","content":null} denied=None
            mcpServer/elicitation/request Decline
              answer {"_meta":null,"action":"decline","content":null} denied=None
            mcpServer/elicitation/request Ask
              answer {"_meta":null,"action":"decline","content":null} denied=None
        "#]].assert_eq(&out);
    }

    #[test]
    fn gating_follows_the_policy_and_the_elicitation_mode() {
        assert!(!gated(&ToolPolicy::default(), ElicitationMode::Decline));
        assert!(gated(&ToolPolicy::default(), ElicitationMode::Ask));
        assert!(gated(&policy(), ElicitationMode::Decline));
    }
}
