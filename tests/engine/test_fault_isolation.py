"""A step that raises for one request fails that request only: the engine finds it, ends it with
finish_reason "error", frees its KV, and reruns the step without it, so every other request
gets exactly the tokens (and logprobs) it gets when it runs alone.

Faults are injected where they would arise (the model's forward, the per-row sampler, the
detokenizer) and keyed to one request; the engine itself runs unmodified."""

from __future__ import annotations

import pytest

import fastmode.engine.model_runner as model_runner
from fastmode import LLM, SamplingParams
from fastmode.engine.config import EngineConfig
from fastmode.engine.llm_engine import LLMEngine

CULPRIT_TEMPERATURE = 0.777  # marks the request the injected sampler fault hits


@pytest.fixture(scope="module")
def solo(tiny_llama_dir):
    return LLM(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.01)


@pytest.fixture(scope="module")
def solo_runs(solo) -> list[dict]:
    """`jobs()` each run alone, without faults."""
    return reference(solo, jobs())


def make_engine(solo) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model=str(solo.engine.loaded.path), dtype="float32", kv_cache_gib=0.01, max_num_seqs=16),
        loaded=solo.engine.loaded,
    )


def jobs() -> list[tuple[list[int], SamplingParams]]:
    """Eight requests: greedy, seeded sampling, and logprobs, with prompts of different lengths."""
    out = []
    for i in range(8):
        prompt = [(7 * i + 13 * j) % 300 + 3 for j in range(3 + 5 * i)]
        if i % 3 == 0:
            params = SamplingParams(temperature=0, max_tokens=14 + i, ignore_eos=True)
        elif i % 3 == 1:
            params = SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=14 + i, ignore_eos=True)
        else:
            params = SamplingParams(temperature=1.1, seed=200 + i, logprobs=2, max_tokens=14 + i, ignore_eos=True)
        out.append((prompt, params))
    return out


def run(engine: LLMEngine, requests: list[tuple[list[int], SamplingParams]]) -> dict[str, dict]:
    """Run requests together to the end: request id -> finish reason, token ids, logprobs."""
    ids = [engine.add_request(p, sp) for p, sp in requests]
    got: dict[str, dict] = {rid: {"logprobs": []} for rid in ids}
    while engine.has_unfinished():
        for o in engine.step():
            got[o.request_id]["logprobs"] += o.delta_logprobs or []
            if o.finished:
                got[o.request_id].update(finish_reason=o.finish_reason, token_ids=o.token_ids)
    return {rid: got[rid] for rid in ids}


def reference(solo, requests) -> list[dict]:
    """Each request run alone, without faults."""
    return [next(iter(run(solo.engine, [r]).values())) for r in requests]


def all_blocks_free(engine: LLMEngine) -> bool:
    return engine.scheduler.block_manager.num_free_blocks == engine.scheduler_config.num_blocks


def check_survivors(got: dict[str, dict], want: list[dict], culprits: set[int]) -> None:
    for i, g in enumerate(got.values()):
        if i in culprits:
            assert g["finish_reason"] == "error", f"request {i} should have failed"
        else:
            assert g["finish_reason"] == "length", f"request {i} failed with its neighbour"
            assert g["token_ids"] == want[i]["token_ids"], f"request {i} differs from its solo run"
            # Logprobs: the same tokens and alternatives; values to float rounding (a batch's
            # logits may differ from a solo run's in the last bits, with or without a fault).
            got_lp, want_lp = g["logprobs"], want[i]["logprobs"]
            assert [(t.token_id, [a for a, _ in t.top]) for t in got_lp] == [
                (t.token_id, [a for a, _ in t.top]) for t in want_lp
            ], f"request {i}'s logprobs differ from its solo run"
            assert [t.logprob for t in got_lp] == pytest.approx([t.logprob for t in want_lp], abs=1e-4)


def test_a_sampler_fault_fails_only_its_request(solo, solo_runs, monkeypatch):
    requests = jobs()
    culprit = (
        list(range(40, 60)),
        SamplingParams(temperature=CULPRIT_TEMPERATURE, seed=5, max_tokens=30, ignore_eos=True),
    )
    requests.append(culprit)  # last in, so sampled after the seeded requests it shares steps with
    want = [*solo_runs, None]
    engine = make_engine(solo)

    sample_row = model_runner.sample_row
    seen = {"culprit_rows": 0, "drawn_before_fault": []}
    this_run: list[float] = []

    def faulty_sample_row(row, p, gen):
        if p.temperature == CULPRIT_TEMPERATURE:
            seen["culprit_rows"] += 1
            if seen["culprit_rows"] > 4:  # fails mid-generation, after four tokens
                seen["drawn_before_fault"].append(len(this_run))
                raise RuntimeError("injected sampler fault")
        this_run.append(p.temperature)
        return sample_row(row, p, gen)

    execute = engine.runner.execute

    def execute_tracking_draws(out):
        this_run.clear()
        return execute(out)

    monkeypatch.setattr(model_runner, "sample_row", faulty_sample_row)
    monkeypatch.setattr(engine.runner, "execute", execute_tracking_draws)
    got = run(engine, requests)

    check_survivors(got, want, culprits={len(requests) - 1})
    # The fault struck after other requests had drawn random numbers in the same run: the rerun
    # restored their generators (else the seeded requests above would differ).
    assert max(seen["drawn_before_fault"]) > 0
    assert all_blocks_free(engine)
    assert not engine._tracked and not engine.runner.generators and not engine.runner.logprobs

    monkeypatch.setattr(model_runner, "sample_row", sample_row)
    later = run(engine, requests[:2])
    assert [g["token_ids"] for g in later.values()] == [w["token_ids"] for w in want[:2]]
    assert all_blocks_free(engine)


