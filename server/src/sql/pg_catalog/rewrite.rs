//! PostgreSQL-only syntax in a parsed statement, rewritten into what DataFusion plans with
//! the same meaning. Catalog queries from psql, pgjdbc and GUI tools use it freely:
//!
//! - `pg_catalog.f(…)` calls `f`; an unqualified `pg_class` is `pg_catalog.pg_class`
//!   (pg_catalog is always on PostgreSQL's search path).
//! - `'name'::regclass` is the relation's oid (and `'name'::regclass::text` its name);
//!   `oid::regclass` its name, as PostgreSQL prints one; likewise `regtype` and
//!   `regnamespace`. `::oid` is an integer.
//! - `pg_catalog.text`, `name`, `int2[]` are the standard types.
//! - `x COLLATE c` is `x` (Eddy compares text by code point, PostgreSQL's "C").
//! - `OPERATOR(pg_catalog.~)` is `~`.
//! - `ARRAY(SELECT e FROM …)` is `(SELECT array_agg(e) FROM …)`, or
//!   `array_transform(a, x -> e)` over `unnest(a) x`.
//! - `(record).field` is `get_field(record, 'field')`; `information_schema._pg_expandarray`
//!   returns one row per element.
//! - A correlated scalar subquery over catalog tables alone takes the max of its column
//!   (they select one row by key), with outer columns bound by `inner = outer`
//!   substituted into its other conditions, which is what DataFusion decorrelates.
//! - A SELECT that inner-joins a catalog table with no rows returns no rows, so
//!   subqueries in its select list are never evaluated: they become NULL. This is how
//!   queries about features Eddy has none of (policies, publications, inheritance) plan.
//! - Unnamed select items that would repeat a column name get distinct names.
//! - `ceiling`, `sign`, `variance` and `every` are DataFusion's `ceil`, `signum`,
//!   `var_samp` and `bool_and`; `mod(a, b)` is `a % b`.
//! - `generate_series(…)` in a select list is `unnest(generate_series(…))`; in FROM, a
//!   subquery that names its column as PostgreSQL does.
//! - `EXCEPT ALL` and `INTERSECT ALL` count each row's copies (`counted_set_operation`).
//! - `~x` is `-1 - x`.
//! - `FETCH FIRST n ROWS ONLY` is `LIMIT n`; `… WITH TIES` keeps the rows ranked at most
//!   n in the ORDER BY (`fetch_clause`).
//! - The subquery of `x op ANY/ALL (subquery)` gets a name of its own, so its columns
//!   are not taken for the outer query's.
//! - `extract`, `date_part`, `date_trunc` and `TIMESTAMP '…'` go to `datetime`'s
//!   functions and forms where DataFusion's differ.

use std::collections::HashSet;
use std::ops::ControlFlow;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionState;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    self, BinaryOperator, DataType, Expr, FunctionArguments, Ident, ObjectName, ObjectNamePart,
    Query, Select, SelectItem, SetExpr, TableFactor, Value, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use eddy_planner::sql::normalize_ident;
use eddy_planner::ErrorKind;

use super::arith::external;
use super::json;

use super::{
    datetime, numeric, PgType, Snapshot, NAMESPACE_INFORMATION_SCHEMA, NAMESPACE_PG_CATALOG,
    NAMESPACE_PUBLIC, TYPES,
};

/// Rewrites `statement` in place.
pub(super) fn statement(
    statement: &mut DFStatement,
    snapshot: &Snapshot,
    state: &SessionState,
) -> Result<()> {
    let target = match statement {
        DFStatement::Statement(s) => s.as_mut(),
        DFStatement::Explain(e) => match e.statement.as_mut() {
            DFStatement::Statement(s) => s.as_mut(),
            _ => return Ok(()),
        },
        _ => return Ok(()),
    };
    let mut rewriter = Rewriter { snapshot, state };
    match target.visit(&mut Change::Rewrite(&mut rewriter)) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(e) => Err(e),
    }
}

struct Rewriter<'a> {
    snapshot: &'a Snapshot,
    state: &'a SessionState,
}

/// `a EXCEPT ALL b` and `a INTERSECT ALL b` with PostgreSQL's counts: a row n times in
/// `a` and m times in `b` is kept max(n − m, 0) or min(n, m) times. DataFusion plans
/// them as an anti or semi join, which keeps a row's every copy or none. Each side's
/// copies of a row are numbered (`row_number` over all its columns), so the operation
/// without ALL, on rows and numbers, keeps the right copies. Rewritten when both sides
/// are SELECTs that name their columns (no `*`) with distinct names.
fn counted_set_operation(body: &SetExpr) -> Option<Result<SetExpr>> {
    let SetExpr::SetOperation {
        left,
        op: op @ (ast::SetOperator::Except | ast::SetOperator::Intersect),
        set_quantifier: ast::SetQuantifier::All,
        right,
    } = body
    else {
        return None;
    };
    let names = |side: &SetExpr| match side {
        SetExpr::Select(s) => item_names(s),
        _ => None,
    };
    let columns = names(left)?;
    if names(right)?.len() != columns.len() {
        return None;
    }
    let list = columns
        .iter()
        .map(|c| Ident::with_quote('"', c).to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let side = |query: &SetExpr, name: &str| {
        format!(
            "SELECT {list}, row_number() OVER (PARTITION BY {list}) AS {COPY} \
             FROM ({query}) AS {name}({list})"
        )
    };
    let sql = format!(
        "SELECT {list} FROM ({} {op} {}) AS {COPY}_rows",
        side(left, "eddy_left"),
        side(right, "eddy_right")
    );
    Some(parse_query(&sql).map(|q| SetExpr::Query(Box::new(q))))
}

/// The output names of a select list whose items all have one, distinct.
fn item_names(select: &Select) -> Option<Vec<String>> {
    let names: Vec<String> = select
        .projection
        .iter()
        .map(|item| match item {
            SelectItem::ExprWithAlias { alias, .. } => Some(normalize_ident(alias)),
            SelectItem::UnnamedExpr(Expr::Identifier(i)) => Some(normalize_ident(i)),
            SelectItem::UnnamedExpr(Expr::CompoundIdentifier(parts)) => {
                parts.last().map(normalize_ident)
            }
            _ => None,
        })
        .collect::<Option<_>>()?;
    let unique: HashSet<&String> = names.iter().collect();
    (unique.len() == names.len()).then_some(names)
}

/// `FETCH FIRST n ROWS ONLY` is `LIMIT n`. `FETCH FIRST n ROWS WITH TIES` also keeps
/// the rows that tie with the last one in the ORDER BY: the rows whose rank in that
/// order is at most n, over a select list whose items have names (and no OFFSET).
fn fetch_clause(query: &mut Query, fetch: ast::Fetch) -> Result<()> {
    let unsupported =
        |what: &str| DataFusionError::NotImplemented(format!("{what} is not supported"));
    if fetch.percent {
        return Err(unsupported("FETCH … PERCENT"));
    }
    let n = fetch.quantity.unwrap_or_else(|| number(1));
    if !fetch.with_ties {
        match &mut query.limit_clause {
            Some(ast::LimitClause::LimitOffset { limit, .. }) => *limit = Some(n),
            Some(ast::LimitClause::OffsetCommaLimit { .. }) => {
                return Err(unsupported("FETCH with LIMIT offset, count"))
            }
            None => {
                query.limit_clause = Some(ast::LimitClause::LimitOffset {
                    limit: Some(n),
                    offset: None,
                    limit_by: Vec::new(),
                })
            }
        }
        return Ok(());
    }
    let Some(ast::OrderBy {
        kind: ast::OrderByKind::Expressions(order),
        ..
    }) = query.order_by.take()
    else {
        return Err(DataFusionError::Plan(
            "WITH TIES cannot be specified without ORDER BY clause".into(),
        ));
    };
    if query.limit_clause.is_some() {
        return Err(unsupported("OFFSET with FETCH … WITH TIES"));
    }
    let SetExpr::Select(select) = &*query.body else {
        return Err(unsupported("FETCH … WITH TIES over a set operation"));
    };
    let Some(names) = item_names(select) else {
        return Err(unsupported(
            "FETCH … WITH TIES over select items without names",
        ));
    };
    // The window's ORDER BY sees the select list's inputs, not its aliases.
    let order: Vec<String> = order
        .into_iter()
        .map(|mut o| {
            if let Expr::Identifier(i) = &o.expr {
                let alias = normalize_ident(i);
                let aliased = select.projection.iter().find_map(|item| match item {
                    SelectItem::ExprWithAlias { expr, alias: a } if normalize_ident(a) == alias => {
                        Some(expr.clone())
                    }
                    _ => None,
                });
                if let Some(e) = aliased {
                    o.expr = e;
                }
            }
            o.to_string()
        })
        .collect();
    let mut inner = (**select).clone();
    inner.projection.push(SelectItem::ExprWithAlias {
        expr: parse_expr(&format!("rank() OVER (ORDER BY {})", order.join(", ")))?,
        alias: Ident::new(TIES),
    });
    let list = names
        .iter()
        .map(|c| Ident::with_quote('"', c).to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut tied = parse_query(&format!(
        "SELECT {list} FROM ({inner}) AS {TIES}_rows WHERE {TIES} <= {n} ORDER BY {TIES}"
    ))?;
    tied.with = query.with.take();
    *query = tied;
    Ok(())
}

/// `current_setting('name' [, missing_ok])`: the session's value, as a literal passed to
/// the one-argument `current_setting`, which returns it (so the column keeps its name).
/// An unknown name is 42704, or NULL when `missing_ok` is true.
fn current_setting(list: &ast::FunctionArgumentList) -> Option<Result<Expr>> {
    use ast::{FunctionArg::Unnamed, FunctionArgExpr::Expr as Arg};
    let (name, missing_ok) = match list.args.as_slice() {
        [Unnamed(Arg(name))] => (string_literal(name)?, false),
        [Unnamed(Arg(name)), Unnamed(Arg(Expr::Value(v)))] => match &v.value {
            Value::Boolean(ok) => (string_literal(name)?, *ok),
            _ => return None,
        },
        _ => return None,
    };
    let value = match crate::sql::query::session_setting(name) {
        Some(v) => Expr::value(Value::SingleQuotedString(v)),
        None if missing_ok => Expr::value(Value::Null),
        None => {
            return Some(Err(external(
                ErrorKind::UndefinedObject,
                &format!("unrecognized configuration parameter \"{name}\""),
            )))
        }
    };
    Some(Ok(call("current_setting", vec![value])))
}

/// Functions that are window functions only: PostgreSQL refuses them without OVER (42809).
const WINDOW_ONLY: [&str; 11] = [
    "row_number",
    "rank",
    "dense_rank",
    "percent_rank",
    "cume_dist",
    "ntile",
    "lag",
    "lead",
    "first_value",
    "last_value",
    "nth_value",
];

/// The rank `fetch_clause` gives each row in the ORDER BY of `FETCH … WITH TIES`.
const TIES: &str = "eddy_rank";

/// The column that numbers a row's copies in `counted_set_operation`.
const COPY: &str = "eddy_copy";

/// The name `x op ANY/ALL (subquery)` gives its subquery's rows.
const ANY_ROWS: &str = "eddy_any_rows";

fn parse_query(sql: &str) -> Result<Query> {
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_query())
        .map(|q| *q)
        .map_err(|e| DataFusionError::Internal(format!("pg_catalog rewrite: {e}")))
}

fn parse_expr(sql: &str) -> Result<Expr> {
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_expr())
        .map_err(|e| DataFusionError::Internal(format!("pg_catalog rewrite: {e}")))
}

