//! Continuous queries (`SELECT … EMIT CHANGES`): planning the projection and WHERE with
//! DataFusion, the per-subscription queue the shards fill, and the registry behind
//! `SHOW SUBSCRIPTIONS`.
//!
//! Invariants:
//! - a shard never waits on a reader: `deliver` filters, projects and queues rows under a
//!   short lock and returns;
//! - a metric subscription queues at most `rows_max` rows plus one per group: past the
//!   bound, a group's newer row replaces its queued one (counted as coalesced);
//! - a stream subscription that would queue more than `rows_max` rows ends with 53400;
//! - dropping the handle detaches the subscription from every task.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, BooleanArray};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::ScalarValue;
use datafusion::common::{DFSchema, TableReference};
use datafusion::datasource::empty::EmptyTable;
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::Operator;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::optimizer::Analyzer;
use datafusion::physical_expr::expressions::{BinaryExpr, Column as ColumnExpr, Literal};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::{SessionConfig, SessionContext};
use tokio::sync::Notify;

use eddy_cluster::{Change, Engine, WatchTarget, Watcher};
use eddy_planner::aggregate::ResultType;
use eddy_planner::catalog::{Catalog, MetricDef, StreamDef};
use eddy_planner::filter::{datafusion_error, result_arrow_type, rows_to_batch};
use eddy_planner::types::{ColumnType, Value};
use eddy_planner::{Error, ErrorKind, Result};

use crate::session::cells::{cell_of, cells_of_array, pg_type_of_arrow, Cell, Column};
use crate::sql::query::{parameter_types, pg_column_name};

/// Rows a subscription queues for a slow reader unless the session sets
/// `subscription_rows_max`.
pub const SUBSCRIPTION_ROWS_MAX: usize = 10_000;
/// The column every change row ends with.
pub const CHANGED_AT: &str = "changed_at";

/// A planned continuous query: which metric or stream it reads, and the compiled WHERE
/// and projection over the target's columns followed by `changed_at`.
pub struct ContinuousQuery {
    pub stream: Arc<StreamDef>,
    pub metric: Option<Arc<MetricDef>>,
    /// The result columns sent to the client.
    pub columns: Vec<Column>,
    input: SchemaRef,
    input_types: Vec<ResultType>,
    predicate: Option<Arc<dyn PhysicalExpr>>,
    projection: Vec<Arc<dyn PhysicalExpr>>,
    /// The common case without Arrow: a WHERE of `column = constant` terms (or none) and
    /// a projection of plain columns, evaluated on the values directly.
    direct: Option<Direct>,
}

struct Direct {
    equal: Vec<(usize, eddy_planner::types::Value)>,
    columns: Vec<usize>,
}

fn column_index(e: &Arc<dyn PhysicalExpr>) -> Option<usize> {
    (e.as_ref() as &dyn std::any::Any)
        .downcast_ref::<ColumnExpr>()
        .map(|c| c.index())
}

/// `col = constant [AND …]` as (column, value) pairs; `None` for anything else.
fn equalities(e: &Arc<dyn PhysicalExpr>) -> Option<Vec<(usize, eddy_planner::types::Value)>> {
    let b = (e.as_ref() as &dyn std::any::Any).downcast_ref::<BinaryExpr>()?;
    match b.op() {
        Operator::And => {
            let mut terms = equalities(b.left())?;
            terms.extend(equalities(b.right())?);
            Some(terms)
        }
        Operator::Eq => {
            let (col, lit) = match (column_index(b.left()), column_index(b.right())) {
                (Some(c), None) => (c, b.right()),
                (None, Some(c)) => (c, b.left()),
                _ => return None,
            };
            let cell = match (lit.as_ref() as &dyn std::any::Any)
                .downcast_ref::<Literal>()?
                .value()
                .clone()
            {
                ScalarValue::Utf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => {
                    Value::Text(s.into())
                }
                ScalarValue::Int64(Some(i)) => Value::Int(i),
                ScalarValue::Int32(Some(i)) => Value::Int(i64::from(i)),
                ScalarValue::Boolean(Some(v)) => Value::Bool(v),
                _ => return None,
            };
            Some(vec![(col, cell)])
        }
        _ => None,
    }
}

