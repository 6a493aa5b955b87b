//! PostgreSQL's date and time functions in ad-hoc queries, where DataFusion's differ:
//!
//! - `extract(second | milliseconds | epoch FROM x)` is a `numeric` with the fraction of
//!   a second (`15.123456`, `15123.456`, `1792829700.000000`); DataFusion's `date_part`
//!   drops the fraction of a second. `date_part` of those fields is the same value as
//!   `double precision`. The other fields are DataFusion's.
//! - `to_char(timestamp | date, pattern)` reads PostgreSQL's patterns (`YYYY-MM-DD
//!   HH24:MI:SS`, `Dy DD Mon`, `FM`, `"text"`); DataFusion's reads strftime's and
//!   returns a PostgreSQL pattern unchanged.
//! - `date_trunc` takes the plural units too (`'milliseconds'`).
//! - `x AT TIME ZONE z` (`pg_at_time_zone`): a timestamp without a time zone read as
//!   local time in `z` is a timestamp with one; a timestamp with one is the local time
//!   in `z`, without a zone. DataFusion's keeps the instant and only relabels it.
//! - Timestamp and date text is read as PostgreSQL reads it (`TimeLiterals`), in a
//!   literal, a cast or a comparison with a column: without seconds (`'2026-11-01
//!   06:00'`), with `T`, a date alone; more than six fractional digits round to the
//!   microsecond. A field out of range fails with 22008. DataFusion's parser needs the
//!   seconds and truncates.
//!
//! The rewrite (`rewrite.rs`) calls these functions in place of DataFusion's, from the
//! field or the unit a query names.

use chrono::{DateTime, Datelike, NaiveDateTime, Timelike};
use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Cast, Expr, LogicalPlan, ScalarUDF};
use datafusion::optimizer::AnalyzerRule;
use eddy_planner::types::parse_timestamp;
use eddy_planner::ErrorKind;

use super::arith::{external, rewrite_expressions};

/// Casts of text literals to timestamps and dates, read as PostgreSQL reads the text.
/// Runs after DataFusion's type coercion, which adds the casts of comparisons.
#[derive(Debug, Default)]
pub(super) struct TimeLiterals;

impl AnalyzerRule for TimeLiterals {
    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        rewrite_expressions(plan, &|e, _| {
            let Expr::Cast(Cast { expr, field }) = &e else {
                return Ok(Transformed::no(e));
            };
            let Expr::Literal(ScalarValue::Utf8(Some(text)), _) = expr.as_ref() else {
                return Ok(Transformed::no(e));
            };
            let to = field.data_type();
            if !matches!(to, DataType::Timestamp(..) | DataType::Date32) {
                return Ok(Transformed::no(e));
            }
            // Text of another form ('epoch', 'now') stays DataFusion's to read.
            if !dated(text) {
                return Ok(Transformed::no(e));
            }
            // A time zone named after the time ('… 01:30:00 UTC', '… Europe/Paris').
            let (text, named) = match zone_named(text)? {
                Some((local, zone)) => (local, Some(zone)),
                None => (text.as_str(), None),
            };
            // A timestamp without a time zone ignores an offset or a zone in its text,
            // as PostgreSQL's does: '… 01:30:00+02' is 01:30.
            let read = match to {
                DataType::Timestamp(_, None) | DataType::Date32 => without_offset(text),
                _ => text,
            };
            let Some(mut us) = parse_timestamp(read) else {
                return Err(external(
                    ErrorKind::DatetimeOutOfRange,
                    &format!("date/time field value out of range: \"{text}\""),
                ));
            };
            // Text without an offset, cast to a timestamp with a time zone, is the
            // local time there (the session's), as in PostgreSQL.
            if let DataType::Timestamp(_, Some(zone)) = to {
                if !has_offset(text) {
                    us = match in_zone(us, named.unwrap_or(zone)) {
                        Some(utc) => utc,
                        None => return Ok(Transformed::no(e)),
                    };
                }
            }
            // Arrow's cast takes the microseconds to the target's unit, or its date.
            let zone = match to {
                DataType::Timestamp(_, zone) => zone.clone(),
                _ => None,
            };
            let Ok(value) = ScalarValue::TimestampMicrosecond(Some(us), zone).cast_to(to) else {
                return Ok(Transformed::no(e));
            };
            Ok(Transformed::yes(Expr::Literal(value, None)))
        })
    }

    fn name(&self) -> &str {
        "eddy_time_literals"
    }
}

/// Timestamp text in the form DataFusion reads (`2026-11-01 06:00:00`), for a
/// `TIMESTAMP '…'` literal where the analyzer rule does not reach: the arguments of a
/// table function, planned before it runs; an offset in the text is ignored, as a
/// timestamp without a time zone ignores it. None: text it leaves as it is (of another
/// form, or not a timestamp).
pub(super) fn timestamp_text(text: &str) -> Option<String> {
    if !dated(text) {
        return None;
    }
    parse_timestamp(without_offset(text)).map(eddy_planner::types::format_timestamp)
}

/// Timestamp text that ends with a time zone's name (`… 01:30:00 UTC`,
/// `… 12:00 America/New_York`), as its local time and the zone; a region's name that
/// names no zone (`… Mars/Base`) fails with 22023, as in PostgreSQL.
fn zone_named(text: &str) -> Result<Option<(&str, &str)>> {
    let Some((local, zone)) = text.trim_end().rsplit_once(' ') else {
        return Ok(None);
    };
    if !zone.starts_with(|c: char| c.is_ascii_alphabetic()) || zone.eq_ignore_ascii_case("z") {
        return Ok(None);
    }
    match zone.parse::<datafusion::arrow::array::timezone::Tz>() {
        Ok(_) => Ok(Some((local.trim_end(), zone))),
        Err(_) if zone.contains('/') => Err(external(
            ErrorKind::InvalidParameter,
            &format!("time zone \"{}\" not recognized", zone.to_ascii_lowercase()),
        )),
        Err(_) => Ok(None),
    }
}

