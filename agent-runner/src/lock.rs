//! The single-runner lock: an exclusive `flock` on the session DB file itself, held for the
//! process lifetime. Locking the file (not a name beside it) keys the lock on the DB's identity:
//! a second runner that reaches the same DB through a symlink, a hard link or a bind mount is
//! refused too. The kernel drops the lock when the process dies, so a crash never leaves a stale
//! lock. The holder's pid is written to `<db>.lock` (resolved path) for the refusal message.
//!
//! `flock` locks are independent of SQLite's POSIX (`fcntl`) locks on Linux, and this
//! descriptor is opened before the process's first SQLite connection and closed after its last,
//! so it never costs SQLite a lock (see the `fsguard` crate for why closing one could).

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};

/// Holds the lock until dropped.
#[derive(Debug)]
pub struct RunnerLock {
    _lock: Flock<File>,
    pid_file: PathBuf,
}

impl RunnerLock {
    /// Takes the lock on the DB at `db_path` (which must exist), or fails naming the holder's
    /// pid.
    pub fn acquire(db_path: &Path) -> Result<Self> {
        let resolved = std::fs::canonicalize(db_path)
            .with_context(|| format!("resolving the session DB {}", db_path.display()))?;
        let mut name = resolved.as_os_str().to_owned();
        name.push(".lock");
        let pid_file = PathBuf::from(name);
        let file = File::open(&resolved)
            .with_context(|| format!("opening the session DB {} to lock it", db_path.display()))?;
        let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((file, _)) => {
                let holder = file
                    .metadata()
                    .ok()
                    .and_then(|meta| flock_holder(&meta))
                    .or_else(|| {
                        let text = fsguard::read_to_string(&pid_file).ok()?;
                        Some(text.trim().to_owned()).filter(|pid| !pid.is_empty())
                    });
                let who = holder
                    .map(|pid| format!(" (pid {pid})"))
                    .unwrap_or_default();
                bail!(
                    "another agent-runner{who} is already running on {} (reached as {}): only one runner may own a session DB",
                    resolved.display(),
                    db_path.display(),
                );
            }
        };
        // The folder is the agent's to write: the pid file may have been replaced by a link (to
        // the DB itself), which `write_private` replaces instead of following. The pid is only
        // for the refusal message: failing to write it costs nothing else.
        fsguard::protect_db(db_path);
        if let Err(err) =
            fsguard::write_private(&pid_file, std::process::id().to_string().as_bytes())
        {
            tracing::warn!(file = %pid_file.display(), %err, "cannot write the runner's pid beside the session DB");
        }
        Ok(Self {
            _lock: lock,
            pid_file,
        })
    }

    /// The file holding the runner's pid.
    pub fn path(&self) -> &Path {
        &self.pid_file
    }
}

/// The pid holding an exclusive `flock` on the file of `meta`, from `/proc/locks` (whose lines
/// read `1: FLOCK  ADVISORY  WRITE <pid> <major>:<minor>:<inode> 0 EOF`, device numbers in
/// hex): found whatever name the holder opened the file by.
fn flock_holder(meta: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = meta.dev();
    let wanted = format!(
        "{:02x}:{:02x}:{}",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev),
        meta.ino()
    );
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let is_flock = fields.get(1) == Some(&"FLOCK") && fields.get(3) == Some(&"WRITE");
        (is_flock && fields.get(5) == Some(&wanted.as_str()))
            .then(|| fields.get(4).map(|p| (*p).to_owned()))?
    })
}
