//! Times the model gives and reads: ISO 8601 with an offset, or naive local time in `TZ`
//! (resolved with the zone's DST rules); shown back as `Mon, Nov 23, 2026, 9:00 AM`.

use chrono::{DateTime, LocalResult, NaiveDate, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;

use crate::error::{ToolError, ToolResult};

/// Naive forms accepted, most specific first.
const NAIVE_FORMATS: [&str; 4] = [
    "%Y-%m-%dT%H:%M:%S%.f",
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%dT%H:%M",
    "%Y-%m-%d %H:%M",
];

/// Parses `text` (named `field` in errors) as an instant: RFC 3339 with `Z` or an offset, or a
/// naive local date-time read in `tz`. In the autumn fold the earlier instant is taken; a time
/// in the spring-forward gap does not exist and is refused.
pub fn parse_when(field: &str, text: &str, tz: Tz) -> ToolResult<DateTime<Utc>> {
    let trimmed = text.trim();
    if let Ok(at) = DateTime::parse_from_rfc3339(trimmed) {
        return Ok(at.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%dT%H:%M:%S%.f%z", "%Y-%m-%d %H:%M:%S%.f%z"] {
        if let Ok(at) = DateTime::parse_from_str(trimmed, format) {
            return Ok(at.with_timezone(&Utc));
        }
    }
    let naive = NAIVE_FORMATS
        .iter()
        .find_map(|format| NaiveDateTime::parse_from_str(trimmed, format).ok());
    let Some(naive) = naive else {
        let hint = if NaiveDate::parse_from_str(trimmed, "%Y-%m-%d").is_ok() {
            " (add a time of day, e.g. T09:00)"
        } else {
            ""
        };
        return Err(ToolError::invalid(format!(
            "{field} {text:?} is not a date-time{hint}: use ISO 8601 local time like \
             2026-11-23T09:00 (read in {tz}) or with an offset like 2026-11-23T14:00:00Z"
        )));
    };
    match tz.from_local_datetime(&naive) {
        LocalResult::Single(at) => Ok(at.with_timezone(&Utc)),
        LocalResult::Ambiguous(earlier, _later) => Ok(earlier.with_timezone(&Utc)),
        LocalResult::None => Err(ToolError::invalid(format!(
            "{field} {text:?} does not exist in {tz}: the clocks skip that hour for daylight \
             saving time; pick a time outside the gap or give an offset"
        ))),
    }
}

/// `Mon, Nov 23, 2026, 9:00 AM` in `tz`.
pub fn format_local(at: DateTime<Utc>, tz: Tz) -> String {
    at.with_timezone(&tz)
        .format("%a, %b %-d, %Y, %-I:%M %p")
        .to_string()
}

/// [`format_local`] followed by the zone name: `Mon, Nov 23, 2026, 9:00 AM (America/New_York)`.
pub fn format_local_zoned(at: DateTime<Utc>, tz: Tz) -> String {
    format!("{} ({})", format_local(at, tz), tz.name())
}

#[cfg(test)]
mod tests {

    use super::*;
    use schema::time::{format_ts, parse_ts};

    const NY: Tz = chrono_tz::America::New_York;

    fn at(text: &str) -> String {
        format_ts(parse_when("processAfter", text, NY).unwrap())
    }

    #[test]
    fn offsets_and_naive_local_times() {
        assert_eq!(at("2026-11-23T14:00:00Z"), "2026-11-23T14:00:00.000Z");
        assert_eq!(at("2026-11-23T15:00:00+01:00"), "2026-11-23T14:00:00.000Z");
        assert_eq!(at("2026-11-23T09:00"), "2026-11-23T14:00:00.000Z");
        assert_eq!(at("2026-07-01 09:00:00"), "2026-07-01T13:00:00.000Z");
    }

    #[test]
    fn dst_gap_is_refused_and_fold_takes_the_first() {
        let err = parse_when("processAfter", "2026-03-08T02:30", NY)
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not exist in America/New_York"), "{err}");
        // 1:30 happens twice on Nov 1 2026: first at EDT (-4).
        assert_eq!(at("2026-11-01T01:30"), "2026-11-01T05:30:00.000Z");
    }

    #[test]
    fn garbage_is_explained() {
        let err = parse_when("processAfter", "next tuesday", NY)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"next tuesday\" is not a date-time"), "{err}");
        let err = parse_when("processAfter", "2026-11-23", NY)
            .unwrap_err()
            .to_string();
        assert!(err.contains("add a time of day"), "{err}");
    }

    #[test]
    fn formats_local_time() {
        let at = parse_ts("2026-11-23T14:00:00Z").unwrap();
        assert_eq!(
            format_local_zoned(at, NY),
            "Mon, Nov 23, 2026, 9:00 AM (America/New_York)"
        );
    }
}
