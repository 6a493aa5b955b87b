//! DDL: applies CREATE and DROP to a catalog value and returns the new catalog.
//!
//! Invariant: `apply` never mutates its input; the caller swaps the result in atomically.

use std::sync::Arc;

use crate::access::{AccessStatement, Need, Target};
use crate::bind::{bind_create_metric, bind_create_stream, undefined_stream};
use crate::catalog::{Catalog, ColumnDef, StreamDef};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::Statement;
use crate::types::ColumnType;

/// What a DDL statement did: its command tag and an optional notice for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DdlOutcome {
    pub tag: &'static str,
    pub notice: Option<String>,
    /// Whether the catalog changed (and must be persisted and pushed to the shards).
    pub changed: bool,
}

impl DdlOutcome {
    fn changed(tag: &'static str) -> DdlOutcome {
        DdlOutcome {
            tag,
            notice: None,
            changed: true,
        }
    }

    fn skipped(tag: &'static str, notice: String) -> DdlOutcome {
        DdlOutcome {
            tag,
            notice: Some(notice),
            changed: false,
        }
    }
}

fn exists_error(kind: &str, name: &str) -> Error {
    Error::new(
        ErrorKind::DuplicateObject,
        format!("{kind} \"{name}\" already exists"),
    )
}

fn name_taken(catalog: &Catalog, name: &str) -> Option<&'static str> {
    if catalog.streams.contains_key(name) {
        Some("stream")
    } else if catalog.metrics.contains_key(name) {
        Some("metric")
    } else {
        None
    }
}

/// The catalog `statements` make from an empty one, applied in order.
pub fn catalog_of<S: AsRef<str>>(statements: impl IntoIterator<Item = S>) -> Result<Catalog> {
    statements
        .into_iter()
        .try_fold(Catalog::default(), |catalog, sql| {
            let stmt = crate::sql::parse_statement(sql.as_ref())?;
            Ok(apply(&catalog, &stmt)?.0)
        })
}

pub fn apply(catalog: &Catalog, stmt: &Statement) -> Result<(Catalog, DdlOutcome)> {
    let mut next = catalog.clone();
    let outcome = match stmt {
        Statement::CreateStream { create, sql } => {
            let name = crate::sql::object_name(&create.name);
            if let Some(kind) = name_taken(catalog, &name) {
                if create.if_not_exists {
                    return Ok((
                        next,
                        DdlOutcome::skipped(
                            "CREATE STREAM",
                            format!("{kind} \"{name}\" already exists, skipping"),
                        ),
                    ));
                }
                return Err(exists_error(kind, &name));
            }
            let def = bind_create_stream(create, sql)?;
            next.order.push(def.name.clone());
            next.streams.insert(def.name.clone(), Arc::new(def));
            DdlOutcome::changed("CREATE STREAM")
        }
        Statement::CreateMetric(m) => {
            if let Some(kind) = name_taken(catalog, &m.name) {
                if m.if_not_exists {
                    return Ok((
                        next,
                        DdlOutcome::skipped(
                            "CREATE METRIC",
                            format!("{kind} \"{}\" already exists, skipping", m.name),
                        ),
                    ));
                }
                return Err(exists_error(kind, &m.name));
            }
            let def = bind_create_metric(catalog, m)?;
            next.order.push(def.name.clone());
            next.metrics.insert(def.name.clone(), Arc::new(def));
            DdlOutcome::changed("CREATE METRIC")
        }
        Statement::DropStream {
            name,
            if_exists,
            cascade,
        } => {
            if !catalog.streams.contains_key(name) {
                if *if_exists {
                    return Ok((
                        next,
                        DdlOutcome::skipped(
                            "DROP STREAM",
                            format!("stream \"{name}\" does not exist, skipping"),
                        ),
                    ));
                }
                return Err(undefined_stream(name));
            }
            let dependents: Vec<String> = catalog
                .metrics_of(name)
                .iter()
                .map(|m| m.name.clone())
                .collect();
            if !dependents.is_empty() && !cascade {
                return Err(Error::new(
                    ErrorKind::DependentObjects,
                    format!("cannot drop stream \"{name}\" because other objects depend on it"),
                )
                .with_detail(format!("metrics {} read it", dependents.join(", ")))
                .with_hint("Use DROP STREAM … CASCADE to drop the dependent metrics too."));
            }
            for d in &dependents {
                next.metrics.remove(d);
                next.access.forget(d);
            }
            next.streams.remove(name);
            next.access.forget(name);
            next.order.retain(|n| n != name && !dependents.contains(n));
            DdlOutcome::changed("DROP STREAM")
        }
        Statement::DropMetric { name, if_exists } => {
            if !catalog.metrics.contains_key(name) {
                if *if_exists {
                    return Ok((
                        next,
                        DdlOutcome::skipped(
                            "DROP METRIC",
                            format!("metric \"{name}\" does not exist, skipping"),
                        ),
                    ));
                }
                return Err(Error::new(
                    ErrorKind::UndefinedTable,
                    format!("metric \"{name}\" does not exist"),
                ));
            }
            next.metrics.remove(name);
            next.access.forget(name);
            next.order.retain(|n| n != name);
            DdlOutcome::changed("DROP METRIC")
        }
        Statement::AlterStreamAddColumn { stream, column, ty } => {
            let old = catalog
                .stream(stream)
                .ok_or_else(|| undefined_stream(stream))?;
            next.streams
                .insert(stream.clone(), Arc::new(add_column(old, column, ty)?));
            DdlOutcome::changed("ALTER STREAM")
        }
        Statement::Access(a) => match next.access.apply(catalog, a)? {
            None => DdlOutcome::changed(a.tag()),
            Some(notice) => DdlOutcome::skipped(a.tag(), notice),
        },
        _ => return Err(Error::internal("not a DDL statement")),
    };
    Ok((next, outcome))
}

