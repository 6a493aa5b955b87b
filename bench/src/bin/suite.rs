//! `make bench`: every benchmark of Eddy in one run, with reports one can trust.
//!
//! ```text
//! cargo run --release -p eddy-bench --bin suite -- [--quick] [--out DIR] [--bin-dir DIR]
//! ```
//!
//! 1. Builds the release binaries (`cargo build --release -p eddy-bench -p eddy-server`)
//!    unless `--bin-dir` names a directory that has them (`engine`, `frontdoor`, `eddy`).
//! 2. Runs `engine --mode task` against the window length (1 minute … 1 day) and the
//!    number of keys (10k, 100k, 1M), `storage --mode memory` (the disk reservoir) against
//!    the window length (5 minutes … 30 days over 30 days of events), and `frontdoor` (single_on, single_off, batch_on, batch_off,
//!    copy, lookup), each as a subprocess with a time cap, and parses their JSON; then the
//!    percentiles (MEDIAN, PERCENTILE_CONT(0.99)) at 100k keys, `hopping`, the share of
//!    hopping results that differ from the exact sliding window, and `placement`, HiBench's
//!    fixed window on 1 and 2 shards, pinned and not.
//! 3. Runs one per-event scoring workload (COUNT/SUM/AVG of the card's last 5 minutes,
//!    the event included) side by side on a real `eddy serve`, PostgreSQL 15 and Redis 7
//!    (Debian packages, installed when missing), each started on free loopback ports in a
//!    temporary directory and stopped by PID. Every answer is checked against an exact
//!    reference computed here.
//! 4. Runs `floor`: the machine's own floor, a clock-reading loop's longest gap and a
//!    loopback echo's round trips (blocking, polling, and with an fdatasync per message),
//!    so the figures above can be read against what no server on this host can beat.
//! 5. Writes `results.json`, `results.md` and SVG plots to `--out` (default
//!    `bench/results/`).
//!
//! `--quick` runs everything with tiny sizes (well under 2 minutes on 2 cores) and only
//! checks that every step produced sane figures: non-zero throughput, exact answers. Any
//! failed step or check makes the suite exit non-zero, after writing the reports.

#[path = "suite/eddy.rs"]
mod eddy;
#[path = "suite/plots.rs"]
mod plots;
#[path = "suite/postgres.rs"]
mod postgres;
#[path = "suite/procs.rs"]
mod procs;
#[path = "suite/progress.rs"]
mod progress;
#[path = "suite/redis.rs"]
mod redis;
#[path = "suite/report.rs"]
mod report;
#[path = "suite/workload.rs"]
mod workload;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use report::{EngineRun, FrontdoorRun, Results, Step, StorageRun};
use workload::{Percentiles, Workload};

#[derive(clap::Parser)]
#[command(about = "Runs every Eddy benchmark and writes results.json, results.md and SVG plots")]
struct Args {
    /// Tiny sizes: every step in well under 2 minutes, figures checked for sanity only.
    #[arg(long)]
    quick: bool,
    /// Where the reports go.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results"))]
    out: PathBuf,
    /// Take `engine`, `frontdoor` and `eddy` from DIR (e.g. "$CARGO_TARGET_DIR/debug")
    /// instead of building the release binaries first.
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,
}

/// Events per second of event time in the engine runs.
const ENGINE_RATE: u64 = 10_000;

