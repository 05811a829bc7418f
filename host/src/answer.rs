//! `answer`: the user's choice for an `ask_user_question` row, as a `system` `question_response`
//! row (docs/contract/content.md#answers) routed like the question.

use anyhow::{bail, Context, Result};
use schema::{Inserted, MessageOut, NewMessageIn, Routing, SessionDb};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Rows read per page while looking for a question.
const PAGE: usize = 500;

/// One option of a question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QuestionOption {
    /// What the user sees.
    pub label: Option<String>,
    /// What the agent gets back.
    pub value: Value,
}

/// An `ask_question` row of `messages_out`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Question {
    /// The `messages_out` row id.
    pub message_out_id: String,
    /// Its seq.
    pub seq: Option<i64>,
    /// The question id the answer must carry.
    pub question_id: String,
    /// Title, if any.
    pub title: Option<String>,
    /// The question text.
    pub question: Option<String>,
    /// The choices offered.
    pub options: Vec<QuestionOption>,
    /// Where it was asked.
    pub routing: Routing,
}

impl Question {
    /// Parses a `messages_out` row if it is an `ask_question` operation.
    pub fn from_row(row: &MessageOut) -> Option<Self> {
        let value: Value = serde_json::from_str(&row.content).ok()?;
        if value.get("operation").and_then(Value::as_str) != Some("ask_question") {
            return None;
        }
        let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
        let options = value
            .get("options")
            .and_then(Value::as_array)
            .map(|options| options.iter().map(parse_option).collect())
            .unwrap_or_default();
        Some(Self {
            message_out_id: row.id.clone(),
            seq: row.seq,
            question_id: text("questionId")?,
            title: text("title"),
            question: text("question"),
            options,
            routing: row.routing.clone(),
        })
    }

    /// Maps what the user typed to an option value: an exact value, else a label
    /// (case-insensitive). `None` when it matches no option.
    pub fn resolve(&self, typed: &str) -> Option<Value> {
        let by_value = self.options.iter().find(|o| value_text(&o.value) == typed);
        let by_label = || {
            self.options.iter().find(|o| {
                o.label
                    .as_deref()
                    .is_some_and(|l| l.trim().eq_ignore_ascii_case(typed.trim()))
            })
        };
        by_value.or_else(by_label).map(|o| o.value.clone())
    }
}

fn parse_option(option: &Value) -> QuestionOption {
    match option {
        Value::String(text) => QuestionOption {
            label: Some(text.clone()),
            value: option.clone(),
        },
        Value::Object(map) => {
            let label = map.get("label").and_then(Value::as_str).map(str::to_owned);
            let value = map
                .get("value")
                .cloned()
                .or_else(|| label.clone().map(Value::String))
                .unwrap_or(Value::Null);
            QuestionOption { label, value }
        }
        other => QuestionOption {
            label: None,
            value: other.clone(),
        },
    }
}

/// A JSON value as the user would type it (strings without quotes).
pub fn value_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The latest `ask_question` row with `question_id`, if any.
pub fn find_question(db: &SessionDb, question_id: &str) -> Result<Option<Question>> {
    let mut after = i64::MIN;
    let mut found = None;
    loop {
        let rows = db
            .messages_out_after(after, PAGE)
            .context("reading messages_out")?;
        for row in &rows {
            if let Some(question) = Question::from_row(row) {
                if question.question_id == question_id {
                    found = Some(question);
                }
            }
        }
        match rows.last().and_then(|row| row.seq) {
            Some(last) if rows.len() == PAGE => after = last,
            _ => return Ok(found),
        }
    }
}

/// An answer to post.
#[derive(Debug, Clone, Default)]
pub struct AnswerRequest {
    /// The question's id.
    pub question_id: String,
    /// The chosen option: its value, or its label.
    pub option: String,
    /// Who answered.
    pub user_id: Option<String>,
    /// Post even if no such question was asked or the option is not one of its choices.
    pub force: bool,
}

