"""AsyncEngine: requests reach the engine thread through an inbox, never by waiting for a step."""

from __future__ import annotations

import asyncio
import time

import pytest

from fastmode import LLM, SamplingParams
from fastmode.engine.async_engine import AsyncEngine
from fastmode.engine.config import EngineConfig
from fastmode.engine.llm_engine import LLMEngine

PROMPTS = [[5, 17, 42, 99, 3], list(range(7, 40)), [100], list(range(200, 260))]


@pytest.fixture(scope="module")
def solo(tiny_llama_dir):
    return LLM(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.01)


@pytest.fixture
def running(tiny_llama_dir, solo):
    engine = LLMEngine(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.01), loaded=solo.engine.loaded
    )
    ae = AsyncEngine(engine, "tiny")
    yield ae
    ae.shutdown()


def all_free(engine: LLMEngine) -> bool:
    return engine.scheduler.block_manager.num_free_blocks == engine.scheduler_config.num_blocks


def wait_for(cond, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


async def collect(ae: AsyncEngine, prompt, params) -> list[int]:
    last = None
    async for o in ae.generate(prompt, params):
        last = o
    assert last is not None and last.finished
    return last.token_ids


def test_concurrent_streams_match_offline_generation(running, solo):
    params = [SamplingParams(temperature=0, max_tokens=12 + i, ignore_eos=True) for i in range(len(PROMPTS))]
    want = [o.token_ids for o in solo.generate(PROMPTS, params)]

    async def main():
        return await asyncio.gather(*[collect(running, p, sp) for p, sp in zip(PROMPTS, params)])

    assert asyncio.run(main()) == want
    stats = running.stats()  # published by the engine thread after the step that finished the last one
    assert stats.kv_usage == 0 and sum(stats.running.values()) == 0 and sum(stats.waiting.values()) == 0
    assert all_free(running.engine)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [([], "prompt is empty"), ([10**9], "token ids must be in"), (list(range(3, 100)) * 100, "context limit")],
)
def test_bad_request_raises_on_the_callers_thread_and_queues_nothing(running, prompt, message):
    async def add():
        return running.add_request(prompt, SamplingParams(max_tokens=4))

    with pytest.raises(ValueError, match=message):
        asyncio.run(add())
    assert not running._queues and not running._inbox
    assert not running.engine.has_unfinished()


def test_duplicate_request_id_is_refused(running):
    async def main():
        running.add_request([5, 6, 7], SamplingParams(max_tokens=64, ignore_eos=True), request_id="same")
        with pytest.raises(ValueError, match="duplicate request id"):
            running.add_request([5, 6, 7], SamplingParams(max_tokens=4), request_id="same")
        running.abort("same")

    asyncio.run(main())
    assert wait_for(lambda: not running.engine.has_unfinished() and all_free(running.engine))


def test_abort_right_after_add_frees_everything(running):
    """The abort follows the add through the inbox, in order: the request never leaks its blocks."""

    async def main():
        rids = [running.add_request(p, SamplingParams(max_tokens=200, ignore_eos=True)) for p in PROMPTS]
        for rid in rids:
            running.abort(rid)

    asyncio.run(main())
    assert wait_for(lambda: not running.engine.has_unfinished() and all_free(running.engine))
    assert wait_for(lambda: running.stats().kv_usage == 0)


def test_a_stream_left_early_aborts_its_request(running):
    async def main():
        agen = running.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
        first = await agen.__anext__()
        await agen.aclose()  # the client went away
        return first

    first = asyncio.run(main())
    assert not first.finished
    assert wait_for(lambda: not running.engine.has_unfinished() and all_free(running.engine))


def test_shutdown_fails_requests_in_flight_and_refuses_new_ones(tiny_llama_dir, solo):
    from fastmode.engine.async_engine import EngineClosedError

    engine = LLMEngine(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.01), loaded=solo.engine.loaded
    )
    ae = AsyncEngine(engine, "tiny")

    async def main():
        agen = ae.generate(PROMPTS[3], SamplingParams(temperature=0, max_tokens=5000, ignore_eos=True))
        await agen.__anext__()
        await asyncio.get_running_loop().run_in_executor(None, ae.shutdown)
        with pytest.raises(EngineClosedError):
            async for _ in agen:
                pass
        with pytest.raises(EngineClosedError):
            ae.add_request([5, 6], SamplingParams(max_tokens=2))

    asyncio.run(main())
    assert not engine.has_unfinished() and all_free(engine)
