#!/usr/bin/env python3
"""PyTorch baselines for `tessera bench --baselines`.

Invoked by the tessera CLI on the GPU machine:

    python3 scripts/baselines/bench_torch.py --op softmax --cases CASES.json --out OUT.json

CASES.json is a JSON list of {"case": str, "params": {...}}. For --op softmax the params are
{"rows": int, "cols": int, "dtype": "fp16"|"fp32"|"bf16", "op": "softmax"|"log_softmax"}; for
--op sparse, --op lsmr and --op gemm see bench_sparse, bench_lsmr and bench_gemm below.

OUT.json, the timing method and the {"missing": reason} answer when torch or CUDA is
unavailable are described in bench_common.py (shared with bench_attention.py). A case that
fails gets "ms": null and an "error" string. One line per case goes to stderr.

To add an op: write `bench_<op>(case, params) -> list[row]` and register it in OPS.
"""

import argparse
import os
import sys

import bench_common as common
from bench_common import log, row, rotation_count, time_ms, torch_dtype

torch = None  # set in main() (bench_common.import_torch)


# ---------------------------------------------------------------------------------------------
# ops


def bench_softmax(case, params):
    rows, cols = int(params["rows"]), int(params["cols"])
    dtype = torch_dtype(params.get("dtype", "fp16"))
    which = params.get("op", "softmax")
    if which == "softmax":
        fn = lambda x: torch.softmax(x, dim=-1)  # noqa: E731
    elif which == "log_softmax":
        fn = lambda x: torch.log_softmax(x, dim=-1)  # noqa: E731
    else:
        raise ValueError(f"unknown softmax op {which!r} (expected softmax or log_softmax)")

    nbytes = rows * cols * torch.empty((), dtype=dtype).element_size()
    nbuf = rotation_count(nbytes)
    gen = torch.Generator(device="cuda").manual_seed(0x7E55E7A)
    inputs = [
        torch.randn((rows, cols), device="cuda", dtype=torch.float32, generator=gen).to(dtype)
        for _ in range(nbuf)
    ]
    try:
        ms = time_ms(fn, inputs)
    finally:
        del inputs
    gbps = 2.0 * nbytes / (ms * 1e-3) / 1e9
    return [row(case, params, "torch", ms=ms, gbps=gbps)]


# -- sparse: SpMV y = A x through cuSPARSE (torch.mv on a CSR tensor, CuPy csr_matrix @ x) on the
# very matrix tessera benchmarked. Params {"matrix": STEM, "rows", "cols", "dtype": "fp32"|"fp64",
# "index": "i32", "transposed"}: STEM.offsets / .indices / .values are raw little-endian arrays
# written by crates/tessera/src/sparse/bench.rs. GB/s count values, indices, offsets, x and y once.

def load_matrix(params):
    import numpy as np  # noqa: PLC0415 (numpy comes with torch)

    stem = params["matrix"]
    val = {"fp32": np.float32, "fp64": np.float64, "fp16": np.float16}[params["dtype"]]
    idx = {"i32": np.int32, "i64": np.int64}[params.get("index", "i32")]
    offsets = np.fromfile(stem + ".offsets", dtype=idx)
    indices = np.fromfile(stem + ".indices", dtype=idx)
    values = np.fromfile(stem + ".values", dtype=val)
    rows, cols = int(params["rows"]), int(params["cols"])
    if params.get("transposed"):
        rows, cols = cols, rows
    if len(offsets) != rows + 1 or len(indices) != len(values):
        raise ValueError(f"{stem}: {len(offsets)} offsets, {len(indices)} indices, {len(values)} "
                         f"values do not make a {rows} x {cols} CSR matrix")
    return rows, cols, offsets, indices, values


