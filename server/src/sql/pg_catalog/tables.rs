//! The `pg_catalog` tables, built from a catalog snapshot: the columns psql's `\d` family,
//! pgjdbc's `DatabaseMetaData` and GUI tools read, with PostgreSQL's names and meanings.
//! Catalogs of features Eddy does not have (policies, publications, inheritance, rules,
//! extended statistics) exist and hold no rows.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Float32Array, Int16Array, Int32Array, ListBuilder, StringArray,
    StringBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{MemorySchemaProvider, SchemaProvider};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;

use eddy_planner::filter::datafusion_error;
use eddy_planner::{Error, Result};

use super::{
    Relation, Snapshot, DATABASE_OID, DEFAULT_COLLATION, NAMESPACE_INFORMATION_SCHEMA,
    NAMESPACE_PG_CATALOG, NAMESPACE_PUBLIC, ROLE_NAME, ROLE_OID, ROLE_OID_BASE, TYPES,
};

/// The access methods: a stream is stored as `heap` says it is to psql.
const AM_HEAP: i32 = 2;

/// One table under construction, column by column.
struct Table {
    name: &'static str,
    rows: usize,
    fields: Vec<Field>,
    columns: Vec<ArrayRef>,
}

fn text_list_type() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true)))
}

fn small_list_type() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::Int16, true)))
}

fn int_list_type() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::Int32, true)))
}

impl Table {
    fn new(name: &'static str, rows: usize) -> Table {
        Table {
            name,
            rows,
            fields: Vec::new(),
            columns: Vec::new(),
        }
    }

    fn column(mut self, name: &str, array: ArrayRef) -> Table {
        self.fields
            .push(Field::new(name, array.data_type().clone(), true));
        self.columns.push(array);
        self
    }

    fn int(self, name: &str, v: impl IntoIterator<Item = i32>) -> Table {
        self.column(name, Arc::new(Int32Array::from_iter_values(v)))
    }

    fn small(self, name: &str, v: impl IntoIterator<Item = i16>) -> Table {
        self.column(name, Arc::new(Int16Array::from_iter_values(v)))
    }

    fn float(self, name: &str, v: impl IntoIterator<Item = f32>) -> Table {
        self.column(name, Arc::new(Float32Array::from_iter_values(v)))
    }

    fn boolean(self, name: &str, v: impl IntoIterator<Item = bool>) -> Table {
        self.column(
            name,
            Arc::new(v.into_iter().map(Some).collect::<BooleanArray>()),
        )
    }

    fn text<S: AsRef<str>>(self, name: &str, v: impl IntoIterator<Item = S>) -> Table {
        self.column(name, Arc::new(StringArray::from_iter_values(v)))
    }

    fn opt_text<S: AsRef<str>>(self, name: &str, v: impl IntoIterator<Item = Option<S>>) -> Table {
        self.column(name, Arc::new(v.into_iter().collect::<StringArray>()))
    }

    fn opt_int(self, name: &str, v: impl IntoIterator<Item = Option<i32>>) -> Table {
        self.column(name, Arc::new(v.into_iter().collect::<Int32Array>()))
    }

    /// `information_schema`'s first three columns: where each row's relation is.
    fn relation_names<'a>(self, names: impl IntoIterator<Item = &'a str>) -> Table {
        let rows = self.rows;
        self.text("table_catalog", repeat("eddy", rows))
            .text("table_schema", repeat("public", rows))
            .text("table_name", names)
    }

    fn text_list(self, name: &str, v: impl IntoIterator<Item = Option<Vec<String>>>) -> Table {
        let mut b = ListBuilder::new(StringBuilder::new());
        for row in v {
            match row {
                Some(items) => {
                    for item in items {
                        b.values().append_value(item);
                    }
                    b.append(true);
                }
                None => b.append(false),
            }
        }
        self.column(name, Arc::new(b.finish()))
    }

    /// A column of NULLs of `ty`.
    fn nulls(self, name: &str, ty: DataType) -> Table {
        let rows = self.rows;
        self.column(name, datafusion::arrow::array::new_null_array(&ty, rows))
    }

    fn build(self) -> Result<(&'static str, usize, Arc<MemTable>)> {
        let schema = Arc::new(Schema::new(self.fields));
        let batch = RecordBatch::try_new(schema.clone(), self.columns)
            .map_err(|e| Error::internal(format!("pg_catalog.{}: {e}", self.name)))?;
        let table = MemTable::try_new(schema, vec![vec![batch]]).map_err(datafusion_error)?;
        Ok((self.name, self.rows, Arc::new(table)))
    }
}

