//! The names PostgreSQL gives a query's unaliased result columns (its `FigureColname`):
//! a column keeps its name, a function call takes the function's (`extract`,
//! `substring`, `btrim`), a cast of anything else the type's (`'42'::int` is `int4`),
//! an unnamed CASE `case`; anything (`true` included, as in PostgreSQL 15) else is `?column?` (an operator too,
//! though DataFusion plans `2 ^ 10` as `power`).
//!
//! They are given before planning, as aliases that end in `DUPLICATE_MARK` and the
//! item's position: unique, so two columns may share a name as in PostgreSQL, and no
//! ORDER BY or GROUP BY name resolves to them (`query::pg_column_name` cuts the mark).

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    AccessExpr, DataType, Expr, Ident, Query, SelectItem, SetExpr, Statement, TrimWhereField,
};
use eddy_planner::sql::normalize_ident;

use super::rewrite::parts;
use super::DUPLICATE_MARK;

/// Names the unaliased items of the outermost SELECT of `statement` (the first one of
/// a set operation, whose names the result takes).
pub(super) fn name_result_columns(statement: &mut DFStatement) {
    let DFStatement::Statement(s) = statement else {
        return;
    };
    let Statement::Query(query) = s.as_mut() else {
        return;
    };
    let Some(select) = first_select(query) else {
        return;
    };
    for (i, item) in select.iter_mut().enumerate() {
        let SelectItem::UnnamedExpr(e) = item else {
            continue;
        };
        if matches!(e, Expr::Identifier(_) | Expr::CompoundIdentifier(_)) {
            continue;
        }
        let name = figure(e).0.unwrap_or_else(|| "?column?".into());
        *item = SelectItem::ExprWithAlias {
            expr: e.clone(),
            alias: Ident::with_quote('"', format!("{name}{DUPLICATE_MARK}{i}")),
        };
    }
}

fn first_select(query: &mut Query) -> Option<&mut Vec<SelectItem>> {
    let mut body = query.body.as_mut();
    loop {
        body = match body {
            SetExpr::Select(select) => return Some(&mut select.projection),
            SetExpr::SetOperation { left, .. } => left.as_mut(),
            SetExpr::Query(q) => q.body.as_mut(),
            _ => return None,
        };
    }
}

/// An expression's result column name, with PostgreSQL's strength: 2 for a column's or
/// a function's own name, 1 for a type's or `case` (a cast or CASE around a name of
/// strength 2 takes that name instead), 0 for none.
fn figure(e: &Expr) -> (Option<String>, u8) {
    let named = |s: &str| (Some(s.to_string()), 2);
    match e {
        Expr::Identifier(i) => (Some(normalize_ident(i)), 2),
        Expr::CompoundIdentifier(p) => (p.last().map(normalize_ident), 2),
        Expr::Nested(inner) | Expr::Collate { expr: inner, .. } => figure(inner),
        Expr::Function(f) => (parts(&f.name).pop(), 2),
        Expr::Cast {
            expr, data_type, ..
        } => match figure(expr) {
            (Some(name), 2) => (Some(name), 2),
            _ => (Some(type_name(data_type)), 1),
        },
        Expr::TypedString(t) => (Some(type_name(&t.data_type)), 1),
        Expr::Interval(_) => (Some("interval".into()), 1),
        Expr::Case { else_result, .. } => match else_result.as_deref().map(figure) {
            Some((Some(name), 2)) => (Some(name), 2),
            _ => (Some("case".into()), 1),
        },
        Expr::Extract { .. } => named("extract"),
        Expr::Substring { shorthand, .. } => named(match shorthand {
            true => "substr",
            false => "substring",
        }),
        Expr::Trim { trim_where, .. } => named(match trim_where {
            Some(TrimWhereField::Leading) => "ltrim",
            Some(TrimWhereField::Trailing) => "rtrim",
            _ => "btrim",
        }),
        Expr::Position { .. } => named("position"),
        Expr::Overlay { .. } => named("overlay"),
        Expr::Ceil { .. } => named("ceil"),
        Expr::Floor { .. } => named("floor"),
        Expr::AtTimeZone { .. } => named("timezone"),
        Expr::Array(_) => named("array"),
        // A subscript takes its array's name (`(ARRAY[1, 2])[1]` is `array`), a field its own.
        Expr::CompoundFieldAccess { root, access_chain } => match access_chain.last() {
            Some(AccessExpr::Dot(Expr::Identifier(i))) => (Some(normalize_ident(i)), 2),
            _ => figure(root),
        },
        // `NOT EXISTS` is a NOT around it to PostgreSQL, and so has no name.
        Expr::Exists { negated, .. } => match negated {
            false => named("exists"),
            true => (None, 0),
        },
        // A scalar subquery is named after its one column.
        Expr::Subquery(q) => match q.body.as_ref() {
            SetExpr::Select(s) => match s.projection.first() {
                Some(SelectItem::UnnamedExpr(e)) => figure(e),
                Some(SelectItem::ExprWithAlias { alias, .. }) => (Some(normalize_ident(alias)), 2),
                _ => (None, 0),
            },
            _ => (None, 0),
        },
        _ => (None, 0),
    }
}

