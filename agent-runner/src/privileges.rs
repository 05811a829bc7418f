//! What the agent's user can read of the runner. The agent's tools run as the same user as the
//! runner (or as the user the runner drops to), so:
//!
//! * the runner makes itself non-dumpable ([`make_non_dumpable`], first thing in `main`): its
//!   `/proc/<pid>/environ`, `mem` and `fd` (which hold the host's secrets and the model key) are
//!   closed to that user, and it cannot be ptraced by it;
//! * a runner started as root with `runAs` set reads its configuration and secret files first,
//!   then drops to that user ([`drop_privileges`]) before it opens the DB or starts anything, so
//!   secret files can stay readable by root only.

use std::path::Path;

use nix::unistd::{AccessFlags, Gid, Group, Uid, User};

/// A failure to close the process to the agent, or to become the `runAs` user.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    /// `prctl(PR_SET_DUMPABLE, 0)` failed.
    #[error(
        "cannot make the process non-dumpable (prctl PR_SET_DUMPABLE): {0}; refusing to run where \
         the agent could read this process's environment and memory (allow prctl in the \
         container's seccomp profile)"
    )]
    Dumpable(nix::Error),
    /// `runAs` is not a user name, a uid or `uid:gid`.
    #[error(
        "runAs {0:?}: expected a user name, a uid, or uid:gid (e.g. agent, 1000 or 1000:1000)"
    )]
    BadSpec(String),
    /// `runAs` names a user that does not exist.
    #[error(
        "runAs {spec:?}: no such {what} in /etc/passwd or /etc/group; name one that exists in the \
         image, or give numeric ids (uid:gid)"
    )]
    Unknown {
        /// The setting as given.
        spec: String,
        /// "user" or "group".
        what: &'static str,
    },
    /// `runAs` names root.
    #[error(
        "runAs {0:?} is root: the agent's tools would run as root and could read every secret \
         file; name an unprivileged user (the image's is `agent`)"
    )]
    Root(String),
    /// A step of the drop failed.
    #[error(
        "dropping privileges to {uid}:{gid} failed at {step}: {err}; the runner needs CAP_SETUID \
         and CAP_SETGID for this (Kubernetes: add them to the container's capabilities), or start \
         it as the target user and unset runAs"
    )]
    Drop {
        /// Target uid.
        uid: u32,
        /// Target gid.
        gid: u32,
        /// `setgroups`, `setresgid` or `setresuid`.
        step: &'static str,
        /// The system error.
        err: nix::Error,
    },
    /// After the drop, root could still be regained.
    #[error("after dropping to {uid}:{gid} the process could become root again; refusing to run")]
    StillPrivileged {
        /// Target uid.
        uid: u32,
        /// Target gid.
        gid: u32,
    },
}

/// Makes this process non-dumpable: `/proc/<pid>/environ`, `mem`, `fd` become root's, and only
/// a process with CAP_SYS_PTRACE can read them or attach. Children get it back at `execve`, so
/// the CLI and the agent's tools are unaffected (their environment is the scrubbed one).
pub fn make_non_dumpable() -> Result<(), PrivilegeError> {
    nix::sys::prctl::set_dumpable(false).map_err(PrivilegeError::Dumpable)
}

/// The user the runner drops to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
}

/// Parses `runAs`: a user name (its primary group), a uid (the passwd entry's group, else the
/// same number), or `user:group` where each side is a name or a number.
pub fn resolve(spec: &str) -> Result<Target, PrivilegeError> {
    let spec_owned = || spec.to_owned();
    let (user, group) = match spec.split_once(':') {
        Some((user, group)) => (user.trim(), Some(group.trim())),
        None => (spec.trim(), None),
    };
    if user.is_empty() || group.is_some_and(str::is_empty) {
        return Err(PrivilegeError::BadSpec(spec_owned()));
    }
    let unknown = |what| PrivilegeError::Unknown {
        spec: spec_owned(),
        what,
    };
    let (uid, passwd_gid) = match user.parse::<u32>() {
        Ok(uid) => {
            let entry = User::from_uid(Uid::from_raw(uid)).ok().flatten();
            (uid, entry.map(|u| u.gid.as_raw()))
        }
        Err(_) => match User::from_name(user) {
            Ok(Some(entry)) => (entry.uid.as_raw(), Some(entry.gid.as_raw())),
            _ => return Err(unknown("user")),
        },
    };
    let gid = match group {
        None => passwd_gid.unwrap_or(uid),
        Some(group) => match group.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => match Group::from_name(group) {
                Ok(Some(entry)) => entry.gid.as_raw(),
                _ => return Err(unknown("group")),
            },
        },
    };
    if uid == 0 || gid == 0 {
        return Err(PrivilegeError::Root(spec_owned()));
    }
    Ok(Target { uid, gid })
}

/// What [`drop_privileges`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Started as root, now the target user.
    Dropped(Target),
    /// Already running as the target user (e.g. Kubernetes' `runAsUser`): nothing to do.
    AlreadyTarget(Target),
    /// Not root and not the target user: cannot switch; runs as it is (warned).
    CannotSwitch {
        /// The configured target.
        target: Target,
        /// The uid the runner runs as.
        current: u32,
    },
    /// No `runAs` configured.
    NotConfigured {
        /// True when the runner runs as root (warned: the agent is root too).
        root: bool,
    },
}

