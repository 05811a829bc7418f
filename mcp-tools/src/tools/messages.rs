//! Tools that write one `messages_out` row: send_message, send_card, send_to_agent,
//! edit_message, add_reaction, register_agent_group.

use schema::content::out;
use schema::{InKind, InboundContent, NewMessageOut, OutKind, Routing, SessionDb};
use serde_json::{json, Value};

use super::routing::{self, Route, Target};
use super::{check_field, check_text, Ctx};
use crate::error::{ToolError, ToolResult};
use crate::params::{
    present, AddReactionParams, EditMessageParams, RegisterAgentGroupParams, SendCardParams,
    SendMessageParams, SendToAgentParams,
};

/// Writes `content` as a row of `kind`, routed by `route`; returns its seq.
fn write(db: &SessionDb, kind: OutKind, route: Route, content: &Value) -> ToolResult<i64> {
    let row = NewMessageOut::new(kind, route.routing, content).replying_to(route.in_reply_to);
    Ok(db.insert_out(&row)?.seq)
}

/// Writes an edit or reaction row: routed like its target message, replying to the current
/// batch.
fn write_on_target(db: &SessionDb, target: TargetMessage, content: &Value) -> ToolResult<i64> {
    let mut route = routing::resolve(db, &Target::default())?;
    route.routing = target.routing;
    write(db, OutKind::Chat, route, content)
}

/// `send_message`.
pub async fn send_message(ctx: &Ctx, p: SendMessageParams) -> ToolResult {
    check_text(&ctx.config, "text", &p.text)?;
    let to = present(&p.to).map(str::to_owned);
    let seq = ctx
        .db
        .run(move |db| {
            let target = Target {
                to: present(&p.to),
                channel: present(&p.channel),
                platform_id: present(&p.platform_id),
                thread_id: present(&p.thread_id),
            };
            let route = routing::resolve(db, &target)?;
            write(db, OutKind::Chat, route, &out::chat_text(&p.text))
        })
        .await?;
    Ok(match to {
        Some(to) => format!("Message sent to {to} (seq {seq})."),
        None => format!("Message sent (seq {seq})."),
    })
}

/// `send_card`.
pub async fn send_card(ctx: &Ctx, p: SendCardParams) -> ToolResult {
    let card = match p.card {
        Value::Object(map) if !map.is_empty() => Value::Object(map),
        Value::Object(_) => return Err(ToolError::invalid("card is an empty object")),
        // Models sometimes send the card as a JSON string.
        Value::String(text) => match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(map)) if !map.is_empty() => Value::Object(map),
            _ => {
                return Err(ToolError::invalid(
                    "card must be a JSON object (the card itself, not text)",
                ))
            }
        },
        other => {
            return Err(ToolError::invalid(format!(
                "card must be a JSON object, got {}",
                json_type(&other)
            )))
        }
    };
    let card_len = card.to_string().len();
    if card_len > ctx.config.max_text_bytes {
        return Err(ToolError::invalid(format!(
            "card is too large: {card_len} bytes, the limit is {} bytes",
            ctx.config.max_text_bytes
        )));
    }
    if let Some(fallback) = present(&p.fallback_text) {
        check_text(&ctx.config, "fallbackText", fallback)?;
    }
    let seq = ctx
        .db
        .run(move |db| {
            let route = routing::resolve(
                db,
                &Target {
                    to: present(&p.to),
                    ..Target::default()
                },
            )?;
            let content = out::card(&card, present(&p.fallback_text));
            write(db, OutKind::ChatSdk, route, &content)
        })
        .await?;
    Ok(format!("Card sent (seq {seq})."))
}

/// `send_to_agent`.
pub async fn send_to_agent(ctx: &Ctx, p: SendToAgentParams) -> ToolResult {
    let agent = check_field("agentGroupId", &p.agent_group_id)?.to_owned();
    check_text(&ctx.config, "text", &p.text)?;
    let session = present(&p.session_id).map(str::to_owned);
    let shown = agent.clone();
    let seq = ctx
        .db
        .run(move |db| {
            // A destination name of an agent destination stands for its agent group.
            let agent = db
                .destination(&agent)?
                .filter(|d| d.kind == "agent")
                .and_then(|d| d.agent_group_id)
                .unwrap_or(agent);
            let mut route = routing::resolve(db, &Target::default())?;
            route.routing = Routing {
                channel_type: Some("agent".into()),
                platform_id: Some(agent),
                thread_id: session,
            };
            write(db, OutKind::Chat, route, &out::chat_text(&p.text))
        })
        .await?;
    Ok(format!("Message sent to agent {shown} (seq {seq})."))
}

/// The message a seq points to, for edits and reactions.
struct TargetMessage {
    /// The id the host knows it by.
    platform_message_id: String,
    /// Its routing.
    routing: Routing,
    /// An agent message (odd seq) rather than an incoming one.
    ours: bool,
    /// Its kind column.
    kind: String,
}

