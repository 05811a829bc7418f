//! `nanoclaw`: the host CLI for one agent session DB. See `nanoclaw --help`.

mod output;
mod remote;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use chrono::Utc;
use clap::{Args, Parser, Subcommand, ValueEnum};
use schema::{Routing, SweepPolicy};

use host::{AnswerRequest, InitOptions, Quote, SendKind, SendRequest, WatchOptions};

/// Host CLI for a NanoClaw agent session: create the workspace and session DB, post inbound
/// messages, follow the agent's replies, answer its questions, sweep stale claims, show status,
/// usage and cost, stop a running turn.
#[derive(Debug, Parser)]
#[command(
    name = "nanoclaw",
    version,
    propagate_version = true,
    after_help = logging::help(DEFAULT_LOG_FILTER)
)]
struct Cli {
    /// Session DB path [default: <workspace>/session.db with --workspace, else env SESSION_DB]
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        display_order = 899,
        conflicts_with = "url"
    )]
    db: Option<PathBuf>,

    /// Workspace root: for every command it means the DB <DIR>/session.db (winning over
    /// SESSION_DB); init creates the tree there [default for init: the folder of the DB]
    #[arg(
        long,
        global = true,
        value_name = "DIR",
        display_order = 900,
        conflicts_with = "url"
    )]
    workspace: Option<PathBuf>,

    #[command(flatten)]
    api: remote::ApiArgs,

    /// Machine-readable output: JSON (one object per line for watch)
    #[arg(long, global = true, display_order = 901)]
    json: bool,

    /// Log lines on stderr: text, or json for one JSON object per line [default: text]
    #[arg(
        long,
        global = true,
        env = logging::LOG_FORMAT_ENV,
        value_name = "text|json",
        display_order = 902
    )]
    log_format: Option<logging::LogFormat>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the workspace tree and the session DB (idempotent); set routing and destinations
    Init(InitArgs),
    /// Insert a messages_in row (chat, task, webhook, system, chat-sdk)
    Send(Box<SendArgs>),
    /// Print messages_out rows as they arrive
    Watch(WatchArgs),
    /// Answer an ask_user_question with a system question_response row
    Answer(AnswerArgs),
    /// Reset stale processing rows with backoff; fail rows out of tries
    Sweep(SweepArgs),
    /// Show the runner state and since when, the turn's last event and progress, the session's
    /// model, rows in flight, the last query_error, usage today and in all, a budget that holds
    /// the queue, health, and what to do
    Status,
    /// Exit 0 when the runner is alive and making progress; else exit 1 with the reason and
    /// its fix (reads the DB once, read-only)
    Health(HealthArgs),
    /// Show the tokens and cost the session's turns used, in total or broken down
    Usage(UsageArgs),
    /// Stop the agent's running turn (the CLI and its conversation live on); rows pushed into
    /// the turn but not yet seen by the model are answered next
    Interrupt,
    /// Serve the session API over HTTP(S) or a unix socket (docs/contract/api.md)
    Serve(host::serve::cli::ServeArgs),
    /// Make, list or revoke the session API's tokens
    #[command(subcommand)]
    Token(host::serve::cli::TokenCommand),
    /// Supervise every session under a root: start a runner when work is due, stop it when
    /// idle, restart crashed ones with backoff, at most --max-running at once; `fleet status`
    /// shows each session's state
    Fleet(host::fleet::FleetArgs),
}

#[derive(Debug, Args)]
struct UsageArgs {
    /// Break the totals down by day (in TZ), model, task series or provider
    #[arg(long, value_name = "day|model|series|provider")]
    by: Option<schema::UsageGroup>,
    /// Only turns since WHEN: a duration back from now (7d, 12h, 1d12h), `today`, a date
    /// YYYY-MM-DD (midnight in TZ), or a time (RFC 3339)
    #[arg(long, value_name = "WHEN")]
    since: Option<String>,
}

#[derive(Debug, Args)]
struct HealthArgs {
    /// A heartbeat older than SECS is stale (3 × the runner's heartbeatSecs; at most 10 s each)
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    stale_after: u64,
    /// A busy turn with no provider event for SECS is stuck (0: not checked); keep it above the
    /// runner's watchdogSecs (600 by default)
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    max_turn_silence: u64,
}

