"""Prompt-lookup drafting that never loses: lookups, per-step pricing from the measured step
curve, and the per-request switch that turns drafting off where drafts do not pay."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from fastmode import LLM, SamplingParams
from fastmode.engine.scheduler import ScheduledSeq, SchedulerOutput
from fastmode.engine.sequence import Sequence
from fastmode.speculative.ngram import NgramIndex, propose_ngram
from fastmode.speculative.ngram_policy import PRIOR, AcceptanceByMatch, LookupConfig, LookupPolicy, match_class
from fastmode.speculative.policy import DraftReport, SpecConfig, SpecPolicy
from fastmode.speculative.step_curve import StepCurve
from fastmode.speculative.step_timing import step_shapes


def test_speculation_policy_modules_do_not_import_torch():
    code = (
        "import sys; import fastmode.speculative.policy, fastmode.speculative.ngram_policy, "
        "fastmode.speculative.ngram, fastmode.speculative.step_curve; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- lookups


def test_index_finds_the_earlier_occurrence_with_the_longest_match():
    idx = NgramIndex()
    toks = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3]
    lk = idx.lookup(toks, 3)
    assert lk is not None and lk.tokens == [4, 5, 9] and lk.match_len == 3
    assert NgramIndex().lookup([1, 2, 3, 4], 3) is None
    # [7, 8] occurs twice before; the occurrence preceded by 5 matches one token further back.
    toks = [5, 7, 8, 1, 6, 7, 8, 2, 5, 7, 8]
    lk = NgramIndex().lookup(toks, 2)
    assert lk is not None and lk.tokens == [1, 6] and lk.match_len == 3
    # A long repeat: the match length counts back to where the copy started (capped).
    block = list(range(100, 180))
    lk = NgramIndex(max_match=64).lookup([1] + block + [2] + block[:50], 4)
    assert lk is not None and lk.tokens == block[50:54] and lk.match_len == 50


def test_index_stays_correct_as_the_sequence_grows():
    """An index fed one token at a time answers like a fresh index and agrees with the scan
    on whether there is a match and on the matched suffix's continuation length."""
    rng = random.Random(0)
    toks = [rng.randrange(12) for _ in range(300)]
    grown = NgramIndex()
    for n in range(2, len(toks)):
        got = grown.lookup(toks[:n], 5)
        fresh = NgramIndex().lookup(toks[:n], 5)
        assert got == fresh
        scan = propose_ngram(toks[:n], 5, window=10**6)
        assert (got is None) == (scan == [])
        if got is not None:
            # The proposal continues an earlier occurrence of the last match_len tokens.
            m, tail = got.match_len, toks[n - got.match_len : n]
            starts = [i for i in range(n - m) if toks[i : i + m] == tail]
            assert any(toks[i + m : i + m + len(got.tokens)] == got.tokens for i in starts)


# ---------------------------------------------------------------- acceptance by match length


def test_acceptance_is_learned_per_match_length_class():
    acc = AcceptanceByMatch(prior_weight=4.0)
    assert acc.rate(2) == pytest.approx(PRIOR[match_class(2)])
    assert match_class(0) == 0 and match_class(3) == 2 and match_class(13) == 6 and match_class(500) == len(PRIOR) - 1
    for _ in range(50):
        acc.observe(2, 3, 0)  # short matches: the first draft token is rejected
        acc.observe(20, 4, 4)  # long matches: all accepted
    assert acc.rate(2) < 0.05
    assert acc.rate(20) > 0.95 and acc.rate(23) > 0.95  # tokens 20..23 counted at their own lengths
    assert acc.rate(8) == pytest.approx(PRIOR[match_class(8)])  # never observed


# ---------------------------------------------------------------- per-step pricing


def curve(points: dict[int, float]) -> StepCurve:
    c = StepCurve()
    for rows, s in points.items():
        c.observe(rows, s)
    return c


