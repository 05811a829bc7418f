//! The lifecycle of every session, as one state machine per session and one rule for the
//! slots: what the fleet observed (the DB's work and runner row, runners ending) goes in, the
//! actions to take come out. No I/O here: the loop in `mod.rs` reads the DBs and drives the
//! backend.
//!
//! - **Wake**: a session without a runner whose DB has work due (a triggering row a first poll
//!   would take, or a `processing` row a dead runner held) wants a runner.
//! - **Slots**: at most `maxRunning` runners live (starting, running, idle or stopping). The
//!   sessions that want one are served oldest due work first (then by name), so a session that
//!   waits only ever moves up; while any waits, idle runners give their slot up at once.
//! - **Idle stop**: a runner whose row says `idle` and that has no work it has not seen, for
//!   `idleStopSecs`, is asked to stop (SIGTERM). A turn is never stopped for idleness; a turn
//!   waiting for an answer counts as idle from its question's deadline on.
//! - **Crash**: a runner that ends unasked is restarted after `1 s × 2^(n-1)` (capped), n its
//!   crashes in a row (reset by a run that lasted [`Policy::stable_after`] or a clean stop);
//!   at [`Policy::crash_limit`] the session is `failed`, retried after `failedRetrySecs`.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use schema::{RunnerState, Work};

use super::backend::SessionSpec;
use super::status::{RunnerRecord, SessionState, SessionStatus};

/// How long work may stay due while a runner says `idle` before the runner counts as holding
/// it (idle) rather than not having polled it yet (running).
const HELD_WORK_GRACE: Duration = Duration::from_secs(10);

/// The scheduler's tunables.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    /// Idle time before a runner is stopped.
    pub(crate) idle_stop: Duration,
    /// Runners at most.
    pub(crate) max_running: usize,
    /// The first restart delay after a crash; doubled per crash in a row.
    pub(crate) backoff_first: Duration,
    /// The longest restart delay.
    pub(crate) backoff_cap: Duration,
    /// Crashes in a row that make a session `failed`.
    pub(crate) crash_limit: u32,
    /// How long a failed session waits before it is tried again.
    pub(crate) failed_retry: Duration,
    /// A runner that has not reported by then is killed (and counts as a crash).
    pub(crate) start_timeout: Duration,
    /// A runner asked to stop that has not exited by then is killed.
    pub(crate) stop_grace: Duration,
    /// A run this long resets the crash count.
    pub(crate) stable_after: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            idle_stop: Duration::from_secs(300),
            max_running: 20,
            backoff_first: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(60),
            crash_limit: 5,
            failed_retry: Duration::from_secs(600),
            start_timeout: Duration::from_secs(60),
            stop_grace: Duration::from_secs(30),
            stable_after: Duration::from_secs(120),
        }
    }
}

impl Policy {
    /// The restart delay after the `crashes`-th crash in a row.
    pub(crate) fn backoff(&self, crashes: u32) -> Duration {
        let doubled = self
            .backoff_first
            .saturating_mul(1u32 << crashes.saturating_sub(1).min(20));
        doubled.min(self.backoff_cap)
    }
}

/// What one read of a session's DB showed.
#[derive(Debug, Clone, Default)]
pub(crate) struct Observation {
    pub(crate) work: Work,
    pub(crate) runner: Option<RunnerState>,
    /// The DB could not be read.
    pub(crate) error: Option<String>,
}

/// What the loop is to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    Start(String),
    Stop(String, RunnerRecord),
    Kill(String, RunnerRecord),
}

#[derive(Debug)]
struct Session {
    spec: SessionSpec,
    state: SessionState,
    since: DateTime<Utc>,
    why: String,
    runner: Option<RunnerRecord>,
    runner_since: Option<DateTime<Utc>>,
    idle_since: Option<DateTime<Utc>>,
    stop_asked: Option<DateTime<Utc>>,
    crashes: u32,
    last_error: Option<String>,
    retry_at: Option<DateTime<Utc>>,
    /// When a running session is to be read again without an event (work it may hold).
    recheck_at: Option<DateTime<Utc>>,
    observed: Observation,
}

/// Every session's lifecycle.
#[derive(Debug)]
pub(crate) struct Scheduler {
    policy: Policy,
    sessions: BTreeMap<String, Session>,
}

fn after(at: DateTime<Utc>, by: Duration) -> DateTime<Utc> {
    at + chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX)
}

