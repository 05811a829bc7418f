//! The one rule for hiding secrets in what is printed: `agent-runner config` (text and JSON) and
//! the `Debug` of settings that hold them (extra MCP servers, the CLI's environment).
//!
//! A value is a secret when its setting is one (the API keys), or when the name it is stored
//! under looks like one: an object member, an environment variable or a header whose name holds
//! any of [`SECRET_WORDS`] (case-insensitive). A command-line argument is one when it follows a
//! flag that looks like one (`--token X`) or is its `=` value (`--api-key=X`); a URL keeps its
//! user name but not its password. A harmless value masked by mistake costs a look at the
//! source; a secret printed in full costs a key rotation, so the words are broad.

use std::collections::BTreeMap;

use serde_json::Value;

/// Words of a name whose value is secret (`GITHUB_TOKEN`, `x-api-key`, `Authorization`,
/// `DB_PASSWORD`, `client_secret`, `COOKIE`, ...).
pub const SECRET_WORDS: &[&str] = &[
    "TOKEN",
    "KEY",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "AUTH",
    "CREDENTIAL",
    "COOKIE",
    "PRIVATE",
];

/// Masks a secret, keeping a hint of its shape (its first 4 characters and its length when it
/// is long enough for that to give nothing away).
pub fn mask(secret: &str) -> String {
    if secret.chars().count() <= 8 {
        "****".into()
    } else {
        let head: String = secret.chars().take(4).collect();
        format!("{head}…**** ({} chars)", secret.chars().count())
    }
}

/// A secret value (a model API key): its `Debug` is [`mask`]ed, so a log line or an error that
/// prints the settings holding it never shows it. [`Secret::expose`] is the only way to read it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&mask(&self.0))
    }
}

/// True when a value stored under `name` is a secret by its name.
pub fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_WORDS.iter().any(|word| upper.contains(word))
}

/// `value` with every secret in it masked: members whose names look secret (whatever their
/// depth), secret arguments in arrays, and passwords in URLs.
pub fn redact_value(value: &Value) -> Value {
    match value {
        Value::Object(members) => Value::Object(
            members
                .iter()
                .map(|(name, value)| {
                    let shown = match value {
                        Value::String(text) if looks_secret(name) => Value::String(mask(text)),
                        Value::Number(n) if looks_secret(name) => {
                            Value::String(mask(&n.to_string()))
                        }
                        other => redact_value(other),
                    };
                    (name.clone(), shown)
                })
                .collect(),
        ),
        Value::Array(items) => {
            let texts: Option<Vec<String>> = items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect();
            match texts {
                Some(args) => {
                    Value::Array(redact_args(&args).into_iter().map(Value::String).collect())
                }
                None => Value::Array(items.iter().map(redact_value).collect()),
            }
        }
        Value::String(text) => Value::String(redact_url(text)),
        other => other.clone(),
    }
}

/// Environment variables (or headers) with the values of secret-looking names masked.
pub fn redact_env(env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    env.iter()
        .map(|(name, value)| {
            let shown = if looks_secret(name) {
                mask(value)
            } else {
                redact_url(value)
            };
            (name.clone(), shown)
        })
        .collect()
}

/// Command-line arguments with secret flag values masked: `--token X`, `--api-key=X`.
pub fn redact_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut secret_next = false;
    for arg in args {
        let shown = if secret_next {
            mask(arg)
        } else if let Some((flag, value)) = arg.split_once('=').filter(|(f, _)| f.starts_with('-'))
        {
            if looks_secret(flag) {
                format!("{flag}={}", mask(value))
            } else {
                format!("{flag}={}", redact_url(value))
            }
        } else {
            redact_url(arg)
        };
        secret_next =
            !secret_next && arg.starts_with('-') && !arg.contains('=') && looks_secret(arg);
        out.push(shown);
    }
    out
}

/// A URL's password masked (`https://user:****@host/`); any other text as it is.
pub fn redact_url(text: &str) -> String {
    let Some(scheme_end) = text.find("://") else {
        return text.to_owned();
    };
    let rest = &text[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return text.to_owned();
    };
    let Some(colon) = rest[..at].find(':') else {
        return text.to_owned();
    };
    format!(
        "{}{}:****{}",
        &text[..scheme_end + 3],
        &rest[..colon],
        &rest[at..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_that_look_secret_are_masked_at_any_depth() {
        let config = json!({
            "github": {
                "command": "npx",
                "args": ["-y", "server-github", "--token", "ghp_abcdefghijklmnop", "--api-key=sk-0123456789", "--verbose"],
                "env": {"GITHUB_TOKEN": "ghp_abcdefghijklmnop", "LOG_LEVEL": "debug", "DB_PASSWORD": "hunter2"},
                "headers": {"Authorization": "Bearer abcdefghijkl", "Accept": "application/json"},
                "url": "https://bot:s3cr3t-pass@gateway.example/v1?x=1"
            }
        });
        let shown = redact_value(&config).to_string();
        for secret in [
            "abcdefghijklmnop",
            "0123456789",
            "hunter2",
            "Bearer abc",
            "s3cr3t",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        expect_test::expect![[r#"{"github":{"args":["-y","server-github","--token","ghp_…**** (20 chars)","--api-key=sk-0…**** (13 chars)","--verbose"],"command":"npx","env":{"DB_PASSWORD":"****","GITHUB_TOKEN":"ghp_…**** (20 chars)","LOG_LEVEL":"debug"},"headers":{"Accept":"application/json","Authorization":"Bear…**** (19 chars)"},"url":"https://bot:****@gateway.example/v1?x=1"}}"#]]
        .assert_eq(&shown);
    }

    #[test]
    fn the_rule_is_by_name_and_broad() {
        for name in [
            "GITHUB_TOKEN",
            "x-api-key",
            "OPENAI_API_KEY",
            "Authorization",
            "client_secret",
            "PGPASSWORD",
            "AWS_SECRET_ACCESS_KEY",
            "Cookie",
            "SSH_PRIVATE_KEY",
            "GOOGLE_APPLICATION_CREDENTIALS",
        ] {
            assert!(looks_secret(name), "{name}");
        }
        for name in ["PATH", "LOG_LEVEL", "API_TIMEOUT_MS", "NO_PROXY", "HOME"] {
            assert!(!looks_secret(name), "{name}");
        }
        assert_eq!(
            redact_url("http://127.0.0.1:8080/v1"),
            "http://127.0.0.1:8080/v1"
        );
        assert_eq!(redact_url("https://user@host/"), "https://user@host/");
        assert_eq!(mask("short"), "****");
    }
}
