//! End-to-end test support for the NanoClaw agent-runner.
//!
//! * [`fake_model`]: a scripted fake model server speaking the Anthropic Messages, OpenAI
//!   Responses and OpenAI Chat Completions streaming APIs on 127.0.0.1.
//! * [`harness`]: a session workspace, the real runner, mcp-tools and host CLI, on loopback.

pub mod fake_model;
pub mod harness;
