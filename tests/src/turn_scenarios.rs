//! Scenarios of turn control (issue 15), shared by every CLI: `/stop` while the model stalls
//! (the CLI and its session survive), a message pushed and then stopped (answered next),
//! `<message to>` blocks delivered before the tool call that follows them, progress rows, and
//! `/model` switching the model of the next request (an unknown one refused, the session keeping
//! its model). Re-exported by [`crate::scenarios`] so that `scenario_tests!` finds them.

use std::time::{Duration, Instant};

use schema::Destination;
use serde_json::{json, Value};

use crate::fake_model::{FakeModel, Step};
use crate::harness::{chat_outs, system_actions, text_of, Session, FAKE_MODEL};
use crate::secrets::shell_step;
use crate::support::{cli_pids, ok, some, WAIT};

/// The turn-control scenarios every CLI runs alike, declared once: `turn_scenario_tests! { CLI }`
/// in each `tests/tests/e2e_<cli>.rs`.
#[macro_export]
macro_rules! turn_scenario_tests {
    ($cli:expr) => {
        // Issue 15: turn control (scenarios in tests/src/turn_scenarios.rs).
        $crate::scenario_tests! { $cli;
            /// `/stop` while the model stalls: `Stopped.` within 2 s, the CLI process survives,
            /// the next message is answered with the earlier history.
            stop_during_a_stalled_turn_replies_stopped_within_2s();

            /// `nanoclaw interrupt` during a turn: `Stopped.` to the turn's row within 2 s, the
            /// host's row completed without a reply.
            nanoclaw_interrupt_stops_the_turn_within_2s();

            /// `/stop` while ask_user_question waits: `Stopped.` within 2 s, the question
            /// withdrawn (no longer open), the next message answered.
            stop_while_a_question_waits_withdraws_it();

            /// A message pushed mid-turn, then `/stop`: the pushed message is answered next.
            a_message_pushed_then_stopped_is_answered_next();

            /// A message pushed while a tool runs, then `/stop` once the model's request carries
            /// it: the pushed message is answered next (issue 46).
            a_message_pushed_during_a_tool_then_stopped_is_answered_next();

            /// A `<message to="ops">` block, then a 5 s tool call, then a final line: the ops row
            /// exists before the tool ends; nothing twice.
            message_block_is_delivered_before_the_tool_ends();

            /// `progress: tools`: rows naming `Bash` and the command, at most one per interval.
            progress_rows_name_the_shell_command();

            /// `/model` switches the next request's model; an unknown one is refused and the
            /// session keeps its model.
            model_command_switches_the_next_request();
        }
    };
}

/// The bound the issue sets on `/stop`.
const STOP_BOUND: Duration = Duration::from_secs(2);

fn fake_model(steps: impl IntoIterator<Item = Step>) -> FakeModel {
    ok(
        FakeModel::start_with_script(steps),
        "starting the fake model",
    )
}

/// The chat texts written so far, in order.
fn chat_texts(session: &Session) -> Vec<String> {
    chat_outs(session).iter().map(text_of).collect()
}

/// `/stop` during a turn where the model stalls: `Stopped.` within 2 s, the CLI process lives
/// on, and the next message is answered with the earlier history in its request (same session).
pub fn stop_during_a_stalled_turn_replies_stopped_within_2s(provider: &str) {
    let model = fake_model([
        Step::hang().timeout_ms(120_000),
        Step::text("The word was MANGO."),
    ]);
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let first = session.send_chat("Remember the word MANGO.").id;
    ok(model.wait_for_model_requests(1, WAIT), "the first request");
    let pids = cli_pids(&session, provider);
    let asked = Instant::now();
    let stop = session.send_chat("/stop").id;
    session.wait_completed(&first, WAIT);
    let took = asked.elapsed();
    eprintln!("/stop during the {provider} turn: stopped after {took:.2?}");
    assert!(
        took <= STOP_BOUND,
        "/stop took {took:.2?}\n{}",
        session.runner_log()
    );
    session.wait_completed(&stop, WAIT);
    assert_eq!(chat_texts(&session), vec!["Stopped."]);
    model.release_hangs();
    let next = session.send_chat("What was the word?").id;
    let reply = session.wait_reply(&next, WAIT);
    assert_eq!(text_of(&reply), "The word was MANGO.");
    let request = some(model.model_requests().pop(), "the next request");
    let texts = request.user_texts().join("\n");
    assert!(
        texts.contains("MANGO") && texts.contains("What was the word?"),
        "the next request lost the history: {texts}"
    );
    assert_eq!(
        cli_pids(&session, provider),
        pids,
        "the CLI process did not survive the stop"
    );
    assert_eq!(
        chat_texts(&session),
        vec!["Stopped.", "The word was MANGO."]
    );
    session.stop_runner();
}

