//! Distributed LSMR: `A` partitioned by rows over the ranks of a group, SciPy's LSMR (the
//! options, stopping rules and results of [`lsmr_host`](crate::linalg::lsmr_host)) on every
//! rank in step.
//!
//! # The algorithm
//!
//! Rank `i` holds the rows `r0..r1` of `A` (`A_i`), of `b` (`b_i`) and of `u` (`u_i`), and the
//! whole of every `n`-vector (`v`, `h`, `hbar`, `x`), which is the same on every rank. One
//! iteration (SciPy's order, as `lsmr_host`):
//!
//! ```text
//! u_i = A_i v - alpha u_i               local SpMV and vector update
//! beta = sqrt(allreduce ||u_i||^2)      one scalar all-reduce; u_i /= beta
//! atu = allreduce A_i^T u_i             local SpMV, one all-reduce of an n-vector
//! v = atu - beta v, alpha = ||v||       replicated: the same on every rank; v /= alpha
//! rotations, estimates, stopping test   replicated scalars (linalg::lsmr::Recurrence)
//! hbar, x, h updates, ||x||             replicated
//! ```
//!
//! So per iteration: two local products, one all-reduce of `n` values and one of a scalar. The
//! start adds one all-reduce of two scalars (`||b||^2`, `||b - A x0||^2`) and one of `n`
//! values, and one all-reduce of a small table (below). Every rank computes every replicated
//! quantity from the same all-reduced bits, so all ranks take the same branches and stop at
//! the same iteration; this relies on the all-reduce giving every rank the same bits, which
//! [`LocalGroup`] guarantees and NCCL's ring, tree and NVLS algorithms do
//! (each reduced element is computed once, then copied).
//!
//! The scalar recurrences are the CPU reference's own code (`Recurrence`, shared with
//! [`lsmr_host`](crate::linalg::lsmr_host)), so the stopping rules are identical; the results
//! differ from a one-rank solve only by the summation order of `A^T u` and `||u||^2` (rank
//! blocks, then over ranks). With one rank the host version is bitwise `lsmr_host` on the
//! same CSR matrix.
//!
//! # Validation, collectively
//!
//! A rank that returned an error while the others wait in a collective would hang them. So
//! every rank first checks its own input (block, `b_i`, options, `x0`) without failing, then
//! all ranks all-reduce a table of every rank's place, options, `x0` checksum and verdict, and
//! every rank takes the same decision from it: the solve runs, or every rank returns an error
//! (the rank whose input was bad says why; the others name it). Checked across ranks: the
//! blocks tile `0..m` in rank order; `m`, `n`, the options and the storage type agree; `x0` is
//! given everywhere or nowhere, with the same values (sum and sum of squares). Failures of the
//! device or of NCCL after that point are not shared (NCCL's own behaviour: the other ranks
//! wait).
//!
//! # Where it runs
//!
//! * [`lsmr_distributed_host`]: the host version (f64 vectors, any [`Collective`]), which the
//!   CPU tests run on [`LocalGroup`] threads ([`lsmr_host_in_threads`]).
//! * [`lsmr_distributed`]: the GPU version, vectors on the device (f32 or f64 storage,
//!   arithmetic in f64 as the one-GPU solver), the loop and the recurrences on the host
//!   (`lsmr_dist.cu` has the vector kernels), NCCL for the all-reduces. The one-GPU solver
//!   ([`lsmr`](crate::linalg::lsmr())) keeps its recurrences on the device and looks at them
//!   every 16 iterations; interleaving NCCL calls with its fused scalar kernels would change that
//!   solver itself, so the distributed one is this separate, plainer loop: per iteration it
//!   reads three partial-sum arrays (for `||u_i||`, `||v||`, `||x||`) and passes `||u_i||^2`
//!   through the host to NCCL and back, four host synchronisations in all; the `n`-vector
//!   all-reduce stays on the device, in stream order.
//!
//! Not supported (an error says so): column scaling ([`LsmrOptions::scale_columns`]), damp
//! lists and many right-hand sides.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use super::collective::{Collective, LocalGroup};
use super::operator::{sum_sq, DistributedOperator, HostDistributedOperator};
use super::partition::{row_block, RowPartition};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::linalg::lsmr::{check_problem, negate_scale_add, Progress, Recurrence, StepFactors, StopRule};
use crate::linalg::lsmr_device::ProgressFn;
use crate::linalg::{LsmrOptions, LsmrResult};
use crate::runtime::{Context, DeviceBuffer, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig};
use crate::sparse::{CsrHost, SparseIndex};

