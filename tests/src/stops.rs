//! Scenarios of stopping: SIGTERM stops the runner within 2 s during each CLI's turn and during
//! `ask_user_question` (issue 10, point 2). Docker's default stop grace is 10 s; a runner that
//! takes longer is SIGKILLed and leaves its session `busy` until the host's sweep.

use std::time::Duration;

use serde_json::json;

use crate::fake_model::{FakeModel, Step};
use crate::harness::Session;
use crate::support::{ok, some, WAIT};

/// The bound the issue sets on a graceful stop.
const STOP_BOUND: Duration = Duration::from_secs(2);

/// SIGTERMs the runner, asserts it exited 0 within [`STOP_BOUND`] with the status `stopped`,
/// and returns how long it took.
fn stop_within_bound(session: &mut Session, during: &str) -> Duration {
    let (took, status) = some(
        session.stop_runner_timed(),
        &format!("the runner to exit within 10 s of SIGTERM {during}"),
    );
    eprintln!("SIGTERM {during}: the runner exited ({status}) after {took:.2?}");
    assert!(
        took <= STOP_BOUND,
        "SIGTERM {during}: the runner took {took:.2?} (bound {STOP_BOUND:?})\n{}",
        session.runner_log()
    );
    assert!(
        status.success(),
        "SIGTERM {during}: exit {status}\n{}",
        session.runner_log()
    );
    let state = some(
        ok(session.db.runner_state(), "reading the runner state"),
        "a runner state",
    );
    assert_eq!(state.status, "stopped", "SIGTERM {during}");
    took
}

/// SIGTERM while the CLI waits on the model mid-turn (the model holds its answer): the runner
/// stops the CLI and exits within 2 s, status `stopped`; the claimed row is served by the next
/// run.
pub fn sigterm_mid_turn_stops_within_2s(provider: &str) {
    let model = ok(
        FakeModel::start_with_script([Step::hang().timeout_ms(120_000)]),
        "starting the fake model",
    );
    model.set_default_text("Answered after the restart.");
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let id = session.send_chat("a turn that will be interrupted").id;
    ok(model.wait_for_model_requests(1, WAIT), "the first request");
    stop_within_bound(&mut session, &format!("during the {provider} turn"));
    model.release_hangs();
    session.start_runner(provider, &model, &[]);
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(
        crate::harness::text_of(&reply),
        "Answered after the restart."
    );
    session.stop_runner();
}

/// SIGTERM while `ask_user_question` blocks in mcp-tools (status `waiting_user`): the runner
/// exits within 2 s and the status is `stopped`, not left `waiting_user`.
pub fn sigterm_during_ask_user_question_stops_within_2s(provider: &str) {
    let model = ok(
        FakeModel::start_with_script([Step::tool_call(
            "ask_user_question",
            json!({"question": "Ship it?", "options": ["Yes", "No"]}),
        )]),
        "starting the fake model",
    );
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    session.send_chat("ask me first");
    session.wait_question(WAIT);
    session.wait_until("status waiting_user", WAIT, |s| {
        s.db.runner_state()
            .ok()
            .flatten()
            .is_some_and(|r| r.status == "waiting_user")
    });
    stop_within_bound(
        &mut session,
        &format!("during {provider}'s ask_user_question"),
    );
}
