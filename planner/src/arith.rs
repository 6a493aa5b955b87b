//! PostgreSQL's arithmetic over DataFusion expressions, where DataFusion's differs
//! silently; ad-hoc queries (the server's analyzer rules) and metric filters
//! (`filter::Filter::compile`) both use it:
//!
//! - An integer literal is `integer` (int4) when it fits, `bigint` otherwise; DataFusion
//!   makes every one `bigint`. So `2147483647 + 1` overflows, as in PostgreSQL.
//! - Integer `+`, `-` and `*` fail with 22003 (`integer out of range`, `bigint out of
//!   range`, `smallint out of range`) where DataFusion wraps around.
//! - A float divided by zero fails with 22012, where DataFusion gives Infinity or NaN;
//!   float `+`, `-`, `*` and `/` that overflow to infinity fail with 22003.
//! - A cast to an integer type rounds (half to even from a float, half away from zero
//!   from a numeric literal or a decimal) and fails with 22003 out of the type's range,
//!   where DataFusion truncates or fails with its own message; `round` of a float rounds
//!   half to even; `ceil` and `floor` of a decimal have scale 0.
//!
//! [`int_literal`] applies before DataFusion coerces types, so the narrower literals take
//! part in coercion as PostgreSQL's do; [`checked`] once every operand has its final
//! type, turning those operators into calls of checked functions.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Decimal128Array, Float32Array, Float64Array,
};
use datafusion::arrow::compute::kernels::numeric;
use datafusion::arrow::compute::{cast, cast_with_options, CastOptions};
use datafusion::arrow::datatypes::{DataType, Decimal128Type, TimeUnit};
use datafusion::arrow::error::ArrowError;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Expr, ExprSchemable, Operator, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};

use crate::error::{Error, ErrorKind};

/// An integer literal as PostgreSQL types it: int4 when it fits.
pub fn int_literal(e: Expr) -> Transformed<Expr> {
    match e {
        Expr::Literal(ScalarValue::Int64(Some(v)), meta) if i32::try_from(v).is_ok() => {
            Transformed::yes(Expr::Literal(ScalarValue::Int32(Some(v as i32)), meta))
        }
        e => Transformed::no(e),
    }
}

