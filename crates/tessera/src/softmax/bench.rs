//! `tessera bench softmax`: the shapes of ANCHORS.md's softmax table, fp16 and fp32, timed with
//! CUDA events over rotating input sets (so L2 never serves them), after verifying the output of
//! the timed inputs against the f64 reference. Beside every default case, a device copy of the
//! same bytes timed the same way (impl `copy`, [`bench_copy`]): the bound for that size.

use serde_json::json;

use super::reference::softmax_reference;
use super::{SoftmaxKind, SoftmaxOptions, SoftmaxPath, SoftmaxPlan, SoftmaxShape, SoftmaxTuning};
use crate::check::compare;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::harness::BenchOutcome;
use crate::runtime::{time_median, Context, DeviceBuffer, TimingOptions};
use crate::testdata::{random_matrix, Dist};

/// One benchmark case.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchCase {
    pub rows: usize,
    pub cols: usize,
    pub dtype: DType,
    pub kind: SoftmaxKind,
    pub path: SoftmaxPath,
}

impl BenchCase {
    pub fn name(&self) -> String {
        format!("{} {} {}x{}", self.kind.name(), self.dtype, self.rows, self.cols)
    }
    pub fn params(&self) -> serde_json::Value {
        json!({"rows": self.rows, "cols": self.cols, "dtype": self.dtype.name(), "op": self.kind.name()})
    }
    /// Bytes that must move: the input read once and the output written once.
    pub fn bytes(&self) -> usize {
        2 * self.rows * self.cols * self.dtype.size()
    }
    /// `tessera` (default dispatch) or `tessera-<path>` (a forced path).
    pub fn implementation(&self) -> String {
        match self.path {
            SoftmaxPath::Auto => "tessera".into(),
            p => format!("tessera-{}", p.name()),
        }
    }
}

/// The shapes of the softmax table in ANCHORS.md.
pub const ANCHOR_SHAPES: [(usize, usize); 6] = [
    (32768, 128),
    (32768, 1024),
    (16384, 4096),
    (4096, 32768),
    (1024, 131072),
    (256, 262144),
];

/// Bench cases: every anchor shape in fp16 and fp32 with default dispatch, log-softmax on two
/// shapes, and (unless `quick`) each forced path where it applies, to show the dispatch is right.
pub fn cases(quick: bool) -> Vec<BenchCase> {
    let mut out = Vec::new();
    let shapes: &[(usize, usize)] = if quick { &ANCHOR_SHAPES[..3] } else { &ANCHOR_SHAPES };
    for &dtype in &[DType::F16, DType::F32] {
        for &(rows, cols) in shapes {
            out.push(BenchCase {
                rows,
                cols,
                dtype,
                kind: SoftmaxKind::Softmax,
                path: SoftmaxPath::Auto,
            });
        }
        for &(rows, cols) in &[(32768, 1024), (4096, 32768)] {
            out.push(BenchCase {
                rows,
                cols,
                dtype,
                kind: SoftmaxKind::LogSoftmax,
                path: SoftmaxPath::Auto,
            });
        }
    }
    if !quick {
        for &(rows, cols) in &ANCHOR_SHAPES {
            for path in [
                SoftmaxPath::WarpPerRow,
                SoftmaxPath::BlockCached,
                SoftmaxPath::BlockUncached,
                SoftmaxPath::Cluster,
            ] {
                let fits = match path {
                    SoftmaxPath::WarpPerRow => cols <= super::plan::WARP_MAX_COLS,
                    SoftmaxPath::BlockCached => cols <= 32768,
                    SoftmaxPath::Cluster => cols > super::plan::WARP_MAX_COLS,
                    _ => true,
                };
                if fits {
                    out.push(BenchCase {
                        rows,
                        cols,
                        dtype: DType::F16,
                        kind: SoftmaxKind::Softmax,
                        path,
                    });
                }
            }
        }
        for case in tuning_cases() {
            if !out.contains(&case) {
                out.push(case);
            }
        }
    }
    out
}

