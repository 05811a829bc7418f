//! Task series: the queries behind mcp-tools' `list_tasks`, `pause_task`, `resume_task`,
//! `cancel_task` and `update_task` (docs/contract/db.md#tasks, docs/contract/tools.md#tasks).
//!
//! # Semantics
//!
//! - A task is a **series** of `messages_in` rows of kind `task`. Its id is the series id:
//!   `series_id` of every occurrence, which is the id of the first row (`schedule_task` inserts
//!   that row with `series_id` = its own id). A `task` row written without `series_id` (by a
//!   host, say) is a series of one whose id is the row id. Any occurrence's row id, or its seq,
//!   also names its series.
//! - A series is **active** while it has a `pending` or `paused` row (the next run), or a
//!   `processing` row that still carries a `recurrence` (it is running now and will insert its
//!   successor when the runner completes it, see `schedule_next_occurrence` in `completion.rs`).
//!   [`SessionDb::task_series`] lists the active series; a series that is not active has
//!   finished (or was cancelled) and the other calls refuse it with [`Error::NotFound`].
//! - **pause**: every `pending` row of the series becomes `paused`, and the session-state key
//!   `series_paused:<id>` is set, so an occurrence running right now inserts its successor as
//!   `paused` too.
//! - **resume**: the key is deleted and `paused` rows become `pending`. A recurring row whose
//!   `process_after` has passed moves to the next cron time after now (missed runs are not
//!   replayed); a one-shot row that is past due simply runs now.
//! - **cancel**: the `pending`/`paused` rows of the series are deleted, `recurrence` is cleared
//!   on an occurrence that is running now (so it inserts no successor), and the pause key goes.
//! - **update**: prompt, script, `process_after` and recurrence are changed on the
//!   `pending`/`paused` row. A new recurrence is validated as cron and, unless a new
//!   `process_after` is given too, the next run moves to the next cron time after now. Clearing
//!   the recurrence makes the series one-shot. On a series that is only running right now, the
//!   change applies to the running row, whose successor inherits it (`process_after` cannot be
//!   changed then).
//!
//! Every change runs in one `BEGIN IMMEDIATE` transaction.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use rusqlite::{params, OptionalExtension, Transaction};
use serde_json::{json, Map, Value};

use crate::cron::Schedule;
use crate::messages::usable_rows;
use crate::rows::{InStatus, MessageIn};
use crate::sql::IN_COLUMNS;
use crate::state::set_state_tx;
use crate::time::{format_ts, parse_ts};
use crate::{Error, SessionDb, TaskContent};

/// Where an active series stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// Its next run is a `pending` row.
    Scheduled,
    /// Its next run is a `paused` row.
    Paused,
    /// An occurrence is running now (`processing`, recurring); the next one is inserted when it
    /// completes.
    Running,
}

impl TaskState {
    /// A short lowercase word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Scheduled => "scheduled",
            Self::Paused => "paused",
            Self::Running => "running",
        }
    }
}

/// An active task series and the row that stands for it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSeries {
    /// The task id (series id).
    pub id: String,
    /// Where it stands.
    pub state: TaskState,
    /// The `series_paused:<id>` key is set (an occurrence running now inserts its successor as
    /// paused).
    pub pause_requested: bool,
    /// The next run's row (`pending`/`paused`), or the running one for [`TaskState::Running`].
    pub row: MessageIn,
}

/// Session-state key prefix of paused task series.
pub(crate) const SERIES_PAUSED_PREFIX: &str = "series_paused:";

impl TaskSeries {
    /// The task's prompt and script (an unparsable content gives an empty prompt).
    pub fn content(&self) -> TaskContent {
        serde_json::from_str(&self.row.content).unwrap_or_default()
    }

    /// The cron expression, if the task recurs.
    pub fn recurrence(&self) -> Option<&str> {
        self.row.recurrence.as_deref()
    }

    /// When it runs next: `process_after` of the next row (`None` = as soon as possible when it
    /// has no time; a time that cannot be read also gives `None`, but such a row never runs: the
    /// runner's poll takes it out of the queue), or for a running series the next cron time after
    /// `now`.
    pub fn next_run(&self, now: DateTime<Utc>, timezone: Tz) -> Option<DateTime<Utc>> {
        match self.state {
            TaskState::Running => self
                .recurrence()
                .and_then(|expr| Schedule::parse(expr).ok())
                .and_then(|schedule| schedule.next_after(now, timezone).ok()),
            TaskState::Scheduled | TaskState::Paused => self
                .row
                .process_after
                .as_deref()
                .and_then(|at| parse_ts(at).ok()),
        }
    }
}

