//! End-to-end test support for the NanoClaw agent-runner.
//!
//! * [`fake_model`]: a scripted fake model server speaking the Anthropic Messages, OpenAI
//!   Responses, OpenAI Chat Completions and Gemini streaming APIs on 127.0.0.1.
//! * [`acp_harness`]: the ACP agents (Gemini CLI, Qwen Code) configured to run offline against
//!   the fake model, and a small Agent Client Protocol client that drives them.
//! * [`harness`]: a session workspace, the real runner, mcp-tools and host CLI, on loopback;
//!   CLI lookup, netns re-exec, row, request, process and archive helpers.
//! * [`provider_harness`]: a provider driven directly against its real CLI and the fake model
//!   (setup, child re-exec with a marker secret, event collection).
//! * [`provider_scenarios`]: the provider-level scenarios shared by every CLI, each generic over
//!   the provider under test with the per-CLI differences as data (the `provider_<cli>.rs`
//!   tests declare them with `provider_scenario_tests!`).
//! * [`scenarios`]: the acceptance and archiving scenarios shared by every CLI, each a function
//!   taking the provider name (the `e2e_<cli>.rs` / `archive_<cli>.rs` tests call them).
//! * [`stalls`], [`stops`], [`leftovers`], [`credentials`], [`secrets`]: the fault scenarios
//!   (a gateway that is down or stalls, signals mid-turn, processes that outlive a run, the
//!   credential proxy, secrets the agent could read), re-exported by [`scenarios`] so that
//!   `scenario_tests!` finds them.
//! * [`usage_scenarios`]: usage and budgets (issue 14): the ledger's figures, a budget that
//!   holds the queue, a crash before the ledger write; re-exported by [`scenarios`] too.
//! * [`turn_scenarios`]: turn control (issue 15): `/stop`, message blocks delivered as they are
//!   written, progress rows, `/model`; re-exported by [`scenarios`] too.
//! * [`remote_mcp`]: a small streamable-HTTP MCP server on loopback that records the headers it
//!   gets (issue 16, remote MCP servers); [`remote_mcp_scenarios`]: every CLI calls it through
//!   the runner's proxy with a header secret it never holds (`remote_mcp_scenario_tests!`).
//! * [`api_scenarios`]: send → reply, question → answer and interrupt with the host side only
//!   through `nanoclaw --url` against `nanoclaw serve`, as a user that cannot read the session
//!   folder (issue 40, `api_scenario_tests!`); re-exported by [`scenarios`] too.
//! * [`policy_scenarios`]: tool policy (issue 16): a deny rule, ask answered Deny / Approve / not
//!   at all or stopped, an approval stop; re-exported by [`scenarios`] too.
//! * [`questions`]: scenario 7, a question answered with `nanoclaw answer` (also run by
//!   [`stalls`] with a lowered progress limit); re-exported by [`scenarios`] too.
//! * [`support`]: what every scenario module shares (the step bound [`support::WAIT`], the
//!   panicking unwraps, per-CLI user texts and processes), below them all; re-exported by
//!   [`scenarios`].

pub mod acp_harness;
pub mod api_scenarios;
pub mod credentials;
pub mod fake_model;
pub mod harness;
pub mod leftovers;
pub mod policy_scenarios;
pub mod provider_harness;
pub mod provider_scenarios;
pub mod questions;
pub mod remote_mcp;
pub mod remote_mcp_scenarios;
pub mod scenarios;
pub mod secrets;
pub mod stalls;
pub mod stops;
pub mod support;
pub mod turn_scenarios;
pub mod usage_scenarios;
