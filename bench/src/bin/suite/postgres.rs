//! PostgreSQL 15's side of the scoring comparison: a throwaway cluster (Debian's
//! `postgresql-15`) in a temporary directory on a free loopback port, stopped by PID.
//! One event per round trip calls an SQL function that inserts the event and reads its
//! card's window (an index on (card, ts)); the batched form calls a PL/pgSQL function
//! with arrays of events, one transaction per batch, that does the same per event.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::runtime::Runtime;
use tokio_postgres::Client;

use super::eddy::connect;
use super::procs::{self, Server};
use super::workload::{Answer, Event, Expected, ScoreRun, Tally};
use super::{progress, Plan};

/// Where Debian's postgresql-15 puts the server's binaries.
pub const BIN: &str = "/usr/lib/postgresql/15/bin";

const SCHEMA: &str = "
CREATE TABLE sc_pay (id BIGINT PRIMARY KEY, ts TIMESTAMP NOT NULL, card TEXT NOT NULL,
                     amount DOUBLE PRECISION);
CREATE INDEX ON sc_pay (card, ts);
CREATE FUNCTION sc_score(i BIGINT, t TIMESTAMP, c TEXT, a DOUBLE PRECISION)
RETURNS TABLE (n BIGINT, total DOUBLE PRECISION, mean DOUBLE PRECISION) LANGUAGE sql AS $$
  INSERT INTO sc_pay VALUES (i, t, c, a);
  SELECT count(*), sum(amount), avg(amount) FROM sc_pay
  WHERE card = c AND ts > t - INTERVAL '5 minutes' AND ts <= t
$$;
CREATE FUNCTION sc_score_batch(ids BIGINT[], tss TIMESTAMP[], cs TEXT[], amts DOUBLE PRECISION[])
RETURNS TABLE (n BIGINT, total DOUBLE PRECISION, mean DOUBLE PRECISION) LANGUAGE plpgsql AS $$
BEGIN
  FOR k IN 1 .. cardinality(ids) LOOP
    INSERT INTO sc_pay VALUES (ids[k], tss[k], cs[k], amts[k]);
    RETURN QUERY SELECT count(*), sum(p.amount), avg(p.amount) FROM sc_pay p
      WHERE p.card = cs[k] AND p.ts > tss[k] - INTERVAL '5 minutes' AND p.ts <= tss[k];
  END LOOP;
END
$$;
";

/// `program` of the PostgreSQL binaries, run as the `postgres` user when we are root
/// (PostgreSQL refuses to run as root).
fn pg_command(program: &str) -> Command {
    let path = Path::new(BIN).join(program);
    if procs::is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(path);
        cmd
    } else {
        Command::new(path)
    }
}

/// A data directory the server's user owns, under `work`.
fn data_dir(work: &Path) -> Result<PathBuf> {
    let dir = work.join("pg");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    if procs::is_root() {
        procs::run_quiet(Command::new("chown").arg("postgres").arg(&dir))?;
    }
    Ok(dir)
}

/// A fresh cluster on a free loopback port, the schema created.
pub fn start(work: &Path, runtime: &Runtime) -> Result<(Server, Client, String)> {
    let dir = data_dir(work)?;
    procs::run_quiet(
        pg_command("initdb")
            .arg("-D")
            .arg(&dir)
            .args(["-A", "trust", "-U", "postgres", "-N", "-E", "UTF8"]),
    )
    .context("initdb")?;
    let port = procs::free_port()?;
    let log = dir.join("server.log");
    let mut ctl = pg_command("pg_ctl");
    ctl.arg("-D")
        .arg(&dir)
        .arg("-l")
        .arg(&log)
        .args(["-w", "-t", "60", "-o"])
        .arg(format!(
            "-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={}",
            dir.display()
        ))
        .arg("start");
    let line = procs::command_line(&ctl);
    procs::run_quiet(&mut ctl).context("pg_ctl start")?;
    let pid_file = dir.join("postmaster.pid");
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .with_context(|| format!("reading {}", pid_file.display()))?
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .parse()
        .with_context(|| format!("the PID in {}", pid_file.display()))?;
    // SIGINT: PostgreSQL's fast shutdown.
    let mut server = Server::adopt("postgres", pid, log, "INT");
    let dsn = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres");
    let client = procs::wait_ready(&mut server, Duration::from_secs(30), || {
        runtime.block_on(connect(&dsn))
    })?;
    runtime
        .block_on(client.batch_execute(SCHEMA))
        .context("creating the scoring schema in PostgreSQL")?;
    Ok((server, client, line))
}

/// Every PostgreSQL run of the plan: one event per round trip and batched, each with
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
                format!("PostgreSQL, {batch} events per statement, synchronous_commit={sync}")
            })?;
        runs.push(run);
    }
    Ok(runs)
}

async fn run_one(
    client: &Client,
    plan: &Plan,
    events: &[Event],
    expected: &[Expected],
    batch: usize,
    sync: &str,
) -> Result<ScoreRun> {
    client
        .batch_execute(&format!("TRUNCATE sc_pay; SET synchronous_commit = {sync}"))
        .await?;
    let form = if batch == 1 { "single" } else { "batch" };
    let stmt = if batch == 1 {
        client
            .prepare("SELECT n, total, mean FROM sc_score($1, $2, $3, $4)")
            .await?
    } else {
        client
            .prepare("SELECT n, total, mean FROM sc_score_batch($1, $2, $3, $4)")
            .await?
    };
    let bar = progress::bar(
        events.len() as u64,
        &format!("PostgreSQL {form} sync={sync}"),
    );
    let mut tally = Tally::new()?;
    for chunk in events.chunks(batch) {
        if tally.elapsed() > plan.step_cap {
            break;
        }
        let ids: Vec<i64> = chunk.iter().map(|e| e.id).collect();
        let ts: Vec<chrono::NaiveDateTime> = chunk.iter().map(Event::ts).collect();
        let cards: Vec<String> = chunk.iter().map(|e| e.card.clone()).collect();
        let amounts: Vec<f64> = chunk.iter().map(Event::amount).collect();
        let t = std::time::Instant::now();
        let rows = if batch == 1 {
            client
                .query(&stmt, &[&ids[0], &ts[0], &cards[0], &amounts[0]])
                .await?
        } else {
            client.query(&stmt, &[&ids, &ts, &cards, &amounts]).await?
        };
        let took = t.elapsed();
        let answers = Answer::of_rows(&rows, chunk.len())?;
        tally.record(took, &answers, expected)?;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    client.batch_execute("SET synchronous_commit = on").await?;
    Ok(ScoreRun::new(
        "PostgreSQL 15",
        form,
        &format!("synchronous_commit={sync}"),
        batch,
        &tally,
        events.len(),
    ))
}
