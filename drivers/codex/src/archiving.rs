//! Transcript archiving after each query (issue 5): once a query's stream is closed, the turns
//! no archive holds yet are read and their entries written with `archive_new_entries` into
//! `<agent dir>/conversations/`.
//!
//! Only what is new is read: the id of the last archived entry comes from the session's newest
//! archive, and `thread/turns/list` pages back from the newest turn until the turn holding that
//! entry (usually the first page of [`TURNS_PER_PAGE`]). So what an archive costs the runner
//! (its buffers, its JSON, and the memory malloc keeps after them) depends on the last query,
//! not on the length of the conversation. The thread's name (for a new file's title) comes from
//! `thread/read` without turns. With no archive yet, or a marker that is not in the history any
//! more, every page is read, as the whole thread was before.
//!
//! Archiving is a side job: it runs after the query's last event, never fails the query (every
//! problem is a `tracing` warning) and never holds up the next one: the next query runs on the
//! same connection while the archive is read and written. One archive runs at a time (the
//! provider's `Archives`; the queries that end meanwhile leave one job per thread for after
//! it), each reading the thread only once it holds the lock, so a later archive always sees at
//! least what an earlier one saw. Turns still in progress (the next query's, which may already
//! run) are left for the archive after that query. Stopping the
//! app-server (shutdown, another session) waits briefly for a running archive first.

use std::future::Future;
use std::sync::Arc;

use serde_json::Value;

use super::connection::{AppServer, RpcError};
use super::history;
use provider::archive::job as archive_job;
use provider::archive::Transcript;
use provider::ProviderSettings;

/// One archive's work: thread `thread_id`, read from the app-server that runs it.
#[derive(Debug)]
pub(crate) struct Job {
    /// The app-server.
    pub server: Arc<AppServer>,
    /// The thread.
    pub thread_id: String,
}

impl archive_job::ArchiveJob for Job {
    fn history(&self) -> &str {
        &self.thread_id
    }
}

/// Turns per `thread/turns/list` page. The last archived entry is nearly always in the newest
/// two turns (the previous query's), so one page is the usual read.
const TURNS_PER_PAGE: u32 = 4;

/// Archives the job's thread (run through the provider's `Archives`, one at a time): reads the
/// turns no archive holds yet, writes their new entries. Logs the outcome; never fails.
///
/// Each request waits for its answer up to the connection's own `REQUEST_TIMEOUT`, with no
/// shorter bound around the read: app-server goes on with a request whose answer nobody waits
/// for, so giving up early would only let the next archive's read pile onto it (measured: on a
/// 3,300-turn thread each read took over 10 s, the reads given up on piled up, and the turns
/// behind them stalled for minutes).
pub(crate) async fn archive_thread(settings: &ProviderSettings, job: Job) {
    let Job { server, thread_id } = job;
    let thread_id = thread_id.as_str();
    if !server.is_alive() {
        tracing::debug!(
            thread = thread_id,
            "codex app-server gone; transcript not archived"
        );
        return;
    }
    let through = match archive_job::archived_through(settings, "codex", thread_id).await {
        Ok(through) => through,
        Err(err) => {
            tracing::warn!(thread = thread_id, %err, "the last archive could not be read; transcript not archived");
            return;
        }
    };
    let read = async {
        let meta = server
            .request("thread/read", history::codex_thread_meta_params(thread_id))
            .await?;
        let title = history::thread_title(&meta);
        unarchived_turns(thread_id, title, through.as_deref(), |cursor| {
            let params =
                history::codex_turns_page_params(thread_id, cursor.as_deref(), TURNS_PER_PAGE);
            server.request("thread/turns/list", params)
        })
        .await
    };
    let started = std::time::Instant::now();
    let transcript = match read.await {
        Ok(transcript) => transcript,
        Err(err) => {
            tracing::warn!(thread = thread_id, %err, "reading the thread's turns failed; transcript not archived");
            return;
        }
    };
    if started.elapsed() > archive_job::READ_TIMEOUT {
        tracing::warn!(
            thread = thread_id,
            secs = started.elapsed().as_secs(),
            "codex app-server was slow to hand over the thread's turns for the archive"
        );
    }
    archive_job::write_new_entries(settings, "codex", thread_id, move || transcript).await;
}

