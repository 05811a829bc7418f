//! Change notification for the session DB: a file watch on the DB's folder filtered to the
//! `-wal` file, confirmed with `PRAGMA data_version` on a dedicated connection.
//!
//! The folder is watched, not the file, because `-wal` is deleted and recreated. An event can
//! arrive before the commit is visible (the `-shm` index is written through mmap, which raises
//! no event), so an event without a visible change is re-checked a few milliseconds later.
//! Callers always pass a timeout: the watch speeds wake-ups up, the poll stays the fallback.

use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::{sleep, sleep_until, Instant};

use crate::{Error, SessionDb};

/// Re-check delays after an event that showed no change yet.
const RECHECK_DELAYS_MS: [u64; 4] = [1, 3, 10, 30];

/// Wakes a task when another connection commits to the session DB.
pub struct DbWatcher {
    _watcher: Option<notify::RecommendedWatcher>,
    events: mpsc::Receiver<()>,
    // A mutex makes the watcher Sync, so a task holding `&self` across an await stays Send.
    conn: std::sync::Mutex<rusqlite::Connection>,
    last_version: i64,
}

impl DbWatcher {
    /// Starts watching `db`. If the file watch cannot be set up (no inotify), the watcher still
    /// works as a pure timeout poll; that is logged once.
    pub fn new(db: &SessionDb) -> Result<Self, Error> {
        let conn = db.dedicated_connection()?;
        let last_version = data_version(&conn)?;
        let (sender, events) = mpsc::channel(1);
        let watcher = match watch_folder(db, sender) {
            Ok(watcher) => Some(watcher),
            Err(err) => {
                tracing::warn!(%err, "no file notifications for the session DB; falling back to polling");
                None
            }
        };
        Ok(Self {
            _watcher: watcher,
            events,
            conn: std::sync::Mutex::new(conn),
            last_version,
        })
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
    pub async fn wait(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.changed() {
                return true;
            }
            tokio::select! {
                event = self.events.recv() => {
                    if event.is_none() {
                        sleep_until(deadline).await;
                        return self.changed();
                    }
                    for delay in RECHECK_DELAYS_MS {
                        if self.changed() {
                            return true;
                        }
                        if Instant::now() + Duration::from_millis(delay) >= deadline {
                            break;
                        }
                        sleep(Duration::from_millis(delay)).await;
                    }
                }
                _ = sleep_until(deadline) => return self.changed(),
            }
        }
    }
}

fn data_version(conn: &rusqlite::Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA data_version", [], |r| r.get(0))
}

fn watch_folder(
    db: &SessionDb,
    sender: mpsc::Sender<()>,
) -> Result<notify::RecommendedWatcher, Error> {
    let path = db.path();
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let wal_name = format!("{file_name}-wal");
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if matches!(event.kind, notify::EventKind::Access(_)) {
            return;
        }
        let relevant = event.paths.iter().any(|p| {
            p.file_name().is_some_and(|n| {
                n.to_string_lossy() == wal_name || n.to_string_lossy() == file_name
            })
        });
        if relevant {
            // A full channel already holds a wake-up; dropping this one loses nothing.
            let _ = sender.try_send(());
        }
    })?;
    watcher.watch(&folder, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}
