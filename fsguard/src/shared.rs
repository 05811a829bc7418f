//! Where a session DB may live: never on a filesystem that more than one kernel serves.
//!
//! SQLite's WAL mode keeps its readers and writers in step through a memory-mapped `-shm` file
//! and POSIX locks; both only work when every process that opens the DB runs on one kernel,
//! which owns the file's pages and locks. A folder shared into a VM or a pod from somewhere else
//! breaks that: measured with a session folder shared into a KVM guest, 9p gave `database is
//! locked`, virtiofs with `cache=none` I/O errors, and virtiofs with `cache=auto` silent
//! corruption (replies the host never saw, a failed `integrity_check`). Network filesystems
//! (NFS, SMB) and FUSE filesystems (their pages and locks are the user-space server's, whatever
//! it passes them to) are the same case.
//!
//! So [`refuse_shared_filesystem`] classifies the DB's folder twice and refuses it when either
//! says "shared":
//! 1. `statfs(2)`: the filesystem's magic number, decided by the kernel and not by a name
//!    (virtiofs and every FUSE filesystem report FUSE's magic);
//! 2. the mount table (`/proc/self/mountinfo`): the mount that holds the folder, whose type
//!    names the filesystem for the message (`fuse.bindfs`, `virtiofs`, `nfs4`, `cifs`) and
//!    covers the shared filesystems whose magic is not in the kernel's public list (Lustre,
//!    GPFS, BeeGFS, Docker Desktop's `fakeowner`).
//!
//! Local filesystems are served: ext4, xfs, btrfs, zfs, tmpfs and overlayfs (a container's
//! root), whatever their mount options. There is no switch to turn the check off: what it
//! refuses loses rows.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The exit code of `agent-runner`, `mcp-tools` and `nanoclaw` when they refuse a session DB on
/// a shared filesystem: sysexits' `EX_CONFIG`, a configuration error that a restart does not
/// fix (docs/operations.md, "The session DB on a shared filesystem").
pub const SHARED_FILESYSTEM_EXIT: u8 = 78;

/// The mount table is read up to this size: a node with thousands of mounts stays far below it,
/// and a hostile or broken `/proc` cannot make the check read forever.
const MOUNTINFO_LIMIT: u64 = 64 * 1024 * 1024;

/// What kind of shared filesystem refused the DB; said in the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedKind {
    /// A FUSE filesystem: a user-space server owns the pages and locks.
    Fuse,
    /// A folder shared into a VM from its host (9p, virtiofs, VirtualBox, Docker Desktop).
    VmShare,
    /// A network filesystem (NFS, SMB/CIFS, Ceph, AFS, ...).
    Network,
    /// A cluster filesystem on a block device several machines mount (GFS2, OCFS2).
    Cluster,
}

impl std::fmt::Display for SharedKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SharedKind::Fuse => "a FUSE filesystem",
            SharedKind::VmShare => "a folder shared into a VM",
            SharedKind::Network => "a network filesystem",
            SharedKind::Cluster => "a cluster filesystem",
        })
    }
}

/// A session DB refused because its folder is on a shared filesystem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refusing the session DB {}: its folder {} is on {fs_name} ({kind}{}), and \
     SQLite's WAL needs every process that opens the DB on one kernel (on such folders it \
     reports `database is locked` or I/O errors, or silently corrupts the DB). Fix: keep the \
     session folder on a local filesystem of the VM or pod that runs agent-runner (a named \
     volume, an emptyDir), run `nanoclaw serve` there, next to the DB, and talk to it over \
     HTTP with `nanoclaw --url` from outside. This check has no switch",
    db.display(),
    folder.display(),
    mount_point.as_ref().map(|at| format!(", mounted at {}", at.display())).unwrap_or_default()
)]
pub struct SharedFilesystem {
    /// The session DB path as given.
    pub db: PathBuf,
    /// The folder that was classified: the DB's real folder (symlinks resolved), or its
    /// nearest existing ancestor when the DB is yet to be created.
    pub folder: PathBuf,
    /// The filesystem's name: the mount table's type (`fuse.bindfs`, `nfs4`), else the name
    /// of its statfs magic.
    pub fs_name: String,
    /// What kind of shared filesystem it is.
    pub kind: SharedKind,
    /// Where that filesystem is mounted (`None` when the mount table did not say).
    pub mount_point: Option<PathBuf>,
}

