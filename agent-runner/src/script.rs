//! Pre-agent task scripts (docs/contract/prompt.md#task-scripts): a task's `script` runs with
//! `bash` before the agent is woken, and its last non-empty stdout line decides whether the agent
//! runs at all.
//!
//! The script is written to a private temp file (mode 0600, deleted afterwards) and run as
//! `bash <file>` in the agent folder, in its own process group with a parent-death signal, from
//! exactly the environment the caller passes (nothing of the runner's own environment leaks in).
//! A timeout stops the whole group (TERM, a grace period, then KILL), grandchildren included;
//! background processes still alive when the script itself exits are killed the same way, so a
//! forgotten `&` can neither outlive the task nor hold the output pipes open. Those that left the
//! group (`setsid`) are found by a per-run marker in their environment ([`RUN_MARK_VAR`]) and
//! killed too; one that also cleared its environment lives until the session stops, when the
//! runner kills every process it started (see `procs::reaper`).
//!
//! Stdout and stderr are read concurrently. Each keeps its first `output_cap` bytes and keeps
//! draining past that (so the script never blocks on a full pipe); the last non-empty stdout line
//! is tracked over the whole stream, so a large output does not hide the verdict line.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use procs::{CliCommand, CliProcess};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long the group has between TERM and KILL when a script times out.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// How long the output readers may take to reach end-of-file once the group is gone. Only a
/// process that escaped the group (`setsid`) can hold a pipe open longer; its output is dropped.
const READER_GRACE: Duration = Duration::from_secs(1);

/// Bytes of the end of each stream kept for error messages, whatever the cap.
const TAIL_KEEP: usize = 2048;

/// Characters of the offending stdout line quoted in a failure reason.
const LINE_QUOTE_CHARS: usize = 200;

/// Characters of the end of stderr quoted in a failure reason.
const STDERR_QUOTE_CHARS: usize = 500;

/// The environment variable naming one script run, inherited by everything the script starts.
pub const RUN_MARK_VAR: &str = "NANOCLAW_TASK_RUN";

/// A value of [`RUN_MARK_VAR`] no other run of this or another runner uses.
fn run_mark() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-{}-{nanos}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    )
}

/// Limits of one script run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptLimits {
    /// Wall-clock limit of the whole run; past it the process group is killed.
    pub timeout: Duration,
    /// Bytes kept of each of stdout and stderr; the rest is read and discarded.
    pub output_cap: usize,
}

impl Default for ScriptLimits {
    /// 30 s and 1 MiB per stream (docs/contract/prompt.md#task-scripts).
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            output_cap: 1024 * 1024,
        }
    }
}

/// What a task script decided.
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptOutcome {
    /// `{"wakeAgent": true}`: run the agent, with the script's `data` (absent or JSON `null`
    /// become `None`).
    Wake {
        /// The `data` field of the verdict line.
        data: Option<Value>,
    },
    /// `{"wakeAgent": false}`: complete the task without waking the agent.
    Skip,
    /// The script could not give a verdict; the task completes without waking the agent and the
    /// caller logs `reason`.
    Failed {
        /// What went wrong: exit code, timeout or the offending line, plus the end of stderr.
        reason: String,
    },
}

