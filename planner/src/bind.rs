//! Binding: checks parsed statements against a catalog snapshot and produces the
//! definitions and plans the engine runs.
//!
//! Invariant: binding is pure; a statement that fails to bind has changed nothing.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::sql::sqlparser::ast::{
    self, ColumnOption, CreateTableOptions, DuplicateTreatment, Expr, FunctionArg, FunctionArgExpr,
    FunctionArguments, GroupByExpr, SelectItem, SetExpr, SqlOption, TableFactor, TableObject,
    UnaryOperator,
};

use crate::aggregate::{AggFunc, Fraction, ResultType};
use crate::catalog::{
    AggDef, Catalog, ColumnDef, EventTimeUnit, MetricDef, Source, SourceFormat, StreamDef,
};
use crate::error::{Error, ErrorKind, Result};
use crate::filter::Filter;
use crate::sql::{normalize_ident, object_name, MetricAst};
use crate::types::{parse_duration_us, parse_timestamp, ColumnType, Row, Value};

/// Default `retention` of a stream: how long its reservoir keeps events.
pub const RETENTION_DEFAULT_US: i64 = 7 * 86_400_000_000;

pub fn bind_create_stream(create: &ast::CreateTable, sql: &str) -> Result<StreamDef> {
    let name = object_name(&create.name);
    let mut columns: Vec<ColumnDef> = Vec::new();
    for c in &create.columns {
        let col_name = normalize_ident(&c.name);
        if columns.iter().any(|x| x.name == col_name) {
            return Err(Error::new(
                ErrorKind::DuplicateObject,
                format!("column \"{col_name}\" specified more than once"),
            ));
        }
        let ty = ColumnType::parse(&c.data_type.to_string()).ok_or_else(|| {
            Error::unsupported(format!("type {} is not supported", c.data_type)).with_hint(
                "Use BOOLEAN, INTEGER, BIGINT, REAL, DOUBLE PRECISION, TEXT or TIMESTAMP.",
            )
        })?;
        let mut column = ColumnDef {
            name: col_name,
            ty,
            not_null: false,
            default: None,
        };
        for o in &c.options {
            match &o.option {
                ColumnOption::NotNull => column.not_null = true,
                ColumnOption::Null => column.not_null = false,
                ColumnOption::Default(expr) => {
                    column.default = Some(column_default(&column, expr)?)
                }
                ColumnOption::PrimaryKey(_) => return Err(unsupported_constraint("PRIMARY KEY")),
                ColumnOption::Unique(_) => return Err(unsupported_constraint("UNIQUE")),
                ColumnOption::ForeignKey(_) => return Err(unsupported_constraint("REFERENCES")),
                ColumnOption::Check(_) => return Err(unsupported_constraint("CHECK")),
                other => {
                    return Err(Error::unsupported(format!(
                        "column option {other} is not supported on a stream"
                    ))
                    .with_hint("A stream column takes NOT NULL, NULL and DEFAULT."))
                }
            }
        }
        columns.push(column);
    }
    if columns.is_empty() {
        return Err(Error::syntax("a stream needs at least one column"));
    }
    if let Some(c) = create.constraints.first() {
        return Err(unsupported_constraint(match c {
            ast::TableConstraint::PrimaryKey(_) => "PRIMARY KEY",
            ast::TableConstraint::Unique(_) => "UNIQUE",
            ast::TableConstraint::ForeignKey(_) => "FOREIGN KEY",
            ast::TableConstraint::Check(_) => "CHECK",
            _ => "this table constraint",
        }));
    }
    let options = match &create.table_options {
        CreateTableOptions::With(opts) => opts.clone(),
        CreateTableOptions::None => Vec::new(),
        _ => {
            return Err(Error::syntax(
                "stream options are written WITH (key = value, …)",
            ))
        }
    };
    let mut event_time = None;
    let mut event_id = None;
    let mut partition_by: Vec<usize> = Vec::new();
    let mut partitions = 1u32;
    let mut lateness_us = 0;
    let mut retention_us = RETENTION_DEFAULT_US;
    let mut kafka_topic = None;
    let mut format = None;
    let mut millis = false;
    let column_of = |text: &str, option: &str| -> Result<usize> {
        named_column(&columns, text).ok_or_else(|| {
            Error::new(
                ErrorKind::UndefinedColumn,
                format!(
                    "column \"{}\" named by {option} does not exist in stream \"{name}\"",
                    text.trim()
                ),
            )
        })
    };
    for opt in options {
        let SqlOption::KeyValue { key, value } = opt else {
            return Err(Error::syntax("stream options are written key = value"));
        };
        let key = normalize_ident(&key).to_lowercase();
        let text = option_text(&value);
        match key.as_str() {
            "event_time" => event_time = Some(column_of(&text, "event_time")?),
            "event_id" => event_id = Some(column_of(&text, "event_id")?),
            "event_time_unit" => match text.to_lowercase().as_str() {
                "ms" | "millisecond" | "milliseconds" => millis = true,
                _ => return Err(invalid_option("event_time_unit", &text, "'ms' (a BIGINT of milliseconds since 1970-01-01 UTC)")),
            },
            "partition_by" => {
                for part in name_list(&text).iter().filter(|p| !p.trim().is_empty()) {
                    let idx = column_of(part, "partition_by")?;
                    if !partition_by.contains(&idx) {
                        partition_by.push(idx);
                    }
                }
            }
            "partitions" => {
                partitions = text
                    .parse()
                    .ok()
                    .filter(|p| (1..=1024).contains(p))
                    .ok_or_else(|| invalid_option("partitions", &text, "an integer from 1 to 1024"))?
            }
            "lateness" => {
                lateness_us = parse_duration_us(&text)
                    .filter(|d| *d >= 0)
                    .ok_or_else(|| invalid_option("lateness", &text, "a duration such as '5 seconds'"))?
            }
            "retention" => {
                retention_us = parse_duration_us(&text)
                    .filter(|d| *d > 0)
                    .ok_or_else(|| invalid_option("retention", &text, "a duration such as '30 days'"))?
            }
            "kafka_topic" => {
                let valid = !text.is_empty()
                    && text.len() <= 249
                    && text
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
                if !valid {
                    return Err(invalid_option(
                        "kafka_topic",
                        &text,
                        "a Kafka topic name: letters, digits, '.', '_' and '-'",
                    ));
                }
                kafka_topic = Some(text)
            }
            "format" => match text.to_lowercase().as_str() {
                "json" => format = Some(SourceFormat::Json),
                _ => return Err(invalid_option("format", &text, "'json'")),
            },
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidParameter,
                    format!("unrecognized stream option \"{other}\""),
                )
                .with_hint("Valid options: event_time, event_time_unit, event_id, partition_by, partitions, lateness, retention, kafka_topic, format."))
            }
        }
    }
    let event_time = event_time.ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidParameter,
            format!("stream \"{name}\" needs an event_time"),
        )
        .with_hint(
            "Add WITH (event_time = 'ts') naming a TIMESTAMP or BIGINT (milliseconds) column.",
        )
    })?;
    let event_time_unit = match columns[event_time].ty {
        ColumnType::Timestamp | ColumnType::TimestampTz if millis => {
            return Err(Error::new(
                ErrorKind::DatatypeMismatch,
                format!(
                    "event_time_unit = 'ms' needs a BIGINT event_time, but \"{}\" is a TIMESTAMP",
                    columns[event_time].name
                ),
            )
            .with_hint("Remove event_time_unit: a TIMESTAMP column is read as it is."))
        }
        ColumnType::Timestamp | ColumnType::TimestampTz => EventTimeUnit::Timestamp,
        ColumnType::Int64 => EventTimeUnit::Millis,
        other => {
            return Err(Error::new(
                ErrorKind::DatatypeMismatch,
                format!(
                    "event_time column \"{}\" is of type {} but must be TIMESTAMP or BIGINT",
                    columns[event_time].name,
                    other.sql_name()
                ),
            ))
        }
    };
    columns[event_time].not_null = true;
    if partition_by.is_empty() && partitions != 1 {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            "a stream without partition_by has exactly one task",
        )
        .with_hint("Add partition_by = 'column' to spread the stream over several tasks."));
    }
    let source = match (kafka_topic, format) {
        (Some(topic), format) => Some(Source {
            topic,
            format: format.unwrap_or(SourceFormat::Json),
        }),
        (None, Some(_)) => {
            return Err(Error::new(
                ErrorKind::InvalidParameter,
                "the format option describes an external topic",
            )
            .with_hint("Add kafka_topic = 'name', or remove format."))
        }
        (None, None) => None,
    };
    Ok(StreamDef {
        source,
        name,
        columns,
        event_time,
        event_time_unit,
        event_id,
        partitioners: partition_by,
        partitions,
        lateness_us,
        retention_us,
        sql: sql.to_string(),
    })
}

