"""The agent suite without a model: the sandbox's tools, the task file, the scorer,
and every reference solution replayed in the sandbox (and broken ones refused)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from fastmode.evals.agent import make_tasks
from fastmode.evals.agent.tasks import (
    AgentTask,
    Call,
    load_agent_tasks,
    replay,
    score,
    step_is_right,
)
from fastmode.evals.agent.world import TOOLS, World, format_number, same_value

TASKS = load_agent_tasks()


# --- the sandbox ---------------------------------------------------------------------------


def test_tools_read_and_write_state():
    w = World(files={"inbox/a.txt": "plum", "notes/b.txt": "x"}, kv={"plum": "41"})
    assert w.call("list_dir", {"folder": "inbox"}).text == "a.txt"
    assert w.call("read_file", {"path": "inbox/a.txt"}).text == "plum"
    assert w.call("get", {"key": "plum"}).text == "41"
    assert w.call("put", {"key": "Total", "value": " 82 "}).text == "82"  # a write answers with what it wrote
    assert w.kv["total"] == "82"
    assert w.call("get", {"key": "PLUM"}).text == "41"  # keys and paths are case-insensitive
    assert w.call("write_file", {"path": "Docs/out.txt", "text": "82"}).text == "82"
    assert w.files["docs/out.txt"] == "82"


def test_calculator_units_and_calendar():
    w = World()
    assert w.call("add", {"a": 12, "b": 30}).text == "42"
    assert w.call("subtract", {"a": 5, "b": 7.5}).text == "-2.5"
    assert w.call("multiply", {"a": 6, "b": 7}).text == "42"
    assert w.call("convert", {"amount": 3, "unit": "km", "to": "m"}).text == "3000"
    assert w.call("convert", {"amount": 90, "unit": "min", "to": "h"}).text == "1.5"
    assert w.call("add_days", {"date": "2026-02-27", "days": 3}).text == "2026-03-02"
    assert w.call("weekday", {"date": "2026-12-02"}).text == "Wednesday"


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("get", {"key": "nope"}, "no key"),
        ("read_file", {"path": "inbox/none.txt"}, "no file"),
        ("list_dir", {"folder": "empty"}, "no folder"),
        ("convert", {"amount": 1, "unit": "km", "to": "kg"}, "cannot convert"),
        ("convert", {"amount": 1, "unit": "parsec", "to": "m"}, "unknown unit"),
        ("weekday", {"date": "2026-13-01"}, "not a date"),
        ("add", {"a": "1", "b": 2}, "must be a number"),
        ("add_days", {"date": "2026-01-01", "days": 1.5}, "must be an integer"),
        ("get", {"key": "a", "extra": 1}, "needs exactly"),
        ("get", ["a"], "JSON object"),
        ("delete", {"key": "a"}, "no tool"),
        ("answer", {"value": "1"}, "ends the task"),
        ("write_file", {"path": "nofolder", "text": "x"}, "folder/name"),
    ],
)
def test_refused_calls_are_errors_and_change_nothing(name, arguments, message):
    w = World(files={"inbox/a.txt": "plum"}, kv={"a": "1"})
    before = w.to_dict()
    obs = w.call(name, arguments)
    assert not obs.ok and obs.text.startswith("error: ") and message in obs.text
    assert w.to_dict() == before


def test_values_compare_as_numbers_or_plain_text():
    assert same_value("42", 42) and same_value("42.0", "42") and same_value(" Paris. ", "paris")
    assert not same_value("41", "42") and not same_value("plum", "plums")
    assert format_number(3.0) == "3" and format_number(0.1 + 0.2) == "0.3"


def test_tool_schemas_are_flat_and_bounded():
    for tool in TOOLS.values():
        props = tool.parameters["properties"]
        assert 1 <= len(props) <= 3 and tool.parameters["additionalProperties"] is False
        assert all(p["type"] in ("string", "number", "integer") for p in props.values())
        assert all(p.get("maxLength") for p in props.values() if p["type"] == "string")


# --- the task file ---------------------------------------------------------------------------


def test_suite_size_and_spread_of_chain_lengths():
    assert len(TASKS) >= 60
    lengths = Counter(t.steps for t in TASKS)
    assert set(lengths) == set(range(1, 11))
    assert all(count >= 4 for count in lengths.values())


def test_packaged_file_is_what_the_generator_writes():
    assert make_tasks.main(["--check"]) == 0


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_reference_solution_solves_its_task(task: AgentTask):
    world, answer, observations = replay(task, task.reference)
    assert score(task, world, answer) == (True, True)
    assert not any(o.startswith("error:") for o in observations), observations
    # Each reference step is right by the step scorer, on the world as it stood.
    w = task.start()
    for i, call in enumerate(task.reference):
        assert step_is_right(task, w, call, i)
        if call.name != "answer":
            w.call(call.name, call.arguments)
    # No call repeats an earlier one: the verifier refuses repeats, so it must never refuse a reference step.
    seen = [(c.name, json.dumps(c.arguments, sort_keys=True)) for c in task.reference]
    assert len(seen) == len(set(seen))


@pytest.mark.parametrize("task", [t for t in TASKS if t.steps >= 2], ids=lambda t: t.id)
def test_wrong_solutions_fail(task: AgentTask):
    # The right calls, then a wrong answer.
    wrong_answer = [*task.reference[:-1], Call("answer", {"value": task.answer + "9"})]
    assert score(task, *replay(task, wrong_answer)[:2])[0] is False
    # The right answer without doing the work: the state is wrong wherever the task changes it.
    shortcut = [task.reference[-1]]
    answer_ok, state_ok = score(task, *replay(task, shortcut)[:2])
    assert answer_ok
    assert state_ok is not bool(task.changes.get("files") or task.changes.get("kv"))
    # A first step with the wrong argument (a key, path or number off by one) is a wrong step.
    first = task.reference[0]
    key, value = next(iter(first.arguments.items()))
    broken = Call(first.name, {**first.arguments, key: value + 1 if isinstance(value, int | float) else value + "x"})
    assert not step_is_right(task, task.start(), broken, 0)


def test_a_write_to_another_place_fails_the_state_check():
    task = next(t for t in TASKS if t.changes.get("files"))
    calls = [
        Call(c.name, {**c.arguments, "path": "elsewhere/x.txt"}) if c.name == "write_file" else c
        for c in task.reference
    ]
    assert score(task, *replay(task, calls)[:2]) == (True, False)


def test_an_equivalent_call_is_a_right_step():
    task = next(t for t in TASKS if any(c.name == "add" for c in t.reference))
    i = next(i for i, c in enumerate(task.reference) if c.name == "add")
    swapped = Call("add", {"a": task.reference[i].arguments["b"], "b": task.reference[i].arguments["a"]})
    world = task.start()
    for c in task.reference[:i]:
        world.call(c.name, c.arguments)
    assert step_is_right(task, world, swapped, i)


def test_filters_and_bad_files(tmp_path):
    assert [t.steps for t in load_agent_tasks(steps=[3])] == [3] * 8
    assert len(load_agent_tasks(limit_per_length=1)) == 10
    assert [t.id for t in load_agent_tasks(ids=["agent-001", "agent-06"])][:2] == ["agent-001", "agent-060"]
    with pytest.raises(ValueError, match="no agent task"):
        load_agent_tasks(ids=["nothing"])
    row = TASKS[4].to_dict()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**row, "steps": 3}) + "\n")
    with pytest.raises(ValueError, match="reference has 2 calls"):
        load_agent_tasks(bad)
    bad.write_text(json.dumps({**row, "tools": ["get"]}) + "\n")
    with pytest.raises(ValueError, match="answer tool"):
        load_agent_tasks(bad)
    bad.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="duplicate"):
        load_agent_tasks(bad)


def test_worked_errands_are_what_the_sandbox_answers_and_use_no_task_name():
    """Each result shown in the loop's worked errands is what the sandbox returns for that call
    (so the errands teach the real tools), and no errand key or file name occurs in a task."""
    from fastmode.evals.agent.loop import DEMO_ERRANDS, DEMONSTRATION

    world = World(
        files={"docs/note.txt": "sun"},
        kv={"sun": "17", "width": "12", "moon": "star", "star": "sky", "sky": "rain", "rain": "8"},
    )
    names = set()
    for _, calls in DEMO_ERRANDS:
        assert calls[-1][0] == "answer" and calls[-1][2] is None  # an errand ends at its answer, no result after
        for name, args, result in calls[:-1]:
            obs = world.call(name, args)
            assert obs.ok and obs.text == result
            names.update(str(v) for k, v in args.items() if k in ("key", "path"))
    task_names = {k for t in TASKS for k in t.world["kv"]} | {p for t in TASKS for p in t.world["files"]}
    task_names |= {str(c.arguments.get(k)) for t in TASKS for c in t.reference for k in ("key", "path")}
    assert names and not names & task_names
    assert sum(m["role"] == "user" for m in DEMONSTRATION) == len(DEMO_ERRANDS)
    assert sum(m["role"] == "assistant" for m in DEMONSTRATION) == sum(len(c) for _, c in DEMO_ERRANDS)
