//! The host side of a NanoClaw session (docs/contract/db.md): create a workspace and its session
//! DB, post `messages_in` rows, follow `messages_out`, answer questions, sweep stale claims and
//! report status. The `nanoclaw` binary is a thin CLI over these functions; tests and other hosts
//! can drive the same operations in-process.
//!
//! All SQL lives in the `schema` crate; this crate only builds rows and renders results.
//!
//! A host that cannot open the DB uses [`client::Client`] instead: the same operations over the
//! session API of `nanoclaw serve` ([`api`] holds the wire types), answering the same report
//! types.

pub mod answer;
pub mod api;
pub mod client;
pub mod fleet;
pub mod init;
pub mod interrupt;
pub mod location;
pub mod send;
pub mod serve;
pub mod status;
pub mod sweep;
pub mod system_rows;
pub mod timefmt;
pub mod usage;
pub mod watch;

use std::path::Path;

use anyhow::{bail, Context, Result};
use schema::{OpenOptions, SessionDb};

pub use answer::{answer, find_question, AnswerReport, AnswerRequest, Answered, Question};
pub use init::{init, parse_destination, parse_routing, InitOptions, InitReport};
pub use interrupt::{interrupt, InterruptSent};
pub use send::{send, send_with_key, KeyedSend, Quote, SendKind, SendRequest, Sent};
pub use status::{status, StatusReport};
pub use sweep::{sweep, SweepOutcome};
pub use usage::{usage, UsageReport, UsageRequest};
pub use watch::{render_row, row_json, watch, WatchEnd, WatchOptions, WatchSummary};

/// Opens an existing session DB (creating tables or columns an older DB lacks). A missing file
/// is an error, so a mistyped path never silently creates an empty DB: use [`init`] for that.
pub fn open_existing(path: &Path) -> Result<SessionDb> {
    open_existing_with(path, OpenOptions::default())
}

/// [`open_existing`] with `options` (its time zone is the cron time zone, whatever is given).
pub(crate) fn open_existing_with(path: &Path, options: OpenOptions) -> Result<SessionDb> {
    // First: on a shared filesystem, "no DB there" would send the user to the wrong fix.
    fsguard::refuse_shared_filesystem(path)?;
    if !path.is_file() {
        bail!(
            "no session DB at {} (create it with `nanoclaw init`, or pass --db / SESSION_DB)",
            path.display()
        );
    }
    let options = OpenOptions {
        timezone: send::cron_timezone()?,
        ..options
    };
    SessionDb::open_with(path, options)
        .with_context(|| format!("opening the session DB {}", path.display()))
}
