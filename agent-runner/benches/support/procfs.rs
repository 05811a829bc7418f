//! What the benchmarks read of a live process in /proc: CPU time and memory.

use std::time::Duration;

/// Linux's USER_HZ: the unit of the CPU times in `/proc/<pid>/stat`.
const TICKS_PER_SEC: f64 = 100.0;

/// CPU time (user + system) a process used so far, all its threads, live or ended; its
/// children's are not included. Resolution 10 ms (one clock tick). Zero once it is gone.
pub(crate) fn cpu_time(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // The command name may hold spaces and parentheses: fields are counted after its last ')'.
    let Some(after_name) = stat.rfind(')').and_then(|at| stat.get(at + 2..)) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let tick = |index: usize| {
        fields
            .get(index)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // Fields 14 (utime) and 15 (stime) of proc(5), counted from 3 after the name.
    Duration::from_secs_f64((tick(11) + tick(12)) as f64 / TICKS_PER_SEC)
}

/// A `kB` line of `/proc/<pid>/status` (e.g. `VmRSS:`, `VmHWM:`) in bytes; 0 when absent.
pub(crate) fn status_bytes(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with(key))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Resident memory of a process now (`VmRSS`), in bytes.
pub(crate) fn rss(pid: u32) -> u64 {
    status_bytes(pid, "VmRSS:")
}

/// Proportional set size of a process (`Pss` of `/proc/<pid>/smaps_rollup`), in bytes: shared
/// pages count divided by the number of processes sharing them, so a fleet's PSS adds up.
pub(crate) fn pss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|rollup| {
            rollup
                .lines()
                .find(|line| line.starts_with("Pss:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// On-CPU time per thread of a process (`/proc/<pid>/task/<tid>/schedstat`, nanoseconds).
pub(crate) type ThreadTimes = std::collections::BTreeMap<u32, u64>;

/// Per-thread on-CPU times now, for [`cpu_time_since`]: nanosecond precision, where
/// [`cpu_time`] counts 10 ms ticks (too coarse for an idle process).
pub(crate) fn thread_times(pid: u32) -> ThreadTimes {
    let mut times = ThreadTimes::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return times;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let ns = std::fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()));
        if let Some(ns) = ns {
            times.insert(tid, ns);
        }
    }
    times
}

/// CPU time a process used since `before` (from [`thread_times`]): the growth of each thread
/// seen then, plus the whole time of threads started since. A thread that ended meanwhile is
/// not counted: use it over quiet periods (idle), not where threads come and go.
pub(crate) fn cpu_time_since(pid: u32, before: &ThreadTimes) -> Duration {
    let now = thread_times(pid);
    let ns: u64 = now
        .iter()
        .map(|(tid, ns)| ns.saturating_sub(before.get(tid).copied().unwrap_or(0)))
        .sum();
    Duration::from_nanos(ns)
}
