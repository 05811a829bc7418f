//! The usage ledger (`turn_usage`): one row per ended turn, written in the transaction that
//! writes the turn's replies and completion (or its `query_error` row), so a crash never
//! records a turn twice or loses one (docs/contract/db.md#turn_usage).

use chrono::{DateTime, NaiveDate, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;
use rusqlite::{params, Transaction};

use crate::time::format_ts;
use crate::Error;

/// How a turn recorded in the ledger ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageOutcome {
    /// It answered (a `Result`).
    Result,
    /// It failed (an `Error` that ended it).
    Error,
    /// It was stopped (`/stop`, an interrupt, `maxTurnsPerQuery`, shutdown).
    Aborted,
}

impl UsageOutcome {
    /// The name stored in `turn_usage.outcome`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Result => "result",
            Self::Error => "error",
            Self::Aborted => "aborted",
        }
    }
}

/// One ledger row to write. Token and cost figures the CLI did not report are `None` (NULL),
/// never 0.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTurnUsage {
    /// `claude`, `codex`, `opencode` or `mock`.
    pub provider: String,
    /// The model that answered, when known.
    pub model: Option<String>,
    /// Input tokens (cache reads and writes not included).
    pub input_tokens: Option<u64>,
    /// Output tokens.
    pub output_tokens: Option<u64>,
    /// Tokens read from the prompt cache.
    pub cache_read_tokens: Option<u64>,
    /// Tokens written to the prompt cache.
    pub cache_write_tokens: Option<u64>,
    /// Reasoning tokens.
    pub reasoning_tokens: Option<u64>,
    /// Cost in US dollars, when the CLI computed one.
    pub cost_usd: Option<f64>,
    /// Model requests (steps) of the turn.
    pub requests: Option<u64>,
    /// How long the turn took.
    pub duration_ms: Option<u64>,
    /// How it ended.
    pub outcome: UsageOutcome,
    /// The `messages_in` ids the turn answered (or tried to).
    pub message_ids: Vec<String>,
    /// The task series the turn ran for, when it ran one.
    pub series_id: Option<String>,
}

impl NewTurnUsage {
    /// The turn's tokens as the ledger counts them (its `tokens` totals, `maxTokensPerDay`):
    /// input, output, cache reads and cache writes added up (reasoning is part of output);
    /// 0 when none was reported.
    pub fn tokens(&self) -> u64 {
        [
            self.input_tokens,
            self.output_tokens,
            self.cache_read_tokens,
            self.cache_write_tokens,
        ]
        .into_iter()
        .flatten()
        .fold(0, u64::saturating_add)
    }
}

/// Writes `usage` inside the caller's transaction.
pub(crate) fn insert_usage_tx(
    tx: &Transaction<'_>,
    usage: &NewTurnUsage,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    // SQLite integers are i64; a figure beyond that is not a real count, it is stored as NULL
    // rather than wrapped.
    let int = |v: Option<u64>| v.and_then(|v| i64::try_from(v).ok());
    tx.prepare_cached(
        "INSERT INTO turn_usage (created_at, provider, model, input_tokens, output_tokens,
           cache_read_tokens, cache_write_tokens, reasoning_tokens, cost_usd, requests,
           duration_ms, outcome, message_ids, series_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    )?
    .execute(params![
        format_ts(now),
        usage.provider,
        usage.model,
        int(usage.input_tokens),
        int(usage.output_tokens),
        int(usage.cache_read_tokens),
        int(usage.cache_write_tokens),
        int(usage.reasoning_tokens),
        usage.cost_usd.filter(|c| c.is_finite()),
        int(usage.requests),
        int(usage.duration_ms),
        usage.outcome.as_str(),
        serde_json::to_string(&usage.message_ids)?,
        usage.series_id,
    ])?;
    Ok(())
}

