//! `usage`: what the session's turns used and cost, from the ledger (`turn_usage`), as totals
//! or broken down by day, model, series or provider. A figure no CLI reported is `?` (JSON
//! `null`), never 0; a sum some turns did not report is `N+?`.

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use schema::time::format_ts;
use schema::{Figure, SessionDb, UsageGroup, UsageGroupRow, UsageTotals};
use serde::{Deserialize, Serialize};

use crate::timefmt::format_duration;

/// What to report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageRequest {
    /// Break the totals down by this.
    pub by: Option<UsageGroup>,
    /// Only turns recorded from this instant on (all, when `None`).
    pub since: Option<DateTime<Utc>>,
}

/// What `usage` reports (docs/contract/host-cli.md#usage).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageReport {
    /// DB path.
    pub db: String,
    /// The start of the period, RFC 3339 UTC (`None`: the whole session).
    pub since: Option<String>,
    /// The time zone days are counted in.
    pub time_zone: String,
    /// The breakdown's name (`day`, `model`, `series`, `provider`), if one was asked for.
    pub by: Option<String>,
    /// Everything in the period.
    pub totals: UsageTotals,
    /// The breakdown, in key order (empty without `by`).
    pub groups: Vec<UsageGroupRow>,
}

/// Reads the ledger for `request`.
pub fn usage(db: &SessionDb, request: &UsageRequest) -> Result<UsageReport> {
    let totals = db
        .usage_since(request.since)
        .context("reading the usage ledger")?;
    let groups = match request.by {
        Some(group) => db
            .usage_by(group, request.since)
            .context("reading the usage ledger")?,
        None => Vec::new(),
    };
    Ok(UsageReport {
        db: db.path().display().to_string(),
        since: request.since.map(format_ts),
        time_zone: db.timezone().name().to_owned(),
        by: request.by.map(|by| by.as_str().to_owned()),
        totals,
        groups,
    })
}

impl UsageReport {
    /// The report as aligned lines: the period, then the totals, or the breakdown as a table
    /// with a total line.
    pub fn render(&self) -> String {
        let mut out = match &self.since {
            Some(since) => format!("usage since {since} (days in {})\n", self.time_zone),
            None => format!("usage of the whole session (days in {})\n", self.time_zone),
        };
        if self.totals.turns == 0 {
            out.push_str("no turn recorded\n");
            return out;
        }
        match self.by.as_deref() {
            None => {
                for (label, value) in totals_lines(&self.totals) {
                    out.push_str(&format!("{label:<10}  {value}\n"));
                }
            }
            Some(by) => {
                let mut rows = vec![TABLE_HEADER.map(str::to_owned).to_vec()];
                rows[0][0] = by.to_owned();
                for group in &self.groups {
                    let key = group.key.clone().unwrap_or_else(|| "(none)".to_owned());
                    rows.push(table_row(key, &group.totals));
                }
                rows.push(table_row("total".to_owned(), &self.totals));
                out.push_str(&table(&rows));
            }
        }
        if has_unreported(&self.totals) {
            out.push_str(
                "(? = not reported by the CLI; N+? = N from the turns that reported it)\n",
            );
        }
        out
    }
}

/// The totals as `(label, value)` lines.
fn totals_lines(totals: &UsageTotals) -> Vec<(&'static str, String)> {
    vec![
        ("turns", turns_text(totals)),
        (
            "tokens",
            format!(
                "{} (input {}, output {}, cache read {}, cache write {}, reasoning {})",
                count(&totals.tokens),
                count(&totals.input_tokens),
                count(&totals.output_tokens),
                count(&totals.cache_read_tokens),
                count(&totals.cache_write_tokens),
                count(&totals.reasoning_tokens)
            ),
        ),
        ("cost", cost(&totals.cost_usd)),
        ("requests", count(&totals.requests)),
        ("time", duration(&totals.duration_ms)),
    ]
}

