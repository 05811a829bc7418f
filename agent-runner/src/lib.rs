//! The agent-runner library: configuration, the runner loop, prompt formatting and reply
//! dispatch. The `agent-runner` binary is a thin wrapper; tests drive the loop in-process.
//!
//! Map (the map of the whole code is ARCHITECTURE.md): `runner/` (the loop, by concern; its own
//! map is in `runner/mod.rs`), `config/` (settings: fields, load, values, build, settings,
//! describe), `format.rs` (the prompt format of docs/contract/prompt.md), `reply.rs`
//! (`<message to>` blocks, `<internal>`), `turn_control.rs` (the stop word, the host's interrupt
//! row, `/model` and its revert), `progress.rs` (throttled `progress` rows), `ledger.rs` (a
//! turn's `turn_usage` row), `budget.rs` (spending limits from the ledger), `script.rs`
//! (pre-agent task scripts), `media.rs` (attachments), `system_prompt.rs` (CLAUDE.md files with
//! `@` imports plus the runner addendum, rebuilt per query), `progress_limits.rs` (a leaf that
//! both `config` and `runner` import), `privileges.rs` (non-dumpable, the `runAs` drop),
//! `lock.rs` (one runner per DB), `archive_hook.rs` (Claude's PreCompact hook),
//! `model_proxy.rs` and `remote_mcp.rs` (the credential proxy's wiring), `malloc.rs` (one
//! arena), `app.rs` (wiring). Benchmarks print figures beside a floor measured in the same run
//! (`benches/support/`).

pub mod app;
pub mod archive_hook;
pub mod budget;
pub mod config;
pub mod format;
mod last_event;
pub(crate) mod ledger;
pub mod lock;
pub mod malloc;
pub mod media;
pub mod model_proxy;
pub mod privileges;
pub mod progress;
pub mod progress_limits;
mod providers;
pub mod remote_mcp;
pub mod reply;
pub mod runner;
pub mod script;
pub mod system_prompt;
pub mod turn_control;
mod turn_log;
