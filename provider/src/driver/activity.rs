//! The one rule for how long and what shape an `Activity` summary is (the command line or the
//! path a tool call works on, docs/contract/providers.md): every driver cuts through here.

/// The most characters of an activity summary.
pub const SUMMARY_MAX_CHARS: usize = 120;

/// The first non-empty line of `text`, trimmed and cut to [`SUMMARY_MAX_CHARS`] characters (on
/// a character boundary, `…` marking the cut); `None` when nothing is left.
pub fn one_line_summary(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|line| !line.is_empty())?;
    if line.chars().count() <= SUMMARY_MAX_CHARS {
        return Some(line.to_owned());
    }
    let mut cut: String = line.chars().take(SUMMARY_MAX_CHARS - 1).collect();
    cut.push('…');
    Some(cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_cut_on_a_character_boundary() {
        assert_eq!(
            one_line_summary("  ls -la \n rm x").as_deref(),
            Some("ls -la")
        );
        assert_eq!(one_line_summary("\n\n  \n"), None);
        let long = "é".repeat(200);
        let cut = one_line_summary(&long).unwrap_or_default();
        assert_eq!(cut.chars().count(), SUMMARY_MAX_CHARS);
        assert!(cut.ends_with('…'));
        let exact = "x".repeat(SUMMARY_MAX_CHARS);
        assert_eq!(one_line_summary(&exact).as_deref(), Some(exact.as_str()));
    }
}