/// `12` or `12 (1 error, 2 stopped)`.
fn turns_text(totals: &UsageTotals) -> String {
    match turn_notes(totals) {
        None => totals.turns.to_string(),
        Some(notes) => format!("{} ({notes})", totals.turns),
    }
}

/// `1 error, 2 stopped`, or `None` when every turn answered.
pub(crate) fn turn_notes(totals: &UsageTotals) -> Option<String> {
    let mut notes = Vec::new();
    if totals.errors > 0 {
        let plural = if totals.errors == 1 { "" } else { "s" };
        notes.push(format!("{} error{plural}", totals.errors));
    }
    if totals.aborted > 0 {
        notes.push(format!("{} stopped", totals.aborted));
    }
    (!notes.is_empty()).then(|| notes.join(", "))
}

const TABLE_HEADER: [&str; 8] = [
    "",
    "turns",
    "input",
    "output",
    "cache read",
    "cache write",
    "reasoning",
    "cost",
];

fn table_row(key: String, totals: &UsageTotals) -> Vec<String> {
    vec![
        key,
        totals.turns.to_string(),
        count(&totals.input_tokens),
        count(&totals.output_tokens),
        count(&totals.cache_read_tokens),
        count(&totals.cache_write_tokens),
        count(&totals.reasoning_tokens),
        cost(&totals.cost_usd),
    ]
}

/// Rows as columns: the first left-aligned, the others right-aligned, two spaces apart.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|row| row.get(i))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, &width))| match i {
                0 => format!("{cell:<width$}"),
                _ => format!("{cell:>width$}"),
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn has_unreported(totals: &UsageTotals) -> bool {
    [
        &totals.input_tokens,
        &totals.output_tokens,
        &totals.cache_read_tokens,
        &totals.cache_write_tokens,
        &totals.reasoning_tokens,
        &totals.requests,
        &totals.duration_ms,
    ]
    .iter()
    .any(|figure| figure.unreported > 0)
        || totals.cost_usd.unreported > 0
}

/// `?`, `N`, or `N+?` when some turns did not report the figure.
fn figure_text<T: Copy>(figure: &Figure<T>, show: impl Fn(T) -> String) -> String {
    match (figure.sum, figure.unreported) {
        (None, _) => "?".to_owned(),
        (Some(sum), 0) => show(sum),
        (Some(sum), _) => format!("{}+?", show(sum)),
    }
}

/// A token or request count.
pub(crate) fn count(figure: &Figure<u64>) -> String {
    figure_text(figure, |n| n.to_string())
}

/// A cost in dollars, to the hundredth of a cent.
pub(crate) fn cost(figure: &Figure<f64>) -> String {
    figure_text(figure, dollars)
}

/// `$0.0123`.
pub(crate) fn dollars(amount: f64) -> String {
    format!("${amount:.4}")
}

fn duration(figure: &Figure<u64>) -> String {
    figure_text(figure, |ms| {
        format_duration(i64::try_from(ms / 1000).unwrap_or(i64::MAX))
    })
}

#[cfg(test)]
mod tests {
    use expect_test::{expect, Expect};
    use schema::time::parse_ts;
    use schema::{NewTurnUsage, OpenOptions, UsageOutcome};

    use super::*;

    fn turn(provider: &str, model: Option<&str>, cost_usd: Option<f64>) -> NewTurnUsage {
        NewTurnUsage {
            provider: provider.into(),
            model: model.map(str::to_owned),
            input_tokens: Some(1200),
            output_tokens: Some(340),
            cache_read_tokens: Some(5000),
            cache_write_tokens: Some(800),
            reasoning_tokens: None,
            cost_usd,
            requests: Some(2),
            duration_ms: Some(4_200),
            outcome: UsageOutcome::Result,
            message_ids: vec!["in-1".into()],
            series_id: None,
        }
    }

