#!/usr/bin/env python3
"""KV-cache baselines (FlashInfer paged decode and append, torch SDPA on a contiguous cache,
torch indexed stores) for `tessera bench kvcache --baselines`.

Invoked by the tessera CLI on the GPU machine (the contract is in bench_common.py):

    python3 scripts/baselines/bench_kvcache.py --op kvcache --cases CASES.json --out OUT.json
        [--impls LIST]

Params of a case: {"op": "decode" | "append", "B", "Hq", "Hkv", "D", "ctx", "page",
"dtype": "fp16" | "bf16" | "fp8", "mixed": bool} and, when "mixed" is true, "lengths": one int
per sequence (B = len(lengths), ctx = max(lengths)). ctx_b is the length of sequence b
including its newest token (decode: the query token's key; append: the appended token). dtype
is the KV cache's; with "fp8" (float8_e4m3fn) the query and output are fp16.

Paged layout (FlashInfer's, "NHD"): cache [P, 2, page, Hkv, D] (cache[:, 0] keys, cache[:, 1]
values); sequence b owns pages indices[indptr[b]:indptr[b+1]] (ceil(ctx_b / page) of them) and
its last page holds last_page_len[b] = (ctx_b - 1) % page + 1 tokens (1..page); token t of b is
at cache[indices[indptr[b] + t // page], :, t % page]. The pool is just big enough (P = total
pages) and the page indices are a random permutation of it (non-contiguous, as in a server).

Impls (rows in this order, one per case and impl selected that applies to the case's op):
 decode (one query token per sequence, q [B, Hq, D]):
  flashinfer            BatchDecodeWithPagedKVCacheWrapper(workspace 128 MiB (zeros), "NHD");
                        .plan(indptr, indices, last_page_len, Hq, Hkv, D, page,
                        pos_encoding_mode="NONE", q_data_type=..., kv_data_type=...) once per
                        case outside the timing (as a serving engine per batch); timed
                        .run(q, cache). fp8: no k_scale/v_scale passed (FlashInfer's default
                        1.0; the row's note says so).
  torch-cudnn-gqa       F.scaled_dot_product_attention(q [B, Hq, 1, D], k/v [B, Hkv, ctx, D],
  torch-flash-gqa       enable_gqa=True) on a contiguous cache under sdpa_kernel(CUDNN_ATTENTION
                        / FLASH_ATTENTION).
  torch-flash-expanded  the same with k/v expanded to Hq heads (repeat_interleave outside the
                        timing; the copies are not in extra_mib), FLASH_ATTENTION, no enable_gqa.
                        The torch impls run only when every sequence has the same length and the
                        dtype is fp16/bf16 (torch has no paged/varlen decode and no fp8 SDPA);
                        otherwise a "missing" row says why.
 append (one new token per sequence, k/v [B, Hkv, D] in the cache dtype):
  flashinfer            append_paged_kv_cache(k, v, batch_indices, positions, cache, indices,
                        indptr, last_page_len, "NHD"); the page table includes the new token,
                        batch_indices = [0..B), positions[b] = ctx_b - 1, from
                        flashinfer.get_batch_indices_positions(arange(B+1), ctx, B) outside the
                        timing (computed by hand, with a note, when that helper fails).
  torch-index           cache[page_ids, 0, offsets] = k; cache[page_ids, 1, offsets] = v with
                        precomputed int64 page_ids = indices[indptr[b] + (ctx_b-1) // page],
                        offsets = (ctx_b-1) % page (fp8: on uint8 views of the same bytes).

Formulas. decode: gbps = KV bytes / t with KV bytes = sum_b ctx_b * Hkv * D * 2 (K and V) *
bytes per element (1 for fp8), q and o ignored, for every impl (torch-flash-expanded too: the
bytes a GQA decode must read, not the expanded copies); tflops = 4 * sum_b ctx_b * Hq * D / t
(QK^T and PV, 2 flops per multiply-add). append: gbps = B * Hkv * D * 2 * bytes per element / t
(bytes written), tflops null. extra_mib: peak device memory of one call beyond what was
allocated before it (bench_common.peak_extra_mib); for flashinfer decode the call includes
creating the wrapper and plan(), so the 128 MiB workspace counts (as bench_attention.py).

Correctness, checked on every case before the timing (not timed): decode rows carry
max_abs_err / rel_l2 of their output against a float64 reference computed with torch from the
same data (the paged cache gathered into contiguous K/V per sequence, softmax(q k^T / sqrt(D))
v; the torch rows' first input set is that same gathered data); a rel_l2 above REL_L2_TOL (fp16 2e-3, bf16 1.6e-2 = the same 2 units of epsilon at bf16's
precision, fp8 6e-2) adds a note. Append rows carry the error of the slots read back at the
hand-computed (page, offset) after one call with fresh data (0 when the impl wrote where this
runner's layout says).

Timing: bench_common.time_ms (warm-up, CUDA events, median of 7 group means). The inputs rotate
over bench_common.rotation_count(bytes of one input set) sets, so rotation only happens when
one set is smaller than 2x L2 (a decode cache of 4K tokens at B=8 Hkv=8 D=128 fp16 is already
128 MiB), further capped so that the sets use at most MEM_FRACTION of the free device memory
(torch.cuda.mem_get_info); when not even one set fits the row is "missing". Append moves a few
KiB per call (launch-bound): its k/v rotate over up to 64 sets, its cache is one. All inputs are
random normal (fp8: random normal cast to float8_e4m3fn).

FlashInfer: each (q dtype, kv dtype, D) decode configuration and the append module JIT-compile
with nvcc on their first call (decode: well under a minute); that call is a warm-up outside the
timing, its duration goes to stderr and to OUT.json's "flashinfer_jit". Its JIT cache lives
under $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer (default $HOME); scripts/device-run.sh points
it into the bundle. When flashinfer is not importable its rows are "missing" with the reason.

Environment default for the option (the CLI passes none): TESSERA_BASELINE_IMPLS.
"""

