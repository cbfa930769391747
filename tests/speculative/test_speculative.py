"""Speculative decoding is lossless: greedy identity, exact distribution under sampling."""

from __future__ import annotations

import pytest
import torch

from fastmode import LLM, SamplingParams
from fastmode.engine.model_runner import ModelRunner
from fastmode.engine.sequence import Sequence
from fastmode.engine.tiers import Tier
from fastmode.speculative.ngram import propose_ngram
from fastmode.speculative.policy import DraftReport, SpecConfig, SpecPolicy
from fastmode.speculative.step_curve import StepCurve


def test_ngram_proposes_the_continuation_of_the_latest_match():
    toks = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3]
    assert propose_ngram(toks, 3) == [4, 5, 9]
    assert propose_ngram([1, 2, 3, 4], 3) == []
    # The most recent earlier occurrence wins.
    assert propose_ngram([7, 8, 1, 7, 8, 2, 7, 8], 1, min_n=2) == [2]


def test_policy_per_request_per_tier_and_batch_threshold():
    pol = SpecPolicy(SpecConfig(method="ngram", tiers=("fast",), max_batch=4))
    fast = Sequence("f", [1, 2], SamplingParams(max_tokens=50), Tier.FAST)
    std = Sequence("s", [1, 2], SamplingParams(max_tokens=50), Tier.STANDARD)
    opt_out = Sequence("o", [1, 2], SamplingParams(max_tokens=50, speculative="off"), Tier.FAST)
    opt_in = Sequence("i", [1, 2], SamplingParams(max_tokens=50, speculative="ngram"), Tier.STANDARD)
    assert [pol.method_for(s) for s in (fast, std, opt_out, opt_in)] == ["ngram", "off", "off", "ngram"]
    assert pol.enabled_for_step(4) and not pol.enabled_for_step(5)
    k0 = pol.num_draft_tokens(fast)
    assert k0 > 1  # the optimistic prior tries a long draft first
    for _ in range(10):
        pol.observe(fast, 4, 0)  # nothing accepted: speculation stops, but for a 1-token probe now and then
    every = pol.config.probe_every
    ks = [pol.num_draft_tokens(fast) for _ in range(7 * every)]
    # Probes after 1, then 2, then 4 intervals: each one that does not restart speculation waits longer.
    assert [i for i, k in enumerate(ks) if k] == [every - 1, 3 * every - 1, 7 * every - 1]
    assert set(ks) == {0, 1}
    for _ in range(10):
        pol.observe(fast, 4, 4)
    assert pol.num_draft_tokens(fast) == pol.config.max_draft_tokens
    assert pol.stats.acceptance_rate("fast") == pytest.approx(40 / 80)


def test_step_curve_interpolates_and_extrapolates_measured_step_times():
    c = StepCurve(ema=0.5)
    assert c.seconds(4) is None and c.relative(1, 4) is None  # nothing measured
    c.observe(1, 0.020)
    assert c.seconds(1) == pytest.approx(0.020) and c.seconds(5) is None  # one point: no slope yet
    c.observe(5, 0.024)
    c.observe(16, 0.080)
    assert c.seconds(3) == pytest.approx(0.022)  # between 1 and 5
    assert c.seconds(10) == pytest.approx(0.024 + 0.056 * 5 / 11)  # between 5 and 16
    assert c.seconds(27) == pytest.approx(0.080 + 0.056 * 11 / 11)  # beyond: the last slope
    assert c.relative(1, 4) == pytest.approx(1.2)
    c.observe(0, 1.0), c.observe(3, 0.0)  # ignored
    assert c.seconds(3) == pytest.approx(0.022)
    c.observe(5, 0.028)  # 5 rows slower than their shape says: the scale and row 5's shape share it
    assert 0.024 < c.seconds(5) < 0.028 and c.seconds(1) > 0.020
    noisy = StepCurve()
    noisy.observe(4, 0.030), noisy.observe(8, 0.025)
    assert noisy.relative(4, 4) == 1.0  # never cheaper than the plain step


def test_step_curve_carries_a_change_of_machine_speed_to_row_counts_not_observed():
    """Seeded on a busy machine (every step ~10x slower), then only plain decodes and short
    verifications run: the long verifications, never observed since, must not keep their busy
    seconds, or the policy would price them at ~10x a plain step and never draft long."""
    c = StepCurve()
    for rows, s in {1: 0.190, 2: 0.220, 4: 0.290, 8: 0.450}.items():
        c.observe(rows, s)
    for _ in range(100):
        c.observe(1, 0.015), c.observe(2, 0.017)
    assert c.seconds(1) == pytest.approx(0.015, rel=0.02)
    assert c.relative(1, 7) == pytest.approx(0.450 / 0.190, rel=0.05)  # the shape it was seeded with
    assert c.seconds(8) < 0.05
    # The reverse: the machine slows down and only plain decodes show it.
    for _ in range(100):
        c.observe(1, 0.045)
    assert c.seconds(8) == pytest.approx(3 * 0.015 * 0.450 / 0.190, rel=0.1)