/// The column an option's text names. A name in double quotes is taken as written;
/// another is the column of that exact name if there is one, else of its lower-cased
/// form: `event_time = 'Ts'`, `= '"Ts"'` and `= "Ts"` all name a column `"Ts"`, and
/// `'TS'` names `ts`.
fn named_column(columns: &[ColumnDef], text: &str) -> Option<usize> {
    let text = text.trim();
    let quoted = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .filter(|t| !t.is_empty());
    let find = |name: &str| columns.iter().position(|c| c.name == name);
    match quoted {
        Some(inner) => find(&inner.replace("\"\"", "\"")),
        None => find(text).or_else(|| find(&text.to_lowercase())),
    }
}

/// A comma-separated list of names, split outside double quotes.
fn name_list(text: &str) -> Vec<String> {
    let (mut out, mut current, mut quoted) = (Vec::new(), String::new(), false);
    for ch in text.chars() {
        match ch {
            '"' => {
                quoted = !quoted;
                current.push(ch);
            }
            ',' if !quoted => out.push(std::mem::take(&mut current)),
            _ => current.push(ch),
        }
    }
    out.push(current);
    out
}

/// 0A000 for a constraint a stream cannot keep: events are appended, never checked
/// against each other or other relations.
fn unsupported_constraint(what: &str) -> Error {
    Error::unsupported(format!("{what} constraints are not supported on streams")).with_hint(
        "Streams are append-only. To apply each event once, name its unique id column \
             WITH (event_id = 'column'); a metric's WHERE keeps the events it counts.",
    )
}

/// A column's `DEFAULT`, a constant of the column's type (22P02 and the like when it
/// is not one), fixed when the stream is created.
fn column_default(column: &ColumnDef, expr: &Expr) -> Result<Value> {
    if !is_constant(expr) {
        return Err(Error::unsupported(format!(
            "DEFAULT of stream column \"{}\" must be a constant",
            column.name
        ))
        .with_hint("Give the value in the INSERT instead, for example now()."));
    }
    value_from_expr(expr, column)
}

fn option_text(value: &Expr) -> String {
    match value {
        Expr::Value(v) => match &v.value {
            ast::Value::SingleQuotedString(s) => s.clone(),
            ast::Value::Number(n, _) => n.to_string(),
            other => other.to_string(),
        },
        Expr::Identifier(i) => normalize_ident(i),
        other => other.to_string(),
    }
}

fn invalid_option(key: &str, text: &str, expected: &str) -> Error {
    Error::new(
        ErrorKind::InvalidParameter,
        format!("invalid value for option \"{key}\": \"{text}\""),
    )
    .with_hint(format!("Expected {expected}."))
}

pub use crate::error::undefined_stream;

