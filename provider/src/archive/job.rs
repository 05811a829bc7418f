//! Archiving as a side job after each query (Codex and OpenCode): one archive at a time per
//! provider, never failing or delaying a query, and waited for briefly before the CLI stops.
//! Each provider reads its own history; [`write_new_entries`] does the rest.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::{archive_new_entries, parse_tz, RenderOptions, Transcript};
use crate::ProviderSettings;

/// The longest an archive waits for the CLI to hand over its history.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest stopping the CLI waits for a running archive.
pub(crate) const STOP_WAIT: Duration = Duration::from_secs(15);

/// The archive lock; held by the archive that runs.
pub(crate) type ArchiveLock = Arc<Mutex<()>>;

/// Takes the archive lock at once when it is free. A query calls this before it closes its
/// stream, so that whatever the runner does next (stop the provider, start another session)
/// finds the archive of this query already under way.
pub(crate) fn reserve(lock: &ArchiveLock) -> Option<OwnedMutexGuard<()>> {
    Arc::clone(lock).try_lock_owned().ok()
}

/// Waits (at most [`STOP_WAIT`]) until no archive runs; before `cli` is stopped.
pub(crate) async fn wait_idle(lock: &ArchiveLock, cli: &str) {
    if tokio::time::timeout(STOP_WAIT, lock.lock()).await.is_err() {
        tracing::warn!(
            "a transcript archive is still running after {} s; stopping {cli} anyway",
            STOP_WAIT.as_secs()
        );
    }
}

/// The conversations folder (`/workspace/agent/conversations`).
pub(crate) fn conversations_dir(settings: &ProviderSettings) -> PathBuf {
    settings.agent_dir.join("conversations")
}

/// Parses the history with `parse` and writes what no earlier archive of `session_id` holds,
/// off the async workers. Logs the outcome; never fails.
pub(crate) async fn write_new_entries(
    settings: &ProviderSettings,
    cli: &str,
    session_id: &str,
    parse: impl FnOnce() -> Transcript + Send + 'static,
) {
    let dir = conversations_dir(settings);
    let tz = parse_tz(&settings.timezone);
    let assistant_name = settings.assistant_name.clone();
    let id = session_id.to_owned();
    let target = dir.clone();
    let written = tokio::task::spawn_blocking(move || {
        let mut transcript = parse();
        if transcript.session_id.is_empty() {
            transcript.session_id = id;
        }
        let opts = RenderOptions {
            assistant_name,
            ..RenderOptions::new(tz, Utc::now())
        };
        archive_new_entries(&target, &transcript, &opts)
    })
    .await;
    match written {
        Ok(Ok(Some(path))) => {
            tracing::info!(session = session_id, path = %path.display(), "{cli} transcript archived")
        }
        Ok(Ok(None)) => tracing::debug!(session = session_id, "nothing new to archive"),
        Ok(Err(err)) => {
            tracing::warn!(session = session_id, dir = %dir.display(), %err, "transcript not archived")
        }
        Err(err) => tracing::warn!(session = session_id, %err, "the archive task failed"),
    }
}
