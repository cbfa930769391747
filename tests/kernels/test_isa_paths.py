"""Every kernel ISA path this machine has, against exact references; the run-time choice of path.

Each path of `fastmode.kernels.ISA_PATHS` is its own build. A path the CPU lacks is skipped with
the missing features as the reason; on a machine with more, lower paths are built and checked
too (the first use of a path builds it: about a minute)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastmode.kernels import (
    ISA_PATHS,
    compile_flags,
    isa_cap,
    isa_unavailable_reason,
    ops,
    select_isa,
    unavailable_reason,
)

# The first use of a path builds it: a minute on 2 idle cores, many more on a loaded machine.
pytestmark = pytest.mark.timeout(3600)
QTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
EPS32 = float(np.finfo(np.float32).eps)

ZEN3 = {"avx", "avx2", "fma", "f16c", "bmi2"}
ZEN4 = ZEN3 | {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512vbmi"}
ALDER_LAKE = ZEN3 | {"avx_vnni"}
SAPPHIRE_RAPIDS = ZEN4 | {"avx_vnni", "amx_tile", "amx_bf16", "amx_int8"}


@pytest.mark.parametrize(
    "cpu,cap,expect",
    [
        (set(), None, "portable"),
        (ZEN3, None, "avx2"),
        (ALDER_LAKE, None, "avx2_vnni"),
        (ZEN4, None, "avx512_vnni"),
        (ZEN4 - {"avx512_vnni"}, None, "avx512"),
        (SAPPHIRE_RAPIDS, None, "amx"),
        (SAPPHIRE_RAPIDS, "avx512_vnni", "avx512_vnni"),
        (SAPPHIRE_RAPIDS, "avx512", "avx512"),
        (SAPPHIRE_RAPIDS, "avx2_vnni", "avx2_vnni"),
        (ZEN4, "avx2_vnni", "avx2"),  # Zen 4 has no VEX-encoded AVX-VNNI: the cap falls to the path below
        (ZEN4, "portable", "portable"),
        (ZEN3, "amx", "avx2"),  # a cap above what the CPU has changes nothing
    ],
)
def test_the_path_is_the_best_the_cpu_has_up_to_the_cap(cpu, cap, expect):
    assert select_isa(cpu, cap) == expect


def test_paths_build_on_their_base_and_say_what_is_missing():
    flags = compile_flags("avx512_vnni")
    assert {"-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"} <= set(flags)
    assert "-mavxvnni" not in flags and not any(f.startswith("-mamx") for f in flags)
    assert not [f for f in compile_flags("portable") if f.startswith("-m")]
    assert isa_unavailable_reason("avx512_vnni", ZEN3) == (
        "the CPU lacks avx512_vnni, avx512bw, avx512dq, avx512f, avx512vl"
    )
    assert isa_unavailable_reason("avx2", ZEN3) is None
    with pytest.raises(ValueError, match="one of: portable, avx2, avx2_vnni, avx512, avx512_vnni, amx"):
        isa_unavailable_reason("sse2")


def test_the_cap_comes_from_the_environment_and_is_checked(monkeypatch):
    monkeypatch.setenv("FASTMODE_KERNELS_ISA", "AVX2")
    assert isa_cap() == "avx2" and select_isa(SAPPHIRE_RAPIDS) == "avx2"
    monkeypatch.setenv("FASTMODE_KERNELS_ISA", "avx3")
    with pytest.raises(ValueError, match="FASTMODE_KERNELS_ISA='avx3' is not a kernel ISA path"):
        select_isa(ZEN3)
    monkeypatch.delenv("FASTMODE_KERNELS_ISA")
    assert isa_cap() is None and select_isa(SAPPHIRE_RAPIDS) == "amx"


def test_the_default_build_is_the_selected_path():
    k = ops()
    if k is None:
        pytest.skip(f"kernels unavailable: {unavailable_reason()}")
    assert k.isa() == select_isa()
    assert ops(select_isa()) is k


# ---- exact references ---------------------------------------------------------------------


def blocks(qtype: str, n: int, k: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """(ggml block bytes (n, row_bytes), their exact fp32 values (n, k)) for a random weight."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    w = np.random.default_rng(seed).normal(0, 0.05, (n, k)).astype(np.float32)
    q = quantize(w, GGMLQuantizationType[qtype])
    return torch.from_numpy(np.ascontiguousarray(q)), dequantize(q, GGMLQuantizationType[qtype]).astype(np.float32)


def fp32_reference(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x @ w.T in float64, the bound on any fp32 summation of it: K eps sum_k |x_k w_k|)."""
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    bound = x.shape[1] * EPS32 * (np.abs(x).astype(np.float64) @ np.abs(w.T).astype(np.float64))
    return exact, bound


def split_blocks(raw: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A weight's blocks as (integer quants (n, nb, 32) in weight order, scale d, minimum m),
    read from the bytes: Q4 nibbles 0..15 (byte j holds quants j and j + 16), Q8_0 signed bytes."""
    n = raw.shape[0]
    bb = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[qtype]
    b = raw.reshape(n, -1, bb)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    if qtype == "Q8_0":
        return b[..., 2:].view(np.int8).astype(np.int64), d, np.zeros_like(d)
    qs = b[..., 4:] if qtype == "Q4_1" else b[..., 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int64)
    m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64) if qtype == "Q4_1" else -8.0 * d
    return q, d, m


