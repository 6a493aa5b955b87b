//! PostgreSQL's ordered-set aggregates in ad-hoc queries, exact:
//! `percentile_cont(f)`, `percentile_disc(f)` and `mode()`, each `WITHIN GROUP (ORDER BY
//! x)`, with one fraction or an array of them.
//!
//! DataFusion's own `percentile_cont` rounds its interpolation weight to six digits and it
//! has neither `percentile_disc` nor `mode`. These keep a group's values, sort them once at
//! the end in the WITHIN GROUP order, and pick as PostgreSQL's `orderedsetaggs.c` does.
//! NULL values are skipped; a group without values gives NULL.

use std::sync::Arc;

use datafusion::arrow::array::{new_empty_array, Array, ArrayRef, AsArray};
use datafusion::arrow::compute::{self, SortOptions};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::utils::SingleRowListArrayBuilder;
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, Signature, Volatility,
};
use datafusion::prelude::SessionContext;

use eddy_planner::ErrorKind;

use super::arith::external;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    /// `percentile_cont`: interpolated between the two nearest values, a float.
    Cont,
    /// `percentile_disc`: the first value whose position reaches the fraction.
    Disc,
    /// `mode`: the most frequent value, the first in order among equals.
    Mode,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct OrderedSet {
    name: &'static str,
    kind: Kind,
    signature: Signature,
}

/// Whether the call's fraction is an array (`percentile_cont(ARRAY[0.25, 0.5])`).
fn fraction_is_array(args: &[FieldRef]) -> bool {
    args.get(1)
        .is_some_and(|f| matches!(f.data_type(), DataType::List(_)))
}

impl OrderedSet {
    /// The type of the values kept: floats for `percentile_cont`, else the argument's.
    fn value_type(&self, arg: &DataType) -> DataType {
        match self.kind {
            Kind::Cont => DataType::Float64,
            _ => arg.clone(),
        }
    }
}

impl AggregateUDFImpl for OrderedSet {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(self.value_type(&args[0]))
    }

    fn return_field(&self, args: &[FieldRef]) -> Result<FieldRef> {
        let value = match self.kind {
            Kind::Cont => Field::new(self.name, DataType::Float64, true),
            // The argument's field, so that a numeric stays one.
            _ => args[0]
                .as_ref()
                .clone()
                .with_name(self.name)
                .with_nullable(true),
        };
        Ok(Arc::new(match fraction_is_array(args) {
            true => Field::new_list(self.name, value.with_name("item"), true),
            false => value,
        }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let t = self.value_type(args.input_fields[0].data_type());
        Ok(vec![Arc::new(Field::new_list(
            format!("{}_values", args.name),
            Field::new_list_field(t, true),
            true,
        ))])
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let fractions = match self.kind {
            Kind::Mode => Fractions::One(None),
            _ => fractions(&args)?,
        };
        Ok(Box::new(Values {
            kind: self.kind,
            data_type: self.value_type(args.expr_fields[0].data_type()),
            descending: args.order_bys.first().is_some_and(|s| s.options.descending),
            fractions,
            values: Vec::new(),
        }))
    }

    fn supports_within_group_clause(&self) -> bool {
        true
    }

    /// The values are sorted here, once per group, so DataFusion need not sort its input.
    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        AggregateOrderSensitivity::Insensitive
    }
}

/// The fractions asked for.
#[derive(Debug)]
enum Fractions {
    One(Option<f64>),
    Many(Vec<Option<f64>>),
}

fn fraction(v: &ScalarValue) -> Result<Option<f64>> {
    let f = match v.cast_to(&DataType::Float64)? {
        ScalarValue::Float64(f) => f,
        _ => None,
    };
    match f {
        Some(f) if !(0.0..=1.0).contains(&f) => Err(external(
            ErrorKind::NumericOutOfRange,
            &format!("percentile value {f} is not between 0 and 1"),
        )),
        f => Ok(f),
    }
}

/// The call's fraction: a constant, as PostgreSQL's must be per group.
fn fractions(args: &AccumulatorArgs) -> Result<Fractions> {
    let constant = || {
        external(
            ErrorKind::Unsupported,
            "the fraction of an ordered-set aggregate must be a constant",
        )
    };
    let expr = args.exprs.get(1).ok_or_else(constant)?;
    let empty = RecordBatch::new_empty(Arc::new(Schema::empty()));
    let ColumnarValue::Scalar(value) = expr.evaluate(&empty).map_err(|_| constant())? else {
        return Err(constant());
    };
    Ok(match &value {
        ScalarValue::List(list) => {
            let values = list.value(0);
            let mut out = Vec::with_capacity(values.len());
            for i in 0..values.len() {
                out.push(fraction(&ScalarValue::try_from_array(&values, i)?)?);
            }
            Fractions::Many(out)
        }
        v => Fractions::One(fraction(v)?),
    })
}

