#!/usr/bin/env python3
"""Attention forward baselines (torch SDPA backends, FlashInfer) for `tessera bench attention
--baselines`.

Invoked by the tessera CLI on the GPU machine (the contract is in bench_common.py):

    python3 scripts/baselines/bench_attention.py --op attention --cases CASES.json --out OUT.json
        [--impls LIST] [--flashinfer-all] [--max-jit-configs K]

Params of a case: {"B", "Hq", "Hkv", "N", "D", "causal", "dtype" ("fp16"|"bf16"), "varlen"}
and, when "varlen" is true, "lengths": one entry per sequence, an int (as many queries as keys)
or [n_q, n_k]; B is then the number of sequences and N their maximum. Optional "Nk" (keys per
sequence of a padded batch; default N). A causal mask with n_q != n_k is aligned bottom-right
(FlashAttention >= 2.1), as tessera's. "window" / "softcap" are not run here (error rows).

Impls (rows in this order, one per case and impl selected):
  torch-flash, torch-cudnn, torch-efficient, torch-math
      F.scaled_dot_product_attention(q, k, v, is_causal=...) on q/k/v [B, H, N, D] inside
      sdpa_kernel(SDPBackend.FLASH_ATTENTION | CUDNN_ATTENTION | EFFICIENT_ATTENTION | MATH);
      GQA with enable_gqa=True (a backend that refuses gives an error row). torch has no varlen
      SDPA: a varlen case runs the sequences one after another in one timed call (the row's
      "note" says so). MATH materialises the N x N scores: run only up to N = 16384 and when
      its estimated memory fits in free device memory, else a "missing" row.
  flashinfer-fa3, flashinfer-fa2
      FlashInfer (0.6.12) with backend="fa3" (its FlashAttention-3 kernels) / "fa2", q/k/v
      [N, H, D]: single_prefill_with_kv_cache(q, k, v, causal=..., backend=...) for one
      padded sequence (B = 1); BatchPrefillWithRaggedKVCacheWrapper(workspace 128 MiB, "NHD",
      backend=...).plan(qo_indptr, kv_indptr, Hq, Hkv, D, causal=...) then .run(q, k, v) for
      B > 1 and varlen batches (the workspace, the plan and its buffers count in extra_mib;
      plan() runs once, outside the timing, as a serving engine does per batch).
      Each new (API, backend, dtype, D) configuration JIT-compiles with nvcc on its first call
      (about 76 s for fa3, 16-20 s for fa2 on the H200): that call is a warm-up outside the
      timing and its duration goes to stderr and to OUT.json's "flashinfer_jit". To keep a run
      short, by default FlashInfer runs only the seed table's configuration (single sequence,
      causal, fp16, D = 128); other cases get a "missing" row unless --flashinfer-all; and at
      most --max-jit-configs configurations are compiled per run (a first call that loads a
      cached module, under 5 s, does not count).
      FlashInfer's JIT cache lives under $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer (default
      $HOME); scripts/device-run.sh points it into the bundle.

Timing, rows and the {"missing": reason} answer: bench_common.py. TFLOP/s uses the issue's
convention: causal 2*B*H*N^2*D, non-causal 4*B*H*N^2*D, varlen summed over sequences
(H = Hq; for n_q != n_k, 4*H*D times the visible (query, key) pairs). extra_mib: peak device
memory of one call beyond what was allocated before it (the output included).

Environment defaults for the options (the CLI passes none): TESSERA_BASELINE_IMPLS,
TESSERA_FLASHINFER_ALL=1, TESSERA_FLASHINFER_MAX_JIT.
"""

import argparse
import os
import re
import sys
import time
import warnings

import bench_common as common
from bench_common import error_text, log, row

torch = None  # set in main() (bench_common.import_torch)
flashinfer = None  # set in main() when importable
flashinfer_missing = None  # why flashinfer cannot run, when it cannot

