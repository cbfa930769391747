"""Command-line flags generated from configuration dataclasses: the one way commands take settings.

A field becomes `--kebab-case`, typed from its annotation (`int | None` also takes
"none"; `bool` gets --x/--no-x; `tuple[str, ...]` takes "a,b", or repeats where
asked), with its trailing `# comment` as help and `choices` from its metadata. A
composed config (EngineConfig) lists its settings under flat names through
`flat_fields()`; others list their own fields. So a new config field is a new
flag without touching any command.

A field without a default is a required flag. Field metadata may also carry
`aliases` (more flag names, e.g. a short legacy one), `parse` (a converter for
values that are not int, float or str; it may raise argparse.ArgumentTypeError),
`metavar`, `choices` as a callable when the list is only known at run time, and
`exclusive` (fields with the same key are mutually exclusive flags).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import re
import textwrap
import types
import typing
from typing import Any

_NONE_WORDS = ("none", "null", "off")


@functools.cache
def _comments(cls: type) -> dict[str, str]:
    """Field name -> the `# comment` that ends its declaration in the class source (the flag's help),
    also when the declaration spans lines (`x: int = field(\n ...\n)  # help`). Read once per class:
    `inspect.getsource` parses the whole module (seconds for a parser of every command)."""
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = src.splitlines()
    out = {}
    for node in ast.parse(src).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            m = re.search(r"#\s*(.+)$", lines[node.end_lineno - 1][node.end_col_offset :])
            if m:
                out[node.target.id] = m[1].strip()
    return out


def _parser_for(tp: Any, repeated: bool, custom: Any = None):
    """(argparse type callable, is_bool) for a field annotation such as `int | None`."""
    if custom is not None:
        return custom, False
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else ()
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), tp) if args else tp
    if base is bool:
        return None, True
    item = typing.get_args(base)[0] if typing.get_origin(base) is tuple else base
    conv = item if item in (int, float, str) else str
    if typing.get_origin(base) is tuple and not repeated:  # "a,b" -> ("a", "b"); "1,2" -> (1, 2) for ints

        def parse(text: str):
            return tuple(conv(t.strip()) for t in text.split(",") if t.strip())

        parse.__name__ = f"list of {conv.__name__}"
        return parse, False

    def parse(text: str):
        if optional and text.lower() in _NONE_WORDS:
            return None
        return conv(text)

    parse.__name__ = conv.__name__  # argparse names the type in its error messages
    return parse, False


def _settings(cls: type) -> list[tuple[str, tuple[str, ...], type, dataclasses.Field]]:
    """(flat name, aliases, declaring class, field) for each setting of `cls`."""
    if hasattr(cls, "flat_fields"):
        return [(f.name, f.aliases, f.owner, f.field) for f in cls.flat_fields()]
    return [(f.name, tuple(f.metadata.get("aliases", ())), cls, f) for f in dataclasses.fields(cls)]


def add_dataclass_args(
    p: argparse.ArgumentParser,
    cls: type,
    *,
    only: tuple[str, ...] | None = None,
    skip: tuple[str, ...] = (),
    defaults: dict[str, Any] | None = None,
    repeatable: tuple[str, ...] = (),
    title: str | None = None,
    description: str | None = None,
) -> None:
    """One flag per setting of `cls` (or of `only` those), in a group titled `title`.

    `defaults` replaces a field's default for this command; a `repeatable` tuple field takes
    one value per use of its flag (`--stop a --stop b`) instead of a comma-separated list.
    """
    group = p.add_argument_group(title or cls.__name__, description)
    exclusive: dict[str, Any] = {}  # metadata["exclusive"] key -> its mutually exclusive group
    defaults = defaults or {}
    for name, aliases, owner, f in _settings(cls):
        if name in skip or (only is not None and name not in only):
            continue
        repeated = name in repeatable
        parse, is_bool = _parser_for(typing.get_type_hints(owner)[f.name], repeated, f.metadata.get("parse"))
        flags = ["--" + n.replace("_", "-") for n in (name, *aliases)]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        required = default is dataclasses.MISSING and name not in defaults
        default = None if required else defaults.get(name, default)
        shown = (",".join(map(str, default)) or "none") if isinstance(default, tuple) else default
        note = _comments(owner).get(f.name, "")
        help_text = note if required else f"{note} (default: {shown})" if note else f"default: {shown}"
        help_text = help_text.replace("%", "%%")  # argparse %-formats help
        choices = f.metadata.get("choices")
        choices = choices() if callable(choices) else choices
        extra = {"metavar": f.metadata["metavar"]} if "metavar" in f.metadata else {}
        key = f.metadata.get("exclusive")
        if key is not None and key not in exclusive:
            exclusive[key] = group.add_mutually_exclusive_group()
        target = group if key is None else exclusive[key]
        if is_bool:
            target.add_argument(
                *flags, dest=name, action=argparse.BooleanOptionalAction, default=default, help=help_text
            )
        elif repeated:
            target.add_argument(
                *flags,
                dest=name,
                type=parse,
                action="append",
                default=list(default or ()),
                choices=choices,
                help=f"{help_text}; repeat the flag for more",
                **extra,
            )
        else:
            target.add_argument(
                *flags,
                dest=name,
                type=parse,
                default=default,
                choices=choices,
                required=required,
                help=help_text,
                **extra,
            )


def pick(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The settings of `cls` found in parsed flags, as keywords for `cls(...)` (a repeated flag's list as a tuple)."""
    return {
        name: tuple(v) if isinstance(v := getattr(args, name), list) else v
        for name, *_ in _settings(cls)
        if hasattr(args, name)
    }
