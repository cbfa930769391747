"""Generate the agent tasks (`data/evals/agent/tasks.jsonl`) from a fixed seed.

    python -m fastmode.evals.agent.make_tasks            # rewrite the packaged file
    python -m fastmode.evals.agent.make_tasks --check    # fail if the file is stale

Each family below is one kind of errand: its prompt says what to do in plain
steps, but the values each step needs (a key's name, a date, a price) are only
in the previous observation, so the agent must read them there. A family
states its answer and its changes to the world from its own values, not by
running the sandbox; the tests replay every reference solution in the sandbox
and hold both to it.

Chain lengths (the reference's calls, the final answer included) run from 1 to
10, with more short tasks than long ones: long chains of a weak model mostly
fail, and the short ones carry the per-step estimate.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
from collections.abc import Callable
from typing import Any

SEED = 20261202

# Short, common words: key and file names a 135M model copies without mangling.
WORDS = [
    "apple", "river", "stone", "cloud", "tiger", "lemon", "maple", "cedar", "comet", "amber",
    "delta", "eagle", "falcon", "harbor", "island", "jade", "koala", "lotus", "mango", "nova",
    "olive", "pearl", "quartz", "robin", "sage", "tulip", "violet", "willow", "zebra", "acorn",
    "basil", "cherry", "daisy", "ember", "fern", "grape", "hazel", "ivory", "juniper", "kiwi",
    "lilac", "melon", "nutmeg", "orchid", "peach", "quill", "raven", "salmon", "thyme", "umbra",
]  # fmt: skip
ITEMS = ["lamp", "chair", "table", "clock", "mirror", "pillow", "kettle", "basket", "candle", "blanket"]
FOLDERS = ["inbox", "notes", "docs", "tasks", "mail", "work"]


class Builder:
    """One task under construction: the world, the reference calls and what they change."""

    def __init__(self, rng: random.Random, family: str):
        self.rng = rng
        self.family = family
        self.files: dict[str, str] = {}
        self.kv: dict[str, str] = {}
        self.calls: list[dict[str, Any]] = []
        self.changes: dict[str, dict[str, str]] = {"files": {}, "kv": {}}
        self.used: set[str] = set()

    def word(self) -> str:
        """A word not yet used as a key or file name in this task."""
        w = self.rng.choice([w for w in WORDS if w not in self.used])
        self.used.add(w)
        return w

    def call(self, name: str, **arguments: Any) -> None:
        self.calls.append({"name": name, "arguments": arguments})

    def distract(self, num_keys: int = 2, num_files: int = 0, folder: str | None = None) -> None:
        """Keys and files the task does not need, so the right one must be read, not guessed."""
        for _ in range(num_keys):
            self.kv[self.word()] = str(self.rng.randint(2, 99))
        for _ in range(num_files):
            self.files[f"{folder or self.rng.choice(FOLDERS)}/{self.word()}.txt"] = self.word()

    def task(self, prompt: str, tools: list[str], answer: Any) -> dict[str, Any]:
        return {
            "family": self.family,
            "steps": len(self.calls),
            "prompt": prompt,
            "tools": tools,
            "world": {"files": self.files, "kv": self.kv},
            "reference": self.calls,
            "answer": str(answer),
            "changes": self.changes,
        }


def _date(rng: random.Random) -> dt.date:
    return dt.date(2026, 1, 1) + dt.timedelta(days=rng.randrange(365))


# --- families: each returns one task dict ----------------------------------------------


def echo(b: Builder) -> dict:
    w = b.word()
    b.distract()
    b.call("answer", value=w)
    return b.task(f"The code word is {w}. Call answer with the value {w}.", ["get", "answer"], w)


def lookup(b: Builder) -> dict:
    key, value = b.word(), b.word()
    b.kv[key] = value
    b.distract()
    b.call("get", key=key)
    b.call("answer", value=value)
    return b.task(
        f"Call get with the key {key}. Then call answer with the value it returns.", ["get", "put", "answer"], value
    )


def read(b: Builder) -> dict:
    folder, name, text = b.rng.choice(FOLDERS), b.word(), b.word()
    path = f"{folder}/{name}.txt"
    b.files[path] = text
    b.distract(0, 2, folder)
    b.call("read_file", path=path)
    b.call("answer", value=text)
    return b.task(
        f"Call read_file with the path {path}. Then call answer with the text it returns.",
        ["read_file", "list_dir", "answer"],
        text,
    )


def weekday(b: Builder) -> dict:
    d = _date(b.rng)
    day = d.strftime("%A")
    b.call("weekday", date=d.isoformat())
    b.call("answer", value=day)
    return b.task(
        f"Call weekday with the date {d.isoformat()}. Then call answer with the day it returns.",
        ["weekday", "add_days", "answer"],
        day,
    )


def pointer(b: Builder) -> dict:
    folder, name, key = b.rng.choice(FOLDERS), b.word(), b.word()
    value = b.rng.randint(2, 99)
    path = f"{folder}/{name}.txt"
    b.files[path], b.kv[key] = key, str(value)
    b.distract(2, 1, folder)
    b.call("read_file", path=path)
    b.call("get", key=key)
    b.call("answer", value=str(value))
    return b.task(
        f"Call read_file with the path {path}; it returns the name of a key. Call get with that key. "
        "Then call answer with the value get returns.",
        ["read_file", "get", "answer"],
        value,
    )


def copy_key(b: Builder) -> dict:
    src, dst, value = b.word(), b.word(), b.word()
    b.kv[src] = value
    b.distract()
    b.call("get", key=src)
    b.call("put", key=dst, value=value)
    b.call("answer", value=value)
    b.changes["kv"][dst] = value
    return b.task(
        f"Call get with the key {src}. Call put with the key {dst} and the value get returned. "
        "Then call answer with that value.",
        ["get", "put", "answer"],
        value,
    )


def convert(b: Builder) -> dict:
    key = b.word()
    src, dst, factor, what = b.rng.choice(
        [("km", "m", 1000, "a distance"), ("kg", "g", 1000, "a weight"), ("h", "min", 60, "a time")]
    )
    amount = b.rng.randint(2, 30)
    b.kv[key] = str(amount)
    b.distract()
    b.call("get", key=key)
    b.call("convert", amount=amount, unit=src, to=dst)
    b.call("answer", value=str(amount * factor))
    return b.task(
        f"Call get with the key {key}; it returns {what} in {src}. Call convert with that amount, the unit {src} "
        f"and to {dst}. Then call answer with the result.",
        ["get", "convert", "answer"],
        amount * factor,
    )


def due(b: Builder) -> dict:
    key, d, days = b.word(), _date(b.rng), b.rng.randint(2, 30)
    b.kv[key] = d.isoformat()
    b.distract()
    new = (d + dt.timedelta(days=days)).isoformat()
    b.call("get", key=key)
    b.call("add_days", date=d.isoformat(), days=days)
    b.call("answer", value=new)
    return b.task(
        f"Call get with the key {key}; it returns a date. Call add_days with that date and {days} days. "
        "Then call answer with the new date.",
        ["get", "add_days", "answer"],
        new,
    )


def list_read(b: Builder) -> dict:
    folder, name, text = b.rng.choice(FOLDERS), b.word(), b.word()
    path = f"{folder}/{name}.txt"
    b.files[path] = text
    b.distract(0, 2, next(f for f in FOLDERS if f != folder))
    b.call("list_dir", folder=folder)
    b.call("read_file", path=path)
    b.call("answer", value=text)
    return b.task(
        f"Call list_dir with the folder {folder}; it returns one file name. Call read_file with the path "
        f"{folder}/ and that name. Then call answer with the text it returns.",
        ["list_dir", "read_file", "answer"],
        text,
    )


def sum2(b: Builder) -> dict:
    ka, kb = b.word(), b.word()
    va, vb = b.rng.randint(2, 60), b.rng.randint(2, 60)
    b.kv[ka], b.kv[kb] = str(va), str(vb)
    b.distract()
    b.call("get", key=ka)
    b.call("get", key=kb)
    b.call("add", a=va, b=vb)
    b.call("answer", value=str(va + vb))
    return b.task(
        f"Call get with the key {ka}, then call get with the key {kb}. Call add with the two values. "
        "Then call answer with the sum.",
        ["get", "add", "answer"],
        va + vb,
    )


def due_weekday(b: Builder) -> dict:
    key, d, days = b.word(), _date(b.rng), b.rng.randint(2, 30)
    b.kv[key] = d.isoformat()
    b.distract()
    new = d + dt.timedelta(days=days)
    b.call("get", key=key)
    b.call("add_days", date=d.isoformat(), days=days)
    b.call("weekday", date=new.isoformat())
    b.call("answer", value=new.strftime("%A"))
    return b.task(
        f"Call get with the key {key}; it returns a date. Call add_days with that date and {days} days. "
        "Call weekday with the new date. Then call answer with the day.",
        ["get", "add_days", "weekday", "answer"],
        new.strftime("%A"),
    )


def pointer_write(b: Builder) -> dict:
    folder, name, key, value = b.rng.choice(FOLDERS), b.word(), b.word(), b.word()
    path = f"{folder}/{name}.txt"
    out = f"{folder}/{b.word()}.txt"
    b.files[path], b.kv[key] = key, value
    b.distract(2, 1, folder)
    b.call("read_file", path=path)
    b.call("get", key=key)
    b.call("write_file", path=out, text=value)
    b.call("answer", value=value)
    b.changes["files"][out] = value
    return b.task(
        f"Call read_file with the path {path}; it returns the name of a key. Call get with that key. "
        f"Call write_file with the path {out} and the value. Then call answer with the value.",
        ["read_file", "get", "write_file", "answer"],
        value,
    )


def price(b: Builder, listed: bool = False) -> dict:
    folder = "inbox"
    item, qty, unit_price = b.rng.choice(ITEMS), b.rng.randint(2, 9), b.rng.randint(2, 40)
    b.used.add(item)
    path = f"{folder}/{b.word()}.txt"
    b.files[path] = item
    b.kv[item] = str(unit_price)
    b.distract()
    total = qty * unit_price
    if listed:
        b.call("list_dir", folder=folder)
    b.call("read_file", path=path)
    b.call("get", key=item)
    b.call("multiply", a=unit_price, b=qty)
    b.call("put", key="total", value=str(total))
    b.call("answer", value=str(total))
    b.changes["kv"]["total"] = str(total)
    where = (
        f"Call list_dir with the folder {folder}; it returns one file name. Call read_file with the path "
        f"{folder}/ and that name."
        if listed
        else f"Call read_file with the path {path}."
    )
    tools = (["list_dir"] if listed else []) + ["read_file", "get", "multiply", "put", "answer"]
    return b.task(
        f"{where} It returns an item. Call get with that item to get its price. Call multiply with the price "
        f"and {qty}. Call put with the key total and the product. Then call answer with the product.",
        tools,
        total,
    )


def _follow(b: Builder, hops: int) -> tuple[str, int]:
    """A chain of `hops` keys, each holding the next one's name and the last a number."""
    keys = [b.word() for _ in range(hops)]
    value = b.rng.randint(2, 60)
    for k, nxt in zip(keys, keys[1:], strict=False):
        b.kv[k] = nxt
    b.kv[keys[-1]] = str(value)
    b.distract(2)
    for k in keys:
        b.call("get", key=k)
    return keys[0], value


