"""Tests of the installed `tessera` wheel that need no GPU and no torch (CI runs them):
import, public names and signatures (flash_attn's), stubs and docstrings, argument validation
with tessera's messages, and the error raised when no GPU is usable.

Tensors are stand-ins: objects exposing `__cuda_array_interface__` with made-up addresses.
Validation runs before anything touches the device, so these never reach a GPU.
"""

from __future__ import annotations

import ast
import inspect
import os
import pathlib

import pytest

import tessera
from tessera import _tessera


class Fake:
    """A stand-in CUDA array: only its `__cuda_array_interface__` (v3)."""

    def __init__(self, shape, typestr="<f2", ptr=0x7F0000000000, strides=None, readonly=False):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (ptr, readonly),
            "strides": strides,
            "version": 3,
            "stream": None,
        }


def qkv(b=1, n=16, h=4, hk=2, d=64, nk=None, typestr="<f2"):
    nk = n if nk is None else nk
    return Fake((b, n, h, d), typestr), Fake((b, nk, hk, d), typestr), Fake((b, nk, hk, d), typestr)


GPU = tessera.is_available()

# -- import, names, signatures ------------------------------------------------------------


def test_import_and_version():
    assert tessera.__version__ == _tessera.__version__
    assert tessera.__version__.count(".") == 2
    for name in tessera.__all__:
        assert hasattr(tessera, name), name


def test_exception_hierarchy():
    assert issubclass(tessera.InvalidArgumentError, ValueError)
    assert issubclass(tessera.UnsupportedError, NotImplementedError)
    for cls in (tessera.NoGpuError, tessera.CudaError, tessera.CompileError):
        assert issubclass(cls, RuntimeError)
    assert issubclass(tessera.TesseraIOError, OSError)
    assert issubclass(tessera.OutOfPagesError, MemoryError)
    for cls in (
        tessera.InvalidArgumentError,
        tessera.UnsupportedError,
        tessera.NoGpuError,
        tessera.CudaError,
        tessera.CompileError,
        tessera.TesseraIOError,
        tessera.OutOfPagesError,
    ):
        assert issubclass(cls, tessera.TesseraError)
        assert cls.__module__ == "tessera"
        assert cls.__doc__


def _params(fn):
    return [(p.name, p.default, p.kind) for p in inspect.signature(fn).parameters.values()]


P, K = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
E = inspect.Parameter.empty

# flash_attn 2.x (flash_attn/flash_attn_interface.py), then tessera's keyword-only additions
FLASH_ATTN_FUNC = [
    ("q", E, P),
    ("k", E, P),
    ("v", E, P),
    ("dropout_p", 0.0, P),
    ("softmax_scale", None, P),
    ("causal", False, P),
    ("window_size", (-1, -1), P),
    ("softcap", 0.0, P),
    ("alibi_slopes", None, P),
    ("deterministic", False, P),
    ("return_attn_probs", False, P),
    ("out", None, K),
]
FLASH_ATTN_VARLEN_FUNC = (
    FLASH_ATTN_FUNC[:3]
    + [
        ("cu_seqlens_q", E, P),
        ("cu_seqlens_k", E, P),
        ("max_seqlen_q", E, P),
        ("max_seqlen_k", E, P),
    ]
    + FLASH_ATTN_FUNC[3:11]
    + [("block_table", None, P), ("out", None, K)]
)


def test_flash_attn_signatures_match_flash_attn():
    assert _params(tessera.flash_attn_func) == FLASH_ATTN_FUNC
    assert _params(tessera.flash_attn_varlen_func) == FLASH_ATTN_VARLEN_FUNC


def test_softmax_signatures():
    for fn in (tessera.softmax, tessera.log_softmax):
        assert _params(fn) == [("x", E, P), ("dim", -1, P), ("dtype", None, K), ("out", None, K)]


def test_every_public_function_has_a_docstring():
    for name in tessera.__all__:
        obj = getattr(tessera, name)
        if callable(obj):
            assert obj.__doc__ and len(obj.__doc__.strip()) > 20, name
    assert tessera.__doc__ and "flash_attn_func" in tessera.__doc__


def test_stubs_and_py_typed_are_installed_and_match_the_extension():
    pkg = pathlib.Path(tessera.__file__).parent
    assert (pkg / "py.typed").is_file()
    stub = pkg / "_tessera.pyi"
    tree = ast.parse(stub.read_text())
    stubbed = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    stubbed |= {t.target.id for t in tree.body if isinstance(t, ast.AnnAssign)}
    exported = {n for n in dir(_tessera) if not n.startswith("_")} | {"__version__"}
    assert exported - {"Desc"} <= stubbed | {"__version__"}, exported - stubbed
    assert stubbed - {"Desc"} <= exported, stubbed - exported
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            assert ast.get_docstring(n), n.name


# -- argument validation (no device) -------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        ({"dropout_p": 0.1}, "dropout_p"),
        ({"alibi_slopes": Fake((4,), "<f4")}, "alibi_slopes"),
        ({"deterministic": True}, "deterministic"),
    ],
)
def test_unsupported_flash_attn_arguments_raise_not_implemented(kwargs, arg):
    with pytest.raises(NotImplementedError, match=f"`{arg}`") as e:
        tessera.flash_attn_func(*qkv(), **kwargs)
    assert isinstance(e.value, tessera.UnsupportedError)
    cu = Fake((2,), "<i4")
    with pytest.raises(tessera.UnsupportedError, match=f"`{arg}`"):
        tessera.flash_attn_varlen_func(*[Fake((16, 4, 64)) for _ in range(3)], cu, cu, 16, 16, **kwargs)


def test_block_table_is_not_bound_yet():
    cu = Fake((2,), "<i4")
    t = Fake((16, 4, 64))
    with pytest.raises(NotImplementedError, match="`block_table`"):
        tessera.flash_attn_varlen_func(t, t, t, cu, cu, 16, 16, block_table=Fake((1, 4), "<i4"))


@pytest.mark.parametrize(
    "q, k, v, kwargs, exc, text",
    [
        (*qkv(h=4, hk=3), {}, ValueError, "invalid argument `heads_q`: heads_q (4) must be a positive multiple of heads_kv (3)"),
        (*qkv(typestr="<f4"), {}, NotImplementedError, "attention dtype fp32: supported are fp16 and bf16"),
        (*qkv(d=264), {}, NotImplementedError, "head dim 264"),
        (Fake((16, 4, 64)), Fake((16, 4, 64)), Fake((16, 4, 64)), {}, ValueError, "q must be rank 4"),
        (*qkv(), {"window_size": (-2, 0)}, ValueError, "window sizes must be >= -1"),
        (*qkv(), {"window_size": 3}, ValueError, "`window_size`"),
        (*qkv(), {"softcap": -1.0}, ValueError, "softcap must be finite and >= 0"),
        (*qkv(), {"softmax_scale": -0.5}, ValueError, "softmax scale must be finite and > 0"),
        (Fake((1, 16, 4, 64)), Fake((1, 16, 2, 64)), Fake((1, 16, 2, 32)), {}, ValueError, "k and v must have the same shape"),
        (Fake((1, 16, 4, 64)), Fake((1, 16, 2, 64), "<f2"), Fake((1, 16, 2, 64), "<f4"), {}, ValueError, "must share a dtype"),
    ],
)
def test_flash_attn_validation_errors_carry_tessera_messages(q, k, v, kwargs, exc, text):
    with pytest.raises(exc) as e:
        tessera.flash_attn_func(q, k, v, **kwargs)
    assert text in str(e.value)
    assert isinstance(e.value, tessera.TesseraError)


def test_flash_attn_last_dim_must_be_contiguous_for_interface_objects():
    q = Fake((1, 16, 4, 64), strides=(16 * 4 * 128 * 2, 4 * 128 * 2, 128 * 2, 4))
    k, v = Fake((1, 16, 4, 64)), Fake((1, 16, 4, 64))
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        tessera.flash_attn_func(q, k, v)


def test_varlen_validation():
    t = Fake((16, 4, 64))
    cu2, cu3 = Fake((2,), "<i4"), Fake((3,), "<i4")
    with pytest.raises(ValueError, match="`cu_seqlens_q`: must be int32, got float32"):
        tessera.flash_attn_varlen_func(t, t, t, Fake((2,), "<f4"), cu2, 16, 16)
    with pytest.raises(ValueError, match="cu_seqlens_q has 2 entries but cu_seqlens_k has 3"):
        tessera.flash_attn_varlen_func(t, t, t, cu2, cu3, 16, 16)
    with pytest.raises(ValueError, match="max_seqlen_q = 17 exceeds the 16 packed rows"):
        tessera.flash_attn_varlen_func(t, t, t, cu2, cu2, 17, 16)
    with pytest.raises(ValueError, match="`max_seqlen_k`: must be a non-negative int"):
        tessera.flash_attn_varlen_func(t, t, t, cu2, cu2, 16, -1)
    with pytest.raises(ValueError, match="contiguous 1-D"):
        tessera.flash_attn_varlen_func(t, t, t, Fake((2, 1), "<i4"), cu2, 16, 16)
    with pytest.raises(ValueError, match="rank 3"):
        tessera.flash_attn_varlen_func(*qkv(), cu2, cu2, 16, 16)


