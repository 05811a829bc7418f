//! ACP tool calls in the canonical vocabulary: the one table the translation (activity, the
//! transcript) and the permission decisions both read.
//!
//! ACP describes a call by a `kind` (`read`, `edit`, `delete`, `move`, `search`, `execute`,
//! `think`, `fetch`, `other`), a human `title`, the agent's own `rawInput` and the files it
//! touches (`locations`); it has no tool name. So:
//! * a shell command (`rawInput.command`, or kind `execute`) is `Bash` with the command line as
//!   its argument, the same decision as every CLI's shell tool;
//! * an MCP tool of a server the runner configured is `mcp__<server>__<tool>`, found in the
//!   title, the call id or `rawInput.name` in each agent's spelling: `mcp__<s>__<t>` (Qwen),
//!   `mcp_<s>_<t>` (Gemini CLI), `<s>_<t>` (OpenCode), `<t> (<s> MCP Server)` (Gemini titles);
//!   its argument is the compact JSON of `rawInput`;
//! * the other kinds map to `Read`, `Edit`, `Grep`, `WebFetch`/`WebSearch` with the path, the
//!   pattern, the URL or the query as argument; `think` and `other` keep the title (or kind).

use serde_json::Value;

use super::protocol::ToolCall;
use provider::driver::activity::one_line_summary;
use provider::policy::Call;

