"""Held-out perplexity from the model's own log-probabilities.

Perplexity over a set of texts is exp of the mean negative log-likelihood per
scored token, pooled over all texts (so a long text weighs more than a short
one, as in the usual corpus perplexity):

    ppl = exp( -(1/N) * sum_texts sum_{t>=1} log p(x_t | x_<t) )

where N counts scored tokens. The first token of each text has no prefix and
is not scored. The texts in `heldout.jsonl` were written for this project and
must never enter distillation data, otherwise the Spark student's perplexity
would be measured on its own training set.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastmode.evals.tasks import data_dir, read_jsonl

HELDOUT_FILE = "heldout.jsonl"

# token_ids -> log-probs of token_ids[1:], natural log.
ScoreFn = Callable[[list[int]], Sequence[float]]


@dataclass(frozen=True)
class HeldoutText:
    """One held-out passage; `kind` is "prose" or "code"."""

    id: str
    kind: str
    text: str


@dataclass(frozen=True)
class PerplexityResult:
    """Pooled perplexity over some texts."""

    perplexity: float
    mean_nll: float  # nats per token
    num_tokens: int

    def to_dict(self) -> dict[str, float | int]:
        return {"perplexity": self.perplexity, "mean_nll": self.mean_nll, "tokens": self.num_tokens}


def load_heldout(kinds: Sequence[str] | None = None) -> list[HeldoutText]:
    """The packaged held-out passages, optionally only some kinds."""
    rows = read_jsonl(data_dir() / HELDOUT_FILE)
    texts = [HeldoutText(r["id"], r["kind"], r["text"]) for r in rows]
    return [t for t in texts if kinds is None or t.kind in kinds]


def score_fn_of(llm: Any) -> ScoreFn:
    """`llm.score`, or a clear error if this LLM cannot score tokens yet."""
    score = getattr(llm, "score", None)
    if not callable(score):
        raise NotImplementedError(
            f"{type(llm).__name__} has no score(token_ids) -> list[float] method; "
            "held-out perplexity needs per-token log-probs of token_ids[1:]"
        )
    return score


def score_text(score: ScoreFn, token_ids: list[int]) -> tuple[float, int]:
    """(sum of log-probs, number of scored tokens) for one tokenized text.

    Raises ValueError if the score has the wrong length or a log-prob is
    positive or not finite: either means the scorer is broken and the
    perplexity would be meaningless.
    """
    if len(token_ids) < 2:
        return 0.0, 0  # nothing to predict
    logprobs = [float(lp) for lp in score(token_ids)]
    if len(logprobs) != len(token_ids) - 1:
        raise ValueError(
            f"score returned {len(logprobs)} log-probs for {len(token_ids)} tokens; "
            f"expected {len(token_ids) - 1} (one per token after the first)"
        )
    for lp in logprobs:
        # A log-prob is <= 0; allow bf16/float rounding just above zero.
        if not math.isfinite(lp) or lp > 1e-3:
            raise ValueError(f"invalid log-prob {lp!r}")
    return sum(logprobs), len(logprobs)


def pooled(sums: Sequence[tuple[float, int]]) -> PerplexityResult:
    """Combine per-text (sum log-prob, token count) pairs into one perplexity."""
    num_tokens = sum(n for _, n in sums)
    if num_tokens == 0:
        raise ValueError("no tokens to score")
    mean_nll = -sum(s for s, _ in sums) / num_tokens
    return PerplexityResult(math.exp(mean_nll), mean_nll, num_tokens)


def perplexity(score: ScoreFn, encode: Callable[[str], list[int]], texts: Sequence[str]) -> PerplexityResult:
    """Pooled perplexity of `texts` under `score`, tokenized with `encode`."""
    return pooled([score_text(score, encode(text)) for text in texts])


def heldout_perplexity(llm: Any) -> dict[str, PerplexityResult]:
    """Perplexity of `llm` on the held-out set: per kind ("prose", "code") and "all"."""
    score = score_fn_of(llm)
    texts = load_heldout()
    sums = {t.id: score_text(score, llm.tokenizer.encode(t.text)) for t in texts}
    results = {kind: pooled([sums[t.id] for t in texts if t.kind == kind]) for kind in sorted({t.kind for t in texts})}
    results["all"] = pooled(list(sums.values()))
    return results
