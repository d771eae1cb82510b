#!/usr/bin/env python3
"""PyTorch baselines for `tessera bench --baselines`.

Invoked by the tessera CLI on the GPU machine:

    python3 scripts/baselines/bench_torch.py --op softmax --cases CASES.json --out OUT.json

CASES.json is a JSON list of {"case": str, "params": {...}}. For --op softmax the params are
{"rows": int, "cols": int, "dtype": "fp16"|"fp32"|"bf16", "op": "softmax"|"log_softmax"}.

OUT.json is {"rows": [row, ...], "torch": version, "device": name} where each row has the
BenchRow shape of DESIGN.md: {"case", "params", "impl", "ms", "tflops", "gbps", "extra_mib",
"max_abs_err", "rel_l2"} (fields that do not apply are null). A case that fails gets "ms": null
and an extra "error" string. When torch or CUDA is unavailable OUT.json is {"missing": reason}
and the exit status is still 0. One line per case goes to stderr.

Timing (same as ANCHORS.md): warm-up, CUDA events around 5-30 calls per group, 7 groups,
median of the group means; the calls rotate among enough input buffers that they span more
than 2x the L2 cache (60 MB on H200), so the cache is not what gets measured.

To add an op: write `bench_<op>(case, params) -> list[row]` and register it in OPS.
"""

import argparse
import json
import math
import statistics
import sys
import traceback

L2_BYTES = 60 * 1024 * 1024
ROTATE_BYTES = 2 * L2_BYTES  # inputs touched by consecutive calls span more than this
MAX_BUFFERS = 64
MAX_ROTATE_TOTAL = 4 * 1024**3  # never allocate more than this for rotation
GROUPS = 7
MIN_REPS, MAX_REPS = 5, 30
TARGET_GROUP_MS = 2.0  # choose reps so a group takes about this long (within the bounds)

torch = None  # imported in main() so that a missing torch becomes {"missing": ...}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def torch_dtype(name):
    table = {"fp16": torch.float16, "fp32": torch.float32, "bf16": torch.bfloat16}
    if name not in table:
        raise ValueError(f"unknown dtype {name!r} (expected one of {sorted(table)})")
    return table[name]


def row(case, params, impl, ms=None, gbps=None, tflops=None, extra_mib=None, error=None):
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
    if error is not None:
        r["error"] = error
    return r


def rotation_count(bytes_per_input):
    """Number of distinct input buffers so that a rotation spans > 2x L2 (at least 1)."""
    n = max(1, math.ceil(ROTATE_BYTES / max(1, bytes_per_input)))
    n = min(n, MAX_BUFFERS, max(1, MAX_ROTATE_TOTAL // max(1, bytes_per_input)))
    return n


def time_ms(fn, inputs):
    """Median over GROUPS of the mean time (ms) of fn(x), x rotating over `inputs`."""
    n = len(inputs)
    # warm-up: compile/load kernels, settle clocks, and estimate the time per call
    for i in range(max(3, n)):
        fn(inputs[i % n])
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(MIN_REPS):
        fn(inputs[i % n])
    end.record()
    end.synchronize()
    est = max(start.elapsed_time(end) / MIN_REPS, 1e-4)
    reps = int(min(MAX_REPS, max(MIN_REPS, math.ceil(TARGET_GROUP_MS / est))))

    means = []
    k = 0
    for _ in range(GROUPS):
        start.record()
        for _ in range(reps):
            fn(inputs[k % n])
            k += 1
        end.record()
        end.synchronize()
        means.append(start.elapsed_time(end) / reps)
    return statistics.median(means)


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


OPS = {
    "softmax": bench_softmax,
}


# ---------------------------------------------------------------------------------------------


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, allow_nan=False)
        f.write("\n")


def main(argv=None):
    global torch
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--op", required=True, choices=sorted(OPS))
    ap.add_argument("--cases", required=True, help="JSON file: list of {case, params}")
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args(argv)

    with open(args.cases) as f:
        cases = json.load(f)
    if not isinstance(cases, list):
        raise SystemExit(f"{args.cases}: expected a JSON list of cases")

    try:
        import torch as _torch
    except Exception as e:  # ImportError, or a broken install
        reason = f"torch not importable: {type(e).__name__}: {e}"
        log(f"bench_torch: {reason}")
        write_json(args.out, {"missing": reason})
        return 0
    torch = _torch
    if not torch.cuda.is_available():
        reason = f"torch {torch.__version__}: CUDA not available"
        log(f"bench_torch: {reason}")
        write_json(args.out, {"missing": reason})
        return 0

    device = torch.cuda.get_device_name()
    log(f"bench_torch: torch {torch.__version__}, {device}, op {args.op}, {len(cases)} cases")
    bench = OPS[args.op]
    out_rows = []
    for c in cases:
        case, params = c["case"], c["params"]
        try:
            rows = bench(case, params)
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
            log(f"  {case:<32} torch  FAILED {err}")
            if not isinstance(e, (ValueError, torch.cuda.OutOfMemoryError)):
                traceback.print_exc(file=sys.stderr)
            rows = [row(case, params, "torch", error=err)]
            torch.cuda.empty_cache()
        for r in rows:
            if r.get("ms") is not None:
                rate = (
                    f"{r['gbps']:8.1f} GB/s"
                    if r.get("gbps") is not None
                    else f"{r['tflops']:8.1f} TFLOP/s" if r.get("tflops") is not None else ""
                )
                log(f"  {case:<32} {r['impl']:<12} {r['ms']:9.4f} ms  {rate}")
        out_rows.extend(rows)
        torch.cuda.empty_cache()

    write_json(args.out, {"torch": torch.__version__, "device": device, "rows": out_rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