/// Refuses (with [`SharedFilesystem`]) a session DB at `db` whose folder is on a shared
/// filesystem; called before anything opens or creates the DB, its `-wal`, `-shm` or lock file.
/// A folder that cannot be classified (nothing on the way to it exists, `statfs` fails) is
/// let through: opening the DB then fails with the real cause.
pub fn refuse_shared_filesystem(db: &Path) -> Result<(), SharedFilesystem> {
    let Some(folder) = real_folder(db) else {
        return Ok(());
    };
    let magic = nix::sys::statfs::statfs(&folder)
        .ok()
        // `f_type` is a `long` filled from a 32-bit magic; the low 32 bits are the magic on
        // every ABI (a 32-bit `long` makes CIFS's 0xFF534D42 negative).
        .map(|stat| stat.filesystem_type().0 as u32);
    let dev = std::fs::metadata(&folder).ok().map(|meta| {
        let dev = meta.dev();
        (nix::sys::stat::major(dev), nix::sys::stat::minor(dev))
    });
    let mounts = read_mountinfo().map(|text| parse_mountinfo(&text));
    let mount = mounts
        .as_deref()
        .and_then(|mounts| mount_of(mounts, &folder, dev));
    match classify(magic, mount) {
        None => Ok(()),
        Some((fs_name, kind)) => Err(SharedFilesystem {
            db: db.to_path_buf(),
            folder,
            fs_name,
            kind,
            mount_point: mount.map(|m| m.mount_point.clone()),
        }),
    }
}

/// The folder the DB's files are (or will be) in, symlinks resolved: SQLite follows a symlinked
/// DB path and keeps `-wal` and `-shm` beside the real file. For a DB yet to be created, the
/// nearest existing ancestor of its folder (what is created under it is on the same mount).
fn real_folder(db: &Path) -> Option<PathBuf> {
    if let Ok(real) = std::fs::canonicalize(db) {
        if let Some(parent) = real.parent() {
            return Some(parent.to_path_buf());
        }
    }
    let mut dir = match db.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    loop {
        if let Ok(real) = std::fs::canonicalize(dir) {
            return Some(real);
        }
        dir = dir.parent().filter(|p| !p.as_os_str().is_empty())?;
    }
}

fn read_mountinfo() -> Option<Vec<u8>> {
    let file = std::fs::File::open("/proc/self/mountinfo").ok()?;
    let mut text = Vec::new();
    file.take(MOUNTINFO_LIMIT).read_to_end(&mut text).ok()?;
    Some(text)
}

/// One line of `/proc/self/mountinfo` (proc(5)), the fields the check uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mount {
    /// `major:minor` of the filesystem (`st_dev` of its files, except on btrfs subvolumes).
    pub(crate) dev: (u64, u64),
    /// The mount point, unescaped (`\040` is a space).
    pub(crate) mount_point: PathBuf,
    /// The filesystem type, e.g. `ext4`, `fuse.bindfs`, `nfs4`.
    pub(crate) fs_type: String,
}

/// Parses mountinfo text. A line that does not have the shape of one (too few fields, no `-`
/// separator, a bad `major:minor`) is skipped: one odd line never hides the others.
pub(crate) fn parse_mountinfo(text: &[u8]) -> Vec<Mount> {
    text.split(|&b| b == b'\n')
        .filter_map(parse_mountinfo_line)
        .collect()
}

