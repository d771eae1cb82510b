//! LSMR on the host, in f64: the CPU reference of tessera's least-squares solver, with the
//! contract of `scipy.sparse.linalg.lsmr` (SciPy 1.17).
//!
//! # What it computes
//!
//! For a real `m x n` matrix `A` (any shape: square, tall or wide), `b` of length `m` and a
//! damping factor `damp >= 0`, [`lsmr_host`] approximates the solution of
//!
//! ```text
//! min || [ b ]   [    A     ]     ||
//!     || [ 0 ] - [ damp * I ] x   ||_2
//! ```
//!
//! which is `A x = b` when that system is consistent, the least-squares solution otherwise, and
//! the minimum-norm one of either when `A` is rank deficient and the iteration starts from 0.
//! The method (D. C.-L. Fong and M. A. Saunders, "LSMR: An iterative algorithm for sparse
//! least-squares problems", SIAM J. Sci. Comput. 33(5), 2011) runs the Golub-Kahan
//! bidiagonalisation of `A` started from `b` and, at step `k`, picks `x_k` in the Krylov
//! subspace `K_k(A^T A, A^T b)` that minimises `||A^T r_k||` (`r_k = b - A x_k`; with damping,
//! of the augmented system). Two plane rotations per step turn the lower bidiagonal `B_k`
//! into the upper bidiagonal `R_k` and `R_k^T` into `Rbar_k` (the paper's `Q_k` and
//! `Qbar_k`; a third, `Qhat_k`, folds in `damp`), so `x_k` is updated with short recurrences.
//! The loop below uses the paper's names (`alphabar`, `rhobar`, `zetabar`, `betadd` for
//! beta-double-dot, ...).
//!
//! With an initial guess `x0` the same iteration solves for the correction on `b - A x0`
//! and accumulates it into `x = x0 + ...` (SciPy's warm start).
//!
//! # Cost
//!
//! Per iteration: one product `A v` and one `A^T u` (through [`HostLinearOperator`]), plus
//! O(m + n) vector work (about `5m + 14n` flops: the bidiagonalisation updates and norms, the
//! `h`, `hbar`, `x` updates and `||x||`) and O(1) scalar recurrences. Memory: `u` and a
//! workspace for `A v` (length m); `v`, `h`, `hbar`, `x` and a workspace for `A^T u` (length n).
//!
//! # SciPy's contract, reproduced
//!
//! * Defaults ([`LsmrOptions::default`]): `damp = 0`, `atol = btol = 1e-6`, `conlim = 1e8`,
//!   `maxiter = min(m, n)`, no `x0`, no output.
//! * Estimates returned in [`LsmrResult`], all from the recurrences (never recomputed from
//!   `x`, except `normx = ||x||`): `normr` estimates `||[b; 0] - [A; damp I] x||` (which is
//!   `||b - A x||` when `damp == 0`), `normar` estimates `||A^T r - damp^2 x||` (`|zetabar|`),
//!   `norma` is the Frobenius norm of the bidiagonal `B_k` so far (a lower bound on
//!   `||A||_F`, not including `damp`), `conda` is the ratio of the largest to the smallest of
//!   the diagonal elements of `Rbar` seen so far (an estimate of `cond(A)` from below; with
//!   damping, of `cond([A; damp I])`).
//! * Stopping, checked after every iteration with `test1 = normr / ||b||`,
//!   `test2 = normar / (norma * normr)` (infinite when the product is 0), `test3 = 1 / conda`,
//!   `t1 = test1 / (1 + norma * normx / ||b||)` and
//!   `rtol = btol + atol * norma * normx / ||b||`: `istop` is 7 when `itn >= maxiter`, then
//!   overridden in this order by 6 (`1 + test3 <= 1`), 5 (`1 + test2 <= 1`),
//!   4 (`1 + t1 <= 1`), 3 (`test3 <= 1 / conlim`; with `conlim == 0` the bound is 0, which
//!   only an infinite `conda` reaches),
//!   2 (`test2 <= atol`), 1 (`test1 <= rtol`); the last test that holds wins, so the user's
//!   tolerances take precedence over the machine-precision ones. The loop ends when `istop > 0`.
//!   [`istop_reason`] says each code in words.
//! * Early exits before the first iteration, with `itn = 0` and `istop = 0`:
//!   `||A^T r0|| = alpha * beta == 0` (the start `x = x0`, or `x = 0`, is already a solution:
//!   `b - A x0 == 0`, or `A^T (b - A x0) == 0`), and otherwise `||b|| == 0` (then `x = 0`).
//!
//! Quirks of SciPy that are kept on purpose, so that results compare one to one:
//!
//! * The early exits report `normx = 0`, `conda = 1` and `norma = alpha` even when `x0 != 0`;
//!   the `||b|| == 0` exit returns `x = 0` with `normr = ||b - A x0||` of the *start*.
//! * `maxiter = Some(0)` runs no iteration and returns `istop = 0` (the loop never sets it),
//!   with `x = x0` (or 0).
//! * When a bidiagonalisation step finds `beta == 0` (an invariant subspace), `v` and `alpha`
//!   keep their previous values, as in SciPy.
//!
//! Rounding: the scalar recurrences are evaluated in SciPy's order. The products are summed
//! by the operator (in stored order for [`CsrHost`](crate::sparse::CsrHost), as SciPy's CSR
//! products), and norms as a plain sequential sum of squares where NumPy calls BLAS `ddot`;
//! results therefore agree with SciPy to rounding on well-conditioned problems that converge
//! in few iterations, and drift further apart with the conditioning and with iterations run
//! after the Lanczos vectors lose orthogonality, as two SciPy runs with different BLAS
//! products do (measured per case in `lsmr_tests.rs`).