_FOLLOW = (
    "Call get with the key {start}. While get returns a word, call get with that word. When get returns "
    "a number, stop getting."
)


def chain(b: Builder, hops: int) -> dict:
    start, value = _follow(b, hops)
    b.call("answer", value=str(value))
    return b.task(_FOLLOW.format(start=start) + " Then call answer with that number.", ["get", "answer"], value)


def chain_write(b: Builder, hops: int) -> dict:
    start, value = _follow(b, hops)
    out = f"{b.rng.choice(FOLDERS)}/{b.word()}.txt"
    b.call("write_file", path=out, text=str(value))
    b.call("answer", value=str(value))
    b.changes["files"][out] = str(value)
    return b.task(
        _FOLLOW.format(start=start) + f" Call write_file with the path {out} and that number. "
        "Then call answer with the number.",
        ["get", "write_file", "answer"],
        value,
    )


def chain_calc(b: Builder, hops: int) -> dict:
    start, value = _follow(b, hops)
    factor = b.rng.randint(2, 9)
    result = value * factor
    b.call("multiply", a=value, b=factor)
    b.call("put", key="result", value=str(result))
    b.call("answer", value=str(result))
    b.changes["kv"]["result"] = str(result)
    return b.task(
        _FOLLOW.format(start=start) + f" Call multiply with that number and {factor}. Call put with the key result "
        "and the product. Then call answer with the product.",
        ["get", "multiply", "put", "answer"],
        result,
    )