/// How a distributed solve runs, beyond SciPy's options.
#[derive(Default)]
pub struct DistributedRunOptions<'a> {
    /// Called after every iteration with `(itn, normr, normar, elapsed seconds)` (the same
    /// values on every rank; a caller typically attaches it on rank 0 only).
    pub progress: Option<ProgressFn<'a>>,
}

/// The vector work of one rank, on whatever holds its vectors: `u`, `b` (this rank's rows) and
/// `v`, `atu`, `h`, `hbar`, `x` (all `n`, the same on every rank). Each method that returns an
/// `f64` returns a sum of squares of what it wrote, over this rank's part only.
pub(crate) trait RankVectors {
    /// `x = x0` (or 0), `u = b_i - A_i x0` (or `b_i`); returns `(||b_i||^2, ||u_i||^2)`.
    fn start(&mut self, x0: Option<&[f64]>) -> Result<(f64, f64)>;
    /// `u = A_i v - alpha u`; returns `||u_i||^2`.
    fn update_u(&mut self, alpha: f64) -> Result<f64>;
    /// `u *= s`.
    fn scale_u(&mut self, s: f64) -> Result<()>;
    /// `atu = sum over ranks of A_i^T u_i`: the one all-reduce of an `n`-vector.
    fn reduce_atu(&mut self) -> Result<()>;
    /// `v = atu` (`first`) or `v = atu - beta v`; returns `||v||^2`.
    fn update_v(&mut self, beta: f64, first: bool) -> Result<f64>;
    /// `v *= s`.
    fn scale_v(&mut self, s: f64) -> Result<()>;
    /// `h = v`, `hbar = 0`.
    fn start_h(&mut self) -> Result<()>;
    /// The `hbar`, `x`, `h` update; returns `||x||^2`.
    fn update_x(&mut self, f: &StepFactors) -> Result<f64>;
    /// `x = 0`.
    fn zero_x(&mut self) -> Result<()>;
    /// `x` on the host.
    fn x(&self) -> Result<Vec<f64>>;
    /// The element-wise sum over the ranks of small host values.
    fn sum(&self, values: &mut [f64]) -> Result<()>;
}

/// What one rank brings to the collective check (module docs, "Validation, collectively").
struct Entry {
    rows: Range<usize>,
    m: usize,
    n: usize,
    value_bytes: usize,
}

/// Doubles per rank in the check table.
const ENTRY_LEN: usize = 14;

/// The collective check: every rank adds its entry and its verdict (`local`: its own checks) to
/// a table, all-reduces it, and every rank decides the same from the whole table.
fn agree(comm: &dyn Collective, entry: &Entry, opts: &LsmrOptions, local: Result<()>) -> Result<()> {
    let (rank, size) = (comm.rank(), comm.size());
    if rank >= size {
        // Nothing can be agreed on with a broken group; every rank of it sees the same.
        return Err(Error::invalid("rank", format!("is {rank} in a group of {size}")));
    }
    let x0 = opts.x0.as_deref();
    let row = [
        entry.rows.start as f64,
        entry.rows.end as f64,
        entry.m as f64,
        entry.n as f64,
        opts.damp,
        opts.atol,
        opts.btol,
        opts.conlim,
        opts.maxiter.map_or(-1.0, |k| k as f64),
        x0.is_some() as u8 as f64,
        x0.map_or(0.0, |x| x.iter().sum::<f64>()),
        x0.map_or(0.0, sum_sq),
        if local.is_ok() { 1.0 } else { 0.0 },
        entry.value_bytes as f64,
    ];
    let mut table = vec![0.0; ENTRY_LEN * size];
    table[rank * ENTRY_LEN..(rank + 1) * ENTRY_LEN].copy_from_slice(&row);
    comm.all_reduce_sum_host(&mut table)?;
    let at = |g: usize, k: usize| table[g * ENTRY_LEN + k];

    // Every rank's own verdict first: the rank that failed says why.
    local?;
    if let Some(g) = (0..size).find(|&g| at(g, 12) != 1.0) {
        return Err(Error::invalid(
            "rank",
            format!("rank {g} of {size} rejected its input (its error says why); every rank stops"),
        ));
    }
    // The blocks tile 0..m in rank order, and the shapes agree.
    let mut expect = 0.0;
    for g in 0..size {
        if at(g, 2) != at(0, 2) || at(g, 3) != at(0, 3) {
            return Err(Error::invalid(
                "a",
                format!(
                    "rank {g} has A of {} x {} but rank 0 of {} x {}; every rank needs the same m and n",
                    at(g, 2),
                    at(g, 3),
                    at(0, 2),
                    at(0, 3)
                ),
            ));
        }
        if at(g, 0) != expect {
            return Err(Error::invalid(
                "rows",
                format!(
                    "rank {g} holds rows {}..{} but the blocks must tile 0..m in rank order (expected it to start at {expect})",
                    at(g, 0),
                    at(g, 1)
                ),
            ));
        }
        expect = at(g, 1);
    }
    if expect != at(0, 2) {
        return Err(Error::invalid(
            "rows",
            format!("the ranks' blocks end at row {expect} but A has m = {} rows", at(0, 2)),
        ));
    }
    // The options, x0 and the storage type agree (bitwise: every rank compares the same table).
    let names = [
        (4, "damp"),
        (5, "atol"),
        (6, "btol"),
        (7, "conlim"),
        (8, "maxiter"),
        (9, "x0"),
        (10, "x0"),
        (11, "x0"),
        (13, "dtype"),
    ];
    for g in 1..size {
        for (k, arg) in names {
            if at(g, k).to_bits() != at(0, k).to_bits() {
                return Err(Error::invalid(
                    arg,
                    format!("differs between rank 0 and rank {g}; every rank must solve with the same options and x0"),
                ));
            }
        }
    }
    Ok(())
}