//!
//! # Beyond SciPy
//!
//! * The damp list, [`lsmr_host_damps`]: `k` damping factors in one run sharing the
//!   bidiagonalisation; each result is bit for bit the solve with that damp alone.
//! * Many right-hand sides, [`lsmr_host_many`]: `k` columns of `b`, each its own solve (the
//!   reference of the GPU's `lsmr_many`, which shares the products between the columns).
//! * Column scaling, [`LsmrOptions::scale_columns`]: LSMR on `A D` with
//!   `D = diag(1 / ||A_j||)`, `x = D y` returned; the estimates refer to `(A D, y)` (the
//!   option's docs say which is which).

use super::operator::HostLinearOperator;
use crate::error::{Error, Result};

/// The options of [`lsmr_host`], with SciPy's names, meanings and defaults.
#[derive(Clone, Debug)]
pub struct LsmrOptions {
    /// Damping (Tikhonov) factor: solve `min ||[b; 0] - [A; damp I] x||`. Default 0.
    pub damp: f64,
    /// Relative error expected in `A` (stopping tolerance; see the module docs). Default 1e-6.
    pub atol: f64,
    /// Relative error expected in `b` (stopping tolerance; see the module docs). Default 1e-6.
    pub btol: f64,
    /// Stop when the estimate of `cond(A)` exceeds this; 0 means no limit. Default 1e8.
    pub conlim: f64,
    /// The most iterations; `None` means `min(m, n)`, as SciPy.
    pub maxiter: Option<usize>,
    /// The initial guess (length `n`); `None` means zeros.
    pub x0: Option<Vec<f64>>,
    /// Print a progress line per (selected) iteration and a summary to stderr.
    pub show: bool,
    /// Column scaling (diagonal preconditioning; not in SciPy). Default false. When on, the
    /// solver runs on `A D` with `D = diag(1 / ||A_j||)` (a zero column keeps the factor 1),
    /// solving `min ||[b; 0] - [A D; damp I] y||` from `y0 = D^-1 x0`, and returns
    /// `x = D y` in the original variables. The damping then applies to `y` (`damp ||D^-1 x||`).
    /// The estimates refer to the scaled problem: `normr` is `||[b; 0] - [A D; damp I] y||`
    /// (with `damp = 0` that is `||b - A x||`, the same in both), `normar` is
    /// `||D A^T r - damp^2 y||`, `norma` and `conda` estimate `||A D||_F` and `cond(A D)`, and
    /// `normx` is `||y||`; the stopping tests are applied to these. Needs an operator that
    /// knows its column norms (`column_norms`: CSR and dense matrices do; closures only if
    /// given them).
    pub scale_columns: bool,
}

impl Default for LsmrOptions {
    /// SciPy's defaults: `damp = 0`, `atol = btol = 1e-6`, `conlim = 1e8`,
    /// `maxiter = min(m, n)`, `x0 = 0`, `show = false`; and no column scaling.
    fn default() -> Self {
        LsmrOptions {
            damp: 0.0,
            atol: 1e-6,
            btol: 1e-6,
            conlim: 1e8,
            maxiter: None,
            x0: None,
            show: false,
            scale_columns: false,
        }
    }
}

/// What [`lsmr_host`] returns: SciPy's eight return values, in SciPy's order.
#[derive(Clone, Debug, PartialEq)]
pub struct LsmrResult {
    /// The solution (length `n`).
    pub x: Vec<f64>,
    /// Why the iteration stopped, 0..=7 with SciPy's meanings ([`istop_reason`]).
    pub istop: u32,
    /// Iterations run.
    pub itn: usize,
    /// Estimate of `||b - A x||` (with damping, of the augmented residual).
    pub normr: f64,
    /// Estimate of `||A^T (b - A x)||` (with damping, `||A^T r - damp^2 x||`).
    pub normar: f64,
    /// Estimate of the Frobenius norm of `A` (from below).
    pub norma: f64,
    /// Estimate of the condition number of `A` (from below).
    pub conda: f64,
    /// `||x||`.
    pub normx: f64,
}

/// SciPy's meaning of each `istop` code, in words.
pub fn istop_reason(istop: u32) -> &'static str {
    match istop {
        0 => "x = 0 (or x = x0 when an initial guess was given) is already an exact solution",
        1 => "A x - b is small enough for the tolerances atol and btol",
        2 => "x solves the least-squares problem well enough for the tolerance atol",
        3 => "the estimate of cond(A) (with damping, of [A; damp I]) exceeded conlim",
        4 => "A x - b is as small as this machine's precision allows (istop 1 with atol = btol = eps)",
        5 => "x solves the least-squares problem to this machine's precision (istop 2 with atol = eps)",
        6 => "cond(A) seems too large for this machine (istop 3 with conlim = 1/eps)",
        7 => "the iteration limit maxiter was reached before any other stopping test held",
        _ => "unknown istop code (LSMR uses 0 to 7)",
    }
}

/// Solves `min ||[b; 0] - [A; damp I] x||_2` by LSMR with SciPy's semantics (module docs).
///
/// Errors (nothing is computed): `b.len() != m`; `x0` of length other than `n`; NaN or
/// infinity in `b` or `x0`; `damp`, `atol`, `btol` or `conlim` negative, NaN or infinite;
/// an operator whose own [`check`](HostLinearOperator::check) fails.
pub fn lsmr_host(a: &dyn HostLinearOperator, b: &[f64], opts: &LsmrOptions) -> Result<LsmrResult> {
    validate(a, b, opts)?;
    let mut results = solve(a, b, &[opts.damp], opts)?;
    results
        .pop()
        .ok_or_else(|| Error::Unsupported("lsmr_host: the solve returned no result".into()))
}