TORCH_IMPLS = {
    "torch-flash": "FLASH_ATTENTION",
    "torch-cudnn": "CUDNN_ATTENTION",
    "torch-efficient": "EFFICIENT_ATTENTION",
    "torch-math": "MATH",
}
FLASHINFER_IMPLS = {"flashinfer-fa3": "fa3", "flashinfer-fa2": "fa2"}
IMPLS = list(TORCH_IMPLS) + list(FLASHINFER_IMPLS)

MATH_MAX_N = 16384
# MATH keeps the fp32 scores, their softmax and casts: ~9.3 bytes per score measured on the
# H200 (74 GiB at B=1 H=32 N=16384); estimate 10 and require 10% headroom
MATH_BYTES_PER_SCORE = 10
FLASHINFER_WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace
DEFAULT_MAX_JIT = 4
JIT_SECONDS = 5.0  # a first call this long compiled; a shorter one loaded a cached module
VARLEN_NOTE = (
    "torch has no varlen SDPA: the sequences run one after another (B=1 each) in one timed call"
)


class Shape:
    """A case's params, checked. seqs: (n_q, n_k) per sequence."""

    def __init__(self, params):
        def get_int(name, default=None):
            v = params.get(name, default)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"params[{name!r}] = {v!r}: expected a positive integer")
            return v

        for name in ("window", "softcap", "window_left", "window_right"):
            if params.get(name) not in (None, False, 0, -1):
                raise ValueError(f"params[{name!r}] = {params[name]!r}: this runner times "
                                 "no window or softcap (only none and causal masks)")
        self.B = get_int("B")
        self.Hq = get_int("Hq")
        self.Hkv = get_int("Hkv", self.Hq)
        self.D = get_int("D")
        if self.Hq % self.Hkv:
            raise ValueError(f"Hq = {self.Hq} is not a multiple of Hkv = {self.Hkv}")
        self.causal = bool(params.get("causal", False))
        self.dtype_name = params.get("dtype", "fp16")
        if self.dtype_name not in ("fp16", "bf16"):
            raise ValueError(f"dtype {self.dtype_name!r}: expected fp16 or bf16")
        self.varlen = bool(params.get("varlen", False))
        if self.varlen:
            lengths = params.get("lengths")
            if not isinstance(lengths, list) or not lengths:
                raise ValueError("a varlen case needs params['lengths']: a list of ints or [n_q, n_k]")
            self.seqs = []
            for x in lengths:
                if isinstance(x, int) and not isinstance(x, bool):
                    nq = nk = x
                elif isinstance(x, (list, tuple)) and len(x) == 2:
                    nq, nk = x
                else:
                    raise ValueError(f"lengths entry {x!r}: expected an int or [n_q, n_k]")
                if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (nq, nk)):
                    raise ValueError(f"lengths entry {x!r}: lengths must be integers >= 0")
                self.seqs.append((nq, nk))
        else:
            n, nk = get_int("N"), get_int("Nk", params.get("N"))
            self.seqs = [(n, nk)] * self.B

    @property
    def n_max(self):
        return max(nq for nq, _ in self.seqs)

    @property
    def single(self):
        """One padded sequence: FlashInfer's single-request API applies."""
        return not self.varlen and self.B == 1

    def flops(self):
        total = 0.0
        for nq, nk in self.seqs:
            if not self.causal:
                pairs = nq * nk
            elif nk >= nq:  # bottom-right aligned: the last query sees every key
                pairs = nq * nk - nq * nq / 2.0
            else:
                pairs = nk * nk / 2.0
            total += 4.0 * self.Hq * self.D * pairs
        return total

    def flashinfer_default(self):
        """The seed table's FlashInfer configuration (always run)."""
        return self.single and self.causal and self.dtype_name == "fp16" and self.D == 128


# ---------------------------------------------------------------------------------------------
# inputs


