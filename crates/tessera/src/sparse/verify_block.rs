//! `tessera verify sparse`, block-sparse cases: the device CSR -> BSR -> Blocked-ELL
//! conversions against the host's ([`BsrHost::from_csr`], [`BellHost::from_bsr`]) bitwise, the
//! caches and their invalidation by `update_values`; BSR and Blocked-ELL SpMV and SpMM against
//! the f64 CSR reference (an independent route: the reference never sees the block form) on
//! random block-sparse matrices of every block size, odd shapes, empty block rows, no
//! nonzeros, N in {1, 2, 7, 32, 129}, both layouts, every dtype and several (alpha, beta),
//! each run twice and compared bitwise (deterministic) and with beta = 0 starting from NaN;
//! and bad input: errors, with the output left bitwise unchanged.

use serde_json::{json, Value};

use super::block::{BellHost, BsrHost};
use super::bsr::{BellMatrix, BlockPath, BsrMatrix};
use super::device::{upload_nonempty, CsrMatrix};
use super::generate::{generate_block_sparse, random_vector, try_generate, BlockSparse, MatrixClass};
use super::host::{ColumnOrder, CsrCheck, CsrHost, DenseLayout, Duplicates};
use super::index::SparseIndex;
use super::reference;
use super::verify::{judge, with_types};
use super::verify_convert::with_problems;
use crate::check::to_f64_vec;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::harness::VerifyOutcome;
use crate::runtime::{Context, DeviceBuffer};

/// The matrix of a block case.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BlockSource {
    /// A random block-sparse matrix.
    Blocks(BlockSparse),
    /// A matrix of a general class (entries scattered over many sparse blocks).
    Class(MatrixClass),
}

impl BlockSource {
    fn name(&self) -> String {
        match self {
            BlockSource::Blocks(s) => s.name(),
            BlockSource::Class(c) => c.name(),
        }
    }
    fn generate<T: Element, I: SparseIndex>(&self, rows: usize, cols: usize, seed: u64) -> Result<CsrHost<T, I>> {
        match *self {
            BlockSource::Blocks(s) => generate_block_sparse(s, rows, cols, seed),
            BlockSource::Class(c) => try_generate(c, rows, cols, seed),
        }
    }
}

/// Which format a product case runs on, and how it was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockFormat {
    /// BSR converted on the device (`CsrMatrix::bsr`).
    Bsr,
    /// BSR uploaded from `BsrHost::from_csr`.
    BsrHost,
    /// Blocked-ELL converted on the device (`CsrMatrix::blocked_ell`).
    Bell,
}

/// What a block case checks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BlockKind {
    /// Device conversions against the host's, bitwise; caches and `update_values`.
    Convert { duplicates: bool },
    /// `y = alpha A x + beta y`.
    Spmv { alpha: f64, beta: f64 },
    /// `C = alpha A B + beta C`; `path`: forced instead of the default.
    Spmm {
        n: usize,
        layout: DenseLayout,
        alpha: f64,
        beta: f64,
        path: Option<BlockPath>,
    },
    /// Bad operands and arguments: errors, nothing written.
    BadInput,
}

#[derive(Clone, Debug)]
pub struct BlockCase {
    pub kind: BlockKind,
    pub format: BlockFormat,
    pub source: BlockSource,
    pub block: usize,
    pub rows: usize,
    pub cols: usize,
    pub value: DType,
    pub index: DType,
}

fn layout_name(l: DenseLayout) -> &'static str {
    match l {
        DenseLayout::RowMajor => "row-major",
        DenseLayout::ColMajor => "col-major",
    }
}