/// The parts of a name, case-folded as PostgreSQL does.
pub(super) fn parts(name: &ObjectName) -> Vec<String> {
    name.0
        .iter()
        .map(|p| match p {
            ObjectNamePart::Identifier(i) => normalize_ident(i),
            other => other.to_string(),
        })
        .collect()
}

/// `pg_catalog.x` as `x`.
fn unqualify(name: &mut ObjectName) {
    if name.0.len() == 2 && parts(name)[0] == "pg_catalog" {
        name.0.remove(0);
    }
}

/// A type name's last part, if it is one of PostgreSQL's own that needs rewriting.
fn pg_type_name(ty: &DataType) -> Option<String> {
    match ty {
        DataType::Regclass => Some("regclass".into()),
        DataType::Custom(name, modifiers) if modifiers.is_empty() => {
            let p = parts(name);
            match p.as_slice() {
                [n] => Some(n.clone()),
                [schema, n] if schema == "pg_catalog" => Some(n.clone()),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The standard type for a PostgreSQL type name, for the ones that are plain types.
fn standard_type(name: &str) -> Option<DataType> {
    Some(match name {
        "text" | "name" | "varchar" | "char" | "bpchar" => DataType::Text,
        "int2" | "smallint" => DataType::SmallInt(None),
        "int4" | "int" | "integer" | "oid" | "xid" | "cid" => DataType::Int(None),
        "int8" | "bigint" => DataType::BigInt(None),
        "bool" | "boolean" => DataType::Boolean,
        "float4" | "real" => DataType::Real,
        "float8" => DataType::DoublePrecision,
        "numeric" => DataType::Numeric(ast::ExactNumberInfo::None),
        "timestamp" => DataType::Timestamp(None, ast::TimezoneInfo::None),
        _ => return None,
    })
}

fn string_literal(e: &Expr) -> Option<&str> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) => Some(s),
            _ => None,
        },
        _ => None,
    }
}

fn number(n: i32) -> Expr {
    Expr::value(Value::Number(n.to_string(), false))
}

/// `what "name" does not exist`, with its SQLSTATE (`arith::external`).
fn undefined(kind: ErrorKind, what: &str, name: &str) -> DataFusionError {
    external(kind, &format!("{what} \"{name}\" does not exist"))
}

