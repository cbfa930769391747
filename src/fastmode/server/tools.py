"""Tool calls for every dialect: how tools reach the prompt, the grammar that
shapes a call, and the parser that turns generated text back into calls.

Chat messages here follow Hugging Face's convention, whatever the dialect:

    {"role": "assistant", "content": str | None,
     "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": dict}}]}
    {"role": "tool", "tool_call_id": str, "name": str (optional), "content": str}

Every call the model writes has one canonical layout,

    <tool_call>{"name": "NAME", "arguments": ARGS}</tool_call>

(a newline is allowed just inside the tags, as Hermes-style templates write
them; several calls are separated by one newline). The grammar from
`tool_grammar` lets NAME be only an offered tool and ARGS only a JSON object
valid under that tool's schema, written as `json.dumps` writes it (", " and
": " separators, no other whitespace), so `ToolCallParser` reads calls with a
deterministic scan of that layout, never by guessing over free text.

Prompts: a checkpoint whose chat template renders `tools` in this `<tool_call>`
format gets its own template. Any other template (the embedded SmolLM2's
renders no tools) gets the fallback: the tools, as JSON schemas, and the call
format described in the system prompt; assistant turns with calls written in
the canonical layout; tool results sent back as a user turn of
`<tool_response>...</tool_response>` blocks, one per result.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from fastmode.loader.tokenizer import Tokenizer
from fastmode.sampling_params import StructuredOutput

Message = dict[str, Any]

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"
CALL_SEPARATOR = "\n"  # between two calls of one turn
# Calls one turn may make when parallel calls are allowed. A bound keeps a model that repeats
# itself (the next most likely thing after a call is often another call) from filling its whole
# output budget with calls; the grammar then allows only the end of the turn.
MAX_CALLS_PER_TURN = 8
_NAME_PREFIX = '{"name": "'
_ARGS_PREFIX = '", "arguments": '
_CALL_END = "}"  # closes the call object; CALL_CLOSE follows
# The arguments' layout: json.dumps's separators, no other whitespace. A fixed
# layout keeps the model from padding with whitespace forever, and makes the
# arguments streamed to the client the same text the client is shown in history.
_JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# OpenAI's and Anthropic's rule for tool names; it also keeps names free of
# characters that would need escaping in JSON or in the grammar.
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_NAME_PREFIX_RE = re.compile(r"[A-Za-z0-9_.-]{0,128}")
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
        if not _NAME_RE.fullmatch(t.name):
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
        error = _schema_error(json.dumps(_arguments_schema(t), sort_keys=True))
        if error:
            raise ToolError(f"{param}[{i}] ({t.name}): the parameters schema is not usable: {error}", param)


def _arguments_schema(tool: ToolSpec) -> dict:
    options = {**_JSON_LAYOUT, **({} if tool.strict else {"lenient": True})}
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


# --- the grammar ------------------------------------------------------------------------

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
        prefix = _lark_string(_NAME_PREFIX + t.name + _ARGS_PREFIX)
        schema = json.dumps(_arguments_schema(t), ensure_ascii=False)
        lines.append(f"fn_{i}: {prefix} %json {schema} {_lark_string(_CALL_END)}\n")
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
        schema = {**schema, "x-guidance": {**_JSON_LAYOUT, **schema.get("x-guidance", {})}}
    return json.dumps(schema, ensure_ascii=False)


# --- rendering the prompt ---------------------------------------------------------------


def format_call(name: str, arguments: dict | str) -> str:
    """One call in the canonical layout, as the grammar makes the model write it."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f"{CALL_OPEN}{_NAME_PREFIX}{name}{_ARGS_PREFIX}{args}{_CALL_END}{CALL_CLOSE}"


def _tools_section(tools: Sequence[ToolSpec]) -> str:
    listed = "\n".join(
        json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters}, ensure_ascii=False)
        for t in tools
    )
    example = format_call("function_name", {"argument": "value"})
    return (
        "# Tools\n\n"
        "You can call functions to answer. Each function is described by one JSON object (its name, what it does, "
        "and a JSON schema of its arguments) inside <tools></tools>:\n"
        f"<tools>\n{listed}\n</tools>\n\n"
        "To call a function, write its name and arguments as a JSON object inside <tool_call></tool_call>, "
        f"one call per line and nothing after the last call:\n{example}\n"
        f"The result of each call comes back inside {RESPONSE_OPEN}{RESPONSE_CLOSE}."
    )