/// The checks of the options that the distributed solver does not support.
fn check_supported(opts: &LsmrOptions) -> Result<()> {
    if opts.scale_columns {
        return Err(Error::Unsupported(
            "scale_columns in distributed LSMR; supported: the plain solve (damp, atol, btol, conlim, maxiter, x0)"
                .into(),
        ));
    }
    Ok(())
}

/// The distributed LSMR loop of one rank (module docs), on its vectors `vecs`, after
/// [`agree`] has passed. `m`, `n`: the global shape.
fn solve_rank<V: RankVectors>(
    vecs: &mut V,
    m: usize,
    n: usize,
    rank: usize,
    opts: &LsmrOptions,
    run: &mut DistributedRunOptions<'_>,
) -> Result<LsmrResult> {
    let started = Instant::now();
    let maxiter = opts.maxiter.unwrap_or(m.min(n));
    let mut progress = (opts.show && rank == 0).then(|| Progress::start(m, n, opts, &[opts.damp], maxiter));

    // beta_1 u_1 = b - A x0, alpha_1 v_1 = A^T u_1.
    let x0 = opts.x0.as_deref();
    let (b2, u2) = vecs.start(x0)?;
    let mut s = [b2, u2];
    vecs.sum(&mut s)?;
    let normb = s[0].sqrt();
    if !normb.is_finite() {
        return Err(Error::invalid(
            "b",
            format!("has a NaN or infinite element (||b|| = {normb}); every element must be finite"),
        ));
    }
    let mut beta = if x0.is_some() { s[1].sqrt() } else { normb };
    let mut alpha = 0.0;
    if beta > 0.0 {
        vecs.scale_u(1.0 / beta)?;
        vecs.reduce_atu()?;
        alpha = vecs.update_v(0.0, true)?.sqrt();
    }
    if alpha > 0.0 {
        vecs.scale_v(1.0 / alpha)?;
    }
    vecs.start_h()?;

    let mut rec = Recurrence::start(opts.damp, alpha, beta);
    let mut norma2 = alpha * alpha;
    let rule = StopRule::new(normb, opts, maxiter);
    let finish = |rec: &Recurrence, progress: &Option<Progress>, x: Vec<f64>| {
        if let Some(p) = progress {
            p.finish(
                rec.istop, rec.itn, rec.normr, rec.normar, rec.norma, rec.conda, rec.normx,
            );
        }
        rec.result(x)
    };

    // Early exits (SciPy checks ||A^T r0|| first: with b = A x0 != 0 it returns x0).
    if alpha * beta == 0.0 {
        return Ok(finish(&rec, &progress, vecs.x()?));
    }
    if normb == 0.0 {
        vecs.zero_x()?;
        return Ok(finish(&rec, &progress, vecs.x()?));
    }
    if let Some(p) = &progress {
        let x_first = x0.and_then(|x| x.first().copied()).unwrap_or(0.0);
        p.first_line(x_first, beta, alpha * beta, alpha / beta);
    }

    let mut itn = 0usize;
    while itn < maxiter {
        itn += 1;

        // Continue the bidiagonalisation: beta u = A v - alpha u, alpha v = A^T u - beta v.
        // When beta == 0, u (now 0) is not normalised and v, alpha keep their values.
        let mut s = [vecs.update_u(alpha)?];
        vecs.sum(&mut s)?;
        beta = s[0].sqrt();
        if beta > 0.0 {
            vecs.scale_u(1.0 / beta)?;
            vecs.reduce_atu()?;
            alpha = vecs.update_v(beta, false)?.sqrt();
            if alpha > 0.0 {
                vecs.scale_v(1.0 / alpha)?;
            }
        }

        // Estimate ||A||_F from ||B_k||_F (alpha_{k+1} enters at the next iteration).
        norma2 += beta * beta;
        let norma = norma2.sqrt();
        norma2 += alpha * alpha;

        // The recurrences, the vector update and the stopping tests (the reference's code).
        let f = rec.recur(itn, alpha, beta, norma);
        let normx = vecs.update_x(&f)?.sqrt();
        let t = rec.test(normx, &rule);

        if let Some(cb) = &mut run.progress {
            cb(itn, rec.normr, rec.normar, started.elapsed().as_secs_f64());
        }
        if let Some(p) = &mut progress {
            let near = t.test3 <= 1.1 * rule.ctol || t.test2 <= 1.1 * rule.atol || t.test1 <= 1.1 * t.rtol;
            if n <= 40 || itn <= 10 || itn + 10 >= maxiter || itn % 10 == 0 || near || rec.istop != 0 {
                let x_first = vecs.x()?.first().copied().unwrap_or(0.0);
                p.line(
                    itn, x_first, rec.normr, rec.normar, t.test1, t.test2, rec.norma, rec.conda,
                );
            }
        }
        if rec.istop > 0 {
            break;
        }
    }
    Ok(finish(&rec, &progress, vecs.x()?))
}

