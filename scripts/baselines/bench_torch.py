#!/usr/bin/env python3
"""PyTorch baselines for `tessera bench --baselines`.

Invoked by the tessera CLI on the GPU machine:

    python3 scripts/baselines/bench_torch.py --op softmax --cases CASES.json --out OUT.json

CASES.json is a JSON list of {"case": str, "params": {...}}. For --op softmax the params are
{"rows": int, "cols": int, "dtype": "fp16"|"fp32"|"bf16", "op": "softmax"|"log_softmax"}.

OUT.json, the timing method and the {"missing": reason} answer when torch or CUDA is
unavailable are described in bench_common.py (shared with bench_attention.py). A case that
fails gets "ms": null and an "error" string. One line per case goes to stderr.

To add an op: write `bench_<op>(case, params) -> list[row]` and register it in OPS.
"""

import argparse
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


OPS = {
    "softmax": bench_softmax,
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
    rows = common.run_cases(cases, OPS[args.op], lambda params: ["torch"])
    common.write_json(args.out, {"torch": torch.__version__, "device": device, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
