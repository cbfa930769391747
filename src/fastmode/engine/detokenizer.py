"""Incremental detokenization and stop strings.

Decoding a growing token list again and again is quadratic; decoding only the
last few tokens can split a multi-byte character. We decode a short window
before the new tokens and emit only text that is complete (no trailing U+FFFD).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from fastmode.loader.tokenizer import Tokenizer

_WINDOW = 6  # tokens of left context; enough for any UTF-8 character split across tokens


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, stop: Seq[str] = (), include_stop: bool = False):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.include_stop = include_stop
        self.text = ""
        self._prefix_offset = 0  # tokens before the window
        self._read_offset = 0  # tokens whose text is already in self.text
        self.stopped = False
        self.stop_str: str | None = None  # the stop string that matched, once `stopped`
        # Text is held back while it could still grow into a stop string.
        self._held = max((len(s) for s in self.stop), default=1) - 1
        self.emitted = 0

    def add(self, ids: Seq[int]) -> None:
        """Feed the full output id list; extends `self.text` with complete characters."""
        if self.stopped:
            return
        prefix = self.tokenizer.decode(ids[self._prefix_offset : self._read_offset])
        full = self.tokenizer.decode(ids[self._prefix_offset :])
        if full.endswith("\ufffd"):
            return  # wait for the rest of the character
        new = full[len(prefix) :]
        self.text += new
        self._read_offset = len(ids)
        self._prefix_offset = max(0, len(ids) - _WINDOW)
        self._check_stop(len(new))

    def _check_stop(self, num_new: int) -> None:
        if not self.stop:
            return
        start = max(0, len(self.text) - num_new - self._held)
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, start)) != -1]
        if hits:
            i, s = min(hits)
            self.text = self.text[: i + len(s)] if self.include_stop else self.text[:i]
            self.stopped, self.stop_str = True, s

    def take_delta(self, finished: bool) -> str:
        """New text safe to show: all of it when finished, else minus a possible stop prefix."""
        end = len(self.text) if (finished or self.stopped) else max(self.emitted, len(self.text) - self._held)
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta
