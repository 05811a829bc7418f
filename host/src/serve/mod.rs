//! `nanoclaw serve`: the session API of docs/contract/api.md, the only remote path to a session
//! DB. It runs next to the DBs (same kernel) and opens them through this crate's library, so
//! all SQL stays in `schema`.
//!
//! Map: [`cli`] (the `serve` and `token` commands) → [`Server::bind`] (listener, TLS, tokens) →
//! `router` (the table of routes; `handlers` read bodies and check scopes, `sse` serves events,
//! `openapi` the document; `state` is what they share, a leaf none of them names `router` for) →
//! the library's operations on a blocking thread. `listen` and `conn` bound every connection;
//! `tokens` and `auth` own who may do what; `audit` writes one line per mutating request.
//! `sessions` maps names to DBs and caches open ones; `errors` maps library errors to statuses.

mod audit;
mod auth;
pub mod cli;
mod conn;
mod errors;
mod handlers;
mod limits;
mod listen;
mod openapi;
mod router;
mod server;
pub mod sessions;
mod sse;
mod state;
pub mod tokens;

pub use limits::Limits;
pub use server::{Listen, ServeConfig, Server};
pub use sessions::Served;

/// The OpenAPI document of the API, as `GET /v1/openapi.json` serves it.
pub fn openapi_json() -> serde_json::Value {
    openapi::json()
}
