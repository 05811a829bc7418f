//! Process hygiene of every CLI and script the runner starts: each CLI runs in its own process group with a
//! parent-death signal, from a cleared, allow-listed environment, and is stopped as a group
//! (TERM, a grace period, then KILL even if the leader already exited, since members outlive it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

/// A CLI could not be found or started; the message names the setting to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SpawnError(pub String);

/// Environment variables a CLI may inherit from the runner. Everything else is dropped, then
/// scrub patterns remove secrets even from this list.
pub(crate) const ENV_ALLOW_LIST: &[&str] = &[
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TZ",
    "TERM",
    "USER",
    "LOGNAME",
    "SHELL",
    "TMPDIR",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
];

/// Default patterns of host secrets that never reach a CLI (`*` matches any run of characters).
pub(crate) const DEFAULT_SCRUB_PATTERNS: &[&str] = &[
    "*_TOKEN",
    "*_SECRET",
    "*_SECRET_*",
    "*_PASSWORD",
    "DATABASE_URL",
    "*_DATABASE_URL",
    "*_PRIVATE_KEY",
];

/// Which variables pass into a CLI's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvPolicy {
    /// Extra variable names to pass through besides [`ENV_ALLOW_LIST`].
    pub passthrough: Vec<String>,
    /// Patterns removed from the result (case-sensitive, `*` wildcards).
    pub scrub_patterns: Vec<String>,
}

impl Default for EnvPolicy {
    fn default() -> Self {
        Self {
            passthrough: Vec::new(),
            scrub_patterns: DEFAULT_SCRUB_PATTERNS
                .iter()
                .map(|p| (*p).to_owned())
                .collect(),
        }
    }
}

impl EnvPolicy {
    /// True when `name` matches a scrub pattern.
    pub fn is_scrubbed(&self, name: &str) -> bool {
        self.scrub_patterns
            .iter()
            .any(|pattern| glob_match(pattern, name))
    }

    /// The inherited part of a CLI environment: allow-listed and passthrough variables from
    /// `parent`, minus scrubbed names. The provider adds its own variables (HOME, its API key)
    /// afterwards, on purpose, with [`CliCommand::env`].
    pub fn inherited(
        &self,
        parent: impl IntoIterator<Item = (String, String)>,
    ) -> BTreeMap<String, String> {
        parent
            .into_iter()
            .filter(|(name, _)| {
                ENV_ALLOW_LIST.contains(&name.as_str())
                    || self.passthrough.iter().any(|p| p == name)
            })
            .filter(|(name, _)| !self.is_scrubbed(name))
            .collect()
    }
}

/// Matches `name` against `pattern`, where `*` matches any run of characters.
pub(crate) fn glob_match(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some((b'*', rest)) => (0..=n.len()).any(|skip| go(rest, &n[skip..])),
            Some((c, rest)) => n
                .split_first()
                .is_some_and(|(d, n_rest)| c == d && go(rest, n_rest)),
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

/// A CLI invocation: program, arguments, the complete environment, and the working directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliCommand {
    /// Resolved executable.
    pub program: PathBuf,
    /// Arguments.
    pub args: Vec<String>,
    /// The whole environment (the child gets nothing else).
    pub env: BTreeMap<String, String>,
    /// Working directory.
    pub cwd: PathBuf,
}

impl CliCommand {
    /// Starts a command description.
    pub fn new(program: impl Into<PathBuf>, cwd: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: cwd.into(),
        }
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets one variable.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Sets many variables.
    pub fn envs(mut self, vars: BTreeMap<String, String>) -> Self {
        self.env.extend(vars);
        self
    }
}

/// A running CLI in its own process group.
#[derive(Debug)]
pub struct CliProcess {
    child: Child,
    pgid: Pid,
    /// The CLI's stdin (piped).
    pub stdin: Option<ChildStdin>,
    /// The CLI's stdout (piped).
    pub stdout: Option<ChildStdout>,
    /// The CLI's stderr (piped).
    pub stderr: Option<ChildStderr>,
}