/// `nanoclaw interrupt` during a turn where the model stalls: the turn's row gets `Stopped.`
/// within 2 s; the interrupt row is completed without a reply of its own.
pub fn nanoclaw_interrupt_stops_the_turn_within_2s(provider: &str) {
    let model = fake_model([Step::hang().timeout_ms(120_000)]);
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let id = session.send_chat("a long turn").id;
    ok(model.wait_for_model_requests(1, WAIT), "the first request");
    let asked = Instant::now();
    let out = session.nanoclaw(&["interrupt"]);
    assert!(out.status.success(), "{out:?}");
    let reply = session.wait_reply(&id, WAIT);
    let took = asked.elapsed();
    eprintln!("nanoclaw interrupt during the {provider} turn: stopped after {took:.2?}");
    assert!(
        took <= STOP_BOUND,
        "took {took:.2?}\n{}",
        session.runner_log()
    );
    assert_eq!(text_of(&reply), "Stopped.");
    session.wait_until("the interrupt row completed", WAIT, |s| {
        ok(s.db.all_messages_in(), "reading messages_in")
            .iter()
            .all(|row| row.status == "completed")
    });
    assert_eq!(chat_texts(&session), vec!["Stopped."]);
    model.release_hangs();
    session.stop_runner();
}

/// `/stop` while `ask_user_question` waits for the user: the turn ends with `Stopped.` within
/// 2 s, the question is withdrawn (an answer now would be an ordinary message), and the next
/// message is answered.
pub fn stop_while_a_question_waits_withdraws_it(provider: &str) {
    let model = fake_model([Step::tool_call(
        "ask_user_question",
        json!({"question": "Deploy to production?", "options": ["Yes", "No"], "timeout": 600}),
    )]);
    model.set_default_text("Still here.");
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let id = session.send_chat("deploy it").id;
    let question = session.wait_question(WAIT);
    let question_id = some(question["questionId"].as_str(), "a question id").to_owned();
    let asked = Instant::now();
    let stop = session.send_chat("/stop").id;
    let reply = session.wait_reply(&id, WAIT);
    let took = asked.elapsed();
    eprintln!("/stop during the {provider} question: stopped after {took:.2?}");
    assert!(
        took <= STOP_BOUND,
        "took {took:.2?}\n{}",
        session.runner_log()
    );
    assert_eq!(text_of(&reply), "Stopped.");
    session.wait_completed(&stop, WAIT);
    assert!(
        !ok(
            session.db.question_open(&question_id),
            "reading the question"
        ),
        "the question still waits"
    );
    session.wait_until("the runner idle", WAIT, |s| {
        ok(s.db.runner_state(), "reading the runner state").is_some_and(|r| r.status == "idle")
    });
    let next = session.send_chat("anything else?").id;
    let reply = session.wait_reply(&next, WAIT);
    assert_eq!(text_of(&reply), "Still here.");
    session.stop_runner();
}

