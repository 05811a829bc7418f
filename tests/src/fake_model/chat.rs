//! The OpenAI Chat Completions API of the fake model (`POST /v1/chat/completions`, OpenCode): its
//! SSE chunks for a planned reply.

use serde_json::{json, Value};

use super::reply::{split_chunks, unix_now, Block, Frame, Plan, Reply};

impl Reply<'_> {
    pub(super) fn chat_frames(&self, plan: &Plan, frames: &mut Vec<Frame>) {
        let id = self.id("chatcmpl");
        let created = unix_now();
        let chunk = |delta: Value, finish: Value| {
            let data = json!({"id":id,"object":"chat.completion.chunk","created":created,
                "model":self.model,
                "choices":[{"index":0,"delta":delta,"finish_reason":finish}]});
            Frame::Data(format!("data: {data}\n\n"))
        };
        frames.push(chunk(json!({"role":"assistant"}), Value::Null));
        if !Self::after_start(plan, frames) {
            return;
        }
        let mut call_index = 0usize;
        for block in &plan.blocks {
            match block {
                Block::Text {
                    text,
                    chunks,
                    delay_ms,
                } => {
                    for (i, c) in split_chunks(text, *chunks).into_iter().enumerate() {
                        if i > 0 && *delay_ms > 0 {
                            frames.push(Frame::Sleep(*delay_ms));
                        }
                        frames.push(chunk(json!({"content":c}), Value::Null));
                    }
                }
                Block::Call {
                    name, arguments, ..
                } => {
                    frames.push(chunk(
                        json!({"tool_calls":[{"index":call_index,"id":self.id("call"),
                            "type":"function","function":{"name":name,"arguments":""}}]}),
                        Value::Null,
                    ));
                    frames.push(chunk(
                        json!({"tool_calls":[{"index":call_index,
                            "function":{"arguments":arguments}}]}),
                        Value::Null,
                    ));
                    call_index += 1;
                }
            }
        }
        let finish = if call_index > 0 { "tool_calls" } else { "stop" };
        frames.push(chunk(json!({}), Value::from(finish)));
        if self.include_usage {
            let data = json!({"id":id,"object":"chat.completion.chunk","created":created,
                "model":self.model,"choices":[],"usage": plan.usage.chat()});
            frames.push(Frame::Data(format!("data: {data}\n\n")));
        }
        frames.push(Frame::Data("data: [DONE]\n\n".to_string()));
    }
}
