//! Scenarios of secrets the agent could read: host secrets and the model key are absent from
//! every `/proc/*/environ`, `/proc/*/cmdline` and file the agent's user can read (issue 10,
//! point 4).
//!
//! The tests run as root, and root reads every `/proc/*/environ`; so the runner is started as
//! root with `NANOCLAW_RUN_AS` set to an unprivileged uid ([`AGENT_UID`]), as the image starts
//! it: it reads the model key from a root-only file (`*_FILE`), drops to that uid, and the CLI
//! and the agent's shell run as it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::fake_model::{FakeModel, Step};
use crate::harness::{Session, FAKE_KEY};
use crate::support::{ok, some, WAIT};

/// The unprivileged uid (and gid) the agent runs as: `nobody`, which owns nothing here.
pub const AGENT_UID: u32 = 65534;

/// Host secrets put into the runner's environment. The shell command finds them by a pattern
/// (`ho[s]t-secret-…`) that does not contain them, so its own command line is no false alarm.
pub const HOST_SECRETS: [(&str, &str); 5] = [
    ("GITHUB_TOKEN", "host-secret-github-4417"),
    ("MY_SECRET", "host-secret-mine-2290"),
    ("AWS_SECRET_ACCESS_KEY", "host-secret-aws-7731"),
    (
        "DATABASE_URL",
        "postgres://app:host-secret-db-5521@db.internal/app",
    ),
    ("DEPLOY_TOKEN", "host-secret-deploy-8802"),
];

/// The markers of [`HOST_SECRETS`], as they would appear in a leak.
pub fn host_secret_markers() -> Vec<&'static str> {
    vec![
        "host-secret-github-4417",
        "host-secret-mine-2290",
        "host-secret-aws-7731",
        "host-secret-db-5521",
        "host-secret-deploy-8802",
    ]
}

/// A POSIX shell command that reads every `/proc/*/environ` and `/proc/*/cmdline` and every
/// file under `roots` (plus `$HOME`) that its user can read, and prints only what it found:
/// `HIT <match>` per host-secret or model-key match, then `own-environ=<0|1> proc-files=<n>
/// files=<n>` (own-environ proves the reads work: it read its own shell's environment).
pub fn search_command(roots: &[&Path]) -> String {
    let roots: Vec<String> = roots.iter().map(|r| format!("'{}'", r.display())).collect();
    format!(
        r#"self=/proc/$$/environ; {{ for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do if tr '\0' '\n' 2>/dev/null < "$f"; then echo; echo "READ $f"; fi; done; find {roots} "$HOME" -type f -readable -exec sh -c 'for f; do if cat "$f"; then echo; echo "READ $f"; fi; done' sh {{}} +; }} 2>/dev/null | tr '\0' '\n' | awk -v self="$self" '$0 == "READ " self {{ own = 1 }} /^READ \/proc\// {{ procs++; next }} /^READ / {{ files++; next }} {{ while (match($0, /ho[s]t-secret-[a-z]+-[0-9]+|s[k]-fake-e2e/)) {{ print "HIT " substr($0, RSTART, RLENGTH); $0 = substr($0, RSTART + RLENGTH) }} }} END {{ print "own-environ=" own + 0 " proc-files=" procs + 0 " files=" files + 0 }}'"#,
        roots = roots.join(" ")
    )
}

/// The model step that makes `provider`'s agent run `command` in its shell tool.
pub fn shell_step(provider: &str, command: &str) -> Step {
    match provider {
        "claude" => Step::raw_tool_call(
            "Bash",
            json!({"command": command, "description": "search for secrets", "timeout": 120000}),
        ),
        "codex" => Step::raw_tool_call(
            "exec_command",
            json!({"cmd": command, "yield_time_ms": 30000}),
        ),
        "opencode" => Step::raw_tool_call(
            "bash",
            json!({"command": command, "description": "search for secrets"}),
        ),
        other => panic!("no shell tool known for provider {other}: add it to secrets::shell_step"),
    }
}

/// Gives `root` and everything under it to `uid:gid` (the workspace of a runner that drops to
/// that user must be its own, as `chown -R agent:agent /workspace` does in the image).
pub fn chown_tree(root: &Path, uid: u32, gid: u32) {
    ok(
        std::os::unix::fs::lchown(root, Some(uid), Some(gid)),
        "chown",
    );
    if root.is_symlink() || !root.is_dir() {
        return;
    }
    for entry in ok(std::fs::read_dir(root), "reading a dir").flatten() {
        chown_tree(&entry.path(), uid, gid);
    }
}