/// Whether timestamp text (`dated`) names its UTC offset (`Z`, `+01`, `-05:00`).
fn has_offset(text: &str) -> bool {
    text.trim_start()
        .get(10..)
        .is_some_and(|rest| rest.contains(['Z', 'z', '+', '-']))
}

/// Timestamp text (`dated`) without its UTC offset, if it names one.
fn without_offset(text: &str) -> &str {
    let text = text.trim_start();
    match text
        .get(10..)
        .and_then(|rest| rest.find(['Z', 'z', '+', '-']))
    {
        Some(i) => text[..10 + i].trim_end(),
        None => text,
    }
}

/// The instant of local time `local_us` (microseconds, read as if UTC) in `zone`, as
/// PostgreSQL reads one: an ambiguous local time (the hour repeated when clocks go
/// back) is the later instant, in standard time; a skipped one (clocks going forward)
/// is read with the offset before the change.
fn in_zone(local_us: i64, zone: &str) -> Option<i64> {
    use chrono::{Offset, TimeZone};
    let zone: datafusion::arrow::array::timezone::Tz = zone.parse().ok()?;
    let local = DateTime::from_timestamp_micros(local_us)?.naive_utc();
    let offset = match zone.offset_from_local_datetime(&local) {
        chrono::LocalResult::Single(o) | chrono::LocalResult::Ambiguous(_, o) => o,
        chrono::LocalResult::None => {
            zone.offset_from_utc_datetime(&(local - chrono::Duration::hours(3)))
        }
    };
    Some(local_us - offset.fix().local_minus_utc() as i64 * 1_000_000)
}

/// Whether `text` starts as a date does (`YYYY-MM-DD`): it is PostgreSQL's form, read
/// here, and one that does not read is out of range.
fn dated(text: &str) -> bool {
    let b = text.trim_start().as_bytes();
    b.len() >= 10
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'-'
        && b[8..10].iter().all(u8::is_ascii_digit)
}

/// A field of `extract` and `date_part` whose value has a fraction of a second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Part {
    Second,
    Milliseconds,
    Epoch,
    /// The calendar's larger units, which DataFusion does not compute.
    Decade,
    Century,
    Millennium,
    /// A timestamptz's UTC offset in the session's zone: seconds, hours, minutes.
    Timezone,
    TimezoneHour,
    TimezoneMinute,
}

impl Part {
    /// The part a field's name (any case, singular or plural) names, if it is one of
    /// those DataFusion computes differently.
    pub(super) fn named(name: &str) -> Option<Part> {
        match name.to_ascii_lowercase().as_str() {
            "second" | "seconds" => Some(Part::Second),
            "millisecond" | "milliseconds" => Some(Part::Milliseconds),
            "epoch" => Some(Part::Epoch),
            "decade" | "decades" => Some(Part::Decade),
            "century" | "centuries" => Some(Part::Century),
            "millennium" | "millennia" | "millenniums" => Some(Part::Millennium),
            "timezone" => Some(Part::Timezone),
            "timezone_hour" => Some(Part::TimezoneHour),
            "timezone_minute" => Some(Part::TimezoneMinute),
            _ => None,
        }
    }

    /// The function that computes the part as `numeric`.
    pub(super) fn function(self) -> &'static str {
        match self {
            Part::Second => "pg_extract_second",
            Part::Milliseconds => "pg_extract_milliseconds",
            Part::Epoch => "pg_extract_epoch",
            Part::Decade => "pg_extract_decade",
            Part::Century => "pg_extract_century",
            Part::Millennium => "pg_extract_millennium",
            Part::Timezone => "pg_extract_timezone",
            Part::TimezoneHour => "pg_extract_timezone_hour",
            Part::TimezoneMinute => "pg_extract_timezone_minute",
        }
    }

    /// Whether the part is of a time zone, which only a timestamptz has.
    fn of_zone(self) -> bool {
        matches!(
            self,
            Part::Timezone | Part::TimezoneHour | Part::TimezoneMinute
        )
    }

    /// `numeric`'s precision and scale for the part: microseconds, scaled.
    fn decimal(self) -> (u8, i8) {
        match self {
            Part::Second => (8, 6),
            Part::Milliseconds => (8, 3),
            Part::Epoch => (38, 6),
            Part::Decade | Part::Century | Part::Millennium => (20, 0),
            Part::Timezone | Part::TimezoneHour | Part::TimezoneMinute => (20, 0),
        }
    }

    /// The part of `v` in microseconds (the decimal's unscaled value), or None.
    fn micros(self, v: &ScalarValue) -> Option<i128> {
        const MINUTE: i128 = 60_000_000;
        if self.of_zone() {
            use chrono::{Offset, TimeZone};
            let (DataType::Timestamp(_, Some(zone)), Some(Time::At(us))) =
                (v.data_type(), time_of(v))
            else {
                return None;
            };
            let tz = crate::session::cells::time_zone(&zone)?;
            let at = DateTime::from_timestamp_micros(us)?.naive_utc();
            let seconds = tz.offset_from_utc_datetime(&at).fix().local_minus_utc() as i128;
            return Some(match self {
                Part::Timezone => seconds,
                Part::TimezoneHour => seconds / 3600,
                _ => seconds / 60 % 60,
            });
        }
        // PostgreSQL's: the first century is years 1 to 100, and year 0 is 1 BC.
        let units = |year: i128| match self {
            Part::Decade if year >= 0 => year / 10,
            Part::Decade => -((8 - (year - 1)) / 10),
            Part::Century if year > 0 => (year + 99) / 100,
            Part::Century => -((99 - (year - 1)) / 100),
            Part::Millennium if year > 0 => (year + 999) / 1000,
            _ => -((999 - (year - 1)) / 1000),
        };
        if matches!(self, Part::Decade | Part::Century | Part::Millennium) {
            return match time_of(v)? {
                Time::At(us) => {
                    use chrono::Datelike;
                    Some(units(DateTime::from_timestamp_micros(us)?.year() as i128))
                }
                // An interval's whole years, in the unit.
                Time::Span(months, ..) => Some(
                    months as i128
                        / 12
                        / match self {
                            Part::Decade => 10,
                            Part::Century => 100,
                            _ => 1000,
                        },
                ),
            };
        }
        match (self, time_of(v)?) {
            (Part::Epoch, Time::At(us)) => Some(us as i128),
            (_, Time::At(us)) => Some((us as i128).rem_euclid(MINUTE)),
            // An interval's epoch counts a year as 365.25 days and a month as 30, as
            // PostgreSQL's does.
            (Part::Epoch, Time::Span(months, days, us)) => {
                let (years, months) = (months as i128 / 12, months as i128 % 12);
                let days_us = (days as i128 + months * 30) * 86_400_000_000;
                Some(years * 31_557_600_000_000 + days_us + us as i128)
            }
            (_, Time::Span(_, _, us)) => Some(us as i128 % MINUTE),
        }
    }
}

