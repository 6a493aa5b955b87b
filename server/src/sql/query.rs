//! Ad-hoc SELECT through DataFusion: every stream and metric is a table.
//!
//! Invariant: a metric scan whose filters pin every group-by column to a constant is a
//! point lookup in the one task that owns the group (hash lookup, no scan); anything
//! else reads the current rows of every task, and DataFusion does the rest.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableFunctionImpl, TableProvider};
use datafusion::common::{Result as DfResult, ScalarValue, TableReference};
use datafusion::datasource::TableType;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};

use eddy_cluster::Engine;
use eddy_planner::aggregate::ResultType;
use eddy_planner::bind::value_from_text;
use eddy_planner::catalog::{Catalog, MetricDef, StreamDef};
use eddy_planner::filter::{datafusion_error, result_arrow_type, stream_schema, stream_types};
use eddy_planner::types::Value;
use eddy_planner::{Error, Result};

use crate::ops::limits::{Limit, Limits};
use crate::session::cells::{cell_of, rows_of_batches, Cell, Column};
use crate::sql::{history, pg_catalog};

#[derive(Debug)]
pub(crate) struct MetricTable {
    engine: Arc<Engine>,
    stream: Arc<StreamDef>,
    metric: Arc<MetricDef>,
    schema: SchemaRef,
    types: Vec<ResultType>,
    /// `AS OF`: the rows as they stood at this event time (µs), from the stored events.
    as_of: Option<i64>,
}

impl MetricTable {
    pub(crate) fn new(
        engine: Arc<Engine>,
        stream: Arc<StreamDef>,
        metric: Arc<MetricDef>,
    ) -> MetricTable {
        let cols = metric.columns(&stream);
        let schema = Arc::new(Schema::new(
            cols.iter()
                .map(|(n, t)| Field::new(n, result_arrow_type(*t), true))
                .collect::<Vec<_>>(),
        ));
        MetricTable {
            engine,
            stream,
            metric,
            schema,
            types: cols.into_iter().map(|(_, t)| t).collect(),
            as_of: None,
        }
    }

    /// The table of the metric's rows as they stood at event time `t` (µs).
    pub(crate) fn at_time(self, t: i64) -> MetricTable {
        MetricTable {
            as_of: Some(t),
            ..self
        }
    }

    /// The group-by column position a filter pins to a constant, with the value.
    fn key_filter(&self, expr: &Expr) -> Option<(usize, Value)> {
        let Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Eq,
            right,
        }) = expr
        else {
            return None;
        };
        let (col, lit) = match (history::strip_cast(left), history::strip_cast(right)) {
            (Expr::Column(c), Expr::Literal(v, _)) | (Expr::Literal(v, _), Expr::Column(c)) => {
                (c, v)
            }
            _ => return None,
        };
        let pos = self
            .metric
            .group_by
            .iter()
            .position(|g| self.stream.columns[*g].name == col.name)?;
        let def = &self.stream.columns[self.metric.group_by[pos]];
        let value = scalar_to_value(lit, def)?;
        Some((pos, value))
    }
}

fn scalar_to_value(v: &ScalarValue, col: &eddy_planner::catalog::ColumnDef) -> Option<Value> {
    if v.is_null() {
        return None;
    }
    let text = match v {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => s.clone(),
        other => other.to_string(),
    };
    value_from_text(&text, col).ok()
}

#[async_trait]
impl TableProvider for MetricTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| {
                if self.key_filter(f).is_some() {
                    TableProviderFilterPushDown::Inexact
                } else {
                    TableProviderFilterPushDown::Unsupported
                }
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut key: Vec<Option<Value>> = vec![None; self.metric.group_by.len()];
        for f in filters {
            if let Some((pos, v)) = self.key_filter(f) {
                key[pos] = Some(v);
            }
        }
        let key: Option<Vec<Value>> = if key.is_empty() {
            None
        } else {
            key.into_iter().collect()
        };
        let rows = match self.as_of {
            None => {
                self.engine
                    .metric_rows(&self.stream, &self.metric, key)
                    .await
            }
            Some(t) => {
                self.engine
                    .metric_rows_as_of(&self.stream, &self.metric, t, key)
                    .await
            }
        }
        .map_err(history::external)?;
        history::rows_scan(&self.schema, &self.types, &rows, state, projection, limit).await
    }
}

