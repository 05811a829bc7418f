//! Scenarios of usage and budgets (issue 14), shared by every CLI: the fake model scripts each
//! reply's usage in its API's own shape ([`StepUsage`]), the real CLI reports it, the runner
//! records one `turn_usage` row per turn, read back through the `schema` crate's ledger queries.
//! Re-exported by [`crate::scenarios`] so that `scenario_tests!` finds them.
//!
//! What each CLI reports of a reply's figures (what the assertions expect, per provider):
//! Claude reports Anthropic's four token figures, computes a cost, and counts thinking tokens
//! itself (0: the fake model sends no thinking blocks; the Messages API's usage has no such
//! figure, so the scripted `reasoning` does not reach it); Codex and OpenCode report input, output, cache reads and reasoning,
//! a cache write of 0 (the OpenAI APIs have no such figure; both CLIs say 0), and no cost
//! (Codex never computes one; OpenCode's is 0 without prices in its model config, which the
//! provider records as unknown).

use std::time::{Duration, Instant};

use schema::{UsageGroup, UsageTotals};
use serde_json::{json, Value};

use crate::fake_model::{FakeModel, Step, StepUsage, SAMPLE_USAGE};
use crate::harness::{chat_outs, system_actions, text_of, Session};
use crate::support::{ok, some, WAIT};

/// The usage scenarios every CLI runs alike, declared once: `usage_scenario_tests! { CLI }` in
/// each `tests/tests/e2e_<cli>.rs`.
#[macro_export]
macro_rules! usage_scenario_tests {
    ($cli:expr) => {
        // Issue 14: usage and budgets (scenarios in tests/src/usage_scenarios.rs).
        $crate::scenario_tests! { $cli;
            /// The usage scripted on the fake model's reply lands exactly in `turn_usage`; a
            /// figure the CLI does not report is NULL.
            scripted_usage_lands_exactly_in_the_ledger();

            /// A tool call, then the text: one ledger row with the sum of both steps, requests 2.
            multi_step_turn_records_the_sum_once();

            /// A budget reached by the first two messages holds the third `pending` with one
            /// `budget_exceeded` row; raising the limit in config.json serves it, no restart.
            budget_holds_the_third_message_until_the_limit_is_raised();

            /// SIGKILL between the model's answer and the runner's write: no ledger row; the
            /// next run answers once, with one ledger row.
            crash_between_the_answer_and_the_write_reruns_the_turn_once();
        }
    };
}

/// The ledger figures one turn that reported `u` must have for `provider` (module docs).
#[derive(Debug, PartialEq)]
struct LedgerFigures {
    input: Option<u64>,
    output: Option<u64>,
    cache_read: Option<u64>,
    cache_write: Option<u64>,
    reasoning: Option<u64>,
    /// Whether the CLI computes a cost.
    cost_known: bool,
    requests: Option<u64>,
}

fn expected(provider: &str, u: StepUsage, requests: u64) -> LedgerFigures {
    let anthropic = match provider {
        "claude" => true,
        "codex" | "opencode" => false,
        other => panic!("no usage shape known for provider {other}: add it to expected"),
    };
    LedgerFigures {
        input: Some(u.input),
        output: Some(u.output),
        cache_read: Some(u.cache_read),
        cache_write: Some(if anthropic { u.cache_write } else { 0 }),
        reasoning: Some(if anthropic { 0 } else { u.reasoning }),
        cost_known: anthropic,
        requests: Some(requests),
    }
}

fn figures_of(totals: &UsageTotals) -> LedgerFigures {
    LedgerFigures {
        input: totals.input_tokens.sum,
        output: totals.output_tokens.sum,
        cache_read: totals.cache_read_tokens.sum,
        cache_write: totals.cache_write_tokens.sum,
        reasoning: totals.reasoning_tokens.sum,
        cost_known: totals.cost_usd.sum.is_some(),
        requests: totals.requests.sum,
    }
}

/// Adds two replies' figures (what a two-step turn reports).
fn sum(a: StepUsage, b: StepUsage) -> StepUsage {
    StepUsage {
        input: a.input + b.input,
        output: a.output + b.output,
        cache_read: a.cache_read + b.cache_read,
        cache_write: a.cache_write + b.cache_write,
        reasoning: a.reasoning + b.reasoning,
    }
}

fn ledger(session: &Session) -> UsageTotals {
    ok(session.db.usage_total(), "reading the ledger")
}

