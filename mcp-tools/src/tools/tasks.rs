//! Scheduled tasks: schedule_task, list_tasks, update_task, cancel_task, pause_task,
//! resume_task. The series semantics live in `schema::tasks`; this module parses what the model
//! gives (local times, cron) and words the results.
//!
//! Cron is parsed with `croner` (through `schema::cron`), not the `cron` crate: `cron` demands a
//! seconds field, numbers weekdays from Sunday = 1 (so `0 9 * * 1-5` with "0 " prepended fires
//! Sunday to Thursday), skips the spring-forward hour and fires twice in the autumn fold.
//! `croner` takes standard 5-field POSIX cron (0 and 7 = Sunday) and gets both DST cases right.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use schema::cron::Schedule;
use schema::tasks::{TaskSeries, TaskState, TaskUpdate};
use schema::NewMessageIn;
use serde_json::json;

use super::routing::{self, Target};
use super::when::{format_local_zoned, parse_when};
use super::{check_field, check_text, Ctx};
use crate::error::{ToolError, ToolResult};
use crate::params::{present, ListTasksParams, ScheduleTaskParams, TaskIdParams, UpdateTaskParams};

/// Longest script accepted.
const MAX_SCRIPT_BYTES: usize = 64 * 1024;

/// Parses and validates a cron expression, wording the error for the model.
fn parse_cron(expr: &str) -> ToolResult<Schedule> {
    Schedule::parse(expr).map_err(|err| {
        ToolError::invalid(format!(
            "{err}. Use standard 5-field cron: minute hour day-of-month month day-of-week \
             (Sunday = 0), e.g. \"0 9 * * 1-5\" for 9:00 on weekdays or \"*/30 * * * *\" for \
             every 30 minutes"
        ))
    })
}

fn check_script(script: &str) -> ToolResult<()> {
    if script.len() > MAX_SCRIPT_BYTES {
        return Err(ToolError::invalid(format!(
            "script is too long ({} bytes, at most {MAX_SCRIPT_BYTES})",
            script.len()
        )));
    }
    Ok(())
}

/// `schedule_task`.
pub async fn schedule_task(ctx: &Ctx, p: ScheduleTaskParams) -> ToolResult {
    check_text(&ctx.config, "prompt", &p.prompt)?;
    let tz = ctx.config.timezone;
    let now = Utc::now();
    let schedule = present(&p.recurrence).map(parse_cron).transpose()?;
    let first = match (present(&p.process_after), &schedule) {
        (Some(text), _) => parse_when("processAfter", text, tz)?,
        (None, Some(schedule)) => schedule.next_after(now, tz).map_err(ToolError::Db)?,
        (None, None) => {
            return Err(ToolError::invalid(
                "give processAfter (when to run, e.g. 2026-11-23T09:00) or recurrence (a cron \
                 expression), or both",
            ))
        }
    };
    let script = present(&p.script).map(str::to_owned);
    if let Some(script) = &script {
        check_script(script)?;
    }
    let mut content = json!({ "prompt": p.prompt.trim() });
    if let Some(script) = &script {
        content["script"] = json!(script);
    }
    let mut row = NewMessageIn::new("task", content.to_string());
    row.series_is_self = true;
    row.process_after = Some(schema::time::format_ts(first));
    row.recurrence = schedule.as_ref().map(|s| s.expr().to_owned());
    let (id, seq) = ctx
        .db
        .run(move |db| {
            let route = routing::resolve(db, &Target::default())?;
            row.routing = route.routing;
            let inserted = db.insert_in(&row)?;
            Ok((inserted.id, inserted.seq))
        })
        .await?;
    let when = if first <= now {
        "runs now (the time given has passed)".to_owned()
    } else {
        format!("next run {}", format_local_zoned(first, tz))
    };
    let repeats = match &schedule {
        Some(schedule) => format!(", then repeats on cron \"{}\"", schedule.expr()),
        None => ", once".to_owned(),
    };
    Ok(format!(
        "Task scheduled: id {id} (seq {seq}); {when}{repeats}."
    ))
}

/// One line of `list_tasks`.
fn describe(series: &TaskSeries, now: DateTime<Utc>, tz: Tz) -> String {
    let content = series.content();
    let next = match (series.state, series.next_run(now, tz)) {
        (TaskState::Running, Some(at)) => {
            format!("running now; next run {}", format_local_zoned(at, tz))
        }
        (TaskState::Running, None) => "running now".to_owned(),
        (_, Some(at)) if at > now => format!("next run {}", format_local_zoned(at, tz)),
        (_, _) => "due now".to_owned(),
    };
    let state = match (series.state, series.pause_requested) {
        (TaskState::Running, true) => "running, paused after this run",
        (state, _) => state.as_str(),
    };
    let repeats = match series.recurrence() {
        Some(expr) => format!("repeats \"{expr}\""),
        None => "once".to_owned(),
    };
    let mut prompt: String = content.prompt.chars().take(120).collect();
    if prompt.len() < content.prompt.len() {
        prompt.push('…');
    }
    let script = if content.script.is_some() {
        "; has a script"
    } else {
        ""
    };
    format!(
        "- {id} [{state}] {next}; {repeats}{script}; prompt: {prompt:?}",
        id = series.id
    )
}

