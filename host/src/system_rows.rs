//! The runner's `system` rows a host shows as they are: `progress` (what the agent is doing,
//! to drive a typing indicator), `budget_exceeded` (why rows stay pending) and `tool_decision`
//! (a tool call allowed or refused by the user, the timeout, the policy or a stop), read once
//! here for `watch` and `status` (shapes: docs/contract/host-cli.md#progress-and-budget-rows).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::timefmt::format_duration;
use crate::usage::dollars;

/// A `progress` row's payload: `{"tool","summary","elapsedMs"}` (docs/contract/content.md).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// The tool, in the one vocabulary (`Bash`, `Read`, `Edit`, …, `mcp__<server>__<tool>`);
    /// `None` for a piece of text the agent wrote.
    #[serde(default)]
    pub tool: Option<String>,
    /// The command line (cut to 120 characters), the path, pattern, URL or query; for text,
    /// its first line.
    #[serde(default)]
    pub summary: Option<String>,
    /// How long the turn had run.
    #[serde(default)]
    pub elapsed_ms: Option<u64>,
}

impl Progress {
    /// The payload of a `progress` row of this shape (`None` for other progress rows: those
    /// without `tool`).
    pub fn from_payload(payload: &Value) -> Option<Self> {
        payload.get("tool")?;
        serde_json::from_value(payload.clone()).ok()
    }

    /// `Bash: ls -la`, or `writing: <first line>` for text.
    pub fn text(&self) -> String {
        let mut out = self.tool.clone().unwrap_or_else(|| "writing".to_owned());
        if let Some(summary) = self.summary.as_deref().filter(|s| !s.is_empty()) {
            out.push_str(&format!(": {}", crate::send::excerpt(summary, 120)));
        }
        out
    }

    /// How far into the turn: `12.4s`, `1m 35s`, or `?`.
    pub fn elapsed_text(&self) -> String {
        self.elapsed_ms.map_or_else(|| "?".to_owned(), elapsed)
    }
}

/// `0.4s`, `12.0s`, then `1m 5s`.
fn elapsed(ms: u64) -> String {
    if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        format_duration(i64::try_from(ms / 1000).unwrap_or(i64::MAX))
    }
}

/// A `budget_exceeded` row's payload: `{"limit","spent","max","window","resetsAt"}`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetExceeded {
    /// The config key of the limit (`maxCostUsdPerSession`, `maxCostUsdPerDay`,
    /// `maxTokensPerDay`).
    pub limit: String,
    /// What the window has used.
    #[serde(default)]
    pub spent: Option<f64>,
    /// The limit's value.
    #[serde(default)]
    pub max: Option<f64>,
    /// `session` or `day`.
    #[serde(default)]
    pub window: Option<String>,
    /// When the window ends and service resumes by itself (`None`: only a raised limit
    /// resumes it).
    #[serde(default)]
    pub resets_at: Option<String>,
}

impl BudgetExceeded {
    /// The payload of a `budget_exceeded` row (`None` when it has no `limit`).
    pub fn from_payload(payload: &Value) -> Option<Self> {
        serde_json::from_value(payload.clone()).ok()
    }

    /// `maxCostUsdPerDay: spent $0.0512 of $0.0500 today; service resumes at …`.
    pub fn text(&self) -> String {
        let amount = |value: Option<f64>| match value {
            None => "?".to_owned(),
            Some(value) if self.limit.contains("Cost") => dollars(value),
            Some(value) if self.limit.contains("Tokens") => format!("{value:.0} tokens"),
            Some(value) => format!("{value}"),
        };
        let window = match self.window.as_deref() {
            Some("session") => " in this session".to_owned(),
            Some("day") => " today".to_owned(),
            Some(other) => format!(" (window {other})"),
            None => String::new(),
        };
        let resume = match &self.resets_at {
            Some(at) => format!("service resumes at {at}, or when the limit is raised"),
            None => "service resumes when the limit is raised".to_owned(),
        };
        format!(
            "{}: spent {} of {}{window}; {resume}",
            self.limit,
            amount(self.spent),
            amount(self.max)
        )
    }
}

/// A `tool_decision` row's payload: `{"tool","summary","decision","by"}` (issue 16), and
/// `undecidable` on a decision about a command the policy could not decide (issue 41): a
/// policy deny, or the answer to the question an `ask` rule asked about it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct ToolDecision {
    /// The tool, canonical name.
    pub tool: String,
    /// What the call does (the command line, the path), short.
    #[serde(default)]
    pub summary: Option<String>,
    /// `allow` or `deny`.
    pub decision: String,
    /// `user`, `timeout`, `policy` or `stop`.
    #[serde(default)]
    pub by: Option<String>,
    /// Why the command could not be decided, when that is why the policy refused it or asked
    /// about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undecidable: Option<String>,
}

impl ToolDecision {
    /// The payload of a `tool_decision` row (`None` without `tool` and `decision`).
    pub fn from_payload(payload: &Value) -> Option<Self> {
        serde_json::from_value(payload.clone()).ok()
    }

    /// `Bash: rm -rf target — denied by the user`.
    pub fn text(&self) -> String {
        let mut out = self.tool.clone();
        if let Some(summary) = self.summary.as_deref().filter(|s| !s.is_empty()) {
            out.push_str(&format!(": {}", crate::send::excerpt(summary, 120)));
        }
        let verdict = match self.decision.as_str() {
            "allow" => "allowed",
            "deny" => "denied",
            other => other,
        };
        let by = match self.by.as_deref() {
            Some("user") => " by the user".to_owned(),
            Some("timeout") => ": no answer in time".to_owned(),
            Some("policy") => " by the tool policy".to_owned(),
            Some("stop") => ": the turn was stopped before the answer".to_owned(),
            Some(other) => format!(" (by {other})"),
            None => String::new(),
        };
        let why = match self.undecidable.as_deref() {
            // The runner's reason starts with what the label says already.
            Some(reason) => format!(
                " (not decidable: {})",
                reason
                    .strip_prefix("the command could not be decided: ")
                    .unwrap_or(reason)
            ),
            None => String::new(),
        };
        format!("{out} — {verdict}{by}{why}")
    }
}
