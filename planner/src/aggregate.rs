//! Aggregate arithmetic: per-group running state that events enter and leave.
//!
//! Invariants: every state is exact under any interleaving of `insert` and `remove`
//! (float sums are `exact::ExactSum`s, variance comes from exact moments), and
//! no single update costs more than O(log window): MIN/MAX, the percentiles and COUNT
//! DISTINCT keep a value→count ordered multiset with order statistics (`Counts`).

use std::cmp::Ordering;

use crate::codec::{decode_value, encode_value, Reader};
pub use crate::exact::ExactSum;
use crate::prefetch;
use crate::ranked::Ranked;
use crate::types::{ColumnType, Value, I128};

/// The aggregate functions of the dialect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AggFunc {
    CountStar,
    Count,
    Sum,
    Avg,
    Min,
    Max,
    StddevSamp,
    StddevPop,
    VarSamp,
    VarPop,
    CountDistinct,
    LastValue,
    /// `PERCENTILE_CONT(f) WITHIN GROUP (ORDER BY x)`; `MEDIAN(x)` is f = 0.5.
    PercentileCont(Fraction),
    /// `PERCENTILE_DISC(f) WITHIN GROUP (ORDER BY x)`.
    PercentileDisc(Fraction),
}

/// A percentile's fraction, 0 ≤ f ≤ 1, and its order: `ORDER BY x` or `ORDER BY x DESC`.
/// Ordered and hashed by its bits: those of f (which order non-negative doubles as
/// numbers), with the sign bit, which f never uses, set for DESC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fraction(u64);

const DESCENDING: u64 = 1 << 63;

impl Fraction {
    pub const HALF: Fraction = Fraction(0x3FE0_0000_0000_0000);

    /// `f` over ascending values, if it lies in [0, 1] (-0 is 0).
    pub fn new(f: f64) -> Option<Fraction> {
        (0.0..=1.0)
            .contains(&f)
            .then(|| Fraction((f + 0.0).to_bits()))
    }

    /// The same fraction over descending values.
    pub fn descending(self) -> Fraction {
        Fraction(self.0 | DESCENDING)
    }

    pub fn get(self) -> f64 {
        f64::from_bits(self.0 & !DESCENDING)
    }

    pub fn is_descending(self) -> bool {
        self.0 & DESCENDING != 0
    }
}

impl AggFunc {
    /// Resolves a function name as written in SQL; `distinct` only combines with COUNT.
    pub fn from_sql(name: &str, distinct: bool, star: bool) -> Option<AggFunc> {
        let name = name.to_ascii_lowercase();
        Some(match (name.as_str(), distinct, star) {
            ("count", false, true) => AggFunc::CountStar,
            ("count", false, false) => AggFunc::Count,
            ("count", true, false) => AggFunc::CountDistinct,
            ("sum", false, false) => AggFunc::Sum,
            ("avg", false, false) => AggFunc::Avg,
            ("min", false, false) => AggFunc::Min,
            ("max", false, false) => AggFunc::Max,
            ("stddev" | "stddev_samp", false, false) => AggFunc::StddevSamp,
            ("stddev_pop", false, false) => AggFunc::StddevPop,
            ("variance" | "var_samp", false, false) => AggFunc::VarSamp,
            ("var_pop", false, false) => AggFunc::VarPop,
            ("last_value", false, false) => AggFunc::LastValue,
            ("median", false, false) => AggFunc::PercentileCont(Fraction::HALF),
            _ => return None,
        })
    }

    pub fn sql_name(self) -> &'static str {
        match self {
            AggFunc::CountStar | AggFunc::Count => "COUNT",
            AggFunc::Sum => "SUM",
            AggFunc::Avg => "AVG",
            AggFunc::Min => "MIN",
            AggFunc::Max => "MAX",
            AggFunc::StddevSamp => "STDDEV_SAMP",
            AggFunc::StddevPop => "STDDEV_POP",
            AggFunc::VarSamp => "VAR_SAMP",
            AggFunc::VarPop => "VAR_POP",
            AggFunc::CountDistinct => "COUNT",
            AggFunc::LastValue => "LAST_VALUE",
            AggFunc::PercentileCont(_) => "PERCENTILE_CONT",
            AggFunc::PercentileDisc(_) => "PERCENTILE_DISC",
        }
    }

    pub fn needs_numeric(self) -> bool {
        matches!(
            self,
            AggFunc::Sum
                | AggFunc::Avg
                | AggFunc::StddevSamp
                | AggFunc::StddevPop
                | AggFunc::VarSamp
                | AggFunc::VarPop
                | AggFunc::PercentileCont(_)
        )
    }

    /// The result type for an argument of type `arg` (`None` for `COUNT(*)`).
    pub fn result_type(self, arg: Option<ColumnType>) -> ResultType {
        match self {
            AggFunc::CountStar | AggFunc::Count | AggFunc::CountDistinct => {
                ResultType::Column(ColumnType::Int64)
            }
            AggFunc::Sum if arg.is_some_and(|t| t.is_integer()) => ResultType::Numeric,
            AggFunc::Sum
            | AggFunc::Avg
            | AggFunc::StddevSamp
            | AggFunc::StddevPop
            | AggFunc::VarSamp
            | AggFunc::VarPop
            | AggFunc::PercentileCont(_) => ResultType::Column(ColumnType::Float64),
            AggFunc::Min | AggFunc::Max | AggFunc::LastValue | AggFunc::PercentileDisc(_) => {
                ResultType::Column(arg.unwrap_or(ColumnType::Int64))
            }
        }
    }

    /// The function whose state this one reads: SUM and AVG of a column share one exact
    /// sum, MIN, MAX, COUNT DISTINCT and the percentiles one ordered multiset (COUNT
    /// DISTINCT is its number of values), the variances one pair of moments.
    pub fn state_func(self) -> AggFunc {
        match self {
            AggFunc::Avg => AggFunc::Sum,
            AggFunc::Max
            | AggFunc::CountDistinct
            | AggFunc::PercentileCont(_)
            | AggFunc::PercentileDisc(_) => AggFunc::Min,
            AggFunc::StddevPop | AggFunc::VarSamp | AggFunc::VarPop => AggFunc::StddevSamp,
            other => other,
        }
    }

    /// A fresh state for this function over an argument of type `arg`.
    pub fn new_state(self, arg: Option<ColumnType>) -> AggState {
        match self {
            AggFunc::CountStar | AggFunc::Count => AggState::Count(0),
            AggFunc::Sum | AggFunc::Avg if arg.is_some_and(|t| t.is_integer()) => {
                AggState::SumInt {
                    sum: I128::default(),
                    n: 0,
                }
            }
            AggFunc::Sum | AggFunc::Avg => AggState::SumFloat {
                sum: ExactSum::default(),
                n: 0,
            },
            AggFunc::StddevSamp | AggFunc::StddevPop | AggFunc::VarSamp | AggFunc::VarPop => {
                AggState::Moments {
                    s: Box::default(),
                    n: 0,
                }
            }
            AggFunc::Min
            | AggFunc::Max
            | AggFunc::PercentileCont(_)
            | AggFunc::PercentileDisc(_)
            | AggFunc::CountDistinct => AggState::Extreme(Counts::default()),
            AggFunc::LastValue => AggState::Last(None),
        }
    }
}

