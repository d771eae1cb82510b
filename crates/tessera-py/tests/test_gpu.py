"""GPU tests of the installed `tessera` wheel: every function against torch (softmax, SDPA, a
float32 attention reference) and FlashInfer where it is importable, on random inputs of many
shapes, in one process. Skipped cleanly when torch, CUDA or a usable GPU is missing.

Budgets (DESIGN.md): rel_l2 = ||out - ref|| / ||ref|| below 1e-5 (fp32), 2e-3 (fp16),
1e-2 (bf16) against references computed in float64 (softmax) or float32 (attention) from the
same inputs. The seed is printed; TESSERA_SEED replays it.
"""

from __future__ import annotations

import math
import os
import random
import zlib

import pytest

import tessera

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)
if not tessera.is_available():
    pytest.skip("tessera cannot use the GPU here (no driver, device or NVRTC)", allow_module_level=True)

F = torch.nn.functional
DEV = torch.device("cuda", 0)
SEED = int(os.environ.get("TESSERA_SEED", random.randrange(1 << 31)))
print(f"test_gpu: seed {SEED} (TESSERA_SEED={SEED} replays)")
BUDGET = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
LOG2E = 1.4426950408889634  # FlashInfer's decode LSE is base 2: the natural-log LSE times log2(e)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def gen(tag):
    """A generator seeded from SEED and the test's own tag (so tests are independent)."""
    return torch.Generator(device=DEV).manual_seed((SEED * 1000003 + zlib.crc32(tag.encode())) % (1 << 62))


def randn(shape, dtype, tag, scale=1.0):
    return (torch.randn(shape, device=DEV, dtype=torch.float32, generator=gen(tag)) * scale).to(dtype)


def rel_l2(out, ref):
    out, ref = out.double(), ref.double()
    num = torch.linalg.vector_norm(out - ref)
    den = torch.linalg.vector_norm(ref)
    return float(num / den) if den > 0 else float(num)


def assert_close(out, ref, dtype, what):
    assert out.shape == ref.shape, (what, out.shape, ref.shape)
    assert not torch.isnan(out).any(), f"{what}: NaN in output (seed {SEED})"
    e = rel_l2(out, ref)
    assert e < BUDGET[dtype], f"{what}: rel_l2 {e:.3g} >= {BUDGET[dtype]} (seed {SEED})"


# -- softmax -------------------------------------------------------------------------------

SOFTMAX_SHAPES = [(1, 1), (7, 33), (128, 1000), (3, 5, 1025), (256, 4096), (2, 100003), (1, 1 << 20), (4096, 8)]


@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_matches_torch(shape, dtype, log):
    dt = DTYPES[dtype]
    x = randn(shape, dt, f"softmax{shape}{dtype}", scale=3.0)
    fn, ref_fn = (tessera.log_softmax, torch.log_softmax) if log else (tessera.softmax, torch.softmax)
    y = fn(x)
    assert isinstance(y, torch.Tensor) and y.dtype == dt and y.device == x.device
    assert_close(y, ref_fn(x.double(), dim=-1), dt, f"{fn.__name__} {dtype} {shape}")


@pytest.mark.parametrize("dim", [0, 1, -2])
def test_softmax_other_dims_and_dtype_out(dim):
    x = randn((33, 65, 17), torch.float16, f"dims{dim}")
    y = tessera.softmax(x, dim=dim, dtype=torch.float32)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert_close(y, torch.softmax(x.double(), dim=dim), torch.float32, f"softmax dim={dim}")
    z = tessera.log_softmax(x, dim, dtype="bfloat16")
    assert_close(z, torch.log_softmax(x.double(), dim=dim), torch.bfloat16, f"log_softmax dim={dim}")


def test_softmax_strided_out_and_in_place():
    big = randn((300, 1024), torch.float32, "padded")
    x = big[:, :1000]  # padded rows: read in place (row stride 1024)
    out = torch.empty((300, 1000), device=DEV, dtype=torch.float32)
    r = tessera.softmax(x, out=out)
    assert r is out
    assert_close(out, torch.softmax(x.double(), -1), torch.float32, "padded rows into out=")
    xs = big[:, ::2]  # last dim not contiguous: copied first
    assert_close(tessera.softmax(xs), torch.softmax(xs.double(), -1), torch.float32, "strided last dim")
    xt = big.t()  # rows that do not collapse: copied first
    assert_close(tessera.softmax(xt), torch.softmax(xt.double(), -1), torch.float32, "transposed")
    xb = big[0].expand(7, 1024)  # broadcast rows (stride 0): copied first
    assert_close(tessera.softmax(xb), torch.softmax(xb.double(), -1), torch.float32, "broadcast rows")
    inplace = randn((64, 777), torch.float16, "inplace")
    expect = torch.softmax(inplace.double(), -1)
    assert tessera.softmax(inplace, out=inplace) is inplace
    assert_close(inplace, expect, torch.float16, "in place")


def test_softmax_special_rows_and_sizes():
    x = randn((4, 100), torch.float32, "special")
    x[1] = -math.inf
    x[2, 5] = math.nan
    y, ly = tessera.softmax(x), tessera.log_softmax(x)
    assert torch.equal(y[1], torch.zeros_like(y[1])), "an all -inf row gives zeros"
    assert torch.isneginf(ly[1]).all(), "an all -inf row gives -inf in log_softmax"
    assert torch.isnan(y[2]).all(), "a NaN makes its row NaN"
    for r in (0, 3):
        assert_close(y[r], torch.softmax(x[r].double(), -1), torch.float32, f"row {r}")
    e = tessera.softmax(torch.empty((0, 7), device=DEV))
    assert e.shape == (0, 7)
    assert tessera.softmax(torch.empty((3, 0), device=DEV)).shape == (3, 0)
    s = tessera.softmax(torch.tensor(2.5, device=DEV))
    assert s.shape == () and float(s) == 1.0


def test_softmax_accepts_cuda_array_interface_and_dlpack():
    x = randn((16, 300), torch.float32, "cai")
    out = torch.empty_like(x)

    class Cai:
        def __init__(self, t):
            self.t = t
            self.__cuda_array_interface__ = t.__cuda_array_interface__

    class DLPack:
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, **kwargs):
            return self.t.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    r = tessera.softmax(Cai(x), out=Cai(out))
    torch.cuda.synchronize()
    assert isinstance(r, Cai)
    assert_close(out, torch.softmax(x.double(), -1), torch.float32, "interface in, interface out")
    y = tessera.softmax(DLPack(x))
    assert isinstance(y, torch.Tensor)
    assert_close(y, torch.softmax(x.double(), -1), torch.float32, "dlpack")


def test_errors_on_the_gpu():
    with pytest.raises(tessera.InvalidArgumentError, match="CUDA tensors"):
        tessera.softmax(torch.ones(4, 4))
    with pytest.raises(tessera.UnsupportedError, match="dtype fp64"):
        tessera.softmax(torch.ones(4, 4, device=DEV, dtype=torch.float64))
    q = torch.randn(1, 16, 2, 64, device=DEV, dtype=torch.float16, requires_grad=True)
    with pytest.raises(NotImplementedError, match="no backward"):
        tessera.flash_attn_func(q, q, q)
    with torch.no_grad():
        assert tessera.flash_attn_func(q, q, q).shape == q.shape


# -- attention -----------------------------------------------------------------------------


def attention_ref(q, k, v, causal=False, window=(-1, -1), scale=None, softcap=0.0):
    """float32 attention with flash_attn's conventions: [B, N, H, D], GQA, bottom-right causal
    and window masks, softcap. Returns (out [B, Nq, H, D], lse [B, H, Nq]); a row that sees no
    key gets zeros and LSE -inf."""
    b, nq, h, d = q.shape
    nk, hk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(h // hk, dim=1)
    vf = v.float().transpose(1, 2).repeat_interleave(h // hk, dim=1)
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(nq, device=q.device)[:, None]
    j = torch.arange(nk, device=q.device)[None, :]
    shift = nk - nq
    left, right = window
    if causal:
        right = 0
    vis = torch.ones(nq, nk, dtype=torch.bool, device=q.device)
    if left >= 0:
        vis &= j >= i + shift - left
    if right >= 0:
        vis &= j <= i + shift + right
    s = s.masked_fill(~vis, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    p = torch.where(torch.isneginf(lse)[..., None], torch.zeros_like(p), p)
    o = torch.matmul(p, vf).transpose(1, 2)
    return o, lse


def check_lse(lse, ref, what):
    assert lse.dtype == torch.float32 and lse.shape == ref.shape, (what, lse.shape, ref.shape)
    inf = torch.isneginf(ref)
    assert torch.equal(torch.isneginf(lse), inf), f"{what}: -inf LSE rows differ (seed {SEED})"
    err = (lse[~inf] - ref[~inf]).abs().max().item() if (~inf).any() else 0.0
    assert err < 2e-3, f"{what}: LSE max abs err {err:.3g} (seed {SEED})"


# (B, Nq, Nk, Hq, Hk, D, causal, window, softcap)
ATTN_CASES = [
    (1, 128, 128, 4, 4, 64, False, (-1, -1), 0.0),
    (2, 257, 257, 8, 2, 128, True, (-1, -1), 0.0),
    (1, 1, 300, 8, 1, 128, True, (-1, -1), 0.0),
    (3, 100, 37, 6, 3, 64, True, (-1, -1), 0.0),
    (2, 37, 100, 4, 4, 128, True, (-1, -1), 0.0),
    (1, 512, 512, 2, 2, 256, False, (-1, -1), 0.0),
    (2, 64, 80, 4, 4, 40, False, (-1, -1), 0.0),
    (1, 70, 70, 4, 2, 36, True, (-1, -1), 0.0),
    (1, 200, 200, 4, 4, 96, False, (-1, -1), 0.0),
    (1, 1000, 1000, 4, 4, 128, False, (64, 16), 0.0),
    (1, 300, 300, 4, 2, 128, True, (-1, -1), 30.0),
    (2, 200, 200, 8, 1, 64, False, (-1, -1), 0.0),
    (1, 8, 8192, 1, 1, 128, False, (-1, -1), 0.0),
    (4, 1024, 1024, 16, 4, 128, True, (-1, -1), 0.0),
]


def case_id(c):
    b, nq, nk, h, hk, d, causal, window, softcap = c
    s = f"B{b}-N{nq}x{nk}-H{h}/{hk}-D{d}"
    s += "-causal" if causal else ""
    s += f"-win{window[0]},{window[1]}" if window != (-1, -1) else ""
    s += f"-cap{softcap:g}" if softcap else ""
    return s


@pytest.mark.parametrize("case", ATTN_CASES, ids=case_id)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_flash_attn_func_matches_reference(case, dtype):
    b, nq, nk, h, hk, d, causal, window, softcap = case
    dt = DTYPES[dtype]
    tag = f"{case_id(case)}{dtype}"
    q = randn((b, nq, h, d), dt, tag + "q")
    k = randn((b, nk, hk, d), dt, tag + "k")
    v = randn((b, nk, hk, d), dt, tag + "v")
    out, lse, probs = tessera.flash_attn_func(
        q, k, v, causal=causal, window_size=window, softcap=softcap, return_attn_probs=True
    )
    assert probs is None
    ref, ref_lse = attention_ref(q, k, v, causal, window, softcap=softcap)
    assert out.dtype == dt and out.shape == q.shape
    assert_close(out, ref, dt, f"flash_attn_func {tag}")
    check_lse(lse, ref_lse, f"flash_attn_func {tag}")
    plain = tessera.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap)
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, out), "deterministic, same without LSE"


# (B, Nq, Nk, causal, window): every case leaves some query rows without a visible key
NO_KEY_CASES = [
    (2, 50, 20, True, (-1, -1)),  # bottom-right causal, Nq > Nk: the first 30 rows see nothing
    (1, 64, 16, False, (5, 0)),  # a window left of the keys for the first 48 rows
    (1, 300, 44, True, (8, -1)),  # causal and window together, tiles of empty and mixed rows
    (1, 7, 1, True, (-1, -1)),  # one key: only the last row sees it
]


def no_key_id(c):
    return "B{}-N{}x{}{}-win{},{}".format(*c[:3], "-causal" if c[3] else "", *c[4])


@pytest.mark.parametrize("case", NO_KEY_CASES, ids=no_key_id)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_rows_that_see_no_key_give_zeros_and_lse_minus_inf(case, dtype):
    b, nq, nk, causal, window = case
    dt = DTYPES[dtype]
    tag = f"nokey{case}{dtype}"
    h, hk, d = 4, 2, 64
    q = randn((b, nq, h, d), dt, tag + "q")
    k = randn((b, nk, hk, d), dt, tag + "k")
    v = randn((b, nk, hk, d), dt, tag + "v")
    out, lse, _ = tessera.flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True)
    ref, ref_lse = attention_ref(q, k, v, causal, window)
    none = torch.isneginf(ref_lse)  # [B, H, Nq]
    assert none.any() and (~none).any(), "the case must mix rows with and without keys"
    assert not torch.isnan(lse).any() and not torch.isnan(out).any(), f"NaN (seed {SEED})"
    assert torch.isneginf(lse[none]).all(), "a row that sees no key has LSE -inf (flash_attn: +inf)"
    assert torch.isfinite(lse[~none]).all()
    rows = none.transpose(1, 2)  # [B, Nq, H]
    assert torch.equal(out[rows].float(), torch.zeros_like(out[rows].float())), "its output is exactly 0"
    assert_close(out, ref, dt, f"no-key rows {case}")
    check_lse(lse, ref_lse, f"no-key rows {case}")
    # the same rows through the varlen API, with a sequence that has no keys at all
    # sequences (q rows, k rows): (nq, nk), (5, 0), (3, 3)
    cu_q = torch.tensor([0, nq, nq + 5, nq + 8], dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0, nk, nk, nk + 3], dtype=torch.int32, device=DEV)
    qv = torch.cat([q[0], randn((8, h, d), dt, tag + "qv")])
    kv_ = torch.cat([k[0], randn((3, hk, d), dt, tag + "kv")])
    vv = torch.cat([v[0], randn((3, hk, d), dt, tag + "vv")])
    o2, l2, _ = tessera.flash_attn_varlen_func(qv, kv_, vv, cu_q, cu_k, max(nq, 5), max(nk, 3), causal=causal,
                                               window_size=window, return_attn_probs=True)
    assert not torch.isnan(l2).any() and not torch.isnan(o2).any()
    assert torch.isneginf(l2[:, nq : nq + 5]).all(), "a sequence with no keys: LSE -inf"
    assert torch.equal(o2[nq : nq + 5].float(), torch.zeros_like(o2[nq : nq + 5].float()))
    check_lse(l2[:, :nq], ref_lse[0], f"varlen no-key rows {case}")
    assert_close(o2[:nq], ref[0], dt, f"varlen no-key rows {case}")


