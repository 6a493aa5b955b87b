//! The SVG plots of a run, drawn with plotters' SVG backend (text is emitted as SVG text
//! elements, so no font library is needed): latency percentiles per system on a log scale
//! (as in Railgun's Figure 8), and engine throughput against window length and against
//! the number of keys.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::SegmentedCoord;
use plotters::coord::types::RangedCoordusize;
use plotters::prelude::*;

use super::report::{keys_label, Results};
use super::workload::ScoreRun;

const SIZE: (u32, u32) = (960, 600);

/// Writes every plot of `results` into `dir`; returns the files written.
pub fn write_all(results: &Results, dir: &Path) -> Result<Vec<String>> {
    let mut written = Vec::new();
    if !results.scoring.is_empty() {
        latency(&results.scoring, &dir.join("latency.svg"))?;
        written.push("latency.svg".to_string());
    }
    let mut line =
        |points: Vec<(String, f64)>, title: &str, x_desc: &str, y_desc: &str, file: &str| {
            if points.is_empty() {
                return Ok(());
            }
            written.push(file.to_string());
            line_plot(&points, title, x_desc, y_desc, &dir.join(file))
        };
    let per_shard = "events/s per shard";
    line(
        results
            .engine_windows
            .iter()
            .map(|r| (r.window.clone(), r.events_per_sec_per_shard))
            .collect(),
        "Engine throughput against window length",
        "sliding window size",
        per_shard,
        "engine_window.svg",
    )?;
    line(
        results
            .engine_keys
            .iter()
            .map(|r| (keys_label(r.keys), r.events_per_sec_per_shard))
            .collect(),
        "Engine throughput against number of keys",
        "distinct keys (cards)",
        per_shard,
        "engine_keys.svg",
    )?;
    let storage = &results.storage_windows;
    line(
        storage
            .iter()
            .map(|r| (r.window.clone(), r.events_per_sec))
            .collect(),
        "Disk reservoir: throughput against window length",
        "sliding window size",
        "events/s",
        "storage_window.svg",
    )?;
    line(
        storage
            .iter()
            .map(|r| (r.window.clone(), r.peak_rss_mb))
            .collect(),
        "Disk reservoir: peak RSS against window length",
        "sliding window size",
        "peak RSS, MB",
        "storage_window_rss.svg",
    )?;
    Ok(written)
}

fn plot_error<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a plot: {e:?}")
}

/// An axis of `n` categories, 0 to n - 1 (plotters' integer ranges include their end).
fn categories(n: usize) -> SegmentedCoord<RangedCoordusize> {
    (0..n.saturating_sub(1)).into_segmented()
}

/// The label of category `v` of a segmented axis.
fn category(labels: &[String], v: &SegmentValue<usize>) -> String {
    match v {
        SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
        _ => String::new(),
    }
}

/// p50, p90, p99, p99.9 and max per round trip of every scoring run, log scale.
fn latency(runs: &[ScoreRun], path: &Path) -> Result<()> {
    let names: Vec<String> = runs[0]
        .latency_ms
        .named()
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    let values = runs
        .iter()
        .flat_map(|r| r.latency_ms.named().map(|(_, v)| v));
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = ((lo * 0.7).max(0.001), (hi * 1.5).max(0.01));
    let root = SVGBackend::new(path, (SIZE.0 + LEGEND_WIDTH, SIZE.1)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let (plot, legend_area) = root.split_horizontally(SIZE.0);
    let mut chart = ChartBuilder::on(&plot)
        .caption(
            "Per-event scoring: latency per round trip",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(categories(names.len()), (lo..hi).log_scale())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("milliseconds (log scale)")
        .x_label_formatter(&|v| category(&names, v))
        .y_label_formatter(&|v| format!("{v}"))
        .draw()
        .map_err(plot_error)?;
    for (i, run) in runs.iter().enumerate() {
        let color = series_color(runs, i);
        let points: Vec<(SegmentValue<usize>, f64)> = run
            .latency_ms
            .named()
            .iter()
            .enumerate()
            .map(|(j, (_, v))| (SegmentValue::CenterOf(j), v.max(lo)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(plot_error)?;
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )
            .map_err(plot_error)?;
    }
    legend(&legend_area, runs)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// Run `i`'s colour: one family per system (Eddy blues, PostgreSQL reds, Redis greens),
/// a shade per form.
fn series_color(runs: &[ScoreRun], i: usize) -> RGBAColor {
    const EDDY: [(u8, u8, u8); 4] = [
        (31, 119, 180),
        (23, 190, 207),
        (30, 40, 120),
        (110, 150, 240),
    ];
    const POSTGRES: [(u8, u8, u8); 4] =
        [(214, 39, 40), (255, 127, 14), (140, 20, 60), (200, 120, 80)];
    const REDIS: [(u8, u8, u8); 2] = [(44, 160, 44), (20, 90, 20)];
    let nth = runs[..i]
        .iter()
        .filter(|r| r.system == runs[i].system)
        .count();
    let family: &[(u8, u8, u8)] = match runs[i].system.as_str() {
        "Eddy" => &EDDY,
        "PostgreSQL 15" => &POSTGRES,
        "Redis 7" => &REDIS,
        _ => return Palette99::pick(i).to_rgba(),
    };
    let (r, g, b) = family[nth % family.len()];
    RGBColor(r, g, b).to_rgba()
}

/// Pixels right of the latency plot for its legend.
const LEGEND_WIDTH: u32 = 330;

/// One line per run in the series' colour, beside the plot (never over a series).
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    runs: &[ScoreRun],
) -> Result<()> {
    for (i, run) in runs.iter().enumerate() {
        let color = series_color(runs, i);
        let y = 60 + 22 * i as i32;
        area.draw(&PathElement::new(
            vec![(0, y), (24, y)],
            color.stroke_width(3),
        ))
        .map_err(plot_error)?;
        area.draw(&Text::new(run.label(), (32, y - 7), ("sans-serif", 13)))
            .map_err(plot_error)?;
    }
    Ok(())
}

/// Events per second per shard of `runs`, one category per run.
/// One figure per category (`points`' labels), joined by a line.
fn line_plot(
    points: &[(String, f64)],
    title: &str,
    x_desc: &str,
    y_desc: &str,
    path: &Path,
) -> Result<()> {
    let labels: Vec<String> = points.iter().map(|p| p.0.clone()).collect();
    let labels = &labels;
    let hi = points.iter().map(|p| p.1).fold(0.0, f64::max) * 1.2;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(90)
        .build_cartesian_2d(categories(points.len()), 0.0..hi.max(1.0))
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|v| category(labels, v))
        .y_label_formatter(&|v| format!("{:.0}", v))
        .draw()
        .map_err(plot_error)?;
    let points: Vec<(SegmentValue<usize>, f64)> = points
        .iter()
        .enumerate()
        .map(|(i, p)| (SegmentValue::CenterOf(i), p.1))
        .collect();
    let color = BLUE.to_rgba();
    chart
        .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
        .map_err(plot_error)?;
    chart
        .draw_series(points.iter().map(|(x, y)| {
            EmptyElement::at((x.clone(), *y))
                + Circle::new((0, 0), 4, color.filled())
                + Text::new(format!("{:.0}", y), (6, -18), ("sans-serif", 13))
        }))
        .map_err(plot_error)?;
    root.present().map_err(plot_error)?;
    Ok(())
}