def test_host_cu_seqlens_checker():
    assert _tessera.validate_cu_seqlens([0, 3, 3, 10], [0, 5, 6, 6]) == (7, 5)
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be non-decreasing: cu_seqlens_q\[2\] = 2 < cu_seqlens_q\[1\] = 3"):
        _tessera.validate_cu_seqlens([0, 3, 2], [0, 1, 2])
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[0\] must be 0"):
        _tessera.validate_cu_seqlens([0, 1], [1, 2])


def test_softmax_validation():
    with pytest.raises(NotImplementedError, match="softmax input dtype i32; supported: fp32, fp16, bf16"):
        tessera.softmax(Fake((4, 8), "<i4"))
    with pytest.raises(NotImplementedError, match="output dtype fp64"):
        tessera.log_softmax(Fake((4, 8), "<f4"), out=Fake((4, 8), "<f8"))
    with pytest.raises(ValueError, match=r"`output`: shape \[4, 9\] differs from the input's \[4, 8\]"):
        tessera.softmax(Fake((4, 8), "<f4"), out=Fake((4, 9), "<f4"))
    with pytest.raises(ValueError, match="`dim`: dimension 2 is out of range for a tensor of 2 dims"):
        tessera.softmax(Fake((4, 8), "<f4"), dim=2)
    with pytest.raises(NotImplementedError, match="other than the last needs a torch tensor"):
        tessera.softmax(Fake((4, 8), "<f4"), dim=0)
    with pytest.raises(ValueError, match="read-only"):
        tessera.softmax(Fake((4, 8), "<f4"), out=Fake((4, 8), "<f4", readonly=True))
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        tessera.softmax(Fake((4, 8), "<f4", strides=(64, 8)))
    with pytest.raises(TypeError, match="__cuda_array_interface__"):
        tessera.softmax([1.0, 2.0])


def test_plan_cache_info_shape():
    info = tessera.plan_cache_info()
    assert info["capacity"] == _tessera.PLAN_CACHE_CAPACITY > 0
    for kind in ("softmax", "attention", "gemm"):
        assert info[kind] >= 0 and info[f"{kind}_hits"] >= 0 and info[f"{kind}_misses"] >= 0
    tessera.clear_plan_cache()
    assert tessera.plan_cache_info()["softmax"] == 0


# -- without a GPU -------------------------------------------------------------------------


@pytest.mark.skipif(GPU, reason="a GPU is usable here")
def test_calls_without_a_gpu_raise_no_gpu_error():
    assert tessera.is_available() is False
    with pytest.raises(tessera.NoGpuError) as e:
        tessera.device_info()
    text = str(e.value)
    assert any(s in text for s in ("CUDA driver library not found", "no CUDA device", "NVRTC library not found")), text
    # valid calls get as far as the device and stop there with the same error
    with pytest.raises(tessera.NoGpuError, match="not found|no CUDA device"):
        tessera.softmax(Fake((4, 8), "<f4"))
    with pytest.raises(RuntimeError, match="not found|no CUDA device"):
        tessera.flash_attn_func(*qkv(), causal=True, out=Fake((1, 16, 4, 64)))
    cu = Fake((2,), "<i4")
    with pytest.raises(tessera.NoGpuError):
        t = Fake((16, 4, 64))
        tessera.flash_attn_varlen_func(t, t, t, cu, cu, 16, 16, out=Fake((16, 4, 64)))


@pytest.mark.skipif(not GPU, reason="no GPU here")
def test_device_info_with_a_gpu():
    info = tessera.device_info(0)
    assert info["sm_count"] > 0 and info["arch"].startswith("sm_")


def test_nvrtc_location_is_not_forced_when_absent():
    # find_nvrtc only sets TESSERA_NVRTC to a file that exists
    path = os.environ.get("TESSERA_NVRTC")
    assert path is None or os.path.isfile(path)


def readme_python_blocks() -> list[str]:
    """Every ```python block of the repository README's "## Python" section, in order."""
    readme = pathlib.Path(__file__).resolve().parents[3] / "README.md"
    text = readme.read_text()
    section = text[text.index("\n## Python\n") :]
    nxt = section.find("\n## ", 1)
    section = section if nxt < 0 else section[:nxt]
    blocks, pos = [], 0
    while (start := section.find("```python\n", pos)) >= 0:
        start += len("```python\n")
        end = section.index("\n```", start)
        blocks.append(section[start:end])
        pos = end + 4
    return blocks


def readme_example() -> str:
    """The README's Python example of attention and softmax (the block calling flash_attn_func)."""
    return next(b for b in readme_python_blocks() if "tessera.flash_attn_func" in b)


def paged_readme_example() -> str:
    """The README's Python example of the paged KV cache (the block making a PagedKVCache)."""
    return next(b for b in readme_python_blocks() if "tessera.PagedKVCache" in b)


def test_readme_example_compiles():
    # it runs on the GPU machine (test_gpu.py); here it must at least be valid Python
    code = readme_example()
    assert "tessera.flash_attn_func" in code
    compile(code, "README.md", "exec")


# -- paged KV cache (no device) ------------------------------------------------------------

DECODE_PLAN = [
    ("indptr", E, P),
    ("indices", E, P),
    ("last_page_len", E, P),
    ("num_qo_heads", E, P),
    ("num_kv_heads", E, P),
    ("head_dim", E, P),
    ("page_size", E, P),
    ("pos_encoding_mode", "NONE", P),
    ("window_left", -1, P),
    ("logits_soft_cap", None, P),
    ("q_data_type", "float16", P),
    ("kv_data_type", None, P),
    ("o_data_type", None, P),
    ("data_type", None, P),
    ("sm_scale", None, P),
    ("rope_scale", None, P),
    ("rope_theta", None, P),
    ("non_blocking", True, P),
    ("block_tables", None, P),
    ("seq_lens", None, P),
    ("fixed_split_size", None, P),
    ("disable_split_kv", False, P),
]


def test_paged_kv_signatures_match_flashinfer():
    W = tessera.BatchDecodeWithPagedKVCacheWrapper
    assert _params(W.plan)[1:] == DECODE_PLAN
    assert [p[0] for p in _params(W.__init__)[1:3]] == ["float_workspace_buffer", "kv_layout"]
    run = _params(W.run)[1:]
    assert run[:2] == [("q", E, P), ("paged_kv_cache", E, P)]
    assert {(n, d) for n, d, k in run[2:] if k == K} >= {("out", None), ("lse", None), ("return_lse", False), ("layer", 0)}
    assert _params(tessera.append_paged_kv_cache) == [
        ("append_key", E, P),
        ("append_value", E, P),
        ("batch_indices", E, P),
        ("positions", E, P),
        ("paged_kv_cache", E, P),
        ("kv_indices", E, P),
        ("kv_indptr", E, P),
        ("kv_last_page_len", E, P),
        ("kv_layout", "NHD", P),
        ("layer", 0, K),
    ]
    for obj in (tessera.PagedKVCache, W, W.plan, W.run, W.append, tessera.PagedKVCache.kv_cache,
                tessera.PagedKVCache.scales, tessera.PagedKVCache.copy_pages, tessera.PagedKVCache.set_scales):
        assert obj.__doc__ and len(obj.__doc__.strip()) > 40, obj


@pytest.mark.parametrize(
    "kwargs, exc, text",
    [
        ({"page_size": 12}, ValueError, "`page_size`: must be a power of two from 8 to 256, got 12"),
        ({"head_dim": 96}, NotImplementedError, "paged KV cache head_dim 96: supported head dims are [64, 128, 256]"),
        ({"num_pages": 0}, ValueError, "`num_pages`: must be in 1..="),
        ({"num_kv_heads": 0}, ValueError, "`heads_kv`: must be in 1..=1024, got 0"),
        ({"num_layers": 0}, ValueError, "`num_layers`: must be at least 1"),
        ({"dtype": "float32"}, NotImplementedError, "`dtype` = float32: supported are"),
        ({"fp8_scale": -1.0, "dtype": "fp8_e4m3"}, ValueError, "`fp8_scale`: must be in (0, 65504]"),
        ({"num_pages": -1}, ValueError, "`num_pages`: must be a non-negative int"),
    ],
)
def test_paged_kv_cache_config_errors(kwargs, exc, text):
    args = {"num_pages": 16, "page_size": 16, "num_kv_heads": 2, "head_dim": 64, **kwargs}
    with pytest.raises(exc) as e:
        tessera.PagedKVCache(**args)
    assert text in str(e.value)
    assert isinstance(e.value, tessera.TesseraError)


def test_check_kv_cache_returns_the_layer_bytes():
    assert _tessera.check_kv_cache((10, 16, 2, 64, "float16", 1, 1.0)) == 10 * 2 * 16 * 2 * 64 * 2
    assert _tessera.check_kv_cache((10, 16, 2, 64, "fp8e4m3", 3, 1.0)) == 10 * 2 * 16 * 2 * 64