def bench_sparse(case, params):
    if params.get("op") == "spmm":
        return bench_sparse_spmm(case, params)
    rows, cols, offsets, indices, values = load_matrix(params)
    nnz = len(values)
    vsize, isize = values.itemsize, indices.itemsize
    nbytes = nnz * (vsize + isize) + (rows + 1) * isize + cols * vsize + rows * vsize
    dtype = torch.float32 if params["dtype"] == "fp32" else torch.float64
    out = []

    a = torch.sparse_csr_tensor(
        torch.from_numpy(offsets).cuda(), torch.from_numpy(indices).cuda(),
        torch.from_numpy(values).cuda(), size=(rows, cols))
    gen = torch.Generator(device="cuda").manual_seed(0x5EED)
    xs = [torch.rand(cols, device="cuda", dtype=dtype, generator=gen) * 2 - 1 for _ in range(4)]
    ms = time_ms(lambda x: torch.mv(a, x), xs)
    out.append(row(case, params, "torch-csr", ms=ms, gbps=nbytes / (ms * 1e-3) / 1e9))

    try:
        import cupy  # noqa: PLC0415
        import cupyx.scipy.sparse as cusp  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        out.append(row(case, params, "cupy-csr", missing=f"cupy not importable: {e}"))
        return out
    ac = cusp.csr_matrix((cupy.asarray(values), cupy.asarray(indices), cupy.asarray(offsets)),
                         shape=(rows, cols))
    xc = [cupy.asarray(x) for x in xs]
    ms = time_ms(lambda x: ac @ x, xc)
    out.append(row(case, params, "cupy-csr", ms=ms, gbps=nbytes / (ms * 1e-3) / 1e9))
    return out


# -- sparse SpMM: C = A B (B, C row-major, params["n"] columns) on the block-sparse matrices of
# bench.rs's block cases, through cuSPARSE: torch CSR (torch.mm on a sparse_csr tensor), torch BSR
# (the same tensor .to_sparse_bsr((b, b)); torch may not take every dtype: then an "error" row),
# CuPy CSR (csr_matrix @ B). TFLOP/s count 2 flops per stored CSR nonzero and column, as ours.

def bench_sparse_spmm(case, params):
    rows, cols, offsets, indices, values = load_matrix(params)
    n, block = int(params["n"]), int(params["block"])
    nnz = len(values)
    dtype = {"fp32": torch.float32, "fp64": torch.float64, "fp16": torch.float16}[params["dtype"]]
    vsize = values.itemsize
    nbytes = nnz * (vsize + 4) + (rows + 1) * 4 + (rows + cols) * n * vsize
    out = []

    def done(impl, ms, note=None):
        r = row(case, params, impl, ms=ms, tflops=2.0 * nnz * n / (ms * 1e-3) / 1e12,
                gbps=nbytes / (ms * 1e-3) / 1e9)
        if note:
            r["note"] = note
        out.append(r)

    a = torch.sparse_csr_tensor(
        torch.from_numpy(offsets).cuda(), torch.from_numpy(indices).cuda(),
        torch.from_numpy(values).cuda(), size=(rows, cols))
    gen = torch.Generator(device="cuda").manual_seed(0x5EED)
    bs = [(torch.rand((cols, n), device="cuda", dtype=torch.float32, generator=gen) * 2 - 1).to(dtype)
          for _ in range(4)]
    try:
        done("torch-csr", time_ms(lambda b: torch.mm(a, b), bs))
    except Exception as e:  # noqa: BLE001
        out.append(row(case, params, "torch-csr", error=f"{type(e).__name__}: {e}"))
    try:
        a_bsr = a.to_sparse_bsr((block, block))
        done("torch-bsr", time_ms(lambda b: torch.mm(a_bsr, b), bs),
             note=f"{a_bsr.values().shape[0]} blocks of {block}x{block}")
    except Exception as e:  # noqa: BLE001
        out.append(row(case, params, "torch-bsr", error=f"{type(e).__name__}: {e}"))
    if params["dtype"] == "fp16":
        out.append(row(case, params, "cupy-csr", missing="cupyx.scipy.sparse has no float16 matrices"))
        return out
    try:
        import cupy  # noqa: PLC0415
        import cupyx.scipy.sparse as cusp  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        out.append(row(case, params, "cupy-csr", missing=f"cupy not importable: {e}"))
        return out
    try:
        ac = cusp.csr_matrix((cupy.asarray(values), cupy.asarray(indices), cupy.asarray(offsets)),
                             shape=(rows, cols))
        bc = [cupy.asarray(b) for b in bs]
        done("cupy-csr", time_ms(lambda b: ac @ b, bc))
    except Exception as e:  # noqa: BLE001
        out.append(row(case, params, "cupy-csr", error=f"{type(e).__name__}: {e}"))
    return out


# -- lsmr: whole least-squares solves with cupyx.scipy.sparse.linalg.lsmr (and SciPy on the
# CPU when params["scipy"]) on the very system tessera solved: the matrix as for sparse
# (STEM.offsets/.indices/.values) and b in STEM.b, both written by
# crates/tessera/src/linalg/bench.rs (tomography cases, params["b"] = "A x_phantom", also
# write STEM.phantom, f64: the note then adds ||x - phantom|| / ||phantom||). Same options
# (damp, atol, btol, conlim, maxiter), so with atol = btol = conlim = 0 both run the same
# iterations. ms = median wall time of a whole
# solve (5 runs after one warm-up), synchronised; the note gives itn, istop, ms per iteration
# and the relative residual.

