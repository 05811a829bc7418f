//! Transcript archiving after each query (issue 5): once a query's stream is closed and its run
//! loop has settled, the session's latest messages are read with `GET
//! /session/{id}/message?limit=N` ([`history::opencode_messages_path`]), parsed with
//! [`history::from_opencode_messages`] and what no earlier archive holds is written with
//! `archive_new_entries` into `<agent dir>/conversations/`.
//!
//! Only what is new is read: the id of the last archived entry comes from the session's newest
//! archive, and the read asks for the last [`FIRST_READ`] messages, then 8 times more each time,
//! until they hold that entry (with an entry before it, so it is whole) or the whole history.
//! So what an archive costs the runner depends on the last query, not on the length of the
//! conversation. With no archive yet, or an entry the history no longer holds, it reads all.
//!
//! Archiving is a side job: it runs after the query's last event, never fails the query (every
//! problem is a `tracing` warning) and never holds up the next one: the query releases the
//! server first and the archive reads the history through a clone of the server's HTTP client
//! ([`Api`]) while the next query may already run. One archive runs at a time (the provider's
//! `Archives`; the queries that end meanwhile leave one job per session for after it), each
//! reading the history only once it holds the lock, so a later archive always sees at least
//! what an earlier one saw. What may still change is left for a later
//! archive ([`settled`]): the messages from the next query's prompt on, and a run loop still in
//! progress with its prompt. Stopping the server (shutdown) waits briefly for a running archive
//! first.

use std::future::Future;

use serde_json::Value;

use super::connection::Api;
use super::history;
use provider::archive::job::{self as archive_job, READ_TIMEOUT};
use provider::archive::Transcript;
use provider::ProviderSettings;

/// Messages asked for by an archive's first read: a query's prompt and its steps, as a rule,
/// with the previous query's last answer.
const FIRST_READ: usize = 16;

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

impl archive_job::ArchiveJob for Job {
    fn history(&self) -> &str {
        &self.session_id
    }
}

/// Archives the job's session (run through the provider's `Archives`, one at a time): reads
/// the messages no archive holds yet, writes their new entries. Logs the outcome; never fails.
pub(crate) async fn archive_session(settings: &ProviderSettings, job: Job) {
    let Job {
        api,
        session_id,
        cutoff,
    } = job;
    let through = match archive_job::archived_through(settings, "opencode", &session_id).await {
        Ok(through) => through,
        Err(err) => {
            tracing::warn!(session = %session_id, %err, "the last archive could not be read; transcript not archived");
            return;
        }
    };
    let read = unarchived_messages(through.as_deref(), &cutoff, |limit| {
        api.last_messages(&session_id, limit, READ_TIMEOUT)
    });
    let transcript = match tokio::time::timeout(READ_TIMEOUT, read).await {
        Ok(Ok(transcript)) => transcript,
        Ok(Err(err)) => {
            tracing::warn!(session = %session_id, %err, "cannot read the OpenCode history; transcript not archived");
            return;
        }
        Err(_) => {
            tracing::warn!(
                session = %session_id,
                "reading the OpenCode history took over {} s; transcript not archived",
                READ_TIMEOUT.as_secs()
            );
            return;
        }
    };
    archive_job::write_new_entries(settings, "opencode", &session_id, move || transcript).await;
}

/// The settled history (see [`settled`]) from far enough back to hold entry `through` (the last
/// one archived) with an entry before it, so that the entry is whole; the whole history when
/// `through` is `None` or in no message. `last` fetches the last `limit` messages.
async fn unarchived_messages<F, Fut, E>(
    through: Option<&str>,
    cutoff: &str,
    mut last: F,
) -> Result<Transcript, E>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<Value, E>>,
{
    let mut limit = FIRST_READ;
    loop {
        let messages = last(limit).await?;
        let count = messages.as_array().map_or(0, Vec::len);
        let whole_history = count < limit;
        tracing::debug!(limit, count, "OpenCode messages read for the archive");
        let holds_marker = through.is_some_and(|marker| {
            messages.as_array().is_some_and(|list| {
                list.iter()
                    .any(|m| m["info"]["id"].as_str() == Some(marker))
            })
        });
        if holds_marker || whole_history {
            let transcript = history::from_opencode_messages(&settled(messages, cutoff));
            let whole = through.is_some_and(|marker| transcript.holds_whole(marker));
            if whole || whole_history {
                return Ok(transcript);
            }
        }
        limit = limit.saturating_mul(8);
    }
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
    use chrono::Utc;
    use provider::archive::{self, RenderOptions};
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

    /// Reads `history` as `GET /session/{id}/message?limit=N` does (the last N), counting reads.
    fn read(history: &[Value], through: Option<&str>) -> (Vec<String>, Vec<usize>) {
        let limits = std::cell::RefCell::new(Vec::new());
        let transcript = futures::executor::block_on(unarchived_messages(
            through,
            "msg_ffffffffffffzzzz",
            |limit| {
                limits.borrow_mut().push(limit);
                let from = history.len().saturating_sub(limit);
                std::future::ready(Ok::<_, ()>(Value::Array(history[from..].to_vec())))
            },
        ))
        .unwrap();
        let texts = transcript.entries.iter().map(|e| e.text.clone()).collect();
        (texts, limits.into_inner())
    }

    #[test]
    fn only_the_last_messages_back_to_the_last_archived_entry_are_read() {
        let history: Vec<Value> = (1..=40)
            .flat_map(|n| {
                [
                    user(&format!("msg_{:012}u", n), &format!("question {n}")),
                    assistant(&format!("msg_{:012}a", n), &format!("answer {n}"), true),
                ]
            })
            .collect();
        // The previous query's answer: in the first read, with an entry before it.
        let (texts, limits) = read(&history, Some("msg_000000000039a"));
        assert_eq!(limits, [FIRST_READ]);
        assert_eq!(texts.len(), FIRST_READ);
        assert_eq!(texts.last().map(String::as_str), Some("answer 40"));
        // The first message of the first read: one read more, so its entry is whole.
        let (_, limits) = read(&history, Some("msg_000000000033u"));
        assert_eq!(limits, [FIRST_READ, FIRST_READ * 8]);
        // No archive yet, or a marker the history has lost: everything, once it is all read.
        for through in [None, Some("msg_gone")] {
            let (texts, limits) = read(&history, through);
            assert_eq!(limits, [FIRST_READ, FIRST_READ * 8], "{through:?}");
            assert_eq!(texts.len(), 80, "{through:?}");
        }
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
            "/../../provider/tests/fixtures/archive/opencode_messages.json"
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
