#!/usr/bin/env python3
"""cuSPARSE baselines of `tessera bench sparse --baselines`: SpMV y = A x through torch
(`torch.mv` on a sparse CSR tensor) and CuPy (`cupyx.scipy.sparse.csr_matrix @ x`).

    python3 scripts/baselines/bench_sparse.py --op sparse --cases CASES.json --out OUT.json

Each case's params name the matrix tessera benchmarked: {"matrix": STEM, "rows", "cols",
"dtype": "fp32"|"fp64", "index": "i32"} with STEM.offsets / STEM.indices / STEM.values raw
little-endian arrays written by tessera (sparse/bench.rs), so both sides time the very same
matrix. GB/s count values, indices, offsets, x and y once, as tessera does. The x vectors
rotate over enough copies to exceed the L2 only when they are large; the matrix is read once
per call either way (it is what tessera times too). Output and timing: bench_common.py.
"""

import argparse
import sys

import bench_common as common
from bench_common import log, row, time_ms

torch = None  # set in main()


def load_matrix(params):
    import numpy as np  # noqa: PLC0415 (numpy comes with torch)

    stem = params["matrix"]
    val = {"fp32": np.float32, "fp64": np.float64}[params["dtype"]]
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


OPS = {"sparse": bench_sparse}


def main(argv=None):
    global torch
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--op", required=True, choices=sorted(OPS))
    ap.add_argument("--cases", required=True, help="JSON file: list of {case, params}")
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args(argv)

    cases = common.load_cases(args.cases)
    torch = common.import_torch("bench_sparse", args.out)
    if torch is None:
        return 0
    device = torch.cuda.get_device_name()
    log(f"bench_sparse: torch {torch.__version__}, {device}, {len(cases)} cases")
    rows = common.run_cases(cases, OPS[args.op], lambda params: ["torch-csr", "cupy-csr"])
    common.write_json(args.out, {"torch": torch.__version__, "device": device, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
