//! Spending limits (issue 14; docs/contract/config.md#budgets). Before a query starts the runner
//! asks [`Budget::exhausted`]; while a limit is reached it starts nothing, leaves the rows
//! `pending`, writes one `budget_exceeded` row per window ([`Budget::notice`]) and waits for the
//! window's end, a DB change or a raised limit (config.json is read again when it changes:
//! [`BudgetReload`]). Spending is the ledger's (`turn_usage`), read once per window and then
//! kept up to date from the rows the runner records ([`Budget::recorded`]), so a query's start
//! costs no SQL. A turn without a reported cost counts 0 toward the cost limits; its tokens count.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use schema::content::out;
use schema::{NewMessageOut, NewTurnUsage, OutKind, Routing, SessionDb, WaitingOn};
use serde_json::{json, Value};

/// The spending limits; `None` is no limit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BudgetLimits {
    /// Cost of the whole session, US dollars (`maxCostUsdPerSession`).
    pub max_cost_usd_per_session: Option<f64>,
    /// Cost of one day in the configured time zone, US dollars (`maxCostUsdPerDay`).
    pub max_cost_usd_per_day: Option<f64>,
    /// Tokens of one day: input, output, cache reads and writes (`maxTokensPerDay`).
    pub max_tokens_per_day: Option<u64>,
}

impl BudgetLimits {
    /// Whether no limit is set.
    pub fn is_unlimited(&self) -> bool {
        *self == Self::default()
    }
}

/// Reads the limits again; called when the file changed.
pub type LoadLimits = Arc<dyn Fn() -> anyhow::Result<BudgetLimits> + Send + Sync>;

/// Where raised (or lowered) limits come from while the runner runs: `file` (config.json) is
/// looked at while a limit holds the queue, and `load` reads the limits again when its content
/// changed.
#[derive(Clone)]
pub struct BudgetReload {
    /// The file to watch.
    pub file: PathBuf,
    /// Reads the limits from it (flags and the environment still win).
    pub load: LoadLimits,
}

impl std::fmt::Debug for BudgetReload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetReload")
            .field("file", &self.file)
            .finish()
    }
}

/// The budget part of the runner's options.
#[derive(Debug, Clone, Default)]
pub struct BudgetOptions {
    /// The limits at start.
    pub limits: BudgetLimits,
    /// How to read them again; `None`: they stay as they are.
    pub reload: Option<BudgetReload>,
}

/// Which limit is reached, with the figures the `budget_exceeded` row carries.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Exhausted {
    /// The config key of the limit.
    pub(crate) limit: &'static str,
    /// The limit's value.
    pub(crate) max: Value,
    /// What the window spent.
    pub(crate) spent: Value,
    /// `session` or `day`.
    pub(crate) window: &'static str,
    /// When the window ends (a day's end); `None` for the session.
    pub(crate) resets_at: Option<DateTime<Utc>>,
}

impl Exhausted {
    /// The `budget_exceeded` payload (docs/contract/content.md).
    fn payload(&self) -> Value {
        json!({
            "limit": self.limit,
            "max": self.max,
            "spent": self.spent,
            "window": self.window,
            "resetsAt": self.resets_at.map(schema::time::format_ts),
        })
    }

    /// Whether `payload` (of a row written before, maybe by an earlier run) announced this
    /// same window of this same limit.
    fn announced_by(&self, payload: &Value) -> bool {
        let mine = self.payload();
        ["limit", "max", "window", "resetsAt"]
            .iter()
            .all(|key| payload.get(key) == mine.get(key))
    }

    /// How long nothing can change by itself: until the window ends, at most `poll` (a limit
    /// raised in config.json or a changed DB is noticed at the next look).
    pub(crate) fn wait(&self, now: DateTime<Utc>, poll: Duration) -> Duration {
        match self.resets_at {
            Some(at) => (at - now)
                .to_std()
                .unwrap_or(Duration::ZERO)
                .max(Duration::from_millis(5))
                .min(poll),
            None => poll,
        }
    }