SDPA_CASES = [(2, 256, 8, 8, 64, False), (1, 1024, 16, 16, 128, True), (2, 333, 8, 2, 128, True), (1, 128, 4, 4, 256, False)]


@pytest.mark.parametrize("case", SDPA_CASES, ids=lambda c: "B{}-N{}-H{}/{}-D{}{}".format(*c[:5], "-causal" if c[5] else ""))
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_flash_attn_func_matches_torch_sdpa(case, dtype):
    b, n, h, hk, d, causal = case
    dt = DTYPES[dtype]
    tag = f"sdpa{case}{dtype}"
    q, k, v = (randn((b, n, hh, d), dt, tag + t) for t, hh in (("q", h), ("k", hk), ("v", hk)))
    out = tessera.flash_attn_func(q, k, v, causal=causal)
    kk, vv = (t.repeat_interleave(h // hk, dim=2) for t in (k, v))
    ref = F.scaled_dot_product_attention(
        q.transpose(1, 2).float(), kk.transpose(1, 2).float(), vv.transpose(1, 2).float(), is_causal=causal
    ).transpose(1, 2)
    assert_close(out, ref, dt, f"vs float32 SDPA {tag}")
    same_dtype = F.scaled_dot_product_attention(q.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2), is_causal=causal)
    e = rel_l2(out, same_dtype.transpose(1, 2))
    assert e < 2 * BUDGET[dt], f"vs {dtype} SDPA {tag}: rel_l2 {e:.3g}"


def test_flash_attn_func_layouts_scale_and_out():
    b, n, h, d = 2, 150, 4, 64
    qkv = randn((b, n, 3, h, d), torch.float16, "packed")
    q, k, v = qkv.unbind(dim=2)  # strided views, read without a copy
    ref, _ = attention_ref(q, k, v, True, scale=0.3)
    out = torch.empty_like(q.contiguous())
    r = tessera.flash_attn_func(q, k, v, softmax_scale=0.3, causal=True, out=out)
    assert r is out
    assert_close(out, ref, torch.float16, "packed qkv views into out=")
    flat = randn((b * n * h * d + 1,), torch.float16, "misaligned")[1:].view(b, n, h, d)  # 2-byte aligned
    assert flat.data_ptr() % 16 != 0
    ref2, _ = attention_ref(flat, k, v)
    assert_close(tessera.flash_attn_func(flat, k, v), ref2, torch.float16, "misaligned q (copied)")
    qt = randn((b, n, d, h), torch.float16, "lastdim").transpose(-1, -2)  # last dim stride h
    ref3, _ = attention_ref(qt, k, v)
    assert_close(tessera.flash_attn_func(qt, k, v), ref3, torch.float16, "non-contiguous last dim (copied)")
    q36 = randn((1, 40, 2, 36), torch.bfloat16, "d36")
    out36 = torch.empty_like(q36)
    assert tessera.flash_attn_func(q36, q36, q36, out=out36) is out36
    ref36, _ = attention_ref(q36, q36, q36)
    assert_close(out36, ref36, torch.bfloat16, "head dim 36 (padded) into out=")


def _varlen_inputs(lengths_q, lengths_k, h, hk, d, dt, tag):
    cu_q = [0]
    cu_k = [0]
    for a, c in zip(lengths_q, lengths_k):
        cu_q.append(cu_q[-1] + a)
        cu_k.append(cu_k[-1] + c)
    q = randn((cu_q[-1], h, d), dt, tag + "q")
    k = randn((cu_k[-1], hk, d), dt, tag + "k")
    v = randn((cu_k[-1], hk, d), dt, tag + "v")
    return q, k, v, cu_q, cu_k


VARLEN_CASES = [
    ([5, 0, 130, 64], [7, 3, 130, 1], 8, 2, 128, True),
    ([5, 0, 130, 64], [7, 3, 130, 1], 8, 2, 128, False),
    ([1000, 1, 17], [1000, 1, 17], 4, 4, 64, True),
    ([3, 300], [500, 2], 6, 3, 256, True),
]


@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: f"{len(c[0])}seqs-H{c[2]}/{c[3]}-D{c[4]}{'-causal' if c[5] else ''}")
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("cu_on", ["cuda", "cpu", "list"])
def test_flash_attn_varlen_func_matches_per_sequence_reference(case, dtype, cu_on):
    lq, lk, h, hk, d, causal = case
    dt = DTYPES[dtype]
    tag = f"varlen{case}{dtype}"
    q, k, v, cu_q, cu_k = _varlen_inputs(lq, lk, h, hk, d, dt, tag)
    if cu_on == "list":
        cq, ck = cu_q, cu_k
    else:
        cq, ck = (torch.tensor(c, dtype=torch.int32, device=cu_on) for c in (cu_q, cu_k))
    out, lse, none = tessera.flash_attn_varlen_func(
        q, k, v, cq, ck, max(lq), max(lk), causal=causal, return_attn_probs=True
    )
    assert none is None and out.shape == q.shape and lse.shape == (h, q.shape[0])
    for s in range(len(lq)):
        a, z = cu_q[s], cu_q[s + 1]
        ka, kz = cu_k[s], cu_k[s + 1]
        if z == a:
            continue
        ref, ref_lse = attention_ref(q[None, a:z], k[None, ka:kz], v[None, ka:kz], causal)
        assert_close(out[a:z], ref[0], dt, f"varlen {tag} seq {s}")
        check_lse(lse[:, a:z], ref_lse[0], f"varlen {tag} seq {s}")


def test_varlen_checks_host_offsets():
    q, k, v, cu_q, cu_k = _varlen_inputs([4, 4], [4, 4], 2, 2, 64, torch.float16, "vcheck")
    with pytest.raises(ValueError, match="`max_seqlen_q`: is 3 but a sequence has 4 rows"):
        tessera.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 4)
    with pytest.raises(ValueError, match="non-decreasing"):
        tessera.flash_attn_varlen_func(q, k, v, [0, 5, 4], cu_k, 5, 4)
    with pytest.raises(ValueError, match="past the 8 packed rows"):
        tessera.flash_attn_varlen_func(q, k, v, torch.tensor([0, 4, 9], dtype=torch.int32), cu_k, 5, 4)


# -- streams, graphs, caches ---------------------------------------------------------------


def test_runs_on_the_callers_stream_without_synchronising():
    src = randn((2048, 4096), torch.float32, "stream")
    x = torch.zeros_like(src)
    s = torch.cuda.Stream()  # torch's pool streams do not wait for the default stream
    with torch.cuda.stream(s):  # plans for this stream (and kernels) are made here, not below
        tessera.softmax(x)
        tessera.flash_attn_func(*(x.view(1, 2048, 64, 64).to(torch.float16),) * 3)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time queued first on s
        x.copy_(src)  # what tessera must read: only correct if queued behind this on s
        y = tessera.softmax(x)
        q = x.view(1, 2048, 64, 64).to(torch.float16)
        o = tessera.flash_attn_func(q, q, q)
        z = y * 2.0  # torch work after tessera's on the same stream
    assert not s.query(), "tessera synchronised the stream (the sleep should still be running)"
    s.synchronize()
    assert_close(y, torch.softmax(src.double(), -1), torch.float32, "softmax on a side stream")
    assert_close(z, 2.0 * torch.softmax(src.double(), -1), torch.float32, "torch after tessera")
    q2 = src.view(1, 2048, 64, 64).to(torch.float16)
    ref, _ = attention_ref(q2, q2, q2)
    assert_close(o, ref, torch.float16, "attention on a side stream")


def test_cuda_graph_capture_and_replay():
    x = randn((512, 1000), torch.float16, "graph")
    q = randn((1, 256, 8, 128), torch.float16, "graphq")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up on the capture stream: plans are cached per stream
        tessera.softmax(x)
        tessera.flash_attn_func(q, q, q, causal=True)
    s.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        y = tessera.softmax(x)
        o = tessera.flash_attn_func(q, q, q, causal=True)
    x.copy_(randn((512, 1000), torch.float16, "graph2"))
    q.copy_(randn((1, 256, 8, 128), torch.float16, "graphq2"))
    g.replay()
    torch.cuda.synchronize()
    assert_close(y, torch.softmax(x.double(), -1), torch.float16, "softmax replayed")
    ref, _ = attention_ref(q, q, q, True)
    assert_close(o, ref, torch.float16, "attention replayed")


def test_plans_are_cached_per_shape():
    tessera.clear_plan_cache()
    x = randn((64, 512), torch.float16, "cache")
    before = tessera.plan_cache_info()
    for _ in range(5):
        tessera.softmax(x)
    info = tessera.plan_cache_info()
    assert info["softmax"] == 1
    assert info["softmax_hits"] - before["softmax_hits"] == 4
    assert info["softmax_misses"] - before["softmax_misses"] == 1


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device_keeps_torchs_current_device():
    torch.cuda.set_device(0)
    x = randn((8, 100), torch.float32, "dev1").to("cuda:1")
    y = tessera.softmax(x)
    assert y.device.index == 1 and torch.cuda.current_device() == 0
    assert_close(y, torch.softmax(x.double(), -1), torch.float32, "cuda:1")


# -- FlashInfer ----------------------------------------------------------------------------


def _flashinfer():
    if os.environ.get("TESSERA_TEST_FLASHINFER", "1") == "0":
        return None
    try:
        import flashinfer  # noqa: PLC0415
    except Exception:
        return None
    return flashinfer


@pytest.mark.skipif(_flashinfer() is None, reason="flashinfer not importable (or TESSERA_TEST_FLASHINFER=0)")
def test_flash_attn_func_matches_flashinfer_single_prefill():
    # FlashInfer compiles each configuration with nvcc on first use (~20 s for fa2): one shape
    flashinfer = _flashinfer()
    n, h, d = 512, 8, 128
    q, k, v = (randn((1, n, h, d), torch.float16, f"fi{t}") for t in "qkv")
    ref = flashinfer.single_prefill_with_kv_cache(q[0], k[0], v[0], causal=True, backend="fa2")
    out = tessera.flash_attn_func(q, k, v, causal=True)
    e = rel_l2(out[0], ref)
    assert e < BUDGET[torch.float16], f"vs FlashInfer: rel_l2 {e:.3g}"