// ---------------------------------------------------------------------------------------------
// The host version

/// One rank's host vectors.
struct HostRank<'a> {
    op: &'a HostDistributedOperator<'a>,
    b: &'a [f64],
    u: Vec<f64>,
    av: Vec<f64>,
    v: Vec<f64>,
    atu: Vec<f64>,
    h: Vec<f64>,
    hbar: Vec<f64>,
    x: Vec<f64>,
}

impl RankVectors for HostRank<'_> {
    fn start(&mut self, x0: Option<&[f64]>) -> Result<(f64, f64)> {
        let b2 = sum_sq(self.b);
        self.u.copy_from_slice(self.b);
        match x0 {
            None => {
                self.x.fill(0.0);
                Ok((b2, b2))
            }
            Some(x0) => {
                self.x.copy_from_slice(x0);
                self.op.apply_local(x0, &mut self.av)?;
                self.u.iter_mut().zip(&self.av).for_each(|(ui, &p)| *ui -= p);
                Ok((b2, sum_sq(&self.u)))
            }
        }
    }

    fn update_u(&mut self, alpha: f64) -> Result<f64> {
        self.op.apply_local(&self.v, &mut self.av)?;
        negate_scale_add(&mut self.u, alpha, &self.av);
        Ok(sum_sq(&self.u))
    }

    fn scale_u(&mut self, s: f64) -> Result<()> {
        self.u.iter_mut().for_each(|e| *e *= s);
        Ok(())
    }

    fn reduce_atu(&mut self) -> Result<()> {
        self.op.apply_transposed(&self.u, &mut self.atu)
    }

    fn update_v(&mut self, beta: f64, first: bool) -> Result<f64> {
        if first {
            self.v.copy_from_slice(&self.atu);
        } else {
            negate_scale_add(&mut self.v, beta, &self.atu);
        }
        Ok(sum_sq(&self.v))
    }

    fn scale_v(&mut self, s: f64) -> Result<()> {
        self.v.iter_mut().for_each(|e| *e *= s);
        Ok(())
    }

    fn start_h(&mut self) -> Result<()> {
        self.h.copy_from_slice(&self.v);
        self.hbar.fill(0.0);
        Ok(())
    }

    fn update_x(&mut self, f: &StepFactors) -> Result<f64> {
        f.apply(&mut self.hbar, &mut self.x, &mut self.h, &self.v);
        Ok(sum_sq(&self.x))
    }

    fn zero_x(&mut self) -> Result<()> {
        self.x.fill(0.0);
        Ok(())
    }

    fn x(&self) -> Result<Vec<f64>> {
        Ok(self.x.clone())
    }

    fn sum(&self, values: &mut [f64]) -> Result<()> {
        self.op.collective().all_reduce_sum_host(values)
    }
}