/// A table that holds no rows, with its columns and types.
fn empty(
    name: &'static str,
    columns: &[(&str, DataType)],
) -> Result<(&'static str, usize, Arc<MemTable>)> {
    columns
        .iter()
        .fold(Table::new(name, 0), |t, (n, ty)| t.nulls(n, ty.clone()))
        .build()
}

fn repeat<T: Clone>(v: T, n: usize) -> std::iter::RepeatN<T> {
    std::iter::repeat_n(v, n)
}

/// Every `pg_catalog` table with its row count.
pub(super) fn build(
    relations: &[Relation],
    access: &eddy_planner::access::Access,
) -> Result<Vec<(&'static str, usize, Arc<MemTable>)>> {
    // The superuser, then the catalog's roles (`\du`).
    let roles: Vec<(i32, &str, bool, bool)> = std::iter::once((ROLE_OID, ROLE_NAME, true, true))
        .chain(access.roles.values().enumerate().map(|(i, r)| {
            (
                ROLE_OID_BASE + i as i32,
                r.name.as_str(),
                r.superuser,
                r.login,
            )
        }))
        .collect();
    let n_roles = roles.len();
    use DataType::{Boolean, Int16, Int32, Utf8};
    let n = relations.len();
    let attributes = attributes(relations);
    let m = attributes.len();
    let type_of = |oid: i32| TYPES.iter().find(|t| t.oid == oid);
    let collation_of = |oid: i32| {
        if type_of(oid).is_some_and(|t| t.collatable) {
            DEFAULT_COLLATION
        } else {
            0
        }
    };
    fn att<'a>((r, i): &(&'a Relation, usize)) -> &'a super::Attribute {
        &r.columns[*i]
    }
    let t = TYPES.len();
    Ok(vec![
        Table::new("pg_namespace", 3)
            .int(
                "oid",
                [
                    NAMESPACE_PG_CATALOG,
                    NAMESPACE_PUBLIC,
                    NAMESPACE_INFORMATION_SCHEMA,
                ],
            )
            .text("nspname", ["pg_catalog", "public", "information_schema"])
            .int("nspowner", repeat(ROLE_OID, 3))
            .nulls("nspacl", text_list_type())
            .build()?,
        Table::new("pg_class", n)
            .int("oid", relations.iter().map(|r| r.oid))
            .text("relname", relations.iter().map(|r| r.name.as_str()))
            .int("relnamespace", repeat(NAMESPACE_PUBLIC, n))
            .int("reltype", repeat(0, n))
            .int("reloftype", repeat(0, n))
            .int(
                "relowner",
                relations
                    .iter()
                    .map(|r| super::Snapshot::owner_oid(access, &r.name)),
            )
            .int(
                "relam",
                relations
                    .iter()
                    .map(|r| if r.kind == "r" { AM_HEAP } else { 0 }),
            )
            .int("relfilenode", repeat(0, n))
            .int("reltablespace", repeat(0, n))
            .int("relpages", repeat(0, n))
            .float("reltuples", repeat(-1.0, n))
            .int("relallvisible", repeat(0, n))
            .int("reltoastrelid", repeat(0, n))
            .boolean("relhasindex", repeat(false, n))
            .boolean("relisshared", repeat(false, n))
            .text("relpersistence", repeat("p", n))
            .text("relkind", relations.iter().map(|r| r.kind))
            .small("relnatts", relations.iter().map(|r| r.columns.len() as i16))
            .small("relchecks", repeat(0, n))
            .boolean("relhasrules", repeat(false, n))
            .boolean("relhastriggers", repeat(false, n))
            .boolean("relhassubclass", repeat(false, n))
            .boolean("relrowsecurity", repeat(false, n))
            .boolean("relforcerowsecurity", repeat(false, n))
            .boolean("relispopulated", repeat(true, n))
            .text("relreplident", repeat("d", n))
            .boolean("relispartition", repeat(false, n))
            .int("relrewrite", repeat(0, n))
            .nulls("relacl", text_list_type())
            .text_list("reloptions", relations.iter().map(|r| r.options.clone()))
            .nulls("relpartbound", Utf8)
            .build()?,
        Table::new("pg_attribute", m)
            .int("attrelid", attributes.iter().map(|(r, _)| r.oid))
            .text("attname", attributes.iter().map(|a| att(a).name.as_str()))
            .int("atttypid", attributes.iter().map(|a| att(a).type_oid))
            .small("attstattarget", repeat(-1, m))
            .small(
                "attlen",
                attributes
                    .iter()
                    .map(|a| type_of(att(a).type_oid).map_or(-1, |t| t.len)),
            )
            .small("attnum", attributes.iter().map(|(_, i)| *i as i16 + 1))
            .small("attndims", repeat(0, m))
            .int("attcacheoff", repeat(-1, m))
            .int("atttypmod", repeat(-1, m))
            .boolean(
                "attbyval",
                attributes
                    .iter()
                    .map(|a| type_of(att(a).type_oid).is_some_and(|t| (1..=8).contains(&t.len))),
            )
            .text(
                "attstorage",
                attributes.iter().map(|a| {
                    if type_of(att(a).type_oid).is_some_and(|t| t.len < 0) {
                        "x"
                    } else {
                        "p"
                    }
                }),
            )
            .text("attcompression", repeat("", m))
            .boolean("attnotnull", attributes.iter().map(|a| att(a).not_null))
            .boolean("atthasdef", repeat(false, m))
            .boolean("atthasmissing", repeat(false, m))
            .text("attidentity", repeat("", m))
            .text("attgenerated", repeat("", m))
            .boolean("attisdropped", repeat(false, m))
            .boolean("attislocal", repeat(true, m))
            .int("attinhcount", repeat(0, m))
            .int(
                "attcollation",
                attributes.iter().map(|a| collation_of(att(a).type_oid)),
            )
            .nulls("attacl", text_list_type())
            .nulls("attoptions", text_list_type())
            .nulls("attfdwoptions", text_list_type())
            .build()?,
        Table::new("pg_type", t)
            .int("oid", TYPES.iter().map(|t| t.oid))
            .text("typname", TYPES.iter().map(|t| t.name))
            .int("typnamespace", repeat(NAMESPACE_PG_CATALOG, t))
            .int("typowner", repeat(ROLE_OID, t))
            .small("typlen", TYPES.iter().map(|t| t.len))
            .boolean("typbyval", TYPES.iter().map(|t| (1..=8).contains(&t.len)))
            .text("typtype", repeat("b", t))
            .text(
                "typcategory",
                TYPES.iter().map(|t| match t.name {
                    _ if t.elem != 0 => "A",
                    "bool" => "B",
                    "int2" | "int4" | "int8" | "float4" | "float8" | "numeric" | "oid" => "N",
                    "date" | "timestamp" | "timestamptz" => "D",
                    _ => "S",
                }),
            )
            .boolean("typisdefined", repeat(true, t))
            .text("typdelim", repeat(",", t))
            .int("typrelid", repeat(0, t))
            .int("typelem", TYPES.iter().map(|t| t.elem))
            .int("typarray", TYPES.iter().map(|t| t.array))
            .text(
                "typinput",
                TYPES.iter().map(|t| {
                    if t.elem != 0 {
                        "array_in".to_string()
                    } else {
                        format!("{}in", t.name)
                    }
                }),
            )
            .boolean("typnotnull", repeat(false, t))
            .int("typbasetype", repeat(0, t))
            .int("typtypmod", repeat(-1, t))
            .int("typndims", repeat(0, t))
            .int(
                "typcollation",
                TYPES
                    .iter()
                    .map(|t| if t.collatable { DEFAULT_COLLATION } else { 0 }),
            )
            .nulls("typdefault", Utf8)
            .build()?,
        Table::new("pg_am", 2)
            .int("oid", [AM_HEAP, 403])
            .text("amname", ["heap", "btree"])
            .text("amtype", ["t", "i"])
            .build()?,
        Table::new("pg_collation", 2)
            .int("oid", [DEFAULT_COLLATION, 950])
            .text("collname", ["default", "C"])
            .int("collnamespace", repeat(NAMESPACE_PG_CATALOG, 2))
            .text("collprovider", ["d", "c"])
            .build()?,
        Table::new("pg_roles", n_roles)
            .int("oid", roles.iter().map(|r| r.0))
            .text("rolname", roles.iter().map(|r| r.1))
            .boolean("rolsuper", roles.iter().map(|r| r.2))
            .boolean("rolinherit", repeat(true, n_roles))
            .boolean("rolcreaterole", roles.iter().map(|r| r.2))
            .boolean("rolcreatedb", roles.iter().map(|r| r.2))
            .boolean("rolcanlogin", roles.iter().map(|r| r.3))
            .boolean("rolreplication", repeat(false, n_roles))
            .int("rolconnlimit", repeat(-1, n_roles))
            .text("rolpassword", repeat("********", n_roles))
            .nulls("rolvaliduntil", Utf8)
            .boolean("rolbypassrls", repeat(false, n_roles))
            .nulls("rolconfig", text_list_type())
            .build()?,
        Table::new("pg_database", 1)
            .int("oid", [DATABASE_OID])
            .text("datname", ["eddy"])
            .int("datdba", [ROLE_OID])
            .int("encoding", [6])
            .text("datlocprovider", ["c"])
            .boolean("datistemplate", [false])
            .boolean("datallowconn", [true])
            .int("datconnlimit", [-1])
            .int("dattablespace", [1663])
            .text("datcollate", ["C.UTF-8"])
            .text("datctype", ["C.UTF-8"])
            .opt_text("daticulocale", [None::<&str>])
            .opt_text("datlocale", [None::<&str>])
            .opt_text("daticurules", [None::<&str>])
            .nulls("datacl", text_list_type())
            .build()?,
        Table::new("pg_tablespace", 2)
            .int("oid", [1663, 1664])
            .text("spcname", ["pg_default", "pg_global"])
            .int("spcowner", repeat(ROLE_OID, 2))
            .build()?,
        empty(
            "pg_description",
            &[
                ("objoid", Int32),
                ("classoid", Int32),
                ("objsubid", Int32),
                ("description", Utf8),
            ],
        )?,
        empty(
            "pg_shdescription",
            &[
                ("objoid", Int32),
                ("classoid", Int32),
                ("description", Utf8),
            ],
        )?,
        empty(
            "pg_enum",
            &[
                ("oid", Int32),
                ("enumtypid", Int32),
                ("enumsortorder", DataType::Float32),
                ("enumlabel", Utf8),
            ],
        )?,
        empty(
            "pg_depend",
            &[
                ("classid", Int32),
                ("objid", Int32),
                ("objsubid", Int32),
                ("refclassid", Int32),
                ("refobjid", Int32),
                ("refobjsubid", Int32),
                ("deptype", Utf8),
            ],
        )?,
        settings()?,
        empty(
            "pg_attrdef",
            &[
                ("oid", Int32),
                ("adrelid", Int32),
                ("adnum", Int16),
                ("adbin", Utf8),
            ],
        )?,
        empty(
            "pg_proc",
            &[
                ("oid", Int32),
                ("proname", Utf8),
                ("pronamespace", Int32),
                ("proowner", Int32),
                ("prokind", Utf8),
                ("prorettype", Int32),
                ("proretset", Boolean),
                ("pronargs", Int16),
                ("prosrc", Utf8),
            ],
        )?,
        empty(
            "pg_index",
            &[
                ("indexrelid", Int32),
                ("indrelid", Int32),
                ("indnatts", Int16),
                ("indnkeyatts", Int16),
                ("indisunique", Boolean),
                ("indisprimary", Boolean),
                ("indisvalid", Boolean),
                ("indisclustered", Boolean),
                ("indkey", small_list_type()),
                ("indoption", small_list_type()),
                ("indexprs", Utf8),
                ("indpred", Utf8),
            ],
        )?,
        empty(
            "pg_constraint",
            &[
                ("oid", Int32),
                ("conname", Utf8),
                ("connamespace", Int32),
                ("contype", Utf8),
                ("conrelid", Int32),
                ("confrelid", Int32),
                ("conkey", small_list_type()),
                ("confkey", small_list_type()),
            ],
        )?,
        empty(
            "pg_trigger",
            &[
                ("oid", Int32),
                ("tgrelid", Int32),
                ("tgname", Utf8),
                ("tgisinternal", Boolean),
            ],
        )?,
        empty(
            "pg_policy",
            &[
                ("oid", Int32),
                ("polname", Utf8),
                ("polrelid", Int32),
                ("polcmd", Utf8),
                ("polpermissive", Boolean),
                ("polroles", int_list_type()),
                ("polqual", Utf8),
                ("polwithcheck", Utf8),
            ],
        )?,
        empty(
            "pg_statistic_ext",
            &[
                ("oid", Int32),
                ("stxrelid", Int32),
                ("stxname", Utf8),
                ("stxnamespace", Int32),
                ("stxowner", Int32),
                ("stxstattarget", Int32),
                ("stxkeys", small_list_type()),
                ("stxkind", text_list_type()),
            ],
        )?,
        empty(
            "pg_publication",
            &[
                ("oid", Int32),
                ("pubname", Utf8),
                ("pubowner", Int32),
                ("puballtables", Boolean),
            ],
        )?,
        empty(
            "pg_publication_namespace",
            &[("oid", Int32), ("pnpubid", Int32), ("pnnspid", Int32)],
        )?,
        empty(
            "pg_publication_rel",
            &[
                ("oid", Int32),
                ("prpubid", Int32),
                ("prrelid", Int32),
                ("prqual", Utf8),
                ("prattrs", small_list_type()),
            ],
        )?,
        empty(
            "pg_inherits",
            &[
                ("inhrelid", Int32),
                ("inhparent", Int32),
                ("inhseqno", Int32),
                ("inhdetachpending", Boolean),
            ],
        )?,
        empty(
            "pg_rewrite",
            &[
                ("oid", Int32),
                ("rulename", Utf8),
                ("ev_class", Int32),
                ("ev_type", Utf8),
                ("is_instead", Boolean),
            ],
        )?,
        empty(
            "pg_auth_members",
            &[
                ("oid", Int32),
                ("roleid", Int32),
                ("member", Int32),
                ("grantor", Int32),
                ("admin_option", Boolean),
            ],
        )?,
        empty(
            "pg_extension",
            &[
                ("oid", Int32),
                ("extname", Utf8),
                ("extowner", Int32),
                ("extversion", Utf8),
            ],
        )?,
    ])
}

