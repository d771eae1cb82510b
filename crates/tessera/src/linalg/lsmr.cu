// lsmr.cu: the device side of LSMR (linalg/lsmr_device.rs): the vector work between the two
// products of each iteration, the norms, and the scalar recurrences and stopping tests, so that
// the host only launches and looks at a stop flag every few iterations.
//
// What. One LSMR iteration (Fong and Saunders 2011; SciPy's order, see linalg/lsmr.rs) is, with
// the products done by the operator (sparse SpMV, user code) into work vectors av and atu:
//   av = A v                                   (operator)
//   lsmr_update_u : u = av - alpha * (u * u_scale), partial sums of u^2
//   lsmr_scalar(ITER_BETA): the deferred stopping test of the previous iteration, then
//                   beta = ||u||, u_scale = 1 / beta
//   atu = A^T u                                (operator; u is not normalised in memory)
//   lsmr_update_v : v = atu * u_scale - beta * v, partial sums of v^2
//   lsmr_scalar(ITER_ALPHA): alpha = ||v||, the rotations, the estimates of ||r||, ||A^T r||,
//                   ||A||, cond(A), and the three factors of the x update
//   lsmr_update_x : v *= 1 / alpha; hbar = h - (theta rho / rho rhobar) hbar; x += step hbar;
//                   h = v - (theta / rho) h; partial sums of x^2 (for ||x||)
// u is kept unnormalised (its 1 / beta is applied where it is read: A^T u is scaled by u_scale
// in lsmr_update_v, and the next lsmr_update_u multiplies u by it), which saves a pass over u.
//
// Stopping. The tests of iteration k need ||x_k||, known only after lsmr_update_x; they run at
// the start of the next lsmr_scalar (ITER_BETA of iteration k + 1, or TEST at a check point),
// before anything that the result reads (x, the estimates) changes: lsmr_update_u of k + 1
// runs first but only touches u, which is not returned. Once `stop` is set, every kernel here
// returns at once, so x and the estimates stay those of the iteration at which the rules first
// held, however many iterations the host had already queued. The operator's products still
// run, into the work vectors only.
//
// Determinism. Norms are two-pass: each CTA of a vector kernel writes one partial sum (in
// double) to partials[blockIdx.x] (a fixed grid-stride assignment and a fixed block tree),
// and lsmr_scalar adds the partials in a fixed order: no float atomics, bitwise reproducible.
//
// Layout. Vectors contiguous, Val (float or double); state: struct LsmrState of doubles (the
// Rust mirror is LsmrState in lsmr_device.rs); partials: kMaxPartials doubles per norm.
//
// Work mapping. Vector kernels: kBlockThreads threads, a fixed grid of at most kMaxPartials CTAs
// (host: min(ceil(len / kBlockThreads), kMaxPartials)), grid-stride over the elements, one
// element per thread per step, arithmetic in double. lsmr_scalar: one CTA of kBlockThreads
// threads; all of them add the partials, thread 0 runs the recurrences (a few hundred flops).
// Shared memory: kBlockThreads / 32 doubles for the block reductions.
//
// Roofline. LSMR is bandwidth bound. Per iteration, bytes moved (s = sizeof(Val)):
//   the products: A v and A^T u, each nnz * (s + sizeof(Idx)) + offsets + gathers and the
//   output (dual storage: two CSR SpMVs);
//   here: update_u 3 m s (read av, u; write u), update_v 3 n s, update_x 8 n s (read v, h,
//   hbar, x; write v, h, hbar, x); partials and state: O(kMaxPartials) doubles.
// So the vector work is (3m + 11n) s per iteration against about 2 nnz (s + sizeof(Idx)) for
// the products: for the tall tomography matrices (nnz ~ 18-21 per row) under 10% of the SpMVs.
#include "tessera/common.cuh"
#include "tessera/reduce.cuh"

#ifndef TS_GENERATED_PREAMBLE
using Val = float;
constexpr int kBlockThreads = 256;
constexpr int kMaxPartials = 1024;
#endif

