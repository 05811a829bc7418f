//! Loading and precedence: flags > environment (or a secret's `<VAR>_FILE`) > config.json >
//! the table's default, every path made absolute once, and the file read again for the
//! settings that apply while the runner runs.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::effective::{Config, Inputs};
use super::fields::{
    check_file_value, check_range, is_command_name, is_program, parse_text, Field, Kind, FIELDS,
};
use super::settings::Settings;
use super::values::{Source, Values};

/// The variable naming the startup file when `--config` does not.
const CONFIG_VAR: &str = "NANOCLAW_CONFIG";

/// Warnings about `NANOCLAW_*` variables in `names` that look like a misspelled setting: one
/// edit or two away from a setting's variable (or a secret's `<VAR>_FILE`), letter case aside,
/// and not a variable itself. Such a variable is ignored, so without a word the operator's
/// setting silently keeps its default. Other unknown `NANOCLAW_*` names stay unremarked: the
/// scripts, the tests and mcp-tools read variables of their own from the same environment.
pub(super) fn misspelled_variables<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let known: Vec<String> = FIELDS
        .iter()
        .flat_map(|f| {
            let file = f.secret.then(|| format!("{}_FILE", f.env));
            std::iter::once(f.env.to_owned()).chain(file)
        })
        .chain(std::iter::once(CONFIG_VAR.to_owned()))
        .collect();
    let mut warnings = Vec::new();
    for name in names {
        let upper = name.to_ascii_uppercase();
        if !upper.starts_with("NANOCLAW") || known.iter().any(|k| k == name) {
            continue;
        }
        let closest = known
            .iter()
            .map(|k| (strsim::damerau_levenshtein(&upper, k), k))
            .filter(|(distance, _)| *distance <= 2)
            .min_by_key(|(distance, _)| *distance);
        if let Some((_, setting)) = closest {
            warnings.push(format!(
                "{name} is set but no setting reads it, so it is ignored: did you mean {setting}? \
                 (`agent-runner --help` lists every variable)"
            ));
        }
    }
    warnings
}

impl Config {
    /// Resolves every field: flags > env > file > defaults, validating types and naming the
    /// field (and the file) on error; then builds the typed [`Settings`] from the values, once
    /// ([`Config::settings`]).
    pub fn load(inputs: &Inputs) -> Result<Self> {
        // Every path is made absolute here, once, against this process's working directory
        // (docs/contract/config.md, "Paths"): the CLIs, scripts and mcp-tools start in the
        // agent's folder and would read a relative one against it.
        let workspace = fsguard::absolute("--workspace (WORKSPACE_DIR)", &inputs.workspace)?;
        let named = inputs.env.get(CONFIG_VAR).filter(|path| !path.is_empty());
        let (config_file, named_by) = match (&inputs.config_file, named) {
            (Some(path), _) => (fsguard::absolute("--config", path)?, Some("--config")),
            (None, Some(path)) => (
                fsguard::absolute(CONFIG_VAR, Path::new(path))?,
                Some(CONFIG_VAR),
            ),
            (None, None) => (workspace.join("config.json"), None),
        };
        // Root without CAP_DAC_OVERRIDE may not read a config.json in the agent user's `0700`
        // folder; the runner reads it after the drop to that user (issue 43, D1).
        let (file_values, file_deferred) = match read_file(&config_file, named_by) {
            Ok(values) => (values, false),
            Err(err) if permission_denied(&err) && nix::unistd::Uid::effective().is_root() => {
                (None, true)
            }
            Err(err) => return Err(err),
        };
        let mut values = BTreeMap::new();
        for field in FIELDS {
            let flag = inputs.flags.iter().rev().find(|(key, _)| key == field.key);
            let value = if let Some((_, text)) = flag {
                let setting = format!("flag --set {}", field.key);
                let text = absolute_text(field, text, &setting)?;
                Some((parse_text(field, &text).context(setting)?, Source::Flag))
            } else if let Some((text, source)) = env_text(field, &inputs.env)? {
                let text = absolute_text(field, &text, field.env)?;
                Some((
                    parse_text(field, &text)
                        .with_context(|| format!("environment variable {}", field.env))?,
                    source,
                ))
            } else {
                file_or_default(field, file_values.as_ref(), &config_file)?
            };
            if let Some(value) = checked(field, value, &config_file)? {
                values.insert(field.key, value);
            }
        }
        for (key, _) in &inputs.flags {
            if !FIELDS.iter().any(|f| f.key == key) {
                bail!("unknown setting {key:?} in --set (see `agent-runner --help` for the keys)");
            }
        }
        let values = Values {
            workspace: workspace.clone(),
            map: values,
        };
        Ok(Self {
            workspace,
            config_file: file_values.is_some().then(|| config_file.clone()),
            file_path: config_file,
            named_by,
            settings: Settings::build(&values)?,
            values,
            misspelled: misspelled_variables(inputs.env.keys().map(String::as_str)),
            file_deferred,
        })
    }

