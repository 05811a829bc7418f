//! Where a message addressed to a destination by name goes. One rule for the runner's
//! `<message to="name">` replies and mcp-tools' `to` parameters, so the two can't drift:
//!
//! 1. The name matches a destination exactly, else case-insensitively when only one does (the
//!    prompt shows names as `from="..."`; models re-case them).
//! 2. The destination's channel; an agent destination stored without a channel (as the host
//!    stores them: `type='agent'` and only `agent_group_id`) is channel type `agent` with the
//!    agent group id as platform id.
//! 3. The thread and `in_reply_to`: when a message of the batch being answered came from that
//!    same channel, the thread and the id of the newest such message (a reply by name to the
//!    channel a thread came from answers in that thread and names that message, as a bare reply
//!    does); otherwise the channel's root, and the batch's own `in_reply_to`. A reply routed to
//!    Slack never names the Discord message of the same batch: hosts quote and thread by it.

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension};

pub use crate::destinations::find_destination;
use crate::{Error, Routing, SessionDb};

/// What a destination name resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestinationRoute {
    /// Where the message goes and what it answers.
    Found {
        /// The routing the message carries.
        routing: Routing,
        /// The inbound row it answers: the newest batch row from that destination's channel,
        /// else the batch's own `in_reply_to` (as given to the routing call).
        in_reply_to: Option<String>,
    },
    /// No destination has that name (or several differ only by case).
    Unknown {
        /// Every destination name, for an error that lists them.
        known: Vec<String>,
    },
}

impl SessionDb {
    /// The routing of a message addressed to the destination `name` while answering the
    /// inbound rows `batch` (their ids; unknown ids are ignored) whose own reply target is
    /// `batch_reply`. See the module docs.
    pub fn route_to_destination(
        &self,
        name: &str,
        batch: &[String],
        batch_reply: Option<&str>,
    ) -> Result<DestinationRoute, Error> {
        route_in(&*self.conn()?, name, batch, batch_reply)
    }
}

/// [`SessionDb::route_to_destination`] on `conn` (one snapshot when inside a transaction).
pub(crate) fn route_in(
    conn: &Connection,
    name: &str,
    batch: &[String],
    batch_reply: Option<&str>,
) -> Result<DestinationRoute, Error> {
    let all = crate::destinations::destinations_in(conn)?;
    let Some(destination) = find_destination(&all, name) else {
        return Ok(DestinationRoute::Unknown {
            known: all.into_iter().map(|d| d.name).collect(),
        });
    };
    let mut routing = destination.routing();
    let mut in_reply_to = batch_reply.map(str::to_owned);
    if routing.channel_type.is_some() || routing.platform_id.is_some() {
        if let Some(newest) = newest_row_from(conn, &routing, batch)? {
            routing.thread_id = newest.thread_id;
            in_reply_to = Some(newest.id);
        }
    }
    Ok(DestinationRoute::Found {
        routing,
        in_reply_to,
    })
}

/// The newest row of a batch from one channel: what a reply to that channel answers.
struct NewestFrom {
    id: String,
    thread_id: Option<String>,
}

/// The newest row of `batch` that came from `channel` (its channel type and platform id), if
/// any did.
fn newest_row_from(
    conn: &Connection,
    channel: &Routing,
    batch: &[String],
) -> Result<Option<NewestFrom>, Error> {
    if batch.is_empty() {
        return Ok(None);
    }
    let ids = serde_json::to_string(batch)?;
    let newest = conn
        .query_row(
            "SELECT id, thread_id FROM messages_in
             WHERE id IN (SELECT value FROM json_each(?1))
               AND channel_type IS ?2 AND platform_id IS ?3
             ORDER BY seq DESC LIMIT 1",
            rusqlite::params![ids, channel.channel_type, channel.platform_id],
            |row| {
                // Whatever the host stored as the thread: text as is, a number as its digits.
                let thread_id = match row.get_ref(1)? {
                    ValueRef::Text(text) => Some(String::from_utf8_lossy(text).into_owned()),
                    ValueRef::Integer(n) => Some(n.to_string()),
                    ValueRef::Real(x) => Some(x.to_string()),
                    ValueRef::Null | ValueRef::Blob(_) => None,
                };
                Ok(NewestFrom {
                    id: row.get(0)?,
                    thread_id: thread_id.filter(|t| !t.is_empty()),
                })
            },
        )
        .optional()?;
    Ok(newest)
}