def test_plan_prices_draft_rows_with_the_step_curve_and_the_whole_batch():
    block = list(range(100, 160))
    copying = block + [1] + block[:30]  # a long match: the text repeats
    other = [7, 8, 9, 10, 11]  # no earlier occurrence of its suffix
    flat = curve({1: 0.010, 4: 0.010, 8: 0.0105, 16: 0.011, 32: 0.012})
    steep = curve({1: 0.010, 4: 0.010, 5: 0.020, 8: 0.030, 32: 0.100})
    reqs = [("a", copying, 100), ("b", other, 100), ("c", other, 100), ("d", other, 100)]
    cheap = LookupPolicy(LookupConfig(), flat.seconds).plan(reqs, batch=4)
    assert cheap[0] == block[30:36] and cheap[1:] == [[], [], []]
    # Where one more row doubles the step, drafts for one of four sequences cannot pay.
    assert LookupPolicy(LookupConfig(), steep.seconds).plan(reqs, batch=4) == [[], [], [], []]
    # Alone, the same sequence drafts on the steep curve only as far as its rows pay.
    alone = LookupPolicy(LookupConfig(), steep.seconds).plan([("a", copying, 100)], batch=1)
    assert 1 <= len(alone[0]) < 6
    # max_tokens bounds the drafts: the token after them is the step's own.
    assert LookupPolicy(LookupConfig(), flat.seconds).plan([("a", copying, 2)], batch=1) == [block[30:32]]


def test_measured_outcome_raises_the_bar_where_drafted_steps_are_slower():
    """Whatever the estimates said, steps with drafts that produce fewer tokens per second than
    plain steps at the same batch size raise the gain drafts must promise there."""
    block = list(range(100, 160))
    reqs = [("a", block + [1] + block[:30], 100)]
    pol = LookupPolicy(LookupConfig(), curve({1: 0.010, 2: 0.014, 8: 0.030}).seconds)
    assert pol.plan(reqs, batch=1)[0]
    for _ in range(60):
        pol.observe_step(1, False, 1, 0.010)  # plain: 100 tokens/s
        pol.observe_step(1, True, 2, 0.030)  # drafted: 67 tokens/s
    assert pol.margin[1] == pytest.approx(2.0)
    assert pol.plan(reqs, batch=1) == [[]]  # the bar is now out of reach for this lookup
    assert 4 not in pol.margin  # other batch sizes are judged on their own
    for _ in range(60):
        pol.observe_step(1, False, 1, 0.010)
        pol.observe_step(1, True, 6, 0.013)  # drafted: 460 tokens/s
    assert pol.margin[1] == pytest.approx(1.0)
    assert pol.plan(reqs, batch=1)[0]


def test_policy_prices_from_measured_steps_once_two_row_counts_are_known():
    pol = SpecPolicy(SpecConfig(verify_cost=0.15))
    assert pol.step_seconds(8) / pol.step_seconds(1) == pytest.approx(1 + 7 * 0.15)  # the prior, unmeasured
    pol.seed_steps({1: 0.012, 7: 0.030})
    assert pol.step_seconds(7) / pol.step_seconds(1) == pytest.approx(2.5)
    assert pol.verify_cost(1, 6) == pytest.approx(2.5)


def test_policy_prices_a_plain_step_from_plain_steps_and_drafts_from_verifications():
    """At 4 sequences the fused decode step of 4 rows is cheaper than a 4-row verification:
    pricing drafts against the verification would make them look cheaper than they are."""
    pol = SpecPolicy(SpecConfig())
    pol.seed_steps({(False, 1): 0.011, (False, 4): 0.0165, (True, 2): 0.0129, (True, 4): 0.0192, (True, 8): 0.0268})
    assert pol.step_seconds(4, verify=False) == pytest.approx(0.0165)
    assert pol.step_seconds(4) == pytest.approx(0.0192)
    assert pol.verify_cost(4, 1) == pytest.approx(0.0268 / 0.0165)
    assert pol.verify_cost(1, 1) == pytest.approx(0.0129 / 0.011)
    assert pol.step_seconds(3, verify=False) == pytest.approx(0.011 + 2 * (0.0165 - 0.011) / 3)
    # Steps observed while serving keep each kind current: the machine gets 2x slower, and
    # plain one-sequence steps (the reference shape) show it to every estimate.
    for _ in range(50):
        pol.update_from_output(_decode_only(1), 0.022, DraftReport())
    assert pol.step_seconds(1, verify=False) == pytest.approx(0.022, rel=0.02)
    assert pol.step_seconds(8) == pytest.approx(2 * 0.0268, rel=0.02)  # carried to the verifications
    # Seen only at another shape, the change is shared between the machine's speed and that
    # shape's relative cost: the verifications still move, part of the way.
    for _ in range(50):
        pol.update_from_output(_decode_only(4), 2 * 0.033, DraftReport())
    assert pol.step_seconds(4, verify=False) == pytest.approx(0.066, rel=0.05)
    assert pol.step_seconds(8) > 1.3 * 2 * 0.0268


