//! The one door through which a process that holds a session DB opens files named by input.
//!
//! SQLite's locks are POSIX advisory locks (`fcntl`). They belong to a process and an inode, not
//! to a descriptor: when a process closes ANY descriptor of a file, it loses every POSIX lock it
//! holds on that file, whichever descriptor took them. A runner, mcp-tools or host that opens
//! `session.db`, `-wal` or `-shm` once (to read an `@` import, sniff an attachment, send a file)
//! and closes it silently drops the locks of its own SQLite connections; the next process to
//! close its connection then believes it is the last one and checkpoints and deletes the WAL
//! under the others: acknowledged rows are lost and indexes corrupted.
//!
//! So every opening of a path that input can name goes through this crate. [`SessionDb`]
//! registers its files with [`protect_db`]; [`open`] (and the helpers over it) then:
//! 1. resolves the path to an `O_PATH` descriptor. `O_PATH` opens no file for I/O, and the
//!    kernel's close path skips the POSIX-lock release for `O_PATH` descriptors (`filp_close`
//!    only calls `locks_remove_posix` when `FMODE_PATH` is not set), so looking costs no lock;
//! 2. compares that inode's identity (device, inode) with the identity of every protected file
//!    (taken with `stat(2)`, which opens nothing). Symlinks, hard links, `/proc/self/fd/N`,
//!    `/proc/<pid>/root/...` and bind mounts all lead to the same (device, inode), so the check
//!    is by identity, never by name;
//! 3. reopens that same inode through `/proc/self/fd/<the O_PATH descriptor>`, so the file that
//!    was checked is the file that is opened: nothing can be swapped in between.
//!
//! Identity covers the files a process holds, not the ones SQLite let go: the last connection to
//! close deletes `-wal` and `-shm`, and the next one makes new files. A hard link made to the
//! earlier ones keeps them, content and all (a WAL holds database pages), under an identity no
//! process protects any more. So a regular file that is not protected by identity is also read
//! (its first bytes, through the same inode) and refused when its header is SQLite's own: a
//! write-ahead log, a rollback journal or a WAL index. What is refused never depends on when the
//! link was made. A SQLite database file itself is refused by identity only: the session DB's
//! inode never changes under SQLite, and other databases are ordinary input.
//!
//! [`SessionDb`]: https://docs.rs/schema (the workspace's `schema` crate)
//!
//! It also owns the rule for a path that input names in a setting ([`absolute`]): made absolute
//! once, where it is read; and the rule for where a session DB may live
//! ([`refuse_shared_filesystem`]): never on a filesystem shared between kernels.

mod absolute;
mod shared;

pub use absolute::{absolute, absolute_in, PathSettingError};
pub use shared::{refuse_shared_filesystem, SharedFilesystem, SharedKind, SHARED_FILESYSTEM_EXIT};

use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The suffixes SQLite (and the runner's single-runner lock) add to a DB path.
const FAMILY_SUFFIXES: [&str; 5] = ["", "-wal", "-shm", "-journal", ".lock"];

/// A file's identity: the same for every name, link and mount that reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    fn of(meta: &Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

/// One protected path and the identities seen at it.
#[derive(Debug)]
struct Protected {
    path: PathBuf,
    /// Identities seen at `path` when it was protected: the inode this process's connections
    /// hold stays protected even after the path is replaced or deleted, for as long as this
    /// process holds it open (see [`held_open`]).
    seen: Vec<FileId>,
}

static PROTECTED: Mutex<Vec<Protected>> = Mutex::new(Vec::new());

fn protected() -> MutexGuard<'static, Vec<Protected>> {
    // The list is only ever appended to; a panic elsewhere cannot leave it half-written.
    PROTECTED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Protects the files of the SQLite DB at `db` in this process: the DB, its `-wal`, `-shm` and
/// `-journal`, and the runner's `.lock`, under the given name and under the name with symlinks
/// resolved (SQLite names the WAL after the resolved path). Files that do not exist yet are
/// protected by path and checked by identity whenever they exist.
pub fn protect_db(db: &Path) {
    let mut bases = vec![db.to_path_buf()];
    if let Ok(resolved) = std::fs::canonicalize(db) {
        if resolved != db {
            bases.push(resolved);
        }
    }
    let mut list = protected();
    for base in bases {
        for suffix in FAMILY_SUFFIXES {
            let mut name = OsString::from(base.as_os_str());
            name.push(suffix);
            let path = PathBuf::from(name);
            let id = std::fs::metadata(&path).ok().map(|m| FileId::of(&m));
            match list.iter_mut().find(|p| p.path == path) {
                Some(entry) => {
                    if let Some(id) = id.filter(|id| !entry.seen.contains(id)) {
                        entry.seen.push(id);
                    }
                }
                None => list.push(Protected {
                    path,
                    seen: id.into_iter().collect(),
                }),
            }
        }
    }
}

/// Why a path was refused: it is one of the protected DB files, or a SQLite side file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The path as named by the input.
    pub path: PathBuf,
    /// What it reaches.
    pub reaches: Reaches,
}