/// `list_tasks`.
pub async fn list_tasks(ctx: &Ctx, p: ListTasksParams) -> ToolResult {
    let filter = match present(&p.status).map(str::to_ascii_lowercase).as_deref() {
        None | Some("all") => None,
        Some("scheduled" | "pending" | "active") => Some(TaskState::Scheduled),
        Some("paused") => Some(TaskState::Paused),
        Some("running" | "processing") => Some(TaskState::Running),
        Some(other) => {
            return Err(ToolError::invalid(format!(
                "unknown status {other:?}: use scheduled, paused, running or omit it"
            )))
        }
    };
    let tz = ctx.config.timezone;
    let series = ctx.db.run(|db| Ok(db.task_series()?)).await?;
    let now = Utc::now();
    let shown: Vec<String> = series
        .iter()
        .filter(|s| filter.is_none_or(|state| s.state == state))
        .map(|s| describe(s, now, tz))
        .collect();
    if shown.is_empty() {
        return Ok(match filter {
            None => "No scheduled tasks.".to_owned(),
            Some(state) => format!("No {} tasks.", state.as_str()),
        });
    }
    Ok(format!(
        "{} task{} (times in {}):\n{}",
        shown.len(),
        if shown.len() == 1 { "" } else { "s" },
        tz.name(),
        shown.join("\n")
    ))
}

/// `pause_task`.
pub async fn pause_task(ctx: &Ctx, p: TaskIdParams) -> ToolResult {
    let id = check_field("taskId", &p.task_id)?.to_owned();
    let change = ctx.db.run(move |db| Ok(db.pause_task(&id)?)).await?;
    let id = &change.series.id;
    Ok(match (change.previous, change.was_pause_requested) {
        (TaskState::Paused, _) => format!("Task {id} was already paused."),
        (TaskState::Running, _) => format!(
            "Task {id} paused: the run in progress finishes, later runs wait until resume_task."
        ),
        (TaskState::Scheduled, _) => format!("Task {id} paused."),
    })
}

/// `resume_task`.
pub async fn resume_task(ctx: &Ctx, p: TaskIdParams) -> ToolResult {
    let id = check_field("taskId", &p.task_id)?.to_owned();
    let tz = ctx.config.timezone;
    let now = Utc::now();
    let change = ctx.db.run(move |db| Ok(db.resume_task(&id, now)?)).await?;
    let id = &change.series.id;
    if change.previous != TaskState::Paused && !change.was_pause_requested {
        return Ok(format!("Task {id} was not paused; nothing changed."));
    }
    Ok(match change.series.next_run(now, tz) {
        Some(at) if at > now => format!(
            "Task {id} resumed; next run {}.",
            format_local_zoned(at, tz)
        ),
        _ if change.series.state == TaskState::Running => {
            format!("Task {id} resumed; it is running now.")
        }
        _ => format!("Task {id} resumed; it runs now."),
    })
}

/// `cancel_task`.
pub async fn cancel_task(ctx: &Ctx, p: TaskIdParams) -> ToolResult {
    let id = check_field("taskId", &p.task_id)?.to_owned();
    let cancelled = ctx.db.run(move |db| Ok(db.cancel_task(&id)?)).await?;
    Ok(if cancelled.stopped_running {
        format!(
            "Task {} cancelled: the run in progress finishes, no further runs.",
            cancelled.id
        )
    } else {
        format!("Task {} cancelled.", cancelled.id)
    })
}

/// `update_task`.
pub async fn update_task(ctx: &Ctx, p: UpdateTaskParams) -> ToolResult {
    let id = check_field("taskId", &p.task_id)?.to_owned();
    let tz = ctx.config.timezone;
    let mut update = TaskUpdate::default();
    if let Some(prompt) = &p.prompt {
        check_text(&ctx.config, "prompt", prompt)?;
        update.prompt = Some(prompt.trim().to_owned());
    }
    if let Some(script) = &p.script {
        check_script(script)?;
        update.script = Some(present(&p.script).map(str::to_owned));
    }
    if let Some(text) = present(&p.process_after) {
        update.process_after = Some(parse_when("processAfter", text, tz)?);
    }
    if let Some(expr) = &p.recurrence {
        update.recurrence = Some(match present(&p.recurrence) {
            Some(_) => Some(parse_cron(expr)?.expr().to_owned()),
            None => None,
        });
    }
    if update.is_empty() {
        return Err(ToolError::invalid(
            "nothing to update: give prompt, script, processAfter or recurrence",
        ));
    }
    let now = Utc::now();
    let series = ctx
        .db
        .run(move |db| Ok(db.update_task(&id, &update, now)?))
        .await?;
    let next = match series.next_run(now, tz) {
        Some(at) if at > now => format!("next run {}", format_local_zoned(at, tz)),
        _ if series.state == TaskState::Running => "running now".to_owned(),
        _ => "runs now".to_owned(),
    };
    let repeats = match series.recurrence() {
        Some(expr) => format!("repeats \"{expr}\""),
        None => "once".to_owned(),
    };
    Ok(format!("Task {} updated: {next}; {repeats}.", series.id))
}