/// Changes for [`SessionDb::update_task`]; `None` leaves a field alone.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskUpdate {
    /// New prompt.
    pub prompt: Option<String>,
    /// New script; `Some(None)` removes it.
    pub script: Option<Option<String>>,
    /// New time of the next run.
    pub process_after: Option<DateTime<Utc>>,
    /// New cron expression; `Some(None)` makes the task one-shot.
    pub recurrence: Option<Option<String>>,
}

impl TaskUpdate {
    /// True when nothing would change.
    pub fn is_empty(&self) -> bool {
        self.prompt.is_none()
            && self.script.is_none()
            && self.process_after.is_none()
            && self.recurrence.is_none()
    }
}

/// A pause or resume: the series after the change and its state before.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskChange {
    /// State before the change.
    pub previous: TaskState,
    /// Whether the pause key was set before the change.
    pub was_pause_requested: bool,
    /// The series after the change.
    pub series: TaskSeries,
}

/// What [`SessionDb::cancel_task`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelledTask {
    /// The task id (series id).
    pub id: String,
    /// `pending`/`paused` rows deleted.
    pub removed: usize,
    /// An occurrence was running; it finishes but inserts no successor.
    pub stopped_running: bool,
}

/// `messages_in` rows of series `?1` (the alias `m` is the table).
const SERIES_MATCH: &str =
    "m.kind = 'task' AND (m.series_id = ?1 OR (m.series_id IS NULL AND m.id = ?1))";

impl SessionDb {
    /// Every active task series (see the module docs), soonest next run first.
    pub fn task_series(&self) -> Result<Vec<TaskSeries>, Error> {
        let now = Utc::now();
        let timezone = self.timezone();
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        let mut series = {
            // Statuses by `=`, not `IN (…)`: only those let SQLite use the status index (see
            // `crate::sql::INDEXES`).
            let sql = format!(
                "SELECT {IN_COLUMNS} FROM messages_in m WHERE m.kind = 'task'
                 AND (m.status = 'pending' OR m.status = 'paused'
                      OR (m.status = 'processing' AND m.recurrence IS NOT NULL))
                 ORDER BY m.seq"
            );
            let rows = usable_rows(tx.prepare_cached(&sql)?.query_map([], MessageIn::read)?)?;
            let mut ids: Vec<String> = Vec::new();
            for row in &rows {
                let id = series_key(row);
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                let members: Vec<MessageIn> = rows
                    .iter()
                    .filter(|row| series_key(row) == id)
                    .cloned()
                    .collect();
                let paused = pause_requested(&tx, &id)?;
                if let Some(view) = series_view(&id, members, paused) {
                    out.push(view);
                }
            }
            out
        };
        tx.finish()?;
        series.sort_by_key(|s| s.next_run(now, timezone).map(|at| at.timestamp_millis()));
        Ok(series)
    }

