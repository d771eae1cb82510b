//! `tessera verify softmax`: every path and dtype against the f64 reference, on fresh seeded
//! inputs with outliers, padded rows, special rows (all `-inf`, NaN, `+inf`, huge finite
//! logits), in place, mixed
//! dtypes and huge rows. Outputs are poisoned (NaN) first and the padding of output rows must
//! come back untouched.

use serde_json::json;

use super::reference::softmax_reference;
use super::{SoftmaxKind, SoftmaxOptions, SoftmaxPath, SoftmaxPlan, SoftmaxShape, SoftmaxTuning};
use crate::check::{compare, Comparison};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::harness::VerifyOutcome;
use crate::runtime::Context;
use crate::testdata::{random_matrix, Dist};

/// One verification case.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    pub rows: usize,
    pub cols: usize,
    pub in_stride: usize,
    pub out_stride: usize,
    pub in_dtype: DType,
    pub out_dtype: DType,
    pub kind: SoftmaxKind,
    pub scale: f32,
    pub path: SoftmaxPath,
    pub in_place: bool,
    /// Plant an all `-inf` row, a row with one NaN and a row with one `+inf` (needs rows >= 3),
    /// and with rows >= 4 a row of huge finite logits where the input dtype holds them (see
    /// [`case_input`]).
    pub special_rows: bool,
}

impl Case {
    /// A softmax case over `rows` x `cols` (row stride `stride`, one dtype in and out, scale 1,
    /// out of place) with the special rows planted: the long-row schedule cases.
    fn long_rows(rows: usize, cols: usize, stride: usize, dtype: DType, path: SoftmaxPath) -> Case {
        Case {
            rows,
            cols,
            in_stride: stride,
            out_stride: stride,
            in_dtype: dtype,
            out_dtype: dtype,
            kind: SoftmaxKind::Softmax,
            scale: 1.0,
            path,
            in_place: false,
            special_rows: true,
        }
    }

    pub fn name(&self) -> String {
        let mut s = format!(
            "{} {}->{} {}x{}",
            self.kind.name(),
            self.in_dtype,
            self.out_dtype,
            self.rows,
            self.cols
        );
        if self.in_stride != self.cols || self.out_stride != self.cols {
            s += &format!(" stride {}/{}", self.in_stride, self.out_stride);
        }
        s += &format!(" {}", self.path.name());
        if self.scale != 1.0 {
            s += &format!(" scale {}", self.scale);
        }
        if self.in_place {
            s += " in-place";
        }
        if self.special_rows {
            s += " special-rows";
        }
        s
    }

    fn params(&self) -> serde_json::Value {
        json!({
            "rows": self.rows, "cols": self.cols, "in_stride": self.in_stride, "out_stride": self.out_stride,
            "dtype": self.in_dtype.name(), "out_dtype": self.out_dtype.name(), "op": self.kind.name(),
            "scale": self.scale, "path": self.path.name(), "in_place": self.in_place, "special_rows": self.special_rows,
        })
    }
}

/// Longest row forced onto the shared-memory path in verification: its f32 cache fits the
/// smallest opt-in shared memory of the supported GPUs.
const CACHED_PORTABLE_MAX_COLS: usize = 40_000;

/// The odd column counts of the issue, plus warp-path boundaries.
const ODD_COLS: [usize; 9] = [1, 7, 33, 128, 1000, 1024, 1025, 4097, 100003];

