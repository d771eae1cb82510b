//! `tessera bench sparse`: SpMV on the matrices of the sparse issue (synthetic stand-ins of the
//! same shapes and structure, and real 2-D parallel-beam tomography system matrices from
//! [`parallel_beam_projector`]), fp32 and fp64, A and an explicit A^T; and block-sparse SpMM
//! (16 x 16 blocks at 5-20% block density: CSR vs BSR vs Blocked-ELL, [`block_cases`]). Effective GB/s count
//! values, indices, offsets, x and y once. Each case is verified against the f64 reference on
//! the timed inputs first. The matrix is written to `$TMPDIR/tessera-sparse/<case>.{offsets,
//! indices,values}` (raw little-endian) for the baseline runner (scripts/baselines/
//! bench_torch.py --op sparse: cuSPARSE through torch and CuPy), which times the very same matrix.

use serde_json::{json, Value};

use super::device::CsrMatrix;
use super::generate::{parallel_beam_projector, random_vector, try_generate, MatrixClass, ParallelBeam};
use super::host::CsrHost;
use super::index::SparseIndex;
use super::reference;
use super::sell::{prefers_sell, SellMatrix, SellOptions};
use super::spmv::{SpmvOptions, SpmvPlan, SpmvTuning};
use crate::check::{compare, to_f64_vec};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::harness::BenchOutcome;
use crate::runtime::{time_median, Context, TimingOptions};

/// Where a benchmark matrix comes from.
#[derive(Clone, Debug)]
pub enum MatrixSource {
    /// A seeded random matrix of a structure class.
    Generated(MatrixClass),
    /// A Matrix Market file (`tessera bench sparse --matrix A.mtx`).
    File(std::path::PathBuf),
    /// The system matrix of a 2-D parallel-beam scan ([`parallel_beam_projector`]: rays x
    /// pixels, exact intersection lengths).
    Tomography(ParallelBeam),
}

impl MatrixSource {
    fn name(&self) -> String {
        match self {
            MatrixSource::Generated(c) => c.name(),
            MatrixSource::Tomography(g) => g.name(),
            MatrixSource::File(p) => p
                .file_stem()
                .map_or("matrix".into(), |s| s.to_string_lossy().into_owned()),
        }
    }
}

/// One SpMV benchmark case.
#[derive(Clone, Debug)]
pub struct BenchCase {
    pub source: MatrixSource,
    pub rows: usize,
    pub cols: usize,
    pub value: DType,
    /// Time A^T (stored as its own CSR) instead of A.
    pub transposed: bool,
}

impl BenchCase {
    pub fn name(&self) -> String {
        format!(
            "spmv {}{} {}x{} {}",
            self.source.name(),
            if self.transposed { " A^T" } else { "" },
            self.rows,
            self.cols,
            self.value
        )
    }
    /// The file stem the matrix is written to for the baseline runner.
    pub fn matrix_stem(&self) -> String {
        let dir = std::env::temp_dir().join("tessera-sparse");
        let stem = self.name().replace([' ', '^'], "_");
        dir.join(stem).to_string_lossy().into_owned()
    }
    pub fn params(&self) -> Value {
        json!({
            "class": self.source.name(), "rows": self.rows, "cols": self.cols,
            "dtype": self.value.name(), "index": "i32", "transposed": self.transposed,
            "matrix": self.matrix_stem(),
        })
    }
}