import argparse
import math
import os
import random
import re
import sys
import time
import warnings

import bench_common as common
from bench_common import error_text, log, row

torch = None  # set in main() (bench_common.import_torch)
flashinfer = None  # set in main() when importable
flashinfer_missing = None  # why flashinfer cannot run, when it cannot

# impl -> (SDPBackend name, enable_gqa)
TORCH_DECODE = {
    "torch-cudnn-gqa": ("CUDNN_ATTENTION", True),
    "torch-flash-gqa": ("FLASH_ATTENTION", True),
    "torch-flash-expanded": ("FLASH_ATTENTION", False),
}
DECODE_IMPLS = ["flashinfer"] + list(TORCH_DECODE)
APPEND_IMPLS = ["flashinfer", "torch-index"]
IMPLS = ["flashinfer", "torch-cudnn-gqa", "torch-flash-gqa", "torch-flash-expanded",
         "torch-index"]
OP_IMPLS = {"decode": DECODE_IMPLS, "append": APPEND_IMPLS}

ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "fp8": 1}
REL_L2_TOL = {"fp16": 2e-3, "bf16": 1.6e-2, "fp8": 6e-2}
FLASHINFER_WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace
JIT_SECONDS = 5.0  # a first call this long compiled; a shorter one loaded a cached module
MEM_FRACTION = 0.8  # input sets use at most this fraction of the free device memory
FP8_FILL_CHUNK = 64 * 1024 * 1024  # elements per fp16 chunk when filling an fp8 cache
SEED = 0x4B5C
FP8_NOTE = ("fp8 e4m3 KV cache (random normal cast to float8_e4m3fn), q and output fp16; "
            "k_scale/v_scale not passed (FlashInfer's default 1.0)")
EXPANDED_NOTE = ("K/V expanded to {hq} heads by repeat_interleave outside the timing "
                 "({mib:.0f} MiB of copies, not in extra_mib); gbps counts the {hkv}-head KV bytes")


