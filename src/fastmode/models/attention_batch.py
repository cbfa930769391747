"""What one forward pass attends over: the runner builds it, the model reads it.

A step's tokens are packed into one flat sequence of N tokens: first every
prefill span (a prompt chunk, or several speculative tokens being verified),
then one token per decoding sequence. New K/V go to `slot_mapping`; attention
reads each sequence's blocks from the paged cache.

Where sliding-window layers have a pool of their own (engine/window_blocks.py),
the `local_*` fields address it: a sequence holds local blocks only from a
logical block on (the blocks before it left every future query's window), so
local tables come with that first logical block. Without them (None) every
layer reads the one pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PrefillSpan:
    """Query tokens [start, end) of the flat batch that belong to one sequence.

    The span's first token sits at absolute position `context_len - (end - start)`;
    after this step the sequence's cache holds `context_len` tokens in `block_table`.
    """

    start: int
    end: int
    context_len: int
    block_table: torch.Tensor  # (num_blocks,) long
    mask: torch.Tensor | None  # (L, T) bool, True = may attend; None = plain causal (no prior context)
    local_block_table: torch.Tensor | None = None  # (n,) long: local-pool blocks of logical blocks start...
    local_block_start: int = 0  # ... from this logical block


@dataclass
class AttentionBatch:
    slot_mapping: torch.Tensor  # (N,) long: flat cache slot for each new token's K/V
    prefill_spans: list[PrefillSpan]
    num_prefill_tokens: int
    decode_block_tables: torch.Tensor | None = None  # (Bd, max_blocks) long
    decode_mask: torch.Tensor | None = None  # (Bd, 1, 1, T) float additive: 0 or -inf
    decode_context_lens: torch.Tensor | None = None  # (Bd,) long: tokens each decoding sequence attends to
    local_slot_mapping: torch.Tensor | None = None  # (N,) long: local-pool slot for each new token's K/V
    local_decode_tables: torch.Tensor | None = None  # (Bd, W) long: local blocks each decode row's window reads
    local_decode_first: torch.Tensor | None = None  # (Bd,) long: the logical block of local_decode_tables[:, 0]


def decode_mask(context_lens: torch.Tensor, width: int) -> torch.Tensor:
    """The additive mask PyTorch's decode attention needs when block tables are padded to `width`
    tokens: 0 for each row's first context_lens[i] keys, -inf after. (fastmode's paged decode
    kernel reads the lengths instead.)"""
    valid = torch.arange(width).unsqueeze(0) < context_lens.unsqueeze(1)  # (B, T)
    return torch.zeros(len(context_lens), 1, 1, width).masked_fill(~valid[:, None, None, :], float("-inf"))
