//! The binary's application logic: configuration → lock → DB → provider → loop.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Subcommand;
use provider::{AgentProvider, ProviderKind, ProviderSettings};
use schema::{OpenOptions, SessionDb};

use crate::config::{self, Config, Settings};
use crate::lock;
use crate::runner::{Runner, RunnerOptions};

/// Subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Run the loop (the default).
    Run,
    /// Print the effective configuration with each value's source (secrets masked: the API
    /// keys, and values named like secrets anywhere, e.g. an MCP server's GITHUB_TOKEN).
    Config {
        /// One JSON object: {workspace, configFile, settings: {key: {value, source, variable}}}.
        #[arg(long)]
        json: bool,
    },
    /// Claude's PreCompact hook: archive the transcript named by the hook JSON on stdin to
    /// the conversations folder. Always exits 0; problems are logged on stderr.
    ArchiveHook(crate::archive_hook::ArchiveHookArgs),
    /// For HEALTHCHECK and probes: exit 0 when the runner is alive and making progress, else
    /// exit 1 with the reason and its fix on one line. Reads the session DB once, read-only;
    /// takes no lock and starts nothing, so it runs beside the live runner.
    Health(HealthArgs),
}

/// `agent-runner health` options.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// A heartbeat older than SECS is stale [default: 3 × heartbeatSecs, at least 15]. The turn's
    /// silence limit is the setting healthMaxTurnSilenceSecs.
    #[arg(long, value_name = "SECS")]
    pub stale_after: Option<u64>,
}

/// Parsed command line.
#[derive(Debug, Clone)]
pub struct Args {
    /// `--workspace`.
    pub workspace: Option<PathBuf>,
    /// `--db`.
    pub db: Option<PathBuf>,
    /// `--provider`.
    pub provider: Option<String>,
    /// `--model`.
    pub model: Option<String>,
    /// `--config`.
    pub config: Option<PathBuf>,
    /// `--set KEY=VALUE`.
    pub set: Vec<String>,
    /// `--log-format`.
    pub log_format: Option<logging::LogFormat>,
    /// The subcommand.
    pub command: Command,
}

/// The runner's log filter when `RUST_LOG` is unset.
pub const DEFAULT_LOG_FILTER: &str = "info";

/// Logs to stderr (`RUST_LOG`, default info) in `--log-format`, else `NANOCLAW_LOG_FORMAT`'s
/// format (the config file's `logFormat` applies once read: [`main`]), without colours when
/// stderr is not a terminal. Through [`logging::Stderr`]: a dead or full stderr pipe must never
/// panic or block the runner (a panic in the signal task once left it deaf to SIGTERM).
pub fn init_logging(format: Option<logging::LogFormat>) {
    // An unknown name in the variable is refused with the configuration (`logFormat`).
    let format = format
        .or_else(|| logging::LogFormat::from_env().ok().flatten())
        .unwrap_or_default();
    let _ = logging::subscriber("agent-runner", DEFAULT_LOG_FILTER, format)
        .event_format(logging::LineFormat {
            target: false,
            ansi: std::io::stderr().is_terminal(),
        })
        .try_init();
}

/// Applies the logging settings of the configuration: its format (`logFormat` may come from
/// config.json) and the session every JSON line names, the session DB's path.
fn configure_logging(config: &Config) {
    if let Ok(settings) = config.settings() {
        logging::set_format(settings.log_format);
        logging::set_session(settings.session_db.display().to_string());
    }
}

/// Runs a subcommand.
pub async fn main(cli: Args) -> Result<()> {
    if let Command::ArchiveHook(args) = &cli.command {
        // Never fails: a failing hook could hold up Claude's compaction.
        let config = load_config(&cli);
        let workspace = match &config {
            Ok(config) => config.workspace.clone(),
            Err(_) => {
                let given = cli
                    .workspace
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("/workspace"));
                fsguard::absolute("--workspace", &given).unwrap_or(given)
            }
        };
        if let Ok(config) = &config {
            configure_logging(config);
        }
        let settings = config.and_then(|config| config.settings());
        crate::archive_hook::main(args, settings, &workspace);
        return Ok(());
    }
    let config = load_config(&cli)?;
    configure_logging(&config);
    match cli.command {
        Command::Config { json: false } => {
            print!("{}", config.describe());
            Ok(())
        }
        Command::Config { json: true } => {
            println!("{}", config.describe_json());
            Ok(())
        }
        Command::Run => run(config).await,
        Command::ArchiveHook(_) => Ok(()),
        Command::Health(args) => health(&config, &args),
    }
}