#[derive(Debug)]
struct StreamTable {
    engine: Arc<Engine>,
    stream: Arc<StreamDef>,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for StreamTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let rows = self
            .engine
            .stream_rows(&self.stream)
            .await
            .map_err(history::external)?;
        let types = stream_types(&self.stream);
        history::rows_scan(&self.schema, &types, &rows, state, projection, limit).await
    }
}

/// `as_of('metric', TIMESTAMP '…')`: what `FROM metric AS OF TIMESTAMP '…'` becomes.
#[derive(Debug)]
pub(crate) struct AsOfFunction {
    pub(crate) engine: Arc<Engine>,
    pub(crate) catalog: Arc<Catalog>,
}

impl TableFunctionImpl for AsOfFunction {
    fn call(&self, args: &[Expr]) -> DfResult<Arc<dyn TableProvider>> {
        let (stream, metric) = history::metric_named(&self.catalog, args, "as_of")?;
        let t = history::time_arg(args.get(1))?;
        Ok(Arc::new(
            MetricTable::new(self.engine.clone(), stream, metric).at_time(t),
        ))
    }
}

tokio::task_local! {
    /// The running statement's session output options, whose `time_zone` is the
    /// session's TimeZone (canonical, as `SET TimeZone` keeps it): set by the session
    /// around each statement (an `Arc` clone, no copy). Without it, UTC.
    pub static SESSION_FORMAT: Arc<pgwire::types::format::FormatOptions>;
}

tokio::task_local! {
    /// The running statement's session settings by lower-case name, for
    /// `current_setting`: set by the session around a statement that names that function
    /// (empty for the others).
    pub static SESSION_SETTINGS: Arc<Vec<(String, String)>>;
}

/// The value of parameter `name` in the running statement's session: one of the
/// session's settings, else one Eddy shows as fixed (`settings::fixed_parameter`).
pub fn session_setting(name: &str) -> Option<String> {
    let name = name.to_ascii_lowercase();
    let own = SESSION_SETTINGS
        .try_with(|s| s.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone()))
        .ok()
        .flatten();
    own.or_else(|| {
        crate::session::settings::Setting::named(&name)
            .map(|s| s.default_value().to_string())
            .or_else(|| crate::session::settings::fixed_parameter(&name).map(str::to_string))
    })
}

/// `f` of the running statement's session TimeZone.
pub fn with_session_time_zone<T>(f: impl FnOnce(&str) -> T) -> T {
    match SESSION_FORMAT.try_with(|o| o.clone()) {
        Ok(options) => f(&options.time_zone),
        Err(_) => f("UTC"),
    }
}

/// A DataFusion context over the catalog's streams and metrics, in time zone `zone`:
/// `timestamptz` values, literals and casts are in it, as in a PostgreSQL session.
pub fn context(catalog: &Catalog, engine: &Arc<Engine>, zone: &str) -> Result<SessionContext> {
    let mut config = SessionConfig::new();
    config.options_mut().execution.time_zone = Some(zone.to_string());
    let config = config
        // `information_schema` is the catalog's own (`pg_catalog::register`), as PostgreSQL shapes it.
        .with_information_schema(false)
        .with_default_catalog_and_schema("eddy", "public")
        .set_str("datafusion.sql_parser.dialect", "PostgreSQL");
    let config = pg_catalog::configure(config, Arc::new(pg_catalog::Snapshot::of(catalog)?));
    let ctx = pg_catalog::session(config);
    for stream in catalog.streams.values() {
        let table = StreamTable {
            engine: engine.clone(),
            stream: stream.clone(),
            schema: stream_schema(stream),
        };
        ctx.register_table(TableReference::bare(stream.name.as_str()), Arc::new(table))
            .map_err(datafusion_error)?;
    }
    for metric in catalog.metrics.values() {
        let stream = catalog
            .stream(&metric.stream)
            .ok_or_else(|| Error::internal("metric without stream"))?;
        let table = MetricTable::new(engine.clone(), stream.clone(), metric.clone());
        ctx.register_table(TableReference::bare(metric.name.as_str()), Arc::new(table))
            .map_err(datafusion_error)?;
    }
    pg_catalog::register(&ctx)?;
    let catalog = Arc::new(catalog.clone());
    history::register(&ctx, engine, &catalog);
    let (engine, catalog) = (engine.clone(), catalog);
    ctx.register_udtf("as_of", Arc::new(AsOfFunction { engine, catalog }));
    Ok(ctx)
}

