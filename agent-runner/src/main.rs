//! `agent-runner`: runs inside an agent's container, polls the session DB for inbound messages,
//! formats them into prompts and drives a coding-agent CLI through the `AgentProvider` trait.

use std::path::PathBuf;
use std::process::ExitCode;

use agent_runner::app::{self, Command};
use agent_runner::config;
use clap::Parser;
use logging::LogFormat;
use provider::ProviderKind;

/// Drives a coding-agent CLI (Claude Code, Codex, OpenCode) from a per-session SQLite DB.
#[derive(Debug, Parser)]
#[command(
    name = "agent-runner",
    version,
    after_help = format!("{}\n{}", config::keys_help(), logging::help(app::DEFAULT_LOG_FILTER))
)]
struct Cli {
    /// Workspace root (env WORKSPACE_DIR) [default: /workspace].
    #[arg(long, global = true, env = "WORKSPACE_DIR")]
    workspace: Option<PathBuf>,
    /// Session DB (env SESSION_DB) [default: <workspace>/session.db].
    #[arg(long, global = true)]
    db: Option<PathBuf>,
    // The help names the providers from `ProviderKind`, the one list of them.
    #[arg(
        long,
        global = true,
        help = format!(
            "Provider: {} (env AGENT_PROVIDER) [default: claude]",
            ProviderKind::names(", ")
        )
    )]
    provider: Option<String>,
    /// Model for the selected provider (env CLAUDE_MODEL / CODEX_MODEL / OPENCODE_MODEL / GEMINI_MODEL / QWEN_MODEL).
    #[arg(long, global = true)]
    model: Option<String>,
    /// Startup config file (env NANOCLAW_CONFIG) [default: <workspace>/config.json]; a named
    /// file must exist.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Any setting as KEY=VALUE (keys below); repeatable; wins over env and config.json.
    #[arg(long = "set", global = true, value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Log lines on stderr: text, or json for one JSON object per line (env NANOCLAW_LOG_FORMAT,
    /// key logFormat) [default: text].
    #[arg(long, global = true, value_name = "text|json")]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Option<Command>,
}

fn main() -> ExitCode {
    // First of all: the agent's processes run as the same user (or as the user the runner drops
    // to), and a dumpable process's /proc/<pid>/environ, mem and fd are open to that user; the
    // runner's environment holds the host's secrets and the model key.
    let dumpable = agent_runner::privileges::make_non_dumpable();
    // Before any thread starts: every thread shares one malloc arena, whose freed top is kept
    // (see `malloc.rs`).
    let single_arena = agent_runner::malloc::single_arena();
    let kept_heap_top = agent_runner::malloc::keep_heap_top();
    let cli = Cli::parse();
    app::init_logging(cli.log_format);
    if let Err(err) = dumpable {
        logging::fatal(&format!("{err:#}"));
        return ExitCode::from(1);
    }
    tracing::debug!(single_arena, kept_heap_top, "malloc tuned");
    // One thread runs the loop, the CLI's I/O, the heartbeat's timer and the credential proxy:
    // a message then costs no wake-up of another thread (measured: CPU per message 0.83-0.94 ms
    // against 0.97-1.30 ms with two workers, docs/decisions/perf.md#D-PERF-04). DB calls
    // on it wait at most `runner::INLINE_LOCK_WAIT` for a lock; longer work goes to the
    // blocking pool.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(8)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            logging::fatal(&format!("cannot start the async runtime: {err}"));
            return ExitCode::from(1);
        }
    };
    let main = app::main(app::Args {
        workspace: cli.workspace,
        db: cli.db,
        provider: cli.provider,
        model: cli.model,
        config: cli.config,
        set: cli.set,
        log_format: cli.log_format,
        command: cli.command.unwrap_or(Command::Run),
    });
    // The runner runs as a task, not as `block_on`'s own future: waking that future writes the
    // driver's eventfd (a syscall, then an extra epoll round) even from the runtime's own
    // thread, and the loop is woken a few times per message (the provider's events, its
    // channels); a task woken there is queued without a syscall
    // (docs/decisions/perf.md#D-PERF-06).
    let outcome = runtime.block_on(async {
        match tokio::spawn(main).await {
            Ok(outcome) => outcome,
            Err(err) => Err(anyhow::anyhow!("the runner's main task failed: {err}")),
        }
    });
    match outcome {
        Ok(()) => {
            logging::flush_at_exit();
            ExitCode::SUCCESS
        }
        Err(err) => {
            // Once: the last words are the error line (text or JSON), not also a log line.
            logging::fatal(&format!("{err:#}"));
            // A DB on a shared filesystem has its own code: a restart does not fix it.
            if err
                .chain()
                .any(|cause| schema::shared_filesystem(cause).is_some())
            {
                return ExitCode::from(fsguard::SHARED_FILESYSTEM_EXIT);
            }
            ExitCode::from(1)
        }
    }
}
