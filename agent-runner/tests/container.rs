//! The container image as far as it can be checked without a container engine (none runs on
//! the project's machines): the Dockerfile's defaults are the pins of `versions.env` (CLI
//! versions and base images), it installs the CLIs of its `CLIS` build argument through
//! `scripts/install-clis.sh`, `container/build.sh` passes those pins and a selection, the image runs
//! agent-runner itself as PID 1 (no tini), starting as root and dropping to its non-root user
//! (`NANOCLAW_RUN_AS`), with its three binaries (nanoclaw too) and its base packages, the ignore file and
//! the Kubernetes example hold what their READMEs promise; the README's engine setup (serve in
//! the VM) uses the API contract's flags consistently; and the real `agent-runner` binary,
//! run against a temporary folder laid out exactly like the container's `/workspace`, answers a
//! chat message with the system prompt built from the workspace's instruction files (the mock
//! provider echoes it when `mockEchoSystemPrompt` is set).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::dockerfile;
use dockerfile::instructions;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use schema::{Destination, NewMessageIn, Routing, SessionDb};
use serde_json::{json, Value};

/// The pins of versions.env the Dockerfile declares as build arguments, by variable name.
const PINS: [&str; 6] = [
    "CLAUDE_CODE_VERSION",
    "CODEX_VERSION",
    "OPENCODE_VERSION",
    "RUST_IMAGE",
    "NODE_IMAGE",
    "DEBIAN_IMAGE",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("reading {}: {err}", path.display()))
}

/// `NAME=value` lines of versions.env (the pins in [`PINS`]).
fn script_pins(script: &str) -> BTreeMap<String, String> {
    let mut pins = BTreeMap::new();
    for line in script.lines() {
        if let Some((name, value)) = line.split_once('=') {
            if PINS.contains(&name) {
                let value = value
                    .split(|c: char| c.is_whitespace() || c == '#')
                    .next()
                    .unwrap_or("");
                pins.entry(name.to_owned())
                    .or_insert_with(|| value.trim_matches('"').to_owned());
            }
        }
    }
    pins
}

/// `ARG NAME=default` of a Dockerfile.
fn dockerfile_args(dockerfile: &str) -> BTreeMap<String, String> {
    instructions(dockerfile)
        .into_iter()
        .filter(|(keyword, _)| keyword == "ARG")
        .filter_map(|(_, args)| {
            args.split_once('=')
                .map(|(n, v)| (n.to_owned(), v.trim_matches('"').to_owned()))
        })
        .collect()
}

fn runs(dockerfile: &str) -> Vec<String> {
    instructions(dockerfile)
        .into_iter()
        .filter(|(k, _)| k == "RUN")
        .map(|(_, a)| a)
        .collect()
}

#[test]
fn the_dockerfile_pins_the_versions_of_versions_env() {
    let script = script_pins(&read("versions.env"));
    let dockerfile = read("container/Dockerfile");
    let args = dockerfile_args(&dockerfile);
    let mut diff = Vec::new();
    for pin in PINS {
        let ours = args.get(pin).map(String::as_str).unwrap_or("(missing)");
        let theirs = script.get(pin).map(String::as_str).unwrap_or("(missing)");
        if ours != theirs {
            diff.push(format!(
                "  {pin}: versions.env = {theirs}, container/Dockerfile ARG = {ours}"
            ));
        }
    }
    assert!(
        diff.is_empty(),
        "the Dockerfile's pins drifted from versions.env (update `ARG NAME=...` in \
         container/Dockerfile):\n{}",
        diff.join("\n")
    );
    // The selected CLIs go through the project's installer, which reads the version ARGs from
    // its environment and the rest of versions.env from the copy beside it.
    assert_eq!(
        args.get("CLIS").map(String::as_str),
        Some("claude codex opencode"),
        "every CLI by default"
    );
    assert_eq!(
        args.get("OPENCODE_BUILD").map(String::as_str),
        Some("baseline"),
        "an image runs on any x64 CPU"
    );
    let all = instructions(&dockerfile);
    assert!(
        all.iter().any(|(k, a)| k == "COPY"
            && a == "versions.env scripts/install-clis.sh container/stage-clis.sh /opt/nanoclaw/"),
        "the installer, the stager and the pins are copied in"
    );
    let install = runs(&dockerfile)
        .into_iter()
        .find(|r| r.contains("install-clis.sh"))
        .expect("a RUN of install-clis.sh");
    for part in [
        "NANOCLAW_VERSIONS_FILE=/opt/nanoclaw/versions.env",
        "NANOCLAW_CLI_DIR=/tmp/cli",
        "NANOCLAW_OPENCODE_BUILD=\"$OPENCODE_BUILD\"",
        "bash /opt/nanoclaw/install-clis.sh ${CLIS}",
        // Only the native binaries (or a Node CLI with Node) leave the stage.
        "bash /opt/nanoclaw/stage-clis.sh --modules /tmp/cli/node_modules --out /cli",
    ] {
        assert!(
            install.contains(part),
            "the install lacks {part}: {install}"
        );
    }
    let script = read("scripts/install-clis.sh");
    assert!(
        script.contains("--include=optional"),
        "native binaries are optional dependencies"
    );
}