impl CliProcess {
    /// Spawns `command` with piped stdio in a new process group. The child gets SIGKILL if the
    /// runner dies (`PR_SET_PDEATHSIG`; the race with an already-dead parent is closed by
    /// checking `getppid()`). Call from an async task, never from `spawn_blocking`: the
    /// parent-death signal fires when the spawning thread exits.
    pub fn spawn(command: &CliCommand) -> Result<Self, SpawnError> {
        let mut cmd = Command::new(&command.program);
        cmd.args(&command.args)
            .env_clear()
            .envs(&command.env)
            .current_dir(&command.cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        // The session's marker: the next run finds what this one left behind by it.
        if let Some(mark) = crate::reaper::session_mark() {
            cmd.env(crate::reaper::MARK_VAR, mark);
        }
        let parent = std::process::id();
        // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
        // calls (prctl, getppid, _exit).
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
                if nix::unistd::getppid().as_raw() as u32 != parent {
                    nix::libc::_exit(1);
                }
                Ok(())
            });
        }
        // Registered before the orphan reaper can see it: its exit status is ours.
        let mut child = crate::reaper::spawn_owned(|| cmd.spawn(), Child::id).map_err(|err| {
            SpawnError(format!("cannot start {}: {err}", command.program.display()))
        })?;
        let pid = child
            .id()
            .ok_or_else(|| SpawnError("the CLI exited at once".into()))?;
        let pgid = Pid::from_raw(pid as i32);
        Ok(Self {
            stdin: child.stdin.take(),
            stdout: child.stdout.take(),
            stderr: child.stderr.take(),
            child,
            pgid,
        })
    }

    /// The leader's pid (also the process group id).
    pub fn pid(&self) -> u32 {
        self.pgid.as_raw() as u32
    }

    /// Exit status if the leader has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits for the leader to exit.
    pub async fn wait(&mut self) -> Option<ExitStatus> {
        self.child.wait().await.ok()
    }

    /// Stops the whole group: TERM, up to `grace` for the leader to exit, then KILL to the group
    /// regardless, and reaps the leader. Descendants that moved to a process group or session of
    /// their own (Codex starts MCP servers that way, OpenCode and Claude run shell commands so)
    /// are not reached by the group signals: they are collected before the TERM and killed
    /// afterwards if they are still the same processes.
    pub async fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        let escaped = crate::reaper::descendants(self.pid());
        self.stdin.take();
        let _ = killpg(self.pgid, Signal::SIGTERM);
        let status = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => None,
        };
        let _ = killpg(self.pgid, Signal::SIGKILL);
        for (pid, started) in escaped {
            // Same start time: not a recycled pid.
            if crate::reaper::stat(pid).map(|s| s.started) == Some(started) {
                tracing::debug!(pid, "killing a leftover CLI descendant outside its group");
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        match status {
            Some(status) => Some(status),
            None => self.child.wait().await.ok(),
        }
    }
}

impl Drop for CliProcess {
    fn drop(&mut self) {
        // Group members outlive their leader; kill_on_drop only reaches the leader.
        let _ = killpg(self.pgid, Signal::SIGKILL);
    }
}

/// Finds a CLI: the explicit setting (which must exist; a bare name without `/` is looked up in
/// `PATH`, as the runner's config documents), else `PATH`, else the project-local folder
/// `.cli/node_modules/.bin` found upward from the runner's executable or `local_dir`. The error
/// names the setting to fix.
pub fn resolve_cli(
    name: &str,
    explicit: Option<&Path>,
    setting: &str,
    local_dir: Option<&Path>,
) -> Result<PathBuf, SpawnError> {
    if let Some(path) = explicit {
        let text = path.as_os_str().as_encoded_bytes();
        let bare = !text.is_empty() && !text.contains(&b'/');
        if bare {
            return on_path(path).ok_or_else(|| {
                SpawnError(format!(
                    "{setting}={} is not on PATH; fix {setting} (a path, or a command name on \
                     PATH) or install the {name} CLI",
                    path.display()
                ))
            });
        }
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(SpawnError(format!(
                "{setting}={} does not name an executable file; fix {setting} or install the {name} CLI",
                path.display()
            )))
        };
    }
    if let Some(found) = on_path(Path::new(name)) {
        return Ok(found);
    }
    let mut roots: Vec<PathBuf> = local_dir.map(Path::to_path_buf).into_iter().collect();
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    for root in roots {
        let candidate = root.join(".cli/node_modules/.bin").join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(SpawnError(format!(
        "the {name} CLI was not found on PATH or in .cli/node_modules/.bin; set {setting} to its path \
         (or run scripts/install-clis.sh)"
    )))
}

