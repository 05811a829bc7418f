//! Quoting for `sh`: the one piece the launch (`command.rs`) and the archive hook
//! (`history.rs`) share, kept below both so neither imports the other.

/// `'text'` for `sh`, with embedded single quotes escaped.
pub(super) fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting() {
        assert_eq!(shell_quote("/a b/it's"), r"'/a b/it'\''s'");
    }
}