def fallback_messages(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> list[Message]:
    """`messages` rewritten for a template that knows only role and text content (see the module doc)."""
    out: list[Message] = []
    results_open = False  # the last message is a user turn of tool results: further results join it
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            block = f"{RESPONSE_OPEN}\n{content}\n{RESPONSE_CLOSE}"
            if results_open:
                out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + block}
            else:
                out.append({"role": "user", "content": block})
            results_open = True
            continue
        results_open = False
        if role == "assistant" and m.get("tool_calls"):
            calls = CALL_SEPARATOR.join(
                format_call(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]
            )
            content = f"{content}{calls}" if content else calls
        out.append({"role": role, "content": content})
    if tools:
        section = _tools_section(tools)
        if out and out[0]["role"] == "system":
            out[0] = {
                "role": "system",
                "content": f"{out[0]['content']}\n\n{section}" if out[0]["content"] else section,
            }
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


_PROBE_TOOL = ToolSpec("fastmode_probe_tool", "probe")
_native_by_template: dict[str, bool] = {}


def renders_tools(tok: Tokenizer) -> bool:
    """Whether the checkpoint's template renders `tools` itself, in the `<tool_call>` format the grammar enforces."""
    template = tok.chat_template
    if not template or CALL_OPEN not in template:
        return False
    if template not in _native_by_template:
        try:
            text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=[_PROBE_TOOL.as_hf()])
            _native_by_template[template] = _PROBE_TOOL.name in text
        except Exception:  # a template that fails on `tools` does not render them  # noqa: BLE001
            _native_by_template[template] = False
    return _native_by_template[template]


def render_text(
    tok: Tokenizer, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), add_generation_prompt: bool = True
) -> str:
    """The prompt text for a conversation with tools (either way of rendering)."""
    if renders_tools(tok):
        return tok.apply_chat_template(messages, add_generation_prompt, tools=[t.as_hf() for t in tools] or None)
    return tok.apply_chat_template(fallback_messages(messages, tools), add_generation_prompt)


