//! The two message tables: inserting (with seq allocation) and reading `messages_in` and
//! `messages_out` rows.

use std::sync::LazyLock;

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, Transaction};

use crate::rows::{
    InRow, InStatus, Inserted, MessageIn, MessageOut, NewMessageIn, NewMessageOut, UnusableRow,
};
use crate::sql::{IN_COLUMNS, OUT_COLUMNS};
use crate::time::now_ts;
use crate::{Error, SessionDb};

/// [`SessionDb::messages_out_after`]'s statement (the runner reads it at every result), built
/// once: `prepare_cached` finds it by its text.
pub(crate) static OUT_AFTER_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {OUT_COLUMNS} FROM messages_out
         WHERE seq > ?1 AND seq <= 9223372036854775807 ORDER BY seq LIMIT ?2"
    )
});

impl SessionDb {
    /// Inserts a `messages_in` row with the next even seq.
    pub fn insert_in(&self, row: &NewMessageIn) -> Result<Inserted, Error> {
        self.write(|tx| insert_in_tx(tx, row))
    }

    /// Inserts a `messages_out` row with the next odd seq.
    pub fn insert_out(&self, row: &NewMessageOut) -> Result<Inserted, Error> {
        self.write(|tx| insert_out_tx(tx, row))
    }

    /// One `messages_in` row by id (`None` too for an [`UnusableRow`]).
    pub fn message_in(&self, id: &str) -> Result<Option<MessageIn>, Error> {
        let conn = self.conn()?;
        let sql = format!("SELECT {IN_COLUMNS} FROM messages_in m WHERE id = ?1");
        let row = conn.query_row(&sql, [id], MessageIn::read).optional()?;
        Ok(usable_rows(row.map(Ok))?.pop())
    }

    /// One `messages_in` row by seq (`None` too for an [`UnusableRow`]).
    pub fn message_in_by_seq(&self, seq: i64) -> Result<Option<MessageIn>, Error> {
        let conn = self.conn()?;
        let sql = format!("SELECT {IN_COLUMNS} FROM messages_in m WHERE seq = ?1");
        let row = conn.query_row(&sql, [seq], MessageIn::read).optional()?;
        Ok(usable_rows(row.map(Ok))?.pop())
    }

    /// One `messages_out` row by seq.
    pub fn message_out_by_seq(&self, seq: i64) -> Result<Option<MessageOut>, Error> {
        let conn = self.conn()?;
        let sql = format!("SELECT {OUT_COLUMNS} FROM messages_out WHERE seq = ?1");
        Ok(conn
            .query_row(&sql, [seq], MessageOut::from_row)
            .optional()?)
    }

    /// The highest seq in either table (0 for an empty DB).
    pub fn max_seq(&self) -> Result<i64, Error> {
        let conn = self.conn()?;
        highest_seq(&conn)
    }

    /// `messages_out` rows with seq above `after`, oldest first. A row whose seq is no number
    /// (TEXT, BLOB) has no place in that order and is left out: SQLite sorts it above every number,
    /// so it would come back after every `after` and a follower would print it forever.
    pub fn messages_out_after(&self, after: i64, limit: usize) -> Result<Vec<MessageOut>, Error> {
        messages_out_after_in(&*self.conn()?, after, limit)
    }