def _solve_ms(solve, sync, runs=5):
    import statistics  # noqa: PLC0415
    import time  # noqa: PLC0415

    result = solve()  # warm-up (and the result reported)
    sync()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        solve()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), result


def bench_lsmr(case, params):
    import numpy as np  # noqa: PLC0415

    rows, cols, offsets, indices, values = load_matrix(params)
    b = np.fromfile(params["matrix"] + ".b", dtype=values.dtype)
    if len(b) != rows:
        raise ValueError(f"{params['matrix']}.b holds {len(b)} values, the matrix has {rows} rows")
    opts = dict(damp=float(params.get("damp", 0.0)), atol=float(params["atol"]),
                btol=float(params["btol"]), conlim=float(params["conlim"]),
                maxiter=int(params["maxiter"]))
    normb = float(np.linalg.norm(b.astype(np.float64)))
    out = []

    # tomography cases (b = A x_phantom) also write the phantom (f64): report how close x is
    phantom_path = params["matrix"] + ".phantom"
    phantom = None
    if "b" in params and os.path.exists(phantom_path):
        phantom = np.fromfile(phantom_path, dtype=np.float64)

    def note(res, ms):
        itn = int(res[2])
        text = (f"itn {itn} istop {int(res[1])} ms/iter {ms / max(itn, 1):.4f} "
                f"relres {float(res[3]) / normb if normb else float('nan'):.3e}")
        if phantom is not None and len(phantom) == cols:
            x = res[0].get() if hasattr(res[0], "get") else np.asarray(res[0])
            err = np.linalg.norm(x.astype(np.float64) - phantom) / np.linalg.norm(phantom)
            text += f" x_err_phantom {err:.4f}"
        return text

    try:
        import cupy  # noqa: PLC0415
        import cupyx.scipy.sparse as cusp  # noqa: PLC0415
        import cupyx.scipy.sparse.linalg as cula  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        out.append(row(case, params, "cupy", missing=f"cupy not importable: {e}"))
    else:
        a = cusp.csr_matrix((cupy.asarray(values), cupy.asarray(indices), cupy.asarray(offsets)),
                            shape=(rows, cols))
        bc = cupy.asarray(b)
        ms, res = _solve_ms(lambda: cula.lsmr(a, bc, **opts), cupy.cuda.runtime.deviceSynchronize)
        out.append(row(case, params, "cupy", ms=ms, note=note(res, ms)))

    if params.get("scipy"):
        try:
            import scipy.sparse as sp  # noqa: PLC0415
            import scipy.sparse.linalg as sla  # noqa: PLC0415
        except Exception as e:  # noqa: BLE001
            out.append(row(case, params, "scipy-cpu", missing=f"scipy not importable: {e}"))
        else:
            a = sp.csr_matrix((values, indices, offsets), shape=(rows, cols))
            ms, res = _solve_ms(lambda: sla.lsmr(a, b, **opts), lambda: None, runs=3)
            out.append(row(case, params, "scipy-cpu", ms=ms, note=note(res, ms)))
    return out
# -- gemm: D = act(A @ B + bias) through cuBLAS / cuBLASLt, on the shapes tessera timed. Params
# {"M", "N", "K", "dtype": "fp16"|"bf16"|"fp32"|"fp64", "out", "b_layout": "nk"|"kn", "bias",
# "activation": "none"|"relu"|"gelu"|"gelu_tanh"|"silu"}. B is [N, K] (a weight) for "nk" and
# is passed as b.t(), as torch.nn.functional.linear does. Plain products use torch.mm, a bias
# torch.addmm, bias + relu/gelu torch._addmm_activation (cuBLASLt's fused epilogue; its GELU is
# the tanh form); other activations run after torch.addmm. fp32 is timed with TF32 off (exact).
# TFLOP/s for every row; GB/s (A, B and D bytes once) for M <= 16. The quantized contracts:
# "fp8e4m3"/"fp8e5m2" through torch._scaled_mm (params "scales": "tensor" -> scalar scales,
# "row" -> [M, 1] and [1, N]; use_fast_accum=True, the accumulation tessera's fp8 path does),
# "int8" -> int32 through torch._int_mm, "tf32" through torch.mm with TF32 allowed. An fp8 "out"
# passes params "result_scale" as torch._scaled_mm's scale_result.
# "glu": "swiglu"|"geglu"|"geglu_tanh" (tessera's fused GLU epilogue, one GEMM over 2N
# interleaved gate/up columns): the baseline is what a torch MLP runs, two GEMMs with separate
# [N, K] (or [K, N]) gate and up weights, then act(g) * u (with the [N] biases through
# torch.addmm when "bias"); TFLOP/s count both GEMMs (2 M 2N K).

