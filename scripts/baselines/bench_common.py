"""Shared plumbing of the Python baseline runners (bench_torch.py, bench_attention.py).

The CLI contract (crates/tessera-cli/src/report.rs, run_python_baseline):

    python3 scripts/baselines/<runner>.py --op OP --cases CASES.json --out OUT.json

CASES.json is a JSON list of {"case": str, "params": {...}}. OUT.json is
{"rows": [row, ...], "torch": version, "device": name, ...} where each row has the BenchRow
shape of DESIGN.md: {"case", "params", "impl", "ms", "tflops", "gbps", "extra_mib",
"max_abs_err", "rel_l2"} (fields that do not apply are null), plus, only where they apply:
"error" (the row failed: "ms" is null), "missing" (the impl cannot run here, or was skipped:
"ms" is null; the reason) and "note" (how the number was obtained, when that is not obvious).
When torch or CUDA is unavailable OUT.json is {"missing": reason} and the exit status is still 0.

Timing (the rules of tessera's own timing, crates/tessera/src/runtime/timing.rs): a warm-up of
3 calls (at least one pass over the input sets; loads, JIT, plans), then at least WARMUP_MS of
device time, so that the board's power cap has lowered the clock to where sustained load keeps
it (an H200 does so within ~100-200 ms; bench/NOTES.md run 100); then CUDA events around 5-100
calls per group (about 2 ms), 7 groups, median of the group means. The calls rotate among
enough input buffers that they span more than 2x the L2 cache (60 MB on H200), so the cache is
not what gets measured.

With TESSERA_BENCH_TIMING=burst (set by `tessera bench --burst`; TimingOptions::burst) the
runner times short bursts from a rested board instead: after the first warm-up batch it idles
BURST_PAUSE_S so the board falls back below its power cap, warms up for BURST_WARMUP_MS, then
times 7 groups of about 2 ms with at least 1 call each.
"""

import json
import math
import os
import statistics
import sys
import time
import traceback

L2_BYTES = 60 * 1024 * 1024
ROTATE_BYTES = 2 * L2_BYTES  # inputs touched by consecutive calls span more than this
MAX_BUFFERS = 64
MAX_ROTATE_TOTAL = 4 * 1024**3  # never allocate more than this for rotation
GROUPS = 7
MIN_REPS, MAX_REPS = 5, 100
TARGET_GROUP_MS = 2.0  # choose reps so a group takes about this long (within the bounds)
WARMUP_MS = 500.0  # device time the warm-up fills, at least (TimingOptions::warmup_ms)
MAX_WARMUP_BATCHES = 64  # bounds the warm-up when a call takes no measurable time
BURST_PAUSE_S = 2.0  # burst timing: idle after the first batch (timing::BURST_PAUSE_MS)
BURST_WARMUP_MS = 20.0  # burst timing: warm-up after the idle (TimingOptions::burst)
MIB = 1024.0 * 1024.0

torch = None  # set by import_torch(), so that a missing torch becomes {"missing": ...}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def import_torch(tag, out_path):
    """Imports torch and checks CUDA. On failure writes {"missing": reason} to out_path and
    returns None."""
    global torch
    try:
        import torch as _torch
    except Exception as e:  # ImportError, or a broken install
        reason = f"torch not importable: {type(e).__name__}: {e}"
        log(f"{tag}: {reason}")
        write_json(out_path, {"missing": reason})
        return None
    if not _torch.cuda.is_available():
        reason = f"torch {_torch.__version__}: CUDA not available"
        log(f"{tag}: {reason}")
        write_json(out_path, {"missing": reason})
        return None
    torch = _torch
    return torch


def torch_dtype(name):
    table = {"fp16": torch.float16, "fp32": torch.float32, "bf16": torch.bfloat16}
    if name not in table:
        raise ValueError(f"unknown dtype {name!r} (expected one of {sorted(table)})")
    return table[name]


def row(case, params, impl, ms=None, gbps=None, tflops=None, extra_mib=None, error=None,
        missing=None, note=None):
    r = {
        "case": case,
        "params": params,
        "impl": impl,
        "ms": ms,
        "tflops": tflops,
        "gbps": gbps,
        "extra_mib": extra_mib,
        "max_abs_err": None,
        "rel_l2": None,
    }
    for key, value in (("error", error), ("missing", missing), ("note", note)):
        if value is not None:
            r[key] = value
    return r


