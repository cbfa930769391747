"""The int8-activation kernels on repacked Q4_0/Q4_1/Q8_0 weights (kernels/csrc/packed_int8.cpp):
the repack is lossless, every path and batch gives the documented fp32 chain bit for bit, and that
chain is the integer-exact product of the quantized activations within fp32 rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastmode.kernels import ISA_PATHS
from fastmode.models.quant_linear import PACKED, QuantEmbedding, QuantLinear, QuantTensor
from tests.kernels.test_isa_paths import activations, blocks, int8_reference, path_ops

QTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}


@pytest.mark.parametrize("qtype", QTYPES)
def test_the_repack_moves_bytes_and_loses_nothing(qtype):
    k = path_ops("portable")
    raw, _ = blocks(qtype, 40, 96, seed=1)
    packed = k.pack_weight(raw, QTYPES[qtype], 96)
    assert packed.numel() == raw.numel()  # the same bytes per weight as the file
    assert torch.equal(k.unpack_weight(packed, QTYPES[qtype], 96), raw)
    assert not torch.equal(packed.reshape(-1), raw.reshape(-1))  # but in another order


@pytest.mark.parametrize("qtype", QTYPES)
def test_rows_looked_up_in_the_packed_table_are_the_files_values(qtype):
    k = path_ops("portable")
    raw, w = blocks(qtype, 48, 64, seed=2)
    packed = k.pack_weight(raw, QTYPES[qtype], 64)
    rows = torch.tensor([0, 7, 8, 47, 8])
    got = k.packed_dequantize(packed, QTYPES[qtype], 64, rows)
    assert torch.equal(got, torch.from_numpy(w)[rows])


@pytest.mark.parametrize("isa", list(ISA_PATHS))
@pytest.mark.parametrize("qtype", QTYPES)
def test_every_path_and_batch_gives_the_reference_chain_bit_for_bit(isa, qtype):
    """The vector kernels (eight rows a lane, 1-4 activation rows per pass) against the portable
    loop that computes each output alone: equal for every batch, so a row never depends on what
    shares its step, and every ISA path gives the same numbers."""
    k = path_ops(isa)
    raw, _ = blocks(qtype, 72, 320, seed=3)
    packed = k.pack_weight(raw, QTYPES[qtype], 320)
    x = activations(67, 320, seed=4)
    reference = k.packed_matmul_reference(x, packed, QTYPES[qtype])
    for rows in (1, 2, 3, 4, 5, 8, 9, 16, 67):
        assert torch.equal(k.packed_matmul(x[:rows], packed, QTYPES[qtype]), reference[:rows]), rows
    assert torch.equal(k.packed_matmul(x[30:31], packed, QTYPES[qtype])[0], reference[30])
    # the same chain through quant_matmul's packed type id, as the fused decode step calls it
    assert torch.equal(k.quant_matmul(x[:2], packed, QTYPES[qtype] + PACKED, True), reference[:2])


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("rows", [1, 16])
def test_the_chain_is_the_integer_exact_product_within_fp32_rounding(qtype, rows):
    k = path_ops("portable")
    raw, w = blocks(qtype, 64, 320, seed=5 + rows)
    x = activations(rows, 320, seed=6 + rows)
    got = k.packed_matmul(x, k.pack_weight(raw, QTYPES[qtype], 320), QTYPES[qtype]).numpy().astype(np.float64)
    ref, bound = int8_reference(x.numpy(), raw.numpy(), qtype)
    assert (np.abs(got - ref) <= bound).all(), np.abs(got - ref).max()
    # and as close to the file-layout int8 kernel as fp32 summation allows
    old = k.quant_matmul(x, raw, QTYPES[qtype], True).numpy().astype(np.float64)
    assert (np.abs(got - old) <= 2 * bound).all()


def test_bad_weights_are_clear_errors():
    k = path_ops("portable")
    raw, _ = blocks("Q4_1", 12, 64, seed=7)
    with pytest.raises(RuntimeError, match="not a multiple of 8"):
        k.pack_weight(raw, 3, 64)
    raw, _ = blocks("Q4_1", 16, 64, seed=7)
    with pytest.raises(RuntimeError, match="only Q4_0"):
        k.pack_weight(raw, 12, 64)
    packed = k.pack_weight(raw, 3, 64)
    with pytest.raises(RuntimeError, match="not a packed weight of 96"):
        k.packed_matmul(torch.randn(1, 96), packed, 3)
    with pytest.raises(RuntimeError, match="out of range"):
        k.packed_dequantize(packed, 3, 64, torch.tensor([16]))


def test_a_linear_packs_for_int8_and_restores_the_file_layout():
    raw, _ = blocks("Q4_1", 24, 64, seed=8)
    lin = QuantLinear(QuantTensor(raw, 3, (24, 64)))
    x = torch.randn(3, 64)
    fp32 = lin(x)
    lin.int8_activations = True
    assert lin.packed and lin.kernel_qtype == 3 + PACKED
    assert torch.equal(lin.weight().data, raw)
    int8 = lin(x)
    assert not torch.equal(int8, fp32)
    torch.testing.assert_close(int8, fp32, rtol=0, atol=0.05 * fp32.abs().max().item())
    lin.int8_activations = False
    assert not lin.packed and torch.equal(lin.qweight, raw) and torch.equal(lin(x), fp32)


def test_odd_row_counts_and_k_quants_stay_in_the_file_layout():
    raw, _ = blocks("Q4_1", 12, 64, seed=9)
    lin = QuantLinear(QuantTensor(raw, 3, (12, 64)), int8_activations=True)
    assert not lin.packed and lin.kernel_qtype == 3


def test_a_tied_head_and_embedding_share_one_packed_table():
    raw, w = blocks("Q8_0", 32, 64, seed=10)
    emb = QuantEmbedding(QuantTensor(raw, 8, (32, 64)))
    head = emb.as_linear()
    head.int8_activations = True
    assert emb.packed and emb.qweight.data_ptr() == head.qweight.data_ptr()
    ids = torch.tensor([[3, 31], [0, 8]])
    assert torch.equal(emb(ids), torch.from_numpy(w)[ids])
    head.int8_activations = False
    assert not emb.packed and torch.equal(emb.qweight, raw)