    /// One active task series by id (or by the id or seq of one of its rows).
    pub fn task(&self, task_id: &str) -> Result<TaskSeries, Error> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        let series = active_series(&tx, task_id);
        tx.finish()?;
        series
    }

    /// Pauses a task series (see the module docs).
    pub fn pause_task(&self, task_id: &str) -> Result<TaskChange, Error> {
        self.write(|tx| {
            let before = active_series(tx, task_id)?;
            tx.execute(
                &format!(
                    "UPDATE messages_in AS m SET status = 'paused', status_changed = ?2
                     WHERE {SERIES_MATCH} AND m.status = 'pending'"
                ),
                params![before.id, format_ts(Utc::now())],
            )?;
            set_state_tx(
                tx,
                &format!("{SERIES_PAUSED_PREFIX}{}", before.id),
                &json!({ "pausedAt": format_ts(Utc::now()) }).to_string(),
            )?;
            let series = active_series(tx, &before.id)?;
            Ok(TaskChange {
                previous: before.state,
                was_pause_requested: before.pause_requested,
                series,
            })
        })
    }

    /// Resumes a paused task series at `now` (see the module docs).
    pub fn resume_task(&self, task_id: &str, now: DateTime<Utc>) -> Result<TaskChange, Error> {
        let timezone = self.timezone();
        self.write(|tx| {
            let before = active_series(tx, task_id)?;
            tx.execute(
                "DELETE FROM session_state WHERE key = ?1",
                [format!("{SERIES_PAUSED_PREFIX}{}", before.id)],
            )?;
            let sql = format!(
                "UPDATE messages_in AS m SET status = 'pending', status_changed = ?2
                 WHERE {SERIES_MATCH} AND m.status = 'paused' RETURNING {IN_COLUMNS}"
            );
            let resumed = usable_rows(
                tx.prepare(&sql)?
                    .query_map(params![before.id, format_ts(now)], MessageIn::read)?,
            )?;
            for row in resumed {
                let Some(expr) = row.recurrence.as_deref() else {
                    continue;
                };
                let due = row
                    .process_after
                    .as_deref()
                    .map(|at| parse_ts(at).map_or(true, |at| at <= now))
                    .unwrap_or(true);
                if !due {
                    continue;
                }
                match Schedule::parse(expr).and_then(|s| s.next_after(now, timezone)) {
                    Ok(next) => {
                        tx.execute(
                            "UPDATE messages_in SET process_after = ?2 WHERE id = ?1",
                            params![row.id, format_ts(next)],
                        )?;
                    }
                    // Left due: it runs now, and completing it reports the bad cron.
                    Err(err) => {
                        tracing::warn!(task = %before.id, %err, "resumed task has an invalid cron")
                    }
                }
            }
            let series = active_series(tx, &before.id)?;
            Ok(TaskChange {
                previous: before.state,
                was_pause_requested: before.pause_requested,
                series,
            })
        })
    }

    /// Cancels a task series (see the module docs).
    pub fn cancel_task(&self, task_id: &str) -> Result<CancelledTask, Error> {
        self.write(|tx| {
            let series = active_series(tx, task_id)?;
            let removed = tx.execute(
                &format!(
                    "DELETE FROM messages_in AS m
                     WHERE {SERIES_MATCH} AND m.status IN ('pending', 'paused')"
                ),
                [&series.id],
            )?;
            let stopped_running = tx.execute(
                &format!(
                    "UPDATE messages_in AS m SET recurrence = NULL
                     WHERE {SERIES_MATCH} AND m.status = 'processing' AND m.recurrence IS NOT NULL"
                ),
                [&series.id],
            )? > 0;
            tx.execute(
                "DELETE FROM session_state WHERE key = ?1",
                [format!("{SERIES_PAUSED_PREFIX}{}", series.id)],
            )?;
            Ok(CancelledTask {
                id: series.id,
                removed,
                stopped_running,
            })
        })
    }

    /// Changes a task series at `now` (see the module docs). A bad cron is
    /// [`Error::BadCron`]; nothing is written then.
    pub fn update_task(
        &self,
        task_id: &str,
        update: &TaskUpdate,
        now: DateTime<Utc>,
    ) -> Result<TaskSeries, Error> {
        let timezone = self.timezone();
        let schedule = match &update.recurrence {
            Some(Some(expr)) => Some(Schedule::parse(expr)?),
            _ => None,
        };
        self.write(|tx| {
            let series = active_series(tx, task_id)?;
            let running = series.state == TaskState::Running;
            if running && update.process_after.is_some() {
                return Err(Error::NotFound(format!(
                    "task {:?} is running right now and has no next run yet to move; \
                     change processAfter after this run finishes",
                    series.id
                )));
            }
            let targets: Vec<MessageIn> = if running {
                vec![series.row.clone()]
            } else {
                let sql = format!(
                    "SELECT {IN_COLUMNS} FROM messages_in m
                     WHERE {SERIES_MATCH} AND m.status IN ('pending', 'paused') ORDER BY m.seq"
                );
                usable_rows(tx.prepare(&sql)?.query_map([&series.id], MessageIn::read)?)?
            };
            for row in targets {
                let mut content = match serde_json::from_str::<Value>(&row.content) {
                    Ok(Value::Object(map)) => map,
                    _ => Map::new(),
                };
                if let Some(prompt) = &update.prompt {
                    content.insert("prompt".into(), Value::String(prompt.clone()));
                }
                match &update.script {
                    Some(Some(script)) => {
                        content.insert("script".into(), Value::String(script.clone()));
                    }
                    Some(None) => {
                        content.remove("script");
                    }
                    None => {}
                }
                let recurrence = match &update.recurrence {
                    Some(Some(_)) => schedule.as_ref().map(|s| s.expr().to_owned()),
                    Some(None) => None,
                    None => row.recurrence.clone(),
                };
                let process_after = match (&update.process_after, &schedule) {
                    (Some(at), _) => Some(format_ts(*at)),
                    (None, Some(schedule)) if !running => {
                        Some(format_ts(schedule.next_after(now, timezone)?))
                    }
                    _ => row.process_after.clone(),
                };
                tx.execute(
                    "UPDATE messages_in SET content = ?2, recurrence = ?3, process_after = ?4
                     WHERE id = ?1",
                    params![
                        row.id,
                        Value::Object(content).to_string(),
                        recurrence,
                        process_after
                    ],
                )?;
            }
            active_series(tx, &series.id)
        })
    }
}