    /// A ledger of four turns over two days in New York, one without a cost, one failed.
    fn ledger() -> (tempfile::TempDir, SessionDb) {
        let dir = tempfile::tempdir().unwrap();
        let options = OpenOptions {
            timezone: "America/New_York".parse().unwrap(),
            ..OpenOptions::default()
        };
        let db = SessionDb::open_with(dir.path().join("session.db"), options).unwrap();
        let at = |text| parse_ts(text).unwrap();
        db.record_usage(
            &turn("claude", Some("claude-sonnet-4-5"), Some(0.0213)),
            at("2026-11-21T03:00:00Z"),
        )
        .unwrap();
        db.record_usage(
            &turn("claude", Some("claude-sonnet-4-5"), Some(0.0187)),
            at("2026-11-21T15:00:00Z"),
        )
        .unwrap();
        let codex = NewTurnUsage {
            reasoning_tokens: Some(64),
            cache_write_tokens: None,
            series_id: Some("task-7".into()),
            ..turn("codex", Some("gpt-5"), None)
        };
        db.record_usage(&codex, at("2026-11-21T16:00:00Z")).unwrap();
        let failed = NewTurnUsage {
            input_tokens: None,
            output_tokens: None,
            cache_read_tokens: None,
            cache_write_tokens: None,
            requests: None,
            outcome: UsageOutcome::Error,
            ..turn("opencode", None, None)
        };
        db.record_usage(&failed, at("2026-11-21T17:00:00Z"))
            .unwrap();
        (dir, db)
    }

    /// A JSON report one key a line, each group on a line of its own.
    fn compact_lines(report: &serde_json::Value) -> String {
        let mut lines = Vec::new();
        for (key, value) in report.as_object().unwrap() {
            match value.as_array() {
                Some(groups) if key == "groups" => {
                    lines.extend(groups.iter().map(|group| format!("group: {group}")))
                }
                _ => lines.push(format!("{key}: {value}")),
            }
        }
        lines.join("\n")
    }

    /// Checks the text screen and, when given, the JSON one ([`compact_lines`]).
    fn check(db: &SessionDb, request: UsageRequest, text: Expect, json: Option<Expect>) {
        let report = usage(db, &request).unwrap();
        text.assert_eq(&report.render());
        let mut value = serde_json::to_value(&report).unwrap();
        value["db"] = "/ws/session.db".into();
        if let Some(json) = json {
            json.assert_eq(&compact_lines(&value));
        }
    }