def _decode_only(batch: int) -> SchedulerOutput:
    seqs = [Sequence(f"d{i}", [1, 2, 3], SamplingParams(max_tokens=10)) for i in range(batch)]
    return SchedulerOutput(step=0, scheduled=[ScheduledSeq(s, 1, 0) for s in seqs])


def test_step_shapes_cover_what_the_policy_asks_about():
    shapes = step_shapes(max_batch=4, max_draft_tokens=6)
    plain = [r for v, r in shapes if not v]
    verify = [r for v, r in shapes if v]
    assert plain == [1, 2, 3, 4]
    assert verify[:7] == list(range(2, 9)) and verify[-1] == 28 and verify == sorted(set(verify))
    assert step_shapes(1, 6) == [(False, 1)] + [(True, r) for r in range(2, 8)]


# ---------------------------------------------------------------- per request, with real drafts


def decode(policy: LookupPolicy, rid: str, prompt: list[int], answer: list[int]) -> list[int]:
    """Greedy decoding of `answer` after `prompt` under the policy: each step drafts from the
    real lookup, verification keeps the drafts the answer agrees with, plus one token (the
    target's). Returns the number of draft tokens of each step."""
    tokens, pos, drafted = list(prompt), 0, []
    while pos < len(answer):
        [drafts] = policy.plan([(rid, tokens, len(answer) - pos - 1)], batch=1)
        ok = 0
        while ok < len(drafts) and drafts[ok] == answer[pos + ok]:
            ok += 1
        policy.observe(rid, len(drafts), ok)
        tokens += answer[pos : pos + ok + 1]
        pos += ok + 1
        drafted.append(len(drafts))
    return drafted


def this_machine_like_curve() -> StepCurve:
    # One row 12 ms, then ~2.2 ms a row to 8 rows, steeper beyond (the kernels' small-batch path).
    return curve({1: 0.012, 2: 0.0142, 4: 0.0186, 8: 0.0274, 16: 0.055, 32: 0.11})


def test_drafting_stops_for_a_request_whose_drafts_are_rejected():
    """The answer keeps echoing two tokens of the prompt and then leaving it: every lookup
    finds a match, and every draft is wrong. Drafting stops after a few steps; another
    request whose answer copies its prompt keeps drafting all along."""
    pol = LookupPolicy(LookupConfig(explore_every=10**9), this_machine_like_curve().seconds)
    # Make short matches look worth drafting, as earlier traffic might have.
    for _ in range(30):
        pol.acceptance.observe(2, 2, 2)
    prompt = list(range(100, 160))
    fresh = iter(range(1000, 2000))
    answer = []
    for i in range(0, 50, 2):
        answer += [prompt[i], prompt[i + 1], next(fresh)]
    drafted = decode(pol, "bad", prompt, answer)
    first_off = next(i for i in range(len(drafted)) if not any(drafted[i:]))
    assert sum(1 for d in drafted if d) >= pol.config.judge_after  # it did try
    # ... and stopped within a few drafted steps (one step in three drafts here).
    assert first_off <= 3 * pol.config.judge_after + 3, drafted
    assert pol.states["bad"].paused
    # A request whose answer is its prompt again drafts from its first long match to the end.
    code = list(range(300, 420))
    good = decode(pol, "good", code + [5, 6], code)
    assert not pol.states["good"].paused
    assert len(good) < len(code) / 3  # about six tokens a step
    assert all(d > 0 for d in good[5:-1])


