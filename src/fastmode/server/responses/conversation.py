"""Conversations continued by `previous_response_id`, built so the KV prefix cache hits.

The engine's prefix cache matches token ids, block by block. Re-rendering a
whole conversation as text and tokenizing it again need not reproduce the
tokens the model generated (a reply may tokenize differently the second
time, and a tool call the template renders need not be laid out as the model
wrote it), and one changed token early on loses every block after it. So a
continued turn is built as

    previous prompt ids + previous output ids + ids of (turn closing + new turn)

where the bridge text is what the chat template puts between the previous
reply and the next generation prompt. Its prefix is exactly the previous
request's tokens, so every full block of it is served from the cache.
A warm-up turn (generated nothing) holds the conversation without a
generation prompt, and the next turn's text follows it directly.
If the template does not render conversations as a growing prefix, or the
instructions or tools changed, or a stop string cut the reply (its tokens
hold text the client never saw), or the turn continues on another served
model (whose tokenizer may differ and whose prefix cache holds none of those
tokens), the conversation is rendered afresh instead.

Messages follow Hugging Face's chat shape: `{"role", "content"}`, assistant
messages may carry `tool_calls` ([{id, type: "function", function: {name,
arguments: dict}}]) and a thinking model's `reasoning_content` (its template
renders it, or drops it from earlier turns, as Qwen3's does), and `tool`
messages carry `tool_call_id`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastmode.loader.tokenizer import Tokenizer

Message = dict[str, Any]
# A conversation (system message included) -> the prompt text; the flag adds the generation prompt.
Render = Callable[[list[Message], bool], str]


@dataclass(frozen=True)
class Turn:
    """A finished response, kept so the next turn can continue it."""

    response_id: str
    instructions: str | None
    messages: list[Message]  # the conversation without the system message, ending with this reply
    prompt_ids: list[int]
    output_ids: list[int]
    reusable: bool  # False when the output tokens do not match the reply text (stop string)
    model: str = ""  # the served model that produced it
    tools: str = ""  # what of the prompt besides messages and instructions (the tools offered), as a key
    generated: bool = True  # False for a warm-up: no reply, and prompt_ids lack the generation prompt
    response: dict | None = None  # the response object, as GET /v1/responses/{id} returns it


# What a kept turn costs in memory, roughly: a token id in a Python list (pointer and int
# object), and per character of text (kept in the messages and again in the response).
_BYTES_PER_TOKEN = 36
_BYTES_PER_CHAR = 2
_BYTES_PER_TURN = 2048


def turn_bytes(turn: Turn) -> int:
    """An estimate of the memory a kept turn holds."""
    chars = sum(
        len(m.get(key) or "")
        for m in turn.messages
        for key in ("content", "reasoning_content")
        if isinstance(m.get(key), str)
    )
    return _BYTES_PER_TURN + _BYTES_PER_TOKEN * (len(turn.prompt_ids) + len(turn.output_ids)) + _BYTES_PER_CHAR * chars


class ResponseStore:
    """The last turns by response id (LRU), at most `capacity` of them and `max_bytes` of
    their estimated memory (`turn_bytes`). Bounded so a long-lived server does not keep
    every conversation it ever served; a turn larger than the whole budget is not kept."""

    def __init__(self, capacity: int, max_bytes: int | None = None):
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._turns: OrderedDict[str, tuple[Turn, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._turns)

    def get(self, response_id: str) -> Turn | None:
        entry = self._turns.get(response_id)
        if entry is None:
            return None
        self._turns.move_to_end(response_id)
        return entry[0]

    def pop(self, response_id: str) -> Turn | None:
        entry = self._turns.pop(response_id, None)
        if entry is None:
            return None
        self.num_bytes -= entry[1]
        return entry[0]

    def put(self, turn: Turn) -> None:
        self.pop(turn.response_id)
        size = turn_bytes(turn)
        if self.max_bytes is not None and size > self.max_bytes:
            return
        self._turns[turn.response_id] = (turn, size)
        self.num_bytes += size
        while len(self._turns) > self.capacity or (self.max_bytes is not None and self.num_bytes > self.max_bytes):
            _, (_, old) = self._turns.popitem(last=False)
            self.num_bytes -= old


def with_system(instructions: str | None, messages: list[Message]) -> list[Message]:
    return ([{"role": "system", "content": instructions}] if instructions else []) + messages


def build_prompt(
    tok: Tokenizer,
    prev: Turn | None,
    instructions: str | None,
    new_messages: list[Message],
    model: str = "",
    render: Render | None = None,
    tools: str = "",
    add_generation_prompt: bool = True,
) -> tuple[list[int], list[Message], bool]:
    """(prompt ids, the conversation so far without system, whether the previous turn's tokens were reused).

    `render` is the chat template (with any tools); `tools` keys what it adds
    besides the messages, so a turn that changes the tools renders afresh.
    Without `add_generation_prompt` the ids end with the last message (a warm-up).
    """
    render = render or tok.apply_chat_template
    history = (prev.messages if prev else []) + new_messages
    if (
        prev is not None
        and prev.reusable
        and prev.instructions == instructions
        and prev.model == model
        and prev.tools == tools
    ):
        bridge = _bridge_text(tok, render, prev, new_messages, add_generation_prompt)
        if bridge is not None:
            ids = prev.prompt_ids + prev.output_ids + tok.encode(bridge, add_special_tokens=False)
            return ids, history, True
    text = render(with_system(instructions, history), add_generation_prompt)
    return tok.encode(text, add_special_tokens=False), history, False


def _bridge_text(
    tok: Tokenizer, render: Render, prev: Turn, new_messages: list[Message], add_generation_prompt: bool
) -> str | None:
    """Text between the previous turn's tokens and the next prompt's end, or
    None if the template does not render this conversation as a growing prefix."""
    if not prev.generated:  # a warm-up: its ids are the conversation up to its last message
        before = render(with_system(prev.instructions, prev.messages), False)
        following = render(with_system(prev.instructions, prev.messages + new_messages), add_generation_prompt)
        return following[len(before) :] if following.startswith(before) else None
    before_msgs = with_system(prev.instructions, prev.messages[:-1])
    # The text of the tokens the model produced, which may differ from the reply
    # the client saw (an incomplete UTF-8 tail is held back from the client).
    # Only the template's text around it matters here; the tokens come from the
    # previous request as they are.
    reply = tok.decode(prev.output_ids)
    message = prev.messages[-1]
    if not message.get("tool_calls"):
        # The reply's tokens hold its think block too, as the model wrote it: the message is the
        # whole of it, not the block apart (`reasoning_content`) and the answer again.
        message = {k: v for k, v in message.items() if k != "reasoning_content"} | {"content": reply}
    opened = render(before_msgs, True)
    closed = render(before_msgs + [message], False)
    following = render(before_msgs + [message] + new_messages, add_generation_prompt)
    if not closed.startswith(opened) or not following.startswith(closed):
        return None
    rendered = closed[len(opened) :]  # the reply as the template writes it, with its closing
    last = prev.output_ids[-1] if prev.output_ids else None
    eos_text = (tok.token_to_str(last) or "") if last is not None and last in tok.eos_token_ids else None
    if rendered.startswith(reply):
        closing = rendered[len(reply) :]  # e.g. "<|im_end|>\n"
        if eos_text is not None:
            # The model already wrote the end-of-turn token; the template's copy of it is not repeated.
            if not closing.startswith(eos_text):
                return None
            closing = closing[len(eos_text) :]
    elif eos_text and eos_text in rendered:
        # The template lays the reply out otherwise than the model wrote it (a
        # tool call's JSON, say): the model's own tokens stay, and the template's
        # text resumes after the end-of-turn marker both of them end with.
        closing = rendered[rendered.rindex(eos_text) + len(eos_text) :]
    else:
        return None
    return closing + following[len(closed) :]
