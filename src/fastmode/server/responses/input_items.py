"""The input items of a Responses request and the chat messages they become.

Messages follow Hugging Face's chat shape, the shape chat templates render:
`message` items become messages (a `developer` message is a system message),
`function_call` items an assistant message's `tool_calls` (with dict
arguments), `function_call_output` items `tool` messages with `tool_call_id`,
and a `reasoning` item the `reasoning_content` of the assistant message or calls
that follow it (the template renders it, or drops it from earlier turns).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Tag

from fastmode.server.edge.errors import ApiError
from fastmode.server.responses.conversation import Message


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ContentPart(_Strict):
    type: Literal["input_text", "output_text", "text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


def _text(content: str | list[ContentPart]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class ReasoningText(_Strict):
    type: Literal["reasoning_text"]
    text: str


class SummaryText(_Strict):
    type: Literal["summary_text"]
    text: str


class ReasoningItem(_Strict):
    """An earlier answer's reasoning, sent back before the message or calls it led to."""

    type: Literal["reasoning"]
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None  # another server's; nothing here can read it
    id: str | None = None
    status: str | None = None

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.content or ())


_ITEM_KINDS = ("message", "function_call", "function_call_output", "reasoning")


def _item_kind(v: Any) -> str | None:
    kind = v.get("type", "message") if isinstance(v, dict) else getattr(v, "type", None)
    return kind if kind in _ITEM_KINDS else None


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(
        _item_kind,
        custom_error_type="input_item_type",
        custom_error_message="input items must be of type message, function_call, function_call_output or reasoning",
    ),
]


def input_messages(items: str | list[InputItem], history: list[Message]) -> list[Message]:
    """The input items as chat messages; `history` (earlier turns) names the calls tool outputs answer."""
    if not items:
        raise ApiError("invalid_request", "input is empty", param="input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    names = {c["id"]: c["function"]["name"] for m in history for c in m.get("tool_calls") or ()}
    out: list[Message] = []
    # Reasoning goes with the assistant message or calls that follow it; with none (a user
    # message or the end comes next) it has no answer to go with and is left out.
    thought = ""
    for i, item in enumerate(items):
        if isinstance(item, ReasoningItem):
            thought += item.text
            continue
        if isinstance(item, MessageItem):
            msg = {"role": "system" if item.role == "developer" else item.role, "content": _text(item.content)}
            if item.role == "assistant" and thought:
                msg["reasoning_content"] = thought
            out.append(msg)
        elif isinstance(item, FunctionCallItem):
            try:
                args = json.loads(item.arguments)
            except json.JSONDecodeError:
                args = None
            if not isinstance(args, dict):
                raise ApiError(
                    "invalid_request",
                    f"input[{i}].arguments must be a JSON object, as a string",
                    param=f"input[{i}].arguments",
                )
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": args}}
            names[item.call_id] = item.name
            last = out[-1] if out else None
            # Calls that follow an assistant message (or other calls) belong to that same assistant turn.
            if last is not None and last["role"] == "assistant":
                last["tool_calls"] = [*(last.get("tool_calls") or ()), call]
                if thought:
                    last["reasoning_content"] = (last.get("reasoning_content") or "") + thought
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                if thought:
                    out[-1]["reasoning_content"] = thought
        else:
            if item.call_id not in names:
                raise ApiError(
                    "invalid_request",
                    f"input[{i}] answers call_id `{item.call_id}`, but no function_call with that call_id precedes it",
                    param=f"input[{i}].call_id",
                )
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": item.call_id,
                    "name": names[item.call_id],
                    "content": _text(item.output),
                }
            )
        thought = ""
    return out
