//! A stdio MCP server for tests whose one tool asks the user through an MCP elicitation.
//!
//! Tool `pick_color {}`: sends `elicitation/create` with the message `Pick a color` and a
//! schema of one string property `color` with the choices `red` and `blue`, waits for the
//! client's answer, and returns `picked: <color>` for an `accept`, or `no color: <action>`.
//! Speaks newline-delimited JSON-RPC 2.0 on stdin/stdout; anything unexpected is answered with
//! an empty result so a client never hangs on it.

use std::io::{BufRead, Write};

use serde_json::{json, Value};

/// The id of our own elicitation request (the client's ids are its own).
const ELICIT_ID: &str = "elicit-1";

fn main() -> std::io::Result<()> {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let mut send = |message: Value| -> std::io::Result<()> {
        writeln!(out, "{message}")?;
        out.flush()
    };
    // The tools/call waiting for the elicitation's answer.
    let mut waiting: Option<Value> = None;
    for line in stdin.lock().lines() {
        let line = line?;
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let id = message.get("id").cloned();
        let Some(method) = message.get("method").and_then(Value::as_str) else {
            // A response: the answer to our elicitation.
            if id.as_ref().and_then(Value::as_str) == Some(ELICIT_ID) {
                if let Some(call) = waiting.take() {
                    let result = message.get("result").cloned().unwrap_or(Value::Null);
                    let text = match result.get("action").and_then(Value::as_str) {
                        Some("accept") => format!(
                            "picked: {}",
                            result
                                .pointer("/content/color")
                                .and_then(Value::as_str)
                                .unwrap_or("?")
                        ),
                        other => format!("no color: {}", other.unwrap_or("error")),
                    };
                    send(json!({"jsonrpc": "2.0", "id": call,
                        "result": {"content": [{"type": "text", "text": text}]}}))?;
                }
            }
            continue;
        };
        let Some(id) = id else { continue };
        let result = match method {
            "initialize" => json!({
                "protocolVersion": message.pointer("/params/protocolVersion").cloned().unwrap_or(json!("2025-06-18")),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "elicit-mcp", "version": "0.1.0"},
            }),
            "tools/list" => json!({"tools": [{
                "name": "pick_color",
                "description": "Ask the user to pick a color.",
                "inputSchema": {"type": "object", "properties": {}},
            }]}),
            "tools/call" => {
                waiting = Some(id);
                send(
                    json!({"jsonrpc": "2.0", "id": ELICIT_ID, "method": "elicitation/create",
                    "params": {"message": "Pick a color", "requestedSchema": {"type": "object",
                        "properties": {"color": {"type": "string", "enum": ["red", "blue"]}},
                        "required": ["color"]}}}),
                )?;
                continue;
            }
            _ => json!({}),
        };
        send(json!({"jsonrpc": "2.0", "id": id, "result": result}))?;
    }
    Ok(())
}
