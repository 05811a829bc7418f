//! The runner is non-dumpable (issue 10, point 4): a process of the same user, without
//! CAP_SYS_PTRACE, cannot read its `/proc/<pid>/environ`, where the host's secrets are. As
//! root (these tests usually run as root, and root reads any environ) the runner and the reader
//! run as `nobody`; otherwise both run as the current user. A dumpable process of that user with
//! the same environment (`sleep`) is the control: its environ is readable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::binary;

const MARKER: &str = "host-secret-dumpable-6615";
/// How long a process may take to start: a debug build beside the whole suite on 2 cores.
const START_BOUND: Duration = Duration::from_secs(60);

/// The uid:gid the processes run as: nobody when root, else ourselves.
fn ids() -> (u32, u32) {
    if nix::unistd::Uid::effective().is_root() {
        (65534, 65534)
    } else {
        (
            nix::unistd::Uid::current().as_raw(),
            nix::unistd::Gid::current().as_raw(),
        )
    }
}

fn as_agent(cmd: &mut Command) -> &mut Command {
    let (uid, gid) = ids();
    if nix::unistd::Uid::effective().is_root() {
        cmd.uid(uid).gid(gid);
    }
    cmd
}

/// What `cat /proc/<pid>/environ`, run as the agent's user, got.
#[derive(Debug)]
struct EnvironRead {
    /// cat exited 0.
    ok: bool,
    /// What it printed.
    env: String,
    /// Its error, e.g. `Permission denied` from the kernel.
    error: String,
}

