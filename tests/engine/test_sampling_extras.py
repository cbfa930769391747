"""Penalties, logit_bias and logprobs: their semantics, and exactness under batching and speculation."""

from __future__ import annotations

import math

import pytest
import torch

from fastmode import SamplingParams
from fastmode.engine.sampler import TokenLogprob
from fastmode.engine.scoring import full_logits


@pytest.fixture(scope="module")
def llm(default_llm):
    return default_llm


def chat(llm, text: str) -> list[int]:
    return llm.tokenizer.encode_chat([{"role": "user", "content": text}])


def run(llm, prompts: list[list[int]], params: list[SamplingParams]) -> list[tuple[list[int], list[TokenLogprob]]]:
    """Serve the prompts together on the engine; per request its tokens and logprobs."""
    engine = llm.engine
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    logprobs: dict[str, list[TokenLogprob]] = {rid: [] for rid in ids}
    done: set[str] = set()
    while len(done) < len(ids):
        for o in engine.step():
            assert o.finish_reason != "error", engine.last_error
            tokens[o.request_id] += o.delta_token_ids
            if o.delta_logprobs is not None:
                assert len(o.delta_logprobs) == len(o.delta_token_ids)
                logprobs[o.request_id] += o.delta_logprobs
            if o.finished:
                done.add(o.request_id)
    return [(tokens[rid], logprobs[rid]) for rid in ids]


def reference_logits(llm, prompt: list[int], output: list[int]) -> torch.Tensor:
    """(len(output), V) logits that scored each output token, from one full forward pass."""
    engine = llm.engine
    logits = full_logits(engine.loaded, prompt + output, kv_dtype=engine.kv_dtype)
    return logits[len(prompt) - 1 : len(prompt) + len(output) - 1]


def test_penalties_follow_openai_semantics_on_a_greedy_request(llm):
    prompt = chat(llm, "Write the word 'go' twenty times: go go go go go go go go go go go")
    plain = run(llm, [prompt], [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)])[0][0]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, presence_penalty=0.7, frequency_penalty=1.3)
    penalised = run(llm, [prompt], [params])[0][0]
    assert penalised != plain
    # Each token is the argmax of the reference logits after subtracting, for every token
    # already output, presence_penalty once and frequency_penalty per occurrence.
    ref = reference_logits(llm, prompt, penalised)
    for i, tok in enumerate(penalised):
        row = ref[i].clone()
        for t in set(penalised[:i]):
            row[t] -= params.presence_penalty + params.frequency_penalty * penalised[:i].count(t)
        top2 = torch.topk(row, 2)
        if top2.values[0] - top2.values[1] > 1e-3:  # skip exact near-ties of two fp32 paths
            assert int(top2.indices[0]) == tok, f"token {i}"
    assert len(set(penalised)) > len(set(plain))  # the penalty spreads the output over more tokens


def test_logit_bias_forces_and_bans_tokens(llm):
    prompt = chat(llm, "Name a colour.")
    plain = run(llm, [prompt], [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)])[0][0]
    forced_tok = llm.tokenizer.encode(" banana", add_special_tokens=False)[0]
    forced = run(
        llm, [prompt], [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logit_bias={forced_tok: 100})]
    )[0][0]
    assert forced == [forced_tok] * 6
    banned = run(
        llm, [prompt], [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logit_bias={plain[0]: -100})]
    )[0][0]
    assert plain[0] not in banned
    # A sampled request draws only from what the bias leaves.
    sampled = run(
        llm,
        [prompt],
        [SamplingParams(temperature=1.0, seed=3, max_tokens=6, ignore_eos=True, logit_bias={forced_tok: 100})],
    )[0][0]
    assert sampled == [forced_tok] * 6


def test_logprobs_of_greedy_tokens_are_the_row_max_and_match_a_reference_forward(llm):
    prompt = chat(llm, "What is the capital of France?")
    tokens, lps = run(llm, [prompt], [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=5)])[0]
    assert len(lps) == len(tokens) == 10
    ref = torch.log_softmax(reference_logits(llm, prompt, tokens), dim=-1)
    for i, (tok, lp) in enumerate(zip(tokens, lps)):
        assert lp.token_id == tok
        assert len(lp.top) == 5 and lp.top[0][0] == tok and lp.top[0][1] == lp.logprob  # greedy: the max
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
        assert lp.logprob <= 0 and math.isfinite(lp.logprob)
        assert lp.logprob == pytest.approx(float(ref[i, tok]), abs=2e-2)
        ref_top = torch.topk(ref[i], 5)
        assert [t for t, _ in lp.top][:2] == ref_top.indices.tolist()[:2] or ref_top.values[1] - ref_top.values[
            2
        ] < 1e-2
    _, only = run(llm, [prompt], [SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=0)])[0]
    assert [lp.top for lp in only] == [[], [], []]
    _, none = run(llm, [prompt], [SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)])[0]
    assert none == []