class Case:
    """A case's params, checked. lengths: ctx_b per sequence."""

    def __init__(self, params):
        def get_int(name):
            v = params.get(name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"params[{name!r}] = {v!r}: expected a positive integer")
            return v

        self.op = params.get("op")
        if self.op not in OP_IMPLS:
            raise ValueError(f"params['op'] = {self.op!r}: expected 'decode' or 'append'")
        self.B = get_int("B")
        self.Hq = get_int("Hq")
        self.Hkv = get_int("Hkv")
        self.D = get_int("D")
        self.ctx = get_int("ctx")
        self.page = get_int("page")
        if self.Hq % self.Hkv:
            raise ValueError(f"Hq = {self.Hq} is not a multiple of Hkv = {self.Hkv}")
        self.dtype = params.get("dtype")
        if self.dtype not in ELEMENT_BYTES:
            raise ValueError(f"dtype {self.dtype!r}: expected fp16, bf16 or fp8")
        mixed = params.get("mixed", False)
        if not isinstance(mixed, bool):
            raise ValueError(f"params['mixed'] = {mixed!r}: expected true or false")
        self.mixed = mixed
        if mixed:
            lengths = params.get("lengths")
            if not isinstance(lengths, list) or not lengths:
                raise ValueError("a mixed case needs params['lengths']: one int per sequence")
            for n in lengths:
                if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                    raise ValueError(f"lengths entry {n!r}: expected a positive integer")
            if len(lengths) != self.B:
                raise ValueError(f"{len(lengths)} lengths for B = {self.B}")
            if max(lengths) != self.ctx:
                raise ValueError(f"ctx = {self.ctx} is not max(lengths) = {max(lengths)}")
            self.lengths = list(lengths)
        else:
            self.lengths = [self.ctx] * self.B
        self.elt = ELEMENT_BYTES[self.dtype]

    @property
    def uniform(self):
        return len(set(self.lengths)) == 1

    @property
    def group(self):
        return self.Hq // self.Hkv

    def kv_bytes(self):
        """Decode: bytes of K and V read (all sequences)."""
        return sum(self.lengths) * self.Hkv * self.D * 2 * self.elt

    def decode_flops(self):
        return 4.0 * sum(self.lengths) * self.Hq * self.D

    def append_bytes(self):
        """Append: bytes of K and V written (one token per sequence)."""
        return self.B * self.Hkv * self.D * 2 * self.elt

    def cache_bytes(self, num_pages):
        return num_pages * 2 * self.page * self.Hkv * self.D * self.elt

    def q_bytes(self):
        return self.B * self.Hq * self.D * 2  # fp16/bf16 (fp16 with an fp8 cache)

    def reference_bytes(self):
        """Transient memory of reference_decode: one sequence's pages gathered (rounded up to
        whole pages), its K/V in float64 and a permuted copy einsum may make, plus the output."""
        n = self.ctx + self.page
        return n * self.Hkv * self.D * 2 * (self.elt + 16) + self.B * self.Hq * self.D * 4


