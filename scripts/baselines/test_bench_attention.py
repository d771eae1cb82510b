#!/usr/bin/env python3
"""Logic tests of bench_attention.py without a GPU: a fake `torch` (tensors are shapes with
byte accounting, time is a simulated clock) and a fake `flashinfer` stand in for the real ones.
Checks the rows (impls, order, TFLOP/s convention, errors, missing reasons), the FlashInfer
selection (single vs ragged batch, default skip, JIT budget) and the {"missing"} answers.

    python3 scripts/baselines/test_bench_attention.py     (also run by cargo test)
"""

import contextlib
import json
import os
import sys
import tempfile
import types
import unittest
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------------------------------------
# fake torch


class FakeDevice:
    clock_ms = 0.0
    allocated = 0
    peak = 0
    free = 140 * 2**30

    @classmethod
    def reset(cls):
        cls.clock_ms, cls.allocated, cls.peak = 0.0, 0, 0

    @classmethod
    def alloc(cls, n):
        cls.allocated += n
        cls.peak = max(cls.peak, cls.allocated)

    @classmethod
    def run(cls, flops, tflops_rate):
        cls.clock_ms += flops / (tflops_rate * 1e12) * 1e3


class DType:
    def __init__(self, name, size):
        self.name, self.size = name, size

    def __repr__(self):
        return f"torch.{self.name}"


class Tensor:
    def __init__(self, shape, dtype):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.nbytes = dtype.size
        for d in self.shape:
            self.nbytes *= d
        FakeDevice.alloc(self.nbytes)

    def __del__(self):
        FakeDevice.allocated -= self.nbytes

    def element_size(self):
        return self.dtype.size


def _dims(shape):
    return shape if isinstance(shape, (tuple, list)) else (shape,)


class OutOfMemoryError(RuntimeError):
    pass


class Event:
    def __init__(self, enable_timing=False):
        self.t = 0.0

    def record(self):
        self.t = FakeDevice.clock_ms

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return other.t - self.t


class Generator:
    def __init__(self, device=None):
        pass

    def manual_seed(self, s):
        return self


SDPBackend = types.SimpleNamespace(FLASH_ATTENTION="flash", CUDNN_ATTENTION="cudnn",
                                   EFFICIENT_ATTENTION="efficient", MATH="math")
RATES = {"flash": 300.0, "cudnn": 500.0, "efficient": 150.0, "math": 20.0}
_backend = [None]
sdpa_calls = []


@contextlib.contextmanager
def sdpa_kernel(backend):
    old = _backend[0]
    _backend[0] = backend
    try:
        yield
    finally:
        _backend[0] = old


def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False):
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    backend = _backend[0]
    if hq != hkv and not enable_gqa:
        raise RuntimeError("shape mismatch: GQA needs enable_gqa")
    if backend == "efficient" and hq != hkv:
        warnings.warn("Memory efficient kernel not used because: GQA is not supported")
        raise RuntimeError("No available kernel. Aborting execution.")
    sdpa_calls.append((backend, q.shape, k.shape, is_causal, attn_mask is not None, enable_gqa))
    scores = Tensor((b, hq, nq, nk), DTYPES["fp32"]) if backend == "math" else None
    out = Tensor(q.shape, q.dtype)
    FakeDevice.run(4.0 * b * hq * nq * nk * d * (0.5 if is_causal or attn_mask else 1.0),
                   RATES[backend])
    del scores
    return out


DTYPES = {"fp16": DType("float16", 2), "bf16": DType("bfloat16", 2), "fp32": DType("float32", 4)}