/// What a refused path reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reaches {
    /// A protected file of this process (by identity).
    DbFile(PathBuf),
    /// A file whose header is one of SQLite's side files ([`SideFile`]), such as a session
    /// DB's earlier `-wal` kept alive by a link.
    SideFile(SideFile),
}

/// The SQLite side files recognised by their header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideFile {
    /// A write-ahead log (`-wal`): database pages.
    WriteAheadLog,
    /// A rollback journal (`-journal`): database pages.
    RollbackJournal,
    /// A WAL index (`-shm`).
    WalIndex,
}

impl SideFile {
    fn name(self) -> &'static str {
        match self {
            Self::WriteAheadLog => "write-ahead log (-wal)",
            Self::RollbackJournal => "rollback journal (-journal)",
            Self::WalIndex => "WAL index (-shm)",
        }
    }

    /// The side file `head` (a file's first bytes) begins, if any. WAL: magic 0x377f0682/3 and
    /// format 3007000, big-endian; journal: its 8-byte magic; WAL index: version 3007000 in
    /// the machine's byte order and its header written twice (bytes 0-47 = 48-95).
    fn of_header(head: &[u8]) -> Option<Self> {
        const JOURNAL_MAGIC: [u8; 8] = [0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7];
        const WAL_FORMAT: u32 = 3_007_000;
        let word = |at: usize| -> Option<[u8; 4]> { head.get(at..at + 4)?.try_into().ok() };
        if head.starts_with(&JOURNAL_MAGIC) {
            return Some(Self::RollbackJournal);
        }
        let (first, second) = (word(0)?, word(4)?);
        if matches!(u32::from_be_bytes(first), 0x377f_0682 | 0x377f_0683)
            && u32::from_be_bytes(second) == WAL_FORMAT
        {
            return Some(Self::WriteAheadLog);
        }
        if u32::from_ne_bytes(first) == WAL_FORMAT && head.get(..48)? == head.get(48..96)? {
            return Some(Self::WalIndex);
        }
        None
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.reaches {
            Reaches::DbFile(db_file) => write!(
                f,
                "{} is the session database's own file {} (by identity); it is never opened as \
                 input",
                self.path.display(),
                db_file.display()
            ),
            Reaches::SideFile(kind) => write!(
                f,
                "{} is a SQLite {} (by its header): a session database's own file, or an earlier \
                 one kept by a link; it is never opened as input",
                self.path.display(),
                kind.name()
            ),
        }
    }
}

impl std::error::Error for Refused {}

/// True when `err` is a refusal of this crate (rather than an ordinary I/O error).
pub fn is_refused(err: &io::Error) -> bool {
    err.get_ref().is_some_and(|inner| inner.is::<Refused>())
}

