"""The perplexity formula, on a stand-in scorer whose log-probs we choose."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from fastmode.evals.perplexity import heldout_perplexity, perplexity, score_fn_of


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_uniform_model_has_perplexity_equal_to_vocab_size() -> None:
    vocab = 50
    result = perplexity(lambda ids: [-math.log(vocab)] * (len(ids) - 1), encode, ["abcd", "xyz"])
    assert result.perplexity == pytest.approx(vocab)
    assert result.num_tokens == 3 + 2  # first token of each text is not scored


def test_pooled_over_tokens_not_averaged_over_texts() -> None:
    # text 1: 1 scored token with log-prob -1; text 2: 3 scored tokens with -3
    scores = {"ab": [-1.0], "abcd": [-3.0, -3.0, -3.0]}
    result = perplexity(lambda ids: scores["".join(map(chr, ids))], encode, ["ab", "abcd"])
    assert result.mean_nll == pytest.approx((1 + 9) / 4)
    assert result.perplexity == pytest.approx(math.exp(2.5))


def test_certain_model_has_perplexity_one() -> None:
    assert perplexity(lambda ids: [0.0] * (len(ids) - 1), encode, ["hello"]).perplexity == 1.0


def test_broken_scores_are_rejected() -> None:
    with pytest.raises(ValueError, match="expected 4"):
        perplexity(lambda ids: [-1.0] * len(ids), encode, ["hello"])
    with pytest.raises(ValueError, match="invalid log-prob"):
        perplexity(lambda ids: [0.5] * (len(ids) - 1), encode, ["hello"])
    with pytest.raises(ValueError, match="invalid log-prob"):
        perplexity(lambda ids: [float("nan")] * (len(ids) - 1), encode, ["hello"])
    with pytest.raises(ValueError, match="no tokens"):
        perplexity(lambda ids: [], encode, ["a"])


def test_missing_score_method_names_it() -> None:
    with pytest.raises(NotImplementedError, match="score"):
        score_fn_of(SimpleNamespace(tokenizer=None))


def test_heldout_perplexity_per_kind() -> None:
    # log p = -1 for every token: perplexity e in every kind
    llm = SimpleNamespace(
        tokenizer=SimpleNamespace(encode=encode),
        score=lambda ids: [-1.0] * (len(ids) - 1),
    )
    results = heldout_perplexity(llm)
    assert set(results) == {"prose", "code", "all"}
    for result in results.values():
        assert result.perplexity == pytest.approx(math.e)
    assert results["all"].num_tokens == results["prose"].num_tokens + results["code"].num_tokens
