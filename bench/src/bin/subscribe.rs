//! Continuous-query benchmark against an in-process server on loopback: the latency from
//! sending an INSERT to a subscriber receiving the metric row it changed, with other
//! subscribers connected; then COPY throughput with and without a subscriber that never
//! reads. Prints one JSON object.
//!
//! Latency is measured from each event's scheduled send time (a fixed rate), so a
//! stalled server cannot hide its queueing (coordinated omission), into an HdrHistogram.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use tokio_postgres::{Client, SimpleQueryMessage};

use eddy_bench::connect;
use eddy_server::serve::{Config, Server};

struct Args {
    rate: u64,
    seconds: u64,
    subscribers: usize,
    shards: usize,
    copy_events: u64,
    /// `card`: each other subscriber watches one card; `all`: every change.
    fanout: String,
}

fn args() -> Result<Args> {
    let mut a = Args {
        rate: 2_000,
        seconds: 10,
        subscribers: 100,
        shards: 2,
        copy_events: 200_000,
        fanout: "card".to_string(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--rate" => a.rate = value.parse()?,
            "--seconds" => a.seconds = value.parse()?,
            "--subscribers" => a.subscribers = value.parse()?,
            "--shards" => a.shards = value.parse()?,
            "--copy-events" => a.copy_events = value.parse()?,
            "--fanout" => a.fanout = value,
            other => bail!(
                "unknown argument {other}; use --rate N --seconds N --subscribers N --shards N --copy-events N --fanout card|all"
            ),
        }
        i += 2;
    }
    Ok(a)
}

const BASE: &str = "2026-01-01 00:00:00";

/// Event `i` happens `i` milliseconds after BASE.
fn ts(i: u64) -> String {
    let base = chrono::NaiveDateTime::parse_from_str(BASE, "%Y-%m-%d %H:%M:%S").unwrap();
    (base + chrono::Duration::milliseconds(i as i64))
        .format("%Y-%m-%d %H:%M:%S%.3f")
        .to_string()
}

fn time_of(i: u64) -> chrono::NaiveDateTime {
    chrono::NaiveDateTime::parse_from_str(BASE, "%Y-%m-%d %H:%M:%S").unwrap()
        + chrono::Duration::milliseconds(i as i64)
}

fn index_of(changed_at: &str) -> Option<u64> {
    let base = chrono::NaiveDateTime::parse_from_str(BASE, "%Y-%m-%d %H:%M:%S").ok()?;
    let t = chrono::NaiveDateTime::parse_from_str(changed_at, "%Y-%m-%d %H:%M:%S%.f").ok()?;
    Some((t - base).num_milliseconds() as u64)
}

async fn create(admin: &Client, stream: &str) -> Result<()> {
    admin
        .batch_execute(&format!(
            "CREATE STREAM {stream} (id BIGINT, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
             amount DOUBLE PRECISION) WITH (event_time = 'ts', event_id = 'id', \
             partition_by = 'card', partitions = 8); \
             CREATE METRIC {stream}_card_5m AS SELECT card, COUNT(*) AS n, SUM(amount) AS total, \
             AVG(amount) AS mean FROM {stream} WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card;"
        ))
        .await?;
    Ok(())
}

