//! PostgreSQL's system catalogs, so that psql's `\d` family, pgjdbc's `DatabaseMetaData`
//! and GUI tools see streams as tables and metrics as views.
//!
//! Three parts. [`tables`] builds `pg_catalog.pg_class`, `pg_attribute`, `pg_type`, … from
//! a catalog snapshot. [`functions`] serves the functions their queries call
//! (`format_type`, `pg_get_viewdef`, `pg_table_is_visible`, …). [`rewrite`] turns
//! PostgreSQL-only syntax in a parsed statement (`::regclass`, `OPERATOR(pg_catalog.~)`,
//! `COLLATE`, `ARRAY(SELECT …)`) into forms DataFusion plans; DataFusion then plans and
//! runs the query like any other.
//!
//! Invariant: built from the catalog snapshot of the query context, never stored.

/// Debug, equality and hashing by `name` alone, for the function types whose other
/// fields (closures, function pointers) cannot be compared.
macro_rules! identified_by_name {
    ($t:ty) => {
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name)
            }
        }

        impl PartialEq for $t {
            fn eq(&self, other: &Self) -> bool {
                self.name == other.name
            }
        }

        impl Eq for $t {}

        impl std::hash::Hash for $t {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                std::hash::Hash::hash(&self.name, state)
            }
        }
    };
}

mod arith;
mod correlated;
mod datetime;
mod functions;
mod json;

pub use json::pg_type as column_type;
mod names;
mod numeric;
mod ordered_set;
mod rewrite;
pub(crate) use rewrite::DUPLICATE_MARK;
mod tables;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::{SessionConfig, SessionContext};

use eddy_planner::catalog::{Catalog, EventTimeUnit, StreamDef};
use eddy_planner::types::format_duration_us;
use eddy_planner::{Error, Result};

use crate::session::cells::pg_type;

const NAMESPACE_PG_CATALOG: i32 = 11;
const NAMESPACE_PUBLIC: i32 = 2200;
const NAMESPACE_INFORMATION_SCHEMA: i32 = 13_000;
/// The one role until roles exist: the bootstrap superuser's oid in PostgreSQL.
const ROLE_OID: i32 = 10;
const ROLE_NAME: &str = "eddy";
/// The oid of the first role of the catalog's own (`CREATE ROLE`), in name order.
const ROLE_OID_BASE: i32 = 1_000_000_000;
const DATABASE_OID: i32 = 16_383;
const OID_BASE: i32 = 16_384;
/// The oids PostgreSQL gives its own catalogs, for `'pg_class'::regclass` and friends.
const SYSTEM_RELATIONS: [(&str, i32); 8] = [
    ("pg_type", 1247),
    ("pg_attribute", 1249),
    ("pg_proc", 1255),
    ("pg_class", 1259),
    ("pg_database", 1262),
    ("pg_constraint", 2606),
    ("pg_description", 2609),
    ("pg_namespace", 2615),
];

/// A built-in type as `pg_type` and `format_type` show it.
pub(crate) struct PgType {
    pub oid: i32,
    pub name: &'static str,
    /// What `format_type` prints.
    pub display: &'static str,
    pub len: i16,
    /// The array type's oid, or the element type's for an array.
    pub array: i32,
    pub elem: i32,
    pub collatable: bool,
}

const fn ty(
    oid: i32,
    name: &'static str,
    display: &'static str,
    len: i16,
    array: i32,
    collatable: bool,
) -> PgType {
    PgType {
        oid,
        name,
        display,
        len,
        array,
        elem: 0,
        collatable,
    }
}

const fn array_of(oid: i32, name: &'static str, display: &'static str, elem: i32) -> PgType {
    PgType {
        oid,
        name,
        display,
        len: -1,
        array: 0,
        elem,
        collatable: false,
    }
}

pub(crate) const TYPES: [PgType; 25] = [
    ty(16, "bool", "boolean", 1, 1000, false),
    ty(17, "bytea", "bytea", -1, 1001, false),
    ty(18, "char", "\"char\"", 1, 1002, false),
    ty(19, "name", "name", 64, 1003, true),
    ty(20, "int8", "bigint", 8, 1016, false),
    ty(21, "int2", "smallint", 2, 1005, false),
    ty(23, "int4", "integer", 4, 1007, false),
    ty(25, "text", "text", -1, 1009, true),
    ty(26, "oid", "oid", 4, 1028, false),
    ty(700, "float4", "real", 4, 1021, false),
    ty(701, "float8", "double precision", 8, 1022, false),
    ty(1043, "varchar", "character varying", -1, 1015, true),
    ty(1082, "date", "date", 4, 1182, false),
    ty(1083, "time", "time without time zone", 8, 1183, false),
    ty(
        1114,
        "timestamp",
        "timestamp without time zone",
        8,
        1115,
        false,
    ),
    ty(
        1184,
        "timestamptz",
        "timestamp with time zone",
        8,
        1185,
        false,
    ),
    ty(1186, "interval", "interval", 16, 1187, false),
    ty(1700, "numeric", "numeric", -1, 1231, false),
    array_of(1000, "_bool", "boolean[]", 16),
    array_of(1005, "_int2", "smallint[]", 21),
    array_of(1007, "_int4", "integer[]", 23),
    array_of(1009, "_text", "text[]", 25),
    array_of(1016, "_int8", "bigint[]", 20),
    array_of(1022, "_float8", "double precision[]", 701),
    array_of(1115, "_timestamp", "timestamp without time zone[]", 1114),
];