    /// What `runner_state.waiting_on` says while this limit holds the queue.
    pub(crate) fn waiting_on(&self, since: DateTime<Utc>) -> WaitingOn {
        let resets = match self.resets_at {
            Some(at) => format!("; resets at {}", schema::time::format_ts(at)),
            None => "; raise it to resume".to_owned(),
        };
        WaitingOn {
            endpoint: format!("the budget {}", self.limit),
            since: schema::time::format_ts(since),
            notices: 0,
            last_notice: Some(format!(
                "spent {} of {} this {}{resets}",
                self.spent, self.max, self.window
            )),
            budget: Some(self.limit.to_owned()),
            approval: None,
            question_id: None,
        }
    }
}

/// What the ledger says was spent, kept current by [`Budget::recorded`].
#[derive(Debug, Clone, Copy, PartialEq)]
struct Spent {
    session_cost: f64,
    /// The local day `[start, end)` the day figures are for.
    day: (DateTime<Utc>, DateTime<Utc>),
    day_cost: f64,
    day_tokens: u64,
}

#[derive(Debug)]
struct State {
    limits: BudgetLimits,
    reload: Option<BudgetReload>,
    /// A digest of the reload file's content when last read.
    stamp: Option<u64>,
    spent: Option<Spent>,
    /// The limit whose `budget_exceeded` row is written (or found) for its window.
    announced: Option<Value>,
    /// Whether a limit holds the queue (`waiting_on` written).
    holding: bool,
    /// When the reload file was last looked at.
    looked: Option<std::time::Instant>,
}

/// The runner's budget: limits, spending and what was announced. A cheap handle (the loop's
/// DB calls take `'static` closures).
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    state: Arc<Mutex<State>>,
    timezone: Tz,
}

