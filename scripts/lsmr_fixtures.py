#!/usr/bin/env python3
"""Writes crates/tessera/src/linalg/testdata/lsmr_fixtures.json: SciPy's lsmr on small problems.

The Rust tests (crates/tessera/src/linalg/lsmr_tests.rs) rebuild every problem from the file,
solve it with `lsmr_host` and compare istop, itn, x and the five estimates with SciPy's.

Regenerate (only needed when a case is added or SciPy's behaviour is to be re-pinned):

    python3 -m venv /tmp/scipy-venv
    /tmp/scipy-venv/bin/pip install "scipy==1.17.*" numpy
    /tmp/scipy-venv/bin/python scripts/lsmr_fixtures.py

Exactness of the inputs. Floats are written with repr (shortest round-trip form) and the Rust
tests parse them with serde_json's `float_roundtrip` feature (correctly rounded), so every f64
comes back exactly. To prove it, each case carries `input_sha256`: the SHA-256 of the
little-endian bytes of the matrix values (in stored order), then b, then x0 (when given); the
Rust test recomputes it from the parsed numbers, so it solves bit for bit the problem SciPy
solved. Most inputs are also small dyadic rationals, exact in binary.

SciPy is called with the matrix as a `csr_array` (sorted columns, no duplicates), whose
products sum each row in stored order from 0, as tessera's `CsrHost` operator does, so the
remaining differences come from the norms (NumPy's BLAS `ddot` vs a sequential sum) and are at
the rounding level. As a measure of how much rounding-level changes move each problem's answer,
every case also records `spread`: the relative differences between SciPy's result with CSR
products and SciPy's result with dense (BLAS) products. The Rust tolerances are justified
against these numbers.

Matrices are stored row-major dense ("dense") or as COO triplets in CSR order ("coo").
"""
import hashlib
import json
import math
import pathlib
import sys

import numpy as np
import scipy
from scipy.sparse import csr_array
from scipy.sparse.linalg import lsmr

OUT = pathlib.Path(__file__).resolve().parent.parent / "crates/tessera/src/linalg/testdata/lsmr_fixtures.json"
DEFAULTS = dict(damp=0.0, atol=1e-6, btol=1e-6, conlim=1e8, maxiter=None, x0=None)


def check_finite(name, values):
    if not np.all(np.isfinite(np.asarray(values, dtype=float))):
        sys.exit(f"{name}: non-finite input")


def digest(*arrays):
    """SHA-256 of the little-endian f64 bytes of the arrays, in order (see the module doc)."""
    h = hashlib.sha256()
    for arr in arrays:
        h.update(np.asarray(arr, dtype="<f8").tobytes())
    return h.hexdigest()


def dyadic(rng, shape, scale=16, lo=-16, hi=16):
    """Random integers in [lo, hi] divided by `scale` (a power of two): exact in binary and decimal."""
    return rng.integers(lo, hi + 1, size=shape).astype(float) / scale


def lower_bidiagonal(m, n):
    """SciPy's test matrix: the leading m x n block of [1; 1 2; 2 3; 3 4; ...] (test_lsmr.py style)."""
    a = np.zeros((m, n))
    for i in range(min(m, n)):
        a[i, i] = i + 1
    for i in range(1, min(m, n + 1)):
        a[i, i - 1] = i
    return a


def lauchli(n, eps):
    """The Lauchli matrix [1 1 ... 1; eps I]: full column rank, cond ~ sqrt(n) / eps."""
    return np.vstack([np.ones((1, n)), eps * np.eye(n)])


def vandermonde(m, n, step):
    """Columns t^j for t = 0, step, 2 step, ...: exact in binary for small powers, badly conditioned."""
    t = np.arange(m) * step
    return np.vander(t, n, increasing=True)


def solve(a, b, opts):
    r = lsmr(a, b, **opts)
    x, istop, itn, normr, normar, norma, conda, normx = r
    out = dict(
        x=[float(v) for v in x],
        istop=int(istop),
        itn=int(itn),
        normr=float(normr),
        normar=float(normar),
        norma=float(norma),
        conda=float(conda),
        normx=float(normx),
    )
    for k, v in out.items():
        if k != "x" and isinstance(v, float) and not math.isfinite(v):
            sys.exit(f"non-finite {k} = {v}")
    return out


def rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    nb = np.linalg.norm(b)
    d = np.linalg.norm(a - b)
    return float(d / nb) if nb > 0 else float(d)


