"""The agent task format, its loader and its scorer.

One task per line of `fastmode/data/evals/agent/tasks.jsonl`:

    {"id": "agent-031", "steps": 3, "prompt": "The file notes/key.txt names a key. ...",
     "tools": ["read_file", "get", "answer"],
     "world": {"files": {"notes/key.txt": "plum"}, "kv": {"plum": "41"}},
     "reference": [{"name": "read_file", "arguments": {"path": "notes/key.txt"}},
                   {"name": "get", "arguments": {"key": "plum"}},
                   {"name": "answer", "arguments": {"value": "41"}}],
     "answer": "41", "changes": {"files": {}, "kv": {}}}

`steps` is the chain length n: the calls of the reference solution, the final
`answer` call included. A task is solved when the agent's final answer means
the same as `answer` and the world's final state equals the initial world with
`changes` applied (values compared as numbers where both are numbers), never
by comparing transcripts.

A step is right when the agent's call has the reference call's effect: run on
the same world, both give the same observation and leave the same state (so
`add(3, 12)` is as right as `add(12, 3)`). An `answer` call is right when its
value means the same as the task's answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from fastmode.evals.agent.world import ANSWER_TOOL, TOOLS, World, same_value
from fastmode.evals.tasks import read_jsonl

MAX_STEPS = 10


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class AgentTask:
    """One task: an instruction, the tools it offers, a starting world and a reference solution."""

    id: str
    steps: int
    prompt: str
    tools: tuple[str, ...]
    world: dict[str, Any]
    reference: tuple[Call, ...]
    answer: str
    changes: dict[str, Any]
    family: str = ""

    def __post_init__(self) -> None:
        if not 1 <= self.steps <= MAX_STEPS:
            raise ValueError(f"{self.id}: steps must be in 1..{MAX_STEPS}")
        if len(self.reference) != self.steps:
            raise ValueError(f"{self.id}: the reference has {len(self.reference)} calls, steps says {self.steps}")
        if not self.reference or self.reference[-1].name != ANSWER_TOOL:
            raise ValueError(f"{self.id}: the reference must end with an {ANSWER_TOOL} call")
        if any(c.name == ANSWER_TOOL for c in self.reference[:-1]):
            raise ValueError(f"{self.id}: only the last reference call may be {ANSWER_TOOL}")
        unknown = [t for t in self.tools if t not in TOOLS]
        if unknown:
            raise ValueError(f"{self.id}: unknown tools {unknown}")
        if ANSWER_TOOL not in self.tools:
            raise ValueError(f"{self.id}: every task offers the {ANSWER_TOOL} tool")
        unused = [c.name for c in self.reference if c.name not in self.tools]
        if unused:
            raise ValueError(f"{self.id}: the reference calls tools the task does not offer: {unused}")
        World.from_dict(self.world)  # validates the world's fields
        if set(self.changes) - {"files", "kv"}:
            raise ValueError(f"{self.id}: changes may only name files and kv")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentTask:
        known = {"id", "steps", "prompt", "tools", "world", "reference", "answer", "changes", "family"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{data.get('id')}: unknown fields {sorted(unknown)}")
        return cls(
            id=data["id"],
            steps=int(data["steps"]),
            prompt=data["prompt"],
            tools=tuple(data["tools"]),
            world=data["world"],
            reference=tuple(Call(c["name"], dict(c["arguments"])) for c in data["reference"]),
            answer=str(data["answer"]),
            changes=data.get("changes", {}),
            family=data.get("family", ""),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "family": self.family,
            "steps": self.steps,
            "prompt": self.prompt,
            "tools": list(self.tools),
            "world": self.world,
            "reference": [c.to_dict() for c in self.reference],
            "answer": self.answer,
            "changes": self.changes,
        }

    def start(self) -> World:
        """A fresh copy of the starting world."""
        return World.from_dict(self.world)

    def expected_world(self) -> World:
        """The starting world with `changes` applied: the state a solved task ends in."""
        w = self.start()
        w.files.update(self.changes.get("files", {}))
        w.kv.update({k: str(v) for k, v in self.changes.get("kv", {}).items()})
        return w

    def openai_tools(self) -> list[dict]:
        return [TOOLS[name].as_openai() for name in self.tools]


def score(task: AgentTask, world: World, answer: str | None) -> tuple[bool, bool]:
    """(answer right, final state right) for a finished run; solved means both."""
    answer_ok = answer is not None and same_value(answer, task.answer)
    return answer_ok, world.same_state(task.expected_world())


def step_is_right(task: AgentTask, world: World, call: Call, index: int) -> bool:
    """Whether `call`, made on `world` as step `index`, has the reference step's effect."""
    if index >= len(task.reference):
        return False
    ref = task.reference[index]
    if ref.name == ANSWER_TOOL or call.name == ANSWER_TOOL:
        return ref.name == call.name == ANSWER_TOOL and same_value(call.arguments.get("value"), task.answer)
    mine, theirs = world.copy(), world.copy()
    got, want = mine.call(call.name, call.arguments), theirs.call(ref.name, ref.arguments)
    return got.ok and got.text == want.text and mine.same_state(theirs)


def replay(task: AgentTask, calls: Sequence[Call]) -> tuple[World, str | None, list[str]]:
    """Run `calls` on a fresh world until an answer call: (final world, answer, observations)."""
    world = task.start()
    observations = []
    for call in calls:
        if call.name == ANSWER_TOOL:
            return world, str(call.arguments.get("value")), observations
        observations.append(world.call(call.name, call.arguments).text)
    return world, None, observations


def data_dir() -> Path:
    return Path(str(resources.files("fastmode").joinpath("data", "evals", "agent")))


TASK_FILE = "tasks.jsonl"


def load_agent_tasks(
    path: Path | None = None,
    ids: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    limit_per_length: int | None = None,
) -> list[AgentTask]:
    """Load and validate the suite (default: the packaged file).

    `ids` keeps tasks whose id is listed or starts with a listed prefix; `steps`
    keeps those chain lengths; `limit_per_length` the first N tasks of each length,
    so a quick run still spreads over n. Raises ValueError on a bad task or a
    duplicate id, and when a filter leaves nothing.
    """
    tasks = [AgentTask.from_dict(row) for row in read_jsonl(path or data_dir() / TASK_FILE)]
    seen: set[str] = set()
    for t in tasks:
        if t.id in seen:
            raise ValueError(f"duplicate agent task id {t.id!r}")
        seen.add(t.id)
    if ids:
        wanted = [i.strip() for i in ids if i.strip()]
        tasks = [t for t in tasks if any(t.id == w or t.id.startswith(w) for w in wanted)]
    if steps:
        lengths = set(steps)
        tasks = [t for t in tasks if t.steps in lengths]
    if limit_per_length is not None:
        counts: dict[int, int] = {}
        kept = []
        for t in tasks:
            counts[t.steps] = counts.get(t.steps, 0) + 1
            if counts[t.steps] <= limit_per_length:
                kept.append(t)
        tasks = kept
    if not tasks:
        raise ValueError("no agent task matches the filters")
    return tasks
