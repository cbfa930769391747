"""The agent tasks' sandbox: a small deterministic world of files, a key-value store,
a calculator, a unit table and a calendar, reached only through tool calls.

A `World` holds all the state a task can change (files and keys); every tool is a
pure function of that state and its arguments, so a call sequence replays to the
same observations and the same final state on every run. A call the world cannot
carry out (a missing key or file, a unit it does not know, a malformed date, an
argument of the wrong type) returns an observation that starts with "error:" and
leaves the state as it was: that is what a verifier sees as a rejected call.

Tool names and arguments are kept short and flat (one to three arguments, no
nesting) because the embedded model is a 135M one: what is measured is whether it
carries a value from one observation into the next call, not whether it can spell
a complex schema.
"""

from __future__ import annotations

import copy
import datetime as dt
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ERROR_PREFIX = "error: "
# Long enough for every name and value in the suite; a bound keeps a small model
# from writing one string until its token budget runs out.
MAX_STRING_CHARS = 48

# Exact factors to a base unit per dimension; conversions stay inside a dimension.
UNITS: dict[str, tuple[str, float]] = {
    "km": ("length", 1000.0),
    "m": ("length", 1.0),
    "cm": ("length", 0.01),
    "kg": ("mass", 1000.0),
    "g": ("mass", 1.0),
    "h": ("time", 3600.0),
    "min": ("time", 60.0),
    "s": ("time", 1.0),
    "l": ("volume", 1000.0),
    "ml": ("volume", 1.0),
}
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _string(description: str) -> dict:
    return {"type": "string", "description": description, "maxLength": MAX_STRING_CHARS}


def _number(description: str) -> dict:
    return {"type": "number", "description": description}


def _schema(**properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


@dataclass(frozen=True)
class Tool:
    """One callable tool: its description and the JSON schema of its arguments, as sent in `tools`."""

    name: str
    description: str
    parameters: dict

    def as_openai(self) -> dict:
        """The Chat Completions `tools` entry."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool("get", "Get the value stored under a key.", _schema(key=_string("the key"))),
        Tool("put", "Store a value under a key.", _schema(key=_string("the key"), value=_string("the value"))),
        Tool("list_dir", "List the files in a folder.", _schema(folder=_string("the folder"))),
        Tool("read_file", "Read a file.", _schema(path=_string("the file path, folder/name"))),
        Tool(
            "write_file",
            "Write text to a file.",
            _schema(path=_string("the file path, folder/name"), text=_string("the text")),
        ),
        Tool("add", "Add two numbers: a + b.", _schema(a=_number("a number"), b=_number("a number"))),
        Tool("subtract", "Subtract two numbers: a - b.", _schema(a=_number("a number"), b=_number("a number"))),
        Tool("multiply", "Multiply two numbers: a * b.", _schema(a=_number("a number"), b=_number("a number"))),
        Tool(
            "convert",
            "Convert an amount from one unit to another (km, m, cm, kg, g, h, min, s, l, ml).",
            _schema(amount=_number("the amount"), unit=_string("its unit"), to=_string("the unit to convert to")),
        ),
        Tool(
            "add_days",
            "Add a number of days to a date (YYYY-MM-DD).",
            _schema(date=_string("a date, YYYY-MM-DD"), days={"type": "integer", "description": "days to add"}),
        ),
        Tool("weekday", "The day of the week of a date (YYYY-MM-DD).", _schema(date=_string("a date, YYYY-MM-DD"))),
        Tool("answer", "Give the final answer and finish.", _schema(value=_string("the answer"))),
    )
}
ANSWER_TOOL = "answer"


def format_number(x: float) -> str:
    """A number as the world writes it: integers without a decimal point, others to 6 places."""
    if math.isfinite(x) and x == round(x) and abs(x) < 1e15:
        return str(int(round(x)))
    return f"{x:.6f}".rstrip("0").rstrip(".")


def parse_number(text: Any) -> float | None:
    """`text` as a number (an int, a float, or a string of one), else None."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int | float):
        return float(text)
    if isinstance(text, str):
        try:
            value = float(text.strip().replace(",", ""))
        except ValueError:
            return None
        return value if math.isfinite(value) else None
    return None


def same_value(given: Any, expected: Any) -> bool:
    """Whether two values mean the same: numbers numerically (to 1e-6 relative), text
    without surrounding whitespace, quotes or a final period, and without regard to case."""
    a, b = parse_number(given), parse_number(expected)
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)

    def norm(v: Any) -> str:
        return str(v).strip().strip("'\"").rstrip(".").strip().casefold()

    return norm(given) == norm(expected)


class CallError(Exception):
    """A call the world refuses; its message becomes the "error: ..." observation."""


@dataclass(frozen=True)
class Observation:
    """What one call returned. `ok` is False when the world refused the call."""

    text: str
    ok: bool


