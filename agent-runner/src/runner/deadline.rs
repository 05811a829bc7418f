//! The progress deadline of a turn and what `waiting_on` says meanwhile.

use std::time::Duration;

use chrono::Utc;
use provider::ProviderEvent;
use schema::WaitingOn;
use tokio::time::Instant;

use crate::progress_limits::ProgressLimits;

/// A turn without model output is shown as waiting (`runner_state.waiting_on`) after this long,
/// or at once when the CLI reports a retry.
pub(super) const WAITING_SHOWN_AFTER: Duration = Duration::from_secs(10);

/// Why the progress deadline ended a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stall {
    /// Retry notices and no output.
    Notices,
    /// No output at all.
    Silence,
    /// The turn's total cap.
    TurnCap,
}

/// The progress of the running turn, for the progress deadline and `waiting_on`.
#[derive(Debug)]
pub(super) struct TurnProgress {
    started: Instant,
    /// The last model output (or the turn's start, or a tool's end).
    last: Instant,
    /// The wall-clock time of `last`, for `waiting_on.since`.
    last_wall: chrono::DateTime<Utc>,
    /// Tool calls running.
    tools: usize,
    /// Retry notices since `last`.
    notices: u32,
    last_notice: Option<String>,
    /// Whether `waiting_on` is written (and must be cleared on output).
    pub(super) shown: bool,
    /// Whether the CLI waits for the user's answer to an approval question: the silence is
    /// the user's, not the model's (only the turn's cap applies).
    pub(super) asking: bool,
}

impl TurnProgress {
    pub(super) fn new(now: Instant, wall: chrono::DateTime<Utc>) -> Self {
        Self {
            started: now,
            last: now,
            last_wall: wall,
            tools: 0,
            notices: 0,
            last_notice: None,
            shown: false,
            asking: false,
        }
    }

    /// Model output: the clock starts again; true when `waiting_on` must be cleared.
    pub(super) fn output(&mut self, now: Instant, wall: chrono::DateTime<Utc>) -> bool {
        self.last = now;
        self.last_wall = wall;
        self.notices = 0;
        self.last_notice = None;
        std::mem::replace(&mut self.shown, false)
    }

    /// Notes what `event` says about the turn's progress (tools running, retry notices); true
    /// when the turn moved and the silence clock starts again ([`TurnProgress::output`]).
    pub(super) fn note(&mut self, event: &ProviderEvent) -> bool {
        match event {
            // `Init`: the CLI is up and its session open. Its start-up (seconds for OpenCode's
            // server, more on a loaded machine) is not the model's silence.
            ProviderEvent::Output | ProviderEvent::Init { .. } | ProviderEvent::Progress { .. } => {
                true
            }
            ProviderEvent::Result { .. } => {
                self.tools = 0;
                true
            }
            ProviderEvent::Activity { tool: Some(_), .. } => {
                self.tools += 1;
                true
            }
            ProviderEvent::ToolEnded { running } => {
                self.tools = *running;
                true
            }
            ProviderEvent::Error {
                message,
                ends_turn: false,
                ..
            } => {
                self.notice(message);
                // The caller writes `waiting_on` now, unless it names an approval (which
                // model output must then not clear).
                self.shown |= !self.asking;
                false
            }
            _ => false,
        }
    }

    /// The CLI waits for the user (`true`) or goes on (`false`: the model's silence starts now).
    pub(super) fn set_asking(&mut self, asking: bool, now: Instant, wall: chrono::DateTime<Utc>) {
        if self.asking && !asking {
            self.output(now, wall);
        }
        if asking {
            // `waiting_on` names the approval now: model output must not clear it.
            self.shown = false;
        }
        self.asking = asking;
    }

    /// A retry or reconnect notice of the CLI.
    fn notice(&mut self, message: &str) {
        self.notices = self.notices.saturating_add(1);
        self.last_notice = Some(message.to_owned());
    }

    /// The next deadline and its cause, if any applies.
    pub(super) fn deadline(&self, limits: &ProgressLimits) -> Option<(Instant, Stall)> {
        let on = |limit: Duration| (!limit.is_zero()).then_some(limit);
        let mut candidates = Vec::new();
        if let Some(cap) = on(limits.max_turn) {
            candidates.push((self.started + cap, Stall::TurnCap));
        }
        if self.tools == 0 && !self.asking {
            if let Some(silence) = on(limits.silence) {
                candidates.push((self.last + silence, Stall::Silence));
            }
            if let Some(notice) = on(limits.notice).filter(|_| self.notices > 0) {
                candidates.push((self.last + notice, Stall::Notices));
            }
        }
        candidates.into_iter().min_by_key(|(at, _)| *at)
    }

    /// When `waiting_on` should be written, if it is not yet.
    pub(super) fn show_at(&self) -> Option<Instant> {
        (!self.shown && self.tools == 0 && !self.asking).then(|| self.last + WAITING_SHOWN_AFTER)
    }