impl BlockCase {
    pub fn name(&self) -> String {
        let kind = match self.kind {
            BlockKind::Convert { duplicates } => format!("csr->bsr->bell{}", if duplicates { " dup" } else { "" }),
            BlockKind::Spmv { alpha, beta } => format!("spmv alpha {alpha} beta {beta}"),
            BlockKind::Spmm {
                n,
                layout,
                alpha,
                beta,
                path,
            } => {
                let mut s = format!("spmm n {n} {} alpha {alpha} beta {beta}", layout_name(layout));
                if let Some(p) = path {
                    s.push_str(&format!(" forced {p:?}"));
                }
                s
            }
            BlockKind::BadInput => "bad input".to_string(),
        };
        format!(
            "block {:?} b{} {kind} {} {} {}x{} {} idx",
            self.format,
            self.block,
            self.source.name(),
            self.value,
            self.rows,
            self.cols,
            self.index
        )
    }
    pub fn params(&self) -> Value {
        let mut p = json!({
            "format": format!("{:?}", self.format), "block": self.block, "class": self.source.name(),
            "rows": self.rows, "cols": self.cols, "dtype": self.value.name(), "index": self.index.name(),
        });
        match self.kind {
            BlockKind::Spmv { alpha, beta } => {
                p["alpha"] = json!(alpha);
                p["beta"] = json!(beta);
            }
            BlockKind::Spmm {
                n,
                layout,
                alpha,
                beta,
                path,
            } => {
                p["n"] = json!(n);
                p["layout"] = json!(format!("{layout:?}"));
                p["alpha"] = json!(alpha);
                p["beta"] = json!(beta);
                p["path"] = json!(path.map(|p| format!("{p:?}")));
            }
            _ => {}
        }
        p
    }
}

fn blocks(block: usize, density: f64, fill: f64, empty: f64) -> BlockSource {
    BlockSource::Blocks(BlockSparse {
        block,
        density,
        fill,
        empty_block_rows: empty,
    })
}

