//! `history('metric')`: a metric's value after each stored event of its stream, as
//! `INSERT … RETURNING` gave it live (`eddy_cluster::exec::history` replays it).
//!
//! Invariant: the rows stream from the engine batch by batch (a reader that stops reading
//! holds the replay); a filter on the event-time column narrows the events read, and
//! DataFusion still applies every filter.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableFunctionImpl, TableProvider};
use datafusion::common::{DataFusionError, Result as DfResult, ScalarValue};
use datafusion::datasource::TableType;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::ExecutionPlan;
use futures::StreamExt;

use eddy_cluster::exec::history::columns;
use eddy_cluster::Engine;
use eddy_planner::aggregate::ResultType;
use eddy_planner::catalog::{Catalog, EventTimeUnit, MetricDef, StreamDef};
use eddy_planner::filter::{result_arrow_type, rows_to_batch};
use eddy_planner::types::Value;
use eddy_planner::{Error, ErrorKind};

/// A NOTICE a statement raises: its message and, where it suggests what to do, a hint
/// (psql prints it on a `HINT:` line of its own).
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    pub message: String,
    pub hint: Option<String>,
}

impl From<String> for Notice {
    fn from(message: String) -> Notice {
        Notice {
            message,
            hint: None,
        }
    }
}

impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        match &self.hint {
            Some(hint) => write!(f, " (hint: {hint})"),
            None => Ok(()),
        }
    }
}

tokio::task_local! {
    /// Where the running query's scans put their notices (`noticed`).
    static NOTICES: Notices;
}

/// Notices a query's scans raise, sent with its result.
pub type Notices = Arc<std::sync::Mutex<Vec<Notice>>>;

/// Runs `f` (a query's planning and execution) and returns the notices its scans raised.
pub async fn noticed<T>(f: impl std::future::Future<Output = T>) -> (T, Vec<Notice>) {
    let sink = Notices::default();
    let out = NOTICES.scope(sink.clone(), f).await;
    let notices = std::mem::take(&mut *sink.lock().expect("notices"));
    (out, notices)
}

/// The running query's notice sink, taken while it is planned (`noticed`).
pub fn notice_sink() -> Option<Notices> {
    NOTICES.try_with(Notices::clone).ok()
}

/// The `history` table function of one catalog.
#[derive(Debug)]
pub struct HistoryFunction {
    pub engine: Arc<Engine>,
    pub catalog: Arc<Catalog>,
}

