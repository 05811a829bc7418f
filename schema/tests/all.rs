//! The integration tests of `schema`, one binary (issue 42): each file of `tests/` is a module
//! here, named after its file.

#[path = "bad_rows.rs"]
mod bad_rows;
#[path = "db.rs"]
mod db;
