//! The image itself (issue 10, point 5), without a container engine: the test lays out a root
//! filesystem as `container/Dockerfile` does (the host's `/usr`, `/etc` and `/dev`; the
//! Dockerfile's passwd entry, `/workspace` folders owned by its user, the binaries where its
//! COPY puts them, the CLIs where npm would link them), and starts the Dockerfile's ENTRYPOINT
//! with its USER, ENV and WORKDIR (parsed from the Dockerfile, so drift is caught) as PID 1 of a
//! fresh PID and mount namespace, chrooted there. Then, through the real Claude CLI (the image's
//! default provider) against the fake model:
//!
//! * the agent's shell finds no host secret and no model key in any `/proc/*/environ` or
//!   `/proc/*/cmdline` it can read (PID 1's included) nor in any file of `/workspace`, its home,
//!   `/home/agent` or `/run/secrets`;
//! * an orphan the agent leaves behind is reaped by PID 1 (no zombie remains);
//! * after SIGTERM to PID 1 the runner exits 0 within 5 s, the session is `stopped`, and nothing
//!   of the namespace remains.
//!
//! Needs root (namespaces, chroot, chown); elsewhere it says so and does nothing.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use e2e::fake_model::{FakeModel, Step};
use e2e::harness::{bin, repo_root, run_in_loopback_netns, FAKE_KEY, FAKE_MODEL};
use e2e::scenarios::{ok, some, WAIT};
use e2e::secrets::{host_secret_markers, parse_search, search_command, HOST_SECRETS};
use schema::{NewMessageIn, SessionDb};
use serde_json::json;

#[path = "../../agent-runner/tests/support/dockerfile.rs"]
mod dockerfile;

/// The Dockerfile's instructions of the runtime (last) stage: (KEYWORD, arguments).
fn runtime_instructions(dockerfile: &str) -> Vec<(String, String)> {
    let mut all = dockerfile::instructions(dockerfile);
    let last_from = all.iter().rposition(|(k, _)| k == "FROM").unwrap_or(0);
    all.split_off(last_from)
}

/// What the test takes from the Dockerfile.
struct Image {
    entrypoint: Vec<String>,
    user: String,
    env: BTreeMap<String, String>,
    workdir: String,
    /// The `useradd` user: (name, uid, gid).
    agent: (String, u32, u32),
    /// Folders `mkdir -p` creates.
    folders: Vec<String>,
    /// Where `COPY --from=build` puts the binaries.
    bin_dir: String,
}

fn flag_value<'a>(words: &[&'a str], flag: &str) -> Option<&'a str> {
    words
        .iter()
        .position(|w| *w == flag)
        .and_then(|i| words.get(i + 1).copied())
}

fn parse_image() -> Image {
    let path = repo_root().join("container/Dockerfile");
    let text = ok(
        std::fs::read_to_string(&path),
        "reading container/Dockerfile",
    );
    let all = runtime_instructions(&text);
    let last = |keyword: &str| {
        all.iter()
            .rev()
            .find(|(k, _)| k == keyword)
            .map(|(_, a)| a.clone())
    };
    let entrypoint: Vec<String> = ok(
        serde_json::from_str(&some(last("ENTRYPOINT"), "an ENTRYPOINT")),
        "ENTRYPOINT in exec (JSON) form",
    );
    let mut env = BTreeMap::new();
    for (_, args) in all.iter().filter(|(k, _)| k == "ENV") {
        for pair in args.split_whitespace() {
            if let Some((k, v)) = pair.split_once('=') {
                env.insert(k.to_owned(), v.trim_matches('"').to_owned());
            }
        }
    }
    let runs: Vec<&String> = all
        .iter()
        .filter(|(k, _)| k == "RUN")
        .map(|(_, a)| a)
        .collect();
    let useradd = some(
        runs.iter()
            .flat_map(|r| r.split("&&"))
            .find(|c| c.trim_start().starts_with("useradd")),
        "a useradd",
    );
    let words: Vec<&str> = useradd.split_whitespace().collect();
    let number = |flag: &str| -> u32 {
        ok(
            some(flag_value(&words, flag), flag).parse::<u32>(),
            "a numeric id",
        )
    };
    let agent = (
        some(words.last().copied(), "the user's name").to_owned(),
        number("--uid"),
        number("--gid"),
    );
    let folders = runs
        .iter()
        .flat_map(|r| r.split("&&"))
        .filter_map(|c| c.trim().strip_prefix("mkdir -p "))
        .flat_map(|c| c.split_whitespace().map(str::to_owned))
        .collect();
    let copy = some(
        all.iter()
            .find(|(k, a)| k == "COPY" && a.starts_with("--from=build"))
            .map(|(_, a)| a.clone()),
        "a COPY --from=build",
    );
    Image {
        entrypoint,
        user: last("USER").unwrap_or_else(|| "root".into()),
        env,
        workdir: last("WORKDIR").unwrap_or_else(|| "/".into()),
        agent,
        folders,
        bin_dir: some(copy.split_whitespace().last(), "COPY's destination").to_owned(),
    }
}

