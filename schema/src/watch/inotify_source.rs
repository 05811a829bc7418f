//! The inotify side of [`super::DbWatcher`]: one instance, two watches (the `-wal` file for
//! writes, its folder for the `-wal` file's re-creation), read on the caller's tokio reactor.
//!
//! Only what a commit does is subscribed to: `IN_MODIFY` on the `-wal` file, `IN_CREATE` and
//! `IN_MOVED_TO` on the folder (names filtered to the `-wal` file). Writes to the DB file
//! (checkpoints), the `-shm` file and anything else in the folder wake nobody.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::shortage::{Shortage, Step};
use super::wal_stat::POLL_INTERVAL;

/// Bytes read per `read(2)`: room for about a hundred events with the `-wal` file's name.
const BUFFER_BYTES: usize = 4096;

enum State {
    /// Set up; not yet registered with a reactor (a watcher may be created outside one).
    Idle(Inotify),
    /// Registered with the tokio reactor of the first `wait`.
    Registered(AsyncFd<Inotify>),
    /// Broken after setup (a read failed, the `-wal` file could not be watched again, no
    /// reactor registration): every poll tick is treated as a possible change.
    Gone,
}

pub(super) struct InotifySource {
    state: State,
    wal: PathBuf,
    wal_name: OsString,
    folder: WatchDescriptor,
    wal_watch: Option<WatchDescriptor>,
    buffer: Box<[u8]>,
}

impl InotifySource {
    /// Sets up the instance and its watches; the error says which limit ran out.
    pub(super) fn new(wal: &Path) -> Result<Self, Shortage> {
        let inotify = Inotify::init().map_err(|err| Shortage::classify(Step::Instance, err))?;
        let folder_path = match wal.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let folder = inotify
            .watches()
            .add(
                &folder_path,
                WatchMask::CREATE | WatchMask::MOVED_TO | WatchMask::ONLYDIR,
            )
            .map_err(|err| Shortage::classify(Step::Watch, err))?;
        // After the folder's watch, so a `-wal` file created in between is seen either way.
        let wal_watch =
            watch_wal(&inotify, wal).map_err(|err| Shortage::classify(Step::Watch, err))?;
        Ok(Self {
            state: State::Idle(inotify),
            wal: wal.to_path_buf(),
            wal_name: wal.file_name().map(|n| n.to_owned()).unwrap_or_default(),
            folder,
            wal_watch,
            buffer: vec![0; BUFFER_BYTES].into_boxed_slice(),
        })
    }

    /// Reads every queued event without blocking; true when one may mean a commit.
    pub(super) fn drain(&mut self) -> bool {
        let Self {
            state,
            wal,
            wal_name,
            folder,
            wal_watch,
            buffer,
        } = self;
        let inotify = match state {
            State::Idle(inotify) => inotify,
            State::Registered(fd) => fd.get_mut(),
            State::Gone => return true,
        };
        let mut relevant = false;
        let mut rewatch = false;
        loop {
            match inotify.read_events(buffer) {
                Ok(events) => {
                    for event in events {
                        if event.mask.contains(EventMask::Q_OVERFLOW) {
                            relevant = true;
                        } else if Some(&event.wd) == wal_watch.as_ref() {
                            relevant = true;
                            if event.mask.contains(EventMask::IGNORED) {
                                // The `-wal` file is gone; its successor's creation re-arms.
                                *wal_watch = None;
                            }
                        } else if event.wd == *folder
                            && event.name.is_some_and(|name| name == wal_name.as_os_str())
                        {
                            relevant = true;
                            rewatch = true;
                        }
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                Err(err) => {
                    tracing::warn!(%err, "reading inotify events failed; checking the session DB every few milliseconds");
                    *state = State::Gone;
                    return true;
                }
            }
        }
        if rewatch {
            match watch_wal(inotify, wal) {
                Ok(watch) => *wal_watch = watch,
                Err(err) => {
                    Shortage::classify(Step::Watch, err).warn_once();
                    *state = State::Gone;
                }
            }
        }
        relevant
    }

    /// Resolves when events are queued (then [`Self::drain`] reads them). Cancel-safe.
    pub(super) async fn readable(&mut self) {
        if matches!(self.state, State::Idle(_)) && tokio::runtime::Handle::try_current().is_ok() {
            self.state = match std::mem::replace(&mut self.state, State::Gone) {
                // SAFETY: `Inotify` owns its descriptor until it is dropped (with the `AsyncFd`)
                // and `as_raw_fd` always returns that one.
                State::Idle(inotify) => {
                    match unsafe { AsyncFd::register_with_interest(inotify, Interest::READABLE) } {
                        Ok(fd) => State::Registered(fd),
                        Err(err) => {
                            tracing::warn!(%err, "could not register inotify with the reactor; checking the session DB every few milliseconds");
                            State::Gone
                        }
                    }
                }
                other => other,
            };
        }
        match &self.state {
            State::Registered(fd) => {
                // The caller drains right after, so clearing the readiness here loses nothing:
                // an event queued after that read raises readiness again.
                let ready = fd.readable().await.map(|mut guard| guard.clear_ready());
                if let Err(err) = ready {
                    tracing::warn!(%err, "waiting for inotify events failed; checking the session DB every few milliseconds");
                    self.state = State::Gone;
                }
            }
            State::Idle(_) | State::Gone => tokio::time::sleep(POLL_INTERVAL).await,
        }
    }
}

/// Watches the `-wal` file for writes; `None` when it does not exist (yet).
fn watch_wal(inotify: &Inotify, wal: &Path) -> io::Result<Option<WatchDescriptor>> {
    match inotify.watches().add(wal, WatchMask::MODIFY) {
        Ok(watch) => Ok(Some(watch)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}
