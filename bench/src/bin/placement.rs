//! Placement benchmark: HiBench's streaming *Fixed Window* workload (seed 003's
//! evaluation) on 1 and 2 shards, with the shards pinned by the placement plan and
//! without. Prints one JSON object: events/s and batch latency per configuration (the
//! median of `--runs` interleaved runs), what pinning costs, and how 1 → 2 shards scales.
//!
//! ```text
//! placement [--events N] [--ips N] [--runs N] [--batch N]
//! ```
//!
//! The workload counts each IP's connections over a 30-second tumbling window, with the
//! first and last connection times:
//! `SELECT ip, COUNT(*), MIN(ts), MAX(ts) FROM visits WINDOW TUMBLING (SIZE 30 SECONDS)
//! GROUP BY ip`, over 8 tasks (so 1 and 2 shards run the same tasks).
//!
//! Every configuration runs in a child process (pinning binds threads for good). The
//! events are generated and routed to their tasks before the clock starts, so the
//! generator does not run beside the measured shards:
//! - throughput: every task batch is queued at once (a few statements in flight, so the
//!   shards never wait for the driver), until all are answered;
//! - latency: statements of `--batch` events, one at a time for a second (what they
//!   sustain), then paced at half that rate for two seconds, each timed from when it was
//!   due to its last answer.

use std::collections::VecDeque;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use eddy_bench::{median, XorShift};
use eddy_cluster::log::TaskBatch;
use eddy_cluster::placement::Pinning;
use eddy_cluster::route::partition_for;
use eddy_cluster::{Engine, MemoryLog, Row, TaskId};
use eddy_planner::catalog::{Catalog, StreamDef};
use eddy_planner::types::Value;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TASKS: u32 = 8;
/// Events per task batch in the throughput phase.
const THROUGHPUT_BATCH: usize = 4096;
/// Statements in flight in the throughput phase.
const IN_FLIGHT: usize = 4;

#[derive(clap::Parser)]
struct Args {
    /// Events per run.
    #[arg(long, default_value_t = 2_000_000)]
    events: usize,
    /// Distinct IP addresses.
    #[arg(long, default_value_t = 100_000)]
    ips: u64,
    /// Runs of each configuration (the median is reported).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    runs: u64,
    /// Events per statement in the latency phase.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    batch: u64,
    /// Runs one configuration with this many shards, in this process (the child).
    #[arg(long)]
    one: Option<usize>,
    /// With `--one`: the shards are pinned.
    #[arg(long)]
    pinned: bool,
}

fn catalog() -> Result<Catalog> {
    let mut c = Catalog::default();
    for sql in [
        format!(
            "CREATE STREAM visits (ts TIMESTAMP NOT NULL, ip TEXT NOT NULL, url TEXT) \
             WITH (event_time = 'ts', partition_by = 'ip', partitions = {TASKS})"
        ),
        "CREATE METRIC per_ip AS SELECT ip, COUNT(*) AS connections, MIN(ts) AS first_seen, \
         MAX(ts) AS last_seen FROM visits WINDOW TUMBLING (SIZE 30 SECONDS) GROUP BY ip"
            .to_string(),
    ] {
        let stmt = eddy_planner::sql::parse_statement(&sql)?;
        c = eddy_planner::ddl::apply(&c, &stmt)?.0;
    }
    Ok(c)
}