/// The block verification cases (`quick`: a few for the sanitizers).
pub fn cases(quick: bool) -> Vec<BlockCase> {
    let mut out = Vec::new();
    let values = [DType::F32, DType::F64, DType::F16, DType::BF16];
    let ab = [(1.0, 0.0), (-0.5, 2.0), (1.5, -1.0)];
    let mut i = 0usize;
    for b in super::block::BLOCK_SIZES {
        // odd shapes (never multiples of b), empty block rows, tiny and empty matrices
        let shapes: [(BlockSource, usize, usize); 6] = [
            (blocks(b, 0.1, 0.7, 0.2), 1003, 777),
            (blocks(b, 0.3, 1.0, 0.0), 129, 31),
            (blocks(b, 0.5, 0.5, 0.0), 1, 40),
            (blocks(b, 0.5, 0.5, 0.0), 40, 1),
            (blocks(b, 0.0, 1.0, 0.0), 257, 100),
            (
                BlockSource::Class(MatrixClass::PowerLaw {
                    mean: 8.0,
                    exponent: 2.0,
                }),
                517,
                389,
            ),
        ];
        for (s, &(source, rows, cols)) in shapes.iter().enumerate() {
            i += 1;
            if quick && (s != 0 || b != 16) {
                continue;
            }
            let index = if i % 2 == 0 { DType::I32 } else { DType::I64 };
            let case = |kind, format, value| BlockCase {
                kind,
                format,
                source,
                block: b,
                rows,
                cols,
                value,
                index,
            };
            out.push(case(
                BlockKind::Convert { duplicates: s == 0 },
                BlockFormat::Bsr,
                values[i % 4],
            ));
            for (j, format) in [BlockFormat::Bsr, BlockFormat::BsrHost, BlockFormat::Bell]
                .into_iter()
                .enumerate()
            {
                let (alpha, beta) = ab[(i + j) % 3];
                out.push(case(BlockKind::Spmv { alpha, beta }, format, values[(i + j) % 4]));
            }
            // SpMM: every N on the first shape in both layouts, else two
            let ns: &[usize] = if s == 0 { &[1, 2, 7, 32, 129] } else { &[7, 32] };
            for (k, &n) in ns.iter().enumerate() {
                for (l, layout) in [DenseLayout::RowMajor, DenseLayout::ColMajor].into_iter().enumerate() {
                    let (alpha, beta) = ab[(i + k + l) % 3];
                    let format = [BlockFormat::Bsr, BlockFormat::Bell, BlockFormat::BsrHost][(k + l) % 3];
                    let spmm = BlockKind::Spmm {
                        n,
                        layout,
                        alpha,
                        beta,
                        path: None,
                    };
                    if quick {
                        out.push(case(spmm, format, DType::F16));
                        continue;
                    }
                    // with tensor cores (b = 16, 32) every dtype; else one per (n, layout)
                    if b >= 16 && s == 0 {
                        for value in values {
                            out.push(case(spmm, format, value));
                        }
                    } else {
                        out.push(case(spmm, format, values[(i + k + l) % 4]));
                    }
                }
            }
        }
        if !quick {
            let source = blocks(b, 0.2, 0.8, 0.1);
            out.push(BlockCase {
                kind: BlockKind::BadInput,
                format: if b >= 16 { BlockFormat::Bell } else { BlockFormat::Bsr },
                source,
                block: b,
                rows: 203,
                cols: 97,
                // bf16 on 32 x 32 blocks: the forced CUDA-core path must be refused there
                value: match b {
                    2 => DType::F64,
                    4 => DType::F16,
                    8 => DType::BF16,
                    16 => DType::F32,
                    _ => DType::BF16,
                },
                index: DType::I32,
            });
        }
    }
    // the CUDA-core path forced for halves with 16 x 16 blocks (the tensor path's twin)
    if !quick {
        for value in [DType::F16, DType::BF16] {
            for layout in [DenseLayout::RowMajor, DenseLayout::ColMajor] {
                out.push(BlockCase {
                    kind: BlockKind::Spmm {
                        n: 33,
                        layout,
                        alpha: 0.5,
                        beta: -1.0,
                        path: Some(BlockPath::CudaCores),
                    },
                    format: BlockFormat::Bsr,
                    source: blocks(16, 0.1, 1.0, 0.1),
                    block: 16,
                    rows: 1003,
                    cols: 777,
                    value,
                    index: DType::I32,
                });
            }
        }
        // the staged tensor-core path (opt-in; row-major, n % 8 == 0): every tile width, both
        // halves and block sizes, both formats, cols not a multiple of the block (zero-filled
        // B rows), empty block rows
        for (b, value, format, n, n8) in [
            (16, DType::F16, BlockFormat::Bsr, 40, 4),
            (16, DType::BF16, BlockFormat::Bell, 8, 1),
            (16, DType::F16, BlockFormat::BsrHost, 128, 4),
            (32, DType::F16, BlockFormat::Bell, 136, 2),
            (32, DType::BF16, BlockFormat::Bsr, 136, 4),
            (32, DType::BF16, BlockFormat::Bsr, 16, 1),
        ] {
            out.push(BlockCase {
                kind: BlockKind::Spmm {
                    n,
                    layout: DenseLayout::RowMajor,
                    alpha: -0.75,
                    beta: if n8 == 4 { 0.0 } else { 1.5 },
                    path: Some(BlockPath::TensorCoresStaged { n8 }),
                },
                format,
                source: blocks(b, 0.1, 0.8, 0.2),
                block: b,
                rows: 1003,
                cols: 777,
                value,
                index: if b == 16 { DType::I32 } else { DType::I64 },
            });
        }
        // every tensor-core tile width, forced, on an N that is no multiple of any
        for n8 in [1, 2, 4] {
            out.push(BlockCase {
                kind: BlockKind::Spmm {
                    n: 45,
                    layout: DenseLayout::RowMajor,
                    alpha: 1.0,
                    beta: 0.5,
                    path: Some(BlockPath::TensorCores { n8 }),
                },
                format: BlockFormat::Bell,
                source: blocks(32, 0.1, 0.9, 0.0),
                block: 32,
                rows: 1003,
                cols: 777,
                value: DType::BF16,
                index: DType::I64,
            });
        }
    }
    out
}

/// Runs one block case on the GPU.
pub fn verify_case(ctx: &Context, case: &BlockCase, seed: u64) -> Result<VerifyOutcome> {
    with_types!("sparse block verify", case.value, case.index, run(ctx, case, seed))
}

