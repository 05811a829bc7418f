//! The long-lived `claude` process and the task that runs one query on it.
//!
//! One process serves every query of a session: a query task takes the process slot (queries run
//! one after another), reuses the process when it is alive and was started for the same session
//! and system prompt, and otherwise (re)spawns it, resuming the query's continuation. The task
//! then writes the prompt, forwards translated events, writes pushes as they come, and ends on
//! `End` once every prompt is covered, on an error that ends the turn, on `Abort`, on
//! `Interrupt` (then `Interrupted` covers the prompts the model saw), at the turn limit, or when
//! the runner drops the query. Whatever of ours is still queued or running in the CLI when a
//! query ends early is interrupted (`cancel_queued`), so nothing runs after the query is closed:
//! a push the model never saw is cancelled, not run later, and the runner runs it again.
//! A query for another model than the process runs switches it with `set_model` first.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::ChildStdin;
use tokio::sync::{mpsc, OwnedMutexGuard};
use tokio::time::{sleep_until, timeout, Instant};
use tokio_util::sync::CancellationToken;

use super::approval::{self, Action, Waiting};
use super::command::{self, Launch};
use super::media;
use super::protocol::{self, OutLine};
use super::translate::{Signal, Translated, Translator};
use procs::CliProcess;
use provider::driver::classify::classify;
use provider::driver::text::shortened;
use provider::{
    ApprovalAnswer, Control, ErrorClass, InterruptReason, Prompt, PromptId, ProviderError,
    ProviderEvent, ProviderSettings, QueryHandle, QueryInput, Usage,
};

/// Grace between TERM and KILL when stopping the process group.
pub(crate) const TERM_GRACE: Duration = Duration::from_secs(2);
/// How long an interrupted CLI may take to settle before it is killed.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the runner's interrupt may take to end the turn before the process is stopped (the
/// runner promises the user an answer within 2 s; Claude confirms in about 40 ms).
const INTERRUPT_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long a `set_model` may take: Claude checks the model with a one-token request first.
const MODEL_SWITCH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the CLI may take to accept the `initialize` that registers the policy's hooks.
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a write to the CLI's stdin may block.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a Bash tool call may run in Claude Code (its own cap is 10 minutes).
const LONGEST_BUILTIN_TOOL: Duration = Duration::from_secs(11 * 60);
/// At most one `Activity { tool: None }` per this interval (streaming produces many lines).
const ACTIVITY_INTERVAL: Duration = Duration::from_millis(500);
/// Lines of stderr kept for error messages.
const STDERR_TAIL: usize = 40;

/// State shared by the provider and its query tasks.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The provider's settings.
    pub settings: ProviderSettings,
    /// The process, owned by the running query (queries run one after another).
    pub slot: Arc<tokio::sync::Mutex<Option<Live>>>,
    /// Cancelled by `shutdown`.
    pub stop: CancellationToken,
}

/// A running `claude` process.
#[derive(Debug)]
pub(crate) struct Live {
    process: CliProcess,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// The session id, once `system/init` named it.
    session_id: Option<String>,
    /// What it was started with.
    launch: Launch,
    /// The model it runs now (its launch model, then each `set_model`).
    model: Option<String>,
    next_request: u64,
}

