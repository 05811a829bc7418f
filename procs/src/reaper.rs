//! No process outlives its session: the runner is the reaper of everything it starts.
//!
//! - **Subreaper.** [`init`] makes the runner the child subreaper of its descendants
//!   (`PR_SET_CHILD_SUBREAPER`; as PID 1 it is their reaper anyway), so the agent's tool processes
//!   that the CLIs put in process groups or sessions of their own reparent to the runner when
//!   their parent exits instead of escaping to init. A task then reaps those orphans on every
//!   `SIGCHLD` (and every second, as a fallback), but never a child the runner spawned itself:
//!   tokio owns those exit statuses (`Child::wait`), and a `waitpid(-1)` would steal them.
//!   Every direct child is spawned through [`spawn_owned`], which records its (pid, start time)
//!   while holding the registry lock, so the reaper (which takes the same lock before each
//!   `waitpid`) can never see an owned child's zombie before it is registered.
//! - **Marker.** Every process the runner starts (each CLI, task scripts) carries
//!   `NANOCLAW_SESSION_MARK=<mark>` in its environment (added by `CliProcess::spawn`), which their
//!   children inherit; the mark is derived from the session DB's identity, so the next run of the
//!   same session finds the same mark.
//! - **Ledger.** [`Leftovers`] records the pids and start times of the runner's descendants in
//!   `<session.db>.procs` on every heartbeat, which also catches processes whose environment was
//!   cleared (`env -i`).
//! - **Startup.** After the single-runner lock is taken (so no legitimate process of the session
//!   exists yet), [`Leftovers::start`] kills every marked process of the session and every ledger
//!   entry whose start time still matches (never a recycled pid).
//! - **Shutdown.** [`Leftovers::stop`], after the provider shutdown, kills every remaining
//!   descendant (by pid with a start-time check, never by name) and reaps them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// The environment variable that marks every process the runner starts with its session.
pub(crate) const MARK_VAR: &str = "NANOCLAW_SESSION_MARK";

/// How long [`Leftovers::stop`] waits for killed descendants to be gone.
const STOP_WAIT: Duration = Duration::from_secs(3);

/// How often the reaper looks for orphans when no `SIGCHLD` came.
const REAP_FALLBACK: Duration = Duration::from_secs(1);

/// Errors of the process hygiene.
#[derive(Debug, thiserror::Error)]
pub enum ReaperError {
    /// `prctl(PR_SET_CHILD_SUBREAPER)` failed.
    #[error(
        "cannot make agent-runner the child subreaper of its processes \
         (prctl PR_SET_CHILD_SUBREAPER: {0}); the agent's background processes escape to init \
         when their parent exits: run agent-runner as PID 1 of the container or on a kernel \
         with PR_SET_CHILD_SUBREAPER (Linux 3.4+)"
    )]
    Subreaper(nix::Error),
    /// The DB's identity (which names the marker) could not be read.
    #[error("cannot read the session DB {path} to derive its process marker: {source}")]
    Identity {
        /// The DB path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

// ---------------------------------------------------------------------------------------------
// /proc
// ---------------------------------------------------------------------------------------------

/// One process as `/proc/<pid>/stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    pub pid: i32,
    pub ppid: i32,
    /// The state letter (`R`, `S`, `Z`, …).
    pub state: u8,
    /// Start time in clock ticks since boot: with the pid, the identity of a process.
    pub started: u64,
}

/// `/proc/<pid>/stat` of `pid`.
pub(crate) fn stat(pid: i32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: split after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // fields[0] = state (field 3), [1] = ppid (4), [19] = starttime (22).
    Some(ProcStat {
        pid,
        state: *fields.first()?.as_bytes().first()?,
        ppid: fields.get(1)?.parse().ok()?,
        started: fields.get(19)?.parse().ok()?,
    })
}

/// Every process in `/proc`.
pub(crate) fn all_processes() -> Vec<ProcStat> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(stat)
        .collect()
}