/// A group's values, unsorted until the end.
#[derive(Debug)]
struct Values {
    kind: Kind,
    data_type: DataType,
    descending: bool,
    fractions: Fractions,
    values: Vec<ArrayRef>,
}

impl Values {
    fn all(&self) -> Result<ArrayRef> {
        match self.values.as_slice() {
            [] => Ok(new_empty_array(&self.data_type)),
            [one] => Ok(one.clone()),
            many => {
                let refs: Vec<&dyn Array> = many.iter().map(|a| a.as_ref()).collect();
                Ok(compute::concat(&refs)?)
            }
        }
    }

    /// The values in the WITHIN GROUP order.
    fn sorted(&self) -> Result<ArrayRef> {
        let options = SortOptions {
            descending: self.descending,
            nulls_first: false,
        };
        Ok(compute::sort(&self.all()?, Some(options))?)
    }

    fn pick(&self, sorted: &ArrayRef, f: Option<f64>) -> Result<ScalarValue> {
        let n = sorted.len();
        let Some(f) = f.filter(|_| n > 0) else {
            return ScalarValue::try_from(&self.data_type);
        };
        match self.kind {
            Kind::Disc => {
                // The smallest k with k / n >= f, and at least 1.
                let k = ((f * n as f64).ceil() as usize).clamp(1, n);
                ScalarValue::try_from_array(sorted, k - 1)
            }
            Kind::Cont => {
                let v = sorted.as_primitive::<Float64Type>();
                let position = f * (n - 1) as f64;
                let (first, second) = (position.floor(), position.ceil());
                let lo = v.value(first as usize);
                let hi = v.value(second as usize);
                Ok(ScalarValue::Float64(Some(match first == second {
                    true => lo,
                    false => lo + (hi - lo) * (position - first),
                })))
            }
            Kind::Mode => unreachable!("mode has no fraction"),
        }
    }

    fn mode(&self, sorted: &ArrayRef) -> Result<ScalarValue> {
        let mut best: Option<(usize, usize)> = None;
        let mut run = (0, 0);
        for i in 0..sorted.len() {
            let same = i > 0
                && ScalarValue::try_from_array(sorted, i)?
                    == ScalarValue::try_from_array(sorted, i - 1)?;
            run = match same {
                true => (run.0, run.1 + 1),
                false => (i, 1),
            };
            if best.is_none_or(|(_, count)| run.1 > count) {
                best = Some(run);
            }
        }
        match best {
            Some((i, _)) => ScalarValue::try_from_array(sorted, i),
            None => ScalarValue::try_from(&self.data_type),
        }
    }
}

impl Accumulator for Values {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let a = compute::cast(&values[0], &self.data_type)?;
        let a = match a.null_count() {
            0 => a,
            _ => compute::filter(&a, &compute::is_not_null(&a)?)?,
        };
        if !a.is_empty() {
            self.values.push(a);
        }
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let sorted = self.sorted()?;
        match (&self.fractions, self.kind) {
            (_, Kind::Mode) => self.mode(&sorted),
            (Fractions::One(f), _) => self.pick(&sorted, *f),
            (Fractions::Many(fs), _) => {
                let picked = fs
                    .iter()
                    .map(|f| self.pick(&sorted, *f))
                    .collect::<Result<Vec<_>>>()?;
                let array = match picked.is_empty() {
                    true => new_empty_array(&self.data_type),
                    false => ScalarValue::iter_to_array(picked)?,
                };
                Ok(SingleRowListArrayBuilder::new(array).build_list_scalar())
            }
        }
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
            + self
                .values
                .iter()
                .map(|a| a.get_array_memory_size())
                .sum::<usize>()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let all = self.all()?;
        Ok(vec![SingleRowListArrayBuilder::new(all).build_list_scalar()])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let lists = states[0].as_list::<i32>();
        for row in 0..lists.len() {
            if !lists.is_null(row) {
                self.update_batch(&[lists.value(row)])?;
            }
        }
        Ok(())
    }
}

fn aggregate(name: &'static str, kind: Kind) -> AggregateUDF {
    AggregateUDF::new_from_impl(OrderedSet {
        name,
        kind,
        signature: Signature::variadic_any(Volatility::Immutable),
    })
}

/// Registers the ordered-set aggregates with `ctx`, in place of DataFusion's.
pub fn register(ctx: &SessionContext) {
    for (name, kind) in [
        ("percentile_cont", Kind::Cont),
        ("percentile_disc", Kind::Disc),
        ("mode", Kind::Mode),
    ] {
        ctx.register_udaf(aggregate(name, kind));
    }
}
