//! schedule_task and the task-series tools, in America/New_York.

use chrono::{Datelike, Duration, Timelike, Utc};
use schema::time::{format_ts, parse_ts};
use schema::InStatus;
use serde_json::{json, Value};

use crate::support::{routing, Env, Server};

const TZ: chrono_tz::Tz = chrono_tz::America::New_York;

fn setup() -> (Env, Server) {
    let env = Env::with_tz("America/New_York");
    env.batch(routing("slack", "C1", Some("T1")), "in-1", Some("u1"));
    let server = env.spawn().ready();
    (env, server)
}

/// The id in "Task scheduled: id <id> (seq N)".
fn task_id(text: &str) -> String {
    let start = text.find("id ").unwrap() + 3;
    text[start..].split_whitespace().next().unwrap().to_owned()
}

#[test]
fn schedules_a_one_shot_task_in_local_time() {
    let (env, mut server) = setup();
    let result = server
        .call(
            "schedule_task",
            json!({"prompt": "Send the weekly report", "processAfter": "2030-11-25T09:00",
                   "script": "echo '{\"wakeAgent\":true}'"}),
        )
        .ok();
    assert!(
        result.contains("next run Mon, Nov 25, 2030, 9:00 AM (America/New_York), once"),
        "{result}"
    );
    let id = task_id(&result);
    let row = env.db.message_in(&id).unwrap().unwrap();
    assert_eq!(row.kind, "task");
    assert_eq!(row.seq.unwrap() % 2, 0, "messages_in seqs are even");
    assert_eq!(row.series_id.as_deref(), Some(id.as_str()));
    assert_eq!(row.status, "pending");
    assert_eq!(
        row.process_after.as_deref(),
        Some("2030-11-25T14:00:00.000Z")
    );
    assert_eq!(row.recurrence, None);
    assert_eq!(row.routing, routing("slack", "C1", Some("T1")));
    let content: Value = serde_json::from_str(&row.content).unwrap();
    assert_eq!(
        content,
        json!({"prompt": "Send the weekly report", "script": "echo '{\"wakeAgent\":true}'"})
    );
    // An explicit offset is taken as given; summer time is honoured.
    let result = server
        .call(
            "schedule_task",
            json!({"prompt": "p", "processAfter": "2030-07-01T09:00"}),
        )
        .ok();
    let row = env.db.message_in(&task_id(&result)).unwrap().unwrap();
    assert_eq!(
        row.process_after.as_deref(),
        Some("2030-07-01T13:00:00.000Z")
    );
    let result = server
        .call(
            "schedule_task",
            json!({"prompt": "p", "processAfter": "2030-07-01T09:00:00+02:00"}),
        )
        .ok();
    let row = env.db.message_in(&task_id(&result)).unwrap().unwrap();
    assert_eq!(
        row.process_after.as_deref(),
        Some("2030-07-01T07:00:00.000Z")
    );
}

#[test]
fn schedules_a_recurring_task_at_the_next_cron_time() {
    let (env, mut server) = setup();
    let result = server
        .call(
            "schedule_task",
            json!({"prompt": "Standup", "recurrence": "0 9 * * 1-5"}),
        )
        .ok();
    assert!(
        result.contains("then repeats on cron \"0 9 * * 1-5\""),
        "{result}"
    );
    let row = env.db.message_in(&task_id(&result)).unwrap().unwrap();
    assert_eq!(row.recurrence.as_deref(), Some("0 9 * * 1-5"));
    let next = parse_ts(row.process_after.as_deref().unwrap()).unwrap();
    let local = next.with_timezone(&TZ);
    assert!(next > Utc::now());
    assert_eq!((local.hour(), local.minute()), (9, 0));
    assert!(
        local.weekday().num_days_from_monday() < 5,
        "a weekday: {local}"
    );
}

