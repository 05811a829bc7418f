//! `ask_user_question`: write a question row, then wait (event-driven, with [`DbWatcher`]) until
//! an answer row arrives, the deadline passes, or the client cancels the call.
//!
//! Protocol with the runner (docs/contract/db.md#questions): the question is recorded as open
//! (until its deadline) in the same transaction that writes the question row, so the runner's poll
//! holds back answers to it until the deadline. The answer is taken with `take_answer`, which
//! completes the answer row atomically. On timeout or cancellation the question is closed; an
//! answer that arrives later is then an ordinary message the runner hands to the agent.
//! While any question of this process waits, `runner_state.status` is `waiting_user` (if it
//! was `busy`), switched in that same transaction; the last one to finish puts `busy` back.

use std::time::Duration;

use chrono::Utc;
use schema::content::out;
use schema::{DbWatcher, QuestionAnswer};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::ctx::{check_text, Ctx};
use super::messages::json_type;
pub use super::waiting::Waiting;
use crate::error::{ToolError, ToolResult};
use crate::params::{present, AskUserQuestionParams};

/// Longest a wait relies on the file watch alone before looking at the DB anyway (a fallback
/// for lost or unavailable file notifications; answers normally wake the wait within ~1 ms).
const FALLBACK_POLL: Duration = Duration::from_secs(2);
/// Most options a question may offer.
const MAX_OPTIONS: usize = 50;

/// How a wait ended.
enum Outcome {
    Answered(QuestionAnswer),
    TimedOut,
    Cancelled,
}

/// `ask_user_question`.
pub async fn ask_user_question(
    ctx: &Ctx,
    p: AskUserQuestionParams,
    cancel: CancellationToken,
) -> ToolResult {
    check_text(&ctx.config, "question", &p.question)?;
    let options = normalize_options(&p.options)?;
    let max = ctx.config.max_question_timeout;
    let timeout = match p.timeout {
        None => max,
        Some(secs) if secs.is_finite() && secs > 0.0 => Duration::from_secs_f64(secs).min(max),
        Some(secs) => {
            return Err(ToolError::invalid(format!(
                "timeout must be a positive number of seconds, got {secs}"
            )))
        }
    };
    let title = present(&p.title).unwrap_or("Question").to_owned();
    let question = p.question.trim().to_owned();
    let question_id = uuid::Uuid::new_v4().to_string();
    let deadline = Utc::now()
        + chrono::Duration::from_std(timeout)
            .map_err(|err| ToolError::Internal(err.to_string()))?;

    // The watcher exists before the question row, so no answer can slip between them.
    let mut watcher = ctx.db.run(|db| Ok(DbWatcher::new(db)?)).await?;
    ctx.waiting
        .enter(&ctx.db, &question_id, deadline, &title, &question, &options)
        .await?;
    let outcome = wait_for_answer(ctx, &question_id, deadline, &mut watcher, &cancel).await;
    let qid = question_id.clone();
    if let Err(err) = ctx.db.run(move |db| Ok(db.close_question(&qid)?)).await {
        tracing::warn!(%err, question = %question_id, "could not close the question");
    }
    ctx.waiting.leave(&ctx.db).await;

    match outcome? {
        Outcome::Answered(answer) => Ok(match answer.selected_option {
            Value::String(text) => text,
            other => other.to_string(),
        }),
        Outcome::TimedOut => Err(ToolError::invalid(format!(
            "no answer within {} seconds: the user did not answer in time. Carry on without \
             the answer or ask again later; a late answer reaches you as an ordinary message",
            timeout.as_secs_f64().round()
        ))),
        Outcome::Cancelled => Err(ToolError::Cancelled(
            "the question was withdrawn before the user answered".into(),
        )),
    }
}

