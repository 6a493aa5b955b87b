//! The figures of a run and their reports: `results.json` (everything, with the command
//! lines used and the machine) and `results.md` (one Markdown table per benchmark).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::workload::{Percentiles, ScoreRun, Workload};

/// One engine run (`engine --mode task`).
#[derive(Clone, Debug, Serialize)]
pub struct EngineRun {
    pub window: String,
    pub keys: u64,
    pub events: u64,
    pub events_per_sec_per_shard: f64,
    /// Per event, in microseconds.
    pub latency_us: Percentiles,
    /// Events held in the task (the window's reservoir) at the end.
    pub stored_events: u64,
    /// The event time the run's events span.
    pub event_time_seconds: f64,
    pub wall_seconds: f64,
    pub command: String,
}

/// One run of the disk-backed reservoir against the window length (`storage --mode
/// memory`): one task, the same events over 30 days of event time, each window in a
/// process of its own.
#[derive(Clone, Debug, Serialize)]
pub struct StorageRun {
    pub window: String,
    pub keys: u64,
    pub events: u64,
    pub event_time_days: u64,
    pub events_per_sec: f64,
    pub peak_rss_mb: f64,
    /// Events held in the reservoir at the end, and its chunks.
    pub stored_events: u64,
    pub chunks: u64,
    pub command: String,
}

/// One front-door mode (`frontdoor`).
#[derive(Clone, Debug, Serialize)]
pub struct FrontdoorRun {
    pub mode: String,
    pub events: u64,
    pub statements: u64,
    pub seconds: f64,
    pub events_per_sec: f64,
    /// Per statement, in milliseconds.
    pub latency_ms: Percentiles,
}

/// A command the suite ran, for the reports.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    pub step: String,
    pub command: String,
}

/// Everything one run of the suite measured.
#[derive(Debug, Default, Serialize)]
pub struct Results {
    pub date: String,
    pub nproc: usize,
    pub quick: bool,
    pub git_revision: Option<String>,
    pub suite_command: String,
    pub bin_dir: String,
    pub commands: Vec<Step>,
    pub engine_windows: Vec<EngineRun>,
    pub engine_keys: Vec<EngineRun>,
    pub storage_windows: Vec<StorageRun>,
    /// MEDIAN and PERCENTILE_CONT(0.99), 5 minutes, 100k keys.
    pub engine_percentiles: Option<EngineRun>,
    /// `hopping`'s report.
    pub hopping: Option<serde_json::Value>,
    /// `placement`'s report.
    pub placement: Option<serde_json::Value>,
    pub frontdoor: Vec<FrontdoorRun>,
    /// `bench/history.sh`'s report: history and AS OF over stored events.
    pub history: Option<serde_json::Value>,
    /// `floor`'s report: what no server on this machine can beat.
    pub floor: Option<serde_json::Value>,
    pub scoring_workload: Option<Workload>,
    pub scoring: Vec<ScoreRun>,
    pub plots: Vec<String>,
    pub failures: Vec<String>,
    pub total_seconds: f64,
}

