//! Request bodies and query strings, and their conversions into the library's requests.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use schema::{Destination, Routing, SweepPolicy, UsageGroup};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::{AnswerRequest, InitOptions, Quote, SendKind, SendRequest, UsageRequest};

/// Kind of an inbound message (`nanoclaw send --kind`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SendKindBody {
    /// A chat message.
    #[default]
    Chat,
    /// A scheduled task.
    Task,
    /// A webhook delivery.
    Webhook,
    /// A host action result (raw `content` only).
    System,
    /// A serialized Chat SDK message.
    ChatSdk,
}

impl From<SendKindBody> for SendKind {
    fn from(kind: SendKindBody) -> Self {
        match kind {
            SendKindBody::Chat => Self::Chat,
            SendKindBody::Task => Self::Task,
            SendKindBody::Webhook => Self::Webhook,
            SendKindBody::System => Self::System,
            SendKindBody::ChatSdk => Self::ChatSdk,
        }
    }
}

impl From<SendKind> for SendKindBody {
    fn from(kind: SendKind) -> Self {
        match kind {
            SendKind::Chat => Self::Chat,
            SendKind::Task => Self::Task,
            SendKind::Webhook => Self::Webhook,
            SendKind::System => Self::System,
            SendKind::ChatSdk => Self::ChatSdk,
        }
    }
}

/// A quoted message (`--reply-to`, `--quote-sender`, `--quote-text`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuoteBody {
    /// Its seq, or a platform id.
    pub id: String,
    /// Who wrote it; looked up by seq when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
    /// What it said; looked up by seq when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// `POST /v1/sessions/{name}/messages`: the flags of `nanoclaw send`, same rules and defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SendBody {
    /// Kind of message (default `chat`).
    #[serde(default)]
    pub kind: SendKindBody,
    /// Raw JSON content for any kind (replaces the content fields).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub content: Option<Value>,
    /// Row id (a new UUID when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Chat: message text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Chat: sender display name (default `User`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
    /// Chat: sender platform id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_id: Option<String>,
    /// Chat: the quoted message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<QuoteBody>,
    /// Chat: attachments by path relative to the workspace root.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attach_paths: Vec<String>,
    /// Chat: attachments by http(s) URL.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attach_urls: Vec<String>,
    /// Task: instructions for the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Task: pre-agent bash script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// Task: 5-field cron expression, evaluated in the server's TZ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recurrence: Option<String>,
    /// Webhook: source, e.g. `github`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Webhook: event, e.g. `pull_request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// Webhook: payload (default `{}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub payload: Option<Value>,
    /// Routing: platform kind (default: the session routing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_type: Option<String>,
    /// Routing: channel id (default: the session routing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform_id: Option<String>,
    /// Routing: thread id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    /// Context only (`trigger=0`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_trigger: bool,
    /// Not due before this time (RFC 3339, `now`, `+30s`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_after: Option<String>,
    /// Only on the runner's first poll after it starts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_wake: bool,
}

impl From<SendBody> for SendRequest {
    fn from(body: SendBody) -> Self {
        Self {
            kind: body.kind.into(),
            content: body.content.map(|value| value.to_string()),
            id: body.id,
            text: body.text,
            sender: body.sender,
            sender_id: body.sender_id,
            reply_to: body.reply_to.map(|quote| Quote {
                id: quote.id,
                sender: quote.sender,
                text: quote.text,
            }),
            attach_paths: body.attach_paths,
            attach_urls: body.attach_urls,
            prompt: body.prompt,
            script: body.script,
            recurrence: body.recurrence,
            source: body.source,
            event: body.event,
            payload: body.payload.map(|value| value.to_string()),
            routing: Routing {
                channel_type: body.channel_type,
                platform_id: body.platform_id,
                thread_id: body.thread_id,
            },
            no_trigger: body.no_trigger,
            process_after: body.process_after,
            on_wake: body.on_wake,
        }
    }
}

/// A session's default routing (`nanoclaw init --routing`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoutingBody {
    /// Platform kind, e.g. `slack`.
    pub channel_type: String,
    /// Channel id on the platform.
    pub platform_id: String,
    /// Thread within the channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
}

/// A destination the agent can address (`nanoclaw init --destination`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DestinationBody {
    /// The name the agent uses.
    pub name: String,
    /// Platform kind; `agent` makes an agent destination.
    pub channel_type: String,
    /// Platform channel id (the agent group id for an agent destination).
    pub platform_id: String,
    /// Human-readable name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
}

/// `POST /v1/sessions`: create a session (idempotent), as `nanoclaw init`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InitBody {
    /// The session's name (`[A-Za-z0-9._-]{1,64}`).
    pub name: String,
    /// Default routing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingBody>,
    /// Destinations to upsert.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destinations: Vec<DestinationBody>,
}

