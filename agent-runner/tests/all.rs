//! The integration tests of `agent-runner`, one binary (issue 42): each file of `tests/` is a
//! module here, named after its file. Two tests keep a binary of their own (see `Cargo.toml`):
//! `malloc_heap_top` (no test harness) and `malloc_arena` (no other test's threads).

#[path = "support/binary.rs"]
mod binary;
#[path = "support/chaos.rs"]
mod chaos_run;
#[path = "common/mod.rs"]
mod common;
#[path = "support/dockerfile.rs"]
mod dockerfile;

#[path = "approvals.rs"]
mod approvals;
#[path = "archive_hook.rs"]
mod archive_hook;
#[path = "attachments.rs"]
mod attachments;
#[path = "bad_rows.rs"]
mod bad_rows;
#[path = "budgets.rs"]
mod budgets;
#[path = "chaos.rs"]
mod chaos;
#[path = "config_cli.rs"]
mod config_cli;
#[path = "container.rs"]
mod container;
#[path = "db_files.rs"]
mod db_files;
#[path = "db_identity.rs"]
mod db_identity;
#[path = "disk_full.rs"]
mod disk_full;
#[path = "dumpable.rs"]
mod dumpable;
#[path = "health.rs"]
mod health;
#[path = "hot_path.rs"]
mod hot_path;
#[path = "kubernetes.rs"]
mod kubernetes;
#[path = "leftovers.rs"]
mod leftovers;
#[path = "lock_file.rs"]
mod lock_file;
#[path = "logs.rs"]
mod logs;
#[path = "loop.rs"]
mod main_loop;
#[path = "paths.rs"]
mod paths;
#[path = "process.rs"]
mod process;
#[path = "shared_fs.rs"]
mod shared_fs;
#[path = "signals.rs"]
mod signals;
#[path = "tasks.rs"]
mod tasks;