/// The name PostgreSQL keeps for a type as written in a cast: its internal one
/// (`integer` is `int4`), without schema or modifiers.
fn type_name(ty: &DataType) -> String {
    let text = ty.to_string().to_ascii_lowercase();
    let base = text
        .split('(')
        .next()
        .unwrap_or_default()
        .trim()
        .trim_end_matches("[]")
        .trim();
    match base {
        "int" | "integer" | "int4" => "int4",
        "bigint" | "int8" => "int8",
        "smallint" | "int2" => "int2",
        "boolean" | "bool" => "bool",
        "real" | "float4" => "float4",
        "double precision" | "double" | "float8" | "float" => "float8",
        "numeric" | "decimal" | "dec" => "numeric",
        "varchar" | "character varying" => "varchar",
        "char" | "character" => "bpchar",
        "timestamp" | "timestamp without time zone" => "timestamp",
        "timestamptz" | "timestamp with time zone" => "timestamptz",
        "time" | "time without time zone" => "time",
        "timetz" | "time with time zone" => "timetz",
        other => other.rsplit('.').next().unwrap_or(other),
    }
    .trim_matches('"')
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::parser::DFParser;

    /// The names PostgreSQL 15 gives these select lists' columns (by hand from psql),
    /// `None` where the item keeps DataFusion's own.
    #[test]
    fn unaliased_columns_are_named_as_postgresql_names_them() {
        let sql = "SELECT '42'::int, amount::text, CAST(x AS bigint), (-7)::integer, \
                   true, CASE WHEN a THEN 1 END, CASE WHEN a THEN 1 ELSE b END, \
                   extract(year FROM ts), substring(s from 2 for 3), trim(both ' ' from s), \
                   date_trunc('hour', ts), (SELECT max(v) FROM u), 1 + 2, card, t.card, \
                   'x'::timestamp with time zone, 3 AS named, substr(s, 2), 2 ^ 10 FROM t \
                   UNION ALL SELECT 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, \
                   18, 19";
        let mut statement = DFParser::parse_sql(sql).unwrap().pop_front().unwrap();
        name_result_columns(&mut statement);
        let DFStatement::Statement(s) = &mut statement else {
            panic!()
        };
        let Statement::Query(q) = s.as_mut() else {
            panic!()
        };
        let names: Vec<String> = first_select(q)
            .unwrap()
            .iter()
            .map(|item| match item {
                SelectItem::ExprWithAlias { alias, .. } => alias
                    .value
                    .split(DUPLICATE_MARK)
                    .next()
                    .unwrap()
                    .to_string(),
                other => format!("({other})"),
            })
            .collect();
        assert_eq!(
            names,
            [
                "int4",
                "amount",
                "x",
                "int4",
                // PostgreSQL 15 names a bare `true` as it names an operator.
                "?column?",
                "case",
                "b",
                "extract",
                "substring",
                "btrim",
                "date_trunc",
                "max",
                "?column?",
                "(card)",
                "(t.card)",
                "timestamptz",
                "named",
                "substr",
                "?column?",
            ]
        );
    }
}