/// Solves `min ||[b; 0] - [A; damp_j I] x_j||_2` for every `damp_j` of `damps` in one run
/// (the "damp list"), returning one result per damp, in the order of `damps`.
///
/// The Golub-Kahan bidiagonalisation (`u`, `v`, `alpha`, `beta` and both products per
/// iteration) does not depend on `damp`, so the `k` solves share it: one pair of products per
/// iteration for all of them. Each damp keeps its own rotations, `h`, `hbar`, `x`, estimates
/// and stopping state; the shared loop runs until every damp has stopped (or `maxiter`), and
/// a damp that stopped keeps the iterate and estimates of the iteration at which its rules
/// first held. Each result is therefore bit for bit what [`lsmr_host`] returns with
/// `damp = damps[j]` and the other options unchanged.
///
/// `opts.damp` must be left at 0 (each solve uses its entry of `damps`); the other options
/// apply to every damp. With `opts.show`, one damp prints SciPy's progress lines; several
/// print a line when each damp stops and a summary per damp.
///
/// Errors (nothing is computed): those of [`lsmr_host`]; `damps` empty, or with an element
/// negative, NaN or infinite; `opts.damp != 0`.
pub fn lsmr_host_damps(
    a: &dyn HostLinearOperator,
    b: &[f64],
    damps: &[f64],
    opts: &LsmrOptions,
) -> Result<Vec<LsmrResult>> {
    validate(a, b, opts)?;
    check_damps(damps, opts)?;
    solve(a, b, damps, opts)
}

/// Many right-hand sides on the host: solves `min ||[b_j; 0] - [A; damp I] x_j||_2` for every
/// column `b_j` of `b` (`m x k`, column-major: column `j` at `j * m`) from `x0_j` (column `j`
/// of `x0`, `n x k` column-major) or zeros, one result per column in order. It is the CPU
/// reference of the GPU's [`lsmr_many`](super::lsmr_many): each column is literally the
/// [`lsmr_host`] solve of that column with `opts.x0 = x0_j` (bit for bit), so zero columns give
/// SciPy's `b = 0` answer (`istop` 0, `x` = 0) and every column stops by its own rules.
///
/// Errors (nothing is computed): those of [`lsmr_host`] for any column; `k` of 0; `b` of other
/// than `m * k` elements; `x0` of other than `n * k`; `opts.x0` set (give the guesses as `x0`).
pub fn lsmr_host_many(
    a: &dyn HostLinearOperator,
    b: &[f64],
    k: usize,
    x0: Option<&[f64]>,
    opts: &LsmrOptions,
) -> Result<Vec<LsmrResult>> {
    a.check()?;
    let (m, n) = a.shape();
    super::lsmr_device::check_many_problem(m, n, b.len(), k, x0, opts)?;
    super::lsmr_device::check_finite_columns("b", b, m)?;
    (0..k)
        .map(|j| {
            let col = LsmrOptions {
                x0: x0.map(|x0| x0[j * n..(j + 1) * n].to_vec()),
                ..opts.clone()
            };
            if opts.show && k > 1 {
                eprintln!("lsmr: right-hand side {j} of {k}");
            }
            lsmr_host(a, &b[j * m..(j + 1) * m], &col)
        })
        .collect()
}

/// The checks of a damp list: not empty, every element finite and `>= 0`, and `opts.damp`
/// left at 0 (so that a damp given in two places is not silently ignored in one).
pub(crate) fn check_damps(damps: &[f64], opts: &LsmrOptions) -> Result<()> {
    if damps.is_empty() {
        return Err(Error::invalid("damps", "is empty; give at least one damp value"));
    }
    if let Some(j) = damps.iter().position(|d| !(d.is_finite() && *d >= 0.0)) {
        return Err(Error::invalid(
            "damps",
            format!("element {j} is {}; every damp must be finite and >= 0", damps[j]),
        ));
    }
    if opts.damp != 0.0 {
        return Err(Error::invalid(
            "damp",
            format!(
                "is {} while a damp list is given; leave opts.damp at 0 (each solve uses its entry of damps)",
                opts.damp
            ),
        ));
    }
    Ok(())
}

/// The per-damp half of LSMR: everything after the bidiagonalisation (the rotations, the
/// `h`, `hbar`, `x` updates, the estimates and the stopping test), for one damping factor:
/// the scalar recurrences ([`Recurrence`], shared with the distributed solver) and the
/// vectors they update.
struct DampSolve {
    rec: Recurrence,
    x: Vec<f64>,
    h: Vec<f64>,
    hbar: Vec<f64>,
}

/// The scalar state of one damp's LSMR after the bidiagonalisation: the rotations, the
/// estimates and the stopping test, in f64, without the vectors. One iteration is
/// [`recur`](Self::recur) (the scalars, which return the factors of the vector update), the
/// caller's update of `hbar`, `x` and `h` with [`StepFactors`], then [`test`](Self::test) with
/// the new `||x||`. [`lsmr_host`] and the distributed solver (`crate::distributed`) both run it.
#[derive(Clone, Debug)]
pub(crate) struct Recurrence {
    pub(crate) damp: f64,
    // The rotations' state.
    zetabar: f64,
    alphabar: f64,
    rho: f64,
    rhobar: f64,
    cbar: f64,
    sbar: f64,
    // The state of the ||r|| estimate (paper section 3.3): betadd = beta-double-dot,
    // betad = beta-dot, rhodold = rho-dot_{k-1}, tautildeold = tau-tilde_{k-1}.
    betadd: f64,
    betad: f64,
    rhodold: f64,
    tautildeold: f64,
    thetatilde: f64,
    zeta: f64,
    d: f64,
    // The state of the cond(A) estimate.
    maxrbar: f64,
    minrbar: f64,
    // The results so far.
    pub(crate) istop: u32,
    pub(crate) itn: usize,
    pub(crate) normr: f64,
    pub(crate) normar: f64,
    pub(crate) norma: f64,
    pub(crate) conda: f64,
    pub(crate) normx: f64,
}