/// The protected file with identity `id`, if any: the file at a protected path now, or one
/// seen there earlier that this process still holds open.
fn protected_file(id: FileId) -> Option<PathBuf> {
    let list = protected();
    let mut earlier = None;
    for entry in list.iter() {
        let now = std::fs::metadata(&entry.path).ok().map(|m| FileId::of(&m));
        if now == Some(id) {
            return Some(entry.path.clone());
        }
        if earlier.is_none() && entry.seen.contains(&id) {
            earlier = Some(entry.path.clone());
        }
    }
    // A file deleted or replaced at a protected path keeps its identity only while something
    // holds it: once no descriptor of this process does, its inode can be freed and reused by
    // any new file (a download, an archive), which must not be refused for it.
    earlier.filter(|_| held_open(id))
}

/// Whether a descriptor of this process other than an `O_PATH` one (which opens nothing and
/// holds no lock: [`open`]'s own look-ups, here or on another thread) reaches identity `id`.
/// Looks with `stat(2)` through `/proc/self/fd`, which opens nothing. Without `/proc` it
/// answers yes: refusing is the safe side.
fn held_open(id: FileId) -> bool {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return true;
    };
    fds.flatten().any(|fd| {
        let same = std::fs::metadata(fd.path()).is_ok_and(|m| FileId::of(&m) == id);
        same && !is_o_path(&fd.file_name())
    })
}

/// Whether descriptor `fd` (a name in `/proc/self/fd`) was opened with `O_PATH`, from the
/// `flags:` line of `/proc/self/fdinfo/<fd>` (octal). Unknown: no.
fn is_o_path(fd: &std::ffi::OsStr) -> bool {
    let Ok(info) = std::fs::read_to_string(Path::new("/proc/self/fdinfo").join(fd)) else {
        return false;
    };
    info.lines()
        .find_map(|line| line.strip_prefix("flags:"))
        .and_then(|flags| i64::from_str_radix(flags.trim(), 8).ok())
        .is_some_and(|flags| flags & i64::from(libc::O_PATH) != 0)
}

/// Whether a path may be opened: `Err` with a [`Refused`] inside (kind `PermissionDenied`) when
/// it reaches a protected file, the `O_PATH` look-up's error when it cannot be resolved.
pub fn check(path: &Path) -> io::Result<()> {
    let (handle, meta) = locate(path)?;
    refuse_protected(path, &handle, &meta)
}

/// Refuses the file that `handle` (an `O_PATH` descriptor) reaches when it is a protected file
/// (by identity) or, being a regular file, begins with a SQLite side file's header.
fn refuse_protected(path: &Path, handle: &File, meta: &Metadata) -> io::Result<()> {
    let reaches = match protected_file(FileId::of(meta)) {
        Some(db_file) => Some(Reaches::DbFile(db_file)),
        // Not protected, so no lock of this process is on it: reading it drops none.
        None if meta.is_file() => side_file(handle).map(Reaches::SideFile),
        None => None,
    };
    match reaches {
        Some(reaches) => {
            let refused = Refused {
                path: path.to_path_buf(),
                reaches,
            };
            tracing::warn!(%refused, "refused to open a session DB file");
            Err(io::Error::new(io::ErrorKind::PermissionDenied, refused))
        }
        None => Ok(()),
    }
}

/// The side file the regular file behind `handle` is, by its first bytes. A file that cannot be
/// read here is no side file to this check; the caller's own opening reports the error.
fn side_file(handle: &File) -> Option<SideFile> {
    use std::os::unix::fs::FileExt;
    let via_proc = format!("/proc/self/fd/{}", handle.as_raw_fd());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(via_proc)
        .ok()?;
    let mut head = [0u8; 96];
    let mut filled = 0;
    while filled < head.len() {
        match file.read_at(&mut head[filled..], filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    SideFile::of_header(&head[..filled])
}

/// Resolves `path` (following symlinks) to an `O_PATH` descriptor and its metadata. Dropping
/// the descriptor releases no POSIX lock (see the crate doc).
fn locate(path: &Path) -> io::Result<(File, Metadata)> {
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)?;
    let meta = handle.metadata()?;
    Ok((handle, meta))
}

/// How [`open_with`] opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only; the file must exist.
    Read,
    /// Append, creating the file (never through an existing symlink) when missing.
    Append,
    /// Write from the start, truncating, creating the file when missing.
    Truncate,
}