/// Visits `from..from + events`, 20,000 a second of event time, from `ips` addresses,
/// cut into statements of `per_statement` events, each routed to its tasks.
fn statements(
    stream: &StreamDef,
    from: usize,
    events: usize,
    ips: u64,
    per_statement: usize,
) -> Vec<Vec<TaskBatch>> {
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d ^ from as u64);
    let addresses: Vec<Value> = (0..ips)
        .map(|i| Value::Text(format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255).into()))
        .collect();
    let url = Value::Text("/index.html".into());
    let mut out = Vec::new();
    let mut made = 0;
    while made < events {
        let n = per_statement.min(events - made);
        let mut per_task: Vec<Vec<Row>> = vec![Vec::new(); TASKS as usize];
        for i in from + made..from + made + n {
            let ip = addresses[(rng.next_u64() % ips) as usize].clone();
            let task = partition_for(&ip, stream.partitions) as usize;
            let ts = 1_800_000_000_000_000 + i as i64 * 50;
            per_task[task].push(Row::from(vec![Value::Timestamp(ts), ip, url.clone()]));
        }
        out.push(
            per_task
                .into_iter()
                .enumerate()
                .filter(|(_, rows)| !rows.is_empty())
                .map(|(p, rows)| {
                    let task = TaskId {
                        stream: stream.name.clone(),
                        partitioner: 0,
                        partition: p as u32,
                    };
                    TaskBatch {
                        task,
                        rows,
                        passes: None,
                    }
                })
                .collect(),
        );
        made += n;
    }
    out
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// One configuration, in this process: `{events_per_sec, latency_us: {…}}`.
fn run_one(a: &Args, shards: usize, pinned: bool) -> Result<serde_json::Value> {
    let catalog = Arc::new(catalog()?);
    let stream = Arc::new(catalog.stream("visits").expect("created").clone());
    let pinning = match pinned {
        true => {
            let p = Pinning::load(None, Some(shards)).map_err(anyhow::Error::msg)?;
            // The driver (this thread) goes where the service threads go.
            p.pin_service(false).map_err(anyhow::Error::msg)?;
            Some(Arc::new(p))
        }
        false => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let engine = Arc::new(Engine::start_pinned(
        shards,
        pinning,
        Arc::new(MemoryLog),
        None,
    ));
    runtime.block_on(engine.apply_catalog(catalog.clone()))?;
    let ingest = |batches: Vec<TaskBatch>| {
        let (engine, stream) = (engine.clone(), stream.clone());
        runtime.spawn(async move {
            engine
                .ingest_batches(&stream, batches, false, true)
                .await
                .map(|answers| answers.iter().map(|a| a.len()).sum::<usize>())
        })
    };

    // Throughput: a few statements always queued.
    let work = statements(
        &stream,
        0,
        a.events,
        a.ips,
        THROUGHPUT_BATCH * TASKS as usize,
    );
    let started = Instant::now();
    let mut in_flight = VecDeque::new();
    let mut answered = 0;
    for statement in work {
        in_flight.push_back(ingest(statement));
        if in_flight.len() >= IN_FLIGHT {
            answered += runtime.block_on(in_flight.pop_front().expect("queued"))??;
        }
    }
    for wait in in_flight {
        answered += runtime.block_on(wait)??;
    }
    let seconds = started.elapsed().as_secs_f64();
    if answered != a.events {
        bail!("{answered} of {} events answered", a.events);
    }
    let throughput = a.events as f64 / seconds;

    // What statements of `--batch` events sustain one at a time, for a second...
    let batch = a.batch as usize;
    let work = statements(&stream, a.events, a.events, a.ips, batch);
    let started = Instant::now();
    let mut sustained = 0;
    for statement in work {
        sustained += runtime.block_on(ingest(statement))??;
        if started.elapsed() >= Duration::from_secs(1) {
            break;
        }
    }
    let capacity = sustained as f64 / started.elapsed().as_secs_f64();
    // ...and their latency at half that rate, for two seconds, later in event time.
    let rate = capacity * 0.5;
    let paced = ((rate * 2.0) as usize).max(batch);
    let work = statements(&stream, a.events + sustained, paced, a.ips, batch);
    let interval = Duration::from_secs_f64(a.batch as f64 / rate);
    let mut latencies = Vec::with_capacity(work.len());
    runtime.block_on(async {
        let mut next = Instant::now();
        let mut waits = Vec::with_capacity(work.len());
        for statement in work {
            tokio::time::sleep_until(next.into()).await;
            let sent = next;
            let (engine, stream) = (engine.clone(), stream.clone());
            waits.push(tokio::spawn(async move {
                engine
                    .ingest_batches(&stream, statement, false, true)
                    .await
                    .map(|_| sent.elapsed())
            }));
            next += interval;
        }
        for wait in waits {
            latencies.push(wait.await??.as_micros() as u64);
        }
        anyhow::Ok(())
    })?;
    // Each statement's latency begins when it was due, so a late send counts.
    latencies.sort_unstable();
    drop(runtime);
    if let Ok(engine) = Arc::try_unwrap(engine) {
        engine.shutdown();
    }
    Ok(serde_json::json!({
        "shards": shards,
        "pinned": pinned,
        "events_per_sec": throughput.round(),
        "latency_us": {
            "rate": rate.round(),
            "p50": percentile(&latencies, 0.50),
            "p99": percentile(&latencies, 0.99),
            "p999": percentile(&latencies, 0.999),
            "max": percentile(&latencies, 1.0),
        },
    }))
}

/// Runs one configuration in a child process and reads its JSON.
fn child(a: &Args, shards: usize, pinned: bool) -> Result<serde_json::Value> {
    let exe = std::env::current_exe()?;
    let out = Command::new(exe)
        .args([
            "--events",
            &a.events.to_string(),
            "--ips",
            &a.ips.to_string(),
        ])
        .args(["--batch", &a.batch.to_string()])
        .args(["--one", &shards.to_string()])
        .args(pinned.then_some("--pinned"))
        .output()
        .context("running a configuration")?;
    if !out.status.success() {
        bail!(
            "{shards} shards, pinned {pinned}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    if let Some(shards) = a.one {
        println!(
            "{}",
            serde_json::to_string(&run_one(&a, shards, a.pinned)?)?
        );
        return Ok(());
    }
    let configs = [(1, false), (1, true), (2, false), (2, true)];
    let mut runs: Vec<Vec<serde_json::Value>> = vec![Vec::new(); configs.len()];
    for _ in 0..a.runs {
        for (i, &(shards, pinned)) in configs.iter().enumerate() {
            runs[i].push(child(&a, shards, pinned)?);
        }
    }
    let field = |r: &serde_json::Value, path: &[&str]| {
        path.iter()
            .fold(r, |v, k| &v[*k])
            .as_f64()
            .unwrap_or_default()
    };
    let summary: Vec<serde_json::Value> = configs
        .iter()
        .zip(&runs)
        .map(|(&(shards, pinned), runs)| {
            let m = |path: &[&str]| median(&runs.iter().map(|r| field(r, path)).collect::<Vec<_>>());
            serde_json::json!({
                "shards": shards,
                "pinned": pinned,
                "events_per_sec": m(&["events_per_sec"]),
                "events_per_sec_runs": runs.iter().map(|r| field(r, &["events_per_sec"])).collect::<Vec<_>>(),
                "latency_us": {
                    "rate": m(&["latency_us", "rate"]),
                    "p50": m(&["latency_us", "p50"]),
                    "p99": m(&["latency_us", "p99"]),
                    "p999": m(&["latency_us", "p999"]),
                },
            })
        })
        .collect();
    let rate = |i: usize| summary[i]["events_per_sec"].as_f64().unwrap_or_default();
    let cost =
        |off: usize, on: usize| ((rate(off) - rate(on)) / rate(off) * 100.0 * 10.0).round() / 10.0;
    let scale = |one: usize, two: usize| (rate(two) / rate(one) * 100.0).round() / 100.0;
    let out = serde_json::json!({
        "workload": "HiBench fixed window: COUNT, MIN(ts), MAX(ts) per ip over a 30-second tumbling window, 8 tasks",
        "events": a.events,
        "ips": a.ips,
        "runs": a.runs,
        "configurations": summary,
        "pinning_cost_pct": { "1_shard": cost(0, 1), "2_shards": cost(2, 3) },
        "scaling_1_to_2_shards": { "unpinned": scale(0, 2), "pinned": scale(1, 3) },
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
