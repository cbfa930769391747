"""One agent run of a task, over the Chat Completions API with tools, as a user's agent runs.

Each turn sends the whole conversation with the task's tools, `tool_choice`
"required" (every step is a call; the last one is `answer`) and one call per
turn, reads the call from `choices[0].message.tool_calls`, runs it in the
sandbox and sends the observation back as a `tool` message. Three worked
errands (`DEMONSTRATION`) come before the task. The run ends at the `answer`
call, when a turn brings no call back (cut off by the token limit), when the
agent makes the same call twice in a row (it is stuck: the world answers the
same again), or after the reference's length plus `extra_turns` calls.

With a verifier (`retries` > 0) a call the sandbox refuses (an "error:"
observation), a call that repeats an earlier one word for word (the world is
deterministic, so it cannot tell the agent anything new) or a turn without a
call is not kept: the same turn is asked again, sampled (temperature
`retry_temperature`, a seed derived from the task, turn and attempt so every
route and run sees the same seeds), up to `retries` times; the last attempt is
kept whatever it is. The verifier sees only what a real agent's harness sees:
the sandbox's answer, never the reference solution.

Each step is scored against the reference while the run is still on it: right
when the kept call has the reference step's effect (`tasks.step_is_right`).
After the first wrong step the run is off the reference path and later steps
are not scored, so the per-step accuracy is the chance of a right step given a
right history, the p of p^n.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

from fastmode.evals.agent.tasks import AgentTask, Call, score, step_is_right
from fastmode.evals.agent.world import ANSWER_TOOL, World

SYSTEM_PROMPT = (
    "You do tasks by calling tools, one call at a time. Use the exact values the tools return. "
    "When the task is done, call answer."
)
# Worked errands shown before the task, as earlier turns of the conversation: a 135M model
# follows a shown pattern (call, read the result, use it in the next call) far more often
# than a described one. Each shows one way a result feeds the next call: a file naming a
# key, a number computed on and stored, a chain of keys followed to its end. Their key and file
# names occur in no task. An errand ends at its answer call, with no result after it,
# as a real run does.
DEMO_ERRANDS: tuple[tuple[str, tuple[tuple[str, dict, str | None], ...]], ...] = (
    (
        "Call read_file with the path docs/note.txt; it returns the name of a key. Call get with that key. "
        "Then call answer with the value get returns.",
        (
            ("read_file", {"path": "docs/note.txt"}, "sun"),
            ("get", {"key": "sun"}, "17"),
            ("answer", {"value": "17"}, None),
        ),
    ),
    (
        "Call get with the key width. Call multiply with that value and 3. Call put with the key area and the "
        "product. Then call answer with the product.",
        (
            ("get", {"key": "width"}, "12"),
            ("multiply", {"a": 12, "b": 3}, "36"),
            ("put", {"key": "area", "value": "36"}, "36"),
            ("answer", {"value": "36"}, None),
        ),
    ),
    (
        "Call get with the key moon. While get returns a word, call get with that word. When get returns a "
        "number, stop getting. Then call answer with that number.",
        (
            ("get", {"key": "moon"}, "star"),
            ("get", {"key": "star"}, "sky"),
            ("get", {"key": "sky"}, "rain"),
            ("get", {"key": "rain"}, "8"),
            ("answer", {"value": "8"}, None),
        ),
    ),
)


def demonstration(errands=DEMO_ERRANDS) -> list[dict]:
    """The errands as Chat Completions messages: a user turn, then each call and its result."""
    messages: list[dict] = []
    for prompt, calls in errands:
        messages.append({"role": "user", "content": prompt})
        for name, args, result in calls:
            call_id = f"demo_{len(messages)}"
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            if result is not None:
                messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
    return messages


DEMONSTRATION: list[dict] = demonstration()
MAX_TOKENS_PER_TURN = 128  # a call is 15-40 tokens; two strings at their 48-character bound stay under it


@dataclass(frozen=True)
class RouteRequest:
    """What a route puts in every request: the model, the tier and the speculative mode."""

    model: str
    service_tier: str = "default"
    speculative: str = "off"
    retries: int = 0  # verifier-and-retry: extra attempts per step the sandbox rejects
    retry_temperature: float = 0.7


@dataclass
class Attempt:
    """One request of a step: what came back and what it cost."""

    name: str | None
    arguments: dict | None
    observation: str
    accepted: bool  # the verifier kept it (always true without a verifier)
    latency_s: float
    ttft_s: float | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    machine_s: float
    service_tier: str | None
    finish_reason: str | None


@dataclass
class StepRecord:
    """One turn of the run; its cost and time are those of all its attempts."""

    turn: int
    name: str | None
    arguments: dict | None
    observation: str
    ok: bool  # the sandbox accepted the kept call (an answer counts as accepted)
    right: bool | None  # has the reference step's effect; None once the run left the reference path
    first_right: bool | None  # the first attempt was right (same as `right` without retries)
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def latency_s(self) -> float:
        return sum(a.latency_s for a in self.attempts)

    @property
    def cost_usd(self) -> float:
        return sum(a.cost_usd for a in self.attempts)


@dataclass
class TaskRecord:
    """A finished run of one task on one route."""

    task_id: str
    family: str
    n: int  # the reference's chain length
    route: str
    solved: bool
    answer_ok: bool
    state_ok: bool
    answer: str | None
    wall_s: float
    steps: list[StepRecord]
    error: str | None = None  # an HTTP or protocol failure that ended the run

    def totals(self) -> dict[str, float]:
        attempts = [a for s in self.steps for a in s.attempts]
        return {
            "requests": len(attempts),
            "retries": sum(len(s.attempts) - 1 for s in self.steps),
            "cost_usd": sum(a.cost_usd for a in attempts),
            "machine_s": sum(a.machine_s for a in attempts),
            "prompt_tokens": sum(a.prompt_tokens for a in attempts),
            "completion_tokens": sum(a.completion_tokens for a in attempts),
            "request_s": sum(a.latency_s for a in attempts),
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(self.totals())
        return d


class ProtocolError(RuntimeError):
    """The server answered something the loop cannot continue from (an HTTP error, a bad body)."""


def retry_seed(seed: int, task_id: str, turn: int, attempt: int) -> int:
    """The sampling seed of a retry: fixed by the run's seed, the task, the turn and the attempt."""
    return (seed * 1_000_003 + zlib.crc32(f"{task_id}/{turn}/{attempt}".encode())) % (2**31)


