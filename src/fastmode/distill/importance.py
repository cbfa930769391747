"""Which teacher layers the student keeps, by measured importance.

Greedy removal on distillation text: start from all teacher layers; each
round, for every remaining layer, measure how far the teacher's output moves
when that layer is also skipped (KL(teacher || pruned), nats per token, over
the full vocabulary), and drop the layer whose removal costs least. Stop at
the wanted number of layers. Re-measuring after every removal matters: two
neighbouring layers can each look redundant alone while removing both does
not.

A round reuses the residual stream up to each candidate (the layers before it
are unchanged), so a candidate costs only the layers after it and the head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from fastmode.distill.forward import check_supported, layer_forward, rope_tables
from fastmode.models.llama import LlamaModel

METHODS = ("even", "importance")


@dataclass
class Selection:
    """The kept teacher layers and the measurements that chose them."""

    layers: list[int]
    removed: list[dict[str, float]] = field(default_factory=list)  # {"layer", "kl"} in removal order
    kept_kl: dict[int, float] = field(default_factory=dict)  # KL if this kept layer alone were also dropped
    tokens: int = 0

    def record(self) -> dict:
        """JSON-ready summary for spark.json."""
        return {
            "method": "importance",
            "measure": "greedy removal; KL(teacher || without layer) in nats/token",
            "tokens": self.tokens,
            "layers": self.layers,
            "kept_kl": {str(k): round(v, 5) for k, v in self.kept_kl.items()},
            "removed": [{"layer": int(r["layer"]), "kl": round(r["kl"], 5)} for r in self.removed],
        }


def _kl(model: LlamaModel, hidden: torch.Tensor, log_p: torch.Tensor, chunk: int = 1024) -> float:
    """Summed KL(p || q) over tokens, q from the final norm + head of `hidden` (N, H)."""
    total = 0.0
    for s in range(0, hidden.shape[0], chunk):
        log_q = F.log_softmax(model.lm_head(model.norm(hidden[s : s + chunk])).float(), dim=-1)
        lp = log_p[s : s + chunk]
        total += (lp.exp() * (lp - log_q)).sum().item()
    return total


@torch.no_grad()
def select_by_importance(model: LlamaModel, batches: Sequence[torch.Tensor], num_layers: int) -> Selection:
    """Keep `num_layers` of `model`'s layers by greedy removal measured on token batches (B, T) each."""
    check_supported(model.cfg)
    n = model.cfg.num_layers
    if not 1 <= num_layers <= n:
        raise ValueError(f"a student needs 1..{n} layers, got {num_layers}")
    if not batches:
        raise ValueError("importance needs at least one batch of tokens")
    data = []  # per batch: embeddings, rope tables, teacher log-probs (N, V)
    for ids in batches:
        rope = rope_tables(model, ids.shape[1])
        x0 = model.embed_tokens(ids)
        x = x0
        for layer in model.layers:
            x = layer_forward(layer, x, rope)
        h = model.norm(x.flatten(0, 1))
        log_p = torch.cat([F.log_softmax(model.lm_head(h[s : s + 1024]).float(), -1) for s in range(0, len(h), 1024)])
        data.append((x0, rope, log_p))
    tokens = sum(int(ids.numel()) for ids in batches)

    def round_kl(keep: list[int]) -> dict[int, float]:
        """KL of `keep` minus each one of its layers."""
        out = dict.fromkeys(keep, 0.0)
        for x0, rope, log_p in data:
            inputs, x = [], x0  # inputs[j]: the residual stream entering keep[j]
            for i in keep:
                inputs.append(x)
                x = layer_forward(model.layers[i], x, rope)
            for j, i in enumerate(keep):
                y = inputs[j]
                for later in keep[j + 1 :]:
                    y = layer_forward(model.layers[later], y, rope)
                out[i] += _kl(model, y.flatten(0, 1), log_p)
        return {i: v / tokens for i, v in out.items()}

    keep = list(range(n))
    sel = Selection(layers=keep, tokens=tokens)
    while True:
        scores = round_kl(keep) if len(keep) > 1 else {keep[0]: float("nan")}
        if len(keep) == num_layers:
            sel.kept_kl = scores
            break
        drop = min(keep, key=lambda i: scores[i])
        sel.removed.append({"layer": drop, "kl": scores[drop]})
        keep = [i for i in keep if i != drop]
    sel.layers = keep
    return sel