impl Live {
    /// Spawns `claude` for `launch`.
    async fn spawn(
        settings: &ProviderSettings,
        program: &Path,
        launch: Launch,
    ) -> Result<Live, ProviderError> {
        let files = command::write_files(settings, &launch).map_err(|err| {
            ProviderError::Spawn(format!(
                "cannot prepare the claude HOME {}: {err}",
                settings.home_dir.display()
            ))
        })?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let is_root = unsafe { nix::libc::geteuid() } == 0;
        let command = command::command(
            settings,
            program,
            &launch,
            &files,
            std::env::vars(),
            is_root,
        );
        tracing::info!(
            program = %command.program.display(),
            resume = ?launch.resume,
            "starting claude"
        );
        // Long (the system prompt's flags, every tool rule): for debugging, not the INFO log.
        tracing::debug!(args = ?command.args, "claude arguments");
        let mut process = CliProcess::spawn(&command)?;
        let (Some(stdin), Some(stdout), Some(stderr)) = (
            process.stdin.take(),
            process.stdout.take(),
            process.stderr.take(),
        ) else {
            return Err(ProviderError::Spawn(
                "claude started without piped stdio".into(),
            ));
        };
        let pid = process.pid();
        let (line_tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            loop {
                match reader.next_line().await {
                    Ok(Some(line)) => {
                        if line.trim().is_empty() {
                            continue;
                        }
                        tracing::trace!(pid, %line, "claude stdout");
                        if line_tx.send(line).is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(err) => {
                        tracing::warn!(pid, %err, "reading claude stdout failed");
                        break;
                    }
                }
            }
        });
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_tail = Arc::clone(&tail);
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                tracing::debug!(pid, %line, "claude stderr");
                let mut tail = stderr_tail.lock().unwrap_or_else(|p| p.into_inner());
                if tail.len() == STDERR_TAIL {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        let mut live = Live {
            process,
            stdin: Some(stdin),
            lines,
            stderr: tail,
            session_id: launch.resume.clone(),
            model: launch.model.clone(),
            launch,
            next_request: 0,
        };
        if let Some(hooks) = approval::initialize_hooks(settings) {
            if let Err(err) = live.initialize(&hooks).await {
                if live.lines.is_closed() || live.process.try_wait().is_some() {
                    // It exited before reading input (a `--resume` of a session it does not
                    // have): the query reads the exit and its stderr as without hooks.
                    tracing::debug!(%err, "claude exited before the initialize");
                    return Ok(live);
                }
                live.terminate().await;
                return Err(ProviderError::Spawn(err));
            }
        }
        Ok(live)
    }

    /// Registers the hooks of the tool policy and the approval stops, before any prompt: a CLI
    /// that does not take them would run every call unchecked, so it is not used.
    async fn initialize(&mut self, hooks: &Value) -> Result<(), String> {
        let request_id = self.request_id();
        let request = protocol::initialize(&request_id, hooks);
        self.write(&request).await?;
        match await_answer(self, &request_id, INITIALIZE_TIMEOUT).await {
            Ok(None) => Ok(()),
            Ok(Some(refusal)) => Err(format!("claude refused the tool policy's hooks: {refusal}")),
            Err(err) => Err(format!(
                "claude did not register the tool policy's hooks: {err}"
            )),
        }
    }

    /// The leader's pid (also the process group id).
    pub(crate) fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// True when this process can serve a query for `continuation` and `system_prompt`.
    fn serves(&mut self, continuation: Option<&str>, system_prompt: Option<&str>) -> bool {
        if self.process.try_wait().is_some() || self.lines.is_closed() {
            return false;
        }
        self.session_id.as_deref() == continuation
            && self.launch.system_prompt.as_deref() == system_prompt
    }

    /// Writes one JSON line to stdin.
    async fn write(&mut self, value: &Value) -> Result<(), String> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err("claude's stdin is closed".into());
        };
        let mut line = value.to_string();
        line.push('\n');
        let write = async {
            stdin.write_all(line.as_bytes()).await?;
            stdin.flush().await
        };
        match timeout(WRITE_TIMEOUT, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => {
                self.stdin = None;
                Err(format!("writing to claude failed: {err}"))
            }
            Err(_) => {
                self.stdin = None;
                Err("writing to claude blocked for 30 s".into())
            }
        }
    }

    fn request_id(&mut self) -> String {
        self.next_request += 1;
        format!("nanoclaw-{}", self.next_request)
    }

    /// The last lines of stderr, joined.
    fn stderr_tail(&self) -> String {
        let tail = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Stops the whole process group and reaps the leader.
    pub(crate) async fn terminate(mut self) {
        self.stdin = None;
        let pid = self.process.pid();
        let status = self.process.terminate(TERM_GRACE).await;
        tracing::info!(pid, ?status, "claude stopped");
    }

    /// Drops lines left over from an earlier query (trailing lifecycle notes, or a turn the CLI
    /// started by itself); they answer nothing this query sends.
    fn drain_stale(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            tracing::debug!(line = %shortened(&line, 200), "claude output between queries");
        }
    }
}

/// How a query ends.
enum End {
    /// Close the event stream; keep the process for the next query.
    Keep,
    /// Close the event stream and stop the process (the next query respawns it).
    Stop,
}

