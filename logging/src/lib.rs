//! Logging to stderr for the three binaries (`agent-runner`, `mcp-tools`, `nanoclaw`) that can
//! neither panic nor block the code that logs.
//!
//! Why this exists: `tracing-subscriber`'s fmt layer reports a failed write with `eprintln!`, and
//! `eprintln!` panics when stderr is a pipe whose reader died (the Rust runtime ignores SIGPIPE, so
//! the write fails with EPIPE). That panic, raised inside the task waiting for SIGTERM, left the
//! runner deaf to signals (`agent-runner 2>&1 | tee log`, then Ctrl-C). And a write to a pipe
//! that is alive but not read blocks the thread that logs, possibly the one meant to shut down.
//!
//! So [`Stderr`] only queues each event (bounded) for one writer thread and always reports
//! success: a failed write is ignored, and when the queue is full (stderr not drained) the line
//! is dropped and counted, the count written before the next line that gets through.
//!
//! [`redact`] is the one rule for masking secrets in anything printed (log lines, `Debug` of
//! settings, `agent-runner config`), so every crate that prints masks the same way.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::{MakeWriter, SubscriberBuilder};
use tracing_subscriber::EnvFilter;

mod line;
pub mod redact;

pub use line::{
    format, set_format, set_session, LineFormat, LogFormat, SpanFields, UnknownLogFormat,
    LOG_FORMAT_ENV,
};

/// Lines queued for the writer thread; past this, new lines are dropped until it catches up.
const QUEUE_LINES: usize = 1024;

/// How long [`print_line`] waits for stderr to take the queue, so that exiting never hangs.
const FINAL_FLUSH: Duration = Duration::from_secs(1);

/// A fmt subscriber builder logging through [`Stderr`] in the format of [`format`] (text until
/// [`set_format`]), filtered by `RUST_LOG` or else `default_filter`. `program` names the binary
/// on the lines it writes itself ([`fatal`], [`print_line`] in JSON). Text lines name the target
/// and have no colours; callers may set another [`LineFormat`], then call `init`/`try_init`.
/// It also sends the process's panic messages through the same queue, after the lines logged
/// before them ([`panics_through_the_queue`]).
pub fn subscriber(
    program: &'static str,
    default_filter: &str,
    format: LogFormat,
) -> SubscriberBuilder<SpanFields, LineFormat, EnvFilter, Stderr> {
    line::set_program(program);
    set_format(format);
    panics_through_the_queue();
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(Stderr)
        // Belt and braces: `Stderr` never fails, but never let the layer `eprintln!` either.
        .log_internal_errors(false)
        .fmt_fields(SpanFields)
        .event_format(LineFormat {
            target: true,
            ansi: false,
        })
}

/// The `--help` paragraph on logging shared by the three binaries, `default_filter` being the
/// binary's filter when `RUST_LOG` is unset.
pub fn help(default_filter: &str) -> String {
    format!(
        "Logging (stderr; fields and formats: docs/logs.md):\n  \
         RUST_LOG=<filter>       which lines: a level (error, warn, info, debug, trace) or\n  \
         {pad}directives per module, e.g. RUST_LOG=info,provider=debug [default: \
         {default_filter}]\n  \
         --log-format text|json  json: one JSON object per line, naming the session and the\n  \
         {pad}message seqs of the turn (env {LOG_FORMAT_ENV}) [default: text]",
        pad = " ".repeat(24)
    )
}

/// A binary's fatal error as its last line, written once: `<program>: <text>` in text, one JSON
/// line at level ERROR in JSON. Waits like [`print_line`].
pub fn fatal(text: &str) {
    let program = line::program();
    match format() {
        LogFormat::Text => write_final(format!("{program}: {text}\n").into_bytes()),
        LogFormat::Json => write_final(
            line::Line::bare(tracing::Level::ERROR, program, text.to_owned())
                .json()
                .into_bytes(),
        ),
    }
}

