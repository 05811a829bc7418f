//! The binary's application logic: configuration → lock → DB → provider → loop.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Subcommand;
use provider::{AgentProvider, McpServer, ProviderSettings};
use schema::{OpenOptions, SessionDb};

use crate::config::{self, Config};
use crate::lock;
use crate::runner::{Runner, RunnerOptions};

/// Subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Run the loop (the default).
    Run,
    /// Print the effective configuration with each value's source (secrets masked).
    Config,
    /// Claude's PreCompact hook: archive the transcript named by the hook JSON on stdin to
    /// the conversations folder. Always exits 0; problems are logged on stderr.
    ArchiveHook(crate::archive_hook::ArchiveHookArgs),
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
    /// The subcommand.
    pub command: Command,
}

/// Logs to stderr (`RUST_LOG`, default info), without colours when stderr is not a terminal.
/// Through [`logging::Stderr`]: a dead or full stderr pipe must never panic or block the runner
/// (a panic in the signal task once left it deaf to SIGTERM).
pub fn init_logging() {
    let _ = logging::subscriber("info")
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

/// Runs a subcommand.
pub async fn main(cli: Args) -> Result<()> {
    if let Command::ArchiveHook(args) = &cli.command {
        // Never fails: a failing hook could hold up Claude's compaction.
        let workspace = cli
            .workspace
            .clone()
            .unwrap_or_else(|| PathBuf::from("/workspace"));
        crate::archive_hook::main(args, load_config(&cli), &workspace);
        return Ok(());
    }
    let config = load_config(&cli)?;
    match cli.command {
        Command::Config => {
            print!("{}", config.describe());
            Ok(())
        }
        Command::Run => run(config).await,
        Command::ArchiveHook(_) => Ok(()),
    }
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
    if let Err(err) = provider::reaper::init() {
        tracing::warn!("{err}");
    }
    // The configuration and its secret files are read (`load_config`); nothing is opened or
    // started yet, so everything from here on happens as the `runAs` user.
    crate::privileges::drop_privileges(config.text("runAs").as_deref(), &config.workspace)?;
    for warning in config.exposed_secrets() {
        tracing::warn!("{warning}");
    }
    let db_path = config.path("sessionDb").context("sessionDb is not set")?;
    ensure_db_exists(&db_path, config.flag("createSessionDb"))?;
    let lock = lock::RunnerLock::acquire(&db_path)?;
    let identity = DbIdentity::of(&db_path)?;
    let timezone = schema::cron::parse_tz(&config.timezone_name())?;
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
    let model_proxy = crate::model_proxy::start(&config, &config.provider()).await?;
    let provider = create_provider(&config, &db_path, model_proxy.as_ref())?;
    tracing::info!(
        provider = provider.name(),
        db = %db_path.display(),
        lock = %lock.path().display(),
        pid = std::process::id(),
        "agent-runner starting"
    );
    let script_env = script_env(&config);
    let options = RunnerOptions {
        agent_dir: config
            .path("agentDir")
            .unwrap_or_else(|| config.workspace.join("agent")),
        script_env,
        script_limits: crate::script::ScriptLimits {
            timeout: config.secs("scriptTimeoutSecs"),
            ..Default::default()
        },
        media_limits: crate::media::MediaLimits {
            max_bytes: config.number("maxAttachmentBytes"),
            timeout: config.secs("downloadTimeoutSecs"),
            ..Default::default()
        },
        clock: crate::runner::system_clock(),
        timezone,
        workspace: config.workspace.clone(),
        max_messages: usize::try_from(config.number("maxMessagesPerPrompt"))
            .unwrap_or(10)
            .max(1),
        idle_poll: config
            .millis("idlePollMs")
            .clamp(Duration::from_millis(10), Duration::from_secs(1)),
        active_poll: config
            .millis("activePollMs")
            .clamp(Duration::from_millis(10), Duration::from_millis(500)),
        heartbeat: config
            .secs("heartbeatSecs")
            .clamp(Duration::from_secs(1), Duration::from_secs(10)),
        query_retries: u32::try_from(config.number("queryRetries")).unwrap_or(2),
        progress: crate::runner::ProgressLimits {
            notice: config.secs("progressNoticeSecs"),
            silence: config.secs("progressSilenceSecs"),
            max_turn: config.secs("maxTurnSecs"),
        },
        model_endpoint: model_endpoint(&config),
        prompt_sources: Some(crate::system_prompt::PromptSources::from_config(&config)),
    };
    let heartbeat = options.heartbeat;
    // Under the lock, before anything is spawned: what a previous run left behind goes.
    let leftovers = provider::reaper::Leftovers::start(&db_path, heartbeat)?;
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
fn script_env(config: &Config) -> BTreeMap<String, String> {
    let policy = provider::process::EnvPolicy {
        passthrough: config.list("envPassthrough"),
        scrub_patterns: config.list("envScrubPatterns"),
    };
    let mut env = policy.inherited(std::env::vars());
    env.insert("TZ".into(), config.timezone_name());
    env.insert(
        "WORKSPACE_DIR".into(),
        config.workspace.display().to_string(),
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

/// The model endpoint of the configured provider: its base URL, or the CLI's default.
fn model_endpoint(config: &Config) -> String {
    let (key, default) = match config.provider().as_str() {
        "claude" => ("anthropicBaseUrl", "https://api.anthropic.com"),
        "mock" => return "the mock provider".to_owned(),
        _ => ("openaiBaseUrl", "https://api.openai.com/v1"),
    };
    config.text(key).unwrap_or_else(|| default.to_owned())
}

/// Creates the configured provider; with a credential proxy, the CLI gets the proxy's URL and
/// token instead of the configured base URL and key.
pub fn create_provider(
    config: &Config,
    db_path: &Path,
    model_proxy: Option<&credproxy::CredProxy>,
) -> Result<Arc<dyn AgentProvider>> {
    let name = config.provider();
    let mut settings = provider_settings(config, db_path, &name)?;
    crate::model_proxy::apply(model_proxy, &mut settings, &name);
    provider::create(&name, settings).map_err(|err| anyhow::anyhow!("{err}"))
}

/// Provider settings from the configuration.
pub fn provider_settings(config: &Config, db_path: &Path, name: &str) -> Result<ProviderSettings> {
    let mut settings = ProviderSettings::for_workspace(&config.workspace, name);
    if let Some(agent_dir) = config.path("agentDir") {
        settings.agent_dir = agent_dir;
    }
    if let Some(home) = config.path("homeDir") {
        settings.home_dir = home.join(name);
    }
    settings.session_db = db_path.to_path_buf();
    settings.mcp_tools_path = match config.text("mcpToolsPath") {
        Some(path) => PathBuf::from(path),
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join("mcp-tools")))
            .unwrap_or_else(|| PathBuf::from("mcp-tools")),
    };
    settings.timezone = config.timezone_name();
    settings.admin_user_id = config.text("adminUserId");
    settings.model = config.model();
    settings.effort = config.text("effort");
    let (base_url, api_key, cli_path) = match name {
        "claude" => ("anthropicBaseUrl", "anthropicApiKey", "claudePath"),
        "codex" => ("openaiBaseUrl", "openaiApiKey", "codexPath"),
        _ => ("openaiBaseUrl", "openaiApiKey", "opencodePath"),
    };
    settings.base_url = config.text(base_url);
    settings.api_key = config.text(api_key);
    settings.cli_path = config.text(cli_path).map(PathBuf::from);
    if let Some(servers) = config.object("mcpServers") {
        let servers: BTreeMap<String, McpServer> = serde_json::from_value(servers)
            .context("mcpServers: expected {name: {command, args, env}}")?;
        settings.extra_mcp_servers = servers;
    }
    if let Some(extra) = config.path("extraDir") {
        settings.extra_dirs = list_dirs(&extra);
    }
    settings.env_policy.scrub_patterns = config.list("envScrubPatterns");
    settings.env_policy.passthrough = config.list("envPassthrough");
    settings.watchdog = config.secs("watchdogSecs");
    settings.tool_timeout = config.secs("toolTimeoutSecs");
    settings.max_retries = u32::try_from(config.number("cliMaxRetries")).unwrap_or(2);
    settings.request_timeout = config.secs("cliRequestTimeoutSecs");
    settings.stream_idle_timeout = config.secs("cliStreamIdleSecs");
    if let Some(env) = config.object("cliEnv") {
        settings.cli_env = serde_json::from_value(env)
            .context("cliEnv: expected an object of {\"NAME\": \"value\"} strings")?;
    }
    settings.codex_steer = config.flag("codexSteer");
    // Claude's PreCompact hook calls this binary back (`agent-runner archive-hook`).
    settings.runner_exe = std::env::current_exe().ok();
    settings.assistant_name = config.text("assistantName");
    settings.mock_delay = config.millis("mockDelayMs");
    settings.mock_echo_system_prompt = config.flag("mockEchoSystemPrompt");
    if let Some(script) = config.object("mockScript") {
        settings.mock_script =
            serde_json::from_value(script).context("mockScript: expected [{\"step\": ...}]")?;
    }
    Ok(settings)
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
