//! The integration tests of `e2e`, one binary (issue 42): each file of `tests/` is a module here,
//! named after its file (`e2e_claude::…`, `provider_codex::…`). The per-CLI files stay apart so that
//! a filter picks one CLI (`-E 'test(/^e2e_codex::/)'`); the scenarios they run are declared once
//! in `src/` (`scenario_tests!`, `provider_scenario_tests!`).

#[path = "acp_cli.rs"]
mod acp_cli;
#[path = "archive_claude.rs"]
mod archive_claude;
#[path = "archive_codex.rs"]
mod archive_codex;
#[path = "archive_opencode.rs"]
mod archive_opencode;
#[path = "demo_script.rs"]
mod demo_script;
#[path = "e2e_acp.rs"]
mod e2e_acp;
#[path = "e2e_claude.rs"]
mod e2e_claude;
#[path = "e2e_codex.rs"]
mod e2e_codex;
#[path = "e2e_media_prompt.rs"]
mod e2e_media_prompt;
#[path = "e2e_mock.rs"]
mod e2e_mock;
#[path = "e2e_opencode.rs"]
mod e2e_opencode;
#[path = "fake_model_cli.rs"]
mod fake_model_cli;
#[path = "image.rs"]
mod image;
#[path = "inspect_script.rs"]
mod inspect_script;
#[path = "install_clis.rs"]
mod install_clis;
#[path = "provider_claude.rs"]
mod provider_claude;
#[path = "provider_codex.rs"]
mod provider_codex;
#[path = "provider_opencode.rs"]
mod provider_opencode;
#[path = "self_contained.rs"]
mod self_contained;
