//! The progress limits of a turn, shared by the configuration (which reads them) and the runner
//! (which enforces them); a leaf module, so neither imports the other for it.

use std::time::Duration;

/// When a turn that makes no progress is ended (zero turns a limit off). Model output is
/// streamed text or thinking, a tool call, a tool's end, a result, or a CLI progress notice;
/// while a tool runs only `max_turn` applies (the provider's watchdog covers tools).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressLimits {
    /// Retry or reconnect notices and no model output for this long (`progressNoticeSecs`).
    pub notice: Duration,
    /// No model output at all for this long (`progressSilenceSecs`).
    pub silence: Duration,
    /// A turn's total duration (`maxTurnSecs`).
    pub max_turn: Duration,
}

impl Default for ProgressLimits {
    fn default() -> Self {
        Self {
            notice: Duration::from_secs(60),
            silence: Duration::from_secs(120),
            max_turn: Duration::from_secs(3 * 3600),
        }
    }
}
