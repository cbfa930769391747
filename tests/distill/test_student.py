"""Layer choice, and a student of all layers being the teacher exactly."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fastmode.distill.forward import causal_logits
from fastmode.distill.student import build_student, choose_layers, own_parameters, own_state
from fastmode.engine.scoring import full_logits

TOKENS = [5, 17, 99, 3, 250, 42, 7, 7, 300, 12, 64, 128]


def test_choose_layers_spreads_evenly_and_keeps_first_and_last():
    assert choose_layers(30, 10) == [0, 3, 6, 10, 13, 16, 19, 23, 26, 29]
    assert choose_layers(30, 30) == list(range(30))
    assert choose_layers(30, 2) == [0, 29]
    assert choose_layers(30, 1) == [0]
    for k in range(1, 31):
        idx = choose_layers(30, k)
        assert len(set(idx)) == k and idx == sorted(idx)
    with pytest.raises(ValueError):
        choose_layers(30, 31)


def test_student_of_all_layers_reproduces_teacher_logits_exactly(tiny_teacher):
    n = tiny_teacher.config.num_layers
    student = build_student(tiny_teacher.model, choose_layers(n, n))
    as_loaded = replace(tiny_teacher, model=student, config=student.cfg)
    assert torch.equal(full_logits(as_loaded, TOKENS), full_logits(tiny_teacher, TOKENS))


def test_training_forward_matches_engine_forward(tiny_teacher):
    ids = torch.tensor([TOKENS])
    ours = causal_logits(tiny_teacher.model, ids)[0]
    engine = full_logits(tiny_teacher, TOKENS)
    torch.testing.assert_close(ours, engine, rtol=1e-5, atol=1e-5)


def test_student_shares_embeddings_and_owns_only_layers_and_norm(tiny_teacher):
    student = build_student(tiny_teacher.model, [0, 2])
    t = tiny_teacher.model
    assert student.embed_tokens is t.embed_tokens and student.lm_head is t.lm_head
    assert student.layers[1] is not t.layers[2]
    assert torch.equal(student.layers[1].mlp.down_proj.weight, t.layers[2].mlp.down_proj.weight)
    assert student.cfg.num_layers == 2 and student.cfg.name.endswith("-spark")
    owned = {id(p) for p in own_parameters(student)}
    assert id(t.embed_tokens.weight) not in owned and id(t.lm_head.weight) not in owned
    assert all(p.requires_grad for p in own_parameters(student))
    assert not any(p.requires_grad for p in t.parameters())  # the teacher stays frozen
    assert set(own_state(student)) == {k for k in student.state_dict() if k.startswith(("layers.", "norm."))}


def test_training_forward_refuses_windows_past_the_models_positions(tiny_teacher):
    from fastmode.distill.forward import causal_hidden

    limit = tiny_teacher.model.rotary.max_positions
    with pytest.raises(ValueError, match=f"exceeds the model's {limit} positions"):
        causal_hidden(tiny_teacher.model, torch.zeros(1, limit + 1, dtype=torch.long))
