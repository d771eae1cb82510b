//! The benchmark report model, as `bench/results/<gpu>/<op>.json` holds it: reports and rows,
//! their JSON write and read, the merge of `bench --rounds N`, and the date and commit a report
//! is stamped with.
//!
//! JSON shape (fields that do not apply are `null`):
//! `{"gpu", "date", "commit", "command", "roofline": {"copy_gbps", "bf16_tflops"},
//!   "rows": [{"case", "params", "impl", "ms", "tflops", "gbps", "extra_mib", "max_abs_err",
//!   "rel_l2"}], "verify": {"passed", "failed"}}`; a row with `ms: null` also says why in
//!   `"error"` (it failed) or `"missing"` (it cannot run here, or was skipped), and a row may
//!   carry a `"note"` on how it was measured; these three appear only when set.

use std::path::Path;
use std::process::Command;

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

/// Merges the reports of one operator's filtered runs on one GPU (`tessera report`) into one:
/// rows in order, a later report's (case, impl) row replacing an earlier one (inside one
/// report the first of a repeated (case, impl) stands); the latest date;
/// the commit when all agree (else every distinct one, comma separated); the commands joined
/// by "; "; the first report's roofline; the verify counts summed. Reports of different GPUs
/// or timing modes are not comparable side by side and are refused.
pub fn merge_reports(parts: Vec<BenchReport>) -> Result<BenchReport, String> {
    let mut parts = parts.into_iter();
    let mut out = parts.next().ok_or("no reports to merge")?;
    let mut commits = vec![out.commit.clone()];
    let mut seen = std::collections::HashSet::new();
    out.rows.retain(|r| seen.insert((r.case.clone(), r.r#impl.clone())));
    for p in parts {
        if p.gpu != out.gpu {
            return Err(format!(
                "cannot merge reports of different GPUs ({} and {}): their numbers are not comparable",
                out.gpu, p.gpu
            ));
        }
        if p.timing != out.timing {
            return Err(format!(
                "cannot merge {} and {} timing: run the parts in one timing mode",
                out.timing, p.timing
            ));
        }
        if p.date > out.date {
            out.date = p.date;
        }
        if !commits.contains(&p.commit) {
            commits.push(p.commit);
        }
        out.command = format!("{}; {}", out.command, p.command);
        out.verify.passed += p.verify.passed;
        out.verify.failed += p.verify.failed;
        let mut seen = std::collections::HashSet::new();
        for row in p.rows {
            if !seen.insert((row.case.clone(), row.r#impl.clone())) {
                continue; // a repeat inside one report: its first row stands
            }
            match out
                .rows
                .iter_mut()
                .find(|r| r.case == row.case && r.r#impl == row.r#impl)
            {
                Some(old) => *old = row,
                None => out.rows.push(row),
            }
        }
    }
    out.commit = commits.join(", ");
    Ok(out)
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

    /// Reads a report back (`tessera report`, the tests' round trip).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::fake_report;

    #[test]
    fn merged_reports_keep_order_replace_repeats_and_refuse_other_gpus() {
        let a = fake_report();
        let mut b = fake_report();
        b.date = "2999-01-01T00:00:00Z".into();
        b.commit = "other".into();
        b.rows[0].ms = Some(123.0);
        let extra = BenchRow::new("extra case", serde_json::json!({}), OURS);
        b.rows.push(extra.clone());
        let mut repeat = b.rows[0].clone();
        repeat.ms = Some(456.0);
        b.rows.push(repeat);
        let m = merge_reports(vec![a.clone(), b.clone()]).unwrap();
        assert_eq!(m.rows.len(), a.rows.len() + 1);
        assert_eq!(m.rows[0].ms, Some(123.0));
        assert_eq!(m.rows.last(), Some(&extra));
        assert_eq!(m.date, b.date);
        assert_eq!(m.commit, format!("{}, other", a.commit));
        assert_eq!(m.verify.passed, a.verify.passed + b.verify.passed);
        let mut c = fake_report();
        c.gpu = "another GPU".into();
        assert!(merge_reports(vec![a.clone(), c])
            .unwrap_err()
            .contains("different GPUs"));
        let mut d = fake_report();
        d.timing = TIMING_BURST.into();
        assert!(merge_reports(vec![a, d]).is_err());
        assert!(merge_reports(vec![]).is_err());
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
