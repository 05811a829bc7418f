//! The wire types of the session API (docs/contract/api.md): request bodies and queries, the
//! error body, the session list, the SSE status event, and the header names. `nanoclaw serve`
//! (`crate::serve`) and the client (`nanoclaw --url`) share them, so both sides build to one
//! shape. Responses are the report structs of the library (`Sent`, `StatusReport`, …): the same
//! objects as the CLI's `--json`.
//!
//! Request bodies refuse unknown fields (a typo is an error, never a silently dropped flag);
//! response-side types here tolerate them (a newer server may add fields).

mod bodies;
mod errors;
mod events;

pub use bodies::{
    AnswerBody, DeliveredBody, DeliveredReport, DeliveryStatus, DestinationBody, EventsQuery,
    HealthQuery, InitBody, QuoteBody, RoutingBody, SendBody, SendKindBody, SweepBody, UsageQuery,
};
pub use errors::{ErrorBody, ErrorCode, ErrorDetail};
pub use events::{SessionItem, SessionList, StatusEvent};

/// Request header carrying a client's idempotency key (1 to 255 visible ASCII characters).
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// Response header set to `true` on a replayed idempotent request.
pub const IDEMPOTENT_REPLAYED: &str = "Idempotent-Replayed";
/// The SSE header a reconnecting client resumes from (the last `id:` it saw).
pub const LAST_EVENT_ID: &str = "Last-Event-ID";
/// The API's path prefix.
pub const PREFIX: &str = "/v1";

/// True when `name` is a valid session name: `[A-Za-z0-9._-]{1,64}`, not `.` or `..`. A name is
/// never a path.
pub fn valid_session_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// True when `key` is a valid `Idempotency-Key`: 1 to 255 visible ASCII characters.
pub fn valid_idempotency_key(key: &str) -> bool {
    (1..=255).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_names() {
        for good in ["a", "main", "team-1.prod_x", &"x".repeat(64)] {
            assert!(valid_session_name(good), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a\0b", "é", "a b", &"x".repeat(65)] {
            assert!(!valid_session_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn idempotency_keys() {
        assert!(valid_idempotency_key("3f2a-XYZ_1"));
        assert!(!valid_idempotency_key(""));
        assert!(!valid_idempotency_key("a b"));
        assert!(!valid_idempotency_key(&"k".repeat(256)));
    }
}