pub(crate) fn external(e: Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

impl TableFunctionImpl for HistoryFunction {
    fn call(&self, args: &[Expr]) -> DfResult<Arc<dyn TableProvider>> {
        let (stream, metric) = metric_named(&self.catalog, args, "history")?;
        Ok(Arc::new(HistoryTable::new(
            self.engine.clone(),
            stream,
            metric,
            notice_sink(),
        )))
    }
}

/// A metric's history as a table.
#[derive(Debug)]
struct HistoryTable {
    engine: Arc<Engine>,
    stream: Arc<StreamDef>,
    metric: Arc<MetricDef>,
    schema: SchemaRef,
    types: Vec<ResultType>,
    notices: Option<Notices>,
}

impl HistoryTable {
    fn new(
        engine: Arc<Engine>,
        stream: Arc<StreamDef>,
        metric: Arc<MetricDef>,
        notices: Option<Notices>,
    ) -> HistoryTable {
        let mut cols: Vec<(String, ResultType)> = columns(&stream, &metric)
            .into_iter()
            .map(|c| {
                let col = &stream.columns[c];
                (col.name.clone(), ResultType::Column(col.ty))
            })
            .collect();
        cols.extend(
            metric
                .aggregates
                .iter()
                .map(|a| (a.alias.clone(), a.result_type(&stream))),
        );
        let schema = Arc::new(Schema::new(
            cols.iter()
                .map(|(n, t)| Field::new(n, result_arrow_type(*t), true))
                .collect::<Vec<_>>(),
        ));
        HistoryTable {
            engine,
            stream,
            metric,
            schema,
            types: cols.into_iter().map(|(_, t)| t).collect(),
            notices,
        }
    }

    /// The event-time bound a filter sets: (lower, inclusive) or (upper, inclusive), in µs.
    fn time_bound(&self, expr: &Expr) -> Option<(Bound, i64)> {
        let Expr::BinaryExpr(BinaryExpr { left, op, right }) = expr else {
            return None;
        };
        let name = &self.stream.columns[self.stream.event_time].name;
        let (op, lit) = match (strip_cast(left), strip_cast(right)) {
            (Expr::Column(c), Expr::Literal(v, _)) if &c.name == name => (*op, v),
            (Expr::Literal(v, _), Expr::Column(c)) if &c.name == name => (op.swap()?, v),
            _ => return None,
        };
        let us = self.micros(lit)?;
        Some(match op {
            Operator::Gt => (Bound::From, us.saturating_add(1)),
            Operator::GtEq => (Bound::From, us),
            Operator::Lt => (Bound::Upto, us.saturating_sub(1)),
            Operator::LtEq => (Bound::Upto, us),
            Operator::Eq => (Bound::Exactly, us),
            _ => return None,
        })
    }

    /// A literal compared with the event-time column, in µs.
    fn micros(&self, v: &ScalarValue) -> Option<i64> {
        match (v, self.stream.event_time_unit) {
            (ScalarValue::Int64(Some(ms)), EventTimeUnit::Millis) => ms.checked_mul(1000),
            (ScalarValue::Int32(Some(ms)), EventTimeUnit::Millis) => Some(*ms as i64 * 1000),
            (v, EventTimeUnit::Timestamp) => timestamp_micros(v),
            _ => None,
        }
    }
}

/// A timestamp constant in µs, whatever unit DataFusion typed it in.
fn timestamp_micros(v: &ScalarValue) -> Option<i64> {
    match v {
        ScalarValue::TimestampSecond(Some(s), _) => s.checked_mul(1_000_000),
        ScalarValue::TimestampMillisecond(Some(ms), _) => ms.checked_mul(1000),
        ScalarValue::TimestampMicrosecond(Some(us), _) => Some(*us),
        ScalarValue::TimestampNanosecond(Some(ns), _) => Some(ns.div_euclid(1000)),
        _ => None,
    }
}

#[derive(Clone, Copy)]
enum Bound {
    From,
    Upto,
    Exactly,
}

/// An expression under any casts (shared with `query.rs`'s tables).
pub(crate) fn strip_cast(e: &Expr) -> &Expr {
    match e {
        Expr::Cast(c) => strip_cast(&c.expr),
        Expr::TryCast(c) => strip_cast(&c.expr),
        other => other,
    }
}

#[async_trait]
impl TableProvider for HistoryTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| match self.time_bound(f) {
                Some(_) => TableProviderFilterPushDown::Inexact,
                None => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let (mut from, mut upto) = (i64::MIN, i64::MAX);
        for f in filters {
            match self.time_bound(f) {
                Some((Bound::From, us)) => from = from.max(us),
                Some((Bound::Upto, us)) => upto = upto.min(us),
                Some((Bound::Exactly, us)) => (from, upto) = (from.max(us), upto.min(us)),
                None => {}
            }
        }
        let bounds = self
            .engine
            .history_bounds(&self.stream, &self.metric, from)
            .await
            .map_err(external)?;
        let column = &self.stream.columns[self.stream.event_time].name;
        let newest = bounds.latest.max(Some(eddy_cluster::wall_clock_us()));
        if from != i64::MIN && Some(from) > newest {
            return Err(external(
                Error::new(
                    ErrorKind::InvalidParameter,
                    format!(
                        "the history of metric \"{}\" ends before {column} = {}",
                        self.metric.name,
                        Value::Timestamp(from)
                    ),
                )
                .with_hint(format!(
                    "History covers the stored events; stream \"{}\" is at {}.",
                    self.stream.name,
                    bounds
                        .latest
                        .map_or("no event yet".into(), |t| Value::Timestamp(t).to_string())
                )),
            ));
        }
        if let (Some(start), Some(notices)) = (bounds.starts, &self.notices) {
            notices.lock().expect("notices").push(
                format!(
                    "the history of metric \"{}\" starts at {column} = {}: the events its \
                 window needs before that have left the stream's retention",
                    self.metric.name,
                    Value::Timestamp(start)
                )
                .into(),
            );
        }
        let part = HistoryPart {
            engine: self.engine.clone(),
            stream: self.stream.clone(),
            metric: self.metric.clone(),
            schema: self.schema.clone(),
            types: self.types.clone(),
            range: (from, upto),
        };
        let exec = StreamingTableExec::try_new(
            self.schema.clone(),
            vec![Arc::new(part)],
            projection,
            Vec::new(),
            false,
            limit,
        )?;
        Ok(Arc::new(exec))
    }
}