/// `e` (one node, its operands typed against `schema`) with integer `+ - *`, float
/// `/`, casts to integers and `round` of a float as PostgreSQL checks them; a date plus
/// or minus an interval is a timestamp.
pub fn checked(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let call = |op: Op, args: Vec<Expr>| {
        Ok(Transformed::yes(
            ScalarUDF::new_from_impl(Arith::new(op)).call(args),
        ))
    };
    match &e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let (Ok(l), Ok(r)) = (left.get_type(schema), right.get_type(schema)) else {
                return Ok(Transformed::no(e));
            };
            // A date plus or minus an interval is a timestamp in PostgreSQL,
            // whose interval may hold hours; DataFusion keeps the date.
            // (A date plus an integer stays a date: coercion made the integer an
            // interval through a duration of days.)
            let date_interval = |a: &DataType, b: &DataType, b_expr: &Expr| {
                let days = matches!(b_expr, Expr::Cast(c)
                    if matches!(c.expr.get_type(schema), Ok(DataType::Duration(_))));
                *a == DataType::Date32 && matches!(b, DataType::Interval(_)) && !days
            };
            if matches!(op, Operator::Plus | Operator::Minus)
                && (date_interval(&l, &r, right)
                    || (*op == Operator::Plus && date_interval(&r, &l, left)))
            {
                let timestamp = DataType::Timestamp(TimeUnit::Microsecond, None);
                let widen = |side: &Expr, ty: &DataType| match ty {
                    DataType::Date32 => Expr::Cast(datafusion::logical_expr::Cast::new(
                        Box::new(side.clone()),
                        timestamp.clone(),
                    )),
                    _ => side.clone(),
                };
                return Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr::new(
                    Box::new(widen(left, &l)),
                    *op,
                    Box::new(widen(right, &r)),
                ))));
            }
            let op = match op {
                Operator::Plus if checked_type(&l) && l == r => Op::Add,
                Operator::Minus if checked_type(&l) && l == r => Op::Sub,
                Operator::Multiply if checked_type(&l) && l == r => Op::Mul,
                Operator::Divide if l.is_floating() && l == r => Op::Div,
                _ => return Ok(Transformed::no(e)),
            };
            let Expr::BinaryExpr(BinaryExpr { left, right, .. }) = e else {
                unreachable!("matched above");
            };
            call(op, vec![*left, *right])
        }
        Expr::Cast(c) if checked_int(c.field.data_type()) => {
            let Ok(from) = c.expr.get_type(schema) else {
                return Ok(Transformed::no(e));
            };
            let narrower = checked_int(&from) && width(&from) > width(c.field.data_type());
            let decimal = matches!(from, DataType::Decimal128(..));
            if !(from.is_floating() || narrower || decimal) {
                return Ok(Transformed::no(e));
            }
            let half_even = !is_numeric_literal(&c.expr);
            let Expr::Cast(c) = e else {
                unreachable!("matched above");
            };
            call(
                Op::ToInt(c.field.data_type().clone(), half_even),
                vec![*c.expr],
            )
        }
        // ceil and floor of a decimal have scale 0, as a numeric's do (DataFusion keeps
        // the argument's scale: `ceil(2.5::numeric)` printed `3.0000000000`).
        Expr::ScalarFunction(f) if matches!(f.name(), "ceil" | "floor") && f.args.len() == 1 => {
            let Ok(DataType::Decimal128(p, s)) = f.args[0].get_type(schema) else {
                return Ok(Transformed::no(e));
            };
            if s <= 0 {
                return Ok(Transformed::no(e));
            }
            // Rounding may carry into one more digit before the point (99.5 to 100):
            // the argument widens first, as DataFusion's result has its precision.
            let wide = (p + 1).min(38);
            let digits = ((p as i16 - s as i16 + 1).clamp(1, 38)) as u8;
            let Expr::ScalarFunction(mut f) = e else {
                unreachable!("matched above");
            };
            f.args[0] = Expr::Cast(datafusion::logical_expr::Cast::new(
                Box::new(f.args[0].clone()),
                DataType::Decimal128(wide, s),
            ));
            Ok(Transformed::yes(Expr::Cast(
                datafusion::logical_expr::Cast::new(
                    Box::new(Expr::ScalarFunction(f)),
                    DataType::Decimal128(digits, 0),
                ),
            )))
        }
        Expr::ScalarFunction(f)
            if f.name() == "round"
                && f.args.len() == 1
                && !is_numeric_literal(&f.args[0])
                && f.args[0].get_type(schema).is_ok_and(|t| t.is_floating()) =>
        {
            let Expr::ScalarFunction(f) = e else {
                unreachable!("matched above");
            };
            call(Op::Rint, f.args)
        }
        _ => Ok(Transformed::no(e)),
    }
}

/// A float literal, which PostgreSQL reads as `numeric` (Eddy as a float).
fn is_numeric_literal(e: &Expr) -> bool {
    match e {
        Expr::Literal(v, _) => matches!(v, ScalarValue::Float64(_)),
        Expr::Negative(inner) => is_numeric_literal(inner),
        _ => false,
    }
}

fn width(t: &DataType) -> u32 {
    t.primitive_width().unwrap_or(8) as u32
}

fn checked_int(t: &DataType) -> bool {
    matches!(t, DataType::Int16 | DataType::Int32 | DataType::Int64)
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Op {
    Add,
    Sub,
    Mul,
    Div,
    /// To this integer type; half to even (true) or away from zero.
    ToInt(DataType, bool),
    /// `round` of a float: half to even.
    Rint,
}

/// One checked operator, over two operands of one type, or one conversion.
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
        let arity = if matches!(op, Op::ToInt(..) | Op::Rint) {
            1
        } else {
            2
        };
        Arith {
            op,
            signature: Signature::any(arity, Volatility::Immutable),
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
            Op::ToInt(DataType::Int16, _) => "eddy_to_int2",
            Op::ToInt(DataType::Int32, _) => "eddy_to_int4",
            Op::ToInt(..) => "eddy_to_int8",
            Op::Rint => "eddy_rint",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match &self.op {
            Op::ToInt(t, _) => Ok(t.clone()),
            _ => Ok(args[0].clone()),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let out = match &self.op {
            Op::ToInt(to, half_even) => to_int(&arrays[0], to, *half_even)?,
            Op::Rint => {
                let f = cast(&arrays[0], &DataType::Float64)?;
                let f = f.as_any().downcast_ref::<Float64Array>().expect("cast");
                let out: Float64Array = f.unary(f64::round_ties_even);
                cast(&out, arrays[0].data_type())?
            }
            op => {
                let (l, r) = (&arrays[0], &arrays[1]);
                let out = match op {
                    Op::Add => numeric::add(l, r),
                    Op::Sub => numeric::sub(l, r),
                    Op::Mul => numeric::mul(l, r),
                    _ => {
                        if has_zero(l, r) {
                            return Err(external(ErrorKind::DivisionByZero, "division by zero"));
                        }
                        numeric::div(l, r)
                    }
                };
                let out = out.map_err(|e| match e {
                    ArrowError::ArithmeticOverflow(_) => out_of_range(l.data_type()),
                    e => DataFusionError::ArrowError(Box::new(e), None),
                })?;
                if float_overflow(l, r, &out) {
                    return Err(external(
                        ErrorKind::NumericOutOfRange,
                        "value out of range: overflow",
                    ));
                }
                out
            }
        };
        if scalar {
            return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?));
        }
        Ok(ColumnarValue::Array(out))
    }
}

