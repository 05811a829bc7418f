//! The session list and the SSE `status` event.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::StatusReport;

/// One session a token may see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionItem {
    /// Its name.
    pub name: String,
    /// The runner's status (`None`: no runner has started).
    pub runner_status: Option<String>,
    /// The health verdict with the default limits.
    pub healthy: bool,
}

/// `GET /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionList {
    /// The sessions, by name.
    pub sessions: Vec<SessionItem>,
}

/// The data of an SSE `status` event: the fields of `status` without ages, sent at the start
/// and whenever one changes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusEvent {
    /// The runner's status (`None`: no runner has started).
    pub runner_status: Option<String>,
    /// Since when, as stored.
    pub since: Option<String>,
    /// The tool the agent is in.
    pub current_tool: Option<String>,
    /// What a turn without progress waits on.
    #[schema(value_type = Option<Object>)]
    pub waiting_on: Option<Value>,
    /// The turn's last progress note.
    #[schema(value_type = Option<Object>)]
    pub progress: Option<Value>,
    /// The newest `query_error`.
    #[schema(value_type = Option<Object>)]
    pub last_error: Option<Value>,
}

impl StatusEvent {
    /// The event for `report`, its ages left out (they change every second, the event only
    /// when the state does).
    pub fn from_report(report: &StatusReport) -> Self {
        let runner = report.runner.as_ref();
        Self {
            runner_status: runner.map(|r| r.status.clone()),
            since: runner.map(|r| r.since.clone()),
            current_tool: runner.and_then(|r| r.current_tool.clone()),
            waiting_on: runner.and_then(|r| r.waiting_on.as_ref()).map(without_ages),
            progress: report.progress.as_ref().map(without_ages),
            last_error: report.last_error.as_ref().map(without_ages),
        }
    }
}

/// `value` as JSON without its `…Secs` age fields.
fn without_ages(value: &impl Serialize) -> Value {
    let mut json = serde_json::to_value(value).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut json {
        map.retain(|key, _| !key.ends_with("Secs"));
    }
    json
}
