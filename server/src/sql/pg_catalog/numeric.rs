//! PostgreSQL's `numeric` in ad-hoc queries: exact decimals, each value with its own
//! scale, where DataFusion has only floats and fixed-scale decimals. `0.1 + 0.2` is
//! `0.3`, `2.50` prints as written, `7.0 / 2` is `3.5000000000000000`, and the average of
//! an integer column is a numeric with PostgreSQL's digits.
//!
//! A numeric is a text field marked `eddy.pg_type = numeric` (as JSON is, `json.rs`),
//! holding PostgreSQL's output text; the arithmetic is `bigdecimal`'s, with PostgreSQL's
//! result scales (`div_scale` is its `select_div_scale`).
//!
//! Where a numeric may appear is decided on the statement's syntax ([`literals`]): in the
//! outermost SELECT's items, a decimal literal, a cast to numeric, `sum`/`avg`/variance
//! of a column and `round`, `trunc`, `abs`, `ceil`, `floor`, `sign`, `sqrt` and `exp` are
//! numeric, through operators, these functions, comparisons and casts to text. Anywhere
//! else (WHERE, subqueries, other functions' arguments) a decimal literal stays a float,
//! as before. The operators are planned by [`NumericPlanner`]: numeric with an integer or
//! numeric is exact, with a float it is a float; ORDER BY a numeric orders by its value
//! (`NumericOrder`).

use std::collections::HashSet;
use std::hash::Hash;
use std::str::FromStr;
use std::sync::Arc;

use bigdecimal::{BigDecimal, RoundingMode, Signed, ToPrimitive, Zero};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Int64Type};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::planner::{ExprPlanner, PlannerResult, RawBinaryExpr};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, Expr, ExprSchemable, LogicalPlan,
    ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, SortExpr,
    TypeSignature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    self, BinaryOperator, Expr as Ast, FunctionArg, FunctionArgExpr, FunctionArguments, SelectItem,
    SetExpr, Statement, UnaryOperator, Value,
};

use eddy_planner::ErrorKind;

use super::arith::external;
use super::json::PG_TYPE;

/// The [`PG_TYPE`] of a numeric field.
const NUMERIC: &str = "numeric";

/// PostgreSQL's fewest significant digits of a quotient (`NUMERIC_MIN_SIG_DIGITS`).
const MIN_SIG_DIGITS: i64 = 16;

/// Whether `field` holds numerics.
pub fn is_numeric(field: &Field) -> bool {
    field.metadata().get(PG_TYPE).map(String::as_str) == Some(NUMERIC)
}

/// A text field of numerics.
pub fn numeric_field(name: &str) -> Field {
    Field::new(name, DataType::Utf8, true).with_metadata(
        [(PG_TYPE.to_string(), NUMERIC.to_string())]
            .into_iter()
            .collect(),
    )
}

// ---- Values --------------------------------------------------------------------------

fn invalid(text: &str) -> DataFusionError {
    external(
        ErrorKind::InvalidText,
        &format!("invalid input syntax for type numeric: \"{text}\""),
    )
}

fn out_of_range() -> DataFusionError {
    external(ErrorKind::NumericOutOfRange, "value out of range: overflow")
}

/// `text` as PostgreSQL's `numeric_in` reads it: the scale is the digits written after
/// the point, less the exponent, and never below 0.
pub fn parse(text: &str) -> Result<BigDecimal> {
    let t = text.trim();
    let ok = !t.is_empty()
        && t.chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'));
    let d = match ok {
        true => BigDecimal::from_str(t).map_err(|_| invalid(text))?,
        false => return Err(invalid(text)),
    };
    Ok(at_least_scale_0(d))
}

fn at_least_scale_0(d: BigDecimal) -> BigDecimal {
    match d.fractional_digit_count() < 0 {
        true => d.with_scale(0),
        false => d,
    }
}

/// PostgreSQL's text of `d`: plain digits, as many after the point as its scale, and no
/// sign on a zero (`ceil(-0.5)` is `0`, where bigdecimal's rounding printed `-0`).
pub fn text(d: &BigDecimal) -> String {
    match d.is_zero() {
        true => BigDecimal::zero().with_scale(scale(d)).to_plain_string(),
        false => d.to_plain_string(),
    }
}

fn scale(d: &BigDecimal) -> i64 {
    d.fractional_digit_count().max(0)
}

/// PostgreSQL's weight of `d` (the power of 10000 of its first non-zero base-10000
/// digit) and that digit; `(0, 0)` for zero.
fn weight(d: &BigDecimal) -> (i64, u32) {
    if d.is_zero() {
        return (0, 0);
    }
    let (int, sc) = d.as_bigint_and_exponent();
    let point = d.digits() as i64 - 1 - sc;
    let w = point.div_euclid(4);
    let first = BigDecimal::new(int.abs(), sc + 4 * w)
        .with_scale(0)
        .to_u32()
        .unwrap_or(0);
    (w, first)
}

/// The scale of `a / b` (PostgreSQL's `select_div_scale`): at least 16 significant
/// digits, and no fewer than either operand's scale.
fn div_scale(a: &BigDecimal, b: &BigDecimal) -> i64 {
    let (w1, f1) = weight(a);
    let (w2, f2) = weight(b);
    let mut q = w1 - w2;
    if f1 <= f2 {
        q -= 1;
    }
    (MIN_SIG_DIGITS - q * 4)
        .max(scale(a))
        .max(scale(b))
        .clamp(0, 1000)
}

fn round(d: &BigDecimal, scale: i64) -> BigDecimal {
    d.with_scale_round(scale, RoundingMode::HalfUp)
}

pub fn div(a: &BigDecimal, b: &BigDecimal) -> Result<BigDecimal> {
    if b.is_zero() {
        return Err(external(ErrorKind::DivisionByZero, "division by zero"));
    }
    Ok(round(&(a / b), div_scale(a, b)))
}

/// The numeric of a float as PostgreSQL converts it: its shortest text of 15 (float4: 6)
/// significant digits.
fn of_float(f: f64, digits: usize) -> Result<BigDecimal> {
    if !f.is_finite() {
        return Err(external(
            ErrorKind::Unsupported,
            "cannot convert NaN or infinity to numeric",
        ));
    }
    let d = BigDecimal::from_str(&format!("{:.*e}", digits - 1, f)).map_err(|_| out_of_range())?;
    Ok(at_least_scale_0(d.normalized()))
}

/// A value as a numeric: numerics and text read, integers, decimals and floats
/// converted; `None` for NULL.
fn value(v: &ScalarValue) -> Result<Option<BigDecimal>> {
    Ok(Some(match v {
        v if v.is_null() => return Ok(None),
        ScalarValue::Utf8(Some(s))
        | ScalarValue::Utf8View(Some(s))
        | ScalarValue::LargeUtf8(Some(s)) => parse(s)?,
        ScalarValue::Float64(Some(f)) => of_float(*f, 15)?,
        ScalarValue::Float32(Some(f)) => of_float(*f as f64, 6)?,
        ScalarValue::Decimal128(Some(v), _, s) => BigDecimal::new((*v).into(), *s as i64),
        v if v.data_type().is_integer() => match v.cast_to(&DataType::Int64)? {
            ScalarValue::Int64(Some(i)) => BigDecimal::from(i),
            _ => return Err(out_of_range()),
        },
        v => {
            return Err(external(
                ErrorKind::DatatypeMismatch,
                &format!("cannot cast type {} to numeric", v.data_type()),
            ))
        }
    }))
}

fn numeric(d: Option<BigDecimal>) -> ScalarValue {
    ScalarValue::Utf8(d.map(|d| text(&d)))
}

fn to_f64(d: &BigDecimal) -> f64 {
    text(d).parse().unwrap_or(f64::NAN)
}

// ---- Scalar functions ------------------------------------------------------------------

/// What a numeric function returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Returns {
    Numeric,
    Bool,
}

type Eval = fn(&[BigDecimal]) -> Result<BigDecimal>;
type Compare = fn(std::cmp::Ordering) -> bool;

/// A function's float form, for float (or, where PostgreSQL prefers float8, integer)
/// arguments.
#[derive(Clone, Copy)]
enum Float {
    /// PostgreSQL has none: the arguments are read as numerics.
    None,
    /// Of the first argument alone. With more arguments there is none, and a float first
    /// argument is an error (`round(x, 2)` needs a numeric).
    Unary(fn(f64) -> Result<f64>),
    /// Of two arguments (`power`).
    Binary(fn(f64, f64) -> Result<f64>),
}

#[derive(Clone, Copy)]
enum Body {
    Numeric(Eval, Float),
    Compare(Compare),
}

/// A numeric function or operator, evaluated row by row; NULL in, NULL out.
struct NumericFunction {
    name: &'static str,
    signature: Signature,
    body: Body,
}

identified_by_name!(NumericFunction);

