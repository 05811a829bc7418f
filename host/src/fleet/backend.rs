//! Where runners run: the [`Backend`] trait the scheduler drives, and the `process` backend
//! (runners as child processes of the fleet on this machine).
//!
//! The process backend starts `agent-runner --workspace ROOT/<name>` in a process group of its
//! own (so a signal to the fleet's group never reaches it, and a killed fleet leaves it running
//! to be adopted), its stdout and stderr appended to `ROOT/@fleet/logs/<name>.log`. When a
//! runner exits, however it exits, everything its session started is killed: the runner's
//! process group, every process carrying the session's marker (and its group), and every entry
//! of the runner's process ledger (`procs::reaper::kill_leftovers`). A runner killed with
//! SIGKILL cannot do that itself.

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use super::status::RunnerRecord;

/// Bytes of a runner's log kept when a run starts: an older, larger log is cut to its tail.
const LOG_KEEP_BYTES: u64 = 4 * 1024 * 1024;
/// Bytes at the end of the log read for the last error.
const LOG_TAIL_BYTES: u64 = 16 * 1024;

/// A runner that ended.
#[derive(Debug)]
pub(crate) struct Exited {
    /// Its session.
    pub(crate) name: String,
    /// Which runner.
    pub(crate) runner: RunnerRecord,
    /// How it ended, when known (an adopted runner's status is not ours to read).
    pub(crate) status: Option<std::process::ExitStatus>,
}

/// What a backend needs to start one session's runner.
#[derive(Debug, Clone)]
pub(crate) struct SessionSpec {
    pub(crate) name: String,
    /// The session folder (the runner's workspace).
    pub(crate) folder: PathBuf,
    /// Its DB.
    pub(crate) db: PathBuf,
}

