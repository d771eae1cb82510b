//! The PNG charts of a bench report: a grouped bar per case ([`plot_png`]), TFLOP/s against N
//! ([`plot_vs_n`]), and [`plot_op`], which picks one by [`PlotStyle`].

use std::path::Path;
use std::sync::OnceLock;

use super::json::{BenchReport, BenchRow, Metric};
use super::table::fmt_rate;

const FONT_FAMILY: &str = "sans-serif";

/// Registers DejaVu Sans (embedded from the `dejavu` crate) as plotters' "sans-serif" family,
/// so charts need no system font.
fn ensure_fonts() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        use plotters::style::{register_font, FontStyle};
        register_font(FONT_FAMILY, FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| "embedded DejaVu Sans font is invalid".to_string())?;
        register_font(FONT_FAMILY, FontStyle::Bold, dejavu::sans::bold())
            .map_err(|_| "embedded DejaVu Sans Bold font is invalid".to_string())?;
        Ok(())
    })
    .clone()
}

fn series_color(k: usize) -> plotters::style::RGBColor {
    use plotters::style::RGBColor;
    const COLORS: [RGBColor; 10] = [
        RGBColor(31, 119, 180),  // tessera: blue
        RGBColor(255, 127, 14),  // orange
        RGBColor(44, 160, 44),   // green
        RGBColor(214, 39, 40),   // red
        RGBColor(148, 103, 189), // purple
        RGBColor(140, 86, 75),   // brown
        RGBColor(227, 119, 194), // pink
        RGBColor(127, 127, 127), // grey
        RGBColor(188, 189, 34),  // olive
        RGBColor(23, 190, 207),  // cyan
    ];
    COLORS[k % COLORS.len()]
}

/// X axis of the bar chart: cases at 0, 1, ..., n-1 over [-0.5, n-0.5], one tick per case.
struct CaseAxis {
    n: usize,
    inner: plotters::coord::types::RangedCoordf64,
}

impl plotters::coord::ranged1d::Ranged for CaseAxis {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            (0..self.n).map(|i| i as f64).collect()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.inner.range()
    }
}