#[test]
fn bad_schedules_are_refused() {
    let (env, mut server) = setup();
    for (args, expected) in [
        (
            json!({"prompt": "p", "recurrence": "0 9 * *"}),
            "expected 5 fields",
        ),
        (
            json!({"prompt": "p", "recurrence": "61 * * * *"}),
            "bad cron expression",
        ),
        (
            json!({"prompt": "p", "recurrence": "every monday"}),
            "5-field cron",
        ),
        (
            json!({"prompt": "p", "processAfter": "next tuesday"}),
            "is not a date-time",
        ),
        (
            json!({"prompt": "p", "processAfter": "2030-13-45T09:00"}),
            "is not a date-time",
        ),
        (
            json!({"prompt": "p", "processAfter": "2030-03-10T02:30"}),
            "does not exist in America/New_York",
        ),
        (json!({"prompt": "p"}), "give processAfter"),
        (
            json!({"prompt": "  ", "processAfter": "2030-01-01T09:00"}),
            "prompt is empty",
        ),
    ] {
        let err = server.call("schedule_task", args.clone()).err();
        assert!(err.contains(expected), "{args}: {err}");
    }
    assert!(env.db.all_messages_in().unwrap().is_empty());
}

#[test]
fn list_pause_resume_update_cancel() {
    let (env, mut server) = setup();
    assert_eq!(
        server.call("list_tasks", json!({})).ok(),
        "No scheduled tasks."
    );
    let daily = task_id(
        &server
            .call("schedule_task", json!({"prompt": "Daily digest", "processAfter": "2030-01-07T08:00", "recurrence": "0 8 * * *"}))
            .ok(),
    );
    let once = task_id(
        &server
            .call(
                "schedule_task",
                json!({"prompt": "Renew the certificate", "processAfter": "2030-02-01T10:30"}),
            )
            .ok(),
    );

    let list = server.call("list_tasks", json!({})).ok();
    assert!(
        list.starts_with("2 tasks (times in America/New_York):"),
        "{list}"
    );
    let daily_line = list.lines().find(|l| l.contains(&daily)).unwrap();
    assert!(daily_line.contains("[scheduled] next run Mon, Jan 7, 2030, 8:00 AM (America/New_York); repeats \"0 8 * * *\""), "{daily_line}");
    assert!(
        daily_line.contains("prompt: \"Daily digest\""),
        "{daily_line}"
    );
    let lines: Vec<&str> = list.lines().skip(1).collect();
    assert!(
        lines[0].contains(&daily) && lines[1].contains(&once),
        "soonest first: {list}"
    );

    // Pause: the row is paused and the series key set; pausing twice is harmless.
    assert_eq!(
        server.call("pause_task", json!({"taskId": daily})).ok(),
        format!("Task {daily} paused.")
    );
    assert_eq!(env.db.message_in(&daily).unwrap().unwrap().status, "paused");
    assert!(env
        .db
        .state(&format!("series_paused:{daily}"))
        .unwrap()
        .is_some());
    assert!(server
        .call("pause_task", json!({"taskId": daily}))
        .ok()
        .contains("already paused"));
    let paused = server.call("list_tasks", json!({"status": "paused"})).ok();
    assert!(
        paused.starts_with("1 task ") && paused.contains(&daily),
        "{paused}"
    );
    assert!(server
        .call("list_tasks", json!({"status": "bogus"}))
        .err()
        .contains("unknown status"));

    // Resume: a recurring run whose time passed moves to the next cron time.
    env.db
        .update_task(
            &daily,
            &schema::tasks::TaskUpdate {
                process_after: Some(Utc::now() - Duration::days(2)),
                ..Default::default()
            },
            Utc::now(),
        )
        .unwrap();
    let resumed = server.call("resume_task", json!({"taskId": daily})).ok();
    assert!(resumed.contains("resumed; next run"), "{resumed}");
    let row = env.db.message_in(&daily).unwrap().unwrap();
    assert_eq!(row.status, InStatus::Pending.as_str());
    let next = parse_ts(row.process_after.as_deref().unwrap()).unwrap();
    assert!(next > Utc::now() && next < Utc::now() + Duration::days(1) + Duration::hours(1));
    assert_eq!(next.with_timezone(&TZ).hour(), 8);
    assert!(env
        .db
        .state(&format!("series_paused:{daily}"))
        .unwrap()
        .is_none());
    assert!(server
        .call("resume_task", json!({"taskId": daily}))
        .ok()
        .contains("was not paused"));

    // Update: prompt, recurrence (recomputes the next run), then back to one-shot.
    let updated = server
        .call(
            "update_task",
            json!({"taskId": daily, "prompt": "Digest v2", "recurrence": "30 7 * * 1"}),
        )
        .ok();
    assert!(updated.contains("repeats \"30 7 * * 1\""), "{updated}");
    let row = env.db.message_in(&daily).unwrap().unwrap();
    let local = parse_ts(row.process_after.as_deref().unwrap())
        .unwrap()
        .with_timezone(&TZ);
    assert_eq!(
        (
            local.weekday().num_days_from_monday(),
            local.hour(),
            local.minute()
        ),
        (0, 7, 30)
    );
    assert!(row.content.contains("Digest v2"));
    let err = server
        .call("update_task", json!({"taskId": daily, "recurrence": "bad"}))
        .err();
    assert!(err.contains("5-field cron"), "{err}");
    let err = server.call("update_task", json!({"taskId": daily})).err();
    assert!(err.contains("nothing to update"), "{err}");
    server
        .call(
            "update_task",
            json!({"taskId": daily, "recurrence": "", "processAfter": "2031-05-05T12:00"}),
        )
        .ok();
    let row = env.db.message_in(&daily).unwrap().unwrap();
    assert_eq!(row.recurrence, None);
    assert_eq!(
        row.process_after.as_deref(),
        Some(format_ts(parse_ts("2031-05-05T16:00:00Z").unwrap()).as_str())
    );

    // Cancel deletes the upcoming rows; unknown ids are clear errors.
    assert_eq!(
        server.call("cancel_task", json!({"taskId": once})).ok(),
        format!("Task {once} cancelled.")
    );
    assert!(env.db.message_in(&once).unwrap().is_none());
    for tool in ["cancel_task", "pause_task", "resume_task"] {
        let err = server.call(tool, json!({"taskId": "no-such-task"})).err();
        assert!(
            err.contains("no task with id \"no-such-task\""),
            "{tool}: {err}"
        );
    }
    let err = server
        .call("update_task", json!({"taskId": "nope", "prompt": "x"}))
        .err();
    assert!(err.contains("no task with id \"nope\""), "{err}");
    let err = server.call("cancel_task", json!({"taskId": once})).err();
    assert!(
        err.contains("no task with id") || err.contains("no upcoming runs"),
        "{err}"
    );
    let list = server.call("list_tasks", json!({})).ok();
    assert!(
        list.starts_with("1 task ") && list.contains(&daily),
        "{list}"
    );
}

#[test]
fn cancelling_a_running_recurring_task_stops_its_successor() {
    let (env, mut server) = setup();
    let id = task_id(
        &server
            .call("schedule_task", json!({"prompt": "poll", "processAfter": "2020-01-01T00:00", "recurrence": "*/5 * * * *"}))
            .ok(),
    );
    // The runner claims it; while it runs it is listed as running.
    env.db.claim(std::slice::from_ref(&id)).unwrap();
    let list = server.call("list_tasks", json!({})).ok();
    assert!(list.contains("[running] running now; next run"), "{list}");
    let cancelled = server.call("cancel_task", json!({"taskId": id})).ok();
    assert!(
        cancelled.contains("the run in progress finishes"),
        "{cancelled}"
    );
    env.db.complete(std::slice::from_ref(&id), &[]).unwrap();
    assert_eq!(
        server.call("list_tasks", json!({})).ok(),
        "No scheduled tasks."
    );
    assert!(env
        .db
        .messages_in_with_status(InStatus::Pending)
        .unwrap()
        .is_empty());
}
