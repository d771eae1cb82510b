#!/usr/bin/env python3
"""Logic tests of bench_kvcache.py without a GPU: a fake `torch` (tensors are shapes with byte
accounting and identity tokens, time is a simulated clock, a paged cache records which tensor
row was stored in which (page, K|V, offset) slot) and a fake `flashinfer` that follows
FlashInfer 0.6.12's paged-layout semantics. Checks the paged layout (indptr / indices /
last_page_len, slots), case validation, the bytes and GB/s math, the rows (impls, order,
missing reasons, notes, the cross-checks), the memory guard and the {"missing"} answers.
The dense math (gathering the cache, the float64 reference, the error norms) needs real torch:
it is replaced here and runs on the GPU machine only.

    python3 scripts/baselines/test_bench_kvcache.py     (also run by cargo test)
"""

import contextlib
import itertools
import json
import os
import random
import sys
import tempfile
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GIB = 2**30

# ---------------------------------------------------------------------------------------------
# fake torch


class FakeDevice:
    clock_ms = 0.0
    allocated = 0
    peak = 0
    free = 140 * GIB

    @classmethod
    def reset(cls):
        cls.clock_ms, cls.allocated, cls.peak = 0.0, 0, 0
        cls.free = 140 * GIB

    @classmethod
    def alloc(cls, n):
        if cls.allocated + n > cls.free:
            raise OutOfMemoryError(f"CUDA out of memory: {n} bytes more than {cls.free}")
        cls.allocated += n
        cls.peak = max(cls.peak, cls.allocated)

    @classmethod
    def move(cls, nbytes, gbps, latency_ms=0.0):
        cls.clock_ms += latency_ms + nbytes / (gbps * 1e9) * 1e3


class DType:
    def __init__(self, name, size):
        self.name, self.size = name, size

    def __repr__(self):
        return f"torch.{self.name}"


DTYPES = {"fp16": DType("float16", 2), "bf16": DType("bfloat16", 2), "fp32": DType("float32", 4),
          "fp8": DType("float8_e4m3fn", 1), "u8": DType("uint8", 1), "i32": DType("int32", 4),
          "i64": DType("int64", 8)}
_tokens = itertools.count(1)


