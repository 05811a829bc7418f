//! `mcp-tools`: the `nanoclaw` MCP server on stdio. See the library docs; this file only wires
//! flags, logging (stderr only: stdout is the protocol), the DB and signals together.

use anyhow::Context;
use clap::Parser;
use mcp_tools::{Args, Config, NanoclawServer};
use schema::{OpenOptions, SessionDb};

fn main() -> std::process::ExitCode {
    // Before any thread exists (see `memory`).
    mcp_tools::memory::single_arena();
    // Then: the CLI that spawns this server runs as the agent's user, and a dumpable
    // process's /proc/<pid>/environ, mem and fd are open to that user.
    let dumpable = nix::sys::prctl::set_dumpable(false);
    // Flags first (clap prints usage errors and --help itself): they name the log format.
    let args = Args::parse();
    // A dead or full stderr pipe must neither panic nor block the server (see `logging`).
    let _ = logging::subscriber(
        "mcp-tools",
        mcp_tools::config::DEFAULT_LOG_FILTER,
        args.log_format.unwrap_or_default(),
    )
    .try_init();
    // Even the lines of a configuration error name the session.
    let session = args
        .db_path()
        .unwrap_or_else(|_| args.db.clone().unwrap_or_default());
    logging::set_session(session.display().to_string());
    if let Err(err) = dumpable {
        logging::fatal(&format!(
            "cannot make the process non-dumpable (prctl PR_SET_DUMPABLE): {err}; refusing to \
             run where the agent could read this process's memory (allow prctl in the \
             container's seccomp profile)"
        ));
        return std::process::ExitCode::FAILURE;
    }
    match run(args) {
        Ok(()) => {
            logging::flush_at_exit();
            std::process::ExitCode::SUCCESS
        }
        Err(err) => {
            // Once: the last words are the error line (text or JSON), not also a log line.
            logging::fatal(&format!("{err:#}"));
            // A DB on a shared filesystem has its own code: a restart does not fix it.
            if err
                .chain()
                .any(|cause| schema::shared_filesystem(cause).is_some())
            {
                return std::process::ExitCode::from(fsguard::SHARED_FILESYSTEM_EXIT);
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let config = Config::from_args(args)?;
    // One reactor thread; DB calls go to a small blocking pool: as many threads as the DB
    // front admits calls at once, and two more for stdin and stdout when they are not pipes
    // (tokio then reads and writes them on blocking threads). Few threads keep RSS low.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(mcp_tools::db::DB_CONCURRENCY + 2)
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let db = SessionDb::open_with(
            &config.db_path,
            OpenOptions {
                timezone: config.timezone,
                pool_size: u32::try_from(mcp_tools::db::DB_CONCURRENCY).unwrap_or(u32::MAX),
                cache_kib: Some(mcp_tools::db::DB_CACHE_KIB),
                ..OpenOptions::default()
            },
        )
        .with_context(|| format!("opening the session DB {}", config.db_path.display()))?;
        tracing::info!(db = %config.db_path.display(), tz = %config.timezone, "serving MCP on stdio");
        let server = NanoclawServer::new(db, config);
        let (reader, writer) = rmcp::transport::stdio_pipes();
        mcp_tools::serve(server, reader, writer, shutdown_signal()).await?;
        Ok(())
    })
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot listen for signals; stop with end of input");
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
