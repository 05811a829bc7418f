//! Open questions of `ask_user_question`: recording them, and taking their answers.

use chrono::{DateTime, Utc};
use rusqlite::params;
use serde_json::json;

use crate::messages::{insert_out_tx, usable_rows};
use crate::rows::{Inserted, MessageIn, NewMessageOut, RunnerStatus};
use crate::runner_state::swap_runner_status_tx;
use crate::sql::IN_COLUMNS;
use crate::state::set_state_tx;
use crate::time::{format_ts, now_ts};
use crate::{Error, SessionDb};

/// Session-state key prefix for open questions.
pub(crate) const QUESTION_KEY_PREFIX: &str = "question:";

impl SessionDb {
    /// Records an open question that an `ask_user_question` call waits for until `deadline`;
    /// answers to it are held back from the agent until then.
    pub fn open_question(&self, question_id: &str, deadline: DateTime<Utc>) -> Result<(), Error> {
        let value = json!({ "deadline": format_ts(deadline) }).to_string();
        self.set_state(&format!("{QUESTION_KEY_PREFIX}{question_id}"), &value)
    }

    /// Asks a question in ONE transaction: records it as open until `deadline` (see
    /// [`SessionDb::open_question`]), writes the question row and, when `set_waiting` is true,
    /// switches `runner_state.status` from `busy` to `waiting_user`. A reader that sees the
    /// question row therefore also sees the waiting status. Returns the inserted row and whether
    /// the status was switched (false when the runner was not `busy`).
    pub fn post_question(
        &self,
        question_id: &str,
        deadline: DateTime<Utc>,
        row: &NewMessageOut,
        set_waiting: bool,
    ) -> Result<(Inserted, bool), Error> {
        let value = json!({ "deadline": format_ts(deadline) }).to_string();
        self.write(|tx| {
            set_state_tx(tx, &format!("{QUESTION_KEY_PREFIX}{question_id}"), &value)?;
            let inserted = insert_out_tx(tx, row)?;
            let switched = set_waiting
                && swap_runner_status_tx(tx, RunnerStatus::Busy, RunnerStatus::WaitingUser)?;
            Ok((inserted, switched))
        })
    }

    /// Closes an open question.
    pub fn close_question(&self, question_id: &str) -> Result<bool, Error> {
        self.delete_state(&format!("{QUESTION_KEY_PREFIX}{question_id}"))
    }

    /// Withdraws every open question (the turn that asked was stopped); returns how many. The
    /// `ask_user_question` call waiting on one sees it closed ([`SessionDb::question_open`])
    /// and returns; a later answer is an ordinary message.
    pub fn close_open_questions(&self) -> Result<usize, Error> {
        self.write(|tx| {
            Ok(tx
                .prepare_cached("DELETE FROM session_state WHERE substr(key, 1, length(?1)) = ?1")?
                .execute([QUESTION_KEY_PREFIX])?)
        })
    }

    /// Whether `question_id` is still open (asked, and neither answered, timed out nor
    /// withdrawn).
    pub fn question_open(&self, question_id: &str) -> Result<bool, Error> {
        Ok(self
            .state(&format!("{QUESTION_KEY_PREFIX}{question_id}"))?
            .is_some())
    }

    /// Finds a pending answer to `question_id` and completes it, atomically. Returns the answer.
    pub fn take_answer(
        &self,
        question_id: &str,
    ) -> Result<Option<(MessageIn, crate::QuestionAnswer)>, Error> {
        self.write(|tx| {
            let sql = format!(
                "SELECT {IN_COLUMNS} FROM messages_in m WHERE m.status = 'pending'
                 AND m.kind IN ('system', 'chat') AND json_valid(m.content)
                 AND json_extract(m.content, '$.questionId') = ?1 ORDER BY m.seq"
            );
            let candidates =
                usable_rows(tx.prepare_cached(&sql)?.query_map([question_id], MessageIn::read)?)?;
            for row in candidates {
                let content = crate::InboundContent::parse(&row.kind(), &row.content);
                if let Some(answer) = content.question_answer() {
                    tx.execute(
                        "UPDATE messages_in SET status = 'completed', status_changed = ?2 WHERE id = ?1",
                        params![row.id, now_ts()],
                    )?;
                    return Ok(Some((row, answer)));
                }
            }
            Ok(None)
        })
    }
}
