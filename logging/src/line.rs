//! The one line format of the three binaries, text or JSON (`--log-format`), chosen at run time.
//!
//! Why not tracing-subscriber's own `Format<Json>`: the JSON lines must carry the session (known
//! only once the configuration is read, after logging started) and the fields of the enclosing
//! spans flat (`seqs` of the turn), the format may switch once the config file is read, and the
//! binaries' last words ([`crate::fatal`]) must be one line of the same shape. So one formatter
//! renders both formats from the same fields; span fields are kept as recorded and made JSON
//! when a line needs them ([`SpanFields`]).

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{OnceLock, RwLock};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The environment variable naming the log format (`text` or `json`) of every binary.
pub const LOG_FORMAT_ENV: &str = "NANOCLAW_LOG_FORMAT";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// `2026-01-01T00:00:00.000000Z  INFO turn{seqs=[2,4]}: message key=value` (the default).
    #[default]
    Text,
    /// One JSON object per line, with the session and the enclosing spans' fields.
    Json,
}

impl LogFormat {
    /// The names accepted by `--log-format`, the variable and the `logFormat` key.
    pub const NAMES: [&'static str; 2] = ["text", "json"];

    /// Its name (`text`, `json`).
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }

    /// The format named by [`LOG_FORMAT_ENV`]; `None` when unset, an error when unknown.
    pub fn from_env() -> Result<Option<LogFormat>, UnknownLogFormat> {
        match std::env::var(LOG_FORMAT_ENV) {
            Ok(value) if !value.trim().is_empty() => value.parse().map(Some),
            _ => Ok(None),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A log format name that is neither `text` nor `json`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown log format {0:?}: expected text or json")]
pub struct UnknownLogFormat(pub String);

impl std::str::FromStr for LogFormat {
    type Err = UnknownLogFormat;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(UnknownLogFormat(text.to_owned())),
        }
    }
}

static FORMAT: AtomicU8 = AtomicU8::new(0);
static SESSION: RwLock<Option<String>> = RwLock::new(None);
static PROGRAM: OnceLock<&'static str> = OnceLock::new();

/// Switches every following line to `format` (the config file may name one after logging began).
pub fn set_format(format: LogFormat) {
    FORMAT.store(format as u8, Ordering::Relaxed);
}

/// The format lines are written in now.
pub fn format() -> LogFormat {
    match FORMAT.load(Ordering::Relaxed) {
        0 => LogFormat::Text,
        _ => LogFormat::Json,
    }
}

/// The session every JSON line names (`session`): the session DB's path, once it is known.
pub fn set_session(session: impl Into<String>) {
    let mut slot = SESSION
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *slot = Some(session.into());
}

fn session() -> Option<String> {
    SESSION
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// Names the binary: the `target` of lines written outside `tracing` ([`crate::fatal`]).
pub(crate) fn set_program(program: &'static str) {
    let _ = PROGRAM.set(program);
}

pub(crate) fn program() -> &'static str {
    PROGRAM.get().copied().unwrap_or("nanoclaw")
}

/// The event formatter of [`crate::subscriber`]: text or JSON, as [`format`] says.
#[derive(Debug, Clone, Copy)]
pub struct LineFormat {
    /// Whether text lines name the event's target (module path).
    pub target: bool,
    /// Whether text lines colour the level (stderr is a terminal).
    pub ansi: bool,
}

/// The span field formatter of [`crate::subscriber`]: keeps each span's fields as they were
/// recorded, in a compact text of its own, and makes JSON values of them only when a line is
/// written inside the span. A span is made at every turn's start and most turns log nothing at
/// the level kept, so building JSON there was work for no line (issue 12).
#[derive(Debug, Clone, Copy, Default)]
pub struct SpanFields;

impl<'writer> FormatFields<'writer> for SpanFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut text = SpanFieldText::default();
        fields.record(&mut text);
        writer.write_str(&text.0)
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let mut added = SpanFieldText::default();
        fields.record(&mut added);
        // A name recorded again replaces its earlier value: the earlier one is dropped, so
        // recording a growing list again and again keeps one copy of it.
        let mut kept = SpanFieldText::default();
        for (name, kind, text) in span_field_entries(&current.fields) {
            if !span_field_entries(&added.0).any(|(again, _, _)| again == name) {
                kept.push(name, kind, text);
            }
        }
        kept.0.push_str(&added.0);
        current.fields = kept.0;
        Ok(())
    }
}

/// A span's fields as recorded: per field `<name length>:<name><kind><text length>:<text>`,
/// lengths in bytes, so a name or a value may hold any character. The kinds: `s` a string, `v`
/// a number or a boolean in JSON, `d` a `Debug` text (a list prints as JSON: kept a JSON value).
#[derive(Default)]
struct SpanFieldText(String);

