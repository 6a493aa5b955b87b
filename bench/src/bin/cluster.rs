//! A real cluster on loopback: `eddy serve --kafka` processes, one per host id, two copies
//! of every task. Prints one JSON object.
//!
//! `--mode takeover` (three nodes): one client scores events one per round trip
//! (`INSERT … RETURNING`) through node n1, and node n2 is killed with SIGKILL partway:
//! - `takeover_ms`: from the kill to the first reply for a task n2 held active;
//! - the latency of every statement across the run (p50 … max), and how many failed.
//!
//! `--mode throughput --nodes N`: three clients per node insert 100-row statements through
//! every node for `--after` seconds; events acknowledged per second.
//!
//! `--mode recovery --mb M`: one node holds one task with about M MB of reservoir and
//! state (7-day window, events loaded by COPY, checkpointed). A fresh node joins and
//! gets the task's checkpoint from it over gRPC, then the rest of the partition; then
//! that node leaves and another fresh node joins with peer recovery off
//! (`EDDY_PEER_RECOVERY=off`) and replays the partition from offset 0. Each is timed
//! from its start to its copy having caught up with the partition's end.
//!
//! Needs a broker: `--kafka ADDR`, or `EDDY_TEST_KAFKA`, or it starts one with
//! `.ci/kafka start` (and stops it).
//!
//! `cargo run --release -p eddy-bench --bin cluster -- --bin-dir target/release --mode takeover`

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;

use eddy_cluster::route::partition_for;
use eddy_planner::types::Value;

#[derive(clap::Parser)]
struct Args {
    /// `takeover` or `throughput`.
    #[arg(long, default_value = "takeover")]
    mode: String,
    /// Nodes, for `throughput`.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Where the `eddy` binary is.
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    /// Kafka bootstrap address (default: `EDDY_TEST_KAFKA`, else a broker of its own).
    #[arg(long)]
    kafka: Option<String>,
    /// Seconds of load before the kill, and after it.
    #[arg(long, default_value_t = 5.0)]
    before: f64,
    #[arg(long, default_value_t = 15.0)]
    after: f64,
    /// Megabytes of reservoir to load, for `recovery`.
    #[arg(long, default_value_t = 200)]
    mb: u64,
    /// Session timeout of the nodes, in seconds.
    #[arg(long, default_value_t = 6.0)]
    session_timeout: f64,
}

/// A process stopped with SIGKILL when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a node and returns it with its PostgreSQL port, once it listens.
fn node(
    a: &Args,
    kafka: &str,
    cluster: &str,
    id: &str,
    dir: &std::path::Path,
) -> Result<(Proc, u16)> {
    node_env(a, kafka, cluster, id, dir, &[])
}

/// `node` with more environment variables.
fn node_env(
    a: &Args,
    kafka: &str,
    cluster: &str,
    id: &str,
    dir: &std::path::Path,
    env: &[(&str, &str)],
) -> Result<(Proc, u16)> {
    let mut child = Command::new(a.bin_dir.join("eddy"))
        .envs(env.iter().copied())
        .args([
            "serve",
            "--pg-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--shards",
            "1",
        ])
        .arg("--data-dir")
        .arg(dir)
        .args([
            "--kafka",
            kafka,
            "--cluster",
            cluster,
            "--node-id",
            id,
            "--replicas",
            "2",
        ])
        .args(["--host-id", &format!("host-{id}")])
        .args(["--session-timeout", &a.session_timeout.to_string()])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", a.bin_dir.join("eddy").display()))?;
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let port = loop {
        let Some(Ok(line)) = lines.next() else {
            bail!("node {id} exited before it listened");
        };
        if let Some(rest) = line.split("listening on 127.0.0.1:").nth(1) {
            break rest.split_whitespace().next().unwrap_or("").parse()?;
        }
    };
    std::thread::spawn(move || for _ in lines.map_while(Result::ok) {});
    Ok((Proc(child), port))
}

async fn connect(port: u16) -> Result<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={port} user=eddy dbname=eddy"),
        tokio_postgres::NoTls,
    )
    .await?;
    tokio::spawn(conn);
    Ok(client)
}