impl Budget {
    /// A budget with `options`, days counted in `timezone`.
    pub(crate) fn new(options: BudgetOptions, timezone: Tz) -> Self {
        let stamp = options.reload.as_ref().map(|reload| stamp_of(&reload.file));
        Self {
            state: Arc::new(Mutex::new(State {
                limits: options.limits,
                reload: options.reload,
                stamp: stamp.flatten(),
                spent: None,
                announced: None,
                holding: false,
                looked: None,
            })),
            timezone,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a limit may ever hold the queue (a limit is set, or may be set by a reload).
    pub(crate) fn is_active(&self) -> bool {
        let state = self.state();
        !state.limits.is_unlimited() || state.reload.is_some()
    }

    /// Whether a limit is set now (else nothing can be reached, and the loop asks nothing).
    pub(crate) fn has_limit(&self) -> bool {
        !self.state().limits.is_unlimited()
    }

    /// The limit reached at `now`, if any (blocking: reads the ledger at the first call and
    /// when a new day starts). With no limit set, no SQL at all.
    pub(crate) fn exhausted(
        &self,
        db: &SessionDb,
        now: DateTime<Utc>,
    ) -> Result<Option<Exhausted>, schema::Error> {
        let mut state = self.state();
        if state.limits.is_unlimited() {
            return Ok(None);
        }
        let spent = match state.spent.filter(|s| now >= s.day.0 && now < s.day.1) {
            Some(spent) => spent,
            None => {
                let day = schema::day_window(now, self.timezone);
                let today = db.usage_between(day.0, day.1)?;
                let session_cost = match state.spent {
                    Some(spent) => spent.session_cost,
                    None => db.usage_total()?.cost_usd.sum.unwrap_or(0.0),
                };
                let spent = Spent {
                    session_cost,
                    day,
                    day_cost: today.cost_usd.sum.unwrap_or(0.0),
                    day_tokens: today.tokens.sum.unwrap_or(0),
                };
                state.spent = Some(spent);
                spent
            }
        };
        Ok(exhausted_by(&state.limits, &spent))
    }

    /// Whether a limit is reached by what is known in memory (no SQL): the running turn takes
    /// no further pushes then. A new day not yet read counts as not reached.
    pub(crate) fn reached(&self, now: DateTime<Utc>) -> bool {
        let state = self.state();
        state
            .spent
            .filter(|s| now >= s.day.0 && now < s.day.1)
            .is_some_and(|spent| exhausted_by(&state.limits, &spent).is_some())
    }

    /// A ledger row was written at `now`: its figures count from now on.
    pub(crate) fn recorded(&self, row: &NewTurnUsage, now: DateTime<Utc>) {
        let mut state = self.state();
        let Some(spent) = state.spent.as_mut() else {
            return;
        };
        let cost = row.cost_usd.filter(|c| c.is_finite()).unwrap_or(0.0);
        spent.session_cost += cost;
        if now >= spent.day.0 && now < spent.day.1 {
            spent.day_cost += cost;
            spent.day_tokens = spent.day_tokens.saturating_add(row.tokens());
        }
    }

    /// Reads the limits again when the reload file changed since it was last read: at every
    /// call while a limit holds the queue (a raise serves it at once), else at most every
    /// [`RELOAD_EVERY`] (a lowered or new limit applies within it, at no cost per message).
    /// True when the limits changed. A file that cannot be read or is invalid keeps the current
    /// limits (said once per change of the file).
    pub(crate) fn reload_if_changed(&self) -> bool {
        let mut state = self.state();
        let now = std::time::Instant::now();
        let due = state
            .looked
            .is_none_or(|at| now.duration_since(at) >= RELOAD_EVERY);
        if !state.holding && !due {
            return false;
        }
        let Some(reload) = state.reload.clone() else {
            return false;
        };
        state.looked = Some(now);
        let stamp = stamp_of(&reload.file);
        if stamp == state.stamp {
            return false;
        }
        state.stamp = stamp;
        match (reload.load)() {
            Ok(limits) if limits != state.limits => {
                tracing::info!(?limits, file = %reload.file.display(), "budget limits changed");
                state.limits = limits;
                true
            }
            Ok(_) => false,
            Err(err) => {
                tracing::warn!(
                    error = %format!("{err:#}"),
                    file = %reload.file.display(),
                    "cannot read the budget limits again; the current ones stay"
                );
                false
            }
        }
    }

    /// The `budget_exceeded` row for `exhausted`, addressed to `to` (routing and the row it
    /// answers), unless this window of this limit was announced already: by this run, or by
    /// an earlier one (the newest such row in the DB). Blocking (one read).
    pub(crate) fn notice(
        &self,
        db: &SessionDb,
        exhausted: &Exhausted,
        to: (Routing, Option<String>),
    ) -> Result<Option<NewMessageOut>, schema::Error> {
        let mut state = self.state();
        let payload = exhausted.payload();
        if state
            .announced
            .as_ref()
            .is_some_and(|seen| exhausted.announced_by(seen))
        {
            return Ok(None);
        }
        let newest = db.last_system_out("budget_exceeded")?.and_then(|row| {
            serde_json::from_str::<Value>(&row.content)
                .ok()
                .and_then(|content| content.get("payload").cloned())
        });
        state.announced = Some(payload.clone());
        if newest.is_some_and(|seen| exhausted.announced_by(&seen)) {
            return Ok(None);
        }
        let (routing, in_reply_to) = to;
        let content = out::system_action("budget_exceeded", payload);
        Ok(Some(
            NewMessageOut::new(OutKind::System, routing, &content).replying_to(in_reply_to),
        ))
    }

    /// The queue is held; true the first time (until [`Budget::release`]).
    pub(crate) fn hold(&self) -> bool {
        !std::mem::replace(&mut self.state().holding, true)
    }

    /// The queue is free; true when it was held.
    pub(crate) fn release(&self) -> bool {
        std::mem::replace(&mut self.state().holding, false)
    }
}

/// How often config.json is looked at for changed limits while no limit holds the queue.
const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// The first limit `spent` reaches: the session's (only a raise ends it), then the day's cost,
/// then the day's tokens.
fn exhausted_by(limits: &BudgetLimits, spent: &Spent) -> Option<Exhausted> {
    // Costs are sums of floats: shown to the micro-dollar.
    let usd = |amount: f64| json!((amount * 1e6).round() / 1e6);
    let day = Some(spent.day.1);
    let checks = [
        (
            "maxCostUsdPerSession",
            limits
                .max_cost_usd_per_session
                .map(|max| (json!(max), spent.session_cost >= max)),
            usd(spent.session_cost),
            None,
        ),
        (
            "maxCostUsdPerDay",
            limits
                .max_cost_usd_per_day
                .map(|max| (json!(max), spent.day_cost >= max)),
            usd(spent.day_cost),
            day,
        ),
        (
            "maxTokensPerDay",
            limits
                .max_tokens_per_day
                .map(|max| (json!(max), spent.day_tokens >= max)),
            json!(spent.day_tokens),
            day,
        ),
    ];
    checks
        .into_iter()
        .find_map(|(limit, check, spent, resets_at)| match check {
            Some((max, true)) => Some(Exhausted {
                limit,
                max,
                spent,
                window: if resets_at.is_some() {
                    "day"
                } else {
                    "session"
                },
                resets_at,
            }),
            _ => None,
        })
}

/// A digest of `file`'s content; `None` when it cannot be read (absent). The content, not the
/// modification time: two edits within the file system's time granularity differ too, and
/// config.json is small (read at most once per idle poll, and only while a limit holds).
fn stamp_of(file: &std::path::Path) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let content = fsguard::read(file).ok()?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    content.hash(&mut hasher);
    Some(hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spent(session_cost: f64, day_cost: f64, day_tokens: u64) -> Spent {
        let start = schema::time::parse_ts("2026-11-23T23:00:00Z").unwrap();
        Spent {
            session_cost,
            day: (start, start + chrono::Duration::days(1)),
            day_cost,
            day_tokens,
        }
    }

    #[test]
    fn the_first_reached_limit_names_its_window() {
        let limits = BudgetLimits {
            max_cost_usd_per_session: Some(1.0),
            max_cost_usd_per_day: Some(0.5),
            max_tokens_per_day: Some(1000),
        };
        assert_eq!(exhausted_by(&limits, &spent(0.9, 0.4, 999)), None);
        let day = exhausted_by(&limits, &spent(0.9, 0.5, 0)).unwrap();
        assert_eq!(
            day.payload(),
            json!({"limit": "maxCostUsdPerDay", "max": 0.5, "spent": 0.5, "window": "day",
                   "resetsAt": "2026-11-24T23:00:00.000Z"})
        );
        let tokens = exhausted_by(&limits, &spent(0.0, 0.0, 1000)).unwrap();
        assert_eq!(tokens.limit, "maxTokensPerDay");
        assert_eq!(tokens.spent, json!(1000));
        let session = exhausted_by(&limits, &spent(1.0000001, 0.9, 5000)).unwrap();
        assert_eq!(
            session.payload(),
            json!({"limit": "maxCostUsdPerSession", "max": 1.0, "spent": 1.0,
                   "window": "session", "resetsAt": null})
        );
        assert!(exhausted_by(&BudgetLimits::default(), &spent(9.0, 9.0, 9)).is_none());
    }

    #[test]
    fn a_window_is_announced_once_and_a_raised_limit_is_a_new_one() {
        let limits = BudgetLimits {
            max_cost_usd_per_day: Some(0.5),
            ..BudgetLimits::default()
        };
        let first = exhausted_by(&limits, &spent(0.0, 0.7, 0)).unwrap();
        // More spent in the same window: the same announcement.
        let later = exhausted_by(&limits, &spent(0.0, 0.9, 0)).unwrap();
        assert!(later.announced_by(&first.payload()));
        let raised = BudgetLimits {
            max_cost_usd_per_day: Some(0.8),
            ..limits
        };
        let after_raise = exhausted_by(&raised, &spent(0.0, 0.9, 0)).unwrap();
        assert!(!after_raise.announced_by(&first.payload()));
        let mut next_day = spent(0.0, 0.9, 0);
        next_day.day.1 += chrono::Duration::days(1);
        let tomorrow = exhausted_by(&limits, &next_day).unwrap();
        assert!(!tomorrow.announced_by(&first.payload()));
    }

    #[test]
    fn the_wait_ends_with_the_window_or_the_poll() {
        let limits = BudgetLimits {
            max_tokens_per_day: Some(1),
            ..BudgetLimits::default()
        };
        let exhausted = exhausted_by(&limits, &spent(0.0, 0.0, 5)).unwrap();
        let end = exhausted.resets_at.unwrap();
        let poll = Duration::from_secs(1);
        assert_eq!(
            exhausted.wait(end - chrono::Duration::milliseconds(300), poll),
            Duration::from_millis(300)
        );
        assert_eq!(exhausted.wait(end - chrono::Duration::hours(3), poll), poll);
        assert_eq!(exhausted.wait(end, poll), Duration::from_millis(5));
    }
}
