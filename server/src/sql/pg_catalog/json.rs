//! PostgreSQL's `json` and `jsonb` in ad-hoc queries.
//!
//! A value of either type is its text (Arrow `Utf8`) in a field marked with the type's name
//! (`PG_TYPE` in the field's metadata), so functions and operators know a JSON argument
//! from a text one: `json_build_object('k', j)` embeds `j` when it is JSON and quotes it
//! when it is text, and `||` joins two jsonb values where it concatenates texts.
//!
//! - `json` keeps its input text as written; `jsonb` is kept in its normal form, as
//!   PostgreSQL prints it: keys in order (shorter first, then bytewise), the last of
//!   duplicate keys, `": "` and `", "` between parts, numbers as `numeric` prints them.
//!   So an element read out of either (`->`) is a slice of the text, already in the form
//!   its type prints.
//! - Casts (`::json`, `::jsonb`) check the text (22P02); `to_json`, the builders and
//!   `row_to_json` write SQL values as PostgreSQL does: timestamps in ISO 8601, records
//!   and arrays without spaces, `json_build_object` with `" : "`.
//! - `json_agg`, `jsonb_agg`, `json_object_agg` and `jsonb_object_agg` are `array_agg`
//!   of each row's JSON text, joined (the rewrite, `aggregate_call`), so `ORDER BY`,
//!   `DISTINCT` and `FILTER` in the call work as for `array_agg`.
//! - `->`, `->>`, `#>`, `#>>`, `?`, and `||` and `-` on jsonb, are planned by
//!   [`JsonPlanner`] into the functions here.
//! - `json_each` and `json_each_text` are table functions of a constant.

use std::fmt::Write as _;
use std::hash::Hash;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{TableFunctionImpl, TableProvider};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::datasource::MemTable;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::planner::{ExprPlanner, PlannerResult, RawBinaryExpr};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ExprSchemable, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, TypeSignature, Volatility,
};
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::BinaryOperator;

use eddy_planner::ErrorKind;

use super::arith::external;

/// The metadata key that marks a text field as `json` or `jsonb`.
pub const PG_TYPE: &str = "eddy.pg_type";

/// Which of PostgreSQL's two JSON types a value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Json,
    Jsonb,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Json => "json",
            Kind::Jsonb => "jsonb",
        }
    }

    /// The JSON type a field holds, from its metadata.
    pub fn of(field: &Field) -> Option<Kind> {
        match field.metadata().get(PG_TYPE).map(String::as_str) {
            Some("json") => Some(Kind::Json),
            Some("jsonb") => Some(Kind::Jsonb),
            _ => None,
        }
    }

    /// The text a function of this type returns for `text`, a JSON document it built
    /// in `json`'s form: as it is, or in jsonb's normal form.
    fn finish(self, text: String) -> Result<String> {
        match self {
            Kind::Json => Ok(text),
            Kind::Jsonb => normal(&text),
        }
    }
}

fn invalid(detail: &str) -> DataFusionError {
    external(
        ErrorKind::InvalidText,
        &format!("invalid input syntax for type json: {detail}"),
    )
}

// ---- Parsing -------------------------------------------------------------------------

/// A parsed JSON value and the text it was parsed from.
#[derive(Debug)]
struct Node<'a> {
    raw: &'a str,
    value: Value<'a>,
}

#[derive(Debug)]
enum Value<'a> {
    Null,
    Bool(bool),
    Number(&'a str),
    String(String),
    Array(Vec<Node<'a>>),
    Object(Vec<(String, Node<'a>)>),
}

impl Value<'_> {
    fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }
}

/// Parses a whole JSON document (RFC 8259, as PostgreSQL reads it).
fn parse(text: &str) -> Result<Node<'_>> {
    let mut p = Parser { text, at: 0 };
    p.space();
    let node = p.value(0)?;
    p.space();
    if p.at != text.len() {
        return Err(invalid(&format!(
            "Token \"{}\" is invalid.",
            p.token_at(p.at)
        )));
    }
    Ok(node)
}

struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Parser<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn peek(&self) -> Option<u8> {
        self.bytes().get(self.at).copied()
    }

    fn space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn token_at(&self, at: usize) -> &'a str {
        let rest = &self.text[at..];
        let end = rest
            .char_indices()
            .find(|(i, c)| *i > 0 && !c.is_alphanumeric())
            .map_or(rest.len(), |(i, _)| i);
        &rest[..end]
    }

    fn end(&self) -> DataFusionError {
        invalid("The input string ended unexpectedly.")
    }

    fn value(&mut self, depth: usize) -> Result<Node<'a>> {
        if depth > 6400 {
            return Err(external(
                ErrorKind::ProgramLimitExceeded,
                "stack depth limit exceeded",
            ));
        }
        let start = self.at;
        let value = match self.peek().ok_or_else(|| self.end())? {
            b'{' => {
                self.at += 1;
                let mut members = Vec::new();
                self.space();
                if self.peek() == Some(b'}') {
                    self.at += 1;
                } else {
                    loop {
                        self.space();
                        if self.peek() != Some(b'"') {
                            return Err(self.unexpected());
                        }
                        let key = self.string()?;
                        self.space();
                        if self.peek() != Some(b':') {
                            return Err(self.unexpected());
                        }
                        self.at += 1;
                        self.space();
                        let v = self.value(depth + 1)?;
                        members.push((key, v));
                        self.space();
                        match self.peek() {
                            Some(b',') => self.at += 1,
                            Some(b'}') => {
                                self.at += 1;
                                break;
                            }
                            _ => return Err(self.unexpected()),
                        }
                    }
                }
                Value::Object(members)
            }
            b'[' => {
                self.at += 1;
                let mut items = Vec::new();
                self.space();
                if self.peek() == Some(b']') {
                    self.at += 1;
                } else {
                    loop {
                        self.space();
                        items.push(self.value(depth + 1)?);
                        self.space();
                        match self.peek() {
                            Some(b',') => self.at += 1,
                            Some(b']') => {
                                self.at += 1;
                                break;
                            }
                            _ => return Err(self.unexpected()),
                        }
                    }
                }
                Value::Array(items)
            }
            b'"' => Value::String(self.string()?),
            b'-' | b'0'..=b'9' => Value::Number(self.number()?),
            _ => {
                let word = self.token_at(self.at);
                let value = match word {
                    "true" => Value::Bool(true),
                    "false" => Value::Bool(false),
                    "null" => Value::Null,
                    _ => return Err(self.unexpected()),
                };
                self.at += word.len();
                value
            }
        };
        Ok(Node {
            raw: &self.text[start..self.at],
            value,
        })
    }

    fn unexpected(&self) -> DataFusionError {
        if self.at >= self.text.len() {
            return self.end();
        }
        invalid(&format!("Token \"{}\" is invalid.", self.token_at(self.at)))
    }

    fn number(&mut self) -> Result<&'a str> {
        let start = self.at;
        let b = self.bytes();
        let digits = |at: &mut usize| {
            let from = *at;
            while *at < b.len() && b[*at].is_ascii_digit() {
                *at += 1;
            }
            *at > from
        };
        let mut at = self.at;
        if b.get(at) == Some(&b'-') {
            at += 1;
        }
        let int_start = at;
        if !digits(&mut at) || (b[int_start] == b'0' && at - int_start > 1) {
            self.at = start;
            return Err(self.unexpected());
        }
        if b.get(at) == Some(&b'.') {
            at += 1;
            if !digits(&mut at) {
                self.at = start;
                return Err(self.unexpected());
            }
        }
        if matches!(b.get(at), Some(b'e' | b'E')) {
            at += 1;
            if matches!(b.get(at), Some(b'+' | b'-')) {
                at += 1;
            }
            if !digits(&mut at) {
                self.at = start;
                return Err(self.unexpected());
            }
        }
        self.at = at;
        Ok(&self.text[start..at])
    }

    fn string(&mut self) -> Result<String> {
        self.at += 1; // the opening quote
        let mut out = String::new();
        loop {
            let rest = &self.text[self.at..];
            let Some(i) = rest
                .find(['"', '\\'])
                .or_else(|| rest.bytes().position(|c| c < 0x20).map(|_| usize::MAX))
            else {
                return Err(self.end());
            };
            if i == usize::MAX {
                return Err(invalid("Character with value 0x0a must be escaped."));
            }
            let chunk = &rest[..i];
            if let Some(c) = chunk.bytes().find(|c| *c < 0x20) {
                return Err(invalid(&format!(
                    "Character with value 0x{c:02x} must be escaped."
                )));
            }
            out.push_str(chunk);
            self.at += i;
            match self.peek() {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(out);
                }
                _ => {
                    self.at += 1;
                    let c = self.peek().ok_or_else(|| self.end())?;
                    self.at += 1;
                    match c {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hex = |p: &mut Self| -> Result<u32> {
                                let h = p.text.get(p.at..p.at + 4).ok_or_else(|| p.end())?;
                                let v = u32::from_str_radix(h, 16).map_err(|_| {
                                    invalid("\"\\u\" must be followed by four hexadecimal digits.")
                                })?;
                                p.at += 4;
                                Ok(v)
                            };
                            let mut v = hex(self)?;
                            if (0xD800..0xDC00).contains(&v)
                                && self.text[self.at..].starts_with("\\u")
                            {
                                self.at += 2;
                                let low = hex(self)?;
                                v = 0x10000
                                    + ((v - 0xD800) << 10)
                                    + (low.wrapping_sub(0xDC00) & 0x3FF);
                            }
                            if v == 0 {
                                return Err(invalid("unsupported Unicode escape sequence"));
                            }
                            out.push(char::from_u32(v).ok_or_else(|| {
                                invalid("Unicode low surrogate must follow a high surrogate.")
                            })?);
                        }
                        _ => {
                            return Err(invalid(&format!(
                                "Escape sequence \"\\{}\" is invalid.",
                                c as char
                            )))
                        }
                    }
                }
            }
        }
    }
}

// ---- Writing -------------------------------------------------------------------------

/// `s` as a JSON string, escaped as PostgreSQL's `escape_json` does.
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A JSON number as `numeric` prints it: `1e2` is `100`, `1.50` keeps its zero.
fn write_number(out: &mut String, n: &str) {
    let (negative, n) = match n.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, n),
    };
    let (mantissa, exp) = match n.find(['e', 'E']) {
        Some(i) => (&n[..i], n[i + 1..].parse::<i64>().unwrap_or(0)),
        None => (n, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: String = format!("{int}{frac}");
    // The value is digits × 10^(exp − frac.len()); its scale is never below 0.
    let point = int.len() as i64 + exp; // digits before the decimal point
    let scale = (frac.len() as i64 - exp).max(0) as usize;
    let mut whole = String::new();
    let mut fraction = String::new();
    for (i, d) in digits.chars().enumerate() {
        if (i as i64) < point {
            whole.push(d);
        } else {
            fraction.push(d);
        }
    }
    if point > digits.len() as i64 {
        whole.extend(std::iter::repeat_n(
            '0',
            (point - digits.len() as i64) as usize,
        ));
    }
    if point < 0 {
        fraction.insert_str(0, &"0".repeat((-point) as usize));
    }
    let whole = whole.trim_start_matches('0');
    fraction.truncate(scale);
    while fraction.len() < scale {
        fraction.push('0');
    }
    let zero = whole.is_empty() && fraction.bytes().all(|b| b == b'0');
    if negative && !zero {
        out.push('-');
    }
    out.push_str(if whole.is_empty() { "0" } else { whole });
    if scale > 0 {
        out.push('.');
        out.push_str(&fraction);
    }
}

/// `node` in jsonb's normal form.
fn write_normal(out: &mut String, node: &Node<'_>) {
    match &node.value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_normal(out, item);
            }
            out.push(']');
        }
        Value::Object(members) => {
            out.push('{');
            for (i, (key, value)) in normal_members(members).into_iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_string(out, key);
                out.push_str(": ");
                write_normal(out, value);
            }
            out.push('}');
        }
    }
}

/// An object's members as jsonb keeps them: ordered by key (shorter first, then
/// bytewise), the last of duplicate keys.
fn normal_members<'n, 'a>(members: &'n [(String, Node<'a>)]) -> Vec<(&'n str, &'n Node<'a>)> {
    let mut sorted: Vec<(usize, &(String, Node<'a>))> = members.iter().enumerate().collect();
    sorted.sort_by(|(i, (a, _)), (j, (b, _))| {
        (a.len(), a.as_bytes(), std::cmp::Reverse(*i)).cmp(&(
            b.len(),
            b.as_bytes(),
            std::cmp::Reverse(*j),
        ))
    });
    sorted.dedup_by(|later, first| later.1 .0 == first.1 .0);
    sorted
        .into_iter()
        .map(|(_, (k, v))| (k.as_str(), v))
        .collect()
}

/// `text` in jsonb's normal form.
fn normal(text: &str) -> Result<String> {
    let node = parse(text)?;
    let mut out = String::with_capacity(text.len());
    write_normal(&mut out, &node);
    Ok(out)
}

/// A SQL value as JSON, as `to_json` writes it; `kind` is the value's JSON type when
/// it is one (its text is then the JSON itself).
fn write_value(out: &mut String, v: &ScalarValue, kind: Option<Kind>) {
    if v.is_null() {
        out.push_str("null");
        return;
    }
    let text = || super::functions::pg_text(v).unwrap_or_default();
    match v {
        ScalarValue::Boolean(Some(b)) => out.push_str(if *b { "true" } else { "false" }),
        ScalarValue::Int8(_)
        | ScalarValue::Int16(_)
        | ScalarValue::Int32(_)
        | ScalarValue::Int64(_)
        | ScalarValue::UInt8(_)
        | ScalarValue::UInt16(_)
        | ScalarValue::UInt32(_)
        | ScalarValue::UInt64(_)
        | ScalarValue::Decimal128(..) => out.push_str(&text()),
        ScalarValue::Float32(Some(f)) if f.is_finite() => out.push_str(&text()),
        ScalarValue::Float64(Some(f)) if f.is_finite() => out.push_str(&text()),
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => match kind {
            Some(_) => out.push_str(s),
            None => write_string(out, s),
        },
        ScalarValue::TimestampSecond(..)
        | ScalarValue::TimestampMillisecond(..)
        | ScalarValue::TimestampMicrosecond(..)
        | ScalarValue::TimestampNanosecond(..) => {
            // ISO 8601: a `T` between date and time, a zone's offset as `+hh:mm`.
            let mut t = text().replacen(' ', "T", 1);
            let offset = t.rfind(['+', '-']).filter(|&i| i > 10);
            if let Some(i) = offset {
                if t.len() - i == 3 {
                    t.push_str(":00");
                }
            }
            write_string(out, &t);
        }
        ScalarValue::List(a) => write_list(out, a.as_ref()),
        ScalarValue::LargeList(a) => write_list(out, a.as_ref()),
        ScalarValue::FixedSizeList(a) => write_list(out, a.as_ref()),
        ScalarValue::Struct(s) => {
            out.push('{');
            for (i, (field, column)) in s.fields().iter().zip(s.columns()).enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, field.name());
                out.push(':');
                match ScalarValue::try_from_array(column, 0) {
                    Ok(v) => write_value(out, &v, Kind::of(field)),
                    Err(_) => out.push_str("null"),
                }
            }
            out.push('}');
        }
        _ => write_string(out, &text()),
    }
}

/// An array value (one row of a list array) as a JSON array, without spaces.
fn write_list(out: &mut String, list: &dyn Array) {
    use datafusion::arrow::array::AsArray;
    let values = match list.data_type() {
        DataType::List(_) => list.as_list::<i32>().value(0),
        DataType::LargeList(_) => list.as_list::<i64>().value(0),
        DataType::FixedSizeList(..) => list.as_fixed_size_list().value(0),
        _ => {
            out.push_str("null");
            return;
        }
    };
    out.push('[');
    for i in 0..values.len() {
        if i > 0 {
            out.push(',');
        }
        match ScalarValue::try_from_array(&values, i) {
            Ok(v) => write_value(out, &v, None),
            Err(_) => out.push_str("null"),
        }
    }
    out.push(']');
}

// ---- Functions -----------------------------------------------------------------------

/// What a JSON function returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Returns {
    Json(Kind),
    /// The JSON type of its first argument (`->` of jsonb is jsonb).
    FirstArg,
    Text,
    Int,
    Bool,
}

/// A function's arguments (NULL or not) and their JSON types.
type Eval = fn(&[ScalarValue], &[Option<Kind>]) -> Result<ScalarValue>;

/// A JSON function evaluated row by row.
struct JsonFunction {
    name: &'static str,
    signature: Signature,
    returns: Returns,
    /// NULL in, NULL out (the builders take NULL as JSON null instead).
    strict: bool,
    eval: Eval,
}

identified_by_name!(JsonFunction);

/// The PostgreSQL type of a result column: `json` or `jsonb` where the field is marked
/// so, else its Arrow type's.
pub fn pg_type(field: &Field) -> pgwire::api::Type {
    match Kind::of(field) {
        Some(Kind::Json) => pgwire::api::Type::JSON,
        Some(Kind::Jsonb) => pgwire::api::Type::JSONB,
        None if super::numeric::is_numeric(field) => pgwire::api::Type::NUMERIC,
        None if field.metadata().get(PG_TYPE).is_some_and(|t| t == "name") => {
            pgwire::api::Type::NAME
        }
        None => crate::session::cells::pg_type_of_arrow(field.data_type()),
    }
}

/// A text field of JSON type `kind`.
pub fn json_field(name: &str, kind: Kind) -> Field {
    Field::new(name, DataType::Utf8, true).with_metadata(
        [(PG_TYPE.to_string(), kind.name().to_string())]
            .into_iter()
            .collect(),
    )
}

impl ScalarUDFImpl for JsonFunction {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(match self.returns {
            Returns::Int => DataType::Int32,
            Returns::Bool => DataType::Boolean,
            _ => DataType::Utf8,
        })
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let kind = match self.returns {
            Returns::Json(kind) => Some(kind),
            Returns::FirstArg => Some(
                args.arg_fields
                    .first()
                    .and_then(|f| Kind::of(f))
                    .unwrap_or(Kind::Json),
            ),
            _ => None,
        };
        Ok(Arc::new(match kind {
            Some(kind) => json_field(self.name, kind),
            None => Field::new(self.name, self.return_type(&[])?, true),
        }))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let kinds: Vec<Option<Kind>> = args.arg_fields.iter().map(|f| Kind::of(f)).collect();
        let returns = args.return_field.data_type().clone();
        super::functions::row_by_row(&args, &returns, &|scalars| {
            if self.strict && scalars.iter().any(ScalarValue::is_null) {
                return ScalarValue::try_from(&returns);
            }
            (self.eval)(scalars, &kinds)
        })
    }
}

fn udf(
    name: &'static str,
    arities: &[usize],
    returns: Returns,
    strict: bool,
    eval: Eval,
) -> ScalarUDF {
    let signature = match arities {
        [] => Signature::variadic_any(Volatility::Immutable),
        _ => Signature::one_of(
            arities
                .iter()
                .map(|n| match n {
                    0 => TypeSignature::Nullary,
                    n => TypeSignature::Any(*n),
                })
                .collect(),
            Volatility::Immutable,
        ),
    };
    ScalarUDF::new_from_impl(JsonFunction {
        name,
        signature,
        returns,
        strict,
        eval,
    })
}

fn text_of(v: &ScalarValue) -> Option<String> {
    match v {
        ScalarValue::Utf8(s) | ScalarValue::LargeUtf8(s) | ScalarValue::Utf8View(s) => s.clone(),
        v if v.is_null() => None,
        v => super::functions::pg_text(v),
    }
}

fn text(s: Option<String>) -> ScalarValue {
    ScalarValue::Utf8(s)
}

/// The argument `v`'s JSON text, or text to read as JSON.
fn json_text(v: &ScalarValue) -> String {
    text_of(v).unwrap_or_default()
}

/// `to_json(v)` in `kind`'s form.
fn to_json(v: &ScalarValue, input: Option<Kind>, kind: Kind) -> Result<String> {
    let mut out = String::new();
    write_value(&mut out, v, input);
    kind.finish(out)
}

/// One step into a JSON value: a key of an object, or an index of an array (negative
/// from its end); `None` where there is no such element.
fn step<'n, 'a>(node: &'n Node<'a>, key: &ScalarValue) -> Option<&'n Node<'a>> {
    match (&node.value, key) {
        // An object has keys, not positions: `-> 2` on one is NULL.
        (Value::Object(members), key) => {
            if !matches!(
                key.data_type(),
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            ) {
                return None;
            }
            let key = text_of(key)?;
            members
                .iter()
                .rev()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v)
        }
        (Value::Array(items), k) => {
            let i = match k.cast_to(&DataType::Int64).ok()? {
                ScalarValue::Int64(Some(i)) => i,
                _ => return None,
            };
            let i = if i < 0 { items.len() as i64 + i } else { i };
            usize::try_from(i).ok().and_then(|i| items.get(i))
        }
        _ => None,
    }
}

