//! Result cells and their PostgreSQL encodings, text and binary.
//!
//! Invariant: text output matches PostgreSQL's own formatting (floats shortest-exact,
//! timestamps ISO, booleans t/f), so psql and sqllogictest see what PostgreSQL would show.

use std::fmt::Write as _;
use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use chrono::{DateTime, NaiveDate};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Date32Array, Decimal128Array, Float32Array,
    Float64Array, Int16Array, Int32Array, Int64Array, Int8Array, LargeBinaryArray,
    Time64MicrosecondArray, TimestampMicrosecondArray, UInt16Array, UInt32Array, UInt64Array,
    UInt8Array,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, IntervalUnit, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use pgwire::api::results::{FieldFormat, FieldInfo};
use pgwire::api::Type;
use pgwire::error::PgWireResult;
use pgwire::messages::data::DataRow;
use pgwire::types::format::FormatOptions;
use pgwire::types::ToSqlText;
use postgres_types::{IsNull, ToSql};
use rust_decimal::Decimal;

use eddy_planner::aggregate::ResultType;
use eddy_planner::types::{format_float, format_timestamp, ColumnType, Text, Value};

/// One result value, typed for the wire.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    Null,
    Bool(bool),
    I32(i32),
    I64(i64),
    F32(f32),
    F64(f64),
    /// Shared with the value it came from, and inline when short: no copy per row.
    Text(Text),
    /// Microseconds since the Unix epoch.
    Timestamp(i64),
    /// An instant (TIMESTAMPTZ), microseconds since the Unix epoch in UTC.
    TimestampTz(i64),
    /// Days since the Unix epoch.
    Date(i32),
    /// A time of day, microseconds since midnight.
    Time(i64),
    /// An interval: PostgreSQL's months, days and microseconds, each kept apart.
    Interval {
        months: i32,
        days: i32,
        micros: i64,
    },
    /// A bytea's bytes.
    Bytes(Vec<u8>),
    Numeric(i128, u32),
}

/// A result column: its name and PostgreSQL type.
#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    pub name: String,
    pub ty: Type,
}

impl Column {
    pub fn new(name: impl Into<String>, ty: Type) -> Column {
        Column {
            name: name.into(),
            ty,
        }
    }

    pub fn text(name: impl Into<String>) -> Column {
        Column::new(name, Type::TEXT)
    }
}

/// The PostgreSQL type of an Eddy column or aggregate result.
pub fn pg_type(ty: ResultType) -> Type {
    match ty {
        ResultType::Numeric => Type::NUMERIC,
        ResultType::Column(c) => match c {
            ColumnType::Boolean => Type::BOOL,
            ColumnType::Int32 => Type::INT4,
            ColumnType::Int64 => Type::INT8,
            ColumnType::Float32 => Type::FLOAT4,
            ColumnType::Float64 => Type::FLOAT8,
            ColumnType::Text => Type::TEXT,
            ColumnType::Timestamp => Type::TIMESTAMP,
            ColumnType::TimestampTz => Type::TIMESTAMPTZ,
        },
    }
}

/// The PostgreSQL type shown for an Arrow type.
pub fn pg_type_of_arrow(dt: &DataType) -> Type {
    match dt {
        DataType::Boolean => Type::BOOL,
        DataType::Int8 | DataType::Int16 | DataType::UInt8 | DataType::Int32 => Type::INT4,
        DataType::UInt16 => Type::INT4,
        DataType::Int64 | DataType::UInt32 | DataType::UInt64 => Type::INT8,
        DataType::Float16 | DataType::Float32 => Type::FLOAT4,
        DataType::Float64 => Type::FLOAT8,
        DataType::Timestamp(_, Some(_)) => Type::TIMESTAMPTZ,
        DataType::Timestamp(_, None) => Type::TIMESTAMP,
        DataType::Date32 | DataType::Date64 => Type::DATE,
        DataType::Time32(_) | DataType::Time64(_) => Type::TIME,
        DataType::Interval(_) | DataType::Duration(_) => Type::INTERVAL,
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => Type::BYTEA,
        DataType::Decimal128(_, _) => Type::NUMERIC,
        _ => Type::TEXT,
    }
}