pub fn write_json(results: &Results, path: &Path) -> Result<()> {
    let text = serde_json::to_string_pretty(results)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

pub fn write_markdown(results: &Results, path: &Path) -> Result<()> {
    std::fs::write(path, markdown(results)).with_context(|| format!("writing {}", path.display()))
}

/// A number with thousands separators ("1 234 567").
fn grouped(v: f64) -> String {
    let digits = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    if v < 0.0 {
        format!("-{out}")
    } else {
        out
    }
}

/// A latency with three significant digits or so.
fn ms(v: f64) -> String {
    match v {
        v if v >= 100.0 => format!("{v:.0}"),
        v if v >= 10.0 => format!("{v:.1}"),
        v if v >= 1.0 => format!("{v:.2}"),
        v => format!("{v:.3}"),
    }
}

/// The whole Markdown report.
pub fn markdown(r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Eddy benchmarks{}\n",
        if r.quick {
            " (--quick: tiny sizes)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        s,
        "{} on {} cores, revision {}, {:.0} s in all. Binaries from `{}`.\n",
        r.date,
        r.nproc,
        r.git_revision.as_deref().unwrap_or("unknown"),
        r.total_seconds,
        r.bin_dir
    );
    engine_table(
        &mut s,
        "Engine throughput against window length",
        &r.engine_windows,
    );
    engine_table(
        &mut s,
        "Engine throughput against number of keys",
        &r.engine_keys,
    );
    storage_table(&mut s, &r.storage_windows);
    if let Some(p) = &r.engine_percentiles {
        let l = &p.latency_us;
        let _ = writeln!(
            s,
            "## Exact percentiles

MEDIAN and PERCENTILE_CONT(0.99) of the amount per card, \
             5-minute sliding window, {} keys: {} events/s per shard, p99 {} µs, p99.9 {} µs, \
             max {} µs.\n",
            keys_label(p.keys),
            grouped(p.events_per_sec_per_shard),
            ms(l.p99),
            ms(l.p999),
            ms(l.max)
        );
    }
    if let Some(h) = &r.hopping {
        let _ = writeln!(
            s,
            "## Hopping windows against the exact sliding window\n\nAfter every event, each \
             hopping window's COUNT and SUM per card compared with the exact sliding window of \
             the same size ({} s).\n\n| hop (s) | events whose result differs | mean relative error of COUNT |\n|---:|---:|---:|",
            h["window_seconds"]
        );
        for hop in h["hops"].as_array().into_iter().flatten() {
            let _ = writeln!(
                s,
                "| {} | {:.1} % | {:.2} % |",
                hop["hop_seconds"],
                hop["events_differing_share"].as_f64().unwrap_or(0.0) * 100.0,
                hop["count_mean_relative_error"].as_f64().unwrap_or(0.0) * 100.0
            );
        }
        let _ = writeln!(s);
    }
    if let Some(h) = &r.history {
        let _ = writeln!(
            s,
            "## Point in time: history and AS OF over stored events\n\n{} events loaded \
             (`bench/history.sh`, one task).\n\n| history read | rows | rows/s | peak RSS during (MiB) |\n|---|---:|---:|---:|",
            h["load"]["loaded"]
        );
        for run in h["history"].as_array().into_iter().flatten() {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.0} |",
                run["history"].as_str().unwrap_or("?"),
                run["rows"],
                run["rows_per_s"],
                run["peak_during_kib"].as_f64().unwrap_or(0.0) / 1024.0
            );
        }
        let a = &h["as_of"];
        let _ = writeln!(
            s,
            "\nAS OF point lookups on a 1-hour window ({} of them): p50 {} ms, p99 {} ms, max {} ms.\n",
            a["as_of_lookups"], a["p50_ms"], a["p99_ms"], a["max_ms"]
        );
    }
    if let Some(p) = &r.placement {
        let _ = writeln!(
            s,
            "## Placement: HiBench fixed window on 1 and 2 shards\n\n{} ({} events, median of \
             {} runs).\n\n| shards | pinned | events/s | p50 (ms) | p99 (ms) | p99.9 (ms) |\n\
             |---:|:---:|---:|---:|---:|---:|",
            p["workload"].as_str().unwrap_or_default(),
            p["events"],
            p["runs"]
        );
        for c in p["configurations"].as_array().into_iter().flatten() {
            let l = &c["latency_us"];
            let ms = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0) / 1000.0;
            let _ = writeln!(
                s,
                "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} |",
                c["shards"],
                if c["pinned"].as_bool() == Some(true) {
                    "yes"
                } else {
                    "no"
                },
                c["events_per_sec"].as_f64().unwrap_or(0.0),
                ms(&l["p50"]),
                ms(&l["p99"]),
                ms(&l["p999"])
            );
        }
        let _ = writeln!(
            s,
            "\nPinning costs {} % (1 shard) and {} % (2 shards); 1 → 2 shards scales {}× \
             unpinned and {}× pinned.\n",
            p["pinning_cost_pct"]["1_shard"],
            p["pinning_cost_pct"]["2_shards"],
            p["scaling_1_to_2_shards"]["unpinned"],
            p["scaling_1_to_2_shards"]["pinned"]
        );
    }
    frontdoor_table(&mut s, &r.frontdoor);
    scoring_table(&mut s, r);
    if let Some(f) = &r.floor {
        floor_section(&mut s, f);
    }
    if !r.plots.is_empty() {
        let _ = writeln!(s, "## Plots\n");
        for p in &r.plots {
            let _ = writeln!(s, "- [{p}]({p})");
        }
        s.push('\n');
    }
    let _ = writeln!(s, "## Commands\n");
    for c in &r.commands {
        let _ = writeln!(s, "- {}: `{}`", c.step, c.command);
    }
    s.push('\n');
    if !r.failures.is_empty() {
        let _ = writeln!(s, "## Failures\n");
        for f in &r.failures {
            let _ = writeln!(s, "- {}", f.replace('\n', " "));
        }
        s.push('\n');
    }
    s
}

fn engine_table(s: &mut String, title: &str, runs: &[EngineRun]) {
    if runs.is_empty() {
        return;
    }
    let span = runs[0].event_time_seconds;
    let _ = writeln!(
        s,
        "## {title}\n\nOne task in-process (`engine --mode task`): COUNT, SUM, AVG per card over a \
         sliding window. The events span {} s of event time: a longer window never slides and \
         keeps every event. Latency per event in µs.\n",
        grouped(span)
    );
    let _ = writeln!(s, "| window | keys | events | events/s per shard | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | events stored at the end |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        let l = &r.latency_us;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.window,
            keys_label(r.keys),
            grouped(r.events as f64),
            grouped(r.events_per_sec_per_shard),
            ms(l.p50),
            ms(l.p90),
            ms(l.p99),
            ms(l.p999),
            ms(l.max),
            grouped(r.stored_events as f64)
        );
    }
    s.push('\n');
}