/// What `answer` wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Answered {
    /// Row id.
    pub id: String,
    /// Allocated (even) seq.
    pub seq: i64,
    /// The value stored as `selectedOption`.
    pub selected_option: Value,
    /// The question, when it was found.
    pub question: Option<Question>,
}

/// `answer`'s `--json` object (and the API's answer): the row, the stored choice, and whether
/// the question was found.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnswerReport {
    /// Row id.
    pub id: String,
    /// Allocated (even) seq.
    pub seq: i64,
    /// The value stored as `selectedOption`.
    #[schema(value_type = Object)]
    pub selected_option: Value,
    /// False when no such question was asked (sent with `force`).
    pub question_found: bool,
}

impl Answered {
    /// The `--json` object.
    pub fn report(&self) -> AnswerReport {
        AnswerReport {
            id: self.id.clone(),
            seq: self.seq,
            selected_option: self.selected_option.clone(),
            question_found: self.question.is_some(),
        }
    }
}

/// Checks the question and option, then inserts the `question_response` row.
pub fn answer(db: &SessionDb, request: &AnswerRequest) -> Result<Answered> {
    let question_id = request.question_id.trim();
    if question_id.is_empty() {
        bail!("--question must not be empty");
    }
    let question = find_question(db, question_id)?;
    let selected = match &question {
        None if !request.force => bail!(
            "no question {question_id:?} was asked (no ask_question row in messages_out); \
             check the id with `nanoclaw watch --no-follow`, or pass --force to send the answer anyway"
        ),
        None => Value::String(request.option.clone()),
        Some(question) if question.options.is_empty() => Value::String(request.option.clone()),
        Some(question) => match question.resolve(&request.option) {
            Some(value) => value,
            None if request.force => Value::String(request.option.clone()),
            None => {
                let choices: Vec<String> = question
                    .options
                    .iter()
                    .map(|o| match &o.label {
                        Some(label) if *label != value_text(&o.value) => {
                            format!("{} ({label})", value_text(&o.value))
                        }
                        _ => value_text(&o.value),
                    })
                    .collect();
                bail!(
                    "{:?} is not an option of question {question_id:?}; choose one of: {} \
                     (or pass --force)",
                    request.option,
                    choices.join(", ")
                )
            }
        },
    };
    let mut content = json!({
        "type": "question_response",
        "questionId": question_id,
        "selectedOption": selected,
    });
    if let Some(user) = &request.user_id {
        content["userId"] = json!(user);
    }
    let mut row = NewMessageIn::new("system", content.to_string());
    row.routing = match &question {
        Some(question) if !question.routing.is_empty() => question.routing.clone(),
        _ => db
            .session_routing()
            .context("reading the session routing")?
            .unwrap_or_default(),
    };
    let Inserted { id, seq } = db.insert_in(&row).context("inserting the answer")?;
    Ok(Answered {
        id,
        seq,
        selected_option: selected,
        question,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question(options: Value) -> Question {
        let row = MessageOut {
            id: "o1".into(),
            seq: Some(3),
            in_reply_to: None,
            timestamp: "2026-11-21T10:00:00.000Z".into(),
            deliver_after: None,
            kind: "chat-sdk".into(),
            routing: Routing::default(),
            content: json!({"operation":"ask_question","questionId":"q1","title":"T",
                            "question":"Pick","options":options})
            .to_string(),
        };
        Question::from_row(&row).unwrap()
    }

    #[test]
    fn resolves_values_and_labels() {
        let q = question(json!([
            {"label":"Yes please","selectedLabel":"Yes","value":"yes"},
            {"label":"No","value":"no"},
            "maybe"
        ]));
        assert_eq!(q.resolve("yes"), Some(json!("yes")));
        assert_eq!(q.resolve("yes PLEASE"), Some(json!("yes")));
        assert_eq!(q.resolve("maybe"), Some(json!("maybe")));
        assert_eq!(q.resolve("perhaps"), None);
    }
}