GEMM_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64"}
QUANT_DTYPES = {"fp8e4m3": "float8_e4m3fn", "fp8e5m2": "float8_e5m2", "int8": "int8", "tf32": "float32"}
OUT_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "i32": "int32", "int32": "int32",
              "fp8e4m3": "float8_e4m3fn", "fp8e5m2": "float8_e5m2"}


def bench_gemm_quantized(case, params):
    m, n, k = int(params["M"]), int(params["N"]), int(params["K"])
    name = params["dtype"]
    if params.get("b_layout", "nk") != "nk" or params.get("bias") or params.get("activation", "none") != "none":
        return [row(case, params, "torch", missing="quantized baselines take B [N, K] only, no epilogue")]
    dtype = getattr(torch, QUANT_DTYPES[name])
    out_name = params.get("out", "bf16")
    if out_name not in OUT_DTYPES:
        return [row(case, params, "torch", missing=f"no torch output dtype for {out_name}")]
    out_dtype = getattr(torch, OUT_DTYPES[out_name])
    esize = torch.empty((), dtype=dtype).element_size()
    nbuf = rotation_count((m * k + k * n) * esize)
    gen = torch.Generator(device="cuda").manual_seed(0x6E34)

    def rand(*shape):
        if name == "int8":
            return torch.randint(-64, 64, shape, device="cuda", dtype=torch.int8, generator=gen)
        return torch.randn(shape, device="cuda", dtype=torch.float32, generator=gen).to(dtype)

    sets = [(rand(m, k), rand(n, k)) for _ in range(nbuf)]
    note = None
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    if name == "int8":
        fn = lambda ab: torch._int_mm(ab[0], ab[1].t())  # noqa: E731
    elif name == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
        fn = lambda ab: torch.mm(ab[0], ab[1].t())  # noqa: E731
    else:
        if params.get("scales", "tensor") == "row":
            sa = 1.0 + 0.75 * torch.rand(m, 1, device="cuda", generator=gen)
            sb = 1.0 + 0.75 * torch.rand(1, n, device="cuda", generator=gen)
        else:
            sa = torch.tensor(1.25, device="cuda")
            sb = torch.tensor(1.5, device="cuda")
        note = "torch._scaled_mm, use_fast_accum=True"
        # an fp8 output: D = fp8(scale_result * d), as tessera's rows (which also write the amax)
        rs = params.get("result_scale")
        sr = torch.tensor(float(rs), device="cuda") if rs is not None else None
        if sr is not None:
            note += ", scale_result (no amax)"
        fn = lambda ab: torch._scaled_mm(  # noqa: E731
            ab[0], ab[1].t(), scale_a=sa, scale_b=sb, scale_result=sr, out_dtype=out_dtype, use_fast_accum=True)
    try:
        ms = time_ms(fn, sets)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
        del sets
    tflops = 2.0 * m * n * k / (ms * 1e-3) / 1e12
    osize = torch.empty((), dtype=out_dtype).element_size()
    gbps = (m * k + k * n) * esize / (ms * 1e-3) / 1e9 + m * n * osize / (ms * 1e-3) / 1e9 if m <= 16 else None
    return [row(case, params, "torch", ms=ms, tflops=tflops, gbps=gbps, note=note)]