def test_policy_prices_verification_from_the_measured_step_curve():
    """Cheap verification at batch 1, costly at batch 4: n-gram drafts at 30% acceptance pay only at 1."""
    pol = SpecPolicy(SpecConfig(method="ngram", tiers=("fast",), max_draft_tokens=6))
    seq = Sequence("f", [1, 2], SamplingParams(max_tokens=50), Tier.FAST)
    for _ in range(20):
        pol.observe(seq, 3, 1)  # acceptance -> 1/3
    # The prior until steps are measured: each row adds verify_cost of a one-row step.
    assert pol.verify_cost(4, 1) == pytest.approx((1 + 7 * 0.15) / (1 + 3 * 0.15))
    for rows, ms in ((1, 16.0), (2, 16.4), (5, 18.7), (8, 27.6), (4, 17.6), (16, 49.0), (28, 95.0)):
        pol.observe_step(rows, ms / 1000)
    assert pol.verify_cost(1, 4) == pytest.approx(18.7 / 16.0)
    assert pol.num_draft_tokens(seq, "ngram", batch=1) >= 1
    assert pol.verify_cost(4, 1) == pytest.approx(27.6 / 17.6)
    assert pol.num_draft_tokens(seq, "ngram", batch=4) == 0


def test_policy_weighs_draft_model_cost_against_acceptance():
    pol = SpecPolicy(SpecConfig(method="draft", tiers=("fast",), max_draft_tokens=6))
    seq = Sequence("f", [1, 2], SamplingParams(max_tokens=50), Tier.FAST)
    for _ in range(20):
        pol.observe(seq, 2, 1)  # acceptance -> 0.5
    # Free n-gram drafts pay at 50% acceptance; a draft model costing 60% of a step does not.
    assert pol.num_draft_tokens(seq, "ngram") >= 2
    for _ in range(20):
        pol.observe_draft_cost(0.6, 1.0)
    assert pol.draft_cost == pytest.approx(0.6, abs=1e-3)
    assert pol.num_draft_tokens(seq, "draft") == 0
    for _ in range(20):
        pol.observe_draft_cost(0.05, 1.0)  # a cheap draft: worth it again
    assert pol.num_draft_tokens(seq, "draft") >= 1
    # A new request starts from the method's recent acceptance, not the optimistic prior.
    for _ in range(20):
        pol.observe_draft_cost(0.4, 1.0)
    fresh = Sequence("g", [1, 2], SamplingParams(max_tokens=50, speculative="draft"), Tier.FAST)
    for _ in range(20):
        pol.observe(fresh, 2, 0)  # the draft keeps failing
    newer = Sequence("h", [1, 2], SamplingParams(max_tokens=50, speculative="draft"), Tier.FAST)
    assert pol.num_draft_tokens(newer, "draft") == 0
    assert pol.states["h"].acceptance < 0.05
    # min_gain 0 speculates whatever the cost (used to test the machinery itself).
    always = SpecPolicy(SpecConfig(method="draft", min_gain=0.0))
    always.draft_cost = 5.0
    assert always.num_draft_tokens(seq, "draft") >= 1


def test_policy_skips_probes_whose_catch_up_no_acceptance_could_repay():
    """At batch 4 on a steep step curve even 95% acceptance loses. An n-gram probe costs one
    row and refreshes the curve, so it still happens; a draft-model probe would first run
    every token generated since the last draft, so it does not. At batch 1 both probe."""
    pol = SpecPolicy(SpecConfig(method="draft", tiers=("fast",), max_draft_tokens=6))
    for rows, ms in ((1, 16.0), (2, 16.4), (4, 20.0), (8, 44.0), (12, 66.0), (28, 160.0)):
        pol.observe_step(rows, ms / 1000)
    seq = Sequence("f", [1, 2], SamplingParams(max_tokens=500), Tier.FAST)
    for _ in range(20):
        pol.observe(seq, 3, 0)  # acceptance -> ~0
    every = pol.config.probe_every
    assert any(pol.num_draft_tokens(seq, "ngram", batch=4) for _ in range(2 * every))
    assert not any(pol.num_draft_tokens(seq, "draft", batch=4, catch_up=40) for _ in range(20 * every))
    assert any(pol.num_draft_tokens(seq, "draft", batch=1, catch_up=40) for _ in range(8 * every))