def render_prompt(tok: Tokenizer, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> list[int]:
    """Prompt token ids for a conversation with tools. ValueError if the template refuses it."""
    # The template writes any BOS itself, so no special tokens are added on top.
    return tok.encode(render_text(tok, messages, tools), add_special_tokens=False)


# --- parsing generated text -------------------------------------------------------------


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsDelta:
    index: int
    fragment: str


@dataclass(frozen=True)
class CallEnd:
    index: int
    arguments_json: str


Event = TextDelta | CallStart | ArgumentsDelta | CallEnd


@dataclass(frozen=True)
class ToolCall:
    """A finished call: `arguments_json` is the JSON text of its arguments, exactly as generated."""

    id: str
    name: str
    arguments_json: str

    @property
    def arguments(self) -> dict:
        return json.loads(self.arguments_json)


def new_call_id(prefix: str = "call_") -> str:
    """`call_<hex>` (OpenAI), `toolu_<hex>` (Anthropic), `fc_<hex>` ..."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


_TEXT, _HEAD, _NAME, _MID, _ARGS, _TAIL, _AFTER = range(7)


class ToolCallParser:
    """Turns streamed output text into text and call events, incrementally.

    `feed(delta)` returns the events that text completes; text that may be the
    start of an opening tag is held back until the next delta decides it.
    `finish()` flushes what is held back; a call cut off by the token limit stays
    open (a CallStart without its CallEnd) and is not in `calls`.
    Output that strays from the canonical layout (possible only when no grammar
    constrained the turn) is passed on as text from the point it strays.
    """

    def __init__(self, id_prefix: str = "call_"):
        self.id_prefix = id_prefix
        self.text = ""  # all text outside calls
        self.calls: list[ToolCall] = []
        self._buf = ""  # received, not yet consumed
        self._state = _TEXT
        self._raw = ""  # the current call's consumed text, handed back as text if it strays
        self._id = self._name = ""
        self._args: list[str] = []
        self._depth = 0
        self._in_string = self._escaped = False
        self._started = False  # CallStart sent for the current call

    @property
    def open_call(self) -> bool:
        """A call has begun (CallStart sent) and not ended: the output was cut off inside it."""
        return self._started

    def feed(self, delta: str) -> list[Event]:
        self._buf += delta
        events: list[Event] = []
        while self._buf and self._step(events):
            pass
        return events

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if self._state == _TEXT and self._buf:
            self._emit_text(self._buf, events)
        self._buf = ""
        return events

    # Each _step consumes from self._buf and returns False when it needs more input.
    def _step(self, events: list[Event]) -> bool:
        state = self._state
        if state == _TEXT:
            at = self._buf.find(CALL_OPEN)
            if at < 0:
                keep = _partial_suffix(self._buf, CALL_OPEN)
                self._emit_text(self._buf[: len(self._buf) - keep], events)
                self._buf = self._buf[len(self._buf) - keep :]
                return False
            self._emit_text(self._buf[:at], events)
            self._take(at + len(CALL_OPEN))
            self._begin_call()
            return True
        if state == _HEAD:
            if self._buf.startswith("\n") and self._raw == CALL_OPEN:
                self._take(1)
            return self._literal(_NAME_PREFIX, _NAME, events)
        if state == _NAME:
            end = self._buf.find('"')
            if end < 0:
                return False if _NAME_PREFIX_RE.fullmatch(self._buf) else self._stray(events)
            name = self._buf[:end]
            if not _NAME_RE.fullmatch(name):
                return self._stray(events)
            self._take(end)
            self._name, self._id, self._started = name, new_call_id(self.id_prefix), True
            events.append(CallStart(len(self.calls), self._id, name))
            self._state = _MID
            return True
        if state == _MID:
            return self._literal(_ARGS_PREFIX, _ARGS, events)
        if state == _ARGS:
            return self._scan_arguments(events)
        if state == _TAIL:
            if self._buf.startswith(_CALL_END + "\n"):
                return self._literal(_CALL_END + "\n" + CALL_CLOSE, _AFTER, events, self._end_call)
            return self._literal(_CALL_END + CALL_CLOSE, _AFTER, events, self._end_call)
        # _AFTER: another call, or the end of the turn
        return self._literal(CALL_SEPARATOR + CALL_OPEN, _HEAD, events, self._begin_call)

    def _take(self, n: int) -> str:
        taken, self._buf = self._buf[:n], self._buf[n:]
        self._raw += taken
        return taken

    def _literal(self, lit: str, next_state: int, events: list[Event], then=None) -> bool:
        if len(self._buf) < len(lit):
            return False if lit.startswith(self._buf) else self._stray(events)
        if not self._buf.startswith(lit):
            return self._stray(events)
        self._take(len(lit))
        self._state = next_state
        if then is not None:
            then(events)
        return True

    def _scan_arguments(self, events: list[Event]) -> bool:
        # Tracks nesting outside strings: the arguments end where their outer object closes.
        buf = self._buf
        if not self._args and not buf.startswith("{"):
            return self._stray(events)
        end = None
        for i, ch in enumerate(buf):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    end = i + 1
                    break
        fragment = self._take(len(buf) if end is None else end)
        self._args.append(fragment)
        events.append(ArgumentsDelta(len(self.calls), fragment))
        if end is None:
            return False
        self._state = _TAIL
        return True

    def _begin_call(self, events: list[Event] | None = None) -> None:
        self._state, self._raw = _HEAD, CALL_OPEN
        self._args, self._depth, self._in_string, self._escaped = [], 0, False, False

    def _end_call(self, events: list[Event]) -> None:
        args = "".join(self._args)
        events.append(CallEnd(len(self.calls), args))
        self.calls.append(ToolCall(self._id, self._name, args))
        self._started, self._raw = False, ""

    def _stray(self, events: list[Event]) -> bool:
        """The output left the canonical layout: from here on it is text."""
        raw = "" if self._state == _AFTER else self._raw
        self._started, self._raw, self._state = False, "", _TEXT
        self._emit_text(raw, events)
        return True

    def _emit_text(self, text: str, events: list[Event]) -> None:
        if text:
            self.text += text
            events.append(TextDelta(text))


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