impl Rewriter<'_> {
    /// The oid of the relation `'name'::regclass` names.
    fn regclass(&self, name: &str) -> Result<i32> {
        self.snapshot
            .regclass(name)
            .ok_or_else(|| undefined(ErrorKind::UndefinedTable, "relation", name))
    }

    /// The type `'name'::regtype` names.
    fn regtype(name: &str) -> Result<&'static PgType> {
        let bare = name.trim_start_matches("pg_catalog.");
        TYPES
            .iter()
            .find(|t| t.name == bare || t.display == bare)
            .ok_or_else(|| undefined(ErrorKind::UndefinedObject, "type", name))
    }

    /// `expr::type` for PostgreSQL's own types; `None` leaves the cast alone.
    fn cast(&self, expr: &Expr, type_name: &str) -> Result<Option<Expr>> {
        let literal = string_literal(expr);
        Ok(Some(match (type_name, literal) {
            ("regclass", Some(s)) => number(self.regclass(s)?),
            ("regclass", None) => call("regclassout", vec![expr.clone()]),
            ("regtype", Some(s)) => number(Self::regtype(s)?.oid),
            ("regtype", None) => call("format_type", vec![expr.clone(), Expr::value(Value::Null)]),
            ("regnamespace", Some(s)) => number(match s {
                "pg_catalog" => NAMESPACE_PG_CATALOG,
                "public" => NAMESPACE_PUBLIC,
                "information_schema" => NAMESPACE_INFORMATION_SCHEMA,
                other => return Err(undefined(ErrorKind::InvalidSchemaName, "schema", other)),
            }),
            ("regnamespace", None) => call("regnamespaceout", vec![expr.clone()]),
            // Functions are named by text (`pg_type.typinput` holds the name).
            ("regproc" | "regprocedure", Some(s)) => Expr::value(Value::SingleQuotedString(
                s.trim_start_matches("pg_catalog.").into(),
            )),
            ("regproc" | "regprocedure" | "regrole" | "regoper", None) => expr.clone(),
            (other, _) => match standard_type(other) {
                Some(ty) => Expr::Cast {
                    kind: ast::CastKind::Cast,
                    expr: Box::new(expr.clone()),
                    data_type: ty,
                    array: false,
                    format: None,
                },
                None => return Ok(None),
            },
        }))
    }

    fn is_empty_table(&self, factor: &TableFactor) -> bool {
        match factor {
            TableFactor::Table {
                name, args: None, ..
            } => match parts(name).as_slice() {
                [schema, table] if schema == "pg_catalog" => {
                    self.snapshot.empty_tables.contains(table.as_str())
                }
                _ => false,
            },
            _ => false,
        }
    }

    /// Whether `select` returns no rows whatever its select list holds: it inner-joins
    /// an empty catalog table and aggregates nothing.
    fn returns_nothing(&self, select: &Select) -> bool {
        let grouped = match &select.group_by {
            ast::GroupByExpr::Expressions(exprs, _) => !exprs.is_empty(),
            ast::GroupByExpr::All(_) => true,
        };
        if grouped || select.having.is_some() || self.aggregates(&select.projection) {
            return false;
        }
        select.from.iter().any(|from| {
            self.is_empty_table(&from.relation)
                || from.joins.iter().any(|j| {
                    matches!(
                        j.join_operator,
                        ast::JoinOperator::Join(_)
                            | ast::JoinOperator::Inner(_)
                            | ast::JoinOperator::CrossJoin(_)
                    ) && self.is_empty_table(&j.relation)
                })
        })
    }

    /// `[NOT] EXISTS (subquery)` in a select list, which DataFusion plans only as a filter,
    /// as a scalar subquery that counts the rows. A plain SELECT keeps its FROM and WHERE
    /// and counts instead of projecting, so a subquery correlated by equalities is
    /// decorrelated as any scalar subquery is; any other (grouped, DISTINCT, LIMIT, set
    /// operations, aggregates) is counted whole, from a derived table.
    fn exists_as_count(&self, e: &mut Expr) {
        match e {
            Expr::Exists { subquery, negated } => {
                let test = match negated {
                    true => "count(*) = 0",
                    false => "count(*) > 0",
                };
                if let Some(counted) = self.counted(subquery, test) {
                    *e = Expr::Subquery(Box::new(counted));
                }
            }
            Expr::Nested(inner)
            | Expr::UnaryOp { expr: inner, .. }
            | Expr::Cast { expr: inner, .. }
            | Expr::IsNull(inner)
            | Expr::IsNotNull(inner)
            | Expr::IsTrue(inner)
            | Expr::IsFalse(inner)
            | Expr::IsNotTrue(inner)
            | Expr::IsNotFalse(inner) => self.exists_as_count(inner),
            Expr::BinaryOp { left, right, .. } => {
                self.exists_as_count(left);
                self.exists_as_count(right);
            }
            Expr::Case {
                operand,
                conditions,
                else_result,
                ..
            } => {
                for e in operand.iter_mut().chain(else_result.iter_mut()) {
                    self.exists_as_count(e);
                }
                for when in conditions.iter_mut() {
                    self.exists_as_count(&mut when.condition);
                    self.exists_as_count(&mut when.result);
                }
            }
            _ => {}
        }
    }

    /// The SELECT of `query` if it has one row per row its FROM and WHERE give: no
    /// grouping, aggregate, DISTINCT, LIMIT or set operation. Such a query's rows can be
    /// tested where they come from, so that a correlated one stays decorrelatable.
    fn plain<'q>(&self, query: &'q Query) -> Option<&'q Select> {
        let SetExpr::Select(s) = query.body.as_ref() else {
            return None;
        };
        let plain = query.with.is_none()
            && query.limit_clause.is_none()
            && query.fetch.is_none()
            && query.locks.is_empty()
            && s.distinct.is_none()
            && s.top.is_none()
            && matches!(&s.group_by, ast::GroupByExpr::Expressions(by, modifiers)
                if by.is_empty() && modifiers.is_empty())
            && s.having.is_none()
            && s.named_window.is_empty()
            && s.qualify.is_none()
            && !self.aggregates(&s.projection);
        plain.then_some(s.as_ref())
    }

    /// `subquery` as one row holding `test` of its row count (`exists_as_count`).
    fn counted(&self, subquery: &Query, test: &str) -> Option<Query> {
        if self.plain(subquery).is_none() {
            return parse_query(&format!("SELECT {test} FROM ({subquery}) AS eddy_exists")).ok();
        }
        let SetExpr::Select(counting) = *parse_query(&format!("SELECT {test}")).ok()?.body else {
            return None;
        };
        let mut counted = subquery.clone();
        counted.order_by = None;
        if let SetExpr::Select(s) = counted.body.as_mut() {
            s.projection = counting.projection;
        }
        Some(counted)
    }

    /// `(a, b) IN (subquery)` in a WHERE clause, which DataFusion refuses (one column
    /// only), as `EXISTS` of a row of the subquery equal to `(a, b)`, column by column:
    /// tested in the subquery's own FROM and WHERE where it is `plain` (so a correlated
    /// one stays correlated as EXISTS allows), else over its rows as a derived table.
    /// Only where the WHERE reaches it through AND, OR and parentheses: there an unknown
    /// (a NULL compared) filters the row out as false does, so the two agree; under NOT
    /// they would not.
    fn row_in_as_exists(&self, e: &mut Expr) {
        match e {
            Expr::Nested(inner) => return self.row_in_as_exists(inner),
            Expr::BinaryOp {
                left,
                op: BinaryOperator::And | BinaryOperator::Or,
                right,
            } => {
                self.row_in_as_exists(left);
                return self.row_in_as_exists(right);
            }
            _ => {}
        }
        let Expr::InSubquery {
            expr,
            subquery,
            negated: false,
        } = &*e
        else {
            return;
        };
        let Expr::Tuple(row) = expr.as_ref() else {
            return;
        };
        let equal = |columns: Vec<String>| {
            let pairs = row
                .iter()
                .zip(columns)
                .map(|(v, c)| format!("({c}) = ({v})"));
            pairs.collect::<Vec<_>>().join(" AND ")
        };
        // The row is compared inside the subquery's own FROM only when none of its names
        // could be taken for the subquery's (`card` would mean the inner card there).
        let captured = |s: &Select| {
            let inner = inner_names(s);
            row.iter().any(|v| {
                ast::visit_expressions(v, |e| match e {
                    Expr::Identifier(_) => ControlFlow::Break(()),
                    Expr::CompoundIdentifier(p)
                        if p.len() < 2 || inner.contains(&normalize_ident(&p[p.len() - 2])) =>
                    {
                        ControlFlow::Break(())
                    }
                    _ => ControlFlow::Continue(()),
                })
                .is_break()
            })
        };
        // Over the subquery's rows as a derived table, a correlated subquery would lose
        // its outer names: it keeps PostgreSQL's form, and DataFusion's error.
        let correlated = match subquery.body.as_ref() {
            SetExpr::Select(s) => s
                .selection
                .as_ref()
                .is_some_and(|w| references_outer(w, &inner_names(s))),
            _ => false,
        };
        let plain = self.plain(subquery).filter(|s| !captured(s)).and_then(|s| {
            let columns: Option<Vec<String>> = s
                .projection
                .iter()
                .map(|item| match item {
                    SelectItem::UnnamedExpr(c) | SelectItem::ExprWithAlias { expr: c, .. } => {
                        Some(c.to_string())
                    }
                    _ => None,
                })
                .collect();
            let columns = columns.filter(|c| c.len() == row.len())?;
            let from: Vec<String> = s.from.iter().map(|f| f.to_string()).collect();
            let filter = match &s.selection {
                Some(w) => format!("({w}) AND {}", equal(columns)),
                None => equal(columns),
            };
            Some(format!(
                "EXISTS (SELECT 1 FROM {} WHERE {filter})",
                from.join(", ")
            ))
        });
        if plain.is_none() && correlated {
            return;
        }
        let sql = plain.unwrap_or_else(|| {
            let names: Vec<String> = (1..=row.len()).map(|i| format!("eddy_c{i}")).collect();
            let columns = names.iter().map(|n| format!("eddy_in.{n}")).collect();
            format!(
                "EXISTS (SELECT 1 FROM ({subquery}) AS eddy_in ({}) WHERE {})",
                names.join(", "),
                equal(columns)
            )
        });
        if let Ok(exists) = parse_expr(&sql) {
            *e = exists;
        }
    }

    /// Whether any item calls an aggregate or window function (outside subqueries).
    fn aggregates(&self, items: &[SelectItem]) -> bool {
        let mut find = Find::Aggregate {
            state: self.state,
            depth: 0,
        };
        items
            .iter()
            .any(|item| ast::Visit::visit(item, &mut find).is_break())
    }

    /// `ARRAY(SELECT e FROM … [ORDER BY …])` as a scalar subquery aggregating `e`.
    fn array_subquery(&self, query: &Query) -> Result<Expr> {
        let select = match query.body.as_ref() {
            SetExpr::Select(s) if s.projection.len() == 1 => s,
            _ => {
                return Err(DataFusionError::NotImplemented(
                    "ARRAY(subquery) of anything but one column of a plain SELECT".into(),
                ))
            }
        };
        if self.returns_nothing(select) {
            return Ok(call("make_array", vec![]));
        }
        let item = match &select.projection[0] {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e.clone(),
            _ => {
                return Err(DataFusionError::NotImplemented(
                    "ARRAY(SELECT *) is not supported".into(),
                ))
            }
        };
        if let Some(mapped) = array_map(select, &item) {
            return Ok(mapped);
        }
        let order = match &query.order_by {
            Some(ast::OrderBy {
                kind: ast::OrderByKind::Expressions(exprs),
                ..
            }) if !exprs.is_empty() => {
                let keys: Vec<String> = exprs
                    .iter()
                    .map(|o| {
                        let key = match &o.expr {
                            Expr::Value(v) if matches!(&v.value, Value::Number(n, _) if n == "1") => {
                                item.clone()
                            }
                            e => e.clone(),
                        };
                        format!("{key}{}", o.options)
                    })
                    .collect();
                format!(" ORDER BY {}", keys.join(", "))
            }
            _ => String::new(),
        };
        let mut inner = query.clone();
        inner.order_by = None;
        if let SetExpr::Select(s) = inner.body.as_mut() {
            s.projection = vec![SelectItem::UnnamedExpr(parse_expr(&format!(
                "array_agg({item}{order})"
            ))?)];
        }
        Ok(Expr::Subquery(Box::new(inner)))
    }

    /// A scalar subquery that returns no rows is NULL. One over catalog tables alone
    /// that does not aggregate takes the max of its one column: catalog queries select
    /// at most one row by key, which DataFusion cannot know when they are correlated.
    fn scalar_subquery(&self, query: &mut Query) -> Option<Result<Expr>> {
        let SetExpr::Select(select) = query.body.as_mut() else {
            return None;
        };
        if self.returns_nothing(select) {
            return Some(Ok(Expr::value(Value::Null)));
        }
        let grouped =
            !matches!(&select.group_by, ast::GroupByExpr::Expressions(e, _) if e.is_empty());
        let catalog_only = !select.from.is_empty()
            && select.from.iter().all(|f| {
                std::iter::once(&f.relation)
                    .chain(f.joins.iter().map(|j| &j.relation))
                    .all(|t| self.is_catalog_table(t))
            });
        if grouped || !catalog_only || self.aggregates(&select.projection) {
            return None;
        }
        // DataFusion decorrelates `inner = outer` conditions only; in the others, an
        // outer column equated to an inner expression is replaced by that expression.
        let inner = inner_names(select);
        if let Some(w) = select.selection.take() {
            let conditions = conjuncts(w);
            let mut bound = Vec::new();
            for c in &conditions {
                if let Expr::BinaryOp {
                    op: BinaryOperator::Eq,
                    left,
                    right,
                } = c
                {
                    match (
                        references_outer(left, &inner),
                        references_outer(right, &inner),
                    ) {
                        (false, true) if matches!(**right, Expr::CompoundIdentifier(_)) => {
                            bound.push((right.to_string(), left.as_ref().clone()))
                        }
                        (true, false) if matches!(**left, Expr::CompoundIdentifier(_)) => {
                            bound.push((left.to_string(), right.as_ref().clone()))
                        }
                        _ => {}
                    }
                }
            }
            let conditions = conditions.into_iter().map(|mut c| {
                let is_binding = bound.iter().any(|(outer, _)| {
                    matches!(&c, Expr::BinaryOp { op: BinaryOperator::Eq, left, right }
                        if &left.to_string() == outer || &right.to_string() == outer)
                });
                if !is_binding {
                    substitute(&mut c, &bound);
                }
                c
            });
            select.selection = conditions.reduce(|a, b| Expr::BinaryOp {
                left: Box::new(a),
                op: BinaryOperator::And,
                right: Box::new(b),
            });
        }
        if let [SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. }] =
            select.projection.as_mut_slice()
        {
            *e = call("max", vec![e.clone()]);
        }
        None
    }

    fn is_catalog_table(&self, factor: &TableFactor) -> bool {
        match factor {
            TableFactor::Table {
                name, args: None, ..
            } => matches!(parts(name).as_slice(), [schema, table]
                if schema == "pg_catalog" && self.snapshot.tables.contains_key(table.as_str())),
            _ => false,
        }
    }

    fn select(&self, select: &mut Select) {
        using_columns_first(select);
        if let Some(w) = select.selection.as_mut() {
            self.row_in_as_exists(w);
        }
        // A set-returning function in the select list gives one row per element; EXISTS
        // is a value there too.
        for item in select.projection.iter_mut() {
            if let SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } = item {
                unnest_series(e);
                self.exists_as_count(e);
            }
        }
        if self.returns_nothing(select) {
            for (i, item) in select.projection.iter_mut().enumerate() {
                let (expr, alias) = match item {
                    SelectItem::UnnamedExpr(e) => (e, None),
                    SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias.clone())),
                    _ => continue,
                };
                if has_subquery(expr) {
                    *item = SelectItem::ExprWithAlias {
                        expr: Expr::value(Value::Null),
                        alias: alias.unwrap_or_else(|| Ident::new(format!("column{}", i + 1))),
                    };
                }
            }
        }
        // `SELECT n.oid, n.*` names two columns `oid`, as PostgreSQL does. DataFusion
        // takes `n.oid` twice for a clash and refuses a second `oid`, so the first is
        // aliased `oid` ‖ DUPLICATE_MARK ‖ position, which the result's name drops.
        let wildcard = select.projection.iter().any(|item| {
            matches!(
                item,
                SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..)
            )
        });
        let mut seen = HashSet::new();
        for (i, item) in select.projection.iter_mut().enumerate() {
            if let SelectItem::UnnamedExpr(Expr::CompoundIdentifier(parts)) = item {
                let last = parts.last().cloned().filter(|_| wildcard);
                if let Some(name) = last.map(|a| normalize_ident(&a)) {
                    let expr = Expr::CompoundIdentifier(parts.clone());
                    let alias = Ident::with_quote('"', format!("{name}{DUPLICATE_MARK}{i}"));
                    *item = SelectItem::ExprWithAlias { expr, alias };
                }
            }
            let name = match item {
                SelectItem::UnnamedExpr(e) => e.to_string(),
                SelectItem::ExprWithAlias { alias, .. } => normalize_ident(alias),
                _ => continue,
            };
            if !seen.insert(name.clone()) {
                if let SelectItem::UnnamedExpr(e) = item {
                    *item = SelectItem::ExprWithAlias {
                        expr: e.clone(),
                        alias: Ident::new(format!("{name}_{}", i + 1)),
                    };
                }
            }
        }
    }
}