pub fn bind_create_metric(catalog: &Catalog, m: &MetricAst) -> Result<MetricDef> {
    let select = &m.select;
    if select.from.len() != 1 || !select.from[0].joins.is_empty() {
        return Err(Error::unsupported("a metric reads exactly one stream"));
    }
    let stream_name = match &select.from[0].relation {
        TableFactor::Table { name, .. } => object_name(name),
        _ => return Err(Error::unsupported("a metric reads exactly one stream")),
    };
    let stream = catalog.stream(&stream_name).ok_or_else(|| {
        if catalog.metric(&stream_name).is_some() {
            Error::unsupported(format!(
                "\"{stream_name}\" is a metric; metrics read streams"
            ))
        } else {
            undefined_stream(&stream_name)
        }
    })?;
    if select.having.is_some() || select.distinct.is_some() {
        return Err(
            Error::unsupported("HAVING and DISTINCT are not supported in a metric")
                .with_hint("Filter the metric's rows when you SELECT from it."),
        );
    }
    let column = |ident: &ast::Ident| -> Result<usize> {
        let name = normalize_ident(ident);
        stream
            .column_index(&name)
            .ok_or_else(|| Error::undefined_column(&name, &stream.name))
    };
    let mut group_by = Vec::new();
    match &select.group_by {
        GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() => {
            for e in exprs {
                match e {
                    Expr::Identifier(i) => group_by.push(column(i)?),
                    Expr::CompoundIdentifier(parts) if parts.len() == 2 => {
                        group_by.push(column(&parts[1])?)
                    }
                    other => {
                        return Err(Error::unsupported(format!(
                            "GROUP BY {other}: metrics group by stream columns"
                        )))
                    }
                }
            }
        }
        _ => {
            return Err(Error::unsupported(
                "GROUP BY ALL and grouping sets are not supported",
            ))
        }
    }
    let mut aggregates: Vec<AggDef> = Vec::new();
    for item in &select.projection {
        let (expr, alias) = match item {
            SelectItem::UnnamedExpr(e) => (e, None),
            SelectItem::ExprWithAlias { expr, alias } => (expr, Some(normalize_ident(alias))),
            _ => {
                return Err(Error::unsupported("SELECT * is not allowed in a metric")
                    .with_hint("List the group-by columns and the aggregates."))
            }
        };
        match expr {
            Expr::Identifier(i) => {
                let idx = column(i)?;
                if !group_by.contains(&idx) {
                    return Err(Error::new(
                        ErrorKind::Grouping,
                        format!(
                            "column \"{}\" must appear in the GROUP BY clause or be used in an aggregate function",
                            stream.columns[idx].name
                        ),
                    ));
                }
            }
            Expr::Function(f) => {
                let agg = bind_aggregate(stream, f, alias)?;
                aggregates.push(agg);
            }
            other => {
                return Err(Error::unsupported(format!(
                    "metric column {other} is neither a group-by column nor an aggregate"
                ))
                .with_hint("Compute expressions over a metric when you SELECT from it."))
            }
        }
    }
    if aggregates.is_empty() {
        return Err(Error::syntax("a metric needs at least one aggregate"));
    }
    let mut names = BTreeSet::new();
    for name in group_by
        .iter()
        .map(|i| stream.columns[*i].name.clone())
        .chain(aggregates.iter().map(|a| a.alias.clone()))
    {
        if !names.insert(name.clone()) {
            return Err(Error::new(
                ErrorKind::DuplicateObject,
                format!("metric column \"{name}\" appears more than once"),
            )
            .with_hint("Give each aggregate its own name with AS."));
        }
    }
    let filter = match &select.selection {
        Some(e) => {
            let text = e.to_string();
            Filter::compile(stream, &text)?;
            Some(text)
        }
        None => None,
    };
    let partitioner = if stream.partitioners.is_empty() {
        0
    } else if group_by.is_empty() {
        if stream.partitions != 1 {
            return Err(Error::unsupported(format!(
                "a metric without GROUP BY needs stream \"{}\" to have partitions = 1",
                stream.name
            ))
            .with_hint(format!(
                "Group by the partitioner column \"{}\".",
                stream.columns[stream.partitioners[0]].name
            )));
        }
        0
    } else {
        stream
            .partitioners
            .iter()
            .position(|p| group_by.contains(p))
            .ok_or_else(|| {
                let names: Vec<&str> = stream
                    .partitioners
                    .iter()
                    .map(|p| stream.columns[*p].name.as_str())
                    .collect();
                Error::unsupported("GROUP BY must include a partitioner column of the stream")
                    .with_hint(format!("Group by one of: {}.", names.join(", ")))
            })?
    };
    Ok(MetricDef {
        name: m.name.clone(),
        stream: stream.name.clone(),
        window: m.window,
        filter,
        group_by,
        aggregates,
        partitioner,
        sql: m.sql.clone(),
    })
}

fn bind_aggregate(stream: &StreamDef, f: &ast::Function, alias: Option<String>) -> Result<AggDef> {
    let fname = object_name(&f.name);
    let FunctionArguments::List(list) = &f.args else {
        return Err(Error::unsupported(format!("{fname} is not an aggregate")));
    };
    if f.filter.is_some() || f.over.is_some() || !list.clauses.is_empty() {
        return Err(Error::unsupported(format!(
            "{fname}: FILTER, OVER and ORDER BY are not supported in metrics"
        )));
    }
    if !f.within_group.is_empty() {
        return bind_ordered_set(stream, &fname, list, &f.within_group, alias);
    }
    let distinct = matches!(list.duplicate_treatment, Some(DuplicateTreatment::Distinct));
    let (star, arg) = match list.args.as_slice() {
        [FunctionArg::Unnamed(FunctionArgExpr::Wildcard)] => (true, None),
        [FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Identifier(i)))] => {
            (false, Some(aggregate_column(stream, i)?))
        }
        _ => {
            return Err(Error::unsupported(format!(
                "{fname}: aggregate arguments must be a single stream column"
            )))
        }
    };
    let func = AggFunc::from_sql(&fname, distinct, star).ok_or_else(|| {
        Error::new(
            ErrorKind::UndefinedFunction,
            format!("aggregate {fname} is not supported"),
        )
        .with_hint("Metrics support COUNT, SUM, AVG, MIN, MAX, STDDEV, STDDEV_POP, VARIANCE, VAR_POP, COUNT(DISTINCT x), LAST_VALUE, MEDIAN, PERCENTILE_CONT and PERCENTILE_DISC.")
    })?;
    aggregate_def(stream, &fname, func, arg, alias)
}

/// The stream column an aggregate names.
fn aggregate_column(stream: &StreamDef, i: &ast::Ident) -> Result<usize> {
    let name = normalize_ident(i);
    stream
        .column_index(&name)
        .ok_or_else(|| Error::undefined_column(&name, &stream.name))
}

