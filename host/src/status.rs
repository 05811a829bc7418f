//! `status`: the runner's state, the queue, the next due time and the task series.

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use schema::time::{format_ts, parse_ts};
use schema::{InStatus, InboundContent, MessageIn, QueueCounts, Routing, SessionDb, WaitingOn};
use serde::Serialize;

use crate::init::format_routing;
use crate::send::excerpt;
use crate::timefmt::{ago, until};

/// A heartbeat older than this (while the runner is not stopped) is flagged as stale.
pub const STALE_HEARTBEAT_SECS: i64 = 30;

/// The runner_state row with derived ages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerReport {
    /// `starting`, `idle`, `busy`, `waiting_user` or `stopped`.
    pub status: String,
    /// Runner pid.
    pub pid: Option<i64>,
    /// Provider name.
    pub provider: Option<String>,
    /// Tool the agent is in, if known.
    pub current_tool: Option<String>,
    /// What a turn without progress waits on (the model endpoint, since when, retry notices).
    pub waiting_on: Option<WaitingOn>,
    /// Seconds it has waited so far.
    pub waiting_secs: Option<i64>,
    /// Last heartbeat as stored.
    pub heartbeat_at: String,
    /// Seconds since the last heartbeat (`None` when the stored time is unreadable).
    pub heartbeat_age_secs: Option<i64>,
    /// True when the runner is not stopped but its heartbeat is older than
    /// [`STALE_HEARTBEAT_SECS`].
    pub heartbeat_stale: bool,
}

/// One pending or paused occurrence of a task series.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
#[derive(Debug, Clone, Serialize)]
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
}

/// Gathers the report at `now`.
pub fn status(db: &SessionDb, now: DateTime<Utc>) -> Result<StatusReport> {
    let runner = db
        .runner_state()
        .context("reading runner_state")?
        .map(|state| {
            let age = parse_ts(&state.heartbeat_at)
                .ok()
                .map(|at| (now - at).num_seconds());
            let waiting_on = state.waiting();
            let waiting_secs = waiting_on
                .as_ref()
                .and_then(|w| parse_ts(&w.since).ok())
                .map(|since| (now - since).num_seconds().max(0));
            RunnerReport {
                waiting_on,
                waiting_secs,
                heartbeat_stale: state.status != "stopped"
                    && age.is_none_or(|age| age > STALE_HEARTBEAT_SECS),
                status: state.status,
                pid: state.pid,
                provider: state.provider,
                current_tool: state.current_tool,
                heartbeat_at: state.heartbeat_at,
                heartbeat_age_secs: age,
            }
        });
    let counts = db.counts(now).context("counting messages_in")?;
    let next_due = db.next_due().context("reading the next due time")?;
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
    let destinations = db
        .destinations()
        .context("reading destinations")?
        .into_iter()
        .map(|d| d.name)
        .collect();
    Ok(StatusReport {
        db: db.path().display().to_string(),
        now: format_ts(now),
        runner,
        counts,
        next_due: next_due.map(|at| format_ts(at.max(now))),
        next_due_in_secs: next_due.map(|at| (at - now).num_seconds().max(0)),
        tasks,
        routing: db.session_routing().context("reading the routing")?,
        destinations,
    })
}

/// "the model at URL for 42 s (3 retry notices; last: …)".
fn waiting_text(waiting: &WaitingOn, secs: Option<i64>) -> String {
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

impl StatusReport {
    /// The report as readable text, relative times measured from `now`.
    pub fn render(&self, now: DateTime<Utc>) -> String {
        let mut out = String::new();
        let mut line = |text: String| {
            out.push_str(&text);
            out.push('\n');
        };
        line(format!("session DB  {}", self.db));
        match &self.runner {
            None => line("runner      no runner has started".to_owned()),
            Some(runner) => {
                let mut text = format!("runner      {}", runner.status);
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
                    Some(age) => {
                        text.push_str(&format!(", heartbeat {age}s ago ({})", runner.heartbeat_at))
                    }
                    None => text.push_str(&format!(
                        ", heartbeat unreadable ({:?})",
                        runner.heartbeat_at
                    )),
                }
                if runner.heartbeat_stale {
                    text.push_str(" [STALE]");
                }
                line(text);
                if let Some(waiting) = &runner.waiting_on {
                    line(format!(
                        "waiting on  {}",
                        waiting_text(waiting, runner.waiting_secs)
                    ));
                }
            }
        }
        let c = &self.counts;
        line(format!(
            "queue       {} pending ({} due), {} processing, {} paused, {} failed",
            c.pending, c.due, c.processing, c.paused, c.failed
        ));
        match self
            .next_due
            .as_deref()
            .and_then(|at| parse_ts(at).ok().map(|parsed| (at, parsed)))
        {
            None => line("next due    nothing pending".to_owned()),
            Some((at, parsed)) => line(format!("next due    {at} ({})", until(parsed, now))),
        }
        if let Some(routing) = &self.routing {
            line(format!("routing     {}", format_routing(routing)));
        }
        if !self.destinations.is_empty() {
            line(format!("destinations {}", self.destinations.join(", ")));
        }
        if self.tasks.is_empty() {
            line("tasks       none".to_owned());
        } else {
            line(format!("tasks       {}", self.tasks.len()));
            for task in &self.tasks {
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
                line(text);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(waiting_on: Option<WaitingOn>, now: DateTime<Utc>) -> StatusReport {
        let waiting_secs = waiting_on
            .as_ref()
            .and_then(|w| parse_ts(&w.since).ok())
            .map(|since| (now - since).num_seconds());
        StatusReport {
            db: "/ws/session.db".into(),
            now: format_ts(now),
            runner: Some(RunnerReport {
                status: "busy".into(),
                pid: Some(7),
                provider: Some("codex".into()),
                current_tool: None,
                waiting_on,
                waiting_secs,
                heartbeat_at: format_ts(now),
                heartbeat_age_secs: Some(0),
                heartbeat_stale: false,
            }),
            counts: QueueCounts::default(),
            next_due: None,
            next_due_in_secs: None,
            tasks: Vec::new(),
            routing: None,
            destinations: Vec::new(),
        }
    }

    #[test]
    fn the_status_screen_shows_what_a_turn_waits_on() {
        let now = parse_ts("2026-11-23T10:00:42.000Z").unwrap();
        let waiting = WaitingOn {
            endpoint: "http://127.0.0.1:9/v1".into(),
            since: "2026-11-23T10:00:00.000Z".into(),
            notices: 3,
            last_notice: Some("Reconnecting... connection refused".into()),
        };
        let text = report(Some(waiting.clone()), now).render(now);
        let lines: Vec<&str> = text.lines().take(3).collect();
        assert_eq!(
            lines,
            [
                "session DB  /ws/session.db",
                "runner      busy, pid 7, provider codex, heartbeat 0s ago (2026-11-23T10:00:42.000Z)",
                "waiting on  the model at http://127.0.0.1:9/v1 for 42 s (3 retry notices; last: \
                 Reconnecting... connection refused)",
            ]
        );
        let silent = WaitingOn {
            notices: 0,
            last_notice: None,
            ..waiting
        };
        let text = report(Some(silent), now).render(now);
        assert!(
            text.contains(
                "waiting on  the model at http://127.0.0.1:9/v1 for 42 s (no output yet)\n"
            ),
            "{text}"
        );
        let text = report(None, now).render(now);
        assert!(!text.contains("waiting on"), "{text}");
    }
}
