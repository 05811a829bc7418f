//! The runner loop against a real session DB and the mock provider, in-process: every gate of
//! docs/contract/db.md#status, follow-ups, commands, reply dispatch, errors and bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use agent_runner::runner::CLEARED_REPLY;
use chrono::Utc;
use provider::mock::MockStep;
use provider::ErrorClass;
use schema::time::format_ts;
use schema::{Destination, MessageOut, NewMessageIn, NewMessageOut, OutKind, Routing};
use serde_json::{json, Value};

use crate::common;

use common::{chat, routing, text_of, Fixture};

#[tokio::test]
async fn a_chat_is_answered_with_routing_and_in_reply_to_copied() {
    let mut f = Fixture::new();
    f.start();
    let id = f.chat("hello");
    f.wait_completed(&id).await;
    let outs = f.outs();
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0].routing, routing());
    assert_eq!(outs[0].in_reply_to.as_deref(), Some(id.as_str()));
    assert_eq!(outs[0].seq.unwrap() % 2, 1);
    assert!(
        text_of(&outs[0]).contains(">hello</message>"),
        "{}",
        text_of(&outs[0])
    );
    assert_eq!(f.row(&id).tries, 1);
    f.stop().await;
    assert_eq!(f.db.runner_state().unwrap().unwrap().status, "stopped");
}

#[tokio::test]
async fn context_only_rows_do_not_wake_and_ride_along() {
    let mut f = Fixture::new();
    f.start();
    let mut quiet = chat("just context");
    quiet.trigger = false;
    let quiet = f.insert(quiet);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        f.mock.prompts().is_empty(),
        "a trigger=0 row woke the agent"
    );
    assert_eq!(f.row(&quiet).status, "pending");
    let loud = f.chat("now answer");
    f.wait_completed(&loud).await;
    assert_eq!(f.row(&quiet).status, "completed");
    let prompts = f.mock.prompts();
    assert_eq!(prompts.len(), 1);
    assert!(prompts[0].text.contains("just context") && prompts[0].text.contains("now answer"));
    f.stop().await;
}

#[tokio::test]
async fn future_process_after_waits_until_due() {
    let mut f = Fixture::new();
    f.start();
    let mut later = chat("later");
    later.process_after = Some(format_ts(Utc::now() + chrono::Duration::milliseconds(1500)));
    let later = f.insert(later);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        f.row(&later).status,
        "pending",
        "picked up before it was due"
    );
    f.wait_completed(&later).await;
    f.stop().await;
}

#[tokio::test]
async fn on_wake_rows_only_on_the_first_poll() {
    let mut f = Fixture::new();
    let mut early = chat("wake note");
    early.on_wake = true;
    let early = f.insert(early);
    f.start();
    f.wait_completed(&early).await;
    let mut late = chat("late wake note");
    late.on_wake = true;
    let late = f.insert(late);
    let normal = f.chat("normal");
    f.wait_completed(&normal).await;
    assert_eq!(
        f.row(&late).status,
        "pending",
        "on_wake row taken after the first poll"
    );
    assert!(f
        .mock
        .prompts()
        .iter()
        .all(|p| !p.text.contains("late wake note")));
    f.stop().await;
}

#[tokio::test]
async fn answers_to_open_questions_wait_others_reach_the_agent() {
    let mut f = Fixture::new();
    f.db.open_question("q-open", Utc::now() + chrono::Duration::minutes(5))
        .unwrap();
    let open_answer = f.insert(NewMessageIn::new(
        "system",
        json!({"type": "question_response", "questionId": "q-open", "selectedOption": "yes"})
            .to_string(),
    ));
    let closed_answer = f.insert(NewMessageIn::new(
        "system",
        json!({"type": "question_response", "questionId": "q-closed", "selectedOption": "late"})
            .to_string(),
    ));
    let action = f.insert(NewMessageIn::new(
        "system",
        json!({"action": "register_agent_group", "status": "ok", "result": {"id": "g1"}})
            .to_string(),
    ));
    f.start();
    f.wait_completed(&action).await;
    f.wait_completed(&closed_answer).await;
    assert_eq!(
        f.row(&open_answer).status,
        "pending",
        "an answer to an open question reached the agent"
    );
    let all: String = f.mock.prompts().iter().map(|p| p.text.clone()).collect();
    assert!(
        all.contains("late") && all.contains("register_agent_group"),
        "{all}"
    );
    assert!(!all.contains("\"yes\"") && !all.contains(">yes<"), "{all}");
    f.stop().await;
}