/// The collation of collatable types (`pg_collation`'s "default").
const DEFAULT_COLLATION: i32 = 100;

/// One stream or metric as a relation.
pub(crate) struct Relation {
    pub oid: i32,
    pub name: String,
    /// `r` for a stream (a table), `v` for a metric (a view).
    pub kind: &'static str,
    pub columns: Vec<Attribute>,
    /// A stream's WITH options as `name=value` (`\d+` prints them).
    pub options: Option<Vec<String>>,
    /// A metric's defining SELECT, as `pg_get_viewdef` returns it.
    pub definition: Option<String>,
}

pub(crate) struct Attribute {
    pub name: String,
    pub type_oid: i32,
    pub not_null: bool,
}

/// What the catalog tables and functions of one query context show.
pub struct Snapshot {
    pub(crate) relations: Vec<Relation>,
    /// The `pg_catalog` tables by name.
    pub(crate) tables: BTreeMap<&'static str, Arc<MemTable>>,
    /// Those of them that hold no rows.
    pub(crate) empty_tables: HashSet<&'static str>,
    /// Roles, owners and grants, for the privilege functions and owners' names.
    pub(crate) access: eddy_planner::access::Access,
}

impl eddy_planner::access::Objects for Snapshot {
    fn is_stream(&self, name: &str) -> bool {
        self.relations
            .iter()
            .any(|r| r.name == name && r.kind == "r")
    }

    fn is_metric(&self, name: &str) -> bool {
        self.relations
            .iter()
            .any(|r| r.name == name && r.kind == "v")
    }
}

impl Snapshot {
    /// Streams and metrics of `catalog`, numbered in creation order.
    pub fn of(catalog: &Catalog) -> Result<Snapshot> {
        let mut relations = Vec::new();
        for (i, name) in catalog.order.iter().enumerate() {
            let oid = OID_BASE + i as i32;
            let relation = if let Some(s) = catalog.stream(name) {
                Relation {
                    oid,
                    name: name.clone(),
                    kind: "r",
                    columns: s
                        .columns
                        .iter()
                        .map(|c| Attribute {
                            name: c.name.clone(),
                            type_oid: pg_type(eddy_planner::aggregate::ResultType::Column(c.ty))
                                .oid() as i32,
                            not_null: c.not_null,
                        })
                        .collect(),
                    options: Some(stream_options(s)),
                    definition: None,
                }
            } else if let Some(m) = catalog.metric(name) {
                let stream = catalog
                    .stream(&m.stream)
                    .ok_or_else(|| Error::internal("metric without stream"))?;
                Relation {
                    oid,
                    name: name.clone(),
                    kind: "v",
                    columns: m
                        .columns(stream)
                        .into_iter()
                        .map(|(n, t)| Attribute {
                            name: n,
                            type_oid: pg_type(t).oid() as i32,
                            not_null: false,
                        })
                        .collect(),
                    options: None,
                    definition: eddy_planner::sql::metric_definition(&m.sql),
                }
            } else {
                continue;
            };
            relations.push(relation);
        }
        let mut tables = BTreeMap::new();
        let mut empty_tables = HashSet::new();
        for (name, rows, table) in tables::build(&relations, &catalog.access)? {
            if rows == 0 {
                empty_tables.insert(name);
            }
            tables.insert(name, table);
        }
        Ok(Snapshot {
            relations,
            tables,
            empty_tables,
            access: catalog.access.clone(),
        })
    }

    /// A role's oid in `pg_roles` (the superuser's, then the catalog's roles in order).
    pub(crate) fn role_oid(access: &eddy_planner::access::Access, role: &str) -> i32 {
        access
            .roles
            .keys()
            .position(|r| r == role)
            .map_or(ROLE_OID, |i| ROLE_OID_BASE + i as i32)
    }

    /// The name of the role with `oid`.
    pub(crate) fn role_name(&self, oid: i32) -> Option<&str> {
        if oid == ROLE_OID {
            return Some(ROLE_NAME);
        }
        let i = usize::try_from(oid.checked_sub(ROLE_OID_BASE)?).ok()?;
        self.access.roles.keys().nth(i).map(String::as_str)
    }

    /// The owner's oid of a stream or metric.
    pub(crate) fn owner_oid(access: &eddy_planner::access::Access, object: &str) -> i32 {
        access
            .owners
            .get(object)
            .map_or(ROLE_OID, |o| Snapshot::role_oid(access, o))
    }

    pub(crate) fn relation(&self, oid: i32) -> Option<&Relation> {
        self.relations.iter().find(|r| r.oid == oid)
    }

