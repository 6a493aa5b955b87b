//! WHERE predicates of metrics, compiled to DataFusion physical expressions and
//! evaluated over Arrow batches of events; and the conversion of rows to Arrow.
//!
//! Invariant: a predicate that evaluates to NULL drops the event, as SQL's WHERE does.

use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, BooleanBuilder, Decimal128Builder, Float32Builder,
    Float64Builder, Int32Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::tree_node::TreeNode;
use datafusion::common::{DFSchema, DataFusionError, SchemaError};
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::SessionContext;

use crate::aggregate::ResultType;
use crate::catalog::StreamDef;
use crate::error::{Error, ErrorKind, Result};
use crate::types::{ColumnType, Row, Value};

/// A compiled predicate over a stream's events.
#[derive(Clone, Debug)]
pub struct Filter {
    pub text: String,
    expr: Arc<dyn PhysicalExpr>,
}

fn session() -> &'static SessionContext {
    static CTX: OnceLock<SessionContext> = OnceLock::new();
    CTX.get_or_init(SessionContext::new)
}

/// The Arrow schema of a stream's events.
pub fn stream_schema(stream: &StreamDef) -> SchemaRef {
    Arc::new(Schema::new(
        stream
            .columns
            .iter()
            .map(|c| Field::new(&c.name, c.ty.arrow(), !c.not_null))
            .collect::<Vec<_>>(),
    ))
}

/// The Arrow type of an aggregate result or column.
pub fn result_arrow_type(ty: ResultType) -> DataType {
    match ty {
        ResultType::Column(c) => c.arrow(),
        ResultType::Numeric => DataType::Decimal128(38, 0),
    }
}

/// DataFusion's messages that name a mistake PostgreSQL has its own SQLSTATE and
/// message for: (words in DataFusion's message, kind, PostgreSQL's message).
const POSTGRESQL_ERRORS: [(&str, ErrorKind, &str); 8] = [
    (
        "Aggregate function calls cannot be nested",
        ErrorKind::Grouping,
        "aggregate function calls cannot be nested",
    ),
    (
        "Aggregate functions are not allowed in the WHERE clause",
        ErrorKind::Grouping,
        "aggregate functions are not allowed in WHERE",
    ),
    (
        "LIMIT must be >= 0",
        ErrorKind::InvalidLimit,
        "LIMIT must not be negative",
    ),
    (
        "OFFSET must be >=0",
        ErrorKind::InvalidOffset,
        "OFFSET must not be negative",
    ),
    (
        "Scalar subquery returned more than one row",
        ErrorKind::CardinalityViolation,
        "more than one row returned by a subquery used as an expression",
    ),
    (
        "Cannot create filter with non-boolean predicate",
        ErrorKind::DatatypeMismatch,
        "argument of WHERE must be type boolean",
    ),
    (
        "Unsupported SQL type ",
        ErrorKind::UndefinedObject,
        "type \"{}\" does not exist",
    ),
    (
        "Substring without for/from is not valid",
        ErrorKind::UndefinedFunction,
        "function substr with one argument does not exist",
    ),
];

/// PostgreSQL's error for a DataFusion message that names a mistake PostgreSQL has its
/// own SQLSTATE for (GROUP BY, nested aggregates, LIMIT, subquery rows, types).
fn postgresql_error(message: &str) -> Option<Error> {
    // The name DataFusion quotes after `words`: a column, or the rest (a type).
    let after = |words: &str| {
        let rest = &message[message.find(words)? + words.len()..];
        Some(rest.split('"').next().unwrap_or(rest).trim().to_string())
    };
    // A function or operator that exists, but not for these argument types: 42883, as
    // PostgreSQL finds no function of that signature.
    if message.contains("failed to match any signature")
        || message.starts_with("Failed to coerce arguments to satisfy a call to '")
    {
        let name = message.split('\'').nth(1).unwrap_or("?");
        return Some(
            Error::new(
                ErrorKind::UndefinedFunction,
                format!("function {name} does not exist for these argument types"),
            )
            .with_hint("No function matches the given name and argument types. You might need to add explicit type casts."),
        );
    }
    if let Some(rest) = message.split("Cannot coerce arithmetic expression ").nth(1) {
        let operands = rest.split(" to valid types").next().unwrap_or(rest);
        return Some(
            Error::new(
                ErrorKind::UndefinedFunction,
                format!("operator does not exist: {operands}"),
            )
            .with_hint("No operator matches the given name and argument types. You might need to add explicit type casts."),
        );
    }
    if message.contains("must be in GROUP BY or an aggregate function") {
        let column = after("column \"")?;
        return Some(Error::new(
            ErrorKind::Grouping,
            format!("column \"{column}\" must appear in the GROUP BY clause or be used in an aggregate function"),
        ));
    }
    let (words, kind, text) = POSTGRESQL_ERRORS
        .iter()
        .find(|(words, _, _)| message.contains(words))?;
    Some(Error::new(*kind, text.replace("{}", &after(words)?)))
}

