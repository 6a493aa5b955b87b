//! A small `pg_catalog` so that drivers' metadata queries (pgjdbc's
//! `DatabaseMetaData.getTables` / `getColumns`) see streams as tables and metrics as
//! materialized views.
//!
//! Invariant: built from the catalog snapshot of the query, never stored.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, Int16Array, Int32Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{MemorySchemaProvider, SchemaProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::{create_udf, ColumnarValue, Volatility};
use datafusion::prelude::SessionContext;

use eddy_planner::catalog::Catalog;
use eddy_planner::filter::datafusion_error;
use eddy_planner::{Error, Result};

use crate::cells::pg_type;

const NAMESPACE_PUBLIC: i32 = 2200;
const NAMESPACE_PG_CATALOG: i32 = 11;
const OID_BASE: i32 = 16_384;

fn table(columns: Vec<(&str, ArrayRef)>) -> Result<Arc<MemTable>> {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ));
    let batch = RecordBatch::try_new(
        schema.clone(),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .map_err(|e| Error::internal(e.to_string()))?;
    Ok(Arc::new(
        MemTable::try_new(schema, vec![vec![batch]]).map_err(datafusion_error)?,
    ))
}

fn strings(v: Vec<String>) -> ArrayRef {
    Arc::new(StringArray::from(v))
}

fn ints(v: Vec<i32>) -> ArrayRef {
    Arc::new(Int32Array::from(v))
}

/// Registers `pg_catalog.pg_namespace`, `pg_class`, `pg_attribute`, `pg_type`,
/// `pg_description` and `pg_attrdef` for `catalog`.
pub fn register(ctx: &SessionContext, catalog: &Catalog) -> Result<()> {
    let schema = Arc::new(MemorySchemaProvider::new());
    let reg = |name: &str, t: Arc<MemTable>| -> Result<()> {
        schema
            .register_table(name.to_string(), t)
            .map(|_| ())
            .map_err(datafusion_error)
    };
    reg(
        "pg_namespace",
        table(vec![
            ("oid", ints(vec![NAMESPACE_PG_CATALOG, NAMESPACE_PUBLIC])),
            (
                "nspname",
                strings(vec!["pg_catalog".into(), "public".into()]),
            ),
        ])?,
    )?;

    // Relations: streams ('r') and metrics ('m'), numbered in creation order.
    let mut class_oid = Vec::new();
    let mut class_name = Vec::new();
    let mut class_kind = Vec::new();
    let mut att_rel = Vec::new();
    let mut att_name = Vec::new();
    let mut att_type = Vec::new();
    let mut att_num: Vec<i16> = Vec::new();
    let mut att_notnull = Vec::new();
    for (i, name) in catalog.order.iter().enumerate() {
        let oid = OID_BASE + i as i32;
        let columns: Vec<(String, u32, bool)> = if let Some(s) = catalog.stream(name) {
            class_kind.push("r".to_string());
            s.columns
                .iter()
                .map(|c| {
                    let ty = pg_type(eddy_planner::aggregate::ResultType::Column(c.ty));
                    (c.name.clone(), ty.oid(), c.not_null)
                })
                .collect()
        } else if let Some(m) = catalog.metric(name) {
            class_kind.push("m".to_string());
            let stream = catalog
                .stream(&m.stream)
                .ok_or_else(|| Error::internal("metric without stream"))?;
            m.columns(stream)
                .into_iter()
                .map(|(n, t)| (n, pg_type(t).oid(), false))
                .collect()
        } else {
            continue;
        };
        class_oid.push(oid);
        class_name.push(name.clone());
        for (j, (n, ty, nn)) in columns.into_iter().enumerate() {
            att_rel.push(oid);
            att_name.push(n);
            att_type.push(ty as i32);
            att_num.push(j as i16 + 1);
            att_notnull.push(nn);
        }
    }
    let n = class_oid.len();
    reg(
        "pg_class",
        table(vec![
            ("oid", ints(class_oid)),
            ("relname", strings(class_name)),
            ("relnamespace", ints(vec![NAMESPACE_PUBLIC; n])),
            ("relkind", strings(class_kind)),
            (
                "relhasindex",
                Arc::new(BooleanArray::from(vec![false; n])) as ArrayRef,
            ),
        ])?,
    )?;
    let m = att_rel.len();
    reg(
        "pg_attribute",
        table(vec![
            ("attrelid", ints(att_rel)),
            ("attname", strings(att_name)),
            ("atttypid", ints(att_type)),
            ("attnum", Arc::new(Int16Array::from(att_num)) as ArrayRef),
            (
                "attnotnull",
                Arc::new(BooleanArray::from(att_notnull)) as ArrayRef,
            ),
            (
                "attisdropped",
                Arc::new(BooleanArray::from(vec![false; m])) as ArrayRef,
            ),
            ("atttypmod", ints(vec![-1; m])),
            (
                "attlen",
                Arc::new(Int16Array::from(vec![-1i16; m])) as ArrayRef,
            ),
            ("attidentity", strings(vec![String::new(); m])),
            ("attgenerated", strings(vec![String::new(); m])),
        ])?,
    )?;
    let types = [
        (16, "bool"),
        (20, "int8"),
        (23, "int4"),
        (25, "text"),
        (700, "float4"),
        (701, "float8"),
        (1114, "timestamp"),
        (1700, "numeric"),
    ];
    reg(
        "pg_type",
        table(vec![
            ("oid", ints(types.iter().map(|t| t.0).collect())),
            (
                "typname",
                strings(types.iter().map(|t| t.1.to_string()).collect()),
            ),
            (
                "typnamespace",
                ints(vec![NAMESPACE_PG_CATALOG; types.len()]),
            ),
            ("typtype", strings(vec!["b".to_string(); types.len()])),
            ("typbasetype", ints(vec![0; types.len()])),
            ("typtypmod", ints(vec![-1; types.len()])),
            ("typrelid", ints(vec![0; types.len()])),
            (
                "typnotnull",
                Arc::new(BooleanArray::from(vec![false; types.len()])) as ArrayRef,
            ),
        ])?,
    )?;
    let empty = |cols: &[(&str, DataType)]| -> Result<Arc<MemTable>> {
        let schema = Arc::new(Schema::new(
            cols.iter()
                .map(|(n, t)| Field::new(*n, t.clone(), true))
                .collect::<Vec<_>>(),
        ));
        Ok(Arc::new(
            MemTable::try_new(schema, vec![vec![]]).map_err(datafusion_error)?,
        ))
    };
    reg(
        "pg_description",
        empty(&[
            ("objoid", DataType::Int32),
            ("classoid", DataType::Int32),
            ("objsubid", DataType::Int32),
            ("description", DataType::Utf8),
        ])?,
    )?;
    reg(
        "pg_attrdef",
        empty(&[
            ("adrelid", DataType::Int32),
            ("adnum", DataType::Int16),
            ("adbin", DataType::Utf8),
        ])?,
    )?;
    register_functions(ctx);
    let cat = ctx
        .catalog("eddy")
        .ok_or_else(|| Error::internal("default catalog missing"))?;
    cat.register_schema("pg_catalog", schema)
        .map_err(datafusion_error)?;
    Ok(())
}