/// Grouped bar chart: x = case, y = `metric`, one bar series per impl (ours first), and a dashed
/// horizontal line at the roofline when it is known. `path` should end in `.png`.
pub fn plot_png(report: &BenchReport, path: &Path, metric: Metric, title: &str) -> Result<(), String> {
    use plotters::prelude::*;
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    use plotters::style::FontTransform;

    ensure_fonts()?;
    let cases = report.cases();
    let impls = report.impls();
    if cases.is_empty() {
        return Err("no rows to plot".into());
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let n = cases.len();
    let values: Vec<Vec<Option<f64>>> = impls
        .iter()
        .map(|imp| {
            cases
                .iter()
                .map(|c| report.row(c, imp).and_then(|r| metric.of(r)).filter(|v| v.is_finite()))
                .collect()
        })
        .collect();
    let roof = metric.roofline(&report.roofline).filter(|r| r.is_finite() && *r > 0.0);
    let vmax = values
        .iter()
        .flatten()
        .flatten()
        .copied()
        .chain(roof)
        .fold(0.0f64, f64::max);
    // headroom for the legend in the upper right
    let ymax = if vmax > 0.0 { vmax * 1.35 } else { 1.0 };

    // geometry: wide enough for every bar; case labels are rotated when they would collide
    let slot_px = (22 * impls.len() + 24).max(70);
    let width = (140 + n * slot_px).clamp(960, 4000) as u32;
    let height = 640u32;
    let label_font = (FONT_FAMILY, 14.0).into_font();
    let label_px = cases
        .iter()
        .map(|c| label_font.box_size(c).map_or(c.chars().count() as u32 * 9, |b| b.0))
        .max()
        .unwrap_or(0);
    let plot_slot_px = width.saturating_sub(120) / n as u32;
    let rotate = label_px + 10 > plot_slot_px;
    let x_label_area = if rotate { (label_px + 20).min(300) } else { 36 };

    let draw_err = |e: &dyn std::fmt::Display| format!("cannot draw {}: {e}", path.display());
    let root = BitMapBackend::new(path, (width, height + x_label_area)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(&e))?;
    let (main, footer) = root.split_vertically(height + x_label_area - 22);

    let x_axis = CaseAxis {
        n,
        inner: (-0.5..n as f64 - 0.5).into(),
    };
    let mut chart = ChartBuilder::on(&main)
        .caption(title, (FONT_FAMILY, 24).into_font().style(FontStyle::Bold))
        .margin(14)
        .x_label_area_size(x_label_area)
        .y_label_area_size(72)
        .build_cartesian_2d(x_axis, 0.0..ymax)
        .map_err(|e| draw_err(&e))?;

    let case_label = |x: &f64| {
        let i = x.round();
        if !rotate && (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n {
            cases[i as usize].to_string()
        } else {
            String::new()
        }
    };
    let y_label = |y: &f64| {
        if ymax >= 20.0 {
            format!("{y:.0}")
        } else {
            format!("{y:.2}")
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&case_label)
        .x_label_style(label_font.clone())
        .y_labels(10)
        .y_label_formatter(&y_label)
        .y_desc(metric.unit())
        .axis_desc_style((FONT_FAMILY, 16))
        .y_label_style((FONT_FAMILY, 14))
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.12))
        .draw()
        .map_err(|e| draw_err(&e))?;
    if rotate {
        // plotters centres rotated tick labels on the tick; anchor them below the axis instead
        let style = label_font
            .transform(FontTransform::Rotate90)
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Center));
        for (i, case) in cases.iter().enumerate() {
            let (px, py) = chart.backend_coord(&(i as f64, 0.0));
            root.draw(&Text::new(case.to_string(), (px, py + 8), style.clone()))
                .map_err(|e| draw_err(&e))?;
        }
    }

    let group = 0.8;
    let bar = group / impls.len() as f64;
    for (k, imp) in impls.iter().enumerate() {
        let color = series_color(k);
        let x0 = -group / 2.0 + k as f64 * bar;
        let bars = values[k].iter().enumerate().filter_map(|(c, v)| {
            v.map(|v| {
                let l = c as f64 + x0;
                Rectangle::new([(l + bar * 0.06, 0.0), (l + bar * 0.94, v)], color.filled())
            })
        });
        chart
            .draw_series(bars)
            .map_err(|e| draw_err(&e))?
            .label(*imp)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
    }
    if let Some(r) = roof {
        let label = match metric {
            Metric::Gbps => format!("roofline: copy {} GB/s", fmt_rate(r)),
            Metric::Tflops => format!("roofline: bf16 GEMM {} TFLOP/s", fmt_rate(r)),
        };
        chart
            .draw_series(DashedLineSeries::new(
                [(-0.5, r), (n as f64 - 0.5, r)],
                10,
                6,
                BLACK.stroke_width(2),
            ))
            .map_err(|e| draw_err(&e))?
            .label(label)
            .legend(|(x, y)| PathElement::new([(x, y), (x + 14, y)], BLACK.stroke_width(2)));
    }
    finish_chart(&mut chart, SeriesLabelPosition::UpperRight, &footer, report, path)
}

/// The common end of both charts: the legend at `legend`, the footer line (GPU, date, commit and
/// command of the run) and the write to `path`.
fn finish_chart<'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut plotters::chart::ChartContext<'a, plotters::prelude::BitMapBackend<'a>, CT>,
    legend: plotters::chart::SeriesLabelPosition,
    footer: &plotters::drawing::DrawingArea<plotters::prelude::BitMapBackend<'a>, plotters::coord::Shift>,
    report: &BenchReport,
    path: &Path,
) -> Result<(), String> {
    use plotters::prelude::*;

    let draw_err = |e: &dyn std::fmt::Display| format!("cannot draw {}: {e}", path.display());
    chart
        .configure_series_labels()
        .position(legend)
        .label_font((FONT_FAMILY, 15))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(|e| draw_err(&e))?;
    let commit: String = report.commit.chars().take(12).collect();
    let note = format!(
        "{} | {} | commit {} | {}",
        report.gpu, report.date, commit, report.command
    );
    footer
        .draw_text(&note, &(FONT_FAMILY, 13).into_font().color(&BLACK.mix(0.6)), (14, 2))
        .map_err(|e| draw_err(&e))?;
    footer.present().map_err(|e| draw_err(&e))
}

/// Attention's seed table (ANCHORS.md, issue 3): causal fp16, B = 1, H = 32, D = 128, padded.
fn is_attention_seed(p: &serde_json::Value) -> bool {
    p["causal"] == true
        && p["dtype"] == "fp16"
        && p["B"] == 1
        && p["Hq"] == 32
        && p["Hkv"] == 32
        && p["D"] == 128
        && p["varlen"] != true
        && p["N"].is_u64()
}

