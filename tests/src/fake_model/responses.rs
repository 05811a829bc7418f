//! The OpenAI Responses API of the fake model (`POST /v1/responses`, Codex): its SSE events for
//! a planned reply.

use serde_json::{json, Value};

use super::reply::{split_chunks, unix_now, Block, Frame, Plan, Reply};

impl Reply<'_> {
    pub(super) fn responses_frames(&self, plan: &Plan, frames: &mut Vec<Frame>) {
        let mut seq = 0u64;
        let mut ev = |name: &str, mut data: Value| {
            if let Some(obj) = data.as_object_mut() {
                obj.insert("type".into(), Value::from(name));
                obj.insert("sequence_number".into(), Value::from(seq));
            }
            seq += 1;
            Frame::Data(format!("event: {name}\ndata: {data}\n\n"))
        };
        let resp_id = self.id("resp");
        let created = unix_now();
        let response = |status: &str, output: Value, usage: Value| {
            json!({"id": resp_id, "object":"response", "created_at": created, "status": status,
                   "model": self.model, "output": output, "usage": usage})
        };
        frames.push(ev(
            "response.created",
            json!({"response": response("in_progress", json!([]), Value::Null)}),
        ));
        frames.push(ev(
            "response.in_progress",
            json!({"response": response("in_progress", json!([]), Value::Null)}),
        ));
        if !Self::after_start(plan, frames) {
            return;
        }
        let mut output = Vec::new();
        for (oi, block) in plan.blocks.iter().enumerate() {
            match block {
                Block::Text {
                    text,
                    chunks,
                    delay_ms,
                } => {
                    let item_id = self.id("msg");
                    frames.push(ev(
                        "response.output_item.added",
                        json!({"output_index":oi,"item":{"id":item_id,"type":"message",
                               "status":"in_progress","role":"assistant","content":[]}}),
                    ));
                    frames.push(ev(
                        "response.content_part.added",
                        json!({"item_id":item_id,"output_index":oi,"content_index":0,
                               "part":{"type":"output_text","text":"","annotations":[]}}),
                    ));
                    for (i, chunk) in split_chunks(text, *chunks).into_iter().enumerate() {
                        if i > 0 && *delay_ms > 0 {
                            frames.push(Frame::Sleep(*delay_ms));
                        }
                        frames.push(ev(
                            "response.output_text.delta",
                            json!({"item_id":item_id,"output_index":oi,"content_index":0,
                                   "delta":chunk,"logprobs":[]}),
                        ));
                    }
                    frames.push(ev(
                        "response.output_text.done",
                        json!({"item_id":item_id,"output_index":oi,"content_index":0,
                               "text":text,"logprobs":[]}),
                    ));
                    let part = json!({"type":"output_text","text":text,"annotations":[]});
                    frames.push(ev(
                        "response.content_part.done",
                        json!({"item_id":item_id,"output_index":oi,"content_index":0,
                               "part":part}),
                    ));
                    let item = json!({"id":item_id,"type":"message","status":"completed",
                                      "role":"assistant","content":[part]});
                    frames.push(ev(
                        "response.output_item.done",
                        json!({"output_index":oi,"item":item}),
                    ));
                    output.push(item);
                }
                Block::Call {
                    name,
                    namespace,
                    arguments,
                } => {
                    let item_id = self.id("fc");
                    let call_id = self.id("call");
                    let mut item = json!({"id":item_id,"type":"function_call",
                        "status":"in_progress","name":name,"call_id":call_id,"arguments":""});
                    if let (Some(ns), Some(obj)) = (namespace, item.as_object_mut()) {
                        obj.insert("namespace".into(), Value::from(ns.clone()));
                    }
                    frames.push(ev(
                        "response.output_item.added",
                        json!({"output_index":oi,"item":item}),
                    ));
                    frames.push(ev(
                        "response.function_call_arguments.delta",
                        json!({"item_id":item_id,"output_index":oi,"delta":arguments}),
                    ));
                    frames.push(ev(
                        "response.function_call_arguments.done",
                        json!({"item_id":item_id,"output_index":oi,"arguments":arguments}),
                    ));
                    if let Some(obj) = item.as_object_mut() {
                        obj.insert("status".into(), Value::from("completed"));
                        obj.insert("arguments".into(), Value::from(arguments.clone()));
                    }
                    frames.push(ev(
                        "response.output_item.done",
                        json!({"output_index":oi,"item":item}),
                    ));
                    output.push(item);
                }
            }
        }
        frames.push(ev(
            "response.completed",
            json!({"response": response("completed", Value::Array(output), plan.usage.responses())}),
        ));
    }
}