/// Distributed LSMR on the host: this rank's part of the solve of
/// `min ||[b; 0] - [A; damp I] x||` with `A` partitioned by rows (`op`: this rank's block,
/// `b_local`: this rank's rows of `b`). Every rank of `op`'s group calls it together, with
/// the same `opts`, and every rank returns the same result (`x` all `n` values). The result
/// equals [`lsmr_host`](crate::linalg::lsmr_host)'s up to the summation order of the
/// products over the ranks (module docs): the same `istop` and `itn` on all but borderline
/// stops, `x` to rounding. `opts.show` prints on rank 0.
///
/// Errors, on every rank alike (module docs): a rank's block invalid, `b_local` of the wrong
/// length or not finite, the options invalid (as `lsmr_host`) or different between ranks,
/// `x0` different between ranks, blocks that do not tile `0..m`; `scale_columns` (not
/// supported); a failure of the collective.
pub fn lsmr_distributed_host(
    op: &HostDistributedOperator<'_>,
    b_local: &[f64],
    opts: &LsmrOptions,
) -> Result<LsmrResult> {
    let (m, n) = op.shape();
    let rows = op.rows();
    let local = (|| {
        op.local().check()?;
        check_supported(opts)?;
        check_problem(m, n, m, opts)?;
        if b_local.len() != rows.len() {
            return Err(Error::invalid(
                "b",
                format!(
                    "has {} elements on rank {}; its rows {}..{} need {}",
                    b_local.len(),
                    op.collective().rank(),
                    rows.start,
                    rows.end,
                    rows.len()
                ),
            ));
        }
        match b_local.iter().position(|e| !e.is_finite()) {
            Some(i) => Err(Error::invalid(
                "b",
                format!(
                    "element {} is {}; every element must be finite",
                    rows.start + i,
                    b_local[i]
                ),
            )),
            None => Ok(()),
        }
    })();
    let entry = Entry {
        rows: rows.clone(),
        m,
        n,
        value_bytes: 8,
    };
    agree(op.collective(), &entry, opts, local)?;
    let m_i = rows.len();
    let mut vecs = HostRank {
        op,
        b: b_local,
        u: vec![0.0; m_i],
        av: vec![0.0; m_i],
        v: vec![0.0; n],
        atu: vec![0.0; n],
        h: vec![0.0; n],
        hbar: vec![0.0; n],
        x: vec![0.0; n],
    };
    solve_rank(
        &mut vecs,
        m,
        n,
        op.collective().rank(),
        opts,
        &mut DistributedRunOptions::default(),
    )
}

/// The CPU twin of a multi-GPU run: `a` split by `partition` ([`RowPartition::by_nonzeros`]
/// for the usual one), one thread per block on a [`LocalGroup`], each running
/// [`lsmr_distributed_host`] on its block; returns every rank's result, in rank order (all
/// equal). Errors: `partition` not of `a`'s rows, `b` not of `m` elements; the solve's.
pub fn lsmr_host_in_threads<T: Element, I: SparseIndex>(
    a: &CsrHost<T, I>,
    b: &[f64],
    partition: &RowPartition,
    opts: &LsmrOptions,
) -> Result<Vec<LsmrResult>> {
    if partition.rows_total() != a.rows {
        return Err(Error::invalid(
            "partition",
            format!("covers {} rows but A has {}", partition.rows_total(), a.rows),
        ));
    }
    if b.len() != a.rows {
        return Err(Error::invalid(
            "b",
            format!(
                "has {} elements, A is {} x {} so b needs m = {}",
                b.len(),
                a.rows,
                a.cols,
                a.rows
            ),
        ));
    }
    let blocks = (0..partition.parts())
        .map(|g| row_block(a, partition.rows(g)?))
        .collect::<Result<Vec<_>>>()?;
    let group = LocalGroup::new(partition.parts())?;
    std::thread::scope(|scope| {
        let handles: Vec<_> = group
            .into_iter()
            .zip(&blocks)
            .enumerate()
            .map(|(g, (comm, block))| {
                let rows = partition.bounds()[g]..partition.bounds()[g + 1];
                let b_i = &b[rows.clone()];
                scope.spawn(move || {
                    let op = HostDistributedOperator::new(block, rows, a.rows, &comm)?;
                    lsmr_distributed_host(&op, b_i, opts)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Unsupported("a rank's thread panicked".into())))
            })
            .collect()
    })
}

