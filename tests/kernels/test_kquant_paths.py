"""Q5_0, Q5_1 and the K-quants (Q4_K, Q5_K, Q6_K) on every kernel ISA path this machine has,
against the `gguf` package's dequantization: the row lookup bit for bit, the fp32 matmul within
fp32 summation of the float64 product of gguf's values, at 1, 8 and 64 rows.

Q5_0/Q5_1 blocks come from gguf's quantizer; gguf cannot quantize the K-quants, so theirs are
random bytes (tests/kernels/kquants.py): every scale, minimum and high-bit pattern occurs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastmode.kernels import ISA_PATHS
from fastmode.models.quant_linear import BLOCKS, GGML_TYPES
from tests.kernels.kquants import quantize_kquant, random_blocks
from tests.kernels.test_isa_paths import activations, fp32_reference, path_ops

pytestmark = pytest.mark.timeout(3600)  # the first use of a path builds it
NEW_TYPES = ("Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
K = 768  # three K-quant blocks, 24 groups of 32
N = 70  # no tile or task width divides it


def weight(qtype: str, n: int, k: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """(block bytes (n, row bytes), gguf's fp32 values of them (n, k))."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    q = GGMLQuantizationType[qtype]
    if qtype.endswith("_K"):
        raw = random_blocks(qtype, n, k, seed)
    else:
        raw = quantize(np.random.default_rng(seed).normal(0, 0.05, (n, k)).astype(np.float32), q)
    w = dequantize(raw, q).astype(np.float32).reshape(n, k)
    assert np.isfinite(w).all()
    return torch.from_numpy(np.ascontiguousarray(raw)), w


def test_block_sizes_are_ggmls():
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    for name, qtype in GGML_TYPES.items():
        assert GGMLQuantizationType[name] == qtype
        assert BLOCKS[qtype] == GGML_QUANT_SIZES[GGMLQuantizationType[name]]


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
def test_the_test_quantizer_makes_blocks_gguf_reads_back_close(qtype):
    """The model tests' K-quant encoder: valid blocks whose values gguf reads back near the weights."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    w = np.random.default_rng(1).normal(0, 0.1, (8, 512)).astype(np.float32)
    back = dequantize(quantize_kquant(w, qtype), GGMLQuantizationType[qtype]).reshape(w.shape)
    err = np.abs(back - w).max() / np.abs(w).max()
    assert err < {"Q4_K": 0.1, "Q5_K": 0.05, "Q6_K": 0.03}[qtype], err


@pytest.mark.parametrize("isa", list(ISA_PATHS))
@pytest.mark.parametrize("qtype", NEW_TYPES)
def test_row_lookup_is_exactly_ggufs(isa, qtype):
    k = path_ops(isa)
    raw, w = weight(qtype, 40, K, seed=3)
    got = k.quant_dequantize(raw, GGML_TYPES[qtype], K, torch.empty(0, dtype=torch.long))
    np.testing.assert_array_equal(got.numpy(), w)
    rows = torch.tensor([3, 0, 39, 3])
    np.testing.assert_array_equal(k.quant_dequantize(raw, GGML_TYPES[qtype], K, rows).numpy(), w[[3, 0, 39, 3]])


@pytest.mark.parametrize("isa", list(ISA_PATHS))
@pytest.mark.parametrize("qtype", NEW_TYPES)
@pytest.mark.parametrize("rows", [1, 8, 64])
def test_fp32_activations_match_ggufs_dequantized_product(isa, qtype, rows):
    """Within the bound of fp32 summation of the float64 product of gguf's values, and as close to
    dequantize-then-fp32-matmul as two fp32 summation orders are."""
    k = path_ops(isa)
    raw, w = weight(qtype, N, K, seed=rows)
    x = activations(rows, K, seed=rows + 1)
    got = k.quant_matmul(x, raw, GGML_TYPES[qtype], False)
    exact, bound = fp32_reference(x.numpy(), w)
    err = np.abs(got.numpy().astype(np.float64) - exact)
    assert (err <= bound).all(), err.max()
    # fp32 summation over 768 values (one serial chain on the portable path): far inside the bound
    assert err.max() <= 3e-6 * np.abs(exact).max()
    torch.testing.assert_close(got, x @ torch.from_numpy(w).T, rtol=0, atol=5e-6 * float(np.abs(exact).max()))


@pytest.mark.parametrize("isa", list(ISA_PATHS))
@pytest.mark.parametrize("qtype", NEW_TYPES)
@pytest.mark.parametrize("rows", [1, 8, 64])
def test_int8_activations_match_the_quantized_activation_product(isa, qtype, rows):
    """int8 activations (per 32 values, amax/127, round half to even) times gguf's weight values:
    x_hat @ w.T in float64, within fp32 rounding; visibly further from the exact product."""
    k = path_ops(isa)
    raw, w = weight(qtype, N, K, seed=10 + rows)
    x = activations(rows, K, seed=rows + 11)
    got = k.quant_matmul(x, raw, GGML_TYPES[qtype], True).numpy().astype(np.float64)
    xb = x.numpy().reshape(rows, -1, 32)
    amax = np.abs(xb).max(-1, keepdims=True)
    d = amax / np.float32(127)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    xhat = (d.astype(np.float64) * np.rint(xb * inv)).reshape(rows, -1)
    ref = xhat @ w.T.astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5 * np.abs(ref).max())
    exact, _ = fp32_reference(x.numpy(), w)
    assert 1e-4 < np.abs(got - exact).max() / np.abs(exact).max() < 3e-2


@pytest.mark.parametrize("isa", list(ISA_PATHS))
@pytest.mark.parametrize("int8", [False, True])
def test_a_row_does_not_depend_on_its_batch(isa, int8):
    """Row i of 2-8 rows (read from the blocks directly) and of 64 (a dequantized buffer) is
    bit-identical to row i alone: speculative verification relies on it."""
    k = path_ops(isa)
    for qtype in ("Q4_K", "Q5_K", "Q6_K", "Q5_0"):
        raw, _ = weight(qtype, 40, 512, seed=4)
        x = activations(64, 512, seed=5)
        mm = lambda rows, qtype=qtype, raw=raw: k.quant_matmul(rows, raw, GGML_TYPES[qtype], int8)  # noqa: E731
        alone = torch.stack([mm(x[i : i + 1])[0] for i in range(64)])
        assert torch.equal(mm(x[2:8]), alone[2:8])
        assert torch.equal(mm(x), alone)


@pytest.mark.parametrize("isa", ["portable", "avx2"])
def test_bad_shapes_and_types_are_clear_errors(isa):
    k = path_ops(isa)
    raw, _ = weight("Q4_K", 4, 512, seed=6)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        k.quant_matmul(torch.randn(2, 288), raw[:, :162].contiguous(), GGML_TYPES["Q4_K"], False)
    with pytest.raises(RuntimeError, match="weight rows hold 288 bytes; 512 features of this type need 420"):
        k.quant_matmul(torch.randn(2, 512), raw, GGML_TYPES["Q6_K"], False)  # Q4_K bytes read as Q6_K
    with pytest.raises(RuntimeError, match=r"unsupported ggml type 10 \(supported: .*Q4_K=12, Q5_K=13, Q6_K=14\)"):
        k.quant_matmul(torch.randn(2, 512), raw, 10, False)  # Q2_K: dequantized at load, no kernel