/// One query on the process.
struct Query {
    shared: Arc<Shared>,
    program: PathBuf,
    handle: QueryHandle,
    translator: Translator,
    /// Every prompt of this query with its uuid, kept to write them again to a new process.
    prompts: Vec<(PromptId, String, Prompt)>,
    continuation: Option<String>,
    system_prompt: Option<String>,
    /// The model the query wants: its own (`/model`), else the configured one.
    model: Option<String>,
    /// `End` received.
    ended: bool,
    /// The fallback from a missing session ran (once per query).
    restarted_fresh: bool,
    last_output: Instant,
    last_activity: Option<Instant>,
    /// When the last `Output` went to the runner (throttled like activity).
    last_model_output: Option<Instant>,
    /// The CLI's requests waiting for the runner's answer (approvals, elicitations).
    waiting: Waiting,
}

/// Runs one query to its end. Takes the process slot for the whole query.
pub(crate) async fn run_query(
    shared: Arc<Shared>,
    program: PathBuf,
    input: QueryInput,
    handle: QueryHandle,
) {
    let mut slot = Arc::clone(&shared.slot).lock_owned().await;
    let mut query = Query {
        shared: Arc::clone(&shared),
        program,
        handle,
        translator: Translator::new(),
        prompts: Vec::new(),
        continuation: input.continuation,
        system_prompt: input.system_prompt,
        model: input
            .model
            .filter(|model| !model.is_empty())
            .or_else(|| shared.settings.model.clone()),
        ended: false,
        restarted_fresh: false,
        last_output: Instant::now(),
        last_activity: None,
        last_model_output: None,
        waiting: Waiting::default(),
    };
    if shared.stop.is_cancelled() {
        query
            .fail("the provider is shutting down", false, ErrorClass::Aborted)
            .await;
        return;
    }
    if query.handle.events.is_closed() {
        // The runner dropped the query while an earlier one still held the process.
        tracing::debug!("query dropped before it started");
        return;
    }
    let end = query.run(&mut slot, input.prompt).await;
    if let Some(live) = slot.as_mut() {
        query.refuse_waiting(live).await;
    }
    if let End::Stop = end {
        if let Some(live) = slot.take() {
            live.terminate().await;
        }
    }
}

impl Query {
    async fn run(&mut self, slot: &mut OwnedMutexGuard<Option<Live>>, first: Prompt) -> End {
        if let Some(live) = slot.as_mut() {
            live.drain_stale();
            if !live.serves(self.continuation.as_deref(), self.system_prompt.as_deref()) {
                tracing::info!(
                    live_session = ?live.session_id,
                    continuation = ?self.continuation,
                    "the claude process does not serve this query; restarting it"
                );
                if let Some(live) = slot.take() {
                    live.terminate().await;
                }
            }
        }
        if let Some(end) = self.switch_model(slot).await {
            return end;
        }
        if slot.is_none() {
            let launch = Launch {
                resume: self.continuation.clone(),
                system_prompt: self.system_prompt.clone(),
                model: self.model.clone(),
            };
            match Live::spawn(&self.shared.settings, &self.program, launch).await {
                Ok(live) => **slot = Some(live),
                Err(err) => {
                    self.fail(&err.to_string(), false, ErrorClass::Process)
                        .await;
                    return End::Keep;
                }
            }
        }
        self.write_prompt(slot, 0, first).await;
        self.drive(slot).await
    }

    /// Switches a live process that runs another model than the query wants, by Claude's own
    /// `set_model` (it checks the name with a one-token request first). A model the CLI refuses
    /// ends the query with its error and leaves the process on its model; a CLI that does not
    /// answer is stopped, so the query starts a new one with `--model`. `Some` ends the query.
    async fn switch_model(&mut self, slot: &mut OwnedMutexGuard<Option<Live>>) -> Option<End> {
        let live = slot.as_mut()?;
        if live.model == self.model {
            return None;
        }
        tracing::info!(from = ?live.model, to = ?self.model, "switching claude's model");
        let request_id = live.request_id();
        let request = protocol::set_model(&request_id, self.model.as_deref());
        let answer = match live.write(&request).await {
            Ok(()) => await_answer(live, &request_id, MODEL_SWITCH_TIMEOUT).await,
            Err(err) => Err(err),
        };
        match answer {
            Ok(None) => {
                live.model.clone_from(&self.model);
                None
            }
            Ok(Some(refusal)) => {
                let model = self.model.as_deref().unwrap_or("the default model");
                let message = format!("claude cannot switch to model {model}: {refusal}");
                let classification = classify(None, &refusal, None).unwrap_or(ErrorClass::Api);
                self.fail(&message, false, classification).await;
                Some(End::Keep)
            }
            Err(err) => {
                tracing::warn!(%err, "claude did not switch the model; restarting it with --model");
                if let Some(live) = slot.take() {
                    live.terminate().await;
                }
                None
            }
        }
    }

