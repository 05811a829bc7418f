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