def test_logprobs_are_of_the_penalised_and_biased_distribution(llm):
    prompt = chat(llm, "Name a colour.")
    tok = llm.tokenizer.encode(" banana", add_special_tokens=False)[0]
    tokens, lps = run(
        llm, [prompt], [SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, logprobs=2, logit_bias={tok: 100})]
    )[0]
    assert tokens == [tok, tok]
    assert lps[0].logprob > -1e-3  # nearly all the mass after a +100 bias
    # Temperature does not change logprobs (they are taken before it).
    _, hot = run(
        llm, [prompt], [SamplingParams(temperature=5.0, seed=1, max_tokens=1, logprobs=2, logit_bias={tok: 100})]
    )[0]
    assert hot[0].logprob == pytest.approx(lps[0].logprob, abs=1e-6)


def test_each_feature_is_exact_under_batching(llm):
    prompts = [
        chat(llm, q)
        for q in ("Tell me a story.", "List three fruits.", "Why is the sea salty?", "Count to ten.", "Say hello.")
    ]
    ban = llm.tokenizer.encode(" the", add_special_tokens=False)[0]
    params = [
        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, frequency_penalty=1.0, logprobs=3),
        SamplingParams(
            temperature=0.9, seed=11, max_tokens=16, ignore_eos=True, presence_penalty=1.5, logit_bias={ban: -100}
        ),
        SamplingParams(temperature=0.7, top_p=0.9, seed=5, max_tokens=16, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
        SamplingParams(
            temperature=1.0, seed=2, max_tokens=16, ignore_eos=True, frequency_penalty=-0.5, logit_bias={ban: 4.0}
        ),
    ]
    solo = [run(llm, [p], [sp])[0] for p, sp in zip(prompts, params)]
    batched = run(llm, prompts, params)
    for (s_tok, s_lp), (b_tok, b_lp) in zip(solo, batched):
        assert b_tok == s_tok
        assert [lp.token_id for lp in b_lp] == [lp.token_id for lp in s_lp]
        for a, b in zip(s_lp, b_lp):
            # Tokens are exact; the model's logits under a different batch shape can differ in
            # the last bits of fp32 (matmul blocking), so logprob values agree to ~1e-4.
            assert b.logprob == pytest.approx(a.logprob, abs=2e-3)
            assert [t for t, _ in b.top] == [t for t, _ in a.top]
    assert ban not in batched[1][0]


def test_penalties_and_logprobs_are_unchanged_by_speculation(llm, drafting_always):
    drafting_always(llm)
    prompt = chat(llm, "Repeat after me: one two three one two three one two three one two three")
    off = SamplingParams(
        temperature=0, max_tokens=24, ignore_eos=True, frequency_penalty=0.3, logprobs=2, speculative="off"
    )
    on = SamplingParams(
        temperature=0, max_tokens=24, ignore_eos=True, frequency_penalty=0.3, logprobs=2, speculative="ngram"
    )
    stats = llm.engine.spec.stats
    before = sum(stats.draft_tokens.values())
    off_tok, off_lp = run(llm, [prompt], [off])[0]
    on_tok, on_lp = run(llm, [prompt], [on])[0]
    assert sum(stats.draft_tokens.values()) > before  # speculation really ran
    assert on_tok == off_tok
    assert len(on_lp) == len(off_lp) == 24
    for a, b in zip(off_lp, on_lp):
        # Same positions, same distributions: a verification step scores several rows in one
        # matmul, whose rounding differs from a one-row step's by up to ~1e-2 in a logprob.
        assert a.token_id == b.token_id and b.logprob == pytest.approx(a.logprob, abs=2e-2)
        assert [t for t, _ in b.top][:1] == [t for t, _ in a.top][:1]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"logit_bias": {5: 100.5}}, "logit_bias"),
        ({"logit_bias": {-3: 1.0}}, "logit_bias"),
        ({"logit_bias": {5: float("inf")}}, "logit_bias"),
        ({"temperature": float("inf")}, "temperature"),
    ],
)
def test_out_of_range_values_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_logit_bias_is_normalised_and_checked_against_the_vocabulary(llm):
    assert SamplingParams(logit_bias={"7": 1, 3: -2.5}).logit_bias == ((3, -2.5), (7, 1.0))
    vocab = llm.engine.loaded.config.vocab_size
    with pytest.raises(ValueError, match="logit_bias"):
        llm.engine.add_request([1, 2, 3], SamplingParams(logit_bias={vocab: 1.0}))
    assert not llm.engine.has_unfinished()
