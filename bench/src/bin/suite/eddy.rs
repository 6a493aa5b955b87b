//! Eddy's side of the scoring comparison: a real `eddy serve` process (its binary from the
//! suite's binary directory) on loopback, a stream and a 5-minute sliding metric per run,
//! and `INSERT … RETURNING metric.n, metric.total, metric.mean` from tokio-postgres, one
//! event per round trip or many rows per statement, with `synchronous_commit` on or off.

use std::collections::hash_map::{Entry, HashMap};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::runtime::Runtime;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use super::procs::{self, Server};
use super::workload::{Answer, Event, Expected, ScoreRun, Tally};
use super::{progress, Plan};

/// `eddy serve` on free loopback ports with its data under `work`.
pub fn start(bin_dir: &Path, work: &Path, runtime: &Runtime) -> Result<(Server, Client, String)> {
    let (pg, http) = (procs::free_port()?, procs::free_port()?);
    let mut cmd = Command::new(bin_dir.join("eddy"));
    cmd.arg("serve")
        .args(["--pg-addr", &format!("127.0.0.1:{pg}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .arg("--data-dir")
        .arg(work.join("eddy-data"))
        .args(["--shards", "2"]);
    // Only the flags above configure it, whatever EDDY_* the caller exported.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("EDDY_") {
            cmd.env_remove(key);
        }
    }
    let line = procs::command_line(&cmd);
    let mut server = Server::spawn("eddy", &mut cmd, work.join("eddy.log"), "TERM")?;
    let dsn = format!("host=127.0.0.1 port={pg} user=eddy dbname=eddy");
    let client = procs::wait_ready(&mut server, Duration::from_secs(60), || {
        runtime.block_on(connect(&dsn))
    })?;
    Ok((server, client, line))
}

/// A client of `dsn`, its connection driven on the runtime.
pub async fn connect(dsn: &str) -> Result<Client> {
    let (client, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to {dsn}"))?;
    tokio::spawn(conn);
    Ok(client)
}

/// Every Eddy run of the plan: one event per round trip and batched, each with
/// `synchronous_commit` off and on.
pub fn run_all(
    client: &Client,
    runtime: &Runtime,
    plan: &Plan,
    events: &[Event],
    expected: &[Expected],
) -> Result<Vec<ScoreRun>> {
    let mut runs = Vec::new();
    for (batch, sync) in [
        (1, "off"),
        (1, "on"),
        (plan.batch, "off"),
        (plan.batch, "on"),
    ] {
        let wanted = if batch == 1 {
            plan.single_events
        } else {
            plan.batch_events
        };
        let run = runtime
            .block_on(run_one(
                client,
                plan,
                &events[..wanted],
                expected,
                batch,
                sync,
            ))
            .with_context(|| {
                format!("Eddy, {batch} events per statement, synchronous_commit={sync}")
            })?;
        runs.push(run);
    }
    Ok(runs)
}

/// A fresh stream and metric for one run: its answers depend on no other run's events.
async fn create(client: &Client, name: &str) -> Result<()> {
    client
        .batch_execute(&format!(
            "DROP STREAM IF EXISTS {name} CASCADE; \
             CREATE STREAM {name} (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
             amount DOUBLE PRECISION) WITH (event_time = 'ts', event_id = 'id', \
             partition_by = 'card', partitions = 4); \
             CREATE METRIC {name}_card AS SELECT card, COUNT(*) AS n, SUM(amount) AS total, \
             AVG(amount) AS mean FROM {name} WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card"
        ))
        .await
        .with_context(|| format!("creating stream {name}"))
}

/// The multi-row INSERT of `rows` events into stream `name`, prepared.
async fn prepare(client: &Client, name: &str, rows: usize) -> Result<Statement> {
    let values: Vec<String> = (0..rows)
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
    let sql = format!(
        "INSERT INTO {name} VALUES {} RETURNING {name}_card.n, {name}_card.total, {name}_card.mean",
        values.join(", ")
    );
    Ok(client.prepare(&sql).await?)
}

async fn run_one(
    client: &Client,
    plan: &Plan,
    events: &[Event],
    expected: &[Expected],
    batch: usize,
    sync: &str,
) -> Result<ScoreRun> {
    let name = format!("sc_b{batch}_{sync}");
    create(client, &name).await?;
    client
        .batch_execute(&format!("SET synchronous_commit = {sync}"))
        .await?;
    let form = if batch == 1 { "single" } else { "batch" };
    let bar = progress::bar(events.len() as u64, &format!("Eddy {form} sync={sync}"));
    let mut statements: HashMap<usize, Statement> = HashMap::new();
    let mut tally = Tally::new()?;
    for chunk in events.chunks(batch) {
        if tally.elapsed() > plan.step_cap {
            break;
        }
        let stmt = match statements.entry(chunk.len()) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(prepare(client, &name, chunk.len()).await?),
        };
        let params = Params::of(chunk);
        let refs = params.refs();
        let t = std::time::Instant::now();
        let rows = client.query(&*stmt, &refs).await?;
        let took = t.elapsed();
        let answers = Answer::of_rows(&rows, chunk.len())?;
        tally.record(took, &answers, expected)?;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    client.batch_execute("SET synchronous_commit = on").await?;
    client
        .batch_execute(&format!("DROP STREAM IF EXISTS {name} CASCADE"))
        .await?;
    Ok(ScoreRun::new(
        "Eddy",
        form,
        &format!("synchronous_commit={sync}"),
        batch,
        &tally,
        events.len(),
    ))
}

/// Owned parameters of a chunk of events, four per event.
struct Params {
    ids: Vec<i64>,
    ts: Vec<chrono::NaiveDateTime>,
    cards: Vec<String>,
    amounts: Vec<f64>,
}

impl Params {
    fn of(chunk: &[Event]) -> Params {
        Params {
            ids: chunk.iter().map(|e| e.id).collect(),
            ts: chunk.iter().map(Event::ts).collect(),
            cards: chunk.iter().map(|e| e.card.clone()).collect(),
            amounts: chunk.iter().map(Event::amount).collect(),
        }
    }

    /// The parameters as tokio-postgres takes them, in VALUES order.
    fn refs(&self) -> Vec<&(dyn ToSql + Sync)> {
        let mut out: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(self.ids.len() * 4);
        for i in 0..self.ids.len() {
            out.push(&self.ids[i]);
            out.push(&self.ts[i]);
            out.push(&self.cards[i]);
            out.push(&self.amounts[i]);
        }
        out
    }
}
