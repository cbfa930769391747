"""Many concurrent requests give the same tokens as each request alone."""

from __future__ import annotations

import random

from fastmode import LLM, SamplingParams
from fastmode.engine.config import EngineConfig
from fastmode.engine.llm_engine import LLMEngine


def alone(llm, prompt, params):
    return llm.generate([prompt], params)[0].token_ids


def test_staggered_mixed_tier_requests_match_solo_runs(tiny_llama_dir):
    rng = random.Random(0)
    solo = LLM(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.01)
    # A small KV cache (40 blocks of 4 tokens, fp16 K/V at 384 bytes a token) and lane cap force
    # pausing, chunking and preemption.
    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_llama_dir),
            dtype="float32",
            kv_cache_gib=40 * 4 * 384 / 2**30,
            block_size=4,
            max_num_seqs=6,
            max_num_batched_tokens=24,
            fast_lane_max_batch=2,
        ),
        loaded=solo.engine.loaded,
    )
    assert engine.scheduler_config.num_blocks == 40
    jobs = []
    for i in range(12):
        prompt = [rng.randrange(3, 380) for _ in range(rng.randrange(1, 40))]
        greedy = i % 3 != 0
        params = SamplingParams(
            temperature=0 if greedy else 0.8,
            seed=None if greedy else 100 + i,
            max_tokens=rng.randrange(5, 30),
            ignore_eos=True,
        )
        jobs.append((prompt, params, ["fast", "standard", "flex"][i % 3]))
    want = [alone(solo, p, sp) for p, sp, _ in jobs]

    got: dict[str, list[int]] = {}
    pending = list(enumerate(jobs))
    ids = {}
    step = 0
    while pending or engine.has_unfinished():
        # Arrivals at different times: two new requests every third step.
        if pending and step % 3 == 0:
            for _ in range(2):
                if pending:
                    i, (p, sp, tier) = pending.pop(0)
                    ids[engine.add_request(p, sp, tier)] = i
        for o in engine.step():
            if o.finished:
                got[o.request_id] = o.token_ids
        step += 1
    assert engine.scheduler.num_preemptions > 0  # the test exercised recompute after preemption
    for rid, i in ids.items():
        assert got[rid] == want[i], f"request {i} ({jobs[i][2]}) differs"
    assert engine.scheduler.block_manager.num_free_blocks == 40
