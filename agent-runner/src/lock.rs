//! The single-runner lock: an exclusive `flock` on `<db>.lock`, held for the process lifetime.
//! The kernel drops it when the process dies, so a crash never leaves a stale lock.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};

/// Holds the lock until dropped.
#[derive(Debug)]
pub struct RunnerLock {
    _lock: Flock<File>,
    path: PathBuf,
}

impl RunnerLock {
    /// Takes the lock beside `db_path`, or fails naming the holder's pid.
    pub fn acquire(db_path: &Path) -> Result<Self> {
        let mut name = db_path.as_os_str().to_owned();
        name.push(".lock");
        let path = PathBuf::from(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening the runner lock {}", path.display()))?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((mut file, _)) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let who = if holder.is_empty() {
                    String::new()
                } else {
                    format!(" (pid {holder})")
                };
                bail!(
                    "another agent-runner{who} is already running on {}: only one runner may own a session DB (lock {})",
                    db_path.display(),
                    path.display()
                );
            }
        };
        lock.set_len(0).context("writing the runner lock")?;
        lock.seek(SeekFrom::Start(0))
            .context("writing the runner lock")?;
        write!(lock, "{}", std::process::id()).context("writing the runner lock")?;
        lock.flush().context("writing the runner lock")?;
        Ok(Self { _lock: lock, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
