//! The policy's vocabulary (a decision, a rule, the policy's fields) and the glob a pattern is
//! matched with: what the judge (`policy.rs`) and the JSON reader (`json.rs`) both build on, so
//! neither imports the other. What a rule means is decided in `policy.rs`.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What happens to a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// The call runs.
    Allow,
    /// The call is refused; the model receives the refusal.
    Deny,
    /// The user is asked in the chat (Approve / Deny); no answer in time is a deny.
    Ask,
}

impl Decision {
    /// `allow`, `deny` or `ask`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Ask => "ask",
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the policy says about one call, with why when the command could not be decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// What happens to the call.
    pub decision: Decision,
    /// Set when the line was not decidable: the reason, for the model and the `tool_decision`
    /// row (e.g. "the program name is not a literal ($X): write the command literally").
    pub undecidable: Option<String>,
}

impl Verdict {
    /// A decided call.
    pub fn decided(decision: Decision) -> Self {
        Self {
            decision,
            undecidable: None,
        }
    }
}

/// A rule that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool rule {rule:?}: {reason} (expected Name or Name(pattern), e.g. Bash(git push*) or mcp__github__*)")]
pub struct RuleError {
    /// The rule as written.
    pub rule: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// One entry of `allow`, `deny` or `ask`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ToolRule {
    /// The canonical tool name, or a prefix followed by `*`.
    pub tool: String,
    /// The argument glob, when the rule has one.
    pub pattern: Option<String>,
}

impl ToolRule {
    /// Reads `Name` or `Name(pattern)`.
    pub fn parse(rule: &str) -> Result<Self, RuleError> {
        let error = |reason| RuleError {
            rule: rule.to_owned(),
            reason,
        };
        let trimmed = rule.trim();
        let (tool, pattern) = match trimmed.find('(') {
            None => (trimmed, None),
            Some(open) => {
                let Some(inner) = trimmed[open + 1..].strip_suffix(')') else {
                    return Err(error("the pattern must end with `)`"));
                };
                (&trimmed[..open], Some(inner.to_owned()))
            }
        };
        if tool.is_empty() {
            return Err(error("no tool name"));
        }
        let name_chars = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        let stem = tool.strip_suffix('*').unwrap_or(tool);
        if !stem.chars().all(name_chars) {
            return Err(error(
                "a tool name has letters, digits, `_`, `-` or `.`, and at most a final `*`",
            ));
        }
        if pattern.as_deref().is_some_and(|p| p.trim().is_empty()) {
            return Err(error(
                "an empty pattern (leave out the parentheses instead)",
            ));
        }
        Ok(Self {
            tool: tool.to_owned(),
            pattern,
        })
    }

    /// Whether the rule names `tool` (ignoring its pattern).
    pub fn names(&self, tool: &str) -> bool {
        match self.tool.strip_suffix('*') {
            Some(prefix) => tool.starts_with(prefix),
            None => self.tool == tool,
        }
    }

    /// Whether the rule's pattern matches `argument` (a rule without one matches everything).
    /// An unknown argument matches nothing but a rule without a pattern.
    pub fn matches_argument(&self, argument: Option<&str>) -> bool {
        match (&self.pattern, argument) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(pattern), Some(argument)) => glob_matches(pattern, argument.trim()),
        }
    }
}

impl fmt::Display for ToolRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pattern {
            Some(pattern) => write!(f, "{}({pattern})", self.tool),
            None => f.write_str(&self.tool),
        }
    }
}

impl Serialize for ToolRule {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ToolRule {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// The default of `askTimeoutSeconds`.
pub const DEFAULT_ASK_TIMEOUT: Duration = Duration::from_secs(300);

/// The whole policy. [`Default`] allows everything (the behaviour before policies existed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPolicy {
    /// Calls that run without asking.
    pub allow: Vec<ToolRule>,
    /// Calls that are refused.
    pub deny: Vec<ToolRule>,
    /// Calls the user approves in the chat.
    pub ask: Vec<ToolRule>,
    /// What a call no rule matches gets (`allow` unless set).
    pub default: Decision,
    /// How long an `ask` waits for the answer; then it is a deny.
    pub ask_timeout: Duration,
    /// The directory relative paths of `Read`/`Write`/`Edit` calls are taken from and path
    /// patterns are relative to; `None`: paths are matched as given, normalised lexically.
    pub workspace: Option<PathBuf>,
}

impl Default for ToolPolicy {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            deny: Vec::new(),
            ask: Vec::new(),
            default: Decision::Allow,
            ask_timeout: DEFAULT_ASK_TIMEOUT,
            workspace: None,
        }
    }
}

/// `*` matches any run of characters; `X:*` at the end is `X` alone or `X <anything>`.
pub(super) fn glob_matches(pattern: &str, text: &str) -> bool {
    if let Some(stem) = pattern.strip_suffix(":*") {
        return text == stem || glob_matches(&format!("{stem} *"), text);
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, rest) = match parts.split_first() {
        Some(split) => split,
        None => return text.is_empty(),
    };
    let Some(mut remaining) = text.strip_prefix(first) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        return remaining.is_empty();
    };
    for part in middle {
        match remaining.find(part) {
            Some(at) => remaining = &remaining[at + part.len()..],
            None => return false,
        }
    }
    remaining.len() >= last.len() && remaining.ends_with(last)
}
