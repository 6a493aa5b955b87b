//! PostgreSQL's arithmetic in ad-hoc queries (`eddy_planner::arith`, where the rules
//! are), as two analyzer rules: `IntLiterals` runs first, before DataFusion coerces
//! types, so the narrower literals take part in coercion as PostgreSQL's do; `Checked`
//! runs last, once every operand has its final type, and turns the operators DataFusion
//! would get silently wrong into checked calls. Both keep every expression's output
//! name.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::DFSchema;
use datafusion::error::Result;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;

pub(super) use eddy_planner::arith::external;
use eddy_planner::{arith, ErrorKind};

/// Applies `f` to every expression of every node of `plan`, its subqueries' included,
/// keeping each expression's output name; a node whose expressions changed gets its
/// schema again. `f` gets the node's input schema.
pub(super) fn rewrite_expressions(
    plan: LogicalPlan,
    f: &dyn Fn(Expr, &DFSchema) -> Result<Transformed<Expr>>,
) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        // A LIMIT's count must stay bigint; VALUES keeps the schema it was planned with.
        if matches!(node, LogicalPlan::Limit(_) | LogicalPlan::Values(_)) {
            return Ok(Transformed::no(node));
        }
        let mut input = DFSchema::empty();
        for child in node.inputs() {
            input.merge(child.schema());
        }
        let names = NamePreserver::new(&node);
        let rewritten = node.map_expressions(|e| {
            let name = names.save(&e);
            e.transform_up(|e| f(e, &input))
                .map(|t| t.update_data(|e| name.restore(e)))
        })?;
        if rewritten.transformed {
            rewritten.map_data(|n| n.recompute_schema())
        } else {
            Ok(rewritten)
        }
    })
    .map(|t| t.data)
}

/// Integer literals as PostgreSQL types them: int4 when they fit.
#[derive(Debug, Default)]
pub(super) struct IntLiterals;

impl AnalyzerRule for IntLiterals {
    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        // A recursive CTE's work table keeps the types it was planned with, so a query
        // with one keeps bigint literals (its integer columns are bigint where
        // PostgreSQL's are integer; the values are the same).
        let recursive = plan.exists(|n| Ok(matches!(n, LogicalPlan::RecursiveQuery(_))))?;
        let plan = match recursive {
            true => plan,
            false => rewrite_expressions(plan, &|e, _| Ok(arith::int_literal(e)))?,
        };
        union_types(&plan)?;
        Ok(plan)
    }

    fn name(&self) -> &str {
        "eddy_int_literals"
    }
}

/// A UNION whose sides give one column text from a column (not a literal, which
/// PostgreSQL reads as the other side's type) and a number on the other: 42804, as in
/// PostgreSQL, where DataFusion makes both text.
fn union_types(plan: &LogicalPlan) -> Result<()> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    let text =
        |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
    let number = |t: &DataType| t.is_numeric();
    let mut found = None;
    plan.apply_with_subqueries(|node| {
        let LogicalPlan::Union(union) = node else {
            return Ok(TreeNodeRecursion::Continue);
        };
        // Each side's column: its type, and whether it is a literal.
        let sides: Vec<Vec<(DataType, bool)>> = union
            .inputs
            .iter()
            .map(|input| {
                let literal = |i: usize| match input.as_ref() {
                    LogicalPlan::Projection(p) => matches!(
                        p.expr.get(i).map(|e| e.clone().unalias()),
                        Some(Expr::Literal(..))
                    ),
                    _ => false,
                };
                input
                    .schema()
                    .fields()
                    .iter()
                    .enumerate()
                    .map(|(i, f)| (f.data_type().clone(), literal(i)))
                    .collect()
            })
            .collect();
        for column in 0..sides.first().map_or(0, Vec::len) {
            let texts = sides
                .iter()
                .any(|s| s.get(column).is_some_and(|(t, lit)| text(t) && !lit));
            let numbers = sides
                .iter()
                .find_map(|s| s.get(column).filter(|(t, _)| number(t)));
            if let (true, Some((n, _))) = (texts, numbers) {
                let oid = crate::session::cells::pg_type_of_arrow(n).oid() as i32;
                let name = super::functions::type_display(oid).unwrap_or("numeric");
                found = Some(external(
                    ErrorKind::DatatypeMismatch,
                    &format!("UNION types text and {name} cannot be matched"),
                ));
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    match found {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Integer `+ - *` and float `/` as PostgreSQL checks them (`eddy_planner::arith`).
#[derive(Debug, Default)]
pub(super) struct Checked;

impl AnalyzerRule for Checked {
    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        rewrite_expressions(plan, &|e, schema| arith::checked(e, schema))
    }

    fn name(&self) -> &str {
        "eddy_checked_arithmetic"
    }
}

/// The analyzer rules of a session: `IntLiterals` before DataFusion's own, `Checked`
/// after them.
pub(super) fn analyzer_rules(
    defaults: &[Arc<dyn AnalyzerRule + Send + Sync>],
) -> Vec<Arc<dyn AnalyzerRule + Send + Sync>> {
    let mut rules: Vec<Arc<dyn AnalyzerRule + Send + Sync>> = vec![Arc::new(IntLiterals)];
    rules.extend(defaults.iter().cloned());
    rules.push(Arc::new(Checked));
    rules.push(Arc::new(super::datetime::TimeLiterals));
    rules.push(Arc::new(super::numeric::NumericOrder));
    rules.push(Arc::new(super::correlated::InnerKeys));
    rules
}