/// What an aggregate returns: a stream column type, or NUMERIC for exact integer sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultType {
    Column(ColumnType),
    Numeric,
}

/// A value with a total order, for the MIN/MAX multiset (NaN sorts above every number).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrdValue(pub Value);

impl Ord for OrdValue {
    fn cmp(&self, other: &Self) -> Ordering {
        cmp_values(&self.0, &other.0)
    }
}

/// `OrdValue`'s order: equal exactly when `Value`'s equality says so (-0 is 0, and every
/// NaN is one NaN, above every number).
fn cmp_values(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Int(a), Value::Int(b)) => a.cmp(b),
        (Value::Float(a), Value::Float(b)) => {
            let canonical = |x: f64| {
                if x == 0.0 {
                    0.0
                } else if x.is_nan() {
                    f64::NAN
                } else {
                    x
                }
            };
            canonical(*a).total_cmp(&canonical(*b))
        }
        (Value::Text(a), Value::Text(b)) => a.cmp(b),
        (Value::Timestamp(a), Value::Timestamp(b)) => a.cmp(b),
        (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
        (Value::Numeric(a), Value::Numeric(b)) => a.cmp(b),
        (a, b) => rank(a).cmp(&rank(b)),
    }
}

fn rank(v: &Value) -> u8 {
    match v {
        Value::Null => 0,
        Value::Bool(_) => 1,
        Value::Int(_) => 2,
        Value::Numeric(_) => 3,
        Value::Float(_) => 4,
        Value::Text(_) => 5,
        Value::Timestamp(_) => 6,
    }
}

impl PartialOrd for OrdValue {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// `a * b` as an exact unevaluated sum `p + e`.
fn two_product(a: f64, b: f64) -> (f64, f64) {
    let p = a * b;
    (p, a.mul_add(b, -p))
}

/// A value as exact double parts for the moment sums: a float is itself; a 64-bit
/// integer is split into a high and a low 32-bit part, each exact as a double.
fn moment_term(v: &Value) -> Option<MomentTerm> {
    match v {
        Value::Int(x) => {
            let hi = ((*x >> 32) << 32) as f64;
            let lo = (*x & 0xffff_ffff) as f64;
            Some(MomentTerm::Split(hi, lo))
        }
        other => other.as_f64().map(MomentTerm::One),
    }
}

enum MomentTerm {
    One(f64),
    Split(f64, f64),
}

/// Adds (`sign` = 1) or removes (`sign` = −1) x to Σx and x² to Σx², exactly.
fn add_term(s1: &mut ExactSum, s2: &mut ExactSum, term: MomentTerm, sign: f64) {
    let put = |s: &mut ExactSum, x: f64| {
        if sign > 0.0 {
            s.add(x)
        } else {
            s.sub(x)
        }
    };
    match term {
        MomentTerm::One(x) => {
            put(s1, x);
            let (p, e) = two_product(x, x);
            put(s2, p);
            put(s2, e);
        }
        MomentTerm::Split(hi, lo) => {
            put(s1, hi);
            put(s1, lo);
            // (hi + lo)² = hi² + 2·hi·lo + lo², each product exact as p + e.
            for (a, b, k) in [(hi, hi, 1.0), (hi, lo, 2.0), (lo, lo, 1.0)] {
                let (p, e) = two_product(a, b);
                put(s2, p * k);
                put(s2, e * k);
            }
        }
    }
}

/// The running state of one aggregate for one group.
#[derive(Clone, Debug, PartialEq)]
pub enum AggState {
    Count(i64),
    SumInt {
        sum: I128,
        n: i64,
    },
    SumFloat {
        sum: ExactSum,
        n: i64,
    },
    /// Σx and Σx² (boxed: variance is rare, and every state is as large as the largest).
    Moments {
        s: Box<[ExactSum; 2]>,
        n: i64,
    },
    Extreme(Counts),
    /// The newest event's value with its (event time, arrival sequence), boxed: it is
    /// rare, and every state is as large as the largest.
    Last(Option<Box<(i64, u64, Value)>>),
}

const STATE_COUNT: u8 = 1;
const STATE_SUM_INT: u8 = 2;
const STATE_SUM_FLOAT: u8 = 3;
const STATE_MOMENTS: u8 = 4;
const STATE_EXTREME: u8 = 5;
const STATE_LAST: u8 = 7;

impl AggState {
    /// The state's compact binary form (the state store's value for it).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            AggState::Count(n) => {
                out.push(STATE_COUNT);
                out.extend_from_slice(&n.to_le_bytes());
            }
            AggState::SumInt { sum, n } => {
                out.push(STATE_SUM_INT);
                out.extend_from_slice(&sum.get().to_le_bytes());
                out.extend_from_slice(&n.to_le_bytes());
            }
            AggState::SumFloat { sum, n } => {
                out.push(STATE_SUM_FLOAT);
                sum.encode(out);
                out.extend_from_slice(&n.to_le_bytes());
            }
            AggState::Moments { s, n } => {
                out.push(STATE_MOMENTS);
                s[0].encode(out);
                s[1].encode(out);
                out.extend_from_slice(&n.to_le_bytes());
            }
            AggState::Extreme(counts) => {
                out.push(STATE_EXTREME);
                out.extend_from_slice(&(counts.len() as u32).to_le_bytes());
                for (v, c) in counts.iter() {
                    encode_value(&v, out);
                    out.extend_from_slice(&c.to_le_bytes());
                }
            }
            AggState::Last(last) => {
                out.push(STATE_LAST);
                match last.as_deref() {
                    None => out.push(0),
                    Some((ts, seq, v)) => {
                        out.push(1);
                        out.extend_from_slice(&ts.to_le_bytes());
                        out.extend_from_slice(&seq.to_le_bytes());
                        encode_value(v, out);
                    }
                }
            }
        }
    }

    /// Reads a state back; `None` unless the bytes are exactly one encoded state.
    pub fn decode(bytes: &[u8]) -> Option<AggState> {
        let mut r = Reader(bytes);
        let state = match r.u8()? {
            STATE_COUNT => AggState::Count(r.i64()?),
            STATE_SUM_INT => AggState::SumInt {
                sum: r.i128()?.into(),
                n: r.i64()?,
            },
            STATE_SUM_FLOAT => AggState::SumFloat {
                sum: ExactSum::decode(&mut r)?,
                n: r.i64()?,
            },
            STATE_MOMENTS => AggState::Moments {
                s: Box::new([ExactSum::decode(&mut r)?, ExactSum::decode(&mut r)?]),
                n: r.i64()?,
            },
            STATE_EXTREME => {
                let n = r.u32()?;
                let mut counts = Counts::default();
                for _ in 0..n {
                    let v = decode_value(&mut r)?;
                    counts.add(&v, r.u32()?);
                }
                AggState::Extreme(counts)
            }
            STATE_LAST => match r.u8()? {
                0 => AggState::Last(None),
                1 => AggState::Last(Some(Box::new((r.i64()?, r.u64()?, decode_value(&mut r)?)))),
                _ => return None,
            },
            _ => return None,
        };
        r.is_empty().then_some(state)
    }
}

