//! Times for people: what delayctl reads from its flags and what it prints in tables.
//!
//! The API speaks unix milliseconds and plain numbers of seconds or milliseconds. On input,
//! every time flag still takes the plain number it always took, in the unit its name says
//! (`--delay 90` is 90 s, `--delay-ms 90` is 90 ms), and now also a duration with units
//! (`90s`, `5m`, `1h30m`, `250ms`, `2d`) or, for a point in time, an RFC 3339 date. On
//! output, the human form shows a point in time as RFC 3339 UTC with how far it is from now
//! (`2026-01-01T03:00:00Z (in 4m12s)`) and a duration with units (`1h2m`); `--json` is the
//! server's answer, untouched.

use chrono::{DateTime, SecondsFormat, Utc};

/// Milliseconds in each unit a duration may be written in, longest first.
const UNITS: [(&str, u64); 5] =
    [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)];

/// The unit a plain number means for a given flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Seconds, as lmstfy's `delay`, `ttl`, `ttr` and `timeout` are.
    Seconds,
    /// Milliseconds, as delayd's `_ms` extensions are.
    Millis,
}

/// Reads a duration as milliseconds: a plain number in `plain`'s unit, or numbers each with
/// a unit (`d`, `h`, `m`, `s`, `ms`) written longest first, e.g. `1h30m` or `2s500ms`.
pub fn parse_duration_ms(text: &str, plain: Unit) -> Result<u64, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("expected a duration such as 90, 90s, 5m or 1h30m".to_string());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        let n: u64 = s.parse().map_err(|_| format!("{s:?} is too large"))?;
        let factor = match plain {
            Unit::Seconds => 1_000,
            Unit::Millis => 1,
        };
        return n.checked_mul(factor).ok_or_else(|| format!("{s:?} is too large"));
    }
    let mut rest = s;
    let mut total: u64 = 0;
    // Units must come longest first and each at most once: `5m1h` is more likely a typo
    // than a way to say 1h5m.
    let mut smallest_so_far = u64::MAX;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("invalid duration {s:?}: expected a number at {rest:?}"));
        }
        let (number, tail) = rest.split_at(digits);
        let letters = tail.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, tail) = tail.split_at(letters);
        let Some(&(_, factor)) = UNITS.iter().find(|(name, _)| *name == unit) else {
            let why = if unit.is_empty() { "a unit is missing" } else { "unknown unit" };
            return Err(format!(
                "invalid duration {s:?}: {why} after {number} (use d, h, m, s or ms)"
            ));
        };
        if factor >= smallest_so_far {
            return Err(format!("invalid duration {s:?}: write units longest first, once each"));
        }
        smallest_so_far = factor;
        let n: u64 = number.parse().map_err(|_| format!("{s:?} is too large"))?;
        total = n
            .checked_mul(factor)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(|| format!("{s:?} is too large"))?;
        rest = tail;
    }
    Ok(total)
}

/// Reads a duration that the API takes in whole seconds: a plain number of seconds, or a
/// duration with units that is a whole number of seconds.
pub fn parse_whole_seconds(text: &str) -> Result<u64, String> {
    let ms = parse_duration_ms(text, Unit::Seconds)?;
    if ms % 1_000 != 0 {
        return Err(format!("{:?} is not a whole number of seconds", text.trim()));
    }
    Ok(ms / 1_000)
}

/// Reads a point in time as unix milliseconds: a plain number of unix milliseconds, or an
/// RFC 3339 date such as `2026-01-01T09:00:00Z` or `2026-01-01T10:00:00+01:00`.
pub fn parse_instant_ms(text: &str) -> Result<u64, String> {
    let s = text.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().map_err(|_| format!("{s:?} is too large"));
    }
    let at = DateTime::parse_from_rfc3339(s)
        .map_err(|e| format!("invalid time {s:?}: expected unix milliseconds or RFC 3339 ({e})"))?;
    u64::try_from(at.timestamp_millis()).map_err(|_| format!("{s:?} is before 1970"))
}

/// A duration with units, the two largest that are not zero: `1h2m`, `4m12s`, `3s`, `250ms`,
/// `2d3h`; `0s` for nothing.
pub fn duration(ms: u64) -> String {
    if ms == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    let mut rest = ms;
    let mut shown = 0;
    for (name, factor) in UNITS {
        let n = rest / factor;
        rest %= factor;
        if n > 0 {
            out.push_str(&format!("{n}{name}"));
            shown += 1;
        }
        // Two units, or one and the next is zero: `1h` rather than `1h0m`.
        if shown == 2 || (shown == 1 && n == 0) {
            break;
        }
    }
    out
}

