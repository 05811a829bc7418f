//! The repository is self-contained: no file in it refers to a document or path outside it (a
//! person who clones the repository has none of those). The contract the code implements lives
//! in `docs/contract/`; a citation points there.
//!
//! Every text file git knows (tracked, or new and not ignored) is scanned for the design
//! documents' names below, for absolute paths of the machine the checkout lies on (the
//! checkout's own path and every folder beside it, found at run time) and for a person's home
//! folder on any machine (`/home/<name>`, `/Users/<name>`; the image's own user `agent` aside); a
//! hit fails the test with `file:line`. Recorded CLI captures (`.json`/`.jsonl` under a `tests/fixtures/` folder) are
//! exempt from the absolute paths only: they are output of the machine they were captured on,
//! not references.
//!
//! The repository's other checks on itself live here too: ARCHITECTURE.md's crate table and
//! size, every `tests/*.rs` file in a test binary, and every cited decision id having its entry.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Texts that refer outside the repository: the design documents it was built from, and the
/// folder beside the checkout they lived in.
const OUTSIDE_REFERENCES: &[&str] = &[
    "SPEC §",
    "SPEC.md",
    "PROTOCOLS",
    "CRATES.md",
    "STYLE.md",
    "../shared",
];

/// This file: its pattern list names every pattern.
const THIS_FILE: &str = "tests/tests/self_contained.rs";

/// Where people's home folders are, on Linux and macOS.
const HOME_ROOTS: [&str; 2] = ["/home/", "/Users/"];

/// Users of the project's own image (container/Dockerfile), whose home a file may name.
const IMAGE_USERS: [&str; 1] = ["agent"];