/// Runs `script` with `bash` in `cwd` with exactly `env`, and reads its verdict.
///
/// Call from an async task, never from `spawn_blocking`: the parent-death signal of the child is
/// tied to the spawning thread. Never panics; every problem becomes [`ScriptOutcome::Failed`].
pub async fn run_script(
    script: &str,
    cwd: &Path,
    env: &BTreeMap<String, String>,
    limits: &ScriptLimits,
) -> ScriptOutcome {
    // Checked here because a missing cwd makes the spawn fail with a message naming bash.
    if !cwd.is_dir() {
        return ScriptOutcome::Failed {
            reason: format!(
                "the script's working directory {} does not exist",
                cwd.display()
            ),
        };
    }
    // The file lives until the end of this function; dropping it deletes it (also when the
    // caller drops this future, as does the group kill of `CliProcess`'s Drop).
    let file = match write_temp_script(script) {
        Ok(file) => file,
        Err(err) => {
            return ScriptOutcome::Failed {
                reason: format!("cannot write the script to a temp file: {err}"),
            }
        }
    };
    let run = run_mark();
    let marker = format!("{RUN_MARK_VAR}={run}");
    let command = CliCommand::new(find_bash(), cwd)
        .args([file.path().to_string_lossy().into_owned()])
        .envs(env.clone())
        .env(RUN_MARK_VAR, run);
    let mut process = match CliProcess::spawn(&command) {
        Ok(process) => process,
        Err(err) => {
            return ScriptOutcome::Failed {
                reason: format!("cannot start the script: {err}"),
            }
        }
    };
    let deadline = Instant::now() + limits.timeout;
    // The script gets an empty stdin: nobody will type into it.
    process.stdin.take();
    let stdout = Arc::new(Mutex::new(Capture::new(limits.output_cap)));
    let stderr = Arc::new(Mutex::new(Capture::new(limits.output_cap)));
    let mut readers = Vec::new();
    if let Some(pipe) = process.stdout.take() {
        readers.push(spawn_reader(pipe, Arc::clone(&stdout)));
    }
    if let Some(pipe) = process.stderr.take() {
        readers.push(spawn_reader(pipe, Arc::clone(&stderr)));
    }

    let waited = tokio::time::timeout_at(deadline, process.wait()).await;
    let timed_out = waited.is_err();
    let status = match waited {
        // Kill what the script left running in the background; the leader is already reaped,
        // so this returns at once.
        Ok(status) => process.terminate(Duration::ZERO).await.or(status),
        Err(_) => process.terminate(TERM_GRACE).await,
    };
    drop(process);
    // What left the group (`setsid … &`) still carries the run's marker.
    let escaped = tokio::task::spawn_blocking(move || procs::reaper::kill_marked(&marker, false))
        .await
        .unwrap_or_default();
    if !escaped.is_empty() {
        tracing::info!(pids = ?escaped, "killed processes a task script left running outside its group");
    }
    finish_readers(readers).await;

    let stdout = take_capture(&stdout);
    let stderr = take_capture(&stderr);
    log_output(&stdout, &stderr, limits.output_cap);
    let outcome = verdict(timed_out, status, &stdout, &stderr, limits);
    drop(file);
    outcome
}

/// Writes the script to a private temp file (0600 through `tempfile`, close-on-exec, so the
/// child only sees it through the path handed to bash).
fn write_temp_script(script: &str) -> std::io::Result<tempfile::NamedTempFile> {
    let mut file = tempfile::Builder::new()
        .prefix("task-script-")
        .suffix(".sh")
        .tempfile()?;
    file.write_all(script.as_bytes())?;
    file.flush()?;
    Ok(file)
}

/// Finds `bash` on the runner's `PATH` up front: the child's environment is cleared, so its own
/// `PATH` (if the caller passes one) must not decide which interpreter runs.
fn find_bash() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("bash"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| PathBuf::from("/bin/bash"))
}

/// Waits for the readers to reach end-of-file, briefly: the group is dead by now.
async fn finish_readers(readers: Vec<JoinHandle<()>>) {
    let deadline = Instant::now() + READER_GRACE;
    for reader in readers {
        let abort = reader.abort_handle();
        if tokio::time::timeout_at(deadline, reader).await.is_err() {
            tracing::debug!("a task script's output pipe stayed open after its group was killed");
            abort.abort();
        }
    }
}

fn spawn_reader<R>(mut pipe: R, capture: Arc<Mutex<Capture>>) -> JoinHandle<()>
where
    R: AsyncRead + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match pipe.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => lock(&capture).push(&buf[..n]),
                Err(err) => {
                    lock(&capture).read_error = Some(err.to_string());
                    break;
                }
            }
        }
        lock(&capture).finish();
    })
}

fn lock(capture: &Mutex<Capture>) -> std::sync::MutexGuard<'_, Capture> {
    // A reader cannot panic while holding the lock, but never turn poisoning into a panic here.
    capture.lock().unwrap_or_else(PoisonError::into_inner)
}

