//! The path a `Read`/`Write`/`Edit` call touches, as a rule's pattern sees it ([`Target`]).

use std::path::{Component, Path, PathBuf};

/// A call's path, normalised: `.` and `..` removed, symlinks resolved for the part that exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
    /// The absolute form (relative, but normalised, when there is no workspace and the path is
    /// relative).
    pub(super) absolute: String,
    /// The form relative to the workspace, when the path is inside it.
    pub(super) relative: Option<String>,
}

impl Target {
    /// Normalises `path`, taken from `workspace` when relative.
    pub(super) fn new(path: &str, workspace: Option<&Path>) -> Self {
        let given = Path::new(path);
        let joined = match workspace {
            Some(dir) if given.is_relative() => dir.join(given),
            _ => given.to_path_buf(),
        };
        let resolved = resolve(&joined);
        let relative = workspace.and_then(|dir| {
            let dir = resolve(dir);
            resolved
                .strip_prefix(&dir)
                .ok()
                .map(|rest| rest.to_string_lossy().into_owned())
        });
        Self {
            absolute: resolved.to_string_lossy().into_owned(),
            relative,
        }
    }

    /// The form `pattern` is matched against: the absolute one for a pattern starting with `/`,
    /// else the relative one when the path is inside the workspace, else the absolute one.
    pub(super) fn for_pattern(&self, pattern: &str) -> &str {
        match &self.relative {
            Some(relative) if !pattern.starts_with('/') => relative,
            _ => &self.absolute,
        }
    }
}

/// `path` with its longest existing ancestor canonicalised (symlinks and `..` as the kernel
/// takes them), the rest normalised lexically.
fn resolve(path: &Path) -> PathBuf {
    let mut existing = path.to_path_buf();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    loop {
        if path.is_absolute() {
            if let Ok(canonical) = existing.canonicalize() {
                let mut out = canonical;
                for part in rest.iter().rev() {
                    out.push(part);
                }
                return lexical(&out);
            }
        }
        let Some(last) = existing.components().next_back() else {
            break;
        };
        rest.push(last.as_os_str().to_os_string());
        if !existing.pop() {
            break;
        }
    }
    lexical(path)
}

/// `path` without `.` and with `..` taking off the part before it (kept at the start of a
/// relative path; dropped at the root).
fn lexical(path: &Path) -> PathBuf {
    let mut parts: Vec<Component<'_>> = Vec::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => match parts.last() {
                Some(Component::Normal(_)) => {
                    parts.pop();
                }
                Some(Component::RootDir | Component::Prefix(_)) => {}
                _ => parts.push(component),
            },
            other => parts.push(other),
        }
    }
    parts.iter().collect()
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use crate::policy::{Decision, ToolPolicy, ToolRule};

    fn rules(list: &[&str]) -> Vec<ToolRule> {
        list.iter().map(|r| ToolRule::parse(r).unwrap()).collect()
    }

    /// A workspace with `secrets/key`, `a/`, `src/a.rs`, `link` → `secrets` and
    /// `src/evil.rs` → `secrets/key`.
    fn workspace() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        for sub in ["secrets", "a", "src"] {
            fs::create_dir_all(ws.join(sub)).unwrap();
        }
        fs::write(ws.join("secrets/key"), "k").unwrap();
        fs::write(ws.join("src/a.rs"), "").unwrap();
        symlink(ws.join("secrets"), ws.join("link")).unwrap();
        symlink(ws.join("secrets/key"), ws.join("src/evil.rs")).unwrap();
        (dir, ws)
    }

    #[test]
    fn deny_rules_meet_the_normalised_path() {
        let (_dir, ws) = workspace();
        let policy = ToolPolicy {
            deny: rules(&["Write(secrets/**)", "Edit(secrets/*)", "Read(/etc/*)"]),
            ..ToolPolicy::default()
        }
        .with_workspace(ws.clone());
        let absolute = ws.join("secrets/x").display().to_string();
        let outside_in = format!("a/../../{}/secrets/x", ws.file_name().unwrap().display());
        for (tool, path, expected) in [
            ("Write", "secrets/x", Decision::Deny),
            ("Write", "./a/../secrets/x", Decision::Deny),
            ("Write", outside_in.as_str(), Decision::Deny),
            ("Write", absolute.as_str(), Decision::Deny),
            ("Write", "a/./../secrets/new/deeper", Decision::Deny),
            ("Write", "link/x", Decision::Deny),
            ("Write", "link/../link/key", Decision::Deny),
            ("Edit", "src/evil.rs", Decision::Deny),
            ("NotebookEdit", "link/n.ipynb", Decision::Deny),
            ("Read", "/etc/../etc/passwd", Decision::Deny),
            ("Write", "a/x", Decision::Allow),
            ("Write", "secretsx", Decision::Allow),
            ("Edit", "src/a.rs", Decision::Allow),
            ("Read", "secrets/key", Decision::Allow),
        ] {
            assert_eq!(policy.decide(tool, Some(path)), expected, "{tool}({path})");
        }
    }

    #[test]
    fn allow_rules_cover_only_the_normalised_path() {
        let (_dir, ws) = workspace();
        let policy = ToolPolicy {
            allow: rules(&["Read(src/*)"]),
            default: Decision::Deny,
            ..ToolPolicy::default()
        }
        .with_workspace(ws.clone());
        let inside = ws.join("src/a.rs").display().to_string();
        for (path, expected) in [
            ("src/a.rs", Decision::Allow),
            ("./src/./a.rs", Decision::Allow),
            (inside.as_str(), Decision::Allow),
            ("src/../secrets/key", Decision::Deny),
            ("src/evil.rs", Decision::Deny),
            ("/etc/passwd", Decision::Deny),
        ] {
            assert_eq!(policy.decide("Read", Some(path)), expected, "{path}");
        }
    }

    #[test]
    fn without_a_workspace_paths_are_normalised_lexically() {
        let target = super::Target::new("a/./b/../c", None);
        assert_eq!(target.absolute, "a/c");
        assert_eq!(target.relative, None);
        assert_eq!(super::Target::new("/x/../../etc", None).absolute, "/etc");
    }
}