def _planned(**kw):
    w = tessera.BatchDecodeWithPagedKVCacheWrapper()
    args = dict(indptr=[0, 2, 3], indices=[5, 1, 7], last_page_len=[3, 16], num_qo_heads=8, num_kv_heads=2,
                head_dim=64, page_size=16)
    args.update(kw)
    w.plan(**args)
    return w


def test_decode_plan_validates_on_the_host():
    w = _planned()  # no device needed: plan() checks and keeps the tables
    assert w._w.planned_shape() == (2, 8, 64)
    assert w.describe() is None
    _planned(kv_data_type="fp8_e4m3")
    _planned(q_data_type="bfloat16", kv_data_type="bf16", sm_scale=0.1, disable_split_kv=True)


# (plan() keyword arguments, tessera's (q, kv) names): FlashInfer's rule, data_type fills only the
# dtypes that are None, and q_data_type defaults to "float16"
PLAN_DTYPES = [
    ({}, ("float16", "float16")),
    ({"q_data_type": "bfloat16"}, ("bfloat16", "bfloat16")),
    ({"kv_data_type": "fp8_e4m3"}, ("float16", "fp8e4m3")),
    # FlashInfer's own fp8 decode test: data_type for the cache, q_data_type for the query
    ({"data_type": "float8_e4m3fn", "q_data_type": "float16"}, ("float16", "fp8e4m3")),
    ({"data_type": "float8_e4m3fn", "q_data_type": "bfloat16"}, ("bfloat16", "fp8e4m3")),
    ({"data_type": "float8_e4m3fn"}, ("float16", "fp8e4m3")),  # q keeps its default
    ({"data_type": "float16"}, ("float16", "float16")),
    ({"data_type": "bfloat16", "q_data_type": "bfloat16"}, ("bfloat16", "bfloat16")),
    ({"data_type": "bfloat16", "q_data_type": None}, ("bfloat16", "bfloat16")),
    ({"data_type": "bfloat16", "q_data_type": None, "kv_data_type": "fp8_e4m3"}, ("bfloat16", "fp8e4m3")),
    # explicit arguments win over data_type
    ({"data_type": "float16", "q_data_type": "bf16", "kv_data_type": "bf16"}, ("bfloat16", "bfloat16")),
    ({"data_type": "bfloat16", "kv_data_type": "fp8e4m3"}, ("float16", "fp8e4m3")),
    ({"q_data_type": "half", "o_data_type": "float16"}, ("float16", "float16")),
]


@pytest.mark.parametrize("kwargs, want", PLAN_DTYPES, ids=lambda x: str(x))
def test_decode_plan_dtype_resolution_follows_flashinfer(kwargs, want):
    from tessera._kvcache import resolve_plan_dtypes  # noqa: PLC0415

    assert resolve_plan_dtypes(**kwargs) == want
    w = _planned(**kwargs)  # plan() resolves the same way (and validates the pair on the host)
    assert w._q_dtype == want[0]


class _Dtype:
    """A stand-in torch dtype: str() gives ``torch.<name>``, as torch's dtypes do."""

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


def test_decode_plan_dtype_resolution_takes_torch_dtypes():
    from tessera._kvcache import resolve_plan_dtypes  # noqa: PLC0415

    f16, fp8 = _Dtype("float16"), _Dtype("float8_e4m3fn")
    assert resolve_plan_dtypes(f16, None, None, fp8) == ("float16", "fp8e4m3")
    assert resolve_plan_dtypes(None, None, _Dtype("bfloat16"), _Dtype("bfloat16")) == ("bfloat16", "bfloat16")


@pytest.mark.parametrize(
    "kwargs, exc, text",
    [
        # a 16-bit cache must match q; data_type alone leaves q at its float16 default
        ({"data_type": "bfloat16"}, ValueError, "`data_type`: sets only the dtypes not given"),
        ({"q_data_type": None}, ValueError, "`q_data_type`: must be a dtype"),
        ({"data_type": "float32", "q_data_type": None}, NotImplementedError, "`q_data_type` = float32"),
        ({"data_type": "float32"}, NotImplementedError, "`kv_data_type` = float32"),
        ({"data_type": "fp8_e4m3", "q_data_type": None}, NotImplementedError, "`q_data_type` = fp8_e4m3"),
        ({"data_type": "fp8_e4m3", "o_data_type": "bfloat16"}, NotImplementedError, "`o_data_type`"),
    ],
)
def test_decode_plan_dtype_resolution_errors(kwargs, exc, text):
    from tessera._kvcache import resolve_plan_dtypes  # noqa: PLC0415

    for call in (lambda: resolve_plan_dtypes(**kwargs), lambda: _planned(**kwargs)):
        with pytest.raises(exc) as e:
            call()
        assert text in str(e.value)
        assert isinstance(e.value, tessera.TesseraError)


def test_decode_lse_convention_is_flashinfers_base_2():
    import math  # noqa: PLC0415

    from tessera import _kvcache  # noqa: PLC0415

    assert _kvcache.LOG2E == math.log2(math.e)
    W = tessera.BatchDecodeWithPagedKVCacheWrapper
    for doc in (W.run.__doc__, W.run_return_lse.__doc__):
        assert "base 2" in doc and "-inf" in doc
    assert "natural log" in tessera.flash_attn_func.__doc__ and "-inf" in tessera.flash_attn_func.__doc__
    assert "-inf" in tessera.flash_attn_varlen_func.__doc__
    # FlashInfer: run_return_lse = partialmethod(run, return_lse=True): run's arguments, less return_lse
    run = [p for p in _params(W.run) if p[0] != "return_lse"]
    assert _params(W.run_return_lse) == run
    assert W.forward_return_lse is W.run_return_lse
    w = W()
    with pytest.raises(ValueError, match=r"call plan\(\.\.\.\) first"):
        w.run_return_lse(Fake((2, 8, 64)), None)
    w = _planned()
    with pytest.raises(NotImplementedError, match="`k_scale`"):
        w.run_return_lse(Fake((2, 8, 64)), None, k_scale=0.5)


@pytest.mark.parametrize(
    "kwargs, exc, text",
    [
        ({"pos_encoding_mode": "ROPE_LLAMA"}, NotImplementedError, "`pos_encoding_mode`"),
        ({"window_left": 128}, NotImplementedError, "`window_left`"),
        ({"logits_soft_cap": 30.0}, NotImplementedError, "`logits_soft_cap`"),
        ({"block_tables": [[0]]}, NotImplementedError, "`block_tables`"),
        ({"fixed_split_size": 4}, NotImplementedError, "`fixed_split_size`"),
        ({"o_data_type": "float32"}, NotImplementedError, "`o_data_type`"),
        ({"q_data_type": "float32"}, NotImplementedError, "`q_data_type` = float32"),
        ({"kv_data_type": "float32"}, NotImplementedError, "`kv_data_type` = float32"),
        ({"num_qo_heads": 6, "num_kv_heads": 4}, ValueError, "`heads_q`: must be a positive multiple of heads_kv = 4"),
        ({"head_dim": 96}, NotImplementedError, "head_dim 96"),
        ({"page_size": 24}, ValueError, "`page_size`: must be a power of two"),
        ({"last_page_len": [17, 16]}, ValueError, "`last_page_len`: last_page_len[0] = 17 must be in 0..=16"),
        ({"last_page_len": [3]}, ValueError, "must have batch_size = 2 entries"),
        ({"indptr": [0, 3, 2]}, ValueError, "`indptr`: must be non-decreasing"),
        ({"indptr": [0]}, ValueError, "`indptr`: must have batch_size + 1 >= 2 entries"),
        ({"indptr": [0, 2, 4]}, ValueError, "`indptr`: must start at 0 and end within indices (3 entries)"),
        ({"indices": [5, -1, 7]}, ValueError, "physical page -1 is out of range"),
        ({"indices": [5, 1.5, 7]}, ValueError, "`indices`: must hold ints"),
        ({"sm_scale": -1.0}, ValueError, "`sm_scale`: must be finite and > 0"),
        ({"q_data_type": "bf16", "kv_data_type": "fp16"}, ValueError, "does not match the fp16 cache"),
    ],
)
def test_decode_plan_errors_name_the_argument(kwargs, exc, text):
    with pytest.raises(exc) as e:
        _planned(**kwargs)
    assert text in str(e.value)


def test_decode_wrapper_options_and_run_errors():
    with pytest.raises(NotImplementedError, match="`kv_layout`"):
        tessera.BatchDecodeWithPagedKVCacheWrapper(None, "HND")
    with pytest.raises(NotImplementedError, match="`use_cuda_graph`"):
        tessera.BatchDecodeWithPagedKVCacheWrapper(None, use_cuda_graph=True)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper()
    q = Fake((2, 8, 64))
    with pytest.raises(ValueError, match=r"call plan\(\.\.\.\) first"):
        w.run(q, None)
    with pytest.raises(ValueError, match=r"call plan\(\.\.\.\) first"):
        w.append(Fake((2, 2, 64)), Fake((2, 2, 64)), None)
    w = _planned()
    with pytest.raises(TypeError, match="must be a tessera.PagedKVCache"):
        w.run(q, Fake((8, 2, 16, 2, 64)))
    with pytest.raises(NotImplementedError, match="`k_scale`"):
        w.run(q, None, k_scale=0.5)
    with pytest.raises(TypeError, match="must be a tessera.PagedKVCache"):
        tessera.append_paged_kv_cache(q, q, [0], [0], object(), [0], [0, 1], [1])


