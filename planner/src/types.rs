//! Column types and scalar values of events, shared by every layer.
//!
//! Invariant: a `Value` stored for a column always has the variant that the column's
//! `ColumnType` implies (`Int` for INTEGER/BIGINT, `Float` for REAL/DOUBLE, `Timestamp`
//! in microseconds since the Unix epoch), or `Null`.

use std::borrow::Cow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, TimeUnit};

/// The SQL column types a stream may declare; each maps to exactly one Arrow type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ColumnType {
    Boolean,
    Int32,
    Int64,
    Float32,
    Float64,
    Text,
    Timestamp,
    /// TIMESTAMPTZ: an instant, stored as UTC microseconds like TIMESTAMP, shown in the
    /// session's TimeZone.
    TimestampTz,
}

impl ColumnType {
    pub fn arrow(self) -> DataType {
        match self {
            ColumnType::Boolean => DataType::Boolean,
            ColumnType::Int32 => DataType::Int32,
            ColumnType::Int64 => DataType::Int64,
            ColumnType::Float32 => DataType::Float32,
            ColumnType::Float64 => DataType::Float64,
            ColumnType::Text => DataType::Utf8,
            ColumnType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            ColumnType::TimestampTz => {
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
            }
        }
    }

    /// The PostgreSQL spelling, as `DESCRIBE` shows it.
    pub fn sql_name(self) -> &'static str {
        match self {
            ColumnType::Boolean => "BOOLEAN",
            ColumnType::Int32 => "INTEGER",
            ColumnType::Int64 => "BIGINT",
            ColumnType::Float32 => "REAL",
            ColumnType::Float64 => "DOUBLE PRECISION",
            ColumnType::Text => "TEXT",
            ColumnType::Timestamp => "TIMESTAMP",
            ColumnType::TimestampTz => "TIMESTAMPTZ",
        }
    }

    pub fn is_integer(self) -> bool {
        matches!(self, ColumnType::Int32 | ColumnType::Int64)
    }

    pub fn is_float(self) -> bool {
        matches!(self, ColumnType::Float32 | ColumnType::Float64)
    }

    pub fn is_numeric(self) -> bool {
        self.is_integer() || self.is_float()
    }

    /// Parses a type name as written in `CREATE STREAM` (already lower-cased or not).
    pub fn parse(name: &str) -> Option<ColumnType> {
        let name = name.trim().to_ascii_lowercase();
        let name = name.split('(').next().unwrap_or("").trim().to_string();
        Some(match name.as_str() {
            "boolean" | "bool" => ColumnType::Boolean,
            "integer" | "int" | "int4" | "smallint" | "int2" => ColumnType::Int32,
            "bigint" | "int8" => ColumnType::Int64,
            "real" | "float4" => ColumnType::Float32,
            "double precision" | "double" | "float8" | "float" => ColumnType::Float64,
            "text" | "varchar" | "character varying" | "string" | "char" | "character" => {
                ColumnType::Text
            }
            "timestamp" | "timestamp without time zone" => ColumnType::Timestamp,
            "timestamptz" | "timestamp with time zone" => ColumnType::TimestampTz,
            _ => return None,
        })
    }
}

/// An `i128` kept at 8-byte alignment. `i128`'s own alignment of 16 would make every
/// `Value` 32 bytes instead of 24, and pad every aggregate state that holds one.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(C, packed(8))]
pub struct I128(i128);

impl I128 {
    pub fn get(self) -> i128 {
        self.0
    }
}

impl From<i128> for I128 {
    fn from(v: i128) -> I128 {
        I128(v)
    }
}

impl fmt::Debug for I128 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.get().fmt(f)
    }
}

impl PartialOrd for I128 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for I128 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.get().cmp(&other.get())
    }
}