fn take_capture(capture: &Mutex<Capture>) -> Capture {
    let mut guard = lock(capture);
    // `finish` is idempotent; it matters when a reader was aborted mid-line.
    guard.finish();
    std::mem::replace(&mut *guard, Capture::new(0))
}

/// What was read of one output stream.
#[derive(Debug, Default)]
struct Capture {
    cap: usize,
    /// The first `cap` bytes.
    head: Vec<u8>,
    /// Bytes read in all.
    total: u64,
    /// The last bytes read (at most about `2 * TAIL_KEEP`).
    tail: Vec<u8>,
    /// The line being read (at most `cap` bytes of it).
    line: Vec<u8>,
    /// The line being read is longer than `cap`.
    line_overflow: bool,
    /// The line being read has a non-whitespace byte (also past the cap).
    line_nonblank: bool,
    /// The last complete non-blank line and whether it was cut at `cap`.
    last_line: Option<(Vec<u8>, bool)>,
    /// A read error that ended the stream early.
    read_error: Option<String>,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            ..Self::default()
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        let room = self.cap.saturating_sub(self.head.len());
        self.head.extend_from_slice(&chunk[..room.min(chunk.len())]);
        self.tail.extend_from_slice(chunk);
        if self.tail.len() > 2 * TAIL_KEEP {
            let excess = self.tail.len() - TAIL_KEEP;
            self.tail.drain(..excess);
        }
        let mut segments = chunk.split(|&b| b == b'\n').peekable();
        while let Some(segment) = segments.next() {
            self.extend_line(segment);
            // Every segment but the last ended at a newline.
            if segments.peek().is_some() {
                self.end_line();
            }
        }
    }

    fn extend_line(&mut self, segment: &[u8]) {
        if !self.line_nonblank && segment.iter().any(|b| !b.is_ascii_whitespace()) {
            self.line_nonblank = true;
        }
        let room = self.cap.saturating_sub(self.line.len());
        if segment.len() > room {
            self.line_overflow = true;
        }
        self.line
            .extend_from_slice(&segment[..room.min(segment.len())]);
    }

    fn end_line(&mut self) {
        let line = std::mem::take(&mut self.line);
        if self.line_nonblank {
            self.last_line = Some((line, self.line_overflow));
        }
        self.line_overflow = false;
        self.line_nonblank = false;
    }

    /// Ends the stream: an unterminated last line still counts.
    fn finish(&mut self) {
        if self.line_nonblank || !self.line.is_empty() {
            self.end_line();
        }
    }

    fn truncated(&self) -> bool {
        self.total > self.head.len() as u64
    }

    /// The last `chars` characters of the stream, trimmed, with `…` when cut.
    fn tail_text(&self, chars: usize) -> String {
        let text = String::from_utf8_lossy(&self.tail);
        let text = text.trim();
        let count = text.chars().count();
        if count <= chars {
            text.to_owned()
        } else {
            let cut: String = text.chars().skip(count - chars).collect();
            format!("…{cut}")
        }
    }
}

fn log_output(stdout: &Capture, stderr: &Capture, cap: usize) {
    for (name, capture) in [("stdout", stdout), ("stderr", stderr)] {
        if capture.truncated() {
            tracing::warn!(
                stream = name,
                bytes = capture.total,
                kept = capture.head.len(),
                "task script output exceeded the {} cap; the rest was discarded",
                format_bytes(cap)
            );
        }
        if let Some(err) = &capture.read_error {
            tracing::warn!(stream = name, error = %err, "reading task script output failed");
        }
    }
    tracing::debug!(
        stdout_bytes = stdout.total,
        stderr_bytes = stderr.total,
        stdout = %quote(&String::from_utf8_lossy(&stdout.head), 500),
        stderr = %stderr.tail_text(STDERR_QUOTE_CHARS),
        "task script finished"
    );
}

