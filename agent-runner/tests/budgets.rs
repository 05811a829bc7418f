//! The usage ledger and the spending limits (issue 14), in-process against a real session DB
//! and the mock provider with scripted usage: one `turn_usage` row per ended turn with the
//! exact figures, in the transaction of the turn's writes; limits that hold the queue (rows
//! `pending`, one `budget_exceeded` row per window) until the window ends or the limit is
//! raised in config.json.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_runner::budget::{BudgetLimits, BudgetOptions};
use agent_runner::config::{Config, Inputs};
use agent_runner::runner::{Clock, RunnerOptions};
use chrono::{DateTime, Utc};
use provider::mock::{MockProvider, MockStep};
use provider::MockSettings;
use provider::{ErrorClass, Usage};
use schema::{MessageOut, NewMessageIn};
use serde_json::{json, Value};

use crate::common;

use common::Fixture;

/// The loop tests' fixture (tests/common) polling faster, without query retries.
fn session() -> Fixture {
    let mut s = Fixture::new();
    s.options.idle_poll = Duration::from_millis(100);
    s.options.query_retries = 0;
    s
}

impl Fixture {
    fn status(&self, id: &str) -> String {
        self.db.message_in(id).unwrap().unwrap().status
    }

    fn replies_to(&self, id: &str) -> Vec<MessageOut> {
        self.db
            .all_messages_out()
            .unwrap()
            .into_iter()
            .filter(|row| row.kind == "chat" && row.in_reply_to.as_deref() == Some(id))
            .collect()
    }

