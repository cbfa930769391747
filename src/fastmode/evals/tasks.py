"""The eval task suite: one `Task` per JSONL line under `fastmode/data/evals/`.

A line looks like

    {"id": "fact-001", "category": "factual", "prompt": "What is the capital of France?",
     "checker": "contains_any", "args": {"aliases": ["Paris"]}, "max_tokens": 24}

`mode` is "chat" (default: the prompt is the user turn of a chat) or
"completion" (the prompt is raw text the model continues; used for code, where
the prompt is a function signature and docstring and the model writes the
body). Code items also store `args.reference`, a known-good body, so the test
suite can prove every code item is solvable by its own checker.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from fastmode.evals.checkers import CHECKERS, check

CATEGORIES: tuple[str, ...] = ("factual", "arithmetic", "code", "format")
MODES: tuple[str, ...] = ("chat", "completion")
TASK_FILES: tuple[str, ...] = tuple(f"{c}.jsonl" for c in CATEGORIES)


@dataclass(frozen=True)
class Task:
    """One checkable item. `args` are the checker's arguments (see `checkers`)."""

    id: str
    category: str
    prompt: str
    checker: str
    args: dict[str, Any] = field(default_factory=dict)
    max_tokens: int = 32
    mode: str = "chat"

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"{self.id}: unknown category {self.category!r}")
        if self.checker not in CHECKERS:
            raise ValueError(f"{self.id}: unknown checker {self.checker!r}")
        if self.mode not in MODES:
            raise ValueError(f"{self.id}: unknown mode {self.mode!r}")
        if self.max_tokens <= 0:
            raise ValueError(f"{self.id}: max_tokens must be positive")
        if not self.prompt:
            raise ValueError(f"{self.id}: empty prompt")
        if self.checker == "code_exec" and not (self.args.get("tests") and "reference" in self.args):
            raise ValueError(f"{self.id}: code items need args.tests and args.reference")

    def check(self, response: str) -> bool:
        """Whether `response` (the generated text only) answers this task."""
        return check(self.checker, response, self.args, self.prompt)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        known = {"id", "category", "prompt", "checker", "args", "max_tokens", "mode"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{data.get('id')}: unknown fields {sorted(unknown)}")
        return cls(**data)


def data_dir() -> Path:
    """The packaged directory holding the task and held-out files."""
    return Path(str(resources.files("fastmode").joinpath("data", "evals")))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Parse a JSONL file, skipping blank lines; errors name the line."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: {exc}") from None
    return rows


def load_tasks(
    paths: Iterable[Path] | None = None,
    categories: Sequence[str] | None = None,
    limit_per_category: int | None = None,
) -> list[Task]:
    """Load and validate the suite (default: the packaged files).

    `categories` keeps only those categories; `limit_per_category` keeps the
    first N items of each, so a quick run still covers every category.
    Raises ValueError on duplicate ids or an invalid item.
    """
    if paths is None:
        paths = [data_dir() / name for name in TASK_FILES]
    tasks = [Task.from_dict(row) for path in paths for row in read_jsonl(Path(path))]
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise ValueError(f"duplicate task id {task.id!r}")
        seen.add(task.id)
    if categories:
        unknown = set(categories) - set(CATEGORIES)
        if unknown:
            raise ValueError(f"unknown categories {sorted(unknown)}; known: {CATEGORIES}")
        tasks = [t for t in tasks if t.category in categories]
    if limit_per_category is not None:
        counts: dict[str, int] = {}
        kept = []
        for task in tasks:
            counts[task.category] = counts.get(task.category, 0) + 1
            if counts[task.category] <= limit_per_category:
                kept.append(task)
        tasks = kept
    return tasks