/// Turns what happened into an outcome.
fn verdict(
    timed_out: bool,
    status: Option<ExitStatus>,
    stdout: &Capture,
    stderr: &Capture,
    limits: &ScriptLimits,
) -> ScriptOutcome {
    let failed = |what: String| {
        let mut reason = what;
        if stdout.truncated() {
            reason.push_str(&format!(
                " (stdout was {} bytes; only the first {} were kept)",
                stdout.total,
                format_bytes(limits.output_cap)
            ));
        }
        let tail = stderr.tail_text(STDERR_QUOTE_CHARS);
        if !tail.is_empty() {
            reason.push_str("; stderr: ");
            reason.push_str(&tail);
        }
        ScriptOutcome::Failed { reason }
    };
    if timed_out {
        return failed(format!(
            "script timed out after {}",
            format_duration(limits.timeout)
        ));
    }
    let Some(status) = status else {
        return failed("could not wait for the script to exit".to_owned());
    };
    if !status.success() {
        return failed(match (status.code(), status.signal()) {
            (Some(code), _) => format!("script exited with code {code}"),
            (None, Some(signal)) => match nix::sys::signal::Signal::try_from(signal) {
                Ok(name) => format!("script was killed by {name}"),
                Err(_) => format!("script was killed by signal {signal}"),
            },
            (None, None) => format!("script failed: {status}"),
        });
    }
    let Some((line, cut)) = &stdout.last_line else {
        return failed(
            "script printed no output; its last stdout line must be JSON like {\"wakeAgent\": true}"
                .to_owned(),
        );
    };
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    if *cut {
        return failed(format!(
            "the last stdout line is longer than {}: {}",
            format_bytes(limits.output_cap),
            quote(text, LINE_QUOTE_CHARS)
        ));
    }
    let value: Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(err) => {
            return failed(format!(
                "the last stdout line is not JSON ({err}): {}",
                quote(text, LINE_QUOTE_CHARS)
            ))
        }
    };
    match value.get("wakeAgent") {
        Some(Value::Bool(true)) => ScriptOutcome::Wake {
            data: value.get("data").filter(|data| !data.is_null()).cloned(),
        },
        Some(Value::Bool(false)) => ScriptOutcome::Skip,
        Some(_) => failed(format!(
            "\"wakeAgent\" in the last stdout line is not a boolean: {}",
            quote(text, LINE_QUOTE_CHARS)
        )),
        None => failed(format!(
            "the last stdout line has no \"wakeAgent\" field: {}",
            quote(text, LINE_QUOTE_CHARS)
        )),
    }
}

/// The first `chars` characters of `text`, with `…` when cut.
fn quote(text: &str, chars: usize) -> String {
    let mut out: String = text.chars().take(chars).collect();
    if text.chars().nth(chars).is_some() {
        out.push('…');
    }
    out
}

fn format_duration(duration: Duration) -> String {
    if duration.subsec_millis() == 0 {
        format!("{} s", duration.as_secs())
    } else {
        format!("{} ms", duration.as_millis())
    }
}