fn chown_tree(path: &Path, uid: u32, gid: u32) {
    e2e::secrets::chown_tree(path, uid, gid);
}

/// The image's root filesystem under `root` (host folders are bind-mounted at start, see
/// [`SETUP`]); the staging folder `stage` holds what is mounted over them.
fn lay_out(image: &Image, root: &Path, stage: &Path, secret: &str) {
    let (name, uid, gid) = &image.agent;
    for dir in [
        "usr",
        "etc",
        "dev",
        "proc",
        "tmp",
        "opt/cli",
        "run/secrets",
        "root",
    ] {
        ok(std::fs::create_dir_all(root.join(dir)), "image folder");
    }
    ok(
        std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777)),
        "chmod /tmp",
    );
    for link in ["bin", "sbin", "lib", "lib64"] {
        if let Ok(target) = std::fs::read_link(Path::new("/").join(link)) {
            ok(
                std::os::unix::fs::symlink(target, root.join(link)),
                "merged-/usr link",
            );
        }
    }
    // The user, as `useradd --create-home` makes it.
    let home = format!("/home/{name}");
    ok(
        std::fs::create_dir_all(root.join(home.trim_start_matches('/'))),
        "home",
    );
    chown_tree(&root.join(home.trim_start_matches('/')), *uid, *gid);
    ok(
        std::fs::write(
            stage.join("passwd"),
            format!(
                "root:x:0:0:root:/root:/bin/bash\n{name}:x:{uid}:{gid}::{home}:/bin/bash\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        "passwd",
    );
    ok(
        std::fs::write(
            stage.join("group"),
            format!("root:x:0:\n{name}:x:{gid}:\nnogroup:x:65534:\n"),
        ),
        "group",
    );
    // `mkdir -p /workspace/...` then `chown -R agent:agent /workspace`.
    for folder in &image.folders {
        ok(
            std::fs::create_dir_all(root.join(folder.trim_start_matches('/'))),
            "workspace folder",
        );
    }
    // COPY --from=build: the binaries in the image's bin dir; the CLIs where npm links them.
    let bin_dir = stage.join("bin");
    ok(std::fs::create_dir_all(&bin_dir), "bin dir");
    for binary in ["agent-runner", "mcp-tools"] {
        ok(
            std::fs::copy(bin(binary), bin_dir.join(binary)),
            "copying a binary",
        );
    }
    for (cli, target) in [
        ("claude", "/opt/cli/node_modules/.bin/claude"),
        ("codex", "/opt/cli/node_modules/.bin/codex"),
        ("opencode", "/opt/cli/node_modules/.bin/opencode"),
    ] {
        ok(
            std::os::unix::fs::symlink(target, bin_dir.join(cli)),
            "CLI link",
        );
    }
    // A key mounted as a root-only file (`-v key:/run/secrets/anthropic:ro`).
    let key = root.join("run/secrets/anthropic");
    ok(std::fs::write(&key, format!("{secret}\n")), "key file");
    ok(
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)),
        "chmod key",
    );
    ok(
        std::fs::set_permissions(
            root.join("run/secrets"),
            std::fs::Permissions::from_mode(0o700),
        ),
        "chmod secrets",
    );
}

/// Runs as PID 1's parent inside `unshare --pid --fork --mount`: mounts the host folders and the
/// staged files into the image root `$1`, mounts /proc of the new PID namespace, then execs the
/// rest (`env -i … chroot …`), so the entrypoint becomes PID 1.
const SETUP: &str = r#"set -e
root="$1"; stage="$2"; cli="$3"; shift 3
mount --make-rprivate /
mount --rbind /usr "$root/usr"
mount --rbind /etc "$root/etc"
mount --rbind /dev "$root/dev"
mount --bind "$stage/bin" "$root/usr/local/bin"
mount --bind "$stage/passwd" "$root/etc/passwd"
mount --bind "$stage/group" "$root/etc/group"
mount --bind "$cli" "$root/opt/cli"
mount -t proc proc "$root/proc"
exec "$@"
"#;

/// The processes of the PID namespace of `pid` (host pids), as (pid, state, command).
fn namespace_processes(pid: u32) -> Vec<(u32, String, String)> {
    let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/pid")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if std::fs::read_link(format!("/proc/{p}/ns/pid"))
            .ok()
            .as_ref()
            != Some(&ns)
        {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("?")
            .to_owned();
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        out.push((p, state, String::from_utf8_lossy(&cmd).replace('\0', " ")));
    }
    out
}