/// The one partition of a history scan.
#[derive(Debug)]
struct HistoryPart {
    engine: Arc<Engine>,
    stream: Arc<StreamDef>,
    metric: Arc<MetricDef>,
    schema: SchemaRef,
    types: Vec<ResultType>,
    range: (i64, i64),
}

impl PartitionStream for HistoryPart {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let (from, upto) = self.range;
        let rx = self
            .engine
            .history(self.stream.clone(), self.metric.clone(), from, upto);
        let (schema, types) = (self.schema.clone(), self.types.clone());
        let items = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let batches = items.map(move |rows| {
            rows.map_err(external)
                .and_then(|rows| rows_to_batch(schema.clone(), &types, &rows).map_err(external))
        });
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), batches))
    }
}

/// Registers `history` and `features` on a query context of `catalog`.
pub fn register(
    ctx: &datafusion::prelude::SessionContext,
    engine: &Arc<Engine>,
    catalog: &Arc<Catalog>,
) {
    let (e, c) = (engine.clone(), catalog.clone());
    ctx.register_udtf(
        "history",
        Arc::new(HistoryFunction {
            engine: e,
            catalog: c,
        }),
    );
    let (e, c) = (engine.clone(), catalog.clone());
    ctx.register_udtf(
        "features",
        Arc::new(FeaturesFunction {
            engine: e,
            catalog: c,
        }),
    );
}

/// The metric and stream a table function's first arguments name.
pub(crate) fn metric_named(
    catalog: &Catalog,
    args: &[Expr],
    function: &str,
) -> DfResult<(Arc<StreamDef>, Arc<MetricDef>)> {
    let name = text_arg(args.first(), function)?;
    let metric = catalog.metric(&name).ok_or_else(|| {
        external(
            Error::new(
                ErrorKind::UndefinedTable,
                format!("metric \"{name}\" does not exist"),
            )
            .with_hint("SHOW METRICS lists the metrics."),
        )
    })?;
    let stream = catalog
        .stream(&metric.stream)
        .ok_or_else(|| external(Error::internal("metric without stream")))?;
    Ok((stream.clone(), metric.clone()))
}

/// A text constant argument of a table function.
fn text_arg(arg: Option<&Expr>, function: &str) -> DfResult<String> {
    match arg {
        Some(Expr::Literal(ScalarValue::Utf8(Some(s)), _)) => Ok(s.clone()),
        _ => Err(external(
            Error::new(
                ErrorKind::UndefinedFunction,
                format!("function {function} takes names as text constants"),
            )
            .with_hint(format!("For example: SELECT * FROM {function}('card_5m').")),
        )),
    }
}

/// A timestamp constant argument, in µs.
pub(crate) fn time_arg(arg: Option<&Expr>) -> DfResult<i64> {
    let bad = || {
        external(
            Error::new(
                ErrorKind::InvalidDatetime,
                "AS OF takes a timestamp constant",
            )
            .with_hint("For example: AS OF TIMESTAMP '2026-11-22 10:00:00'."),
        )
    };
    let us = match arg.map(strip_cast) {
        Some(Expr::Literal(ScalarValue::Utf8(Some(s)), _)) => {
            eddy_planner::types::parse_timestamp(s)
        }
        Some(Expr::Literal(v, _)) => timestamp_micros(v),
        _ => None,
    };
    us.ok_or_else(bad)
}

/// `features('labels', 'metric', …)`: each row of the stream `labels` with every named
/// metric's values for its group as they stood at the row's event time (the metric's
/// group-by columns are read from the label row's columns of the same names).
#[derive(Debug)]
struct FeaturesFunction {
    engine: Arc<Engine>,
    catalog: Arc<Catalog>,
}

