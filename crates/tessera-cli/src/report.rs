//! Benchmark results: the JSON model of DESIGN.md ("Verification and benchmarks"), the console
//! table, the PNG chart, and the protocol with the Python baseline runners in
//! `scripts/baselines/` (`bench_torch.py` / `bench_attention.py --op OP --cases IN.json
//! --out OUT.json`, see `scripts/baselines/bench_common.py`).
//!
//! JSON shape (fields that do not apply are `null`):
//! `{"gpu", "date", "commit", "command", "roofline": {"copy_gbps", "bf16_tflops"},
//!   "rows": [{"case", "params", "impl", "ms", "tflops", "gbps", "extra_mib", "max_abs_err",
//!   "rel_l2"}], "verify": {"passed", "failed"}}`; a row with `ms: null` also says why in
//!   `"error"` (it failed) or `"missing"` (it cannot run here, or was skipped), and a row may
//!   carry a `"note"` on how it was measured; these three appear only when set.

// Not every command uses every helper.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// Impl name of our default dispatch; forced paths are `tessera-<path>`.
pub const OURS: &str = "tessera";

/// [`BenchReport::timing`] of the default rules: warmed up past the board's power cap.
pub const TIMING_SUSTAINED: &str = "sustained";
/// [`BenchReport::timing`] of `bench --burst`: short bursts from a rested board.
pub const TIMING_BURST: &str = "burst";

/// One line on what a timing mode measures, for the bench's first line.
pub fn describe_timing(timing: &str) -> &'static str {
    if timing == TIMING_BURST {
        "burst (2 s idle, 20 ms warm-up, 7 groups of ~2 ms: boost clocks, before the power cap acts)"
    } else {
        "sustained (500 ms warm-up first: the clocks the power cap leaves under steady load)"
    }
}

fn timing_sustained() -> String {
    TIMING_SUSTAINED.to_string()
}

/// One benchmark run of one operator family: what `bench/results/<gpu>/<op>.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    pub gpu: String,
    /// UTC, ISO 8601 (`2025-01-31T12:34:56Z`).
    pub date: String,
    pub commit: String,
    /// The command line that produced the report.
    pub command: String,
    /// How ours and the baselines were timed: [`TIMING_SUSTAINED`] (the default) or
    /// [`TIMING_BURST`] (`bench --burst`). Reports written before the field existed were
    /// sustained.
    #[serde(default = "timing_sustained")]
    pub timing: String,
    pub roofline: Roofline,
    pub rows: Vec<BenchRow>,
    pub verify: VerifySummary,
}

/// Measured at the start of every bench run: a 1 GiB device-to-device copy (GB/s counting read
/// plus write) and a cuBLAS bf16 8192^3 GEMM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Roofline {
    pub copy_gbps: Option<f64>,
    pub bf16_tflops: Option<f64>,
}

/// Checks of our rows against the reference: with `bench --rounds N`, every round's (so N per
/// case).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifySummary {
    pub passed: usize,
    pub failed: usize,
}

/// One (case, impl) measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    pub case: String,
    /// Shape as numbers plus flags, e.g. `{"rows": 4096, "cols": 32768, "dtype": "fp16"}`.
    pub params: serde_json::Value,
    /// `tessera`, `tessera-<path>`, or the baseline's name (`torch`, `cublas`, ...).
    #[serde(rename = "impl")]
    pub r#impl: String,
    pub ms: Option<f64>,
    pub tflops: Option<f64>,
    pub gbps: Option<f64>,
    pub extra_mib: Option<f64>,
    pub max_abs_err: Option<f64>,
    pub rel_l2: Option<f64>,
    /// Why the row failed (`ms` is `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why the impl has no number here: not installed, not supported, skipped (`ms` is `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
    /// How the number was obtained, when that is not the obvious way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// With `bench --rounds N` (N > 1): every round's `ms`, in round order (`None` where that
    /// round failed); the row's own fields are those of the round with the median time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds_ms: Option<Vec<Option<f64>>>,
}

