//! The batch the runner is working on: `runner_state.current_batch` (mcp-tools routes tool
//! output by it, the host's sweep spares its rows while the runner lives) and the runner's
//! status around it. Starting and finishing a batch are one transaction each, so a reader never
//! sees a batch without its `busy` status, or a finished batch still `busy`. The batch shares
//! the runner's row, which both transactions write anyway: it costs a message no page of its
//! own (it was a `session_state` key, whose table and key index took 2 WAL pages at the claim
//! and 2 at the end; docs/decisions/perf.md#D-PERF-10).

use chrono::{DateTime, Utc};
use rusqlite::{params, OptionalExtension, Transaction};

use crate::messages::insert_out_tx;
use crate::rows::{lossy_text, CurrentBatch, Inserted, NewMessageOut, RunnerStatus};
use crate::runner_state::set_idle_tx;
use crate::time::now_ts;
use crate::{Error, SessionDb};

impl SessionDb {
    /// The batch the runner is working on, if any. Any storage type reads as text, so a value
    /// of the wrong type is a batch that does not parse, not a failed read.
    pub fn current_batch(&self) -> Result<Option<CurrentBatch>, Error> {
        let text: Option<String> = self
            .conn()?
            .prepare_cached("SELECT current_batch FROM runner_state WHERE id = 1")?
            .query_row([], |r| r.get_ref(0).map(lossy_text))
            .optional()?
            .flatten();
        Ok(text.map(|text| serde_json::from_str(&text)).transpose()?)
    }

    /// Stores (or with `None` clears) the current batch, leaving the runner's status as it
    /// is: the runner widens a running batch with a pushed follow-up this way. With no runner
    /// row yet (a DB no runner started on), storing a batch makes one, `busy`.
    pub fn set_current_batch(&self, batch: Option<&CurrentBatch>) -> Result<(), Error> {
        let value = batch.map(serde_json::to_string).transpose()?;
        self.write(|tx| {
            match &value {
                Some(value) => tx
                    .prepare_cached(
                        "INSERT INTO runner_state (id, status, current_batch, heartbeat_at, updated_at)
                         VALUES (1, ?2, ?1, ?3, ?3)
                         ON CONFLICT(id) DO UPDATE SET current_batch = ?1",
                    )?
                    .execute(params![value, RunnerStatus::Busy.as_str(), now_ts()])?,
                None => tx
                    .prepare_cached("UPDATE runner_state SET current_batch = NULL WHERE id = 1")?
                    .execute([])?,
            };
            Ok(())
        })
    }

    /// Starts a query on `batch` in ONE transaction: stores it as `current_batch` and sets the
    /// runner `busy` (heartbeat refreshed, pid and provider kept). Its rows were claimed
    /// before (pre-agent scripts run on claimed rows, and decide what the batch is).
    pub fn start_batch(&self, batch: &CurrentBatch) -> Result<(), Error> {
        self.write(|tx| start_batch_tx(tx, batch))
    }

    /// Ends the query on the current batch in ONE transaction: writes `report` when there is
    /// one (a failed query's `query_error` row; the batch's rows stay `processing` for the
    /// host's sweep), clears `current_batch`, `current_tool` and `waiting_on`, and sets the
    /// runner `idle`. Replies and completions were written as each result came
    /// ([`SessionDb::complete_at`]). Returns the report's row.
    pub fn finish_batch(&self, report: Option<&NewMessageOut>) -> Result<Option<Inserted>, Error> {
        self.write(|tx| finish_batch_tx(tx, report))
    }

    /// [`SessionDb::finish_batch`] that also records the failed (or stopped) turn's `usage` in
    /// the ledger, in the same transaction.
    pub fn finish_batch_with_usage(
        &self,
        report: Option<&NewMessageOut>,
        usage: Option<&crate::NewTurnUsage>,
        now: DateTime<Utc>,
    ) -> Result<Option<Inserted>, Error> {
        self.write(|tx| {
            if let Some(usage) = usage {
                crate::usage::insert_usage_tx(tx, usage, now)?;
            }
            finish_batch_tx(tx, report)
        })
    }