def test_policy_learns_from_a_step_and_its_drafting_report():
    """update_from_output: the draft model's round against the step, its catch-up against a plain
    step at the drafting batch, the step curve from decode/verify steps only, acceptance per sequence."""
    from fastmode.engine.scheduler import ScheduledSeq, SchedulerOutput

    pol = SpecPolicy(SpecConfig(method="draft", tiers=("fast",), ema=1.0))
    pol.observe_step(2, 0.010)  # a plain step of 2 decodes was measured: catch-ups are priced against it
    a = Sequence("a", [1, 2, 3], SamplingParams(max_tokens=50), Tier.FAST)
    b = Sequence("b", [1, 2, 3], SamplingParams(max_tokens=50), Tier.FAST)
    out = SchedulerOutput(step=1, scheduled=[ScheduledSeq(a, 5, 4, num_accepted_drafts=3), ScheduledSeq(b, 1, 0)])
    pol.update_from_output(out, 0.020, DraftReport(batch=2, round_s=0.004, catch_up=(0.030, 60)))
    assert pol.draft_cost == pytest.approx(0.004 / 0.020)
    assert pol.catch_up_cost == pytest.approx(0.030 / 60 / 0.010)
    assert pol.steps.seconds(6) == pytest.approx(0.020)  # 5 + 1 rows, no prompt chunk
    assert pol.states["a"].acceptance == pytest.approx(0.75) and "b" not in pol.states
    assert pol.stats.accepted_tokens == {"fast": 3}
    prefill = SchedulerOutput(step=2, scheduled=[ScheduledSeq(b, 30, 0)])
    pol.update_from_output(prefill, 0.5, DraftReport())  # a prompt chunk: not a point of the curve
    assert pol.steps.seconds(30) != pytest.approx(0.5) and pol.draft_cost == pytest.approx(0.2)


def test_policy_charges_the_draft_models_catch_up():
    """A draft model that must first run a long prompt pays only over enough remaining tokens."""
    pol = SpecPolicy(SpecConfig(method="draft", tiers=("fast",), max_draft_tokens=6))
    pol.draft_cost = 0.1
    for _ in range(30):
        pol.observe_catch_up(0.004, 1, 0.020)  # one catch-up token costs a fifth of a plain step
    assert pol.catch_up_cost == pytest.approx(0.2)
    assert pol.catch_up_steps(100) == pytest.approx(20.0)
    short = Sequence("s", list(range(100)), SamplingParams(max_tokens=20), Tier.FAST)
    long = Sequence("l", list(range(100)), SamplingParams(max_tokens=2000), Tier.FAST)
    for seq in (short, long):
        for _ in range(20):
            pol.observe(seq, 4, 3)  # acceptance -> 0.75
    assert pol.num_draft_tokens(short, "draft", catch_up=100) == 0  # 20 steps of catch-up for < 20 tokens
    assert pol.num_draft_tokens(short, "draft", catch_up=1) >= 1  # already caught up: drafting pays
    assert pol.num_draft_tokens(long, "draft", catch_up=100) >= 1  # amortised over ~2000 tokens
    # n-gram drafting has no catch-up: the argument is ignored.
    assert pol.num_draft_tokens(short, "ngram", catch_up=100) >= 1
    for _ in range(20):
        pol.observe(long, 4, 0)  # the draft stops paying: acceptance -> ~0
    # Each probe would first run every token generated since the last draft, a fifth of a step
    # apiece: more than the 5% margin of the steps it follows, so there is none.
    assert not any(pol.num_draft_tokens(long, "draft", catch_up=i + 1) for i in range(300))
    assert any(pol.num_draft_tokens(long, "ngram") for _ in range(300))  # n-gram probes are free


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.01, speculative_max_batch=8)


def repetitive_prompts():
    base = list(range(40, 72))
    return [base + base[:20], [5, 6, 7, 8] * 10, list(range(100, 140))]


def test_greedy_output_is_identical_with_ngram_speculation(llm, drafting_always):
    drafting_always(llm)
    prompts = repetitive_prompts()
    off = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, speculative="off"))
    on = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, speculative="ngram"))
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    stats = llm.engine.spec.stats
    assert stats.draft_tokens.get("standard", 0) > 0 and stats.accepted_tokens.get("standard", 0) > 0
    bm = llm.engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # rollback released every draft slot