/// The verification matrix. `quick` keeps one case per (path, dtype) at small sizes, for
/// compute-sanitizer runs.
pub fn cases(quick: bool) -> Vec<Case> {
    let same = [DType::F32, DType::F16, DType::BF16];
    let paths = [
        SoftmaxPath::Auto,
        SoftmaxPath::WarpPerRow,
        SoftmaxPath::BlockCached,
        SoftmaxPath::BlockUncached,
        SoftmaxPath::Cluster,
        SoftmaxPath::WarpNc,
        SoftmaxPath::WarpV2,
        SoftmaxPath::ClusterPipe,
    ];
    let mut out = Vec::new();
    let budget_elems: usize = if quick { 1 << 16 } else { 1 << 22 };
    let cols_list: &[usize] = if quick { &[7, 1000, 1025, 4097] } else { &ODD_COLS };
    let mut toggle = 0usize;
    for &d in &same {
        for &cols in cols_list {
            for &path in &paths {
                if path.is_warp() && cols > super::plan::WARP_MAX_COLS {
                    continue;
                }
                // The forced shared-memory path must fit every supported GPU (A100: 163 KB).
                if path == SoftmaxPath::BlockCached && cols > CACHED_PORTABLE_MAX_COLS {
                    continue;
                }
                if quick && path == SoftmaxPath::Auto {
                    continue;
                }
                toggle += 1;
                // Odd row counts exercise grid tails; alternate kinds, padding and specials.
                let rows = ((budget_elems / cols).clamp(3, 257)) | 1;
                let padded = toggle % 3 == 1;
                let aligned_pad = toggle % 3 == 2;
                // The cluster path needs 16-byte row strides (and is for long rows).
                if path.is_cluster() && cols <= super::plan::WARP_MAX_COLS {
                    continue;
                }
                let stride = if path.is_cluster() {
                    cols.div_ceil(8) * 8 + if padded { 8 } else { 0 }
                } else if padded {
                    cols + 5
                } else if aligned_pad {
                    cols.div_ceil(8) * 8 + 8
                } else {
                    cols
                };
                out.push(Case {
                    rows,
                    cols,
                    in_stride: stride,
                    out_stride: if toggle % 4 == 0 && !path.is_cluster() {
                        stride + 3
                    } else {
                        stride
                    },
                    in_dtype: d,
                    out_dtype: d,
                    kind: if toggle % 2 == 0 {
                        SoftmaxKind::LogSoftmax
                    } else {
                        SoftmaxKind::Softmax
                    },
                    scale: if toggle % 5 == 0 { 0.125 } else { 1.0 },
                    path,
                    in_place: false,
                    special_rows: toggle % 3 == 0,
                });
            }
        }
    }
    // Mixed dtypes on each path.
    let mixed = [
        (DType::F16, DType::F32),
        (DType::BF16, DType::F32),
        (DType::F32, DType::F16),
        (DType::F32, DType::BF16),
    ];
    for (i, &(a, b)) in mixed.iter().enumerate() {
        for (cols, path) in [
            (1000, SoftmaxPath::WarpPerRow),
            (4096, SoftmaxPath::BlockCached),
            (4097, SoftmaxPath::BlockUncached),
            (40000, SoftmaxPath::Cluster),
            (128, SoftmaxPath::WarpV2),
            (1000, SoftmaxPath::WarpNc),
            (40000, SoftmaxPath::ClusterPipe),
            (40000, SoftmaxPath::SplitRow),
        ] {
            out.push(Case {
                rows: if quick { 17 } else { 301 },
                cols,
                in_stride: cols,
                out_stride: cols,
                in_dtype: a,
                out_dtype: b,
                kind: if i % 2 == 0 {
                    SoftmaxKind::Softmax
                } else {
                    SoftmaxKind::LogSoftmax
                },
                scale: 1.0,
                path,
                in_place: false,
                special_rows: true,
            });
        }
    }
    // In place on each path and dtype.
    for &d in &same {
        for (cols, path) in [
            (512, SoftmaxPath::WarpPerRow),
            (3000, SoftmaxPath::BlockCached),
            (70001, SoftmaxPath::BlockUncached),
            (70000, SoftmaxPath::Cluster),
            (128, SoftmaxPath::WarpV2),
            (70000, SoftmaxPath::ClusterPipe),
            (70000, SoftmaxPath::SplitRow),
        ] {
            out.push(Case {
                rows: if quick { 5 } else { 33 },
                cols,
                in_stride: cols,
                out_stride: cols,
                in_dtype: d,
                out_dtype: d,
                kind: SoftmaxKind::Softmax,
                scale: 2.0,
                path,
                in_place: true,
                special_rows: true,
            });
        }
    }
    // Split-row over more rows than the resident groups (on an H200 fp32 40000 columns is 3
    // CTAs of 512 threads per row, 132 groups): each group runs several rows, each with its own
    // exchange slots (in the quick set too: the sanitizers see it).
    out.push(Case::long_rows(500, 40_000, 40_000, DType::F32, SoftmaxPath::SplitRow));
    // Split-row groups that claim their rows (plan.rs split_claims_rows: the static schedule
    // would leave most resident groups unused): on an H200 133 rows over 132 groups (fp32 40000
    // columns) and 53 rows over 44 groups of 9 CTAs (fp16 262147 columns, padded rows), in the
    // quick set too (the sanitizers see the claims and the slots that carry them).
    out.push(Case::long_rows(133, 40_000, 40_000, DType::F32, SoftmaxPath::SplitRow));
    out.push(Case::long_rows(53, 262_147, 262_152, DType::F16, SoftmaxPath::SplitRow));
    // The cluster exchange by st.async (clusters of 8: softmax_cluster.cu kAsyncExchange), in the
    // quick set too (the sanitizers): fp32 rows of 65540 columns on 8 shares of 8196 columns,
    // 150 rows, about three per resident cluster on an H200, so every CTA reuses its inboxes and
    // their barriers' phases across rows.
    out.push(Case::long_rows(150, 65540, 65540, DType::F32, SoftmaxPath::ClusterPipe));
    // One copy group per row (kCopyGroups == 1: shares of more than 8 packs per thread), in the
    // quick set too (the sanitizers): on an H200 a split row over 32 shares of 125 KB (fp32
    // 1,000,000 columns; rows beyond 32 x 64 KB) and a cluster-pipe row over 8 shares of
    // 8193 packs for 1024 threads (fp32 2^18 + 3 columns, padded stride).
    for (cols, stride, path) in [
        (1_000_000, 1_000_000, SoftmaxPath::SplitRow),
        ((1 << 18) + 3, (1 << 18) + 8, SoftmaxPath::ClusterPipe),
    ] {
        out.push(Case::long_rows(
            if quick { 5 } else { 7 },
            cols,
            stride,
            DType::F32,
            path,
        ));
    }
    // Split rows at the most CTAs (32) with one copy group per pack (shares of at most 8 packs
    // per thread: 32 x 16252 fp32 / 32 x 32504 fp16 columns, 65008 bytes each), quick set too.
    for (cols, d) in [(520_000, DType::F32), (1_040_000, DType::F16)] {
        out.push(Case::long_rows(
            if quick { 5 } else { 7 },
            cols,
            cols,
            d,
            SoftmaxPath::SplitRow,
        ));
    }
    if !quick {
        // Huge rows and many tiny rows: 1 x 2^24 and 2^20 x 8.
        for &d in &[DType::F32, DType::F16] {
            out.push(Case {
                rows: 1,
                cols: 1 << 24,
                in_stride: 1 << 24,
                out_stride: 1 << 24,
                in_dtype: d,
                out_dtype: d,
                kind: SoftmaxKind::Softmax,
                scale: 1.0,
                path: SoftmaxPath::Auto,
                in_place: false,
                special_rows: false,
            });
            out.push(Case {
                rows: 1 << 20,
                cols: 8,
                in_stride: 8,
                out_stride: 8,
                in_dtype: d,
                out_dtype: d,
                kind: SoftmaxKind::LogSoftmax,
                scale: 1.0,
                path: SoftmaxPath::Auto,
                in_place: false,
                special_rows: true,
            });
        }
        // warp-v2 over many grid-stride iterations per CTA (one wave of CTAs; odd row counts:
        // the last iteration is partial): prefetching tiny and 127/128-column rows (vector and
        // scalar), and 1000-column rows (occupancy floor, no prefetch).
        for (rows, cols, d) in [
            (1usize << 20, 8usize, DType::F16),
            ((1 << 15) + 3, 128, DType::F32),
            ((1 << 15) + 3, 127, DType::BF16),
            ((1 << 14) + 1, 1000, DType::F32),
        ] {
            out.push(Case {
                rows,
                cols,
                in_stride: cols,
                out_stride: cols,
                in_dtype: d,
                out_dtype: d,
                kind: SoftmaxKind::LogSoftmax,
                scale: 1.0,
                path: SoftmaxPath::WarpV2,
                in_place: false,
                special_rows: true,
            });
        }
        // Every cluster size: rows of 2^17 and 2^18 + 3 columns (the last CTA's share is short),
        // on both cluster schedules. The pipelined one runs one wave of resident clusters: these
        // row counts exceed it on an H200, so each cluster refills its shares across rows.
        for (rows, cols, d) in [
            (257, 1usize << 17, DType::F16),
            (67, (1 << 18) + 3, DType::BF16),
            (67, (1 << 18) + 3, DType::F32),
        ] {
            for path in [
                SoftmaxPath::Auto,
                SoftmaxPath::Cluster,
                SoftmaxPath::ClusterPipe,
                SoftmaxPath::SplitRow,
            ] {
                let many = matches!(path, SoftmaxPath::ClusterPipe | SoftmaxPath::SplitRow);
                out.push(Case {
                    rows: if many { rows } else { 5 },
                    cols,
                    in_stride: cols.div_ceil(8) * 8,
                    out_stride: cols.div_ceil(8) * 8,
                    in_dtype: d,
                    out_dtype: d,
                    kind: SoftmaxKind::Softmax,
                    scale: 1.0,
                    path,
                    in_place: false,
                    special_rows: true,
                });
            }
        }
        out.push(Case {
            rows: 1,
            cols: 1,
            in_stride: 1,
            out_stride: 1,
            in_dtype: DType::F32,
            out_dtype: DType::F32,
            kind: SoftmaxKind::Softmax,
            scale: 1.0,
            path: SoftmaxPath::Auto,
            in_place: false,
            special_rows: false,
        });
    }
    out
}