/// An event's column values in the stream's column order, shared: binding, the engine
/// and the reservoir pass the same slice around without copying it.
///
/// Rows made together share one block (`Row::block`): a COPY batch or a decoded reservoir
/// chunk is one allocation, and dropping it is one free, not one per row. (A count
/// window's groups, whose events outlive their neighbours by far, keep them packed.)
#[derive(Clone)]
pub struct Row {
    block: Arc<[Value]>,
    start: u32,
    len: u32,
}

impl Row {
    /// `rows` rows that share `values`, which holds them one after another.
    pub fn block(values: Vec<Value>, rows: usize) -> Vec<Row> {
        let width = values.len().checked_div(rows).unwrap_or(0);
        assert_eq!(width * rows, values.len(), "a block holds whole rows");
        let block: Arc<[Value]> = values.into();
        let len = u32::try_from(width).expect("row width");
        (0..rows)
            .map(|i| Row {
                block: block.clone(),
                start: u32::try_from(i * width).expect("block size"),
                len,
            })
            .collect()
    }
}

impl std::ops::Deref for Row {
    type Target = [Value];

    #[inline]
    fn deref(&self) -> &[Value] {
        let start = self.start as usize;
        // SAFETY: every constructor places the row inside its block (`start + len` is at
        // most the block's length), and neither field changes after. This is the hottest
        // read there is: every column an event's key, filters and aggregates read.
        #[allow(unsafe_code)]
        unsafe {
            self.block.get_unchecked(start..start + self.len as usize)
        }
    }
}

impl AsRef<[Value]> for Row {
    fn as_ref(&self) -> &[Value] {
        self
    }
}

impl From<Vec<Value>> for Row {
    fn from(values: Vec<Value>) -> Row {
        Row::from(Arc::<[Value]>::from(values))
    }
}

impl From<&[Value]> for Row {
    fn from(values: &[Value]) -> Row {
        Row::from(Arc::<[Value]>::from(values))
    }
}

impl From<Arc<[Value]>> for Row {
    fn from(block: Arc<[Value]>) -> Row {
        let len = u32::try_from(block.len()).expect("row width");
        Row {
            block,
            start: 0,
            len,
        }
    }
}

impl FromIterator<Value> for Row {
    fn from_iter<I: IntoIterator<Item = Value>>(values: I) -> Row {
        Row::from(values.into_iter().collect::<Arc<[Value]>>())
    }
}

impl PartialEq for Row {
    fn eq(&self, other: &Row) -> bool {
        **self == **other
    }
}

impl Eq for Row {}

impl fmt::Debug for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

/// A text value. Up to 15 bytes it lives inline, in the value itself: keys such as a
/// card or an account cost no allocation to build, no atomic count to share or drop, and
/// no pointer to follow when packed. Longer texts are shared and reference counted, as an
/// `Arc<str>` would be. Either way it is 16 bytes, so a `Value` stays 24.
pub type Text = ecow::EcoString;

/// One scalar of an event or of an aggregate result.
#[derive(Clone, Debug)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    /// Exact integer sums (`SUM` of integers is NUMERIC, as in PostgreSQL).
    Numeric(I128),
    Float(f64),
    Text(Text),
    /// Microseconds since 1970-01-01 00:00:00 UTC.
    Timestamp(i64),
}

