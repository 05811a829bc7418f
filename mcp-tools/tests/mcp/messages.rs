//! send_message, send_card, send_to_agent, edit_message, add_reaction: rows and routing.

use schema::{Destination, NewMessageIn, Routing};
use serde_json::{json, Value};

use crate::support::{routing, Env};

fn content(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

#[test]
fn send_message_routes_by_batch_then_session() {
    let env = Env::new();
    env.session_routing("slack", "C-default");
    let mut server = env.spawn().ready();

    let first = server.call("send_message", json!({"text": "hello"}));
    assert_eq!(
        first.clone().ok(),
        format!("Message sent (seq {}).", first.seq())
    );
    let row = env.db.message_out_by_seq(first.seq()).unwrap().unwrap();
    assert_eq!(row.kind, "chat");
    assert_eq!(content(&row.content), json!({"text": "hello"}));
    assert_eq!(row.routing, routing("slack", "C-default", None));
    assert_eq!(row.in_reply_to, None);

    env.batch(routing("discord", "D1", Some("T9")), "in-1", Some("u1"));
    let second = server.call("send_message", json!({"text": "in thread"}));
    let row = env.db.message_out_by_seq(second.seq()).unwrap().unwrap();
    assert_eq!(row.routing, routing("discord", "D1", Some("T9")));
    assert_eq!(row.in_reply_to.as_deref(), Some("in-1"));
    assert!(second.seq() > first.seq() && second.seq() % 2 == 1);
}

#[test]
fn send_message_to_a_destination_or_explicit_fields() {
    let env = Env::new();
    env.batch(routing("slack", "C1", Some("T1")), "in-7", None);
    env.db
        .upsert_destination(&Destination {
            name: "ops".into(),
            display_name: Some("Ops".into()),
            kind: "channel".into(),
            channel_type: Some("telegram".into()),
            platform_id: Some("-100".into()),
            agent_group_id: None,
        })
        .unwrap();
    let mut server = env.spawn().ready();

    let sent = server.call("send_message", json!({"text": "to ops", "to": "ops"}));
    assert!(sent.text.contains("sent to ops"), "{}", sent.text);
    let row = env.db.message_out_by_seq(sent.seq()).unwrap().unwrap();
    assert_eq!(row.routing, routing("telegram", "-100", None));
    assert_eq!(
        row.in_reply_to.as_deref(),
        Some("in-7"),
        "in_reply_to always set"
    );

    // Explicit fields beat everything; a thread alone stays in the batch's channel.
    let sent = server.call(
        "send_message",
        json!({"text": "x", "to": "ops", "channel": "slack", "platformId": "C2"}),
    );
    let row = env.db.message_out_by_seq(sent.seq()).unwrap().unwrap();
    assert_eq!(row.routing, routing("slack", "C2", None));
    let sent = server.call(
        "send_message",
        json!({"text": "x", "threadId": "T5", "to": ""}),
    );
    let row = env.db.message_out_by_seq(sent.seq()).unwrap().unwrap();
    assert_eq!(row.routing, routing("slack", "C1", Some("T5")));

    let err = server
        .call("send_message", json!({"text": "x", "to": "nowhere"}))
        .err();
    assert!(err.contains("unknown destination \"nowhere\""), "{err}");
    assert!(err.contains("ops"), "lists the known names: {err}");
}

#[test]
fn send_card_and_send_to_agent() {
    let env = Env::new();
    env.batch(routing("slack", "C1", None), "in-1", None);
    env.db
        .upsert_destination(&Destination {
            name: "researcher".into(),
            display_name: None,
            kind: "agent".into(),
            channel_type: None,
            platform_id: None,
            agent_group_id: Some("ag-research".into()),
        })
        .unwrap();
    let mut server = env.spawn().ready();

    let card = json!({"title": "Build", "sections": [{"text": "green"}]});
    let sent = server.call(
        "send_card",
        json!({"card": card, "fallbackText": "Build: green"}),
    );
    let row = env.db.message_out_by_seq(sent.seq()).unwrap().unwrap();
    assert_eq!(row.kind, "chat-sdk");
    assert_eq!(
        content(&row.content),
        json!({"operation": "card", "card": card, "fallbackText": "Build: green"})
    );
    // A card sent as a JSON string is accepted too.
    let sent = server.call("send_card", json!({"card": card.to_string()}));
    let row = env.db.message_out_by_seq(sent.seq()).unwrap().unwrap();
    assert_eq!(content(&row.content)["card"], card);
    let err = server
        .call("send_card", json!({"card": "not a card"}))
        .err();
    assert!(err.contains("card must be a JSON object"), "{err}");

    let sent = server.call(
        "send_to_agent",
        json!({"agentGroupId": "ag-7", "text": "please review", "sessionId": "s-1"}),
    );
    let row = env.db.message_out_by_seq(sent.seq()).unwrap().unwrap();
    assert_eq!(row.kind, "chat");
    assert_eq!(row.routing, routing("agent", "ag-7", Some("s-1")));
    assert_eq!(content(&row.content), json!({"text": "please review"}));
    assert_eq!(row.in_reply_to.as_deref(), Some("in-1"));
    // An agent destination's name stands for its agent group.
    let sent = server.call(
        "send_to_agent",
        json!({"agentGroupId": "researcher", "text": "hi"}),
    );
    let row = env.db.message_out_by_seq(sent.seq()).unwrap().unwrap();
    assert_eq!(row.routing, routing("agent", "ag-research", None));
}

#[test]
fn edit_message_targets_own_messages_by_seq() {
    let env = Env::new();
    env.session_routing("slack", "C1");
    let mut server = env.spawn().ready();
    let original = server
        .call("send_message", json!({"text": "working..."}))
        .seq();
    let original_row = env.db.message_out_by_seq(original).unwrap().unwrap();

    // Not delivered yet: the row id stands for the message.
    let edit = server.call(
        "edit_message",
        json!({"messageId": original, "text": "done"}),
    );
    assert!(
        edit.text.starts_with(&format!("Message {original} edited")),
        "{}",
        edit.text
    );
    let row = env.db.message_out_by_seq(edit.seq()).unwrap().unwrap();
    assert_eq!(
        content(&row.content),
        json!({"operation": "edit", "messageId": original_row.id, "text": "done"})
    );

    // Delivered: the platform's id is used, and the edit goes where the original went.
    env.batch(routing("discord", "OTHER", None), "in-2", None);
    env.db
        .mark_delivered(&original_row.id, Some("ts-123.456"), "delivered")
        .unwrap();
    let edit = server.call(
        "edit_message",
        json!({"messageId": original.to_string(), "text": "v2"}),
    );
    let row = env.db.message_out_by_seq(edit.seq()).unwrap().unwrap();
    assert_eq!(content(&row.content)["messageId"], "ts-123.456");
    assert_eq!(row.routing, routing("slack", "C1", None));
    assert_eq!(row.in_reply_to.as_deref(), Some("in-2"));

    let inbound = env
        .db
        .insert_in(&NewMessageIn::new(
            "chat",
            r#"{"text":"hi","sender":"Ann"}"#,
        ))
        .unwrap();
    let err = server
        .call(
            "edit_message",
            json!({"messageId": inbound.seq, "text": "x"}),
        )
        .err();
    assert!(err.contains("only edit your own messages"), "{err}");
    let err = server
        .call("edit_message", json!({"messageId": 999, "text": "x"}))
        .err();
    assert!(err.contains("no message with id 999"), "{err}");
}

#[test]
fn add_reaction_on_incoming_and_own_messages() {
    let env = Env::new();
    env.session_routing("slack", "C1");
    let mut server = env.spawn().ready();
    let mut incoming = NewMessageIn::new(
        "chat-sdk",
        json!({"_type": "chat:Message", "id": "plat-42", "text": "ship it?",
               "author": {"userId": "u1"}})
        .to_string(),
    );
    incoming.routing = routing("discord", "D9", Some("T3"));
    let incoming = env.db.insert_in(&incoming).unwrap();

    let reacted = server.call(
        "add_reaction",
        json!({"messageId": incoming.seq, "emoji": "👀"}),
    );
    let row = env.db.message_out_by_seq(reacted.seq()).unwrap().unwrap();
    assert_eq!(
        content(&row.content),
        json!({"operation": "reaction", "messageId": "plat-42", "emoji": "👀"})
    );
    assert_eq!(row.routing, routing("discord", "D9", Some("T3")));

    let own = server.call("send_message", json!({"text": "done"})).seq();
    let reacted = server.call("add_reaction", json!({"messageId": own, "emoji": "✅"}));
    let row = env.db.message_out_by_seq(reacted.seq()).unwrap().unwrap();
    let own_row = env.db.message_out_by_seq(own).unwrap().unwrap();
    assert_eq!(content(&row.content)["messageId"], json!(own_row.id));
    assert_eq!(
        row.routing,
        Routing {
            thread_id: None,
            ..routing("slack", "C1", None)
        }
    );

    let err = server
        .call("add_reaction", json!({"messageId": 1000, "emoji": "👍"}))
        .err();
    assert!(err.contains("no message with id 1000"), "{err}");
    let err = server
        .call("add_reaction", json!({"messageId": own, "emoji": " "}))
        .err();
    assert!(err.contains("emoji is empty"), "{err}");
}

/// The destination-routing table the runner's `<message to>` replies are tested with too
/// (`schema::routing::cases`), driven through `send_message(to)`.
#[test]
fn send_message_to_routes_every_shared_case() {
    for case in schema::routing::cases::all() {
        let env = Env::new();
        for destination in &case.destinations {
            env.db.upsert_destination(destination).unwrap();
        }
        let ids: Vec<String> = case
            .batch
            .iter()
            .map(|routing| {
                let row = NewMessageIn {
                    routing: routing.clone(),
                    ..NewMessageIn::new("chat", r#"{"text":"hi"}"#)
                };
                env.db.insert_in(&row).unwrap().id
            })
            .collect();
        env.db
            .set_current_batch(Some(&schema::CurrentBatch {
                routing: case.batch.last().cloned().unwrap_or_default(),
                in_reply_to: ids.last().cloned(),
                ids: ids.clone(),
                sender_id: None,
            }))
            .unwrap();
        let mut server = env.spawn().ready();
        let sent = server.call("send_message", json!({"text": "hello", "to": case.to}));
        match &case.expected {
            Some(expected) => {
                let row = env.db.message_out_by_seq(sent.seq()).unwrap().unwrap();
                assert_eq!(&row.routing, expected, "{}", case.name);
                assert_eq!(row.in_reply_to, case.answers.id(&ids), "{}", case.name);
            }
            None => {
                let err = sent.err();
                assert!(err.contains("unknown destination"), "{}: {err}", case.name);
            }
        }
    }
}