/// Waits for the answer to `question_id` until `deadline`, on DB change notifications.
async fn wait_for_answer(
    ctx: &Ctx,
    question_id: &str,
    deadline: chrono::DateTime<Utc>,
    watcher: &mut DbWatcher,
    cancel: &CancellationToken,
) -> ToolResult<Outcome> {
    loop {
        tracing::trace!(question = question_id, "looking for an answer");
        let qid = question_id.to_owned();
        let (answer, open) = ctx
            .db
            .run(move |db| Ok((db.take_answer(&qid)?, db.question_open(&qid)?)))
            .await?;
        if let Some((_row, answer)) = answer {
            return Ok(Outcome::Answered(answer));
        }
        // The runner withdrew it: the turn that asked was stopped (`/stop`).
        if !open {
            return Ok(Outcome::Cancelled);
        }
        let remaining = (deadline - Utc::now()).to_std().unwrap_or(Duration::ZERO);
        if remaining.is_zero() {
            return Ok(Outcome::TimedOut);
        }
        tokio::select! {
            _ = cancel.cancelled() => return Ok(Outcome::Cancelled),
            _ = watcher.wait(remaining.min(FALLBACK_POLL)) => {}
        }
    }
}

/// Turns the `options` argument into `[{label, selectedLabel, value}]`: plain strings become
/// `label = value`; missing `selectedLabel`/`value` default to the label.
fn normalize_options(options: &Value) -> ToolResult<Vec<Value>> {
    let items = match options {
        Value::Array(items) => items.clone(),
        // Models sometimes send the list as a JSON string.
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Array(items)) => items,
            _ => {
                return Err(ToolError::invalid(
                    "options must be a list of choices, e.g. [\"Yes\", \"No\"]",
                ))
            }
        },
        other => {
            return Err(ToolError::invalid(format!(
                "options must be a list of choices, e.g. [\"Yes\", \"No\"]; got {}",
                json_type(other)
            )))
        }
    };
    if items.is_empty() {
        return Err(ToolError::invalid(
            "options is empty: offer at least one choice",
        ));
    }
    if items.len() > MAX_OPTIONS {
        return Err(ToolError::invalid(format!(
            "too many options ({}, at most {MAX_OPTIONS})",
            items.len()
        )));
    }
    let mut normalized = Vec::with_capacity(items.len());
    let mut values: Vec<String> = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let text = |v: Option<&Value>| -> Option<String> {
            match v {
                Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_owned()),
                Some(Value::Number(n)) => Some(n.to_string()),
                Some(Value::Bool(b)) => Some(b.to_string()),
                _ => None,
            }
        };
        let (label, selected, value) = match item {
            Value::Object(map) => {
                let label = text(map.get("label")).ok_or_else(|| {
                    ToolError::invalid(format!("option {} has no label", index + 1))
                })?;
                let selected = text(map.get("selectedLabel")).unwrap_or_else(|| label.clone());
                let value = text(map.get("value")).unwrap_or_else(|| label.clone());
                (label, selected, value)
            }
            other => {
                let label = text(Some(other)).ok_or_else(|| {
                    ToolError::invalid(format!(
                        "option {} is empty or not text: give a label",
                        index + 1
                    ))
                })?;
                (label.clone(), label.clone(), label)
            }
        };
        if values.contains(&value) {
            return Err(ToolError::invalid(format!(
                "option value {value:?} appears twice: each option needs its own value"
            )));
        }
        values.push(value.clone());
        normalized.push(out::question_option(&label, &selected, &value));
    }
    Ok(normalized)
}

#[cfg(test)]
mod tests {

    use serde_json::json;

    use super::*;

    #[test]
    fn options_normalize() {
        let got = normalize_options(&json!(["Yes", {"label": "No", "value": "n"}])).unwrap();
        assert_eq!(
            got,
            vec![
                json!({"label": "Yes", "selectedLabel": "Yes", "value": "Yes"}),
                json!({"label": "No", "selectedLabel": "No", "value": "n"}),
            ]
        );
        assert!(normalize_options(&json!("[\"a\"]")).is_ok());
        for bad in [
            json!([]),
            json!(["a", "a"]),
            json!([{}]),
            json!(5),
            json!([""]),
        ] {
            assert!(normalize_options(&bad).is_err(), "{bad}");
        }
    }
}
