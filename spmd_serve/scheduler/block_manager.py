"""Paged KV-cache accounting: which fixed-size cache blocks belong to which request.

This module owns `BlockManager`.  It only does bookkeeping on block ids; the cache tensors live on
the workers and are indexed with the slot numbers computed here (`slot`).  Blocks are never shared
between requests (no prefix caching), which keeps the invariants simple enough to check after
every step in tests.
"""

from __future__ import annotations

from collections.abc import Iterable

from spmd_serve.scheduler.request import Request


class BlockManager:
    """A free list of `num_blocks` blocks of `block_size` token slots each."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks({num_blocks}) and block_size({block_size}) must both be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Stack with block 0 on top: LIFO reuse hands back recently freed (cache-warm) blocks
        # first and makes allocation order deterministic, which keeps tests reproducible.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` slots (ceil division)."""
        return -(-num_tokens // self.block_size)

    def _missing(self, request: Request, num_tokens: int) -> int:
        # Requests only grow between frees, so already-owned blocks always count toward the target.
        return max(0, self.blocks_for(num_tokens) - len(request.block_ids))

    def can_allocate(self, request: Request, num_tokens: int) -> bool:
        return self._missing(request, num_tokens) <= len(self._free)

    def allocate(self, request: Request, num_tokens: int) -> bool:
        """Grow `request.block_ids` to cover `num_tokens` slots; all-or-nothing.

        Returns False (and changes nothing) when the pool cannot supply every missing block, so the
        scheduler can preempt someone and retry without undoing a partial grab.
        """
        missing = self._missing(request, num_tokens)
        if missing > len(self._free):
            return False
        for _ in range(missing):
            request.block_ids.append(self._free.pop())
        return True

    def free(self, request: Request) -> None:
        """Return all of the request's blocks to the pool and clear its block table."""
        # Reversed so the request's first block ends on top of the stack and is reused first.
        self._free.extend(reversed(request.block_ids))
        request.block_ids.clear()

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
        """Raise AssertionError unless `requests` plus the free list account for every block once.

        `requests` must be every request that may own blocks (waiting and running alike).
        """
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert all(0 <= b < self.num_blocks for b in free), "free list holds an out-of-range id"
        owner: dict[int, str] = {}
        for request in requests:
            if request.is_finished:
                assert not request.block_ids, f"finished {request.req_id!r} still owns blocks"
            for b in request.block_ids:
                assert 0 <= b < self.num_blocks, f"{request.req_id!r} owns out-of-range block {b}"
                assert b not in owner, f"block {b} owned by {owner[b]!r} and {request.req_id!r}"
                assert b not in free, f"block {b} owned by {request.req_id!r} is also free"
                owner[b] = request.req_id
        assert len(free) + len(owner) == self.num_blocks, (
            f"{len(free)} free + {len(owner)} owned != {self.num_blocks} blocks (leak)"
        )