impl BenchRow {
    /// A row with every measurement `None`.
    pub fn new(case: impl Into<String>, params: serde_json::Value, imp: impl Into<String>) -> Self {
        BenchRow {
            case: case.into(),
            params,
            r#impl: imp.into(),
            ms: None,
            tflops: None,
            gbps: None,
            extra_mib: None,
            max_abs_err: None,
            rel_l2: None,
            error: None,
            missing: None,
            note: None,
            rounds_ms: None,
        }
    }
}

/// Merges the rows of several rounds of one operator's benchmark (ours and the baselines, each
/// round in the same order) into one row per (case, impl), in the order of first appearance:
/// the row of the round with the median time (the lower middle one for an even count of
/// measured rounds), with every round's time in `rounds_ms`. A (case, impl) that no round
/// measured keeps its first round's row (its error or missing reason). One round: unchanged.
pub fn merge_rounds(rounds: Vec<Vec<BenchRow>>) -> Vec<BenchRow> {
    let n = rounds.len();
    if n <= 1 {
        return rounds.into_iter().next().unwrap_or_default();
    }
    let mut keys: Vec<(String, String)> = Vec::new();
    let mut per_key: std::collections::HashMap<(String, String), Vec<Option<BenchRow>>> =
        std::collections::HashMap::new();
    for (r, rows) in rounds.into_iter().enumerate() {
        for row in rows {
            let key = (row.case.clone(), row.r#impl.clone());
            let slots = per_key.entry(key.clone()).or_insert_with(|| {
                keys.push(key);
                vec![None; n]
            });
            if slots[r].is_none() {
                slots[r] = Some(row);
            }
        }
    }
    keys.into_iter()
        .filter_map(|key| {
            let slots = per_key.remove(&key)?;
            let times: Vec<Option<f64>> = slots.iter().map(|s| s.as_ref().and_then(|r| r.ms)).collect();
            let mut measured: Vec<(f64, usize)> = times
                .iter()
                .enumerate()
                .filter_map(|(i, t)| t.map(|t| (t, i)))
                .collect();
            measured.sort_by(|a, b| a.0.total_cmp(&b.0));
            let pick = match measured.get(measured.len().saturating_sub(1) / 2) {
                Some(&(_, i)) => i,
                None => slots.iter().position(|s| s.is_some()).unwrap_or(0),
            };
            let mut row = slots.into_iter().nth(pick).flatten()?;
            row.rounds_ms = Some(times);
            Some(row)
        })
        .collect()
}

impl BenchReport {
    /// An empty report stamped with the current UTC date and [`detect_commit`].
    pub fn new(gpu: impl Into<String>, command: impl Into<String>) -> Self {
        BenchReport {
            gpu: gpu.into(),
            date: utc_now_iso8601(),
            commit: detect_commit(),
            command: command.into(),
            timing: timing_sustained(),
            roofline: Roofline::default(),
            rows: Vec::new(),
            verify: VerifySummary::default(),
        }
    }

    /// Pretty JSON, written atomically (temp file + rename); parent folders are created.
    pub fn write_json(&self, path: &Path) -> Result<(), String> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let mut text = serde_json::to_string_pretty(self).map_err(|e| format!("cannot serialise the report: {e}"))?;
        text.push('\n');
        let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
        std::fs::write(&tmp, text).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("cannot write {}: {e}", path.display())
        })
    }

    /// Reads a report back (the tests' round trip; a future `tessera report` command).
    #[cfg(test)]
    pub fn read_json(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: not a bench report: {e}", path.display()))
    }

    /// Case names in order of first appearance.
    pub fn cases(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for r in &self.rows {
            if !out.contains(&r.case.as_str()) {
                out.push(&r.case);
            }
        }
        out
    }

    /// Impl names, ours (`tessera`, then `tessera-*`) first, then in order of first appearance.
    pub fn impls(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for r in &self.rows {
            if !out.contains(&r.r#impl.as_str()) {
                out.push(&r.r#impl);
            }
        }
        out.sort_by_key(|i| match *i {
            OURS => 0,
            i if i.starts_with("tessera-") => 1,
            _ => 2,
        });
        out
    }

    pub fn row(&self, case: &str, imp: &str) -> Option<&BenchRow> {
        self.rows.iter().find(|r| r.case == case && r.r#impl == imp)
    }

    /// Our row for a case: `tessera`, else the first `tessera-*` one.
    pub fn ours(&self, case: &str) -> Option<&BenchRow> {
        self.row(case, OURS).or_else(|| {
            self.rows
                .iter()
                .find(|r| r.case == case && r.r#impl.starts_with("tessera-"))
        })
    }
}

/// What a chart's y axis (and the roofline) measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Memory-bound ops; roofline = `copy_gbps`.
    Gbps,
    /// Compute-bound ops; roofline = `bf16_tflops`.
    Tflops,
}

impl Metric {
    pub fn of(self, row: &BenchRow) -> Option<f64> {
        match self {
            Metric::Gbps => row.gbps,
            Metric::Tflops => row.tflops,
        }
    }

    pub fn roofline(self, roofline: &Roofline) -> Option<f64> {
        match self {
            Metric::Gbps => roofline.copy_gbps,
            Metric::Tflops => roofline.bf16_tflops,
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Metric::Gbps => "GB/s",
            Metric::Tflops => "TFLOP/s",
        }
    }

    /// `Tflops` when our rows (every row when there is none of ours) carry more TFLOP/s than
    /// GB/s, else `Gbps`.
    pub fn infer(report: &BenchReport) -> Metric {
        let has_ours = report.rows.iter().any(|r| r.r#impl.starts_with(OURS));
        let ours = report.rows.iter().filter(|r| !has_ours || r.r#impl.starts_with(OURS));
        let (mut g, mut t) = (0, 0);
        for r in ours {
            g += r.gbps.is_some() as usize;
            t += r.tflops.is_some() as usize;
        }
        if t > g {
            Metric::Tflops
        } else {
            Metric::Gbps
        }
    }
}

// ------------------------------------------------------------------------------------------
// console table

fn fmt_ms(ms: f64) -> String {
    if ms < 0.1 {
        format!("{ms:.4}")
    } else if ms < 10.0 {
        format!("{ms:.3}")
    } else {
        format!("{ms:.2}")
    }
}

fn fmt_rate(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}")
    } else if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// Our throughput and % of roofline for a row: GB/s when it has one, else TFLOP/s.
fn rate_and_roof(row: &BenchRow, roofline: &Roofline) -> (String, String) {
    let metric = if row.gbps.is_some() {
        Metric::Gbps
    } else if row.tflops.is_some() {
        Metric::Tflops
    } else {
        return ("-".into(), "-".into());
    };
    let v = metric.of(row).unwrap_or(f64::NAN);
    let rate = format!("{} {}", fmt_rate(v), metric.unit());
    let roof = match metric.roofline(roofline) {
        Some(r) if r > 0.0 => format!("{:.0}%", 100.0 * v / r),
        _ => "-".into(),
    };
    (rate, roof)
}

/// The table of [`print_table`] as a string.
pub fn format_table(report: &BenchReport, baseline_impls: &[&str]) -> String {
    let mut header: Vec<String> = ["case", "ms", "rate", "roof"].iter().map(|s| s.to_string()).collect();
    for b in baseline_impls {
        header.push(format!("{b} ms"));
        header.push(format!("vs {b}"));
    }
    let mut lines: Vec<Vec<String>> = vec![header];
    for case in report.cases() {
        let mut line = vec![case.to_string()];
        let ours = report.ours(case);
        let our_ms = ours.and_then(|r| r.ms);
        match ours {
            Some(r) => {
                line.push(r.ms.map_or("failed".into(), fmt_ms));
                let (rate, roof) = rate_and_roof(r, &report.roofline);
                line.push(rate);
                line.push(roof);
            }
            None => line.extend(["missing".into(), "-".into(), "-".into()]),
        }
        for b in baseline_impls {
            match report.row(case, b) {
                None => line.extend(["missing".into(), "-".into()]),
                Some(r) => match r.ms {
                    None if r.missing.is_some() => line.extend(["missing".into(), "-".into()]),
                    None => line.extend(["failed".into(), "-".into()]),
                    Some(bms) => {
                        line.push(fmt_ms(bms));
                        line.push(match our_ms {
                            Some(o) if o > 0.0 => format!("{:.2}x", bms / o),
                            _ => "-".into(),
                        });
                    }
                },
            }
        }
        lines.push(line);
    }

    let ncol = lines[0].len();
    let widths: Vec<usize> = (0..ncol)
        .map(|c| lines.iter().map(|l| l[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    let rl = &report.roofline;
    let _ = writeln!(
        out,
        "{} | roofline: copy {} GB/s, bf16 {} TFLOP/s | ratio = baseline ms / our ms (>1: we are faster)",
        report.gpu,
        rl.copy_gbps.map_or("-".into(), fmt_rate),
        rl.bf16_tflops.map_or("-".into(), fmt_rate),
    );
    for (i, l) in lines.iter().enumerate() {
        let cells: Vec<String> = l
            .iter()
            .enumerate()
            .map(|(c, s)| {
                if c == 0 {
                    format!("{s:<w$}", w = widths[c])
                } else {
                    format!("{s:>w$}", w = widths[c])
                }
            })
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
        if i == 0 {
            let total = widths.iter().sum::<usize>() + 2 * (ncol - 1);
            let _ = writeln!(out, "{}", "-".repeat(total));
        }
    }
    out
}

/// Prints one line per case: case, our ms, our GB/s (or TFLOP/s), % of roofline, then for each
/// baseline impl its ms and the ratio baseline_ms / our_ms (>1 means we are faster), or
/// `missing` when the baseline has no row for the case or says why it has no number, or
/// `failed`.
pub fn print_table(report: &BenchReport, baseline_impls: &[&str]) {
    print!("{}", format_table(report, baseline_impls));
}

// ------------------------------------------------------------------------------------------
// PNG chart

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

/// The chart `tessera bench --json` writes for an operator: attention plots TFLOP/s against N
/// for its seed table, one line per impl ([`plot_vs_n`]); other operators, and attention runs
/// without seed-table rows, a grouped bar per case ([`plot_png`]).
pub fn plot_op(op: &str, report: &BenchReport, path: &Path, title: &str) -> Result<(), String> {
    if op == "attention" {
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

// ------------------------------------------------------------------------------------------
// run metadata

/// Current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now_iso8601() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // civil-from-days (H. Hinnant)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// The commit the binary was built from: `$TESSERA_COMMIT` (device-run.sh sets it from
/// `.bundle/COMMIT`), else `COMMIT` in the bundle folder above the executable
/// (`.bundle/bin/tessera` -> `.bundle/COMMIT`), else `git rev-parse HEAD`, else `unknown`.
pub fn detect_commit() -> String {
    if let Ok(c) = std::env::var("TESSERA_COMMIT") {
        if !c.trim().is_empty() {
            return c.trim().to_string();
        }
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(Path::to_path_buf))
    {
        if let Ok(c) = std::fs::read_to_string(dir.join("COMMIT")) {
            if !c.trim().is_empty() {
                return c.trim().to_string();
            }
        }
    }
    Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

// ------------------------------------------------------------------------------------------
// Python baselines

/// Where a baseline script lives: `$TESSERA_BASELINES_DIR/<name>` (device-run.sh sets it to
/// `.bundle/baselines`), else `baselines/<name>` in the bundle folder above the executable,
/// else `scripts/baselines/<name>` under the current directory.
pub fn baseline_script(name: &str) -> PathBuf {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("TESSERA_BASELINES_DIR") {
        candidates.push(PathBuf::from(d).join(name));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(Path::to_path_buf))
    {
        candidates.push(dir.join("baselines").join(name));
    }
    let fallback = PathBuf::from("scripts/baselines").join(name);
    candidates.into_iter().find(|p| p.is_file()).unwrap_or(fallback)
}

/// Result of one baseline runner invocation.
#[derive(Debug, Clone, PartialEq)]
pub enum BaselineOutcome {
    /// Rows as measured (a failed case has `ms: None`).
    Rows(Vec<BenchRow>),
    /// The baseline cannot run here (torch/CUDA missing, script failed, ...): why.
    Missing(String),
}

/// Parses what a baseline runner wrote: `{"rows": [...]}`, a bare list of rows, or
/// `{"missing": "reason"}`.
pub fn parse_baseline_output(text: &str) -> BaselineOutcome {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Out {
        Missing { missing: String },
        Rows { rows: Vec<BenchRow> },
        List(Vec<BenchRow>),
    }
    match serde_json::from_str::<Out>(text) {
        Ok(Out::Missing { missing }) => BaselineOutcome::Missing(missing),
        Ok(Out::Rows { rows }) | Ok(Out::List(rows)) => BaselineOutcome::Rows(rows),
        Err(e) => BaselineOutcome::Missing(format!("unreadable baseline output: {e}")),
    }
}

/// Runs `python3 SCRIPT --op OP --cases IN.json --out OUT.json` (python from `$TESSERA_PYTHON`,
/// default `python3`) with `cases` as `[{"case", "params"}]` and `TESSERA_BENCH_TIMING=timing`
/// (the runner times as ours does: `scripts/baselines/bench_common.py`); the script's stderr
/// (one line per case) passes through to ours. Never fails: anything that goes wrong becomes
/// `Missing`.
pub fn run_python_baseline(
    script: &Path,
    op: &str,
    cases: &[(String, serde_json::Value)],
    timing: &str,
) -> BaselineOutcome {
    if !script.is_file() {
        return BaselineOutcome::Missing(format!("{} not found", script.display()));
    }
    let python = std::env::var("TESSERA_PYTHON").unwrap_or_else(|_| "python3".into());
    let stamp = format!(
        "tessera-baseline-{}-{}-{}",
        std::process::id(),
        op,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let dir = std::env::temp_dir();
    let cases_path = dir.join(format!("{stamp}-cases.json"));
    let out_path = dir.join(format!("{stamp}-out.json"));
    let list: Vec<serde_json::Value> = cases
        .iter()
        .map(|(c, p)| serde_json::json!({"case": c, "params": p}))
        .collect();
    let result = (|| {
        std::fs::write(&cases_path, serde_json::to_string(&list).map_err(|e| e.to_string())?)
            .map_err(|e| format!("cannot write {}: {e}", cases_path.display()))?;
        let status = Command::new(&python)
            .arg(script)
            .args(["--op", op, "--cases"])
            .arg(&cases_path)
            .arg("--out")
            .arg(&out_path)
            .env("PYTHONUNBUFFERED", "1")
            .env("TESSERA_BENCH_TIMING", timing)
            .stdin(std::process::Stdio::null())
            .status()
            .map_err(|e| format!("cannot run {python}: {e}"))?;
        let text = std::fs::read_to_string(&out_path);
        match (status.success(), text) {
            (_, Ok(t)) => Ok(parse_baseline_output(&t)),
            (false, Err(_)) => Err(format!("{} exited with {status}", script.display())),
            (true, Err(e)) => Err(format!("{} wrote no output: {e}", script.display())),
        }
    })();
    let _ = std::fs::remove_file(&cases_path);
    let _ = std::fs::remove_file(&out_path);
    result.unwrap_or_else(BaselineOutcome::Missing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fake_report() -> BenchReport {
        let mut r = BenchReport {
            gpu: "NVIDIA H200".into(),
            date: "2025-01-31T12:00:00Z".into(),
            commit: "0123456789abcdef".into(),
            command: "tessera bench softmax --baselines".into(),
            timing: TIMING_SUSTAINED.into(),
            roofline: Roofline {
                copy_gbps: Some(4100.0),
                bf16_tflops: Some(720.0),
            },
            rows: Vec::new(),
            verify: VerifySummary { passed: 12, failed: 0 },
        };
        let shapes = [(32768, 128), (32768, 1024), (16384, 4096), (4096, 32768)];
        for (i, (rows, cols)) in shapes.iter().enumerate() {
            let case = format!("{rows}x{cols} fp16");
            let params = json!({"rows": rows, "cols": cols, "dtype": "fp16", "op": "softmax"});
            let bytes = (rows * cols * 2) as f64;
            let mut ours = BenchRow::new(&case, params.clone(), OURS);
            ours.ms = Some(2.0 * bytes / 3.0e12 * 1e3);
            ours.gbps = Some(3000.0 - 100.0 * i as f64);
            ours.max_abs_err = Some(1e-4);
            ours.rel_l2 = Some(3e-4);
            r.rows.push(ours);
            if i != 2 {
                // torch missing for one case
                let mut t = BenchRow::new(&case, params, "torch");
                t.ms = Some(2.0 * bytes / 2.0e12 * 1e3);
                t.gbps = Some(2000.0);
                r.rows.push(t);
            }
        }
        r
    }

    #[test]
    fn json_round_trip_and_shape() {
        let dir = tempfile::tempdir().unwrap();
        let report = fake_report();
        let path = dir.path().join("h200/softmax.json");
        report.write_json(&path).unwrap();
        let back = BenchReport::read_json(&path).unwrap();
        assert_eq!(back, report);

        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let row = &v["rows"][0];
        assert_eq!(row["impl"], "tessera");
        assert!(row["tflops"].is_null() && row["extra_mib"].is_null());
        for key in [
            "case",
            "params",
            "impl",
            "ms",
            "tflops",
            "gbps",
            "extra_mib",
            "max_abs_err",
            "rel_l2",
        ] {
            assert!(row.get(key).is_some(), "row lacks {key}");
        }
        for key in ["gpu", "date", "commit", "command", "roofline", "rows", "verify"] {
            assert!(v.get(key).is_some(), "report lacks {key}");
        }
        assert_eq!(v["roofline"]["copy_gbps"], 4100.0);
        assert_eq!(v["verify"]["passed"], 12);
        assert_eq!(v["timing"], TIMING_SUSTAINED);

        // Reports written before the timing field were timed in the sustained state.
        let mut old = v.clone();
        old.as_object_mut().unwrap().remove("timing");
        let old: BenchReport = serde_json::from_value(old).unwrap();
        assert_eq!(old.timing, TIMING_SUSTAINED);
        assert!(describe_timing(TIMING_BURST).starts_with("burst"));
    }

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

    #[test]
    fn table_has_ratio_and_missing() {
        let report = fake_report();
        let t = format_table(&report, &["torch", "flashinfer"]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3 + 4, "{t}");
        assert!(lines[3].starts_with("32768x128 fp16"), "{t}");
        assert!(lines[3].contains("1.50x"), "{t}");
        assert!(lines[3].contains("73%"), "{t}"); // 3000 / 4100
        assert!(lines[5].contains("missing"), "{t}"); // torch absent for case 3
        assert!(t.contains("flashinfer ms"));
    }

    #[test]
    fn baseline_output_parses() {
        match parse_baseline_output(r#"{"missing": "torch not importable"}"#) {
            BaselineOutcome::Missing(m) => assert!(m.contains("torch")),
            o => panic!("{o:?}"),
        }
        let text = r#"{"torch": "2.11", "rows": [{"case": "a", "params": {"rows": 1},
            "impl": "torch", "ms": 0.5, "tflops": null, "gbps": 10.0, "extra_mib": null,
            "max_abs_err": null, "rel_l2": null, "error": null}]}"#;
        match parse_baseline_output(text) {
            BaselineOutcome::Rows(rows) => {
                assert_eq!(rows.len(), 1);
                assert_eq!(rows[0].r#impl, "torch");
                assert_eq!(rows[0].ms, Some(0.5));
            }
            o => panic!("{o:?}"),
        }
        assert!(matches!(parse_baseline_output("nope"), BaselineOutcome::Missing(_)));
    }

    #[test]
    fn runners_without_gpu_report_missing() {
        // CI has python3 but no GPU (and usually no torch): the runner must say "missing"
        if Command::new("python3").arg("--version").output().is_err() {
            eprintln!("python3 not found: skipped");
            return;
        }
        let softmax = (
            "64x128 fp16".to_string(),
            json!({"rows": 64, "cols": 128, "dtype": "fp16", "op": "softmax"}),
        );
        let attention = (
            "causal fp16 B1 H32 N1024 D128".to_string(),
            json!({"B": 1, "Hq": 32, "Hkv": 32, "N": 1024, "D": 128, "causal": true,
                "dtype": "fp16", "varlen": false}),
        );
        for (op, case) in [("softmax", &softmax), ("attention", &attention)] {
            let script = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../scripts/baselines")
                .join(crate::ops::baseline_script(op));
            match run_python_baseline(&script, op, std::slice::from_ref(case), TIMING_SUSTAINED) {
                BaselineOutcome::Missing(m) => assert!(
                    m.contains("torch not importable") || m.contains("CUDA not available"),
                    "{op}: {m}"
                ),
                BaselineOutcome::Rows(r) => panic!("a GPU here? {r:?}"),
            }
        }
        let absent = run_python_baseline(Path::new("/nonexistent/x.py"), "softmax", &[softmax], TIMING_SUSTAINED);
        assert!(matches!(absent, BaselineOutcome::Missing(_)));
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
        plot_op("attention", &report, &path, "attention on NVIDIA H200").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // no seed-table rows: the bar chart
        let mut other = report.clone();
        other.rows.retain(|r| r.case == "gqa");
        plot_op("attention", &other, &dir.path().join("bars.png"), "x").unwrap();
        assert_eq!(Metric::infer(&other), Metric::Tflops);
        assert_eq!(fmt_n(32768.0), "32K");
        assert_eq!(fmt_n(512.0), "512");
    }

    #[test]
    fn row_reasons_round_trip_and_stay_out_when_unset() {
        let text = r#"{"rows": [{"case": "a", "params": {}, "impl": "torch-math", "ms": null,
            "tflops": null, "gbps": null, "extra_mib": null, "max_abs_err": null, "rel_l2": null,
            "missing": "too big"}, {"case": "a", "params": {}, "impl": "torch-flash", "ms": 1.0,
            "tflops": 2.0, "gbps": null, "extra_mib": 3.0, "max_abs_err": null, "rel_l2": null,
            "note": "one sequence at a time"}], "flashinfer_jit": []}"#;
        let BaselineOutcome::Rows(rows) = parse_baseline_output(text) else {
            panic!("not rows")
        };
        assert_eq!(rows[0].missing.as_deref(), Some("too big"));
        assert_eq!(rows[1].note.as_deref(), Some("one sequence at a time"));
        assert!(rows[1].error.is_none());
        let v = serde_json::to_value(&rows[1]).unwrap();
        assert!(v.get("error").is_none() && v.get("missing").is_none() && v.get("note").is_some());
    }

    /// Runs a baseline runner's own test script (fake torch/flashinfer, no GPU needed).
    fn run_python_runner_test(script: &str) {
        if Command::new("python3").arg("--version").output().is_err() {
            eprintln!("python3 not found: skipped");
            return;
        }
        let test = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../scripts/baselines")
            .join(script);
        let out = Command::new("python3").arg(&test).output().unwrap();
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn attention_runner_logic_with_fake_torch() {
        run_python_runner_test("test_bench_attention.py");
    }

    #[test]
    fn kvcache_runner_logic_with_fake_torch() {
        run_python_runner_test("test_bench_kvcache.py");
    }

    #[test]
    fn date_format() {
        let d = utc_now_iso8601();
        assert_eq!(d.len(), 20, "{d}");
        assert!(d.starts_with("20") && d.ends_with('Z'), "{d}");
    }

    fn timed(case: &str, imp: &str, ms: Option<f64>) -> BenchRow {
        let mut r = BenchRow::new(case, serde_json::json!({}), imp);
        r.ms = ms;
        r.tflops = ms.map(|m| 100.0 / m);
        if ms.is_none() {
            r.error = Some(format!("{imp} failed"));
        }
        r
    }

    #[test]
    fn one_round_is_left_as_it_is() {
        let rows = vec![timed("a", "tessera", Some(1.0)), timed("a", "torch", Some(2.0))];
        assert_eq!(merge_rounds(vec![rows.clone()]), rows);
        assert!(merge_rounds(Vec::new()).is_empty());
    }

    #[test]
    fn rounds_merge_to_the_median_rounds_row_in_first_appearance_order() {
        let rounds = vec![
            vec![timed("a", "tessera", Some(1.0)), timed("a", "torch", Some(2.4))],
            vec![
                timed("a", "tessera", Some(1.2)),
                timed("b", "tessera", Some(5.0)),
                timed("a", "torch", Some(2.0)),
            ],
            vec![timed("a", "tessera", Some(1.1)), timed("a", "torch", None)],
        ];
        let merged = merge_rounds(rounds);
        let keys: Vec<(&str, &str)> = merged.iter().map(|r| (r.case.as_str(), r.r#impl.as_str())).collect();
        assert_eq!(keys, [("a", "tessera"), ("a", "torch"), ("b", "tessera")]);
        // ours: 1.0, 1.2, 1.1 -> the round of 1.1, with that round's other fields.
        assert_eq!(merged[0].ms, Some(1.1));
        assert_eq!(merged[0].tflops, Some(100.0 / 1.1));
        assert_eq!(merged[0].rounds_ms, Some(vec![Some(1.0), Some(1.2), Some(1.1)]));
        // torch measured twice (2.4, 2.0; failed once): the lower middle, 2.0; no error carried.
        assert_eq!(merged[1].ms, Some(2.0));
        assert_eq!(merged[1].error, None);
        assert_eq!(merged[1].rounds_ms, Some(vec![Some(2.4), Some(2.0), None]));
        // b only in round 2.
        assert_eq!(merged[2].ms, Some(5.0));
        assert_eq!(merged[2].rounds_ms, Some(vec![None, Some(5.0), None]));
    }

    #[test]
    fn a_row_no_round_measured_keeps_its_reason() {
        let rounds = vec![vec![timed("a", "torch", None)], vec![timed("a", "torch", None)]];
        let merged = merge_rounds(rounds);
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0].ms, None);
        assert_eq!(merged[0].error.as_deref(), Some("torch failed"));
        assert_eq!(merged[0].rounds_ms, Some(vec![None, None]));
        let json = serde_json::to_string(&merged[0]).unwrap();
        assert!(json.contains("\"rounds_ms\":[null,null]"), "{json}");
        let single = serde_json::to_string(&timed("a", "torch", Some(1.0))).unwrap();
        assert!(!single.contains("rounds_ms"), "{single}");
    }
}
