//! `scripts/install-clis.sh` without the network: the pins come from `versions.env`, a selection
//! installs and verifies only the CLIs it names, the Node.js version is checked with what to do,
//! and OpenCode keeps one build. Installs are simulated with a `node_modules` laid out as npm
//! leaves it, so the script takes its reuse path and never calls npm.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use e2e::harness::repo_root;
use e2e::scenarios::ok;

/// `NAME=value` lines of `versions.env`.
fn versions() -> BTreeMap<String, String> {
    let text = ok(
        std::fs::read_to_string(repo_root().join("versions.env")),
        "versions.env",
    );
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Runs the script with `args`, `env` on top of this process's environment (minus the pins, so
/// versions.env decides).
fn install_clis(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("scripts/install-clis.sh"))
        .args(args)
        .env_remove("CLAUDE_CODE_VERSION")
        .env_remove("CODEX_VERSION")
        .env_remove("OPENCODE_VERSION")
        .env_remove("GEMINI_CLI_VERSION")
        .env_remove("QWEN_CODE_VERSION")
        .env_remove("NANOCLAW_CLIS")
        .env_remove("FORCE")
        .stdin(Stdio::null());
    for (name, value) in env {
        cmd.env(name, value);
    }
    ok(cmd.output(), "running scripts/install-clis.sh")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn write_executable(path: &Path, content: &str) {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = path.parent() {
        ok(std::fs::create_dir_all(parent), "a folder");
    }
    ok(std::fs::write(path, content), "an executable");
    ok(
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)),
        "chmod",
    );
}

/// A native binary stand-in: a shell script printing `version`, padded past the 1 MB by which the
/// script tells a native binary from the packages' placeholders.
fn fake_native(version: &str) -> String {
    format!(
        "#!/bin/sh\necho '{version}'\nexit 0\n#{}\n",
        "x".repeat(1_100_000)
    )
}

#[test]
fn the_pins_come_from_versions_env_and_a_selection_names_its_packages() {
    let pins = versions();
    let out = install_clis(&["--print-packages"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!(
            "@anthropic-ai/claude-code@{}\n@openai/codex@{}\nopencode-ai@{}\n\
             @google/gemini-cli@{}\n@qwen-code/qwen-code@{}\n",
            pins["CLAUDE_CODE_VERSION"],
            pins["CODEX_VERSION"],
            pins["OPENCODE_VERSION"],
            pins["GEMINI_CLI_VERSION"],
            pins["QWEN_CODE_VERSION"]
        )
    );
    let out = install_clis(&["--print-packages", "codex"], &[]);
    assert_eq!(
        text(&out.stdout),
        format!("@openai/codex@{}\n", pins["CODEX_VERSION"])
    );
    let out = install_clis(&["--print-packages", "qwen", "gemini"], &[]);
    assert_eq!(
        text(&out.stdout),
        format!(
            "@qwen-code/qwen-code@{}\n@google/gemini-cli@{}\n",
            pins["QWEN_CODE_VERSION"], pins["GEMINI_CLI_VERSION"]
        )
    );
    let out = install_clis(&["--print-packages", "cursor"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr)
            .contains("unknown CLI 'cursor' (known: claude codex opencode gemini qwen)"),
        "{}",
        text(&out.stderr)
    );
}

/// A `node` and an `npm` that report `version` and fail anything else, first on PATH.
fn fake_node(dir: &Path, version: &str) -> PathBuf {
    let bin = dir.join(format!("node-{version}"));
    write_executable(
        &bin.join("node"),
        &format!("#!/bin/sh\n[ \"$1\" = --version ] && echo {version} && exit 0\nexit 9\n"),
    );
    write_executable(
        &bin.join("npm"),
        "#!/bin/sh\necho 'fake npm: offline' >&2\nexit 9\n",
    );
    let path = std::env::var("PATH").unwrap_or_default();
    PathBuf::from(format!("{}:{path}", bin.display()))
}

#[test]
fn an_old_node_is_refused_or_warned_about_with_what_to_do() {
    let dir = ok(tempfile::tempdir(), "temp dir");
    let cli_dir = dir.path().join("cli");
    let min = versions()["NODE_MIN_MAJOR"].clone();

    // Too old for any of them: refused before npm runs.
    let path = fake_node(dir.path(), "v14.21.3");
    let out = install_clis(
        &["codex"],
        &[("PATH", &path), ("NANOCLAW_CLI_DIR", &cli_dir)],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Node.js v14.21.3 is too old")
            && stderr.contains(&format!("install Node.js {min} or later")),
        "{stderr}"
    );
    assert!(!stderr.contains("fake npm"), "npm ran: {stderr}");

    // Below Claude Code's engines: a warning naming the fix, then the install goes on (to the
    // fake npm, which fails offline).
    let path = fake_node(dir.path(), "v20.11.0");
    let out = install_clis(
        &["claude"],
        &[("PATH", &path), ("NANOCLAW_CLI_DIR", &cli_dir)],
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("warning: Node.js v20.11.0 is older than {min}"))
            && stderr.contains("EBADENGINE")
            && stderr.contains(&format!("install Node.js {min} or later")),
        "{stderr}"
    );
    assert!(stderr.contains("fake npm"), "the install went on: {stderr}");
    // Qwen Code declares node >= 22 too: the warning names its package.
    let out = install_clis(
        &["qwen"],
        &[("PATH", &path), ("NANOCLAW_CLI_DIR", &cli_dir)],
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("warning: Node.js v20.11.0 is older than {min}"))
            && stderr.contains("@qwen-code/qwen-code@"),
        "{stderr}"
    );
    // Codex declares node >= 16 and Gemini CLI >= 20: no warning.
    let out = install_clis(
        &["codex", "gemini"],
        &[("PATH", &path), ("NANOCLAW_CLI_DIR", &cli_dir)],
    );
    assert!(
        !text(&out.stderr).contains("warning: Node.js"),
        "{}",
        text(&out.stderr)
    );
}