impl SpanFieldText {
    fn push(&mut self, name: &str, kind: char, text: &str) {
        let _ = write!(self.0, "{}:{name}{kind}{}:{text}", name.len(), text.len());
    }
}

impl Visit for SpanFieldText {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field.name(), 's', value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field.name(), 'v', &value.to_string());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field.name(), 'v', &value.to_string());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // As `Value::from` makes it (not finite: null).
        self.push(field.name(), 'v', &Value::from(value).to_string());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field.name(), 'v', if value { "true" } else { "false" });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // A message is text, whatever it starts with (as an event's).
        let kind = if field.name() == "message" { 's' } else { 'd' };
        self.push(field.name(), kind, &format!("{value:?}"));
    }
}

/// The entries of a [`SpanFieldText`], in order: name, kind, text. Stops at the first entry
/// that is not whole (none is: the text is only ever written by [`SpanFieldText::push`]).
fn span_field_entries(text: &str) -> impl Iterator<Item = (&str, char, &str)> {
    /// `<length>:` then that many bytes, and what follows.
    fn counted(text: &str) -> Option<(&str, &str)> {
        let (length, rest) = text.split_once(':')?;
        let length: usize = length.parse().ok()?;
        Some((rest.get(..length)?, rest.get(length..)?))
    }
    let mut rest = text;
    std::iter::from_fn(move || {
        let (name, after) = counted(rest)?;
        let kind = after.chars().next()?;
        let (value, after) = counted(after.get(kind.len_utf8()..)?)?;
        rest = after;
        Some((name, kind, value))
    })
}

/// A span's fields as a JSON object (a later value of a name replaces the earlier one).
fn span_object(text: &str) -> Map<String, Value> {
    let mut object = Map::new();
    for (name, kind, text) in span_field_entries(text) {
        let value = match kind {
            's' => Value::String(text.to_owned()),
            'v' => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned())),
            _ => debug_value(text.to_owned()),
        };
        object.insert(name.to_owned(), value);
    }
    object
}

/// A `Debug` text as a JSON value: a list (`seqs = ?[2, 4]`, `rows = ?ids`) prints as JSON and
/// is kept a JSON value; anything else is a string.
fn debug_value(text: String) -> Value {
    match text.starts_with('[') {
        true => serde_json::from_str(&text).unwrap_or(Value::String(text)),
        false => Value::String(text),
    }
}

impl<S> FormatEvent<S, SpanFields> for LineFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, SpanFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut entries = Entries::default();
        event.record(&mut entries);
        let mut spans = Vec::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let fields = span
                    .extensions()
                    .get::<FormattedFields<SpanFields>>()
                    .map(|formatted| span_object(&formatted.fields))
                    .unwrap_or_default();
                spans.push((span.name(), fields));
            }
        }
        let meta = event.metadata();
        let line = Line {
            level: *meta.level(),
            target: meta.target(),
            message: entries.message.take().unwrap_or_default(),
            fields: entries.list,
            spans,
        };
        let text = match format() {
            LogFormat::Json => line.json(),
            LogFormat::Text => line.text(self.target, self.ansi),
        };
        writer.write_str(&text)
    }
}

/// One field of an event: its JSON value and how text lines show it.
struct Entry {
    name: String,
    json: Value,
    text: String,
}

/// The fields of an event, in order, with its message apart.
#[derive(Default)]
struct Entries {
    message: Option<String>,
    list: Vec<Entry>,
}

impl Entries {
    fn push(&mut self, field: &Field, json: Value, text: String) {
        if field.name() == "message" && self.message.is_none() {
            self.message = Some(text);
            return;
        }
        self.list.push(Entry {
            name: field.name().to_owned(),
            json,
            text,
        });
    }
}

impl Visit for Entries {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" && self.message.is_none() {
            self.message = Some(value.to_owned());
            return;
        }
        self.push(field, Value::String(value.to_owned()), format!("{value:?}"));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field, Value::from(value), value.to_string());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field, Value::from(value), value.to_string());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.push(field, Value::from(value), value.to_string());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, Value::from(value), value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        self.push(field, debug_value(text.clone()), text);
    }
}

/// An event ready to be written in either format.
pub(crate) struct Line<'a> {
    pub(crate) level: Level,
    pub(crate) target: &'a str,
    pub(crate) message: String,
    fields: Vec<Entry>,
    /// The enclosing spans, outermost first, with their fields.
    spans: Vec<(&'static str, Map<String, Value>)>,
}

impl<'a> Line<'a> {
    /// A line with a message only (the binaries' own lines, outside `tracing`).
    pub(crate) fn bare(level: Level, target: &'a str, message: String) -> Self {
        Line {
            level,
            target,
            message,
            fields: Vec::new(),
            spans: Vec::new(),
        }
    }

