//! Text cut to a number of characters, for log lines, error messages and transcripts: one rule
//! (count characters, never cut inside one) instead of a helper per driver.

use std::borrow::Cow;

/// `text`'s first `max` characters; all of it when it is no longer.
pub fn head(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// `text`'s first `max` characters, ending in `…` when anything was cut.
pub fn shortened(text: &str, max: usize) -> Cow<'_, str> {
    let kept = head(text, max);
    if kept.len() == text.len() {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(format!("{kept}…"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_at_a_count_of_characters_never_inside_one() {
        assert_eq!(head("héllo", 2), "hé");
        assert_eq!(head("héllo", 5), "héllo");
        assert_eq!(head("héllo", 9), "héllo");
        assert_eq!(head("", 3), "");
        assert_eq!(shortened("héllo", 2), "hé…");
        assert_eq!(shortened("héllo", 5), "héllo");
        assert!(matches!(shortened("héllo", 5), Cow::Borrowed(_)));
        assert_eq!(shortened("日本語テキスト", 3), "日本語…");
    }
}