    #[test]
    fn totals_with_unknown_figures() {
        let (_dir, db) = ledger();
        let report = usage(&db, &UsageRequest::default()).unwrap();
        expect![[r#"
            usage of the whole session (days in America/New_York)
            turns       4 (1 error)
            tokens      21220+? (input 3600+?, output 1020+?, cache read 15000+?, cache write 1600+?, reasoning 64+?)
            cost        $0.0400+?
            requests    6+?
            time        16s
            (? = not reported by the CLI; N+? = N from the turns that reported it)
        "#]]
        .assert_eq(&report.render());
    }

    #[test]
    fn by_day_in_the_session_time_zone() {
        let (_dir, db) = ledger();
        check(
            &db,
            UsageRequest {
                by: Some(UsageGroup::Day),
                since: None,
            },
            expect![[r#"
                usage of the whole session (days in America/New_York)
                day         turns   input  output  cache read  cache write  reasoning       cost
                2026-11-20      1    1200     340        5000          800          ?    $0.0213
                2026-11-21      3  2400+?   680+?     10000+?        800+?       64+?  $0.0187+?
                total           4  3600+?  1020+?     15000+?       1600+?       64+?  $0.0400+?
                (? = not reported by the CLI; N+? = N from the turns that reported it)
            "#]],
            None,
        );
    }

    #[test]
    fn by_model_since_an_instant_as_json() {
        let (_dir, db) = ledger();
        check(
            &db,
            UsageRequest {
                by: Some(UsageGroup::Model),
                since: Some(parse_ts("2026-11-21T12:00:00Z").unwrap()),
            },
            expect![[r#"
                usage since 2026-11-21T12:00:00.000Z (days in America/New_York)
                model              turns   input  output  cache read  cache write  reasoning       cost
                (none)                 1       ?       ?           ?            ?          ?          ?
                claude-sonnet-4-5      1    1200     340        5000          800          ?    $0.0187
                gpt-5                  1    1200     340        5000            ?         64          ?
                total                  3  2400+?   680+?     10000+?        800+?       64+?  $0.0187+?
                (? = not reported by the CLI; N+? = N from the turns that reported it)
            "#]],
            Some(expect![[r#"
                by: "model"
                db: "/ws/session.db"
                group: {"key":null,"totals":{"aborted":0,"cacheReadTokens":{"sum":null,"unreported":1},"cacheWriteTokens":{"sum":null,"unreported":1},"costUsd":{"sum":null,"unreported":1},"durationMs":{"sum":4200,"unreported":0},"errors":1,"inputTokens":{"sum":null,"unreported":1},"outputTokens":{"sum":null,"unreported":1},"reasoningTokens":{"sum":null,"unreported":1},"requests":{"sum":null,"unreported":1},"tokens":{"sum":null,"unreported":1},"turns":1}}
                group: {"key":"claude-sonnet-4-5","totals":{"aborted":0,"cacheReadTokens":{"sum":5000,"unreported":0},"cacheWriteTokens":{"sum":800,"unreported":0},"costUsd":{"sum":0.0187,"unreported":0},"durationMs":{"sum":4200,"unreported":0},"errors":0,"inputTokens":{"sum":1200,"unreported":0},"outputTokens":{"sum":340,"unreported":0},"reasoningTokens":{"sum":null,"unreported":1},"requests":{"sum":2,"unreported":0},"tokens":{"sum":7340,"unreported":0},"turns":1}}
                group: {"key":"gpt-5","totals":{"aborted":0,"cacheReadTokens":{"sum":5000,"unreported":0},"cacheWriteTokens":{"sum":null,"unreported":1},"costUsd":{"sum":null,"unreported":1},"durationMs":{"sum":4200,"unreported":0},"errors":0,"inputTokens":{"sum":1200,"unreported":0},"outputTokens":{"sum":340,"unreported":0},"reasoningTokens":{"sum":64,"unreported":0},"requests":{"sum":2,"unreported":0},"tokens":{"sum":6540,"unreported":0},"turns":1}}
                since: "2026-11-21T12:00:00.000Z"
                timeZone: "America/New_York"
                totals: {"aborted":0,"cacheReadTokens":{"sum":10000,"unreported":1},"cacheWriteTokens":{"sum":800,"unreported":2},"costUsd":{"sum":0.0187,"unreported":2},"durationMs":{"sum":12600,"unreported":0},"errors":1,"inputTokens":{"sum":2400,"unreported":1},"outputTokens":{"sum":680,"unreported":1},"reasoningTokens":{"sum":64,"unreported":2},"requests":{"sum":4,"unreported":1},"tokens":{"sum":13880,"unreported":1},"turns":3}"#]]),
        );
    }

    #[test]
    fn an_empty_ledger() {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open(dir.path().join("session.db")).unwrap();
        check(
            &db,
            UsageRequest::default(),
            expect![[r#"
                usage of the whole session (days in UTC)
                no turn recorded
            "#]],
            None,
        );
        let report = serde_json::to_value(usage(&db, &UsageRequest::default()).unwrap()).unwrap();
        assert_eq!(
            report["totals"]["costUsd"],
            serde_json::json!({"sum": null, "unreported": 0})
        );
        assert_eq!(report["totals"]["turns"], 0);
        assert_eq!(report["groups"], serde_json::json!([]));
    }
}
