//! The session journal (written as a query runs) and the transcript archive after each query
//! (issue 5): once a query's stream is closed, the journal is parsed ([`history`]) and what no
//! earlier archive holds is written into `<agent dir>/conversations/` by the provider core's
//! archive model. A side job: it never fails or delays a query (every problem is a warning).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use super::command::journal_path;
use super::history;
use provider::archive::job::{self as archive_job, ArchiveJob};
use provider::ProviderSettings;

/// One archive: the session whose journal is read.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) provider: &'static str,
    pub(crate) session_id: String,
}

impl ArchiveJob for Job {
    fn history(&self) -> &str {
        &self.session_id
    }
}

/// Numbers the records of this process (with the time, unique across restarts).
static SEQ: AtomicU64 = AtomicU64::new(0);

/// Appends `record` (with its time and sequence id) to the session's journal; a failure is a
/// warning (the transcript then lacks it), never the query's failure.
pub(crate) fn journal(settings: &ProviderSettings, session_id: &str, mut record: Value) {
    let now = chrono::Utc::now();
    if let Value::Object(map) = &mut record {
        map.insert("at".into(), Value::from(now.to_rfc3339()));
        map.insert(
            "seq".into(),
            Value::from(format!(
                "{}.{}",
                now.timestamp_millis(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            )),
        );
    }
    let path = journal_path(settings, session_id);
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| fsguard::open_with(&path, fsguard::Access::Append))
        .and_then(|mut file| writeln!(file, "{record}"));
    if let Err(err) = written {
        tracing::warn!(path = %path.display(), %err, "cannot write the session journal");
    }
}

/// Archives the job's session: what the journal holds that no archive does.
pub(crate) async fn archive_session(settings: &ProviderSettings, job: Job) {
    let Job {
        provider,
        session_id,
    } = job;
    let path = journal_path(settings, &session_id);
    let text = match tokio::task::spawn_blocking(move || fsguard::read_to_string(&path)).await {
        Ok(Ok(text)) => text,
        Ok(Err(err)) if err.kind() == std::io::ErrorKind::NotFound => return,
        Ok(Err(err)) => {
            tracing::warn!(session = %session_id, %err, "cannot read the session journal; transcript not archived");
            return;
        }
        Err(err) => {
            tracing::warn!(session = %session_id, %err, "the journal read failed");
            return;
        }
    };
    let id = session_id.clone();
    archive_job::write_new_entries(settings, provider, &session_id, move || {
        history::from_journal(provider, &id, &text)
    })
    .await;
}
