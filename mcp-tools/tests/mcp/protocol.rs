//! The JSON-RPC surface: handshake, tools/list, and answers to everything else.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{Env, Server, TIMEOUT};

const TOOLS: [&str; 14] = [
    "add_reaction",
    "ask_user_question",
    "cancel_task",
    "edit_message",
    "list_tasks",
    "pause_task",
    "register_agent_group",
    "resume_task",
    "schedule_task",
    "send_card",
    "send_file",
    "send_message",
    "send_to_agent",
    "update_task",
];

#[test]
fn initialize_announces_nanoclaw_with_tools() {
    let env = Env::new();
    let mut server = env.spawn();
    let response = server.initialize();
    let result = &response["result"];
    assert_eq!(result["serverInfo"]["name"], "nanoclaw");
    assert_eq!(result["protocolVersion"], "2025-11-25");
    assert!(result["capabilities"]["tools"].is_object(), "{result}");
    // An older client version is echoed back.
    let mut older = env.spawn();
    let response = older.request(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "codex", "version": "0"}}),
    );
    assert_eq!(response["result"]["protocolVersion"], "2025-06-18");
}

#[test]
fn tools_list_has_every_tool_with_a_schema() {
    let env = Env::new();
    let mut server = env.spawn().ready();
    let tools = server.tools();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, TOOLS);
    for tool in &tools {
        let name = tool["name"].as_str().unwrap();
        let description = tool["description"].as_str().unwrap_or("");
        assert!(description.len() > 60, "{name}: description too thin");
        assert!(
            !description.contains('\n'),
            "{name}: description has line breaks"
        );
        let schema = &tool["inputSchema"];
        assert_eq!(schema["type"], "object", "{name}");
        for (param, spec) in schema["properties"].as_object().unwrap() {
            assert!(
                spec["description"].as_str().is_some_and(|d| !d.is_empty()),
                "{name}.{param} has no description"
            );
            assert_ne!(spec["type"], json!(["string", "null"]), "{name}.{param}");
        }
    }
    let required = |name: &str| -> Vec<String> {
        let tool = tools.iter().find(|t| t["name"] == name).unwrap();
        let mut list: Vec<String> = tool["inputSchema"]["required"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
            .unwrap_or_default();
        list.sort();
        list
    };
    assert_eq!(required("send_message"), ["text"]);
    assert_eq!(required("send_file"), ["path"]);
    assert_eq!(required("send_card"), ["card"]);
    assert_eq!(required("ask_user_question"), ["options", "question"]);
    assert_eq!(required("edit_message"), ["messageId", "text"]);
    assert_eq!(required("add_reaction"), ["emoji", "messageId"]);
    assert_eq!(required("send_to_agent"), ["agentGroupId", "text"]);
    assert_eq!(required("schedule_task"), ["prompt"]);
    assert!(required("list_tasks").is_empty());
    for name in ["update_task", "cancel_task", "pause_task", "resume_task"] {
        assert_eq!(required(name), ["taskId"], "{name}");
    }
    assert_eq!(
        required("register_agent_group"),
        ["channelType", "folder", "name", "platformId"]
    );
    let ask = tools
        .iter()
        .find(|t| t["name"] == "ask_user_question")
        .unwrap();
    let options = &ask["inputSchema"]["properties"]["options"];
    assert_eq!(options["type"], "array");
    assert_eq!(options["items"]["required"], json!(["label"]), "{options}");
}

