"""The 32-weight types' fp32-activation path in the shapes that stress its bookkeeping: one block,
an odd number of blocks, output counts no tile width divides, every row count of the direct path
and past it. Against the float64 product of the blocks' exact values, within a rounding bound
that covers the dequantize-first arithmetic (sum (d q + m) x, d q + m rounded per weight), and row
for row against the same row computed alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastmode.kernels import ISA_PATHS
from tests.kernels.test_isa_paths import path_ops

QTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
EPS32 = float(np.finfo(np.float32).eps)


def weight(qtype: str, n: int, k: int, seed: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray, np.ndarray]:
    """(block bytes, integer quants (n, nb, 32) in weight order, d (n, nb), m (n, nb)), all float64
    but the bytes, read from the bytes the way gguf defines them."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.05, (n, k)).astype(np.float32) + rng.normal(0, 0.02, (n, 1)).astype(np.float32)
    raw = np.ascontiguousarray(quantize(w, GGMLQuantizationType[qtype]))
    bb = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[qtype]
    b = raw.reshape(n, -1, bb)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    if qtype == "Q8_0":
        return torch.from_numpy(raw), b[..., 2:].view(np.int8).astype(np.float64), d, np.zeros_like(d)
    qs = b[..., 4:] if qtype == "Q4_1" else b[..., 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float64)
    m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64) if qtype == "Q4_1" else -8.0 * d
    return torch.from_numpy(raw), q, d, m


def reference(x: np.ndarray, q: np.ndarray, d: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the exact product in float64, a bound on fp32 evaluation of either documented form): every
    partial sum is at most the sum of the magnitudes of the terms, and no chain is longer than
    nb + 8 roundings (4 products a lane per block, nb blocks, 3 for the lanes' sum, 1 for the
    minimum terms)."""
    rows, k = x.shape
    xb = x.astype(np.float64).reshape(rows, k // 32, 32)
    w = d[..., None] * q + m[..., None]  # (n, nb, 32), exact in float64
    exact = np.einsum("rbj,nbj->rn", xb, w)
    mags = np.einsum("rbj,nbj->rn", np.abs(xb), np.abs(d[..., None] * q) + np.abs(m[..., None]))
    nb = k // 32
    return exact, 2 * (nb + 8) * EPS32 * mags


def activations(rows: int, k: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))
    x[rows // 2, 3] = 40.0  # an outlier channel, as real activations have
    if k >= 64:
        x[0, 32:64] = 0.0  # an all-zero block: its sum is 0
    return x


@pytest.mark.parametrize("isa", list(ISA_PATHS))
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("n,k", [(1, 32), (5, 224), (70, 96), (29, 576)])
def test_fp32_activations_match_the_float64_product(isa, qtype, n, k):
    kern = path_ops(isa)
    raw, q, d, m = weight(qtype, n, k, seed=n + k)
    for rows in (1, 2, 3, 5, 8, 9, 13):
        x = activations(rows, k, seed=rows + n)
        got = kern.quant_matmul(x, raw, QTYPES[qtype], False).numpy().astype(np.float64)
        exact, bound = reference(x.numpy(), q, d, m)
        err = np.abs(got - exact)
        assert (err <= bound).all(), (rows, err.max(), bound.min())
        # fp32's rounding of the sums, far inside the bound: a few eps of the terms' sizes
        assert (err <= 1e-6 * bound / (2 * (k // 32 + 8) * EPS32)).all(), (rows, err.max())


@pytest.mark.parametrize("isa", list(ISA_PATHS))
@pytest.mark.parametrize("qtype", QTYPES)
def test_each_row_is_bit_identical_to_the_row_alone(isa, qtype):
    """Every batch from 1 to 8 rows (the direct path) and 9, 13 and 37 (the buffered path, where
    the build has no AMX) gives each row exactly what that row gives alone, for outputs not a
    multiple of any tile width and an odd number of blocks."""
    kern = path_ops(isa)
    raw, *_ = weight(qtype, 53, 224, seed=7)
    x = activations(37, 224, seed=8)
    mm = lambda rows: kern.quant_matmul(rows, raw, QTYPES[qtype], False)  # noqa: E731
    alone = torch.stack([mm(x[i : i + 1])[0] for i in range(37)])
    for lo, hi in ((0, 2), (1, 4), (3, 7), (2, 7), (0, 8), (5, 11), (0, 9), (10, 23), (0, 37)):
        if hi - lo > 8 and not kern.amx_unavailable_reason():
            continue  # AMX tiles from 9 rows: within fp32 rounding of the direct path (test_isa_paths)
        assert torch.equal(mm(x[lo:hi]), alone[lo:hi]), (lo, hi)