/// The factors of one iteration's vector update, in this order (each vector read before it
/// is overwritten): `hbar = hbar * hbar_factor + h`, `x = x + x_step * hbar` (the new
/// `hbar`), `h = h * h_factor + v` (the new, normalised `v = v_{k+1}`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct StepFactors {
    pub(crate) hbar_factor: f64,
    pub(crate) x_step: f64,
    pub(crate) h_factor: f64,
}

impl StepFactors {
    /// The update on host vectors, element by element in that order.
    pub(crate) fn apply(&self, hbar: &mut [f64], x: &mut [f64], h: &mut [f64], v: &[f64]) {
        hbar.iter_mut()
            .zip(h.iter())
            .for_each(|(hb, &hi)| *hb = *hb * self.hbar_factor + hi);
        x.iter_mut()
            .zip(hbar.iter())
            .for_each(|(xi, &hb)| *xi += self.x_step * hb);
        h.iter_mut().zip(v).for_each(|(hi, &vi)| *hi = *hi * self.h_factor + vi);
    }
}

impl DampSolve {
    /// The state before the first iteration, from `x0` (or 0), `v_1`, `alpha_1`, `beta_1`.
    fn start(damp: f64, x: &[f64], v: &[f64], alpha: f64, beta: f64) -> DampSolve {
        DampSolve {
            rec: Recurrence::start(damp, alpha, beta),
            x: x.to_vec(),
            h: v.to_vec(),
            hbar: vec![0.0; v.len()],
        }
    }

    /// Iteration `itn` for this damp, given the new `alpha = alpha_{k+1}`,
    /// `beta = beta_{k+1}`, `v = v_{k+1}` and the `||B_k||_F` estimate `norma` of the shared
    /// bidiagonalisation; ends with SciPy's stopping test (sets `istop`). Returns the tests
    /// (for the progress lines).
    fn step(&mut self, itn: usize, alpha: f64, beta: f64, v: &[f64], norma: f64, rule: &StopRule) -> StopTests {
        let f = self.rec.recur(itn, alpha, beta, norma);
        f.apply(&mut self.hbar, &mut self.x, &mut self.h, v);
        let normx = norm2(&self.x);
        self.rec.test(normx, rule)
    }

    fn result(self) -> LsmrResult {
        self.rec.result(self.x)
    }
}

impl Recurrence {
    /// The state before the first iteration, from `alpha_1` and `beta_1` (`||A^T r_0||`,
    /// `||r_0||`): SciPy's initial values, which are also the early exits' estimates.
    pub(crate) fn start(damp: f64, alpha: f64, beta: f64) -> Recurrence {
        Recurrence {
            damp,
            zetabar: alpha * beta,
            alphabar: alpha,
            rho: 1.0,
            rhobar: 1.0,
            cbar: 1.0,
            sbar: 0.0,
            betadd: beta,
            betad: 0.0,
            rhodold: 1.0,
            tautildeold: 0.0,
            thetatilde: 0.0,
            zeta: 0.0,
            d: 0.0,
            maxrbar: 0.0,
            minrbar: 1e100,
            istop: 0,
            itn: 0,
            normr: beta,
            normar: alpha * beta,
            norma: (alpha * alpha).sqrt(),
            conda: 1.0,
            normx: 0.0,
        }
    }

    /// The scalars of iteration `itn`, given the new `alpha = alpha_{k+1}`,
    /// `beta = beta_{k+1}` and the `||B_k||_F` estimate `norma` of the shared
    /// bidiagonalisation: the rotations, the estimates of `||r||`, `||A||` and `cond(A)`.
    /// Returns the factors of the vector update, which the caller applies before
    /// [`test`](Self::test). (None of the scalars depends on the vectors, so the order of
    /// SciPy's loop, which updates the vectors between the rotations and the estimates, gives
    /// the same values.)
    pub(crate) fn recur(&mut self, itn: usize, alpha: f64, beta: f64, norma: f64) -> StepFactors {
        self.itn = itn;
        // Qhat_k folds damp into alphabar_k: alphahat_k = ||(alphabar_k, damp)||.
        let hat = Rotation::of(self.alphabar, self.damp);
        // Q_k turns B_k into R_k: rho_k = ||(alphahat_k, beta_{k+1})||.
        let rhoold = self.rho;
        let q = Rotation::of(hat.r, beta);
        self.rho = q.r;
        let rho = self.rho;
        let thetanew = q.s * alpha;
        self.alphabar = q.c * alpha;
        // Qbar_k turns R_k^T into Rbar_k.
        let rhobarold = self.rhobar;
        let zetaold = self.zeta;
        let thetabar = self.sbar * rho;
        let rhotemp = self.cbar * rho;
        let qbar = Rotation::of(self.cbar * rho, thetanew);
        (self.cbar, self.sbar, self.rhobar) = (qbar.c, qbar.s, qbar.r);
        let rhobar = self.rhobar;
        self.zeta = self.cbar * self.zetabar;
        let zeta = self.zeta;
        self.zetabar *= -self.sbar;

        // The factors of the hbar, x and h updates.
        let factors = StepFactors {
            hbar_factor: -(thetabar * rho / (rhoold * rhobarold)),
            x_step: zeta / (rho * rhobar),
            h_factor: -(thetanew / rho),
        };

        // Estimate ||r||: apply Qhat_k, then Q_k, to (betadd, 0) ...
        let betaacute = hat.c * self.betadd;
        let betacheck = -hat.s * self.betadd;
        let betahat = q.c * betaacute;
        self.betadd = -q.s * betaacute;
        // ... then Qtilde_{k-1} (the identity at k = 1: rhodold = 1, thetabar = 0).
        let thetatildeold = self.thetatilde;
        let qtilde = Rotation::of(self.rhodold, thetabar);
        self.thetatilde = qtilde.s * rhobar;
        self.rhodold = qtilde.c * rhobar;
        self.betad = -qtilde.s * self.betad + qtilde.c * betahat;
        // Forward substitution for tau-tilde, then the norm of the residual's pieces.
        self.tautildeold = (zetaold - thetatildeold * self.tautildeold) / qtilde.r;
        let taud = (zeta - self.thetatilde * self.tautildeold) / self.rhodold;
        self.d += betacheck * betacheck;
        let gap = self.betad - taud;
        self.normr = (self.d + gap * gap + self.betadd * self.betadd).sqrt();

        // ||A||_F from ||B_k||_F: shared (it does not depend on damp).
        self.norma = norma;

        // Estimate cond(A) from the diagonal of Rbar.
        self.maxrbar = py_max(self.maxrbar, rhobarold);
        if itn > 1 {
            self.minrbar = py_min(self.minrbar, rhobarold);
        }
        self.conda = py_max(self.maxrbar, rhotemp) / py_min(self.minrbar, rhotemp);
        factors
    }

