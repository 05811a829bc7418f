//! The host's routing tables: `destinations` and the session's default `session_routing`.

use rusqlite::{params, Connection, OptionalExtension};

use crate::rows::{Destination, Routing};
use crate::{Error, SessionDb};

/// The destination called `name` among `all`: the exact name, else the only one whose name
/// differs by case. `None` when none or several match.
pub fn find_destination<'a>(all: &'a [Destination], name: &str) -> Option<&'a Destination> {
    if let Some(exact) = all.iter().find(|d| d.name == name) {
        return Some(exact);
    }
    let mut folded = all.iter().filter(|d| d.name.eq_ignore_ascii_case(name));
    match (folded.next(), folded.next()) {
        (Some(only), None) => Some(only),
        _ => None,
    }
}

impl SessionDb {
    /// Every destination, by name.
    pub fn destinations(&self) -> Result<Vec<Destination>, Error> {
        destinations_in(&*self.conn()?)
    }

    /// One destination by name, matched as [`find_destination`] does.
    pub fn destination(&self, name: &str) -> Result<Option<Destination>, Error> {
        Ok(find_destination(&self.destinations()?, name).cloned())
    }

    /// Inserts or replaces a destination (host).
    pub fn upsert_destination(&self, destination: &Destination) -> Result<(), Error> {
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO destinations (name, display_name, type, channel_type, platform_id, agent_group_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    destination.name,
                    destination.display_name,
                    destination.kind,
                    destination.channel_type,
                    destination.platform_id,
                    destination.agent_group_id
                ],
            )?;
            Ok(())
        })
    }

    /// The session's default routing.
    pub fn session_routing(&self) -> Result<Option<Routing>, Error> {
        let conn = self.conn()?;
        Ok(conn
            .query_row(
                "SELECT channel_type, platform_id, thread_id FROM session_routing WHERE id = 1",
                [],
                |r| {
                    Ok(Routing {
                        channel_type: r.get(0)?,
                        platform_id: r.get(1)?,
                        thread_id: r.get(2)?,
                    })
                },
            )
            .optional()?)
    }

    /// Sets the session's default routing (host).
    pub fn set_session_routing(&self, routing: &Routing) -> Result<(), Error> {
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO session_routing (id, channel_type, platform_id, thread_id)
                 VALUES (1, ?1, ?2, ?3)",
                params![routing.channel_type, routing.platform_id, routing.thread_id],
            )?;
            Ok(())
        })
    }
}

/// Every destination, by name, on `conn` (in its current transaction, if any).
pub(crate) fn destinations_in(conn: &Connection) -> Result<Vec<Destination>, Error> {
    let mut stmt = conn.prepare_cached(
        "SELECT name, display_name, type, channel_type, platform_id, agent_group_id
         FROM destinations ORDER BY name",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(Destination {
            name: r.get(0)?,
            display_name: r.get(1)?,
            kind: r.get(2)?,
            channel_type: r.get(3)?,
            platform_id: r.get(4)?,
            agent_group_id: r.get(5)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}
