//! The agent-runner library: configuration, the runner loop, prompt formatting and reply
//! dispatch. The `agent-runner` binary is a thin wrapper; tests drive the loop in-process.

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
mod providers;
pub mod remote_mcp;
pub mod reply;
pub mod runner;
pub mod script;
pub mod system_prompt;
pub mod turn_control;
mod turn_log;