/// The sizes of one run of the suite.
pub struct Plan {
    pub engine_events: u64,
    /// Keys of the runs against the window length.
    pub window_keys: u64,
    pub windows: Vec<&'static str>,
    /// Keys of the runs against the number of keys (5-minute window).
    pub keys: Vec<u64>,
    /// Events and keys of the disk reservoir's runs against the window length.
    pub storage_events: u64,
    pub storage_keys: u64,
    pub engine_cap: Duration,
    pub frontdoor_args: Vec<String>,
    pub frontdoor_cap: Duration,
    pub workload: Workload,
    /// Events of the one-event-per-round-trip runs.
    pub single_events: usize,
    /// Events of the batched and pipelined runs.
    pub batch_events: usize,
    /// Events per batch.
    pub batch: usize,
    /// The time cap of each scoring run (it stops early, its answers still checked).
    pub step_cap: Duration,
    /// Seconds of each of `floor`'s probes.
    pub floor_seconds: f64,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        let windows = vec!["1 minute", "5 minutes", "1 hour", "1 day"];
        let keys = vec![10_000, 100_000, 1_000_000];
        let frontdoor = |args: &[&str]| args.iter().map(|s| s.to_string()).collect();
        if quick {
            Plan {
                engine_events: 20_000,
                window_keys: 100_000,
                windows,
                keys,
                storage_events: 50_000,
                storage_keys: 1_000,
                engine_cap: Duration::from_secs(60),
                frontdoor_args: frontdoor(&[
                    "--seconds",
                    "0.3",
                    "--cards",
                    "1000",
                    "--batch",
                    "100",
                    "--copy-rows",
                    "10000",
                ]),
                frontdoor_cap: Duration::from_secs(60),
                // 800 events 500 ms apart span 400 s: windows fill and slide.
                workload: Workload {
                    cards: 20,
                    step_ms: 500,
                    events: 2_000,
                },
                single_events: 800,
                batch_events: 2_000,
                batch: 100,
                step_cap: Duration::from_secs(15),
                floor_seconds: 0.3,
            }
        } else {
            Plan {
                engine_events: 10_000_000,
                window_keys: 100_000,
                windows,
                keys,
                storage_events: 5_000_000,
                storage_keys: 100_000,
                engine_cap: Duration::from_secs(300),
                frontdoor_args: frontdoor(&["--seconds", "10"]),
                frontdoor_cap: Duration::from_secs(300),
                // 50 000 events 20 ms apart span 1 000 s; 15 000 events per 5 minutes.
                workload: Workload {
                    cards: 1_000,
                    step_ms: 20,
                    events: 500_000,
                },
                single_events: 50_000,
                batch_events: 500_000,
                batch: 100,
                step_cap: Duration::from_secs(60),
                floor_seconds: 10.0,
            }
        }
    }
}

/// The workspace's root (the parent of this crate).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Builds the release binaries the suite runs; returns their directory.
fn build_release(logs: &Path, results: &mut Results) -> Result<PathBuf> {
    let root = workspace_root();
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "eddy-bench",
        "-p",
        "eddy-server",
    ]);
    results.commands.push(Step {
        step: "build".to_string(),
        command: procs::command_line(&cmd),
    });
    let log = logs.join("cargo-build.log");
    let file =
        std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    cmd.stdout(file.try_clone()?).stderr(file);
    let spinner = progress::spinner("cargo build --release -p eddy-bench -p eddy-server");
    let status = cmd.status().context("running cargo build")?;
    spinner.finish_and_clear();
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        bail!("cargo build failed ({status}): {}", procs::tail(&text, 30));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_relative() { root.join(t) } else { t })
        .unwrap_or_else(|| root.join("target"));
    Ok(target.join("release"))
}

/// Fails unless `dir` has every binary the suite runs.
fn check_binaries(dir: &Path) -> Result<()> {
    for name in [
        "engine",
        "frontdoor",
        "eddy",
        "hopping",
        "placement",
        "floor",
        "storage",
    ] {
        let path = dir.join(name);
        if !path.is_file() {
            bail!(
                "{} is missing: build it (cargo build [--release] -p eddy-bench -p eddy-server) or pass --bin-dir",
                path.display()
            );
        }
    }
    Ok(())
}

fn f64_at(v: &Value, key: &str) -> Result<f64> {
    v.get(key)
        .and_then(Value::as_f64)
        .with_context(|| format!("no number `{key}` in {v}"))
}

/// The figures of one `engine --mode task` run.
fn engine_run(
    plan: &Plan,
    bin_dir: &Path,
    logs: &Path,
    window: &str,
    keys: u64,
    aggs: &str,
) -> Result<EngineRun> {
    let mut cmd = Command::new(bin_dir.join("engine"));
    cmd.args([
        "--mode",
        "task",
        "--events",
        &plan.engine_events.to_string(),
    ])
    .args(["--cards", &keys.to_string(), "--window", window])
    .args(["--rate", &ENGINE_RATE.to_string(), "--aggs", aggs]);
    let command = procs::command_line(&cmd);
    let name = format!("engine-{}-{keys}-{aggs}", window.replace(' ', ""));
    let v = procs::run_json(&mut cmd, &name, plan.engine_cap, logs)?;
    let lat = v.get("latency_us").context("no latency_us")?;
    let run = EngineRun {
        window: window.to_string(),
        keys,
        events: f64_at(&v, "events")? as u64,
        events_per_sec_per_shard: f64_at(&v, "events_per_sec_per_shard")?,
        latency_us: Percentiles {
            p50: f64_at(lat, "p50")?,
            p90: f64_at(lat, "p90")?,
            p99: f64_at(lat, "p99")?,
            p999: f64_at(lat, "p999")?,
            max: f64_at(lat, "max")?,
        },
        stored_events: f64_at(&v, "stored_events")? as u64,
        event_time_seconds: plan.engine_events as f64 / ENGINE_RATE as f64,
        wall_seconds: f64_at(&v, "wall_seconds")?,
        command,
    };
    eprintln!(
        "engine, window {window}, {} keys: {:.0} events/s per shard, p99 {} µs",
        report::keys_label(keys),
        run.events_per_sec_per_shard,
        run.latency_us.p99
    );
    Ok(run)
}