/// Maps a DataFusion error met while planning a user's expression to a SQL error.
pub fn datafusion_error(e: DataFusionError) -> Error {
    match e {
        DataFusionError::SchemaError(err, _) => match *err {
            SchemaError::FieldNotFound { field, .. } => Error::new(
                ErrorKind::UndefinedColumn,
                format!("column \"{}\" does not exist", field.name),
            ),
            SchemaError::AmbiguousReference { field } => Error::new(
                ErrorKind::AmbiguousColumn,
                format!("column reference \"{}\" is ambiguous", field.name),
            ),
            other => Error::new(ErrorKind::UndefinedColumn, other.to_string()),
        },
        DataFusionError::SQL(e, _) => Error::syntax(format!("syntax error: {e}")),
        DataFusionError::Plan(m)
        | DataFusionError::Execution(m)
        | DataFusionError::NotImplemented(m)
            if postgresql_error(&m).is_some() =>
        {
            postgresql_error(&m).expect("matched")
        }
        DataFusionError::Plan(m) if m.starts_with("table '") && m.ends_with("' not found") => {
            let name = m["table '".len()..m.len() - "' not found".len()]
                .rsplit('.')
                .next()
                .unwrap_or("")
                .to_string();
            Error::new(
                ErrorKind::UndefinedTable,
                format!("relation \"{name}\" does not exist"),
            )
            .with_hint("SHOW STREAMS and SHOW METRICS list what can be queried.")
        }
        DataFusionError::Plan(m) if m.starts_with("Invalid function") => {
            let message = m.lines().next().unwrap_or_default();
            let name = message.split('\'').nth(1).unwrap_or(message);
            let mut e = Error::new(
                ErrorKind::UndefinedFunction,
                format!("function {name} does not exist"),
            );
            if let Some(hint) = m.lines().nth(1) {
                e = e.with_hint(hint.to_string());
            }
            e
        }
        DataFusionError::Plan(m) if m.contains("oerc") || m.contains("type") => {
            Error::new(ErrorKind::DatatypeMismatch, m)
        }
        DataFusionError::Plan(m) => Error::syntax(m),
        DataFusionError::NotImplemented(m) => Error::unsupported(m),
        DataFusionError::ArrowError(e, _)
            if matches!(*e, datafusion::arrow::error::ArrowError::DivideByZero) =>
        {
            Error::new(ErrorKind::DivisionByZero, "division by zero")
        }
        DataFusionError::ArrowError(e, _) => {
            let message = e.to_string();
            // Text that is no timestamp at all: PostgreSQL's 22007.
            let prefix = "Parser error: Error parsing timestamp from '";
            match message
                .strip_prefix(prefix)
                .and_then(|r| r.split_once("':"))
            {
                Some((text, _)) => Error::new(
                    ErrorKind::InvalidDatetime,
                    format!("invalid input syntax for type timestamp: \"{text}\""),
                ),
                None => cast_error(&message)
                    .unwrap_or_else(|| Error::new(ErrorKind::InvalidText, message)),
            }
        }
        // Eddy's own errors raised inside DataFusion (rewrites, functions, table scans).
        DataFusionError::External(inner) if inner.is::<Error>() => {
            *inner.downcast::<Error>().expect("checked")
        }
        DataFusionError::Context(_, inner) => datafusion_error(*inner),
        DataFusionError::Diagnostic(_, inner) => datafusion_error(*inner),
        // Wrapped (shared between partitions, or in an Arrow error): by its text.
        other => {
            let message = other.to_string();
            postgresql_error(&message).unwrap_or_else(|| Error::internal(message))
        }
    }
}

