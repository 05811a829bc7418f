//! The processes the runner starts, and the rule that none outlives its session.
//!
//! [`CliProcess`] spawns one CLI (or task script) in its own process group with a parent-death
//! signal, from a cleared, allow-listed environment ([`EnvPolicy`]), and stops it as a group.
//! [`reaper`] makes the runner the reaper of everything it starts: the subreaper, the session
//! marker, the ledger of descendants and the kills at startup and shutdown. Nothing here knows
//! about agents or providers: drivers and the runner build on it.

mod process;
pub mod reaper;

pub use process::{resolve_cli, CliCommand, CliProcess, EnvPolicy, SpawnError};