/// The finished turns of thread `thread_id` from far enough back to hold entry `through` (the
/// last one archived) with an entry before it, so that the entry is whole; every turn when
/// `through` is `None` or in no turn. `page` fetches one `thread/turns/list` page (newest
/// first) after the cursor it is given.
async fn unarchived_turns<F, Fut>(
    thread_id: &str,
    title: Option<String>,
    through: Option<&str>,
    mut page: F,
) -> Result<Transcript, RpcError>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<Value, RpcError>>,
{
    let mut newest_first: Vec<Value> = Vec::new();
    let mut cursor = None;
    let mut marker_seen = false;
    let mut pages = 0u32;
    loop {
        let asked = cursor.take();
        let mut result = page(asked.clone()).await?;
        pages += 1;
        let turns = match result.get_mut("data").map(Value::take) {
            Some(Value::Array(turns)) => turns,
            _ => Vec::new(),
        };
        cursor = result["nextCursor"].as_str().map(str::to_owned);
        // A cursor handed back unchanged would serve the same page forever.
        let stuck = cursor.is_some() && cursor == asked;
        if stuck {
            tracing::warn!(
                thread = thread_id,
                "thread/turns/list returned the cursor it was given; the archive reads no further"
            );
        }
        let last_page = cursor.is_none() || turns.is_empty() || stuck;
        if let Some(marker) = through {
            marker_seen |= turns.iter().any(|turn| holds_entry(turn, marker));
        }
        newest_first.extend(turns);
        if marker_seen || last_page {
            let finished = newest_first
                .iter()
                .rev()
                .filter(|turn| turn.get("status").and_then(Value::as_str) != Some("inProgress"));
            let transcript = history::from_codex_turns(thread_id, title.clone(), finished);
            let whole = through.is_some_and(|marker| transcript.holds_whole(marker));
            if whole || last_page {
                tracing::debug!(
                    pages,
                    turns = newest_first.len(),
                    "Codex turns read for the archive"
                );
                return Ok(transcript);
            }
        }
    }
}

