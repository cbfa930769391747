"""FastLaneScheduler inside vLLM's own engine, on vLLM's CPU build. Skipped where vLLM is not
installed: run from the vLLM venv (docs/vllm.md, `make vllm-test`).

Each test drives vLLM's `LLMEngine` step by step in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`
and the one-process executor), adding requests at chosen steps, so that a fast request arrives
while standard ones run. The scheduler object is vLLM's, reached through the engine; a recorder
wrapped around its `schedule` notes each step's size. Outputs are greedy and compared token for
token with stock vLLM's for the same requests. The tiny checkpoints come from tests/builders.py;
the embedded model is exported to an HF directory once (cached, about a minute).
"""

from __future__ import annotations

import gc
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: its scheduler is reachable

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.distributed import cleanup_dist_env_and_memory  # noqa: E402

from fastmode.engine.tiers import Tier  # noqa: E402
from tests.builders import build_hf_model  # noqa: E402

pytestmark = pytest.mark.slow
LANE = "fastmode.vllm.FastLaneScheduler"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    # head_dim 64: a size vLLM's CPU attention supports (the builder's default is 16)
    return build_hf_model(
        tmp_path_factory.mktemp("tiny") / "llama",
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=256,
    )


def engine_kwargs(model: Path, lane: dict | None = None, **overrides) -> dict:
    kwargs = dict(
        model=str(model),
        dtype="float32",
        max_model_len=256,
        max_num_seqs=8,
        enforce_eager=True,
        seed=0,
        kv_cache_memory_bytes=16 << 20,
        distributed_executor_backend="uni",
    )
    if lane is not None:
        kwargs.update(scheduler_cls=LANE, additional_config={"fastmode": lane})
    return kwargs | overrides


def run_engine(model: Path, reqs: list[Req], lane: dict | None = None, **overrides) -> Run:
    """A fresh engine (stock vLLM, or with the lane), `reqs` driven to completion, the engine shut
    down. Nothing of it outlives the call: a second engine in this process needs the first gone."""
    llm = LLM(**engine_kwargs(model, lane, **overrides))
    try:
        run = drive(llm, reqs)
        sched = llm.llm_engine.engine_core.engine_core.scheduler
        run.num_kv_blocks = sched.kv_cache_config.num_blocks
        run.num_lane_preemptions = getattr(sched, "num_lane_preemptions", 0)
        return run
    finally:
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()


@dataclass
class Req:
    request_id: str
    prompt: dict  # vLLM prompt: {"prompt_token_ids": [...]} or {"prompt": "..."}
    max_tokens: int
    at_step: int = 0  # added before this engine step
    service_tier: str | None = None
    priority: int = 0
    ignore_eos: bool = True


@dataclass
class Run:
    outputs: dict[str, list[int]] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)  # per schedule() call (lane scheduler only)
    preempted: set[str] = field(default_factory=set)
    num_kv_blocks: int = 0
    num_lane_preemptions: int = 0  # of `preempted`, those the lane made before vLLM's own step


def external(request_id: str) -> str:
    """The id a test gave a request: vLLM's engine appends "-<8 hex digits>" to it internally."""
    return request_id.rsplit("-", 1)[0]


def drive(llm: LLM, reqs: list[Req]) -> Run:
    """Run `reqs` to completion, each added before its `at_step`; record every step."""
    eng = llm.llm_engine
    sched = eng.engine_core.engine_core.scheduler
    run = Run()
    if hasattr(sched, "tier_of"):
        schedule = sched.schedule

        def recorded(*args, **kwargs):
            fast_before = any(sched.tier_of(r) is Tier.FAST for r in sched.running)
            fast_waiting = sched.waiting.num_fast() + sched.kv_holding_waiting.num_fast()
            out = schedule(*args, **kwargs)
            fast_ids = {r.request_id for r in sched.running if sched.tier_of(r) is Tier.FAST}
            run.steps.append(
                {
                    "lane": fast_before or fast_waiting > 0,
                    "num_scheduled": len(out.num_scheduled_tokens),
                    "fast_scheduled": sorted(map(external, set(out.num_scheduled_tokens) & fast_ids)),
                    "paused": [
                        external(r.request_id) for r in sched.running if r.request_id not in out.num_scheduled_tokens
                    ],
                    "paused_blocks": {
                        external(r.request_id): sum(
                            map(len, sched.kv_cache_manager.coordinator.get_blocks(r.request_id))
                        )
                        for r in sched.running
                        if r.request_id not in out.num_scheduled_tokens
                    },
                }
            )
            run.preempted |= set(map(external, out.preempted_req_ids))
            return out

        sched.schedule = recorded
    else:
        schedule = sched.schedule

        def recorded_stock(*args, **kwargs):
            out = schedule(*args, **kwargs)
            run.preempted |= set(map(external, out.preempted_req_ids))
            return out

        sched.schedule = recorded_stock
    pending = sorted(reqs, key=lambda r: r.at_step)
    step = 0
    while pending or eng.has_unfinished_requests():
        while pending and pending[0].at_step <= step:
            r = pending.pop(0)
            extra = {"service_tier": r.service_tier} if r.service_tier else None
            params = SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=r.ignore_eos, extra_args=extra)
            eng.add_request(r.request_id, r.prompt, params, priority=r.priority)
        for out in eng.step():
            if out.finished:
                run.outputs[out.request_id] = list(out.outputs[0].token_ids)
                run.texts[out.request_id] = out.outputs[0].text
        step += 1
        assert step < 5000, "the engine did not finish"
    return run


