//! The one set of rules that turns a failed model call into an [`ErrorClass`].
//!
//! Each CLI reports API failures in its own shape (Claude's `api_error_status` and result text,
//! Codex's `httpStatusCode` and message, OpenCode's `APIError` with response headers); its
//! `translate.rs` reads that shape and calls [`classify`] with what the wire gave: an HTTP
//! status, an error text and a retry-after. What is decided here is the same for every CLI:
//!
//! * A status decides first: 401/403 `Auth`, 402 `Quota`, 429 `RateLimited` (or `Quota` when the
//!   text says the quota or credit is exhausted: OpenAI sends `insufficient_quota` as a 429),
//!   anything else `Api`.
//! * Without a status the text decides, in this order: an exhausted quota, a rate limit, an
//!   authentication failure.
//! * Nothing recognised: `None`, and the CLI picks its fallback (its wire says what an
//!   unrecognised error usually is).

use crate::ErrorClass;

/// Words of an exhausted quota or credit (not a passing rate limit).
const QUOTA_WORDS: &[&str] = &["quota", "billing", "insufficient", "credit"];
/// Words of a temporary rate limit.
const RATE_LIMIT_WORDS: &[&str] = &["429", "rate limit", "rate_limit", "too many requests"];
/// Words of an authentication failure.
const AUTH_WORDS: &[&str] = &[
    "401",
    "403",
    "unauthorized",
    "forbidden",
    "authenticat",
    "not logged in",
    "invalid api key",
    "/login",
];

/// The CLIs' advice to an interactive user, which a runner's user cannot follow (there is no
/// terminal to log in from): Claude's "Not logged in · Please run /login" and "Invalid API key ·
/// Please run /login". Lower case; cut from the message with what precedes it on its line.
const INTERACTIVE_ADVICE: &[&str] = &["please run /login", "run /login"];

/// An authentication error's `message` as the user should read it: the CLI's interactive advice
/// cut, and the runner's `hint` (which setting provides the key) after what the CLI said.
pub fn explain_auth(message: &str, hint: &str) -> String {
    let lower = message.to_lowercase();
    let cut = INTERACTIVE_ADVICE
        .iter()
        .filter_map(|advice| lower.find(advice))
        .min()
        // `to_lowercase` keeps byte offsets for ASCII; a message where it does not is kept whole.
        .filter(|at| message.is_char_boundary(*at))
        .map_or(message, |at| &message[..at]);
    let said =
        cut.trim_end_matches(|c: char| c.is_whitespace() || matches!(c, '·' | '.' | ':' | '-'));
    if said.is_empty() {
        hint.to_owned()
    } else {
        format!("{said}: {hint}")
    }
}

/// Classifies a failed model call from what the CLI's wire said about it: the upstream HTTP
/// `status`, the error `text` and, for a rate limit, `retry_after_secs`. `None` when neither the
/// status nor the text is recognised.
pub fn classify(
    status: Option<u16>,
    text: &str,
    retry_after_secs: Option<u64>,
) -> Option<ErrorClass> {
    let lower = text.to_lowercase();
    let says = |words: &[&str]| words.iter().any(|word| lower.contains(word));
    let rate_limited = ErrorClass::RateLimited { retry_after_secs };
    match status {
        Some(401 | 403) => Some(ErrorClass::Auth),
        Some(402) => Some(ErrorClass::Quota),
        Some(429) if says(QUOTA_WORDS) => Some(ErrorClass::Quota),
        Some(429) => Some(rate_limited),
        Some(_) => Some(ErrorClass::Api),
        None if says(QUOTA_WORDS) => Some(ErrorClass::Quota),
        None if says(RATE_LIMIT_WORDS) => Some(rate_limited),
        None if says(AUTH_WORDS) => Some(ErrorClass::Auth),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A case: status, text and retry-after in, the class out.
    type Case<'a> = (Option<u16>, &'a str, Option<u64>, Option<ErrorClass>);

    #[test]
    fn one_table_for_every_cli() {
        let limited = |secs| ErrorClass::RateLimited {
            retry_after_secs: secs,
        };
        let cases: &[Case] = &[
            // A status decides, whatever the text says.
            (Some(401), "", None, Some(ErrorClass::Auth)),
            (Some(403), "rate limit", None, Some(ErrorClass::Auth)),
            (Some(402), "", None, Some(ErrorClass::Quota)),
            (
                Some(429),
                "Too Many Requests",
                Some(7),
                Some(limited(Some(7))),
            ),
            (Some(429), "", None, Some(limited(None))),
            (
                Some(429),
                "You exceeded your current quota, please check your plan and billing details.",
                Some(7),
                Some(ErrorClass::Quota),
            ),
            (Some(500), "quota", None, Some(ErrorClass::Api)),
            (
                Some(400),
                "Your credit balance is too low",
                None,
                Some(ErrorClass::Api),
            ),
            // Without a status: quota before rate limit before authentication.
            (
                None,
                "insufficient_quota (429)",
                None,
                Some(ErrorClass::Quota),
            ),
            (
                None,
                "Credit balance is too low",
                None,
                Some(ErrorClass::Quota),
            ),
            (
                None,
                "exceeded retry limit, last status: 429 Too Many Requests",
                Some(3),
                Some(limited(Some(3))),
            ),
            (None, "rate_limit_exceeded", None, Some(limited(None))),
            (None, "Rate limit reached", None, Some(limited(None))),
            (None, "401 Unauthorized", None, Some(ErrorClass::Auth)),
            (None, "Forbidden", None, Some(ErrorClass::Auth)),
            (
                None,
                "Invalid API key · Please run /login",
                None,
                Some(ErrorClass::Auth),
            ),
            (None, "Not logged in", None, Some(ErrorClass::Auth)),
            (None, "authentication_error", None, Some(ErrorClass::Auth)),
            // Nothing recognised: the CLI's own fallback applies.
            (None, "stream disconnected", None, None),
            (None, "", None, None),
        ];
        for (status, text, retry_after, class) in cases {
            assert_eq!(
                classify(*status, text, *retry_after),
                *class,
                "{status:?} {text:?} {retry_after:?}"
            );
        }
    }

    /// The texts each real CLI gave without a key (Claude refuses before any request; Codex and
    /// OpenCode send none and get the gateway's 401), captured against the fake model.
    #[test]
    fn auth_errors_say_which_setting_provides_the_key() {
        let hint = "no API key reached the claude CLI: set ANTHROPIC_API_KEY";
        let cases = [
            (
                "Not logged in · Please run /login",
                "Not logged in: no API key reached the claude CLI: set ANTHROPIC_API_KEY",
            ),
            (
                "Invalid API key · Please run /login",
                "Invalid API key: no API key reached the claude CLI: set ANTHROPIC_API_KEY",
            ),
            (
                "unexpected status 401 Unauthorized: Missing bearer or basic authentication in \
                 header, url: http://127.0.0.1:43805/v1/responses",
                "unexpected status 401 Unauthorized: Missing bearer or basic authentication in \
                 header, url: http://127.0.0.1:43805/v1/responses: no API key reached the claude \
                 CLI: set ANTHROPIC_API_KEY",
            ),
            (
                "APIError 401: Missing bearer or basic authentication in header",
                "APIError 401: Missing bearer or basic authentication in header: no API key \
                 reached the claude CLI: set ANTHROPIC_API_KEY",
            ),
            ("Please run /login", hint),
        ];
        for (cli, shown) in cases {
            assert_eq!(classify(None, cli, None), Some(ErrorClass::Auth), "{cli}");
            assert_eq!(explain_auth(cli, hint), shown);
        }
    }
}