// The f64 state of one solve. Field order = the Rust mirror (LsmrState in lsmr_device.rs).
struct LsmrState {
  // options (set by the host before the first kernel)
  double damp, atol, btol, ctol, maxiter;
  // control: stop flag, SciPy's istop, iterations done, the last iteration tested, early exit
  // (0 none, 1 ||A^T r0|| == 0, 2 ||b|| == 0: x must be zeroed by the host)
  double stop, istop, itn, tested_itn, early;
  // the bidiagonalisation
  double normb, alpha, beta, u_scale, v_scale;
  // the rotations
  double zetabar, alphabar, rho, rhobar, cbar, sbar;
  // the ||r|| estimate (paper section 3.3)
  double betadd, betad, rhodold, tautildeold, thetatilde, zeta, d;
  // the ||A|| and cond(A) estimates
  double norma2, maxrbar, minrbar;
  // the results of the last iteration
  double normr, normar, norma, conda, normx;
  // the factors of the x update of the current iteration
  double hbar_factor, x_step, h_factor;
};

enum ScalarMode : int {
  kSetupBeta = 0,   // normb = ||b|| (partials_x), beta = ||b - A x0|| (partials_u)
  kSetupAlpha = 1,  // alpha = ||A^T u|| (partials_v), the recurrences' start, early exits
  kIterBeta = 2,    // the deferred test, then beta
  kIterAlpha = 3,   // alpha, one step of the recurrences
  kTest = 4,        // the deferred test only (at a check point and at the end)
};

struct VecParams {
  const Val* a;     // av (update_u), atu (update_v), the vector to measure (sumsq)
  Val* u;           // u (update_u), v (update_v, update_x)
  Val* h;           // update_x
  Val* hbar;        // update_x
  Val* x;           // update_x
  double* partials; // [gridDim.x]
  LsmrState* state;
  long long len;
  int first;        // setup pass (update_v: v = atu * u_scale; update_x: h = v, hbar = 0)
  int pad;
};

struct ScalarParams {
  LsmrState* state;
  const double* partials_u;
  const double* partials_v;
  const double* partials_x;
  int count_u, count_v, count_x;
  int mode;
};

namespace {

struct SumD {
  TS_DEVICE double operator()(double a, double b) const { return a + b; }
};

TS_DEVICE double block_sum(double v, double* smem) {
  return ts::block_allreduce<kBlockThreads>(v, SumD{}, 0.0, smem);
}

// Writes this CTA's partial sum (thread 0).
TS_DEVICE void write_partial(double v, double* partials, double* smem) {
  v = block_sum(v, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = v;
}

// sqrt of the sum of partials[0 .. count), in a fixed order; every thread gets the result.
TS_DEVICE double norm_of(const double* partials, int count, double* smem) {
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += kBlockThreads) s += partials[i];
  return sqrt(block_sum(s, smem));
}

TS_DEVICE bool stopped(const LsmrState* st) { return st->stop != 0.0; }

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

// SciPy's stopping tests of the iteration just finished (st->itn), given ||x||.
TS_DEVICE void stopping_test(LsmrState* st, double normx) {
  st->normx = normx;
  const double normb = st->normb, norma = st->norma, normr = st->normr;
  const double test1 = normr / normb;
  const double test2 = (norma * normr != 0.0) ? st->normar / (norma * normr) : __longlong_as_double(0x7ff0000000000000ll);
  const double test3 = 1.0 / st->conda;
  const double t1 = test1 / (1.0 + norma * normx / normb);
  const double rtol = st->btol + st->atol * norma * normx / normb;
  // the last test that holds wins: the user's tolerances override the machine-precision ones
  int istop = 0;
  if (st->itn >= st->maxiter) istop = 7;
  if (1.0 + test3 <= 1.0) istop = 6;
  if (1.0 + test2 <= 1.0) istop = 5;
  if (1.0 + t1 <= 1.0) istop = 4;
  if (test3 <= st->ctol) istop = 3;
  if (test2 <= st->atol) istop = 2;
  if (test1 <= rtol) istop = 1;
  st->istop = istop;
  st->tested_itn = st->itn;
  if (istop > 0) st->stop = 1.0;
}

// One step of the scalar recurrences (alpha, beta = alpha_{k+1}, beta_{k+1} already set).
TS_DEVICE void recurrences(LsmrState* st) {
  const double alpha = st->alpha, beta = st->beta, damp = st->damp;
  st->itn += 1.0;
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
  // ||A||_F from ||B_k||_F
  st->norma2 += beta * beta;
  st->norma = sqrt(st->norma2);
  st->norma2 += alpha * alpha;
  // cond(A) from the diagonal of Rbar
  st->maxrbar = py_max(st->maxrbar, rhobarold);
  if (st->itn > 1.0) st->minrbar = py_min(st->minrbar, rhobarold);
  st->conda = py_max(st->maxrbar, rhotemp) / py_min(st->minrbar, rhotemp);
  st->normar = fabs(st->zetabar);
  st->rho = rho;
  st->rhobar = rhobar;
  st->zeta = zeta;
}

}  // namespace