/// A path step written as text (`'{a,1}'`'s `1`): a key, or an array index.
fn step_text<'n, 'a>(node: &'n Node<'a>, key: &str) -> Option<&'n Node<'a>> {
    match &node.value {
        Value::Array(_) => step(node, &ScalarValue::Int64(Some(key.trim().parse().ok()?))),
        _ => step(node, &ScalarValue::Utf8(Some(key.to_string()))),
    }
}

/// An element as `->>` gives it: a string's text, NULL for JSON null, else its JSON.
fn element_text(node: &Node<'_>) -> Option<String> {
    match &node.value {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        _ => Some(node.raw.to_string()),
    }
}

/// The path a `#>` operand or a text array names.
fn path_of(v: &ScalarValue) -> Result<Vec<String>> {
    use datafusion::arrow::array::AsArray;
    if let ScalarValue::List(l) = v {
        let values = l.value(0);
        let strings = datafusion::arrow::compute::cast(&values, &DataType::Utf8)?;
        return Ok(strings
            .as_string::<i32>()
            .iter()
            .map(|s| s.unwrap_or_default().to_string())
            .collect());
    }
    let t = json_text(v);
    let inner = t
        .trim()
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .ok_or_else(|| {
            external(
                ErrorKind::InvalidText,
                &format!("malformed array literal: \"{t}\""),
            )
        })?;
    if inner.trim().is_empty() {
        return Ok(Vec::new());
    }
    Ok(inner
        .split(',')
        .map(|p| p.trim().trim_matches('"').to_string())
        .collect())
}

fn follow<'n, 'a>(node: &'n Node<'a>, path: &[String]) -> Option<&'n Node<'a>> {
    path.iter().try_fold(node, |n, key| step_text(n, key))
}

/// `json_build_object` in `kind`'s form.
fn build_object(a: &[ScalarValue], kinds: &[Option<Kind>], kind: Kind) -> Result<ScalarValue> {
    if !a.len().is_multiple_of(2) {
        return Err(external(
            ErrorKind::InvalidParameter,
            "argument list must have even number of elements",
        ));
    }
    let mut out = String::from("{");
    for (i, pair) in a.chunks(2).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let key = text_of(&pair[0]).ok_or_else(|| {
            external(
                ErrorKind::InvalidParameter,
                &format!("argument {} cannot be null", 2 * i + 1),
            )
        })?;
        write_string(&mut out, &key);
        out.push_str(" : ");
        write_value(&mut out, &pair[1], kinds.get(2 * i + 1).copied().flatten());
    }
    out.push('}');
    Ok(text(Some(kind.finish(out)?)))
}

fn build_array(a: &[ScalarValue], kinds: &[Option<Kind>], kind: Kind) -> Result<ScalarValue> {
    let mut out = String::from("[");
    for (i, v) in a.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_value(&mut out, v, kinds.get(i).copied().flatten());
    }
    out.push(']');
    Ok(text(Some(kind.finish(out)?)))
}

/// `jsonb || jsonb`: objects merged (the right's keys win), arrays joined, a scalar
/// taken as a one-element array.
fn concat_jsonb(left: &str, right: &str) -> Result<String> {
    let (l, r) = (parse(left)?, parse(right)?);
    let value = match (l.value, r.value) {
        // The right's members come last, so its keys win in the normal form.
        (Value::Object(mut a), Value::Object(b)) => {
            a.extend(b);
            Value::Object(a)
        }
        (a, b) => {
            let items = |raw, value| match value {
                Value::Array(items) => items,
                value => vec![Node { raw, value }],
            };
            let mut all = items(l.raw, a);
            all.extend(items(r.raw, b));
            Value::Array(all)
        }
    };
    let mut out = String::with_capacity(left.len() + right.len());
    write_normal(&mut out, &Node { raw: "", value });
    Ok(out)
}

/// `jsonb - text`: the object without that key, or the array without those strings.
fn delete_jsonb(doc: &str, key: &str) -> Result<String> {
    let node = parse(doc)?;
    let kept: Vec<&str> = match &node.value {
        Value::Object(members) => {
            let mut out = String::from("{");
            let mut first = true;
            for (k, v) in normal_members(members) {
                if k == key {
                    continue;
                }
                if !first {
                    out.push_str(", ");
                }
                first = false;
                write_string(&mut out, k);
                out.push_str(": ");
                out.push_str(v.raw);
            }
            out.push('}');
            return Ok(out);
        }
        Value::Array(items) => items
            .iter()
            .filter(|i| !matches!(&i.value, Value::String(s) if s == key))
            .map(|i| i.raw)
            .collect(),
        _ => {
            return Err(external(
                ErrorKind::InvalidParameter,
                "cannot delete from scalar",
            ))
        }
    };
    Ok(format!("[{}]", kept.join(", ")))
}

/// `jsonb ? text`: a key of the object, or a string element of the array.
fn exists(doc: &str, key: &str) -> Result<bool> {
    let node = parse(doc)?;
    Ok(match &node.value {
        Value::Object(members) => members.iter().any(|(k, _)| k == key),
        Value::Array(items) => items
            .iter()
            .any(|i| matches!(&i.value, Value::String(s) if s == key)),
        Value::String(s) => s == key,
        _ => false,
    })
}