def case(name, description, a, b, store="dense", **options):
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    m, n = a.shape
    opts = dict(DEFAULTS)
    opts.update(options)
    check_finite(name, a)
    check_finite(name, b)
    if opts["x0"] is not None:
        opts["x0"] = np.asarray(opts["x0"], dtype=float)
        check_finite(name, opts["x0"])
    expected = solve(csr_array(a), b, dict(opts))
    dense = solve(a, b, dict(opts))
    spread = dict(
        x=rel(dense["x"], expected["x"]),
        normr=rel([dense["normr"]], [expected["normr"]]),
        normar=rel([dense["normar"]], [expected["normar"]]),
        norma=rel([dense["norma"]], [expected["norma"]]),
        conda=rel([dense["conda"]], [expected["conda"]]),
        istop_dense=dense["istop"],
        itn_dense=dense["itn"],
    )
    if store == "dense":
        matrix = dict(format="dense", data=[float(v) for v in a.ravel()])
    else:
        c = csr_array(a)
        c.sort_indices()
        rows = np.repeat(np.arange(m), np.diff(c.indptr))
        matrix = dict(
            format="coo",
            row=[int(v) for v in rows],
            col=[int(v) for v in c.indices],
            val=[float(v) for v in c.data],
        )
    values = matrix["data"] if store == "dense" else matrix["val"]
    inputs = [values, b] + ([] if opts["x0"] is None else [opts["x0"]])
    o = {k: v for k, v in opts.items() if k != "x0"}
    o["x0"] = None if opts["x0"] is None else [float(v) for v in opts["x0"]]
    print(
        f"{name:32s} {m:3d}x{n:<3d} istop {expected['istop']} itn {expected['itn']:3d} "
        f"normr {expected['normr']:.3e} normar {expected['normar']:.3e} conda {expected['conda']:.2e} "
        f"| dense: istop {dense['istop']} itn {dense['itn']:3d} x spread {spread['x']:.1e}"
    )
    return dict(
        name=name,
        description=description,
        m=m,
        n=n,
        matrix=matrix,
        b=[float(v) for v in b],
        options=o,
        input_sha256=digest(*inputs),
        expected=expected,
        spread=spread,
    )