# -- paged KV cache ------------------------------------------------------------------------

KV_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def paged_layout(lens, page, num_pages, tag):
    """Random distinct pages for sequences of lengths ``lens``: (indptr, indices, last_page_len)."""
    rng = random.Random(f"{SEED}:{tag}")
    need = [-(-n // page) for n in lens]
    assert sum(need) <= num_pages
    pages = rng.sample(range(num_pages), sum(need))
    indptr = [0]
    for n in need:
        indptr.append(indptr[-1] + n)
    last = [n - (p - 1) * page if p else 0 for n, p in zip(lens, need)]
    return indptr, pages, last


def fill_cache(cache, tag, layer=0):
    """Random pages (fp8: random e4m3 values and random scales in [0.02, 0.2])."""
    kv = cache.kv_cache(layer)
    if cache.dtype == "float8_e4m3fn":
        kv.copy_(randn(kv.shape, torch.float32, tag, 2.0).to(torch.float8_e4m3fn))
        scales = torch.rand(cache.scales(layer).shape, generator=gen(tag + "s"), device=DEV) * 0.18 + 0.02
        cache.set_scales(scales, layer)
    else:
        kv.copy_(randn(kv.shape, kv.dtype, tag))
    return kv


def gathered(cache, indptr, indices, lens, b, layer=0):
    """K and V of sequence ``b`` as float32 ``[len, Hkv, D]`` (fp8 dequantised with the scales)."""
    kv = cache.kv_cache(layer)
    pages = torch.tensor(indices[indptr[b] : indptr[b + 1]], dtype=torch.long, device=DEV)
    x = kv[pages].float()  # [n, 2, T, Hkv, D]
    if cache.dtype == "float8_e4m3fn":
        x = x * cache.scales(layer)[pages].permute(0, 2, 1)[:, :, None, :, None]
    x = x.transpose(0, 1).reshape(2, -1, cache.num_kv_heads, cache.head_dim)[:, : lens[b]]
    return x[0], x[1]


def decode_ref(q, cache, indptr, indices, lens, scale=None, layer=0):
    """float32 torch SDPA (GQA) of each sequence's query over its gathered K/V, and the LSE."""
    b_, hq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    outs, lses = [], []
    for b in range(b_):
        k, v = gathered(cache, indptr, indices, lens, b, layer)
        qf = q[b].float()[None, :, None, :]  # [1, Hq, 1, D]
        kf, vf = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, Hkv, L, D]
        if lens[b] == 0:
            outs.append(torch.zeros(hq, d, device=DEV))
            lses.append(torch.full((hq,), -math.inf, device=DEV))
            continue
        try:
            o = F.scaled_dot_product_attention(qf, kf, vf, scale=scale, enable_gqa=True)
        except TypeError:  # torch < 2.5
            g = hq // kf.shape[1]
            o = F.scaled_dot_product_attention(qf, kf.repeat_interleave(g, 1), vf.repeat_interleave(g, 1), scale=scale)
        outs.append(o[0, :, 0])
        g = hq // k.shape[1]
        s = torch.einsum("hd,lhd->hl", q[b].float(), k.repeat_interleave(g, 1)) * scale
        lses.append(torch.logsumexp(s, -1))
    return torch.stack(outs), torch.stack(lses)


# (kv dtype, D, group, page): every D and group in fp16, the main ones in bf16 and fp8
DECODE_CASES = (
    [("fp16", d, g, 16) for d in (64, 128, 256) for g in (1, 4, 8)]
    + [("bf16", 128, g, 16) for g in (1, 4, 8)]
    + [("bf16", d, 4, 16) for d in (64, 256)]
    + [("fp8", 128, g, 16) for g in (1, 4, 8)]
    + [("fp8", d, 8, 16) for d in (64, 256)]
    + [("fp16", 128, 4, 8), ("fp16", 128, 4, 32), ("bf16", 64, 8, 64)]
)


def decode_lengths(page, tag):
    rng = random.Random(f"{SEED}:{tag}")
    return [1, page - 1, page, page + 1, rng.randint(2500, 3500), rng.randint(1, 300)]


@pytest.mark.parametrize("kv, d, group, page", DECODE_CASES, ids=lambda c: str(c))
def test_paged_decode_matches_torch_sdpa(kv, d, group, page):
    tag = f"pdec{kv}{d}{group}{page}"
    hkv = 2
    hq = hkv * group
    q_dtype = torch.bfloat16 if kv == "bf16" else torch.float16
    lens = decode_lengths(page, tag)
    num_pages = sum(-(-n // page) for n in lens) + 7
    cache = tessera.PagedKVCache(num_pages, page, hkv, d, KV_DTYPES[kv])
    assert cache.shape == (num_pages, 2, page, hkv, d) and cache.dtype == str(KV_DTYPES[kv]).replace("torch.", "")
    fill_cache(cache, tag)
    indptr, indices, last = paged_layout(lens, page, num_pages, tag)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1, dtype=torch.uint8, device=DEV), "NHD")
    w.plan(torch.tensor(indptr, dtype=torch.int32), torch.tensor(indices, dtype=torch.int32),
           torch.tensor(last, dtype=torch.int32), hq, hkv, d, page, q_data_type=q_dtype, kv_data_type=KV_DTYPES[kv])
    q = randn((len(lens), hq, d), q_dtype, tag + "q")
    out, lse = w.run(q, cache, return_lse=True)
    assert out.dtype == q_dtype and out.shape == q.shape and lse.shape == (len(lens), hq) and lse.dtype == torch.float32
    ref, ref_lse = decode_ref(q, cache, indptr, indices, lens)
    assert_close(out.float(), ref, q_dtype, f"paged decode {kv} D{d} g{group} T{page} lens {lens}")
    ref_lse2 = ref_lse * LOG2E  # FlashInfer's convention: base 2
    assert torch.allclose(lse, ref_lse2, rtol=1e-3, atol=1e-3), f"LSE {(lse - ref_lse2).abs().max()} (seed {SEED})"
    assert w.describe() and "paged decode" in w.describe()
    # out= and a custom scale, and the split-KV-free path
    o2 = torch.empty_like(q)
    w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=q_dtype, kv_data_type=KV_DTYPES[kv], sm_scale=0.05,
           disable_split_kv=True)
    r = w.run(q, cache, out=o2)
    assert r is o2
    assert_close(o2.float(), decode_ref(q, cache, indptr, indices, lens, scale=0.05)[0], q_dtype, "sm_scale, no split")


def test_paged_decode_layers_and_zero_length():
    cache = tessera.PagedKVCache(40, 16, 4, 128, torch.float16, num_layers=2)
    for layer in (0, 1):
        fill_cache(cache, f"layers{layer}", layer)
    lens = [0, 37, 200]
    indptr, indices, last = paged_layout(lens, 16, 40, "layers")
    w = tessera.BatchDecodeWithPagedKVCacheWrapper()
    w.plan(indptr, indices, last, 16, 4, 128, 16)
    q = randn((3, 16, 128), torch.float16, "layersq")
    for layer in (0, 1):
        out, lse = w.run(q, cache, layer=layer, return_lse=True)
        ref, ref_lse = decode_ref(q, cache, indptr, indices, lens, layer=layer)
        assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.isneginf(lse[0]).all()
        assert not torch.isnan(lse).any() and torch.isfinite(lse[1:]).all()
        assert_close(out[1:].float(), ref[1:], torch.float16, f"layer {layer}")
        assert torch.allclose(lse[1:], ref_lse[1:] * LOG2E, rtol=1e-3, atol=1e-3), f"layer {layer} LSE (seed {SEED})"
    with pytest.raises(ValueError, match="`layer`: 2 is out of range: the cache has 2 layers"):
        w.run(q, cache, layer=2)


class Interface:
    """A torch tensor seen only through ``__cuda_array_interface__`` (v3), naming ``stream``."""

    def __init__(self, t, stream):
        self.t = t  # keeps the memory alive
        cai = dict(t.__cuda_array_interface__)
        cai["version"] = 3  # torch says 2, whose interface has no stream
        cai["stream"] = stream
        self.__cuda_array_interface__ = cai


def lse_base2_ref(q, cache, indptr, indices, lens, scale=None):
    """FlashInfer's decode LSE computed in the base-2 domain directly (float64):
    ``log2(sum_j 2^(s_j * log2 e))`` of the scaled scores ``s_j``; ``-inf`` for an empty
    sequence. Independent of :func:`decode_ref`'s natural-log route."""
    b_, hq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    rows = []
    for b in range(b_):
        if lens[b] == 0:
            rows.append(torch.full((hq,), -math.inf, device=DEV, dtype=torch.float64))
            continue
        k, _ = gathered(cache, indptr, indices, lens, b)
        g = hq // k.shape[1]
        s = torch.einsum("hd,lhd->hl", q[b].double(), k.double().repeat_interleave(g, 1)) * scale
        x = s * LOG2E
        m = x.max(-1, keepdim=True).values
        rows.append((m + torch.log2(torch.exp2(x - m).sum(-1, keepdim=True)))[:, 0])
    return torch.stack(rows)