/// Engine throughput against the window length, then against the number of keys (a run
/// both sweeps share is run once).
fn engine_sweeps(plan: &Plan, bin_dir: &Path, logs: &Path, results: &mut Results) {
    let mut done: HashMap<(String, u64), EngineRun> = HashMap::new();
    let mut run = |window: &str, keys: u64, results: &mut Results| -> Option<EngineRun> {
        if let Some(r) = done.get(&(window.to_string(), keys)) {
            return Some(r.clone());
        }
        match engine_run(plan, bin_dir, logs, window, keys, "basic") {
            Ok(r) => {
                results.commands.push(Step {
                    step: format!("engine, window {window}, {} keys", report::keys_label(keys)),
                    command: r.command.clone(),
                });
                done.insert((window.to_string(), keys), r.clone());
                Some(r)
            }
            Err(e) => {
                results
                    .failures
                    .push(format!("engine, window {window}, {keys} keys: {e:#}"));
                None
            }
        }
    };
    for window in &plan.windows {
        if let Some(r) = run(window, plan.window_keys, results) {
            results.engine_windows.push(r);
        }
    }
    for &keys in &plan.keys {
        if let Some(r) = run("5 minutes", keys, results) {
            results.engine_keys.push(r);
        }
    }
    // MEDIAN and PERCENTILE_CONT(0.99) per card, 5 minutes, 100k keys.
    match engine_run(
        plan,
        bin_dir,
        logs,
        "5 minutes",
        plan.window_keys,
        "percentiles",
    ) {
        Ok(r) => {
            results.commands.push(Step {
                step: "engine, percentiles, window 5 minutes".to_string(),
                command: r.command.clone(),
            });
            results.engine_percentiles = Some(r);
        }
        Err(e) => results.failures.push(format!("engine, percentiles: {e:#}")),
    }
}

/// Windows of the disk reservoir's runs, over 30 days of event time.
const STORAGE_WINDOWS: [&str; 5] = ["5 minutes", "1 hour", "1 day", "7 days", "30 days"];
const STORAGE_DAYS: u64 = 30;

/// The disk reservoir against the window length (`storage --mode memory`), each window
/// in a process of its own so that peak RSS is its own.
fn storage_windows(plan: &Plan, bin_dir: &Path, logs: &Path, results: &mut Results) {
    for window in STORAGE_WINDOWS {
        let mut cmd = Command::new(bin_dir.join("storage"));
        cmd.args(["--mode", "memory", "--window", window])
            .args(["--events", &plan.storage_events.to_string()])
            .args(["--cards", &plan.storage_keys.to_string()])
            .args(["--days", &STORAGE_DAYS.to_string()]);
        let command = procs::command_line(&cmd);
        let name = format!("storage-{}", window.replace(' ', ""));
        let run = procs::run_json(&mut cmd, &name, plan.engine_cap, logs).and_then(|v| {
            Ok(StorageRun {
                window: window.to_string(),
                keys: plan.storage_keys,
                events: f64_at(&v, "events")? as u64,
                event_time_days: STORAGE_DAYS,
                events_per_sec: f64_at(&v, "events_per_sec")?,
                peak_rss_mb: f64_at(&v, "peak_rss_mb")?,
                stored_events: f64_at(&v, "stored_events")? as u64,
                chunks: f64_at(&v, "chunks")? as u64,
                command: command.clone(),
            })
        });
        match run {
            Ok(r) => {
                eprintln!(
                    "storage, window {window}: {:.0} events/s, peak RSS {:.0} MB",
                    r.events_per_sec, r.peak_rss_mb
                );
                results.commands.push(Step {
                    step: format!("disk reservoir, window {window}"),
                    command,
                });
                results.storage_windows.push(r);
            }
            Err(e) => results
                .failures
                .push(format!("storage, window {window}: {e:#}")),
        }
    }
}

