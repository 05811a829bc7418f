//! The tool policy (issue 16) in OpenCode's terms: the `permission` config the server enforces,
//! the decision for each `permission.asked` it sends, and the plugin that ends a turn after an
//! approval-stop tool's result.
//!
//! OpenCode 1.18.33 evaluates `permission` as an ordered rule list (`{"bash": {"*": "ask", "rm
//! *": "deny"}}` becomes rules in key order) and the LAST rule whose permission and pattern match
//! wins; no match is `ask`. Its patterns: `*` any run, `?` one character, a trailing ` *` also
//! matches the bare word (`rm *` matches `rm`). A tool whose last rule is a pattern-less `deny`
//! is removed from the model's tool list.
//!
//! The translation is deliberately coarse and safe: everything the policy does not allow
//! outright is `ask`, so OpenCode hands the call over and [`decide`] applies the one rule of
//! [`provider::policy`]; what OpenCode can refuse on its own (a tool denied without pattern, a Bash
//! deny pattern, an MCP tool or server denied) is also `deny` in the config, so the CLI refuses
//! it even without the driver. OpenCode's matching of a deny pattern is never narrower than
//! ours (its `?` and trailing ` *` match more), so a translated deny never lets through what
//! the policy denies. Keys are emitted sorted, which puts `*` before every name and `x_*` before
//! `x_y`: the more specific rule comes later and wins (serde_json's maps are sorted; the order is
//! the same when they keep insertion order, since the entries are inserted sorted).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use provider::driver::activity::one_line_summary;
use provider::policy::{Call, Decision, ToolPolicy, ToolRule};

use super::tools::{argument_field, canonical_tool};

/// The canonical builtin tools and OpenCode's permission for each (Write and Edit share `edit`).
const BUILTINS: [(&str, &str); 8] = [
    ("Bash", "bash"),
    ("Read", "read"),
    ("Write", "edit"),
    ("Edit", "edit"),
    ("Glob", "glob"),
    ("Grep", "grep"),
    ("WebFetch", "webfetch"),
    ("WebSearch", "websearch"),
];

/// Permissions that are not tool calls: asked before a tool's own permission (a path outside
/// the project) or when the model repeats a call. Allowed as before; the tool's own permission
/// follows.
const NOT_TOOLS: [&str; 2] = ["external_directory", "doom_loop"];

/// True for a permission that is no tool call of its own (see [`NOT_TOOLS`]).
pub(super) fn is_not_a_tool(permission: &str) -> bool {
    NOT_TOOLS.contains(&permission)
}

/// What the model is told when the driver refuses a call by the policy.
pub(super) const POLICY_DENIAL: &str = "denied by the tool policy";

/// The start of the error OpenCode gives a call its config denies (`PermissionDeniedError`).
const CONFIG_DENIAL: &str = "The user has specified a rule which prevents you from using";

/// The `permission` entries for `policy`, beside the fixed ones the caller adds; `None` when
/// the policy allows everything (the caller keeps `"*": "allow"`). `mcp_servers`: every MCP
/// server OpenCode knows (their tools are `<server>_<tool>`).
pub(super) fn config(
    policy: &ToolPolicy,
    mcp_servers: &[String],
) -> Option<BTreeMap<String, Value>> {
    if policy.allows_everything() {
        return None;
    }
    let mut entries: BTreeMap<String, Value> = BTreeMap::new();
    entries.insert("*".into(), json!("ask"));
    for key in NOT_TOOLS {
        entries.insert(key.into(), json!("allow"));
    }
    // Builtins: allow when every call is allowed, deny when every call is denied, else ask with
    // the Bash deny patterns OpenCode can apply itself.
    let mut by_key: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (tool, key) in BUILTINS {
        by_key.entry(key).or_default().push(tool);
    }
    for (key, tools) in by_key {
        let verdicts: Vec<Whole> = tools.iter().map(|tool| whole(policy, tool)).collect();
        let value = if verdicts.iter().all(|v| *v == Whole::Deny) {
            json!("deny")
        } else if key == "bash" {
            // Every command not denied outright goes to the driver, even when the policy would
            // allow each: the runner's judgement is the one that counts for every Bash call
            // (issue 41), OpenCode's deny patterns are only an extra layer.
            bash_patterns(policy)
        } else if verdicts.iter().all(|v| *v == Whole::Allow) {
            json!("allow")
        } else {
            json!("ask")
        };
        entries.insert(key.into(), value);
    }
    // MCP tools and servers denied without a pattern: OpenCode refuses (and hides) them.
    for rule in policy.rules(Decision::Deny) {
        if rule.pattern.is_some() {
            continue;
        }
        for key in mcp_keys(&rule.tool, mcp_servers) {
            entries.insert(key, json!("deny"));
        }
    }
    Some(entries)
}

