#!/usr/bin/env python3
"""Benchmark of tessera's Python API against torch (and FlashInfer) in one process, on a GPU:

    python3 scripts/baselines/bench_python.py --json OUTDIR [--quick] [--ops softmax,attention,kvcache,host]
        [--flashinfer]

    (--ops gemm,sparse: tessera.matmul against torch.mm / F.linear + activation, and
    tessera.sparse.csr_matrix A @ x, A.T @ y against torch's CSR product; opt-in)

Writes OUTDIR/python.json in the JSON shape of `tessera bench` (DESIGN.md): {"gpu", "date",
"commit", "command", "roofline": {"copy_gbps", "bf16_tflops"}, "rows": [...], "verify":
{"passed", "failed"}}, with the CLI's case names and params so its rows line up with
`tessera bench`'s. Impls:

  tessera-py       tessera.softmax / log_softmax / flash_attn_func / flash_attn_varlen_func:
                   the installed wheel, called as a user would (output allocated by torch, the
                   plan from tessera's cache, launched on torch's current stream)
  torch            torch.softmax / torch.log_softmax
  torch-flash, torch-cudnn, torch-efficient
                   F.scaled_dot_product_attention in one sdpa_kernel backend, [B, H, N, D]
                   (transposed views of the same [B, N, H, D] tensors), enable_gqa for GQA; a
                   varlen case runs the sequences one after another in one timed call
  flashinfer-fa2   with --flashinfer, single-sequence cases only: single_prefill_with_kv_cache
                   (FlashInfer compiles each configuration with nvcc on first use, ~20 s)

Paged KV cache (--ops kvcache; the CLI's `tessera bench kvcache` case names and params:
"decode fp16 B8 ctx4096 Hq32 Hkv8 D128 page16", ...; B=8, Hq=32, Hkv=8, D=128, fp16, page 16,
one cache just big enough with its pages in a random order, as bench_kvcache.py):

  tessera-py       decode: tessera.BatchDecodeWithPagedKVCacheWrapper, plan() once outside the
                   timing, timed .run(q, cache) on a tessera.PagedKVCache; append:
                   wrapper.append(k, v, cache) (the decode-step append with plan()'s tables)
  tessera-py-fi    append only: tessera.append_paged_kv_cache with FlashInfer's arguments
                   (batch_indices / positions / tables as CPU lists: host checks per call)
  flashinfer       with --flashinfer: BatchDecodeWithPagedKVCacheWrapper (128 MiB workspace,
                   plan() outside the timing) .run(q, cache.kv_cache()) -- the same pages,
                   through tessera's torch view; append_paged_kv_cache on the same view
  torch-flash-gqa, torch-cudnn-gqa
                   decode: SDPA (enable_gqa) of q [B, 1, Hq, D] over the K/V gathered into
                   contiguous [B, ctx, Hkv, D] tensors (outside the timing)
  torch-index      append: cache[page_ids, 0, offsets] = k (and v) with precomputed indices

Decode rows are checked against a float32 reference on the gathered K/V (rel_l2 under the fp16
budget counts in "verify" for tessera-py); append rows read the written slots back and compare
them bit for bit. gbps: decode = KV bytes read / t, append = K/V bytes written / t (as the
CLI). extra_mib counts torch's allocator only: tessera's plan workspace and tables come from its
own pool (a few MiB; the cache itself is allocated before the measured call).

Timing: bench_common.time_ms (CUDA events, warm-up, median of 7 groups; softmax inputs rotate
over more than 2x the L2). Every tessera-py row is checked against a reference (softmax: torch
in float64; attention: torch SDPA in float32 on the same inputs) with DESIGN.md's budgets:
rel_l2 / max_abs_err fill the row and the check counts in "verify". Baseline rows carry their
own errors against the same reference.

"host overhead" rows time back-to-back calls on tiny shapes with the wall clock (the GPU work
is shorter than the host's), i.e. the per-call cost of the Python layer plus the launch.
"""

import argparse
import datetime
import math
import os
import subprocess
import sys
import time

import bench_common as common
from bench_common import log, row, rotation_count, time_ms