def test_append_positions_must_be_each_sequences_last():
    from tessera._kvcache import _counts, _lengths  # noqa: PLC0415

    assert _lengths([0, 2, 3, 3], [3, 16, 0], 16) == [19, 16, 0]
    # lengths after the append 19 and 16; 2 rows for sequence 0, 1 for sequence 1
    assert _counts([0, 0, 1], [17, 18, 15], [19, 16]) == [2, 1]
    assert _counts([], [], [19, 16]) == [0, 0]
    with pytest.raises(NotImplementedError, match=r"`positions`: .* positions\[1\] must be 18, got 17"):
        _counts([0, 0, 1], [17, 17, 15], [19, 16])
    with pytest.raises(NotImplementedError, match="`batch_indices`: rows must be packed by sequence"):
        _counts([1, 0], [15, 18], [19, 16])
    with pytest.raises(ValueError, match=r"`batch_indices`: batch_indices\[0\] = 2 is not a sequence"):
        _counts([2], [0], [19, 16])
    with pytest.raises(ValueError, match="sequence 1 has no pages, so last_page_len"):
        _lengths([0, 1, 1], [4, 2], 16)


@pytest.mark.skipif(GPU, reason="a GPU is usable here")
def test_paged_kv_cache_without_a_gpu_raises_no_gpu_error():
    with pytest.raises(tessera.NoGpuError, match="not found|no CUDA device"):
        tessera.PagedKVCache(16, 16, 2, 64)


def test_paged_readme_example_compiles():
    code = paged_readme_example()
    assert "BatchDecodeWithPagedKVCacheWrapper" in code and "wrapper.run" in code
    compile(code, "README.md", "exec")


# -- matmul (no device) --------------------------------------------------------------------


def d(shape, dtype="float16", strides=None, ptr=0x7F0000000000):
    """A raw descriptor as the Python layer hands it to the extension."""
    from tessera._tensors import contiguous_strides  # noqa: PLC0415

    return (ptr, dtype, tuple(shape), tuple(strides) if strides is not None else contiguous_strides(shape))


def test_matmul_signature():
    assert _params(tessera.matmul) == [
        ("a", E, P),
        ("b", E, P),
        ("bias", None, K),
        ("activation", None, K),
        ("out_dtype", None, K),
        ("out", None, K),
    ]


@pytest.mark.parametrize(
    "shape, strides, want",
    [
        ((4, 8), (8, 1), "row"),
        ((4, 8), (16, 1), "row"),  # padded rows: lda 16
        ((4, 8), (1, 4), "col"),  # w.t() of a [8, 4] weight
        ((4, 8), (1, 6), "col"),  # a transposed slice of a wider weight
        ((1, 8), (999, 1), "row"),  # a size-1 dimension's stride is ignored
        ((8, 1), (1, 999), "row"),
        ((3, 4, 8), (32, 8, 1), "row"),
        ((3, 4, 8), (0, 1, 4), "col"),  # expanded batch, transposed matrices
        ((4, 8), (2, 16), None),  # neither
        ((4, 8), (0, 1), None),  # broadcast rows overlap
        ((4, 8), (8, 2), None),  # strided columns
        ((8,), (1,), None),  # not a matrix
    ],
)
def test_gemm_operand_layout(shape, strides, want):
    assert _tessera.operand_layout(list(shape), list(strides)) == want


def test_check_matmul_maps_torch_layouts():
    # x [M, K] @ w.t() with w [N, K]: A row-major, B column-major (the weight as stored)
    assert _tessera.check_matmul(d((5, 8)), d((8, 3), strides=(1, 8)), None, d((5, 3), ptr=0)) == ("row", "col")
    # a transposed A is read in place too
    assert _tessera.check_matmul(d((5, 8), strides=(1, 5)), d((8, 3)), None, d((5, 3), ptr=0)) == ("col", "row")
    # batched x shared weight, and shared x batched weight; with a bias and an activation
    for a, b in [((2, 5, 8), (8, 3)), ((5, 8), (2, 8, 3)), ((1, 5, 8), (2, 8, 3))]:
        _tessera.check_matmul(d(a), d(b), d((3,)), d((2, 5, 3), ptr=0), "gelu_tanh")
    # fp16 in, fp32 out (with an fp32 bias); fp64
    _tessera.check_matmul(d((5, 8)), d((8, 3)), d((3,), "float32"), d((5, 3), "float32", ptr=0), "silu")
    _tessera.check_matmul(d((5, 8), "float64"), d((8, 3), "float64"), None, d((5, 3), "float64", ptr=0), "relu")


@pytest.mark.parametrize(
    "args, exc, text",
    [
        ((d((5, 8)), d((7, 3)), None, d((5, 3), ptr=0)), ValueError, "invalid argument `b`: shape [7, 3] cannot multiply a of shape [5, 8]: b has 7 rows"),
        ((d((5, 8)), d((8, 3), "float32"), None, d((5, 3), ptr=0)), ValueError, "`b`: has dtype float32, a has float16"),
        ((d((5, 8), "float8_e4m3fn"), d((8, 3)), None, d((5, 3), ptr=0)), NotImplementedError,
         "`a` has dtype float8_e4m3fn: tessera.matmul takes float16, bfloat16, float32 and float64; fp8 inputs go through tessera.scaled_mm"),
        ((d((5, 8)), d((8, 3), "int8"), None, d((5, 3), ptr=0)), NotImplementedError,
         "`b` has dtype int8: tessera.matmul takes float16, bfloat16, float32 and float64; int8 inputs go through tessera.int_mm"),
        ((d((5, 8), "int32"), d((8, 3)), None, d((5, 3), ptr=0)), NotImplementedError, "`a` has dtype int32"),
        ((d((8,)), d((8, 3)), None, d((3,))), ValueError, "`a`: must be 2-D or 3-D (batched)"),
        ((d((5, 8)), d((8, 3)), d((4,)), d((5, 3), ptr=0)), ValueError, "`bias`: has shape [4]"),
        ((d((5, 8)), d((8, 3)), d((3,), strides=(2,)), d((5, 3), ptr=0)), ValueError, "it must be a contiguous [3] vector"),
        ((d((5, 8)), d((8, 3)), d((3,), "float32"), d((5, 3), ptr=0)), ValueError, "`bias`: has dtype float32; it must have the output's dtype float16"),
        ((d((5, 8)), d((8, 3)), None, d((5, 4), ptr=0)), ValueError, "`out`: has shape [5, 4]; the product is [5, 3]"),
        ((d((5, 8)), d((8, 3)), None, d((5, 3), strides=(1, 5), ptr=0)), ValueError, "`out`: strides [1, 5] are not row-major"),
        ((d((5, 8), "float32"), d((8, 3), "float32"), None, d((5, 3), ptr=0)), NotImplementedError,
         "GEMM fp32 inputs with fp16 output; supported outputs: fp32"),
        ((d((2, 5, 8)), d((3, 8, 3)), None, d((3, 5, 3), ptr=0)), ValueError, "`b`: batch 3 differs from a's batch 2"),
        ((d((5, 8), strides=(2, 16)), d((8, 3)), None, d((5, 3), ptr=0)), ValueError, "`a`: strides [2, 16] of shape [5, 8]"),
        ((d((5, 8)), d((8, 3)), None, d((5, 3), ptr=0x7F0000000000)), ValueError, "`out`: shares memory with an input"),
    ],
)
def test_check_matmul_errors_name_the_argument(args, exc, text):
    with pytest.raises(exc) as e:
        _tessera.check_matmul(*args)
    assert text in str(e.value)
    assert isinstance(e.value, tessera.TesseraError)


def test_matmul_validation_through_the_python_layer():
    a, b = Fake((5, 8)), Fake((8, 3))
    with pytest.raises(ValueError, match='`activation`: unknown activation "tanh"'):
        tessera.matmul(a, b, activation="tanh")
    with pytest.raises(ValueError, match="`activation`: must be None or one of relu"):
        tessera.matmul(a, b, activation=1)
    with pytest.raises(ValueError, match="`b`: shape"):
        tessera.matmul(a, Fake((7, 3)))
    with pytest.raises(ValueError, match="`a`: must be 2-D or 3-D"):
        tessera.matmul(Fake((2, 2, 5, 8)), b)
    # an interface object whose strides the GEMM cannot read is not copied: it raises
    with pytest.raises(ValueError, match="`a`: strides \\[2, 16\\] of shape \\[5, 8\\] are neither"):
        tessera.matmul(Fake((5, 8), strides=(4, 32)), b)
    with pytest.raises(ValueError, match="`out`: has dtype float16 but out_dtype=float32"):
        tessera.matmul(a, b, out=Fake((5, 3)), out_dtype="float32")
    with pytest.raises(NotImplementedError, match="fp16 inputs with fp64 output"):
        tessera.matmul(a, b, out_dtype="float64")
    with pytest.raises(ValueError, match="read-only"):
        tessera.matmul(a, b, out=Fake((5, 3), readonly=True))


