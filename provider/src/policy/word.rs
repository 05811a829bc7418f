//! One word of a shell command after quote and escape removal: what the line parser
//! (`shell.rs`) makes and the wrapper tables (`wrappers.rs`) read, below both.

/// One word of a command after quote and escape removal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Word {
    /// The word's value, or its text as written when it is not literal.
    pub(super) value: String,
    /// No expansion (`$X`, `$(…)`, `${…}`, arithmetic): the value is what runs.
    pub(super) literal: bool,
    /// Unquoted glob or brace characters (`*`, `?`, `[`, `{`): the shell may make it other words.
    pub(super) pattern: bool,
}

impl Word {
    /// A literal word (wrappers make some: `xargs`'s input, `echo`).
    pub(super) fn literal(value: impl Into<String>) -> Self {
        Self {
            value: value.into(),
            literal: true,
            pattern: false,
        }
    }

    /// Exactly this literal value, nothing the shell would change.
    pub(super) fn is(&self, value: &str) -> bool {
        self.literal && self.value == value
    }

    /// `words` each quoted for the shell, then joined by spaces: what `sudo -s` hands its shell.
    pub(super) fn join_quoted(words: &[Word]) -> Self {
        let quoted: Vec<Word> = words
            .iter()
            .map(|w| Word {
                value: if w
                    .value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
                    && !w.value.is_empty()
                {
                    w.value.clone()
                } else {
                    format!("'{}'", w.value.replace('\'', "'\\''"))
                },
                ..w.clone()
            })
            .collect();
        Self::join(&quoted)
    }

    /// `words` joined by spaces, as a shell given them as code (`eval a b`) reads them.
    pub(super) fn join(words: &[Word]) -> Self {
        Self {
            value: words
                .iter()
                .map(|w| w.value.as_str())
                .collect::<Vec<_>>()
                .join(" "),
            literal: words.iter().all(|w| w.literal),
            pattern: words.iter().any(|w| w.pattern),
        }
    }
}