/// The ledger's one turn: its totals are that row's figures (every figure reported once or
/// NULL), recorded by `provider` for the model `fake-model`, answered.
fn one_turn(session: &Session, provider: &str) -> UsageTotals {
    let totals = ledger(session);
    assert_eq!(totals.turns, 1, "one ledger row: {totals:#?}");
    assert_eq!((totals.errors, totals.aborted), (0, 0), "{totals:#?}");
    let keys = |group| -> Vec<Option<String>> {
        ok(session.db.usage_by(group, None), "a breakdown")
            .into_iter()
            .map(|row| row.key)
            .collect()
    };
    assert_eq!(keys(UsageGroup::Provider), [Some(provider.to_owned())]);
    assert_eq!(
        keys(UsageGroup::Model),
        [Some("fake-model".to_owned())],
        "the model that answered"
    );
    totals
}

/// The scripted numbers land exactly in `turn_usage`: one turn, one reply whose usage is
/// scripted; a figure the CLI does not report (Codex's and OpenCode's cost) is NULL, never 0.
pub fn scripted_usage_lands_exactly_in_the_ledger(provider: &str) {
    let model = ok(
        FakeModel::start_with_script([Step::text("Counted.").usage(SAMPLE_USAGE)]),
        "starting the fake model",
    );
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let id = session.send_chat("count this").id;
    session.wait_completed(&id, WAIT);
    let totals = one_turn(&session, provider);
    assert_eq!(
        figures_of(&totals),
        expected(provider, SAMPLE_USAGE, 1),
        "{totals:#?}"
    );
    assert_eq!(totals.cost_usd.unreported, u64::from(provider != "claude"));
    if let Some(cost) = totals.cost_usd.sum {
        assert!(cost > 0.0, "Claude's cost of the turn: {cost}");
    }
    assert!(totals.duration_ms.sum.is_some(), "{totals:#?}");
    session.stop_runner();
}

/// A turn of two model requests (a tool call, then the text) records the sum of both once: one
/// row, `requests` 2.
pub fn multi_step_turn_records_the_sum_once(provider: &str) {
    let tool_step = StepUsage {
        input: 1000,
        output: 40,
        cache_read: 200,
        cache_write: 30,
        reasoning: 10,
    };
    let text_step = StepUsage {
        input: 1100,
        output: 60,
        cache_read: 250,
        cache_write: 7,
        reasoning: 5,
    };
    let model = ok(
        FakeModel::start_with_script([
            Step::tool_call("send_message", json!({"text": "Working on it."})).usage(tool_step),
            Step::text("Done.").usage(text_step),
        ]),
        "starting the fake model",
    );
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let id = session.send_chat("two steps please").id;
    session.wait_completed(&id, WAIT);
    assert_eq!(
        model.model_requests().len(),
        2,
        "a tool call, then the text"
    );
    let totals = one_turn(&session, provider);
    assert_eq!(
        figures_of(&totals),
        expected(provider, sum(tool_step, text_step), 2),
        "{totals:#?}"
    );
    session.stop_runner();
}