/// The benchmark cases (`quick`: three small ones, the last a 64 x 64 tomography). With `TESSERA_BENCH_MATRIX=A.mtx` (`tessera
/// bench sparse --matrix A.mtx`): that matrix and its transpose, fp32 and fp64.
pub fn cases(quick: bool) -> Vec<BenchCase> {
    if let Some(path) = std::env::var_os("TESSERA_BENCH_MATRIX") {
        let path = std::path::PathBuf::from(path);
        // a bad file reports its read error when the case runs
        let (rows, cols) = super::mtx::read_mtx_header_shape(&path).unwrap_or_default();
        let mut out = Vec::new();
        for value in [DType::F32, DType::F64] {
            for transposed in [false, true] {
                out.push(BenchCase {
                    source: MatrixSource::File(path.clone()),
                    rows,
                    cols,
                    value,
                    transposed,
                });
            }
        }
        return out;
    }
    let m = |class, rows, cols, value, transposed| BenchCase {
        source: MatrixSource::Generated(class),
        rows,
        cols,
        value,
        transposed,
    };
    let tomo = |g: ParallelBeam, transposed| BenchCase {
        source: MatrixSource::Tomography(g),
        rows: g.rows(),
        cols: g.cols(),
        value: DType::F32,
        transposed,
    };
    if quick {
        return vec![
            m(
                MatrixClass::Uniform { per_row: 16 },
                100_000,
                100_000,
                DType::F32,
                false,
            ),
            m(
                MatrixClass::TallLeastSquares { per_row: 18 },
                30_000,
                617,
                DType::F32,
                true,
            ),
            tomo(ParallelBeam::new(64, 45, 91), false),
        ];
    }
    let f = DType::F32;
    vec![
        m(MatrixClass::Uniform { per_row: 16 }, 2_000_000, 2_000_000, f, false),
        m(MatrixClass::Banded { diagonals: 9 }, 2_000_000, 2_000_000, f, false),
        m(
            MatrixClass::PowerLaw {
                mean: 20.0,
                exponent: 2.0,
            },
            1_000_000,
            1_000_000,
            f,
            false,
        ),
        m(MatrixClass::TallLeastSquares { per_row: 18 }, 306_136, 6_177, f, false),
        m(MatrixClass::TallLeastSquares { per_row: 18 }, 306_136, 6_177, f, true),
        m(MatrixClass::TallLeastSquares { per_row: 21 }, 936_063, 23_394, f, false),
        m(MatrixClass::TallLeastSquares { per_row: 21 }, 936_063, 23_394, f, true),
        m(
            MatrixClass::FewLongRows {
                long_rows: 1000,
                long_len: 100_000,
                short_len: 4,
            },
            1_000_000,
            1_000_000,
            f,
            false,
        ),
        m(
            MatrixClass::Uniform { per_row: 16 },
            2_000_000,
            2_000_000,
            DType::F64,
            false,
        ),
        // real tomography: 256^2 pixels, 180 angles x 363 bins (65340 x 65536, ~15.0M nnz,
        // ~230 per row) and 512^2, 360 x 725 (261000 x 262144, ~120.2M nnz, ~460 per row)
        tomo(TOMO_SMALL, false),
        tomo(TOMO_SMALL, true),
        tomo(TOMO_LARGE, false),
        tomo(TOMO_LARGE, true),
    ]
}

/// The smaller tomography benchmark geometry: a 256 x 256 image, 180 angles, 363 bins (the
/// image's diagonal), unit bins.
pub const TOMO_SMALL: ParallelBeam = ParallelBeam {
    n: 256,
    angles: 180,
    detectors: 363,
    det_width: 1.0,
};

/// The larger tomography benchmark geometry: 512 x 512, 360 angles, 725 bins.
pub const TOMO_LARGE: ParallelBeam = ParallelBeam {
    n: 512,
    angles: 360,
    detectors: 725,
    det_width: 1.0,
};

/// Benchmark knobs (read here only, never by the library; the one exception is
/// `TESSERA_SPMV_PANEL_CTAS`, the column-panel kernel's CTAs, read by `spmv_panels`): `TESSERA_SPMV_LANES=1..32` forces
/// the lanes per row, `TESSERA_SPMV_LONG=N` the long-row threshold, `TESSERA_SPMV_BINNED=1` the
/// binned kernel, `TESSERA_SPMV_MERGE=1` the merge path (alone), `TESSERA_SPMV_PANELS=W` column
/// panels of W columns (0: never; alone), `TESSERA_SPMV_COMPACT=1|0` 16-bit columns in the row
/// kernels always (an error on matrices of more than 65536 columns) or never.
pub fn tuning_from_env() -> SpmvTuning {
    let num = |k: &str| std::env::var(k).ok().and_then(|v| v.trim().parse::<usize>().ok());
    let on = |k: &str| std::env::var(k).is_ok_and(|v| v.trim() == "1");
    SpmvTuning {
        lanes: num("TESSERA_SPMV_LANES").map(|l| l as u32),
        long_threshold: num("TESSERA_SPMV_LONG"),
        binned: on("TESSERA_SPMV_BINNED"),
        merge_path: on("TESSERA_SPMV_MERGE"),
        panel_width: num("TESSERA_SPMV_PANELS"),
        compact_columns: num("TESSERA_SPMV_COMPACT").map(|v| v != 0),
    }
}

