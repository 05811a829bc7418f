//! `interrupt`: asks the runner to stop its running turn, through the interrupt row of
//! docs/contract/host-cli.md#interrupt (the runner recognises it even mid-turn).

use anyhow::{Context, Result};
use schema::SessionDb;
use serde::{Deserialize, Serialize};

/// The interrupt row written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterruptSent {
    /// Its id.
    pub id: String,
    /// Its seq.
    pub seq: i64,
    /// The runner's status when it was written (`None`: no runner has started).
    pub runner_status: Option<String>,
    /// Why it may have nothing to stop, for the user (not in `--json`: `runnerStatus` says it).
    #[serde(skip)]
    pub note: Option<String>,
}

/// Writes the interrupt row. The runner completes it without a reply; it ends the turn running
/// then (a row written while idle stops nothing).
pub fn interrupt(db: &SessionDb) -> Result<InterruptSent> {
    let runner_status = db
        .runner_state()
        .context("reading runner_state")?
        .map(|state| state.status);
    let inserted = db
        .insert_interrupt()
        .context("inserting the interrupt row")?;
    let note = match runner_status.as_deref() {
        Some("busy" | "waiting_user") => None,
        Some(status) => Some(format!(
            "the runner is {status}: no turn is running, so this stops nothing"
        )),
        None => {
            Some("no runner has started: the interrupt waits for one and stops nothing".to_owned())
        }
    };
    Ok(InterruptSent {
        id: inserted.id,
        seq: inserted.seq,
        runner_status,
        note,
    })
}