fn parse(ts: &str) -> Option<DateTime<Utc>> {
    schema::time::parse_ts(ts).ok()
}

impl Scheduler {
    pub(crate) fn new(policy: Policy) -> Self {
        Self {
            policy,
            sessions: BTreeMap::new(),
        }
    }

    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Makes the supervised set `found`; returns the names added and removed. A removed session
    /// with a live runner is kept until the runner ends.
    pub(crate) fn sync(
        &mut self,
        found: Vec<SessionSpec>,
        now: DateTime<Utc>,
    ) -> (Vec<String>, Vec<String>) {
        let mut added = Vec::new();
        let names: Vec<String> = found.iter().map(|s| s.name.clone()).collect();
        for spec in found {
            if !self.sessions.contains_key(&spec.name) {
                added.push(spec.name.clone());
                tracing::info!(session = %spec.name, "fleet: supervising a new session");
                self.sessions.insert(
                    spec.name.clone(),
                    Session {
                        spec,
                        state: SessionState::Stopped,
                        since: now,
                        why: "not read yet".into(),
                        runner: None,
                        runner_since: None,
                        idle_since: None,
                        stop_asked: None,
                        crashes: 0,
                        last_error: None,
                        retry_at: None,
                        recheck_at: None,
                        observed: Observation::default(),
                    },
                );
            }
        }
        let removed: Vec<String> = self
            .sessions
            .iter()
            .filter(|(name, s)| !names.contains(name) && s.runner.is_none())
            .map(|(name, _)| name.clone())
            .collect();
        for name in &removed {
            tracing::info!(session = %name, "fleet: session gone from the root");
            self.sessions.remove(name);
        }
        (added, removed)
    }

    pub(crate) fn spec(&self, name: &str) -> Option<&SessionSpec> {
        self.sessions.get(name).map(|s| &s.spec)
    }

    pub(crate) fn names(&self) -> Vec<String> {
        self.sessions.keys().cloned().collect()
    }

    /// The live runners: (session, runner).
    pub(crate) fn live(&self) -> Vec<(String, RunnerRecord)> {
        self.sessions
            .iter()
            .filter_map(|(name, s)| Some((name.clone(), s.runner?)))
            .collect()
    }

    /// Whether `name` has no runner.
    pub(crate) fn without_runner(&self, name: &str) -> bool {
        self.sessions.get(name).is_some_and(|s| s.runner.is_none())
    }

    fn set(session: &mut Session, state: SessionState, why: String, now: DateTime<Utc>) {
        if session.state != state {
            tracing::info!(
                session = %session.spec.name,
                from = session.state.label(),
                to = state.label(),
                why = %why,
                "fleet: session state"
            );
            session.state = state;
            session.since = now;
        }
        session.why = why;
    }

    /// A runner of `name` is live: started now, or adopted.
    pub(crate) fn runner_started(
        &mut self,
        name: &str,
        runner: RunnerRecord,
        adopted: bool,
        now: DateTime<Utc>,
    ) {
        let Some(session) = self.sessions.get_mut(name) else {
            return;
        };
        session.runner = Some(runner);
        session.runner_since = Some(now);
        session.idle_since = None;
        session.stop_asked = None;
        session.retry_at = None;
        if adopted {
            Self::set(
                session,
                SessionState::Running,
                "adopted after a fleet restart".into(),
                now,
            );
        } else {
            let why = match session.state {
                SessionState::BackingOff | SessionState::Failed => {
                    format!("restarted after {} crash(es)", session.crashes)
                }
                _ => "work due".into(),
            };
            Self::set(session, SessionState::Starting, why, now);
        }
    }

    /// Starting `name`'s runner failed.
    pub(crate) fn start_failed(&mut self, name: &str, error: String, now: DateTime<Utc>) {
        self.crash(name, error, now);
    }