#[test]
fn no_file_refers_outside_the_repository() {
    let root = repository_root();
    let files = match listed_files(&root) {
        Ok(files) => files,
        Err(err) => panic!("cannot list the repository's files: {err}"),
    };
    assert!(
        files.iter().any(|f| f == Path::new("Cargo.toml")),
        "the file list of {} does not hold Cargo.toml: {files:?}",
        root.display()
    );
    let machine_paths = machine_paths(&root);
    let mut hits = Vec::new();
    for file in &files {
        if file == Path::new(THIS_FILE) {
            continue;
        }
        // Binary files and files that are not UTF-8 hold no prose to check.
        let Ok(text) = std::fs::read_to_string(root.join(file)) else {
            continue;
        };
        let capture = is_recorded_capture(file);
        let patterns = OUTSIDE_REFERENCES.iter().copied().chain(
            machine_paths
                .iter()
                .map(String::as_str)
                .filter(|_| !capture),
        );
        let patterns: Vec<&str> = patterns.collect();
        for (number, line) in text.lines().enumerate() {
            if !capture {
                if let Some(home) = names_home_folder(line) {
                    hits.push(format!(
                        "{}:{}: names a home folder of some machine ({home:?}): {}",
                        file.display(),
                        number + 1,
                        line.trim()
                    ));
                }
            }
            for pattern in &patterns {
                if names_path(line, pattern) {
                    hits.push(format!(
                        "{}:{}: refers outside the repository ({pattern:?}): {}",
                        file.display(),
                        number + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        hits.is_empty(),
        "point these at docs/ (docs/contract/ holds the contract) or reword them to stand \
         alone:\n{}",
        hits.join("\n")
    );
}

/// Absolute paths of this machine a file could name: the checkout's own path and every entry
/// of the folder that holds it (on the machine this was built on, the design documents lay
/// beside the checkout). Not the entries of a shared temp folder (a clone in `/tmp`): those
/// belong to other programs, and an example like `/tmp/capture` in a doc would match whatever
/// happens to exist there.
fn machine_paths(root: &Path) -> Vec<String> {
    let mut paths = vec![root.display().to_string()];
    let Some(parent) = root.parent().filter(|p| p.parent().is_some()) else {
        return paths;
    };
    if is_shared_temp(parent) {
        return paths;
    }
    if let Ok(entries) = std::fs::read_dir(parent) {
        paths.extend(entries.flatten().map(|e| e.path().display().to_string()));
    }
    paths
}

/// Whether `folder` is a temp folder every program shares.
fn is_shared_temp(folder: &Path) -> bool {
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let folder = canonical(folder);
    [std::env::temp_dir(), "/tmp".into(), "/var/tmp".into()]
        .iter()
        .any(|temp| canonical(temp) == folder)
}

/// Whether `line` holds `pattern` as a whole path (an absolute path must not go on with more
/// of a name: `/tmp/a` is not in `/tmp/ab`).
fn names_path(line: &str, pattern: &str) -> bool {
    if !pattern.starts_with('/') {
        return line.contains(pattern);
    }
    line.match_indices(pattern).any(|(at, _)| {
        !line[at + pattern.len()..]
            .starts_with(|c: char| c.is_alphanumeric() || matches!(c, '-' | '_' | '.'))
    })
}

/// The first home folder of a person (`/home/alice`, `/Users/bob`) that `line` names as an
/// absolute path (not as the tail of another path: `/tmp/x/home/sessions` is none), if any.
fn names_home_folder(line: &str) -> Option<String> {
    HOME_ROOTS.iter().find_map(|root| {
        line.match_indices(root).find_map(|(at, _)| {
            let starts_a_path = line[..at]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | '~')));
            let name: String = line[at + root.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.'))
                .collect();
            (starts_a_path && !name.is_empty() && !IMAGE_USERS.contains(&name.as_str()))
                .then(|| format!("{root}{name}"))
        })
    })
}

#[test]
fn paths_of_other_machines_are_caught() {
    // What scripts/install-clis.sh once said, on the machine it was written on: the design
    // documents lay beside the checkout.
    let parent = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(err) => panic!("temp dir: {err}"),
    };
    let (checkout, shared) = (parent.path().join("main"), parent.path().join("shared"));
    for dir in [&checkout, &shared] {
        if let Err(err) = std::fs::create_dir(dir) {
            panic!("{}: {err}", dir.display());
        }
    }
    let line = format!(
        "# Keep them in sync with {}/PROTOCOLS.md (which was measured with these).",
        shared.display()
    );
    let paths = machine_paths(&checkout);
    assert!(
        paths.iter().any(|p| names_path(&line, p)),
        "{line:?} is not caught by {paths:?}"
    );
    // A clone directly in the shared temp folder: that folder's other entries are not ours.
    let in_temp = std::env::temp_dir().join("a-clone");
    assert_eq!(machine_paths(&in_temp), vec![in_temp.display().to_string()]);
    // A home folder of any machine; not the image's user, nor a path that merely has a `home`
    // folder inside it.
    assert_eq!(
        names_home_folder("see /home/alice/nanoclaw/.cli"),
        Some("/home/alice".to_owned())
    );
    assert_eq!(
        names_home_folder("CLAUDE_PATH=/Users/bob/bin/claude"),
        Some("/Users/bob".to_owned())
    );
    assert_eq!(names_home_folder("    HOME=/home/agent"), None);
    assert_eq!(
        names_home_folder("\"/tmp/x-1/home/sessions/a.jsonl\""),
        None
    );
    assert_eq!(names_home_folder("~/home/notes"), None);
}

/// The workspace root: the parent of this crate's folder.
fn repository_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Files git tracks plus new files it does not ignore, relative to `root`. Without git (an
/// unpacked source archive) the tree is walked instead, leaving out build output and installed
/// tools.
fn listed_files(root: &Path) -> Result<Vec<PathBuf>, String> {
    let output = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root)
        .output();
    match output {
        Ok(output) if output.status.success() => Ok(output
            .stdout
            .split(|&b| b == 0)
            .filter(|name| !name.is_empty())
            .map(|name| PathBuf::from(String::from_utf8_lossy(name).into_owned()))
            // A file deleted in the work tree but still tracked has nothing to check.
            .filter(|name| root.join(name).is_file())
            .collect()),
        _ => {
            let mut files = Vec::new();
            walk(root, Path::new(""), &mut files)?;
            Ok(files)
        }
    }
}

/// Folders that are not part of the source: build output, installed packages, and the hidden
/// folders of tools, demos and installed CLIs (all but the project's own `.ci` and `.config`).
fn is_generated(name: &str) -> bool {
    matches!(name, "target" | "node_modules")
        || (name.starts_with('.') && !matches!(name, ".ci" | ".config"))
}

fn walk(root: &Path, relative: &Path, files: &mut Vec<PathBuf>) -> Result<(), String> {
    let dir = root.join(relative);
    let entries = std::fs::read_dir(&dir).map_err(|err| format!("{}: {err}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|err| format!("{}: {err}", dir.display()))?;
        let name = entry.file_name();
        let path = relative.join(&name);
        let kind = entry
            .file_type()
            .map_err(|err| format!("{}: {err}", path.display()))?;
        if kind.is_dir() {
            if !is_generated(&name.to_string_lossy()) {
                walk(root, &path, files)?;
            }
        } else if kind.is_file() {
            files.push(path);
        }
    }
    Ok(())
}

/// A CLI's output recorded as a test fixture.
fn is_recorded_capture(file: &Path) -> bool {
    let in_fixtures = file
        .to_string_lossy()
        .split('/')
        .collect::<Vec<_>>()
        .windows(2)
        .any(|pair| pair == ["tests", "fixtures"]);
    let recorded = matches!(
        file.extension().and_then(|e| e.to_str()),
        Some("json" | "jsonl")
    );
    in_fixtures && recorded
}

/// ARCHITECTURE.md's table of crates (the one headed `| crate | path | public modules |`) names
/// every workspace member of the root Cargo.toml, by package name and folder, with the `pub mod`
/// items of its `src/lib.rs`: a crate or public module added, moved or made private without the
/// map following fails here, naming the difference.
#[test]
fn architecture_lists_every_crate_and_its_public_modules() {
    let root = repository_root();
    let read = |path: &Path| {
        std::fs::read_to_string(root.join(path))
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
    };
    let mut actual = Vec::new();
    for folder in workspace_members(&read(Path::new("Cargo.toml"))) {
        let manifest = read(&Path::new(&folder).join("Cargo.toml"));
        let name = package_name(&manifest)
            .unwrap_or_else(|| panic!("{folder}/Cargo.toml has no [package] name"));
        let lib = root.join(&folder).join("src/lib.rs");
        let modules = match std::fs::read_to_string(&lib) {
            Ok(text) => public_modules(&text),
            Err(_) => Vec::new(),
        };
        actual.push((name, folder, modules));
    }
    actual.sort();
    let mut listed = crate_table(&read(Path::new("ARCHITECTURE.md")))
        .expect("ARCHITECTURE.md has a table headed `| crate | path | public modules |`");
    listed.sort();
    let show = |rows: &[(String, String, Vec<String>)]| {
        rows.iter()
            .map(|(name, path, modules)| format!("{name} {path}: {}\n", modules.join(", ")))
            .collect::<String>()
    };
    assert_eq!(
        show(&listed),
        show(&actual),
        "ARCHITECTURE.md's crate table (left) differs from Cargo.toml and each src/lib.rs (right)"
    );
}

/// Every `tests/*.rs` file of every workspace crate is compiled into a test binary: a module of
/// the crate's one binary `tests/all.rs` (`mod name;`, with or without `#[path]`) or a `[[test]]`
/// of its own in the crate's Cargo.toml. With `autotests = false` cargo builds nothing else, so
/// a file named by neither would silently never run; without it, the file would be a binary of
/// its own that issue 42's "one test binary per crate" does not allow unnamed.
#[test]
fn every_integration_test_file_is_in_a_test_binary() {
    let root = repository_root();
    let read = |path: &Path| {
        std::fs::read_to_string(root.join(path))
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
    };
    let (mut checked, mut orphans) = (Vec::new(), Vec::new());
    for folder in workspace_members(&read(Path::new("Cargo.toml"))) {
        let crate_dir = Path::new(&folder);
        let Ok(entries) = std::fs::read_dir(root.join(crate_dir).join("tests")) else {
            continue;
        };
        let mut named = test_targets(&read(&crate_dir.join("Cargo.toml")));
        if let Ok(all) = std::fs::read_to_string(root.join(crate_dir).join("tests/all.rs")) {
            named.extend(
                declared_modules(&all)
                    .into_iter()
                    .map(|m| format!("tests/{m}")),
            );
        }
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("listing {folder}/tests: {e}"));
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".rs") || !entry.path().is_file() {
                continue;
            }
            let file = crate_dir.join("tests").join(&name);
            if named.iter().any(|n| n == &format!("tests/{name}")) {
                checked.push(file);
            } else {
                orphans.push(file.display().to_string());
            }
        }
    }
    assert!(
        orphans.is_empty(),
        "test files no test binary compiles (they never run): {orphans:?}; name each in its \
         crate's tests/all.rs (`#[path = \"x.rs\"] mod x;`), or give it a [[test]] of its own in \
         the crate's Cargo.toml with the reason it needs a process of its own"
    );
    assert!(
        checked.iter().any(|f| f == Path::new(THIS_FILE)),
        "{THIS_FILE} is one of the files checked: {checked:?}"
    );
}

