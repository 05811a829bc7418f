//! Transcript archiving (issue 5) for the Codex provider, end to end: after each query the real
//! `agent-runner` reads the new turns back from the real pinned `codex app-server`
//! (`thread/turns/list`) and writes what no earlier archive holds as Markdown into
//! `<workspace>/agent/conversations/`.
//!
//! The scenarios are shared with the other CLIs (`e2e::scenarios`); each test here runs one of
//! them for this CLI.
//!
//! Needs `cargo build --workspace --bins` and the codex CLI (`scripts/install-clis.sh`); a
//! missing CLI fails the tests unless `NANOCLAW_SKIP_CLI_TESTS=1`.

const CLI: &str = "codex";

e2e::scenario_tests! { CLI;
    /// A query with a send_message call and a text answer is archived after it completes (the
    /// user's text, the tool call summarised, the reply); the next query's entries are added to the
    /// same day's archive of the session, without losing or repeating anything.
    each_query_is_archived_without_losing_earlier_entries();

    /// After a restart the runner resumes the thread in a new app-server; the next archive holds
    /// only the entries after the ones archived before the restart.
    archiving_after_a_restart_adds_only_the_new_entries();
}