/// Claude Code probes `server/discover` before `initialize` and waits ~3 s on silence.
#[test]
fn unknown_requests_get_method_not_found_at_once() {
    let env = Env::new();
    let mut server = env.spawn();
    let started = Instant::now();
    server.send(&json!({
        "jsonrpc": "2.0", "id": 0, "method": "server/discover",
        "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}
    }));
    let response = server.response(&json!(0), TIMEOUT).unwrap();
    assert_eq!(response["error"]["code"], -32601, "{response}");
    assert!(started.elapsed() < Duration::from_secs(1));
    // A request before initialize, a notification before initialize, and a pre-init ping.
    server.send(&json!({"jsonrpc": "2.0", "id": "early", "method": "tools/list"}));
    let response = server.response(&json!("early"), TIMEOUT).unwrap();
    assert_eq!(response["error"]["code"], -32601, "{response}");
    server.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": 5}}),
    );
    let pong = server.request("ping", json!({}));
    assert!(pong["result"].is_object(), "{pong}");

    server.initialize();
    for method in [
        "foo/bar",
        "resources/list",
        "prompts/list",
        "server/discover",
        "logging/setLevel",
    ] {
        let response = server.request(method, json!({}));
        assert_eq!(response["error"]["code"], -32601, "{method}: {response}");
    }
    // A request without params and with a string id.
    server.send(&json!({"jsonrpc": "2.0", "id": "x", "method": "completion/complete"}));
    let response = server.response(&json!("x"), TIMEOUT).unwrap();
    assert_eq!(response["error"]["code"], -32601);
    assert_eq!(server.tools().len(), TOOLS.len());
}

#[test]
fn malformed_lines_get_errors_and_the_server_keeps_serving() {
    let env = Env::new();
    let mut server = env.spawn().ready();
    server.send_raw("this is not json");
    let error = server.next_message(TIMEOUT).unwrap();
    assert_eq!(error["error"]["code"], -32700, "{error}");
    assert_eq!(error["id"], Value::Null);
    server.send_raw("[1, 2]");
    let error = server.next_message(TIMEOUT).unwrap();
    assert_eq!(error["error"]["code"], -32600, "{error}");
    server.send_raw("");
    for params in [
        json!({"nam": "send_message"}),
        json!("x"),
        json!({"name": "send_message", "arguments": [1]}),
    ] {
        let response = server.request("tools/call", params.clone());
        assert_eq!(response["error"]["code"], -32602, "{params}: {response}");
    }
    let response = server.request(
        "tools/call",
        json!({"name": "no_such_tool", "arguments": {}}),
    );
    assert_eq!(response["error"]["code"], -32602, "{response}");
    env.session_routing("slack", "C1");
    let seq = server
        .call("send_message", json!({"text": "still here"}))
        .seq();
    assert_eq!(seq % 2, 1);
}

#[test]
fn end_of_input_ends_the_process() {
    let env = Env::new();
    let mut server = env.spawn().ready();
    server.close_stdin();
    let started = Instant::now();
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The write end of a pipe whose read end is already closed: every write fails with EPIPE.
fn dead_pipe() -> std::process::Stdio {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    writer.into()
}

#[test]
fn a_dead_stderr_pipe_neither_panics_nor_blocks() {
    // Issue 10: a failed log write made tracing-subscriber `eprintln!`, which panics on EPIPE.
    let env = Env::new();
    let command = env.command(&[("RUST_LOG", "debug")]);
    let mut server = Server::spawn_with_stderr(command, dead_pipe()).ready();
    assert_eq!(server.tools().len(), TOOLS.len());
    server.close_stdin();
    let started = Instant::now();
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(2), "did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The last words of a failed start cannot panic either (exit 1, not 101).
    let status = env
        .command(&[("RUST_LOG", "debug"), ("TZ", "Mars/Olympus")])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(dead_pipe())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1), "{status}");
}

#[test]
fn startup_errors_are_clear() {
    let env = Env::new();
    let output = std::process::Command::new(crate::support::BIN)
        .env_clear()
        .env("SESSION_DB", &env.db_path)
        .env("TZ", "Mars/Olympus")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("TZ=\"Mars/Olympus\""), "{stderr}");
    assert!(output.stdout.is_empty(), "stdout must stay clean");

    let output = std::process::Command::new(crate::support::BIN)
        .env_clear()
        .env("SESSION_DB", env.dir.path().join("missing/dir/session.db"))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("does not exist"), "{stderr}");
}
