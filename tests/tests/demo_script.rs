//! `scripts/demo.sh` as a user runs it: `--provider claude|codex|opencode` drives the real
//! pinned CLI against the fake model server on 127.0.0.1 (a shell command, a question answered
//! with `nanoclaw answer`, the reply), offline, inside a loopback-only network namespace when
//! the machine allows one, from the repository root with the default `DEMO_DIR` (`.demo`,
//! relative: issue 46) and with a relative `DEMO_DIR` from another folder; and the demo deletes
//! only a folder it created.
//!
//! The binaries come from the target dir (`cargo build --workspace --bins` first, as every
//! end-to-end test); the script gets them through `NANOCLAW_BIN_DIR` and so does not build.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use e2e::fake_model::{FakeModel, Step};
use e2e::harness::{
    bin, provider_cli, repo_root, run_in_loopback_netns, start_cli_test, FAKE_KEY, FAKE_MODEL,
};
use e2e::scenarios::{ok, some};
use serde_json::json;

/// A safety net against a hung demo, not a speed check (each demo takes a few seconds; OpenCode's
/// cold start is the longest).
const TIMEOUT: Duration = Duration::from_secs(180);

struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Run {
    fn dump(&self) -> String {
        format!(
            "status: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// The folder of the built binaries.
fn bin_dir() -> PathBuf {
    let runner = bin("agent-runner");
    runner
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Runs `scripts/demo.sh args` with `DEMO_DIR=demo_dir` in its own process group, killed as a
/// group after [`TIMEOUT`].
fn demo(demo_dir: &Path, args: &[&str]) -> Run {
    demo_with_env(demo_dir, args, &[])
}

/// [`demo`] with `env` on top.
fn demo_with_env(demo_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    demo_in(
        &repo_root(),
        Some(demo_dir),
        &repo_root().join("scripts/demo.sh"),
        args,
        env,
    )
}

/// Runs `bash script args` in the folder `cwd`, with `DEMO_DIR=demo_dir` (unset: `None`) and
/// `env`, in its own process group, killed as a group after [`TIMEOUT`].
fn demo_in(
    cwd: &Path,
    demo_dir: Option<&Path>,
    script: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Run {
    use std::os::unix::process::CommandExt;
    let logs = ok(tempfile::tempdir(), "log dir");
    let (out_path, err_path) = (logs.path().join("stdout"), logs.path().join("stderr"));
    let mut command = Command::new("bash");
    command.current_dir(cwd).arg(script).args(args);
    match demo_dir {
        Some(dir) => command.env("DEMO_DIR", dir),
        None => command.env_remove("DEMO_DIR"),
    };
    let mut child = ok(
        command
            .env("NANOCLAW_BIN_DIR", bin_dir())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(ok(std::fs::File::create(&out_path), "stdout file"))
            .stderr(ok(std::fs::File::create(&err_path), "stderr file"))
            .process_group(0)
            .spawn(),
        "spawning scripts/demo.sh",
    );
    let group = nix::unistd::Pid::from_raw(child.id() as i32);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = ok(child.try_wait(), "waiting for demo.sh") {
            break status;
        }
        if started.elapsed() > TIMEOUT {
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            panic!(
                "scripts/demo.sh {args:?} did not finish in {TIMEOUT:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                std::fs::read_to_string(&out_path).unwrap_or_default(),
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Whatever the demo left behind in its group (it stops what it starts; this is a net).
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    eprintln!(
        "scripts/demo.sh {args:?}: {status} in {:.1?}",
        started.elapsed()
    );
    Run {
        status,
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

/// A run of `scripts/demo.sh --provider <provider>` in `demo_dir`: the CLI ran the shell
/// command, asked, got the answer through `nanoclaw answer` and replied; the conversation is
/// printed.
fn check_real_cli_demo(provider: &str, run: &Run, demo_dir: &Path) {
    assert!(run.status.success(), "{provider}: {}", run.dump());
    for expected in [
        "Post the kernel version to the ops room?",
        "==> answering: nanoclaw answer --question ",
        "Done: I ran uname -sr, asked you, and you said Yes.",
        &format!("demo finished: {provider} ran a tool"),
    ] {
        assert!(
            run.stdout.contains(expected),
            "the demo's output lacks {expected:?}\n{}",
            run.dump()
        );
    }
    // The shell command's output reached the model, and so did the answer.
    let results: Vec<&str> = run
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("    tool result: "))
        .collect();
    assert!(
        results.iter().any(|r| r.contains("Linux")) && results.iter().any(|r| r.ends_with("Yes")),
        "tool results: {results:?}\n{}",
        run.dump()
    );
    assert!(
        demo_dir.join(".nanoclaw-demo").is_file(),
        "the demo marks its folder"
    );
}

/// The README's `scripts/demo.sh --provider X` for each CLI, as a user runs it: from the
/// repository root, `DEMO_DIR` unset (the default `.demo`, which the demo passes on relative).
/// The three runs are one test, one after the other, since they share `<repo>/.demo`; the demo
/// itself also waits for another demo in the same parent folder (`flock`), and `scripts/test.sh`
/// runs its mock demo before the tests, not beside them.
#[test]
fn demo_with_each_cli_from_the_repository_root() {
    let providers = ["claude", "codex", "opencode"];
    if !providers.iter().all(|p| provider_cli(p).is_some())
        || !run_in_loopback_netns("demo_with_each_cli_from_the_repository_root")
    {
        return;
    }
    let root = repo_root();
    for provider in providers {
        let run = demo_in(
            &root,
            None,
            Path::new("scripts/demo.sh"),
            &["--provider", provider],
            &[],
        );
        check_real_cli_demo(provider, &run, &root.join(".demo"));
    }
}

/// A relative `DEMO_DIR` is the folder's the demo is started in, not the repository root's.
#[test]
fn demo_with_a_relative_dir_from_another_folder() {
    if !start_cli_test("codex", "demo_with_a_relative_dir_from_another_folder") {
        return;
    }
    let dir = ok(tempfile::tempdir(), "temp dir");
    let run = demo_in(
        dir.path(),
        Some(Path::new("nested/demo")),
        &repo_root().join("scripts/demo.sh"),
        &["--provider", "codex"],
        &[],
    );
    check_real_cli_demo("codex", &run, &dir.path().join("nested/demo"));
    assert!(
        !repo_root().join("nested").exists(),
        "the demo used the repository root"
    );
}

/// `--base-url`: the same demo against a gateway the script does not start (here the fake model,
/// started by the test, standing in for a real one), with the key from the environment.
#[test]
fn demo_against_a_gateway_url() {
    if !start_cli_test("claude", "demo_against_a_gateway_url") {
        return;
    }
    let model = ok(
        FakeModel::start_with_script([
            Step::raw_tool_call(
                "Bash",
                json!({"command": "uname -sr", "description": "Show the kernel"}),
            ),
            Step::tool_call(
                "ask_user_question",
                json!({"question": "Post it?", "options": ["Yes", "No"]}),
            ),
            Step::text("Posted, as you said."),
        ]),
        "fake model",
    );
    let dir = ok(tempfile::tempdir(), "temp dir");
    let demo_dir = dir.path().join("demo");
    let url = model.url();
    let args = [
        "--provider",
        "claude",
        "--base-url",
        &url,
        "--model",
        FAKE_MODEL,
    ];
    // Without the key: refused, naming the variable.
    let run = demo_with_env(&demo_dir, &args, &[("ANTHROPIC_API_KEY", "")]);
    assert_eq!(run.status.code(), Some(1), "{}", run.dump());
    assert!(run.stderr.contains("ANTHROPIC_API_KEY"), "{}", run.dump());
    let run = demo_with_env(&demo_dir, &args, &[("ANTHROPIC_API_KEY", FAKE_KEY)]);
    assert!(run.status.success(), "{}", run.dump());
    assert!(
        run.stdout
            .contains("==> answering: nanoclaw answer --question ")
            && run.stdout.contains("Posted, as you said."),
        "{}",
        run.dump()
    );
    let first = some(model.model_requests().first().cloned(), "a model request");
    // The key of the environment reached the gateway (through the runner's credential proxy).
    assert!(
        [first.header("x-api-key"), first.header("authorization")]
            .into_iter()
            .flatten()
            .any(|h| h.contains(FAKE_KEY)),
        "the gateway got the key"
    );
    assert!(
        first
            .last_user_text()
            .is_some_and(|t| t.contains("ask_user_question tool")),
        "the gateway's model is asked to use the tool: {:?}",
        first.last_user_text()
    );
}

/// The demo deletes DEMO_DIR on start: a folder it did not create (no marker), a file, or a link
/// (even to a demo folder) is refused and left as it was; its own folder is replaced.
#[test]
fn demo_deletes_only_a_folder_it_created() {
    let dir = ok(tempfile::tempdir(), "temp dir");
    let precious = dir.path().join("precious");
    ok(std::fs::create_dir(&precious), "a user's folder");
    ok(
        std::fs::write(precious.join("notes.txt"), "keep me"),
        "a file",
    );
    let file = dir.path().join("a-file");
    ok(std::fs::write(&file, "keep me"), "a file");
    let own = dir.path().join("own");
    let link = dir.path().join("link");
    ok(std::os::unix::fs::symlink(&own, &link), "a link");

    for refused in [&precious, &file] {
        let run = demo(refused, &[]);
        assert_eq!(run.status.code(), Some(1), "{}", run.dump());
        assert!(
            run.stderr.contains("is not a demo folder") && run.stderr.contains("refusing"),
            "{}",
            run.dump()
        );
    }
    assert_eq!(
        ok(
            std::fs::read_to_string(precious.join("notes.txt")),
            "the user's file"
        ),
        "keep me"
    );
    assert!(file.is_file());

    // Its own folder, twice: the second run replaces the first one's folder.
    for _ in 0..2 {
        let run = demo(&own, &[]);
        assert!(run.status.success(), "{}", run.dump());
        assert!(
            run.stdout.contains("demo finished: both messages answered"),
            "{}",
            run.dump()
        );
        assert!(own.join(".nanoclaw-demo").is_file());
    }
    // A link is refused even when it points at a demo folder: rm -rf would delete the link only.
    let run = demo(&link, &[]);
    assert_eq!(run.status.code(), Some(1), "{}", run.dump());
    assert!(run.stderr.contains("symbolic link"), "{}", run.dump());
    assert!(own.join("session.db").is_file(), "the linked folder stays");
}

/// Wrong arguments are refused with the usage, before anything is built or deleted.
#[test]
fn demo_refuses_unknown_providers_and_arguments() {
    let dir = ok(tempfile::tempdir(), "temp dir");
    let demo_dir = dir.path().join("demo");
    for args in [
        &["--provider", "gpt"][..],
        &["--frobnicate"][..],
        &["--base-url", "http://127.0.0.1:9"][..],
    ] {
        let run = demo(&demo_dir, args);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {}", run.dump());
        assert!(!demo_dir.exists(), "{args:?} created the demo folder");
    }
}