/// A date or time value: an instant in microseconds since 1970 (a timestamp or a
/// date's midnight), or an interval's months, days and microseconds.
enum Time {
    At(i64),
    Span(i32, i32, i64),
}

fn time_of(v: &ScalarValue) -> Option<Time> {
    use ScalarValue as S;
    Some(match v {
        S::TimestampSecond(Some(s), _) => Time::At(s.checked_mul(1_000_000)?),
        S::TimestampMillisecond(Some(ms), _) => Time::At(ms.checked_mul(1_000)?),
        S::TimestampMicrosecond(Some(us), _) => Time::At(*us),
        S::TimestampNanosecond(Some(ns), _) => Time::At(ns.div_euclid(1_000)),
        S::Date32(Some(d)) => Time::At(*d as i64 * 86_400_000_000),
        S::Date64(Some(ms)) => Time::At(ms.checked_mul(1_000)?),
        S::IntervalMonthDayNano(Some(i)) => Time::Span(i.months, i.days, i.nanoseconds / 1_000),
        S::IntervalDayTime(Some(i)) => Time::Span(0, i.days, i.milliseconds as i64 * 1_000),
        S::IntervalYearMonth(Some(m)) => Time::Span(*m, 0, 0),
        S::DurationSecond(Some(s)) => Time::Span(0, 0, s.checked_mul(1_000_000)?),
        S::DurationMillisecond(Some(ms)) => Time::Span(0, 0, ms.checked_mul(1_000)?),
        S::DurationMicrosecond(Some(us)) => Time::Span(0, 0, *us),
        S::DurationNanosecond(Some(ns)) => Time::Span(0, 0, ns / 1_000),
        _ => return None,
    })
}

/// The wall-clock time of a timestamp or date (timestamps with a zone in UTC).
fn wall_clock(v: &ScalarValue) -> Option<NaiveDateTime> {
    match time_of(v)? {
        Time::At(us) => DateTime::from_timestamp_micros(us).map(|t| t.naive_utc()),
        Time::Span(..) => None,
    }
}

/// A time zone's abbreviation and offset (`CET`, `+01`) at an instant.
type ZoneText = (String, String);

/// The wall-clock time of a timestamp or date where it is shown: a timestamp with a time
/// zone in its zone (the session's), with that zone's abbreviation and offset then.
fn local_time(v: &ScalarValue) -> Option<(NaiveDateTime, Option<ZoneText>)> {
    use chrono::{Offset, TimeZone};
    use chrono_tz::OffsetName;
    let t = wall_clock(v)?;
    let DataType::Timestamp(_, Some(zone)) = v.data_type() else {
        return Some((t, None));
    };
    let tz = crate::session::cells::time_zone(&zone).unwrap_or(chrono_tz::UTC);
    let offset = tz.offset_from_utc_datetime(&t);
    let seconds = offset.fix().local_minus_utc();
    let (sign, abs) = (if seconds < 0 { '-' } else { '+' }, seconds.abs());
    let of = match abs % 3600 / 60 {
        0 => format!("{sign}{:02}", abs / 3600),
        m => format!("{sign}{:02}:{m:02}", abs / 3600),
    };
    let abbreviation = offset
        .abbreviation()
        .map_or_else(|| of.clone(), str::to_string);
    let local = t + chrono::Duration::seconds(seconds as i64);
    Some((local, Some((abbreviation, of))))
}

