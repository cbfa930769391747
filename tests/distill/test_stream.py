"""The window stream is a function of its seed and resumes from its state."""

from __future__ import annotations

import torch

from fastmode.distill.train import TrainConfig
from tests.distill.conftest import make_tiny_stream

CFG = TrainConfig(num_layers=2, seq_len=24, batch_size=3, seed=7)


def test_same_seed_same_batches_other_seed_other_batches(tiny_teacher):
    a, b = make_tiny_stream(tiny_teacher, CFG), make_tiny_stream(tiny_teacher, CFG)
    c = make_tiny_stream(tiny_teacher, CFG, seed=8)
    batches = [a.next_batch() for _ in range(5)]
    assert all(torch.equal(x, b.next_batch()) for x in batches)
    assert not all(torch.equal(x, c.next_batch()) for x in batches)
    assert batches[0].shape == (3, 25) and batches[0].dtype == torch.long


def test_state_resumes_the_exact_sequence(tiny_teacher):
    a = make_tiny_stream(tiny_teacher, CFG)
    for _ in range(7):  # far enough to wrap the tiny sources into later epochs
        a.next_batch()
    state = a.state()
    b = make_tiny_stream(tiny_teacher, CFG)
    b.load_state(state)
    assert all(torch.equal(a.next_batch(), b.next_batch()) for _ in range(4))
    assert any(s["epoch"] > 0 for s in a.state()["sources"].values())


def test_documents_are_separated_and_mixed_by_weight(tiny_teacher):
    stream = make_tiny_stream(tiny_teacher, CFG)
    sep = tiny_teacher.tokenizer.backend.token_to_id("<|endoftext|>")
    windows = torch.cat([stream.next_batch() for _ in range(40)])
    assert (windows == sep).any()
    assert stream.fractions == {"code": 0.5, "prose": 0.5}