    /// The main loop: CLI output, runner controls and the watchdog.
    async fn drive(&mut self, slot: &mut OwnedMutexGuard<Option<Live>>) -> End {
        loop {
            let Some(live) = slot.as_mut() else {
                self.fail("claude is not running", true, ErrorClass::Process)
                    .await;
                return End::Keep;
            };
            let watchdog = self.watchdog();
            let deadline = self.last_output + watchdog;
            // Only while a prompt waits for its answer: an idle CLI is silent by design, and so
            // is one that waits for the user's approval.
            let watching = !self.translator.all_covered() && !self.waiting.any();
            tokio::select! {
                _ = self.shared.stop.cancelled() => {
                    self.fail("the provider is shutting down", false, ErrorClass::Aborted).await;
                    return End::Stop;
                }
                line = live.lines.recv() => match line {
                    Some(line) => {
                        self.last_output = Instant::now();
                        if let Some(end) = self.on_line(slot, &line).await {
                            return end;
                        }
                    }
                    None => {
                        if let Some(end) = self.on_exit(slot).await {
                            return end;
                        }
                    }
                },
                control = self.handle.control.recv() => match control {
                    Some(Control::Push { id, prompt }) => self.write_prompt(slot, id, prompt).await,
                    Some(Control::End) => {
                        self.ended = true;
                        if self.translator.all_covered() {
                            return End::Keep;
                        }
                    }
                    Some(Control::Abort) => {
                        let end = self.settle(slot).await;
                        self.fail("the turn was aborted", false, ErrorClass::Aborted).await;
                        return end;
                    }
                    Some(Control::Interrupt) => return self.interrupt(slot).await,
                    Some(Control::Approval { id, answer }) => {
                        self.on_approval(slot, &id, &answer).await;
                    }
                    None => {
                        tracing::debug!("the runner dropped the query; interrupting claude");
                        return self.settle(slot).await;
                    }
                },
                _ = sleep_until(deadline), if watching => {
                    let message = format!(
                        "claude produced no output for {} s during a turn; killed it",
                        watchdog.as_secs()
                    );
                    self.fail(&message, true, ErrorClass::Watchdog).await;
                    return End::Stop;
                }
            }
        }
    }

    /// The watchdog for the current moment: longer while a tool runs, since an MCP tool may block
    /// up to the tool timeout and a Bash command up to Claude's own cap.
    fn watchdog(&self) -> Duration {
        let settings = &self.shared.settings;
        if self.translator.tool_in_flight() {
            settings
                .watchdog
                .max(settings.tool_timeout + command::TOOL_TIMEOUT_MARGIN)
                .max(LONGEST_BUILTIN_TOOL)
        } else {
            settings.watchdog
        }
    }

    /// Writes prompt `id` with a fresh uuid. A failed write is only logged: the process exit
    /// (or the watchdog) that follows reports it, with stderr.
    async fn write_prompt(
        &mut self,
        slot: &mut OwnedMutexGuard<Option<Live>>,
        id: PromptId,
        prompt: Prompt,
    ) {
        let uuid = uuid::Uuid::new_v4().to_string();
        self.translator.register(&uuid, id);
        // The watchdog measures silence while the CLI has work; the work starts now.
        self.last_output = Instant::now();
        let line = protocol::user_message(&uuid, media::message_content(&prompt).await);
        self.prompts.push((id, uuid, prompt));
        let Some(live) = slot.as_mut() else {
            return;
        };
        match live.write(&line).await {
            Ok(()) => tracing::debug!(prompt = id, "prompt written to claude"),
            Err(err) => tracing::warn!(%err, prompt = id, "prompt not written"),
        }
    }