def _parse_call(message: dict) -> tuple[str | None, dict | None]:
    calls = message.get("tool_calls") or []
    if not calls:
        return None, None
    fn = calls[0].get("function") or {}
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except json.JSONDecodeError:
        return fn.get("name"), None
    return fn.get("name"), args if isinstance(args, dict) else None


def _request(client: Any, route: RouteRequest, task: AgentTask, messages: list[dict], sampling: dict) -> dict:
    body = {
        "model": route.model,
        "messages": messages,
        "tools": task.openai_tools(),
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": MAX_TOKENS_PER_TURN,
        "service_tier": route.service_tier,
        "speculative": route.speculative,
        **sampling,
    }
    r = client.post("/v1/chat/completions", json=body)
    if r.status_code != 200:
        raise ProtocolError(f"HTTP {r.status_code}: {r.text[:300]}")
    return r.json()


def _attempt(
    client: Any, route: RouteRequest, task: AgentTask, messages: list[dict], world: World, sampling: dict
) -> Attempt:
    start = time.perf_counter()
    data = _request(client, route, task, messages, sampling)
    latency = time.perf_counter() - start
    choice = (data.get("choices") or [{}])[0]
    usage = data.get("usage") or {}
    name, args = _parse_call(choice.get("message") or {})
    if name is None:
        observation = "error: no tool call came back"
    elif args is None:
        observation = "error: the arguments are not a JSON object"
    elif name == ANSWER_TOOL:
        observation = ""
    else:
        observation = world.copy().call(name, args).text  # run for real once the attempt is kept
    return Attempt(
        name=name,
        arguments=args,
        observation=observation,
        accepted=True,
        latency_s=latency,
        ttft_s=usage.get("time_to_first_token_seconds"),
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", 0)),
        cost_usd=float(usage.get("cost_usd", 0.0)),
        machine_s=float(usage.get("machine_seconds", 0.0)),
        service_tier=data.get("service_tier"),
        finish_reason=choice.get("finish_reason"),
    )


