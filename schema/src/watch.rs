//! Change notification for the session DB: an inotify watch on the `-wal` file (read on the
//! caller's own tokio reactor, no thread), confirmed with `PRAGMA data_version` on a connection
//! of the watcher's. Without inotify (no instance or watch left for this user, or
//! `NANOCLAW_WATCH=poll`) the same waits run on a `stat` of the `-wal` file every
//! [`POLL_INTERVAL`].
//!
//! Every commit writes the `-wal` file, so its events are the commits' events. The
//! `data_version` check ignores the checking connection's own commits: a watcher made from a
//! pinned handle ([`SessionDb::pinned`]) is not woken by that handle's writes. An event can
//! arrive before its commit is visible (the `-shm` index is written through mmap, which raises
//! no event), so after events a few re-checks run on a ladder (1, 3, 10, 30, 100, 300 ms) —
//! while new events and the deadline are still listened to, so a stale event (our own write)
//! never delays the next real commit.
//! Callers always pass a timeout: the watch speeds wake-ups up, the poll stays the fallback.

mod inotify_source;
mod shortage;
mod wal_stat;

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{sleep_until, Instant, Sleep};

use crate::{Error, SessionDb};
use inotify_source::InotifySource;
use wal_stat::WalStat;

/// Re-check delays after events that showed no change yet, each from the previous check. The
/// long tail covers a writer descheduled between its `-wal` write and its index update on a
/// loaded machine: without it such a commit waited for the caller's timeout (a second when idle).
const RECHECK_DELAYS_MS: [u64; 6] = [1, 3, 10, 30, 100, 300];

/// The environment variable that forces the fallback (`poll`), for tests and benchmarks.
pub const WATCH_MODE_VAR: &str = "NANOCLAW_WATCH";

pub use wal_stat::POLL_INTERVAL;

/// How a [`DbWatcher`] learns of commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchMode {
    /// inotify on the `-wal` file; falls back to [`WatchMode::Poll`] (said once per process)
    /// when no inotify instance or watch can be had.
    Notify,
    /// A `stat` of the `-wal` file every [`POLL_INTERVAL`], confirmed with `PRAGMA
    /// data_version` only when it changed.
    Poll,
}

impl WatchMode {
    /// The mode the environment asks for: `NANOCLAW_WATCH=poll` forces the fallback (a
    /// diagnostic switch for tests and benchmarks); anything else is [`WatchMode::Notify`].
    pub fn from_env() -> Self {
        match std::env::var(WATCH_MODE_VAR) {
            Ok(value) if value.trim().eq_ignore_ascii_case("poll") => Self::Poll,
            _ => Self::Notify,
        }
    }
}

/// What wakes a waiting watcher.
enum Source {
    Notify(InotifySource),
    Poll(WalStat),
}

/// The re-checks after events that showed no visible change: due times on a ladder from the
/// last events, restarted by new ones.
#[derive(Default)]
struct Ladder {
    /// When the next re-check is due and which step it is.
    next: Option<(Instant, usize)>,
}

impl Ladder {
    fn restart(&mut self, now: Instant) {
        self.next = Some((now + Duration::from_millis(RECHECK_DELAYS_MS[0]), 0));
    }

    fn due(&self) -> Option<Instant> {
        self.next.map(|(at, _)| at)
    }

    fn advance(&mut self, now: Instant) {
        self.next = self.next.and_then(|(_, step)| {
            RECHECK_DELAYS_MS
                .get(step + 1)
                .map(|delay| (now + Duration::from_millis(*delay), step + 1))
        });
    }
}

/// Wakes a task when another connection commits to the session DB.
pub struct DbWatcher {
    source: Source,
    ladder: Ladder,
    /// Where `PRAGMA data_version` is read: a connection of its own, or the pinned connection
    /// of the handle it was made from. (A mutex makes the watcher Sync, so a task holding
    /// `&self` across an await stays Send.)
    conn: Arc<Mutex<rusqlite::Connection>>,
    last_version: i64,
    /// The wait's deadline and the ladder's next re-check, kept from wait to wait: a loop
    /// waits between each of a turn's events, and new timers per wait were registered with the
    /// runtime and removed again each time.
    deadline: Alarm,
    recheck: Alarm,
}

/// A timer kept across a loop's iterations, for a `select!` branch that is off while the alarm
/// is unset. Setting the same instant again costs nothing and a later one only moves the
/// expiry, where a new `sleep` per iteration registered a timer with the runtime and removed it
/// again each time (and, being the earliest, woke the runtime's driver through its eventfd).
/// Made outside the runtime; its timer is made at the first instant set.
#[derive(Debug, Default)]
pub struct Alarm {
    sleep: Option<Pin<Box<Sleep>>>,
    at: Option<Instant>,
}

impl Alarm {
    /// An unset alarm.
    pub fn new() -> Self {
        Self::default()
    }

    /// Rings at `at`, or never for `None`.
    pub fn set(&mut self, at: Option<Instant>) {
        if at == self.at {
            return;
        }
        self.at = at;
        match (&mut self.sleep, at) {
            // Unset, it is moved out of the way: a timer still due would wake the task.
            (Some(sleep), at) => sleep.as_mut().reset(at.unwrap_or_else(far_future)),
            (None, Some(at)) => self.sleep = Some(Box::pin(sleep_until(at))),
            (None, None) => {}
        }
    }