/// Converts an Eddy value to a cell of the given result type.
pub fn cell_of(v: &Value, ty: ResultType) -> Cell {
    match (v, ty) {
        (Value::Null, _) => Cell::Null,
        (Value::Bool(b), _) => Cell::Bool(*b),
        (Value::Int(i), ResultType::Column(ColumnType::Int32)) => Cell::I32(*i as i32),
        (Value::Int(i), ResultType::Numeric) => Cell::Numeric(*i as i128, 0),
        (Value::Int(i), _) => Cell::I64(*i),
        (Value::Numeric(n), _) => Cell::Numeric(n.get(), 0),
        (Value::Float(f), ResultType::Column(ColumnType::Float32)) => Cell::F32(*f as f32),
        (Value::Float(f), _) => Cell::F64(*f),
        (Value::Text(s), _) => Cell::Text(s.clone()),
        (Value::Timestamp(t), ResultType::Column(ColumnType::TimestampTz)) => Cell::TimestampTz(*t),
        (Value::Timestamp(t), _) => Cell::Timestamp(*t),
    }
}

/// The cells of one Arrow column.
pub fn cells_of_array(array: &ArrayRef) -> Vec<Cell> {
    let n = array.len();
    let mut out = Vec::with_capacity(n);
    // `prim!(ArrayType, cell)` reads the column itself; `prim!(as DataType, ArrayType,
    // cell)` reads the column cast to `DataType` first.
    macro_rules! prim {
        (as $to:expr, $ty:ty, $variant:expr) => {{
            let casted = cast(array, &$to).unwrap_or_else(|_| array.clone());
            prim!(@ casted, $ty, $variant)
        }};
        ($ty:ty, $variant:expr) => {
            prim!(@ array, $ty, $variant)
        };
        (@ $array:expr, $ty:ty, $variant:expr) => {{
            let a = $array.as_any().downcast_ref::<$ty>().expect("array type");
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Cell::Null
                } else {
                    $variant(a.value(i))
                });
            }
        }};
    }
    match array.data_type() {
        DataType::Null => out.resize(n, Cell::Null),
        DataType::Boolean => prim!(BooleanArray, Cell::Bool),
        DataType::Int8 => prim!(Int8Array, |v: i8| Cell::I32(v as i32)),
        DataType::Int16 => prim!(Int16Array, |v: i16| Cell::I32(v as i32)),
        DataType::Int32 => prim!(Int32Array, Cell::I32),
        DataType::Int64 => prim!(Int64Array, Cell::I64),
        DataType::UInt8 => prim!(UInt8Array, |v: u8| Cell::I32(v as i32)),
        DataType::UInt16 => prim!(UInt16Array, |v: u16| Cell::I32(v as i32)),
        DataType::UInt32 => prim!(UInt32Array, |v: u32| Cell::I64(v as i64)),
        DataType::UInt64 => prim!(UInt64Array, |v: u64| Cell::I64(v as i64)),
        DataType::Float32 => prim!(Float32Array, Cell::F32),
        DataType::Float64 => prim!(Float64Array, Cell::F64),
        DataType::Decimal128(_, scale) => {
            let scale = (*scale).max(0) as u32;
            prim!(Decimal128Array, |v: i128| Cell::Numeric(v, scale))
        }
        DataType::Interval(_) | DataType::Duration(_) => {
            let months_days_nanos = |i: usize| -> (i32, i32, i64) {
                use datafusion::arrow::datatypes::{
                    DurationMicrosecondType as DUs, DurationMillisecondType as DMs,
                    DurationNanosecondType as DNs, DurationSecondType as DS,
                    IntervalDayTimeType as DT, IntervalMonthDayNanoType as MDN,
                    IntervalYearMonthType as YM,
                };
                match array.data_type() {
                    DataType::Interval(IntervalUnit::MonthDayNano) => {
                        let v = array.as_primitive::<MDN>().value(i);
                        (v.months, v.days, v.nanoseconds)
                    }
                    DataType::Interval(IntervalUnit::DayTime) => {
                        let v = array.as_primitive::<DT>().value(i);
                        (0, v.days, v.milliseconds as i64 * 1_000_000)
                    }
                    DataType::Interval(IntervalUnit::YearMonth) => {
                        (array.as_primitive::<YM>().value(i), 0, 0)
                    }
                    DataType::Duration(TimeUnit::Second) => (
                        0,
                        0,
                        array
                            .as_primitive::<DS>()
                            .value(i)
                            .saturating_mul(1_000_000_000),
                    ),
                    DataType::Duration(TimeUnit::Millisecond) => (
                        0,
                        0,
                        array
                            .as_primitive::<DMs>()
                            .value(i)
                            .saturating_mul(1_000_000),
                    ),
                    DataType::Duration(TimeUnit::Microsecond) => (
                        0,
                        0,
                        array.as_primitive::<DUs>().value(i).saturating_mul(1_000),
                    ),
                    _ => (0, 0, array.as_primitive::<DNs>().value(i)),
                }
            };
            // A duration (`timestamp - timestamp`) has its whole days apart, as
            // PostgreSQL's difference of timestamps does (`justify_hours`).
            let duration = matches!(array.data_type(), DataType::Duration(_));
            const DAY_NS: i64 = 86_400_000_000_000;
            for i in 0..n {
                out.push(if array.is_null(i) {
                    Cell::Null
                } else {
                    let (m, d, ns) = months_days_nanos(i);
                    let (days, ns) = match duration {
                        true => (d.saturating_add((ns / DAY_NS) as i32), ns % DAY_NS),
                        false => (d, ns),
                    };
                    Cell::Interval {
                        months: m,
                        days,
                        micros: ns / 1_000,
                    }
                });
            }
        }
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => prim!(
            as DataType::LargeBinary,
            LargeBinaryArray,
            |v: &[u8]| Cell::Bytes(v.to_vec())
        ),
        DataType::List(_) => {
            let a = array.as_list::<i32>();
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Cell::Null
                } else {
                    Cell::text(array_text(&a.value(i)))
                });
            }
        }
        DataType::Date32 | DataType::Date64 => prim!(as DataType::Date32, Date32Array, Cell::Date),
        DataType::Timestamp(_, zone) => {
            let zoned = zone.is_some();
            prim!(
                as DataType::Timestamp(TimeUnit::Microsecond, None),
                TimestampMicrosecondArray,
                |v: i64| match zoned {
                    true => Cell::TimestampTz(v),
                    false => Cell::Timestamp(v),
                }
            )
        }
        DataType::Time32(_) | DataType::Time64(_) => prim!(
            as DataType::Time64(TimeUnit::Microsecond),
            Time64MicrosecondArray,
            Cell::Time
        ),
        _ => {
            let casted = cast(array, &DataType::Utf8).ok();
            match casted.as_ref().map(|c| c.as_string::<i32>()) {
                Some(a) => {
                    for i in 0..n {
                        out.push(if a.is_null(i) {
                            Cell::Null
                        } else {
                            Cell::text(a.value(i))
                        });
                    }
                }
                None => out.resize(n, Cell::text(format!("<{}>", array.data_type()))),
            }
        }
    }
    out
}

