"""Token log-probabilities in OpenAI's two shapes.

The engine reports, per generated token, its id, its log-probability and the
k most likely alternatives (`TokenLogprob`). Chat Completions lists them as
`{token, logprob, bytes, top_logprobs}`; the legacy Completions endpoint as
parallel lists (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).
A token's text is its bytes decoded as UTF-8 with replacement, since a
byte-level token may hold part of a character; `bytes` keeps the exact bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TokenText:
    """A token id's exact bytes, through llguidance's tokenizer view (every tokenizer kind, special tokens included)."""

    def __init__(self, tokenizer):
        from fastmode.engine.structured import llg_tokenizer

        self._llg = llg_tokenizer(tokenizer)
        self._cache: dict[int, bytes] = {}

    def bytes_of(self, token_id: int) -> bytes:
        b = self._cache.get(token_id)
        if b is None:
            b = self._cache[token_id] = self._llg.decode_bytes([token_id])
        return b

    def text_of(self, token_id: int) -> str:
        return self.bytes_of(token_id).decode("utf-8", errors="replace")


def _entry(tt: TokenText, token_id: int, logprob: float) -> dict[str, Any]:
    return {"token": tt.text_of(token_id), "logprob": logprob, "bytes": list(tt.bytes_of(token_id))}


def chat_logprobs(tt: TokenText, entries: Sequence[Any]) -> list[dict[str, Any]]:
    """Chat Completions' `logprobs.content` items for the engine's TokenLogprob entries."""
    return [
        {**_entry(tt, e.token_id, e.logprob), "top_logprobs": [_entry(tt, t, lp) for t, lp in e.top]} for e in entries
    ]


def completion_logprobs(tt: TokenText, entries: Sequence[Any], text_offset: int) -> dict[str, Any]:
    """The legacy Completions `logprobs` object; offsets count characters from `text_offset`."""
    tokens, offsets, at = [], [], text_offset
    for e in entries:
        text = tt.text_of(e.token_id)
        tokens.append(text)
        offsets.append(at)
        at += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{tt.text_of(t): lp for t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }
