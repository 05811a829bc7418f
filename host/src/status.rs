//! `status`: the runner's state and how long it has been in it, the turn's last provider event,
//! the queue with the rows in flight and their age, the last `query_error`, the next due time,
//! the task series, the health verdict, and what to do about what is wrong.

use std::time::Duration;

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use schema::health::{self, HealthLimits};
use schema::time::{format_ts, parse_ts};
use schema::{
    InStatus, InboundContent, LastEvent, MessageIn, QueueCounts, Routing, SessionDb, UsageTotals,
    WaitingOn,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::init::format_routing;
use crate::send::excerpt;
use crate::sweep::DEFAULT_STALE_AFTER_SECS;
use crate::system_rows::{BudgetExceeded, Progress};
use crate::timefmt::{ago, format_duration, until};
use crate::usage::{cost, count, turn_notes};

/// A heartbeat older than this (while the runner is not stopped) is flagged as stale: three
/// heartbeats at the runner's longest interval (10 s).
pub const STALE_HEARTBEAT_SECS: i64 = 30;

/// Rows `processing` listed one per line; the rest are counted.
const PROCESSING_SHOWN: usize = 5;

/// The host's health limits: a heartbeat stale after `stale_after` (the host does not know the
/// runner's interval: [`STALE_HEARTBEAT_SECS`] by default), a turn silent for `max_turn_silence`.
pub fn host_limits(stale_after: Duration, max_turn_silence: Duration) -> HealthLimits {
    HealthLimits {
        stale_heartbeat: stale_after,
        max_turn_silence,
        lock_wait: health::DEFAULT_LOCK_WAIT,
    }
}

/// The limits `status` judges by: the defaults of `nanoclaw health`.
pub fn default_limits() -> HealthLimits {
    host_limits(
        Duration::from_secs(STALE_HEARTBEAT_SECS.unsigned_abs()),
        health::DEFAULT_MAX_TURN_SILENCE,
    )
}

/// The runner_state row with derived ages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerReport {
    /// `starting`, `idle`, `busy`, `waiting_user` or `stopped`.
    pub status: String,
    /// When the runner entered this status, as stored.
    pub since: String,
    /// Seconds it has been in this status.
    pub since_secs: Option<i64>,
    /// Runner pid.
    pub pid: Option<i64>,
    /// Provider name.
    pub provider: Option<String>,
    /// Tool the agent is in, if known.
    pub current_tool: Option<String>,
    /// The current turn's last provider event (none in this status yet: `None`).
    pub last_event: Option<LastEvent>,
    /// Seconds since that event.
    pub last_event_age_secs: Option<i64>,
    /// Seconds the running turn has gone without a provider event (busy only).
    pub turn_silence_secs: Option<i64>,
    /// What a turn without progress waits on (the model endpoint, since when, retry notices).
    pub waiting_on: Option<WaitingOn>,
    /// Seconds it has waited so far.
    pub waiting_secs: Option<i64>,
    /// Last heartbeat as stored.
    pub heartbeat_at: String,
    /// Seconds since the last heartbeat (`None` when the stored time is unreadable).
    pub heartbeat_age_secs: Option<i64>,
    /// True when the runner is not stopped but its heartbeat is older than the limit.
    pub heartbeat_stale: bool,
}

/// A row the runner claimed and has not finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessingRow {
    /// Row id.
    pub id: String,
    /// Its seq.
    pub seq: Option<i64>,
    /// Its kind.
    pub kind: String,
    /// When it was claimed (`status_changed`), as stored.
    pub since: Option<String>,
    /// Seconds it has been processing.
    pub since_secs: Option<i64>,
    /// Claims so far.
    pub tries: i64,
}

/// The newest `query_error` row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastError {
    /// Its seq in messages_out.
    pub seq: Option<i64>,
    /// When it was written, as stored.
    pub at: String,
    /// Seconds ago.
    pub age_secs: Option<i64>,
    /// Error class (`gateway_error`, `rate_limited`, …).
    pub classification: Option<String>,
    /// Whether retrying may succeed.
    pub retryable: Option<bool>,
    /// The error message.
    pub message: String,
    /// The rows the failed query left processing.
    pub message_ids: Vec<String>,
    /// Not before this time, for a rate limit.
    pub retry_at: Option<String>,
}

/// The health verdict, as `nanoclaw health` gives it with its default limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthReport {
    /// True when the runner is alive and making progress.
    pub healthy: bool,
    /// The verdict in words (for an unhealthy runner, the reason and its fix).
    pub reason: String,
}

impl HealthReport {
    /// The verdict on the DB at `db_path` (read once, read-only) against `limits` at `now`:
    /// `nanoclaw health`'s and the API's.
    pub fn check(db_path: &std::path::Path, limits: &HealthLimits, now: DateTime<Utc>) -> Self {
        Self::from_verdict(schema::health::check(db_path, limits, now))
    }

    /// The report of a verdict of `schema::health::check`.
    pub fn from_verdict(
        verdict: Result<schema::health::Healthy, schema::health::Unhealthy>,
    ) -> Self {
        match verdict {
            Ok(healthy) => Self {
                healthy: true,
                reason: healthy.to_string(),
            },
            Err(unhealthy) => Self {
                healthy: false,
                reason: unhealthy.to_string(),
            },
        }
    }
}

/// One pending or paused occurrence of a task series.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskSeries {
    /// Series id (the first occurrence's id).
    pub series_id: String,
    /// Id of this occurrence.
    pub id: String,
    /// `pending` or `paused`.
    pub status: String,
    /// Next run, RFC 3339 UTC (`None`: as soon as possible).
    pub next_run: Option<String>,
    /// Cron expression, for recurring series.
    pub recurrence: Option<String>,
    /// The start of the prompt.
    pub prompt: String,
}

/// Everything `status` reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    /// DB path.
    pub db: String,
    /// When the report was made.
    pub now: String,
    /// The runner, if one ever started.
    pub runner: Option<RunnerReport>,
    /// Queue counts.
    pub counts: QueueCounts,
    /// Rows `processing`, oldest claim first.
    pub processing: Vec<ProcessingRow>,
    /// The newest `query_error` row.
    pub last_error: Option<LastError>,
    /// Earliest due time of a pending row, RFC 3339 UTC (`now` when due already; `None` when
    /// nothing is pending).
    pub next_due: Option<String>,
    /// Seconds until `next_due` (0 when due).
    pub next_due_in_secs: Option<i64>,
    /// Pending and paused task occurrences, by next run.
    pub tasks: Vec<TaskSeries>,
    /// The session's default routing.
    pub routing: Option<Routing>,
    /// Destination names.
    pub destinations: Vec<String>,
    /// The health verdict.
    pub health: HealthReport,
    /// What to do, one sentence each (empty when nothing is wrong).
    pub hints: Vec<String>,
    /// The model `/model` chose for this session (`None`: the configured one).
    pub model: Option<String>,
    /// The newest `progress` row of the running turn.
    pub progress: Option<ProgressNow>,
    /// The newest `budget_exceeded` row while it holds the queue (rows pending, no turn since).
    pub budget: Option<BudgetNow>,
    /// Today's (in the session's TZ) and the whole session's usage, from the ledger.
    pub usage: StatusUsage,
}

/// What the ledger adds up to, today and in all.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusUsage {
    /// Turns recorded today, in the session's time zone.
    pub today: UsageTotals,
    /// Every turn of the session.
    pub session: UsageTotals,
}

/// The running turn's newest `progress` row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgressNow {
    /// Its payload: the tool, its summary, how long it had run.
    #[serde(flatten)]
    pub progress: Progress,
    /// When the row was written, as stored.
    pub at: String,
    /// Seconds ago.
    pub age_secs: Option<i64>,
}

/// A `budget_exceeded` row that still holds the queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetNow {
    /// Its payload: the limit, what was spent, the window and when it resets.
    #[serde(flatten)]
    pub budget: BudgetExceeded,
    /// When the row was written, as stored.
    pub at: String,
}

/// Gathers the report at `now`, judging health by `limits`.
pub fn status(db: &SessionDb, now: DateTime<Utc>, limits: &HealthLimits) -> Result<StatusReport> {
    let state = db.runner_state().context("reading runner_state")?;
    let counts = db.counts(now).context("counting messages_in")?;
    let verdict = health::verdict(db.path(), state.as_ref(), counts.processing, limits, now);
    let heartbeat_stale = matches!(verdict, Err(health::Unhealthy::StaleHeartbeat { .. }));
    let runner = state
        .as_ref()
        .map(|state| runner_report(state, heartbeat_stale, now));
    let processing = processing_rows(db, now)?;
    let last_error = last_query_error(db, now)?;
    let next_due = db.next_due().context("reading the next due time")?;
    let tasks = task_list(db)?;
    let destinations = db
        .destinations()
        .context("reading destinations")?
        .into_iter()
        .map(|d| d.name)
        .collect();
    let progress = runner
        .as_ref()
        .filter(|runner| matches!(runner.status.as_str(), "busy" | "waiting_user"))
        .map(|runner| turn_progress(db, &runner.since, now))
        .transpose()?
        .flatten();
    let budget = budget_holding(db, &counts, now)?;
    let (today_start, today_end) = schema::day_window(now, db.timezone());
    let usage = StatusUsage {
        today: db
            .usage_between(today_start, today_end)
            .context("reading today's usage")?,
        session: db.usage_total().context("reading the session's usage")?,
    };
    let hints = hints(&verdict, &processing, last_error.as_ref(), &counts);
    Ok(StatusReport {
        db: db.path().display().to_string(),
        now: format_ts(now),
        runner,
        counts,
        processing,
        last_error,
        next_due: next_due.map(|at| format_ts(at.max(now))),
        next_due_in_secs: next_due.map(|at| (at - now).num_seconds().max(0)),
        tasks,
        routing: db.session_routing().context("reading the routing")?,
        destinations,
        health: match &verdict {
            Ok(healthy) => HealthReport {
                healthy: true,
                reason: healthy.to_string(),
            },
            Err(unhealthy) => HealthReport {
                healthy: false,
                reason: unhealthy.to_string(),
            },
        },
        hints,
        model: db.session_model().context("reading the session's model")?,
        progress,
        budget,
        usage,
    })
}

/// Seconds from the stored timestamp `stored` to `now`; `None` when it does not parse.
fn age_secs(stored: &str, now: DateTime<Utc>) -> Option<i64> {
    parse_ts(stored).ok().map(|at| (now - at).num_seconds())
}

/// The runner's row as the report shows it.
fn runner_report(
    state: &schema::RunnerState,
    heartbeat_stale: bool,
    now: DateTime<Utc>,
) -> RunnerReport {
    let age = |stored: &str| age_secs(stored, now);
    let waiting_on = state.waiting();
    let last_event = health::turn_last_event(state);
    RunnerReport {
        since: state.updated_at.clone(),
        since_secs: age(&state.updated_at).map(|secs| secs.max(0)),
        last_event_age_secs: last_event
            .as_ref()
            .and_then(|e| age(&e.at))
            .map(|s| s.max(0)),
        last_event,
        turn_silence_secs: health::turn_silence_secs(state, now),
        waiting_secs: waiting_on
            .as_ref()
            .and_then(|w| age(&w.since))
            .map(|secs| secs.max(0)),
        waiting_on,
        heartbeat_stale,
        status: state.status.clone(),
        pid: state.pid,
        provider: state.provider.clone(),
        current_tool: state.current_tool.clone(),
        heartbeat_at: state.heartbeat_at.clone(),
        heartbeat_age_secs: age(&state.heartbeat_at),
    }
}

/// The `processing` rows, the longest-held first.
fn processing_rows(db: &SessionDb, now: DateTime<Utc>) -> Result<Vec<ProcessingRow>> {
    let mut processing: Vec<ProcessingRow> = db
        .messages_in_with_status(InStatus::Processing)
        .context("reading processing rows")?
        .into_iter()
        .map(|row| ProcessingRow {
            since_secs: row
                .status_changed
                .as_deref()
                .and_then(|stored| age_secs(stored, now))
                .map(|s| s.max(0)),
            since: row.status_changed,
            id: row.id,
            seq: row.seq,
            kind: row.kind,
            tries: row.tries,
        })
        .collect();
    processing.sort_by_key(|row| std::cmp::Reverse(row.since_secs));
    Ok(processing)
}

/// The newest `query_error` system row, read tolerantly.
fn last_query_error(db: &SessionDb, now: DateTime<Utc>) -> Result<Option<LastError>> {
    Ok(db
        .last_system_out("query_error")
        .context("reading the last query_error")?
        .map(|row| {
            let content: Value = serde_json::from_str(&row.content).unwrap_or_default();
            let payload = content.get("payload").unwrap_or(&content);
            let text = |key: &str| payload.get(key).and_then(Value::as_str).map(str::to_owned);
            LastError {
                seq: row.seq,
                age_secs: age_secs(&row.timestamp, now),
                at: row.timestamp,
                classification: text("classification"),
                retryable: payload.get("retryable").and_then(Value::as_bool),
                message: text("message").unwrap_or_default(),
                message_ids: payload
                    .get("messageIds")
                    .and_then(Value::as_array)
                    .map(|ids| ids.iter().map(crate::answer::value_text).collect())
                    .unwrap_or_default(),
                retry_at: text("retryAt"),
            }
        }))
}

/// The pending and paused task series, the soonest first.
fn task_list(db: &SessionDb) -> Result<Vec<TaskSeries>> {
    let mut tasks: Vec<TaskSeries> = Vec::new();
    for status in [InStatus::Pending, InStatus::Paused] {
        let rows = db
            .messages_in_with_status(status)
            .context("reading task rows")?;
        tasks.extend(
            rows.iter()
                .filter(|row| row.kind == "task")
                .map(task_series),
        );
    }
    tasks.sort_by_key(|task| {
        task.next_run
            .as_deref()
            .and_then(|at| parse_ts(at).ok())
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
    });
    Ok(tasks)
}

/// The newest `progress` row naming a tool, when it was written in the turn running since
/// `turn_since` (an older one is a finished turn's).
fn turn_progress(
    db: &SessionDb,
    turn_since: &str,
    now: DateTime<Utc>,
) -> Result<Option<ProgressNow>> {
    let Some(row) = db
        .last_system_out("progress")
        .context("reading the last progress row")?
    else {
        return Ok(None);
    };
    let written = parse_ts(&row.timestamp).ok();
    if written
        .zip(parse_ts(turn_since).ok())
        .is_none_or(|(written, since)| written < since)
    {
        return Ok(None);
    }
    let Some(progress) = payload(&row.content).and_then(|p| Progress::from_payload(&p)) else {
        return Ok(None);
    };
    Ok(Some(ProgressNow {
        progress,
        age_secs: written.map(|at| (now - at).num_seconds().max(0)),
        at: row.timestamp,
    }))
}

/// The newest `budget_exceeded` row while it holds the queue: rows are pending, no turn was
/// recorded since it was written, and its window has not reset.
fn budget_holding(
    db: &SessionDb,
    counts: &QueueCounts,
    now: DateTime<Utc>,
) -> Result<Option<BudgetNow>> {
    if counts.pending == 0 {
        return Ok(None);
    }
    let Some(row) = db
        .last_system_out("budget_exceeded")
        .context("reading the last budget_exceeded row")?
    else {
        return Ok(None);
    };
    let Some(budget) = payload(&row.content).and_then(|p| BudgetExceeded::from_payload(&p)) else {
        return Ok(None);
    };
    let reset = budget
        .resets_at
        .as_deref()
        .and_then(|at| parse_ts(at).ok())
        .is_some_and(|at| at <= now);
    let Ok(written) = parse_ts(&row.timestamp) else {
        return Ok(None);
    };
    let served_since = db
        .usage_between(written, DateTime::<Utc>::MAX_UTC)
        .context("reading the usage ledger")?
        .turns
        > 0;
    if reset || served_since {
        return Ok(None);
    }
    Ok(Some(BudgetNow {
        budget,
        at: row.timestamp,
    }))
}

/// The `payload` of a system row's content.
fn payload(content: &str) -> Option<Value> {
    let mut value: Value = serde_json::from_str(content).ok()?;
    Some(value.get_mut("payload")?.take())
}

/// What to do: the health verdict's fix, and what the queue needs from the host's sweep.
fn hints(
    verdict: &Result<health::Healthy, health::Unhealthy>,
    processing: &[ProcessingRow],
    last_error: Option<&LastError>,
    counts: &QueueCounts,
) -> Vec<String> {
    use health::Unhealthy;
    let mut hints = Vec::new();
    let stuck = processing.len();
    match verdict {
        Err(Unhealthy::Stopped { .. } | Unhealthy::NoRunner { .. }) if stuck > 0 => {
            hints.push(format!(
                "{stuck} row(s) processing with no runner: start it (it returns them to the \
                 queue), or `nanoclaw sweep --stale-after 0` retries them now"
            ))
        }
        Err(Unhealthy::StaleHeartbeat { .. }) if stuck > 0 => hints.push(format!(
            "restart the runner; meanwhile `nanoclaw sweep --stale-after 0` retries its {stuck} \
             processing row(s) (a live runner's batch is never swept)"
        )),
        // The health line says it, with the fix.
        Err(_) => {}
        Ok(healthy) => {
            // A failed query leaves its rows processing for the host's sweep.
            let left: Vec<&str> = last_error
                .map(|error| {
                    error
                        .message_ids
                        .iter()
                        .filter(|id| processing.iter().any(|row| &row.id == *id))
                        .map(String::as_str)
                        .collect()
                })
                .unwrap_or_default();
            if !left.is_empty() && healthy.status != "busy" {
                let oldest = processing
                    .iter()
                    .filter(|row| left.contains(&row.id.as_str()))
                    .filter_map(|row| row.since_secs)
                    .max()
                    .unwrap_or(0);
                let stale_after = i64::try_from(DEFAULT_STALE_AFTER_SECS).unwrap_or(i64::MAX);
                let when = match stale_after.saturating_sub(oldest) {
                    left if left > 0 => format!("in {}", format_duration(left)),
                    _ => "now".to_owned(),
                };
                let not_before = last_error
                    .and_then(|error| error.retry_at.as_deref())
                    .map(|at| format!("; the rate limit resets at {at}, not before"))
                    .unwrap_or_default();
                hints.push(format!(
                    "the last query failed and left {} processing: `nanoclaw sweep` retries \
                     them {when} (once unchanged for --stale-after, {DEFAULT_STALE_AFTER_SECS} s \
                     by default), `nanoclaw sweep --stale-after 0` at once{not_before}",
                    left.join(", ")
                ));
            }
        }
    }
    if counts.failed > 0 {
        hints.push(format!(
            "{} row(s) failed for good (out of tries, or unusable): `nanoclaw watch \
             --no-follow` shows the system rows that say why; send them again to retry",
            counts.failed
        ));
    }
    hints
}

/// "the model at URL for 42 s (3 retry notices; last: …)".
fn waiting_text(waiting: &WaitingOn, secs: Option<i64>) -> String {
    // A turn whose CLI waits for the user's approval (issue 16): the open question to answer.
    if let Some(subject) = &waiting.approval {
        let (asked, options) = match subject.strip_suffix(" asks") {
            Some(server) => (format!("the user's answer to {server}"), "<answer>"),
            None => (format!("the user's approval of {subject}"), "Approve|Deny"),
        };
        let since = match secs {
            Some(secs) => format!("for {secs} s"),
            None => format!("since {:?}", waiting.since),
        };
        return match &waiting.question_id {
            Some(id) => format!(
                "{asked} {since}: question {id} (nanoclaw answer --question {id} --option \
                 {options})"
            ),
            None => format!("{asked} {since}"),
        };
    }
    // An idle runner held by a spending limit (the runner's budget hold).
    if let Some(limit) = &waiting.budget {
        let detail = waiting.last_notice.as_deref().unwrap_or_default();
        return format!("the budget {limit} since {:?}: {detail}", waiting.since);
    }
    let mut text = format!("the model at {}", waiting.endpoint);
    match secs {
        Some(secs) => text.push_str(&format!(" for {secs} s")),
        None => text.push_str(&format!(" since {:?}", waiting.since)),
    }
    match (waiting.notices, waiting.last_notice.as_deref()) {
        (0, _) => text.push_str(" (no output yet)"),
        (n, Some(last)) => {
            let plural = if n == 1 { "" } else { "s" };
            text.push_str(&format!(" ({n} retry notice{plural}; last: {last})"))
        }
        (n, None) => text.push_str(&format!(" ({n} retry notices)")),
    }
    text
}

fn task_series(row: &MessageIn) -> TaskSeries {
    let prompt = match InboundContent::parse(&row.kind(), &row.content) {
        InboundContent::Task(task) => task.prompt,
        InboundContent::Unparsable { raw, .. } => raw,
        _ => String::new(),
    };
    TaskSeries {
        series_id: row.series_id.clone().unwrap_or_else(|| row.id.clone()),
        id: row.id.clone(),
        status: row.status.clone(),
        next_run: row.process_after.as_deref().map(|at| {
            parse_ts(at)
                .map(format_ts)
                .unwrap_or_else(|_| at.to_owned())
        }),
        recurrence: row.recurrence.clone(),
        prompt: excerpt(&prompt, 60),
    }
}

/// `3 turns, 21220+? tokens, $0.0400+?` (`?`: not reported by the CLI), or `no turn`.
fn usage_text(totals: &UsageTotals) -> String {
    if totals.turns == 0 {
        return "no turn".to_owned();
    }
    let notes = turn_notes(totals).map_or_else(String::new, |notes| format!(" ({notes})"));
    format!(
        "{} turn{}{notes}, {} tokens, {}",
        totals.turns,
        if totals.turns == 1 { "" } else { "s" },
        count(&totals.tokens),
        cost(&totals.cost_usd)
    )
}

/// `11m 2s`, or `?` for an unreadable time.
fn secs_text(secs: Option<i64>) -> String {
    secs.map_or_else(|| "?".to_owned(), format_duration)
}

/// The `last error` line's text: when, the seq, its class and messages, and an excerpt.
fn last_error_text(error: &LastError, now: DateTime<Utc>) -> String {
    let seq = error
        .seq
        .map_or_else(|| "?".to_owned(), |seq| seq.to_string());
    let when = match parse_ts(&error.at) {
        Ok(at) => format!("{} ({})", error.at, ago(at, now)),
        Err(_) => format!("{:?}", error.at),
    };
    let ids = if error.message_ids.is_empty() {
        String::new()
    } else {
        format!(" for {}", error.message_ids.join(", "))
    };
    format!(
        "{when}, seq {seq}: {}{ids}: {}",
        error.classification.as_deref().unwrap_or("error"),
        excerpt(&error.message, 160)
    )
}

/// One task's line under `tasks`: its series, status, next run, recurrence and prompt.
fn task_text(task: &TaskSeries, now: DateTime<Utc>) -> String {
    let when = match task.next_run.as_deref() {
        None => "now".to_owned(),
        Some(at) => match parse_ts(at) {
            Ok(parsed) if parsed > now => format!("{at} ({})", until(parsed, now)),
            Ok(parsed) => format!("{at} (due, {})", ago(parsed, now)),
            Err(_) => format!("{at:?} (unreadable)"),
        },
    };
    let mut text = format!("  {}  {}  next {when}", task.series_id, task.status);
    if let Some(recurrence) = &task.recurrence {
        text.push_str(&format!("  every {recurrence:?}"));
    }
    text.push_str(&format!("  {:?}", task.prompt));
    text
}

impl StatusReport {
    /// The report as readable text, relative times measured from `now`.
    pub fn render(&self, now: DateTime<Utc>) -> String {
        let mut out = String::new();
        let mut line = |label: &str, text: String| {
            out.push_str(&format!("{label:<11} {text}\n"));
        };
        line("session DB", self.db.clone());
        match &self.runner {
            None => line("runner", "no runner has started".to_owned()),
            Some(runner) => self.render_runner(runner, &mut line),
        }
        if let Some(model) = &self.model {
            line("model", format!("{model} (chosen with /model)"));
        }
        if let Some(progress) = &self.progress {
            line(
                "progress",
                format!(
                    "{}, {} into the turn, {} ago",
                    progress.progress.text(),
                    progress.progress.elapsed_text(),
                    secs_text(progress.age_secs)
                ),
            );
        }
        let c = &self.counts;
        line(
            "queue",
            format!(
                "{} pending ({} due), {} processing, {} paused, {} failed",
                c.pending, c.due, c.processing, c.paused, c.failed
            ),
        );
        for (i, row) in self.processing.iter().take(PROCESSING_SHOWN).enumerate() {
            let seq = row
                .seq
                .map_or_else(|| "?".to_owned(), |seq| seq.to_string());
            line(
                if i == 0 { "processing" } else { "" },
                format!(
                    "{} (seq {seq}, {}) for {}, try {}",
                    row.id,
                    row.kind,
                    secs_text(row.since_secs),
                    row.tries
                ),
            );
        }
        if self.processing.len() > PROCESSING_SHOWN {
            line(
                "",
                format!("… and {} more", self.processing.len() - PROCESSING_SHOWN),
            );
        }
        if let Some(error) = &self.last_error {
            line("last error", last_error_text(error, now));
        }
        match self
            .next_due
            .as_deref()
            .and_then(|at| parse_ts(at).ok().map(|parsed| (at, parsed)))
        {
            None => line("next due", "nothing pending".to_owned()),
            Some((at, parsed)) => line("next due", format!("{at} ({})", until(parsed, now))),
        }
        if let Some(routing) = &self.routing {
            line("routing", format_routing(routing));
        }
        if !self.destinations.is_empty() {
            line("destinations", self.destinations.join(", "));
        }
        if self.tasks.is_empty() {
            line("tasks", "none".to_owned());
        } else {
            line("tasks", self.tasks.len().to_string());
            for task in &self.tasks {
                line("", task_text(task, now));
            }
        }
        line(
            "usage",
            format!(
                "today {}; session {}",
                usage_text(&self.usage.today),
                usage_text(&self.usage.session)
            ),
        );
        if let Some(budget) = &self.budget {
            line("budget", format!("exhausted: {}", budget.budget.text()));
        }
        line(
            "health",
            match self.health.healthy {
                true => "ok".to_owned(),
                false => format!("UNHEALTHY: {}", self.health.reason),
            },
        );
        for hint in &self.hints {
            line("hint", hint.clone());
        }
        out
    }

    fn render_runner(&self, runner: &RunnerReport, line: &mut impl FnMut(&str, String)) {
        let mut text = format!("{} for {}", runner.status, secs_text(runner.since_secs));
        if let Some(pid) = runner.pid {
            text.push_str(&format!(", pid {pid}"));
        }
        if let Some(provider) = &runner.provider {
            text.push_str(&format!(", provider {provider}"));
        }
        if let Some(tool) = &runner.current_tool {
            text.push_str(&format!(", in tool {tool}"));
        }
        match runner.heartbeat_age_secs {
            Some(age) => text.push_str(&format!(", heartbeat {} ago", format_duration(age))),
            None => text.push_str(&format!(
                ", heartbeat unreadable ({:?})",
                runner.heartbeat_at
            )),
        }
        if runner.heartbeat_stale {
            text.push_str(" [STALE]");
        }
        line("runner", text);
        match (&runner.last_event, runner.status.as_str()) {
            (Some(event), _) => line(
                "last event",
                format!(
                    "{} ago: {}",
                    secs_text(runner.last_event_age_secs),
                    excerpt(&event.what, 160)
                ),
            ),
            (None, "busy") => line(
                "last event",
                format!(
                    "none yet in this turn ({})",
                    secs_text(runner.turn_silence_secs)
                ),
            ),
            (None, _) => {}
        }
        if let Some(waiting) = &runner.waiting_on {
            line("waiting on", waiting_text(waiting, runner.waiting_secs));
        }
    }
}

#[cfg(test)]
mod tests {
    use expect_test::{expect, Expect};

    use super::*;

    const NOW: &str = "2026-11-23T10:00:00.000Z";

    fn now() -> DateTime<Utc> {
        parse_ts(NOW).unwrap()
    }

    fn ago(secs: i64) -> String {
        format_ts(now() - chrono::Duration::seconds(secs))
    }

    /// A session DB in `state`: the runner row (status, seconds in it, heartbeat age) and SQL
    /// run after it, with `{N}` replaced by the time N seconds before [`NOW`].
    struct Scene {
        _dir: tempfile::TempDir,
        db: SessionDb,
    }

    impl Scene {
        fn new(runner: Option<(&str, i64, i64)>) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let db = SessionDb::open(dir.path().join("session.db")).unwrap();
            if let Some((status, since, heartbeat)) = runner {
                db.set_runner_state(schema::RunnerStatus::Idle, Some(7), Some("codex"))
                    .unwrap();
                self::sql(
                    &db,
                    &format!(
                        "UPDATE runner_state SET status = '{status}', updated_at = '{}', \
                         heartbeat_at = '{}'",
                        ago(since),
                        ago(heartbeat)
                    ),
                );
            }
            Self { _dir: dir, db }
        }

        fn sql(self, sql: &str) -> Self {
            self::sql(&self.db, sql);
            self
        }