/// How [`plot_op`] draws a report; the caller picks it for the operator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PlotStyle {
    /// A grouped bar per case, y = the measure our rows carry ([`Metric::infer`]): [`plot_png`].
    #[default]
    Bars,
    /// TFLOP/s against N, one line per impl, over the rows of attention's seed table
    /// (causal fp16, B = 1, H = 32, D = 128, padded): [`plot_vs_n`]. A report without such
    /// rows gets [`Bars`](Self::Bars).
    TflopsVsN,
}

/// The chart `tessera bench --json` writes for an operator, drawn in `style`:
/// [`PlotStyle::TflopsVsN`] plots TFLOP/s against N for attention's seed table, one line per
/// impl ([`plot_vs_n`]); [`PlotStyle::Bars`] (the default), and `TflopsVsN` on a report without
/// seed-table rows, a grouped bar per case ([`plot_png`]).
pub fn plot_op(style: PlotStyle, report: &BenchReport, path: &Path, title: &str) -> Result<(), String> {
    match style {
        PlotStyle::TflopsVsN => {
            let seed = BenchReport {
                rows: report
                    .rows
                    .iter()
                    .filter(|r| is_attention_seed(&r.params))
                    .cloned()
                    .collect(),
                ..report.clone()
            };
            if !seed.rows.is_empty() {
                return plot_vs_n(&seed, path, &format!("{title}: causal fp16, B=1, H=32, D=128"));
            }
        }
        PlotStyle::Bars => {}
    }
    plot_png(report, path, Metric::infer(report), title)
}

/// `512`, `1K`, `32K`, `1M`: a power of two as a short label.
fn fmt_n(n: f64) -> String {
    if n >= 1048576.0 && n % 1048576.0 == 0.0 {
        format!("{}M", n / 1048576.0)
    } else if n >= 1024.0 && n % 1024.0 == 0.0 {
        format!("{}K", n / 1024.0)
    } else {
        format!("{n}")
    }
}

