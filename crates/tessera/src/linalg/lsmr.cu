// lsmr.cu: the device side of LSMR (linalg/lsmr_device.rs): the vector work between the two
// products of each iteration, the norms, and the scalar recurrences and stopping tests, so that
// the host only launches and looks at a stop flag every few iterations. One run solves k >= 1
// damping factors at once (the damp list): the bidiagonalisation is shared, each damp has its
// own rotations, h, hbar, x and stopping state. Or k >= 1 right-hand sides at once (many
// right-hand sides): each column has its own bidiagonalisation and state (an LsmrShared and one
// LsmrDamp per column), only the operator products are shared (SpMM over the k columns).
//
// What. One LSMR iteration (Fong and Saunders 2011; SciPy's order, see linalg/lsmr.rs) is, with
// the products done by the operator (sparse SpMV, user code) into work vectors av and atu,
// four launches:
//   av = A v                                   (operator; v is not normalised in memory;
//                                               with column scaling A D v, from dv = D v)
//   lsmr_update_u : u = av * v_scale - alpha * (u * u_scale), partial sums of u^2; in its
//                   first CTAs, the x update of the previous iteration (x_update, below);
//                   then, in its last CTA (per column), the scalar step ITER_BETA: the
//                   deferred stopping tests of the previous iteration (one per damp), then
//                   beta = ||u||, u_scale = 1 / beta
//   atu = A^T u                                (operator; u is not normalised in memory)
//   lsmr_update_v : v = atu * u_scale - beta * (v * v_scale), partial sums of v^2; then, in
//                   its last CTA (per column), the scalar step ITER_ALPHA: alpha = ||v||,
//                   v_scale = 1 / alpha, ||A||; then per damp the rotations, the estimates
//                   of ||r||, ||A^T r||, cond(A), and the three factors of its x update
// x_update, per damp j: hbar_j = h_j - (theta rho / rho rhobar) hbar_j; x_j += step hbar_j;
//                   h_j = v * v_scale - (theta / rho) h_j; partial sums of x_j^2 (for ||x_j||).
//                   Nothing of the next A v or of u depends on it, so it waits for the next
//                   lsmr_update_u (its own launch saved), whose tail tests the iteration with
//                   its x; the last iteration of a batch gets its own lsmr_update_x launch (the
//                   host's flush), before the check point's tests and the x returned.
// The setup (lsmr_sumsq, lsmr_update_v with `first`, lsmr_update_x with `first`) and the
// check points keep the scalar steps as separate lsmr_scalar launches (SETUP_BETA,
// SETUP_ALPHA, TEST): they run once per solve or once per check_every iterations.
// u and v are kept unnormalised: their 1 / beta and 1 / alpha are applied where they are read
// (u_scale in lsmr_update_v and the next lsmr_update_u, v_scale in lsmr_update_u, the next
// lsmr_update_v and lsmr_update_x). That saves a pass over each, and lsmr_update_x only reads
// v, so the k damps' CTAs read it side by side without a race.
//
// Stopping. The tests of iteration k need ||x_k||, known only after lsmr_update_x; they run at
// the start of the next scalar step (ITER_BETA in the tail of lsmr_update_u of iteration
// k + 1, or lsmr_scalar's TEST at a check point), before anything that the result reads (x,
// the estimates) changes: the vector work of lsmr_update_u of k + 1 runs first but only
// touches u, which is not returned. A damp whose test holds sets its own
// stop flag: its recurrences and its CTAs of lsmr_update_x return at once from then on, so its
// x and estimates stay those of the iteration at which its rules first held. When every damp
// has stopped (or at an early exit) the shared stop flag is set and every kernel here returns
// at once, however many iterations the host had already queued; the operator's products get the
// shared stop flag as a skip flag (the sparse SpMV kernels return at once on it; an operator
// that ignores it runs its products into the work vectors only).
//
// Determinism. Norms are two-pass: each CTA of a vector kernel writes one partial sum (in
// double) to partials[blockIdx.x] (a fixed grid-stride assignment and a fixed block tree), and
// the scalar step (scalar_step) adds the partials in a fixed order (a block tree for ||u|| and
// ||v||, one warp butterfly per damp for ||x_j||): no float atomics, bitwise reproducible.
// In the iterations the step runs in whichever CTA of the row finishes last, with the same
// kBlockThreads threads, the same code and the same order as lsmr_scalar, so which CTA that is
// changes no bit. The only atomic is the integer count of finished CTAs (see Work mapping).
//
// Layout. Vectors contiguous, Val (float or double); the damps' h, hbar and x are k vectors of
// `stride` (= n) elements each, back to back. State: struct LsmrShared, then k structs
// LsmrDamp, all doubles (Rust mirrors in lsmr_device.rs); partials: kMaxPartials doubles per
// norm, and per damp for ||x_j|| (damp j at j * kMaxPartials).
// Many right-hand sides: every vector is an m x k or n x k column-major block (column c at
// c * col_stride, col_stride = m or n; h, hbar, x at c * stride), the state is k records of
// (LsmrShared, LsmrDamp) (`state_stride` = `damp_stride` = 41 doubles apart), every partial-sum
// array holds kMaxPartials doubles per column (column c at c * kMaxPartials). Column c is
// blockIdx.y of the vector kernels (the last CTA of row c runs column c's fused scalar step)
// and blockIdx.x of lsmr_scalar (one CTA per column, each with one damp). The damp list is the
// same code with col_stride 0 (one v for all rows of CTAs of lsmr_update_x), state_stride 0
// (one LsmrShared) and damp_stride 28 (LsmrDamp); its update_u and update_v have one row of
// CTAs, whose last CTA runs the step of the one record, for all k damps.
//
// Work mapping. Vector kernels: kBlockThreads threads, a fixed grid of at most kMaxPartials CTAs
// (host: min(ceil(len / kBlockThreads), kMaxPartials)), grid-stride over the elements, one
// element per thread per step, arithmetic in double; lsmr_update_x has k rows of CTAs
// (gridDim.y = k, one per damp), so the CTAs of one chunk of v are launched together and read
// it once from DRAM (the other k - 1 reads hit L2). lsmr_update_u with the deferred x update
// puts those k grids (x_ctas CTAs each, over n) before its own grid over m in one row of CTAs
// (many right-hand sides: one x grid, its column's, at the front of each row). Many right-hand sides: every vector kernel
// has gridDim.y = k (one row of CTAs per column, each on its own column), lsmr_scalar k CTAs.
// The scalar step (one CTA of kBlockThreads threads: a lsmr_scalar CTA, or the last CTA of a
// row of lsmr_update_u / lsmr_update_v): all threads add the partials of ||u||, ||v||; warp w
// adds those of ||x_j|| for j = w, w + 8, ... and runs damp j's stopping test; thread j runs
// damp j's recurrences (a few hundred flops). Shared memory: up to 2 * kBlockThreads / 32
// doubles for the block reductions, and the fused tails' "last CTA" flag.
// The fused tails (VecParams::fused, last_cta_scalar_step): every CTA of row c writes its
// partial (thread 0), fences it and adds 1 to counters[c]; the CTA that sees gridDim.x - 1 is
// the last: it fences (every other CTA's partial is then visible to it), sets counters[c]
// back to 0 for the next launch (update_u and update_v share the counters: launches on one
// stream, each leaves them at 0, so a captured CUDA graph replays correctly) and runs the step
// with all its threads. So that a count always completes, every early return of the two
// kernels is uniform over a row: a stopped record returns in every CTA of its row before
// anything (none counts; the step would have returned at once), and update_v with beta not
// positive after the setup skips the vector loop in every CTA but still writes partials of 0,
// counts and runs ITER_ALPHA (alpha keeps its value, the recurrences step, as in SciPy). The
// step's state writes are read by later launches only: every CTA of the row read its state
// before it counted. Cost: the tails' code sets the kernels' registers (update_u holds the
// stopping test, update_v the recurrences), so fewer of their CTAs are resident at once.
// No kernel of the loop is a programmatic dependent launch: with the SpMV and these kernels so
// launched, an iteration measured ~20% slower (linalg/NOTES.md).
//
// Roofline. LSMR is bandwidth bound. Per iteration, bytes moved (s = sizeof(Val)):
//   the products: A v and A^T u, each nnz * (s + sizeof(Idx)) + offsets + gathers and the
//   output (dual storage: two CSR SpMVs);
//   here: update_u 3 m s (read av, u; write u), update_v 3 n s, update_x (1 + 6 k) n s (read v
//   once, read and write h, hbar, x per damp); partials and state: O(k kMaxPartials) doubles.
// So the vector work is (3m + (4 + 6k) n) s per iteration against about 2 nnz (s + sizeof(Idx))
// for the products: for the tall tomography matrices (nnz ~ 18-21 per row, m >> n) under 10%
// of the SpMVs, and with k = 8 damps still under 15%.
// Many right-hand sides (k columns): the products are one SpMM each (A read once per pass of 8
// columns instead of once per column, plus k vectors' gathers), the vector work is k times a
// single solve's ((3m + 10n) s per column) and the scalar steps run in k CTAs: the target is a
// run of k columns well under k single solves when the matrix dominates the SpMV traffic.
#include "tessera/common.cuh"
#include "tessera/reduce.cuh"

