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
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest stopping the CLI waits for a running archive.
pub const STOP_WAIT: Duration = Duration::from_secs(15);

/// An archive's work, as [`Archives`] queues it.
pub trait ArchiveJob {
    /// The history (thread, session) the job reads: a later job of the same history covers an
    /// earlier one.
    fn history(&self) -> &str;
}

/// A provider's archives: one runs at a time, and the job of a query that ends while one runs
/// waits, a later job of the same history replacing it. Every archive reads whatever no archive
/// of its history holds yet, so the latest job covers the ones it replaced: under a stream of
/// queries the CLI is asked for a history once per archive that ran, never once per query piled
/// up behind a slow read (a CLI that answers a long history slowly would otherwise fall further
/// behind with every query, its own turns waiting behind the reads). Jobs of other histories
/// (a new thread or session after `/clear` or a restart) wait beside it, in order.
#[derive(Debug)]
pub struct Archives<J> {
    /// Held by the archive that runs.
    lock: Arc<Mutex<()>>,
    /// The jobs to run when the running archive ends, at most one per history.
    waiting: std::sync::Mutex<std::collections::VecDeque<J>>,
}

impl<J> Default for Archives<J> {
    fn default() -> Self {
        Self {
            lock: Arc::default(),
            waiting: std::sync::Mutex::new(std::collections::VecDeque::new()),
        }
    }
}

impl<J: ArchiveJob> Archives<J> {
    /// Takes the archive lock at once when it is free. A query calls this before it closes its
    /// stream, so that whatever the runner does next (stop the provider, start another session)
    /// finds the archive of this query already under way.
    pub fn reserve(&self) -> Option<OwnedMutexGuard<()>> {
        Arc::clone(&self.lock).try_lock_owned().ok()
    }