    /// One JSON object and a newline: the reserved keys first, then the spans' fields (inner
    /// spans win), then the event's. A name already written gets a `_` suffix, never a duplicate.
    pub(crate) fn json(&self) -> String {
        // Written by hand to keep this order (serde_json's map sorts its keys).
        let mut keys: Vec<String> = Vec::with_capacity(8 + self.fields.len());
        let mut out = String::with_capacity(256);
        let mut put = |name: &str, value: &Value| {
            let mut name = name.to_owned();
            while keys.contains(&name) {
                name.push('_');
            }
            out.push(if keys.is_empty() { '{' } else { ',' });
            out.push_str(&Value::String(name.clone()).to_string());
            out.push(':');
            out.push_str(&value.to_string());
            keys.push(name);
        };
        put("timestamp", &Value::String(timestamp()));
        put("level", &Value::String(self.level.as_str().into()));
        put("session", &session().map_or(Value::Null, Value::String));
        put("target", &Value::String(self.target.into()));
        if let Some((name, _)) = self.spans.last() {
            put("span", &Value::String((*name).into()));
        }
        put("message", &Value::String(self.message.clone()));
        let mut span_fields = Map::new();
        for (_, fields) in &self.spans {
            for (name, value) in fields {
                span_fields.insert(name.clone(), value.clone());
            }
        }
        for (name, value) in &span_fields {
            put(name, value);
        }
        for entry in &self.fields {
            put(&entry.name, &entry.json);
        }
        out.push_str("}\n");
        out
    }

    /// `<time> <LEVEL> <span>{<fields>}:…: [<target>: ]<message> <key>=<value>…` and a newline,
    /// control characters escaped so that one event is one line.
    pub(crate) fn text(&self, show_target: bool, ansi: bool) -> String {
        let mut out = String::with_capacity(128);
        let (paint, plain) = match (ansi, self.level) {
            (false, _) => ("", ""),
            (true, Level::ERROR) => ("\x1b[31m", "\x1b[0m"),
            (true, Level::WARN) => ("\x1b[33m", "\x1b[0m"),
            (true, Level::INFO) => ("\x1b[32m", "\x1b[0m"),
            (true, Level::DEBUG) => ("\x1b[34m", "\x1b[0m"),
            (true, _) => ("\x1b[35m", "\x1b[0m"),
        };
        let _ = write!(
            out,
            "{} {paint}{:>5}{plain} ",
            timestamp(),
            self.level.as_str()
        );
        for (name, fields) in &self.spans {
            out.push_str(name);
            if !fields.is_empty() {
                out.push('{');
                for (i, (key, value)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    let shown = match value {
                        Value::String(text) => text.clone(),
                        other => other.to_string(),
                    };
                    let _ = write!(out, "{key}={}", escape_controls(&shown));
                }
                out.push('}');
            }
            out.push_str(": ");
        }
        if show_target {
            let _ = write!(out, "{}: ", self.target);
        }
        out.push_str(&escape_controls(&self.message));
        for entry in &self.fields {
            let _ = write!(out, " {}={}", entry.name, escape_controls(&entry.text));
        }
        out.push('\n');
        out
    }
}

/// `\n`, `\r`, ESC and the other control characters as escapes: a value can never start a line.
fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.into()
}

