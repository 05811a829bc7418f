//! Timestamps: written as RFC 3339 UTC with milliseconds and `Z`, read in that form, with any
//! offset, or in SQLite's `YYYY-MM-DD HH:MM:SS` (taken as UTC).

use chrono::{DateTime, NaiveDateTime, SecondsFormat, Utc};

use crate::Error;

/// Formats an instant the way every writer of the session DB stores it:
/// `2026-11-21T10:00:00.000Z`.
pub fn format_ts(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The current instant, formatted for the DB.
pub fn now_ts() -> String {
    format_ts(Utc::now())
}

/// Parses any timestamp form the DB may hold: RFC 3339 with `Z` or an offset, SQLite's
/// `YYYY-MM-DD HH:MM:SS[.fff]`, or the same with a `T`; naive forms are UTC.
pub fn parse_ts(value: &str) -> Result<DateTime<Utc>, Error> {
    let trimmed = value.trim();
    if let Ok(parsed) = DateTime::parse_from_rfc3339(trimmed) {
        return Ok(parsed.with_timezone(&Utc));
    }
    for format in [
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%dT%H:%M",
    ] {
        if let Ok(naive) = NaiveDateTime::parse_from_str(trimmed, format) {
            return Ok(naive.and_utc());
        }
    }
    Err(Error::BadTimestamp {
        value: value.to_owned(),
        reason: "expected RFC 3339 (2026-11-21T10:00:00.000Z) or YYYY-MM-DD HH:MM:SS".into(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn writes_millis_and_z() {
        let at = parse_ts("2026-11-21T10:00:00Z").unwrap();
        assert_eq!(format_ts(at), "2026-11-21T10:00:00.000Z");
    }

    #[test]
    fn reads_sqlite_form_as_utc_and_offsets() {
        let sqlite = parse_ts("2026-11-21 10:00:00").unwrap();
        let offset = parse_ts("2026-11-21T11:00:00+01:00").unwrap();
        assert_eq!(sqlite, offset);
        assert_eq!(
            format_ts(parse_ts("2026-11-21 10:00:00.25").unwrap()),
            "2026-11-21T10:00:00.250Z"
        );
    }

    #[test]
    fn rejects_garbage() {
        let err = parse_ts("next tuesday").unwrap_err();
        assert!(err.to_string().contains("next tuesday"), "{err}");
    }
}
