"""Prompt-lookup drafting: propose the tokens that followed the last n-gram
the last time it occurred in the sequence. No model, no torch.

Strong when the answer repeats its input (code edits, quoting, refactors);
useless on free text, where the policy's adaptive k shrinks it to one token.
"""

from __future__ import annotations


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
