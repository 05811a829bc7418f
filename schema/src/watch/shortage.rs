//! Why no inotify watch could be had, said once per process with the real limit and how to
//! raise it. `inotify_init` fails with EMFILE both for the per-user instance limit and for the
//! process's own descriptor limit, so the two are told apart by counting open descriptors.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use super::wal_stat::POLL_INTERVAL;

/// What was being set up when inotify failed.
#[derive(Debug, Clone, Copy)]
pub(super) enum Step {
    /// `inotify_init1`: an instance.
    Instance,
    /// `inotify_add_watch`: a watch.
    Watch,
}

/// A per-user inotify limit: the node's sysctl and this user namespace's (the lower applies).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Limit {
    pub(super) node: Option<u64>,
    pub(super) namespace: Option<u64>,
}

/// What the process and the node allow, read when a setup failed.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Limits {
    pub(super) open_fds: Option<u64>,
    pub(super) max_fds: Option<u64>,
    pub(super) instances: Limit,
    pub(super) watches: Limit,
}

impl Limits {
    fn read() -> Self {
        Self {
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|entries| entries.count() as u64),
            max_fds: std::fs::read_to_string("/proc/self/limits")
                .ok()
                .and_then(|text| soft_limit(&text, "Max open files")),
            instances: Limit {
                node: read_number("/proc/sys/fs/inotify/max_user_instances"),
                namespace: read_number("/proc/sys/user/max_inotify_instances"),
            },
            watches: Limit {
                node: read_number("/proc/sys/fs/inotify/max_user_watches"),
                namespace: read_number("/proc/sys/user/max_inotify_watches"),
            },
        }
    }
}

/// Why no inotify watch could be set up.
#[derive(Debug)]
pub(super) enum Shortage {
    /// No inotify instance left for this user (`max_user_instances`).
    Instances(Limit),
    /// No inotify watch left for this user (`max_user_watches`).
    Watches(Limit),
    /// This process is out of file descriptors.
    Descriptors(Option<u64>),
    /// Anything else (a kernel without inotify, a vanished folder, ...).
    Other(io::Error),
}

impl Shortage {
    /// Names the limit behind `err`, reading the current limits.
    pub(super) fn classify(step: Step, err: io::Error) -> Self {
        Self::classify_with(step, err, &Limits::read())
    }

    pub(super) fn classify_with(step: Step, err: io::Error, limits: &Limits) -> Self {
        match (step, err.raw_os_error()) {
            (Step::Instance, Some(libc::EMFILE)) => {
                let out_of_fds = matches!(
                    (limits.open_fds, limits.max_fds),
                    (Some(open), Some(max)) if open + 1 >= max
                );
                if out_of_fds {
                    Self::Descriptors(limits.max_fds)
                } else {
                    Self::Instances(limits.instances)
                }
            }
            (Step::Watch, Some(libc::ENOSPC)) => Self::Watches(limits.watches),
            _ => Self::Other(err),
        }
    }

    /// Logs the shortage and the fallback, the first time in this process (one line for a
    /// node's operator, not one per watcher); later ones go to DEBUG. True when it logged.
    pub(super) fn warn_once(&self) -> bool {
        static WARNED: AtomicBool = AtomicBool::new(false);
        let first = !WARNED.swap(true, Ordering::Relaxed);
        let fallback = format!(
            "checking the WAL file every {} ms instead",
            POLL_INTERVAL.as_millis()
        );
        if first {
            tracing::warn!(reason = %self, "no file notifications for the session DB; {fallback}");
        } else {
            tracing::debug!(reason = %self, "no file notifications for the session DB; {fallback}");
        }
        first
    }
}

impl fmt::Display for Shortage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Instances(limit) => {
                write!(
                    f,
                    "no inotify instance left for this user: fs.inotify.max_user_instances = {} \
                     (each agent-runner takes one, and so does each host watcher and waiting \
                     question){}; raise it on the node, e.g. `sysctl -w \
                     fs.inotify.max_user_instances={}` (persist it in /etc/sysctl.d/)",
                    shown(limit.node),
                    namespace_note(limit, "max_inotify_instances"),
                    suggested(limit, 1024),
                )
            }
            Self::Watches(limit) => write!(
                f,
                "no inotify watch left for this user: fs.inotify.max_user_watches = {} (each \
                 watcher takes two){}; raise it on the node, e.g. `sysctl -w \
                 fs.inotify.max_user_watches={}` (persist it in /etc/sysctl.d/)",
                shown(limit.node),
                namespace_note(limit, "max_inotify_watches"),
                suggested(limit, 524_288),
            ),
            Self::Descriptors(max) => write!(
                f,
                "this process has no file descriptor left for inotify (open files limit {}; \
                 raise `ulimit -n` / the container's nofile limit)",
                shown(*max)
            ),
            Self::Other(err) => write!(f, "inotify is unavailable: {err}"),
        }
    }
}

fn shown(value: Option<u64>) -> String {
    value.map_or_else(|| "unknown".to_owned(), |v| v.to_string())
}

/// Mentions the user namespace's own limit when it is lower than the node's.
fn namespace_note(limit: &Limit, name: &str) -> String {
    match (limit.node, limit.namespace) {
        (Some(node), Some(ns)) if ns < node => {
            format!(", and this user namespace allows {ns} (/proc/sys/user/{name})")
        }
        _ => String::new(),
    }
}

/// A value worth setting: twice what was outgrown, at least `floor`.
fn suggested(limit: &Limit, floor: u64) -> u64 {
    limit.node.map_or(floor, |n| n.saturating_mul(2).max(floor))
}

fn read_number(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The soft limit on the `/proc/<pid>/limits` line starting with `name`.
pub(super) fn soft_limit(limits: &str, name: &str) -> Option<u64> {
    let line = limits.lines().find(|line| line.starts_with(name))?;
    line[name.len()..].split_whitespace().next()?.parse().ok()
}