/// Ends a result column's name where the rest only kept it apart from a column of the
/// same name (`query::pg_column_name` cuts it off).
pub(crate) const DUPLICATE_MARK: char = '\u{1f}';

/// Functions SQL calls without parentheses (`SELECT session_user`).
const NILADIC: [&str; 3] = ["session_user", "current_user", "current_role"];

/// PostgreSQL's names of functions DataFusion has under another name.
const RENAMED: [(&str, &str); 5] = [
    ("ceiling", "ceil"),
    ("sign", "signum"),
    ("variance", "var_samp"),
    ("every", "bool_and"),
    // A version 4 UUID, as text: Eddy has no uuid type.
    ("gen_random_uuid", "uuid"),
];

/// An interval literal (`INTERVAL '1 hour'`, or one rewritten into a product already).
fn is_interval(e: &Expr) -> bool {
    match e {
        Expr::Interval(_) => true,
        Expr::Nested(inner) => is_interval(inner),
        Expr::Function(f) => parts(&f.name) == ["interval_mul"],
        _ => false,
    }
}

/// The alias of the table function inside `series_table`'s subquery, which is left as
/// it is.
const SERIES_INNER: &str = "eddy_series_inner";

/// `FROM generate_series(…) [AS a]` with PostgreSQL's column name: the alias (`AS n`
/// names the column `n`; `AS t(x)` names it `x`), else `generate_series`. DataFusion's
/// table function names its column `value`.
fn series_table(factor: &TableFactor) -> Option<Result<TableFactor>> {
    if let TableFactor::UNNEST {
        alias,
        array_exprs,
        with_ordinality: true,
        ..
    } = factor
    {
        return unnest_with_ordinality(alias.as_ref(), array_exprs);
    }
    let TableFactor::Table {
        name,
        args: Some(args),
        alias,
        with_ordinality,
        ..
    } = factor
    else {
        return None;
    };
    if parts(name).last().map(String::as_str) != Some("generate_series")
        || alias.as_ref().is_some_and(|a| a.name.value == SERIES_INNER)
    {
        return None;
    }
    let table = alias
        .as_ref()
        .map_or_else(|| "generate_series".to_string(), |a| a.name.value.clone());
    let column = alias
        .as_ref()
        .and_then(|a| a.columns.first())
        .map_or_else(|| table.clone(), |c| c.name.value.clone());
    let args: Vec<String> = args.args.iter().map(ToString::to_string).collect();
    // WITH ORDINALITY numbers the rows from 1, in the order the series gives them.
    let ordinality = match with_ordinality {
        true => format!(
            ", row_number() OVER () AS {}",
            Ident::with_quote('"', column_name(alias.as_ref(), 1, "ordinality"))
        ),
        false => String::new(),
    };
    let sql = format!(
        "(SELECT value AS {}{ordinality} FROM generate_series({}) AS {SERIES_INNER}) AS {}",
        Ident::with_quote('"', column),
        args.join(", "),
        Ident::with_quote('"', table)
    );
    Some(parse_table_factor(&sql))
}

/// `make_interval(days => 3, hours => 2)`: PostgreSQL's parameters, by name or in
/// order, as all seven positional arguments (the missing ones 0).
fn make_interval(list: &ast::FunctionArgumentList) -> Option<Result<Expr>> {
    use ast::{FunctionArg, FunctionArgExpr::Expr as Arg};
    const NAMES: [&str; 7] = ["years", "months", "weeks", "days", "hours", "mins", "secs"];
    let mut args: Vec<Expr> = vec![number(0); 7];
    for (i, a) in list.args.iter().enumerate() {
        let (at, e) = match a {
            FunctionArg::Unnamed(Arg(e)) => (i, e),
            FunctionArg::Named {
                name, arg: Arg(e), ..
            }
            | FunctionArg::ExprNamed {
                name: Expr::Identifier(name),
                arg: Arg(e),
                ..
            } => {
                let name = normalize_ident(name);
                match NAMES.iter().position(|n| *n == name) {
                    Some(at) => (at, e),
                    None => {
                        return Some(Err(undefined(
                            ErrorKind::UndefinedFunction,
                            "function make_interval with a parameter named",
                            &name,
                        )))
                    }
                }
            }
            _ => return None,
        };
        *args.get_mut(at)? = e.clone();
    }
    Some(Ok(call("make_interval", args)))
}