#[derive(Debug, Args)]
struct InitArgs {
    /// Default routing, stored in session_routing
    #[arg(long, value_name = "CHANNEL_TYPE:PLATFORM_ID[:THREAD_ID]")]
    routing: Option<String>,
    /// Upsert a destination the agent can address (repeatable); channel type `agent` makes an
    /// agent destination
    #[arg(long, value_name = "NAME=CHANNEL_TYPE:PLATFORM_ID[:DISPLAY NAME]")]
    destination: Vec<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum KindArg {
    Chat,
    Task,
    Webhook,
    System,
    #[value(name = "chat-sdk")]
    ChatSdk,
}

#[derive(Debug, Args)]
struct SendArgs {
    /// Kind of message
    #[arg(long, value_enum, default_value = "chat")]
    kind: KindArg,
    /// Raw JSON content for any kind (replaces the content flags)
    #[arg(long, value_name = "JSON")]
    content: Option<String>,
    /// Row id [default: a new UUID]; reuse it to make a retried post fail instead of duplicating
    #[arg(long)]
    id: Option<String>,

    /// Chat: message text
    #[arg(long, help_heading = "Chat")]
    text: Option<String>,
    /// Chat: sender display name [default: User]
    #[arg(long, help_heading = "Chat")]
    sender: Option<String>,
    /// Chat: sender platform id
    #[arg(long, help_heading = "Chat")]
    sender_id: Option<String>,
    /// Chat: quote this message (its seq, or a platform id); sender and text are looked up by seq
    /// when not given
    #[arg(long, value_name = "ID", help_heading = "Chat")]
    reply_to: Option<String>,
    /// Chat: sender of the quoted message
    #[arg(long, requires = "reply_to", help_heading = "Chat")]
    quote_sender: Option<String>,
    /// Chat: text of the quoted message
    #[arg(long, requires = "reply_to", help_heading = "Chat")]
    quote_text: Option<String>,
    /// Chat: attach a file by path relative to the workspace root (repeatable)
    #[arg(long, value_name = "REL", help_heading = "Chat")]
    attach_path: Vec<String>,
    /// Chat: attach a file by http(s) URL (repeatable)
    #[arg(long, value_name = "URL", help_heading = "Chat")]
    attach_url: Vec<String>,

    /// Task: instructions for the agent
    #[arg(long, help_heading = "Task")]
    prompt: Option<String>,
    /// Task: pre-agent bash script (last stdout line: {"wakeAgent":bool,"data"?:...})
    #[arg(long, help_heading = "Task")]
    script: Option<String>,
    /// Task: 5-field cron expression, evaluated in TZ; without --process-after the first run is
    /// its next match
    #[arg(long, value_name = "CRON", help_heading = "Task")]
    recurrence: Option<String>,

    /// Webhook: source, e.g. github
    #[arg(long, help_heading = "Webhook")]
    source: Option<String>,
    /// Webhook: event, e.g. pull_request
    #[arg(long, help_heading = "Webhook")]
    event: Option<String>,
    /// Webhook: payload JSON [default: {}]
    #[arg(long, value_name = "JSON", help_heading = "Webhook")]
    payload: Option<String>,

    /// Routing: platform kind [default: from session_routing]
    #[arg(long, help_heading = "Routing and scheduling")]
    channel_type: Option<String>,
    /// Routing: channel id [default: from session_routing]
    #[arg(long, help_heading = "Routing and scheduling")]
    platform_id: Option<String>,
    /// Routing: thread id (alone: the session routing, in this thread)
    #[arg(long, help_heading = "Routing and scheduling")]
    thread_id: Option<String>,
    /// Context only (trigger=0): never wakes the agent alone
    #[arg(long, help_heading = "Routing and scheduling")]
    no_trigger: bool,
    /// Not due before TIME: RFC 3339, `YYYY-MM-DD HH:MM[:SS]` (UTC), `now`, or +30s/+10m/+2h/+1d
    #[arg(long, value_name = "TIME", help_heading = "Routing and scheduling")]
    process_after: Option<String>,
    /// Only on the runner's first poll after it starts
    #[arg(long, help_heading = "Routing and scheduling")]
    on_wake: bool,