/// `PERCENTILE_CONT(f) WITHIN GROUP (ORDER BY x)` and `PERCENTILE_DISC(…)`.
fn bind_ordered_set(
    stream: &StreamDef,
    fname: &str,
    list: &ast::FunctionArgumentList,
    within_group: &[ast::OrderByExpr],
    alias: Option<String>,
) -> Result<AggDef> {
    let usage = format!(
        "{}(fraction) WITHIN GROUP (ORDER BY column)",
        fname.to_uppercase()
    );
    let fraction = match list.args.as_slice() {
        [FunctionArg::Unnamed(FunctionArgExpr::Expr(e))] => literal_fraction(e),
        _ => None,
    }
    .ok_or_else(|| {
        Error::unsupported(format!("{fname}: the fraction must be a numeric constant"))
            .with_hint(usage.clone())
    })?;
    let f = Fraction::new(fraction).ok_or_else(|| {
        Error::new(
            ErrorKind::NumericOutOfRange,
            format!("percentile value {fraction} is not between 0 and 1"),
        )
    })?;
    let (arg, descending) = match within_group {
        [ast::OrderByExpr {
            expr: Expr::Identifier(i),
            options,
            ..
        }] => (aggregate_column(stream, i)?, options.asc == Some(false)),
        _ => {
            return Err(Error::unsupported(format!(
                "{fname}: WITHIN GROUP orders by a single stream column"
            ))
            .with_hint(usage))
        }
    };
    let f = if descending { f.descending() } else { f };
    let func = match fname.to_lowercase().as_str() {
        "percentile_cont" => AggFunc::PercentileCont(f),
        "percentile_disc" => AggFunc::PercentileDisc(f),
        _ => {
            return Err(Error::new(
                ErrorKind::UndefinedFunction,
                format!(
                    "WITHIN GROUP is specified, but {} is not an ordered-set aggregate",
                    fname.to_lowercase()
                ),
            )
            .with_hint("Ordered-set aggregates: PERCENTILE_CONT and PERCENTILE_DISC."))
        }
    };
    aggregate_def(stream, fname, func, Some(arg), alias)
}

/// A numeric literal, possibly negated, as a double.
fn literal_fraction(e: &Expr) -> Option<f64> {
    match e {
        Expr::Value(v) => match &v.value {
            ast::Value::Number(n, _) => n.parse().ok(),
            _ => None,
        },
        Expr::UnaryOp {
            op: ast::UnaryOperator::Minus,
            expr,
        } => literal_fraction(expr).map(|f| -f),
        Expr::Nested(inner) => literal_fraction(inner),
        _ => None,
    }
}

/// An aggregate of `arg` checked against the column's type.
fn aggregate_def(
    stream: &StreamDef,
    fname: &str,
    func: AggFunc,
    arg: Option<usize>,
    alias: Option<String>,
) -> Result<AggDef> {
    if let Some(idx) = arg {
        let ty = stream.columns[idx].ty;
        if func.needs_numeric() && !ty.is_numeric() {
            return Err(Error::new(
                ErrorKind::UndefinedFunction,
                format!(
                    "function {}({}) does not exist",
                    fname.to_lowercase(),
                    ty.sql_name().to_lowercase()
                ),
            )
            .with_hint(format!("{} needs a numeric column.", func.sql_name())));
        }
    }
    Ok(AggDef {
        alias: alias.unwrap_or_else(|| fname.to_lowercase()),
        func,
        arg,
    })
}

/// One output column of `INSERT … RETURNING`.
#[derive(Clone, Debug)]
pub enum ReturningItem {
    Event(usize),
    Metric { metric: Arc<MetricDef>, agg: usize },
}

#[derive(Clone, Debug)]
pub struct ReturningColumn {
    pub name: String,
    pub item: ReturningItem,
    pub ty: ResultType,
}

/// A bound INSERT: rows in the stream's column order, and what to return per row.
#[derive(Clone, Debug)]
pub struct InsertPlan {
    pub stream: Arc<StreamDef>,
    /// Shared slices, as the engine takes rows: no copy between binding and applying.
    pub rows: Vec<Row>,
    pub returning: Option<Vec<ReturningColumn>>,
}

/// The stream a load (`INSERT` or `COPY`, named by `verb`) writes, and the stream
/// column each input position fills: `columns` in order, or all columns when empty.
pub fn load_target(
    catalog: &Catalog,
    name: &str,
    columns: &[String],
    verb: &str,
) -> Result<(Arc<StreamDef>, Vec<usize>)> {
    let stream = catalog.stream(name).cloned().ok_or_else(|| {
        if catalog.metric(name).is_some() {
            Error::unsupported(format!("cannot {verb} into metric \"{name}\""))
                .with_hint("Load events into the metric's stream.")
        } else {
            undefined_stream(name)
        }
    })?;
    let targets = if columns.is_empty() {
        (0..stream.columns.len()).collect()
    } else {
        columns
            .iter()
            .map(|n| {
                stream
                    .column_index(n)
                    .ok_or_else(|| Error::undefined_column(n, &stream.name))
            })
            .collect::<Result<_>>()?
    };
    Ok((stream, targets))
}

/// The stream an INSERT writes and the stream column each VALUES position fills.
fn insert_target(catalog: &Catalog, insert: &ast::Insert) -> Result<(Arc<StreamDef>, Vec<usize>)> {
    let TableObject::TableName(table) = &insert.table else {
        return Err(Error::unsupported(
            "INSERT INTO a table function is not supported",
        ));
    };
    let columns: Vec<String> = insert.columns.iter().map(object_name).collect();
    load_target(catalog, &object_name(table), &columns, "insert")
}

/// One VALUES cell of a prepared INSERT: a constant, the `$n` it takes (0-based), or an
/// expression evaluated per execution (its index in `InsertTemplate::exprs`).
#[derive(Clone, Debug)]
enum Slot {
    Const(Value),
    Param(usize),
    Expr(usize),
}

/// An INSERT bound once against a catalog, with its `$n` parameters still open: a
/// prepared INSERT binds each execution's parameters into rows without parsing again.
#[derive(Clone, Debug)]
pub struct InsertTemplate {
    pub stream: Arc<StreamDef>,
    /// Per VALUES row, (stream column, slot) for each column given.
    rows: Vec<Vec<(usize, Slot)>>,
    /// The stream column each `$n` fills; for one inside an expression, the type a cast
    /// right on it gives (`$n::T`, as a column named `$n`); `None` for one the statement
    /// skips, or in an expression with no such cast (it is then text).
    pub params: Vec<Option<ColumnDef>>,
    /// The VALUES cells that are expressions (`now()`, `$1 + 1`, `'c-' || $2`), each with
    /// the column it fills, in row order: the caller evaluates them per execution.
    pub exprs: Vec<(Expr, ColumnDef)>,
    pub returning: Option<Vec<ReturningColumn>>,
    /// The row each VALUES row starts from (`StreamDef::blank_row`), made once here
    /// rather than per execution.
    blank: Vec<Value>,
}

