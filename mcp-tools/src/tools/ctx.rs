//! What the tools share: their context ([`Ctx`]) and the checks of the texts and fields they
//! are given.

use std::sync::Arc;

use super::waiting::Waiting;
use crate::config::Config;
use crate::db::Db;
use crate::error::{ToolError, ToolResult};

/// What every tool needs: the DB, the configuration, and the shared waiting state of
/// `ask_user_question`.
#[derive(Clone)]
pub struct Ctx {
    /// The session DB.
    pub db: Db,
    /// The configuration.
    pub config: Arc<Config>,
    /// Questions being waited for in this process.
    pub waiting: Arc<Waiting>,
}

/// Checks a message text: not blank, not over the configured size.
pub fn check_text(config: &Config, field: &str, text: &str) -> ToolResult<()> {
    if text.trim().is_empty() {
        return Err(ToolError::invalid(format!(
            "{field} is empty: give the text to send"
        )));
    }
    if text.len() > config.max_text_bytes {
        return Err(ToolError::invalid(format!(
            "{field} is too long: {} bytes, the limit is {} bytes. Split it into several \
             messages, or write it to a file and use send_file",
            text.len(),
            config.max_text_bytes
        )));
    }
    Ok(())
}

/// Checks a required short field (ids, names): not blank, not absurdly long.
pub fn check_field<'a>(field: &str, value: &'a str) -> ToolResult<&'a str> {
    let value = value.trim();
    if value.is_empty() {
        return Err(ToolError::invalid(format!("{field} is empty")));
    }
    if value.len() > 1024 {
        return Err(ToolError::invalid(format!(
            "{field} is too long ({} bytes, at most 1024)",
            value.len()
        )));
    }
    Ok(value)
}
