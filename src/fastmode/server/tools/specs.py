"""The tools a request offers and its tool choice: their types, and the checks
that refuse what cannot be served (bad names, duplicates, schemas the grammar
engine cannot compile) as a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from fastmode.server.tools.call_format import JSON_LAYOUT, NAME_RE

_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


class ToolError(ValueError):
    """A tool definition or choice that cannot be served; `param` names the field (a 400)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolSpec:
    """One function the model may call. `parameters` is a JSON schema of an object.

    `strict` false (OpenAI's default) compiles the schema leniently: keywords the
    grammar engine does not implement are ignored instead of refused.
    """

    name: str
    description: str = ""
    parameters: dict | None = None  # None: no arguments (an object with any properties)
    strict: bool = False

    def __post_init__(self) -> None:
        if self.parameters is None:
            object.__setattr__(self, "parameters", dict(_EMPTY_PARAMETERS))

    def as_hf(self) -> dict:
        """The shape chat templates expect (transformers' `tools=` argument)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolChoice:
    """Whether the model must, may or must not call a tool.

    none: no calls; auto: text, or text followed by calls; required: calls only;
    named: exactly one call of `name`. `parallel`: more than one call per turn (auto, required).
    """

    mode: Literal["none", "auto", "required", "named"] = "auto"
    name: str | None = None
    parallel: bool = True

    def __post_init__(self) -> None:
        if self.mode not in ("none", "auto", "required", "named"):
            raise ValueError(f"unknown tool choice mode {self.mode!r}")
        if (self.mode == "named") != (self.name is not None):
            raise ValueError("a named tool choice needs a name, and only a named one has one")


def check_tools(tools: Sequence[ToolSpec], param: str = "tools") -> None:
    """Refuse bad names, duplicates and schemas the grammar engine cannot compile, naming the tool."""
    seen: set[str] = set()
    for i, t in enumerate(tools):
        if not NAME_RE.fullmatch(t.name):
            raise ToolError(
                f"{param}[{i}] has the name {t.name!r}; tool names are 1-128 characters "
                "of letters, digits, '_', '.' and '-'",
                param,
            )
        if t.name in seen:
            raise ToolError(f"{param}[{i}]: two tools are named {t.name!r}; tool names must be unique", param)
        seen.add(t.name)
        if not isinstance(t.parameters, dict) or t.parameters.get("type", "object") != "object":
            raise ToolError(
                f"{param}[{i}] ({t.name}): the parameters schema must describe a JSON object "
                '({"type": "object", ...})',
                param,
            )
        error = _schema_error(json.dumps(arguments_schema(t), sort_keys=True))
        if error:
            raise ToolError(f"{param}[{i}] ({t.name}): the parameters schema is not usable: {error}", param)


def arguments_schema(tool: ToolSpec) -> dict:
    """The schema the grammar compiles for a call's arguments: the tool's, in the canonical JSON layout."""
    options = {**JSON_LAYOUT, **({} if tool.strict else {"lenient": True})}
    return {**(tool.parameters or _EMPTY_PARAMETERS), "x-guidance": options}


@lru_cache(maxsize=256)
def _schema_error(schema_json: str) -> str:
    """llguidance's complaint about a schema ('' if it compiles); cached, agents resend the same tools."""
    from llguidance import LLMatcher

    try:
        grammar = LLMatcher.grammar_from_json_schema(schema_json)
    except ValueError as e:
        return str(e)
    error = LLMatcher.validate_grammar(grammar).strip()
    return error.splitlines()[0] if error else ""
