"""Parsing tool calls out of generated text, incrementally (for streaming).

Calls are read with a deterministic scan of the canonical layout
(`tool_call_format`), never by guessing over free text: under a tool grammar
the model can write nothing else.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from fastmode.server.tools.call_format import (
    ARGS_PREFIX,
    CALL_CLOSE,
    CALL_END,
    CALL_OPEN,
    CALL_SEPARATOR,
    NAME_PREFIX,
    NAME_PREFIX_RE,
    NAME_RE,
)


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
            return self._literal(NAME_PREFIX, _NAME, events)
        if state == _NAME:
            end = self._buf.find('"')
            if end < 0:
                return False if NAME_PREFIX_RE.fullmatch(self._buf) else self._stray(events)
            name = self._buf[:end]
            if not NAME_RE.fullmatch(name):
                return self._stray(events)
            self._take(end)
            self._name, self._id, self._started = name, new_call_id(self.id_prefix), True
            events.append(CallStart(len(self.calls), self._id, name))
            self._state = _MID
            return True
        if state == _MID:
            return self._literal(ARGS_PREFIX, _ARGS, events)
        if state == _ARGS:
            return self._scan_arguments(events)
        if state == _TAIL:
            if self._buf.startswith(CALL_END + "\n"):
                return self._literal(CALL_END + "\n" + CALL_CLOSE, _AFTER, events, self._end_call)
            return self._literal(CALL_END + CALL_CLOSE, _AFTER, events, self._end_call)
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