/// A message pushed mid-turn and then `/stop`: the stopped turn's row gets `Stopped.`, the pushed
/// message is answered in the next turn. Where the CLI restarts the model's request to fold the
/// push in (OpenCode's abort-and-restart, Codex's restarted turn), the stop comes once the model
/// works on the request that carries it: a message the model saw but never answered is not lost
/// (issue 46). Claude queues a message pushed while the model writes, unseen until the turn ends.
pub fn a_message_pushed_then_stopped_is_answered_next(provider: &str) {
    // Stalls for every request before the stop: the first, the restarted one that carries the
    // push, and one more should a CLI retry. The script is emptied once the stop is done, so the
    // next turn's request is answered whether or not it came before.
    let model = fake_model([
        Step::hang().timeout_ms(120_000),
        Step::hang().timeout_ms(120_000),
        Step::hang().timeout_ms(120_000),
    ]);
    model.set_default_text("Answering the second.");
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let first = session.send_chat("first, slow").id;
    ok(model.wait_for_model_requests(1, WAIT), "the first request");
    let second = session.send_chat("second, pushed").id;
    session.wait_until("the push", WAIT, |s| s.row(&second).status == "processing");
    if provider != "claude" {
        wait_for_the_push(&model, "second, pushed");
    }
    stop_and_expect_the_push_answered(&session, &model, &first, &second);
    session.stop_runner();
}

/// A message pushed while a tool runs and then `/stop` once the model works on the request that
/// carries it (every CLI folds such a push into the running turn): the stopped turn's row gets
/// `Stopped.`, the pushed message, seen by the model but never answered, starts the next turn
/// (issue 46).
pub fn a_message_pushed_during_a_tool_then_stopped_is_answered_next(provider: &str) {
    let model = fake_model([
        shell_step(provider, "sleep 3"),
        Step::hang().timeout_ms(120_000),
        Step::hang().timeout_ms(120_000),
        Step::hang().timeout_ms(120_000),
    ]);
    model.set_default_text("Answering the second.");
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let first = session.send_chat("first, runs a tool").id;
    session.wait_until("the tool running", WAIT, |s| {
        ok(s.db.runner_state(), "reading the runner state")
            .is_some_and(|r| r.current_tool.is_some())
    });
    let second = session.send_chat("second, pushed").id;
    wait_for_the_push(&model, "second, pushed");
    stop_and_expect_the_push_answered(&session, &model, &first, &second);
    session.stop_runner();
}

/// Waits for a model request that carries `text` (the CLI folded the push in).
fn wait_for_the_push(model: &FakeModel, text: &str) {
    ok(
        model.wait_until(WAIT, |log| {
            log.iter()
                .any(|r| r.is_model_turn() && r.raw_body.contains(text))
        }),
        "a model request carrying the push",
    );
}

/// `/stop`, then: the first row gets the one `Stopped.`, the pushed row its own answer in the
/// next turn, and nothing else is written.
fn stop_and_expect_the_push_answered(
    session: &Session,
    model: &FakeModel,
    first: &str,
    second: &str,
) {
    let stop = session.send_chat("/stop").id;
    session.wait_completed(first, WAIT);
    session.wait_completed(&stop, WAIT);
    model.set_script([]);
    model.release_hangs();
    // Completed with its reply in one transaction: a lost message is completed without one.
    session.wait_completed(second, WAIT);
    let outs = chat_outs(session);
    let answers: Vec<_> = outs
        .iter()
        .filter(|o| o.in_reply_to.as_deref() == Some(second))
        .map(text_of)
        .collect();
    assert_eq!(
        answers,
        vec!["Answering the second."],
        "the pushed message was not answered: {outs:#?}\n{}",
        session.runner_log()
    );
    let stopped: Vec<_> = outs.iter().filter(|o| text_of(o) == "Stopped.").collect();
    assert_eq!(stopped.len(), 1, "{outs:#?}");
    assert_eq!(stopped[0].in_reply_to.as_deref(), Some(first));
    assert_eq!(outs.len(), 2, "{outs:#?}");
}

