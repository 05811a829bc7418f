//! Transcript archiving after each query (issue 5): once a query's stream is closed and its run
//! loop has settled, the session's history is read with `GET /session/{id}/message`
//! ([`history::opencode_messages_path`]), parsed with [`history::from_opencode_messages`] and
//! what no earlier archive holds is written with `archive_new_entries` into
//! `<agent dir>/conversations/`.
//!
//! Archiving is a side job: it runs after the query's last event, never fails the query (every
//! problem is a `tracing` warning) and never holds up the next one: the query releases the
//! server first and the archive reads the history through a clone of the server's HTTP client
//! ([`Api`]) while the next query may already run. One archive runs at a time (the provider's
//! archive lock), each reading the history only once it holds the lock, so a later archive
//! always sees at least what an earlier one saw. What may still change is left for a later
//! archive ([`settled`]): the messages from the next query's prompt on, and a run loop still in
//! progress with its prompt. Stopping the server (shutdown) waits briefly for a running archive
//! first.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::OwnedMutexGuard;

use super::connection::Api;
use super::history;
use crate::archive::job::{self as archive_job, ArchiveLock, READ_TIMEOUT};
use crate::ProviderSettings;

/// What one archive needs: where to read and up to where the history belongs to its query.
#[derive(Debug)]
pub(crate) struct Job {
    /// The server's HTTP API.
    pub api: Api,
    /// The OpenCode session.
    pub session_id: String,
    /// A message id made once the query ended: the runner's next prompt gets a later one (ids
    /// sort in creation order, see `Shared::message_id`), so user messages from this id on are
    /// the next query's.
    pub cutoff: String,
}

/// Archives the job's session: takes the lock (unless `guard` already holds it), reads the
/// history, writes the new entries. Logs the outcome; never fails.
pub(crate) async fn archive_session(
    lock: &ArchiveLock,
    guard: Option<OwnedMutexGuard<()>>,
    settings: &ProviderSettings,
    job: Job,
) {
    let _guard = match guard {
        Some(guard) => guard,
        None => Arc::clone(lock).lock_owned().await,
    };
    let Job {
        api,
        session_id,
        cutoff,
    } = job;
    let messages = match api.all_messages(&session_id, READ_TIMEOUT).await {
        Ok(messages) => messages,
        Err(err) => {
            tracing::warn!(session = %session_id, %err, "cannot read the OpenCode history; transcript not archived");
            return;
        }
    };
    archive_job::write_new_entries(settings, "opencode", &session_id, move || {
        history::from_opencode_messages(&settled(messages, &cutoff))
    })
    .await;
}