def _rejected(a: Attempt, earlier: list[tuple[str, str]]) -> bool:
    """The verifier's verdict: refused by the sandbox, no call, an empty answer, or a repeat."""
    if a.name is None or a.arguments is None or a.observation.startswith("error:"):
        return True
    if a.name == ANSWER_TOOL:
        return not str(a.arguments.get("value", "")).strip()
    return (a.name, json.dumps(a.arguments, sort_keys=True)) in earlier


def run_task(
    client: Any, route: RouteRequest, task: AgentTask, *, route_name: str = "", seed: int = 0, extra_turns: int = 2
) -> TaskRecord:
    """Run `task` once on `route` through `client` (an httpx.Client on the server's base URL)."""
    world = task.start()
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        *DEMONSTRATION,
        {"role": "user", "content": task.prompt},
    ]
    steps: list[StepRecord] = []
    earlier: list[tuple[str, str]] = []
    on_path = True
    answer: str | None = None
    error: str | None = None
    start = time.perf_counter()
    try:
        for turn in range(task.steps + extra_turns):
            attempts: list[Attempt] = []
            for attempt in range(route.retries + 1):
                sampling = (
                    {"temperature": 0.0}
                    if attempt == 0
                    else {
                        "temperature": route.retry_temperature,
                        "seed": retry_seed(seed, task.id, turn, attempt),
                    }
                )
                a = _attempt(client, route, task, messages, world, sampling)
                attempts.append(a)
                if route.retries == 0 or not _rejected(a, earlier):
                    break
                a.accepted = False
            kept = attempts[-1]
            kept.accepted = True
            call = Call(kept.name, kept.arguments) if kept.name and kept.arguments is not None else None
            first = attempts[0]
            first_call = Call(first.name, first.arguments) if first.name and first.arguments is not None else None
            right = first_right = None
            if on_path:
                right = call is not None and step_is_right(task, world, call, turn)
                first_right = first_call is not None and step_is_right(task, world, first_call, turn)
                on_path = right
            step = StepRecord(turn, kept.name, kept.arguments, kept.observation, False, right, first_right, attempts)
            steps.append(step)
            if call is None:
                break  # nothing to send back: the conversation cannot go on
            if call.name == ANSWER_TOOL:
                step.ok = True
                answer = str(call.arguments.get("value", ""))
                break
            observed = world.call(call.name, call.arguments)
            step.ok, step.observation = observed.ok, observed.text
            signature = (call.name, json.dumps(call.arguments, sort_keys=True))
            if earlier and earlier[-1] == signature:
                break  # the same call twice in a row: a deterministic world cannot unstick it
            earlier.append(signature)
            call_id = f"call_{turn}"
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                        }
                    ],
                }
            )
            messages.append({"role": "tool", "tool_call_id": call_id, "content": observed.text})
    except ProtocolError as e:
        error = str(e)
    wall = time.perf_counter() - start
    answer_ok, state_ok = score(task, world, answer)
    return TaskRecord(
        task_id=task.id,
        family=task.family,
        n=task.steps,
        route=route_name or route.model,
        solved=answer_ok and state_ok and error is None,
        answer_ok=answer_ok,
        state_ok=state_ok,
        answer=answer,
        wall_s=wall,
        steps=steps,
        error=error,
    )