/// PostgreSQL's error for Arrow's failed cast of text (`'x'::date`, `'9e99'::bigint`)
/// or of a number too wide for a `numeric(p, s)`.
fn cast_error(message: &str) -> Option<Error> {
    if message.contains("too large to store in a Decimal128") {
        return Some(Error::new(
            ErrorKind::NumericOutOfRange,
            "numeric field overflow",
        ));
    }
    let rest = message.split("Cannot cast string '").nth(1)?;
    let (text, rest) = rest.rsplit_once("' to value of ")?;
    let arrow = rest.split(' ').next()?;
    let (name, kind) = match arrow {
        "Date32" | "Date64" => ("date", ErrorKind::InvalidDatetime),
        "Int16" => ("smallint", ErrorKind::InvalidText),
        "Int32" => ("integer", ErrorKind::InvalidText),
        "Int64" => ("bigint", ErrorKind::InvalidText),
        _ => return None,
    };
    // A whole number that does not fit is out of range; anything else is no number.
    let t = text.trim();
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    if kind == ErrorKind::InvalidText
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
    {
        return Some(Error::new(
            ErrorKind::NumericOutOfRange,
            format!("value \"{text}\" is out of range for type {name}"),
        ));
    }
    Some(Error::new(
        kind,
        format!("invalid input syntax for type {name}: \"{text}\""),
    ))
}

/// The regex of a SIMILAR TO pattern, as PostgreSQL's `similar_escape` makes it: the
/// whole text must match; `%` is any text and `_` any character; `(` groups without
/// capturing; `.`, `^`, `$` and `\` are themselves; the character after `escape` is
/// itself; inside brackets, characters are kept.
pub fn similar_to_regex(pattern: &str, escape: Option<char>) -> String {
    let mut regex = String::from("^(?:");
    let (mut escaped, mut in_class) = (false, false);
    for c in pattern.chars() {
        if escaped {
            regex.push('\\');
            regex.push(c);
            escaped = false;
        } else if Some(c) == escape {
            escaped = true;
        } else if in_class {
            if c == '\\' {
                regex.push('\\');
            }
            regex.push(c);
            in_class = c != ']';
        } else {
            match c {
                '%' => regex.push_str(".*"),
                '_' => regex.push('.'),
                '(' => regex.push_str("(?:"),
                '[' => {
                    regex.push('[');
                    in_class = true;
                }
                '.' | '^' | '$' | '\\' => {
                    regex.push('\\');
                    regex.push(c);
                }
                c => regex.push(c),
            }
        }
    }
    // An escape at the end escapes nothing, as in PostgreSQL 15.
    regex.push_str(")$");
    regex
}

/// `(a) ~ regex`, or `!~` when `negated`: what `a [NOT] SIMILAR TO p` becomes, with
/// `regex` the pattern's (`similar_to_regex`).
pub fn regex_match(
    negated: bool,
    a: &datafusion::sql::sqlparser::ast::Expr,
    regex: datafusion::sql::sqlparser::ast::Expr,
) -> datafusion::sql::sqlparser::ast::Expr {
    use datafusion::sql::sqlparser::ast::{BinaryOperator, Expr};
    Expr::Nested(Box::new(Expr::BinaryOp {
        left: Box::new(Expr::Nested(Box::new(a.clone()))),
        op: match negated {
            true => BinaryOperator::PGRegexNotMatch,
            false => BinaryOperator::PGRegexMatch,
        },
        right: Box::new(regex),
    }))
}

