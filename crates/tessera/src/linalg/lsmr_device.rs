//! LSMR on the GPU ([`lsmr`]): SciPy's `lsmr` semantics (the options, stopping rules and
//! returns of [`lsmr_host`](super::lsmr_host), which is its reference), with the matrix behind
//! a device [`LinearOperator`] and the iteration entirely on the device.
//!
//! # Precision
//!
//! `T = f64`: everything in f64. `T = f32`: the vectors (`u`, `v`, `h`, `hbar`, `x`) are stored
//! in f32 and the products are f32 SpMVs, but every element update is computed in f64 and
//! rounded once, the norms are summed in f64, and the scalar recurrences (rotations, the
//! estimates, the stopping tests) are f64 throughout. An f32 solve therefore stops on the same
//! rules as an f64 one, but its iterates carry f32 rounding: it reaches about 1e-6 relative
//! accuracy on well-conditioned problems, and `atol`/`btol` much below 1e-6 are not reachable
//! (it then stops by another rule, typically `maxiter` or a machine-precision test).
//!
//! # Device design (lsmr.cu has the kernel-level detail)
//!
//! Per iteration four launches: the two products of the operator into work vectors and two
//! fused vector kernels (the `u` update, and the `v` update; `u` and `v` stay unnormalised in
//! memory, their scales applied where they are read) that each write a per-CTA partial sum of
//! squares. The `h`, `hbar`, `x` updates of an iteration wait for the next iteration's `u`
//! update kernel, whose first CTAs do them (nothing of the next product or of `u` reads
//! them): one launch fewer per iteration; the last iteration before a check point gets its own
//! `lsmr_update_x` launch. The last CTA to finish the `u` and the `v` update (an
//! integer count per row of CTAs) then runs the scalar step of the iteration: it adds the
//! partials in a fixed order (deterministic two-pass norms, no float atomics) and runs the
//! recurrences and every stopping test on f64 state structs in device memory ([`LsmrShared`],
//! and one [`LsmrDamp`] per damp). The setup and the check points run the same steps as a
//! one-CTA scalar kernel (`lsmr_scalar`).
//! When a test holds, the state's stop flag is set and every later kernel of the solver returns
//! at once, so the result is the iterate at which the rules first held, exactly as if the host
//! had checked after every iteration.
//!
//! # Column scaling
//!
//! With [`LsmrOptions::scale_columns`] the solver runs on `A D`, `D = diag(1 / ||A_j||)` from
//! the operator's [`column_norms`](LinearOperator::column_norms) (rounded to `T`): `D` is
//! folded into `lsmr_update_v` (`v = D (A^T u) / beta - ...`, and it writes `D v` for the next
//! product), so scaling costs one more read of `D` and one more write of `D v` per iteration,
//! no extra launch. `x = D y` is formed on the host at the end; the estimates refer to the
//! scaled problem (as in [`lsmr_host`](super::lsmr_host), see [`LsmrOptions::scale_columns`]).
//!
//! # The damp list
//!
//! [`lsmr_damps`] solves `min ||[b; 0] - [A; damp_j I] x_j||` for `k` damping factors in one
//! run. The bidiagonalisation (`u`, `v`, `alpha`, `beta`, both products, `||A||`) does not
//! depend on `damp`, so it runs once; each damp has its own f64 state ([`LsmrDamp`]: rotations,
//! estimates, stop flag) and its own `h`, `hbar`, `x`. `lsmr_update_x` has one row of CTAs per
//! damp (all reading the one `v`), the scalar step runs the damps' recurrences one thread each
//! and their stopping tests one warp each. A damp that stops freezes (its kernels' work returns
//! at once); the run ends when every damp has stopped. Each result is that of a separate
//! [`lsmr`] with that damp, up to the summation order of `||x||` (the same kernels compute it;
//! verify checks it). Up to [`MAX_DAMPS`] damps share one run; a longer list is solved in
//! several runs of at most [`MAX_DAMPS`].
//!
//! # Many right-hand sides
//!
//! [`lsmr_many`] solves the `k` columns of `B` (`m x k`, column-major, [`ManyRhs`]) in one run,
//! each column its own LSMR (its own `u`, `v`, `alpha`, `beta`, estimates and stop): the state
//! is `k` records of ([`LsmrShared`], [`LsmrDamp`]) ([`COLUMN_LEN`] doubles each), every vector
//! an `m x k` or `n x k` block, every vector kernel has one row of CTAs per column
//! (`gridDim.y = k`) and the scalar step runs per column (the last CTA of the column's row;
//! `lsmr_scalar`: one CTA per column). What the columns share is the
//! operator's products: one [`apply_many`](LinearOperator::apply_many) and one
//! [`apply_transposed_many`](LinearOperator::apply_transposed_many) per iteration (SpMM for the
//! sparse operators). A column that stopped freezes as a damp of the damp list does (its
//! kernels return at once; the batched products still compute its column, into work vectors
//! only); the run ends when every column has stopped. Up to [`MAX_RHS`] columns per run, as
//! device memory allows ([`many_bytes`], checked before any allocation).
//!
//! The host queues [`LsmrRunOptions::check_every`] iterations (default
//! [`DEFAULT_CHECK_EVERY`]), then a test kernel, then reads the state (104 bytes plus 224 per
//! damp; one synchronisation) to see the stop flag and report progress. Up to `check_every - 1`
//! iterations may be queued after the stop: their vector kernels return at once, and their
//! products are given the stop flag ([`LinearOperator::apply_unless`]): the sparse operators'
//! SpMV kernels return at once too, so a wasted iteration costs its launches, not two passes
//! over `A` (operators that ignore the flag still run them, into the work vectors only). The
//! loop allocates no device memory: the vectors, the partials and the state are allocated once
//! per solve.

use std::sync::Arc;
use std::time::Instant;

use super::device_operator::LinearOperator;
use super::lsmr::{check_damps, check_problem, column_scale, LsmrOptions, LsmrResult};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::StreamGraph;
use crate::runtime::{Context, DeviceBuffer, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig, WorkCounters};
use crate::sparse::SkipIf;

/// Source of the solver's kernels.
pub const SOURCE: &str = include_str!("lsmr.cu");
/// Threads per CTA of every kernel.
pub const BLOCK_THREADS: u32 = 256;
/// The most CTAs of a vector kernel: the length of each partial-sum array.
pub const MAX_PARTIALS: usize = 1024;
/// Iterations queued between two looks at the stop flag.
pub const DEFAULT_CHECK_EVERY: usize = 16;
/// The most damps that share one run of [`lsmr_damps`] (a longer list runs in chunks): bounds
/// the per-damp partial sums (`MAX_DAMPS * MAX_PARTIALS` doubles, 512 KiB) and the grid rows
/// of `lsmr_update_x`.
pub const MAX_DAMPS: usize = 64;

/// The kernels of lsmr.cu.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LsmrKernel {
    SumSq,
    UpdateU,
    UpdateV,
    UpdateX,
    Scalar,
}

impl LsmrKernel {
    pub const ALL: [LsmrKernel; 5] = [
        LsmrKernel::SumSq,
        LsmrKernel::UpdateU,
        LsmrKernel::UpdateV,
        LsmrKernel::UpdateX,
        LsmrKernel::Scalar,
    ];
    fn entry(self) -> &'static str {
        match self {
            LsmrKernel::SumSq => "lsmr_sumsq",
            LsmrKernel::UpdateU => "lsmr_update_u",
            LsmrKernel::UpdateV => "lsmr_update_v",
            LsmrKernel::UpdateX => "lsmr_update_x",
            LsmrKernel::Scalar => "lsmr_scalar",
        }
    }
}