torch = None
tessera = None
F = None

BUDGET = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1e-2}
SOFTMAX_SHAPES = [(32768, 128), (32768, 1024), (16384, 4096), (4096, 32768), (1024, 131072), (256, 262144)]
LOG_SOFTMAX_SHAPES = [(32768, 1024), (4096, 32768)]
CAUSAL_N = [512, 1024, 2048, 4096, 8192, 16384, 32768]
SDPA_BACKENDS = ("flash", "cudnn", "efficient")


def dtype_of(name):
    return {"fp16": torch.float16, "fp32": torch.float32, "bf16": torch.bfloat16}[name]


def errors(out, ref):
    """(max_abs_err, rel_l2) of out against ref, in float64."""
    d = out.double() - ref.double()
    den = torch.linalg.vector_norm(ref.double()).item()
    rel = torch.linalg.vector_norm(d).item() / den if den > 0 else torch.linalg.vector_norm(d).item()
    return d.abs().max().item(), rel


def with_errors(r, out, ref, budget=None, tally=None):
    if torch.isnan(out).any():
        r["max_abs_err"], r["rel_l2"] = float("nan"), float("nan")
    else:
        r["max_abs_err"], r["rel_l2"] = errors(out, ref)
    if tally is not None:
        ok = r["rel_l2"] == r["rel_l2"] and r["rel_l2"] < budget
        tally["passed" if ok else "failed"] += 1
        if not ok:
            log(f"  VERIFY FAILED {r['case']} {r['impl']}: rel_l2 {r['rel_l2']} >= {budget}")
    # NaN is not valid JSON: a failed check keeps its row with null errors
    for key in ("max_abs_err", "rel_l2"):
        if r[key] != r[key]:
            r[key] = None
    return r


# -- rooflines -----------------------------------------------------------------------------


def rooflines():
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    ms = time_ms(lambda s: dst.copy_(s), [src])
    copy_gbps = 2.0 * n / (ms * 1e-3) / 1e9
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(lambda x: torch.mm(x, b), [a])
    tflops = 2.0 * 8192**3 / (ms * 1e-3) / 1e12
    log(f"bench_python: roofline copy {copy_gbps:.0f} GB/s, bf16 GEMM {tflops:.0f} TFLOP/s")
    return {"copy_gbps": copy_gbps, "bf16_tflops": tflops}


# -- softmax -------------------------------------------------------------------------------


def softmax_cases(quick):
    shapes = SOFTMAX_SHAPES[:3] if quick else SOFTMAX_SHAPES
    out = []
    for dt in ("fp16", "fp32"):
        out += [("softmax", dt, r, c) for r, c in shapes]
        out += [("log_softmax", dt, r, c) for r, c in LOG_SOFTMAX_SHAPES]
    return out


def bench_softmax(op, dt, rows, cols, tally):
    case = f"{op} {dt} {rows}x{cols}"
    params = {"rows": rows, "cols": cols, "dtype": dt, "op": op}
    dtype = dtype_of(dt)
    nbytes = rows * cols * dtype.itemsize
    gen = torch.Generator(device="cuda").manual_seed(0x7E55E7A)
    inputs = [
        torch.randn((rows, cols), device="cuda", dtype=torch.float32, generator=gen).mul_(3).to(dtype)
        for _ in range(rotation_count(nbytes))
    ]
    ref = (torch.log_softmax if op == "log_softmax" else torch.softmax)(inputs[0].double(), dim=-1)
    impls = [
        ("tessera-py", getattr(tessera, op)),
        ("torch", lambda x: (torch.log_softmax if op == "log_softmax" else torch.softmax)(x, dim=-1)),
    ]
    rows_out = []
    for impl, fn in impls:
        try:
            ms = time_ms(fn, inputs)
            extra = common.peak_extra_mib(lambda: fn(inputs[0]))
            r = row(case, params, impl, ms=ms, gbps=2.0 * nbytes / (ms * 1e-3) / 1e9, extra_mib=extra)
            with_errors(r, fn(inputs[0]), ref, BUDGET[dt], tally if impl == "tessera-py" else None)
        except Exception as e:  # a failed impl is a row, not the end of the run
            r = row(case, params, impl, error=common.error_text(e))
            if impl == "tessera-py":
                tally["failed"] += 1
        rows_out.append(r)
    return rows_out