#[test]
fn build_sh_passes_the_pins_of_versions_env() {
    let script = script_pins(&read("versions.env"));
    let out = Command::new("bash")
        .arg(repo_root().join("container/build.sh"))
        .arg("--dry-run")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "build.sh --dry-run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let command = stdout.lines().next().unwrap();
    assert!(
        command.starts_with("docker build -f container/Dockerfile "),
        "{command}"
    );
    assert!(
        command.trim_end().ends_with(" ."),
        "the context is the repository root: {command}"
    );
    for pin in PINS {
        let arg = format!("--build-arg {pin}={}", script[pin]);
        assert!(
            command.contains(&arg),
            "build.sh does not pass {arg}: {command}"
        );
    }
    let version = read("Cargo.toml");
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .unwrap()
        .trim_matches('"');
    assert!(
        command.contains(&format!("-t nanoclaw-agent:{version}")),
        "{command}"
    );
    assert!(
        stdout.contains("docker run"),
        "build.sh prints the run line: {stdout}"
    );
    assert!(
        command.contains(r"--build-arg CLIS=claude\ codex\ opencode "),
        "every CLI by default: {command}"
    );
}

/// `--clis` selects the CLIs the image carries; a name it does not know is refused before any
/// build.
#[test]
fn build_sh_selects_the_clis_of_the_image() {
    let dry_run = |clis: &str| {
        Command::new("bash")
            .arg(repo_root().join("container/build.sh"))
            .args(["--dry-run", "--clis", clis])
            .output()
            .unwrap()
    };
    let out = dry_run("claude");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("--build-arg CLIS=claude "), "{stdout}");
    let out = dry_run("codex,opencode");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains(r"--build-arg CLIS=codex\ opencode "),
        "{stdout}"
    );
    for bad in ["bogus", "none claude", "all codex", ""] {
        let out = dry_run(bad);
        assert_eq!(out.status.code(), Some(1), "--clis {bad:?} is refused");
        assert!(out.stdout.is_empty(), "--clis {bad:?} printed a command");
    }
    // A Node CLI needs its pin; without it the build stops before anything and names the line
    // to add (the pins live in versions.env).
    let pins = read("versions.env");
    for (cli, pin) in [
        ("gemini", "GEMINI_CLI_VERSION"),
        ("qwen", "QWEN_CODE_VERSION"),
        ("all", "GEMINI_CLI_VERSION"),
    ] {
        if pins.lines().any(|l| l.starts_with(&format!("{pin}="))) {
            continue;
        }
        let out = dry_run(cli);
        assert_eq!(out.status.code(), Some(1), "--clis {cli} without {pin}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("no {pin}=... line")),
            "--clis {cli}: {stderr}"
        );
    }
}

fn stage_of<'a>(all: &'a [(String, String)], name: &str) -> &'a [(String, String)] {
    let start = all
        .iter()
        .position(|(k, a)| k == "FROM" && a.ends_with(&format!(" AS {name}")))
        .unwrap_or_else(|| panic!("no stage {name}"));
    let end = all[start + 1..]
        .iter()
        .position(|(k, _)| k == "FROM")
        .map_or(all.len(), |i| start + 1 + i);
    &all[start..end]
}

