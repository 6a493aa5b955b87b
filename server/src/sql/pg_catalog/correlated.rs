//! Correlated subqueries that compare an expression of their own columns with an outer
//! column: `(SELECT count(*) FROM payments WHERE ts::date = d)`.
//!
//! DataFusion decorrelates such a subquery into a join grouped by the inner columns the
//! expression reads (`ts`), not by the expression's value (`ts::date`), and so answers one
//! row per distinct `ts`: a wrong answer without an error. [`InnerKeys`] computes each
//! such expression in a projection under the filter, so that the comparison is of a plain
//! column, which DataFusion decorrelates right.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::Column;
use datafusion::error::Result;
use datafusion::logical_expr::utils::{conjunction, split_conjunction_owned};
use datafusion::logical_expr::{BinaryExpr, Expr, Filter, LogicalPlan, Operator, Projection};
use datafusion::optimizer::AnalyzerRule;

/// The name of the `i`-th computed key.
fn key_name(i: usize) -> String {
    format!("__eddy_inner_key_{i}")
}

/// An inner expression compared with an outer one: not a plain column, reading no outer
/// column itself.
fn inner_key(e: &Expr) -> bool {
    !matches!(e, Expr::Column(_)) && !e.contains_outer() && !e.column_refs().is_empty()
}

#[derive(Debug)]
pub(super) struct InnerKeys;

impl AnalyzerRule for InnerKeys {
    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|node| {
            let LogicalPlan::Filter(filter) = node else {
                return Ok(Transformed::no(node));
            };
            if !filter.predicate.contains_outer() {
                return Ok(Transformed::no(LogicalPlan::Filter(filter)));
            }
            let mut keys = Vec::new();
            let conditions: Vec<Expr> = split_conjunction_owned(filter.predicate.clone())
                .into_iter()
                .map(|c| match c {
                    Expr::BinaryExpr(BinaryExpr {
                        left,
                        op: Operator::Eq,
                        right,
                    }) if right.contains_outer() && inner_key(&left) => {
                        keys.push(*left);
                        Expr::Column(Column::from_name(key_name(keys.len() - 1))).eq(*right)
                    }
                    Expr::BinaryExpr(BinaryExpr {
                        left,
                        op: Operator::Eq,
                        right,
                    }) if left.contains_outer() && inner_key(&right) => {
                        keys.push(*right);
                        (*left).eq(Expr::Column(Column::from_name(key_name(keys.len() - 1))))
                    }
                    c => c,
                })
                .collect();
            if keys.is_empty() {
                return Ok(Transformed::no(LogicalPlan::Filter(filter)));
            }
            let input = filter.input;
            let columns: Vec<Expr> = input
                .schema()
                .columns()
                .into_iter()
                .map(Expr::Column)
                .collect();
            let widened = columns.iter().cloned().chain(
                keys.into_iter()
                    .enumerate()
                    .map(|(i, k)| k.alias(key_name(i))),
            );
            let widened = Projection::try_new(widened.collect(), input)?;
            let predicate = conjunction(conditions).expect("at least one condition");
            let filtered = Filter::try_new(predicate, Arc::new(LogicalPlan::Projection(widened)))?;
            // The filter's parent sees the columns it saw before.
            let restored = Projection::try_new(columns, Arc::new(LogicalPlan::Filter(filtered)))?;
            Ok(Transformed::yes(LogicalPlan::Projection(restored)))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "eddy_inner_keys"
    }
}
