"""Teacher-forced log-probabilities of a token sequence (perplexity, evals)."""

from __future__ import annotations

import torch

from fastmode.loader import LoadedModel
from fastmode.models.attention_batch import AttentionBatch, PrefillSpan


@torch.inference_mode()
def full_logits(
    loaded: LoadedModel, token_ids: list[int], block_size: int = 16, kv_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """(len, V) fp32 logits for every position, computed in one prefill on a private cache
    of `kv_dtype` (default: the model's dtype; an engine passes its own cache's)."""
    cfg = loaded.config
    n = len(token_ids)
    num_blocks = -(-n // block_size)
    shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
    dt = kv_dtype or loaded.dtype
    caches = [(torch.zeros(shape, dtype=dt), torch.zeros(shape, dtype=dt)) for _ in range(cfg.num_layers)]
    table = torch.arange(num_blocks)
    batch = AttentionBatch(
        slot_mapping=torch.arange(n),
        prefill_spans=[PrefillSpan(0, n, n, table, None)],
        num_prefill_tokens=n,
    )
    ids = torch.tensor(token_ids)
    return loaded.model(ids, torch.arange(n), batch, caches, torch.arange(n))


def score_tokens(loaded: LoadedModel, token_ids: list[int], kv_dtype: torch.dtype | None = None) -> list[float]:
    if len(token_ids) < 2:
        return []
    logits = full_logits(loaded, token_ids, kv_dtype=kv_dtype)
    logp = torch.log_softmax(logits[:-1], dim=-1)
    return logp.gather(1, torch.tensor(token_ids[1:]).unsqueeze(1)).squeeze(1).tolist()