/// The name `format_type` gives an Arrow type's PostgreSQL type.
pub(super) fn type_name(t: &DataType) -> &'static str {
    let oid = crate::session::cells::pg_type_of_arrow(t).oid();
    super::functions::type_display(oid as i32).unwrap_or("unknown")
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
}

impl NumericFunction {
    fn returns(&self) -> Returns {
        match self.body {
            Body::Numeric(..) => Returns::Numeric,
            Body::Compare(_) => Returns::Bool,
        }
    }

    /// The float form that applies to `args`: none where an argument is a numeric or
    /// not a number.
    fn float_form(&self, args: &[FieldRef]) -> Result<Float> {
        let Body::Numeric(_, float) = self.body else {
            return Ok(Float::None);
        };
        // PostgreSQL converts numerics to float8 where an argument is a float, and
        // prefers float8 for integers alone.
        let float_arg = |a: &FieldRef| !is_numeric(a) && is_float(a.data_type());
        let number = |a: &FieldRef| is_numeric(a) || a.data_type().is_integer() || float_arg(a);
        let floats = args.iter().any(float_arg) || !args.iter().any(|a| is_numeric(a));
        if args.is_empty() || !args.iter().all(number) || !floats {
            return Ok(Float::None);
        }
        match (float, args.len()) {
            (Float::Unary(_), 1) | (Float::Binary(_), 2) => Ok(float),
            (Float::Unary(_), _) if is_float(args[0].data_type()) => {
                let name = self.name.trim_start_matches("pg_numeric_");
                let types: Vec<&str> = args.iter().map(|a| type_name(a.data_type())).collect();
                let message = format!("function {name}({}) does not exist", types.join(", "));
                let hint = format!(
                    "{name} of a float with more arguments takes a numeric: {name}(x::numeric, …)."
                );
                Err(DataFusionError::External(Box::new(
                    eddy_planner::Error::new(ErrorKind::UndefinedFunction, message).with_hint(hint),
                )))
            }
            _ => Ok(Float::None),
        }
    }
}

impl ScalarUDFImpl for NumericFunction {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(match self.returns() {
            Returns::Bool => DataType::Boolean,
            Returns::Numeric => DataType::Utf8,
        })
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        Ok(Arc::new(
            match (self.returns(), self.float_form(args.arg_fields)?) {
                (Returns::Bool, _) => Field::new(self.name, DataType::Boolean, true),
                (Returns::Numeric, Float::None) => numeric_field(self.name),
                (Returns::Numeric, _) => Field::new(self.name, DataType::Float64, true),
            },
        ))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let returns = args.return_field.data_type().clone();
        let float = self.float_form(&args.arg_fields)?;
        let body = self.body;
        super::functions::row_by_row(&args, &returns, &|scalars| {
            if !matches!(float, Float::None) {
                let mut x = [0.0; 2];
                for (x, s) in x.iter_mut().zip(scalars) {
                    match s.cast_to(&DataType::Float64)? {
                        ScalarValue::Float64(Some(v)) => *x = v,
                        _ => return Ok(ScalarValue::Float64(None)),
                    }
                }
                let r = match float {
                    Float::Unary(f) => f(x[0])?,
                    Float::Binary(f) => f(x[0], x[1])?,
                    Float::None => unreachable!("checked above"),
                };
                return Ok(ScalarValue::Float64(Some(r)));
            }
            let mut values = Vec::with_capacity(scalars.len());
            for s in scalars {
                match value(s)? {
                    Some(v) => values.push(v),
                    None => return ScalarValue::try_from(&returns),
                }
            }
            Ok(match body {
                Body::Numeric(eval, _) => numeric(Some(eval(&values)?)),
                Body::Compare(cmp) => ScalarValue::Boolean(Some(cmp(values[0].cmp(&values[1])))),
            })
        })
    }
}

fn udf(name: &'static str, arities: &[usize], body: Body) -> ScalarUDF {
    let signature = Signature::one_of(
        arities.iter().map(|n| TypeSignature::Any(*n)).collect(),
        Volatility::Immutable,
    );
    ScalarUDF::new_from_impl(NumericFunction {
        name,
        signature,
        body,
    })
}

/// The scale argument of `round(n, s)` and `trunc(n, s)`: 0 when absent.
fn scale_arg(a: &[BigDecimal]) -> Result<i64> {
    match a.get(1) {
        None => Ok(0),
        Some(s) => s.to_i64().ok_or_else(out_of_range),
    }
}

/// `sqrt`'s and `exp`'s result scale: `digits_before` is how many digits the result has
/// before the point, less one.
fn sig_scale(digits_before: i64, arg: &BigDecimal) -> i64 {
    (MIN_SIG_DIGITS - digits_before)
        .max(scale(arg))
        .clamp(0, 1000)
}

fn negative_sqrt() -> DataFusionError {
    external(
        ErrorKind::InvalidPowerArgument,
        "cannot take square root of a negative number",
    )
}

/// PostgreSQL's largest display scale (`NUMERIC_MAX_DISPLAY_SCALE`).
const MAX_SCALE: i64 = 1000;

/// A result scale as PostgreSQL chooses it for `ln`, `log` and `power`: 16 significant
/// digits after `dweight` (the result's estimated decimal weight), and no fewer than any
/// argument's scale.
fn result_scale(dweight: i64, args: &[&BigDecimal]) -> i64 {
    args.iter()
        .fold(MIN_SIG_DIGITS - dweight, |s, a| s.max(scale(a)))
        .clamp(0, MAX_SCALE)
}

/// `d` as a float, for estimates: a mantissa and a decimal exponent, so that numbers
/// past a float's range still give their logarithm.
fn log10_estimate(d: &BigDecimal) -> f64 {
    let (int, sc) = d.as_bigint_and_exponent();
    let digits = int.to_string();
    let digits = digits.trim_start_matches('-');
    let lead: f64 = format!("0.{}", &digits[..digits.len().min(17)])
        .parse()
        .unwrap_or(0.0);
    lead.log10() + (digits.len() as i64 - sc) as f64
}

/// PostgreSQL's `estimate_ln_dweight`: the decimal weight of `ln(d)`, for `d > 0`.
fn ln_dweight(d: &BigDecimal) -> i64 {
    let one = BigDecimal::from(1);
    let x = d - &one;
    if x.abs() <= BigDecimal::new(1.into(), 1) {
        if x.is_zero() {
            return 0;
        }
        return log10_estimate(&x.abs()).floor() as i64;
    }
    let ln = log10_estimate(d) * std::f64::consts::LN_10;
    ln.abs().log10() as i64
}

fn context(digits: i64) -> bigdecimal::Context {
    bigdecimal::Context::default()
        .with_prec(digits.clamp(20, 4 * MAX_SCALE))
        .expect("a positive precision")
}

/// `ln(d)` for `d > 0`, correct to `scale` decimal places and a few more: square roots
/// bring `d` within 10% of 1, then the series of `2·atanh((y − 1)/(y + 1))`.
fn ln(d: &BigDecimal, scale: i64) -> BigDecimal {
    let one = BigDecimal::from(1);
    let (low, high) = (BigDecimal::new(9.into(), 1), BigDecimal::new(11.into(), 1));
    // Each root doubles the error of the result; a root's count is about log2 of ln(d).
    let roots = (log10_estimate(d).abs() * std::f64::consts::LN_10 * 10.0)
        .max(1.0)
        .log2()
        .ceil() as i64;
    let work = scale.max(0) + 10 + roots;
    let ctx = context(work + log10_estimate(d).abs() as i64 + 10);
    let mut y = d.clone();
    let mut factor = 1i64;
    while y < low || y > high {
        y = y.sqrt_with_context(&ctx).expect("a positive number");
        factor *= 2;
    }
    let z = ctx.multiply(&(&y - &one), &ctx.invert(&(&y + &one)));
    let z2 = (&z * &z).with_scale_round(work, RoundingMode::HalfEven);
    let mut power = z.with_scale_round(work, RoundingMode::HalfEven);
    let mut sum = power.clone();
    let epsilon = BigDecimal::new(1.into(), work);
    let mut k = 1u64;
    loop {
        power = (&power * &z2).with_scale_round(work, RoundingMode::HalfEven);
        if power.abs() < epsilon {
            break;
        }
        k += 2;
        let (int, sc) = power.as_bigint_and_exponent();
        sum += BigDecimal::new(int / k, sc);
    }
    sum * BigDecimal::from(2 * factor)
}

fn log_argument(d: &BigDecimal) -> Result<()> {
    match d.sign() {
        bigdecimal::num_bigint::Sign::Plus => Ok(()),
        bigdecimal::num_bigint::Sign::NoSign => Err(external(
            ErrorKind::InvalidLogArgument,
            "cannot take logarithm of zero",
        )),
        bigdecimal::num_bigint::Sign::Minus => Err(external(
            ErrorKind::InvalidLogArgument,
            "cannot take logarithm of a negative number",
        )),
    }
}

