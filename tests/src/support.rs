//! The small pieces every scenario module shares: the bound of a step, the panicking unwraps
//! (the library denies `unwrap`/`expect`) and what the scenarios know per CLI (its user texts,
//! its process). Below `scenarios.rs` and the scenario modules it re-exports, so that none of
//! them imports another to reach these; `scenarios.rs` re-exports them for the test files.

use std::fmt::Debug;
use std::time::Duration;

use crate::fake_model::{FakeModel, LoggedRequest, Step};
use crate::harness::{claude_user_texts, codex_user_texts, descendants_matching, Session};

/// How long each step of a scenario may take.
pub const WAIT: Duration = Duration::from_secs(60);

/// The value of `result`, or a panic naming `what`.
pub fn ok<T, E: Debug>(result: Result<T, E>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(err) => panic!("{what}: {err:?}"),
    }
}

/// The value of `option`, or a panic naming `what`.
pub fn some<T>(option: Option<T>, what: &str) -> T {
    match option {
        Some(value) => value,
        None => panic!("{what}: none"),
    }
}

/// A fake model serving `steps` in order.
pub(crate) fn fake_model(steps: impl IntoIterator<Item = Step>) -> FakeModel {
    ok(
        FakeModel::start_with_script(steps),
        "starting the fake model",
    )
}

/// The user texts of a model request as the provider's CLI sends them (Claude's text blocks,
/// Codex's without its `<environment_context>`, OpenCode's Chat messages).
pub fn user_texts(provider: &str, request: &LoggedRequest) -> Vec<String> {
    match provider {
        "claude" => claude_user_texts(request),
        "codex" => codex_user_texts(request),
        "opencode" => request.user_texts(),
        other => panic!("no user texts known for provider {other}: add it to user_texts"),
    }
}

/// A piece of the command line of the CLI process the runner starts for `provider`.
fn cli_process_needle(provider: &str) -> &'static str {
    match provider {
        "claude" => "--input-format stream-json",
        "codex" => "app-server",
        "opencode" => "opencode serve",
        other => panic!("no CLI process known for provider {other}: add it to cli_process_needle"),
    }
}

/// The CLI processes under the session's runner (`claude -p`, `codex app-server`,
/// `opencode serve`).
pub fn cli_pids(session: &Session, provider: &str) -> Vec<u32> {
    let runner = some(session.runner_pid(), "the runner is running");
    descendants_matching(runner, cli_process_needle(provider))
}
