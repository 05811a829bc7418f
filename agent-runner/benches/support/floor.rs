//! The floor: the DB work of one message with no runner logic, as a process of its own, so a
//! benchmark can print the runner's figures beside the least any runner could do on this machine
//! in the same run (absolute times here drift by 1.5-3x between runs; ratios do not).
//!
//! What the floor does, and nothing else: it notices an insert the way the runner does
//! (`schema::DbWatcher::wait` with the runner's default idle poll as timeout), reads the eligible
//! rows (`SessionDb::eligible`, the runner's poll), claims them in one transaction
//! (`SessionDb::claim`) and writes one reply per row plus the completion in one transaction
//! (`SessionDb::complete`). No prompt, no provider, no runner state, no heartbeat.
//!
//! Use from a bench binary (it re-executes itself, so no helper binary has to be built):
//! ```ignore
//! mod support; // benches/support/mod.rs
//! fn main() {
//!     support::floor::run_if_requested(); // first line: the child side never returns
//!     let child = support::floor::command(&db_path).spawn()?; // the parent side
//! }
//! ```
//! The floor exits when its parent is gone (checked on every idle wake-up) or on SIGTERM.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use schema::{DbWatcher, NewMessageOut, OutKind, SessionDb};

/// The argument that makes a bench binary run as the floor on the DB path that follows it.
const FLOOR_FLAG: &str = "--bench-floor";

/// The runner's default idle poll (`idlePollMs`): the floor waits on its watcher as long.
const IDLE_POLL: Duration = Duration::from_secs(1);

/// The most rows one poll takes (the runner's `maxMessages` plays this part).
const POLL_LIMIT: usize = 100;

/// The copy of this executable that [`command`] starts, once [`pin_executable`] made one.
static PINNED: OnceLock<PathBuf> = OnceLock::new();

/// Copies `source` into `dir` (as `name`) and returns the copy: a run then starts that copy,
/// unaffected by a `cargo build` that relinks the original meanwhile (in a shared checkout the
/// original can be missing for a moment, or become other code, in the middle of a run).
pub(crate) fn pinned_copy(source: &Path, dir: &Path, name: &str) -> std::io::Result<PathBuf> {
    let copy = dir.join(name);
    std::fs::copy(source, &copy)?;
    Ok(copy)
}

/// Makes [`command`] start a copy of this executable in `dir` (see [`pinned_copy`]).
pub(crate) fn pin_executable(dir: &Path) -> std::io::Result<()> {
    let copy = pinned_copy(&std::env::current_exe()?, dir, "bench-floor")?;
    let _ = PINNED.set(copy);
    Ok(())
}

/// The command that starts the floor on `db` (an existing session DB): this very executable (or
/// its pinned copy) with [`FLOOR_FLAG`]. stdin and stdout are null, stderr is inherited (the
/// floor only writes errors).
pub(crate) fn command(db: &Path) -> Command {
    let exe = match PINNED.get() {
        Some(copy) => copy.clone(),
        None => std::env::current_exe()
            .unwrap_or_else(|_| std::env::args().next().unwrap_or_default().into()),
    };
    let mut command = Command::new(exe);
    command
        .arg(FLOOR_FLAG)
        .arg(db)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    command
}

/// When this process was started by [`command`], runs the floor and exits; otherwise returns at
/// once. Call it first in the bench's `main`.
pub(crate) fn run_if_requested() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(FLOOR_FLAG)) {
        return;
    }
    let Some(db) = args.next() else {
        eprintln!("floor: {FLOOR_FLAG} needs the DB path");
        std::process::exit(2);
    };
    let code = match run(Path::new(&db)) {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("floor: {err}");
            1
        }
    };
    std::process::exit(code);
}

fn run(db: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let parent = std::os::unix::process::parent_id();
    let db = SessionDb::open(db)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut watcher = DbWatcher::new(&db)?;
        let mut first_poll = true;
        loop {
            let eligible = db.eligible(chrono::Utc::now(), first_poll, POLL_LIMIT)?;
            first_poll = false;
            if !eligible.rows.is_empty() {
                let ids: Vec<String> = eligible.rows.into_iter().map(|row| row.id).collect();
                let claimed = db.claim(&ids)?;
                let replies: Vec<NewMessageOut> = claimed
                    .iter()
                    .map(|row| {
                        let text = serde_json::json!({ "text": row.content });
                        NewMessageOut::new(OutKind::Chat, row.routing.clone(), &text)
                            .replying_to(Some(row.id.clone()))
                    })
                    .collect();
                let ids: Vec<String> = claimed.into_iter().map(|row| row.id).collect();
                db.complete(&ids, &replies)?;
                continue;
            }
            if std::os::unix::process::parent_id() != parent {
                return Ok(());
            }
            watcher.wait(IDLE_POLL).await;
        }
    })
}
