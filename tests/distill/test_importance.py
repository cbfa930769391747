"""Layer choice by measured importance: greedy removal against a brute-force reference."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fastmode.distill.forward import causal_logits
from fastmode.distill.importance import select_by_importance
from fastmode.distill.student import build_student

IDS = torch.tensor([[5, 17, 99, 3, 250, 42, 7, 7, 300, 12, 64, 128], [9, 8, 7, 6, 5, 4, 3, 2, 1, 200, 201, 202]])


def _kl_without(teacher, keep):
    """KL(teacher || student of `keep`) per token, computed from whole models (the reference)."""
    log_p = F.log_softmax(causal_logits(teacher, IDS), -1)
    log_q = F.log_softmax(causal_logits(build_student(teacher, keep), IDS), -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean().item()


def test_greedy_removal_matches_brute_force(tiny_teacher):
    teacher = tiny_teacher.model
    sel = select_by_importance(teacher, [IDS], 1)
    n = teacher.cfg.num_layers
    # Round one: the dropped layer is the one whose removal alone costs least, with that KL.
    first = {i: _kl_without(teacher, [j for j in range(n) if j != i]) for i in range(n)}
    assert sel.removed[0]["layer"] == min(first, key=first.get)
    assert sel.removed[0]["kl"] == pytest.approx(first[sel.removed[0]["layer"]], rel=1e-4, abs=1e-6)
    # Round two starts from what round one kept.
    left = [j for j in range(n) if j != sel.removed[0]["layer"]]
    second = {i: _kl_without(teacher, [j for j in left if j != i]) for i in left}
    assert sel.removed[1]["layer"] == min(second, key=second.get)
    assert sel.layers == [j for j in left if j != sel.removed[1]["layer"]]
    assert len(sel.removed) == n - 1 and sel.tokens == IDS.numel()
    record = sel.record()
    assert record["method"] == "importance" and record["layers"] == sel.layers


def test_a_layer_that_does_nothing_goes_first_and_scores_zero(tiny_teacher):
    teacher = copy.deepcopy(tiny_teacher.model)
    dead = 1
    with torch.no_grad():  # both residual branches output 0: the layer is an identity
        teacher.layers[dead].self_attn.o_proj.weight.zero_()
        teacher.layers[dead].mlp.down_proj.weight.zero_()
    sel = select_by_importance(teacher, [IDS], teacher.cfg.num_layers - 1)
    assert sel.removed == [{"layer": dead, "kl": pytest.approx(0.0, abs=1e-6)}]
    assert dead not in sel.layers
    assert all(v > 1e-4 for v in sel.kept_kl.values())  # every kept layer does change the output


def test_bad_requests_are_refused(tiny_teacher):
    with pytest.raises(ValueError, match="1..3 layers"):
        select_by_importance(tiny_teacher.model, [IDS], 4)
    with pytest.raises(ValueError, match="at least one batch"):
        select_by_importance(tiny_teacher.model, [], 2)