/// The functions the rewrite calls in place of DataFusion's.
pub(super) fn functions() -> Vec<ScalarUDF> {
    let mut udfs: Vec<ScalarUDF> = [
        Part::Second,
        Part::Milliseconds,
        Part::Epoch,
        Part::Decade,
        Part::Century,
        Part::Millennium,
        Part::Timezone,
        Part::TimezoneHour,
        Part::TimezoneMinute,
    ]
    .into_iter()
    .map(|part| {
        let (precision, scale) = part.decimal();
        super::functions::fallible_function(
            part.function(),
            &[1],
            DataType::Decimal128(precision, scale),
            move |a| {
                // A time zone's parts of a value without one are an error, as in PostgreSQL.
                if let Some(v) = a.first().filter(|v| part.of_zone() && !v.is_null()) {
                    if !matches!(v.data_type(), DataType::Timestamp(_, Some(_))) {
                        let unit = part.function().trim_start_matches("pg_extract_");
                        return Err(external(
                            ErrorKind::Unsupported,
                            &format!(
                                "unit \"{unit}\" not supported for type {}",
                                super::numeric::type_name(&v.data_type())
                            ),
                        ));
                    }
                }
                let us = a.first().and_then(|v| part.micros(v));
                Ok(ScalarValue::Decimal128(us, precision, scale))
            },
        )
    })
    .collect();
    udfs.push(ScalarUDF::new_from_impl(AtTimeZone::default()));
    // `to_date(text, pattern)` and `to_timestamp(text, pattern)` (the rewrite's
    // `pg_to_timestamp(text, pattern, zone)`: the local time read in the session's zone,
    // an instant).
    udfs.push(super::functions::fallible_function(
        "pg_to_date",
        &[2],
        DataType::Date32,
        |a| match a {
            [ScalarValue::Utf8(Some(t)), ScalarValue::Utf8(Some(p))] => {
                let t = read_by_pattern(t, p)?;
                let days = t.date().signed_duration_since(chrono::NaiveDate::default());
                Ok(ScalarValue::Date32(Some(days.num_days() as i32)))
            }
            _ => Ok(ScalarValue::Date32(None)),
        },
    ));
    udfs.push(super::functions::fallible_function(
        "pg_to_timestamp",
        &[3],
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        |a| match a {
            [ScalarValue::Utf8(Some(t)), ScalarValue::Utf8(Some(p)), ScalarValue::Utf8(Some(zone))] => {
                let local = read_by_pattern(t, p)?.and_utc().timestamp_micros();
                let us = in_zone(local, zone).unwrap_or(local);
                Ok(ScalarValue::TimestampMicrosecond(Some(us), Some("UTC".into())))
            }
            _ => Ok(ScalarValue::TimestampMicrosecond(None, Some("UTC".into()))),
        },
    ));
    // Timestamps (in any zone: the session's), dates and numbers.
    udfs.push(super::functions::fallible_function(
        "to_char",
        &[2],
        DataType::Utf8,
        |a| match a {
            [v, ScalarValue::Utf8(Some(pattern))] if matches!(time_of(v), Some(Time::At(_))) => {
                Ok(ScalarValue::Utf8(
                    local_time(v).map(|(t, zone)| to_char(&t, pattern, zone.as_ref())),
                ))
            }
            [v, _] if v.is_null() || matches!(time_of(v), Some(Time::At(_))) => {
                Ok(ScalarValue::Utf8(None))
            }
            [v, ScalarValue::Utf8(Some(pattern))]
                if v.data_type().is_numeric() || matches!(v, ScalarValue::Utf8(_)) =>
            {
                Ok(ScalarValue::Utf8(super::numeric::to_char_number(
                    v, pattern,
                )?))
            }
            [v, _] => Err(super::arith::external(
                ErrorKind::Unsupported,
                &format!("to_char of {} is not supported", v.data_type()),
            )),
            _ => Ok(ScalarValue::Utf8(None)),
        },
    ));
    udfs
}

/// PostgreSQL's singular name of a `date_trunc` unit given in the plural.
pub(super) fn trunc_unit(unit: &str) -> Option<&'static str> {
    Some(match unit.to_ascii_lowercase().as_str() {
        "microseconds" => "microsecond",
        "milliseconds" => "millisecond",
        "seconds" => "second",
        "minutes" => "minute",
        "hours" => "hour",
        "days" => "day",
        "weeks" => "week",
        "months" => "month",
        "quarters" => "quarter",
        "years" => "year",
        _ => return None,
    })
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// `to_char(t, pattern)` as PostgreSQL formats a timestamp: the template patterns
/// below, `FM` before one to drop its padding, `"…"` for literal text, `\` before a
/// character to take it as it is; anything else is copied. `TZ` and `OF` are the
/// zone's abbreviation and offset; without a time zone, empty and `+00`.
fn to_char(t: &NaiveDateTime, pattern: &str, zone: Option<&ZoneText>) -> String {
    let mut out = String::new();
    let mut rest = pattern;
    while !rest.is_empty() {
        if let Some(quoted) = rest.strip_prefix('"') {
            let end = quoted.find('"').unwrap_or(quoted.len());
            out.push_str(&quoted[..end]);
            rest = quoted.get(end + 1..).unwrap_or("");
            continue;
        }
        if let Some(escaped) = rest.strip_prefix('\\') {
            let mut chars = escaped.chars();
            out.extend(chars.next());
            rest = chars.as_str();
            continue;
        }
        let (fill, body) = match rest.strip_prefix("FM").or_else(|| rest.strip_prefix("fm")) {
            Some(b) => (false, b),
            None => (true, rest),
        };
        match field(t, body, fill, zone) {
            Some((text, used)) => {
                out.push_str(&text);
                rest = &body[used..];
            }
            None => {
                let mut chars = rest.chars();
                out.extend(chars.next());
                rest = chars.as_str();
            }
        }
    }
    out
}