/// What a policy says about every call of `tool`, whatever its argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Whole {
    Allow,
    Deny,
    /// Depends on the argument, or asks.
    Mixed,
}

fn whole(policy: &ToolPolicy, tool: &str) -> Whole {
    let names = |decision| {
        policy
            .rules(decision)
            .iter()
            .filter(|rule| rule.names(tool))
            .collect::<Vec<&ToolRule>>()
    };
    let (deny, ask, allow) = (
        names(Decision::Deny),
        names(Decision::Ask),
        names(Decision::Allow),
    );
    if deny.iter().any(|rule| rule.pattern.is_none()) {
        return Whole::Deny;
    }
    if !deny.is_empty() || !ask.is_empty() {
        return Whole::Mixed;
    }
    if allow.iter().any(|rule| rule.pattern.is_none()) {
        return Whole::Allow;
    }
    match (policy.default, allow.is_empty()) {
        (Decision::Allow, _) => Whole::Allow,
        (Decision::Deny, true) => Whole::Deny,
        _ => Whole::Mixed,
    }
}

/// `{"*": "ask", "<deny pattern>": "deny", ...}`: OpenCode matches the patterns against each
/// simple command of the line (its own shell parser); `x:*` is written `x *`, which OpenCode
/// reads as `x` alone or followed by arguments, as the policy does.
fn bash_patterns(policy: &ToolPolicy) -> Value {
    let mut patterns = BTreeMap::new();
    patterns.insert("*".to_owned(), json!("ask"));
    for rule in policy.rules(Decision::Deny) {
        if !rule.names("Bash") {
            continue;
        }
        if let Some(pattern) = &rule.pattern {
            let pattern = match pattern.strip_suffix(":*") {
                Some(stem) => format!("{stem} *"),
                None => pattern.clone(),
            };
            patterns.insert(pattern, json!("deny"));
        }
    }
    Value::Object(patterns.into_iter().collect::<Map<_, _>>())
}

/// OpenCode's permission keys for the MCP tools a rule names: `mcp__s__t` → `s_t`,
/// `mcp__s__t*` → `s_t*`, and a shorter prefix (`mcp__*`, `mcp__gi*`) → `s_*` for every known
/// server it covers. Names that are not MCP tools give none (the catch-all `ask` covers them).
fn mcp_keys(tool: &str, mcp_servers: &[String]) -> Vec<String> {
    let (stem, wildcard) = match tool.strip_suffix('*') {
        Some(stem) => (stem, true),
        None => (tool, false),
    };
    let mut keys = Vec::new();
    for server in mcp_servers {
        let prefix = format!("mcp__{server}__");
        if let Some(rest) = stem.strip_prefix(&prefix) {
            match (rest.is_empty(), wildcard) {
                (true, false) => {}
                (_, true) => keys.push(format!("{server}_{rest}*")),
                (false, false) => keys.push(format!("{server}_{rest}")),
            }
        } else if wildcard && prefix.starts_with(stem) {
            keys.push(format!("{server}_*"));
        }
    }
    keys
}

/// One `permission.asked` request, with what the driver knows of the call it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Asked {
    /// The request id (`per_…`).
    pub id: String,
    /// OpenCode's permission (`bash`, `edit`, `nanoclaw_send_message`, ...).
    pub permission: String,
    /// The request's `metadata` (`command` for bash, `filepath` for edits).
    pub metadata: Value,
    /// The request's patterns (the relative path of a read, the URL of a fetch, ...).
    pub patterns: Vec<String>,
    /// The tool call's `callID`, when the request belongs to one.
    pub call_id: Option<String>,
}

impl Asked {
    /// Reads a `permission.asked` payload; `None` without an id.
    pub(super) fn parse(properties: &Value) -> Option<Asked> {
        let text = |value: &Value| value.as_str().map(str::to_owned);
        Some(Asked {
            id: properties.get("id").and_then(text)?,
            permission: properties
                .get("permission")
                .and_then(text)
                .unwrap_or_default(),
            metadata: properties.get("metadata").cloned().unwrap_or(Value::Null),
            patterns: properties
                .get("patterns")
                .and_then(Value::as_array)
                .map(|items| items.iter().filter_map(text).collect())
                .unwrap_or_default(),
            call_id: properties
                .get("tool")
                .and_then(|tool| tool.get("callID"))
                .and_then(text),
        })
    }
}