/// Registers the snapshot's tables as the `pg_catalog` schema, and the
/// `information_schema` views PostgreSQL clients read.
pub(super) fn register(ctx: &SessionContext, snapshot: &Snapshot) -> Result<()> {
    let catalog = ctx
        .catalog("eddy")
        .ok_or_else(|| Error::internal("default catalog missing"))?;
    let pg_catalog = snapshot.tables.iter().map(|(n, t)| (*n, t.clone()));
    let info = information_schema(&snapshot.relations)?;
    let info = info.into_iter().map(|(n, _, t)| (n, t));
    for (schema_name, tables) in [
        ("pg_catalog", pg_catalog.collect::<Vec<_>>()),
        ("information_schema", info.collect()),
    ] {
        let schema = Arc::new(MemorySchemaProvider::new());
        for (name, table) in tables {
            schema
                .register_table(name.to_string(), table)
                .map_err(datafusion_error)?;
        }
        catalog
            .register_schema(schema_name, schema)
            .map_err(datafusion_error)?;
    }
    Ok(())
}

/// Every column of every relation, as (relation, index).
fn attributes(relations: &[Relation]) -> Vec<(&Relation, usize)> {
    relations
        .iter()
        .flat_map(|r| (0..r.columns.len()).map(move |i| (r, i)))
        .collect()
}

