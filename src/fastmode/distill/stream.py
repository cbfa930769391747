"""A deterministic, resumable stream of training windows.

Each window is `seq_len + 1` consecutive tokens from one source (inputs are
the first `seq_len`, next-token targets the last `seq_len`); documents of a
source are packed back to back with a separator token between them. Which
source a window comes from is drawn from the mixture weights by a generator
seeded with (seed, window number), and each source walks its documents in a
seeded shuffled order, epoch after epoch. So the whole stream is a function
of the seed, and its position is a small dict (`state()`): a checkpoint that
stores it resumes the exact same sequence of batches.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from fastmode.distill.corpus import Document

Encode = Callable[[str], list[int]]


class SourceCursor:
    """Tokens of one source's documents, in a seeded order per epoch, tokenized lazily."""

    def __init__(self, name: str, docs: Sequence[Document], encode: Encode, separator_id: int, seed: int):
        if not docs:
            raise ValueError(f"source {name!r} has no documents")
        self.name, self.docs, self.encode = name, list(docs), encode
        self.separator_id, self.seed = separator_id, seed
        self.epoch = self.pos = self.offset = 0  # epoch, index into this epoch's order, token offset in that doc
        self._order: tuple[int, list[int]] | None = None
        self._cached: tuple[int, list[int]] | None = None  # (doc index, its tokens)

    def _doc_order(self) -> list[int]:
        if self._order is None or self._order[0] != self.epoch:
            order = list(range(len(self.docs)))
            random.Random(f"{self.seed}:{self.name}:{self.epoch}").shuffle(order)
            self._order = (self.epoch, order)
        return self._order[1]

    def _tokens(self, index: int) -> list[int]:
        if self._cached is None or self._cached[0] != index:
            doc = self.docs[index]
            ids = list(doc.token_ids) if doc.token_ids is not None else self.encode(doc.text)
            self._cached = (index, ids + [self.separator_id])
        return self._cached[1]

    def take(self, num_tokens: int) -> list[int]:
        """The next `num_tokens` tokens of this source, crossing document (and epoch) ends."""
        out: list[int] = []
        while len(out) < num_tokens:
            tokens = self._tokens(self._doc_order()[self.pos])
            part = tokens[self.offset : self.offset + num_tokens - len(out)]
            out += part
            self.offset += len(part)
            if self.offset >= len(tokens):
                self.pos, self.offset = self.pos + 1, 0
                if self.pos == len(self.docs):
                    self.epoch, self.pos = self.epoch + 1, 0
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos, "offset": self.offset}

    def load_state(self, state: Mapping[str, int]) -> None:
        self.epoch, self.pos, self.offset = state["epoch"], state["pos"], state["offset"]


class WindowStream:
    """Batches (B, seq_len + 1) of token ids drawn from several sources by mixture weight."""

    def __init__(
        self, cursors: Sequence[SourceCursor], weights: Mapping[str, float], seed: int, batch_size: int, seq_len: int
    ):
        self.cursors = {c.name: c for c in cursors}
        names = [n for n in self.cursors if weights.get(n, 0) > 0]
        if not names:
            raise ValueError(f"no source with a positive weight among {sorted(self.cursors)}")
        total = sum(weights[n] for n in names)
        self._names = names
        self._cumulative = [sum(weights[m] for m in names[: i + 1]) / total for i in range(len(names))]
        self.seed, self.batch_size, self.seq_len = seed, batch_size, seq_len
        self.num_windows = 0

    @property
    def fractions(self) -> dict[str, float]:
        """Each source's share of windows, after renormalising over the sources present."""
        prev = [0.0] + self._cumulative[:-1]
        return {n: c - p for n, c, p in zip(self._names, self._cumulative, prev)}

    def next_window(self) -> list[int]:
        r = random.Random(f"{self.seed}:mix:{self.num_windows}").random()
        name = self._names[min(bisect.bisect_right(self._cumulative, r), len(self._names) - 1)]
        self.num_windows += 1
        return self.cursors[name].take(self.seq_len + 1)

    def next_batch(self) -> torch.Tensor:
        """(batch_size, seq_len + 1) int64 token ids."""
        return torch.tensor([self.next_window() for _ in range(self.batch_size)], dtype=torch.long)

    def state(self) -> dict[str, Any]:
        return {"num_windows": self.num_windows, "sources": {n: c.state() for n, c in self.cursors.items()}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.num_windows = state["num_windows"]
        for name, s in state["sources"].items():
            self.cursors[name].load_state(s)
