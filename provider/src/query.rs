//! The query handle shared by the runner (which pushes and reads events) and a provider
//! implementation (which receives controls and sends events).

use tokio::sync::mpsc;

use crate::{ApprovalAnswer, ErrorClass, Prompt, PromptId, ProviderError, ProviderEvent};

/// A control message from the runner to the provider's query task.
#[derive(Debug, Clone, PartialEq)]
pub enum Control {
    /// A follow-up prompt for the active query.
    Push {
        /// Its id (1, 2, ...).
        id: PromptId,
        /// The prompt.
        prompt: Prompt,
    },
    /// No more input: finish the current turn, then close the event stream.
    End,
    /// Stop the current turn now.
    Abort,
    /// End the current turn through the CLI's own interrupt, keeping the process and its
    /// session; answer with [`ProviderEvent::Interrupted`] and close the stream.
    Interrupt,
    /// The answer to the [`crate::ApprovalRequest`] with this id.
    Approval {
        /// The request's id.
        id: String,
        /// The answer.
        answer: ApprovalAnswer,
    },
}

/// Answers the [`crate::ApprovalRequest`]s of one query; cheap to clone, so the task that asks
/// the user can hold one while the runner keeps reading events.
#[derive(Debug, Clone)]
pub struct Approver {
    control: mpsc::UnboundedSender<Control>,
}

impl Approver {
    /// Answers request `id`; false when the query is over (the driver denied it already).
    pub fn answer(&self, id: &str, answer: ApprovalAnswer) -> bool {
        self.control
            .send(Control::Approval {
                id: id.to_owned(),
                answer,
            })
            .is_ok()
    }
}

/// The runner's side of one query.
#[derive(Debug)]
pub struct AgentQuery {
    events: mpsc::Receiver<ProviderEvent>,
    control: mpsc::UnboundedSender<Control>,
    last_prompt: PromptId,
    /// The runner's hint for an authentication error (`ProviderSettings::auth_hint`).
    auth_hint: Option<String>,
}

/// The provider's side of one query.
#[derive(Debug)]
pub struct QueryHandle {
    /// Events to the runner; a send error means the runner dropped the query.
    pub events: mpsc::Sender<ProviderEvent>,
    /// Controls from the runner; `None` means the runner dropped the query (treat as abort).
    pub control: mpsc::UnboundedReceiver<Control>,
}

impl AgentQuery {
    /// Creates a connected pair.
    pub fn channel() -> (AgentQuery, QueryHandle) {
        let (event_tx, event_rx) = mpsc::channel(256);
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        (
            AgentQuery {
                events: event_rx,
                control: control_tx,
                last_prompt: 0,
                auth_hint: None,
            },
            QueryHandle {
                events: event_tx,
                control: control_rx,
            },
        )
    }

    /// Sends a follow-up prompt into the running query; returns its id.
    pub fn push(&mut self, prompt: Prompt) -> Result<PromptId, ProviderError> {
        let id = self.last_prompt + 1;
        self.control
            .send(Control::Push { id, prompt })
            .map_err(|_| ProviderError::Closed)?;
        self.last_prompt = id;
        Ok(id)
    }

    /// Says no more input will come; the event stream closes after the current turn.
    pub fn end(&self) {
        let _ = self.control.send(Control::End);
    }

    /// Stops the current turn.
    pub fn abort(&self) {
        let _ = self.control.send(Control::Abort);
    }

    /// Ends the current turn through the CLI's own interrupt (Claude's `interrupt` control
    /// request, Codex `turn/interrupt`, OpenCode's session abort); the CLI process and its
    /// session survive. The query answers with [`ProviderEvent::Interrupted`] and ends.
    pub fn interrupt(&self) {
        let _ = self.control.send(Control::Interrupt);
    }

    /// A handle that answers this query's [`crate::ApprovalRequest`]s.
    pub fn approver(&self) -> Approver {
        Approver {
            control: self.control.clone(),
        }
    }

    /// Says `hint` instead of the CLI's own advice in the query's authentication errors
    /// ([`crate::driver::classify::explain_auth`]): every provider's errors pass here on their way to
    /// the runner.
    pub fn with_auth_hint(mut self, hint: Option<String>) -> Self {
        self.auth_hint = hint;
        self
    }

    /// The next event; `None` once the query is over.
    pub async fn next_event(&mut self) -> Option<ProviderEvent> {
        let event = self.events.recv().await?;
        Some(match (&self.auth_hint, event) {
            (
                Some(hint),
                ProviderEvent::Error {
                    message,
                    retryable,
                    classification: ErrorClass::Auth,
                    ends_turn,
                    usage,
                },
            ) => ProviderEvent::Error {
                message: crate::driver::classify::explain_auth(&message, hint),
                retryable,
                classification: ErrorClass::Auth,
                ends_turn,
                usage,
            },
            (_, event) => event,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(message: &str, classification: ErrorClass) -> ProviderEvent {
        ProviderEvent::Error {
            message: message.into(),
            retryable: false,
            classification,
            ends_turn: true,
            usage: None,
        }
    }

    #[tokio::test]
    async fn only_authentication_errors_get_the_hint() {
        let (query, handle) = AgentQuery::channel();
        let mut query = query.with_auth_hint(Some("set ANTHROPIC_API_KEY".into()));
        for event in [
            error("Not logged in · Please run /login", ErrorClass::Auth),
            error("Not logged in · Please run /login", ErrorClass::Api),
            ProviderEvent::Output,
        ] {
            handle.events.send(event).await.unwrap();
        }
        assert_eq!(
            query.next_event().await,
            Some(error(
                "Not logged in: set ANTHROPIC_API_KEY",
                ErrorClass::Auth
            ))
        );
        assert_eq!(
            query.next_event().await,
            Some(error("Not logged in · Please run /login", ErrorClass::Api))
        );
        assert_eq!(query.next_event().await, Some(ProviderEvent::Output));
    }
}