/// `information_schema`'s `YES` or `NO` for whether rows can be inserted: a stream takes
/// them, a metric (a view) does not.
fn writable(r: &Relation) -> &'static str {
    match r.kind {
        "v" => "NO",
        _ => "YES",
    }
}

/// `information_schema`'s `schemata`, `tables`, `views` and `columns` as PostgreSQL
/// fills them: a stream is a `BASE TABLE`, a metric a `VIEW`; a column's `data_type` is
/// its SQL name (`bigint`, `ARRAY` for arrays) and `ordinal_position` counts from 1.
fn information_schema(relations: &[Relation]) -> Result<Vec<(&'static str, usize, Arc<MemTable>)>> {
    let n = relations.len();
    let views: Vec<&Relation> = relations.iter().filter(|r| r.kind == "v").collect();
    let v = views.len();
    let attributes = attributes(relations);
    let m = attributes.len();
    let ty = |(r, i): &(&Relation, usize)| TYPES.iter().find(|t| t.oid == r.columns[*i].type_oid);
    // (precision, radix, scale) of the numeric types, as PostgreSQL reports them.
    let numeric = |a: &(&Relation, usize)| match ty(a).map(|t| t.name) {
        Some("int2") => (Some(16), Some(2), Some(0)),
        Some("int4") => (Some(32), Some(2), Some(0)),
        Some("int8") => (Some(64), Some(2), Some(0)),
        Some("float4") => (Some(24), Some(2), None),
        Some("float8") => (Some(53), Some(2), None),
        Some("numeric") => (None, Some(10), None),
        _ => (None, None, None),
    };
    Ok(vec![
        Table::new("schemata", 3)
            .text("catalog_name", repeat("eddy", 3))
            .text(
                "schema_name",
                ["pg_catalog", "public", "information_schema"],
            )
            .text("schema_owner", repeat(ROLE_NAME, 3))
            .build()?,
        Table::new("tables", n)
            .relation_names(relations.iter().map(|r| r.name.as_str()))
            .text(
                "table_type",
                relations.iter().map(|r| match r.kind {
                    "v" => "VIEW",
                    _ => "BASE TABLE",
                }),
            )
            .text("is_insertable_into", relations.iter().map(writable))
            .build()?,
        Table::new("views", v)
            .relation_names(views.iter().map(|r| r.name.as_str()))
            .opt_text(
                "view_definition",
                views.iter().map(|r| r.definition.as_deref()),
            )
            .text("check_option", repeat("NONE", v))
            .text("is_updatable", repeat("NO", v))
            .text("is_insertable_into", repeat("NO", v))
            .build()?,
        Table::new("columns", m)
            .relation_names(attributes.iter().map(|(r, _)| r.name.as_str()))
            .text(
                "column_name",
                attributes.iter().map(|(r, i)| r.columns[*i].name.as_str()),
            )
            .int(
                "ordinal_position",
                attributes.iter().map(|(_, i)| *i as i32 + 1),
            )
            .nulls("column_default", DataType::Utf8)
            .text(
                "is_nullable",
                attributes
                    .iter()
                    .map(|(r, i)| if r.columns[*i].not_null { "NO" } else { "YES" }),
            )
            .text(
                "data_type",
                attributes.iter().map(|a| match ty(a) {
                    Some(t) if t.elem != 0 => "ARRAY",
                    Some(t) => t.display,
                    None => "USER-DEFINED",
                }),
            )
            .nulls("character_maximum_length", DataType::Int32)
            .opt_int("numeric_precision", attributes.iter().map(|a| numeric(a).0))
            .opt_int(
                "numeric_precision_radix",
                attributes.iter().map(|a| numeric(a).1),
            )
            .opt_int("numeric_scale", attributes.iter().map(|a| numeric(a).2))
            .opt_int(
                "datetime_precision",
                attributes.iter().map(|a| {
                    ty(a)
                        .is_some_and(|t| t.name.starts_with("timestamp"))
                        .then_some(6)
                }),
            )
            .text("udt_catalog", repeat("eddy", m))
            .text("udt_schema", repeat("pg_catalog", m))
            .text(
                "udt_name",
                attributes.iter().map(|a| ty(a).map_or("", |t| t.name)),
            )
            .text(
                "dtd_identifier",
                attributes.iter().map(|(_, i)| (i + 1).to_string()),
            )
            .text("is_updatable", attributes.iter().map(|(r, _)| writable(r)))
            .build()?,
    ])
}