/// A turn whose model output is a `<message to="ops">` block, then a tool call that sleeps 5 s,
/// then a final line: the `ops` row exists before the tool ends; the final line is delivered
/// once; nothing twice.
pub fn message_block_is_delivered_before_the_tool_ends(provider: &str) {
    let model = fake_model([
        Step::reply([
            Step::text("Starting.\n<message to=\"ops\">Deploy started</message>"),
            shell_step(provider, "sleep 5"),
        ]),
        Step::text("All done."),
    ]);
    let mut session = Session::new();
    ok(
        session.db.upsert_destination(&Destination {
            name: "ops".into(),
            display_name: None,
            kind: "channel".into(),
            channel_type: Some("discord".into()),
            platform_id: Some("D-ops".into()),
            agent_group_id: None,
        }),
        "adding the ops destination",
    );
    session.start_runner(provider, &model, &[]);
    let id = session.send_chat("deploy please").id;
    session.wait_until("the ops row", WAIT, |s| !chat_outs(s).is_empty());
    let tool_running = model.model_requests().len() == 1;
    let outs = chat_outs(&session);
    assert_eq!(text_of(&outs[0]), "Deploy started");
    assert_eq!(outs[0].routing.platform_id.as_deref(), Some("D-ops"));
    assert!(
        tool_running && session.row(&id).status == "processing",
        "the ops row came after the tool ended"
    );
    session.wait_completed(&id, WAIT);
    assert_eq!(chat_texts(&session), vec!["Deploy started", "All done."]);
    session.stop_runner();
}

/// With `progress: tools`, a turn that runs shell commands yields progress rows naming `Bash`
/// and the command, no more than one per interval.
pub fn progress_rows_name_the_shell_command(provider: &str) {
    let model = fake_model([
        shell_step(provider, "sleep 3; echo first-command"),
        shell_step(provider, "echo second-command"),
        shell_step(provider, "echo third-command"),
        Step::text("Ran them."),
    ]);
    let mut session = Session::new();
    session.start_runner(
        provider,
        &model,
        &[
            ("NANOCLAW_PROGRESS", "tools"),
            ("NANOCLAW_PROGRESS_INTERVAL_SECS", "2"),
        ],
    );
    let id = session.send_chat("run the commands").id;
    session.wait_completed(&id, WAIT);
    let rows: Vec<Value> = system_actions(&session, "progress")
        .into_iter()
        .map(|row| row["payload"].clone())
        .collect();
    assert!(!rows.is_empty(), "no progress row");
    let first = &rows[0];
    assert_eq!(first["tool"], "Bash", "{rows:?}");
    let summary = first["summary"].as_str().unwrap_or_default();
    assert!(summary.contains("first-command"), "{rows:?}");
    let elapsed: Vec<u64> = rows
        .iter()
        .map(|r| r["elapsedMs"].as_u64().unwrap_or_default())
        .collect();
    for pair in elapsed.windows(2) {
        assert!(pair[1] - pair[0] >= 2000, "two rows within 2 s: {rows:?}");
    }
    assert!(rows.iter().all(|r| r["tool"] == "Bash"), "{rows:?}");
    assert_eq!(chat_texts(&session), vec!["Ran them."]);
    session.stop_runner();
}

/// `/model NAME` switches the model of the next request; an unknown name gets the CLI's error as
/// the reply and the session keeps its model.
pub fn model_command_switches_the_next_request(provider: &str) {
    let model = fake_model([Step::text("From the other model.")]);
    model.set_known_models(Some([FAKE_MODEL, "other-model"]));
    model.set_default_text("From the kept model.");
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let switch = session.send_chat("/model other-model").id;
    session.wait_completed(&switch, WAIT);
    let hi = session.send_chat("hello").id;
    session.wait_reply(&hi, WAIT);
    let request = some(model.model_requests().pop(), "a model request");
    assert!(
        request.model().is_some_and(|m| m.ends_with("other-model")),
        "{:?}",
        request.model()
    );
    let typo = session.send_chat("/model no-such-model").id;
    session.wait_completed(&typo, WAIT);
    let next = session.send_chat("still there?").id;
    session.wait_completed(&next, WAIT);
    let texts = chat_texts(&session);
    assert_eq!(texts[0], "Model set to other-model for the next turns.");
    assert_eq!(texts[1], "From the other model.");
    assert!(
        texts
            .iter()
            .any(|t| t.contains("Model no-such-model failed")),
        "{texts:?}"
    );
    assert_eq!(
        texts.last().map(String::as_str),
        Some("From the kept model.")
    );
    assert_eq!(
        ok(session.db.state("model"), "the session's model").as_deref(),
        Some("other-model")
    );
    let last = some(model.model_requests().pop(), "a model request");
    assert!(
        last.model().is_some_and(|m| m.ends_with("other-model")),
        "{:?}",
        last.model()
    );
    session.stop_runner();
}