    /// Writes a query's LAST result and ends its batch in ONE transaction: the replies, the
    /// completion of `ids` (with next occurrences, as [`SessionDb::complete_at`]) and what
    /// [`SessionDb::finish_batch`] writes for a query that succeeded. A runner answering one
    /// message at a time thus writes two transactions per message (this one and the claim
    /// that started the batch, [`SessionDb::claim_starting`]), not four.
    pub fn complete_batch_at(
        &self,
        ids: &[String],
        replies: &[NewMessageOut],
        now: DateTime<Utc>,
    ) -> Result<Vec<Inserted>, Error> {
        self.complete_then(ids, replies, now, |tx| finish_batch_tx(tx, None).map(drop))
    }
}

/// [`SessionDb::start_batch`] inside the caller's transaction: one statement, as
/// [`crate::runner_state::set_runner_state_tx`] with status `busy` and no pid or provider, that
/// also stores the batch.
pub(crate) fn start_batch_tx(tx: &Transaction<'_>, batch: &CurrentBatch) -> Result<(), Error> {
    tx.prepare_cached(
        "INSERT INTO runner_state (id, status, current_tool, current_batch, heartbeat_at, updated_at)
         VALUES (1, ?1, NULL, ?2, ?3, ?3)
         ON CONFLICT(id) DO UPDATE SET status = ?1, current_batch = ?2, heartbeat_at = ?3,
           updated_at = CASE WHEN status = ?1 THEN updated_at ELSE ?3 END",
    )?
    .execute(params![
        RunnerStatus::Busy.as_str(),
        serde_json::to_string(batch)?,
        now_ts()
    ])?;
    Ok(())
}

/// [`SessionDb::finish_batch`] inside the caller's transaction.
pub(crate) fn finish_batch_tx(
    tx: &Transaction<'_>,
    report: Option<&NewMessageOut>,
) -> Result<Option<Inserted>, Error> {
    let inserted = report.map(|row| insert_out_tx(tx, row)).transpose()?;
    set_idle_tx(tx)?;
    Ok(inserted)
}

#[cfg(test)]
mod tests {

    use serde_json::json;

    use super::*;
    use crate::rows::{OutKind, Routing, WaitingOn};
    use crate::test_support::count;

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