    /// The stopping tests of the iteration that [`recur`](Self::recur) began, given `||x||`
    /// after the vector update: sets `normar`, `normx` and `istop` (0 = go on).
    pub(crate) fn test(&mut self, normx: f64, rule: &StopRule) -> StopTests {
        self.normar = self.zetabar.abs();
        self.normx = normx;
        let tests = rule.tests(self.normr, self.normar, self.norma, self.conda, self.normx);
        self.istop = stop_code(&tests, self.itn >= rule.maxiter, rule.atol, rule.ctol);
        tests
    }

    /// The result with the solution `x`.
    pub(crate) fn result(&self, x: Vec<f64>) -> LsmrResult {
        LsmrResult {
            x,
            istop: self.istop,
            itn: self.itn,
            normr: self.normr,
            normar: self.normar,
            norma: self.norma,
            conda: self.conda,
            normx: self.normx,
        }
    }
}

/// The constants of SciPy's stopping rule for one solve.
pub(crate) struct StopRule {
    pub(crate) normb: f64,
    pub(crate) atol: f64,
    pub(crate) btol: f64,
    pub(crate) ctol: f64,
    pub(crate) maxiter: usize,
}

impl StopRule {
    /// The rule of `opts` for a right-hand side of norm `normb` and `maxiter` iterations
    /// (`conlim == 0`: no limit, `ctol = 0`).
    pub(crate) fn new(normb: f64, opts: &LsmrOptions, maxiter: usize) -> StopRule {
        StopRule {
            normb,
            atol: opts.atol,
            btol: opts.btol,
            ctol: if opts.conlim > 0.0 { 1.0 / opts.conlim } else { 0.0 },
            maxiter,
        }
    }
    fn tests(&self, normr: f64, normar: f64, norma: f64, conda: f64, normx: f64) -> StopTests {
        let normb = self.normb;
        let test1 = normr / normb;
        let test2 = if norma * normr != 0.0 {
            normar / (norma * normr)
        } else {
            f64::INFINITY
        };
        let test3 = 1.0 / conda;
        let t1 = test1 / (1.0 + norma * normx / normb);
        let rtol = self.btol + self.atol * norma * normx / normb;
        StopTests {
            test1,
            test2,
            test3,
            t1,
            rtol,
        }
    }
}

/// LSMR for each damp of `damps` (validated) sharing one bidiagonalisation, with column
/// scaling when the options ask for it.
fn solve(a: &dyn HostLinearOperator, b: &[f64], damps: &[f64], opts: &LsmrOptions) -> Result<Vec<LsmrResult>> {
    if !opts.scale_columns {
        return solve_unscaled(a, b, damps, opts.x0.as_deref(), opts);
    }
    // Column scaling: solve for y on A D from y0 = D^-1 x0, return x = D y.
    let scaled = ColumnScaled {
        a,
        d: column_scale(a.column_norms().as_deref(), a.shape().1)?,
    };
    let y0: Option<Vec<f64>> = opts
        .x0
        .as_ref()
        .map(|x0| x0.iter().zip(&scaled.d).map(|(x, d)| x / d).collect());
    let mut results = solve_unscaled(&scaled, b, damps, y0.as_deref(), opts)?;
    for r in &mut results {
        r.x.iter_mut().zip(&scaled.d).for_each(|(x, d)| *x *= d);
    }
    Ok(results)
}

/// The factors of column scaling from the column norms: `1 / ||A_j||`, or 1 for a zero column.
/// Errors: no norms (the operator cannot give them), a wrong count, a negative or non-finite
/// norm.
pub(crate) fn column_scale(norms: Option<&[f64]>, n: usize) -> Result<Vec<f64>> {
    let norms = norms.ok_or_else(|| {
        Error::Unsupported(
            "scale_columns needs the column norms of A; this operator does not give them (give a \
             closure operator its norms with with_column_norms)"
                .into(),
        )
    })?;
    if norms.len() != n {
        return Err(Error::invalid(
            "column_norms",
            format!("has {} elements, A has n = {n} columns", norms.len()),
        ));
    }
    if let Some(j) = norms.iter().position(|v| !(v.is_finite() && *v >= 0.0)) {
        return Err(Error::invalid(
            "column_norms",
            format!("element {j} is {}; every norm must be finite and >= 0", norms[j]),
        ));
    }
    Ok(norms.iter().map(|&v| if v > 0.0 { 1.0 / v } else { 1.0 }).collect())
}

