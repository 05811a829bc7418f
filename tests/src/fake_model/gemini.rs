//! The Gemini API of the fake model (`POST /v1beta/models/{model}:streamGenerateContent?alt=sse`
//! and `:generateContent`, Gemini CLI): its SSE chunks and JSON body for a planned reply, its
//! error shape, and the JSON that answers a structured (schema) request.
//!
//! Each SSE event is one `GenerateContentResponse` on a `data:` line (no event names). Text is a
//! `{"text":..}` part per chunk, a tool call a `{"functionCall":{"name","args"}}` part; the last
//! chunk carries `finishReason: "STOP"` and `usageMetadata`. The first event is a model content
//! with no parts, which Gemini CLI accepts and keeps nothing of (what a hang sends first).

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::reply::{split_chunks, Block, Frame, Plan, Reply, StepUsage};

/// The path prefix of the Gemini API (the model and the method follow it).
pub const GEMINI_PREFIX: &str = "/v1beta/models/";

/// `(model, stream)` of a Gemini API path `/v1beta/models/{model}:streamGenerateContent` or
/// `…:generateContent`; `None` for any other path.
pub(super) fn split_path(path: &str) -> Option<(&str, bool)> {
    let rest = path.strip_prefix(GEMINI_PREFIX)?;
    let (model, method) = rest.rsplit_once(':')?;
    if model.is_empty() || model.contains('/') {
        return None;
    }
    match method {
        "streamGenerateContent" => Some((model, true)),
        "generateContent" => Some((model, false)),
        _ => None,
    }
}

/// Google's error body: `{"error":{"code","message","status"}}` with the status name Google
/// gives each HTTP status.
pub(super) fn error_body(status: StatusCode, message: &str) -> Value {
    let name = match status.as_u16() {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    };
    json!({"error":{"code":status.as_u16(),"message":message,"status":name}})
}

/// A JSON value shaped by the JSON schema `schema` (also Gemini's `responseSchema`, whose
/// types are upper case): objects get every property, arrays their `minItems` items, strings the
/// first `enum` value or `"fake"`, numbers their `minimum` or 0, booleans false; `anyOf` /
/// `oneOf` take the first branch. `null` (no schema) gives `{}`.
pub fn schema_instance(schema: &Value) -> Value {
    schema_instance_at(schema, 0)
}

fn schema_instance_at(schema: &Value, depth: usize) -> Value {
    if depth > 16 {
        return Value::Null;
    }
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    if let Some(value) = schema.get("const") {
        return value.clone();
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(first) = schema
            .get(key)
            .and_then(Value::as_array)
            .and_then(|b| b.first())
        {
            return schema_instance_at(first, depth + 1);
        }
    }
    let ty = match schema.get("type") {
        Some(Value::String(t)) => t.to_ascii_lowercase(),
        // ["string", "null"]: the first type that is not null.
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| !t.eq_ignore_ascii_case("null"))
            .unwrap_or("null")
            .to_ascii_lowercase(),
        _ if schema.get("properties").is_some() || schema.is_null() => "object".to_owned(),
        _ => "string".to_owned(),
    };
    match ty.as_str() {
        "object" => {
            let mut out = serde_json::Map::new();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (name, sub) in props {
                    out.insert(name.clone(), schema_instance_at(sub, depth + 1));
                }
            }
            Value::Object(out)
        }
        "array" => {
            let n = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0);
            let item = schema.get("items").cloned().unwrap_or(Value::Null);
            Value::Array(
                (0..n.min(8))
                    .map(|_| schema_instance_at(&item, depth + 1))
                    .collect(),
            )
        }
        "integer" | "number" => schema.get("minimum").cloned().unwrap_or(json!(0)),
        "boolean" => Value::Bool(false),
        "null" => Value::Null,
        _ => Value::from("fake"),
    }
}

impl Reply<'_> {
    /// The `parts` of a reply's blocks (text, `functionCall`).
    fn gemini_part(block: &Block) -> Value {
        match block {
            Block::Text { text, .. } => json!({"text": text}),
            Block::Call {
                name, arguments, ..
            } => json!({"functionCall":{"name": name,
                "args": serde_json::from_str::<Value>(arguments).unwrap_or_else(|_| json!({}))}}),
        }
    }

    pub(super) fn gemini_frames(&self, plan: &Plan, frames: &mut Vec<Frame>) {
        let response_id = self.id("resp");
        let chunk = |parts: Vec<Value>, last: bool| {
            let mut candidate = json!({"content":{"role":"model","parts":parts},"index":0});
            let mut data = json!({"candidates":[], "modelVersion": self.model,
                                  "responseId": response_id});
            if last {
                candidate["finishReason"] = Value::from("STOP");
                data["usageMetadata"] = plan.usage.gemini();
            }
            data["candidates"] = json!([candidate]);
            Frame::Data(format!("data: {data}\r\n\r\n"))
        };
        frames.push(chunk(Vec::new(), false));
        if !Self::after_start(plan, frames) {
            return;
        }
        // Every piece of content, each its own chunk; the last one carries the finish reason and
        // the usage (or a chunk of its own when there is no content).
        let mut pieces: Vec<(Value, u64)> = Vec::new();
        for block in &plan.blocks {
            match block {
                Block::Text {
                    text,
                    chunks,
                    delay_ms,
                } => {
                    for (i, c) in split_chunks(text, *chunks).into_iter().enumerate() {
                        let pause = if i > 0 { *delay_ms } else { 0 };
                        pieces.push((json!({"text": c}), pause));
                    }
                }
                call @ Block::Call { .. } => pieces.push((Self::gemini_part(call), 0)),
            }
        }
        if pieces.is_empty() {
            frames.push(chunk(Vec::new(), true));
            return;
        }
        let count = pieces.len();
        for (i, (part, pause)) in pieces.into_iter().enumerate() {
            if pause > 0 {
                frames.push(Frame::Sleep(pause));
            }
            frames.push(chunk(vec![part], i + 1 == count));
        }
    }

    /// The non-streaming `generateContent` body.
    pub(super) fn gemini_body(&self, blocks: &[Block], usage: &StepUsage) -> Value {
        let parts: Vec<Value> = blocks.iter().map(Self::gemini_part).collect();
        json!({"candidates":[{"content":{"role":"model","parts":parts},
                              "finishReason":"STOP","index":0}],
               "usageMetadata": usage.gemini(),
               "modelVersion": self.model,
               "responseId": self.id("resp")})
    }
}