// ---------------------------------------------------------------------------------------------
// The GPU version

/// Source of the vector kernels.
pub const SOURCE: &str = include_str!("lsmr_dist.cu");
/// Threads per CTA.
pub const BLOCK_THREADS: u32 = 256;
/// The most CTAs of a vector kernel (partial sums read back per norm).
pub const MAX_PARTIALS: usize = 1024;

/// The kernels of lsmr_dist.cu.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DistKernel {
    Axpby,
    UpdateX,
}

impl DistKernel {
    pub const ALL: [DistKernel; 2] = [DistKernel::Axpby, DistKernel::UpdateX];
    fn entry(self) -> &'static str {
        match self {
            DistKernel::Axpby => "dist_axpby",
            DistKernel::UpdateX => "dist_update_x",
        }
    }
}

/// One kernel variant: the kernel and the vector type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DistVariant {
    pub kernel: DistKernel,
    pub value: DType,
}

impl DistVariant {
    pub fn key(&self) -> KernelKey {
        KernelKey::new(self.kernel.entry())
            .ty("Val", self.value)
            .int("kBlockThreads", "t", BLOCK_THREADS)
    }
    pub fn spec(&self) -> KernelSpec {
        self.key().spec("lsmr_dist.cu", SOURCE, self.kernel.entry(), &[])
    }
}

/// Every variant (what CI compiles): two kernels for f32 and f64.
pub fn all_variants() -> Vec<DistVariant> {
    [DType::F32, DType::F64]
        .into_iter()
        .flat_map(|value| DistKernel::ALL.map(|kernel| DistVariant { kernel, value }))
        .collect()
}

/// `struct DistParams` of lsmr_dist.cu (80 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct DistParams {
    x: u64,
    y: u64,
    h: u64,
    hbar: u64,
    partials: u64,
    a: f64,
    b: f64,
    c: f64,
    len: i64,
    pad: i64,
}
const _: () = assert!(std::mem::size_of::<DistParams>() == 80);
// SAFETY: #[repr(C)]: five pointers as u64, three f64, two i64, in the order and of the types of
// the kernel's struct (five pointers, three double, two long long).
unsafe impl KernelParams for DistParams {}

/// CTAs of a vector kernel over `len` elements: one per BLOCK_THREADS elements, at most
/// [`MAX_PARTIALS`] (then grid-stride), at least 1.
fn vector_grid(len: usize) -> u32 {
    len.div_ceil(BLOCK_THREADS as usize).clamp(1, MAX_PARTIALS) as u32
}

/// One rank's device vectors and kernels.
struct DeviceRank<'a, T: Element> {
    op: &'a DistributedOperator<'a, T>,
    ctx: Context,
    b: &'a DeviceBuffer<T>,
    m_i: usize,
    n: usize,
    axpby: Arc<Kernel>,
    update_x: Arc<Kernel>,
    /// Vectors of `m_i` (`n`) elements in buffers of at least one (a valid pointer when empty).
    u: DeviceBuffer<T>,
    av: DeviceBuffer<T>,
    v: DeviceBuffer<T>,
    atu: DeviceBuffer<T>,
    h: DeviceBuffer<T>,
    hbar: DeviceBuffer<T>,
    x: DeviceBuffer<T>,
    /// `vector_grid(m_i)` / `vector_grid(n)` partial sums.
    partials_m: DeviceBuffer<f64>,
    partials_n: DeviceBuffer<f64>,
}

impl<'a, T: Element> DeviceRank<'a, T> {
    fn new(op: &'a DistributedOperator<'a, T>, b: &'a DeviceBuffer<T>) -> Result<Self> {
        let ctx = op.communicator().context().clone();
        let (_, n) = op.shape();
        let m_i = op.rows().len();
        let kernel = |kernel| {
            ctx.kernel(
                &DistVariant {
                    kernel,
                    value: T::DTYPE,
                }
                .spec(),
            )
        };
        let vec = |len: usize| ctx.alloc::<T>(len.max(1));
        Ok(DeviceRank {
            op,
            b,
            m_i,
            n,
            axpby: kernel(DistKernel::Axpby)?,
            update_x: kernel(DistKernel::UpdateX)?,
            u: vec(m_i)?,
            av: vec(m_i)?,
            v: vec(n)?,
            atu: vec(n)?,
            h: vec(n)?,
            hbar: vec(n)?,
            x: vec(n)?,
            partials_m: ctx.alloc(vector_grid(m_i) as usize)?,
            partials_n: ctx.alloc(vector_grid(n) as usize)?,
            ctx,
        })
    }