impl crate::SessionDb {
    /// Records a turn that wrote nothing else (a turn stopped before it answered).
    pub fn record_usage(&self, usage: &NewTurnUsage, now: DateTime<Utc>) -> Result<(), Error> {
        self.write(|tx| insert_usage_tx(tx, usage, now))
    }
}

/// One figure summed over turns: the sum of the values the CLIs reported, and how many turns
/// reported none. `sum` is `None` when no turn reported the figure (unknown, never 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Figure<T> {
    /// The sum of the reported values; `None` when no turn reported one.
    pub sum: Option<T>,
    /// Turns that did not report this figure.
    pub unreported: u64,
}

/// What a set of ledger rows adds up to.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageTotals {
    /// Turns recorded.
    pub turns: u64,
    /// Of them, turns that ended in an error.
    pub errors: u64,
    /// Of them, turns that were stopped.
    pub aborted: u64,
    /// Input tokens (cache not included).
    pub input_tokens: Figure<u64>,
    /// Output tokens.
    pub output_tokens: Figure<u64>,
    /// Tokens read from the prompt cache.
    pub cache_read_tokens: Figure<u64>,
    /// Tokens written to the prompt cache.
    pub cache_write_tokens: Figure<u64>,
    /// Reasoning tokens (part of the output tokens).
    pub reasoning_tokens: Figure<u64>,
    /// Every token a turn reported (input, output, cache reads and writes: what token budgets
    /// count); a turn is unreported when it reported none of the four.
    pub tokens: Figure<u64>,
    /// Cost in US dollars.
    pub cost_usd: Figure<f64>,
    /// Model requests (steps).
    pub requests: Figure<u64>,
    /// Time the turns took, in milliseconds.
    pub duration_ms: Figure<u64>,
}

/// What a breakdown groups the ledger by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageGroup {
    /// The day the turn was recorded, in the session's time zone ([`SessionDb::timezone`]).
    Day,
    /// The model that answered.
    Model,
    /// The task series the turn ran for.
    Series,
    /// The provider (`claude`, `codex`, `opencode`, `mock`).
    Provider,
}

impl UsageGroup {
    /// The group's name (`day`, `model`, `series`, `provider`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Model => "model",
            Self::Series => "series",
            Self::Provider => "provider",
        }
    }

    /// The column a SQL breakdown groups by (none for `Day`: days are local, see
    /// [`SessionDb::usage_by`]).
    fn column(self) -> Option<&'static str> {
        match self {
            Self::Day => None,
            Self::Model => Some("model"),
            Self::Series => Some("series_id"),
            Self::Provider => Some("provider"),
        }
    }
}

impl std::str::FromStr for UsageGroup {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        [Self::Day, Self::Model, Self::Series, Self::Provider]
            .into_iter()
            .find(|group| group.as_str() == name)
            .ok_or_else(|| {
                format!("unknown breakdown {name:?}: expected day, model, series or provider")
            })
    }
}

/// One line of a breakdown.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageGroupRow {
    /// The day (`YYYY-MM-DD`), model, series id or provider; `None` for turns without one
    /// (no model named, no task series).
    pub key: Option<String>,
    /// What its turns add up to.
    pub totals: UsageTotals,
}

/// The aggregate every ledger query selects, in the order [`read_totals`] reads it. A turn's
/// tokens are reported when one of the four figures is; their sum is the four sums'.
const AGGREGATES: &str = "count(*),
  sum(outcome = 'error'), sum(outcome = 'aborted'),
  sum(input_tokens), count(input_tokens),
  sum(output_tokens), count(output_tokens),
  sum(cache_read_tokens), count(cache_read_tokens),
  sum(cache_write_tokens), count(cache_write_tokens),
  sum(reasoning_tokens), count(reasoning_tokens),
  count(coalesce(input_tokens, output_tokens, cache_read_tokens, cache_write_tokens)),
  sum(cost_usd), count(cost_usd),
  sum(requests), count(requests),
  sum(duration_ms), count(duration_ms)";