/// Drops to `run_as` when started as root: `setgroups([])`, `setresgid`, `setresuid` (all three
/// ids, so root cannot be regained), then non-dumpable again (a uid change resets the flag to
/// the `fs.suid_dumpable` sysctl). Call it after the configuration and the secret files are read
/// and before anything is opened or started. Logs what it did, and warns when `workspace` is not
/// writable by the new user (the DB could not be opened).
pub fn drop_privileges(run_as: Option<&str>, workspace: &Path) -> Result<Outcome, PrivilegeError> {
    drop_privileges_logged(run_as, workspace, Announce::Info)
}

/// How [`drop_privileges_logged`] reports a successful drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Announce {
    /// An INFO line: the runner's start, once.
    Info,
    /// A DEBUG line: a command run again and again (`agent-runner health`, the image's
    /// HEALTHCHECK every 30 s), whose drop is no news (issue 43, D10).
    Debug,
}

/// [`drop_privileges`], with the level of the line that reports the drop.
pub fn drop_privileges_logged(
    run_as: Option<&str>,
    workspace: &Path,
    announce: Announce,
) -> Result<Outcome, PrivilegeError> {
    let euid = Uid::effective().as_raw();
    let Some(spec) = run_as.map(str::trim).filter(|s| !s.is_empty()) else {
        if euid == 0 {
            tracing::warn!(
                "running as root with no runAs: the agent's tools run as root and can read every \
                 file and process here; set NANOCLAW_RUN_AS=<user or uid:gid> to drop to an \
                 unprivileged user after the secrets are read"
            );
        }
        return Ok(Outcome::NotConfigured { root: euid == 0 });
    };
    let target = resolve(spec)?;
    if euid != 0 {
        if euid == target.uid {
            tracing::info!(
                uid = target.uid,
                "runAs: already running as the target user"
            );
            return Ok(Outcome::AlreadyTarget(target));
        }
        tracing::warn!(
            run_as = spec,
            uid = euid,
            "runAs ignored: the runner was not started as root, so it cannot switch users and the \
             agent runs as uid {euid} too; secret files this uid can read are readable by the \
             agent. Start the runner as root to drop to {spec}, or unset runAs",
        );
        return Ok(Outcome::CannotSwitch {
            target,
            current: euid,
        });
    }
    let (uid, gid) = (Uid::from_raw(target.uid), Gid::from_raw(target.gid));
    let failed = |step: &'static str| {
        move |err| PrivilegeError::Drop {
            uid: target.uid,
            gid: target.gid,
            step,
            err,
        }
    };
    nix::unistd::setgroups(&[]).map_err(failed("setgroups"))?;
    nix::unistd::setresgid(gid, gid, gid).map_err(failed("setresgid"))?;
    nix::unistd::setresuid(uid, uid, uid).map_err(failed("setresuid"))?;
    make_non_dumpable()?;
    if nix::unistd::setuid(Uid::from_raw(0)).is_ok() || Uid::effective().is_root() {
        return Err(PrivilegeError::StillPrivileged {
            uid: target.uid,
            gid: target.gid,
        });
    }
    if announce == Announce::Info {
        tracing::info!(
            uid = target.uid,
            gid = target.gid,
            run_as = spec,
            "dropped root privileges (configuration and secret files already read)"
        );
    } else {
        tracing::debug!(
            uid = target.uid,
            gid = target.gid,
            run_as = spec,
            "dropped root privileges"
        );
    }
    if nix::unistd::access(workspace, AccessFlags::W_OK).is_err() {
        tracing::warn!(
            workspace = %workspace.display(),
            "the workspace is not writable by {}:{} (runAs): the session DB and the CLIs' homes \
             live there; give it to that user (chown -R {}:{} {})",
            target.uid,
            target.gid,
            target.uid,
            target.gid,
            workspace.display()
        );
    }
    Ok(Outcome::Dropped(target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_accepts_names_uids_and_pairs_and_refuses_root() {
        assert_eq!(
            resolve("1234:5678").unwrap(),
            Target {
                uid: 1234,
                gid: 5678
            }
        );
        // A uid without a passwd entry: its own number as the group.
        assert_eq!(
            resolve("54321").unwrap(),
            Target {
                uid: 54321,
                gid: 54321
            }
        );
        let nobody = User::from_name("nobody").unwrap().unwrap();
        assert_eq!(
            resolve("nobody").unwrap(),
            Target {
                uid: nobody.uid.as_raw(),
                gid: nobody.gid.as_raw()
            }
        );
        for root in ["root", "0", "0:0", "1000:0"] {
            let err = resolve(root).unwrap_err().to_string();
            assert!(err.contains("is root"), "{root}: {err}");
        }
        let err = resolve("no-such-user-x").unwrap_err().to_string();
        assert!(
            err.contains("no-such-user-x") && err.contains("uid:gid"),
            "{err}"
        );
        assert!(matches!(resolve("1000:"), Err(PrivilegeError::BadSpec(_))));
    }
}