/// What the driver does with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Reply `once` (a non-tool permission, or the policy allows the call).
    Allow,
    /// Reply `reject` with [`POLICY_DENIAL`] and report `ToolDenied`; with why the command
    /// could not be decided, when that is why (the reply and the report then say so).
    Deny(Call, Option<String>),
    /// Ask the runner (`ApprovalRequest`), reply with its answer; with why the command could
    /// not be decided, when that is why it is asked (the question and a refusal then say so).
    Ask(Call, Option<String>),
}

/// Decides `asked`. `tool_part` is the tool call's part as the driver last saw it (`tool` and
/// `state.input`), when it has one; `mcp_servers` as in [`config`].
pub(super) fn decide(
    policy: &ToolPolicy,
    asked: &Asked,
    tool_part: Option<(&str, &Value)>,
    mcp_servers: &[String],
) -> Verdict {
    if is_not_a_tool(&asked.permission) {
        return Verdict::Allow;
    }
    let call = call(asked, tool_part, mcp_servers);
    let verdict = call.judge(policy);
    match verdict.decision {
        Decision::Allow => Verdict::Allow,
        Decision::Deny => Verdict::Deny(call, verdict.undecidable),
        Decision::Ask => Verdict::Ask(call, verdict.undecidable),
    }
}

/// The canonical call of a request: the tool from the call's part (an `edit` request is a
/// Write or an Edit), the argument from the call's input, else from the request itself.
fn call(asked: &Asked, tool_part: Option<(&str, &Value)>, mcp_servers: &[String]) -> Call {
    let raw = match (tool_part, asked.permission.as_str()) {
        (Some((tool, _)), _) if !tool.is_empty() => tool.to_owned(),
        // Without the part, the safe reading of an edit is the one the policy is stricter on;
        // both are the same permission, so Edit it is (the part is normally there).
        (_, permission) => permission.to_owned(),
    };
    let tool = canonical_tool(&raw, mcp_servers);
    let input = tool_part.map(|(_, input)| input);
    let field = |name: &str| {
        input
            .and_then(|input| input.get(name))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let from_metadata = |name: &str| {
        asked
            .metadata
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    // The part's input first; before OpenCode publishes it, what the request itself carries.
    let from_request = || match raw.as_str() {
        "bash" => from_metadata("command"),
        "read" | "write" | "edit" => from_metadata("filepath"),
        "glob" | "grep" => asked.patterns.first().cloned(),
        "webfetch" => from_metadata("url"),
        _ => None,
    };
    let argument = match argument_field(&raw) {
        Some(name) => field(name).or_else(from_request),
        None if tool.starts_with("mcp__") => input.map(Value::to_string),
        None => None,
    };
    let summary = argument.as_deref().and_then(one_line_summary);
    Call {
        tool,
        argument,
        summary,
    }
}

/// True for the error OpenCode gives a tool call its `permission` config denies.
pub(super) fn is_config_denial(error: &str) -> bool {
    error.starts_with(CONFIG_DENIAL)
}

/// OpenCode's name of an MCP tool (`mcp__nanoclaw__send_message` → `nanoclaw_send_message`);
/// `None` for a name that is not an MCP tool.
pub(super) fn opencode_mcp_name(canonical: &str) -> Option<String> {
    let rest = canonical.strip_prefix("mcp__")?;
    let (server, tool) = rest.split_once("__")?;
    (!server.is_empty() && !tool.is_empty()).then(|| format!("{server}_{tool}"))
}

/// The server plugin that ends the turn after an approval-stop tool's result, exactly:
/// `tool.execute.after` (the tool returned; its result is recorded normally) marks the
/// session, and `chat.params`, which OpenCode awaits before every model request, aborts the
/// marked session's loop (`POST /session/{id}/abort` on the server itself) and fails the
/// request, so none is sent until the loop has gone idle (`session.idle` clears the mark).
/// Aborting inside `tool.execute.after` instead would also stop the loop, but OpenCode then
/// records the call as "Tool execution aborted" and the model never sees the result
/// (measured on 1.18.33). `tools`: OpenCode's names of the tools.
pub(super) fn approval_stop_plugin(tools: &[String]) -> String {
    let names = serde_json::to_string(tools).unwrap_or_else(|_| "[]".into());
    format!(
        r#"// Written by NanoClaw (the OpenCode provider): ends the turn after an approval-stop tool.
const STOP = new Set({names});
const stopping = new Set();
const AUTH = "Basic " + btoa("opencode:" + (process.env.OPENCODE_SERVER_PASSWORD ?? ""));
export const NanoclawApprovalStop = async ({{ serverUrl }}) => ({{
  "tool.execute.after": async (input) => {{
    if (STOP.has(input.tool)) stopping.add(input.sessionID);
  }},
  "chat.params": async (input) => {{
    if (!stopping.has(input.sessionID)) return;
    const url = new URL("/session/" + encodeURIComponent(input.sessionID) + "/abort", serverUrl);
    try {{
      await fetch(url, {{ method: "POST", headers: {{ authorization: AUTH }}, signal: AbortSignal.timeout(5000) }});
    }} catch (err) {{
      console.error("nanoclaw approval stop: abort failed: " + err);
    }}
    throw new Error("the turn ended after an approval-stop tool");
  }},
  event: async ({{ event }}) => {{
    if (event.type === "session.idle") stopping.delete(event.properties?.sessionID);
  }},
}});
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    /// A policy read from its config form.
    fn policy(allow: &[&str], deny: &[&str], ask: &[&str], default: Decision) -> ToolPolicy {
        let parse = |list: &[&str]| serde_json::from_value(json!(list)).unwrap();
        ToolPolicy {
            allow: parse(allow),
            deny: parse(deny),
            ask: parse(ask),
            default,
            ..ToolPolicy::default()
        }
    }

    fn servers() -> Vec<String> {
        vec!["nanoclaw".into(), "github".into()]
    }

    fn show(entries: Option<BTreeMap<String, Value>>) -> String {
        match entries {
            Some(entries) => serde_json::to_string_pretty(&entries).unwrap(),
            None => "unrestricted".into(),
        }
    }

    #[test]
    fn an_open_policy_keeps_the_config_unrestricted() {
        assert_eq!(
            show(config(&ToolPolicy::default(), &servers())),
            "unrestricted"
        );
    }

    #[test]
    fn deny_and_ask_rules_become_opencode_permissions() {
        let p = policy(
            &["Read", "Glob"],
            &[
                "Bash(rm *)",
                "Bash(git push:*)",
                "WebFetch",
                "mcp__github__*",
                "mcp__nanoclaw__schedule_task",
            ],
            &["Bash(curl *)", "mcp__nanoclaw__send_message", "Write"],
            Decision::Allow,
        );
        expect![[r#"
            {
              "*": "ask",
              "bash": {
                "*": "ask",
                "git push *": "deny",
                "rm *": "deny"
              },
              "doom_loop": "allow",
              "edit": "ask",
              "external_directory": "allow",
              "github_*": "deny",
              "glob": "allow",
              "grep": "allow",
              "nanoclaw_schedule_task": "deny",
              "read": "allow",
              "webfetch": "deny",
              "websearch": "allow"
            }"#]]
        .assert_eq(&show(config(&p, &servers())));
    }

    #[test]
    fn a_deny_default_denies_unlisted_builtins_and_asks_for_patterned_allows() {
        let p = policy(
            &["Bash(git status*)", "Read", "mcp__nanoclaw__*"],
            &["mcp__*"],
            &[],
            Decision::Deny,
        );
        expect![[r#"
            {
              "*": "ask",
              "bash": {
                "*": "ask"
              },
              "doom_loop": "allow",
              "edit": "deny",
              "external_directory": "allow",
              "github_*": "deny",
              "glob": "deny",
              "grep": "deny",
              "nanoclaw_*": "deny",
              "read": "allow",
              "webfetch": "deny",
              "websearch": "deny"
            }"#]]
        .assert_eq(&show(config(&p, &servers())));
    }

    fn asked(permission: &str, metadata: Value, patterns: &[&str]) -> Asked {
        Asked::parse(&json!({
            "id": "per_1",
            "sessionID": "ses_1",
            "permission": permission,
            "patterns": patterns,
            "metadata": metadata,
            "always": ["*"],
            "tool": {"messageID": "msg_1", "callID": "call_1"},
        }))
        .unwrap()
    }

    #[test]
    fn requests_are_decided_by_the_policy_on_the_call_itself() {
        let p = policy(
            &[],
            &["Bash(rm *)", "Write(/etc/*)"],
            &["Bash(git push*)", "mcp__nanoclaw__send_message"],
            Decision::Allow,
        );
        let s = servers();
        let bash = asked(
            "bash",
            json!({"command": "cd x && rm -rf target"}),
            &["cd x", "rm -rf target"],
        );
        assert_eq!(bash.call_id.as_deref(), Some("call_1"));
        let input = json!({"command": "cd x && rm -rf target", "description": "d"});
        let command = |line: &str| asked("bash", json!({ "command": line }), &[line]);
        let etc = json!({"filePath": "/etc/passwd"});
        let edit = asked(
            "edit",
            json!({"filepath": "/etc/passwd"}),
            &["../etc/passwd"],
        );
        let mcp = asked("nanoclaw_send_message", json!({}), &["*"]);
        let mcp_input = json!({"text": "hi"});
        let cases = [
            decide(&p, &bash, Some(("bash", &input)), &s),
            decide(&p, &bash, None, &s),
            decide(&p, &command("git push origin"), None, &s),
            decide(&p, &command("ls"), None, &s),
            decide(&p, &command("X=rm; $X -rf target"), None, &s),
            decide(&p, &edit, Some(("write", &etc)), &s),
            decide(&p, &edit, Some(("edit", &etc)), &s),
            decide(&p, &mcp, Some(("nanoclaw_send_message", &mcp_input)), &s),
            decide(
                &p,
                &asked("external_directory", json!({}), &["/tmp/*"]),
                None,
                &s,
            ),
        ];
        expect![[r#"
            [
                Deny(
                    Call {
                        tool: "Bash",
                        summary: Some(
                            "cd x && rm -rf target",
                        ),
                        argument: Some(
                            "cd x && rm -rf target",
                        ),
                    },
                    None,
                ),
                Deny(
                    Call {
                        tool: "Bash",
                        summary: Some(
                            "cd x && rm -rf target",
                        ),
                        argument: Some(
                            "cd x && rm -rf target",
                        ),
                    },
                    None,
                ),
                Ask(
                    Call {
                        tool: "Bash",
                        summary: Some(
                            "git push origin",
                        ),
                        argument: Some(
                            "git push origin",
                        ),
                    },
                    None,
                ),
                Allow,
                Deny(
                    Call {
                        tool: "Bash",
                        summary: Some(
                            "X=rm; $X -rf target",
                        ),
                        argument: Some(
                            "X=rm; $X -rf target",
                        ),
                    },
                    Some(
                        "the command could not be decided: the program name is not a literal ($X): write the command literally",
                    ),
                ),
                Deny(
                    Call {
                        tool: "Write",
                        summary: Some(
                            "/etc/passwd",
                        ),
                        argument: Some(
                            "/etc/passwd",
                        ),
                    },
                    None,
                ),
                Allow,
                Ask(
                    Call {
                        tool: "mcp__nanoclaw__send_message",
                        summary: Some(
                            "{\"text\":\"hi\"}",
                        ),
                        argument: Some(
                            "{\"text\":\"hi\"}",
                        ),
                    },
                    None,
                ),
                Allow,
            ]
        "#]]
        .assert_debug_eq(&cases);
        // Issue 41: under an `ask` rule only, a command that cannot be decided is asked, with why.
        let ask_only = policy(&[], &[], &["Bash(rm *)"], Decision::Allow);
        expect![[r#"
            Ask(
                Call {
                    tool: "Bash",
                    summary: Some(
                        "X=rm; $X -rf target",
                    ),
                    argument: Some(
                        "X=rm; $X -rf target",
                    ),
                },
                Some(
                    "the command could not be decided: the program name is not a literal ($X): write the command literally",
                ),
            )
        "#]]
            .assert_debug_eq(&decide(&ask_only, &command("X=rm; $X -rf target"), None, &s));
    }

    #[test]
    fn names_and_denials() {
        assert_eq!(
            opencode_mcp_name("mcp__nanoclaw__send_message").as_deref(),
            Some("nanoclaw_send_message")
        );
        assert_eq!(opencode_mcp_name("Bash"), None);
        assert_eq!(opencode_mcp_name("mcp__x"), None);
        assert_eq!(mcp_keys("mcp__*", &servers()), ["nanoclaw_*", "github_*"]);
        assert_eq!(mcp_keys("mcp__git*", &servers()), ["github_*"]);
        assert_eq!(
            mcp_keys("mcp__github__create*", &servers()),
            ["github_create*"]
        );
        assert!(mcp_keys("Bash", &servers()).is_empty());
        assert!(is_config_denial(
            "The user has specified a rule which prevents you from using this specific tool call. Here are some of the relevant rules []"
        ));
        assert!(!is_config_denial(
            "The user rejected permission to use this specific tool call."
        ));
    }

    #[test]
    fn the_plugin_names_the_tools() {
        let plugin = approval_stop_plugin(&["nanoclaw_send_message".into()]);
        assert!(
            plugin.contains(r#"new Set(["nanoclaw_send_message"])"#),
            "{plugin}"
        );
        assert!(plugin.contains(r#""tool.execute.after""#), "{plugin}");
        assert!(plugin.contains(r#""chat.params""#), "{plugin}");
    }
}
