"""Conversations continued by `previous_response_id`, built so the KV prefix cache hits.

The engine's prefix cache matches token ids, block by block. Re-rendering a
whole conversation as text and tokenizing it again need not reproduce the
tokens the model generated (a reply may tokenize differently the second
time), and one changed token early on loses every block after it. So a
continued turn is built as

    previous prompt ids + previous output ids + ids of (turn closing + new turn)

where the bridge text is what the chat template puts between the previous
reply and the next generation prompt. Its prefix is exactly the previous
request's tokens, so every full block of it is served from the cache.
If the template does not render conversations as a growing prefix, or the
instructions changed, or a stop string cut the reply (its tokens hold text
the client never saw), or the turn continues on another served model (whose
tokenizer may differ and whose prefix cache holds none of those tokens), the
conversation is rendered afresh instead.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from fastmode.loader.tokenizer import Tokenizer

Message = dict[str, str]


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


class ResponseStore:
    """The last `capacity` turns by response id (LRU). Bounded so a long-lived
    server does not keep every conversation it ever served."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._turns: OrderedDict[str, Turn] = OrderedDict()

    def __len__(self) -> int:
        return len(self._turns)

    def get(self, response_id: str) -> Turn | None:
        turn = self._turns.get(response_id)
        if turn is not None:
            self._turns.move_to_end(response_id)
        return turn

    def put(self, turn: Turn) -> None:
        self._turns[turn.response_id] = turn
        self._turns.move_to_end(turn.response_id)
        while len(self._turns) > self.capacity:
            self._turns.popitem(last=False)


def _with_system(instructions: str | None, messages: list[Message]) -> list[Message]:
    return ([{"role": "system", "content": instructions}] if instructions else []) + messages


def build_prompt(
    tok: Tokenizer, prev: Turn | None, instructions: str | None, new_messages: list[Message], model: str = ""
) -> tuple[list[int], list[Message], bool]:
    """(prompt ids, the conversation so far without system, whether the previous turn's tokens were reused)."""
    history = (prev.messages if prev else []) + new_messages
    if prev is not None and prev.reusable and prev.instructions == instructions and prev.model == model:
        bridge = _bridge_text(tok, prev, new_messages)
        if bridge is not None:
            ids = prev.prompt_ids + prev.output_ids + tok.encode(bridge, add_special_tokens=False)
            return ids, history, True
    return tok.encode_chat(_with_system(instructions, history)), history, False


def _bridge_text(tok: Tokenizer, prev: Turn, new_messages: list[Message]) -> str | None:
    """Text between the previous output tokens and the next generation prompt, or
    None if the template does not render this conversation as a growing prefix."""
    before = _with_system(prev.instructions, prev.messages[:-1])
    # The text of the tokens the model produced, which may differ from the reply
    # the client saw (an incomplete UTF-8 tail is held back from the client).
    # Only the template's text around it matters here; the tokens come from the
    # previous request as they are.
    reply = tok.decode(prev.output_ids)
    opened = tok.apply_chat_template(before, add_generation_prompt=True)
    closed = tok.apply_chat_template(before + [{"role": "assistant", "content": reply}], add_generation_prompt=False)
    following = tok.apply_chat_template(
        before + [{"role": "assistant", "content": reply}] + new_messages, add_generation_prompt=True
    )
    if not closed.startswith(opened + reply) or not following.startswith(closed):
        return None
    closing = closed[len(opened) + len(reply) :]  # e.g. "<|im_end|>\n"
    last = prev.output_ids[-1] if prev.output_ids else None
    if last is not None and last in tok.eos_token_ids:
        # The model already wrote the end-of-turn token; the template's copy of it is not repeated.
        eos_text = tok.token_to_str(last) or ""
        if not closing.startswith(eos_text):
            return None
        closing = closing[len(eos_text) :]
    return closing + following[len(closed) :]
