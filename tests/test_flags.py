"""fastmode/flags.py: the flags it generates from a dataclass parse to that dataclass's values."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from fastmode.flags import add_dataclass_args, pick


def _even(text: str) -> int:
    n = int(text)
    if n % 2:
        raise argparse.ArgumentTypeError(f"{n} is odd")
    return n


@dataclass(frozen=True)
class Options:
    name: str = field(metadata={"choices": lambda: ("a", "b")})  # which one
    sizes: tuple[int, ...] = (1, 2)  # sizes, comma-separated
    origins: tuple[str, ...] = ()  # origins, comma-separated
    limit: float | None = None  # a cap, or none
    even: int = field(default=0, metadata={"parse": _even, "aliases": ("e",), "metavar": "N"})  # an even number
    tags: tuple[str, ...] = ()  # tags
    verbose: bool = False  # say more
    spread: int = field(default=3, metadata={"metavar": "K"})  # a declaration over several lines keeps its help


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t")
    add_dataclass_args(p, Options, repeatable=("tags",))
    return p


def test_parsed_flags_build_the_dataclass():
    args = _parser().parse_args(
        [
            "--name",
            "b",
            "--sizes",
            "4,8",
            "--origins",
            "http://x,http://y",
            "--limit",
            "2.5",
            "--e",
            "6",
            "--tags",
            "p",
            "--tags",
            "q",
            "--verbose",
        ]
    )
    assert Options(**pick(Options, args)) == Options(
        name="b", sizes=(4, 8), origins=("http://x", "http://y"), limit=2.5, even=6, tags=("p", "q"), verbose=True
    )


def test_defaults_none_words_and_negated_bools():
    args = _parser().parse_args(["--name", "a", "--limit", "none", "--no-verbose"])
    assert (args.sizes, args.origins, args.limit, args.even, args.tags, args.verbose) == (
        (1, 2),
        (),
        None,
        0,
        [],
        False,
    )


@pytest.mark.parametrize(
    "argv", [[], ["--name", "c"], ["--name", "a", "--even", "3"], ["--name", "a", "--sizes", "1,x"]]
)
def test_missing_required_bad_choice_and_rejected_values_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(argv)
    assert e.value.code == 2


def test_help_shows_comment_default_and_metavar():
    text = _parser().format_help()
    assert "--even N, --e N" in text and "an even number (default: 0)" in text
    assert "sizes, comma-separated (default: 1,2)" in text and "--verbose, --no-verbose" in text
    assert "a declaration over several lines keeps its help (default: 3)" in " ".join(text.split())


@dataclass(frozen=True)
class Either:
    rate: str | None = field(default=None, metadata={"exclusive": "load"})  # open loop
    workers: str | None = field(default=None, metadata={"exclusive": "load"})  # closed loop


def test_fields_with_one_exclusive_key_are_mutually_exclusive_flags():
    p = argparse.ArgumentParser(prog="t")
    add_dataclass_args(p, Either)
    assert p.parse_args(["--rate", "2"]).rate == "2"
    with pytest.raises(SystemExit):
        p.parse_args(["--rate", "2", "--workers", "4"])