/// The template pattern at the start of `s`, formatted, and its length in bytes.
/// `fill`: numbers zero-padded and names blank-padded to a fixed width.
fn field(
    t: &NaiveDateTime,
    s: &str,
    fill: bool,
    zone: Option<&ZoneText>,
) -> Option<(String, usize)> {
    let num = |v: u32, width: usize| {
        if fill {
            format!("{v:0width$}")
        } else {
            v.to_string()
        }
    };
    // A name in the pattern's case: `MONTH`, `Month` or `month`.
    let name = |full: &str, pat: &str, width: usize| {
        let cased = if pat.chars().nth(1).is_some_and(|c| c.is_ascii_uppercase()) {
            full.to_uppercase()
        } else if pat.starts_with(|c: char| c.is_ascii_uppercase()) {
            full.to_string()
        } else {
            full.to_lowercase()
        };
        if fill {
            format!("{cased:<width$}")
        } else {
            cased
        }
    };
    let hour12 = match t.hour() % 12 {
        0 => 12,
        h => h,
    };
    let month = MONTHS[t.month0() as usize];
    let day = DAYS[t.weekday().num_days_from_sunday() as usize];
    let micros = t.nanosecond() / 1_000 % 1_000_000;
    let starts = |p: &str| s.len() >= p.len() && s[..p.len()].eq_ignore_ascii_case(p);
    // Longest patterns first: `HH24` before `HH`, `MONTH` before `MON`, `MS` after `MI`.
    let exact = |p: &str| s.starts_with(p);
    let formatted = if exact("YYYY") {
        (num(t.year() as u32, 4), 4)
    } else if exact("YYY") {
        (num(t.year() as u32 % 1000, 3), 3)
    } else if exact("YY") {
        (num(t.year() as u32 % 100, 2), 2)
    } else if exact("HH24") {
        (num(t.hour(), 2), 4)
    } else if exact("HH12") {
        (num(hour12, 2), 4)
    } else if exact("HH") {
        (num(hour12, 2), 2)
    } else if exact("MI") {
        (num(t.minute(), 2), 2)
    } else if exact("SSSS") {
        (
            (t.hour() * 3600 + t.minute() * 60 + t.second()).to_string(),
            4,
        )
    } else if exact("SS") {
        (num(t.second(), 2), 2)
    } else if exact("MS") {
        (format!("{:03}", micros / 1_000), 2)
    } else if exact("US") {
        (format!("{micros:06}"), 2)
    } else if starts("MONTH") {
        (name(month, &s[..5], 9), 5)
    } else if starts("MON") {
        (name(&month[..3], &s[..3], 3), 3)
    } else if exact("MM") {
        (num(t.month(), 2), 2)
    } else if starts("DAY") {
        (name(day, &s[..3], 9), 3)
    } else if starts("DY") {
        (name(&day[..3], &s[..2], 3), 2)
    } else if exact("DDD") {
        (num(t.ordinal(), 3), 3)
    } else if exact("DD") {
        (num(t.day(), 2), 2)
    } else if exact("D") {
        ((t.weekday().num_days_from_sunday() + 1).to_string(), 1)
    } else if exact("AM") || exact("PM") {
        ((if t.hour() < 12 { "AM" } else { "PM" }).to_string(), 2)
    } else if exact("am") || exact("pm") {
        ((if t.hour() < 12 { "am" } else { "pm" }).to_string(), 2)
    } else if exact("Q") {
        ((t.month0() / 3 + 1).to_string(), 1)
    } else if exact("IW") {
        (num(t.iso_week().week(), 2), 2)
    } else if exact("WW") {
        (num(t.ordinal0() / 7 + 1, 2), 2)
    } else if exact("TZ") || exact("OF") {
        let text = match (zone, exact("TZ")) {
            (None, true) => "",
            (None, false) => "+00",
            (Some((abbreviation, _)), true) => abbreviation,
            (Some((_, offset)), false) => offset,
        };
        (text.to_string(), 2)
    } else {
        return None;
    };
    Some(formatted)
}

/// Interval text in forms PostgreSQL reads and DataFusion does not, in the unit words
/// DataFusion reads: a clock part (`1 day 02:30:00`, `-02:00`, `04:05:06.5`, as intervals
/// print), ISO 8601 (`P1Y2M3DT4H5M6S`, `P2W`), and PostgreSQL's `@ … ago`. `h:mm` is hours
/// and minutes, `m:ss.f` minutes and seconds; a sign before the clock part is the whole
/// part's. None: text DataFusion reads as it is (`1 day 2 hours`), or no interval.
pub(super) fn interval_units(text: &str) -> Option<String> {
    let trimmed = text.trim();
    if let Some(iso) = trimmed.strip_prefix('P') {
        return iso_interval(iso);
    }
    let mut words: Vec<&str> = trimmed.split_whitespace().collect();
    let at = words.first() == Some(&"@");
    if at {
        words.remove(0);
    }
    let ago = words.last().is_some_and(|w| w.eq_ignore_ascii_case("ago"));
    if ago {
        words.pop();
    }
    let clock = words.iter().any(|w| w.contains(':'));
    // A number may carry a plus sign (`-1 day +2 hours`), which DataFusion refuses.
    let digits = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_ascii_digit() || c == '.');
    let number = |w: &str| digits(w.strip_prefix(['+', '-']).unwrap_or(w));
    let plus = words
        .iter()
        .any(|w| w.strip_prefix('+').is_some_and(digits));
    if !(at || ago || clock || plus) {
        return None;
    }
    let mut parts: Vec<String> = Vec::new();
    for (i, &w) in words.iter().enumerate() {
        if !w.contains(':') {
            let w = w.strip_prefix('+').filter(|n| digits(n)).unwrap_or(w);
            // A bare number before the clock part is days (`1 2:03:04`).
            match number(w) && words.get(i + 1).is_some_and(|next| next.contains(':')) {
                true => parts.push(format!("{w} days")),
                false => parts.push(w.to_string()),
            }
            continue;
        }
        let (sign, body) = match w.strip_prefix('-') {
            Some(b) => ("-", b),
            None => ("", w.strip_prefix('+').unwrap_or(w)),
        };
        let fields: Vec<&str> = body.split(':').collect();
        let ok = |f: &str| !f.is_empty() && f.chars().all(|c| c.is_ascii_digit() || c == '.');
        if !fields.iter().all(|f| ok(f)) {
            return None;
        }
        let units: &[&str] = match fields.len() {
            2 if fields[1].contains('.') => &["minutes", "seconds"],
            2 => &["hours", "minutes"],
            3 => &["hours", "minutes", "seconds"],
            _ => return None,
        };
        for (f, unit) in fields.iter().zip(units) {
            parts.push(format!("{sign}{f} {unit}"));
        }
    }
    if ago {
        // Every number's sign turns: `1 day -2 hours ago` is `-1 day 2 hours`.
        for p in parts.iter_mut() {
            if p.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
                p.insert(0, '-');
            } else if let Some(rest) = p.strip_prefix('-') {
                *p = rest.to_string();
            }
        }
    }
    Some(parts.join(" "))
}

