//! Opening the session DB: pragmas, SQL functions, schema and migrations, the pool, and the
//! `BEGIN IMMEDIATE` write transaction every other module of this crate writes through. The
//! queries live in topical `impl SessionDb` files (`messages`, `queue`, `completion`, `batch`,
//! `runner_state`, `state`, `questions`, `sweep`, `destinations`, `delivered`, `tasks`,
//! `routing`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use chrono_tz::Tz;
use r2d2::{Pool, PooledConnection};
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::config::DbConfig;
use rusqlite::functions::FunctionFlags;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Transaction, TransactionBehavior};
use scheduled_thread_pool::ScheduledThreadPool;

use crate::checkpoint::{self, Borrowed, Checkpointer};
use crate::rows::{lenient_flag, lossy_text};
use crate::sql::{COLUMNS, INDEXES, OPEN_ROWS_INDEXES, SCHEMA, TRIGGERS};
use crate::time::parse_ts;
use crate::Error;

/// How long a connection waits for another writer before `SQLITE_BUSY`.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Prepared statements each connection keeps (rusqlite's default is 16). A runner's message
/// runs about 20 distinct statements (poll, claim, replies, completion, runner state, session
/// state, destinations); with fewer slots the least recent are evicted and re-prepared on
/// every message, which cost ~8 % of its CPU (issue 12).
const STATEMENT_CACHE_CAPACITY: usize = 64;

/// Threads of the one scheduler every pool of this process opens its connections on.
/// r2d2 gives each pool a scheduler of three threads of its own unless told otherwise: a
/// process holding 100 DBs (`serve`) ran 300 threads that only ever opened a connection now
/// and then (issue 40). Two, so that one open waiting on a lock does not hold up the others.
const POOL_SCHEDULER_THREADS: usize = 2;

/// The scheduler all pools share (see [`POOL_SCHEDULER_THREADS`]); its threads start with the
/// first pool and live as long as the process.
static POOL_SCHEDULER: LazyLock<Arc<ScheduledThreadPool>> = LazyLock::new(|| {
    Arc::new(
        ScheduledThreadPool::builder()
            .num_threads(POOL_SCHEDULER_THREADS)
            .thread_name_pattern("sqlite-pool-{}")
            .build(),
    )
});

/// Options for [`SessionDb::open_with`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Busy timeout, set first on every connection.
    pub busy_timeout: Duration,
    /// Maximum pooled connections.
    pub pool_size: u32,
    /// Time zone for cron schedules.
    pub timezone: Tz,
    /// Create tables and add missing columns (writers); readers may skip it.
    pub migrate: bool,
    /// Page cache of each pooled connection, in KiB (`PRAGMA cache_size = -N`); `None` keeps
    /// SQLite's default (2,000 KiB). A process that reads little (mcp-tools) sets less: each
    /// connection's cache fills with the pages it touched and stays resident (issue 12).
    pub cache_kib: Option<u32>,
    /// Keep one pooled connection open and idle at all times (opened at once, and again in the
    /// background whenever the idle one is taken). Off, connections are opened when a call
    /// needs one and none is idle: a process holding many DBs that are rarely used at once
    /// (`serve`) keeps one connection per DB instead of two (issue 40).
    pub keep_idle: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            pool_size: 4,
            timezone: Tz::UTC,
            migrate: true,
            cache_kib: None,
            keep_idle: true,
        }
    }
}

/// Applies the connection pragmas in the order docs/contract/db.md#connections requires:
/// busy_timeout first, so that switching to WAL (which needs a lock) already waits instead of
/// failing. Then registers the SQL functions the shared queries use (see [`register_functions`]).
pub fn configure_connection(conn: &Connection, busy_timeout: Duration) -> rusqlite::Result<()> {
    conn.busy_timeout(busy_timeout)?;
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;",
    )?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    // Query-planner stability: without it, SQLite ties a plan to the values bound to `LIMIT ?`
    // and compared variables, expires the statement on every new binding and parses it again
    // at its next step, so the poll's cached statements were re-prepared on every poll.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    // Checkpoints leave the commit path of pooled connections (crate::checkpoint).
    checkpoint::install(conn);
    register_functions(conn)
}

