//! The batch the runner is working on: `current_batch` in `session_state` (mcp-tools routes
//! tool output by it, the host's sweep spares its rows while the runner lives) and the
//! runner's status around it. Starting and finishing a batch are one transaction each, so a
//! reader never sees a batch without its `busy` status, or a finished batch still `busy`.

use crate::messages::insert_out_tx;
use crate::rows::{CurrentBatch, Inserted, NewMessageOut, RunnerStatus};
use crate::runner_state::{set_current_tool_tx, set_runner_state_tx, set_waiting_on_tx};
use crate::state::{delete_state_tx, set_state_tx};
use crate::{Error, SessionDb};

/// Session-state key of the batch being worked on.
pub(crate) const CURRENT_BATCH_KEY: &str = "current_batch";

impl SessionDb {
    /// The batch the runner is working on, if any.
    pub fn current_batch(&self) -> Result<Option<CurrentBatch>, Error> {
        match self.state(CURRENT_BATCH_KEY)? {
            None => Ok(None),
            Some(text) => Ok(Some(serde_json::from_str(&text)?)),
        }
    }

    /// Stores (or with `None` clears) the current batch, leaving the runner's status as it
    /// is: the runner widens a running batch with a pushed follow-up this way.
    pub fn set_current_batch(&self, batch: Option<&CurrentBatch>) -> Result<(), Error> {
        let value = batch.map(serde_json::to_string).transpose()?;
        self.write(|tx| match &value {
            Some(value) => set_state_tx(tx, CURRENT_BATCH_KEY, value),
            None => delete_state_tx(tx, CURRENT_BATCH_KEY).map(|_| ()),
        })
    }

    /// Starts a query on `batch` in ONE transaction: stores it as `current_batch` and sets the
    /// runner `busy` (heartbeat refreshed, pid and provider kept). Its rows were claimed
    /// before (pre-agent scripts run on claimed rows, and decide what the batch is).
    pub fn start_batch(&self, batch: &CurrentBatch) -> Result<(), Error> {
        let value = serde_json::to_string(batch)?;
        self.write(|tx| {
            set_state_tx(tx, CURRENT_BATCH_KEY, &value)?;
            set_runner_state_tx(tx, RunnerStatus::Busy, None, None)
        })
    }

    /// Ends the query on the current batch in ONE transaction: writes `report` when there is
    /// one (a failed query's `query_error` row; the batch's rows stay `processing` for the
    /// host's sweep), clears `current_batch`, `current_tool` and `waiting_on`, and sets the
    /// runner `idle`. Replies and completions were written as each result came
    /// ([`SessionDb::complete_at`]). Returns the report's row.
    pub fn finish_batch(&self, report: Option<&NewMessageOut>) -> Result<Option<Inserted>, Error> {
        self.write(|tx| {
            let inserted = report.map(|row| insert_out_tx(tx, row)).transpose()?;
            delete_state_tx(tx, CURRENT_BATCH_KEY)?;
            set_current_tool_tx(tx, None)?;
            set_waiting_on_tx(tx, None)?;
            set_runner_state_tx(tx, RunnerStatus::Idle, None, None)?;
            Ok(inserted)
        })
    }
}

#[cfg(test)]
mod tests {

    use serde_json::json;

    use super::*;
    use crate::rows::{OutKind, Routing, WaitingOn};

    fn open() -> (tempfile::TempDir, SessionDb) {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open(dir.path().join("session.db")).unwrap();
        db.set_runner_state(RunnerStatus::Idle, Some(7), Some("mock"))
            .unwrap();
        (dir, db)
    }

    fn batch() -> CurrentBatch {
        CurrentBatch {
            routing: Routing {
                channel_type: Some("slack".into()),
                platform_id: Some("C1".into()),
                thread_id: Some("t1".into()),
            },
            in_reply_to: Some("m1".into()),
            ids: vec!["m1".into(), "m2".into()],
            sender_id: Some("U1".into()),
        }
    }

    fn report() -> NewMessageOut {
        NewMessageOut::new(
            OutKind::System,
            Routing::default(),
            &json!({"action": "query_error"}),
        )
    }

    /// Makes the next write of the runner's status to `status` fail, as a full disk or a
    /// constraint would, after the transaction's earlier writes succeeded.
    fn fail_when_status_becomes(db: &SessionDb, status: &str) {
        db.dedicated_connection()
            .unwrap()
            .execute_batch(&format!(
                "CREATE TRIGGER injected BEFORE UPDATE ON runner_state
                 WHEN NEW.status = '{status}'
                 BEGIN SELECT RAISE(ABORT, 'injected failure'); END;"
            ))
            .unwrap();
    }

    fn stop_failing(db: &SessionDb) {
        db.dedicated_connection()
            .unwrap()
            .execute_batch("DROP TRIGGER injected")
            .unwrap();
    }

    fn status(db: &SessionDb) -> String {
        db.runner_state().unwrap().unwrap().status
    }

    #[test]
    fn start_and_finish_switch_batch_and_status_together() {
        let (_dir, db) = open();
        db.start_batch(&batch()).unwrap();
        assert_eq!(db.current_batch().unwrap(), Some(batch()));
        let state = db.runner_state().unwrap().unwrap();
        assert_eq!(state.status, "busy");
        assert_eq!(
            (state.pid, state.provider.as_deref()),
            (Some(7), Some("mock"))
        );

        db.set_current_tool(Some("Bash")).unwrap();
        let waiting = WaitingOn {
            endpoint: "http://gw".into(),
            since: "2026-01-01T00:00:00.000Z".into(),
            notices: 1,
            last_notice: None,
        };
        db.set_waiting_on(Some(&waiting)).unwrap();
        let inserted = db.finish_batch(Some(&report())).unwrap().unwrap();
        let state = db.runner_state().unwrap().unwrap();
        assert_eq!(state.status, "idle");
        assert_eq!((state.current_tool, state.waiting_on), (None, None));
        assert_eq!(db.current_batch().unwrap(), None);
        assert_eq!(
            db.message_out_by_seq(inserted.seq).unwrap().unwrap().id,
            inserted.id
        );
        assert_eq!(db.finish_batch(None).unwrap(), None);
    }

    #[test]
    fn a_start_that_fails_midway_leaves_no_batch() {
        let (_dir, db) = open();
        fail_when_status_becomes(&db, "busy");
        db.start_batch(&batch()).unwrap_err();
        assert_eq!(db.current_batch().unwrap(), None);
        assert_eq!(status(&db), "idle");

        stop_failing(&db);
        db.start_batch(&batch()).unwrap();
        assert_eq!(db.current_batch().unwrap(), Some(batch()));
        assert_eq!(status(&db), "busy");
    }

    #[test]
    fn a_finish_that_fails_midway_leaves_the_batch_running_and_writes_no_report() {
        let (_dir, db) = open();
        db.start_batch(&batch()).unwrap();
        db.set_current_tool(Some("Bash")).unwrap();
        fail_when_status_becomes(&db, "idle");
        db.finish_batch(Some(&report())).unwrap_err();
        assert_eq!(db.current_batch().unwrap(), Some(batch()));
        let state = db.runner_state().unwrap().unwrap();
        assert_eq!(
            (state.status.as_str(), state.current_tool.as_deref()),
            ("busy", Some("Bash"))
        );
        assert!(db.all_messages_out().unwrap().is_empty());

        stop_failing(&db);
        db.finish_batch(Some(&report())).unwrap();
        assert_eq!(db.current_batch().unwrap(), None);
        assert_eq!(status(&db), "idle");
        assert_eq!(db.all_messages_out().unwrap().len(), 1);
    }
}
