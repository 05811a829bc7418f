//! `delivered`: what the host recorded for each `messages_out` row it delivered.

use rusqlite::{params, OptionalExtension};

use crate::rows::Delivered;
use crate::time::now_ts;
use crate::{Error, SessionDb};

impl SessionDb {
    /// What the host recorded for a delivered row.
    pub fn delivered(&self, message_out_id: &str) -> Result<Option<Delivered>, Error> {
        let conn = self.conn()?;
        Ok(conn
            .query_row(
                "SELECT message_out_id, platform_message_id, status, delivered_at, reason FROM delivered WHERE message_out_id = ?1",
                [message_out_id],
                |r| {
                    Ok(Delivered {
                        message_out_id: r.get(0)?,
                        platform_message_id: r.get(1)?,
                        status: r.get(2)?,
                        delivered_at: r.get(3)?,
                        reason: r.get(4)?,
                    })
                },
            )
            .optional()?)
    }

    /// Records a delivery (host).
    pub fn mark_delivered(
        &self,
        message_out_id: &str,
        platform_message_id: Option<&str>,
        status: &str,
    ) -> Result<(), Error> {
        self.record_delivery(message_out_id, platform_message_id, status, None)
    }

    /// Records a delivery with the reason of a failed one (host); a later record of the same row
    /// replaces it.
    pub fn record_delivery(
        &self,
        message_out_id: &str,
        platform_message_id: Option<&str>,
        status: &str,
        reason: Option<&str>,
    ) -> Result<(), Error> {
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO delivered (message_out_id, platform_message_id, status, delivered_at, reason)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![message_out_id, platform_message_id, status, now_ts(), reason],
            )?;
            Ok(())
        })
    }
}