/// Hopping windows against the exact sliding window (`hopping`), as raw JSON.
fn hopping(plan: &Plan, bin_dir: &Path, logs: &Path, results: &mut Results) -> Result<()> {
    let mut cmd = Command::new(bin_dir.join("hopping"));
    let events = if plan.engine_events < 1_000_000 {
        20_000
    } else {
        200_000
    };
    cmd.args(["--events", &events.to_string()]);
    let step = "hopping windows against the exact sliding window";
    results.hopping = Some(json_step(
        results,
        step,
        "hopping",
        &mut cmd,
        plan.engine_cap,
        logs,
    )?);
    Ok(())
}

/// Runs one benchmark that prints its report as JSON (`procs::run_json`, its logs named
/// `name`), its command line recorded for the reports under `step`.
fn json_step(
    results: &mut Results,
    step: &str,
    name: &str,
    cmd: &mut Command,
    cap: Duration,
    logs: &Path,
) -> Result<Value> {
    results.commands.push(Step {
        step: step.to_string(),
        command: procs::command_line(cmd),
    });
    procs::run_json(cmd, name, cap, logs)
}

/// Whether `report[list]` has exactly `n` objects whose `field` is a positive number.
fn positive_figures(report: &Value, list: &str, field: &str, n: usize) -> bool {
    let figures: Vec<f64> = report[list]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o[field].as_f64())
        .collect();
    figures.len() == n && figures.iter().all(|f| *f > 0.0)
}

/// HiBench's fixed window on 1 and 2 shards, pinned and not (`placement`), as raw JSON.
fn placement(plan: &Plan, bin_dir: &Path, logs: &Path, results: &mut Results) -> Result<()> {
    let mut cmd = Command::new(bin_dir.join("placement"));
    match plan.engine_events < 1_000_000 {
        true => cmd.args(["--events", "20000", "--ips", "1000", "--runs", "1"]),
        false => cmd.args(["--events", "2000000", "--runs", "5"]),
    };
    let step = "placement: HiBench fixed window, 1 and 2 shards, pinned and not";
    let report = json_step(
        results,
        step,
        "placement",
        &mut cmd,
        plan.engine_cap * 4,
        logs,
    )?;
    if !positive_figures(&report, "configurations", "events_per_sec", 4) {
        bail!("placement gave no throughput: {report}");
    }
    results.placement = Some(report);
    Ok(())
}

/// Point-in-time reads (`bench/history.sh`): a metric's history streamed to a COPY
/// client over 1 day and over 30 days of stored events, and AS OF lookups, as raw JSON.
fn history(plan: &Plan, bin_dir: &Path, logs: &Path, results: &mut Results) -> Result<()> {
    let mut cmd = Command::new("bash");
    cmd.arg(workspace_root().join("bench/history.sh"))
        .env("EDDY_BIN", bin_dir.join("eddy"));
    match plan.engine_events < 1_000_000 {
        true => cmd.args(["100000", "10000", "30", "50"]),
        false => cmd.args(["5000000", "100000", "30", "300"]),
    };
    let step = "history: history() to COPY over 1 and 30 days, AS OF lookups";
    let report = json_step(
        results,
        step,
        "history",
        &mut cmd,
        plan.engine_cap * 4,
        logs,
    )?;
    results.history = Some(report);
    Ok(())
}

/// The machine's floor (`floor`), as raw JSON.
fn floor(plan: &Plan, bin_dir: &Path, logs: &Path, results: &mut Results) -> Result<()> {
    let mut cmd = Command::new(bin_dir.join("floor"));
    cmd.args(["--seconds", &plan.floor_seconds.to_string()]);
    let step = "floor: clock gaps and loopback round trips of this machine";
    let report = json_step(results, step, "floor", &mut cmd, plan.frontdoor_cap, logs)?;
    if !positive_figures(&report, "floor", "round_trips_per_sec", 3) {
        bail!("floor gave no round trips: {report}");
    }
    results.floor = Some(report);
    Ok(())
}

