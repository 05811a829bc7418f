//! Where a tool's row goes (docs/contract/prompt.md#routing): explicit fields > the destination
//! named by `to` (routed by `schema::routing`, the rule the runner's replies share) > the runner's
//! `current_batch` > the session's default routing. Every row also carries an `in_reply_to`:
//! the one `schema::routing` gives a destination named by `to` (that channel's newest batch row,
//! else the batch's), otherwise the current batch's.

use schema::{DestinationRoute, Routing, SessionDb};

use crate::error::{ToolError, ToolResult};

/// What the caller asked for; blank fields count as absent.
#[derive(Debug, Clone, Default)]
pub struct Target<'a> {
    /// A destination name.
    pub to: Option<&'a str>,
    /// Explicit platform kind.
    pub channel: Option<&'a str>,
    /// Explicit platform channel id.
    pub platform_id: Option<&'a str>,
    /// Explicit thread id.
    pub thread_id: Option<&'a str>,
}

/// The resolved routing of a row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Route {
    /// Where it goes.
    pub routing: Routing,
    /// The inbound row it answers (see the module docs).
    pub in_reply_to: Option<String>,
    /// The sender of the current batch, for admin checks.
    pub sender_id: Option<String>,
}

/// Resolves `target` against the DB (blocking).
pub fn resolve(db: &SessionDb, target: &Target<'_>) -> ToolResult<Route> {
    let batch = match db.current_batch() {
        Ok(batch) => batch.unwrap_or_default(),
        Err(err) => {
            // A malformed batch must not stop the agent from talking; fall back.
            tracing::warn!(%err, "ignoring an unreadable current_batch");
            Default::default()
        }
    };
    let (base, in_reply_to) = match target.to {
        Some(name) => {
            match db.route_to_destination(name, &batch.ids, batch.in_reply_to.as_deref())? {
                DestinationRoute::Found {
                    routing,
                    in_reply_to,
                } => (routing, in_reply_to),
                DestinationRoute::Unknown { known } => {
                    return Err(unknown_destination(name, &known))
                }
            }
        }
        None if !batch.routing.is_empty() => (batch.routing.clone(), batch.in_reply_to),
        None => (db.session_routing()?.unwrap_or_default(), batch.in_reply_to),
    };
    let routing = if target.channel.is_some() || target.platform_id.is_some() {
        Routing {
            channel_type: target.channel.map(str::to_owned).or(base.channel_type),
            platform_id: target.platform_id.map(str::to_owned).or(base.platform_id),
            // A thread belongs to its channel: only an explicit one survives a channel change.
            thread_id: target.thread_id.map(str::to_owned),
        }
    } else if let Some(thread) = target.thread_id {
        Routing {
            thread_id: Some(thread.to_owned()),
            ..base
        }
    } else {
        base
    };
    Ok(Route {
        routing,
        in_reply_to,
        sender_id: batch.sender_id,
    })
}

/// The error for a destination name nobody has, listing the known names.
pub fn unknown_destination(name: &str, known: &[String]) -> ToolError {
    ToolError::invalid(if known.is_empty() {
        format!(
            "unknown destination {name:?}: no destinations are configured; omit `to` to answer \
             the current conversation"
        )
    } else {
        format!(
            "unknown destination {name:?}; known destinations: {}",
            known.join(", ")
        )
    })
}