/// The columns a continuous query reads from `name`: the metric's or stream's, then
/// `changed_at`.
fn target_columns(catalog: &Catalog, name: &str) -> Option<Vec<(String, ResultType)>> {
    let mut cols = if let Some(metric) = catalog.metric(name) {
        let stream = catalog.stream(&metric.stream)?;
        metric.columns(stream)
    } else {
        let stream = catalog.stream(name)?;
        stream
            .columns
            .iter()
            .map(|c| (c.name.clone(), ResultType::Column(c.ty)))
            .collect()
    };
    cols.push((
        CHANGED_AT.to_string(),
        ResultType::Column(ColumnType::Timestamp),
    ));
    Some(cols)
}

fn schema_of(cols: &[(String, ResultType)]) -> SchemaRef {
    Arc::new(Schema::new(
        cols.iter()
            .map(|(n, t)| Field::new(n, result_arrow_type(*t), true))
            .collect::<Vec<_>>(),
    ))
}

fn not_continuous(what: &str) -> Error {
    Error::unsupported(format!("EMIT CHANGES does not support {what}"))
        .with_hint("A continuous query is SELECT columns or expressions FROM one metric or stream [WHERE …] EMIT CHANGES.")
}

/// The result columns of a continuous query: its projection, then `changed_at` unless
/// the projection names it.
fn result_columns(schema: &DFSchema) -> Vec<Column> {
    let mut columns: Vec<Column> = schema
        .fields()
        .iter()
        .map(|f| Column::new(pg_column_name(f.name()), pg_type_of_arrow(f.data_type())))
        .collect();
    if !columns.iter().any(|c| c.name == CHANGED_AT) {
        columns.push(Column::new(
            CHANGED_AT,
            pg_type_of_arrow(&result_arrow_type(ResultType::Column(
                ColumnType::Timestamp,
            ))),
        ));
    }
    columns
}

impl ContinuousQuery {
    /// The result columns and parameter types of a continuous query, without running it.
    pub async fn describe(
        catalog: &Catalog,
        sql: &str,
    ) -> Result<(
        Vec<Column>,
        Vec<Option<datafusion::arrow::datatypes::DataType>>,
    )> {
        let (_, plan) = Self::logical(catalog, sql).await?;
        Ok((result_columns(plan.schema()), parameter_types(&plan)?))
    }

    /// Plans `sql` (a SELECT without `EMIT CHANGES`) against the catalog.
    pub async fn plan(catalog: &Catalog, sql: &str) -> Result<ContinuousQuery> {
        let (ctx, plan) = Self::logical(catalog, sql).await?;
        Self::compile(catalog, &ctx, &plan)
    }

    /// The analysed logical plan over tables with every target's columns and
    /// `changed_at`.
    async fn logical(catalog: &Catalog, sql: &str) -> Result<(SessionContext, LogicalPlan)> {
        let config = SessionConfig::new()
            .with_default_catalog_and_schema("eddy", "public")
            .set_str("datafusion.sql_parser.dialect", "PostgreSQL");
        let ctx = SessionContext::new_with_config(config);
        let names = catalog.streams.keys().chain(catalog.metrics.keys());
        for name in names {
            let cols = target_columns(catalog, name).expect("listed by the catalog");
            if cols[..cols.len() - 1].iter().any(|(n, _)| n == CHANGED_AT) {
                // The query cannot name both; such a target is not subscribable.
                continue;
            }
            let table = EmptyTable::new(schema_of(&cols));
            ctx.register_table(TableReference::bare(name.as_str()), Arc::new(table))
                .map_err(datafusion_error)?;
        }
        let state = ctx.state();
        let plan = state
            .create_logical_plan(sql)
            .await
            .map_err(datafusion_error)?;
        let plan = Analyzer::new()
            .execute_and_check(plan, state.config_options(), |_, _| {})
            .map_err(datafusion_error)?;
        Ok((ctx, plan))
    }