impl Value {
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The value as f64, for numeric aggregates; `None` for NULL and non-numbers.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(v) => Some(*v as f64),
            Value::Float(v) => Some(*v),
            Value::Numeric(v) => Some(v.get() as f64),
            _ => None,
        }
    }

    /// The text form Kafka's partitioner hashes and COPY writes: PostgreSQL's output format.
    pub fn to_text(&self) -> Option<String> {
        self.text().map(Cow::into_owned)
    }

    /// `to_text`, borrowing a text value rather than copying it.
    pub fn text(&self) -> Option<Cow<'_, str>> {
        Some(match self {
            Value::Null => return None,
            Value::Bool(b) => Cow::Borrowed(if *b { "t" } else { "f" }),
            Value::Int(v) => Cow::Owned(v.to_string()),
            Value::Numeric(v) => Cow::Owned(v.get().to_string()),
            Value::Float(v) => Cow::Owned(format_float(*v)),
            Value::Text(s) => Cow::Borrowed(s),
            Value::Timestamp(us) => Cow::Owned(format_timestamp(*us)),
        })
    }

    /// Normalised bits for hashing floats: -0.0 equals 0.0 and all NaNs are one value.
    fn float_bits(v: f64) -> u64 {
        if v == 0.0 {
            0
        } else if v.is_nan() {
            f64::NAN.to_bits()
        } else {
            v.to_bits()
        }
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Numeric(a), Value::Numeric(b)) => a == b,
            (Value::Float(a), Value::Float(b)) => Value::float_bits(*a) == Value::float_bits(*b),
            (Value::Text(a), Value::Text(b)) => a == b,
            (Value::Timestamp(a), Value::Timestamp(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Value {}

impl Hash for Value {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            Value::Null => {}
            Value::Bool(b) => b.hash(state),
            Value::Int(v) => v.hash(state),
            Value::Numeric(v) => v.hash(state),
            Value::Float(v) => Value::float_bits(*v).hash(state),
            Value::Text(s) => s.hash(state),
            Value::Timestamp(v) => v.hash(state),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_text() {
            Some(s) => f.write_str(&s),
            None => f.write_str("NULL"),
        }
    }
}

/// Formats a double the way PostgreSQL 12+ does: the shortest text that reads back exactly.
pub fn format_float(v: f64) -> String {
    let mut s = String::new();
    write_float(v, &mut s);
    s
}

/// `format_float`, appended to `out`.
pub fn write_float(v: f64, out: &mut String) {
    write_shortest(v, v, (1e-4, 1e15), out)
}

/// Formats a `real` the way PostgreSQL 12+ does: the shortest text that reads back as
/// the same `real` (`123456.79`, `1.2345679e+07`), not the digits of the double it widens to.
pub fn format_float4(v: f32) -> String {
    let mut s = String::new();
    write_float4(v, &mut s);
    s
}

/// `format_float4`, appended to `out`.
pub fn write_float4(v: f32, out: &mut String) {
    write_shortest(v, v as f64, (1e-4f32 as f64, 1e6f32 as f64), out)
}

/// Appends `v`'s shortest text: plain when its decimal exponent is from -4 up to the
/// type's digits less one (`plain`: the values 1e-4 and 10^digits of `v`'s type, so the
/// test is on the value its shortest text reads back as), else scientific as PostgreSQL
/// writes it (`1e+20`, `1e-07`). `magnitude` is `v` as a double.
fn write_shortest<T: std::fmt::Display + std::fmt::LowerExp>(
    v: T,
    magnitude: f64,
    (low, high): (f64, f64),
    out: &mut String,
) {
    use std::fmt::Write;
    if magnitude.is_nan() {
        out.push_str("NaN");
        return;
    }
    if magnitude.is_infinite() {
        out.push_str(if magnitude > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        });
        return;
    }
    let abs = magnitude.abs();
    if abs == 0.0 || (abs >= low && abs < high) {
        let _ = write!(out, "{v}");
        return;
    }
    let start = out.len();
    let _ = write!(out, "{v:e}");
    let Some(e) = out[start..].find('e').map(|i| start + i) else {
        return;
    };
    let exp = out.split_off(e + 1);
    let (sign, digits) = match exp.strip_prefix('-') {
        Some(d) => ('-', d),
        None => ('+', exp.as_str()),
    };
    out.push(sign);
    if digits.len() < 2 {
        out.push('0');
    }
    out.push_str(digits);
}

/// Formats microseconds since the epoch as PostgreSQL's ISO timestamp text.
pub fn format_timestamp(us: i64) -> String {
    let mut s = String::with_capacity(26);
    write_timestamp(us, &mut s);
    s
}

