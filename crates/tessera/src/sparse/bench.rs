//! `tessera bench sparse`: SpMV on the matrices of the sparse issue (synthetic stand-ins of the
//! same shapes and structure), fp32 and fp64, A and an explicit A^T. Effective GB/s count
//! values, indices, offsets, x and y once. Each case is verified against the f64 reference on
//! the timed inputs first. The matrix is written to `$TMPDIR/tessera-sparse/<case>.{offsets,
//! indices,values}` (raw little-endian) for the baseline runner (scripts/baselines/
//! bench_torch.py --op sparse: cuSPARSE through torch and CuPy), which times the very same matrix.

use serde_json::{json, Value};

use super::device::CsrMatrix;
use super::generate::{random_vector, try_generate, MatrixClass};
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
}

impl MatrixSource {
    fn name(&self) -> String {
        match self {
            MatrixSource::Generated(c) => c.name(),
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

/// The benchmark cases (`quick`: two small ones). With `TESSERA_BENCH_MATRIX=A.mtx` (`tessera
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
    ]
}

/// Benchmark knobs (read here only, never by the library): `TESSERA_SPMV_LANES=1..32` forces
/// the lanes per row, `TESSERA_SPMV_LONG=N` the long-row threshold, `TESSERA_SPMV_BINNED=1` the
/// binned kernel.
pub fn tuning_from_env() -> SpmvTuning {
    let num = |k: &str| std::env::var(k).ok().and_then(|v| v.trim().parse::<usize>().ok());
    SpmvTuning {
        lanes: num("TESSERA_SPMV_LANES").map(|l| l as u32),
        long_threshold: num("TESSERA_SPMV_LONG"),
        binned: std::env::var("TESSERA_SPMV_BINNED").is_ok_and(|v| v.trim() == "1"),
    }
}

/// Bytes one SpMV moves at least: values, indices, offsets, x and y once each (beta = 0).
pub fn bytes<T: Element, I: SparseIndex>(a: &CsrHost<T, I>) -> usize {
    let (v, i) = (T::DTYPE.size(), I::DTYPE.size());
    a.nnz() * (v + i) + (a.rows + 1) * i + a.cols * v + a.rows * v
}

pub fn bench_case(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    crate::dispatch_float!("sparse bench"; case.value, [F32, F64], |T| run::<T>(ctx, case, seed, timing))
}

fn run<T: Element>(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    let mut host: CsrHost<T, i32> = match &case.source {
        MatrixSource::Generated(class) => try_generate::<T, i32>(*class, case.rows, case.cols, seed)?,
        MatrixSource::File(path) => super::mtx::read_mtx_csr::<T, i32>(path)?,
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
    let plan = SpmvPlan::new(
        &a,
        &SpmvOptions {
            tuning: tuning_from_env(),
        },
    )?;
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
            p
        },
        implementation: "tessera".into(),
        ms: t.median_ms,
        gbps: Some(bytes(&host) as f64 / (t.median_ms * 1e-3) / 1e9),
        tflops: None,
        extra_mib: Some(0.0),
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