/// PostgreSQL's `numeric_ln`.
fn numeric_ln(d: &BigDecimal) -> Result<BigDecimal> {
    log_argument(d)?;
    let rscale = result_scale(ln_dweight(d), &[d]);
    Ok(round(&ln(d, rscale + 4), rscale))
}

/// PostgreSQL's `log(b, x)`: `ln(x) / ln(b)`.
fn numeric_log(base: &BigDecimal, x: &BigDecimal) -> Result<BigDecimal> {
    log_argument(base)?;
    log_argument(x)?;
    let rscale = result_scale(ln_dweight(x) - ln_dweight(base), &[base, x]);
    let work = rscale + 10 + ln_dweight(base).abs();
    let ln_base = ln(base, work);
    if ln_base
        .with_scale_round(work, RoundingMode::HalfEven)
        .is_zero()
    {
        return Err(external(ErrorKind::DivisionByZero, "division by zero"));
    }
    let ctx = context(work + ln_dweight(x).abs() + 10);
    Ok(round(
        &ctx.multiply(&ln(x, work), &ctx.invert(&ln_base)),
        rscale,
    ))
}

/// PostgreSQL's `numeric_power` (15's `power_var`): an integer exponent by repeated
/// products, any other through `exp(y · ln(x))`.
fn numeric_power(x: &BigDecimal, y: &BigDecimal) -> Result<BigDecimal> {
    let power_error = |m: &str| external(ErrorKind::InvalidPowerArgument, m);
    if x.is_zero() && y.is_negative() {
        return Err(power_error("zero raised to a negative power is undefined"));
    }
    if x.is_negative() && !y.is_integer() {
        return Err(power_error(
            "a negative number raised to a non-integer power yields a complex result",
        ));
    }
    if let Some(n) = y.is_integer().then(|| y.to_i32()).flatten() {
        let rscale = MIN_SIG_DIGITS.max(scale(x)).clamp(0, MAX_SCALE);
        if n == 0 {
            return Ok(BigDecimal::from(1).with_scale(rscale));
        }
        let weight = match x.is_zero() {
            true => 0.0,
            false => n as f64 * log10_estimate(&x.abs()),
        };
        if weight > 131072.0 {
            return Err(out_of_range());
        }
        if weight < -(MAX_SCALE as f64) - 2.0 {
            return Ok(BigDecimal::zero().with_scale(rscale));
        }
        let ctx = context(rscale + weight.abs().ceil() as i64 + 20);
        return Ok(round(&x.powi_with_context(n as i64, &ctx), rscale));
    }
    if x.is_zero() {
        return Ok(BigDecimal::zero().with_scale(MIN_SIG_DIGITS));
    }
    let dweight = ln_dweight(x);
    let estimate = to_f64(y) * log10_estimate(x) * std::f64::consts::LN_10;
    if estimate.abs() > MAX_SCALE as f64 * 3.01 {
        return Err(out_of_range());
    }
    let weight = estimate * std::f64::consts::LOG10_E;
    let rscale = result_scale(weight as i64, &[x, y]);
    let digits = (rscale + weight as i64).max(0);
    let work = digits - dweight + 8 + scale(y);
    let ctx = context(digits + 20 + weight.abs() as i64);
    let exponent = ctx.multiply(&ln(x, work), y);
    Ok(round(&exponent.exp_with_context(&ctx), rscale))
}

/// The cube root as glibc's `cbrt` computes it, which PostgreSQL's `dcbrt` calls: a
/// polynomial first guess on the mantissa, one rational refinement, and the exponent's
/// third. It is not correctly rounded (`cbrt(27)` is 3.0000000000000004), and Rust's
/// own is, so PostgreSQL's answers need this one.
// glibc's constants, digit for digit (`sysdeps/ieee754/dbl-64/s_cbrt.c`).
#[allow(clippy::excessive_precision)]
fn c_cbrt(x: f64) -> f64 {
    const CBRT2: f64 = 1.259_921_049_894_873_164_8;
    const SQR_CBRT2: f64 = 1.587_401_051_968_199_474_8;
    const FACTOR: [f64; 5] = [1.0 / SQR_CBRT2, 1.0 / CBRT2, 1.0, CBRT2, SQR_CBRT2];
    if x == 0.0 || !x.is_finite() {
        return x + x;
    }
    let (xm, xe) = frexp(x.abs());
    let u = 0.354_895_765_043_919_860
        + (1.508_191_937_815_848_96
            + (-2.114_994_941_673_712_87
                + (2.446_931_225_635_344_30
                    + (-1.834_692_774_836_130_86
                        + (0.784_932_344_976_639_262 - 0.145_263_899_385_486_377 * xm) * xm)
                        * xm)
                    * xm)
                * xm)
            * xm;
    let t2 = u * u * u;
    let ym = u * (t2 + 2.0 * xm) / (2.0 * t2 + xm) * FACTOR[(2 + xe % 3) as usize];
    let ym = if x > 0.0 { ym } else { -ym };
    ym * 2f64.powi(xe / 3)
}

/// C's `frexp` for a finite, non-zero `x`: `x = m · 2^e` with `0.5 <= |m| < 1`.
fn frexp(x: f64) -> (f64, i32) {
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    if exp == 0 {
        // Subnormal: scale into the normal range first.
        let (m, e) = frexp(x * 2f64.powi(54));
        return (m, e - 54);
    }
    let m = f64::from_bits((bits & !(0x7ff << 52)) | (1022 << 52));
    (m, exp - 1022)
}

/// PostgreSQL's `dpow`: its errors, and 22003 where the result overflows.
fn float_power(x: f64, y: f64) -> Result<f64> {
    if x == 0.0 && y < 0.0 {
        return Err(external(
            ErrorKind::InvalidPowerArgument,
            "zero raised to a negative power is undefined",
        ));
    }
    if x < 0.0 && y.fract() != 0.0 {
        return Err(external(
            ErrorKind::InvalidPowerArgument,
            "a negative number raised to a non-integer power yields a complex result",
        ));
    }
    match x.powf(y) {
        r if r.is_infinite() && x.is_finite() && y.is_finite() => Err(out_of_range()),
        r => Ok(r),
    }
}

/// PostgreSQL's `dlog1` and `dlog10`: 2201E for zero and negative numbers.
fn float_log(x: f64, log: fn(f64) -> f64) -> Result<f64> {
    match x {
        0.0 => Err(external(
            ErrorKind::InvalidLogArgument,
            "cannot take logarithm of zero",
        )),
        x if x < 0.0 => Err(external(
            ErrorKind::InvalidLogArgument,
            "cannot take logarithm of a negative number",
        )),
        x => Ok(log(x)),
    }
}

