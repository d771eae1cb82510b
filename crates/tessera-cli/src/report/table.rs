//! The console table of a bench report: per case our time, rate and share of the roofline, then
//! each baseline's time and its ratio to ours.

use std::fmt::Write as _;

use super::json::{BenchReport, BenchRow, Metric, Roofline};

fn fmt_ms(ms: f64) -> String {
    if ms < 0.1 {
        format!("{ms:.4}")
    } else if ms < 10.0 {
        format!("{ms:.3}")
    } else {
        format!("{ms:.2}")
    }
}

pub(super) fn fmt_rate(v: f64) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::fake_report;

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
}