/// ARCHITECTURE.md stays the map (docs/decisions/repo.md#D-REPO-04): at most 200 lines, none
/// longer than 100 characters; details belong in `docs/decisions/`, linked by id.
#[test]
fn architecture_is_a_short_map() {
    let path = repository_root().join("ARCHITECTURE.md");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let lines: Vec<&str> = text.lines().collect();
    let long: Vec<String> = lines
        .iter()
        .enumerate()
        .filter(|(_, line)| line.chars().count() > 100)
        .map(|(index, line)| format!("line {}: {} characters", index + 1, line.chars().count()))
        .collect();
    assert!(
        lines.len() <= 200 && long.is_empty(),
        "ARCHITECTURE.md has {} lines (at most 200) and lines over 100 characters: {long:?}; \
         move the detail into a docs/decisions/ entry and cite its id",
        lines.len()
    );
    assert!(
        lines.iter().any(|line| line.starts_with("## ")),
        "ARCHITECTURE.md has its sections"
    );
}

/// Every decision or measurement id a file cites (`D-DB-03`, `M-PERF-02`) has its entry: an
/// `<a id="…">` anchor in a subject file of `docs/decisions/` or `docs/measurements/`; and every
/// entry has its line in its folder's README index. The READMEs' examples of the format (in code
/// spans and fences) are not citations.
#[test]
fn every_cited_decision_id_exists() {
    let root = repository_root();
    let files = listed_files(&root).unwrap_or_else(|e| panic!("listing the files: {e}"));
    let mut anchors = Vec::new();
    for folder in ["docs/decisions", "docs/measurements"] {
        let index = std::fs::read_to_string(root.join(folder).join("README.md"))
            .unwrap_or_else(|e| panic!("reading {folder}/README.md: {e}"));
        for file in files
            .iter()
            .filter(|f| f.parent() == Some(Path::new(folder)))
        {
            let Some(name) = file.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if name == "README.md" || !name.ends_with(".md") {
                continue;
            }
            let text = std::fs::read_to_string(root.join(file)).unwrap_or_default();
            for id in entry_anchors(&text) {
                assert!(
                    index.contains(&format!("({name}#{id})")),
                    "{folder}/README.md's index has no line for {name}#{id}"
                );
                anchors.push(id);
            }
        }
    }
    assert!(
        anchors.iter().any(|id| id == "D-REPO-04"),
        "the anchors read include D-REPO-04: {anchors:?}"
    );
    let mut missing = Vec::new();
    for file in &files {
        if file == Path::new(THIS_FILE) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(file)) else {
            continue;
        };
        let is_index = file.file_name().is_some_and(|n| n == "README.md")
            && file.starts_with("docs")
            && (file.starts_with("docs/decisions") || file.starts_with("docs/measurements"));
        let text = if is_index { outside_code(&text) } else { text };
        for id in cited_ids(&text) {
            if !anchors.contains(&id) {
                missing.push(format!("{}: {id}", file.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "cited ids with no entry in docs/decisions/ or docs/measurements/ (ids are never \
         renumbered; cite the entry's id): {missing:?}"
    );
}

#[test]
fn the_crate_table_parser_reads_the_documented_shape() {
    let doc = "intro\n\n| Crate | Path | Public modules |\n|---|:--|---|\n\
               | `schema` | `schema/` | `db`, `rows` |\n| | | `cron` |\n\
               | `logging` | logging | — |\n\nafter\n";
    assert_eq!(
        crate_table(doc),
        Some(vec![
            (
                "schema".into(),
                "schema".into(),
                vec!["cron".into(), "db".into(), "rows".into()]
            ),
            ("logging".into(), "logging".into(), vec![]),
        ])
    );
    assert_eq!(
        crate_table("| crate | path |\n|---|---|\n| a | a |\n"),
        None
    );
    let lib =
        "//! pub mod not_this;\npub mod db;\n#[cfg(feature = \"x\")]\npub mod testing {\n    \
               pub mod inner;\n}\npub(crate) mod private;\nmod hidden;\n";
    assert_eq!(
        public_modules(lib),
        vec!["db".to_string(), "testing".to_string()]
    );
    let cargo =
        "[workspace]\nresolver = \"2\"\nmembers = [\"a\",\n  \"b/c\"]\n[workspace.package]\n";
    assert_eq!(
        workspace_members(cargo),
        vec!["a".to_string(), "b/c".to_string()]
    );
    assert_eq!(
        package_name("[package]\nname = \"e2e\"\n[[bin]]\nname = \"x\"\n"),
        Some("e2e".to_string())
    );
    let manifest = "[package]\nname = \"x\"\n[[test]]\nname = \"all\"\npath = \"tests/all.rs\"\n\
                    [[bench]]\nname = \"b\"\n[[test]]\nname = \"solo\"\nharness = false\n";
    assert_eq!(
        test_targets(manifest),
        vec!["tests/all.rs", "tests/solo.rs"]
    );
    let all = "//! mod not_this;\n#[path = \"a.rs\"]\nmod a;\n#[path = \"support/s.rs\"]\n\
               #[allow(dead_code)]\nmod helper;\nmod b;\n// mod c;\npub mod d;\n";
    assert_eq!(
        declared_modules(all),
        vec!["a.rs", "support/s.rs", "b.rs", "d.rs"]
    );
    assert_eq!(
        cited_ids("see D-DB-03, docs/x.md#M-PERF-12; not XD-DB-03, D-DB-3, D-DB-0123, D-db-01"),
        vec!["D-DB-03", "M-PERF-12"]
    );
    assert_eq!(
        entry_anchors("<a id=\"D-LOOP-06\"></a>\n## D-LOOP-06: x\n<a id=\"other\"></a>"),
        vec!["D-LOOP-06"]
    );
    assert_eq!(
        outside_code("a D-X-01 `D-X-02` b\n```\nD-X-03\n```\nD-X-04\n"),
        "a D-X-01   b\nD-X-04\n"
    );
}

/// The files a crate's Cargo.toml makes test binaries of (`[[test]]` sections), relative to the
/// crate: its `path`, or `tests/<name>.rs` when it has none (cargo's default).
fn test_targets(manifest: &str) -> Vec<String> {
    let mut targets: Vec<(Option<String>, Option<String>)> = Vec::new();
    let mut in_test = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_test = line == "[[test]]";
            if in_test {
                targets.push((None, None));
            }
            continue;
        }
        let Some((name, path)) = targets.last_mut().filter(|_| in_test) else {
            continue;
        };
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = Some(value.trim().trim_matches('"').to_string());
        match key.trim() {
            "name" => *name = value,
            "path" => *path = value,
            _ => {}
        }
    }
    targets
        .into_iter()
        .filter_map(|(name, path)| path.or_else(|| name.map(|n| format!("tests/{n}.rs"))))
        .map(|path| path.trim_start_matches("./").to_string())
        .collect()
}

/// The files an `all.rs` declares as modules, relative to its folder: the `#[path = "…"]` of a
/// `mod name;`, or `name.rs` when it has none. Comment lines are skipped.
fn declared_modules(all: &str) -> Vec<String> {
    let mut files = Vec::new();
    let mut path = None;
    for line in all.lines().map(str::trim) {
        if line.starts_with("//") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("#[path") {
            path = rest
                .split('"')
                .nth(1)
                .map(|p| p.trim_start_matches("./").to_string());
            continue;
        }
        let declaration = line.strip_prefix("pub ").unwrap_or(line);
        if let Some(name) = declaration
            .strip_prefix("mod ")
            .and_then(|rest| rest.strip_suffix(';'))
        {
            files.push(path.take().unwrap_or_else(|| format!("{}.rs", name.trim())));
        } else if !line.starts_with("#[") {
            path = None;
        }
    }
    files
}

/// The ids of the `<a id="D-…">` / `<a id="M-…">` anchors in a subject file.
fn entry_anchors(text: &str) -> Vec<String> {
    text.split("<a id=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter(|id| !cited_ids(id).is_empty())
        .map(str::to_string)
        .collect()
}

/// The decision and measurement ids in `text`: `D-` or `M-`, capital letters, `-`, two or three
/// digits, not inside a longer word.
fn cited_ids(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut ids = Vec::new();
    for (at, _) in text.match_indices('-') {
        if at == 0 || !matches!(bytes[at - 1], b'D' | b'M') {
            continue;
        }
        let start = at - 1;
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
            continue;
        }
        let tag = bytes[at + 1..]
            .iter()
            .take_while(|b| b.is_ascii_uppercase())
            .count();
        let dash = at + 1 + tag;
        if tag == 0 || bytes.get(dash) != Some(&b'-') {
            continue;
        }
        let digits = bytes[dash + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let end = dash + 1 + digits;
        let word_goes_on = bytes
            .get(end)
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_');
        if (2..=3).contains(&digits) && !word_goes_on {
            ids.push(text[start..end].to_string());
        }
    }
    ids
}

/// `text` without its fenced code blocks and inline code spans (the READMEs' examples).
fn outside_code(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            let prose: Vec<&str> = line.split('`').step_by(2).collect();
            out.push_str(&prose.join(" "));
            out.push('\n');
        }
    }
    out
}