/// `36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue`:
/// mount id, parent id, major:minor, root, mount point, options, optional fields (zero or
/// more), `-`, type, source, super options.
fn parse_mountinfo_line(line: &[u8]) -> Option<Mount> {
    let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
    let _mount_id = fields.next()?;
    let _parent_id = fields.next()?;
    let dev = std::str::from_utf8(fields.next()?).ok()?;
    let (major, minor) = dev.split_once(':')?;
    let dev = (major.parse().ok()?, minor.parse().ok()?);
    let _root = fields.next()?;
    let mount_point = fields.next()?;
    if !mount_point.starts_with(b"/") {
        return None;
    }
    let _options = fields.next()?;
    // The optional fields end at the first lone `-`.
    fields.by_ref().find(|field| *field == b"-")?;
    let fs_type = fields.next()?;
    Some(Mount {
        dev,
        mount_point: PathBuf::from(OsString::from_vec(unescape(mount_point))),
        fs_type: String::from_utf8_lossy(&unescape(fs_type)).into_owned(),
    })
}

/// Undoes the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134`
/// backslash); a backslash not followed by three octal digits stays as it is.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|digits| field[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)))
            .map(|d| {
                d.iter()
                    .fold(0u32, |value, digit| value * 8 + u32::from(digit - b'0'))
            })
            .and_then(|value| u8::try_from(value).ok());
        match octal {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

/// The mount that holds `folder` (absolute, symlinks resolved): of the mounts whose mount point
/// is a prefix of it (by components), the longest; among those whose `major:minor` is the
/// folder's device, if any (a device match tells stacked and shadowed mounts apart). At equal
/// length the later line wins: it was mounted over the earlier one.
pub(crate) fn mount_of<'a>(
    mounts: &'a [Mount],
    folder: &Path,
    dev: Option<(u64, u64)>,
) -> Option<&'a Mount> {
    let longest = |same_dev: bool| {
        mounts
            .iter()
            .filter(|m| folder.starts_with(&m.mount_point))
            .filter(|m| !same_dev || Some(m.dev) == dev)
            .fold(None::<&Mount>, |best, m| match best {
                Some(b) if b.mount_point.as_os_str().len() > m.mount_point.as_os_str().len() => {
                    Some(b)
                }
                _ => Some(m),
            })
    };
    longest(true).or_else(|| longest(false))
}

/// The shared filesystems by statfs magic (the kernel's `include/uapi/linux/magic.h`).
/// virtiofs has no magic of its own: it reports FUSE's.
const SHARED_MAGICS: &[(u32, &str, SharedKind)] = &[
    (0x6573_5546, "fuse", SharedKind::Fuse),
    (0x0102_1997, "9p", SharedKind::VmShare),
    (0x0000_6969, "nfs", SharedKind::Network),
    (0x0000_517B, "smb", SharedKind::Network),
    (0xFF53_4D42, "cifs", SharedKind::Network),
    (0xFE53_4D42, "smb3", SharedKind::Network),
    (0x00C3_6400, "ceph", SharedKind::Network),
    (0x5346_414F, "afs", SharedKind::Network),
    (0x6B41_4653, "afs", SharedKind::Network),
    (0x7375_7245, "coda", SharedKind::Network),
    (0x0000_564C, "ncpfs", SharedKind::Network),
    (0x7461_636F, "ocfs2", SharedKind::Cluster),
];

/// The kind of a shared filesystem by the mount table's type, `None` for a local one.
pub(crate) fn shared_by_type(fs_type: &str) -> Option<SharedKind> {
    // `fuse.<server>` (fuse.bindfs, fuse.sshfs, fuse.glusterfs, fuse.grpcfuse) and `fuseblk`.
    if fs_type == "fuse" || fs_type == "fuseblk" || fs_type.starts_with("fuse.") {
        return Some(SharedKind::Fuse);
    }
    let kind = match fs_type {
        "9p" | "virtiofs" | "vboxsf" | "vmhgfs" | "prl_fs" | "fakeowner" | "drvfs" => {
            SharedKind::VmShare
        }
        "nfs" | "nfs4" | "cifs" | "smb3" | "smbfs" | "ceph" | "afs" | "coda" | "ncpfs"
        | "glusterfs" | "lustre" | "gpfs" | "beegfs" | "orangefs" | "pvfs2" | "panfs" | "davfs"
        | "cvmfs" | "wekafs" | "quobyte" => SharedKind::Network,
        "gfs2" | "ocfs2" => SharedKind::Cluster,
        _ => return None,
    };
    Some(kind)
}

