//! The query handle shared by the runner (which pushes and reads events) and a provider
//! implementation (which receives controls and sends events).

use tokio::sync::mpsc;

use crate::{Prompt, PromptId, ProviderError, ProviderEvent};

/// A control message from the runner to the provider's query task.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Control {
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
}

/// The runner's side of one query.
#[derive(Debug)]
pub struct AgentQuery {
    events: mpsc::Receiver<ProviderEvent>,
    control: mpsc::UnboundedSender<Control>,
    last_prompt: PromptId,
}

/// The provider's side of one query.
#[derive(Debug)]
pub(crate) struct QueryHandle {
    /// Events to the runner; a send error means the runner dropped the query.
    pub(crate) events: mpsc::Sender<ProviderEvent>,
    /// Controls from the runner; `None` means the runner dropped the query (treat as abort).
    pub(crate) control: mpsc::UnboundedReceiver<Control>,
}

impl AgentQuery {
    /// Creates a connected pair.
    pub(crate) fn channel() -> (AgentQuery, QueryHandle) {
        let (event_tx, event_rx) = mpsc::channel(256);
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        (
            AgentQuery {
                events: event_rx,
                control: control_tx,
                last_prompt: 0,
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

    /// The next event; `None` once the query is over.
    pub async fn next_event(&mut self) -> Option<ProviderEvent> {
        self.events.recv().await
    }
}
