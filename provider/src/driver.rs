//! What every driver crate (`claude`, `codex`, `opencode`) shares beside the trait: the one-line
//! activity summary, error classification, the refusal texts, elicitation schemas and text
//! shortening. A driver translates its CLI's protocol with these, so that the three report
//! the same events in the same words.

pub mod activity;
pub mod classify;
pub mod elicitation;
pub mod refusal;
pub mod text;
