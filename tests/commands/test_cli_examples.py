"""Every `fastmode COMMAND ...` example in README.md, docs/ and the commands' own help parses."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from fastmode.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]
# A command line as the docs show it: at a line's start, after an optional "$ " or ".venv/bin/".
_NAMES = {name for name, _ in COMMANDS}
_EXAMPLE = re.compile(r"^\s*(?:\$\s+)?(?:\.venv/bin/)?fastmode (\w+)\b(.*)$")


def _examples(text: str) -> list[list[str]]:
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):  # a continued command line
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i]
        i += 1
        m = _EXAMPLE.match(line)
        if not m or m[1] not in _NAMES or "..." in line or "<" in line:
            continue  # prose, or an elided command
        rest = re.split(r"\s#|`|\||&|;", m[2])[0]  # drop a comment, the end of inline code, shell plumbing
        argv = [m[1], *shlex.split(rest)]
        if "--help" not in argv:
            out.append(argv)
    return out


def _sources() -> dict[str, str]:
    import importlib

    docs = {
        str(p.relative_to(ROOT)): p.read_text()
        for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        if p.exists()
    }
    docs.update({module: importlib.import_module(module).__doc__ or "" for _, module in COMMANDS})
    return docs


EXAMPLES = [(source, argv) for source, text in _sources().items() for argv in _examples(text)]


def test_the_docs_show_examples_of_most_commands():
    assert {argv[0] for _, argv in EXAMPLES} >= {"plan", "chain", "simulate", "calibrate", "eval", "bench", "distill"}


@pytest.fixture(scope="module")
def parser():
    return build_parser()


@pytest.mark.parametrize(("source", "argv"), EXAMPLES, ids=[f"{s}:{' '.join(a)[:60]}" for s, a in EXAMPLES])
def test_example_parses(parser, source, argv):
    args = parser.parse_args(argv)
    assert args.command == argv[0] and callable(args.func)


@pytest.mark.parametrize("command", [name for name, _ in COMMANDS])
def test_help(parser, command, capsys):
    with pytest.raises(SystemExit) as e:
        parser.parse_args([command, "--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: fastmode " + command)