    /// Handles one stdout line; `Some` ends the query.
    async fn on_line(
        &mut self,
        slot: &mut OwnedMutexGuard<Option<Live>>,
        line: &str,
    ) -> Option<End> {
        let translated = self.translator.on_line(line);
        match &translated.signal {
            Some(Signal::SessionNotFound(message)) => {
                let resumed = slot.as_ref().and_then(|live| live.launch.resume.clone());
                return self.restart_fresh(slot, resumed, message.clone()).await;
            }
            Some(Signal::ControlRequest {
                request_id,
                request,
                ..
            }) => {
                let runner_listens = self.on_control_request(slot, request_id, request).await;
                if !runner_listens {
                    return Some(self.settle(slot).await);
                }
            }
            _ => {}
        }
        if let Some(live) = slot.as_mut() {
            for event in &translated.events {
                if let ProviderEvent::Init { session_id } = event {
                    live.session_id = Some(session_id.clone());
                }
            }
        }
        let ends = translated.ends_query();
        if !self.forward(translated).await || ends {
            return Some(self.settle(slot).await);
        }
        if self.ended && self.translator.all_covered() {
            return Some(End::Keep);
        }
        None
    }

    /// Answers the CLI's control request (a hook of the tool policy or the approval stops, an
    /// elicitation): now, or once the runner answers. False when the runner dropped the query.
    async fn on_control_request(
        &mut self,
        slot: &mut OwnedMutexGuard<Option<Live>>,
        request_id: &str,
        request: &Value,
    ) -> bool {
        let (response, events) =
            match approval::on_request(&self.shared.settings, request_id, request) {
                Action::Answer { response, events } => {
                    (protocol::control_success(request_id, response), events)
                }
                Action::Stop { response } => {
                    tracing::info!("an approval-stop tool returned; ending the turn");
                    self.translator.approval_stop();
                    (protocol::control_success(request_id, response), Vec::new())
                }
                Action::Ask(pending) => {
                    let event = ProviderEvent::ApprovalRequest(pending.request.clone());
                    self.waiting.insert(pending);
                    return self.handle.events.send(event).await.is_ok();
                }
                Action::Refuse(why) => {
                    tracing::warn!(%request_id, %why, "claude asked the host a question; refusing");
                    (protocol::control_error(request_id, &why), Vec::new())
                }
            };
        for event in events {
            if self.handle.events.send(event).await.is_err() {
                return false;
            }
        }
        if let Some(live) = slot.as_mut() {
            if let Err(err) = live.write(&response).await {
                tracing::warn!(%err, "cannot answer claude's control request");
            }
        }
        true
    }

    /// The runner's answer to a waiting request; the CLI carries on, so the watchdog starts
    /// measuring again.
    async fn on_approval(
        &mut self,
        slot: &mut OwnedMutexGuard<Option<Live>>,
        id: &str,
        answer: &ApprovalAnswer,
    ) {
        let Some(pending) = self.waiting.take(id) else {
            tracing::debug!(%id, "an answer to no waiting request (denied already)");
            return;
        };
        self.last_output = Instant::now();
        if let Some(live) = slot.as_mut() {
            let response = protocol::control_success(id, pending.response(answer));
            if let Err(err) = live.write(&response).await {
                tracing::warn!(%err, "cannot answer claude's approval request");
            }
        }
    }

    /// Refuses every request still waiting for the runner (the query ends), so the CLI does not
    /// hang on it.
    async fn refuse_waiting(&mut self, live: &mut Live) {
        for pending in self.waiting.drain() {
            tracing::info!(id = %pending.request.id, "the query ends before the approval; refusing the call");
            let response = protocol::control_success(&pending.request.id, pending.unanswered());
            if let Err(err) = live.write(&response).await {
                tracing::warn!(%err, "cannot answer claude's approval request");
            }
        }
    }

    /// Sends events to the runner; false when it dropped the query.
    async fn forward(&mut self, translated: Translated) -> bool {
        for event in translated.events {
            let throttle = match event {
                ProviderEvent::Activity { tool: None, .. } => Some(&mut self.last_activity),
                ProviderEvent::Output => Some(&mut self.last_model_output),
                _ => None,
            };
            if let Some(last) = throttle {
                let now = Instant::now();
                if last.is_some_and(|last| now.duration_since(last) < ACTIVITY_INTERVAL) {
                    continue;
                }
                *last = Some(now);
            }
            if let ProviderEvent::Error {
                message,
                classification,
                ends_turn,
                ..
            } = &event
            {
                // The runner logs it too; this line ties it to the claude process in debug logs.
                tracing::debug!(error = %message, class = classification.name(), ends_turn, "claude reported an error");
            }
            if self.handle.events.send(event).await.is_err() {
                return false;
            }
        }
        true
    }