/// Finds message `seq` by parity: odd → `messages_out`, even → `messages_in`.
fn target_message(db: &SessionDb, seq: i64) -> ToolResult<TargetMessage> {
    let unknown = || {
        ToolError::invalid(format!(
            "no message with id {seq}: use the id of an incoming message or the seq a tool \
             returned"
        ))
    };
    if seq <= 0 {
        return Err(unknown());
    }
    if seq % 2 == 1 {
        let row = db.message_out_by_seq(seq)?.ok_or_else(unknown)?;
        let platform_message_id = db
            .delivered(&row.id)?
            .and_then(|d| d.platform_message_id)
            .unwrap_or_else(|| row.id.clone());
        Ok(TargetMessage {
            platform_message_id,
            routing: row.routing,
            ours: true,
            kind: row.kind,
        })
    } else {
        let row = db.message_in_by_seq(seq)?.ok_or_else(unknown)?;
        let platform_message_id = match InboundContent::parse(&row.kind(), &row.content) {
            InboundContent::ChatSdk(sdk) => sdk.id,
            _ => None,
        }
        .unwrap_or_else(|| row.id.clone());
        Ok(TargetMessage {
            platform_message_id,
            routing: row.routing,
            ours: false,
            kind: row.kind,
        })
    }
}

/// `edit_message`.
pub async fn edit_message(ctx: &Ctx, p: EditMessageParams) -> ToolResult {
    check_text(&ctx.config, "text", &p.text)?;
    let seq = p.message_id;
    let written = ctx
        .db
        .run(move |db| {
            let target = target_message(db, seq)?;
            if !target.ours {
                return Err(ToolError::invalid(format!(
                    "message {seq} was written by someone else; you can only edit your own \
                     messages (odd ids returned by send_message)"
                )));
            }
            if target.kind == OutKind::System.as_str() {
                return Err(ToolError::invalid(format!(
                    "message {seq} is not a chat message and cannot be edited"
                )));
            }
            let content = out::edit(&target.platform_message_id, &p.text);
            write_on_target(db, target, &content)
        })
        .await?;
    Ok(format!("Message {seq} edited (seq {written})."))
}

/// `add_reaction`.
pub async fn add_reaction(ctx: &Ctx, p: AddReactionParams) -> ToolResult {
    let emoji = p.emoji.trim().to_owned();
    if emoji.is_empty() {
        return Err(ToolError::invalid("emoji is empty: give an emoji like 👍"));
    }
    if emoji.len() > 64 {
        return Err(ToolError::invalid(
            "emoji is too long: give one emoji or its short name",
        ));
    }
    let seq = p.message_id;
    let shown = emoji.clone();
    let written = ctx
        .db
        .run(move |db| {
            let target = target_message(db, seq)?;
            let reactable = if target.ours {
                target.kind != OutKind::System.as_str()
            } else {
                matches!(InKind::parse(&target.kind), InKind::Chat | InKind::ChatSdk)
            };
            if !reactable {
                return Err(ToolError::invalid(format!(
                    "message {seq} is not a chat message; reactions go on chat messages"
                )));
            }
            let content = out::reaction(&target.platform_message_id, &emoji);
            write_on_target(db, target, &content)
        })
        .await?;
    Ok(format!("Reacted {shown} to message {seq} (seq {written})."))
}

/// `register_agent_group`: admin only.
pub async fn register_agent_group(ctx: &Ctx, p: RegisterAgentGroupParams) -> ToolResult {
    let Some(admin) = ctx.config.admin_user_id.clone() else {
        return Err(ToolError::invalid(
            "register_agent_group is disabled: no admin user is configured \
             (NANOCLAW_ADMIN_USER_ID)",
        ));
    };
    let name = check_field("name", &p.name)?.to_owned();
    let folder = check_field("folder", &p.folder)?.to_owned();
    if folder.starts_with('.')
        || folder.contains("..")
        || !folder
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err(ToolError::invalid(format!(
            "folder {folder:?} is not a plain folder name: use letters, digits, '.', '_' and \
             '-' only (no '/', no '..')"
        )));
    }
    let platform_id = check_field("platformId", &p.platform_id)?.to_owned();
    let channel_type = check_field("channelType", &p.channel_type)?.to_owned();
    let session_mode = present(&p.session_mode).map(str::to_owned);
    let trigger_rules = p.trigger_rules.unwrap_or(Value::Null);
    let shown = name.clone();
    let seq = ctx
        .db
        .run(move |db| {
            let route = routing::resolve(db, &Target::default())?;
            match route.sender_id.as_deref() {
                Some(sender) if sender == admin => {}
                Some(sender) => {
                    return Err(ToolError::invalid(format!(
                        "refused: only the admin may register agent groups, and this request \
                         came from user {sender}"
                    )))
                }
                None => {
                    return Err(ToolError::invalid(
                        "refused: only the admin may register agent groups, and the sender of \
                         the current messages is unknown",
                    ))
                }
            }
            let payload = json!({
                "name": name,
                "folder": folder,
                "platformId": platform_id,
                "channelType": channel_type,
                "triggerRules": trigger_rules,
                "sessionMode": session_mode,
                "requestedBy": admin,
            });
            let content = out::system_action("register_agent_group", payload);
            write(db, OutKind::System, route, &content)
        })
        .await?;
    Ok(format!(
        "Asked the host to register agent group {shown} (seq {seq}); the result arrives as a \
         system message."
    ))
}

/// A JSON value's type, for messages (the schema crate owns the wording).
pub use schema::content::json_type;