fn functions() -> Vec<ScalarUDF> {
    use std::cmp::Ordering;
    let numeric = |e: Eval| Body::Numeric(e, Float::None);
    let mut functions = vec![
        udf("pg_numeric", &[1], numeric(|a| Ok(a[0].clone()))),
        // numeric(p, s): rounded to s digits, at most p − s before the point.
        udf(
            "pg_numeric_typmod",
            &[3],
            numeric(|a| {
                let p = a[1].to_i64().ok_or_else(out_of_range)?;
                let s = a[2].to_i64().ok_or_else(out_of_range)?;
                let r = round(&a[0], s);
                let limit = BigDecimal::new(1.into(), s - p);
                match r.abs() >= limit {
                    true => Err(external(
                        ErrorKind::NumericOutOfRange,
                        "numeric field overflow",
                    )),
                    false => Ok(r),
                }
            }),
        ),
        udf("pg_numeric_add", &[2], numeric(|a| Ok(&a[0] + &a[1]))),
        udf("pg_numeric_sub", &[2], numeric(|a| Ok(&a[0] - &a[1]))),
        udf(
            "pg_numeric_mul",
            &[2],
            numeric(|a| Ok((&a[0] * &a[1]).with_scale(scale(&a[0]) + scale(&a[1])))),
        ),
        udf("pg_numeric_div", &[2], numeric(|a| div(&a[0], &a[1]))),
        // div(y, x): the integer quotient, truncated toward zero. PostgreSQL has it for
        // numerics alone, so integers and floats are read as numerics. The remainder is
        // exact, so the quotient of what is left is a whole number.
        udf(
            "div",
            &[2],
            numeric(|a| match a[1].is_zero() {
                true => Err(external(ErrorKind::DivisionByZero, "division by zero")),
                false => {
                    Ok(((&a[0] - &a[0] % &a[1]) / &a[1]).with_scale_round(0, RoundingMode::Down))
                }
            }),
        ),
        udf(
            "pg_numeric_mod",
            &[2],
            numeric(|a| match a[1].is_zero() {
                true => Err(external(ErrorKind::DivisionByZero, "division by zero")),
                false => Ok((&a[0] % &a[1]).with_scale(scale(&a[0]).max(scale(&a[1])))),
            }),
        ),
        udf(
            "pg_numeric_round",
            &[1, 2],
            Body::Numeric(
                |a| Ok(round(&a[0], scale_arg(a)?).with_scale(scale_arg(a)?.max(0))),
                Float::Unary(|x| Ok(x.round_ties_even())),
            ),
        ),
        udf(
            "pg_numeric_trunc",
            &[1, 2],
            Body::Numeric(
                |a| {
                    let s = scale_arg(a)?;
                    Ok(a[0]
                        .with_scale_round(s, RoundingMode::Down)
                        .with_scale(s.max(0)))
                },
                Float::Unary(|x| Ok(x.trunc())),
            ),
        ),
        udf(
            "pg_numeric_abs",
            &[1],
            Body::Numeric(|a| Ok(a[0].abs()), Float::Unary(|x| Ok(x.abs()))),
        ),
        udf(
            "pg_numeric_ceil",
            &[1],
            Body::Numeric(
                |a| Ok(a[0].with_scale_round(0, RoundingMode::Ceiling)),
                Float::Unary(|x| Ok(x.ceil())),
            ),
        ),
        udf(
            "pg_numeric_floor",
            &[1],
            Body::Numeric(
                |a| Ok(a[0].with_scale_round(0, RoundingMode::Floor)),
                Float::Unary(|x| Ok(x.floor())),
            ),
        ),
        udf(
            "pg_numeric_sign",
            &[1],
            Body::Numeric(
                |a| Ok(BigDecimal::from(a[0].signum().to_i64().unwrap_or(0))),
                Float::Unary(|x| Ok(if x == 0.0 { 0.0 } else { x.signum() })),
            ),
        ),
        udf(
            "pg_numeric_sqrt",
            &[1],
            Body::Numeric(
                |a| {
                    let r = a[0].sqrt().ok_or_else(negative_sqrt)?;
                    // PostgreSQL's estimate of the root's weight, in decimal digits.
                    let (w, _) = weight(&a[0]);
                    Ok(round(&r, sig_scale((w + 1) * 4 / 2 - 1, &a[0])))
                },
                Float::Unary(|x| match x < 0.0 {
                    true => Err(negative_sqrt()),
                    false => Ok(x.sqrt()),
                }),
            ),
        ),
        udf(
            "pg_numeric_exp",
            &[1],
            Body::Numeric(
                |a| {
                    let x = to_f64(&a[0]);
                    // e^2303 is past numeric's 1000 digits.
                    if x > 2303.0 {
                        return Err(out_of_range());
                    }
                    let digits = (x.max(-2303.0) * std::f64::consts::LOG10_E) as i64;
                    Ok(round(&a[0].exp(), sig_scale(digits, &a[0])))
                },
                Float::Unary(|x| match x.exp() {
                    r if r.is_infinite() => Err(out_of_range()),
                    r => Ok(r),
                }),
            ),
        ),
    ];
    functions.extend([
        udf(
            "pg_numeric_power",
            &[2],
            Body::Numeric(|a| numeric_power(&a[0], &a[1]), Float::Binary(float_power)),
        ),
        // float8 only, and the C library's, as PostgreSQL's is: `cbrt(27)` is
        // 3.0000000000000004 there, where Rust's own gives 3.
        udf(
            "cbrt",
            &[1],
            Body::Numeric(|a| Ok(a[0].cbrt()), Float::Unary(|x| Ok(c_cbrt(x)))),
        ),
        udf(
            "pg_numeric_ln",
            &[1],
            Body::Numeric(
                |a| numeric_ln(&a[0]),
                Float::Unary(|x| float_log(x, f64::ln)),
            ),
        ),
        udf(
            "pg_numeric_log",
            &[1, 2],
            Body::Numeric(
                |a| match a {
                    [x] => numeric_log(&BigDecimal::from(10), x),
                    _ => numeric_log(&a[0], &a[1]),
                },
                Float::Unary(|x| float_log(x, f64::log10)),
            ),
        ),
    ]);
    let comparisons: [(&'static str, Compare); 6] = [
        ("pg_numeric_eq", |o| o == Ordering::Equal),
        ("pg_numeric_ne", |o| o != Ordering::Equal),
        ("pg_numeric_lt", |o| o == Ordering::Less),
        ("pg_numeric_le", |o| o != Ordering::Greater),
        ("pg_numeric_gt", |o| o == Ordering::Greater),
        ("pg_numeric_ge", |o| o != Ordering::Less),
    ];
    functions.extend(comparisons.map(|(name, cmp)| udf(name, &[2], Body::Compare(cmp))));
    functions
}

/// `pg_typeof(v)`: the PostgreSQL type of `v`'s field, as `format_type` names it.
#[derive(Debug, PartialEq, Eq, Hash)]
struct TypeOf {
    signature: Signature,
}

impl ScalarUDFImpl for TypeOf {
    fn name(&self) -> &str {
        "pg_typeof"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let field = &args.arg_fields[0];
        let name = match field.metadata().get(PG_TYPE) {
            Some(name) => name.as_str(),
            None => type_name(field.data_type()),
        };
        Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(name.into()))))
    }
}

// ---- Aggregates -----------------------------------------------------------------------

/// Which aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Agg {
    Sum,
    Avg,
    Variance { sample: bool, root: bool },
}

/// `sum`, `avg` and the variances as PostgreSQL computes them: exact over integers and
/// numerics (a numeric result, but `sum` of int2/int4 is a bigint); over floats, the
/// variances with PostgreSQL's Youngs–Cramer, the sum compensated, so that it does not
/// depend on the order the partitions' rows arrive in (DataFusion's differ in the last
/// digits).
#[derive(Debug, PartialEq, Eq, Hash)]
struct NumericAggregate {
    name: &'static str,
    agg: Agg,
    signature: Signature,
}

/// How an aggregate reads its input.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Input {
    Float,
    /// int2/int4, whose `sum` is a bigint.
    SmallInt,
    Exact,
}

fn input_of(field: &Field, name: &str) -> Result<Input> {
    let t = field.data_type();
    Ok(
        if is_numeric(field) || matches!(t, DataType::Decimal128(..) | DataType::Null) {
            Input::Exact
        } else if is_float(t) {
            Input::Float
        } else if matches!(
            t,
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::UInt8 | DataType::UInt16
        ) {
            Input::SmallInt
        } else if t.is_integer() {
            Input::Exact
        } else {
            return Err(external(
                ErrorKind::UndefinedFunction,
                &format!("function {name}({}) does not exist", type_name(t)),
            ));
        },
    )
}

impl AggregateUDFImpl for NumericAggregate {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn return_field(&self, args: &[FieldRef]) -> Result<FieldRef> {
        let input = input_of(&args[0], self.name.trim_start_matches("pg_"))?;
        Ok(Arc::new(match (input, self.agg) {
            (Input::Float, _) => Field::new(self.name, DataType::Float64, true),
            (Input::SmallInt, Agg::Sum) => Field::new(self.name, DataType::Int64, true),
            _ => numeric_field(self.name),
        }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        if args.is_distinct {
            return Ok(vec![Arc::new(Field::new_list(
                format!("{}_distinct", args.name),
                Field::new_list_field(args.input_fields[0].data_type().clone(), true),
                true,
            ))]);
        }
        let input = input_of(&args.input_fields[0], self.name)?;
        let t = match input {
            Input::Float => DataType::Float64,
            _ => DataType::Utf8,
        };
        Ok(vec![
            Arc::new(Field::new(
                format!("{}_n", args.name),
                DataType::Int64,
                true,
            )),
            Arc::new(Field::new(format!("{}_sx", args.name), t.clone(), true)),
            Arc::new(Field::new(format!("{}_sxx", args.name), t, true)),
        ])
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let sums = Sums {
            agg: self.agg,
            input: input_of(&args.expr_fields[0], self.name)?,
            n: 0,
            fx: 0.0,
            fxx: 0.0,
            sx: BigDecimal::zero(),
            sxx: BigDecimal::zero(),
        };
        Ok(match args.is_distinct {
            true => Box::new(Distinct {
                sums,
                data_type: args.expr_fields[0].data_type().clone(),
                seen: HashSet::new(),
            }),
            false => Box::new(sums),
        })
    }
}

/// `agg(DISTINCT x)`: the distinct values, summed at the end.
#[derive(Debug)]
struct Distinct {
    /// Empty until the end.
    sums: Sums,
    data_type: DataType,
    seen: HashSet<ScalarValue>,
}

impl Accumulator for Distinct {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let a = &values[0];
        for row in 0..a.len() {
            if a.is_valid(row) {
                self.seen.insert(ScalarValue::try_from_array(a, row)?);
            }
        }
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        if !self.seen.is_empty() {
            let values = ScalarValue::iter_to_array(self.seen.iter().cloned())?;
            self.sums.update_batch(&[values])?;
        }
        self.sums.evaluate()
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.seen.iter().map(ScalarValue::size).sum::<usize>()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let values = match self.seen.is_empty() {
            true => datafusion::arrow::array::new_empty_array(&self.data_type),
            false => ScalarValue::iter_to_array(self.seen.iter().cloned())?,
        };
        Ok(vec![
            datafusion::common::utils::SingleRowListArrayBuilder::new(values).build_list_scalar(),
        ])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let lists = states[0].as_list::<i32>();
        for row in 0..lists.len() {
            if lists.is_valid(row) {
                self.update_batch(&[lists.value(row)])?;
            }
        }
        Ok(())
    }
}

/// An aggregate's running count, sum and sum of squares: floats (`fxx` is Youngs–Cramer's
/// sum of squared deviations for the variances, the sum's compensation for `sum` and
/// `avg`) or exact.
#[derive(Debug)]
struct Sums {
    agg: Agg,
    input: Input,
    n: i64,
    fx: f64,
    fxx: f64,
    sx: BigDecimal,
    sxx: BigDecimal,
}

impl Sums {
    fn squares(&self) -> bool {
        matches!(self.agg, Agg::Variance { .. })
    }