/// PostgreSQL's text form of an interval (IntervalStyle `postgres`): `1 year 2 mons
/// 3 days 04:05:06.5`, the clock part omitted when zero unless nothing else is there.
/// As PostgreSQL's, a part after a negative one has its sign even when positive
/// (`-1 days +02:03:00`).
pub fn interval_text(months: i32, days: i32, nanos: i64) -> String {
    let mut parts = Vec::new();
    // Whether the part before was negative.
    let mut before = false;
    let mut unit = |n: i64, one: &str, many: &str| {
        let plus = if before && n > 0 { "+" } else { "" };
        before = n < 0;
        format!("{plus}{n} {}", if n == 1 { one } else { many })
    };
    let (years, months) = (months / 12, months % 12);
    if years != 0 {
        parts.push(unit(years as i64, "year", "years"));
    }
    if months != 0 {
        parts.push(unit(months as i64, "mon", "mons"));
    }
    if days != 0 {
        parts.push(unit(days as i64, "day", "days"));
    }
    if nanos != 0 || parts.is_empty() {
        let sign = match nanos {
            n if n < 0 => "-",
            n if n > 0 && before => "+",
            _ => "",
        };
        parts.push(format!(
            "{sign}{}",
            clock_text((nanos / 1_000).unsigned_abs())
        ));
    }
    parts.join(" ")
}