/// Registers the SQL functions through which queries read stored values exactly as Rust does,
/// so SQL and Rust never disagree about a row:
/// - `ts_millis(x)`: the instant `x` names, as Unix milliseconds, read by [`parse_ts`] (every
///   form it accepts, e.g. the `+0200` offsets that SQLite's `julianday()` rejects); NULL when `x`
///   is NULL or no readable time.
/// - `flag_of(x, default)`: a 0/1 flag column read as `MessageIn::read` reads it (`'true'`,
///   `' 1 '`, …; `default` for an unreadable value).
pub fn register_functions(conn: &Connection) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8
        | FunctionFlags::SQLITE_DETERMINISTIC
        | FunctionFlags::SQLITE_INNOCUOUS;
    conn.create_scalar_function("ts_millis", 1, flags, |ctx| {
        Ok(lossy_text(ctx.get_raw(0))
            .and_then(|text| parse_ts(&text).ok())
            .map(|at| at.timestamp_millis()))
    })?;
    conn.create_scalar_function("flag_of", 2, flags, |ctx| {
        let default = lenient_flag(ctx.get_raw(1), false);
        Ok(lenient_flag(ctx.get_raw(0), default))
    })
}

/// A handle on one session DB: a small pool of configured connections, and for a handle made
/// by [`SessionDb::pinned`] one connection of its own that its calls use first. Cheap to clone.
#[derive(Clone)]
pub struct SessionDb {
    pool: Pool<SqliteConnectionManager>,
    path: PathBuf,
    timezone: Tz,
    busy_timeout: Duration,
    cache_kib: Option<u32>,
    pub(crate) checkpointer: Checkpointer,
    /// The connection a pinned handle's calls use while it is free (see [`SessionDb::pinned`]).
    pinned: Option<Arc<Mutex<Connection>>>,
}

impl std::fmt::Debug for SessionDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionDb")
            .field("path", &self.path)
            .finish()
    }
}

