//! Where a message addressed to a destination by name goes. One rule for the runner's
//! `<message to="name">` replies and mcp-tools' `to` parameters, so the two can't drift:
//!
//! 1. The name matches a destination exactly, else case-insensitively when only one does (the
//!    prompt shows names as `from="..."`; models re-case them).
//! 2. The destination's channel; an agent destination stored without a channel (as the host
//!    stores them: `type='agent'` and only `agent_group_id`) is channel type `agent` with the
//!    agent group id as platform id.
//! 3. The thread: when a message of the batch being answered came from that same channel, the
//!    thread of the newest such message (a reply by name to the channel a thread came from
//!    answers in that thread, as a bare reply does); otherwise the channel's root.

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension};

use crate::{Destination, Error, Routing, SessionDb};

/// What a destination name resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestinationRoute {
    /// The routing the message carries.
    Found(Routing),
    /// No destination has that name (or several differ only by case).
    Unknown {
        /// Every destination name, for an error that lists them.
        known: Vec<String>,
    },
}

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
    /// The routing of a message addressed to the destination `name` while answering the
    /// inbound rows `batch` (their ids; unknown ids are ignored). See the module docs.
    pub fn route_to_destination(
        &self,
        name: &str,
        batch: &[String],
    ) -> Result<DestinationRoute, Error> {
        route_in(&*self.conn()?, name, batch)
    }
}

/// [`SessionDb::route_to_destination`] on `conn` (one snapshot when inside a transaction).
pub(crate) fn route_in(
    conn: &Connection,
    name: &str,
    batch: &[String],
) -> Result<DestinationRoute, Error> {
    let all = crate::destinations::destinations_in(conn)?;
    let Some(destination) = find_destination(&all, name) else {
        return Ok(DestinationRoute::Unknown {
            known: all.into_iter().map(|d| d.name).collect(),
        });
    };
    let mut routing = destination.routing();
    if routing.channel_type.is_some() || routing.platform_id.is_some() {
        routing.thread_id = newest_thread_from(conn, &routing, batch)?;
    }
    Ok(DestinationRoute::Found(routing))
}

/// The thread of the newest row of `batch` that came from `channel` (its channel type and
/// platform id), if any row did and has a thread.
fn newest_thread_from(
    conn: &Connection,
    channel: &Routing,
    batch: &[String],
) -> Result<Option<String>, Error> {
    if batch.is_empty() {
        return Ok(None);
    }
    let ids = serde_json::to_string(batch)?;
    let thread = conn
        .query_row(
            "SELECT thread_id FROM messages_in
             WHERE id IN (SELECT value FROM json_each(?1))
               AND channel_type IS ?2 AND platform_id IS ?3
             ORDER BY seq DESC LIMIT 1",
            rusqlite::params![ids, channel.channel_type, channel.platform_id],
            // Whatever the host stored there: text as is, a number as its digits.
            |row| {
                Ok(match row.get_ref(0)? {
                    ValueRef::Text(text) => Some(String::from_utf8_lossy(text).into_owned()),
                    ValueRef::Integer(n) => Some(n.to_string()),
                    ValueRef::Real(x) => Some(x.to_string()),
                    ValueRef::Null | ValueRef::Blob(_) => None,
                })
            },
        )
        .optional()?;
    Ok(thread.flatten().filter(|t| !t.is_empty()))
}

/// The cases both routing paths are tested with (the runner's `<message to>` reply in
/// agent-runner's tests, mcp-tools' `send_message(to)` in its MCP tests): one table, so the two
/// paths are held to the same answers.
#[cfg(any(test, feature = "testing"))]
pub mod cases {
    use crate::{Destination, Routing};

    /// One case: destinations, the batch being answered, the name used, the routing expected.
    #[derive(Debug, Clone)]
    pub struct Case {
        /// What the case shows.
        pub name: &'static str,
        /// The session's destinations.
        pub destinations: Vec<Destination>,
        /// The routing of each inbound row of the batch, oldest first.
        pub batch: Vec<Routing>,
        /// The destination name the agent used.
        pub to: &'static str,
        /// The routing the message must carry; `None`: refused as unknown.
        pub expected: Option<Routing>,
    }