/// `agent-runner health`: the verdict of [`schema::health::check`] on the configured DB.
fn health(config: &Config, args: &HealthArgs) -> Result<()> {
    let settings = config.settings()?;
    // As root with runAs (the image's probes), read as the runner's user: a root-owned `-shm`
    // file left by the check would lock the runner out of its own DB.
    if settings.run_as.is_some() && nix::unistd::Uid::effective().is_root() {
        // A DEBUG line: the image's HEALTHCHECK runs this every 30 s (issue 43, D10).
        crate::privileges::drop_privileges_logged(
            settings.run_as.as_deref(),
            &settings.workspace,
            crate::privileges::Announce::Debug,
        )?;
    }
    // config.json unreadable by root here (issue 43, D1): read as the runAs user.
    let settings = if config.file_deferred() {
        config.reread_file()?.settings()?
    } else {
        settings
    };
    let mut limits = schema::health::HealthLimits::for_heartbeat(
        settings.heartbeat,
        settings.health_max_turn_silence,
    );
    if let Some(secs) = args.stale_after {
        limits.stale_heartbeat = Duration::from_secs(secs);
    }
    let healthy = schema::health::check(&settings.session_db, &limits, chrono::Utc::now())?;
    println!("{healthy}");
    Ok(())
}

fn load_config(cli: &Args) -> Result<Config> {
    let mut flags = Vec::new();
    for pair in &cli.set {
        let (key, value) = pair
            .split_once('=')
            .with_context(|| format!("--set {pair:?}: expected KEY=VALUE"))?;
        flags.push((key.trim().to_owned(), value.to_owned()));
    }
    if let Some(db) = &cli.db {
        flags.push(("sessionDb".into(), db.display().to_string()));
    }
    if let Some(provider) = &cli.provider {
        flags.push(("provider".into(), provider.clone()));
    }
    if let Some(model) = &cli.model {
        flags.push(("model".into(), model.clone()));
    }
    if let Some(format) = cli.log_format {
        flags.push(("logFormat".into(), format.name().to_owned()));
    }
    let inputs = config::Inputs {
        workspace: cli
            .workspace
            .clone()
            .unwrap_or_else(|| PathBuf::from("/workspace")),
        config_file: cli.config.clone(),
        flags,
        env: std::env::vars().collect(),
    };
    Config::load(&inputs)
}

async fn run(config: Config) -> Result<()> {
    // First: as PID 1 a signal without a handler is dropped, and nothing may be spawned before
    // the runner is the subreaper of its processes.
    let signal = shutdown_signal();
    if let Err(err) = procs::reaper::init() {
        tracing::warn!("{err}");
    }
    let settings = config.settings()?;
    // Remote MCP servers' header values: read here, once, like the secret files (a missing one
    // stops the start), and kept in the runner (the proxy serves them).
    let remote_mcp =
        crate::remote_mcp::resolve(&settings.remote_mcp_servers, &std::env::vars().collect())?;
    // The configuration and its secret files are read (`load_config`); nothing is opened or
    // started yet, so everything from here on happens as the `runAs` user.
    crate::privileges::drop_privileges(settings.run_as.as_deref(), &settings.workspace)?;
    let (config, settings, remote_mcp) = if config.file_deferred() {
        // Root could not read config.json (no CAP_DAC_OVERRIDE, a 0700 folder of the agent's
        // user): read now, as that user; root's DAC powers are never needed for it (issue 43).
        let config = config.reread_file()?;
        tracing::info!(
            file = %settings.workspace.join("config.json").display(),
            "config.json read after the drop to runAs (root may not read it here: no CAP_DAC_OVERRIDE)"
        );
        let settings = config.settings()?;
        let remote_mcp =
            crate::remote_mcp::resolve(&settings.remote_mcp_servers, &std::env::vars().collect())?;
        (config, settings, remote_mcp)
    } else {
        (config, settings, remote_mcp)
    };
    for warning in config.exposed_secrets() {
        tracing::warn!("{warning}");
    }
    for warning in config.misspelled_variables() {
        tracing::warn!("{warning}");
    }
    let db_path = settings.session_db.clone();
    // Before the DB or its lock file is created: a DB on a shared filesystem is refused (exit
    // `fsguard::SHARED_FILESYSTEM_EXIT`); `SessionDb::open_with` checks again.
    fsguard::refuse_shared_filesystem(&db_path)?;
    ensure_db_exists(&db_path, settings.create_session_db)?;
    let lock = lock::RunnerLock::acquire(&db_path)?;
    let identity = DbIdentity::of(&db_path)?;
    let timezone = settings.timezone;
    let db = SessionDb::open_with(
        &db_path,
        OpenOptions {
            timezone,
            ..OpenOptions::default()
        },
    )
    .map_err(|err| match err {
        // Already names the path and the cause.
        schema::Error::Open { .. } => anyhow::Error::from(err),
        other => anyhow::Error::from(other)
            .context(format!("opening the session DB {}", db_path.display())),
    })?;
    // Lives as long as the runner: the CLI reaches the model only through it (issue 10, point 4).
    let model_proxy = crate::model_proxy::start(&settings, &remote_mcp).await?;
    let provider = create_provider(&settings, model_proxy.as_ref(), &remote_mcp)?;
    tracing::info!(
        provider = provider.name(),
        db = %db_path.display(),
        lock = %lock.path().display(),
        pid = std::process::id(),
        "agent-runner starting"
    );
    let options = RunnerOptions {
        agent_dir: settings.dirs.agent.clone(),
        script_env: script_env(&settings),
        script_limits: settings.script.clone(),
        media_limits: settings.media.clone(),
        clock: crate::runner::system_clock(),
        timezone,
        workspace: settings.workspace.clone(),
        max_messages: settings.max_messages_per_prompt,
        idle_poll: settings.idle_poll,
        active_poll: settings.active_poll,
        heartbeat: settings.heartbeat,
        query_retries: settings.query_retries,
        progress: settings.progress,
        model_endpoint: model_endpoint(&settings),
        turn_control: settings.turn_control.clone(),
        ask_timeout: settings.tool_policy.ask_timeout,
        budgets: crate::budget::BudgetOptions {
            limits: settings.budgets.clone(),
            reload: Some(config.budget_reload()),
        },
        prompt_sources: Some(crate::system_prompt::PromptSources::from_settings(
            &settings,
        )),
    };
    let heartbeat = options.heartbeat;
    // Under the lock, before anything is spawned: what a previous run left behind goes.
    let leftovers = procs::reaper::Leftovers::start(&db_path, heartbeat)?;
    let runner = Runner::new(db, provider, options)?;
    let lost = Arc::new(std::sync::Mutex::new(None::<String>));
    let lost_reason = lost.clone();
    let stop = async move {
        tokio::select! {
            () = signal => {}
            reason = identity.lost(heartbeat) => {
                tracing::error!(%reason, "stopping: the session DB is gone from its path");
                *lost_reason.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(reason);
            }
        }
    };
    let result = runner.run(stop).await;
    leftovers.stop().await;
    drop(lock);
    result?;
    let reason = lost
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    if let Some(reason) = reason {
        anyhow::bail!("{reason}: exiting so that a restarted runner serves the DB the host writes");
    }
    Ok(())
}

