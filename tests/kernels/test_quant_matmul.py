"""fastmode's CPU kernels against references: gguf's own dequantization, a
numpy model of the quantized-activation arithmetic, and fp32 PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastmode.kernels import ops, unavailable_reason

K = ops()
pytestmark = pytest.mark.skipif(K is None, reason=f"kernels unavailable: {unavailable_reason()}")
QTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
ALL_ROWS = torch.empty(0, dtype=torch.long)


def blocks(qtype: str, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    """(ggml block bytes (n, row_bytes), their exact fp32 values (n, k)) for a random weight."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    w = np.random.default_rng(seed).normal(0, 0.05, (n, k)).astype(np.float32)
    q = quantize(w, GGMLQuantizationType[qtype])
    return torch.from_numpy(np.ascontiguousarray(q)), dequantize(q, GGMLQuantizationType[qtype]).astype(np.float32)


def reference_int8(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """llama.cpp's arithmetic as documented: each 32-value block of x rounded (half to even)
    to int8 on the grid amax/127, then x_hat @ w.T."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32).astype(np.float32)
    amax = np.abs(xb).max(-1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    xhat = d.astype(np.float64) * np.rint(xb * inv)
    return xhat.reshape(m, k) @ w.T.astype(np.float64)


@pytest.mark.parametrize("qtype", QTYPES)
def test_dequantize_is_exactly_ggufs(qtype):
    raw, expect = blocks(qtype, 40, 96)
    got = K.quant_dequantize(raw, QTYPES[qtype], 96, ALL_ROWS)
    np.testing.assert_array_equal(got.numpy(), expect)
    rows = torch.tensor([3, 0, 39, 3])
    np.testing.assert_array_equal(K.quant_dequantize(raw, QTYPES[qtype], 96, rows).numpy(), expect[[3, 0, 39, 3]])


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("int8", [False, True])
def test_matmul_matches_the_documented_arithmetic(qtype, int8):
    raw, w = blocks(qtype, 70, 160, seed=1)
    x = torch.randn(9, 160, generator=torch.Generator().manual_seed(2))
    x[3, 5] = 40.0  # an outlier channel, as real activations have
    got = K.quant_matmul(x, raw, QTYPES[qtype], int8).numpy()
    exact = x.double().numpy() @ w.T.astype(np.float64)
    ref = reference_int8(x.numpy(), w) if int8 else exact
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5 * np.abs(ref).max())
    for rows in (slice(0, 1), slice(1, 4), slice(0, 8)):  # the direct path (up to 8 rows) for this format too
        np.testing.assert_array_equal(K.quant_matmul(x[rows], raw, QTYPES[qtype], int8).numpy(), got[rows])
    if int8:  # 8-bit activations are visibly further from the exact product
        assert 1e-4 < np.abs(got - exact).max() / np.abs(exact).max() < 3e-2


@pytest.mark.parametrize("qtype", QTYPES)
def test_many_rows_keep_fp32_accuracy(qtype):
    """37 rows x 96 outputs (a multiple of 16: the AMX tiles where the CPU has them, else the
    buffered AVX path) against the exact product in float64: within fp32 rounding of it."""
    raw, w = blocks(qtype, 96, 320, seed=5)
    x = torch.randn(37, 320, generator=torch.Generator().manual_seed(6))
    x[3, 5] = 40.0
    got = K.quant_matmul(x, raw, QTYPES[qtype], False).numpy()
    exact = x.double().numpy() @ w.T.astype(np.float64)
    np.testing.assert_allclose(got, exact, rtol=0, atol=2e-6 * np.abs(exact).max())
    assert isinstance(K.amx_unavailable_reason(), str)


@pytest.mark.parametrize("int8", [False, True])
def test_rows_do_not_depend_on_the_batch(int8):
    """Row i of a batched call is bit-identical to computing row i alone (speculative verification
    relies on it) for up to 8 rows; from 9 rows on (the buffered path, or AMX tiles where the CPU
    has them) rows are bit-identical across batches of 9 or more, and match the direct path to
    fp32 rounding."""
    assert K.direct_max_rows() == 8  # the switch the planner's calibration splits its fit at
    assert K.amx_tile_rows() == (0 if K.amx_unavailable_reason() else 16)  # rows per tile pass, as calibrated
    raw, _ = blocks("Q4_1", 64, 128, seed=3)
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(4))
    mm = lambda rows: K.quant_matmul(rows, raw, QTYPES["Q4_1"], int8)  # noqa: E731
    alone = torch.stack([mm(x[i : i + 1])[0] for i in range(40)])
    for lo, hi in ((2, 4), (2, 5), (1, 6), (0, 8)):  # 2-8 rows read the blocks directly
        assert torch.equal(mm(x[lo:hi]), alone[lo:hi])
    batched = mm(x)  # 40 rows: three 16-row tiles on AMX, the last one partial
    for lo, hi in ((0, 9), (5, 16), (3, 40), (24, 40)):
        assert torch.equal(mm(x[lo:hi]), batched[lo:hi])
    if K.amx_unavailable_reason() or int8:  # one arithmetic: the buffered path sums as the direct one does
        assert torch.equal(batched, alone)
    else:
        torch.testing.assert_close(batched, alone, rtol=0, atol=1e-6 * alone.abs().max().item())


def test_bad_inputs_raise_clear_errors():
    raw, _ = blocks("Q8_0", 4, 64)
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="weight rows hold"):
        K.quant_matmul(x, raw, QTYPES["Q4_1"], False)  # Q8_0 bytes read as Q4_1
    with pytest.raises(RuntimeError, match="multiple of 32"):
        K.quant_matmul(torch.randn(2, 48), raw[:, :51].contiguous(), QTYPES["Q8_0"], False)
    with pytest.raises(RuntimeError, match="unsupported ggml type"):
        K.quant_matmul(x, raw, 10, False)  # Q2_K: dequantized at load, no kernel
    with pytest.raises(RuntimeError, match="out of range"):
        K.quant_dequantize(raw, QTYPES["Q8_0"], 64, torch.tensor([4]))
    assert K.quant_matmul(torch.empty(0, 64), raw, QTYPES["Q8_0"], False).shape == (0, 4)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "heads,kvh,hd",
    [(9, 3, 16), (16, 2, 32), (4, 4, 8)],  # 3 query heads per KV head; 8 (two register tiles); head_dim 8 (scalar path)
)
def test_paged_decode_attention_matches_gathered_attention(heads, kvh, hd, cache_dtype):
    g = torch.Generator().manual_seed(5)
    blocks_, bs = 12, 4
    k_cache, v_cache = torch.randn(blocks_, bs, kvh, hd, generator=g), torch.randn(blocks_, bs, kvh, hd, generator=g)
    k_cache, v_cache = k_cache.to(cache_dtype), v_cache.to(cache_dtype)
    tables = torch.tensor([[5, 2, 9, 0], [7, 0, 0, 0], [1, 3, 11, 4]])
    lens = torch.tensor([10, 1, 16])
    q = torch.randn(3, heads, hd, generator=g)
    got = K.paged_decode_attention(q, k_cache, v_cache, tables, lens, hd**-0.5)
    for b in range(3):
        n = int(lens[b])
        # an fp16 cache means exactly the fp32 values its entries widen to
        k = k_cache[tables[b]].flatten(0, 1)[:n].float().repeat_interleave(heads // kvh, dim=1)  # (T, heads, hd)
        v = v_cache[tables[b]].flatten(0, 1)[:n].float().repeat_interleave(heads // kvh, dim=1)
        p = torch.softmax(torch.einsum("hd,thd->ht", q[b], k) * hd**-0.5, dim=-1)
        torch.testing.assert_close(got[b], torch.einsum("ht,thd->hd", p, v), atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="out of range"):
        K.paged_decode_attention(q, k_cache, v_cache, tables, torch.tensor([10, 1, 17]), 1.0)
    with pytest.raises(RuntimeError, match="bad block id"):
        K.paged_decode_attention(q, k_cache, v_cache, torch.tensor([[5, 2, 99, 0]] * 3), lens, 1.0)
    with pytest.raises(RuntimeError, match="both fp32 or both fp16"):
        K.paged_decode_attention(q, k_cache, v_cache.to(torch.bfloat16), tables, lens, 1.0)


def test_attention_split_over_context_chunks_is_exact_and_batch_invariant():
    """Long contexts run as several 32-token chunks merged afterwards: the result matches plain
    softmax attention, an fp16 cache gives exactly what its widened fp32 copy gives, and a
    sequence's output is bit-identical alone or in a batch."""
    g = torch.Generator().manual_seed(8)
    heads, kvh, hd, bs = 9, 3, 64, 16
    k_cache, v_cache = (torch.randn(40, bs, kvh, hd, generator=g).half() for _ in range(2))
    tables = torch.randperm(40, generator=g).view(2, 20)
    lens = torch.tensor([301, 77])
    q = torch.randn(2, heads, hd, generator=g)
    got = K.paged_decode_attention(q, k_cache, v_cache, tables, lens, hd**-0.5)
    assert torch.equal(got, K.paged_decode_attention(q, k_cache.float(), v_cache.float(), tables, lens, hd**-0.5))
    for b in range(2):
        n = int(lens[b])
        k = k_cache[tables[b]].flatten(0, 1)[:n].float().repeat_interleave(heads // kvh, dim=1)
        v = v_cache[tables[b]].flatten(0, 1)[:n].float().repeat_interleave(heads // kvh, dim=1)
        p = torch.softmax(torch.einsum("hd,thd->ht", q[b], k) * hd**-0.5, dim=-1)
        torch.testing.assert_close(got[b], torch.einsum("ht,thd->hd", p, v), atol=1e-5, rtol=1e-5)
        alone = K.paged_decode_attention(q[b : b + 1], k_cache, v_cache, tables[b : b + 1], lens[b : b + 1], hd**-0.5)
        assert torch.equal(alone[0], got[b])


def test_rms_norm_and_silu_mul_match_pytorch():
    x, w = torch.randn(5, 3, 64), torch.randn(64)
    ref = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(K.rms_norm(x, w, 1e-5), ref, atol=1e-5, rtol=1e-5)
    gu = torch.randn(6, 2 * 43) * 4  # 43: the 8-wide path and a scalar tail
    gu[0, :6] = torch.tensor([-100.0, 100.0, 0.0, -0.0, 88.0, -88.0])  # saturated and signed-zero gates
    torch.testing.assert_close(K.silu_mul(gu), torch.nn.functional.silu(gu[:, :43]) * gu[:, 43:], atol=1e-6, rtol=1e-5)


def test_rope_qkv_matches_rotary_and_writes_the_cache():
    from fastmode.models.llama import Rotary

    g = torch.Generator().manual_seed(6)
    n, heads, kvh, hd = 5, 4, 2, 16
    qkv = torch.randn(n, (heads + 2 * kvh) * hd, generator=g)
    angles = torch.rand(n, hd // 2, generator=g) * 6
    cos, sin = angles.cos(), angles.sin()
    k_cache, v_cache = torch.zeros(3, 4, kvh, hd), torch.zeros(3, 4, kvh, hd)
    slots = torch.tensor([9, 0, 3, 11, 4])
    q = K.rope_qkv(qkv, cos, sin, heads, kvh, hd, slots, k_cache, v_cache)
    qr, kr, vr = qkv.split([heads * hd, kvh * hd, kvh * hd], dim=-1)
    torch.testing.assert_close(q, Rotary.apply(qr.view(n, heads, hd), cos[:, None], sin[:, None]), atol=1e-6, rtol=1e-6)
    flat_k, flat_v = k_cache.view(-1, kvh, hd), v_cache.view(-1, kvh, hd)
    torch.testing.assert_close(
        flat_k[slots], Rotary.apply(kr.view(n, kvh, hd), cos[:, None], sin[:, None]), atol=1e-6, rtol=1e-6
    )
    assert torch.equal(flat_v[slots], vr.view(n, kvh, hd))
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[slots] = False
    assert not flat_k[untouched].any() and not flat_v[untouched].any()
    with pytest.raises(RuntimeError, match="out of range"):
        K.rope_qkv(qkv, cos, sin, heads, kvh, hd, torch.tensor([9, 0, 3, 12, 4]), k_cache, v_cache)
    # An fp16 cache gets the same rotated values, rounded to nearest as torch rounds them.
    k16, v16 = torch.zeros(3, 4, kvh, hd, dtype=torch.float16), torch.zeros(3, 4, kvh, hd, dtype=torch.float16)
    q16 = K.rope_qkv(qkv, cos, sin, heads, kvh, hd, slots, k16, v16)
    assert torch.equal(q16, q)
    assert torch.equal(k16, k_cache.half()) and torch.equal(v16, v_cache.half())
    with pytest.raises(RuntimeError, match="both fp32 or both fp16"):
        K.rope_qkv(qkv, cos, sin, heads, kvh, hd, slots, k16, v_cache)