impl AggState {
    /// Applies an event whose argument value is `v` (ignored for `COUNT(*)`).
    pub fn insert(&mut self, func: AggFunc, v: &Value, ts: i64, seq: u64) {
        if matches!(func, AggFunc::CountStar) {
            if let AggState::Count(n) = self {
                *n += 1;
            }
            return;
        }
        if matches!(func, AggFunc::LastValue) {
            if let AggState::Last(last) = self {
                let newer = match last.as_deref() {
                    Some((lts, lseq, _)) => (ts, seq) > (*lts, *lseq),
                    None => true,
                };
                if newer {
                    *last = Some(Box::new((ts, seq, v.clone())));
                }
            }
            return;
        }
        if v.is_null() {
            return;
        }
        match self {
            AggState::Count(n) => *n += 1,
            AggState::SumInt { sum, n } => {
                if let Value::Int(x) = v {
                    *sum = (sum.get() + *x as i128).into();
                    *n += 1;
                }
            }
            AggState::SumFloat { sum, n } => {
                if let Some(x) = v.as_f64() {
                    sum.add(x);
                    *n += 1;
                }
            }
            AggState::Moments { s, n } => {
                if let Some(term) = moment_term(v) {
                    let [s1, s2] = &mut **s;
                    add_term(s1, s2, term, 1.0);
                }
                *n += 1;
            }
            AggState::Extreme(counts) => counts.add(v, 1),
            AggState::Last(_) => {}
        }
    }

    /// Removes an event that `insert` applied earlier with the same value.
    pub fn remove(&mut self, func: AggFunc, v: &Value) {
        if matches!(func, AggFunc::CountStar) {
            if let AggState::Count(n) = self {
                *n -= 1;
                assert!(*n >= 0);
            }
            return;
        }
        if matches!(func, AggFunc::LastValue) || v.is_null() {
            // LAST_VALUE only changes when the group empties, which drops the group.
            return;
        }
        match self {
            AggState::Count(n) => *n -= 1,
            AggState::SumInt { sum, n } => {
                if let Value::Int(x) = v {
                    *sum = (sum.get() - *x as i128).into();
                    *n -= 1;
                }
            }
            AggState::SumFloat { sum, n } => {
                if let Some(x) = v.as_f64() {
                    sum.sub(x);
                    *n -= 1;
                }
            }
            AggState::Moments { s, n } => {
                if let Some(term) = moment_term(v) {
                    let [s1, s2] = &mut **s;
                    add_term(s1, s2, term, -1.0);
                }
                *n -= 1;
            }
            AggState::Extreme(counts) => counts.decrement(v),
            AggState::Last(_) => {}
        }
    }

    /// Asks for the cache lines of what the state keeps on the heap (a multiset's
    /// values), without waiting for them: the caller updates the state soon.
    pub fn prefetch(&self) {
        if let AggState::Extreme(counts) = self {
            counts.prefetch();
        }
    }

    /// The aggregate's value for the group as it stands.
    pub fn result(&self, func: AggFunc) -> Value {
        match (self, func) {
            (AggState::Count(n), _) => Value::Int(*n),
            (AggState::SumInt { n: 0, .. }, _) | (AggState::SumFloat { n: 0, .. }, _) => {
                Value::Null
            }
            (AggState::SumInt { sum, .. }, AggFunc::Sum) => Value::Numeric(*sum),
            (AggState::SumInt { sum, n }, _) => Value::Float(sum.get() as f64 / *n as f64),
            (AggState::SumFloat { sum, .. }, AggFunc::Sum) => Value::Float(sum.value()),
            (AggState::SumFloat { sum, n }, _) => Value::Float(sum.value() / *n as f64),
            (AggState::Moments { s, n }, _) => moments_result(func, &s[0], &s[1], *n),
            (AggState::Extreme(counts), AggFunc::Min) => counts.first().unwrap_or(Value::Null),
            (AggState::Extreme(counts), AggFunc::CountDistinct) => Value::Int(counts.len() as i64),
            (AggState::Extreme(counts), AggFunc::PercentileCont(f)) => percentile_cont(counts, f),
            (AggState::Extreme(counts), AggFunc::PercentileDisc(f)) => percentile_disc(counts, f),
            (AggState::Extreme(counts), _) => counts.last().unwrap_or(Value::Null),
            (AggState::Last(last), _) => last.as_ref().map_or(Value::Null, |l| l.2.clone()),
        }
    }
}