#ifndef TS_GENERATED_PREAMBLE
using Val = float;
constexpr int kBlockThreads = 256;
constexpr int kMaxPartials = 1024;
#endif

// The shared f64 state of one run. Field order = the Rust mirror (LsmrShared in lsmr_device.rs).
struct LsmrShared {
  // options (set by the host before the first kernel)
  double atol, btol, ctol, maxiter;
  // control: every damp stopped (or an early exit), iterations done, early exit
  // (0 none, 1 ||A^T r0|| == 0, 2 ||b|| == 0: x must be zeroed by the host)
  double stop, itn, early;
  // the bidiagonalisation and the ||A||_F estimate (neither depends on damp)
  double normb, alpha, beta, u_scale, v_scale, norma2;
};

// The f64 state of one damp. Field order = the Rust mirror (LsmrDamp in lsmr_device.rs).
struct LsmrDamp {
  // the damping factor (set by the host); control: this damp stopped, SciPy's istop,
  // iterations done (frozen at the stop), the last iteration tested
  double damp, stop, istop, itn, tested_itn;
  // the rotations
  double zetabar, alphabar, rho, rhobar, cbar, sbar;
  // the ||r|| estimate (paper section 3.3)
  double betadd, betad, rhodold, tautildeold, thetatilde, zeta, d;
  // the cond(A) estimate
  double maxrbar, minrbar;
  // the results of the last iteration
  double normr, normar, norma, conda, normx;
  // the factors of the x update of the current iteration
  double hbar_factor, x_step, h_factor;
};

