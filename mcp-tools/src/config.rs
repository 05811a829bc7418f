//! Startup configuration: command-line flags, each with an environment variable behind it.
//!
//! | flag | env | default |
//! |---|---|---|
//! | `--db` | `SESSION_DB` | `<workspace>/session.db` |
//! | `--workspace` | `WORKSPACE_DIR` | `/workspace` |
//! | `--tz` | `TZ` | `UTC` (an IANA name; anything else is a startup error) |
//! | `--admin-user-id` | `NANOCLAW_ADMIN_USER_ID` | none: `register_agent_group` is refused |
//! | `--max-file-bytes` | `NANOCLAW_MAX_FILE_BYTES` | 25 MiB |
//! | `--max-text-bytes` | `NANOCLAW_MAX_TEXT_BYTES` | 64 KiB |
//! | `--max-question-timeout` | `NANOCLAW_MAX_QUESTION_TIMEOUT` | 300 (seconds) |
//! | `--log-format` | `NANOCLAW_LOG_FORMAT` | `text` (`json`: one JSON object per stderr line) |
//!
//! Relative `--db` and `--workspace` values (flags or variables) are made absolute once, here,
//! against this process's working directory (`fsguard::absolute`); a default DB is
//! `<workspace>/session.db` of that absolute workspace.
//!
//! The agent's folder is `<workspace>/agent` (relative `send_file` paths start there), files
//! are copied to `<workspace>/outbox/<row id>/`, and `send_file` may read from
//! `<workspace>/agent`, `<workspace>/extra` and `<workspace>/downloads` only.

use std::path::PathBuf;
use std::time::Duration;

use chrono_tz::Tz;

/// Default cap on a file sent with `send_file`.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 25 * 1024 * 1024;
/// Default cap on the text of one message.
pub const DEFAULT_MAX_TEXT_BYTES: usize = 64 * 1024;
/// Default (and default maximum) time `ask_user_question` waits for an answer.
pub const DEFAULT_QUESTION_TIMEOUT: Duration = Duration::from_secs(300);
/// The log filter when `RUST_LOG` is unset: the server's own lines, others' warnings.
pub const DEFAULT_LOG_FILTER: &str = "warn,mcp_tools=info";

/// Command-line flags (each falls back to its environment variable).
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "mcp-tools",
    version,
    about = "The nanoclaw MCP server (stdio): tools that write rows into the session DB",
    after_help = logging::help(DEFAULT_LOG_FILTER)
)]
pub struct Args {
    /// Path of the session DB (its folder must exist).
    #[arg(long, env = "SESSION_DB")]
    pub db: Option<PathBuf>,
    /// Workspace root; the agent's folder is `<workspace>/agent`.
    #[arg(long, env = "WORKSPACE_DIR", default_value = "/workspace")]
    pub workspace: PathBuf,
    /// IANA time zone for local times and cron schedules.
    #[arg(long = "tz", env = "TZ")]
    pub timezone: Option<String>,
    /// Chat user id allowed to call `register_agent_group`.
    #[arg(long, env = "NANOCLAW_ADMIN_USER_ID")]
    pub admin_user_id: Option<String>,
    /// Largest file `send_file` accepts, in bytes.
    #[arg(long, env = "NANOCLAW_MAX_FILE_BYTES", default_value_t = DEFAULT_MAX_FILE_BYTES)]
    pub max_file_bytes: u64,
    /// Longest message text accepted, in bytes.
    #[arg(long, env = "NANOCLAW_MAX_TEXT_BYTES", default_value_t = DEFAULT_MAX_TEXT_BYTES)]
    pub max_text_bytes: usize,
    /// Upper bound (and default) for `ask_user_question`'s timeout, in seconds.
    #[arg(long, env = "NANOCLAW_MAX_QUESTION_TIMEOUT", default_value_t = DEFAULT_QUESTION_TIMEOUT.as_secs_f64())]
    pub max_question_timeout: f64,
    /// Log lines on stderr: text, or json for one JSON object per line [default: text].
    #[arg(long, env = logging::LOG_FORMAT_ENV, value_name = "text|json")]
    pub log_format: Option<logging::LogFormat>,
}