def cases():
    rng = np.random.default_rng(20240611)
    out = []

    # Square, well conditioned (diagonally dominant), consistent: istop 1.
    a = 4.0 * np.eye(24) + dyadic(rng, (24, 24), scale=16, lo=-8, hi=8)
    xt = rng.integers(-5, 6, size=24).astype(float)
    out.append(case("square_well_conditioned", "24 x 24 diagonally dominant, b = A x_true", a, a @ xt))

    # Tall, consistent: istop 1.
    a = dyadic(rng, (60, 20))
    xt = rng.integers(-5, 6, size=20).astype(float)
    out.append(case("tall_consistent", "60 x 20 random, b = A x_true", a, a @ xt))

    # Tall, inconsistent (least squares): istop 2.
    b = dyadic(rng, (60,), scale=8)
    out.append(case("tall_inconsistent", "60 x 20 random, random b (least squares)", a, b))

    # Wide, full row rank, consistent: the minimum-norm solution, istop 1.
    a = dyadic(rng, (15, 40))
    b = dyadic(rng, (15,), scale=4)
    out.append(case("wide_min_norm", "15 x 40 random, random b (minimum-norm solution)", a, b))

    # Rank deficient (rank 8 of 30 x 16), inconsistent: least squares with a null space.
    p = rng.integers(-3, 4, size=(30, 8)).astype(float)
    q = rng.integers(-3, 4, size=(8, 16)).astype(float) / 8
    b = dyadic(rng, (30,), scale=8)
    out.append(case("rank_deficient", "30 x 16 of rank 8 (integer factors), random b", p @ q, b))

    # Ill conditioned, stopped by the condition limit: istop 3. (x at a conlim stop can be very
    # sensitive to rounding, see `spread`; this matrix and b were chosen where it is not.)
    a = vandermonde(40, 14, 1 / 32)
    b = dyadic(rng, (40,), scale=8)
    out.append(
        case(
            "ill_conditioned_conlim",
            "40 x 14 Vandermonde on t = k/32, atol = btol = 1e-12, conlim 1e5, maxiter 200: istop 3",
            a,
            b,
            atol=1e-12,
            btol=1e-12,
            conlim=1e5,
            maxiter=200,
        )
    )
    a = vandermonde(40, 10, 1 / 16)
    # Same matrix, machine-precision limits: tolerances 0, no condition limit.
    out.append(
        case(
            "ill_conditioned_machine",
            "40 x 10 Vandermonde, atol = btol = conlim = 0, maxiter 200: a machine-precision stop",
            a,
            b,
            atol=0.0,
            btol=0.0,
            conlim=0.0,
            maxiter=200,
        )
    )

    # b = 0: x = 0 at once, istop 0.
    a = dyadic(rng, (12, 8))
    out.append(case("zero_rhs", "12 x 8 random, b = 0: istop 0, x = 0", a, np.zeros(12)))
    x0 = dyadic(rng, (8,), scale=4)
    out.append(
        case(
            "zero_rhs_with_x0",
            "b = 0 with x0 != 0: SciPy returns x = 0 and normr = ||A x0||",
            a,
            np.zeros(12),
            x0=x0,
        )
    )
    # x0 already solves A x = b: the alpha * beta == 0 exit returns x0.
    out.append(case("exact_x0", "b = A x0: istop 0, x = x0, itn 0", a, a @ x0, x0=x0))

    # Damped least squares: istop 2.
    a = dyadic(rng, (50, 20))
    b = dyadic(rng, (50,), scale=8)
    out.append(case("damped", "50 x 20 random, random b, damp 0.75", a, b, damp=0.75))
    out.append(
        case("damped_wide", "20 x 35 random, random b, damp 1.5", dyadic(rng, (20, 35)), dyadic(rng, (20,), 8), damp=1.5)
    )

    # Warm start from x0 != 0, consistent.
    a = dyadic(rng, (40, 25))
    xt = rng.integers(-4, 5, size=25).astype(float)
    x0 = xt + dyadic(rng, (25,), scale=8, lo=-2, hi=2)
    out.append(case("warm_start_x0", "40 x 25 random, b = A x_true, x0 near x_true", a, a @ xt, x0=x0))

    # maxiter-limited: istop 7.
    a = vandermonde(30, 8, 1 / 8)
    b = dyadic(rng, (30,), scale=8)
    out.append(case("maxiter_limited", "30 x 8 Vandermonde, maxiter 4: istop 7", a, b, maxiter=4))
    out.append(case("maxiter_zero", "maxiter 0: no iteration, SciPy returns istop 0, x = 0", a, b, maxiter=0))

    # Machine-precision stop on a well-conditioned problem: atol = btol = 0 (istop 4 or 5).
    a = 3.0 * np.eye(30, 18) + dyadic(rng, (30, 18), lo=-4, hi=4)
    xt = rng.integers(-5, 6, size=18).astype(float)
    out.append(
        case(
            "tight_tolerances",
            "30 x 18 well conditioned, b = A x_true, atol = btol = 0, maxiter 60",
            a,
            a @ xt,
            atol=0.0,
            btol=0.0,
            maxiter=60,
        )
    )

    # SciPy's test-problem styles.
    a = lower_bidiagonal(20, 10)
    xt = np.arange(10, 0, -1).astype(float)
    out.append(
        case("lower_bidiagonal_tall", "SciPy's lowerBidiagonalMatrix(20, 10), x_true = 10..1", a, a @ xt, store="coo")
    )
    out.append(
        case(
            "lower_bidiagonal_tall_x0",
            "lowerBidiagonalMatrix(20, 10), x0 = ones (TestLSMRReturns)",
            a,
            a @ xt,
            store="coo",
            x0=np.ones(10),
        )
    )
    a = lower_bidiagonal(10, 20)
    out.append(
        case("lower_bidiagonal_wide", "lowerBidiagonalMatrix(10, 20), random b", a, dyadic(rng, (10,), 4), store="coo")
    )
    a = lauchli(12, 2.0**-20)
    b = np.concatenate([[1.0], dyadic(rng, (12,), scale=1024, lo=-8, hi=8)])
    out.append(case("lauchli", "Lauchli matrix [1 ... 1; eps I], 13 x 12, eps = 2^-20", a, b, store="coo"))
    out.append(
        case(
            "lauchli_tight",
            "Lauchli 13 x 12, eps = 2^-20, atol = btol = 1e-12, maxiter 50",
            a,
            b,
            store="coo",
            atol=1e-12,
            btol=1e-12,
            maxiter=50,
        )
    )
    out.append(case("identity", "SciPy's testIdentityACase3: I x = 10..1", np.eye(10), np.arange(10, 0, -1.0)))
    a = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    out.append(case("docstring_consistent", "SciPy's docstring example, b = [1, 0, -1]: istop 1", a, [1.0, 0.0, -1.0]))
    out.append(
        case("docstring_least_squares", "SciPy's docstring example, b = [1, 0.01, -1]: istop 2", a, [1.0, 0.01, -1.0])
    )

    # A sparse matrix stored as COO: 80 x 50, about 5 entries per row plus a diagonal.
    dense = np.zeros((80, 50))
    for i in range(80):
        dense[i, rng.choice(50, size=5, replace=False)] = dyadic(rng, (5,), scale=8)
    dense[np.arange(50), np.arange(50)] += 2.0
    out.append(
        case("sparse_least_squares", "80 x 50 sparse (5 per row + 2 I), random b", dense, dyadic(rng, (80,), 8), store="coo")
    )
    return out


def main():
    data = dict(
        generator="scripts/lsmr_fixtures.py",
        scipy=scipy.__version__,
        numpy=np.__version__,
        cases=cases(),
    )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    OUT.write_text(text + "\n")
    print(f"wrote {OUT} ({len(text) / 1024:.1f} KiB, {len(data['cases'])} cases)")


if __name__ == "__main__":
    main()