/// Runs a SELECT (or any query DataFusion plans) and returns its columns and rows.
pub async fn run(ctx: &SessionContext, sql: &str) -> Result<(Vec<Column>, Vec<Vec<Cell>>)> {
    run_within(ctx, sql, &Limits::default()).await
}

/// `run`, failing with 54000 once the result holds more than `session_memory_bytes`.
pub async fn run_within(
    ctx: &SessionContext,
    sql: &str,
    limits: &Limits,
) -> Result<(Vec<Column>, Vec<Vec<Cell>>)> {
    use futures::StreamExt;
    let plan = pg_catalog::plan(ctx, sql).await.map_err(datafusion_error)?;
    let columns = columns_of(plan.schema());
    // A point lookup with constant keys reads its group, with no physical plan.
    if let Some(lookup) = PointLookup::recognise(&plan, &[], &ctx.state()) {
        if let Some(rows) = lookup.run(&[]).await? {
            return Ok((columns, rows));
        }
    }
    let mut stream = start(ctx, plan).await?;
    let mut batches = Vec::new();
    let mut held = 0u64;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(datafusion_error)?;
        held += batch.get_array_memory_size() as u64;
        limits.check(Limit::SessionMemoryBytes, held, "the query's result")?;
        batches.push(batch);
    }
    Ok((columns, rows_of_batches(&batches)))
}

/// Plans and starts a query: its columns as PostgreSQL names and types them, and its
/// batches as DataFusion makes them.
async fn execute(
    ctx: &SessionContext,
    sql: &str,
) -> Result<(
    Vec<Column>,
    datafusion::execution::SendableRecordBatchStream,
)> {
    let plan = pg_catalog::plan(ctx, sql).await.map_err(datafusion_error)?;
    let columns = columns_of(plan.schema());
    Ok((columns, start(ctx, plan).await?))
}

/// A result's columns as PostgreSQL names and types them.
fn columns_of(schema: &datafusion::common::DFSchema) -> Vec<Column> {
    schema
        .fields()
        .iter()
        .map(|f| Column::new(pg_column_name(f.name()), pg_catalog::column_type(f)))
        .collect()
}

/// Runs a planned query: its batches as DataFusion makes them.
async fn start(
    ctx: &SessionContext,
    plan: datafusion::logical_expr::LogicalPlan,
) -> Result<datafusion::execution::SendableRecordBatchStream> {
    let df = ctx
        .execute_logical_plan(plan)
        .await
        .map_err(datafusion_error)?;
    df.execute_stream().await.map_err(datafusion_error)
}

/// A query's batches, as DataFusion makes them.
pub type BatchStream =
    futures::stream::BoxStream<'static, Result<datafusion::arrow::record_batch::RecordBatch>>;

/// `run` for results of any size (COPY … TO, cursors): the batches come as DataFusion
/// makes them, so memory holds a batch, not the result. Each batch is made in the
/// session's time zone.
pub async fn run_stream(ctx: &SessionContext, sql: &str) -> Result<(Vec<Column>, BatchStream)> {
    use futures::StreamExt;
    let (columns, inner) = execute(ctx, sql).await?;
    let zone = SESSION_FORMAT.try_with(Arc::clone).ok();
    let batches = InZone { zone, inner }.map(|batch| batch.map_err(datafusion_error));
    Ok((columns, batches.boxed()))
}

