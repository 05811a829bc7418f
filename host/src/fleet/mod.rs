//! `nanoclaw fleet --root DIR`: starts a session's runner when its DB has work due and stops it
//! when idle, for every session folder under the root (the layout of `nanoclaw serve --root`).
//!
//! Map: `watch` (which sessions; inotify on the root and every session folder) → the loop here
//! (reads each changed session's DB read-only, [`schema::read_work`]: work due and the runner
//! row) →
//! `scheduler` (one state machine per session, the slots of `maxRunning`; no I/O) → `backend`
//! (the `Backend` trait; `process`: child processes, leftovers killed when a runner
//! ends) → [`status`] (`ROOT/@fleet/status.json`, written on every change; `fleet status`).
//!
//! Invariants:
//! - At most one runner per session: the fleet takes `ROOT/@fleet/fleet.lock` (one fleet per
//!   root), adopts the runners a previous fleet left alive (by pid and start time, and the
//!   runner's command line naming the session folder) before it starts any, and the runner's
//!   own lock refuses a second one whatever happens.
//! - Nothing of a dead runner runs on: when a runner ends, everything its session started is
//!   killed before its session can get a new runner (the kill matches the session's marker,
//!   which the new runner's processes carry too).
//! - No poll interval: work arriving is an inotify event on the session's `-wal` file, work
//!   coming due is a timer at the earliest due time of all sessions. Each event is followed by
//!   re-reads at `RECHECK_MS` (a commit can be seen by inotify before it is visible).

mod backend;
mod scheduler;
pub mod status;
mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use serde::Deserialize;
use tokio::sync::mpsc;

use backend::{Backend, Exited, ProcessBackend, SessionSpec};
use scheduler::{Action, Observation, Policy, Scheduler};
use status::{FleetStatus, RunnerRecord};
use watch::{Change, Watcher};

/// Re-reads of a session after an event on its DB, in ms after the event.
const RECHECK_MS: [i64; 3] = [20, 150, 600];
/// Discoveries after an event on the root, in ms after the event.
const REDISCOVER_MS: [i64; 3] = [100, 500, 2000];

/// `nanoclaw fleet`'s flags; each wins over the same key of `ROOT/fleet.json`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct FleetArgs {
    /// `status`: show each session's state
    #[command(subcommand)]
    pub command: Option<FleetCommand>,
    /// Supervise every ROOT/<name>/session.db (the layout of `serve --root`)
    #[arg(long, value_name = "DIR", global = true)]
    pub root: Option<PathBuf>,
    /// Stop a runner after SECS with no work and no turn [fleet.json: idleStopSecs; default 300]
    #[arg(long, value_name = "SECS")]
    pub idle_stop_secs: Option<u64>,
    /// Runners at most at once; the rest wait, oldest due work first [fleet.json: maxRunning;
    /// default 20]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_running: Option<u64>,
    /// Retry a failed session (5 crashes in a row) after SECS [fleet.json: failedRetrySecs;
    /// default 600]
    #[arg(long, value_name = "SECS")]
    pub failed_retry_secs: Option<u64>,
    /// The agent-runner binary [fleet.json: runner; default: agent-runner beside nanoclaw, else
    /// on PATH]
    #[arg(long, value_name = "PATH")]
    pub runner: Option<PathBuf>,
    /// Also serve the session API for every session, as `nanoclaw serve --root` does (tokens in
    /// ROOT/tokens.json; plain HTTP on loopback or a unix socket: for TLS run `nanoclaw serve`)
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<crate::serve::Listen>,
}

/// `nanoclaw fleet`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum FleetCommand {
    /// Show each session's state (stopped, starting, running, idle, stopping, backing off,
    /// failed), why, and for how long
    Status,
}

/// `ROOT/fleet.json` (every key optional).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FleetFile {
    idle_stop_secs: Option<u64>,
    max_running: Option<u64>,
    failed_retry_secs: Option<u64>,
    runner: Option<PathBuf>,
}