    fn add_float(&mut self, x: f64) {
        self.n += 1;
        if !self.squares() {
            self.add_float_sum(x);
            return;
        }
        self.fx += x;
        if self.n > 1 {
            let n = self.n as f64;
            let tmp = x * n - self.fx;
            self.fxx += tmp * tmp / (n * (n - 1.0));
        }
    }

    /// Neumaier's compensated sum: whatever the rows' order, the sum is within an ulp
    /// of the exact one (`fxx` holds the compensation).
    fn add_float_sum(&mut self, x: f64) {
        let t = self.fx + x;
        self.fxx += match self.fx.abs() >= x.abs() {
            true => (self.fx - t) + x,
            false => (x - t) + self.fx,
        };
        self.fx = t;
    }

    /// Adds a batch of integers, exactly: in i128 while it cannot overflow.
    fn add_ints(&mut self, a: &Int64Array) {
        let (mut n, mut sx, mut sxx) = (0i64, 0i128, 0i128);
        let mut exact = true;
        for v in a.iter().flatten() {
            n += 1;
            let v = v as i128;
            sx += v;
            match v.checked_mul(v).and_then(|q| sxx.checked_add(q)) {
                Some(q) => sxx = q,
                None => exact = false,
            }
        }
        if exact {
            self.n += n;
            self.sx += BigDecimal::from(sx);
            self.sxx += BigDecimal::from(sxx);
        } else {
            for v in a.iter().flatten() {
                self.add_exact(BigDecimal::from(v));
            }
        }
    }

    fn add_exact(&mut self, v: BigDecimal) {
        self.n += 1;
        if self.squares() {
            self.sxx += &v * &v;
        }
        self.sx += v;
    }

    /// PostgreSQL's `numeric_stddev_internal`.
    fn exact_variance(&self, sample: bool, root: bool) -> Result<ScalarValue> {
        let n = BigDecimal::from(self.n);
        let rscale = scale(&self.sx) * 2;
        let square = (&self.sx * &self.sx).with_scale(rscale);
        let numerator = (&n * &self.sxx).with_scale(rscale) - square;
        if numerator <= BigDecimal::zero() {
            return Ok(numeric(Some(BigDecimal::zero())));
        }
        let denominator = match sample {
            true => &n * (&n - BigDecimal::from(1)),
            false => &n * &n,
        };
        let rscale = div_scale(&numerator, &denominator);
        let var = round(&(&numerator / &denominator), rscale);
        Ok(numeric(Some(match root {
            true => round(&var.sqrt().unwrap_or_default(), rscale),
            false => var,
        })))
    }
}

impl Accumulator for Sums {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let a = &values[0];
        match self.input {
            Input::Float => {
                let f = datafusion::arrow::compute::cast(a, &DataType::Float64)?;
                for x in f
                    .as_primitive::<datafusion::arrow::datatypes::Float64Type>()
                    .iter()
                    .flatten()
                {
                    self.add_float(x);
                }
            }
            _ if a.data_type().is_integer() => {
                let i = datafusion::arrow::compute::cast(a, &DataType::Int64)?;
                self.add_ints(i.as_primitive::<Int64Type>());
            }
            _ => {
                for row in 0..a.len() {
                    if let Some(v) = value(&ScalarValue::try_from_array(a, row)?)? {
                        self.add_exact(v);
                    }
                }
            }
        }
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let min = match self.agg {
            Agg::Variance { sample: true, .. } => 2,
            _ => 1,
        };
        let float = self.input == Input::Float;
        if self.n < min {
            return Ok(match float {
                true => ScalarValue::Float64(None),
                false if self.input == Input::SmallInt && self.agg == Agg::Sum => {
                    ScalarValue::Int64(None)
                }
                false => ScalarValue::Utf8(None),
            });
        }
        let n = self.n as f64;
        Ok(match (self.agg, float) {
            (Agg::Sum, true) => ScalarValue::Float64(Some(self.fx + self.fxx)),
            (Agg::Avg, true) => ScalarValue::Float64(Some((self.fx + self.fxx) / n)),
            (Agg::Variance { sample, root }, true) => {
                let var = self.fxx / if sample { n - 1.0 } else { n };
                ScalarValue::Float64(Some(if root { var.sqrt() } else { var }))
            }
            (Agg::Sum, false) if self.input == Input::SmallInt => {
                ScalarValue::Int64(Some(self.sx.to_i64().ok_or_else(out_of_range)?))
            }
            (Agg::Sum, false) => numeric(Some(self.sx.clone())),
            (Agg::Avg, false) => numeric(Some(div(&self.sx, &BigDecimal::from(self.n))?)),
            (Agg::Variance { sample, root }, false) => self.exact_variance(sample, root)?,
        })
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + (self.sx.digits() + self.sxx.digits()) as usize
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(match self.input {
            Input::Float => vec![
                ScalarValue::Int64(Some(self.n)),
                ScalarValue::Float64(Some(self.fx)),
                ScalarValue::Float64(Some(self.fxx)),
            ],
            _ => vec![
                ScalarValue::Int64(Some(self.n)),
                numeric(Some(self.sx.clone())),
                numeric(Some(self.sxx.clone())),
            ],
        })
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let counts = states[0].as_primitive::<Int64Type>();
        for row in 0..counts.len() {
            let n2 = counts.value(row);
            if counts.is_null(row) || n2 == 0 {
                continue;
            }
            match self.input {
                Input::Float => {
                    let sx2 = states[1]
                        .as_primitive::<datafusion::arrow::datatypes::Float64Type>()
                        .value(row);
                    let sxx2 = states[2]
                        .as_primitive::<datafusion::arrow::datatypes::Float64Type>()
                        .value(row);
                    // PostgreSQL's float8_combine.
                    if self.n == 0 {
                        (self.n, self.fx, self.fxx) = (n2, sx2, sxx2);
                    } else if !self.squares() {
                        self.n += n2;
                        self.fxx += sxx2;
                        self.add_float_sum(sx2);
                    } else {
                        let (n1, n2f) = (self.n as f64, n2 as f64);
                        let tmp = self.fx / n1 - sx2 / n2f;
                        let n = n1 + n2f;
                        self.fxx += sxx2 + n1 * n2f * tmp * tmp / n;
                        self.fx += sx2;
                        self.n += n2;
                    }
                }
                _ => {
                    let text = states[1].as_string::<i32>();
                    let squares = states[2].as_string::<i32>();
                    self.n += n2;
                    self.sx += parse(text.value(row))?;
                    self.sxx += parse(squares.value(row))?;
                }
            }
        }
        Ok(())
    }
}

fn aggregate(name: &'static str, agg: Agg) -> AggregateUDF {
    AggregateUDF::new_from_impl(NumericAggregate {
        name,
        agg,
        signature: Signature::any(1, Volatility::Immutable),
    })
}

fn aggregates() -> Vec<AggregateUDF> {
    let var = |sample, root| Agg::Variance { sample, root };
    vec![
        aggregate("pg_sum", Agg::Sum),
        aggregate("pg_avg", Agg::Avg),
        aggregate("pg_variance", var(true, false)),
        aggregate("pg_var_samp", var(true, false)),
        aggregate("pg_var_pop", var(false, false)),
        aggregate("pg_stddev", var(true, true)),
        aggregate("pg_stddev_samp", var(true, true)),
        aggregate("pg_stddev_pop", var(false, true)),
    ]
}

// ---- Planning ---------------------------------------------------------------------------

/// Plans `+ - * / %` and the comparisons where an operand is numeric: exact with an
/// integer, a numeric or text, as floats with anything else.
#[derive(Debug)]
pub struct NumericPlanner {
    functions: Vec<Arc<ScalarUDF>>,
}

impl NumericPlanner {
    fn function(&self, op: &BinaryOperator) -> Option<&Arc<ScalarUDF>> {
        let name = match op {
            BinaryOperator::Plus => "pg_numeric_add",
            BinaryOperator::Minus => "pg_numeric_sub",
            BinaryOperator::Multiply => "pg_numeric_mul",
            BinaryOperator::Divide => "pg_numeric_div",
            BinaryOperator::Modulo => "pg_numeric_mod",
            BinaryOperator::Eq => "pg_numeric_eq",
            BinaryOperator::NotEq => "pg_numeric_ne",
            BinaryOperator::Lt => "pg_numeric_lt",
            BinaryOperator::LtEq => "pg_numeric_le",
            BinaryOperator::Gt => "pg_numeric_gt",
            BinaryOperator::GtEq => "pg_numeric_ge",
            _ => return None,
        };
        self.functions.iter().find(|f| f.name() == name)
    }
}