#[tokio::test]
async fn the_limit_applies_after_the_filters() {
    let mut f = Fixture::new();
    f.db.open_question("q", Utc::now() + chrono::Duration::minutes(5))
        .unwrap();
    for _ in 0..3 {
        f.insert(NewMessageIn::new(
            "system",
            json!({"type": "question_response", "questionId": "q", "selectedOption": "x"})
                .to_string(),
        ));
    }
    let a = f.chat("first");
    let b = f.chat("second");
    let c = f.chat("third");
    f.start_with(|o| o.max_messages = 2);
    f.wait_completed(&c).await;
    let prompts = f.mock.prompts();
    assert!(
        prompts[0].text.contains("first") && prompts[0].text.contains("second"),
        "{:?}",
        prompts[0]
    );
    assert!(!prompts[0].text.contains("third"));
    assert_eq!(f.row(&a).status, "completed");
    assert_eq!(f.row(&b).status, "completed");
    f.stop().await;
}

#[tokio::test]
async fn a_row_inserted_mid_turn_is_pushed_and_completed_after_its_result() {
    let mut f = Fixture::with_delay(Duration::from_millis(600));
    f.start();
    let first = f.chat("first");
    f.wait_for("the first prompt", |f| f.mock.prompts().len() == 1)
        .await;
    let second = f.chat("second");
    f.wait_for("the push", |f| f.mock.prompts().len() == 2)
        .await;
    assert_eq!(
        f.mock.inputs().len(),
        1,
        "the follow-up started a new query instead of a push"
    );
    assert_eq!(f.row(&second).status, "processing");
    f.wait_completed(&first).await;
    // The first result came; the second prompt's turn has not ended yet.
    assert_eq!(
        f.row(&second).status,
        "processing",
        "completed before its turn produced a result"
    );
    f.wait_completed(&second).await;
    let outs = f.outs();
    assert_eq!(outs.len(), 2);
    assert_eq!(outs[1].in_reply_to.as_deref(), Some(second.as_str()));
    f.stop().await;
}

#[tokio::test]
async fn clear_is_an_exact_command() {
    let mut f = Fixture::new();
    f.db.set_continuation("mock", "old-session").unwrap();
    f.start();
    let clear = f.chat("/clear");
    f.wait_completed(&clear).await;
    let outs = f.outs();
    assert_eq!(text_of(&outs[0]), CLEARED_REPLY);
    assert!(f.mock.prompts().is_empty(), "/clear reached the agent");
    let msg = f.chat("/clearance please");
    f.wait_completed(&msg).await;
    assert!(f.mock.prompts()[0].text.contains("/clearance please"));
    // The query after /clear started without the old continuation.
    assert_eq!(f.mock.inputs()[0].continuation.as_deref(), None);
    assert_eq!(
        f.db.continuation("mock").unwrap().as_deref(),
        Some("mock-session-1")
    );
    f.stop().await;
}