/// Runs `nanoclaw fleet` (until SIGTERM or SIGINT) or `nanoclaw fleet status` (returns what to
/// print).
pub fn run(args: FleetArgs, as_json: bool) -> Result<Option<String>> {
    let Some(root) = &args.root else {
        bail!(
            "give the root: `nanoclaw fleet --root DIR` (every DIR/<name>/session.db is a session)"
        );
    };
    let root = fsguard::absolute("--root", root)?;
    if !root.is_dir() {
        bail!("--root {}: no such folder", root.display());
    }
    if let Some(FleetCommand::Status) = args.command {
        let status = status::read(&root)?;
        let running = status::alive(status.pid) && holds_lock(&root);
        return Ok(Some(status::render(&status, Utc::now(), running, as_json)));
    }
    // The fleet runs next to the DBs: a root on a shared filesystem is refused (exit 78), as
    // `serve --root` refuses it; a session folder mounted under the root from a share is
    // refused per session (its reads fail, and so would its runner).
    fsguard::refuse_shared_filesystem(&root.join("session.db"))?;
    let file = read_fleet_file(&root)?;
    let defaults = Policy::default();
    let policy = Policy {
        idle_stop: Duration::from_secs(
            args.idle_stop_secs
                .or(file.idle_stop_secs)
                .unwrap_or(defaults.idle_stop.as_secs()),
        ),
        max_running: usize::try_from(args.max_running.or(file.max_running).unwrap_or(20))
            .unwrap_or(usize::MAX)
            .max(1),
        failed_retry: Duration::from_secs(
            args.failed_retry_secs
                .or(file.failed_retry_secs)
                .unwrap_or(defaults.failed_retry.as_secs()),
        ),
        ..defaults
    };
    let runner = match args.runner.or(file.runner) {
        Some(path) => fsguard::absolute("--runner", &path)?,
        None => default_runner(),
    };
    let state_dir = root.join(status::STATE_DIR);
    std::fs::create_dir_all(state_dir.join("logs"))
        .with_context(|| format!("creating {}", state_dir.display()))?;
    let _lock = take_lock(&root)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            let _ = stop.send(true);
        });
        let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        let server = match args.listen {
            Some(listen) => {
                let server = crate::serve::Server::bind(crate::serve::ServeConfig {
                    served: crate::serve::Served::Root(root.clone()),
                    listen: listen.clone(),
                    tokens: None,
                    tls: None,
                    plain_http: false,
                    limits: crate::serve::Limits::default(),
                })
                .await?;
                match server.local_addr() {
                    Some(addr) => tracing::warn!(%addr, "fleet: serving the session API"),
                    None => tracing::warn!(listen = ?listen, "fleet: serving the session API"),
                }
                Some(tokio::spawn(server.run(until_stopped(stopped.clone()))))
            }
            None => None,
        };
        supervise(root, runner, policy, until_stopped(stopped)).await?;
        if let Some(server) = server {
            server.await.context("the API server")??;
        }
        anyhow::Ok(())
    })?;
    Ok(None)
}

fn read_fleet_file(root: &Path) -> Result<FleetFile> {
    let path = root.join("fleet.json");
    match fsguard::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).with_context(|| {
            format!(
                "{}: expected {{\"idleStopSecs\": n, \"maxRunning\": n, \"failedRetrySecs\": n, \"runner\": \"path\"}}",
                path.display()
            )
        }),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(FleetFile::default()),
        Err(err) => Err(err).with_context(|| format!("reading {}", path.display())),
    }
}

/// `agent-runner` beside this binary, else the name (found on PATH).
fn default_runner() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("agent-runner")))
        .filter(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from("agent-runner"))
}

fn lock_path(root: &Path) -> PathBuf {
    root.join(status::STATE_DIR).join("fleet.lock")
}

/// One fleet per root: an exclusive `flock` on `ROOT/@fleet/fleet.lock`, held for the process.
fn take_lock(root: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let path = lock_path(root);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|_| {
        anyhow::anyhow!(
            "another `nanoclaw fleet` supervises {} (it holds {}): stop it first, or see `nanoclaw fleet status --root {}`",
            root.display(),
            path.display(),
            root.display()
        )
    })
}

/// Whether a fleet holds the lock of `root`.
fn holds_lock(root: &Path) -> bool {
    let Ok(file) = std::fs::File::open(lock_path(root)) else {
        return false;
    };
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock).is_err()
}

/// Resolves at SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// How long a read waits for a DB lock (a writer holds it for milliseconds).
const READ_LOCK_WAIT: Duration = Duration::from_secs(2);

/// Reads the DBs of `specs` at `now` (blocking), each on a read-only connection closed after
/// the read (`schema::read_work`): the fleet holds no DB open, so its memory and descriptors do
/// not grow with its sessions, and its reads write nothing that would wake it again.
fn observe_all(specs: Vec<SessionSpec>, now: DateTime<Utc>) -> Vec<(String, Observation)> {
    specs
        .into_iter()
        .map(|spec| {
            let observed = match schema::read_work(&spec.db, now, READ_LOCK_WAIT) {
                Ok((work, runner)) => Observation {
                    work,
                    runner,
                    error: None,
                },
                Err(err) => Observation {
                    error: Some(err.to_string()),
                    ..Observation::default()
                },
            };
            (spec.name, observed)
        })
        .collect()
}

