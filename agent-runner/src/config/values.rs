//! The resolved values: each set field's value and where it came from, and the typed reads of
//! them by key (a path under the workspace, a duration, a list) that the builder and the
//! describe views share.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::fields::{is_command_name, is_program, FIELDS};

/// Where a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A command-line flag.
    Flag,
    /// An environment variable.
    Env,
    /// The file named by a secret's `<VAR>_FILE` environment variable.
    EnvFile,
    /// config.json.
    File,
    /// The built-in default.
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Flag => "flag",
            Source::Env => "env",
            Source::EnvFile => "env file",
            Source::File => "config.json",
            Source::Default => "default",
        })
    }
}

/// The resolved fields: each set one's value and where it came from, read by key only inside
/// this module (by [`Settings`]' builder and the describe views).
#[derive(Debug, Clone)]
pub(super) struct Values {
    /// Workspace root, absolute: relative paths from config.json or a default are under it.
    pub(super) workspace: PathBuf,
    pub(super) map: BTreeMap<&'static str, (Value, Source)>,
}

impl Values {
    /// A field's value and source; `None` when unset.
    pub(super) fn get(&self, key: &str) -> Option<&(Value, Source)> {
        self.map.get(key)
    }

    /// Where `key`'s value came from, as errors and hints name it (`from NANOCLAW_X`).
    pub(super) fn source_of(&self, key: &str) -> String {
        let field = FIELDS.iter().find(|f| f.key == key);
        match (self.map.get(key), field) {
            (Some((_, Source::Env)), Some(field)) => format!("from {}", field.env),
            (Some((_, Source::EnvFile)), Some(field)) => format!("from {}_FILE", field.env),
            (Some((_, source)), _) => format!("from {source}"),
            _ => "unset".into(),
        }
    }

    /// A text field.
    pub(super) fn text(&self, key: &str) -> Option<String> {
        match self.map.get(key) {
            Some((Value::String(text), _)) => Some(text.clone()),
            Some((Value::Number(n), _)) => Some(n.to_string()),
            Some((Value::Bool(b), _)) => Some(b.to_string()),
            _ => None,
        }
    }

    /// A numeric field (0 when unset).
    pub(super) fn number(&self, key: &str) -> u64 {
        self.map.get(key).and_then(|(v, _)| v.as_u64()).unwrap_or(0)
    }

    /// A boolean field.
    pub(super) fn flag(&self, key: &str) -> bool {
        self.map
            .get(key)
            .and_then(|(v, _)| v.as_bool())
            .unwrap_or(false)
    }

    /// A list field.
    pub(super) fn list(&self, key: &str) -> Vec<String> {
        match self.map.get(key) {
            Some((Value::Array(items), _)) => items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// An object field.
    pub(super) fn object(&self, key: &str) -> Option<Value> {
        self.map.get(key).map(|(v, _)| v.clone())
    }

    /// A path field, absolute: one from a flag or the environment was made absolute against
    /// the current directory by [`Config::load`](super::Config::load); a relative one from
    /// config.json or a default is relative to the workspace (itself absolute).
    pub(super) fn path(&self, key: &str) -> Option<PathBuf> {
        let (value, source) = self.map.get(key)?;
        let text = value.as_str()?;
        Some(match source {
            Source::Flag | Source::Env | Source::EnvFile => PathBuf::from(text),
            Source::File | Source::Default => in_workspace(&self.workspace, text),
        })
    }

    /// A program path (`claudePath`, `mcpToolsPath`, ...): a bare name (no `/`) is a command
    /// looked up in `PATH` and stays as it is; any other is a [`Values::path`].
    pub(super) fn program(&self, key: &str) -> Option<PathBuf> {
        let text = self.text(key)?;
        if is_program(key) && is_command_name(&text) {
            return Some(PathBuf::from(text));
        }
        self.path(key)
    }

    /// A duration field given in seconds.
    pub(super) fn secs(&self, key: &str) -> Duration {
        Duration::from_secs(self.number(key))
    }

    /// A duration field given in milliseconds.
    pub(super) fn millis(&self, key: &str) -> Duration {
        Duration::from_millis(self.number(key))
    }

    /// A folder setting; its table default under the workspace when config.json set it to
    /// `null`.
    pub(super) fn path_or_default(&self, key: &str) -> PathBuf {
        self.path(key).unwrap_or_else(|| {
            let default = FIELDS
                .iter()
                .find(|f| f.key == key)
                .map_or("", |f| f.default);
            in_workspace(&self.workspace, default)
        })
    }

    /// The IANA time zone name.
    pub(super) fn timezone_name(&self) -> String {
        self.text("timezone")
            .map(|tz| tz.trim_start_matches(':').to_owned())
            .unwrap_or_else(|| "UTC".into())
    }
}

/// `text` (a config.json value or a default) relative to the absolute `workspace`, normalised
/// lexically ([`fsguard::absolute_in`]); an empty value is the workspace itself.
fn in_workspace(workspace: &Path, text: &str) -> PathBuf {
    fsguard::absolute_in("workspace", workspace, Path::new(text))
        .unwrap_or_else(|_| workspace.to_path_buf())
}