/// `A D` for the diagonal `D = diag(d)`: `A (d .* x)` and `d .* (A^T x)`.
struct ColumnScaled<'a> {
    a: &'a dyn HostLinearOperator,
    d: Vec<f64>,
}

impl HostLinearOperator for ColumnScaled<'_> {
    fn shape(&self) -> (usize, usize) {
        self.a.shape()
    }
    fn apply(&self, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
        let dx: Vec<f64> = x.iter().zip(&self.d).map(|(x, d)| d * x).collect();
        self.a.apply(alpha, &dx, beta, y);
    }
    fn apply_transposed(&self, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
        let mut t = vec![0.0; y.len()];
        self.a.apply_transposed(1.0, x, 0.0, &mut t);
        for ((yi, ti), d) in y.iter_mut().zip(&t).zip(&self.d) {
            let v = alpha * (d * ti);
            *yi = if beta == 0.0 { v } else { v + beta * *yi };
        }
    }
}

/// LSMR for each damp of `damps` sharing one bidiagonalisation, on `a` as given, from `x0`.
fn solve_unscaled(
    a: &dyn HostLinearOperator,
    b: &[f64],
    damps: &[f64],
    x0: Option<&[f64]>,
    opts: &LsmrOptions,
) -> Result<Vec<LsmrResult>> {
    let (m, n) = a.shape();
    let maxiter = opts.maxiter.unwrap_or(m.min(n));
    let mut progress = opts.show.then(|| Progress::start(m, n, opts, damps, maxiter));

    // beta_1 u_1 = b - A x0, alpha_1 v_1 = A^T u_1.
    let normb = norm2(b);
    let mut av = vec![0.0; m]; // workspace for A v
    let mut atu = vec![0.0; n]; // workspace for A^T u
    let mut u = b.to_vec();
    let (x, mut beta) = match x0 {
        None => (vec![0.0; n], normb),
        Some(x0) => {
            a.apply(1.0, x0, 0.0, &mut av);
            u.iter_mut().zip(&av).for_each(|(ui, &p)| *ui -= p);
            (x0.to_vec(), norm2(&u))
        }
    };
    let mut v = vec![0.0; n];
    let mut alpha = 0.0;
    if beta > 0.0 {
        scale(&mut u, 1.0 / beta);
        a.apply_transposed(1.0, &u, 0.0, &mut v);
        alpha = norm2(&v);
    }
    if alpha > 0.0 {
        scale(&mut v, 1.0 / alpha);
    }

    // The per-damp states, and the shared ||A|| estimate.
    let mut solves: Vec<DampSolve> = damps
        .iter()
        .map(|&damp| DampSolve::start(damp, &x, &v, alpha, beta))
        .collect();
    let mut norma2 = alpha * alpha;
    let rule = StopRule::new(normb, opts, maxiter);

    // Early exits (SciPy checks ||A^T r0|| first: with b = A x0 != 0 it returns x0).
    if alpha * beta == 0.0 {
        return Ok(finish(&progress, solves));
    }
    if normb == 0.0 {
        solves.iter_mut().for_each(|s| s.x.fill(0.0));
        return Ok(finish(&progress, solves));
    }
    if let Some(p) = &progress {
        p.first_line(x.first().copied().unwrap_or(0.0), beta, alpha * beta, alpha / beta);
    }

    let mut itn = 0usize;
    while itn < maxiter {
        itn += 1;

        // Continue the bidiagonalisation: beta u = A v - alpha u, alpha v = A^T u - beta v.
        // When beta == 0, u (now 0) is not normalised and v, alpha keep their values.
        a.apply(1.0, &v, 0.0, &mut av);
        negate_scale_add(&mut u, alpha, &av);
        beta = norm2(&u);
        if beta > 0.0 {
            scale(&mut u, 1.0 / beta);
            a.apply_transposed(1.0, &u, 0.0, &mut atu);
            negate_scale_add(&mut v, beta, &atu);
            alpha = norm2(&v);
            if alpha > 0.0 {
                scale(&mut v, 1.0 / alpha);
            }
        }
        // Here beta = beta_{k+1}, alpha = alpha_{k+1}.

        // Estimate ||A||_F from ||B_k||_F (alpha_{k+1} enters at the next iteration).
        norma2 += beta * beta;
        let norma = norma2.sqrt();
        norma2 += alpha * alpha;

        // Each damp still running takes its step.
        let several = solves.len() > 1;
        for (j, s) in solves.iter_mut().enumerate().filter(|(_, s)| s.rec.istop == 0) {
            let t = s.step(itn, alpha, beta, &v, norma, &rule);
            if let Some(p) = &mut progress {
                if several {
                    if s.rec.istop != 0 {
                        p.damp_stopped(j, s.rec.damp, itn, s.rec.istop);
                    }
                    continue;
                }
                let near = t.test3 <= 1.1 * rule.ctol || t.test2 <= 1.1 * rule.atol || t.test1 <= 1.1 * t.rtol;
                if n <= 40 || itn <= 10 || itn + 10 >= maxiter || itn % 10 == 0 || near || s.rec.istop != 0 {
                    p.line(
                        itn,
                        s.x.first().copied().unwrap_or(0.0),
                        s.rec.normr,
                        s.rec.normar,
                        t.test1,
                        t.test2,
                        s.rec.norma,
                        s.rec.conda,
                    );
                }
            }
        }
        if solves.iter().all(|s| s.rec.istop > 0) {
            break;
        }
    }

    Ok(finish(&progress, solves))
}