    /// The WAL pages a batch costs: starting and finishing one writes the runner's row and no
    /// `session_state` row (whose table and key index would be two more pages each time).
    #[test]
    fn a_batch_writes_no_session_state_row() {
        let (_dir, db) = open();
        let session_state_rows = |db: &SessionDb| {
            count(
                &db.dedicated_connection().unwrap(),
                "SELECT count(*) FROM session_state",
            )
        };
        db.start_batch(&batch()).unwrap();
        assert_eq!(
            session_state_rows(&db),
            0,
            "starting a batch wrote session_state"
        );
        assert_eq!(db.current_batch().unwrap(), Some(batch()));
        db.complete_batch_at(&[], &[], Utc::now()).unwrap();
        assert_eq!(session_state_rows(&db), 0);
        assert_eq!(db.current_batch().unwrap(), None);
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
            budget: None,
            approval: None,
            question_id: None,
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

    /// Rows `m1` and `m2` (the ids of [`batch`]), pending.
    fn insert_pending(db: &SessionDb) {
        for id in ["m1", "m2"] {
            let mut row = crate::NewMessageIn::new("chat", r#"{"text":"hi"}"#);
            row.id = Some(id.into());
            db.insert_in(&row).unwrap();
        }
    }

    fn statuses(db: &SessionDb) -> Vec<String> {
        let rows = db.all_messages_in().unwrap();
        rows.into_iter().map(|row| row.status).collect()
    }

    fn ids() -> Vec<String> {
        vec!["m1".into(), "m2".into()]
    }

    #[test]
    fn a_claim_starts_the_batch_it_is_given_in_its_own_transaction() {
        let (_dir, db) = open();
        insert_pending(&db);
        db.set_state("model", "m").unwrap();
        let (rows, started) = db
            .claim_starting(&ids(), |rows, reads| {
                // What the start reads comes back with the batch.
                Ok(Some((batch(), (rows.len(), reads.state("model")?))))
            })
            .unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(started, Some((batch(), (2, Some("m".to_owned())))));
        assert_eq!(statuses(&db), ["processing", "processing"]);
        assert_eq!(db.current_batch().unwrap(), Some(batch()));
        assert_eq!(status(&db), "busy");

        // Without a batch to start, a claim leaves the runner state alone.
        let (_dir, db) = open();
        insert_pending(&db);
        let (rows, started) = db
            .claim_starting(&ids(), |_, _| Ok(None::<(CurrentBatch, ())>))
            .unwrap();
        assert_eq!((rows.len(), started), (2, None));
        assert_eq!(db.current_batch().unwrap(), None);
        assert_eq!(status(&db), "idle");
    }

    #[test]
    fn a_claim_whose_start_fails_claims_nothing() {
        let (_dir, db) = open();
        insert_pending(&db);
        fail_when_status_becomes(&db, "busy");
        db.claim_starting(&ids(), |_, _| Ok(Some((batch(), ()))))
            .unwrap_err();
        assert_eq!(statuses(&db), ["pending", "pending"]);
        assert_eq!(db.current_batch().unwrap(), None);
        assert_eq!(status(&db), "idle");

        // A read of the start that fails takes the claim with it.
        let (_dir, db) = open();
        insert_pending(&db);
        db.claim_starting(
            &ids(),
            |_, _| -> Result<Option<(CurrentBatch, ())>, Error> {
                Err(Error::MissingDirectory("a failed read".into()))
            },
        )
        .unwrap_err();
        assert_eq!(statuses(&db), ["pending", "pending"]);
        assert_eq!(status(&db), "idle");
    }

    #[test]
    fn the_last_result_completes_and_finishes_in_one_transaction() {
        let (_dir, db) = open();
        insert_pending(&db);
        db.claim_starting(&ids(), |_, _| Ok(Some((batch(), ()))))
            .unwrap();
        db.set_current_tool(Some("Bash")).unwrap();
        let reply = NewMessageOut::new(OutKind::Chat, Routing::default(), &json!({"text": "ok"}))
            .replying_to(Some("m2".into()));
        let now = chrono::Utc::now();

        // Failing midway (at the status), nothing of it is left: no reply, rows still
        // processing, the batch still running.
        fail_when_status_becomes(&db, "idle");
        db.complete_batch_at(&ids(), std::slice::from_ref(&reply), now)
            .unwrap_err();
        assert!(db.all_messages_out().unwrap().is_empty());
        assert_eq!(statuses(&db), ["processing", "processing"]);
        assert_eq!(db.current_batch().unwrap(), Some(batch()));
        assert_eq!(status(&db), "busy");

        stop_failing(&db);
        let written = db
            .complete_batch_at(&ids(), std::slice::from_ref(&reply), now)
            .unwrap();
        assert_eq!(written.len(), 1);
        assert_eq!(statuses(&db), ["completed", "completed"]);
        assert_eq!(db.current_batch().unwrap(), None);
        let state = db.runner_state().unwrap().unwrap();
        assert_eq!((state.status.as_str(), state.current_tool), ("idle", None));
    }

    #[test]
    fn the_poll_statements_stay_prepared_across_polls() {
        // SQLite expires a statement whose plan depends on a bound value (`LIMIT ?`) at every
        // new binding and parses it again; the connections turn that off (QPSG).
        let (_dir, db) = open();
        insert_pending(&db);
        for limit in [1, 2, 3, 1] {
            let now = chrono::Utc::now() + chrono::Duration::milliseconds(limit);
            db.eligible(now, false, limit as usize).unwrap();
            db.messages_out_after(limit, limit as usize).unwrap();
        }
        let conn = db.conn().unwrap();
        for sql in [
            crate::queue::ELIGIBLE_SQL.as_str(),
            crate::messages::OUT_AFTER_SQL.as_str(),
        ] {
            let stmt = conn.prepare_cached(sql).unwrap();
            let reprepared = stmt.get_status(rusqlite::StatementStatus::RePrepare);
            let runs = stmt.get_status(rusqlite::StatementStatus::Run);
            assert!(runs >= 4, "not the cached statement ({runs} runs): {sql}");
            assert_eq!(reprepared, 0, "{sql}");
        }
    }
}
