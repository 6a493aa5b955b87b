//! Storage benchmarks, in-process, on the disk-backed default (reservoir chunks on disk,
//! group state in RocksDB behind the L1/L2 cache). Prints one JSON object.
//!
//! - `--mode memory --window '5 minutes'|'7 days'`: one task, `--events` events spread
//!   over 30 days of event time, COUNT/SUM/AVG per card over the SLIDING window: events/s
//!   and peak RSS (run each window in its own process and compare).
//! - `--mode checkpoint --l1 N --l2 N`: `--cards` hot keys, each updated, then the
//!   synchronous stage of a checkpoint (seed 001: one layer vs two layers).
//! - `--mode reservoir`: bytes per event on disk, compression ratio, and sequential read
//!   throughput of the sealed chunks.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use eddy_bench::XorShift;
use eddy_cluster::exec::checkpoint::Checkpoint;
use eddy_cluster::exec::events::EventCodec;
use eddy_cluster::exec::groups::CacheConfig;
use eddy_cluster::{Engine, MemoryLog, NodeStorage, Row, StorageConfig, Task, TaskId};
use eddy_planner::catalog::Catalog;
use eddy_planner::ddl;
use eddy_planner::sql::parse_statement;
use eddy_planner::types::Value;
use eddy_storage::{DiskReservoir, Reservoir, ReservoirConfig};

const DAY_US: i64 = 86_400_000_000;

/// Eddy's allocator, as in the server.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    mode: String,
    events: u64,
    cards: u64,
    window: String,
    days: i64,
    l1: usize,
    l2: usize,
    batch: usize,
    dir: std::path::PathBuf,
}

fn args() -> Result<Args> {
    let mut a = Args {
        mode: "memory".into(),
        events: 10_000_000,
        cards: 10_000,
        window: "5 minutes".into(),
        days: 30,
        l1: CacheConfig::default().l1_entries,
        l2: CacheConfig::default().l2_entries,
        batch: 1024,
        dir: std::env::temp_dir().join(format!("eddy-bench-storage-{}", std::process::id())),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--mode" => a.mode = v,
            "--events" => a.events = v.parse()?,
            "--cards" => a.cards = v.parse()?,
            "--window" => a.window = v,
            "--days" => a.days = v.parse()?,
            "--l1" => a.l1 = v.parse()?,
            "--l2" => a.l2 = v.parse()?,
            "--batch" => a.batch = v.parse()?,
            "--dir" => a.dir = v.into(),
            other => bail!(
                "unknown argument {other}; use --mode memory|checkpoint|reservoir --events N \
                 --cards N --window '5 minutes' --days N --l1 N --l2 N --batch N --dir PATH"
            ),
        }
        i += 2;
    }
    Ok(a)
}

/// Deterministic payments: `events` spread evenly over `days` of event time.
struct Events {
    rng: XorShift,
    next_id: i64,
    step_us: i64,
    cards: Vec<Value>,
    round_robin: bool,
}

impl Events {
    fn new(cards: u64, events: u64, days: i64, round_robin: bool) -> Events {
        Events {
            rng: XorShift(0x2545_f491_4f6c_dd1d),
            next_id: 0,
            step_us: (days * DAY_US / events.max(1) as i64).max(1),
            cards: (0..cards)
                .map(|c| Value::Text(format!("card-{c:08}").into()))
                .collect(),
            round_robin,
        }
    }

    fn rand(&mut self) -> u64 {
        self.rng.next_u64()
    }

    fn next(&mut self) -> Row {
        let id = self.next_id;
        self.next_id += 1;
        let pick = if self.round_robin {
            id as usize % self.cards.len()
        } else {
            (self.rand() % self.cards.len() as u64) as usize
        };
        let amount = (self.rand() % 100_000) as f64 / 100.0;
        Row::from(vec![
            Value::Int(id),
            Value::Timestamp(1_800_000_000_000_000 + id * self.step_us),
            self.cards[pick].clone(),
            Value::Float(amount),
        ])
    }
}

fn catalog(window: &str) -> Result<Catalog> {
    let mut c = Catalog::default();
    for sql in [
        "CREATE STREAM payments (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
         amount DOUBLE PRECISION) WITH (event_time = 'ts', event_id = 'id', \
         lateness = '1 second', retention = '1 minute')"
            .to_string(),
        format!(
            "CREATE METRIC by_card AS SELECT card, COUNT(*) AS n, SUM(amount) AS total, \
             AVG(amount) AS mean FROM payments WINDOW SLIDING (SIZE {window}) GROUP BY card"
        ),
    ] {
        c = ddl::apply(&c, &parse_statement(&sql)?)?.0;
    }
    Ok(c)
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn storage(a: &Args) -> Result<NodeStorage> {
    let _ = std::fs::remove_dir_all(&a.dir);
    Ok(NodeStorage::open(
        &a.dir,
        StorageConfig {
            reservoir: ReservoirConfig::default(),
            cache: CacheConfig {
                l1_entries: a.l1,
                l2_entries: a.l2,
            },
            ..Default::default()
        },
    )?)
}

fn task_id() -> TaskId {
    TaskId {
        stream: "payments".into(),
        partitioner: 0,
        partition: 0,
    }
}

