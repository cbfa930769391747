"""The distillation loss: KL(teacher || student) over the full vocabulary, plus optional CE.

Per token t, with logits z at temperature T (p = softmax(z_teacher / T),
q = softmax(z_student / T)):

    loss_t = T^2 * KL(p || q) + ce_weight * CE(softmax(z_student), x_{t+1})

T^2 keeps the gradient scale independent of T (Hinton et al., 2015). The
batch loss is the mean over tokens.

The vocabulary is large (49,152 for SmolLM2), so logits for a whole batch
(8 x 256 tokens -> 400 MB in fp32, and several such tensors for softmax and
gradients) are never materialised at once: the head runs over chunks of
tokens, each chunk's loss is back-propagated into the final hidden states,
and those gradients are pushed through the layers in one backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LossParts:
    """Per-token means, in nats: `kl` at temperature T (without the T^2 factor), `ce` at T=1."""

    total: float
    kl: float
    ce: float
    num_tokens: int


def distill_loss(
    head: nn.Module,
    student_hidden: torch.Tensor,  # (N, H), part of the student's autograd graph
    teacher_hidden: torch.Tensor,  # (N, H), no gradient
    targets: torch.Tensor,  # (N,) next-token ids, for the CE term
    temperature: float,
    ce_weight: float,
    chunk_tokens: int = 1024,
    backward: bool = True,
) -> LossParts:
    """Compute the loss; with `backward`, also accumulate its gradient into the student's parameters."""
    n = student_hidden.shape[0]
    # A leaf that collects d(loss)/d(hidden) chunk by chunk; the layers see one backward at the end.
    leaf = student_hidden.detach().requires_grad_(backward)
    sum_kl = sum_ce = 0.0
    with torch.set_grad_enabled(backward):
        for start in range(0, n, chunk_tokens):
            end = min(start + chunk_tokens, n)
            with torch.no_grad():
                log_p = F.log_softmax(head(teacher_hidden[start:end]).float() / temperature, dim=-1)  # (C, V)
            z = head(leaf[start:end]).float()  # (C, V)
            log_q = F.log_softmax(z / temperature, dim=-1)
            kl = (log_p.exp() * (log_p - log_q)).sum()
            # CE is reported even at weight 0: it is the number a perplexity eval would see.
            log_q1 = log_q if temperature == 1.0 else F.log_softmax(z, dim=-1)
            ce = -log_q1.gather(1, targets[start:end].unsqueeze(1)).sum()
            if backward:
                ((temperature**2 * kl + ce_weight * ce) / n).backward()
            sum_kl += kl.item()
            sum_ce += ce.item()
    if backward:
        student_hidden.backward(leaf.grad)
    kl_mean, ce_mean = sum_kl / n, sum_ce / n
    return LossParts(temperature**2 * kl_mean + ce_weight * ce_mean, kl_mean, ce_mean, n)
