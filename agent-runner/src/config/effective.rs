//! The configuration's two shapes: [`Inputs`], what `main` gathers, and [`Config`], the
//! effective configuration the sources resolve into (loaded by `load.rs`, shown by
//! `describe.rs`), in a module of their own so the folder's files share them without naming
//! `mod.rs`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;

use crate::budget::{BudgetLimits, BudgetReload};

use super::build;
use super::settings::Settings;
use super::values::Values;

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
    pub(super) file_path: PathBuf,
    pub(super) named_by: Option<&'static str>,
    /// Every set field's value and source.
    pub(super) values: Values,
    /// Warnings about the environment's misspelled setting variables
    /// ([`super::load::misspelled_variables`]).
    pub(super) misspelled: Vec<String>,
    /// config.json could not be read as root for want of root's DAC powers (a root without
    /// `CAP_DAC_OVERRIDE`, e.g. a pod with every capability dropped, on a `0700` session folder
    /// of the agent's user): it is read after the drop to `runAs` ([`Config::file_deferred`]).
    pub(super) file_deferred: bool,
    /// The typed settings, built from `values` by [`Config::load`]; or the error of a shape
    /// only a command that runs refuses, as text (`{:#}`: the key and the form expected).
    pub(super) settings: std::result::Result<Settings, String>,
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