/// The shapes short of the targets, each with the dispatched kernel forced and every tuning
/// measured against it (warp: `warp`, `warp-nc`, `warp-v2`; cluster: `cluster`,
/// `cluster-pipe`), in both dtypes, so one run compares them side by side.
pub fn tuning_cases() -> Vec<BenchCase> {
    let warp = [SoftmaxPath::WarpPerRow, SoftmaxPath::WarpNc, SoftmaxPath::WarpV2];
    let cluster = [SoftmaxPath::Cluster, SoftmaxPath::ClusterPipe, SoftmaxPath::SplitRow];
    let shapes: [(usize, usize, SoftmaxKind, &[SoftmaxPath]); 6] = [
        (32768, 128, SoftmaxKind::Softmax, &warp),
        (32768, 1024, SoftmaxKind::Softmax, &warp),
        (32768, 1024, SoftmaxKind::LogSoftmax, &warp),
        (4096, 32768, SoftmaxKind::Softmax, &cluster),
        (1024, 131072, SoftmaxKind::Softmax, &cluster),
        (256, 262144, SoftmaxKind::Softmax, &cluster),
    ];
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::F32] {
        for &(rows, cols, kind, paths) in &shapes {
            for &path in paths {
                // The split-row path needs a row longer than one share (not fp16 x 32768).
                let split =
                    super::plan::split_row_shape(cols, dtype.size(), 16 / dtype.size(), super::plan::SPLIT_SHARE_BYTES);
                if path == SoftmaxPath::SplitRow && split.is_none() {
                    continue;
                }
                out.push(BenchCase {
                    rows,
                    cols,
                    dtype,
                    kind,
                    path,
                });
            }
        }
    }
    out
}

/// A same-size device copy beside a default-dispatch softmax case: `cuMemcpyDtoDAsync` of the
/// case's input into an output of the same size, over the same rotating sets, timed the same way.
/// It moves the same bytes as the softmax (read once, written once), so it is the bandwidth a
/// memory-bound kernel of that size can hope for; at a few MB, launch and ramp-up keep it well
/// below the 1 GiB copy of the roofline. Its row carries impl `copy` under the case's name.
#[derive(Clone, Debug, PartialEq)]
pub struct CopyCase(pub BenchCase);

impl CopyCase {
    /// The softmax case's name (`softmax fp16 32768x128`), so the rows line up in the table.
    pub fn name(&self) -> String {
        self.0.name()
    }
}

/// A same-size copy beside every default-dispatch case of [`cases`].
pub fn copy_cases(quick: bool) -> Vec<CopyCase> {
    cases(quick)
        .into_iter()
        .filter(|c| c.path == SoftmaxPath::Auto)
        .map(CopyCase)
        .collect()
}

/// Times one same-size copy of the case's input data.
pub fn bench_copy(ctx: &Context, case: &CopyCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    crate::dispatch_float!("softmax bench"; case.0.dtype, [F16, F32, BF16], |T| copy_run::<T>(ctx, &case.0, seed, timing))
}

fn copy_run<T: Element>(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    let (host, inputs, mut outputs) = rotating_sets::<T>(ctx, case, seed)?;
    let t = time_median(ctx, timing, |call| {
        let k = call % inputs.len();
        outputs[k].copy_from(&inputs[k])
    })?;
    let same = |a: &[T], b: &[T]| {
        a.iter()
            .zip(b)
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
    };
    if !same(&outputs[0].to_host()?, &host) {
        return Err(Error::Unsupported(format!(
            "{}: the same-size copy differs from its input",
            case.name()
        )));
    }
    Ok(BenchOutcome {
        case: case.name(),
        params: case.params(),
        implementation: "copy".into(),
        ms: t.median_ms,
        gbps: Some(case.bytes() as f64 / (t.median_ms * 1e-3) / 1e9),
        tflops: None,
        extra_mib: Some(0.0),
        max_abs_err: None,
        rel_l2: None,
    })
}

/// One device buffer per rotating set.
type Buffers<T> = Vec<DeviceBuffer<T>>;

/// The case's input data (seeded normal values) and its timed buffers: enough input/output sets
/// (each input a copy of the data, each output poisoned with 0xff bytes) that their total is
/// over twice the L2, so L2 never serves a timed call.
fn rotating_sets<T: Element>(ctx: &Context, case: &BenchCase, seed: u64) -> Result<(Vec<T>, Buffers<T>, Buffers<T>)> {
    let host: Vec<T> = random_matrix(seed, case.rows, case.cols, case.cols, Dist::Normal { std: 2.0 });
    if host.is_empty() {
        return Err(Error::invalid(
            "case",
            format!("{}: the bench needs at least one element", case.name()),
        ));
    }
    let sets = (2 * ctx.info().l2_bytes as usize).div_ceil(case.bytes()).clamp(1, 64);
    let first = ctx.upload(&host)?;
    let mut inputs = Vec::with_capacity(sets);
    for _ in 1..sets {
        let mut b = ctx.alloc::<T>(host.len())?;
        b.copy_from(&first)?;
        inputs.push(b);
    }
    inputs.insert(0, first);
    let mut outputs = Vec::with_capacity(sets);
    for _ in 0..sets {
        let mut o = ctx.alloc::<T>(host.len())?;
        o.fill_bytes(0xff)?;
        outputs.push(o);
    }
    Ok((host, inputs, outputs))
}