/// PostgreSQL's text form of a bytea (`bytea_output = hex`): `\x` and two hex digits a
/// byte.
fn bytea_text(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(2 + 2 * bytes.len());
    text.push_str("\\x");
    for b in bytes {
        let _ = write!(text, "{b:02x}");
    }
    text
}

/// PostgreSQL's text form of a time of day: `09:30:30`, with the fraction's trailing
/// zeros dropped (`09:30:30.5`).
fn time_text(us: i64) -> String {
    clock_text(us.max(0) as u64)
}

/// `hh:mm:ss` of `us` microseconds, with the fraction's trailing zeros dropped; an
/// interval's clock part and a time of day.
fn clock_text(us: u64) -> String {
    let (secs, frac) = (us / 1_000_000, us % 1_000_000);
    let mut text = format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60);
    if frac != 0 {
        text.push_str(format!(".{frac:06}").trim_end_matches('0'));
    }
    text
}

/// PostgreSQL's text form of an array: `{a,b}`, an element quoted when it is empty,
/// holds a delimiter, quote, backslash or space, or reads as NULL.
fn array_text(values: &ArrayRef) -> String {
    let items: Vec<String> = cells_of_array(values)
        .iter()
        .map(|c| match c.to_text() {
            None => "NULL".to_string(),
            Some(t) => {
                let plain = !t.is_empty()
                    && !t.eq_ignore_ascii_case("null")
                    && !t.chars().any(|ch| "{},\"\\ \t\n".contains(ch));
                if plain {
                    t
                } else {
                    format!("\"{}\"", t.replace('\\', "\\\\").replace('"', "\\\""))
                }
            }
        })
        .collect();
    format!("{{{}}}", items.join(","))
}

/// Rows of cells from Arrow batches.
pub fn rows_of_batches(batches: &[RecordBatch]) -> Vec<Vec<Cell>> {
    let mut rows = Vec::new();
    for batch in batches {
        let columns: Vec<Vec<Cell>> = batch.columns().iter().map(cells_of_array).collect();
        for r in 0..batch.num_rows() {
            rows.push(columns.iter().map(|c| c[r].clone()).collect());
        }
    }
    rows
}

fn epoch_2000_us() -> i64 {
    946_684_800_000_000
}

impl Cell {
    /// A text cell.
    pub fn text(s: impl Into<Text>) -> Cell {
        Cell::Text(s.into())
    }

    /// PostgreSQL's text output of the value (`None` for NULL).
    /// `to_text`, written at the end of `out`; `false` for NULL.
    pub fn write_text(&self, out: &mut String) -> bool {
        match self {
            Cell::Null => return false,
            Cell::Bool(b) => out.push(if *b { 't' } else { 'f' }),
            Cell::I32(v) => out.push_str(itoa::Buffer::new().format(*v)),
            Cell::I64(v) => out.push_str(itoa::Buffer::new().format(*v)),
            Cell::F32(v) => eddy_planner::types::write_float4(*v, out),
            Cell::F64(v) => eddy_planner::types::write_float(*v, out),
            Cell::Text(s) => out.push_str(s.as_str()),
            Cell::Timestamp(us) => eddy_planner::types::write_timestamp(*us, out),
            other => out.push_str(&other.to_text().unwrap_or_default()),
        }
        true
    }