/// The supervisor's state besides the scheduler.
struct Fleet {
    root: PathBuf,
    scheduler: Scheduler,
    backend: Arc<dyn Backend>,
    watcher: Option<Watcher>,
    /// Sessions to read on the next round.
    dirty: BTreeSet<String>,
    /// Re-reads after events.
    rechecks: BTreeMap<DateTime<Utc>, BTreeSet<String>>,
    /// What was last written to status.json.
    written: Option<Vec<status::SessionStatus>>,
    /// Discoveries due after an event on the root: a folder is made before its `session.db`,
    /// whose creation in a folder not yet watched raises no event of ours.
    rediscover: BTreeSet<DateTime<Utc>>,
}

impl Fleet {
    fn discover(&mut self, now: DateTime<Utc>) {
        let found: Vec<SessionSpec> = watch::discover(&self.root)
            .into_iter()
            .filter_map(|(name, db)| {
                Some(SessionSpec {
                    folder: db.parent()?.to_path_buf(),
                    name,
                    db,
                })
            })
            .collect();
        let (added, removed) = self.scheduler.sync(found, now);
        for name in removed {
            if let Some(watcher) = &mut self.watcher {
                watcher.unwatch_session(&name);
            }
        }
        for name in added {
            if let (Some(watcher), Some(spec)) = (&mut self.watcher, self.scheduler.spec(&name)) {
                if let Err(err) = watcher.watch_session(&name, &spec.folder) {
                    tracing::warn!(session = %name, %err, "fleet: cannot watch the session folder; it is re-read every 500 ms (raise fs.inotify.max_user_watches)");
                }
            }
            self.dirty.insert(name);
        }
    }

    fn touched(&mut self, name: String, now: DateTime<Utc>) {
        for ms in RECHECK_MS {
            self.rechecks
                .entry(now + chrono::Duration::milliseconds(ms))
                .or_default()
                .insert(name.clone());
        }
        self.dirty.insert(name);
    }

    /// Reads the dirty sessions (and the rechecks due).
    async fn observe(&mut self, now: DateTime<Utc>) {
        let due: Vec<DateTime<Utc>> = self.rechecks.range(..=now).map(|(at, _)| *at).collect();
        for at in due {
            if let Some(names) = self.rechecks.remove(&at) {
                self.dirty.extend(names);
            }
        }
        if self.dirty.is_empty() {
            return;
        }
        let specs: Vec<SessionSpec> = std::mem::take(&mut self.dirty)
            .iter()
            .filter_map(|name| self.scheduler.spec(name).cloned())
            .collect();
        let observed = tokio::task::spawn_blocking(move || observe_all(specs, now))
            .await
            .unwrap_or_default();
        for (name, observation) in observed {
            let orphan = self.scheduler.without_runner(&name)
                && observation
                    .runner
                    .as_ref()
                    .is_some_and(|row| row.status != "stopped");
            let pid = observation
                .runner
                .as_ref()
                .and_then(|row| row.pid)
                .and_then(|pid| u32::try_from(pid).ok());
            self.scheduler.observe(&name, observation, now);
            // A runner no fleet knows of (one this fleet's predecessor started just before it
            // died, before it wrote status.json): adopt it when it is that session's runner.
            if let (true, Some(pid)) = (orphan, pid) {
                if let (Some(spec), Some(started)) = (
                    self.scheduler.spec(&name).cloned(),
                    backend::start_time(pid),
                ) {
                    let runner = RunnerRecord { pid, started };
                    if self.backend.adopt(&spec, runner) {
                        tracing::info!(session = %name, pid, "fleet: adopted a live runner");
                        self.scheduler.runner_started(&name, runner, true, now);
                        self.dirty.insert(name);
                    }
                }
            }
        }
    }

    fn act(&mut self, now: DateTime<Utc>) {
        for action in self.scheduler.decide(now) {
            match action {
                Action::Start(name) => {
                    let Some(spec) = self.scheduler.spec(&name).cloned() else {
                        continue;
                    };
                    match self.backend.start(&spec) {
                        Ok(runner) => {
                            tracing::info!(session = %name, pid = runner.pid, "fleet: runner started");
                            self.scheduler.runner_started(&name, runner, false, now);
                            self.touched(name, now);
                        }
                        Err(err) => {
                            tracing::error!(session = %name, %err, "fleet: cannot start the runner");
                            self.scheduler.start_failed(&name, err.to_string(), now);
                        }
                    }
                }
                Action::Stop(name, runner) => {
                    tracing::info!(session = %name, pid = runner.pid, "fleet: stopping the runner (SIGTERM)");
                    self.backend.stop(runner);
                }
                Action::Kill(name, runner) => {
                    tracing::warn!(session = %name, pid = runner.pid, "fleet: killing the runner (SIGKILL)");
                    self.backend.kill(runner);
                }
            }
        }
    }

