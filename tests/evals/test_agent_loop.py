"""The agent loop against a live server: the embedded SmolLM2-135M-Instruct and its
shipped Spark student on 127.0.0.1, spoken to over HTTP as `fastmode eval --agent`
does. The model's choices are not asserted (it is a 135M model); what is asserted
is that what the loop records is what happened: the sandbox's state is the replay
of the kept calls, each step's score is the scorer's verdict on that call, the
served tier and the metered usage come from the server, and the verifier keeps a
call only once the sandbox accepts it or the retries are spent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from fastmode.evals.agent.loop import RouteRequest, run_task
from fastmode.evals.agent.routes import ROUTES, BackgroundLoad, served_models, server_process
from fastmode.evals.agent.tasks import AgentTask, Call, load_agent_tasks, replay, score, step_is_right
from fastmode.loader import load_model
from tests.server.conftest import RunningServer, serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def live() -> Iterator[RunningServer]:
    """The embedded model and, as `fastmode serve` does, its Spark student beside it."""
    from fastmode.distill.spark import find_spark, spark_as_loaded
    from fastmode.loader.default_model import DEFAULT_MODEL_NAME

    main = load_model(None, "float32")
    path = find_spark(DEFAULT_MODEL_NAME)
    extra = [spark_as_loaded(path, main)] if path is not None else []
    with serve(main, extra=extra, kv_cache_gib=0.25) as s:
        yield s


@pytest.fixture
def client(live) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=300.0) as c:
        yield c


def _check_record(task: AgentTask, rec, route: RouteRequest) -> None:
    kept = [Call(s.name, s.arguments) for s in rec.steps if s.name and s.arguments is not None]
    world, answer, _ = replay(task, kept)
    assert (rec.answer_ok, rec.state_ok) == score(task, world, answer)
    assert rec.solved == (rec.answer_ok and rec.state_ok)
    assert len(rec.steps) <= task.steps + 2
    # Scored while on the reference path, then None from the first wrong step on.
    w, on_path = task.start(), True
    for s in rec.steps:
        call = Call(s.name, s.arguments) if s.name and s.arguments is not None else None
        if on_path:
            assert s.right == (call is not None and step_is_right(task, w, call, s.turn))
            on_path = bool(s.right)
        else:
            assert s.right is None
        if call is not None and call.name != "answer":
            w.call(call.name, call.arguments)
        for a in s.attempts:
            assert a.completion_tokens > 0 and a.prompt_tokens > 0 and a.latency_s > 0
            assert a.cost_usd > 0 and a.machine_s > 0
            assert a.service_tier == route.service_tier


@pytest.mark.parametrize("route_name", ["standard", "fast", "fast-ngram", "spark"])
def test_loop_records_what_happened(live, client, route_name):
    models = served_models(client)
    route = ROUTES[route_name]
    if route.model not in models:
        pytest.skip("no Spark weights shipped")
    request = route.request(models, retries=0)
    for task in load_agent_tasks(ids=["agent-005", "agent-013"]):
        rec = run_task(client, request, task, route_name=route_name)
        assert rec.error is None and rec.route == route_name and rec.n == task.steps
        _check_record(task, rec, request)
    assert live.wait_idle()


def test_verifier_retries_what_the_sandbox_rejects(live, client):
    # An empty store: every `get` is refused, so a get is retried until the retries run out.
    task = AgentTask(
        id="no-keys",
        steps=2,
        prompt="Get the value of the key plum, then call answer with that value.",
        tools=("get", "answer"),
        world={"files": {}, "kv": {}},
        reference=(Call("get", {"key": "plum"}), Call("answer", {"value": "41"})),
        answer="41",
        changes={},
    )
    request = RouteRequest(model=served_models(client)["main"], retries=2)
    rec = run_task(client, request, task, seed=7, extra_turns=0)
    assert rec.error is None and not rec.solved
    assert rec.steps, "the first turn always runs"
    for s in rec.steps:
        assert 1 <= len(s.attempts) <= 3
        *rejected, kept = s.attempts
        assert kept.accepted and not any(a.accepted for a in rejected)
        for a in rejected:  # refused by the sandbox or an empty answer
            assert a.observation.startswith("error:") or (a.name == "answer" and not a.arguments["value"].strip())
        if kept.name == "get":  # a get can never be accepted here: all retries were spent
            assert len(s.attempts) == 3 and not s.ok
    _check_record(task, rec, request)


def test_background_load_runs_standard_requests(live, client):
    import time

    model = served_models(client)["main"]
    with BackgroundLoad(live.url, model, streams=1, max_tokens=8) as load:
        deadline = time.monotonic() + 60
        while load.completed < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert load.completed >= 2 and load.errors == 0
    assert live.wait_idle()


def test_eval_agent_command_writes_json_plot_and_feeds_chain(live, tmp_path, capsys):
    from fastmode.cli import main

    out, png = tmp_path / "agent.json", tmp_path / "agent.png"
    argv = ["eval", "--agent", "--url", live.url, "--tasks", "agent-001,agent-005", "--load", "1"]
    assert main([*argv, "--json", str(out), "--plot", str(png), "--retries", "1"]) == 0
    table = capsys.readouterr().out
    assert "per-step accuracy p" in table and "time to correct result" in table
    doc = json.loads(out.read_text())
    names = [r["route"] for r in doc["routes"]]
    assert names[:3] == ["standard", "fast", "fast-ngram"]
    for r in doc["routes"]:
        assert r["num_tasks"] == 2 and [t["task_id"] for t in r["tasks"]] == ["agent-001", "agent-005"]
        assert r["p_step"]["total"] >= 2  # at least the first step of each task is scored
        assert set(r["by_n"]) == {"1", "2"}
    assert doc["run"]["complete"] is True and doc["run"]["background_load"]["completed"] >= 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert main(["chain", "--from-agent-eval", str(out), "--json", "--steps", "4"]) == 0
    chain = json.loads(capsys.readouterr().out)
    priced = {m["name"]: m for m in chain["modes"]}
    for r in doc["routes"]:
        if r["chain_inputs"]["p_step"] > 0:
            assert priced[r["route"]]["p_step"] == pytest.approx(r["p_step"]["accuracy"])
        else:
            assert r["route"] not in priced and any(n.startswith(r["route"]) for n in chain["notes"])


def test_server_process_starts_and_stops_fastmode_serve():
    with server_process(["--no-serve-spark", "--kv-cache-gib", "0.1"]) as url:
        with httpx.Client(base_url=url, timeout=60) as c:
            assert list(served_models(c)) == ["main"]
    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/health", timeout=2)