async fn rows(client: &tokio_postgres::Client, sql: &str) -> Result<Vec<Vec<String>>> {
    Ok(client
        .simple_query(sql)
        .await?
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("").to_string())
                    .collect(),
            ),
            _ => None,
        })
        .collect())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let a: Args = clap::Parser::parse();
    let work = std::env::temp_dir().join(format!("eddy-takeover-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let mut own_broker = None;
    let kafka = match a
        .kafka
        .clone()
        .or_else(|| std::env::var("EDDY_TEST_KAFKA").ok())
    {
        Some(k) => k,
        None => {
            let dir = work.join("kafka");
            let out = Command::new(".ci/kafka").arg("start").arg(&dir).output()?;
            if !out.status.success() {
                bail!("starting Kafka: {}", String::from_utf8_lossy(&out.stderr));
            }
            own_broker = Some(dir);
            String::from_utf8(out.stdout)?.trim().to_string()
        }
    };
    let result = run(&a, &kafka, &work).await;
    if let Some(dir) = own_broker {
        let _ = Command::new(".ci/kafka").arg("stop").arg(&dir).status();
    }
    let _ = std::fs::remove_dir_all(&work);
    println!("{}", serde_json::to_string_pretty(&result?)?);
    Ok(())
}

async fn run(a: &Args, kafka: &str, work: &std::path::Path) -> Result<serde_json::Value> {
    match a.mode.as_str() {
        "takeover" => takeover(a, kafka, work).await,
        "throughput" => throughput(a, kafka, work).await,
        "recovery" => recovery(a, kafka, work).await,
        other => bail!("unknown --mode {other}: takeover, throughput or recovery"),
    }
}

/// Starts `count` nodes (n1, n2, …, each its own host), creates the stream (with
/// `partitions` tasks) and its metric through n1, and returns once every node is alive,
/// every task has its copies, and every node has learned the catalog.
async fn start_cluster(
    a: &Args,
    kafka: &str,
    work: &std::path::Path,
    name: &str,
    count: usize,
    partitions: u32,
) -> Result<(Vec<(Proc, u16)>, tokio_postgres::Client)> {
    let cluster = format!("{name}{}", std::process::id());
    let mut nodes = Vec::new();
    for n in 1..=count {
        let id = format!("n{n}");
        nodes.push(node(a, kafka, &cluster, &id, &work.join(&id))?);
    }
    let client = connect(nodes[0].1).await?;
    client
        .batch_execute(&format!(
            "CREATE STREAM pay (ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount BIGINT) \
             WITH (event_time = 'ts', partition_by = 'card', partitions = {partitions}); \
             CREATE METRIC spend AS SELECT card, COUNT(*) AS n, SUM(amount) AS s FROM pay \
             WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card;"
        ))
        .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let alive = rows(&client, "SHOW CLUSTER").await?;
        let tasks = rows(&client, "SHOW TASKS").await?;
        let live = alive.iter().filter(|r| r[4] == "t").count();
        let on: BTreeSet<&str> = tasks.iter().map(|r| r[3].as_str()).collect();
        let copies = count == 1 || tasks.iter().all(|r| !r[4].is_empty());
        if live == count && on.len() == count && copies {
            break;
        }
        if Instant::now() > deadline {
            bail!("the cluster did not settle: {alive:?} {tasks:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every node has learned the DDL (within moments, from the catalog topic).
    for (_, port) in &nodes {
        let c = connect(*port).await?;
        while rows(&c, "SHOW METRICS").await?.is_empty() {
            if Instant::now() > deadline {
                bail!("a node did not learn the catalog");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok((nodes, client))
}

async fn throughput(a: &Args, kafka: &str, work: &std::path::Path) -> Result<serde_json::Value> {
    let (nodes, _client) = start_cluster(a, kafka, work, "throughput", a.nodes, 12).await?;
    let run_for = Duration::from_secs_f64(a.after);
    let mut writers = Vec::new();
    for (w, (_, port)) in nodes
        .iter()
        .flat_map(|n| std::iter::repeat_n(n, 3))
        .enumerate()
    {
        let port = *port;
        writers.push(tokio::spawn(async move {
            let client = connect(port).await?;
            let started = Instant::now();
            let mut events = 0u64;
            while started.elapsed() < run_for {
                let now = chrono::Utc::now()
                    .naive_utc()
                    .format("%Y-%m-%d %H:%M:%S%.3f");
                let values: Vec<String> = (0..100)
                    .map(|i| {
                        format!(
                            "('{now}', 'c{}', 1)",
                            (w as u64 * 7919 + events + i) % 10_000
                        )
                    })
                    .collect();
                client
                    .batch_execute(&format!("INSERT INTO pay VALUES {}", values.join(",")))
                    .await?;
                events += 100;
            }
            anyhow::Ok((events, started.elapsed()))
        }));
    }
    let (mut events, mut longest) = (0u64, Duration::ZERO);
    for w in writers {
        let (n, took) = w.await??;
        events += n;
        longest = longest.max(took);
    }
    Ok(serde_json::json!({
        "mode": "throughput",
        "nodes": a.nodes,
        "clients": a.nodes * 3,
        "rows_per_statement": 100,
        "events": events,
        "events_per_sec": (events as f64 / longest.as_secs_f64()).round(),
    }))
}

async fn takeover(a: &Args, kafka: &str, work: &std::path::Path) -> Result<serde_json::Value> {
    let (mut nodes, client) = start_cluster(a, kafka, work, "takeover", 3, 6).await?;
    let n2_tasks: BTreeSet<u32> = rows(&client, "SHOW TASKS")
        .await?
        .iter()
        .filter(|r| r[3] == "n2")
        .map(|r| r[2].parse().unwrap_or(0))
        .collect();
    let insert = client
        .prepare("INSERT INTO pay VALUES ($1, $2, $3) RETURNING spend.n")
        .await?;
    let mut h = Histogram::<u64>::new_with_bounds(1, 120_000_000, 3)?;
    let (mut failed, mut i) = (0u64, 0u64);
    let started = Instant::now();
    let mut killed: Option<Instant> = None;
    let mut takeover: Option<Duration> = None;
    let end = Duration::from_secs_f64(a.before + a.after);
    while started.elapsed() < end || (killed.is_some() && takeover.is_none()) {
        if killed.is_none() && started.elapsed() >= Duration::from_secs_f64(a.before) {
            let n2 = &mut nodes[1].0 .0;
            n2.kill()?;
            let _ = n2.wait();
            killed = Some(Instant::now());
        }
        if started.elapsed() > end + Duration::from_secs(120) {
            bail!("no reply from n2's tasks within 120 s of the kill");
        }
        let card = format!("c{}", i % 600);
        i += 1;
        let on_n2 = n2_tasks.contains(&partition_for(&Value::Text(card.as_str().into()), 6));
        let t = Instant::now();
        let now = chrono::Utc::now().naive_utc();
        match client.query(&insert, &[&now, &card, &1i64]).await {
            Ok(_) => {
                h.record(t.elapsed().as_micros().max(1) as u64)?;
                if let (Some(k), None, true) = (killed, takeover, on_n2) {
                    if t >= k {
                        takeover = Some(k.elapsed());
                    }
                }
            }
            Err(_) => failed += 1,
        }
    }
    let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    Ok(serde_json::json!({
        "mode": "takeover",
        "nodes": 3,
        "replicas": 2,
        "session_timeout_s": a.session_timeout,
        "takeover_ms": takeover.map(|d| d.as_millis() as u64),
        "statements": h.len(),
        "failed": failed,
        "p50_ms": q(0.5), "p99_ms": q(0.99), "p999_ms": q(0.999), "max_ms": h.max() as f64 / 1000.0,
    }))
}

/// Bytes of files under `dir`.
fn du(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => du(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Waits until node `port` holds a copy of the one task and has applied its whole
/// partition (`SHOW TASKS`: offset known, lag 0).
async fn caught_up(port: u16, id: &str, started: Instant) -> Result<Duration> {
    let deadline = started + Duration::from_secs(3600);
    loop {
        if let Ok(c) = connect(port).await {
            if let Ok(tasks) = rows(&c, "SHOW TASKS").await {
                let holds = tasks.iter().any(|r| {
                    (r[3] == id || r[4].split(',').any(|x| x == id))
                        && r[6] == "0"
                        && !r[5].is_empty()
                });
                if holds {
                    return Ok(started.elapsed());
                }
            }
        }
        if Instant::now() > deadline {
            bail!("{id} did not catch up");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn recovery(a: &Args, kafka: &str, work: &std::path::Path) -> Result<serde_json::Value> {
    let cluster = format!("recovery{}", std::process::id());
    let fast = [("EDDY_CHECKPOINT_INTERVAL", "2")];
    let n1 = node_env(a, kafka, &cluster, "n1", &work.join("n1"), &fast)?;
    let client = connect(n1.1).await?;
    client
        .batch_execute(
            "CREATE STREAM big (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
             amount BIGINT, note TEXT) WITH (event_time = 'ts', event_id = 'id', \
             partition_by = 'card', partitions = 1); \
             CREATE METRIC week AS SELECT card, COUNT(*) AS n, SUM(amount) AS s, \
             COUNT(DISTINCT amount) AS d FROM big WINDOW SLIDING (SIZE 7 DAYS) GROUP BY card;",
        )
        .await?;
    // Load by COPY until the node's reservoir holds the asked size.
    let target = a.mb << 20;
    let reservoir = work.join("n1").join("reservoir");
    let (mut next, load_started) = (0u64, Instant::now());
    let base = chrono::NaiveDate::from_ymd_opt(2026, 11, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .context("a date")?;
    let mut noise = 0x9E37_79B9_7F4A_7C15u64;
    while du(&reservoir) < target {
        let mut text = String::with_capacity(64 << 20);
        for _ in 0..200_000 {
            let ts = base + chrono::Duration::milliseconds((next * 3) as i64);
            let mut note = String::with_capacity(96);
            for _ in 0..6 {
                noise ^= noise << 13;
                noise ^= noise >> 7;
                noise ^= noise << 17;
                note.push_str(&format!("{noise:016x}"));
            }
            text.push_str(&format!(
                "{next}\t{}\tc{}\t{}\t{note}\n",
                ts.format("%Y-%m-%d %H:%M:%S%.3f"),
                next % 100_000,
                next % 1000
            ));
            next += 1;
        }
        let sink = client.copy_in("COPY big FROM STDIN").await?;
        futures::pin_mut!(sink);
        for chunk in text.as_bytes().chunks(256 * 1024) {
            futures::SinkExt::send(&mut sink, bytes::Bytes::copy_from_slice(chunk)).await?;
        }
        sink.finish().await?;
    }
    let load_s = load_started.elapsed().as_secs_f64();
    // A checkpoint covers the load (every 2 s).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let reservoir_bytes = du(&reservoir);
    let state_bytes = du(&work.join("n1").join("state"));

    // A fresh node recovers the task from n1's checkpoint.
    let started = Instant::now();
    let n2 = node_env(a, kafka, &cluster, "n2", &work.join("n2"), &fast)?;
    let by_peer = caught_up(n2.1, "n2", started).await?;
    drop(n2);
    // n2 leaves (its session expires); a fresh node with peer recovery off replays.
    tokio::time::sleep(Duration::from_secs_f64(a.session_timeout + 3.0)).await;
    let started = Instant::now();
    let off = [
        ("EDDY_CHECKPOINT_INTERVAL", "2"),
        ("EDDY_PEER_RECOVERY", "off"),
    ];
    let n3 = node_env(a, kafka, &cluster, "n3", &work.join("n3"), &off)?;
    let by_replay = caught_up(n3.1, "n3", started).await?;
    drop(n3);
    drop(n1);
    Ok(serde_json::json!({
        "mode": "recovery",
        "events": next,
        "load_s": load_s,
        "reservoir_mb": reservoir_bytes as f64 / 1048576.0,
        "state_mb": state_bytes as f64 / 1048576.0,
        "peer_recovery_s": by_peer.as_secs_f64(),
        "replay_s": by_replay.as_secs_f64(),
        "speedup": by_replay.as_secs_f64() / by_peer.as_secs_f64(),
    }))
}