/// PostgreSQL's `percentile_cont`: the value at position f·(n − 1) of the n values in
/// order, interpolated linearly between its neighbours; NULL when there are none.
fn percentile_cont(counts: &Counts, f: Fraction) -> Value {
    let n = counts.total();
    if n == 0 {
        return Value::Null;
    }
    let pos = f.get() * (n - 1) as f64;
    let (lo, hi) = (pos.floor(), pos.ceil());
    let value = |k: f64| in_order(counts, f, k as u64).and_then(|v| v.as_f64());
    match (value(lo), value(hi)) {
        (Some(a), _) if lo == hi => Value::Float(a),
        (Some(a), Some(b)) => Value::Float(a + (b - a) * (pos - lo)),
        _ => Value::Null,
    }
}

/// PostgreSQL's `percentile_disc`: the first value, in order, whose cumulative share of
/// the n values reaches f; NULL when there are none.
fn percentile_disc(counts: &Counts, f: Fraction) -> Value {
    let n = counts.total();
    if n == 0 {
        return Value::Null;
    }
    let k = ((f.get() * n as f64).ceil() as u64).max(1);
    in_order(counts, f, k - 1).unwrap_or(Value::Null)
}

/// The k-th value (from 0) of the multiset in `f`'s order.
fn in_order(counts: &Counts, f: Fraction, k: u64) -> Option<Value> {
    let k = match f.is_descending() {
        true => counts.total().checked_sub(k + 1)?,
        false => k,
    };
    counts.nth(k)
}

impl Default for OrdValue {
    fn default() -> OrdValue {
        OrdValue(Value::Null)
    }
}

/// A multiset of values as value → count, in `OrdValue` order (which agrees with
/// `Value`'s equality): a sorted vector while small, an order-statistic tree once
/// large. A group's multiset usually holds a few values, and then one allocation and a
/// binary search over it cost a cache miss or two, where a tree's nodes cost several.
/// Integers, floats and timestamps (a column's values are all one kind) are kept as
/// order-preserving words, one per copy (`Words`): 8 bytes a copy instead of 32 a
/// value, compared as integers. Removing the last copy of a value removes the value.
#[derive(Clone, Debug)]
pub enum Counts {
    Words(Words),
    Small(Vec<(OrdValue, u32)>),
    Large(Box<Ranked<OrdValue>>),
}

/// Values of one kind as words in order, one word per copy, and how many distinct
/// values they are. A window's values are mostly distinct, so a copy's word costs what
/// a value with its count would cost in half the bytes, and a group's multiset spans
/// half the cache lines; the k-th copy is the k-th word.
#[derive(Clone, Debug)]
pub struct Words {
    kind: WordKind,
    copies: Vec<u64>,
    distinct: u32,
}

impl Words {
    /// Where the first copy of `w` is, or would go.
    fn position(&self, w: u64) -> usize {
        self.copies.partition_point(|&x| x < w)
    }

    fn add(&mut self, w: u64, n: u32) {
        let at = self.position(w);
        if self.copies.get(at) != Some(&w) {
            self.distinct += 1;
        }
        match n {
            1 => self.copies.insert(at, w),
            n => {
                self.copies
                    .splice(at..at, std::iter::repeat_n(w, n as usize));
            }
        }
    }

    /// Removes one copy of `w`, which was added.
    fn decrement(&mut self, w: u64) {
        let at = self.position(w);
        assert_eq!(self.copies.get(at), Some(&w), "removed value was inserted");
        self.copies.remove(at);
        if self.copies.get(at) != Some(&w) {
            self.distinct -= 1;
        }
    }

    /// The values with their counts, in order.
    fn runs(&self) -> impl Iterator<Item = (Value, u32)> + '_ {
        self.copies
            .chunk_by(|a, b| a == b)
            .map(|run| (from_word(self.kind, run[0]), run.len() as u32))
    }
}

/// The kind of value a word stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WordKind {
    Int,
    Float,
    Timestamp,
}

const SIGN: u64 = 1 << 63;

/// `v` as a word whose unsigned order is `cmp_values`' order within its kind, and whose
/// equality is `Value`'s (-0 is 0, every NaN is one NaN, above every number).
fn to_word(v: &Value) -> Option<(WordKind, u64)> {
    match v {
        Value::Int(x) => Some((WordKind::Int, *x as u64 ^ SIGN)),
        Value::Timestamp(x) => Some((WordKind::Timestamp, *x as u64 ^ SIGN)),
        Value::Float(x) => {
            let bits = if *x == 0.0 {
                0
            } else if x.is_nan() {
                f64::NAN.to_bits()
            } else {
                x.to_bits()
            };
            let word = if bits & SIGN != 0 { !bits } else { bits | SIGN };
            Some((WordKind::Float, word))
        }
        _ => None,
    }
}

fn from_word(kind: WordKind, w: u64) -> Value {
    match kind {
        WordKind::Int => Value::Int((w ^ SIGN) as i64),
        WordKind::Timestamp => Value::Timestamp((w ^ SIGN) as i64),
        WordKind::Float => {
            let bits = if w & SIGN != 0 { w ^ SIGN } else { !w };
            Value::Float(f64::from_bits(bits))
        }
    }
}

/// Entries a `Counts` holds in its vector (copies as words, values otherwise); past
/// this it becomes a tree, and back once it holds below half as many copies (so a
/// multiset at the edge does not convert at every event).
const COUNTS_SMALL_MAX: usize = 64;