def make_sets(shape, layout, gen):
    """Input sets for rotation. layout "bhnd": per set a list of (q, k, v) per padded batch (one
    tuple) or per varlen sequence; "nhd": one packed (q, k, v) of [total, H, D]."""
    dtype = common.torch_dtype(shape.dtype_name)
    elem = torch.empty((), dtype=dtype).element_size()
    tq = sum(nq for nq, _ in shape.seqs)
    tk = sum(nk for _, nk in shape.seqs)
    set_bytes = elem * shape.D * (shape.Hq * tq + 2 * shape.Hkv * tk)
    nsets = common.rotation_count(set_bytes)

    def randn(*dims):
        return torch.randn(dims, device="cuda", dtype=dtype, generator=gen)

    sets = []
    for _ in range(nsets):
        if layout == "nhd":
            sets.append((randn(tq, shape.Hq, shape.D), randn(tk, shape.Hkv, shape.D),
                         randn(tk, shape.Hkv, shape.D)))
        elif shape.varlen:
            sets.append([(randn(1, shape.Hq, nq, shape.D), randn(1, shape.Hkv, nk, shape.D),
                          randn(1, shape.Hkv, nk, shape.D)) for nq, nk in shape.seqs])
        else:
            (nq, nk), b = shape.seqs[0], shape.B
            sets.append([(randn(b, shape.Hq, nq, shape.D), randn(b, shape.Hkv, nk, shape.D),
                          randn(b, shape.Hkv, nk, shape.D))])
    return sets


# ---------------------------------------------------------------------------------------------
# torch SDPA


def math_guard(shape):
    """Why torch-math is not run on this shape, or None."""
    if shape.n_max > MATH_MAX_N:
        return f"torch-math runs only up to N = {MATH_MAX_N} (it materialises the N x N scores)"
    # varlen sequences run one at a time: the largest one bounds the memory
    per_call = max(nq * nk for nq, nk in shape.seqs) * (1 if shape.varlen else shape.B)
    need = MATH_BYTES_PER_SCORE * shape.Hq * per_call
    torch.cuda.empty_cache()  # memory torch caches but does not use counts as free
    free, _total = torch.cuda.mem_get_info()
    if need > 0.9 * free:
        return (f"torch-math would need ~{need / 2**30:.1f} GiB for the scores; "
                f"{free / 2**30:.1f} GiB free")
    return None


def sdpa_call(shape):
    """fn(tuples) running SDPA on each (q, k, v) tuple, under the active sdpa_kernel."""
    F = torch.nn.functional
    kwargs = {"enable_gqa": True} if shape.Hq != shape.Hkv else {}
    masks = {}
    for nq, nk in shape.seqs:
        if shape.causal and nq != nk and (nq, nk) not in masks:
            from torch.nn.attention.bias import causal_lower_right

            masks[(nq, nk)] = causal_lower_right(nq, nk)

    def fn(tuples):
        out = None
        for q, k, v in tuples:
            nq, nk = q.shape[2], k.shape[2]
            if nq == 0 or nk == 0:  # SDPA rejects empty sequences; they cost nothing
                continue
            if shape.causal and nq != nk:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[(nq, nk)], **kwargs)
            else:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal, **kwargs)
        return out

    return fn


def bench_torch_impl(case, params, shape, impl, sets):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    note = VARLEN_NOTE if shape.varlen else None
    if impl == "torch-math":
        why = math_guard(shape)
        if why is not None:
            return row(case, params, impl, missing=why)
    fn = sdpa_call(shape)
    try:
        with warnings.catch_warnings(record=True) as caught, \
                sdpa_kernel(getattr(SDPBackend, TORCH_IMPLS[impl])):
            warnings.simplefilter("always")
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
    return row(case, params, impl, ms=ms, tflops=shape.flops() / (ms * 1e-3) / 1e12,
               extra_mib=extra, note=note)


# ---------------------------------------------------------------------------------------------
# FlashInfer


