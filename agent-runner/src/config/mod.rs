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
//! - `effective.rs`: [`Inputs`] and the effective [`Config`] the other files share;
//! - `fields.rs`: the field table (key, variable, kind, default, range, help) and how a flag's,
//!   variable's or file's text becomes a value of its kind;
//! - `load.rs`: the sources and their precedence, config.json, secret files, reading the file
//!   again;
//! - `values.rs`: the resolved values with their [`Source`], and the reads of them by key;
//! - `build.rs`: values into [`Settings`], each nested shape read by its own type's owner
//!   (`provider::ToolPolicy::from_json`, [`crate::remote_mcp::parse`], `tool_settings.rs`);
//! - `settings.rs`: the typed settings and what they answer (the model, the API key's fix);
//! - `describe.rs`: `agent-runner config`, its JSON and the warnings about exposed secrets.

pub use logging::redact::Secret;

mod build;
mod describe;
mod effective;
mod fields;
mod load;
mod settings;
#[cfg(test)]
mod tests;
mod tool_settings;
mod values;

pub use effective::{Config, Inputs};
pub use fields::keys_help;
pub use settings::{CliPaths, Dirs, EnvVars, ModelApi, Models, Settings};
pub use values::Source;
