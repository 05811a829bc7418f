//! The Anthropic Messages API of the fake model (`POST /v1/messages`, Claude Code): its SSE
//! events for a planned reply.

use serde_json::{json, Value};

use super::reply::{split_chunks, Block, Frame, Plan, Reply};

impl Reply<'_> {
    pub(super) fn anthropic_frames(&self, plan: &Plan, frames: &mut Vec<Frame>) {
        let ev = |name: &str, data: Value| Frame::Data(format!("event: {name}\ndata: {data}\n\n"));
        frames.push(ev(
            "message_start",
            json!({"type":"message_start","message":{
                "id": self.id("msg"), "type":"message", "role":"assistant", "model": self.model,
                "content":[], "stop_reason":null, "stop_sequence":null,
                "usage": plan.usage.anthropic(plan.usage.output.min(1))}}),
        ));
        if !Self::after_start(plan, frames) {
            return;
        }
        let mut has_call = false;
        for (index, block) in plan.blocks.iter().enumerate() {
            match block {
                Block::Text {
                    text,
                    chunks,
                    delay_ms,
                } => {
                    frames.push(ev(
                        "content_block_start",
                        json!({"type":"content_block_start","index":index,
                               "content_block":{"type":"text","text":""}}),
                    ));
                    for (i, chunk) in split_chunks(text, *chunks).into_iter().enumerate() {
                        if i > 0 && *delay_ms > 0 {
                            frames.push(Frame::Sleep(*delay_ms));
                        }
                        frames.push(ev(
                            "content_block_delta",
                            json!({"type":"content_block_delta","index":index,
                                   "delta":{"type":"text_delta","text":chunk}}),
                        ));
                    }
                }
                Block::Call {
                    name, arguments, ..
                } => {
                    has_call = true;
                    frames.push(ev(
                        "content_block_start",
                        json!({"type":"content_block_start","index":index,
                               "content_block":{"type":"tool_use","id":self.id("toolu"),
                                                "name":name,"input":{}}}),
                    ));
                    frames.push(ev(
                        "content_block_delta",
                        json!({"type":"content_block_delta","index":index,
                               "delta":{"type":"input_json_delta","partial_json":arguments}}),
                    ));
                }
            }
            frames.push(ev(
                "content_block_stop",
                json!({"type":"content_block_stop","index":index}),
            ));
        }
        let stop = if has_call { "tool_use" } else { "end_turn" };
        frames.push(ev(
            "message_delta",
            json!({"type":"message_delta","delta":{"stop_reason":stop,"stop_sequence":null},
                   "usage":{"output_tokens": plan.usage.output}}),
        ));
        frames.push(ev("message_stop", json!({"type":"message_stop"})));
    }
}
