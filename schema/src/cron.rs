//! Cron schedules: standard 5-field expressions evaluated in a time zone with `croner`.
//!
//! `croner`, not `cron`: `cron` requires a seconds field, numbers weekdays Quartz-style
//! (1 = Sunday, so `0 9 * * 1-5` with "0 " prepended fires Sunday to Thursday), skips the
//! spring-forward hour and fires twice in the autumn fold. `croner` is POSIX (0 and 7 = Sunday)
//! and handles both DST cases.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds};
use croner::Cron;

use crate::Error;

/// A validated 5-field cron expression.
#[derive(Debug, Clone)]
pub struct Schedule {
    expr: String,
    cron: Cron,
}

impl Schedule {
    /// Parses and validates `expr` (exactly 5 fields, or a nickname like `@daily`).
    pub fn parse(expr: &str) -> Result<Self, Error> {
        let trimmed = expr.trim();
        let bad = |reason: String| Error::BadCron {
            expr: expr.to_owned(),
            reason,
        };
        if !trimmed.starts_with('@') && trimmed.split_whitespace().count() != 5 {
            return Err(bad(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week), found {}",
                trimmed.split_whitespace().count()
            )));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .build()
            .parse(trimmed)
            .map_err(|err| bad(err.to_string()))?;
        Ok(Self {
            expr: trimmed.to_owned(),
            cron,
        })
    }

    /// The expression as given (trimmed).
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The first occurrence strictly after `after`, evaluated in `tz`, as UTC.
    pub fn next_after(&self, after: DateTime<Utc>, tz: Tz) -> Result<DateTime<Utc>, Error> {
        let local = after.with_timezone(&tz);
        self.cron
            .find_next_occurrence(&local, false)
            .map(|next| next.with_timezone(&Utc))
            .map_err(|err| Error::BadCron {
                expr: self.expr.clone(),
                reason: err.to_string(),
            })
    }
}

/// Parses a time zone name such as `America/New_York`.
pub fn parse_tz(name: &str) -> Result<Tz, Error> {
    name.trim()
        .parse::<Tz>()
        .map_err(|_| Error::BadTimeZone(name.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{format_ts, parse_ts};
    use chrono::{Datelike, Timelike, Weekday};

    #[test]
    fn weekdays_are_posix_and_dst_correct() {
        let tz = parse_tz("America/New_York").unwrap();
        let schedule = Schedule::parse("0 9 * * 1-5").unwrap();
        // Walk across the spring-forward (Mar 8 2026) and fall-back (Nov 1 2026) changes.
        let mut at = parse_ts("2026-03-01T00:00:00Z").unwrap();
        let mut seen = 0;
        while at < parse_ts("2026-11-15T00:00:00Z").unwrap() {
            at = schedule.next_after(at, tz).unwrap();
            let local = at.with_timezone(&tz);
            assert!(
                !matches!(local.weekday(), Weekday::Sat | Weekday::Sun),
                "{}",
                format_ts(at)
            );
            assert_eq!((local.hour(), local.minute()), (9, 0), "{}", format_ts(at));
            seen += 1;
        }
        assert!(seen > 150);
    }

    #[test]
    fn rejects_six_fields_and_garbage() {
        assert!(Schedule::parse("0 0 9 * * 1")
            .unwrap_err()
            .to_string()
            .contains("5 fields"));
        assert!(Schedule::parse("61 * * * *").is_err());
        assert!(Schedule::parse("every day").is_err());
        assert!(parse_tz("Mars/Base").is_err());
    }
}
