//! What each subcommand prints, from its report: the same text and `--json` whether the report
//! came from a local DB or over the API (`remote`). One owner for the CLI's output.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use chrono::{DateTime, Utc};

use host::status::HealthReport;
use host::{
    AnswerReport, InitReport, InterruptSent, Sent, StatusReport, SweepOutcome, UsageReport,
};

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

/// `answer`'s line, or its `--json` object.
pub(crate) fn answered(report: &AnswerReport, as_json: bool) -> Result<()> {
    if as_json {
        return print_json(report);
    }
    if !report.question_found {
        logging::print_line("note: no such question was asked; sent anyway (--force)");
    }
    print(&format!(
        "id={} seq={} selectedOption={}\n",
        report.id, report.seq, report.selected_option
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
pub(crate) fn health(report: &HealthReport, as_json: bool) -> Result<ExitCode> {
    let (healthy, reason) = (report.healthy, &report.reason);
    if as_json {
        print_json(report)?;
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