/// A stream polled in a session's time zone (`SESSION_FORMAT`), wherever it is polled.
struct InZone<S> {
    zone: Option<Arc<pgwire::types::format::FormatOptions>>,
    inner: S,
}

impl<S: futures::Stream + Unpin> futures::Stream for InZone<S> {
    type Item = S::Item;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<S::Item>> {
        use futures::StreamExt;
        let this = &mut *self;
        match &this.zone {
            Some(zone) => {
                SESSION_FORMAT.sync_scope(zone.clone(), || this.inner.poll_next_unpin(cx))
            }
            None => this.inner.poll_next_unpin(cx),
        }
    }
}

/// The values of an INSERT's VALUES expressions (`InsertTemplate::exprs`), each of its
/// column's type: one `SELECT CAST((e) AS type), …` of them all, planned (with the
/// `pg_catalog` rewrites) and run by DataFusion, so its functions, operators and casts
/// and their errors are DataFusion's. An expression may not read a stream or metric.
pub async fn evaluate(
    ctx: &SessionContext,
    exprs: &[(
        datafusion::sql::sqlparser::ast::Expr,
        eddy_planner::catalog::ColumnDef,
    )],
) -> Result<Vec<Value>> {
    use datafusion::arrow::compute::cast;
    let items: Vec<String> = exprs
        .iter()
        .enumerate()
        .map(|(i, (e, col))| format!("CAST(({e}) AS {}) AS v{i}", col.ty.sql_name()))
        .collect();
    let plan = pg_catalog::plan(ctx, &format!("SELECT {}", items.join(", ")))
        .await
        .map_err(datafusion_error)?;
    if !tables_read(&plan).is_empty() {
        return Err(Error::unsupported(
            "an INSERT's VALUES expressions may not read streams or metrics",
        )
        .with_hint("Read the values first, then insert them."));
    }
    let batches = ctx
        .execute_logical_plan(plan)
        .await
        .map_err(datafusion_error)?
        .collect()
        .await
        .map_err(datafusion_error)?;
    let batch = batches
        .iter()
        .find(|b| b.num_rows() == 1)
        .ok_or_else(|| Error::internal("VALUES expressions gave no row"))?;
    exprs
        .iter()
        .enumerate()
        .map(|(i, (_, col))| {
            let array =
                cast(batch.column(i), &col.ty.arrow()).map_err(|e| datafusion_error(e.into()))?;
            Ok(eddy_planner::filter::column_values(&array)?.remove(0))
        })
        .collect()
}

/// The streams and metrics a plan reads (the catalog tables of `pg_catalog` and
/// `information_schema` are everyone's), its subqueries included.
pub fn tables_read(plan: &datafusion::logical_expr::LogicalPlan) -> Vec<String> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    use datafusion::logical_expr::LogicalPlan;
    let mut out = std::collections::BTreeSet::new();
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            if scan.table_name.schema().is_none_or(|s| s == "public") {
                out.insert(scan.table_name.table().to_string());
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    out.into_iter().collect()
}

/// A query's logical plan, with its result columns and parameter types, without
/// running it.
pub async fn describe(
    ctx: &SessionContext,
    sql: &str,
) -> Result<(
    datafusion::logical_expr::LogicalPlan,
    Vec<Column>,
    Vec<Option<datafusion::arrow::datatypes::DataType>>,
)> {
    let plan = pg_catalog::plan(ctx, sql).await.map_err(datafusion_error)?;
    let columns = plan
        .schema()
        .fields()
        .iter()
        .map(|f| Column::new(pg_column_name(f.name()), pg_catalog::column_type(f)))
        .collect();
    let params = parameter_types(&plan)?;
    Ok((plan, columns, params))
}

