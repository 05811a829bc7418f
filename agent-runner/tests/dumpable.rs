//! The runner is non-dumpable (issue 10, point 4): a process of the same user, without
//! CAP_SYS_PTRACE, cannot read its `/proc/<pid>/environ`, where the host's secrets are. As
//! root (these tests usually run as root, and root reads any environ) the runner and the reader
//! run as `nobody`; otherwise both run as the current user. A dumpable process of that user with
//! the same environment (`sleep`) is the control: its environ is readable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[path = "support/binary.rs"]
mod binary;

const MARKER: &str = "host-secret-dumpable-6615";

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

/// `cat /proc/<pid>/environ` as the agent's user: (succeeded, output).
fn read_environ_as_agent(pid: u32) -> (bool, String) {
    let out = as_agent(Command::new("cat").arg(format!("/proc/{pid}/environ")))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
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
    let runner = as_agent(
        binary::mock_runner(dir.path(), &log)
            .env("NANOCLAW_CREATE_DB", "true")
            .env("MY_SECRET", MARKER),
    )
    .spawn()
    .unwrap();
    let pid = runner.id();
    binary::wait_until("the runner to start", Duration::from_secs(20), || {
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
    let (control_ok, control_env) = read_environ_as_agent(control.id());
    stop(control);
    assert!(
        control_ok && control_env.contains(MARKER),
        "the control (a dumpable process of the same user) is readable: {control_env:?}"
    );
    let (ok, env) = read_environ_as_agent(pid);
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    stop(runner);
    assert!(
        !ok && !env.contains(MARKER),
        "a process of the runner's own user read its environment: {env:?}\n{log_text}"
    );
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
    let server = as_agent(
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
    binary::wait_until("mcp-tools to serve", Duration::from_secs(20), || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("serving MCP on stdio")
    });
    let (ok, env) = read_environ_as_agent(server.id());
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    stop(server);
    assert!(
        !ok && !env.contains(MARKER),
        "a process of mcp-tools' own user read its environment: {env:?}\n{log_text}"
    );
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
    let runner = binary::mock_runner(dir.path(), &log)
        .env("NANOCLAW_CREATE_DB", "true")
        .env("NANOCLAW_RUN_AS", "65534:65534")
        .env("ANTHROPIC_API_KEY_FILE", &key)
        .env("MY_SECRET", MARKER)
        .spawn()
        .unwrap();
    let pid = runner.id();
    binary::wait_until("the runner to start", Duration::from_secs(20), || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("agent-runner starting")
    });
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let (ok, env) = read_environ_as_agent(pid);
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
    assert!(!ok && !env.contains(MARKER), "{env:?}");

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