    /// Resolves once the instant set has come (at once if it has passed); never while unset.
    pub async fn ring(&mut self) {
        match (self.at, self.sleep.as_mut()) {
            (Some(_), Some(sleep)) => sleep.as_mut().await,
            _ => std::future::pending().await,
        }
    }
}

/// An instant no alarm reaches (a year on).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

impl DbWatcher {
    /// Starts watching `db` in the mode `NANOCLAW_WATCH` asks for (see [`WatchMode::from_env`]).
    /// When no inotify instance or watch can be had, the watcher polls the `-wal` file instead;
    /// that is logged once per process, with the limit and how to raise it.
    pub fn new(db: &SessionDb) -> Result<Self, Error> {
        Self::with_mode(db, WatchMode::from_env())
    }

    /// Starts watching `db` in `mode`. The watcher checks for changes on the connection of a
    /// pinned `db` ([`SessionDb::pinned`]), whose own commits therefore do not wake it; on a
    /// connection of its own otherwise.
    pub fn with_mode(db: &SessionDb, mode: WatchMode) -> Result<Self, Error> {
        let conn = match db.pinned_connection() {
            Some(pinned) => pinned,
            None => Arc::new(Mutex::new(db.dedicated_connection()?)),
        };
        let wal = wal_path(db.path());
        let source = match mode {
            WatchMode::Poll => Source::Poll(WalStat::new(wal)),
            WatchMode::Notify => match InotifySource::new(&wal) {
                Ok(source) => Source::Notify(source),
                Err(shortage) => {
                    shortage.warn_once();
                    Source::Poll(WalStat::new(wal))
                }
            },
        };
        // After the watches: a commit from here on leaves an event, one before is in the
        // version (`wait` relies on that to skip its first check).
        let last_version = match conn.lock() {
            Ok(conn) => data_version(&conn)?,
            Err(poisoned) => data_version(&poisoned.into_inner())?,
        };
        Ok(Self {
            source,
            ladder: Ladder::default(),
            conn,
            last_version,
            deadline: Alarm::new(),
            recheck: Alarm::new(),
        })
    }

    /// The mode this watcher runs in (after any fallback).
    pub fn mode(&self) -> WatchMode {
        match self.source {
            Source::Notify(_) => WatchMode::Notify,
            Source::Poll(_) => WatchMode::Poll,
        }
    }

    /// True when another connection committed since the last call (or since creation).
    pub fn changed(&mut self) -> bool {
        let version = match self.conn.lock() {
            Ok(conn) => data_version(&conn),
            Err(poisoned) => data_version(&poisoned.into_inner()),
        };
        match version {
            Ok(version) if version == self.last_version => false,
            Ok(version) => {
                self.last_version = version;
                true
            }
            Err(err) => {
                // Reporting a change makes the caller poll, which surfaces the real error.
                tracing::warn!(%err, "PRAGMA data_version failed");
                true
            }
        }
    }

    /// Waits until another connection commits or `timeout` passes; true on a change.
    /// Cancel-safe: dropping the future loses no event.
    pub async fn wait(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        // A later deadline than the last only moves the timer's expiry. The timers stay in
        // `self` whether this future ends or is dropped, and stay set after a change: the next
        // wait moves them (one reset, not two), and one not moved in time wakes the task once.
        self.deadline.set(Some(deadline));
        // With inotify, every commit since the last check left an event (read below) or is on
        // the ladder (a commit not yet visible at that check): a check now would only repeat
        // the last one. A loop waits here between each of a turn's events, so that repeat was
        // a `PRAGMA data_version` (and its lock calls) per event. Polling has no such record.
        let mut check = matches!(self.source, Source::Poll(_));
        loop {
            match &mut self.source {
                Source::Notify(source) => {
                    // Events already queued (our own writes' among them) are read before the
                    // check, so they are explained by it, except a commit not yet visible:
                    // that is what the ladder's re-checks are for.
                    if source.drain() {
                        self.ladder.restart(Instant::now());
                        check = true;
                    }
                }
                Source::Poll(stat) => check |= stat.touched(),
            }
            if check && self.changed() {
                return true;
            }
            check = false;
            self.recheck.set(self.ladder.due());
            tokio::select! {
                biased;
                () = self.deadline.ring() => return self.changed(),
                () = self.recheck.ring() => {
                    self.ladder.advance(Instant::now());
                    check = true;
                }
                _ = self.source.next_sign() => {}
            }
        }
    }
}

impl Source {
    /// Resolves when there may be something new to look at: readable events, or the next poll
    /// tick. Cancel-safe.
    async fn next_sign(&mut self) {
        match self {
            Source::Notify(source) => source.readable().await,
            Source::Poll(_) => tokio::time::sleep(POLL_INTERVAL).await,
        }
    }
}

fn data_version(conn: &rusqlite::Connection) -> rusqlite::Result<i64> {
    // Cached: this runs after every event and every re-check.
    conn.prepare_cached("PRAGMA data_version")?
        .query_row([], |r| r.get(0))
}

/// `<db>-wal`, beside the DB.
fn wal_path(db: &std::path::Path) -> std::path::PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    std::path::PathBuf::from(name)
}

#[cfg(test)]
mod tests;
