//! A seeded differential oracle for the task executor (`eddy_cluster::exec::task::Task`).
//!
//! A generator drives one task (a stream without partitioners, so the task sees every
//! event) with a long stream of events: out-of-order events, late events beyond the 2 s
//! lateness, duplicate ids carrying other values, NULLs, amounts of very different
//! magnitudes, ties in event time, and events exactly on window and lateness edges, fed in
//! random batch sizes. The metrics cover every window kind (sliding, sliding with delay,
//! tumbling, infinite), every aggregate (the percentiles too), WHERE filters, and GROUP BY of one, two and no
//! columns. Three batches in ten ask for no values, so the task stores them whole and moves
//! its windows once (`Task::catch_up`); the next batch with values checks where they ended.
//!
//! An independent brute-force model, written from docs/sql.md ("Windows", "Semantics that
//! the tests hold the engine to") and sharing no window or aggregate code with the engine,
//! decides each event's outcome (accepted, late, duplicate) and the values of every metric
//! for the event's group right after it. It recomputes each bounded window from the
//! accepted events at the current stream time, and computes sums and variances in exact
//! integer arithmetic (every generated amount is a multiple of 2^-70).
//!
//! `oracle_matches_engine` checks every outcome and every value (float sums and averages
//! within 1e-12 × Σ|x|, variances and standard deviations within 1e-9 relative, everything
//! else exactly), the stream time, the task's counters and the non-empty groups of every
//! metric. `metrics_added_and_dropped_midway` creates metrics on a running stream (their
//! first answers must already count the stored events) and drops others (the remaining
//! metrics' values must not change).
//!
//! `changes_match_the_model` watches every metric as a continuous query would: after each
//! event, every group whose modelled values changed (an event entered, one expired, a
//! tumbling window moved on) must be among the rows handed to the watchers, and every
//! handed row must equal the model's values at that moment.
//!
//! The seeds are fixed; `EDDY_ORACLE_SEED` (decimal or 0x-hex) replaces the first one.
//! Every failure message names the seed and the event.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::{self, Write as _};
use std::sync::Arc;

use std::sync::Mutex;

use eddy_cluster::exec::groups::CacheConfig;
use eddy_cluster::exec::passes::Predicates;
use eddy_cluster::exec::watch::{Change, WatchTarget, Watcher};
use eddy_cluster::{NodeStorage, StorageConfig, TaskId};
use eddy_cluster::{Outcome, Row, Task};
use eddy_planner::catalog::Catalog;
use eddy_planner::ddl;
use eddy_planner::filter::{rows_to_batch, stream_schema, stream_types};
use eddy_planner::sql::parse_statement;
use eddy_planner::types::Value;
use eddy_planner::window::WindowSpec;
use eddy_storage::ReservoirConfig;

const MS: i64 = 1_000;
const SEC: i64 = 1_000_000;
const LATENESS: i64 = 2 * SEC;
/// 2026-01-01 00:00:00 UTC in microseconds.
const JAN_2026: i64 = 1_767_225_600 * SEC;
/// Every generated amount is an integer multiple of 2^-SCALE_BITS.
const SCALE_BITS: i32 = 70;

/// Group keys: lowercase letters only, so that every collation orders them alike.
const KEYS: [&str; 20] = [
    "kiwi", "apple", "fig", "banana", "cherry", "date", "grape", "lemon", "mango", "nut", "olive",
    "pear", "quince", "rasp", "sloe", "tomato", "ugli", "vanilla", "walnut", "yam",
];
const TAGS: [&str; 4] = ["x", "ab", "zz", "y"];

const STREAM_SQL: &str = "CREATE STREAM s (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, \
     k TEXT NOT NULL, amount DOUBLE PRECISION, qty BIGINT, tag TEXT) \
     WITH (event_time = 'ts', event_id = 'id', lateness = '2 seconds')";

// ---------------------------------------------------------------------------------------
// Seeds and the pseudo-random generator.

fn seeds() -> Vec<u64> {
    let mut seeds = vec![0x5EED_0001, 0xC0FF_EE02, 0x0BAD_5EED, 0xD1CE_0004];
    let text = std::env::var("EDDY_ORACLE_SEED").unwrap_or_default();
    let text = text.trim();
    if !text.is_empty() {
        let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
            Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
            None => text.replace('_', "").parse(),
        };
        seeds[0] = parsed.unwrap_or_else(|e| panic!("EDDY_ORACLE_SEED={text:?}: {e}"));
    }
    seeds
}

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

// ---------------------------------------------------------------------------------------
// Events.

#[derive(Clone, Debug)]
struct Ev {
    id: i64,
    ts: i64,
    k: u8,
    tag: Option<u8>,
    amount: Option<f64>,
    qty: Option<i64>,
}

fn text(s: &str) -> Value {
    Value::Text(s.into())
}

/// The event as the stream's row: id, ts, k, amount, qty, tag.
fn row(e: &Ev) -> Row {
    Row::from(vec![
        Value::Int(e.id),
        Value::Timestamp(e.ts),
        text(KEYS[e.k as usize]),
        e.amount.map_or(Value::Null, Value::Float),
        e.qty.map_or(Value::Null, Value::Int),
        e.tag.map_or(Value::Null, |t| text(TAGS[t as usize])),
    ])
}

/// A row that only names a group (for `Task::values_for`).
fn probe_row(k: u8, tag: Option<u8>) -> Row {
    row(&Ev {
        id: 0,
        ts: 0,
        k,
        tag,
        amount: None,
        qty: None,
    })
}

// ---------------------------------------------------------------------------------------
// The model's description of metrics, from which the SQL is generated.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Win {
    Sliding {
        size: i64,
        delay: i64,
    },
    Tumbling {
        size: i64,
    },
    Hopping {
        size: i64,
        hop: i64,
    },
    Infinite,
    /// SLIDING (SIZE n EVENTS).
    Count {
        events: usize,
    },
}

fn duration_sql(us: i64) -> String {
    if us % SEC == 0 {
        format!("{} SECONDS", us / SEC)
    } else {
        format!("{} MILLISECONDS", us / MS)
    }
}

impl Win {
    fn sql(self) -> String {
        match self {
            Win::Sliding { size, delay: 0 } => format!("SLIDING (SIZE {})", duration_sql(size)),
            Win::Sliding { size, delay } => format!(
                "SLIDING (SIZE {}, DELAY {})",
                duration_sql(size),
                duration_sql(delay)
            ),
            Win::Tumbling { size } => format!("TUMBLING (SIZE {})", duration_sql(size)),
            Win::Hopping { size, hop } => format!(
                "HOPPING (SIZE {}, HOP {})",
                duration_sql(size),
                duration_sql(hop)
            ),
            Win::Infinite => "INFINITE".to_string(),
            Win::Count { events } => format!("SLIDING (SIZE {events} EVENTS)"),
        }
    }

    /// The event times the window holds at stream time `t`, as `after < ts <= upto`,
    /// straight from sql.md's table.
    fn range(self, t: i64) -> (i64, i64) {
        match self {
            // T − d − w < ts ≤ T − d
            Win::Sliding { size, delay } => (t - delay - size, t - delay),
            // ⌊T / w⌋·w ≤ ts ≤ T, with floor division (aligned to the Unix epoch)
            Win::Tumbling { size } => (t.div_euclid(size) * size - 1, t),
            // The last completed window [E − w, E), E = ⌊T / h⌋·h
            Win::Hopping { size, hop } => {
                let end = t.div_euclid(hop) * hop;
                (end - size - 1, end - 1)
            }
            // ts ≤ T (a count window also keeps only its group's n newest: see `acc`)
            Win::Infinite | Win::Count { .. } => (i64::MIN, t),
        }
    }