def ids(i: int, n: int = 6) -> dict:
    return {"prompt_token_ids": [(7 * i + j) % 300 + 20 for j in range(n)]}


def test_lane_caps_the_step_while_fast_work_runs_and_paused_requests_keep_their_kv(tiny):
    reqs = [Req(f"s{i}", ids(i), max_tokens=40) for i in range(6)]
    reqs.append(Req("fast", ids(99), max_tokens=12, at_step=3, service_tier="priority"))
    stock = run_engine(tiny, reqs)
    lane = run_engine(tiny, reqs, lane={"lane_max_batch": 2})

    assert lane.outputs == stock.outputs  # every request, token for token
    in_lane = [i for i, s in enumerate(lane.steps) if s["lane"]]
    assert in_lane, "the fast request never made the lane active"
    assert in_lane == list(range(in_lane[0], in_lane[-1] + 1))  # one stretch, from arrival to finish
    lane_steps = [lane.steps[i] for i in in_lane]
    assert max(s["num_scheduled"] for s in lane_steps) <= 2
    assert all(s["fast_scheduled"] for s in lane_steps)  # admitted at once, then in every step
    # Before it arrived and after it left, the whole batch ran: the cap is the lane's doing.
    assert lane.steps[in_lane[0] - 1]["num_scheduled"] == 6
    assert lane.steps[in_lane[-1] + 1]["num_scheduled"] == 6
    # Those who sat out kept their KV blocks and were never preempted.
    assert all(s["paused"] and all(n > 0 for n in s["paused_blocks"].values()) for s in lane_steps)
    assert not lane.preempted


def test_priority_at_or_below_the_threshold_is_fast_and_standard_rotates(tiny):
    reqs = [Req(f"s{i}", ids(i), max_tokens=30) for i in range(4)]
    reqs.append(Req("fast", ids(50), max_tokens=16, at_step=2, priority=-1))
    lane = run_engine(tiny, reqs, lane={"lane_max_batch": 2, "fast_priority_at_most": -1}, scheduling_policy="priority")
    lane_steps = [s for s in lane.steps if s["lane"]]
    assert lane_steps and all(s["num_scheduled"] == 2 and s["fast_scheduled"] == ["fast"] for s in lane_steps)
    # The one free slot rotates: every standard request moves while the fast one runs.
    moved = {rid for s in lane_steps for rid in ("s0", "s1", "s2", "s3") if rid not in s["paused"]}
    assert moved == {"s0", "s1", "s2", "s3"}


def test_a_fast_arrival_with_every_slot_taken_preempts_flex_first_and_all_finish_exactly(tiny):
    # max_num_seqs binds: stock vLLM would leave the fast request waiting for a slot.
    reqs = [Req("s0", ids(0), 40), Req("x1", ids(1), 40, service_tier="flex"), Req("s2", ids(2), 40)]
    reqs += [Req("x3", ids(3), 40, service_tier="flex"), Req("fast", ids(4), 10, at_step=3, service_tier="fast")]
    stock = run_engine(tiny, reqs, max_num_seqs=4)
    lane = run_engine(tiny, reqs, lane={"lane_max_batch": 2}, max_num_seqs=4)
    assert lane.preempted == {"x3"} and lane.num_lane_preemptions == 1  # the later flex request, by the lane
    assert lane.outputs == stock.outputs  # the preempted one too, recomputed from its tokens
    first_lane = next(s for s in lane.steps if s["lane"])
    assert first_lane["fast_scheduled"] == ["fast"]  # admitted in the step it arrived for


