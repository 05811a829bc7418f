//! Turn control from the chat and the host (issue 15): the stop command and the host's
//! interrupt row, and `/model NAME` (docs/contract/prompt.md#commands).
//!
//! - A chat message whose whole text is the stop word (`stopCommand`, `/stop`), or a `system`
//!   row `{"action":"interrupt"}` (what `nanoclaw interrupt` writes), stops the running turn
//!   through the CLI's own interrupt. The chat command gets a reply; the host's row does not.
//! - `/model NAME` switches the session's model: `session_state.model`. The previous value is
//!   kept (`model_previous`) until a turn with the new one succeeds, so an unknown name costs
//!   one failed turn, whose error is the reply, and the session goes back to its old model.

use schema::control::{INTERRUPT_ACTION, MODEL_KEY, MODEL_PREVIOUS_KEY};
use schema::{InboundContent, SessionDb};

use crate::progress::ProgressOptions;

/// How turns are stopped and shown to the host (`stopCommand`, `stoppedReply`, `progress`,
/// `progressIntervalSecs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnControlOptions {
    /// The chat text that stops the running turn; empty: no chat command (the host's
    /// interrupt row still works).
    pub stop_word: String,
    /// The reply to the rows of a stopped turn; empty: none.
    pub stopped_reply: String,
    /// Progress rows.
    pub progress: ProgressOptions,
}

impl Default for TurnControlOptions {
    fn default() -> Self {
        Self {
            stop_word: "/stop".to_owned(),
            stopped_reply: "Stopped.".to_owned(),
            progress: ProgressOptions::default(),
        }
    }
}

/// The reply to the stop command when no turn runs.
pub const NOTHING_RUNNING_REPLY: &str = "Nothing is running.";

/// The reply to the rows of a turn ended by its step limit (`maxTurnsPerQuery`); the message
/// blocks it wrote were delivered as they were written.
pub const MAX_TURNS_REPLY: &str =
    "Stopped: this turn reached its step limit (maxTurnsPerQuery). Send a message to go on.";

/// What the runner's own chat and host controls ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TurnCommand {
    /// Stop the running turn; `reply`: a chat command (answered), not the host's row.
    Stop {
        /// Whether the sender expects a reply (the chat command).
        reply: bool,
    },
    /// `/model NAME` (`None`: `/model` alone, which says the current model).
    Model(Option<String>),
}

/// The runner control `content` asks for, if any: the stop word or the host's interrupt row,
/// or `/model`.
pub(crate) fn command_of(content: &InboundContent, stop_word: &str) -> Option<TurnCommand> {
    if let InboundContent::System(value) = content {
        let interrupt = value.get("action").and_then(|a| a.as_str()) == Some(INTERRUPT_ACTION);
        return interrupt.then_some(TurnCommand::Stop { reply: false });
    }
    let text = content.chat_text().map(str::trim)?;
    if !stop_word.is_empty() && text == stop_word {
        return Some(TurnCommand::Stop { reply: true });
    }
    let rest = text.strip_prefix("/model")?;
    if rest.is_empty() {
        return Some(TurnCommand::Model(None));
    }
    // `/models` or `/modelx` are not this command.
    if !rest.starts_with(char::is_whitespace) {
        return None;
    }
    let name = rest.trim();
    // A model name is one word; more is not this command (it goes to the agent).
    (!name.contains(char::is_whitespace)).then(|| TurnCommand::Model(Some(name.to_owned())))
}

/// Switches the session's model to `name`, remembering the one it replaces until a turn
/// confirms the switch; returns the reply.
pub(crate) fn switch_model(db: &SessionDb, name: &str) -> Result<String, schema::Error> {
    let current = db.state(MODEL_KEY)?;
    if current.as_deref() == Some(name) {
        return Ok(format!("The model is already {name}."));
    }
    // An earlier unconfirmed switch keeps the model that last worked as the fallback.
    if db.state(MODEL_PREVIOUS_KEY)?.is_none() {
        db.set_state(MODEL_PREVIOUS_KEY, current.as_deref().unwrap_or(""))?;
    }
    db.set_state(MODEL_KEY, name)?;
    Ok(format!("Model set to {name} for the next turns."))
}

