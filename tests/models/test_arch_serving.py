"""Serving invariants on every architecture: a request's greedy output is the same batched as
alone, and the same with its prompt's prefix read from the prefix cache as computed afresh."""

from __future__ import annotations

import pytest

from fastmode import LLM, SamplingParams

ARCHITECTURES = ["tiny_llama_dir", "tiny_qwen2_dir", "tiny_qwen3_dir", "tiny_gemma3_dir"]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [
    [5, 17, 42, 99, 3],
    list(range(30, 57)),
    [100],
    [250, 251, 252, 253, 254, 255, 256, 257, 258, 259, 260, 261, 262],
]


@pytest.mark.parametrize("fixture", ARCHITECTURES)
def test_batched_equals_solo(request, fixture):
    llm = LLM(model=str(request.getfixturevalue(fixture)), dtype="float32", kv_cache_gib=0.01, block_size=4)
    batched = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    solo = [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]
    assert batched == solo
    assert llm.engine.scheduler.block_manager.num_free_blocks == llm.engine.scheduler_config.num_blocks


@pytest.mark.parametrize("fixture", ARCHITECTURES)
def test_prefix_cache_hit_equals_fresh_prefill(request, fixture):
    path = str(request.getfixturevalue(fixture))
    prefix = list(range(60, 84))  # 24 tokens: 6 full blocks of 4, three Gemma windows
    first, second = prefix + [7, 8], prefix + [9, 10, 11]
    cached = LLM(model=path, dtype="float32", kv_cache_gib=0.01, block_size=4)
    cached.generate([first], GREEDY)
    hit = cached.generate([second], GREEDY)[0]
    assert hit.metrics.cached_tokens >= 20
    fresh = LLM(model=path, dtype="float32", kv_cache_gib=0.01, block_size=4, enable_prefix_caching=False)
    assert hit.token_ids == fresh.generate([second], GREEDY)[0].token_ids