/// The types DataFusion inferred for `$1`, `$2`, … (`None` where it could not).
pub(crate) fn parameter_types(
    plan: &datafusion::logical_expr::LogicalPlan,
) -> Result<Vec<Option<datafusion::arrow::datatypes::DataType>>> {
    let params = plan.get_parameter_types().map_err(datafusion_error)?;
    let n = params
        .keys()
        .filter_map(|k| k.trim_start_matches('$').parse::<usize>().ok())
        .max()
        .unwrap_or(0);
    Ok((1..=n)
        .map(|i| params.get(&format!("${i}")).cloned().flatten())
        .collect())
}

/// The name PostgreSQL gives an unaliased result column: a function call is named after
/// the function (`count(*)` → `count`), any other expression `?column?`.
pub(crate) fn pg_column_name(name: &str) -> String {
    if let Some((name, _)) = name.split_once(crate::sql::pg_catalog::DUPLICATE_MARK) {
        return name.to_string();
    }
    let Some(open) = name.find('(') else {
        return name.to_string();
    };
    let head = &name[..open];
    let is_function = !head.is_empty()
        && head
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.');
    if is_function {
        // The functions the rewrite put in place of `x::text` and `interval * n`.
        match head.rsplit('.').next().unwrap_or(head) {
            "pg_text" => "text".to_string(),
            "interval_mul" => "?column?".to_string(),
            f => f.to_string(),
        }
    } else {
        "?column?".to_string()
    }
}

/// A prepared `SELECT cols FROM metric WHERE key = expr [AND …]` that pins every
/// group-by column with an expression of constants and parameters: executed by
/// evaluating those expressions and reading the one group from its task, with no SQL
/// planning: each expression is compiled once, at bind.
#[derive(Debug)]
pub struct PointLookup {
    engine: Arc<Engine>,
    stream: Arc<StreamDef>,
    metric: Arc<MetricDef>,
    /// `AS OF`: the group's values at this event time, from the stored events.
    as_of: Option<i64>,
    /// The metric's columns: group-by columns, then aggregates.
    types: Vec<ResultType>,
    arrow: Vec<datafusion::arrow::datatypes::DataType>,
    /// Per group-by column, where its value comes from.
    keys: Vec<KeySource>,
    /// The metric column each result column shows.
    projection: Vec<usize>,
    /// The parameters as the columns of a one-row batch, `$n` as column n-1, each typed
    /// as DataFusion inferred it (text where it could not).
    params: SchemaRef,
}

/// Where a point lookup takes one group-by value from.
#[derive(Debug)]
enum KeySource {
    /// Parameter `$n` (0-based here), typed as its column: its text is the column's
    /// input, read as an INSERT reads it.
    Param(usize),
    /// A text constant, or text constants and text parameters joined by `||`
    /// (`'c-' || $1`), for a text column: joined as strings, with no Arrow batch; NULL
    /// if a parameter is NULL, as the operator is.
    Concat(Vec<Piece>),
    /// Any other expression of constants and parameters, compiled against the
    /// parameters' batch (type coercion and constant folding done once).
    Compiled(Arc<dyn datafusion::physical_plan::PhysicalExpr>),
}

/// A part of a `KeySource::Concat`.
#[derive(Debug)]
enum Piece {
    Text(String),
    Param(usize),
}