/// OpenCode as npm leaves it on linux x64: both builds installed, the AVX2 one linked in by the
/// postinstall; Claude Code and Codex absent.
fn lay_out_opencode(cli_dir: &Path, version: &str) {
    let nm = cli_dir.join("node_modules");
    let package = nm.join("opencode-ai");
    ok(std::fs::create_dir_all(package.join("bin")), "opencode-ai");
    ok(
        std::fs::write(
            package.join("package.json"),
            format!("{{\n  \"name\": \"opencode-ai\",\n  \"version\": \"{version}\"\n}}\n"),
        ),
        "package.json",
    );
    let avx2 = nm.join("opencode-linux-x64/bin/opencode");
    write_executable(&avx2, &fake_native(&format!("{version} avx2")));
    write_executable(
        &nm.join("opencode-linux-x64-baseline/bin/opencode"),
        &fake_native(&format!("{version} baseline")),
    );
    ok(
        std::fs::hard_link(&avx2, package.join("bin/opencode.exe")),
        "the postinstall's link",
    );
    ok(std::fs::create_dir_all(nm.join(".bin")), ".bin");
    ok(
        std::os::unix::fs::symlink("../opencode-ai/bin/opencode.exe", nm.join(".bin/opencode")),
        "the launcher link",
    );
}

#[test]
fn a_selection_verifies_only_its_clis_and_opencode_keeps_one_build() {
    let version = versions()["OPENCODE_VERSION"].clone();
    for (build, kept) in [("auto", "avx2"), ("baseline", "baseline")] {
        let dir = ok(tempfile::tempdir(), "temp dir");
        let cli_dir = dir.path().join("cli");
        lay_out_opencode(&cli_dir, &version);
        let out = install_clis(
            &["opencode"],
            &[
                ("NANOCLAW_CLI_DIR", &cli_dir),
                ("NANOCLAW_OPENCODE_BUILD", Path::new(build)),
            ],
        );
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{build}: {stdout}\n{stderr}");
        assert!(stderr.contains("(reusing)"), "npm was not needed: {stderr}");
        assert!(
            stdout.contains(&format!("({version} {kept})")),
            "{build}: the {kept} build runs: {stdout}"
        );
        // Only the selection is verified: Claude Code and Codex are not installed here.
        assert!(
            !stdout.contains("claude") && !stdout.contains("codex"),
            "{stdout}"
        );
        let nm = cli_dir.join("node_modules");
        for gone in ["opencode-linux-x64", "opencode-linux-x64-baseline"] {
            assert!(
                !nm.join(gone).exists(),
                "{build}: {gone} is still installed"
            );
        }
        let exe = ok(
            std::fs::read_to_string(nm.join("opencode-ai/bin/opencode.exe")),
            "opencode.exe",
        );
        assert!(
            exe.contains(&format!("{version} {kept}")),
            "{build}: opencode.exe is the {kept} build"
        );
    }
}

/// A node bundle CLI (Gemini CLI) as npm leaves it: its package.json and the `.bin` link to its
/// script, which prints `version`; no native binary.
fn lay_out_gemini(cli_dir: &Path, version: &str) {
    let nm = cli_dir.join("node_modules");
    let package = nm.join("@google/gemini-cli");
    ok(
        std::fs::create_dir_all(package.join("bundle")),
        "gemini-cli",
    );
    ok(
        std::fs::write(
            package.join("package.json"),
            format!("{{\n  \"name\": \"@google/gemini-cli\",\n  \"version\": \"{version}\"\n}}\n"),
        ),
        "package.json",
    );
    write_executable(
        &package.join("bundle/gemini.js"),
        &format!("#!/bin/sh\necho '{version}'\n"),
    );
    ok(std::fs::create_dir_all(nm.join(".bin")), ".bin");
    ok(
        std::os::unix::fs::symlink(
            "../@google/gemini-cli/bundle/gemini.js",
            nm.join(".bin/gemini"),
        ),
        "the launcher link",
    );
}

/// Installing another CLI beside OpenCode keeps one OpenCode build too: npm reconciles the whole
/// folder and brings the deleted builds back (177 MB each), so the script trims them whatever the
/// selection. And a node bundle CLI (no native binary) is reused as installed.
#[test]
fn a_selection_without_opencode_still_keeps_one_opencode_build() {
    let pins = versions();
    let dir = ok(tempfile::tempdir(), "temp dir");
    let cli_dir = dir.path().join("cli");
    lay_out_opencode(&cli_dir, &pins["OPENCODE_VERSION"]);
    lay_out_gemini(&cli_dir, &pins["GEMINI_CLI_VERSION"]);
    let out = install_clis(&["gemini"], &[("NANOCLAW_CLI_DIR", &cli_dir)]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("(reusing)"), "npm was not needed: {stderr}");
    assert!(
        stdout.contains(&format!("({})", pins["GEMINI_CLI_VERSION"])),
        "{stdout}"
    );
    let nm = cli_dir.join("node_modules");
    for gone in ["opencode-linux-x64", "opencode-linux-x64-baseline"] {
        assert!(!nm.join(gone).exists(), "{gone} is still installed");
    }
    assert!(nm.join("opencode-ai/bin/opencode.exe").is_file());
}