// partials[cta] = sum of a[i]^2 over the CTA's elements (setup: ||b||, ||b - A x0||).
extern "C" __global__ void __launch_bounds__(kBlockThreads) lsmr_sumsq(const __grid_constant__ VecParams p) {
  __shared__ double smem[kBlockThreads / 32];
  double s = 0.0;
  const long long stride = (long long)gridDim.x * kBlockThreads;
  for (long long i = (long long)blockIdx.x * kBlockThreads + threadIdx.x; i < p.len; i += stride) {
    const double e = (double)p.a[i];
    s += e * e;
  }
  write_partial(s, p.partials, smem);
}

// u = av - alpha * (u * u_scale); partials of u^2.
extern "C" __global__ void __launch_bounds__(kBlockThreads) lsmr_update_u(const __grid_constant__ VecParams p) {
  __shared__ double smem[kBlockThreads / 32];
  const LsmrState* st = p.state;
  if (stopped(st)) return;  // uniform over the grid: no CTA reaches the barrier
  const double alpha = st->alpha, scale = st->u_scale;
  double s = 0.0;
  const long long stride = (long long)gridDim.x * kBlockThreads;
  for (long long i = (long long)blockIdx.x * kBlockThreads + threadIdx.x; i < p.len; i += stride) {
    const Val u = (Val)((double)p.a[i] - alpha * ((double)p.u[i] * scale));
    p.u[i] = u;
    s += (double)u * (double)u;
  }
  write_partial(s, p.partials, smem);
}

// v = atu * u_scale - beta * v (setup: v = atu * u_scale, v = 0 when beta == 0); partials of
// v^2. When beta is not positive (0, or NaN) after the setup, v keeps its value (SciPy) and nothing is written.
extern "C" __global__ void __launch_bounds__(kBlockThreads) lsmr_update_v(const __grid_constant__ VecParams p) {
  __shared__ double smem[kBlockThreads / 32];
  const LsmrState* st = p.state;
  if (!p.first && (stopped(st) || !(st->beta > 0.0))) return;
  const double beta = st->beta, scale = st->u_scale;
  double s = 0.0;
  const long long stride = (long long)gridDim.x * kBlockThreads;
  for (long long i = (long long)blockIdx.x * kBlockThreads + threadIdx.x; i < p.len; i += stride) {
    double v;
    if (p.first) v = beta > 0.0 ? (double)p.a[i] * scale : 0.0;
    else v = (double)p.a[i] * scale - beta * (double)p.u[i];
    const Val vv = (Val)v;
    p.u[i] = vv;
    s += (double)vv * (double)vv;
  }
  write_partial(s, p.partials, smem);
}