    pub(super) fn waiting_on(&self, endpoint: &str) -> WaitingOn {
        WaitingOn {
            endpoint: endpoint.to_owned(),
            since: schema::time::format_ts(self.last_wall),
            notices: self.notices,
            last_notice: self.last_notice.clone(),
            budget: None,
            approval: None,
            question_id: None,
        }
    }

    /// The `query_error` message of a stall: the endpoint, the cause, and the setting.
    pub(super) fn message(
        &self,
        stall: Stall,
        now: Instant,
        limits: &ProgressLimits,
        endpoint: &str,
    ) -> String {
        let quiet = now.saturating_duration_since(self.last).as_secs();
        match stall {
            Stall::Notices => format!(
                "no progress: the model at {endpoint} gave no output for {quiet} s while the CLI \
                 kept retrying ({} retry notices; last: {}); ended by progressNoticeSecs={}",
                self.notices,
                self.last_notice.as_deref().unwrap_or("?"),
                limits.notice.as_secs()
            ),
            Stall::Silence => format!(
                "no progress: the model at {endpoint} gave no output for {quiet} s (stream \
                 stalled: no data, or no answer to the request); ended by progressSilenceSecs={}",
                limits.silence.as_secs()
            ),
            Stall::TurnCap => format!(
                "the turn ran for {} s, its cap (maxTurnSecs={}); the model is at {endpoint}",
                now.saturating_duration_since(self.started).as_secs(),
                limits.max_turn.as_secs()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use provider::ErrorClass;

    use super::*;

    const LIMITS: ProgressLimits = ProgressLimits {
        notice: Duration::from_secs(60),
        silence: Duration::from_secs(120),
        max_turn: Duration::from_secs(3600),
    };

    fn at(progress: &TurnProgress, secs: u64) -> Instant {
        progress.started + Duration::from_secs(secs)
    }

    #[test]
    fn silence_ends_a_turn_after_the_silence_limit() {
        let progress = TurnProgress::new(Instant::now(), Utc::now());
        assert_eq!(
            progress.deadline(&LIMITS),
            Some((at(&progress, 120), Stall::Silence))
        );
    }

    #[test]
    fn the_cli_start_up_is_not_model_silence() {
        // The CLI took 30 s to start (OpenCode's server on a loaded machine): its `Init`
        // starts the silence clock again.
        let mut progress = TurnProgress::new(Instant::now(), Utc::now());
        let init = ProviderEvent::Init {
            session_id: "s-1".to_owned(),
        };
        assert!(progress.note(&init), "Init moves the turn");
        progress.output(at(&progress, 30), Utc::now());
        assert_eq!(
            progress.deadline(&LIMITS),
            Some((at(&progress, 150), Stall::Silence))
        );
    }

    #[test]
    fn retry_notices_shorten_the_deadline_and_output_resets_it() {
        let mut progress = TurnProgress::new(Instant::now(), Utc::now());
        progress.notice("Reconnecting... 1/5 (connection refused)");
        assert_eq!(
            progress.deadline(&LIMITS),
            Some((at(&progress, 60), Stall::Notices))
        );
        let message = progress.message(Stall::Notices, at(&progress, 61), &LIMITS, "http://gw");
        assert!(message.contains("http://gw"), "{message}");
        assert!(message.contains("connection refused"), "{message}");
        assert!(message.contains("progressNoticeSecs=60"), "{message}");
        progress.shown = true;
        assert!(
            progress.output(at(&progress, 30), Utc::now()),
            "clears waiting_on"
        );
        assert_eq!(
            progress.deadline(&LIMITS),
            Some((at(&progress, 150), Stall::Silence))
        );
    }

    #[test]
    fn a_notice_while_an_approval_waits_leaves_waiting_on_to_the_approval() {
        let mut progress = TurnProgress::new(Instant::now(), Utc::now());
        progress.asking = true;
        let notice = ProviderEvent::Error {
            message: "retrying".into(),
            retryable: true,
            classification: ErrorClass::Api,
            ends_turn: false,
            usage: None,
        };
        assert!(!progress.note(&notice));
        assert!(!progress.shown, "the notice does not take waiting_on over");
        assert!(
            !progress.output(at(&progress, 1), Utc::now()),
            "output does not clear the approval's waiting_on"
        );
    }

    #[test]
    fn a_running_tool_pauses_the_deadline_but_not_the_turn_cap() {
        let mut progress = TurnProgress::new(Instant::now(), Utc::now());
        progress.tools = 1;
        progress.notice("retrying");
        assert_eq!(
            progress.deadline(&LIMITS),
            Some((at(&progress, 3600), Stall::TurnCap))
        );
        assert_eq!(progress.show_at(), None);
        let off = ProgressLimits {
            max_turn: Duration::ZERO,
            ..LIMITS
        };
        assert_eq!(progress.deadline(&off), None);
    }
}
