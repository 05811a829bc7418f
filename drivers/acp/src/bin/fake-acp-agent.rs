//! A scripted ACP agent for the driver's tests (`drivers/acp/tests/fake_agent.rs`): JSON-RPC
//! over stdio like a real agent, its behaviour per prompt read from `FAKE_ACP` (JSON), every
//! message it receives appended to `FAKE_ACP_LOG`, and the number of prompts answered so far
//! kept in `FAKE_ACP_STATE` (so a restarted agent goes on with the next turn of the script).
//!
//! `FAKE_ACP`: `{"loadSession": bool, "loadFails": bool, "image": bool, "authRequired": bool,
//! "usage": {..}, "turns": [[step, ..], ..]}`. Steps: `{"say": text}`, `{"echo": true}` (the
//! prompt's text blocks, joined), `{"tool": {toolCall}}`, `{"toolDone": id}`,
//! `{"permission": {toolCall}}` (says the chosen option), `{"ext": method}` (an extension
//! request; says the answer's error code), `{"waitCancel": true}`, `{"sleep": ms}`,
//! `{"exit": code}`, `{"garbage": text}`, `{"error": {"code", "message"}}`. A prompt past the
//! script echoes.

use std::io::{BufRead, Write};

use serde_json::{json, Value};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Agent {
    config: Value,
    lines: std::io::Lines<std::io::StdinLock<'static>>,
    log: Option<std::fs::File>,
    next_id: i64,
    sessions: u32,
}

