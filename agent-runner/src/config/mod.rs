//! Startup configuration: every setting can come from a flag (`--set key=value` or a named
//! flag), an environment variable, `/workspace/config.json`, or a default, in that order of
//! precedence. One table describes every field, so the sources never drift apart and
//! `agent-runner config` can show where each value came from.
//!
//! Two layers, as ripgrep's flags → low-level → high-level arguments: [`Config::load`] resolves
//! the table into values with their sources (what `agent-runner config` prints), then builds
//! from them, once, the typed [`Settings`] the rest of the runner reads ([`Config::settings`]).
//! Building them is the validation. A mistake stops the load, naming the key, its source and
//! the fix; only the shapes of `mcpServers`' stdio entries, `cliEnv`, the mock's JSON and
//! `logFormat` are kept as the settings' error instead, so that `agent-runner config` still
//! prints such a configuration and every command that runs refuses it
//! (docs/decisions/config.md#D-CFG-01). Nothing outside this module reads a setting by its key.
//!
//! The folder by layer:
//! - `fields.rs`: the field table (key, variable, kind, default, range, help) and how a flag's,
//!   variable's or file's text becomes a value of its kind;
//! - `load.rs`: the sources and their precedence, config.json, secret files, reading the file
//!   again;
//! - `values.rs`: the resolved values with their [`Source`], and the reads of them by key;
//! - `build.rs`: values into [`Settings`], each nested shape read by its own type's owner
//!   (`provider::ToolPolicy::from_json`, [`crate::remote_mcp::parse`], `tool_settings.rs`);
//! - `settings.rs`: the typed settings and what they answer (the model, the API key's fix);
//! - `describe.rs`: `agent-runner config`, its JSON and the warnings about exposed secrets.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;

pub use logging::redact::Secret;

use crate::budget::{BudgetLimits, BudgetReload};

mod build;
mod describe;
mod fields;
mod load;
mod settings;
#[cfg(test)]
mod tests;
mod tool_settings;
mod values;

pub use fields::keys_help;
pub use settings::{CliPaths, Dirs, EnvVars, ModelApi, Models, Settings};
pub use values::Source;

use values::Values;

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
    /// config.json could not be read as root for want of root's DAC powers (a root without
    /// `CAP_DAC_OVERRIDE`, e.g. a pod with every capability dropped, on a `0700` session folder
    /// of the agent's user): it is read after the drop to `runAs` ([`Config::file_deferred`]).
    file_deferred: bool,
    /// The typed settings, built from `values` by [`Config::load`]; or the error of a shape
    /// only a command that runs refuses, as text (`{:#}`: the key and the form expected).
    settings: std::result::Result<Settings, String>,
}

impl Config {
    /// True when config.json was left unread because root may not read it here (no
    /// `CAP_DAC_OVERRIDE`): the runner reads it with [`Config::reread_file`] once it runs as the
    /// `runAs` user, who can. Root's DAC powers are never needed to read what that user can.
    pub fn file_deferred(&self) -> bool {
        self.file_deferred
    }

    /// The typed settings, built once by [`Config::load`] (and [`Config::reread_file`]). Fails
    /// where a value's shape cannot become its type (`mcpServers`, `cliEnv`, `mockScript`,
    /// `mockUsage`, `logFormat`), naming the key: every command that runs refuses it, and
    /// `agent-runner config` shows it.
    pub fn settings(&self) -> Result<Settings> {
        self.settings.clone().map_err(anyhow::Error::msg)
    }

    /// The spending limits (`maxCostUsdPerSession`, `maxCostUsdPerDay`, `maxTokensPerDay`);
    /// unset or 0 is no limit.
    pub fn budget_limits(&self) -> BudgetLimits {
        build::budget_limits(&self.values)
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
