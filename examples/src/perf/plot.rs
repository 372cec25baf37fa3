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

/// Tick values for a log axis over `lo..hi`: `m × 10^k` for the densest
/// mantissa set (1–9, then 1, 2, 5, then 1, 3, then 1) that gives at most
/// `max` ticks, each value once. plotters' own log ticks put a light tick
/// at `9 × 10^k + 10^k`, which is the next decade's bold one: the label
/// `10M` came out twice.
pub fn log_ticks(lo: f64, hi: f64, max: usize) -> Vec<f64> {
    if !(lo > 0.0 && hi > lo && lo.is_finite() && hi.is_finite()) {
        return Vec::new();
    }
    const SETS: [&[f64]; 4] = [
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
        &[1.0, 2.0, 5.0],
        &[1.0, 3.0],
        &[1.0],
    ];
    let first = lo.log10().floor() as i32;
    let last = hi.log10().ceil() as i32;
    let ticks = |set: &[f64]| -> Vec<f64> {
        (first..=last)
            .flat_map(|k| set.iter().map(move |m| m * 10f64.powi(k)))
            .filter(|&v| v >= lo * (1.0 - 1e-9) && v <= hi * (1.0 + 1e-9))
            .collect()
    };
    let mut best = Vec::new();
    for set in SETS {
        best = ticks(set);
        if best.len() <= max.max(1) {
            break;
        }
    }
    // Decades so many that even one tick per decade is too dense: every
    // n-th decade.
    if best.len() > max.max(1) {
        let step = best.len().div_ceil(max.max(1));
        best = best.into_iter().step_by(step).collect();
    }
    best
}

/// Integer ticks over `lo..=hi` (thread counts: no tick at 1.1), at most
/// `max` of them, evenly stepped.
pub fn integer_ticks(lo: f64, hi: f64, max: usize) -> Vec<f64> {
    let (a, b) = (lo.ceil() as i64, hi.floor() as i64);
    if b < a {
        return Vec::new();
    }
    let n = (b - a + 1) as usize;
    let step = n.div_ceil(max.max(1)).max(1);
    (a..=b).step_by(step).map(|v| v as f64).collect()
}