def sum3_store(b: Builder) -> dict:
    keys = [b.word() for _ in range(3)]
    values = [b.rng.randint(2, 40) for _ in keys]
    for k, v in zip(keys, values, strict=True):
        b.kv[k] = str(v)
    b.distract()
    for k in keys:
        b.call("get", key=k)
    b.call("add", a=values[0], b=values[1])
    b.call("add", a=values[0] + values[1], b=values[2])
    total = sum(values)
    b.call("put", key="total", value=str(total))
    b.call("answer", value=str(total))
    b.changes["kv"]["total"] = str(total)
    return b.task(
        f"Call get with the key {keys[0]}, then with the key {keys[1]}, then with the key {keys[2]}. Call add with "
        "the first two values, then call add with that sum and the third value. Call put with the key total and "
        "the total. Then call answer with the total.",
        ["get", "add", "put", "answer"],
        total,
    )


def report(b: Builder) -> dict:
    ka, kb, kc = b.word(), b.word(), b.word()
    va, vb, vc = b.rng.randint(2, 30), b.rng.randint(2, 30), b.rng.randint(2, 9)
    b.kv[ka], b.kv[kb], b.kv[kc] = str(va), str(vb), str(vc)
    b.distract()
    out = f"docs/{b.word()}.txt"
    result = (va + vb) * vc
    b.call("get", key=ka)
    b.call("get", key=kb)
    b.call("add", a=va, b=vb)
    b.call("get", key=kc)
    b.call("multiply", a=va + vb, b=vc)
    b.call("put", key="result", value=str(result))
    b.call("write_file", path=out, text=str(result))
    b.call("answer", value=str(result))
    b.changes["kv"]["result"] = str(result)
    b.changes["files"][out] = str(result)
    return b.task(
        f"Call get with the key {ka}, then with the key {kb}, and call add with the two values. Call get with the "
        f"key {kc} and call multiply with the sum and that value. Call put with the key result and the product. "
        f"Call write_file with the path {out} and the product. "
        "Then call answer with the product.",
        ["get", "add", "multiply", "put", "write_file", "answer"],
        result,
    )