#[tokio::test]
async fn reply_dispatch_rules() {
    let mut f = Fixture::new();
    f.db.upsert_destination(&Destination {
        name: "ops".into(),
        display_name: None,
        kind: "channel".into(),
        channel_type: Some("discord".into()),
        platform_id: Some("D7".into()),
        agent_group_id: None,
    })
    .unwrap();
    let reply = |text: &str| MockStep::Reply {
        text: text.into(),
        delay: Duration::ZERO,
    };
    f.mock.script([
        reply("visible <internal>secret plan</internal> text"),
        reply("<message to=\"ops\">to ops</message><message to=\"nobody\">lost</message>"),
        reply("<internal>only thinking</internal>"),
        reply(""),
    ]);
    f.start();
    for i in 0..4 {
        // One prompt per message: each waits for the previous one's turn.
        let id = f.chat(&format!("m{i}"));
        f.wait_completed(&id).await;
    }
    let outs = f.outs();
    let texts: Vec<String> = outs.iter().map(text_of).collect();
    assert_eq!(
        texts,
        vec!["visible  text".to_owned(), "to ops".to_owned()],
        "{texts:?}"
    );
    assert_eq!(outs[0].routing, routing());
    assert_eq!(outs[1].routing.platform_id.as_deref(), Some("D7"));
    f.stop().await;
}

#[tokio::test]
async fn a_result_repeating_a_sent_message_is_not_written_twice() {
    let mut f = Fixture::new();
    f.mock.script([MockStep::Reply {
        text: "Done: deployed.".into(),
        delay: Duration::from_millis(400),
    }]);
    f.start();
    let id = f.chat("deploy");
    f.wait_for("the prompt", |f| f.mock.prompts().len() == 1)
        .await;
    // What mcp-tools' send_message writes during the turn.
    f.db.insert_out(
        &NewMessageOut::new(
            OutKind::Chat,
            routing(),
            &json!({"text": "Done:  deployed."}),
        )
        .replying_to(Some(id.clone())),
    )
    .unwrap();
    f.wait_completed(&id).await;
    assert_eq!(f.outs().len(), 1);
    f.stop().await;
}

#[tokio::test]
async fn errors_retry_then_report_query_error_and_leave_rows_processing() {
    let mut f = Fixture::new();
    let fail = |retryable| MockStep::Fail {
        message: "model API 500".into(),
        retryable,
        classification: ErrorClass::Api,
    };
    f.mock.script([
        fail(true),
        MockStep::Reply {
            text: "recovered".into(),
            delay: Duration::ZERO,
        },
        fail(false),
    ]);
    f.start();
    let first = f.chat("one");
    f.wait_completed(&first).await;
    assert_eq!(text_of(&f.outs()[0]), "recovered");
    let second = f.chat("two");
    f.wait_for("query_error", |f| {
        f.outs().iter().any(|o| o.kind == "system")
    })
    .await;
    let error = f.outs().into_iter().find(|o| o.kind == "system").unwrap();
    let content: Value = serde_json::from_str(&error.content).unwrap();
    assert_eq!(content["action"], "query_error");
    assert_eq!(content["payload"]["messageIds"][0], second.as_str());
    assert_eq!(error.in_reply_to.as_deref(), Some(second.as_str()));
    assert_eq!(
        f.row(&second).status,
        "processing",
        "rows are left for the host's sweep"
    );
    // The runner goes on: the next message is answered.
    let third = f.chat("three");
    f.wait_completed(&third).await;
    f.stop().await;
}