enum ScalarMode : int {
  kSetupBeta = 0,   // normb = ||b|| (partials_x), beta = ||b - A x0|| (partials_u)
  kSetupAlpha = 1,  // alpha = ||A^T u|| (partials_v), the recurrences' start, early exits
  kIterBeta = 2,    // the deferred tests, then beta
  kIterAlpha = 3,   // alpha, one step of the recurrences of every running damp
  kTest = 4,        // the deferred tests only (at a check point and at the end)
};

struct ScalarParams {
  LsmrShared* shared;
  LsmrDamp* damps;
  const double* partials_u;
  const double* partials_v;
  const double* partials_x;  // setup: ||b|| ([count_x]); else ||x_j|| ([k][kMaxPartials])
  int count_u, count_v, count_x;
  int mode;                  // lsmr_scalar's step (fused tails: their own, set to match)
  int k;                     // damps per record (many right-hand sides: 1)
  int state_stride;          // doubles between two columns' records (record c: column c); 0: one
};

struct VecParams {
  const Val* a;     // av (update_u), atu (update_v), the vector to measure (sumsq)
  Val* u;           // u (update_u), v (update_v, update_x)
  Val* h;           // update_x: k vectors of `stride` elements
  Val* hbar;        // update_x: idem
  Val* x;           // update_x: idem
  const Val* d;     // update_v: the column scale D (n), or null (no scaling)
  Val* dv;          // update_v: D v (n), the input of the next A product, when d is set
  double* partials; // [gridDim.x] (update_x: [gridDim.y][kMaxPartials])
  LsmrShared* shared;
  LsmrDamp* damps;  // [k]
  long long len;
  long long stride;       // elements between two damps' (columns') h, hbar, x
  long long col_stride;   // elements between two columns of a, u (v in update_x), dv; 0: one
  long long state_stride; // doubles between two columns' LsmrShared (0: one shared state)
  long long damp_stride;  // doubles between two rows' LsmrDamp (28: the damp list; 41: columns)
  int first;        // setup pass (update_v: v = atu * u_scale; update_x: h = v * v_scale, hbar = 0)
  int fused;        // update_u, update_v after the setup: the last CTA of each grid row runs scalar
  ScalarParams scalar;  // fused: the scalar step (mode kIterBeta / kIterAlpha) of the row's record
  int* counters;    // fused: [gridDim.y] CTAs of the row done; 0 between launches (re-armed)
  // update_u only: the deferred x update of the previous iteration (lsmr_update_x's work) in
  // its first x_ctas * x_rows CTAs; x_ctas = 0: none. The x vectors are `stride` (= n) long.
  const Val* v;        // v (column c at c * stride)
  double* partials_x;  // [k][kMaxPartials]: of ||x_j||
  int x_ctas;          // CTAs per damp (column): the grid lsmr_update_x would have
  int x_rows;          // damps per grid row: k for the damp list, 1 for many right-hand sides
};

namespace {

struct SumD {
  TS_DEVICE double operator()(double a, double b) const { return a + b; }
};

TS_DEVICE double block_sum(double v, double* smem) {
  return ts::block_allreduce<kBlockThreads>(v, SumD{}, 0.0, smem);
}

// Writes this CTA's partial sum (thread 0) to partials[index] (index: the CTA's place among
// the CTAs of its sum).
TS_DEVICE void write_partial(double v, double* partials, int index, double* smem) {
  v = block_sum(v, smem);
  if (threadIdx.x == 0) partials[index] = v;
}

// sqrt of the sum of partials[0 .. count), in a fixed order; every thread gets the result.
TS_DEVICE double norm_of(const double* partials, int count, double* smem) {
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += kBlockThreads) s += partials[i];
  return sqrt(block_sum(s, smem));
}

