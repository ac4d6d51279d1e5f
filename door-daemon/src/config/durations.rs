//! Durations (`"30s"`, `"1500ms"`): their syntax and the range every duration setting takes.

use std::time::Duration;

use super::{ConfigError, invalid};

/// The shortest duration a setting takes: 1 ms. Every duration is a timeout or an interval, and
/// a shorter one would fire before a request could arrive (or spin a sync loop).
pub const MIN_DURATION: Duration = Duration::from_millis(1);

/// The longest duration a setting takes: 365 days. door computes deadlines as now plus the
/// setting, which overflows the clock (a panic on the request path) past a few hundred years;
/// no timeout or interval of door is meant to be longer than a year.
pub const MAX_DURATION: Duration = Duration::from_hours(365 * 24);

/// Parses a duration such as `"30s"`, `"1500ms"` or `"2m"` (humantime syntax), from
/// [`MIN_DURATION`] to [`MAX_DURATION`]; zero is refused, and so is the unit `M`, which that
/// syntax reads as a month where an operator likely meant a minute (`month` is accepted).
pub(super) fn parse_duration(key: &str, s: &str) -> Result<Duration, ConfigError> {
    if s.split(|c: char| !c.is_ascii_alphabetic())
        .any(|unit| unit == "M")
    {
        return Err(invalid(
            key,
            format!("{s:?}"),
            "\"M\" is a month in this syntax: write \"m\" or \"min\" for minutes, \"month\" \
             for months",
        ));
    }
    let d = humantime::parse_duration(s).map_err(|e| {
        invalid(
            key,
            format!("{s:?}"),
            format!("not a duration like \"30s\" ({e})"),
        )
    })?;
    if d.is_zero() {
        return Err(invalid(key, format!("{s:?}"), "must be longer than zero"));
    }
    if d < MIN_DURATION {
        return Err(invalid(key, format!("{s:?}"), "must be at least 1ms"));
    }
    if d > MAX_DURATION {
        return Err(invalid(key, format!("{s:?}"), "must be at most 365 days"));
    }
    Ok(d)
}