    fn compile(
        catalog: &Catalog,
        ctx: &SessionContext,
        plan: &LogicalPlan,
    ) -> Result<ContinuousQuery> {
        let mut projection: Option<(Vec<Expr>, Arc<DFSchema>)> = None;
        let mut predicate: Option<(Expr, Arc<DFSchema>)> = None;
        let mut node = plan;
        let table = loop {
            match node {
                LogicalPlan::Projection(p) if projection.is_none() && predicate.is_none() => {
                    projection = Some((p.expr.clone(), p.input.schema().clone()));
                    node = &p.input;
                }
                LogicalPlan::Filter(f) if predicate.is_none() => {
                    predicate = Some((f.predicate.clone(), f.input.schema().clone()));
                    node = &f.input;
                }
                LogicalPlan::SubqueryAlias(a) => node = &a.input,
                LogicalPlan::TableScan(scan) => break scan.table_name.table().to_string(),
                LogicalPlan::Aggregate(_) => return Err(not_continuous("aggregates")),
                LogicalPlan::Join(_) => return Err(not_continuous("joins")),
                LogicalPlan::Sort(_) => return Err(not_continuous("ORDER BY")),
                LogicalPlan::Limit(_) => return Err(not_continuous("LIMIT")),
                LogicalPlan::Distinct(_) => return Err(not_continuous("DISTINCT")),
                LogicalPlan::Window(_) => return Err(not_continuous("window functions")),
                other => return Err(not_continuous(&format!("{} plans", other.display()))),
            }
        };
        let (stream, metric) = match catalog.metric(&table) {
            Some(m) => (
                catalog
                    .stream(&m.stream)
                    .ok_or_else(|| Error::internal("metric without stream"))?
                    .clone(),
                Some(m.clone()),
            ),
            None => match catalog.stream(&table) {
                Some(s) => (s.clone(), None),
                None => return Err(not_continuous("this table")),
            },
        };
        let cols = target_columns(catalog, &table).expect("resolved above");
        let input = schema_of(&cols);

        let physical = |expr: Expr, schema: &Arc<DFSchema>| -> Result<Arc<dyn PhysicalExpr>> {
            // Fold constants (and `now()`, to the time the subscription starts).
            let simplifier = ExprSimplifier::new(
                SimplifyContext::builder()
                    .with_schema(schema.clone())
                    .build(),
            );
            let expr = simplifier.simplify(expr).map_err(datafusion_error)?;
            ctx.create_physical_expr(expr, schema)
                .map_err(datafusion_error)
        };
        let predicate = match predicate {
            Some((expr, schema)) => Some(physical(expr, &schema)?),
            None => None,
        };
        let columns = result_columns(plan.schema());
        let mut exprs = Vec::new();
        match projection {
            Some((list, schema)) => {
                for expr in list {
                    exprs.push(physical(expr, &schema)?);
                }
            }
            None => {
                for (i, f) in input.fields().iter().enumerate() {
                    exprs.push(Arc::new(ColumnExpr::new(f.name(), i)) as Arc<dyn PhysicalExpr>);
                }
            }
        }
        if exprs.len() < columns.len() {
            let i = cols.len() - 1;
            exprs.push(Arc::new(ColumnExpr::new(CHANGED_AT, i)));
        }
        let direct_columns: Option<Vec<usize>> = exprs.iter().map(column_index).collect();
        let direct_equal = match &predicate {
            None => Some(Vec::new()),
            Some(p) => equalities(p),
        };
        let direct = match (direct_columns, direct_equal) {
            (Some(columns), Some(equal)) => Some(Direct { equal, columns }),
            _ => None,
        };
        Ok(ContinuousQuery {
            stream,
            metric,
            columns,
            input,
            input_types: cols.into_iter().map(|(_, t)| t).collect(),
            predicate,
            projection: exprs,
            direct,
        })
    }

    pub fn target(&self) -> &str {
        match &self.metric {
            Some(m) => &m.name,
            None => &self.stream.name,
        }
    }

    /// Filters and projects changed rows: (index in `changes`, result row).
    pub fn rows(&self, changes: &[Change]) -> Result<Vec<(usize, Vec<Cell>)>> {
        if let Some(d) = &self.direct {
            let cell = |row: &[eddy_planner::types::Value], i: usize| {
                cell_of(&row[i], self.input_types[i])
            };
            return Ok(changes
                .iter()
                .enumerate()
                .filter(|(_, c)| d.equal.iter().all(|(i, want)| c.row[*i] == *want))
                .map(|(k, c)| (k, d.columns.iter().map(|&i| cell(&c.row, i)).collect()))
                .collect());
        }
        let rows: Vec<&Vec<eddy_planner::types::Value>> = changes.iter().map(|c| &c.row).collect();
        let batch = rows_to_batch(self.input.clone(), &self.input_types, &rows)?;
        let (batch, kept): (_, Vec<usize>) = match &self.predicate {
            None => (batch, (0..changes.len()).collect()),
            Some(p) => {
                let value = p.evaluate(&batch).map_err(datafusion_error)?;
                let array = value
                    .into_array(batch.num_rows())
                    .map_err(datafusion_error)?;
                let mask = array
                    .as_any()
                    .downcast_ref::<BooleanArray>()
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::DatatypeMismatch,
                            "argument of WHERE must be type boolean",
                        )
                    })?;
                let kept = (0..mask.len())
                    .filter(|&i| mask.is_valid(i) && mask.value(i))
                    .collect();
                let batch = filter_record_batch(&batch, mask)
                    .map_err(|e| Error::internal(e.to_string()))?;
                (batch, kept)
            }
        };
        if kept.is_empty() {
            return Ok(Vec::new());
        }
        let mut columns = Vec::with_capacity(self.projection.len());
        for p in &self.projection {
            let array = p
                .evaluate(&batch)
                .and_then(|v| v.into_array(batch.num_rows()))
                .map_err(datafusion_error)?;
            columns.push(cells_of_array(&array));
        }
        Ok(kept
            .into_iter()
            .enumerate()
            .map(|(r, i)| (i, columns.iter().map(|c| c[r].clone()).collect()))
            .collect())
    }
}

