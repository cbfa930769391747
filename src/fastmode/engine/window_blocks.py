"""KV blocks for sliding-window (local) layers: a second pool holding only what a window can still read. No torch.

A local layer (5 of every 6 layers in Gemma 3) attends to the last `window`
positions, so once a sequence has computed its tokens up to position s, no
later query reads a key before s - window + 1. `WindowedBlockManager` keeps the
global layers' blocks exactly as `BlockManager` does (every position, prefix
caching) and gives the local layers their own pool, indexed by the same logical
block numbers: a sequence holds local blocks only from `local_block_start` on,
and the blocks that fall behind every future query's window go back to the
local pool as it advances. A sequence's local blocks are therefore bounded by
the window and the step's chunk, whatever its length.

The prefix cache covers both pools with the same chain hashes: a full local
block is registered under its global block's hash, and a block dropped behind
the window stays findable until its space is needed. A prefix hit is only as
long as the local pool can serve: reusing n cached blocks needs the local
blocks of the window before position n * block_size, so the hit is cut back to
the longest prefix whose window is still cached (the rest is computed afresh,
into fresh blocks of both pools), and the output stays token-exact.
"""

from __future__ import annotations

from fastmode.engine.block_manager import BlockManager
from fastmode.engine.sequence import Sequence


class WindowedBlockManager(BlockManager):
    """Global blocks as `BlockManager` (its own counters and methods), plus `local`, the
    local layers' pool. Invariants: a sequence's local blocks cover logical blocks
    [local_block_start, blocks_for(num_computed_tokens)) or, after `allocate`, up to its
    new tokens; both pools return to all free once every sequence is freed."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        window: int,
        num_local_blocks: int,
        max_chunk_tokens: int,
        enable_prefix_caching: bool = True,
    ):
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        if window <= 0 or max_chunk_tokens <= 0:
            raise ValueError("window and max_chunk_tokens must be positive")
        self.window = window
        self.local = BlockManager(num_local_blocks, block_size, enable_prefix_caching)
        # The most local blocks one sequence holds in a step: the window before the step's first
        # token and the step's tokens (at most max_chunk_tokens), one block more for alignment.
        self.max_local_blocks_per_seq = self.blocks_for(window - 1 + max_chunk_tokens) + 1

    # -- capacity ----------------------------------------------------------
    @property
    def num_local_blocks(self) -> int:
        return self.local.num_blocks

    @property
    def num_free_local_blocks(self) -> int:
        return self.local.num_free_blocks

    @property
    def usage(self) -> float:
        """The fuller pool's usage: either one running out stops admission."""
        return max(super().usage, self.local.usage)

    def fits_alone(self, num_tokens: int) -> bool:
        local = min(self.blocks_for(num_tokens), self.max_local_blocks_per_seq)
        return super().fits_alone(num_tokens) and local <= self.local.num_blocks

    def first_needed_block(self, num_computed_tokens: int) -> int:
        """The first logical block a query at position >= `num_computed_tokens` can read."""
        return max(0, num_computed_tokens - self.window + 1) // self.block_size

    # -- prefix cache ------------------------------------------------------
    def _usable_hits(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """(global blocks, local blocks) of the longest cached prefix both pools can serve: its
        global blocks, and the local blocks of the window before its end."""
        hits = self._prefix_hits(seq)
        if not hits:
            return [], []
        lookup, block_hash = self.local.hash_to_block.get, self.block_hash
        local = [lookup(block_hash[b]) for b in hits]
        # run[i]: how many blocks up to and including i are all cached in the local pool.
        run, count = [], 0
        for b in local:
            count = count + 1 if b is not None else 0
            run.append(count)
        for n in range(len(hits), 0, -1):
            lo = self.first_needed_block(n * self.block_size)
            if run[n - 1] >= n - lo:
                return hits[:n], local[lo:n]  # type: ignore[return-value]
        return [], []

    def can_admit(self, seq: Sequence, num_new_tokens: int) -> tuple[bool, int]:
        assert not seq.block_table and not seq.local_block_table
        hits, local_hits = self._usable_hits(seq)
        cached_tokens = len(hits) * self.block_size
        end = self.blocks_for(cached_tokens + max(1, min(num_new_tokens, len(seq) - cached_tokens)))
        revived = sum(1 for b in hits if self.ref_count[b] == 0)
        revived_local = sum(1 for b in local_hits if self.local.ref_count[b] == 0)
        new = end - len(hits)  # blocks past the cached prefix, in each pool
        fits = self.num_free_blocks - revived >= new and self.local.num_free_blocks - revived_local >= new
        return fits, cached_tokens

    def admit(self, seq: Sequence) -> int:
        assert not seq.block_table and not seq.local_block_table and seq.num_computed_tokens == 0
        hits, local_hits = self._usable_hits(seq)
        self.num_prefix_queries += max(0, (len(seq) - 1) // self.block_size)
        self.num_prefix_hits += len(hits)
        for b in hits:
            self._acquire(b)
            seq.block_table.append(b)
            seq.block_hashes.append(self.block_hash[b])  # type: ignore[arg-type]
        for b in local_hits:
            self.local._acquire(b)
        seq.local_block_table = list(local_hits)
        seq.local_block_start = len(hits) - len(local_hits)
        seq.num_computed_tokens = len(hits) * self.block_size
        return seq.num_computed_tokens

    # -- allocation --------------------------------------------------------
    def release_behind_window(self, seq: Sequence) -> None:
        """Return the local blocks no query from `seq.num_computed_tokens` on can read. The
        scheduler calls it after every step of `seq`, so between steps a sequence holds at most
        ceil((window - 1) / block_size) + 1 local blocks; `allocate` calls it too."""
        first = self.first_needed_block(seq.num_computed_tokens)
        start = seq.local_block_start
        if first <= start:
            return
        table = seq.local_block_table
        n = min(first - start, len(table))
        self.local._release_all(table[:n])  # oldest first: the LRU evicts them first
        del table[:n]
        seq.local_block_start = first if not table else start + n

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        self.release_behind_window(seq)
        end = self.blocks_for(seq.num_computed_tokens + num_new_tokens)
        n_global = max(0, end - len(seq.block_table))
        n_local = max(0, end - seq.local_block_start - len(seq.local_block_table))
        if n_global > self.num_free_blocks or n_local > self.local.num_free_blocks:
            return False
        if n_global:
            self._take_blocks(n_global, seq.block_table)
        if n_local:
            self.local._take_blocks(n_local, seq.local_block_table)
        return True

    def commit(self, seq: Sequence) -> None:
        first = len(seq.block_hashes)
        super().commit(seq)
        hashes = seq.block_hashes
        if len(hashes) == first:
            return
        start, table = seq.local_block_start, seq.local_block_table
        register = self.local._register
        for i in range(max(first, start), min(len(hashes), start + len(table))):
            register(table[i - start], hashes[i])

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        super().truncate(seq, num_tokens)
        keep = self.blocks_for(num_tokens) - seq.local_block_start
        table = seq.local_block_table
        while len(table) > max(0, keep):
            self.local._release(table.pop())

    def free(self, seq: Sequence) -> None:
        super().free(seq)
        self.local._release_all(seq.local_block_table[::-1])
        seq.local_block_table = []
        seq.local_block_start = 0
