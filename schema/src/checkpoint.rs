//! WAL checkpoints off the commit path.
//!
//! SQLite's auto-checkpoint copies the WAL back into the DB file inside the commit that takes
//! the WAL past 1,000 frames: that commit then waits for two `fsync`s (3-11 ms here), and
//! whoever made it (the runner writing a reply, the host inserting a message) is late by as
//! much. That was the p99 of insert → reply (issue 12). Here the same checkpoint, at the same
//! size, runs on a short-lived thread of its own, after the commit returned:
//! - every connection's WAL hook (which replaces SQLite's auto-checkpoint) notes the WAL's
//!   length after a commit made through a pooled connection of a [`SessionDb`] (the thread says
//!   so while it holds one: [`Borrowed`]);
//! - when that borrow ends with the WAL at [`CHECKPOINT_FRAMES`] or more, the DB starts a
//!   `PASSIVE` checkpoint on another thread (one at a time per [`SessionDb`]); a `PASSIVE`
//!   checkpoint blocks no reader or writer, so the next claim or insert goes on meanwhile.
//!
//! Commits on any other connection (a dedicated one, or one configured by another program with
//! [`crate::db::configure_connection`]) are checkpointed in the commit, at the same length, as
//! SQLite's own auto-checkpoint would; so are pooled commits when the WAL has reached
//! [`INLINE_CHECKPOINT_FRAMES`] (background checkpoints failing or starved): the WAL's growth
//! keeps SQLite's bound either way. A crash at any point is as safe as with SQLite's own
//! checkpoints: a checkpoint only copies committed frames.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rusqlite::hooks::Wal;
use rusqlite::Connection;

/// The WAL length, in frames, at which a checkpoint starts: SQLite's own auto-checkpoint
/// default, so the DB file and the WAL stay as large as before.
pub(crate) const CHECKPOINT_FRAMES: c_int = 1000;

/// The WAL length at which a commit checkpoints in place even on a pooled connection, as
/// SQLite would: the background checkpoints have not kept up (each `PASSIVE` one stops at the
/// oldest reader's snapshot), so the commit path pays once more rather than the WAL growing.
const INLINE_CHECKPOINT_FRAMES: c_int = 16 * CHECKPOINT_FRAMES;

thread_local! {
    /// How many pooled connections of a [`crate::SessionDb`] this thread holds.
    static BORROWED: Cell<u32> = const { Cell::new(0) };
    /// The WAL length after this thread's last commit that asked for a checkpoint (0: none).
    static DUE: Cell<c_int> = const { Cell::new(0) };
}

/// Makes `conn` note its commits' WAL length instead of checkpointing in the commit (see the
/// module doc). Replaces SQLite's auto-checkpoint, which is itself a WAL hook.
pub(crate) fn install(conn: &Connection) {
    conn.wal_hook(Some(on_commit));
}

fn on_commit(wal: &Wal, frames: c_int) -> rusqlite::Result<()> {
    if frames < CHECKPOINT_FRAMES {
        return Ok(());
    }
    if BORROWED.get() > 0 && frames < INLINE_CHECKPOINT_FRAMES {
        DUE.set(DUE.get().max(frames));
        return Ok(());
    }
    // What SQLite's auto-checkpoint does (a PASSIVE checkpoint); its failure (a checkpoint
    // already running elsewhere) is not the commit's: the commit stands.
    if let Err(err) = wal.checkpoint() {
        tracing::debug!(%err, frames, "checkpoint in the commit did not complete");
    }
    Ok(())
}

/// Marks this thread as holding a pooled connection for as long as it lives; its end tells
/// whether a commit made meanwhile left the WAL due for a checkpoint.
pub(crate) struct Borrowed(());

impl Borrowed {
    pub(crate) fn start() -> Self {
        BORROWED.set(BORROWED.get() + 1);
        Self(())
    }

    /// Ends the borrow: true when the WAL is due for a checkpoint (once per due commit).
    pub(crate) fn end(self) -> bool {
        // `Drop` lowers the count.
        DUE.replace(0) >= CHECKPOINT_FRAMES
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        BORROWED.set(BORROWED.get().saturating_sub(1));
    }
}

/// One DB's background checkpoints: at most one runs at a time.
#[derive(Debug, Default, Clone)]
pub(crate) struct Checkpointer {
    running: Arc<AtomicBool>,
    /// Background checkpoints started so far (for the debug log and tests).
    started: Arc<AtomicU64>,
}