    /// What a read of `name`'s DB showed.
    pub(crate) fn observe(&mut self, name: &str, observed: Observation, now: DateTime<Utc>) {
        let Some(session) = self.sessions.get_mut(name) else {
            return;
        };
        session.observed = observed;
        let Some(runner) = session.runner else {
            return;
        };
        if matches!(session.state, SessionState::Stopping) {
            return;
        }
        let observed = &session.observed;
        let Some(row) = observed.runner.as_ref() else {
            return;
        };
        let ours = row.pid == Some(i64::from(runner.pid));
        if !ours || row.status == "starting" || row.status == "stopped" {
            return;
        }
        let work = observed.work;
        let deadline = work.question_deadline.filter(|d| *d > now);
        let row_since = parse(&row.updated_at);
        let idle_since = [session.runner_since, row_since]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(now);
        // Work due while the runner says idle is work it has not polled yet (a runner just
        // started, or one woken by a commit), unless it stays there for HELD_WORK_GRACE: then
        // the runner saw it and holds it (a budget, a gate), and it is idle all the same.
        let held_until = after(idle_since, HELD_WORK_GRACE);
        let unseen_work = work.due_since.is_some() && now < held_until;
        session.recheck_at = unseen_work.then_some(held_until);
        let (busy, why) = match row.status.as_str() {
            "busy" => (true, "turn running".to_owned()),
            "waiting_user" if deadline.is_some() => (
                true,
                format!(
                    "turn waiting for an answer until {}",
                    deadline.map(schema::time::format_ts).unwrap_or_default()
                ),
            ),
            _ if unseen_work => (true, "work due".to_owned()),
            _ => (false, String::new()),
        };
        if busy {
            session.idle_since = None;
            Self::set(session, SessionState::Running, why, now);
        } else {
            let since = match row.status.as_str() {
                "waiting_user" => work.question_deadline.unwrap_or(idle_since).max(idle_since),
                _ => idle_since,
            };
            session.idle_since = Some(since);
            let why = format!(
                "no work; stopped at {} unless work comes",
                schema::time::format_ts(after(since, self.policy.idle_stop))
            );
            Self::set(session, SessionState::Idle, why, now);
        }
    }

    /// `name`'s runner `runner` ended; `error` is what its log or exit said.
    pub(crate) fn exited(
        &mut self,
        name: &str,
        runner: RunnerRecord,
        error: String,
        now: DateTime<Utc>,
    ) {
        let Some(session) = self.sessions.get_mut(name) else {
            return;
        };
        if session.runner != Some(runner) {
            return;
        }
        session.runner = None;
        session.idle_since = None;
        let uptime = session
            .runner_since
            .map(|since| (now - since).to_std().unwrap_or_default())
            .unwrap_or_default();
        if session.stop_asked.take().is_some() {
            session.crashes = 0;
            let why = format!("stopped ({})", session.why);
            Self::set(session, SessionState::Stopped, why, now);
            return;
        }
        if uptime >= self.policy.stable_after {
            session.crashes = 0;
        }
        self.crash(name, error, now);
    }

    fn crash(&mut self, name: &str, error: String, now: DateTime<Utc>) {
        let policy = self.policy.clone();
        let Some(session) = self.sessions.get_mut(name) else {
            return;
        };
        session.runner = None;
        session.crashes += 1;
        session.last_error = Some(error);
        if session.crashes >= policy.crash_limit {
            let retry = after(now, policy.failed_retry);
            session.retry_at = Some(retry);
            let why = format!(
                "{} crashes in a row; retried at {}",
                session.crashes,
                schema::time::format_ts(retry)
            );
            tracing::error!(session = %name, crashes = session.crashes, last_error = ?session.last_error, "fleet: session failed");
            Self::set(session, SessionState::Failed, why, now);
        } else {
            let delay = policy.backoff(session.crashes);
            session.retry_at = Some(after(now, delay));
            let why = format!(
                "crash {} in a row; restart in {}s",
                session.crashes,
                delay.as_secs_f64()
            );
            tracing::warn!(session = %name, crashes = session.crashes, last_error = ?session.last_error, "fleet: runner crashed");
            Self::set(session, SessionState::BackingOff, why, now);
        }
    }

    /// Marks every live runner as asked to stop (the fleet's own shutdown); returns them.
    pub(crate) fn stop_all(&mut self, now: DateTime<Utc>) -> Vec<(String, RunnerRecord)> {
        let mut out = Vec::new();
        for (name, session) in &mut self.sessions {
            if let Some(runner) = session.runner {
                session.stop_asked.get_or_insert(now);
                Self::set(
                    session,
                    SessionState::Stopping,
                    "the fleet stops".into(),
                    now,
                );
                out.push((name.clone(), runner));
            }
        }
        out
    }