impl Agent {
    fn send(&self, message: Value) -> Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{message}")?;
        out.flush()?;
        Ok(())
    }

    /// The next message from the client; `None` at EOF.
    fn read(&mut self) -> Result<Option<Value>> {
        let Some(line) = self.lines.next().transpose()? else {
            return Ok(None);
        };
        if let Some(log) = self.log.as_mut() {
            writeln!(log, "{line}")?;
        }
        Ok(Some(serde_json::from_str(&line)?))
    }

    fn flag(&self, name: &str) -> bool {
        self.config
            .get(name)
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    fn say(&self, session: &str, text: &str) -> Result<()> {
        self.send(json!({"jsonrpc": "2.0", "method": "session/update", "params": {
            "sessionId": session,
            "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}},
        }}))
    }

    fn update(&self, session: &str, update: Value) -> Result<()> {
        self.send(
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {
                "sessionId": session, "update": update,
            }}),
        )
    }

    /// Sends a request and reads until its answer; `cancelled` notes a `session/cancel` read
    /// meanwhile.
    fn call(&mut self, method: &str, params: Value, cancelled: &mut bool) -> Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        loop {
            let Some(message) = self.read()? else {
                return Err("EOF while waiting for an answer".into());
            };
            if message.get("method").and_then(Value::as_str) == Some("session/cancel") {
                *cancelled = true;
                continue;
            }
            if message.get("id") == Some(&json!(id)) && message.get("method").is_none() {
                return Ok(message);
            }
        }
    }

    fn turn(&self) -> Vec<Value> {
        let state = std::env::var("FAKE_ACP_STATE").ok();
        let count: usize = state
            .as_deref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if let Some(path) = state {
            let _ = std::fs::write(path, (count + 1).to_string());
        }
        self.config
            .get("turns")
            .and_then(Value::as_array)
            .and_then(|turns| turns.get(count))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_else(|| vec![json!({"echo": true})])
    }

    fn prompt(&mut self, id: &Value, params: &Value) -> Result<()> {
        let session = params
            .get("sessionId")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let text: Vec<String> = params
            .get("prompt")
            .and_then(Value::as_array)
            .map(|blocks| {
                blocks
                    .iter()
                    .map(|b| match b.get("type").and_then(Value::as_str) {
                        Some("text") => b
                            .get("text")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                        Some(other) => format!("[{other}]"),
                        None => String::new(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut cancelled = false;
        for step in self.turn() {
            if let Some(text) = step.get("say").and_then(Value::as_str) {
                self.say(&session, text)?;
            } else if step.get("echo").is_some() {
                self.say(&session, &format!("echo: {}", text.join(" + ")))?;
            } else if let Some(call) = step.get("tool") {
                let mut update = call.clone();
                update["sessionUpdate"] = json!("tool_call");
                update["status"] = json!("pending");
                self.update(&session, update)?;
            } else if let Some(call_id) = step.get("toolDone") {
                self.update(
                    &session,
                    json!({"sessionUpdate": "tool_call_update",
                    "toolCallId": call_id, "status": "completed",
                    "content": [{"type": "content", "content": {"type": "text", "text": "done"}}]}),
                )?;
            } else if let Some(call) = step.get("permission") {
                let params = json!({"sessionId": session, "toolCall": call, "options": [
                    {"optionId": "proceed_always", "name": "Always", "kind": "allow_always"},
                    {"optionId": "proceed_once", "name": "Once", "kind": "allow_once"},
                    {"optionId": "cancel", "name": "Cancel", "kind": "reject_once"},
                ]});
                let answer = self.call("session/request_permission", params, &mut cancelled)?;
                let outcome = &answer["result"]["outcome"];
                let chosen = outcome
                    .get("optionId")
                    .and_then(Value::as_str)
                    .or_else(|| outcome.get("outcome").and_then(Value::as_str))
                    .unwrap_or("?")
                    .to_owned();
                if cancelled {
                    break;
                }
                self.say(&session, &format!("permission: {chosen}"))?;
            } else if let Some(method) = step.get("ext").and_then(Value::as_str) {
                let answer = self.call(method, json!({"sessionId": session}), &mut cancelled)?;
                let code = answer["error"]["code"].clone();
                self.say(&session, &format!("ext: {code}"))?;
            } else if step.get("waitCancel").is_some() {
                while !cancelled {
                    let Some(message) = self.read()? else {
                        return Ok(());
                    };
                    if message.get("method").and_then(Value::as_str) == Some("session/cancel") {
                        cancelled = true;
                    }
                }
            } else if let Some(ms) = step.get("sleep").and_then(Value::as_u64) {
                std::thread::sleep(std::time::Duration::from_millis(ms));
            } else if let Some(code) = step.get("exit").and_then(Value::as_i64) {
                std::process::exit(i32::try_from(code).unwrap_or(1));
            } else if let Some(text) = step.get("garbage").and_then(Value::as_str) {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{text}")?;
                out.flush()?;
            } else if let Some(error) = step.get("error") {
                return self.send(json!({"jsonrpc": "2.0", "id": id, "error": error}));
            }
        }
        let mut result = json!({"stopReason": if cancelled { "cancelled" } else { "end_turn" }});
        if let Some(usage) = self.config.get("usage") {
            result["usage"] = usage.clone();
        }
        self.send(json!({"jsonrpc": "2.0", "id": id, "result": result}))
    }

    fn serve(&mut self) -> Result<()> {
        while let Some(message) = self.read()? {
            let (Some(id), Some(method)) = (
                message.get("id").cloned(),
                message
                    .get("method")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            ) else {
                continue;
            };
            let params = message.get("params").cloned().unwrap_or(Value::Null);
            let answer = match method.as_str() {
                "initialize" => json!({"result": {
                    "protocolVersion": 1,
                    "agentCapabilities": {
                        "loadSession": self.flag("loadSession"),
                        "promptCapabilities": {"image": self.flag("image")},
                        "mcpCapabilities": {"http": true},
                    },
                    "authMethods": [{"id": "api-key", "name": "API key"}],
                }}),
                "session/new" if self.flag("authRequired") => {
                    json!({"error": {"code": -32000, "message": "Authentication required"}})
                }
                "session/new" => {
                    self.sessions += 1;
                    let session = format!("fake-{}-{}", std::process::id(), self.sessions);
                    json!({"result": {"sessionId": session}})
                }
                "session/load" if self.flag("loadFails") => json!({"error": {
                    "code": -32603, "message": "No previous sessions found for this project."}}),
                "session/load" => {
                    let session = params["sessionId"].as_str().unwrap_or_default().to_owned();
                    self.update(
                        &session,
                        json!({"sessionUpdate": "user_message_chunk",
                        "content": {"type": "text", "text": "replayed"}}),
                    )?;
                    json!({"result": null})
                }
                "session/prompt" => {
                    self.prompt(&id, &params)?;
                    continue;
                }
                other => json!({"error": {"code": -32601, "message": format!("no {other}")}}),
            };
            let mut reply = answer;
            reply["jsonrpc"] = json!("2.0");
            reply["id"] = id;
            self.send(reply)?;
        }
        Ok(())
    }
}

fn main() -> Result<()> {
    let config = match std::env::var("FAKE_ACP") {
        Ok(text) => serde_json::from_str(&text)?,
        Err(_) => json!({}),
    };
    let log = match std::env::var("FAKE_ACP_LOG") {
        Ok(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        ),
        Err(_) => None,
    };
    let mut agent = Agent {
        config,
        lines: std::io::stdin().lock().lines(),
        log,
        next_id: 1000,
        sessions: 0,
    };
    agent.serve()
}