/// Who holds a subscription and how it reads, for `SHOW SUBSCRIPTIONS`.
#[derive(Clone, Debug, Default)]
pub struct Client {
    pub pid: i32,
    pub user: String,
    pub application_name: String,
    pub addr: String,
}

#[derive(Default)]
struct Queue {
    rows: VecDeque<(Box<[u8]>, Vec<Cell>)>,
    /// The position, counted from the subscription's start, of `rows[0]`.
    base: u64,
    /// A metric group's newest queued row, by position; kept only while the queue is
    /// at its bound (`indexed`), so a reader that keeps up costs no hashing.
    latest: HashMap<Box<[u8]>, u64>,
    indexed: bool,
    error: Option<Error>,
}

/// One subscription: the queue shards fill and its reader drains.
pub struct Subscription {
    pub id: u64,
    pub query: ContinuousQuery,
    pub text: String,
    pub kind: &'static str,
    pub client: Client,
    pub started_at: i64,
    rows_max: usize,
    queue: Mutex<Queue>,
    notify: Notify,
    closed: AtomicBool,
    rows_sent: AtomicU64,
    rows_coalesced: AtomicU64,
}

impl Subscription {
    fn fail(&self, error: Error) {
        let mut q = self.queue.lock().expect("subscription lock");
        if q.error.is_none() {
            q.error = Some(error);
        }
        drop(q);
        self.closed.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    /// Takes up to `max` queued rows without waiting (`max == 0`: all). Fails only when
    /// nothing is queued and the subscription has ended.
    pub fn take(&self, max: usize) -> Result<Vec<Vec<Cell>>> {
        let mut q = self.queue.lock().expect("subscription lock");
        let n = if max == 0 {
            q.rows.len()
        } else {
            max.min(q.rows.len())
        };
        if n == 0 {
            if let Some(e) = &q.error {
                return Err(e.clone());
            }
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let (key, row) = q.rows.pop_front().expect("counted");
            let at = q.base;
            if q.indexed && q.latest.get(&key) == Some(&at) {
                q.latest.remove(&key);
            }
            q.base += 1;
            out.push(row);
        }
        if q.rows.is_empty() && q.indexed {
            q.latest.clear();
            q.indexed = false;
        }
        drop(q);
        self.rows_sent.fetch_add(n as u64, Ordering::Relaxed);
        Ok(out)
    }

    /// Waits until a row is queued or the subscription has ended.
    pub async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            {
                let q = self.queue.lock().expect("subscription lock");
                if !q.rows.is_empty() || q.error.is_some() {
                    return;
                }
            }
            notified.await;
        }
    }

    pub fn queued(&self) -> usize {
        self.queue.lock().expect("subscription lock").rows.len()
    }

    pub fn rows_sent(&self) -> u64 {
        self.rows_sent.load(Ordering::Relaxed)
    }

    pub fn rows_coalesced(&self) -> u64 {
        self.rows_coalesced.load(Ordering::Relaxed)
    }
}