/// Which SpMV plan a benchmark row times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PlanChoice {
    /// The rules (with the `TESSERA_SPMV_*` knobs; impl `tessera`).
    Rules,
    /// The plan [`CsrMatrix::autotune_spmv`] chose (impl `tessera-autotuned`).
    Autotuned,
    /// The merge path (impl `tessera-merge`).
    MergePath,
    /// Column panels of the default width (impl `tessera-panels`).
    Panels,
    /// The rules with 16-bit columns forced on (impl `tessera-compact`).
    Compact,
}

impl PlanChoice {
    fn implementation(self) -> &'static str {
        match self {
            PlanChoice::Rules => "tessera",
            PlanChoice::Autotuned => "tessera-autotuned",
            PlanChoice::MergePath => "tessera-merge",
            PlanChoice::Panels => "tessera-panels",
            PlanChoice::Compact => "tessera-compact",
        }
    }
}

/// Bytes one SpMV moves at least: values, indices, offsets, x and y once each (beta = 0).
pub fn bytes<T: Element, I: SparseIndex>(a: &CsrHost<T, I>) -> usize {
    let (v, i) = (T::DTYPE.size(), I::DTYPE.size());
    a.nnz() * (v + i) + (a.rows + 1) * i + a.cols * v + a.rows * v
}

pub fn bench_case(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    crate::dispatch_float!("sparse bench"; case.value, [F32, F64], |T| run::<T>(ctx, case, seed, timing, PlanChoice::Rules))
}

/// [`bench_case`] with the plan [`CsrMatrix::autotune_spmv`] chose (impl `tessera-autotuned`).
pub fn bench_autotuned_case(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    crate::dispatch_float!("sparse bench"; case.value, [F32, F64], |T| {
        run::<T>(ctx, case, seed, timing, PlanChoice::Autotuned)
    })
}

/// [`bench_case`] on the merge path (impl `tessera-merge`; opt-in, see `SpmvTuning::merge_path`).
pub fn bench_merge_case(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    crate::dispatch_float!("sparse bench"; case.value, [F32, F64], |T| {
        run::<T>(ctx, case, seed, timing, PlanChoice::MergePath)
    })
}

/// Whether a case gets a `tessera-panels` row: its matrix (as multiplied: transposed or not)
/// is one panel of the default width, or at least four times as wide as tall. Square and tall
/// matrices of many columns would need far more panel rows than they have nonzeros.
pub fn panels_apply(case: &BenchCase) -> bool {
    let (rows, cols) = if case.transposed {
        (case.cols, case.rows)
    } else {
        (case.rows, case.cols)
    };
    cols <= super::spmv_panels::default_panel_width(case.value) || cols >= 4 * rows
}

/// [`bench_case`] on column panels of the default width (impl `tessera-panels`; the rules take
/// them on wide matrices only, see `spmv_panels::panels_pay`).
pub fn bench_panels_case(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    crate::dispatch_float!("sparse bench"; case.value, [F32, F64], |T| {
        run::<T>(ctx, case, seed, timing, PlanChoice::Panels)
    })
}

/// Whether a case gets a `tessera-compact` row: its matrix (as multiplied: transposed or not)
/// has at most 65536 columns, so its column indices fit 16 bits (the tall least-squares
/// matrices, 256^2 tomography and its transpose).
pub fn compact_applies(case: &BenchCase) -> bool {
    let cols = if case.transposed { case.rows } else { case.cols };
    cols <= super::spmv_compact::MAX_COMPACT_COLS
}

/// [`bench_case`] with 16-bit columns forced on (impl `tessera-compact`), the rest by the rules.
pub fn bench_compact_case(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    crate::dispatch_float!("sparse bench"; case.value, [F32, F64], |T| run::<T>(ctx, case, seed, timing, PlanChoice::Compact))
}