/// `generate_series(…)` in a select item, alone or inside operators and casts
/// (`generate_series(1, 3) + 10`), as `unnest(generate_series(…))`.
fn unnest_series(e: &mut Expr) {
    match e {
        Expr::Function(f) if parts(&f.name) == ["generate_series"] => {
            *e = call("unnest", vec![e.clone()]);
        }
        Expr::BinaryOp { left, right, .. } => {
            unnest_series(left);
            unnest_series(right);
        }
        Expr::Nested(inner)
        | Expr::Cast { expr: inner, .. }
        | Expr::UnaryOp { expr: inner, .. } => unnest_series(inner),
        _ => {}
    }
}

/// The name an alias gives a table function's `i`-th column, else `default`.
fn column_name(alias: Option<&ast::TableAlias>, i: usize, default: &str) -> String {
    alias
        .and_then(|a| a.columns.get(i))
        .map_or_else(|| default.to_string(), |c| c.name.value.clone())
}

fn parse_table_factor(sql: &str) -> Result<TableFactor> {
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_table_factor())
        .map_err(|e| DataFusionError::Internal(format!("pg_catalog rewrite: {e}")))
}

/// `unnest(a) WITH ORDINALITY`: the elements of one array, numbered from 1.
fn unnest_with_ordinality(
    alias: Option<&ast::TableAlias>,
    arrays: &[Expr],
) -> Option<Result<TableFactor>> {
    let [array] = arrays else {
        return None;
    };
    let table = alias.map_or_else(|| "unnest".to_string(), |a| a.name.value.clone());
    let sql = format!(
        "(SELECT v AS {}, row_number() OVER () AS {} FROM (SELECT unnest({array}) AS v) AS {SERIES_INNER}) AS {}",
        Ident::with_quote('"', column_name(alias, 0, "unnest")),
        Ident::with_quote('"', column_name(alias, 1, "ordinality")),
        Ident::with_quote('"', table)
    );
    Some(parse_table_factor(&sql))
}

/// `date_part` of a field with a fraction of a second keeps the fraction (`datetime`);
/// `date_trunc` takes plural units.
fn datetime_call(name: &[String], list: &ast::FunctionArgumentList) -> Option<Result<Expr>> {
    use ast::{FunctionArg::Unnamed, FunctionArgExpr::Expr as Arg};
    let [Unnamed(Arg(Expr::Value(v))), Unnamed(Arg(x))] = list.args.as_slice() else {
        return None;
    };
    let Value::SingleQuotedString(unit) = &v.value else {
        return None;
    };
    match name {
        [n] if n == "date_trunc" => datetime::trunc_unit(unit).map(|singular| {
            let unit = Expr::value(Value::SingleQuotedString(singular.into()));
            Ok(call("date_trunc", vec![unit, x.clone()]))
        }),
        [n] if n == "date_part" => datetime::Part::named(unit).map(|part| {
            Ok(Expr::Cast {
                kind: ast::CastKind::Cast,
                expr: Box::new(call(part.function(), vec![x.clone()])),
                data_type: DataType::DoublePrecision,
                array: false,
                format: None,
            })
        }),
        _ => None,
    }
}

/// Interval text in a string literal, in DataFusion's unit words
/// (`datetime::interval_units`).
fn interval_units_in(e: &mut Expr) {
    if let Expr::Value(v) = e {
        if let Value::SingleQuotedString(text) = &mut v.value {
            if let Some(units) = datetime::interval_units(text) {
                *text = units;
            }
        }
    }
}

/// A typed literal `T '…'` as the cast `'…'::T`, as PostgreSQL reads it, for the types
/// whose casts are rewritten: json and jsonb and interval here, numeric by
/// `numeric::literals` (so `NUMERIC '1.50'` keeps its scale).
fn typed_literal_cast(e: &Expr) -> Option<Expr> {
    let Expr::TypedString(t) = e else {
        return None;
    };
    matches!(
        t.data_type,
        DataType::JSON
            | DataType::JSONB
            | DataType::Bytea
            | DataType::Interval { .. }
            | DataType::Numeric(_)
            | DataType::Decimal(_)
            | DataType::Dec(_)
    )
    .then(|| Expr::Cast {
        kind: ast::CastKind::Cast,
        expr: Box::new(Expr::Value(t.value.clone())),
        data_type: t.data_type.clone(),
        array: false,
        format: None,
    })
}

/// `to_date(text, pattern)` and `to_timestamp(text, pattern)` read PostgreSQL's
/// patterns (`datetime::read_by_pattern`); DataFusion's read strftime's. A timestamp's
/// text is local time in the session's zone.
fn by_pattern(name: &[String], list: &ast::FunctionArgumentList) -> Option<Result<Expr>> {
    use ast::{FunctionArg::Unnamed, FunctionArgExpr::Expr as Arg};
    let [Unnamed(Arg(text)), Unnamed(Arg(pattern))] = list.args.as_slice() else {
        return None;
    };
    let (text, pattern) = (text.clone(), pattern.clone());
    match name {
        [n] if n == "to_date" => Some(Ok(call("pg_to_date", vec![text, pattern]))),
        [n] if n == "to_timestamp" => {
            let zone = crate::sql::query::with_session_time_zone(|z| z.to_string());
            let zone = Expr::value(Value::SingleQuotedString(zone));
            Some(Ok(Expr::Cast {
                kind: ast::CastKind::Cast,
                expr: Box::new(call("pg_to_timestamp", vec![text, pattern, zone])),
                data_type: DataType::Timestamp(Some(6), ast::TimezoneInfo::WithTimeZone),
                array: false,
                format: None,
            }))
        }
        _ => None,
    }
}

/// A cast to char(n) (`left_chars`): its trailing blanks dropped, since PostgreSQL
/// ignores them in length, comparisons, concatenation and casts to text.
fn bpchar(e: &Expr, n: Option<u64>) -> Expr {
    let blank = Expr::value(Value::SingleQuotedString(" ".into()));
    call("rtrim", vec![left_chars(e, n), blank])
}

/// `e`'s PostgreSQL text, cut to its first `n` characters (`None`: all of it), as a cast
/// to varchar(n) or char(n) cuts it.
fn left_chars(e: &Expr, n: Option<u64>) -> Expr {
    let text = call("pg_text", vec![e.clone()]);
    match n {
        Some(n) => call(
            "left",
            vec![text, Expr::value(Value::Number(n.to_string(), false))],
        ),
        None => text,
    }
}

