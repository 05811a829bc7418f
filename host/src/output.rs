//! What each subcommand prints, from its report: the same text and `--json` whether the report
//! came from a local DB or over the API (`remote`). One owner for the CLI's output.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use host::{Answered, InitReport, InterruptSent, Sent, StatusReport, SweepOutcome, UsageReport};

pub(crate) fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

pub(crate) fn print_json(value: &impl serde::Serialize) -> Result<()> {
    print(&format!("{}\n", serde_json::to_string(value)?))
}

pub(crate) fn init(report: &InitReport, as_json: bool) -> Result<()> {
    if as_json {
        print_json(report)
    } else {
        print(&report.render())
    }
}

pub(crate) fn sent(sent: &Sent, as_json: bool) -> Result<()> {
    if as_json {
        print_json(sent)
    } else {
        for note in &sent.notes {
            logging::print_line(&format!("note: {note}"));
        }
        print(&format!("id={} seq={}\n", sent.id, sent.seq))
    }
}

/// `answer --json`'s object: what was written and whether the question was found.
pub(crate) fn answered_json(answered: &Answered) -> Value {
    json!({
        "id": answered.id,
        "seq": answered.seq,
        "selectedOption": answered.selected_option,
        "questionFound": answered.question.is_some(),
    })
}

/// Prints [`answered_json`]'s object, or its line.
pub(crate) fn answered(object: &Value, as_json: bool) -> Result<()> {
    if as_json {
        return print_json(object);
    }
    if object.get("questionFound").and_then(Value::as_bool) == Some(false) {
        logging::print_line("note: no such question was asked; sent anyway (--force)");
    }
    let field = |name: &str| object.get(name).cloned().unwrap_or(Value::Null);
    let id = match field("id") {
        Value::String(id) => id,
        other => other.to_string(),
    };
    print(&format!(
        "id={id} seq={} selectedOption={}\n",
        field("seq"),
        field("selectedOption")
    ))
}

pub(crate) fn sweep(outcome: &SweepOutcome, now: DateTime<Utc>, as_json: bool) -> Result<()> {
    if as_json {
        print_json(outcome)
    } else {
        print(&outcome.render(now))
    }
}

pub(crate) fn status(report: &StatusReport, now: DateTime<Utc>, as_json: bool) -> Result<()> {
    if as_json {
        print_json(report)
    } else {
        print(&report.render(now))
    }
}

pub(crate) fn usage(report: &UsageReport, as_json: bool) -> Result<()> {
    if as_json {
        print_json(report)
    } else {
        print(&report.render())
    }
}

pub(crate) fn interrupt(sent: &InterruptSent, as_json: bool) -> Result<()> {
    if as_json {
        print_json(sent)
    } else {
        if let Some(note) = &sent.note {
            logging::print_line(&format!("note: {note}"));
        }
        print(&format!("id={} seq={}\n", sent.id, sent.seq))
    }
}

/// Exit 1 (the orchestrators' "unhealthy") with the reason on stderr, or 0 with the verdict on
/// stdout; `--json` prints `{"healthy","reason"}` either way.
pub(crate) fn health(healthy: bool, reason: &str, as_json: bool) -> Result<ExitCode> {
    if as_json {
        print_json(&json!({ "healthy": healthy, "reason": reason }))?;
    } else if healthy {
        print(&format!("{reason}\n"))?;
    } else {
        logging::print_line(&format!("nanoclaw: unhealthy: {reason}"));
    }
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One `messages_out` row of `watch`: its JSON object, or its readable line.
pub(crate) fn row(row: &schema::MessageOut, as_json: bool) -> Result<()> {
    if as_json {
        print_json(&host::row_json(row))
    } else {
        print(&format!("{}\n", host::render_row(row)))
    }
}
