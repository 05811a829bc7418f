//! register_agent_group: admin only.

use serde_json::{json, Value};

use crate::support::{routing, Env};

fn args() -> Value {
    json!({"name": "Support", "folder": "support-team", "platformId": "C77",
           "channelType": "slack", "triggerRules": {"mention": true}, "sessionMode": "shared"})
}

#[test]
fn refused_without_an_admin_or_from_someone_else() {
    let env = Env::new();
    env.batch(routing("slack", "C1", None), "in-1", Some("u-bob"));
    let mut server = env.spawn().ready();
    let err = server.call("register_agent_group", args()).err();
    assert!(err.contains("no admin user is configured"), "{err}");

    let mut server = env
        .spawn_with(&[("NANOCLAW_ADMIN_USER_ID", "u-alice")])
        .ready();
    let err = server.call("register_agent_group", args()).err();
    assert!(err.contains("only the admin"), "{err}");
    assert!(err.contains("u-bob"), "{err}");
    assert!(env.db.all_messages_out().unwrap().is_empty());
}

#[test]
fn the_admin_gets_a_system_row() {
    let env = Env::new();
    env.batch(routing("slack", "C1", None), "in-1", Some("u-alice"));
    let mut server = env
        .spawn_with(&[("NANOCLAW_ADMIN_USER_ID", "u-alice")])
        .ready();
    let err = server
        .call(
            "register_agent_group",
            json!({"name": "x", "folder": "../etc", "platformId": "p", "channelType": "slack"}),
        )
        .err();
    assert!(err.contains("not a plain folder name"), "{err}");

    let done = server.call("register_agent_group", args());
    let row = env.db.message_out_by_seq(done.seq()).unwrap().unwrap();
    assert_eq!(row.kind, "system");
    assert_eq!(row.in_reply_to.as_deref(), Some("in-1"));
    let content: Value = serde_json::from_str(&row.content).unwrap();
    assert_eq!(
        content,
        json!({"action": "register_agent_group", "payload": {
            "name": "Support", "folder": "support-team", "platformId": "C77",
            "channelType": "slack", "triggerRules": {"mention": true},
            "sessionMode": "shared", "requestedBy": "u-alice"}})
    );
}
