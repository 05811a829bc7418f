//! The schema of docs/contract/db.md, its indexes, and the column migrations for older DBs.

/// Tables and indexes, idempotent.
pub(crate) const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS messages_in (
  id             TEXT PRIMARY KEY,
  seq            INTEGER UNIQUE,
  kind           TEXT NOT NULL,
  timestamp      TEXT NOT NULL,
  status         TEXT NOT NULL DEFAULT 'pending',
  status_changed TEXT,
  process_after  TEXT,
  recurrence     TEXT,
  series_id      TEXT,
  tries          INTEGER NOT NULL DEFAULT 0,
  trigger        INTEGER NOT NULL DEFAULT 1,
  platform_id    TEXT, channel_type TEXT, thread_id TEXT,
  content        TEXT NOT NULL,
  source_session_id TEXT,
  on_wake        INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS messages_out (
  id            TEXT PRIMARY KEY,
  seq           INTEGER UNIQUE,
  in_reply_to   TEXT,
  timestamp     TEXT NOT NULL,
  deliver_after TEXT,
  kind          TEXT NOT NULL,
  platform_id TEXT, channel_type TEXT, thread_id TEXT,
  content       TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS delivered (message_out_id TEXT PRIMARY KEY, platform_message_id TEXT,
  status TEXT NOT NULL DEFAULT 'delivered', delivered_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS destinations (name TEXT PRIMARY KEY, display_name TEXT, type TEXT NOT NULL,
  channel_type TEXT, platform_id TEXT, agent_group_id TEXT);
CREATE TABLE IF NOT EXISTS session_routing (id INTEGER PRIMARY KEY CHECK (id = 1),
  channel_type TEXT, platform_id TEXT, thread_id TEXT);
CREATE TABLE IF NOT EXISTS session_state (key TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runner_state (id INTEGER PRIMARY KEY CHECK (id = 1),
  status TEXT NOT NULL,
  pid INTEGER, provider TEXT, current_tool TEXT, heartbeat_at TEXT NOT NULL, updated_at TEXT NOT NULL,
  waiting_on TEXT, last_event TEXT, current_batch TEXT);
CREATE TABLE IF NOT EXISTS turn_usage (id INTEGER PRIMARY KEY AUTOINCREMENT, created_at TEXT NOT NULL,
  provider TEXT NOT NULL, model TEXT, input_tokens INTEGER, output_tokens INTEGER,
  cache_read_tokens INTEGER, cache_write_tokens INTEGER, reasoning_tokens INTEGER, cost_usd REAL,
  requests INTEGER, duration_ms INTEGER, outcome TEXT NOT NULL, message_ids TEXT NOT NULL,
  series_id TEXT);
"#;

/// Indexes for the hot queries; created after migrations so their columns exist.
pub(crate) const INDEXES: &str = r#"
CREATE INDEX IF NOT EXISTS idx_messages_in_pending ON messages_in(status, seq);
CREATE INDEX IF NOT EXISTS idx_messages_in_series ON messages_in(series_id, status);
CREATE INDEX IF NOT EXISTS idx_messages_out_reply ON messages_out(in_reply_to);
CREATE INDEX IF NOT EXISTS idx_turn_usage_created ON turn_usage(created_at);
"#;

/// Every column of every table with its declaration, for adding missing columns to an older DB.
pub(crate) const COLUMNS: &[(&str, &str, &str)] = &[
    ("messages_in", "seq", "INTEGER"),
    ("messages_in", "status", "TEXT NOT NULL DEFAULT 'pending'"),
    ("messages_in", "status_changed", "TEXT"),
    ("messages_in", "process_after", "TEXT"),
    ("messages_in", "recurrence", "TEXT"),
    ("messages_in", "series_id", "TEXT"),
    ("messages_in", "tries", "INTEGER NOT NULL DEFAULT 0"),
    ("messages_in", "trigger", "INTEGER NOT NULL DEFAULT 1"),
    ("messages_in", "platform_id", "TEXT"),
    ("messages_in", "channel_type", "TEXT"),
    ("messages_in", "thread_id", "TEXT"),
    ("messages_in", "source_session_id", "TEXT"),
    ("messages_in", "on_wake", "INTEGER NOT NULL DEFAULT 0"),
    ("messages_out", "seq", "INTEGER"),
    ("messages_out", "in_reply_to", "TEXT"),
    ("messages_out", "deliver_after", "TEXT"),
    ("messages_out", "platform_id", "TEXT"),
    ("messages_out", "channel_type", "TEXT"),
    ("messages_out", "thread_id", "TEXT"),
    ("delivered", "platform_message_id", "TEXT"),
    ("delivered", "status", "TEXT NOT NULL DEFAULT 'delivered'"),
    ("destinations", "display_name", "TEXT"),
    ("destinations", "channel_type", "TEXT"),
    ("destinations", "platform_id", "TEXT"),
    ("destinations", "agent_group_id", "TEXT"),
    ("session_routing", "channel_type", "TEXT"),
    ("session_routing", "platform_id", "TEXT"),
    ("session_routing", "thread_id", "TEXT"),
    ("runner_state", "pid", "INTEGER"),
    ("runner_state", "provider", "TEXT"),
    ("runner_state", "current_tool", "TEXT"),
    ("runner_state", "waiting_on", "TEXT"),
    ("runner_state", "last_event", "TEXT"),
    ("runner_state", "current_batch", "TEXT"),
];

/// Columns of `messages_in`, in the order `MessageIn::read` reads them; the rowid last, the one
/// handle on a row whose id is unreadable.
pub(crate) const IN_COLUMNS: &str =
    "id, seq, kind, timestamp, status, status_changed, process_after, \
     recurrence, series_id, tries, trigger, platform_id, channel_type, thread_id, content, \
     source_session_id, on_wake, rowid";

/// Columns of `messages_out`, in the order `MessageOut::from_row` reads them.
pub(crate) const OUT_COLUMNS: &str =
    "id, seq, in_reply_to, timestamp, deliver_after, kind, platform_id, channel_type, thread_id, content";
