//! Progress rows for the host (issue 15, docs/contract/content.md#progress): while a turn runs,
//! `system` rows `{"action":"progress","payload":{"tool","summary","elapsedMs"}}`, at most one
//! per interval, so a host can show what the agent does (or drive a typing indicator).
//!
//! Throttling keeps the newest: an event inside the interval replaces the one waiting, which is
//! written when the interval ends (a long tool started just after a row is still shown, and a
//! burst of tools costs one row per interval).

use std::str::FromStr;
use std::time::Duration;

use provider::ProviderEvent;
use serde_json::{json, Value};
use tokio::time::Instant;

/// Longest summary of a text piece (`progress: text`), like the drivers' command lines.
const SUMMARY_CHARS: usize = 120;

/// What the progress rows show (`progress`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProgressMode {
    /// No progress rows.
    #[default]
    Off,
    /// A row per tool call (throttled).
    Tools,
    /// Tool calls and the first line of each piece of the agent's text (tool `null`).
    Text,
}

impl FromStr for ProgressMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "off" => Ok(Self::Off),
            "tools" => Ok(Self::Tools),
            "text" => Ok(Self::Text),
            other => Err(format!("expected off | tools | text, got {other:?}")),
        }
    }
}

/// The progress settings (`progress`, `progressIntervalSecs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressOptions {
    /// What the rows show.
    pub mode: ProgressMode,
    /// At most one row per this long.
    pub interval: Duration,
}

impl Default for ProgressOptions {
    fn default() -> Self {
        Self {
            mode: ProgressMode::Off,
            interval: Duration::from_secs(2),
        }
    }
}

/// The progress rows of one turn: what to write, and when.
#[derive(Debug)]
pub(crate) struct ProgressRows {
    options: ProgressOptions,
    started: Instant,
    last_written: Option<Instant>,
    /// The newest step not yet written: (tool, summary).
    waiting: Option<(Option<String>, Option<String>)>,
}

impl ProgressRows {
    /// The rows of a turn that starts at `started`.
    pub(crate) fn new(options: ProgressOptions, started: Instant) -> Self {
        Self {
            options,
            started,
            last_written: None,
            waiting: None,
        }
    }

    /// Notes `event`; returns the payload of a row to write now, if one is due.
    pub(crate) fn note(&mut self, event: &ProviderEvent, now: Instant) -> Option<Value> {
        let step = match (self.options.mode, event) {
            (ProgressMode::Off, _) => return None,
            (
                _,
                ProviderEvent::Activity {
                    tool: Some(tool),
                    summary,
                },
            ) => (Some(tool.clone()), summary.clone()),
            (ProgressMode::Text, ProviderEvent::Text { text }) => (None, Some(first_line(text)?)),
            _ => return None,
        };
        self.waiting = Some(step);
        self.flush(now)
    }

    /// When the waiting step may be written (`None`: nothing waits).
    pub(crate) fn flush_at(&self) -> Option<Instant> {
        self.waiting.as_ref()?;
        Some(match self.last_written {
            Some(last) => last + self.options.interval,
            None => self.started,
        })
    }

    /// The payload of the waiting step when its time has come.
    pub(crate) fn flush(&mut self, now: Instant) -> Option<Value> {
        if self.flush_at()? > now {
            return None;
        }
        let (tool, summary) = self.waiting.take()?;
        self.last_written = Some(now);
        let elapsed = u64::try_from(now.saturating_duration_since(self.started).as_millis())
            .unwrap_or(u64::MAX);
        Some(json!({ "tool": tool, "summary": summary, "elapsedMs": elapsed }))
    }
}

/// The first non-empty line of what the agent wrote, private notes removed, cut to
/// [`SUMMARY_CHARS`].
fn first_line(text: &str) -> Option<String> {
    let text = crate::reply::strip_internal(text);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    Some(line.chars().take(SUMMARY_CHARS).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, summary: &str) -> ProviderEvent {
        ProviderEvent::Activity {
            tool: Some(name.into()),
            summary: Some(summary.into()),
        }
    }

    fn options(mode: ProgressMode) -> ProgressOptions {
        ProgressOptions {
            mode,
            interval: Duration::from_secs(2),
        }
    }

    #[test]
    fn one_row_per_interval_and_the_newest_step_waits() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut rows = ProgressRows::new(options(ProgressMode::Tools), start);
        let first = rows.note(&tool("Bash", "ls -la"), at(100)).unwrap();
        assert_eq!(
            first,
            json!({ "tool": "Bash", "summary": "ls -la", "elapsedMs": 100 })
        );
        assert_eq!(rows.note(&tool("Read", "a.txt"), at(500)), None);
        assert_eq!(rows.note(&tool("Grep", "fn main"), at(900)), None);
        assert_eq!(rows.flush_at(), Some(at(2100)));
        assert_eq!(rows.flush(at(2000)), None);
        let second = rows.flush(at(2100)).unwrap();
        assert_eq!(second["tool"], "Grep", "the newest step is written");
        assert_eq!(rows.flush_at(), None);
    }

    #[test]
    fn modes_choose_what_is_shown() {
        let start = Instant::now();
        let text = ProviderEvent::Text {
            text: "<internal>plan</internal>\n\n  Checking the logs now.\nmore".into(),
        };
        let mut off = ProgressRows::new(options(ProgressMode::Off), start);
        assert_eq!(off.note(&tool("Bash", "ls"), start), None);
        let mut tools = ProgressRows::new(options(ProgressMode::Tools), start);
        assert_eq!(tools.note(&text, start), None);
        assert_eq!(
            tools.note(
                &ProviderEvent::Activity {
                    tool: None,
                    summary: None
                },
                start
            ),
            None
        );
        let mut texts = ProgressRows::new(options(ProgressMode::Text), start);
        let row = texts.note(&text, start).unwrap();
        assert_eq!(row["tool"], Value::Null);
        assert_eq!(row["summary"], "Checking the logs now.");
    }

    #[test]
    fn modes_parse() {
        assert_eq!("tools".parse(), Ok(ProgressMode::Tools));
        assert!("loud".parse::<ProgressMode>().is_err());
    }
}