    /// This configuration with config.json read again as it is now: every value that came
    /// from the file or a default is taken afresh (flags and the environment still win), with
    /// the same checks as [`Config::load`]. Secret files are not read again (a runner that
    /// dropped privileges may not read them): only config.json. For the settings that apply
    /// while the runner runs (the budgets, docs/decisions/loop.md#D-LOOP-05).
    pub fn reread_file(&self) -> Result<Config> {
        let file_values = read_file(&self.file_path, self.named_by)?;
        let mut values = self.values.map.clone();
        for field in FIELDS {
            let fixed = matches!(
                values.get(field.key),
                Some((_, Source::Flag | Source::Env | Source::EnvFile))
            );
            if fixed {
                continue;
            }
            values.remove(field.key);
            let value = file_or_default(field, file_values.as_ref(), &self.file_path)?;
            if let Some(value) = checked(field, value, &self.file_path)? {
                values.insert(field.key, value);
            }
        }
        let values = Values {
            workspace: self.workspace.clone(),
            map: values,
        };
        Ok(Self {
            config_file: file_values.is_some().then(|| self.file_path.clone()),
            settings: Settings::build(&values)?,
            values,
            file_deferred: false,
            ..self.clone()
        })
    }
}

/// The error is an I/O permission error (EACCES/EPERM) somewhere in its chain.
fn permission_denied(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
    })
}

/// Reads config.json. Only the default file may be absent: a file named by `--config` or
/// `NANOCLAW_CONFIG` (`named_by`) that is not there is a typo or a volume not mounted, and
/// running on defaults instead would hide it.
fn read_file(
    path: &Path,
    named_by: Option<&str>,
) -> Result<Option<serde_json::Map<String, Value>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => match named_by {
            None => return Ok(None),
            Some(flag) => bail!(
                "the config file {} named by {flag} does not exist: fix the path (or mount the \
                 file), or drop {flag} to read the optional <workspace>/config.json",
                path.display()
            ),
        },
        Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
    };
    let value: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", path.display()))?;
    let Value::Object(map) = value else {
        bail!(
            "{}: expected a JSON object at the top level",
            path.display()
        );
    };
    for key in map.keys() {
        if !FIELDS.iter().any(|f| f.key == key) {
            bail!(
                "{}: unknown field \"{key}\" (known fields: see `agent-runner --help`)",
                path.display()
            );
        }
    }
    Ok(Some(map))
}

/// A field's value from config.json (checked against its kind) or its default; `None` when
/// neither sets it.
fn file_or_default(
    field: &Field,
    file_values: Option<&serde_json::Map<String, Value>>,
    config_file: &Path,
) -> Result<Option<(Value, Source)>> {
    if let Some(value) = file_values.and_then(|m| m.get(field.key)) {
        check_file_value(field, value)
            .with_context(|| format!("{}: field \"{}\"", config_file.display(), field.key))?;
        Ok(Some((value.clone(), Source::File)))
    } else if !field.default.is_empty() {
        Ok(Some((parse_text(field, field.default)?, Source::Default)))
    } else {
        Ok(None)
    }
}

/// A resolved value without `null` (unset), refused when out of its field's range (naming
/// where it came from).
fn checked(
    field: &Field,
    value: Option<(Value, Source)>,
    config_file: &Path,
) -> Result<Option<(Value, Source)>> {
    let Some(value) = value.filter(|(v, _)| !v.is_null()) else {
        return Ok(None);
    };
    check_range(field, &value.0).with_context(|| match value.1 {
        Source::Flag => format!("flag --set {}", field.key),
        Source::Env | Source::EnvFile => format!("environment variable {}", field.env),
        Source::File => format!("{}: field \"{}\"", config_file.display(), field.key),
        Source::Default => format!("the default of {}", field.key),
    })?;
    Ok(Some(value))
}

/// A field's value from the environment: its variable, or for a secret the content of the file
/// named by `<VAR>_FILE` (read through fsguard, surrounding whitespace trimmed: secret files
/// usually end with a newline). Both set is an error: which one wins must never be a guess.
fn env_text(field: &Field, env: &BTreeMap<String, String>) -> Result<Option<(String, Source)>> {
    let direct = env.get(field.env).filter(|t| !t.is_empty());
    if !field.secret {
        return Ok(direct.map(|t| (t.clone(), Source::Env)));
    }
    let file_var = format!("{}_FILE", field.env);
    let Some(path) = env.get(&file_var).filter(|t| !t.is_empty()) else {
        return Ok(direct.map(|t| (t.clone(), Source::Env)));
    };
    if direct.is_some() {
        bail!(
            "both {} and {file_var} are set: unset one of them (the secret comes from the \
             environment or from a file, never both)",
            field.env
        );
    }
    let absolute = fsguard::absolute(&file_var, Path::new(path))?;
    let path = absolute.display();
    let text = fsguard::read_to_string(&absolute).with_context(|| {
        format!(
            "{file_var}: cannot read the secret file {path}; check that it is mounted there and \
             that the runner's user can read it (a runner started as root reads it before it \
             drops to runAs)"
        )
    })?;
    let text = text.trim();
    if text.is_empty() {
        bail!("{file_var}: the secret file {path} is empty");
    }
    Ok(Some((text.to_owned(), Source::EnvFile)))
}

/// A flag's or variable's `text`, made absolute against the current directory when `field` is a
/// path (not a bare command name: `claudePath=claude` is looked up in `PATH`); `setting` names
/// it in the error.
fn absolute_text(field: &Field, text: &str, setting: &str) -> Result<String> {
    if field.kind != Kind::Path || is_program(field.key) && is_command_name(text) {
        return Ok(text.to_owned());
    }
    let path = fsguard::absolute(setting, Path::new(text))?;
    path.into_os_string()
        .into_string()
        .map_err(|path| anyhow::anyhow!("{setting}: {path:?} is not valid UTF-8"))
}