    /// Every `turn_usage` row, oldest first, as JSON (read-only SQL: the test looks at the
    /// table as the host would).
    fn ledger(&self) -> Vec<Value> {
        let conn = rusqlite::Connection::open(self.dir.path().join("session.db")).unwrap();
        let mut stmt = conn
            .prepare(
                "SELECT provider, model, input_tokens, output_tokens, cache_read_tokens,
                        cache_write_tokens, reasoning_tokens, cost_usd, requests, duration_ms,
                        outcome, message_ids, series_id, created_at
                 FROM turn_usage ORDER BY id",
            )
            .unwrap();
        stmt.query_map([], |row| {
            let ids: String = row.get(11)?;
            Ok(json!({
                "provider": row.get::<_, String>(0)?,
                "model": row.get::<_, Option<String>>(1)?,
                "input": row.get::<_, Option<i64>>(2)?,
                "output": row.get::<_, Option<i64>>(3)?,
                "cacheRead": row.get::<_, Option<i64>>(4)?,
                "cacheWrite": row.get::<_, Option<i64>>(5)?,
                "reasoning": row.get::<_, Option<i64>>(6)?,
                "cost": row.get::<_, Option<f64>>(7)?,
                "requests": row.get::<_, Option<i64>>(8)?,
                "durationMs": row.get::<_, Option<i64>>(9)?,
                "outcome": row.get::<_, String>(10)?,
                "messageIds": serde_json::from_str::<Value>(&ids).unwrap(),
                "seriesId": row.get::<_, Option<String>>(12)?,
                "createdAt": row.get::<_, String>(13)?,
            }))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    }

    /// Sends two messages, each answered, then a third that a limit reached by them holds
    /// (its `budget_exceeded` row written); returns the third's id.
    async fn two_answered_then_one_held(&self) -> String {
        for text in ["one", "two"] {
            let id = self.chat(text);
            self.wait_for("an answer", |s| s.status(&id) == "completed")
                .await;
        }
        let held = self.chat("three");
        self.wait_for("the budget row", |s| {
            !s.system_outs("budget_exceeded").is_empty()
        })
        .await;
        self.stays_pending(&held).await;
        held
    }

    /// Waits long enough for a runner that would serve `id` to have served it (several idle
    /// polls), then checks it did not.
    async fn stays_pending(&self, id: &str) {
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(self.status(id), "pending", "a held row stays pending");
    }
}

fn cost(usd: f64) -> Option<Usage> {
    Some(Usage {
        input_tokens: Some(40),
        output_tokens: Some(20),
        cost_usd: Some(usd),
        ..Usage::default()
    })
}

/// `Config::load` of a workspace whose config.json is `file` (the runner's own loader, so a
/// raised limit is read as the binary reads it).
fn config_with(dir: &Path, file: Value) -> Config {
    std::fs::write(dir.join("config.json"), file.to_string()).unwrap();
    Config::load(&Inputs {
        workspace: dir.to_path_buf(),
        ..Inputs::default()
    })
    .unwrap()
}

#[tokio::test]
async fn every_answered_turn_is_one_ledger_row_with_the_exact_figures() {
    let mut s = session();
    s.mock.script_usage([
        Some(Usage {
            input_tokens: Some(1200),
            output_tokens: Some(345),
            cache_read_tokens: Some(800),
            cache_write_tokens: Some(64),
            reasoning_tokens: Some(17),
            cost_usd: Some(0.0123),
            model: Some("mock-large".into()),
            requests: Some(3),
        }),
        // A CLI that reported nothing: a row all the same, its figures NULL.
        None,
    ]);
    s.start();
    let first = s.chat("one");
    s.wait_for("the first answer", |s| s.status(&first) == "completed")
        .await;
    let mut task = NewMessageIn::new(
        "task",
        json!({"prompt": "report", "taskId": "t-1"}).to_string(),
    );
    task.series_id = Some("series-7".into());
    let second = s.db.insert_in(&task).unwrap().id;
    s.wait_for("the task's answer", |s| s.status(&second) == "completed")
        .await;
    s.stop().await;
    let mut ledger = s.ledger();
    for row in &mut ledger {
        assert!(row["durationMs"].as_i64().is_some(), "{row}");
        row.as_object_mut().unwrap().remove("durationMs");
        row.as_object_mut().unwrap().remove("createdAt");
    }
    assert_eq!(
        ledger,
        vec![
            json!({"provider": "mock", "model": "mock-large", "input": 1200, "output": 345,
                   "cacheRead": 800, "cacheWrite": 64, "reasoning": 17, "cost": 0.0123,
                   "requests": 3, "outcome": "result", "messageIds": [first],
                   "seriesId": null}),
            json!({"provider": "mock", "model": null, "input": null, "output": null,
                   "cacheRead": null, "cacheWrite": null, "reasoning": null, "cost": null,
                   "requests": null, "outcome": "result", "messageIds": [second],
                   "seriesId": "series-7"}),
        ]
    );
}

#[tokio::test]
async fn a_failed_turn_is_recorded_with_its_query_error() {
    let mut s = session();
    s.mock.script([MockStep::Fail {
        message: "model API 500".into(),
        retryable: false,
        classification: ErrorClass::Api,
    }]);
    s.mock.script_usage([cost(0.5)]);
    s.start();
    let id = s.chat("fails");
    s.wait_for("the query_error row", |s| {
        !s.system_outs("query_error").is_empty()
    })
    .await;
    s.stop().await;
    let ledger = s.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0]["outcome"], "error");
    assert_eq!(ledger[0]["messageIds"], json!([id]));
    assert_eq!(
        (&ledger[0]["input"], &ledger[0]["cost"]),
        (&json!(40), &json!(0.5))
    );
    assert_eq!(
        s.status(&id),
        "processing",
        "left for the host's sweep as before"
    );
}

/// Options with the limits of `config` and its reload, as `app` wires them.
fn with_budgets(options: &mut RunnerOptions, config: &Config) {
    options.budgets = BudgetOptions {
        limits: config.budget_limits(),
        reload: Some(config.budget_reload()),
    };
}

/// A mock whose every turn costs 0.125 USD (exact in binary) and 60 tokens.
fn priced_mock() -> MockProvider {
    MockProvider::from_settings(MockSettings {
        usage: cost(0.125),
        ..MockSettings::default()
    })
}