// The same over one warp (all 32 lanes call it; the butterfly gives every lane the same bits).
TS_DEVICE double warp_norm_of(const double* partials, int count) {
  double s = 0.0;
  for (int i = ts::lane_id(); i < count; i += 32) s += partials[i];
  return sqrt(ts::warp_allreduce<32>(s, SumD{}));
}

// The state of row (column) c of a vector kernel.
TS_DEVICE LsmrShared* shared_of(const VecParams& p, int c) {
  return (LsmrShared*)((double*)p.shared + (long long)c * p.state_stride);
}
TS_DEVICE const LsmrDamp* damp_of(const VecParams& p, int c) {
  return (const LsmrDamp*)((const double*)p.damps + (long long)c * p.damp_stride);
}

TS_DEVICE double sign_of(double v) { return v > 0.0 ? 1.0 : v < 0.0 ? -1.0 : v == 0.0 ? 0.0 : v; }
// Python's max / min (the second argument only if strictly larger / smaller).
TS_DEVICE double py_max(double a, double b) { return b > a ? b : a; }
TS_DEVICE double py_min(double a, double b) { return b < a ? b : a; }

// A stable plane rotation (Choi's SymOrtho): c a + s b = r, -s a + c b = 0, r >= 0.
struct Rotation {
  double c, s, r;
};
TS_DEVICE Rotation sym_ortho(double a, double b) {
  if (b == 0.0) return {sign_of(a), 0.0, fabs(a)};
  if (a == 0.0) return {0.0, sign_of(b), fabs(b)};
  if (fabs(b) > fabs(a)) {
    const double tau = a / b;
    const double s = sign_of(b) / sqrt(1.0 + tau * tau);
    const double c = s * tau;
    return {c, s, b / s};
  }
  const double tau = b / a;
  const double c = sign_of(a) / sqrt(1.0 + tau * tau);
  const double s = c * tau;
  return {c, s, a / c};
}

// SciPy's stopping tests of damp st's iteration just finished (st->itn), given ||x||.
TS_DEVICE void stopping_test(const LsmrShared* sh, LsmrDamp* st, double normx) {
  st->normx = normx;
  const double normb = sh->normb, norma = st->norma, normr = st->normr;
  const double test1 = normr / normb;
  const double test2 = (norma * normr != 0.0) ? st->normar / (norma * normr) : __longlong_as_double(0x7ff0000000000000ll);
  const double test3 = 1.0 / st->conda;
  const double t1 = test1 / (1.0 + norma * normx / normb);
  const double rtol = sh->btol + sh->atol * norma * normx / normb;
  // the last test that holds wins: the user's tolerances override the machine-precision ones
  int istop = 0;
  if (st->itn >= sh->maxiter) istop = 7;
  if (1.0 + test3 <= 1.0) istop = 6;
  if (1.0 + test2 <= 1.0) istop = 5;
  if (1.0 + t1 <= 1.0) istop = 4;
  if (test3 <= sh->ctol) istop = 3;
  if (test2 <= sh->atol) istop = 2;
  if (test1 <= rtol) istop = 1;
  st->istop = istop;
  st->tested_itn = st->itn;
  if (istop > 0) st->stop = 1.0;
}