/// The children of `pid` listed in its threads' `children` files; `None` when its task folder
/// cannot be read or has no such file (a kernel without `CONFIG_PROC_CHILDREN`). The files may
/// miss a child that changes meanwhile; the next pass finds it.
fn listed_children(pid: i32) -> Option<Vec<i32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut listed: Option<Vec<i32>> = None;
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            listed.get_or_insert_with(Vec::new).extend(
                text.split_whitespace()
                    .filter_map(|pid| pid.parse::<i32>().ok()),
            );
        }
    }
    listed
}

/// This process's children: from its threads' `children` files (cheap: the reaper runs on every
/// `SIGCHLD`), else from a scan of `/proc`.
fn own_children() -> Vec<ProcStat> {
    let me = std::process::id() as i32;
    match listed_children(me) {
        Some(pids) => pids.into_iter().filter_map(stat).collect(),
        None => all_processes(),
    }
    .into_iter()
    .filter(|p| p.ppid == me)
    .collect()
}

/// Every descendant of `root` (zombies included) with its start time: the tree walked down
/// through each process's `children` files, which reads in proportion to the descendants. A
/// scan of `/proc` read every process on the machine, every heartbeat, in every runner of a
/// fleet that shares a PID namespace. Without those files, that scan.
pub(crate) fn descendants(root: u32) -> Vec<(i32, u64)> {
    let root = root as i32;
    let mut found: Vec<(i32, u64)> = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        let Some(children) = listed_children(parent) else {
            if parent == root {
                return descendants_by_scan(root);
            }
            // Gone meanwhile (its children moved to the subreaper: the next pass finds them).
            continue;
        };
        for pid in children {
            if found.iter().any(|(p, _)| *p == pid) {
                continue;
            }
            // Still the child of `parent` when looked at (not a recycled pid).
            if let Some(process) = stat(pid).filter(|p| p.ppid == parent) {
                found.push((pid, process.started));
                frontier.push(pid);
            }
        }
    }
    found
}

/// [`descendants`] from one scan of `/proc`.
fn descendants_by_scan(root: i32) -> Vec<(i32, u64)> {
    let all = all_processes();
    let mut found: Vec<(i32, u64)> = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for process in &all {
            if process.ppid == parent && !found.iter().any(|(p, _)| *p == process.pid) {
                found.push((process.pid, process.started));
                frontier.push(process.pid);
            }
        }
    }
    found
}

/// SIGKILLs `pid` if it is still the process that started at `started`.
fn kill_if_same(pid: i32, started: u64) -> bool {
    if stat(pid).map(|s| s.started) == Some(started) {
        kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok()
    } else {
        false
    }
}

/// The real uid of `pid` (`/proc/<pid>/status`, readable even for non-dumpable processes).
fn uid_of(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// This process and its ancestors: never killed, whatever their environment says.
fn self_and_ancestors() -> Vec<i32> {
    let mut chain = vec![std::process::id() as i32];
    while let Some(parent) = chain
        .last()
        .and_then(|pid| stat(*pid))
        .map(|s| s.ppid)
        .filter(|ppid| *ppid > 0 && !chain.contains(ppid))
    {
        chain.push(parent);
    }
    chain
}

/// The kernel's boot id: start times count from boot, so a ledger of another boot means nothing.
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_owned())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Subreaper and the registry of owned children
// ---------------------------------------------------------------------------------------------

/// The children spawned through [`spawn_owned`] (pid, start time; 0 when unknown): their exit
/// status belongs to whoever spawned them, the reaper leaves their zombies alone.
static OWNED: Mutex<Vec<(i32, u64)>> = Mutex::new(Vec::new());

fn owned() -> MutexGuard<'static, Vec<(i32, u64)>> {
    OWNED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Spawns a child with `spawn` and registers its pid (from `pid_of`) before the reaper can look
/// at it: every process the runner spawns directly must go through here (`CliProcess::spawn`
/// does), or the reaper may reap it before its owner waits for it.
pub(crate) fn spawn_owned<T, E>(
    spawn: impl FnOnce() -> Result<T, E>,
    pid_of: impl FnOnce(&T) -> Option<u32>,
) -> Result<T, E> {
    let mut owned = owned();
    let child = spawn()?;
    if let Some(pid) = pid_of(&child) {
        let pid = pid as i32;
        // An unreaped child keeps its stat, so this only fails without /proc.
        let started = stat(pid).map_or(0, |s| s.started);
        owned.push((pid, started));
    }
    Ok(child)
}