/// `format_timestamp`, appended to `out`.
pub fn write_timestamp(us: i64, out: &mut String) {
    let secs = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000) as u32;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400) as u32;
    let (y, m, d) = civil_from_days(days);
    let two = |out: &mut String, v: u32| {
        out.push((b'0' + (v / 10) as u8) as char);
        out.push((b'0' + (v % 10) as u8) as char);
    };
    if (0..=9999).contains(&y) {
        let y = y as u32;
        two(out, y / 100);
        two(out, y % 100);
    } else {
        use std::fmt::Write;
        let _ = write!(out, "{y:04}");
    }
    out.push('-');
    two(out, m);
    out.push('-');
    two(out, d);
    out.push(' ');
    two(out, sod / 3600);
    out.push(':');
    two(out, (sod / 60) % 60);
    out.push(':');
    two(out, sod % 60);
    if micros != 0 {
        out.push('.');
        let (mut frac, mut width) = (micros, 6);
        while frac % 10 == 0 {
            frac /= 10;
            width -= 1;
        }
        let mut digits = [b'0'; 6];
        for i in (0..width).rev() {
            digits[i] = b'0' + (frac % 10) as u8;
            frac /= 10;
        }
        out.push_str(std::str::from_utf8(&digits[..width]).expect("digits"));
    }
}

/// Parses `YYYY-MM-DD[ T]HH:MM:SS[.ffffff][Z|+HH[:MM]]` or a bare date into microseconds.
pub fn parse_timestamp(text: &str) -> Option<i64> {
    parse_plain_timestamp(text.as_bytes()).or_else(|| parse_any_timestamp(text))
}

fn parse_any_timestamp(text: &str) -> Option<i64> {
    let t = text.trim();
    if t.len() < 10 {
        return None;
    }
    let date = t.get(..10)?;
    let mut parts = date.split('-');
    let y: i64 = parts.next()?.parse().ok()?;
    let m: u32 = parts.next()?.parse().ok()?;
    let d: u32 = parts.next()?.parse().ok()?;
    let mut rest = t.get(10..)?.trim_start_matches(['T', ' ']);
    let (mut h, mut mi, mut s, mut us) = (0i64, 0i64, 0i64, 0i64);
    let mut offset_secs = 0i64;
    if !rest.is_empty() {
        let end = rest.find(['Z', '+', '-']).unwrap_or(rest.len());
        let (clock, zone) = rest.split_at(end);
        // A 12-hour clock, as PostgreSQL reads one: `1:30 PM` is 13:30, `12:05 AM` 00:05.
        let clock = clock.trim();
        let (clock, pm) = match clock.len().checked_sub(2).and_then(|i| clock.get(i..)) {
            Some(m) if m.eq_ignore_ascii_case("am") || m.eq_ignore_ascii_case("pm") => (
                clock[..clock.len() - 2].trim_end(),
                Some(m.eq_ignore_ascii_case("pm")),
            ),
            _ => (clock, None),
        };
        let mut cp = clock.split(':');
        h = cp.next()?.parse().ok()?;
        if let Some(pm) = pm {
            if !(1..=12).contains(&h) {
                return None;
            }
            h = h % 12 + if pm { 12 } else { 0 };
        }
        mi = cp.next()?.parse().ok()?;
        let sec = cp.next().unwrap_or("0");
        let (sw, sf) = sec.split_once('.').unwrap_or((sec, ""));
        s = sw.parse().ok()?;
        if !sf.is_empty() {
            us = fraction_us(sf.as_bytes())?;
        }
        rest = zone.trim();
        if let Some(z) = rest.strip_prefix(['+', '-']) {
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            let (zh, zm) = z
                .split_once(':')
                .unwrap_or((z.get(..2)?, z.get(2..).unwrap_or("0")));
            let zh: i64 = zh.parse().ok()?;
            let zm: i64 = if zm.is_empty() { 0 } else { zm.parse().ok()? };
            offset_secs = sign * (zh * 3600 + zm * 60);
        } else if !(rest.is_empty() || rest == "Z") {
            return None;
        }
    }
    timestamp_us([y, m.into(), d.into(), h, mi, s], us, offset_secs)
}