/// The host matrix of a case; with `duplicates`, some entries stored twice (unsorted rows).
fn host_matrix<T: Element, I: SparseIndex>(case: &BlockCase, seed: u64, duplicates: bool) -> Result<CsrHost<T, I>> {
    let a: CsrHost<T, I> = case.source.generate(case.rows, case.cols, seed)?;
    if !duplicates {
        return Ok(a);
    }
    // every 5th entry of each row stored again at the row's front: unsorted, duplicates kept
    let mut offsets = vec![I::ZERO];
    let (mut indices, mut values) = (Vec::new(), Vec::new());
    for r in 0..a.rows {
        let (cols, vals) = a.row(r);
        for k in (0..cols.len()).step_by(5) {
            indices.push(cols[k]);
            values.push(T::from_f64(vals[k].to_f64() * 0.25));
        }
        indices.extend_from_slice(cols);
        values.extend_from_slice(vals);
        offsets.push(I::from_usize(indices.len()).ok_or_else(|| Error::Unsupported("nnz does not fit".into()))?);
    }
    CsrHost::new(
        a.rows,
        a.cols,
        offsets,
        indices,
        values,
        &CsrCheck {
            order: ColumnOrder::Unsorted,
            duplicates: Duplicates::Sum,
        },
    )
}

/// A device block matrix of either format, for the product cases.
enum Device<T: Element, I: SparseIndex> {
    Bsr(std::sync::Arc<BsrMatrix<T, I>>),
    Bell(std::sync::Arc<BellMatrix<T, I>>),
}

impl<T: Element, I: SparseIndex> Device<T, I> {
    fn make(ctx: &Context, case: &BlockCase, host: &CsrHost<T, I>, csr: &CsrMatrix<T, I>) -> Result<Self> {
        Ok(match case.format {
            BlockFormat::Bsr => Device::Bsr(csr.bsr(case.block)?),
            BlockFormat::BsrHost => Device::Bsr(std::sync::Arc::new(BsrMatrix::from_host(
                ctx,
                &BsrHost::from_csr(host, case.block)?,
            )?)),
            BlockFormat::Bell => Device::Bell(csr.blocked_ell(case.block)?),
        })
    }
    fn spmv(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        match self {
            Device::Bsr(m) => m.spmv(alpha, x, beta, y),
            Device::Bell(m) => m.spmv(alpha, x, beta, y),
        }
    }
    #[allow(clippy::too_many_arguments)]
    fn spmm(
        &self,
        path: Option<BlockPath>,
        alpha: f64,
        b: &DeviceBuffer<T>,
        n: usize,
        layout: DenseLayout,
        beta: f64,
        c: &mut DeviceBuffer<T>,
    ) -> Result<String> {
        let v = match (self, path) {
            (Device::Bsr(m), Some(p)) => m.spmm_on(p, alpha, b, n, layout, beta, c)?,
            (Device::Bell(m), Some(p)) => m.spmm_on(p, alpha, b, n, layout, beta, c)?,
            (Device::Bsr(m), None) => {
                m.spmm(alpha, b, n, layout, beta, c)?;
                m.spmm_variant(n, layout)
            }
            (Device::Bell(m), None) => {
                m.spmm(alpha, b, n, layout, beta, c)?;
                m.spmm_variant(n, layout)
            }
        };
        Ok(v.path_name())
    }
}

fn run<T: Element, I: SparseIndex>(ctx: &Context, case: &BlockCase, seed: u64) -> Result<VerifyOutcome> {
    match case.kind {
        BlockKind::Convert { duplicates } => run_convert::<T, I>(ctx, case, seed, duplicates),
        BlockKind::Spmv { alpha, beta } => run_spmv::<T, I>(ctx, case, seed, alpha, beta),
        BlockKind::Spmm {
            n,
            layout,
            alpha,
            beta,
            path,
        } => run_spmm::<T, I>(ctx, case, seed, (n, layout), (alpha, beta), path),
        BlockKind::BadInput => run_bad_input::<T, I>(ctx, case, seed),
    }
}

/// The start of an output: NaN when beta == 0 (must not be read), else random.
fn initial_output<T: Element>(len: usize, beta: f64, seed: u64) -> Vec<T> {
    if beta == 0.0 {
        vec![T::from_f64(f64::NAN); len]
    } else {
        random_vector(len, seed).into_iter().map(T::from_f64).collect()
    }
}

