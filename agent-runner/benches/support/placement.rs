//! Where a benchmark's processes run: the measured processes (the runner, the floor) on one
//! CPU, the host that inserts and times on another; `RUNNER_BENCH_PIN=0` leaves them to the
//! scheduler.
//!
//! Why: the host wakes after every write to the DB's files. Left to the scheduler on a 2-CPU
//! machine, it often runs on the CPU of the process it measures, between that process's own
//! WAL writes, and a process that writes more pages is interrupted more often
//! (`docs/decisions/perf.md#D-PERF-16`). Pinned, each side has a CPU of its
//! own and the ratio compares the two processes' work alone.

use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// The CPUs this thread may run on, in order; empty when they cannot be read.
fn allowed() -> Vec<usize> {
    let Ok(set) = sched_getaffinity(Pid::from_raw(0)) else {
        return Vec::new();
    };
    (0..CpuSet::count())
        .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
        .collect()
}

/// Restricts the calling thread to `cpus` (a child started after inherits it).
fn restrict(cpus: &[usize]) -> std::io::Result<()> {
    let mut set = CpuSet::new();
    for &cpu in cpus {
        set.set(cpu)?;
    }
    sched_setaffinity(Pid::from_raw(0), &set)?;
    Ok(())
}

/// The measured processes' CPU and the host's, when this process may use two CPUs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placement {
    /// The CPU of the measured processes.
    pub(crate) measured: usize,
    /// The CPU of the host.
    pub(crate) host: usize,
}

impl Placement {
    /// `Ok(None)` with `RUNNER_BENCH_PIN=0`; `Err` with the reason when pinning is not possible.
    pub(crate) fn from_env() -> Result<Option<Placement>, String> {
        if super::knob("RUNNER_BENCH_PIN", 1) == 0 {
            return Ok(None);
        }
        match allowed()[..] {
            [measured, host, ..] => Ok(Some(Placement { measured, host })),
            _ => Err("fewer than two CPUs are allowed to this process".to_owned()),
        }
    }

    /// Makes `command`'s process start on the measured processes' CPU.
    pub(crate) fn measured(self, command: &mut Command) {
        let cpu = self.measured;
        // SAFETY: the closure runs between fork and exec; it fills a set on the stack and makes
        // one system call, allocating nothing.
        unsafe {
            command.pre_exec(move || restrict(&[cpu]));
        }
    }

    /// Runs `f` on the host's CPU, then lets this thread run anywhere it could before.
    pub(crate) fn as_host<T>(self, f: impl FnOnce() -> T) -> T {
        let before = allowed();
        if let Err(err) = restrict(&[self.host]) {
            println!("(cannot move the host to CPU {}: {err})", self.host);
        }
        let out = f();
        if !before.is_empty() {
            let _ = restrict(&before);
        }
        out
    }
}
