//! The turn's last provider event, kept in memory as events come and written to
//! `runner_state.last_event` with the heartbeat: `status` shows it and `health` measures a turn's
//! silence from it, without a DB write per event.

use std::sync::{Mutex, PoisonError};

use chrono::{DateTime, Utc};
use provider::ProviderEvent;
use schema::LastEvent;

/// What the last event was; text is built only when the heartbeat writes it.
#[derive(Debug, Clone)]
enum What {
    Init,
    Result,
    Output,
    Tool(String),
    ToolEnded(usize),
    Activity,
    /// An approval question about this tool (or `<server> asks`).
    Asked(String),
    /// A call of this tool refused by the policy.
    Denied(String),
    Notice(String),
    Error(String),
}

/// The last event and when it came, shared by the turn loop (writer) and the heartbeat (reader).
#[derive(Debug, Default)]
pub(crate) struct LastEventCell {
    inner: Mutex<Option<(DateTime<Utc>, What, bool)>>,
}

impl LastEventCell {
    /// Notes `event` at `at`; cheap (a lock and, for tools and notices, a copy of the text).
    pub(crate) fn note(&self, event: &ProviderEvent, at: DateTime<Utc>) {
        let what = match event {
            ProviderEvent::Init { .. } => What::Init,
            ProviderEvent::Result { .. } => What::Result,
            ProviderEvent::Output | ProviderEvent::Text { .. } => What::Output,
            ProviderEvent::Interrupted { .. } => What::Result,
            ProviderEvent::ApprovalRequest(request) => What::Asked(match &request.kind {
                provider::ApprovalKind::ToolCall { tool, .. } => tool.clone(),
                provider::ApprovalKind::Elicitation { server, .. } => format!("{server} asks"),
            }),
            ProviderEvent::ToolDenied { tool, .. }
            | ProviderEvent::ToolUndecidable { tool, .. } => What::Denied(tool.clone()),
            ProviderEvent::Activity {
                tool: Some(tool), ..
            } => What::Tool(tool.clone()),
            ProviderEvent::Activity { tool: None, .. } => What::Activity,
            ProviderEvent::ToolEnded { running } => What::ToolEnded(*running),
            ProviderEvent::Progress { message } => What::Notice(message.clone()),
            ProviderEvent::Error { message, .. } => What::Error(message.clone()),
        };
        *self.inner.lock().unwrap_or_else(PoisonError::into_inner) = Some((at, what, true));
    }

    /// The last event, once: `None` when nothing new came since the last call (the stored
    /// value stands).
    pub(crate) fn take_new(&self) -> Option<LastEvent> {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let (at, what, fresh) = guard.as_mut()?;
        if !std::mem::replace(fresh, false) {
            return None;
        }
        Some(LastEvent {
            at: schema::time::format_ts(*at),
            what: describe(what),
        })
    }
}

fn describe(what: &What) -> String {
    match what {
        What::Init => "CLI session started".to_owned(),
        What::Result => "turn result".to_owned(),
        What::Output => "model output".to_owned(),
        What::Tool(tool) => format!("tool {tool} started"),
        What::ToolEnded(0) => "tool ended".to_owned(),
        What::ToolEnded(running) => format!("tool ended ({running} still running)"),
        What::Activity => "agent activity".to_owned(),
        What::Asked(subject) => format!("asked the user about {subject}"),
        What::Denied(tool) => format!("tool {tool} denied by the policy"),
        What::Notice(message) => message.clone(),
        What::Error(message) => format!("error: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_is_written_once_in_words() {
        let cell = LastEventCell::default();
        assert_eq!(cell.take_new(), None);
        let at = schema::time::parse_ts("2026-11-23T10:00:00Z").unwrap();
        cell.note(
            &ProviderEvent::Progress {
                message: "Reconnecting... 2/5".into(),
            },
            at,
        );
        assert_eq!(
            cell.take_new(),
            Some(LastEvent {
                at: "2026-11-23T10:00:00.000Z".into(),
                what: "Reconnecting... 2/5".into()
            })
        );
        assert_eq!(cell.take_new(), None);
        cell.note(
            &ProviderEvent::Activity {
                tool: Some("Bash".into()),
                summary: None,
            },
            at,
        );
        assert_eq!(cell.take_new().unwrap().what, "tool Bash started");
        cell.note(
            &ProviderEvent::ApprovalRequest(provider::ApprovalRequest {
                id: "r1".into(),
                kind: provider::ApprovalKind::ToolCall {
                    tool: "Bash".into(),
                    summary: None,
                    argument: None,
                    undecidable: None,
                },
            }),
            at,
        );
        assert_eq!(cell.take_new().unwrap().what, "asked the user about Bash");
        cell.note(
            &ProviderEvent::ToolDenied {
                tool: "Write".into(),
                summary: None,
            },
            at,
        );
        assert_eq!(
            cell.take_new().unwrap().what,
            "tool Write denied by the policy"
        );
    }
}