    fn spec(self) -> WindowSpec {
        match self {
            Win::Sliding { size, delay } => WindowSpec::Sliding {
                size_us: size,
                delay_us: delay,
            },
            Win::Tumbling { size } => WindowSpec::Tumbling { size_us: size },
            Win::Hopping { size, hop } => WindowSpec::Hopping {
                size_us: size,
                hop_us: hop,
            },
            Win::Infinite => WindowSpec::Infinite,
            Win::Count { events } => WindowSpec::Count {
                events: events as i64,
            },
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Filt {
    All,
    AmountOver50,
    TagXOrQtyUnder3,
    NegativeAmountWithQty,
}

const FILTS: [Filt; 4] = [
    Filt::All,
    Filt::AmountOver50,
    Filt::TagXOrQtyUnder3,
    Filt::NegativeAmountWithQty,
];

impl Filt {
    fn sql(self) -> Option<&'static str> {
        match self {
            Filt::All => None,
            Filt::AmountOver50 => Some("amount > 50"),
            Filt::TagXOrQtyUnder3 => Some("tag = 'x' OR qty < 3"),
            Filt::NegativeAmountWithQty => Some("amount < 0 AND qty IS NOT NULL"),
        }
    }

    /// SQL's WHERE: the event counts only when the predicate is TRUE (not NULL).
    fn passes(self, e: &Ev) -> bool {
        match self {
            Filt::All => true,
            Filt::AmountOver50 => e.amount.is_some_and(|a| a > 50.0),
            Filt::TagXOrQtyUnder3 => {
                // Three-valued OR: TRUE when either side is TRUE, whatever the other is.
                let tag_is_x = e.tag.map(|t| TAGS[t as usize] == "x");
                let qty_under_3 = e.qty.map(|q| q < 3);
                tag_is_x == Some(true) || qty_under_3 == Some(true)
            }
            Filt::NegativeAmountWithQty => e.amount.is_some_and(|a| a < 0.0) && e.qty.is_some(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Grp {
    Global,
    K,
    KTag,
}

const GRPS: [Grp; 3] = [Grp::Global, Grp::K, Grp::KTag];

impl Grp {
    fn idx(self) -> usize {
        self as usize
    }

    fn columns(self) -> &'static [&'static str] {
        match self {
            Grp::Global => &[],
            Grp::K => &["k"],
            Grp::KTag => &["k", "tag"],
        }
    }

    /// A number naming the group of an event with key `k` and tag `tag`.
    fn code(self, k: u8, tag: Option<u8>) -> u32 {
        match self {
            Grp::Global => 0,
            Grp::K => u32::from(k),
            Grp::KTag => u32::from(k) * 8 + tag.map_or(0, |t| u32::from(t) + 1),
        }
    }

    /// The group-by values of group `code`, as `metric_rows` lists them.
    fn values(self, code: u32) -> Vec<Value> {
        match self {
            Grp::Global => Vec::new(),
            Grp::K => vec![text(KEYS[code as usize])],
            Grp::KTag => {
                let tag = match code % 8 {
                    0 => Value::Null,
                    t => text(TAGS[t as usize - 1]),
                };
                vec![text(KEYS[(code / 8) as usize]), tag]
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Col {
    Amount,
    Qty,
    Tag,
    K,
}

impl Col {
    fn parse(name: &str) -> Col {
        match name {
            "amount" => Col::Amount,
            "qty" => Col::Qty,
            "tag" => Col::Tag,
            "k" => Col::K,
            other => panic!("the model knows no column {other}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum F {
    CountStar,
    Count,
    CountDistinct,
    Sum,
    Avg,
    Min,
    Max,
    VarSamp,
    VarPop,
    StddevSamp,
    StddevPop,
    Last,
    /// PERCENTILE_CONT with the fraction in thousandths (MEDIAN is 500), and whether
    /// it orders by the column DESC.
    PctCont(u32, bool),
    /// PERCENTILE_DISC with the fraction in thousandths, and DESC.
    PctDisc(u32, bool),
}

#[derive(Clone, Debug)]
struct Agg {
    sql: &'static str,
    f: F,
    col: Option<Col>,
}

impl Agg {
    fn needs_squares(&self) -> bool {
        matches!(
            self.f,
            F::VarSamp | F::VarPop | F::StddevSamp | F::StddevPop
        )
    }
}

/// An aggregate written as in SQL, e.g. `COUNT(DISTINCT tag)` or
/// `PERCENTILE_DISC(0.25) WITHIN GROUP (ORDER BY qty)`; the model's own reading.
fn agg(sql: &'static str) -> Agg {
    if let Some((head, order)) = sql.split_once(" WITHIN GROUP (ORDER BY ") {
        let (name, fraction) = head.split_once('(').expect("an aggregate call");
        let fraction: f64 = fraction.trim_end_matches(')').parse().expect("a fraction");
        let thousandths = (fraction * 1000.0).round() as u32;
        let order = order.trim_end_matches(')');
        let (order, desc) = match order.strip_suffix(" DESC") {
            Some(column) => (column, true),
            None => (order, false),
        };
        let f = match name {
            "PERCENTILE_CONT" => F::PctCont(thousandths, desc),
            "PERCENTILE_DISC" => F::PctDisc(thousandths, desc),
            _ => panic!("the model knows no ordered-set aggregate {sql}"),
        };
        let col = Col::parse(order);
        assert!(
            matches!(f, F::PctDisc(..)) || col == Col::Amount,
            "the model does not compute {sql}"
        );
        return Agg {
            sql,
            f,
            col: Some(col),
        };
    }
    let (name, rest) = sql.split_once('(').expect("an aggregate call");
    let inner = rest.strip_suffix(')').expect("a closing parenthesis");
    if inner == "*" {
        assert_eq!(name, "COUNT");
        return Agg {
            sql,
            f: F::CountStar,
            col: None,
        };
    }
    let (f, arg) = match (name, inner.strip_prefix("DISTINCT ")) {
        ("COUNT", Some(arg)) => (F::CountDistinct, arg),
        ("COUNT", None) => (F::Count, inner),
        ("SUM", None) => (F::Sum, inner),
        ("AVG", None) => (F::Avg, inner),
        ("MIN", None) => (F::Min, inner),
        ("MAX", None) => (F::Max, inner),
        ("VARIANCE" | "VAR_SAMP", None) => (F::VarSamp, inner),
        ("VAR_POP", None) => (F::VarPop, inner),
        ("STDDEV" | "STDDEV_SAMP", None) => (F::StddevSamp, inner),
        ("STDDEV_POP", None) => (F::StddevPop, inner),
        ("LAST_VALUE", None) => (F::Last, inner),
        ("MEDIAN", None) => (F::PctCont(500, false), inner),
        _ => panic!("the model knows no aggregate {sql}"),
    };
    let col = Col::parse(arg);
    let numeric_only = matches!(
        f,
        F::Sum | F::Avg | F::VarSamp | F::VarPop | F::StddevSamp | F::StddevPop
    );
    assert!(
        !numeric_only || col == Col::Amount || (col == Col::Qty && matches!(f, F::Sum | F::Avg)),
        "the model does not compute {sql}"
    );
    assert!(
        f != F::CountDistinct || matches!(col, Col::Tag | Col::K),
        "the model does not compute {sql}"
    );
    Agg {
        sql,
        f,
        col: Some(col),
    }
}

#[derive(Clone, Debug)]
struct MSpec {
    name: &'static str,
    win: Win,
    filt: Filt,
    grp: Grp,
    aggs: Vec<Agg>,
}

fn metric(name: &'static str, win: Win, filt: Filt, grp: Grp, aggs: &[&'static str]) -> MSpec {
    MSpec {
        name,
        win,
        filt,
        grp,
        aggs: aggs.iter().map(|a| agg(a)).collect(),
    }
}

impl MSpec {
    fn sql(&self) -> String {
        let mut select: Vec<String> = self.grp.columns().iter().map(|c| c.to_string()).collect();
        for (i, a) in self.aggs.iter().enumerate() {
            select.push(format!("{} AS a{i}", a.sql));
        }
        let mut sql = format!(
            "CREATE METRIC {} AS SELECT {} FROM s WINDOW {}",
            self.name,
            select.join(", "),
            self.win.sql()
        );
        if let Some(w) = self.filt.sql() {
            write!(sql, " WHERE {w}").expect("write to a String");
        }
        if !self.grp.columns().is_empty() {
            write!(sql, " GROUP BY {}", self.grp.columns().join(", ")).expect("write to a String");
        }
        sql
    }
}

const SLIDE_10: Win = Win::Sliding {
    size: 10 * SEC,
    delay: 0,
};
const DELAYED_10_3: Win = Win::Sliding {
    size: 10 * SEC,
    delay: 3 * SEC,
};
const SHORT_DELAYED: Win = Win::Sliding {
    size: 2_500 * MS,
    delay: 500 * MS,
};
const TUMBLE_7: Win = Win::Tumbling { size: 7 * SEC };
const HOP_9_2: Win = Win::Hopping {
    size: 9 * SEC,
    hop: 2_500 * MS,
};

/// Thirteen metrics over eight windows, with shared prefixes (metrics 1, 2, 3 and 13
/// share a window; 1 and 13 share their group and some aggregates).
fn main_metrics() -> Vec<MSpec> {
    vec![
        metric(
            "slide",
            SLIDE_10,
            Filt::All,
            Grp::K,
            &[
                "COUNT(*)",
                "COUNT(amount)",
                "SUM(amount)",
                "SUM(qty)",
                "AVG(amount)",
                "MIN(amount)",
                "MAX(amount)",
                "STDDEV(amount)",
                "VAR_POP(amount)",
                "LAST_VALUE(amount)",
                "MEDIAN(amount)",
                "PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY amount)",
                "PERCENTILE_DISC(0.25) WITHIN GROUP (ORDER BY qty)",
            ],
        ),
        metric(
            "slide_big",
            SLIDE_10,
            Filt::AmountOver50,
            Grp::K,
            &[
                "COUNT(*)",
                "SUM(amount)",
                "AVG(amount)",
                "MIN(amount)",
                "STDDEV_POP(amount)",
                "VARIANCE(amount)",
                "LAST_VALUE(amount)",
            ],
        ),
        metric(
            "slide_kt",
            SLIDE_10,
            Filt::TagXOrQtyUnder3,
            Grp::KTag,
            &[
                "COUNT(*)",
                "SUM(qty)",
                "AVG(qty)",
                "MIN(qty)",
                "MAX(amount)",
                "LAST_VALUE(qty)",
                "COUNT(amount)",
            ],
        ),
        metric(
            "delayed",
            DELAYED_10_3,
            Filt::All,
            Grp::K,
            &[
                "COUNT(*)",
                "SUM(amount)",
                "VAR_SAMP(amount)",
                "STDDEV_SAMP(amount)",
                "MIN(tag)",
                "MAX(tag)",
                "COUNT(DISTINCT tag)",
                "LAST_VALUE(tag)",
                "AVG(amount)",
                "PERCENTILE_DISC(0.5) WITHIN GROUP (ORDER BY tag)",
            ],
        ),
        metric(
            "tumble",
            TUMBLE_7,
            Filt::All,
            Grp::K,
            &[
                "COUNT(*)",
                "SUM(amount)",
                "SUM(qty)",
                "AVG(amount)",
                "MIN(amount)",
                "MAX(amount)",
                "VARIANCE(amount)",
                "STDDEV(amount)",
                "VAR_POP(amount)",
                "COUNT(DISTINCT tag)",
                "LAST_VALUE(amount)",
                "COUNT(tag)",
            ],
        ),
        metric(
            "tumble_f",
            TUMBLE_7,
            Filt::TagXOrQtyUnder3,
            Grp::K,
            &[
                "COUNT(*)",
                "SUM(amount)",
                "STDDEV_POP(amount)",
                "MIN(tag)",
                "LAST_VALUE(qty)",
            ],
        ),
        metric(
            "forever",
            Win::Infinite,
            Filt::All,
            Grp::K,
            &[
                "COUNT(*)",
                "COUNT(amount)",
                "SUM(amount)",
                "SUM(qty)",
                "AVG(amount)",
                "MIN(amount)",
                "MAX(amount)",
                "STDDEV(amount)",
                "STDDEV_POP(amount)",
                "VARIANCE(amount)",
                "VAR_POP(amount)",
                "COUNT(DISTINCT tag)",
                "LAST_VALUE(amount)",
                "MIN(tag)",
                "PERCENTILE_CONT(0.1) WITHIN GROUP (ORDER BY amount)",
                "PERCENTILE_DISC(1) WITHIN GROUP (ORDER BY amount)",
                "PERCENTILE_CONT(0.3) WITHIN GROUP (ORDER BY amount DESC)",
                "PERCENTILE_DISC(0.4) WITHIN GROUP (ORDER BY qty DESC)",
            ],
        ),
        metric(
            "forever_kt",
            Win::Infinite,
            Filt::AmountOver50,
            Grp::KTag,
            &[
                "COUNT(*)",
                "SUM(amount)",
                "AVG(amount)",
                "MAX(tag)",
                "LAST_VALUE(amount)",
                "VAR_POP(amount)",
            ],
        ),
        metric(
            "global",
            SHORT_DELAYED,
            Filt::All,
            Grp::Global,
            &[
                "COUNT(*)",
                "SUM(amount)",
                "VAR_POP(amount)",
                "COUNT(DISTINCT k)",
                "MIN(k)",
                "MAX(k)",
                "LAST_VALUE(k)",
                "AVG(qty)",
                "PERCENTILE_DISC(0.75) WITHIN GROUP (ORDER BY k)",
            ],
        ),
        metric(
            "hop",
            HOP_9_2,
            Filt::All,
            Grp::K,
            &[
                "COUNT(*)",
                "SUM(amount)",
                "MIN(tag)",
                "MEDIAN(amount)",
                "LAST_VALUE(qty)",
            ],
        ),
        metric(
            "last5",
            Win::Count { events: 5 },
            Filt::All,
            Grp::K,
            &[
                "COUNT(*)",
                "SUM(amount)",
                "MIN(amount)",
                "MEDIAN(amount)",
                "COUNT(DISTINCT tag)",
                "LAST_VALUE(qty)",
            ],
        ),
        metric(
            "last3_kt",
            Win::Count { events: 3 },
            Filt::AmountOver50,
            Grp::KTag,
            &["COUNT(*)", "AVG(amount)", "MAX(tag)", "VAR_POP(amount)"],
        ),
        metric(
            "slide_dup",
            SLIDE_10,
            Filt::All,
            Grp::K,
            &["SUM(amount)", "MAX(tag)", "COUNT(*)"],
        ),
    ]
}

// ---------------------------------------------------------------------------------------
// Exact arithmetic.

/// The amount as an exact integer count of 2^-70.
fn fixed(x: f64) -> i128 {
    let scaled = x * 2f64.powi(SCALE_BITS);
    assert!(
        scaled.fract() == 0.0 && scaled.abs() < 2f64.powi(110),
        "generated amount {x:e} is not a multiple of 2^-70 below 2^40"
    );
    scaled as i128
}

/// An unsigned 256-bit integer, little-endian limbs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct U256([u64; 4]);

impl U256 {
    fn square(v: u128) -> U256 {
        let (lo, hi) = (u128::from(v as u64), v >> 64);
        let (ll, lh, hh) = (lo * lo, lo * hi, hi * hi);
        // v² = ll + 2·lh·2^64 + hh·2^128, limb by limb with carries.
        let t1 = (ll >> 64) + 2 * u128::from(lh as u64);
        let t2 = (t1 >> 64) + u128::from(hh as u64) + 2 * (lh >> 64);
        let t3 = (t2 >> 64) + (hh >> 64);
        assert_eq!(t3 >> 64, 0, "256-bit overflow in the model");
        U256([ll as u64, t1 as u64, t2 as u64, t3 as u64])
    }

    fn accumulate(&mut self, other: &U256) {
        let mut carry = false;
        for (a, &b) in self.0.iter_mut().zip(other.0.iter()) {
            let (s1, c1) = a.overflowing_add(b);
            let (s2, c2) = s1.overflowing_add(u64::from(carry));
            *a = s2;
            carry = c1 || c2;
        }
        assert!(!carry, "256-bit overflow in the model");
    }

    fn minus(self, other: &U256) -> U256 {
        let mut out = self;
        let mut borrow = false;
        for (a, &b) in out.0.iter_mut().zip(other.0.iter()) {
            let (d1, b1) = a.overflowing_sub(b);
            let (d2, b2) = d1.overflowing_sub(u64::from(borrow));
            *a = d2;
            borrow = b1 || b2;
        }
        assert!(!borrow, "negative 256-bit difference in the model");
        out
    }

    fn times(self, m: u64) -> U256 {
        let mut out = [0u64; 4];
        let mut carry = 0u128;
        for (o, &a) in out.iter_mut().zip(&self.0) {
            let p = u128::from(a) * u128::from(m) + carry;
            *o = p as u64;
            carry = p >> 64;
        }
        assert_eq!(carry, 0, "256-bit overflow in the model");
        U256(out)
    }

    /// Within a few ulps.
    fn to_f64(self) -> f64 {
        self.0
            .iter()
            .rev()
            .fold(0.0, |acc, &limb| acc * 2f64.powi(64) + limb as f64)
    }
}

/// Everything the model needs to answer any aggregate over a set of events.
#[derive(Clone, Debug, Default)]
struct Acc {
    /// The values of each column, for the percentiles (unsorted).
    amounts: Vec<f64>,
    qtys: Vec<i64>,
    tag_values: Vec<u8>,
    key_values: Vec<u8>,
    n: i64,
    amount_n: i64,
    /// Σ amount, in units of 2^-70.
    amount_sum: i128,
    /// Σ |amount| (for the tolerance only).
    amount_abs: f64,
    /// Whether `amount_sq` is kept (only variances need it).
    squares: bool,
    /// Σ amount², in units of 2^-140.
    amount_sq: U256,
    amount_min: Option<f64>,
    amount_max: Option<f64>,
    qty_n: i64,
    qty_sum: i128,
    qty_min: Option<i64>,
    qty_max: Option<i64>,
    tag_n: i64,
    tag_min: Option<u8>,
    tag_max: Option<u8>,
    tags: u32,
    keys: u32,
    key_min: Option<u8>,
    key_max: Option<u8>,
    /// (event time, arrival number) of the newest event.
    last: Option<(i64, usize)>,
}

impl Acc {
    fn new(squares: bool) -> Acc {
        Acc {
            squares,
            ..Acc::default()
        }
    }

    fn push(&mut self, e: &Ev, seq: usize) {
        self.n += 1;
        self.amounts.extend(e.amount);
        self.qtys.extend(e.qty);
        self.tag_values.extend(e.tag);
        self.key_values.push(e.k);
        if let Some(x) = e.amount {
            let s = fixed(x);
            self.amount_n += 1;
            self.amount_sum += s;
            self.amount_abs += x.abs();
            if self.squares {
                self.amount_sq.accumulate(&U256::square(s.unsigned_abs()));
            }
            if self.amount_min.is_none_or(|m| x < m) {
                self.amount_min = Some(x);
            }
            if self.amount_max.is_none_or(|m| x > m) {
                self.amount_max = Some(x);
            }
        }
        if let Some(q) = e.qty {
            self.qty_n += 1;
            self.qty_sum += i128::from(q);
            if self.qty_min.is_none_or(|m| q < m) {
                self.qty_min = Some(q);
            }
            if self.qty_max.is_none_or(|m| q > m) {
                self.qty_max = Some(q);
            }
        }
        if let Some(t) = e.tag {
            self.tag_n += 1;
            self.tags |= 1 << t;
            let name = TAGS[t as usize];
            if self.tag_min.is_none_or(|m| name < TAGS[m as usize]) {
                self.tag_min = Some(t);
            }
            if self.tag_max.is_none_or(|m| name > TAGS[m as usize]) {
                self.tag_max = Some(t);
            }
        }
        self.keys |= 1 << e.k;
        let key = KEYS[e.k as usize];
        if self.key_min.is_none_or(|m| key < KEYS[m as usize]) {
            self.key_min = Some(e.k);
        }
        if self.key_max.is_none_or(|m| key > KEYS[m as usize]) {
            self.key_max = Some(e.k);
        }
        if self.last.is_none_or(|last| (e.ts, seq) > last) {
            self.last = Some((e.ts, seq));
        }
    }
}

/// What the model expects of one aggregate value.
#[derive(Clone, Debug)]
enum Exp {
    Exact(Value),
    Near { value: f64, tol: f64 },
}

impl Exp {
    fn matches(&self, got: &Value) -> bool {
        match self {
            Exp::Exact(v) => got == v,
            Exp::Near { value, tol } => {
                matches!(got, Value::Float(g) if g.is_finite() && (g - value).abs() <= *tol)
            }
        }
    }
}

impl fmt::Display for Exp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exp::Exact(v) => write!(f, "{v:?}"),
            Exp::Near { value, tol } => write!(f, "Float({value:?}) ± {tol:e}"),
        }
    }
}

fn column_value(e: &Ev, col: Col) -> Value {
    match col {
        Col::Amount => e.amount.map_or(Value::Null, Value::Float),
        Col::Qty => e.qty.map_or(Value::Null, Value::Int),
        Col::Tag => e.tag.map_or(Value::Null, |t| text(TAGS[t as usize])),
        Col::K => text(KEYS[e.k as usize]),
    }
}

// ---------------------------------------------------------------------------------------
// The model.

type Memo = Vec<((Win, Grp, Filt), Acc)>;

struct Model {
    /// Stream time: the largest accepted event time.
    t: Option<i64>,
    /// Ids of applied events (the test's stream is far shorter than the dedup horizon).
    seen: HashSet<i64>,
    /// Accepted events in arrival order; the index is the arrival number.
    events: Vec<Ev>,
    /// Per grouping, per group: (event time, arrival number) of its accepted events, sorted.
    by_group: [HashMap<u32, Vec<(i64, usize)>>; 3],
    /// INFINITE windows hold every accepted event, so their sets only grow.
    infinite: HashMap<(Grp, Filt, u32), Acc>,
    accepted: u64,
    late: u64,
    duplicates: u64,
    accepted_out_of_order: u64,
}

impl Model {
    fn new() -> Model {
        Model {
            t: None,
            seen: HashSet::new(),
            events: Vec::new(),
            by_group: [HashMap::new(), HashMap::new(), HashMap::new()],
            infinite: HashMap::new(),
            accepted: 0,
            late: 0,
            duplicates: 0,
            accepted_out_of_order: 0,
        }
    }

    /// sql.md: duplicates first (identity is the id alone), then lateness.
    fn offer(&mut self, e: &Ev) -> Outcome {
        if self.seen.contains(&e.id) {
            self.duplicates += 1;
            return Outcome::Duplicate;
        }
        if let Some(t) = self.t {
            if e.ts < t - LATENESS {
                self.late += 1;
                return Outcome::Late;
            }
            if e.ts < t {
                self.accepted_out_of_order += 1;
            }
        }
        self.accepted += 1;
        let seq = self.events.len();
        self.seen.insert(e.id);
        self.t = Some(self.t.map_or(e.ts, |t| t.max(e.ts)));
        for grp in GRPS {
            let code = grp.code(e.k, e.tag);
            let list = self.by_group[grp.idx()].entry(code).or_default();
            let at = list.partition_point(|&key| key < (e.ts, seq));
            list.insert(at, (e.ts, seq));
            for filt in FILTS {
                if filt.passes(e) {
                    self.infinite
                        .entry((grp, filt, code))
                        .or_insert_with(|| Acc::new(true))
                        .push(e, seq);
                }
            }
        }
        self.events.push(e.clone());
        Outcome::Accepted
    }

    /// The window's events of group `code` passing `filt`, at the current stream time;
    /// with `squares`, enough for variances.
    fn acc(&self, win: Win, grp: Grp, filt: Filt, code: u32, squares: bool) -> Acc {
        let mut acc = Acc::new(squares);
        let Some(t) = self.t else {
            return acc;
        };
        if win == Win::Infinite {
            // Every accepted event has ts ≤ T.
            return self
                .infinite
                .get(&(grp, filt, code))
                .cloned()
                .unwrap_or_else(|| Acc::new(true));
        }
        if let Win::Count { events } = win {
            // sql.md: the n newest events of the group that pass the WHERE (largest event
            // time, then arrival order), whatever order they arrived in.
            if let Some(list) = self.by_group[grp.idx()].get(&code) {
                for &(_, seq) in list
                    .iter()
                    .rev()
                    .filter(|&&(_, seq)| filt.passes(&self.events[seq]))
                    .take(events)
                {
                    acc.push(&self.events[seq], seq);
                }
            }
            return acc;
        }
        let (after, upto) = win.range(t);
        if let Some(list) = self.by_group[grp.idx()].get(&code) {
            let start = list.partition_point(|&(ts, _)| ts <= after);
            for &(ts, seq) in &list[start..] {
                if ts > upto {
                    break;
                }
                let e = &self.events[seq];
                if filt.passes(e) {
                    acc.push(e, seq);
                }
            }
        }
        acc
    }

    fn expect(&self, acc: &Acc, a: &Agg) -> Exp {
        let col = a.col;
        let exact = Exp::Exact;
        let null = Exp::Exact(Value::Null);
        let count = |n: i64| Exp::Exact(Value::Int(n));
        match (a.f, col) {
            (F::CountStar, _) => count(acc.n),
            (F::Count, Some(Col::Amount)) => count(acc.amount_n),
            (F::Count, Some(Col::Qty)) => count(acc.qty_n),
            (F::Count, Some(Col::Tag)) => count(acc.tag_n),
            (F::Count, Some(Col::K)) => count(acc.n),
            (F::CountDistinct, Some(Col::Tag)) => count(i64::from(acc.tags.count_ones())),
            (F::CountDistinct, Some(Col::K)) => count(i64::from(acc.keys.count_ones())),
            (F::Last, Some(c)) => match acc.last {
                Some((_, seq)) => exact(column_value(&self.events[seq], c)),
                None => null,
            },
            (F::Sum | F::Avg, Some(Col::Amount)) => {
                if acc.amount_n == 0 {
                    return null;
                }
                // The exact sum rounded once.
                let sum = acc.amount_sum as f64 * 2f64.powi(-SCALE_BITS);
                let tol = 1e-12 * acc.amount_abs;
                if a.f == F::Sum {
                    Exp::Near { value: sum, tol }
                } else {
                    let n = acc.amount_n as f64;
                    Exp::Near {
                        value: sum / n,
                        tol: tol / n,
                    }
                }
            }
            (F::Sum, Some(Col::Qty)) if acc.qty_n > 0 => exact(Value::Numeric(acc.qty_sum.into())),
            (F::Avg, Some(Col::Qty)) if acc.qty_n > 0 => {
                let value = acc.qty_sum as f64 / acc.qty_n as f64;
                Exp::Near {
                    value,
                    tol: 1e-12 * value.abs(),
                }
            }
            (F::Sum | F::Avg, Some(Col::Qty)) => null,
            (F::Min | F::Max, Some(c)) => {
                let min = a.f == F::Min;
                let v = match c {
                    Col::Amount => {
                        let v = if min { acc.amount_min } else { acc.amount_max };
                        v.map(Value::Float)
                    }
                    Col::Qty => {
                        let v = if min { acc.qty_min } else { acc.qty_max };
                        v.map(Value::Int)
                    }
                    Col::Tag => {
                        let v = if min { acc.tag_min } else { acc.tag_max };
                        v.map(|t| text(TAGS[t as usize]))
                    }
                    Col::K => {
                        let v = if min { acc.key_min } else { acc.key_max };
                        v.map(|k| text(KEYS[k as usize]))
                    }
                };
                exact(v.unwrap_or(Value::Null))
            }
            (F::VarSamp | F::VarPop | F::StddevSamp | F::StddevPop, Some(Col::Amount)) => {
                assert!(acc.squares, "the model skipped the squares {} needs", a.sql);
                let sample = matches!(a.f, F::VarSamp | F::StddevSamp);
                let n = acc.amount_n;
                if n == 0 || (sample && n == 1) {
                    return null;
                }
                let n = n as u64;
                // n·Σx² − (Σx)², exactly, in units of 2^-140.
                let num = acc
                    .amount_sq
                    .times(n)
                    .minus(&U256::square(acc.amount_sum.unsigned_abs()));
                let den = if sample { n * (n - 1) } else { n * n };
                let var = num.to_f64() * 2f64.powi(-2 * SCALE_BITS) / den as f64;
                let value = if matches!(a.f, F::StddevSamp | F::StddevPop) {
                    var.sqrt()
                } else {
                    var
                };
                Exp::Near {
                    value,
                    tol: 1e-9 * value,
                }
            }
            (F::PctCont(f, desc), Some(Col::Amount)) => {
                // PostgreSQL's percentile_cont: linear interpolation at f·(n − 1).
                let mut xs = acc.amounts.clone();
                if xs.is_empty() {
                    return null;
                }
                xs.sort_by(f64::total_cmp);
                if desc {
                    xs.reverse();
                }
                let pos = f as f64 / 1000.0 * (xs.len() - 1) as f64;
                let (lo, hi) = (pos.floor(), pos.ceil());
                let (a, b) = (xs[lo as usize], xs[hi as usize]);
                let value = a + (b - a) * (pos - lo);
                Exp::Near {
                    value,
                    tol: 1e-9 * value.abs(),
                }
            }
            (F::PctDisc(f, desc), Some(c)) => {
                // PostgreSQL's percentile_disc: the value at rank max(ceil(f·n), 1), in
                // the order asked (rank r of n descending is n - 1 - r ascending).
                let rank = |n: usize| {
                    let r = ((f as f64 / 1000.0 * n as f64).ceil() as usize).max(1) - 1;
                    if desc {
                        n - 1 - r
                    } else {
                        r
                    }
                };
                let v = match c {
                    Col::Amount => {
                        let mut xs = acc.amounts.clone();
                        xs.sort_by(f64::total_cmp);
                        (!xs.is_empty()).then(|| Value::Float(xs[rank(xs.len())]))
                    }
                    Col::Qty => {
                        let mut xs = acc.qtys.clone();
                        xs.sort();
                        (!xs.is_empty()).then(|| Value::Int(xs[rank(xs.len())]))
                    }
                    Col::Tag => {
                        let mut xs: Vec<&str> =
                            acc.tag_values.iter().map(|t| TAGS[*t as usize]).collect();
                        xs.sort();
                        (!xs.is_empty()).then(|| text(xs[rank(xs.len())]))
                    }
                    Col::K => {
                        let mut xs: Vec<&str> =
                            acc.key_values.iter().map(|k| KEYS[*k as usize]).collect();
                        xs.sort();
                        (!xs.is_empty()).then(|| text(xs[rank(xs.len())]))
                    }
                };
                exact(v.unwrap_or(Value::Null))
            }
            _ => panic!("the model does not compute {}", a.sql),
        }
    }

    /// Every metric's expected values for the group of an event with `k` and `tag`.
    fn expected(&self, metrics: &[MSpec], k: u8, tag: Option<u8>) -> Vec<Vec<Exp>> {
        let mut memo: Memo = Vec::new();
        metrics
            .iter()
            .map(|m| {
                let key = (m.win, m.grp, m.filt);
                let at = match memo.iter().position(|(k2, _)| *k2 == key) {
                    Some(i) => i,
                    None => {
                        let squares = metrics.iter().any(|m2| {
                            (m2.win, m2.grp, m2.filt) == key
                                && m2.aggs.iter().any(Agg::needs_squares)
                        });
                        let acc = self.acc(m.win, m.grp, m.filt, m.grp.code(k, tag), squares);
                        memo.push((key, acc));
                        memo.len() - 1
                    }
                };
                m.aggs.iter().map(|a| self.expect(&memo[at].1, a)).collect()
            })
            .collect()
    }

    /// The window of group (`k`, `tag`) of metric `m` as it was when `n_at` events had
    /// been accepted and stream time was `t`: for failure messages.
    fn describe(&self, m: &MSpec, k: u8, tag: Option<u8>, t: Option<i64>, n_at: usize) -> String {
        let Some(t) = t else {
            return "no event had been accepted".to_string();
        };
        let (after, upto) = m.win.range(t);
        let code = m.grp.code(k, tag);
        let mut out = format!(
            "window {} at T = {t}: ts in ({after}, {upto}], group {:?}, WHERE {:?}; its events:\n",
            m.win.sql(),
            m.grp.values(code),
            m.filt.sql()
        );
        let list = self.by_group[m.grp.idx()]
            .get(&code)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let inside: Vec<(i64, usize)> = list
            .iter()
            .copied()
            .filter(|&(ts, seq)| {
                seq < n_at && ts > after && ts <= upto && m.filt.passes(&self.events[seq])
            })
            .collect();
        for &(ts, seq) in inside.iter().take(60) {
            let e = &self.events[seq];
            writeln!(
                out,
                "  arrival #{seq}: id {} ts {ts} amount {:?} qty {:?} tag {:?}",
                e.id,
                e.amount,
                e.qty,
                e.tag.map(|t| TAGS[t as usize])
            )
            .expect("write to a String");
        }
        if inside.len() > 60 {
            writeln!(out, "  … and {} more", inside.len() - 60).expect("write to a String");
        }
        out
    }
}

/// The first value of `got` that the model disagrees with.
fn mismatch(m: &MSpec, got: &[Value], exp: &[Exp]) -> Option<String> {
    if got.len() != exp.len() {
        return Some(format!(
            "metric {} returned {} values, expected {}",
            m.name,
            got.len(),
            exp.len()
        ));
    }
    m.aggs
        .iter()
        .zip(got.iter().zip(exp))
        .enumerate()
        .find(|(_, (_, (g, e)))| !e.matches(g))
        .map(|(i, (a, (g, e)))| {
            format!(
                "metric {} column a{i} = {}: got {g:?}, expected {e}",
                m.name, a.sql
            )
        })
}

// ---------------------------------------------------------------------------------------
// The harness: generator, model and task in lockstep.

fn apply_sql(catalog: &Catalog, sql: &str) -> Catalog {
    let stmt = parse_statement(sql).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    ddl::apply(catalog, &stmt)
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .0
}

/// Checks that the planner read the generated SQL as the model means it.
fn check_bound(catalog: &Catalog, m: &MSpec) {
    let def = catalog.metric(m.name).expect("metric created");
    let stream = catalog.stream("s").expect("stream s");
    assert_eq!(def.window, m.win.spec(), "{}: window", m.name);
    assert_eq!(
        def.filter.is_some(),
        m.filt.sql().is_some(),
        "{}: WHERE",
        m.name
    );
    let columns: Vec<&str> = def
        .group_by
        .iter()
        .map(|&c| stream.columns[c].name.as_str())
        .collect();
    assert_eq!(columns, m.grp.columns(), "{}: GROUP BY", m.name);
    assert_eq!(def.aggregates.len(), m.aggs.len(), "{}: aggregates", m.name);
}

/// One generated event, with what the model made of it.
struct Pending {
    e: Ev,
    outcome: Outcome,
    /// Stream time and accepted events right after the event, for failure messages.
    t: Option<i64>,
    n_at: usize,
    values: Option<Vec<Vec<Exp>>>,
}

struct Harness {
    seed: u64,
    rng: Rng,
    keys: u64,
    next_id: i64,
    /// The generator's in-order clock.
    clock: i64,
    recent_ids: VecDeque<i64>,
    sent: usize,
    model: Model,
    catalog: Catalog,
    task: Task,
    metrics: Vec<MSpec>,
    /// On disk: the node storage and its directory; the task is rebooted now and then.
    disk: Option<(NodeStorage, std::path::PathBuf)>,
    reboots: usize,
    /// Chunk reads, store reads, L2 hits and store writes of tasks rebooted away.
    disk_work: [u64; 4],
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some((_, dir)) = self.disk.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn task_id() -> TaskId {
    TaskId {
        stream: "s".into(),
        partitioner: 0,
        partition: 0,
    }
}

impl Harness {
    fn new(seed: u64, start: i64, metrics: Vec<MSpec>) -> Harness {
        let mut rng = Rng(seed);
        let keys = 5 + rng.below(16);
        let mut catalog = apply_sql(&Catalog::default(), STREAM_SQL);
        for m in &metrics {
            catalog = apply_sql(&catalog, &m.sql());
            check_bound(&catalog, m);
        }
        let stream = catalog.stream("s").expect("stream s").clone();
        assert!(stream.partitioners.is_empty());
        let mut task = Task::new(stream, 0);
        task.set_metrics(&catalog.metrics_of("s"))
            .unwrap_or_else(|e| panic!("seed {seed:#x}: set_metrics: {e:?}"));
        Harness {
            seed,
            rng,
            keys,
            next_id: 1,
            clock: start,
            recent_ids: VecDeque::new(),
            sent: 0,
            model: Model::new(),
            catalog,
            task,
            metrics,
            disk: None,
            reboots: 0,
            disk_work: [0; 4],
        }
    }

    /// The same harness on the disk-backed default, with chunks of a few dozen events,
    /// a chunk cache of a few chunks and group caches of a few entries, so that sealing,
    /// chunk reads, evictions, write-through and store reads all happen all the time.
    fn on_disk(seed: u64, start: i64, metrics: Vec<MSpec>) -> Harness {
        let mut h = Harness::new(seed, start, metrics);
        let dir = std::env::temp_dir().join(format!("eddy-oracle-{}-{seed:x}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let node = NodeStorage::open(
            &dir,
            StorageConfig {
                reservoir: ReservoirConfig {
                    chunk_bytes_max: 4096,
                    segment_bytes_max: 64 << 10,
                    cache_bytes_max: 16 << 10,
                    shared_cache_bytes_max: 32 << 10,
                    ..ReservoirConfig::default()
                },
                cache: CacheConfig {
                    l1_entries: 4,
                    l2_entries: 8,
                },
                ..Default::default()
            },
        )
        .expect("node storage");
        let stream = h.catalog.stream("s").expect("stream s").clone();
        let mut task =
            Task::open(stream, 0, node.task_storage(&task_id(), 0), None).expect("task on disk");
        task.set_metrics(&h.catalog.metrics_of("s"))
            .expect("set_metrics");
        h.task = task;
        h.disk = Some((node, dir));
        h
    }

    /// Checkpoints the task, drops it, and opens it again from the checkpoint.
    fn reboot(&mut self) {
        let Some((node, _)) = &self.disk else { return };
        let seed = self.seed;
        let cp = self
            .task
            .checkpoint(true)
            .unwrap_or_else(|e| panic!("seed {seed:#x}: checkpoint: {e:?}"))
            .expect("a task on disk")
            .finish()
            .unwrap_or_else(|e| panic!("seed {seed:#x}: finishing the checkpoint: {e:?}"));
        let metrics = self.catalog.metrics_of("s");
        let stream = self.catalog.stream("s").expect("stream s").clone();
        let (r, c) = (self.task.reservoir_stats(), self.task.cache_stats());
        for (sum, n) in self.disk_work.iter_mut().zip([
            r.cache_hits + r.cache_misses,
            c.misses,
            c.l2_hits,
            c.writes,
        ]) {
            *sum += n;
        }
        let placeholder = Task::new(stream.clone(), 0);
        drop(std::mem::replace(&mut self.task, placeholder));
        let mut task = Task::open(
            stream,
            0,
            node.task_storage(&task_id(), 0),
            Some((&cp, &metrics)),
        )
        .unwrap_or_else(|e| panic!("seed {seed:#x}: reopen: {e:?}"));
        task.set_metrics(&metrics)
            .unwrap_or_else(|e| panic!("seed {seed:#x}: set_metrics after reopen: {e:?}"));
        self.task = task;
        self.reboots += 1;
    }

    /// The arrival number of one of the last `within` accepted events.
    fn recent(&mut self, within: usize) -> Option<usize> {
        let len = self.model.events.len();
        if len == 0 {
            return None;
        }
        let back = self.rng.below(within.min(len) as u64) as usize;
        Some(len - 1 - back)
    }

    /// The next event time and, when it was chosen against an accepted event (a tie, or
    /// an edge of a window), that event, whose group the new event then joins.
    fn next_ts(&mut self) -> (i64, Option<usize>) {
        let t = self.model.t.unwrap_or(self.clock);
        let r = self.rng.unit();
        if r < 0.08 {
            // Out of order, up to 2.5 s behind stream time: some beyond the lateness.
            return (t - self.rng.between(0, 2_500_000), None);
        }
        if r < 0.09 {
            // The oldest time still accepted.
            return (t - LATENESS, None);
        }
        if r < 0.095 {
            // Late by one microsecond.
            return (t - LATENESS - 1, None);
        }
        if r < 0.11 {
            // The same time as a recent event: ties resolve in arrival order.
            return match self.recent(30) {
                Some(seq) => (self.model.events[seq].ts, Some(seq)),
                None => (t, None),
            };
        }
        let r = self.rng.unit();
        let mut base = None;
        if r < 0.02 {
            // Move the clock so that a recent event sits exactly on (or next to) an edge
            // of a window: sliding 10 s, delayed 10 s by 3 s, delayed 2.5 s by 0.5 s.
            const EDGES: [i64; 10] = [
                10 * SEC,
                10 * SEC - 1,
                3 * SEC,
                3 * SEC - 1,
                13 * SEC,
                13 * SEC - 1,
                500 * MS,
                500 * MS - 1,
                3 * SEC + 1,
                2_500 * MS,
            ];
            if let Some(seq) = self.recent(20) {
                let edge = EDGES[self.rng.below(EDGES.len() as u64) as usize];
                let at = self.model.events[seq].ts + edge;
                if at >= self.clock {
                    self.clock = at;
                    base = Some(seq);
                }
            }
        } else if r < 0.025 {
            // Exactly on, or just before, the next tumbling boundary.
            let size = 7 * SEC;
            self.clock = (self.clock.div_euclid(size) + 1) * size - self.rng.between(0, 1);
        } else if r >= 0.07 {
            self.clock += self.rng.between(0, 300_000);
        }
        (self.clock, base)
    }

    fn amount(&mut self) -> Option<f64> {
        if self.rng.chance(0.05) {
            return None;
        }
        let r = self.rng.unit();
        let x = if r < 0.15 {
            1e9 + self.rng.unit() * 100.0
        } else if r < 0.20 {
            -(1e9 + self.rng.unit() * 100.0)
        } else if r < 0.35 {
            0.0005 + self.rng.unit() * 0.0015
        } else if r < 0.60 {
            (self.rng.unit() - 0.5) * 2000.0
        } else if r < 0.90 {
            self.rng.unit() * 200.0
        } else {
            // Repeated values: ties for MIN/MAX, zero variances, the filter's edge.
            [42.0, -7.5, 50.0, 1e9][self.rng.below(4) as usize]
        };
        // Keep every amount a multiple of 2^-70 (any double of magnitude ≥ 2^-18 is).
        Some(if x.abs() < 2f64.powi(-18) { 0.5 } else { x })
    }

    fn generate(&mut self) -> Ev {
        let id = if !self.recent_ids.is_empty() && self.rng.chance(0.03) {
            // A duplicate: an id sent recently (well inside the dedup horizon), with
            // other values.
            self.recent_ids[self.rng.below(self.recent_ids.len() as u64) as usize]
        } else {
            let id = self.next_id;
            self.next_id += 1;
            self.recent_ids.push_back(id);
            if self.recent_ids.len() > 2_000 {
                self.recent_ids.pop_front();
            }
            id
        };
        let (ts, base) = self.next_ts();
        // Skewed towards the first keys.
        let mut k = self.rng.below(self.keys).min(self.rng.below(self.keys)) as u8;
        let mut tag = if self.rng.chance(0.2) {
            None
        } else {
            Some(self.rng.below(TAGS.len() as u64) as u8)
        };
        if let Some(seq) = base {
            // Join the group of the event on the edge, so that its answer shows the edge.
            k = self.model.events[seq].k;
            tag = self.model.events[seq].tag;
        }
        let amount = self.amount();
        let qty = if self.rng.chance(0.1) {
            None
        } else {
            Some(self.rng.between(-3, 10))
        };
        Ev {
            id,
            ts,
            k,
            tag,
            amount,
            qty,
        }
    }

    /// Panics unless `got` (per metric: name and values) is what the model expects.
    fn check_values(
        &self,
        context: &dyn Fn() -> String,
        got: &[(std::sync::Arc<str>, Vec<Value>)],
        exp: &[Vec<Exp>],
        group: (u8, Option<u8>),
        at: (Option<i64>, usize),
    ) {
        let names: Vec<&str> = got.iter().map(|(n, _)| &**n).collect();
        let want: Vec<&str> = self.metrics.iter().map(|m| m.name).collect();
        assert_eq!(names, want, "seed {:#x}: {}: metrics", self.seed, context());
        for ((m, (_, values)), exp) in self.metrics.iter().zip(got).zip(exp) {
            if let Some(what) = mismatch(m, values, exp) {
                panic!(
                    "seed {:#x}: {}: {what}\n{}",
                    self.seed,
                    context(),
                    self.model.describe(m, group.0, group.1, at.0, at.1)
                );
            }
        }
    }

    /// Generates, models and ingests one batch, and compares every answer.
    fn batch(&mut self, size: usize, with_values: bool) {
        let mut pending = Vec::with_capacity(size);
        let mut rows = Vec::with_capacity(size);
        for _ in 0..size {
            let e = self.generate();
            let outcome = self.model.offer(&e);
            let values = with_values.then(|| self.model.expected(&self.metrics, e.k, e.tag));
            rows.push(row(&e));
            pending.push(Pending {
                e,
                outcome,
                t: self.model.t,
                n_at: self.model.events.len(),
                values,
            });
        }
        let first = self.sent;
        self.sent += size;
        // Every other batch arrives with its WHERE results computed ahead, as the
        // round-robin stage computes them for COPY on another shard.
        let passes = first.is_multiple_of(2).then(|| {
            let stream = self.catalog.stream("s").expect("stream s");
            let batch = rows_to_batch(stream_schema(stream), &stream_types(stream), &rows)
                .expect("rows to a batch");
            Predicates::of(&self.catalog, stream)
                .and_then(|p| p.evaluate(&batch))
                .expect("predicates")
        });
        let got = self.task.ingest_with(&rows, with_values, passes.as_ref());
        let got = got.unwrap_or_else(|err| {
            panic!(
                "seed {:#x}: ingest of events #{first}..: {err:?}",
                self.seed
            )
        });
        assert_eq!(got.len(), size, "seed {:#x}: answers per batch", self.seed);
        for (i, (p, (outcome, values))) in pending.iter().zip(&got).enumerate() {
            let index = first + i;
            let context = || format!("event #{index} {:?} (T after it: {:?})", p.e, p.t);
            assert_eq!(
                *outcome,
                p.outcome,
                "seed {:#x}: {}: outcome",
                self.seed,
                context()
            );
            match &p.values {
                Some(exp) => {
                    self.check_values(&context, values, exp, (p.e.k, p.e.tag), (p.t, p.n_at))
                }
                None => assert!(
                    values.is_empty(),
                    "seed {:#x}: values not asked for",
                    self.seed
                ),
            }
        }
    }

    fn run(&mut self, events: usize) {
        let mut left = events;
        while left > 0 {
            let size = (self.rng.between(1, 50) as usize).min(left);
            let with_values = !self.rng.chance(0.3);
            self.batch(size, with_values);
            left -= size;
            if self.disk.is_some() && self.rng.chance(0.02) {
                self.reboot();
            }
        }
    }

    /// Every (key, tag) group, whether or not it has events.
    fn probes(&self) -> Vec<(u8, Option<u8>)> {
        let tags = std::iter::once(None).chain((0..TAGS.len() as u8).map(Some));
        (0..self.keys as u8)
            .flat_map(|k| tags.clone().map(move |t| (k, t)))
            .collect()
    }

    /// `values_for` of every group, as it stands, against the model.
    fn check_probes(&mut self, when: &str) {
        let at = (self.model.t, self.model.events.len());
        for (k, tag) in self.probes() {
            let got = self.task.values_for(&probe_row(k, tag));
            let exp = self.model.expected(&self.metrics, k, tag);
            let context = || format!("{when}, group k = {} tag = {tag:?}", KEYS[k as usize]);
            self.check_values(&context, &got, &exp, (k, tag), at);
        }
    }

    /// Every metric's non-empty groups (`metric_rows`) against the model.
    fn check_groups(&mut self, when: &str) {
        for m in &self.metrics {
            let mut expected: HashMap<Vec<Value>, Vec<Exp>> = HashMap::new();
            for &code in self.model.by_group[m.grp.idx()].keys() {
                let acc = self.model.acc(m.win, m.grp, m.filt, code, true);
                if acc.n > 0 {
                    let values = m.aggs.iter().map(|a| self.model.expect(&acc, a)).collect();
                    expected.insert(m.grp.values(code), values);
                }
            }
            let rows = self.task.metric_rows(m.name, None);
            let keys: Vec<&[Value]> = rows.iter().map(|r| &r[..m.grp.columns().len()]).collect();
            assert_eq!(
                rows.len(),
                expected.len(),
                "seed {:#x}: {when}: metric {} lists groups {keys:?}; the model's non-empty \
                 groups are {:?}",
                self.seed,
                m.name,
                expected.keys().collect::<Vec<_>>()
            );
            for r in &rows {
                let (key, values) = r.split_at(m.grp.columns().len());
                let exp = expected.get(key).unwrap_or_else(|| {
                    panic!(
                        "seed {:#x}: {when}: metric {} lists group {key:?}, which the model \
                         holds empty",
                        self.seed, m.name
                    )
                });
                if let Some(what) = mismatch(m, values, exp) {
                    panic!("seed {:#x}: {when}: group {key:?}: {what}", self.seed);
                }
            }
        }
    }

    /// Whether metric `m` would find stored events of some group in its window now.
    fn has_history(&self, m: &MSpec) -> bool {
        self.probes().into_iter().any(|(k, t)| {
            let acc = self
                .model
                .acc(m.win, m.grp, m.filt, m.grp.code(k, t), false);
            acc.n > 0
        })
    }

    fn create(&mut self, specs: Vec<MSpec>) {
        // A jump of the clock may just have emptied a window: ingest a little more until
        // every new metric has stored events to backfill, or the check proves nothing.
        let mut extra = 0;
        while !specs.iter().all(|m| self.has_history(m)) {
            assert!(
                extra < 1_000,
                "seed {:#x}: no history to backfill",
                self.seed
            );
            self.batch(1, true);
            extra += 1;
        }
        let names: Vec<&str> = specs.iter().map(|m| m.name).collect();
        let when = format!(
            "right after CREATE METRIC {names:?} at event #{}",
            self.sent
        );
        for m in &specs {
            self.catalog = apply_sql(&self.catalog, &m.sql());
            check_bound(&self.catalog, m);
        }
        self.metrics.extend(specs);
        self.task
            .set_metrics(&self.catalog.metrics_of("s"))
            .unwrap_or_else(|e| panic!("seed {:#x}: {when}: set_metrics: {e:?}", self.seed));
        self.check_probes(&when);
        self.check_groups(&when);
    }

    fn drop_metrics(&mut self, names: &[&str]) {
        let when = format!("right after DROP METRIC {names:?} at event #{}", self.sent);
        let probes = self.probes();
        let before: Vec<Vec<(std::sync::Arc<str>, Vec<Value>)>> = probes
            .iter()
            .map(|&(k, t)| self.task.values_for(&probe_row(k, t)))
            .collect();
        for name in names {
            self.catalog = apply_sql(&self.catalog, &format!("DROP METRIC {name}"));
        }
        self.metrics.retain(|m| !names.contains(&m.name));
        self.task
            .set_metrics(&self.catalog.metrics_of("s"))
            .unwrap_or_else(|e| panic!("seed {:#x}: {when}: set_metrics: {e:?}", self.seed));
        for (&(k, t), before) in probes.iter().zip(before) {
            let after = self.task.values_for(&probe_row(k, t));
            let kept: Vec<(std::sync::Arc<str>, Vec<Value>)> = before
                .into_iter()
                .filter(|(n, _)| !names.contains(&&**n))
                .collect();
            assert_eq!(
                after,
                kept,
                "seed {:#x}: {when}: the other metrics' values changed for group k = {} tag = {t:?}",
                self.seed,
                KEYS[k as usize]
            );
        }
        self.check_probes(&when);
        self.check_groups(&when);
    }

    fn finish(&mut self) {
        let seed = self.seed;
        assert_eq!(
            self.task.time(),
            self.model.t,
            "seed {seed:#x}: stream time"
        );
        let s = self.task.stats;
        assert_eq!(
            (s.accepted, s.late, s.duplicates),
            (self.model.accepted, self.model.late, self.model.duplicates),
            "seed {seed:#x}: (accepted, late, duplicate) counts"
        );
        self.check_probes("at the end");
        self.check_groups("at the end");
        // The generator must have produced what the test is about.
        let m = &self.model;
        assert!(
            m.late > 50 && m.duplicates > 50 && m.accepted_out_of_order > 500,
            "seed {seed:#x}: too few late ({}), duplicate ({}) or out-of-order ({}) events",
            m.late,
            m.duplicates,
            m.accepted_out_of_order
        );
    }
}

fn start_time(seed: u64, i: usize) -> i64 {
    if i == 1 {
        // Crosses the Unix epoch: tumbling windows must floor negative times.
        -40 * 60 * SEC
    } else {
        JAN_2026 + (seed % 7_000) as i64 * MS
    }
}

#[test]
fn oracle_matches_engine() {
    for (i, seed) in seeds().into_iter().enumerate() {
        let mut h = Harness::new(seed, start_time(seed, i), main_metrics());
        for _ in 0..5 {
            h.run(5_000);
            let when = format!("after event #{}", h.sent);
            h.check_groups(&when);
        }
        h.finish();
    }
}

#[test]
fn oracle_matches_engine_on_disk() {
    for (i, seed) in seeds().into_iter().take(2).enumerate() {
        let mut h = Harness::on_disk(seed ^ 0xD15C, start_time(seed, i), main_metrics());
        for _ in 0..3 {
            h.run(5_000);
            h.reboot();
            let when = format!("after event #{} and a reboot", h.sent);
            h.check_groups(&when);
        }
        h.finish();
        let chunks = h.task.reservoir_stats().chunks;
        assert!(h.reboots > 3, "seed {seed:#x}: {} reboots", h.reboots);
        assert!(chunks > 0, "seed {seed:#x}: nothing sealed");
        let [chunk_reads, store_reads, l2_hits, store_writes] = h.disk_work;
        assert!(
            chunk_reads > 0 && store_reads > 0 && l2_hits > 0 && store_writes > 0,
            "seed {seed:#x}: chunk reads {chunk_reads}, store reads {store_reads}, \
             L2 hits {l2_hits}, store writes {store_writes}"
        );
    }
}

#[test]
fn metrics_added_and_dropped_midway() {
    added_and_dropped(false);
}

#[test]
fn metrics_added_and_dropped_midway_on_disk() {
    added_and_dropped(true);
}

fn added_and_dropped(disk: bool) {
    for (i, seed) in seeds().into_iter().take(2).enumerate() {
        let initial = vec![
            metric(
                "a_slide",
                SLIDE_10,
                Filt::All,
                Grp::K,
                &["COUNT(*)", "SUM(amount)", "MAX(amount)"],
            ),
            metric(
                "b_tumble",
                TUMBLE_7,
                Filt::All,
                Grp::K,
                &["COUNT(*)", "SUM(qty)", "LAST_VALUE(amount)"],
            ),
            metric(
                "c_forever_big",
                Win::Infinite,
                Filt::AmountOver50,
                Grp::K,
                &["COUNT(*)", "SUM(amount)", "MIN(tag)"],
            ),
        ];
        let mut h = if disk {
            Harness::on_disk(seed ^ 0x00AD_D000, start_time(seed, i), initial)
        } else {
            Harness::new(seed ^ 0x00AD_D000, start_time(seed, i), initial)
        };
        h.run(7_000);
        h.create(vec![
            // The group of a_slide, with new aggregates and one it already has.
            metric(
                "d_slide_more",
                SLIDE_10,
                Filt::All,
                Grp::K,
                &[
                    "SUM(amount)",
                    "STDDEV(amount)",
                    "COUNT(DISTINCT tag)",
                    "LAST_VALUE(amount)",
                    "MIN(amount)",
                    "AVG(qty)",
                ],
            ),
            // A new group under an existing window and filter.
            metric(
                "e_slide_kt",
                SLIDE_10,
                Filt::All,
                Grp::KTag,
                &["COUNT(*)", "SUM(amount)", "LAST_VALUE(qty)"],
            ),
            // A new filter under the existing infinite window.
            metric(
                "f_forever_neg",
                Win::Infinite,
                Filt::NegativeAmountWithQty,
                Grp::KTag,
                &[
                    "COUNT(*)",
                    "SUM(qty)",
                    "AVG(amount)",
                    "VAR_POP(amount)",
                    "LAST_VALUE(tag)",
                ],
            ),
            // A new window.
            metric(
                "g_delayed",
                DELAYED_10_3,
                Filt::All,
                Grp::K,
                &[
                    "COUNT(*)",
                    "SUM(amount)",
                    "MIN(tag)",
                    "LAST_VALUE(amount)",
                    "VARIANCE(amount)",
                ],
            ),
            // A new filter under the existing tumbling window.
            metric(
                "h_tumble_f",
                TUMBLE_7,
                Filt::TagXOrQtyUnder3,
                Grp::K,
                &["COUNT(*)", "VARIANCE(amount)", "MAX(qty)"],
            ),
        ]);
        h.run(7_000);
        // a_slide shares its group with d_slide_more; c_forever_big owns its filter.
        h.drop_metrics(&["a_slide", "c_forever_big"]);
        h.run(3_000);
        // The dropped filter again, now over the whole stored history, without groups.
        h.create(vec![metric(
            "i_forever_big",
            Win::Infinite,
            Filt::AmountOver50,
            Grp::Global,
            &[
                "COUNT(*)",
                "SUM(amount)",
                "MAX(amount)",
                "COUNT(DISTINCT k)",
            ],
        )]);
        h.run(3_000);
        h.finish();
    }
}

/// Records what a task hands to a subscription.
#[derive(Default)]
struct Recorder {
    changes: Mutex<Vec<Change>>,
}

impl Watcher for Recorder {
    fn deliver(&self, changes: &[Change]) -> bool {
        self.changes.lock().unwrap().extend_from_slice(changes);
        true
    }

    fn end(&self, error: eddy_planner::Error) {
        panic!("watch ended: {error:?}");
    }
}

impl Harness {
    /// The model's values of every group of metric `m` (empty groups included), by
    /// group-by values.
    fn all_groups(&self, m: &MSpec) -> HashMap<Vec<Value>, Vec<Exp>> {
        self.probes()
            .into_iter()
            .map(|(k, tag)| {
                let code = m.grp.code(k, tag);
                let acc = self.model.acc(m.win, m.grp, m.filt, code, true);
                let exp = m.aggs.iter().map(|a| self.model.expect(&acc, a)).collect();
                (m.grp.values(code), exp)
            })
            .collect()
    }
}

#[test]
fn changes_match_the_model() {
    let seed = seeds()[0] ^ 0x0C4A_66E5;
    let mut h = Harness::new(seed, start_time(seed, 0), main_metrics());
    h.run(500);
    let recorders: Vec<Arc<Recorder>> = h
        .metrics
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let r = Arc::new(Recorder::default());
            h.task
                .watch(i as u64, WatchTarget::Metric(m.name.to_string()), r.clone());
            r
        })
        .collect();
    // The snapshot: every non-empty group, stamped with the stream time.
    let t = h.model.t.expect("events before the watch");
    for (m, r) in h.metrics.iter().zip(&recorders) {
        let got = std::mem::take(&mut *r.changes.lock().unwrap());
        let live = h
            .all_groups(m)
            .into_iter()
            .filter(|(_, exp)| !matches!(&exp[0], Exp::Exact(Value::Int(0))))
            .count();
        if m.aggs[0].sql == "COUNT(*)" {
            assert_eq!(got.len(), live, "seed {seed:#x}: snapshot of {}", m.name);
        }
        for c in &got {
            assert_eq!(c.row.last(), Some(&Value::Timestamp(t)));
        }
    }
    let mut before: Vec<HashMap<Vec<Value>, Vec<Exp>>> =
        h.metrics.iter().map(|m| h.all_groups(m)).collect();
    let mut emitted = 0usize;
    for i in 0..2_000 {
        let e = h.generate();
        let outcome = h.model.offer(&e);
        let got = h.task.ingest(&[row(&e)], false).expect("ingest");
        assert_eq!(got[0].0, outcome, "seed {seed:#x}: event #{i} outcome");
        for (mi, m) in h.metrics.iter().enumerate() {
            let now = h.all_groups(m);
            let changes = std::mem::take(&mut *recorders[mi].changes.lock().unwrap());
            let width = m.grp.columns().len();
            let mut seen: HashSet<Vec<Value>> = HashSet::new();
            for c in &changes {
                let (key, rest) = c.row.split_at(width);
                let (values, at) = rest.split_at(rest.len() - 1);
                assert_eq!(
                    at[0],
                    Value::Timestamp(h.model.t.unwrap()),
                    "seed {seed:#x}: event #{i}: {} changed_at",
                    m.name
                );
                let exp = now.get(key).unwrap_or_else(|| {
                    panic!(
                        "seed {seed:#x}: event #{i}: {} emitted unknown group {key:?}",
                        m.name
                    )
                });
                if let Some(what) = mismatch(m, values, exp) {
                    panic!(
                        "seed {seed:#x}: event #{i} {e:?}: {} group {key:?}: {what}",
                        m.name
                    );
                }
                assert!(
                    seen.insert(key.to_vec()),
                    "seed {seed:#x}: event #{i}: {} emitted group {key:?} twice",
                    m.name
                );
            }
            for (key, exp) in &now {
                let old = &before[mi][key];
                if format!("{old:?}") != format!("{exp:?}") {
                    assert!(
                        seen.contains(key),
                        "seed {seed:#x}: event #{i} {e:?}: {} group {key:?} changed from \
                         {old:?} to {exp:?} but no row was emitted",
                        m.name
                    );
                }
            }
            emitted += changes.len();
            before[mi] = now;
        }
    }
    assert!(emitted > 2_000, "seed {seed:#x}: only {emitted} changes");
}