/// ISO 8601 duration text after its `P`, in unit words.
fn iso_interval(iso: &str) -> Option<String> {
    let mut parts = Vec::new();
    let mut time = false;
    let mut number = String::new();
    for c in iso.chars() {
        match c {
            'T' | 't' if number.is_empty() => time = true,
            '0'..='9' | '.' | '-' => number.push(c),
            _ if number.is_empty() => return None,
            _ => {
                let unit = match (c.to_ascii_uppercase(), time) {
                    ('Y', false) => "years",
                    ('M', false) => "months",
                    ('W', false) => "weeks",
                    ('D', false) => "days",
                    ('H', true) => "hours",
                    ('M', true) => "minutes",
                    ('S', true) => "seconds",
                    _ => return None,
                };
                parts.push(format!("{} {unit}", std::mem::take(&mut number)));
            }
        }
    }
    (number.is_empty() && !parts.is_empty()).then(|| parts.join(" "))
}

/// Text read by a PostgreSQL template, as `to_timestamp(text, pattern)` and `to_date`
/// read it: the patterns `to_char` writes (names in any case), `FM` ignored, `"…"`
/// passing over as many characters, a blank in the pattern over any blanks, another
/// separator over one separator (if there is one), and any other character over one.
/// Blanks before a field are skipped, and a number is at most its field's width. A year
/// of fewer digits than its field's is the one nearest 2020 (`YY` 95 is 1995). Missing
/// fields are year 1, January, the 1st and midnight. Errors: 22007 for text a field
/// cannot read, 22008 for a date or time that does not exist, 0A000 for a pattern
/// (`TZ`, `OF`) read only by `to_char`.
fn read_by_pattern(text: &str, pattern: &str) -> Result<NaiveDateTime> {
    let error = |e: eddy_planner::Error| DataFusionError::External(Box::new(e));
    let invalid = |value: &str, field: &str, detail: &str| {
        let value: String = value.chars().take(field.len().max(4)).collect();
        error(
            eddy_planner::Error::new(
                ErrorKind::InvalidDatetime,
                format!("invalid value \"{value}\" for \"{field}\""),
            )
            .with_detail(detail),
        )
    };
    let (mut year, mut month, mut day, mut ordinal) = (None, 1u32, 1u32, None);
    let (mut hour, mut minute, mut second, mut micros) = (0u32, 0u32, 0u32, 0u32);
    let (mut twelve, mut pm) = (false, None);
    let mut input = text;
    let mut rest = pattern;
    while !rest.is_empty() {
        if let Some(quoted) = rest.strip_prefix('"') {
            let end = quoted.find('"').unwrap_or(quoted.len());
            let skip = quoted[..end].chars().count();
            input = input
                .char_indices()
                .nth(skip)
                .map_or("", |(i, _)| &input[i..]);
            rest = quoted.get(end + 1..).unwrap_or("");
            continue;
        }
        let body = rest
            .strip_prefix("FM")
            .or_else(|| rest.strip_prefix("fm"))
            .unwrap_or(rest);
        let upper = body.get(..5).unwrap_or(body).to_ascii_uppercase();
        let starts = |p: &str| upper.starts_with(p);
        // (pattern length, widest number) of a numeric field.
        let numeric = [
            ("YYYY", 4),
            ("YYY", 3),
            ("YY", 2),
            ("Y", 1),
            ("HH24", 2),
            ("HH12", 2),
            ("HH", 2),
            ("MI", 2),
            ("SSSS", 5),
            ("SS", 2),
            ("MS", 3),
            ("US", 6),
            ("MM", 2),
            ("DDD", 3),
            ("DD", 2),
        ]
        .into_iter()
        .find(|(p, _)| upper.starts_with(p));
        if let Some((field, width)) = numeric {
            input = input.trim_start();
            let digits = input
                .char_indices()
                .take_while(|(i, c)| *i < width && c.is_ascii_digit())
                .count();
            let Ok(v) = input[..digits].parse::<u32>() else {
                return Err(invalid(input, field, "Value must be an integer."));
            };
            match field {
                "YYYY" => year = Some(v as i32),
                "YYY" | "YY" | "Y" if digits < 4 => {
                    year = Some(match v {
                        0..70 => 2000 + v,
                        70..100 => 1900 + v,
                        100..520 => 2000 + v,
                        _ => 1000 + v,
                    } as i32)
                }
                "YYY" | "YY" | "Y" => year = Some(v as i32),
                "HH24" => hour = v,
                "HH12" | "HH" => (hour, twelve) = (v, true),
                "MI" => minute = v,
                "SSSS" => (hour, minute, second) = (v / 3600, v / 60 % 60, v % 60),
                "SS" => second = v,
                // A fraction: `SS.MS` of 12.3 is 300 milliseconds, as in PostgreSQL.
                "MS" => micros = v * 10u32.pow(3 - digits as u32) * 1_000,
                "US" => micros = v * 10u32.pow(6 - digits as u32),
                "MM" => month = v,
                "DDD" => ordinal = Some(v),
                _ => day = v,
            }
            input = &input[digits..];
            rest = &body[field.len()..];
            continue;
        }
        // Names: the month's (full or its first three letters), the day's (read, not
        // used) and the half of the day.
        let name = |names: &[&str], short: bool, input: &mut &str| -> Option<usize> {
            *input = input.trim_start();
            names.iter().position(|n| {
                let n = if short { &n[..3] } else { n };
                let found = input
                    .get(..n.len())
                    .is_some_and(|head| head.eq_ignore_ascii_case(n));
                if found {
                    *input = &input[n.len()..];
                }
                found
            })
        };
        let named = if starts("MONTH") {
            Some((
                5,
                name(&MONTHS, false, &mut input).map(|m| month = m as u32 + 1),
            ))
        } else if starts("MON") {
            Some((
                3,
                name(&MONTHS, true, &mut input).map(|m| month = m as u32 + 1),
            ))
        } else if starts("DAY") {
            Some((3, name(&DAYS, false, &mut input).map(|_| ())))
        } else if starts("DY") {
            Some((2, name(&DAYS, true, &mut input).map(|_| ())))
        } else if starts("A.M.") || starts("P.M.") {
            let half = ["A.M.", "P.M."];
            Some((4, name(&half, false, &mut input).map(|h| pm = Some(h == 1))))
        } else if starts("AM") || starts("PM") {
            Some((
                2,
                name(&["AM", "PM"], false, &mut input).map(|h| pm = Some(h == 1)),
            ))
        } else {
            None
        };
        if let Some((len, found)) = named {
            if found.is_none() {
                let detail =
                    "The given value did not match any of the allowed values for this field.";
                return Err(invalid(input, &body[..len], detail));
            }
            rest = &body[len..];
            continue;
        }
        if starts("TZ") || starts("OF") {
            return Err(external(
                ErrorKind::Unsupported,
                &format!(
                    "\"{}\" is not supported in to_timestamp and to_date",
                    &body[..2]
                ),
            ));
        }
        let mut chars = rest.chars();
        let c = chars.next().unwrap_or(' ');
        rest = chars.as_str();
        if c.is_whitespace() {
            input = input.trim_start();
        } else {
            let mut at = input.chars();
            if at
                .next()
                .is_some_and(|i| c.is_alphanumeric() || !(i.is_alphanumeric() || i.is_whitespace()))
            {
                input = at.as_str();
            }
        }
    }
    if twelve {
        if !(1..=12).contains(&hour) {
            return Err(error(
                eddy_planner::Error::new(
                    ErrorKind::DatetimeOutOfRange,
                    format!("hour \"{hour}\" is invalid for the 12-hour clock"),
                )
                .with_hint("Use the 24-hour clock, or give an hour between 1 and 12."),
            ));
        }
        hour %= 12;
    }
    if pm == Some(true) && hour < 12 {
        hour += 12;
    }
    let year = year.unwrap_or(1);
    let date = match ordinal {
        Some(d) => chrono::NaiveDate::from_yo_opt(year, d),
        None => chrono::NaiveDate::from_ymd_opt(year, month, day),
    };
    // 24:00:00 is the next midnight, as in PostgreSQL.
    let (carry, hour) = if (hour, minute, second, micros) == (24, 0, 0, 0) {
        (1, 0)
    } else {
        (0, hour)
    };
    date.and_then(|d| d.and_hms_micro_opt(hour, minute, second, micros))
        .map(|t| t + chrono::Duration::days(carry))
        .ok_or_else(|| {
            external(
                ErrorKind::DatetimeOutOfRange,
                &format!("date/time field value out of range: \"{text}\""),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_text_in_unit_words() {
        let units = |t: &str| interval_units(t);
        assert_eq!(units("1 day 2 hours"), None);
        assert_eq!(
            units("1 day 02:30:00").unwrap(),
            "1 day 02 hours 30 minutes 00 seconds"
        );
        assert_eq!(units("-02:00").unwrap(), "-02 hours -00 minutes");
        assert_eq!(units("05:06.5").unwrap(), "05 minutes 06.5 seconds");
        assert_eq!(
            units("P1Y2M3DT4H5M6.5S").unwrap(),
            "1 years 2 months 3 days 4 hours 5 minutes 6.5 seconds"
        );
        assert_eq!(units("@ 1 day -2 hours ago").unwrap(), "-1 day 2 hours");
        assert_eq!(units("-1 day +2 hours").unwrap(), "-1 day 2 hours");
        assert_eq!(units("+3 days").unwrap(), "3 days");
        assert_eq!(
            units("1 2:03:04").unwrap(),
            "1 days 2 hours 03 minutes 04 seconds"
        );
        assert_eq!(units("1 day -2 hours"), None);
        assert_eq!(units("P1X"), None);
        assert_eq!(units("1:2:3:4"), None);
    }

    #[test]
    fn reads_text_by_postgresql_patterns() {
        let read = |t: &str, p: &str| read_by_pattern(t, p).map(|t| t.to_string());
        for (text, pattern, read_as) in [
            (
                "2026-11-01 06:00",
                "YYYY-MM-DD HH24:MI",
                "2026-11-01 06:00:00",
            ),
            ("01 Nov 2026", "DD Mon YYYY", "2026-11-01 00:00:00"),
            ("05 DECEMBER 95", "DD MONTH YY", "1995-12-05 00:00:00"),
            ("20261101", "YYYYMMDD", "2026-11-01 00:00:00"),
            (
                "2026/11/01  7:05:03 PM",
                "YYYY-MM-DD HH:MI:SS AM",
                "2026-11-01 19:05:03",
            ),
            ("12:34:56.5", "HH24:MI:SS.MS", "0001-01-01 12:34:56.500"),
            ("Sun 01 Nov 2026", "Dy DD Mon YYYY", "2026-11-01 00:00:00"),
            ("2026 305", "YYYY DDD", "2026-11-01 00:00:00"),
            ("2026T11", "YYYY\"T\"MM", "2026-11-01 00:00:00"),
            ("2026-11-01", "yyyy-mm-dd", "2026-11-01 00:00:00"),
        ] {
            assert_eq!(read(text, pattern).unwrap(), read_as, "{text} by {pattern}");
        }
        let error = |t: &str, p: &str| read(t, p).unwrap_err().to_string();
        assert!(error("abc", "YYYY").contains("invalid value \"abc\" for \"YYYY\""));
        assert!(error("2026-02-30", "YYYY-MM-DD").contains("out of range"));
        assert!(error("13:00", "HH12:MI").contains("12-hour clock"));
        assert!(error("2026", "YYYY TZ").contains("not supported"));
    }

    fn at(s: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f").unwrap()
    }

    #[test]
    fn to_char_reads_postgresql_patterns() {
        let t = at("2026-11-01 12:34:56.789");
        assert_eq!(
            to_char(&t, "YYYY-MM-DD HH24:MI:SS", None),
            "2026-11-01 12:34:56"
        );
        assert_eq!(
            to_char(&t, "Dy DD Mon YYYY HH12:MI AM", None),
            "Sun 01 Nov 2026 12:34 PM"
        );
        assert_eq!(to_char(&t, "Day FMDD Month", None), "Sunday    1 November ");
        let t = at("2026-10-24 13:20:15.123456");
        assert_eq!(
            to_char(&t, "YYYY-MM-DD\"T\"HH24:MI:SS.MS", None),
            "2026-10-24T13:20:15.123"
        );
        assert_eq!(to_char(&t, "US", None), "123456");
        assert_eq!(
            to_char(&t, "MONTH-month FMHH12 pm Q", None),
            "OCTOBER  -october   1 pm 4"
        );
    }

    #[test]
    fn extract_keeps_the_fraction_of_a_second() {
        let ts = ScalarValue::TimestampNanosecond(Some(1_792_848_015_123_456_000), None);
        assert_eq!(Part::Second.micros(&ts), Some(15_123_456));
        assert_eq!(Part::Epoch.micros(&ts), Some(1_792_848_015_123_456));
        let before_1970 = ScalarValue::TimestampMicrosecond(Some(-500_000), None);
        assert_eq!(Part::Second.micros(&before_1970), Some(59_500_000));
        let day_2h = ScalarValue::IntervalMonthDayNano(Some(
            datafusion::arrow::datatypes::IntervalMonthDayNano::new(0, 1, 7_200_000_000_000),
        ));
        assert_eq!(Part::Epoch.micros(&day_2h), Some(93_600_000_000));
    }
}

/// PostgreSQL's `x AT TIME ZONE zone`, which the rewrite calls `pg_at_time_zone`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct AtTimeZone {
    signature: datafusion::logical_expr::Signature,
}

impl Default for AtTimeZone {
    fn default() -> AtTimeZone {
        AtTimeZone {
            signature: datafusion::logical_expr::Signature::any(
                2,
                datafusion::logical_expr::Volatility::Immutable,
            ),
        }
    }
}

impl datafusion::logical_expr::ScalarUDFImpl for AtTimeZone {
    fn name(&self) -> &str {
        "pg_at_time_zone"
    }

    fn signature(&self) -> &datafusion::logical_expr::Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(match args.first() {
            Some(DataType::Timestamp(_, Some(_))) => {
                DataType::Timestamp(TimeUnit::Microsecond, None)
            }
            _ => DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
        })
    }

    fn invoke_with_args(
        &self,
        args: datafusion::logical_expr::ScalarFunctionArgs,
    ) -> Result<datafusion::logical_expr::ColumnarValue> {
        use datafusion::arrow::array::{Array, AsArray, TimestampMicrosecondArray};
        use datafusion::logical_expr::ColumnarValue;
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let zoned = matches!(arrays[0].data_type(), DataType::Timestamp(_, Some(_)));
        let micros = datafusion::arrow::compute::cast(
            &arrays[0],
            &DataType::Timestamp(TimeUnit::Microsecond, None),
        )?;
        let micros =
            micros.as_primitive::<datafusion::arrow::datatypes::TimestampMicrosecondType>();
        let zones = datafusion::arrow::compute::cast(&arrays[1], &DataType::Utf8)?;
        let zones = zones.as_string::<i32>();
        let mut out = Vec::with_capacity(micros.len());
        for i in 0..micros.len() {
            if micros.is_null(i) || zones.is_null(i) {
                out.push(None);
                continue;
            }
            let (us, name) = (micros.value(i), zones.value(i));
            let zone: chrono_tz::Tz = crate::session::cells::time_zone(name).ok_or_else(|| {
                external(
                    ErrorKind::InvalidParameter,
                    &format!("time zone \"{name}\" not recognized"),
                )
            })?;
            out.push(if zoned {
                // The instant's wall-clock time in the zone.
                use chrono::{Offset, TimeZone};
                DateTime::from_timestamp_micros(us).map(|t| {
                    let offset = zone.offset_from_utc_datetime(&t.naive_utc()).fix();
                    us + offset.local_minus_utc() as i64 * 1_000_000
                })
            } else {
                in_zone(us, zone.name())
            });
        }
        let array = TimestampMicrosecondArray::from(out);
        let array: std::sync::Arc<dyn Array> = match zoned {
            true => std::sync::Arc::new(array),
            false => std::sync::Arc::new(array.with_timezone("+00:00")),
        };
        Ok(match scalar {
            true => ColumnarValue::Scalar(ScalarValue::try_from_array(&array, 0)?),
            false => ColumnarValue::Array(array),
        })
    }
}