    /// The session given to `--resume` is gone: start a new one and write this query's prompts
    /// to it again. `None` means the query carries on with the new process.
    async fn restart_fresh(
        &mut self,
        slot: &mut OwnedMutexGuard<Option<Live>>,
        resumed: Option<String>,
        message: String,
    ) -> Option<End> {
        let Some(resumed) = resumed.filter(|_| !self.restarted_fresh) else {
            self.fail(&message, false, ErrorClass::InvalidSession).await;
            return Some(End::Stop);
        };
        self.restarted_fresh = true;
        tracing::warn!(stored_session = %resumed, error = %message, "stored claude session not found; starting a new one");
        let notice = ProviderEvent::Progress {
            message: format!("stored session {resumed} not found; starting a new one"),
        };
        if self.handle.events.send(notice).await.is_err() {
            return Some(End::Stop);
        }
        if let Some(live) = slot.take() {
            live.terminate().await;
        }
        self.continuation = None;
        let launch = Launch {
            resume: None,
            system_prompt: self.system_prompt.clone(),
            model: self.model.clone(),
        };
        let mut live = match Live::spawn(&self.shared.settings, &self.program, launch).await {
            Ok(live) => live,
            Err(err) => {
                self.fail(&err.to_string(), false, ErrorClass::Process)
                    .await;
                return Some(End::Keep);
            }
        };
        self.translator.new_process();
        self.last_output = Instant::now();
        for (id, uuid, prompt) in &self.prompts {
            let line = protocol::user_message(uuid, media::message_content(prompt).await);
            if let Err(err) = live.write(&line).await {
                tracing::warn!(%err, prompt = id, "prompt not written to the new session");
            }
        }
        **slot = Some(live);
        None
    }

    /// stdout closed: the process exited. `None` when a fresh session replaced a failed resume
    /// and the query carries on.
    async fn on_exit(&mut self, slot: &mut OwnedMutexGuard<Option<Live>>) -> Option<End> {
        let mut live = slot.take()?;
        let status = timeout(TERM_GRACE, live.process.wait())
            .await
            .ok()
            .flatten();
        // Let the stderr reader catch up with the last lines.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let stderr = live.stderr_tail();
        let resumed = live.launch.resume.clone();
        live.terminate().await;
        if resumed.is_some() && stderr.contains("No conversation found with session ID") {
            return self.restart_fresh(slot, resumed, stderr).await;
        }
        let status = status.map_or_else(|| "unknown status".to_owned(), |s| s.to_string());
        let mut message = format!("claude exited during the query ({status})");
        if !stderr.is_empty() {
            message.push_str(": ");
            message.push_str(&shortened(&stderr, 1000));
        }
        self.fail(&message, true, ErrorClass::Process).await;
        Some(End::Keep)
    }

    /// Ends the query early: interrupts the running turn and cancels our queued prompts, then
    /// waits until the CLI confirms and every prompt of ours is done, so nothing of this query
    /// runs after it is closed. A CLI that does not settle in time is stopped.
    async fn settle(&mut self, slot: &mut OwnedMutexGuard<Option<Live>>) -> End {
        self.settle_within(slot, SETTLE_TIMEOUT, None).await
    }

    /// The runner's interrupt (`/stop`): [`Query::settle`] within [`INTERRUPT_TIMEOUT`], passing
    /// on what the turn still says (a result that beat the interrupt, text), then
    /// `Interrupted` covering the prompts the model saw, with what the stopped turn cost. A CLI
    /// that does not end the turn in time is stopped after the event (the next query resumes
    /// the session); the process otherwise lives on.
    async fn interrupt(&mut self, slot: &mut OwnedMutexGuard<Option<Live>>) -> End {
        let mut usage = None;
        let end = self
            .settle_within(slot, INTERRUPT_TIMEOUT, Some(&mut usage))
            .await;
        let event = ProviderEvent::Interrupted {
            covers: self.translator.seen_by_model(),
            usage,
            reason: InterruptReason::Stopped,
        };
        if self.handle.events.send(event).await.is_err() {
            tracing::debug!("interrupt not reported: the runner dropped the query");
        }
        end
    }