/// `a LIKE p ESCAPE e` (or ILIKE) with a constant pattern and another escape than the
/// backslash, the only one DataFusion takes, rewritten in place with the backslash: the
/// escape makes the next character literal, a backslash is then an ordinary character,
/// and an empty escape means none. A pattern that ends with its escape, or an escape of
/// more than one character, fails with 22025 as in PostgreSQL. Whether `e` changed.
pub fn like_escape(e: &mut datafusion::sql::sqlparser::ast::Expr) -> Result<bool> {
    use datafusion::sql::sqlparser::ast::{Expr, Value};
    let (Expr::Like {
        pattern,
        escape_char: escape @ Some(_),
        ..
    }
    | Expr::ILike {
        pattern,
        escape_char: escape @ Some(_),
        ..
    }) = e
    else {
        return Ok(false);
    };
    let (Expr::Value(p), Some(Value::SingleQuotedString(e))) =
        (pattern.as_ref(), escape.as_ref().map(|e| &e.value))
    else {
        return Ok(false);
    };
    let Value::SingleQuotedString(p) = &p.value else {
        return Ok(false);
    };
    let mut chars = e.chars();
    let escape_char = match (chars.next(), chars.next()) {
        (None, _) => None,
        (Some(c), None) => Some(c),
        _ => {
            return Err(
                Error::new(ErrorKind::InvalidEscapeSequence, "invalid escape string")
                    .with_hint("Escape string must be empty or one character."),
            )
        }
    };
    let mut out = String::with_capacity(p.len() + 4);
    let mut it = p.chars();
    while let Some(c) = it.next() {
        match c {
            c if Some(c) == escape_char => {
                let Some(next) = it.next() else {
                    return Err(Error::new(
                        ErrorKind::InvalidEscapeSequence,
                        "LIKE pattern must not end with escape character",
                    ));
                };
                out.push('\\');
                out.push(next);
            }
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    **pattern = Expr::value(Value::SingleQuotedString(out));
    *escape = None;
    Ok(true)
}

/// `text` with PostgreSQL's patterns where DataFusion's differ: each
/// `a [NOT] SIMILAR TO 'p' [ESCAPE 'e']` a regex match of the whole of `a` (DataFusion's
/// own searches `p` as a regex anywhere in `a`), the pattern a constant; each LIKE with
/// another escape than the backslash rewritten (`like_escape`). `text` itself when it
/// has none.
fn postgres_patterns(text: &str) -> Result<std::borrow::Cow<'_, str>> {
    use datafusion::sql::sqlparser::ast::{self, visit_expressions_mut, Expr};
    use std::ops::ControlFlow;
    let lower = text.to_ascii_lowercase();
    if !lower.contains("similar") && !lower.contains("escape") {
        return Ok(text.into());
    }
    let dialect = datafusion::sql::sqlparser::dialect::PostgreSqlDialect {};
    let mut expr = datafusion::sql::sqlparser::parser::Parser::new(&dialect)
        .try_with_sql(text)
        .and_then(|mut p| p.parse_expr())
        .map_err(crate::sql::parser_error)?;
    let mut found = false;
    let rewritten = visit_expressions_mut(&mut expr, |e| {
        match like_escape(e) {
            Ok(changed) => found |= changed,
            Err(e) => return ControlFlow::Break(e),
        }
        let Expr::SimilarTo {
            negated,
            expr: inner,
            pattern,
            escape_char,
        } = e
        else {
            return ControlFlow::Continue(());
        };
        let constant = |e: &Expr| match e {
            Expr::Value(v) => match &v.value {
                ast::Value::SingleQuotedString(s) => Some(Some(s.clone())),
                ast::Value::Null => Some(None),
                _ => None,
            },
            _ => None,
        };
        let Some(p) = constant(pattern) else {
            return ControlFlow::Break(
                Error::new(
                    ErrorKind::Unsupported,
                    "SIMILAR TO in a metric's WHERE takes a constant pattern",
                )
                .with_hint("Write the pattern as a string literal, or use ~ with a regex."),
            );
        };
        let escape = match escape_char.as_ref().map(|v| &v.value) {
            None => Some('\\'),
            Some(ast::Value::SingleQuotedString(e)) => e.chars().next(),
            Some(_) => None,
        };
        let regex = match p {
            Some(p) => ast::Value::SingleQuotedString(similar_to_regex(&p, escape)),
            None => ast::Value::Null,
        };
        found = true;
        *e = regex_match(*negated, inner, Expr::value(regex));
        ControlFlow::Continue(())
    });
    if let ControlFlow::Break(e) = rewritten {
        return Err(e);
    }
    Ok(match found {
        true => expr.to_string().into(),
        false => text.into(),
    })
}

impl Filter {
    /// Compiles `text` against the stream's columns; fails on unknown columns and on
    /// predicates that are not boolean.
    pub fn compile(stream: &StreamDef, text: &str) -> Result<Filter> {
        let schema = stream_schema(stream);
        let df_schema = DFSchema::try_from(schema.as_ref().clone()).map_err(datafusion_error)?;
        let logical = session()
            .parse_sql_expr(&postgres_patterns(text)?, &df_schema)
            .map_err(datafusion_error)?;
        // Coerce types with PostgreSQL's integer literals, make the arithmetic
        // PostgreSQL's (`arith`: an event whose arithmetic fails does not pass), and fold
        // constants now, so that a bad literal ('abc' compared with a number) fails at
        // CREATE METRIC, not at every later INSERT.
        let simplify = SimplifyContext::builder()
            .with_schema(Arc::new(df_schema.clone()))
            .build();
        let simplifier = ExprSimplifier::new(simplify);
        let logical = logical
            .transform_up(|e| Ok(crate::arith::int_literal(e)))
            .map(|t| t.data)
            .and_then(|e| simplifier.coerce(e, &df_schema))
            .and_then(|e| e.transform_up(|e| crate::arith::checked(e, &df_schema)))
            .and_then(|t| simplifier.simplify(t.data))
            .map_err(datafusion_error)?;
        let expr = session()
            .create_physical_expr(logical, &df_schema)
            .map_err(datafusion_error)?;
        let ty = expr.data_type(&schema).map_err(datafusion_error)?;
        if ty != DataType::Boolean {
            return Err(Error::new(
                ErrorKind::DatatypeMismatch,
                format!("argument of WHERE must be type boolean, not type {ty}"),
            ));
        }
        let filter = Filter {
            text: text.to_string(),
            expr,
        };
        filter.probe(stream).map_err(|e| match e.kind {
            // Constant arithmetic that fails (`2147483647 + 1`) fails as in PostgreSQL.
            ErrorKind::NumericOutOfRange | ErrorKind::DivisionByZero => e,
            _ => Error::unsupported(format!("WHERE {text} cannot be evaluated per event: {}", e.message))
                .with_hint("Metric filters may use the stream's columns, constants, operators and deterministic functions."),
        })?;
        Ok(filter)
    }

    /// Evaluates the predicate once over a row of NULLs, so that expressions that cannot
    /// run per event (such as `now()`) are refused when the metric is created.
    fn probe(&self, stream: &StreamDef) -> Result<()> {
        let schema = Arc::new(Schema::new(
            stream
                .columns
                .iter()
                .map(|c| Field::new(&c.name, c.ty.arrow(), true))
                .collect::<Vec<_>>(),
        ));
        let row = vec![Value::Null; stream.columns.len()];
        let batch = rows_to_batch(schema, &stream_types(stream), &[row])?;
        let value = self.expr.evaluate(&batch).map_err(datafusion_error)?;
        value.into_array(1).map_err(datafusion_error)?;
        Ok(())
    }

    /// Evaluates the predicate over a batch; `true` where the event passes. When the batch
    /// fails (say, a division by zero in one row), rows are evaluated one by one and a
    /// row whose evaluation fails does not pass, like a NULL.
    pub fn evaluate(&self, batch: &RecordBatch) -> Result<Vec<bool>> {
        match self.evaluate_batch(batch) {
            Ok(mask) => Ok(mask),
            Err(_) => Ok((0..batch.num_rows())
                .map(|i| {
                    self.evaluate_batch(&batch.slice(i, 1))
                        .is_ok_and(|m| m.first().copied().unwrap_or(false))
                })
                .collect()),
        }
    }

    fn evaluate_batch(&self, batch: &RecordBatch) -> Result<Vec<bool>> {
        let value = self.expr.evaluate(batch).map_err(datafusion_error)?;
        let array = value
            .into_array(batch.num_rows())
            .map_err(datafusion_error)?;
        let mask = array
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(|| Error::internal("WHERE did not produce booleans"))?;
        Ok((0..mask.len())
            .map(|i| mask.is_valid(i) && mask.value(i))
            .collect())
    }
}

/// Builds an Arrow batch from rows whose values follow `types`.
pub fn rows_to_batch<R: AsRef<[Value]>>(
    schema: SchemaRef,
    types: &[ResultType],
    rows: &[R],
) -> Result<RecordBatch> {
    assert_eq!(schema.fields().len(), types.len());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(types.len());
    for (i, ty) in types.iter().enumerate() {
        let mut b = ColumnBuilder::new(*ty, rows.len());
        for r in rows {
            b.push(&r.as_ref()[i]);
        }
        columns.push(b.finish());
    }
    batch_of(schema, columns, rows.len())
}

fn batch_of(schema: SchemaRef, columns: Vec<ArrayRef>, rows: usize) -> Result<RecordBatch> {
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    RecordBatch::try_new_with_options(schema, columns, &options)
        .map_err(|e| Error::internal(e.to_string()))
}

/// An Arrow array of one result type, built a value at a time. A value of another type
/// than the column's is NULL.
pub enum ColumnBuilder {
    Numeric(Decimal128Builder),
    Boolean(BooleanBuilder),
    Int32(Int32Builder),
    Int64(Int64Builder),
    Float32(Float32Builder),
    Float64(Float64Builder),
    Text(StringBuilder),
    Timestamp(TimestampMicrosecondBuilder, Option<&'static str>),
}

impl ColumnBuilder {
    /// Room for `n` values.
    pub fn new(ty: ResultType, n: usize) -> ColumnBuilder {
        match ty {
            ResultType::Numeric => ColumnBuilder::Numeric(Decimal128Builder::with_capacity(n)),
            ResultType::Column(c) => match c {
                ColumnType::Boolean => ColumnBuilder::Boolean(BooleanBuilder::with_capacity(n)),
                ColumnType::Int32 => ColumnBuilder::Int32(Int32Builder::with_capacity(n)),
                ColumnType::Int64 => ColumnBuilder::Int64(Int64Builder::with_capacity(n)),
                ColumnType::Float32 => ColumnBuilder::Float32(Float32Builder::with_capacity(n)),
                ColumnType::Float64 => ColumnBuilder::Float64(Float64Builder::with_capacity(n)),
                ColumnType::Text => ColumnBuilder::Text(StringBuilder::with_capacity(n, n * 8)),
                ColumnType::Timestamp | ColumnType::TimestampTz => ColumnBuilder::Timestamp(
                    TimestampMicrosecondBuilder::with_capacity(n),
                    (c == ColumnType::TimestampTz).then_some("UTC"),
                ),
            },
        }
    }

    pub fn push(&mut self, v: &Value) {
        match self {
            ColumnBuilder::Numeric(b) => match v {
                Value::Numeric(x) => b.append_value(x.get()),
                Value::Int(x) => b.append_value(*x as i128),
                _ => b.append_null(),
            },
            ColumnBuilder::Boolean(b) => b.append_option(match v {
                Value::Bool(x) => Some(*x),
                _ => None,
            }),
            ColumnBuilder::Int32(b) => b.append_option(match v {
                Value::Int(x) => Some(*x as i32),
                _ => None,
            }),
            ColumnBuilder::Int64(b) => b.append_option(match v {
                Value::Int(x) => Some(*x),
                _ => None,
            }),
            ColumnBuilder::Float32(b) => b.append_option(v.as_f64().map(|x| x as f32)),
            ColumnBuilder::Float64(b) => b.append_option(v.as_f64()),
            ColumnBuilder::Text(b) => match v {
                Value::Text(s) => b.append_value(s),
                _ => b.append_null(),
            },
            ColumnBuilder::Timestamp(b, _) => b.append_option(match v {
                Value::Timestamp(x) => Some(*x),
                _ => None,
            }),
        }
    }

    /// Appends a text value without making a `Value` of it (NULL in a column of
    /// another type).
    pub fn push_text(&mut self, s: &str) {
        match self {
            ColumnBuilder::Text(b) => b.append_value(s),
            other => other.push(&Value::Null),
        }
    }

    pub fn finish(&mut self) -> ArrayRef {
        match self {
            ColumnBuilder::Numeric(b) => Arc::new(
                b.finish()
                    .with_precision_and_scale(38, 0)
                    .expect("valid decimal"),
            ),
            ColumnBuilder::Boolean(b) => Arc::new(b.finish()),
            ColumnBuilder::Int32(b) => Arc::new(b.finish()),
            ColumnBuilder::Int64(b) => Arc::new(b.finish()),
            ColumnBuilder::Float32(b) => Arc::new(b.finish()),
            ColumnBuilder::Float64(b) => Arc::new(b.finish()),
            ColumnBuilder::Text(b) => Arc::new(b.finish()),
            ColumnBuilder::Timestamp(b, zone) => Arc::new(b.finish().with_timezone_opt(*zone)),
        }
    }
}

/// A batch of a stream's events built a row at a time, as `rows_to_batch` builds it.
pub struct BatchBuilder {
    schema: SchemaRef,
    columns: Vec<ColumnBuilder>,
    rows: usize,
}

impl BatchBuilder {
    /// Room for `n` rows of `stream`.
    pub fn new(stream: &StreamDef, n: usize) -> BatchBuilder {
        BatchBuilder {
            schema: stream_schema(stream),
            columns: stream_types(stream)
                .into_iter()
                .map(|ty| ColumnBuilder::new(ty, n))
                .collect(),
            rows: 0,
        }
    }

    /// Column `i`'s builder: every column takes one value per row.
    pub fn column(&mut self, i: usize) -> &mut ColumnBuilder {
        &mut self.columns[i]
    }

    /// Counts a row whose values every column took.
    pub fn end_row(&mut self) {
        self.rows += 1;
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The batch of the rows so far; the builder starts again, empty.
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let columns = self.columns.iter_mut().map(ColumnBuilder::finish).collect();
        batch_of(self.schema.clone(), columns, std::mem::take(&mut self.rows))
    }
}

/// The types of a stream's columns as result types.
pub fn stream_types(stream: &StreamDef) -> Vec<ResultType> {
    stream
        .columns
        .iter()
        .map(|c| ResultType::Column(c.ty))
        .collect()
}

/// Rows from equally long columns of values, sharing one block.
pub fn columns_to_rows(columns: Vec<Vec<Value>>, n: usize) -> Vec<Row> {
    let mut values = Vec::with_capacity(n * columns.len());
    let mut iters: Vec<_> = columns.into_iter().map(Vec::into_iter).collect();
    for _ in 0..n {
        values.extend(iters.iter_mut().map(|it| it.next().unwrap_or(Value::Null)));
    }
    Row::block(values, n)
}

/// The rows of a batch `rows_to_batch` built from a stream's rows.
pub fn batch_to_rows(batch: &RecordBatch) -> Result<Vec<Row>> {
    let columns = batch
        .columns()
        .iter()
        .map(column_values)
        .collect::<Result<Vec<_>>>()?;
    Ok(columns_to_rows(columns, batch.num_rows()))
}

/// The values of an Arrow column as `Value`s (the inverse of `rows_to_batch` for the
/// column types events use; Int32 and Float32 may come back from wider arrays).
pub fn column_values(array: &ArrayRef) -> Result<Vec<Value>> {
    use datafusion::arrow::array::{
        Float32Array, Float64Array, Int32Array, Int64Array, StringArray, TimestampMicrosecondArray,
    };
    fn get<T: 'static>(array: &ArrayRef) -> Result<&T> {
        array
            .as_any()
            .downcast_ref::<T>()
            .ok_or_else(|| Error::internal(format!("unexpected array {}", array.data_type())))
    }
    let n = array.len();
    let mut out = Vec::with_capacity(n);
    macro_rules! fill {
        ($ty:ty, $wrap:expr) => {{
            let a = get::<$ty>(array)?;
            for i in 0..n {
                out.push(if a.is_null(i) {
                    Value::Null
                } else {
                    $wrap(a.value(i))
                });
            }
        }};
    }
    match array.data_type() {
        DataType::Null => out.resize(n, Value::Null),
        DataType::Boolean => fill!(BooleanArray, Value::Bool),
        DataType::Int32 => fill!(Int32Array, |v: i32| Value::Int(v as i64)),
        DataType::Int64 => fill!(Int64Array, Value::Int),
        DataType::Float32 => fill!(Float32Array, |v: f32| Value::Float(v as f64)),
        DataType::Float64 => fill!(Float64Array, Value::Float),
        DataType::Utf8 => fill!(StringArray, |v: &str| Value::Text(v.into())),
        DataType::Timestamp(_, _) => fill!(TimestampMicrosecondArray, Value::Timestamp),
        other => return Err(Error::internal(format!("unexpected column type {other}"))),
    }
    Ok(out)
}