class Tensor:
    """shape, dtype, bytes; token: identity of the data (views share it); store: a paged
    cache's slots {(page, kv, offset): (token, row)} (views share it); data: an int list."""

    def __init__(self, shape, dtype, alloc=True, token=None, store=None, data=None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.nbytes = dtype.size
        for d in self.shape:
            self.nbytes *= d
        self.owned = False
        if alloc:
            FakeDevice.alloc(self.nbytes)
            self.owned = True
        self.token = next(_tokens) if token is None else token
        self.store = {} if store is None else store
        self.data = data
        self.slots = None

    def __del__(self):
        if self.owned:
            FakeDevice.allocated -= self.nbytes

    def element_size(self):
        return self.dtype.size

    def numel(self):
        return self.nbytes // self.dtype.size

    def _view(self, shape, dtype):
        out = Tensor(shape, dtype, alloc=False, token=self.token, store=self.store,
                     data=self.data)
        out.slots = self.slots
        return out

    def view(self, arg):
        if isinstance(arg, DType):
            assert arg.size == self.dtype.size or self.shape[-1] % 2 == 0
            return self._view(self.shape[:-1] + (self.shape[-1] * self.dtype.size // arg.size,),
                              arg)
        assert arg == -1
        return self._view((self.numel(),), self.dtype)

    def unsqueeze(self, dim):
        s = list(self.shape)
        s.insert(dim, 1)
        return self._view(s, self.dtype)

    def to(self, dtype):
        return Tensor(self.shape, dtype)

    def repeat_interleave(self, n, dim):
        s = list(self.shape)
        s[dim] *= n
        out = Tensor(s, self.dtype)
        out.expanded_from = self.token
        return out

    def tolist(self):
        return list(self.data)

    def __setitem__(self, key, value):
        if isinstance(key, tuple) and len(key) == 3 and isinstance(key[0], Tensor):
            page_ids, kv, offsets = key
            assert value.shape == (len(page_ids.data),) + self.shape[3:], (value.shape, self.shape)
            assert value.dtype is self.dtype, (value.dtype, self.dtype)
            for b, (p, o) in enumerate(zip(page_ids.data, offsets.data)):
                assert 0 <= p < self.shape[0] and 0 <= o < self.shape[2]
                self.store[(p, kv, o)] = (value.token, b)
            FakeDevice.move(value.nbytes, 500.0, latency_ms=0.012)
        # anything else: a fill (randn of an fp8 cache), nothing to record

    def __getitem__(self, key):
        page_ids, kv, offsets = key  # only the read-back of slots is used on this path
        out = Tensor((len(page_ids.data),) + self.shape[3:], self.dtype)
        out.slots = [self.store.get((p, kv, o)) for p, o in zip(page_ids.data, offsets.data)]
        return out


def _dims(shape):
    return tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)


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
SDPA_GBPS = {"flash": 4000.0, "cudnn": 4400.0}
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


def scaled_dot_product_attention(q, k, v, enable_gqa=False):
    b, hq, nq, d = q.shape
    assert nq == 1 and k.shape == v.shape and k.shape[0] == b and k.shape[3] == d
    if hq != k.shape[1] and not enable_gqa:
        raise RuntimeError("shape mismatch: GQA needs enable_gqa")
    backend = _backend[0]
    sdpa_calls.append((backend, q.shape, k.shape, enable_gqa, k.token))
    FakeDevice.move(k.nbytes + v.nbytes, SDPA_GBPS[backend])
    out = Tensor(q.shape, q.dtype)
    out.rel = 1e-4
    return out


def make_fake_torch():
    t = types.ModuleType("torch")
    t.__version__ = "0.0-fake"
    t.float16, t.bfloat16, t.float32 = DTYPES["fp16"], DTYPES["bf16"], DTYPES["fp32"]
    t.float8_e4m3fn, t.uint8 = DTYPES["fp8"], DTYPES["u8"]
    t.int32, t.int64 = DTYPES["i32"], DTYPES["i64"]
    t.empty = lambda shape, dtype=None, device=None: Tensor(_dims(shape), dtype)
    t.zeros = lambda shape, dtype=None, device=None: Tensor(_dims(shape), dtype)

    def randn(shape, device=None, dtype=None, generator=None):
        assert dtype is not DTYPES["fp8"], "torch.randn has no fp8"
        return Tensor(_dims(shape), dtype)

    t.randn = randn
    t.tensor = lambda data, dtype=None, device=None: Tensor((len(data),), dtype, data=list(data))
    t.Generator = Generator
    cuda = types.ModuleType("torch.cuda")
    cuda.is_available = lambda: True
    cuda.get_device_name = lambda: "Fake H200"
    cuda.synchronize = lambda: None
    cuda.Event = Event
    cuda.memory_allocated = lambda: FakeDevice.allocated
    cuda.max_memory_allocated = lambda: FakeDevice.peak
    cuda.mem_get_info = lambda: (max(0, FakeDevice.free - FakeDevice.allocated), 141 * GIB)
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
    nn.attention = attention
    t.nn = nn
    return {"torch": t, "torch.cuda": cuda, "torch.nn": nn, "torch.nn.attention": attention}


# ---------------------------------------------------------------------------------------------
# fake flashinfer (FlashInfer 0.6.12 semantics: flashinfer/decode.py, flashinfer/page.py,
# flashinfer/triton/page.py)

fi_calls = []
FI = {"decode_gbps": 3200.0, "decode_rel": 1e-4, "append_shift": 0, "bip_fails": False,
      "plan_fails_for": None}


def make_fake_flashinfer():
    fi = types.ModuleType("flashinfer")
    fi.__version__ = "0.6.12-fake"
    fi.__file__ = "/fake/flashinfer/__init__.py"

    class BatchDecodeWithPagedKVCacheWrapper:
        def __init__(self, ws, layout):
            assert layout == "NHD" and ws.nbytes == 128 * 2**20
            self.ws = ws
            self.int_ws = Tensor((8 << 20,), DTYPES["u8"])

        def plan(self, indptr, indices, last_page_len, hq, hkv, d, page, pos_encoding_mode,
                 q_data_type, kv_data_type):
            assert pos_encoding_mode == "NONE"
            if kv_data_type is FI["plan_fails_for"]:
                raise RuntimeError(f"nvcc failed for {kv_data_type}")
            ip, ix, last = indptr.data, indices.data, last_page_len.data
            assert ip[0] == 0 and len(ix) == ip[-1] and len(last) == len(ip) - 1
            assert all(1 <= x <= page for x in last)
            assert sorted(ix) == list(range(len(ix)))
            fi_calls.append(("plan", ip, ix, last, hq, hkv, d, page, q_data_type, kv_data_type))
            self.seq_lens = [(ip[b + 1] - ip[b] - 1) * page + last[b] for b in range(len(last))]
            self.args = (hq, hkv, d, page, q_data_type, kv_data_type)

        def run(self, q, cache):
            hq, hkv, d, page, qdt, kvdt = self.args
            assert q.dtype is qdt and cache.dtype is kvdt
            assert q.shape == (len(self.seq_lens), hq, d)
            assert cache.shape[1:] == (2, page, hkv, d)
            fi_calls.append(("run", q.token, cache.token))
            FakeDevice.move(sum(self.seq_lens) * hkv * d * 2 * kvdt.size, FI["decode_gbps"])
            out = Tensor(q.shape, q.dtype)
            out.rel = FI["decode_rel"]
            return out

    def get_batch_indices_positions(append_indptr, seq_lens, nnz):
        if FI["bip_fails"]:
            raise ImportError("No module named 'triton'")
        ip, lens = append_indptr.data, seq_lens.data
        bi, pos = [-1] * nnz, [0] * nnz
        for b in range(len(ip) - 1):
            for i in range(ip[b], ip[b + 1]):
                bi[i], pos[i] = b, i + lens[b] - ip[b + 1]
        fi_calls.append(("bip", ip, lens, nnz))
        return (Tensor((nnz,), DTYPES["i32"], data=bi), Tensor((nnz,), DTYPES["i32"], data=pos))

    def append_paged_kv_cache(k, v, batch_indices, positions, cache, indices, indptr,
                              last_page_len, layout):
        assert layout == "NHD"
        assert k.dtype is cache.dtype and v.dtype is cache.dtype
        page = cache.shape[2]
        for j, (b, p) in enumerate(zip(batch_indices.data, positions.data)):
            p += FI["append_shift"]
            n_pages = indptr.data[b + 1] - indptr.data[b]
            assert p < (n_pages - 1) * page + last_page_len.data[b], "outside the page table"
            pg = indices.data[indptr.data[b] + p // page]
            cache.store[(pg, 0, p % page)] = (k.token, j)
            cache.store[(pg, 1, p % page)] = (v.token, j)
        FakeDevice.move(k.nbytes + v.nbytes, 100.0, latency_ms=0.01)
        fi_calls.append(("append", k.token))

    fi.BatchDecodeWithPagedKVCacheWrapper = BatchDecodeWithPagedKVCacheWrapper
    fi.get_batch_indices_positions = get_batch_indices_positions
    fi.append_paged_kv_cache = append_paged_kv_cache
    return fi


# replacements of the dense math (real torch only)


def fake_reference_decode(q, cache, layout, idx64):
    out = Tensor(q.shape, DTYPES["fp32"])
    out.reference_of = (q.token, cache.token)
    return out


def fake_contiguous_kv(cache, layout, idx64):
    b, n = len(layout.lengths), layout.lengths[0]
    shape = (b, cache.shape[3], n, cache.shape[4])
    return Tensor(shape, cache.dtype), Tensor(shape, cache.dtype)


def fake_compare(out, ref):
    if out.slots is not None:  # slots read back: must hold ref's rows in order
        ok = out.slots == [(ref.token, b) for b in range(len(out.slots))]
        return (0.0, 0.0) if ok else (3.0, 1.0)
    rel = out.rel
    return (None, None) if rel is None else (rel * 4, rel)


# ---------------------------------------------------------------------------------------------


def params(op="decode", B=8, Hq=32, Hkv=8, D=128, ctx=1024, page=16, dtype="fp16", lengths=None):
    p = {"op": op, "B": B, "Hq": Hq, "Hkv": Hkv, "D": D, "ctx": ctx, "page": page,
         "dtype": dtype, "mixed": lengths is not None}
    if lengths is not None:
        p.update(lengths=lengths, B=len(lengths), ctx=max(lengths))
    return p


def case(name, **kw):
    return {"case": name, "params": params(**kw)}


class KvcacheTest(unittest.TestCase):
    def setUp(self):
        self.saved = {k: sys.modules.get(k) for k in
                      ("torch", "torch.cuda", "torch.nn", "torch.nn.attention", "flashinfer")}
        sys.modules.update(make_fake_torch())
        sys.modules["flashinfer"] = make_fake_flashinfer()
        FakeDevice.reset()
        sdpa_calls.clear()
        fi_calls.clear()
        FI.update(decode_gbps=3200.0, decode_rel=1e-4, append_shift=0, bip_fails=False,
                  plan_fails_for=None)
        import bench_kvcache

        self.bk = bench_kvcache
        self.patched = {}
        for name, fake in (("reference_decode", fake_reference_decode),
                           ("contiguous_kv", fake_contiguous_kv), ("compare", fake_compare)):
            self.patched[name] = getattr(bench_kvcache, name)
            setattr(bench_kvcache, name, fake)
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        for name, f in self.patched.items():
            setattr(self.bk, name, f)
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
            rc = self.bk.main(["--op", "kvcache", "--cases", cases_path, "--out", out_path,
                               *extra])
        self.assertEqual(rc, 0)
        with open(out_path) as f:
            return json.load(f)

    def rows(self, out, name):
        return {r["impl"]: r for r in out["rows"] if r["case"] == name}

    # -- paged layout ---------------------------------------------------------------------

    def check_layout(self, lengths, page):
        lay = self.bk.Layout(lengths, page)
        self.assertEqual(len(lay.indptr), len(lengths) + 1)
        self.assertEqual(lay.indptr[0], 0)
        self.assertEqual(lay.num_pages, sum(-(-n // page) for n in lengths))  # just big enough
        self.assertEqual(sorted(lay.indices), list(range(lay.num_pages)))  # a permutation
        seen = set()
        for b, n in enumerate(lengths):
            pages = lay.indptr[b + 1] - lay.indptr[b]
            last = lay.last_page_len[b]
            self.assertTrue(1 <= last <= page, (lengths, page, b, last))
            if n % page == 0:
                self.assertEqual(last, page)
            self.assertEqual((pages - 1) * page + last, n)  # FlashInfer's get_seq_lens
            for t in range(n):
                slot = lay.slot(b, t)
                self.assertNotIn(slot, seen)
                seen.add(slot)
        page_ids, offsets, positions = lay.append_slots()
        for b, n in enumerate(lengths):
            self.assertEqual(positions[b], n - 1)
            self.assertEqual(page_ids[b], lay.indices[lay.indptr[b + 1] - 1])  # the last page
            self.assertEqual(offsets[b] + 1, lay.last_page_len[b])
        return lay

    def test_layout(self):
        lay = self.check_layout([1, 16, 17, 33, 5], 16)
        self.assertEqual(lay.indptr, [0, 1, 2, 4, 7, 8])
        self.assertEqual(lay.last_page_len, [1, 16, 1, 1, 5])
        lay = self.check_layout([1024] * 8, 16)
        self.assertEqual(lay.indptr, [64 * b for b in range(9)])
        self.assertEqual(lay.last_page_len, [16] * 8)
        self.assertNotEqual(lay.indices, sorted(lay.indices))  # non-contiguous pages
        self.assertEqual(lay.indices, self.bk.Layout([1024] * 8, 16).indices)  # reproducible
        self.check_layout([7], 1)
        self.check_layout([100, 3], 128)
        rng = random.Random(5)
        for _ in range(30):
            page = rng.choice([1, 2, 8, 16, 32])
            self.check_layout([rng.randint(1, 200) for _ in range(rng.randint(1, 6))], page)

    # -- params -----------------------------------------------------------------------------

    def test_case_validation(self):
        Case = self.bk.Case
        c = Case(params(lengths=[100, 300, 7]))
        self.assertEqual((c.B, c.ctx, c.lengths, c.uniform), (3, 300, [100, 300, 7], False))
        c = Case(params(ctx=64, B=2))
        self.assertEqual((c.lengths, c.uniform, c.group), ([64, 64], True, 4))
        self.assertTrue(Case(params(lengths=[5, 5])).uniform)
        bad = [
            (dict(params(), op="prefill"), "op"),
            (dict(params(), dtype="fp32"), "dtype"),
            (dict(params(), Hkv=6), "multiple of Hkv"),
            (dict(params(), page=0), "page"),
            (dict(params(), ctx=True), "ctx"),
            (dict(params(), mixed="yes"), "mixed"),
            (dict(params(lengths=[4, 8]), B=3), "2 lengths for B = 3"),
            (dict(params(lengths=[4, 8]), ctx=9), "max(lengths)"),
            (dict(params(lengths=[4, 8]), lengths=[4, 0]), "lengths entry 0"),
            (dict(params(), mixed=True), "needs params['lengths']"),
        ]
        for p, text in bad:
            with self.assertRaises(ValueError) as cm:
                Case(p)
            self.assertIn(text, str(cm.exception))

    def test_bytes_and_rates(self):
        Case = self.bk.Case
        self.assertEqual(Case(params(ctx=32768)).kv_bytes(), GIB)
        self.assertEqual(Case(params(ctx=65536)).kv_bytes(), 2 * GIB)  # the brief's 2 GiB
        self.assertEqual(Case(params(ctx=1024)).kv_bytes(), 32 * 2**20)
        self.assertEqual(Case(params(ctx=65536, dtype="fp8")).kv_bytes(), GIB)
        c = Case(params(lengths=[10, 20], Hkv=2, D=64))
        self.assertEqual(c.kv_bytes(), 30 * 2 * 64 * 2 * 2)
        self.assertEqual(c.decode_flops(), 4.0 * 30 * 32 * 64)
        self.assertEqual(Case(params(op="append")).append_bytes(), 8 * 8 * 128 * 2 * 2)
        self.assertEqual(Case(params(op="append", dtype="fp8")).append_bytes(), 8 * 8 * 128 * 2)
        # ANCHORS.md: cuDNN GQA at 32K, 0.2446 ms = 4390 GB/s
        self.assertAlmostEqual(self.bk.gbps(GIB, 0.2446), 4390, delta=1)
        self.assertAlmostEqual(self.bk.tflops(4e12, 1000.0), 4.0)
        self.assertEqual(Case(params(ctx=100, page=16)).cache_bytes(7), 7 * 2 * 16 * 8 * 128 * 2)

    def test_parse_impls(self):
        p = self.bk.parse_impls
        self.assertEqual(p("all"), self.bk.IMPLS)
        self.assertEqual(p("torch"), ["torch-cudnn-gqa", "torch-flash-gqa", "torch-flash-expanded",
                                      "torch-index"])
        self.assertEqual(p("torch-flash,flashinfer"),
                         ["flashinfer", "torch-flash-gqa", "torch-flash-expanded"])
        with self.assertRaises(SystemExit):
            p("torch-math")
        impls = self.bk.IMPLS
        self.assertEqual(self.bk.case_impls(params(), impls), self.bk.DECODE_IMPLS)
        self.assertEqual(self.bk.case_impls(params(op="append"), impls), ["flashinfer", "torch-index"])
        self.assertEqual(self.bk.case_impls({"op": "x"}, ["torch-index"]), ["torch-index"])

    # -- decode ---------------------------------------------------------------------------

    def test_decode_rows(self):
        out = self.run_cases([case("d1k"), case("d4k", ctx=4096)])
        self.assertEqual(out["flashinfer"], "0.6.12-fake")
        for name, ctx in (("d1k", 1024), ("d4k", 4096)):
            rows = self.rows(out, name)
            self.assertEqual(list(rows), self.bk.DECODE_IMPLS)
            kv = 8 * ctx * 8 * 128 * 2 * 2
            for impl, r in rows.items():
                self.assertIsNotNone(r["ms"], r)
                self.assertAlmostEqual(r["gbps"], kv / (r["ms"] * 1e-3) / 1e9, places=6)
                self.assertAlmostEqual(r["tflops"],
                                       4.0 * 8 * ctx * 32 * 128 / (r["ms"] * 1e-3) / 1e12)
                self.assertEqual((r["max_abs_err"], r["rel_l2"]), (4e-4, 1e-4), impl)
                self.assertNotIn("error", r)
                self.assertNotIn("missing", r)
            # the fake rates come back through the timing
            self.assertAlmostEqual(rows["flashinfer"]["gbps"], 3200, delta=1)
            self.assertAlmostEqual(rows["torch-cudnn-gqa"]["gbps"], 4400, delta=1)
            self.assertAlmostEqual(rows["torch-flash-gqa"]["gbps"], 4000, delta=1)
            # expanded reads 4x the bytes; gbps counts the GQA bytes
            self.assertAlmostEqual(rows["torch-flash-expanded"]["gbps"], 1000, delta=1)
            self.assertIn("expanded to 32 heads", rows["torch-flash-expanded"]["note"])
            self.assertNotIn("note", rows["flashinfer"])
            # workspace (128 MiB), int workspace (8 MiB) and output in the extra memory
            self.assertGreater(rows["flashinfer"]["extra_mib"], 136)
        plans = [c for c in fi_calls if c[0] == "plan"]
        lay = self.bk.Layout([1024] * 8, 16)
        self.assertEqual(plans[0][1:], (lay.indptr, lay.indices, lay.last_page_len, 32, 8, 128, 16,
                                        DTYPES["fp16"], DTYPES["fp16"]))
        # one JIT configuration for both cases
        self.assertEqual([e["config"] for e in out["flashinfer_jit"]],
                         [["batch_decode", "float16", "float16", 128]])
        # rotation: 1K (32 MiB per set) over 4 caches, 4K (128 MiB) over one
        runs = [c for c in fi_calls if c[0] == "run"]
        caches_1k = {c[2] for c in runs[: len(runs) // 2]}
        self.assertGreaterEqual(len(caches_1k), 4)
        gqa = [c for c in sdpa_calls if c[0] == "cudnn"]
        self.assertTrue(all(c[3] for c in gqa), "enable_gqa passed")
        self.assertEqual({c[2] for c in gqa}, {(8, 8, 1024, 128), (8, 8, 4096, 128)})
        self.assertEqual({len({c[4] for c in gqa if c[2][2] == n}) for n in (1024, 4096)}, {4, 1})
        expanded = [c for c in sdpa_calls if c[2][1] == 32]
        self.assertTrue(expanded and not any(c[3] for c in expanded))

    def test_decode_mixed_fp8_bf16(self):
        cases = [case("mixed", lengths=[100, 4000, 17]), case("fp8", dtype="fp8"),
                 case("bf16", dtype="bf16", Hkv=32, D=64)]
        out = self.run_cases(cases)
        rows = self.rows(out, "mixed")
        self.assertIsNotNone(rows["flashinfer"]["ms"])
        self.assertAlmostEqual(rows["flashinfer"]["gbps"], 3200, delta=1)
        for impl in self.bk.TORCH_DECODE:
            self.assertIn("same length", rows[impl]["missing"])
            self.assertIsNone(rows[impl]["ms"])
        plan = [c for c in fi_calls if c[0] == "plan"][0]
        self.assertEqual(plan[1], [0, 7, 257, 259])
        self.assertEqual(plan[3], [4, 16, 1])
        rows = self.rows(out, "fp8")
        self.assertIn("k_scale", rows["flashinfer"]["note"])
        self.assertAlmostEqual(rows["flashinfer"]["gbps"], 3200, delta=1)
        for impl in self.bk.TORCH_DECODE:
            self.assertIn("fp8", rows[impl]["missing"])
        self.assertIn(["batch_decode", "float16", "float8_e4m3fn", 128],
                      [e["config"] for e in out["flashinfer_jit"]])
        rows = self.rows(out, "bf16")
        self.assertTrue(all(r["ms"] is not None for r in rows.values()))
        self.assertFalse([c for c in sdpa_calls if c[2][1] == 32 and c[3]],
                         "no enable_gqa when Hq == Hkv")

    def test_decode_cross_check_note(self):
        FI["decode_rel"] = 5e-3  # above fp16's 2e-3, below bf16's 1.6e-2
        out = self.run_cases([case("fp16"), case("bf16", dtype="bf16")], "--impls", "flashinfer")
        r = self.rows(out, "fp16")["flashinfer"]
        self.assertIsNotNone(r["ms"])
        self.assertEqual(r["rel_l2"], 5e-3)
        self.assertIn("above 2e-03", r["note"])
        self.assertNotIn("note", self.rows(out, "bf16")["flashinfer"])
        FI["decode_rel"] = None  # NaN output
        out = self.run_cases([case("nan")], "--impls", "flashinfer")
        r = self.rows(out, "nan")["flashinfer"]
        self.assertIsNone(r["rel_l2"])
        self.assertIn("not finite", r["note"])

    def test_jit_failure_and_memory_guard(self):
        FI["plan_fails_for"] = DTYPES["bf16"]
        FakeDevice.free = 4 * GIB
        cases = [case("bf16a", dtype="bf16"), case("bf16b", dtype="bf16", ctx=2048),
                 case("big", ctx=131072), case("exp", ctx=32768), case("copy", B=32, ctx=16384)]
        out = self.run_cases(cases)
        for name in ("bf16a", "bf16b"):
            r = self.rows(out, name)
            self.assertIn("nvcc failed", r["flashinfer"]["error"])
            self.assertIsNotNone(r["torch-cudnn-gqa"]["ms"])
        # the failed configuration is tried once, not again for the second bf16 case
        self.assertEqual([(e["config"][1], "error" in e) for e in out["flashinfer_jit"]],
                         [("bfloat16", True), ("float16", False)])
        big = self.rows(out, "big")  # 4 GiB cache (+ the reference's 4.5) with 4 GiB free
        self.assertEqual(set(big), set(self.bk.DECODE_IMPLS))
        self.assertTrue(all("GiB free" in r["missing"] for r in big.values()), big)
        exp = self.rows(out, "exp")  # 1 GiB cache and its copy fit, the 4 GiB expansion not
        self.assertIsNotNone(exp["torch-flash-gqa"]["ms"])
        self.assertIn("expanded to 32 heads", exp["torch-flash-expanded"]["missing"])
        copy = self.rows(out, "copy")  # the 2 GiB cache fits, not a copy next to it
        self.assertIsNotNone(copy["flashinfer"]["ms"])
        for impl in self.bk.TORCH_DECODE:
            self.assertIn("contiguous K/V", copy[impl]["missing"])
        # the guards kept every allocation inside the free memory (the fake raises beyond it)
        self.assertFalse([r for r in out["rows"] if "memory" in (r.get("error") or "")])

    # -- append ---------------------------------------------------------------------------

    def test_append_rows(self):
        cases = [case("a", op="append", ctx=4096), case("a8", op="append", dtype="fp8"),
                 case("am", op="append", lengths=[1, 16, 17, 300])]
        out = self.run_cases(cases)
        for name in ("a", "a8", "am"):
            rows = self.rows(out, name)
            self.assertEqual(list(rows), ["flashinfer", "torch-index"])
            c = self.bk.Case(cases[["a", "a8", "am"].index(name)]["params"])
            for impl, r in rows.items():
                self.assertIsNotNone(r["ms"], r)
                self.assertAlmostEqual(r["gbps"], c.append_bytes() / (r["ms"] * 1e-3) / 1e9)
                self.assertIsNone(r["tflops"])
                self.assertEqual((r["max_abs_err"], r["rel_l2"]), (0.0, 0.0), (name, impl))
        self.assertNotIn("note", self.rows(out, "a")["torch-index"])
        self.assertNotIn("note", self.rows(out, "a")["flashinfer"])
        self.assertIn("uint8 views", self.rows(out, "a8")["torch-index"]["note"])
        self.assertEqual([e["config"] for e in out["flashinfer_jit"]], [["append_paged_kv_cache"]])
        bip = [c for c in fi_calls if c[0] == "bip"]
        self.assertEqual(bip[-1][1:], ([0, 1, 2, 3, 4], [1, 16, 17, 300], 4))
        # k/v rotate over bench_common's maximum of sets
        appends = {c[1] for c in fi_calls if c[0] == "append"}
        self.assertGreaterEqual(len(appends), 64)

    def test_append_wrong_slot_and_hand_positions(self):
        FI["append_shift"] = -1  # a FlashInfer that wrote one slot early
        FI["bip_fails"] = True
        out = self.run_cases([case("a", op="append", ctx=100)])
        rows = self.rows(out, "a")
        self.assertEqual(rows["flashinfer"]["rel_l2"], 1.0)
        self.assertIn("by hand", rows["flashinfer"]["note"])
        self.assertIn("read back", rows["flashinfer"]["note"])
        self.assertEqual(rows["torch-index"]["rel_l2"], 0.0)

    # -- missing / errors -----------------------------------------------------------------

    def test_flashinfer_missing(self):
        sys.modules["flashinfer"] = None  # import raises ImportError
        out = self.run_cases([case("d"), case("a", op="append")])
        for name in ("d", "a"):
            rows = self.rows(out, name)
            self.assertIn("flashinfer not importable", rows["flashinfer"]["missing"])
            self.assertIsNone(rows["flashinfer"]["ms"])
        self.assertIsNotNone(self.rows(out, "d")["torch-cudnn-gqa"]["ms"])
        self.assertIsNotNone(self.rows(out, "a")["torch-index"]["ms"])
        self.assertIn("not importable", out["flashinfer_missing"])

    def test_torch_missing(self):
        sys.modules["torch"] = None
        out = self.run_cases([case("d")])
        self.assertEqual(list(out), ["missing"])
        self.assertIn("torch not importable", out["missing"])

    def test_bad_params_give_error_rows(self):
        bad = {"case": "bad", "params": dict(params(), Hkv=5)}
        out = self.run_cases([bad, case("a", op="append")], "--impls", "torch")
        rows = self.rows(out, "bad")
        self.assertEqual(list(rows), ["torch-cudnn-gqa", "torch-flash-gqa", "torch-flash-expanded"])
        self.assertTrue(all("multiple of Hkv" in r["error"] for r in rows.values()))
        self.assertEqual(list(self.rows(out, "a")), ["torch-index"])

    def test_env_impls(self):
        os.environ["TESSERA_BASELINE_IMPLS"] = "torch-index"
        try:
            out = self.run_cases([case("a", op="append"), case("d")])
        finally:
            del os.environ["TESSERA_BASELINE_IMPLS"]
        self.assertEqual([(r["case"], r["impl"]) for r in out["rows"]], [("a", "torch-index")])
        self.assertEqual(out["flashinfer_missing"], "not selected (--impls)")


if __name__ == "__main__":
    unittest.main()