# -- attention -----------------------------------------------------------------------------


def varlen_lengths():
    """The CLI's 16 varlen lengths (attention/bench.rs varlen_lengths, seed 2026)."""
    lo, hi, state, out = 128.0, 8192.0, 2026, []
    for _ in range(16):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        x = (state >> 11) / float(1 << 53)
        out.append(int(math.floor(lo * (hi / lo) ** x + 0.5)))
    out[3], out[11] = 128, 8192
    return out


def attention_cases(quick):
    cases = [(1, 32, 32, n, 128, True, "fp16", None) for n in CAUSAL_N if not quick or n in (1024, 4096)]
    cases += [(4, 16, 16, 8192, d, False, "bf16", None) for d in (64, 128) if not quick or d == 128]
    cases.append((4, 32, 8, 4096, 128, True, "bf16", None))
    lengths = varlen_lengths()
    cases.append((len(lengths), 32, 32, max(lengths), 128, True, "fp16", lengths))
    return cases


def attention_name(b, hq, hkv, n, d, causal, dt, lengths):
    mask = "causal" if causal else "non-causal"
    heads = f"H{hq}" if hq == hkv else f"H{hq}/{hkv}"
    if lengths is not None:
        return f"varlen {mask} {dt} {len(lengths)} seqs {heads} N<={n} D{d}"
    return f"{'gqa ' if hq != hkv else ''}{mask} {dt} B{b} {heads} N{n} D{d}"


def attention_flops(hq, d, causal, lengths):
    f = 4.0 * hq * d * sum(float(n) * n for n in lengths)
    return f / 2 if causal else f


def sdpa(backend, q, k, v, causal):
    """torch SDPA in one backend on [B, N, H, D] tensors (transposed views), GQA by enable_gqa."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    b = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }[backend]
    gqa = q.shape[2] != k.shape[2]
    with sdpa_kernel(b):
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, enable_gqa=gqa
        )
    return o.transpose(1, 2)


def reference(q, k, v, causal):
    """float32 attention on the same inputs (SDPA, memory-efficient where it runs, else math)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    g = q.shape[2] // k.shape[2]
    qf, kf, vf = q.float(), k.float().repeat_interleave(g, dim=2), v.float().repeat_interleave(g, dim=2)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        o = F.scaled_dot_product_attention(qf.transpose(1, 2), kf.transpose(1, 2), vf.transpose(1, 2), is_causal=causal)
    return o.transpose(1, 2)