/// Whether a VALUES cell is a constant `value_from_expr` reads (a literal, maybe signed,
/// cast or parenthesised), rather than an expression to evaluate.
/// The keyword `DEFAULT` standing for a value.
fn is_default_keyword(expr: &Expr) -> bool {
    matches!(expr, Expr::Identifier(i) if i.quote_style.is_none() && i.value.eq_ignore_ascii_case("default"))
}

fn is_constant(expr: &Expr) -> bool {
    match expr {
        Expr::Nested(e) | Expr::Cast { expr: e, .. } => is_constant(e),
        Expr::UnaryOp {
            op: UnaryOperator::Plus,
            expr,
        } => is_constant(expr),
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => matches!(expr.as_ref(), Expr::Value(v) if matches!(v.value, ast::Value::Number(..))),
        Expr::Value(v) => !matches!(v.value, ast::Value::Placeholder(_)),
        Expr::TypedString(_) => true,
        _ => false,
    }
}

/// Whether every cast in a constant cell is to its column's own type (or, between
/// TIMESTAMP and TIMESTAMPTZ, to its kind): only then does reading the literal straight
/// into the column (`value_from_expr`) give what PostgreSQL's casts would. Any other is
/// evaluated as an expression, so `'abc'::int` into a TEXT column fails as the cast
/// does (22P02) rather than store `abc`. A typed literal (`TIMESTAMP '…'`) is a cast of
/// its text: `TIMESTAMP '2026-01-01'` into a TEXT column stores the timestamp's text,
/// `2026-01-01 00:00:00`, as PostgreSQL does.
fn casts_fit(expr: &Expr, ty: ColumnType) -> bool {
    let timestamp = |t: ColumnType| matches!(t, ColumnType::Timestamp | ColumnType::TimestampTz);
    let fits = |data_type: &ast::DataType| match ColumnType::parse(&data_type.to_string()) {
        Some(t) => t == ty || (timestamp(t) && timestamp(ty)),
        None => false,
    };
    match expr {
        Expr::Nested(e) | Expr::UnaryOp { expr: e, .. } => casts_fit(e, ty),
        Expr::Cast {
            expr: e, data_type, ..
        } => fits(data_type) && casts_fit(e, ty),
        Expr::TypedString(t) => fits(&t.data_type),
        _ => true,
    }
}

/// The place of `$(i+1)` in a template's parameters, made if the list is shorter: every
/// `$n` a statement names has one.
fn param_slot(params: &mut Vec<Option<ColumnDef>>, i: usize) -> &mut Option<ColumnDef> {
    if params.len() <= i {
        params.resize(i + 1, None);
    }
    &mut params[i]
}

