//! PostgreSQL's arithmetic in ad-hoc queries, where DataFusion's differs silently:
//!
//! - An integer literal is `integer` (int4) when it fits, `bigint` otherwise; DataFusion
//!   makes every one `bigint`. So `2147483647 + 1` overflows, as in PostgreSQL.
//! - Integer `+`, `-` and `*` fail with 22003 (`integer out of range`, `bigint out of
//!   range`, `smallint out of range`) where DataFusion wraps around.
//! - A float divided by zero fails with 22012, where DataFusion gives Infinity or NaN.
//!
//! Two analyzer rules: `IntLiterals` runs first, before DataFusion coerces types, so the
//! narrower literals take part in coercion as PostgreSQL's do; `Checked` runs last, once
//! every operand has its final type, and turns those operators into calls of `Checked`'s
//! functions. Both keep every expression's output name.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, Float32Array, Float64Array};
use datafusion::arrow::compute::kernels::numeric;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::error::ArrowError;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Expr, ExprSchemable, LogicalPlan, Operator, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;

use eddy_planner::{Error, ErrorKind};

/// Applies `f` to every expression of every node of `plan`, its subqueries' included,
/// keeping each expression's output name; a node whose expressions changed gets its
/// schema again. `f` gets the node's input schema.
fn rewrite_expressions(
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
        rewrite_expressions(plan, &|e, _| {
            Ok(match e {
                Expr::Literal(ScalarValue::Int64(Some(v)), meta) if i32::try_from(v).is_ok() => {
                    Transformed::yes(Expr::Literal(ScalarValue::Int32(Some(v as i32)), meta))
                }
                e => Transformed::no(e),
            })
        })
    }

    fn name(&self) -> &str {
        "eddy_int_literals"
    }
}

/// Integer `+ - *` and float `/` as PostgreSQL checks them.
#[derive(Debug, Default)]
pub(super) struct Checked;

impl AnalyzerRule for Checked {
    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        rewrite_expressions(plan, &|e, schema| {
            let Expr::BinaryExpr(BinaryExpr { left, op, right }) = &e else {
                return Ok(Transformed::no(e));
            };
            let (Ok(l), Ok(r)) = (left.get_type(schema), right.get_type(schema)) else {
                return Ok(Transformed::no(e));
            };
            let op = match op {
                Operator::Plus if checked_int(&l) && l == r => Op::Add,
                Operator::Minus if checked_int(&l) && l == r => Op::Sub,
                Operator::Multiply if checked_int(&l) && l == r => Op::Mul,
                Operator::Divide if l.is_floating() && l == r => Op::Div,
                _ => return Ok(Transformed::no(e)),
            };
            let Expr::BinaryExpr(BinaryExpr { left, right, .. }) = e else {
                unreachable!("matched above");
            };
            let udf = ScalarUDF::new_from_impl(Arith::new(op));
            Ok(Transformed::yes(udf.call(vec![*left, *right])))
        })
    }

    fn name(&self) -> &str {
        "eddy_checked_arithmetic"
    }
}

fn checked_int(t: &DataType) -> bool {
    matches!(t, DataType::Int16 | DataType::Int32 | DataType::Int64)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Add,
    Sub,
    Mul,
    Div,
}

/// One checked operator, over two operands of one type.
#[derive(PartialEq, Eq, Hash)]
struct Arith {
    op: Op,
    signature: Signature,
}

impl fmt::Debug for Arith {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())
    }
}

impl Arith {
    fn new(op: Op) -> Arith {
        Arith {
            op,
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for Arith {
    fn name(&self) -> &str {
        match self.op {
            Op::Add => "eddy_checked_add",
            Op::Sub => "eddy_checked_sub",
            Op::Mul => "eddy_checked_mul",
            Op::Div => "eddy_checked_div",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(args[0].clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let (l, r) = (&arrays[0], &arrays[1]);
        let out = match self.op {
            Op::Add => numeric::add(l, r),
            Op::Sub => numeric::sub(l, r),
            Op::Mul => numeric::mul(l, r),
            Op::Div => {
                if has_zero(r) {
                    return Err(external(ErrorKind::DivisionByZero, "division by zero"));
                }
                numeric::div(l, r)
            }
        };
        let out = out.map_err(|e| match e {
            ArrowError::ArithmeticOverflow(_) => external(
                ErrorKind::NumericOutOfRange,
                &format!("{} out of range", pg_int_name(l.data_type())),
            ),
            e => DataFusionError::ArrowError(Box::new(e), None),
        })?;
        if scalar {
            return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?));
        }
        Ok(ColumnarValue::Array(out))
    }
}

/// Whether a float divisor holds a zero (NULLs aside).
fn has_zero(r: &ArrayRef) -> bool {
    if let Some(a) = r.as_any().downcast_ref::<Float64Array>() {
        return a.iter().any(|v| v == Some(0.0));
    }
    if let Some(a) = r.as_any().downcast_ref::<Float32Array>() {
        return a.iter().any(|v| v == Some(0.0));
    }
    false
}

fn pg_int_name(t: &DataType) -> &'static str {
    match t {
        DataType::Int16 => "smallint",
        DataType::Int32 => "integer",
        _ => "bigint",
    }
}

fn external(kind: ErrorKind, message: &str) -> DataFusionError {
    DataFusionError::External(Box::new(Error::new(kind, message)))
}

/// The analyzer rules of a session: `IntLiterals` before DataFusion's own, `Checked`
/// after them.
pub(super) fn analyzer_rules(
    defaults: &[Arc<dyn AnalyzerRule + Send + Sync>],
) -> Vec<Arc<dyn AnalyzerRule + Send + Sync>> {
    let mut rules: Vec<Arc<dyn AnalyzerRule + Send + Sync>> = vec![Arc::new(IntLiterals)];
    rules.extend(defaults.iter().cloned());
    rules.push(Arc::new(Checked));
    rules
}
