"""Gemma 3's local (sliding-window) layers keep their KV in a pool of their own that holds only
the blocks a window can still read (engine/window_blocks.py).

The tiny Gemma 3 checkpoint has a window of 8 positions and 5 local layers of 6; blocks here
are 4 tokens and prompts and generations run to ~100 positions, so a sequence's local blocks
are dropped many times over. The engine's parts (Scheduler, ModelRunner) are driven directly,
as LLMEngine.step drives them, so each test can set the pools' sizes and look at them."""

from __future__ import annotations

import pytest
import torch

from fastmode.config import ModelConfig
from fastmode.engine.block_manager import BlockManager
from fastmode.engine.config import EngineConfig, local_blocks_wanted
from fastmode.engine.errors import RequestError
from fastmode.engine.model_runner import ModelRunner
from fastmode.engine.scheduler import Scheduler, SchedulerConfig
from fastmode.engine.sequence import Sequence, Status
from fastmode.engine.window_blocks import WindowedBlockManager
from fastmode.loader import load_model
from fastmode.sampling_params import SamplingParams
from tests.models.test_arch_vs_transformers import hf_greedy
from tests.models.test_llama_vs_transformers import hf_logits

WINDOW, BS = 8, 4
NEW = 48
PROMPTS = [
    list(range(20, 61)),  # 41 tokens: five windows
    [7, 300, 12, 99, 5, 17, 42, 3, 250, 251, 252, 253, 254],
    list(range(100, 130)),
]


def greedy(n: int = NEW) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def gemma(tiny_gemma3_dir):
    loaded = load_model(tiny_gemma3_dir, dtype="float32")
    assert loaded.config.sliding_window == WINDOW and len(loaded.config.sliding_layers) == 5
    return loaded


def engine_parts(loaded, num_blocks=400, num_local_blocks=60, **settings):
    cfg = SchedulerConfig(
        block_size=BS,
        num_blocks=num_blocks,
        max_model_len=512,
        sliding_window=WINDOW if num_local_blocks else None,
        num_local_blocks=num_local_blocks,
        fast_lane_max_batch=None,
        **{"max_num_batched_tokens": 16, **settings},
    )
    sched = Scheduler(cfg, frozenset())
    runner = ModelRunner(loaded.model, num_blocks, BS, torch.float32, num_local_blocks=num_local_blocks)
    return sched, runner


def run(sched, runner, seqs, on_step=None, max_steps=5000) -> dict[str, list[int]]:
    for seq in seqs:
        sched.add(seq)
    for step in range(max_steps):
        if not sched.has_work:
            break
        out = sched.schedule(float(step))
        sampled = runner.execute(out) if out.scheduled else {}
        sched.update_from_output(out, sampled, float(step))
        if on_step is not None:
            on_step(sched, out)
    assert not sched.has_work
    return {s.request_id: s.output_token_ids for s in seqs}


def seqs_for(prompts, params=None, prefix="r"):
    return [Sequence(f"{prefix}{i}", p, params or greedy(), arrival_time_s=float(i)) for i, p in enumerate(prompts)]


def assert_all_free(sched) -> None:
    bm = sched.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not any(bm.ref_count)
    if isinstance(bm, WindowedBlockManager):
        assert bm.num_free_local_blocks == bm.num_local_blocks and not any(bm.local.ref_count)


def test_greedy_matches_transformers_and_one_pool(gemma, tiny_gemma3_dir):
    sched, runner = engine_parts(gemma)
    assert isinstance(sched.block_manager, WindowedBlockManager)
    assert runner.kv_caches[0][0].shape[0] == 60 and runner.kv_caches[5][0].shape[0] == 400  # local, global
    ours = run(sched, runner, seqs_for(PROMPTS))
    assert_all_free(sched)
    one_sched, one_runner = engine_parts(gemma, num_local_blocks=0)
    assert type(one_sched.block_manager) is BlockManager
    one_pool = run(one_sched, one_runner, seqs_for(PROMPTS))
    _, hf = hf_logits(tiny_gemma3_dir, PROMPTS[:1])
    for i, p in enumerate(PROMPTS):
        assert ours[f"r{i}"] == one_pool[f"r{i}"] == hf_greedy(hf, p, NEW), f"prompt {i}"


