//! OpenCode's tools in the canonical vocabulary: the one table of names and argument fields that
//! the translation (activity, denials) and the permission glue both read, kept below both.

/// OpenCode's tool name in the canonical vocabulary: its builtins by their Claude names, an MCP
/// server's `<server>_<tool>` as `mcp__<server>__<tool>`; other builtins keep their name.
pub(super) fn canonical_tool(name: &str, mcp_servers: &[String]) -> String {
    let builtin = match name {
        "bash" => "Bash",
        "read" => "Read",
        "write" => "Write",
        "edit" => "Edit",
        "glob" => "Glob",
        "grep" => "Grep",
        "webfetch" => "WebFetch",
        "websearch" => "WebSearch",
        _ => "",
    };
    if !builtin.is_empty() {
        return builtin.to_owned();
    }
    for server in mcp_servers {
        if let Some(tool) = name
            .strip_prefix(server.as_str())
            .and_then(|rest| rest.strip_prefix('_'))
            .filter(|tool| !tool.is_empty())
        {
            return format!("mcp__{server}__{tool}");
        }
    }
    name.to_owned()
}

/// The argument field of an OpenCode builtin `tool` that says what the call works on (the
/// command line, the path, the pattern, the URL or the query): the one table for activity
/// summaries and the tool policy's argument.
pub(super) fn argument_field(tool: &str) -> Option<&'static str> {
    Some(match tool {
        "bash" => "command",
        "read" | "write" | "edit" => "filePath",
        "glob" | "grep" => "pattern",
        "webfetch" => "url",
        "websearch" => "query",
        _ => return None,
    })
}
