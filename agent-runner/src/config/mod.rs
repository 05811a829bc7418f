//! Startup configuration: every setting can come from a flag (`--set key=value` or a named
//! flag), an environment variable, `/workspace/config.json`, or a default, in that order of
//! precedence. One table describes every field, so the sources never drift apart and
//! `agent-runner config` can show where each value came from.
//!
//! Two layers, as ripgrep's flags → low-level → high-level arguments: [`Config::load`] resolves
//! the table into values with their sources (what `agent-runner config` prints), then builds
//! from them, once, the typed [`Settings`] the rest of the runner reads ([`Config::settings`]).
//! Building them is the validation: a value that cannot become its type stops the load, so
//! `agent-runner config` refuses what `run` would. Nothing outside this module reads a setting
//! by its key.
//!
//! The folder by layer:
//! - `fields.rs`: the field table (key, variable, kind, default, range, help) and how a flag's,
//!   variable's or file's text becomes a value of its kind;
//! - `load.rs`: the sources and their precedence, config.json, secret files, reading the file
//!   again;
//! - `build.rs`: values into [`Settings`], each nested shape read by its own type's owner
//!   (`provider::ToolPolicy::from_json`, [`crate::remote_mcp::parse`], `tool_settings.rs`);
//! - `settings.rs`: the typed settings and what they answer (the model, the API key's fix);
//! - `describe.rs`: `agent-runner config`, its JSON and the warnings about exposed secrets.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use provider::redact::Secret;
use serde_json::Value;

use crate::budget::{BudgetLimits, BudgetReload};

mod build;
mod describe;
mod fields;
mod load;
mod settings;
#[cfg(test)]
mod tests;
mod tool_settings;

pub use fields::keys_help;
pub use settings::{CliPaths, Dirs, EnvVars, ModelApi, Models, Settings};

use fields::{is_command_name, is_program, FIELDS};

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

/// The inputs of configuration, gathered by `main`.
#[derive(Debug, Default)]
pub struct Inputs {
    /// Workspace root from the flag or `WORKSPACE_DIR` (default `/workspace`).
    pub workspace: PathBuf,
    /// config.json path from `--config`; otherwise `NANOCLAW_CONFIG` from `env` names it, else
    /// `<workspace>/config.json` (the only one that may be absent).
    pub config_file: Option<PathBuf>,
    /// `key=value` pairs from flags.
    pub flags: Vec<(String, String)>,
    /// The environment.
    pub env: BTreeMap<String, String>,
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Workspace root, absolute; so is every other path here but a bare program name.
    pub workspace: PathBuf,
    /// config.json used (if it existed).
    pub config_file: Option<PathBuf>,
    /// The config.json path looked at (it may be absent) and what named it, for
    /// [`Config::reread_file`].
    file_path: PathBuf,
    named_by: Option<&'static str>,
    /// Every set field's value and source.
    values: Values,
    /// Warnings about the environment's misspelled setting variables
    /// ([`load::misspelled_variables`]).
    misspelled: Vec<String>,
    /// The typed settings, built from `values` by [`Config::load`].
    settings: Settings,
}

impl Config {
    /// The typed settings, built once by [`Config::load`] (and [`Config::reread_file`]).
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The spending limits (`maxCostUsdPerSession`, `maxCostUsdPerDay`, `maxTokensPerDay`);
    /// unset or 0 is no limit.
    pub fn budget_limits(&self) -> BudgetLimits {
        self.settings.budgets.clone()
    }

    /// How the runner reads the limits again while it runs: config.json (the path looked at,
    /// even when absent at start) through [`Config::reread_file`].
    pub fn budget_reload(&self) -> BudgetReload {
        let config = self.clone();
        BudgetReload {
            file: self.file_path.clone(),
            load: std::sync::Arc::new(move || Ok(config.reread_file()?.budget_limits())),
        }
    }
}

/// The resolved fields: each set one's value and where it came from, read by key only inside
/// this module (by [`Settings`]' builder and the describe views).
#[derive(Debug, Clone)]
struct Values {
    /// Workspace root, absolute: relative paths from config.json or a default are under it.
    workspace: PathBuf,
    map: BTreeMap<&'static str, (Value, Source)>,
}

impl Values {
    /// A field's value and source; `None` when unset.
    fn get(&self, key: &str) -> Option<&(Value, Source)> {
        self.map.get(key)
    }

    /// Where `key`'s value came from, as errors and hints name it (`from NANOCLAW_X`).
    fn source_of(&self, key: &str) -> String {
        let field = FIELDS.iter().find(|f| f.key == key);
        match (self.map.get(key), field) {
            (Some((_, Source::Env)), Some(field)) => format!("from {}", field.env),
            (Some((_, Source::EnvFile)), Some(field)) => format!("from {}_FILE", field.env),
            (Some((_, source)), _) => format!("from {source}"),
            _ => "unset".into(),
        }
    }

    /// A text field.
    fn text(&self, key: &str) -> Option<String> {
        match self.map.get(key) {
            Some((Value::String(text), _)) => Some(text.clone()),
            Some((Value::Number(n), _)) => Some(n.to_string()),
            Some((Value::Bool(b), _)) => Some(b.to_string()),
            _ => None,
        }
    }

    /// A numeric field (0 when unset).
    fn number(&self, key: &str) -> u64 {
        self.map.get(key).and_then(|(v, _)| v.as_u64()).unwrap_or(0)
    }

    /// A boolean field.
    fn flag(&self, key: &str) -> bool {
        self.map
            .get(key)
            .and_then(|(v, _)| v.as_bool())
            .unwrap_or(false)
    }

    /// A list field.
    fn list(&self, key: &str) -> Vec<String> {
        match self.map.get(key) {
            Some((Value::Array(items), _)) => items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// An object field.
    fn object(&self, key: &str) -> Option<Value> {
        self.map.get(key).map(|(v, _)| v.clone())
    }

    /// A path field, absolute: one from a flag or the environment was made absolute against
    /// the current directory by [`Config::load`]; a relative one from config.json or a default
    /// is relative to the workspace (itself absolute).
    fn path(&self, key: &str) -> Option<PathBuf> {
        let (value, source) = self.map.get(key)?;
        let text = value.as_str()?;
        Some(match source {
            Source::Flag | Source::Env | Source::EnvFile => PathBuf::from(text),
            Source::File | Source::Default => in_workspace(&self.workspace, text),
        })
    }

    /// A program path (`claudePath`, `mcpToolsPath`, ...): a bare name (no `/`) is a command
    /// looked up in `PATH` and stays as it is; any other is a [`Config::path`].
    fn program(&self, key: &str) -> Option<PathBuf> {
        let text = self.text(key)?;
        if is_program(key) && is_command_name(&text) {
            return Some(PathBuf::from(text));
        }
        self.path(key)
    }

    /// A duration field given in seconds.
    fn secs(&self, key: &str) -> Duration {
        Duration::from_secs(self.number(key))
    }

    /// A duration field given in milliseconds.
    fn millis(&self, key: &str) -> Duration {
        Duration::from_millis(self.number(key))
    }

    /// A folder setting; its table default under the workspace when config.json set it to
    /// `null`.
    fn path_or_default(&self, key: &str) -> PathBuf {
        self.path(key).unwrap_or_else(|| {
            let default = FIELDS
                .iter()
                .find(|f| f.key == key)
                .map_or("", |f| f.default);
            in_workspace(&self.workspace, default)
        })
    }

    /// The IANA time zone name.
    fn timezone_name(&self) -> String {
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