/// Issue 43, D8: the runtime has no Node (Claude Code, Codex and OpenCode are native binaries):
/// the CLIs come from the `clis` stage, laid out by container/stage-clis.sh, and the base is
/// Debian slimmed by container/slim-rootfs.sh and squashed into one layer (files removed in a
/// later layer would still be in the image).
#[test]
fn the_runtime_stage_has_no_node_and_a_slimmed_squashed_base() {
    let dockerfile = read("container/Dockerfile");
    let all = instructions(&dockerfile);
    let args = dockerfile_args(&dockerfile);
    assert_eq!(args.get("RUNTIME_BASE").map(String::as_str), Some("base"));
    let runtime = stage_of(&all, "runtime");
    assert_eq!(runtime[0].1, "${RUNTIME_BASE} AS runtime");
    for (keyword, text) in runtime {
        for word in ["npm", "install-clis", "NODE_IMAGE", "apt-get"] {
            assert!(
                !text.contains(word),
                "the runtime stage mentions {word}: {keyword} {text}"
            );
        }
    }
    assert!(
        runtime
            .iter()
            .any(|(k, a)| k == "COPY" && a == "--from=clis /cli/ /opt/cli/"),
        "{runtime:#?}"
    );
    let clis = stage_of(&all, "clis");
    assert_eq!(clis[0].1, "${NODE_IMAGE} AS clis");
    let base = stage_of(&all, "base");
    assert_eq!(base[0].1, "scratch AS base");
    assert!(base
        .iter()
        .any(|(k, a)| k == "COPY" && a == "--from=base-packages / /"));
    let packages = stage_of(&all, "base-packages");
    assert_eq!(packages[0].1, "${DEBIAN_IMAGE} AS base-packages");
    assert!(
        packages
            .iter()
            .any(|(k, a)| k == "RUN" && a.contains("sh /tmp/slim-rootfs.sh")),
        "{packages:#?}"
    );
    // The offline path slims its mmdebstrap root with the same script, and builds the same
    // runtime stage on it.
    let out = Command::new("bash")
        .arg(repo_root().join("container/build.sh"))
        .args(["--dry-run", "--offline", "--clis", "codex"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("--customize-hook=copy-in container/slim-rootfs.sh /tmp"),
        "{stdout}"
    );
    assert!(
        stdout.contains("chroot \"$1\" sh /tmp/slim-rootfs.sh"),
        "{stdout}"
    );
    assert!(
        stdout.contains("--build-arg RUNTIME_BASE=nanoclaw-agent-base:"),
        "{stdout}"
    );
}

/// Issue 43, D7: an extra CA is a build secret. Every RUN that downloads (cargo, npm, apt) mounts
/// it; nothing copies it; build.sh passes it as `--secret` and refuses a file that is no
/// certificate.
#[test]
fn the_extra_ca_is_a_build_secret_of_every_fetching_run() {
    let dockerfile = read("container/Dockerfile");
    let all = instructions(&dockerfile);
    let fetching: Vec<&String> = all
        .iter()
        .filter(|(k, a)| {
            k == "RUN"
                && (a.contains("cargo build")
                    || a.contains("install-clis.sh")
                    || a.contains("apt-get"))
        })
        .map(|(_, a)| a)
        .collect();
    assert_eq!(fetching.len(), 3, "{fetching:#?}");
    for run in fetching {
        assert!(
            run.starts_with("--mount=") && run.contains("--mount=type=secret,id=ca "),
            "a fetching RUN without the CA secret: {run}"
        );
    }
    for (keyword, text) in &all {
        assert!(
            !(matches!(keyword.as_str(), "COPY" | "ADD")
                && text.contains("ca")
                && text.contains(".pem")),
            "{keyword} {text}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("corp-ca.pem");
    std::fs::write(
        &pem,
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let out = Command::new("bash")
        .arg(repo_root().join("container/build.sh"))
        .args(["--dry-run", "--clis", "none", "--ca-cert"])
        .arg(&pem)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let expected = format!(r"--secret id=ca\,src={} ", pem.display());
    assert!(
        stdout.lines().next().unwrap().contains(&expected),
        "{stdout}"
    );
    let not_pem = dir.path().join("key.txt");
    std::fs::write(&not_pem, "hello").unwrap();
    let out = Command::new("bash")
        .arg(repo_root().join("container/build.sh"))
        .args(["--dry-run", "--ca-cert"])
        .arg(&not_pem)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a PEM certificate"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// container/stage-clis.sh on a node_modules laid out as npm leaves it: only the native
/// binaries are copied (Codex without its voice and code-mode hosts), Bun's single-file builds
/// byte for byte (stripping turns them into a plain Bun), no Node for native CLIs, and a Node
/// CLI without a Node binary is refused.
#[test]
fn stage_clis_copies_the_native_binaries_only() {
    let dir = tempfile::tempdir().unwrap();
    let nm = dir.path().join("node_modules");
    let big = |path: &Path, marker: &str| {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut bytes = vec![0u8; 1_100_000];
        bytes.extend_from_slice(marker.as_bytes());
        std::fs::write(path, bytes).unwrap();
    };
    big(
        &nm.join("@anthropic-ai/claude-code/bin/claude.exe"),
        "claude",
    );
    big(&nm.join("opencode-ai/bin/opencode.exe"), "opencode");
    let vendor = nm.join("@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl");
    big(&vendor.join("bin/codex"), "codex");
    big(&vendor.join("bin/codex-code-mode-host"), "host");
    big(
        &vendor.join("codex-resources/voice/bin/codex-voice-host"),
        "voice",
    );
    std::fs::write(vendor.join("codex-resources/bwrap"), "bwrap").unwrap();
    std::fs::create_dir_all(vendor.join("codex-path")).unwrap();
    std::fs::write(vendor.join("codex-path/rg"), "rg").unwrap();
    std::fs::write(vendor.join("codex-package.json"), "{}").unwrap();
    let stage = |out: &Path, clis: &[&str]| {
        Command::new("bash")
            .arg(repo_root().join("container/stage-clis.sh"))
            .arg("--modules")
            .arg(&nm)
            .arg("--out")
            .arg(out)
            .args(clis)
            .output()
            .unwrap()
    };
    let out_dir = dir.path().join("cli");
    let out = stage(&out_dir, &["claude", "codex", "opencode"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files: Vec<String> = walk(&out_dir)
        .into_iter()
        .map(|p| p.strip_prefix(&out_dir).unwrap().display().to_string())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "bin/claude -> ../claude/claude",
            "bin/codex -> ../codex/bin/codex",
            "bin/opencode -> ../opencode/opencode",
            "claude/claude",
            "clis",
            "codex/bin/codex",
            "codex/codex-package.json",
            "codex/codex-path/rg",
            "codex/codex-resources/bwrap",
            "opencode/opencode",
        ]
    );
    assert_eq!(
        std::fs::read(out_dir.join("claude/claude")).unwrap(),
        std::fs::read(nm.join("@anthropic-ai/claude-code/bin/claude.exe")).unwrap(),
        "Bun's single-file build is copied as it is"
    );
    assert_eq!(
        std::fs::read_to_string(out_dir.join("clis")).unwrap(),
        "claude\ncodex\nopencode\n"
    );
    // Nothing for none but the selection.
    let none_dir = dir.path().join("none");
    assert!(stage(&none_dir, &["none"]).status.success());
    assert_eq!(
        std::fs::read_to_string(none_dir.join("clis")).unwrap(),
        "none\n"
    );
    // A Node CLI needs Node, named.
    std::fs::create_dir_all(nm.join("@google/gemini-cli")).unwrap();
    let out = stage(&dir.path().join("gemini"), &["gemini"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("gemini needs Node.js: pass --node FILE"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every file and link under `dir` (links shown with their target), depth first.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&path).unwrap();
            found.push(PathBuf::from(format!(
                "{} -> {}",
                path.display(),
                target.display()
            )));
        } else if meta.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[test]
fn the_image_runs_agent_runner_as_pid_1_dropping_to_a_non_root_user() {
    let dockerfile = read("container/Dockerfile");
    // No `# syntax=` directive: it makes every BuildKit build pull a frontend image from a
    // registry, and nothing in the file needs more than the built-in one (issue 43, D4).
    assert!(
        !dockerfile.lines().any(|line| line
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("# syntax")),
        "container/Dockerfile has a # syntax= directive"
    );
    let all = instructions(&dockerfile);
    let last = |keyword: &str| {
        all.iter()
            .rev()
            .find(|(k, _)| k == keyword)
            .map(|(_, a)| a.clone())
    };

    // Multi-stage: a Rust build stage, then the runtime.
    let froms: Vec<&String> = all
        .iter()
        .filter(|(k, _)| k == "FROM")
        .map(|(_, a)| a)
        .collect();
    assert_eq!(froms.len(), 5, "{froms:?}");
    assert!(froms[0].ends_with("AS build"), "{froms:?}");
    let args = dockerfile_args(&dockerfile);
    let rust = args["RUST_IMAGE"]
        .strip_prefix("rust:")
        .expect("an official rust image");
    let minor: u32 = rust.split('.').nth(1).unwrap().parse().unwrap();
    assert!(
        rust.starts_with("1.") && minor >= 88,
        "rust image {rust} is older than the workspace's rust-version"
    );
    assert!(
        args["NODE_IMAGE"].contains("bookworm-slim"),
        "{}",
        args["NODE_IMAGE"]
    );
    let runs = runs(&dockerfile);
    assert!(
        runs.iter().any(|r| r
            .contains("cargo build --release --locked -p agent-runner -p mcp-tools -p host")
            && r.contains("target/release/nanoclaw")),
        "{runs:#?}"
    );

    // Base packages.
    let apt = runs
        .iter()
        .find(|r| r.contains("apt-get $ca install"))
        .expect("an apt-get install RUN (with the CA option)");
    let words: Vec<&str> = apt.split_whitespace().collect();
    for package in ["bash", "git", "ca-certificates"] {
        assert!(
            words.contains(&package),
            "{package} is not installed: {apt}"
        );
    }
    // No init: it would hold the container's environment (the host's secrets).
    for init in ["tini", "dumb-init"] {
        assert!(!words.contains(&init), "{init} is installed: {apt}");
    }

    // The three binaries, side by side in /usr/local/bin: nanoclaw so the same image runs
    // `nanoclaw serve` next to a session's DB (container/k8s/session-serve.yaml).
    let copy = all
        .iter()
        .find(|(k, a)| k == "COPY" && a.starts_with("--from=build"))
        .map(|(_, a)| a.clone())
        .expect("a COPY --from=build");
    assert!(
        copy.contains("/agent-runner")
            && copy.contains("/mcp-tools")
            && copy.contains("/nanoclaw")
            && copy.ends_with(" /usr/local/bin/"),
        "{copy}"
    );
    // The token file's folder: the agent's uid (serve runs as it), closed to everyone else, so a
    // named volume mounted there starts with that owner and mode.
    assert!(
        runs.iter()
            .any(|r| r.contains("install -d -m 0700 -o agent -g agent /etc/nanoclaw")),
        "{runs:#?}"
    );
    assert!(
        all.iter().any(|(k, a)| k == "EXPOSE" && a == "7450"),
        "the port of nanoclaw serve"
    );

    // Starts as root, reads the secrets, drops to the non-root uid 1000 owning /workspace.
    assert_eq!(
        last("USER").as_deref(),
        Some("root"),
        "the runner starts as root to read root-only secret files, then drops"
    );
    let env_words: Vec<String> = all
        .iter()
        .filter(|(k, _)| k == "ENV")
        .flat_map(|(_, a)| a.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .collect();
    let user = env_words
        .iter()
        .find_map(|w| w.strip_prefix("NANOCLAW_RUN_AS="))
        .expect("ENV NANOCLAW_RUN_AS")
        .to_owned();
    assert!(
        !["root", "0", "0:0", ""].contains(&user.as_str()),
        "drops to {user}"
    );
    assert!(
        runs.iter()
            .any(|r| r.contains("useradd --uid 1000 --gid 1000") && r.contains(&user)),
        "{runs:#?}"
    );
    assert!(
        runs.iter()
            .any(|r| r.contains(&format!("chown -R {user}:{user} /workspace"))),
        "{runs:#?}"
    );
    assert_eq!(last("WORKDIR").as_deref(), Some("/workspace/agent"));

    // agent-runner itself as PID 1, in exec form.
    assert_eq!(
        last("ENTRYPOINT").as_deref(),
        Some(r#"["/usr/local/bin/agent-runner"]"#)
    );
    assert_eq!(last("CMD"), None);

    // Environment defaults.
    let env = all
        .iter()
        .filter(|(k, _)| k == "ENV")
        .map(|(_, a)| a.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    for setting in [
        "WORKSPACE_DIR=/workspace",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
        "OPENCODE_DISABLE_MODELS_FETCH=1",
    ] {
        assert!(env.contains(setting), "ENV lacks {setting}: {env}");
    }
    // Env outranks config.json: an image default for these would override a session's config.json.
    // And no HOME: root's `docker exec` would get the agent's home (issue 43, D9).
    for unset in ["AGENT_PROVIDER=", "TZ=", "HOME="] {
        assert!(
            !env.split_whitespace().any(|w| w.starts_with(unset)),
            "ENV sets {unset}: {env}"
        );
    }
}

#[test]
fn the_ignore_file_and_the_kubernetes_example_hold_what_they_promise() {
    let ignore = read("container/Dockerfile.dockerignore");
    let patterns: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    // Without a leading `/`, which Buildah/Podman's --ignorefile does not strip (issue 43, D3).
    for needed in ["target", ".git", ".cli", ".demo", ".cache"] {
        assert!(
            patterns.contains(&needed),
            "{needed} is not ignored: {patterns:?}"
        );
    }

    let pod = read("container/k8s/pod.yaml");
    let lines: Vec<&str> = pod
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    for needed in [
        "kind: Pod",
        "runAsUser: 0",
        "allowPrivilegeEscalation: false",
        "drop: [\"ALL\"]",
        "add: [\"SETUID\", \"SETGID\"]",
        "type: RuntimeDefault",
        "secretName: nanoclaw-agent-keys",
        "defaultMode: 0400",
        "- name: ANTHROPIC_API_KEY_FILE",
        "mountPath: /workspace",
        "hostPath:",
        "requests:",
        "limits:",
    ] {
        assert!(lines.contains(&needed), "pod.yaml lacks `{needed}`");
    }
    assert!(
        !lines.iter().any(|l| l.starts_with("fsGroup:")),
        "fsGroup makes the secret volume readable by the agent's group"
    );
    let readme = read("container/k8s/README.md");
    assert!(
        readme.contains("one kernel") && readme.contains("node-local"),
        "k8s/README.md states the WAL constraint"
    );
    let readme = read("container/README.md");
    assert!(
        readme.contains("docker run") && readme.contains("Docker Desktop"),
        "container/README.md"
    );
}

/// The image's HEALTHCHECK and the pod's probes run `agent-runner health`; the arguments the
/// Dockerfile gives are ones the binary takes (run here on a workspace without a DB: unhealthy).
#[test]
fn the_image_and_the_pod_probe_health_with_agent_runner_health() {
    let dockerfile = read("container/Dockerfile");
    let all = instructions(&dockerfile);
    let entrypoint = all
        .iter()
        .rev()
        .find(|(keyword, _)| keyword == "ENTRYPOINT")
        .map(|(_, args)| args.clone())
        .expect("an ENTRYPOINT");
    let checks: Vec<&String> = all
        .iter()
        .filter(|(keyword, _)| keyword == "HEALTHCHECK")
        .map(|(_, args)| args)
        .collect();
    assert_eq!(checks.len(), 1, "one HEALTHCHECK: {checks:?}");
    let (options, command) = checks[0]
        .split_once("CMD ")
        .expect("HEALTHCHECK ... CMD [...]");
    for option in ["--interval=", "--timeout=", "--start-period=", "--retries="] {
        assert!(
            options.contains(option),
            "HEALTHCHECK lacks {option}: {options}"
        );
    }
    let argv: Vec<String> = serde_json::from_str(command).expect("CMD in exec form");
    let binary: Vec<String> = serde_json::from_str(&entrypoint).unwrap();
    assert_eq!(argv, [binary[0].as_str(), "health"], "{command}");

    let workspace = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_agent-runner"))
        .args(&argv[1..])
        .env("WORKSPACE_DIR", workspace.path())
        .env_remove("SESSION_DB")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no session DB at"), "{stderr}");

    let pod = read("container/k8s/pod.yaml");
    let lines: Vec<&str> = pod.lines().map(str::trim).collect();
    let probe_command = format!("command: [\"{}\", \"health\"]", binary[0]);
    for probe in ["livenessProbe:", "readinessProbe:"] {
        let at = lines
            .iter()
            .position(|line| *line == probe)
            .unwrap_or_else(|| panic!("pod.yaml lacks {probe}"));
        assert_eq!(
            lines[at + 1..at + 3],
            ["exec:", probe_command.as_str()],
            "{probe}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The binary in a workspace laid out like the container's /workspace.

/// A temporary `/workspace`: session.db, config.json, agent/ (CLAUDE.md importing a file,
/// CLAUDE.local.md), global/CLAUDE.md, extra/notes/, downloads/, outbox/.
struct Workspace {
    dir: tempfile::TempDir,
    db: SessionDb,
}

const MAIN: (&str, &str) = ("slack", "C-main");

impl Workspace {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for folder in [
            "agent/conversations",
            "agent/docs",
            "global",
            "extra/notes",
            "downloads",
            "outbox",
        ] {
            std::fs::create_dir_all(root.join(folder)).unwrap();
        }
        let files = [
            (
                "config.json",
                json!({
                    "provider": "mock",
                    "assistantName": "Andy",
                    "timezone": "Europe/Berlin",
                    "mockEchoSystemPrompt": true,
                    "idlePollMs": 100,
                    "activePollMs": 50,
                })
                .to_string(),
            ),
            ("global/CLAUDE.md", "# Global rules\nGLOBAL-MARKER: be kind.\n@../extra/notes/glossary.md\n".into()),
            ("extra/notes/glossary.md", "GLOSSARY-MARKER: a PR is a pull request.\n".into()),
            (
                "agent/CLAUDE.md",
                "# Ops helper\nGROUP-MARKER: you help the ops team.\n@docs/tone.md\n```\n@docs/missing.md\n```\n".into(),
            ),
            ("agent/docs/tone.md", "IMPORTED-MARKER: short sentences.\n@../CLAUDE.md\n".into()),
            ("agent/CLAUDE.local.md", "LOCAL-MARKER: staging is down.\n".into()),
        ];
        for (path, text) in files {
            std::fs::write(root.join(path), text).unwrap();
        }
        let db = SessionDb::open(root.join("session.db")).unwrap();
        db.set_session_routing(&routing(MAIN)).unwrap();
        db.upsert_destination(&destination(
            "ops",
            Some("Ops room"),
            "channel",
            ("slack", "C-ops"),
        ))
        .unwrap();
        Self { dir, db }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The binary as the image runs it: `--workspace` and nothing else from the outside world
    /// (the test's own environment could override config.json).
    fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agent-runner"));
        cmd.arg("--workspace").arg(self.path()).env_clear();
        cmd.env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "info");
        cmd.stdin(Stdio::null());
        cmd
    }

    fn start(&self) -> Child {
        let log = std::fs::File::create(self.path().join("runner.log")).unwrap();
        self.command()
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("runner.log")).unwrap_or_default()
    }

    /// Sends a chat message from the main channel and waits for its reply; returns the reply's
    /// text split into the (unescaped) system prompt and the prompt.
    fn ask(&self, runner: &mut Child, text: &str) -> (String, String) {
        let mut row = NewMessageIn::new(
            "chat",
            json!({"sender": "Ann", "senderId": "U1", "text": text}).to_string(),
        );
        row.routing = routing(MAIN);
        let id = self.db.insert_in(&row).unwrap().id;
        let deadline = Instant::now() + Duration::from_secs(20);
        let reply = loop {
            if let Some(reply) = self.db.replies_to(&id).unwrap().into_iter().next() {
                break reply;
            }
            if let Some(status) = runner.try_wait().unwrap() {
                panic!("agent-runner exited ({status}); its log:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "no reply to {text:?}; the runner's log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(
            reply.routing,
            routing(MAIN),
            "the reply goes back where the message came from"
        );
        let content: Value = serde_json::from_str(&reply.content).unwrap();
        let echoed = content["text"].as_str().unwrap();
        let (system, prompt) = echoed
            .split_once("\n---\n")
            .expect("the mock's system-prompt echo");
        let system = provider::prompt_xml::unescape(system).into_owned();
        (system, prompt.to_owned())
    }

    fn stop(&self, mut runner: Child) {
        kill(Pid::from_raw(runner.id() as i32), Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = runner.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "agent-runner ignored SIGTERM; its log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "agent-runner exited with {status}; its log:\n{}",
            self.log()
        );
        assert_eq!(self.db.runner_state().unwrap().unwrap().status, "stopped");
    }
}

fn routing((channel_type, platform_id): (&str, &str)) -> Routing {
    Routing {
        channel_type: Some(channel_type.into()),
        platform_id: Some(platform_id.into()),
        thread_id: None,
    }
}

fn destination(name: &str, display: Option<&str>, kind: &str, to: (&str, &str)) -> Destination {
    Destination {
        name: name.into(),
        display_name: display.map(str::to_owned),
        kind: kind.into(),
        channel_type: Some(to.0.into()),
        platform_id: Some(to.1.into()),
        agent_group_id: None,
    }
}

/// `needles` occur in `haystack` in this order.
fn assert_in_order(haystack: &str, needles: &[&str]) {
    let mut from = 0;
    for needle in needles {
        match haystack[from..].find(needle) {
            Some(at) => from += at + needle.len(),
            None => {
                panic!("`{needle}` missing (or out of order) in the system prompt:\n{haystack}")
            }
        }
    }
}

#[test]
fn the_binary_in_a_container_shaped_workspace_answers_with_the_system_prompt_it_built() {
    let ws = Workspace::new();
    let mut runner = ws.start();

    let (system, prompt) = ws.ask(&mut runner, "Hello from the test & friends");
    assert_in_order(
        &system,
        &[
            "<!-- global instructions: global/CLAUDE.md -->",
            "GLOBAL-MARKER: be kind.",
            "GLOSSARY-MARKER: a PR is a pull request.",
            "<!-- agent group instructions: agent/CLAUDE.md -->",
            "GROUP-MARKER: you help the ops team.",
            "IMPORTED-MARKER: short sentences.",
            "<!-- import cycle: ../CLAUDE.md -->",
            "```\n@docs/missing.md\n```",
            "<!-- local instructions: agent/CLAUDE.local.md -->",
            "LOCAL-MARKER: staging is down.",
            "## NanoClaw runner",
            "You are Andy.",
            "Times are in the Europe/Berlin time zone",
            "`<message to=\"name\">…</message>`",
            "`<internal>…</internal>` is never sent",
            "| `ops` | Ops room | channel |",
            "### Tools (MCP server `nanoclaw`)",
            "- `send_message`:",
            "- `register_agent_group`:",
        ],
    );
    for (tool, _) in agent_runner::system_prompt::TOOLS {
        assert!(
            system.contains(&format!("- `{tool}`: ")),
            "tool {tool} missing:\n{system}"
        );
    }
    assert!(
        !system.contains("missing import"),
        "fenced imports are not expanded:\n{system}"
    );
    assert!(
        prompt.starts_with("<context timezone=\"Europe/Berlin\" />"),
        "{prompt}"
    );
    assert!(
        prompt.contains(">Hello from the test &amp; friends</message>"),
        "{prompt}"
    );

    // Destination and instruction changes made while the runner lives reach the next query.
    ws.db
        .upsert_destination(&destination(
            "research",
            Some("Research agent"),
            "agent",
            ("agent", "ag-research"),
        ))
        .unwrap();
    std::fs::write(
        ws.path().join("agent/CLAUDE.local.md"),
        "LOCAL-MARKER-2: staging is back.\n",
    )
    .unwrap();
    let (system, _) = ws.ask(&mut runner, "Second message");
    assert_in_order(
        &system,
        &[
            "LOCAL-MARKER-2: staging is back.",
            "| `ops` | Ops room | channel |",
            "| `research` | Research agent | agent |",
        ],
    );
    assert!(
        !system.contains("LOCAL-MARKER: staging is down."),
        "{system}"
    );

    ws.stop(runner);
    assert!(
        !ws.log().contains("ERROR"),
        "errors in the runner's log:\n{}",
        ws.log()
    );
}

#[test]
fn agent_runner_config_reads_the_workspace_config() {
    let ws = Workspace::new();
    let out = ws.command().arg("config").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for line in [
        "provider = mock  [config.json]",
        "assistantName = Andy  [config.json]",
        "timezone = Europe/Berlin  [config.json]",
        "mockEchoSystemPrompt = true  [config.json]",
        "globalDir = global  [default]",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "`{line}` missing from:\n{text}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// container/README.md's Docker Desktop / OrbStack / Podman machine setup.

/// The `--flag`s of the synopsis in `docs/contract/api.md` that starts with `start` (up to the
/// next blank line).
fn contract_flags(start: &str) -> Vec<String> {
    let api = read("docs/contract/api.md");
    let at = api
        .find(start)
        .unwrap_or_else(|| panic!("api.md has no synopsis starting with {start}"));
    api[at..]
        .split("\n\n")
        .next()
        .unwrap()
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|word| word.starts_with("--"))
        .map(str::to_owned)
        .collect()
}

/// The commands of the README's engine setup agree with each other and use only flags the API
/// contract gives `nanoclaw serve`, `nanoclaw token` and the CLI over the API: one session
/// volume for init, the runner and serve (at `--root/<session>`), the token file on serve's own
/// volume, the published port on loopback equal to `--listen`'s and to the client's URL, the
/// client's token file the one `token add` wrote.
#[test]
fn the_readme_engine_setup_uses_the_contracts_flags_consistently() {
    let readme = read("container/README.md");
    let start = readme
        .find("```sh\nIMAGE=")
        .expect("the engine setup's sh block");
    let block = &readme[start + 6..];
    let block = &block[..block.find("```").unwrap()];
    let joined = block.replace("\\\n", " ");
    let mut vars = BTreeMap::new();
    let mut commands: Vec<Vec<String>> = Vec::new();
    for line in joined.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some((name, value)) = line
            .split_once('=')
            .filter(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        {
            vars.insert(name.to_owned(), value.to_owned());
            continue;
        }
        let mut line = line
            .trim_start_matches("(umask 077 && ")
            .trim_end_matches(')')
            .to_owned();
        for (name, value) in &vars {
            line = line.replace(&format!("${name}"), value);
        }
        commands.push(line.split_whitespace().map(str::to_owned).collect());
    }
    let image = vars["IMAGE"].clone();
    let session = vars["SESSION"].clone();
    let version = read("Cargo.toml");
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .unwrap()
        .trim_matches('"');
    assert_eq!(image, format!("nanoclaw-agent:{version}"), "build.sh's tag");

    let value = |words: &[String], flag: &str| -> String {
        let at = words
            .iter()
            .position(|w| w == flag)
            .unwrap_or_else(|| panic!("{flag} missing: {words:?}"));
        words[at + 1].clone()
    };
    let mounts = |words: &[String]| -> BTreeMap<String, String> {
        words
            .windows(2)
            .filter(|w| w[0] == "-v")
            .map(|w| {
                let mut parts = w[1].split(':');
                (
                    parts.next().unwrap().to_owned(),
                    parts.next().unwrap().to_owned(),
                )
            })
            .collect()
    };
    // `docker run ... IMAGE nanoclaw-args...` with `--entrypoint nanoclaw`: (docker words, args).
    let nanoclaw_runs: Vec<(Vec<String>, Vec<String>)> = commands
        .iter()
        .filter(|c| c[..2] == ["docker", "run"] && c.contains(&"nanoclaw".to_owned()))
        .map(|c| {
            let at = c.iter().position(|w| *w == image).expect("the image");
            (c[..at].to_vec(), c[at + 1..].to_vec())
        })
        .collect();
    let find = |subcommand: &str| {
        nanoclaw_runs
            .iter()
            .find(|(_, args)| args[0] == subcommand)
            .unwrap_or_else(|| panic!("no `nanoclaw {subcommand}` run: {nanoclaw_runs:?}"))
    };
    let volume = format!("nanoclaw-session-{session}");

    let (docker, init) = find("init");
    assert_eq!(value(init, "--workspace"), mounts(docker)[&volume]);
    assert_eq!(value(docker, "--user"), "1000:1000");

    let (docker, serve) = find("serve");
    let served = contract_flags("nanoclaw serve (--workspace");
    for flag in serve.iter().filter(|a| a.starts_with("--")) {
        assert!(
            served.contains(flag),
            "serve {flag} is not in api.md: {served:?}"
        );
    }
    let root = value(serve, "--root");
    assert_eq!(mounts(docker)[&volume], format!("{root}/{session}"));
    let tokens = value(serve, "--tokens");
    let token_volume = mounts(docker)["nanoclaw-serve"].clone();
    assert_eq!(
        Path::new(&tokens).parent().unwrap(),
        Path::new(token_volume.trim_end_matches(":ro"))
    );
    assert!(serve.contains(&"--plain-http".to_owned()));
    let port = value(serve, "--listen")
        .strip_prefix("0.0.0.0:")
        .unwrap()
        .to_owned();
    assert_eq!(value(docker, "-p"), format!("127.0.0.1:{port}:{port}"));
    assert_eq!(value(docker, "--user"), "1000:1000");
    for hardening in ["--read-only", "--no-healthcheck"] {
        assert!(
            docker.contains(&hardening.to_owned()),
            "{hardening}: {docker:?}"
        );
    }
    assert_eq!(value(docker, "--cap-drop"), "ALL");

    let (docker, add) = find("token");
    assert_eq!(add[1], "add");
    let token_flags = contract_flags("nanoclaw token add");
    for flag in add.iter().filter(|a| a.starts_with("--")) {
        assert!(
            token_flags.contains(flag),
            "token {flag} is not in api.md: {token_flags:?}"
        );
    }
    assert_eq!(value(add, "--tokens"), tokens);
    assert_eq!(value(add, "--sessions"), session);
    assert_eq!(
        Path::new(&tokens).parent().unwrap(),
        Path::new(&mounts(docker)["nanoclaw-serve"])
    );
    let token_file = value(add, ">");

    let runner = commands
        .iter()
        .find(|c| c[..2] == ["docker", "run"] && c.last() == Some(&image))
        .expect("the runner's docker run");
    assert_eq!(mounts(runner)[&volume], "/workspace");

    let cli = contract_flags("nanoclaw --url URL");
    let clients: Vec<&Vec<String>> = commands.iter().filter(|c| c[0] == "nanoclaw").collect();
    assert!(clients.len() >= 2, "{commands:?}");
    for client in clients {
        assert_eq!(value(client, "--url"), format!("http://127.0.0.1:{port}"));
        assert_eq!(value(client, "--token-file"), token_file);
        assert_eq!(value(client, "--session"), session);
        let subcommand = client[7..]
            .first()
            .unwrap_or_else(|| panic!("no subcommand: {client:?}"));
        for flag in client[..7].iter().filter(|a| a.starts_with("--")) {
            assert!(cli.contains(flag), "{flag} is not in api.md's CLI: {cli:?}");
        }
        assert!(
            ["status", "send", "watch"].contains(&subcommand.as_str()),
            "{client:?}"
        );
    }
}

/// container/k8s/pod.yaml's security context (root with every capability dropped but SETUID
/// and SETGID) on a `0700` session folder of the agent's user: root cannot read config.json
/// there, and the runner never needs it to (issue 43, D1). `agent-runner health`, the pod's
/// probe, reads the file after its drop to runAs and reaches the DB. Without the fix it exits
/// with "reading .../config.json: Permission denied". Needs root (the CI's user) and setpriv
/// (util-linux); says so and checks nothing otherwise.
#[test]
fn a_root_without_dac_override_reads_config_json_as_the_agent_user() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIPPED: needs root to chown the workspace to uid 1000 and drop capabilities");
        return;
    }
    let ws = Workspace::new();
    let chown = Command::new("chown")
        .args(["-R", "1000:1000"])
        .arg(ws.path())
        .status()
        .unwrap();
    assert!(chown.success());
    let mode = |path: &Path, mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    mode(ws.path(), 0o700);
    mode(&ws.path().join("config.json"), 0o600);
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--bounding-set=-dac_override,-dac_read_search,-fowner",
        "--inh-caps=-all",
        "--",
        env!("CARGO_BIN_EXE_agent-runner"),
        "--workspace",
    ])
    .arg(ws.path())
    .arg("health")
    .env_clear()
    .env("PATH", std::env::var_os("PATH").unwrap_or_default())
    .env("NANOCLAW_RUN_AS", "1000:1000")
    .env("RUST_LOG", "info")
    .stdin(Stdio::null());
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("Permission denied"), "{stderr}");
    // Past the configuration, as uid 1000: the DB's verdict (no runner has started on it).
    assert!(stderr.contains("no runner has started on"), "{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
}
