//! The one rule for a path setting: it is made absolute once, where it is read, and only the
//! absolute path travels on (to a CLI's arguments and config files, a child's environment, the
//! MCP server's flags). A relative path kept as given would be read again later against another
//! folder: the runner starts every CLI, script and MCP server in the agent's folder, so a relative
//! home or DB path meant `<cwd>/x` to the user and `<cwd>/x/agent/x` to the CLI (issue 46).
//!
//! The base is the working directory of the process that read the setting (a flag, an
//! environment variable), or a folder the setting is documented against (the runner's
//! config.json paths and defaults: the workspace). The joining is lexical, as
//! [`std::path::absolute`]: nothing needs to exist, symlinks are not resolved, `.` components
//! and repeated slashes go, `..` stays (removing it would change the meaning under a symlink).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// A path setting that cannot be made absolute: it is empty, or it is relative and the current
/// directory cannot be read (deleted under the process, or not searchable).
#[derive(Debug)]
pub struct PathSettingError {
    /// The setting as the user wrote it: a flag, a variable, a config key.
    pub setting: String,
    /// The value given.
    pub path: PathBuf,
    /// Why it could not be made absolute.
    pub source: io::Error,
}

impl fmt::Display for PathSettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.as_os_str().is_empty() {
            return write!(f, "{}: the path is empty: give a path", self.setting);
        }
        write!(
            f,
            "{}: cannot make the relative path {} absolute, since the current directory cannot \
             be read ({}): give an absolute path, or start from a folder that exists",
            self.setting,
            self.path.display(),
            self.source
        )
    }
}

impl std::error::Error for PathSettingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// `path` made absolute against the current directory (a relative flag or environment value);
/// an absolute path is only normalised. `setting` names it in the error.
pub fn absolute(setting: &str, path: &Path) -> Result<PathBuf, PathSettingError> {
    std::path::absolute(path).map_err(|source| PathSettingError {
        setting: setting.to_owned(),
        path: path.to_path_buf(),
        source,
    })
}

/// `path` made absolute against `base` (a relative `base` first against the current directory).
pub fn absolute_in(setting: &str, base: &Path, path: &Path) -> Result<PathBuf, PathSettingError> {
    if path.as_os_str().is_empty() {
        return absolute(setting, path);
    }
    absolute(setting, &base.join(path))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn relative_paths_join_their_base_lexically() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            absolute("--db", Path::new("./ws//session.db")).unwrap(),
            cwd.join("ws/session.db")
        );
        assert_eq!(
            absolute("--db", Path::new("/x/./y/")).unwrap(),
            Path::new("/x/y")
        );
        // `..` stays: under a symlink, removing it would name another folder.
        assert_eq!(
            absolute_in("homeDir", Path::new("/ws"), Path::new("../.home")).unwrap(),
            Path::new("/ws/../.home")
        );
        assert_eq!(
            absolute_in("homeDir", Path::new("/ws"), Path::new("/abs/.home")).unwrap(),
            Path::new("/abs/.home")
        );
        assert_eq!(
            absolute_in("homeDir", Path::new("ws"), Path::new(".home")).unwrap(),
            cwd.join("ws/.home")
        );
    }

    #[test]
    fn an_empty_path_is_an_error_naming_the_setting() {
        let err = absolute("SESSION_DB", Path::new("")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "SESSION_DB: the path is empty: give a path"
        );
        let err = absolute_in("sessionDb", Path::new("/ws"), Path::new("")).unwrap_err();
        assert!(err.to_string().starts_with("sessionDb: "), "{err}");
    }
}