    /// The actions due at `now`.
    pub(crate) fn decide(&mut self, now: DateTime<Utc>) -> Vec<Action> {
        let policy = self.policy.clone();
        let mut actions = Vec::new();
        // Who wants a runner, oldest due work first.
        let mut wanting: Vec<(DateTime<Utc>, String)> = Vec::new();
        for (name, session) in &mut self.sessions {
            if session.runner.is_some() {
                continue;
            }
            let due = session.observed.work.due_since;
            let retry_due = session.retry_at.is_none_or(|at| at <= now);
            match (due, session.state) {
                (Some(due), SessionState::BackingOff | SessionState::Failed) if retry_due => {
                    wanting.push((due, name.clone()))
                }
                (Some(due), SessionState::Stopped) => wanting.push((due, name.clone())),
                (None, SessionState::BackingOff) if retry_due => {
                    let why = format!("no work (after crash {} in a row)", session.crashes);
                    Self::set(session, SessionState::Stopped, why, now);
                }
                (None, SessionState::Stopped) => {
                    let why = match (&session.observed.error, session.observed.work.next_at) {
                        (Some(error), _) => format!("cannot read the DB: {error}"),
                        (None, Some(next)) => {
                            format!("no work; next due {}", schema::time::format_ts(next))
                        }
                        (None, None) => "no work".into(),
                    };
                    Self::set(session, SessionState::Stopped, why, now);
                }
                _ => {}
            }
        }
        wanting.sort();
        let live = self
            .sessions
            .values()
            .filter(|s| s.runner.is_some())
            .count();
        let slots = policy.max_running.saturating_sub(live);
        let waiting = wanting.len() > slots;
        for (position, (_, name)) in wanting.iter().enumerate() {
            if position < slots {
                actions.push(Action::Start(name.clone()));
            } else if let Some(session) = self.sessions.get_mut(name) {
                let why = format!(
                    "queued: maxRunning {} reached ({} ahead)",
                    policy.max_running,
                    position - slots
                );
                if session.state == SessionState::Stopped {
                    Self::set(session, SessionState::Stopped, why, now);
                }
            }
        }
        for (name, session) in &mut self.sessions {
            let Some(runner) = session.runner else {
                continue;
            };
            match session.state {
                SessionState::Starting => {
                    let since = session.runner_since.unwrap_or(now);
                    if now >= after(since, policy.start_timeout) {
                        tracing::warn!(session = %name, "fleet: the runner did not report in time; killing it");
                        actions.push(Action::Kill(name.clone(), runner));
                    }
                }
                SessionState::Idle => {
                    let Some(since) = session.idle_since else {
                        continue;
                    };
                    let idle_for = (now - since).to_std().unwrap_or_default();
                    if idle_for >= policy.idle_stop || waiting {
                        let why = if waiting && idle_for < policy.idle_stop {
                            "idle; its slot goes to a queued session".to_owned()
                        } else {
                            format!("idle for {}s", idle_for.as_secs())
                        };
                        session.stop_asked = Some(now);
                        Self::set(session, SessionState::Stopping, why, now);
                        actions.push(Action::Stop(name.clone(), runner));
                    }
                }
                SessionState::Stopping => {
                    let asked = session.stop_asked.unwrap_or(now);
                    if now >= after(asked, policy.stop_grace) {
                        tracing::warn!(session = %name, "fleet: the runner did not stop in time; killing it");
                        actions.push(Action::Kill(name.clone(), runner));
                        session.stop_asked = Some(now);
                    }
                }
                _ => {}
            }
        }
        actions
    }

    /// When something is next due without an event: a row falling due, an idle runner's stop,
    /// a restart, a start or stop deadline.
    pub(crate) fn next_wake(&self) -> Option<DateTime<Utc>> {
        let policy = &self.policy;
        self.sessions
            .values()
            .filter_map(|s| match s.state {
                SessionState::Stopped => s.observed.work.next_at,
                SessionState::BackingOff | SessionState::Failed => s.retry_at,
                SessionState::Idle => s.idle_since.map(|since| after(since, policy.idle_stop)),
                SessionState::Running => [s.observed.work.question_deadline, s.recheck_at]
                    .into_iter()
                    .flatten()
                    .min(),
                SessionState::Starting => s.runner_since.map(|t| after(t, policy.start_timeout)),
                SessionState::Stopping => s.stop_asked.map(|t| after(t, policy.stop_grace)),
            })
            .min()
    }

    /// Every session's line for `status.json`.
    pub(crate) fn lines(&self) -> Vec<SessionStatus> {
        self.sessions
            .values()
            .map(|s| SessionStatus {
                name: s.spec.name.clone(),
                state: s.state,
                since: schema::time::format_ts(s.since),
                why: s.why.clone(),
                runner: s.runner,
                crashes: s.crashes,
                last_error: s.last_error.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
