//! Scheduled tasks through the runner loop (docs/contract/db.md#tasks; issue 5): due times and the
//! runner's own timer, recurring series on the cron grid (also across DST in America/New_York),
//! pre-agent scripts, the heartbeat during a script, pause / resume / cancel / update, no forks
//! under a crash, and an invalid cron stopping its series.
//!
//! # Time
//!
//! Timer tests run on paused tokio time (`start_paused = true`) with the runner's clock set to
//! `runner::tokio_clock(start)`, so simulated weeks pass in milliseconds. This is reliable here
//! because every SQLite call of the runner goes through `spawn_blocking`, and on the
//! current-thread test runtime a running blocking task inhibits tokio's auto-advance
//! (`BlockingSchedule` in tokio 1.54): virtual time never jumps while the runner is mid-poll.
//! The only outside wake-up is the file watcher (an OS thread); these tests never rely on it:
//! either the runner's own timer or its idle poll (1 s of virtual time) notices each change, so
//! no result depends on how fast a file event arrives. Completion times are read from
//! `status_changed` of the completed row, which `complete_at` writes from the runner's clock:
//! that is the virtual instant the occurrence finished.
//!
//! Tests with real processes (scripts, the heartbeat) run on real time: a child process is
//! invisible to tokio, so paused time would rush past a script's timeout while it runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use agent_runner::runner::tokio_clock;
use chrono::{DateTime, Datelike, Timelike, Utc, Weekday};
use chrono_tz::Tz;
use provider::mock::{MockProvider, MockStep};
use schema::tasks::{TaskState, TaskUpdate};
use schema::time::{format_ts, parse_ts};
use schema::{MessageIn, NewMessageIn, OpenOptions, Routing, SessionDb};
use serde_json::json;

use crate::common;

use common::Fixture;

// ----- fixture ---------------------------------------------------------------------------------

/// The fixture of the loop tests (tests/common) with what tasks need on top: the session's
/// timezone, a clean `PATH` for scripts, the agent folder, and the virtual clock.
impl Fixture {
    fn utc() -> Self {
        Self::in_zone(chrono_tz::UTC)
    }

    /// A session whose DB (cron) and runner (prompts) both use `timezone`.
    fn in_zone(timezone: Tz) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("agent")).unwrap();
        let db = SessionDb::open_with(
            dir.path().join("session.db"),
            OpenOptions {
                timezone,
                ..OpenOptions::default()
            },
        )
        .unwrap();
        let mut fixture = Self::with_db(dir, db);
        fixture.options.timezone = timezone;
        fixture.options.script_env =
            BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]);
        fixture
    }

    /// Virtual time: the runner's clock reads `start` now and moves with paused tokio time.
    fn virtual_clock(&mut self, start: DateTime<Utc>) {
        self.options.clock = tokio_clock(start);
        // The production clamp (1 s); a test that must prove the timer sets it far longer.
        self.options.idle_poll = Duration::from_secs(1);
        // Nobody looks at the heartbeat here; weeks of 1 s beats would only cost time.
        self.options.heartbeat = Duration::from_secs(86_400);
    }

    /// The runner's "now" (virtual-time tests).
    fn now(&self) -> DateTime<Utc> {
        (self.options.clock)()
    }

    /// Lets virtual time run until the runner's clock reads `at`.
    async fn sleep_until(&self, at: DateTime<Utc>) {
        let wait = (at - self.now()).to_std().unwrap_or_default();
        tokio::time::sleep(wait).await;
    }

    fn prompt_texts(&self) -> Vec<String> {
        self.mock.prompts().into_iter().map(|p| p.text).collect()
    }

    /// Every row of a series, in seq order.
    fn series(&self, series: &str) -> Vec<MessageIn> {
        self.db
            .all_messages_in()
            .unwrap()
            .into_iter()
            .filter(|r| r.series_id.as_deref() == Some(series))
            .collect()
    }

    /// Rows of `series` with `status`.
    fn series_with(&self, series: &str, status: &str) -> Vec<MessageIn> {
        self.series(series)
            .into_iter()
            .filter(|r| r.status == status)
            .collect()
    }
}

fn routing() -> Routing {
    Routing {
        channel_type: Some("slack".into()),
        platform_id: Some("C1".into()),
        thread_id: None,
    }
}

/// A task row as `schedule_task` writes it: its own series.
fn task(prompt: &str, due: Option<DateTime<Utc>>, recurrence: Option<&str>) -> NewMessageIn {
    scripted(prompt, None, due, recurrence)
}

fn scripted(
    prompt: &str,
    script: Option<&str>,
    due: Option<DateTime<Utc>>,
    recurrence: Option<&str>,
) -> NewMessageIn {
    let mut content = json!({ "prompt": prompt });
    if let Some(script) = script {
        content["script"] = json!(script);
    }
    let mut row = NewMessageIn::new("task", content.to_string());
    row.series_is_self = true;
    row.process_after = due.map(format_ts);
    row.recurrence = recurrence.map(str::to_owned);
    row.routing = routing();
    row
}

fn chat(text: &str) -> NewMessageIn {
    common::chat_with(text, routing())
}

fn at(text: &str) -> DateTime<Utc> {
    parse_ts(text).unwrap()
}

fn minutes(n: i64) -> chrono::Duration {
    chrono::Duration::minutes(n)
}

fn millis(n: i64) -> chrono::Duration {
    chrono::Duration::milliseconds(n)
}