def rotation_count(bytes_per_input):
    """Number of distinct input buffers so that a rotation spans > 2x L2 (at least 1)."""
    n = max(1, math.ceil(ROTATE_BYTES / max(1, bytes_per_input)))
    n = min(n, MAX_BUFFERS, max(1, MAX_ROTATE_TOTAL // max(1, bytes_per_input)))
    return n


TIMING_MODES = ("sustained", "burst")


def time_ms(fn, inputs, mode=None):
    """Median over GROUPS of the mean time (ms) of fn(x), x rotating over `inputs`, timed
    as `mode` ('sustained' or 'burst'; default: $TESSERA_BENCH_TIMING, else 'sustained')."""
    mode = mode or os.environ.get("TESSERA_BENCH_TIMING", "sustained")
    if mode not in TIMING_MODES:
        raise ValueError(f"timing mode {mode!r} (mode= or TESSERA_BENCH_TIMING): "
                         "expected 'burst' or 'sustained'")
    burst = mode == "burst"
    warmup_ms = BURST_WARMUP_MS if burst else WARMUP_MS
    min_reps = 1 if burst else MIN_REPS
    n = len(inputs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    k = 0

    def batch(count):
        nonlocal k
        start.record()
        for _ in range(count):
            fn(inputs[k % n])
            k += 1
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    # warm-up: compile/load kernels and build plans (the first batch: host time the events count
    # while the device idles, so it does not count towards WARMUP_MS), then fill WARMUP_MS of
    # device time (batches sized from the last one's time per call)
    first = max(3, n)
    per_call = max(batch(first) / first, 1e-4)
    if burst:
        time.sleep(BURST_PAUSE_S)
    warm = 0.0
    for _ in range(MAX_WARMUP_BATCHES):
        if warm >= warmup_ms:
            break
        count = min(1000, max(1, math.ceil((warmup_ms - warm) / per_call)))
        t = batch(count)
        warm += t
        per_call = max(t / count, 1e-4)
    reps = int(min(MAX_REPS, max(min_reps, math.ceil(TARGET_GROUP_MS / per_call))))
    means = [batch(reps) / reps for _ in range(GROUPS)]
    return statistics.median(means)


def peak_extra_mib(fn):
    """Runs fn() once; returns the peak device memory it allocated beyond what was allocated
    before it (MiB), as ANCHORS.md: reset_peak_memory_stats, max_memory_allocated minus
    memory_allocated before the call."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    extra = (torch.cuda.max_memory_allocated() - before) / MIB
    del result
    return extra


def is_oom(e):
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e)


def error_text(e):
    text = f"{type(e).__name__}: {e}".strip()
    # torch's messages can be pages long (every backend's reasons); keep the head
    text = " ".join(text.split())
    return text if len(text) <= 600 else text[:600] + " ..."


def load_cases(path):
    with open(path) as f:
        cases = json.load(f)
    if not isinstance(cases, list):
        raise SystemExit(f"{path}: expected a JSON list of cases")
    return cases


def log_row(r):
    case = r["case"]
    if r.get("ms") is not None:
        if r.get("gbps") is not None:
            rate = f"{r['gbps']:8.1f} GB/s"
        elif r.get("tflops") is not None:
            rate = f"{r['tflops']:8.1f} TFLOP/s"
        else:
            rate = ""
        mem = f"  +{r['extra_mib']:.0f} MiB" if r.get("extra_mib") is not None else ""
        log(f"  {case:<32} {r['impl']:<16} {r['ms']:9.4f} ms  {rate}{mem}")
    elif r.get("missing") is not None:
        log(f"  {case:<32} {r['impl']:<16} missing: {r['missing']}")
    else:
        log(f"  {case:<32} {r['impl']:<16} FAILED {r.get('error')}")


def run_cases(cases, bench, fallback_impls):
    """Runs bench(case, params) -> list[row] for every case; an exception becomes one error
    row per impl in fallback_impls(params). Logs one line per row."""
    out_rows = []
    for c in cases:
        case, params = c["case"], c["params"]
        try:
            rows = bench(case, params)
        except Exception as e:
            err = error_text(e)
            if not isinstance(e, ValueError) and not is_oom(e):
                traceback.print_exc(file=sys.stderr)
            rows = [row(case, params, impl, error=err) for impl in fallback_impls(params)]
        for r in rows:
            log_row(r)
        out_rows.extend(rows)
        torch.cuda.empty_cache()
    return out_rows


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, allow_nan=False)
        f.write("\n")