fn storage_table(s: &mut String, runs: &[StorageRun]) {
    let Some(first) = runs.first() else {
        return;
    };
    let _ = writeln!(
        s,
        "## The disk reservoir against window length\n\nOne task in-process on the disk-backed \
         default (`storage --mode memory`): COUNT, SUM, AVG per card over a sliding window, {} \
         events over {} days of event time, {} keys, each window in a process of its own. The \
         rate is against the first window's.\n",
        grouped(first.events as f64),
        first.event_time_days,
        keys_label(first.keys)
    );
    let _ = writeln!(
        s,
        "| window | events/s | × {} | peak RSS MB | events stored at the end | chunks |",
        first.window
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
    for r in runs {
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} | {:.0} | {} | {} |",
            r.window,
            grouped(r.events_per_sec),
            r.events_per_sec / first.events_per_sec.max(1.0),
            r.peak_rss_mb,
            grouped(r.stored_events as f64),
            r.chunks
        );
    }
    s.push('\n');
}

fn floor_section(s: &mut String, f: &serde_json::Value) {
    let probes: Vec<&serde_json::Value> = f["floor"].as_array().into_iter().flatten().collect();
    let _ = writeln!(
        s,
        "## The machine's floor\n\nWhat no server on this host can beat, whatever its code: \
         a loop that only reads the clock, and one message in flight between two threads over \
         loopback TCP with no work on either side (`echo_durable`: the answer waits for the \
         message's write and fdatasync into a zero-filled file).\n"
    );
    for p in probes.iter().filter(|p| p["probe"] == "clock") {
        let _ = writeln!(
            s,
            "- clock, {} s: longest gap {} ms, {} gaps over 1 ms ({} a second).",
            p["seconds"], p["longest_gap_ms"], p["gaps_over_1ms"], p["gaps_over_1ms_per_sec"]
        );
    }
    let _ = writeln!(
        s,
        "\n| echo | bytes | round trips/s | p50 ms | p99 ms | p99.9 ms | max ms |\n\
         |---|---:|---:|---:|---:|---:|---:|"
    );
    for p in probes.iter().filter(|p| p["probe"] != "clock") {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            p["probe"].as_str().unwrap_or_default(),
            p["message_bytes"],
            grouped(p["round_trips_per_sec"].as_f64().unwrap_or(0.0)),
            p["p50_ms"],
            p["p99_ms"],
            p["p999_ms"],
            p["max_ms"]
        );
    }
    s.push('\n');
}

fn frontdoor_table(s: &mut String, runs: &[FrontdoorRun]) {
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## Front door (pgwire, one client, in-process server)\n\nLatency per statement in ms \
         (`batch`: one multi-row INSERT … RETURNING; `copy`: the whole COPY).\n"
    );
    let _ = writeln!(
        s,
        "| mode | events | statements | events/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        let l = &r.latency_ms;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.mode,
            grouped(r.events as f64),
            grouped(r.statements as f64),
            grouped(r.events_per_sec),
            ms(l.p50),
            ms(l.p90),
            ms(l.p99),
            ms(l.p999),
            ms(l.max)
        );
    }
    s.push('\n');
}

fn scoring_table(s: &mut String, r: &Results) {
    if r.scoring.is_empty() {
        return;
    }
    let _ = writeln!(s, "## Per-event scoring: Eddy, PostgreSQL 15, Redis 7\n");
    if let Some(w) = &r.scoring_workload {
        let _ = writeln!(
            s,
            "Each event is inserted and answered with its card's COUNT, SUM, AVG over the last 5 \
             minutes (the event included); {} cards, one event every {} ms of event time. Every \
             answer is checked against an exact reference (`exact`). Latency per round trip in ms \
             (all events of a batch wait for the batch). `capped`: stopped by the time cap.\n",
            grouped(w.cards as f64),
            w.step_ms
        );
    }
    let _ = writeln!(s, "| system | form | durability | events/round trip | events | events/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | exact |");
    let _ = writeln!(
        s,
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for run in &r.scoring {
        let l = &run.latency_ms;
        let exact = if run.exact {
            "yes (0 mismatches)".to_string()
        } else {
            format!("no ({} mismatches)", run.mismatches)
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {}{} | {} | {} | {} | {} | {} | {} | {} |",
            run.system,
            run.form,
            run.durability,
            run.events_per_round_trip,
            grouped(run.events as f64),
            if run.capped { " (capped)" } else { "" },
            grouped(run.events_per_sec),
            ms(l.p50),
            ms(l.p90),
            ms(l.p99),
            ms(l.p999),
            ms(l.max),
            exact
        );
    }
    s.push('\n');
}

/// 10000 as "10k", 1000000 as "1M".
pub fn keys_label(keys: u64) -> String {
    match keys {
        k if k >= 1_000_000 && k % 1_000_000 == 0 => format!("{}M", k / 1_000_000),
        k if k >= 1_000 && k % 1_000 == 0 => format!("{}k", k / 1_000),
        k => k.to_string(),
    }
}