/// The `$n` (0-based) inside an expression, each with the type a cast right on it
/// gives (`$n::T`), if one does.
fn placeholders_in(expr: &Expr) -> Vec<(usize, Option<ColumnType>)> {
    let mut out = Vec::new();
    let _ = datafusion::sql::sqlparser::ast::visit_expressions(expr, |e| {
        if let Some((n, casts)) = placeholder_cast(e) {
            out.push((n, casts.last().copied().flatten()));
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    out
}

/// A `$n` under casts and parentheses: its 0-based index, and the casts' types from the
/// outermost in, so the last is the cast right on it (`None` for a type no column has).
/// PostgreSQL gives `$n::T` the type `T`, whatever the cell's column.
fn placeholder_cast(expr: &Expr) -> Option<(usize, Vec<Option<ColumnType>>)> {
    let mut e = expr;
    let mut casts = Vec::new();
    while let Expr::Cast { expr, .. } | Expr::Nested(expr) = e {
        if let Expr::Cast { data_type, .. } = e {
            casts.push(ColumnType::parse(&data_type.to_string()));
        }
        e = expr;
    }
    Some((bare_placeholder(e)?, casts))
}

/// The 0-based index of a bare `$n`.
fn bare_placeholder(e: &Expr) -> Option<usize> {
    match e {
        Expr::Value(v) => match &v.value {
            ast::Value::Placeholder(p) => p
                .strip_prefix('$')
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|n| *n > 0)
                .map(|n| n - 1),
            _ => None,
        },
        _ => None,
    }
}

impl InsertTemplate {
    /// Binds an INSERT's target, constants and RETURNING; `$n` stay open.
    pub fn new(catalog: &Catalog, insert: &ast::Insert) -> Result<InsertTemplate> {
        let (stream, targets) = insert_target(catalog, insert)?;
        let source = insert
            .source
            .as_ref()
            .ok_or_else(|| Error::unsupported("INSERT needs VALUES"))?;
        let SetExpr::Values(values) = source.body.as_ref() else {
            return Err(Error::unsupported("INSERT … SELECT is not supported")
                .with_hint("Insert events with VALUES or COPY."));
        };
        let mut rows = Vec::with_capacity(values.rows.len());
        let mut params: Vec<Option<ColumnDef>> = Vec::new();
        let mut expressions = Vec::new();
        for row in &values.rows {
            let exprs = &row.content;
            if exprs.len() > targets.len() {
                return Err(Error::syntax(
                    "INSERT has more expressions than target columns",
                ));
            }
            if exprs.len() < targets.len() && !insert.columns.is_empty() {
                return Err(Error::syntax(
                    "INSERT has more target columns than expressions",
                ));
            }
            let mut slots = Vec::with_capacity(exprs.len());
            for (expr, &col) in exprs.iter().zip(&targets) {
                let def = &stream.columns[col];
                // A `$n` is the column's value when it is bare or cast only to the
                // column's type; cast to another, it is that type's and is converted
                // as an expression (`$2::text::timestamp`: `$2` is text).
                let param = placeholder_cast(expr)
                    .filter(|(_, casts)| casts.iter().all(|c| *c == Some(def.ty)))
                    .map(|(i, _)| i);
                let slot = match param {
                    // `DEFAULT` in VALUES: the column's default, as if it were left out.
                    None if is_default_keyword(expr) => {
                        Slot::Const(def.default.clone().unwrap_or(Value::Null))
                    }
                    Some(i) => {
                        *param_slot(&mut params, i) = Some(def.clone());
                        Slot::Param(i)
                    }
                    None if is_constant(expr) && casts_fit(expr, def.ty) => {
                        Slot::Const(value_from_expr(expr, def)?)
                    }
                    None => {
                        for (i, ty) in placeholders_in(expr) {
                            let slot = param_slot(&mut params, i);
                            if let (None, Some(ty)) = (&slot, ty) {
                                *slot = Some(ColumnDef {
                                    name: format!("${}", i + 1),
                                    ty,
                                    not_null: false,
                                    default: None,
                                });
                            }
                        }
                        expressions.push((expr.clone(), def.clone()));
                        Slot::Expr(expressions.len() - 1)
                    }
                };
                slots.push((col, slot));
            }
            rows.push(slots);
        }
        let returning = insert
            .returning
            .as_ref()
            .map(|items| bind_returning(catalog, &stream, items))
            .transpose()?;
        Ok(InsertTemplate {
            blank: stream.blank_row(),
            stream,
            rows,
            params,
            exprs: expressions,
            returning,
        })
    }

    /// The bound rows, with `param(i, column)` giving the value of `$(i+1)` for a column;
    /// the template has no expressions (else `bind_with`).
    pub fn bind(
        &self,
        param: &mut dyn FnMut(usize, &ColumnDef) -> Result<Value>,
    ) -> Result<InsertPlan> {
        self.bind_with(param, &[])
    }

    /// The bound rows, with `computed` the values of `exprs`, in order, each of its
    /// column's type.
    pub fn bind_with(
        &self,
        param: &mut dyn FnMut(usize, &ColumnDef) -> Result<Value>,
        computed: &[Value],
    ) -> Result<InsertPlan> {
        // Every row in one block of values, row after row.
        let width = self.stream.columns.len();
        let mut values = Vec::with_capacity(self.rows.len() * width);
        for slots in &self.rows {
            let start = values.len();
            values.extend_from_slice(&self.blank);
            let out = &mut values[start..];
            for (col, slot) in slots {
                out[*col] = match slot {
                    Slot::Const(v) => v.clone(),
                    Slot::Param(i) => param(*i, &self.stream.columns[*col])?,
                    Slot::Expr(i) => computed.get(*i).cloned().ok_or_else(|| {
                        Error::internal("an INSERT's expression was not evaluated")
                    })?,
                };
            }
            check_not_null(&self.stream, out)?;
        }
        Ok(InsertPlan {
            stream: self.stream.clone(),
            rows: Row::block(values, self.rows.len()),
            returning: self.returning.clone(),
        })
    }
}

/// Binds an INSERT whose VALUES are all constants.
pub fn bind_insert(catalog: &Catalog, insert: &ast::Insert) -> Result<InsertPlan> {
    InsertTemplate::new(catalog, insert)?.bind(&mut no_parameter)
}

/// The parameter callback of a statement that has none.
pub fn no_parameter(i: usize, _: &ColumnDef) -> Result<Value> {
    Err(Error::new(
        ErrorKind::InvalidParameter,
        format!("there is no parameter ${}", i + 1),
    ))
}

/// Fails with 23502 when a NOT NULL column of `row` is NULL.
pub fn check_not_null(stream: &StreamDef, row: &[Value]) -> Result<()> {
    for (c, v) in stream.columns.iter().zip(row) {
        if c.not_null && v.is_null() {
            return Err(Error::new(
                ErrorKind::NotNullViolation,
                format!(
                    "null value in column \"{}\" of relation \"{}\" violates not-null constraint",
                    c.name, stream.name
                ),
            ));
        }
    }
    Ok(())
}

fn bind_returning(
    catalog: &Catalog,
    stream: &Arc<StreamDef>,
    items: &[SelectItem],
) -> Result<Vec<ReturningColumn>> {
    let metrics = catalog.metrics_of(&stream.name);
    let mut out = Vec::new();
    let event_col = |i: usize| ReturningColumn {
        name: stream.columns[i].name.clone(),
        item: ReturningItem::Event(i),
        ty: ResultType::Column(stream.columns[i].ty),
    };
    let metric_cols = |m: &Arc<MetricDef>| -> Vec<ReturningColumn> {
        m.aggregates
            .iter()
            .enumerate()
            .map(|(i, a)| ReturningColumn {
                name: format!("{}.{}", m.name, a.alias),
                item: ReturningItem::Metric {
                    metric: m.clone(),
                    agg: i,
                },
                ty: a.result_type(stream),
            })
            .collect()
    };
    let find_metric = |name: &str| -> Result<&Arc<MetricDef>> {
        metrics.iter().find(|m| m.name == name).ok_or_else(|| {
            Error::new(
                ErrorKind::UndefinedTable,
                format!("missing FROM-clause entry for table \"{name}\""),
            )
            .with_hint(format!(
                "RETURNING names a metric of stream \"{}\" or one of its columns.",
                stream.name
            ))
        })
    };
    for item in items {
        let (expr, alias) = match item {
            SelectItem::Wildcard(_) => {
                out.extend((0..stream.columns.len()).map(event_col));
                for m in &metrics {
                    out.extend(metric_cols(m));
                }
                continue;
            }
            SelectItem::QualifiedWildcard(kind, _) => {
                let name = match kind {
                    ast::SelectItemQualifiedWildcardKind::ObjectName(n) => object_name(n),
                    _ => return Err(Error::unsupported("RETURNING expression not supported")),
                };
                if name == stream.name {
                    out.extend((0..stream.columns.len()).map(event_col));
                } else {
                    out.extend(metric_cols(find_metric(&name)?));
                }
                continue;
            }
            SelectItem::UnnamedExpr(e) => (e, None),
            SelectItem::ExprWithAlias { expr, alias } => (expr, Some(normalize_ident(alias))),
            other => {
                return Err(Error::unsupported(format!(
                    "RETURNING {other} is not supported"
                )))
            }
        };
        let mut col = match expr {
            Expr::Identifier(i) => {
                let n = normalize_ident(i);
                let idx = stream
                    .column_index(&n)
                    .ok_or_else(|| Error::undefined_column(&n, &stream.name))?;
                event_col(idx)
            }
            Expr::CompoundIdentifier(parts) if parts.len() == 2 => {
                let owner = normalize_ident(&parts[0]);
                let n = normalize_ident(&parts[1]);
                if owner == stream.name {
                    let idx = stream
                        .column_index(&n)
                        .ok_or_else(|| Error::undefined_column(&n, &stream.name))?;
                    event_col(idx)
                } else {
                    let m = find_metric(&owner)?;
                    metric_cols(m)
                        .into_iter()
                        .find(|c| c.name == format!("{owner}.{n}"))
                        .ok_or_else(|| Error::undefined_column(&n, &owner))?
                }
            }
            other => {
                return Err(Error::unsupported(format!(
                    "RETURNING {other}: return stream columns or metric columns"
                )))
            }
        };
        if let Some(a) = alias {
            col.name = a;
        }
        out.push(col);
    }
    Ok(out)
}

fn mismatch(col: &ColumnDef, found: &str) -> Error {
    Error::new(
        ErrorKind::DatatypeMismatch,
        format!(
            "column \"{}\" is of type {} but expression is of type {found}",
            col.name,
            col.ty.sql_name().to_lowercase()
        ),
    )
    .with_hint("You will need to rewrite or cast the expression.")
}

/// Converts a constant expression of VALUES into a value of the column's type.
pub fn value_from_expr(expr: &Expr, col: &ColumnDef) -> Result<Value> {
    match expr {
        Expr::Nested(e) => value_from_expr(e, col),
        Expr::Value(v) => match &v.value {
            ast::Value::Null => Ok(Value::Null),
            ast::Value::Boolean(b) => match col.ty {
                ColumnType::Boolean => Ok(Value::Bool(*b)),
                ColumnType::Text => Ok(Value::Text(if *b { "true" } else { "false" }.into())),
                _ => Err(mismatch(col, "boolean")),
            },
            ast::Value::Number(n, _) => value_from_number(&n.to_string(), col),
            ast::Value::SingleQuotedString(s)
            | ast::Value::EscapedStringLiteral(s)
            | ast::Value::DoubleQuotedString(s) => value_from_text(s, col),
            ast::Value::DollarQuotedString(s) => value_from_text(&s.value, col),
            ast::Value::Placeholder(p) => Err(Error::new(
                ErrorKind::InvalidParameter,
                format!("there is no parameter {p}"),
            )),
            other => Err(Error::unsupported(format!(
                "literal {other} is not supported"
            ))),
        },
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => match expr.as_ref() {
            Expr::Value(v) => match &v.value {
                ast::Value::Number(n, _) => value_from_number(&format!("-{n}"), col),
                _ => Err(Error::unsupported("unary minus needs a number")),
            },
            _ => Err(Error::unsupported("unary minus needs a number")),
        },
        Expr::UnaryOp {
            op: UnaryOperator::Plus,
            expr,
        } => value_from_expr(expr, col),
        Expr::Cast { expr, .. } => value_from_expr(expr, col),
        Expr::TypedString(t) => match t.value.value.clone().into_string() {
            Some(s) => value_from_text(&s, col),
            None => Err(Error::unsupported("typed literal not supported")),
        },
        other => Err(Error::unsupported(format!(
            "VALUES accepts constants only, not {other}"
        ))),
    }
}

/// A number (an unquoted literal, a typed numeric value) into the column's type: into
/// an integer it is rounded, as PostgreSQL's assignment cast rounds.
pub fn value_from_number(text: &str, col: &ColumnDef) -> Result<Value> {
    match col.ty {
        ColumnType::Int32 | ColumnType::Int64 => parse_int(text, col),
        ColumnType::Float32 | ColumnType::Float64 => parse_float(text, col),
        ColumnType::Text => Ok(Value::Text(text.into())),
        ColumnType::Boolean => Err(mismatch(col, "integer")),
        ColumnType::Timestamp | ColumnType::TimestampTz => Err(mismatch(col, "integer")),
    }
}

fn invalid_text(ty: ColumnType, text: &str) -> Error {
    Error::new(
        ErrorKind::InvalidText,
        format!(
            "invalid input syntax for type {}: \"{text}\"",
            ty.sql_name().to_lowercase()
        ),
    )
}

fn parse_int(text: &str, col: &ColumnDef) -> Result<Value> {
    let t = text.trim();
    let v: i64 = match t.parse::<i64>() {
        Ok(v) => v,
        Err(_) => {
            let f: f64 = t.parse().map_err(|_| invalid_text(col.ty, text))?;
            if !f.is_finite() || f.abs() > 9.2e18 {
                return Err(out_of_range(col.ty));
            }
            f.round() as i64
        }
    };
    int_value(v, col.ty)
}

/// `v` as a value of integer type `ty`: an INTEGER holds 32 bits (22003 past them).
fn int_value(v: i64, ty: ColumnType) -> Result<Value> {
    if ty == ColumnType::Int32 && i32::try_from(v).is_err() {
        return Err(out_of_range(ty));
    }
    Ok(Value::Int(v))
}

fn out_of_range(ty: ColumnType) -> Error {
    Error::new(
        ErrorKind::NumericOutOfRange,
        format!(
            "value out of range for type {}",
            ty.sql_name().to_lowercase()
        ),
    )
}

fn parse_float(text: &str, col: &ColumnDef) -> Result<Value> {
    let t = text.trim();
    // Only the named values hold an `n` (`nan`, `inf`, `infinity`): numbers are read
    // without lowering a copy of their text.
    let named = t.bytes().any(|b| b.eq_ignore_ascii_case(&b'n'));
    let v = match named.then(|| t.to_ascii_lowercase()).as_deref() {
        Some("nan") => f64::NAN,
        Some("infinity" | "inf" | "+infinity") => f64::INFINITY,
        Some("-infinity" | "-inf") => f64::NEG_INFINITY,
        _ => {
            let v = t.parse::<f64>().map_err(|_| invalid_text(col.ty, text))?;
            // A number too large or too small for the type is 22003, as in PostgreSQL,
            // not an infinity or a zero.
            let narrow = if col.ty == ColumnType::Float32 {
                v as f32 as f64
            } else {
                v
            };
            let mantissa = t.split(['e', 'E']).next().unwrap_or("");
            if narrow.is_infinite()
                || (narrow == 0.0 && mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b)))
            {
                return Err(Error::new(
                    ErrorKind::NumericOutOfRange,
                    format!(
                        "\"{t}\" is out of range for type {}",
                        col.ty.sql_name().to_lowercase()
                    ),
                ));
            }
            v
        }
    };
    Ok(Value::Float(if col.ty == ColumnType::Float32 {
        v as f32 as f64
    } else {
        v
    }))
}