impl Checkpointer {
    /// Runs `checkpoint` on a thread of its own unless one already runs. When no thread can
    /// be started, the next due commit tries again, and [`INLINE_CHECKPOINT_FRAMES`] bounds
    /// the WAL meanwhile.
    pub(crate) fn start(
        &self,
        checkpoint: impl FnOnce() -> Result<(i64, i64, i64), crate::Error> + Send + 'static,
    ) {
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let count = self.started.fetch_add(1, Ordering::Relaxed) + 1;
        let running = Arc::clone(&self.running);
        let spawned = std::thread::Builder::new()
            .name("db-checkpoint".to_owned())
            .spawn(move || {
                let started = Instant::now();
                match checkpoint() {
                    Ok((busy, log, copied)) => tracing::debug!(
                        count,
                        busy,
                        log,
                        copied,
                        ms = started.elapsed().as_secs_f64() * 1000.0,
                        "WAL checkpoint"
                    ),
                    Err(err) => {
                        tracing::warn!(%err, "WAL checkpoint failed; the next one retries")
                    }
                }
                running.store(false, Ordering::Release);
            });
        if let Err(err) = spawned {
            tracing::warn!(%err, "no thread for a WAL checkpoint; the next commit retries");
            self.running.store(false, Ordering::Release);
        }
    }

    /// Background checkpoints started so far, and whether one runs now.
    #[cfg(test)]
    pub(crate) fn progress(&self) -> (u64, bool) {
        (
            self.started.load(Ordering::Relaxed),
            self.running.load(Ordering::Acquire),
        )
    }
}

/// `PRAGMA wal_checkpoint(PASSIVE)`: (busy, WAL frames, frames copied).
pub(crate) fn passive(conn: &Connection) -> rusqlite::Result<(i64, i64, i64)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((row.get(0)?, row.get(1)?, row.get(2)?))
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::{NewMessageIn, OpenOptions, SessionDb};

    fn wal_len(db: &SessionDb) -> u64 {
        let mut wal = db.path().as_os_str().to_owned();
        wal.push("-wal");
        std::fs::metadata(wal).map(|meta| meta.len()).unwrap_or(0)
    }

    fn wait_idle(db: &SessionDb) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while db.checkpointer.progress().1 {
            assert!(
                Instant::now() < deadline,
                "the background checkpoint never ended"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The commit that takes the WAL past the threshold does not copy it back itself: a
    /// thread does, after; and the WAL keeps SQLite's bound (it restarts after each one).
    #[test]
    fn pooled_commits_past_the_threshold_checkpoint_on_another_thread() {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open(dir.path().join("session.db")).unwrap();
        let text = "x".repeat(6000);
        let row = NewMessageIn::new("chat", format!(r#"{{"text":"{text}"}}"#));
        let mut largest = 0;
        for _ in 0..1500 {
            db.insert_in(&row).unwrap();
            wait_idle(&db);
            largest = largest.max(wal_len(&db));
        }
        let (started, _) = db.checkpointer.progress();
        // 1,500 commits of 2-3 frames each: the WAL reached 1,000 frames several times.
        assert!(started >= 2, "background checkpoints started: {started}");
        // 1,000 frames of 4 KiB and the commit that crossed them; not 3,000+ frames.
        assert!(largest < 6 << 20, "the WAL grew to {largest} bytes");
    }

    /// A connection outside the pool checkpoints in its commits, as SQLite's auto-checkpoint
    /// does: its WAL stays bounded with nobody to start a background checkpoint.
    #[test]
    fn other_connections_checkpoint_in_the_commit() {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open(dir.path().join("session.db")).unwrap();
        let conn = db.dedicated_connection().unwrap();
        conn.execute_batch("CREATE TABLE scratch (body BLOB)")
            .unwrap();
        for _ in 0..3000 {
            conn.execute("INSERT INTO scratch VALUES (zeroblob(4000))", [])
                .unwrap();
        }
        assert_eq!(db.checkpointer.progress().0, 0);
        let wal = wal_len(&db);
        // 3,000 frames unchecked would be 12 MB.
        assert!(wal < 6 << 20, "the WAL grew to {wal} bytes");
    }

    /// `with_lock_wait` bounds a call's wait for a lock, and only inside it: the connection
    /// goes back to the pool with its own busy timeout.
    #[test]
    fn with_lock_wait_gives_up_early_and_only_inside_it() {
        let dir = tempfile::tempdir().unwrap();
        let options = OpenOptions {
            busy_timeout: Duration::from_secs(5),
            pool_size: 1,
            ..OpenOptions::default()
        };
        let db = SessionDb::open_with(dir.path().join("session.db"), options).unwrap();
        let holder = db.dedicated_connection().unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let row = NewMessageIn::new("chat", r#"{"text":"hi"}"#.to_owned());

        let asked = Instant::now();
        let err = crate::db::with_lock_wait(Duration::from_millis(20), || db.insert_in(&row))
            .unwrap_err();
        assert!(err.is_busy(), "{err}");
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "waited {:?} for the lock",
            asked.elapsed()
        );

        // Outside it, the same (only) connection waits for the lock again.
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            holder.execute_batch("COMMIT").unwrap();
        });
        db.insert_in(&row).unwrap();
        release.join().unwrap();
    }
}