/// Writes `text` and a newline to stderr after the queued log lines, then waits (at most a
/// second) for stderr to take them. For a binary's notes and last words: unlike `eprintln!`, it
/// neither panics on a broken pipe nor hangs on a full one. In JSON it is one JSON line at level
/// INFO, so that every line of stderr parses.
pub fn print_line(text: &str) {
    let bytes = match format() {
        LogFormat::Text => format!("{text}\n").into_bytes(),
        LogFormat::Json => line::Line::bare(tracing::Level::INFO, line::program(), text.to_owned())
            .json()
            .into_bytes(),
    };
    write_final(bytes);
}

/// Queues `bytes` after the log lines and waits (at most a second) for stderr to take them.
fn write_final(bytes: Vec<u8>) {
    let deadline = Instant::now() + FINAL_FLUSH;
    match sink() {
        Some(sink) => {
            if sink.send(Msg::Line(bytes), Some(deadline)) {
                flush_until(sink, deadline);
            }
        }
        None => {
            let _ = io::stderr().write_all(&bytes);
        }
    }
}

/// Waits (at most a second) for the queued lines to reach stderr: call before exiting, or the
/// last lines (`runner stopped`) may be lost with the writer thread.
pub fn flush_at_exit() {
    flush(FINAL_FLUSH);
}

/// Waits at most `timeout` for the queued lines to reach stderr; false if they did not.
pub fn flush(timeout: Duration) -> bool {
    match SINK.get() {
        Some(Some(sink)) => flush_until(sink, Instant::now() + timeout),
        _ => true,
    }
}

/// The writer thread's name: its own panic must not wait for itself.
const WRITER_THREAD: &str = "stderr-log";

/// Installs (once) a panic hook that writes the panic's message (and its backtrace when
/// `RUST_BACKTRACE` asks for one) like [`fatal`]: queued after the lines logged before it, then
/// waited for at most a second. The default hook wrote it straight to stderr, ahead of queued
/// lines and blocking on an undrained pipe; and a panic that unwinds out of `main` skipped the
/// binaries' own flush, so the lines before it were lost with the writer thread. The writer
/// thread's own panic cannot go through its queue and keeps the previous hook.
fn panics_through_the_queue() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            if thread.name() == Some(WRITER_THREAD) {
                return previous(info);
            }
            let backtrace = std::backtrace::Backtrace::capture();
            let backtrace = match backtrace.status() {
                std::backtrace::BacktraceStatus::Captured => format!("\n{backtrace}"),
                _ => String::new(),
            };
            fatal(&format!(
                "thread '{}' {info}{backtrace}",
                thread.name().unwrap_or("<unnamed>")
            ));
        }));
    });
}

/// The [`MakeWriter`] (and writer) of [`subscriber`]: queues what is written for the writer
/// thread and always reports success, so logging never panics, fails or blocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Stderr;

    fn make_writer(&'a self) -> Self::Writer {
        Stderr
    }
}

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match sink() {
            Some(sink) => {
                sink.send(Msg::Line(buf.to_vec()), None);
            }
            // No writer thread could be started: write directly, still ignoring errors.
            None => {
                let _ = io::stderr().write_all(buf);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

enum Msg {
    Line(Vec<u8>),
    /// Answered once every line queued before it was written (or failed).
    Flush(mpsc::Sender<()>),
}

struct Sink {
    tx: SyncSender<Msg>,
    /// Lines dropped because the queue was full, not yet reported.
    dropped: &'static AtomicU64,
}

impl Sink {
    /// Queues `msg`; without a deadline a full queue drops it. True if queued.
    fn send(&self, mut msg: Msg, deadline: Option<Instant>) -> bool {
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => return true,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(back)) => match deadline {
                    Some(deadline) if Instant::now() < deadline => {
                        msg = back;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    _ => {
                        if matches!(back, Msg::Line(_)) {
                            self.dropped.fetch_add(1, Ordering::Relaxed);
                        }
                        return false;
                    }
                },
            }
        }
    }
}

static SINK: OnceLock<Option<Sink>> = OnceLock::new();
static DROPPED: AtomicU64 = AtomicU64::new(0);

