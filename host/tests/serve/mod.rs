//! Protocol-level tests of `nanoclaw serve` (docs/contract/api.md): a real server on loopback
//! or a unix socket, real HTTP clients (reqwest, raw sockets, curl), the DBs read through
//! `schema` to prove what each request wrote or did not write.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod access;
mod bad_input;
mod binary;
mod docs;
mod endpoints;
mod events;
mod idempotency;
mod limits;
mod listeners;
mod support;