Family = Callable[[Builder], dict]


def _hops(fn: Callable[[Builder, int], dict], hops: int) -> tuple[str, Family]:
    return f"{fn.__name__}{hops}", lambda b: fn(b, hops)


# (family name, maker, how many) per chain length; the lengths are checked when made.
PLAN: list[tuple[int, list[tuple[str, Family, int]]]] = [
    (1, [("echo", echo, 4)]),
    (2, [("lookup", lookup, 3), ("read", read, 3), ("weekday", weekday, 2)]),
    (
        3,
        [("pointer", pointer, 2), ("copy_key", copy_key, 2), ("convert", convert, 2), ("due", due, 1)]
        + [("list_read", list_read, 1)],
    ),
    (4, [("sum2", sum2, 3), ("due_weekday", due_weekday, 2), ("pointer_write", pointer_write, 3)]),
    (5, [("price", price, 3), (*_hops(chain, 4), 2), (*_hops(chain_write, 3), 2)]),
    (6, [("price_listed", lambda b: price(b, listed=True), 2), (*_hops(chain_calc, 3), 2), (*_hops(chain, 5), 2)]),
    (7, [("sum3_store", sum3_store, 2), (*_hops(chain_calc, 4), 2), (*_hops(chain_write, 5), 1)]),
    (8, [("report", report, 1), (*_hops(chain_calc, 5), 2), (*_hops(chain_write, 6), 2)]),
    (9, [(*_hops(chain_calc, 6), 2), (*_hops(chain, 8), 1), (*_hops(chain_write, 7), 2)]),
    (10, [(*_hops(chain_calc, 7), 2), (*_hops(chain, 9), 1), (*_hops(chain_write, 8), 1)]),
]


def make_tasks(seed: int = SEED) -> list[dict[str, Any]]:
    """The suite, deterministic for a given seed, ordered by chain length."""
    rng = random.Random(seed)
    tasks: list[dict[str, Any]] = []
    for steps, families in PLAN:
        for family, make, count in families:
            for _ in range(count):
                t = make(Builder(rng, family))
                if t["steps"] != steps:
                    raise AssertionError(f"{family} made a {t['steps']}-step task, planned {steps}")
                tasks.append({"id": f"agent-{len(tasks) + 1:03d}", **t})
    return tasks


def render(tasks: list[dict[str, Any]]) -> str:
    """JSONL text, one task per line, stable key order."""
    return "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tasks)


def main(argv: list[str] | None = None) -> int:
    from fastmode.evals.agent.tasks import TASK_FILE, data_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only verify the file is current")
    args = parser.parse_args(argv)
    path = data_dir() / TASK_FILE
    text = render(make_tasks())
    if args.check:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            print(f"{path} is stale; run python -m fastmode.evals.agent.make_tasks", file=sys.stderr)
            return 1
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {len(text.splitlines())} tasks to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