def test_a_model_fault_fails_only_its_request(solo, solo_runs, monkeypatch):
    requests = jobs()
    want = list(solo_runs)
    used = {t for p, _ in requests for t in p} | {t for w in want for t in w["token_ids"]}
    poison = next(t for t in range(3, 384) if t not in used)  # a token no other request ever feeds the model
    culprit = (list(range(20, 45)) + [poison] + [7, 8], SamplingParams(temperature=0, max_tokens=10))
    requests.insert(3, culprit)
    want.insert(3, None)
    engine = make_engine(solo)
    forward = engine.runner.model.forward

    def faulty_forward(input_ids, *args, **kwargs):
        if bool((input_ids == poison).any()):
            raise RuntimeError("injected kernel fault")
        return forward(input_ids, *args, **kwargs)

    monkeypatch.setattr(engine.runner.model, "forward", faulty_forward)
    got = run(engine, requests)
    check_survivors(got, want, culprits={3})
    assert all_blocks_free(engine)
    assert isinstance(engine.last_error, RuntimeError)

    later = run(engine, [requests[0], requests[1]])
    assert [g["token_ids"] for g in later.values()] == [want[0]["token_ids"], want[1]["token_ids"]]


def test_two_faulty_requests_in_one_batch(solo, solo_runs, monkeypatch):
    requests = jobs()
    want = list(solo_runs)
    used = {t for p, _ in requests for t in p} | {t for w in want for t in w["token_ids"]}
    poisons = [t for t in range(3, 384) if t not in used][:2]
    for i, poison in zip((2, 6), poisons):  # two more requests, each feeding the model its own poison token
        requests.insert(i, ([11, 12, 13, poison], SamplingParams(temperature=0, max_tokens=10)))
        want.insert(i, None)
    engine = make_engine(solo)
    forward = engine.runner.model.forward

    def faulty_forward(input_ids, *args, **kwargs):
        if any(bool((input_ids == t).any()) for t in poisons):
            raise RuntimeError("injected kernel fault")
        return forward(input_ids, *args, **kwargs)

    monkeypatch.setattr(engine.runner.model, "forward", faulty_forward)
    got = run(engine, requests)
    check_survivors(got, want, culprits={2, 6})
    assert all_blocks_free(engine)


def test_a_fault_that_does_not_recur_fails_nobody(solo, solo_runs, monkeypatch):
    requests = jobs()
    want = list(solo_runs)
    engine = make_engine(solo)
    execute = engine.runner.execute
    calls = {"n": 0}

    def flaky_execute(out):
        calls["n"] += 1
        if calls["n"] == 6:  # once, whoever is in the step
            raise RuntimeError("injected transient fault")
        return execute(out)

    monkeypatch.setattr(engine.runner, "execute", flaky_execute)
    got = run(engine, requests)
    check_survivors(got, want, culprits=set())
    assert all_blocks_free(engine)


def test_a_fault_everyone_hits_fails_everyone_and_the_engine_recovers(solo, solo_runs, monkeypatch):
    requests = jobs()[:4]
    want = solo_runs[:4]
    engine = make_engine(solo)
    forward = engine.runner.model.forward
    broken = {"on": True}

    def broken_forward(*args, **kwargs):
        if broken["on"]:
            raise RuntimeError("injected fault: the model is broken")
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine.runner.model, "forward", broken_forward)
    got = run(engine, requests)
    assert [g["finish_reason"] for g in got.values()] == ["error"] * 4
    assert all_blocks_free(engine) and not engine.has_unfinished()

    broken["on"] = False
    again = run(engine, requests)
    assert [g["token_ids"] for g in again.values()] == [w["token_ids"] for w in want]


def test_an_output_fault_fails_only_its_request(solo, solo_runs):
    requests = jobs()[:4]
    want = solo_runs[:4]
    engine = make_engine(solo)
    ids = [engine.add_request(p, sp) for p, sp in requests]
    victim = engine._tracked[ids[1]].detok
    add = victim.add
    calls = {"n": 0}

    def faulty_add(token_ids):
        calls["n"] += 1
        if calls["n"] == 3:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected detokenizer fault")
        return add(token_ids)

    victim.add = faulty_add
    got: dict[str, dict] = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                got[o.request_id] = {"finish_reason": o.finish_reason, "token_ids": o.token_ids}
    assert got[ids[1]]["finish_reason"] == "error"
    for i in (0, 2, 3):
        assert got[ids[i]]["token_ids"] == want[i]["token_ids"]
    assert all_blocks_free(engine)