/// How far `at_ms` is from `now_ms` in whole seconds: `in 4m12s`, `3s ago`, or `now`
/// within a second.
pub fn relative(at_ms: i64, now_ms: i64) -> String {
    let diff = at_ms.saturating_sub(now_ms);
    let abs = diff.unsigned_abs();
    let span = duration(abs - abs % 1_000);
    if abs < 1_000 {
        "now".to_string()
    } else if diff > 0 {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

/// A point in time as RFC 3339 UTC (with milliseconds when it has some), then how far it is
/// from `now_ms`: `2026-01-01T03:00:00Z (in 4m12s)`.
pub fn instant(at_ms: i64, now_ms: i64) -> String {
    match DateTime::<Utc>::from_timestamp_millis(at_ms) {
        Some(at) => format!(
            "{} ({})",
            at.to_rfc3339_opts(SecondsFormat::AutoSi, true),
            relative(at_ms, now_ms)
        ),
        None => format!("{at_ms} ms"),
    }
}

/// Now, in unix milliseconds, by this machine's clock.
pub fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_with_or_without_units() {
        let secs = |s: &str| parse_duration_ms(s, Unit::Seconds);
        assert_eq!(secs("90"), Ok(90_000));
        assert_eq!(secs("90s"), Ok(90_000));
        assert_eq!(secs("5m"), Ok(300_000));
        assert_eq!(secs("1h30m"), Ok(5_400_000));
        assert_eq!(secs("2d"), Ok(172_800_000));
        assert_eq!(secs("1s500ms"), Ok(1_500));
        assert_eq!(secs(" 0 "), Ok(0));
        assert_eq!(parse_duration_ms("250", Unit::Millis), Ok(250));
        assert_eq!(parse_duration_ms("2s", Unit::Millis), Ok(2_000));
        for bad in ["", "5x", "m", "1.5s", "-3", "5m1h", "1m1m", "3 s", "5 m"] {
            assert!(secs(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(secs("99999999999999999999").is_err());
        assert!(secs("18446744073709551615").is_err(), "overflows in ms");
        let e = secs("5y").err().unwrap_or_default();
        assert!(e.contains("unknown unit") && e.contains("d, h, m, s or ms"), "{e}");
    }

    #[test]
    fn whole_seconds_refuse_fractions() {
        assert_eq!(parse_whole_seconds("60"), Ok(60));
        assert_eq!(parse_whole_seconds("1h"), Ok(3_600));
        assert_eq!(parse_whole_seconds("2000ms"), Ok(2));
        let e = parse_whole_seconds("1500ms").err().unwrap_or_default();
        assert!(e.contains("not a whole number of seconds"), "{e}");
    }

    #[test]
    fn instants_read_as_millis_or_rfc3339() {
        assert_eq!(parse_instant_ms("1767225600000"), Ok(1_767_225_600_000));
        assert_eq!(parse_instant_ms("2026-01-01T00:00:00Z"), Ok(1_767_225_600_000));
        assert_eq!(parse_instant_ms("2026-01-01T01:00:00.250+01:00"), Ok(1_767_225_600_250));
        assert!(parse_instant_ms("1969-12-31T23:59:59Z").is_err());
        let e = parse_instant_ms("tomorrow").err().unwrap_or_default();
        assert!(e.contains("unix milliseconds or RFC 3339"), "{e}");
    }

    #[test]
    fn durations_print_two_units() {
        assert_eq!(duration(0), "0s");
        assert_eq!(duration(250), "250ms");
        assert_eq!(duration(3_000), "3s");
        assert_eq!(duration(3_250), "3s250ms");
        assert_eq!(duration(252_000), "4m12s");
        assert_eq!(duration(3_720_000), "1h2m");
        assert_eq!(duration(3_600_005), "1h");
        assert_eq!(duration(86_400_000), "1d");
        assert_eq!(duration(2 * 86_400_000 + 3 * 3_600_000 + 59_000), "2d3h");
    }

    #[test]
    fn instants_print_as_utc_and_relative() {
        let at = 1_767_225_600_000;
        assert_eq!(instant(at, at - 252_000), "2026-01-01T00:00:00Z (in 4m12s)");
        assert_eq!(instant(at + 3_000, at + 6_000), "2026-01-01T00:00:03Z (3s ago)");
        assert_eq!(instant(at + 5, at), "2026-01-01T00:00:00.005Z (now)");
        assert_eq!(relative(at, at + 999), "now");
        assert_eq!(relative(at, at + 1_000), "1s ago");
        assert_eq!(relative(at + 3_720, at), "in 3s");
    }
}