    /// With --url: retry a failed connection or a 503 for up to SECS, with the same
    /// idempotency key, so the message is written once [default: 30]
    #[arg(long, value_name = "SECS")]
    retry_for: Option<u64>,
}

#[derive(Debug, Args)]
struct WatchArgs {
    /// Print rows with seq above SEQ [default: 0, every row]
    #[arg(long, value_name = "SEQ", conflicts_with = "new")]
    after: Option<i64>,
    /// Skip the rows already there: print only rows written after watch starts
    #[arg(long)]
    new: bool,
    /// Keep waiting for new rows (the default)
    #[arg(long, overrides_with = "no_follow")]
    follow: bool,
    /// Print the rows already there, then exit
    #[arg(long, overrides_with = "follow")]
    no_follow: bool,
    /// Exit 0 after N rows
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    until_count: Option<u64>,
    /// Stop after SECS; an error (exit 1) when --until-count rows did not arrive by then
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Record each printed row in `delivered` (as a platform-less demo host would)
    #[arg(long)]
    mark_delivered: bool,
}

#[derive(Debug, Args)]
struct AnswerArgs {
    /// The questionId of the ask_question row
    #[arg(long, value_name = "ID")]
    question: String,
    /// The chosen option: its value, or its label
    #[arg(long, value_name = "VALUE")]
    option: String,
    /// Who answered (userId)
    #[arg(long, value_name = "U")]
    user_id: Option<String>,
    /// Send even if no such question was asked or the option is not one of its choices
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Args)]
struct SweepArgs {
    /// A processing row unchanged for SECS is stale
    #[arg(long, value_name = "SECS", default_value_t = host::sweep::DEFAULT_STALE_AFTER_SECS)]
    stale_after: u64,
    /// A stale row with this many tries becomes failed
    #[arg(long, value_name = "N", default_value_t = 5)]
    max_tries: i64,
    /// Retry n waits BACKOFF * 2^(n-1) seconds
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    backoff: u64,
}

/// The log filter when `RUST_LOG` is unset: warnings and errors only, the output is the CLI's.
const DEFAULT_LOG_FILTER: &str = "warn";

/// `serve`'s log filter when `RUST_LOG` is unset: its own lines and the audit lines.
const SERVE_LOG_FILTER: &str = "warn,host::serve=info,nanoclaw::audit=info";
/// `fleet` logs each session's transitions and each runner's start and end.
const FLEET_LOG_FILTER: &str = "warn,host::fleet=info";