/// Runs one case on the GPU and compares it with the f64 reference.
pub fn verify_case(ctx: &Context, case: &Case, seed: u64) -> Result<VerifyOutcome> {
    // every (input, output) pairing
    crate::dispatch_float!("softmax verify input"; case.in_dtype, [F32, F16, BF16], |I| {
        crate::dispatch_float!("softmax verify output"; case.out_dtype, [F32, F16, BF16], |O| {
            run::<I, O>(ctx, case, seed)
        })
    })
}

/// The input of a case: random with outliers, padding NaN, optional special rows.
pub fn case_input<I: Element>(case: &Case, seed: u64) -> Vec<I> {
    let mut x: Vec<I> = random_matrix(
        seed,
        case.rows,
        case.cols,
        case.in_stride,
        Dist::WithOutliers { std: 2.0 },
    );
    if case.special_rows && case.rows >= 3 {
        let s = case.in_stride;
        crate::testdata::set_row(&mut x, 0, case.cols, s, f64::NEG_INFINITY);
        x[s + case.cols / 2] = I::from_f64(f64::NAN);
        x[2 * s + case.cols - 1] = I::from_f64(f64::INFINITY);
    }
    if case.special_rows && case.rows >= 4 {
        // Row 3: logits x * scale * log2(e) around 6e6 (> 2^22, where the kernels keep the clamp
        // of their term loops: ts::clamp_may_act) with the row's random spread on top. fp32
        // keeps the spread; bf16 (8 significant bits) rounds the whole row to one value there, so
        // its outputs are uniform (still the clamped loops on finite rows); fp16 cannot hold
        // such inputs at the scales of these cases (max 65504) and keeps its random row.
        let s = case.in_stride;
        let unit = (case.scale as f64 * std::f64::consts::LOG2_E).abs();
        let big = 6.0e6 / unit;
        if I::from_f64(big).to_f64().is_finite() {
            for v in &mut x[3 * s..3 * s + case.cols] {
                *v = I::from_f64(big + v.to_f64() / unit);
            }
        }
    }
    x
}

