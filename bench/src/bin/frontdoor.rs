//! The front door over loopback: what one client gets from an in-process server through
//! the PostgreSQL protocol (tokio-postgres, prepared statements). Prints one JSON object.
//!
//! - `single_on` / `single_off`: one event per round trip, `INSERT … RETURNING *`, with
//!   `synchronous_commit` on (fsync per statement, group commit) and off;
//! - `single_on_polling` / `single_off_polling`: the same from a client that polls its
//!   socket between statements instead of sleeping (its runtime keeps yielding), so the
//!   server's answer needs no wake-up: what the server gives a latency-tuned client;
//! - `batch_on` / `batch_off`: multi-row `INSERT … RETURNING *` of `--batch` rows per
//!   statement, with `synchronous_commit` on and off;
//! - `copy`: `COPY … FROM STDIN` of `--copy-rows` rows;
//! - `lookup`: prepared point lookups of a metric's group (`WHERE card = $1`).
//!
//! Latencies are per statement, in an HdrHistogram. `cpu_us_per_event` is the CPU time
//! of the whole process (server and client, every thread) per event, from
//! `/proc/self/stat`: steadier than a rate on a noisy machine, where another tenant's load
//! stretches the wall time more than the work.

use std::time::{Duration, Instant};

use anyhow::Result;
use futures::SinkExt;
use hdrhistogram::Histogram;
use tokio_postgres::Client;

use eddy_server::serve::{default_io_threads, Config, Server};

/// The allocator of the `eddy` binary, so the in-process server runs as it would there.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(clap::Parser)]
struct Args {
    /// Seconds each timed mode runs.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Distinct cards (groups of the metric).
    #[arg(long, default_value_t = 100_000)]
    cards: u64,
    /// Rows per multi-row INSERT.
    #[arg(long, default_value_t = 1_000)]
    batch: usize,
    /// Rows of the COPY.
    #[arg(long, default_value_t = 500_000)]
    copy_rows: u64,
    #[arg(long, default_value_t = 2)]
    shards: usize,
    /// Threads of the server's runtime (default: as `eddy serve`, one per core).
    #[arg(long, env = "EDDY_IO_THREADS")]
    io_threads: Option<usize>,
    /// Microseconds the server's session threads poll after answering (as `eddy serve
    /// --busy-poll`; 0: they sleep at once).
    #[arg(long, env = "EDDY_BUSY_POLL", default_value_t = eddy_server::wire::busy::DEFAULT_US)]
    busy_poll: u64,
    /// The server's `--commit-delay`, in milliseconds.
    #[arg(long, default_value_t = eddy_server::serve::COMMIT_DELAY_MS)]
    commit_delay: u64,
    /// Run one mode: single_on, single_off, single_on_polling, single_off_polling
    /// (the client polls its socket between statements instead of sleeping, as a
    /// latency-tuned client does), batch_on, batch_off, copy or lookup.
    #[arg(long)]
    only: Option<String>,
}

/// Event `i`: one millisecond apart, cards spread by a multiplicative hash.
fn event(i: u64, cards: u64) -> (i64, chrono::NaiveDateTime, String, f64) {
    let base = chrono::DateTime::from_timestamp(1_800_000_000, 0)
        .expect("time")
        .naive_utc();
    (
        i as i64,
        base + chrono::Duration::milliseconds(i as i64),
        format!("c{}", i.wrapping_mul(2_654_435_761) % cards),
        (i % 1000) as f64 / 10.0,
    )
}

/// When a mode started, on the wall clock and in the process's CPU time.
struct Started {
    wall: Instant,
    cpu: Duration,
}

impl Started {
    fn now() -> Started {
        Started {
            wall: Instant::now(),
            cpu: process_cpu(),
        }
    }

    fn seconds(&self) -> f64 {
        self.wall.elapsed().as_secs_f64()
    }
}