#[tokio::test]
async fn a_session_limit_holds_the_third_message_until_it_is_raised_in_config_json() {
    let mut s = session();
    s.mock = priced_mock();
    let config = config_with(s.dir.path(), json!({"maxCostUsdPerSession": 0.25}));
    s.start_with(|options| with_budgets(options, &config));
    let third = s.two_answered_then_one_held().await;
    let fourth = s.chat("four");
    s.stays_pending(&fourth).await;
    assert_eq!(
        s.system_outs("budget_exceeded"),
        vec![json!({"action": "budget_exceeded", "payload": {
            "limit": "maxCostUsdPerSession", "max": 0.25, "spent": 0.25,
            "window": "session", "resetsAt": null}})],
        "one row for the window, however many messages wait"
    );
    let notice =
        s.db.all_messages_out()
            .unwrap()
            .into_iter()
            .find(|row| row.kind == "system")
            .unwrap();
    assert_eq!(notice.in_reply_to.as_deref(), Some(third.as_str()));
    let waiting = s.db.runner_state().unwrap().unwrap().waiting().unwrap();
    assert_eq!(waiting.budget.as_deref(), Some("maxCostUsdPerSession"));
    assert_eq!(s.ledger().len(), 2);
    assert_eq!(
        s.mock.prompts().len(),
        2,
        "the held messages never reached the model"
    );

    // Raised in config.json while the runner runs: served without a restart.
    std::fs::write(
        s.dir.path().join("config.json"),
        json!({"maxCostUsdPerSession": 10.0}).to_string(),
    )
    .unwrap();
    s.wait_for("the held rows answered", |s| {
        s.status(&third) == "completed" && s.status(&fourth) == "completed"
    })
    .await;
    assert_eq!(s.system_outs("budget_exceeded").len(), 1);
    assert_eq!(
        s.db.runner_state().unwrap().unwrap().waiting_on,
        None,
        "no longer waiting on the budget"
    );
    s.stop().await;
}

#[tokio::test]
async fn the_window_is_announced_once_across_a_restart() {
    let mut s = session();
    s.mock = priced_mock();
    let config = config_with(s.dir.path(), json!({"maxCostUsdPerSession": 0.25}));
    s.start_with(|options| with_budgets(options, &config));
    let third = s.two_answered_then_one_held().await;
    s.stop().await;
    s.start_with(|options| with_budgets(options, &config));
    let fourth = s.chat("four");
    s.stays_pending(&fourth).await;
    assert_eq!(s.status(&third), "pending");
    s.stop().await;
    assert_eq!(s.system_outs("budget_exceeded").len(), 1);
}

/// A clock the test sets (milliseconds since the epoch).
fn settable_clock(start: DateTime<Utc>) -> (Clock, Arc<AtomicI64>) {
    let now = Arc::new(AtomicI64::new(start.timestamp_millis()));
    let read = now.clone();
    let clock: Clock = Arc::new(move || {
        DateTime::from_timestamp_millis(read.load(Ordering::SeqCst)).unwrap_or_default()
    });
    (clock, now)
}

#[tokio::test]
async fn a_day_limit_resets_at_local_midnight() {
    let mut s = session();
    s.mock = priced_mock();
    // 23:59 in Tokyo (UTC+9): the day ends at 15:00 UTC.
    let start = schema::time::parse_ts("2026-11-23T14:59:00Z").unwrap();
    let (clock, now) = settable_clock(start);
    s.start_with(|options| {
        options.clock = clock;
        options.timezone = chrono_tz::Asia::Tokyo;
        options.budgets = BudgetOptions {
            limits: BudgetLimits {
                max_tokens_per_day: Some(120),
                ..BudgetLimits::default()
            },
            reload: None,
        };
    });
    let third = s.two_answered_then_one_held().await;
    assert_eq!(
        s.system_outs("budget_exceeded")[0]["payload"],
        json!({"limit": "maxTokensPerDay", "max": 120, "spent": 120, "window": "day",
               "resetsAt": "2026-11-23T15:00:00.000Z"})
    );
    now.store(
        schema::time::parse_ts("2026-11-23T15:00:01Z")
            .unwrap()
            .timestamp_millis(),
        Ordering::SeqCst,
    );
    s.wait_for("the next day's answer", |s| s.status(&third) == "completed")
        .await;
    s.stop().await;
    let ledger = s.ledger();
    assert_eq!(ledger.len(), 3);
    assert_eq!(ledger[2]["createdAt"], "2026-11-23T15:00:01.000Z");
}