/// Rows verified against the CPU reference before timing (the reference is f64 on the host).
const VERIFIED_ROWS: usize = 64;

/// Verifies and times one case.
pub fn bench_case(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    crate::dispatch_float!("softmax bench"; case.dtype, [F16, F32, BF16], |T| run::<T>(ctx, case, seed, timing))
}

fn run<T: Element>(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    let shape = SoftmaxShape::contiguous::<T, T>(case.rows, case.cols);
    let opts = SoftmaxOptions {
        kind: case.kind,
        scale: 1.0,
        tuning: SoftmaxTuning { path: case.path },
    };
    let plan = SoftmaxPlan::new(ctx, &shape, &opts)?;
    let (host, inputs, mut outputs) = rotating_sets::<T>(ctx, case, seed)?;
    // Verify the timed kernel on the timed data first.
    plan.run(
        &inputs[0].matrix(case.rows, case.cols, case.cols)?,
        &mut outputs[0].matrix_mut(case.rows, case.cols, case.cols)?,
    )?;
    let got_all = outputs[0].to_host()?;
    let vr = case.rows.min(VERIFIED_ROWS);
    let x64: Vec<f64> = host[..vr * case.cols].iter().map(|v| v.to_f64()).collect();
    let want = softmax_reference(&x64, vr, case.cols, case.cols, 1.0, case.kind);
    let got: Vec<f64> = got_all[..vr * case.cols].iter().map(|v| v.to_f64()).collect();
    let cmp = compare(&got, &want, 1e-6, 1e-2);
    if !cmp.passes(case.dtype.rel_l2_budget()) {
        return Err(Error::Unsupported(format!(
            "{}: output failed verification before timing: {cmp}",
            case.name()
        )));
    }
    if got_all.iter().any(|v| v.to_f64().is_nan()) {
        return Err(Error::Unsupported(format!(
            "{}: NaN (unwritten poison) in the output",
            case.name()
        )));
    }
    let mut views: Vec<_> = Vec::new();
    for (i, o) in inputs.iter().zip(outputs.iter_mut()) {
        views.push((
            i.matrix(case.rows, case.cols, case.cols)?,
            o.matrix_mut(case.rows, case.cols, case.cols)?,
        ));
    }
    let t = time_median(ctx, timing, |call| {
        let k = call % views.len();
        let (i, o) = &mut views[k];
        plan.run(i, o)
    })?;
    Ok(BenchOutcome {
        case: case.name(),
        params: case.params(),
        implementation: case.implementation(),
        ms: t.median_ms,
        gbps: Some(case.bytes() as f64 / (t.median_ms * 1e-3) / 1e9),
        tflops: None,
        extra_mib: Some(0.0),
        max_abs_err: Some(cmp.max_abs_err),
        rel_l2: Some(cmp.rel_l2),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every default-dispatch case has exactly one same-size copy under its own name, moving the
    /// same bytes, so the table's `copy` column is filled on every row.
    #[test]
    fn copy_cases_line_up_with_the_default_cases() {
        for quick in [true, false] {
            let auto: Vec<BenchCase> = cases(quick)
                .into_iter()
                .filter(|c| c.path == SoftmaxPath::Auto)
                .collect();
            let copies = copy_cases(quick);
            assert_eq!(auto.len(), copies.len());
            for (a, c) in auto.iter().zip(&copies) {
                assert_eq!(a.name(), c.name());
                assert_eq!(a.bytes(), c.0.bytes());
            }
        }
    }

    /// The split-row tuning rows appear only where a row spans several shares (the bench failed
    /// on a forced split-row case of 64 KB rows, which one share holds).
    #[test]
    fn split_row_cases_only_where_rows_are_split() {
        let split: Vec<BenchCase> = cases(false)
            .into_iter()
            .filter(|c| c.path == SoftmaxPath::SplitRow)
            .collect();
        assert!(split
            .iter()
            .all(|c| c.cols * c.dtype.size() > super::super::plan::SPLIT_SHARE_BYTES));
        assert!(split.iter().any(|c| c.cols == 262144 && c.dtype == DType::F32));
        assert!(split.iter().any(|c| c.cols == 32768 && c.dtype == DType::F32));
    }
}
