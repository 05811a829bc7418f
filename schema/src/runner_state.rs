//! `runner_state`: the runner's status, heartbeat, current tool and what a turn waits on.

use rusqlite::{params, Connection, OptionalExtension, Transaction};

use crate::rows::{lenient_int, lossy_text, LastEvent, RunnerState, RunnerStatus, WaitingOn};
use crate::time::now_ts;
use crate::{Error, SessionDb};

impl SessionDb {
    /// Writes the runner_state row (status, pid, provider), refreshing the heartbeat.
    pub fn set_runner_state(
        &self,
        status: RunnerStatus,
        pid: Option<u32>,
        provider: Option<&str>,
    ) -> Result<(), Error> {
        self.write(|tx| set_runner_state_tx(tx, status, pid, provider))
    }

    /// Changes only the status (keeps pid and provider), if the row exists.
    pub fn set_runner_status(&self, status: RunnerStatus) -> Result<(), Error> {
        self.set_runner_state(status, None, None)
    }

    /// Sets the status to `to` only when it is currently `from`; true when it changed.
    pub fn swap_runner_status(&self, from: RunnerStatus, to: RunnerStatus) -> Result<bool, Error> {
        self.write(|tx| swap_runner_status_tx(tx, from, to))
    }

    /// Records the tool the agent is in (or none).
    pub fn set_current_tool(&self, tool: Option<&str>) -> Result<(), Error> {
        self.write(|tx| set_current_tool_tx(tx, tool))
    }

    /// Records what a turn without progress waits on (or clears it with `None`).
    pub fn set_waiting_on(&self, waiting_on: Option<&WaitingOn>) -> Result<(), Error> {
        self.write(|tx| set_waiting_on_tx(tx, waiting_on))
    }

    /// Refreshes `heartbeat_at`.
    pub fn heartbeat(&self) -> Result<(), Error> {
        self.heartbeat_with(None)
    }

    /// Refreshes `heartbeat_at` and, when given, records the turn's last provider event in the
    /// same write: the event's time reaches the DB without a write per event.
    pub fn heartbeat_with(&self, last_event: Option<&LastEvent>) -> Result<(), Error> {
        let json = last_event.map(serde_json::to_string).transpose()?;
        self.write(|tx| {
            tx.prepare_cached(
                "UPDATE runner_state SET heartbeat_at = ?1, last_event = COALESCE(?2, last_event)
                 WHERE id = 1",
            )?
            .execute(params![now_ts(), json])?;
            Ok(())
        })
    }

    /// The runner_state row, if a runner ever started.
    pub fn runner_state(&self) -> Result<Option<RunnerState>, Error> {
        let conn = self.conn()?;
        Ok(read_runner_state(&conn)?)
    }
}

/// The runner_state row through `conn` (also `health`'s read-only connection). Columns are read
/// by name, and the ones later versions added are optional: a DB no runner of this version has
/// migrated yet is still read. Values are read leniently (any storage type as text, a pid that
/// is no integer as none), as the message rows are: a value of the wrong type, whoever wrote
/// it, is a status or a time that does not parse, shown and judged as such, never a failed read
/// that takes `status` and the health check down with it.
pub(crate) fn read_runner_state(conn: &Connection) -> rusqlite::Result<Option<RunnerState>> {
    conn.query_row("SELECT * FROM runner_state WHERE id = 1", [], |r| {
        let text = |column: &str| r.get_ref(column).ok().and_then(lossy_text);
        Ok(RunnerState {
            status: text("status").unwrap_or_default(),
            pid: r.get_ref("pid").ok().and_then(lenient_int),
            provider: text("provider"),
            current_tool: text("current_tool"),
            heartbeat_at: text("heartbeat_at").unwrap_or_default(),
            updated_at: text("updated_at").unwrap_or_default(),
            waiting_on: text("waiting_on"),
            last_event: text("last_event"),
        })
    })
    .optional()
}

/// Sets `runner_state.status` to `to` if it is `from`; true when it was switched.
pub(crate) fn swap_runner_status_tx(
    tx: &Transaction<'_>,
    from: RunnerStatus,
    to: RunnerStatus,
) -> Result<bool, Error> {
    Ok(tx
        .prepare_cached(
            "UPDATE runner_state SET status = ?2, updated_at = ?3 WHERE id = 1 AND status = ?1",
        )?
        .execute(params![from.as_str(), to.as_str(), now_ts()])?
        > 0)
}

/// [`SessionDb::set_runner_state`] inside the caller's transaction.
pub(crate) fn set_runner_state_tx(
    tx: &Transaction<'_>,
    status: RunnerStatus,
    pid: Option<u32>,
    provider: Option<&str>,
) -> Result<(), Error> {
    tx.prepare_cached(
        "INSERT INTO runner_state (id, status, pid, provider, current_tool, heartbeat_at, updated_at,
           start_keys_stamp)
         VALUES (1, ?1, ?2, ?3, NULL, ?4, ?4, random())
         ON CONFLICT(id) DO UPDATE SET status = ?1, pid = COALESCE(?2, pid),
           provider = COALESCE(?3, provider), heartbeat_at = ?4,
           start_keys_stamp = COALESCE(start_keys_stamp, random()),
           updated_at = CASE WHEN status = ?1 AND pid IS COALESCE(?2, pid) THEN updated_at
                        ELSE ?4 END",
    )?
    .execute(params![status.as_str(), pid, provider, now_ts()])?;
    Ok(())
}

/// The runner state after a batch, in one statement: `idle` (as [`set_runner_state_tx`] with
/// no pid or provider), no current batch, no current tool, waiting on nothing.
pub(crate) fn set_idle_tx(tx: &Transaction<'_>) -> Result<(), Error> {
    tx.prepare_cached(
        "INSERT INTO runner_state (id, status, current_tool, waiting_on, heartbeat_at, updated_at)
         VALUES (1, ?1, NULL, NULL, ?2, ?2)
         ON CONFLICT(id) DO UPDATE SET status = ?1, current_batch = NULL, current_tool = NULL,
           waiting_on = NULL, heartbeat_at = ?2,
           updated_at = CASE WHEN status = ?1 THEN updated_at ELSE ?2 END",
    )?
    .execute(params![RunnerStatus::Idle.as_str(), now_ts()])?;
    Ok(())
}

/// [`SessionDb::set_current_tool`] inside the caller's transaction.
pub(crate) fn set_current_tool_tx(tx: &Transaction<'_>, tool: Option<&str>) -> Result<(), Error> {
    tx.prepare_cached("UPDATE runner_state SET current_tool = ?1 WHERE id = 1")?
        .execute([tool])?;
    Ok(())
}

/// [`SessionDb::set_waiting_on`] inside the caller's transaction.
pub(crate) fn set_waiting_on_tx(
    tx: &Transaction<'_>,
    waiting_on: Option<&WaitingOn>,
) -> Result<(), Error> {
    let json = waiting_on.map(serde_json::to_string).transpose()?;
    tx.prepare_cached("UPDATE runner_state SET waiting_on = ?1 WHERE id = 1")?
        .execute([json])?;
    Ok(())
}