/// Integers, whose overflow fails, and floats, whose overflow to infinity fails.
fn checked_type(t: &DataType) -> bool {
    checked_int(t) || t.is_floating()
}

/// Whether a float operation of finite operands gave an infinity somewhere. The operands
/// are looked at only where the result holds an infinity.
fn float_overflow(l: &ArrayRef, r: &ArrayRef, out: &ArrayRef) -> bool {
    let floats = |a: &ArrayRef| -> Option<Float64Array> {
        let a = cast(a, &DataType::Float64).ok()?;
        a.as_any().downcast_ref::<Float64Array>().cloned()
    };
    if !out.data_type().is_floating() {
        return false;
    }
    let Some(out) = floats(out) else {
        return false;
    };
    if !out.iter().flatten().any(f64::is_infinite) {
        return false;
    }
    let (Some(l), Some(r)) = (floats(l), floats(r)) else {
        return false;
    };
    out.iter()
        .zip(l.iter().zip(r.iter()))
        .any(|(o, (a, b))| match (o, a, b) {
            (Some(o), Some(a), Some(b)) => o.is_infinite() && a.is_finite() && b.is_finite(),
            _ => false,
        })
}

/// Whether a float divisor holds a zero where the dividend is not NULL (NULL / 0 is
/// NULL, as in PostgreSQL).
fn has_zero(l: &ArrayRef, r: &ArrayRef) -> bool {
    let zero_at = |zero: &dyn Fn(usize) -> bool| (0..r.len()).any(|i| zero(i) && l.is_valid(i));
    if let Some(a) = r.as_any().downcast_ref::<Float64Array>() {
        return zero_at(&|i| a.is_valid(i) && a.value(i) == 0.0);
    }
    if let Some(a) = r.as_any().downcast_ref::<Float32Array>() {
        return zero_at(&|i| a.is_valid(i) && a.value(i) == 0.0);
    }
    false
}

/// `a` as integer type `to`: rounded first if it is a float (half to even, or away from
/// zero) or a decimal (away from zero, as a numeric is), and 22003 for a value out of
/// `to`'s range (Arrow's unsafe cast fails where a safe one would give NULL).
fn to_int(a: &ArrayRef, to: &DataType, half_even: bool) -> Result<ArrayRef> {
    let rounded;
    let from = match a.data_type() {
        t if t.is_floating() => {
            let f = cast(a, &DataType::Float64)?;
            let f = f.as_any().downcast_ref::<Float64Array>().expect("cast");
            let r: Float64Array = f.unary(|v| match half_even {
                true => v.round_ties_even(),
                false => v.round(),
            });
            rounded = Arc::new(r) as ArrayRef;
            &rounded
        }
        DataType::Decimal128(_, scale) if *scale > 0 => {
            let unit = 10i128.pow(*scale as u32);
            let d = a.as_primitive::<Decimal128Type>();
            let r: Decimal128Array = d.unary(|v| {
                let (q, rem) = (v / unit, v % unit);
                match rem.abs() * 2 >= unit {
                    true => q + v.signum(),
                    false => q,
                }
            });
            rounded = Arc::new(r.with_precision_and_scale(38, 0)?) as ArrayRef;
            &rounded
        }
        _ => a,
    };
    let strict = CastOptions {
        safe: false,
        ..Default::default()
    };
    cast_with_options(from, to, &strict).map_err(|_| out_of_range(to))
}

fn out_of_range(t: &DataType) -> DataFusionError {
    external(
        ErrorKind::NumericOutOfRange,
        &format!("{} out of range", pg_int_name(t)),
    )
}

fn pg_int_name(t: &DataType) -> &'static str {
    match t {
        DataType::Int16 => "smallint",
        DataType::Int32 => "integer",
        _ => "bigint",
    }
}

pub fn external(kind: ErrorKind, message: &str) -> DataFusionError {
    DataFusionError::External(Box::new(Error::new(kind, message)))
}