/// User and system time of every thread of this process so far.
fn process_cpu() -> Duration {
    // Fields 14 and 15 of /proc/self/stat, in clock ticks (100 per second on Linux);
    // the command name (field 2) may hold spaces, so count from the closing parenthesis.
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

fn summary(name: &str, events: u64, started: &Started, h: &Histogram<u64>) -> serde_json::Value {
    let elapsed = started.wall.elapsed();
    let cpu = process_cpu().saturating_sub(started.cpu);
    let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    serde_json::json!({
        "mode": name,
        "events": events,
        "seconds": (elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
        "events_per_sec": (events as f64 / elapsed.as_secs_f64()).round(),
        "cpu_us_per_event": (cpu.as_secs_f64() * 1e7 / events.max(1) as f64).round() / 10.0,
        "statements": h.len(),
        "p50_ms": q(0.5), "p90_ms": q(0.9), "p99_ms": q(0.99), "p999_ms": q(0.999), "max_ms": h.max() as f64 / 1000.0,
    })
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram")
}

fn single_mode(sync: &str, polling: bool) -> String {
    format!("single_{sync}{}", if polling { "_polling" } else { "" })
}

async fn single(
    client: &Client,
    a: &Args,
    next: &mut u64,
    sync: &str,
    polling: bool,
) -> Result<serde_json::Value> {
    client
        .batch_execute(&format!("SET synchronous_commit = {sync}"))
        .await?;
    let stmt = client
        .prepare("INSERT INTO pay VALUES ($1, $2, $3, $4) RETURNING *")
        .await?;
    let mut h = histogram();
    let started = Started::now();
    let mut n = 0;
    // A client that polls keeps its runtime awake: the server's answer wakes nobody.
    let poller = polling.then(|| {
        tokio::spawn(async {
            loop {
                tokio::task::yield_now().await;
            }
        })
    });
    while started.seconds() < a.seconds {
        let (id, ts, card, amount) = event(*next, a.cards);
        *next += 1;
        let t = Instant::now();
        client.query_one(&stmt, &[&id, &ts, &card, &amount]).await?;
        h.record(t.elapsed().as_micros().max(1) as u64)?;
        n += 1;
    }
    if let Some(poller) = poller {
        poller.abort();
    }
    client.batch_execute("SET synchronous_commit = on").await?;
    Ok(summary(&single_mode(sync, polling), n, &started, &h))
}

async fn batch(client: &Client, a: &Args, next: &mut u64, sync: &str) -> Result<serde_json::Value> {
    client
        .batch_execute(&format!("SET synchronous_commit = {sync}"))
        .await?;
    let values: Vec<String> = (0..a.batch)
        .map(|i| {
            format!(
                "(${}, ${}, ${}, ${})",
                4 * i + 1,
                4 * i + 2,
                4 * i + 3,
                4 * i + 4
            )
        })
        .collect();
    let stmt = client
        .prepare(&format!(
            "INSERT INTO pay VALUES {} RETURNING *",
            values.join(", ")
        ))
        .await?;
    let mut h = histogram();
    let started = Started::now();
    let mut n = 0;
    while started.seconds() < a.seconds {
        let events: Vec<_> = (0..a.batch as u64)
            .map(|i| event(*next + i, a.cards))
            .collect();
        *next += a.batch as u64;
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = Vec::new();
        for (id, ts, card, amount) in &events {
            params.push(id);
            params.push(ts);
            params.push(card);
            params.push(amount);
        }
        let t = Instant::now();
        let rows = client.query(&stmt, &params).await?;
        h.record(t.elapsed().as_micros().max(1) as u64)?;
        anyhow::ensure!(
            rows.len() == a.batch,
            "a batch returned {} rows",
            rows.len()
        );
        n += a.batch as u64;
    }
    client.batch_execute("SET synchronous_commit = on").await?;
    Ok(summary(&format!("batch_{sync}"), n, &started, &h))
}

async fn copy(client: &Client, a: &Args, next: &mut u64) -> Result<serde_json::Value> {
    let mut text = String::with_capacity(a.copy_rows as usize * 48);
    for i in 0..a.copy_rows {
        let (id, ts, card, amount) = event(*next + i, a.cards);
        text.push_str(&format!(
            "{id}\t{}\t{card}\t{amount}\n",
            ts.format("%Y-%m-%d %H:%M:%S%.3f")
        ));
    }
    *next += a.copy_rows;
    let started = Started::now();
    let sink = client.copy_in("COPY pay FROM STDIN").await?;
    futures::pin_mut!(sink);
    for chunk in text.as_bytes().chunks(64 * 1024) {
        sink.send(bytes::Bytes::copy_from_slice(chunk)).await?;
    }
    let n = sink.finish().await?;
    let mut h = histogram();
    h.record(started.wall.elapsed().as_micros().max(1) as u64)?;
    Ok(summary("copy", n, &started, &h))
}

async fn lookup(client: &Client, a: &Args) -> Result<serde_json::Value> {
    let stmt = client
        .prepare("SELECT n, total FROM card_5m WHERE card = $1")
        .await?;
    let mut h = histogram();
    let started = Started::now();
    let mut n = 0u64;
    let mut found = 0u64;
    while started.seconds() < a.seconds {
        let card = format!("c{}", n.wrapping_mul(40_503) % a.cards);
        let t = Instant::now();
        found += client.query(&stmt, &[&card]).await?.len() as u64;
        h.record(t.elapsed().as_micros().max(1) as u64)?;
        n += 1;
    }
    anyhow::ensure!(found > 0, "no lookup found its group");
    Ok(summary("lookup", n, &started, &h))
}

fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    // The server runs on its own runtime, as in `eddy serve`; the client is one thread with
    // its connection on it, as a psycopg or JDBC client process would be, so the figures
    // carry no thread hop inside the client.
    let server_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.io_threads.unwrap_or_else(default_io_threads).max(1))
        .enable_all()
        .build()?;
    let dir = std::env::temp_dir().join(format!("eddy-bench-frontdoor-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let server = server_runtime.block_on(Server::start(&Config {
        shards: a.shards,
        commit_delay: Duration::from_millis(a.commit_delay),
        session_threads: a.io_threads.unwrap_or_else(default_io_threads).max(1),
        busy_poll: Duration::from_micros(a.busy_poll),
        ..Config::embedded(dir.clone())
    }))?;
    let client_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let results = client_runtime.block_on(async {
        let client = eddy_bench::connect(&server).await?;
        client
            .batch_execute(
                "CREATE STREAM pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
                 amount DOUBLE PRECISION) WITH (event_time = 'ts', event_id = 'id', \
                 partition_by = 'card', partitions = 4); \
                 CREATE METRIC card_5m AS SELECT card, COUNT(*) AS n, SUM(amount) AS total, \
                 AVG(amount) AS mean FROM pay WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card",
            )
            .await?;
        let mut next = 0u64;
        let mut results = Vec::new();
        let wants = |m: &str| a.only.as_deref().is_none_or(|o| o == m);
        for polling in [false, true] {
            for sync in ["on", "off"] {
                if wants(&single_mode(sync, polling)) {
                    results.push(single(&client, &a, &mut next, sync, polling).await?);
                }
            }
        }
        for sync in ["on", "off"] {
            if wants(&format!("batch_{sync}")) {
                results.push(batch(&client, &a, &mut next, sync).await?);
            }
        }
        if wants("copy") {
            results.push(copy(&client, &a, &mut next).await?);
        }
        if wants("lookup") {
            if next == 0 {
                copy(&client, &a, &mut next).await?;
            }
            results.push(lookup(&client, &a).await?);
        }
        anyhow::Ok(results)
    })?;
    drop(client_runtime);
    server_runtime.block_on(server.stop());
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({ "frontdoor": results }))?
    );
    Ok(())
}