/// The functions an aggregate's rows go through (`json_agg` is `pg_json_agg_finish`
/// of `array_agg(pg_json_element(x))`).
pub const ELEMENT: &str = "pg_json_element";
pub const PAIR: &str = "pg_json_pair";
pub const AGG_FINISH: &str = "pg_json_agg_finish";
pub const JSONB_AGG_FINISH: &str = "pg_jsonb_agg_finish";
pub const OBJECT_AGG_FINISH: &str = "pg_json_object_agg_finish";
pub const JSONB_OBJECT_AGG_FINISH: &str = "pg_jsonb_object_agg_finish";

/// The elements of an `array_agg` of JSON texts.
fn elements(v: &ScalarValue) -> Option<Vec<String>> {
    use datafusion::arrow::array::AsArray;
    let ScalarValue::List(l) = v else {
        return None;
    };
    if l.is_null(0) {
        return None;
    }
    let values = l.value(0);
    let strings = values.as_string_opt::<i32>()?;
    Some(
        strings
            .iter()
            .map(|s| s.unwrap_or("null").to_string())
            .collect(),
    )
}

fn agg_finish(a: &[ScalarValue], kind: Kind) -> Result<ScalarValue> {
    let Some(items) = a.first().and_then(elements).filter(|i| !i.is_empty()) else {
        return Ok(text(None));
    };
    let mut out = String::from("[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
            // json_agg puts each record or array after the first on a line of its own.
            if kind == Kind::Json && (item.starts_with('{') || item.starts_with('[')) {
                out.push_str("\n ");
            }
        }
        out.push_str(item);
    }
    out.push(']');
    Ok(text(Some(kind.finish(out)?)))
}

fn object_agg_finish(a: &[ScalarValue], kind: Kind) -> Result<ScalarValue> {
    let Some(items) = a.first().and_then(elements).filter(|i| !i.is_empty()) else {
        return Ok(text(None));
    };
    let out = format!("{{ {} }}", items.join(", "));
    Ok(text(Some(kind.finish(out)?)))
}

/// Every JSON function, by its SQL name.
fn functions() -> Vec<ScalarUDF> {
    use Kind::{Json, Jsonb};
    use Returns::{Bool, FirstArg, Int, Text};
    vec![
        udf("pg_json_in", &[1], Returns::Json(Json), true, |a, _| {
            let t = json_text(&a[0]);
            parse(&t)?;
            Ok(text(Some(t)))
        }),
        udf("pg_jsonb_in", &[1], Returns::Json(Jsonb), true, |a, _| {
            Ok(text(Some(normal(&json_text(&a[0]))?)))
        }),
        udf("to_json", &[1], Returns::Json(Json), true, |a, k| {
            Ok(text(Some(to_json(&a[0], k[0], Json)?)))
        }),
        udf("to_jsonb", &[1], Returns::Json(Jsonb), true, |a, k| {
            Ok(text(Some(to_json(&a[0], k[0], Jsonb)?)))
        }),
        udf("row_to_json", &[1], Returns::Json(Json), true, |a, k| {
            Ok(text(Some(to_json(&a[0], k[0], Json)?)))
        }),
        udf(
            "json_build_object",
            &[],
            Returns::Json(Json),
            false,
            |a, k| build_object(a, k, Json),
        ),
        udf(
            "jsonb_build_object",
            &[],
            Returns::Json(Jsonb),
            false,
            |a, k| build_object(a, k, Jsonb),
        ),
        udf(
            "json_build_array",
            &[],
            Returns::Json(Json),
            false,
            |a, k| build_array(a, k, Json),
        ),
        udf(
            "jsonb_build_array",
            &[],
            Returns::Json(Jsonb),
            false,
            |a, k| build_array(a, k, Jsonb),
        ),
        udf("json_typeof", &[1], Text, true, type_of),
        udf("jsonb_typeof", &[1], Text, true, type_of),
        udf("json_array_length", &[1], Int, true, |a, _| {
            array_length(&a[0])
        }),
        udf("jsonb_array_length", &[1], Int, true, |a, _| {
            array_length(&a[0])
        }),
        udf("json_extract_path", &[], FirstArg, true, |a, _| {
            extract_path(a, false)
        }),
        udf("jsonb_extract_path", &[], FirstArg, true, |a, _| {
            extract_path(a, false)
        }),
        udf("json_extract_path_text", &[], Text, true, |a, _| {
            extract_path(a, true)
        }),
        udf("jsonb_extract_path_text", &[], Text, true, |a, _| {
            extract_path(a, true)
        }),
        // The operators (`JsonPlanner`).
        udf("pg_json_get", &[2], FirstArg, true, |a, _| {
            let t = json_text(&a[0]);
            let node = parse(&t)?;
            Ok(text(step(&node, &a[1]).map(|n| n.raw.to_string())))
        }),
        udf("pg_json_get_text", &[2], Text, true, |a, _| {
            let t = json_text(&a[0]);
            let node = parse(&t)?;
            Ok(text(step(&node, &a[1]).and_then(element_text)))
        }),
        udf("pg_json_path", &[2], FirstArg, true, |a, _| {
            let t = json_text(&a[0]);
            let node = parse(&t)?;
            Ok(text(
                follow(&node, &path_of(&a[1])?).map(|n| n.raw.to_string()),
            ))
        }),
        udf("pg_json_path_text", &[2], Text, true, |a, _| {
            let t = json_text(&a[0]);
            let node = parse(&t)?;
            Ok(text(follow(&node, &path_of(&a[1])?).and_then(element_text)))
        }),
        udf("pg_jsonb_exists", &[2], Bool, true, |a, _| {
            Ok(ScalarValue::Boolean(Some(exists(
                &json_text(&a[0]),
                &json_text(&a[1]),
            )?)))
        }),
        udf(
            "pg_jsonb_concat",
            &[2],
            Returns::Json(Jsonb),
            true,
            |a, _| {
                Ok(text(Some(concat_jsonb(
                    &json_text(&a[0]),
                    &json_text(&a[1]),
                )?)))
            },
        ),
        udf(
            "pg_jsonb_delete",
            &[2],
            Returns::Json(Jsonb),
            true,
            |a, _| {
                Ok(text(Some(delete_jsonb(
                    &json_text(&a[0]),
                    &json_text(&a[1]),
                )?)))
            },
        ),
        // The aggregates' parts (`rewrite`'s `json_aggregate`).
        udf(ELEMENT, &[1], Text, false, |a, k| {
            Ok(text(Some(to_json(&a[0], k[0], Json)?)))
        }),
        udf(PAIR, &[2], Text, false, |a, k| {
            let key = text_of(&a[0]).ok_or_else(|| {
                external(ErrorKind::InvalidParameter, "field name must not be null")
            })?;
            let mut out = String::new();
            write_string(&mut out, &key);
            out.push_str(" : ");
            write_value(&mut out, &a[1], k[1]);
            Ok(text(Some(out)))
        }),
        udf(AGG_FINISH, &[1], Returns::Json(Json), false, |a, _| {
            agg_finish(a, Json)
        }),
        udf(
            JSONB_AGG_FINISH,
            &[1],
            Returns::Json(Jsonb),
            false,
            |a, _| agg_finish(a, Jsonb),
        ),
        udf(
            OBJECT_AGG_FINISH,
            &[1],
            Returns::Json(Json),
            false,
            |a, _| object_agg_finish(a, Json),
        ),
        udf(
            JSONB_OBJECT_AGG_FINISH,
            &[1],
            Returns::Json(Jsonb),
            false,
            |a, _| object_agg_finish(a, Jsonb),
        ),
    ]
}