#[tokio::test]
async fn bad_input_is_handled_never_stuck() {
    let mut f = Fixture::new();
    f.start();
    let malformed = f.insert(NewMessageIn::new("chat", "{not json"));
    let unknown = f.insert(NewMessageIn::new(
        "carrier-pigeon",
        json!({"coo": 1}).to_string(),
    ));
    let huge = f.chat(&"x".repeat(5 * 1024 * 1024));
    let mut bad_time = chat("bad times");
    bad_time.timestamp = Some("yesterday-ish".into());
    let bad_time = f.insert(bad_time);
    // When it is due is unknown: never run on a guess, taken out of the queue and reported.
    let mut bad_due = chat("bad due time");
    bad_due.process_after = Some("not a time".into());
    let bad_due = f.insert(bad_due);
    for id in [&malformed, &unknown, &huge, &bad_time] {
        f.wait_completed(id).await;
    }
    f.wait_for("the bad due time taken out", |f| {
        f.row(&bad_due).status == "failed"
    })
    .await;
    let all: String = f.mock.prompts().iter().map(|p| p.text.clone()).collect();
    assert!(all.contains("{not json"));
    assert!(all.contains("carrier-pigeon"));
    assert!(all.contains("bad times"));
    assert!(!all.contains("bad due time"));
    let report = f
        .outs()
        .into_iter()
        .find(|o| o.in_reply_to.as_deref() == Some(bad_due.as_str()))
        .unwrap();
    assert_eq!(report.kind, "system");
    assert_eq!(report.routing, routing());
    let report: Value = serde_json::from_str(&report.content).unwrap();
    assert_eq!(report["action"], "row_unusable");
    assert_eq!(report["payload"]["value"], "not a time");
    f.stop().await;
}