fn due_of(row: &MessageIn) -> DateTime<Utc> {
    at(row.process_after.as_deref().unwrap())
}

/// When a completed row was completed: `complete_at` writes the runner's clock.
fn completed_at(row: &MessageIn) -> DateTime<Utc> {
    assert_eq!(row.status, "completed", "{row:?}");
    at(row.status_changed.as_deref().unwrap())
}

/// How much tokio time may pass between a due instant and the completion of its turn: the timer
/// wheel's 1 ms ticks and the mock's zero-delay sleep.
const SLACK_MS: i64 = 5;

/// The occurrence ran at its due time: not before, at most `SLACK_MS` after.
fn assert_ran_on_time(row: &MessageIn) {
    let lag = completed_at(row) - due_of(row);
    assert!(
        lag >= chrono::Duration::zero() && lag <= millis(SLACK_MS),
        "due {} but completed {} (lag {lag})",
        format_ts(due_of(row)),
        row.status_changed.as_deref().unwrap_or_default()
    );
}

fn is_gone(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.is_empty() || stat.contains(") Z ")
}

// ----- due times and the runner's timer
// -----------------------------------------------------------

/// The runner sleeps until the earliest due row by itself: with the idle poll set to an hour,
/// a task due in 10 minutes (off any poll grid) still runs exactly then, and not a millisecond
/// before.
#[tokio::test(start_paused = true)]
async fn a_task_due_in_ten_minutes_runs_then_on_the_runners_own_timer() {
    let mut f = Fixture::utc();
    let start = at("2026-03-02T10:00:00.000Z");
    f.virtual_clock(start);
    let due = start + minutes(10) + millis(437);
    let id = f.insert(task("water the plants", Some(due), None));
    let started = std::time::Instant::now();
    f.start_with(|o| o.idle_poll = Duration::from_secs(3600));

    f.sleep_until(due - millis(1)).await;
    assert_eq!(f.row(&id).status, "pending", "ran before it was due");
    assert!(f.mock.prompts().is_empty());

    f.sleep_until(due + minutes(1)).await;
    let row = f.row(&id);
    assert_ran_on_time(&row);
    let prompts = f.prompt_texts();
    assert_eq!(prompts.len(), 1);
    assert!(
        prompts[0].contains(r#"<task time="Mar 2, 2026, 10:10 AM">water the plants</task>"#),
        "{}",
        prompts[0]
    );
    assert_eq!(f.outs().len(), 1, "the agent's reply is written");
    f.stop().await;
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A pending row that never wakes the agent (context only) must not hide a later task's due
/// time from the timer, nor make the runner poll in a tight loop while it waits.
#[tokio::test(start_paused = true)]
async fn a_waiting_context_row_neither_masks_the_timer_nor_spins_the_loop() {
    let mut f = Fixture::utc();
    let start = at("2026-03-02T10:00:00.000Z");
    f.virtual_clock(start);
    let mut quiet = chat("context only");
    quiet.trigger = false;
    let quiet = f.insert(quiet);
    let due = start + minutes(10) + millis(437);
    let id = f.insert(task("report", Some(due), None));
    let started = std::time::Instant::now();
    f.start_with(|o| o.idle_poll = Duration::from_secs(3600));

    f.sleep_until(due - millis(1)).await;
    assert_eq!(f.row(&id).status, "pending");
    // 10 minutes of 5 ms polls would be 120,000 polls; the timer makes it a handful.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the runner busy-polled while a context-only row waited ({:?})",
        started.elapsed()
    );
    f.sleep_until(due + minutes(1)).await;
    assert_ran_on_time(&f.row(&id));
    assert_eq!(
        f.row(&quiet).status,
        "completed",
        "the context row rode along"
    );
    let prompts = f.prompt_texts();
    assert_eq!(prompts.len(), 1);
    assert!(prompts[0].contains("context only") && prompts[0].contains("report"));
    f.stop().await;
}

// ----- recurring series -----------------------------------------------------------------------

/// `*/5 * * * *`: each occurrence runs on the 5-minute grid, completes with its recurrence
/// cleared, and inserts exactly one successor in the same series; at no sampled moment does the
/// series have more or less than one upcoming run.
#[tokio::test(start_paused = true)]
async fn a_five_minute_series_runs_on_the_grid_with_exactly_one_next_occurrence() {
    let mut f = Fixture::utc();
    let start = at("2026-03-02T10:00:00.250Z");
    f.virtual_clock(start);
    let series = f.insert(task(
        "tick",
        Some(at("2026-03-02T10:05:00Z")),
        Some("*/5 * * * *"),
    ));
    f.start_with(|o| o.idle_poll = Duration::from_secs(3600));

    // Sample every 5 s of virtual time for 21 minutes.
    let end = at("2026-03-02T10:21:00Z");
    while f.now() < end {
        let rows = f.series(&series);
        let upcoming = rows
            .iter()
            .filter(|r| r.status == "pending" || r.status == "processing")
            .count();
        assert_eq!(upcoming, 1, "at {}: {rows:#?}", format_ts(f.now()));
        assert!(
            f.series_with(&series, "pending").len() <= 1,
            "two next occurrences"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
    }

    let rows = f.series(&series);
    let done: Vec<&MessageIn> = rows.iter().filter(|r| r.status == "completed").collect();
    let dues: Vec<String> = done.iter().map(|r| format_ts(due_of(r))).collect();
    assert_eq!(
        dues,
        [
            "2026-03-02T10:05:00.000Z",
            "2026-03-02T10:10:00.000Z",
            "2026-03-02T10:15:00.000Z",
            "2026-03-02T10:20:00.000Z"
        ]
    );
    for row in &done {
        assert_ran_on_time(row);
        assert_eq!(
            row.recurrence, None,
            "a completed occurrence keeps no recurrence"
        );
        assert_eq!(row.series_id.as_deref(), Some(series.as_str()));
        assert_eq!(row.routing, routing());
    }
    let pending = f.series_with(&series, "pending");
    assert_eq!(pending.len(), 1);
    assert_eq!(
        pending[0].process_after.as_deref(),
        Some("2026-03-02T10:25:00.000Z")
    );
    assert_eq!(pending[0].recurrence.as_deref(), Some("*/5 * * * *"));
    assert_eq!(pending[0].routing, routing());
    assert_eq!(pending[0].content, done[0].content);
    let prompts = f.prompt_texts();
    assert_eq!(prompts.len(), 4);
    assert!(
        prompts.iter().all(|p| p.contains(">tick</task>")),
        "{prompts:?}"
    );
    f.stop().await;
}

/// `0 9 * * 1-5` in America/New_York from March to November 2026: never on a weekend, always
/// 9:00 local, so 14:00Z in winter time and 13:00Z in summer time, right on both sides of
/// 2026-03-08 and 2026-11-01. The runner drives the two weeks around each change on virtual
/// time; the months between are walked through the same completion path (`claim` +
/// `complete_at`) the runner uses, which keeps the test fast on an unoptimized SQLite build.
#[tokio::test(start_paused = true)]
async fn a_weekday_series_in_new_york_skips_weekends_and_follows_both_dst_changes() {
    let tz: Tz = "America/New_York".parse().unwrap();
    let mut f = Fixture::in_zone(tz);
    let series = f.insert(task(
        "standup notes",
        Some(at("2026-03-05T14:00:00Z")), // Thursday 9:00 EST
        Some("0 9 * * 1-5"),
    ));
    let one_upcoming = |f: &Fixture| {
        let upcoming = f
            .series(&series)
            .into_iter()
            .filter(|r| r.status == "pending" || r.status == "processing")
            .count();
        assert_eq!(upcoming, 1, "at {}", format_ts(f.now()));
    };

    // Spring forward, through the runner, sampling the series every 6 hours.
    f.virtual_clock(at("2026-03-04T20:00:00Z"));
    f.start_with(|o| o.idle_poll = Duration::from_secs(3600));
    while f.now() < at("2026-03-14T00:00:00Z") {
        one_upcoming(&f);
        tokio::time::sleep(Duration::from_secs(6 * 3600)).await;
    }
    f.stop().await;
    let by_runner_spring = f.series_with(&series, "completed");
    assert_eq!(by_runner_spring.len(), 7, "Mar 5, 6, 9, 10, 11, 12, 13");

    // The months between: each occurrence completed a few ms after it fell due.
    loop {
        let pending = f.series_with(&series, "pending");
        assert_eq!(pending.len(), 1);
        let due = due_of(&pending[0]);
        if due >= at("2026-10-26T00:00:00Z") {
            break;
        }
        let ids = vec![pending[0].id.clone()];
        assert_eq!(f.db.claim(&ids).unwrap().len(), 1);
        f.db.complete_at(&ids, &[], due + millis(3)).unwrap();
    }

    // Fall back, through a new runner.
    f.virtual_clock(at("2026-10-24T12:00:00Z"));
    f.start_with(|o| o.idle_poll = Duration::from_secs(3600));
    while f.now() < at("2026-11-07T00:00:00Z") {
        one_upcoming(&f);
        tokio::time::sleep(Duration::from_secs(6 * 3600)).await;
    }
    f.stop().await;

    let done = f.series_with(&series, "completed");
    let mut weekdays = 0;
    let mut day = at("2026-03-05T00:00:00Z").date_naive();
    while day < at("2026-11-07T00:00:00Z").date_naive() {
        if !matches!(day.weekday(), Weekday::Sat | Weekday::Sun) {
            weekdays += 1;
        }
        day = day.succ_opt().unwrap();
    }
    assert_eq!(done.len(), weekdays, "one run per weekday, none missed");
    for row in &done {
        let due = due_of(row);
        let local = due.with_timezone(&tz);
        assert!(
            !matches!(local.weekday(), Weekday::Sat | Weekday::Sun),
            "fired on a weekend: {}",
            format_ts(due)
        );
        assert_eq!((local.hour(), local.minute(), local.second()), (9, 0, 0));
        let summer = due > at("2026-03-08T07:00:00Z") && due < at("2026-11-01T06:00:00Z");
        assert_eq!(
            due.hour(),
            if summer { 13 } else { 14 },
            "{}",
            format_ts(due)
        );
        assert_eq!(row.recurrence, None);
    }
    let by_runner: Vec<&MessageIn> = done
        .iter()
        .filter(|r| {
            due_of(r) < at("2026-03-14T00:00:00Z") || due_of(r) > at("2026-10-25T00:00:00Z")
        })
        .collect();
    assert_eq!(by_runner.len(), 17, "Mar 5-13 and Oct 26 - Nov 6");
    for row in &by_runner {
        assert_ran_on_time(row);
    }
    let dues: Vec<String> = done.iter().map(|r| format_ts(due_of(r))).collect();
    for expected in [
        "2026-03-06T14:00:00.000Z", // Friday before spring forward: EST
        "2026-03-09T13:00:00.000Z", // Monday after: EDT
        "2026-10-30T13:00:00.000Z", // Friday before fall back: EDT
        "2026-11-02T14:00:00.000Z", // Monday after: EST
    ] {
        assert!(dues.iter().any(|d| d == expected), "{expected} missing");
    }
    let pending = f.series_with(&series, "pending");
    assert_eq!(pending.len(), 1);
    assert_eq!(
        pending[0].process_after.as_deref(),
        Some("2026-11-09T14:00:00.000Z")
    );
    // The agent saw each run the runner drove, at 9:00 local time.
    let prompts = f.prompt_texts();
    assert_eq!(prompts.len(), 17);
    assert!(
        prompts
            .iter()
            .all(|p| p.contains(", 9:00 AM\">standup notes</task>")),
        "{prompts:#?}"
    );
    assert!(prompts[0].contains(r#"<context timezone="America/New_York" />"#));
    assert!(prompts[1].contains(r#"<task time="Mar 6, 2026, 9:00 AM">"#));
    assert!(prompts[2].contains(r#"<task time="Mar 9, 2026, 9:00 AM">"#));
    assert!(prompts[11].contains(r#"<task time="Oct 30, 2026, 9:00 AM">"#));
    assert!(prompts[12].contains(r#"<task time="Nov 2, 2026, 9:00 AM">"#));
}

// ----- pre-agent scripts (real time: they run real processes) -----------------------------------

#[tokio::test]
async fn script_wake_true_puts_its_data_in_the_task_element() {
    let mut f = Fixture::utc();
    f.start();
    let id = f.insert(scripted(
        "Comment on new PRs",
        Some(r#"echo "checking"; echo '{"wakeAgent": true, "data": {"prs": [7, 9], "note": "a < b"}}'"#),
        None,
        None,
    ));
    f.wait_completed(&id).await;
    let prompts = f.prompt_texts();
    assert_eq!(prompts.len(), 1);
    let expected = "\">Script output:\n{\n  \"note\": \"a &lt; b\",\n  \"prs\": [\n    7,\n    9\n  ]\n}\n\nInstructions:\nComment on new PRs</task>";
    assert!(prompts[0].contains("<task time=\""), "{}", prompts[0]);
    assert!(prompts[0].contains(expected), "{}", prompts[0]);
    let outs = f.outs();
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].kind, "chat");
    assert_eq!(outs[0].in_reply_to.as_deref(), Some(id.as_str()));
    assert!(f.system_outs("task_skipped").is_empty());
    f.stop().await;
}

#[tokio::test]
async fn script_wake_false_completes_the_task_without_a_query() {
    let mut f = Fixture::utc();
    f.start();
    let id = f.insert(scripted(
        "never seen",
        Some(r#"echo '{"wakeAgent": false, "data": {"nothing": "new"}}'"#),
        None,
        None,
    ));
    f.wait_completed(&id).await;
    // A chat after it proves the loop went past the task without querying for it.
    let next = f.insert(chat("after the task"));
    f.wait_completed(&next).await;
    let prompts = f.prompt_texts();
    assert_eq!(prompts.len(), 1);
    assert!(!prompts[0].contains("never seen"));
    assert!(f
        .mock
        .inputs()
        .iter()
        .all(|i| !i.prompt.text.contains("never seen")));
    assert_eq!(
        f.outs().len(),
        1,
        "no reply, no system row for a quiet skip"
    );
    f.stop().await;
}

#[tokio::test]
async fn script_failing_exit_completes_the_task_with_a_task_skipped_row() {
    let mut f = Fixture::utc();
    f.start();
    let id = f.insert(scripted(
        "never seen",
        Some("echo '{\"wakeAgent\": true}'; echo 'gh: not logged in' >&2; exit 3"),
        None,
        None,
    ));
    f.wait_completed(&id).await;
    f.wait_for("task_skipped", |f| {
        !f.system_outs("task_skipped").is_empty()
    })
    .await;
    let skipped = f.system_outs("task_skipped");
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0]["payload"]["taskId"], id.as_str());
    let reason = skipped[0]["payload"]["reason"].as_str().unwrap();
    assert!(reason.contains("exited with code 3"), "{reason}");
    assert!(reason.contains("gh: not logged in"), "{reason}");
    let out = f.outs().into_iter().find(|o| o.kind == "system").unwrap();
    assert_eq!(out.in_reply_to.as_deref(), Some(id.as_str()));
    assert_eq!(out.routing, routing());
    assert!(
        f.mock.prompts().is_empty(),
        "a failed script woke the agent"
    );
    f.stop().await;
}

#[tokio::test]
async fn script_timeout_kills_its_grandchild_and_skips_the_task() {
    let mut f = Fixture::utc();
    f.start_with(|o| o.script_limits.timeout = Duration::from_millis(500));
    let began = std::time::Instant::now();
    let id = f.insert(scripted(
        "never seen",
        Some("sleep 300 & echo $! > grandchild.pid; echo $$ > script.pid; echo 'waiting' >&2; sleep 300"),
        None,
        None,
    ));
    f.wait_completed(&id).await;
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "{:?}",
        began.elapsed()
    );
    let skipped = f.system_outs("task_skipped");
    assert_eq!(skipped.len(), 1);
    let reason = skipped[0]["payload"]["reason"].as_str().unwrap();
    assert!(reason.contains("timed out after 500 ms"), "{reason}");
    assert!(reason.contains("waiting"), "{reason}");
    assert!(f.mock.prompts().is_empty());
    let agent = f.dir.path().join("agent");
    for file in ["grandchild.pid", "script.pid"] {
        let pid: i32 = std::fs::read_to_string(agent.join(file))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while !is_gone(pid) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(is_gone(pid), "{file}: process {pid} still runs");
    }
    f.stop().await;
}

#[tokio::test]
async fn script_with_five_megabytes_of_output_still_decides() {
    let mut f = Fixture::utc();
    f.start();
    let chatty = f.insert(scripted(
        "chatty but fine",
        Some(
            "head -c 5000000 /dev/zero | tr '\\0' a; echo; \
             echo '{\"wakeAgent\": true, \"data\": {\"big\": \"done\"}}'",
        ),
        None,
        None,
    ));
    f.wait_completed(&chatty).await;
    let one_line = f.insert(scripted(
        "never seen",
        Some("head -c 5000000 /dev/zero | tr '\\0' b"),
        None,
        None,
    ));
    f.wait_completed(&one_line).await;
    let prompts = f.prompt_texts();
    assert_eq!(prompts.len(), 1);
    assert!(
        prompts[0].contains("\"big\": \"done\""),
        "{}",
        &prompts[0][..prompts[0].len().min(500)]
    );
    assert!(
        prompts[0].len() < 4096,
        "the script's output reached the prompt"
    );
    assert!(!prompts[0].contains("never seen"));
    let skipped = f.system_outs("task_skipped");
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0]["payload"]["taskId"], one_line.as_str());
    let reason = skipped[0]["payload"]["reason"].as_str().unwrap();
    assert!(reason.contains("longer than 1 MiB"), "{reason}");
    assert!(
        reason.len() < 2000,
        "the reason quotes only a prefix: {} bytes",
        reason.len()
    );
    f.stop().await;
}

#[tokio::test]
async fn script_with_a_malformed_last_line_skips_the_task() {
    let mut f = Fixture::utc();
    f.start();
    let id = f.insert(scripted(
        "never seen",
        Some("echo '{\"wakeAgent\": true}'; echo 'all done, nothing to report'"),
        None,
        None,
    ));
    f.wait_completed(&id).await;
    f.wait_for("task_skipped", |f| {
        !f.system_outs("task_skipped").is_empty()
    })
    .await;
    let reason = f.system_outs("task_skipped")[0]["payload"]["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains("not JSON"), "{reason}");
    assert!(reason.contains("all done, nothing to report"), "{reason}");
    assert!(f.mock.prompts().is_empty());
    f.stop().await;
}

/// Tasks that fall due while the agent is busy go through their scripts too: the one whose
/// script says `wakeAgent: false` is completed without the agent ever seeing it, the other is
/// pushed into the running query with its script output.
#[tokio::test]
async fn scripts_gate_tasks_that_arrive_mid_turn() {
    let mut f = Fixture::utc();
    f.mock = MockProvider::with_delay(Duration::from_millis(800));
    f.start();
    let first = f.insert(chat("first"));
    f.wait_for("the first prompt", |f| f.mock.prompts().len() == 1)
        .await;
    let quiet = f.insert(scripted(
        "SECRET quiet task",
        Some(r#"echo '{"wakeAgent": false}'"#),
        None,
        None,
    ));
    let loud = f.insert(scripted(
        "loud task",
        Some(r#"echo '{"wakeAgent": true, "data": 42}'"#),
        None,
        None,
    ));
    f.wait_completed(&quiet).await;
    assert_eq!(
        f.row(&first).status,
        "processing",
        "the first turn is still running"
    );
    f.wait_completed(&first).await;
    f.wait_completed(&loud).await;
    let prompts = f.prompt_texts();
    assert_eq!(prompts.len(), 2, "{prompts:?}");
    assert_eq!(
        f.mock.inputs().len(),
        1,
        "the task was pushed, not a new query"
    );
    assert!(
        prompts[1].contains("Script output:\n42\n\nInstructions:\nloud task</task>"),
        "{}",
        prompts[1]
    );
    assert!(prompts.iter().all(|p| !p.contains("SECRET")), "{prompts:?}");
    assert!(f.system_outs("task_skipped").is_empty());
    f.stop().await;
}

/// A script blocks the loop for its duration, but never the heartbeat the host's idle detection
/// reads.
#[tokio::test]
async fn the_heartbeat_keeps_beating_while_a_script_runs() {
    let mut f = Fixture::utc();
    f.start_with(|o| o.heartbeat = Duration::from_secs(1));
    f.wait_for("runner_state", |f| f.db.runner_state().unwrap().is_some())
        .await;
    let id = f.insert(scripted(
        "slow check",
        Some(r#"touch started; sleep 3; echo '{"wakeAgent": false}'"#),
        None,
        None,
    ));
    let marker = f.dir.path().join("agent").join("started");
    f.wait_for("the script to start", |_| marker.exists()).await;
    let mut beats = Vec::new();
    while f.row(&id).status != "completed" {
        let state = f.db.runner_state().unwrap().unwrap();
        let beat = at(&state.heartbeat_at);
        if beats.last() != Some(&beat) && f.row(&id).status == "processing" {
            beats.push(beat);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The first sample may predate the script; at least two further beats came during it.
    assert!(
        beats.len() >= 3,
        "heartbeats seen during a 3 s script: {beats:?}"
    );
    for pair in beats.windows(2) {
        assert!(pair[1] > pair[0]);
    }
    assert!(f.mock.prompts().is_empty());
    f.stop().await;
}

// ----- pause / resume / cancel / update ---------------------------------------------------------

/// A paused series runs nothing and inserts nothing; resuming after its time passed schedules
/// the next future cron time (missed runs are not replayed).
#[tokio::test(start_paused = true)]
async fn pause_holds_a_series_and_resume_schedules_the_next_future_time() {
    let mut f = Fixture::utc();
    let start = at("2026-03-02T10:00:00Z");
    f.virtual_clock(start);
    let series = f.insert(task(
        "tick",
        Some(at("2026-03-02T10:05:00Z")),
        Some("*/5 * * * *"),
    ));
    f.start();

    f.sleep_until(at("2026-03-02T10:06:00Z")).await;
    assert_eq!(f.series_with(&series, "completed").len(), 1);
    let change = f.db.pause_task(&series).unwrap();
    assert_eq!(change.series.state, TaskState::Paused);

    f.sleep_until(at("2026-03-02T10:32:00Z")).await;
    assert_eq!(f.mock.prompts().len(), 1, "a paused series ran");
    let rows = f.series(&series);
    assert_eq!(rows.len(), 2, "a paused series inserted rows: {rows:#?}");
    let paused = f.series_with(&series, "paused");
    assert_eq!(paused.len(), 1);
    assert_eq!(
        paused[0].process_after.as_deref(),
        Some("2026-03-02T10:10:00.000Z")
    );

    let change = f.db.resume_task(&series, f.now()).unwrap();
    assert_eq!(change.previous, TaskState::Paused);
    assert_eq!(change.series.state, TaskState::Scheduled);
    assert_eq!(
        change.series.row.process_after.as_deref(),
        Some("2026-03-02T10:35:00.000Z")
    );
    f.sleep_until(at("2026-03-02T10:35:00Z") - millis(1)).await;
    assert_eq!(
        f.mock.prompts().len(),
        1,
        "a missed run was replayed on resume"
    );
    f.sleep_until(at("2026-03-02T10:36:00Z")).await;
    let done = f.series_with(&series, "completed");
    assert_eq!(done.len(), 2);
    assert_ran_on_time(&done[1]);
    let pending = f.series_with(&series, "pending");
    assert_eq!(pending.len(), 1);
    assert_eq!(
        pending[0].process_after.as_deref(),
        Some("2026-03-02T10:40:00.000Z")
    );
    f.stop().await;
}

/// Pausing while an occurrence runs: when it completes, its successor is inserted `paused`.
#[tokio::test(start_paused = true)]
async fn an_occurrence_completing_while_paused_inserts_a_paused_successor() {
    let mut f = Fixture::utc();
    f.virtual_clock(at("2026-03-02T10:00:00Z"));
    f.mock.script([MockStep::Echo {
        delay: Duration::from_secs(30),
    }]);
    let series = f.insert(task(
        "slow tick",
        Some(at("2026-03-02T10:05:00Z")),
        Some("*/5 * * * *"),
    ));
    f.start();

    f.sleep_until(at("2026-03-02T10:05:10Z")).await;
    assert_eq!(f.row(&series).status, "processing");
    let change = f.db.pause_task(&series).unwrap();
    assert_eq!(change.series.state, TaskState::Running);
    assert!(change.series.pause_requested);

    f.sleep_until(at("2026-03-02T10:21:00Z")).await;
    assert_eq!(f.row(&series).status, "completed");
    assert_eq!(f.mock.prompts().len(), 1);
    let rows = f.series(&series);
    assert_eq!(rows.len(), 2, "{rows:#?}");
    assert_eq!(rows[1].status, "paused");
    assert_eq!(
        rows[1].process_after.as_deref(),
        Some("2026-03-02T10:10:00.000Z")
    );
    assert!(f.series_with(&series, "pending").is_empty());

    f.db.resume_task(&series, f.now()).unwrap();
    f.sleep_until(at("2026-03-02T10:25:30Z")).await;
    let row = f.row(&rows[1].id);
    assert_eq!(due_of(&row), at("2026-03-02T10:25:00Z"));
    assert_ran_on_time(&row);
    assert_eq!(f.series_with(&series, "pending").len(), 1);
    f.stop().await;
}

/// Cancelling a running series lets the occurrence finish but inserts no successor; cancelling
/// a scheduled one removes its next run.
#[tokio::test(start_paused = true)]
async fn cancel_stops_a_series_even_while_an_occurrence_runs() {
    let mut f = Fixture::utc();
    f.virtual_clock(at("2026-03-02T10:00:00Z"));
    f.mock.script([MockStep::Echo {
        delay: Duration::from_secs(30),
    }]);
    let running = f.insert(task(
        "running one",
        Some(at("2026-03-02T10:05:00Z")),
        Some("*/5 * * * *"),
    ));
    let scheduled = f.insert(task(
        "scheduled one",
        Some(at("2026-03-02T10:07:00Z")),
        Some("*/7 * * * *"),
    ));
    f.start();

    f.sleep_until(at("2026-03-02T10:05:10Z")).await;
    assert_eq!(f.row(&running).status, "processing");
    let cancelled = f.db.cancel_task(&running).unwrap();
    assert_eq!((cancelled.removed, cancelled.stopped_running), (0, true));
    let cancelled = f.db.cancel_task(&scheduled).unwrap();
    assert_eq!((cancelled.removed, cancelled.stopped_running), (1, false));

    f.sleep_until(at("2026-03-02T10:40:00Z")).await;
    let row = f.row(&running);
    assert_eq!(row.status, "completed");
    assert_eq!(row.recurrence, None);
    assert_eq!(
        f.series(&running).len(),
        1,
        "a cancelled series got a successor"
    );
    assert!(f.series(&scheduled).is_empty());
    assert!(f.db.task_series().unwrap().is_empty());
    let prompts = f.prompt_texts();
    assert_eq!(prompts.len(), 1);
    assert!(prompts[0].contains("running one"));
    assert!(f.system_outs("task_series_stopped").is_empty());
    f.stop().await;
}

/// Updating a scheduled series moves its next run to the new cron; updating while an occurrence
/// runs reaches the successor.
#[tokio::test(start_paused = true)]
async fn update_moves_the_next_run_and_reaches_the_successor_of_a_running_occurrence() {
    let mut f = Fixture::utc();
    f.virtual_clock(at("2026-03-02T10:00:00Z"));
    let series = f.insert(task(
        "old prompt",
        Some(at("2026-03-02T10:05:00Z")),
        Some("*/5 * * * *"),
    ));
    f.mock.script([
        MockStep::Echo {
            delay: Duration::ZERO,
        },
        MockStep::Echo {
            delay: Duration::from_secs(30),
        },
    ]);
    f.start();

    f.sleep_until(at("2026-03-02T10:01:00Z")).await;
    let update = TaskUpdate {
        prompt: Some("new prompt".into()),
        recurrence: Some(Some("*/7 * * * *".into())),
        ..TaskUpdate::default()
    };
    let updated = f.db.update_task(&series, &update, f.now()).unwrap();
    assert_eq!(
        updated.row.process_after.as_deref(),
        Some("2026-03-02T10:07:00.000Z")
    );

    f.sleep_until(at("2026-03-02T10:06:00Z")).await;
    assert!(f.mock.prompts().is_empty(), "ran at the old time");
    f.sleep_until(at("2026-03-02T10:14:10Z")).await;
    let done = f.series_with(&series, "completed");
    assert_eq!(done.len(), 1);
    assert_eq!(due_of(&done[0]), at("2026-03-02T10:07:00Z"));
    assert_ran_on_time(&done[0]);
    // The 10:14 occurrence is running (the mock takes 30 s): change the prompt now.
    let running = f.series_with(&series, "processing");
    assert_eq!(running.len(), 1);
    assert_eq!(due_of(&running[0]), at("2026-03-02T10:14:00Z"));
    let update = TaskUpdate {
        prompt: Some("newest prompt".into()),
        ..TaskUpdate::default()
    };
    let updated = f.db.update_task(&series, &update, f.now()).unwrap();
    assert_eq!(updated.state, TaskState::Running);

    f.sleep_until(at("2026-03-02T10:21:10Z")).await;
    let prompts = f.prompt_texts();
    assert_eq!(prompts.len(), 3, "{prompts:?}");
    assert!(prompts[0].contains(">new prompt</task>"));
    assert!(
        prompts[1].contains(">new prompt</task>"),
        "the running prompt is not rewritten"
    );
    assert!(
        prompts[2].contains(">newest prompt</task>"),
        "{}",
        prompts[2]
    );
    assert_eq!(f.series_with(&series, "pending").len(), 1);
    f.stop().await;
}

// ----- no forks ---------------------------------------------------------------------------------

/// The DB alone: a claim, a "crash" (`reset_processing`), a second run and its completion give
/// exactly one successor; completing the same row again (or twice in one call) adds none.
#[test]
fn a_crash_replay_or_a_double_completion_never_forks_the_series() {
    let f = Fixture::utc();
    let start = at("2026-03-02T10:05:00Z");
    let series = f.insert(task("tick", Some(start), Some("*/5 * * * *")));
    let ids = vec![series.clone()];

    assert_eq!(f.db.claim(&ids).unwrap().len(), 1);
    assert_eq!(f.db.reset_processing().unwrap(), ids);
    assert_eq!(f.row(&series).status, "pending");
    assert_eq!(f.db.claim(&ids).unwrap().len(), 1);
    f.db.complete_at(&ids, &[], start + millis(20)).unwrap();
    f.db.complete_at(&ids, &[], start + minutes(1)).unwrap();
    f.db.complete_at(&[series.clone(), series.clone()], &[], start + minutes(2))
        .unwrap();
    let row = f.row(&series);
    assert_eq!((row.status.as_str(), row.tries), ("completed", 2));
    let pending = f.series_with(&series, "pending");
    assert_eq!(pending.len(), 1, "{:#?}", f.series(&series));
    assert_eq!(
        pending[0].process_after.as_deref(),
        Some("2026-03-02T10:10:00.000Z")
    );
    assert_eq!(f.series(&series).len(), 2);

    // A successor that is pending already (inserted by a completion the caller did not see)
    // stops a second completion path from adding another.
    let next = pending[0].id.clone();
    f.db.claim(std::slice::from_ref(&next)).unwrap();
    f.db.complete_at(std::slice::from_ref(&next), &[], at("2026-03-02T10:10:00Z"))
        .unwrap();
    let mut stray = task(
        "tick",
        Some(at("2026-03-02T10:20:00Z")),
        Some("*/5 * * * *"),
    );
    stray.series_is_self = false;
    stray.series_id = Some(series.clone());
    f.insert(stray);
    assert_eq!(
        f.series_with(&series, "pending").len(),
        2,
        "set-up: a stray second row"
    );
    let pending = f.series_with(&series, "pending");
    f.db.claim(std::slice::from_ref(&pending[0].id)).unwrap();
    f.db.complete_at(
        std::slice::from_ref(&pending[0].id),
        &[],
        at("2026-03-02T10:15:00Z"),
    )
    .unwrap();
    assert_eq!(
        f.series_with(&series, "pending").len(),
        1,
        "completing one of two pending rows must not add a third"
    );
}

/// Through the runner: it is stopped while the agent works on an occurrence (the row stays
/// `processing`, as after a crash); the next runner resets it, runs it again and completes it,
/// and the series has exactly one next occurrence.
#[tokio::test(start_paused = true)]
async fn a_runner_crash_mid_occurrence_reruns_it_once_without_forking() {
    let mut f = Fixture::utc();
    f.virtual_clock(at("2026-03-02T10:00:00Z"));
    f.mock.script([MockStep::Echo {
        delay: Duration::from_secs(60),
    }]);
    let series = f.insert(task(
        "tick",
        Some(at("2026-03-02T10:05:00Z")),
        Some("*/5 * * * *"),
    ));
    f.start();
    f.sleep_until(at("2026-03-02T10:05:10Z")).await;
    assert_eq!(f.row(&series).status, "processing");
    f.stop().await;
    assert_eq!(
        f.row(&series).status,
        "processing",
        "a stopped runner left the row claimed"
    );
    assert!(f.series_with(&series, "pending").is_empty());

    f.start();
    f.sleep_until(at("2026-03-02T10:06:00Z")).await;
    let row = f.row(&series);
    assert_eq!((row.status.as_str(), row.tries), ("completed", 2));
    assert_eq!(row.recurrence, None);
    let pending = f.series_with(&series, "pending");
    assert_eq!(pending.len(), 1, "{:#?}", f.series(&series));
    assert_eq!(
        pending[0].process_after.as_deref(),
        Some("2026-03-02T10:10:00.000Z")
    );
    assert_eq!(f.series(&series).len(), 2);
    assert_eq!(
        f.mock.prompts().len(),
        2,
        "the interrupted occurrence ran again"
    );
    f.stop().await;
}

// ----- invalid cron -----------------------------------------------------------------------------

/// A row written with a bad cron (by an older tool, or by hand) runs once, then its series
/// stops with a `task_series_stopped` system row saying why; also when a script skips the run.
#[tokio::test]
async fn an_invalid_cron_stops_the_series_with_a_system_row() {
    let mut f = Fixture::utc();
    let bad = f.insert(task("bad cron", None, Some("61 * * * *")));
    let never = f.insert(scripted(
        "never fires",
        Some(r#"echo '{"wakeAgent": false}'"#),
        None,
        Some("0 9 30 2 *"),
    ));
    f.start();
    f.wait_completed(&bad).await;
    f.wait_completed(&never).await;
    f.wait_for("two stop rows", |f| {
        f.system_outs("task_series_stopped").len() == 2
    })
    .await;
    let stopped = f.system_outs("task_series_stopped");
    let reason_of = |id: &str| {
        stopped
            .iter()
            .find(|c| c["payload"]["taskId"] == id)
            .unwrap_or_else(|| panic!("no stop row for {id}: {stopped:?}"))["payload"]["reason"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let reason = reason_of(&bad);
    assert!(reason.contains("61 * * * *"), "{reason}");
    let reason = reason_of(&never);
    assert!(reason.contains("0 9 30 2 *"), "{reason}");
    for id in [&bad, &never] {
        assert_eq!(f.series(id).len(), 1, "a stopped series got a successor");
        assert_eq!(f.row(id).recurrence, None);
    }
    let out = f
        .outs()
        .into_iter()
        .find(|o| o.kind == "system" && o.in_reply_to.as_deref() == Some(bad.as_str()))
        .unwrap();
    assert_eq!(out.routing, routing());
    let prompts = f.prompt_texts();
    assert_eq!(prompts.len(), 1);
    assert!(prompts[0].contains("bad cron"));
    assert!(f.db.task_series().unwrap().is_empty());
    f.stop().await;
}

/// The query behind the runner's timer: the earliest due time after the poll, ignoring rows
/// already due (or without a time), whatever form the stored time has.
#[test]
fn next_due_after_skips_rows_already_due_and_reads_any_time_form() {
    let f = Fixture::utc();
    let now = at("2026-03-02T10:00:00Z");
    assert_eq!(f.db.next_due_after(now).unwrap(), None);
    let mut quiet = chat("context");
    quiet.trigger = false;
    f.insert(quiet);
    f.insert(task("past", Some(now - minutes(3)), None));
    let mut garbage = task("garbage time", None, None);
    garbage.process_after = Some("soon-ish".into());
    f.insert(garbage);
    assert_eq!(f.db.next_due_after(now).unwrap(), None);
    f.insert(task("later", Some(now + minutes(30)), None));
    let mut offset = task("offset form", None, None);
    offset.process_after = Some("2026-03-02T11:10:00.250+01:00".into());
    f.insert(offset);
    assert_eq!(
        f.db.next_due_after(now).unwrap(),
        Some(at("2026-03-02T10:10:00.250Z"))
    );
    assert_eq!(
        f.db.next_due_after(at("2026-03-02T10:10:00.250Z")).unwrap(),
        Some(now + minutes(30))
    );
}