#[tokio::test]
async fn a_crash_between_the_result_and_its_write_leaves_no_row_and_the_turn_runs_once_more() {
    let mut s = session();
    s.mock = priced_mock();
    // The fault: the ledger insert fails inside the result's transaction, as a crash before
    // its commit would leave it (the runner stops with the error).
    let conn = rusqlite::Connection::open(s.dir.path().join("session.db")).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER crash BEFORE INSERT ON turn_usage BEGIN SELECT RAISE(ABORT, 'crash'); END",
    )
    .unwrap();
    s.start();
    let id = s.chat("once");
    let err = s.finished().await.unwrap_err();
    assert!(format!("{err:#}").contains("crash"), "{err:#}");
    assert!(
        s.replies_to(&id).is_empty(),
        "the reply went with the ledger row"
    );
    assert!(s.ledger().is_empty());
    assert_eq!(s.status(&id), "processing");
    conn.execute_batch("DROP TRIGGER crash").unwrap();
    s.start();
    s.wait_for("the answer after restart", |s| s.status(&id) == "completed")
        .await;
    s.stop().await;
    assert_eq!(s.replies_to(&id).len(), 1);
    let ledger = s.ledger();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["messageIds"], json!([id]));
    assert_eq!(s.mock.prompts().len(), 2, "run once more, not twice");
}

#[tokio::test]
async fn a_running_turn_finishes_but_takes_no_push_once_the_limit_is_reached() {
    let mut s = session();
    s.mock = MockProvider::from_settings(MockSettings {
        delay: Duration::from_millis(400),
        usage: cost(0.25),
        ..MockSettings::default()
    });
    let config = config_with(s.dir.path(), json!({"maxCostUsdPerSession": 0.25}));
    s.start_with(|options| with_budgets(options, &config));
    let first = s.chat("one");
    s.wait_for("the first prompt", |s| s.mock.prompts().len() == 1)
        .await;
    // Pushed while nothing is spent yet.
    let second = s.chat("two");
    s.wait_for("the push", |s| s.mock.prompts().len() == 2)
        .await;
    s.wait_for("the first answer", |s| s.status(&first) == "completed")
        .await;
    // The first result spent the limit; the turn still runs for the push.
    let third = s.chat("three");
    s.wait_for("the second answer", |s| s.status(&second) == "completed")
        .await;
    s.wait_for("the budget row", |s| {
        !s.system_outs("budget_exceeded").is_empty()
    })
    .await;
    s.stays_pending(&third).await;
    assert_eq!(
        s.mock.prompts().len(),
        2,
        "the third message was never pushed"
    );
    s.stop().await;
}

#[tokio::test]
async fn a_stopped_turn_is_recorded_as_aborted_with_what_it_reported() {
    let mut s = session();
    s.mock = MockProvider::with_delay(Duration::from_secs(30));
    s.mock.script_usage([Some(Usage {
        input_tokens: Some(90),
        ..Usage::default()
    })]);
    s.start();
    // A task's turn: the stopped turn's row names its series too.
    let mut task = NewMessageIn::new(
        "task",
        json!({"prompt": "runaway", "taskId": "t-9"}).to_string(),
    );
    task.series_id = Some("series-9".into());
    let id = s.db.insert_in(&task).unwrap().id;
    s.wait_for("the prompt", |s| s.mock.prompts().len() == 1)
        .await;
    let mut interrupt = NewMessageIn::new("system", json!({"action": "interrupt"}).to_string());
    interrupt.trigger = true;
    s.db.insert_in(&interrupt).unwrap();
    s.wait_for("the stopped turn", |s| s.status(&id) == "completed")
        .await;
    s.stop().await;
    let ledger = s.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0]["outcome"], "aborted");
    assert_eq!(ledger[0]["input"], 90);
    assert_eq!(ledger[0]["messageIds"], json!([id]));
    assert_eq!(ledger[0]["seriesId"], "series-9");
}

#[tokio::test]
async fn a_failed_turn_that_spent_the_limit_is_not_run_again() {
    let mut s = session();
    s.mock.script([MockStep::Fail {
        message: "overloaded".into(),
        retryable: true,
        classification: ErrorClass::Api,
    }]);
    s.mock.script_usage([cost(0.25)]);
    let config = config_with(s.dir.path(), json!({"maxCostUsdPerSession": 0.25}));
    s.start_with(|options| {
        with_budgets(options, &config);
        options.query_retries = 1;
    });
    let id = s.chat("expensive");
    s.wait_for("the budget row", |s| {
        !s.system_outs("budget_exceeded").is_empty()
    })
    .await;
    s.stays_pending(&id).await;
    s.stop().await;
    assert_eq!(s.mock.prompts().len(), 1, "no retry past the limit");
    assert_eq!(s.ledger().len(), 1);
}
