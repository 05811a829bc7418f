//! Which sessions the fleet supervises, and what wakes it when one of them changes.
//!
//! Discovery is `serve --root`'s ([`Served::Root`]): every real folder `ROOT/<name>/` with a
//! `session.db`, the name validated before it is joined to the root. One inotify instance
//! watches the root (folders appearing or going) and each session folder (its `-wal` file
//! written or made: every commit writes it; a `session.db` made or moved in), so work arriving wakes the fleet
//! without a poll interval. Without inotify (no instance or watch left for this user) the fleet
//! re-reads every session each [`POLL_FALLBACK`], and says so once.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::serve::Served;

/// How often every session is re-read when inotify cannot be had.
pub(crate) const POLL_FALLBACK: Duration = Duration::from_millis(500);

/// Bytes read per `read(2)`.
const BUFFER_BYTES: usize = 16 * 1024;

/// The sessions under `root`, sorted by name: (name, DB path).
pub(crate) fn discover(root: &Path) -> Vec<(String, PathBuf)> {
    let served = Served::Root(root.to_path_buf());
    served
        .names()
        .into_iter()
        .filter_map(|name| {
            let db = served.db_path(&name)?;
            Some((name, db))
        })
        .collect()
}

/// What changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// A session's DB was written.
    Session(String),
    /// The root's entries changed (a session may have appeared or gone), or events were lost.
    Root,
}

/// One inotify instance for the root and every session folder.
pub(crate) struct Watcher {
    fd: AsyncFd<Inotify>,
    root: WatchDescriptor,
    sessions: HashMap<WatchDescriptor, String>,
    by_name: HashMap<String, WatchDescriptor>,
    buffer: Box<[u8]>,
}

impl Watcher {
    /// Watches `root` (inside a tokio runtime).
    pub(crate) fn new(root: &Path) -> io::Result<Self> {
        let inotify = Inotify::init()?;
        let root_wd = inotify.watches().add(
            root,
            WatchMask::CREATE
                | WatchMask::MOVED_TO
                | WatchMask::MOVED_FROM
                | WatchMask::DELETE
                | WatchMask::ONLYDIR,
        )?;
        Ok(Self {
            // SAFETY: `Inotify` owns its descriptor until it is dropped (with the `AsyncFd`) and
            // `as_raw_fd` always returns that one.
            fd: unsafe { AsyncFd::register_with_interest(inotify, Interest::READABLE) }?,
            root: root_wd,
            sessions: HashMap::new(),
            by_name: HashMap::new(),
            buffer: vec![0; BUFFER_BYTES].into_boxed_slice(),
        })
    }

    /// Watches the folder of session `name` (a no-op when watched already).
    pub(crate) fn watch_session(&mut self, name: &str, folder: &Path) -> io::Result<()> {
        if self.by_name.contains_key(name) {
            return Ok(());
        }
        let wd = self.fd.get_ref().watches().add(
            folder,
            WatchMask::MODIFY
                | WatchMask::CREATE
                | WatchMask::MOVED_TO
                | WatchMask::ONLYDIR
                | WatchMask::DONT_FOLLOW,
        )?;
        self.sessions.insert(wd.clone(), name.to_owned());
        self.by_name.insert(name.to_owned(), wd);
        Ok(())
    }

    /// Stops watching session `name`.
    pub(crate) fn unwatch_session(&mut self, name: &str) {
        if let Some(wd) = self.by_name.remove(name) {
            self.sessions.remove(&wd);
            let _ = self.fd.get_ref().watches().remove(wd);
        }
    }

    /// Waits for events; returns what they mean (deduplicated). Cancel-safe.
    pub(crate) async fn next(&mut self) -> io::Result<Vec<Change>> {
        let Self {
            fd,
            root,
            sessions,
            buffer,
            ..
        } = self;
        loop {
            let mut guard = fd.readable_mut().await?;
            let mut changes = Vec::new();
            match guard.get_inner_mut().read_events(buffer) {
                Ok(events) => {
                    for event in events {
                        let change = if event.mask.contains(EventMask::Q_OVERFLOW)
                            || event.mask.contains(EventMask::IGNORED)
                            || event.wd == *root
                        {
                            // A lost event, a folder gone, or the root's entries changed.
                            Some(Change::Root)
                        } else {
                            // Commits write the `-wal` file (a checkpoint writes `session.db`
                            // and is no news); a `session.db` made or moved in is a new DB.
                            let is_db = event.name.is_some_and(|name| {
                                name == "session.db-wal"
                                    || (name == "session.db"
                                        && event
                                            .mask
                                            .intersects(EventMask::CREATE | EventMask::MOVED_TO))
                            });
                            sessions
                                .get(&event.wd)
                                .filter(|_| is_db)
                                .map(|name| Change::Session(name.clone()))
                        };
                        if let Some(change) = change {
                            if !changes.contains(&change) {
                                changes.push(change);
                            }
                        }
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    guard.clear_ready();
                    continue;
                }
                Err(err) => return Err(err),
            }
            if !changes.is_empty() {
                return Ok(changes);
            }
        }
    }
}