/// The ledger, with the rows `{WHERE}` selects.
const LEDGER: &str = "turn_usage {WHERE}";

/// The rows of `[?1, ?2)` (Unix milliseconds). The first two terms are a coarse range on the
/// text, by date prefix with a day's margin each side (every accepted form starts with the
/// date, at most a day off UTC), so the `created_at` index narrows the scan; the exact bounds
/// are compared through `ts_millis()`, as every time in SQL (docs/contract/db.md#timestamps).
const WINDOW: &str = "WHERE created_at >= ?3 AND created_at < ?4
     AND ts_millis(created_at) >= ?1 AND ts_millis(created_at) < ?2";

/// The same from `?1` on.
const SINCE: &str = "WHERE created_at >= ?3 AND ts_millis(created_at) >= ?1";

/// Reads [`AGGREGATES`] from column `first` on.
fn read_totals(row: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<UsageTotals> {
    let count = |i: usize| -> rusqlite::Result<u64> {
        Ok(u64::try_from(row.get::<_, Option<i64>>(first + i)?.unwrap_or(0)).unwrap_or(0))
    };
    let turns = count(0)?;
    let figure = |i: usize| -> rusqlite::Result<Figure<u64>> {
        let reported = count(i + 1)?;
        let sum = row.get::<_, Option<i64>>(first + i)?;
        Ok(Figure {
            sum: sum
                .filter(|_| reported > 0)
                .map(|s| u64::try_from(s).unwrap_or(0)),
            unreported: turns.saturating_sub(reported),
        })
    };
    let input_tokens = figure(3)?;
    let output_tokens = figure(5)?;
    let cache_read_tokens = figure(7)?;
    let cache_write_tokens = figure(9)?;
    let tokens_reported = count(13)?;
    let tokens = Figure {
        sum: [
            input_tokens,
            output_tokens,
            cache_read_tokens,
            cache_write_tokens,
        ]
        .iter()
        .filter_map(|figure| figure.sum)
        .reduce(u64::saturating_add)
        .filter(|_| tokens_reported > 0),
        unreported: turns.saturating_sub(tokens_reported),
    };
    let cost_reported = count(15)?;
    Ok(UsageTotals {
        turns,
        errors: count(1)?,
        aborted: count(2)?,
        input_tokens,
        output_tokens,
        cache_read_tokens,
        cache_write_tokens,
        reasoning_tokens: figure(11)?,
        tokens,
        cost_usd: Figure {
            sum: row
                .get::<_, Option<f64>>(first + 14)?
                .filter(|_| cost_reported > 0),
            unreported: turns.saturating_sub(cost_reported),
        },
        requests: figure(16)?,
        duration_ms: figure(18)?,
    })
}

/// The parameters of [`SINCE`] (`?2` unused).
fn since_params(since: DateTime<Utc>) -> (i64, Option<i64>, String) {
    (since.timestamp_millis(), None, date_bound(since, -1))
}

/// The text bounds of [`WINDOW`]'s coarse range: the date of `at` moved by `days`; past the
/// calendar's ends, a text below or above every date.
fn date_bound(at: DateTime<Utc>, days: i64) -> String {
    match at.checked_add_signed(chrono::Duration::days(days)) {
        Some(moved) => moved.format("%Y-%m-%d").to_string(),
        None if days < 0 => String::new(),
        None => "~".to_owned(),
    }
}

/// Two instants: the first and the last of something.
type Span = (DateTime<Utc>, DateTime<Utc>);

/// The local day that contains `at` in `tz`, as the UTC instants `[start, end)` (23 or 25
/// hours across a DST change). Daily budgets and `--by day` use these bounds.
pub fn day_window(at: DateTime<Utc>, tz: Tz) -> Span {
    let day = at.with_timezone(&tz).date_naive();
    (
        local_midnight(day, tz),
        local_midnight(day + chrono::Duration::days(1), tz),
    )
}

/// The first instant of `day` in `tz` (midnight, or the end of a DST gap that skips it).
fn local_midnight(day: NaiveDate, tz: Tz) -> DateTime<Utc> {
    let mut time = day.and_time(NaiveTime::MIN);
    // A gap is at most a few hours; walk forward to its end.
    for _ in 0..48 {
        if let Some(start) = tz.from_local_datetime(&time).earliest() {
            return start.with_timezone(&Utc);
        }
        time += chrono::Duration::minutes(30);
    }
    day.and_time(NaiveTime::MIN).and_utc()
}

impl crate::SessionDb {
    /// What the whole session's turns add up to.
    pub fn usage_total(&self) -> Result<UsageTotals, Error> {
        self.totals_where("", [])
    }

    /// What the turns recorded in `[from, to)` add up to (one indexed query; budgets call it).
    pub fn usage_between(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<UsageTotals, Error> {
        self.totals_where(
            WINDOW,
            (
                from.timestamp_millis(),
                to.timestamp_millis(),
                date_bound(from, -1),
                date_bound(to, 2),
            ),
        )
    }

    /// What the turns recorded since `since` (all, when `None`) add up to.
    pub fn usage_since(&self, since: Option<DateTime<Utc>>) -> Result<UsageTotals, Error> {
        match since {
            None => self.usage_total(),
            Some(since) => self.totals_where(SINCE, since_params(since)),
        }
    }

    /// The ledger since `since` (all, when `None`) broken down by `group`, in key order (turns
    /// without a key first; days oldest first, only days with turns). Days are local to
    /// [`SessionDb::timezone`], one indexed window query per day between the first and the
    /// last turn.
    pub fn usage_by(
        &self,
        group: UsageGroup,
        since: Option<DateTime<Utc>>,
    ) -> Result<Vec<UsageGroupRow>, Error> {
        let Some(column) = group.column() else {
            return self.usage_by_day(since);
        };
        let conn = self.conn()?;
        let filter = if since.is_some() { SINCE } else { "" };
        let sql = format!(
            "SELECT {column}, {AGGREGATES} FROM {} GROUP BY {column} ORDER BY {column}",
            LEDGER.replace("{WHERE}", filter)
        );
        let mut stmt = conn.prepare_cached(&sql)?;
        let read = |row: &rusqlite::Row<'_>| -> rusqlite::Result<UsageGroupRow> {
            Ok(UsageGroupRow {
                key: crate::rows::lossy_text(row.get_ref(0)?),
                totals: read_totals(row, 1)?,
            })
        };
        let rows = match since {
            None => stmt.query_map([], read)?.collect::<Result<Vec<_>, _>>()?,
            Some(since) => stmt
                .query_map(since_params(since), read)?
                .collect::<Result<Vec<_>, _>>()?,
        };
        Ok(rows)
    }

    /// [`AGGREGATES`] over the ledger rows `filter` selects.
    fn totals_where(
        &self,
        filter: &str,
        params: impl rusqlite::Params,
    ) -> Result<UsageTotals, Error> {
        let conn = self.conn()?;
        let sql = format!(
            "SELECT {AGGREGATES} FROM {}",
            LEDGER.replace("{WHERE}", filter)
        );
        let totals = conn
            .prepare_cached(&sql)?
            .query_row(params, |row| read_totals(row, 0))?;
        Ok(totals)
    }

    fn usage_by_day(&self, since: Option<DateTime<Utc>>) -> Result<Vec<UsageGroupRow>, Error> {
        let Some((first, last)) = self.usage_span(since)? else {
            return Ok(Vec::new());
        };
        let tz = self.timezone();
        let mut rows = Vec::new();
        let (mut start, mut end) = day_window(first, tz);
        loop {
            let from = since.map_or(start, |since| since.max(start));
            let totals = self.usage_between(from, end)?;
            if totals.turns > 0 {
                rows.push(UsageGroupRow {
                    key: Some(start.with_timezone(&tz).format("%Y-%m-%d").to_string()),
                    totals,
                });
            }
            if end > last {
                return Ok(rows);
            }
            (start, end) = day_window(end, tz);
        }
    }

    /// Instants around every readable `created_at` since `since`: from the dates of the
    /// lowest and highest text on the index (`min`/`max` each a seek), a day wider than any
    /// form's offset; the days outside the rows come out empty. Texts that start with no date
    /// fall back to a scan through `ts_millis()`.
    fn usage_span(&self, since: Option<DateTime<Utc>>) -> Result<Option<Span>, Error> {
        let conn = self.conn()?;
        let low = since.map_or_else(|| "0".to_owned(), |since| date_bound(since, -1));
        // `:` sorts right after the digits: every text that starts with a year is below it.
        let end = |sql: &str| -> Result<Option<String>, Error> {
            Ok(conn
                .prepare_cached(sql)?
                .query_row([&low], |row| row.get(0))?)
        };
        let first = end(
            "SELECT min(created_at) FROM turn_usage WHERE created_at >= ?1 AND created_at < ':'",
        )?;
        let last = end(
            "SELECT max(created_at) FROM turn_usage WHERE created_at >= ?1 AND created_at < ':'",
        )?;
        let date = |text: &Option<String>| {
            let prefix = text.as_deref()?.get(..10)?;
            Some(
                NaiveDate::parse_from_str(prefix, "%Y-%m-%d")
                    .ok()?
                    .and_time(NaiveTime::MIN)
                    .and_utc(),
            )
        };
        let since_ms = since.map_or(i64::MIN, |since| since.timestamp_millis());
        let (first, last) = match (date(&first), date(&last)) {
            (Some(first), Some(last)) => (
                Some(first - chrono::Duration::days(1)),
                Some(last + chrono::Duration::days(2)),
            ),
            _ => {
                let (first, last): (Option<i64>, Option<i64>) = conn
                    .prepare_cached(
                        "SELECT min(ms), max(ms) FROM
                           (SELECT ts_millis(created_at) AS ms FROM turn_usage) WHERE ms >= ?1",
                    )?
                    .query_row([since_ms], |row| Ok((row.get(0)?, row.get(1)?)))?;
                let at = |ms: Option<i64>| ms.and_then(DateTime::<Utc>::from_timestamp_millis);
                (at(first), at(last))
            }
        };
        Ok(first.zip(last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{count, older_db};
    use crate::time::parse_ts;
    use crate::{OpenOptions, SessionDb};

    fn at(text: &str) -> DateTime<Utc> {
        parse_ts(text).unwrap()
    }

    fn turn(provider: &str, model: Option<&str>) -> NewTurnUsage {
        NewTurnUsage {
            provider: provider.into(),
            model: model.map(str::to_owned),
            input_tokens: Some(100),
            output_tokens: Some(20),
            cache_read_tokens: Some(1000),
            cache_write_tokens: None,
            reasoning_tokens: None,
            cost_usd: Some(0.01),
            requests: Some(2),
            duration_ms: Some(1500),
            outcome: UsageOutcome::Result,
            message_ids: vec!["in-1".into()],
            series_id: None,
        }
    }

    fn db_in(dir: &tempfile::TempDir, tz: Tz) -> SessionDb {
        let options = OpenOptions {
            timezone: tz,
            ..OpenOptions::default()
        };
        SessionDb::open_with(dir.path().join("session.db"), options).unwrap()
    }

    #[test]
    fn totals_keep_unknown_figures_apart_from_zero() {
        let dir = tempfile::tempdir().unwrap();
        let db = db_in(&dir, Tz::UTC);
        let empty = db.usage_total().unwrap();
        assert_eq!(empty.turns, 0);
        assert_eq!(empty.cost_usd.sum, None, "no turn: unknown, not 0");
        assert_eq!(empty.tokens.sum, None);

        db.record_usage(&turn("claude", Some("opus")), at("2026-11-21T10:00:00Z"))
            .unwrap();
        let no_cost = NewTurnUsage {
            cost_usd: None,
            cache_read_tokens: None,
            reasoning_tokens: Some(0),
            outcome: UsageOutcome::Error,
            ..turn("codex", Some("gpt-5"))
        };
        db.record_usage(&no_cost, at("2026-11-21T11:00:00Z"))
            .unwrap();
        let nothing = NewTurnUsage {
            input_tokens: None,
            output_tokens: None,
            cache_read_tokens: None,
            cost_usd: None,
            requests: None,
            duration_ms: None,
            outcome: UsageOutcome::Aborted,
            ..turn("opencode", None)
        };
        db.record_usage(&nothing, at("2026-11-21T12:00:00Z"))
            .unwrap();

        let totals = db.usage_total().unwrap();
        assert_eq!((totals.turns, totals.errors, totals.aborted), (3, 1, 1));
        let figure = |sum, unreported| Figure { sum, unreported };
        assert_eq!(totals.input_tokens, figure(Some(200), 1));
        assert_eq!(totals.output_tokens, figure(Some(40), 1));
        assert_eq!(totals.cache_read_tokens, figure(Some(1000), 2));
        assert_eq!(totals.cache_write_tokens, figure(None, 3), "never reported");
        assert_eq!(
            totals.reasoning_tokens,
            figure(Some(0), 2),
            "a reported 0 is 0"
        );
        assert_eq!(totals.tokens, figure(Some(1240), 1));
        assert_eq!(
            totals.cost_usd,
            Figure {
                sum: Some(0.01),
                unreported: 2
            }
        );
        assert_eq!(totals.requests, figure(Some(4), 1));
        assert_eq!(totals.duration_ms, figure(Some(3000), 1));
    }

    #[test]
    fn a_window_is_half_open_and_reads_every_stored_time_form() {
        let dir = tempfile::tempdir().unwrap();
        let db = db_in(&dir, Tz::UTC);
        for time in [
            "2026-11-20T23:59:59.999Z",
            "2026-11-21T00:00:00.000Z",
            "2026-11-21T23:59:59.999Z",
            "2026-11-22T00:00:00.000Z",
        ] {
            db.record_usage(&turn("claude", None), at(time)).unwrap();
        }
        // Rows another writer stored in other accepted forms: by instant, not by text.
        db.dedicated_connection()
            .unwrap()
            .execute_batch(
                "INSERT INTO turn_usage (created_at, provider, outcome, message_ids, cost_usd)
                 VALUES ('2026-11-22T01:30:00+02:00', 'x', 'result', '[]', 1.0),
                        ('2026-11-20 23:30:00-0100', 'x', 'result', '[]', 2.0),
                        ('2026-11-21 12:00', 'x', 'result', '[]', 4.0),
                        ('garbage', 'x', 'result', '[]', 8.0);",
            )
            .unwrap();
        let day = db
            .usage_between(at("2026-11-21T00:00:00Z"), at("2026-11-22T00:00:00Z"))
            .unwrap();
        assert_eq!(day.turns, 5, "{day:?}");
        let cost = day.cost_usd.sum.unwrap();
        assert!((cost - 7.02).abs() < 1e-9, "{cost}");
        let all = db
            .usage_between(DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC)
            .unwrap();
        assert_eq!(
            all.turns, 7,
            "every readable time, at the calendar's ends too"
        );
        let since = db.usage_since(Some(at("2026-11-21T12:00:00Z"))).unwrap();
        assert_eq!(since.turns, 4, "{since:?}");
        assert_eq!(
            db.usage_total().unwrap().turns,
            8,
            "the session counts every row"
        );
        let days = |db: &SessionDb| -> Vec<(Option<String>, u64)> {
            db.usage_by(UsageGroup::Day, None)
                .unwrap()
                .into_iter()
                .map(|row| (row.key, row.totals.turns))
                .collect()
        };
        let expected = [
            (Some("2026-11-20".to_owned()), 1),
            (Some("2026-11-21".to_owned()), 5),
            (Some("2026-11-22".to_owned()), 1),
        ];
        assert_eq!(days(&db), expected, "by the index's dates");
        // A text that starts with digits but no date: the span falls back to a scan.
        db.dedicated_connection()
            .unwrap()
            .execute_batch(
                "INSERT INTO turn_usage (created_at, provider, outcome, message_ids)
                 VALUES ('20261121', 'x', 'result', '[]')",
            )
            .unwrap();
        assert_eq!(days(&db), expected, "by the scan's instants");
    }

    #[test]
    fn the_window_query_uses_the_created_at_index() {
        let dir = tempfile::tempdir().unwrap();
        let db = db_in(&dir, Tz::UTC);
        let conn = db.conn().unwrap();
        let plan = |filter: &str, params: &[&dyn rusqlite::ToSql]| -> Vec<String> {
            let sql = format!(
                "EXPLAIN QUERY PLAN SELECT {AGGREGATES} FROM {}",
                LEDGER.replace("{WHERE}", filter)
            );
            let mut stmt = conn.prepare(&sql).unwrap();
            stmt.query_map(params, |row| row.get(3))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        let since = since_params(at("2026-11-21T00:00:00Z"));
        for plan in [
            plan(WINDOW, &[&1_i64, &2_i64, &"2026-11-20", &"2026-11-23"]),
            plan(SINCE, &[&since.0, &since.1, &since.2]),
        ] {
            assert!(
                plan.iter()
                    .any(|step| step.contains("USING INDEX idx_turn_usage_created")),
                "{plan:?}"
            );
        }
    }

    #[test]
    fn breakdowns_by_model_series_provider_and_local_day() {
        let dir = tempfile::tempdir().unwrap();
        let tz: Tz = "America/New_York".parse().unwrap();
        let db = db_in(&dir, tz);
        // 03:00 UTC on the 21st is still the 20th in New York.
        db.record_usage(&turn("claude", Some("opus")), at("2026-11-21T03:00:00Z"))
            .unwrap();
        let task = NewTurnUsage {
            series_id: Some("task-1".into()),
            ..turn("codex", Some("gpt-5"))
        };
        db.record_usage(&task, at("2026-11-21T15:00:00Z")).unwrap();
        db.record_usage(&task, at("2026-11-24T15:00:00Z")).unwrap();
        let keys = |group| -> Vec<(Option<String>, u64)> {
            db.usage_by(group, None)
                .unwrap()
                .into_iter()
                .map(|row| (row.key, row.totals.turns))
                .collect()
        };
        let some = |key: &str, n| (Some(key.to_owned()), n);
        assert_eq!(keys(UsageGroup::Model), [some("gpt-5", 2), some("opus", 1)]);
        assert_eq!(keys(UsageGroup::Series), [(None, 1), some("task-1", 2)]);
        assert_eq!(
            keys(UsageGroup::Provider),
            [some("claude", 1), some("codex", 2)]
        );
        assert_eq!(
            keys(UsageGroup::Day),
            [
                some("2026-11-20", 1),
                some("2026-11-21", 1),
                some("2026-11-24", 1)
            ]
        );
        let since = Some(at("2026-11-21T12:00:00Z"));
        let days: Vec<_> = db.usage_by(UsageGroup::Day, since).unwrap();
        assert_eq!(days.len(), 2);
        let models = db.usage_by(UsageGroup::Model, since).unwrap();
        assert_eq!(models.len(), 1);
        assert_eq!(models[0].totals.turns, 2);
        assert!(db
            .usage_by(UsageGroup::Day, Some(at("2027-01-01T00:00:00Z")))
            .unwrap()
            .is_empty());
        assert_eq!("series".parse(), Ok(UsageGroup::Series));
        assert!("week".parse::<UsageGroup>().is_err());
    }

    #[test]
    fn local_days_across_dst_changes() {
        let ny: Tz = "America/New_York".parse().unwrap();
        let (start, end) = day_window(at("2026-03-08T12:00:00Z"), ny);
        assert_eq!(
            (start, end),
            (at("2026-03-08T05:00:00Z"), at("2026-03-09T04:00:00Z"))
        );
        // Havana skips midnight itself when summer time starts: the day starts at 01:00.
        let havana: Tz = "America/Havana".parse().unwrap();
        let (start, end) = day_window(at("2026-03-08T12:00:00Z"), havana);
        assert_eq!(
            (start, end),
            (at("2026-03-08T05:00:00Z"), at("2026-03-09T04:00:00Z"))
        );
        let (start, _) = day_window(at("2026-11-21T10:00:00Z"), Tz::UTC);
        assert_eq!(start, at("2026-11-21T00:00:00Z"));
    }

    /// A ledger row keeps no `sqlite_sequence` row: with `AUTOINCREMENT` every turn also
    /// rewrote it (one more WAL page per turn). Ids still count up in the order the turns ended.
    #[test]
    fn a_ledger_row_writes_no_sequence_row() {
        let dir = tempfile::tempdir().unwrap();
        let db = db_in(&dir, Tz::UTC);
        for minute in 0..3 {
            let now = at("2026-11-21T10:00:00Z") + chrono::Duration::minutes(minute);
            db.record_usage(&turn("mock", None), now).unwrap();
        }
        let conn = db.dedicated_connection().unwrap();
        let sequences = count(
            &conn,
            "SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_sequence'",
        );
        assert_eq!(sequences, 0, "a ledger insert keeps a sqlite_sequence row");
        let ids: Vec<i64> = conn
            .prepare("SELECT id FROM turn_usage ORDER BY created_at")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(ids, [1, 2, 3]);
    }

    /// An older DB's ledger made with `AUTOINCREMENT` is left as it is and takes rows as before.
    #[test]
    fn an_older_autoincrement_ledger_keeps_working() {
        let dir = tempfile::tempdir().unwrap();
        let db = older_db(
            &dir,
            "CREATE TABLE turn_usage (id INTEGER PRIMARY KEY AUTOINCREMENT,
               created_at TEXT NOT NULL, provider TEXT NOT NULL, model TEXT,
               input_tokens INTEGER, output_tokens INTEGER, cache_read_tokens INTEGER,
               cache_write_tokens INTEGER, reasoning_tokens INTEGER, cost_usd REAL,
               requests INTEGER, duration_ms INTEGER, outcome TEXT NOT NULL,
               message_ids TEXT NOT NULL, series_id TEXT);",
        );
        db.record_usage(&turn("claude", None), at("2026-11-21T10:00:00Z"))
            .unwrap();
        db.record_usage(&turn("claude", None), at("2026-11-21T10:01:00Z"))
            .unwrap();
        assert_eq!(db.usage_total().unwrap().turns, 2);
        let next: i64 = db
            .dedicated_connection()
            .unwrap()
            .query_row(
                "SELECT seq FROM sqlite_sequence WHERE name = 'turn_usage'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(next, 2);
    }

    #[test]
    fn an_old_db_without_the_ledger_gets_it_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let db = older_db(
            &dir,
            "CREATE TABLE messages_in (id TEXT PRIMARY KEY, kind TEXT NOT NULL,
               timestamp TEXT NOT NULL, content TEXT NOT NULL);
             INSERT INTO messages_in VALUES ('old', 'chat', '2026-01-01T00:00:00Z', '{}');",
        );
        assert_eq!(db.usage_total().unwrap().turns, 0);
        db.record_usage(&turn("claude", None), at("2026-11-21T10:00:00Z"))
            .unwrap();
        assert_eq!(db.usage_total().unwrap().turns, 1);
        assert!(db.message_in("old").unwrap().is_some());
    }
}