/// Refuses a missing DB (a typo in `--db`, a volume not mounted) unless creating one was asked
/// for: an empty DB nobody writes to would sit idle forever.
fn ensure_db_exists(db_path: &Path, create: bool) -> Result<()> {
    match std::fs::metadata(db_path) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(_) => anyhow::bail!("the session DB {} is not a regular file", db_path.display()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound && create => {
            tracing::info!(db = %db_path.display(), "creating an empty session DB (createSessionDb)");
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(db_path)
            {
                Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => Err(err)
                    .with_context(|| format!("creating the session DB {}", db_path.display())),
                _ => Ok(()),
            }
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "the session DB {} does not exist: the host creates it (`nanoclaw init --workspace <dir>`) \
             and mounts it; check --db / SESSION_DB and the volume. To let the runner create an \
             empty one, set createSessionDb (NANOCLAW_CREATE_DB=true or --set createSessionDb=true)",
            db_path.display()
        ),
        Err(err) => {
            Err(err).with_context(|| format!("reading the session DB {}", db_path.display()))
        }
    }
}

/// The identity (device, inode) of the DB file the runner opened, to notice the file at the
/// path being deleted or replaced: the runner would otherwise serve the old inode forever
/// while the host writes to the new file.
struct DbIdentity {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl DbIdentity {
    fn of(path: &Path) -> Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)
            .with_context(|| format!("reading the session DB {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// What changed at the path, checked with `stat` (which opens nothing) every `every`;
    /// resolves only when it changed.
    async fn lost(&self, every: Duration) -> String {
        use std::os::unix::fs::MetadataExt;
        let mut ticker = tokio::time::interval(every);
        loop {
            ticker.tick().await;
            match tokio::fs::metadata(&self.path).await {
                Ok(meta) if meta.dev() == self.dev && meta.ino() == self.ino => {}
                Ok(_) => {
                    return format!(
                        "the session DB {} was replaced by another file",
                        self.path.display()
                    )
                }
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                    return format!("the session DB {} was deleted", self.path.display())
                }
                Err(err) => {
                    tracing::debug!(%err, "cannot check the session DB's identity; trying again")
                }
            }
        }
    }
}

/// The environment of pre-agent scripts: the same allow-list and scrubbing as the CLI gets,
/// plus TZ and the workspace paths.
fn script_env(settings: &Settings) -> BTreeMap<String, String> {
    let mut env = settings.env_policy.inherited(std::env::vars());
    env.insert("TZ".into(), settings.timezone_name.clone());
    env.insert(
        "WORKSPACE_DIR".into(),
        settings.workspace.display().to_string(),
    );
    env.entry("PATH".into())
        .or_insert_with(|| "/usr/local/bin:/usr/bin:/bin".into());
    env
}

/// Installs the SIGTERM and SIGINT handlers at once (a signal that comes before is not lost, even
/// to PID 1, which the kernel spares signals it has no handler for) and resolves on either.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (Ok(mut term), Ok(mut int)) = handlers else {
            tracing::error!("cannot install signal handlers; stop with SIGKILL");
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = int.recv() => tracing::info!("SIGINT: stopping"),
        }
    }
}