/// A stream row from an external JSON record: an object whose keys name columns (others
/// are ignored; a missing key is NULL). Numbers, booleans and strings convert as a
/// PostgreSQL client would expect; a TIMESTAMP is text or milliseconds since the epoch.
/// The row is checked as an INSERT's would be (NOT NULL, event time).
pub fn row_from_json(stream: &StreamDef, bytes: &[u8]) -> Result<Vec<Value>> {
    let bad = |msg: String| Error::new(ErrorKind::InvalidText, msg);
    let json: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    let serde_json::Value::Object(object) = json else {
        return Err(bad("a record must be a JSON object".into()));
    };
    let mut row = Vec::with_capacity(stream.columns.len());
    for col in &stream.columns {
        let value = match object.get(&col.name) {
            None => col.default.clone().unwrap_or(Value::Null),
            Some(serde_json::Value::Null) => Value::Null,
            Some(serde_json::Value::String(s)) => value_from_text(s, col)?,
            Some(serde_json::Value::Number(n)) => match col.ty {
                ColumnType::Timestamp | ColumnType::TimestampTz => n
                    .as_i64()
                    .and_then(|ms| ms.checked_mul(1000))
                    .map(Value::Timestamp)
                    .ok_or_else(|| {
                        bad(format!(
                            "column \"{}\": {n} is not a time in milliseconds",
                            col.name
                        ))
                    })?,
                _ => value_from_number(&n.to_string(), col)?,
            },
            Some(serde_json::Value::Bool(b)) => value_from_text(&b.to_string(), col)?,
            Some(other) => {
                return Err(bad(format!(
                    "column \"{}\" of type {} cannot take {other}",
                    col.name,
                    col.ty.sql_name()
                )))
            }
        };
        row.push(value);
    }
    check_not_null(stream, &row)?;
    Ok(row)
}

