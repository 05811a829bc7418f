//! The written form of a policy (config `toolPolicy`, docs/contract/config.md): the one reader
//! of that JSON, next to the type it builds, so the runner's configuration and the policy never
//! disagree on a key or a bound.

use std::time::Duration;

use serde_json::Value;

use super::types::{Decision, RuleError, ToolPolicy, ToolRule};

/// The longest `askTimeoutSeconds`: 24 days. Claude and OpenCode run on Node, whose timers hold
/// at most 2^31-1 ms (24.8 days); the runner's timer settings share this bound.
pub const MAX_ASK_TIMEOUT_SECS: u64 = 24 * 86_400;

/// The form of a policy, named in errors.
const EXPECTED: &str = "expected {\"allow\": [rules], \"deny\": [rules], \"ask\": [rules], \
                        \"default\": \"allow\"|\"deny\"|\"ask\", \"askTimeoutSeconds\": seconds}";

/// A `toolPolicy` that cannot be read; each names the key (and the list's index) and the form.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The policy is not a JSON object.
    #[error("{EXPECTED}")]
    NotAnObject,
    /// `allow`, `deny` or `ask` is not a list.
    #[error("{key} must be a list of rules, got {value}")]
    NotAList {
        /// `allow`, `deny` or `ask`.
        key: String,
        /// What was written.
        value: Value,
    },
    /// An entry of a list is not text.
    #[error("{key}[{index}] must be a rule as text, got {item}")]
    NotText {
        /// `allow`, `deny` or `ask`.
        key: String,
        /// The entry's position.
        index: usize,
        /// What was written.
        item: Value,
    },
    /// An entry of a list is not a rule ([`ToolRule::parse`]).
    #[error("{key}[{index}]")]
    Rule {
        /// `allow`, `deny` or `ask`.
        key: String,
        /// The entry's position.
        index: usize,
        /// Why the rule cannot be read.
        #[source]
        source: RuleError,
    },
    /// `default` is not one of the three decisions.
    #[error("default must be \"allow\", \"deny\" or \"ask\", got {0}")]
    Default(Value),
    /// `askTimeoutSeconds` is not a whole number of seconds in range.
    #[error(
        "askTimeoutSeconds must be a whole number of seconds from 1 to {MAX_ASK_TIMEOUT_SECS}, \
         got {0}"
    )]
    AskTimeout(Value),
    /// A key the policy does not have.
    #[error("unknown key {0:?}; {EXPECTED}")]
    UnknownKey(String),
}

impl ToolPolicy {
    /// Reads a policy as written in config `toolPolicy`: `{"allow": [rules], "deny": [rules],
    /// "ask": [rules], "default": "allow"|"deny"|"ask", "askTimeoutSeconds": seconds}`, every
    /// key optional (an empty object is [`ToolPolicy::default`]); each rule read by
    /// [`ToolRule::parse`].
    pub fn from_json(value: &Value) -> Result<Self, PolicyError> {
        let Value::Object(map) = value else {
            return Err(PolicyError::NotAnObject);
        };
        let mut policy = ToolPolicy::default();
        for (key, value) in map {
            match key.as_str() {
                "allow" => policy.allow = rules(key, value)?,
                "deny" => policy.deny = rules(key, value)?,
                "ask" => policy.ask = rules(key, value)?,
                "default" => {
                    policy.default = match value.as_str() {
                        Some("allow") => Decision::Allow,
                        Some("deny") => Decision::Deny,
                        Some("ask") => Decision::Ask,
                        _ => return Err(PolicyError::Default(value.clone())),
                    }
                }
                "askTimeoutSeconds" => {
                    let secs = value
                        .as_u64()
                        .filter(|secs| (1..=MAX_ASK_TIMEOUT_SECS).contains(secs))
                        .ok_or_else(|| PolicyError::AskTimeout(value.clone()))?;
                    policy.ask_timeout = Duration::from_secs(secs);
                }
                other => return Err(PolicyError::UnknownKey(other.to_owned())),
            }
        }
        Ok(policy)
    }
}

/// The list `key` (`allow`, `deny` or `ask`): every entry a rule as text.
fn rules(key: &str, value: &Value) -> Result<Vec<ToolRule>, PolicyError> {
    let Some(items) = value.as_array() else {
        return Err(PolicyError::NotAList {
            key: key.to_owned(),
            value: value.clone(),
        });
    };
    let mut rules = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let Some(text) = item.as_str() else {
            return Err(PolicyError::NotText {
                key: key.to_owned(),
                index,
                item: item.clone(),
            });
        };
        rules.push(ToolRule::parse(text).map_err(|source| PolicyError::Rule {
            key: key.to_owned(),
            index,
            source,
        })?);
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error with its causes, as the runner prints it.
    fn chain(err: &PolicyError) -> String {
        let mut text = err.to_string();
        let mut source = std::error::Error::source(err);
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        text
    }

    #[test]
    fn a_written_policy_is_read_whole() {
        let policy = ToolPolicy::from_json(&serde_json::json!({
            "allow": ["Read"], "deny": ["Bash(rm *)"], "ask": ["Bash", "mcp__github__*"],
            "default": "deny", "askTimeoutSeconds": 30
        }))
        .unwrap();
        let rule = |text: &str| ToolRule::parse(text).unwrap();
        assert_eq!(
            policy,
            ToolPolicy {
                allow: vec![rule("Read")],
                deny: vec![rule("Bash(rm *)")],
                ask: vec![rule("Bash"), rule("mcp__github__*")],
                default: Decision::Deny,
                ask_timeout: Duration::from_secs(30),
                workspace: None,
            }
        );
        let empty = ToolPolicy::from_json(&serde_json::json!({})).unwrap();
        assert_eq!(empty, ToolPolicy::default());
    }

    #[test]
    fn a_bad_policy_names_the_key_the_index_and_the_form() {
        let cases = [
            (serde_json::json!(["Bash"]), "expected {\"allow\": [rules]"),
            (
                serde_json::json!({"deny": ["Bash(rm *"]}),
                "deny[0]: tool rule \"Bash(rm *\": the pattern must end with `)`",
            ),
            (
                serde_json::json!({"ask": ["Bash", 7]}),
                "ask[1] must be a rule as text, got 7",
            ),
            (
                serde_json::json!({"allow": "Bash"}),
                "allow must be a list of rules, got \"Bash\"",
            ),
            (
                serde_json::json!({"default": "maybe"}),
                "default must be \"allow\", \"deny\" or \"ask\", got \"maybe\"",
            ),
            (
                serde_json::json!({"askTimeoutSeconds": MAX_ASK_TIMEOUT_SECS + 1}),
                "askTimeoutSeconds must be a whole number of seconds from 1 to 2073600, got \
                 2073601",
            ),
            (
                serde_json::json!({"asks": []}),
                "unknown key \"asks\"; expected {\"allow\"",
            ),
        ];
        for (value, expected) in cases {
            let err = ToolPolicy::from_json(&value).unwrap_err();
            assert!(
                chain(&err).starts_with(expected),
                "{value}: {}",
                chain(&err)
            );
        }
    }
}