/// The model endpoint of the configured provider: its base URL, or the API's default.
fn model_endpoint(settings: &Settings) -> String {
    match settings.model_api() {
        Some(api) => api.endpoint(),
        // A generic ACP agent reaches the model API its own configuration names.
        None if settings.provider == ProviderKind::Acp => {
            "the ACP agent's own model endpoint".to_owned()
        }
        None => "the mock provider".to_owned(),
    }
}

/// Creates the configured provider; with a credential proxy, the CLI gets the proxy's URL and
/// token instead of the configured base URL and key (and remote MCP servers' headers).
fn create_provider(
    settings: &Settings,
    model_proxy: Option<&credproxy::CredProxy>,
    remote_mcp: &BTreeMap<String, crate::remote_mcp::ResolvedServer>,
) -> Result<Arc<dyn AgentProvider>> {
    let mut provider_settings = provider_settings(settings);
    crate::model_proxy::apply(model_proxy, &mut provider_settings, settings, remote_mcp);
    crate::providers::create(settings.provider, provider_settings, settings.mock.clone())
        .map_err(|err| anyhow::anyhow!("{err}"))
}

/// What every provider needs, from the settings and the runner's surroundings (its own binary,
/// the extra directories that exist now).
fn provider_settings(settings: &Settings) -> ProviderSettings {
    let api = settings.model_api();
    ProviderSettings {
        workspace: settings.workspace.clone(),
        agent_dir: settings.dirs.agent.clone(),
        home_dir: settings.dirs.home.join(settings.provider.name()),
        session_db: settings.session_db.clone(),
        mcp_tools_path: settings.mcp_tools_path.clone().unwrap_or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(|dir| dir.join("mcp-tools")))
                .unwrap_or_else(|| PathBuf::from("mcp-tools"))
        }),
        timezone: settings.timezone_name.clone(),
        admin_user_id: settings.admin_user_id.clone(),
        model: settings.model(),
        effort: settings.effort.clone(),
        base_url: api.and_then(|api| api.base_url.clone()),
        api_key: api.and_then(|api| api.api_key.clone()),
        cli_path: settings.cli_path(),
        extra_mcp_servers: settings.mcp_servers.clone(),
        extra_dirs: settings
            .dirs
            .extra
            .as_deref()
            .map(list_dirs)
            .unwrap_or_default(),
        env_policy: settings.env_policy.clone(),
        watchdog: settings.watchdog,
        tool_timeout: settings.tool_timeout,
        max_retries: settings.cli_max_retries,
        request_timeout: settings.cli_request_timeout,
        stream_idle_timeout: settings.cli_stream_idle,
        cli_env: settings.cli_env.0.clone(),
        acp_command: settings.acp_command.clone(),
        codex_steer: settings.codex_steer,
        // mcp-tools logs in the runner's format (its stderr may reach the same collector).
        mcp_env: match settings.log_format {
            logging::LogFormat::Json => BTreeMap::from([(
                logging::LOG_FORMAT_ENV.to_owned(),
                logging::LogFormat::Json.name().to_owned(),
            )]),
            logging::LogFormat::Text => BTreeMap::new(),
        },
        // Claude's PreCompact hook calls this binary back (`agent-runner archive-hook`).
        runner_exe: std::env::current_exe().ok(),
        assistant_name: settings.assistant_name.clone(),
        auth_hint: settings.auth_hint(),
        max_turns_per_query: settings.max_turns_per_query,
        // Relative paths of file tools are the CLI's, taken from its working directory.
        tool_policy: settings
            .tool_policy
            .clone()
            .with_workspace(settings.dirs.agent.clone()),
        approval_stop_tools: settings.approval_stop_tools.clone(),
        elicitation: settings.elicitation,
        ..ProviderSettings::for_workspace(&settings.workspace, settings.provider.name())
    }
}

/// Every directory directly under `root`, sorted; none when `root` does not exist.
fn list_dirs(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}