/// The results, after printing the summaries when `show` is on.
fn finish(progress: &Option<Progress>, solves: Vec<DampSolve>) -> Vec<LsmrResult> {
    let several = solves.len() > 1;
    solves
        .into_iter()
        .enumerate()
        .map(|(j, s)| {
            if let Some(p) = progress {
                if several {
                    eprintln!("lsmr: damp[{j}] = {:.6e}", s.rec.damp);
                }
                let r = &s.rec;
                p.finish(r.istop, r.itn, r.normr, r.normar, r.norma, r.conda, r.normx);
            }
            s.result()
        })
        .collect()
}

/// The quantities SciPy's stopping rule looks at after an iteration (module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct StopTests {
    /// `normr / ||b||`.
    pub test1: f64,
    /// `normar / (norma * normr)`, infinite when the product is 0.
    pub test2: f64,
    /// `1 / conda`.
    pub test3: f64,
    /// `test1 / (1 + norma * normx / ||b||)`.
    pub t1: f64,
    /// `btol + atol * norma * normx / ||b||`.
    pub rtol: f64,
}

/// SciPy's `istop` after an iteration (0 = go on). The machine-precision tests come first
/// (they stand in for `atol = btol = eps`, `conlim = 1/eps` when the user set 0), then the
/// user's tolerances, which override them; the last test that holds wins:
/// 7 maxiter < 6 cond for eps < 5 LS for eps < 4 Ax=b for eps < 3 conlim < 2 LS < 1 Ax=b.
pub(crate) fn stop_code(t: &StopTests, at_maxiter: bool, atol: f64, ctol: f64) -> u32 {
    let mut istop = 0;
    if at_maxiter {
        istop = 7;
    }
    if 1.0 + t.test3 <= 1.0 {
        istop = 6;
    }
    if 1.0 + t.test2 <= 1.0 {
        istop = 5;
    }
    if 1.0 + t.t1 <= 1.0 {
        istop = 4;
    }
    if t.test3 <= ctol {
        istop = 3;
    }
    if t.test2 <= atol {
        istop = 2;
    }
    if t.test1 <= t.rtol {
        istop = 1;
    }
    istop
}

/// The checks of [`lsmr_host`]'s arguments, all before any work.
fn validate(a: &dyn HostLinearOperator, b: &[f64], opts: &LsmrOptions) -> Result<()> {
    a.check()?;
    let (m, n) = a.shape();
    check_problem(m, n, b.len(), opts)?;
    check_finite("b", b)
}

/// The checks of a problem's shape and options that both solvers make before any work: `b`
/// has `m` elements, `x0` (if any) `n` finite ones, and `damp`, `atol`, `btol`, `conlim` are
/// finite and `>= 0`. (Each solver checks b's values itself: the GPU's are on the device.)
pub(crate) fn check_problem(m: usize, n: usize, b_len: usize, opts: &LsmrOptions) -> Result<()> {
    if b_len != m {
        return Err(Error::invalid(
            "b",
            format!("has {b_len} elements, A is {m} x {n} so b needs m = {m}"),
        ));
    }
    if let Some(x0) = &opts.x0 {
        if x0.len() != n {
            return Err(Error::invalid(
                "x0",
                format!("has {} elements, A is {m} x {n} so x0 needs n = {n}", x0.len()),
            ));
        }
        check_finite("x0", x0)?;
    }
    for (arg, value) in [
        ("damp", opts.damp),
        ("atol", opts.atol),
        ("btol", opts.btol),
        ("conlim", opts.conlim),
    ] {
        if !(value.is_finite() && value >= 0.0) {
            let hint = if arg == "conlim" { " (0 means no limit)" } else { "" };
            return Err(Error::invalid(
                arg,
                format!("is {value}, must be finite and >= 0{hint}"),
            ));
        }
    }
    Ok(())
}

/// An error naming the first NaN or infinite element of `v`, if any.
fn check_finite(arg: &'static str, v: &[f64]) -> Result<()> {
    match v.iter().position(|e| !e.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::invalid(
            arg,
            format!("element {i} is {}; every element must be finite", v[i]),
        )),
    }
}

/// A plane (Givens) rotation `[c s; -s c]` with `c a + s b = r`, `-s a + c b = 0`, `r >= 0`
/// computed stably: Choi's SymOrtho (S.-C. Choi, "Iterative methods for singular linear
/// equations and least-squares problems", PhD thesis, Stanford 2006), which the LSMR paper
/// uses for every rotation. `r = ||(a, b)||` without overflow; `c`, `s` carry the signs of
/// `a`, `b`. If `b == 0`: `(sign a, 0, |a|)`; if `a == 0`: `(0, sign b, |b|)`, with
/// `sign 0 = 0`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Rotation {
    c: f64,
    s: f64,
    r: f64,
}

impl Rotation {
    fn of(a: f64, b: f64) -> Rotation {
        if b == 0.0 {
            Rotation {
                c: sign(a),
                s: 0.0,
                r: a.abs(),
            }
        } else if a == 0.0 {
            Rotation {
                c: 0.0,
                s: sign(b),
                r: b.abs(),
            }
        } else if b.abs() > a.abs() {
            // |tau| < 1: divide by the larger one.
            let tau = a / b;
            let s = sign(b) / (1.0 + tau * tau).sqrt();
            let c = s * tau;
            Rotation { c, s, r: b / s }
        } else {
            let tau = b / a;
            let c = sign(a) / (1.0 + tau * tau).sqrt();
            let s = c * tau;
            Rotation { c, s, r: a / c }
        }
    }
}

