"""Executes a SchedulerOutput on the model: builds the flat batch, runs it, samples.

The runner decides nothing: which sequences and how many tokens come from the
scheduler. It owns the KV cache tensors (one K and one V tensor per layer:
sliding-window layers' from the local pool when there is one, see
engine/window_blocks.py) and the per-request sampling state: random
generators, structured-output matchers and the logprobs not yet handed to the
engine.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from fastmode.engine.sampler import (
    TokenLogprob,
    adjusts_logits,
    apply_bias,
    apply_penalties,
    make_generator,
    probs_from_logits,
    sample_row,
    token_logprob,
)
from fastmode.engine.scheduler import ScheduledSeq, SchedulerOutput
from fastmode.engine.sequence import Sequence
from fastmode.engine.structured import apply_bounds, fill_masks, mask_bounds
from fastmode.models.attention_batch import AttentionBatch, PrefillSpan, decode_mask
from fastmode.models.cpu_packing import can_pack, pack_linears
from fastmode.models.llama import LlamaModel

log = logging.getLogger(__name__)


@dataclass
class _GrammarState:
    """A request's structured-output matcher and how many of its output tokens it has seen."""

    matcher: object  # llguidance.LLMatcher
    num_consumed: int = 0


# Spans up to this long after existing context run as decode rows (their attention reads the
# context once per row, so long prompt chunks stay on the prefill path).
MAX_SPAN_AS_ROWS = 16


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        num_blocks: int,
        block_size: int,
        kv_dtype: torch.dtype,
        pack_weights: bool = True,
        num_local_blocks: int = 0,
    ):
        """`num_local_blocks` > 0: the model's sliding-window layers keep their KV in a pool of that
        many blocks, addressed by each sequence's `local_block_table` (the scheduler's block manager
        must then be a WindowedBlockManager); 0: every layer in the one pool."""
        cfg = model.cfg
        if pack_weights and can_pack(model) and not getattr(model, "packed", False):
            pack_linears(model)
            model.packed = True
        self.model = model
        self.block_size = block_size
        local_layers = set(cfg.sliding_layers) if num_local_blocks > 0 and cfg.sliding_window else set()
        self.window = cfg.sliding_window if local_layers else None  # set: the local pool is in use
        self.kv_caches = []
        for i in range(cfg.num_layers):
            shape = (num_local_blocks if i in local_layers else num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
            self.kv_caches.append((torch.zeros(shape, dtype=kv_dtype), torch.zeros(shape, dtype=kv_dtype)))
        self.generators: dict[str, torch.Generator] = {}
        self.grammars: dict[str, _GrammarState] = {}
        self.logprobs: dict[str, list[TokenLogprob]] = {}  # per sampled token, until taken
        self._mask_pool: ThreadPoolExecutor | None = None  # started with the first constrained step

    def release(self, request_id: str) -> None:
        self.generators.pop(request_id, None)
        self.grammars.pop(request_id, None)
        self.logprobs.pop(request_id, None)

    def take_logprobs(self, request_id: str) -> list[TokenLogprob]:
        """The logprobs of the tokens sampled for a request since the last call, in order."""
        return self.logprobs.pop(request_id, [])

    @staticmethod
    def _as_rows(s: ScheduledSeq) -> bool:
        """Whether a multi-token span (a speculative verification, a short prompt chunk after
        cached context) runs as one decode row per token: each row attends to the cache up to
        its own position, so the step stays on the fused decode path and every row gets exactly
        the arithmetic plain decoding would give it (greedy verification is then exact)."""
        return s.seq.num_computed_tokens > 0 and s.num_tokens <= MAX_SPAN_AS_ROWS

    def _slots(self, block_table: list[int], start: int, n: int, first_block: int = 0) -> list[int]:
        """Cache slots of positions [start, start + n); `block_table` holds logical blocks from `first_block`."""
        bs = self.block_size
        return [block_table[p // bs - first_block] * bs + p % bs for p in range(start, start + n)]

    def _local_decode_rows(self, rows: list[tuple[Sequence, int]], batch: AttentionBatch) -> None:
        """For decode rows (sequence, context length): the local blocks each row's window reads,
        from logical block max(0, ctx - window) // block_size on, padded with block 0 (masked)."""
        bs, window = self.block_size, self.window
        firsts = [max(0, ctx - window) // bs for _, ctx in rows]  # type: ignore[operator]
        width = max((ctx - 1) // bs - first + 1 for (_, ctx), first in zip(rows, firsts))
        tables = torch.zeros(len(rows), width, dtype=torch.long)
        for i, ((seq, ctx), first) in enumerate(zip(rows, firsts)):
            lo = first - seq.local_block_start
            blocks = seq.local_block_table[lo : lo + (ctx - 1) // bs - first + 1]
            tables[i, : len(blocks)] = torch.tensor(blocks)
        batch.local_decode_tables = tables
        batch.local_decode_first = torch.tensor(firsts, dtype=torch.long)

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
        local = self.window is not None
        local_slots: list[int] = []
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
            span = PrefillSpan(first, len(input_ids), ctx, torch.tensor(seq.block_table), mask)
            if local:
                local_slots += self._slots(seq.local_block_table, start, s.num_tokens, seq.local_block_start)
                span.local_block_table = torch.tensor(seq.local_block_table)
                span.local_block_start = seq.local_block_start
            prefill_spans.append(span)
            if s.emits_token:
                k = s.num_draft_tokens + 1  # verify every draft, plus the token after them
                logit_rows += range(len(input_ids) - k, len(input_ids))
                row_owner.append((s, k))
        num_prefill = len(input_ids)

        batch = AttentionBatch(slot_mapping=torch.empty(0), prefill_spans=prefill_spans, num_prefill_tokens=num_prefill)
        if decodes:
            max_blocks = max(len(s.seq.block_table) for s in decodes)
            tables = torch.zeros(sum(s.num_tokens for s in decodes), max_blocks, dtype=torch.long)
            ctx_lens = []
            local_rows: list[tuple[Sequence, int]] = []
            for s in decodes:
                seq, start, n = s.seq, s.seq.num_computed_tokens, s.num_tokens
                toks = (seq.token_ids + seq.draft_token_ids)[start : start + n]
                table = torch.tensor(seq.block_table)
                for j in range(n):  # row j sees the cache up to its own position: causal within the span
                    tables[len(ctx_lens), : len(seq.block_table)] = table
                    input_ids.append(toks[j])
                    positions.append(start + j)
                    ctx_lens.append(start + j + 1)
                    if local:
                        local_rows.append((seq, start + j + 1))
                slots += self._slots(seq.block_table, start, n)
                if local:
                    local_slots += self._slots(seq.local_block_table, start, n, seq.local_block_start)
                if s.emits_token:
                    k = s.num_draft_tokens + 1
                    logit_rows += range(len(input_ids) - k, len(input_ids))
                    row_owner.append((s, k))
            batch.decode_block_tables = tables
            batch.decode_context_lens = torch.tensor(ctx_lens, dtype=torch.long)
            if not fused_ops:
                batch.decode_mask = decode_mask(batch.decode_context_lens, max_blocks * self.block_size)
            if local:
                self._local_decode_rows(local_rows, batch)
        batch.slot_mapping = torch.tensor(slots, dtype=torch.long)
        if local:
            batch.local_slot_mapping = torch.tensor(local_slots, dtype=torch.long)

        masks = self._start_masks([(s, k) for s, k in row_owner if self._needs_full_mask(s, k)])
        try:
            logits = self.model(
                torch.tensor(input_ids, dtype=torch.long),
                torch.tensor(positions, dtype=torch.long),
                batch,
                self.kv_caches,
                torch.tensor(logit_rows, dtype=torch.long),
            )
        except BaseException:
            if masks is not None:  # the matchers must be idle before anyone steps again
                masks.exception()
            raise
        return self._sample(logits, row_owner, masks)

    @staticmethod
    def _needs_full_mask(s: ScheduledSeq, k: int) -> bool:
        """Whether a row's grammar mask is computed in full for the step. A greedy row with no
        drafts and no logprobs only needs its argmax checked (`_sample`): when the grammar
        allows the unmasked argmax it is also the masked argmax, so the mask is computed only
        for the rows whose argmax the grammar refuses."""
        p = s.seq.params
        return s.seq.grammar is not None and not (p.greedy and k == 1 and p.logprobs is None)

    def _mask_job(self, constrained: list[tuple[ScheduledSeq, int]], parallel: bool = True):
        """A function computing the masks of `constrained`'s rows: (`mask_bounds` rows,
        request id -> its first row). Each row's matcher is brought level with its tokens
        here, on the calling thread; `parallel` as in `fill_masks`."""
        entries, first_row = [], {}
        num_rows = 0
        for s, k in constrained:
            state = self._grammar_state(s.seq)
            entries.append((state.matcher, num_rows, s.seq.draft_token_ids[: k - 1]))
            first_row[s.seq.request_id] = num_rows
            num_rows += k
        grammar = constrained[0][0].seq.grammar  # one engine, one tokenizer: the same words and EOS
        vocab_size = self.model.cfg.vocab_size

        def job():
            bitmask = fill_masks(entries, num_rows, grammar.mask_words, parallel)
            return mask_bounds(bitmask, vocab_size, grammar.eos_token_id), first_row

        return job

    def _start_masks(self, constrained: list[tuple[ScheduledSeq, int]]) -> Future | None:
        """Start computing the full grammar masks of `constrained`'s rows on a worker thread, so
        llguidance (which drops the GIL) works while the forward pass runs: the masks depend
        only on each matcher's state and the drafts, both known before the forward."""
        if not constrained:
            return None
        job = self._mask_job(constrained)
        if self._mask_pool is None:
            self._mask_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastmode-masks")
        return self._mask_pool.submit(job)

    def _sample(
        self, logits: torch.Tensor, row_owner: list[tuple[ScheduledSeq, int]], masks: Future | None = None
    ) -> dict[str, list[int]]:
        result: dict[str, list[int]] = {}
        # Rows of requests with penalties, bias or a grammar are reshaped in place first, so
        # every later stage (argmax, sampling, verification, logprobs) reads the shaped logits.
        firsts: list[int] = []
        shaped: list[tuple[ScheduledSeq, int, int]] = []
        row = 0
        for s, k in row_owner:
            firsts.append(row)
            if s.seq.grammar is not None or adjusts_logits(s.seq.params):
                shaped.append((s, k, row))
            row += k
        if masks is None:  # called without `execute` (tests): the masks, computed here
            full = [(s, k) for s, k in row_owner if self._needs_full_mask(s, k)]
            masks = self._start_masks(full)
        if shaped:
            self._shape(logits, shaped, masks)
        # Every greedy row's token from one batched argmax (ties go to the lowest id, as per row).
        top = logits.argmax(-1).tolist() if any(s.seq.params.greedy for s, _ in row_owner) else []
        self._check_greedy_rows(logits, top, row_owner, firsts)
        for (s, k), row in zip(row_owner, firsts):
            seq, p = s.seq, s.seq.params
            rows, drafts = slice(row, row + k), seq.draft_token_ids[: k - 1]
            if p.greedy:
                new = self._verify_greedy(top[rows], drafts)
            else:
                gen = self.generators.get(seq.request_id)
                if gen is None:
                    gen = self.generators[seq.request_id] = make_generator(p.seed)
                if k == 1:
                    new = [sample_row(logits[rows][0], p, gen)]
                else:
                    new = self._verify(logits[rows], drafts, p, gen)
            result[seq.request_id] = new
            if seq.grammar is not None:
                self._advance(seq.request_id, new)
            if p.logprobs is not None:
                # Row j scored the position after drafts[:j], which are exactly the tokens
                # accepted before new[j].
                lps = self.logprobs.setdefault(seq.request_id, [])
                lps += [token_logprob(logits[row + j], t, p.logprobs) for j, t in enumerate(new)]
        return result

    def _check_greedy_rows(
        self, logits: torch.Tensor, top: list[int], row_owner: list[tuple[ScheduledSeq, int]], firsts: list[int]
    ) -> None:
        """For constrained rows without a full mask (`_needs_full_mask`): keep the argmax where
        the grammar allows it; otherwise mask the row and take its argmax again. Exact: with
        ties going to the lowest id, an allowed unmasked argmax is the masked argmax too."""
        refused: list[tuple[ScheduledSeq, int, int]] = []
        for (s, k), row in zip(row_owner, firsts):
            if s.seq.grammar is None or self._needs_full_mask(s, k):
                continue
            if self._grammar_state(s.seq).matcher.validate_tokens([top[row]]) != 1:
                refused.append((s, k, row))
        if not refused:
            return
        bounds, first_row = self._mask_job([(s, k) for s, k, _ in refused], parallel=False)()
        for s, _, row in refused:
            first = first_row[s.seq.request_id]
            apply_bounds(logits[row : row + 1], bounds[first : first + 1])
            top[row] = int(logits[row].argmax())

    def _shape(self, logits: torch.Tensor, shaped: list[tuple[ScheduledSeq, int, int]], masks: Future | None) -> None:
        """Penalties, bias and the full grammar masks, in place on each shaped request's k rows
        (k - 1 drafts + 1). Row i follows drafts[:i]: its penalties count them and its mask is
        the grammar's state after them (computed by `_start_masks`)."""
        bounds, first_row = masks.result() if masks is not None else (None, None)
        for s, k, row in shaped:
            seq, p = s.seq, s.seq.params
            block = logits[row : row + k]  # a view: edits land in `logits`
            if p.presence_penalty or p.frequency_penalty:
                out, drafts = seq.output_token_ids, seq.draft_token_ids[: k - 1]
                for i in range(k):
                    apply_penalties(block[i], out + drafts[:i], p)
            apply_bias(block, p)
            if first_row is not None and seq.request_id in first_row:
                first = first_row[seq.request_id]
                apply_bounds(block, bounds[first : first + k])

    def _grammar_state(self, seq) -> _GrammarState:
        """The request's matcher, brought level with its output tokens (created on first use)."""
        state = self.grammars.get(seq.request_id)
        if state is None:
            state = self.grammars[seq.request_id] = _GrammarState(seq.grammar.matcher())
        n = seq.num_output_tokens
        if state.num_consumed < n:
            self._advance(seq.request_id, seq.output_token_ids[state.num_consumed :])
        elif state.num_consumed > n:  # tokens the scheduler did not keep
            state.matcher.rollback(state.num_consumed - n)
            state.num_consumed = n
        return state

    def _advance(self, request_id: str, tokens: list[int]) -> None:
        """Feed a request's new tokens to its matcher. Tokens after the grammar has stopped
        (EOS under ignore_eos) are counted but not fed: the matcher then allows only EOS."""
        state = self.grammars[request_id]
        m = state.matcher
        for t in tokens:
            if m.is_stopped():
                break
            if not m.consume_token(t):
                log.warning("request %s: token %d broke its grammar: %s", request_id, t, m.get_error())
                break
        state.num_consumed += len(tokens)

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
