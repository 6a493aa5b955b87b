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
use eddy_cluster::{Engine, HistoryItem};
use eddy_planner::aggregate::ResultType;
use eddy_planner::catalog::{Catalog, EventTimeUnit, MetricDef, StreamDef};
use eddy_planner::filter::{result_arrow_type, rows_to_batch};
use eddy_planner::{Error, ErrorKind};

use crate::sql::query::{self, Notices};

/// The `history` table function of one catalog.
#[derive(Debug)]
pub struct HistoryFunction {
    pub engine: Arc<Engine>,
    pub catalog: Arc<Catalog>,
}

fn external(e: Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

impl TableFunctionImpl for HistoryFunction {
    fn call(&self, args: &[Expr]) -> DfResult<Arc<dyn TableProvider>> {
        let name = match args {
            [Expr::Literal(ScalarValue::Utf8(Some(name)), _)] => name.clone(),
            _ => {
                return Err(external(
                    Error::new(
                        ErrorKind::UndefinedFunction,
                        "function history takes one argument, a metric's name as text",
                    )
                    .with_hint("For example: SELECT * FROM history('card_5m')."),
                ))
            }
        };
        let metric = self.catalog.metric(&name).ok_or_else(|| {
            external(
                Error::new(
                    ErrorKind::UndefinedTable,
                    format!("metric \"{name}\" does not exist"),
                )
                .with_hint("SHOW METRICS lists the metrics."),
            )
        })?;
        let stream = self
            .catalog
            .stream(&metric.stream)
            .ok_or_else(|| external(Error::internal("metric without stream")))?;
        Ok(Arc::new(HistoryTable::new(
            self.engine.clone(),
            stream.clone(),
            metric.clone(),
            query::notice_sink(),
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
            (ScalarValue::TimestampSecond(Some(s), _), EventTimeUnit::Timestamp) => {
                s.checked_mul(1_000_000)
            }
            (ScalarValue::TimestampMillisecond(Some(ms), _), EventTimeUnit::Timestamp) => {
                ms.checked_mul(1000)
            }
            (ScalarValue::TimestampMicrosecond(Some(us), _), EventTimeUnit::Timestamp) => Some(*us),
            (ScalarValue::TimestampNanosecond(Some(ns), _), EventTimeUnit::Timestamp) => {
                Some(ns.div_euclid(1000))
            }
            (ScalarValue::Int64(Some(ms)), EventTimeUnit::Millis) => ms.checked_mul(1000),
            (ScalarValue::Int32(Some(ms)), EventTimeUnit::Millis) => Some(*ms as i64 * 1000),
            _ => None,
        }
    }
}

#[derive(Clone, Copy)]
enum Bound {
    From,
    Upto,
    Exactly,
}

fn strip_cast(e: &Expr) -> &Expr {
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
        let part = HistoryPart {
            engine: self.engine.clone(),
            stream: self.stream.clone(),
            metric: self.metric.clone(),
            schema: self.schema.clone(),
            types: self.types.clone(),
            range: (from, upto),
            notices: self.notices.clone(),
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
    notices: Option<Notices>,
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
        let notices = self.notices.clone();
        let name = self.metric.name.clone();
        let column = self.stream.columns[self.stream.event_time].name.clone();
        let items = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let batches = items.filter_map(move |item| {
            let out = match item {
                Ok(HistoryItem::Rows(rows)) => {
                    Some(rows_to_batch(schema.clone(), &types, &rows).map_err(external))
                }
                Ok(HistoryItem::Starts(us)) => {
                    if let Some(n) = &notices {
                        let at = eddy_planner::types::Value::Timestamp(us);
                        let notice = format!(
                            "the history of metric \"{name}\" starts at {column} = {at}: \
                             the events its window needs before that have left the stream's retention"
                        );
                        let mut n = n.lock().expect("notices");
                        if !n.contains(&notice) {
                            n.push(notice);
                        }
                    }
                    None
                }
                Err(e) => Some(Err(external(e))),
            };
            std::future::ready(out)
        });
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), batches))
    }
}