/// The sign of `v` as NumPy's `sign`: -1, 0 or 1 (0 for +-0), NaN for NaN.
fn sign(v: f64) -> f64 {
    if v > 0.0 {
        1.0
    } else if v < 0.0 {
        -1.0
    } else if v == 0.0 {
        0.0
    } else {
        f64::NAN
    }
}

/// Python's `max(a, b)`: `b` only if `b > a` (so a NaN `b` is ignored, a NaN `a` sticks).
fn py_max(a: f64, b: f64) -> f64 {
    if b > a {
        b
    } else {
        a
    }
}

/// Python's `min(a, b)`: `b` only if `b < a`.
fn py_min(a: f64, b: f64) -> f64 {
    if b < a {
        b
    } else {
        a
    }
}

fn min_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// `||v||_2` as `sqrt(sum v_i^2)`, summed in order (NumPy's `norm` is `sqrt(dot(v, v))`).
pub(crate) fn norm2(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |acc, &e| acc + e * e).sqrt()
}

/// `v *= factor` (SciPy scales by the reciprocal of a norm rather than dividing).
fn scale(v: &mut [f64], factor: f64) {
    v.iter_mut().for_each(|e| *e *= factor);
}

/// The `show` output on stderr: a header with the problem and options, one line per selected
/// iteration (itn, x[0], the residual norms, the two stopping ratios, and the estimates), a
/// heading repeated every [`Progress::HEADING_EVERY`] lines, and a closing summary.
pub(crate) struct Progress {
    /// Iteration lines printed since the last heading.
    lines: usize,
}

impl Progress {
    const HEADING_EVERY: usize = 20;

    pub(crate) fn start(m: usize, n: usize, opts: &LsmrOptions, damps: &[f64], maxiter: usize) -> Progress {
        eprintln!("lsmr: least squares  min ||[b; 0] - [A; damp I] x||,  A is {m} x {n}");
        let damp = match damps {
            [one] => format!("{one:.6e}"),
            many => format!(
                "{} values from {:.3e} to {:.3e}",
                many.len(),
                min_of(many),
                max_of(many)
            ),
        };
        eprintln!(
            "lsmr: damp {damp}  atol {:.2e}  btol {:.2e}  conlim {:.2e}  maxiter {maxiter}  x0 {}{}",
            opts.atol,
            opts.btol,
            opts.conlim,
            if opts.x0.is_some() { "given" } else { "zero" },
            if opts.scale_columns {
                "  columns scaled (estimates of A D, y)"
            } else {
                ""
            }
        );
        Progress { lines: 0 }
    }

    fn heading() {
        eprintln!(
            "{:>7} {:>13} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9}",
            "itn", "x[0]", "||r||", "||A^T r||", "test1", "test2", "||A||", "cond(A)"
        );
    }

    /// The line before the first iteration: test1 = 1 and test2 = alpha / beta.
    pub(crate) fn first_line(&self, x0: f64, normr: f64, normar: f64, test2: f64) {
        Self::heading();
        eprintln!(
            "{:>7} {x0:>13.5e} {normr:>11.3e} {normar:>11.3e} {:>9.1e} {test2:>9.1e}",
            0, 1.0
        );
    }

    #[allow(clippy::too_many_arguments)] // one argument per printed column
    pub(crate) fn line(
        &mut self,
        itn: usize,
        x0: f64,
        normr: f64,
        normar: f64,
        test1: f64,
        test2: f64,
        norma: f64,
        conda: f64,
    ) {
        if self.lines >= Self::HEADING_EVERY {
            eprintln!();
            Self::heading();
            self.lines = 0;
        }
        self.lines += 1;
        eprintln!(
            "{itn:>7} {x0:>13.5e} {normr:>11.3e} {normar:>11.3e} {test1:>9.1e} {test2:>9.1e} {norma:>9.1e} {conda:>9.1e}"
        );
    }

    /// With a damp list: damp `j` stopped at `itn`.
    fn damp_stopped(&self, j: usize, damp: f64, itn: usize, istop: u32) {
        eprintln!("lsmr: damp[{j}] = {damp:.6e} stopped at itn {itn}, istop {istop}");
    }

    #[allow(clippy::too_many_arguments)] // one argument per result
    pub(crate) fn finish(&self, istop: u32, itn: usize, normr: f64, normar: f64, norma: f64, conda: f64, normx: f64) {
        eprintln!("lsmr: stopped, istop {istop}: {}", istop_reason(istop));
        eprintln!(
            "lsmr: itn {itn}  ||r|| {normr:.3e}  ||A^T r|| {normar:.3e}  ||A|| {norma:.3e}  cond(A) {conda:.3e}  ||x|| {normx:.3e}"
        );
    }
}

/// The argument checks both solvers make before any work (`b` of `m` elements, `x0` of `n`
/// finite ones, `damp`, `atol`, `btol`, `conlim` finite and `>= 0`), for bindings that
/// validate without a device (the Python package's `check_lsmr`).
pub fn validate_problem(m: usize, n: usize, b_len: usize, opts: &LsmrOptions) -> Result<()> {
    check_problem(m, n, b_len, opts)
}

/// `y = -s y + p` elementwise: the bidiagonalisation's `u = A v - alpha u` and
/// `v = A^T u - beta v` on the host.
pub(crate) fn negate_scale_add(y: &mut [f64], s: f64, p: &[f64]) {
    y.iter_mut().zip(p).for_each(|(yi, &pi)| *yi = *yi * -s + pi);
}