        fn check(&self, expected: Expect) {
            let report = status(&self.db, now(), &default_limits()).unwrap();
            let path = self.db.path().display().to_string();
            expected.assert_eq(&report.render(now()).replace(&path, "/ws/session.db"));
        }
    }

    fn sql(db: &SessionDb, sql: &str) {
        let mut sql = sql.to_owned();
        for secs in [1, 2, 40, 95, 120, 300, 303, 662, 1000] {
            sql = sql.replace(&format!("{{{secs}}}"), &ago(secs));
        }
        db.dedicated_connection()
            .unwrap()
            .execute_batch(&sql)
            .unwrap();
    }

    const PROCESSING: &str = "INSERT INTO messages_in (id, seq, kind, timestamp, status, \
        status_changed, tries, content) VALUES \
        ('in-1', 2, 'chat', '{303}', 'processing', '{303}', 1, '{\"text\":\"hi\"}'), \
        ('in-2', 4, 'chat', '{300}', 'processing', '{300}', 2, '{\"text\":\"there\"}');";

    #[test]
    fn idle_and_fresh() {
        Scene::new(Some(("idle", 662, 2))).check(expect![[r#"
            session DB  /ws/session.db
            runner      idle for 11m 2s, pid 7, provider codex, heartbeat 2s ago
            queue       0 pending (0 due), 0 processing, 0 paused, 0 failed
            next due    nothing pending
            tasks       none
            usage       today no turn; session no turn
            health      ok
        "#]]);
    }

    #[test]
    fn no_runner_yet() {
        Scene::new(None).check(expect![[r#"
            session DB  /ws/session.db
            runner      no runner has started
            queue       0 pending (0 due), 0 processing, 0 paused, 0 failed
            next due    nothing pending
            tasks       none
            usage       today no turn; session no turn
            health      UNHEALTHY: no runner has started on /ws/session.db: start agent-runner with this DB
        "#]]);
    }

    #[test]
    fn busy_with_a_last_event() {
        Scene::new(Some(("busy", 662, 1)))
            .sql(PROCESSING)
            .sql(
                "UPDATE runner_state SET last_event = \
                 '{\"at\":\"{40}\",\"what\":\"Reconnecting... waiting for network\"}', \
                 waiting_on = '{\"endpoint\":\"http://127.0.0.1:9/v1\",\"since\":\"{120}\",\
                 \"notices\":3,\"lastNotice\":\"Reconnecting... waiting for network\"}'",
            )
            .check(expect![[r#"
                session DB  /ws/session.db
                runner      busy for 11m 2s, pid 7, provider codex, heartbeat 1s ago
                last event  40s ago: Reconnecting... waiting for network
                waiting on  the model at http://127.0.0.1:9/v1 for 120 s (3 retry notices; last: Reconnecting... waiting for network)
                queue       0 pending (0 due), 2 processing, 0 paused, 0 failed
                processing  in-1 (seq 2, chat) for 5m 3s, try 1
                            in-2 (seq 4, chat) for 5m 0s, try 2
                next due    nothing pending
                tasks       none
                usage       today no turn; session no turn
                health      ok
            "#]]);
    }

    #[test]
    fn busy_and_silent_past_the_limit() {
        Scene::new(Some(("busy", 1000, 1)))
            .sql(PROCESSING)
            .check(expect![[r#"
                session DB  /ws/session.db
                runner      busy for 16m 40s, pid 7, provider codex, heartbeat 1s ago
                last event  none yet in this turn (16m 40s)
                queue       0 pending (0 due), 2 processing, 0 paused, 0 failed
                processing  in-1 (seq 2, chat) for 5m 3s, try 1
                            in-2 (seq 4, chat) for 5m 0s, try 2
                next due    nothing pending
                tasks       none
                usage       today no turn; session no turn
                health      UNHEALTHY: the turn has had no provider event for 1000 s (limit 900 s): the CLI or the runner is stuck; check the model gateway, then restart the runner (its rows return to the queue)
            "#]]);
    }

    #[test]
    fn waiting_for_the_user() {
        Scene::new(Some(("waiting_user", 300, 2)))
            .sql(PROCESSING)
            .sql(
                "UPDATE runner_state SET current_tool = 'ask_user_question', last_event = \
                 '{\"at\":\"{300}\",\"what\":\"tool ask_user_question started\"}'",
            )
            .check(expect![[r#"
                session DB  /ws/session.db
                runner      waiting_user for 5m 0s, pid 7, provider codex, in tool ask_user_question, heartbeat 2s ago
                last event  5m 0s ago: tool ask_user_question started
                queue       0 pending (0 due), 2 processing, 0 paused, 0 failed
                processing  in-1 (seq 2, chat) for 5m 3s, try 1
                            in-2 (seq 4, chat) for 5m 0s, try 2
                next due    nothing pending
                tasks       none
                usage       today no turn; session no turn
                health      ok
            "#]]);
    }

    #[test]
    fn waiting_for_an_approval() {
        Scene::new(Some(("waiting_user", 40, 2)))
            .sql(PROCESSING)
            .sql(
                "UPDATE runner_state SET waiting_on = '{\"endpoint\":\"the user''s approval of \
                 Bash\",\"since\":\"{40}\",\"notices\":0,\"approval\":\"Bash\",\
                 \"questionId\":\"q-42\"}'",
            )
            .check(expect![[r#"
                session DB  /ws/session.db
                runner      waiting_user for 40s, pid 7, provider codex, heartbeat 2s ago
                waiting on  the user's approval of Bash for 40 s: question q-42 (nanoclaw answer --question q-42 --option Approve|Deny)
                queue       0 pending (0 due), 2 processing, 0 paused, 0 failed
                processing  in-1 (seq 2, chat) for 5m 3s, try 1
                            in-2 (seq 4, chat) for 5m 0s, try 2
                next due    nothing pending
                tasks       none
                usage       today no turn; session no turn
                health      ok
            "#]]);
    }

    #[test]
    fn stopped_with_rows_processing() {
        Scene::new(Some(("stopped", 120, 120)))
            .sql(PROCESSING)
            .check(expect![[r#"
                session DB  /ws/session.db
                runner      stopped for 2m 0s, pid 7, provider codex, heartbeat 2m 0s ago
                queue       0 pending (0 due), 2 processing, 0 paused, 0 failed
                processing  in-1 (seq 2, chat) for 5m 3s, try 1
                            in-2 (seq 4, chat) for 5m 0s, try 2
                next due    nothing pending
                tasks       none
                usage       today no turn; session no turn
                health      UNHEALTHY: the runner stopped 120 s ago: start it again (it returns the 2 row(s) left processing to the queue; or run `nanoclaw sweep`)
                hint        2 row(s) processing with no runner: start it (it returns them to the queue), or `nanoclaw sweep --stale-after 0` retries them now
            "#]]);
    }

    #[test]
    fn stale_heartbeat() {
        Scene::new(Some(("busy", 303, 95)))
            .sql(PROCESSING)
            .check(expect![[r#"
                session DB  /ws/session.db
                runner      busy for 5m 3s, pid 7, provider codex, heartbeat 1m 35s ago [STALE]
                last event  none yet in this turn (5m 3s)
                queue       0 pending (0 due), 2 processing, 0 paused, 0 failed
                processing  in-1 (seq 2, chat) for 5m 3s, try 1
                            in-2 (seq 4, chat) for 5m 0s, try 2
                next due    nothing pending
                tasks       none
                usage       today no turn; session no turn
                health      UNHEALTHY: the runner's heartbeat is 95 s old (limit 30 s): the runner (pid 7) is hung or was killed; restart it (the container)
                hint        restart the runner; meanwhile `nanoclaw sweep --stale-after 0` retries its 2 processing row(s) (a live runner's batch is never swept)
            "#]]);
    }

    fn turn(cost_usd: Option<f64>) -> schema::NewTurnUsage {
        schema::NewTurnUsage {
            provider: "codex".into(),
            model: Some("gpt-5".into()),
            input_tokens: Some(1200),
            output_tokens: Some(300),
            cache_read_tokens: None,
            cache_write_tokens: None,
            reasoning_tokens: None,
            cost_usd,
            requests: Some(2),
            duration_ms: Some(3000),
            outcome: schema::UsageOutcome::Result,
            message_ids: vec!["in-0".into()],
            series_id: None,
        }
    }

    #[test]
    fn busy_in_a_tool_with_a_chosen_model_and_usage() {
        let scene = Scene::new(Some(("busy", 662, 1))).sql(PROCESSING).sql(
            "UPDATE runner_state SET current_tool = 'Bash'; \
                 INSERT INTO messages_out (id, seq, timestamp, kind, content) VALUES \
                 ('p-old', 5, '{1000}', 'system', '{\"action\":\"progress\",\"payload\":\
                 {\"tool\":\"Read\",\"summary\":\"old turn\",\"elapsedMs\":1}}'), \
                 ('p-1', 7, '{40}', 'system', '{\"action\":\"progress\",\"payload\":\
                 {\"tool\":\"Bash\",\"summary\":\"cargo test --workspace\",\
                 \"elapsedMs\":12400}}');",
        );
        scene
            .db
            .set_state(schema::control::MODEL_KEY, "gpt-5-mini")
            .unwrap();
        let db = &scene.db;
        db.record_usage(&turn(Some(0.0125)), now() - chrono::Duration::seconds(1000))
            .unwrap();
        db.record_usage(&turn(None), now() - chrono::Duration::seconds(300))
            .unwrap();
        db.record_usage(&turn(Some(0.5)), now() - chrono::Duration::days(1))
            .unwrap();
        scene.check(expect![[r#"
            session DB  /ws/session.db
            runner      busy for 11m 2s, pid 7, provider codex, in tool Bash, heartbeat 1s ago
            last event  none yet in this turn (11m 2s)
            model       gpt-5-mini (chosen with /model)
            progress    Bash: cargo test --workspace, 12.4s into the turn, 40s ago
            queue       0 pending (0 due), 2 processing, 0 paused, 0 failed
            processing  in-1 (seq 2, chat) for 5m 3s, try 1
                        in-2 (seq 4, chat) for 5m 0s, try 2
            next due    nothing pending
            tasks       none
            usage       today 2 turns, 3000 tokens, $0.0125+?; session 3 turns, 4500 tokens, $0.5125+?
            health      ok
        "#]]);
    }

    #[test]
    fn a_budget_holds_the_queue_until_a_turn_is_served() {
        let scene = Scene::new(Some(("idle", 40, 2))).sql(
            "INSERT INTO messages_in (id, seq, kind, timestamp, content) VALUES \
             ('in-9', 8, 'chat', '{40}', '{\"text\":\"third\"}'); \
             INSERT INTO messages_out (id, seq, timestamp, kind, content) VALUES \
             ('b-1', 9, '{40}', 'system', '{\"action\":\"budget_exceeded\",\"payload\":\
             {\"limit\":\"maxCostUsdPerSession\",\"spent\":0.0375,\"max\":0.03,\
             \"window\":\"session\",\"resetsAt\":null}}');",
        );
        scene
            .db
            .record_usage(&turn(Some(0.0375)), now() - chrono::Duration::seconds(120))
            .unwrap();
        scene.check(expect![[r#"
            session DB  /ws/session.db
            runner      idle for 40s, pid 7, provider codex, heartbeat 2s ago
            queue       1 pending (1 due), 0 processing, 0 paused, 0 failed
            next due    2026-11-23T10:00:00.000Z (now)
            tasks       none
            usage       today 1 turn, 1500 tokens, $0.0375; session 1 turn, 1500 tokens, $0.0375
            budget      exhausted: maxCostUsdPerSession: spent $0.0375 of $0.0300 in this session; service resumes when the limit is raised
            health      ok
        "#]]);
        // A raised limit served the row: the old budget row no longer holds anything.
        scene
            .db
            .record_usage(&turn(Some(0.01)), now() - chrono::Duration::seconds(2))
            .unwrap();
        let report = status(&scene.db, now(), &default_limits()).unwrap();
        assert_eq!(report.budget, None);
        assert_eq!(report.usage.session.turns, 2);
    }

    #[test]
    fn after_a_query_error() {
        Scene::new(Some(("idle", 40, 2)))
            .sql(PROCESSING)
            .sql(
                "INSERT INTO messages_out (id, seq, timestamp, kind, content) VALUES ('err-1', \
                 5, '{40}', 'system', '{\"action\":\"query_error\",\"payload\":{\"message\":\
                 \"model API error (HTTP 502): upstream connect error\",\"classification\":\
                 \"gateway_error\",\"retryable\":true,\"messageIds\":[\"in-1\",\"in-2\"],\
                 \"provider\":\"codex\",\"endpoint\":\"http://127.0.0.1:9/v1\"}}'); \
                 UPDATE messages_in SET status = 'failed' WHERE id = 'in-2'; \
                 INSERT INTO messages_in (id, seq, kind, timestamp, status, status_changed, \
                 content) VALUES ('in-3', 6, 'chat', '{40}', 'processing', '{40}', '{}');",
            )
            .check(expect![[r#"
                session DB  /ws/session.db
                runner      idle for 40s, pid 7, provider codex, heartbeat 2s ago
                queue       0 pending (0 due), 2 processing, 0 paused, 1 failed
                processing  in-1 (seq 2, chat) for 5m 3s, try 1
                            in-3 (seq 6, chat) for 40s, try 0
                last error  2026-11-23T09:59:20.000Z (40s ago), seq 5: gateway_error for in-1, in-2: model API error (HTTP 502): upstream connect error
                next due    nothing pending
                tasks       none
                usage       today no turn; session no turn
                health      ok
                hint        the last query failed and left in-1 processing: `nanoclaw sweep` retries them in 4m 57s (once unchanged for --stale-after, 600 s by default), `nanoclaw sweep --stale-after 0` at once
                hint        1 row(s) failed for good (out of tries, or unusable): `nanoclaw watch --no-follow` shows the system rows that say why; send them again to retry
            "#]]);
    }
}