// One step of damp st's recurrences, given the shared alpha = alpha_{k+1}, beta = beta_{k+1},
// the iteration number and the ||B_k||_F estimate. Not inlined: inlined into the per-damp loop
// of lsmr_scalar, ptxas (sm_86 .. sm_90a) capped the kernel at 64 registers and spilled 8 bytes.
__device__ __noinline__ void recurrences(LsmrDamp* st, double alpha, double beta, double itn, double norma) {
  const double damp = st->damp;
  st->itn = itn;
  // Qhat_k folds damp into alphabar; Q_k turns B_k into R_k
  const Rotation hat = sym_ortho(st->alphabar, damp);
  const double rhoold = st->rho;
  const Rotation q = sym_ortho(hat.r, beta);
  const double rho = q.r;
  const double thetanew = q.s * alpha;
  st->alphabar = q.c * alpha;
  // Qbar_k turns R_k^T into Rbar_k
  const double rhobarold = st->rhobar;
  const double zetaold = st->zeta;
  const double thetabar = st->sbar * rho;
  const double rhotemp = st->cbar * rho;
  const Rotation qbar = sym_ortho(st->cbar * rho, thetanew);
  st->cbar = qbar.c;
  st->sbar = qbar.s;
  const double rhobar = qbar.r;
  const double zeta = qbar.c * st->zetabar;
  st->zetabar *= -qbar.s;
  // the factors of the h, hbar, x updates
  st->hbar_factor = -(thetabar * rho / (rhoold * rhobarold));
  st->x_step = zeta / (rho * rhobar);
  st->h_factor = -(thetanew / rho);
  // ||r||: apply Qhat_k, Q_k to (betadd, 0), then Qtilde_{k-1}
  const double betaacute = hat.c * st->betadd;
  const double betacheck = -hat.s * st->betadd;
  const double betahat = q.c * betaacute;
  st->betadd = -q.s * betaacute;
  const double thetatildeold = st->thetatilde;
  const Rotation qtilde = sym_ortho(st->rhodold, thetabar);
  st->thetatilde = qtilde.s * rhobar;
  st->rhodold = qtilde.c * rhobar;
  st->betad = -qtilde.s * st->betad + qtilde.c * betahat;
  st->tautildeold = (zetaold - thetatildeold * st->tautildeold) / qtilde.r;
  const double taud = (zeta - st->thetatilde * st->tautildeold) / st->rhodold;
  st->d += betacheck * betacheck;
  const double gap = st->betad - taud;
  st->normr = sqrt(st->d + gap * gap + st->betadd * st->betadd);
  // ||A||_F from ||B_k||_F (shared)
  st->norma = norma;
  // cond(A) from the diagonal of Rbar
  st->maxrbar = py_max(st->maxrbar, rhobarold);
  if (itn > 1.0) st->minrbar = py_min(st->minrbar, rhobarold);
  st->conda = py_max(st->maxrbar, rhotemp) / py_min(st->minrbar, rhotemp);
  st->normar = fabs(st->zetabar);
  st->rho = rho;
  st->rhobar = rhobar;
  st->zeta = zeta;
}

// The start of damp st's recurrences (SciPy's initialisation), given alpha_1, beta_1.
TS_DEVICE void start_damp(LsmrDamp* st, double alpha, double beta, bool early) {
  st->stop = early ? 1.0 : 0.0;
  st->istop = 0.0;
  st->itn = 0.0;
  st->tested_itn = 0.0;
  st->zetabar = alpha * beta;
  st->alphabar = alpha;
  st->rho = 1.0;
  st->rhobar = 1.0;
  st->cbar = 1.0;
  st->sbar = 0.0;
  st->betadd = beta;
  st->betad = 0.0;
  st->rhodold = 1.0;
  st->tautildeold = 0.0;
  st->thetatilde = 0.0;
  st->zeta = 0.0;
  st->d = 0.0;
  st->maxrbar = 0.0;
  st->minrbar = 1e100;
  st->normr = beta;
  st->normar = alpha * beta;
  st->norma = sqrt(alpha * alpha);
  st->conda = 1.0;
  st->normx = 0.0;
  st->hbar_factor = 0.0;
  st->x_step = 0.0;
  st->h_factor = 0.0;
}

}  // namespace