def test_matmul_batch_of_the_product():
    from tessera._matmul import _batch  # noqa: PLC0415

    assert [_batch(b) for b in ([], [4], [4, 4], [1, 4], [4, 1], [0], [0, 1], [1, 0])] == [1, 4, 4, 4, 4, 0, 0, 0]


@pytest.mark.skipif(GPU, reason="a GPU is usable here")
def test_matmul_without_a_gpu_raises_no_gpu_error():
    with pytest.raises(tessera.NoGpuError):
        tessera.matmul(Fake((5, 8)), Fake((8, 3), strides=(2, 16)), out=Fake((5, 3), ptr=0x7F0000100000))


# -- scaled_mm / int_mm (no device) ----------------------------------------------------------

E4, E5, I8 = "float8_e4m3fn", "float8_e5m2", "int8"
M_, N_, K_ = 32, 48, 64


def lowp(dtype=E4, m=M_, n=N_, k=K_, b_strides=None, a_strides=None):
    """fp8/int8 operands as torch._scaled_mm wants them: a [M, K] row-major, b = w.t() of a [N, K] w."""
    return d((m, k), dtype, strides=a_strides), d((k, n), dtype, strides=b_strides or (1, k), ptr=0x7F0000100000)


def scales(sa=(), sb=(), dtype="float32", sa_strides=None):
    return d(sa, dtype, strides=sa_strides, ptr=0x7F0000200000), d(sb, dtype, ptr=0x7F0000300000)


def out(dtype="bfloat16", m=M_, n=N_):
    return d((m, n), dtype, ptr=0)


def test_scaled_mm_and_int_mm_signatures_match_torch():
    # torch._scaled_mm (torch >= 2.5: one tensor returned) and torch._int_mm
    assert _params(tessera.scaled_mm) == [
        ("a", E, P),
        ("b", E, P),
        ("scale_a", E, P),
        ("scale_b", E, P),
        ("bias", None, P),
        ("scale_result", None, P),
        ("out_dtype", None, P),
        ("use_fast_accum", False, P),
        ("amax", None, K),  # a tessera extension, keyword only
    ]
    assert _params(tessera.int_mm) == [("a", E, P), ("b", E, P)]


def test_check_scaled_mm_maps_scales():
    a, b = lowp()
    for sa, sb in [((), ()), ((1,), (1,)), ((1, 1), (1, 1)), ((), (1, 1))]:
        assert _tessera.check_scaled_mm(a, b, *scales(sa, sb), None, out()) == "tensor"
    assert _tessera.check_scaled_mm(a, b, *scales((M_, 1), (1, N_)), d((N_,), "bfloat16"), out()) == "row"
    for dt, od in [(E5, "float16"), (E4, "float32"), (I8, "bfloat16"), (I8, "float32")]:
        assert _tessera.check_scaled_mm(*lowp(dt), *scales(), None, out(od)) == "tensor"
    # M = 1: one value of scale_a is also its [M] = [1] vector, so it pairs with a row-wise scale_b
    a1, b1 = lowp(m=1)
    assert _tessera.check_scaled_mm(a1, b1, *scales((), (1, N_)), None, out(m=1)) == "row"
    # padded leading dimensions (multiples of 16 bytes) are read in place
    ap, bp = lowp(a_strides=(K_ + 16, 1), b_strides=(1, K_ + 32))
    assert _tessera.check_scaled_mm(ap, bp, *scales(), None, out()) == "tensor"
    # empty products pass (nothing is launched); K = 0 skips the TMA rules
    assert _tessera.check_scaled_mm(*lowp(m=0), *scales(), None, out(m=0)) == "tensor"
    assert _tessera.check_scaled_mm(*lowp(k=0), *scales(), None, out()) == "tensor"


def one(dtype="float32", shape=(), ptr=0x7F0000400000):
    """A one-value tensor: scale_result (or amax at another address)."""
    return d(shape, dtype, ptr=ptr)


def test_check_scaled_mm_fp8_outputs():
    # fp8 in -> either fp8 format out, with or without scale_result / amax (one value, any of
    # the per-tensor shapes), per-tensor or row-wise scales
    for dt, od in [(E4, E4), (E4, E5), (E5, E4), (E5, E5)]:
        assert _tessera.check_scaled_mm(*lowp(dt), *scales(), None, out(od)) == "tensor"
    a, b = lowp()
    for shape in [(), (1,), (1, 1)]:
        sr, am = one(shape=shape), one(shape=shape, ptr=0x7F0000500000)
        assert _tessera.check_scaled_mm(a, b, *scales(), None, out(E4), sr, am) == "tensor"
        assert _tessera.check_scaled_mm(a, b, *scales((M_, 1), (1, N_)), None, out(E5), sr, None) == "row"
        assert _tessera.check_scaled_mm(a, b, *scales((M_, 1), (1, N_)), None, out(E5), None, am) == "row"
    # N = 16: the smallest 16-byte fp8 row pitch
    assert _tessera.check_scaled_mm(*lowp(n=16), *scales(), None, out(E4, n=16)) == "tensor"
    # empty products and K = 0 pass (the Python layer zeroes the amax)
    assert _tessera.check_scaled_mm(*lowp(m=0), *scales(), None, out(E4, m=0), None, one()) == "tensor"
    assert _tessera.check_scaled_mm(*lowp(k=0), *scales(), None, out(E4), None, one()) == "tensor"


@pytest.mark.parametrize(
    "args, exc, text",
    [
        ((*lowp("float16"), *scales(), None, out()), ValueError,
         "`a`: has dtype float16; tessera.scaled_mm takes float8_e4m3fn or float8_e5m2"),
        ((*lowp("float8_e4m3fnuz"), *scales(), None, out()), ValueError, "`a`: has dtype float8_e4m3fnuz"),
        ((lowp()[0], lowp(E5)[1], *scales(), None, out()), ValueError,
         "`b`: has dtype float8_e5m2, a has float8_e4m3fn: both inputs must have one dtype"),
        ((*lowp(b_strides=(N_, 1)), *scales(), None, out()), ValueError,
         "`b`: strides [48, 1] of shape [64, 48] are row-major; tessera.scaled_mm reads B column-major"),
        ((*lowp(b_strides=(N_, 1)), *scales(), None, out()), ValueError, "pass a row-major [N, K] weight w as w.t()"),
        ((*lowp(b_strides=(2, 256)), *scales(), None, out()), ValueError, "are neither row- nor column-major"),
        ((*lowp(a_strides=(1, M_)), *scales(), None, out()), ValueError,
         "`a`: strides [1, 32] of shape [32, 64] are not row-major"),
        ((d((2, M_, K_), E4), lowp()[1], *scales(), None, out()), ValueError, "`a`: must be 2-D [M, K], got shape [2, 32, 64]"),
        ((lowp()[0], lowp(k=80)[1], *scales(), None, out()), ValueError, "`b`: shape [80, 48] cannot multiply a of shape [32, 64]"),
        ((*lowp(), *scales(dtype="float16"), None, out()), ValueError, "`scale_a`: has dtype float16; scales are float32"),
        ((*lowp(), *scales((M_,), ()), None, out()), ValueError, "`scale_a`: has shape [32]; it must hold one value"),
        ((*lowp(), *scales((), (N_, 1)), None, out()), ValueError, "`scale_b`: has shape [48, 1]"),
        ((*lowp(), *scales((M_, 1), (1, N_), sa_strides=(2, 1)), None, out()), ValueError,
         "`scale_a`: has shape [32, 1] and strides [2, 1]; a row-wise scale must be contiguous"),
        ((*lowp(), *scales((), (1, N_)), None, out()), NotImplementedError,
         "`scale_a` is one value (per-tensor) while `scale_b` is row-wise: mixing per-tensor and row-wise scales is not supported yet"),
        ((*lowp(), *scales((M_, 1), (1, 1)), None, out()), NotImplementedError, "`scale_b` is one value (per-tensor) while `scale_a` is row-wise"),
        ((*lowp(), *scales(), d((N_,), "float32"), out()), ValueError, "`bias`: has dtype float32; it must have the output's dtype bfloat16"),
        ((*lowp(), *scales(), d((N_ - 1,), "bfloat16"), out()), ValueError, "`bias`: has shape [47]"),
        ((*lowp(I8), *scales(), None, out(E4)), NotImplementedError,
         "`out_dtype` = float8_e4m3fn with int8 inputs: tessera.scaled_mm writes bfloat16, float16 or float32"),
        ((*lowp(I8), *scales(), None, out(E5)), NotImplementedError, "fp8 outputs take fp8 inputs"),
        ((*lowp(), *scales(), None, out("float64")), NotImplementedError,
         "`out_dtype` = float64 with float8_e4m3fn inputs: tessera.scaled_mm writes bfloat16, float16, float32, float8_e4m3fn or float8_e5m2"),
        # fp8 outputs: no bias; scale_result and amax only with them, float32 of one element
        ((*lowp(), *scales(), d((N_,), "bfloat16"), out(E4)), NotImplementedError,
         "`bias` with a float8_e4m3fn output: tessera's fp8 outputs take no bias"),
        ((*lowp(), *scales(), d((N_,), "float8_e5m2"), out(E5)), NotImplementedError, "fp8 outputs take no bias"),
        ((*lowp(), *scales(), None, out(), one()), ValueError,
         "`scale_result`: given with a bfloat16 output: the result scale applies to fp8 outputs only"),
        ((*lowp(I8), *scales(), None, out("float32"), one()), ValueError, "`scale_result`: given with a float32 output"),
        ((*lowp(), *scales(), None, out("float16"), None, one()), ValueError,
         "`amax`: given with a float16 output: the output amax is computed for fp8 outputs only"),
        ((*lowp(), *scales(), None, out(E4), one("float16")), ValueError,
         "`scale_result`: has dtype float16 and shape []; it must be a float32 tensor of one element"),
        ((*lowp(), *scales(), None, out(E4), one(shape=(2,))), ValueError, "`scale_result`: has dtype float32 and shape [2]"),
        ((*lowp(), *scales(), None, out(E4), None, one("float64")), ValueError,
         "`amax`: has dtype float64 and shape []; it must be a float32 tensor of one element"),
        ((*lowp(), *scales(), None, out(E4), None, one(shape=(1, 2))), ValueError, "`amax`: has dtype float32 and shape [1, 2]"),
        ((*lowp(), *scales(), None, out(E4), None, one(shape=(0,))), ValueError, "`amax`: has dtype float32 and shape [0]"),
        ((*lowp(), *scales(), None, out(E4), None, one(ptr=0x7F0000200000)), ValueError,
         "`amax`: shares memory with `scale_a`; it is zeroed before the GEMM runs"),
        ((*lowp(), *scales(), None, out(E4), one(), one()), ValueError, "`amax`: shares memory with `scale_result`"),
        ((*lowp(), *scales(), None, out(E4), None, one(ptr=0x7F0000100000 + 5)), ValueError, "`amax`: shares memory with `b`"),
        # an fp8 row is N bytes: the TMA store needs N % 16 == 0
        ((*lowp(n=40), *scales(), None, out(E4, n=40)), ValueError, "`ldd`: 40 bytes is not a multiple of 16"),
        ((*lowp(I8), *scales(), None, out("int32")), ValueError, "an i32 output is the plain int8 product"),
        ((*lowp(), *scales(), None, out(n=40)), ValueError, "`out`: has shape [32, 40]; the product is [32, 48]"),
        ((*lowp(), *scales(), None, d((M_, N_), "bfloat16", strides=(1, M_), ptr=0)), ValueError, "`out`: strides [1, 32] are not row-major"),
        # the Hopper path's TMA rules, checked without a device
        ((*lowp(k=40), *scales(), None, out()), ValueError, "`lda`: 40 bytes is not a multiple of 16"),
        ((*lowp(n=4), *scales(), None, out(n=4)), ValueError, "`ldd`: 8 bytes is not a multiple of 16"),
    ],
)
def test_check_scaled_mm_errors_name_the_argument(args, exc, text):
    with pytest.raises(exc) as e:
        _tessera.check_scaled_mm(*args)
    assert text in str(e.value)
    assert isinstance(e.value, tessera.TesseraError)


