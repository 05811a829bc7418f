//! What the queries share: the provider's state (`Shared`: the live `opencode serve`, started,
//! reused and restarted when it died; message ids in OpenCode's order) and the query's session
//! on that server (found, created or replaced).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use provider::{ProviderEvent, ProviderSettings, QueryInput};

use super::archiving;
use super::command;
use super::connection::{HttpError, Server};

/// What the provider and its queries share.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) settings: ProviderSettings,
    pub(super) program: PathBuf,
    /// The running server; holding the lock is running a query (queries are serialized).
    pub(super) slot: tokio::sync::Mutex<Option<Server>>,
    /// Cancelled by `shutdown`; replaced afterwards so the provider can start again.
    pub(super) stop: Mutex<CancellationToken>,
    pub(super) ids: Mutex<IdClock>,
    pub(super) record: Mutex<Option<provider::recording::Recording>>,
    /// Pid of the running server, readable while a query holds `slot`.
    pub(super) pid: Mutex<Option<u32>>,
    /// Models asked for by queries (`/model`) besides the configured one; the running server's
    /// config declares them all (OpenCode refuses a model its config does not list).
    pub(super) extra_models: Mutex<BTreeSet<String>>,
    /// Held by the transcript archive that runs (`archiving.rs`).
    pub(super) archive: provider::archive::job::Archives<archiving::Job>,
}

#[derive(Debug, Default)]
pub(super) struct IdClock {
    last_ms: u64,
    counter: u64,
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// A message id in OpenCode's own format (`msg_` + 12 hex digits of `ms * 0x1000 +
    /// counter` + 14 random base-62 characters), so ids sort in creation order with the ids
    /// OpenCode generates (its run loop compares them).
    pub(super) fn message_id(&self) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default();
        let value = {
            let mut clock = lock(&self.ids);
            if now > clock.last_ms {
                clock.last_ms = now;
                clock.counter = 0;
            }
            clock.counter += 1;
            clock
                .last_ms
                .wrapping_mul(0x1000)
                .wrapping_add(clock.counter)
                & 0xFFFF_FFFF_FFFF
        };
        format!("msg_{value:012x}{}", random_base62(14))
    }

    pub(super) fn record(&self, line: Value) {
        let recording = lock(&self.record).clone();
        if let Some(recording) = recording {
            let line = recording.scrub(line.to_string());
            let result = fsguard::open_with(recording.path(), fsguard::Access::Append)
                .and_then(|mut file| writeln!(file, "{line}"));
            if let Err(err) = result {
                tracing::warn!(path = %recording.path().display(), %err, "cannot record OpenCode events");
            }
        }
    }

    /// Starts the server if none is running (or the running one died).
    pub(super) async fn ensure_server<'a>(
        &self,
        slot: &'a mut Option<Server>,
        input: &QueryInput,
    ) -> Result<&'a mut Server, String> {
        if let Some(server) = slot.as_mut() {
            if let Some(status) = server.exit_status() {
                tracing::warn!(%status, "opencode serve exited between queries; restarting it");
                server.stop().await;
                *slot = None;
                *lock(&self.pid) = None;
            }
        }
        let wanted = input
            .model
            .as_deref()
            .filter(|model| *model != command::model(&self.settings));
        if let Some(model) = wanted {
            let added = lock(&self.extra_models).insert(model.to_owned());
            if let Some(server) = slot.as_mut().filter(|_| added) {
                // The session lives in OpenCode's DB: the new server resumes it.
                tracing::info!(model, "restarting opencode serve to declare the model");
                self.archive.wait_idle("opencode").await;
                server.stop().await;
                *slot = None;
                *lock(&self.pid) = None;
            }
        }
        if slot.is_none() {
            let settings = &self.settings;
            let key_file = command::prepare_home(settings)
                .map_err(|err| format!("cannot prepare {}: {err}", settings.home_dir.display()))?;
            let extra_models = lock(&self.extra_models).clone();
            let inline = command::config(settings, key_file.as_deref(), &extra_models);
            let password = random_hex();
            let env = command::environment(
                settings,
                std::env::vars(),
                &inline,
                &password,
                input.system_prompt.is_some(),
            );
            let command = command::command(&self.program, settings, env);
            tracing::info!(
                program = %self.program.display(),
                cwd = %settings.agent_dir.display(),
                model = command::model(settings),
                "starting opencode serve"
            );
            let server = Server::start(&command, &password).await?;
            *lock(&self.pid) = Some(server.pid());
            *slot = Some(server);
        }
        slot.as_mut()
            .ok_or_else(|| "the OpenCode server is not running".to_owned())
    }
}

/// 32 random hex digits.
fn random_hex() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// `n` random characters from `[0-9A-Za-z]`.
fn random_base62(n: usize) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut out = String::with_capacity(n);
    while out.len() < n {
        for byte in uuid::Uuid::new_v4().as_bytes() {
            if out.len() == n {
                break;
            }
            out.push(char::from(ALPHABET[usize::from(*byte) % ALPHABET.len()]));
        }
    }
    out
}

/// Finds or creates the session; a stored continuation that no longer exists is replaced by a
/// new session (with a `Progress` notice; the caller emits `Init` with the new id).
/// Errors say whether the server itself looks broken (no answer at all).
pub(super) async fn resolve_session(
    server: &Server,
    continuation: Option<&str>,
    events: &mpsc::Sender<ProviderEvent>,
) -> Result<String, (String, bool)> {
    if let Some(id) = continuation {
        match server.session_exists(id).await {
            Ok(true) => return Ok(id.to_owned()),
            Ok(false) => {
                tracing::warn!(
                    session = id,
                    "stored OpenCode session not found; starting a new one"
                );
                let _ = events
                    .send(ProviderEvent::Progress {
                        message: format!("stored session {id} not found; starting a new one"),
                    })
                    .await;
            }
            Err(err) => {
                let broken = matches!(err, HttpError::Transport(_));
                return Err((
                    format!("cannot look up OpenCode session {id}: {err}"),
                    broken,
                ));
            }
        }
    }
    let mut last = None;
    for _ in 0..2 {
        match server.create_session().await {
            Ok(id) => {
                tracing::info!(session = %id, "new OpenCode session");
                return Ok(id);
            }
            Err(err) => {
                tracing::warn!(%err, "cannot create an OpenCode session");
                last = Some(err);
            }
        }
    }
    let broken = matches!(last, Some(HttpError::Transport(_)));
    let last = last.map(|err| err.to_string()).unwrap_or_default();
    Err((format!("cannot create an OpenCode session: {last}"), broken))
}