// The scalar work of one step (ScalarMode `mode`: lsmr_scalar passes p.mode, the fused tails
// a constant, so that each vector kernel holds the code of its own step only) on record c
// (column c; the damp list: c = 0, state_stride 0), by one whole CTA: every thread calls it (it
// has barriers and block reductions; its early returns are uniform over the CTA). smem_a,
// smem_b: kBlockThreads / 32 doubles each, free on entry (no thread still reading them from an
// earlier reduction).
__device__ void scalar_step(const ScalarParams& p, int mode, int c, double* smem_a, double* smem_b) {
  const long long rec = (long long)c * p.state_stride;
  const long long part = (long long)c * kMaxPartials;
  LsmrShared* sh = (LsmrShared*)((double*)p.shared + rec);
  LsmrDamp* damps = (LsmrDamp*)((double*)p.damps + rec);
  const double* partials_u = p.partials_u + part;
  const double* partials_v = p.partials_v + part;
  const double* partials_x = p.partials_x + part;
  const bool lead = threadIdx.x == 0;
  switch (mode) {
    case kSetupBeta: {
      const double normb = norm_of(partials_x, p.count_x, smem_a);
      const double beta = norm_of(partials_u, p.count_u, smem_b);
      if (lead) {
        sh->normb = normb;
        sh->beta = beta;
        sh->u_scale = beta > 0.0 ? 1.0 / beta : 1.0;
      }
      return;
    }
    case kSetupAlpha: {
      const double beta = sh->beta, normb = sh->normb;  // read before anyone writes
      const double nv = norm_of(partials_v, p.count_v, smem_a);
      const double alpha = beta > 0.0 ? nv : 0.0;
      // SciPy checks ||A^T r0|| first, then ||b||
      const double early = alpha * beta == 0.0 ? 1.0 : normb == 0.0 ? 2.0 : 0.0;
      for (int j = threadIdx.x; j < p.k; j += kBlockThreads) start_damp(damps + j, alpha, beta, early != 0.0);
      if (lead) {
        sh->alpha = alpha;
        sh->v_scale = alpha > 0.0 ? 1.0 / alpha : 1.0;
        sh->stop = early != 0.0 ? 1.0 : 0.0;
        sh->itn = 0.0;
        sh->early = early;
        sh->norma2 = alpha * alpha;
      }
      return;
    }
    case kIterAlpha: {
      if (sh->stop != 0.0) return;  // uniform: read before any thread writes
      // every thread reads the shared state before the barriers in norm_of, then computes the
      // same new values; thread 0 stores them
      const double beta = sh->beta, old_alpha = sh->alpha, old_vs = sh->v_scale;
      const double itn = sh->itn + 1.0;
      double norma2 = sh->norma2;
      const double nv = norm_of(partials_v, p.count_v, smem_a);
      // when beta == 0, v and alpha keep their values (and v its scale)
      const double alpha = beta > 0.0 ? nv : old_alpha;
      const double vs = beta > 0.0 ? (nv > 0.0 ? 1.0 / nv : 1.0) : old_vs;
      // ||A||_F from ||B_k||_F (alpha_{k+1} enters at the next iteration)
      norma2 += beta * beta;
      const double norma = sqrt(norma2);
      norma2 += alpha * alpha;
      if (lead) {
        sh->alpha = alpha;
        sh->v_scale = vs;
        sh->itn = itn;
        sh->norma2 = norma2;
      }
      for (int j = threadIdx.x; j < p.k; j += kBlockThreads) {
        LsmrDamp* st = damps + j;
        if (st->stop == 0.0) recurrences(st, alpha, beta, itn, norma);
      }
      return;
    }
    default: {  // kIterBeta, kTest
      if (sh->stop != 0.0) return;  // uniform: read before any thread writes
      // the deferred test of each damp: warp w tests damps w, w + 8, ...
      const int warp = threadIdx.x / 32, warps = kBlockThreads / 32;
      for (int j = warp; j < p.k; j += warps) {
        LsmrDamp* st = damps + j;
        const bool test = st->stop == 0.0 && st->itn >= 1.0 && st->tested_itn < st->itn;  // warp-uniform
        if (!test) continue;
        const double normx = warp_norm_of(partials_x + (long long)j * kMaxPartials, p.count_x);
        if (ts::lane_id() == 0) stopping_test(sh, st, normx);
      }
      __syncthreads();  // every damp's test is written (and visible) before the count
      if (lead) {
        bool all = true;
        for (int j = 0; j < p.k; ++j) all = all && damps[j].stop != 0.0;
        if (all) sh->stop = 1.0;
      }
      if (mode == kTest) return;
      __syncthreads();
      if (sh->stop != 0.0) return;
      const double beta = norm_of(partials_u, p.count_u, smem_b);
      if (lead) {
        sh->beta = beta;
        sh->u_scale = beta > 0.0 ? 1.0 / beta : 1.0;
      }
      return;
    }
  }
}

// The fused tail of lsmr_update_u / lsmr_update_v (p.fused): after every CTA of grid row c has
// written its partial sum (thread 0, write_partial), the CTA that finishes last runs the
// scalar step `mode` of record c (p.scalar) with all its threads. Thread 0 of each CTA fences
// its partial (release) and counts the CTA in counters[c]; the one that sees gridDim.x - 1 is
// the last, fences again (acquire: every counted CTA's partial is visible to it, and after the
// barrier to all its threads), re-arms the counter for the next launch and tells its CTA
// through shared memory. Every CTA of a row calls this or none does (the kernels' early
// returns are uniform over a row), so the count always completes and the counter is 0 between
// launches. The step's state writes are read by later launches only: every CTA of the row
// read its state before it counted.
TS_DEVICE void last_cta_scalar_step(const VecParams& p, int mode, double* smem_a, double* smem_b) {
  __shared__ int is_last;
  const int c = blockIdx.y;
  if (threadIdx.x == 0) {
    __threadfence();
    const bool last = atomicAdd(p.counters + c, 1) == (int)gridDim.x - 1;
    if (last) {
      __threadfence();
      p.counters[c] = 0;
    }
    is_last = last;
  }
  __syncthreads();  // also: every thread is done with smem_a (write_partial) before the step
  if (is_last) scalar_step(p.scalar, mode, c, smem_a, smem_b);
}