def int8_reference(x: np.ndarray, raw: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray]:
    """The int8-activation product, integer-exact: each 32-value block of x quantized as the
    kernel does (fp32 d = amax/127, q = round-half-even(x * 127/amax)), each block's dot product
    with the weight's integer quants in int64, scaled and summed in float64. Returns it and a
    bound on the fp32 rounding of that sum (blocks x eps x the sum of the terms' sizes)."""
    m_rows, k = x.shape
    xb = x.reshape(m_rows, k // 32, 32).astype(np.float32)
    amax = np.abs(xb).max(-1)
    dx = amax / np.float32(127)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, np.float32(1)), np.float32(0))
    xq = np.rint(xb * inv[..., None]).astype(np.int64)  # (M, nb, 32)
    q, d, m = split_blocks(raw, qtype)  # (N, nb, 32), (N, nb), (N, nb)
    dots = np.einsum("mbj,nbj->mnb", xq, q)  # exact integers
    sums = xq.sum(-1)  # (M, nb)
    dx64 = dx.astype(np.float64)
    terms = d[None] * dx64[:, None] * dots + m[None] * (dx64 * sums)[:, None]  # (M, N, nb)
    nb = k // 32
    bound = (
        4
        * (nb + 8)
        * EPS32
        * (np.abs(d[None] * dx64[:, None] * dots) + np.abs(m[None] * (dx64 * sums)[:, None])).sum(-1)
    )
    return terms.sum(-1), bound


def activations(rows: int, k: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))
    x[rows // 2, 5] = 40.0  # an outlier channel, as real activations have
    x[0, 32:64] = 0.0  # an all-zero block: its int8 scale is 0
    return x


def path_ops(name: str):
    why = isa_unavailable_reason(name)
    if why is not None:
        pytest.skip(f"{name}: {why}")
    k = ops(name)
    if k is None:
        pytest.skip(f"{name}: {unavailable_reason(name)}")
    return k


@pytest.mark.parametrize("isa", list(ISA_PATHS))
def test_each_path_reports_what_it_was_built_for(isa):
    k = path_ops(isa)
    assert k.isa() == isa
    vnni = isa in ("avx2_vnni", "avx512_vnni", "amx")
    assert k.int8_dot() == ("scalar" if isa == "portable" else "vpdpbusd" if vnni else "vpmaddubsw+vpmaddwd")
    assert k.fp32_lanes() == {"portable": 1, "avx2": 8, "avx2_vnni": 8}.get(isa, 16)


@pytest.mark.parametrize("isa", list(ISA_PATHS))
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("rows", [1, 8, 64])
def test_fp32_activations_match_the_float64_product(isa, qtype, rows):
    """fp32 activations times the blocks' exact values: within the bound of fp32 summation of the
    float64 product; rows up to 8 (read from the blocks directly) and the 64-row path (buffered,
    or AMX tiles) alike. 70 outputs and 10 blocks: no tile or task width divides them."""
    k = path_ops(isa)
    raw, w = blocks(qtype, 70, 320, seed=rows)
    x = activations(rows, 320, seed=rows + 1)
    got = k.quant_matmul(x, raw, QTYPES[qtype], False).numpy().astype(np.float64)
    exact, bound = fp32_reference(x.numpy(), w)
    assert (np.abs(got - exact) <= bound).all(), np.abs(got - exact).max()
    # the summation is fp32's: much closer than the bound, never exactly float64 everywhere
    assert np.abs(got - exact).max() <= 1e-6 * np.abs(exact).max()


@pytest.mark.parametrize("isa", list(ISA_PATHS))
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("rows", [1, 8, 64])
def test_int8_activations_match_the_integer_exact_product(isa, qtype, rows):
    k = path_ops(isa)
    raw, w = blocks(qtype, 70, 320, seed=10 + rows)
    x = activations(rows, 320, seed=rows + 11)
    got = k.quant_matmul(x, raw, QTYPES[qtype], True).numpy().astype(np.float64)
    ref, bound = int8_reference(x.numpy(), raw.numpy(), qtype)
    assert (np.abs(got - ref) <= bound).all(), np.abs(got - ref).max()
    exact, _ = fp32_reference(x.numpy(), w)  # 8-bit activations are visibly further from the exact product
    assert 1e-4 < np.abs(got - exact).max() / np.abs(exact).max() < 3e-2


@pytest.mark.parametrize("isa", list(ISA_PATHS))
@pytest.mark.parametrize("int8", [False, True])
def test_a_row_does_not_depend_on_its_batch(isa, int8):
    """Row i of 1, 8 or 64 rows is bit-identical to row i alone (speculative verification relies
    on it); with AMX from 9 rows, within fp32 rounding of it (docs/kernels.md)."""
    k = path_ops(isa)
    raw, _ = blocks("Q4_1", 64, 128, seed=3)
    x = activations(64, 128, seed=4)
    alone = torch.stack([k.quant_matmul(x[i : i + 1], raw, 3, int8)[0] for i in range(64)])
    assert torch.equal(k.quant_matmul(x[:8], raw, 3, int8), alone[:8])
    batched = k.quant_matmul(x, raw, 3, int8)
    if int8 or k.amx_unavailable_reason():
        assert torch.equal(batched, alone)
    else:
        torch.testing.assert_close(batched, alone, rtol=0, atol=1e-6 * alone.abs().max().item())


@pytest.mark.parametrize("vnni,base", [("avx2_vnni", "avx2"), ("avx512_vnni", "avx512")])
@pytest.mark.parametrize("qtype", QTYPES)
def test_vnni_gives_the_same_int8_results_as_its_base(vnni, base, qtype):
    """vpdpbusd and vpmaddubsw + vpmaddwd form the same exact integers, so the int8 path's outputs
    are bit-identical with and without VNNI."""
    kv, kb = path_ops(vnni), path_ops(base)
    raw, _ = blocks(qtype, 70, 320, seed=20)
    for rows in (1, 8, 64):
        x = activations(rows, 320, seed=21 + rows)
        assert torch.equal(kv.quant_matmul(x, raw, QTYPES[qtype], True), kb.quant_matmul(x, raw, QTYPES[qtype], True))