/// Line chart: x = `params.N` (log2 axis), y = TFLOP/s, one line per impl (ours first) through
/// the rows that have both, and a dashed line at the bf16 GEMM roofline when it is known.
pub fn plot_vs_n(report: &BenchReport, path: &Path, title: &str) -> Result<(), String> {
    use plotters::prelude::*;

    ensure_fonts()?;
    let n_of = |r: &BenchRow| r.params["N"].as_f64().filter(|n| *n >= 1.0);
    let log_ns: Vec<f64> = report.rows.iter().filter_map(n_of).map(f64::log2).collect();
    if log_ns.is_empty() {
        return Err("no rows with params.N to plot".into());
    }
    let series: Vec<(&str, Vec<(f64, f64)>)> = report
        .impls()
        .into_iter()
        .map(|imp| {
            let mut pts: Vec<(f64, f64)> = report
                .rows
                .iter()
                .filter(|r| r.r#impl == imp)
                .filter_map(|r| Some((n_of(r)?.log2(), r.tflops.filter(|v| v.is_finite())?)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (imp, pts)
        })
        .collect();
    let x0 = log_ns.iter().copied().fold(f64::INFINITY, f64::min) - 0.4;
    let x1 = log_ns.iter().copied().fold(f64::NEG_INFINITY, f64::max) + 0.4;
    let roof = report.roofline.bf16_tflops.filter(|r| r.is_finite() && *r > 0.0);
    let vmax = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.1))
        .chain(roof)
        .fold(0.0f64, f64::max);
    let ymax = if vmax > 0.0 { vmax * 1.3 } else { 1.0 };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }

    let draw_err = |e: &dyn std::fmt::Display| format!("cannot draw {}: {e}", path.display());
    let (width, height) = (1100u32, 700u32);
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(&e))?;
    let (main, footer) = root.split_vertically(height - 22);
    let mut chart = ChartBuilder::on(&main)
        .caption(title, (FONT_FAMILY, 24).into_font().style(FontStyle::Bold))
        .margin(14)
        .x_label_area_size(50)
        .y_label_area_size(72)
        .build_cartesian_2d(x0..x1, 0.0..ymax)
        .map_err(|e| draw_err(&e))?;
    let x_label = |x: &f64| {
        if (x - x.round()).abs() < 1e-6 {
            fmt_n(x.round().exp2())
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .x_labels((x1 - x0).ceil() as usize + 1)
        .x_label_formatter(&x_label)
        .y_labels(10)
        .y_label_formatter(&|y: &f64| format!("{y:.0}"))
        .x_desc("N (log scale)")
        .y_desc("TFLOP/s")
        .axis_desc_style((FONT_FAMILY, 16))
        .label_style((FONT_FAMILY, 14))
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.12))
        .draw()
        .map_err(|e| draw_err(&e))?;
    for (k, (imp, pts)) in series.iter().enumerate() {
        if pts.is_empty() {
            continue;
        }
        let color = series_color(k);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|e| draw_err(&e))?
            .label(*imp)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(3)));
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 4, color.filled())))
            .map_err(|e| draw_err(&e))?;
    }
    if let Some(r) = roof {
        chart
            .draw_series(DashedLineSeries::new([(x0, r), (x1, r)], 10, 6, BLACK.stroke_width(2)))
            .map_err(|e| draw_err(&e))?
            .label(format!("roofline: bf16 GEMM {} TFLOP/s", fmt_rate(r)))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK.stroke_width(2)));
    }
    finish_chart(&mut chart, SeriesLabelPosition::UpperLeft, &footer, report, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::report::fixtures::fake_report;
    use crate::report::json::{Roofline, OURS};
    use crate::report::table::format_table;

    #[test]
    fn png_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let report = fake_report();
        let path = dir.path().join("softmax.png");
        plot_png(&report, &path, Metric::Gbps, "softmax fp16, H200").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() > 1000);
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");

        // TFLOP/s metric with no roofline and no value at all still draws
        let mut r2 = report.clone();
        r2.roofline = Roofline::default();
        plot_png(&r2, &dir.path().join("t.png"), Metric::Tflops, "empty").unwrap();

        let mut empty = report;
        empty.rows.clear();
        assert!(plot_png(&empty, &dir.path().join("e.png"), Metric::Gbps, "x").is_err());
    }

    /// An attention report: the seed table for ours and three baselines (one failed, one
    /// missing at the largest N), plus a GQA case outside the seed table.
    fn fake_attention_report() -> BenchReport {
        let mut r = fake_report();
        r.command = "tessera bench attention --baselines".into();
        r.rows.clear();
        for n in [512u64, 1024, 2048, 4096, 8192, 16384, 32768] {
            let case = format!("causal fp16 B1 H32 N{n} D128");
            let params = json!({"B": 1, "Hq": 32, "Hkv": 32, "N": n, "D": 128, "causal": true,
                "dtype": "fp16", "varlen": false});
            let flops = 2.0 * 32.0 * (n * n) as f64 * 128.0;
            for (imp, tf) in [
                (OURS, 600.0),
                ("torch-cudnn", 520.0),
                ("flashinfer-fa3", 540.0),
                ("torch-math", 10.0),
            ] {
                let mut row = BenchRow::new(&case, params.clone(), imp);
                if imp == "torch-math" && n == 32768 {
                    row.missing = Some("torch-math runs only up to N = 16384".into());
                } else if imp == "flashinfer-fa3" && n == 512 {
                    row.error = Some("RuntimeError: boom".into());
                } else {
                    row.tflops = Some(tf * (1.0 - 256.0 / n as f64));
                    row.ms = Some(flops / (row.tflops.unwrap() * 1e12) * 1e3);
                }
                r.rows.push(row);
            }
        }
        let gqa = json!({"B": 4, "Hq": 32, "Hkv": 8, "N": 4096, "D": 128, "causal": true,
            "dtype": "bf16", "varlen": false});
        let mut row = BenchRow::new("gqa", gqa, "torch-cudnn");
        row.ms = Some(1.0);
        row.tflops = Some(400.0);
        r.rows.push(row);
        r
    }

    #[test]
    fn attention_table_and_line_chart() {
        let report = fake_attention_report();
        let t = format_table(&report, &["torch-cudnn", "torch-math", "flashinfer-fa3"]);
        let line = |case: &str| t.lines().find(|l| l.starts_with(case)).unwrap().to_string();
        assert!(line("causal fp16 B1 H32 N32768 D128").contains("missing"), "{t}");
        assert!(line("causal fp16 B1 H32 N512 D128").contains("failed"), "{t}");
        assert!(!line("causal fp16 B1 H32 N4096 D128").contains("missing"), "{t}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attention.png");
        plot_op(PlotStyle::TflopsVsN, &report, &path, "attention on NVIDIA H200").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // no seed-table rows: the bar chart
        let mut other = report.clone();
        other.rows.retain(|r| r.case == "gqa");
        plot_op(PlotStyle::TflopsVsN, &other, &dir.path().join("bars.png"), "x").unwrap();
        assert_eq!(Metric::infer(&other), Metric::Tflops);
        assert_eq!(fmt_n(32768.0), "32K");
        assert_eq!(fmt_n(512.0), "512");
    }
}
