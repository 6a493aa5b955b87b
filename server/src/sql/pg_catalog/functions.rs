//! The functions catalog queries call, each answered from the snapshot: names of owners
//! and types, a metric's definition, visibility and privileges (everything is visible and
//! allowed until roles exist). Functions about objects Eddy has none of (defaults, rules,
//! indexes, triggers, comments) return NULL, as PostgreSQL does for an unknown oid.

use std::hash::Hash;
use std::sync::Arc;

use datafusion::arrow::array::{new_empty_array, Array};
use datafusion::arrow::compute::concat;
use datafusion::arrow::datatypes::{DataType, Field, IntervalMonthDayNano, IntervalUnit};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::scalar::ScalarStructBuilder;
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature,
    Volatility,
};
use datafusion::prelude::SessionContext;

use eddy_planner::ErrorKind;

use super::arith::external;
use super::{Snapshot, ROLE_NAME, TYPES};

type Eval = Arc<dyn Fn(&[ScalarValue]) -> Result<ScalarValue> + Send + Sync>;

/// A catalog function evaluated row by row over scalars; callable with or without the
/// `pg_catalog.` qualifier.
struct CatalogFunction {
    name: &'static str,
    aliases: Vec<String>,
    signature: Signature,
    returns: DataType,
    eval: Eval,
}

identified_by_name!(CatalogFunction);

impl ScalarUDFImpl for CatalogFunction {
    fn name(&self) -> &str {
        self.name
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(self.returns.clone())
    }

    /// The identity functions return PostgreSQL's `name`.
    fn return_field_from_args(
        &self,
        _: datafusion::logical_expr::ReturnFieldArgs,
    ) -> Result<datafusion::arrow::datatypes::FieldRef> {
        let field = Field::new(self.name, self.returns.clone(), true);
        Ok(std::sync::Arc::new(
            match NAME_FUNCTIONS.contains(&self.name) {
                true => field.with_metadata(
                    [(super::json::PG_TYPE.to_string(), "name".to_string())]
                        .into_iter()
                        .collect(),
                ),
                false => field,
            },
        ))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        row_by_row(&args, &self.returns, &*self.eval)
    }
}

/// The functions whose result is a `name`.
const NAME_FUNCTIONS: [&str; 5] = [
    "current_user",
    "session_user",
    "current_role",
    "current_database",
    "current_schema",
];

/// Evaluates `eval` on each row's scalars (once, on scalars, when every argument is
/// one), for functions defined on single values.
pub(super) fn row_by_row(
    args: &ScalarFunctionArgs,
    returns: &DataType,
    eval: &dyn Fn(&[ScalarValue]) -> Result<ScalarValue>,
) -> Result<ColumnarValue> {
    if args
        .args
        .iter()
        .all(|a| matches!(a, ColumnarValue::Scalar(_)))
    {
        let scalars: Vec<ScalarValue> = args
            .args
            .iter()
            .map(|a| match a {
                ColumnarValue::Scalar(s) => s.clone(),
                ColumnarValue::Array(_) => unreachable!("all scalars"),
            })
            .collect();
        return Ok(ColumnarValue::Scalar(eval(&scalars)?));
    }
    let arrays = ColumnarValue::values_to_arrays(&args.args)?;
    let mut out = Vec::with_capacity(args.number_rows);
    for row in 0..args.number_rows {
        let scalars = arrays
            .iter()
            .map(|a| ScalarValue::try_from_array(a, row))
            .collect::<Result<Vec<_>>>()?;
        out.push(eval(&scalars)?);
    }
    if out.is_empty() {
        return Ok(ColumnarValue::Array(new_empty_array(returns)));
    }
    // Not `ScalarValue::iter_to_array`: it is generic, and each crate calling it
    // compiles array builders for every Arrow type again.
    let arrays = out
        .iter()
        .map(ScalarValue::to_array)
        .collect::<Result<Vec<_>>>()?;
    let arrays: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
    Ok(ColumnarValue::Array(concat(&arrays)?))
}