fn run<I: Element, O: Element>(ctx: &Context, case: &Case, seed: u64) -> Result<VerifyOutcome> {
    let x = case_input::<I>(case, seed);
    let shape = SoftmaxShape {
        rows: case.rows,
        cols: case.cols,
        in_stride: case.in_stride,
        out_stride: case.out_stride,
        in_dtype: I::DTYPE,
        out_dtype: O::DTYPE,
    };
    let opts = SoftmaxOptions {
        kind: case.kind,
        scale: case.scale,
        tuning: SoftmaxTuning { path: case.path },
    };
    let plan = SoftmaxPlan::new(ctx, &shape, &opts)?;
    let out_len = (case.rows - 1) * case.out_stride + case.cols;
    let got_raw: Vec<O> = if case.in_place {
        if I::DTYPE != O::DTYPE || case.in_stride != case.out_stride {
            return Err(Error::invalid("case", "in place needs equal dtypes and strides"));
        }
        // Reinterpret through f64: I == O here.
        let as_o: Vec<O> = x.iter().map(|v| O::from_f64(v.to_f64())).collect();
        let mut buf = ctx.upload(&as_o)?;
        plan.run_inplace(&mut buf.matrix_mut(case.rows, case.cols, case.in_stride)?)?;
        buf.to_host()?
    } else {
        let input = ctx.upload(&x)?;
        if plan.path() == SoftmaxPath::SplitRow {
            // A launch on other data first: the checked launch then finds the exchange slots
            // holding that launch's states under the previous epoch's tags.
            let other = ctx.upload(&case_input::<I>(case, seed ^ 0x9e37_79b9_7f4a_7c15))?;
            let mut scratch = ctx.alloc::<O>(out_len)?;
            plan.run(
                &other.matrix(case.rows, case.cols, case.in_stride)?,
                &mut scratch.matrix_mut(case.rows, case.cols, case.out_stride)?,
            )?;
        }
        let mut output = ctx.alloc::<O>(out_len)?;
        output.fill_bytes(0xff)?; // NaN poison: unwritten outputs fail
        plan.run(
            &input.matrix(case.rows, case.cols, case.in_stride)?,
            &mut output.matrix_mut(case.rows, case.cols, case.out_stride)?,
        )?;
        output.to_host()?
    };
    let want = softmax_reference(
        &x.iter().map(|v| v.to_f64()).collect::<Vec<_>>(),
        case.rows,
        case.cols,
        case.in_stride,
        case.scale as f64,
        case.kind,
    );
    let mut got = Vec::with_capacity(case.rows * case.cols);
    let mut note = None;
    for r in 0..case.rows {
        let row = &got_raw[r * case.out_stride..];
        got.extend(row[..case.cols].iter().map(|v| v.to_f64()));
        if !case.in_place && r + 1 < case.rows {
            // Output padding must still hold the poison bytes.
            let pad = &row[case.cols..case.out_stride];
            if pad.iter().any(|v| !v.to_f64().is_nan()) && note.is_none() {
                note = Some(format!("row {r}: output padding was overwritten"));
            }
        }
    }
    let comparison: Comparison = compare(&got, &want, 1e-6, 1e-2);
    let budget = case.out_dtype.rel_l2_budget();
    let passed = comparison.passes(budget) && note.is_none();
    Ok(VerifyOutcome {
        case: case.name(),
        params: case.params(),
        path: format!("{} {:?}", plan.path().name(), plan.variant().block_threads),
        comparison,
        budget,
        passed,
        note,
        skipped: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_matrix_covers_the_issue() {
        let c = cases(false);
        for cols in [1, 7, 33, 1000, 1025, 4097, 100003] {
            for d in [DType::F32, DType::F16, DType::BF16] {
                assert!(c.iter().any(|k| k.cols == cols && k.in_dtype == d), "cols {cols} {d}");
            }
        }
        for p in [
            SoftmaxPath::WarpPerRow,
            SoftmaxPath::BlockCached,
            SoftmaxPath::BlockUncached,
        ] {
            for d in [DType::F32, DType::F16, DType::BF16] {
                assert!(c.iter().any(|k| k.path == p && k.in_dtype == d && k.in_place));
                assert!(c.iter().any(|k| k.path == p && k.in_dtype == d && k.special_rows));
            }
        }
        // The forced tunings: every dtype, special rows, in place; several iterations per CTA.
        for p in [
            SoftmaxPath::WarpNc,
            SoftmaxPath::WarpV2,
            SoftmaxPath::ClusterPipe,
            SoftmaxPath::SplitRow,
        ] {
            for d in [DType::F32, DType::F16, DType::BF16] {
                assert!(c.iter().any(|k| k.path == p && k.in_dtype == d && k.special_rows));
            }
        }
        assert!(cases(true)
            .iter()
            .any(|k| k.path == SoftmaxPath::SplitRow && k.rows >= 500));
        // One copy group per row on both pipelined paths, quick set included (see `cases`); and
        // every case with special rows keeps ordinary rows beside them (up to four are planted).
        for quick in [false, true] {
            let c = cases(quick);
            assert!(
                c.iter().all(|k| !k.special_rows || k.rows > 4),
                "a case of special rows only"
            );
            let g1 = |p, min_bytes| c.iter().any(|k| k.path == p && k.cols * k.in_dtype.size() > min_bytes);
            assert!(g1(SoftmaxPath::SplitRow, 32 * super::super::plan::SPLIT_SHARE_BYTES));
            assert!(g1(SoftmaxPath::ClusterPipe, 8 * 128 * 1024));
            // split rows of 32 per-pack shares (just under 32 x 64 KB)
            assert!(c.iter().any(|k| k.path == SoftmaxPath::SplitRow
                && k.cols * k.in_dtype.size() > 31 * super::super::plan::SPLIT_SHARE_BYTES
                && k.cols * k.in_dtype.size() <= 32 * super::super::plan::SPLIT_SHARE_BYTES));
        }
        for p in [SoftmaxPath::WarpV2, SoftmaxPath::ClusterPipe, SoftmaxPath::SplitRow] {
            assert!(c.iter().any(|k| k.path == p && k.in_place));
            assert!(c.iter().any(|k| k.path == p && k.rows > 64 && k.cols % 8 != 0));
        }
        assert!(c.iter().any(|k| k.rows == 1 && k.cols == 1 << 24));
        assert!(c.iter().any(|k| k.rows == 1 << 20 && k.cols == 8));
        assert!(c.iter().any(|k| k.kind == SoftmaxKind::LogSoftmax));
        assert!(c.iter().any(|k| k.in_stride > k.cols));
        assert!(!cases(true).is_empty());
    }

    #[test]
    fn case_input_plants_special_rows() {
        let case = Case {
            rows: 4,
            cols: 10,
            in_stride: 12,
            out_stride: 10,
            in_dtype: DType::F32,
            out_dtype: DType::F32,
            kind: SoftmaxKind::Softmax,
            scale: 1.0,
            path: SoftmaxPath::Auto,
            in_place: false,
            special_rows: true,
        };
        let x = case_input::<f32>(&case, 7);
        assert!(x[..10].iter().all(|v| *v == f32::NEG_INFINITY));
        assert!(x[12 + 5].is_nan());
        assert_eq!(x[24 + 9], f32::INFINITY);
        assert!(x[10].is_nan(), "padding is NaN");
        // Row 3: huge finite logits, beyond the 2^22 where the kernels keep their clamp, with a
        // spread (not one repeated value).
        let row3 = &x[36..46];
        let logit = |v: f32| v as f64 * std::f64::consts::LOG2_E;
        assert!(row3.iter().all(|v| v.is_finite() && logit(*v) > (1u64 << 22) as f64));
        assert!(row3.iter().any(|v| *v != row3[0]));
        // fp16 cannot hold them: its row 3 stays random and finite.
        let case16 = Case {
            in_dtype: DType::F16,
            out_dtype: DType::F16,
            ..case
        };
        let x16 = case_input::<half::f16>(&case16, 7);
        assert!(x16[36..46].iter().all(|v| v.is_finite() && v.to_f64().abs() < 100.0));
    }
}