impl Watcher for Subscription {
    fn deliver(&self, changes: &[Change]) -> bool {
        if self.closed.load(Ordering::Acquire) {
            return false;
        }
        let rows = match self.query.rows(changes) {
            Ok(rows) => rows,
            Err(e) => {
                self.fail(e);
                return false;
            }
        };
        if rows.is_empty() {
            return true;
        }
        let mut q = self.queue.lock().expect("subscription lock");
        let coalesce = self.query.metric.is_some();
        for (i, row) in rows {
            let key = changes[i].key.clone();
            if q.rows.len() >= self.rows_max {
                if !coalesce {
                    drop(q);
                    self.fail(
                        Error::new(
                            ErrorKind::LimitExceeded,
                            format!(
                                "subscription to stream \"{}\" fell more than {} rows behind",
                                self.query.stream.name, self.rows_max
                            ),
                        )
                        .with_detail("Rows of a stream subscription are never dropped, so the subscription ended.")
                        .with_hint("Read faster, narrow the WHERE clause, or raise subscription_rows_max (SET subscription_rows_max = …)."),
                    );
                    return false;
                }
                if !q.indexed {
                    let base = q.base;
                    let index: HashMap<Box<[u8]>, u64> = q
                        .rows
                        .iter()
                        .enumerate()
                        .map(|(j, (k, _))| (k.clone(), base + j as u64))
                        .collect();
                    q.latest = index;
                    q.indexed = true;
                }
                if let Some(&at) = q.latest.get(&key) {
                    let slot = (at - q.base) as usize;
                    q.rows[slot].1 = row;
                    self.rows_coalesced.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            let at = q.base + q.rows.len() as u64;
            if q.indexed {
                q.latest.insert(key.clone(), at);
            }
            q.rows.push_back((key, row));
        }
        drop(q);
        self.notify.notify_one();
        true
    }

    fn end(&self, error: Error) {
        self.fail(error);
    }
}

/// Every open subscription of the node.
#[derive(Default)]
pub struct Registry {
    next_id: AtomicU64,
    open: Mutex<BTreeMap<u64, Arc<Subscription>>>,
}

impl Registry {
    /// Subscriptions open now.
    pub fn open_count(&self) -> usize {
        self.open.lock().expect("registry lock").len()
    }

    pub fn list(&self) -> Vec<Arc<Subscription>> {
        self.open
            .lock()
            .expect("registry lock")
            .values()
            .cloned()
            .collect()
    }
}

/// The owner of a subscription: dropping it ends the subscription everywhere.
pub struct SubscriptionHandle {
    pub sub: Arc<Subscription>,
    registry: Arc<Registry>,
    engine: Arc<Engine>,
}

impl std::ops::Deref for SubscriptionHandle {
    type Target = Subscription;

    fn deref(&self) -> &Subscription {
        &self.sub
    }
}

impl Drop for SubscriptionHandle {
    fn drop(&mut self) {
        self.sub.closed.store(true, Ordering::Release);
        self.registry
            .open
            .lock()
            .expect("registry lock")
            .remove(&self.sub.id);
        let engine = self.engine.clone();
        let id = self.sub.id;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { engine.unwatch(id).await });
        }
    }
}

/// What a new subscription needs besides its query.
pub struct Opening {
    pub text: String,
    pub kind: &'static str,
    pub client: Client,
    pub rows_max: usize,
}

/// Starts a subscription: registers it and attaches it to the tasks of its target, which
/// queue a metric's current rows first.
pub async fn open(
    registry: &Arc<Registry>,
    engine: &Arc<Engine>,
    query: ContinuousQuery,
    opening: Opening,
) -> Result<SubscriptionHandle> {
    let id = registry.next_id.fetch_add(1, Ordering::Relaxed) + 1;
    let (target, partitioner) = match &query.metric {
        Some(m) => (WatchTarget::Metric(m.name.clone()), m.partitioner),
        None => (WatchTarget::Stream, 0),
    };
    let stream = query.stream.name.clone();
    let sub = Arc::new(Subscription {
        id,
        query,
        text: opening.text,
        kind: opening.kind,
        client: opening.client,
        started_at: chrono::Utc::now().timestamp_micros(),
        rows_max: opening.rows_max.max(1),
        queue: Mutex::new(Queue::default()),
        notify: Notify::new(),
        closed: AtomicBool::new(false),
        rows_sent: AtomicU64::new(0),
        rows_coalesced: AtomicU64::new(0),
    });
    let handle = SubscriptionHandle {
        sub: sub.clone(),
        registry: registry.clone(),
        engine: engine.clone(),
    };
    engine
        .watch(
            &stream,
            partitioner,
            target,
            id,
            sub.clone() as Arc<dyn Watcher>,
        )
        .await?;
    // Listed once attached: a client seeing it in SHOW SUBSCRIPTIONS knows it sees
    // every later change.
    registry.open.lock().expect("registry lock").insert(id, sub);
    Ok(handle)
}
