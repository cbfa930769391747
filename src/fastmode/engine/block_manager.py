"""KV-cache block accounting with prefix caching. No torch.

The cache is `num_blocks` blocks of `block_size` token slots. A full block is
identified by a chain hash (its tokens and the hash of the block before it),
so two requests that share a prefix share its blocks, whatever their tier.
Blocks whose last user finished keep their contents and stay findable until
the space is needed (LRU eviction); they count as free.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator

from fastmode.engine.sequence import Sequence


def _chain_hash(parent: int, tokens: tuple[int, ...]) -> int:
    """The id of a full block: its tokens and the id of the block before it (0 for the first)."""
    return hash((parent, tokens))


def _block_tuples(token_ids: list[int], start: int, stop: int, block_size: int) -> Iterator[tuple[int, ...]]:
    """The tokens of blocks [start, stop) as tuples."""
    if stop * block_size <= len(token_ids):
        # zip over block_size references to one iterator cuts the list into tuples in C.
        return zip(*[iter(token_ids[start * block_size : stop * block_size])] * block_size)
    # Blocks past the last token (accepted drafts are counted as computed before they are
    # appended: Scheduler.update_from_output) hash what is there, possibly nothing.
    return (tuple(token_ids[i * block_size : (i + 1) * block_size]) for i in range(start, stop))


class BlockManager:
    """Invariants: every block is in exactly one of {in use (ref > 0), free list,
    evictable cache}; `num_free_blocks` returns to `num_blocks` once every
    sequence is freed."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()  # ref 0 but cached; oldest first
        self.hash_to_block: dict[int, int] = {}
        self.num_prefix_queries = 0  # blocks looked up
        self.num_prefix_hits = 0  # blocks found

    # -- capacity ----------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids) + len(self.evictable)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(0, self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table))

    def fits_alone(self, num_tokens: int) -> bool:
        """Whether a sequence of `num_tokens` tokens fits in the cache when it is the only one."""
        return self.blocks_for(num_tokens) <= self.num_blocks

    # -- prefix cache ------------------------------------------------------
    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks holding a prefix of `seq`. The last token is never
        taken from the cache: its logits are needed, so it must be computed."""
        if not self.enable_prefix_caching:
            return []
        hits, parent = [], 0
        for i in range((len(seq) - 1) // self.block_size):
            tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
            parent = _chain_hash(parent, tokens)
            block = self.hash_to_block.get(parent)
            if block is None:
                break
            hits.append(block)
        return hits

    def can_admit(self, seq: Sequence, num_new_tokens: int) -> tuple[bool, int]:
        """Whether `seq` (holding no blocks) fits with its first chunk; and how
        many of its tokens the prefix cache would serve."""
        assert not seq.block_table
        hits = self._prefix_hits(seq)
        cached_tokens = len(hits) * self.block_size
        # Admission always schedules at least one token beyond the cached prefix.
        needed = self.blocks_for(cached_tokens + max(1, min(num_new_tokens, len(seq) - cached_tokens))) - len(hits)
        revived = sum(1 for b in hits if self.ref_count[b] == 0)  # taken out of the free pool
        return self.num_free_blocks - revived >= needed, cached_tokens

    def admit(self, seq: Sequence) -> int:
        """Attach the cached prefix to `seq`; returns the number of cached tokens."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        hits = self._prefix_hits(seq)
        self.num_prefix_queries += max(0, (len(seq) - 1) // self.block_size)
        self.num_prefix_hits += len(hits)
        for b in hits:
            if self.ref_count[b] == 0:
                del self.evictable[b]
            self.ref_count[b] += 1
            seq.block_table.append(b)
            seq.block_hashes.append(self.block_hash[b])
        seq.num_computed_tokens = len(hits) * self.block_size
        return seq.num_computed_tokens

    # -- allocation --------------------------------------------------------
    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Give `seq` room for `num_new_tokens` more tokens; all or nothing."""
        n = self.num_new_blocks(seq, num_new_tokens)
        if n == 0:  # most decode tokens still fit in the last block
            return True
        if n > len(self.free_ids) + len(self.evictable):
            return False
        self._take_blocks(n, seq.block_table)
        return True

    def _take_blocks(self, n: int, into: list[int]) -> None:
        """Append `n` blocks to `into`: never-used or freed ones first, then evict cached ones."""
        free_ids, ref_count = self.free_ids, self.ref_count
        taken = [free_ids.popleft() for _ in range(min(n, len(free_ids)))]
        while len(taken) < n:  # evict the least recently released cached block
            b, _ = self.evictable.popitem(last=False)
            del self.hash_to_block[self.block_hash[b]]
            self.block_hash[b] = None
            taken.append(b)
        for b in taken:
            ref_count[b] = 1
        into.extend(taken)

    def commit(self, seq: Sequence) -> None:
        """Register the full, computed blocks of `seq` in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        # Accepted drafts are computed before they are appended to token_ids: hash only
        # blocks whose tokens are all there (the rest are registered next step).
        num_full = min(seq.num_computed_tokens, len(seq.token_ids)) // self.block_size
        if num_full <= len(seq.block_hashes):  # most decode steps complete no block
            return
        hashes, token_ids, bs = seq.block_hashes, seq.token_ids, self.block_size
        hash_to_block, block_hash = self.hash_to_block, self.block_hash
        parent = hashes[-1] if hashes else 0
        first = len(hashes)
        # Every block of every prompt comes through here, so the loop is lean (locals, tuples cut in C).
        for b, tokens in zip(seq.block_table[first:num_full], _block_tuples(token_ids, first, num_full, bs)):
            parent = _chain_hash(parent, tokens)
            hashes.append(parent)
            if block_hash[b] is None and parent not in hash_to_block:
                hash_to_block[parent] = b
                block_hash[b] = parent

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Drop blocks past what `num_tokens` tokens need (speculative rollback)."""
        keep = self.blocks_for(num_tokens)
        while len(seq.block_table) > keep:
            self._release(seq.block_table.pop())
        del seq.block_hashes[num_tokens // self.block_size :]

    def free(self, seq: Sequence) -> None:
        # Release in reverse so a prefix's tail is evicted before its head.
        self._release_all(seq.block_table[::-1])
        seq.block_table = []
        seq.block_hashes = []

    # -- single blocks (a second pool, engine/window_blocks.py, shares this bookkeeping) --
    def _acquire(self, b: int) -> None:
        """Take one more reference to the cached or in-use block `b`."""
        if self.ref_count[b] == 0:
            del self.evictable[b]
        self.ref_count[b] += 1

    def _register(self, b: int, block_hash: int) -> None:
        """Make the full block `b` findable under `block_hash`, unless it or the hash is taken."""
        if self.block_hash[b] is None and block_hash not in self.hash_to_block:
            self.hash_to_block[block_hash] = b
            self.block_hash[b] = block_hash

    def _release(self, b: int) -> None:
        self._release_all((b,))

    def _release_all(self, blocks: list[int] | tuple[int, ...]) -> None:
        """Drop one reference to each of `blocks`, in order (one loop: a prompt holds dozens)."""
        ref_count, block_hash = self.ref_count, self.block_hash
        if not self.enable_prefix_caching:
            # Without the cache no block is shared or kept: each one is free again, in order.
            for b in blocks:
                assert ref_count[b] == 1, f"block {b} released twice"
                ref_count[b] = 0
            self.free_ids.extend(blocks)
            return
        for b in blocks:
            ref = ref_count[b] - 1
            assert ref >= 0, f"block {b} released twice"
            ref_count[b] = ref
            if ref == 0:
                if block_hash[b] is not None:
                    self.evictable[b] = None
                else:
                    self.free_ids.append(b)