impl PointLookup {
    /// Recognises a point lookup in a query's logical plan (`describe`), or declines
    /// (`None`).
    pub fn recognise(
        plan: &datafusion::logical_expr::LogicalPlan,
        params: &[Option<datafusion::arrow::datatypes::DataType>],
        state: &datafusion::execution::SessionState,
    ) -> Option<PointLookup> {
        use datafusion::logical_expr::utils::split_conjunction;
        use datafusion::logical_expr::LogicalPlan;
        let LogicalPlan::Projection(projection) = plan else {
            return None;
        };
        let LogicalPlan::Filter(filter) = projection.input.as_ref() else {
            return None;
        };
        let mut input = filter.input.as_ref();
        if let LogicalPlan::SubqueryAlias(a) = input {
            input = a.input.as_ref();
        }
        let LogicalPlan::TableScan(scan) = input else {
            return None;
        };
        // A metric's table, live or `AS OF` (`as_of`, whatever its alias).
        let provider = datafusion::datasource::source_as_provider(&scan.source).ok()?;
        let table = (provider.as_ref() as &dyn std::any::Any).downcast_ref::<MetricTable>()?;
        let (metric, stream) = (table.metric.clone(), table.stream.clone());
        let cols = metric.columns(&stream);
        let position = |e: &Expr| match e {
            Expr::Column(c) => cols.iter().position(|(n, _)| *n == c.name),
            _ => None,
        };
        let mut keys: Vec<Option<Expr>> = vec![None; metric.group_by.len()];
        for conjunct in split_conjunction(&filter.predicate) {
            let Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::Eq,
                right,
            }) = conjunct
            else {
                return None;
            };
            let (col, value) = match (position(left), position(right)) {
                (Some(c), None) => (c, right.as_ref()),
                (None, Some(c)) => (c, left.as_ref()),
                _ => return None,
            };
            if col >= keys.len() || keys[col].is_some() || !value.column_refs().is_empty() {
                return None;
            }
            keys[col] = Some(value.clone());
        }
        let keys: Vec<Expr> = keys.into_iter().collect::<Option<_>>()?;
        // Float keys compare as numbers (-0 = 0), not as the stored bytes: not a lookup.
        if metric
            .group_by
            .iter()
            .any(|c| stream.columns[*c].ty.is_float())
        {
            return None;
        }
        let projection = projection
            .expr
            .iter()
            .map(position)
            .collect::<Option<Vec<usize>>>()?;
        // Compiled last: only a query that is a lookup pays for it.
        let param_schema = Arc::new(Schema::new(
            params
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let ty = t
                        .clone()
                        .unwrap_or(datafusion::arrow::datatypes::DataType::Utf8);
                    Field::new(format!("${}", i + 1), ty, true)
                })
                .collect::<Vec<_>>(),
        ));
        let keys = keys
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                KeySource::of(e, &stream.columns[metric.group_by[i]], &param_schema, state)
            })
            .collect::<Option<_>>()?;
        Some(PointLookup {
            engine: table.engine.clone(),
            as_of: table.as_of,
            arrow: cols.iter().map(|(_, t)| result_arrow_type(*t)).collect(),
            types: cols.into_iter().map(|(_, t)| t).collect(),
            stream,
            metric,
            keys,
            projection,
            params: param_schema,
        })
    }

    /// The group's row, projected; `Ok(None)` when a key's value cannot be taken
    /// exactly (the general path then runs the query, and says what is wrong).
    /// The metric the lookup reads.
    pub fn metric_name(&self) -> &str {
        &self.metric.name
    }

    pub async fn run(&self, params: &[Option<String>]) -> Result<Option<Vec<Vec<Cell>>>> {
        let mut batch = None;
        let mut key = Vec::with_capacity(self.keys.len());
        for (i, source) in self.keys.iter().enumerate() {
            let col = &self.stream.columns[self.metric.group_by[i]];
            let value = match source {
                KeySource::Param(n) => match params.get(*n) {
                    Some(Some(text)) => match value_from_text(text, col) {
                        Ok(v) => {
                            key.push(v);
                            continue;
                        }
                        Err(_) => return Ok(None),
                    },
                    Some(None) => return Ok(Some(Vec::new())),
                    None => return Ok(None),
                },
                KeySource::Concat(pieces) => {
                    let mut text = String::new();
                    for piece in pieces {
                        match piece {
                            Piece::Text(t) => text.push_str(t),
                            Piece::Param(n) => match params.get(*n) {
                                Some(Some(p)) => text.push_str(p),
                                Some(None) => return Ok(Some(Vec::new())),
                                None => return Ok(None),
                            },
                        }
                    }
                    key.push(Value::Text(text.into()));
                    continue;
                }
                KeySource::Compiled(expr) => {
                    if batch.is_none() {
                        match self.param_batch(params) {
                            Some(b) => batch = Some(b),
                            None => return Ok(None),
                        }
                    }
                    let Some(value) = batch
                        .as_ref()
                        .and_then(|b| expr.evaluate(b).ok())
                        .and_then(|v| v.to_array(1).ok())
                        .and_then(|a| ScalarValue::try_from_array(&a, 0).ok())
                    else {
                        return Ok(None);
                    };
                    value
                }
            };
            if value.is_null() {
                return Ok(Some(Vec::new()));
            }
            if value.data_type() != self.arrow[i] {
                return Ok(None);
            }
            let Some(v) = scalar_to_value(&value, col) else {
                return Ok(None);
            };
            key.push(v);
        }
        let rows = self
            .engine_rows(key)
            .await?
            .into_iter()
            .map(|row| {
                self.projection
                    .iter()
                    .map(|&c| cell_of(&row[c], self.types[c]))
                    .collect()
            })
            .collect();
        Ok(Some(rows))
    }

    /// The parameters' texts as one row, each cast to its inferred type as the general
    /// path casts it; `None` when one does not cast.
    fn param_batch(
        &self,
        params: &[Option<String>],
    ) -> Option<datafusion::arrow::record_batch::RecordBatch> {
        use datafusion::arrow::array::{ArrayRef, StringArray};
        use datafusion::arrow::compute::{cast_with_options, CastOptions};
        if params.len() != self.params.fields().len() {
            return None;
        }
        let options = CastOptions {
            safe: false,
            ..Default::default()
        };
        let columns = params
            .iter()
            .zip(self.params.fields())
            .map(|(text, field)| {
                let text: ArrayRef = Arc::new(StringArray::from(vec![text.as_deref()]));
                cast_with_options(&text, field.data_type(), &options).ok()
            })
            .collect::<Option<Vec<ArrayRef>>>()?;
        datafusion::arrow::record_batch::RecordBatch::try_new(self.params.clone(), columns).ok()
    }

    async fn engine_rows(&self, key: Vec<Value>) -> Result<Vec<Vec<Value>>> {
        let engine = &self.engine;
        match self.as_of {
            None => {
                engine
                    .metric_rows(&self.stream, &self.metric, Some(key))
                    .await
            }
            // Boxed: a read of history is a large state machine, and lookups of the
            // present would otherwise carry it.
            Some(t) => {
                Box::pin(engine.metric_rows_as_of(&self.stream, &self.metric, t, Some(key))).await
            }
        }
    }
}