impl ExprPlanner for NumericPlanner {
    fn plan_binary_op(
        &self,
        expr: RawBinaryExpr,
        schema: &DFSchema,
    ) -> Result<PlannerResult<RawBinaryExpr>> {
        let field = |e: &Expr| e.to_field(schema).ok().map(|(_, f)| f);
        let (left, right) = (field(&expr.left), field(&expr.right));
        let numeric_side = |f: &Option<FieldRef>| f.as_deref().is_some_and(is_numeric);
        if !numeric_side(&left) && !numeric_side(&right) {
            return Ok(decimal_binary(expr, &left, &right, |op| self.function(op)));
        }
        if expr.op == BinaryOperator::StringConcat {
            return Ok(PlannerResult::Original(expr));
        }
        let exact = |f: &Option<FieldRef>| match f.as_deref() {
            Some(f) => {
                let t = f.data_type();
                is_numeric(f)
                    || t.is_integer()
                    || matches!(
                        t,
                        DataType::Null | DataType::Decimal128(..) | DataType::Utf8
                    )
            }
            None => false,
        };
        if exact(&left) && exact(&right) {
            if let Some(f) = self.function(&expr.op) {
                return Ok(PlannerResult::Planned(Expr::ScalarFunction(
                    ScalarFunction::new_udf(f.clone(), vec![expr.left, expr.right]),
                )));
            }
        }
        // Anything else reads the numeric as a float, as PostgreSQL's casts do.
        let float = |e: Expr, f: &Option<FieldRef>| match numeric_side(f) {
            true => Expr::Cast(datafusion::logical_expr::Cast::new(
                Box::new(e),
                DataType::Float64,
            )),
            false => e,
        };
        Ok(PlannerResult::Original(RawBinaryExpr {
            op: expr.op,
            left: float(expr.left, &left),
            right: float(expr.right, &right),
        }))
    }
}

/// One element of a number's `to_char` pattern.
#[derive(Clone, Copy, PartialEq)]
enum NumPart {
    /// `9`: a digit, or a blank where the number has none.
    Nine,
    /// `0`: a digit, or a zero where the number has none.
    Zero,
    /// `.` or `D`: the decimal point.
    Point,
    /// `,` or `G`: a group separator, shown once a digit is.
    Group,
    /// `S`: the sign, `+` or `-`, next to the number.
    Sign,
    /// `MI`: `-`, or a blank.
    Minus,
    /// `PL`: `+`, or a blank.
    Plus,
    /// `SG`: `+` or `-`, where it stands.
    SignHere,
    /// `PR`: angle brackets around a negative number.
    Brackets,
}

/// `to_char` of a number, as PostgreSQL's: `9`, `0`, `.` (`D`), `,` (`G`), `S`, `MI`,
/// `PL`, `SG`, `PR` and `FM`; any other pattern fails with 0A000 rather than print
/// something else. The number is rounded to the pattern's decimals (a numeric half away
/// from zero, a float as printf rounds it); one too wide shows `#` for each digit.
pub(super) fn to_char_number(value: &ScalarValue, pattern: &str) -> Result<Option<String>> {
    let mut parts = Vec::new();
    let mut fill_mode = false;
    let upper = pattern.to_ascii_uppercase();
    let mut rest = upper.as_str();
    while let Some(c) = rest.chars().next() {
        let (part, len) = match c {
            '9' => (Some(NumPart::Nine), 1),
            '0' => (Some(NumPart::Zero), 1),
            '.' | 'D' => (Some(NumPart::Point), 1),
            ',' | 'G' => (Some(NumPart::Group), 1),
            'S' if rest.starts_with("SG") => (Some(NumPart::SignHere), 2),
            'S' => (Some(NumPart::Sign), 1),
            'M' if rest.starts_with("MI") => (Some(NumPart::Minus), 2),
            'P' if rest.starts_with("PL") => (Some(NumPart::Plus), 2),
            'P' if rest.starts_with("PR") => (Some(NumPart::Brackets), 2),
            'F' if rest.starts_with("FM") => {
                fill_mode = true;
                (None, 2)
            }
            _ => {
                return Err(external(
                    ErrorKind::Unsupported,
                    &format!(
                        "to_char of a number with \"{}\" in its pattern is not supported",
                        &rest[..c.len_utf8()]
                    ),
                ))
            }
        };
        parts.extend(part);
        rest = &rest[len..];
    }
    let digit = |p: &NumPart| matches!(p, NumPart::Nine | NumPart::Zero);
    let point = parts.iter().position(|p| *p == NumPart::Point);
    let int_places = parts[..point.unwrap_or(parts.len())]
        .iter()
        .filter(|p| digit(p))
        .count();
    let decimals = point.map_or(0, |i| parts[i + 1..].iter().filter(|p| digit(p)).count());
    let Some((negative, int, frac)) = rounded_digits(value, decimals)? else {
        return Ok(None);
    };
    let overflow = int.len() > int_places;
    // A point with no decimals after it shows only when the number is too wide.
    let point_shown = point.is_some() && (decimals > 0 || overflow);
    // Below one, no zero shows before a point (` .50`); zero alone shows one (` 0`), and
    // so does a zero in fill mode (`0.`).
    let zero = int == "0" && frac.bytes().all(|b| b == b'0');
    let zero_decimals = point.is_some_and(|i| parts[i + 1..].contains(&NumPart::Zero));
    let int = match point_shown {
        true if int == "0" && !(fill_mode && zero && !zero_decimals) => String::new(),
        _ => int,
    };
    let zero_from = parts.iter().position(|p| *p == NumPart::Zero);
    let mut texts: Vec<String> = Vec::with_capacity(parts.len() + 1);
    let (mut blanks, mut int_digits, mut frac_digits) = (
        int_places.saturating_sub(int.len()),
        int.chars(),
        frac.chars(),
    );
    let (mut shown, mut past_point, mut first) = (false, false, None);
    for (i, part) in parts.iter().enumerate() {
        let text = match part {
            NumPart::Nine | NumPart::Zero if overflow => "#".to_string(),
            NumPart::Nine | NumPart::Zero if past_point => {
                frac_digits.next().map(String::from).unwrap_or_default()
            }
            NumPart::Nine | NumPart::Zero if blanks > 0 => {
                blanks -= 1;
                match zero_from.is_some_and(|z| z <= i) {
                    true => {
                        shown = true;
                        first.get_or_insert(i);
                        "0".to_string()
                    }
                    false => " ".to_string(),
                }
            }
            NumPart::Nine | NumPart::Zero => {
                shown = true;
                first.get_or_insert(i);
                int_digits.next().map(String::from).unwrap_or_default()
            }
            NumPart::Point => {
                past_point = true;
                first.get_or_insert(i);
                match point_shown {
                    true => ".".to_string(),
                    false => String::new(),
                }
            }
            NumPart::Group if shown || overflow => ",".to_string(),
            NumPart::Group | NumPart::Sign => " ".to_string(),
            NumPart::Minus => if negative { "-" } else { " " }.to_string(),
            NumPart::Plus => if negative { " " } else { "+" }.to_string(),
            NumPart::SignHere => if negative { "-" } else { "+" }.to_string(),
            NumPart::Brackets => if negative { ">" } else { " " }.to_string(),
        };
        texts.push(text);
    }
    let first = first.unwrap_or(parts.len());
    // A sign that goes next to the number takes the last blank before it; the implicit
    // sign and PR's `<` have a place of their own in front.
    let leading_sign = parts[..first].contains(&NumPart::Sign);
    let trailing_sign = parts[first..].contains(&NumPart::Sign);
    // PL shows only a plus: a minus still goes next to the number.
    let explicit = parts
        .iter()
        .any(|p| matches!(p, NumPart::Minus | NumPart::SignHere | NumPart::Brackets))
        || leading_sign
        || trailing_sign;
    // The implicit sign's own place is in front, after a leading PL.
    let own_at = parts[..first]
        .iter()
        .rposition(|p| *p == NumPart::Plus)
        .map_or(0, |i| i + 1);
    let mut first = first;
    let mut next_to_number = |texts: &mut Vec<String>, sign: &str, own_place: bool| {
        if own_place {
            texts.insert(own_at, " ".to_string());
            first += 1;
        }
        if let Some(i) = texts[..first].iter().rposition(|t| t == " ") {
            texts[i] = sign.to_string();
        }
    };
    if leading_sign {
        next_to_number(&mut texts, if negative { "-" } else { "+" }, false);
    } else if parts.contains(&NumPart::Brackets) {
        next_to_number(&mut texts, if negative { "<" } else { " " }, true);
    } else if !explicit {
        next_to_number(&mut texts, if negative { "-" } else { " " }, true);
    }
    if trailing_sign {
        if let Some(i) = parts.iter().rposition(|p| *p == NumPart::Sign) {
            let offset = texts.len() - parts.len();
            texts[i + offset] = if negative { "-" } else { "+" }.to_string();
        }
    }
    if fill_mode {
        // No trailing zeros in `9` decimals (up to a `0` place or another digit), and
        // no blank placeholders (`FMPL99` of 5 is `+5`).
        if let Some(p) = point {
            let offset = texts.len() - parts.len();
            for i in (p + 1..parts.len()).rev() {
                match parts[i] {
                    NumPart::Nine if texts[i + offset] == "0" => texts[i + offset].clear(),
                    NumPart::Nine | NumPart::Zero => break,
                    _ => {}
                }
            }
        }
        texts.retain(|t| t != " ");
    }
    Ok(Some(texts.concat()))
}