class FlashInferState:
    """JIT bookkeeping across cases: configurations built (with seconds), failed, and the
    budget of new ones."""

    def __init__(self, max_jit):
        self.max_jit = max_jit
        self.ready = {}  # key -> seconds of the first call (compile or cache load)
        self.failed = {}  # key -> error text
        self.log = []  # for OUT.json

    def compiled(self):
        """First calls that compiled (or failed): what the --max-jit-configs budget counts."""
        return sum(s >= JIT_SECONDS for s in self.ready.values()) + len(self.failed)

    @staticmethod
    def key(shape, backend):
        api = "single_prefill" if shape.single else "batch_prefill_ragged"
        return (api, backend, shape.dtype_name, shape.D)


def flashinfer_runner(shape, backend):
    """(setup, run): setup() -> state kept alive while timing; run(state, (q, k, v)) -> out."""
    if shape.single:
        def setup():
            return None

        def run(_state, qkv):
            q, k, v = qkv
            return flashinfer.single_prefill_with_kv_cache(q, k, v, causal=shape.causal,
                                                           backend=backend)

        return setup, run

    def indptr(lengths):
        acc = [0]
        for n in lengths:
            acc.append(acc[-1] + n)
        return torch.tensor(acc, dtype=torch.int32, device="cuda")

    qo_indptr = indptr([nq for nq, _ in shape.seqs])
    kv_indptr = indptr([nk for _, nk in shape.seqs])
    dtype = common.torch_dtype(shape.dtype_name)

    def setup():
        ws = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
        w.plan(qo_indptr, kv_indptr, shape.Hq, shape.Hkv, shape.D, causal=shape.causal,
               q_data_type=dtype, kv_data_type=dtype)
        return (w, ws)

    def run(state, qkv):
        q, k, v = qkv
        return state[0].run(q, k, v)

    return setup, run


def bench_flashinfer_impl(case, params, shape, impl, sets, fi_state, run_all):
    backend = FLASHINFER_IMPLS[impl]
    if flashinfer_missing is not None:
        return row(case, params, impl, missing=flashinfer_missing)
    if not run_all and not shape.flashinfer_default():
        return row(case, params, impl, missing=(
            "skipped: by default FlashInfer runs only single-sequence causal fp16 D=128 cases "
            "(each configuration JIT-compiles for 20-80 s); --flashinfer-all or "
            "TESSERA_FLASHINFER_ALL=1 runs it"))
    key = fi_state.key(shape, backend)
    if key in fi_state.failed:
        return row(case, params, impl, error=fi_state.failed[key])
    setup, run = flashinfer_runner(shape, backend)
    if key not in fi_state.ready:
        if fi_state.compiled() >= fi_state.max_jit:
            return row(case, params, impl, missing=(
                f"skipped: --max-jit-configs {fi_state.max_jit} FlashInfer configurations "
                f"already compiled this run; {key} may need another"))
        t0 = time.perf_counter()
        try:
            state = setup()
            run(state, sets[0])
            torch.cuda.synchronize()
        except Exception as e:
            err = error_text(e)
            fi_state.failed[key] = err
            fi_state.log.append({"config": list(key), "seconds": None, "error": err})
            log(f"  flashinfer: first call of {key} FAILED after {time.perf_counter() - t0:.1f} s: {err}")
            return row(case, params, impl, error=err)
        secs = time.perf_counter() - t0
        fi_state.ready[key] = secs
        fi_state.log.append({"config": list(key), "seconds": round(secs, 2)})
        how = "JIT compile" if secs >= JIT_SECONDS else "loaded, no compile"
        log(f"  flashinfer: first call of {key} ({how}; not timed) {secs:.1f} s")
        del state
    try:
        state = setup()
        ms = common.time_ms(lambda qkv: run(state, qkv), sets)
        del state
        torch.cuda.empty_cache()
        # the workspace and plan buffers count: setup inside the measured call
        extra = common.peak_extra_mib(lambda: run(setup(), sets[0]))
    except Exception as e:
        torch.cuda.empty_cache()
        return row(case, params, impl, error=error_text(e))
    return row(case, params, impl, ms=ms, tflops=shape.flops() / (ms * 1e-3) / 1e12,
               extra_mib=extra)


