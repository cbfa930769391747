"""Draft-model speculation: a small model sharing the target's tokenizer
proposes k tokens greedily; the target verifies them in one step.

The draft keeps its own paged KV cache and block pool (a `BlockManager`
without prefix caching), separate from the scheduler's target accounting: if
the draft pool is full, a sequence simply gets no drafts. Per sequence it
remembers what it proposed last time, so after verification it keeps the KV
of the accepted drafts and recomputes only what it has not seen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from fastmode.engine.block_manager import BlockManager
from fastmode.engine.sequence import Sequence
from fastmode.models.attention_batch import AttentionBatch, PrefillSpan, decode_mask
from fastmode.models.llama import LlamaModel


@dataclass
class DraftRun:
    """The drafts of one `propose()` and what they cost, for the policy's cost estimates."""

    drafts: list[list[int]]  # per sequence, in the order given
    # Seconds per drafting round: the single-token rounds, or round 0 when no sequence had more than
    # a couple of tokens to catch up on; None when only a long catch-up (a prompt) ran, which is
    # not a round's cost.
    round_s: float | None = None
    # (seconds, tokens) of the catch-up when it ran more than a couple of tokens per sequence (a
    # prompt, or text generated while the sequence did not draft).
    catch_up: tuple[float, int] | None = None


@dataclass
class _Shadow:
    """The draft's view of one sequence (duck-types what BlockManager needs)."""

    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # positions whose draft KV matches the real tokens
    pending_start: int = 0  # where last step's drafts began
    pending: list[int] = field(default_factory=list)  # drafts whose KV (all but the last) is cached


class DraftModelProposer:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, kv_dtype: torch.dtype):
        cfg = model.cfg
        self.model = model
        self.block_size = block_size
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=kv_dtype), torch.zeros(shape, dtype=kv_dtype)) for _ in range(cfg.num_layers)
        ]
        self.shadows: dict[str, _Shadow] = {}

    def catch_up_tokens(self, seq: Sequence) -> int:
        """Tokens of `seq` the draft has not run yet: what drafting for it next would first cost."""
        sh = self.shadows.get(seq.request_id)
        return len(seq) - (sh.num_computed_tokens if sh is not None else 0)

    def release(self, request_id: str) -> None:
        sh = self.shadows.pop(request_id, None)
        if sh is not None:
            self.blocks.free(sh)  # type: ignore[arg-type]

    def _sync(self, seq: Sequence, sh: _Shadow) -> None:
        """Keep the KV of last step's drafts that the target accepted."""
        if sh.pending:
            real = seq.token_ids[sh.pending_start : sh.pending_start + len(sh.pending) - 1]
            keep = 0
            while keep < len(real) and real[keep] == sh.pending[keep]:
                keep += 1
            sh.num_computed_tokens = min(sh.num_computed_tokens, sh.pending_start + keep)
            sh.pending = []
        sh.num_computed_tokens = min(sh.num_computed_tokens, len(seq) - 1)

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], ks: list[int]) -> DraftRun:
        """Greedy drafts of length ks[i] for each sequence (shorter if the pool is full)."""
        live: list[tuple[int, Sequence, _Shadow]] = []
        for i, (seq, k) in enumerate(zip(seqs, ks)):
            if k <= 0:
                continue
            sh = self.shadows.setdefault(seq.request_id, _Shadow())
            self._sync(seq, sh)
            # Room for the catch-up tokens plus k-1 drafted tokens' KV.
            if self.blocks.allocate(sh, len(seq) - sh.num_computed_tokens + k - 1):  # type: ignore[arg-type]
                live.append((i, seq, sh))
        run = DraftRun([[] for _ in seqs])
        if not live:
            return run
        drafts = run.drafts
        # Round 0: catch up on real tokens (a span per sequence), take the next token.
        t0 = time.perf_counter()
        behind = [len(seq) - sh.num_computed_tokens for _, seq, sh in live]
        tokens = self._forward([(seq.token_ids[sh.num_computed_tokens :], sh) for _, seq, sh in live])
        round0_s = time.perf_counter() - t0
        catch_up = max(behind)
        if catch_up > 2:
            run.catch_up = (round0_s, sum(behind))
        for (i, seq, sh), t in zip(live, tokens):
            sh.pending_start = len(seq)
            sh.num_computed_tokens = len(seq)
            drafts[i].append(t)
        # Rounds 1..k-1: one drafted token per sequence that wants more.
        t1, rounds = time.perf_counter(), 0
        for r in range(1, max(ks[i] for i, _, _ in live)):
            active = [(i, seq, sh) for i, seq, sh in live if ks[i] > r]
            if not active:
                break
            tokens = self._forward([([drafts[i][-1]], sh) for i, _, sh in active])
            for (i, _, sh), t in zip(active, tokens):
                sh.num_computed_tokens += 1
                drafts[i].append(t)
            rounds += 1
        if rounds:
            run.round_s = (time.perf_counter() - t1) / rounds
        elif catch_up <= 2:
            run.round_s = round0_s
        for i, _, sh in live:
            sh.pending = list(drafts[i])
        return run

    def _forward(self, items: list[tuple[list[int], _Shadow]]) -> list[int]:
        """Run token chunks (each at its shadow's frontier) as one batch; argmax per item.

        Multi-token chunks (catch-up) go in as prefill spans; single tokens after
        some context (the drafting rounds) as decodes, so a round of pure decodes
        takes the model's fused decode step."""
        bs = self.block_size
        order = sorted(range(len(items)), key=lambda j: len(items[j][0]) == 1 and items[j][1].num_computed_tokens > 0)
        ids, pos, slots, spans, rows = [], [], [], [], [0] * len(items)
        tables, lens = [], []
        for j in order:
            toks, sh = items[j]
            start = sh.num_computed_tokens
            first = len(ids)
            ids += toks
            pos += range(start, start + len(toks))
            slots += [sh.block_table[p // bs] * bs + p % bs for p in range(start, start + len(toks))]
            ctx = start + len(toks)
            rows[j] = len(ids) - 1
            if len(toks) == 1 and start > 0:
                tables.append(sh.block_table)
                lens.append(ctx)
                continue
            mask = None
            if start > 0:
                mask = torch.arange(ctx).unsqueeze(0) <= torch.arange(start, ctx).unsqueeze(1)
            spans.append(PrefillSpan(first, len(ids), ctx, torch.tensor(sh.block_table), mask))
        num_prefill = len(ids) - len(lens)
        batch = AttentionBatch(torch.tensor(slots), spans, num_prefill)
        if lens:
            width = max(len(t) for t in tables)
            batch.decode_block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long)
            batch.decode_context_lens = torch.tensor(lens, dtype=torch.long)
            if getattr(self.model, "kernels", None) is None:  # PyTorch attention masks the padding instead
                batch.decode_mask = decode_mask(batch.decode_context_lens, width * bs)
        logits = self.model(torch.tensor(ids), torch.tensor(pos), batch, self.kv_caches, torch.tensor(rows))
        return logits.argmax(-1).tolist()