    /// Launches `kernel` over `p.len` elements and, when `measure`, returns the sum of its
    /// partials (a host read, which waits for the stream); 0 for an empty vector (no launch)
    /// or without `measure` (no wait).
    fn launch(&self, kernel: &Kernel, mut p: DistParams, partials: &DeviceBuffer<f64>, measure: bool) -> Result<f64> {
        if p.len == 0 {
            return Ok(0.0);
        }
        let grid = vector_grid(p.len as usize);
        p.partials = partials.device_ptr();
        // SAFETY: every pointer in p is one of this rank's buffers (or b, checked to hold m_i
        // elements): x, y, h, hbar hold >= len elements (len is m_i for the u side, n for the
        // n side, each buffer allocated with at least that many); partials holds
        // vector_grid(len) = grid doubles (partials_m for m_i, partials_n for n); DistParams
        // mirrors the kernel's struct; each element is written by one thread.
        unsafe { kernel.launch(&self.ctx, LaunchConfig::linear(grid, BLOCK_THREADS, 0), &p)? };
        if !measure {
            return Ok(0.0);
        }
        // the partials in order, from 0 (the host sum of the fixed-order partials)
        Ok(partials
            .to_host()?
            .iter()
            .take(grid as usize)
            .fold(0.0, |acc, &e| acc + e))
    }

    /// `y = a x + b y` over `len` elements; with `measure`, the sum of squares of the new `y`.
    #[allow(clippy::too_many_arguments)] // the operands, the length and where the norm goes
    fn axpby(
        &self,
        x: u64,
        y: u64,
        a: f64,
        b: f64,
        len: usize,
        partials: &DeviceBuffer<f64>,
        measure: bool,
    ) -> Result<f64> {
        let p = DistParams {
            x,
            y,
            a,
            b,
            len: len as i64,
            ..DistParams::default()
        };
        self.launch(&self.axpby, p, partials, measure)
    }
}

impl<T: Element> RankVectors for DeviceRank<'_, T> {
    fn start(&mut self, x0: Option<&[f64]>) -> Result<(f64, f64)> {
        let (m_i, n) = (self.m_i, self.n);
        // v = 0 (it stays so when beta == 0: then the solve exits before reading it)
        self.v.fill_bytes(0)?;
        // u = b, ||b_i||^2
        let b2 = self.axpby(
            self.b.device_ptr(),
            self.u.device_ptr(),
            1.0,
            0.0,
            m_i,
            &self.partials_m,
            true,
        )?;
        match x0 {
            None => {
                self.x.fill_bytes(0)?;
                Ok((b2, b2))
            }
            Some(x0) => {
                let x0_t: Vec<T> = x0.iter().map(|&e| T::from_f64(e)).collect();
                self.x.copy_from_host_at(0, &x0_t)?;
                self.op.apply_local(&self.x, &mut self.av)?;
                let u2 = self.axpby(
                    self.av.device_ptr(),
                    self.u.device_ptr(),
                    -1.0,
                    1.0,
                    m_i,
                    &self.partials_m,
                    true,
                )?;
                debug_assert!(x0.len() == n);
                Ok((b2, u2))
            }
        }
    }

    fn update_u(&mut self, alpha: f64) -> Result<f64> {
        self.op.apply_local(&self.v, &mut self.av)?;
        self.axpby(
            self.av.device_ptr(),
            self.u.device_ptr(),
            1.0,
            -alpha,
            self.m_i,
            &self.partials_m,
            true,
        )
    }

    fn scale_u(&mut self, s: f64) -> Result<()> {
        let u = self.u.device_ptr();
        self.axpby(u, u, 0.0, s, self.m_i, &self.partials_m, false).map(|_| ())
    }

    fn reduce_atu(&mut self) -> Result<()> {
        self.op.apply_transposed(&self.u, &mut self.atu)
    }

    fn update_v(&mut self, beta: f64, first: bool) -> Result<f64> {
        let b = if first { 0.0 } else { -beta };
        self.axpby(
            self.atu.device_ptr(),
            self.v.device_ptr(),
            1.0,
            b,
            self.n,
            &self.partials_n,
            true,
        )
    }

    fn scale_v(&mut self, s: f64) -> Result<()> {
        let v = self.v.device_ptr();
        self.axpby(v, v, 0.0, s, self.n, &self.partials_n, false).map(|_| ())
    }

    fn start_h(&mut self) -> Result<()> {
        self.axpby(
            self.v.device_ptr(),
            self.h.device_ptr(),
            1.0,
            0.0,
            self.n,
            &self.partials_n,
            false,
        )?;
        self.hbar.fill_bytes(0)
    }

    fn update_x(&mut self, f: &StepFactors) -> Result<f64> {
        let p = DistParams {
            x: self.v.device_ptr(),
            y: self.x.device_ptr(),
            h: self.h.device_ptr(),
            hbar: self.hbar.device_ptr(),
            a: f.hbar_factor,
            b: f.x_step,
            c: f.h_factor,
            len: self.n as i64,
            ..DistParams::default()
        };
        self.launch(&self.update_x, p, &self.partials_n, true)
    }

    fn zero_x(&mut self) -> Result<()> {
        self.x.fill_bytes(0)
    }

    fn x(&self) -> Result<Vec<f64>> {
        Ok(self.x.to_host()?.iter().take(self.n).map(|e| e.to_f64()).collect())
    }

    fn sum(&self, values: &mut [f64]) -> Result<()> {
        self.op.communicator().all_reduce_sum_host(values)
    }
}