def make_fake_torch():
    t = types.ModuleType("torch")
    t.__version__ = "0.0-fake"
    t.float16, t.bfloat16, t.float32 = DTYPES["fp16"], DTYPES["bf16"], DTYPES["fp32"]
    t.uint8, t.int32 = DType("uint8", 1), DType("int32", 4)
    t.empty = lambda shape, dtype=None, device=None: Tensor(_dims(shape), dtype)
    t.randn = lambda shape, device=None, dtype=None, generator=None: Tensor(_dims(shape), dtype)
    t.tensor = lambda data, dtype=None, device=None: types.SimpleNamespace(data=list(data))
    t.Generator = Generator
    cuda = types.ModuleType("torch.cuda")
    cuda.is_available = lambda: True
    cuda.get_device_name = lambda: "Fake H200"
    cuda.synchronize = lambda: None
    cuda.Event = Event
    cuda.memory_allocated = lambda: FakeDevice.allocated
    cuda.max_memory_allocated = lambda: FakeDevice.peak
    cuda.mem_get_info = lambda: (FakeDevice.free, 141 * 2**30)
    cuda.empty_cache = lambda: None
    cuda.OutOfMemoryError = OutOfMemoryError

    def reset_peak():
        FakeDevice.peak = FakeDevice.allocated

    cuda.reset_peak_memory_stats = reset_peak
    t.cuda = cuda
    nn = types.ModuleType("torch.nn")
    nn.functional = types.SimpleNamespace(scaled_dot_product_attention=scaled_dot_product_attention)
    attention = types.ModuleType("torch.nn.attention")
    attention.SDPBackend = SDPBackend
    attention.sdpa_kernel = sdpa_kernel
    bias = types.ModuleType("torch.nn.attention.bias")
    bias.causal_lower_right = lambda nq, nk: ("lower_right", nq, nk)
    attention.bias = bias
    nn.attention = attention
    t.nn = nn
    return {"torch": t, "torch.cuda": cuda, "torch.nn": nn, "torch.nn.attention": attention,
            "torch.nn.attention.bias": bias}


# ---------------------------------------------------------------------------------------------
# fake flashinfer

fi_calls = []


def make_fake_flashinfer():
    fi = types.ModuleType("flashinfer")
    fi.__version__ = "0.6.12-fake"
    fi.__file__ = "/fake/flashinfer/__init__.py"

    def single_prefill_with_kv_cache(q, k, v, causal=False, backend="auto"):
        fi_calls.append(("single", backend, q.shape, k.shape, causal))
        n, h, d = q.shape
        FakeDevice.run(4.0 * h * n * k.shape[0] * d * (0.5 if causal else 1.0),
                       600.0 if backend == "fa3" else 350.0)
        tmp = Tensor((32 << 20,), DType("uint8", 1))
        del tmp
        return Tensor(q.shape, q.dtype)

    class BatchPrefillWithRaggedKVCacheWrapper:
        def __init__(self, ws, layout, backend="auto"):
            assert layout == "NHD"
            self.backend, self.ws = backend, ws
            self.int_ws = Tensor((8 << 20,), DType("uint8", 1))

        def plan(self, qo_indptr, kv_indptr, hq, hkv, d, causal=False, q_data_type=None,
                 kv_data_type=None):
            fi_calls.append(("plan", self.backend, qo_indptr.data, kv_indptr.data, hq, hkv, d,
                             causal, q_data_type))
            self.plan_args = (qo_indptr.data, kv_indptr.data, causal)

        def run(self, q, k, v):
            fi_calls.append(("run", self.backend, q.shape, k.shape))
            qo, kv, causal = self.plan_args
            flops = sum(4.0 * q.shape[1] * (qo[i + 1] - qo[i]) * (kv[i + 1] - kv[i]) * q.shape[2]
                        for i in range(len(qo) - 1))
            FakeDevice.run(flops * (0.5 if causal else 1.0), 550.0)
            return Tensor(q.shape, q.dtype)

    fi.single_prefill_with_kv_cache = single_prefill_with_kv_cache
    fi.BatchPrefillWithRaggedKVCacheWrapper = BatchPrefillWithRaggedKVCacheWrapper
    return fi


# ---------------------------------------------------------------------------------------------