/// The pieces of `e` if it is a text constant or a text parameter (as DataFusion typed
/// it), or such pieces joined by `||`.
fn concat_pieces(
    e: &Expr,
    params: &SchemaRef,
    param: &dyn Fn(&str) -> Option<usize>,
) -> Option<Vec<Piece>> {
    use datafusion::arrow::datatypes::DataType;
    match e {
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::StringConcat,
            right,
        }) => {
            let mut pieces = concat_pieces(left, params, param)?;
            pieces.extend(concat_pieces(right, params, param)?);
            Some(pieces)
        }
        Expr::Literal(
            ScalarValue::Utf8(Some(t))
            | ScalarValue::Utf8View(Some(t))
            | ScalarValue::LargeUtf8(Some(t)),
            _,
        ) => Some(vec![Piece::Text(t.clone())]),
        Expr::Placeholder(p) => {
            let n = param(&p.id)?;
            (*params.field(n).data_type() == DataType::Utf8).then_some(vec![Piece::Param(n)])
        }
        _ => None,
    }
}

impl KeySource {
    /// A bare `$n` that DataFusion typed as its text or integer column reads the
    /// parameter's text directly: the same value the cast would give, for these types,
    /// without it; so do text constants and parameters joined by `||`, for a text
    /// column. Any other expression is compiled, once; one that calls a function
    /// whose value may change between executions (`now()`) is not a lookup (`None`).
    fn of(
        e: Expr,
        col: &eddy_planner::catalog::ColumnDef,
        params: &SchemaRef,
        state: &datafusion::execution::SessionState,
    ) -> Option<KeySource> {
        use datafusion::common::tree_node::{Transformed, TreeNode};
        use datafusion::logical_expr::Volatility;
        use eddy_planner::types::ColumnType;
        let param = |id: &str| {
            let n = id
                .trim_start_matches('$')
                .parse::<usize>()
                .ok()?
                .checked_sub(1)?;
            (n < params.fields().len()).then_some(n)
        };
        if let Expr::Placeholder(p) = &e {
            let n = param(&p.id)?;
            let direct = matches!(
                col.ty,
                ColumnType::Text | ColumnType::Int32 | ColumnType::Int64
            ) && *params.field(n).data_type() == col.ty.arrow();
            if direct {
                return Some(KeySource::Param(n));
            }
        }
        if col.ty == ColumnType::Text {
            if let Some(pieces) = concat_pieces(&e, params, &param) {
                return Some(KeySource::Concat(pieces));
            }
        }
        let changing = e
            .exists(|e| {
                Ok(matches!(e, Expr::ScalarFunction(f)
                    if f.func.signature().volatility != Volatility::Immutable))
            })
            .unwrap_or(true);
        if changing {
            return None;
        }
        let e = e
            .transform(|e| match &e {
                Expr::Placeholder(p) => {
                    let n = param(&p.id).ok_or_else(|| {
                        datafusion::error::DataFusionError::Plan(format!("no parameter {}", p.id))
                    })?;
                    Ok(Transformed::yes(Expr::Column(
                        datafusion::common::Column::from_name(params.field(n).name()),
                    )))
                }
                _ => Ok(Transformed::no(e)),
            })
            .ok()?
            .data;
        let schema = datafusion::common::DFSchema::try_from(params.as_ref().clone()).ok()?;
        state
            .create_physical_expr(e, &schema)
            .ok()
            .map(KeySource::Compiled)
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::{binary_expr, lit, placeholder};

    use super::*;

    fn pieces(e: &Expr, types: &[DataType]) -> Option<Vec<String>> {
        let params: SchemaRef = Arc::new(Schema::new(
            types
                .iter()
                .enumerate()
                .map(|(i, t)| Field::new(format!("${}", i + 1), t.clone(), true))
                .collect::<Vec<_>>(),
        ));
        let param = |id: &str| {
            let n = id.trim_start_matches('$').parse::<usize>().ok()? - 1;
            (n < types.len()).then_some(n)
        };
        Some(
            concat_pieces(e, &params, &param)?
                .into_iter()
                .map(|p| match p {
                    Piece::Text(t) => format!("'{t}'"),
                    Piece::Param(n) => format!("${}", n + 1),
                })
                .collect(),
        )
    }

    #[test]
    fn text_joined_by_concat_is_read_without_arrow() {
        let cat = |a, b| binary_expr(a, Operator::StringConcat, b);
        let e = cat(cat(lit("c-"), placeholder("$1")), placeholder("$2"));
        assert_eq!(
            pieces(&e, &[DataType::Utf8, DataType::Utf8]),
            Some(vec!["'c-'".into(), "$1".into(), "$2".into()])
        );
        // A lone constant is a key of one piece.
        assert_eq!(pieces(&lit("c-1"), &[]), Some(vec!["'c-1'".into()]));
        // A parameter typed otherwise would be cast to text first: compiled instead.
        assert_eq!(pieces(&e, &[DataType::Int64, DataType::Utf8]), None);
        // Any other operator or a NULL constant: compiled.
        assert_eq!(
            pieces(
                &binary_expr(lit("c-"), Operator::Plus, placeholder("$1")),
                &[DataType::Utf8]
            ),
            None
        );
        assert_eq!(
            pieces(
                &cat(lit(ScalarValue::Utf8(None)), placeholder("$1")),
                &[DataType::Utf8]
            ),
            None
        );
    }
}
