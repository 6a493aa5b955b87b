//! What hopping windows cost in accuracy (Railgun's Figure 1, measured): one task runs an
//! exact sliding window and hopping windows of the same size with several hops over the
//! same events, and for every event compares each hopping result (COUNT, SUM) with the
//! exact one.
//!
//! Usage: hopping [--events N] [--cards N] [--rate EVENTS_PER_SECOND] [--window MINUTES]
//! Prints one JSON object: per hop, the share of events whose result differs from the
//! exact sliding result, and the mean relative error of the count.

use std::time::Instant;

use anyhow::Result;
use eddy_bench::XorShift;
use eddy_cluster::{Row, Task};
use eddy_planner::catalog::Catalog;
use eddy_planner::ddl;
use eddy_planner::sql::parse_statement;
use eddy_planner::types::Value;

#[derive(clap::Parser)]
#[command(about = "Hopping windows against the exact sliding window, after every event")]
struct Args {
    /// Events to feed.
    #[arg(long, default_value_t = 200_000)]
    events: u64,
    /// Distinct cards (groups).
    #[arg(long, default_value_t = 100)]
    cards: u64,
    /// Events per second of event time.
    #[arg(long, default_value_t = 50)]
    rate: u64,
    /// The window's size in minutes.
    #[arg(long = "window", default_value_t = 5)]
    window_minutes: i64,
}

/// Hops in seconds, as fractions of the window: from fine to a hop as long as the window
/// (a tumbling window that reports the last completed one).
fn hops(window_s: i64) -> Vec<i64> {
    let mut h: Vec<i64> = [1, 10, 30, 60, window_s / 2, window_s]
        .into_iter()
        .filter(|h| *h >= 1 && *h <= window_s)
        .collect();
    h.sort_unstable();
    h.dedup();
    h
}

fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    let window_s = a.window_minutes * 60;
    let hops = hops(window_s);
    let mut catalog = Catalog::default();
    let mut statements = vec![
        "CREATE STREAM payments (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
         amount DOUBLE PRECISION) WITH (event_time = 'ts')"
            .to_string(),
        format!(
            "CREATE METRIC exact AS SELECT card, COUNT(*) AS n, SUM(amount) AS s FROM payments \
             WINDOW SLIDING (SIZE {window_s} SECONDS) GROUP BY card"
        ),
    ];
    for h in &hops {
        statements.push(format!(
            "CREATE METRIC hop_{h} AS SELECT card, COUNT(*) AS n, SUM(amount) AS s FROM payments \
             WINDOW HOPPING (SIZE {window_s} SECONDS, HOP {h} SECONDS) GROUP BY card"
        ));
    }
    for sql in &statements {
        catalog = ddl::apply(&catalog, &parse_statement(sql)?)?.0;
    }
    let stream = catalog.stream("payments").expect("created").clone();
    let mut task = Task::new(stream, 0);
    task.set_metrics(&catalog.metrics_of("payments"))?;

    let mut rng = XorShift(0x5eed_f161);
    let cards: Vec<Value> = (0..a.cards)
        .map(|c| Value::Text(format!("card-{c}").into()))
        .collect();
    let step_us = (1_000_000 / a.rate.max(1)) as i64;
    let mut differ = vec![0u64; hops.len()];
    let mut count_error = vec![0f64; hops.len()];
    let wall = Instant::now();
    for id in 0..a.events as i64 {
        let card = cards[(rng.next_u64() % a.cards) as usize].clone();
        let amount = (rng.next_u64() % 100_000) as f64 / 100.0;
        let row = Row::from(vec![
            Value::Int(id),
            Value::Timestamp(1_800_000_000_000_000 + id * step_us),
            card,
            Value::Float(amount),
        ]);
        let out = task.ingest(&[row], true)?;
        let values = &out[0].1;
        let of = |name: &str| {
            values
                .iter()
                .find(|(m, _)| &**m == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let exact = of("exact");
        let exact_n = match exact.first() {
            Some(Value::Int(n)) => *n as f64,
            _ => 0.0,
        };
        for (i, h) in hops.iter().enumerate() {
            let got = of(&format!("hop_{h}"));
            if got != exact {
                differ[i] += 1;
            }
            let n = match got.first() {
                Some(Value::Int(n)) => *n as f64,
                _ => 0.0,
            };
            if exact_n > 0.0 {
                count_error[i] += (n - exact_n).abs() / exact_n;
            }
        }
    }
    let per_hop: Vec<serde_json::Value> = hops
        .iter()
        .enumerate()
        .map(|(i, h)| {
            serde_json::json!({
                "hop_seconds": h,
                "events_differing_share": differ[i] as f64 / a.events as f64,
                "count_mean_relative_error": count_error[i] / a.events as f64,
            })
        })
        .collect();
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "window_seconds": window_s,
            "events": a.events,
            "cards": a.cards,
            "events_per_second_of_event_time": a.rate,
            "compared": "COUNT(*) and SUM(amount) per card, hopping vs exact sliding, after every event",
            "hops": per_hop,
            "wall_seconds": wall.elapsed().as_secs_f64(),
        }))?
    );
    Ok(())
}