/// A bytea from PostgreSQL's text of one: `\x` and hex digits (pairs may be apart by
/// spaces), else the escape form, where `\\` is a backslash and `\nnn` an octal byte.
fn bytea_in(text: &str) -> Result<Vec<u8>> {
    let invalid = || {
        external(
            ErrorKind::InvalidText,
            "invalid input syntax for type bytea",
        )
    };
    if let Some(hex) = text.strip_prefix("\\x") {
        // PostgreSQL's errors of hex text are 22023.
        let digits: Vec<char> = hex.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        if let Some(bad) = digits.iter().find(|c| !c.is_ascii_hexdigit()) {
            return Err(external(
                ErrorKind::InvalidParameter,
                &format!("invalid hexadecimal digit: \"{bad}\""),
            ));
        }
        if !digits.len().is_multiple_of(2) {
            return Err(external(
                ErrorKind::InvalidParameter,
                "invalid hexadecimal data: odd number of digits",
            ));
        }
        return Ok(digits
            .chunks(2)
            .map(|pair| {
                (pair[0].to_digit(16).unwrap_or(0) * 16 + pair[1].to_digit(16).unwrap_or(0)) as u8
            })
            .collect());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if bytes.get(i + 1) == Some(&b'\\') => {
                out.push(b'\\');
                i += 2;
            }
            b'\\' => {
                let octal = bytes.get(i + 1..i + 4).filter(|d| {
                    matches!(d[0], b'0'..=b'3') && d[1..].iter().all(|c| matches!(c, b'0'..=b'7'))
                });
                let digits = octal.ok_or_else(invalid)?;
                out.push(digits.iter().fold(0u8, |n, d| n * 8 + (d - b'0')));
                i += 4;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// An oid argument as PostgreSQL reads one: an integer, or its text.
fn oid(v: &ScalarValue) -> Option<i32> {
    match v {
        ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) => s.trim().parse().ok(),
        v if v.is_null() => None,
        v => v.cast_to(&DataType::Int32).ok().and_then(|v| match v {
            ScalarValue::Int32(i) => i,
            _ => None,
        }),
    }
}

fn text(s: Option<String>) -> ScalarValue {
    ScalarValue::Utf8(s)
}

/// What a digest reads: a bytea's bytes, or anything else's text.
fn digest_input(v: Option<&ScalarValue>) -> Option<std::borrow::Cow<'_, [u8]>> {
    match v {
        Some(ScalarValue::Binary(Some(b)) | ScalarValue::LargeBinary(Some(b))) => Some(b.into()),
        v => v.and_then(pg_text).map(|s| s.into_bytes().into()),
    }
}

/// A SHA-2 digest (`digest_input`) as a bytea: PostgreSQL's `sha224` … `sha512`.
fn digest<D: sha2::Digest>(name: &'static str) -> ScalarUDF {
    function(name, &[1], DataType::Binary, |a| {
        ScalarValue::Binary(digest_input(a.first()).map(|b| D::digest(&b).to_vec()))
    })
}

/// A function of any arguments, `arities` of them.
pub(super) fn function(
    name: &'static str,
    arities: &[usize],
    returns: DataType,
    eval: impl Fn(&[ScalarValue]) -> ScalarValue + Send + Sync + 'static,
) -> ScalarUDF {
    let signatures = arities
        .iter()
        .map(|n| match n {
            0 => TypeSignature::Nullary,
            n => TypeSignature::Any(*n),
        })
        .collect();
    typed_function(name, signatures, returns, eval)
}

/// A function of arguments of the types of one of `signatures`.
pub(super) fn typed_function(
    name: &'static str,
    signatures: Vec<TypeSignature>,
    returns: DataType,
    eval: impl Fn(&[ScalarValue]) -> ScalarValue + Send + Sync + 'static,
) -> ScalarUDF {
    catalog_function(name, signatures, returns, Arc::new(move |a| Ok(eval(a))))
}

/// `function`, whose evaluation may fail (with `arith::external`'s errors, which carry
/// their SQLSTATE); of any number of arguments when `arities` is empty.
pub(super) fn fallible_function(
    name: &'static str,
    arities: &[usize],
    returns: DataType,
    eval: impl Fn(&[ScalarValue]) -> Result<ScalarValue> + Send + Sync + 'static,
) -> ScalarUDF {
    let signatures = match arities {
        [] => vec![TypeSignature::VariadicAny],
        _ => arities.iter().map(|n| TypeSignature::Any(*n)).collect(),
    };
    catalog_function(name, signatures, returns, Arc::new(eval))
}

fn catalog_function(
    name: &'static str,
    signatures: Vec<TypeSignature>,
    returns: DataType,
    eval: Eval,
) -> ScalarUDF {
    ScalarUDF::new_from_impl(CatalogFunction {
        name,
        aliases: vec![format!("pg_catalog.{name}")],
        signature: Signature::one_of(signatures, Volatility::Stable),
        returns,
        eval,
    })
}

/// `current_user` and the like: the role the session acts as, read when the statement
/// runs (the session passes it as `session_authorization`), so never folded into a
/// plan that another session or role could run.
fn session_role(name: &'static str) -> ScalarUDF {
    ScalarUDF::new_from_impl(CatalogFunction {
        name,
        aliases: vec![format!("pg_catalog.{name}")],
        signature: Signature::nullary(Volatility::Volatile),
        returns: DataType::Utf8,
        eval: Arc::new(|_| {
            Ok(text(Some(
                crate::sql::query::session_setting("session_authorization")
                    .unwrap_or_else(|| ROLE_NAME.to_string()),
            )))
        }),
    })
}

/// What `format_type` prints for a type's oid.
pub(super) fn type_display(oid: i32) -> Option<&'static str> {
    TYPES.iter().find(|t| t.oid == oid).map(|t| t.display)
}

/// `generate_series` over integer constants of any width, as PostgreSQL's: DataFusion's
/// takes bigint constants only (`generate_series(1, 3::int)`, and pgjdbc's type lookup's
/// `array_upper(…)` bound, failed), so narrower ones are widened before it is called.
#[derive(Debug)]
struct WideSeries(Arc<dyn TableFunctionImpl>);

impl TableFunctionImpl for WideSeries {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let exprs: Vec<Expr> = args
            .exprs()
            .iter()
            .map(|e| match e {
                Expr::Literal(v, meta) if v.data_type().is_integer() => {
                    match v.cast_to(&DataType::Int64) {
                        Ok(wide) => Expr::Literal(wide, meta.clone()),
                        Err(_) => e.clone(),
                    }
                }
                _ => e.clone(),
            })
            .collect();
        self.0
            .call_with_args(TableFunctionArgs::new(&exprs, args.session()))
    }
}