def bench_gemm(case, params):
    m, n, k = int(params["M"]), int(params["N"]), int(params["K"])
    name = params.get("dtype", "bf16")
    if name in QUANT_DTYPES:
        return bench_gemm_quantized(case, params)
    dtype = getattr(torch, GEMM_DTYPES[name])
    if params.get("out", name) != name:
        return [row(case, params, "torch", missing=f"torch.mm writes {name}, not {params['out']}")]
    nk = params.get("b_layout", "nk") == "nk"
    act = params.get("activation", "none")
    has_bias = bool(params.get("bias"))
    glu = params.get("glu", "none")
    if glu != "none":
        return bench_gemm_glu(case, params, m, n, k, dtype, nk, glu, has_bias)
    esize = torch.empty((), dtype=dtype).element_size()
    nbuf = rotation_count((m * k + k * n) * esize)
    gen = torch.Generator(device="cuda").manual_seed(0x6E33)

    def randn(*shape):
        return torch.randn(shape, device="cuda", dtype=torch.float32, generator=gen).to(dtype)

    sets = [(randn(m, k), randn(n, k) if nk else randn(k, n)) for _ in range(nbuf)]
    bias = randn(n) if has_bias else None
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False

    def op_b(b):
        return b.t() if nk else b

    if not has_bias and act == "none":
        fn = lambda ab: torch.mm(ab[0], op_b(ab[1]))  # noqa: E731
    elif has_bias and act == "none":
        fn = lambda ab: torch.addmm(bias, ab[0], op_b(ab[1]))  # noqa: E731
    elif has_bias and act in ("relu", "gelu", "gelu_tanh"):
        gelu = act != "relu"
        fn = lambda ab: torch._addmm_activation(bias, ab[0], op_b(ab[1]), use_gelu=gelu)  # noqa: E731
    else:
        f = {"relu": torch.relu, "gelu": torch.nn.functional.gelu,
             "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
             "silu": torch.nn.functional.silu}[act]
        if has_bias:
            fn = lambda ab: f(torch.addmm(bias, ab[0], op_b(ab[1])))  # noqa: E731
        else:
            fn = lambda ab: f(torch.mm(ab[0], op_b(ab[1])))  # noqa: E731
    try:
        ms = time_ms(fn, sets)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
        del sets
    tflops = 2.0 * m * n * k / (ms * 1e-3) / 1e12
    gbps = (m * k + k * n + m * n) * esize / (ms * 1e-3) / 1e9 if m <= 16 else None
    return [row(case, params, "torch", ms=ms, tflops=tflops, gbps=gbps)]


def bench_gemm_glu(case, params, m, n, k, dtype, nk, glu, has_bias):
    """act(x Wg^T + bg) * (x Wu^T + bu): two cuBLAS GEMMs and the elementwise product."""
    esize = torch.empty((), dtype=dtype).element_size()
    nbuf = rotation_count((m * k + 2 * k * n) * esize)
    gen = torch.Generator(device="cuda").manual_seed(0x6E34)

    def randn(*shape):
        return torch.randn(shape, device="cuda", dtype=torch.float32, generator=gen).to(dtype)

    def weight():
        return randn(n, k) if nk else randn(k, n)

    sets = [(randn(m, k), weight(), weight()) for _ in range(nbuf)]
    bg, bu = (randn(n), randn(n)) if has_bias else (None, None)
    act = {"swiglu": torch.nn.functional.silu,
           "geglu": torch.nn.functional.gelu,
           "geglu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}[glu]

    def op_b(b):
        return b.t() if nk else b

    if has_bias:
        fn = lambda s: act(torch.addmm(bg, s[0], op_b(s[1]))) * torch.addmm(bu, s[0], op_b(s[2]))  # noqa: E731
    else:
        fn = lambda s: act(torch.mm(s[0], op_b(s[1]))) * torch.mm(s[0], op_b(s[2]))  # noqa: E731
    try:
        ms = time_ms(fn, sets)
    finally:
        del sets
    tflops = 2.0 * m * 2 * n * k / (ms * 1e-3) / 1e12
    gbps = (m * k + 2 * k * n + m * n) * esize / (ms * 1e-3) / 1e9 if m <= 16 else None
    return [row(case, params, "torch", ms=ms, tflops=tflops, gbps=gbps)]


OPS = {
    "softmax": bench_softmax,
    "sparse": bench_sparse,
    "lsmr": bench_lsmr,
    "gemm": bench_gemm,
}
# The impls each op reports (rows marked missing when torch is unavailable).
IMPLS = {
    "softmax": ["torch"],
    "sparse": ["torch-csr", "cupy-csr", "torch-bsr"],
    "lsmr": ["cupy", "scipy-cpu"],
    "gemm": ["torch"],
}


# ---------------------------------------------------------------------------------------------


def main(argv=None):
    global torch
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--op", required=True, choices=sorted(OPS))
    ap.add_argument("--cases", required=True, help="JSON file: list of {case, params}")
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args(argv)

    cases = common.load_cases(args.cases)
    torch = common.import_torch("bench_torch", args.out)
    if torch is None:
        return 0
    device = torch.cuda.get_device_name()
    log(f"bench_torch: torch {torch.__version__}, {device}, op {args.op}, {len(cases)} cases")
    rows = common.run_cases(cases, OPS[args.op], lambda params: IMPLS[args.op])
    common.write_json(args.out, {"torch": torch.__version__, "device": device, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