/// Reaps every zombie child of this process that it did not spawn itself (orphans adopted as
/// subreaper or PID 1); returns their pids. Owned children that are gone are forgotten.
pub(crate) fn reap_orphans() -> Vec<i32> {
    let children = own_children();
    let mut owned = owned();
    // Checked one by one, not against `children` (which may miss one): forgetting a child that
    // is still ours would let its zombie be reaped here.
    let me = std::process::id() as i32;
    owned.retain(|(pid, started)| {
        stat(*pid).is_some_and(|s| s.ppid == me && (*started == 0 || s.started == *started))
    });
    let mut reaped = Vec::new();
    for zombie in children.iter().filter(|c| c.state == b'Z') {
        if owned.iter().any(|(pid, _)| *pid == zombie.pid) {
            continue;
        }
        match waitpid(Pid::from_raw(zombie.pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => {}
            Ok(_) => reaped.push(zombie.pid),
        }
    }
    reaped
}

/// Makes this process the child subreaper of everything it will start and starts the task that
/// reaps adopted orphans. Call once at startup, before anything is spawned, inside the tokio
/// runtime. As PID 1 the process reaps orphans whatever the `prctl` says.
pub fn init() -> Result<(), ReaperError> {
    let subreaper = nix::sys::prctl::set_child_subreaper(true).map_err(ReaperError::Subreaper);
    tokio::spawn(reap_forever());
    if std::process::id() == 1 {
        tracing::info!("agent-runner is PID 1: it reaps every orphan of the container");
    }
    subreaper
}

async fn reap_forever() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigchld = signal(SignalKind::child()).ok();
    let mut fallback = tokio::time::interval(REAP_FALLBACK);
    loop {
        match sigchld.as_mut() {
            Some(stream) => {
                tokio::select! {
                    got = stream.recv() => if got.is_none() { sigchld = None },
                    _ = fallback.tick() => {}
                }
            }
            None => {
                fallback.tick().await;
            }
        }
        let reaped = tokio::task::spawn_blocking(reap_orphans)
            .await
            .unwrap_or_default();
        if !reaped.is_empty() {
            tracing::debug!(?reaped, "reaped orphaned processes");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The session marker
// ---------------------------------------------------------------------------------------------

static MARK: OnceLock<String> = OnceLock::new();

/// The session's marker value, once [`Leftovers::start`] (or [`set_session_mark`]) set it.
pub(crate) fn session_mark() -> Option<&'static str> {
    MARK.get().map(String::as_str)
}

/// Sets the marker every process spawned from now on carries (the first value wins).
pub(crate) fn set_session_mark(mark: &str) {
    let _ = MARK.set(mark.to_owned());
}

/// The marker of the session whose DB is at `db`: its (device, inode), the same for every run
/// of the session and different for every other DB on the machine.
pub(crate) fn mark_for(db: &Path) -> Result<String, ReaperError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(db).map_err(|source| ReaperError::Identity {
        path: db.to_path_buf(),
        source,
    })?;
    Ok(format!("db-{:x}-{:x}", meta.dev(), meta.ino()))
}

/// Sends SIGKILL to every process (other than this one and its ancestors) whose environment has
/// the exact entry `marker` (`NAME=value`); with `groups`, to its process group too (when it is
/// not this process's group). Processes whose environment this user cannot read are skipped.
/// Returns the pids found.
pub fn kill_marked(marker: &str, groups: bool) -> Vec<u32> {
    let spared = self_and_ancestors();
    let own_group = nix::unistd::getpgrp();
    let mut found = Vec::new();
    for process in all_processes() {
        if spared.contains(&process.pid) || process.state == b'Z' {
            continue;
        }
        let Ok(environ) = std::fs::read(format!("/proc/{}/environ", process.pid)) else {
            continue;
        };
        if !environ
            .split(|byte| *byte == 0)
            .any(|entry| entry == marker.as_bytes())
        {
            continue;
        }
        let pid = Pid::from_raw(process.pid);
        if groups {
            if let Ok(group) = nix::unistd::getpgid(Some(pid)) {
                if group != own_group && !spared.contains(&group.as_raw()) {
                    let _ = killpg(group, Signal::SIGKILL);
                }
            }
        }
        if kill_if_same(process.pid, process.started) {
            found.push(process.pid as u32);
        }
    }
    found
}

// ---------------------------------------------------------------------------------------------
// The ledger and the session's leftovers
// ---------------------------------------------------------------------------------------------

/// The ledger file of the session DB at `db`: `<db>.procs` beside the DB (resolved path, like the
/// runner's `.lock`), read and written through `fsguard` because the agent can write the folder.
pub(crate) fn ledger_path(db: &Path) -> PathBuf {
    let resolved = std::fs::canonicalize(db).unwrap_or_else(|_| db.to_path_buf());
    let mut name = resolved.into_os_string();
    name.push(".procs");
    PathBuf::from(name)
}

/// The ledger's text: the boot id, then one `pid start_time` line per process.
fn ledger_text(boot: &str, entries: &[(i32, u64)]) -> String {
    let mut text = format!("boot {boot}\n");
    for (pid, started) in entries {
        text.push_str(&format!("{pid} {started}\n"));
    }
    text
}

/// The entries of a ledger written during boot `boot` (none for another boot or a bad file).
fn parse_ledger(text: &str, boot: &str) -> Vec<(i32, u64)> {
    let mut lines = text.lines();
    if lines.next().and_then(|l| l.strip_prefix("boot ")) != Some(boot) {
        return Vec::new();
    }
    lines
        .filter_map(|line| {
            let (pid, started) = line.split_once(' ')?;
            Some((pid.trim().parse().ok()?, started.trim().parse().ok()?))
        })
        .filter(|(pid, _)| *pid > 1)
        .collect()
}

/// The most of a ledger that is read: the agent can replace the file with a huge one.
const LEDGER_MAX_BYTES: u64 = 1024 * 1024;

/// The first [`LEDGER_MAX_BYTES`] of the file at `path`, through `fsguard`.
fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    fsguard::open(path)?
        .take(LEDGER_MAX_BYTES)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

struct Ledger {
    path: PathBuf,
    boot: String,
    /// What the file holds now (to write only on change).
    written: Option<Vec<(i32, u64)>>,
}

impl Ledger {
    /// Writes the current descendants of this process when they changed.
    fn refresh(&mut self) {
        let mut now = descendants(std::process::id());
        now.sort_unstable();
        self.record(now);
    }

    fn record(&mut self, entries: Vec<(i32, u64)>) {
        if self.written.as_ref() == Some(&entries) {
            return;
        }
        match fsguard::write_private(&self.path, ledger_text(&self.boot, &entries).as_bytes()) {
            Ok(()) => self.written = Some(entries),
            Err(err) => tracing::warn!(
                ledger = %self.path.display(),
                %err,
                "cannot record the runner's processes; a crash may leave processes without an \
                 environment marker behind: check that the session DB's folder is writable"
            ),
        }
    }
}

fn lock_ledger(ledger: &Mutex<Ledger>) -> MutexGuard<'_, Ledger> {
    ledger.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The leftover hygiene of one session (see the module docs): created at startup, stopped at
/// shutdown.
#[derive(Debug)]
pub struct Leftovers {
    ledger: Arc<Mutex<Ledger>>,
    refresher: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").field("path", &self.path).finish()
    }
}

