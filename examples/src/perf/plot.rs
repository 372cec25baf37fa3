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

/// Ten colours no two of which look alike (the Tableau 10 hues); a chart
/// with more series gets evenly spaced hues instead ([`color`]), so no
/// two series share a colour.
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The colour of series `i` of `n`.
fn color(i: usize, n: usize) -> RGBColor {
    if n <= COLORS.len() {
        return COLORS[i];
    }
    let (r, g, b) = HSLColor(i as f64 / n as f64, 0.65, 0.45).rgb();
    RGBColor(r, g, b)
}

/// A tick label a person reads: 4.5M, 20M, 450k, 12 (not `4500000.0`).
pub fn si(v: f64) -> String {
    let a = v.abs();
    let (x, unit) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let t = if x.abs() >= 100.0 || x.fract().abs() < 0.05 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    };
    let t = if t.contains('.') {
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        t
    };
    format!("{t}{unit}")
}

/// The workload of a run, for a chart's title: pattern, size, QD, jobs, device.
pub fn workload_title(r: &RunReport) -> String {
    let w = &r.workload;
    let mix = if w.pattern.contains("rw") {
        format!(" {}% reads", w.read_pct)
    } else {
        String::new()
    };
    format!(
        "{}{mix} {}, QD {} x {} job(s)",
        w.pattern,
        crate::report::bytes_text(w.io_size),
        w.queue_depth,
        w.jobs
    )
}

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
    let devices = runs
        .iter()
        .map(|r| r.device.as_str())
        .collect::<Vec<_>>()
        .join(" vs ");
    let what = runs.first().map(|r| workload_title(r)).unwrap_or_default();
    let area = root
        .titled(&format!("{what} on {devices}"), ("sans-serif", 18))
        .map_err(err)?;
    let (left, right) = area.split_horizontally(600);

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
        .fold(1.0f64, f64::max);
    let y_min = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.1))
        .filter(|&y| y > 0.0)
        .fold(f64::INFINITY, f64::min);
    // Devices an order of magnitude apart (fake vs fake:null) get a log
    // axis, so the slower one is not a flat line on the floor.
    let log = y_min.is_finite() && y_max / y_min > 10.0;
    macro_rules! iops_panel {
        ($y:expr, $desc:expr) => {{
            let mut chart = ChartBuilder::on(&left)
                .caption("IOPS over time", ("sans-serif", 16))
                .margin(14)
                .x_label_area_size(45)
                .y_label_area_size(60)
                .build_cartesian_2d(0.0..t_max, $y)
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc("seconds")
                .y_desc($desc)
                .y_label_formatter(&|v| si(*v))
                .y_label_style(("sans-serif", 13))
                .axis_desc_style(("sans-serif", 14))
                .draw()
                .map_err(err)?;
            for (i, (name, pts)) in series.iter().enumerate() {
                let c = color(i, series.len());
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                    .map_err(err)?
                    .label(format!("{name} IOPS"))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .border_style(BLACK)
                .background_style(WHITE.mix(0.8))
                .draw()
                .map_err(err)?;
        }};
    }
    if log {
        iops_panel!((y_min * 0.5..y_max * 1.5).log_scale(), "IOPS (log)");
    } else {
        iops_panel!(0.0..y_max * 1.1, "IOPS");
    }

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
        .caption("Latency distribution", ("sans-serif", 16))
        .margin(14)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..100.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("latency (us)")
        .y_desc("I/Os at or below (%)")
        .x_label_formatter(&|v| si(*v))
        .axis_desc_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in cdfs.iter().enumerate() {
        let c = color(i, cdfs.len());
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
    // A log axis when the series differ by orders of magnitude (dma-bench:
    // strict mapping is ~100x below premapped), else a linear one from 0.
    let y0 = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.1))
        .filter(|&y| y > 0.0)
        .fold(f64::INFINITY, f64::min);
    let log = y0.is_finite() && y1 / y0 > 20.0;
    macro_rules! draw {
        ($y:expr, $desc:expr) => {{
            let mut chart = ChartBuilder::on(root)
                .caption(title, ("sans-serif", 18))
                .margin(14)
                .x_label_area_size(45)
                .y_label_area_size(60)
                .build_cartesian_2d(x0..x1, $y)
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc($desc)
                .y_label_formatter(&|v| si(*v))
                .axis_desc_style(("sans-serif", 14))
                .draw()
                .map_err(err)?;
            for (i, (name, p)) in series.iter().enumerate() {
                let c = color(i, series.len());
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
                .position(SeriesLabelPosition::UpperRight)
                .border_style(BLACK)
                .background_style(WHITE.mix(0.8))
                .draw()
                .map_err(err)?;
        }};
    }
    if log {
        draw!((y0 * 0.8..y1 * 1.25).log_scale(), format!("{y_desc} (log)"));
    } else {
        draw!(0.0..y1 * 1.1, y_desc.to_string());
    }
    Ok(())
}

/// One group of bars: its label and one value per series (in the order of
/// the series names).
pub type BarGroup = (String, Vec<f64>);

/// Grouped bars (used by `seed mcq`: IOPS per workload and job count, one
/// bar per mode), so separate jobs are not joined by lines.
pub fn bar_chart(
    path: &Path,
    title: &str,
    y_desc: &str,
    names: &[&str],
    groups: &[BarGroup],
) -> Result<(), PlotError> {
    render(path, (900, 480), |root| {
        root.fill(&WHITE).map_err(err)?;
        let y1 = groups
            .iter()
            .flat_map(|(_, v)| v.iter().copied())
            .fold(1.0f64, f64::max);
        let n = groups.len().max(1);
        let labels: Vec<String> = groups.iter().map(|(l, _)| l.clone()).collect();
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(45)
            .y_label_area_size(60)
            // Headroom for the legend above the tallest bar.
            .build_cartesian_2d(0.0..n as f64, 0.0..y1 * 1.3)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n * 2 + 1)
            .x_label_formatter(&|x| {
                // Labels sit at the centre of each group.
                let k = (x - 0.5).round();
                if (x - 0.5 - k).abs() < 1e-6 && k >= 0.0 {
                    labels.get(k as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc(y_desc)
            .y_label_formatter(&|v| si(*v))
            .axis_desc_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        let k = names.len().max(1) as f64;
        let w = 0.8 / k;
        for (s, name) in names.iter().enumerate() {
            let c = color(s, names.len());
            let bars = groups.iter().enumerate().filter_map(|(g, (_, v))| {
                let y = *v.get(s)?;
                let x = g as f64 + 0.1 + s as f64 * w;
                Some(Rectangle::new([(x, 0.0), (x + w * 0.95, y)], c.filled()))
            });
            chart
                .draw_series(bars)
                .map_err(err)?
                .label(*name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()
            .map_err(err)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tick labels a person reads.
    #[test]
    fn si_labels() {
        assert_eq!(si(4_500_000.0), "4.5M");
        assert_eq!(si(20_000_000.0), "20M");
        assert_eq!(si(450_000.0), "450k");
        assert_eq!(si(12.0), "12");
        assert_eq!(si(0.0), "0");
        assert_eq!(si(1_250.0), "1.25k");
    }

    /// No two series share a colour, however many.
    #[test]
    fn colours_are_distinct() {
        for n in [2, 6, 10, 11, 24] {
            let c: Vec<RGBColor> = (0..n).map(|i| color(i, n)).collect();
            for a in 0..n {
                for b in a + 1..n {
                    assert_ne!(c[a], c[b], "{n} series: {a} and {b}");
                }
            }
        }
    }
}