def test_memory_pressure_preempts_paused_standard_before_fast_and_outputs_stay_exact(tiny):
    # 6 KV blocks of 128 tokens for four requests that grow to 2 blocks each, and a fast one that
    # needs a second block mid-way. With a 1-wide lane the fast request is alone in its steps, so
    # vLLM's own rule (preempt the last running request) would preempt the fast request itself.
    block_bytes = 2 * 3 * 1 * 64 * 4 * 128  # K and V, 3 layers, 1 KV head of 64, fp32, 128 tokens
    reqs = [Req(f"s{i}", ids(i, 100), max_tokens=40) for i in range(4)]
    reqs.append(Req("fast", ids(60, 100), max_tokens=40, at_step=10, service_tier="priority"))
    stock = run_engine(tiny, reqs, max_model_len=512)
    lane = run_engine(tiny, reqs, lane={"lane_max_batch": 1}, max_model_len=512, kv_cache_memory_bytes=6 * block_bytes)
    assert lane.num_kv_blocks <= 7
    assert lane.num_lane_preemptions >= 1 and "fast" not in lane.preempted
    assert lane.outputs == stock.outputs  # the preempted ones too, recomputed from their tokens


def test_bad_settings_stop_the_engine_with_a_clear_message(tiny):
    with pytest.raises(Exception, match=r"unknown --additional-config \"fastmode\" setting\(s\) \['lane_width'\]"):
        run_engine(tiny, [], lane={"lane_width": 2})


@pytest.mark.timeout(1800)
def test_embedded_model_greedy_outputs_equal_stock_vllms():
    from transformers import AutoTokenizer

    from fastmode.vllm.export import export_hf_dir

    model = export_hf_dir()
    chats = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "List three primary colors.",
        "Explain KV caches in one sentence.",
        "def fib(n):",
    ]
    tok = AutoTokenizer.from_pretrained(model)
    texts = [
        tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True, tokenize=False)
        for c in chats
    ]
    reqs = [Req(f"s{i}", {"prompt": t}, 24, ignore_eos=False) for i, t in enumerate(texts[1:])]
    reqs.append(Req("fast", {"prompt": texts[0]}, 24, at_step=2, service_tier="priority", ignore_eos=False))
    stock = run_engine(model, reqs, max_model_len=512, kv_cache_memory_bytes=64 << 20)
    lane = run_engine(model, reqs, lane={"lane_max_batch": 2}, max_model_len=512, kv_cache_memory_bytes=64 << 20)
    assert "Paris" in lane.texts["fast"]
    assert lane.outputs == stock.outputs
    assert max(s["num_scheduled"] for s in lane.steps if s["lane"]) <= 2


def test_the_scheduler_class_follows_vllms_async_scheduling_setting():
    from types import SimpleNamespace

    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from fastmode.vllm import AsyncFastLaneScheduler, FastLaneScheduler

    def config(on: bool):
        return SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=on))

    made = FastLaneScheduler.__new__(FastLaneScheduler, vllm_config=config(True))
    assert type(made) is AsyncFastLaneScheduler and isinstance(made, AsyncScheduler)
    assert type(FastLaneScheduler.__new__(FastLaneScheduler, vllm_config=config(False))) is FastLaneScheduler
    # The lane's schedule() wraps AsyncScheduler's bookkeeping, not the other way round.
    mro = AsyncFastLaneScheduler.__mro__
    assert mro.index(FastLaneScheduler) < mro.index(AsyncScheduler)


@pytest.mark.timeout(1800)  # three processes import vLLM: minutes on a busy 2-core machine
def test_openai_server_with_the_plugin_maps_service_tier_and_refuses_unknown_tiers(tiny, tmp_path):
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    # nobind: vLLM's default pins its worker to one core of a small machine, however busy that core is
    env |= {"VLLM_LOGGING_LEVEL": "DEBUG", "PYTHONUNBUFFERED": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny), "--port", str(port)]
    cmd += ["--host", "127.0.0.1", "--dtype", "float32", "--max-model-len", "256", "--enforce-eager"]
    cmd += ["--kv-cache-memory-bytes", str(16 << 20), "--served-model-name", "tiny", "--scheduler-cls", LANE]
    cmd += ["--additional-config", '{"fastmode": {"lane_max_batch": 2}}']
    cmd += ["--middleware", "fastmode.vllm.ServiceTierMiddleware"]
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 1500
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(1)
        assert "fastmode fast lane: lane_max_batch=2" in log_path.read_text()

        def chat(**extra) -> httpx.Response:
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4} | extra
            return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)

        bad = chat(service_tier="scale")
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "service_tier" and "not offered" in bad.json()["error"]["message"]
        assert chat().status_code == 200
        time.sleep(1)
        assert "fast lane opened" not in log_path.read_text()  # standard work never opens it
        fast = chat(service_tier="fast")
        assert fast.status_code == 200 and fast.json()["choices"][0]["message"]["content"] is not None
        time.sleep(1)
        assert "fast lane opened" in log_path.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