impl SessionDb {
    /// Opens (creating if needed) the DB at `path` with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::open_with(path, OpenOptions::default())
    }

    /// Opens the DB at `path`: pragmas on every connection, schema and migrations once.
    /// A DB whose folder is on a shared filesystem is refused first, before anything is opened
    /// or created ([`Error::SharedFilesystem`]).
    pub fn open_with(path: impl AsRef<Path>, options: OpenOptions) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        // Every session DB this workspace opens comes through here (or `health::check`): WAL
        // needs every process that opens it on one kernel (docs/contract/db.md, "Where the DB
        // may live").
        fsguard::refuse_shared_filesystem(&path)?;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            if !parent.is_dir() {
                return Err(Error::MissingDirectory(parent.to_path_buf()));
            }
        }
        // Before the first connection: from now on this process never opens these files as
        // input (an open and close would drop the connections' locks; see `fsguard`).
        fsguard::protect_db(&path);
        let busy_timeout = options.busy_timeout;
        let cache_kib = options.cache_kib;
        let configure = move |conn: &Connection| {
            configure_connection(conn, busy_timeout)?;
            match cache_kib {
                Some(kib) => conn.pragma_update(None, "cache_size", -i64::from(kib)),
                None => Ok(()),
            }
        };
        // One connection first, outside the pool: a file that is not a database (or cannot be
        // opened) fails here at once with its path, where the pool would retry until timeout.
        let first = Connection::open(&path)
            .and_then(|conn| {
                configure(&conn)?;
                conn.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))?;
                Ok(conn)
            })
            .map_err(|cause| Error::Open {
                path: path.clone(),
                cause,
            })?;
        // Every later connection opens the file that exists and never creates one: a DB
        // deleted under a running process must stay deleted (and be seen as gone), not come
        // back as an empty file because the pool happened to open a connection.
        let manager = SqliteConnectionManager::file(&path)
            .with_flags(existing_file_flags())
            .with_init(move |conn| configure(conn));
        let pool = Pool::builder()
            .max_size(options.pool_size.max(1))
            .min_idle(Some(u32::from(options.keep_idle)))
            .thread_pool(POOL_SCHEDULER.clone())
            // No reaper: a SQLite connection does not age, and on the shared scheduler a
            // pool's reaper job outlives the pool (r2d2 never cancels it), one more job every
            // 30 s for each DB a long-running process ever opened and closed.
            .max_lifetime(None)
            .idle_timeout(None)
            // A SQLite connection is a file handle, not a socket that goes stale: testing it
            // with `SELECT 1` on every checkout parsed a statement per DB call.
            .test_on_check_out(false)
            .connection_timeout(busy_timeout.max(Duration::from_secs(1)))
            .build(manager)?;
        drop(first);
        let db = Self {
            pool,
            path,
            timezone: options.timezone,
            busy_timeout,
            cache_kib,
            checkpointer: Checkpointer::default(),
            pinned: None,
        };
        if options.migrate {
            db.migrate()?;
        }
        Ok(db)
    }

    /// Path of the DB file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Time zone used for cron schedules.
    pub fn timezone(&self) -> Tz {
        self.timezone
    }

    /// Opens a dedicated connection outside the pool (for `PRAGMA data_version` watching).
    pub fn dedicated_connection(&self) -> Result<Connection, Error> {
        let conn = Connection::open_with_flags(&self.path, existing_file_flags())?;
        configure_connection(&conn, self.busy_timeout)?;
        if let Some(kib) = self.cache_kib {
            conn.pragma_update(None, "cache_size", -i64::from(kib))?;
        }
        Ok(conn)
    }

    /// A handle on the same DB and pool whose calls use one connection of its own while it is
    /// free (a call made while another holds it, from inside a call or from another thread,
    /// takes a pooled one). A [`crate::DbWatcher`] made from this handle checks for changes on
    /// that connection, and `PRAGMA data_version` ignores a connection's own commits: the
    /// handle's writes do not wake its own watcher (a runner's claim and reply made it poll once
    /// more for nothing), while every other connection's commit still does.
    pub fn pinned(&self) -> Result<Self, Error> {
        let conn = self.dedicated_connection()?;
        Ok(Self {
            pinned: Some(Arc::new(Mutex::new(conn))),
            ..self.clone()
        })
    }

    /// The connection of a [`SessionDb::pinned`] handle.
    pub(crate) fn pinned_connection(&self) -> Option<Arc<Mutex<Connection>>> {
        self.pinned.clone()
    }

    /// The pinned connection when this handle has one and it is free, else a pooled one; when
    /// a commit made through it left the WAL due for a checkpoint, giving it back starts one in
    /// the background (crate::checkpoint).
    /// Inside [`with_lock_wait`] its busy timeout is that wait until it is given back.
    pub(crate) fn conn(&self) -> Result<DbConn<'_>, Error> {
        let pinned = self
            .pinned
            .as_deref()
            .and_then(|pinned| match pinned.try_lock() {
                Ok(guard) => Some(guard),
                // A call that panicked mid-transaction rolled it back as it unwound.
                Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            });
        let conn = match pinned {
            Some(guard) => Held::Pinned(guard),
            None => Held::Pooled(self.pool.get()?),
        };
        let lock_wait = LOCK_WAIT.get();
        if let Some(wait) = lock_wait {
            conn.busy_timeout(wait)?;
        }
        Ok(DbConn {
            conn,
            borrowed: Some(Borrowed::start()),
            shortened: lock_wait.is_some(),
            db: self,
        })
    }

    /// Starts a `PASSIVE` checkpoint on a thread of its own (one at a time).
    fn checkpoint_in_background(&self) {
        let pool = self.pool.clone();
        self.checkpointer.start(move || {
            let conn = pool.get()?;
            Ok(checkpoint::passive(&conn)?)
        });
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction: the write lock is taken up front, so a
    /// read-then-write never fails with `SQLITE_BUSY` on upgrade (docs/contract/crates.md#sqlite).
    pub(crate) fn write<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut conn = self.conn()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()?;
        Ok(out)
    }

    fn migrate(&self) -> Result<(), Error> {
        self.write(|tx| {
            tx.execute_batch(SCHEMA)?;
            for (table, column, decl) in COLUMNS {
                if !has_column(tx, table, column)? {
                    tracing::info!(
                        table,
                        column,
                        "adding missing column to an older session DB"
                    );
                    tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
                    if (*table, *column) == ("runner_state", "current_batch") {
                        crate::sql::move_batch_from_session_state_tx(tx)?;
                    }
                }
            }
            for (table, index) in OPEN_ROWS_INDEXES {
                if index_partial(tx, table, index)? == Some(false) {
                    tracing::info!(
                        index,
                        "rebuilding an index of an older session DB to hold open rows only"
                    );
                    tx.execute_batch(&format!("DROP INDEX {index}"))?;
                }
            }
            tx.execute_batch(INDEXES)?;
            tx.execute_batch(TRIGGERS)?;
            Ok(())
        })
    }
}