fn run_spmv<T: Element, I: SparseIndex>(
    ctx: &Context,
    case: &BlockCase,
    seed: u64,
    alpha: f64,
    beta: f64,
) -> Result<VerifyOutcome> {
    let host = host_matrix::<T, I>(case, seed, false)?;
    let x: Vec<T> = random_vector(case.cols, seed ^ 0x5eed)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let y0: Vec<T> = initial_output(case.rows, beta, seed ^ 0xbeef);
    let mut want = to_f64_vec(&y0);
    reference::spmv(&host, alpha, &to_f64_vec(&x), beta, &mut want);
    let csr = CsrMatrix::from_host(ctx, &host)?;
    let m = Device::make(ctx, case, &host, &csr)?;
    let dx = upload_nonempty(ctx, &x)?;
    let mut dy = upload_nonempty(ctx, &y0)?;
    m.spmv(alpha, &dx, beta, &mut dy)?;
    let first = dy.to_host()?;
    let mut dy2 = upload_nonempty(ctx, &y0)?;
    m.spmv(alpha, &dx, beta, &mut dy2)?;
    let second = dy2.to_host()?;
    Ok(judge(
        case.name(),
        case.params(),
        format!("{:?} b{}", case.format, case.block),
        &first[..case.rows],
        Some(&second[..case.rows]),
        &want,
    ))
}

fn run_spmm<T: Element, I: SparseIndex>(
    ctx: &Context,
    case: &BlockCase,
    seed: u64,
    (n, layout): (usize, DenseLayout),
    (alpha, beta): (f64, f64),
    path: Option<BlockPath>,
) -> Result<VerifyOutcome> {
    let host = host_matrix::<T, I>(case, seed, false)?;
    let b: Vec<T> = random_vector(case.cols * n, seed ^ 0x5eed)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let c0: Vec<T> = initial_output(case.rows * n, beta, seed ^ 0xbeef);
    let mut want = to_f64_vec(&c0);
    reference::spmm(&host, alpha, &to_f64_vec(&b), n, layout, beta, &mut want, layout);
    let csr = CsrMatrix::from_host(ctx, &host)?;
    let m = Device::make(ctx, case, &host, &csr)?;
    let db = upload_nonempty(ctx, &b)?;
    let mut dc = upload_nonempty(ctx, &c0)?;
    let path_name = m.spmm(path, alpha, &db, n, layout, beta, &mut dc)?;
    let first = dc.to_host()?;
    let mut dc2 = upload_nonempty(ctx, &c0)?;
    m.spmm(path, alpha, &db, n, layout, beta, &mut dc2)?;
    let second = dc2.to_host()?;
    let len = case.rows * n;
    Ok(judge(
        case.name(),
        case.params(),
        path_name,
        &first[..len],
        Some(&second[..len]),
        &want,
    ))
}

/// Bitwise equality of two slices of values (NaN equal to NaN of the same bits).
fn same_bits<T: Element>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}

