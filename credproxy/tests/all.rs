//! The integration tests of `credproxy`, one binary (issue 42): each file of `tests/` is a module
//! here, named after its file. `read_buffer` keeps a binary of its own (see `Cargo.toml`).

#[path = "common/mod.rs"]
mod common;
#[path = "mcp.rs"]
mod mcp;
#[path = "proxy.rs"]
mod proxy;
