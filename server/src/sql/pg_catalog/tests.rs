use std::sync::Arc;

use datafusion::prelude::{SessionConfig, SessionContext};

use eddy_planner::catalog::Catalog;
use eddy_planner::sql::{parse_statement, split_statements};

use super::*;
use crate::sql::query;

fn context() -> SessionContext {
    let mut catalog = Catalog::default();
    for sql in [
        "CREATE STREAM payments (card TEXT NOT NULL, amount DOUBLE PRECISION, ts TIMESTAMP NOT NULL) \
         WITH (event_time = 'ts', partition_by = 'card', partitions = 4, lateness = '5 seconds')",
        "CREATE METRIC spend AS SELECT card, SUM(amount) AS total, COUNT(*) AS n FROM payments \
         WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card",
    ] {
        let stmt = parse_statement(sql).unwrap();
        catalog = eddy_planner::ddl::apply(&catalog, &stmt).unwrap().0;
    }
    let config = SessionConfig::new()
        .with_default_catalog_and_schema("eddy", "public")
        .set_str("datafusion.sql_parser.dialect", "PostgreSQL");
    let config = configure(config, Arc::new(Snapshot::of(&catalog).unwrap()));
    let ctx = session(config);
    register(&ctx).unwrap();
    ctx
}

async fn rows(ctx: &SessionContext, sql: &str) -> Vec<Vec<Option<String>>> {
    let (_, rows) = query::run(ctx, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}\n→ {e:?}"));
    rows.iter()
        .map(|r| r.iter().map(|c| c.to_text()).collect())
        .collect()
}

fn strings(row: &[&str]) -> Vec<Option<String>> {
    row.iter().map(|s| Some(s.to_string())).collect()
}

/// Plans and runs every statement of `script` (at least `min` of them).
async fn every_query_runs(ctx: &SessionContext, script: &str, min: usize) {
    let queries = split_statements(script).unwrap();
    assert!(queries.len() > min, "{}", queries.len());
    let mut failed = Vec::new();
    for sql in queries {
        if let Err(e) = query::run(ctx, &sql).await {
            failed.push(format!("{sql}\n→ {e:?}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

#[tokio::test]
async fn every_query_psql_sends_to_describe_plans_and_runs() {
    every_query_runs(&context(), include_str!("psql-queries.sql"), 20).await;
}

#[tokio::test]
async fn every_query_dbeaver_sends_to_browse_plans_and_runs() {
    let ctx = context();
    every_query_runs(&ctx, include_str!("dbeaver-queries.sql"), 10).await;
    // Two columns named oid, as in PostgreSQL; the niladic functions answer.
    let (columns, _) = query::run(&ctx, "SELECT n.oid, n.* FROM pg_catalog.pg_namespace n")
        .await
        .unwrap();
    assert_eq!(columns.iter().filter(|c| c.name == "oid").count(), 2);
    assert_eq!(
        rows(&ctx, "SELECT session_user, current_user").await,
        vec![strings(&["eddy", "eddy"])]
    );
}

/// `information_schema` as PostgreSQL fills it: SQL type names, positions from 1, a
/// stream a base table and a metric a view (DataFusion's own said `Utf8`, counted from 0
/// and listed every table among the views).
#[tokio::test]
async fn information_schema_speaks_postgresql() {
    let ctx = context();
    assert_eq!(
        rows(
            &ctx,
            "SELECT column_name, ordinal_position, is_nullable, data_type, udt_name \
             FROM information_schema.columns WHERE table_name = 'payments' \
             ORDER BY ordinal_position"
        )
        .await,
        vec![
            strings(&["card", "1", "NO", "text", "text"]),
            strings(&["amount", "2", "YES", "double precision", "float8"]),
            strings(&["ts", "3", "NO", "timestamp without time zone", "timestamp"]),
        ]
    );
    assert_eq!(
        rows(
            &ctx,
            "SELECT table_name, table_type FROM information_schema.tables ORDER BY table_name"
        )
        .await,
        vec![
            strings(&["payments", "BASE TABLE"]),
            strings(&["spend", "VIEW"])
        ]
    );
    assert_eq!(
        rows(&ctx, "SELECT table_name FROM information_schema.views").await,
        vec![strings(&["spend"])]
    );
}

#[tokio::test]
async fn streams_are_tables_and_metrics_views_with_their_columns() {
    let ctx = context();
    let list = "SELECT n.nspname, c.relname, c.relkind, pg_catalog.pg_get_userbyid(c.relowner) \
        FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
        WHERE pg_catalog.pg_table_is_visible(c.oid) ORDER BY 1, 2";
    assert_eq!(
        rows(&ctx, list).await,
        vec![
            strings(&["public", "payments", "r", "eddy"]),
            strings(&["public", "spend", "v", "eddy"]),
        ]
    );
    let columns =
        "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull \
        FROM pg_catalog.pg_attribute a WHERE a.attrelid = 'payments'::regclass AND a.attnum > 0 \
        ORDER BY a.attnum";
    assert_eq!(
        rows(&ctx, columns).await,
        vec![
            strings(&["card", "text", "t"]),
            strings(&["amount", "double precision", "f"]),
            strings(&["ts", "timestamp without time zone", "t"]),
        ]
    );
    let view = "SELECT attname, format_type(atttypid, NULL) FROM pg_attribute \
        WHERE attrelid = 'public.spend'::pg_catalog.regclass ORDER BY attnum";
    assert_eq!(
        rows(&ctx, view).await,
        vec![
            strings(&["card", "text"]),
            strings(&["total", "double precision"]),
            strings(&["n", "bigint"]),
        ]
    );
}

#[tokio::test]
async fn a_metric_shows_its_definition_and_a_stream_its_options() {
    let ctx = context();
    assert_eq!(
        rows(
            &ctx,
            "SELECT pg_catalog.pg_get_viewdef('spend'::regclass::oid, true)"
        )
        .await,
        vec![strings(&[
            "SELECT card, SUM(amount) AS total, COUNT(*) AS n FROM payments \
             WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card"
        ])]
    );
    assert_eq!(
        rows(
            &ctx,
            "SELECT pg_catalog.array_to_string(c.reloptions, ', ') FROM pg_catalog.pg_class c \
             WHERE c.relname OPERATOR(pg_catalog.~) '^(payments)$' COLLATE pg_catalog.default"
        )
        .await,
        vec![strings(&[
            "event_time=ts, partition_by=card, partitions=4, lateness=5 seconds, retention=1 week"
        ])]
    );
    assert_eq!(
        rows(
            &ctx,
            "SELECT c.oid::pg_catalog.regclass::pg_catalog.text FROM pg_class c ORDER BY 1"
        )
        .await,
        vec![strings(&["payments"]), strings(&["spend"])]
    );
}

#[tokio::test]
async fn an_unknown_relation_is_refused_like_postgresql() {
    let ctx = context();
    let e = query::run(&ctx, "SELECT 'nope'::regclass")
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("relation \"nope\" does not exist"),
        "{e}"
    );
}
