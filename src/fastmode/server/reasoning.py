"""Reasoning content: the `<think>...</think>` block a thinking model (Qwen3) writes before its
answer, reported apart from the answer instead of mixed into it.

OpenAI chat reports it as `reasoning_content` on the message (`delta.reasoning_content` when
streaming), as vLLM does; the Responses API as a `reasoning` output item before the answer;
Anthropic as `thinking` content blocks. A request switches thinking with OpenAI's effort
(`reasoning_effort` in chat, `reasoning.effort` in Responses: "none" off, any other effort on;
absent: the template's own default; `effort_switch`) or Anthropic's `thinking`
({"type": "enabled"} on, "disabled" or absent off, as with Claude), mapped onto the chat
template's `enable_thinking` variable. There is no thinking budget: a model with the switch
either thinks or does not, so "minimal" thinks as fully as "high".

Usage counts the block's tokens as reasoning tokens (`reasoning_tokens`): counted on the
output's token ids, up to and including the token that closes the block.

`ReasoningParser` splits the text as it streams: the tags arrive in pieces of any size (a tag
may be split across tokens, or several tags and text may come in one piece), so text that may
be the start of a tag is held back until the next piece decides it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from fastmode.loader.tokenizer import Tokenizer

OPEN, CLOSE = "<think>", "</think>"
# OpenAI's reasoning efforts (its SDK's ReasoningEffort). Without a thinking budget only "none"
# differs from the rest: it switches thinking off.
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


def effort_switch(effort: str | None) -> bool | None:
    """The template's thinking switch for an OpenAI reasoning effort; None: the template's default."""
    return None if effort is None else effort != "none"


def is_thinking_model(tok: Tokenizer) -> bool:
    """Whether this model writes think blocks: its chat template knows the closing tag."""
    return bool(tok.chat_template) and CLOSE in tok.chat_template


def with_thinking(tok: Tokenizer, enabled: bool | None) -> Tokenizer:
    """The tokenizer whose template renders with thinking switched on or off (None: the template's default)."""
    if enabled is None or not tok.has_thinking_switch:
        return tok
    return tok.with_template_variables(enable_thinking=enabled)


def prompt_opens_thinking(tok: Tokenizer, prompt_ids: Sequence[int]) -> bool:
    """Whether the prompt itself ends inside a think block (templates that write `<think>` after
    the generation prompt), so the output starts as reasoning without an opening tag."""
    tail = tok.decode(list(prompt_ids[-8:]), skip_special_tokens=False)
    return tail.rstrip().endswith(OPEN)


def reasoning_token_count(tok: Tokenizer, output_ids: Sequence[int], opened: bool | None) -> int:
    """How many of `output_ids` wrote the think block: the tokens up to and including the one
    that completes `</think>` (all of them when the block never closes), 0 when the output holds
    no block. `opened`: whether the prompt opened the block (`prompt_opens_thinking`); None for
    a model that writes none. Counted on the ids, so a tag split over several tokens counts
    every one of them."""
    if opened is None or not output_ids:
        return 0
    if not opened and not tok.decode(list(output_ids), skip_special_tokens=False).lstrip().startswith(OPEN):
        return 0
    close = tok.encode(CLOSE, add_special_tokens=False)
    if len(close) == 1:  # the tag is one token (Qwen3): find it
        ids = list(output_ids)
        return ids.index(close[0]) + 1 if close[0] in ids else len(ids)

    # The tag spans tokens: the shortest prefix whose text holds it (holding it only grows with the prefix).
    def holds(n: int) -> bool:
        text = tok.decode(list(output_ids[:n]), skip_special_tokens=False)
        if not opened:
            if OPEN not in text:
                return False
            text = text[text.index(OPEN) + len(OPEN) :]
        return CLOSE in text

    if not holds(len(output_ids)):
        return len(output_ids)
    lo, hi = 1, len(output_ids)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if holds(mid) else (mid + 1, hi)
    return lo


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningParser:
    """Feeds generated text, returns (reasoning, content) deltas.

    The output is reasoning when it opens with `<think>` (leading whitespace allowed) or when the
    prompt already opened the block; reasoning ends at `</think>`, and the newlines around the
    tags are dropped. Output that opens with anything else is all content. A block that never
    closes (the length limit cut it) stays reasoning."""

    def __init__(self, in_reasoning: bool = False):
        self.state = "reasoning" if in_reasoning else "start"
        self.held = ""  # text that may still turn out to be (part of) a tag
        self.strip_newlines = in_reasoning  # drop newlines at the start of the next reasoning/content

    def feed(self, text: str) -> tuple[str, str]:
        reasoning, content = [], []
        text = self.held + text
        self.held = ""
        while text:
            if self.state == "start":
                stripped = text.lstrip()
                if stripped.startswith(OPEN):
                    self.state, self.strip_newlines = "reasoning", True
                    text = stripped[len(OPEN) :]
                elif OPEN.startswith(stripped):  # whitespace or a partial tag: wait for more
                    self.held = text
                    break
                else:
                    self.state = "content"
            elif self.state == "reasoning":
                if self.strip_newlines:
                    text = text.lstrip("\n")
                    if not text:
                        break
                    self.strip_newlines = False
                end = text.find(CLOSE)
                if end >= 0:
                    reasoning.append(text[:end].rstrip("\n"))
                    self.state, self.strip_newlines = "content", True
                    text = text[end + len(CLOSE) :]
                    continue
                # Held back: a partial closing tag, and the newlines before it (dropped if it closes).
                cut = len(text) - _partial_tag(text, CLOSE)
                cut = len(text[:cut].rstrip("\n"))
                reasoning.append(text[:cut])
                self.held = text[cut:]
                break
            else:
                if self.strip_newlines:
                    text = text.lstrip("\n")
                    if not text:
                        break
                    self.strip_newlines = False
                content.append(text)
                break
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What was held back, once no more text will come."""
        held, self.held = self.held, ""
        if self.state == "reasoning":
            return held, ""
        return "", held

    def split(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of a whole output."""
        r1, c1 = self.feed(text)
        r2, c2 = self.finish()
        return r1 + r2, c1 + c2


class OutputSplit:
    """A thinking model's output as the engine streams it: per step, the reasoning and answer
    text (`ReasoningParser`) and the logprob entries of the step's answer tokens. Which tokens
    wrote the think block is known on the token ids once the block is over
    (`reasoning_token_count`); until then the entries wait, and those of the block are dropped."""

    def __init__(self, tok: Tokenizer, opened: bool):
        self.parser = ReasoningParser(opened)
        self.tok, self.opened = tok, opened
        self.reasoning_tokens: int | None = None  # once the block is over
        self._held: list[tuple[int, object]] = []  # (output token index, logprob entry)
        self._seen = 0  # output tokens whose entries came so far

    def step(self, o) -> tuple[str, str, list]:
        """(reasoning, answer text, the answer tokens' logprob entries) of one engine output."""
        thought, text = self.parser.feed(o.delta_text)
        if o.finished:
            more = self.parser.finish()
            thought, text = thought + more[0], text + more[1]
        entries = list(getattr(o, "delta_logprobs", None) or ())
        self._held += [(self._seen + i, e) for i, e in enumerate(entries)]
        self._seen += len(entries)
        over = self.parser.state == "content" or (o.finished and self.parser.state == "start")
        if self.reasoning_tokens is None and over:
            self.reasoning_tokens = reasoning_token_count(self.tok, o.token_ids, self.opened)
        if self.reasoning_tokens is None:
            return thought, text, []
        answer = [e for i, e in self._held if i >= self.reasoning_tokens]
        self._held = []
        return thought, text, answer