/// The stream with one more (nullable) column at the end. Its statement is rewritten
/// with the column in the column list, so the catalog file creates it as it is now.
fn add_column(old: &StreamDef, column: &str, ty: &str) -> Result<StreamDef> {
    if old.column_index(column).is_some() {
        return Err(Error::new(
            ErrorKind::DuplicateObject,
            format!(
                "column \"{column}\" of stream \"{}\" already exists",
                old.name
            ),
        ));
    }
    let upper = ty.to_ascii_uppercase();
    if upper.contains("NOT NULL") || upper.contains("DEFAULT") {
        return Err(
            Error::unsupported("an added column cannot be NOT NULL or have a DEFAULT")
                .with_hint("Events stored before the change read the new column as NULL."),
        );
    }
    let parsed = ColumnType::parse(ty).ok_or_else(|| {
        Error::unsupported(format!("type {ty} is not supported"))
            .with_hint("Use BOOLEAN, INTEGER, BIGINT, REAL, DOUBLE PRECISION, TEXT or TIMESTAMP.")
    })?;
    // The column list is the first parenthesis of CREATE STREAM.
    let open = old
        .sql
        .find('(')
        .ok_or_else(|| Error::internal("a stream statement without columns"))?;
    let mut depth = 0;
    let mut quote: Option<char> = None;
    let mut close = None;
    for (i, c) in old.sql.char_indices().skip_while(|(i, _)| *i < open) {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(') => depth += 1,
            (None, ')') => {
                depth -= 1;
                if depth == 0 {
                    close = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    let close = close.ok_or_else(|| Error::internal("a stream statement without columns"))?;
    let quoted = format!("\"{}\"", column.replace('"', "\"\""));
    let mut next = old.clone();
    next.sql = format!(
        "{}, {quoted} {} {}",
        &old.sql[..close],
        parsed.sql_name(),
        &old.sql[close..]
    );
    next.columns.push(ColumnDef {
        name: column.to_string(),
        ty: parsed,
        not_null: false,
        default: None,
    });
    Ok(next)
}

/// What a DDL statement needs of its role, judged from the catalog before it (`before`)
/// and after it (`after`).
pub fn needs(before: &Catalog, after: &Catalog, role: &str, stmt: &Statement) -> Vec<Need> {
    let existing = |name: &str| {
        (before.streams.contains_key(name) || before.metrics.contains_key(name))
            .then(|| Need::Own(name.to_string()))
    };
    match stmt {
        Statement::CreateStream { .. } => Vec::new(),
        Statement::CreateMetric(m) => after
            .metric(&m.name)
            .filter(|_| before.metric(&m.name).is_none())
            .map(|def| Need::Own(def.stream.clone()))
            .into_iter()
            .collect(),
        Statement::DropStream { name, .. } | Statement::DropMetric { name, .. } => {
            existing(name).into_iter().collect()
        }
        Statement::AlterStreamAddColumn { stream, .. } => existing(stream).into_iter().collect(),
        Statement::Access(a) => match a {
            AccessStatement::AlterRole { name, options }
                if name == role && options.login.is_none() && options.superuser.is_none() =>
            {
                Vec::new()
            }
            // As in PostgreSQL, a role sets its own session defaults.
            AccessStatement::RoleSetting { role: of, .. } if of == role => Vec::new(),
            AccessStatement::Grant { target, .. } | AccessStatement::Revoke { target, .. } => {
                match target {
                    Target::Stream(n) | Target::Metric(n) => existing(n).into_iter().collect(),
                    _ => vec![Need::Superuser],
                }
            }
            _ => vec![Need::Superuser],
        },
        _ => vec![Need::Superuser],
    }
}
