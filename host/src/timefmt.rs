//! Times the host CLI reads and prints: absolute or relative (`+10m`) instants, and short
//! human durations (`9m 58s`).

use anyhow::{bail, Context, Result};
use chrono::{DateTime, Duration, NaiveDate, TimeZone, Utc};
use chrono_tz::Tz;

/// Parses an instant given on the command line: `now`, a relative `+30s` / `+10m` / `+2h` /
/// `+1d` / `+1w` (units may be combined: `+1h30m`), or any absolute form the session DB accepts
/// (RFC 3339 with `Z` or an offset; `YYYY-MM-DD HH:MM[:SS]`, taken as UTC).
pub fn parse_when(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>> {
    let trimmed = text.trim();
    if trimmed.eq_ignore_ascii_case("now") {
        return Ok(now);
    }
    if let Some(relative) = trimmed.strip_prefix('+') {
        let offset = parse_relative(relative).with_context(|| {
            format!("bad relative time {text:?}: expected e.g. +30s, +10m, +2h, +1d or +1h30m")
        })?;
        return now
            .checked_add_signed(offset)
            .with_context(|| format!("relative time {text:?} is out of range"));
    }
    schema::time::parse_ts(trimmed).map_err(|_| {
        anyhow::anyhow!(
            "bad time {text:?}: expected RFC 3339 (2026-11-21T10:00:00Z or with an offset), \
             YYYY-MM-DD HH:MM:SS (UTC), `now`, or a relative +30s / +10m / +2h / +1d"
        )
    })
}

/// Parses the start of a period given on the command line (`--since`): a duration back from
/// `now` (`7d`, `12h`, `1d12h`, `2w`), `today` (the local midnight in `tz`), a date
/// `YYYY-MM-DD` (its local midnight in `tz`), or any instant [`parse_when`] reads.
pub fn parse_since(text: &str, now: DateTime<Utc>, tz: Tz) -> Result<DateTime<Utc>> {
    let trimmed = text.trim();
    if trimmed.eq_ignore_ascii_case("today") {
        return Ok(schema::day_window(now, tz).0);
    }
    if let Ok(date) = NaiveDate::parse_from_str(trimmed, "%Y-%m-%d") {
        let noon = date.and_hms_opt(12, 0, 0).unwrap_or_default();
        let noon = tz
            .from_local_datetime(&noon)
            .earliest()
            .map_or_else(|| noon.and_utc(), |at| at.with_timezone(&Utc));
        return Ok(schema::day_window(noon, tz).0);
    }
    if trimmed.starts_with(|c: char| c.is_ascii_digit()) && trimmed.ends_with(char::is_alphabetic) {
        if let Ok(back) = parse_relative(trimmed) {
            return now
                .checked_sub_signed(back)
                .with_context(|| format!("--since {text:?} is out of range"));
        }
    }
    parse_when(trimmed, now).map_err(|_| {
        anyhow::anyhow!(
            "bad --since {text:?}: expected a duration back from now (7d, 12h, 1d12h, 2w), \
             `today`, a date YYYY-MM-DD (midnight in TZ), or a time (RFC 3339, \
             YYYY-MM-DD HH:MM:SS UTC)"
        )
    })
}

fn parse_relative(text: &str) -> Result<Duration> {
    if text.is_empty() {
        bail!("no amount after `+`");
    }
    let mut total = Duration::zero();
    let mut digits = String::new();
    for ch in text.chars() {
        if ch.is_ascii_digit() {
            digits.push(ch);
            continue;
        }
        if digits.is_empty() {
            bail!("expected a number before {ch:?}");
        }
        let amount: i64 = digits.parse().context("number too large")?;
        digits.clear();
        let unit_secs: i64 = match ch {
            's' => 1,
            'm' => 60,
            'h' => 3_600,
            'd' => 86_400,
            'w' => 604_800,
            other => bail!("unknown unit {other:?} (use s, m, h, d or w)"),
        };
        let secs = amount
            .checked_mul(unit_secs)
            .context("relative time too large")?;
        let part = Duration::try_seconds(secs).context("relative time too large")?;
        total = total
            .checked_add(&part)
            .context("relative time too large")?;
    }
    if !digits.is_empty() {
        bail!("missing unit after {digits} (use s, m, h, d or w)");
    }
    Ok(total)
}

/// A short duration: the two largest non-trivial units, e.g. `45s`, `9m 58s`, `2h 5m`,
/// `3d 4h`. Negative inputs are shown as their absolute value.
pub fn format_duration(seconds: i64) -> String {
    let secs = seconds.unsigned_abs();
    let (days, hours, minutes, secs) = (
        secs / 86_400,
        (secs % 86_400) / 3_600,
        (secs % 3_600) / 60,
        secs % 60,
    );
    if days > 0 {
        format!("{days}d {hours}h")
    } else if hours > 0 {
        format!("{hours}h {minutes}m")
    } else if minutes > 0 {
        format!("{minutes}m {secs}s")
    } else {
        format!("{secs}s")
    }
}

/// `at` relative to `now`: `now` when due (at or before `now`), else `in 9m 58s`.
pub fn until(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let secs = (at - now).num_seconds();
    if at <= now || secs == 0 {
        "now".to_owned()
    } else {
        format!("in {}", format_duration(secs))
    }
}

/// `at` relative to `now` for past instants: `12s ago` (`in 5s` if it lies in the future).
pub fn ago(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let secs = (now - at).num_seconds();
    if secs >= 0 {
        format!("{} ago", format_duration(secs))
    } else {
        format!("in {}", format_duration(secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use schema::time::{format_ts, parse_ts};

    fn now() -> DateTime<Utc> {
        parse_ts("2026-11-21T10:00:00Z").unwrap()
    }

    #[test]
    fn relative_and_absolute() {
        let at = |text| format_ts(parse_when(text, now()).unwrap());
        assert_eq!(at("+30s"), "2026-11-21T10:00:30.000Z");
        assert_eq!(at("+10m"), "2026-11-21T10:10:00.000Z");
        assert_eq!(at("+1h30m"), "2026-11-21T11:30:00.000Z");
        assert_eq!(at("+1d"), "2026-11-22T10:00:00.000Z");
        assert_eq!(at("now"), "2026-11-21T10:00:00.000Z");
        assert_eq!(at("2026-11-21T12:00:00+01:00"), "2026-11-21T11:00:00.000Z");
        assert_eq!(at("2026-11-21 09:00"), "2026-11-21T09:00:00.000Z");
    }

    #[test]
    fn rejects_bad_times() {
        for bad in ["+", "+10", "+m", "+10x", "tomorrow", "+99999999999999999w"] {
            let err = parse_when(bad, now()).unwrap_err();
            assert!(format!("{err:#}").contains(bad), "{bad}: {err:#}");
        }
    }

    #[test]
    fn since_a_duration_a_date_or_today() {
        let ny: Tz = "America/New_York".parse().unwrap();
        let since = |text| format_ts(parse_since(text, now(), ny).unwrap());
        assert_eq!(since("7d"), "2026-11-14T10:00:00.000Z");
        assert_eq!(since("1d12h"), "2026-11-19T22:00:00.000Z");
        assert_eq!(since("today"), "2026-11-21T05:00:00.000Z");
        assert_eq!(
            since("2026-11-01"),
            "2026-11-01T04:00:00.000Z",
            "summer time"
        );
        assert_eq!(since("2026-11-21T08:00:00Z"), "2026-11-21T08:00:00.000Z");
        for bad in ["7", "7x", "yesterday", "2026-13-01"] {
            let err = parse_since(bad, now(), ny).unwrap_err();
            assert!(format!("{err:#}").contains(bad), "{bad}: {err:#}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(format_duration(0), "0s");
        assert_eq!(format_duration(598), "9m 58s");
        assert_eq!(format_duration(7_500), "2h 5m");
        assert_eq!(format_duration(3 * 86_400 + 4 * 3_600 + 5), "3d 4h");
        let later = now() + Duration::seconds(598);
        assert_eq!(until(later, now()), "in 9m 58s");
        assert_eq!(until(now() - Duration::seconds(5), now()), "now");
        assert_eq!(ago(now() - Duration::seconds(12), now()), "12s ago");
    }
}