/// The cases both routing paths are tested with (the runner's `<message to>` reply in
/// agent-runner's tests, mcp-tools' `send_message(to)` in its MCP tests): one table, so the two
/// paths are held to the same answers.
#[cfg(any(test, feature = "testing"))]
pub mod cases {
    use crate::{Destination, Routing};

    /// The inbound row a routed message must answer.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Answers {
        /// The batch row at this index (oldest first).
        Row(usize),
        /// The batch's own `in_reply_to` (in these cases, its newest row).
        Batch,
    }

    impl Answers {
        /// The id this stands for, given the batch's ids (oldest first).
        pub fn id(self, ids: &[String]) -> Option<String> {
            match self {
                Self::Row(index) => ids.get(index).cloned(),
                Self::Batch => ids.last().cloned(),
            }
        }
    }

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
        /// The row the message must answer (`in_reply_to`), when it is sent.
        pub answers: Answers,
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
        let discord = channel("general", "discord", "D-general");
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
                name: "in a two-channel batch, a reply by name answers that channel's newest row",
                destinations: vec![team.clone(), discord.clone()],
                batch: vec![
                    routing("slack", "C-team", Some("T-1")),
                    routing("discord", "D-general", None),
                ],
                to: "team",
                expected: Some(routing("slack", "C-team", Some("T-1"))),
                answers: Answers::Row(0),
            },
            Case {
                name: "in a two-channel batch, the other channel's reply answers its own row",
                destinations: vec![team.clone(), discord],
                batch: vec![
                    routing("discord", "D-general", None),
                    routing("slack", "C-team", Some("T-1")),
                    routing("discord", "D-general", None),
                    routing("slack", "C-team", None),
                ],
                to: "general",
                expected: Some(routing("discord", "D-general", None)),
                answers: Answers::Row(2),
            },
            Case {
                name: "a reply by name to the channel the thread came from stays in the thread",
                destinations: vec![team.clone(), ops.clone()],
                batch: vec![routing("slack", "C-team", Some("T-1"))],
                to: "team",
                expected: Some(routing("slack", "C-team", Some("T-1"))),
                answers: Answers::Row(0),
            },
            Case {
                name: "names match case-insensitively when only one destination matches",
                destinations: vec![team.clone(), ops.clone()],
                batch: vec![routing("slack", "C-team", Some("T-1"))],
                to: "TEAM",
                expected: Some(routing("slack", "C-team", Some("T-1"))),
                answers: Answers::Row(0),
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
                answers: Answers::Row(2),
            },
            Case {
                name: "another channel than the batch's goes to that channel's root",
                destinations: vec![team.clone(), ops.clone()],
                batch: vec![routing("slack", "C-team", Some("T-1"))],
                to: "ops",
                expected: Some(routing("slack", "C-ops", None)),
                answers: Answers::Batch,
            },
            Case {
                name: "an agent destination without a channel is addressed by its agent group",
                destinations: vec![team.clone(), helper],
                batch: vec![routing("slack", "C-team", Some("T-1"))],
                to: "helper",
                expected: Some(routing("agent", "ag-helper", None)),
                answers: Answers::Batch,
            },
            Case {
                name: "an unknown name is refused",
                destinations: vec![team.clone(), ops],
                batch: vec![routing("slack", "C-team", Some("T-1"))],
                to: "nobody",
                expected: None,
                answers: Answers::Batch,
            },
            Case {
                name: "names differing only by case are ambiguous and refused",
                destinations: vec![team, channel("Team", "slack", "C-other")],
                batch: vec![routing("slack", "C-team", Some("T-1"))],
                to: "TEAM",
                expected: None,
                answers: Answers::Batch,
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
            let batch_reply = ids.last().map(String::as_str);
            let got = db.route_to_destination(case.to, &ids, batch_reply).unwrap();
            match (&case.expected, got) {
                (
                    Some(expected),
                    DestinationRoute::Found {
                        routing,
                        in_reply_to,
                    },
                ) => {
                    assert_eq!(&routing, expected, "{}", case.name);
                    assert_eq!(in_reply_to, case.answers.id(&ids), "{}", case.name);
                }
                (None, DestinationRoute::Unknown { known }) => {
                    assert_eq!(known.len(), case.destinations.len(), "{}", case.name)
                }
                (expected, got) => panic!("{}: expected {expected:?}, got {got:?}", case.name),
            }
        }
    }
}