// partials[cta] = sum of a[i]^2 over the CTA's elements (setup: ||b||, ||b - A x0||).
extern "C" __global__ void __launch_bounds__(kBlockThreads) lsmr_sumsq(const __grid_constant__ VecParams p) {
  __shared__ double smem[kBlockThreads / 32];
  const Val* a = p.a + (long long)blockIdx.y * p.col_stride;
  double s = 0.0;
  const long long stride = (long long)gridDim.x * kBlockThreads;
  for (long long i = (long long)blockIdx.x * kBlockThreads + threadIdx.x; i < p.len; i += stride) {
    const double e = (double)a[i];
    s += e * e;
  }
  write_partial(s, p.partials + (long long)blockIdx.y * kMaxPartials, blockIdx.x, smem);
}

// One damp's (column's) x update over CTA `cta` of `ctas` (lsmr_update_x's work, also run by
// lsmr_update_u for the previous iteration): hbar = h + hbar_factor * hbar, x += x_step * hbar,
// h = v * v_scale + h_factor * h over `len` elements, and the CTA's partial of ||x||^2 into
// partials[cta]. Not for a stopped damp (the caller skips it).
TS_DEVICE void x_update(const LsmrShared* sh, const LsmrDamp* st, const Val* v, Val* h, Val* hbar, Val* x,
                        long long len, int cta, int ctas, double* partials, double* smem) {
  const double vs = sh->v_scale;
  const double fb = st->hbar_factor, step = st->x_step, fh = st->h_factor;
  const long long stride = (long long)ctas * kBlockThreads;
  double s = 0.0;
  for (long long i = (long long)cta * kBlockThreads + threadIdx.x; i < len; i += stride) {
    const double hi = (double)h[i];
    const Val hb = (Val)((double)hbar[i] * fb + hi);
    hbar[i] = hb;
    const Val xi = (Val)((double)x[i] + step * (double)hb);
    x[i] = xi;
    h[i] = (Val)(hi * fh + (double)v[i] * vs);
    s += (double)xi * (double)xi;
  }
  write_partial(s, partials, cta, smem);
}

// u = av * v_scale - alpha * (u * u_scale); partials of u^2. With x_ctas > 0, the first
// x_ctas * x_rows CTAs do the previous iteration's x update instead (x_update: damp, or
// column, blockIdx.y + blockIdx.x / x_ctas), the others the u update. Fused: then kIterBeta
// (the deferred tests, which read the x partials just written; beta = ||u||) by the row's last
// CTA. The u loop issues kUnrollU elements' loads before their stores (a thread's elements in
// grid-stride order, so the partial sums' order is that of a plain loop).
extern "C" __global__ void __launch_bounds__(kBlockThreads) lsmr_update_u(const __grid_constant__ VecParams p) {
  __shared__ double smem_a[kBlockThreads / 32];
  __shared__ double smem_b[kBlockThreads / 32];
  const LsmrShared* sh = shared_of(p, blockIdx.y);
  // uniform over the grid row: no CTA of it counts (kIterBeta would return at once as well)
  if (sh->stop != 0.0) return;
  const int x_total = p.x_ctas * p.x_rows;
  if ((int)blockIdx.x < x_total) {
    const int r = (int)blockIdx.y + (int)blockIdx.x / p.x_ctas;
    const LsmrDamp* st = damp_of(p, r);
    // a stopped damp skips its work but its CTAs still count (the row's count must complete)
    if (st->stop == 0.0) {
      const long long off = (long long)r * p.stride;
      x_update(sh, st, p.v + (long long)blockIdx.y * p.stride, p.h + off, p.hbar + off, p.x + off, p.stride,
               (int)blockIdx.x % p.x_ctas, p.x_ctas, p.partials_x + (long long)r * kMaxPartials, smem_a);
    }
  } else {
    constexpr int kUnrollU = 4;
    const int cta = (int)blockIdx.x - x_total, ctas = (int)gridDim.x - x_total;
    const double alpha = sh->alpha, us = sh->u_scale, vs = sh->v_scale;
    const Val* a = p.a + (long long)blockIdx.y * p.col_stride;
    Val* uc = p.u + (long long)blockIdx.y * p.col_stride;
    double s = 0.0;
    const long long stride = (long long)ctas * kBlockThreads;
    for (long long i0 = (long long)cta * kBlockThreads + threadIdx.x; i0 < p.len; i0 += kUnrollU * stride) {
      double av[kUnrollU], uv[kUnrollU];
#pragma unroll
      for (int q = 0; q < kUnrollU; ++q) {
        const long long i = i0 + q * stride;
        av[q] = i < p.len ? (double)a[i] : 0.0;
        uv[q] = i < p.len ? (double)uc[i] : 0.0;
      }
#pragma unroll
      for (int q = 0; q < kUnrollU; ++q) {
        const long long i = i0 + q * stride;
        if (i < p.len) {
          const Val u = (Val)(av[q] * vs - alpha * (uv[q] * us));
          uc[i] = u;
          s += (double)u * (double)u;
        }
      }
    }
    write_partial(s, p.partials + (long long)blockIdx.y * kMaxPartials, cta, smem_a);
  }
  if (p.fused) last_cta_scalar_step(p, kIterBeta, smem_a, smem_b);
}