fn run_convert<T: Element, I: SparseIndex>(
    ctx: &Context,
    case: &BlockCase,
    seed: u64,
    duplicates: bool,
) -> Result<VerifyOutcome> {
    let host = host_matrix::<T, I>(case, seed, duplicates)?;
    let b = case.block;
    let want_bsr = BsrHost::from_csr(&host, b)?;
    let want_bell = BellHost::from_bsr(&want_bsr)?;
    let mut problems = Vec::new();
    let mut csr = CsrMatrix::from_host(ctx, &host)?;
    let bsr = csr.bsr(b)?;
    let got = bsr.to_host()?;
    if got.block_offsets != want_bsr.block_offsets || got.block_indices != want_bsr.block_indices {
        problems.push(format!(
            "BSR structure differs from the host's ({} vs {} blocks)",
            got.block_indices.len(),
            want_bsr.block_indices.len()
        ));
    } else if !same_bits(&got.values, &want_bsr.values) {
        problems.push("BSR values differ from the host's".into());
    }
    if bsr.conversion().is_none() {
        problems.push("the device BSR carries no conversion report".into());
    }
    let bell = csr.blocked_ell(b)?;
    let got_bell = bell.to_host()?;
    if got_bell.width != want_bell.width || got_bell.block_indices != want_bell.block_indices {
        problems.push(format!(
            "Blocked-ELL structure differs (width {} vs {})",
            got_bell.width, want_bell.width
        ));
    } else if !same_bits(&got_bell.values, &want_bell.values) {
        problems.push("Blocked-ELL values differ from the host's".into());
    }
    // cached: the same matrices again
    if !std::sync::Arc::ptr_eq(&bsr, &csr.bsr(b)?) || !std::sync::Arc::ptr_eq(&bell, &csr.blocked_ell(b)?) {
        problems.push("bsr()/blocked_ell() converted again instead of using the cache".into());
    }
    // new values: the caches are dropped and the next conversion sees them
    let new_values: Vec<T> = random_vector(host.nnz(), seed ^ 0x7a1)
        .into_iter()
        .map(T::from_f64)
        .collect();
    csr.update_values(&new_values)?;
    let updated = CsrHost {
        values: new_values,
        ..host.clone()
    };
    let again = csr.bsr(b)?;
    if std::sync::Arc::ptr_eq(&bsr, &again) {
        problems.push("update_values kept the cached BSR".into());
    }
    let want_again = BsrHost::from_csr(&updated, b)?;
    if !same_bits(&again.to_host()?.values, &want_again.values) {
        problems.push("BSR after update_values differs from the host's".into());
    }
    if !same_bits(
        &csr.blocked_ell(b)?.to_host()?.values,
        &BellHost::from_bsr(&want_again)?.values,
    ) {
        problems.push("Blocked-ELL after update_values differs from the host's".into());
    }
    let note = bsr.conversion().map(|r| r.to_string());
    let mut outcome = with_problems(
        judge::<f32>(case.name(), case.params(), "convert".into(), &[], None, &[]),
        problems,
    );
    if outcome.note.is_none() {
        outcome.note = note;
    }
    Ok(outcome)
}

