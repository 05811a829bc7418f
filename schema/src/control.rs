//! Turn control from the host: the interrupt row `nanoclaw interrupt` writes and the runner
//! recognises, and the session's model chosen by `/model` (docs/contract/host-cli.md#interrupt).

use serde_json::Value;

use crate::rows::{Inserted, NewMessageIn};
use crate::{Error, SessionDb};

/// The `action` of a host's interrupt row (`messages_in`, kind `system`).
pub const INTERRUPT_ACTION: &str = "interrupt";

/// The `session_state` key holding the model `/model NAME` chose (absent: the configured one).
pub const MODEL_KEY: &str = "model";

/// The `session_state` key of the model before an unconfirmed `/model` (empty: the configured
/// one): the runner restores it when a turn with the new model fails.
pub const MODEL_PREVIOUS_KEY: &str = "model_previous";

/// The interrupt row: kind `system`, trigger 1, content `{"action":"interrupt"}`, no routing
/// (the runner answers it with no reply).
pub fn interrupt_row() -> NewMessageIn {
    NewMessageIn::new(
        "system",
        serde_json::json!({ "action": INTERRUPT_ACTION }).to_string(),
    )
}

/// Whether a `messages_in` row of `kind` with `content` is an interrupt.
pub fn is_interrupt(kind: &str, content: &str) -> bool {
    kind == "system"
        && serde_json::from_str::<Value>(content)
            .ok()
            .and_then(|value| value.get("action")?.as_str().map(|a| a == INTERRUPT_ACTION))
            .unwrap_or(false)
}

impl SessionDb {
    /// Writes an interrupt row: the runner ends its active turn (or completes the row at once
    /// when idle).
    pub fn insert_interrupt(&self) -> Result<Inserted, Error> {
        self.insert_in(&interrupt_row())
    }

    /// The model `/model` chose for this session, when one is set.
    pub fn session_model(&self) -> Result<Option<String>, Error> {
        self.state(MODEL_KEY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interrupt_row_is_recognised_and_nothing_else_is() {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open(dir.path().join("session.db")).unwrap();
        let inserted = db.insert_interrupt().unwrap();
        let row = db.message_in(&inserted.id).unwrap().unwrap();
        assert_eq!((row.kind.as_str(), row.trigger), ("system", true));
        assert_eq!(row.content, r#"{"action":"interrupt"}"#);
        assert!(is_interrupt(&row.kind, &row.content));
        assert!(!is_interrupt("chat", &row.content));
        assert!(!is_interrupt("system", r#"{"action":"question_response"}"#));
        assert!(!is_interrupt("system", "not json"));
        assert_eq!(db.session_model().unwrap(), None);
        db.set_state(MODEL_KEY, "gpt-5").unwrap();
        assert_eq!(db.session_model().unwrap().as_deref(), Some("gpt-5"));
    }
}