/// Errors of a backend.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BackendError {
    /// The runner could not be started.
    #[error("cannot start {runner} for session {name}: {source} (check `--runner` / `runner` in fleet.json)")]
    Spawn {
        runner: String,
        name: String,
        source: std::io::Error,
    },
    /// The log file could not be opened.
    #[error("cannot open the runner log {path}: {source}")]
    Log {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Where runners run. Every runner started or adopted reports its end once on the channel the
/// backend was made with.
pub(crate) trait Backend: Send + Sync {
    /// Starts the runner of `spec`.
    fn start(&self, spec: &SessionSpec) -> Result<RunnerRecord, BackendError>;
    /// Watches a runner a previous fleet started, if it is still that process and still the
    /// runner of `spec`; false otherwise.
    fn adopt(&self, spec: &SessionSpec, runner: RunnerRecord) -> bool;
    /// Asks the runner to stop cleanly (SIGTERM: it finishes its stop and exits).
    fn stop(&self, runner: RunnerRecord);
    /// Kills the runner now (SIGKILL).
    fn kill(&self, runner: RunnerRecord);
    /// After the runner ended: kills everything its session left (blocking).
    fn clean_up(&self, spec: &SessionSpec, runner: RunnerRecord) -> Vec<u32>;
    /// The last error line of the session's runner log.
    fn last_error(&self, spec: &SessionSpec) -> Option<String>;
    /// How runners are isolated, in words (for `status`).
    fn isolation(&self) -> &'static str;
}

/// Runners as child processes.
pub(crate) struct ProcessBackend {
    runner: PathBuf,
    logs: PathBuf,
    exits: mpsc::UnboundedSender<Exited>,
}

impl ProcessBackend {
    /// Runs `runner`, logging to `logs/<name>.log`, reporting ends on `exits`.
    pub(crate) fn new(
        runner: PathBuf,
        logs: PathBuf,
        exits: mpsc::UnboundedSender<Exited>,
    ) -> Self {
        Self {
            runner,
            logs,
            exits,
        }
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.logs.join(format!("{name}.log"))
    }

    fn open_log(&self, name: &str) -> Result<std::fs::File, BackendError> {
        let path = self.log_path(name);
        let log_error = |source| BackendError::Log {
            path: path.clone(),
            source,
        };
        if std::fs::metadata(&path).is_ok_and(|m| m.len() > LOG_KEEP_BYTES) {
            let tail = read_tail(&path, LOG_KEEP_BYTES / 2).unwrap_or_default();
            std::fs::write(&path, tail).map_err(log_error)?;
        }
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(log_error)
    }
}

impl Backend for ProcessBackend {
    fn start(&self, spec: &SessionSpec) -> Result<RunnerRecord, BackendError> {
        let log = self.open_log(&spec.name)?;
        let log_out = log.try_clone().map_err(|source| BackendError::Log {
            path: self.log_path(&spec.name),
            source,
        })?;
        let spawn_error = |source| BackendError::Spawn {
            runner: self.runner.display().to_string(),
            name: spec.name.clone(),
            source,
        };
        let mut child = tokio::process::Command::new(&self.runner)
            .arg("--workspace")
            .arg(&spec.folder)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_out))
            .stderr(Stdio::from(log))
            .process_group(0)
            .kill_on_drop(false)
            .spawn()
            .map_err(spawn_error)?;
        let pid = child
            .id()
            .ok_or_else(|| spawn_error(std::io::Error::other("exited at once")))?;
        let runner = RunnerRecord {
            pid,
            started: start_time(pid).unwrap_or(0),
        };
        let exits = self.exits.clone();
        let name = spec.name.clone();
        tokio::spawn(async move {
            let status = child.wait().await.ok();
            let _ = exits.send(Exited {
                name,
                runner,
                status,
            });
        });
        Ok(runner)
    }

    fn adopt(&self, spec: &SessionSpec, runner: RunnerRecord) -> bool {
        if start_time(runner.pid) != Some(runner.started) || !runs_workspace(runner.pid, spec) {
            return false;
        }
        let Some(pidfd) = pidfd_open(runner.pid) else {
            return false;
        };
        let exits = self.exits.clone();
        let name = spec.name.clone();
        tokio::spawn(async move {
            // SAFETY: the `OwnedFd` owns the pidfd until it is dropped with the `AsyncFd`.
            match unsafe { AsyncFd::register(pidfd) } {
                Ok(fd) => {
                    let _ = fd.readable().await;
                }
                Err(_) => {
                    // No reactor registration: look every 100 ms (bounded by the runner's life).
                    while start_time(runner.pid) == Some(runner.started) {
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
            }
            let _ = exits.send(Exited {
                name,
                runner,
                status: None,
            });
        });
        true
    }

    fn stop(&self, runner: RunnerRecord) {
        signal(runner, nix::sys::signal::Signal::SIGTERM);
    }

    fn kill(&self, runner: RunnerRecord) {
        signal(runner, nix::sys::signal::Signal::SIGKILL);
    }

    fn clean_up(&self, spec: &SessionSpec, runner: RunnerRecord) -> Vec<u32> {
        // The runner's own group (it leads it): whatever it started that stayed there.
        if let Ok(group) = i32::try_from(runner.pid) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        match procs::reaper::kill_leftovers(&spec.db) {
            Ok(killed) => killed,
            Err(err) => {
                tracing::warn!(session = %spec.name, %err, "fleet: cannot look for the processes the runner left");
                Vec::new()
            }
        }
    }

    fn last_error(&self, spec: &SessionSpec) -> Option<String> {
        let tail = read_tail(&self.log_path(&spec.name), LOG_TAIL_BYTES).ok()?;
        let text = String::from_utf8_lossy(&tail);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines
            .iter()
            .rev()
            .find(|l| l.contains("ERROR") || l.contains("error"))
            .or(lines.last())
            .map(|line| line.chars().take(500).collect())
    }

    fn isolation(&self) -> &'static str {
        "process group + ledger"
    }
}

/// Sends `signal` to `runner` if it is still that process.
fn signal(runner: RunnerRecord, signal: nix::sys::signal::Signal) {
    if start_time(runner.pid) != Some(runner.started) {
        return;
    }
    if let Ok(pid) = i32::try_from(runner.pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}

/// The start time of `pid` (field 22 of `/proc/<pid>/stat`), while it lives (not a zombie).
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the command: state is field 3, start time field 22.
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Whether `pid`'s command line is `… --workspace <the session folder> …`.
fn runs_workspace(pid: u32, spec: &SessionSpec) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let folder = spec.folder.as_os_str().as_encoded_bytes();
    args.windows(2)
        .any(|pair| pair[0] == b"--workspace" && pair[1] == folder)
}

/// A pidfd for `pid` (readable once it exits), when the kernel has `pidfd_open`.
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the descriptor was just returned to us and is owned by nobody else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The last `bytes` of the file at `path`.
fn read_tail(path: &Path, bytes: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(bytes)))?;
    let mut out = Vec::new();
    file.take(bytes).read_to_end(&mut out)?;
    Ok(out)
}
