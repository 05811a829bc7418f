//! The tool settings (`toolPolicy`, `approvalStopTools`, `elicitation`): shapes the field
//! table cannot check. `toolPolicy`'s form belongs to its type
//! ([`ToolPolicy::from_json`]); this module adds where the value came from.

use anyhow::{bail, Context, Result};
use provider::{ElicitationMode, ToolPolicy};

use super::values::Values;

/// `toolPolicy`; unset: everything runs.
pub(super) fn tool_policy(values: &Values) -> Result<ToolPolicy> {
    let Some(value) = values.object("toolPolicy") else {
        return Ok(ToolPolicy::default());
    };
    ToolPolicy::from_json(&value)
        .with_context(|| format!("toolPolicy ({})", values.source_of("toolPolicy")))
}

/// `approvalStopTools`: canonical MCP tool names, `mcp__<server>__<tool>`, no wildcards (the
/// drivers compare names exactly).
pub(super) fn approval_stop_tools(values: &Values) -> Result<Vec<String>> {
    let names = values.list("approvalStopTools");
    let name_chars = |part: &str| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    };
    for name in &names {
        let well_formed = name
            .strip_prefix("mcp__")
            .and_then(|rest| rest.split_once("__"))
            .is_some_and(|(server, tool)| name_chars(server) && name_chars(tool));
        if !well_formed {
            bail!(
                "approvalStopTools ({}): {name:?} is not an MCP tool name; expected \
                 mcp__<server>__<tool>, e.g. mcp__nanoclaw__send_message (no wildcards)",
                values.source_of("approvalStopTools")
            );
        }
    }
    Ok(names)
}

/// `elicitation`: `decline` or `ask`.
pub(super) fn elicitation(values: &Values) -> Result<ElicitationMode> {
    match values.text("elicitation").as_deref().map(str::trim) {
        None | Some("decline") => Ok(ElicitationMode::Decline),
        Some("ask") => Ok(ElicitationMode::Ask),
        Some(other) => bail!(
            "elicitation ({}) = {other:?}: expected decline or ask",
            values.source_of("elicitation")
        ),
    }
}