/// Now, RFC 3339 UTC with microseconds (tracing-subscriber's clock, no time crate of our own).
fn timestamp() -> String {
    let mut text = String::with_capacity(32);
    let _ = SystemTime.format_time(&mut Writer::new(&mut text));
    text
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;
    use tracing_subscriber::registry::SpanData;

    use super::*;

    /// Collects what the formatter writes.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Capture {
        type Writer = Capture;
        fn make_writer(&'a self) -> Capture {
            self.clone()
        }
    }

    /// The lines written for one turn's events, in `format`.
    fn lines(format: LogFormat) -> Vec<String> {
        lines_of(format, || {
            let seqs = [2, 4];
            let turn = tracing::info_span!("turn", seqs = ?seqs);
            let _entered = turn.enter();
            let message = "model API error (HTTP 401)";
            tracing::info!(
                provider = "mock",
                duration_ms = 12u64,
                outcome = "answered",
                "turn ended"
            );
            // A field named like a key of the line's own never replaces it.
            tracing::warn!(error = %message, session = "other", "provider error\nsecond line");
        })
    }

    /// The lines `log` writes, in `format`.
    fn lines_of(format: LogFormat, log: impl FnOnce()) -> Vec<String> {
        // The format is process-wide: one test at a time sets it.
        static SERIAL: Mutex<()> = Mutex::new(());
        let _serial = SERIAL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let capture = Capture::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(capture.clone())
            .fmt_fields(SpanFields)
            .event_format(LineFormat {
                target: false,
                ansi: false,
            })
            .finish();
        set_format(format);
        tracing::subscriber::with_default(subscriber, log);
        set_format(LogFormat::Text);
        let text = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn json_lines_carry_the_session_and_the_span_fields() {
        set_session("/ws/session.db");
        let lines = lines(LogFormat::Json);
        assert_eq!(lines.len(), 2, "{lines:?}");
        // The fixed keys first, in this order, whatever the event's fields.
        let keys: Vec<&str> = lines[0]
            .split(",\"")
            .map(|part| part.trim_start_matches("{\"").split('"').next().unwrap())
            .take(6)
            .collect();
        assert_eq!(
            keys,
            ["timestamp", "level", "session", "target", "span", "message"]
        );
        let first: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(first["session"], "/ws/session.db");
        assert_eq!(first["level"], "INFO");
        assert_eq!(first["span"], "turn");
        assert_eq!(first["seqs"], serde_json::json!([2, 4]));
        assert_eq!(first["message"], "turn ended");
        assert_eq!(first["duration_ms"], 12);
        let second: Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(second["session"], "/ws/session.db");
        assert_eq!(second["session_"], "other");
        assert_eq!(second["message"], "provider error\nsecond line");
        assert_eq!(second["error"], "model API error (HTTP 401)");
    }

    #[test]
    fn text_lines_show_spans_and_fields_one_event_per_line() {
        let lines = lines(LogFormat::Text);
        // The timestamp is the first word.
        let shown: Vec<&str> = lines
            .iter()
            .map(|line| line.split_once(' ').unwrap().1)
            .collect();
        expect_test::expect![[r#"
            [
                " INFO turn{seqs=[2,4]}: turn ended provider=\"mock\" duration_ms=12 outcome=\"answered\"",
                " WARN turn{seqs=[2,4]}: provider error\\nsecond line error=model API error (HTTP 401) session=\"other\"",
            ]
        "#]]
        .assert_debug_eq(&shown);
    }

    #[test]
    fn span_fields_keep_any_text_and_their_last_value() {
        let lines = lines_of(LogFormat::Json, || {
            let ids = ["a\"1:2", "5:x"];
            let span = tracing::info_span!(
                "turn",
                seqs = ?[2],
                note = "3:4s1:\n\u{1f}é",
                ids = ?ids,
                count = -7i64,
                big = u64::MAX,
                ratio = 0.5f64,
                nan = f64::NAN,
                flag = true,
                shape = ?(1, "two"),
            );
            // A list recorded again and again, as a turn's pushed seqs are: one copy is kept.
            for last in 3..=200 {
                span.record(
                    "seqs",
                    tracing::field::debug(&(2..=last).collect::<Vec<_>>()),
                );
            }
            span.in_scope(|| tracing::info!("inside"));
            let kept = span
                .with_subscriber(|(id, dispatch)| {
                    let registry = dispatch.downcast_ref::<tracing_subscriber::Registry>()?;
                    let data = registry.span_data(id)?;
                    let length = data
                        .extensions()
                        .get::<FormattedFields<SpanFields>>()?
                        .fields
                        .len();
                    Some(length)
                })
                .flatten();
            // One copy of the longest list (~800 bytes) and the other fields, not 198 lists.
            assert!(kept.is_some_and(|length| length < 1_200), "{kept:?}");
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(line["seqs"], Value::from((2..=200).collect::<Vec<i64>>()));
        assert_eq!(line["note"], "3:4s1:\n\u{1f}é");
        assert_eq!(line["ids"], serde_json::json!(["a\"1:2", "5:x"]));
        assert_eq!(line["count"], -7);
        assert_eq!(line["big"], u64::MAX);
        assert_eq!(line["ratio"], 0.5);
        assert_eq!(line["nan"], Value::Null);
        assert_eq!(line["flag"], true);
        assert_eq!(line["shape"], "(1, \"two\")");
    }

    #[test]
    fn span_field_text_that_is_not_whole_ends_the_entries() {
        let mut text = SpanFieldText::default();
        text.push("seqs", 'd', "[2]");
        text.push("n", 'v', "1");
        let whole = text.0.clone();
        assert_eq!(span_field_entries(&whole).count(), 2);
        for cut in 0..whole.len() {
            let Some(part) = whole.get(..cut) else {
                continue;
            };
            let entries: Vec<_> = span_field_entries(part).collect();
            assert!(entries.len() < 2, "{part:?} gave {entries:?}");
        }
        assert_eq!(span_field_entries("99:seqs").count(), 0);
        assert_eq!(span_field_entries("x:seqs").count(), 0);
    }

    #[test]
    fn log_format_names_parse() {
        assert_eq!("JSON".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!(" text".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert!("yaml".parse::<LogFormat>().is_err());
    }
}
