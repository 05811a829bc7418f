//! Timestamps: written as RFC 3339 UTC with milliseconds and `Z`, read in that form, with any
//! offset (`+02:00`, and the ISO 8601 compact `+0200` and `+02`), or in SQLite's
//! `YYYY-MM-DD HH:MM:SS` (taken as UTC). SQL compares stored times through [`parse_ts`] too (the
//! `ts_millis()` function every connection registers, see `db::configure_connection`), so the
//! DB and Rust never disagree on what a stored time means.

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

/// Parses any timestamp form the DB may hold: RFC 3339 with `Z` or an offset, the same with an
/// ISO 8601 compact offset (`+0200`, `+02`), SQLite's `YYYY-MM-DD HH:MM:SS[.fff]`, or the same
/// with a `T`; naive forms are UTC.
pub fn parse_ts(value: &str) -> Result<DateTime<Utc>, Error> {
    let trimmed = value.trim();
    if let Ok(parsed) = DateTime::parse_from_rfc3339(trimmed) {
        return Ok(parsed.with_timezone(&Utc));
    }
    // RFC 3339 requires `+HH:MM`; ISO 8601 also allows `+HHMM` and `+HH`, which hosts do write.
    // `%#z` takes all three.
    for format in [
        "%Y-%m-%dT%H:%M:%S%.f%#z",
        "%Y-%m-%d %H:%M:%S%.f%#z",
        "%Y-%m-%dT%H:%M%#z",
        "%Y-%m-%d %H:%M%#z",
    ] {
        if let Ok(parsed) = DateTime::parse_from_str(trimmed, format) {
            return Ok(parsed.with_timezone(&Utc));
        }
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
    fn reads_compact_offsets() {
        let expected = parse_ts("2027-06-01T07:00:00Z").unwrap();
        for text in [
            "2027-06-01T09:00:00+0200",
            "2027-06-01T09:00:00+02",
            "2027-06-01T09:00:00.000+0200",
            "2027-06-01 09:00:00+0200",
            "2027-06-01T09:00+02",
            "2027-06-01T02:00:00-0500",
            "2027-06-01T02:00:00-05",
        ] {
            assert_eq!(parse_ts(text).unwrap(), expected, "{text}");
        }
        assert_eq!(
            parse_ts("2027-06-01T09:30:00+0230").unwrap(),
            expected,
            "minutes of a compact offset count"
        );
    }

    #[test]
    fn rejects_garbage() {
        let err = parse_ts("next tuesday").unwrap_err();
        assert!(err.to_string().contains("next tuesday"), "{err}");
    }
}
