"""Prompt-lookup drafting: propose the tokens that followed the sequence's current
suffix the last time it occurred. No model, no torch.

Strong when the answer repeats its input (code edits, quoting, refactors); on free
text most lookups are short chance matches, and the policy (`ngram_policy.py`) does
not draft them.

`NgramIndex` keeps the positions of every n-gram of one sequence as tokens arrive, so
a lookup costs the same at token 50 and at token 5,000; `propose_ngram` is the
stateless form (a backwards scan), used where a sequence is looked up once.
"""

from __future__ import annotations

from dataclasses import dataclass


def propose_ngram(tokens: list[int], k: int, min_n: int = 2, max_n: int = 4, window: int = 4096) -> list[int]:
    """Up to `k` draft tokens for `tokens`, or [] if no earlier match.

    Tries the longest suffix n-gram first (more context, better precision) and
    takes its most recent earlier occurrence within the last `window` tokens.
    """
    n_tokens = len(tokens)
    lo = max(0, n_tokens - window)
    for n in range(min(max_n, n_tokens - 1), min_n - 1, -1):
        suffix = tokens[n_tokens - n :]
        first = suffix[0]
        # Scan backwards for an earlier occurrence of the suffix.
        for i in range(n_tokens - n - 1, lo - 1, -1):
            if tokens[i] == first and tokens[i : i + n] == suffix:
                start = i + n
                return tokens[start : start + k]
    return []


@dataclass(frozen=True)
class Lookup:
    """One lookup: the tokens that followed the earlier occurrence, and how far back the
    match goes (`match_len` tokens before the frontier equal those before that occurrence,
    counted up to `NgramIndex.max_match`). A long match means the text is repeating."""

    tokens: list[int]
    match_len: int


class NgramIndex:
    """Where each n-gram (n from `min_n` to `max_n`) of one sequence ends, updated as the
    sequence grows. Sequences only ever append tokens (drafts are not part of them), so
    the index never has to forget a position."""

    def __init__(self, min_n: int = 2, max_n: int = 4, max_match: int = 64, candidates: int = 8):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.max_match = max_match
        self.candidates = candidates  # earlier occurrences compared by match length, most recent first
        self._ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> positions of its last token, ascending
        self._indexed = 0  # n-grams ending before this position are in _ends

    def _index(self, tokens: list[int], upto: int) -> None:
        """Add the n-grams ending at positions [self._indexed, upto)."""
        ends, lo, hi = self._ends, self.min_n, self.max_n
        for p in range(max(self._indexed, lo - 1), upto):
            for n in range(lo, min(hi, p + 1) + 1):
                key = tuple(tokens[p - n + 1 : p + 1])
                at = ends.get(key)
                if at is None:
                    ends[key] = [p]
                else:
                    at.append(p)
        self._indexed = max(self._indexed, upto)

    def lookup(self, tokens: list[int], k: int) -> Lookup | None:
        """The continuation (up to `k` tokens) of the longest suffix n-gram's earlier occurrence
        with the longest match among its most recent `candidates` occurrences; None if the
        suffix never occurred before."""
        n_tokens = len(tokens)
        if n_tokens < self._indexed:  # not the sequence this index was built from
            self._ends.clear()
            self._indexed = 0
        # Every n-gram ending before the last token: the suffix itself must not match itself.
        self._index(tokens, n_tokens - 1)
        last = n_tokens - 1
        for n in range(min(self.max_n, n_tokens - 1), self.min_n - 1, -1):
            ends = self._ends.get(tuple(tokens[n_tokens - n :]))
            if not ends:
                continue
            best_end, best_len = ends[-1], 0
            for e in reversed(ends[-self.candidates :]):
                m = n  # the n-gram itself matches; extend backwards
                while m < self.max_match and e - m >= 0 and tokens[e - m] == tokens[last - m]:
                    m += 1
                if m > best_len:
                    best_end, best_len = e, m
            return Lookup(tokens[best_end + 1 : best_end + 1 + k], best_len)
        return None