/// Whether entry id `marker` comes from this turn: one of its items, or the turn's own
/// `<turn id>:failed` / `:interrupted` entry (the end markers of archives written before a
/// turn's end took its last item's id).
fn holds_entry(turn: &Value, marker: &str) -> bool {
    let turn_id = turn["id"].as_str().unwrap_or_default();
    (!turn_id.is_empty()
        && marker
            .strip_prefix(turn_id)
            .is_some_and(|rest| rest.starts_with(':')))
        || turn["items"]
            .as_array()
            .is_some_and(|items| items.iter().any(|item| item["id"].as_str() == Some(marker)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use provider::archive::{self, RenderOptions};
    use serde_json::json;
    use std::cell::Cell;

    /// A finished turn `n`: the user's prompt `u<n>`, then the agent's answer `m<n>`.
    fn turn(n: usize) -> Value {
        json!({"id": format!("t{n}"), "status": "completed", "items": [
            {"type": "userMessage", "id": format!("u{n}"), "content": [{"type": "text", "text": format!("question {n}")}]},
            {"type": "agentMessage", "id": format!("m{n}"), "text": format!("answer {n}")}
        ]})
    }

    /// Serves `turns` (oldest first) as `thread/turns/list` does: `limit` per page, newest
    /// first, the cursor being how many turns were served. Counts the pages asked for.
    fn pages<'a>(
        turns: &'a [Value],
        limit: usize,
        served: &'a Cell<usize>,
    ) -> impl FnMut(Option<String>) -> std::future::Ready<Result<Value, RpcError>> + 'a {
        move |cursor| {
            served.set(served.get() + 1);
            let from: usize = cursor.map_or(0, |c| c.parse().unwrap());
            let data: Vec<Value> = turns.iter().rev().skip(from).take(limit).cloned().collect();
            let next = (from + limit < turns.len()).then(|| (from + limit).to_string());
            std::future::ready(Ok(json!({"data": data, "nextCursor": next})))
        }
    }

    fn read(turns: &[Value], through: Option<&str>) -> (Vec<String>, usize) {
        let served = Cell::new(0);
        let transcript = futures::executor::block_on(unarchived_turns(
            "thread-1",
            None,
            through,
            pages(turns, 2, &served),
        ))
        .unwrap();
        assert_eq!(transcript.session_id, "thread-1");
        let texts = transcript.entries.iter().map(|e| e.text.clone()).collect();
        (texts, served.get())
    }

    #[test]
    fn pages_are_read_back_only_to_the_last_archived_entry() {
        let turns: Vec<Value> = (1..=7).map(turn).collect();
        // The previous query's answer: the newest page holds it, with an entry before it.
        let (texts, served) = read(&turns, Some("m6"));
        assert_eq!(served, 1);
        assert_eq!(texts, ["question 6", "answer 6", "question 7", "answer 7"]);
        // Its prompt is the first entry of that page: one page more, so the entry is whole.
        let (texts, served) = read(&turns, Some("u6"));
        assert_eq!(served, 2);
        assert_eq!(texts.first().map(String::as_str), Some("question 4"));
        assert_eq!(read(&turns, Some("m2")).1, 3);
        // No archive yet, or a marker the history has lost: every page.
        for through in [None, Some("gone")] {
            let (texts, served) = read(&turns, through);
            assert_eq!(served, 4, "{through:?}");
            assert_eq!(texts.len(), 14, "{through:?}");
            assert_eq!(texts[0], "question 1");
        }
    }

    /// A failed (or interrupted) turn's end carries its last item's id: found again even when
    /// a later read gives the turn another status, instead of a lost marker that archives the
    /// whole history again.
    #[test]
    fn a_turn_end_marker_survives_a_changed_status_and_turns_in_progress_are_left_out() {
        let mut turns: Vec<Value> = (1..=4).map(turn).collect();
        turns[2]["status"] = json!("failed");
        turns[2]["error"] = json!({"message": "boom"});
        turns.push(json!({"id": "t5", "status": "inProgress", "items": [
            {"type": "userMessage", "id": "u5", "content": [{"type": "text", "text": "next"}]}
        ]}));
        let archived = history::from_codex_turns("thread-1", None, &turns[..4]);
        let marker = archived.entries.last().and_then(|e| e.id.clone()).unwrap();
        assert_eq!(archived.entries.last().unwrap().text, "answer 4");
        let failed = archived
            .entries
            .iter()
            .find(|e| e.text == "Turn failed: boom")
            .unwrap();
        assert_eq!(failed.id.as_deref(), Some("m3"));
        assert_eq!(marker, "m4");
        // A turn interrupted before any item (a follow-up's restart) adds nothing.
        let empty = json!({"id": "t6", "status": "interrupted", "items": []});
        let with_empty = history::from_codex_turns("thread-1", None, [&turns[3], &empty]);
        assert_eq!(with_empty.entries.len(), 2, "{:?}", with_empty.entries);
        let mut later = turns.clone();
        later[2]["status"] = json!("completed");
        let (texts, served) = read(&later, Some("m3"));
        assert_eq!(served, 2);
        assert_eq!(texts[texts.len() - 2..], ["question 4", "answer 4"]);
        let (texts, served) = read(&turns, Some("m3"));
        assert_eq!(served, 2);
        assert!(
            texts.ends_with(&[
                "Turn failed: boom".into(),
                "question 4".into(),
                "answer 4".into()
            ]),
            "{texts:?}"
        );
        assert!(!texts.contains(&"next".to_owned()), "{texts:?}");
    }

    #[test]
    fn an_empty_page_ends_the_read() {
        let served = Cell::new(0);
        let endless = |_cursor: Option<String>| {
            served.set(served.get() + 1);
            std::future::ready(Ok(json!({"data": [], "nextCursor": "again"})))
        };
        let transcript =
            futures::executor::block_on(unarchived_turns("t", None, Some("x"), endless)).unwrap();
        assert!(transcript.is_empty());
        assert_eq!(served.get(), 1);
        // Pages that never end, the cursor handed back as it came: read once, then given up.
        let served = Cell::new(0);
        let turns = [turn(1)];
        let looping = |cursor: Option<String>| {
            served.set(served.get() + 1);
            let next = cursor.unwrap_or_else(|| "c1".to_owned());
            std::future::ready(Ok(json!({"data": turns, "nextCursor": next})))
        };
        let transcript =
            futures::executor::block_on(unarchived_turns("t", None, None, looping)).unwrap();
        assert_eq!(served.get(), 2);
        assert_eq!(transcript.entries.len(), 4);
    }

    #[test]
    fn the_captured_thread_is_archived_once() {
        let fixture = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../provider/tests/fixtures/archive/codex_thread_read.json"
        ))
        .unwrap();
        let thread: Value = serde_json::from_str(&fixture).unwrap();
        let transcript = history::from_codex_thread(&thread);
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
        // What the next read starts from: the last entry this archive holds.
        let through =
            archive::archived_through(dir.path(), "codex", &transcript.session_id).unwrap();
        assert_eq!(
            through.as_deref(),
            transcript.entries.last().and_then(|e| e.id.as_deref())
        );
        assert_eq!(
            archive::archived_through(dir.path(), "codex", "another").unwrap(),
            None
        );
    }
}