    /// [`Query::settle`] waiting `within`. With `stopped`, the turn's events are forwarded as
    /// they come, except what ends it (the interrupt's own `aborted` result, prompts it
    /// cancelled, a turn limit reached meanwhile), whose usage is added up there instead.
    async fn settle_within(
        &mut self,
        slot: &mut OwnedMutexGuard<Option<Live>>,
        within: Duration,
        mut stopped: Option<&mut Option<Usage>>,
    ) -> End {
        let Some(live) = slot.as_mut() else {
            return End::Keep;
        };
        if !self.translator.outstanding() {
            self.refuse_waiting(live).await;
            return End::Keep;
        }
        let request_id = live.request_id();
        let interrupted = live.write(&protocol::interrupt(&request_id)).await;
        // A call waiting for the user is refused after the interrupt, which already cancels
        // the wait (measured): refused first, the CLI would take the refusal to the model.
        self.refuse_waiting(live).await;
        if let Err(err) = interrupted {
            tracing::warn!(%err, "cannot interrupt claude; stopping it");
            return End::Stop;
        }
        let deadline = Instant::now() + within;
        let mut answered = false;
        loop {
            tokio::select! {
                _ = self.shared.stop.cancelled() => return End::Stop,
                line = live.lines.recv() => {
                    let Some(line) = line else { return End::Stop };
                    let translated = self.translator.on_line(&line);
                    if let Some(total) = stopped.as_deref_mut() {
                        for event in translated.events {
                            match event {
                                ProviderEvent::Error { ends_turn: true, usage, .. }
                                | ProviderEvent::Interrupted { usage, .. } => {
                                    if let Some(usage) = usage {
                                        total.get_or_insert_with(Usage::default).add(&usage);
                                    }
                                }
                                event => {
                                    if self.handle.events.send(event).await.is_err() {
                                        return End::Keep;
                                    }
                                }
                            }
                        }
                    }
                    match translated.signal {
                        Some(Signal::ControlResponse { request_id: answer, .. }) if answer == request_id => {
                            answered = true;
                        }
                        Some(Signal::ControlRequest { request_id, .. }) => {
                            let refusal = protocol::control_error(&request_id, "the turn is being interrupted");
                            if let Err(err) = live.write(&refusal).await {
                                tracing::warn!(%err, "cannot answer claude's control request");
                            }
                        }
                        _ => {}
                    }
                    if answered && !self.translator.outstanding() {
                        tracing::debug!("claude settled after the interrupt");
                        return End::Keep;
                    }
                }
                _ = sleep_until(deadline) => {
                    tracing::warn!(within = ?within, "claude did not settle after an interrupt; stopping it");
                    return End::Stop;
                }
            }
        }
    }

    /// Reports an error that ends the turn (the stream closes when the task returns).
    async fn fail(&mut self, message: &str, retryable: bool, classification: ErrorClass) {
        let event = ProviderEvent::Error {
            message: message.to_owned(),
            retryable,
            classification,
            ends_turn: true,
            usage: None,
        };
        if self.handle.events.send(event).await.is_err() {
            tracing::debug!(error = %message, "query error not delivered: the runner dropped the query");
        }
    }
}

/// Waits `within` for the CLI's answer to our control request `request_id` between turns:
/// `Ok(None)` accepted, `Ok(Some(why))` refused, `Err` no answer. Other lines answer nothing of
/// ours and are dropped; the CLI's own requests are refused, as always.
async fn await_answer(
    live: &mut Live,
    request_id: &str,
    within: Duration,
) -> Result<Option<String>, String> {
    let deadline = Instant::now() + within;
    loop {
        let line = tokio::select! {
            line = live.lines.recv() => line.ok_or_else(|| "claude exited".to_owned())?,
            _ = sleep_until(deadline) => return Err(format!("no answer in {within:?}")),
        };
        match OutLine::parse(&line) {
            Ok(OutLine::ControlResponse(answer)) if answer.response.request_id == request_id => {
                return Ok(answer.response.refusal());
            }
            Ok(OutLine::ControlRequest(request)) => {
                let refusal = protocol::control_error(&request.request_id, "not now");
                live.write(&refusal).await?;
            }
            _ => tracing::debug!(line = %shortened(&line, 200), "claude output between turns"),
        }
    }
}