/// `pg_settings`: the settings a client may look up, with the values Eddy runs with.
fn settings() -> Result<(&'static str, usize, Arc<MemTable>)> {
    const SETTINGS: [(&str, &str, &str); 8] = [
        ("client_encoding", "UTF8", "Client Connection Defaults"),
        ("DateStyle", "ISO, MDY", "Client Connection Defaults"),
        ("integer_datetimes", "on", "Preset Options"),
        ("IntervalStyle", "postgres", "Client Connection Defaults"),
        (
            "search_path",
            "\"$user\", public",
            "Client Connection Defaults",
        ),
        ("server_encoding", "UTF8", "Preset Options"),
        ("server_version", "16.6", "Preset Options"),
        (
            "standard_conforming_strings",
            "on",
            "Version and Platform Compatibility",
        ),
    ];
    Table::new("pg_settings", SETTINGS.len())
        .text("name", SETTINGS.map(|s| s.0))
        .text("setting", SETTINGS.map(|s| s.1))
        .opt_text("unit", SETTINGS.map(|_| None::<&str>))
        .text("category", SETTINGS.map(|s| s.2))
        .text("context", SETTINGS.map(|_| "user"))
        .text("vartype", SETTINGS.map(|_| "string"))
        .text("source", SETTINGS.map(|_| "default"))
        .text("boot_val", SETTINGS.map(|s| s.1))
        .text("reset_val", SETTINGS.map(|s| s.1))
        .build()
}