/// One task on disk fed `events` in batches; returns the task and the busy seconds.
fn feed(a: &Args, node: &NodeStorage, window: &str, round_robin: bool) -> Result<(Task, f64)> {
    let c = catalog(window)?;
    let stream = c.stream("payments").expect("created").clone();
    let mut task = Task::open(stream, 0, node.task_storage(&task_id(), 0), None)?;
    task.set_metrics(&c.metrics_of("payments"))?;
    let mut gen = Events::new(a.cards, a.events, a.days, round_robin);
    let started = Instant::now();
    let mut sent = 0;
    while sent < a.events {
        let n = (a.events - sent).min(a.batch as u64);
        let rows: Vec<Row> = (0..n).map(|_| gen.next()).collect();
        task.ingest(&rows, false)?;
        sent += n;
    }
    Ok((task, started.elapsed().as_secs_f64()))
}

fn memory(a: &Args) -> Result<serde_json::Value> {
    let node = storage(a)?;
    let (task, secs) = feed(a, &node, &a.window, false)?;
    let r = task.reservoir_stats();
    Ok(serde_json::json!({
        "mode": "memory",
        "window": a.window,
        "events": a.events,
        "event_time_days": a.days,
        "cards": a.cards,
        "events_per_sec": (a.events as f64 / secs).round(),
        "peak_rss_mb": peak_rss_mb(),
        "stored_events": r.events,
        "chunks": r.chunks,
        "reservoir_disk_mb": r.disk_bytes as f64 / 1e6,
        "chunk_cache_hits": r.cache_hits,
        "chunk_cache_misses": r.cache_misses,
        "chunks_prefetched": r.prefetched,
    }))
}

fn checkpoint(a: &Args) -> Result<serde_json::Value> {
    let node = Arc::new(storage(a)?);
    let c = Arc::new(catalog("1 hour")?);
    let stream = c.stream("payments").expect("created").clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let engine = Engine::start(1, Arc::new(MemoryLog), Some(node.clone()));
    runtime.block_on(engine.apply_catalog(c.clone()))?;
    // Every key once per round: all hot keys are dirty at each checkpoint.
    let mut gen = Events::new(a.cards, a.events, a.days, true);
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let mut sent = 0;
        while sent < a.cards {
            let n = (a.cards - sent).min(a.batch as u64);
            let rows: Vec<Row> = (0..n).map(|_| gen.next()).collect();
            runtime.block_on(engine.ingest(&stream, rows, false, true))?;
            sent += n;
        }
        let ingest = started.elapsed().as_secs_f64();
        let (sync, total) = runtime.block_on(engine.checkpoint())?;
        rounds.push(serde_json::json!({
            "events_per_sec": (a.cards as f64 / ingest).round(),
            "checkpoint_sync_ms": sync.as_secs_f64() * 1e3,
            "checkpoint_total_ms": total.as_secs_f64() * 1e3,
        }));
    }
    let report = runtime.block_on(engine.report())?;
    engine.shutdown();
    let cache = report[0].cache;
    Ok(serde_json::json!({
        "mode": "checkpoint",
        "hot_keys": a.cards,
        "l1_entries": a.l1,
        "l2_entries": a.l2,
        "rounds": rounds,
        "l1_hits": cache.l1_hits,
        "l2_hits": cache.l2_hits,
        "store_reads": cache.misses,
        "store_writes": cache.writes,
        "peak_rss_mb": peak_rss_mb(),
    }))
}

fn reservoir(a: &Args) -> Result<serde_json::Value> {
    let node = storage(a)?;
    let (mut task, secs) = feed(a, &node, "7 days", false)?;
    let stats = task.reservoir_stats();
    let cp = task.checkpoint(true)?.expect("a task on disk").finish()?;
    let stream = task.stream().clone();
    let codec = Arc::new(EventCodec::new(stream, Vec::new()));
    drop(task);
    let mark = Checkpoint::decode(&cp).expect("a checkpoint").reservoir;
    let dir = node.task_storage(&task_id(), 0).dir;
    let mut r = DiskReservoir::open(
        &dir,
        ReservoirConfig::default(),
        codec,
        Some(node.io.clone()),
        Some(&mark),
    )?;
    let started = Instant::now();
    let mut n = 0u64;
    r.for_range(i64::MIN, i64::MAX, &mut |_| n += 1)?;
    let read = started.elapsed().as_secs_f64();
    let read_stats = r.stats();
    Ok(serde_json::json!({
        "mode": "reservoir",
        "events": a.events,
        "ingest_events_per_sec": (a.events as f64 / secs).round(),
        "sealed_chunks": stats.chunks,
        "disk_bytes": stats.disk_bytes,
        "live_events": stats.events,
        "bytes_per_event_on_disk": stats.chunk_bytes as f64 / (stats.events.max(1) as f64),
        "raw_arrow_bytes_per_event": stats.raw_bytes as f64 / (stats.events.max(1) as f64),
        "compression_ratio": stats.raw_bytes as f64 / stats.chunk_bytes.max(1) as f64,
        "sequential_read_events": n,
        "sequential_read_events_per_sec": (n as f64 / read).round(),
        "read_cache_misses": read_stats.cache_misses,
        "read_prefetched": read_stats.prefetched,
    }))
}

fn main() -> Result<()> {
    let a = args()?;
    let out = match a.mode.as_str() {
        "memory" => memory(&a)?,
        "checkpoint" => checkpoint(&a)?,
        "reservoir" => reservoir(&a)?,
        other => bail!("unknown mode {other}"),
    };
    let _ = std::fs::remove_dir_all(&a.dir);
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