# ---------------------------------------------------------------------------------------------


def bench_attention(case, params, impls, fi_state, run_all):
    shape = Shape(params)
    gen = torch.Generator(device="cuda").manual_seed(0xA77E)
    rows = []
    torch_impls = [i for i in impls if i in TORCH_IMPLS]
    fi_impls = [i for i in impls if i in FLASHINFER_IMPLS]
    if torch_impls:
        sets = make_sets(shape, "bhnd", gen)
        for impl in torch_impls:
            rows.append(bench_torch_impl(case, params, shape, impl, sets))
        del sets
        torch.cuda.empty_cache()
    if fi_impls:
        needs_inputs = flashinfer_missing is None and (run_all or shape.flashinfer_default())
        sets = make_sets(shape, "nhd", gen) if needs_inputs else [None]
        for impl in fi_impls:
            rows.append(bench_flashinfer_impl(case, params, shape, impl, sets, fi_state, run_all))
        del sets
        torch.cuda.empty_cache()
    return rows


def parse_impls(text):
    """Comma list of impl names or the prefixes "torch" / "flashinfer"; in IMPLS order."""
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
        log(f"bench_attention: {flashinfer_missing}")
        return
    flashinfer = _fi
    base = os.environ.get("FLASHINFER_WORKSPACE_BASE", os.path.expanduser("~"))
    log(f"bench_attention: flashinfer {getattr(_fi, '__version__', '?')} from "
        f"{os.path.dirname(_fi.__file__)}; JIT cache under {base}/.cache/flashinfer")


def main(argv=None):
    global torch, flashinfer, flashinfer_missing
    env = os.environ.get
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--op", required=True, choices=["attention"])
    ap.add_argument("--cases", required=True, help="JSON file: list of {case, params}")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--impls", default=env("TESSERA_BASELINE_IMPLS", "all"),
                    help=f"comma list of {', '.join(IMPLS)} (or torch, flashinfer, all)")
    ap.add_argument("--flashinfer-all", action="store_true",
                    default=env("TESSERA_FLASHINFER_ALL", "0") == "1",
                    help="run FlashInfer on every case, not only the seed table's configuration")
    ap.add_argument("--max-jit-configs", type=int,
                    default=int(env("TESSERA_FLASHINFER_MAX_JIT", str(DEFAULT_MAX_JIT))),
                    help="at most this many FlashInfer configurations built (JIT) per run "
                         f"(default {DEFAULT_MAX_JIT})")
    args = ap.parse_args(argv)
    impls = parse_impls(args.impls)

    cases = common.load_cases(args.cases)
    torch = common.import_torch("bench_attention", args.out)
    if torch is None:
        return 0
    if any(i in FLASHINFER_IMPLS for i in impls):
        import_flashinfer()
    else:
        flashinfer, flashinfer_missing = None, "not selected (--impls)"
    device = torch.cuda.get_device_name()
    log(f"bench_attention: torch {torch.__version__}, {device}, {len(cases)} cases, "
        f"impls {','.join(impls)}")
    fi_state = FlashInferState(args.max_jit_configs)
    t0 = time.perf_counter()
    rows = common.run_cases(
        cases,
        lambda case, params: bench_attention(case, params, impls, fi_state, args.flashinfer_all),
        lambda params: impls,
    )
    log(f"bench_attention: {len(rows)} rows in {time.perf_counter() - t0:.1f} s")
    out = {"torch": torch.__version__, "device": device, "rows": rows,
           "flashinfer": getattr(flashinfer, "__version__", None) if flashinfer else None,
           "flashinfer_jit": fi_state.log}
    if flashinfer_missing is not None:
        out["flashinfer_missing"] = flashinfer_missing
    common.write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
