"""Paged KV-cache accounting: which fixed-size cache blocks belong to which requests.

This module owns `BlockManager`.  It only does bookkeeping on block ids; the cache tensors live on
the workers and are indexed with the slot numbers computed here (`slot`).

With prefix caching (`enable_caching`) a full block whose K/V are computed is registered in a
`PrefixCache` under the hash of its token prefix; requests with the same prefix then share it
(reference counts), and when its last user lets go it stays cached until the pool needs room
(LRU).  Only full blocks that lie before a request's last known token are ever shared, so a
request never writes into a block someone else reads: its first new token starts a block of its
own.  A free block is therefore either on the plain free list (never written, or holding
unshareable K/V) or evictable in the cache; both count as free.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from spmd_serve.scheduler.prefix_cache import PrefixCache, chain_hashes
from spmd_serve.scheduler.request import Request


class BlockManager:
    """`num_blocks` blocks of `block_size` token slots each, optionally a prefix cache over them."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False, cache_salt: str = "") -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks({num_blocks}) and block_size({block_size}) must both be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Stack with block 0 on top: LIFO reuse hands back recently freed (cache-warm) blocks
        # first and makes allocation order deterministic, which keeps tests reproducible.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._refs = [0] * num_blocks  # owners of each block (> 1 only for cached blocks)
        self.cache = PrefixCache(cache_salt) if enable_caching else None

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: never-shared free ones plus cached ones nobody uses."""
        return len(self._free) + (self.cache.num_evictable if self.cache else 0)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def ref_count(self, block: int) -> int:
        """How many requests hold `block` now."""
        return self._refs[block]

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` slots (ceil division)."""
        return -(-num_tokens // self.block_size)

    # ---- prefix cache ---------------------------------------------------------------------------
    def _hashes(self, request: Request, num_blocks: int) -> list[bytes]:
        """The request's first `num_blocks` block hashes, computing only the ones not known yet."""
        assert self.cache is not None
        have, bs = request.block_hashes, self.block_size
        if len(have) < num_blocks:
            tokens = request.all_token_ids[len(have) * bs : num_blocks * bs]
            parent = have[-1] if have else self.cache.root_for(request.params.cache_salt)
            have.extend(chain_hashes(parent, tokens, bs))
        return have[:num_blocks]

    def match_prefix(self, request: Request) -> list[int]:
        """Cached blocks holding the longest prefix of a request that owns no blocks yet.

        Only blocks that end before the last known token count: the step must compute at least
        that token to sample from its logits, and it must write its K/V into a block of its own.
        Looks only; `allocate(..., cached=)` takes them.
        """
        if self.cache is None or request.block_ids or request.params.prompt_logprobs is not None:
            return []  # (prompt logprobs: every prompt position's logits are computed, none taken)
        return self.cache.lookup(self._hashes(request, (request.num_tokens - 1) // self.block_size))

    def num_reclaimed(self, cached: Sequence[int]) -> int:
        """How many of the `cached` blocks are free now, i.e. become used when taken."""
        return sum(1 for b in cached if self._refs[b] == 0)

    def commit(self, request: Request) -> None:
        """Offer the request's newly completed blocks to the cache: call after its
        `num_computed_tokens` has advanced over tokens that are final (a speculative step must roll
        rejected tokens back first).  A block whose content is already cached elsewhere stays
        private."""
        if self.cache is None:
            return
        full = min(request.num_computed_tokens // self.block_size, len(request.block_ids))
        if full <= request.num_committed_blocks:
            return
        hashes = self._hashes(request, full)
        for i in range(request.num_committed_blocks, full):
            self.cache.register(request.block_ids[i], hashes[i])
        request.num_committed_blocks = full

    def reset_prefix_cache(self) -> tuple[int, int]:
        """Forget every cached prefix (an operator's reset; safe while requests run): returns how
        many free cached blocks became plain free blocks and how many cached blocks running requests
        keep (found by no one new).  The free-block count does not change."""
        if self.cache is None:
            return 0, 0
        freed, in_use = self.cache.reset()
        self._free[:0] = freed  # under the stack: the blocks on it are reused in the same order as before
        return len(freed), in_use

    # ---- allocation -----------------------------------------------------------------------------
    def _missing(self, request: Request, num_tokens: int) -> int:
        # Requests only grow between frees, so already-owned blocks always count toward the target.
        return max(0, self.blocks_for(num_tokens) - len(request.block_ids))

    def can_allocate(self, request: Request, num_tokens: int) -> bool:
        return self._missing(request, num_tokens) <= self.num_free_blocks

    def allocate(self, request: Request, num_tokens: int, cached: Sequence[int] = ()) -> bool:
        """Grow `request.block_ids` to cover `num_tokens` slots; all-or-nothing.

        `cached`: blocks from `match_prefix` for a request that owns none, taken first (shared).
        Returns False (and changes nothing) when the pool cannot supply every missing block, so the
        scheduler can preempt someone and retry without undoing a partial grab.
        """
        assert not (cached and request.block_ids), "cached blocks only start an empty block table"
        missing = max(0, self.blocks_for(num_tokens) - len(cached) - len(request.block_ids))
        if missing + self.num_reclaimed(cached) > self.num_free_blocks:
            return False
        for b in cached:
            if self._refs[b] == 0:
                assert self.cache is not None
                self.cache.unpark(b)
            self._refs[b] += 1
            request.block_ids.append(b)
        if cached:
            request.num_committed_blocks = len(cached)
        for _ in range(missing):
            b = self._free.pop() if self._free else self._evict()
            self._refs[b] = 1
            request.block_ids.append(b)
        return True

    def _evict(self) -> int:
        assert self.cache is not None, "no free block to take"
        return self.cache.evict()

    def free(self, request: Request) -> None:
        """Drop the request's hold on its blocks and clear its block table; blocks nobody else
        holds become free (cached ones stay cached until evicted)."""
        # Reversed: the request's first block ends on top of the free stack and is reused first,
        # and its last (least shareable) cached block becomes the first to be evicted.
        for b in reversed(request.block_ids):
            self._refs[b] -= 1
            if self._refs[b] == 0 and not (self.cache is not None and self.cache.let_go(b)):
                self._free.append(b)
        request.block_ids.clear()
        request.num_committed_blocks = 0

    def trim(self, request: Request, num_tokens: int) -> None:
        """Free the request's blocks past the first `blocks_for(num_tokens)`: a speculative step's
        rejected drafts reached them.  They are private and hold no final token, so never cached."""
        keep = self.blocks_for(num_tokens)
        assert keep >= request.num_committed_blocks, "trimming would drop a committed block"
        while len(request.block_ids) > keep:
            b = request.block_ids.pop()
            assert self._refs[b] == 1 and (self.cache is None or not self.cache.is_cached(b)), f"block {b} is shared"
            self._refs[b] = 0
            self._free.append(b)

    def slot(self, request: Request, position: int) -> int:
        """Flat cache slot of token `position` of `request` (what the workers write K/V into)."""
        block, offset = divmod(position, self.block_size)
        if position < 0 or block >= len(request.block_ids):
            raise IndexError(
                f"position {position} of {request.req_id!r} is outside its "
                f"{len(request.block_ids)} blocks of {self.block_size}"
            )
        return request.block_ids[block] * self.block_size + offset

    def check_invariants(self, requests: Iterable[Request]) -> None:
        """Raise AssertionError unless `requests` plus the free blocks account for every block, each
        block's reference count is its number of owners, and only cached blocks are shared.

        `requests` must be every request that may own blocks (waiting and running alike).
        """
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert all(0 <= b < self.num_blocks for b in free), "free list holds an out-of-range id"
        owners: dict[int, list[str]] = {}
        for request in requests:
            if request.is_finished:
                assert not request.block_ids, f"finished {request.req_id!r} still owns blocks"
            assert len(set(request.block_ids)) == len(request.block_ids), f"{request.req_id!r} lists a block twice"
            for b in request.block_ids:
                assert 0 <= b < self.num_blocks, f"{request.req_id!r} owns out-of-range block {b}"
                assert b not in free, f"block {b} owned by {request.req_id!r} is also free"
                owners.setdefault(b, []).append(request.req_id)
        cache = self.cache
        for b, names in owners.items():
            assert self._refs[b] == len(names), f"block {b} owned by {names} but has {self._refs[b]} reference(s)"
            assert len(names) == 1 or (cache is not None and cache.may_share(b)), f"unshared block {b} owned by {names}"
            assert cache is None or not cache.is_evictable(b), f"block {b} owned by {names} is evictable"
        evictable = {b for b in range(self.num_blocks) if cache is not None and cache.is_evictable(b)}
        if cache is not None:
            cache.check_invariants(free)
        held = [b for b in range(self.num_blocks) if b not in owners and self._refs[b]]
        assert not held, f"blocks {held} have references but no reported owner (leak)"
        assert len(free) + len(evictable) + len(owners) == self.num_blocks, (
            f"{len(free)} free + {len(evictable)} evictable + {len(owners)} owned != {self.num_blocks} blocks (leak)"
        )