    fn routing(channel: &str, platform: &str, thread: Option<&str>) -> Routing {
        Routing {
            channel_type: Some(channel.to_owned()),
            platform_id: Some(platform.to_owned()),
            thread_id: thread.map(str::to_owned),
        }
    }

    fn channel(name: &str, channel: &str, platform: &str) -> Destination {
        Destination {
            name: name.to_owned(),
            display_name: None,
            kind: "channel".to_owned(),
            channel_type: Some(channel.to_owned()),
            platform_id: Some(platform.to_owned()),
            agent_group_id: None,
        }
    }

    /// Every case.
    pub fn all() -> Vec<Case> {
        let team = channel("team", "slack", "C-team");
        let ops = channel("ops", "slack", "C-ops");
        let helper = Destination {
            name: "helper".to_owned(),
            display_name: None,
            kind: "agent".to_owned(),
            channel_type: None,
            platform_id: None,
            agent_group_id: Some("ag-helper".to_owned()),
        };
        vec![
            Case {
                name: "a reply by name to the channel the thread came from stays in the thread",
                destinations: vec![team.clone(), ops.clone()],
                batch: vec![routing("slack", "C-team", Some("T-1"))],
                to: "team",
                expected: Some(routing("slack", "C-team", Some("T-1"))),
            },
            Case {
                name: "names match case-insensitively when only one destination matches",
                destinations: vec![team.clone(), ops.clone()],
                batch: vec![routing("slack", "C-team", Some("T-1"))],
                to: "TEAM",
                expected: Some(routing("slack", "C-team", Some("T-1"))),
            },
            Case {
                name: "the newest message of the batch from that channel gives the thread",
                destinations: vec![team.clone(), ops.clone()],
                batch: vec![
                    routing("slack", "C-team", Some("T-old")),
                    routing("slack", "C-ops", Some("T-ops")),
                    routing("slack", "C-team", Some("T-new")),
                    routing("slack", "C-ops", None),
                ],
                to: "team",
                expected: Some(routing("slack", "C-team", Some("T-new"))),
            },
            Case {
                name: "another channel than the batch's goes to that channel's root",
                destinations: vec![team.clone(), ops.clone()],
                batch: vec![routing("slack", "C-team", Some("T-1"))],
                to: "ops",
                expected: Some(routing("slack", "C-ops", None)),
            },
            Case {
                name: "an agent destination without a channel is addressed by its agent group",
                destinations: vec![team.clone(), helper],
                batch: vec![routing("slack", "C-team", Some("T-1"))],
                to: "helper",
                expected: Some(routing("agent", "ag-helper", None)),
            },
            Case {
                name: "an unknown name is refused",
                destinations: vec![team.clone(), ops],
                batch: vec![routing("slack", "C-team", Some("T-1"))],
                to: "nobody",
                expected: None,
            },
            Case {
                name: "names differing only by case are ambiguous and refused",
                destinations: vec![team, channel("Team", "slack", "C-other")],
                batch: vec![routing("slack", "C-team", Some("T-1"))],
                to: "TEAM",
                expected: None,
            },
        ]
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::NewMessageIn;

    #[test]
    fn every_case_routes_as_expected() {
        for case in cases::all() {
            let dir = tempfile::tempdir().unwrap();
            let db = SessionDb::open(dir.path().join("session.db")).unwrap();
            for destination in &case.destinations {
                db.upsert_destination(destination).unwrap();
            }
            let mut ids = Vec::new();
            for routing in &case.batch {
                let row = NewMessageIn {
                    routing: routing.clone(),
                    ..NewMessageIn::new("chat", r#"{"text":"hi"}"#)
                };
                ids.push(db.insert_in(&row).unwrap().id);
            }
            let got = db.route_to_destination(case.to, &ids).unwrap();
            match (&case.expected, got) {
                (Some(expected), DestinationRoute::Found(routing)) => {
                    assert_eq!(&routing, expected, "{}", case.name)
                }
                (None, DestinationRoute::Unknown { known }) => {
                    assert_eq!(known.len(), case.destinations.len(), "{}", case.name)
                }
                (expected, got) => panic!("{}: expected {expected:?}, got {got:?}", case.name),
            }
        }
    }
}