impl InitBody {
    /// The `init` options for the session folder `workspace` (the server's `ROOT/<name>`), with
    /// the same rules as the CLI's `--routing` and `--destination`.
    pub fn init_options(&self, workspace: PathBuf) -> Result<InitOptions> {
        let routing = self
            .routing
            .as_ref()
            .map(|r| {
                let spec = match &r.thread_id {
                    Some(thread) => format!("{}:{}:{thread}", r.channel_type, r.platform_id),
                    None => format!("{}:{}", r.channel_type, r.platform_id),
                };
                crate::parse_routing(&spec)
            })
            .transpose()
            .context("routing")?;
        let destinations = self
            .destinations
            .iter()
            .map(|d| {
                let spec = match &d.display_name {
                    Some(display) => {
                        format!("{}={}:{}:{display}", d.name, d.channel_type, d.platform_id)
                    }
                    None => format!("{}={}:{}", d.name, d.channel_type, d.platform_id),
                };
                crate::parse_destination(&spec)
            })
            .collect::<Result<Vec<Destination>>>()
            .context("destinations")?;
        Ok(InitOptions {
            db: Some(workspace.join("session.db")),
            workspace,
            routing,
            destinations,
        })
    }
}

/// How the host's delivery of a `messages_out` row ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Delivered to the platform.
    Delivered,
    /// Delivery failed (see `reason`).
    Failed,
}

impl DeliveryStatus {
    /// The `delivered.status` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Failed => "failed",
        }
    }
}

/// `POST /v1/sessions/{name}/messages/{seq}/delivered`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeliveredBody {
    /// How it ended.
    pub status: DeliveryStatus,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The platform's id for the delivered message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform_message_id: Option<String>,
}

/// The answer to a delivery record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveredReport {
    /// The row's seq.
    pub seq: i64,
    /// The row's id.
    pub id: String,
    /// The recorded status.
    pub status: DeliveryStatus,
}

/// `POST /v1/sessions/{name}/answers`: as `nanoclaw answer`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnswerBody {
    /// The question's id.
    pub question_id: String,
    /// The chosen option: its value, or its label.
    pub option: String,
    /// Who answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// Send even if no such question was asked or the option is not one of its choices.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

impl From<AnswerBody> for AnswerRequest {
    fn from(body: AnswerBody) -> Self {
        Self {
            question_id: body.question_id,
            option: body.option,
            user_id: body.user_id,
            force: body.force,
        }
    }
}

/// `POST /v1/sessions/{name}/sweep`: as `nanoclaw sweep` (same defaults).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SweepBody {
    /// A processing row unchanged this long is stale (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_after_secs: Option<u64>,
    /// A stale row with this many tries becomes failed (default 5, at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tries: Option<i64>,
    /// Retry n waits `backoffSecs * 2^(n-1)` seconds (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_secs: Option<u64>,
}

impl SweepBody {
    /// The sweep policy, with the CLI's defaults for absent fields.
    pub fn policy(&self) -> Result<SweepPolicy> {
        let max_tries = self.max_tries.unwrap_or(5);
        if max_tries < 1 {
            bail!("maxTries must be at least 1");
        }
        Ok(SweepPolicy {
            stale_after: Duration::from_secs(
                self.stale_after_secs
                    .unwrap_or(crate::sweep::DEFAULT_STALE_AFTER_SECS),
            ),
            max_tries,
            backoff: Duration::from_secs(self.backoff_secs.unwrap_or(30)),
        })
    }
}

/// `GET /v1/sessions/{name}/health` query: as `nanoclaw health`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct HealthQuery {
    /// A heartbeat older than this is stale (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_after_secs: Option<u64>,
    /// A busy turn with no provider event this long is stuck (default 900; 0: not checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turn_silence_secs: Option<u64>,
}

impl HealthQuery {
    /// The limits `health` checks against.
    pub fn limits(&self) -> schema::health::HealthLimits {
        crate::status::host_limits(
            Duration::from_secs(self.stale_after_secs.unwrap_or(30)),
            Duration::from_secs(self.max_turn_silence_secs.unwrap_or(900)),
        )
    }
}

/// `GET /v1/sessions/{name}/usage` query: as `nanoclaw usage`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// Break the totals down by `day`, `model`, `series` or `provider`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Only turns since WHEN: `7d`, `12h`, `today`, `YYYY-MM-DD`, or RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

impl UsageQuery {
    /// The usage request, `since` read at `now` in the session's time zone `tz`.
    pub fn request(&self, now: DateTime<Utc>, tz: Tz) -> Result<UsageRequest> {
        let by = self
            .by
            .as_deref()
            .map(|by| by.parse::<UsageGroup>().map_err(anyhow::Error::msg))
            .transpose()
            .context("by")?;
        let since = self
            .since
            .as_deref()
            .map(|text| crate::timefmt::parse_since(text, now, tz))
            .transpose()
            .context("since")?;
        Ok(UsageRequest { by, since })
    }
}

/// `GET /v1/sessions/{name}/events` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Rows with a seq above this (default 0); the `Last-Event-ID` header wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<i64>,
}