def bench_attention(b, hq, hkv, n, d, causal, dt, lengths, tally, flashinfer):
    case = attention_name(b, hq, hkv, n, d, causal, dt, lengths)
    params = {"B": b, "Hq": hq, "Hkv": hkv, "N": n, "D": d, "causal": causal, "dtype": dt, "varlen": lengths is not None}
    if lengths is not None:
        params["lengths"] = lengths
    dtype = dtype_of(dt)
    gen = torch.Generator(device="cuda").manual_seed(0xA77E)
    seqs = lengths if lengths is not None else [n] * b

    def rnd(*shape):
        return torch.randn(shape, device="cuda", dtype=torch.float32, generator=gen).to(dtype)

    if lengths is None:
        q, k, v = rnd(b, n, hq, d), rnd(b, n, hkv, d), rnd(b, n, hkv, d)
        ref = reference(q, k, v, causal)
        impls = [("tessera-py", lambda _: tessera.flash_attn_func(q, k, v, causal=causal))]
        impls += [(f"torch-{be}", (lambda be: lambda _: sdpa(be, q, k, v, causal))(be)) for be in SDPA_BACKENDS]
        if flashinfer is not None and b == 1 and hq == hkv:
            impls.append(
                ("flashinfer-fa2", lambda _: flashinfer.single_prefill_with_kv_cache(q[0], k[0], v[0], causal=causal, backend="fa2")[None])
            )
    else:
        total = sum(lengths)
        cu = torch.tensor([0] + [sum(lengths[: i + 1]) for i in range(len(lengths))], dtype=torch.int32, device="cuda")
        offs = cu.tolist()
        q, k, v = rnd(total, hq, d), rnd(total, hkv, d), rnd(total, hkv, d)
        ref = torch.cat([reference(q[None, a:z], k[None, a:z], v[None, a:z], causal)[0] for a, z in zip(offs, offs[1:])])
        mx = max(lengths)
        impls = [("tessera-py", lambda _: tessera.flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, causal=causal))]

        def per_seq(be):
            def run(_):
                return torch.cat([sdpa(be, q[None, a:z], k[None, a:z], v[None, a:z], causal)[0] for a, z in zip(offs, offs[1:])])

            return run

        impls += [(f"torch-{be}", per_seq(be)) for be in SDPA_BACKENDS]

    flops = attention_flops(hq, d, causal, seqs)
    out_rows = []
    for impl, fn in impls:
        try:
            ms = time_ms(fn, [None])
            extra = common.peak_extra_mib(lambda: fn(None))
            r = row(case, params, impl, ms=ms, tflops=flops / (ms * 1e-3) / 1e12, extra_mib=extra)
            if lengths is not None and impl.startswith("torch-"):
                r["note"] = "torch has no varlen SDPA: one call per sequence, in one timed call"
            with_errors(r, fn(None), ref, BUDGET[dt], tally if impl == "tessera-py" else None)
        except Exception as e:
            r = row(case, params, impl, error=common.error_text(e))
            if impl == "tessera-py":
                tally["failed"] += 1
        out_rows.append(r)
        common.log_row(r)
    return out_rows


# -- paged KV cache --------------------------------------------------------------------------

KV_SEED = 0x4B5C  # bench_kvcache.py's page order


def kvcache_cases(quick):
    """(op, ctx) of the CLI's kvcache cases this runner covers."""
    decode = [4096] if quick else [4096, 32768]
    return [("decode", c) for c in decode] + [("append", 4096)]