/// The verdict on a folder: `None` (served) or the filesystem's name and kind. Either signal
/// refuses; the mount table's type names the filesystem when it has one.
pub(crate) fn classify(magic: Option<u32>, mount: Option<&Mount>) -> Option<(String, SharedKind)> {
    let by_type = mount.and_then(|m| shared_by_type(&m.fs_type).map(|kind| (m, kind)));
    let by_magic = magic.and_then(|magic| {
        SHARED_MAGICS
            .iter()
            .find(|(known, _, _)| *known == magic)
            .map(|(_, name, kind)| (*name, *kind))
    });
    match (by_type, by_magic) {
        (Some((mount, kind)), _) => Some((mount.fs_type.clone(), kind)),
        (None, Some((name, kind))) => Some((
            match mount {
                // The table names something local where the kernel says otherwise: say both.
                Some(mount) => format!("{name} (statfs; the mount table says {})", mount.fs_type),
                None => name.to_owned(),
            },
            kind,
        )),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use expect_test::{expect, Expect};

    /// A mount table as a container on a Docker Desktop VM sees it, with hostile lines.
    const MOUNTINFO: &str = "\
1 0 0:21 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
22 1 0:5 / /dev rw,nosuid - tmpfs tmpfs rw,mode=755
23 22 0:24 / /dev/shm rw,nosuid,nodev shared:2 - tmpfs shm rw
24 1 254:1 /docker/volumes/v/_data /workspace rw,relatime - ext4 /dev/vda1 rw
25 1 0:50 /Projects/proj /Projects/my\\040proj rw,nosuid master:7 shared:9 - fakeowner /run/host_mark/Projects rw
26 1 0:51 / /mnt/nfs rw,relatime - nfs4 server:/export rw,vers=4.2
27 26 0:52 / /mnt/nfs/local rw - ext4 /dev/sdb rw
28 1 0:53 / /mnt/bind rw,nosuid,nodev,relatime - fuse.bindfs /src rw,user_id=0
29 1 0:54 / /mnt/virt rw - virtiofs shared rw
this line is garbage
30 1 x:y / /bad rw - ext4 /dev/x rw
31 1 0:55 / /no-separator rw ext4 /dev/y rw
32 1 0:56 / relative rw - ext4 /dev/z rw
33 1 0:57 / /mnt/nfs rw - ext4 /dev/sdc rw
34 1 0:58 / /mnt/a\\134b\\012c rw - 9p trans=virtio rw
";

    fn table() -> Vec<Mount> {
        parse_mountinfo(MOUNTINFO.as_bytes())
    }

    fn check(
        mounts: &[Mount],
        folder: &str,
        dev: Option<(u64, u64)>,
        magic: Option<u32>,
        want: Expect,
    ) {
        let mount = mount_of(mounts, Path::new(folder), dev);
        let verdict = match classify(magic, mount) {
            Some((name, kind)) => format!("refused: {name} ({kind})"),
            None => "served".to_owned(),
        };
        let at = mount.map_or_else(|| "-".to_owned(), |m| m.mount_point.display().to_string());
        want.assert_eq(&format!("{verdict} at {at}"));
    }

    #[test]
    fn the_parser_keeps_well_formed_lines_and_unescapes_mount_points() {
        let parsed: Vec<String> = table()
            .iter()
            .map(|m| format!("{}:{} {:?} {}", m.dev.0, m.dev.1, m.mount_point, m.fs_type))
            .collect();
        expect![[r#"
            0:21 "/" overlay
            0:5 "/dev" tmpfs
            0:24 "/dev/shm" tmpfs
            254:1 "/workspace" ext4
            0:50 "/Projects/my proj" fakeowner
            0:51 "/mnt/nfs" nfs4
            0:52 "/mnt/nfs/local" ext4
            0:53 "/mnt/bind" fuse.bindfs
            0:54 "/mnt/virt" virtiofs
            0:57 "/mnt/nfs" ext4
            0:58 "/mnt/a\\b\nc" 9p"#]]
        .assert_eq(&parsed.join("\n"));
    }

    #[test]
    fn a_bad_escape_stays_as_it_is() {
        assert_eq!(unescape(b"a\\04"), b"a\\04");
        assert_eq!(unescape(b"a\\999b"), b"a\\999b");
        assert_eq!(unescape(b"\\"), b"\\");
        // Above a byte: not an escape the kernel makes.
        assert_eq!(unescape(b"\\777"), b"\\777");
        assert_eq!(unescape(b"x\\040y\\011z"), b"x y\tz");
    }

    #[test]
    fn the_folder_is_classified_by_the_longest_mount_that_holds_it() {
        let t = table();
        check(
            &t,
            "/workspace/s",
            Some((254, 1)),
            Some(0xEF53),
            expect!["served at /workspace"],
        );
        check(
            &t,
            "/",
            Some((0, 21)),
            Some(0x794C_7630),
            expect!["served at /"],
        );
        check(
            &t,
            "/dev/shm/x",
            Some((0, 24)),
            Some(0x0102_1994),
            expect!["served at /dev/shm"],
        );
        // A prefix by characters is not a prefix by components.
        check(
            &t,
            "/workspacex",
            Some((0, 21)),
            Some(0x794C_7630),
            expect!["served at /"],
        );
        check(
            &t,
            "/mnt/bind/sess",
            Some((0, 53)),
            Some(0x6573_5546),
            expect!["refused: fuse.bindfs (a FUSE filesystem) at /mnt/bind"],
        );
        check(
            &t,
            "/mnt/virt",
            Some((0, 54)),
            Some(0x6573_5546),
            expect!["refused: virtiofs (a folder shared into a VM) at /mnt/virt"],
        );
        check(
            &t,
            "/Projects/my proj/s",
            Some((0, 50)),
            None,
            expect!["refused: fakeowner (a folder shared into a VM) at /Projects/my proj"],
        );
        check(
            &t,
            "/mnt/a\\b\nc",
            Some((0, 58)),
            Some(0x0102_1997),
            expect!["refused: 9p (a folder shared into a VM) at /mnt/a\\b\nc"],
        );
        // A local disk mounted inside an NFS tree is local.
        check(
            &t,
            "/mnt/nfs/local/s",
            Some((0, 52)),
            Some(0xEF53),
            expect!["served at /mnt/nfs/local"],
        );
    }

    #[test]
    fn the_device_tells_stacked_mounts_apart() {
        let t = table();
        // Two mounts on /mnt/nfs: ext4 (the later line) over nfs4; the folder's device says
        // which one it is on.
        check(
            &t,
            "/mnt/nfs/s",
            Some((0, 51)),
            Some(0x6969),
            expect!["refused: nfs4 (a network filesystem) at /mnt/nfs"],
        );
        check(
            &t,
            "/mnt/nfs/s",
            Some((0, 57)),
            Some(0xEF53),
            expect!["served at /mnt/nfs"],
        );
        // No device (btrfs subvolumes report their own): the later of the longest wins.
        check(
            &t,
            "/mnt/nfs/s",
            Some((0, 99)),
            Some(0x9123_683E),
            expect!["served at /mnt/nfs"],
        );
    }

    #[test]
    fn either_signal_refuses() {
        let t = table();
        // The kernel says FUSE where the table says ext4 (e.g. a table read in another mount
        // namespace): refused, naming both.
        check(
            &t,
            "/workspace/s",
            Some((254, 1)),
            Some(0x6573_5546),
            expect!["refused: fuse (statfs; the mount table says ext4) (a FUSE filesystem) at /workspace"],
        );
        // No mount table at all: the magic alone decides and names it.
        check(
            &[],
            "/x",
            None,
            Some(0xFF53_4D42),
            expect!["refused: cifs (a network filesystem) at -"],
        );
        check(
            &[],
            "/x",
            None,
            Some(0xFE53_4D42),
            expect!["refused: smb3 (a network filesystem) at -"],
        );
        check(
            &[],
            "/x",
            None,
            Some(0x0102_1997),
            expect!["refused: 9p (a folder shared into a VM) at -"],
        );
        check(&[], "/x", None, Some(0xEF53), expect!["served at -"]);
        check(&[], "/x", None, None, expect!["served at -"]);
    }

    #[test]
    fn local_and_shared_types() {
        for local in [
            "ext4", "xfs", "btrfs", "zfs", "tmpfs", "overlay", "f2fs", "ramfs", "fusectl",
        ] {
            assert_eq!(shared_by_type(local), None, "{local}");
        }
        for (shared, kind) in [
            ("fuse", SharedKind::Fuse),
            ("fuseblk", SharedKind::Fuse),
            ("fuse.sshfs", SharedKind::Fuse),
            ("fuse.glusterfs", SharedKind::Fuse),
            ("9p", SharedKind::VmShare),
            ("virtiofs", SharedKind::VmShare),
            ("nfs", SharedKind::Network),
            ("nfs4", SharedKind::Network),
            ("cifs", SharedKind::Network),
            ("smb3", SharedKind::Network),
            ("lustre", SharedKind::Network),
            ("gfs2", SharedKind::Cluster),
        ] {
            assert_eq!(shared_by_type(shared), Some(kind), "{shared}");
        }
    }

    #[test]
    fn the_magics_are_the_kernels() {
        // The constants libc carries, where it has them (the others are checked against
        // include/uapi/linux/magic.h by hand: 9p 0x01021997, cifs 0xFF534D42, smb3 0xFE534D42,
        // ceph 0x00c36400, AFS_FS 0x6B414653).
        let magic = |name: &str| {
            SHARED_MAGICS
                .iter()
                .find(|(_, n, _)| *n == name)
                .map(|(m, _, _)| *m)
                .unwrap()
        };
        assert_eq!(
            magic("fuse"),
            u32::try_from(libc::FUSE_SUPER_MAGIC).unwrap()
        );
        assert_eq!(magic("nfs"), u32::try_from(libc::NFS_SUPER_MAGIC).unwrap());
        assert_eq!(magic("smb"), u32::try_from(libc::SMB_SUPER_MAGIC).unwrap());
        assert_eq!(magic("afs"), u32::try_from(libc::AFS_SUPER_MAGIC).unwrap());
        assert_eq!(
            magic("coda"),
            u32::try_from(libc::CODA_SUPER_MAGIC).unwrap()
        );
        assert_eq!(
            magic("ncpfs"),
            u32::try_from(libc::NCP_SUPER_MAGIC).unwrap()
        );
        assert_eq!(
            magic("ocfs2"),
            u32::try_from(libc::OCFS2_SUPER_MAGIC).unwrap()
        );
        // And no local filesystem's magic is among them.
        for local in [
            libc::TMPFS_MAGIC,
            libc::OVERLAYFS_SUPER_MAGIC,
            libc::EXT4_SUPER_MAGIC,
            libc::XFS_SUPER_MAGIC,
            libc::BTRFS_SUPER_MAGIC,
        ] {
            assert!(SHARED_MAGICS
                .iter()
                .all(|(m, _, _)| Some(*m) != u32::try_from(local).ok()));
        }
    }

    #[test]
    fn the_message_names_the_filesystem_the_mount_and_the_fix() {
        let refused = SharedFilesystem {
            db: PathBuf::from("/mnt/share/s1/session.db"),
            folder: PathBuf::from("/mnt/share/s1"),
            fs_name: "nfs4".into(),
            kind: SharedKind::Network,
            mount_point: Some(PathBuf::from("/mnt/share")),
        };
        expect![[r#"refusing the session DB /mnt/share/s1/session.db: its folder /mnt/share/s1 is on nfs4 (a network filesystem, mounted at /mnt/share), and SQLite's WAL needs every process that opens the DB on one kernel (on such folders it reports `database is locked` or I/O errors, or silently corrupts the DB). Fix: keep the session folder on a local filesystem of the VM or pod that runs agent-runner (a named volume, an emptyDir), run `nanoclaw serve` there, next to the DB, and talk to it over HTTP with `nanoclaw --url` from outside. This check has no switch"#]]
        .assert_eq(&refused.to_string());
        let unmounted = SharedFilesystem {
            fs_name: "9p".into(),
            kind: SharedKind::VmShare,
            mount_point: None,
            ..refused
        };
        assert!(unmounted
            .to_string()
            .contains("is on 9p (a folder shared into a VM), and SQLite's WAL"));
    }

    #[test]
    fn this_machines_temp_folder_is_served() {
        // The test's own temp folder is on a local filesystem wherever CI runs it; the
        // classification runs the real statfs and mount table.
        let dir = tempfile::tempdir().unwrap();
        refuse_shared_filesystem(&dir.path().join("session.db")).unwrap();
        refuse_shared_filesystem(&dir.path().join("not/yet/there/session.db")).unwrap();
    }
}

/// Real mounts for the binaries' tests (feature `testing`): a FUSE mount by bindfs and a tmpfs
/// folder. Mounting needs root and `/dev/fuse`; where either is missing the helpers return why,
/// and the test prints that it skips the case (never silently).
#[cfg(any(test, feature = "testing"))]
pub(crate) mod testing {
    #![allow(clippy::unwrap_used)]
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    const FUSE_MAGIC: u32 = 0x6573_5546;
    const TMPFS_MAGIC: u32 = 0x0102_1994;

    /// How long bindfs may take to mount, and to exit after its unmount.
    const MOUNT_WAIT: Duration = Duration::from_secs(10);

    fn magic(path: &Path) -> Option<u32> {
        nix::sys::statfs::statfs(path)
            .ok()
            .map(|stat| stat.filesystem_type().0 as u32)
    }

    /// The project's tools folder (`scripts/install-test-tools.sh`): `NANOCLAW_TOOLS_DIR`, else
    /// `<repo>/.tools`.
    fn tools_dir() -> PathBuf {
        std::env::var_os("NANOCLAW_TOOLS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools"))
    }

    /// `source` mounted at `target` by bindfs (a FUSE passthrough), unmounted (by path) and its
    /// bindfs process reaped on drop.
    #[derive(Debug)]
    pub struct FuseMount {
        target: PathBuf,
        bindfs: Child,
    }

    impl FuseMount {
        /// Mounts `source` at `target` (an empty folder). `Err` says why this machine cannot
        /// mount FUSE (not root, no `/dev/fuse`, mounting not permitted): the caller skips the
        /// case and prints it. A missing bindfs is a failure, not a skip: the test command
        /// installs it (scripts/test.sh runs scripts/install-test-tools.sh).
        pub fn bindfs(source: &Path, target: &Path) -> Result<Self, String> {
            if !nix::unistd::Uid::effective().is_root() {
                return Err(
                    "not root: mounting FUSE without the setuid fusermount needs root".into(),
                );
            }
            if !Path::new("/dev/fuse").exists() {
                return Err(
                    "no /dev/fuse on this machine (run the container with --device /dev/fuse)"
                        .into(),
                );
            }
            let tools = tools_dir();
            // The project's copy, else one installed on the machine.
            let bindfs = [tools.join("usr/bin/bindfs")]
                .into_iter()
                .chain(
                    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                        .map(|dir| dir.join("bindfs")),
                )
                .find(|path| path.is_file());
            let Some(bindfs) = bindfs else {
                panic!(
                    "no bindfs in {} or on PATH: run scripts/install-test-tools.sh (scripts/test.sh does)",
                    tools.display()
                );
            };
            // libfuse2 is unpacked beside it, under the multiarch folders.
            let libs: Vec<String> = ["lib", "usr/lib"]
                .iter()
                .filter_map(|dir| std::fs::read_dir(tools.join(dir)).ok())
                .flatten()
                .flatten()
                .map(|entry| entry.path())
                .filter(|path| path.is_dir())
                .map(|path| path.display().to_string())
                .collect();
            let mut child = Command::new(&bindfs)
                // Foreground: this process owns it and reaps it. `subtype` makes the mount
                // table say `fuse.bindfs`, as a system-wide bindfs does.
                .args(["-f", "-o", "subtype=bindfs"])
                .arg(source)
                .arg(target)
                .env("LD_LIBRARY_PATH", libs.join(":"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|err| format!("cannot start {}: {err}", bindfs.display()))
                .unwrap();
            let deadline = Instant::now() + MOUNT_WAIT;
            loop {
                if magic(target) == Some(FUSE_MAGIC) {
                    break;
                }
                if let Ok(Some(status)) = child.try_wait() {
                    let mut stderr = String::new();
                    if let Some(mut pipe) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
                    }
                    // A container without CAP_SYS_ADMIN: the machine does not allow mounting.
                    if stderr.contains("Operation not permitted")
                        || stderr.contains("Permission denied")
                    {
                        return Err(format!(
                            "mounting FUSE is not permitted here: {}",
                            stderr.trim()
                        ));
                    }
                    panic!(
                        "bindfs exited ({status}) without mounting: {}",
                        stderr.trim()
                    );
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "bindfs did not mount {} within {MOUNT_WAIT:?}",
                        target.display()
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(Self {
                target: target.to_path_buf(),
                bindfs: child,
            })
        }
    }

    impl Drop for FuseMount {
        fn drop(&mut self) {
            // By path, lazily: a process of the test still inside it cannot keep it mounted.
            let _ = nix::mount::umount2(&self.target, nix::mount::MntFlags::MNT_DETACH);
            let deadline = Instant::now() + MOUNT_WAIT;
            while matches!(self.bindfs.try_wait(), Ok(None)) {
                if Instant::now() > deadline {
                    let _ = self.bindfs.kill();
                    let _ = self.bindfs.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// A new folder on tmpfs (in `/dev/shm`), removed on drop; `Err` says why there is none.
    pub fn tmpfs_dir() -> Result<tempfile::TempDir, String> {
        let dir = tempfile::tempdir_in("/dev/shm").map_err(|err| format!("no /dev/shm: {err}"))?;
        match magic(dir.path()) {
            Some(TMPFS_MAGIC) => Ok(dir),
            other => Err(format!(
                "/dev/shm is not tmpfs here (statfs type {other:x?})"
            )),
        }
    }

    #[cfg(test)]
    mod tests {
        #![allow(clippy::unwrap_used)]
        use super::*;

        #[test]
        fn a_bindfs_mount_is_refused_and_tmpfs_is_served() {
            let dir = tempfile::tempdir().unwrap();
            let (source, target) = (dir.path().join("src"), dir.path().join("mnt"));
            std::fs::create_dir_all(&source).unwrap();
            std::fs::create_dir_all(&target).unwrap();
            match FuseMount::bindfs(&source, &target) {
                Err(why) => eprintln!("SKIPPED the FUSE case: {why}"),
                Ok(mount) => {
                    let refused =
                        crate::refuse_shared_filesystem(&target.join("session.db")).unwrap_err();
                    assert_eq!(refused.fs_name, "fuse.bindfs");
                    assert_eq!(refused.kind, crate::SharedKind::Fuse);
                    assert_eq!(
                        refused.mount_point,
                        Some(std::fs::canonicalize(&target).unwrap())
                    );
                    // A folder not there yet is classified by its nearest ancestor; a link
                    // from a local folder into the mount by where it leads.
                    crate::refuse_shared_filesystem(&target.join("a/b/session.db")).unwrap_err();
                    std::os::unix::fs::symlink(&target, dir.path().join("link")).unwrap();
                    crate::refuse_shared_filesystem(&dir.path().join("link/session.db"))
                        .unwrap_err();
                    drop(mount);
                    // Unmounted by the guard: the folder is local again.
                    crate::refuse_shared_filesystem(&target.join("session.db")).unwrap();
                }
            }
            match tmpfs_dir() {
                Err(why) => eprintln!("SKIPPED the tmpfs case: {why}"),
                Ok(tmp) => crate::refuse_shared_filesystem(&tmp.path().join("session.db")).unwrap(),
            }
        }
    }
}
