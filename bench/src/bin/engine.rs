//! Engine benchmark, in-process (no network): COUNT, SUM, AVG of amount over a 5-minute
//! SLIDING window grouped by card. Prints one JSON object: events/s per shard and the
//! per-event latency percentiles.
//!
//! `engine --mode task` drives one task directly (one core's work, per-event latency);
//! `--mode engine` goes through the shard queues with `--shards` threads. `--window '1 hour'`
//! sets the window's size (default 5 minutes).
//! Instructions per event: `bench/engine-instructions.sh`.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use eddy_bench::XorShift;
use eddy_cluster::{Engine, MemoryLog, Row, Task};
use eddy_planner::catalog::Catalog;
use eddy_planner::ddl;
use eddy_planner::types::Value;

/// Eddy's allocator, as in the server.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    events: u64,
    cards: u64,
    mode: String,
    shards: usize,
    /// Events per ingest call: by default 1,024 through the engine, 1 into a task.
    batch: Option<usize>,
    /// Events per second of event time.
    rate: u64,
    /// `basic`: COUNT, SUM, AVG; `full`: also MIN, MAX and COUNT(DISTINCT amount);
    /// `percentiles`: COUNT, MEDIAN and PERCENTILE_CONT(0.99) of amount.
    aggs: String,
    /// The sliding window's size (and the stream's retention), as an SQL interval.
    window: String,
}

fn args() -> Result<Args> {
    let mut a = Args {
        events: 10_000_000,
        cards: 100_000,
        mode: "task".to_string(),
        shards: 2,
        batch: None,
        rate: 10_000,
        aggs: "basic".to_string(),
        window: "5 minutes".to_string(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--events" => a.events = value.parse()?,
            "--cards" => a.cards = value.parse()?,
            "--mode" => a.mode = value,
            "--shards" => a.shards = value.parse()?,
            "--batch" => a.batch = Some(value.parse::<usize>()?.max(1)),
            "--rate" => a.rate = value.parse::<u64>()?.max(1),
            "--aggs" => a.aggs = value,
            "--window" => a.window = value,
            other => bail!("unknown argument {other}; use --events N --cards N --mode task|engine --shards N --batch N --rate N --aggs basic|full|percentiles --window '5 minutes'"),
        }
        i += 2;
    }
    Ok(a)
}

/// A deterministic event generator: `rate` events per second of event time.
struct Events {
    rng: XorShift,
    step_us: i64,
    next_id: i64,
    cards: Vec<Value>,
}

impl Events {
    fn new(cards: u64, rate: u64) -> Events {
        Events {
            rng: XorShift(0x9e37_79b9_7f4a_7c15),
            step_us: (1_000_000 / rate).max(1) as i64,
            next_id: 0,
            cards: (0..cards)
                .map(|c| Value::Text(format!("card-{c}").into()))
                .collect(),
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// The next event's values, pushed onto `out`.
    fn push_next(&mut self, out: &mut Vec<Value>) {
        let id = self.next_id;
        self.next_id += 1;
        let pick = (self.next_u64() % self.cards.len() as u64) as usize;
        let card = self.cards[pick].clone();
        let amount = (self.next_u64() % 100_000) as f64 / 100.0;
        let ts = 1_800_000_000_000_000 + id * self.step_us;
        out.extend([
            Value::Int(id),
            Value::Timestamp(ts),
            card,
            Value::Float(amount),
        ]);
    }

    /// The next `n` events, sharing one block as the rows of one statement, COPY batch
    /// or Kafka poll do in the server (`Row::block`).
    fn batch(&mut self, n: usize) -> Vec<Row> {
        let mut values = Vec::with_capacity(n * 4);
        for _ in 0..n {
            self.push_next(&mut values);
        }
        Row::block(values, n)
    }
}

/// The aggregates of the metric, per `--aggs`.
fn aggregates(aggs: &str) -> Result<&'static str> {
    Ok(match aggs {
        "basic" => "COUNT(*) AS n, SUM(amount) AS total, AVG(amount) AS mean",
        "full" => {
            "COUNT(*) AS n, SUM(amount) AS total, AVG(amount) AS mean, MIN(amount) AS low, \
             MAX(amount) AS high, COUNT(DISTINCT amount) AS amounts"
        }
        "percentiles" => {
            "COUNT(*) AS n, MEDIAN(amount) AS med, \
             PERCENTILE_CONT(0.99) WITHIN GROUP (ORDER BY amount) AS p99"
        }
        other => bail!("unknown --aggs {other}; use basic, full or percentiles"),
    })
}

fn catalog(partitions: u32, aggs: &str, window: &str) -> Result<Catalog> {
    if window.contains('\'') {
        bail!("--window {window}: quotes are not allowed");
    }
    Ok(ddl::catalog_of([
        format!(
            "CREATE STREAM payments (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
             amount DOUBLE PRECISION) WITH (event_time = 'ts', partition_by = 'card', partitions = {partitions}, retention = '{window}')"
        ),
        format!(
            "CREATE METRIC card_5m AS SELECT card, {} FROM payments \
             WINDOW SLIDING (SIZE INTERVAL '{window}') GROUP BY card",
            aggregates(aggs)?
        ),
    ])?)
}