def kv_layout(lengths, page):
    """(indptr, indices, last_page_len, num_pages): a pool just big enough, pages shuffled."""
    import random  # noqa: PLC0415

    pages = [(n + page - 1) // page for n in lengths]
    indptr = [0]
    for p in pages:
        indptr.append(indptr[-1] + p)
    indices = list(range(indptr[-1]))
    random.Random(KV_SEED).shuffle(indices)
    last = [(n - 1) % page + 1 for n in lengths]
    return indptr, indices, last, indptr[-1]


def gather_kv(kv, indptr, indices, lengths):
    """Contiguous K and V [B, ctx, Hkv, D] (uniform lengths) gathered from [P, 2, T, Hkv, D]."""
    ks, vs = [], []
    for b, n in enumerate(lengths):
        pages = torch.tensor(indices[indptr[b] : indptr[b + 1]], dtype=torch.long, device="cuda")
        x = kv[pages]  # [n_pages, 2, T, Hkv, D]
        ks.append(x[:, 0].reshape(-1, *x.shape[3:])[:n])
        vs.append(x[:, 1].reshape(-1, *x.shape[3:])[:n])
    return torch.stack(ks), torch.stack(vs)


def decode_reference(q, k, v):
    """float32 decode of q [B, Hq, D] over k/v [B, L, Hkv, D], one sequence at a time."""
    g = q.shape[1] // k.shape[2]
    out = []
    for b in range(q.shape[0]):
        kf = k[b].float().transpose(0, 1).repeat_interleave(g, 0)  # [Hq, L, D]
        vf = v[b].float().transpose(0, 1).repeat_interleave(g, 0)
        s = torch.einsum("hd,hld->hl", q[b].float(), kf) / math.sqrt(q.shape[-1])
        out.append(torch.einsum("hl,hld->hd", torch.softmax(s, -1), vf))
        del kf, vf, s
    return torch.stack(out)


def bench_kvcache(op, ctx, tally, flashinfer):
    b, hq, hkv, d, page, dt = 8, 32, 8, 128, 16, "fp16"
    dtype = dtype_of(dt)
    lengths = [ctx] * b
    case = f"{op} {dt} B{b} ctx{ctx} Hq{hq} Hkv{hkv} D{d} page{page}"
    params = {"op": op, "B": b, "Hq": hq, "Hkv": hkv, "D": d, "ctx": ctx, "page": page, "dtype": dt, "mixed": False}
    indptr, indices, last, num_pages = kv_layout(lengths, page)
    gen = torch.Generator(device="cuda").manual_seed(0x5EED)
    cache = tessera.PagedKVCache(num_pages, page, hkv, d, dtype)
    kv = cache.kv_cache()
    kv.copy_(torch.randn(kv.shape, device="cuda", dtype=torch.float32, generator=gen).to(dtype))
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")  # noqa: E731
    kv_bytes = sum(lengths) * hkv * d * 2 * dtype.itemsize
    out_rows = []

    def emit(r):
        common.log_row(r)
        out_rows.append(r)

    if op == "decode":
        q = torch.randn((b, hq, d), device="cuda", dtype=torch.float32, generator=gen).to(dtype)
        k, v = gather_kv(kv, indptr, indices, lengths)
        ref = decode_reference(q, k, v)
        impls = []

        def tessera_run():
            w = tessera.BatchDecodeWithPagedKVCacheWrapper()
            w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype, kv_data_type=dtype)
            w.run(q, cache)  # builds the device tables (outside the timing)
            return lambda _: w.run(q, cache)

        impls.append(("tessera-py", tessera_run))
        if flashinfer is not None:
            def fi_run():
                ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
                w.plan(i32(indptr), i32(indices), i32(last), hq, hkv, d, page, pos_encoding_mode="NONE",
                       q_data_type=dtype, kv_data_type=dtype)
                return lambda _: w.run(q, kv)

            impls.append(("flashinfer", fi_run))
        for be in ("flash", "cudnn"):
            impls.append((f"torch-{be}-gqa", (lambda be: lambda: lambda _: sdpa(be, q[:, None], k, v, False)[:, 0])(be)))
        for impl, make in impls:
            try:
                fn = make()
                ms = time_ms(fn, [None])
                extra = common.peak_extra_mib(lambda: fn(None))
                r = row(case, params, impl, ms=ms, gbps=kv_bytes / (ms * 1e-3) / 1e9,
                        tflops=4.0 * sum(lengths) * hq * d / (ms * 1e-3) / 1e12, extra_mib=extra)
                if impl.startswith("torch-"):
                    r["note"] = "SDPA over K/V gathered into contiguous [B, ctx, Hkv, D] tensors outside the timing"
                with_errors(r, fn(None), ref, BUDGET[dt], tally if impl == "tessera-py" else None)
            except Exception as e:
                r = row(case, params, impl, error=common.error_text(e))
                if impl == "tessera-py":
                    tally["failed"] += 1
            emit(r)
        del k, v
    else:  # append of one token per sequence (the tables include it)
        pos = [n - 1 for n in lengths]
        page_ids = torch.tensor([indices[indptr[i] + p // page] for i, p in enumerate(pos)], dtype=torch.long,
                                device="cuda")
        offsets = torch.tensor([p % page for p in pos], dtype=torch.long, device="cuda")
        nk = torch.randn((b, hkv, d), device="cuda", dtype=torch.float32, generator=gen).to(dtype)
        nv = torch.randn((b, hkv, d), device="cuda", dtype=torch.float32, generator=gen).to(dtype)
        impls = []

        def tessera_append():
            w = tessera.BatchDecodeWithPagedKVCacheWrapper()
            w.plan(indptr, indices, last, hq, hkv, d, page)
            w.append(nk, nv, cache)  # builds the device tables (outside the timing)
            return lambda _: w.append(nk, nv, cache)

        def tessera_fi_form():
            args = (list(range(b)), pos, cache, indices, indptr, last)
            return lambda _: tessera.append_paged_kv_cache(nk, nv, *args)

        impls += [("tessera-py", tessera_append), ("tessera-py-fi", tessera_fi_form)]
        if flashinfer is not None:
            def fi_append():
                bi, ps, ip, ix, lp = i32(list(range(b))), i32(pos), i32(indptr), i32(indices), i32(last)
                return lambda _: flashinfer.append_paged_kv_cache(nk, nv, bi, ps, kv, ix, ip, lp, "NHD")

            impls.append(("flashinfer", fi_append))

        def torch_index():
            def run(_):
                kv[page_ids, 0, offsets] = nk
                kv[page_ids, 1, offsets] = nv

            return run

        impls.append(("torch-index", torch_index))
        nbytes = b * hkv * d * 2 * dtype.itemsize
        for impl, make in impls:
            try:
                fn = make()
                ms = time_ms(fn, [None])
                extra = common.peak_extra_mib(lambda: fn(None))
                kv[page_ids, 0, offsets] = 0
                kv[page_ids, 1, offsets] = 0
                fn(None)
                ok = torch.equal(kv[page_ids, 0, offsets], nk) and torch.equal(kv[page_ids, 1, offsets], nv)
                r = row(case, params, impl, ms=ms, gbps=nbytes / (ms * 1e-3) / 1e9, extra_mib=extra)
                r["max_abs_err"], r["rel_l2"] = (0.0, 0.0) if ok else (None, None)
                if impl.startswith("tessera-py"):
                    tally["passed" if ok else "failed"] += 1
                if not ok:
                    r["note"] = "the slots read back differ from the appended K/V"
                if impl == "tessera-py-fi":
                    r["note"] = "FlashInfer's signature; index arguments as CPU lists, checked on the host every call"
            except Exception as e:
                r = row(case, params, impl, error=common.error_text(e))
                if impl.startswith("tessera-py"):
                    tally["failed"] += 1
            emit(r)
    del cache, kv
    torch.cuda.empty_cache()
    return out_rows


# -- gemm and sparse (--ops gemm,sparse; not in the default list) -----------------------------

# (M, N, K, weight stored [N, K] and read as w.t(), bias + activation)
GEMM_CASES = [
    (4096, 4096, 4096, False, None),
    (8192, 8192, 8192, False, None),
    (4096, 4096, 4096, True, "gelu"),
    (1, 4096, 4096, True, None),
    (16, 11008, 4096, True, "silu"),
    (512, 11008, 4096, True, "silu"),
]
GEMM_ACTS = {None: lambda t: t, "gelu": lambda t: F.gelu(t), "silu": lambda t: F.silu(t)}


def bench_gemm(m, n, k, weight, act, dt, tally):
    """tessera.matmul against torch (mm, or F.linear + the activation: two kernels) on the same
    operands, checked against a float32 product."""
    case = f"gemm {dt} {m}x{n}x{k}" + (" w.t()" if weight else "") + (f" bias+{act}" if act else "")
    params = {"M": m, "N": n, "K": k, "dtype": dt, "b_layout": "col" if weight else "row", "activation": act,
              "bias": act is not None}
    dtype = dtype_of(dt)
    gen = torch.Generator(device="cuda").manual_seed(0x6E33)
    nbytes = (m * k + k * n) * dtype.itemsize
    xs = [torch.randn((m, k), device="cuda", dtype=dtype, generator=gen) for _ in range(rotation_count(nbytes))]
    w = torch.randn((n, k) if weight else (k, n), device="cuda", dtype=dtype, generator=gen) * k**-0.5
    b = w.t() if weight else w
    bias = torch.randn(n, device="cuda", dtype=dtype, generator=gen) if act else None
    ref = GEMM_ACTS[act](xs[0].float() @ b.float() + (bias.float() if bias is not None else 0))
    impls = [
        ("tessera-py", lambda x: tessera.matmul(x, b, bias=bias, activation=act)),
        ("torch", (lambda x: GEMM_ACTS[act](F.linear(x, w, bias))) if weight else (lambda x: torch.mm(x, b))),
    ]
    out = []
    for impl, fn in impls:
        try:
            ms = time_ms(fn, xs)
            r = row(case, params, impl, ms=ms, tflops=2.0 * m * n * k / (ms * 1e-3) / 1e12,
                    extra_mib=common.peak_extra_mib(lambda: fn(xs[0])))
            with_errors(r, fn(xs[0]), ref, BUDGET[dt], tally if impl == "tessera-py" else None)
        except Exception as e:
            r = row(case, params, impl, error=common.error_text(e))
            if impl == "tessera-py":
                tally["failed"] += 1
        common.log_row(r)
        out.append(r)
    return out


# (rows, cols, nonzeros per row)
SPARSE_CASES = [(1 << 20, 1 << 20, 16), (1 << 22, 1 << 18, 8), (1 << 16, 1 << 16, 512)]


def bench_sparse(rows, cols, per_row, dt, tally):
    """A @ x and A.T @ y of tessera.sparse.csr_matrix against torch's CSR (cuSPARSE) on the same
    random matrix; gbps counts the CSR arrays and the two vectors once."""
    dtype = {"fp32": torch.float32, "fp64": torch.float64}[dt]
    gen = torch.Generator(device="cuda").manual_seed(0x5A125)
    nnz = rows * per_row
    r_idx = torch.arange(rows, device="cuda").repeat_interleave(per_row)
    c_idx = torch.randint(0, cols, (nnz,), device="cuda", generator=gen)
    vals = torch.randn(nnz, device="cuda", dtype=dtype, generator=gen)
    ts = torch.sparse_coo_tensor(torch.stack([r_idx, c_idx]), vals, (rows, cols)).coalesce().to_sparse_csr()
    del r_idx, c_idx, vals
    A = tessera.sparse.csr_matrix(ts)
    stored = A.nnz
    idx = 4 if A.index_dtype == "int32" else 8
    out = []
    for op in ("A @ x", "A.T @ y"):
        n_in, n_out = (cols, rows) if op == "A @ x" else (rows, cols)
        case = f"spmv {dt} {rows}x{cols} {per_row}/row {op}"
        params = {"rows": rows, "cols": cols, "nnz": stored, "dtype": dt, "op": op}
        x = torch.randn(n_in, device="cuda", dtype=dtype, generator=gen)
        nbytes = stored * (dtype.itemsize + idx) + (rows + 1) * idx + (n_in + n_out) * dtype.itemsize
        ref = (ts @ x.unsqueeze(1)).squeeze(1) if op == "A @ x" else None
        tst = None
        if op == "A.T @ y":
            tst = ts.t().to_sparse_csr()
            ref = (tst @ x.unsqueeze(1)).squeeze(1)
        impls = [
            ("tessera-py", (lambda v: A @ v) if op == "A @ x" else (lambda v: A.T @ v)),
            ("torch", (lambda v: ts @ v) if op == "A @ x" else (lambda v: tst @ v)),
        ]
        for impl, fn in impls:
            try:
                ms = time_ms(fn, [x])
                r = row(case, params, impl, ms=ms, gbps=nbytes / (ms * 1e-3) / 1e9)
                with_errors(r, fn(x).reshape(-1), ref, 1e-5 if dt == "fp32" else 1e-12,
                            tally if impl == "tessera-py" else None)
            except Exception as e:
                r = row(case, params, impl, error=common.error_text(e))
                if impl == "tessera-py":
                    tally["failed"] += 1
            common.log_row(r)
            out.append(r)
    return out


# -- host overhead ---------------------------------------------------------------------------


def host_overhead_rows(calls=2000):
    """Wall-clock time per call of back-to-back calls on shapes whose GPU work is a few us."""
    out = []
    x = torch.randn(1, 128, device="cuda", dtype=torch.float16)
    q = torch.randn(1, 1, 8, 128, device="cuda", dtype=torch.float16)
    kv = torch.randn(1, 128, 8, 128, device="cuda", dtype=torch.float16)
    cases = [
        ("host overhead softmax fp16 1x128", {"rows": 1, "cols": 128, "dtype": "fp16", "op": "softmax", "timing": "host"},
         [("tessera-py", lambda: tessera.softmax(x)), ("torch", lambda: torch.softmax(x, dim=-1))]),
        ("host overhead attention fp16 B1 H8 Nq1 Nk128 D128",
         {"B": 1, "Hq": 8, "Hkv": 8, "N": 1, "Nk": 128, "D": 128, "causal": True, "dtype": "fp16", "varlen": False,
          "timing": "host"},
         [("tessera-py", lambda: tessera.flash_attn_func(q, kv, kv, causal=True)),
          ("torch-flash", lambda: sdpa("flash", q, kv, kv, False)),
          ("torch-efficient", lambda: sdpa("efficient", q, kv, kv, False))]),
    ]
    for case, params, impls in cases:
        for impl, fn in impls:
            try:
                for _ in range(50):
                    fn()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                host = (time.perf_counter() - t0) / calls
                torch.cuda.synchronize()
                r = row(case, params, impl, ms=host * 1e3, note=f"wall clock per call, {calls} calls back to back, "
                        "before the final synchronize")
            except Exception as e:
                r = row(case, params, impl, error=common.error_text(e))
            common.log_row(r)
            out.append(r)
    return out


# ---------------------------------------------------------------------------------------------


def commit():
    c = os.environ.get("TESSERA_COMMIT")
    if c:
        return c
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"


def main(argv=None):
    global torch, tessera, F
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", required=True, metavar="OUTDIR", help="folder for python.json")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--ops", default="softmax,attention,kvcache,host",
                    help="comma list of softmax, attention, kvcache, host, gemm, sparse (the last two: opt-in)")
    ap.add_argument("--flashinfer", action="store_true", help="FlashInfer fa2 on single-sequence cases")
    args = ap.parse_args(argv)
    os.makedirs(args.json, exist_ok=True)
    out_path = os.path.join(args.json, "python.json")
    torch = common.import_torch("bench_python", out_path)
    if torch is None:
        return 1
    F = torch.nn.functional
    import tessera as _tessera  # noqa: PLC0415

    tessera = _tessera
    if not tessera.is_available():
        common.write_json(out_path, {"missing": "tessera cannot use the GPU here"})
        log("bench_python: tessera cannot use the GPU here")
        return 1
    flashinfer = None
    if args.flashinfer:
        try:
            import flashinfer  # noqa: PLC0415
        except Exception as e:
            log(f"bench_python: flashinfer not importable: {e}")
    ops = set(args.ops.split(","))
    gpu = torch.cuda.get_device_name()
    info = tessera.device_info()
    log(f"bench_python: torch {torch.__version__}, tessera {tessera.__version__} ({info['arch']}, NVRTC "
        f"{info['nvrtc_version']}), {gpu}")
    result = {
        "gpu": gpu,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit(),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "roofline": rooflines(),
        "rows": [],
        "verify": {"passed": 0, "failed": 0},
    }
    tally = result["verify"]
    common.torch = torch  # bench_common's helpers use its module global
    if "softmax" in ops:
        for c in softmax_cases(args.quick):
            rs = bench_softmax(*c, tally)
            for r in rs:
                common.log_row(r)
            result["rows"] += rs
            torch.cuda.empty_cache()
    if "attention" in ops:
        for c in attention_cases(args.quick):
            result["rows"] += bench_attention(*c, tally, flashinfer)
    if "kvcache" in ops:
        for c in kvcache_cases(args.quick):
            result["rows"] += bench_kvcache(*c, tally, flashinfer)
    if "gemm" in ops:
        for c in GEMM_CASES[:3] if args.quick else GEMM_CASES:
            for dt in ("bf16", "fp16"):
                result["rows"] += bench_gemm(*c, dt, tally)
                torch.cuda.empty_cache()
    if "sparse" in ops:
        for c in SPARSE_CASES[:1] if args.quick else SPARSE_CASES:
            for dt in ("fp32", "fp64"):
                result["rows"] += bench_sparse(*c, dt, tally)
                torch.cuda.empty_cache()
    if "host" in ops:
        result["rows"] += host_overhead_rows()
    result["tessera"] = tessera.__version__
    result["torch"] = torch.__version__
    result["plan_cache"] = tessera.plan_cache_info()
    common.write_json(out_path, result)
    log(f"bench_python: {len(result['rows'])} rows, verify {tally['passed']} passed, {tally['failed']} failed -> {out_path}")
    return 0 if tally["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