    /// The oid of a relation named as `'name'::regclass` reads it: optionally
    /// schema-qualified, unquoted parts case-folded.
    pub(crate) fn regclass(&self, text: &str) -> Option<i32> {
        let parts: Vec<String> = text
            .split('.')
            .map(
                |p| match p.strip_prefix('"').and_then(|p| p.strip_suffix('"')) {
                    Some(quoted) => quoted.to_string(),
                    None => p.to_lowercase(),
                },
            )
            .collect();
        let (schema, name) = match parts.as_slice() {
            [name] => (None, name.as_str()),
            [schema, name] => (Some(schema.as_str()), name.as_str()),
            _ => return None,
        };
        let user = self
            .relations
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.oid)
            .filter(|_| matches!(schema, None | Some("public")));
        let system = SYSTEM_RELATIONS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, oid)| *oid)
            .filter(|_| matches!(schema, None | Some("pg_catalog")));
        user.or(system)
    }

    /// A relation's name for `oid::regclass` output: the oid itself if unknown, as
    /// PostgreSQL prints it.
    pub(crate) fn regclass_name(&self, oid: i32) -> String {
        self.relation(oid)
            .map(|r| r.name.clone())
            .or_else(|| {
                SYSTEM_RELATIONS
                    .iter()
                    .find(|(_, o)| *o == oid)
                    .map(|(n, _)| n.to_string())
            })
            .unwrap_or_else(|| oid.to_string())
    }
}

/// A stream's WITH options in `name=value` form, as `pg_class.reloptions` holds them.
fn stream_options(s: &StreamDef) -> Vec<String> {
    let mut out = vec![format!("event_time={}", s.columns[s.event_time].name)];
    if s.event_time_unit == EventTimeUnit::Millis {
        out.push("event_time_unit=ms".to_string());
    }
    if let Some(id) = s.event_id {
        out.push(format!("event_id={}", s.columns[id].name));
    }
    if !s.partitioners.is_empty() {
        let names: Vec<&str> = s
            .partitioners
            .iter()
            .map(|i| s.columns[*i].name.as_str())
            .collect();
        out.push(format!("partition_by={}", names.join(",")));
    }
    out.push(format!("partitions={}", s.partitions));
    out.push(format!(
        "lateness={}",
        format_duration_us(s.lateness_us).to_lowercase()
    ));
    out.push(format!(
        "retention={}",
        format_duration_us(s.retention_us).to_lowercase()
    ));
    if let Some(source) = &s.source {
        out.push(format!("kafka_topic={}", source.topic));
        out.push("format=json".to_string());
    }
    out
}

/// The context's configuration with `snapshot` attached, so that [`plan`] can rewrite.
pub fn configure(config: SessionConfig, snapshot: Arc<Snapshot>) -> SessionConfig {
    config.with_extension(snapshot)
}

/// A session over `config` whose arithmetic is PostgreSQL's (`arith`).
pub fn session(config: SessionConfig) -> SessionContext {
    use datafusion::execution::SessionStateBuilder;
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .build();
    let rules = arith::analyzer_rules(&state.analyzer().rules);
    let state = SessionStateBuilder::new_from_existing(state)
        .with_analyzer_rules(rules)
        .build();
    let ctx = SessionContext::new_with_state(state);
    // `to_timestamp(seconds)` is that instant, whatever the session's time zone:
    // DataFusion's, in a zone, reads the seconds as local time there.
    let mut utc = datafusion::common::config::ConfigOptions::default();
    utc.execution.time_zone = Some("UTC".into());
    ctx.register_udf(
        datafusion::functions::datetime::to_timestamp::ToTimestampFunc::new_with_config(&utc)
            .into(),
    );
    ctx
}

/// Registers the `pg_catalog` schema's tables and the catalog functions of the
/// snapshot attached by [`configure`].
pub fn register(ctx: &SessionContext) -> Result<()> {
    let snapshot = snapshot(ctx)?;
    tables::register(ctx, &snapshot)?;
    functions::register(ctx, snapshot);
    json::register(ctx).map_err(|e| Error::internal(e.to_string()))?;
    ordered_set::register(ctx);
    numeric::register(ctx).map_err(|e| Error::internal(e.to_string()))
}

fn snapshot(ctx: &SessionContext) -> Result<Arc<Snapshot>> {
    ctx.state_ref()
        .read()
        .config()
        .get_extension::<Snapshot>()
        .ok_or_else(|| Error::internal("catalog snapshot missing"))
}

/// Parses `sql` as PostgreSQL, rewrites what only PostgreSQL reads, and plans it.
pub async fn plan(
    ctx: &SessionContext,
    sql: &str,
) -> std::result::Result<LogicalPlan, DataFusionError> {
    let state = ctx.state();
    let dialect = state.config_options().sql_parser.dialect;
    let mut statement = state.sql_to_statement(sql, &dialect)?;
    if let Some(snapshot) = state.config().get_extension::<Snapshot>() {
        names::name_result_columns(&mut statement);
        rewrite::statement(&mut statement, &snapshot, &state)?;
        numeric::literals(&mut statement);
    }
    state.statement_to_plan(statement).await
}

#[cfg(test)]
mod tests;