def gbps(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


# ---------------------------------------------------------------------------------------------
# paged layout (pure Python)


class Layout:
    """Page table of a pool just big enough for `lengths`, pages in random order."""

    def __init__(self, lengths, page, seed=SEED):
        self.page = page
        self.lengths = list(lengths)
        self.pages = [(n + page - 1) // page for n in lengths]
        self.indptr = [0]
        for p in self.pages:
            self.indptr.append(self.indptr[-1] + p)
        self.num_pages = self.indptr[-1]
        self.indices = list(range(self.num_pages))
        random.Random(seed).shuffle(self.indices)
        self.last_page_len = [(n - 1) % page + 1 for n in lengths]

    def slot(self, b, t):
        """(page index in the pool, offset in the page) of token t of sequence b."""
        return self.indices[self.indptr[b] + t // self.page], t % self.page

    def append_slots(self):
        """(page_ids, offsets, positions) of each sequence's newest token."""
        page_ids, offsets, positions = [], [], []
        for b, n in enumerate(self.lengths):
            p, o = self.slot(b, n - 1)
            page_ids.append(p)
            offsets.append(o)
            positions.append(n - 1)
        return page_ids, offsets, positions


# ---------------------------------------------------------------------------------------------
# device helpers


def dtypes(case):
    """(q/output dtype, KV cache dtype) of a case."""
    if case.dtype == "fp8":
        return torch.float16, torch.float8_e4m3fn
    t = common.torch_dtype(case.dtype)
    return t, t


def free_bytes():
    torch.cuda.empty_cache()  # memory torch caches but does not use counts as free
    return torch.cuda.mem_get_info()[0]


def memory_guard(need, what):
    """Why `need` bytes cannot be allocated now, or None."""
    free = free_bytes()
    if need > MEM_FRACTION * free:
        return (f"needs {need / 2**30:.2f} GiB for {what}; {free / 2**30:.2f} GiB free "
                f"(uses at most {MEM_FRACTION:.0%})")
    return None


def extra_sets(set_bytes, have=1):
    """How many more input sets to allocate for the rotation (bench_common.rotation_count in
    total), as many as fit in MEM_FRACTION of the free memory."""
    want = max(0, common.rotation_count(set_bytes) - have)
    if want == 0:
        return 0
    return max(0, min(want, int(MEM_FRACTION * free_bytes() // max(1, set_bytes))))


def randn(shape, dtype, gen):
    """Random normal tensor; fp8 filled from fp16 in chunks (torch.randn has no fp8)."""
    if dtype != torch.float8_e4m3fn:
        return torch.randn(shape, device="cuda", dtype=dtype, generator=gen)
    out = torch.empty(shape, device="cuda", dtype=dtype)
    flat = out.view(-1)
    n = flat.numel()
    for s in range(0, n, FP8_FILL_CHUNK):
        e = min(n, s + FP8_FILL_CHUNK)
        flat[s:e] = torch.randn(e - s, device="cuda", dtype=torch.float16, generator=gen).to(dtype)
    return out


def device_int(values, dtype):
    return torch.tensor(values, dtype=dtype, device="cuda")


def compare(out, ref):
    """(max_abs_err, rel_l2) of out against ref in float32; None, None when not finite."""
    o = out.float().reshape(ref.shape)
    r = ref.float()
    d = o - r
    max_abs = d.abs().max().item()
    rel = (d.norm() / r.norm().clamp_min(1e-30)).item()
    if not (math.isfinite(max_abs) and math.isfinite(rel)):
        return None, None
    return max_abs, rel


def as_indexable(t):
    """t, or its uint8 view when it is fp8 (torch's indexing kernels need not take float8);
    undo with .view(t.dtype)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def gather_sequence(cache, layout, b, idx64):
    """Sequence b's K and V from the paged cache, contiguous [ctx_b, Hkv, D]."""
    n = layout.lengths[b]
    src = as_indexable(cache)
    pages = src[idx64[layout.indptr[b]:layout.indptr[b + 1]]]  # [pages_b, 2, page, Hkv, D]
    hkv, d = cache.shape[3], cache.shape[4]
    k = pages[:, 0].reshape(-1, hkv, d)[:n].view(cache.dtype)
    v = pages[:, 1].reshape(-1, hkv, d)[:n].view(cache.dtype)
    return k, v


def reference_decode(q, cache, layout, idx64):
    """Decode attention [B, Hq, D] (float32) from the paged cache, computed in float64 (no TF32
    whatever torch's matmul precision settings): softmax(q k^T / sqrt(D)) v per sequence, query
    head h reading KV head h // (Hq / Hkv) (FlashInfer's and enable_gqa's grouping)."""
    B, Hq, D = q.shape
    hkv = cache.shape[3]
    out = torch.empty((B, Hq, D), device="cuda", dtype=torch.float32)
    for b in range(B):
        k, v = gather_sequence(cache, layout, b, idx64)
        k, v = k.double(), v.double()
        qb = q[b].double().reshape(hkv, Hq // hkv, D)
        s = torch.einsum("hgd,nhd->hgn", qb, k) / math.sqrt(D)
        p = torch.softmax(s, dim=-1)
        out[b] = torch.einsum("hgn,nhd->hgd", p, v).reshape(Hq, D).float()
        del k, v, s, p
    return out


def contiguous_kv(cache, layout, idx64):
    """The paged cache of a uniform batch as contiguous k, v [B, Hkv, ctx, D]."""
    B, n = len(layout.lengths), layout.lengths[0]
    hkv, d = cache.shape[3], cache.shape[4]
    k = torch.empty((B, hkv, n, d), device="cuda", dtype=cache.dtype)
    v = torch.empty((B, hkv, n, d), device="cuda", dtype=cache.dtype)
    for b in range(B):
        kb, vb = gather_sequence(cache, layout, b, idx64)
        k[b] = kb.transpose(0, 1)
        v[b] = vb.transpose(0, 1)
    return k, v


def expand_heads(x, group):
    """[B, Hkv, L, D] -> [B, Hkv * group, L, D], KV head j serving query heads j*group.."""
    return x.repeat_interleave(group, dim=1)


def read_slots(cache, page_ids, offsets):
    """(k, v) [B, Hkv, D] stored at (page_ids[b], offsets[b])."""
    src = as_indexable(cache)
    return (src[page_ids, 0, offsets].view(cache.dtype),
            src[page_ids, 1, offsets].view(cache.dtype))


def set_errors(r, errs, tol=None, what="the float64 torch reference"):
    """Puts (max_abs_err, rel_l2) into row r; a note when not finite or above tol."""
    max_abs, rel = errs
    r["max_abs_err"], r["rel_l2"] = max_abs, rel
    if rel is None:
        add_note(r, f"output not finite (NaN/Inf) against {what}")
    elif tol is not None and rel > tol:
        add_note(r, f"rel_l2 {rel:.2e} against {what} is above {tol:.0e}: this baseline may "
                    "not compute the same thing")
    return r


def add_note(r, text):
    r["note"] = text if not r.get("note") else r["note"] + "; " + text


# ---------------------------------------------------------------------------------------------
# FlashInfer


class FlashInferState:
    """JIT bookkeeping across cases: first calls done (seconds) or failed, and the log for
    OUT.json's "flashinfer_jit"."""

    def __init__(self):
        self.ready = {}
        self.failed = {}
        self.log = []

    def first_call(self, key, fn):
        """Runs fn() once per key outside the timing (JIT compile or cache load); returns the
        error text when it failed (then and for later cases of that key), else None."""
        if key in self.failed:
            return self.failed[key]
        if key in self.ready:
            return None
        t0 = time.perf_counter()
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as e:
            err = error_text(e)
            self.failed[key] = err
            self.log.append({"config": list(key), "seconds": None, "error": err})
            log(f"  flashinfer: first call of {key} FAILED after "
                f"{time.perf_counter() - t0:.1f} s: {err}")
            return err
        secs = time.perf_counter() - t0
        self.ready[key] = secs
        self.log.append({"config": list(key), "seconds": round(secs, 2)})
        how = "JIT compile" if secs >= JIT_SECONDS else "loaded, no compile"
        log(f"  flashinfer: first call of {key} ({how}; not timed) {secs:.1f} s")
        return None


def bench_flashinfer_decode(case, params, c, layout, base, ref, gen, fi_state):
    impl = "flashinfer"
    q_dtype, kv_dtype = dtypes(c)
    indptr = device_int(layout.indptr, torch.int32)
    indices = device_int(layout.indices, torch.int32)
    last = device_int(layout.last_page_len, torch.int32)
    note = FP8_NOTE if c.dtype == "fp8" else None

    def setup():
        ws = torch.zeros(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(indptr, indices, last, c.Hq, c.Hkv, c.D, c.page, pos_encoding_mode="NONE",
               q_data_type=q_dtype, kv_data_type=kv_dtype)
        return (w, ws)

    def run(state, s):
        return state[0].run(s[0], s[1])

    key = ("batch_decode", str(q_dtype).replace("torch.", ""),
           str(kv_dtype).replace("torch.", ""), c.D)
    err = fi_state.first_call(key, lambda: run(setup(), base))
    if err is not None:
        return row(case, params, impl, error=err, note=note)
    try:
        state = setup()
        errs = compare(run(state, base), ref)
        sets = [base]
        set_bytes = c.cache_bytes(layout.num_pages) + c.q_bytes()
        for _ in range(extra_sets(set_bytes)):
            sets.append((randn((c.B, c.Hq, c.D), q_dtype, gen),
                         randn((layout.num_pages, 2, c.page, c.Hkv, c.D), kv_dtype, gen)))
        ms = common.time_ms(lambda s: run(state, s), sets)
        del sets, state
        torch.cuda.empty_cache()
        # the workspace and plan buffers count: setup inside the measured call
        extra = common.peak_extra_mib(lambda: run(setup(), base))
    except Exception as e:
        torch.cuda.empty_cache()
        return row(case, params, impl, error=error_text(e), note=note)
    r = row(case, params, impl, ms=ms, gbps=gbps(c.kv_bytes(), ms),
            tflops=tflops(c.decode_flops(), ms), extra_mib=extra, note=note)
    return set_errors(r, errs, REL_L2_TOL[c.dtype])


def batch_indices_positions(c, positions):
    """(batch_indices, positions, note) as int32 device tensors: FlashInfer's
    get_batch_indices_positions when it works, else computed by hand (same values: for one
    appended token per sequence, b and ctx_b - 1; flashinfer/triton/page.py)."""
    hand_b = device_int(list(range(c.B)), torch.int32)
    hand_p = device_int(positions, torch.int32)
    try:
        append_indptr = device_int(list(range(c.B + 1)), torch.int32)
        seq_lens = device_int(c.lengths, torch.int32)
        bi, pos = flashinfer.get_batch_indices_positions(append_indptr, seq_lens, c.B)
        torch.cuda.synchronize()
        got_b, got_p = [int(x) for x in bi.tolist()], [int(x) for x in pos.tolist()]
    except Exception as e:
        return hand_b, hand_p, (f"flashinfer.get_batch_indices_positions failed "
                                f"({error_text(e)[:200]}): batch_indices/positions by hand")
    if got_b != list(range(c.B)) or got_p != list(positions):
        return bi, pos, ("flashinfer.get_batch_indices_positions disagrees with this runner's "
                         f"positions (ctx_b - 1): {got_p[:8]} vs {list(positions)[:8]}")
    return bi, pos, None


def bench_flashinfer_append(case, params, c, layout, t, cache, sets, check, fi_state):
    impl = "flashinfer"
    bi, pos, note = batch_indices_positions(c, t["positions_list"])

    def run(s):
        flashinfer.append_paged_kv_cache(s[0], s[1], bi, pos, cache, t["indices"], t["indptr"],
                                          t["last"], "NHD")

    err = fi_state.first_call(("append_paged_kv_cache",), lambda: run(sets[0]))
    if err is not None:
        return row(case, params, impl, error=err, note=note)
    return time_append(case, params, c, impl, run, cache, t, sets, check, note)


# ---------------------------------------------------------------------------------------------
# torch


def torch_decode_guard(c):
    """Why the torch SDPA impls do not run on this case, or None."""
    if c.dtype == "fp8":
        return "torch SDPA takes no fp8 KV cache (torch runs only on fp16/bf16 cases)"
    if not c.uniform:
        return ("torch SDPA has no paged or varlen decode: it runs only when every sequence "
                "has the same length")
    return None


def bench_sdpa(case, params, c, impl, sets, ref, note=None):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend, gqa = TORCH_DECODE[impl]
    F = torch.nn.functional
    kwargs = {"enable_gqa": True} if gqa and c.Hq != c.Hkv else {}

    def fn(s):
        return F.scaled_dot_product_attention(s[0], s[1], s[2], **kwargs)

    try:
        with warnings.catch_warnings(record=True) as caught, \
                sdpa_kernel(getattr(SDPBackend, backend)):
            warnings.simplefilter("always")
            errs = compare(fn(sets[0]), ref)
            ms = common.time_ms(fn, sets)
            extra = common.peak_extra_mib(lambda: fn(sets[0]))
    except Exception as e:
        # a refusing backend raises "No available kernel" and says why in warnings
        why = " | ".join(
            re.sub(r"\s*\(Triggered internally at [^)]*\)", "", str(w.message))
            for w in caught  # noqa: F821 (bound by the with)
        )
        err = error_text(e) + (f" [torch warnings: {why}]" if why else "")
        torch.cuda.empty_cache()
        return row(case, params, impl, error=err if len(err) <= 1200 else err[:1200] + " ...",
                   note=note)
    r = row(case, params, impl, ms=ms, gbps=gbps(c.kv_bytes(), ms),
            tflops=tflops(c.decode_flops(), ms), extra_mib=extra, note=note)
    return set_errors(r, errs, REL_L2_TOL[c.dtype])


def bench_torch_decode(case, params, c, impls, holder, ref, gen):
    """Rows of the torch impls; holder = [(q [B, Hq, 1, D], k, v [B, Hkv, ctx, D])], gathered
    from the paged cache the reference was computed from (taken out of the list, so that this
    function holds the only reference and can free it)."""
    out = {}
    sets = [holder.pop()]
    dtype = sets[0][1].dtype
    n = c.lengths[0]
    qshape, kvshape = (c.B, c.Hq, 1, c.D), (c.B, c.Hkv, n, c.D)
    q_bytes = c.q_bytes()
    gqa_impls = [i for i in impls if TORCH_DECODE[i][1]]
    if gqa_impls:
        for _ in range(extra_sets(q_bytes + c.kv_bytes())):
            sets.append((randn(qshape, dtype, gen), randn(kvshape, dtype, gen),
                         randn(kvshape, dtype, gen)))
        for impl in gqa_impls:
            out[impl] = bench_sdpa(case, params, c, impl, sets, ref)
        del sets[1:]
        torch.cuda.empty_cache()
    impl = "torch-flash-expanded"
    if impl in impls:
        exp_bytes = q_bytes + c.kv_bytes() * c.group
        why = memory_guard(exp_bytes, f"K/V expanded to {c.Hq} heads")
        if why is not None:
            out[impl] = row(case, params, impl, missing=why)
        else:
            q0, k0, v0 = sets.pop()
            e_sets = [(q0, expand_heads(k0, c.group), expand_heads(v0, c.group))]
            del k0, v0
            for _ in range(extra_sets(exp_bytes)):
                k, v = randn(kvshape, dtype, gen), randn(kvshape, dtype, gen)
                e_sets.append((randn(qshape, dtype, gen), expand_heads(k, c.group),
                               expand_heads(v, c.group)))
                del k, v
            note = EXPANDED_NOTE.format(hq=c.Hq, hkv=c.Hkv,
                                        mib=c.kv_bytes() * c.group / common.MIB)
            out[impl] = bench_sdpa(case, params, c, impl, e_sets, ref, note=note)
            del e_sets
    del sets
    torch.cuda.empty_cache()
    return out


def bench_torch_append(case, params, c, layout, t, cache, sets, check):
    impl = "torch-index"
    page_ids, offsets = t["page_ids"], t["offsets"]
    note = None
    target = as_indexable(cache)
    sets = [(as_indexable(k), as_indexable(v)) for k, v in sets]
    check_in = (as_indexable(check[0]), as_indexable(check[1]))
    if c.dtype == "fp8":
        note = "fp8: the indexed stores run on uint8 views of the cache and of k/v (same bytes)"

    def run(s):
        target[page_ids, 0, offsets] = s[0]
        target[page_ids, 1, offsets] = s[1]

    return time_append(case, params, c, impl, run, cache, t, sets, check, note,
                       check_in=check_in)


def time_append(case, params, c, impl, run, cache, t, sets, check, note, check_in=None):
    """Checks that run(check_in) stores `check` at the runner's slots, then times run."""
    try:
        run(check if check_in is None else check_in)
        torch.cuda.synchronize()
        got_k, got_v = read_slots(cache, t["page_ids"], t["offsets"])
        ek, ev = compare(got_k, check[0]), compare(got_v, check[1])
        errs = (None, None) if None in ek + ev else (max(ek[0], ev[0]), max(ek[1], ev[1]))
        ms = common.time_ms(run, sets)
        extra = common.peak_extra_mib(lambda: run(sets[0]))
    except Exception as e:
        torch.cuda.empty_cache()
        return row(case, params, impl, error=error_text(e), note=note)
    r = row(case, params, impl, ms=ms, gbps=gbps(c.append_bytes(), ms), extra_mib=extra,
            note=note)
    return set_errors(r, errs, 0.0, what="the data appended (read back at the runner's slots)")


# ---------------------------------------------------------------------------------------------


def bench_decode(case, params, c, impls, fi_state):
    out = {}
    pending = list(impls)
    if "flashinfer" in pending and flashinfer_missing is not None:
        out["flashinfer"] = row(case, params, "flashinfer", missing=flashinfer_missing)
        pending.remove("flashinfer")
    why = torch_decode_guard(c)
    if why is not None:
        for impl in [i for i in pending if i in TORCH_DECODE]:
            out[impl] = row(case, params, impl, missing=why)
            pending.remove(impl)
    if pending:
        layout = Layout(c.lengths, c.page)
        q_dtype, kv_dtype = dtypes(c)
        need = c.cache_bytes(layout.num_pages) + c.q_bytes() + c.reference_bytes()
        why = memory_guard(need, "one paged KV cache and the reference check")
        if why is not None:
            for impl in pending:
                out[impl] = row(case, params, impl, missing=why)
            pending = []
    if pending:
        gen = torch.Generator(device="cuda").manual_seed(SEED)
        idx64 = device_int(layout.indices, torch.int64)
        q = randn((c.B, c.Hq, c.D), q_dtype, gen)
        cache = randn((layout.num_pages, 2, c.page, c.Hkv, c.D), kv_dtype, gen)
        ref = reference_decode(q, cache, layout, idx64)
        if "flashinfer" in pending:
            out["flashinfer"] = bench_flashinfer_decode(case, params, c, layout, (q, cache), ref,
                                                        gen, fi_state)
            torch.cuda.empty_cache()
        torch_impls = [i for i in pending if i in TORCH_DECODE]
        # the contiguous copy plus one sequence's pages gathered on the way
        why = torch_impls and memory_guard(
            c.kv_bytes() + (c.ctx + c.page) * c.Hkv * c.D * 2 * c.elt,
            "the contiguous K/V (a copy of the paged cache) for torch SDPA")
        if why:
            for impl in torch_impls:
                out[impl] = row(case, params, impl, missing=why)
        elif torch_impls:
            k, v = contiguous_kv(cache, layout, idx64)
            del cache
            holder = [(q.unsqueeze(2), k, v)]
            del q, k, v
            out.update(bench_torch_decode(case, params, c, torch_impls, holder, ref, gen))
    return [out[i] for i in impls]


def bench_append(case, params, c, impls, fi_state):
    out = {}
    pending = list(impls)
    if "flashinfer" in pending and flashinfer_missing is not None:
        out["flashinfer"] = row(case, params, "flashinfer", missing=flashinfer_missing)
        pending.remove("flashinfer")
    layout = Layout(c.lengths, c.page)
    if pending:
        why = memory_guard(c.cache_bytes(layout.num_pages), "the paged KV cache")
        if why is not None:
            for impl in pending:
                out[impl] = row(case, params, impl, missing=why)
            pending = []
    if pending:
        _q_dtype, kv_dtype = dtypes(c)
        gen = torch.Generator(device="cuda").manual_seed(SEED)
        cache = randn((layout.num_pages, 2, c.page, c.Hkv, c.D), kv_dtype, gen)
        page_ids, offsets, positions = layout.append_slots()
        t = {
            "indptr": device_int(layout.indptr, torch.int32),
            "indices": device_int(layout.indices, torch.int32),
            "last": device_int(layout.last_page_len, torch.int32),
            "page_ids": device_int(page_ids, torch.int64),
            "offsets": device_int(offsets, torch.int64),
            "positions_list": positions,
        }
        kv_shape = (c.B, c.Hkv, c.D)
        nsets = common.rotation_count(c.append_bytes())
        sets = [(randn(kv_shape, kv_dtype, gen), randn(kv_shape, kv_dtype, gen))
                for _ in range(nsets)]
        for impl in pending:
            # fresh data per impl: a slot the impl did not write cannot hold it already
            check = (randn(kv_shape, kv_dtype, gen), randn(kv_shape, kv_dtype, gen))
            if impl == "flashinfer":
                out[impl] = bench_flashinfer_append(case, params, c, layout, t, cache, sets,
                                                    check, fi_state)
            else:
                out[impl] = bench_torch_append(case, params, c, layout, t, cache, sets, check)
        del cache, sets
    return [out[i] for i in impls]


def case_impls(params, impls):
    """The selected impls that apply to a case's op (all selected ones if op is invalid)."""
    op = params.get("op") if isinstance(params, dict) else None
    return [i for i in impls if i in OP_IMPLS.get(op, IMPLS)]


def bench_kvcache(case, params, impls, fi_state):
    c = Case(params)
    chosen = case_impls(params, impls)
    if c.op == "decode":
        return bench_decode(case, params, c, chosen, fi_state)
    return bench_append(case, params, c, chosen, fi_state)


def parse_impls(text):
    """Comma list of impl names or prefixes ("torch", "torch-flash", "flashinfer", "all");
    in IMPLS order."""
    chosen = set()
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if item in ("all", "*"):
            chosen.update(IMPLS)
            continue
        match = [i for i in IMPLS if i == item or i.startswith(item + "-")]
        if not match:
            raise SystemExit(f"--impls: unknown impl {item!r} (known: {', '.join(IMPLS)}, "
                             "or torch / flashinfer)")
        chosen.update(match)
    return [i for i in IMPLS if i in chosen]


def import_flashinfer():
    """Sets flashinfer or flashinfer_missing."""
    global flashinfer, flashinfer_missing
    flashinfer, flashinfer_missing = None, None
    try:
        import flashinfer as _fi
    except Exception as e:
        flashinfer_missing = f"flashinfer not importable: {error_text(e)}"
        log(f"bench_kvcache: {flashinfer_missing}")
        return
    flashinfer = _fi
    base = os.environ.get("FLASHINFER_WORKSPACE_BASE", os.path.expanduser("~"))
    log(f"bench_kvcache: flashinfer {getattr(_fi, '__version__', '?')} from "
        f"{os.path.dirname(_fi.__file__)}; JIT cache under {base}/.cache/flashinfer")


def main(argv=None):
    global torch, flashinfer, flashinfer_missing
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--op", required=True, choices=["kvcache"])
    ap.add_argument("--cases", required=True, help="JSON file: list of {case, params}")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--impls", default=os.environ.get("TESSERA_BASELINE_IMPLS", "all"),
                    help=f"comma list of {', '.join(IMPLS)} (or torch, flashinfer, all)")
    args = ap.parse_args(argv)
    impls = parse_impls(args.impls)

    cases = common.load_cases(args.cases)
    torch = common.import_torch("bench_kvcache", args.out)
    if torch is None:
        return 0
    if "flashinfer" in impls:
        import_flashinfer()
    else:
        flashinfer, flashinfer_missing = None, "not selected (--impls)"
    device = torch.cuda.get_device_name()
    log(f"bench_kvcache: torch {torch.__version__}, {device}, {len(cases)} cases, "
        f"impls {','.join(impls)}")
    fi_state = FlashInferState()
    t0 = time.perf_counter()
    rows = common.run_cases(
        cases,
        lambda case, params: bench_kvcache(case, params, impls, fi_state),
        lambda params: case_impls(params, impls),
    )
    log(f"bench_kvcache: {len(rows)} rows in {time.perf_counter() - t0:.1f} s")
    out = {"torch": torch.__version__, "device": device, "rows": rows,
           "flashinfer": getattr(flashinfer, "__version__", None) if flashinfer else None,
           "flashinfer_jit": fi_state.log}
    if flashinfer_missing is not None:
        out["flashinfer_missing"] = flashinfer_missing
    common.write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
