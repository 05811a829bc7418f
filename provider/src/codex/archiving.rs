//! Transcript archiving after each query (issue 5): once a query's stream is closed, the thread's
//! history is read with `thread/read` ([`history::codex_thread_read_params`]), parsed with
//! [`history::from_codex_thread`] and what no earlier archive holds is written with
//! `archive_new_entries` into `<agent dir>/conversations/`.
//!
//! Archiving is a side job: it runs after the query's last event, never fails the query (every
//! problem is a `tracing` warning) and never holds up the next one: the next query runs on the
//! same connection while the archive is read and written. One archive runs at a time (the
//! provider's archive lock), each reading the thread only once it holds the lock, so a later
//! archive always sees at least what an earlier one saw. Turns still in progress (the next
//! query's, which may already run) are left for the archive after that query. Stopping the
//! app-server (shutdown, another session) waits briefly for a running archive first.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::OwnedMutexGuard;

use super::connection::AppServer;
use super::history;
use crate::archive::job::{self as archive_job, ArchiveLock, READ_TIMEOUT};
use crate::ProviderSettings;

/// Archives thread `thread_id`: takes the lock (unless `guard` already holds it), reads the
/// thread, writes the new entries. Logs the outcome; never fails.
pub(crate) async fn archive_thread(
    lock: &ArchiveLock,
    guard: Option<OwnedMutexGuard<()>>,
    settings: &ProviderSettings,
    server: &AppServer,
    thread_id: &str,
) {
    let _guard = match guard {
        Some(guard) => guard,
        None => Arc::clone(lock).lock_owned().await,
    };
    if !server.is_alive() {
        tracing::debug!(
            thread = thread_id,
            "codex app-server gone; transcript not archived"
        );
        return;
    }
    let params = history::codex_thread_read_params(thread_id);
    let thread = match tokio::time::timeout(READ_TIMEOUT, server.request("thread/read", params))
        .await
    {
        Ok(Ok(thread)) => thread,
        Ok(Err(err)) => {
            tracing::warn!(thread = thread_id, %err, "thread/read failed; transcript not archived");
            return;
        }
        Err(_) => {
            tracing::warn!(
                thread = thread_id,
                "thread/read took over {} s; transcript not archived",
                READ_TIMEOUT.as_secs()
            );
            return;
        }
    };
    archive_job::write_new_entries(settings, "codex", thread_id, move || {
        history::from_codex_thread(&finished_turns(thread))
    })
    .await;
}

/// The `thread/read` result without turns still in progress: their items may be incomplete, and
/// the archive after their own query takes them whole.
pub(crate) fn finished_turns(mut thread: Value) -> Value {
    let turns = match thread.get_mut("thread") {
        Some(inner) if inner.is_object() => inner.get_mut("turns"),
        _ => thread.get_mut("turns"),
    };
    if let Some(Value::Array(turns)) = turns {
        turns.retain(|turn| turn.get("status").and_then(Value::as_str) != Some("inProgress"));
    }
    thread
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::{self, RenderOptions};
    use chrono::Utc;
    use serde_json::json;

    #[test]
    fn turns_in_progress_are_left_out() {
        let read = json!({"thread": {"id": "t1", "turns": [
            {"id": "a", "status": "completed", "items": [
                {"type": "userMessage", "id": "u1", "content": [{"type": "text", "text": "hello"}]},
                {"type": "agentMessage", "id": "m1", "text": "hi"}
            ]},
            {"id": "b", "status": "inProgress", "items": [
                {"type": "userMessage", "id": "u2", "content": [{"type": "text", "text": "next"}]}
            ]}
        ]}});
        let transcript = history::from_codex_thread(&finished_turns(read));
        let texts: Vec<&str> = transcript.entries.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(texts, ["hello", "hi"]);
        assert_eq!(transcript.session_id, "t1");
        let bare = finished_turns(json!({"id": "t2", "turns": [{"status": "inProgress"}]}));
        assert_eq!(bare["turns"], json!([]));
        assert_eq!(finished_turns(json!(null)), json!(null));
    }

    #[test]
    fn the_captured_thread_is_archived_once() {
        let fixture = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/archive/codex_thread_read.json"
        ))
        .unwrap();
        let thread: Value = serde_json::from_str(&fixture).unwrap();
        let transcript = history::from_codex_thread(&finished_turns(thread));
        let dir = tempfile::tempdir().unwrap();
        let opts = RenderOptions::new(chrono_tz::Tz::UTC, Utc::now());
        let path = archive::archive_new_entries(dir.path(), &transcript, &opts)
            .unwrap()
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("mcp__nanoclaw__send_message"), "{text}");
        assert!(text.contains("Nothing else for now."), "{text}");
        assert_eq!(
            archive::archive_new_entries(dir.path(), &transcript, &opts).unwrap(),
            None
        );
    }
}