    pub fn to_text(&self) -> Option<String> {
        Some(match self {
            Cell::Null => return None,
            Cell::Bool(b) => if *b { "t" } else { "f" }.to_string(),
            Cell::I32(v) => v.to_string(),
            Cell::I64(v) => v.to_string(),
            Cell::F32(v) => eddy_planner::types::format_float4(*v),
            Cell::F64(v) => format_float(*v),
            Cell::Text(s) => s.as_str().to_owned(),
            Cell::Timestamp(us) => format_timestamp(*us),
            Cell::TimestampTz(us) => format_timestamptz(*us, chrono_tz::UTC),
            Cell::Date(d) => format_timestamp(*d as i64 * 86_400_000_000)[..10].to_string(),
            Cell::Time(us) => time_text(*us),
            Cell::Interval {
                months,
                days,
                micros,
            } => interval_text(*months, *days, micros.saturating_mul(1_000)),
            Cell::Numeric(v, scale) => decimal_text(*v, *scale),
            Cell::Bytes(b) => bytea_text(b),
        })
    }

    fn encode(&self, enc: &mut RowWriter, field: &FieldInfo) -> PgWireResult<()> {
        let ty = field.datatype();
        if field.format() == FieldFormat::Text {
            let text = match self {
                Cell::TimestampTz(us) => Some(format_timestamptz(
                    *us,
                    time_zone(&field.format_options().time_zone).unwrap_or(chrono_tz::UTC),
                )),
                other => other.to_text(),
            };
            return enc.field(&text, ty, FieldFormat::Text, field.format_options());
        }
        let opts = field.format_options();
        let bin = FieldFormat::Binary;
        match self {
            Cell::Null => enc.field(&None::<i64>, ty, bin, opts),
            Cell::Bool(b) => enc.field(b, ty, bin, opts),
            Cell::I32(v) if *ty == Type::INT8 => enc.field(&(*v as i64), ty, bin, opts),
            Cell::I32(v) => enc.field(v, ty, bin, opts),
            Cell::I64(v) => enc.field(v, ty, bin, opts),
            Cell::F32(v) => enc.field(v, ty, bin, opts),
            Cell::F64(v) => enc.field(v, ty, bin, opts),
            // jsonb's binary form is a version byte, then the text.
            Cell::Text(s) if *ty == Type::JSONB => {
                let bytes = [&[1u8][..], s.as_bytes()].concat();
                enc.field(&bytes.as_slice(), ty, bin, opts)
            }
            // A numeric held as its text (`pg_catalog::numeric`).
            Cell::Text(s) if *ty == Type::NUMERIC => {
                let d = s.parse::<Decimal>().ok();
                enc.field(&d, ty, bin, opts)
            }
            Cell::Text(s) => enc.field(&s.as_str(), ty, bin, opts),
            Cell::Timestamp(us) => {
                let t = DateTime::from_timestamp_micros(*us).map(|d| d.naive_utc());
                enc.field(&t, ty, bin, opts)
            }
            Cell::TimestampTz(us) => {
                let t = DateTime::from_timestamp_micros(*us);
                enc.field(&t, ty, bin, opts)
            }
            Cell::Date(d) => {
                let date = NaiveDate::from_ymd_opt(1970, 1, 1)
                    .and_then(|e| e.checked_add_signed(chrono::Duration::days(*d as i64)));
                enc.field(&date, ty, bin, opts)
            }
            Cell::Numeric(v, scale) => {
                let d = Decimal::try_from_i128_with_scale(*v, *scale).ok();
                enc.field(&d, ty, bin, opts)
            }
            Cell::Bytes(b) => enc.field(&b.as_slice(), ty, bin, opts),
            // PostgreSQL's binary forms: a time is its microseconds since midnight; an
            // interval its microseconds, then its days, then its months.
            Cell::Time(us) => enc.field(&us.to_be_bytes().as_slice(), ty, bin, opts),
            Cell::Interval {
                months,
                days,
                micros,
            } => {
                let mut bytes = [0u8; 16];
                bytes[..8].copy_from_slice(&micros.to_be_bytes());
                bytes[8..12].copy_from_slice(&days.to_be_bytes());
                bytes[12..].copy_from_slice(&months.to_be_bytes());
                enc.field(&bytes.as_slice(), ty, bin, opts)
            }
        }
    }
}