def test_check_int_mm():
    assert _tessera.check_int_mm(*lowp(I8), out("int32")) is None
    assert _tessera.check_int_mm(*lowp(I8, m=1), out("int32", m=1)) is None
    cases = [
        ((*lowp(E4), out("int32")), "`a`: has dtype float8_e4m3fn; tessera.int_mm takes int8"),
        ((*lowp(I8, b_strides=(N_, 1)), out("int32")), "`b`: strides [48, 1] of shape [64, 48] are row-major; tessera.int_mm reads B column-major"),
        ((*lowp(I8), out("float32")), "`out`: has dtype float32; int_mm writes int32"),
        ((*lowp(I8, n=2), out("int32", n=2)), "`ldd`: 8 bytes is not a multiple of 16"),
        ((*lowp(I8, k=24), out("int32")), "`lda`: 24 bytes is not a multiple of 16"),
    ]
    for args, text in cases:
        with pytest.raises(ValueError) as e:
            _tessera.check_int_mm(*args)
        assert text in str(e.value), (text, str(e.value))


def test_scaled_mm_validation_through_the_python_layer():
    # int8 stand-ins (the CUDA array interface has no fp8 type string)
    a, b = Fake((M_, K_), "|i1"), Fake((K_, N_), "|i1", strides=(1, K_))
    sa, sb = Fake((), "<f4", ptr=0x7F0000200000), Fake((), "<f4", ptr=0x7F0000300000)
    sr, am = Fake((1,), "<f4", ptr=0x7F0000400000), Fake((1, 1), "<f4", ptr=0x7F0000500000)
    with pytest.raises(tessera.InvalidArgumentError, match="`scale_result`: given with a bfloat16 output"):
        tessera.scaled_mm(a, b, sa, sb, scale_result=sr, out_dtype="bfloat16")
    with pytest.raises(tessera.InvalidArgumentError, match="`amax`: given with a float32 output"):
        tessera.scaled_mm(a, b, sa, sb, out_dtype="float32", amax=am)
    with pytest.raises(tessera.UnsupportedError, match="`out_dtype` = None with int8 inputs: .* pass out_dtype=torch.bfloat16"):
        tessera.scaled_mm(a, b, sa, sb)
    with pytest.raises(NotImplementedError, match="`out_dtype` = float8_e4m3fn with int8 inputs"):
        tessera.scaled_mm(a, b, sa, sb, out_dtype="float8_e4m3fn")
    with pytest.raises(NotImplementedError, match="`out_dtype` = int32: tessera.scaled_mm writes bfloat16, float16, float32, float8_e4m3fn, float8_e5m2"):
        tessera.scaled_mm(a, b, sa, sb, out_dtype="int32")
    with pytest.raises(ValueError, match="`b`: strides \\[48, 1\\] of shape \\[64, 48\\] are row-major.*w.t\\(\\)"):
        tessera.scaled_mm(a, Fake((K_, N_), "|i1", ptr=0x7F0000100000), sa, sb, out_dtype="bfloat16")
    with pytest.raises(ValueError, match="`scale_b`: has shape \\[48\\]"):
        tessera.scaled_mm(a, b, sa, Fake((N_,), "<f4"), out_dtype="bfloat16")
    with pytest.raises(ValueError, match="`b`: strides .* are row-major"):
        tessera.int_mm(a, Fake((K_, N_), "|i1", ptr=0x7F0000100000))
    with pytest.raises(ValueError, match="`a`: has dtype float16; tessera.int_mm takes int8"):
        tessera.int_mm(Fake((M_, K_)), b)


def fp8_fakes(dtype=E4, n=N_):
    """fp8 stand-ins: the CUDA array interface has no fp8 type string, so these carry torch's
    dtype name in `typestr`, which tessera's reader passes through as the dtype (one byte)."""
    return Fake((M_, K_), dtype), Fake((K_, n), dtype, strides=(1, K_), ptr=0x7F0000100000)


def test_scaled_mm_fp8_output_validation_through_the_python_layer():
    a, b = fp8_fakes()
    sa, sb = Fake((), "<f4", ptr=0x7F0000200000), Fake((), "<f4", ptr=0x7F0000300000)
    bias = Fake((N_,), "<f2", ptr=0x7F0000600000)
    with pytest.raises(tessera.UnsupportedError, match="`bias` with a float8_e4m3fn output: tessera's fp8 outputs take no bias"):
        tessera.scaled_mm(a, b, sa, sb, bias=bias)  # out_dtype None: a's float8_e4m3fn
    with pytest.raises(tessera.UnsupportedError, match="`bias` with a float8_e5m2 output"):
        tessera.scaled_mm(a, b, sa, sb, bias=bias, out_dtype="float8_e5m2")
    with pytest.raises(tessera.InvalidArgumentError, match="`amax`: has dtype float16 and shape \\[\\]"):
        tessera.scaled_mm(a, b, sa, sb, amax=Fake((), "<f2", ptr=0x7F0000500000))
    with pytest.raises(tessera.InvalidArgumentError, match="`amax`: has dtype float32 and shape \\[2\\]"):
        tessera.scaled_mm(a, b, sa, sb, amax=Fake((2,), "<f4", ptr=0x7F0000500000))
    with pytest.raises(tessera.InvalidArgumentError, match="`amax`: is read-only"):
        tessera.scaled_mm(a, b, sa, sb, amax=Fake((1,), "<f4", ptr=0x7F0000500000, readonly=True))
    with pytest.raises(tessera.InvalidArgumentError, match="`scale_result`: has dtype float32 and shape \\[1, 2\\]"):
        tessera.scaled_mm(a, b, sa, sb, scale_result=Fake((1, 2), "<f4", ptr=0x7F0000400000))
    with pytest.raises(tessera.InvalidArgumentError, match="`scale_result`: given with a bfloat16 output"):
        tessera.scaled_mm(a, b, sa, sb, scale_result=Fake((), "<f4", ptr=0x7F0000400000), out_dtype="bfloat16")
    a40, b40 = fp8_fakes(n=40)
    with pytest.raises(tessera.InvalidArgumentError, match="`ldd`: 40 bytes is not a multiple of 16"):
        tessera.scaled_mm(a40, b40, sa, sb, out_dtype="float8_e5m2")


