//! Archiving as a side job after each query (Codex and OpenCode): one archive at a time per
//! provider ([`Archives`]), never failing or delaying a query, and waited for briefly before the
//! CLI stops. Each provider reads its own history; [`write_new_entries`] does the rest.

use std::future::Future;
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

/// A provider's archives: one runs at a time, and the job of a query that ends while one runs
/// waits as the next, a later job replacing it. Every archive reads whatever no archive holds
/// yet, so the latest job covers the ones it replaced: under a stream of queries the CLI is asked
/// for its history once per archive that ran, never once per query piled up behind a slow read
/// (a CLI that answers a long history slowly would otherwise fall further behind with every
/// query, its own turns waiting behind the reads).
#[derive(Debug)]
pub(crate) struct Archives<J> {
    /// Held by the archive that runs.
    lock: Arc<Mutex<()>>,
    /// The job to run when the running archive ends.
    next: std::sync::Mutex<Option<J>>,
}

impl<J> Default for Archives<J> {
    fn default() -> Self {
        Self {
            lock: Arc::default(),
            next: std::sync::Mutex::new(None),
        }
    }
}

impl<J> Archives<J> {
    /// Takes the archive lock at once when it is free. A query calls this before it closes its
    /// stream, so that whatever the runner does next (stop the provider, start another session)
    /// finds the archive of this query already under way.
    pub(crate) fn reserve(&self) -> Option<OwnedMutexGuard<()>> {
        Arc::clone(&self.lock).try_lock_owned().ok()
    }

    /// Waits (at most [`STOP_WAIT`]) until no archive runs; before `cli` is stopped.
    pub(crate) async fn wait_idle(&self, cli: &str) {
        if tokio::time::timeout(STOP_WAIT, self.lock.lock())
            .await
            .is_err()
        {
            tracing::warn!(
                "a transcript archive is still running after {} s; stopping {cli} anyway",
                STOP_WAIT.as_secs()
            );
        }
    }

    /// Archives `job` with `archive`: now when `guard` (from [`Archives::reserve`]) or the lock
    /// can be had, else as the next job of the archive that runs, which runs it when it ends.
    /// Whoever holds the lock looks for a next job after letting go of it, so no job is left
    /// behind.
    pub(crate) async fn run<F, Fut>(
        &self,
        guard: Option<OwnedMutexGuard<()>>,
        job: J,
        mut archive: F,
    ) where
        F: FnMut(J) -> Fut,
        Fut: Future<Output = ()>,
    {
        *self.next_job() = Some(job);
        let Some(mut guard) = guard.or_else(|| self.reserve()) else {
            tracing::debug!("an archive runs; this query's is next");
            return;
        };
        loop {
            // Taken under the lock: a job set from now on waits for the check below.
            let Some(job) = self.next_job().take() else {
                return;
            };
            archive(job).await;
            drop(guard);
            if self.next_job().is_none() {
                return;
            }
            guard = match self.reserve() {
                Some(guard) => guard,
                // Another holder took the lock; it runs the job.
                None => return,
            };
        }
    }

    fn next_job(&self) -> std::sync::MutexGuard<'_, Option<J>> {
        self.next
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The conversations folder (`/workspace/agent/conversations`).
pub(crate) fn conversations_dir(settings: &ProviderSettings) -> PathBuf {
    settings.agent_dir.join("conversations")
}

/// The id of the last entry an archive of `cli`'s session `session_id` holds (see
/// [`super::archived_through`]), read off the async workers.
pub(crate) async fn archived_through(
    settings: &ProviderSettings,
    cli: &str,
    session_id: &str,
) -> std::io::Result<Option<String>> {
    let dir = conversations_dir(settings);
    let (cli, id) = (cli.to_owned(), session_id.to_owned());
    tokio::task::spawn_blocking(move || super::archived_through(&dir, &cli, &id))
        .await
        .map_err(std::io::Error::other)?
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;
    use tokio::sync::Notify;

    /// An archive function that records each job and holds job 1 until `gate` opens.
    fn recorder(
        ran: &Arc<StdMutex<Vec<u32>>>,
        gate: &Arc<Notify>,
    ) -> impl FnMut(u32) -> futures::future::BoxFuture<'static, ()> {
        let (ran, gate) = (Arc::clone(ran), Arc::clone(gate));
        move |job| {
            let (ran, gate) = (Arc::clone(&ran), Arc::clone(&gate));
            Box::pin(async move {
                ran.lock().unwrap().push(job);
                if job == 1 {
                    gate.notified().await;
                }
            })
        }
    }

    /// Jobs of queries that end while an archive runs do not queue up behind it one by one: the
    /// latest runs once, after it.
    #[tokio::test]
    async fn jobs_that_come_while_an_archive_runs_collapse_into_the_latest() {
        let archives = Arc::new(Archives::<u32>::default());
        let ran = Arc::new(StdMutex::new(Vec::new()));
        let gate = Arc::new(Notify::new());
        let first = tokio::spawn({
            let (archives, archive) = (Arc::clone(&archives), recorder(&ran, &gate));
            async move { archives.run(archives.reserve(), 1, archive).await }
        });
        while ran.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        for job in 2..=4 {
            // Each returns at once: its job waits as the next.
            archives
                .run(archives.reserve(), job, recorder(&ran, &gate))
                .await;
        }
        assert_eq!(*ran.lock().unwrap(), [1]);
        gate.notify_one();
        first.await.unwrap();
        assert_eq!(*ran.lock().unwrap(), [1, 4]);
        // Idle again: the next job runs at once.
        archives
            .run(archives.reserve(), 5, recorder(&ran, &gate))
            .await;
        assert_eq!(*ran.lock().unwrap(), [1, 4, 5]);
        archives.wait_idle("test").await;
    }
}