/// A time zone as `SET TimeZone` names it: an IANA name (`Europe/Paris`), `UTC`, or
/// PostgreSQL's `GMT`, `Z` and `localtime` (this server runs in UTC).
pub fn time_zone(name: &str) -> Option<chrono_tz::Tz> {
    let name = name.trim().trim_matches('\'');
    match name.to_ascii_lowercase().as_str() {
        "utc" | "gmt" | "z" | "zulu" | "localtime" | "default" | "etc/utc" => Some(chrono_tz::UTC),
        _ => name.parse().ok(),
    }
}

/// PostgreSQL's text of an instant in `zone`: `2026-01-01 11:00:00+01`, with `:30` when the
/// offset has minutes and the fraction only when there is one.
pub fn format_timestamptz(us: i64, zone: chrono_tz::Tz) -> String {
    use chrono::{Offset, TimeZone};
    let Some(utc) = DateTime::from_timestamp_micros(us) else {
        return format_timestamp(us);
    };
    let local = zone.from_utc_datetime(&utc.naive_utc());
    let offset = local.offset().fix().local_minus_utc();
    let wall = format_timestamp(us + offset as i64 * 1_000_000);
    let sign = if offset < 0 { '-' } else { '+' };
    let (h, m) = (offset.abs() / 3600, offset.abs() / 60 % 60);
    if m == 0 {
        format!("{wall}{sign}{h:02}")
    } else {
        format!("{wall}{sign}{h:02}:{m:02}")
    }
}

fn decimal_text(v: i128, scale: u32) -> String {
    if scale == 0 {
        return v.to_string();
    }
    let neg = v < 0;
    let digits = v.unsigned_abs().to_string();
    let scale = scale as usize;
    let padded = if digits.len() <= scale {
        format!("{}{}", "0".repeat(scale + 1 - digits.len()), digits)
    } else {
        digits
    };
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{}{int}.{frac}", if neg { "-" } else { "" })
}

/// Field descriptions for columns, with the client's requested formats.
pub fn fields(
    columns: &[Column],
    format_for: &dyn Fn(usize) -> FieldFormat,
    options: &Arc<FormatOptions>,
) -> Arc<Vec<FieldInfo>> {
    Arc::new(
        columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                FieldInfo::new(c.name.clone(), None, None, c.ty.clone(), format_for(i))
                    .with_format_options(options.clone())
            })
            .collect(),
    )
}

/// Bytes of the buffer rows are written into; each row is a slice of it.
const ROW_BLOCK_BYTES: usize = 64 * 1024;

/// Writes DataRow messages into one buffer that many rows share: a row is a slice of
/// it, not an allocation of its own, and the buffer does not grow field by field.
struct RowWriter {
    buf: BytesMut,
    fields: i16,
}

impl RowWriter {
    fn new(rows: usize) -> RowWriter {
        RowWriter {
            buf: BytesMut::with_capacity((rows * 128).clamp(256, ROW_BLOCK_BYTES)),
            fields: 0,
        }
    }

    /// One field: its length (-1 for NULL), then its bytes in `format`.
    fn field<T: ToSql + ToSqlText>(
        &mut self,
        value: &T,
        ty: &Type,
        format: FieldFormat,
        options: &FormatOptions,
    ) -> PgWireResult<()> {
        let at = self.buf.len();
        self.buf.put_i32(-1);
        let null = match format {
            FieldFormat::Text => value.to_sql_text(ty, &mut self.buf, options)?,
            FieldFormat::Binary => value.to_sql(ty, &mut self.buf)?,
        };
        if let IsNull::No = null {
            let len = (self.buf.len() - at - 4) as i32;
            self.buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
        }
        self.fields += 1;
        Ok(())
    }

    fn take_row(&mut self) -> DataRow {
        let row = DataRow::new(self.buf.split(), self.fields);
        self.fields = 0;
        if self.buf.capacity() < 1024 {
            self.buf.reserve(ROW_BLOCK_BYTES);
        }
        row
    }
}