/// Opens `path` for reading, refusing the protected DB files (see the crate doc).
pub fn open(path: &Path) -> io::Result<File> {
    open_with(path, Access::Read)
}

/// Opens `path` as `access` says, refusing the protected DB files (see the crate doc).
pub fn open_with(path: &Path, access: Access) -> io::Result<File> {
    let (handle, meta) = match locate(path) {
        Ok(found) => found,
        Err(err) if err.kind() == io::ErrorKind::NotFound && access != Access::Read => {
            // Nothing there: create it. O_EXCL + O_NOFOLLOW never opens an existing file, so a
            // file (or symlink) planted meanwhile makes this fail instead of opening it.
            return std::fs::OpenOptions::new()
                .write(true)
                .append(access == Access::Append)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW)
                .mode(0o600)
                .open(path);
        }
        Err(err) => return Err(err),
    };
    refuse_protected(path, &handle, &meta)?;
    if !meta.is_file() {
        // Opening a FIFO would block until a writer comes, a device could be anything: input
        // names regular files only.
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    let mut options = std::fs::OpenOptions::new();
    match access {
        Access::Read => options.read(true),
        Access::Append => options.append(true),
        Access::Truncate => options.write(true).truncate(true),
    };
    let expected = FileId::of(&meta);
    let via_proc = PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd()));
    let file = match options.open(&via_proc) {
        Ok(file) => file,
        // No /proc (unusual outside containers): open by name and verify below.
        Err(err) if err.kind() == io::ErrorKind::NotFound => options.open(path)?,
        Err(err) => return Err(err),
    };
    let opened = file.metadata().map(|m| FileId::of(&m));
    if opened.as_ref().ok() != Some(&expected) {
        // The path changed between the look-up and the opening. Closing a descriptor of a
        // protected file would drop this process's locks, so the descriptor is leaked instead.
        std::mem::forget(file);
        return Err(io::Error::other(format!(
            "{} changed while it was being opened",
            path.display()
        )));
    }
    Ok(file)
}

/// Reads a whole file through [`open`].
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Reads a whole UTF-8 file through [`open`].
pub fn read_to_string(path: &Path) -> io::Result<String> {
    let mut text = String::new();
    open(path)?.read_to_string(&mut text)?;
    Ok(text)
}