fn main() -> ExitCode {
    // Flags first (clap prints usage errors and --help itself): they name the log format.
    let cli = Cli::parse();
    // A dead or full stderr pipe must neither panic nor block the CLI (see `logging`).
    let filter = match cli.command {
        Command::Serve(_) => SERVE_LOG_FILTER,
        Command::Fleet(_) => FLEET_LOG_FILTER,
        _ => DEFAULT_LOG_FILTER,
    };
    let _ = logging::subscriber("nanoclaw", filter, cli.log_format.unwrap_or_default()).try_init();
    match run(cli) {
        Ok(code) => {
            logging::flush_at_exit();
            code
        }
        Err(err) => {
            if is_broken_pipe(&err) {
                logging::flush_at_exit();
                return ExitCode::SUCCESS;
            }
            logging::fatal(&format!("error: {err:#}"));
            // A DB on a shared filesystem has its own code: a retry does not fix it.
            if err
                .chain()
                .any(|cause| schema::shared_filesystem(cause).is_some())
            {
                return ExitCode::from(fsguard::SHARED_FILESYSTEM_EXIT);
            }
            ExitCode::FAILURE
        }
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn run(cli: Cli) -> Result<ExitCode> {
    // The server and its tokens work on no single DB: they choose none.
    let cli = match cli.command {
        Command::Serve(args) => {
            host::serve::cli::run_serve(args, cli.workspace.as_deref())?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Token(command) => {
            output::print(&host::serve::cli::run_token(command, cli.json)?)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Fleet(args) => {
            if let Some(text) = host::fleet::run(args, cli.json)? {
                output::print(&text)?;
            }
            return Ok(ExitCode::SUCCESS);
        }
        command => Cli { command, ..cli },
    };
    if cli.api.url.is_some() {
        return remote::run(cli);
    }
    // Every path is made absolute here, once, against this process's working directory: the
    // paths `init` reports and the session named in JSON log lines are the ones used.
    let env_db = std::env::var_os("SESSION_DB")
        .filter(|value| !value.is_empty())
        .map(|db| fsguard::absolute("SESSION_DB", Path::new(&db)))
        .transpose()?;
    let flag_db = cli
        .db
        .as_deref()
        .map(|db| fsguard::absolute("--db", db))
        .transpose()?;
    let workspace = cli
        .workspace
        .as_deref()
        .map(|ws| fsguard::absolute("--workspace", ws))
        .transpose()?;
    let choice = host::location::choose_db(
        flag_db.as_deref(),
        workspace.as_deref(),
        env_db.as_deref(),
        matches!(cli.command, Command::Init(_)),
    )?;
    // Every JSON log line names the session DB this command works on.
    logging::set_session(choice.db.display().to_string());
    if let Some(note) = &choice.note {
        logging::print_line(&format!("note: {note}"));
    }
    let db = choice.db.as_path();
    match cli.command {
        Command::Init(args) => cmd_init(choice.clone(), cli.json, args),
        Command::Send(args) => cmd_send(db, cli.json, *args),
        Command::Watch(args) => cmd_watch(db, cli.json, args),
        Command::Answer(args) => cmd_answer(db, cli.json, args),
        Command::Sweep(args) => cmd_sweep(db, cli.json, args),
        Command::Status => cmd_status(db, cli.json),
        Command::Health(args) => cmd_health(db, cli.json, &args),
        Command::Usage(args) => cmd_usage(db, cli.json, &args),
        Command::Interrupt => cmd_interrupt(db, cli.json),
        Command::Serve(_) | Command::Token(_) | Command::Fleet(_) => {
            bail!("serve, token and fleet are run before a DB is chosen")
        }
    }
}

fn cmd_init(choice: host::location::DbChoice, as_json: bool, args: InitArgs) -> Result<ExitCode> {
    let options = InitOptions {
        workspace: choice.workspace,
        db: Some(choice.db),
        routing: args
            .routing
            .as_deref()
            .map(host::parse_routing)
            .transpose()
            .context("--routing")?,
        destinations: args
            .destination
            .iter()
            .map(|spec| host::parse_destination(spec))
            .collect::<Result<_>>()
            .context("--destination")?,
    };
    output::init(&host::init(&options)?, as_json)?;
    Ok(ExitCode::SUCCESS)
}

fn cmd_send(db_path: &std::path::Path, as_json: bool, args: SendArgs) -> Result<ExitCode> {
    if args.retry_for.is_some() {
        bail!(
            "--retry-for is for sending over the API: give --url too (a local send never retries)"
        );
    }
    let db = host::open_existing(db_path)?;
    output::sent(&host::send(&db, &args.into_request())?, as_json)?;
    Ok(ExitCode::SUCCESS)
}

impl KindArg {
    fn kind(self) -> SendKind {
        match self {
            Self::Chat => SendKind::Chat,
            Self::Task => SendKind::Task,
            Self::Webhook => SendKind::Webhook,
            Self::System => SendKind::System,
            Self::ChatSdk => SendKind::ChatSdk,
        }
    }
}

impl SendArgs {
    /// The library's request for these flags.
    fn into_request(self) -> SendRequest {
        let args = self;
        SendRequest {
            kind: args.kind.kind(),
            content: args.content,
            id: args.id,
            text: args.text,
            sender: args.sender,
            sender_id: args.sender_id,
            reply_to: args.reply_to.map(|id| Quote {
                id,
                sender: args.quote_sender,
                text: args.quote_text,
            }),
            attach_paths: args.attach_path,
            attach_urls: args.attach_url,
            prompt: args.prompt,
            script: args.script,
            recurrence: args.recurrence,
            source: args.source,
            event: args.event,
            payload: args.payload,
            routing: Routing {
                channel_type: args.channel_type,
                platform_id: args.platform_id,
                thread_id: args.thread_id,
            },
            no_trigger: args.no_trigger,
            process_after: args.process_after,
            on_wake: args.on_wake,
        }
    }
}

fn cmd_watch(db_path: &std::path::Path, as_json: bool, args: WatchArgs) -> Result<ExitCode> {
    let timeout = args
        .timeout
        .map(|secs| {
            Duration::try_from_secs_f64(secs)
                .map_err(|_| anyhow::anyhow!("--timeout {secs}: expected a number of seconds ≥ 0"))
        })
        .transpose()?;
    let db = host::open_existing(db_path)?;
    let after = match (args.after, args.new) {
        (_, true) => host::watch::latest_out_seq(&db)?,
        (Some(after), false) => after,
        (None, false) => 0,
    };
    let options = WatchOptions {
        after,
        follow: !args.no_follow,
        until_count: args.until_count.and_then(|n| usize::try_from(n).ok()),
        timeout,
        mark_delivered: args.mark_delivered,
        ..WatchOptions::default()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let print_row = |row: &schema::MessageOut| output::row(row, as_json);
    runtime.block_on(async {
        tokio::select! {
            summary = host::watch(&db, &options, print_row) => {
                let summary = summary?;
                tracing::debug!(?summary, "watch finished");
                Ok(ExitCode::SUCCESS)
            }
            _ = tokio::signal::ctrl_c() => Ok(ExitCode::SUCCESS),
        }
    })
}

fn cmd_answer(db_path: &std::path::Path, as_json: bool, args: AnswerArgs) -> Result<ExitCode> {
    let db = host::open_existing(db_path)?;
    let answered = host::answer(
        &db,
        &AnswerRequest {
            question_id: args.question,
            option: args.option,
            user_id: args.user_id,
            force: args.force,
        },
    )?;
    output::answered(&answered.report(), as_json)?;
    Ok(ExitCode::SUCCESS)
}

fn cmd_sweep(db_path: &std::path::Path, as_json: bool, args: SweepArgs) -> Result<ExitCode> {
    if args.max_tries < 1 {
        bail!("--max-tries must be at least 1");
    }
    let db = host::open_existing(db_path)?;
    let now = Utc::now();
    let outcome = host::sweep(
        &db,
        &SweepPolicy {
            stale_after: Duration::from_secs(args.stale_after),
            max_tries: args.max_tries,
            backoff: Duration::from_secs(args.backoff),
        },
        now,
    )?;
    output::sweep(&outcome, now, as_json)?;
    Ok(ExitCode::SUCCESS)
}

fn cmd_status(db_path: &std::path::Path, as_json: bool) -> Result<ExitCode> {
    let db = host::open_existing(db_path)?;
    let now = Utc::now();
    let report = host::status(&db, now, &host::status::default_limits())?;
    output::status(&report, now, as_json)?;
    Ok(ExitCode::SUCCESS)
}

fn cmd_usage(db_path: &std::path::Path, as_json: bool, args: &UsageArgs) -> Result<ExitCode> {
    let db = host::open_existing(db_path)?;
    let since = args
        .since
        .as_deref()
        .map(|text| host::timefmt::parse_since(text, Utc::now(), db.timezone()))
        .transpose()?;
    output::usage(
        &host::usage(&db, &host::UsageRequest { by: args.by, since })?,
        as_json,
    )?;
    Ok(ExitCode::SUCCESS)
}

fn cmd_interrupt(db_path: &std::path::Path, as_json: bool) -> Result<ExitCode> {
    let db = host::open_existing(db_path)?;
    output::interrupt(&host::interrupt(&db)?, as_json)?;
    Ok(ExitCode::SUCCESS)
}

/// Exit 1 when unhealthy (see [`output::health`]). A DB on a shared filesystem exits
/// `fsguard::SHARED_FILESYSTEM_EXIT`, as every command does: refused, not unhealthy.
fn cmd_health(db_path: &std::path::Path, as_json: bool, args: &HealthArgs) -> Result<ExitCode> {
    let limits = host::status::host_limits(
        Duration::from_secs(args.stale_after),
        Duration::from_secs(args.max_turn_silence),
    );
    let verdict = schema::health::check(db_path, &limits, Utc::now());
    let refused = matches!(verdict, Err(schema::health::Unhealthy::SharedFilesystem(_)));
    let code = output::health(&host::status::HealthReport::from_verdict(verdict), as_json)?;
    Ok(if refused {
        ExitCode::from(fsguard::SHARED_FILESYSTEM_EXIT)
    } else {
        code
    })
}