impl Leftovers {
    /// Sets the session's marker (from the DB at `db`), kills what a previous run of the session
    /// left behind (marked processes, and ledger entries that are still the same processes of
    /// this user), and starts recording the runner's descendants every `every`.
    ///
    /// Call after taking the single-runner lock and opening the DB (so `fsguard` protects its
    /// files), before anything is spawned, inside the tokio runtime.
    pub fn start(db: &Path, every: Duration) -> Result<Self, ReaperError> {
        let mark = mark_for(db)?;
        set_session_mark(&mark);
        let mut ledger = Ledger {
            path: ledger_path(db),
            boot: boot_id(),
            written: None,
        };
        let mut killed = kill_previous(&mark, &ledger.path, &ledger.boot, false);
        if killed.is_empty() {
            tracing::debug!("no process of a previous run of this session was left");
        } else {
            killed.sort_unstable();
            tracing::info!(
                count = killed.len(),
                pids = ?killed,
                "killed processes a previous run of this session left behind"
            );
        }
        ledger.record(Vec::new());
        let ledger = Arc::new(Mutex::new(ledger));
        let refreshed = Arc::clone(&ledger);
        let refresher = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            loop {
                ticker.tick().await;
                let ledger = Arc::clone(&refreshed);
                let _ = tokio::task::spawn_blocking(move || lock_ledger(&ledger).refresh()).await;
            }
        });
        Ok(Self { ledger, refresher })
    }

    /// Kills every remaining descendant of the runner (call after the provider's shutdown), waits
    /// up to a few seconds for them to be gone while reaping them, and clears the ledger.
    pub async fn stop(self) {
        self.refresher.abort();
        let ledger = Arc::clone(&self.ledger);
        let killed = tokio::task::spawn_blocking(move || {
            let killed = kill_descendants(STOP_WAIT);
            lock_ledger(&ledger).record(Vec::new());
            killed
        })
        .await
        .unwrap_or_default();
        if !killed.is_empty() {
            tracing::info!(
                count = killed.len(),
                pids = ?killed,
                "killed processes the session left running"
            );
        }
    }
}