def test_a_paused_request_drafts_again_once_its_text_repeats():
    pol = LookupPolicy(LookupConfig(explore_every=10**9), this_machine_like_curve().seconds)
    for _ in range(30):
        pol.acceptance.observe(2, 2, 2)
    prompt = list(range(100, 220))
    fresh = iter(range(1000, 2000))
    wander = []
    for i in range(0, 40, 2):
        wander += [prompt[i], prompt[i + 1], next(fresh)]
    drafted = decode(pol, "r", prompt, wander)
    assert pol.states["r"].paused  # off while wandering
    assert sum(1 for d in drafted if d) <= pol.config.judge_after + 1
    copy = prompt[50:110]  # then the answer copies 60 tokens of its prompt
    drafted = decode(pol, "r", prompt + wander, copy)
    # Back on once the copied run is longer than probe_match, and then most of the copy
    # arrives as accepted drafts.
    assert pol.states["r"].paused is False
    assert not any(drafted[: pol.config.probe_match - 2])
    assert sum(drafted) >= len(copy) / 2
    pol.forget("r")
    assert "r" not in pol.states


# ---------------------------------------------------------------- through the engine


@pytest.fixture(scope="module")
def fast_llm(tiny_llama_dir):
    return LLM(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.01)


def test_engine_measures_its_step_curve_at_start_up(fast_llm, tiny_llama_dir):
    pol = fast_llm.engine.spec
    assert pol.steps.ready
    cfg = fast_llm.engine.config.speculation
    shapes = step_shapes(cfg.max_batch, cfg.max_draft_tokens)
    assert set(pol.steps.measured(verify=False)) == {r for v, r in shapes if not v}
    assert set(pol.steps.measured(verify=True)) == {r for v, r in shapes if v}
    bm = fast_llm.engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # the timing steps gave their blocks back
    off = LLM(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.01, speculative="off")
    assert not off.engine.spec.steps.ready  # nothing speculates: nothing measured


def test_fast_tier_default_is_token_exact_and_drafts_where_the_answer_repeats(fast_llm):
    base = list(range(40, 90))
    prompts = [base + [7] + base[:10], [5, 6, 7, 8] * 12, list(range(200, 260))]
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    before = fast_llm.engine.spec.stats.draft_tokens.get("fast", 0)
    plain = fast_llm.generate(prompts, params, service_tier="standard")
    fast = fast_llm.generate(prompts, params, service_tier="fast")
    assert [o.token_ids for o in fast] == [o.token_ids for o in plain]
    for p in prompts:  # one at a time too (batch 1)
        [one] = fast_llm.generate([p], params, service_tier="fast")
        [ref] = fast_llm.generate([p], params, service_tier="standard")
        assert one.token_ids == ref.token_ids
    assert fast_llm.engine.spec.stats.draft_tokens.get("fast", 0) > before
    assert fast_llm.engine.spec.lookup.states == {}  # finished requests leave no state


def test_default_model_is_token_exact_on_a_code_edit(default_llm, drafting_always):
    drafting_always(default_llm)
    code = "def area(w, h):\n    result = w * h\n    return result\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
    prompt = default_llm.tokenizer.encode_chat(
        [{"role": "user", "content": "Rename `w` to `width` and return both functions:\n\n```python\n" + code + "```"}]
    )
    stats = default_llm.engine.spec.stats
    before = sum(stats.accepted_tokens.values())
    ref = default_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=80, speculative="off"))[0]
    got = default_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=80, speculative="ngram"))[0]
    assert got.token_ids == ref.token_ids
    assert sum(stats.accepted_tokens.values()) > before  # drafts were made and kept


def test_step_curve_is_made_non_decreasing_in_rows():
    """A start-up measurement on a busy machine can time 2 rows faster than 1; the curve pools
    such runs, so a verify step never looks cheaper than the plain step."""
    c = curve({1: 0.020, 2: 0.012, 3: 0.025, 4: 0.024, 8: 0.040})
    assert c.seconds(1) == pytest.approx(0.016) and c.seconds(2) == pytest.approx(0.016)
    assert c.seconds(3) == pytest.approx(0.0245) and c.seconds(4) == pytest.approx(0.0245)
    assert c.seconds(6) == pytest.approx(0.0245 + 0.0155 / 2)
    assert c.measured()[2] == pytest.approx(0.012)  # the averages themselves are kept
    assert all(c.seconds(r + 1) >= c.seconds(r) for r in range(1, 12))