/// Budget end to end: a limit that the first message's turn stays under and the first two
/// reach; the first two are answered, the third stays `pending` with exactly one
/// `budget_exceeded` row, and raising the limit in config.json serves it without a restart.
///
/// The limit is on cost where the CLI computes one (Claude: `maxCostUsdPerSession`), else on
/// tokens (`maxTokensPerDay`). The first turn is tiny and the second large (×5000), so the
/// limit falls between them whatever prices the CLI applies to the fake model.
pub fn budget_holds_the_third_message_until_the_limit_is_raised(provider: &str) {
    let small = StepUsage {
        input: 10,
        output: 1,
        ..StepUsage::default()
    };
    let large = StepUsage {
        input: 50_000,
        output: 5_000,
        ..StepUsage::default()
    };
    let model = ok(
        FakeModel::start_with_script([
            Step::text("First answer.").usage(small),
            Step::text("Second answer.").usage(large),
            Step::text("Third answer.").usage(small),
        ]),
        "starting the fake model",
    );
    let by_cost = provider == "claude";
    let (key, limit, raised) = if by_cost {
        ("maxCostUsdPerSession", json!(0.01), json!(1000.0))
    } else {
        ("maxTokensPerDay", json!(1_000), json!(1_000_000_000u64))
    };
    let mut session = Session::new();
    session.write_config(&json!({ key: limit }));
    session.start_runner(provider, &model, &[]);
    for text in ["first", "second"] {
        let id = session.send_chat(text).id;
        session.wait_completed(&id, WAIT);
    }
    let spent = ledger(&session);
    assert_eq!(spent.turns, 2, "{spent:#?}");
    if !by_cost {
        assert_eq!(spent.tokens.sum, Some(11 + 55_000), "{spent:#?}");
    }
    let third = session.send_chat("third").id;
    session.wait_until("a budget_exceeded row", WAIT, |s| {
        !system_actions(s, "budget_exceeded").is_empty()
    });
    // The runner keeps polling while the limit holds: nothing more is written, the row waits.
    std::thread::sleep(Duration::from_secs(3));
    let notices = system_actions(&session, "budget_exceeded");
    assert_eq!(notices.len(), 1, "{notices:#?}");
    let payload = &notices[0]["payload"];
    assert_eq!(payload["limit"], key, "{payload}");
    assert_eq!(payload["max"], limit, "{payload}");
    if by_cost {
        assert_eq!(payload["window"], "session", "{payload}");
        assert_eq!(payload["resetsAt"], Value::Null, "{payload}");
        let cost = some(spent.cost_usd.sum, "the cost of two turns");
        let reported = some(payload["spent"].as_f64(), "spent as a number");
        assert!((reported - cost).abs() < 1e-9, "{payload} vs {cost}");
    } else {
        assert_eq!(payload["window"], "day", "{payload}");
        assert_eq!(payload["spent"], 11 + 55_000, "{payload}");
        assert!(payload["resetsAt"].is_string(), "{payload}");
    }
    assert_eq!(session.row(&third).status, "pending");
    assert_eq!(model.model_requests().len(), 2, "no query for the third");
    assert_eq!(chat_outs(&session).len(), 2);

    let runner = session.runner_pid();
    session.write_config(&json!({ key: raised }));
    let reply = session.wait_reply(&third, WAIT);
    assert_eq!(text_of(&reply), "Third answer.");
    assert_eq!(session.runner_pid(), runner, "no restart");
    assert_eq!(system_actions(&session, "budget_exceeded").len(), 1);
    assert_eq!(ledger(&session).turns, 3);
    session.stop_runner();
}

/// A crash between the model's answer and the runner's write: the test holds the DB's write
/// lock (another writer, as a host's long transaction would) from the moment the model request
/// arrives, so the runner gets the answer but blocks on writing the reply, the completion and
/// the ledger row; it is SIGKILLed there. Nothing of the turn is recorded, and the next run
/// runs the turn again once: the reply and the ledger row exist exactly once.
pub fn crash_between_the_answer_and_the_write_reruns_the_turn_once(provider: &str) {
    let answer = || Step::text("Answered once.").usage(SAMPLE_USAGE);
    let model = ok(
        FakeModel::start_with_script([answer().stalled(500), answer()]),
        "starting the fake model",
    );
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let id = session.send_chat("answer me once").id;
    ok(model.wait_for_model_requests(1, WAIT), "the model request");
    let lock = ok(session.db.dedicated_connection(), "a connection of our own");
    ok(
        lock.execute_batch("BEGIN IMMEDIATE"),
        "taking the write lock",
    );
    // The answer comes 0.5 s after the request; the CLI ends its turn and the runner goes to
    // write. Once the answer is sent whole, give them ample time to get there (a loaded 2-core
    // machine).
    let held = Instant::now();
    let deadline = held + WAIT;
    while !model
        .model_requests()
        .iter()
        .any(|request| request.sent_whole)
    {
        assert!(
            Instant::now() < deadline,
            "the model's answer was never sent"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(3));
    assert!(session.runner_pid().is_some());
    session.kill_runner();
    ok(lock.execute_batch("ROLLBACK"), "releasing the write lock");
    drop(lock);
    eprintln!(
        "the runner was killed {:.1?} after the lock",
        held.elapsed()
    );
    assert_eq!(ledger(&session).turns, 0, "no ledger row of the lost turn");
    assert!(chat_outs(&session).is_empty(), "no reply of the lost turn");
    assert_ne!(session.row(&id).status, "completed");

    session.start_runner(provider, &model, &[]);
    session.wait_completed(&id, WAIT);
    let replies = chat_outs(&session);
    assert_eq!(replies.len(), 1, "{replies:#?}");
    assert_eq!(text_of(&replies[0]), "Answered once.");
    let totals = one_turn(&session, provider);
    assert_eq!(
        figures_of(&totals),
        expected(provider, SAMPLE_USAGE, 1),
        "{totals:#?}"
    );
    let asked = model
        .model_requests()
        .iter()
        .filter(|r| r.user_texts().iter().any(|t| t.contains("answer me once")))
        .count();
    assert_eq!(asked, 2, "the turn ran again once");
    session.stop_runner();
}
