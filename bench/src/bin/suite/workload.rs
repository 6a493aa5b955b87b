//! The per-event scoring workload every system runs: a deterministic sequence of card
//! payments, the exact answer for each (COUNT, SUM, AVG of the card's amounts over the
//! sliding window `(ts - window, ts]`, the event included), and the tally of one run:
//! latency per round trip in an HdrHistogram and the answers that did not match.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::Result;
use eddy_bench::XorShift;
use hdrhistogram::Histogram;
use serde::Serialize;

/// The scoring window, in milliseconds (5 minutes).
pub const WINDOW_MS: i64 = 5 * 60 * 1000;

/// The sizes of one workload.
#[derive(Clone, Debug, Serialize)]
pub struct Workload {
    /// Distinct cards.
    pub cards: u64,
    /// Event time between two events, in milliseconds.
    pub step_ms: i64,
    /// Events generated (each run answers a prefix of them).
    pub events: usize,
}

/// One payment.
#[derive(Clone, Debug)]
pub struct Event {
    pub id: i64,
    /// Milliseconds after [`base`].
    pub ts_ms: i64,
    pub card: String,
    card_index: usize,
    /// The amount in cents, so the reference sums exactly.
    pub cents: i64,
}

/// The event time of `ts_ms = 0`: 2026-01-01 00:00:00.
pub fn base() -> chrono::NaiveDateTime {
    chrono::DateTime::from_timestamp(1_767_225_600, 0)
        .expect("a valid timestamp")
        .naive_utc()
}

impl Event {
    pub fn ts(&self) -> chrono::NaiveDateTime {
        base() + chrono::Duration::milliseconds(self.ts_ms)
    }

    pub fn amount(&self) -> f64 {
        self.cents as f64 / 100.0
    }
}

/// The events of `w`, the same on every call.
pub fn events(w: &Workload) -> Vec<Event> {
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    (0..w.events)
        .map(|i| {
            let card_index = (rng.next_u64() % w.cards) as usize;
            Event {
                id: i as i64,
                ts_ms: i as i64 * w.step_ms,
                card: format!("c{card_index}"),
                card_index,
                cents: (rng.next_u64() % 100_000) as i64,
            }
        })
        .collect()
}

/// The exact answer for one event.
#[derive(Clone, Copy, Debug)]
pub struct Expected {
    pub n: i64,
    pub sum_cents: i64,
}

/// The exact answer for every event, each against its card's window `(ts - WINDOW_MS, ts]`.
pub fn reference(events: &[Event], cards: u64) -> Vec<Expected> {
    let mut windows: Vec<(VecDeque<(i64, i64)>, i64)> = vec![(VecDeque::new(), 0); cards as usize];
    events
        .iter()
        .map(|e| {
            let (live, sum) = &mut windows[e.card_index];
            live.push_back((e.ts_ms, e.cents));
            *sum += e.cents;
            while let Some(&(ts, cents)) = live.front() {
                if ts > e.ts_ms - WINDOW_MS {
                    break;
                }
                live.pop_front();
                *sum -= cents;
            }
            Expected {
                n: live.len() as i64,
                sum_cents: *sum,
            }
        })
        .collect()
}

/// What a system answered for one event.
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    pub n: i64,
    pub sum: Option<f64>,
    pub avg: Option<f64>,
}

fn close(got: Option<f64>, want: f64) -> bool {
    got.is_some_and(|g| (g - want).abs() <= 1e-9 * want.abs().max(1.0))
}

impl Answer {
    /// The answer in a row of (n, sum, avg), as Eddy and PostgreSQL return it.
    pub fn of_row(row: &tokio_postgres::Row) -> Result<Answer> {
        Ok(Answer {
            n: row.try_get(0)?,
            sum: row.try_get(1)?,
            avg: row.try_get(2)?,
        })
    }

    /// The answers of one round trip that sent `sent` events.
    pub fn of_rows(rows: &[tokio_postgres::Row], sent: usize) -> Result<Vec<Answer>> {
        anyhow::ensure!(rows.len() == sent, "{} rows for {sent} events", rows.len());
        rows.iter().map(Answer::of_row).collect()
    }

    /// Whether it is the exact answer (sums and averages to 1e-9, relative).
    pub fn matches(&self, want: &Expected) -> bool {
        let sum = want.sum_cents as f64 / 100.0;
        self.n == want.n && close(self.sum, sum) && close(self.avg, sum / want.n as f64)
    }
}

/// Latency percentiles, in milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Percentiles {
    /// The five figures in plot order, with their names.
    pub fn named(&self) -> [(&'static str, f64); 5] {
        [
            ("p50", self.p50),
            ("p90", self.p90),
            ("p99", self.p99),
            ("p99.9", self.p999),
            ("max", self.max),
        ]
    }
}