// v *= v_scale, then hbar = h + hbar_factor * hbar, x += x_step * hbar, h = v + h_factor * h;
// partials of x^2. Setup (first): v *= v_scale, h = v, hbar = 0.
extern "C" __global__ void __launch_bounds__(kBlockThreads) lsmr_update_x(const __grid_constant__ VecParams p) {
  __shared__ double smem[kBlockThreads / 32];
  const LsmrState* st = p.state;
  if (!p.first && stopped(st)) return;
  const double vs = st->v_scale;
  const double fb = st->hbar_factor, step = st->x_step, fh = st->h_factor;
  Val* v = p.u;
  double s = 0.0;
  const long long stride = (long long)gridDim.x * kBlockThreads;
  for (long long i = (long long)blockIdx.x * kBlockThreads + threadIdx.x; i < p.len; i += stride) {
    const Val vn = (Val)((double)v[i] * vs);
    v[i] = vn;
    if (p.first) {
      p.h[i] = vn;
      p.hbar[i] = (Val)0;
    } else {
      const double h = (double)p.h[i];
      const Val hb = (Val)((double)p.hbar[i] * fb + h);
      p.hbar[i] = hb;
      const Val x = (Val)((double)p.x[i] + step * (double)hb);
      p.x[i] = x;
      p.h[i] = (Val)(h * fh + (double)vn);
      s += (double)x * (double)x;
    }
  }
  if (!p.first) write_partial(s, p.partials, smem);
}

// The scalar work of one step (ScalarMode), one CTA.
extern "C" __global__ void __launch_bounds__(kBlockThreads) lsmr_scalar(const __grid_constant__ ScalarParams p) {
  __shared__ double smem_a[kBlockThreads / 32];
  __shared__ double smem_b[kBlockThreads / 32];
  LsmrState* st = p.state;
  const bool lead = threadIdx.x == 0;
  switch (p.mode) {
    case kSetupBeta: {
      const double normb = norm_of(p.partials_x, p.count_x, smem_a);
      const double beta = norm_of(p.partials_u, p.count_u, smem_b);
      if (lead) {
        st->normb = normb;
        st->beta = beta;
        st->u_scale = beta > 0.0 ? 1.0 / beta : 1.0;
      }
      return;
    }
    case kSetupAlpha: {
      const double beta = st->beta;
      const double nv = norm_of(p.partials_v, p.count_v, smem_a);
      if (!lead) return;
      const double alpha = beta > 0.0 ? nv : 0.0;
      st->alpha = alpha;
      st->v_scale = alpha > 0.0 ? 1.0 / alpha : 1.0;
      st->stop = 0.0;
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
      st->norma2 = alpha * alpha;
      st->maxrbar = 0.0;
      st->minrbar = 1e100;
      st->norma = sqrt(st->norma2);
      st->conda = 1.0;
      st->normx = 0.0;
      st->normr = beta;
      st->normar = alpha * beta;
      st->early = 0.0;
      // SciPy checks ||A^T r0|| first, then ||b||
      if (st->normar == 0.0) {
        st->early = 1.0;
        st->stop = 1.0;
      } else if (st->normb == 0.0) {
        st->early = 2.0;
        st->stop = 1.0;
      }
      return;
    }
    case kIterAlpha: {
      if (stopped(st)) return;  // uniform: read before any thread writes
      const double beta = st->beta;
      const double nv = norm_of(p.partials_v, p.count_v, smem_a);
      if (!lead) return;
      if (beta > 0.0) {
        st->alpha = nv;
        st->v_scale = nv > 0.0 ? 1.0 / nv : 1.0;
      } else {
        st->v_scale = 1.0;  // v and alpha keep their values
      }
      recurrences(st);
      return;
    }
    default: {  // kIterBeta, kTest
      const bool test = !stopped(st) && st->itn >= 1.0 && st->tested_itn < st->itn;
      double normx = 0.0;
      if (test) normx = norm_of(p.partials_x, p.count_x, smem_a);  // uniform condition
      __syncthreads();  // every thread has read the state before thread 0 changes it
      if (lead && test) stopping_test(st, normx);
      if (p.mode == kTest) return;
      __syncthreads();
      if (stopped(st)) return;
      const double beta = norm_of(p.partials_u, p.count_u, smem_b);
      if (lead) {
        st->beta = beta;
        st->u_scale = beta > 0.0 ? 1.0 / beta : 1.0;
      }
      return;
    }
  }
}
