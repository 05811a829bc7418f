//! The integration tests of `acp`, one binary (issue 42): each file of `tests/` is a module here,
//! named after its file.

#[path = "fake_agent.rs"]
mod fake_agent;