/// Registers every catalog function over `snapshot`.
pub(super) fn register(ctx: &SessionContext, snapshot: Arc<Snapshot>) {
    if let Ok(series) = ctx.table_function("generate_series") {
        let inner = series.function().clone();
        ctx.register_udtf("generate_series", Arc::new(WideSeries(inner)));
    }
    use DataType::{Boolean, Int32, Int64, Utf8};
    let null_text = |_: &[ScalarValue]| text(None);
    let null_bigint = |_: &[ScalarValue]| ScalarValue::Int64(None);
    let yes = |_: &[ScalarValue]| ScalarValue::Boolean(Some(true));
    let s = snapshot.clone();
    let viewdef = move |a: &[ScalarValue]| {
        text(
            a.first()
                .and_then(oid)
                .and_then(|o| s.relation(o))
                .and_then(|r| r.definition.clone()),
        )
    };
    let (roles, privileges) = (snapshot.clone(), snapshot.clone());
    let s = snapshot.clone();
    let regclass =
        move |a: &[ScalarValue]| text(a.first().and_then(oid).map(|o| s.regclass_name(o)));
    let schemas = DataType::List(Arc::new(Field::new_list_field(Utf8, true)));
    let key_fields = vec![
        Arc::new(Field::new("x", DataType::Int16, true)),
        Arc::new(Field::new("n", Int32, true)),
    ];
    let key_type = DataType::Struct(key_fields.clone().into());
    let keys_type = DataType::List(Arc::new(Field::new_list_field(key_type.clone(), true)));
    // information_schema._pg_expandarray(a): the elements of `a` with their 1-based
    // positions, as a list of (x, n) the rewrite unnests.
    let expand = move |a: &[ScalarValue]| {
        let items: Vec<ScalarValue> = match a.first() {
            Some(ScalarValue::List(l)) if !l.is_null(0) => {
                let values = l.value(0);
                (0..values.len())
                    .filter_map(|i| {
                        let x = ScalarValue::try_from_array(&values, i).ok()?;
                        ScalarStructBuilder::new()
                            .with_scalar(key_fields[0].clone(), x.cast_to(&DataType::Int16).ok()?)
                            .with_scalar(
                                key_fields[1].clone(),
                                ScalarValue::Int32(Some(i as i32 + 1)),
                            )
                            .build()
                            .ok()
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        ScalarValue::List(ScalarValue::new_list_nullable(&items, &key_type))
    };
    let udfs = vec![
        function("current_database", &[0], Utf8, |_| {
            text(Some("eddy".into()))
        }),
        function("current_schema", &[0], Utf8, |_| {
            text(Some("public".into()))
        }),
        // The implicit pg_catalog only when the argument asks for it.
        function("current_schemas", &[1], schemas, |a| {
            let implicit = matches!(a.first(), Some(ScalarValue::Boolean(Some(true))));
            let names: &[&str] = if implicit {
                &["pg_catalog", "public"]
            } else {
                &["public"]
            };
            let names: Vec<ScalarValue> = names.iter().map(|n| text(Some(n.to_string()))).collect();
            ScalarValue::List(ScalarValue::new_list_nullable(&names, &Utf8))
        }),
        function("pg_size_pretty", &[1], Utf8, |a| {
            text(match a.first().map(|v| v.cast_to(&Int64)) {
                Some(Ok(ScalarValue::Int64(Some(bytes)))) => Some(size_pretty(bytes)),
                _ => None,
            })
        }),
        // In hex, of `digest_input`.
        function("md5", &[1], Utf8, |a| {
            text(digest_input(a.first()).map(|b| format!("{:x}", md5::compute(b))))
        }),
        digest::<sha2::Sha224>("sha224"),
        digest::<sha2::Sha256>("sha256"),
        digest::<sha2::Sha384>("sha384"),
        digest::<sha2::Sha512>("sha512"),
        fallible_function("format", &[], Utf8, format),
        fallible_function("age", &[2], interval(), age),
        fallible_function("make_interval", &[7], interval(), make_interval),
        fallible_function(
            "make_timestamp",
            &[6],
            DataType::Timestamp(datafusion::arrow::datatypes::TimeUnit::Microsecond, None),
            make_timestamp,
        ),
        function("version", &[0], Utf8, |_| {
            text(Some(format!(
                "PostgreSQL 16.6 (Eddy {}) on Linux",
                env!("CARGO_PKG_VERSION")
            )))
        }),
        function("pg_get_userbyid", &[1], Utf8, move |a| {
            text(a.first().and_then(oid).map(|o| match roles.role_name(o) {
                Some(name) => name.to_string(),
                None => format!("unknown (OID={o})"),
            }))
        }),
        function("format_type", &[1, 2], Utf8, |a| {
            text(
                a.first()
                    .and_then(oid)
                    .map(|o| type_display(o).unwrap_or("???").to_string()),
            )
        }),
        function("regclassout", &[1], Utf8, regclass),
        function("regnamespaceout", &[1], Utf8, |a| {
            text(a.first().and_then(oid).map(|o| match o {
                super::NAMESPACE_PG_CATALOG => "pg_catalog".to_string(),
                super::NAMESPACE_PUBLIC => "public".to_string(),
                super::NAMESPACE_INFORMATION_SCHEMA => "information_schema".to_string(),
                o => o.to_string(),
            }))
        }),
        function("pg_get_viewdef", &[1, 2], Utf8, viewdef),
        function("_pg_expandarray", &[1], keys_type, expand),
        function("pg_encoding_to_char", &[1], Utf8, |a| {
            text(Some(
                if a.first().and_then(oid) == Some(6) {
                    "UTF8"
                } else {
                    ""
                }
                .into(),
            ))
        }),
        fallible_function("pg_bytea_in", &[1], DataType::Binary, |a| {
            Ok(ScalarValue::Binary(match a.first() {
                Some(ScalarValue::Utf8(Some(t)) | ScalarValue::LargeUtf8(Some(t))) => {
                    Some(bytea_in(t)?)
                }
                Some(ScalarValue::Binary(b) | ScalarValue::LargeBinary(b)) => b.clone(),
                Some(v) if v.is_null() => None,
                Some(v) => Some(bytea_in(&v.to_string())?),
                None => None,
            }))
        }),
        function("pg_similar_to_regex", &[1, 2], Utf8, |a| {
            let escape = match a.get(1) {
                None => Some('\\'),
                Some(v) if v.is_null() => return text(None),
                Some(v) => pg_text(v).and_then(|e| e.chars().next()),
            };
            text(
                a.first()
                    .and_then(pg_text)
                    .map(|p| eddy_planner::filter::similar_to_regex(&p, escape)),
            )
        }),
        function("array_upper", &[2], Int32, |a| match a.first() {
            Some(ScalarValue::List(l)) if !l.is_null(0) && !l.value(0).is_empty() => {
                ScalarValue::Int32(Some(l.value(0).len() as i32))
            }
            _ => ScalarValue::Int32(None),
        }),
        function("pg_relation_is_publishable", &[1], Boolean, |_| {
            ScalarValue::Boolean(Some(false))
        }),
        function("pg_table_is_visible", &[1], Boolean, yes),
        function("pg_type_is_visible", &[1], Boolean, yes),
        function("pg_function_is_visible", &[1], Boolean, yes),
        fallible_function("has_table_privilege", &[2, 3], Boolean, move |a| {
            table_privilege(&privileges, a)
        }),
        function("has_schema_privilege", &[2, 3], Boolean, yes),
        function("has_database_privilege", &[2, 3], Boolean, yes),
        function("has_column_privilege", &[3, 4], Boolean, yes),
        function("has_any_column_privilege", &[2, 3], Boolean, yes),
        function("pg_get_expr", &[2, 3], Utf8, null_text),
        function("pg_get_ruledef", &[1, 2], Utf8, null_text),
        function("pg_get_indexdef", &[1, 3], Utf8, null_text),
        function("pg_get_constraintdef", &[1, 2], Utf8, null_text),
        function("pg_get_triggerdef", &[1, 2], Utf8, null_text),
        function("pg_get_statisticsobjdef_columns", &[1], Utf8, null_text),
        function("pg_get_function_result", &[1], Utf8, null_text),
        function("pg_get_function_arguments", &[1], Utf8, null_text),
        function("pg_get_function_identity_arguments", &[1], Utf8, null_text),
        session_role("session_user"),
        session_role("current_user"),
        session_role("current_role"),
        // Sizes and statistics Eddy does not keep per relation: unknown, as PostgreSQL
        // answers for an oid it does not know.
        function("pg_total_relation_size", &[1], Int64, null_bigint),
        function("pg_relation_size", &[1, 2], Int64, null_bigint),
        function("pg_table_size", &[1], Int64, null_bigint),
        function("pg_indexes_size", &[1], Int64, null_bigint),
        function("pg_stat_get_numscans", &[1], Int64, null_bigint),
        function("pg_get_partkeydef", &[1], Utf8, null_text),
        function("pg_text", &[1], Utf8, |a| text(a.first().and_then(pg_text))),
        function(
            "interval_mul",
            &[2],
            DataType::Interval(IntervalUnit::MonthDayNano),
            |a| match a {
                [i, f] => interval_mul(i, f),
                _ => ScalarValue::IntervalMonthDayNano(None),
            },
        ),
        // to_hex of an integer is of its type's width: to_hex(-1) is ffffffff.
        typed_function(
            "to_hex",
            vec![
                TypeSignature::Exact(vec![Int32]),
                TypeSignature::Exact(vec![Int64]),
            ],
            Utf8,
            |a| {
                text(match a.first() {
                    Some(ScalarValue::Int32(Some(v))) => Some(format!("{:x}", *v as u32)),
                    Some(ScalarValue::Int64(Some(v))) => Some(format!("{:x}", *v as u64)),
                    _ => None,
                })
            },
        ),
        function("quote_ident", &[1], Utf8, |a| {
            text(a.first().and_then(pg_text).map(|s| quote_ident(&s)))
        }),
        function("quote_literal", &[1], Utf8, |a| {
            text(a.first().and_then(pg_text).map(|s| quote_literal(&s)))
        }),
        // quote_literal, but the word NULL for NULL.
        function("quote_nullable", &[1], Utf8, |a| {
            text(Some(
                a.first()
                    .and_then(pg_text)
                    .map_or("NULL".into(), |s| quote_literal(&s)),
            ))
        }),
        function("justify_hours", &[1], interval(), |a| {
            justify(&a[0], true, false)
        }),
        function("justify_days", &[1], interval(), |a| {
            justify(&a[0], false, true)
        }),
        function("justify_interval", &[1], interval(), |a| {
            justify(&a[0], true, true)
        }),
        fallible_function("width_bucket", &[4], Int32, width_bucket),
        // The rewrite passes current_setting the session's value (`rewrite::current_setting`).
        function("current_setting", &[1], Utf8, |a| {
            text(a.first().and_then(pg_text))
        }),
        function("col_description", &[2], Utf8, null_text),
        function("obj_description", &[1, 2], Utf8, null_text),
        function("shobj_description", &[2], Utf8, null_text),
    ];
    ctx.register_udf(ScalarUDF::new_from_impl(Upper::default()));
    ctx.register_udf(ScalarUDF::new_from_impl(Length::new(Counts::Characters)));
    ctx.register_udf(ScalarUDF::new_from_impl(Length::new(Counts::Bytes)));
    for udf in udfs.into_iter().chain(super::datetime::functions()) {
        ctx.register_udf(udf);
    }
}

fn interval() -> DataType {
    DataType::Interval(IntervalUnit::MonthDayNano)
}

/// `x::text` as PostgreSQL writes x: as in a result (`cells`: intervals as `1 day
/// 02:00:00`, timestamps as `2026-01-01 10:00:00`), but booleans as `true` and `false`.
pub(super) fn pg_text(v: &ScalarValue) -> Option<String> {
    match v {
        ScalarValue::Boolean(b) => b.map(|b| b.to_string()),
        v => crate::session::cells::cells_of_array(&v.to_array().ok()?)
            .pop()?
            .to_text(),
    }
}

/// PostgreSQL's `interval * factor`: months and days scale, and their fractions carry
/// down (a month as 30 days, a day as 24 hours), rounded to microseconds.
fn interval_mul(interval: &ScalarValue, factor: &ScalarValue) -> ScalarValue {
    let none = ScalarValue::IntervalMonthDayNano(None);
    let Ok(ScalarValue::IntervalMonthDayNano(Some(i))) =
        interval.cast_to(&DataType::Interval(IntervalUnit::MonthDayNano))
    else {
        return none;
    };
    let Ok(ScalarValue::Float64(Some(f))) = factor.cast_to(&DataType::Float64) else {
        return none;
    };
    let round_us = |x: f64| (x * 1e6).round() / 1e6;
    let months = i.months as f64 * f;
    let days = i.days as f64 * f;
    let month_days = round_us((months - months.trunc()) * 30.0);
    let mut seconds = round_us((days - days.trunc() + month_days - month_days.trunc()) * 86_400.0);
    let mut whole_days = days.trunc() + month_days.trunc();
    if seconds.abs() >= 86_400.0 {
        whole_days += (seconds / 86_400.0).trunc();
        seconds -= (seconds / 86_400.0).trunc() * 86_400.0;
    }
    let micros = ((i.nanoseconds / 1_000) as f64 * f + seconds * 1e6).round();
    let fits = |x: f64, max: f64| x.is_finite() && x.abs() <= max;
    if !fits(months, i32::MAX as f64)
        || !fits(whole_days, i32::MAX as f64)
        || !fits(micros, i64::MAX as f64 / 1e3)
    {
        return none;
    }
    ScalarValue::IntervalMonthDayNano(Some(IntervalMonthDayNano::new(
        months.trunc() as i32,
        whole_days as i32,
        micros as i64 * 1_000,
    )))
}

/// PostgreSQL's keywords that are not unreserved (`pg_get_keywords()` with catcode other
/// than U): `quote_ident` quotes them.
const KEYWORDS: &str = include_str!("keywords.txt");

/// `quote_ident(text)`: the name as SQL must write it, in double quotes unless it is
/// lower-case letters, digits and underscores not starting with a digit, and no keyword.
fn quote_ident(name: &str) -> String {
    let plain = name
        .chars()
        .enumerate()
        .all(|(i, c)| c.is_ascii_lowercase() || c == '_' || (i > 0 && c.is_ascii_digit()))
        && !name.is_empty()
        && !KEYWORDS.lines().any(|k| k == name);
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// `quote_literal(text)`: a string literal, `E'…'` when it holds a backslash.
fn quote_literal(text: &str) -> String {
    let quoted = text.replace('\'', "''");
    if text.contains('\\') {
        format!("E'{}'", quoted.replace('\\', "\\\\"))
    } else {
        format!("'{quoted}'")
    }
}

const NANOS_PER_DAY: i64 = 86_400_000_000_000;

/// PostgreSQL's `justify_hours`, `justify_days` and `justify_interval`: whole days out of
/// the time, whole 30-day months out of the days, with the parts' signs made to agree.
fn justify(interval: &ScalarValue, hours: bool, days: bool) -> ScalarValue {
    let Ok(ScalarValue::IntervalMonthDayNano(Some(i))) =
        interval.cast_to(&DataType::Interval(IntervalUnit::MonthDayNano))
    else {
        return ScalarValue::IntervalMonthDayNano(None);
    };
    let (mut month, mut day, mut time) = (i.months as i64, i.days as i64, i.nanoseconds);
    if hours {
        day += time / NANOS_PER_DAY;
        time %= NANOS_PER_DAY;
    }
    if days {
        month += day / 30;
        day %= 30;
        let time_sign = if hours { time } else { 0 };
        if month > 0 && (day < 0 || (day == 0 && time_sign < 0)) {
            day += 30;
            month -= 1;
        } else if month < 0 && (day > 0 || (day == 0 && time_sign > 0)) {
            day -= 30;
            month += 1;
        }
    }
    if hours {
        if day > 0 && time < 0 {
            time += NANOS_PER_DAY;
            day -= 1;
        } else if day < 0 && time > 0 {
            time -= NANOS_PER_DAY;
            day += 1;
        }
    }
    match (i32::try_from(month), i32::try_from(day)) {
        (Ok(m), Ok(d)) => {
            ScalarValue::IntervalMonthDayNano(Some(IntervalMonthDayNano::new(m, d, time)))
        }
        _ => ScalarValue::IntervalMonthDayNano(None),
    }
}

/// PostgreSQL's `width_bucket(operand, low, high, count)` over floats: which of `count`
/// equal buckets between the bounds holds the operand, 0 below them and count + 1 above.
fn width_bucket(a: &[ScalarValue]) -> Result<ScalarValue> {
    let float = |v: &ScalarValue| match v.cast_to(&DataType::Float64) {
        Ok(ScalarValue::Float64(f)) => f,
        _ => None,
    };
    let count = match a.get(3).map(|c| c.cast_to(&DataType::Int32)) {
        Some(Ok(ScalarValue::Int32(Some(c)))) => c,
        _ => return Ok(ScalarValue::Int32(None)),
    };
    let (Some(x), Some(low), Some(high)) = (float(&a[0]), float(&a[1]), float(&a[2])) else {
        return Ok(ScalarValue::Int32(None));
    };
    let refuse = |why: &str| Err(external(ErrorKind::InvalidWidthBucket, why));
    if count <= 0 {
        return refuse("count must be greater than zero");
    }
    if x.is_nan() || low.is_nan() || high.is_nan() {
        return refuse("operand, lower bound, and upper bound cannot be NaN");
    }
    if !low.is_finite() || !high.is_finite() {
        return refuse("lower and upper bounds must be finite");
    }
    let n = count as f64;
    let inside = |offset: f64, span: f64| {
        let at = if span.is_finite() {
            n * (offset / span)
        } else {
            n * ((offset / 2.0) / (span / 2.0))
        };
        (at as i32).min(count - 1) + 1
    };
    let above = |count: i32| {
        count
            .checked_add(1)
            .ok_or_else(|| external(ErrorKind::NumericOutOfRange, "integer out of range"))
    };
    let bucket = if low < high {
        if x < low {
            0
        } else if x >= high {
            above(count)?
        } else {
            inside(x - low, high - low)
        }
    } else if low > high {
        if x > low {
            0
        } else if x <= high {
            above(count)?
        } else {
            inside(low - x, low - high)
        }
    } else {
        return refuse("lower bound cannot equal upper bound");
    };
    Ok(ScalarValue::Int32(Some(bucket)))
}

/// PostgreSQL's `format(fmt, args…)`: `%s` (text, NULL as nothing), `%I` (an
/// identifier, quoted as needed), `%L` (a literal, NULL as `NULL`) and `%%`, each with
/// an optional position (`%2$s`), `-` flag and width (a number, `*` or `*n$`).
fn format(a: &[ScalarValue]) -> Result<ScalarValue> {
    let Some(fmt) = a.first().and_then(pg_text) else {
        return Ok(text(None));
    };
    let args = &a[1..];
    let bad = |why: &str| external(ErrorKind::InvalidParameter, why);
    let mut out = String::new();
    let mut chars = fmt.chars().peekable();
    let mut next = 0usize;
    // A number, then `$` if it is a position.
    let number = |chars: &mut std::iter::Peekable<std::str::Chars>| {
        let mut n: Option<usize> = None;
        while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
            n = Some(n.unwrap_or(0) * 10 + d as usize);
            chars.next();
        }
        n
    };
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            out.push('%');
            continue;
        }
        let mut position = None;
        let mut left = false;
        let mut width: Option<i64> = None;
        // `%n$…`, or a width right after `%`.
        let n = number(&mut chars);
        if let (Some(n), Some('$')) = (n, chars.peek()) {
            chars.next();
            if n == 0 {
                return Err(bad(
                    "format specifies argument 0, but arguments are numbered from 1",
                ));
            }
            position = Some(n - 1);
        } else if let Some(n) = n {
            width = Some(n as i64);
        }
        if width.is_none() {
            while chars.peek() == Some(&'-') {
                chars.next();
                left = true;
            }
            if chars.peek() == Some(&'*') {
                chars.next();
                let at = match (number(&mut chars), chars.peek()) {
                    (Some(n), Some('$')) => {
                        chars.next();
                        n.checked_sub(1).ok_or_else(|| {
                            bad("format specifies argument 0, but arguments are numbered from 1")
                        })?
                    }
                    _ => {
                        next += 1;
                        next - 1
                    }
                };
                let w = args
                    .get(at)
                    .ok_or_else(|| bad("too few arguments for format()"))?;
                width = match w.cast_to(&DataType::Int64) {
                    Ok(ScalarValue::Int64(v)) => Some(v.unwrap_or(0)),
                    _ => return Err(bad("width argument must be an integer")),
                };
            } else {
                width = number(&mut chars).map(|n| n as i64);
            }
        }
        let kind = chars
            .next()
            .ok_or_else(|| bad("unterminated format() type specifier"))?;
        let at = position.unwrap_or_else(|| {
            next += 1;
            next - 1
        });
        next = at + 1;
        let arg = args
            .get(at)
            .ok_or_else(|| bad("too few arguments for format()"))?;
        let value = pg_text(arg);
        let piece = match kind {
            's' => value.unwrap_or_default(),
            'I' => match value {
                Some(v) => quote_ident(&v),
                None => {
                    return Err(external(
                        ErrorKind::InvalidParameter,
                        "null values cannot be formatted as an SQL identifier",
                    ))
                }
            },
            'L' => value.map_or("NULL".to_string(), |v| quote_literal(&v)),
            other => {
                return Err(bad(&format!(
                    "unrecognized format() type specifier \"{other}\""
                )))
            }
        };
        let mut w = width.unwrap_or(0);
        if w < 0 {
            left = true;
            w = -w;
        }
        let pad = (w as usize).saturating_sub(piece.chars().count());
        if left {
            out.push_str(&piece);
            out.extend(std::iter::repeat_n(' ', pad));
        } else {
            out.extend(std::iter::repeat_n(' ', pad));
            out.push_str(&piece);
        }
    }
    Ok(text(Some(out)))
}

/// PostgreSQL's `age(a, b)`: `a - b` in years, months and days as the calendar counts
/// them (a month borrowed is the length of the month it is borrowed from), then time.
fn age(a: &[ScalarValue]) -> Result<ScalarValue> {
    use chrono::{Datelike, NaiveDate, Timelike};
    let micros = |v: &ScalarValue| match v.cast_to(&DataType::Timestamp(
        datafusion::arrow::datatypes::TimeUnit::Microsecond,
        None,
    )) {
        Ok(ScalarValue::TimestampMicrosecond(Some(us), _)) => Some(us),
        _ => None,
    };
    let (Some(t1), Some(t2)) = (micros(&a[0]), micros(&a[1])) else {
        return Ok(ScalarValue::IntervalMonthDayNano(None));
    };
    let at = |us: i64| chrono::DateTime::from_timestamp_micros(us).map(|d| d.naive_utc());
    let (Some(d1), Some(d2)) = (at(t1), at(t2)) else {
        return Ok(ScalarValue::IntervalMonthDayNano(None));
    };
    let fields = |d: &chrono::NaiveDateTime| {
        [
            d.year() as i64,
            d.month() as i64,
            d.day() as i64,
            d.hour() as i64,
            d.minute() as i64,
            d.second() as i64,
            (d.nanosecond() / 1_000) as i64,
        ]
    };
    let (f1, f2) = (fields(&d1), fields(&d2));
    let mut f: Vec<i64> = f1.iter().zip(f2.iter()).map(|(x, y)| x - y).collect();
    let negative = t1 < t2;
    if negative {
        f.iter_mut().for_each(|x| *x = -*x);
    }
    // Borrow from the next larger field, microseconds up to months.
    let limits = [0, 12, 0, 24, 60, 60, 1_000_000];
    for i in (4..7).rev() {
        while f[i] < 0 {
            f[i] += limits[i];
            f[i - 1] -= 1;
        }
    }
    while f[3] < 0 {
        f[3] += 24;
        f[2] -= 1;
    }
    // A day borrowed is a month of the earlier timestamp's length.
    let (y, m) = if negative {
        (f1[0], f1[1])
    } else {
        (f2[0], f2[1])
    };
    let month_days = |y: i64, m: i64| {
        let first = NaiveDate::from_ymd_opt(y as i32, m as u32, 1);
        let next = if m == 12 {
            NaiveDate::from_ymd_opt(y as i32 + 1, 1, 1)
        } else {
            NaiveDate::from_ymd_opt(y as i32, m as u32 + 1, 1)
        };
        match (first, next) {
            (Some(a), Some(b)) => (b - a).num_days(),
            _ => 30,
        }
    };
    while f[2] < 0 {
        f[2] += month_days(y, m);
        f[1] -= 1;
    }
    while f[1] < 0 {
        f[1] += 12;
        f[0] -= 1;
    }
    if negative {
        f.iter_mut().for_each(|x| *x = -*x);
    }
    let months = f[0] * 12 + f[1];
    let nanos = ((f[3] * 60 + f[4]) * 60 + f[5]) * 1_000_000_000 + f[6] * 1_000;
    let (Ok(months), Ok(days)) = (i32::try_from(months), i32::try_from(f[2])) else {
        return Err(external(
            ErrorKind::NumericOutOfRange,
            "interval out of range",
        ));
    };
    Ok(ScalarValue::IntervalMonthDayNano(Some(
        IntervalMonthDayNano::new(months, days, nanos),
    )))
}

/// `upper(text)` as PostgreSQL's: each character to its upper case where that is one
/// character (`ß` stays `ß`), where DataFusion's may lengthen the text (`SS`).
#[derive(Debug, PartialEq, Eq, Hash)]
struct Upper {
    signature: Signature,
}

impl Default for Upper {
    fn default() -> Upper {
        Upper {
            signature: Signature::string(1, Volatility::Immutable),
        }
    }
}

fn upper_text(s: &str) -> String {
    s.chars()
        .map(|c| {
            let mut up = c.to_uppercase();
            match (up.next(), up.next()) {
                (Some(u), None) => u,
                _ => c,
            }
        })
        .collect()
}

impl ScalarUDFImpl for Upper {
    fn name(&self) -> &str {
        "upper"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        use datafusion::arrow::array::{AsArray, StringArray};
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let text = datafusion::arrow::compute::cast(&arrays[0], &DataType::Utf8)?;
        let upper: StringArray = text
            .as_string::<i32>()
            .iter()
            .map(|s| s.map(upper_text))
            .collect();
        let upper: Arc<dyn Array> = Arc::new(upper);
        Ok(
            match args
                .args
                .iter()
                .all(|a| matches!(a, ColumnarValue::Scalar(_)))
            {
                true => ColumnarValue::Scalar(ScalarValue::try_from_array(&upper, 0)?),
                false => ColumnarValue::Array(upper),
            },
        )
    }
}

/// What `Length` counts in a text: its characters (`length`, `char_length`,
/// `character_length`) or its bytes (`octet_length`). A bytea's length is its bytes either
/// way.
#[derive(Debug, PartialEq, Eq, Hash, Clone, Copy)]
enum Counts {
    Characters,
    Bytes,
}

/// The length functions as PostgreSQL counts. DataFusion's read a bytea as UTF-8 text,
/// so `length('\xe282ac'::bytea)` was 1 (one character) where PostgreSQL gives 3, a byte
/// that is not UTF-8 was an error, and `octet_length` refused a bytea. (PostgreSQL has
/// no `char_length(bytea)`; here it is the bytes, as `length`.)
#[derive(Debug, PartialEq, Eq, Hash)]
struct Length {
    counts: Counts,
    aliases: Vec<String>,
    signature: Signature,
}

impl Length {
    fn new(counts: Counts) -> Length {
        let bytes = [
            DataType::Binary,
            DataType::LargeBinary,
            DataType::BinaryView,
        ];
        // The bytea forms first: a text form tried first refuses a bytea for good.
        let mut accepts: Vec<TypeSignature> = bytes.map(|t| TypeSignature::Exact(vec![t])).into();
        accepts.push(TypeSignature::String(1));
        Length {
            counts,
            aliases: match counts {
                Counts::Characters => vec!["length".into(), "char_length".into()],
                Counts::Bytes => Vec::new(),
            },
            signature: Signature::one_of(accepts, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for Length {
    fn name(&self) -> &str {
        match self.counts {
            Counts::Characters => "character_length",
            Counts::Bytes => "octet_length",
        }
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int32)
    }

    /// Bytes by Arrow's `length` kernel, characters by DataFusion's own `character_length`
    /// (which reads only text here), both as int4.
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let bytea = matches!(
            args.args[0].data_type(),
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView
        );
        let counted = match (bytea, self.counts) {
            (false, Counts::Characters) => {
                datafusion::functions::unicode::character_length().invoke_with_args(args)?
            }
            _ => {
                let length = datafusion::arrow::compute::kernels::length::length;
                match &args.args[0] {
                    ColumnarValue::Array(a) => ColumnarValue::Array(length(a)?),
                    ColumnarValue::Scalar(v) => ColumnarValue::Scalar(ScalarValue::try_from_array(
                        &length(&v.to_array()?)?,
                        0,
                    )?),
                }
            }
        };
        counted.cast_to(&DataType::Int32, None)
    }
}

/// A float argument of a `make_*` function (NULL: `None`).
fn float_arg(v: &ScalarValue) -> Option<f64> {
    match v.cast_to(&DataType::Float64) {
        Ok(ScalarValue::Float64(f)) => f,
        _ => None,
    }
}

/// `make_interval(years, months, weeks, days, hours, mins, secs)`.
fn make_interval(a: &[ScalarValue]) -> Result<ScalarValue> {
    let Some(v) = a.iter().map(float_arg).collect::<Option<Vec<f64>>>() else {
        return Ok(ScalarValue::IntervalMonthDayNano(None));
    };
    let whole = |x: f64| x.trunc() as i64;
    let months = whole(v[0]) * 12 + whole(v[1]);
    let days = whole(v[2]) * 7 + whole(v[3]);
    let micros = ((v[4] * 3600.0 + v[5] * 60.0 + v[6]) * 1e6).round();
    let (Ok(months), Ok(days), true) = (
        i32::try_from(months),
        i32::try_from(days),
        micros.is_finite() && micros.abs() < 9.2e15,
    ) else {
        return Err(external(
            ErrorKind::NumericOutOfRange,
            "interval out of range",
        ));
    };
    Ok(ScalarValue::IntervalMonthDayNano(Some(
        IntervalMonthDayNano::new(months, days, micros as i64 * 1_000),
    )))
}

/// `make_timestamp(year, month, day, hour, min, sec)`, `sec` with its fraction.
fn make_timestamp(a: &[ScalarValue]) -> Result<ScalarValue> {
    let none = ScalarValue::TimestampMicrosecond(None, None);
    let Some(v) = a.iter().map(float_arg).collect::<Option<Vec<f64>>>() else {
        return Ok(none);
    };
    let out_of_range = || {
        external(
            ErrorKind::DatetimeOutOfRange,
            &format!(
                "date field value out of range: {}-{:02}-{:02}",
                v[0] as i64, v[1] as i64, v[2] as i64
            ),
        )
    };
    let date = chrono::NaiveDate::from_ymd_opt(v[0] as i32, v[1] as u32, v[2] as u32)
        .ok_or_else(out_of_range)?;
    if !(0.0..24.0).contains(&v[3]) || !(0.0..60.0).contains(&v[4]) || !(0.0..60.0).contains(&v[5])
    {
        return Err(external(
            ErrorKind::DatetimeOutOfRange,
            &format!(
                "time field value out of range: {}:{:02}:{:02}",
                v[3], v[4], v[5]
            ),
        ));
    }
    let midnight = date.and_hms_opt(0, 0, 0).ok_or_else(out_of_range)?;
    let us = midnight.and_utc().timestamp_micros()
        + ((v[3] * 3600.0 + v[4] * 60.0 + v[5]) * 1e6).round() as i64;
    Ok(ScalarValue::TimestampMicrosecond(Some(us), None))
}

/// `has_table_privilege([role,] table, privileges)`: whether the role (the session's
/// when not given) holds any of the privileges (`'SELECT'`, `'INSERT, SELECT'`, each
/// optionally `WITH GRANT OPTION`) on the stream or metric, as the access rules decide.
/// UPDATE, DELETE, TRUNCATE, REFERENCES and TRIGGER are the owner's. The catalog's own
/// tables are readable by every role.
fn table_privilege(snapshot: &Snapshot, a: &[ScalarValue]) -> Result<ScalarValue> {
    use eddy_planner::access::Need;
    let (role, table, privileges) = match a {
        [role, table, privileges] => (
            match oid(role).and_then(|o| snapshot.role_name(o)) {
                Some(name) if !matches!(role, ScalarValue::Utf8(_)) => Some(name.to_string()),
                _ => pg_text(role),
            },
            table,
            privileges,
        ),
        [table, privileges] => (
            Some(
                crate::sql::query::session_setting("session_authorization")
                    .unwrap_or_else(|| ROLE_NAME.to_string()),
            ),
            table,
            privileges,
        ),
        _ => return Ok(ScalarValue::Boolean(None)),
    };
    let (Some(role), Some(privileges)) = (role, pg_text(privileges)) else {
        return Ok(ScalarValue::Boolean(None));
    };
    if role != eddy_planner::access::SUPERUSER && !snapshot.access.roles.contains_key(&role) {
        return Err(external(
            ErrorKind::UndefinedObject,
            &format!("role \"{role}\" does not exist"),
        ));
    }
    let relation = match table {
        ScalarValue::Utf8(Some(name)) => match snapshot.regclass(name) {
            Some(o) => snapshot.relation(o),
            None => {
                return Err(external(
                    ErrorKind::UndefinedTable,
                    &format!("relation \"{name}\" does not exist"),
                ))
            }
        },
        other => oid(other).and_then(|o| snapshot.relation(o)),
    };
    let mut needs = Vec::new();
    for privilege in privileges.split(',') {
        let word = privilege.trim().to_ascii_uppercase();
        let word = word.trim_end_matches("WITH GRANT OPTION").trim();
        let Some(r) = relation else {
            // A catalog table: readable by all.
            needs.push(None);
            continue;
        };
        needs.push(Some(match word {
            "SELECT" => Need::Select(r.name.clone()),
            "INSERT" => Need::Insert(r.name.clone()),
            "UPDATE" | "DELETE" | "TRUNCATE" | "REFERENCES" | "TRIGGER" => {
                Need::Own(r.name.clone())
            }
            _ => {
                return Err(external(
                    ErrorKind::InvalidParameter,
                    &format!("unrecognized privilege type: \"{}\"", privilege.trim()),
                ))
            }
        }));
    }
    let held = needs.iter().any(|need| match need {
        None => true,
        Some(need) => snapshot.access.may(snapshot, &role, need),
    });
    Ok(ScalarValue::Boolean(Some(held)))
}

/// PostgreSQL's `pg_size_pretty(bigint)`: bytes below 10 kB, then the largest unit that
/// keeps the number below 20 × 1024 − 1, rounded half away from zero.
fn size_pretty(bytes: i64) -> String {
    // (name, limit, rounded, bits)
    const UNITS: [(&str, i64, bool, u32); 6] = [
        ("bytes", 10 * 1024, false, 0),
        ("kB", 20 * 1024 - 1, true, 10),
        ("MB", 20 * 1024 - 1, true, 20),
        ("GB", 20 * 1024 - 1, true, 30),
        ("TB", 20 * 1024 - 1, true, 40),
        ("PB", 20 * 1024 - 1, true, 50),
    ];
    let half_rounded = |x: i64| (x + if x < 0 { -1 } else { 1 }) / 2;
    let mut size = bytes;
    for (i, (name, limit, round, bits)) in UNITS.iter().enumerate() {
        let last = i + 1 == UNITS.len();
        if last || size.abs() < *limit {
            let size = if *round { half_rounded(size) } else { size };
            return format!("{size} {name}");
        }
        let (_, _, next_round, next_bits) = UNITS[i + 1];
        let shift = next_bits - bits - u32::from(next_round) + u32::from(*round);
        size /= 1i64 << shift;
    }
    unreachable!("the last unit always answers")
}
