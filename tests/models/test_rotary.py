"""RoPE tables: sized to what is used, grown on demand, and the same values whatever their size."""

from __future__ import annotations

import pytest
import torch

import fastmode.models.llama as llama
from fastmode.config import ModelConfig
from fastmode.models.llama import Rotary

GEMMA_LIKE = ModelConfig(
    architecture="gemma3",
    vocab_size=100,
    hidden_size=64,
    intermediate_size=128,
    num_layers=6,
    num_heads=4,
    num_kv_heads=1,
    head_dim=256,
    max_position_embeddings=131072,
    rope_theta=1_000_000.0,
    sliding_window=512,
    sliding_layers=(0, 1, 2, 3, 4),
    rope_local_theta=10_000.0,
)


def test_tables_start_small_and_grow_exactly(monkeypatch):
    rope = Rotary(GEMMA_LIKE, GEMMA_LIKE.max_position_embeddings)
    assert rope.num_positions == llama.INITIAL_ROPE_POSITIONS < GEMMA_LIKE.max_position_embeddings
    early = rope.tables(torch.tensor([0, 7, 8191]))
    positions = torch.tensor([3, 20_000, 8191])
    cos, sin = rope.tables(positions)  # past the tables: they grow
    local_cos, local_sin = rope.local_tables(positions)
    assert 20_001 <= rope.num_positions < GEMMA_LIKE.max_position_embeddings
    assert rope.cos_local.shape[0] == rope.num_positions
    assert torch.equal(rope.tables(torch.tensor([0, 7, 8191]))[0], early[0])  # rows kept as they were

    # A table built at its full size in one go holds the very same values.
    monkeypatch.setattr(llama, "INITIAL_ROPE_POSITIONS", 40_000)
    whole = Rotary(GEMMA_LIKE, GEMMA_LIKE.max_position_embeddings)
    assert whole.num_positions == 40_000
    assert torch.equal(whole.tables(positions)[0], cos) and torch.equal(whole.tables(positions)[1], sin)
    assert torch.equal(whole.local_tables(positions)[0], local_cos)
    assert torch.equal(whole.local_tables(positions)[1], local_sin)

    # And they are RoPE's values (float64 reference).
    inv = 1.0 / (1_000_000.0 ** (torch.arange(0, 256, 2, dtype=torch.float64) / 256))
    ref = torch.outer(positions.double(), inv.float().double())
    torch.testing.assert_close(cos[:, 0].double(), ref.cos(), atol=5e-3, rtol=0)
    torch.testing.assert_close(sin[:, 0].double(), ref.sin(), atol=5e-3, rtol=0)


def test_positions_past_the_model_stay_an_error():
    rope = Rotary(GEMMA_LIKE, 10_000)
    rope.tables(torch.tensor([9_999]))
    assert rope.num_positions == 10_000
    with pytest.raises(IndexError):
        rope.tables(torch.tensor([10_000]))