def seed(n):
    return {"case": f"causal fp16 B1 H32 N{n} D128",
            "params": {"B": 1, "Hq": 32, "Hkv": 32, "N": n, "D": 128, "causal": True,
                       "dtype": "fp16", "varlen": False}}


GQA = {"case": "gqa", "params": {"B": 4, "Hq": 32, "Hkv": 8, "N": 4096, "D": 128, "causal": True,
                                 "dtype": "bf16", "varlen": False}}
VARLEN = {"case": "varlen", "params": {"B": 3, "Hq": 16, "Hkv": 16, "N": 300, "D": 64,
                                       "causal": True, "dtype": "fp16", "varlen": True,
                                       "lengths": [128, 0, 300]}}


class BenchAttentionTest(unittest.TestCase):
    def setUp(self):
        self.saved = {k: sys.modules.get(k) for k in
                      ("torch", "torch.cuda", "torch.nn", "torch.nn.attention",
                       "torch.nn.attention.bias", "flashinfer")}
        sys.modules.update(make_fake_torch())
        sys.modules["flashinfer"] = make_fake_flashinfer()
        FakeDevice.reset()
        FakeDevice.free = 140 * 2**30
        sdpa_calls.clear()
        fi_calls.clear()
        import bench_attention

        self.ba = bench_attention
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        for k, v in self.saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        self.dir.cleanup()

    def run_cases(self, cases, *extra):
        cases_path = os.path.join(self.dir.name, "cases.json")
        out_path = os.path.join(self.dir.name, "out.json")
        with open(cases_path, "w") as f:
            json.dump(cases, f)
        with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
            rc = self.ba.main(["--op", "attention", "--cases", cases_path, "--out", out_path,
                               *extra])
        self.assertEqual(rc, 0)
        with open(out_path) as f:
            return json.load(f)

    def rows_by_impl(self, out, case):
        return {r["impl"]: r for r in out["rows"] if r["case"] == case}

    def test_seed_table_all_impls(self):
        out = self.run_cases([seed(1024), seed(4096)])
        case = seed(4096)["case"]
        rows = self.rows_by_impl(out, case)
        self.assertEqual(list(rows), self.ba.IMPLS)
        flops = 2.0 * 32 * 4096**2 * 128
        for impl, r in rows.items():
            self.assertIsNotNone(r["ms"], r)
            self.assertAlmostEqual(r["tflops"], flops / (r["ms"] * 1e-3) / 1e12, places=6)
            self.assertGreater(r["extra_mib"], 0, impl)
            for key in ("case", "params", "impl", "ms", "tflops", "gbps", "extra_mib",
                        "max_abs_err", "rel_l2"):
                self.assertIn(key, r)
            self.assertNotIn("error", r)
        # the fake backends' rates come back through the timing
        self.assertAlmostEqual(rows["torch-cudnn"]["tflops"], 500.0, delta=1.0)
        self.assertAlmostEqual(rows["flashinfer-fa3"]["tflops"], 600.0, delta=1.0)
        # MATH's scores count in its extra memory: B*H*N^2 fp32
        self.assertGreater(rows["torch-math"]["extra_mib"], 32 * 4096**2 * 4 / 2**20)
        # one JIT config per backend (single prefill fp16 D128), both cases share it
        self.assertEqual([e["config"] for e in out["flashinfer_jit"]],
                         [["single_prefill", "fa3", "fp16", 128],
                          ["single_prefill", "fa2", "fp16", 128]])
        self.assertTrue(all(c[0] == "single" and c[2] == (4096, 32, 128) or c[2][0] == 1024
                            for c in fi_calls))
        self.assertEqual(out["flashinfer"], "0.6.12-fake")

    def test_gqa_efficient_refuses_and_flashinfer_skipped_by_default(self):
        out = self.run_cases([GQA])
        rows = self.rows_by_impl(out, "gqa")
        self.assertIsNone(rows["torch-efficient"]["ms"])
        self.assertIn("No available kernel", rows["torch-efficient"]["error"])
        self.assertIn("GQA", rows["torch-efficient"]["error"])
        self.assertIsNotNone(rows["torch-flash"]["ms"])
        self.assertTrue(all(c[5] for c in sdpa_calls), "enable_gqa passed")
        self.assertEqual(sdpa_calls[0][2], (4, 8, 4096, 128))
        for impl in ("flashinfer-fa3", "flashinfer-fa2"):
            self.assertIsNone(rows[impl]["ms"])
            self.assertIn("skipped", rows[impl]["missing"])
        self.assertEqual(fi_calls, [])

    def test_batch_uses_ragged_wrapper_when_asked(self):
        out = self.run_cases([GQA], "--flashinfer-all", "--impls", "flashinfer")
        rows = self.rows_by_impl(out, "gqa")
        self.assertEqual(list(rows), ["flashinfer-fa3", "flashinfer-fa2"])
        plans = [c for c in fi_calls if c[0] == "plan"]
        self.assertEqual(plans[0][1:], ("fa3", [0, 4096, 8192, 12288, 16384],
                                        [0, 4096, 8192, 12288, 16384], 32, 8, 128, True,
                                        DTYPES["bf16"]))
        runs = [c for c in fi_calls if c[0] == "run"]
        self.assertEqual(runs[0][2:], ((16384, 32, 128), (16384, 8, 128)))
        # the 128 MiB workspace is in the extra memory
        self.assertGreater(rows["flashinfer-fa3"]["extra_mib"], 128)
        self.assertAlmostEqual(rows["flashinfer-fa3"]["tflops"], 550.0, delta=1.0)
        self.assertEqual(out["flashinfer_jit"][0]["config"], ["batch_prefill_ragged", "fa3", "bf16", 128])

    def test_varlen(self):
        out = self.run_cases([VARLEN], "--flashinfer-all")
        rows = self.rows_by_impl(out, "varlen")
        flops = 2.0 * 16 * 64 * (128**2 + 300**2)
        for impl in ("torch-flash", "torch-cudnn", "torch-math", "flashinfer-fa2"):
            r = rows[impl]
            self.assertIsNotNone(r["ms"], r)
            self.assertAlmostEqual(r["tflops"] * 1e12 * r["ms"] * 1e-3, flops, delta=flops * 1e-9)
        self.assertIn("one after another", rows["torch-flash"]["note"])
        self.assertNotIn("note", rows["flashinfer-fa2"])
        # sequences one at a time, the empty one skipped
        flash = [c for c in sdpa_calls if c[0] == "flash"]
        self.assertEqual({c[1] for c in flash}, {(1, 16, 128, 64), (1, 16, 300, 64)})
        plan = [c for c in fi_calls if c[0] == "plan"][0]
        self.assertEqual(plan[2], [0, 128, 128, 428])

    def test_math_guard_and_window(self):
        FakeDevice.free = 8 * 2**30
        cases = [seed(32768), seed(8192),
                 {"case": "win", "params": dict(seed(512)["params"], window=[128, 0])}]
        out = self.run_cases(cases, "--impls", "torch-math,torch-flash")
        r = self.rows_by_impl(out, seed(32768)["case"])["torch-math"]
        self.assertIn("up to N = 16384", r["missing"])
        r = self.rows_by_impl(out, seed(8192)["case"])["torch-math"]
        self.assertIn("GiB free", r["missing"])
        self.assertIsNotNone(self.rows_by_impl(out, seed(8192)["case"])["torch-flash"]["ms"])
        win = self.rows_by_impl(out, "win")
        self.assertEqual(set(win), {"torch-flash", "torch-math"})
        self.assertTrue(all("window" in r["error"] and r["ms"] is None for r in win.values()))
        self.assertEqual(out["flashinfer_jit"], [])

    def test_jit_budget(self):
        cases = [seed(1024), dict(GQA, case="gqa")]
        args = ("--flashinfer-all", "--max-jit-configs", "1", "--impls", "flashinfer-fa2")
        # the fake's first calls are instant, as a module loaded from the cache: not counted
        out = self.run_cases(cases, *args)
        self.assertIsNotNone(self.rows_by_impl(out, "gqa")["flashinfer-fa2"]["ms"])
        self.assertEqual(len(out["flashinfer_jit"]), 2)
        # every first call counted as a compile
        saved, self.ba.JIT_SECONDS = self.ba.JIT_SECONDS, 0.0
        try:
            out = self.run_cases(cases, *args)
        finally:
            self.ba.JIT_SECONDS = saved
        self.assertIsNotNone(self.rows_by_impl(out, seed(1024)["case"])["flashinfer-fa2"]["ms"])
        r = self.rows_by_impl(out, "gqa")["flashinfer-fa2"]
        self.assertIn("--max-jit-configs 1", r["missing"])
        self.assertEqual(len(out["flashinfer_jit"]), 1)

    def test_flashinfer_missing(self):
        sys.modules["flashinfer"] = None  # import raises ImportError
        out = self.run_cases([seed(1024)])
        rows = self.rows_by_impl(out, seed(1024)["case"])
        self.assertIsNotNone(rows["torch-flash"]["ms"])
        for impl in ("flashinfer-fa3", "flashinfer-fa2"):
            self.assertIn("flashinfer not importable", rows[impl]["missing"])
            self.assertIsNone(rows[impl]["ms"])
        self.assertIn("not importable", out["flashinfer_missing"])

    def test_torch_missing(self):
        sys.modules["torch"] = None
        out = self.run_cases([seed(1024)])
        self.assertEqual(list(out), ["missing"])
        self.assertIn("torch not importable", out["missing"])

    def test_bad_params_give_error_rows(self):
        bad = {"case": "bad", "params": {"B": 1, "Hq": 6, "Hkv": 4, "N": 64, "D": 64,
                                         "causal": False, "dtype": "fp16"}}
        out = self.run_cases([bad], "--impls", "torch")
        self.assertEqual(len(out["rows"]), 4)
        self.assertTrue(all("multiple of Hkv" in r["error"] for r in out["rows"]))

    def test_burst_timing_rests_then_times_single_long_calls(self):
        import bench_common as common

        calls, sleeps = [], []

        def call(x):
            calls.append(x)
            FakeDevice.clock_ms += 3.5

        saved_sleep, saved_torch = common.time.sleep, common.torch
        common.time.sleep = sleeps.append
        common.torch = sys.modules["torch"]
        try:
            ms = common.time_ms(call, [None], mode="burst")
            self.assertEqual(sleeps, [common.BURST_PAUSE_S])
            # 3 calls, 20 ms of warm-up (6 calls), then 7 groups of 1 call
            self.assertEqual(len(calls), 3 + 6 + 7)
            self.assertAlmostEqual(ms, 3.5)
            calls.clear()
            sleeps.clear()
            os.environ["TESSERA_BENCH_TIMING"] = "sustained"
            common.time_ms(call, [None])
            self.assertEqual(sleeps, [])
            # 3 calls, 500 ms of warm-up (143 calls), then 7 groups of 5 calls
            self.assertEqual(len(calls), 3 + 143 + 35)
            os.environ["TESSERA_BENCH_TIMING"] = "fast"
            with self.assertRaises(ValueError):
                common.time_ms(call, [None])
        finally:
            common.time.sleep, common.torch = saved_sleep, saved_torch
            os.environ.pop("TESSERA_BENCH_TIMING", None)

    def test_parse_impls(self):
        self.assertEqual(self.ba.parse_impls("flashinfer,torch-math"),
                         ["torch-math", "flashinfer-fa3", "flashinfer-fa2"])
        self.assertEqual(self.ba.parse_impls("all"), self.ba.IMPLS)
        with self.assertRaises(SystemExit):
            self.ba.parse_impls("torch-fast")


if __name__ == "__main__":
    unittest.main()