/// The front door's modes, from one `frontdoor` run.
fn frontdoor(plan: &Plan, bin_dir: &Path, logs: &Path, results: &mut Results) -> Result<()> {
    let mut cmd = Command::new(bin_dir.join("frontdoor"));
    cmd.args(&plan.frontdoor_args);
    let v = json_step(
        results,
        "frontdoor",
        "frontdoor",
        &mut cmd,
        plan.frontdoor_cap,
        logs,
    )?;
    let modes = v
        .get("frontdoor")
        .and_then(Value::as_array)
        .context("no `frontdoor` array")?;
    for m in modes {
        let run = FrontdoorRun {
            mode: m
                .get("mode")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string(),
            events: f64_at(m, "events")? as u64,
            statements: f64_at(m, "statements")? as u64,
            seconds: f64_at(m, "seconds")?,
            events_per_sec: f64_at(m, "events_per_sec")?,
            latency_ms: Percentiles {
                p50: f64_at(m, "p50_ms")?,
                p90: f64_at(m, "p90_ms")?,
                p99: f64_at(m, "p99_ms")?,
                p999: f64_at(m, "p999_ms")?,
                max: f64_at(m, "max_ms")?,
            },
        };
        eprintln!(
            "frontdoor {}: {:.0} events/s, p99 {} ms",
            run.mode, run.events_per_sec, run.latency_ms.p99
        );
        results.frontdoor.push(run);
    }
    Ok(())
}

/// Prints one finished scoring run.
fn report_runs(runs: &[workload::ScoreRun]) {
    for r in runs {
        eprintln!(
            "{}: {} events, {:.0} events/s, p99 {} ms, {}",
            r.label(),
            r.events,
            r.events_per_sec,
            r.latency_ms.p99,
            if r.exact {
                "exact".to_string()
            } else {
                format!("{} mismatches", r.mismatches)
            }
        );
    }
}

/// The scoring workload on Eddy, PostgreSQL 15 and Redis 7, each in its own failure scope.
fn scoring(plan: &Plan, bin_dir: &Path, work: &Path, results: &mut Results) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let spinner = progress::spinner("computing the exact reference");
    let events = workload::events(&plan.workload);
    let expected = workload::reference(&events, plan.workload.cards);
    spinner.finish_and_clear();
    results.scoring_workload = Some(plan.workload.clone());

    let eddy = (|| -> Result<_> {
        let (mut server, client, line) = eddy::start(bin_dir, work, &runtime)?;
        let runs = eddy::run_all(&client, &runtime, plan, &events, &expected);
        drop(client);
        server.stop();
        Ok((runs?, line))
    })();
    record(results, "scoring, Eddy", eddy);

    let redis_bin =
        procs::which("redis-server").unwrap_or_else(|| PathBuf::from("/usr/bin/redis-server"));
    let pg_bin = Path::new(postgres::BIN).join("postgres");
    procs::ensure_packages(&[("postgresql-15", &pg_bin), ("redis-server", &redis_bin)])?;

    let pg = (|| -> Result<_> {
        let (mut server, client, line) = postgres::start(work, &runtime)?;
        let runs = postgres::run_all(&client, &runtime, plan, &events, &expected);
        drop(client);
        server.stop();
        Ok((runs?, line))
    })();
    record(results, "scoring, PostgreSQL 15", pg);

    let redis = (|| -> Result<_> {
        let (mut server, mut conn, line) = redis::start(work)?;
        let runs = redis::run_all(&mut conn, plan, &events, &expected);
        drop(conn);
        server.stop();
        Ok((runs?, line))
    })();
    record(results, "scoring, Redis 7", redis);
    Ok(())
}

/// Keeps one system's runs and server command line, or its failure.
fn record(results: &mut Results, step: &str, outcome: Result<(Vec<workload::ScoreRun>, String)>) {
    match outcome {
        Ok((runs, line)) => {
            report_runs(&runs);
            results.commands.push(Step {
                step: step.to_string(),
                command: line,
            });
            results.scoring.extend(runs);
        }
        Err(e) => results.failures.push(format!("{step}: {e:#}")),
    }
}

