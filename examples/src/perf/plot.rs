//! Charts (`--plot FILE.svg`): IOPS over time and the latency distribution
//! of a run (and of the `--compare` run beside it), and the DMA-mode table
//! of `dma-bench` as requests per second over threads.
//!
//! Drawn with `plotters`' SVG backend only: no bitmap backend and no system
//! fonts (text goes into the SVG as `<text>` elements), so nothing beyond
//! the crate itself is needed to build it.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::RunReport;

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PlotError(String);

fn err(e: impl std::fmt::Display) -> PlotError {
    PlotError(e.to_string())
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Draw into an SVG document in memory, then write it to `path`: a file
/// that cannot be written is then an I/O error with its reason, not the
/// backend's "Drawing backend error" (the caller checked it before the
/// run, [`crate::output::claim`]).
fn render(
    path: &Path,
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), PlotError>,
) -> Result<(), PlotError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        draw(&root)?;
        root.present().map_err(err)?;
    }
    std::fs::write(path, svg).map_err(err)
}

/// IOPS per second (left) and the latency CDF (right), one series per run.
pub fn perf_chart(path: &Path, runs: &[&RunReport]) -> Result<(), PlotError> {
    render(path, (1200, 480), |root| draw_perf(root, runs))
}

fn draw_perf(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    runs: &[&RunReport],
) -> Result<(), PlotError> {
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(600);

    // IOPS over time. A run shorter than one second has no samples: its
    // overall IOPS is drawn as one point at its length.
    let series: Vec<(String, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|r| {
            let pts: Vec<(f64, f64)> = if r.time_series.is_empty() {
                vec![(r.total.stats.elapsed_s, r.total.stats.iops)]
            } else {
                r.time_series.iter().map(|s| (s.t_s, s.iops)).collect()
            };
            (r.device.clone(), pts)
        })
        .collect();
    let t_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let y_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.1))
        .fold(1.0f64, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&left)
        .caption("IOPS over time", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("IOPS")
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(err)?
            .label(format!("{name} IOPS"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(err)?;

    // Latency distribution: the cumulative share of I/Os at or below each
    // bucket's upper bound, on a log latency axis.
    let cdfs: Vec<(String, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|r| {
            let b = &r.total.stats.lat_us.buckets;
            let mut pts: Vec<(f64, f64)> = Vec::with_capacity(b.len() + 1);
            if let Some(first) = b.first() {
                pts.push((first.lo_us.max(first.hi_us / 2.0), 0.0));
            }
            pts.extend(b.iter().map(|b| (b.hi_us, b.cumulative_pct)));
            (r.device.clone(), pts)
        })
        .collect();
    let lo = cdfs
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.0))
        .fold(f64::INFINITY, f64::min);
    let lo = if lo.is_finite() { lo.max(0.001) } else { 0.5 };
    let hi = cdfs
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.0))
        .fold(lo * 2.0, f64::max);
    let mut chart = ChartBuilder::on(&right)
        .caption("Latency distribution", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..100.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("latency (us)")
        .y_desc("I/Os at or below (%)")
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in cdfs.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(err)?
            .label(format!("{name} latency"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(err)?;
    Ok(())
}

/// One series of a line chart: a name and its (x, y) points.
pub type Series = (String, Vec<(f64, f64)>);

/// A plain line chart (used by `dma-bench`: requests/s over threads per mode).
pub fn line_chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<(), PlotError> {
    render(path, (800, 480), |root| {
        draw_lines(root, title, x_desc, y_desc, series)
    })
}

fn draw_lines(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<(), PlotError> {
    root.fill(&WHITE).map_err(err)?;
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let (x0, x1, y1) = pts.fold((f64::INFINITY, f64::NEG_INFINITY, 1.0f64), |a, p| {
        (a.0.min(p.0), a.1.max(p.0), a.2.max(p.1))
    });
    let (x0, x1) = if x0.is_finite() && x1 > x0 {
        (x0, x1)
    } else if x0.is_finite() {
        (x0 - 0.5, x0 + 0.5)
    } else {
        (0.0, 1.0)
    };
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(x0..x1, 0.0..y1 * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(err)?;
    for (i, (name, p)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(p.iter().copied(), c.stroke_width(2)))
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
        chart
            .draw_series(p.iter().map(|&pt| Circle::new(pt, 3, c.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(err)?;
    Ok(())
}