fn run<T: Element>(
    ctx: &Context,
    case: &BenchCase,
    seed: u64,
    timing: TimingOptions,
    choice: PlanChoice,
) -> Result<BenchOutcome> {
    let mut host: CsrHost<T, i32> = match &case.source {
        MatrixSource::Generated(class) => try_generate::<T, i32>(*class, case.rows, case.cols, seed)?,
        MatrixSource::File(path) => super::mtx::read_mtx_csr::<T, i32>(path)?,
        MatrixSource::Tomography(g) => parallel_beam_projector::<T, i32>(g)?,
    };
    if case.transposed {
        host = host.transpose();
    }
    write_matrix(&host, &case.matrix_stem())?;
    let a = CsrMatrix::from_host(ctx, &host)?;
    let x: Vec<T> = random_vector(host.cols, seed ^ 0x5eed)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let dx = ctx.upload(&x)?;
    let mut dy = ctx.alloc::<T>(host.rows.max(1))?;
    let (plan, tuning) = match choice {
        PlanChoice::Autotuned => {
            let tuning = a.autotune_spmv()?;
            (a.spmv_plan()?, tuning)
        }
        PlanChoice::Rules | PlanChoice::MergePath | PlanChoice::Panels | PlanChoice::Compact => {
            let tuning = match choice {
                PlanChoice::MergePath => SpmvTuning {
                    merge_path: true,
                    ..SpmvTuning::default()
                },
                PlanChoice::Panels => SpmvTuning {
                    panel_width: Some(super::spmv_panels::default_panel_width(T::DTYPE)),
                    ..SpmvTuning::default()
                },
                PlanChoice::Compact => SpmvTuning {
                    compact_columns: Some(true),
                    ..SpmvTuning::default()
                },
                _ => tuning_from_env(),
            };
            (std::sync::Arc::new(SpmvPlan::new(&a, &SpmvOptions { tuning })?), tuning)
        }
    };
    plan.run(&a, 1.0, &dx, 0.0, &mut dy)?;
    let got = to_f64_vec(&dy.to_host()?[..host.rows]);
    let mut want = vec![0.0; host.rows];
    reference::spmv(&host, 1.0, &to_f64_vec(&x), 0.0, &mut want);
    let cmp = compare(&got, &want, 0.0, 0.0);
    if !cmp.passes(T::DTYPE.rel_l2_budget()) {
        return Err(Error::Unsupported(format!(
            "{}: output failed verification before timing: {cmp}",
            case.name()
        )));
    }
    let t = time_median(ctx, timing, |_| plan.run(&a, 1.0, &dx, 0.0, &mut dy))?;
    Ok(BenchOutcome {
        case: case.name(),
        params: {
            let mut p = case.params();
            p["descriptor"] = json!(a.descriptor().to_string());
            p["path"] = json!(plan.path());
            p["tuning"] = json!(format!("{tuning:?}"));
            // GB/s counts sizeof(index) per nonzero on every row (the useful bytes of the CSR
            // matrix); the row kernels read 2 per nonzero where this is true
            p["compact_columns"] = json!(plan.compact_columns());
            if let Some(r) = plan.conversion() {
                p["build_ms"] = json!(r.elapsed.as_secs_f64() * 1e3);
                p["build_mib"] = json!(r.bytes as f64 / (1 << 20) as f64);
            }
            p
        },
        implementation: choice.implementation().into(),
        ms: t.median_ms,
        gbps: Some(bytes(&host) as f64 / (t.median_ms * 1e-3) / 1e9),
        tflops: None,
        extra_mib: Some(plan.extra_bytes() as f64 / (1 << 20) as f64),
        max_abs_err: Some(cmp.max_abs_err),
        rel_l2: Some(cmp.rel_l2),
    })
}

/// Writes offsets, indices and values as raw little-endian arrays beside `stem`.
pub(crate) fn write_matrix<T: Element, I: SparseIndex>(a: &CsrHost<T, I>, stem: &str) -> Result<()> {
    let io = |e: std::io::Error| Error::Io {
        context: format!("writing the benchmark matrix {stem}.*"),
        source: e,
    };
    if let Some(dir) = std::path::Path::new(stem).parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    fn raw<E: Element>(xs: &[E]) -> &[u8] {
        // SAFETY: Element types are plain data without padding (dtype.rs); the byte view has
        // exactly the slice's size and lifetime.
        unsafe { std::slice::from_raw_parts(xs.as_ptr() as *const u8, std::mem::size_of_val(xs)) }
    }
    std::fs::write(format!("{stem}.offsets"), raw(&a.offsets)).map_err(io)?;
    std::fs::write(format!("{stem}.indices"), raw(&a.indices)).map_err(io)?;
    std::fs::write(format!("{stem}.values"), raw(&a.values)).map_err(io)?;
    Ok(())
}