/// One kernel variant: which kernel and the vector type (the scalar kernel has none).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LsmrVariant {
    pub kernel: LsmrKernel,
    pub value: DType,
}

impl LsmrVariant {
    pub fn key(&self) -> KernelKey {
        let key = KernelKey::new(self.kernel.entry());
        let key = if self.kernel == LsmrKernel::Scalar {
            key.ty("Val", DType::F64)
        } else {
            key.ty("Val", self.value)
        };
        key.int("kBlockThreads", "t", BLOCK_THREADS)
            .int("kMaxPartials", "p", MAX_PARTIALS as i64)
    }
    pub fn spec(&self) -> KernelSpec {
        self.key().spec("lsmr.cu", SOURCE, self.kernel.entry(), &[])
    }
}

/// Every variant (what CI compiles): four vector kernels for f32 and f64, one scalar kernel.
pub fn all_variants() -> Vec<LsmrVariant> {
    let mut v = Vec::new();
    for value in [DType::F32, DType::F64] {
        for kernel in LsmrKernel::ALL {
            if kernel != LsmrKernel::Scalar {
                v.push(LsmrVariant { kernel, value });
            }
        }
    }
    v.push(LsmrVariant {
        kernel: LsmrKernel::Scalar,
        value: DType::F64,
    });
    v
}

/// The shared f64 state of one run: `struct LsmrShared` of lsmr.cu, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LsmrShared {
    pub atol: f64,
    pub btol: f64,
    pub ctol: f64,
    pub maxiter: f64,
    pub stop: f64,
    pub itn: f64,
    pub early: f64,
    pub normb: f64,
    pub alpha: f64,
    pub beta: f64,
    pub u_scale: f64,
    pub v_scale: f64,
    pub norma2: f64,
}

/// The slot of [`LsmrShared::stop`] in the state buffer (the shared record comes first): the
/// flag the operator products are skipped on once the run has stopped.
const STOP_SLOT: usize = std::mem::offset_of!(LsmrShared, stop) / std::mem::size_of::<f64>();

/// The f64 state of one damp: `struct LsmrDamp` of lsmr.cu, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LsmrDamp {
    pub damp: f64,
    pub stop: f64,
    pub istop: f64,
    pub itn: f64,
    pub tested_itn: f64,
    pub zetabar: f64,
    pub alphabar: f64,
    pub rho: f64,
    pub rhobar: f64,
    pub cbar: f64,
    pub sbar: f64,
    pub betadd: f64,
    pub betad: f64,
    pub rhodold: f64,
    pub tautildeold: f64,
    pub thetatilde: f64,
    pub zeta: f64,
    pub d: f64,
    pub maxrbar: f64,
    pub minrbar: f64,
    pub normr: f64,
    pub normar: f64,
    pub norma: f64,
    pub conda: f64,
    pub normx: f64,
    pub hbar_factor: f64,
    pub x_step: f64,
    pub h_factor: f64,
}

/// Doubles in [`LsmrShared`].
pub const SHARED_LEN: usize = std::mem::size_of::<LsmrShared>() / 8;
/// Doubles in [`LsmrDamp`].
pub const DAMP_LEN: usize = std::mem::size_of::<LsmrDamp>() / 8;
/// Doubles in one column's state record with many right-hand sides ([`LsmrShared`], then its
/// [`LsmrDamp`]).
pub const COLUMN_LEN: usize = SHARED_LEN + DAMP_LEN;
/// The most right-hand sides of one [`lsmr_many`] run (the vector kernels' `gridDim.y`).
pub const MAX_RHS: usize = 65_535;
const _: () = assert!(std::mem::size_of::<LsmrShared>() == 13 * 8);
const _: () = assert!(std::mem::size_of::<LsmrDamp>() == 28 * 8);

/// A `#[repr(C)]` struct of `f64` fields and its slots (what is uploaded and downloaded).
macro_rules! f64_slots {
    ($ty:ty, $len:expr) => {
        impl $ty {
            /// The state as its f64 slots.
            pub fn to_slots(&self) -> [f64; $len] {
                // SAFETY: #[repr(C)] struct of $len f64 fields: same size, alignment and no padding.
                unsafe { std::mem::transmute::<$ty, [f64; $len]>(*self) }
            }
            /// The state from its f64 slots (the first $len of `slots`, which must hold as many).
            pub fn from_slots(slots: &[f64]) -> $ty {
                let mut a = [0.0; $len];
                a.copy_from_slice(&slots[..$len]);
                // SAFETY: as in to_slots; every bit pattern is a valid f64.
                unsafe { std::mem::transmute::<[f64; $len], $ty>(a) }
            }
        }
    };
}
f64_slots!(LsmrShared, SHARED_LEN);
f64_slots!(LsmrDamp, DAMP_LEN);

/// Which early exit the setup took (SciPy's two returns before the first iteration).
const EARLY_NORMAR_ZERO: f64 = 1.0;
const EARLY_NORMB_ZERO: f64 = 2.0;

/// `ScalarMode` of lsmr.cu.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
enum ScalarMode {
    SetupBeta = 0,
    SetupAlpha = 1,
    IterBeta = 2,
    IterAlpha = 3,
    Test = 4,
}

/// `struct VecParams` of lsmr.cu (200 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct VecParams {
    a: u64,
    u: u64,
    h: u64,
    hbar: u64,
    x: u64,
    d: u64,
    dv: u64,
    partials: u64,
    shared: u64,
    damps: u64,
    len: i64,
    stride: i64,
    col_stride: i64,
    state_stride: i64,
    damp_stride: i64,
    first: i32,
    /// update_u, update_v after the setup: the last CTA of each grid row runs `scalar` for the
    /// row's record (kIterBeta, kIterAlpha).
    fused: i32,
    scalar: ScalarParams,
    /// [`WorkCounters`] of the fused tails, one per grid row.
    counters: u64,
    /// update_u: v, for the previous iteration's x update in its first `x_ctas * x_rows` CTAs.
    v: u64,
    /// update_u: the partials of `||x_j||` that x update writes.
    partials_x: u64,
    /// update_u: CTAs per damp (column) of the deferred x update; 0: none.
    x_ctas: i32,
    /// update_u: damps per grid row (the damp list: k; many right-hand sides: 1).
    x_rows: i32,
}
const _: () = assert!(std::mem::size_of::<VecParams>() == 224);
const _: () = assert!(std::mem::offset_of!(VecParams, scalar) == 128);
const _: () = assert!(std::mem::offset_of!(VecParams, x_ctas) == 216);
// SAFETY: #[repr(C)]: ten pointers as u64, five i64, two i32, a ScalarParams (64 bytes, 8-byte
// aligned, at 128 as in C), three pointers as u64, two i32, in the order and of the types of the
// kernel's struct (pointers, five long long, int, int, ScalarParams, int*, const Val*,
// double*, int, int).
unsafe impl KernelParams for VecParams {}

/// `struct ScalarParams` of lsmr.cu (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct ScalarParams {
    shared: u64,
    damps: u64,
    partials_u: u64,
    partials_v: u64,
    partials_x: u64,
    count_u: i32,
    count_v: i32,
    count_x: i32,
    mode: i32,
    k: i32,
    state_stride: i32,
}
const _: () = assert!(std::mem::size_of::<ScalarParams>() == 64);
// SAFETY: #[repr(C)]: five pointers as u64 then six i32, as the kernel's struct.
unsafe impl KernelParams for ScalarParams {}

