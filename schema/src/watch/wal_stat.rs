//! The fallback without inotify: a `stat` of the `-wal` file per tick. Every commit writes the
//! `-wal` file, so a commit changes its identity, size or mtime, except that an mtime is as
//! coarse as the kernel's clock tick and a `-wal` file reused after a checkpoint keeps its size:
//! two commits within one tick can leave the same stamp. So a stamp younger than
//! [`RECENT_WRITE`] is always confirmed with `PRAGMA data_version` too.
//!
//! The wal-index header in the `-shm` file would be more exact, but reading it means opening
//! one of the DB's files, and closing that descriptor would drop this process's SQLite locks
//! (ARCHITECTURE.md, "file identity"); a `stat` opens nothing.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// How often the fallback looks at the `-wal` file (a `stat`, no SQL unless it changed).
pub const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// How long after its last write the `-wal` file is confirmed on every tick (several coarse
/// clock ticks, so a second commit within the first's tick is still seen).
const RECENT_WRITE: Duration = Duration::from_millis(50);

/// What a `stat` says about the `-wal` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

pub(super) struct WalStat {
    wal: PathBuf,
    last: Option<Stamp>,
}

impl WalStat {
    pub(super) fn new(wal: PathBuf) -> Self {
        let last = stamp(&wal);
        Self { wal, last }
    }

    /// True when the `-wal` file may hold a commit not yet confirmed: its stamp changed since
    /// the last call, or it was written within [`RECENT_WRITE`].
    pub(super) fn touched(&mut self) -> bool {
        let now = stamp(&self.wal);
        let changed = now != self.last;
        self.last = now;
        changed || now.is_some_and(|stamp| written_recently(stamp.mtime))
    }
}

fn stamp(wal: &std::path::Path) -> Option<Stamp> {
    let meta = std::fs::metadata(wal).ok()?;
    Some(Stamp {
        dev: meta.dev(),
        ino: meta.ino(),
        size: meta.size(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
        ctime: (meta.ctime(), meta.ctime_nsec()),
    })
}

fn written_recently((secs, nanos): (i64, i64)) -> bool {
    let Ok(secs) = u64::try_from(secs) else {
        return false;
    };
    let written = SystemTime::UNIX_EPOCH
        + Duration::from_secs(secs)
        + Duration::from_nanos(u64::try_from(nanos).unwrap_or(0));
    match SystemTime::now().duration_since(written) {
        Ok(age) => age < RECENT_WRITE,
        // Written "in the future" (the clock was set back): confirm rather than miss it.
        Err(_) => true,
    }
}