/// SELL-C-sigma SpMV (impl `tessera-sell`, default sigma) on a generated case's matrix, for
/// comparison with the CSR row of the same case; params carry the padding, the dispatch rule's
/// answer and the build cost.
pub fn bench_sell_case(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    crate::dispatch_float!("sparse sell bench"; case.value, [F32, F64], |T| run_sell::<T>(ctx, case, seed, timing))
}

fn run_sell<T: Element>(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    let MatrixSource::Generated(class) = case.source else {
        return Err(Error::Unsupported("the SELL benchmark takes generated matrices".into()));
    };
    let host = try_generate::<T, i32>(class, case.rows, case.cols, seed)?;
    let sell = SellMatrix::from_host(ctx, &host, &SellOptions::default())?;
    let x: Vec<T> = random_vector(host.cols, seed ^ 0x5eed)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let dx = ctx.upload(&x)?;
    let mut dy = ctx.alloc::<T>(host.rows.max(1))?;
    sell.spmv(1.0, &dx, 0.0, &mut dy)?;
    let got = to_f64_vec(&dy.to_host()?[..host.rows]);
    let mut want = vec![0.0; host.rows];
    reference::spmv(&host, 1.0, &to_f64_vec(&x), 0.0, &mut want);
    let cmp = compare(&got, &want, 0.0, 0.0);
    if !cmp.passes(T::DTYPE.rel_l2_budget()) {
        return Err(Error::Unsupported(format!(
            "{} (sell): output failed verification before timing: {cmp}",
            case.name()
        )));
    }
    let t = time_median(ctx, timing, |_| sell.spmv(1.0, &dx, 0.0, &mut dy))?;
    let descriptor = super::SparseDescriptor::of(&host);
    Ok(BenchOutcome {
        case: case.name(),
        params: {
            let mut p = case.params();
            p["descriptor"] = json!(descriptor.to_string());
            p["path"] = json!("sell");
            p["padding"] = json!(sell.padding_ratio());
            p["sell_preferred"] = json!(prefers_sell(&descriptor, sell.padding_ratio()));
            p["build_ms"] = json!(sell.conversion().elapsed.as_secs_f64() * 1e3);
            p
        },
        implementation: "tessera-sell".into(),
        ms: t.median_ms,
        // the same useful bytes as the CSR row (padding is overhead, not counted)
        gbps: Some(bytes(&host) as f64 / (t.median_ms * 1e-3) / 1e9),
        tflops: None,
        extra_mib: Some(0.0),
        max_abs_err: Some(cmp.max_abs_err),
        rel_l2: Some(cmp.rel_l2),
    })
}

/// One timed SpMM call writing into C.
type RunSpmm<'a, T> = dyn FnMut(&mut crate::runtime::DeviceBuffer<T>) -> Result<()> + 'a;

/// Which implementation a block-sparse SpMM benchmark row times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockImpl {
    /// Our CSR SpMM on the same matrix (impl `tessera`: the default dispatch for a CSR matrix).
    Csr,
    /// BSR (converted on the device; impl `tessera-bsr`).
    Bsr,
    /// Blocked-ELL (impl `tessera-bell`).
    Bell,
    /// BSR on the CUDA-core path forced (impl `tessera-bsr-cuda-cores`; fp16/bf16 only: what
    /// the tensor cores gain).
    BsrCudaCores,
    /// BSR on the staged tensor-core path (cp.async + ldmatrix; impl `tessera-bsr-staged`;
    /// fp16/bf16, n % 8 == 0): whether it should become the default.
    BsrStaged,
}

impl BlockImpl {
    pub fn name(self) -> &'static str {
        match self {
            BlockImpl::Csr => "tessera",
            BlockImpl::Bsr => "tessera-bsr",
            BlockImpl::Bell => "tessera-bell",
            BlockImpl::BsrCudaCores => "tessera-bsr-cuda-cores",
            BlockImpl::BsrStaged => "tessera-bsr-staged",
        }
    }
}

