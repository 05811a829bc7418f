//! What `agent-runner config` shows (text and `--json`), every secret masked, and the warnings
//! about secrets the agent can read.

use std::path::Path;

use logging::redact::{self, mask};
use serde_json::Value;

use super::effective::Config;
use super::fields::{Field, FIELDS};
use super::values::Source;

impl Config {
    /// Warnings about variables of the environment that look like a misspelled setting's: each
    /// is ignored, so the setting keeps its default.
    pub fn misspelled_variables(&self) -> &[String] {
        &self.misspelled
    }

    /// Warnings about secrets the agent can read: a secret that came from a config.json inside
    /// the workspace (the agent's user can read, even edit, everything there).
    pub fn exposed_secrets(&self) -> Vec<String> {
        let Some(file) = &self.config_file else {
            return Vec::new();
        };
        let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        if !canonical(file).starts_with(canonical(&self.workspace)) {
            return Vec::new();
        }
        let mut warnings: Vec<String> = FIELDS
            .iter()
            .filter(|f| f.secret)
            .filter(|f| matches!(self.values.get(f.key), Some((_, Source::File))))
            .map(|f| {
                format!(
                    "{} comes from {}, inside the workspace, where the agent can read it: move it \
                     to a file outside the workspace named by {}_FILE, or to {}",
                    f.key,
                    file.display(),
                    f.env,
                    f.env
                )
            })
            .collect();
        // The remote servers as built with the settings; a configuration whose settings fail
        // never runs (`run` refuses it before it asks for these warnings).
        let from_file = matches!(self.values.get("mcpServers"), Some((_, Source::File)));
        if let (true, Ok(settings)) = (from_file, &self.settings) {
            let servers = &settings.remote_mcp_servers;
            warnings.extend(crate::remote_mcp::literal_headers(servers).map(|header| {
                format!(
                    "{header} is written in {}, inside the workspace, where the agent can read \
                     it: use {{\"env\": \"NAME\"}} or {{\"file\": \"/path\"}} outside the \
                     workspace instead",
                    file.display()
                )
            }));
        }
        warnings
    }

    /// A field's value as printed: a secret setting masked whole, any other with the secrets in
    /// it masked (`logging::redact`: members named like secrets, such as an MCP server's
    /// `GITHUB_TOKEN` or a `cliEnv` password, secret arguments, URL passwords).
    fn shown(field: &Field, value: &Value) -> Value {
        match value {
            Value::String(text) if field.secret => Value::String(mask(text)),
            other if field.secret => Value::String(mask(&other.to_string())),
            other if field.key == "mcpServers" => {
                crate::remote_mcp::redact(other, redact::redact_value(other))
            }
            other => redact::redact_value(other),
        }
    }

    /// `agent-runner config --json`: the workspace, the config file and every set field with
    /// its value (secrets masked as in [`Config::describe`]), source and variable.
    pub fn describe_json(&self) -> Value {
        let settings: serde_json::Map<String, Value> = FIELDS
            .iter()
            .filter_map(|field| {
                let (value, source) = self.values.get(field.key)?;
                let source = match source {
                    Source::Flag => "flag",
                    Source::Env => "env",
                    Source::EnvFile => "envFile",
                    Source::File => "configFile",
                    Source::Default => "default",
                };
                let entry = serde_json::json!({
                    "value": Self::shown(field, value),
                    "source": source,
                    "variable": if matches!(source, "envFile") {
                        format!("{}_FILE", field.env)
                    } else {
                        field.env.to_owned()
                    },
                });
                Some((field.key.to_owned(), entry))
            })
            .collect();
        serde_json::json!({
            "workspace": self.workspace.display().to_string(),
            "configFile": self.config_file.as_ref().map(|p| p.display().to_string()),
            "settings": settings,
        })
    }

    /// Lines for `agent-runner config`: every field, its value (secrets masked) and source.
    pub fn describe(&self) -> String {
        let mut out = format!("workspace = {}\n", self.workspace.display());
        out.push_str(&format!(
            "config file = {}\n",
            self.config_file
                .as_ref()
                .map_or("(none)".into(), |p| p.display().to_string())
        ));
        for field in FIELDS {
            let (shown, source) = match self.values.get(field.key) {
                None => ("(unset)".to_owned(), String::new()),
                Some((value, source)) => {
                    let shown = match Self::shown(field, value) {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    let origin = match source {
                        Source::Env => format!("  [env {}]", field.env),
                        Source::EnvFile => format!("  [file from {}_FILE]", field.env),
                        other => format!("  [{other}]"),
                    };
                    (shown, origin)
                }
            };
            out.push_str(&format!("{} = {shown}{source}\n", field.key));
        }
        out
    }
}
