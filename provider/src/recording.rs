//! Where a driver records what it reads and writes (for debugging and for the test fixtures
//! under each driver crate's `tests/fixtures/`), and which paths the recording hides. A fixture
//! is committed: it must not carry the recording machine's checkout path (its `target/` build of
//! `mcp-tools`, its `.cli/` install of the CLI), so each such prefix becomes a placeholder as a
//! line is written.

use std::path::{Path, PathBuf};

/// The placeholder [`Recording::hiding_checkout`] writes for the checkout's path.
pub const CHECKOUT_PLACEHOLDER: &str = "<checkout>";

/// A recording file and the path prefixes replaced in every line written to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recording {
    path: PathBuf,
    hidden: Vec<(String, &'static str)>,
}

impl Recording {
    /// Records to `path` (appended to), hiding nothing.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            hidden: Vec::new(),
        }
    }

    /// Writes [`CHECKOUT_PLACEHOLDER`] wherever the text names `checkout` (the folder of the
    /// source tree that runs the recording).
    pub fn hiding_checkout(mut self, checkout: &Path) -> Self {
        let text = checkout.to_string_lossy().trim_end_matches('/').to_owned();
        // An empty or root prefix would rewrite every absolute path.
        if text.len() > 1 {
            self.hidden.push((text, CHECKOUT_PLACEHOLDER));
        }
        self
    }

    /// The file recorded to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `line` as it is written: every hidden prefix replaced by its placeholder.
    pub fn scrub(&self, line: String) -> String {
        self.hidden
            .iter()
            .fold(line, |line, (prefix, placeholder)| {
                if line.contains(prefix.as_str()) {
                    line.replace(prefix.as_str(), placeholder)
                } else {
                    line
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkout_becomes_a_placeholder_in_every_place() {
        let recording = Recording::new("/tmp/x.jsonl").hiding_checkout(Path::new("/srv/ci/nc/"));
        let line =
            r#"{"in":"cmd=/srv/ci/nc/target/debug/mcp-tools\nPATH=/srv/ci/nc/.cli/bin:/usr/bin"}"#;
        assert_eq!(
            recording.scrub(line.to_owned()),
            r#"{"in":"cmd=<checkout>/target/debug/mcp-tools\nPATH=<checkout>/.cli/bin:/usr/bin"}"#
        );
        assert_eq!(recording.scrub("/tmp/job/x".to_owned()), "/tmp/job/x");
    }

    /// Where `text` names an absolute path under a checkout's build or CLI folder
    /// (`/…/target/debug/`, `/…/target/release/`, `/…/.cli/`): the path up to that folder.
    fn checkout_paths(text: &str) -> Vec<String> {
        let path_char = |c: char| c.is_ascii_alphanumeric() || "._@+-/".contains(c);
        let mut found = Vec::new();
        for folder in ["/target/debug/", "/target/release/", "/.cli/"] {
            for (at, _) in text.match_indices(folder) {
                let start = text[..at]
                    .char_indices()
                    .rev()
                    .take_while(|&(_, c)| path_char(c))
                    .last()
                    .map_or(at, |(i, _)| i);
                // `<checkout>/target/…` or a relative `target/…` starts with no `/`.
                if start < at && text[start..].starts_with('/') {
                    found.push(text[start..at + folder.len()].to_owned());
                }
            }
        }
        found
    }

    #[test]
    fn the_path_check_sees_checkout_folders_and_passes_placeholders() {
        assert_eq!(
            checkout_paths(r#""cmd":"/srv/ci/nc/target/debug/mcp-tools","#),
            ["/srv/ci/nc/target/debug/"]
        );
        assert_eq!(
            checkout_paths("PATH=/srv/ci/nc/.cli/node_modules/x:/usr/bin"),
            ["/srv/ci/nc/.cli/"]
        );
        assert!(checkout_paths("<checkout>/target/debug/mcp-tools").is_empty());
        assert!(checkout_paths("cargo build; ls target/debug/").is_empty());
        assert!(checkout_paths("/tmp/claude-capture-1wj/agent").is_empty());
    }

    /// Recorded fixtures are committed: none may name the recording machine's checkout (its
    /// `target/` build of `mcp-tools`, its `.cli/` install of a CLI). Re-record through the
    /// capture scripts, which write [`CHECKOUT_PLACEHOLDER`] instead.
    #[test]
    fn no_fixture_names_a_checkout_path() {
        // The archive's fixtures are the core's; each driver crate keeps its CLI's recordings.
        let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = crate_dir.join("tests/fixtures");
        let mut pending = vec![root.clone()];
        for driver in ["claude", "codex", "opencode"] {
            pending.push(
                crate_dir
                    .join("../drivers")
                    .join(driver)
                    .join("tests/fixtures"),
            );
        }
        let mut files = 0;
        let mut offences = Vec::new();
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    pending.push(path);
                    continue;
                }
                // The capture scripts name their own folders by design (`ROOT`); only data.
                if path.extension().is_some_and(|e| e == "py" || e == "md") {
                    continue;
                }
                files += 1;
                let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
                for found in checkout_paths(&text) {
                    offences.push(format!("{}: {found}", path.display()));
                }
            }
        }
        assert!(
            files > 20,
            "the fixtures were found ({files} files under {root:?})"
        );
        assert!(
            offences.is_empty(),
            "fixtures naming a checkout: {offences:#?}"
        );
    }

    #[test]
    fn a_root_prefix_hides_nothing() {
        let recording = Recording::new("/tmp/x.jsonl").hiding_checkout(Path::new("/"));
        assert_eq!(recording.scrub("/usr/bin".to_owned()), "/usr/bin");
    }
}
