//! The Kubernetes manifests of `container/k8s/`, as far as they can be checked without a cluster
//! (none runs on the project's machines): every manifest validates against the Kubernetes API
//! schemas of the pinned versions through `scripts/validate-k8s.sh`, offline, and the script
//! fails on a manifest with a misspelt field, a wrong type, a kind it has no schema for, or no
//! resource at all; and the served session (`session-serve.yaml`) holds together: `nanoclaw
//! serve` beside the runner on the same volume with flags of the API's contract, the token file
//! from a Secret the template defines, the Service, the NetworkPolicy and the host Job agreeing on
//! names, labels and the port.
//!
//! Needs the validator installed (`scripts/validate-k8s.sh --install`; `scripts/test.sh` does it
//! first). The manifests are read as data with the PyYAML of that same virtualenv.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::dockerfile;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The validator's virtualenv (as `scripts/validate-k8s.sh` places it).
fn venv() -> PathBuf {
    std::env::var_os("NANOCLAW_K8S_VALIDATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".tools/kubernetes-validate"))
}

fn validate(files: &[&Path]) -> Output {
    Command::new("bash")
        .arg(repo_root().join("scripts/validate-k8s.sh"))
        .arg("--offline")
        .args(files)
        .output()
        .unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "status {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The documents of a manifest file, as JSON.
fn documents(relative: &str) -> Vec<Value> {
    let python = venv().join("bin/python3");
    assert!(
        python.exists(),
        "{} is missing: run scripts/validate-k8s.sh --install",
        python.display()
    );
    let output = Command::new(python)
        .args([
            "-c",
            "import json, sys, yaml\n\
             docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]\n\
             json.dump(docs, sys.stdout)",
        ])
        .arg(repo_root().join(relative))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn kind<'a>(documents: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = documents.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind}: {documents:#?}");
    found[0]
}

fn named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .find(|item| item["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list:#}"))
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"))
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect()
}

/// The `--flag`s of the synopsis in `docs/contract/api.md` that starts with `start` (up to the
/// next blank line).
fn contract_flags(start: &str) -> Vec<String> {
    let api = std::fs::read_to_string(repo_root().join("docs/contract/api.md")).unwrap();
    let at = api
        .find(start)
        .unwrap_or_else(|| panic!("api.md has no synopsis starting with {start}"));
    let synopsis = api[at..].split("\n\n").next().unwrap();
    synopsis
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|word| word.starts_with("--"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_manifest_validates_offline_and_a_broken_one_fails() {
    let output = validate(&[]);
    assert!(output.status.success(), "{}", text(&output));
    let manifests = std::fs::read_dir(repo_root().join("container/k8s"))
        .unwrap()
        .filter(|entry| {
            let name = entry.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.ends_with(".yaml") || name.ends_with(".yml")
        })
        .count();
    assert!(manifests >= 4, "{manifests} manifests");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("ok: {manifests} files,")),
        "{}",
        text(&output)
    );

    // One fault at a time in a copy of the served session: each fails, naming where.
    let good =
        std::fs::read_to_string(repo_root().join("container/k8s/session-serve.yaml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "a misspelt field",
            good.replacen("runAsNonRoot: true", "runAsNonRoots: true", 1),
            "'runAsNonRoots' was unexpected",
        ),
        (
            "a wrong type",
            good.replacen("containerPort: 7450", "containerPort: \"7450\"", 1),
            "containerPort: '7450' is not of type 'integer'",
        ),
        (
            "a kind without a schema",
            good.replacen("kind: NetworkPolicy", "kind: NetworkPolcy", 1),
            "Couldn't find schema for kind NetworkPolcy",
        ),
        (
            "no resource",
            "# nothing\n".to_owned(),
            "holds no Kubernetes resource",
        ),
    ];
    for (what, manifest, said) in cases {
        assert_ne!(manifest, good, "{what}: the fault was not made");
        let file = dir.path().join("broken.yaml");
        std::fs::write(&file, manifest).unwrap();
        let output = validate(&[&file]);
        assert_eq!(output.status.code(), Some(1), "{what}: {}", text(&output));
        assert!(text(&output).contains(said), "{what}: {}", text(&output));
    }
}

/// `session-serve.yaml`: serve beside the runner on one volume, with the contract's flags, and the
/// Service, the NetworkPolicy, the Secrets and the host Job agreeing with it.
#[test]
fn the_served_session_holds_together() {
    let docs = documents("container/k8s/session-serve.yaml");
    let service = kind(&docs, "Service");
    let set = kind(&docs, "StatefulSet");
    let policy = kind(&docs, "NetworkPolicy");
    let pod = &set["spec"]["template"];
    let spec = &pod["spec"];
    let labels = &pod["metadata"]["labels"];
    let session = labels["nanoclaw.dev/session"].as_str().unwrap();
    let namespace = set["metadata"]["namespace"].as_str().unwrap();

    // One Pod at a time on the session's ReadWriteOnce volume.
    assert_eq!(set["spec"]["replicas"], 1);
    assert_eq!(set["spec"]["selector"]["matchLabels"], *labels);
    let claim = &set["spec"]["volumeClaimTemplates"][0];
    assert_eq!(strings(&claim["spec"]["accessModes"]), ["ReadWriteOnce"]);
    let volume = claim["metadata"]["name"].as_str().unwrap();
    // No fsGroup: it would open the provider-key Secret to the agent's group.
    assert!(spec["securityContext"].get("fsGroup").is_none(), "{spec:#}");

    // The image's binaries, where the Dockerfile copies them.
    let dockerfile = std::fs::read_to_string(repo_root().join("container/Dockerfile")).unwrap();
    let copy = dockerfile::instructions(&dockerfile)
        .into_iter()
        .find(|(k, a)| k == "COPY" && a.starts_with("--from=build"))
        .map(|(_, a)| a)
        .unwrap();
    let bin_dir = copy.split_whitespace().last().unwrap();
    let nanoclaw = format!("{bin_dir}nanoclaw");

    // The runner's /workspace and serve's --workspace are the same volume.
    let agent = named(&spec["containers"], "agent");
    let serve = named(&spec["containers"], "serve");
    assert_eq!(
        named(&agent["volumeMounts"], volume)["mountPath"],
        "/workspace"
    );
    assert_eq!(strings(&serve["command"]), [nanoclaw.as_str()]);
    let args = strings(&serve["args"]);
    let flag = |name: &str| {
        let at = args
            .iter()
            .position(|a| *a == name)
            .unwrap_or_else(|| panic!("{name}: {args:?}"));
        args[at + 1]
    };
    assert_eq!(args[0], "serve");
    let workspace = flag("--workspace");
    assert_eq!(
        named(&serve["volumeMounts"], volume)["mountPath"],
        workspace
    );
    // The folder's name is the session's name in the API.
    assert_eq!(
        Path::new(workspace).file_name().unwrap().to_str().unwrap(),
        session
    );
    assert!(args.contains(&"--plain-http"), "{args:?}");
    let port: u16 = flag("--listen")
        .strip_prefix("0.0.0.0:")
        .unwrap()
        .parse()
        .unwrap();
    let served = contract_flags("nanoclaw serve (--workspace");
    for arg in args.iter().filter(|a| a.starts_with("--")) {
        assert!(
            served.iter().any(|f| f == arg),
            "{arg} is not a flag of nanoclaw serve in api.md: {served:?}"
        );
    }

    // The token file: one file of the serve-only Secret (subPath: a Secret's own files are
    // symlinks, which serve refuses), read-only, never in the runner's container.
    let tokens = flag("--tokens");
    let mount = serve["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == tokens)
        .unwrap_or_else(|| panic!("nothing mounted at {tokens}"));
    assert_eq!(mount["readOnly"], true);
    let key = mount["subPath"].as_str().expect("a subPath mount");
    let secret = &named(&spec["volumes"], mount["name"].as_str().unwrap())["secret"];
    assert_eq!(
        secret["defaultMode"], 0o444,
        "serve (uid 1000) reads a root-owned file"
    );
    let secrets = documents("container/k8s/tokens-secret.yaml");
    let defined = |name: &str, key: &str| {
        secrets.iter().any(|s| {
            s["kind"] == "Secret"
                && s["metadata"]["name"] == name
                && s["stringData"].get(key).is_some()
        })
    };
    assert!(
        defined(secret["secretName"].as_str().unwrap(), key),
        "{secrets:#?}"
    );
    assert!(
        agent["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["name"] != mount["name"]),
        "the runner's container never sees the token file"
    );

    // serve: non-root, no capability, read-only root; probed on the token-less health route.
    let context = &serve["securityContext"];
    assert_eq!(context["runAsNonRoot"], true);
    assert_eq!(context["runAsUser"], 1000);
    assert_eq!(context["allowPrivilegeEscalation"], false);
    assert_eq!(context["readOnlyRootFilesystem"], true);
    assert_eq!(strings(&context["capabilities"]["drop"]), ["ALL"]);
    assert!(context["capabilities"].get("add").is_none());
    let api = named(&serve["ports"], "api");
    assert_eq!(api["containerPort"], port);
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(serve[probe]["httpGet"]["path"], "/v1/health", "{probe}");
        assert_eq!(serve[probe]["httpGet"]["port"], "api", "{probe}");
    }
    // The runner's health must not take serve out of the Service.
    assert!(agent.get("readinessProbe").is_none(), "{agent:#}");

    // The volume's owner is the agent's uid before anything opens it; the DB exists before the
    // runner starts.
    let owner = named(&spec["initContainers"], "workspace-owner");
    assert_eq!(strings(&owner["command"])[1..], ["1000:1000", "/workspace"]);
    assert_eq!(
        strings(&owner["securityContext"]["capabilities"]["add"]),
        ["CHOWN"]
    );
    let init = named(&spec["initContainers"], "session-db");
    assert_eq!(strings(&init["command"]), [nanoclaw.as_str()]);
    assert_eq!(
        strings(&init["args"]),
        ["init", "--workspace", "/workspace"]
    );

    // The Service and the NetworkPolicy select this Pod and its port.
    assert_eq!(service["spec"]["type"], "ClusterIP");
    assert_eq!(service["spec"]["selector"], *labels);
    let service_port = named(&service["spec"]["ports"], "api");
    assert_eq!(service_port["port"], port);
    assert_eq!(service_port["targetPort"], "api");
    assert_eq!(set["spec"]["serviceName"], service["metadata"]["name"]);
    assert_eq!(policy["spec"]["podSelector"]["matchLabels"], *labels);
    let rule = &policy["spec"]["ingress"][0];
    assert_eq!(rule["ports"][0]["port"], "api");
    let host_labels = &rule["from"][0]["podSelector"]["matchLabels"];

    // The host Job: admitted by the policy, at the Service's address, with a token file the CLI
    // accepts (0400, read by its owner) from a Secret the template defines.
    let job = documents("container/k8s/host-status-job.yaml");
    let job = kind(&job, "Job");
    let template = &job["spec"]["template"];
    for (label, value) in host_labels.as_object().unwrap() {
        assert_eq!(template["metadata"]["labels"][label], *value, "{label}");
    }
    let client = &template["spec"]["containers"][0];
    assert_eq!(strings(&client["command"]), [nanoclaw.as_str()]);
    let args = strings(&client["args"]);
    let flag = |name: &str| args[args.iter().position(|a| *a == name).unwrap() + 1];
    assert_eq!(
        flag("--url"),
        format!(
            "http://{}.{namespace}.svc:{port}",
            service["metadata"]["name"].as_str().unwrap()
        )
    );
    assert_eq!(flag("--session"), session);
    let token_file = Path::new(flag("--token-file"));
    let mount = client["volumeMounts"][0]["mountPath"].as_str().unwrap();
    assert_eq!(token_file.parent().unwrap(), Path::new(mount));
    let secret = &template["spec"]["volumes"][0]["secret"];
    assert_eq!(secret["defaultMode"], 0o400);
    assert_eq!(
        client["securityContext"]["runAsUser"], 0,
        "the owner of a Secret's files"
    );
    let key = token_file.file_name().unwrap().to_str().unwrap();
    assert!(defined(secret["secretName"].as_str().unwrap(), key));
    let cli = contract_flags("nanoclaw --url URL");
    for arg in args.iter().filter(|a| a.starts_with("--")) {
        assert!(
            cli.iter().any(|f| f == arg),
            "{arg} is not in api.md's CLI: {cli:?}"
        );
    }
}
