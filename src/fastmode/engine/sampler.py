"""Token selection from logits: greedy, or temperature/top-k/top-p with a per-request generator.

Each sampled row draws from its own `torch.Generator`, so a seeded request
gets the same tokens whatever else shares its batch.

A row's logits go through these stages, all computed from the request's own
state only (so a request's output never depends on its batch):
1. penalties and bias (`apply_penalties`, `apply_bias`): presence/frequency
   penalties over the tokens the request has output so far, then logit_bias;
2. the structured-output mask (engine/structured.py): forbidden tokens -inf;
3. temperature, top-k, top-p (`probs_from_logits`), then greedy argmax or a draw.
Logprobs (`token_logprob`) are the log-softmax of the logits after stages 1
and 2, before stage 3: they describe the model's distribution as the request
shaped it (penalties, bias, grammar), independent of how it is then sampled,
as OpenAI reports them. A token the grammar forbids has logprob -inf and is
never listed among the alternatives.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from fastmode.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One emitted token's log-probability and the `top` most likely tokens at its position
    (id, logprob), most likely first (it may include the emitted token itself)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


def adjusts_logits(params: SamplingParams) -> bool:
    """Whether stage 1 (penalties, bias) changes this request's logits."""
    return bool(params.presence_penalty or params.frequency_penalty or params.logit_bias)


def apply_penalties(logits: torch.Tensor, output_ids: list[int], params: SamplingParams) -> None:
    """OpenAI's presence and frequency penalties, in place on a (V,) row: every token already
    in `output_ids` loses presence_penalty once and frequency_penalty per occurrence."""
    if not output_ids or not (params.presence_penalty or params.frequency_penalty):
        return
    ids, counts = torch.unique(torch.tensor(output_ids, dtype=torch.long), return_counts=True)
    keep = ids < logits.shape[-1]
    ids, counts = ids[keep], counts[keep]
    logits[ids] -= counts.to(logits.dtype) * params.frequency_penalty + params.presence_penalty


@lru_cache(maxsize=1024)
def _bias_tensors(logit_bias: tuple[tuple[int, float], ...]) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([t for t, _ in logit_bias], dtype=torch.long)
    return ids, torch.tensor([b for _, b in logit_bias], dtype=torch.float32)


def apply_bias(logits: torch.Tensor, params: SamplingParams) -> None:
    """Add params.logit_bias in place to a (..., V) block of rows (ids already checked
    against the vocabulary when the request was)."""
    if params.logit_bias:
        ids, bias = _bias_tensors(params.logit_bias)
        logits[..., ids] += bias.to(logits.dtype)


def token_logprob(logits: torch.Tensor, token_id: int, num_top: int) -> TokenLogprob:
    """The logprob of `token_id` under a (V,) row of processed logits, with the row's
    `num_top` most likely tokens (none for 0). Tokens with logprob -inf are left out."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top: list[tuple[int, float]] = []
    if num_top:
        values, ids = torch.topk(logp, min(num_top, logp.shape[-1]))
        top = [(i, v) for i, v in zip(ids.tolist(), values.tolist()) if v != float("-inf")]
    return TokenLogprob(token_id, float(logp[token_id]), top)


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