/// Distributed LSMR on the GPUs of a communicator: this rank's part of the solve of
/// `min ||[b; 0] - [A; damp I] x||` with `A` partitioned by rows (`op`: this rank's block on
/// its GPU, `b_local`: this rank's rows of `b`, on the same device). Every rank calls it
/// together (one thread or process per GPU) with the same `opts`; every rank returns the same
/// result (`x`, all `n` values, on the host in f64). Semantics as [`lsmr_distributed_host`];
/// precision as the one-GPU [`lsmr`](crate::linalg::lsmr()) (`T = f32`: vectors and products in
/// f32, element updates and norms in f64; the all-reduce of `A^T u` sums in `T`). `opts.show`
/// prints on rank 0; `run.progress` is called after every iteration.
///
/// Errors: as [`lsmr_distributed_host`] (a rank's block of another row count than its `b`,
/// options, tiling, `x0`; every rank alike); `T` other than f32/f64; `b` NaN or infinite
/// (found from `||b||`, every rank alike); device, NVRTC or NCCL failures.
pub fn lsmr_distributed<T: Element>(
    op: &DistributedOperator<'_, T>,
    b_local: &DeviceBuffer<T>,
    opts: &LsmrOptions,
    run: &mut DistributedRunOptions<'_>,
) -> Result<LsmrResult> {
    let (m, n) = op.shape();
    let rows = op.rows();
    let comm = op.communicator();
    let local = (|| {
        if !matches!(T::DTYPE, DType::F32 | DType::F64) {
            return Err(Error::Unsupported(format!(
                "distributed LSMR on {} vectors; supported: fp32, fp64",
                T::DTYPE
            )));
        }
        check_supported(opts)?;
        check_problem(m, n, m, opts)?;
        if b_local.len() != rows.len() {
            return Err(Error::invalid(
                "b",
                format!(
                    "has {} elements on rank {}; its rows {}..{} need {}",
                    b_local.len(),
                    comm.rank(),
                    rows.start,
                    rows.end,
                    rows.len()
                ),
            ));
        }
        if !b_local.context().same_device(comm.context()) {
            return Err(Error::invalid("b", "is on another device than the communicator's"));
        }
        Ok(())
    })();
    let entry = Entry {
        rows,
        m,
        n,
        value_bytes: std::mem::size_of::<T>(),
    };
    // The kernels and buffers too, before the check: a rank that failed to compile or allocate
    // must not leave the others waiting in the first collective.
    let (verdict, vecs) = match local.and_then(|()| DeviceRank::new(op, b_local)) {
        Ok(vecs) => (Ok(()), Some(vecs)),
        Err(e) => (Err(e), None),
    };
    agree(comm, &entry, opts, verdict)?;
    let mut vecs = vecs.ok_or_else(|| Error::Unsupported("distributed lsmr: no vectors after the check".into()))?;
    solve_rank(&mut vecs, m, n, comm.rank(), opts, run)
}