@dataclass
class World:
    """Files (path -> text) and keys (key -> value): everything a task can read or change."""

    files: dict[str, str] = field(default_factory=dict)
    kv: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> World:
        unknown = set(data) - {"files", "kv"}
        if unknown:
            raise ValueError(f"unknown world fields {sorted(unknown)}")
        return cls(dict(data.get("files", {})), {k: str(v) for k, v in data.get("kv", {}).items()})

    def to_dict(self) -> dict[str, dict[str, str]]:
        return {"files": dict(self.files), "kv": dict(self.kv)}

    def copy(self) -> World:
        return copy.deepcopy(self)

    def same_state(self, other: World) -> bool:
        """The same files and keys, with values compared as `same_value` does."""
        return _same_map(self.files, other.files) and _same_map(self.kv, other.kv)

    def call(self, name: str, arguments: Any) -> Observation:
        """Run one tool call; a refused call leaves the world unchanged."""
        try:
            if name == ANSWER_TOOL:
                raise CallError("answer ends the task; it is not run in the world")
            handler = _HANDLERS.get(name)
            if handler is None:
                raise CallError(f"no tool named {name!r}")
            args = _check_arguments(TOOLS[name], arguments)
            return Observation(handler(self, args), True)
        except CallError as e:
            return Observation(ERROR_PREFIX + str(e), False)

    # --- the tools ---------------------------------------------------------------

    # Keys and paths are case-insensitive (the suite's are lower case): "Sage" finds "sage".
    # A write answers with what it wrote, which is what the next step goes on with.

    def _get(self, a: dict) -> str:
        key = a["key"].strip().lower()
        if key not in self.kv:
            raise CallError(f"no key {key!r}")
        return self.kv[key]

    def _put(self, a: dict) -> str:
        key = a["key"].strip().lower()
        if not key:
            raise CallError("the key is empty")
        self.kv[key] = a["value"].strip()
        return self.kv[key]

    def _list_dir(self, a: dict) -> str:
        folder = a["folder"].strip().strip("/").lower()
        names = sorted(p[len(folder) + 1 :] for p in self.files if p.startswith(folder + "/"))
        if not folder or not names:
            raise CallError(f"no folder {folder!r}")
        return "\n".join(names)

    def _read_file(self, a: dict) -> str:
        path = a["path"].strip().strip("/").lower()
        if path not in self.files:
            raise CallError(f"no file {path!r}")
        return self.files[path]

    def _write_file(self, a: dict) -> str:
        path = a["path"].strip().strip("/").lower()
        if "/" not in path or not path.split("/")[-1]:
            raise CallError(f"{path!r} is not a path of the form folder/name")
        self.files[path] = a["text"].strip()
        return self.files[path]

    def _add(self, a: dict) -> str:
        return format_number(a["a"] + a["b"])

    def _subtract(self, a: dict) -> str:
        return format_number(a["a"] - a["b"])

    def _multiply(self, a: dict) -> str:
        return format_number(a["a"] * a["b"])

    def _convert(self, a: dict) -> str:
        src, dst = a["unit"].strip().lower(), a["to"].strip().lower()
        for u in (src, dst):
            if u not in UNITS:
                raise CallError(f"unknown unit {u!r}; known: {', '.join(UNITS)}")
        (dim_a, f_a), (dim_b, f_b) = UNITS[src], UNITS[dst]
        if dim_a != dim_b:
            raise CallError(f"cannot convert {dim_a} ({src}) to {dim_b} ({dst})")
        return format_number(a["amount"] * f_a / f_b)

    def _add_days(self, a: dict) -> str:
        return (_date(a["date"]) + dt.timedelta(days=a["days"])).isoformat()

    def _weekday(self, a: dict) -> str:
        return WEEKDAYS[_date(a["date"]).weekday()]


_HANDLERS: dict[str, Callable[[World, dict], str]] = {
    "get": World._get,
    "put": World._put,
    "list_dir": World._list_dir,
    "read_file": World._read_file,
    "write_file": World._write_file,
    "add": World._add,
    "subtract": World._subtract,
    "multiply": World._multiply,
    "convert": World._convert,
    "add_days": World._add_days,
    "weekday": World._weekday,
}


def _same_map(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)


def _date(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text.strip())
    except ValueError:
        raise CallError(f"{text!r} is not a date of the form YYYY-MM-DD") from None


def _check_arguments(tool: Tool, arguments: Any) -> dict:
    """The arguments checked against the tool's schema (the server's grammar enforces the
    same schema, so this refuses only what a client could send without one)."""
    if not isinstance(arguments, dict):
        raise CallError(f"{tool.name}: the arguments must be a JSON object")
    props = tool.parameters["properties"]
    missing = [k for k in props if k not in arguments]
    extra = [k for k in arguments if k not in props]
    if missing or extra:
        raise CallError(f"{tool.name}: needs exactly the arguments {', '.join(props)}")
    out = {}
    for key, spec in props.items():
        value = arguments[key]
        kind = spec["type"]
        if kind == "string":
            if not isinstance(value, str):
                raise CallError(f"{tool.name}: {key} must be a string")
        elif kind == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                raise CallError(f"{tool.name}: {key} must be an integer")
        elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise CallError(f"{tool.name}: {key} must be a number")
        out[key] = value
    return out