    async fn exited(&mut self, exited: Exited, now: DateTime<Utc>) {
        let Some(spec) = self.scheduler.spec(&exited.name).cloned() else {
            return;
        };
        let backend = self.backend.clone();
        let clean_spec = spec.clone();
        let runner = exited.runner;
        // Before anything else of this session: a new runner's processes carry the same marker.
        let (killed, last_line) = tokio::task::spawn_blocking(move || {
            (
                backend.clean_up(&clean_spec, runner),
                backend.last_error(&clean_spec),
            )
        })
        .await
        .unwrap_or_default();
        let how = match exited.status {
            Some(status) => status.to_string(),
            None => "ended (an adopted runner: exit status unknown)".to_owned(),
        };
        tracing::info!(session = %exited.name, pid = runner.pid, exit = %how, killed = killed.len(), "fleet: runner ended");
        let error = match last_line {
            Some(line) => format!("{how}; its log's last error: {line}"),
            None => how,
        };
        self.scheduler.exited(&exited.name, runner, error, now);
        self.dirty.insert(exited.name);
    }

    fn write_status(&mut self) {
        let lines = self.scheduler.lines();
        if self.written.as_ref() == Some(&lines) {
            return;
        }
        let policy = self.scheduler.policy();
        let status = FleetStatus {
            pid: std::process::id(),
            updated_at: schema::time::now_ts(),
            max_running: policy.max_running,
            idle_stop_secs: policy.idle_stop.as_secs(),
            isolation: self.backend.isolation().to_owned(),
            sessions: lines.clone(),
        };
        match status::write(&self.root, &status) {
            Ok(()) => self.written = Some(lines),
            Err(err) => {
                tracing::warn!(err = %format!("{err:#}"), "fleet: cannot write the status file")
            }
        }
    }

    /// When the loop must wake without an event.
    fn next_wake(&self) -> Option<DateTime<Utc>> {
        let recheck = self.rechecks.keys().next().copied();
        let rediscover = self.rediscover.first().copied();
        [self.scheduler.next_wake(), recheck, rediscover]
            .into_iter()
            .flatten()
            .min()
    }

    /// The sessions whose own timer is due (re-read them before deciding).
    fn due_by_time(&mut self, now: DateTime<Utc>) {
        if self.rediscover.first().is_some_and(|at| *at <= now) {
            self.rediscover.retain(|at| *at > now);
            self.discover(now);
        }
        // A timer only fires when something is due; re-reading every session then is bounded
        // by the number of sessions and rare.
        if self.scheduler.next_wake().is_some_and(|at| at <= now) {
            self.dirty.extend(self.scheduler.names());
        }
    }
}

impl Fleet {
    /// Adopts the runners a previous fleet left alive (recorded in its status file); the
    /// leftovers of those that are gone are killed.
    async fn adopt_previous(&mut self, now: DateTime<Utc>) {
        if let Ok(previous) = status::read(&self.root) {
            for line in previous.sessions {
                let (Some(runner), Some(spec)) = (line.runner, self.scheduler.spec(&line.name))
                else {
                    continue;
                };
                let spec = spec.clone();
                if self.backend.adopt(&spec, runner) {
                    tracing::info!(session = %spec.name, pid = runner.pid, "fleet: adopted a live runner");
                    self.scheduler.runner_started(&spec.name, runner, true, now);
                } else {
                    let backend = self.backend.clone();
                    let killed =
                        tokio::task::spawn_blocking(move || backend.clean_up(&spec, runner))
                            .await
                            .unwrap_or_default();
                    tracing::info!(session = %line.name, pid = runner.pid, killed = killed.len(), "fleet: the runner of a previous fleet is gone; its leftovers killed");
                }
            }
        }
    }

    /// Takes the watcher's changes: a session's DB changed, or the root's sessions did.
    fn on_changes(&mut self, changes: std::io::Result<Vec<Change>>, now: DateTime<Utc>) {
        match changes {
            Ok(changes) => {
                for change in changes {
                    match change {
                        Change::Session(name) => self.touched(name, now),
                        Change::Root => {
                            self.discover(now);
                            for ms in REDISCOVER_MS {
                                self.rediscover
                                    .insert(now + chrono::Duration::milliseconds(ms));
                            }
                        }
                    }
                }
            }
            Err(err) => {
                tracing::warn!(%err, "fleet: reading inotify failed; every session is re-read every 500 ms");
                self.watcher = None;
            }
        }
    }

