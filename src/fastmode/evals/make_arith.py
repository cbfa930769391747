"""Generate the arithmetic items (`data/evals/arithmetic.jsonl`) from a fixed seed.

    python -m fastmode.evals.make_arith            # rewrite the packaged file
    python -m fastmode.evals.make_arith --check    # fail if the file is stale

Small integers only: the suite measures whether a 135M model can add, not
whether it can do long multiplication. Half the items are one operation, half
are two operations or a one-sentence word problem.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from typing import Any

SEED = 20260201
SUFFIX = " Answer with just the number."


def _item(index: int, prompt: str, answer: int, steps: int) -> dict[str, Any]:
    # The checker skips the question's own numbers, so a model that echoes
    # "7 times 7 is 49" is judged on 49, not on the echoed 7.
    return {
        "id": f"arith-{index:03d}",
        "category": "arithmetic",
        "prompt": prompt + SUFFIX,
        "checker": "integer_equals",
        "args": {"answer": answer, "ignore": operands(prompt), "steps": steps},
        "max_tokens": 16,
    }


def operands(prompt: str) -> list[int]:
    """The distinct integers in the question, in order of appearance."""
    return list(dict.fromkeys(int(n) for n in re.findall(r"\d+", prompt)))


def _single(rng: random.Random) -> tuple[str, int]:
    """One operation on small integers; differences and quotients stay whole and >= 0."""
    op = rng.choice("+-*/")
    if op == "+":
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        return f"What is {a} + {b}?", a + b
    if op == "-":
        a, b = rng.randint(5, 30), rng.randint(1, 5)
        return f"What is {a} - {b}?", a - b
    if op == "*":
        a, b = rng.randint(2, 10), rng.randint(2, 10)
        return f"What is {a} times {b}?", a * b
    b, q = rng.randint(2, 9), rng.randint(2, 9)
    return f"What is {b * q} divided by {b}?", q


# Word problems: (template, answer function). Names and objects vary with the seed.
_NAMES = ["Tom", "Ana", "Sam", "Mia", "Leo", "Zoe", "Ben", "Ivy"]
_THINGS = ["apples", "pencils", "marbles", "books", "stickers", "cookies"]


def _two_step(rng: random.Random) -> tuple[str, int]:
    """Two operations, as an expression or a short story."""
    kind = rng.randrange(5)
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 5)
    name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
    if kind == 0:
        return f"What is ({a} + {b}) times {c}?", (a + b) * c
    if kind == 1:
        return f"What is {a} times {b} plus {c}?", a * b + c
    if kind == 2:
        x = rng.randint(10, 20)
        return f"What is {x} minus {a} plus {b}?", x - a + b
    if kind == 3:
        return (
            f"{name} has {a} {thing} and gets {b} more, then gives away {c}. How many {thing} does {name} have now?",
            a + b - c,
        )
    return (
        f"{name} buys {c} bags with {a} {thing} in each bag and already had {b}. How many {thing} does {name} have?",
        c * a + b,
    )


def make_items(seed: int = SEED, num_single: int = 20, num_two_step: int = 20) -> list[dict[str, Any]]:
    """The arithmetic items, deterministic for a given seed.

    Prompts are unique and no answer equals one of its question's numbers.
    """
    rng = random.Random(seed)
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    for steps, count, make in ((1, num_single, _single), (2, num_two_step, _two_step)):
        made = 0
        while made < count:
            prompt, answer = make(rng)
            # An answer equal to an operand would be skipped by the checker.
            if prompt in seen or answer in operands(prompt):
                continue
            seen.add(prompt)
            items.append(_item(len(items) + 1, prompt, answer, steps))
            made += 1
    return items


def render(items: list[dict[str, Any]]) -> str:
    """JSONL text, one item per line, stable key order."""
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items)


def main(argv: list[str] | None = None) -> int:
    from fastmode.evals.tasks import data_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only verify the file is current")
    args = parser.parse_args(argv)
    path = data_dir() / "arithmetic.jsonl"
    text = render(make_items())
    if args.check:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            print(f"{path} is stale; run python -m fastmode.evals.make_arith", file=sys.stderr)
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    print(f"wrote {len(text.splitlines())} items to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
