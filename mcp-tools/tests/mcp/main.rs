//! Integration tests: spawn the built `mcp-tools` binary, speak raw JSON-RPC on its stdio and
//! assert the rows it writes into the session DB. One test binary, modules by concern.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod admin;
mod bad_input;
mod concurrency;
mod files;
mod inspector;
mod logs;
mod messages;
mod paths;
mod protocol;
mod question;
mod shared_fs;
mod support;
mod tasks;
