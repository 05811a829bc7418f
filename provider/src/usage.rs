//! What a turn cost, as the CLI reported it (docs/contract/providers.md#usage).

use serde::{Deserialize, Serialize};

/// Token and cost figures of one turn (or one step of it). A figure the CLI did not report is
/// `None`, never 0: the ledger keeps "unknown" apart from "nothing".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Usage {
    /// Input (prompt) tokens, cache reads and writes not included.
    pub input_tokens: Option<u64>,
    /// Output (completion) tokens, reasoning included where the API counts it there.
    pub output_tokens: Option<u64>,
    /// Input tokens read from the prompt cache.
    pub cache_read_tokens: Option<u64>,
    /// Input tokens written to the prompt cache.
    pub cache_write_tokens: Option<u64>,
    /// Reasoning (thinking) tokens, where the API reports them apart.
    pub reasoning_tokens: Option<u64>,
    /// Cost in US dollars, where the CLI computes one.
    pub cost_usd: Option<f64>,
    /// The model that answered (the last one named, when a turn used several).
    pub model: Option<String>,
    /// Model requests (steps) the turn made.
    pub requests: Option<u64>,
}

impl Usage {
    /// Adds `step` to this total: a figure known on either side is known in the sum; the
    /// model becomes `step`'s when it names one.
    pub fn add(&mut self, step: &Usage) {
        // A CLI's figures are input: a huge one saturates instead of overflowing.
        fn sum(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                (a, b) => a.or(b),
            }
        }
        self.input_tokens = sum(self.input_tokens, step.input_tokens);
        self.output_tokens = sum(self.output_tokens, step.output_tokens);
        self.cache_read_tokens = sum(self.cache_read_tokens, step.cache_read_tokens);
        self.cache_write_tokens = sum(self.cache_write_tokens, step.cache_write_tokens);
        self.reasoning_tokens = sum(self.reasoning_tokens, step.reasoning_tokens);
        self.cost_usd = match (self.cost_usd, step.cost_usd) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.requests = sum(self.requests, step.requests);
        if step.model.is_some() {
            self.model.clone_from(&step.model);
        }
    }

    /// Whether the CLI reported nothing at all.
    pub fn is_empty(&self) -> bool {
        *self == Usage::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_add_up_and_unknown_stays_unknown() {
        let mut total = Usage::default();
        total.add(&Usage {
            input_tokens: Some(10),
            output_tokens: Some(2),
            model: Some("a".into()),
            requests: Some(1),
            ..Usage::default()
        });
        total.add(&Usage {
            input_tokens: Some(5),
            cache_read_tokens: Some(7),
            requests: Some(1),
            ..Usage::default()
        });
        assert_eq!(total.input_tokens, Some(15));
        assert_eq!(total.output_tokens, Some(2));
        assert_eq!(total.cache_read_tokens, Some(7));
        assert_eq!(total.cost_usd, None, "no step reported a cost");
        assert_eq!(total.requests, Some(2));
        assert_eq!(total.model.as_deref(), Some("a"));
        assert!(Usage::default().is_empty() && !total.is_empty());
        total.add(&Usage {
            input_tokens: Some(u64::MAX),
            ..Usage::default()
        });
        assert_eq!(
            total.input_tokens,
            Some(u64::MAX),
            "saturates, never overflows"
        );
    }
}