/// `cat /proc/<pid>/environ` as the agent's user.
fn read_environ_as_agent(pid: u32) -> EnvironRead {
    let out = as_agent(Command::new("cat").arg(format!("/proc/{pid}/environ")))
        .output()
        .unwrap();
    EnvironRead {
        ok: out.status.success(),
        env: String::from_utf8_lossy(&out.stdout).into_owned(),
        error: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Whether `child` is still running (neither exited nor a zombie). A process that has exited
/// has no memory any more, and the kernel then lets anyone open its `environ` (empty): a read
/// of a dead process says nothing about the live one, so the checks below fail on it by name.
fn running(child: &mut Child) -> Result<(), String> {
    if let Some(status) = child.try_wait().unwrap() {
        return Err(format!("it exited ({status})"));
    }
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap_or_default();
    match stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
    {
        Some("Z") | Some("X") | None => Err(format!("it is no longer running ({stat:?})")),
        Some(_) => Ok(()),
    }
}

/// Reads `child`'s environ as the agent's user and asserts the kernel refused it while `child`
/// was running before and after the read (so the refusal is the live process's).
fn assert_environ_closed(child: &mut Child, what: &str, log: &Path) {
    let before = running(child);
    let read = read_environ_as_agent(child.id());
    let after = running(child);
    let log_text = std::fs::read_to_string(log).unwrap_or_default();
    if let Err(why) = before.and(after) {
        panic!("{what}: {why}, so its environment could not be checked\n{log_text}");
    }
    assert!(
        !read.ok && !read.env.contains(MARKER) && read.error.contains("Permission denied"),
        "a process of {what}'s own user read its environment: {read:?}\n{log_text}"
    );
}

/// `program` placed in `dir` (owned by the agent's user) for the agent's user to run: a hard
/// link, else a copy. The checkout may sit in a folder that user cannot search (a `mktemp -d`
/// clone is mode 0700), and exec needs every folder on the path searchable; the test must not
/// depend on where the checkout is.
fn runnable_by_agent(program: &Path, dir: &Path) -> PathBuf {
    let placed = dir.join(program.file_name().unwrap());
    if std::fs::hard_link(program, &placed).is_err() {
        std::fs::copy(program, &placed).unwrap();
    }
    placed
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn the_runners_environment_is_closed_to_a_process_of_its_own_user() {
    let dir = tempfile::tempdir().unwrap();
    let (uid, gid) = ids();
    std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
    let log = dir.path().join("runner.log");
    let program = runnable_by_agent(Path::new(env!("CARGO_BIN_EXE_agent-runner")), dir.path());
    let mut runner = as_agent(
        binary::runner_at(&program, dir.path(), &log)
            .env("NANOCLAW_CREATE_DB", "true")
            .env("MY_SECRET", MARKER),
    )
    .spawn()
    .unwrap();
    binary::wait_until("the runner to start", START_BOUND, || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("agent-runner starting")
    });
    let control = as_agent(
        Command::new("sleep")
            .arg("30")
            .env("MY_SECRET", MARKER)
            .stdout(Stdio::null()),
    )
    .spawn()
    .unwrap();
    let control_read = read_environ_as_agent(control.id());
    stop(control);
    assert!(
        control_read.ok && control_read.env.contains(MARKER),
        "the control (a dumpable process of the same user) is readable: {control_read:?}"
    );
    assert_environ_closed(&mut runner, "the runner", &log);
    stop(runner);
}

#[test]
fn mcp_tools_environment_is_closed_to_a_process_of_its_own_user() {
    let mcp_tools = Path::new(env!("CARGO_BIN_EXE_agent-runner")).with_file_name("mcp-tools");
    if !mcp_tools.exists() {
        // Built with the workspace (`cargo build --workspace --bins`); say so rather than pass.
        panic!(
            "{} is missing: run `cargo build --workspace --bins` first",
            mcp_tools.display()
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let (uid, gid) = ids();
    std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
    let log = dir.path().join("mcp.log");
    let mcp_tools = runnable_by_agent(&mcp_tools, dir.path());
    let mut server = as_agent(
        Command::new(&mcp_tools)
            .arg("--db")
            .arg(dir.path().join("session.db"))
            .arg("--workspace")
            .arg(dir.path())
            .env("MY_SECRET", MARKER)
            .env("RUST_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap()),
    )
    .spawn()
    .unwrap();
    binary::wait_until("mcp-tools to serve", START_BOUND, || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("serving MCP on stdio")
    });
    assert_environ_closed(&mut server, "mcp-tools", &log);
    stop(server);
}

/// Started as root with `NANOCLAW_RUN_AS`: the runner reads a root-only key file
/// (`ANTHROPIC_API_KEY_FILE`), then runs as the target uid with no supplementary groups, still
/// closed to that uid. Both `ANTHROPIC_API_KEY` and its `_FILE` set: it refuses to start.
#[test]
fn a_root_runner_reads_a_root_only_key_file_then_drops_to_run_as() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("not root: the privilege drop needs root; skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let key = secrets.path().join("anthropic");
    std::fs::write(&key, "sk-ant-root-only-4242\n").unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o400)).unwrap();
    let log = dir.path().join("runner.log");
    let mut runner = binary::mock_runner(dir.path(), &log)
        .env("NANOCLAW_CREATE_DB", "true")
        .env("NANOCLAW_RUN_AS", "65534:65534")
        .env("ANTHROPIC_API_KEY_FILE", &key)
        .env("MY_SECRET", MARKER)
        .spawn()
        .unwrap();
    let pid = runner.id();
    binary::wait_until("the runner to start", START_BOUND, || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("agent-runner starting")
    });
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert_environ_closed(&mut runner, "the runner run as 65534", &log);
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    stop(runner);
    let ids = |prefix: &str| -> Vec<String> {
        status
            .lines()
            .find(|l| l.starts_with(prefix))
            .map(|l| l.split_whitespace().skip(1).map(str::to_owned).collect())
            .unwrap_or_default()
    };
    assert_eq!(ids("Uid:"), ["65534"; 4], "{status}\n{log_text}");
    assert_eq!(ids("Gid:"), ["65534"; 4], "{status}");
    assert!(ids("Groups:").is_empty(), "{status}");
    assert!(
        log_text.contains("dropped root privileges"),
        "the drop is logged: {log_text}"
    );

    // The key from the file, shown masked with its source.
    let out = binary::mock_runner(dir.path(), &log)
        .arg("config")
        .env("ANTHROPIC_API_KEY_FILE", &key)
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("anthropicApiKey = sk-a…**** (21 chars)  [file from ANTHROPIC_API_KEY_FILE]"),
        "{text}"
    );
    let both = binary::mock_runner(dir.path(), &log)
        .arg("config")
        .env("ANTHROPIC_API_KEY_FILE", &key)
        .env("ANTHROPIC_API_KEY", "sk-direct")
        .output()
        .unwrap();
    assert!(!both.status.success());
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        log_text.contains("both ANTHROPIC_API_KEY and ANTHROPIC_API_KEY_FILE are set"),
        "{log_text}"
    );
}