/// The series a row belongs to.
fn series_key(row: &MessageIn) -> String {
    row.series_id.clone().unwrap_or_else(|| row.id.clone())
}

fn pause_requested(tx: &Transaction<'_>, series_id: &str) -> Result<bool, Error> {
    Ok(tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM session_state WHERE key = ?1)",
        [format!("{SERIES_PAUSED_PREFIX}{series_id}")],
        |r| r.get(0),
    )?)
}

/// The series id `task_id` names: a series id, or the id or seq of one of its rows.
fn resolve_series(tx: &Transaction<'_>, task_id: &str) -> Result<String, Error> {
    let task_id = task_id.trim();
    let by_id: Option<String> = tx
        .query_row(
            "SELECT COALESCE(series_id, id) FROM messages_in
             WHERE kind = 'task' AND (series_id = ?1 OR id = ?1) ORDER BY seq LIMIT 1",
            [task_id],
            |r| r.get(0),
        )
        .optional()?;
    if let Some(id) = by_id {
        return Ok(id);
    }
    if let Ok(seq) = task_id.trim_start_matches('#').parse::<i64>() {
        let by_seq: Option<String> = tx
            .query_row(
                "SELECT COALESCE(series_id, id) FROM messages_in WHERE kind = 'task' AND seq = ?1",
                [seq],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(id) = by_seq {
            return Ok(id);
        }
    }
    Err(Error::NotFound(format!(
        "no task with id {task_id:?} (list_tasks shows the ids of scheduled tasks)"
    )))
}

/// The active series `task_id` names, or [`Error::NotFound`] saying why not.
fn active_series(tx: &Transaction<'_>, task_id: &str) -> Result<TaskSeries, Error> {
    let id = resolve_series(tx, task_id)?;
    let sql = format!(
        "SELECT {IN_COLUMNS} FROM messages_in m
         WHERE {SERIES_MATCH} AND m.status IN ('pending', 'paused', 'processing') ORDER BY m.seq"
    );
    let rows = usable_rows(tx.prepare_cached(&sql)?.query_map([&id], MessageIn::read)?)?;
    let running_once = rows.iter().any(|row| row.status == "processing");
    let paused = pause_requested(tx, &id)?;
    series_view(&id, rows, paused).ok_or_else(|| {
        Error::NotFound(if running_once {
            format!("task {id:?} is running now for the last time; it has no later runs")
        } else {
            format!("task {id:?} has no upcoming runs (it already ran or was cancelled)")
        })
    })
}

/// The view of a series from its non-final rows: the first pending/paused row, else a running
/// recurring one.
fn series_view(id: &str, rows: Vec<MessageIn>, pause_requested: bool) -> Option<TaskSeries> {
    let upcoming = rows.iter().find(|row| {
        matches!(
            InStatus::parse(&row.status),
            Some(InStatus::Pending | InStatus::Paused)
        )
    });
    let (state, row) = match upcoming {
        Some(row) if row.status == InStatus::Paused.as_str() => (TaskState::Paused, row.clone()),
        Some(row) => (TaskState::Scheduled, row.clone()),
        None => {
            let running = rows.into_iter().find(|row| {
                row.status == InStatus::Processing.as_str() && row.recurrence.is_some()
            })?;
            (TaskState::Running, running)
        }
    };
    Some(TaskSeries {
        id: id.to_owned(),
        state,
        pause_requested,
        row,
    })
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::cron::parse_tz;
    use crate::rows::NewMessageIn;
    use crate::OpenOptions;
    use chrono::Timelike;

    fn open(tz: &str) -> (tempfile::TempDir, SessionDb) {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open_with(
            dir.path().join("session.db"),
            OpenOptions {
                timezone: parse_tz(tz).unwrap(),
                ..OpenOptions::default()
            },
        )
        .unwrap();
        (dir, db)
    }

    fn schedule(db: &SessionDb, at: &str, recurrence: Option<&str>) -> String {
        let mut row = NewMessageIn::new("task", r#"{"prompt":"report"}"#);
        row.series_is_self = true;
        row.process_after = Some(at.to_owned());
        row.recurrence = recurrence.map(str::to_owned);
        db.insert_in(&row).unwrap().id
    }

    fn ts(text: &str) -> DateTime<Utc> {
        parse_ts(text).unwrap()
    }

    #[test]
    fn lists_active_series_soonest_first() {
        let (_dir, db) = open("UTC");
        let later = schedule(&db, "2030-01-02T00:00:00Z", None);
        let sooner = schedule(&db, "2030-01-01T00:00:00Z", Some("0 9 * * *"));
        let done = schedule(&db, "2020-01-01T00:00:00Z", None);
        db.complete(&[done], &[]).unwrap();
        let ids: Vec<String> = db
            .task_series()
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(ids, vec![sooner, later]);
    }

    #[test]
    fn unknown_and_finished_ids_are_clear_errors() {
        let (_dir, db) = open("UTC");
        let err = db.pause_task("nope").unwrap_err().to_string();
        assert!(err.contains("no task with id \"nope\""), "{err}");
        let done = schedule(&db, "2020-01-01T00:00:00Z", None);
        db.complete(std::slice::from_ref(&done), &[]).unwrap();
        let err = db.cancel_task(&done).unwrap_err().to_string();
        assert!(err.contains("no upcoming runs"), "{err}");
    }

    #[test]
    fn resolves_by_seq() {
        let (_dir, db) = open("UTC");
        let id = schedule(&db, "2030-01-01T00:00:00Z", None);
        let seq = db.message_in(&id).unwrap().unwrap().seq.unwrap();
        assert_eq!(db.task(&seq.to_string()).unwrap().id, id);
    }

    #[test]
    fn pause_then_resume_moves_a_missed_recurring_run_to_the_future() {
        let (_dir, db) = open("America/New_York");
        let id = schedule(&db, "2026-11-20T14:00:00Z", Some("0 9 * * *"));
        let paused = db.pause_task(&id).unwrap();
        assert_eq!(paused.previous, TaskState::Scheduled);
        assert_eq!(paused.series.state, TaskState::Paused);
        assert!(db.state(&format!("series_paused:{id}")).unwrap().is_some());
        assert!(db
            .eligible(ts("2026-11-21T00:00:00Z"), false, 10)
            .unwrap()
            .rows
            .is_empty());

        let now = ts("2026-11-23T12:00:00Z"); // 7:00 in New York
        let resumed = db.resume_task(&id, now).unwrap();
        assert_eq!(resumed.series.state, TaskState::Scheduled);
        assert!(db.state(&format!("series_paused:{id}")).unwrap().is_none());
        let next = resumed.series.next_run(now, db.timezone()).unwrap();
        assert_eq!(next, ts("2026-11-23T14:00:00Z"));
    }

    #[test]
    fn resume_keeps_a_past_due_one_shot_due() {
        let (_dir, db) = open("UTC");
        let id = schedule(&db, "2026-11-20T14:00:00Z", None);
        db.pause_task(&id).unwrap();
        let now = ts("2026-11-23T12:00:00Z");
        db.resume_task(&id, now).unwrap();
        let eligible = db.eligible(now, false, 10).unwrap();
        assert_eq!(eligible.rows.len(), 1);
    }

    #[test]
    fn pausing_a_running_series_makes_its_successor_paused() {
        let (_dir, db) = open("UTC");
        let id = schedule(&db, "2020-01-01T00:00:00Z", Some("*/5 * * * *"));
        db.claim(std::slice::from_ref(&id)).unwrap();
        let paused = db.pause_task(&id).unwrap();
        assert_eq!(paused.series.state, TaskState::Running);
        assert!(paused.series.pause_requested);
        db.complete(std::slice::from_ref(&id), &[]).unwrap();
        let series = db.task(&id).unwrap();
        assert_eq!(series.state, TaskState::Paused);
        assert_ne!(series.row.id, id);
    }

    #[test]
    fn cancel_deletes_upcoming_rows_and_stops_a_running_occurrence() {
        let (_dir, db) = open("UTC");
        let id = schedule(&db, "2030-01-01T00:00:00Z", Some("0 9 * * *"));
        let cancelled = db.cancel_task(&id).unwrap();
        assert_eq!((cancelled.removed, cancelled.stopped_running), (1, false));
        assert!(db.message_in(&id).unwrap().is_none());
        assert!(db.task_series().unwrap().is_empty());

        let running = schedule(&db, "2020-01-01T00:00:00Z", Some("*/5 * * * *"));
        db.claim(std::slice::from_ref(&running)).unwrap();
        let cancelled = db.cancel_task(&running).unwrap();
        assert_eq!((cancelled.removed, cancelled.stopped_running), (0, true));
        db.complete(std::slice::from_ref(&running), &[]).unwrap();
        assert!(db.task_series().unwrap().is_empty());
        assert_eq!(
            db.messages_in_with_status(InStatus::Pending).unwrap().len(),
            0
        );
    }

    #[test]
    fn update_changes_content_and_recomputes_the_next_run() {
        let (_dir, db) = open("America/New_York");
        let id = schedule(&db, "2030-01-01T00:00:00Z", None);
        let now = ts("2026-11-23T12:00:00Z");
        let err = db
            .update_task(
                &id,
                &TaskUpdate {
                    recurrence: Some(Some("61 * * * *".into())),
                    ..TaskUpdate::default()
                },
                now,
            )
            .unwrap_err();
        assert!(matches!(err, Error::BadCron { .. }), "{err}");
        let series = db
            .update_task(
                &id,
                &TaskUpdate {
                    prompt: Some("new prompt".into()),
                    script: Some(Some("echo '{\"wakeAgent\":true}'".into())),
                    recurrence: Some(Some("30 8 * * 1-5".into())),
                    ..TaskUpdate::default()
                },
                now,
            )
            .unwrap();
        assert_eq!(series.content().prompt, "new prompt");
        assert!(series.content().script.is_some());
        assert_eq!(series.recurrence(), Some("30 8 * * 1-5"));
        let next = series.next_run(now, db.timezone()).unwrap();
        let local = next.with_timezone(&db.timezone());
        assert_eq!((local.hour(), local.minute()), (8, 30));
        assert_eq!(next, ts("2026-11-23T13:30:00Z"));

        let series = db
            .update_task(
                &id,
                &TaskUpdate {
                    script: Some(None),
                    recurrence: Some(None),
                    process_after: Some(ts("2031-01-01T00:00:00Z")),
                    ..TaskUpdate::default()
                },
                now,
            )
            .unwrap();
        assert_eq!(series.recurrence(), None);
        assert_eq!(series.content().script, None);
        assert_eq!(
            series.next_run(now, db.timezone()),
            Some(ts("2031-01-01T00:00:00Z"))
        );
    }

    #[test]
    fn update_of_a_running_series_reaches_its_successor() {
        let (_dir, db) = open("UTC");
        let id = schedule(&db, "2020-01-01T00:00:00Z", Some("*/5 * * * *"));
        db.claim(std::slice::from_ref(&id)).unwrap();
        let err = db
            .update_task(
                &id,
                &TaskUpdate {
                    process_after: Some(ts("2031-01-01T00:00:00Z")),
                    ..TaskUpdate::default()
                },
                Utc::now(),
            )
            .unwrap_err();
        assert!(err.to_string().contains("running right now"), "{err}");
        db.update_task(
            &id,
            &TaskUpdate {
                prompt: Some("changed".into()),
                ..TaskUpdate::default()
            },
            Utc::now(),
        )
        .unwrap();
        db.complete(std::slice::from_ref(&id), &[]).unwrap();
        let next = db.task(&id).unwrap();
        assert_eq!(next.state, TaskState::Scheduled);
        assert_eq!(next.content().prompt, "changed");
    }
}