    /// `messages_out` rows answering `in_reply_to`.
    pub fn replies_to(&self, in_reply_to: &str) -> Result<Vec<MessageOut>, Error> {
        let conn = self.conn()?;
        let sql =
            format!("SELECT {OUT_COLUMNS} FROM messages_out WHERE in_reply_to = ?1 ORDER BY seq");
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([in_reply_to], MessageOut::from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// `messages_in` rows with the given status, in seq order; [`UnusableRow`]s are left out.
    pub fn messages_in_with_status(&self, status: InStatus) -> Result<Vec<MessageIn>, Error> {
        let conn = self.conn()?;
        let select = format!("SELECT {IN_COLUMNS} FROM messages_in m");
        let sql = format!("{} ORDER BY seq", crate::sql::with_status(&select, status));
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = usable_rows(stmt.query_map([], MessageIn::read)?)?;
        Ok(rows)
    }

    /// Every `messages_in` row, in seq order (tests, diagnostics); [`UnusableRow`]s are left out.
    pub fn all_messages_in(&self) -> Result<Vec<MessageIn>, Error> {
        let conn = self.conn()?;
        let sql = format!("SELECT {IN_COLUMNS} FROM messages_in m ORDER BY seq");
        let mut stmt = conn.prepare(&sql)?;
        let rows = usable_rows(stmt.query_map([], MessageIn::read)?)?;
        Ok(rows)
    }

    /// Every `messages_out` row, in seq order.
    pub fn all_messages_out(&self) -> Result<Vec<MessageOut>, Error> {
        self.messages_out_after(i64::MIN, usize::MAX >> 1)
    }
}

/// [`SessionDb::messages_out_after`] on `conn`.
pub(crate) fn messages_out_after_in(
    conn: &Connection,
    after: i64,
    limit: usize,
) -> Result<Vec<MessageOut>, Error> {
    let mut stmt = conn.prepare_cached(&OUT_AFTER_SQL)?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = stmt.query_map(params![after, limit], MessageOut::from_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The query for `$table`'s highest seq that is a number (no row when there is none), one text
/// for [`highest_seq`] and [`highest_out_seq`] to share.
macro_rules! highest_seq_of {
    ($table:literal) => {
        concat!(
            "SELECT seq FROM ",
            $table,
            " WHERE seq <= 9223372036854775807 ORDER BY seq DESC LIMIT 1"
        )
    };
}

/// The highest numeric seq in either table; 0 when there is none (or only negative ones).
/// SQLite sorts TEXT and BLOB above every number, so a plain `MAX(seq)` would return a bad row's
/// text seq and fail every insert; the `seq <= i64::MAX` bound leaves such values out and still
/// reads the last entry of the seq index. A REAL seq counts rounded up.
pub(crate) fn highest_seq(conn: &Connection) -> Result<i64, Error> {
    let (max_in, max_out) = conn
        .prepare_cached(concat!(
            "SELECT (",
            highest_seq_of!("messages_in"),
            "), (",
            highest_seq_of!("messages_out"),
            ")"
        ))?
        .query_row([], |r| Ok((numeric(r.get_ref(0)?), numeric(r.get_ref(1)?))))?;
    Ok(max_in.max(max_out).max(0))
}

/// The highest numeric seq of `messages_out` (as [`highest_seq`] counts them); 0 when none.
pub(crate) fn highest_out_seq(conn: &Connection) -> Result<i64, Error> {
    let max = conn
        .prepare_cached(highest_seq_of!("messages_out"))?
        .query_row([], |r| Ok(numeric(r.get_ref(0)?)))
        .optional()?;
    Ok(max.unwrap_or(0).max(0))
}

/// A seq as a number: an integer as is, a REAL rounded up (`as` saturates), anything else 0.
fn numeric(value: ValueRef<'_>) -> i64 {
    match value {
        ValueRef::Integer(seq) => seq,
        ValueRef::Real(seq) => seq.ceil() as i64,
        _ => 0,
    }
}

/// The next free seq of the given parity above every seq in both tables. Must run inside the
/// writing transaction so two writers can never take the same number. Checked: past `i64::MAX`
/// it is [`Error::SeqExhausted`], never a wrapped (negative, later colliding) number.
fn next_seq(tx: &Transaction<'_>, odd: bool) -> Result<i64, Error> {
    let max = highest_seq(tx)?;
    let exhausted = || Error::SeqExhausted { max };
    let mut next = max.checked_add(1).ok_or_else(exhausted)?;
    if (next % 2 == 1) != odd {
        next = next.checked_add(1).ok_or_else(exhausted)?;
    }
    Ok(next)
}

/// A fresh row id, for a row inserted without one.
fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Rows read with `MessageIn::read`: the usable ones, in order; the others go to `unusable`.
pub(crate) fn split_rows(
    rows: impl IntoIterator<Item = rusqlite::Result<InRow>>,
    unusable: &mut Vec<UnusableRow>,
) -> Result<Vec<MessageIn>, Error> {
    let mut usable = Vec::new();
    for row in rows {
        match row? {
            InRow::Usable(_, row) => usable.push(row),
            InRow::Unusable(row) => unusable.push(row),
        }
    }
    Ok(usable)
}

/// The usable rows of a listing; [`UnusableRow`]s are left out (the runner's poll takes them
/// out of the queue, with a log line and a system row).
pub(crate) fn usable_rows(
    rows: impl IntoIterator<Item = rusqlite::Result<InRow>>,
) -> Result<Vec<MessageIn>, Error> {
    let mut unusable = Vec::new();
    let usable = split_rows(rows, &mut unusable)?;
    for row in unusable {
        tracing::debug!(rowid = row.rowid, id = ?row.id, reason = %row.reason, "unusable messages_in row left out");
    }
    Ok(usable)
}

/// Inserts a `messages_in` row inside the caller's transaction, with the next even seq.
pub(crate) fn insert_in_tx(tx: &Transaction<'_>, row: &NewMessageIn) -> Result<Inserted, Error> {
    let id = row.id.clone().unwrap_or_else(new_id);
    let seq = next_seq(tx, false)?;
    let timestamp = row.timestamp.clone().unwrap_or_else(now_ts);
    let series_id = if row.series_is_self {
        Some(id.clone())
    } else {
        row.series_id.clone()
    };
    tx.prepare_cached(
        "INSERT INTO messages_in (id, seq, kind, timestamp, status, status_changed, process_after,
           recurrence, series_id, tries, trigger, platform_id, channel_type, thread_id, content,
           source_session_id, on_wake)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
    )?
    .execute(params![
        id,
        seq,
        row.kind,
        timestamp,
        row.status.as_str(),
        now_ts(),
        row.process_after,
        row.recurrence,
        series_id,
        row.trigger,
        row.routing.platform_id,
        row.routing.channel_type,
        row.routing.thread_id,
        row.content,
        row.source_session_id,
        row.on_wake,
    ])?;
    Ok(Inserted { id, seq })
}

/// Inserts a `messages_out` row inside the caller's transaction, with the next odd seq.
pub(crate) fn insert_out_tx(tx: &Transaction<'_>, row: &NewMessageOut) -> Result<Inserted, Error> {
    let id = row.id.clone().unwrap_or_else(new_id);
    let seq = next_seq(tx, true)?;
    tx.prepare_cached(
        "INSERT INTO messages_out (id, seq, in_reply_to, timestamp, deliver_after, kind,
           platform_id, channel_type, thread_id, content)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        id,
        seq,
        row.in_reply_to,
        now_ts(),
        row.deliver_after,
        row.kind.as_str(),
        row.routing.platform_id,
        row.routing.channel_type,
        row.routing.thread_id,
        row.content,
    ])?;
    Ok(Inserted { id, seq })
}