thread_local! {
    /// The lock wait [`with_lock_wait`] set on this thread.
    static LOCK_WAIT: std::cell::Cell<Option<Duration>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with every [`SessionDb`] call it makes on this thread waiting at most `wait` for
/// another connection's lock (instead of the busy timeout, 30 s by default): a call that would
/// wait longer fails with an error whose [`Error::is_busy`] is true, having written nothing
/// (a write transaction takes its lock first). For a caller that must not block its thread
/// long (an async runtime's only thread), and tries again elsewhere.
pub fn with_lock_wait<T>(wait: Duration, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Duration>);
    impl Drop for Restore {
        fn drop(&mut self) {
            LOCK_WAIT.set(self.0);
        }
    }
    let _restore = Restore(LOCK_WAIT.replace(Some(wait)));
    f()
}

/// A connection of a [`SessionDb`] in use (see [`SessionDb::conn`]).
pub(crate) struct DbConn<'db> {
    conn: Held<'db>,
    borrowed: Option<Borrowed>,
    /// Its busy timeout is [`with_lock_wait`]'s until it is given back.
    shortened: bool,
    db: &'db SessionDb,
}

/// Where a [`DbConn`]'s connection comes from.
// On the stack for one call: boxing the pooled connection would allocate on every call.
#[allow(clippy::large_enum_variant)]
enum Held<'db> {
    Pooled(PooledConnection<SqliteConnectionManager>),
    Pinned(MutexGuard<'db, Connection>),
}

impl std::ops::Deref for Held<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        match self {
            Held::Pooled(conn) => conn,
            Held::Pinned(conn) => conn,
        }
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        match self {
            Held::Pooled(conn) => conn,
            Held::Pinned(conn) => conn,
        }
    }
}

impl std::ops::Deref for DbConn<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.conn
    }
}

impl std::ops::DerefMut for DbConn<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

impl Drop for DbConn<'_> {
    fn drop(&mut self) {
        if self.shortened {
            if let Err(err) = self.conn.busy_timeout(self.db.busy_timeout) {
                tracing::warn!(%err, "could not restore a connection's busy timeout");
            }
        }
        if self.borrowed.take().is_some_and(Borrowed::end) {
            self.db.checkpoint_in_background();
        }
    }
}

