"""Quantization-aware training: the student learns through the rounding it will be stored with.

A student exported as Q4_1 (32-weight blocks, w = d*q + m with q in 0..15 and
fp16 d, m) loses whatever its training moved by less than half a step of its
block's grid: rounding snaps such weights back, and a changed block minimum or
maximum moves the whole grid. Trained in fp32 and rounded afterwards, a
16-layer SmolLM2 student lost nearly everything distillation had taught it.

So from `TrainConfig.quantize_aware_from` on, the student's forward reads each
2-D layer weight through `fake_quantize_q4_1`: the value is exactly what
`export.quantize_q4_1` followed by the loader's dequantization gives, and the
gradient passes straight through to the fp32 master weight (the
straight-through estimator). What the optimizer minimises is then the loss of
the model that ships.
"""

from __future__ import annotations

import torch
from torch import nn

from fastmode.distill.export import Q4_1_BLOCK
from fastmode.distill.forward import causal_hidden
from fastmode.models.llama import LlamaModel

_BLOCK = Q4_1_BLOCK[0]  # weights per block


def q4_1_round_trip(w: torch.Tensor) -> torch.Tensor:
    """`w` (rows of a multiple of 32) after Q4_1 encoding and decoding, in fp32, without gradient.

    The arithmetic follows gguf's encoder step by step (fp32 scale and its
    reciprocal for the codes, fp16 scale and minimum for the values), so the
    result equals `dequantize_q4_1(quantize_q4_1(w))` bit for bit.
    """
    if w.dim() != 2 or w.shape[1] % _BLOCK:
        raise ValueError(f"Q4_1 needs a 2-D weight with rows of a multiple of {_BLOCK}, got {tuple(w.shape)}")
    b = w.detach().float().reshape(-1, _BLOCK)
    hi, lo = b.amax(dim=1, keepdim=True), b.amin(dim=1, keepdim=True)
    d = (hi - lo) / 15
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = torch.trunc((b - lo) * inv + 0.5).clamp_(0, 15)
    return (q * d.half().float() + lo.half().float()).reshape(w.shape)


class _StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w: torch.Tensor) -> torch.Tensor:
        return q4_1_round_trip(w).to(w.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def fake_quantize_q4_1(w: torch.Tensor) -> torch.Tensor:
    """Forward: exactly the Q4_1 round trip of `w` (not `w + (rounded - w)`, which is off by an ulp);
    backward: the identity (straight-through)."""
    return _StraightThrough.apply(w)


def quantized_weight_names(model: LlamaModel) -> list[str]:
    """The student's parameters that Q4_1 export stores as blocks: 2-D layer weights with rows of 32k."""
    return [
        n for n, p in model.named_parameters() if n.startswith("layers.") and p.dim() == 2 and p.shape[1] % _BLOCK == 0
    ]


class _CausalForward(nn.Module):
    """`causal_hidden` as a module call, so `functional_call` can swap the weights it reads."""

    def __init__(self, model: LlamaModel):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return causal_hidden(self.model, input_ids)


def quant_aware_hidden(model: LlamaModel, input_ids: torch.Tensor) -> torch.Tensor:
    """`causal_hidden` of `model` with its block-stored weights read through `fake_quantize_q4_1`."""
    params = dict(model.named_parameters())
    swapped = {f"model.{n}": fake_quantize_q4_1(params[n]) for n in quantized_weight_names(model)}
    return torch.func.functional_call(_CausalForward(model), swapped, (input_ids,), strict=False)