/// One block-sparse SpMM benchmark case: `C = A B` (row-major) for a `rows x cols` matrix of
/// full `block x block` blocks at a block density, timed as CSR, BSR and Blocked-ELL.
#[derive(Clone, Debug)]
pub struct BlockBenchCase {
    pub block: usize,
    pub density: f64,
    pub rows: usize,
    pub cols: usize,
    pub n: usize,
    pub value: DType,
}

impl BlockBenchCase {
    pub fn name(&self) -> String {
        format!(
            "spmm block{} d{} {}x{} n{} {}",
            self.block, self.density, self.rows, self.cols, self.n, self.value
        )
    }
    fn structure(&self) -> super::generate::BlockSparse {
        super::generate::BlockSparse {
            block: self.block,
            density: self.density,
            fill: 1.0,
            empty_block_rows: 0.0,
        }
    }
    /// The file stem the CSR matrix is written to for the baseline runner.
    pub fn matrix_stem(&self) -> String {
        let dir = std::env::temp_dir().join("tessera-sparse");
        dir.join(self.name().replace(' ', "_")).to_string_lossy().into_owned()
    }
    /// What the baseline runner reads (`op: spmm`: torch CSR and BSR SpMM, CuPy CSR SpMM).
    pub fn params(&self) -> Value {
        json!({
            "op": "spmm", "class": self.structure().name(), "rows": self.rows, "cols": self.cols,
            "n": self.n, "block": self.block, "density": self.density,
            "dtype": self.value.name(), "index": "i32", "transposed": false, "layout": "row-major",
            "matrix": self.matrix_stem(),
        })
    }
}

/// The block-sparse SpMM cases: 16 x 16 blocks at 5, 10 and 20% block density, N = 32 and 128,
/// fp16 (tensor cores) and fp32 (CUDA cores) (`quick`: one small case; none when
/// `TESSERA_BENCH_MATRIX` names the user's matrix).
pub fn block_cases(quick: bool) -> Vec<BlockBenchCase> {
    if std::env::var_os("TESSERA_BENCH_MATRIX").is_some() {
        return Vec::new();
    }
    let m = |density, rows, n, value| BlockBenchCase {
        block: 16,
        density,
        rows,
        cols: rows,
        n,
        value,
    };
    if quick {
        return vec![m(0.1, 2048, 32, DType::F16)];
    }
    let mut out = Vec::new();
    for value in [DType::F16, DType::F32] {
        for density in [0.05, 0.1, 0.2] {
            for n in [32, 128] {
                out.push(m(density, 8192, n, value));
            }
        }
    }
    out
}

pub fn bench_block_case(
    ctx: &Context,
    (case, which): &(BlockBenchCase, BlockImpl),
    seed: u64,
    timing: TimingOptions,
) -> Result<BenchOutcome> {
    crate::dispatch_float!("sparse block bench"; case.value, [F32, F64, F16, BF16], |T| {
        run_block::<T>(ctx, case, *which, seed, timing)
    })
}