/// CTAs of a vector kernel over `len` elements: one per BLOCK_THREADS elements, at most
/// `max_ctas` (itself at most [`MAX_PARTIALS`]; then grid-stride), at least 1.
pub fn vector_grid(len: usize, max_ctas: usize) -> u32 {
    len.div_ceil(BLOCK_THREADS as usize)
        .clamp(1, max_ctas.clamp(1, MAX_PARTIALS)) as u32
}

/// Vector-kernel CTAs per multiprocessor: one short wave. Each CTA's work is a chain of
/// latencies (state, loads, block sum, the count), so one wave of CTAs with several elements
/// per thread beats several waves of one element each (linalg/NOTES.md).
pub const VECTOR_CTAS_PER_SM: usize = 2;

/// The most CTAs of a vector kernel on a device of `sm_count` multiprocessors:
/// [`VECTOR_CTAS_PER_SM`] per multiprocessor, or `TESSERA_LSMR_MAX_CTAS` (for measurements;
/// the grid sets the order of the partial sums, so the last bits of a solve); at most
/// [`MAX_PARTIALS`].
pub fn max_vector_ctas(sm_count: u32) -> usize {
    static FORCED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let forced = *FORCED.get_or_init(|| {
        std::env::var("TESSERA_LSMR_MAX_CTAS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    });
    forced
        .unwrap_or(VECTOR_CTAS_PER_SM * sm_count as usize)
        .clamp(1, MAX_PARTIALS)
}

/// What the progress callback gets at each check: `(itn, normr, normar, elapsed seconds)`.
pub type ProgressFn<'a> = Box<dyn FnMut(usize, f64, f64, f64) + 'a>;

/// How the GPU solve runs (beyond SciPy's options in [`LsmrOptions`]).
pub struct LsmrRunOptions<'a> {
    /// Iterations queued between two looks at the stop flag (>= 1). Default
    /// [`DEFAULT_CHECK_EVERY`]. Only speed depends on it, never the result.
    pub check_every: usize,
    /// Called after each check with `(itn, normr, normar, elapsed seconds)` (with a damp
    /// list: the iterations of the run and the estimates of its first damp).
    pub progress: Option<ProgressFn<'a>>,
    /// Replay each batch of `check_every` iterations as one captured CUDA graph (see
    /// [`Context::capture_graph`]) where the operator allows it
    /// ([`LinearOperator::graph_capturable`]). The first batch always runs directly (it builds
    /// the operator's lazily made plans), as does a final shorter batch and every batch after a
    /// capture that failed. Only speed depends on it, never the result. Default false: the
    /// graph is captured and instantiated once per solve, which on a 105-iteration solve of the
    /// 306136 x 6177 benchmark system cost more than the replays saved (linalg/NOTES.md).
    pub graph: bool,
}

impl Default for LsmrRunOptions<'_> {
    fn default() -> Self {
        LsmrRunOptions {
            check_every: DEFAULT_CHECK_EVERY,
            progress: None,
            graph: false,
        }
    }
}

/// Solves `min ||[b; 0] - [A; damp I] x||_2` on the GPU by LSMR with SciPy's semantics: the
/// options, stopping rules and returns of [`lsmr_host`](super::lsmr_host) (see
/// [`lsmr`](mod@super::lsmr) for the contract); `x` is returned on the host in f64. `opts.show`
/// is ignored (use [`lsmr_with`] and a progress callback).
///
/// Errors (nothing runs): `b` of a length other than `m`; `x0` of a length other than `n`;
/// NaN or infinity in `b` or `x0`; `damp`, `atol`, `btol` or `conlim` negative, NaN or
/// infinite; `T` other than f32/f64. (NaN or infinity in `b` is found from its norm on the
/// device, after the setup kernels and before any iteration.)
pub fn lsmr<T: Element>(
    ctx: &Context,
    a: &dyn LinearOperator<T>,
    b: &DeviceBuffer<T>,
    opts: &LsmrOptions,
) -> Result<LsmrResult> {
    lsmr_with(ctx, a, b, opts, &mut LsmrRunOptions::default())
}

/// [`lsmr`] with the run options (check interval, progress callback).
pub fn lsmr_with<T: Element>(
    ctx: &Context,
    a: &dyn LinearOperator<T>,
    b: &DeviceBuffer<T>,
    opts: &LsmrOptions,
    run: &mut LsmrRunOptions<'_>,
) -> Result<LsmrResult> {
    let (m, n) = a.shape();
    validate::<T>(m, n, b, opts, run)?;
    let mut solver = Solver::<T>::new(ctx, m, n, 1, false)?;
    let mut results = solver.solve(a, b, &[opts.damp], opts, run)?;
    results
        .pop()
        .ok_or_else(|| Error::Unsupported("lsmr: the solve returned no result".into()))
}

/// The damp list on the GPU: solves `min ||[b; 0] - [A; damp_j I] x_j||_2` for every
/// `damp_j` of `damps`, sharing every product of the operator (module docs, "The damp list"),
/// and returns one result per damp in the order of `damps`: each what [`lsmr`] returns with
/// `damp = damps[j]` and the other options of `opts`. `opts.damp` must be left at 0.
/// At most [`MAX_DAMPS`] damps share one run; a longer list runs in chunks of [`MAX_DAMPS`].
///
/// Errors (nothing runs): those of [`lsmr`]; `damps` empty, or with an element negative, NaN
/// or infinite; `opts.damp != 0`.
pub fn lsmr_damps<T: Element>(
    ctx: &Context,
    a: &dyn LinearOperator<T>,
    b: &DeviceBuffer<T>,
    damps: &[f64],
    opts: &LsmrOptions,
) -> Result<Vec<LsmrResult>> {
    lsmr_damps_with(ctx, a, b, damps, opts, &mut LsmrRunOptions::default())
}

/// [`lsmr_damps`] with the run options (check interval, progress callback).
pub fn lsmr_damps_with<T: Element>(
    ctx: &Context,
    a: &dyn LinearOperator<T>,
    b: &DeviceBuffer<T>,
    damps: &[f64],
    opts: &LsmrOptions,
    run: &mut LsmrRunOptions<'_>,
) -> Result<Vec<LsmrResult>> {
    let (m, n) = a.shape();
    validate::<T>(m, n, b, opts, run)?;
    check_damps(damps, opts)?;
    let mut solver = Solver::<T>::new(ctx, m, n, damps.len().min(MAX_DAMPS), false)?;
    let mut results = Vec::with_capacity(damps.len());
    for chunk in damps.chunks(MAX_DAMPS) {
        results.extend(solver.solve(a, b, chunk, opts, run)?);
    }
    Ok(results)
}

/// The checks of [`lsmr_with`]'s arguments that need no device data (b's values are checked
/// through its norm, on the device).
pub fn validate<T: Element>(
    m: usize,
    n: usize,
    b: &DeviceBuffer<T>,
    opts: &LsmrOptions,
    run: &LsmrRunOptions<'_>,
) -> Result<()> {
    if !matches!(T::DTYPE, DType::F32 | DType::F64) {
        return Err(Error::Unsupported(format!(
            "LSMR on {} vectors; supported: fp32, fp64",
            T::DTYPE
        )));
    }
    check_problem(m, n, b.len(), opts)?;
    if run.check_every == 0 {
        return Err(Error::invalid("check_every", "is 0; must be at least 1"));
    }
    Ok(())
}

/// The kernels and device memory of one solve of an `m x n` problem with up to `k` damps, or
/// (`many`) with `k` right-hand sides.
struct Solver<T: Element> {
    ctx: Context,
    m: usize,
    n: usize,
    /// Damps (or right-hand sides) the buffers hold.
    k: usize,
    /// Many right-hand sides: `u`, `av` are `m x k`, `v`, `atu`, `dv` are `n x k` (column-major,
    /// packed), the state is `k` records of [`COLUMN_LEN`], every partial-sum array `k` deep.
    many: bool,
    /// The most CTAs of a vector kernel ([`max_vector_ctas`] of the device).
    max_ctas: usize,
    sumsq: Arc<Kernel>,
    update_u: Arc<Kernel>,
    update_v: Arc<Kernel>,
    update_x: Arc<Kernel>,
    scalar: Arc<Kernel>,
    u: DeviceBuffer<T>,
    av: DeviceBuffer<T>,
    v: DeviceBuffer<T>,
    atu: DeviceBuffer<T>,
    /// `k` vectors of `n` each (h, hbar, x).
    h: DeviceBuffer<T>,
    hbar: DeviceBuffer<T>,
    x: DeviceBuffer<T>,
    /// `D v` (column scaling: the input of `A`).
    dv: DeviceBuffer<T>,
    /// The column scale `D` of this solve (`None`: no scaling).
    d: Option<DeviceBuffer<T>>,
    partials_u: DeviceBuffer<f64>,
    partials_v: DeviceBuffer<f64>,
    /// `k` arrays of [`MAX_PARTIALS`] (setup: the partials of `||b||` in the first).
    partials_x: DeviceBuffer<f64>,
    /// [`LsmrShared`], then `k` [`LsmrDamp`].
    state: DeviceBuffer<f64>,
    /// The fused tails' CTA counts, one per grid row of update_u and update_v (many: `k`, else
    /// 1): zeroed here, re-armed by the kernels.
    counters: WorkCounters,
}

impl<T: Element> Solver<T> {
    fn new(ctx: &Context, m: usize, n: usize, k: usize, many: bool) -> Result<Self> {
        let kernel = |k| {
            ctx.kernel(
                &LsmrVariant {
                    kernel: k,
                    value: T::DTYPE,
                }
                .spec(),
            )
        };
        // every vector at least one element: a valid pointer for the kernels of an empty side
        let vec = |len: usize| ctx.alloc::<T>(len.max(1));
        let kn = k
            .checked_mul(n)
            .ok_or_else(|| Error::invalid("damps", format!("{k} damps of {n} unknowns overflow the vector size")))?;
        // the bidiagonalisation's vectors: one set, or one per column
        let cols = if many { k } else { 1 };
        let (cm, cn) = (cols * m, cols * n); // <= k * max(m, n): checked by validate_many
        let state_len = if many {
            COLUMN_LEN * k.max(1)
        } else {
            SHARED_LEN + DAMP_LEN * k.max(1)
        };
        Ok(Solver {
            ctx: ctx.clone(),
            m,
            n,
            k,
            many,
            max_ctas: max_vector_ctas(ctx.info().sm_count),
            sumsq: kernel(LsmrKernel::SumSq)?,
            update_u: kernel(LsmrKernel::UpdateU)?,
            update_v: kernel(LsmrKernel::UpdateV)?,
            update_x: kernel(LsmrKernel::UpdateX)?,
            scalar: kernel(LsmrKernel::Scalar)?,
            u: vec(cm)?,
            av: vec(cm)?,
            v: vec(cn)?,
            atu: vec(cn)?,
            h: vec(kn)?,
            hbar: vec(kn)?,
            x: vec(kn)?,
            dv: vec(cn)?,
            d: None,
            partials_u: ctx.alloc(MAX_PARTIALS * cols.max(1))?,
            partials_v: ctx.alloc(MAX_PARTIALS * cols.max(1))?,
            partials_x: ctx.alloc(MAX_PARTIALS * k.max(1))?,
            state: ctx.alloc(state_len)?,
            counters: WorkCounters::new(ctx, cols.max(1))?,
        })
    }

    /// CTAs of a vector kernel over `len` elements on this device.
    fn grid(&self, len: usize) -> u32 {
        vector_grid(len, self.max_ctas)
    }

    fn damps_ptr(&self) -> u64 {
        self.state.device_ptr() + (SHARED_LEN * 8) as u64
    }

    fn vec_params(&self, a: u64, u: u64, partials: &DeviceBuffer<f64>, len: usize, first: bool) -> VecParams {
        VecParams {
            a,
            u,
            h: self.h.device_ptr(),
            hbar: self.hbar.device_ptr(),
            x: self.x.device_ptr(),
            d: self.d.as_ref().map_or(0, |d| d.device_ptr()),
            dv: self.dv.device_ptr(),
            partials: partials.device_ptr(),
            shared: self.state.device_ptr(),
            damps: self.damps_ptr(),
            len: len as i64,
            stride: self.n as i64,
            // many: row c of CTAs works on column c of every vector (len elements apart);
            // the damp list: one u, v read by every row
            col_stride: if self.many { len as i64 } else { 0 },
            state_stride: if self.many { COLUMN_LEN as i64 } else { 0 },
            damp_stride: if self.many { COLUMN_LEN as i64 } else { DAMP_LEN as i64 },
            first: first as i32,
            fused: 0,
            scalar: ScalarParams::default(),
            counters: self.counters.ptr(),
            v: 0,
            partials_x: 0,
            x_ctas: 0,
            x_rows: 0,
        }
    }

    /// `p` (update_u) with the previous iteration's x update of `rows` damps (columns) per
    /// grid row in its first CTAs (lsmr_update_x's grid over n for each).
    fn with_x_update(&self, p: VecParams, rows: usize) -> VecParams {
        VecParams {
            v: self.v.device_ptr(),
            partials_x: self.partials_x.device_ptr(),
            x_ctas: self.grid(self.n) as i32,
            x_rows: rows as i32,
            ..p
        }
    }

    /// `p` (update_u or update_v after the setup) with the scalar step `mode` for `k` damps
    /// folded into its tail: the last CTA of each grid row runs it for the row's record.
    fn fused(&self, p: VecParams, mode: ScalarMode, k: usize) -> VecParams {
        VecParams {
            fused: 1,
            scalar: self.scalar_params(mode, k),
            ..p
        }
    }

    /// A vector kernel over `p.len` elements, with `rows` rows of CTAs (the damps of
    /// lsmr_update_x; many right-hand sides: the columns, every kernel; 1 otherwise).
    fn launch_vec(&self, kernel: &Kernel, p: &VecParams, rows: usize) -> Result<()> {
        if p.fused != 0 && rows > self.counters.len() {
            return Err(Error::invalid(
                "k",
                format!(
                    "{rows} rows of CTAs with a fused scalar step, {} counters",
                    self.counters.len()
                ),
            ));
        }
        // update_u with the deferred x update: its CTAs first, then the u update's
        let ctas = self.grid(p.len as usize) + (p.x_ctas * p.x_rows) as u32;
        let mut cfg = LaunchConfig::linear(ctas, BLOCK_THREADS, 0);
        cfg.grid.1 = rows as u32;
        // SAFETY: every pointer in p is one of this solver's buffers (or b, of m elements,
        // checked by validate): a, u hold >= len elements (many: >= rows * len, col_stride =
        // len); d (when not null) holds n and dv n (many: rows * n) and are read and written
        // by update_v only, which runs with len = n; h, hbar, x hold k * n and the kernel that
        // reads them runs with len = n, stride = n and rows <= k (solve checks k); update_u's
        // deferred x update (x_ctas > 0) reads v (n, many: k n) and updates the damps (columns)
        // blockIdx.y + 0 .. x_rows of n = stride elements each (the damp list: rows 1, x_rows
        // = k; many: x_rows 1, rows = k), its partials_x k MAX_PARTIALS doubles; partials hold
        // MAX_PARTIALS doubles per row (partials_x per damp) >= grid; the state SHARED_LEN +
        // k DAMP_LEN (many: k COLUMN_LEN, strides COLUMN_LEN). Fused: p.scalar as in
        // launch_scalar with one record per row (the damp list: rows 1, the one record), and
        // counters hold >= rows counts (checked). Each element is written by one thread;
        // VecParams mirrors the kernel's struct.
        unsafe { kernel.launch(&self.ctx, cfg, p) }
    }

    /// The scalar kernel in `mode` for `k` damps (many right-hand sides: `k` columns, one CTA
    /// each).
    fn launch_scalar(&self, mode: ScalarMode, k: usize) -> Result<()> {
        let p = self.scalar_params(mode, k);
        let ctas = if self.many { k as u32 } else { 1 };
        // SAFETY: the state holds SHARED_LEN + k DAMP_LEN doubles (many: k COLUMN_LEN, CTA c
        // at c COLUMN_LEN; k <= self.k, checked by solve); partials_u, partials_v MAX_PARTIALS
        // (many: per column), partials_x k MAX_PARTIALS doubles, of which the counts (each <=
        // MAX_PARTIALS) are read per damp (column). ScalarParams mirrors the kernel's.
        unsafe {
            self.scalar
                .launch(&self.ctx, LaunchConfig::linear(ctas, BLOCK_THREADS, 0), &p)
        }
    }

    /// The parameters of the scalar step `mode` for `k` damps (many right-hand sides: `k`
    /// columns, record c for CTA c of lsmr_scalar or grid row c of a fused tail).
    fn scalar_params(&self, mode: ScalarMode, k: usize) -> ScalarParams {
        ScalarParams {
            shared: self.state.device_ptr(),
            damps: self.damps_ptr(),
            partials_u: self.partials_u.device_ptr(),
            partials_v: self.partials_v.device_ptr(),
            partials_x: self.partials_x.device_ptr(),
            count_u: self.grid(self.m) as i32,
            count_v: self.grid(self.n) as i32,
            // setup: the partials of ||b|| (m elements) sit in partials_x
            count_x: self.grid(if mode == ScalarMode::SetupBeta { self.m } else { self.n }) as i32,
            mode: mode as i32,
            k: if self.many { 1 } else { k as i32 },
            state_stride: if self.many { COLUMN_LEN as i32 } else { 0 },
        }
    }

    /// The shared state and the first `k` damps' states.
    fn read_state(&self, k: usize) -> Result<(LsmrShared, Vec<LsmrDamp>)> {
        let slots = self.state.to_host()?;
        let shared = LsmrShared::from_slots(&slots);
        let damps = (0..k)
            .map(|j| LsmrDamp::from_slots(&slots[SHARED_LEN + j * DAMP_LEN..]))
            .collect();
        Ok((shared, damps))
    }

    /// Column scaling (`opts.scale_columns`): uploads D = diag(1/||A_j||) (folded into
    /// lsmr_update_v) and returns it as the device rounds it, for y0 = D^-1 x0 and x = D y;
    /// without it, clears D and returns None.
    fn set_column_scale(&mut self, a: &dyn LinearOperator<T>, opts: &LsmrOptions) -> Result<Option<Vec<f64>>> {
        if !opts.scale_columns {
            self.d = None;
            return Ok(None);
        }
        let d: Vec<T> = column_scale(a.column_norms().as_deref(), self.n)?
            .into_iter()
            .map(T::from_f64)
            .collect();
        let mut buf = self.ctx.alloc::<T>(self.n.max(1))?;
        buf.copy_from_host_at(0, &d)?;
        self.d = Some(buf);
        Ok(Some(d.iter().map(|e| e.to_f64()).collect()))
    }

    /// One LSMR iteration for `k` damps, queued: two products and two vector kernels, the
    /// scalar steps in the tails of update_u and update_v (their last CTA). Its x update is left
    /// to the next iteration's lsmr_update_u (`x_pending` there), or to [`Solver::flush_x`] at
    /// the end of a batch: one launch fewer per iteration; the tests of an iteration still see
    /// its x.
    fn iteration(&mut self, a: &dyn LinearOperator<T>, k: usize, x_pending: bool) -> Result<()> {
        let (m, n) = (self.m, self.n);
        let input = if self.d.is_some() { &self.dv } else { &self.v };
        // products queued past the stop are skipped on the device (operators that can)
        let stop = SkipIf::new(&self.state, STOP_SLOT)?;
        a.apply_unless(stop, 1.0, input, 0.0, &mut self.av)?;
        // update_u (and the previous iteration's x update), then (its last CTA) the deferred
        // tests and beta
        let p = self.vec_params(self.av.device_ptr(), self.u.device_ptr(), &self.partials_u, m, false);
        let p = if x_pending { self.with_x_update(p, k) } else { p };
        self.launch_vec(&self.update_u, &self.fused(p, ScalarMode::IterBeta, k), 1)?;
        a.apply_transposed_unless(stop, 1.0, &self.u, 0.0, &mut self.atu)?;
        // update_v, then (its last CTA) alpha and the recurrences
        let p = self.vec_params(self.atu.device_ptr(), self.v.device_ptr(), &self.partials_v, n, false);
        self.launch_vec(&self.update_v, &self.fused(p, ScalarMode::IterAlpha, k), 1)
    }

    /// The x update of the last queued iteration (`rows` rows of CTAs: the damps, or the
    /// columns), so that a check point's tests and the returned x see it.
    fn flush_x(&self, rows: usize) -> Result<()> {
        let p = self.vec_params(0, self.v.device_ptr(), &self.partials_x, self.n, false);
        self.launch_vec(&self.update_x, &p, rows)
    }

    /// A batch of `count` iterations of `k` damps (many right-hand sides: of the `k` columns),
    /// the first one's x update flushed before, then the flush of the last one's.
    fn batch(&mut self, a: &dyn LinearOperator<T>, k: usize, count: usize) -> Result<()> {
        for i in 0..count {
            if self.many {
                self.iteration_many(a, i > 0)?;
            } else {
                self.iteration(a, k, i > 0)?;
            }
        }
        self.flush_x(k)
    }

    /// Solves for `damps` (validated; at most `self.k` of them).
    fn solve(
        &mut self,
        a: &dyn LinearOperator<T>,
        b: &DeviceBuffer<T>,
        damps: &[f64],
        opts: &LsmrOptions,
        run: &mut LsmrRunOptions<'_>,
    ) -> Result<Vec<LsmrResult>> {
        let k = damps.len();
        if k == 0 || k > self.k {
            return Err(Error::invalid(
                "damps",
                format!("{k} damps for a solver sized for 1 to {}", self.k),
            ));
        }
        let started = Instant::now();
        let (m, n) = (self.m, self.n);
        // Column scaling: the operator becomes A D (D folded into lsmr_update_v), the start
        // y0 = D^-1 x0, and x = D y at the end; scale holds D as the device rounds it.
        let scale = self.set_column_scale(a, opts)?;
        let x0: Option<Vec<f64>> = match (&opts.x0, &scale) {
            (Some(x0), Some(d)) => Some(x0.iter().zip(d).map(|(x, d)| x / d).collect()),
            (x0, _) => x0.clone(),
        };
        let maxiter = opts.maxiter.unwrap_or(m.min(n));
        let shared = LsmrShared {
            atol: opts.atol,
            btol: opts.btol,
            ctol: if opts.conlim > 0.0 { 1.0 / opts.conlim } else { 0.0 },
            maxiter: maxiter as f64,
            ..LsmrShared::default()
        };
        let mut init = shared.to_slots().to_vec();
        for &damp in damps {
            init.extend(
                LsmrDamp {
                    damp,
                    ..LsmrDamp::default()
                }
                .to_slots(),
            );
        }
        self.state.copy_from_host_at(0, &init)?;

        // x_j = x0 (or 0) for every damp; u = b - A x0 (or b)
        if m > 0 {
            copy_prefix(&mut self.u, b, m)?;
        }
        match &x0 {
            Some(x0) => {
                let x0_t: Vec<T> = x0.iter().map(|&e| T::from_f64(e)).collect();
                for j in 0..k {
                    self.x.copy_from_host_at(j * n, &x0_t)?;
                }
                // the product reads x0 (scaled: D y0) from atu (n elements, overwritten by
                // A^T u below)
                let input: Vec<T> = match &scale {
                    Some(d) => x0.iter().zip(d).map(|(y, d)| T::from_f64(d * y)).collect(),
                    None => x0_t,
                };
                self.atu.copy_from_host_at(0, &input)?;
                a.apply(-1.0, &self.atu, 1.0, &mut self.u)?;
            }
            None => self.x.fill_bytes(0)?,
        }
        // normb (partials_x), beta (partials_u)
        let p = self.vec_params(b.device_ptr(), 0, &self.partials_x, m, true);
        self.launch_vec(&self.sumsq, &p, 1)?;
        let p = self.vec_params(self.u.device_ptr(), 0, &self.partials_u, m, true);
        self.launch_vec(&self.sumsq, &p, 1)?;
        self.launch_scalar(ScalarMode::SetupBeta, k)?;
        // v = A^T u / beta (unnormalised), alpha = ||v||, h_j = v / alpha, hbar_j = 0
        a.apply_transposed(1.0, &self.u, 0.0, &mut self.atu)?;
        let p = self.vec_params(self.atu.device_ptr(), self.v.device_ptr(), &self.partials_v, n, true);
        self.launch_vec(&self.update_v, &p, 1)?;
        self.launch_scalar(ScalarMode::SetupAlpha, k)?;
        let p = self.vec_params(0, self.v.device_ptr(), &self.partials_x, n, true);
        self.launch_vec(&self.update_x, &p, k)?;

        let (mut sh, mut st) = self.read_state(k)?;
        check_setup_norms(&sh, "")?;
        if sh.early == EARLY_NORMB_ZERO {
            self.x.fill_bytes(0)?;
        }
        let mut launched = 0usize;
        // a full batch after the first, captured once and replayed (None: not yet captured;
        // Some(None): capture failed or not allowed, launch directly)
        let mut graph: Option<Option<StreamGraph>> = (!(run.graph && a.graph_capturable())).then_some(None);
        if sh.stop == 0.0 {
            while launched < maxiter {
                let batch = run.check_every.min(maxiter - launched);
                let replay = launched > 0 && batch == run.check_every;
                if replay && graph.is_none() {
                    let ctx = self.ctx.clone();
                    graph = Some(ctx.capture_graph(|| self.batch(a, k, batch)).ok());
                }
                match &graph {
                    Some(Some(g)) if replay => g.launch()?,
                    _ => self.batch(a, k, batch)?,
                }
                launched += batch;
                self.launch_scalar(ScalarMode::Test, k)?;
                (sh, st) = self.read_state(k)?;
                if let Some(progress) = run.progress.as_mut() {
                    progress(
                        sh.itn as usize,
                        st[0].normr,
                        st[0].normar,
                        started.elapsed().as_secs_f64(),
                    );
                }
                if sh.stop != 0.0 {
                    break;
                }
            }
        }
        let xs = self.x.to_host()?;
        Ok(st
            .iter()
            .enumerate()
            .map(|(j, d)| {
                let y = xs[j * n..(j + 1) * n].iter().map(|e| e.to_f64());
                let x = match &scale {
                    Some(s) => y.zip(s).map(|(y, s)| s * y).collect(),
                    None => y.collect(),
                };
                result_of(&sh, d, x)
            })
            .collect())
    }
}

impl<T: Element> Solver<T> {
    /// The states of the `k` columns (many right-hand sides).
    fn read_columns(&self, k: usize) -> Result<Vec<(LsmrShared, LsmrDamp)>> {
        let slots = self.state.to_host()?;
        Ok((0..k)
            .map(|c| {
                let rec = &slots[c * COLUMN_LEN..];
                (LsmrShared::from_slots(rec), LsmrDamp::from_slots(&rec[SHARED_LEN..]))
            })
            .collect())
    }

    /// One LSMR iteration of every column (many right-hand sides), queued: two batched
    /// products, then the column-indexed vector kernels (gridDim.y = k); the scalar steps run
    /// in the tails of update_u and update_v (the last CTA of row c: column c's). The x update
    /// is deferred as in [`Solver::iteration`] (`x_pending`: this update_u does the previous
    /// iteration's, one damp per row).
    fn iteration_many(&mut self, a: &dyn LinearOperator<T>, x_pending: bool) -> Result<()> {
        let (m, n, k) = (self.m, self.n, self.k);
        let input = if self.d.is_some() { &self.dv } else { &self.v };
        a.apply_many(1.0, input, k, 0.0, &mut self.av)?;
        let p = self.vec_params(self.av.device_ptr(), self.u.device_ptr(), &self.partials_u, m, false);
        let p = if x_pending { self.with_x_update(p, 1) } else { p };
        self.launch_vec(&self.update_u, &self.fused(p, ScalarMode::IterBeta, k), k)?;
        a.apply_transposed_many(1.0, &self.u, k, 0.0, &mut self.atu)?;
        let p = self.vec_params(self.atu.device_ptr(), self.v.device_ptr(), &self.partials_v, n, false);
        self.launch_vec(&self.update_v, &self.fused(p, ScalarMode::IterAlpha, k), k)
    }

    /// Solves for the `self.k` columns of `b` (validated by [`validate_many`]), from `x0`
    /// (`n x k`, f64, column-major) or zeros.
    fn solve_many(
        &mut self,
        a: &dyn LinearOperator<T>,
        b: ManyRhs<'_, T>,
        x0: Option<&[f64]>,
        opts: &LsmrOptions,
        run: &mut LsmrRunOptions<'_>,
    ) -> Result<Vec<LsmrResult>> {
        if !self.many {
            return Err(Error::Unsupported("lsmr_many: a solver sized for a damp list".into()));
        }
        let started = Instant::now();
        let (m, n, k) = (self.m, self.n, self.k);
        let scale = self.set_column_scale(a, opts)?;
        let maxiter = opts.maxiter.unwrap_or(m.min(n));
        let shared = LsmrShared {
            atol: opts.atol,
            btol: opts.btol,
            ctol: if opts.conlim > 0.0 { 1.0 / opts.conlim } else { 0.0 },
            maxiter: maxiter as f64,
            ..LsmrShared::default()
        };
        let damp = LsmrDamp {
            damp: opts.damp,
            ..LsmrDamp::default()
        };
        let mut init = Vec::with_capacity(k * COLUMN_LEN);
        for _ in 0..k {
            init.extend(shared.to_slots());
            init.extend(damp.to_slots());
        }
        self.state.copy_from_host_at(0, &init)?;

        // U = B; normb per column (partials_x) before the x0 correction
        match b {
            ManyRhs::Host(b) => {
                let bt: Vec<T> = b.iter().map(|&e| T::from_f64(e)).collect();
                self.u.copy_from_host_at(0, &bt)?;
            }
            ManyRhs::Device(b) => super::device_operator::copy_elements(&mut self.u, 0, b, 0, m * k)?,
        }
        let p = self.vec_params(self.u.device_ptr(), 0, &self.partials_x, m, true);
        self.launch_vec(&self.sumsq, &p, k)?;
        // X_j = x0_j (or 0), U = B - A X0 (scaled: y0 = D^-1 x0, the product reads D y0)
        match x0 {
            Some(x0) => {
                let y0: Vec<f64> = match &scale {
                    Some(d) => x0
                        .chunks(n.max(1))
                        .flat_map(|c| c.iter().zip(d).map(|(x, d)| x / d))
                        .collect(),
                    None => x0.to_vec(),
                };
                let y0_t: Vec<T> = y0.iter().map(|&e| T::from_f64(e)).collect();
                self.x.copy_from_host_at(0, &y0_t)?;
                let input: Vec<T> = match &scale {
                    Some(d) => y0
                        .chunks(n.max(1))
                        .flat_map(|c| c.iter().zip(d).map(|(y, d)| T::from_f64(d * y)))
                        .collect(),
                    None => y0_t,
                };
                self.atu.copy_from_host_at(0, &input)?;
                a.apply_many(-1.0, &self.atu, k, 1.0, &mut self.u)?;
            }
            None => self.x.fill_bytes(0)?,
        }
        let p = self.vec_params(self.u.device_ptr(), 0, &self.partials_u, m, true);
        self.launch_vec(&self.sumsq, &p, k)?;
        self.launch_scalar(ScalarMode::SetupBeta, k)?;
        // V = A^T U / beta (per column, unnormalised), alpha, H = V / alpha, Hbar = 0
        a.apply_transposed_many(1.0, &self.u, k, 0.0, &mut self.atu)?;
        let p = self.vec_params(self.atu.device_ptr(), self.v.device_ptr(), &self.partials_v, n, true);
        self.launch_vec(&self.update_v, &p, k)?;
        self.launch_scalar(ScalarMode::SetupAlpha, k)?;
        let p = self.vec_params(0, self.v.device_ptr(), &self.partials_x, n, true);
        self.launch_vec(&self.update_x, &p, k)?;

        let mut cols = self.read_columns(k)?;
        for (c, (sh, _)) in cols.iter().enumerate() {
            check_setup_norms(sh, &format!("column {c}: "))?;
        }
        let mut launched = 0usize;
        let all_stopped = |cols: &[(LsmrShared, LsmrDamp)]| cols.iter().all(|(sh, _)| sh.stop != 0.0);
        if !all_stopped(&cols) {
            while launched < maxiter {
                let batch = run.check_every.min(maxiter - launched);
                self.batch(a, k, batch)?;
                launched += batch;
                self.launch_scalar(ScalarMode::Test, k)?;
                cols = self.read_columns(k)?;
                if let Some(progress) = run.progress.as_mut() {
                    let most = |f: &dyn Fn(&(LsmrShared, LsmrDamp)) -> f64| cols.iter().map(f).fold(0.0, f64::max);
                    progress(
                        most(&|c| c.0.itn) as usize,
                        most(&|c| c.1.normr),
                        most(&|c| c.1.normar),
                        started.elapsed().as_secs_f64(),
                    );
                }
                if all_stopped(&cols) {
                    break;
                }
            }
        }
        let xs = self.x.to_host()?;
        Ok(cols
            .iter()
            .enumerate()
            .map(|(c, (sh, st))| {
                let x = if sh.early == EARLY_NORMB_ZERO {
                    vec![0.0; n] // SciPy: b = 0 returns x = 0 even with x0
                } else {
                    let y = xs[c * n..(c + 1) * n].iter().map(|e| e.to_f64());
                    match &scale {
                        Some(s) => y.zip(s).map(|(y, s)| s * y).collect(),
                        None => y.collect(),
                    }
                };
                result_of(sh, st, x)
            })
            .collect())
    }
}

/// The right-hand sides of [`lsmr_many`]: `B`, `m x k` column-major (column `j` at `j * m`),
/// on the host in f64 (rounded to `T` on upload; checked finite before any work) or already
/// on the device in `T` (checked finite through the column norms, after the setup kernels).
#[derive(Clone, Copy, Debug)]
pub enum ManyRhs<'a, T: Element> {
    Host(&'a [f64]),
    Device(&'a DeviceBuffer<T>),
}

impl<T: Element> ManyRhs<'_, T> {
    fn len(&self) -> usize {
        match self {
            ManyRhs::Host(b) => b.len(),
            ManyRhs::Device(b) => b.len(),
        }
    }
}

/// Bytes of device memory [`lsmr_many`] allocates for `k` right-hand sides of an `m x n`
/// problem with `T` vectors: `u`, `A v` (`m x k` each), `v`, `A^T u`, `D v`, `h`, `hbar`, `x`
/// (`n x k` each), three partial-sum arrays and the state (`None`: overflows).
pub fn many_bytes<T: Element>(m: usize, n: usize, k: usize) -> Option<usize> {
    let s = T::DTYPE.size();
    let vectors = m.max(1).checked_mul(2)?.checked_add(n.max(1).checked_mul(6)?)?;
    let per_column = vectors
        .checked_mul(s)?
        .checked_add(8 * (3 * MAX_PARTIALS + COLUMN_LEN))?;
    per_column.checked_mul(k)
}

/// The checks of [`lsmr_many_with`]'s arguments, all before any work: those of [`validate`]
/// (with `b` of `m * k` elements), `1 <= k <= MAX_RHS`, a host `b` finite, `x0` of `n * k`
/// finite elements, `opts.x0` not set, `check_every >= 1`.
pub fn validate_many<T: Element>(
    m: usize,
    n: usize,
    b: &ManyRhs<'_, T>,
    k: usize,
    x0: Option<&[f64]>,
    opts: &LsmrOptions,
    run: &LsmrRunOptions<'_>,
) -> Result<()> {
    if !matches!(T::DTYPE, DType::F32 | DType::F64) {
        return Err(Error::Unsupported(format!(
            "LSMR on {} vectors; supported: fp32, fp64",
            T::DTYPE
        )));
    }
    check_many_problem(m, n, b.len(), k, x0, opts)?;
    if let ManyRhs::Host(b) = b {
        check_finite_columns("b", b, m)?;
    }
    if run.check_every == 0 {
        return Err(Error::invalid("check_every", "is 0; must be at least 1"));
    }
    Ok(())
}

/// Many right-hand sides on the GPU: solves `min ||[b_j; 0] - [A; damp I] x_j||_2` for every
/// column `b_j` of `B` (`m x k`, column-major, [`ManyRhs`]) by LSMR, one independent solve per
/// column (its own bidiagonalisation, estimates and stopping state, with the options of
/// `opts`: one damp for all), returning one result per column, in order: each what [`lsmr`]
/// returns for that column alone, up to the summation order of the batched products.
///
/// The columns share the operator's products: per iteration one
/// [`apply_many`](LinearOperator::apply_many) and one
/// [`apply_transposed_many`](LinearOperator::apply_transposed_many) over all `k` columns (the
/// sparse operators: a deterministic SpMM, so the `A` matrix is read once per pass of columns
/// instead of once per column); every vector kernel has one row of CTAs per column and the
/// scalar steps run once per column. A column whose stopping rules hold freezes there (its x
/// and estimates are those of that iteration, exactly as a single solve); the run ends when
/// every column has stopped or at `maxiter`. A zero column returns SciPy's `b = 0` answer
/// (`istop` 0, `x` = 0). `x0`, when given, holds the `k` initial guesses (`n x k`,
/// column-major, f64); `opts.x0` must be `None`. Column scaling applies to every column.
///
/// Errors (nothing runs): those of [`lsmr`] for each column; `k` of 0 or above [`MAX_RHS`];
/// `b` of other than `m * k` elements, or (host) with NaN or infinity (the error names the
/// column and row); `x0` of other than `n * k` elements or not finite; `opts.x0` set; the
/// solver's vectors ([`many_bytes`]) larger than the device's free memory.
pub fn lsmr_many<T: Element>(
    ctx: &Context,
    a: &dyn LinearOperator<T>,
    b: ManyRhs<'_, T>,
    k: usize,
    x0: Option<&[f64]>,
    opts: &LsmrOptions,
) -> Result<Vec<LsmrResult>> {
    lsmr_many_with(ctx, a, b, k, x0, opts, &mut LsmrRunOptions::default())
}

/// [`lsmr_many`] with the run options (check interval; the progress callback gets the most
/// iterations of any column and the largest `normr`, `normar` over the columns).
pub fn lsmr_many_with<T: Element>(
    ctx: &Context,
    a: &dyn LinearOperator<T>,
    b: ManyRhs<'_, T>,
    k: usize,
    x0: Option<&[f64]>,
    opts: &LsmrOptions,
    run: &mut LsmrRunOptions<'_>,
) -> Result<Vec<LsmrResult>> {
    let (m, n) = a.shape();
    validate_many::<T>(m, n, &b, k, x0, opts, run)?;
    let need = many_bytes::<T>(m, n, k).ok_or_else(|| Error::invalid("k", format!("{k} columns overflow usize")))?;
    let free = super::device_operator::free_device_bytes(ctx)?;
    if need > free {
        return Err(Error::invalid(
            "k",
            format!(
                "{k} right-hand sides of a {m} x {n} problem need {:.1} MiB of device memory for the \
                 solver's vectors, {:.1} MiB are free; solve fewer columns per call",
                need as f64 / 1048576.0,
                free as f64 / 1048576.0
            ),
        ));
    }
    let mut solver = Solver::<T>::new(ctx, m, n, k, true)?;
    solver.solve_many(a, b, x0, opts, run)
}

/// The checks of a many-right-hand-sides problem that need no device: `1 <= k <= MAX_RHS`, `b`
/// of `m * k` elements, `x0` (if any) of `n * k` finite ones, `opts.x0` not set, and the
/// options that every solve checks (`check_problem` of lsmr.rs).
pub fn check_many_problem(
    m: usize,
    n: usize,
    b_len: usize,
    k: usize,
    x0: Option<&[f64]>,
    opts: &LsmrOptions,
) -> Result<()> {
    if k == 0 || k > MAX_RHS {
        return Err(Error::invalid(
            "k",
            format!("is {k}; give 1 to {MAX_RHS} right-hand sides per run"),
        ));
    }
    let (mk, nk) = match (m.checked_mul(k), n.checked_mul(k)) {
        (Some(mk), Some(nk)) => (mk, nk),
        _ => return Err(Error::invalid("k", format!("{k} columns of {m} x {n} overflow usize"))),
    };
    if b_len != mk {
        return Err(Error::invalid(
            "b",
            format!("has {b_len} elements, A is {m} x {n} so B (m x k = {m} x {k}, column-major) needs {mk}"),
        ));
    }
    if opts.x0.is_some() {
        return Err(Error::invalid(
            "x0",
            "opts.x0 is set; give the k initial guesses as the x0 argument (n x k, column-major)",
        ));
    }
    if let Some(x0) = x0 {
        if x0.len() != nk {
            return Err(Error::invalid(
                "x0",
                format!(
                    "has {} elements, X0 is n x k = {n} x {k} (column-major): {nk}",
                    x0.len()
                ),
            ));
        }
        check_finite_columns("x0", x0, n)?;
    }
    check_problem(m, n, m, opts)
}

/// An error naming the column and row of the first NaN or infinite element of the
/// column-major `v` (columns of `rows`).
pub(crate) fn check_finite_columns(arg: &'static str, v: &[f64], rows: usize) -> Result<()> {
    match v.iter().position(|e| !e.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::invalid(
            arg,
            format!(
                "element ({}, {}) (column-major index {i}) is {}; every element must be finite",
                i % rows.max(1),
                i / rows.max(1),
                v[i]
            ),
        )),
    }
}

