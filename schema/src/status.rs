//! What the host's `status` reads beyond the runner state and the counts: the newest system row
//! of an action (the last `query_error`).

use rusqlite::OptionalExtension;

use crate::rows::MessageOut;
use crate::sql::OUT_COLUMNS;
use crate::{Error, SessionDb};

impl SessionDb {
    /// The newest `messages_out` system row whose content's `action` is `action` (rows whose
    /// seq is no number are left out, as in [`SessionDb::messages_out_after`]).
    pub fn last_system_out(&self, action: &str) -> Result<Option<MessageOut>, Error> {
        let conn = self.conn()?;
        let sql = format!(
            "SELECT {OUT_COLUMNS} FROM messages_out
             WHERE kind = 'system' AND seq <= 9223372036854775807 AND json_valid(content)
               AND json_extract(content, '$.action') = ?1
             ORDER BY seq DESC LIMIT 1"
        );
        Ok(conn
            .query_row(&sql, [action], MessageOut::from_row)
            .optional()?)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::rows::{NewMessageOut, OutKind, Routing};
    use crate::SessionDb;

    #[test]
    fn the_newest_row_of_the_action() {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open(dir.path().join("session.db")).unwrap();
        let insert = |kind, content: serde_json::Value| {
            db.insert_out(&NewMessageOut::new(kind, Routing::default(), &content))
                .unwrap()
                .seq
        };
        assert_eq!(db.last_system_out("query_error").unwrap(), None);
        insert(
            OutKind::System,
            json!({"action": "query_error", "payload": {"n": 1}}),
        );
        let newest = insert(
            OutKind::System,
            json!({"action": "query_error", "payload": {"n": 2}}),
        );
        insert(
            OutKind::System,
            json!({"action": "task_skipped", "payload": {}}),
        );
        insert(
            OutKind::Chat,
            json!({"action": "query_error", "text": "not a system row"}),
        );
        let row = db.last_system_out("query_error").unwrap().unwrap();
        assert_eq!(row.seq, Some(newest));
    }
}