@pytest.mark.skipif(GPU, reason="a GPU is usable here")
def test_scaled_mm_fp8_output_is_validated_up_to_the_device():
    # out_dtype None (torch's default: a's fp8 dtype) and the fp8 extras pass validation; the
    # call stops only where the device is needed
    sa, sb = Fake((M_, 1), "<f4", ptr=0x7F0000200000), Fake((1, N_), "<f4", ptr=0x7F0000300000)
    sr, am = Fake((), "<f4", ptr=0x7F0000400000), Fake((1,), "<f4", ptr=0x7F0000500000)
    for dt in (E4, E5):
        a, b = fp8_fakes(dt)
        with pytest.raises(tessera.NoGpuError):
            tessera.scaled_mm(a, b, sa, sb)
        for od in (E4, E5):
            with pytest.raises(tessera.NoGpuError):
                tessera.scaled_mm(a, b, sa, sb, scale_result=sr, out_dtype=od, amax=am)


@pytest.mark.skipif(GPU, reason="a GPU is usable here")
def test_scaled_mm_and_int_mm_without_a_gpu_raise_no_gpu_error():
    a, b = Fake((M_, K_), "|i1"), Fake((K_, N_), "|i1", strides=(1, K_), ptr=0x7F0000100000)
    sa, sb = Fake((M_, 1), "<f4", ptr=0x7F0000200000), Fake((1, N_), "<f4", ptr=0x7F0000300000)
    with pytest.raises(tessera.NoGpuError):
        tessera.scaled_mm(a, b, sa, sb, out_dtype="bfloat16", use_fast_accum=True)
    with pytest.raises(tessera.NoGpuError):
        tessera.int_mm(a, b)


# -- sparse (no device) --------------------------------------------------------------------


def test_csr_host_arrays_are_validated_before_the_device():
    import array  # noqa: PLC0415

    i64 = lambda v: array.array("q", v).tobytes()  # noqa: E731
    f64 = lambda v: array.array("d", v).tobytes()  # noqa: E731
    # duplicates are summed: (0, 1) twice -> 2 stored entries
    assert _tessera.check_csr(2, 3, "float64", i64([0, 2, 3]), i64([1, 1, 2]), f64([1, 2, 3])) == 2
    assert _tessera.check_csr(0, 0, "float64", i64([0]), b"", b"") == 0
    cases = [
        ((2, 3, "float64", i64([0, 2, 3]), i64([1, 3, 2]), f64([1, 2, 3])), ValueError, "`indices`: indices[1] = 3 in row 0 is outside the columns 0..3"),
        ((2, 3, "float64", i64([0, 3]), i64([1, 1, 2]), f64([1, 2, 3])), ValueError, "`indptr`: has 2 entries; a CSR matrix with 2 rows needs rows + 1 = 3 indptr"),
        ((2, 3, "float64", i64([1, 2, 3]), i64([1, 1, 2]), f64([1, 2, 3])), ValueError, "`indptr`: indptr[0] = 1"),
        ((2, 3, "float64", i64([0, 2, 3]), i64([1, 1, 2]), f64([1, 2])), ValueError, "`data`: has 2 entries but indices has 3"),
        ((2, 3, "float64", i64([0, 2, 3]), i64([1, 1, 2]), b"\0" * 5), ValueError, "`data`: 5 bytes are not a whole number of 8-byte"),
        ((2, 3, "int32", i64([0, 2, 3]), i64([1, 1, 2]), f64([1, 2, 3])), NotImplementedError, "`data` has dtype int32"),
    ]
    for args, exc, text in cases:
        with pytest.raises(exc) as e:
            _tessera.check_csr(*args)
        assert text in str(e.value), str(e.value)


def test_csr_matrix_constructor_errors():
    from tessera.sparse import csr_matrix  # noqa: PLC0415

    with pytest.raises(ValueError, match="`shape`: is needed with"):
        csr_matrix(([1.0], [0], [0, 1]))
    with pytest.raises(ValueError, match="`shape`: must be \\(rows, cols\\)"):
        csr_matrix(([1.0], [0], [0, 1]), shape=5)
    with pytest.raises(ValueError, match="`indices`: indices\\[0\\] = 4 in row 0 is outside the columns 0..2"):
        csr_matrix(([1.0], [4], [0, 1]), shape=(1, 2))
    with pytest.raises(ValueError, match="`indices`: must be a 1-D array of ints"):
        csr_matrix(([1.0], ["x"], [0, 1]), shape=(1, 2))
    with pytest.raises(TypeError, match="csr_matrix takes a SciPy sparse matrix"):
        csr_matrix([[1.0, 0.0]])
    assert tessera.sparse.csr_matrix is csr_matrix and "csr_matrix" in tessera.sparse.__all__
    assert csr_matrix.__doc__ and "A.T @ x" in csr_matrix.__doc__


@pytest.mark.skipif(GPU, reason="a GPU is usable here")
def test_csr_matrix_without_a_gpu_raises_no_gpu_error():
    with pytest.raises(tessera.NoGpuError):
        tessera.sparse.csr_matrix(([1.0, 2.0], [0, 1], [0, 1, 2]), shape=(2, 2))


@pytest.mark.parametrize(
    "x, out, transpose, want",
    [
        (d((3,), "float32"), d((2,), "float32", ptr=0), False, (None, "row")),
        (d((2,), "float32"), d((3,), "float32", ptr=0), True, (None, "row")),
        (d((3, 4), "float32"), d((2, 4), "float32", ptr=0), False, (4, "row")),
        (d((3, 4), "float32", strides=(1, 3)), d((2, 4), "float32", strides=(1, 2), ptr=0), False, (4, "col")),
        (d((3, 0), "float32"), d((2, 0), "float32", ptr=0), False, (0, "row")),
    ],
)
def test_check_sparse_product_shapes(x, out, transpose, want):
    assert _tessera.check_sparse_product(2, 3, "float32", x, out, transpose) == want


@pytest.mark.parametrize(
    "x, out, transpose, text",
    [
        (d((2,), "float32"), d((2,), "float32"), False, "`x`: has shape [2]; a 2 x 3 matrix multiplies [3] or [3, k]"),
        (d((3,), "float32"), d((2,), "float32"), True, "`x`: has shape [3]; a 3 x 2 matrix multiplies [2]"),
        (d((3,), "float64"), d((2,), "float32"), False, "`x`: has dtype float64; the matrix holds float32"),
        (d((3,), "float32", strides=(2,)), d((2,), "float32"), False, "`x`: has shape [3]"),
        (d((3, 4), "float32", strides=(8, 1)), d((2, 4), "float32"), False, "`x`: strides [8, 1] of shape [3, 4]"),
        (d((3, 4), "float32"), d((2, 5), "float32"), False, "`out`: has shape [2, 5]"),
        (d((3, 4), "float32"), d((2, 4), "float32", strides=(1, 2)), False, "the product of x [3, 4] is [2, 4] in x's layout"),
        (d((1, 3, 4), "float32"), d((2, 4), "float32"), False, "`x`: has shape [1, 3, 4]"),
    ],
)
def test_check_sparse_product_errors(x, out, transpose, text):
    with pytest.raises(ValueError) as e:
        _tessera.check_sparse_product(2, 3, "float32", x, out, transpose)
    assert text in str(e.value), str(e.value)


# -- lsmr (no device) ----------------------------------------------------------------------

# scipy.sparse.linalg.lsmr (SciPy 1.17)
SCIPY_LSMR = [
    ("A", E, P),
    ("b", E, P),
    ("damp", 0.0, P),
    ("atol", 1e-6, P),
    ("btol", 1e-6, P),
    ("conlim", 1e8, P),
    ("maxiter", None, P),
    ("x0", None, P),
    ("show", False, P),
]


def test_lsmr_signature_is_scipys():
    assert _params(tessera.lsmr) == SCIPY_LSMR
    doc = tessera.lsmr.__doc__
    assert "istop" in doc and "x0" in doc and "float32" in doc