/// What makes the figures of a run untrustworthy: a missing step, a zero throughput, an
/// inexact answer. Speed is not judged.
fn sanity(plan: &Plan, r: &Results) -> Vec<String> {
    let mut bad = Vec::new();
    if r.engine_windows.len() != plan.windows.len() || r.engine_keys.len() != plan.keys.len() {
        bad.push("some engine runs are missing".to_string());
    }
    for e in r.engine_windows.iter().chain(&r.engine_keys) {
        if e.events_per_sec_per_shard <= 0.0 || e.events == 0 || e.stored_events == 0 {
            bad.push(format!(
                "engine, window {}, {} keys: no throughput",
                e.window, e.keys
            ));
        }
    }
    for mode in [
        "single_on",
        "single_off",
        "batch_on",
        "batch_off",
        "copy",
        "lookup",
    ] {
        match r.frontdoor.iter().find(|f| f.mode == mode) {
            None => bad.push(format!("frontdoor {mode} is missing")),
            Some(f) if f.events == 0 || f.events_per_sec <= 0.0 => {
                bad.push(format!("frontdoor {mode}: no throughput"))
            }
            Some(_) => {}
        }
    }
    for system in ["Eddy", "PostgreSQL 15", "Redis 7"] {
        if !r.scoring.iter().any(|s| s.system == system) {
            bad.push(format!("no scoring run of {system}"));
        }
    }
    for s in &r.scoring {
        if s.events == 0 || s.events_per_sec <= 0.0 {
            bad.push(format!("{}: no throughput", s.label()));
        }
        if !s.exact {
            bad.push(format!(
                "{}: {} answers of {} are not exact (first: {})",
                s.label(),
                s.mismatches,
                s.events,
                s.first_mismatch.as_deref().unwrap_or("none answered")
            ));
        }
    }
    bad
}

/// The first line of `git rev-parse --short HEAD`, if git answers.
fn git_revision() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(workspace_root())
        .output()
        .ok()?;
    let rev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !rev.is_empty()).then_some(rev)
}

/// A scratch directory for the servers, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("eddy-bench-suite-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // The postgres user must reach its data directory inside.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write_reports(results: &mut Results, out: &Path) -> Result<()> {
    match plots::write_all(results, out) {
        Ok(files) => results.plots = files,
        Err(e) => results.failures.push(format!("plots: {e:#}")),
    }
    report::write_json(results, &out.join("results.json"))?;
    report::write_markdown(results, &out.join("results.md"))
}

fn main() -> Result<()> {
    let args = <Args as clap::Parser>::parse();
    let started = Instant::now();
    let plan = Plan::new(args.quick);
    let logs = args.out.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let mut results = Results {
        date: chrono::Local::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
        quick: args.quick,
        git_revision: git_revision(),
        suite_command: std::env::args().collect::<Vec<_>>().join(" "),
        ..Results::default()
    };
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => build_release(&logs, &mut results)?,
    };
    check_binaries(&bin_dir)?;
    results.bin_dir = bin_dir.display().to_string();
    let scratch = Scratch::new()?;

    engine_sweeps(&plan, &bin_dir, &logs, &mut results);
    storage_windows(&plan, &bin_dir, &logs, &mut results);
    if let Err(e) = hopping(&plan, &bin_dir, &logs, &mut results) {
        results.failures.push(format!("hopping: {e:#}"));
    }
    if let Err(e) = placement(&plan, &bin_dir, &logs, &mut results) {
        results.failures.push(format!("placement: {e:#}"));
    }
    if let Err(e) = frontdoor(&plan, &bin_dir, &logs, &mut results) {
        results.failures.push(format!("frontdoor: {e:#}"));
    }
    if let Err(e) = scoring(&plan, &bin_dir, &scratch.0, &mut results) {
        results.failures.push(format!("scoring: {e:#}"));
    }
    if let Err(e) = history(&plan, &bin_dir, &logs, &mut results) {
        results.failures.push(format!("history: {e:#}"));
    }
    if let Err(e) = floor(&plan, &bin_dir, &logs, &mut results) {
        results.failures.push(format!("floor: {e:#}"));
    }
    drop(scratch);

    let insane = sanity(&plan, &results);
    results.failures.extend(insane);
    results.total_seconds = (started.elapsed().as_secs_f64() * 10.0).round() / 10.0;
    write_reports(&mut results, &args.out)?;
    println!("{}", report::markdown(&results));
    eprintln!(
        "reports in {} ({:.0} s)",
        args.out.display(),
        results.total_seconds
    );
    if !results.failures.is_empty() {
        bail!(
            "{} problem(s):\n- {}",
            results.failures.len(),
            results.failures.join("\n- ")
        );
    }
    Ok(())
}
