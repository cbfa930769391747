"""The Spark student: a subset of the teacher's layers on the teacher's embeddings.

Only the transformer layers and the final norm belong to the student; the
token embedding, the LM head and the RoPE table are the teacher's own modules
(shared, never copied, never trained). A student therefore costs only its
layers in memory and on disk, and its logits live in the teacher's vocabulary
space, which is what speculative decoding needs from a draft.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn

from fastmode.models.llama import LlamaModel, RMSNorm

SPARK_SUFFIX = "-spark"
# The parameters a student owns; everything else is the teacher's.
OWN_PREFIXES = ("layers.", "norm.")


def choose_layers(num_teacher_layers: int, num_student_layers: int) -> list[int]:
    """`num_student_layers` teacher layer indices spread evenly, always keeping the first and the last.

    The first layer turns embeddings into the residual stream the others read,
    and the last prepares it for the head; the ones between are the most
    redundant, so they are thinned evenly. 30 -> 10 gives 0,3,6,10,13,16,19,23,26,29.
    """
    n, k = num_teacher_layers, num_student_layers
    if not 1 <= k <= n:
        raise ValueError(f"a student needs 1..{n} layers, got {k}")
    if k == 1:
        return [0]
    return [round(i * (n - 1) / (k - 1)) for i in range(k)]


def assemble(teacher: LlamaModel, layers: nn.ModuleList, norm: RMSNorm, name: str) -> LlamaModel:
    """A `LlamaModel` made of `layers` and `norm` on the teacher's embeddings, head and RoPE table."""
    model = LlamaModel.__new__(LlamaModel)
    nn.Module.__init__(model)
    model.cfg = replace(teacher.cfg, num_layers=len(layers), name=name)
    model.embed_tokens = teacher.embed_tokens
    model.layers = layers
    model.norm = norm
    model.lm_head = teacher.lm_head
    model.rotary = teacher.rotary
    return model


def build_student(teacher: LlamaModel, layer_indices: Sequence[int]) -> LlamaModel:
    """A trainable student initialised from copies of the teacher's layers `layer_indices` and final norm."""
    if list(layer_indices) != sorted(set(layer_indices)):
        raise ValueError(f"layer indices must be increasing and distinct, got {list(layer_indices)}")
    layers = nn.ModuleList(copy.deepcopy(teacher.layers[i]) for i in layer_indices)
    norm = copy.deepcopy(teacher.norm)
    student = assemble(teacher, layers, norm, teacher.cfg.name + SPARK_SUFFIX)
    layers.requires_grad_(True)
    norm.requires_grad_(True)
    return student


def own_state(student: LlamaModel) -> dict[str, torch.Tensor]:
    """The student's own tensors (layers + final norm), detached, under `LlamaModel` state-dict names."""
    return {k: v.detach() for k, v in student.state_dict().items() if k.startswith(OWN_PREFIXES)}


def own_parameters(student: LlamaModel) -> list[nn.Parameter]:
    """The parameters training updates, in a fixed order (the optimizer state is keyed by it)."""
    return [p for n, p in student.named_parameters() if n.startswith(OWN_PREFIXES)]