/// A configuration error, reported at startup.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `TZ` is not an IANA zone name.
    #[error(
        "TZ={0:?} is not an IANA time zone name (expected something like America/New_York or UTC)"
    )]
    BadTimeZone(String),
    /// A limit that must be positive is not.
    #[error("{0} must be a positive number")]
    NotPositive(&'static str),
    /// A path setting that cannot be made absolute (the current directory is gone).
    #[error(transparent)]
    Path(#[from] fsguard::PathSettingError),
}

/// The resolved configuration the server runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// Session DB path.
    pub db_path: PathBuf,
    /// Workspace root.
    pub workspace: PathBuf,
    /// Time zone for local times and cron.
    pub timezone: Tz,
    /// Admin user id, if configured.
    pub admin_user_id: Option<String>,
    /// `send_file` size cap in bytes.
    pub max_file_bytes: u64,
    /// Message text cap in bytes.
    pub max_text_bytes: usize,
    /// `ask_user_question` timeout cap (also its default).
    pub max_question_timeout: Duration,
}

impl Args {
    /// The session DB, absolute: `--db`, else `<workspace>/session.db`.
    pub fn db_path(&self) -> Result<PathBuf, ConfigError> {
        Ok(match &self.db {
            Some(db) => fsguard::absolute("--db (SESSION_DB)", db)?,
            None => self.workspace_path()?.join("session.db"),
        })
    }

    /// The workspace root, absolute.
    pub fn workspace_path(&self) -> Result<PathBuf, ConfigError> {
        Ok(fsguard::absolute(
            "--workspace (WORKSPACE_DIR)",
            &self.workspace,
        )?)
    }
}

impl Config {
    /// Resolves flags and environment into a configuration.
    pub fn from_args(args: Args) -> Result<Self, ConfigError> {
        let timezone = match args.timezone.as_deref().map(str::trim) {
            None | Some("") => Tz::UTC,
            Some(name) => {
                // POSIX allows a leading ':' ("TZ=:America/New_York").
                let name = name.strip_prefix(':').unwrap_or(name);
                name.parse::<Tz>()
                    .map_err(|_| ConfigError::BadTimeZone(name.to_owned()))?
            }
        };
        if args.max_file_bytes == 0 {
            return Err(ConfigError::NotPositive("--max-file-bytes"));
        }
        if args.max_text_bytes == 0 {
            return Err(ConfigError::NotPositive("--max-text-bytes"));
        }
        if !(args.max_question_timeout.is_finite() && args.max_question_timeout > 0.0) {
            return Err(ConfigError::NotPositive("--max-question-timeout"));
        }
        let db_path = args.db_path()?;
        Ok(Self {
            db_path,
            workspace: args.workspace_path()?,
            timezone,
            admin_user_id: args
                .admin_user_id
                .map(|id| id.trim().to_owned())
                .filter(|id| !id.is_empty()),
            max_file_bytes: args.max_file_bytes,
            max_text_bytes: args.max_text_bytes,
            max_question_timeout: Duration::from_secs_f64(args.max_question_timeout),
        })
    }

    /// A configuration with defaults for everything but the DB and workspace (tests).
    pub fn new(db_path: PathBuf, workspace: PathBuf) -> Self {
        Self {
            db_path,
            workspace,
            timezone: Tz::UTC,
            admin_user_id: None,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_text_bytes: DEFAULT_MAX_TEXT_BYTES,
            max_question_timeout: DEFAULT_QUESTION_TIMEOUT,
        }
    }

    /// The agent's folder: relative `send_file` paths start here.
    pub fn agent_dir(&self) -> PathBuf {
        self.workspace.join("agent")
    }

    /// Where `send_file` copies files to.
    pub fn outbox_dir(&self) -> PathBuf {
        self.workspace.join("outbox")
    }

    /// Folders `send_file` may read from.
    pub fn readable_roots(&self) -> Vec<PathBuf> {
        vec![
            self.agent_dir(),
            self.workspace.join("extra"),
            self.workspace.join("downloads"),
        ]
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<Config, ConfigError> {
        let mut argv = vec!["mcp-tools"];
        argv.extend_from_slice(args);
        Config::from_args(Args::try_parse_from(argv).unwrap())
    }

    #[test]
    fn bad_time_zone_names_tz() {
        let err = parse(&["--tz", "Mars/Olympus"]).unwrap_err().to_string();
        assert!(err.contains("TZ=\"Mars/Olympus\""), "{err}");
        assert_eq!(
            parse(&["--tz", ":Europe/Berlin"]).unwrap().timezone,
            chrono_tz::Europe::Berlin
        );
    }

    #[test]
    fn db_defaults_into_the_workspace() {
        let config = parse(&["--workspace", "/w", "--db", "/x/s.db"]).unwrap();
        assert_eq!(config.db_path, PathBuf::from("/x/s.db"));
        assert_eq!(config.agent_dir(), PathBuf::from("/w/agent"));
        assert!(parse(&["--max-file-bytes", "0"]).is_err());
    }
}