/// Microseconds of a fraction's digits: the first six, padded with zeros, rounded by the
/// seventh as in PostgreSQL (a carry into the next second adds up in `timestamp_us`).
fn fraction_us(digits: &[u8]) -> Option<i64> {
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let us = (digits.iter().chain(std::iter::repeat(&b'0')))
        .take(6)
        .fold(0, |us, d| us * 10 + i64::from(d - b'0'));
    Some(us + i64::from(digits.get(6).is_some_and(|&d| d >= b'5')))
}

/// The instant of a civil date and time at a UTC offset; `None` if a field is out of
/// range.
fn timestamp_us(fields: [i64; 6], us: i64, offset_secs: i64) -> Option<i64> {
    let [y, m, d, h, mi, s] = fields;
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || h > 24 || mi > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(y, m as u32, d as u32);
    // A day past its month's end (February 30) is out of range, as in PostgreSQL.
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    let month_days = match m {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if d > month_days {
        return None;
    }
    let secs = days * 86_400 + h * 3600 + mi * 60 + s - offset_secs;
    Some(secs * 1_000_000 + us)
}

/// `parse_timestamp` for the form machines write, `YYYY-MM-DD HH:MM:SS[.f…]` (or with
/// `T`): the same value, read without splitting the text; `None` for any other form.
fn parse_plain_timestamp(t: &[u8]) -> Option<i64> {
    if t.len() < 19 || !matches!(t[10], b' ' | b'T') {
        return None;
    }
    let shape = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if shape.iter().any(|&(i, c)| t[i] != c) {
        return None;
    }
    let number = |from: usize, to: usize| {
        t[from..to].iter().try_fold(0i64, |n, &d| {
            d.is_ascii_digit().then(|| n * 10 + i64::from(d - b'0'))
        })
    };
    let fields = [(0, 4), (5, 7), (8, 10), (11, 13), (14, 16), (17, 19)];
    let mut values = [0; 6];
    for (value, (from, to)) in values.iter_mut().zip(fields) {
        *value = number(from, to)?;
    }
    let us = match &t[19..] {
        [] => 0,
        // A bare `.` is left to the general form.
        [b'.', digits @ ..] if !digits.is_empty() => fraction_us(digits)?,
        _ => return None,
    };
    timestamp_us(values, us, 0)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parses a duration such as `5 minutes`, `1 hour 30 minutes`, `500 ms` into microseconds.
pub fn parse_duration_us(text: &str) -> Option<i64> {
    let words: Vec<String> = text
        .split_whitespace()
        .map(|w| w.to_ascii_lowercase())
        .collect();
    if words.is_empty() {
        return None;
    }
    let mut total: i64 = 0;
    let mut i = 0;
    while i < words.len() {
        // Accept both "5 minutes" and "5minutes".
        let w = &words[i];
        let split = w.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(w.len());
        let (num, unit) = if split < w.len() {
            (w[..split].to_string(), w[split..].to_string())
        } else {
            i += 1;
            (w.clone(), words.get(i)?.clone())
        };
        let n: f64 = num.parse().ok()?;
        let unit_us = unit_us(&unit)?;
        total = total.checked_add((n * unit_us as f64).round() as i64)?;
        i += 1;
    }
    Some(total)
}

fn unit_us(unit: &str) -> Option<i64> {
    Some(match unit.trim_end_matches(',') {
        "us" | "microsecond" | "microseconds" => 1,
        "ms" | "millisecond" | "milliseconds" => 1_000,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000_000,
        "h" | "hour" | "hours" => 3_600_000_000,
        "d" | "day" | "days" => 86_400_000_000,
        "w" | "week" | "weeks" => 7 * 86_400_000_000,
        _ => return None,
    })
}

/// Formats microseconds as the largest whole unit, e.g. `5 MINUTES`, as EXPLAIN shows sizes.
pub fn format_duration_us(us: i64) -> String {
    const UNITS: [(i64, &str, &str); 6] = [
        (7 * 86_400_000_000, "WEEK", "WEEKS"),
        (86_400_000_000, "DAY", "DAYS"),
        (3_600_000_000, "HOUR", "HOURS"),
        (60_000_000, "MINUTE", "MINUTES"),
        (1_000_000, "SECOND", "SECONDS"),
        (1_000, "MILLISECOND", "MILLISECONDS"),
    ];
    for (size, one, many) in UNITS {
        if us != 0 && us % size == 0 {
            let n = us / size;
            return format!("{n} {}", if n == 1 { one } else { many });
        }
    }
    format!("{us} MICROSECONDS")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_a_block_share_it() {
        let values: Vec<Value> = (0..6).map(Value::Int).collect();
        let rows = Row::block(values, 3);
        assert_eq!(rows.len(), 3);
        assert_eq!(&*rows[1], &[Value::Int(2), Value::Int(3)]);
        assert_eq!(rows[2][1], Value::Int(5));
        // One allocation for all three rows.
        assert!(std::ptr::eq(
            rows[1].as_ptr(),
            rows[0].as_ptr().wrapping_add(2)
        ));
        assert_eq!(Arc::strong_count(&rows[0].block), 3);

        // Rows of no columns (a block of nothing) still count.
        let empty = Row::block(Vec::new(), 4);
        assert_eq!(empty.len(), 4);
        assert!(empty.iter().all(|r| r.is_empty()));
        assert!(Row::block(Vec::new(), 0).is_empty());
        assert_eq!(format!("{:?}", rows[0]), "[Int(0), Int(1)]");
    }

    #[test]
    fn timestamps_round_trip() {
        let us = parse_timestamp("2026-11-22 10:00:00").unwrap();
        assert_eq!(format_timestamp(us), "2026-11-22 10:00:00");
        let us = parse_timestamp("2026-11-22T10:00:00.25Z").unwrap();
        assert_eq!(format_timestamp(us), "2026-11-22 10:00:00.25");
        assert_eq!(
            parse_timestamp("1970-01-01 00:00:00+01:00"),
            Some(-3_600_000_000)
        );
        assert_eq!(parse_timestamp("not a timestamp"), None);
        assert_eq!(parse_timestamp("2026-02-29 00:00:00"), None);
        assert_eq!(parse_timestamp("2026-04-31"), None);
        assert!(parse_timestamp("2028-02-29 00:00:00").is_some());
        // A 12-hour clock.
        for (text, read) in [
            ("2026-11-22 1:30 PM", "2026-11-22 13:30:00"),
            ("2026-11-22 12:05:09 am", "2026-11-22 00:05:09"),
            ("2026-11-22 12:00 PM", "2026-11-22 12:00:00"),
            ("2026-11-22 11:59:59.5pm", "2026-11-22 23:59:59.5"),
        ] {
            assert_eq!(
                parse_timestamp(text).map(format_timestamp).as_deref(),
                Some(read)
            );
        }
        assert_eq!(parse_timestamp("2026-11-22 13:30 PM"), None);
        assert_eq!(parse_timestamp("2026-11-22 0:30 AM"), None);
        // A fraction is rounded to the microsecond; a short one is padded.
        assert_eq!(
            parse_timestamp("1970-01-01 00:00:00.1234567"),
            Some(123_457)
        );
        assert_eq!(
            parse_timestamp("1970-01-01 00:00:00.12345649"),
            Some(123_456)
        );
        assert_eq!(
            parse_timestamp("1970-01-01 00:00:00.9999995"),
            Some(1_000_000)
        );
        assert_eq!(parse_timestamp("1970-01-01 00:00:00.001"), Some(1_000));
        assert_eq!(parse_timestamp("1970-01-01 00:00:00.0x1"), None);
        assert_eq!(format_timestamp(-1), "1969-12-31 23:59:59.999999");
        assert_eq!(format_timestamp(10), "1970-01-01 00:00:00.00001");
        assert_eq!(
            format_timestamp(parse_timestamp("0099-03-01 23:59:59.5").unwrap()),
            "0099-03-01 23:59:59.5"
        );
        assert_eq!(
            format_timestamp(parse_timestamp("9999-12-31 23:59:59.999999").unwrap() + 1),
            "10000-01-01 00:00:00"
        );
    }

    /// The fast form reads what it accepts exactly as the general one does, and leaves
    /// everything else to it.
    #[test]
    fn plain_timestamps_read_as_the_general_form() {
        let plain = [
            "2026-11-22 10:00:00",
            "2026-11-22T10:00:00",
            "2026-11-22 23:59:60.5",
            "1970-01-01 00:00:00.000001",
            "1969-12-31 23:59:59.9999995",
            "0001-03-01 24:00:00.123456789",
        ];
        for t in plain {
            let fast = parse_plain_timestamp(t.as_bytes());
            assert!(fast.is_some(), "{t}");
            assert_eq!(fast, parse_any_timestamp(t), "{t}");
        }
        let other = [
            "2026-11-22",
            " 2026-11-22 10:00:00",
            "2026-11-22 10:00:00 ",
            "2026-11-22 10:00:00.",
            "2026-11-22 10:00:00Z",
            "2026-11-22 10:00:00+01",
            "2026-11-22  10:00:00",
            "2026-13-22 10:00:00",
            "2026-02-31 10:00:00",
            "2026-11-22 10:60:00",
            "2026-11-22 10:00:00.1x",
            "+026-11-22 10:00:00",
        ];
        for t in other {
            assert_eq!(parse_plain_timestamp(t.as_bytes()), None, "{t}");
        }
        assert_eq!(
            parse_timestamp("2026-11-22 10:00:00."),
            parse_any_timestamp("2026-11-22 10:00:00")
        );
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration_us("5 minutes"), Some(300_000_000));
        assert_eq!(parse_duration_us("1 hour 30 minutes"), Some(5_400_000_000));
        assert_eq!(parse_duration_us("500ms"), Some(500_000));
        assert_eq!(parse_duration_us("5 fortnights"), None);
        assert_eq!(format_duration_us(300_000_000), "5 MINUTES");
        assert_eq!(format_duration_us(1_000), "1 MILLISECOND");
    }

    #[test]
    fn reals_format_like_postgres() {
        assert_eq!(format_float4("123456.789".parse().unwrap()), "123456.79");
        assert_eq!(format_float4(1e20), "1e+20");
        assert_eq!(format_float4(12345678.9), "1.2345679e+07");
        assert_eq!(format_float4(0.1), "0.1");
    }

    #[test]
    fn floats_format_like_postgres() {
        assert_eq!(format_float(12.5), "12.5");
        assert_eq!(format_float(3.0), "3");
        assert_eq!(format_float(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(format_float(f64::NAN), "NaN");
        assert_eq!(format_float(1e20), "1e+20");
        assert_eq!(format_float(1.5e-7), "1.5e-07");
        // Each side of the plain range, as PostgreSQL 15 prints them.
        assert_eq!(format_float(0.0001), "0.0001");
        assert_eq!(format_float(-0.00001), "-1e-05");
        assert_eq!(format_float(999999999999999.0), "999999999999999");
        assert_eq!(format_float(1e15), "1e+15");
        assert_eq!(format_float(-1.25e300), "-1.25e+300");
        assert_eq!(format_float(f64::NEG_INFINITY), "-Infinity");
        assert_eq!(format_float(-0.0), "-0");
        assert_eq!(format_float4(0.0001), "0.0001");
        assert_eq!(format_float4(999999.0), "999999");
        assert_eq!(format_float4(1e6), "1e+06");
    }

    #[test]
    fn float_values_hash_as_equal() {
        assert_eq!(Value::Float(0.0), Value::Float(-0.0));
        assert_ne!(Value::Int(1), Value::Float(1.0));
    }
}
