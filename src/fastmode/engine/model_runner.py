"""Executes a SchedulerOutput on the model: builds the flat batch, runs it, samples.

The runner decides nothing: which sequences and how many tokens come from the
scheduler. It owns the KV cache tensors (one K and one V tensor per layer) and
the per-request random generators.
"""

from __future__ import annotations

import torch

from fastmode.engine.sampler import make_generator, probs_from_logits, sample_row
from fastmode.engine.scheduler import ScheduledSeq, SchedulerOutput
from fastmode.models.attention_batch import AttentionBatch, PrefillSpan, decode_mask
from fastmode.models.cpu_packing import can_pack, pack_linears
from fastmode.models.llama import LlamaModel


# Spans up to this long after existing context run as decode rows (their attention reads the
# context once per row, so long prompt chunks stay on the prefill path).
MAX_SPAN_AS_ROWS = 16


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, kv_dtype: torch.dtype, pack_weights: bool = True):
        cfg = model.cfg
        if pack_weights and can_pack(model) and not getattr(model, "packed", False):
            pack_linears(model)
            model.packed = True
        self.model = model
        self.block_size = block_size
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=kv_dtype), torch.zeros(shape, dtype=kv_dtype)) for _ in range(cfg.num_layers)]
        self.generators: dict[str, torch.Generator] = {}

    def release(self, request_id: str) -> None:
        self.generators.pop(request_id, None)

    @staticmethod
    def _as_rows(s: ScheduledSeq) -> bool:
        """Whether a multi-token span (a speculative verification, a short prompt chunk after
        cached context) runs as one decode row per token: each row attends to the cache up to
        its own position, so the step stays on the fused decode path and every row gets exactly
        the arithmetic plain decoding would give it (greedy verification is then exact)."""
        return s.seq.num_computed_tokens > 0 and s.num_tokens <= MAX_SPAN_AS_ROWS

    def _slots(self, block_table: list[int], start: int, n: int) -> list[int]:
        bs = self.block_size
        return [block_table[p // bs] * bs + p % bs for p in range(start, start + n)]

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> dict[str, list[int]]:
        """Run one step; returns request id -> accepted drafts + one new token
        (empty for a prompt chunk that does not reach the end of the prompt)."""
        fused_ops = getattr(self.model, "kernels", None) is not None
        spans: list[ScheduledSeq] = []
        decodes: list[ScheduledSeq] = []
        for s in out.scheduled:
            as_rows = s.num_tokens == 1 or (fused_ops and self._as_rows(s))
            (decodes if as_rows else spans).append(s)
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        prefill_spans: list[PrefillSpan] = []
        logit_rows: list[int] = []
        row_owner: list[tuple[ScheduledSeq, int]] = []  # (scheduled seq, number of logit rows)

        for s in spans:
            seq, start = s.seq, s.seq.num_computed_tokens
            toks = (seq.token_ids + seq.draft_token_ids)[start : start + s.num_tokens]
            first = len(input_ids)
            input_ids += toks
            positions += range(start, start + s.num_tokens)
            slots += self._slots(seq.block_table, start, s.num_tokens)
            ctx = start + s.num_tokens
            mask = None
            if start > 0:  # prior context: query i (position start+i) sees keys 0..start+i
                q_pos = torch.arange(start, ctx).unsqueeze(1)
                mask = torch.arange(ctx).unsqueeze(0) <= q_pos
            prefill_spans.append(PrefillSpan(first, len(input_ids), ctx, torch.tensor(seq.block_table), mask))
            if s.samples:
                k = s.num_draft_tokens + 1  # verify every draft, plus the token after them
                logit_rows += range(len(input_ids) - k, len(input_ids))
                row_owner.append((s, k))
        num_prefill = len(input_ids)

        batch = AttentionBatch(slot_mapping=torch.empty(0), prefill_spans=prefill_spans, num_prefill_tokens=num_prefill)
        if decodes:
            max_blocks = max(len(s.seq.block_table) for s in decodes)
            tables = torch.zeros(sum(s.num_tokens for s in decodes), max_blocks, dtype=torch.long)
            ctx_lens = []
            for s in decodes:
                seq, start, n = s.seq, s.seq.num_computed_tokens, s.num_tokens
                toks = (seq.token_ids + seq.draft_token_ids)[start : start + n]
                table = torch.tensor(seq.block_table)
                for j in range(n):  # row j sees the cache up to its own position: causal within the span
                    tables[len(ctx_lens), : len(seq.block_table)] = table
                    input_ids.append(toks[j])
                    positions.append(start + j)
                    ctx_lens.append(start + j + 1)
                slots += self._slots(seq.block_table, start, n)
                if s.samples:
                    k = s.num_draft_tokens + 1
                    logit_rows += range(len(input_ids) - k, len(input_ids))
                    row_owner.append((s, k))
            batch.decode_block_tables = tables
            batch.decode_context_lens = torch.tensor(ctx_lens, dtype=torch.long)
            if not fused_ops:
                batch.decode_mask = decode_mask(batch.decode_context_lens, max_blocks * self.block_size)
        batch.slot_mapping = torch.tensor(slots, dtype=torch.long)

        logits = self.model(
            torch.tensor(input_ids, dtype=torch.long),
            torch.tensor(positions, dtype=torch.long),
            batch,
            self.kv_caches,
            torch.tensor(logit_rows, dtype=torch.long),
        )
        return self._sample(logits, row_owner)

    def _sample(self, logits: torch.Tensor, row_owner: list[tuple[ScheduledSeq, int]]) -> dict[str, list[int]]:
        result: dict[str, list[int]] = {}
        # Every greedy row's token from one batched argmax (ties go to the lowest id, as per row).
        top = logits.argmax(-1).tolist() if any(s.seq.params.greedy for s, _ in row_owner) else []
        row = 0
        for s, k in row_owner:
            seq, p = s.seq, s.seq.params
            rows, drafts = slice(row, row + k), seq.draft_token_ids[: k - 1]
            row += k
            if p.greedy:
                result[seq.request_id] = self._verify_greedy(top[rows], drafts)
                continue
            gen = self.generators.get(seq.request_id)
            if gen is None:
                gen = self.generators[seq.request_id] = make_generator(p.seed)
            if k == 1:
                result[seq.request_id] = [sample_row(logits[rows][0], p, gen)]
            else:
                result[seq.request_id] = self._verify(logits[rows], drafts, p, gen)
        return result

    @staticmethod
    def _verify_greedy(top: list[int], drafts: list[int]) -> list[int]:
        """Greedy verification: accept while each draft is the target's argmax; the first
        disagreement (or the token after the last draft) is the target's own choice."""
        for i, d in enumerate(drafts):
            if top[i] != d:
                return drafts[:i] + [top[i]]
        return drafts + [top[len(drafts)]]

    def _verify(self, rows: torch.Tensor, drafts: list[int], p, gen) -> list[int]:
        """Sampled verification: accept a prefix of the drafts; always return at least one new token.

        The drafts are proposed deterministically (q is a point mass): accept
        draft x with probability p(x); on rejection sample from p with x
        removed and renormalised -- the rejection-sampling rule of Leviathan et
        al. for a one-hot q, which preserves the target distribution exactly.
        """
        accepted: list[int] = []
        for i, d in enumerate(drafts):
            probs = probs_from_logits(rows[i], p)
            u = torch.rand((), generator=gen)
            if u < probs[d]:
                accepted.append(d)
                continue
            residual = probs.clone()
            residual[d] = 0.0
            return accepted + [int(torch.multinomial(residual / residual.sum(), 1, generator=gen))]
        return accepted + [sample_row(rows[len(drafts)], p, gen)]