@pytest.mark.parametrize("kv", ["fp16", "bf16", "fp8"])
def test_paged_decode_lse_is_base_2_and_run_return_lse(kv):
    page, hkv, hq, d = 16, 2, 8, 128
    tag = f"lse2{kv}"
    q_dtype = torch.bfloat16 if kv == "bf16" else torch.float16
    lens = [0, 1, 17, 300, 0, 1000]
    num_pages = sum(-(-n // page) for n in lens) + 3
    cache = tessera.PagedKVCache(num_pages, page, hkv, d, KV_DTYPES[kv])
    fill_cache(cache, tag)
    indptr, indices, last = paged_layout(lens, page, num_pages, tag)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper()
    if kv == "fp8":  # FlashInfer's own fp8 tests plan this way: data_type for the cache, q_data_type for q
        w.plan(indptr, indices, last, hq, hkv, d, page, data_type=torch.float8_e4m3fn, q_data_type=torch.float16)
    else:
        w.plan(indptr, indices, last, hq, hkv, d, page, data_type=q_dtype, q_data_type=q_dtype)
    q = randn((len(lens), hq, d), q_dtype, tag + "q")
    out, lse = w.run_return_lse(q, cache)
    assert lse.dtype == torch.float32 and lse.shape == (len(lens), hq)
    ref = lse_base2_ref(q, cache, indptr, indices, lens)
    empty = torch.tensor([n == 0 for n in lens], device=DEV)
    assert torch.isneginf(lse[empty]).all(), f"an empty sequence's LSE is -inf, got {lse[empty]}"
    assert torch.isfinite(lse[~empty]).all() and not torch.isnan(lse).any()
    # the natural-log budget of the other decode tests (1e-3 + 1e-3 * |lse|), in base 2
    err = (lse[~empty].double() - ref[~empty]).abs()
    assert (err <= (1e-3 + 1e-3 * ref[~empty].abs()) * LOG2E).all(), f"base-2 LSE off by {err.max():.3g} (seed {SEED})"
    assert torch.equal(out[empty].float(), torch.zeros_like(out[empty].float()))
    # run(return_lse=True), run_return_lse, lse= (a torch tensor and an interface object) agree bitwise
    out2, lse2 = w.run(q, cache, return_lse=True)
    assert torch.equal(out2, out) and torch.equal(lse2, lse)
    given = torch.full_like(lse, math.nan)
    o3, l3 = w.run_return_lse(q, cache, lse=given)
    assert l3 is given and torch.equal(given, lse) and torch.equal(o3, out)
    if q_dtype != torch.float16:
        return  # torch exports no bfloat16 through __cuda_array_interface__
    # interface objects naming a side stream: the decode and the base-2 scaling both run on it
    o4, l4 = torch.full_like(out, math.nan), torch.full_like(lse, math.nan)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    args = (Interface(q, side.cuda_stream), cache)
    kw = dict(out=Interface(o4, side.cuda_stream), lse=Interface(l4, side.cuda_stream))
    w.run(*args, **kw)  # the first run on a stream uploads the tables (synchronising it)
    torch.cuda.synchronize()
    assert torch.equal(o4, out) and torch.equal(l4, lse), "interface objects on a side stream"
    o4.fill_(math.nan)
    l4.fill_(math.nan)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # the scaling must queue after the decode, not race it
    w.run(*args, **kw)
    torch.cuda.synchronize()
    assert torch.equal(o4, out) and torch.equal(l4, lse), "interface objects on a side stream, second run"


def test_paged_append_matches_manual_indexing():
    for kv in ("fp16", "bf16", "fp8"):
        tag = f"papp{kv}"
        page, hkv, d = 16, 4, 64
        in_dtype = torch.bfloat16 if kv == "bf16" else torch.float16
        cache = tessera.PagedKVCache(64, page, hkv, d, KV_DTYPES[kv])
        fill_cache(cache, tag)
        before = cache.kv_cache().clone()
        lens = [5, 16, 17, 40, 3]  # after the append
        counts = [1, 3, 0, 17, 3]
        indptr, indices, last = paged_layout(lens, page, 64, tag)
        bi = [b for b, n in enumerate(counts) for _ in range(n)]
        pos = [lens[b] - n + j for b, n in enumerate(counts) for j in range(n)]
        k = randn((len(bi), hkv, d), in_dtype, tag + "k")
        v = randn((len(bi), hkv, d), in_dtype, tag + "v")
        as_dev = kv == "bf16"  # index arguments as CUDA tensors once, else lists
        idx = (lambda x: torch.tensor(x, dtype=torch.int32, device=DEV)) if as_dev else (lambda x: x)
        tessera.append_paged_kv_cache(k, v, idx(bi), idx(pos), cache, idx(indices), idx(indptr), idx(last))
        after = cache.kv_cache()
        expect = before.clone()
        for i, (b, p) in enumerate(zip(bi, pos)):
            pg = indices[indptr[b] + p // page]
            if kv == "fp8":
                sc = cache.scales()[pg]  # [Hkv, 2]
                expect[pg, 0, p % page] = (k[i].float() / sc[:, 0, None]).to(torch.float8_e4m3fn)
                expect[pg, 1, p % page] = (v[i].float() / sc[:, 1, None]).to(torch.float8_e4m3fn)
            else:
                expect[pg, 0, p % page] = k[i]
                expect[pg, 1, p % page] = v[i]
        if kv == "fp8":  # rounding ties may differ: compare dequantised, and untouched rows exactly
            diff = (after.float() - expect.float()).abs()
            assert (diff <= expect.float().abs() / 8 + 2.0**-9).all(), f"fp8 append off by {diff.max()}"
        else:
            assert torch.equal(after.view(torch.uint8), expect.view(torch.uint8)), f"{kv} append"
    with pytest.raises(NotImplementedError, match="`positions`"):
        tessera.append_paged_kv_cache(k[:1], v[:1], [0], [0], cache, indices, indptr, last)
    with pytest.raises(ValueError, match="physical page 64 is out of range"):
        tessera.append_paged_kv_cache(k[:1], v[:1], [0], [0], cache, [64], [0, 1], [1])


def test_decode_loop_with_wrapper_append_and_copy_pages():
    page, hkv, hq, d, layers = 16, 2, 8, 128, 2
    cache = tessera.PagedKVCache(32, page, hkv, d, "fp16", num_layers=layers)
    for layer in range(layers):
        fill_cache(cache, f"loop{layer}", layer)
    lens = [15, 16, 33]
    indptr, indices, last = paged_layout(lens, page, 32, "loop")
    w = tessera.BatchDecodeWithPagedKVCacheWrapper()
    for step in range(3):
        lens = [n + 1 for n in lens]  # each sequence gets one token: plan with the new lengths
        # grow the tables by a fresh page where needed
        tables = [indices[indptr[b] : indptr[b + 1]] for b in range(3)]
        free = [p for p in range(32) if p not in indices]
        for b in range(3):
            while len(tables[b]) * page < lens[b]:
                tables[b].append(free.pop())
        indices = [p for t in tables for p in t]
        indptr = [0]
        for t in tables:
            indptr.append(indptr[-1] + len(t))
        last = [n - (len(t) - 1) * page for n, t in zip(lens, tables)]
        w.plan(indptr, indices, last, hq, hkv, d, page)
        for layer in range(layers):
            k = randn((3, hkv, d), torch.float16, f"loopk{step}{layer}")
            v = randn((3, hkv, d), torch.float16, f"loopv{step}{layer}")
            w.append(k, v, cache, layer=layer)
            q = randn((3, hq, d), torch.float16, f"loopq{step}{layer}")
            out = w.run(q, cache, layer=layer)
            for b in range(3):
                kb, vb = gathered(cache, indptr, indices, lens, b, layer)
                assert torch.equal(kb[-1].half(), k[b]) and torch.equal(vb[-1].half(), v[b])
            assert_close(out.float(), decode_ref(q, cache, indptr, indices, lens, layer=layer)[0], torch.float16,
                         f"loop step {step} layer {layer}")
    # copy-on-write of a page: K, V of every layer
    src, dst = indices[0], [p for p in range(32) if p not in indices][0]
    cache.copy_pages([src], [dst])
    for layer in range(layers):
        kv = cache.kv_cache(layer)
        assert torch.equal(kv[dst], kv[src])


def test_paged_kv_cache_views_share_memory_and_keep_it_alive():
    cache = tessera.PagedKVCache(8, 16, 2, 64, "bf16")
    a, b = cache.kv_cache(), cache.kv_cache()
    assert a.data_ptr() == b.data_ptr() and a.dtype == torch.bfloat16 and a.shape == (8, 2, 16, 2, 64)
    a.fill_(1.5)
    assert b.float().mean().item() == 1.5
    with pytest.raises(ValueError, match="has no scales"):
        cache.scales()
    del cache, b
    import gc  # noqa: PLC0415

    gc.collect()
    junk = [torch.ones(1 << 20, device=DEV) for _ in range(4)]  # noqa: F841 (allocations after the free)
    assert a.float().mean().item() == 1.5  # the view kept tessera's pages alive
    fp8 = tessera.PagedKVCache(8, 16, 2, 64, "fp8_e4m3", fp8_scale=0.5)
    s = fp8.scales()
    assert s.shape == (8, 2, 2) and s.dtype == torch.float32 and (s == 0.5).all()
    with pytest.raises(ValueError, match=r"scales must be in \(0, 65504\]"):
        fp8.set_scales(torch.zeros(8, 2, 2))


def test_paged_errors_on_the_gpu():
    cache = tessera.PagedKVCache(16, 16, 2, 64, "fp16")
    w = tessera.BatchDecodeWithPagedKVCacheWrapper()
    w.plan([0, 1], [20], [4], 4, 2, 64, 16)  # page 20 is past this cache's 16 pages
    q = randn((1, 4, 64), torch.float16, "perr")
    with pytest.raises(ValueError, match="physical page 20 is out of range \\(the cache has 16 pages\\)"):
        w.run(q, cache)
    w.plan([0, 1], [3], [4], 4, 2, 64, 32)
    with pytest.raises(ValueError, match="plan\\(\\) was given page_size 32"):
        w.run(q, cache)
    w.plan([0, 1], [3], [4], 4, 2, 64, 16)
    with pytest.raises(ValueError, match="`q`: must be \\[batch_size, num_qo_heads, head_dim\\]"):
        w.run(q[:, :2], cache)
    with pytest.raises(ValueError, match="plan\\(\\) was given q_data_type float16"):
        w.run(q.bfloat16(), cache)
    w.run(q, cache)  # fine now


def test_paged_decode_orders_streams_without_synchronising():
    page, hkv, hq, d = 16, 2, 8, 128
    cache = tessera.PagedKVCache(64, page, hkv, d, "fp16")
    fill_cache(cache, "pstream")
    lens = [700, 1, 40]
    indptr, indices, last = paged_layout(lens, page, 64, "pstream")
    k = randn((3, hkv, d), torch.float16, "pstreamk")
    q = randn((3, hq, d), torch.float16, "pstreamq")
    w = tessera.BatchDecodeWithPagedKVCacheWrapper()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    append_args = ([0, 1, 2], [n - 1 for n in lens], cache, indices, indptr, last)
    # first calls on each stream build the device tables (a synchronisation of that stream)
    with torch.cuda.stream(s1):
        tessera.append_paged_kv_cache(k * 0, k * 0, *append_args)
    with torch.cuda.stream(s2):
        w.plan(indptr, indices, last, hq, hkv, d, page)
        w.run(q, cache)
    torch.cuda.synchronize()
    with torch.cuda.stream(s1):
        torch.cuda._sleep(200_000_000)  # ~0.1 s queued on s1 before the append
        tessera.append_paged_kv_cache(k, k, *append_args)
    with torch.cuda.stream(s2):  # the decode must wait for s1's append (tessera orders the cache)
        w.plan(indptr, indices, last, hq, hkv, d, page)
        out = w.run(q, cache)
    assert not s1.query(), "tessera synchronised (the sleep should still be running)"
    assert not s2.query(), "the decode on s2 did not wait for the append on s1"
    torch.cuda.synchronize()
    for b in range(3):
        kb, vb = gathered(cache, indptr, indices, lens, b)
        assert torch.equal(kb[-1].half(), k[b])
    assert_close(out.float(), decode_ref(q, cache, indptr, indices, lens)[0], torch.float16, "decode after append on s1")


@pytest.mark.skipif(_flashinfer() is None, reason="flashinfer not importable (or TESSERA_TEST_FLASHINFER=0)")
@pytest.mark.parametrize("kv", ["fp16", "bf16"])
def test_paged_decode_and_append_match_flashinfer(kv):
    flashinfer = _flashinfer()
    page, hkv, hq, d = 16, 8, 32, 128
    dt = KV_DTYPES[kv]
    lens = [1, 15, 16, 17, 3000, 257]
    num_pages = sum(-(-n // page) for n in lens) + 3
    cache = tessera.PagedKVCache(num_pages, page, hkv, d, dt)
    fill_cache(cache, f"fi{kv}")
    indptr, indices, last = paged_layout(lens, page, num_pages, f"fi{kv}")
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=DEV)  # noqa: E731
    # append the last token of every sequence with both, into copies of the same pages
    k = randn((len(lens), hkv, d), dt, f"fi{kv}k")
    v = randn((len(lens), hkv, d), dt, f"fi{kv}v")
    theirs = cache.kv_cache().clone()
    pos = [n - 1 for n in lens]
    flashinfer.append_paged_kv_cache(k, v, i32(list(range(len(lens)))), i32(pos), theirs, i32(indices), i32(indptr),
                                      i32(last), "NHD")
    tessera.append_paged_kv_cache(k, v, list(range(len(lens))), pos, cache, indices, indptr, last)
    assert torch.equal(cache.kv_cache().view(torch.uint8), theirs.view(torch.uint8)), "append differs from FlashInfer's"
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=DEV)
    fw = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    fw.plan(i32(indptr), i32(indices), i32(last), hq, hkv, d, page, pos_encoding_mode="NONE", q_data_type=dt,
            kv_data_type=dt)
    q = randn((len(lens), hq, d), dt, f"fi{kv}q")
    ref = fw.run(q, cache.kv_cache())  # FlashInfer reads tessera's pages through the view
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(i32(indptr), i32(indices), i32(last), hq, hkv, d, page, pos_encoding_mode="NONE", q_data_type=dt,
           kv_data_type=dt)
    out = w.run(q, cache)
    e = rel_l2(out, ref)
    assert e < BUDGET[dt], f"vs FlashInfer decode: rel_l2 {e:.3g} (seed {SEED})"


def test_readme_example_runs(capsys):
    from test_api import readme_example  # noqa: PLC0415 (the tests folder is on sys.path)

    exec(compile(readme_example(), "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "torch.Size([2, 1024, 16, 128])" in printed


def test_paged_readme_example_runs(capsys):
    from test_api import paged_readme_example  # noqa: PLC0415

    exec(compile(paged_readme_example(), "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "torch.Size([3, 32, 128])" in printed
    assert float(printed.split()[-1]) < 2e-2, printed


# -- matmul --------------------------------------------------------------------------------

MM_BUDGET = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
ACTS = {
    None: lambda t: t,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
}


def mm_ref(a, b, bias, act):
    """act(a @ b + bias) in float64 from the same inputs."""
    r = torch.matmul(a.double(), b.double())
    if bias is not None:
        r = r + bias.double()
    return ACTS[act](r)


def mm_close(out, ref, in_dtype, what):
    assert not torch.isnan(out).any(), f"{what}: NaN (seed {SEED})"
    e = rel_l2(out, ref)
    budget = max(MM_BUDGET[in_dtype], MM_BUDGET[out.dtype])
    assert e < budget, f"{what}: rel_l2 {e:.3g} >= {budget} (seed {SEED})"


MM_SHAPES = [(1, 1, 1), (7, 13, 29), (16, 4096, 512), (1, 1000, 257), (128, 256, 64), (200, 72, 333), (513, 511, 129)]


@pytest.mark.parametrize("mnk", MM_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32", "fp64"])
def test_matmul_matches_torch_mm(mnk, dtype):
    dt = {**DTYPES, "fp64": torch.float64}[dtype]
    m, n, k = mnk
    a = randn((m, k), dt, f"mm a{mnk}{dtype}")
    b = randn((k, n), dt, f"mm b{mnk}{dtype}")
    y = tessera.matmul(a, b)
    assert y.shape == (m, n) and y.dtype == dt and y.device == a.device
    mm_close(y, mm_ref(a, b, None, None), dt, f"matmul {dtype} {mnk}")


@pytest.mark.parametrize("act", list(ACTS), ids=str)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("m", [1, 5, 16, 77])
def test_matmul_linear_with_bias_and_activation(act, dtype, m):
    # y = act(x @ w.T + b) with w stored [N, K] (read in place, column-major B): torch addmm + act
    dt = DTYPES[dtype]
    n, k = 384, 200
    x = randn((m, k), dt, f"lin x{m}{dtype}{act}")
    w = randn((n, k), dt, f"lin w{m}{dtype}{act}", scale=0.1)
    bias = randn((n,), dt, f"lin b{m}{dtype}{act}")
    y = tessera.matmul(x, w.t(), bias=bias, activation=act)
    assert y.dtype == dt
    mm_close(y, mm_ref(x, w.t(), bias, act), dt, f"linear {dtype} m={m} {act}")
    ref16 = ACTS[act](torch.addmm(bias, x, w.t()))
    assert rel_l2(y, ref16) < 2 * MM_BUDGET[dt]


def test_matmul_out_dtype_out_and_layouts():
    a = randn((33, 70), torch.float16, "mm layouts a")
    bt = randn((45, 70), torch.float16, "mm layouts b")  # B stored [N, K]
    bias = randn((45,), torch.float32, "mm layouts bias")
    y = tessera.matmul(a, bt.t(), bias=bias, activation="silu", out_dtype=torch.float32)
    assert y.dtype == torch.float32
    mm_close(y, mm_ref(a, bt.t(), bias, "silu"), torch.float16, "fp16 -> fp32 out")
    # a transposed A, padded leading dimensions, a slice at an odd address (SIMT path), out=
    at = randn((70, 40), torch.float16, "mm layouts at")[:, :33].t()
    wide = randn((70, 64), torch.float16, "mm layouts wide")[:, 1:46]
    out = torch.full((33, 45), float("nan"), device=DEV, dtype=torch.float16)
    r = tessera.matmul(at, wide, out=out)
    assert r is out
    mm_close(out, mm_ref(at, wide, None, None), torch.float16, "transposed A, sliced B, out=")
    # strides the GEMM cannot read are copied first
    odd = randn((70, 90), torch.float16, "mm layouts odd")[:, ::2]
    mm_close(tessera.matmul(a, odd), mm_ref(a, odd, None, None), torch.float16, "strided B copied")


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_matmul_batched(dtype):
    dt = DTYPES[dtype]
    a = randn((5, 17, 40), dt, f"bmm a{dtype}")
    b = randn((5, 40, 24), dt, f"bmm b{dtype}")
    mm_close(tessera.matmul(a, b), mm_ref(a, b, None, None), dt, f"bmm {dtype}")
    w = randn((24, 40), dt, f"bmm w{dtype}")  # one weight for the batch
    y = tessera.matmul(a, w.t(), bias=randn((24,), dt, f"bmm bias{dtype}"), activation="relu")
    assert y.shape == (5, 17, 24)
    x1 = randn((17, 40), dt, f"bmm x1{dtype}")  # one A for the batch
    mm_close(tessera.matmul(x1, b), mm_ref(x1, b, None, None), dt, f"shared A {dtype}")
    # a batch of transposed views
    bt = randn((5, 24, 40), dt, f"bmm bt{dtype}").transpose(1, 2)
    mm_close(tessera.matmul(a, bt), mm_ref(a, bt, None, None), dt, f"bmm transposed B {dtype}")


def test_matmul_degenerate_shapes():
    a = randn((0, 8), torch.float16, "mm empty a")
    assert tessera.matmul(a, randn((8, 3), torch.float16, "mm empty b")).shape == (0, 3)
    z = tessera.matmul(torch.empty(4, 0, device=DEV, dtype=torch.float16), torch.empty(0, 5, device=DEV, dtype=torch.float16),
                       bias=torch.ones(5, device=DEV, dtype=torch.float16), activation="relu")
    assert torch.equal(z, torch.ones(4, 5, device=DEV, dtype=torch.float16))


def test_matmul_on_a_side_stream_and_plan_cache():
    a = randn((64, 128), torch.bfloat16, "mm stream a")
    b = randn((128, 96), torch.bfloat16, "mm stream b")
    tessera.matmul(a, b)
    before = tessera.plan_cache_info()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = tessera.matmul(a, b)
    s.synchronize()
    mm_close(y, mm_ref(a, b, None, None), torch.bfloat16, "side stream")
    tessera.matmul(a, b)
    info = tessera.plan_cache_info()
    assert info["gemm_hits"] > before["gemm_hits"] and info["gemm"] >= 2


# -- scaled_mm / int_mm (Hopper) -------------------------------------------------------------

HOPPER = torch.cuda.get_device_capability(DEV) == (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="tessera's fp8 / int8 GEMM runs on sm_90 only")
FP8 = {"e4m3": getattr(torch, "float8_e4m3fn", None), "e5m2": getattr(torch, "float8_e5m2", None)}
# fp8 inputs are exact in the float64 reference, so only the output rounding and the tensor
# cores' fp8-mode ("fast") accumulation, which keeps fewer bits than float32, differ from it:
# bfloat16's budget for bfloat16 out, 5e-3 for float16 and float32 out (DESIGN.md's fp8 budget,
# 6e-2, is for fp8 outputs)
LOWP_BUDGET = {torch.float32: 5e-3, torch.float16: 5e-3, torch.bfloat16: 1e-2}


def lowp_close(out, ref, what):
    assert not torch.isnan(out).any(), f"{what}: NaN (seed {SEED})"
    e = rel_l2(out, ref)
    assert e < LOWP_BUDGET[out.dtype], f"{what}: rel_l2 {e:.3g} >= {LOWP_BUDGET[out.dtype]} (seed {SEED})"


def fp8_inputs(m, n, k, dt, tag):
    """x [M, K] and a weight w [N, K] in fp8 (random normal values, rounded)."""
    return randn((m, k), torch.float32, tag + " x").to(dt), randn((n, k), torch.float32, tag + " w").to(dt)


def pos_scales(shape, tag):
    """Positive float32 scales in [0.5, 1.5)."""
    return torch.rand(shape, device=DEV, dtype=torch.float32, generator=gen(tag)) + 0.5


def scaled_ref(x, w, sa, sb, bias):
    """(x @ w.T) * scale_a * scale_b + bias in float64 from the same inputs."""
    r = (x.double() @ w.double().t()) * sa.double() * sb.double()
    return r if bias is None else r + bias.double()


def torch_scaled_mm(*args, **kw):
    """torch._scaled_mm's one tensor (older torch returned a pair), or None when this torch
    cannot run the case (its own restrictions: row-wise needs bfloat16 out, e4m3, ...)."""
    try:
        r = torch._scaled_mm(*args, **kw)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return None
    return r[0] if isinstance(r, tuple) else r


LOWP_SHAPES = [(16, 32, 16), (1, 64, 32), (77, 48, 64), (128, 256, 512), (200, 96, 4096), (513, 272, 128)]


@needs_hopper
@pytest.mark.skipif(FP8["e4m3"] is None or not hasattr(torch, "_scaled_mm"), reason="torch has no fp8 / _scaled_mm")
@pytest.mark.parametrize("mnk", LOWP_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize("odt", ["bf16", "fp16", "fp32"])
def test_scaled_mm_matches_torch_scaled_mm(mnk, fmt, scaling, odt):
    m, n, k = mnk
    dt, out_dtype = FP8[fmt], DTYPES[odt]
    tag = f"smm {mnk} {fmt} {scaling} {odt}"
    x, w = fp8_inputs(m, n, k, dt, tag)
    if scaling == "tensor":
        sa, sb = pos_scales((), tag + " sa"), pos_scales((), tag + " sb")
    else:
        sa, sb = pos_scales((m, 1), tag + " sa"), pos_scales((1, n), tag + " sb")
    bias = randn((n,), out_dtype, tag + " bias") if m % 2 else None
    y = tessera.scaled_mm(x, w.t(), sa, sb, bias=bias, out_dtype=out_dtype, use_fast_accum=True)
    assert y.shape == (m, n) and y.dtype == out_dtype and y.device == x.device
    lowp_close(y, scaled_ref(x, w, sa, sb, bias), f"scaled_mm {tag}")
    ref = torch_scaled_mm(x, w.t(), sa, sb, bias=bias, out_dtype=out_dtype, use_fast_accum=True)
    if ref is not None:  # the same inputs through cuBLASLt / CUTLASS
        lowp_close(y, ref.double(), f"scaled_mm vs torch._scaled_mm {tag}")


@needs_hopper
@pytest.mark.skipif(FP8["e4m3"] is None, reason="torch has no fp8 dtypes")
def test_scaled_mm_scale_forms_bias_and_degenerate_shapes():
    dt = FP8["e4m3"]
    x, w = fp8_inputs(64, 48, 32, dt, "smm forms")
    ref = scaled_ref(x, w, torch.tensor(0.75), torch.tensor(1.25), None)
    for sa, sb in [((), ()), ((1,), (1,)), ((1, 1), (1, 1))]:
        a_s = torch.full(sa, 0.75, device=DEV)
        b_s = torch.full(sb, 1.25, device=DEV)
        lowp_close(tessera.scaled_mm(x, w.t(), a_s, b_s, out_dtype=torch.float32), ref, f"scale shapes {sa} {sb}")
    # M = 1: one value of scale_a pairs with a row-wise scale_b
    x1 = x[:1].contiguous()
    sb = pos_scales((1, 48), "smm m1 sb")
    sa = torch.tensor(0.5, device=DEV)
    lowp_close(tessera.scaled_mm(x1, w.t(), sa, sb, out_dtype=torch.bfloat16), scaled_ref(x1, w, sa, sb, None), "M = 1 row-wise")
    # a row-wise scale_a sliced from a wider tensor is made contiguous first
    sa2 = pos_scales((64, 2), "smm sliced sa")[:, :1]
    sb2 = pos_scales((1, 48), "smm sliced sb")
    y = tessera.scaled_mm(x, w.t(), sa2, sb2, out_dtype=torch.bfloat16)
    lowp_close(y, scaled_ref(x, w, sa2, sb2, None), "sliced scale_a")
    # empty products and K = 0 (bias only)
    one = torch.ones((), device=DEV)
    e = tessera.scaled_mm(x[:0], w.t(), one, one, out_dtype=torch.bfloat16)
    assert e.shape == (0, 48)
    bias = randn((48,), torch.bfloat16, "smm k0 bias")
    z = tessera.scaled_mm(torch.empty(5, 0, device=DEV, dtype=dt), torch.empty(48, 0, device=DEV, dtype=dt).t(), one, one,
                          bias=bias, out_dtype=torch.bfloat16)
    assert torch.equal(z, bias.expand(5, 48))
    # torch's argument errors, as tessera's
    with pytest.raises(ValueError, match="`b`: .* are row-major.*w.t\\(\\)"):
        tessera.scaled_mm(x, w.t().contiguous(), one, one, out_dtype=torch.bfloat16)
    with pytest.raises(tessera.InvalidArgumentError, match="`scale_result`: given with a bfloat16 output"):
        tessera.scaled_mm(x, w.t(), one, one, scale_result=one, out_dtype=torch.bfloat16)
    with pytest.raises(tessera.InvalidArgumentError, match="`amax`: given with a float32 output"):
        tessera.scaled_mm(x, w.t(), one, one, out_dtype=torch.float32, amax=torch.empty((), device=DEV))
    with pytest.raises(tessera.UnsupportedError, match="fp8 outputs take no bias"):
        tessera.scaled_mm(x, w.t(), one, one, bias=torch.zeros(48, device=DEV, dtype=torch.bfloat16))
    with pytest.raises(NotImplementedError, match="mixing per-tensor and row-wise"):
        tessera.scaled_mm(x, w.t(), one, pos_scales((1, 48), "smm mixed"), out_dtype=torch.bfloat16)


# fp8 outputs: D = fp8(scale_result * d), d = (a @ b) * scale_a * scale_b in float32, rounded to
# nearest even and saturated to the largest finite value. The reference rounds the float64 d
# with torch; the kernel's d carries the tensor cores' fp8-mode accumulation error, a fraction
# (~2^-13, bounded here by 2^-10) of sum_k |a_k b_k| rather than of |d|: it can flip a rounding
# (up to 1% of the elements, one fp8 step), and near zero, where fp8 steps are fine, an element
# may be several steps off while within that absolute bound (measured on the H100: up to 27
# steps in the subnormal range with a large scale_result).
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def fp8_ordinal(y):
    """fp8 codes as integers ordered like their values (-0 and +0 both 0), so that adjacent
    representable values differ by 1."""
    c = y.view(torch.uint8).to(torch.int32)
    mag = c & 0x7F
    return torch.where(c >= 0x80, -mag, mag)


def fp8_ref(d, scale_result, dt):
    """fp8(scale_result * d) from the float64 d: saturated, then rounded by torch."""
    r = d if scale_result is None else d * scale_result.double()
    mx = torch.finfo(dt).max
    return r.clamp(-mx, mx).float().to(dt)


def fp8_acc_tol(x, w, sa, sb, scale_result):
    """The absolute error the fp8-mode accumulation may add to each output (see above):
    2^-10 scale_result scale_a scale_b sum_k |x_k w_k|, in float64."""
    t = (x.double().abs() @ w.double().abs().t()) * sa.double() * sb.double() * 2.0**-10
    return t if scale_result is None else t * scale_result.double()


def fp8_close(y, ref, what, max_diff_frac=0.01, abs_tol=None):
    """fp8 tensors equal but for at most `max_diff_frac` of the elements, each one fp8 step off
    or (with `abs_tol`) within its absolute accumulation tolerance."""
    assert y.dtype == ref.dtype and y.shape == ref.shape, (what, y.dtype, ref.dtype, y.shape, ref.shape)
    yf, rf = y.float(), ref.float()
    assert not torch.isnan(yf).any(), f"{what}: NaN (seed {SEED})"
    steps = (fp8_ordinal(y) - fp8_ordinal(ref)).abs()
    near = torch.zeros_like(steps, dtype=torch.bool) if abs_tol is None else (yf.double() - rf.double()).abs() <= abs_tol
    far = (steps > 1) & ~near
    worst = steps[far].max().item() if far.any() else 0
    assert not far.any(), f"{what}: an element is {worst} fp8 steps off, beyond the accumulation tolerance (seed {SEED})"
    frac = ((steps != 0) & ~near).float().mean().item()
    assert frac <= max_diff_frac, f"{what}: {frac:.3%} of the elements differ (seed {SEED})"
    e = rel_l2(yf, rf)
    assert e < 2e-2, f"{what}: rel_l2 {e:.3g} (seed {SEED})"


FP8_OUT_CASES = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]


@needs_hopper
@pytest.mark.skipif(FP8["e4m3"] is None, reason="torch has no fp8 dtypes")
@pytest.mark.parametrize("fmt, ofmt", FP8_OUT_CASES, ids=lambda s: s)
@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize("result", ["none", "small", "saturating"])
@pytest.mark.parametrize("mnk", [(129, 272, 208), (64, 16, 32), (1, 48, 64)], ids=lambda s: "x".join(map(str, s)))
def test_scaled_mm_fp8_output(fmt, ofmt, scaling, result, mnk):
    m, n, k = mnk
    dt, odt = FP8[fmt], FP8[ofmt]
    tag = f"smm fp8 out {mnk} {fmt} {ofmt} {scaling} {result}"
    x, w = fp8_inputs(m, n, k, dt, tag)
    if scaling == "tensor":
        sa, sb = pos_scales((), tag + " sa"), pos_scales((), tag + " sb")
    else:
        sa, sb = pos_scales((m, 1), tag + " sa"), pos_scales((1, n), tag + " sb")
    d = scaled_ref(x, w, sa, sb, None)
    dmax = d.abs().max()
    if result == "none":
        sr = None
    elif result == "small":  # shapes [] and [1] ([1, 1] below): any one-value tensor is taken
        sr = torch.full(() if scaling == "tensor" else (1,), 0.37, device=DEV)
    else:  # the largest |d| lands at 4x the format's largest value: the top of the range saturates
        sr = (4 * FP8_MAX[ofmt] / dmax).float().reshape(1, 1)
    amax = torch.full((1,), float("nan"), device=DEV)  # poisoned: the call zeroes and raises it
    y = tessera.scaled_mm(x, w.t(), sa, sb, scale_result=sr, out_dtype=odt, amax=amax)
    assert y.shape == (m, n) and y.dtype == odt and y.device == x.device
    ref = fp8_ref(d, sr, odt)
    tol = fp8_acc_tol(x, w, sa, sb, sr)
    fp8_close(y, ref, f"scaled_mm {tag}", abs_tol=tol)
    if result == "saturating":
        sat = ref.float().abs() == FP8_MAX[ofmt]
        assert sat.any() and (y.float()[sat].abs() == FP8_MAX[ofmt]).float().mean() >= 0.99, f"{tag}: saturation (seed {SEED})"
    # the amax: max |d| before scale_result; against the float64 d (the fp8-mode accumulation
    # differs from it by ~1e-4) and tightly against tessera's own float32 output of the product
    a_ = amax.item()
    assert abs(a_ - dmax.item()) <= 1e-3 * dmax.item(), f"{tag}: amax {a_} vs |d| max {dmax.item()} (seed {SEED})"
    y32 = tessera.scaled_mm(x, w.t(), sa, sb, out_dtype=torch.float32)
    m32 = y32.abs().max().item()
    assert abs(a_ - m32) <= 1e-4 * m32, f"{tag}: amax {a_} vs the float32 output's {m32} (seed {SEED})"
    # without amax, and with out_dtype None (a's dtype) when the formats match
    y2 = tessera.scaled_mm(x, w.t(), sa, sb, scale_result=sr, out_dtype=None if ofmt == fmt else odt)
    assert y2.dtype == odt and torch.equal(y2.view(torch.uint8), y.view(torch.uint8)), f"{tag}: without amax (seed {SEED})"
    # the same call through torch (cuBLASLt), where this torch and device take it (torch refuses
    # e5m2 x e5m2, row-wise scales with an fp8 output, ...); not when saturating, where the
    # library's overflow behaviour, not tessera's, would be under test
    # torch 2.10 and 2.11 drop scale_result on this path (pytorch/pytorch#190449: the fp8 output
    # is d at scale 1): compared only where torch applies the scale
    if hasattr(torch, "_scaled_mm") and result != "saturating":
        tref = torch_scaled_mm(x, w.t(), sa, sb, scale_result=sr, out_dtype=odt, use_fast_accum=True)
        if tref is not None and tref.dtype == odt and tref.shape == y.shape:
            ignored = False
            if sr is not None:  # (no result scale: nothing torch could drop)
                unscaled = torch_scaled_mm(x, w.t(), sa, sb, scale_result=torch.ones_like(sr), out_dtype=odt, use_fast_accum=True)
                ignored = unscaled is not None and sr.ne(1).any() and torch.equal(tref.view(torch.uint8), unscaled.view(torch.uint8))
            if not ignored:
                fp8_close(y, tref, f"scaled_mm vs torch._scaled_mm {tag}", abs_tol=2 * tol)


@needs_hopper
@pytest.mark.skipif(FP8["e4m3"] is None, reason="torch has no fp8 dtypes")
def test_scaled_mm_fp8_output_nan_amax_and_degenerate_shapes():
    dt = FP8["e4m3"]
    x, w = fp8_inputs(96, 64, 128, dt, "smm fp8 nan")
    one = torch.ones((), device=DEV)
    # an fp8 NaN in a (e4m3fn's NaN is 0x7f): row 0 of d is NaN, so is the amax; the other rows
    # are unaffected
    xn = x.clone()
    xn.view(torch.uint8)[0, 5] = 0x7F
    amax = torch.zeros((), device=DEV)
    for odt in (FP8["e4m3"], FP8["e5m2"]):
        y = tessera.scaled_mm(xn, w.t(), one, one, out_dtype=odt, amax=amax)
        assert torch.isnan(amax).item(), f"NaN d, amax {amax.item()} (seed {SEED})"
        assert torch.isnan(y[0].float()).all(), f"row 0 with a NaN input (seed {SEED})"
        fp8_close(
            y[1:],
            fp8_ref(scaled_ref(x[1:], w, one, one, None), None, odt),
            f"rows 1.. beside a NaN row {odt}",
            abs_tol=fp8_acc_tol(x[1:], w, one, one, None),
        )
    # a NaN-free call after it: the amax is zeroed first, not max(NaN, ...)
    tessera.scaled_mm(x, w.t(), one, one, amax=amax)
    assert abs(amax.item() - scaled_ref(x, w, one, one, None).abs().max().item()) <= 1e-3 * amax.item()
    # empty products and K = 0: no product, the amax is 0
    amax.fill_(float("nan"))
    e = tessera.scaled_mm(x[:0], w.t(), one, one, amax=amax)
    assert e.shape == (0, 64) and e.dtype == dt and amax.item() == 0.0
    amax.fill_(float("nan"))
    z = tessera.scaled_mm(torch.empty(5, 0, device=DEV, dtype=dt), torch.empty(64, 0, device=DEV, dtype=dt).t(), one, one,
                          out_dtype=FP8["e5m2"], amax=amax)
    assert z.dtype == FP8["e5m2"] and torch.equal(z.float(), torch.zeros(5, 64, device=DEV)) and amax.item() == 0.0
    # the output's 16-byte row pitch: N = 40 is refused for fp8 (40 bytes), fine for bfloat16
    with pytest.raises(tessera.InvalidArgumentError, match="`ldd`: 40 bytes"):
        tessera.scaled_mm(x, w[:40].t(), one, one, out_dtype=dt)
    assert tessera.scaled_mm(x, w[:40].t(), one, one, out_dtype=torch.bfloat16).shape == (96, 40)
    # amax on another stream: written on the current stream, like the output
    s = torch.cuda.Stream(DEV)
    amax.fill_(float("nan"))
    torch.cuda.current_stream(DEV).synchronize()
    with torch.cuda.stream(s):
        tessera.scaled_mm(x, w.t(), one, one, amax=amax)
    s.synchronize()
    assert not torch.isnan(amax).item() and amax.item() > 0
    # errors: amax not float32 / one element, or sharing memory with a scale
    with pytest.raises(tessera.InvalidArgumentError, match="`amax`: has dtype float16"):
        tessera.scaled_mm(x, w.t(), one, one, amax=torch.zeros((), device=DEV, dtype=torch.float16))
    with pytest.raises(tessera.InvalidArgumentError, match="`amax`: has dtype float32 and shape \\[2\\]"):
        tessera.scaled_mm(x, w.t(), one, one, amax=torch.zeros(2, device=DEV))
    with pytest.raises(tessera.InvalidArgumentError, match="`amax`: shares memory with `scale_a`"):
        tessera.scaled_mm(x, w.t(), one, one.clone(), amax=one)
    with pytest.raises(tessera.UnsupportedError, match="`out_dtype` = float8_e4m3fn with int8 inputs"):
        a8 = torch.zeros(16, 32, device=DEV, dtype=torch.int8)
        tessera.scaled_mm(a8, a8.t(), one, one, out_dtype=dt)


@needs_hopper
@pytest.mark.parametrize("odt", ["bf16", "fp32"])
def test_scaled_mm_int8_dequantised(odt):
    # a tessera extension: int8 inputs, int32 accumulate, scaled into bf16 / fp32
    m, n, k = 100, 64, 256
    a = torch.randint(-128, 128, (m, k), device=DEV, dtype=torch.int8, generator=gen("smm i8 a"))
    w = torch.randint(-128, 128, (n, k), device=DEV, dtype=torch.int8, generator=gen("smm i8 w"))
    sa, sb = pos_scales((m, 1), "smm i8 sa") * 1e-3, pos_scales((1, n), "smm i8 sb") * 1e-3
    y = tessera.scaled_mm(a, w.t(), sa, sb, out_dtype=DTYPES[odt])
    lowp_close(y, scaled_ref(a, w, sa, sb, None), f"int8 scaled_mm {odt}")


INT_MM_SHAPES = [(17, 8, 16), (1, 64, 32), (32, 32, 32), (77, 100, 208), (256, 512, 1024), (33, 4, 4096)]


@needs_hopper
@pytest.mark.parametrize("mnk", INT_MM_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_int_mm_matches_torch_int_mm(mnk):
    m, n, k = mnk
    a = torch.randint(-128, 128, (m, k), device=DEV, dtype=torch.int8, generator=gen(f"imm a {mnk}"))
    w = torch.randint(-128, 128, (n, k), device=DEV, dtype=torch.int8, generator=gen(f"imm w {mnk}"))
    a[0, :] = -128  # the extremes: |sum| up to 2^14 K
    w[0, :] = -128
    y = tessera.int_mm(a, w.t())
    assert y.shape == (m, n) and y.dtype == torch.int32
    exact = (a.double() @ w.double().t()).to(torch.int32)  # exact: |sums| << 2^53
    assert torch.equal(y, exact), f"int_mm {mnk}: {(y != exact).sum().item()} wrong elements (seed {SEED})"
    if hasattr(torch, "_int_mm"):
        try:
            ref = torch._int_mm(a, w.t())
        except RuntimeError:  # torch's own limits (M > 16, K and N multiples of 8)
            ref = None
        if ref is not None:
            assert torch.equal(y, ref), f"int_mm vs torch._int_mm {mnk} (seed {SEED})"


@needs_hopper
def test_int_mm_and_scaled_mm_padded_leading_dimensions():
    # K = 40 (not a multiple of the kernel's K tile) read from rows padded to 64 bytes: legal for
    # TMA (16-byte row pitch), the K tail must be zero-filled
    a = torch.randint(-128, 128, (50, 64), device=DEV, dtype=torch.int8, generator=gen("imm pad a"))[:, :40]
    w = torch.randint(-128, 128, (24, 64), device=DEV, dtype=torch.int8, generator=gen("imm pad w"))[:, :40]
    y = tessera.int_mm(a, w.t())
    assert torch.equal(y, (a.double() @ w.double().t()).to(torch.int32)), f"padded int_mm (seed {SEED})"
    if FP8["e4m3"] is not None:
        x8 = randn((50, 80), torch.float32, "smm pad x").to(FP8["e4m3"])[:, :40]
        w8 = randn((24, 80), torch.float32, "smm pad w").to(FP8["e4m3"])[:, :40]
        one = torch.ones((), device=DEV)
        y8 = tessera.scaled_mm(x8, w8.t(), one, one, out_dtype=torch.float32)
        lowp_close(y8, scaled_ref(x8, w8, one, one, None), "padded scaled_mm")


@needs_hopper
def test_int_mm_errors_and_degenerate_shapes():
    a = torch.randint(-128, 128, (32, 64), device=DEV, dtype=torch.int8, generator=gen("imm err a"))
    w = torch.randint(-128, 128, (16, 64), device=DEV, dtype=torch.int8, generator=gen("imm err w"))
    with pytest.raises(ValueError, match="`b`: .* are row-major.*w.t\\(\\)"):
        tessera.int_mm(a, w.t().contiguous())
    with pytest.raises(ValueError, match="`lda`: 40 bytes"):
        tessera.int_mm(a[:, :40].contiguous(), w[:, :40].t())
    assert tessera.int_mm(a[:0], w.t()).shape == (0, 16)
    z = tessera.int_mm(torch.empty(3, 0, device=DEV, dtype=torch.int8), torch.empty(16, 0, device=DEV, dtype=torch.int8).t())
    assert torch.equal(z, torch.zeros(3, 16, device=DEV, dtype=torch.int32))


@pytest.mark.skipif(HOPPER, reason="this device is sm_90")
def test_scaled_mm_and_int_mm_off_hopper_raise_unsupported():
    a = torch.randint(-128, 128, (32, 64), device=DEV, dtype=torch.int8)
    w = torch.randint(-128, 128, (16, 64), device=DEV, dtype=torch.int8)
    with pytest.raises(tessera.UnsupportedError, match="sm_90"):
        tessera.int_mm(a, w.t())
    one = torch.ones((), device=DEV)
    with pytest.raises(tessera.UnsupportedError, match="sm_90"):
        tessera.scaled_mm(a, w.t(), one, one, out_dtype=torch.bfloat16)


# -- sparse --------------------------------------------------------------------------------


def random_sparse(m, n, density, tag, dtype=torch.float64):
    """A random m x n torch COO tensor on the GPU (with a duplicate entry and an empty row)."""
    g = gen(tag)
    nnz = max(1, int(m * n * density))
    rows = torch.randint(0, m, (nnz,), device=DEV, generator=g)
    cols = torch.randint(0, n, (nnz,), device=DEV, generator=g)
    rows = torch.where(rows == m // 2, torch.zeros_like(rows), rows)  # row m // 2 stays empty
    rows[-1], cols[-1] = rows[0], cols[0]  # a duplicate: summed
    vals = torch.randn(nnz, device=DEV, dtype=torch.float64, generator=g).to(dtype)
    return torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (m, n))


SP_SHAPES = [(1, 1, 1.0), (97, 61, 0.05), (1000, 3000, 0.002), (4096, 64, 0.3)]


@pytest.mark.parametrize("mnd", SP_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", ["fp64", "fp32"])
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_products_match_torch(mnd, dtype, layout):
    dt = {"fp64": torch.float64, "fp32": torch.float32}[dtype]
    m, n, density = mnd
    s = random_sparse(m, n, density, f"sp{mnd}{dtype}", dt)
    if layout == "csr":
        s = s.coalesce().to_sparse_csr()
    A = tessera.sparse.csr_matrix(s)
    dense = s.to_dense().double()
    assert A.shape == (m, n) and A.dtype == dt
    assert A.nnz == (s.coalesce().values().numel() if layout == "coo" else s.values().numel())
    budget = 1e-12 if dt == torch.float64 else 1e-5
    x = randn((n,), dt, f"spx{mnd}{dtype}")
    y = A @ x
    assert y.shape == (m,) and y.dtype == dt and rel_l2(y, dense @ x.double()) < budget
    u = randn((m,), dt, f"spu{mnd}{dtype}")
    assert rel_l2(A.T @ u, dense.t() @ u.double()) < budget
    X = randn((n, 7), dt, f"spX{mnd}{dtype}")
    assert rel_l2(A @ X, dense @ X.double()) < budget
    Xc = randn((7, n), dt, f"spXc{mnd}{dtype}").t()  # column-major
    Yc = A @ Xc
    assert Yc.stride() == (1, m) or m <= 1
    assert rel_l2(Yc, dense @ Xc.double()) < budget
    U = randn((m, 3), dt, f"spU{mnd}{dtype}")
    assert rel_l2(A.T @ U, dense.t() @ U.double()) < budget


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_sparse_half_values(dtype):
    dt = DTYPES[dtype]
    s = random_sparse(300, 200, 0.02, f"sphalf{dtype}", torch.float32)
    A = tessera.sparse.csr_matrix(s.to(dt))
    x = randn((200,), dt, f"sphalfx{dtype}")
    ref = s.to(dt).to_dense().double() @ x.double()
    assert rel_l2(A @ x, ref) < BUDGET[dt]


def test_sparse_from_scipy_and_errors():
    sp = pytest.importorskip("scipy.sparse")
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(SEED)
    S = sp.random(500, 300, density=0.01, format="csr", random_state=rng, dtype=np.float64)
    A = tessera.sparse.csr_matrix(S)
    assert A.shape == S.shape and A.nnz == S.nnz and A.index_dtype == "int32"
    x = torch.from_numpy(rng.standard_normal(300)).to(DEV)
    assert rel_l2(A @ x, torch.from_numpy(S @ x.cpu().numpy()).to(DEV)) < 1e-12
    u = torch.from_numpy(rng.standard_normal(500)).to(DEV)
    assert rel_l2(A.T @ u, torch.from_numpy(S.T @ u.cpu().numpy()).to(DEV)) < 1e-12
    with pytest.raises(ValueError, match="`x`: has dtype float32; the matrix holds float64"):
        A @ x.float()
    with pytest.raises(ValueError, match="`x`: has shape"):
        A @ u
    # a side stream: ordered with events, same result
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = A @ x
    s.synchronize()
    assert rel_l2(y, torch.from_numpy(S @ x.cpu().numpy()).to(DEV)) < 1e-12


# -- lsmr ----------------------------------------------------------------------------------


def lsmr_problem(m, n, tag, density=0.05):
    """A sparse m x n system 3 I + R, R random with about density * n entries per row scaled so
    that its spectrum spreads about +-1: condition number about 2, convergence in few dozen
    iterations, so that SciPy and tessera take the same steps."""
    s = random_sparse(m, n, density, tag).coalesce()
    s = s * (0.5 / math.sqrt(max(1.0, density * n)))
    # a well-conditioned part so that the solves converge in a modest number of iterations
    k = min(m, n)
    eye = torch.sparse_coo_tensor(torch.arange(k, device=DEV).repeat(2, 1), torch.full((k,), 3.0, device=DEV, dtype=torch.float64), (m, n))
    return (s + eye).coalesce()


@pytest.mark.parametrize("mn", [(60, 40), (40, 60), (300, 300)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("damp", [0.0, 0.5])
def test_lsmr_matches_scipy(mn, damp):
    sp = pytest.importorskip("scipy.sparse")
    linalg = pytest.importorskip("scipy.sparse.linalg")
    np = pytest.importorskip("numpy")
    m, n = mn
    s = lsmr_problem(m, n, f"lsmr{mn}{damp}")
    idx, vals = s.indices().cpu().numpy(), s.values().cpu().numpy()
    S = sp.csr_matrix((vals, (idx[0], idx[1])), shape=(m, n))
    b = np.random.default_rng(SEED).standard_normal(m)
    want = linalg.lsmr(S, b, damp=damp, atol=1e-10, btol=1e-10)
    for A, bb in [(S, b), (tessera.sparse.csr_matrix(S), b), (s, torch.from_numpy(b).to(DEV))]:
        got = tessera.lsmr(A, bb, damp=damp, atol=1e-10, btol=1e-10)
        x = got[0].cpu().numpy() if isinstance(got[0], torch.Tensor) else got[0]
        assert got[1] == want[1], (got[1:], want[1:])
        assert abs(got[2] - want[2]) <= 1, (got[2], want[2])
        assert np.linalg.norm(x - want[0]) <= 1e-6 * max(1.0, np.linalg.norm(want[0]))
        for i in range(3, 8):
            assert abs(got[i] - want[i]) <= 1e-5 * max(1.0, abs(want[i])), (i, got[i], want[i])
    if isinstance(got[0], torch.Tensor):
        assert got[0].device == DEV and got[0].dtype == torch.float64


def test_lsmr_dense_and_operator_against_torch_lstsq():
    m, n = 120, 50
    A = randn((m, n), torch.float64, "lsmr dense A") + 4 * torch.eye(m, n, device=DEV, dtype=torch.float64)
    b = randn((m,), torch.float64, "lsmr dense b")
    ref = torch.linalg.lstsq(A, b.unsqueeze(1)).solution.squeeze(1)
    x, istop, itn, normr, *_ = tessera.lsmr(A, b, atol=1e-12, btol=1e-12, maxiter=500)
    assert istop in (1, 2) and itn > 0
    assert rel_l2(x, ref) < 1e-8
    assert abs(normr - float(torch.linalg.vector_norm(b - A @ x))) < 1e-8 * max(1.0, normr)

    class Op:
        shape = (m, n)
        dtype = torch.float64

        def matvec(self, v):
            return A @ v

        def rmatvec(self, v):
            return A.t() @ v

    x2, istop2, itn2, *_ = tessera.lsmr(Op(), b, atol=1e-12, btol=1e-12, maxiter=500)
    assert (istop2, itn2) == (istop, itn) and rel_l2(x2, x) < 1e-12

    class Bad(Op):
        def rmatvec(self, v):
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        tessera.lsmr(Bad(), b)


def test_lsmr_float32_csr_and_x0():
    s = lsmr_problem(200, 80, "lsmr f32").to(torch.float32)
    A = tessera.sparse.csr_matrix(s)
    b = randn((200,), torch.float32, "lsmr f32 b")
    x, istop, itn, *_ = tessera.lsmr(A, b)
    dense = s.to_dense().double()
    ref = torch.linalg.lstsq(dense, b.double().unsqueeze(1)).solution.squeeze(1)
    assert x.dtype == torch.float32 and rel_l2(x, ref) < 1e-4 and istop in (1, 2, 7), (istop, itn)
    # a warm start at the answer stays there
    x1, *_ = tessera.lsmr(A, b, x0=x)
    assert rel_l2(x1, ref) < 1e-4
    with pytest.raises(NotImplementedError, match="LSMR on a float16 matrix"):
        tessera.lsmr(tessera.sparse.csr_matrix(s.to(torch.float16)), b)


# -- lsmr: many right-hand sides and damp lists --------------------------------------------

MANY_M, MANY_N, MANY_K = 37, 23, 3  # odd sizes
# (atol = btol, x tolerance, estimate tolerance) per storage dtype: fp64 as test_lsmr_matches_scipy;
# fp32 at verify's F32_MIN_TOL (smaller tolerances are below f32 rounding)
MANY_TOL = {torch.float64: (1e-10, 1e-6, 1e-5), torch.float32: (1e-4, 1e-3, 5e-2)}


def _np_rng(tag):
    np = pytest.importorskip("numpy")
    return np.random.default_rng([SEED, zlib.crc32(tag.encode())])


def _scipy_of(s):
    """The SciPy CSR (float64) of a torch sparse COO tensor (its values as stored)."""
    sp = pytest.importorskip("scipy.sparse")
    s = s.coalesce()
    idx, vals = s.indices().cpu().numpy(), s.values().double().cpu().numpy()
    return sp.csr_matrix((vals, (idx[0], idx[1])), shape=tuple(s.shape))


def _np(v):
    import numpy as np  # noqa: PLC0415

    return v.detach().cpu().double().numpy() if isinstance(v, torch.Tensor) else np.asarray(v, dtype=np.float64)


def _same_solve(got, want, x_tol, est_tol, what, conda_ratio=None):
    """One solve's 8-tuple against another's: same istop, itn within 1, x and the estimates
    close (relative to max(1, |want|)); conda within a ratio when given."""
    import numpy as np  # noqa: PLC0415

    assert int(got[1]) == int(want[1]), (what, "istop", got[1:], want[1:], SEED)
    assert abs(int(got[2]) - int(want[2])) <= 1, (what, "itn", got[2], want[2], SEED)
    x, wx = _np(got[0]), _np(want[0])
    assert x.shape == wx.shape, (what, x.shape, wx.shape)
    err = np.linalg.norm(x - wx)
    assert err <= x_tol * max(1.0, np.linalg.norm(wx)), (what, "x", err, SEED)
    for i, name in zip(range(3, 8), ("normr", "normar", "norma", "conda", "normx")):
        g, w = float(got[i]), float(want[i])
        if name == "conda" and conda_ratio is not None:
            assert max(g, w) <= conda_ratio * max(min(g, w), 1e-300), (what, name, g, w, SEED)
        else:
            assert abs(g - w) <= est_tol * max(1.0, abs(w)), (what, name, g, w, SEED)


def _column(r, j):
    """Column j of a many-right-hand-sides result as a one-solve 8-tuple."""
    return (r[0][:, j],) + tuple(r[i][j] for i in range(1, 8))


def _check_many_form(r, b, n, k):
    """The return form of a 2-D b: x [n, k] of b's kind, seven arrays of length k."""
    np = pytest.importorskip("numpy")
    x = r[0]
    assert tuple(x.shape) == (n, k)
    if isinstance(b, torch.Tensor):
        assert isinstance(x, torch.Tensor) and x.device == b.device and x.dtype == b.dtype
        for i in range(1, 8):
            want = torch.int64 if i <= 2 else torch.float64
            assert isinstance(r[i], torch.Tensor) and r[i].dtype == want and r[i].device.type == "cpu", i
            assert tuple(r[i].shape) == (k,)
    else:
        assert isinstance(x, np.ndarray) and x.dtype == np.float64
        for i in range(1, 8):
            assert isinstance(r[i], np.ndarray) and r[i].shape == (k,), i
            assert r[i].dtype == (np.int64 if i <= 2 else np.float64), (i, r[i].dtype)


def _many_problem(tag, dtype, warm):
    """A fresh 37 x 23 system (stored in dtype), its SciPy twin on the rounded values, B [m, k]
    and X0 [n, k] (NumPy float64, rounded to dtype) or None."""
    s = lsmr_problem(MANY_M, MANY_N, tag).to(dtype)
    rng = _np_rng(tag)
    rounded = lambda a: torch.from_numpy(a).to(dtype).double().numpy()  # noqa: E731
    B = rounded(rng.standard_normal((MANY_M, MANY_K)))
    X0 = rounded(rng.standard_normal((MANY_N, MANY_K))) if warm else None
    return s, _scipy_of(s), B, X0


@pytest.mark.parametrize("warm", [False, True], ids=["x0-none", "x0"])
@pytest.mark.parametrize("op", ["csr", "dense"])
@pytest.mark.parametrize("dtype", ["fp64", "fp32"])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_lsmr_many_rhs_matches_single_solves_and_scipy(kind, dtype, op, warm):
    linalg = pytest.importorskip("scipy.sparse.linalg")
    dt = {"fp64": torch.float64, "fp32": torch.float32}[dtype]
    tol, x_tol, est_tol = MANY_TOL[dt]
    s, S, B, X0 = _many_problem(f"lsmr many {kind} {dtype} {op} {warm}", dt, warm)
    A = tessera.sparse.csr_matrix(s) if op == "csr" else s.to_dense()
    if kind == "torch":
        b, x0 = torch.from_numpy(B).to(DEV, dt), (torch.from_numpy(X0).to(DEV, dt) if warm else None)
    else:
        b, x0 = B, X0
    r = tessera.lsmr(A, b, atol=tol, btol=tol, x0=x0)
    _check_many_form(r, b, MANY_N, MANY_K)
    for j in range(MANY_K):
        # the column alone through today's 1-D path (same A, same dtype)
        alone = tessera.lsmr(A, b[:, j], atol=tol, btol=tol, x0=None if x0 is None else x0[:, j])
        tight = (1e-8, 1e-6) if dt == torch.float64 else (1e-4, 1e-3)
        _same_solve(_column(r, j), alone, *tight, f"column {j} vs its 1-D solve")
        # SciPy in float64 on the same (rounded) data
        want = linalg.lsmr(S, B[:, j], atol=tol, btol=tol, x0=None if X0 is None else X0[:, j])
        ratio = 1.3 if dt == torch.float32 else None
        _same_solve(_column(r, j), want, x_tol, est_tol, f"column {j} vs SciPy", conda_ratio=ratio)


def test_lsmr_many_rhs_every_operator_kind(capsys):
    """SciPy sparse, torch sparse (COO, CSR) and matvec/rmatvec objects take a 2-D b too."""
    dt = torch.float64
    s, S, B, X0 = _many_problem("lsmr many kinds", dt, True)
    dense = s.to_dense()

    class Op:
        shape = (MANY_M, MANY_N)
        dtype = dt

        def matvec(self, v):
            return dense @ v

        def rmatvec(self, v):
            return dense.t() @ v

    b, x0 = torch.from_numpy(B).to(DEV), torch.from_numpy(X0).to(DEV)
    for what, A in [("scipy", S), ("torch coo", s), ("torch csr", s.to_sparse_csr()), ("matvec", Op())]:
        r = tessera.lsmr(A, b, atol=1e-10, btol=1e-10, x0=x0, show=(what == "matvec"))
        _check_many_form(r, b, MANY_N, MANY_K)
        for j in range(MANY_K):
            alone = tessera.lsmr(A, b[:, j], atol=1e-10, btol=1e-10, x0=x0[:, j])
            _same_solve(_column(r, j), alone, 1e-8, 1e-6, f"{what} column {j}")
    out = capsys.readouterr().out
    assert f"{MANY_K} right-hand sides" in out and f"column {MANY_K - 1}: istop" in out, out
    # a [m, 1] b is the 1-D solve: scalars and a 1-D x
    one = tessera.lsmr(S, b[:, :1], atol=1e-10, btol=1e-10)
    assert isinstance(one[1], int) and tuple(one[0].shape) == (MANY_N,)


@pytest.mark.parametrize("warm", [False, True], ids=["x0-none", "x0"])
def test_lsmr_many_rhs_zero_column(warm):
    linalg = pytest.importorskip("scipy.sparse.linalg")
    np = pytest.importorskip("numpy")
    s, S, B, X0 = _many_problem(f"lsmr many zero {warm}", torch.float64, warm)
    B[:, 1] = 0.0
    r = tessera.lsmr(tessera.sparse.csr_matrix(s), B, atol=1e-10, btol=1e-10, x0=X0)
    # SciPy's b = 0 answer: istop 0, x = 0 (also from a nonzero x0)
    assert int(r[1][1]) == 0 and int(r[2][1]) == 0 and not np.any(r[0][:, 1]), (r[1], r[2])
    for j in range(MANY_K):
        want = linalg.lsmr(S, B[:, j], atol=1e-10, btol=1e-10, x0=None if X0 is None else X0[:, j])
        _same_solve(_column(r, j), want, 1e-6, 1e-5, f"column {j} vs SciPy")


@pytest.mark.parametrize("op", ["csr", "dense"])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_lsmr_damp_list_matches_separate_solves(kind, op, capsys):
    linalg = pytest.importorskip("scipy.sparse.linalg")
    tag = f"lsmr damps {kind} {op}"
    s, S, B, X0 = _many_problem(tag, torch.float64, True)
    A = tessera.sparse.csr_matrix(s) if op == "csr" else s.to_dense()
    b = B[:, 0] if kind == "numpy" else torch.from_numpy(B[:, 0]).to(DEV)
    x0 = X0[:, 0] if kind == "numpy" else torch.from_numpy(X0[:, 0]).to(DEV)
    damps = [0.0, 0.37, 1.9]
    rs = tessera.lsmr(A, b, damp=damps, atol=1e-10, btol=1e-10, x0=x0, show=True)
    assert isinstance(rs, list) and len(rs) == len(damps)
    out = capsys.readouterr().out
    assert "3 damps in one run" in out and "damp 1.9: istop" in out, out
    for d, r in zip(damps, rs):
        assert isinstance(r[1], int) and type(r[0]) is type(b)
        alone = tessera.lsmr(A, b, damp=d, atol=1e-10, btol=1e-10, x0=x0)
        _same_solve(r, alone, 1e-8, 1e-6, f"damp {d} vs its own solve")
        want = linalg.lsmr(S, B[:, 0], damp=d, atol=1e-10, btol=1e-10, x0=X0[:, 0])
        _same_solve(r, want, 1e-6, 1e-5, f"damp {d} vs SciPy")
    # the damp forms: a tuple, a NumPy array, a torch tensor, one damp
    np = pytest.importorskip("numpy")
    for form in (tuple(damps), np.array(damps), torch.tensor(damps, dtype=torch.float64)):
        again = tessera.lsmr(A, b, damp=form, atol=1e-10, btol=1e-10, x0=x0)
        assert [int(r[2]) for r in again] == [int(r[2]) for r in rs]
    assert len(tessera.lsmr(A, b, damp=[0.37], atol=1e-10, btol=1e-10)) == 1


def test_lsmr_damp_list_longer_than_one_run():
    """More damps than one run holds (MAX_DAMPS): solved in several runs, in order."""
    s, S, B, _ = _many_problem("lsmr damps long", torch.float64, False)
    A = tessera.sparse.csr_matrix(s)
    damps = [0.05 * i for i in range(tessera._tessera.LSMR_MAX_DAMPS + 7)]
    rs = tessera.lsmr(A, B[:, 0], damp=damps, atol=1e-10, btol=1e-10)
    assert len(rs) == len(damps)
    for i in (0, 1, tessera._tessera.LSMR_MAX_DAMPS - 1, tessera._tessera.LSMR_MAX_DAMPS, len(damps) - 1):
        alone = tessera.lsmr(A, B[:, 0], damp=damps[i], atol=1e-10, btol=1e-10)
        _same_solve(rs[i], alone, 1e-8, 1e-6, f"damp {damps[i]} (entry {i})")


def test_lsmr_many_rhs_errors_on_the_gpu():
    s, S, B, _ = _many_problem("lsmr many errors", torch.float64, False)
    b = torch.from_numpy(B).to(DEV)
    b[4, 2] = float("nan")
    with pytest.raises(ValueError, match=r"`b`: element \(4, 2\)"):
        tessera.lsmr(s, b)
    with pytest.raises(ValueError, match="`x0`: with a 2-D b of 3 columns"):
        tessera.lsmr(s, torch.from_numpy(B).to(DEV), x0=torch.zeros(MANY_N, device=DEV, dtype=torch.float64))
    with pytest.raises(ValueError, match="`damp`: a damp list takes a 1-D b"):
        tessera.lsmr(s, torch.from_numpy(B).to(DEV), damp=[0.1, 0.2])