async fn latency(server: &Server, a: &Args) -> Result<serde_json::Value> {
    let admin = connect(server).await?;
    create(&admin, "lat").await?;

    // Other subscribers: each receives every change of the metric.
    let mut others = Vec::new();
    let received_by_others = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for i in 0..a.subscribers {
        let c = connect(server).await?;
        let count = received_by_others.clone();
        let sql = if a.fanout == "all" {
            "SELECT * FROM lat_card_5m EMIT CHANGES".to_string()
        } else {
            format!("SELECT * FROM lat_card_5m WHERE card = 'card-{i}' EMIT CHANGES")
        };
        others.push(tokio::spawn(async move {
            let stream = c.simple_query_raw(&sql).await?;
            let mut stream = Box::pin(stream);
            while let Some(m) = stream.next().await {
                if let SimpleQueryMessage::Row(_) = m? {
                    count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            anyhow::Ok(())
        }));
    }

    let probe = connect(server).await?;
    let mut rows = Box::pin(
        probe
            .simple_query_raw("SELECT card, n, changed_at FROM lat_card_5m EMIT CHANGES")
            .await?,
    );
    let total = a.rate * a.seconds;
    let scheduled: Arc<Mutex<HashMap<u64, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let inserter = connect(server).await?;
    let insert = inserter
        .prepare("INSERT INTO lat VALUES ($1, $2, $3, $4)")
        .await?;
    let start = Instant::now() + Duration::from_millis(200);
    let sched = scheduled.clone();
    let rate = a.rate;
    let sender = tokio::spawn(async move {
        let inserter = Arc::new(inserter);
        let mut pending = futures::stream::FuturesUnordered::new();
        for i in 0..total {
            let at = start + Duration::from_nanos(i * 1_000_000_000 / rate);
            tokio::time::sleep_until(at.into()).await;
            sched.lock().unwrap().insert(i, at);
            let c = inserter.clone();
            let stmt = insert.clone();
            let card = format!("card-{}", i % 1000);
            pending.push(async move {
                c.execute(
                    &stmt,
                    &[&(i as i64), &time_of(i), &card, &((i % 500) as f64)],
                )
                .await
            });
            while let Some(Some(r)) = futures::FutureExt::now_or_never(pending.next()) {
                r?;
            }
        }
        while let Some(r) = pending.next().await {
            r?;
        }
        anyhow::Ok(())
    });

    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut seen = 0u64;
    let deadline = start + Duration::from_secs(a.seconds + 30);
    while seen < total {
        let msg = tokio::time::timeout_at(deadline.into(), rows.next()).await;
        let Ok(Some(msg)) = msg else {
            bail!("only {seen} of {total} rows arrived");
        };
        let SimpleQueryMessage::Row(r) = msg? else {
            continue;
        };
        let now = Instant::now();
        let Some(i) = r.get(2).and_then(index_of) else {
            continue;
        };
        let at = scheduled.lock().unwrap().get(&i).copied();
        if let Some(at) = at {
            hist.record(now.saturating_duration_since(at).as_micros().max(1) as u64)?;
            seen += 1;
        }
    }
    sender.await??;
    drop(rows);
    for o in &others {
        o.abort();
    }
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(serde_json::json!({
        "events": total,
        "rate_per_s": a.rate,
        "other_subscribers": a.subscribers,
        "fanout": a.fanout,
        "rows_to_other_subscribers": received_by_others.load(std::sync::atomic::Ordering::Relaxed),
        "latency_ms": {
            "p50": us(0.5), "p99": us(0.99), "p999": us(0.999), "max": hist.max() as f64 / 1000.0,
        },
    }))
}

/// Who watches the metric while COPY runs.
#[derive(Clone, Copy, PartialEq)]
enum Watching {
    Nobody,
    /// A subscriber that reads every row as it comes.
    Reader,
    /// A cursor nobody fetches from.
    Stalled,
}

/// COPY throughput of `events` events with the metric watched as `watching` says.
async fn copy_rate(server: &Server, stream: &str, events: u64, watching: Watching) -> Result<f64> {
    let stalled = watching == Watching::Stalled;
    let admin = connect(server).await?;
    create(&admin, stream).await?;
    let reader = connect(server).await?;
    let mut reading = None;
    if watching == Watching::Reader {
        let rows = reader
            .simple_query_raw(&format!("SELECT * FROM {stream}_card_5m EMIT CHANGES"))
            .await?;
        reading = Some(tokio::spawn(async move {
            let mut rows = Box::pin(rows);
            let mut n = 0u64;
            while let Some(Ok(_)) = rows.next().await {
                n += 1;
            }
            n
        }));
    }
    if stalled {
        reader
            .batch_execute(&format!(
                "BEGIN; DECLARE c CURSOR FOR SELECT * FROM {stream}_card_5m EMIT CHANGES"
            ))
            .await?;
    }
    let mut data = String::with_capacity(events as usize * 48);
    for i in 0..events {
        data.push_str(&format!("{i},{},card-{},{}\n", ts(i), i % 10_000, i % 500));
    }
    let started = Instant::now();
    let sink = admin
        .copy_in(&format!("COPY {stream} FROM STDIN (FORMAT csv)"))
        .await?;
    let mut sink = Box::pin(sink);
    sink.send(bytes::Bytes::from(data)).await?;
    let n = sink.as_mut().finish().await?;
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(r) = reading {
        r.abort();
    }
    if n != events {
        bail!("COPY applied {n} of {events} events");
    }
    if stalled {
        let listed = admin.simple_query("SHOW SUBSCRIPTIONS").await?;
        for m in listed {
            if let SimpleQueryMessage::Row(r) = m {
                if r.get(6) != Some(&format!("{stream}_card_5m")[..]) {
                    continue;
                }
                eprintln!(
                    "stalled subscriber: rows_coalesced {} rows_queued {}",
                    r.get(10).unwrap_or("?"),
                    r.get(11).unwrap_or("?")
                );
            }
        }
        reader.batch_execute("ROLLBACK").await?;
    }
    Ok(events as f64 / elapsed)
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = args()?;
    let dir = std::env::temp_dir().join(format!("eddy-bench-subscribe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let server = Server::start(&Config {
        shards: a.shards,
        ..Config::embedded(dir.clone())
    })
    .await?;
    let lat = latency(&server, &a).await?;
    let free = copy_rate(&server, "free", a.copy_events, Watching::Nobody).await?;
    let read = copy_rate(&server, "read", a.copy_events, Watching::Reader).await?;
    let stalled = copy_rate(&server, "stalled", a.copy_events, Watching::Stalled).await?;
    let out = serde_json::json!({
        "bench": "subscribe",
        "shards": a.shards,
        "latency": lat,
        "copy_events_per_s": {
            "no_subscriber": free.round(),
            "reading_subscriber": read.round(),
            "stalled_subscriber": stalled.round(),
        },
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