fn sink() -> Option<&'static Sink> {
    SINK.get_or_init(|| {
        let (tx, rx) = mpsc::sync_channel(QUEUE_LINES);
        std::thread::Builder::new()
            .name(WRITER_THREAD.into())
            .spawn(move || write_lines(rx, &DROPPED))
            .ok()?;
        Some(Sink {
            tx,
            dropped: &DROPPED,
        })
    })
    .as_ref()
}

fn flush_until(sink: &Sink, deadline: Instant) -> bool {
    let (done, wait) = mpsc::channel();
    if !sink.send(Msg::Flush(done), Some(deadline)) {
        return false;
    }
    wait.recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .is_ok()
}

/// The writer thread. It may block forever on a pipe nobody reads; only it waits then. Write
/// errors (EPIPE, EBADF, ENOSPC) are ignored: there is nowhere left to report them.
fn write_lines(rx: Receiver<Msg>, dropped: &AtomicU64) {
    let mut stderr = io::stderr();
    for msg in rx {
        match msg {
            Msg::Line(bytes) => {
                let lost = dropped.swap(0, Ordering::Relaxed);
                if lost > 0 {
                    let _ = writeln!(
                        stderr,
                        "[{lost} log lines dropped: stderr was not being read]"
                    );
                }
                let _ = stderr.write_all(&bytes);
            }
            Msg::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// Set in the copy of [`the_lines_before_a_panic_are_written_before_its_message`] that logs
    /// and panics.
    const PANIC_CHILD: &str = "NANOCLAW_TEST_LOG_PANIC_CHILD";
    const LINES_BEFORE_PANIC: usize = 1000;

    #[test]
    fn the_lines_before_a_panic_are_written_before_its_message() {
        let test = "tests::the_lines_before_a_panic_are_written_before_its_message";
        if std::env::var_os(PANIC_CHILD).is_some() {
            let _ = subscriber("logging-test", "info", LogFormat::Text).try_init();
            for n in 0..LINES_BEFORE_PANIC {
                // Long lines: together they are more than a pipe holds.
                tracing::info!("line {n} before the panic {}", "x".repeat(200));
            }
            let _ = std::panic::catch_unwind(|| panic!("the test's panic"));
            // Exits at once, as when a panic unwinds out of `main`: no flush of its own.
            std::process::exit(0);
        }
        // stderr is a pipe read only after a while: most lines are still queued when the
        // child panics, as behind a slow reader.
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(PANIC_CHILD, "1")
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "{status}: {stderr}");
        assert_eq!(stderr.matches("the test's panic").count(), 1, "{stderr}");
        let panic_at = stderr
            .find("logging-test: thread '")
            .unwrap_or_else(|| panic!("no panic line in: {stderr}"));
        assert!(
            stderr[panic_at..].contains("panicked at") && stderr[panic_at..].contains("lib.rs"),
            "{}",
            &stderr[panic_at..]
        );
        let logged = stderr[..panic_at]
            .lines()
            .filter(|l| l.contains("before the panic"))
            .count();
        assert_eq!(
            logged,
            LINES_BEFORE_PANIC,
            "lines before the panic's message; after it: {}",
            stderr[panic_at..].lines().count()
        );
    }

    #[test]
    fn writes_always_succeed_and_flush_completes() {
        let mut writer = Stderr.make_writer();
        assert_eq!(writer.write(b"logging test line\n").ok(), Some(18));
        assert!(flush(Duration::from_secs(5)));
    }
}

/// `err` and its sources, joined with `: `, leaving out a source whose text the chain already
/// holds. HTTP clients' own messages say little ("error sending request"); the cause that names
/// the fix (connection refused, a DNS failure) is a source or two down.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod error_chain_tests {
    use super::error_chain;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn sources_are_joined_and_repeats_left_out() {
        let err = Layer(
            "error sending request",
            Some(Box::new(Layer(
                "client error (Connect)",
                Some(Box::new(Layer("Connection refused (os error 111)", None))),
            ))),
        );
        assert_eq!(
            error_chain(&err),
            "error sending request: client error (Connect): Connection refused (os error 111)"
        );
        let repeated = Layer(
            "timed out: deadline",
            Some(Box::new(Layer("deadline", None))),
        );
        assert_eq!(error_chain(&repeated), "timed out: deadline");
    }
}