fn wait_for(what: &str, timeout: Duration, log: &Path, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}\n--- entrypoint log ---\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn kill_group(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn the_image_entrypoint_as_pid_1_keeps_secrets_reaps_orphans_and_stops_on_sigterm() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("not root: laying out the image (namespaces, chroot, chown) needs root; skipped");
        return;
    }
    if e2e::harness::provider_cli("claude").is_none()
        || !run_in_loopback_netns(
            "the_image_entrypoint_as_pid_1_keeps_secrets_reaps_orphans_and_stops_on_sigterm",
        )
    {
        return;
    }
    let image = parse_image();
    let (agent_name, agent_uid, agent_gid) = image.agent.clone();
    let root_dir = ok(
        tempfile::Builder::new().prefix("nanoclaw-image-").tempdir(),
        "image root",
    );
    let stage_dir = ok(
        tempfile::Builder::new().prefix("nanoclaw-stage-").tempdir(),
        "stage",
    );
    let (root, stage) = (root_dir.path(), stage_dir.path());
    ok(
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)),
        "chmod root",
    );
    lay_out(&image, root, stage, FAKE_KEY);
    let workspace = root.join(
        image
            .env
            .get("WORKSPACE_DIR")
            .map_or("workspace", |w| w.trim_start_matches('/')),
    );
    // The host creates the session DB (`nanoclaw init`), then the workspace is the agent's.
    let db = ok(SessionDb::open(workspace.join("session.db")), "session DB");
    ok(
        db.set_session_routing(&e2e::harness::test_routing()),
        "routing",
    );
    chown_tree(&workspace, agent_uid, agent_gid);

    // The agent's shell: is PID 1's environ open? leave an orphan that exits (reaped?) and one
    // that lives (gone after SIGTERM?), then search everything readable.
    let command = format!(
        "if cat /proc/1/environ >/dev/null 2>&1; then echo pid1-environ=open; else echo \
         pid1-environ=closed; fi; echo uid=$(id -u); (sh -c 'sleep 0.3' &); (setsid sleep 300 \
         >/dev/null 2>&1 &); {}",
        search_command(&[
            Path::new("/workspace"),
            Path::new("/home"),
            Path::new("/run/secrets")
        ])
    );
    let model = ok(
        FakeModel::start_with_script([
            Step::raw_tool_call(
                "Bash",
                json!({"command": command, "description": "look around", "timeout": 120000}),
            ),
            Step::text("Looked."),
        ]),
        "fake model",
    );

    // docker run -e ...: the model endpoint, the key as a file, and host secrets.
    let mut env = image.env.clone();
    env.entry("PATH".into())
        .or_insert_with(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    env.entry("HOME".into()).or_insert_with(|| "/root".into());
    env.insert("HOSTNAME".into(), "nanoclaw-image-test".into());
    env.insert("ANTHROPIC_BASE_URL".into(), model.url());
    env.insert(
        "ANTHROPIC_API_KEY_FILE".into(),
        "/run/secrets/anthropic".into(),
    );
    env.insert("CLAUDE_MODEL".into(), FAKE_MODEL.into());
    env.insert("NANOCLAW_CLI_MAX_RETRIES".into(), "1".into());
    for (name, value) in HOST_SECRETS {
        env.insert(name.into(), value.into());
    }
    let log = stage.join("entrypoint.log");
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount", "sh", "-c", SETUP, "sh"])
        .arg(root)
        .arg(stage)
        .arg(repo_root().join(".cli"))
        .args(["env", "-i"])
        .args(env.iter().map(|(k, v)| format!("{k}={v}")))
        .arg("chroot");
    // USER: root starts as is; another user would start through chroot's --userspec.
    if !["root", "0", "0:0"].contains(&image.user.as_str()) {
        cmd.arg(format!("--userspec={}", image.user));
    }
    cmd.arg(root)
        .args(["/bin/sh", "-c", "cd \"$1\" && shift && exec \"$@\"", "sh"])
        .arg(&image.workdir)
        .args(&image.entrypoint)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(ok(std::fs::File::create(&log), "log"));
    let mut unshare = ok(cmd.spawn(), "unshare");
    let entrypoint = some(image.entrypoint.first().cloned(), "an entrypoint");
    let mut pid1 = None;
    wait_for(
        "the entrypoint to run as PID 1",
        Duration::from_secs(20),
        &log,
        || {
            pid1 = e2e::harness::descendants(unshare.id())
                .into_iter()
                .find(|(pid, cmd)| {
                    cmd.starts_with(&entrypoint)
                        && std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
                            s.lines()
                                .any(|l| l.starts_with("NSpid:") && l.ends_with("\t1"))
                        })
                })
                .map(|(pid, _)| pid);
            pid1.is_some()
        },
    );
    let pid1 = some(pid1, "PID 1");
    wait_for(
        "the runner to be idle",
        Duration::from_secs(30),
        &log,
        || {
            db.runner_state()
                .ok()
                .flatten()
                .is_some_and(|r| r.status != "starting")
        },
    );
    let status = std::fs::read_to_string(format!("/proc/{pid1}/status")).unwrap_or_default();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or("");
    if image.env.get("NANOCLAW_RUN_AS").map(String::as_str) == Some(agent_name.as_str()) {
        assert!(
            uid_line
                .split_whitespace()
                .skip(1)
                .all(|u| u == agent_uid.to_string()),
            "PID 1 dropped to {agent_name} ({agent_uid}): {uid_line}"
        );
    }

    let mut row = NewMessageIn::new(
        "chat",
        json!({"sender": "Ann", "senderId": "u-ann", "text": "look around"}).to_string(),
    );
    row.routing = e2e::harness::test_routing();
    let id = ok(db.insert_in(&row), "insert").id;
    wait_for("the turn to complete", WAIT, &log, || {
        db.message_in(&id)
            .ok()
            .flatten()
            .is_some_and(|r| r.status == "completed")
    });
    let request = some(model.model_requests().pop(), "a model request");
    let output = request.tool_results().join("\n");
    eprintln!("the agent's shell printed:\n{output}");
    let (hits, own, procs, files) = parse_search(&output);
    assert!(
        own && procs > 0 && files > 0,
        "the search really read files: {output}"
    );
    assert!(
        output.contains(&format!("uid={agent_uid}")),
        "the agent runs as {agent_name}: {output}"
    );
    assert!(
        output.contains("pid1-environ=closed"),
        "PID 1's environment is closed to the agent: {output}"
    );
    for marker in host_secret_markers() {
        assert!(!output.contains(marker), "{marker} is readable: {hits:?}");
    }
    assert!(
        !output.contains(FAKE_KEY),
        "the model key is readable by the agent: {hits:?}"
    );

    // The short-lived orphan exited long ago: PID 1 must have reaped it.
    std::thread::sleep(Duration::from_secs(2));
    let zombies: Vec<_> = namespace_processes(pid1)
        .into_iter()
        .filter(|(_, state, _)| state == "Z")
        .collect();
    assert!(zombies.is_empty(), "unreaped orphans: {zombies:?}");

    // SIGTERM to PID 1: exits 0 within 5 s, the session is stopped, nothing remains.
    let before = namespace_processes(pid1);
    eprintln!("processes of the namespace before SIGTERM: {before:?}");
    let started = Instant::now();
    ok(
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid1 as i32),
            nix::sys::signal::Signal::SIGTERM,
        ),
        "SIGTERM",
    );
    let exit = loop {
        if let Ok(Some(status)) = unshare.try_wait() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(10) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = started.elapsed();
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    if exit.is_none() {
        kill_group(&mut unshare);
    }
    eprintln!("PID 1 exited {exit:?} {took:?} after SIGTERM");
    let exit = some(exit, "PID 1's exit within 10 s");
    assert!(
        exit.success() && took <= Duration::from_secs(5),
        "PID 1 exits 0 within 5 s of SIGTERM: {exit} after {took:?}\n{log_text}"
    );
    assert_eq!(
        ok(db.runner_state(), "runner state").map(|r| r.status),
        Some("stopped".to_owned())
    );
    let left: Vec<u32> = before
        .iter()
        .map(|(p, ..)| *p)
        .filter(|p| e2e::harness::alive(*p))
        .collect();
    assert!(left.is_empty(), "processes of the image remain: {left:?}");
    assert!(
        !log_text.contains("ERROR"),
        "errors in the entrypoint's log:\n{log_text}"
    );
}

#[test]
fn the_image_layout_parsed_from_the_dockerfile_is_what_the_test_above_relies_on() {
    let image = parse_image();
    assert_eq!(image.entrypoint, ["/usr/local/bin/agent-runner"]);
    assert!(
        image.bin_dir.ends_with("/usr/local/bin/"),
        "{}",
        image.bin_dir
    );
    assert!(
        image.folders.iter().any(|f| f == "/workspace/agent"),
        "{:?}",
        image.folders
    );
    assert_eq!(image.agent.1, 1000);
    assert_eq!(image.workdir, "/workspace/agent");
}