fn format_bytes(bytes: usize) -> String {
    if bytes >= 1024 * 1024 && bytes.is_multiple_of(1024 * 1024) {
        format!("{} MiB", bytes / (1024 * 1024))
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn env() -> BTreeMap<String, String> {
        BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())])
    }

    fn limits(timeout_ms: u64) -> ScriptLimits {
        ScriptLimits {
            timeout: Duration::from_millis(timeout_ms),
            ..ScriptLimits::default()
        }
    }

    async fn run(script: &str) -> ScriptOutcome {
        let dir = tempfile::tempdir().unwrap();
        run_script(script, dir.path(), &env(), &limits(10_000)).await
    }

    fn failure(outcome: ScriptOutcome) -> String {
        match outcome {
            ScriptOutcome::Failed { reason } => reason,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    /// Whether `pid` is gone (or a zombie, which no longer runs).
    fn is_gone(pid: i32) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.is_empty() || stat.contains(") Z ")
    }

    #[tokio::test]
    async fn wake_with_data() {
        let outcome =
            run(r#"echo "checking..."; echo '{"wakeAgent": true, "data": {"n": 3}}'"#).await;
        assert_eq!(
            outcome,
            ScriptOutcome::Wake {
                data: Some(serde_json::json!({"n": 3}))
            }
        );
    }

    #[tokio::test]
    async fn wake_without_data_and_trailing_blank_lines() {
        let outcome = run("echo '{\"wakeAgent\":true,\"data\":null}'; echo; echo '   '").await;
        assert_eq!(outcome, ScriptOutcome::Wake { data: None });
    }

    #[tokio::test]
    async fn skip() {
        assert_eq!(
            run(r#"echo '{"wakeAgent": false}'"#).await,
            ScriptOutcome::Skip
        );
    }

    #[tokio::test]
    async fn unterminated_last_line_counts() {
        assert_eq!(
            run(r#"printf '{"wakeAgent": false}'"#).await,
            ScriptOutcome::Skip
        );
    }

    #[tokio::test]
    async fn non_zero_exit_reports_code_and_stderr() {
        let reason = failure(run("echo '{\"wakeAgent\": true}'; echo boom >&2; exit 3").await);
        assert!(reason.contains("exited with code 3"), "{reason}");
        assert!(reason.contains("stderr: boom"), "{reason}");
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let started = std::time::Instant::now();
        let outcome = run_script(
            "sleep 300 & echo $! > grandchild.pid; echo waiting >&2; sleep 300",
            dir.path(),
            &env(),
            &limits(300),
        )
        .await;
        assert!(started.elapsed() < Duration::from_secs(10));
        let reason = failure(outcome);
        assert!(reason.contains("timed out after 300 ms"), "{reason}");
        assert!(reason.contains("stderr: waiting"), "{reason}");
        let pid = read_pid(&dir.path().join("grandchild.pid"));
        // The group got KILL before run_script returned; allow the kernel a moment to tear down.
        wait_gone(pid).await;
        assert!(is_gone(pid), "grandchild {pid} still running");
    }

    /// The pid a test script wrote to `path`.
    fn read_pid(path: &std::path::Path) -> i32 {
        std::fs::read_to_string(path)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// Waits up to a second for `pid` to be gone (the kernel tears a killed process down
    /// asynchronously).
    async fn wait_gone(pid: i32) {
        for _ in 0..50 {
            if is_gone(pid) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn background_leftovers_are_killed_and_do_not_delay_the_verdict() {
        let dir = tempfile::tempdir().unwrap();
        let started = std::time::Instant::now();
        let outcome = run_script(
            "sleep 300 & echo $! > leftover.pid; echo '{\"wakeAgent\": false}'",
            dir.path(),
            &env(),
            &limits(10_000),
        )
        .await;
        assert_eq!(outcome, ScriptOutcome::Skip);
        assert!(started.elapsed() < Duration::from_secs(5));
        let pid = read_pid(&dir.path().join("leftover.pid"));
        wait_gone(pid).await;
        assert!(is_gone(pid), "leftover {pid} still running");
    }

    #[tokio::test]
    async fn leftovers_that_left_the_group_are_killed_too() {
        let dir = tempfile::tempdir().unwrap();
        let outcome = run_script(
            "setsid sleep 300 >/dev/null 2>&1 & echo $! > escaped.pid; echo '{\"wakeAgent\": false}'",
            dir.path(),
            &env(),
            &limits(10_000),
        )
        .await;
        assert_eq!(outcome, ScriptOutcome::Skip);
        let pid = read_pid(&dir.path().join("escaped.pid"));
        wait_gone(pid).await;
        let gone = is_gone(pid);
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        assert!(gone, "the escaped leftover {pid} still runs");
    }

    #[tokio::test]
    async fn huge_output_is_drained_and_the_last_line_still_parses() {
        let outcome = run(
            "head -c 5000000 /dev/zero | tr '\\0' a; echo; head -c 3000000 /dev/zero >&2; \
             echo '{\"wakeAgent\":true,\"data\":\"ok\"}'",
        )
        .await;
        assert_eq!(
            outcome,
            ScriptOutcome::Wake {
                data: Some(Value::from("ok"))
            }
        );
    }

    #[tokio::test]
    async fn overlong_last_line_fails_clearly() {
        let reason = failure(run("head -c 2000000 /dev/zero | tr '\\0' a").await);
        assert!(reason.contains("longer than 1 MiB"), "{reason}");
        assert!(
            reason.contains("only the first 1 MiB were kept"),
            "{reason}"
        );
        assert!(
            reason.len() < 1000,
            "reason should quote a short prefix only"
        );
    }

    #[tokio::test]
    async fn malformed_last_line() {
        let reason =
            failure(run("echo '{\"wakeAgent\": true}'; echo 'all done, nothing to do'").await);
        assert!(reason.contains("not JSON"), "{reason}");
        assert!(reason.contains("all done, nothing to do"), "{reason}");

        let long = "x".repeat(1000);
        let reason = failure(run(&format!("echo {long}")).await);
        assert!(
            reason.contains(&format!("{}…", "x".repeat(200))),
            "{reason}"
        );
        assert!(!reason.contains(&"x".repeat(201)), "{reason}");
    }

    #[tokio::test]
    async fn missing_or_non_boolean_wake_agent() {
        let reason = failure(run(r#"echo '{"data": 1}'"#).await);
        assert!(reason.contains("no \"wakeAgent\""), "{reason}");
        let reason = failure(run(r#"echo '{"wakeAgent": "yes"}'"#).await);
        assert!(reason.contains("not a boolean"), "{reason}");
        let reason = failure(run("echo '[true]'").await);
        assert!(reason.contains("no \"wakeAgent\""), "{reason}");
    }

    #[tokio::test]
    async fn no_output() {
        let reason = failure(run("true").await);
        assert!(reason.contains("no output"), "{reason}");
    }

    #[tokio::test]
    async fn runs_in_cwd_with_exactly_the_given_env() {
        let dir = tempfile::tempdir().unwrap();
        let mut vars = env();
        vars.insert("TASK_VAR".to_owned(), "hello world".to_owned());
        let script = r#"
            names=$(env | cut -d= -f1 | sort | tr '\n' ' ')
            printf '{"wakeAgent":true,"data":{"var":"%s","cwd":"%s","names":"%s"}}\n' "$TASK_VAR" "$PWD" "$names"
        "#;
        let outcome = run_script(script, dir.path(), &vars, &limits(10_000)).await;
        let ScriptOutcome::Wake { data: Some(data) } = outcome else {
            panic!("unexpected {outcome:?}");
        };
        assert_eq!(data["var"], "hello world");
        let cwd = std::fs::canonicalize(dir.path()).unwrap();
        assert_eq!(data["cwd"], cwd.to_string_lossy().as_ref());
        // Only what we passed, plus what bash itself sets; nothing of the runner's environment.
        let allowed = [
            "TASK_VAR",
            "PATH",
            "PWD",
            "SHLVL",
            "_",
            "OLDPWD",
            RUN_MARK_VAR,
        ];
        for name in data["names"].as_str().unwrap().split_whitespace() {
            assert!(
                allowed.contains(&name),
                "unexpected variable {name} in {data}"
            );
        }
    }

    #[tokio::test]
    async fn missing_cwd_is_reported() {
        let outcome = run_script(
            "true",
            Path::new("/nonexistent/agent"),
            &env(),
            &limits(1000),
        )
        .await;
        let reason = failure(outcome);
        assert!(
            reason.contains("/nonexistent/agent does not exist"),
            "{reason}"
        );
    }

    #[tokio::test]
    async fn temp_file_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let outcome = run_script(
            r#"printf '{"wakeAgent":true,"data":"%s"}\n' "$0""#,
            dir.path(),
            &env(),
            &limits(10_000),
        )
        .await;
        let ScriptOutcome::Wake {
            data: Some(Value::String(path)),
        } = outcome
        else {
            panic!("unexpected {outcome:?}");
        };
        assert!(path.ends_with(".sh"), "{path}");
        assert!(!Path::new(&path).exists(), "{path} was not removed");
    }

    #[test]
    fn capture_tracks_lines_across_chunks_and_the_cap() {
        let mut capture = Capture::new(8);
        capture.push(b"first li");
        capture.push(b"ne\n{\"wake");
        capture.push(b"\": 1}\n\n  \n");
        capture.finish();
        assert_eq!(capture.head, b"first li");
        assert!(capture.truncated());
        assert_eq!(capture.last_line, Some((b"{\"wake\":".to_vec(), true)));
    }
}