impl Default for Counts {
    fn default() -> Counts {
        Counts::Small(Vec::new())
    }
}

impl PartialEq for Counts {
    fn eq(&self, other: &Counts) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Counts {
    /// A vector form of values in order with their counts: words if they are all one kind.
    fn from_sorted(entries: Vec<(OrdValue, u32)>) -> Counts {
        let kind = entries
            .first()
            .and_then(|(v, _)| to_word(&v.0))
            .map(|(k, _)| k);
        let words: Option<Vec<u64>> = kind.and_then(|kind| {
            let mut copies = Vec::new();
            for (v, c) in &entries {
                let (_, w) = to_word(&v.0).filter(|w| w.0 == kind)?;
                copies.extend(std::iter::repeat_n(w, *c as usize));
            }
            Some(copies)
        });
        match (kind, words) {
            (Some(kind), Some(copies)) => Counts::Words(Words {
                kind,
                copies,
                distinct: entries.len() as u32,
            }),
            _ => Counts::Small(entries),
        }
    }

    /// The values with their counts, in order, in the general form.
    fn entries(&self) -> Vec<(OrdValue, u32)> {
        self.iter().map(|(v, c)| (OrdValue(v), c)).collect()
    }

    /// Distinct values held.
    pub fn len(&self) -> usize {
        match self {
            Counts::Words(w) => w.distinct as usize,
            Counts::Small(v) => v.len(),
            Counts::Large(m) => m.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies held, over all values.
    pub fn total(&self) -> u64 {
        match self {
            Counts::Words(w) => w.copies.len() as u64,
            Counts::Small(v) => v.iter().map(|(_, c)| *c as u64).sum(),
            Counts::Large(m) => m.total(),
        }
    }

    /// The value at 0-based position `k` when every copy is listed in order.
    pub fn nth(&self, mut k: u64) -> Option<Value> {
        match self {
            Counts::Large(m) => m.nth(k).map(|k| k.0.clone()),
            Counts::Words(w) => {
                let at = usize::try_from(k).ok()?;
                w.copies.get(at).map(|&x| from_word(w.kind, x))
            }
            Counts::Small(_) => self.iter().find_map(|(value, c)| {
                if k < c as u64 {
                    Some(value)
                } else {
                    k -= c as u64;
                    None
                }
            }),
        }
    }

    /// The values with their counts, in order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = (Value, u32)> + '_> {
        match self {
            Counts::Words(w) => Box::new(w.runs()),
            Counts::Small(v) => Box::new(v.iter().map(|(k, c)| (k.0.clone(), *c))),
            Counts::Large(m) => Box::new(m.iter().map(|(k, c)| (k.0.clone(), c))),
        }
    }

    pub fn first(&self) -> Option<Value> {
        match self {
            Counts::Words(w) => w.copies.first().map(|&x| from_word(w.kind, x)),
            Counts::Small(v) => v.first().map(|(k, _)| k.0.clone()),
            Counts::Large(m) => m.first().map(|k| k.0.clone()),
        }
    }

    pub fn last(&self) -> Option<Value> {
        match self {
            Counts::Words(w) => w.copies.last().map(|&x| from_word(w.kind, x)),
            Counts::Small(v) => v.last().map(|(k, _)| k.0.clone()),
            Counts::Large(m) => m.last().map(|k| k.0.clone()),
        }
    }

    /// Asks for every line the multiset keeps on the heap at once, before a search walks
    /// them one dependent miss at a time: a group's multiset is rarely in cache.
    pub fn prefetch(&self) {
        match self {
            Counts::Words(w) => prefetch::lines(&w.copies[..]),
            Counts::Small(v) => prefetch::lines(&v[..]),
            Counts::Large(m) => prefetch::lines(&**m),
        }
    }

    /// Adds `n` copies of `v`.
    pub fn add(&mut self, v: &Value, n: u32) {
        self.prefetch();
        match self {
            Counts::Words(words) => match to_word(v).filter(|w| w.0 == words.kind) {
                Some((_, w)) if words.copies.len() + n as usize <= COUNTS_SMALL_MAX => {
                    words.add(w, n)
                }
                Some(_) => {
                    *self = Counts::Large(Box::new(self.entries().into_iter().collect()));
                    self.add(v, n);
                }
                None => {
                    // Another kind of value: the general form holds both.
                    *self = Counts::Small(self.entries());
                    self.add(v, n);
                }
            },
            Counts::Small(vec) if vec.is_empty() && to_word(v).is_some() => {
                let (kind, _) = to_word(v).expect("a word");
                *self = Counts::Words(Words {
                    kind,
                    copies: Vec::new(),
                    distinct: 0,
                });
                self.add(v, n);
            }
            Counts::Small(vec) => match vec.binary_search_by(|(k, _)| cmp_values(&k.0, v)) {
                Ok(i) => vec[i].1 += n,
                Err(i) if vec.len() < COUNTS_SMALL_MAX => vec.insert(i, (OrdValue(v.clone()), n)),
                Err(_) => {
                    let mut m: Ranked<OrdValue> = std::mem::take(vec).into_iter().collect();
                    m.add(OrdValue(v.clone()), n);
                    *self = Counts::Large(Box::new(m));
                }
            },
            Counts::Large(m) => m.add(OrdValue(v.clone()), n),
        }
    }

    /// Removes one copy of `v`, which was added.
    pub fn decrement(&mut self, v: &Value) {
        self.prefetch();
        match self {
            Counts::Words(words) => {
                let w = to_word(v)
                    .filter(|w| w.0 == words.kind)
                    .expect("removed value was inserted")
                    .1;
                words.decrement(w);
            }
            Counts::Small(vec) => {
                let i = vec
                    .binary_search_by(|(k, _)| cmp_values(&k.0, v))
                    .expect("removed value was inserted");
                vec[i].1 -= 1;
                if vec[i].1 == 0 {
                    vec.remove(i);
                }
            }
            Counts::Large(m) => {
                let removed = m.decrement(&OrdValue(v.clone()));
                assert!(removed, "removed value was inserted");
                if m.total() < COUNTS_SMALL_MAX as u64 / 2 {
                    *self = Counts::from_sorted(self.entries());
                }
            }
        }
    }
}

/// Variance from exact moments: n·Σx² − (Σx)² is formed exactly, then rounded once.
fn moments_result(func: AggFunc, s1: &ExactSum, s2: &ExactSum, n: i64) -> Value {
    let sample = matches!(func, AggFunc::StddevSamp | AggFunc::VarSamp);
    if n == 0 || (sample && n == 1) {
        return Value::Null;
    }
    if s1.has_special() {
        return Value::Float(f64::NAN);
    }
    let nf = n as f64;
    let mut m = ExactSum::default();
    for &p in &s2.partials() {
        let (h, l) = two_product(p, nf);
        m.add(h);
        m.add(l);
    }
    let s1 = s1.partials();
    for &a in &s1 {
        for &b in &s1 {
            let (h, l) = two_product(a, b);
            m.sub(h);
            m.sub(l);
        }
    }
    let m = m.value().max(0.0);
    let var = if sample {
        m / nf / (nf - 1.0)
    } else {
        m / nf / nf
    };
    match func {
        AggFunc::StddevSamp | AggFunc::StddevPop => Value::Float(var.sqrt()),
        _ => Value::Float(var),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Numbers below `n`, from a xorshift generator seeded with `seed`.
    fn below(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |n| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        }
    }

    /// PostgreSQL's percentile_cont and percentile_disc over one multiset, with NULLs,
    /// duplicates and removals.
    #[test]
    fn percentiles_follow_postgresql() {
        let f = |x: f64| Fraction::new(x).unwrap();
        let mut state = AggFunc::Min.new_state(Some(ColumnType::Float64));
        let cont = |s: &AggState, x: f64| s.result(AggFunc::PercentileCont(f(x)));
        let disc = |s: &AggState, x: f64| s.result(AggFunc::PercentileDisc(f(x)));
        assert_eq!(cont(&state, 0.5), Value::Null);
        assert_eq!(disc(&state, 0.5), Value::Null);
        state.insert(AggFunc::Min, &Value::Null, 0, 0);
        assert_eq!(cont(&state, 0.5), Value::Null, "NULLs are skipped");
        for x in [4.0, 1.0, 3.0, 2.0] {
            state.insert(AggFunc::Min, &Value::Float(x), 0, 0);
        }
        // percentile_cont(0.5) of 1..4 is 2.5; (0.25) is 1.75; 0 and 1 are the ends.
        assert_eq!(cont(&state, 0.5), Value::Float(2.5));
        assert_eq!(cont(&state, 0.25), Value::Float(1.75));
        assert_eq!(cont(&state, 0.0), Value::Float(1.0));
        assert_eq!(cont(&state, 1.0), Value::Float(4.0));
        // percentile_disc: the first value whose cumulative share reaches f.
        assert_eq!(disc(&state, 0.0), Value::Float(1.0));
        assert_eq!(disc(&state, 0.25), Value::Float(1.0));
        assert_eq!(disc(&state, 0.26), Value::Float(2.0));
        assert_eq!(disc(&state, 0.5), Value::Float(2.0));
        assert_eq!(disc(&state, 1.0), Value::Float(4.0));
        // ORDER BY … DESC: the same formulas over the values from the largest.
        let desc = |x: f64| f(x).descending();
        let cont_desc = |s: &AggState, x: f64| s.result(AggFunc::PercentileCont(desc(x)));
        let disc_desc = |s: &AggState, x: f64| s.result(AggFunc::PercentileDisc(desc(x)));
        assert_eq!(cont_desc(&state, 0.25), Value::Float(3.25));
        assert_eq!(cont_desc(&state, 0.0), Value::Float(4.0));
        assert_eq!(disc_desc(&state, 0.25), Value::Float(4.0));
        assert_eq!(disc_desc(&state, 0.5), Value::Float(3.0));
        assert_eq!(disc_desc(&state, 1.0), Value::Float(1.0));
        assert_ne!(desc(0.5), f(0.5));
        assert_eq!(desc(0.5).get(), 0.5);
        state.insert(AggFunc::Min, &Value::Float(2.0), 0, 0);
        assert_eq!(cont(&state, 0.5), Value::Float(2.0), "duplicates count");
        state.remove(AggFunc::Min, &Value::Float(4.0));
        state.remove(AggFunc::Min, &Value::Float(1.0));
        assert_eq!(cont(&state, 0.5), Value::Float(2.0));
        assert_eq!(disc(&state, 1.0), Value::Float(3.0));
        assert_eq!(
            AggFunc::from_sql("MEDIAN", false, false),
            Some(AggFunc::PercentileCont(f(0.5)))
        );
        assert_eq!(Fraction::new(1.5), None);
        assert_eq!(Fraction::new(-0.0), Some(f(0.0)));
        assert_eq!(
            AggFunc::PercentileDisc(f(0.5)).result_type(Some(ColumnType::Text)),
            ResultType::Column(ColumnType::Text)
        );
    }

    /// A multiset that grows past its vector and shrinks back to empty agrees with a
    /// B-tree model: its size, first and last at every step; counts, order, k-th values
    /// and equality across the forms at every step while small (and at every change of
    /// form), every 16th while large.
    /// Floats include -0/0 and NaNs of other bits, which are one value each; integers
    /// and timestamps span both signs; a mixed multiset leaves the word form.
    #[test]
    fn counts_agree_with_a_model_across_every_form() {
        let odd_nan = f64::from_bits(f64::NAN.to_bits() | 1);
        let floats = |x: u64| match x {
            0 => Value::Float(-0.0),
            1 => Value::Float(0.0),
            2 => Value::Float(odd_nan),
            3 => Value::Float(f64::NAN),
            4 => Value::Float(f64::NEG_INFINITY),
            5 => Value::Float(f64::INFINITY),
            x => Value::Float(x as f64 - 100.5),
        };
        let ints = |x: u64| Value::Int((x as i64 - 100) * 0x0100_0000_0000_0000 / 64);
        let stamps = |x: u64| Value::Timestamp(x as i64 * 1_000_003 - 99_000_000);
        let texts = |x: u64| Value::Text(format!("v{x}").into());
        let mixed = |x: u64| match x % 16 {
            7 => Value::Int(x as i64),
            _ => floats(x),
        };
        let kinds: [(&str, &dyn Fn(u64) -> Value); 5] = [
            ("floats", &floats),
            ("ints", &ints),
            ("timestamps", &stamps),
            ("texts", &texts),
            ("mixed", &mixed),
        ];
        for (name, value) in kinds {
            let mut model: BTreeMap<OrdValue, u32> = BTreeMap::new();
            let mut counts = Counts::default();
            let mut rand = below(0x0dd_ba11_u64);
            let (mut was_large, mut were_words, mut were_general) = (false, false, false);
            let mut last_form = None;
            let (mut prev_large, mut went_back) = (false, false);
            for step in 0..20_000 {
                // Grow for a while, then shrink, so every conversion happens.
                let growing = (step / 5_000) % 2 == 0;
                let v = value(rand(200));
                let present = model.contains_key(&OrdValue(v.clone()));
                if growing {
                    counts.add(&v, 1);
                    *model.entry(OrdValue(v)).or_insert(0) += 1;
                } else {
                    // A copy of the value picked if it is there, and one of the smallest:
                    // the multiset empties before the phase ends, back through the
                    // vector forms, whose last copies of values leave one by one.
                    let remove = |k: OrdValue, counts: &mut Counts, model: &mut BTreeMap<_, _>| {
                        counts.decrement(&k.0);
                        *model.get_mut(&k).unwrap() -= 1;
                        if model[&k] == 0 {
                            model.remove(&k);
                        }
                    };
                    if present {
                        remove(OrdValue(v), &mut counts, &mut model);
                    }
                    match model.keys().next().cloned() {
                        Some(first) => remove(first, &mut counts, &mut model),
                        None if !present => continue,
                        None => {}
                    }
                }
                let large = matches!(counts, Counts::Large(_));
                went_back |=
                    std::mem::replace(&mut prev_large, large) && !large && !counts.is_empty();
                was_large |= large;
                were_words |= matches!(counts, Counts::Words(..));
                were_general |= matches!(&counts, Counts::Small(v) if !v.is_empty());
                assert_eq!(counts.len(), model.len());
                assert_eq!(counts.first(), model.keys().next().map(|k| k.0.clone()));
                assert_eq!(counts.last(), model.keys().next_back().map(|k| k.0.clone()));
                // Every value, at every step near the vector forms' sizes (and at each
                // change of form); a large tree every 16th step, as its checks cost O(n).
                let form = std::mem::discriminant(&counts);
                let changed = last_form.replace(form) != Some(form);
                if !changed && counts.total() > 2 * COUNTS_SMALL_MAX as u64 && step % 16 != 0 {
                    continue;
                }
                let expected: Vec<(Value, u32)> =
                    model.iter().map(|(k, c)| (k.0.clone(), *c)).collect();
                assert_eq!(
                    counts.iter().collect::<Vec<_>>(),
                    expected,
                    "{name} step {step}"
                );
                let general = Counts::Small(counts.entries());
                let tree = Counts::Large(Box::new(counts.entries().into_iter().collect()));
                assert_eq!(counts, general);
                assert_eq!(counts, tree);
                let flat: Vec<&Value> = model
                    .iter()
                    .flat_map(|(k, c)| std::iter::repeat_n(&k.0, *c as usize))
                    .collect();
                assert_eq!(counts.total(), flat.len() as u64);
                for k in [
                    0,
                    flat.len() / 3,
                    flat.len() / 2,
                    flat.len().saturating_sub(1),
                ] {
                    assert_eq!(
                        counts.nth(k as u64).as_ref(),
                        flat.get(k).copied(),
                        "{name} step {step}, nth {k}"
                    );
                }
            }
            assert!(was_large, "{name}: the multiset never left its vector");
            assert!(
                went_back,
                "{name}: the multiset never went back to a vector"
            );
            let (words, general) = match name {
                "texts" => (false, true),
                "mixed" => (true, true),
                _ => (true, false),
            };
            assert_eq!(
                (were_words, were_general),
                (words, general),
                "{name}: the forms"
            );
            assert!(
                !matches!(counts, Counts::Large(_))
                    || counts.total() >= COUNTS_SMALL_MAX as u64 / 2
            );
        }
    }

    /// Words order as `cmp_values` does, and give back the value they were made from
    /// (its canonical form for -0 and NaNs).
    #[test]
    fn words_keep_the_order_of_values() {
        let floats = [
            f64::NEG_INFINITY,
            -1e300,
            -1.5,
            -f64::MIN_POSITIVE,
            -0.0,
            0.0,
            5e-324,
            1.0,
            f64::MAX,
            f64::INFINITY,
            f64::NAN,
        ];
        let values: Vec<Vec<Value>> = vec![
            floats.iter().map(|x| Value::Float(*x)).collect(),
            [i64::MIN, -1, 0, 1, i64::MAX].map(Value::Int).to_vec(),
            [i64::MIN, -1, 0, 1, i64::MAX]
                .map(Value::Timestamp)
                .to_vec(),
        ];
        for vs in values {
            for a in &vs {
                let (ka, wa) = to_word(a).unwrap();
                assert_eq!(OrdValue(from_word(ka, wa)), OrdValue(a.clone()));
                for b in &vs {
                    let (_, wb) = to_word(b).unwrap();
                    assert_eq!(wa.cmp(&wb), cmp_values(a, b), "{a:?} vs {b:?}");
                }
            }
        }
    }

    /// Every state, encoded and decoded at random points of a random insert/remove
    /// history, answers exactly as the original from then on.
    #[test]
    fn states_survive_encoding() {
        let funcs = [
            AggFunc::CountStar,
            AggFunc::Count,
            AggFunc::Sum,
            AggFunc::Avg,
            AggFunc::Min,
            AggFunc::Max,
            AggFunc::StddevSamp,
            AggFunc::VarPop,
            AggFunc::CountDistinct,
            AggFunc::LastValue,
        ];
        let mut rand = below(0x5eed_1234_u64);
        for ty in [ColumnType::Int64, ColumnType::Float64, ColumnType::Text] {
            for func in funcs {
                let numeric_only = !matches!(
                    func,
                    AggFunc::CountStar
                        | AggFunc::Count
                        | AggFunc::Min
                        | AggFunc::Max
                        | AggFunc::CountDistinct
                        | AggFunc::LastValue
                );
                if ty == ColumnType::Text && numeric_only {
                    continue;
                }
                let value = |x: u64| match ty {
                    ColumnType::Int64 => Value::Int(x as i64 - 50),
                    ColumnType::Float64 => Value::Float((x as f64 - 50.0) * 1e7 + 0.125),
                    _ => Value::Text(format!("v{x}").into()),
                };
                let mut state = func.new_state(Some(ty));
                let mut live: Vec<Value> = Vec::new();
                for step in 0..400u64 {
                    if live.is_empty() || rand(3) != 0 {
                        let v = if rand(10) == 0 {
                            Value::Null
                        } else {
                            value(rand(100))
                        };
                        state.insert(func, &v, step as i64, step);
                        live.push(v);
                    } else if func != AggFunc::LastValue {
                        let v = live.remove(0);
                        state.remove(func, &v);
                    }
                    if rand(7) == 0 {
                        let mut bytes = Vec::new();
                        state.encode(&mut bytes);
                        let back = AggState::decode(&bytes)
                            .unwrap_or_else(|| panic!("{func:?} {ty:?}: undecodable"));
                        assert_eq!(back.result(func), state.result(func), "{func:?} {ty:?}");
                        assert!(AggState::decode(&bytes[..bytes.len() - 1]).is_none());
                        state = back;
                    }
                }
            }
        }
    }

    #[test]
    fn exact_sum_survives_cancellation() {
        let mut s = ExactSum::default();
        s.add(1e100);
        s.add(1.0);
        s.add(-1e100);
        assert_eq!(s.value(), 1.0);
        for i in 0..1000 {
            s.add(0.1 * i as f64);
        }
        for i in 0..1000 {
            s.sub(0.1 * i as f64);
        }
        assert_eq!(s.value(), 1.0);
    }

    #[test]
    fn variance_is_exact_with_large_mean() {
        let mut st = AggFunc::VarSamp.new_state(Some(ColumnType::Float64));
        for (i, x) in [1e9 + 4.0, 1e9 + 7.0, 1e9 + 13.0, 1e9 + 16.0]
            .iter()
            .enumerate()
        {
            st.insert(AggFunc::VarSamp, &Value::Float(*x), 0, i as u64);
        }
        assert_eq!(st.result(AggFunc::VarSamp), Value::Float(30.0));
        st.remove(AggFunc::VarSamp, &Value::Float(1e9 + 4.0));
        st.remove(AggFunc::VarSamp, &Value::Float(1e9 + 7.0));
        st.remove(AggFunc::VarSamp, &Value::Float(1e9 + 13.0));
        assert_eq!(st.result(AggFunc::VarSamp), Value::Null);
        assert_eq!(st.result(AggFunc::VarPop), Value::Float(0.0));
    }

    #[test]
    fn integer_variance_is_exact_beyond_double_precision() {
        let mut st = AggFunc::VarSamp.new_state(Some(ColumnType::Int64));
        for (i, x) in [
            100_000_000_000_000_001i64,
            100_000_000_000_000_002,
            100_000_000_000_000_003,
        ]
        .iter()
        .enumerate()
        {
            st.insert(AggFunc::VarSamp, &Value::Int(*x), 0, i as u64);
        }
        assert_eq!(st.result(AggFunc::VarSamp), Value::Float(1.0));
        st.remove(AggFunc::VarSamp, &Value::Int(100_000_000_000_000_001));
        assert_eq!(st.result(AggFunc::VarPop), Value::Float(0.25));
    }

    #[test]
    fn min_max_follow_removals() {
        let mut st = AggFunc::Max.new_state(Some(ColumnType::Int64));
        for (i, x) in [3, 9, 9, 1].iter().enumerate() {
            st.insert(AggFunc::Max, &Value::Int(*x), 0, i as u64);
        }
        st.remove(AggFunc::Max, &Value::Int(9));
        assert_eq!(st.result(AggFunc::Max), Value::Int(9));
        st.remove(AggFunc::Max, &Value::Int(9));
        assert_eq!(st.result(AggFunc::Max), Value::Int(3));
        assert_eq!(st.result(AggFunc::Min), Value::Int(1));
    }

    #[test]
    fn integer_sums_are_numeric_and_exact() {
        let mut st = AggFunc::Sum.new_state(Some(ColumnType::Int64));
        st.insert(AggFunc::Sum, &Value::Int(i64::MAX), 0, 0);
        st.insert(AggFunc::Sum, &Value::Int(i64::MAX), 0, 1);
        assert_eq!(
            st.result(AggFunc::Sum),
            Value::Numeric((2 * i64::MAX as i128).into())
        );
        st.insert(AggFunc::Sum, &Value::Null, 0, 2);
        st.remove(AggFunc::Sum, &Value::Int(i64::MAX));
        st.remove(AggFunc::Sum, &Value::Int(i64::MAX));
        assert_eq!(st.result(AggFunc::Sum), Value::Null);
    }

    #[test]
    fn last_value_keeps_the_newest_event() {
        let mut st = AggFunc::LastValue.new_state(Some(ColumnType::Text));
        st.insert(AggFunc::LastValue, &Value::Text("b".into()), 10, 0);
        st.insert(AggFunc::LastValue, &Value::Text("a".into()), 5, 1);
        assert_eq!(st.result(AggFunc::LastValue), Value::Text("b".into()));
        st.insert(AggFunc::LastValue, &Value::Null, 10, 2);
        assert_eq!(st.result(AggFunc::LastValue), Value::Null);
    }
}