    /// Asks every runner to stop and waits up to `stop_grace`, then kills what is left.
    async fn stop_all_runners(
        &mut self,
        exit_rx: &mut mpsc::UnboundedReceiver<Exited>,
        stop_grace: Duration,
    ) {
        let stopping = self.scheduler.stop_all(Utc::now());
        tracing::warn!(runners = stopping.len(), "fleet: stopping every runner");
        for (_, runner) in &stopping {
            self.backend.stop(*runner);
        }
        self.write_status();
        let deadline = tokio::time::Instant::now() + stop_grace;
        while !self.scheduler.live().is_empty() {
            match tokio::time::timeout_at(deadline, exit_rx.recv()).await {
                Ok(Some(exited)) => self.exited(exited, Utc::now()).await,
                Ok(None) => break,
                Err(_) => {
                    for (name, runner) in self.scheduler.live() {
                        tracing::warn!(session = %name, pid = runner.pid, "fleet: the runner did not stop in time; killing it");
                        self.backend.kill(runner);
                    }
                    while let Ok(Some(exited)) =
                        tokio::time::timeout(Duration::from_secs(5), exit_rx.recv()).await
                    {
                        self.exited(exited, Utc::now()).await;
                        if self.scheduler.live().is_empty() {
                            break;
                        }
                    }
                    break;
                }
            }
        }
    }
}

/// The supervisor's loop, until `shutdown` resolves; then every runner is stopped.
async fn supervise(
    root: PathBuf,
    runner: PathBuf,
    policy: Policy,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let (exit_tx, mut exit_rx) = mpsc::unbounded_channel();
    let backend: Arc<dyn Backend> = Arc::new(ProcessBackend::new(
        runner.clone(),
        root.join(status::STATE_DIR).join("logs"),
        exit_tx,
    ));
    let watcher = match Watcher::new(&root) {
        Ok(watcher) => Some(watcher),
        Err(err) => {
            tracing::warn!(%err, "fleet: no inotify instance; every session is re-read every 500 ms (raise fs.inotify.max_user_instances)");
            None
        }
    };
    let stop_grace = policy.stop_grace;
    tracing::warn!(
        root = %root.display(),
        runner = %runner.display(),
        max_running = policy.max_running,
        idle_stop_secs = policy.idle_stop.as_secs(),
        isolation = backend.isolation(),
        "fleet: supervising"
    );
    let mut fleet = Fleet {
        root: root.clone(),
        scheduler: Scheduler::new(policy),
        backend,
        watcher,
        dirty: BTreeSet::new(),
        rechecks: BTreeMap::new(),
        written: None,
        rediscover: BTreeSet::new(),
    };
    let now = Utc::now();
    fleet.discover(now);
    // Adopt what the previous fleet left running before starting anything.
    fleet.adopt_previous(now).await;
    tokio::pin!(shutdown);
    loop {
        let now = Utc::now();
        fleet.observe(now).await;
        fleet.act(now);
        fleet.write_status();
        let wake = fleet.next_wake().map(|at| {
            let wait = (at - Utc::now()).to_std().unwrap_or_default();
            tokio::time::Instant::now() + wait + Duration::from_millis(1)
        });
        let poll = fleet
            .watcher
            .is_none()
            .then(|| tokio::time::Instant::now() + watch::POLL_FALLBACK);
        let wake = [wake, poll].into_iter().flatten().min();
        tokio::select! {
            () = &mut shutdown => break,
            changes = async {
                match &mut fleet.watcher {
                    Some(watcher) => watcher.next().await,
                    None => std::future::pending().await,
                }
            } => {
                fleet.on_changes(changes, Utc::now());
            }
            exited = exit_rx.recv() => {
                if let Some(exited) = exited {
                    fleet.exited(exited, Utc::now()).await;
                }
            }
            () = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                let now = Utc::now();
                if fleet.watcher.is_none() {
                    fleet.dirty.extend(fleet.scheduler.names());
                }
                fleet.due_by_time(now);
            }
        }
    }
    // Shutdown: every runner is asked to stop, killed after the grace.
    fleet.stop_all_runners(&mut exit_rx, stop_grace).await;
    fleet.write_status();
    tracing::warn!("fleet: stopped");
    Ok(())
}
