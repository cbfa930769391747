"""The packaged task suite is valid, solvable and not trivially passable."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from fastmode.evals import make_arith
from fastmode.evals.checkers import CHECKERS
from fastmode.evals.perplexity import load_heldout
from fastmode.evals.tasks import CATEGORIES, Task, data_dir, load_tasks, read_jsonl

TASKS = load_tasks()
CODE_TASKS = [t for t in TASKS if t.checker == "code_exec"]


def test_suite_size_ids_and_categories() -> None:
    assert len(TASKS) >= 160
    assert len({t.id for t in TASKS}) == len(TASKS)
    counts = Counter(t.category for t in TASKS)
    assert set(counts) == set(CATEGORIES)
    # every category is big enough for its own interval to mean something
    assert min(counts.values()) >= 30
    assert all(t.checker in CHECKERS for t in TASKS)
    assert len({t.prompt for t in TASKS}) == len(TASKS)


def test_code_items_are_completion_mode_with_reference() -> None:
    assert len(CODE_TASKS) >= 30
    for task in CODE_TASKS:
        assert task.mode == "completion"
        # no trailing newline: see checkers.code_exec for why
        assert task.prompt.startswith("def ") and task.prompt.endswith('"""')
        assert task.args["entry_point"] in task.prompt


def test_every_code_reference_passes_and_a_wrong_body_fails() -> None:
    for task in CODE_TASKS:
        assert task.check(task.args["reference"]), f"{task.id}: reference fails its own tests"
        assert not task.check("    return None\n"), f"{task.id}: tests accept a wrong body"
        assert not task.check("    pass\n"), f"{task.id}: tests accept an empty body"


def test_arithmetic_file_matches_its_generator() -> None:
    path = data_dir() / "arithmetic.jsonl"
    assert path.read_text(encoding="utf-8") == make_arith.render(make_arith.make_items())
    for row in read_jsonl(path):
        task = Task.from_dict(row)
        answer = row["args"]["answer"]
        assert answer not in row["args"]["ignore"], task.id  # else skipping could hide it
        assert task.check(str(answer))
        assert task.check(f"{task.prompt.split('?')[0]} = {answer}")  # an echo, then the answer
        assert not task.check(str(answer + 1))


def test_factual_aliases_are_not_given_away_by_the_prompt() -> None:
    """An answer that only echoes the question must not pass."""
    for task in TASKS:
        if task.checker == "contains_any":
            assert not task.check(task.prompt), task.id


def test_filters_and_limits() -> None:
    subset = load_tasks(categories=["code", "format"], limit_per_category=3)
    assert [t.category for t in subset] == ["code"] * 3 + ["format"] * 3
    with pytest.raises(ValueError, match="unknown categories"):
        load_tasks(categories=["poetry"])


def test_invalid_items_are_rejected(tmp_path: Path) -> None:
    good = {
        "id": "a",
        "category": "factual",
        "prompt": "Q?",
        "checker": "contains_any",
        "args": {"aliases": ["x"]},
        "max_tokens": 8,
    }
    cases = [
        ([good, good], "duplicate"),
        ([dict(good, checker="magic")], "unknown checker"),
        ([dict(good, category="poetry")], "unknown category"),
        ([dict(good, colour="red")], "unknown fields"),
        ([dict(good, checker="code_exec", args={"tests": ["assert 1"]})], "reference"),
    ]
    for rows, message in cases:
        path = tmp_path / "bad.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with pytest.raises(ValueError, match=message):
            load_tasks([path])


def test_heldout_set() -> None:
    texts = load_heldout()
    kinds = Counter(t.kind for t in texts)
    assert kinds["prose"] >= 20 and kinds["code"] >= 3
    assert len({t.id for t in texts}) == len(texts)
    # held-out text must not double as a task prompt
    prompts = {t.prompt for t in TASKS}
    assert not any(t.text in prompts for t in texts)