#[tokio::test]
async fn a_timestamp_with_a_compact_offset_keeps_its_time_in_the_prompt() {
    let mut f = Fixture::new();
    f.start();
    let mut hhmm = chat("compact");
    hhmm.timestamp = Some("2027-06-01T09:00:00+0200".into());
    let mut hh = chat("hours only");
    hh.timestamp = Some("2027-06-01T09:30:00+02".into());
    for id in [f.insert(hhmm), f.insert(hh)] {
        f.wait_completed(&id).await;
    }
    let all: String = f.mock.prompts().iter().map(|p| p.text.clone()).collect();
    assert!(all.contains(r#"time="Jun 1, 2027, 7:00 AM""#), "{all}");
    assert!(all.contains(r#"time="Jun 1, 2027, 7:30 AM""#), "{all}");
    f.stop().await;
}

#[tokio::test]
async fn the_heartbeat_beats_during_a_slow_turn_and_status_tracks_the_query() {
    // Long enough that the check 1.5 s after "busy" is seen still lands inside the turn on a
    // loaded machine.
    let mut f = Fixture::with_delay(Duration::from_millis(4000));
    f.start();
    let id = f.chat("slow one");
    f.wait_for("busy", |f| {
        f.db.runner_state()
            .unwrap()
            .is_some_and(|s| s.status == "busy")
    })
    .await;
    let first = f.db.runner_state().unwrap().unwrap().heartbeat_at;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let state = f.db.runner_state().unwrap().unwrap();
    assert_eq!(state.status, "busy");
    assert!(
        state.heartbeat_at > first,
        "no heartbeat during the turn: {first} then {}",
        state.heartbeat_at
    );
    f.wait_completed(&id).await;
    f.wait_for("idle", |f| {
        f.db.runner_state().unwrap().unwrap().status == "idle"
    })
    .await;
    f.stop().await;
}

/// The destination-routing table mcp-tools' `send_message(to)` is tested with too
/// (`schema::routing::cases`), driven through the runner's `<message to>` reply.
#[tokio::test]
async fn reply_to_a_destination_routes_every_shared_case() {
    for case in schema::routing::cases::all() {
        let mut f = Fixture::new();
        for destination in &case.destinations {
            f.db.upsert_destination(destination).unwrap();
        }
        // Inserted before the runner starts: one poll claims them as one batch.
        let ids: Vec<String> = case
            .batch
            .iter()
            .map(|routing| {
                let mut row = chat("hi");
                row.routing = routing.clone();
                f.insert(row)
            })
            .collect();
        f.mock.script([MockStep::Reply {
            text: format!("<message to=\"{}\">hello</message>", case.to),
            delay: Duration::ZERO,
        }]);
        f.start();
        for id in &ids {
            f.wait_completed(id).await;
        }
        f.stop().await;
        let sent: Vec<(Routing, Option<String>)> = f
            .outs()
            .into_iter()
            .filter(|o| o.kind == "chat")
            .map(|o| (o.routing, o.in_reply_to))
            .collect();
        match &case.expected {
            Some(expected) => assert_eq!(
                sent,
                vec![(expected.clone(), case.answers.id(&ids))],
                "{}",
                case.name
            ),
            None => assert_eq!(sent, Vec::new(), "{}", case.name),
        }
    }
}

/// Issue 10: a turn without model output ends at the progress deadline with a `NoProgress`
/// query_error naming the endpoint; the runner does not run it again (that would multiply the
/// bound), clears what the turn waited on, and answers the next message.
#[tokio::test]
async fn a_turn_without_output_ends_at_the_progress_deadline_and_is_not_retried() {
    let mut f = Fixture::new();
    f.mock.script([
        MockStep::Reply {
            text: "far too late".into(),
            delay: Duration::from_secs(60),
        },
        MockStep::Reply {
            text: "on time".into(),
            delay: Duration::ZERO,
        },
    ]);
    f.start_with(|options| {
        options.query_retries = 2;
        options.model_endpoint = "http://gateway.test/v1".into();
        options.progress = agent_runner::runner::ProgressLimits {
            notice: Duration::from_secs(1),
            silence: Duration::from_secs(1),
            max_turn: Duration::ZERO,
        };
    });
    let started = std::time::Instant::now();
    let first = f.chat("anyone?");
    f.wait_for("query_error", |f| {
        f.outs().iter().any(|o| o.kind == "system")
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    let error = f.outs().into_iter().find(|o| o.kind == "system").unwrap();
    let content: Value = serde_json::from_str(&error.content).unwrap();
    let payload = &content["payload"];
    assert_eq!(payload["classification"], "NoProgress", "{payload}");
    assert_eq!(payload["retryable"], true, "{payload}");
    assert_eq!(payload["endpoint"], "http://gateway.test/v1", "{payload}");
    let message = payload["message"].as_str().unwrap();
    assert!(message.contains("http://gateway.test/v1"), "{message}");
    assert!(message.contains("progressSilenceSecs=1"), "{message}");
    assert_eq!(payload["messageIds"][0], first.as_str());
    assert_eq!(f.row(&first).status, "processing");
    assert_eq!(f.mock.inputs().len(), 1, "not run again by the runner");
    let state = f.db.runner_state().unwrap().unwrap();
    assert_eq!(state.waiting_on, None);
    let second = f.chat("now?");
    f.wait_completed(&second).await;
    assert!(f.outs().iter().any(|o| text_of(o) == "on time"));
    f.stop().await;
}

// Issue 15: turn control (stop, text as it is written, progress rows, /model).

/// A first turn that stalls for a minute unless stopped.
fn stalled_turn() -> MockStep {
    MockStep::Reply {
        text: "never".into(),
        delay: Duration::from_secs(60),
    }
}

/// A running fixture whose first turn, on a chat `text`, stalls; returns the row's id once the
/// mock has the prompt.
async fn stalled_fixture(text: &str) -> (Fixture, String) {
    let mut f = Fixture::new();
    f.mock.script([stalled_turn()]);
    f.start();
    let id = f.chat(text);
    f.wait_for("the prompt", |f| f.mock.prompts().len() == 1)
        .await;
    (f, id)
}

fn system_row(content: Value) -> NewMessageIn {
    let mut row = NewMessageIn::new("system", content.to_string());
    row.routing = routing();
    row
}

fn ops_destination() -> Destination {
    Destination {
        name: "ops".into(),
        display_name: None,
        kind: "channel".into(),
        channel_type: Some("discord".into()),
        platform_id: Some("D7".into()),
        agent_group_id: None,
    }
}

fn chats(f: &Fixture) -> Vec<MessageOut> {
    f.outs().into_iter().filter(|o| o.kind == "chat").collect()
}

#[tokio::test]
async fn stop_mid_turn_answers_stopped_and_the_session_goes_on() {
    let (mut f, slow) = stalled_fixture("take your time").await;
    let asked = std::time::Instant::now();
    let stop = f.chat("/stop");
    f.wait_completed(&slow).await;
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    f.wait_completed(&stop).await;
    let outs = chats(&f);
    assert_eq!(outs.len(), 1, "{outs:?}");
    assert_eq!(text_of(&outs[0]), "Stopped.");
    assert_eq!(outs[0].routing, routing());
    assert_eq!(outs[0].in_reply_to.as_deref(), Some(slow.as_str()));
    assert_eq!(f.db.runner_state().unwrap().unwrap().status, "idle");
    // The next message continues the same session.
    let next = f.chat("and now?");
    f.wait_completed(&next).await;
    let inputs = f.mock.inputs();
    assert_eq!(inputs.len(), 2);
    assert_eq!(inputs[1].continuation.as_deref(), Some("mock-session-1"));
    assert!(f.mock.prompts()[1].text.contains("and now?"));
    assert!(
        !f.mock.prompts()[1].text.contains("take your time"),
        "replayed"
    );
    f.stop().await;
}

#[tokio::test]
async fn a_message_pushed_then_stopped_starts_the_next_turn() {
    let (mut f, slow) = stalled_fixture("long job").await;
    let pushed = f.chat("also this");
    f.wait_for("the push", |f| f.row(&pushed).status == "processing")
        .await;
    let stop = f.chat("/stop");
    f.wait_completed(&pushed).await;
    assert_eq!(f.row(&slow).status, "completed");
    assert_eq!(f.row(&stop).status, "completed");
    let outs = chats(&f);
    assert_eq!(text_of(&outs[0]), "Stopped.");
    assert_eq!(outs[0].in_reply_to.as_deref(), Some(slow.as_str()));
    assert_eq!(outs.len(), 2, "{outs:?}");
    assert!(
        text_of(&outs[1]).contains("also this"),
        "{}",
        text_of(&outs[1])
    );
    assert!(
        !text_of(&outs[1]).contains("long job"),
        "the stopped prompt was replayed"
    );
    assert_eq!(outs[1].in_reply_to.as_deref(), Some(pushed.as_str()));
    assert_eq!(
        f.mock.inputs().len(),
        2,
        "the pushed rows run as the next query"
    );
    f.stop().await;
}

#[tokio::test]
async fn stop_while_idle_says_nothing_runs_and_the_host_row_is_silent() {
    let mut f = Fixture::new();
    f.start();
    let stop = f.chat(" /stop ");
    f.wait_completed(&stop).await;
    let interrupt = f.insert(system_row(json!({"action": "interrupt"})));
    f.wait_completed(&interrupt).await;
    let outs = f.outs();
    assert_eq!(outs.len(), 1, "{outs:?}");
    assert_eq!(text_of(&outs[0]), "Nothing is running.");
    assert_eq!(outs[0].in_reply_to.as_deref(), Some(stop.as_str()));
    assert!(f.mock.prompts().is_empty(), "a stop reached the agent");
    f.stop().await;
}

#[tokio::test]
async fn the_host_interrupt_row_and_a_custom_stop_word_stop_a_turn() {
    let mut f = Fixture::new();
    f.mock.script([stalled_turn(), stalled_turn()]);
    f.start_with(|options| {
        options.turn_control.stop_word = "!halt".into();
        options.turn_control.stopped_reply = "Halted.".into();
    });
    let first = f.chat("one");
    f.wait_for("the prompt", |f| f.mock.prompts().len() == 1)
        .await;
    let interrupt = f.insert(system_row(json!({"action": "interrupt"})));
    f.wait_completed(&first).await;
    f.wait_completed(&interrupt).await;
    let second = f.chat("two");
    f.wait_for("the prompt", |f| f.mock.prompts().len() == 2)
        .await;
    let halt = f.chat("!halt");
    f.wait_completed(&second).await;
    f.wait_completed(&halt).await;
    let texts: Vec<String> = chats(&f).iter().map(text_of).collect();
    assert_eq!(texts, vec!["Halted.", "Halted."]);
    f.stop().await;
}

#[tokio::test]
async fn message_blocks_are_delivered_as_written_and_never_twice() {
    let mut f = Fixture::new();
    f.db.upsert_destination(&ops_destination()).unwrap();
    let block = "<message to=\"ops\">Deploy started</message>";
    let turn = |final_text: &str| MockStep::Parts {
        parts: vec![
            provider::mock::MockPart::Text {
                text: format!("Checking first.\n{block}"),
            },
            provider::mock::MockPart::Tool {
                tool: "Bash".into(),
                summary: Some("sleep 5".into()),
            },
        ],
        text: final_text.into(),
        delay: Duration::from_millis(700),
    };
    f.mock
        .script([turn("All done."), turn(block), turn("Deploy  started")]);
    f.start();
    let first = f.chat("deploy");
    f.wait_for("the ops row", |f| chats(f).len() == 1).await;
    assert_eq!(
        f.row(&first).status,
        "processing",
        "the block waited for the result"
    );
    let ops = &chats(&f)[0];
    assert_eq!(text_of(ops), "Deploy started");
    assert_eq!(ops.routing.platform_id.as_deref(), Some("D7"));
    f.wait_completed(&first).await;
    let texts: Vec<String> = chats(&f).iter().map(text_of).collect();
    assert_eq!(texts, vec!["Deploy started", "All done."]);
    // A final text repeating the block, or equal to its text: nothing twice.
    for text in ["again", "and again"] {
        let id = f.chat(text);
        f.wait_completed(&id).await;
    }
    let texts: Vec<String> = chats(&f).iter().map(text_of).collect();
    assert_eq!(
        texts,
        vec![
            "Deploy started",
            "All done.",
            "Deploy started",
            "Deploy started"
        ],
        "one block per turn, nothing else"
    );
    f.stop().await;
}

#[tokio::test]
async fn progress_rows_name_the_tool_at_most_one_per_interval() {
    let mut f = Fixture::new();
    let tool = |name: &str, summary: &str| provider::mock::MockPart::Tool {
        tool: name.into(),
        summary: Some(summary.into()),
    };
    f.mock.script([MockStep::Parts {
        parts: vec![
            tool("Bash", "ls -la"),
            tool("Read", "a.txt"),
            tool("Grep", "fn main"),
        ],
        text: "done".into(),
        delay: Duration::from_millis(1500),
    }]);
    f.start_with(|options| {
        options.turn_control.progress = agent_runner::progress::ProgressOptions {
            mode: agent_runner::progress::ProgressMode::Tools,
            interval: Duration::from_secs(1),
        };
    });
    let id = f.chat("look around");
    f.wait_completed(&id).await;
    let outs = f.outs();
    let progress: Vec<Value> = outs
        .iter()
        .filter(|o| o.kind == "system")
        .map(|o| serde_json::from_str::<Value>(&o.content).unwrap())
        .collect();
    assert_eq!(progress.len(), 2, "{progress:?}");
    assert_eq!(progress[0]["action"], "progress");
    assert_eq!(progress[0]["payload"]["tool"], "Bash");
    assert_eq!(progress[0]["payload"]["summary"], "ls -la");
    assert_eq!(
        progress[1]["payload"]["tool"], "Grep",
        "the newest step waited"
    );
    let elapsed = |p: &Value| p["payload"]["elapsedMs"].as_u64().unwrap();
    assert!(
        elapsed(&progress[1]) - elapsed(&progress[0]) >= 1000,
        "{progress:?}"
    );
    assert!(outs
        .iter()
        .filter(|o| o.kind == "system")
        .all(|o| o.routing == routing()));
    assert_eq!(outs.last().map(text_of).as_deref(), Some("done"));
    f.stop().await;
}

#[tokio::test]
async fn model_command_is_kept_and_a_refused_model_is_reverted() {
    let mut f = Fixture::new();
    f.start();
    let switch = f.chat("/model big-model");
    f.wait_completed(&switch).await;
    assert_eq!(f.db.state("model").unwrap().as_deref(), Some("big-model"));
    let hi = f.chat("hi");
    f.wait_completed(&hi).await;
    assert_eq!(f.mock.inputs()[0].model.as_deref(), Some("big-model"));
    // An unknown model: the CLI's error is the reply, the session keeps big-model.
    f.mock.script([MockStep::Fail {
        message: "model not found: typo-model".into(),
        retryable: false,
        classification: ErrorClass::Api,
    }]);
    let typo = f.chat("/model typo-model");
    f.wait_completed(&typo).await;
    let next = f.chat("next");
    f.wait_completed(&next).await;
    assert_eq!(f.db.state("model").unwrap().as_deref(), Some("big-model"));
    let inputs = f.mock.inputs();
    let models: Vec<_> = inputs.iter().map(|i| i.model.as_deref()).collect();
    assert_eq!(
        models,
        vec![Some("big-model"), Some("typo-model"), Some("big-model")]
    );
    let texts: Vec<String> = chats(&f).iter().map(text_of).collect();
    assert_eq!(texts[0], "Model set to big-model for the next turns.");
    assert!(
        texts[3].contains("model not found: typo-model"),
        "{texts:?}"
    );
    assert!(texts[3].contains("keeps big-model"), "{texts:?}");
    assert!(texts[4].contains("next"), "{texts:?}");
    assert_eq!(texts.len(), 5, "{texts:?}");
    f.stop().await;
}

/// The runner keeps the continuation and model between queries while their stamp holds; a
/// hand edit of either, by a connection that is not the runner's (as the `sqlite3` shell
/// would), reaches the next query all the same.
#[tokio::test]
async fn a_hand_edit_of_the_model_or_continuation_reaches_the_next_query() {
    let mut f = Fixture::new();
    f.start();
    for text in ["one", "two"] {
        let id = f.chat(text);
        f.wait_completed(&id).await;
    }
    let edits = [
        "DELETE FROM session_state WHERE key = 'continuation:mock'",
        "INSERT INTO session_state (key, value, updated_at)
           VALUES ('model', 'hand-model', '2026-01-01T00:00:00.000Z')",
    ];
    let shell = rusqlite::Connection::open(f.db.path()).unwrap();
    shell.busy_timeout(Duration::from_secs(10)).unwrap();
    for edit in edits {
        shell.execute(edit, []).unwrap();
    }
    let three = f.chat("three");
    f.wait_completed(&three).await;
    shell
        .execute(
            "UPDATE session_state SET value = 'hand-session' WHERE key = 'continuation:mock'",
            [],
        )
        .unwrap();
    shell
        .execute("DELETE FROM session_state WHERE key = 'model'", [])
        .unwrap();
    let four = f.chat("four");
    f.wait_completed(&four).await;
    let inputs = f.mock.inputs();
    let seen: Vec<_> = inputs
        .iter()
        .map(|i| (i.continuation.as_deref(), i.model.as_deref()))
        .collect();
    assert_eq!(
        seen,
        [
            (None, None),
            (Some("mock-session-1"), None),
            (None, Some("hand-model")),
            (Some("hand-session"), None),
        ]
    );
    f.stop().await;
}

#[tokio::test]
async fn stop_withdraws_the_open_question_of_the_turn() {
    let (mut f, slow) = stalled_fixture("ask me something").await;
    // What mcp-tools' ask_user_question records while it waits.
    f.db.open_question("q-1", Utc::now() + chrono::Duration::minutes(5))
        .unwrap();
    let stop = f.chat("/stop");
    f.wait_completed(&slow).await;
    f.wait_completed(&stop).await;
    assert!(
        !f.db.question_open("q-1").unwrap(),
        "the question still waits"
    );
    f.stop().await;
}
