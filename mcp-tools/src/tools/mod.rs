//! The tools' bodies, by concern. `server.rs` holds the thin MCP-facing wrappers.

pub mod files;
pub mod messages;
pub mod question;
pub mod routing;
pub mod tasks;
pub mod when;

mod ctx;
mod waiting;

pub use ctx::{check_field, check_text, Ctx};
pub use waiting::Waiting;