/// A root-only folder (mode 0700) holding `name` = `secret` (mode 0400): a secret mounted as a
/// file that the agent's user cannot read. Keep the returned dir alive.
pub fn root_only_secret(name: &str, secret: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = ok(
        tempfile::Builder::new()
            .prefix("nanoclaw-secrets-")
            .tempdir(),
        "secret dir",
    );
    ok(
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)),
        "chmod",
    );
    let path = dir.path().join(name);
    ok(std::fs::write(&path, format!("{secret}\n")), "secret file");
    ok(
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)),
        "chmod",
    );
    (dir, path)
}

/// What [`search_command`] printed: (hits, own-environ read, /proc files read, other files read).
pub fn parse_search(output: &str) -> (Vec<String>, bool, u64, u64) {
    let hits = output
        .lines()
        .filter_map(|l| l.trim().strip_prefix("HIT "))
        .map(str::to_owned)
        .collect();
    let field = |name: &str| -> u64 {
        output
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (
        hits,
        field("own-environ=") == 1,
        field("proc-files="),
        field("files="),
    )
}

/// Acceptance (issue 10, point 4), per CLI: the runner starts as root with host secrets in its
/// environment and the model key in a root-only file (`ANTHROPIC_API_KEY_FILE` /
/// `OPENAI_API_KEY_FILE`), drops to an unprivileged uid (`NANOCLAW_RUN_AS`), and the agent's
/// shell, reading every `/proc/*/environ`, `/proc/*/cmdline` and readable file of the
/// workspace, its home and the secret folder, finds no host secret and no model key; while the
/// model still gets the key.
pub fn agent_reads_no_secret_anywhere(provider: &str) {
    let (secret_dir, key_file) = root_only_secret("model.key", FAKE_KEY);
    let mut session = Session::new();
    let command = search_command(&[&session.workspace, secret_dir.path()]);
    let model = fake_model([shell_step(provider, &command), Step::text("Searched.")]);
    chown_tree(&session.workspace, AGENT_UID, AGENT_UID);
    let key_path = key_file.display().to_string();
    let run_as = format!("{AGENT_UID}:{AGENT_UID}");
    let mut env: Vec<(&str, &str)> = vec![
        ("NANOCLAW_RUN_AS", &run_as),
        // The harness passes the key in the environment; here it comes from the file only.
        ("ANTHROPIC_API_KEY", ""),
        ("OPENAI_API_KEY", ""),
        ("ANTHROPIC_API_KEY_FILE", &key_path),
        ("OPENAI_API_KEY_FILE", &key_path),
    ];
    env.extend(HOST_SECRETS);
    session.start_runner(provider, &model, &env);
    let runner = some(session.runner_pid(), "the runner's pid");
    let status = ok(
        std::fs::read_to_string(format!("/proc/{runner}/status")),
        "the runner's status",
    );
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("65534")),
        "the runner dropped to uid {AGENT_UID}:\n{status}\n{}",
        session.runner_log()
    );
    let id = session.send_chat("look for secrets").id;
    session.wait_completed(&id, WAIT);
    let request = some(model.model_requests().pop(), "a model request");
    let output = request.tool_results().join("\n");
    eprintln!("[{provider}] the agent's search printed:\n{output}");
    let (hits, own, procs, files) = parse_search(&output);
    assert!(
        own && procs > 0 && files > 0,
        "the search really read files (its own environ, /proc, the workspace): {output}"
    );
    for marker in host_secret_markers() {
        assert!(
            !output.contains(marker),
            "the host secret {marker} is readable by the agent: {hits:?}\n{output}"
        );
    }
    assert!(
        !output.contains(FAKE_KEY),
        "the model key is readable by the agent (the credential proxy keeps it in the runner): \
         {hits:?}\n{output}"
    );
    assert!(hits.is_empty(), "{hits:?}");
    // The key from the root-only file still reaches the model (directly or via the proxy).
    let sent = model.requests().iter().any(|r| {
        r.header("x-api-key") == Some(FAKE_KEY)
            || r.header("authorization") == Some(format!("Bearer {FAKE_KEY}").as_str())
    });
    assert!(sent, "the model got the key read from {key_path}");
    session.stop_runner();
}

fn fake_model(steps: impl IntoIterator<Item = Step>) -> FakeModel {
    ok(
        FakeModel::start_with_script(steps),
        "starting the fake model",
    )
}