impl TableFunctionImpl for FeaturesFunction {
    fn call(&self, args: &[Expr]) -> DfResult<Arc<dyn TableProvider>> {
        let labels = text_arg(args.first(), "features")?;
        let labels = self
            .catalog
            .stream(&labels)
            .ok_or_else(|| external(eddy_planner::error::undefined_stream(&labels)))?
            .clone();
        if args.len() < 2 {
            return Err(external(
                Error::new(
                    ErrorKind::UndefinedFunction,
                    "function features takes a stream of labels and at least one metric",
                )
                .with_hint("For example: SELECT * FROM features('labels', 'card_5m', 'card_1h')."),
            ));
        }
        let mut fields: Vec<Field> = labels
            .columns
            .iter()
            .map(|c| Field::new(&c.name, result_arrow_type(ResultType::Column(c.ty)), true))
            .collect();
        let mut types: Vec<ResultType> = labels
            .columns
            .iter()
            .map(|c| ResultType::Column(c.ty))
            .collect();
        let mut metrics = Vec::new();
        for arg in &args[1..] {
            let (stream, metric) =
                metric_named(&self.catalog, std::slice::from_ref(arg), "features")?;
            if metrics
                .iter()
                .any(|(_, m, _): &FeatureMetric| m.name == metric.name)
            {
                return Err(external(Error::new(
                    ErrorKind::DuplicateObject,
                    format!("metric \"{}\" is named twice", metric.name),
                )));
            }
            // Where each group-by value comes from in a label row.
            let keys = metric
                .group_by
                .iter()
                .map(|&g| {
                    let name = &stream.columns[g].name;
                    let at = labels.column_index(name).ok_or_else(|| {
                        external(
                            Error::undefined_column(name, &labels.name).with_hint(format!(
                                "metric \"{}\" groups by \"{name}\": the labels need that column",
                                metric.name
                            )),
                        )
                    })?;
                    Ok((g, at))
                })
                .collect::<DfResult<Vec<_>>>()?;
            for a in &metric.aggregates {
                let ty = a.result_type(&stream);
                fields.push(Field::new(
                    format!("{}.{}", metric.name, a.alias),
                    result_arrow_type(ty),
                    true,
                ));
                types.push(ty);
            }
            metrics.push((stream, metric, keys));
        }
        Ok(Arc::new(FeaturesTable {
            engine: self.engine.clone(),
            labels,
            metrics,
            schema: Arc::new(Schema::new(fields)),
            types,
        }))
    }
}

/// Each metric's stream and definition, and per group-by column (its stream column, the
/// label column it is read from).
type FeatureMetric = (Arc<StreamDef>, Arc<MetricDef>, Vec<(usize, usize)>);

#[derive(Debug)]
struct FeaturesTable {
    engine: Arc<Engine>,
    labels: Arc<StreamDef>,
    metrics: Vec<FeatureMetric>,
    schema: SchemaRef,
    types: Vec<ResultType>,
}

#[async_trait]
impl TableProvider for FeaturesTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let labels = self
            .engine
            .stream_rows(&self.labels)
            .await
            .map_err(external)?;
        let mut rows: Vec<Vec<eddy_planner::types::Value>> =
            labels.iter().map(|r| r.to_vec()).collect();
        for (stream, metric, keys) in &self.metrics {
            let mut probes = Vec::with_capacity(labels.len());
            for (tag, label) in labels.iter().enumerate() {
                let t = eddy_cluster::exec::task::Task::event_time(&self.labels, label)
                    .map_err(external)?;
                let mut row = vec![eddy_planner::types::Value::Null; stream.columns.len()];
                for &(g, at) in keys {
                    row[g] = same_type(&label[at], &stream.columns[g]).map_err(external)?;
                }
                let part = Engine::task_of_row(stream, metric, &row);
                let ask = eddy_cluster::exec::history::Ask::Values(row.into());
                let probe = eddy_cluster::exec::history::Probe { t, ask, tag };
                probes.push((Some(part), probe));
            }
            let answers = self
                .engine
                .probe(stream, metric, probes, false)
                .await
                .map_err(external)?;
            for (tag, mut values) in answers {
                rows[tag].extend(values.pop().unwrap_or_default());
            }
        }
        rows_scan(&self.schema, &self.types, &rows, state, projection, limit).await
    }
}

/// A scan of rows made in memory (shared with `query.rs`'s tables): one batch of
/// `types`, projected and limited by DataFusion's `MemTable`.
pub(crate) async fn rows_scan<R: AsRef<[Value]>>(
    schema: &SchemaRef,
    types: &[ResultType],
    rows: &[R],
    state: &dyn Session,
    projection: Option<&Vec<usize>>,
    limit: Option<usize>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let batch = rows_to_batch(schema.clone(), types, rows).map_err(external)?;
    let table = datafusion::datasource::MemTable::try_new(schema.clone(), vec![vec![batch]])?;
    table.scan(state, projection, &[], limit).await
}

/// A label's value as the metric stream's column types it (through its text when the
/// types differ).
fn same_type(
    v: &eddy_planner::types::Value,
    col: &eddy_planner::catalog::ColumnDef,
) -> eddy_planner::Result<eddy_planner::types::Value> {
    match v.to_text() {
        Some(text) if !v.is_null() => eddy_planner::bind::value_from_text(&text, col),
        _ => Ok(v.clone()),
    }
}