/// Replaces `path` with `data`, readable by the owner only (keys, configs with credentials):
/// written to `<path>.tmp` through [`open_with`], then renamed over `path` (a rename replaces a
/// planted link instead of following it), so a reader sees the old or the new content whole.
pub fn write_private(path: &Path, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let mut tmp = OsString::from(path.as_os_str());
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file = open_with(&tmp, Access::Truncate)?;
    // An existing file keeps its old mode through `open`.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(data)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Test support for the crates that use the guard (feature `testing`).
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    #![allow(clippy::unwrap_used)]
    use std::path::{Path, PathBuf};

    /// A WAL session DB `dir/session.db` with one row, protected in this process; the open
    /// connection keeps its `-wal` and `-shm` (and their locks) in place while it lives.
    pub fn wal_db(dir: &Path) -> (PathBuf, rusqlite::Connection) {
        let db = dir.join("session.db");
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES (1);")
            .unwrap();
        super::protect_db(&db);
        (db, conn)
    }

    /// Whether a process other than this one holds a POSIX lock on `file`. Asked from a child
    /// process (`python3`, F_GETLK), because a process never sees its own locks; SQLite's
    /// connections hold a shared lock on `-shm` for as long as they are open.
    pub fn locked_by_another_process(file: &Path) -> bool {
        let out = std::process::Command::new("python3")
            .arg("-c")
            .arg(
                "import fcntl,struct,sys,os\n\
                 fd=os.open(sys.argv[1],os.O_RDWR)\n\
                 req=struct.pack('hhqqi',fcntl.F_WRLCK,0,0,0,0)\n\
                 res=fcntl.fcntl(fd,fcntl.F_GETLK,req)\n\
                 print(struct.unpack('hhqqi',res)[0]!=fcntl.F_UNLCK)",
            )
            .arg(file)
            .output();
        out.is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "True")
    }

    pub use super::shared::testing::{tmpfs_dir, FuseMount};
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn db_in(dir: &Path) -> PathBuf {
        let (db, conn) = testing::wal_db(dir);
        std::mem::forget(conn); // keep -wal and -shm in place
        db
    }

    #[test]
    fn refuses_every_family_member_by_identity() {
        let dir = tempfile::tempdir().unwrap();
        let db = db_in(dir.path());
        let aliases = dir.path().join("aliases");
        std::fs::create_dir(&aliases).unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let target = PathBuf::from(format!("{}{suffix}", db.display()));
            assert!(target.exists(), "{} exists", target.display());
            let symlink = aliases.join(format!("sym{suffix}.txt"));
            std::os::unix::fs::symlink(&target, &symlink).unwrap();
            let hard = aliases.join(format!("hard{suffix}.txt"));
            std::fs::hard_link(&target, &hard).unwrap();
            let file = std::fs::File::open(&target).unwrap();
            let via_fd = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
            let via_root = PathBuf::from(format!("/proc/{}/root", std::process::id()))
                .join(target.strip_prefix("/").unwrap());
            for alias in [&target, &symlink, &hard, &via_fd, &via_root] {
                for access in [Access::Read, Access::Append, Access::Truncate] {
                    let err = open_with(alias, access).unwrap_err();
                    assert!(is_refused(&err), "{}: {err}", alias.display());
                    assert!(err.to_string().contains("never opened"), "{err}");
                }
                assert!(is_refused(&check(alias).unwrap_err()));
            }
            std::mem::forget(file);
        }
        // The runner's lock file, created after protect_db, is refused too (checked by path).
        let lock = PathBuf::from(format!("{}.lock", db.display()));
        std::fs::write(&lock, "1").unwrap();
        let alias = aliases.join("lock.txt");
        std::fs::hard_link(&lock, &alias).unwrap();
        assert!(is_refused(&open(&alias).unwrap_err()));
    }

    /// A DB file deleted while this process held it stays refused until the process lets go;
    /// after that its identity belongs to no DB (the file system may give it to a new file).
    #[test]
    fn a_deleted_db_file_is_protected_only_while_this_process_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let (db, conn) = testing::wal_db(dir.path());
        let id = FileId::of(&std::fs::metadata(&db).unwrap());
        std::fs::remove_file(&db).unwrap();
        assert_eq!(
            protected_file(id),
            Some(db.clone()),
            "the connection holds it"
        );
        drop(conn);
        assert_eq!(protected_file(id), None, "nothing holds it any more");
        // Any other identity seen there: a plain descriptor on it is a hold (as a connection's
        // is), an O_PATH one (as `open` takes to look) is not.
        let other = dir.path().join("other.txt");
        std::fs::write(&other, "x").unwrap();
        let other_id = FileId::of(&std::fs::metadata(&other).unwrap());
        protected()
            .iter_mut()
            .find(|p| p.path == db)
            .unwrap()
            .seen
            .push(other_id);
        let held = std::fs::File::open(&other).unwrap();
        assert_eq!(protected_file(other_id), Some(db.clone()));
        let o_path = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(&other)
            .unwrap();
        drop(held);
        assert_eq!(
            protected_file(other_id),
            None,
            "an O_PATH descriptor holds nothing"
        );
        drop(o_path);
        for entry in protected().iter_mut() {
            entry.seen.retain(|seen| *seen != other_id);
        }
    }

    #[test]
    fn other_files_open_and_create() {
        let dir = tempfile::tempdir().unwrap();
        db_in(dir.path());
        let note = dir.path().join("note.md");
        std::fs::write(&note, "hello").unwrap();
        let link = dir.path().join("link.md");
        std::os::unix::fs::symlink(&note, &link).unwrap();
        assert_eq!(read_to_string(&link).unwrap(), "hello");
        let new = dir.path().join("new.md");
        open_with(&new, Access::Append)
            .unwrap()
            .write_all(b"a")
            .unwrap();
        open_with(&new, Access::Append)
            .unwrap()
            .write_all(b"b")
            .unwrap();
        assert_eq!(read(&new).unwrap(), b"ab");
        open_with(&new, Access::Truncate)
            .unwrap()
            .write_all(b"c")
            .unwrap();
        assert_eq!(read(&new).unwrap(), b"c");
        assert_eq!(
            open(&dir.path().join("missing")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn only_regular_files_are_opened() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe.md");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Would block forever (no writer) if it were opened for reading.
        let err = open(&fifo).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        let err = open(dir.path()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    }

    #[test]
    fn a_dangling_symlink_is_not_created_through() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = open_with(&link, Access::Append).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert!(!target.exists());
    }

    /// The reason this crate exists: reading a DB file through `std::fs` and closing it drops
    /// this process's POSIX locks; a refusal by the guard does not.
    #[test]
    fn a_refusal_keeps_this_process_s_locks() {
        let dir = tempfile::tempdir().unwrap();
        let (_db, _conn) = testing::wal_db(dir.path());
        // An open WAL connection holds a shared lock on the -shm file (SQLite's "dead man
        // switch"); the last connection to close deletes the WAL when nobody holds it.
        let shm = dir.path().join("session.db-shm");
        let held = || testing::locked_by_another_process(&shm);
        assert!(held(), "the open connection holds a lock");
        let link = dir.path().join("import.md");
        std::fs::hard_link(&shm, &link).unwrap();
        assert!(is_refused(&read(&link).unwrap_err()));
        assert!(held(), "the refusal kept the lock");
        drop(std::fs::File::open(&link).unwrap());
        assert!(
            !held(),
            "a plain open and close drops it (the bug the guard prevents)"
        );
    }

    #[test]
    fn write_private_refuses_a_planted_link_to_the_db() {
        let dir = tempfile::tempdir().unwrap();
        let db = db_in(dir.path());
        let before = std::fs::read(&db).unwrap();
        for (n, plant) in [
            |t: &Path, at: &Path| std::os::unix::fs::symlink(t, at).unwrap(),
            |t: &Path, at: &Path| std::fs::hard_link(t, at).unwrap(),
        ]
        .iter()
        .enumerate()
        {
            let key = dir.path().join(format!("key-{n}"));
            plant(&db, &dir.path().join(format!("key-{n}.tmp")));
            let err = write_private(&key, b"sk-secret").unwrap_err();
            assert!(is_refused(&err), "{err}");
            assert!(!key.exists());
        }
        assert_eq!(std::fs::read(&db).unwrap(), before, "the DB is untouched");
        let key = dir.path().join("key");
        write_private(&key, b"sk-secret").unwrap();
        write_private(&key, b"sk-other").unwrap();
        assert_eq!(read(&key).unwrap(), b"sk-other");
        assert_eq!(
            std::fs::metadata(&key).unwrap().mode() & 0o777,
            0o600,
            "owner only"
        );
    }

    /// A bind mount of the DB's folder reaches the same inodes under other names. Run in a
    /// private mount namespace (this test re-run by `unshare --mount`), so the mount dies with
    /// it; skipped with the reason where namespaces or mounts are not allowed.
    #[test]
    fn a_bind_mount_alias_is_refused() {
        const INNER: &str = "FSGUARD_BIND_TEST_DIR";
        if let Ok(dir) = std::env::var(INNER) {
            let dir = PathBuf::from(dir);
            let db = db_in(&dir.join("real"));
            let alias = dir.join("alias");
            let mounted = std::process::Command::new("mount")
                .arg("--bind")
                .arg(dir.join("real"))
                .arg(&alias)
                .status();
            if !mounted.is_ok_and(|s| s.success()) {
                println!("BIND-UNAVAILABLE mount --bind failed");
                return;
            }
            println!("BIND-MOUNTED");
            for name in ["session.db", "session.db-wal", "session.db-shm"] {
                let through = alias.join(name);
                assert!(through.exists(), "{}", through.display());
                assert_ne!(through, db);
                assert!(is_refused(&open(&through).unwrap_err()), "{name}");
            }
            return;
        }
        let outer = tempfile::tempdir().unwrap();
        std::fs::create_dir(outer.path().join("real")).unwrap();
        std::fs::create_dir(outer.path().join("alias")).unwrap();
        let run = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private"])
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tests::a_bind_mount_alias_is_refused",
                "--nocapture",
            ])
            .env(INNER, outer.path())
            .output();
        match run {
            Ok(out) if String::from_utf8_lossy(&out.stdout).contains("BIND-MOUNTED") => {
                assert!(
                    out.status.success(),
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(out) => eprintln!(
                "SKIPPED a_bind_mount_alias_is_refused: no private mount namespace here ({})",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(err) => eprintln!("SKIPPED a_bind_mount_alias_is_refused: unshare: {err}"),
        }
    }

    /// An earlier `-wal`, `-shm` or `-journal` kept alive by a hard link after SQLite deleted
    /// it (the last connection closed) is protected by no identity any more; it is refused by
    /// its header, whoever holds it and whenever the link was made. The WAL still holds the
    /// database's pages: opening it would leak them.
    #[test]
    fn an_earlier_side_file_kept_by_a_link_is_refused_by_its_header() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("other.db");
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES ('secret row');",
        )
        .unwrap();
        let kept = dir.path().join("kept");
        std::fs::create_dir(&kept).unwrap();
        for suffix in ["-wal", "-shm"] {
            let file = PathBuf::from(format!("{}{suffix}", db.display()));
            std::fs::hard_link(&file, kept.join(format!("photo{suffix}.png"))).unwrap();
        }
        drop(conn); // the last connection: SQLite checkpoints and deletes -wal and -shm
        assert!(!PathBuf::from(format!("{}-wal", db.display())).exists());
        let wal = kept.join("photo-wal.png");
        assert!(
            String::from_utf8_lossy(&std::fs::read(&wal).unwrap()).contains("secret row"),
            "the kept WAL holds the page"
        );
        // A rollback journal, as a DB in the default journal mode leaves mid-transaction.
        let journal = kept.join("photo-journal.png");
        let mut head = vec![0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7];
        head.resize(512, 0);
        std::fs::write(&journal, head).unwrap();
        for (path, kind) in [
            (wal, "write-ahead log"),
            (kept.join("photo-shm.png"), "WAL index"),
            (journal, "rollback journal"),
        ] {
            for access in [Access::Read, Access::Append, Access::Truncate] {
                let err = open_with(&path, access).unwrap_err();
                assert!(is_refused(&err), "{}: {err}", path.display());
                assert!(err.to_string().contains(kind), "{err}");
            }
            assert!(is_refused(&check(&path).unwrap_err()));
        }
        // The DB file itself is ordinary input unless protected: other databases are data.
        assert!(check(&db).is_ok());
    }

    #[test]
    fn side_files_are_told_by_their_header_only() {
        let mut wal = vec![0x37, 0x7f, 0x06, 0x82, 0x00, 0x2d, 0xe2, 0x18];
        wal.resize(32, 0);
        assert_eq!(SideFile::of_header(&wal), Some(SideFile::WriteAheadLog));
        wal[3] = 0x83;
        assert_eq!(SideFile::of_header(&wal), Some(SideFile::WriteAheadLog));
        wal[7] = 0x19; // another format version
        assert_eq!(SideFile::of_header(&wal), None);
        let mut shm = 3_007_000u32.to_ne_bytes().to_vec();
        shm.resize(48, 7);
        shm.extend_from_within(..48);
        assert_eq!(SideFile::of_header(&shm), Some(SideFile::WalIndex));
        shm[60] = 0; // the two header copies differ
        assert_eq!(SideFile::of_header(&shm), None);
        for other in [
            &b""[..],
            b"SQLite format 3\0",
            b"\x37\x7f\x06",
            b"hello world",
        ] {
            assert_eq!(SideFile::of_header(other), None, "{other:?}");
        }
    }
}