    /// Waits (at most [`STOP_WAIT`]) until no archive runs and none waits to; before `cli` is
    /// stopped.
    pub async fn wait_idle(&self, cli: &str) {
        let idle = async {
            loop {
                let held = self.lock.lock().await;
                if self.waiting().is_empty() {
                    return;
                }
                // A job queued behind the archive that just ended: its runner takes the lock
                // next (it waits for it), so let go and look again.
                drop(held);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        if tokio::time::timeout(STOP_WAIT, idle).await.is_err() {
            tracing::warn!(
                "a transcript archive is still running after {} s; stopping {cli} anyway",
                STOP_WAIT.as_secs()
            );
        }
    }

    /// Archives `job` with `archive`: now when `guard` (from [`Archives::reserve`]) or the lock
    /// can be had, else queued for the archive that runs, which runs it when it ends. Whoever
    /// holds the lock looks for a waiting job after letting go of it, so no job is left behind.
    pub async fn run<F, Fut>(&self, guard: Option<OwnedMutexGuard<()>>, job: J, mut archive: F)
    where
        F: FnMut(J) -> Fut,
        Fut: Future<Output = ()>,
    {
        {
            let mut waiting = self.waiting();
            match waiting
                .iter_mut()
                .find(|queued| queued.history() == job.history())
            {
                Some(queued) => *queued = job,
                None => waiting.push_back(job),
            }
        }
        let Some(mut guard) = guard.or_else(|| self.reserve()) else {
            tracing::debug!("an archive runs; this query's waits for it");
            return;
        };
        loop {
            // Taken under the lock: a job queued from now on waits for the check below.
            let Some(job) = self.waiting().pop_front() else {
                return;
            };
            archive(job).await;
            drop(guard);
            if self.waiting().is_empty() {
                return;
            }
            // Wait for the lock rather than leave the job to whoever holds it: that may be
            // `wait_idle`, which runs no job.
            guard = Arc::clone(&self.lock).lock_owned().await;
        }
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<J>> {
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The conversations folder (`/workspace/agent/conversations`).
pub fn conversations_dir(settings: &ProviderSettings) -> PathBuf {
    settings.agent_dir.join("conversations")
}

/// The id of the last entry an archive of `cli`'s session `session_id` holds (see
/// [`super::archived_through`]), read off the async workers.
pub async fn archived_through(
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
pub async fn write_new_entries(
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

    /// Job `n` of history `history`.
    #[derive(Debug, Clone, Copy)]
    struct TestJob(&'static str, u32);

    impl ArchiveJob for TestJob {
        fn history(&self) -> &str {
            self.0
        }
    }

    /// An archive function that records each job's number and holds job 1 until `gate` opens.
    fn recorder(
        ran: &Arc<StdMutex<Vec<u32>>>,
        gate: &Arc<Notify>,
    ) -> impl FnMut(TestJob) -> futures::future::BoxFuture<'static, ()> {
        let (ran, gate) = (Arc::clone(ran), Arc::clone(gate));
        move |TestJob(_, n)| {
            let (ran, gate) = (Arc::clone(&ran), Arc::clone(&gate));
            Box::pin(async move {
                ran.lock().unwrap().push(n);
                if n == 1 {
                    gate.notified().await;
                }
            })
        }
    }

    /// Jobs of queries that end while an archive runs do not queue up behind it one by one: the
    /// latest of each history runs once, after it; another history's job is not dropped.
    #[tokio::test]
    async fn jobs_that_come_while_an_archive_runs_collapse_into_the_latest() {
        let archives = Arc::new(Archives::<TestJob>::default());
        let ran = Arc::new(StdMutex::new(Vec::new()));
        let gate = Arc::new(Notify::new());
        let first = tokio::spawn({
            let (archives, archive) = (Arc::clone(&archives), recorder(&ran, &gate));
            async move {
                archives
                    .run(archives.reserve(), TestJob("a", 1), archive)
                    .await
            }
        });
        while ran.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        // A new thread (after `/clear`) between queries of the running one.
        for job in [TestJob("a", 2), TestJob("b", 3), TestJob("a", 4)] {
            // Each returns at once: its job waits.
            archives
                .run(archives.reserve(), job, recorder(&ran, &gate))
                .await;
        }
        assert_eq!(*ran.lock().unwrap(), [1]);
        gate.notify_one();
        first.await.unwrap();
        assert_eq!(*ran.lock().unwrap(), [1, 4, 3]);
        // Idle again: the next job runs at once.
        archives
            .run(archives.reserve(), TestJob("a", 5), recorder(&ran, &gate))
            .await;
        assert_eq!(*ran.lock().unwrap(), [1, 4, 3, 5]);
        archives.wait_idle("test").await;
    }

    /// A stop that comes while an archive runs and another query's job waits behind it returns
    /// only once that job ran too: the last query's transcript is not lost at shutdown.
    #[tokio::test]
    async fn waiting_for_idle_waits_for_the_queued_job_too() {
        let archives = Arc::new(Archives::<TestJob>::default());
        let ran = Arc::new(StdMutex::new(Vec::new()));
        let gate = Arc::new(Notify::new());
        let first = tokio::spawn({
            let (archives, archive) = (Arc::clone(&archives), recorder(&ran, &gate));
            async move {
                archives
                    .run(archives.reserve(), TestJob("a", 1), archive)
                    .await
            }
        });
        while ran.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        archives
            .run(archives.reserve(), TestJob("a", 2), recorder(&ran, &gate))
            .await;
        let stop = tokio::spawn({
            let archives = Arc::clone(&archives);
            async move { archives.wait_idle("test").await }
        });
        // The stop waits on the lock before the running archive lets go of it.
        tokio::time::sleep(Duration::from_millis(20)).await;
        gate.notify_one();
        stop.await.unwrap();
        assert_eq!(
            *ran.lock().unwrap(),
            [1, 2],
            "the queued job ran before the stop"
        );
        first.await.unwrap();
    }
}