/// The canonical call of an ACP tool call. `servers`: the MCP servers handed to the agent.
pub(crate) fn call(tool: &ToolCall, servers: &[String]) -> Call {
    let input = tool.raw_input.as_ref();
    let field = |names: &[&str]| -> Option<String> {
        let input = input?;
        names.iter().find_map(|name| match input.get(*name)? {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Array(items) if !items.is_empty() => Some(
                items
                    .iter()
                    .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            _ => None,
        })
    };
    let kind = tool.kind.as_deref().unwrap_or("other");
    if let Some(name) = mcp_name(tool, servers) {
        let argument = input.map(Value::to_string);
        return Call {
            tool: name,
            summary: argument.as_deref().and_then(one_line_summary),
            argument,
        };
    }
    let command = field(&["command", "cmd"]);
    if command.is_some() || kind == "execute" {
        return with_argument("Bash", command);
    }
    let path =
        field(&["file_path", "absolute_path", "filePath", "path", "filename"]).or_else(|| {
            tool.locations
                .as_ref()
                .and_then(|l| l.first())
                .map(|l| l.path.clone())
                .filter(|p| !p.is_empty())
        });
    match kind {
        "read" => with_argument("Read", path),
        "edit" | "delete" | "move" => with_argument("Edit", path),
        "search" => with_argument("Grep", field(&["pattern", "query", "glob"]).or(path)),
        "fetch" => match field(&["url", "urls"]) {
            Some(url) => with_argument("WebFetch", Some(url)),
            None => with_argument("WebSearch", field(&["query", "prompt"])),
        },
        _ => {
            let name = tool
                .title
                .as_deref()
                .and_then(one_line_summary)
                .unwrap_or_else(|| kind.to_owned());
            Call {
                tool: name,
                summary: input
                    .map(Value::to_string)
                    .as_deref()
                    .and_then(one_line_summary),
                argument: input.map(Value::to_string),
            }
        }
    }
}

fn with_argument(tool: &str, argument: Option<String>) -> Call {
    Call {
        tool: tool.to_owned(),
        summary: argument.as_deref().and_then(one_line_summary),
        argument,
    }
}

/// `mcp__<server>__<tool>` when one of the call's names is a tool of a configured server.
fn mcp_name(tool: &ToolCall, servers: &[String]) -> Option<String> {
    let raw_name = tool
        .raw_input
        .as_ref()
        .and_then(|i| i.get("name").or_else(|| i.get("tool_name")))
        .and_then(Value::as_str);
    let candidates = [
        tool.title.as_deref(),
        raw_name,
        Some(tool.tool_call_id.as_str()),
    ];
    candidates
        .into_iter()
        .flatten()
        .find_map(|text| mcp_in(text.trim(), servers))
}

fn mcp_in(text: &str, servers: &[String]) -> Option<String> {
    // Gemini CLI's title: `send_message (nanoclaw MCP Server)`.
    if let Some((tool, rest)) = text.split_once(" (") {
        if let Some(server) = rest.strip_suffix(" MCP Server)") {
            if servers.iter().any(|s| s == server) && is_tool_name(tool) {
                return Some(format!("mcp__{server}__{tool}"));
            }
        }
    }
    let word = text.split_whitespace().next()?;
    for server in servers {
        for prefix in [
            format!("mcp__{server}__"),
            format!("mcp_{server}_"),
            format!("{server}__"),
            format!("{server}_"),
        ] {
            if let Some(rest) = word.strip_prefix(&prefix) {
                // A call id appends `-<digits>` (Gemini CLI, Qwen Code).
                let tool = match rest.rsplit_once('-') {
                    Some((tool, n)) if n.chars().all(|c| c.is_ascii_digit()) => tool,
                    _ => rest,
                };
                if is_tool_name(tool) {
                    return Some(format!("mcp__{server}__{tool}"));
                }
            }
        }
    }
    None
}

fn is_tool_name(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use serde_json::json;

    fn judge(tool: Value) -> String {
        let tool: ToolCall = serde_json::from_value(tool).unwrap();
        let call = call(&tool, &["nanoclaw".to_owned(), "github".to_owned()]);
        format!("{} {:?} {:?}", call.tool, call.argument, call.summary)
    }

    #[test]
    fn acp_tool_calls_in_canonical_names() {
        let cases = [
            json!({"toolCallId": "run_shell_command-1", "kind": "execute", "title": "ls -la",
                   "rawInput": {"command": "ls -la\necho hi", "description": "list"}}),
            json!({"toolCallId": "a", "kind": "execute", "title": "bash"}),
            json!({"toolCallId": "b", "kind": "other", "title": "bash",
                   "rawInput": {"command": ["git", "status"]}}),
            json!({"toolCallId": "c", "kind": "read", "title": "read",
                   "locations": [{"path": "/workspace/agent/a.txt"}]}),
            json!({"toolCallId": "d", "kind": "edit", "rawInput": {"file_path": "x.rs"}}),
            json!({"toolCallId": "e", "kind": "search", "rawInput": {"pattern": "fn main"}}),
            json!({"toolCallId": "f", "kind": "fetch", "rawInput": {"url": "https://x.test/"}}),
            json!({"toolCallId": "g", "kind": "fetch", "rawInput": {"query": "rust acp"}}),
            json!({"toolCallId": "mcp_nanoclaw_send_message-17", "kind": "other",
                   "title": "Send a message", "rawInput": {"text": "hi"}}),
            json!({"toolCallId": "h", "kind": "other", "title": "send_message (nanoclaw MCP Server)",
                   "rawInput": {"text": "hi"}}),
            json!({"toolCallId": "i", "kind": "other", "title": "nanoclaw_send_message",
                   "rawInput": {"text": "hi"}}),
            json!({"toolCallId": "j", "kind": "other", "title": "tool_call",
                   "rawInput": {"name": "mcp__github__create_issue", "arguments": {}}}),
            json!({"toolCallId": "k", "kind": "think", "title": "Thinking"}),
            json!({"toolCallId": "l", "kind": "other", "title": "unknown_server_tool"}),
        ];
        let judged: Vec<String> = cases.into_iter().map(judge).collect();
        expect![[r#"
            Bash Some("ls -la\necho hi") Some("ls -la")
            Bash None None
            Bash Some("git status") Some("git status")
            Read Some("/workspace/agent/a.txt") Some("/workspace/agent/a.txt")
            Edit Some("x.rs") Some("x.rs")
            Grep Some("fn main") Some("fn main")
            WebFetch Some("https://x.test/") Some("https://x.test/")
            WebSearch Some("rust acp") Some("rust acp")
            mcp__nanoclaw__send_message Some("{\"text\":\"hi\"}") Some("{\"text\":\"hi\"}")
            mcp__nanoclaw__send_message Some("{\"text\":\"hi\"}") Some("{\"text\":\"hi\"}")
            mcp__nanoclaw__send_message Some("{\"text\":\"hi\"}") Some("{\"text\":\"hi\"}")
            mcp__github__create_issue Some("{\"arguments\":{},\"name\":\"mcp__github__create_issue\"}") Some("{\"arguments\":{},\"name\":\"mcp__github__create_issue\"}")
            Thinking None None
            unknown_server_tool None None"#]]
        .assert_eq(&judged.join("\n"));
    }
}