class _Op:
    """A matrix-free operator stand-in (never called here: validation comes first)."""

    shape = (4, 3)

    def matvec(self, x):  # pragma: no cover - needs a GPU
        raise AssertionError("not reached")

    rmatvec = matvec


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"b": [1.0, 2.0, 3.0]}, "`b`: has 3 elements, A is 4 x 3 so b needs m = 4"),
        ({"x0": [1.0, 2.0]}, "`x0`: has 2 elements, A is 4 x 3 so x0 needs n = 3"),
        ({"x0": [1.0, float("nan"), 0.0]}, "`x0`: element 1 is NaN; every element must be finite"),
        ({"damp": -1.0}, "`damp`: is -1, must be finite and >= 0"),
        ({"atol": float("inf")}, "`atol`: is inf, must be finite and >= 0"),
        ({"conlim": -2.0}, "`conlim`: is -2, must be finite and >= 0 (0 means no limit)"),
        ({"maxiter": -1}, "`maxiter`: must be None or an int >= 0, got -1"),
        ({"maxiter": 2.5}, "`maxiter`: must be None or an int >= 0"),
        ({"btol": "1e-6"}, "`btol`: must be a real number"),
        ({"b": [[1.0, 2.0], [3.0, 4.0]]}, "`b`: must be a 1-D array of numbers"),
    ],
)
def test_lsmr_validation_errors(kwargs, text):
    args = {"b": [1.0, 2.0, 3.0, 4.0], **kwargs}
    b = args.pop("b")
    with pytest.raises(ValueError) as e:
        tessera.lsmr(_Op(), b, **args)
    assert text in str(e.value), str(e.value)
    assert isinstance(e.value, tessera.TesseraError)


def test_lsmr_operator_errors():
    with pytest.raises(ValueError, match="`A`: must be a 2-D matrix or operator with a shape"):
        tessera.lsmr(object(), [1.0])
    _tessera.check_lsmr(4, 3, 4, 0.0, 1e-6, 1e-6, 1e8, bytes(24))
    with pytest.raises(ValueError, match="`b`: has 5 elements"):
        _tessera.check_lsmr(4, 3, 5, 0.0, 1e-6, 1e-6, 1e8)


@pytest.mark.skipif(GPU, reason="a GPU is usable here")
def test_lsmr_without_a_gpu_raises_no_gpu_error():
    import sys  # noqa: PLC0415

    if "torch" in sys.modules:
        pytest.skip("torch is loaded: the operator path needs it and a GPU")
    # the matrix-free path wants torch: without it, a clear error naming A
    with pytest.raises((tessera.NoGpuError, ValueError)):
        tessera.lsmr(_Op(), [1.0, 2.0, 3.0, 4.0])


# -- lsmr: many right-hand sides and damp lists (no device) -------------------------------


def _mat(rows, cols, values=None):
    """A 2-D float64 array without NumPy: a memoryview of shape (rows, cols), row-major."""
    import array  # noqa: PLC0415

    values = [float(i % 7 + 1) for i in range(rows * cols)] if values is None else values
    return memoryview(array.array("d", values)).cast("B").cast("d", (rows, cols))


class _Shaped:
    """A 2-D array stand-in with a shape (memoryview casts refuse zero-size shapes)."""

    def __init__(self, shape):
        self.shape = shape

    def tolist(self):
        return [[1.0] * self.shape[1] for _ in range(self.shape[0])]


def _with_nan(rows, cols, r, c, value=float("nan")):
    values = [1.0] * (rows * cols)
    values[r * cols + c] = value
    return _mat(rows, cols, values)


@pytest.mark.parametrize(
    "b, kwargs, text",
    [
        (_mat(5, 2), {}, "`b`: has shape (5, 2); A has m = 4 rows so b must be [4] or [4, k]"),
        (_Shaped((4, 0)), {}, "`b`: has shape (4, 0): no right-hand side"),
        (_mat(4, 65536), {}, "`b`: has 65536 columns; at most 65535 right-hand sides per call"),
        (_mat(2, 2).cast("B").cast("d", (2, 1, 2)), {}, "`b`: must be [m], [m, 1] or [m, k] (k <= 65535"),
        (_with_nan(4, 3, 2, 1), {}, "`b`: element (2, 1) (column-major index 6) is NaN; every element must be finite"),
        (_with_nan(4, 3, 3, 2, float("inf")), {}, "`b`: element (3, 2) (column-major index 11) is inf"),
        (_mat(4, 2), {"x0": [0.0, 0.0, 0.0]}, "`x0`: with a 2-D b of 2 columns x0 must be [n, k] = [3, 2]"),
        (_mat(4, 2), {"x0": _mat(3, 3)}, "`x0`: with a 2-D b of 2 columns x0 must be [n, k] = [3, 2]"),
        (_mat(4, 2), {"x0": _mat(2, 3)}, "got shape (2, 3)"),
        (_mat(4, 2), {"x0": _with_nan(3, 2, 1, 0)}, "`x0`: element (1, 0) (column-major index 1) is NaN"),
        (_mat(4, 2), {"damp": [0.1, 0.2]}, "`damp`: a damp list takes a 1-D b; b has shape (4, 2)"),
        (_mat(4, 2), {"damp": -1.0}, "`damp`: is -1, must be finite and >= 0"),
        (_mat(4, 2), {"atol": -1.0}, "`atol`: is -1, must be finite and >= 0"),
    ],
)
def test_lsmr_many_rhs_validation_errors(b, kwargs, text):
    with pytest.raises(ValueError) as e:
        tessera.lsmr(_Op(), b, **kwargs)
    assert text in str(e.value), str(e.value)
    assert isinstance(e.value, tessera.InvalidArgumentError)


def test_lsmr_one_column_b_is_a_vector():
    # [m, 1] keeps the 1-D rules (and messages): b's length, x0 of n
    with pytest.raises(ValueError, match="`b`: has 3 elements, A is 4 x 3 so b needs m = 4"):
        tessera.lsmr(_Op(), _mat(3, 1))
    with pytest.raises(ValueError, match="`x0`: has 2 elements, A is 4 x 3 so x0 needs n = 3"):
        tessera.lsmr(_Op(), _mat(4, 1), x0=[0.0, 0.0])


@pytest.mark.parametrize(
    "damp, text",
    [
        ([0.1, -0.5], "`damp`: element 1 is -0.5; every damp must be finite and >= 0"),
        ((0.0, float("nan")), "`damp`: element 1 is NaN; every damp must be finite and >= 0"),
        ([float("inf")], "`damp`: element 0 is inf"),
        ([], "`damp`: is an empty list; give a number or at least one damp value"),
        ([0.1, "x"], "`damp`: element 1 is 'x'; a damp list holds real numbers"),
        ([0.1, True], "`damp`: element 1 is True; a damp list holds real numbers"),
        ("0.1", "`damp`: must be a real number, got '0.1'"),
    ],
)
def test_lsmr_damp_list_validation_errors(damp, text):
    with pytest.raises(ValueError) as e:
        tessera.lsmr(_Op(), [1.0, 2.0, 3.0, 4.0], damp=damp)
    assert text in str(e.value), str(e.value)
    assert isinstance(e.value, tessera.InvalidArgumentError)


def test_lsmr_damp_list_keeps_the_other_rules():
    with pytest.raises(ValueError, match="`b`: has 3 elements, A is 4 x 3 so b needs m = 4"):
        tessera.lsmr(_Op(), [1.0, 2.0, 3.0], damp=[0.1, 0.2])
    with pytest.raises(ValueError, match="`btol`: is -1, must be finite and >= 0"):
        tessera.lsmr(_Op(), [1.0, 2.0, 3.0, 4.0], damp=[0.1], btol=-1.0)


def test_check_lsmr_many_and_damps_natively():
    import array  # noqa: PLC0415

    b = array.array("d", [1.0] * 8).tobytes()
    assert _tessera.LSMR_MAX_RHS == 65535 and _tessera.LSMR_MAX_DAMPS >= 1
    _tessera.check_lsmr_many(4, 3, 2, b, 0.0, 1e-6, 1e-6, 1e8)
    _tessera.check_lsmr_many(4, 3, 2, b, 0.0, 1e-6, 1e-6, 1e8, bytes(48))
    with pytest.raises(ValueError, match="`b`: has 65536 columns; at most 65535"):
        _tessera.check_lsmr_many(4, 3, 65536, b, 0.0, 1e-6, 1e-6, 1e8)
    with pytest.raises(ValueError, match=r"`b`: has 8 elements, A is 4 x 3 so B \(m x k = 4 x 3"):
        _tessera.check_lsmr_many(4, 3, 3, b, 0.0, 1e-6, 1e-6, 1e8)
    with pytest.raises(ValueError, match="`x0`: has 5 elements, X0 is n x k = 3 x 2"):
        _tessera.check_lsmr_many(4, 3, 2, b, 0.0, 1e-6, 1e-6, 1e8, bytes(40))
    _tessera.check_lsmr(4, 3, 4, 0.0, 1e-6, 1e-6, 1e8, None, [0.0, 1.5])
    with pytest.raises(ValueError, match="`damp`: is 0.5 beside a damp list"):
        _tessera.check_lsmr(4, 3, 4, 0.5, 1e-6, 1e-6, 1e8, None, [0.0, 1.5])
    with pytest.raises(ValueError, match="`damp`: element 0 is -1"):
        _tessera.check_lsmr(4, 3, 4, 0.0, 1e-6, 1e-6, 1e8, None, [-1.0])


def test_lsmr_docstring_covers_many_rhs_and_damp_lists():
    doc = tessera.lsmr.__doc__
    assert "[m, k]" in doc and "[n, k]" in doc and "damp list" in doc and "MAX_RHS" in doc