// v = atu * u_scale - beta * (v * v_scale) (setup: v = atu * u_scale, v = 0 when beta == 0);
// partials of v^2. With column scaling (d set) the operator is A D: atu is D (A^T u) and
// dv = D v is written for the next product A (D v). When beta is not positive (0, or NaN)
// after the setup, v (and dv) keep their values (SciPy): no element is written and the CTAs
// write partials of 0 (kIterAlpha then keeps alpha and does not use ||v||). Fused: then
// kIterAlpha (alpha, the recurrences) by the row's last CTA, whatever beta.
extern "C" __global__ void __launch_bounds__(kBlockThreads) lsmr_update_v(const __grid_constant__ VecParams p) {
  __shared__ double smem_a[kBlockThreads / 32];
  __shared__ double smem_b[kBlockThreads / 32];
  const LsmrShared* sh = shared_of(p, blockIdx.y);
  // uniform over the grid row: no CTA of it counts (kIterAlpha would return at once as well)
  if (!p.first && sh->stop != 0.0) return;
  const double beta = sh->beta, us = sh->u_scale, vs = sh->v_scale;
  // uniform over the row too (one beta per record): skip the loop, still count
  const bool keep = !p.first && !(beta > 0.0);
  const long long off = (long long)blockIdx.y * p.col_stride;
  const Val* a = p.a + off;
  Val* vc = p.u + off;
  Val* dv = p.dv + off;
  double s = 0.0;
  const long long stride = (long long)gridDim.x * kBlockThreads;
  const long long len = keep ? 0 : p.len;
  for (long long i = (long long)blockIdx.x * kBlockThreads + threadIdx.x; i < len; i += stride) {
    const double di = p.d ? (double)p.d[i] : 1.0;
    const double atu = di * (double)a[i];
    double v;
    if (p.first) v = beta > 0.0 ? atu * us : 0.0;
    else v = atu * us - beta * ((double)vc[i] * vs);
    const Val vv = (Val)v;
    vc[i] = vv;
    if (p.d) dv[i] = (Val)(di * (double)vv);
    s += (double)vv * (double)vv;
  }
  write_partial(s, p.partials + (long long)blockIdx.y * kMaxPartials, blockIdx.x, smem_a);
  if (p.fused) last_cta_scalar_step(p, kIterAlpha, smem_a, smem_b);
}

// Damp (or column) j = blockIdx.y: x_update (hbar_j, x_j, h_j; partials of x_j^2). Setup
// (first): h_j = v * v_scale, hbar_j = 0. v is only read. In the iterations lsmr_update_u does
// this work for the previous iteration; this kernel runs at the setup and at check points.
extern "C" __global__ void __launch_bounds__(kBlockThreads) lsmr_update_x(const __grid_constant__ VecParams p) {
  __shared__ double smem[kBlockThreads / 32];
  const LsmrShared* sh = shared_of(p, blockIdx.y);
  const LsmrDamp* st = damp_of(p, blockIdx.y);
  if (!p.first && (sh->stop != 0.0 || st->stop != 0.0)) return;  // uniform over the CTA
  const Val* v = p.u + (long long)blockIdx.y * p.col_stride;
  const long long off = (long long)blockIdx.y * p.stride;
  if (p.first) {
    const double vs = sh->v_scale;
    const long long stride = (long long)gridDim.x * kBlockThreads;
    for (long long i = (long long)blockIdx.x * kBlockThreads + threadIdx.x; i < p.len; i += stride) {
      p.h[off + i] = (Val)((double)v[i] * vs);
      p.hbar[off + i] = (Val)0;
    }
    return;
  }
  x_update(sh, st, v, p.h + off, p.hbar + off, p.x + off, p.len, blockIdx.x, gridDim.x,
           p.partials + (long long)blockIdx.y * kMaxPartials, smem);
}

// The scalar work of one step (ScalarMode): one CTA per column (the damp list: one CTA). The
// setup steps, the tests at a check point; in the iterations, kIterBeta and kIterAlpha run in
// the tails of lsmr_update_u and lsmr_update_v instead (VecParams::fused).
extern "C" __global__ void __launch_bounds__(kBlockThreads) lsmr_scalar(const __grid_constant__ ScalarParams p) {
  __shared__ double smem_a[kBlockThreads / 32];
  __shared__ double smem_b[kBlockThreads / 32];
  scalar_step(p, p.mode, blockIdx.x, smem_a, smem_b);
}