/// `current_database()`, `pg_get_expr(…)` and `has_table_privilege(…)` as drivers call them.
fn register_functions(ctx: &SessionContext) {
    let constant = |value: Option<String>| {
        Arc::new(move |_: &[ColumnarValue]| {
            Ok(ColumnarValue::Scalar(ScalarValue::Utf8(value.clone())))
        })
    };
    ctx.register_udf(create_udf(
        "current_database",
        vec![],
        DataType::Utf8,
        Volatility::Immutable,
        constant(Some("eddy".to_string())),
    ));
    ctx.register_udf(create_udf(
        "pg_get_expr",
        vec![DataType::Utf8, DataType::Int32],
        DataType::Utf8,
        Volatility::Immutable,
        constant(None),
    ));
    ctx.register_udf(create_udf(
        "has_table_privilege",
        vec![DataType::Int32, DataType::Utf8],
        DataType::Boolean,
        Volatility::Immutable,
        Arc::new(|_: &[ColumnarValue]| Ok(ColumnarValue::Scalar(ScalarValue::Boolean(Some(true))))),
    ));
}

/// Rewrites PostgreSQL-only spellings in drivers' catalog queries into what DataFusion
/// reads: `'pg_class'::regclass` becomes the constant oid, `OPERATOR(pg_catalog.~)` the
/// plain operator.
pub fn rewrite(sql: &str) -> String {
    if !sql.contains("pg_catalog") {
        return sql.to_string();
    }
    sql.replace("'pg_class'::regclass", "1259")
        .replace("OPERATOR(pg_catalog.~)", "~")
        .replace("OPERATOR(pg_catalog.=)", "=")
        .replace("::regclass", "")
        .replace("pg_catalog.pg_get_expr(", "pg_get_expr(")
        .replace("::regproc", "")
}