/// The history without what may still change, so that no entry is archived half-way (an entry
/// gathers consecutive assistant messages, and the next archive starts after the last entry's
/// id):
/// * from the first user message whose id is at or after `cutoff` on (the next query's);
/// * from the first assistant message neither completed nor failed on (a run loop still in
///   progress), together with the finished steps of that run and the prompt that started it
///   (back to the user message before it).
///
/// What is cut is archived by a later archive.
pub(crate) fn settled(mut messages: Value, cutoff: &str) -> Value {
    let Some(list) = messages.as_array_mut() else {
        return messages;
    };
    let role = |message: &Value| message["info"]["role"].as_str().map(str::to_owned);
    let unsettled = list.iter().position(|message| {
        let info = &message["info"];
        match info["role"].as_str() {
            Some("user") => info["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("msg_") && id >= cutoff),
            Some("assistant") => info["time"]["completed"].is_null() && info["error"].is_null(),
            _ => false,
        }
    });
    if let Some(mut end) = unsettled {
        if role(&list[end]).as_deref() == Some("assistant") {
            end = list[..end]
                .iter()
                .rposition(|message| role(message).as_deref() == Some("user"))
                .unwrap_or(0);
        }
        list.truncate(end);
    }
    messages
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::{self, RenderOptions};
    use chrono::Utc;
    use serde_json::json;

    fn user(id: &str, text: &str) -> Value {
        json!({"info": {"id": id, "sessionID": "ses_1", "role": "user", "time": {"created": 1}},
               "parts": [{"type": "text", "text": text}]})
    }

    fn assistant(id: &str, text: &str, completed: bool) -> Value {
        let time = if completed {
            json!({"created": 2, "completed": 3})
        } else {
            json!({"created": 2})
        };
        json!({"info": {"id": id, "sessionID": "ses_1", "role": "assistant", "time": time},
               "parts": [{"type": "text", "text": text}]})
    }

    fn texts(messages: Value) -> Vec<String> {
        history::from_opencode_messages(&messages)
            .entries
            .iter()
            .map(|e| e.text.clone())
            .collect()
    }

    #[test]
    fn the_next_query_and_runs_in_progress_are_left_out() {
        let history = json!([
            user("msg_000000000010aaaa", "first"),
            assistant("msg_000000000020aaaa", "one", true),
            user("msg_000000000030aaaa", "second"),
            assistant("msg_000000000040aaaa", "two", true),
            user("msg_000000000060aaaa", "next query"),
            assistant("msg_000000000070aaaa", "partial", false),
        ]);
        // Everything up to the cutoff.
        assert_eq!(
            texts(settled(history.clone(), "msg_000000000050zzzz")),
            ["first", "one", "second", "two"]
        );
        // No cutoff reached: the run in progress goes back to its prompt.
        assert_eq!(
            texts(settled(history.clone(), "msg_ffffffffffffzzzz")),
            ["first", "one", "second", "two"]
        );
        // A run whose first step is done but the second still streams waits as a whole.
        let running = json!([
            user("msg_000000000010aaaa", "first"),
            assistant("msg_000000000020aaaa", "one", true),
            assistant("msg_000000000030aaaa", "still going", false),
        ]);
        assert!(texts(settled(running, "msg_ffffffffffffzzzz")).is_empty());
        // An aborted answer has an error instead of a completion time: settled.
        let mut aborted = assistant("msg_000000000020aaaa", "cut", false);
        aborted["info"]["error"] = json!({"name": "MessageAbortedError"});
        let history = json!([user("msg_000000000010aaaa", "first"), aborted]);
        assert_eq!(
            texts(settled(history, "msg_ffffffffffffzzzz")),
            ["first", "cut", "MessageAbortedError"]
        );
        assert_eq!(settled(json!({"x": 1}), "msg_0"), json!({"x": 1}));
    }

    #[test]
    fn an_archive_mid_run_and_the_one_after_it_hold_everything_once() {
        let dir = tempfile::tempdir().unwrap();
        let opts = RenderOptions::new(chrono_tz::Tz::UTC, Utc::now());
        let done = json!([
            user("msg_000000000010aaaa", "first"),
            assistant("msg_000000000020aaaa", "one", true),
        ]);
        let mut mid_run = done.clone();
        mid_run.as_array_mut().unwrap().extend([
            user("msg_000000000030aaaa", "second"),
            assistant("msg_000000000040aaaa", "two", true),
            assistant("msg_000000000050aaaa", "three", false),
        ]);
        let t = history::from_opencode_messages(&settled(mid_run, "msg_ffffffffffffzzzz"));
        archive::archive_new_entries(dir.path(), &t, &opts)
            .unwrap()
            .unwrap();
        let mut finished = done.clone();
        finished.as_array_mut().unwrap().extend([
            user("msg_000000000030aaaa", "second"),
            assistant("msg_000000000040aaaa", "two", true),
            assistant("msg_000000000050aaaa", "three", true),
        ]);
        let t = history::from_opencode_messages(&settled(finished, "msg_ffffffffffffzzzz"));
        let path = archive::archive_new_entries(dir.path(), &t, &opts)
            .unwrap()
            .unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        for word in ["\nfirst\n", "\none\n", "\nsecond\n", "\ntwo\n\nthree\n"] {
            assert_eq!(text.matches(word).count(), 1, "{word}: {text}");
        }
    }

    #[test]
    fn the_captured_history_is_archived_once() {
        let fixture = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/archive/opencode_messages.json"
        ))
        .unwrap();
        let messages: Value = serde_json::from_str(&fixture).unwrap();
        let all = settled(messages.clone(), "msg_ffffffffffffzzzz");
        assert_eq!(all, messages, "a settled history is kept whole");
        let transcript = history::from_opencode_messages(&all);
        let dir = tempfile::tempdir().unwrap();
        let opts = RenderOptions::new(chrono_tz::Tz::UTC, Utc::now());
        let path = archive::archive_new_entries(dir.path(), &transcript, &opts)
            .unwrap()
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("- 🔧 nanoclaw_send_message("), "{text}");
        assert!(text.contains("Nothing else for now."), "{text}");
        assert_eq!(
            archive::archive_new_entries(dir.path(), &transcript, &opts).unwrap(),
            None
        );
    }
}