/// The setup's norms must be finite: NaN or infinity in b shows in ||b|| (summed in f64:
/// squares of f32 values cannot overflow; f64 values above ~1e154 would, and would break the
/// recurrences as well), an overflowing A x0 in ||b - A x0||. `which` prefixes the message
/// (`"column 3: "`).
fn check_setup_norms(sh: &LsmrShared, which: &str) -> Result<()> {
    if !sh.normb.is_finite() {
        return Err(Error::invalid(
            "b",
            format!(
                "{which}contains NaN or infinity (||b|| = {}); every element must be finite",
                sh.normb
            ),
        ));
    }
    if !sh.beta.is_finite() {
        return Err(Error::invalid(
            "x0",
            format!("{which}||b - A x0|| = {}: A x0 overflows", sh.beta),
        ));
    }
    Ok(())
}

/// The result of one damp from the final state (SciPy's early-exit quirks included: see
/// lsmr.rs).
fn result_of(sh: &LsmrShared, st: &LsmrDamp, x: Vec<f64>) -> LsmrResult {
    let early = sh.early == EARLY_NORMAR_ZERO || sh.early == EARLY_NORMB_ZERO;
    LsmrResult {
        x,
        istop: st.istop as u32,
        itn: st.itn as usize,
        normr: st.normr,
        normar: st.normar,
        norma: st.norma,
        conda: st.conda,
        normx: if early { 0.0 } else { st.normx },
    }
}

/// `dst[..len] = src[..len]` on the stream.
fn copy_prefix<T: Element>(dst: &mut DeviceBuffer<T>, src: &DeviceBuffer<T>, len: usize) -> Result<()> {
    if dst.len() < len || src.len() < len {
        return Err(Error::invalid(
            "b",
            format!(
                "copy of {len} elements between buffers of {} and {}",
                src.len(),
                dst.len()
            ),
        ));
    }
    src.context().bind()?;
    // SAFETY: both allocations hold at least len elements (checked).
    crate::runtime::context::check("cuMemcpyDtoDAsync", unsafe {
        cudarc::driver::sys::cuMemcpyDtoDAsync_v2(
            dst.device_ptr(),
            src.device_ptr(),
            len * std::mem::size_of::<T>(),
            src.context().cu_stream(),
        )
    })
}