/// A number rounded to `decimals` digits after the point (a numeric half away from zero,
/// a float as printf rounds it): whether it is below zero, its integer digits (`0` for
/// none) and its decimals.
fn rounded_digits(value: &ScalarValue, decimals: usize) -> Result<Option<(bool, String, String)>> {
    let float = match value {
        ScalarValue::Float32(Some(f)) => Some(*f as f64),
        ScalarValue::Float64(Some(f)) => Some(*f),
        _ => None,
    };
    if let Some(f) = float {
        if !f.is_finite() {
            return Err(external(
                ErrorKind::Unsupported,
                "to_char of a float that is not finite is not supported",
            ));
        }
        // A float keeps its sign when it rounds to zero (`-0.00`), as printf's does.
        let t = format!("{f:.decimals$}");
        return Ok(Some(split_digits(&t, f.is_sign_negative())));
    }
    Ok(self::value(value)?.map(|d| split_digits(&text(&round(&d, decimals as i64)), false)))
}

/// A number's text (`-12.50`) as whether it is negative (or `negative_zero` for a
/// float's `-0`), its integer digits (`0` for none) and its decimals.
fn split_digits(text: &str, negative_zero: bool) -> (bool, String, String) {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, text),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let zero = int.bytes().all(|b| b == b'0') && frac.bytes().all(|b| b == b'0');
    let int = match int.trim_start_matches('0') {
        "" => "0".to_string(),
        i => i.to_string(),
    };
    (negative && (!zero || negative_zero), int, frac.to_string())
}

/// An operator over DataFusion's decimals (a cast to `numeric` or `decimal(p, s)` outside
/// the outermost SELECT's items), as PostgreSQL's numeric: with a float, the decimal is
/// read as a float (DataFusion made the float a `decimal(30, 15)`, which fails past
/// 10^15); `/` and `%` with an integer or a decimal are exact with PostgreSQL's scales
/// (DataFusion's `%` of two scales answered 0, and its `/` another scale). `+`, `-`,
/// `*` and comparisons stay DataFusion's, whose values and scales are PostgreSQL's.
fn decimal_binary<'a>(
    expr: RawBinaryExpr,
    left: &Option<FieldRef>,
    right: &Option<FieldRef>,
    function: impl Fn(&BinaryOperator) -> Option<&'a Arc<ScalarUDF>>,
) -> PlannerResult<RawBinaryExpr> {
    let ty = |f: &Option<FieldRef>| f.as_deref().map(|f| f.data_type().clone());
    let (l, r) = (ty(left), ty(right));
    let decimal = |t: &Option<DataType>| matches!(t, Some(DataType::Decimal128(..)));
    if !decimal(&l) && !decimal(&r) {
        return PlannerResult::Original(expr);
    }
    let float = |t: &Option<DataType>| t.as_ref().is_some_and(DataType::is_floating);
    if float(&l) || float(&r) {
        let cast = |e: Expr, t: &Option<DataType>| match decimal(t) {
            true => Expr::Cast(datafusion::logical_expr::Cast::new(
                Box::new(e),
                DataType::Float64,
            )),
            false => e,
        };
        return PlannerResult::Original(RawBinaryExpr {
            op: expr.op,
            left: cast(expr.left, &l),
            right: cast(expr.right, &r),
        });
    }
    let exact = |t: &Option<DataType>| {
        decimal(t)
            || t.as_ref()
                .is_some_and(|t| t.is_integer() || *t == DataType::Null)
    };
    if matches!(expr.op, BinaryOperator::Divide | BinaryOperator::Modulo) && exact(&l) && exact(&r)
    {
        if let Some(f) = function(&expr.op) {
            return PlannerResult::Planned(Expr::ScalarFunction(ScalarFunction::new_udf(
                f.clone(),
                vec![expr.left, expr.right],
            )));
        }
    }
    PlannerResult::Original(expr)
}

/// ORDER BY a numeric orders by its value, not its text.
#[derive(Debug, Default)]
pub(super) struct NumericOrder;

impl AnalyzerRule for NumericOrder {
    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|node| {
            let LogicalPlan::Sort(mut sort) = node else {
                return Ok(Transformed::no(node));
            };
            let schema = sort.input.schema().clone();
            let mut changed = false;
            sort.expr = sort
                .expr
                .into_iter()
                .map(|s| {
                    let numeric = s.expr.to_field(&schema).is_ok_and(|(_, f)| is_numeric(&f));
                    if !numeric {
                        return s;
                    }
                    changed = true;
                    SortExpr {
                        expr: Expr::Cast(datafusion::logical_expr::Cast::new(
                            Box::new(s.expr),
                            DataType::Float64,
                        )),
                        ..s
                    }
                })
                .collect();
            Ok(Transformed::new_transformed(
                LogicalPlan::Sort(sort),
                changed,
            ))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "eddy_numeric_order"
    }
}

/// Registers the numeric functions, aggregates and operators with `ctx`.
pub fn register(ctx: &SessionContext) -> Result<()> {
    use datafusion::execution::FunctionRegistry;
    let udfs = functions();
    let planner = NumericPlanner {
        functions: udfs.iter().cloned().map(Arc::new).collect(),
    };
    for f in udfs {
        ctx.register_udf(f);
    }
    ctx.register_udf(ScalarUDF::new_from_impl(TypeOf {
        signature: Signature::any(1, Volatility::Immutable),
    }));
    for a in aggregates() {
        ctx.register_udaf(a);
    }
    ctx.state_ref()
        .write()
        .register_expr_planner(Arc::new(planner))?;
    Ok(())
}

// ---- Where numerics appear -------------------------------------------------------------

/// A decimal literal's text (`1.5`, `1e6`, or an integer too large for bigint).
fn decimal_literal(e: &Ast) -> Option<String> {
    let (negative, inner) = match e {
        Ast::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => (true, expr.as_ref()),
        e => (false, e),
    };
    let Ast::Value(v) = inner else { return None };
    let Value::Number(n, _) = &v.value else {
        return None;
    };
    let decimal = n.contains(['.', 'e', 'E']) || n.parse::<i64>().is_err();
    decimal.then(|| format!("{}{n}", if negative { "-" } else { "" }))
}

fn call(name: &str, args: Vec<Ast>) -> Ast {
    super::rewrite::call(name, args)
}

/// A number literal cast to `numeric`, as a decimal of the literal's own precision and
/// scale (`2.50::numeric` is `decimal(3, 2)`), where DataFusion's `numeric` is
/// `decimal(38, 10)`: a subquery's `2.5::numeric` printed `2.5000000000`. `None` for
/// anything else, exponents, and literals past `decimal(38)`.
pub(super) fn literal_as_decimal(e: &Ast) -> Option<Ast> {
    let Ast::Value(v) = e else { return None };
    let Value::Number(n, _) = &v.value else {
        return None;
    };
    let (int, frac) = n.split_once('.').unwrap_or((n, ""));
    if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let scale = frac.len() as u64;
    let precision = (int.trim_start_matches('0').len() as u64 + scale).max(1);
    (precision <= 38).then(|| Ast::Cast {
        kind: ast::CastKind::Cast,
        expr: Box::new(Ast::value(Value::SingleQuotedString(n.clone()))),
        data_type: ast::DataType::Decimal(ast::ExactNumberInfo::PrecisionAndScale(
            precision,
            scale as i64,
        )),
        array: false,
        format: None,
    })
}

const FUNCTIONS: &[&str] = &[
    "round", "trunc", "abs", "ceil", "floor", "sign", "sqrt", "exp", "ln", "log", "power",
];
const AGGREGATES: &[&str] = &[
    "sum",
    "avg",
    "variance",
    "var_samp",
    "var_pop",
    "stddev",
    "stddev_samp",
    "stddev_pop",
];

