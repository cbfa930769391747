"""The grammar of one turn with tools: a Lark grammar (llguidance dialect) in which
each call's arguments are a `%json` schema, shaped by the tool choice.

none: text only; auto: text, or text followed by calls (or, with a JSON answer
format, one such answer or calls); required: calls only; named: one call of the
named tool. Calls follow the layout in `tool_call_format`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from fastmode.sampling_params import StructuredOutput
from fastmode.server.tools.call_format import (
    ARGS_PREFIX,
    CALL_CLOSE,
    CALL_END,
    CALL_OPEN,
    CALL_SEPARATOR,
    JSON_LAYOUT,
    NAME_PREFIX,
)
from fastmode.server.tools.specs import ToolChoice, ToolError, ToolSpec, arguments_schema, check_tools

# Calls one turn may make when parallel calls are allowed. A bound keeps a model that repeats
# itself (the next most likely thing after a call is often another call) from filling its whole
# output budget with calls; the grammar then allows only the end of the turn.
MAX_CALLS_PER_TURN = 8

# Free text that never contains the opening tag: a text-only answer. `head` is any
# text up to the first opening tag (lazy: it ends at the first one), after which
# the call is constrained. Without the exclusion a malformed call would pass as text.
_TEXT_RULES = (
    "TEXT: /(?s:.*)/ & ~/(?s:.*)" + re.escape(CALL_OPEN) + "(?s:.*)/\n"
    "head[lazy]: /(?s:.*)" + re.escape(CALL_OPEN) + "/\n"
)


def _lark_string(s: str) -> str:
    return json.dumps(s)  # a Lark string literal uses JSON's escapes


def tool_grammar(
    tools: Sequence[ToolSpec], choice: ToolChoice, answer: StructuredOutput | None = None
) -> StructuredOutput | None:
    """The Lark grammar (llguidance dialect) for a turn with `tools` under `choice`.

    `answer` (a json_schema or json_object output, as OpenAI's response_format
    asks) is the form a reply without calls must take: under auto the turn is
    then one such answer or calls; calls only under required and named.
    None when nothing constrains the turn (no tools, or choice none without tools,
    and no answer format). Raises ToolError for bad tools, a named choice that
    names no offered tool, or an answer format that is not JSON.
    """
    if answer is not None and answer.kind not in ("json_schema", "json_object"):
        raise ToolError(f"a {answer.kind} output format cannot be combined with tools", "response_format")
    if not tools:
        if choice.mode in ("required", "named"):
            raise ToolError(f"tool_choice {choice.mode!r} needs at least one tool in `tools`", "tool_choice")
        return answer
    check_tools(tools)
    if choice.mode == "none":  # tools described in the prompt but not callable
        return answer or StructuredOutput("lark", "start: TEXT\n" + _TEXT_RULES)
    offered = list(tools)
    if choice.mode == "named":
        offered = [t for t in tools if t.name == choice.name]
        if not offered:
            names = ", ".join(t.name for t in tools)
            raise ToolError(f"tool_choice names {choice.name!r}, which is not in `tools` ({names})", "tool_choice")
    # A named choice is one call of that tool, as the APIs document it; parallel calls are for auto and required.
    parallel = choice.parallel and choice.mode != "named"
    more = "more: " + (_more_calls(MAX_CALLS_PER_TURN - 1) if parallel else "") + "\n"
    calls = f"{_lark_string(CALL_OPEN)} call more"
    if choice.mode != "auto":
        start = f"start: {calls}\n"
    elif answer is None:
        start = "start: TEXT | head call more\n"
    else:  # a JSON answer never starts with the opening tag: the first byte decides
        start = f"start: answer | {calls}\nanswer: %json {_answer_schema(answer)}\n"
    lines = [
        start,
        more,
        f'call: "\\n"? ({" | ".join(f"fn_{i}" for i in range(len(offered)))}) "\\n"? {_lark_string(CALL_CLOSE)}\n',
    ]
    for i, t in enumerate(offered):
        prefix = _lark_string(NAME_PREFIX + t.name + ARGS_PREFIX)
        schema = json.dumps(arguments_schema(t), ensure_ascii=False)
        lines.append(f"fn_{i}: {prefix} %json {schema} {_lark_string(CALL_END)}\n")
    return StructuredOutput("lark", "".join(lines) + _TEXT_RULES)


def _more_calls(n: int) -> str:
    """Up to `n` further calls, as nested optional groups (one call, then up to n - 1 more)."""
    step = f"{_lark_string(CALL_SEPARATOR + CALL_OPEN)} call"
    inner = ""
    for _ in range(n):
        inner = f"({step} {inner})?" if inner else f"({step})?"
    return inner


def _answer_schema(answer: StructuredOutput) -> str:
    schema = json.loads(answer.spec) if answer.kind == "json_schema" else {"type": "object"}
    if isinstance(schema, dict):
        schema = {**schema, "x-guidance": {**JSON_LAYOUT, **schema.get("x-guidance", {})}}
    return json.dumps(schema, ensure_ascii=False)