/// Converts text (a quoted literal, a COPY field, a text parameter) into the column's type.
pub fn value_from_text(text: &str, col: &ColumnDef) -> Result<Value> {
    match col.ty {
        ColumnType::Text => Ok(Value::Text(text.into())),
        // Text is an integer's input, which takes no fraction ('1.5' is 22P02).
        ColumnType::Int32 | ColumnType::Int64 => {
            let t = text.trim();
            let v: i64 = t.parse().map_err(|_| {
                // All digits but too many of them is out of range, not invalid.
                let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
                if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                    out_of_range(col.ty)
                } else {
                    invalid_text(col.ty, text)
                }
            })?;
            int_value(v, col.ty)
        }
        ColumnType::Float32 | ColumnType::Float64 => parse_float(text, col),
        ColumnType::Boolean => match text.trim().to_ascii_lowercase().as_str() {
            "t" | "true" | "yes" | "on" | "1" | "y" => Ok(Value::Bool(true)),
            "f" | "false" | "no" | "off" | "0" | "n" => Ok(Value::Bool(false)),
            _ => Err(invalid_text(col.ty, text)),
        },
        ColumnType::Timestamp | ColumnType::TimestampTz => parse_timestamp(text)
            .map(Value::Timestamp)
            .ok_or_else(|| invalid_text(col.ty, text)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::{parse_statement, Statement};

    pub(crate) fn catalog_with(stmts: &[&str]) -> Catalog {
        let mut catalog = Catalog::default();
        for s in stmts {
            catalog = crate::ddl::apply(&catalog, &parse_statement(s).unwrap())
                .unwrap()
                .0;
        }
        catalog
    }

    const STREAM: &str =
        "CREATE STREAM p (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
        merchant TEXT, amount DOUBLE PRECISION) WITH (event_time = 'ts', event_id = 'id', \
        partition_by = 'card, merchant', partitions = 4, lateness = '5 seconds')";

    #[test]
    fn binds_stream_options() {
        let c = catalog_with(&[STREAM]);
        let s = c.stream("p").unwrap();
        assert_eq!(s.partitioners, vec![2, 3]);
        assert_eq!(s.lateness_us, 5_000_000);
        assert_eq!(s.event_id, Some(0));
    }

    #[test]
    fn metric_runs_in_first_partitioner_of_its_group_by() {
        let c = catalog_with(&[
            STREAM,
            "CREATE METRIC m AS SELECT merchant, SUM(amount) AS s FROM p WINDOW SLIDING (SIZE 1 MINUTE) GROUP BY merchant",
        ]);
        assert_eq!(c.metric("m").unwrap().partitioner, 1);
        let err = crate::ddl::apply(
            &c,
            &parse_statement("CREATE METRIC x AS SELECT COUNT(*) FROM p WINDOW INFINITE").unwrap(),
        )
        .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Unsupported);
    }

    #[test]
    fn insert_errors_have_the_right_kind() {
        let c = catalog_with(&[STREAM]);
        let bind = |sql: &str| match parse_statement(sql).unwrap() {
            Statement::Insert(i) => bind_insert(&c, &i),
            _ => unreachable!(),
        };
        assert_eq!(
            bind("INSERT INTO p VALUES (1, 'x', 'c', 'm', 1.0)")
                .unwrap_err()
                .kind,
            ErrorKind::InvalidText
        );
        assert_eq!(
            bind("INSERT INTO p VALUES (NULL, '2026-01-01', 'c', 'm', 1.0)")
                .unwrap_err()
                .kind,
            ErrorKind::NotNullViolation
        );
        assert_eq!(
            bind("INSERT INTO p VALUES (1, 5, 'c', 'm', 1.0)")
                .unwrap_err()
                .kind,
            ErrorKind::DatatypeMismatch
        );
        assert_eq!(
            bind("INSERT INTO nope VALUES (1)").unwrap_err().kind,
            ErrorKind::UndefinedTable
        );
        let plan =
            bind("INSERT INTO p VALUES (1, '2026-01-01 00:00:01', 'c', NULL, -2.5) RETURNING *")
                .unwrap();
        assert_eq!(plan.rows[0][4], Value::Float(-2.5));
        assert_eq!(plan.returning.unwrap().len(), 5);
    }
}
