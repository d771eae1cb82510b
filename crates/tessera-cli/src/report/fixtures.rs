//! What the tests of the report's parts share: a softmax report, ours and torch, torch missing
//! for one case.

use serde_json::json;

use super::json::{BenchReport, BenchRow, Roofline, VerifySummary, OURS, TIMING_SUSTAINED};

pub fn fake_report() -> BenchReport {
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