/// The `members = [...]` folders of a workspace manifest.
fn workspace_members(manifest: &str) -> Vec<String> {
    let Some(start) = manifest.find("members") else {
        return Vec::new();
    };
    let rest = &manifest[start..];
    let (Some(open), Some(close)) = (rest.find('['), rest.find(']')) else {
        return Vec::new();
    };
    rest[open + 1..close]
        .split(',')
        .map(|item| item.trim().trim_matches('"').to_string())
        .filter(|item| !item.is_empty())
        .collect()
}

/// The `name` of a manifest's `[package]` section.
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package {
            if let Some(value) = line.strip_prefix("name") {
                let value = value.trim_start().strip_prefix('=')?.trim();
                return Some(value.trim_matches('"').to_string());
            }
        }
    }
    None
}

/// The names of a lib.rs's top-level `pub mod` items (inline or in files), sorted.
fn public_modules(lib: &str) -> Vec<String> {
    let mut names: Vec<String> = lib
        .lines()
        .filter_map(|line| line.strip_prefix("pub mod "))
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .collect();
    names.sort();
    names
}

/// The rows of the first Markdown table whose header cells are `crate`, `path` and `public
/// modules` (any case): (crate, path without a trailing `/`, modules sorted). Backticks are
/// dropped; modules are comma-separated, and `—`, `-` or an empty cell means none; a row whose
/// crate and path cells are empty adds its modules to the row above.
fn crate_table(doc: &str) -> Option<Vec<(String, String, Vec<String>)>> {
    let cells = |line: &str| -> Vec<String> {
        let line = line.trim().trim_start_matches('|').trim_end_matches('|');
        line.split('|')
            .map(|cell| cell.replace('`', "").trim().to_string())
            .collect()
    };
    let mut lines = doc.lines();
    lines.by_ref().find(|line| {
        let header: Vec<String> = cells(line).iter().map(|c| c.to_lowercase()).collect();
        line.trim_start().starts_with('|') && header == ["crate", "path", "public modules"]
    })?;
    let mut rows: Vec<(String, String, Vec<String>)> = Vec::new();
    for line in lines {
        if !line.trim_start().starts_with('|') {
            break;
        }
        let row = cells(line);
        if row
            .iter()
            .all(|c| c.chars().all(|ch| matches!(ch, '-' | ':' | ' ')))
        {
            continue; // the separator row
        }
        let [name, path, modules] = <[String; 3]>::try_from(row).ok()?;
        let modules = modules
            .split(',')
            .map(|m| m.trim().to_string())
            .filter(|m| !m.is_empty() && m != "—" && m != "-");
        match rows.last_mut() {
            // A row with no crate and no path continues the one above (short lines).
            Some((_, _, above)) if name.is_empty() && path.is_empty() => above.extend(modules),
            _ => rows.push((
                name,
                path.trim_end_matches('/').to_string(),
                modules.collect(),
            )),
        }
    }
    for (_, _, modules) in &mut rows {
        modules.sort();
    }
    Some(rows)
}