/// What a run computes, for its JSON.
fn workload(a: &Args) -> Result<String> {
    Ok(format!(
        "{} over SLIDING {} GROUP BY card",
        aggregates(&a.aggs)?,
        a.window.to_uppercase()
    ))
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn run_task(a: &Args) -> Result<serde_json::Value> {
    let c = catalog(1, &a.aggs, &a.window)?;
    let stream = c.stream("payments").expect("created").clone();
    let mut task = Task::new(stream.clone(), 0);
    let metrics = c.metrics_of("payments");
    task.set_metrics(&metrics)?;
    let mut gen = Events::new(a.cards, a.rate);
    // Events from this one on find the window full: each one that enters makes about
    // one leave, as in a long-running server.
    let full_from = metrics[0]
        .window
        .reach_us()
        .map_or(u64::MAX, |reach| (reach / gen.step_us) as u64 + 1);
    let batch = a.batch.unwrap_or(1);
    let mut latencies = Vec::with_capacity(a.events as usize);
    let (mut busy_ns, mut steady_ns): (u128, u128) = (0, 0);
    let wall = Instant::now();
    let mut rows: Vec<Row>;
    let mut sent = 0u64;
    while sent < a.events {
        let n = (a.events - sent).min(batch as u64);
        rows = gen.batch(n as usize);
        let t = Instant::now();
        task.ingest(&rows, false)?;
        let ns = t.elapsed().as_nanos();
        busy_ns += ns;
        // Events past the fill, at the batch's mean cost each.
        let steady = (sent + n).saturating_sub(sent.max(full_from));
        steady_ns += ns * steady as u128 / n as u128;
        // An event's latency is at most its batch's: each one is counted at that.
        let ns = ns.min(u32::MAX as u128) as u32;
        latencies.extend(std::iter::repeat_n(ns, n as usize));
        sent += n;
    }
    let wall_s = wall.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let rate = a.events as f64 / (busy_ns as f64 / 1e9);
    let steady = a.events.saturating_sub(full_from);
    let steady_rate = (steady > 0).then(|| (steady as f64 / (steady_ns as f64 / 1e9)).round());
    Ok(serde_json::json!({
        "mode": "task",
        "workload": workload(a)?,
        // Events per ingest call; the latencies are of whole calls.
        "batch": batch,
        "window": a.window,
        "events": a.events,
        "cards": a.cards,
        "shards": 1,
        "events_per_sec_per_shard": rate.round(),
        // The same over the events that found the window full (null if none did).
        "full_window_events_per_sec_per_shard": steady_rate,
        "full_window_events": steady,
        "wall_seconds": wall_s,
        "latency_us": {
            "p50": percentile(&latencies, 0.50),
            "p90": percentile(&latencies, 0.90),
            "p99": percentile(&latencies, 0.99),
            "p999": percentile(&latencies, 0.999),
            "max": percentile(&latencies, 1.0),
        },
        "stored_events": task.stored_events(),
    }))
}

fn run_engine(a: &Args) -> Result<serde_json::Value> {
    let c = Arc::new(catalog((a.shards * 4) as u32, &a.aggs, &a.window)?);
    let stream = c.stream("payments").expect("created").clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let engine = Engine::start(a.shards, Arc::new(MemoryLog), None);
    runtime.block_on(engine.apply_catalog(c.clone()))?;
    let mut gen = Events::new(a.cards, a.rate);
    let batch = a.batch.unwrap_or(1024);
    let mut latencies = Vec::new();
    let wall = Instant::now();
    let mut sent = 0u64;
    while sent < a.events {
        let n = (a.events - sent).min(batch as u64);
        let rows = gen.batch(n as usize);
        let t = Instant::now();
        runtime.block_on(engine.ingest(&stream, rows, false, true))?;
        latencies.push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
        sent += n;
    }
    let wall_s = wall.elapsed().as_secs_f64();
    latencies.sort_unstable();
    engine.shutdown();
    Ok(serde_json::json!({
        "mode": "engine",
        "workload": workload(a)?,
        "window": a.window,
        "events": a.events,
        "cards": a.cards,
        "shards": a.shards,
        "batch": batch,
        "events_per_sec": (a.events as f64 / wall_s).round(),
        "events_per_sec_per_shard": (a.events as f64 / wall_s / a.shards as f64).round(),
        "batch_latency_us": {
            "p50": percentile(&latencies, 0.50),
            "p90": percentile(&latencies, 0.90),
            "p99": percentile(&latencies, 0.99),
            "p999": percentile(&latencies, 0.999),
            "max": percentile(&latencies, 1.0),
        },
    }))
}

fn main() -> Result<()> {
    let a = args()?;
    let out = match a.mode.as_str() {
        "task" => run_task(&a)?,
        "engine" => run_engine(&a)?,
        other => bail!("unknown mode {other}"),
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