/// Kills what a run of the session whose DB is at `db` left behind: every process carrying the
/// session's marker and its process group, and every ledger entry that is still the same
/// process of this user. For a supervisor whose runner died (`nanoclaw fleet`): a runner killed
/// with SIGKILL cannot stop its own descendants. Returns the pids killed.
pub fn kill_leftovers(db: &Path) -> Result<Vec<u32>, ReaperError> {
    let mark = mark_for(db)?;
    Ok(kill_previous(&mark, &ledger_path(db), &boot_id(), true))
}

/// The kills of [`Leftovers::start`] and [`kill_leftovers`]: marked processes (and their
/// process groups, with `groups`), then the ledger's entries.
fn kill_previous(mark: &str, ledger: &Path, boot: &str, groups: bool) -> Vec<u32> {
    let mut killed = kill_marked(&format!("{MARK_VAR}={mark}"), groups);
    let previous = match read_capped(ledger) {
        Ok(bytes) => parse_ledger(&String::from_utf8_lossy(&bytes), boot),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(err) => {
            tracing::warn!(ledger = %ledger.display(), %err, "cannot read the process ledger of the previous run");
            Vec::new()
        }
    };
    let spared = self_and_ancestors();
    let uid = nix::unistd::getuid().as_raw();
    for (pid, started) in previous {
        // Only this user's processes: the agent can write the ledger, and must not be able
        // to make a runner with more rights kill someone else's process.
        if spared.contains(&pid) || killed.contains(&(pid as u32)) || uid_of(pid) != Some(uid) {
            continue;
        }
        if kill_if_same(pid, started) {
            killed.push(pid as u32);
        }
    }
    killed
}