/// Every bad call errors and leaves the output bitwise unchanged.
fn run_bad_input<T: Element, I: SparseIndex>(ctx: &Context, case: &BlockCase, seed: u64) -> Result<VerifyOutcome> {
    let host = host_matrix::<T, I>(case, seed, false)?;
    let csr = CsrMatrix::from_host(ctx, &host)?;
    let m = Device::make(ctx, case, &host, &csr)?;
    let (rows, cols, n) = (case.rows, case.cols, 8);
    let mut problems = Vec::new();
    let c0: Vec<T> = random_vector(rows * n, seed).into_iter().map(T::from_f64).collect();
    let b_ok = upload_nonempty(ctx, &vec![T::from_f64(1.0); cols * n])?;
    let b_short = upload_nonempty(ctx, &vec![T::from_f64(1.0); cols * n - 1])?;
    let expect_err = |problems: &mut Vec<String>, what: &str, r: Result<String>, c: &DeviceBuffer<T>| -> Result<()> {
        if r.is_ok() {
            problems.push(format!("{what}: accepted"));
        }
        if !same_bits(&c.to_host()?[..rows * n], &c0) {
            problems.push(format!("{what}: C was written"));
        }
        Ok(())
    };
    let mut c = upload_nonempty(ctx, &c0)?;
    let row = DenseLayout::RowMajor;
    let r = m.spmm(None, 1.0, &b_short, n, row, 0.0, &mut c);
    expect_err(&mut problems, "B one element short", r, &c)?;
    let mut c_short = upload_nonempty(ctx, &c0[..rows * n - 1])?;
    let r = m.spmm(None, 1.0, &b_ok, n, row, 0.0, &mut c_short);
    if r.is_ok() {
        problems.push("C one element short: accepted".into());
    }
    let r = m.spmm(None, f64::NAN, &b_ok, n, row, 0.0, &mut c);
    expect_err(&mut problems, "alpha NaN", r, &c)?;
    let r = m.spmm(None, 1.0, &b_ok, 0, row, 0.0, &mut c);
    expect_err(&mut problems, "n = 0", r, &c)?;
    let r = m.spmm(Some(BlockPath::TensorCores { n8: 3 }), 1.0, &b_ok, n, row, 0.0, &mut c);
    expect_err(&mut problems, "n8 = 3", r, &c)?;
    if !super::bsr::cuda_cores_available(T::DTYPE, case.block) {
        let r = m.spmm(Some(BlockPath::CudaCores), 1.0, &b_ok, n, row, 0.0, &mut c);
        expect_err(&mut problems, "CUDA cores forced where they do not apply", r, &c)?;
    }
    if !super::bsr::uses_tensor_cores(T::DTYPE, case.block) {
        let r = m.spmm(Some(BlockPath::TensorCores { n8: 1 }), 1.0, &b_ok, n, row, 0.0, &mut c);
        expect_err(&mut problems, "tensor cores forced where they do not apply", r, &c)?;
    } else {
        // the staged path takes row-major B and C with n % 8 == 0 only
        let staged = Some(BlockPath::TensorCoresStaged { n8: 1 });
        let r = m.spmm(staged, 1.0, &b_ok, 7, row, 0.0, &mut c);
        expect_err(&mut problems, "staged with n = 7", r, &c)?;
        let r = m.spmm(staged, 1.0, &b_ok, n, DenseLayout::ColMajor, 0.0, &mut c);
        expect_err(&mut problems, "staged column-major", r, &c)?;
    }
    // SpMV: x one short, y one short
    let x_short = upload_nonempty(ctx, &vec![T::from_f64(1.0); cols - 1])?;
    let r = m.spmv(1.0, &x_short, 0.0, &mut c).map(|_| String::new());
    expect_err(&mut problems, "x one element short", r, &c)?;
    // conversions with block sizes outside 2, 4, 8, 16, 32
    for bad in [0, 3, 12, 64] {
        if csr.to_bsr(bad).is_ok() || csr.to_blocked_ell(bad).is_ok() {
            problems.push(format!("block {bad}: accepted"));
        }
    }
    Ok(with_problems(
        judge::<f32>(case.name(), case.params(), "errors".into(), &[], None, &[]),
        problems,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_cover_every_block_size_n_layout_and_dtype() {
        let c = cases(false);
        let mut names: Vec<String> = c.iter().map(|c| c.name()).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "case names are unique");
        for b in super::super::block::BLOCK_SIZES {
            for want in [1, 2, 7, 32, 129] {
                assert!(c
                    .iter()
                    .any(|c| c.block == b && matches!(c.kind, BlockKind::Spmm { n, .. } if n == want)));
            }
            assert!(c.iter().any(|c| c.block == b && matches!(c.kind, BlockKind::BadInput)));
            assert!(c.iter().any(|c| c.block == b && c.format == BlockFormat::Bell));
        }
        for value in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            assert!(c
                .iter()
                .any(|c| c.value == value && c.block == 16 && matches!(c.kind, BlockKind::Spmm { .. })));
        }
        assert!(!cases(true).is_empty() && cases(true).len() < 20);
    }

    #[test]
    fn duplicated_host_matrices_keep_the_sum() {
        let case = &cases(false)[0];
        assert!(matches!(case.kind, BlockKind::Convert { duplicates: true }));
        let plain = host_matrix::<f64, i32>(case, 5, false).unwrap();
        let dup = host_matrix::<f64, i32>(case, 5, true).unwrap();
        assert!(dup.nnz() > plain.nnz());
        let (p, d) = (plain.to_dense_f64(), dup.to_dense_f64());
        assert!(p.iter().zip(&d).any(|(a, b)| a != b), "duplicates change the matrix");
        // the host BSR of the duplicated matrix is its dense form, duplicates summed
        let bsr = BsrHost::from_csr(&dup, case.block).unwrap();
        for (x, y) in bsr.to_dense_f64().iter().zip(&d) {
            assert!((x - y).abs() <= 1e-15 * y.abs().max(1.0));
        }
    }
}