/// The file `name` in the first folder of `PATH` that has one.
fn on_path(name: &Path) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*_TOKEN", "GITHUB_TOKEN"));
        assert!(!glob_match("*_TOKEN", "GITHUB_TOKENS"));
        assert!(glob_match("DATABASE_URL", "DATABASE_URL"));
        assert!(glob_match("*_SECRET_*", "AWS_SECRET_ACCESS_KEY"));
        assert!(!glob_match("*_SECRET", "SECRETARY"));
    }

    #[test]
    fn inherited_env_is_allow_listed_and_scrubbed() {
        let policy = EnvPolicy {
            passthrough: vec!["MY_TOKEN".into(), "EXTRA".into()],
            ..Default::default()
        };
        let env = policy.inherited([
            ("PATH".to_owned(), "/bin".to_owned()),
            ("HOME".to_owned(), "/root".to_owned()),
            ("GITHUB_TOKEN".to_owned(), "x".to_owned()),
            ("MY_TOKEN".to_owned(), "y".to_owned()),
            ("EXTRA".to_owned(), "z".to_owned()),
        ]);
        assert_eq!(env.keys().collect::<Vec<_>>(), vec!["EXTRA", "PATH"]);
    }

    #[tokio::test]
    async fn terminate_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        let script = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
        let command = CliCommand::new("/bin/sh", dir.path())
            .args(["-c", script.as_str()])
            .env("PATH", "/usr/bin:/bin");
        let mut process = CliProcess::spawn(&command).unwrap();
        let mut grandchild = None;
        for _ in 0..100 {
            if let Ok(text) = std::fs::read_to_string(&pidfile) {
                if let Ok(pid) = text.trim().parse::<i32>() {
                    grandchild = Some(pid);
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let grandchild = grandchild.unwrap();
        process.terminate(Duration::from_millis(500)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The grandchild is gone (or a zombie awaiting its reaper, which no longer runs it).
        let stat = std::fs::read_to_string(format!("/proc/{grandchild}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "grandchild still running: {stat}"
        );
    }

    #[tokio::test]
    async fn terminate_kills_descendants_that_left_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("escaped.pid");
        let script = format!("setsid sleep 60 & echo $! > {}; wait", pidfile.display());
        let command = CliCommand::new("/bin/sh", dir.path())
            .args(["-c", script.as_str()])
            .env("PATH", "/usr/bin:/bin");
        let mut process = CliProcess::spawn(&command).unwrap();
        let mut escaped = None;
        for _ in 0..100 {
            if let Ok(text) = std::fs::read_to_string(&pidfile) {
                if let Ok(pid) = text.trim().parse::<i32>() {
                    escaped = Some(pid);
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let escaped = escaped.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let group = nix::unistd::getpgid(Some(Pid::from_raw(escaped))).unwrap();
        assert_ne!(
            group.as_raw() as u32,
            process.pid(),
            "the test process did not leave the group"
        );
        process.terminate(Duration::from_millis(500)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stat = std::fs::read_to_string(format!("/proc/{escaped}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "escaped descendant still running: {stat}"
        );
    }

    #[test]
    fn missing_cli_names_the_setting() {
        let err = resolve_cli(
            "claude",
            Some(Path::new("/nonexistent/claude")),
            "CLAUDE_PATH",
            None,
        )
        .unwrap_err();
        assert!(err.to_string().contains("CLAUDE_PATH"), "{err}");
        // A bare name is a command on PATH (the runner makes every other path absolute).
        let sh = resolve_cli("claude", Some(Path::new("sh")), "CLAUDE_PATH", None).unwrap();
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
        let err = resolve_cli(
            "claude",
            Some(Path::new("no-such-cli-x")),
            "CLAUDE_PATH",
            None,
        )
        .unwrap_err();
        assert!(err.to_string().contains("is not on PATH"), "{err}");
    }
}