/// `json_typeof(j)`: `object`, `array`, `string`, `number`, `boolean` or `null`.
fn type_of(a: &[ScalarValue], _: &[Option<Kind>]) -> Result<ScalarValue> {
    let t = json_text(&a[0]);
    Ok(text(Some(parse(&t)?.value.type_name().to_string())))
}

fn array_length(v: &ScalarValue) -> Result<ScalarValue> {
    let t = json_text(v);
    match parse(&t)?.value {
        Value::Array(items) => Ok(ScalarValue::Int32(Some(items.len() as i32))),
        Value::Object(_) => Err(external(
            ErrorKind::InvalidParameter,
            "cannot get array length of a non-array",
        )),
        _ => Err(external(
            ErrorKind::InvalidParameter,
            "cannot get array length of a scalar",
        )),
    }
}

fn extract_path(a: &[ScalarValue], as_text: bool) -> Result<ScalarValue> {
    let t = json_text(&a[0]);
    let node = parse(&t)?;
    let path: Vec<String> = a[1..].iter().map(json_text).collect();
    let found = follow(&node, &path);
    Ok(text(match as_text {
        true => found.and_then(element_text),
        false => found.map(|n| n.raw.to_string()),
    }))
}

/// The aggregate that `name` finishes, for `rewrite`: the finishing function and
/// whether the call takes a key and a value.
pub fn aggregate(name: &str) -> Option<(&'static str, bool)> {
    Some(match name {
        "json_agg" => (AGG_FINISH, false),
        "jsonb_agg" => (JSONB_AGG_FINISH, false),
        "json_object_agg" => (OBJECT_AGG_FINISH, true),
        "jsonb_object_agg" => (JSONB_OBJECT_AGG_FINISH, true),
        _ => return None,
    })
}

/// Plans the JSON operators: `->`, `->>`, `#>`, `#>>` and `?` on any JSON (or text
/// read as JSON), `||` and `-` where an operand is jsonb.
#[derive(Debug)]
pub struct JsonPlanner {
    get: Arc<ScalarUDF>,
    get_text: Arc<ScalarUDF>,
    path: Arc<ScalarUDF>,
    path_text: Arc<ScalarUDF>,
    exists: Arc<ScalarUDF>,
    concat: Arc<ScalarUDF>,
    delete: Arc<ScalarUDF>,
}

impl JsonPlanner {
    fn new(udfs: &[ScalarUDF]) -> JsonPlanner {
        let find = |name: &str| {
            Arc::new(
                udfs.iter()
                    .find(|u| u.name() == name)
                    .expect("JSON operator function")
                    .clone(),
            )
        };
        JsonPlanner {
            get: find("pg_json_get"),
            get_text: find("pg_json_get_text"),
            path: find("pg_json_path"),
            path_text: find("pg_json_path_text"),
            exists: find("pg_jsonb_exists"),
            concat: find("pg_jsonb_concat"),
            delete: find("pg_jsonb_delete"),
        }
    }
}

