//! Latency histograms for `/metrics`, in Prometheus' cumulative-bucket form: the node's
//! statements (by kind), ingests and checkpoints. Recording is two relaxed atomic adds
//! and a search of 18 bounds, so the hot path can afford it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use eddy_planner::sql::Statement;

use crate::ops::metrics::{Families, Series};

/// Upper bounds of the buckets, in seconds (`+Inf` follows).
const BOUNDS: [f64; 18] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// One histogram.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Per bucket, not cumulative; the last is `+Inf`.
    counts: [AtomicU64; BOUNDS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn record(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let i = BOUNDS.partition_point(|b| *b < seconds);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos
            .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    }

    /// The series: cumulative counts per bound (`+Inf` last), count and sum in seconds.
    fn series(&self) -> Series {
        let mut cumulative = 0;
        let buckets = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, count)| {
                cumulative += count.load(Ordering::Relaxed);
                (BOUNDS.get(i).copied().unwrap_or(f64::INFINITY), cumulative)
            })
            .collect();
        Series {
            buckets,
            count: cumulative,
            sum: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// What a statement is, for its histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Insert,
    Select,
    Copy,
    Ddl,
    Other,
}

const KINDS: [(Kind, &str); 5] = [
    (Kind::Insert, "insert"),
    (Kind::Select, "select"),
    (Kind::Copy, "copy"),
    (Kind::Ddl, "ddl"),
    (Kind::Other, "other"),
];

impl Kind {
    pub fn of(stmt: &Statement) -> Kind {
        match stmt {
            Statement::Insert(_) => Kind::Insert,
            Statement::Query(_) | Statement::Fetch(_) => Kind::Select,
            Statement::Copy(_) | Statement::CopyOut(_) => Kind::Copy,
            Statement::CreateStream { .. }
            | Statement::CreateMetric(_)
            | Statement::DropStream { .. }
            | Statement::DropMetric { .. }
            | Statement::AlterStreamAddColumn { .. } => Kind::Ddl,
            _ => Kind::Other,
        }
    }
}

/// The node's latency histograms.
#[derive(Debug, Default)]
pub struct Timings {
    statements: [Histogram; KINDS.len()],
    /// One ingest: from the statement's events reaching the engine to their being
    /// applied (logged first when durable).
    pub ingest: Histogram,
    pub checkpoint: Histogram,
}

impl Timings {
    pub fn statement(&self, kind: Kind, elapsed: Duration) {
        let i = KINDS.iter().position(|(k, _)| *k == kind).unwrap_or(0);
        self.statements[i].record(elapsed);
    }

    /// The three families.
    pub fn families(&self, out: &mut Families) {
        out.histogram(
            "eddy_statement_duration_seconds",
            "Time to run a statement, by kind (insert, select, copy, ddl, other).",
            KINDS
                .iter()
                .zip(&self.statements)
                .map(|((_, kind), h)| (vec![("kind", kind.to_string())], h.series()))
                .collect(),
        );
        out.histogram(
            "eddy_ingest_duration_seconds",
            "Time from a statement's events reaching the engine to their being applied.",
            vec![(vec![], self.ingest.series())],
        );
        out.histogram(
            "eddy_checkpoint_duration_seconds",
            "Time to take one checkpoint of the node (every checkpoint, as eddy_checkpoints_total counts them).",
            vec![(vec![], self.checkpoint.series())],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_sum_in_seconds() {
        let h = Histogram::default();
        h.record(Duration::from_micros(30));
        h.record(Duration::from_millis(3));
        h.record(Duration::from_secs(60));
        let mut families = Families::default();
        families.histogram("x", "help", vec![(vec![("kind", "a".into())], h.series())]);
        let out = families.text();
        for line in [
            "x_bucket{kind=\"a\",le=\"0.00005\"} 1",
            "x_bucket{kind=\"a\",le=\"0.005\"} 2",
            "x_bucket{kind=\"a\",le=\"10\"} 2",
            "x_bucket{kind=\"a\",le=\"+Inf\"} 3",
            "x_count{kind=\"a\"} 3",
        ] {
            assert!(out.lines().any(|l| l == line), "no {line} in {out}");
        }
        assert!(out.contains("x_sum{kind=\"a\"} 60.00303"), "{out}");
    }
}
