//! DB calls off (or on) the runtime's thread, their wait on a full disk, and the heartbeat.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use schema::SessionDb;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;

use crate::last_event::LastEventCell;

/// The session DB as the loop uses it: a connection for blocking calls, the pinned one for
/// inline calls, and the full-disk state shared with the heartbeat.
pub(super) struct RunnerDb {
    db: SessionDb,
    /// The same DB with a connection of its own for the calls made on the runtime's thread
    /// ([`Runner::call_inline`]), which the watcher also checks: the runner's claims and
    /// replies do not wake its own loop (SessionDb::pinned).
    pub(super) inline_db: SessionDb,
    /// Cancelled when the runner stops; calls waiting for disk space watch it.
    stop: CancellationToken,
    /// Whether the DB's disk is full, shared with the heartbeat (logged once per episode).
    disk_full: Arc<DiskFull>,
}

impl RunnerDb {
    /// The loop's connections to `db`; its calls give up waiting for disk space once `stop`
    /// is cancelled.
    pub(super) fn new(db: SessionDb, stop: CancellationToken) -> Result<Self> {
        let inline_db = db
            .pinned()
            .context("opening the runner's inline connection")?;
        Ok(Self {
            db,
            inline_db,
            stop,
            disk_full: Arc::default(),
        })
    }

    /// Starts the heartbeat task (see [`spawn_heartbeat`]).
    pub(super) fn heartbeat(
        &self,
        every: Duration,
        last_event: Arc<LastEventCell>,
    ) -> tokio::task::JoinHandle<()> {
        spawn_heartbeat(
            self.db.clone(),
            every,
            self.stop.clone(),
            Arc::clone(&self.disk_full),
            last_event,
        )
    }
}

impl RunnerDb {
    pub(super) async fn call_on<T, F>(&self, on: DbThread, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&SessionDb) -> Result<T, schema::Error> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        let mut backoff = DISK_FULL_FIRST_RETRY;
        let mut waited = false;
        loop {
            let outcome = match on {
                DbThread::Inline => {
                    match schema::db::with_lock_wait(INLINE_LOCK_WAIT, || f(&self.inline_db)) {
                        // Another writer holds the lock: wait for it on a blocking thread,
                        // where the connection's busy timeout applies (nothing was written).
                        Err(err) if err.is_busy() => {
                            tracing::debug!(%err, "DB lock held: the call waits off the runtime's thread");
                            let db = self.db.clone();
                            let attempt = Arc::clone(&f);
                            tokio::task::spawn_blocking(move || attempt(&db))
                                .await
                                .context("a DB task panicked")?
                        }
                        outcome => outcome,
                    }
                }
                DbThread::Blocking => {
                    let db = self.db.clone();
                    let attempt = Arc::clone(&f);
                    tokio::task::spawn_blocking(move || attempt(&db))
                        .await
                        .context("a DB task panicked")?
                }
            };
            let err = match outcome {
                Ok(value) => {
                    if waited {
                        self.disk_full.cleared();
                    }
                    return Ok(value);
                }
                Err(err) if err.is_disk_full() => err,
                Err(err) => return Err(err.into()),
            };
            self.disk_full.hit(&err);
            waited = true;
            if self.stop.is_cancelled() {
                return Err(anyhow::Error::from(err).context(StoppedWhileDiskFull));
            }
            tokio::select! {
                _ = self.stop.cancelled() => {
                    return Err(anyhow::Error::from(err).context(StoppedWhileDiskFull));
                }
                _ = sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(DISK_FULL_MAX_RETRY);
        }
    }
}

/// Where a DB call of the loop runs.
#[derive(Debug, Clone, Copy)]
pub(super) enum DbThread {
    /// On a blocking thread (`spawn_blocking`): calls that are rare or may wait long.
    Blocking,
    /// On the runtime's thread: the per-message sub-millisecond calls. A call that would wait
    /// more than [`INLINE_LOCK_WAIT`] for another writer's lock moves to a blocking thread, so
    /// the heartbeat, the CLI's I/O and the credential proxy, on the same thread, never wait
    /// behind a lock.
    Inline,
}

/// The longest an inline DB call waits for another connection's lock on the runtime's thread.
/// The host's and mcp-tools' transactions take well under it.
pub(super) const INLINE_LOCK_WAIT: Duration = Duration::from_millis(20);

/// First wait before a write that failed on a full disk is tried again.
pub(super) const DISK_FULL_FIRST_RETRY: Duration = Duration::from_millis(100);

/// Longest wait between two tries of a write on a full disk.
pub(super) const DISK_FULL_MAX_RETRY: Duration = Duration::from_secs(5);

/// Whether the session DB's disk is full, shared by the loop and the heartbeat so the condition
/// is logged once when it starts and once when a write succeeds again, not per retry or tick.
#[derive(Debug, Default)]
pub(super) struct DiskFull {
    since: std::sync::Mutex<Option<Instant>>,
}

impl DiskFull {
    /// A write failed for lack of space.
    fn hit(&self, err: &schema::Error) {
        let mut since = self.since.lock().unwrap_or_else(|p| p.into_inner());
        if since.is_none() {
            *since = Some(Instant::now());
            tracing::warn!(
                error = %err,
                "session DB disk full: writes are retried until space returns (results kept in \
                 memory, heartbeat stale meanwhile)"
            );
        }
    }

    /// A write succeeded.
    fn cleared(&self) {
        let since = self.since.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(since) = since {
            tracing::info!(
                waited_secs = since.elapsed().as_secs_f64(),
                "session DB writable again after a full disk"
            );
        }
    }
}

/// A DB write gave up waiting for disk space because the runner is stopping. The rows of the
/// turn stay `processing` and the next start puts them back to `pending`, as after a crash.
#[derive(Debug)]
pub(super) struct StoppedWhileDiskFull;

impl std::fmt::Display for StoppedWhileDiskFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stopping while the session DB's disk is full")
    }
}

/// Turns [`StoppedWhileDiskFull`] into a normal stop (`Ok(true)`: shutdown requested), with a
/// log line; any other error passes through.
pub(super) fn stopped_while_full(err: anyhow::Error) -> Result<bool> {
    if err.is::<StoppedWhileDiskFull>() {
        tracing::warn!(
            "stopping while the session DB's disk is full: unwritten results are dropped; rows \
             in progress stay processing and are retried at the next start"
        );
        Ok(true)
    } else {
        Err(err)
    }
}

/// Refreshes `heartbeat_at` every `every`. On a full disk the refresh fails: that is logged once
/// (through `disk_full`), the host sees the heartbeat go stale, and fresh again once a write fits.
fn spawn_heartbeat(
    db: SessionDb,
    every: Duration,
    stop: CancellationToken,
    disk_full: Arc<DiskFull>,
    last_event: Arc<LastEventCell>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(every);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticker.tick() => {
                    let db = db.clone();
                    let event = last_event.take_new();
                    match tokio::task::spawn_blocking(move || db.heartbeat_with(event.as_ref())).await {
                        Ok(Ok(())) => disk_full.cleared(),
                        Ok(Err(err)) if err.is_disk_full() => disk_full.hit(&err),
                        Ok(Err(err)) => tracing::warn!(%err, "heartbeat failed"),
                        Err(err) => tracing::warn!(%err, "heartbeat task failed"),
                    }
                }
            }
        }
    })
}