/// SIGKILLs every live descendant of this process (start time checked), then reaps and waits up
/// to `wait` until none is left; returns the pids killed.
pub(crate) fn kill_descendants(wait: Duration) -> Vec<i32> {
    let me = std::process::id();
    let mut killed = Vec::new();
    let deadline = Instant::now() + wait;
    loop {
        let live: Vec<(i32, u64)> = descendants(me)
            .into_iter()
            .filter(|(pid, _)| stat(*pid).is_some_and(|s| s.state != b'Z'))
            .collect();
        if live.is_empty() {
            break;
        }
        for (pid, started) in live {
            if kill_if_same(pid, started) && !killed.contains(&pid) {
                killed.push(pid);
            }
        }
        reap_orphans();
        if Instant::now() >= deadline {
            tracing::warn!("processes of the session are still alive after SIGKILL");
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    reap_orphans();
    killed.sort_unstable();
    killed
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::process::{CliCommand, CliProcess};

    async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        for _ in 0..250 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("timed out waiting for {what}");
    }

    fn sh(dir: &Path, script: &str) -> CliProcess {
        let command = CliCommand::new("/bin/sh", dir)
            .args(["-c", script])
            .env("PATH", "/usr/bin:/bin");
        CliProcess::spawn(&command).unwrap()
    }

    /// The walk down the `children` files finds what a scan of `/proc` finds: a child, and its
    /// children, one in a session of its own. The child is listed under the thread that spawned
    /// it (the test harness runs each test on a thread that is not the main one). Compared under
    /// the child, whose tree the other tests of this process leave alone.
    #[tokio::test]
    async fn descendants_walked_down_are_those_a_scan_finds() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        let mut child = sh(
            dir.path(),
            &format!(
                "setsid sleep 30 & echo $! > {}; sleep 30",
                pidfile.display()
            ),
        );
        let pid_in_file = || {
            std::fs::read_to_string(&pidfile)
                .ok()?
                .trim()
                .parse::<i32>()
                .ok()
        };
        wait_for("the grandchild's pid", || pid_in_file().is_some()).await;
        let grandchild = pid_in_file().unwrap();
        let child_pid = child.pid() as i32;
        // The foreground `sleep` too: both of the child's children are up.
        wait_for("the child's two children", || {
            listed_children(child_pid).is_some_and(|pids| pids.len() == 2)
        })
        .await;

        let mine = descendants(std::process::id());
        assert!(mine.iter().any(|(pid, _)| *pid == child_pid), "{mine:?}");
        assert!(mine.iter().any(|(pid, _)| *pid == grandchild), "{mine:?}");
        let mut walked = descendants(child_pid as u32);
        let mut scanned = descendants_by_scan(child_pid);
        walked.sort_unstable();
        scanned.sort_unstable();
        assert_eq!(walked.len(), 2, "{walked:?}");
        assert!(
            walked.iter().any(|(pid, _)| *pid == grandchild),
            "{walked:?}"
        );
        assert_eq!(walked, scanned);

        let _ = kill(Pid::from_raw(grandchild), Signal::SIGKILL);
        child.terminate(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn orphans_are_reaped_but_an_owned_childs_status_is_never_stolen() {
        nix::sys::prctl::set_child_subreaper(true).unwrap();
        let me = std::process::id() as i32;
        let dir = tempfile::tempdir().unwrap();
        // An owned child that exits with 7 and stays a zombie until its owner waits.
        let mut owned = sh(dir.path(), "exit 7");
        let owned_pid = owned.pid() as i32;
        wait_for("the owned child's zombie", || {
            stat(owned_pid).is_some_and(|s| s.state == b'Z')
        })
        .await;
        // An orphan: its parent exits first, it is adopted (subreaper) and exits too.
        let pidfile = dir.path().join("orphan.pid");
        let mut parent = sh(
            dir.path(),
            &format!("setsid sleep 0.2 & echo $! > {}", pidfile.display()),
        );
        parent.wait().await;
        wait_for("the orphan's pid", || pidfile.exists()).await;
        let orphan: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        wait_for("the orphan to be an exited child of the test", || {
            stat(orphan).is_some_and(|s| s.ppid == me && s.state == b'Z')
        })
        .await;
        let reaped = reap_orphans();
        assert!(reaped.contains(&orphan), "{reaped:?}");
        assert!(!reaped.contains(&owned_pid), "{reaped:?}");
        assert!(stat(orphan).is_none(), "the orphan is still a zombie");
        let status = owned.wait().await;
        assert_eq!(status.and_then(|s| s.code()), Some(7), "{status:?}");
    }

    #[test]
    fn ledger_round_trip_and_other_boots() {
        let text = ledger_text("abc", &[(10, 5), (42, 7)]);
        assert_eq!(parse_ledger(&text, "abc"), vec![(10, 5), (42, 7)]);
        assert!(parse_ledger(&text, "other-boot").is_empty());
        assert_eq!(
            parse_ledger("boot abc\n1 3\nx y\n77 9\n", "abc"),
            vec![(77, 9)]
        );
    }
}
