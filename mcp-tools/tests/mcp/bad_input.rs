//! Bad input of every kind gets an error result with a clear message, and the server keeps
//! serving afterwards.

use serde_json::json;

use crate::support::Env;

#[test]
fn every_bad_input_is_an_error_result() {
    let env = Env::new();
    env.session_routing("slack", "C1");
    let mut server = env.spawn().ready();
    let huge = "x".repeat(10 * 1024 * 1024);
    let cases = [
        (
            "send_message",
            json!({"text": 42}),
            "invalid type: integer `42`, expected a string",
        ),
        ("send_message", json!({}), "missing field `text`"),
        ("send_message", json!({"text": ""}), "text is empty"),
        ("send_message", json!({"text": "   \n"}), "text is empty"),
        (
            "send_message",
            json!({"text": huge}),
            "text is too long: 10485760 bytes",
        ),
        (
            "send_message",
            json!({"text": "hi", "to": 5}),
            "invalid type",
        ),
        (
            "edit_message",
            json!({"messageId": "seven", "text": "x"}),
            "expected a message number",
        ),
        (
            "edit_message",
            json!({"messageId": 3.5, "text": "x"}),
            "whole message number",
        ),
        (
            "add_reaction",
            json!({"emoji": "👍"}),
            "missing field `messageId`",
        ),
        (
            "send_to_agent",
            json!({"agentGroupId": "", "text": "x"}),
            "agentGroupId is empty",
        ),
        (
            "schedule_task",
            json!({"prompt": "p", "recurrence": "* * *"}),
            "expected 5 fields",
        ),
        (
            "schedule_task",
            json!({"prompt": "p", "recurrence": "0 9 * * 8"}),
            "bad cron expression",
        ),
        (
            "schedule_task",
            json!({"prompt": "p", "processAfter": "tomorrow 9am"}),
            "is not a date-time",
        ),
        (
            "schedule_task",
            json!({"prompt": "p", "processAfter": 20301125}),
            "invalid type",
        ),
        (
            "update_task",
            json!({"taskId": "t", "processAfter": "soon"}),
            "is not a date-time",
        ),
        (
            "send_file",
            json!({"path": "../../../../../../../../../../etc/passwd"}),
            "outside the folders",
        ),
        (
            "send_file",
            json!({"path": "/etc/passwd"}),
            "outside the folders",
        ),
        (
            "send_file",
            json!({"path": "no/such/file.txt"}),
            "no such file",
        ),
        (
            "send_card",
            json!({"card": [1, 2]}),
            "card must be a JSON object",
        ),
        ("list_tasks", json!({"status": 3}), "invalid type"),
    ];
    for (tool, args, expected) in cases {
        let err = server.call(tool, args.clone()).err();
        let shown: String = args.to_string().chars().take(80).collect();
        assert!(err.contains(expected), "{tool} {shown}: {err}");
        assert!(err.len() < 600, "{tool}: error too long to read: {err}");
    }
    assert!(env.db.all_messages_out().unwrap().is_empty());
    assert!(env.db.all_messages_in().unwrap().is_empty());
    let seq = server
        .call("send_message", json!({"text": "still serving"}))
        .seq();
    assert_eq!(seq, 1);
}

#[test]
fn text_limit_is_configurable() {
    let env = Env::new();
    env.session_routing("slack", "C1");
    let mut server = env.spawn_with(&[("NANOCLAW_MAX_TEXT_BYTES", "10")]).ready();
    server
        .call("send_message", json!({"text": "0123456789"}))
        .ok();
    let err = server
        .call("send_message", json!({"text": "0123456789!"}))
        .err();
    assert!(err.contains("the limit is 10 bytes"), "{err}");
}
