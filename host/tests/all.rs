//! The integration tests of `host` (`nanoclaw`), one binary (issue 42): each file of `tests/` is
//! a module here, named after its file; `serve/` is the protocol-level suite of `nanoclaw serve`.

#[path = "bad_rows.rs"]
mod bad_rows;
#[path = "cli.rs"]
mod cli;
#[path = "fleet.rs"]
mod fleet;
#[path = "lib_api.rs"]
mod lib_api;
#[path = "logs.rs"]
mod logs;
#[path = "remote.rs"]
mod remote;
#[path = "serve/mod.rs"]
mod serve;
#[path = "shared_fs.rs"]
mod shared_fs;