impl ExprPlanner for JsonPlanner {
    fn plan_binary_op(
        &self,
        expr: RawBinaryExpr,
        schema: &DFSchema,
    ) -> Result<PlannerResult<RawBinaryExpr>> {
        let is_jsonb =
            |e: &Expr| e.to_field(schema).ok().and_then(|(_, f)| Kind::of(&f)) == Some(Kind::Jsonb);
        let function = match expr.op {
            BinaryOperator::Arrow => &self.get,
            BinaryOperator::LongArrow => &self.get_text,
            BinaryOperator::HashArrow => &self.path,
            BinaryOperator::HashLongArrow => &self.path_text,
            BinaryOperator::Question => &self.exists,
            BinaryOperator::StringConcat if is_jsonb(&expr.left) || is_jsonb(&expr.right) => {
                &self.concat
            }
            BinaryOperator::Minus if is_jsonb(&expr.left) => &self.delete,
            _ => return Ok(PlannerResult::Original(expr)),
        };
        Ok(PlannerResult::Planned(Expr::ScalarFunction(
            datafusion::logical_expr::expr::ScalarFunction::new_udf(
                function.clone(),
                vec![expr.left, expr.right],
            ),
        )))
    }
}

/// `json_each(j)` and `json_each_text(j)`: a row per member of the object `j`, a
/// constant.
#[derive(Debug)]
struct Each {
    as_text: bool,
}

impl TableFunctionImpl for Each {
    fn call(&self, args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        // A literal, or a cast of one (`'…'::json`).
        let doc = match args {
            [Expr::Literal(v, _)] => json_text(v),
            [Expr::ScalarFunction(f)] => match f.args.as_slice() {
                [Expr::Literal(v, _)] => json_text(v),
                _ => return Err(not_constant()),
            },
            _ => return Err(not_constant()),
        };
        let node = parse(&doc)?;
        let Value::Object(members) = &node.value else {
            return Err(external(
                ErrorKind::InvalidParameter,
                "cannot deconstruct a scalar",
            ));
        };
        let keys: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
        let values: Vec<Option<String>> = members
            .iter()
            .map(|(_, v)| match self.as_text {
                true => element_text(v),
                false => Some(v.raw.to_string()),
            })
            .collect();
        let value_field = match self.as_text {
            true => Field::new("value", DataType::Utf8, true),
            false => json_field("value", Kind::Json),
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("key", DataType::Utf8, true),
            value_field,
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(keys)) as ArrayRef,
                Arc::new(StringArray::from(values)) as ArrayRef,
            ],
        )?;
        Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
    }
}

fn not_constant() -> DataFusionError {
    external(
        ErrorKind::Unsupported,
        "json_each and json_each_text take a constant",
    )
}

/// Registers the JSON functions and operators with `ctx`.
pub fn register(ctx: &SessionContext) -> Result<()> {
    use datafusion::execution::FunctionRegistry;
    let udfs = functions();
    let planner = JsonPlanner::new(&udfs);
    for f in udfs {
        ctx.register_udf(f);
    }
    ctx.register_udtf("json_each", Arc::new(Each { as_text: false }));
    ctx.register_udtf("jsonb_each", Arc::new(Each { as_text: false }));
    ctx.register_udtf("json_each_text", Arc::new(Each { as_text: true }));
    ctx.register_udtf("jsonb_each_text", Arc::new(Each { as_text: true }));
    ctx.state_ref()
        .write()
        .register_expr_planner(Arc::new(planner))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonb_orders_keys_and_keeps_the_last_duplicate() {
        assert_eq!(
            normal(r#"{"bb": 1, "a": 2, "a": 3}"#).unwrap(),
            r#"{"a": 3, "bb": 1}"#
        );
        assert_eq!(
            normal(r#"{"b": 1,  "a": [1,2]}"#).unwrap(),
            r#"{"a": [1, 2], "b": 1}"#
        );
    }

    #[test]
    fn numbers_print_as_numeric() {
        let n = |s: &str| {
            let mut out = String::new();
            write_number(&mut out, s);
            out
        };
        assert_eq!(n("1e2"), "100");
        assert_eq!(n("1.50"), "1.50");
        assert_eq!(n("1E-3"), "0.001");
        assert_eq!(n("-0"), "0");
        assert_eq!(n("12.5e-1"), "1.25");
        assert_eq!(n("0.5"), "0.5");
    }

    #[test]
    fn invalid_json_is_22p02() {
        let e = parse(r#"{"a": 1"#).unwrap_err().to_string();
        assert!(e.contains("invalid input syntax for type json"), "{e}");
        assert!(parse("[1, 2,]").is_err());
        assert!(parse("01").is_err());
    }

    #[test]
    fn elements_and_paths() {
        let doc = r#"{"a": {"b": [10, 20]}}"#;
        let node = parse(doc).unwrap();
        let b = follow(&node, &["a".into(), "b".into(), "1".into()]).unwrap();
        assert_eq!(b.raw, "20");
        assert_eq!(
            concat_jsonb(r#"{"a": 1}"#, r#"{"b": 2}"#).unwrap(),
            r#"{"a": 1, "b": 2}"#
        );
        assert_eq!(
            delete_jsonb(r#"{"a": 1, "b": 2}"#, "a").unwrap(),
            r#"{"b": 2}"#
        );
        assert!(exists(r#"{"a": 1}"#, "a").unwrap());
    }
}