pub(super) fn call(name: &str, args: Vec<Expr>) -> Expr {
    Expr::Function(ast::Function {
        name: ObjectName::from(vec![Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(ast::FunctionArgumentList {
            duplicate_treatment: None,
            args: args
                .into_iter()
                .map(|a| ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(a)))
                .collect(),
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    })
}

/// `json_agg(x …)` is `pg_json_agg_finish(array_agg(pg_json_element(x) …))`, and
/// `json_object_agg(k, v …)` joins `pg_json_pair(k, v)`s; the call's DISTINCT, ORDER
/// BY, FILTER and OVER stay on `array_agg`.
fn json_aggregate(f: &ast::Function, list: &ast::FunctionArgumentList) -> Option<Result<Expr>> {
    use ast::{FunctionArg::Unnamed, FunctionArgExpr::Expr as Arg};
    let [name] = parts(&f.name).try_into().ok()?;
    let (finish, pair) = json::aggregate(&name)?;
    let args: Vec<Expr> = list
        .args
        .iter()
        .map(|a| match a {
            Unnamed(Arg(e)) => Some(e.clone()),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let element = match (pair, args.len()) {
        (false, 1) => call(json::ELEMENT, args),
        (true, 2) => call(json::PAIR, args),
        _ => return None,
    };
    let mut agg = f.clone();
    agg.name = ObjectName::from(vec![Ident::new("array_agg")]);
    agg.args = FunctionArguments::List(ast::FunctionArgumentList {
        duplicate_treatment: list.duplicate_treatment,
        args: vec![Unnamed(Arg(element))],
        clauses: list.clauses.clone(),
    });
    Some(Ok(call(finish, vec![Expr::Function(agg)])))
}

/// The functions that take a whole row (`row_to_json(p)`, `json_agg(t)`).
const WHOLE_ROW: &[&str] = &[
    "row_to_json",
    "to_json",
    "to_jsonb",
    "json_agg",
    "jsonb_agg",
];

/// `ARRAY(SELECT e FROM unnest(a) x)` maps `e` over the elements of `a`:
/// `array_transform(a, x -> e)`, an empty array when `a` is NULL.
fn array_map(select: &Select, item: &Expr) -> Option<Expr> {
    let [from] = select.from.as_slice() else {
        return None;
    };
    if !from.joins.is_empty() || select.selection.is_some() {
        return None;
    }
    let TableFactor::Table {
        name,
        args: Some(args),
        alias: Some(alias),
        ..
    } = &from.relation
    else {
        return None;
    };
    let [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(array))] = args.args.as_slice()
    else {
        return None;
    };
    if parts(name) != ["unnest"] {
        return None;
    }
    let param = alias
        .columns
        .first()
        .map_or(alias.name.clone(), |c| c.name.clone());
    let lambda = Expr::Lambda(ast::LambdaFunction {
        params: ast::OneOrManyWithParens::One(ast::LambdaFunctionParameter {
            name: param,
            data_type: None,
        }),
        body: Box::new(item.clone()),
        syntax: ast::LambdaSyntax::Arrow,
    });
    Some(call(
        "coalesce",
        vec![
            call("array_transform", vec![array.clone(), lambda]),
            call("make_array", vec![]),
        ],
    ))
}

/// Replaces each column named in `bound` by its expression.
fn substitute(e: &mut Expr, bound: &[(String, Expr)]) {
    let _ = e.visit(&mut Change::Substitute(bound));
}

/// `a AND b AND c` as `[a, b, c]`.
fn conjuncts(e: Expr) -> Vec<Expr> {
    match e {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            let mut out = conjuncts(*left);
            out.extend(conjuncts(*right));
            out
        }
        Expr::Nested(inner) => conjuncts(*inner),
        e => vec![e],
    }
}

/// The names a SELECT's own FROM clause binds: aliases, or table names.
fn inner_names(select: &Select) -> HashSet<String> {
    let mut names = HashSet::new();
    for from in &select.from {
        for factor in std::iter::once(&from.relation).chain(from.joins.iter().map(|j| &j.relation))
        {
            if let TableFactor::Table { name, alias, .. } = factor {
                match alias {
                    Some(a) => names.insert(normalize_ident(&a.name)),
                    None => names.insert(parts(name).pop().unwrap_or_default()),
                };
            }
        }
    }
    names
}

/// Whether `e` names a column qualified by something `inner` does not bind.
fn references_outer(e: &Expr, inner: &HashSet<String>) -> bool {
    ast::Visit::visit(e, &mut Find::OuterReference(inner)).is_break()
}

fn has_subquery(e: &Expr) -> bool {
    ast::Visit::visit(e, &mut Find::Subquery).is_break()
}

/// What this module looks for in a statement, found when the walk breaks. sqlparser's
/// traversal covers the whole grammar and is generic over its visitor, so every visitor
/// type compiled another copy of it: one type per direction keeps it to one copy each.
enum Find<'a> {
    /// An aggregate or window function call outside subqueries (`depth` counts the
    /// queries the walk is inside).
    Aggregate {
        state: &'a SessionState,
        depth: usize,
    },
    /// A column qualified by a name the set does not bind.
    OuterReference(&'a HashSet<String>),
    Subquery,
}

impl ast::Visitor for Find<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
        match self {
            Find::Aggregate { depth, .. } => *depth += 1,
            Find::Subquery => return ControlFlow::Break(()),
            Find::OuterReference(_) => {}
        }
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
        if let Find::Aggregate { depth, .. } = self {
            *depth -= 1;
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
        let found = match (&*self, e) {
            (Find::Aggregate { state, depth: 0 }, Expr::Function(f)) => {
                let name = parts(&f.name).pop().unwrap_or_default();
                state.aggregate_functions().contains_key(&name) || f.over.is_some()
            }
            (Find::OuterReference(inner), Expr::CompoundIdentifier(idents)) => {
                idents.len() >= 2 && !inner.contains(&normalize_ident(&idents[idents.len() - 2]))
            }
            _ => false,
        };
        match found {
            true => ControlFlow::Break(()),
            false => ControlFlow::Continue(()),
        }
    }
}

/// The changes this module makes to a statement, as one `VisitorMut` type (see [`Find`]).
enum Change<'a, 'b> {
    Rewrite(&'b mut Rewriter<'a>),
    /// Each column named in the list becomes its expression.
    Substitute(&'b [(String, Expr)]),
    /// The whole-row argument of a function of `WHOLE_ROW` becomes what the closure
    /// gives for it.
    WholeRow(&'b dyn Fn(&Expr) -> Option<Expr>),
}

impl VisitorMut for Change<'_, '_> {
    type Break = DataFusionError;

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<Self::Break> {
        match self {
            Change::Rewrite(r) => r.name_of_reg(expr),
            Change::Substitute(_) => ControlFlow::Continue(()),
            Change::WholeRow(row) => {
                whole_row_argument(expr, *row);
                ControlFlow::Continue(())
            }
        }
    }

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<Self::Break> {
        match self {
            Change::Rewrite(r) => r.table_factor(factor),
            _ => ControlFlow::Continue(()),
        }
    }

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<Self::Break> {
        if let Change::Rewrite(r) = self {
            selects_mut(&mut query.body, &mut |s| r.whole_rows(s));
        }
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, query: &mut Query) -> ControlFlow<Self::Break> {
        match self {
            Change::Rewrite(r) => r.query(query),
            _ => ControlFlow::Continue(()),
        }
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<Self::Break> {
        match self {
            Change::Rewrite(r) => r.expr(expr),
            Change::Substitute(bound) => {
                if let Expr::CompoundIdentifier(_) = expr {
                    let name = expr.to_string();
                    if let Some((_, inner)) = bound.iter().find(|(outer, _)| *outer == name) {
                        *expr = inner.clone();
                    }
                }
                ControlFlow::Continue(())
            }
            Change::WholeRow(_) => ControlFlow::Continue(()),
        }
    }
}

/// Replaces the first argument of a call of `WHOLE_ROW`'s functions with `row`'s
/// expression for it, if it names a whole row.
fn whole_row_argument(expr: &mut Expr, row: &dyn Fn(&Expr) -> Option<Expr>) {
    use ast::{FunctionArg::Unnamed, FunctionArgExpr::Expr as Arg};
    let Expr::Function(f) = expr else { return };
    if !matches!(parts(&f.name).last(), Some(n) if WHOLE_ROW.contains(&n.as_str())) {
        return;
    }
    if let FunctionArguments::List(list) = &mut f.args {
        if let Some(Unnamed(Arg(arg))) = list.args.first_mut() {
            if let Some(r) = row(arg) {
                *arg = r;
            }
        }
    }
}

/// `SELECT *` over `a JOIN b USING (k)` shows `k` first, then the other columns of `a`
/// and of `b`, as PostgreSQL does; DataFusion keeps `k` where `a` has it, and takes it
/// from `a` whatever the join. `*` becomes `a.k AS k, a.* EXCLUDE (k), b.* EXCLUDE (k)`,
/// with `b.k` for a RIGHT join and `COALESCE(a.k, b.k)` for a FULL one. Only for one
/// join of two named relations; anything else keeps DataFusion's order.
fn using_columns_first(select: &mut Select) {
    use ast::{JoinConstraint, JoinOperator as J};
    let [from] = select.from.as_slice() else {
        return;
    };
    let [join] = from.joins.as_slice() else {
        return;
    };
    let (side, c) = match &join.join_operator {
        J::Join(c) | J::Inner(c) | J::Left(c) | J::LeftOuter(c) => (0, c),
        J::Right(c) | J::RightOuter(c) => (1, c),
        J::FullOuter(c) => (2, c),
        _ => return,
    };
    let JoinConstraint::Using(names) = c else {
        return;
    };
    let qualifier = |t: &TableFactor| match t {
        TableFactor::Table { alias: Some(a), .. } | TableFactor::Derived { alias: Some(a), .. } => {
            Some(a.name.clone())
        }
        TableFactor::Table {
            name, alias: None, ..
        } => name.0.last().and_then(|p| p.as_ident()).cloned(),
        _ => None,
    };
    let (Some(left), Some(right)) = (qualifier(&from.relation), qualifier(&join.relation)) else {
        return;
    };
    let keys: Option<Vec<Ident>> = names
        .iter()
        .map(|n| match n.0.as_slice() {
            [part] => part.as_ident().cloned(),
            _ => None,
        })
        .collect();
    let Some(keys) = keys else { return };
    let Some(i) = select.projection.iter().position(|item| {
        matches!(item, SelectItem::Wildcard(o) if *o == ast::WildcardAdditionalOptions::default())
    }) else {
        return;
    };
    let column = |t: &Ident, k: &Ident| Expr::CompoundIdentifier(vec![t.clone(), k.clone()]);
    let mut items: Vec<SelectItem> = keys
        .iter()
        .map(|k| SelectItem::ExprWithAlias {
            expr: match side {
                0 => column(&left, k),
                1 => column(&right, k),
                _ => call("coalesce", vec![column(&left, k), column(&right, k)]),
            },
            alias: k.clone(),
        })
        .collect();
    let exclude = || ast::WildcardAdditionalOptions {
        opt_exclude: Some(ast::ExcludeSelectItem::Multiple(
            keys.iter()
                .map(|k| ObjectName::from(vec![k.clone()]))
                .collect(),
        )),
        ..Default::default()
    };
    for t in [left, right] {
        items.push(SelectItem::QualifiedWildcard(
            ast::SelectItemQualifiedWildcardKind::ObjectName(ObjectName::from(vec![t])),
            exclude(),
        ));
    }
    select.projection.splice(i..=i, items);
}

fn selects_mut(body: &mut SetExpr, f: &mut dyn FnMut(&mut Select)) {
    match body {
        SetExpr::Select(s) => f(s),
        SetExpr::SetOperation { left, right, .. } => {
            selects_mut(left, f);
            selects_mut(right, f);
        }
        _ => {}
    }
}

/// The rewrite's steps, called by [`Change::Rewrite`] as the walk meets each node.
impl Rewriter<'_> {
    /// `'name'::regclass::text` (or `regtype`) is the name as PostgreSQL prints the
    /// relation or type. It is seen before the inner cast becomes the oid.
    fn name_of_reg(&mut self, expr: &mut Expr) -> ControlFlow<DataFusionError> {
        let Expr::Cast {
            expr: inner,
            data_type: outer,
            ..
        } = expr
        else {
            return ControlFlow::Continue(());
        };
        let to_text = matches!(outer, DataType::Text | DataType::Varchar(None))
            || pg_type_name(outer).as_deref() == Some("text");
        let Expr::Cast {
            expr: literal,
            data_type,
            ..
        } = &**inner
        else {
            return ControlFlow::Continue(());
        };
        let (Some(s), Some(kind), true) =
            (string_literal(literal), pg_type_name(data_type), to_text)
        else {
            return ControlFlow::Continue(());
        };
        let name = match kind.as_str() {
            "regclass" => self.regclass(s).map(|oid| self.snapshot.regclass_name(oid)),
            "regtype" => Self::regtype(s).map(|t| t.display.to_string()),
            _ => return ControlFlow::Continue(()),
        };
        let name = match name {
            Ok(name) => name,
            Err(e) => return ControlFlow::Break(e),
        };
        // The outer cast stays: the column is named `text`, as in PostgreSQL.
        **inner = Expr::value(Value::SingleQuotedString(name));
        ControlFlow::Continue(())
    }

    /// A FROM item's name standing for its whole row, as the argument of a function
    /// that takes one (`row_to_json(p)`), is `named_struct` of its columns.
    fn whole_rows(&self, select: &mut Select) {
        let mut rows: Vec<(String, Vec<String>)> = Vec::new();
        let mut columns: HashSet<String> = HashSet::new();
        for from in &select.from {
            let factors =
                std::iter::once(&from.relation).chain(from.joins.iter().map(|j| &j.relation));
            for factor in factors {
                let (name, alias, cols) = match factor {
                    TableFactor::Table {
                        name,
                        alias,
                        args: None,
                        ..
                    } => {
                        let table = parts(name).pop().unwrap_or_default();
                        let cols = self
                            .snapshot
                            .relations
                            .iter()
                            .find(|r| r.name == table)
                            .map(|r| r.columns.iter().map(|c| c.name.clone()).collect());
                        (Some(table), alias, cols)
                    }
                    TableFactor::Derived {
                        subquery, alias, ..
                    } => {
                        let cols = match subquery.body.as_ref() {
                            SetExpr::Select(s) => item_names(s),
                            _ => None,
                        };
                        (None, alias, cols)
                    }
                    _ => continue,
                };
                let Some(mut cols) = cols else { continue };
                if let Some(alias) = alias {
                    if !alias.columns.is_empty() {
                        cols = alias
                            .columns
                            .iter()
                            .map(|c| normalize_ident(&c.name))
                            .collect();
                    }
                }
                let Some(row) = alias.as_ref().map(|a| normalize_ident(&a.name)).or(name) else {
                    continue;
                };
                columns.extend(cols.iter().cloned());
                rows.push((row, cols));
            }
        }
        if rows.is_empty() {
            return;
        }
        let whole_row = |e: &Expr| -> Option<Expr> {
            let Expr::Identifier(i) = e else { return None };
            let name = normalize_ident(i);
            if columns.contains(&name) {
                return None;
            }
            let (row, cols) = rows.iter().find(|(r, _)| *r == name)?;
            let mut args = Vec::new();
            for c in cols {
                args.push(Expr::value(Value::SingleQuotedString(c.clone())));
                args.push(Expr::CompoundIdentifier(vec![
                    Ident::with_quote('"', row.clone()),
                    Ident::with_quote('"', c.clone()),
                ]));
            }
            Some(call("named_struct", args))
        };
        let _ = select.projection.visit(&mut Change::WholeRow(&whole_row));
    }

    fn table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<DataFusionError> {
        match series_table(factor) {
            Some(Ok(derived)) => *factor = derived,
            Some(Err(e)) => return ControlFlow::Break(e),
            None => {}
        }
        if let TableFactor::Table { name, args, .. } = factor {
            if args.is_some() {
                unqualify(name);
            } else if let [table] = parts(name).as_slice() {
                let user = self.snapshot.relations.iter().any(|r| &r.name == table);
                if !user && self.snapshot.tables.contains_key(table.as_str()) {
                    name.0
                        .insert(0, ObjectNamePart::Identifier(Ident::new("pg_catalog")));
                }
            }
        }
        ControlFlow::Continue(())
    }

    fn query(&mut self, query: &mut Query) -> ControlFlow<DataFusionError> {
        selects_mut(&mut query.body, &mut |s| self.select(s));
        if let Some(fetch) = query.fetch.take() {
            if let Err(e) = fetch_clause(query, fetch) {
                return ControlFlow::Break(e);
            }
        }
        match counted_set_operation(&query.body) {
            Some(Ok(counted)) => *query.body = counted,
            Some(Err(e)) => return ControlFlow::Break(e),
            None => {}
        }
        ControlFlow::Continue(())
    }

    fn expr(&mut self, expr: &mut Expr) -> ControlFlow<DataFusionError> {
        if let Some(cast) = typed_literal_cast(expr) {
            *expr = cast;
        }
        let replacement = match expr {
            // SQL's niladic functions, written without parentheses.
            Expr::Identifier(i)
                if i.quote_style.is_none() && NILADIC.contains(&normalize_ident(i).as_str()) =>
            {
                Some(Ok(call(&normalize_ident(i), vec![])))
            }
            Expr::Function(f)
                if matches!(f.args, FunctionArguments::None)
                    && matches!(parts(&f.name).as_slice(), [n] if NILADIC.contains(&n.as_str())) =>
            {
                Some(Ok(call(&parts(&f.name)[0], vec![])))
            }
            // `|/ x`, `||/ x` and `@ x`: PostgreSQL's square root and cube root (of a
            // float8) and absolute value.
            Expr::UnaryOp {
                op:
                    op @ (ast::UnaryOperator::PGSquareRoot
                    | ast::UnaryOperator::PGCubeRoot
                    | ast::UnaryOperator::PGAbs),
                expr: inner,
            } => {
                let float = || Expr::Cast {
                    kind: ast::CastKind::Cast,
                    expr: inner.clone(),
                    data_type: DataType::DoublePrecision,
                    array: false,
                    format: None,
                };
                Some(Ok(match op {
                    ast::UnaryOperator::PGSquareRoot => call("sqrt", vec![float()]),
                    ast::UnaryOperator::PGCubeRoot => call("cbrt", vec![float()]),
                    _ => call("abs", vec![inner.as_ref().clone()]),
                }))
            }
            // `a SIMILAR TO p [ESCAPE e]`: a match of the whole of `a` with the SQL pattern
            // `p` (`%` and `_`, the escape's next character literal), as a regex.
            Expr::SimilarTo {
                negated,
                expr: inner,
                pattern,
                escape_char,
            } => {
                let mut args = vec![pattern.as_ref().clone()];
                args.extend(escape_char.iter().map(|e| Expr::Value(e.clone())));
                let regex = call("pg_similar_to_regex", args);
                Some(Ok(eddy_planner::filter::regex_match(
                    *negated, inner, regex,
                )))
            }
            // `a ^@ b`: whether a starts with b.
            Expr::BinaryOp {
                left,
                op: BinaryOperator::PGStartsWith,
                right,
            } => Some(Ok(call(
                "starts_with",
                vec![left.as_ref().clone(), right.as_ref().clone()],
            ))),
            // `LIKE p ESCAPE e` with another escape than the backslash (the only one
            // DataFusion takes), as metric filters read it.
            Expr::Like { .. } | Expr::ILike { .. } => eddy_planner::filter::like_escape(expr)
                .err()
                .map(|e| Err(DataFusionError::External(Box::new(e)))),
            // ~x is -1 - x in two's complement (no overflow at either end).
            Expr::UnaryOp {
                op: ast::UnaryOperator::BitwiseNot,
                expr: inner,
            } => Some(Ok(Expr::Nested(Box::new(Expr::BinaryOp {
                left: Box::new(Expr::UnaryOp {
                    op: ast::UnaryOperator::Minus,
                    expr: Box::new(number(1)),
                }),
                op: BinaryOperator::Minus,
                right: Box::new(Expr::Nested(inner.clone())),
            })))),
            Expr::Function(f)
                if f.over.is_none()
                    && f.within_group.is_empty()
                    && matches!(parts(&f.name).as_slice(), [n] if WINDOW_ONLY.contains(&n.as_str())) =>
            {
                Some(Err(external(
                    ErrorKind::WrongObjectType,
                    &format!(
                        "window function {} requires an OVER clause",
                        parts(&f.name)[0]
                    ),
                )))
            }
            Expr::Function(f) => {
                unqualify(&mut f.name);
                if let [name] = parts(&f.name).as_slice() {
                    if let Some((_, to)) = RENAMED.iter().find(|(from, _)| from == name) {
                        f.name = ObjectName::from(vec![Ident::new(*to)]);
                    }
                }
                match &f.args {
                    // mod(a, b) is a % b.
                    FunctionArguments::List(list) if parts(&f.name) == ["mod"] => {
                        use ast::{FunctionArg::Unnamed, FunctionArgExpr::Expr as Arg};
                        match list.args.as_slice() {
                            [Unnamed(Arg(a)), Unnamed(Arg(b))] => {
                                Some(Ok(Expr::Nested(Box::new(Expr::BinaryOp {
                                    left: Box::new(Expr::Nested(Box::new(a.clone()))),
                                    op: BinaryOperator::Modulo,
                                    right: Box::new(Expr::Nested(Box::new(b.clone()))),
                                }))))
                            }
                            _ => None,
                        }
                    }
                    FunctionArguments::List(list) if matches!(parts(&f.name).as_slice(), [n] if json::aggregate(n).is_some()) => {
                        json_aggregate(f, list)
                    }
                    FunctionArguments::Subquery(q) if parts(&f.name) == ["array"] => {
                        Some(self.array_subquery(q))
                    }
                    // A set-returning function: one row per element.
                    _ if parts(&f.name) == ["information_schema", "_pg_expandarray"] => {
                        f.name.0.remove(0);
                        Some(Ok(call("unnest", vec![expr.clone()])))
                    }
                    FunctionArguments::List(list) if parts(&f.name) == ["current_setting"] => {
                        current_setting(list)
                    }
                    FunctionArguments::List(list) if parts(&f.name) == ["make_interval"] => {
                        make_interval(list)
                    }
                    FunctionArguments::List(list) => {
                        let name = parts(&f.name);
                        by_pattern(&name, list).or_else(|| datetime_call(&name, list))
                    }
                    _ => None,
                }
            }
            Expr::Cast {
                expr: inner,
                data_type,
                ..
            } => match data_type {
                DataType::Array(ast::ArrayElemTypeDef::SquareBracket(elem, _)) => {
                    if let Some(ty) = pg_type_name(elem).and_then(|n| standard_type(&n)) {
                        **elem = ty;
                    }
                    None
                }
                DataType::Interval { .. } => {
                    interval_units_in(inner);
                    None
                }
                DataType::Bytea => Some(Ok(call("pg_bytea_in", vec![inner.as_ref().clone()]))),
                DataType::Numeric(ast::ExactNumberInfo::None)
                | DataType::Decimal(ast::ExactNumberInfo::None) => {
                    numeric::literal_as_decimal(inner).map(Ok)
                }
                DataType::JSON => Some(Ok(call("pg_json_in", vec![inner.as_ref().clone()]))),
                DataType::JSONB => Some(Ok(call("pg_jsonb_in", vec![inner.as_ref().clone()]))),
                // PostgreSQL's text of every value (DataFusion writes intervals and
                // timestamps its own way).
                DataType::Text | DataType::Varchar(None) | DataType::String(None) => {
                    Some(Ok(call("pg_text", vec![inner.as_ref().clone()])))
                }
                // An explicit cast to varchar(n) cuts the text to n characters.
                DataType::Varchar(Some(ast::CharacterLength::IntegerLength { length, .. }))
                | DataType::CharacterVarying(Some(ast::CharacterLength::IntegerLength {
                    length,
                    ..
                })) => Some(Ok(left_chars(inner, Some(*length)))),
                // char(n): n characters (1 without a length), shown unpadded
                // (`'ab'::char(3)` prints `ab`, not `ab `).
                DataType::Char(length) | DataType::Character(length) => {
                    let cut = match length {
                        None => Some(1),
                        Some(ast::CharacterLength::IntegerLength { length, .. }) => Some(*length),
                        Some(ast::CharacterLength::Max) => None,
                    };
                    Some(Ok(bpchar(inner, cut)))
                }
                DataType::Custom(name, modifiers)
                    if modifiers.is_empty() && name.to_string().eq_ignore_ascii_case("bpchar") =>
                {
                    Some(Ok(bpchar(inner, None)))
                }
                ty => pg_type_name(ty).and_then(|n| self.cast(inner, &n).transpose()),
            },
            // extract of a field with a fraction of a second keeps it, as a numeric.
            Expr::Extract {
                field, expr: inner, ..
            } => datetime::Part::named(&field.to_string())
                .map(|part| Ok(call(part.function(), vec![inner.as_ref().clone()]))),
            // Interval text as PostgreSQL reads it (`1 day 02:30:00`, `P1DT2H`).
            Expr::Interval(i) => {
                interval_units_in(&mut i.value);
                None
            }
            Expr::TypedString(t)
                if matches!(
                    t.data_type,
                    DataType::Timestamp(
                        _,
                        ast::TimezoneInfo::None | ast::TimezoneInfo::WithoutTimeZone
                    )
                ) =>
            {
                if let Value::SingleQuotedString(text) = &mut t.value.value {
                    if let Some(canonical) = datetime::timestamp_text(text) {
                        *text = canonical;
                    }
                }
                None
            }
            // `x > ALL (SELECT amount FROM t …)` where x is a column of an outer `t`:
            // DataFusion moves the comparison into the subquery, where both sides read
            // `t.amount`, and compares the inner column with itself. The subquery's rows
            // under a name of their own keep the two apart.
            Expr::AnyOp { right, .. } | Expr::AllOp { right, .. } => {
                if let Expr::Subquery(q) = right.as_mut() {
                    match parse_query(&format!("SELECT {ANY_ROWS}.v FROM ({q}) AS {ANY_ROWS}(v)")) {
                        Ok(wrapped) => **q = wrapped,
                        Err(e) => return ControlFlow::Break(e),
                    }
                }
                None
            }
            Expr::Collate { expr: inner, .. } => Some(Ok(inner.as_ref().clone())),
            Expr::AtTimeZone {
                timestamp,
                time_zone,
            } => Some(Ok(call(
                "pg_at_time_zone",
                vec![timestamp.as_ref().clone(), time_zone.as_ref().clone()],
            ))),
            Expr::Subquery(q) => self.scalar_subquery(q),
            // `(record).field` reads a field of a composite value.
            Expr::CompoundFieldAccess { root, access_chain }
                if access_chain
                    .iter()
                    .all(|a| matches!(a, ast::AccessExpr::Dot(Expr::Identifier(_)))) =>
            {
                let mut e = root.as_ref().clone();
                for access in access_chain.iter() {
                    if let ast::AccessExpr::Dot(Expr::Identifier(field)) = access {
                        let name = Value::SingleQuotedString(normalize_ident(field));
                        e = call("get_field", vec![e, Expr::value(name)]);
                    }
                }
                Some(Ok(e))
            }
            Expr::BinaryOp { left, op, right } => match op {
                // `INTERVAL '1 hour' * 3`, `2.5 * INTERVAL …`, `INTERVAL … / 4`: DataFusion
                // has no interval product.
                BinaryOperator::Multiply | BinaryOperator::Divide
                    if is_interval(left) || is_interval(right) =>
                {
                    let (interval, factor) = match is_interval(left) {
                        true => (left, right),
                        false => (right, left),
                    };
                    let factor = match op {
                        BinaryOperator::Divide => Expr::BinaryOp {
                            left: Box::new(Expr::value(Value::Number("1.0".into(), false))),
                            op: BinaryOperator::Divide,
                            right: factor.clone(),
                        },
                        _ => factor.as_ref().clone(),
                    };
                    Some(Ok(call(
                        "interval_mul",
                        vec![interval.as_ref().clone(), factor],
                    )))
                }
                BinaryOperator::PGCustomBinaryOperator(p)
                    if p.len() == 2 && p[0] == "pg_catalog" =>
                {
                    let op = match p[1].as_str() {
                        "~" => Some(BinaryOperator::PGRegexMatch),
                        "~*" => Some(BinaryOperator::PGRegexIMatch),
                        "!~" => Some(BinaryOperator::PGRegexNotMatch),
                        "!~*" => Some(BinaryOperator::PGRegexNotIMatch),
                        "~~" => Some(BinaryOperator::PGLikeMatch),
                        "=" => Some(BinaryOperator::Eq),
                        "<>" => Some(BinaryOperator::NotEq),
                        "<" => Some(BinaryOperator::Lt),
                        "<=" => Some(BinaryOperator::LtEq),
                        ">" => Some(BinaryOperator::Gt),
                        ">=" => Some(BinaryOperator::GtEq),
                        "||" => Some(BinaryOperator::StringConcat),
                        _ => None,
                    };
                    op.map(|op| {
                        Ok(Expr::BinaryOp {
                            left: left.clone(),
                            op,
                            right: right.clone(),
                        })
                    })
                }
                _ => None,
            },
            _ => None,
        };
        match replacement {
            Some(Ok(e)) => {
                *expr = e;
                ControlFlow::Continue(())
            }
            Some(Err(e)) => ControlFlow::Break(e),
            None => ControlFlow::Continue(()),
        }
    }
}