def test_fast_tier_speculates_by_default_and_stays_identical(llm, drafting_always):
    drafting_always(llm)  # the tier's default drafts; whether drafts pay here is not what is tested
    prompts = repetitive_prompts()
    before = llm.engine.spec.stats.draft_tokens.get("fast", 0)
    ref = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), service_tier="standard")
    fast = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), service_tier="fast")
    assert [o.token_ids for o in fast] == [o.token_ids for o in ref]
    assert llm.engine.spec.stats.draft_tokens.get("fast", 0) > before


def test_stop_inside_accepted_drafts_is_honoured(llm):
    prompt = [5, 6, 7, 8] * 10
    ref = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, speculative="off"))[0]
    cut = ref.token_ids[7]
    want = ref.token_ids[: ref.token_ids.index(cut) + 1]
    for spec in ("off", "ngram"):
        out = llm.generate(
            [prompt],
            SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop_token_ids=[cut], speculative=spec),
        )[0]
        assert out.token_ids == want
    short = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, speculative="ngram"))[0]
    assert short.token_ids == ref.token_ids[:5]


def test_rejection_sampling_preserves_the_target_distribution():
    """Draft d proposed deterministically; the verify rule must yield exactly p."""
    torch.manual_seed(0)
    vocab = 6
    rows = torch.randn(2, vocab) * 1.5  # target logits at the draft position and after it
    params = SamplingParams(temperature=1.0, max_tokens=10)
    p1 = torch.softmax(rows[0], -1)
    p2 = torch.softmax(rows[1], -1)
    d = int(torch.argsort(p1)[vocab // 2])  # a middling draft: accepted sometimes, not always
    runner = ModelRunner.__new__(ModelRunner)  # _verify uses no runner state
    n = 20000
    first = torch.zeros(vocab)
    second_given_accept = torch.zeros(vocab)
    gen = torch.Generator().manual_seed(123)
    for _ in range(n):
        out = runner._verify(rows, [d], params, gen)
        first[out[0]] += 1
        if len(out) == 2:
            assert out[0] == d
            second_given_accept[out[1]] += 1

    # Chi-square goodness of fit at a generous threshold (df = vocab - 1 = 5; p=0.001 -> 20.5).
    def chi2(counts, probs):
        expected = probs * counts.sum()
        return float(((counts - expected) ** 2 / expected).sum())

    assert chi2(first, p1) < 20.5
    assert chi2(second_given_accept, p2) < 20.5
    assert abs(second_given_accept.sum() / n - p1[d]) < 0.02  # acceptance rate equals p(d)


def test_draft_model_speculation_is_lossless_and_syncs_its_cache(tiny_llama_dir):
    """A draft identical to the target must have every draft accepted; a weak one changes nothing."""
    prompts = [list(range(40, 60)), [5, 6, 7, 8] * 5, [300]]
    ref = LLM(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.01)
    want = [o.token_ids for o in ref.generate(prompts, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))]
    for draft, min_acceptance in [(str(tiny_llama_dir), 0.99), ("layers:1", 0.0)]:
        llm = LLM(
            model=str(tiny_llama_dir),
            dtype="float32",
            kv_cache_gib=0.01,
            draft_model=draft,
            speculative="draft",
            speculative_tiers="standard",
            speculative_max_batch=8,
            speculative_min_gain=0.0,  # draft every step, whatever it costs: the cache sync is under test
        )
        got = [
            o.token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
        ]
        assert got == want
        rate = llm.engine.spec.stats.acceptance_rate("standard")
        assert rate is not None and rate >= min_acceptance
        assert llm.engine.drafter.blocks.num_free_blocks == llm.engine.drafter.blocks.num_blocks
        assert llm.engine.scheduler.block_manager.num_free_blocks == llm.engine.scheduler_config.num_blocks


def test_draft_request_without_a_draft_model_is_rejected(llm):
    with pytest.raises(ValueError, match="needs a draft model"):
        llm.generate([[1, 2, 3]], SamplingParams(speculative="draft"))


def test_greedy_verification_accepts_the_agreeing_prefix():
    """Greedy verification from the step's batched argmax: drafts are kept while they equal the
    target's choice; the first disagreement, or the token after the last draft, is the target's."""
    verify = ModelRunner._verify_greedy
    assert verify([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]  # all accepted, plus the bonus token
    assert verify([5, 9, 7, 8], [5, 6, 7]) == [5, 9]  # second draft rejected: the target's token instead
    assert verify([4, 6, 7, 8], [5, 6, 7]) == [4]  # first draft rejected: still one new token
    assert verify([3], []) == [3]  # no drafts: a plain step