fn has_column(tx: &Transaction<'_>, table: &str, column: &str) -> Result<bool, Error> {
    let mut stmt = tx.prepare(&format!("PRAGMA table_info({table})"))?;
    let names = stmt.query_map([], |r| r.get::<_, String>(1))?;
    for name in names {
        if name? == column {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether `table`'s index named `index` is partial; `None` when `table` has no such index.
/// `Some(false)` is an older DB's whole index.
pub(crate) fn index_partial(
    conn: &Connection,
    table: &str,
    index: &str,
) -> rusqlite::Result<Option<bool>> {
    conn.query_row(
        "SELECT partial FROM pragma_index_list(?1) WHERE name = ?2",
        [table, index],
        |r| r.get(0),
    )
    .optional()
}

/// SQLite's default flags without `CREATE`: the connections after the first open the DB file
/// that is there, or fail.
fn existing_file_flags() -> OpenFlags {
    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_URI | OpenFlags::SQLITE_OPEN_NO_MUTEX
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cache_kib` bounds the page cache of every pooled connection, the first and later ones.
    #[test]
    fn cache_kib_sets_every_pooled_connections_cache_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("session.db");
        let db = SessionDb::open_with(
            &path,
            OpenOptions {
                cache_kib: Some(64),
                ..OpenOptions::default()
            },
        )
        .unwrap();
        let held: Vec<_> = (0..2).map(|_| db.conn().unwrap()).collect();
        for conn in &held {
            let size: i64 = conn
                .query_row("PRAGMA cache_size", [], |row| row.get(0))
                .unwrap();
            assert_eq!(size, -64);
        }
        let default = SessionDb::open(dir.path().join("other.db")).unwrap();
        let size: i64 = default
            .conn()
            .unwrap()
            .query_row("PRAGMA cache_size", [], |row| row.get(0))
            .unwrap();
        assert_eq!(size, -2000, "SQLite's default is kept without cache_kib");
    }

    /// Threads of this process (Linux: its `/proc/self/task` entries).
    fn thread_count() -> usize {
        std::fs::read_dir("/proc/self/task").unwrap().count()
    }

    /// A process holding many DBs (`serve`) does not run threads per DB: every pool opens its
    /// connections on one scheduler (r2d2 gave each pool three threads of its own: 300
    /// threads for 100 sessions, issue 40).
    #[test]
    fn open_dbs_share_one_scheduler_instead_of_threads_each() {
        let dir = tempfile::tempdir().unwrap();
        // The shared scheduler's threads start with the first pool.
        let _first = SessionDb::open(dir.path().join("first.db")).unwrap();
        let before = thread_count();
        let dbs: Vec<_> = (0..20)
            .map(|n| SessionDb::open(dir.path().join(format!("{n}.db"))).unwrap())
            .collect();
        let grown = thread_count().saturating_sub(before);
        // Slack for threads other tests of this binary start meanwhile (cargo test runs them
        // in one process); a scheduler per pool would add 60.
        assert!(grown < 10, "{grown} threads more for {} DBs", dbs.len());
    }

    /// Without `keep_idle` a pool opens no connection ahead of need: one call at a time is
    /// served by one connection, where `keep_idle` opens a second to keep one idle.
    #[test]
    fn without_keep_idle_one_connection_serves_one_call_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let lazy = SessionDb::open_with(
            dir.path().join("lazy.db"),
            OpenOptions {
                keep_idle: false,
                ..OpenOptions::default()
            },
        )
        .unwrap();
        for _ in 0..3 {
            let conn = lazy.conn().unwrap();
            conn.query_row("SELECT 1", [], |_| Ok(())).unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(lazy.pool.state().connections, 1);
        let eager = SessionDb::open(dir.path().join("eager.db")).unwrap();
        let held = eager.conn().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while eager.pool.state().connections < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(held);
        assert_eq!(
            eager.pool.state().connections,
            2,
            "keep_idle keeps one idle"
        );
    }

    /// A runner's pool opens connections when it needs them (two DB calls at once, or r2d2
    /// keeping one idle). One opened after the DB was deleted must not create an empty DB at
    /// the path: the runner would then take the deletion for a replacement, and an empty file
    /// would be left where the host looks for its DB.
    #[test]
    fn connections_after_the_first_never_recreate_a_deleted_db() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("session.db");
        let db = SessionDb::open_with(
            &path,
            OpenOptions {
                busy_timeout: Duration::from_millis(200),
                ..OpenOptions::default()
            },
        )
        .unwrap();
        let mut held = vec![db.conn().unwrap()];
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        // Every connection the pool may have: those beyond the ones already open are opened
        // now (and r2d2 opens more in the background to keep one idle).
        for _ in 1..OpenOptions::default().pool_size {
            if let Ok(conn) = db.conn() {
                held.push(conn);
            }
        }
        assert!(db.dedicated_connection().is_err());
        std::thread::sleep(Duration::from_millis(300));
        drop(held);
        assert!(!path.exists(), "the deleted DB came back as a new file");
    }
}