/// Encodes rows for the wire.
pub fn encode_rows(
    fields: &Arc<Vec<FieldInfo>>,
    rows: Vec<Vec<Cell>>,
) -> Vec<PgWireResult<DataRow>> {
    let mut enc = RowWriter::new(rows.len());
    rows.into_iter()
        .map(|row| {
            for (cell, field) in row.iter().zip(fields.iter()) {
                cell.encode(&mut enc, field)?;
            }
            Ok(enc.take_row())
        })
        .collect()
}

/// Microseconds since the Unix epoch from a binary TIMESTAMP parameter (saturating:
/// PostgreSQL's `infinity` is `i64::MAX`, and no reader accepts either end).
pub fn timestamp_from_pg_binary(us_since_2000: i64) -> i64 {
    us_since_2000.saturating_add(epoch_2000_us())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_text() {
        assert_eq!(decimal_text(12345, 2), "123.45");
        assert_eq!(decimal_text(-5, 3), "-0.005");
        assert_eq!(decimal_text(7, 0), "7");
    }

    #[test]
    fn instants_print_in_the_session_zone() {
        let us = 1_767_261_600_000_000; // 2026-01-01 10:00:00 UTC
        assert_eq!(
            format_timestamptz(us, chrono_tz::UTC),
            "2026-01-01 10:00:00+00"
        );
        let paris = time_zone("Europe/Paris").unwrap();
        assert_eq!(format_timestamptz(us, paris), "2026-01-01 11:00:00+01");
        assert_eq!(
            format_timestamptz(us + 500_000, paris),
            "2026-01-01 11:00:00.5+01"
        );
        let kolkata = time_zone("'Asia/Kolkata'").unwrap();
        assert_eq!(format_timestamptz(us, kolkata), "2026-01-01 15:30:00+05:30");
        let ny = time_zone("America/New_York").unwrap();
        assert_eq!(format_timestamptz(us, ny), "2026-01-01 05:00:00-05");
        assert_eq!(time_zone("Mars/Base"), None);
        assert_eq!(time_zone("utc"), Some(chrono_tz::UTC));
    }

    #[test]
    fn intervals_print_as_postgresql_does() {
        let hour = 3_600_000_000_000;
        assert_eq!(interval_text(0, 0, hour), "01:00:00");
        assert_eq!(interval_text(0, 0, 0), "00:00:00");
        assert_eq!(interval_text(14, 1, 0), "1 year 2 mons 1 day");
        assert_eq!(
            interval_text(0, 3, hour / 2 + 500_000_000),
            "3 days 00:30:00.5"
        );
        assert_eq!(interval_text(0, 0, -90 * 60 * 1_000_000_000), "-01:30:00");
        assert_eq!(
            interval_text(0, -1, 2 * hour + 180_000_000_000),
            "-1 days +02:03:00"
        );
        assert_eq!(interval_text(-10, 3, -hour), "-10 mons +3 days -01:00:00");
    }

    #[test]
    fn durations_print_their_whole_days_apart() {
        use datafusion::arrow::array::DurationMicrosecondArray;
        let hour = 3_600_000_000;
        let durations: ArrayRef = std::sync::Arc::new(DurationMicrosecondArray::from(vec![
            25 * hour,
            -25 * hour,
            hour / 2,
        ]));
        let texts: Vec<_> = cells_of_array(&durations)
            .iter()
            .map(|c| c.to_text().unwrap())
            .collect();
        assert_eq!(texts, ["1 day 01:00:00", "-1 days -01:00:00", "00:30:00"]);
    }

    #[test]
    fn arrays_print_as_postgresql_does() {
        use datafusion::arrow::array::{ListBuilder, StringBuilder};
        let mut b = ListBuilder::new(StringBuilder::new());
        b.values().append_value("a");
        b.values().append_value("b c");
        b.values().append_null();
        b.append(true);
        b.append(true);
        b.append(false);
        let list: ArrayRef = std::sync::Arc::new(b.finish());
        let cells = cells_of_array(&list);
        assert_eq!(cells[0].to_text().as_deref(), Some("{a,\"b c\",NULL}"));
        assert_eq!(cells[1].to_text().as_deref(), Some("{}"));
        assert_eq!(cells[2].to_text(), None);
    }
}