fn run_block<T: Element>(
    ctx: &Context,
    case: &BlockBenchCase,
    which: BlockImpl,
    seed: u64,
    timing: TimingOptions,
) -> Result<BenchOutcome> {
    use super::host::DenseLayout;
    let host: CsrHost<T, i32> = super::generate::generate_block_sparse(case.structure(), case.rows, case.cols, seed)?;
    if which == BlockImpl::Csr {
        write_matrix(&host, &case.matrix_stem())?;
    }
    let n = case.n;
    let layout = DenseLayout::RowMajor;
    let csr = CsrMatrix::from_host(ctx, &host)?;
    let b: Vec<T> = random_vector(host.cols * n, seed ^ 0x5eed)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let db = ctx.upload(&b)?;
    let mut dc = ctx.alloc::<T>((host.rows * n).max(1))?;
    let mut extra = json!({});
    let (path, mut run): (String, Box<RunSpmm<'_, T>>) = match which {
        BlockImpl::Csr => {
            let plan = super::spmm::SpmmPlan::new(&csr, n, layout)?;
            let path = plan.path();
            let csr = &csr;
            (path, Box::new(move |c| plan.run(csr, 1.0, &db, 0.0, c)))
        }
        BlockImpl::Bsr | BlockImpl::BsrCudaCores | BlockImpl::BsrStaged => {
            let bsr = csr.bsr(case.block)?;
            extra["convert_ms"] = json!(bsr.conversion().map(|r| r.elapsed.as_secs_f64() * 1e3));
            extra["block_density"] = json!(bsr.block_density());
            let forced = match which {
                BlockImpl::BsrCudaCores => Some(super::bsr::BlockPath::CudaCores),
                BlockImpl::BsrStaged => Some(super::bsr::BlockPath::TensorCoresStaged {
                    n8: super::bsr::tensor_core_n8(n),
                }),
                _ => None,
            };
            let path = match forced {
                Some(p) => format!("{p:?}"),
                None => bsr.spmm_variant(n, layout).path_name(),
            };
            let db = &db;
            (
                path,
                Box::new(move |c| match forced {
                    Some(p) => bsr.spmm_on(p, 1.0, db, n, layout, 0.0, c).map(|_| ()),
                    None => bsr.spmm(1.0, db, n, layout, 0.0, c),
                }),
            )
        }
        BlockImpl::Bell => {
            let bell = csr.blocked_ell(case.block)?;
            extra["convert_ms"] = json!(bell.conversion().map(|r| r.elapsed.as_secs_f64() * 1e3));
            extra["width"] = json!(bell.width());
            let path = bell.spmm_variant(n, layout).path_name();
            let db = &db;
            (path, Box::new(move |c| bell.spmm(1.0, db, n, layout, 0.0, c)))
        }
    };
    run(&mut dc)?;
    let got = to_f64_vec(&dc.to_host()?[..host.rows * n]);
    let mut want = vec![0.0; host.rows * n];
    reference::spmm(&host, 1.0, &to_f64_vec(&b), n, layout, 0.0, &mut want, layout);
    let cmp = compare(&got, &want, 0.0, 0.0);
    if !cmp.passes(T::DTYPE.rel_l2_budget()) {
        return Err(Error::Unsupported(format!(
            "{} ({}): output failed verification before timing: {cmp}",
            case.name(),
            which.name()
        )));
    }
    let t = time_median(ctx, timing, |_| run(&mut dc))?;
    let v = T::DTYPE.size();
    let moved = host.nnz() * (v + 4) + (host.rows + 1) * 4 + (host.cols + host.rows) * n * v;
    Ok(BenchOutcome {
        case: case.name(),
        params: {
            let mut p = case.params();
            p["path"] = json!(path);
            p["nnz"] = json!(host.nnz());
            if let (Some(p), Some(e)) = (p.as_object_mut(), extra.as_object()) {
                p.extend(e.clone());
            }
            p
        },
        implementation: which.name().into(),
        ms: t.median_ms,
        // useful flops (2 per stored CSR nonzero and column) and the CSR bytes of A, B and C
        tflops: Some(2.0 * host.nnz() as f64 * n as f64 / (t.median_ms * 1e-3) / 1e12),
        gbps: Some(moved as f64 / (t.median_ms * 1e-3) / 1e9),
        extra_mib: Some(0.0),
        max_abs_err: Some(cmp.max_abs_err),
        rel_l2: Some(cmp.rel_l2),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tomography_cases_come_as_a_and_its_transpose() {
        let all = cases(false);
        let names: std::collections::HashSet<String> = all.iter().map(BenchCase::name).collect();
        assert_eq!(names.len(), all.len(), "names are unique");
        for g in [TOMO_SMALL, TOMO_LARGE] {
            for transposed in [false, true] {
                let c = all
                    .iter()
                    .find(|c| matches!(c.source, MatrixSource::Tomography(h) if h == g) && c.transposed == transposed)
                    .unwrap();
                assert_eq!((c.rows, c.cols), (g.angles * g.detectors, g.n * g.n));
                assert_eq!(c.params()["class"], json!(g.name()));
            }
        }
        assert_eq!(
            all.iter()
                .find(|c| c.transposed && c.name().contains("tomo256"))
                .unwrap()
                .name(),
            "spmv tomo256_180x363 A^T 65340x65536 fp32"
        );
        assert!(cases(true)
            .iter()
            .any(|c| matches!(c.source, MatrixSource::Tomography(_))));
    }
}