/// Makes the numerics of `statement`'s outermost SELECT items (see the module's text).
pub(super) fn literals(statement: &mut DFStatement) {
    let DFStatement::Statement(s) = statement else {
        return;
    };
    let Statement::Query(query) = s.as_mut() else {
        return;
    };
    let SetExpr::Select(select) = query.body.as_mut() else {
        return;
    };
    for item in select.projection.iter_mut() {
        match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                visit(e, true);
            }
            _ => {}
        }
    }
}

/// A call's arguments, where it has no clauses; with DISTINCT only for an aggregate.
fn function_args(f: &mut ast::Function, aggregate: bool) -> Option<&mut Vec<FunctionArg>> {
    match &mut f.args {
        FunctionArguments::List(list)
            if (aggregate || list.duplicate_treatment.is_none()) && list.clauses.is_empty() =>
        {
            Some(&mut list.args)
        }
        _ => None,
    }
}

/// Rewrites `e` where a numeric may be (`numeric`), and says whether `e` may now be one.
fn visit(e: &mut Ast, numeric: bool) -> bool {
    if numeric {
        if let Some(text) = decimal_literal(e) {
            *e = call(
                "pg_numeric",
                vec![Ast::value(Value::SingleQuotedString(text))],
            );
            return true;
        }
    }
    match e {
        Ast::Nested(inner) => visit(inner, numeric),
        // `-a ^ b` is `(-a) ^ b` in PostgreSQL.
        Ast::UnaryOp {
            op: UnaryOperator::Minus,
            expr: inner,
        } if matches!(
            inner.as_ref(),
            Ast::BinaryOp {
                op: BinaryOperator::PGExp,
                ..
            }
        ) =>
        {
            let Ast::BinaryOp { left, op, right } = inner.as_ref().clone() else {
                unreachable!("matched above");
            };
            *e = Ast::BinaryOp {
                left: Box::new(Ast::UnaryOp {
                    op: UnaryOperator::Minus,
                    expr: left,
                }),
                op,
                right,
            };
            visit(e, numeric)
        }
        Ast::UnaryOp {
            op: UnaryOperator::Minus,
            expr: inner,
        } => {
            if visit(inner, numeric) {
                *e = Ast::BinaryOp {
                    left: Box::new(Ast::value(Value::Number("0".into(), false))),
                    op: BinaryOperator::Minus,
                    right: Box::new(Ast::Nested(inner.clone())),
                };
                return true;
            }
            false
        }
        Ast::UnaryOp {
            op: UnaryOperator::Not,
            expr: inner,
        } => {
            visit(inner, numeric);
            false
        }
        Ast::BinaryOp { left, op, right } => {
            use BinaryOperator::*;
            match op {
                Plus | Minus | Multiply | Divide | Modulo => {
                    let l = visit(left, numeric);
                    let r = visit(right, numeric);
                    l || r
                }
                Eq | NotEq | Lt | LtEq | Gt | GtEq | And | Or => {
                    visit(left, numeric);
                    visit(right, numeric);
                    false
                }
                PGExp => {
                    visit(left, numeric);
                    visit(right, numeric);
                    if numeric {
                        let args = vec![left.as_ref().clone(), right.as_ref().clone()];
                        *e = call("pg_numeric_power", args);
                    }
                    numeric
                }
                _ => false,
            }
        }
        Ast::Cast {
            expr: inner,
            data_type:
                ast::DataType::Numeric(info) | ast::DataType::Decimal(info) | ast::DataType::Dec(info),
            ..
        } if numeric => {
            visit(inner, true);
            let inner = inner.as_ref().clone();
            let number = |n: u64| Ast::value(Value::Number(n.to_string(), false));
            *e = match *info {
                ast::ExactNumberInfo::PrecisionAndScale(p, s) => call(
                    "pg_numeric_typmod",
                    vec![inner, number(p), number(s as u64)],
                ),
                ast::ExactNumberInfo::Precision(p) => {
                    call("pg_numeric_typmod", vec![inner, number(p), number(0)])
                }
                ast::ExactNumberInfo::None => call("pg_numeric", vec![inner]),
            };
            true
        }
        // sqlparser reads `ceil(x)` and `floor(x)` as their own expressions (for
        // `CEIL(x TO DAY)`), not as calls.
        Ast::Ceil {
            expr: inner,
            field: ast::CeilFloorKind::DateTimeField(ast::DateTimeField::NoDateTime),
        }
        | Ast::Floor {
            expr: inner,
            field: ast::CeilFloorKind::DateTimeField(ast::DateTimeField::NoDateTime),
        } if numeric => {
            visit(inner, true);
            let inner = inner.as_ref().clone();
            let name = match e {
                Ast::Ceil { .. } => "pg_numeric_ceil",
                _ => "pg_numeric_floor",
            };
            *e = call(name, vec![inner]);
            true
        }
        Ast::Function(f) if f.over.is_none() && f.filter.is_none() && f.within_group.is_empty() => {
            let name = super::rewrite::parts(&f.name);
            let [name] = name.as_slice() else {
                return false;
            };
            let name = name.as_str();
            let renamed = match name {
                _ if !numeric => None,
                "ceiling" => Some("pg_numeric_ceil".to_string()),
                "pow" => Some("pg_numeric_power".to_string()),
                "div" => Some("div".to_string()),
                n if FUNCTIONS.contains(&n) => Some(format!("pg_numeric_{n}")),
                n if AGGREGATES.contains(&n) => Some(format!("pg_{n}")),
                _ => None,
            };
            let arguments_numeric =
                renamed.is_some() || (numeric && matches!(name, "pg_text" | "pg_typeof"));
            let Some(args) = function_args(f, AGGREGATES.contains(&name)) else {
                return false;
            };
            for arg in args.iter_mut() {
                if let FunctionArg::Unnamed(FunctionArgExpr::Expr(a)) = arg {
                    visit(a, arguments_numeric);
                }
            }
            match renamed {
                Some(n) => {
                    f.name = ast::ObjectName::from(vec![ast::Ident::new(n)]);
                    true
                }
                None => false,
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> BigDecimal {
        parse(s).unwrap()
    }

    #[test]
    fn literals_keep_their_scale() {
        assert_eq!(text(&d("2.50")), "2.50");
        assert_eq!(text(&d("1e6")), "1000000");
        assert_eq!(text(&d("1.0e-3")), "0.0010");
        assert_eq!(text(&d("1.5e3")), "1500");
        assert_eq!(text(&d(".5")), "0.5");
        assert_eq!(text(&(d("0.1") + d("0.2"))), "0.3");
        assert!(parse("abc").is_err());
    }

    #[test]
    fn quotients_have_postgresqls_scale() {
        let q = |a: &str, b: &str| text(&div(&d(a), &d(b)).unwrap());
        assert_eq!(q("7.0", "2"), "3.5000000000000000");
        assert_eq!(q("1", "3.0"), "0.33333333333333333333");
        assert_eq!(q("2.0", "3"), "0.66666666666666666667");
        assert_eq!(q("10", "3"), "3.3333333333333333");
        assert_eq!(q("2000000124", "41"), "48780490.829268292683");
        assert_eq!(q("31", "10"), "3.1000000000000000");
        assert!(div(&d("1"), &d("0")).is_err());
    }

    #[test]
    fn cube_roots_are_glibcs() {
        // The C library's answers on this machine, which PostgreSQL prints.
        for (x, root) in [
            (27.0, 3.0000000000000004),
            (-27.0, -3.0000000000000004),
            (2.0, 1.2599210498948734),
            (1e-310, 4.641588833612775e-104),
            (1e300, 1e100),
            (0.001, 0.1),
            (123456.789, 49.79338592181746),
        ] {
            assert_eq!(c_cbrt(x), root, "cbrt({x})");
        }
        assert_eq!(c_cbrt(0.0), 0.0);
        assert!(c_cbrt(f64::NAN).is_nan());
    }

    #[test]
    fn logarithms_and_powers_have_postgresqls_scales() {
        let t = |d: Result<BigDecimal>| text(&d.unwrap());
        assert_eq!(t(numeric_ln(&d("2.0"))), "0.6931471805599453");
        assert_eq!(t(numeric_log(&d("2"), &d("8"))), "3.0000000000000000");
        assert_eq!(t(numeric_power(&d("2.0"), &d("0.5"))), "1.4142135623730950");
        assert_eq!(t(numeric_power(&d("2.0"), &d("3"))), "8.0000000000000000");
        assert_eq!(
            t(numeric_power(&d("1.0001"), &d("10000"))),
            "2.7181459268252249"
        );
        assert!(numeric_ln(&d("0")).is_err());
        assert!(numeric_power(&d("-8"), &d("0.5")).is_err());
    }

    #[test]
    fn floats_convert_with_15_digits() {
        assert_eq!(text(&of_float(0.1, 15).unwrap()), "0.1");
        assert_eq!(text(&of_float(19.99, 15).unwrap()), "19.99");
        assert_eq!(text(&of_float(1_000_000.0, 15).unwrap()), "1000000");
        assert_eq!(text(&of_float(0.1f32 as f64, 6).unwrap()), "0.1");
    }
}