def test_local_blocks_stay_bounded_while_the_global_table_grows(gemma):
    sched, runner = engine_parts(gemma)
    seq = seqs_for([PROMPTS[0]], greedy(120))[0]
    seen: list[tuple[int, int, int]] = []

    def check(sched, out):
        if seq.status is not Status.RUNNING:
            return
        bm, n = sched.block_manager, seq.num_computed_tokens
        assert len(seq.block_table) == bm.blocks_for(n)  # the global layers keep every position
        held = range(seq.local_block_start, seq.local_block_start + len(seq.local_block_table))
        # Between steps: exactly the blocks a future query's window can read.
        assert held == range(max(0, n - WINDOW + 1) // BS, bm.blocks_for(n))
        seen.append((n, len(seq.block_table), len(seq.local_block_table)))

    run(sched, runner, [seq], on_step=check)
    decoding = [(n, g, loc) for n, g, loc in seen if n > len(PROMPTS[0])]
    assert max(g for _, g, _ in decoding) >= 40  # 160 tokens of context: 40 global blocks
    # A sequence holds the window's blocks: at most ceil((8 - 1) / 4) + 1 = 3.
    assert max(loc for _, _, loc in seen) == 3
    assert_all_free(sched)


def test_batched_equals_solo_and_prefix_hits_stay_exact(gemma):
    sched, runner = engine_parts(gemma)
    batched = run(sched, runner, seqs_for(PROMPTS))
    for i, p in enumerate(PROMPTS):
        solo = run(*engine_parts(gemma), seqs_for([p]))
        assert solo["r0"] == batched[f"r{i}"]

    prefix = list(range(60, 84))  # 24 tokens: 6 full blocks, three windows
    first, second = prefix + [7, 8], prefix + [9, 10, 11]
    sched, runner = engine_parts(gemma)
    run(sched, runner, seqs_for([first], prefix="a"))
    hit = seqs_for([second], prefix="b")[0]
    out = run(sched, runner, [hit])
    assert hit.num_cached_tokens == 24  # the window's local blocks were still cached
    fresh = run(*engine_parts(gemma, enable_prefix_caching=False), seqs_for([second], prefix="b"))
    assert out == fresh
    assert_all_free(sched)


def test_prefix_hit_is_cut_to_what_the_local_pool_still_holds(gemma):
    """Once another request has taken over the local blocks of a cached prefix, only the
    global pool still holds it: the hit is cut back and the output stays exact."""
    sched, runner = engine_parts(gemma, num_local_blocks=12)
    prefix = list(range(60, 92))  # 32 tokens
    run(sched, runner, seqs_for([prefix + [7, 8]], greedy(4), prefix="a"))
    bm = sched.block_manager
    probe = seqs_for([prefix + [9]], prefix="p")[0]
    assert len(bm._prefix_hits(probe)) == 8 and bm.can_admit(probe, 16)[1] == 32
    run(sched, runner, seqs_for([list(range(200, 260))], greedy(4), prefix="c"))  # cycles the local pool
    assert len(bm._prefix_hits(probe)) == 8  # the global blocks are still cached...
    assert bm.can_admit(probe, 16)[1] < 32  # ...but the local window before them is not
    hit = seqs_for([prefix + [9, 10]], prefix="b")[0]
    out = run(sched, runner, [hit])
    assert hit.num_cached_tokens < 32
    fresh = run(*engine_parts(gemma, enable_prefix_caching=False), seqs_for([prefix + [9, 10]], prefix="b"))
    assert out == fresh
    assert_all_free(sched)


def test_finish_and_abort_return_every_block(gemma):
    sched, runner = engine_parts(gemma, num_local_blocks=16, max_num_batched_tokens=32)
    run(sched, runner, seqs_for(PROMPTS))
    assert_all_free(sched)

    sched, runner = engine_parts(gemma, num_local_blocks=16)
    seqs = seqs_for(PROMPTS, prefix="x")
    for seq in seqs:
        sched.add(seq)
    for step in range(12):
        out = sched.schedule(float(step))
        sched.update_from_output(out, runner.execute(out), float(step))
    assert any(s.local_block_table for s in seqs)
    for seq in seqs:
        sched.abort(seq.request_id, 99.0)
    assert_all_free(sched)


def test_preemption_when_the_local_pool_runs_out(gemma):
    """Local blocks run out before global ones: the scheduler preempts and recomputes, exactly."""
    sched, runner = engine_parts(gemma, num_local_blocks=9, max_num_batched_tokens=8)
    seqs = seqs_for(PROMPTS)
    outs = run(sched, runner, seqs)
    assert sched.num_preemptions > 0
    for i, p in enumerate(PROMPTS):
        assert outs[f"r{i}"] == run(*engine_parts(gemma), seqs_for([p]))["r0"]
    assert_all_free(sched)


def test_admission_waits_for_local_blocks():
    cfg = SchedulerConfig(
        block_size=BS,
        num_blocks=1000,
        max_model_len=512,
        sliding_window=WINDOW,
        num_local_blocks=10,
        max_num_batched_tokens=64,
        fast_lane_max_batch=None,
    )
    sched = Scheduler(cfg)
    seqs = seqs_for([list(range(i * 20, i * 20 + 16)) for i in range(3)])
    for seq in seqs:
        sched.add(seq)
    out = sched.schedule(0.0)
    # Each 16-token prompt needs 4 local blocks at once: two fit in 10, the third waits.
    assert [s.seq.request_id for s in out.scheduled] == ["r0", "r1"]
    assert seqs[2].status is Status.WAITING and not seqs[2].local_block_table
    assert sched.block_manager.num_free_local_blocks == 2
    assert sched.block_manager.num_free_blocks == 1000 - 8  # the global pool had room
    # After the step each keeps only its window's blocks (positions 9..15: blocks 2 and 3),
    # which makes room for the third.
    sched.update_from_output(out, {"r0": [1], "r1": [1]}, 0.0)
    assert [len(s.local_block_table) for s in seqs[:2]] == [2, 2]
    assert sched.block_manager.num_free_local_blocks == 6
    out = sched.schedule(1.0)
    assert [s.seq.request_id for s in out.scheduled] == ["r0", "r1", "r2"]
    assert sched.block_manager.num_free_local_blocks == 0


def test_a_prompt_the_local_pool_can_never_hold_is_refused():
    cfg = SchedulerConfig(block_size=BS, num_blocks=1000, max_model_len=512, sliding_window=WINDOW, num_local_blocks=5)
    sched = Scheduler(cfg)
    sched.check_prompt_len(15)  # 16 tokens: 4 blocks
    with pytest.raises(RequestError, match="never fit in the KV cache"):
        sched.check_prompt_len(100)


def test_kv_memory_of_a_long_context():
    """KV bytes one 4096-token sequence holds on a Gemma-3-shaped config (26 layers, 22 of them
    local with a 512-position window; 1 KV head of 256, fp16), before and after."""
    bs, window, ctx, layers, local_layers = 16, 512, 4096, 26, 22
    layer_block_bytes = 2 * 1 * 256 * 2 * bs  # K and V, one layer, one block
    bm = WindowedBlockManager(10_000, bs, window, 10_000, max_chunk_tokens=512)
    seq = Sequence("long", [1] * ctx, greedy(1))
    assert bm.allocate(seq, 512)
    while seq.num_computed_tokens < ctx:  # chunked prefill, as the scheduler runs it
        seq.num_computed_tokens += 512
        if seq.num_computed_tokens < ctx:
            assert bm.allocate(seq, 512)
    seq.num_computed_tokens = ctx - 1
    assert bm.allocate(seq, 1)  # the decode step after the prompt
    before = bm.blocks_for(ctx) * layers * layer_block_bytes
    after = (len(seq.block_table) * (layers - local_layers) + len(seq.local_block_table) * local_layers) * (
        layer_block_bytes
    )
    assert len(seq.block_table) == 256 and len(seq.local_block_table) <= 33
    assert after < before / 3
    bm.free(seq)
    assert bm.num_free_blocks == 10_000 and bm.num_free_local_blocks == 10_000


def test_speculative_verification_with_rejected_drafts_stays_exact(gemma):
    """Multi-token verification steps write local KV for drafts and roll back the rejected
    ones (`truncate` on both pools); the output is the one-pool engine's, token for token."""
    reference = run(*engine_parts(gemma, num_local_blocks=0), seqs_for(PROMPTS))
    sched, runner = engine_parts(gemma)
    seqs = seqs_for(PROMPTS)
    for seq in seqs:
        sched.add(seq)
    accepted = 0
    for step in range(2000):
        if not sched.has_work:
            break
        for seq in sched.running:  # drafts: the right continuation, its 3rd token wrong
            if not seq.is_prefilling:
                ref = reference[seq.request_id][seq.num_output_tokens :][:5]
                seq.draft_token_ids = [t if i != 2 else (t + 1) % 384 for i, t in enumerate(ref)]
        out = sched.schedule(float(step))
        sched.update_from_output(out, runner.execute(out), float(step))
        accepted += sum(s.num_accepted_drafts for s in out.scheduled)
    assert {s.request_id: s.output_token_ids for s in seqs} == reference
    assert accepted > NEW  # drafts were verified and kept, two per step
    assert_all_free(sched)


def _gemma_like(num_layers: int = 26, window: int = 512) -> ModelConfig:
    """Gemma 3 1B's KV shape: 26 layers, every sixth global, one KV head of 256."""
    return ModelConfig(
        architecture="gemma3",
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=1,
        head_dim=256,
        max_position_embeddings=32768,
        sliding_window=window,
        sliding_layers=tuple(i for i in range(num_layers) if i % 6 != 5),
    )


def test_engine_config_splits_the_kv_budget_between_the_pools():
    model = _gemma_like()
    per_token = model.kv_bytes_per_token(2)
    cfg = EngineConfig(kv_cache_gib=2.0, block_size=16)
    one_pool = cfg.scheduler_config(per_token, model.max_position_embeddings)
    split = cfg.scheduler_config(per_token, model.max_position_embeddings, model=model)
    assert one_pool.num_local_blocks == 0 and one_pool.sliding_window is None
    wanted = local_blocks_wanted(512, 16, 64, 512)
    assert split.num_local_blocks == wanted == 64 * 34 + 32 and split.sliding_window == 512
    layer_block = per_token // 26 * 16
    used = (split.num_blocks * 4 + split.num_local_blocks * 22) * layer_block
    assert used <= 2 * 2**30 < used + 4 * layer_block  # the whole budget, to a block
    assert split.num_blocks > 4 * one_pool.num_blocks  # four times the context for the global layers
    off = EngineConfig(kv_cache_gib=2.0, block_size=16, local_kv_pool=False)
    assert off.scheduler_config(per_token, 32768, model=model) == one_pool
    # A budget too small for every sequence's window: the local pool is as large as one pool
    # would be, so no workload that fits one pool is refused.
    small = EngineConfig(kv_cache_gib=0.25, block_size=16).scheduler_config(per_token, 32768, model=model)
    tiny_one = EngineConfig(kv_cache_gib=0.25, block_size=16).scheduler_config(per_token, 32768)
    assert small.num_local_blocks == tiny_one.num_blocks and small.num_blocks >= tiny_one.num_blocks
    llama = ModelConfig(
        architecture="llama",
        vocab_size=10,
        hidden_size=8,
        intermediate_size=8,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
    )
    assert EngineConfig().scheduler_config(per_token, 32768, model=llama) == EngineConfig().scheduler_config(
        per_token, 32768
    )


def test_llm_serves_gemma_with_the_local_pool(tiny_gemma3_dir):
    """Through the public API: EngineConfig sizes the local pool from the model, the runner's
    local layers use it, and the output is transformers' and the one-pool engine's."""
    from fastmode import LLM

    llm = LLM(model=str(tiny_gemma3_dir), dtype="float32", kv_cache_gib=0.01, block_size=BS)
    engine = llm.engine
    bm = engine.scheduler.block_manager
    assert isinstance(bm, WindowedBlockManager) and bm.window == WINDOW
    assert engine.runner.kv_caches[0][0].shape[0] == bm.num_local_blocks < bm.num_blocks
    assert engine.runner.kv_caches[5][0].shape[0] == bm.num_blocks
    one_pool = LLM(model=str(tiny_gemma3_dir), dtype="float32", kv_cache_gib=0.01, block_size=BS, local_kv_pool=False)
    assert type(one_pool.engine.scheduler.block_manager) is BlockManager
    assert bm.num_blocks > one_pool.engine.scheduler_config.num_blocks  # room for longer contexts
    params = greedy(64)
    ours = [o.token_ids for o in llm.generate(PROMPTS, params)]
    assert ours == [o.token_ids for o in one_pool.generate(PROMPTS, params)]
    _, hf = hf_logits(tiny_gemma3_dir, PROMPTS[:1])
    assert ours[0] == hf_greedy(hf, PROMPTS[0], 64)
    assert_all_free(engine.scheduler)