/// A linear axis over `lo..hi` with the ticks given (the nines of the
/// latency axis, whole thread counts). plotters' `with_key_points` does
/// the same for the log axes, but its linear `f64` axis then has no label
/// formatter.
struct Ticked {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl plotters::coord::ranged1d::Ranged for Ticked {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let share = (v - self.lo) / (self.hi - self.lo);
        limit.0 + (share * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<H: plotters::coord::ranged1d::KeyPointHint>(&self, _: H) -> Vec<f64> {
        self.ticks.clone()
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// The largest "nines" shown on the latency axis for a run of `ios` I/Os:
/// one I/O in `ios` is the finest share measured, so 1 000 I/Os reach 99.9 %
/// (3 nines) and no further; between 1 and 6 nines.
fn max_nines(ios: u64) -> f64 {
    (ios.max(1) as f64).log10().ceil().clamp(1.0, 6.0)
}

/// A cumulative percentage on the "nines" scale: `log10(1 / (1 - p))`, so
/// 0 % is 0, 90 % is 1, 99 % is 2, 99.9 % is 3 (fio's and HdrHistogram's
/// percentile plots), capped at `cap` (100 % is infinitely many nines).
pub fn nines(pct: f64, cap: f64) -> f64 {
    let rest = 1.0 - pct.clamp(0.0, 100.0) / 100.0;
    if rest <= 10f64.powf(-cap) {
        cap
    } else {
        (1.0 / rest).log10().min(cap)
    }
}

/// The percentile at `n` nines, as the axis labels it: 0%, 90%, 99%, 99.9% ...
pub fn nines_label(n: f64) -> String {
    let k = n.round().max(0.0) as i32;
    if k == 0 {
        return "0%".into();
    }
    let pct = 100.0 * (1.0 - 10f64.powi(-k));
    format!("{pct:.prec$}%", prec = (k - 2).max(0) as usize)
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
        let (lo, hi) = (y_min * 0.5, y_max * 1.5);
        iops_panel!(
            (lo..hi).log_scale().with_key_points(log_ticks(lo, hi, 12)),
            "IOPS (log)"
        );
    } else {
        iops_panel!(0.0..y_max * 1.1, "IOPS");
    }

    // Latency distribution: the cumulative share of I/Os at or below each
    // bucket's upper bound, on a log latency axis, against a percentile
    // axis in "nines" (0, 90, 99, 99.9 ...), where the tail is as wide as
    // the bulk instead of a sliver under 100 %.
    let cap = runs
        .iter()
        .map(|r| max_nines(r.total.stats.ios))
        .fold(1.0f64, f64::max);
    let cdfs: Vec<(String, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|r| {
            let b = &r.total.stats.lat_us.buckets;
            let mut pts: Vec<(f64, f64)> = Vec::with_capacity(b.len() + 1);
            if let Some(first) = b.first() {
                pts.push((first.lo_us.max(first.hi_us / 2.0), 0.0));
            }
            pts.extend(b.iter().map(|b| (b.hi_us, nines(b.cumulative_pct, cap))));
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
    let percentiles: Vec<f64> = (0..=cap as i32).map(f64::from).collect();
    let mut chart = ChartBuilder::on(&right)
        .caption("Latency distribution", ("sans-serif", 16))
        .margin(14)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (lo..hi).log_scale().with_key_points(log_ticks(lo, hi, 10)),
            Ticked {
                lo: 0.0,
                hi: cap,
                ticks: percentiles,
            },
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("latency (us)")
        .y_desc("percentile: I/Os at or below, log(1/(1-p))")
        .x_label_formatter(&|v| si(*v))
        .y_label_formatter(&|v| nines_label(*v))
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
    // The curves climb from the lower left to the upper right: the lower
    // right corner is free.
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

/// A plain line chart (used by `dma-bench`: requests/s over threads per
/// mode). When every x is a whole number (thread counts), the x ticks are
/// whole numbers too. The legend sits in a column right of the plotting
/// area, so it never covers a line.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<(), PlotError> {
    render(path, (960, 480), |root| {
        draw_lines(root, title, x_desc, y_desc, series)
    })
}

/// Width of the legend column of [`line_chart`], in pixels.
const LEGEND_WIDTH: u32 = 200;

fn draw_lines(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<(), PlotError> {
    root.fill(&WHITE).map_err(err)?;
    let area = root.titled(title, ("sans-serif", 18)).map_err(err)?;
    let (plot, legend) = area.split_horizontally(area.dim_in_pixel().0 - LEGEND_WIDTH);
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let (x0, x1, y1) = pts.fold((f64::INFINITY, f64::NEG_INFINITY, 1.0f64), |a, p| {
        (a.0.min(p.0), a.1.max(p.0), a.2.max(p.1))
    });
    let integers = series
        .iter()
        .flat_map(|(_, p)| p.iter())
        .all(|p| p.0.fract() == 0.0);
    let (x0, x1) = if x0.is_finite() && x1 > x0 {
        (x0, x1)
    } else if x0.is_finite() {
        (x0 - 0.5, x0 + 0.5)
    } else {
        (0.0, 1.0)
    };
    let x_ticks = if integers {
        integer_ticks(x0, x1, 12)
    } else {
        Vec::new()
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
        ($x:expr, $y:expr, $desc:expr) => {{
            let mut chart = ChartBuilder::on(&plot)
                .margin(14)
                .x_label_area_size(45)
                .y_label_area_size(60)
                .build_cartesian_2d($x, $y)
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc($desc)
                .x_label_formatter(&|v| {
                    if integers {
                        format!("{v:.0}")
                    } else {
                        si(*v)
                    }
                })
                .y_label_formatter(&|v| si(*v))
                .axis_desc_style(("sans-serif", 14))
                .draw()
                .map_err(err)?;
            for (i, (_, p)) in series.iter().enumerate() {
                let c = color(i, series.len());
                chart
                    .draw_series(LineSeries::new(p.iter().copied(), c.stroke_width(2)))
                    .map_err(err)?;
                chart
                    .draw_series(p.iter().map(|&pt| Circle::new(pt, 3, c.filled())))
                    .map_err(err)?;
            }
        }};
    }
    macro_rules! draw_y {
        ($x:expr) => {{
            if log {
                let (lo, hi) = (y0 * 0.8, y1 * 1.25);
                draw!(
                    $x,
                    (lo..hi).log_scale().with_key_points(log_ticks(lo, hi, 12)),
                    format!("{y_desc} (log)")
                );
            } else {
                draw!($x, 0.0..y1 * 1.1, y_desc.to_string());
            }
        }};
    }
    if integers {
        draw_y!(Ticked {
            lo: x0,
            hi: x1,
            ticks: x_ticks,
        });
    } else {
        draw_y!(x0..x1);
    }
    // The legend: a swatch and the series' name per row, in its own column.
    for (i, (name, _)) in series.iter().enumerate() {
        let c = color(i, series.len());
        let y = 40 + 20 * i as i32;
        legend
            .draw(&PathElement::new(vec![(8, y), (28, y)], c.stroke_width(2)))
            .map_err(err)?;
        legend
            .draw(&Text::new(
                name.as_str(),
                (34, y - 7),
                ("sans-serif", 13).into_font(),
            ))
            .map_err(err)?;
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

    /// Log ticks are distinct, read back as themselves, and never twice
    /// at one decade (plotters' light ticks put `10 × 10^k` before the
    /// bold `10^(k+1)`).
    #[test]
    fn log_ticks_are_distinct_and_in_range() {
        for (lo, hi) in [(8_000.0, 240_000.0), (5e5, 1.5e7), (0.3, 2e6), (1.0, 9.0)] {
            let t = log_ticks(lo, hi, 12);
            assert!(!t.is_empty() && t.len() <= 12, "{lo}..{hi}: {t:?}");
            let labels: Vec<String> = t.iter().map(|&v| si(v)).collect();
            for w in t.windows(2) {
                assert!(w[0] < w[1], "{lo}..{hi}: {t:?}");
            }
            let mut uniq = labels.clone();
            uniq.dedup();
            assert_eq!(uniq, labels, "{lo}..{hi}");
            assert!(t.iter().all(|&v| v >= lo && v <= hi), "{lo}..{hi}: {t:?}");
        }
        assert_eq!(
            log_ticks(8_000.0, 240_000.0, 12),
            [1e4, 2e4, 5e4, 1e5, 2e5],
            "1, 2, 5 per decade"
        );
    }

    /// The percentile axis: 90 % is one nine, 99.9 % three; 100 % is the cap.
    #[test]
    fn nines_scale_and_labels() {
        assert_eq!(nines(0.0, 4.0), 0.0);
        assert!((nines(90.0, 4.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.9, 4.0) - 3.0).abs() < 1e-9);
        assert_eq!(nines(100.0, 4.0), 4.0);
        let l: Vec<String> = (0..=5).map(|k| nines_label(f64::from(k))).collect();
        assert_eq!(l, ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"]);
        assert_eq!(max_nines(1_000), 3.0);
        assert_eq!(max_nines(1_001), 4.0);
        assert_eq!(max_nines(1), 1.0);
    }

    /// Thread counts get whole ticks only.
    #[test]
    fn integer_ticks_are_whole() {
        assert_eq!(integer_ticks(1.0, 2.0, 12), [1.0, 2.0]);
        assert_eq!(integer_ticks(0.5, 1.5, 12), [1.0]);
        let t = integer_ticks(1.0, 64.0, 12);
        assert!(t.len() <= 12 && t.iter().all(|v| v.fract() == 0.0), "{t:?}");
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