/// The reply to `/model` alone.
pub(crate) fn current_model(db: &SessionDb) -> Result<String, schema::Error> {
    Ok(match db.state(MODEL_KEY)? {
        Some(model) => format!("The model is {model}."),
        None => "The model is the configured default.".to_owned(),
    })
}

/// A turn with the new model succeeded: the switch stands.
pub(crate) fn confirm_model(db: &SessionDb) -> Result<(), schema::Error> {
    db.delete_state(MODEL_PREVIOUS_KEY).map(drop)
}

/// A turn with the new model failed: back to the previous model. Returns (the refused name,
/// the model restored: `None` for the configured one), or `None` when no switch was pending.
pub(crate) fn revert_model(
    db: &SessionDb,
) -> Result<Option<(String, Option<String>)>, schema::Error> {
    let Some(previous) = db.state(MODEL_PREVIOUS_KEY)? else {
        return Ok(None);
    };
    let refused = db.state(MODEL_KEY)?.unwrap_or_default();
    let previous = (!previous.is_empty()).then_some(previous);
    match &previous {
        Some(model) => db.set_state(MODEL_KEY, model)?,
        None => db.delete_state(MODEL_KEY).map(drop)?,
    }
    db.delete_state(MODEL_PREVIOUS_KEY)?;
    Ok(Some((refused, previous)))
}

/// The reply when a turn with a new model failed.
pub(crate) fn model_refused_reply(refused: &str, restored: Option<&str>, error: &str) -> String {
    let back = restored.unwrap_or("the configured default");
    format!("Model {refused} failed: {error}\nThe session keeps {back}.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(text: &str) -> InboundContent {
        InboundContent::parse(&schema::InKind::Chat, &json!({ "text": text }).to_string())
    }

    #[test]
    fn commands_are_whole_messages() {
        assert_eq!(
            command_of(&chat(" /stop \n"), "/stop"),
            Some(TurnCommand::Stop { reply: true })
        );
        assert_eq!(command_of(&chat("/stop now"), "/stop"), None);
        assert_eq!(command_of(&chat("please /stop"), "/stop"), None);
        assert_eq!(
            command_of(&chat("!halt"), "!halt"),
            Some(TurnCommand::Stop { reply: true })
        );
        assert_eq!(
            command_of(&chat("/model  gpt-5 "), "/stop"),
            Some(TurnCommand::Model(Some("gpt-5".into())))
        );
        assert_eq!(
            command_of(&chat("/model"), "/stop"),
            Some(TurnCommand::Model(None))
        );
        assert_eq!(command_of(&chat("/models"), "/stop"), None);
        assert_eq!(command_of(&chat("/model a b"), "/stop"), None);
    }

    #[test]
    fn the_host_interrupt_row_is_a_silent_stop() {
        let row = |content: serde_json::Value| {
            InboundContent::parse(&schema::InKind::System, &content.to_string())
        };
        assert_eq!(
            command_of(&row(json!({ "action": "interrupt" })), "/stop"),
            Some(TurnCommand::Stop { reply: false })
        );
        assert_eq!(
            command_of(&row(json!({ "action": "other" })), "/stop"),
            None
        );
    }

    #[test]
    fn a_refused_model_goes_back_to_the_last_one_that_worked() {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open(dir.path().join("s.db")).unwrap();
        switch_model(&db, "good").unwrap();
        confirm_model(&db).unwrap();
        switch_model(&db, "typo1").unwrap();
        switch_model(&db, "typo2").unwrap();
        let reverted = revert_model(&db).unwrap();
        assert_eq!(reverted, Some(("typo2".into(), Some("good".into()))));
        assert_eq!(db.state(MODEL_KEY).unwrap().as_deref(), Some("good"));
        assert_eq!(revert_model(&db).unwrap(), None);
    }
}