/// The tally of one run: round-trip latencies and the answers checked so far.
pub struct Tally {
    histogram: Histogram<u64>,
    started: Instant,
    pub events: usize,
    pub mismatches: u64,
    pub first_mismatch: Option<String>,
}

impl Tally {
    pub fn new() -> Result<Tally> {
        Ok(Tally {
            histogram: Histogram::new_with_bounds(1, 600_000_000, 3)?,
            started: Instant::now(),
            events: 0,
            mismatches: 0,
            first_mismatch: None,
        })
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Records one round trip of `took` that answered `answers` for the next events.
    pub fn record(
        &mut self,
        took: Duration,
        answers: &[Answer],
        expected: &[Expected],
    ) -> Result<()> {
        self.histogram
            .record((took.as_micros() as u64).clamp(1, 600_000_000))?;
        let want = &expected[self.events..];
        if answers.len() > want.len() {
            anyhow::bail!("{} answers for {} events", answers.len(), want.len());
        }
        for (i, (got, want)) in answers.iter().zip(want).enumerate() {
            if !got.matches(want) {
                self.mismatches += 1;
                if self.first_mismatch.is_none() {
                    self.first_mismatch = Some(format!(
                        "event {}: got n={} sum={:?} avg={:?}, want n={} sum={}",
                        self.events + i,
                        got.n,
                        got.sum,
                        got.avg,
                        want.n,
                        want.sum_cents as f64 / 100.0
                    ));
                }
            }
        }
        self.events += answers.len();
        Ok(())
    }

    /// The round trips' latency percentiles.
    pub fn percentiles(&self) -> Percentiles {
        let q = |p: f64| self.histogram.value_at_quantile(p) as f64 / 1000.0;
        Percentiles {
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            p999: q(0.999),
            max: self.histogram.max() as f64 / 1000.0,
        }
    }

    pub fn round_trips(&self) -> u64 {
        self.histogram.len()
    }
}

/// One system's run of the workload in one form.
#[derive(Clone, Debug, Serialize)]
pub struct ScoreRun {
    pub system: String,
    /// `single` (one event per round trip) or `batch` / `pipeline` (many).
    pub form: String,
    /// What makes it durable here: `synchronous_commit=on`, `off`, or none.
    pub durability: String,
    pub events_per_round_trip: usize,
    pub events: usize,
    pub round_trips: u64,
    pub seconds: f64,
    pub events_per_sec: f64,
    /// Per round trip (a batch's events all wait for the batch).
    pub latency_ms: Percentiles,
    pub exact: bool,
    pub mismatches: u64,
    pub first_mismatch: Option<String>,
    /// Stopped by the time cap before the last event.
    pub capped: bool,
}

impl ScoreRun {
    /// The run's figures from its tally.
    pub fn new(
        system: &str,
        form: &str,
        durability: &str,
        batch: usize,
        tally: &Tally,
        wanted: usize,
    ) -> ScoreRun {
        let seconds = tally.elapsed().as_secs_f64();
        ScoreRun {
            system: system.to_string(),
            form: form.to_string(),
            durability: durability.to_string(),
            events_per_round_trip: batch,
            events: tally.events,
            round_trips: tally.round_trips(),
            seconds: (seconds * 1000.0).round() / 1000.0,
            events_per_sec: (tally.events as f64 / seconds.max(1e-9)).round(),
            latency_ms: tally.percentiles(),
            exact: tally.mismatches == 0 && tally.events > 0,
            mismatches: tally.mismatches,
            first_mismatch: tally.first_mismatch.clone(),
            capped: tally.events < wanted,
        }
    }

    /// The label of its series in the latency plot.
    pub fn label(&self) -> String {
        let mut s = format!("{} {}", self.system, self.form);
        if self.events_per_round_trip > 1 {
            s.push_str(&format!(" x{}", self.events_per_round_trip));
        }
        if !self.durability.is_empty() && self.durability != "none" {
            s.push_str(&format!(" ({})", self.durability));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_slides() {
        let w = Workload {
            cards: 1,
            step_ms: 100_000,
            events: 5,
        };
        let e = events(&w);
        let r = reference(&e, 1);
        // 100 s apart: (ts - 300 s, ts] holds at most 3 events.
        let n: Vec<i64> = r.iter().map(|x| x.n).collect();
        assert_eq!(n, vec![1, 2, 3, 3, 3]);
        assert_eq!(r[4].sum_cents, e[2].cents + e[3].cents + e[4].cents);
    }
}
