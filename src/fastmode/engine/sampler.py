"""Token selection from logits: greedy, or temperature/top-k/top-p with a per-request generator.

Each sampled row draws from its own `torch.Generator`, so a seeded request
gets the same tokens whatever else shares its batch.
"""

from __future__ import annotations

import torch

from fastmode.sampling_params import SamplingParams


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(..., V) fp32 logits -> the distribution `params` samples from (after filters)."""
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, idx = torch.sort(probs, dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from a (V,) fp32 row."""
    if params.greedy:
        return int(torch.argmax(logits))
    probs = probs_from_logits(logits, params)
    return int(torch.multinomial(probs, 1, generator=generator))


def make_generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g
