"""Automatic prefix caching: the content hash of a full KV block, and the blocks cached by hash.

This module owns `chain_hashes` and `PrefixCache`.  A full block's K/V is a function of every token
up to its end (attention mixes the whole prefix into each position), of the model and of how the
pool stores K/V (int8-KV), so its identity is a hash chain: block i's hash is
sha256(block i-1's hash || block i's token ids), and the chain starts from sha256(salt), the salt
naming the model and the KV format (and a request's own `cache_salt`, when it has one, salts its
root again: `root_for`).  sha256 rather than Python's `hash`: two different prefixes
must never share a block, and a 256-bit collision is not a case worth handling.

`PrefixCache` only maps hashes to block ids and keeps the *free* cached blocks in least-recently
used order; reference counts and ownership stay with the `BlockManager`.  `reset` (an operator's
/reset_prefix_cache) forgets every hash at once, also of blocks running requests still share: those
are "retired" — shared as before, found by no one new, a plain free block once let go.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence


def chain_hashes(parent: bytes, token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Hashes of the full blocks of `token_ids` (a trailing partial block has none), chained
    from `parent` (the hash of the block before `token_ids[0]`, or the root)."""
    out: list[bytes] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        # int64 bytes: token ids are exact, and one buffer per block keeps the hashing cheap
        parent = hashlib.sha256(parent + array("q", token_ids[start : start + block_size]).tobytes()).digest()
        out.append(parent)
    return out


class PrefixCache:
    """hash → block for full blocks whose K/V are computed; the free ones are kept, in LRU order,
    until the pool needs them (`evict`)."""

    def __init__(self, salt: str) -> None:
        self.root = hashlib.sha256(b"spmd_serve prefix cache\0" + salt.encode("utf-8")).digest()
        self._block_of: dict[bytes, int] = {}
        self._hash_of: dict[int, bytes] = {}
        # Free cached blocks, least recently freed first: the next to be evicted.
        self._evictable: OrderedDict[int, None] = OrderedDict()
        # Blocks in use whose hash a reset forgot: their owners keep sharing them until they let go.
        self._retired: set[int] = set()

    def root_for(self, cache_salt: str) -> bytes:
        """The chain's root for a request's cache_salt: its own unless the salt is "" (a salted
        prompt's blocks are hashed apart from everyone else's, so they are found by no other salt)."""
        if not cache_salt:
            return self.root
        return hashlib.sha256(self.root + b"\0salt\0" + cache_salt.encode("utf-8")).digest()

    @property
    def num_cached(self) -> int:
        return len(self._block_of)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def is_cached(self, block: int) -> bool:
        return block in self._hash_of

    def is_evictable(self, block: int) -> bool:
        return block in self._evictable

    def may_share(self, block: int) -> bool:
        """Several requests may hold this block: it is cached, or was when a reset forgot it."""
        return block in self._hash_of or block in self._retired

    def hash_of(self, block: int) -> bytes | None:
        return self._hash_of.get(block)

    def lookup(self, hashes: Sequence[bytes]) -> list[int]:
        """The blocks of the longest run of leading `hashes` that are cached (the chain makes a
        later hit without the earlier ones impossible to use, so the walk stops at the first miss)."""
        hit: list[int] = []
        for h in hashes:
            block = self._block_of.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def register(self, block: int, block_hash: bytes) -> bool:
        """Cache an owned, fully computed block under its hash.  False when another block already
        holds that content (two requests computed the same prefix at once): this one stays uncached
        and returns to the plain free list when its owner lets go."""
        if block_hash in self._block_of or block in self._hash_of:
            return False
        self._block_of[block_hash] = block
        self._hash_of[block] = block_hash
        return True

    def let_go(self, block: int) -> bool:
        """A block's last owner let go.  True: it is cached and stays so (its K/V kept, most recently
        used last); False: it is a plain free block (never cached, or retired by a reset)."""
        if block in self._hash_of:
            self._evictable[block] = None
            return True
        self._retired.discard(block)
        return False

    def unpark(self, block: int) -> None:
        """A free cached block is used again (a prefix hit): it is no longer evictable."""
        del self._evictable[block]

    def evict(self) -> int:
        """Forget the least recently used free cached block and return it for reuse."""
        block, _ = self._evictable.popitem(last=False)
        del self._block_of[self._hash_of.pop(block)]
        return block

    def reset(self) -> tuple[list[int], int]:
        """Forget every hash: no later request finds anything computed before.  Returns the free
        cached blocks (plain free blocks now, least recently used first) and how many cached blocks
        are still in use (retired: `may_share`, until `let_go`)."""
        free = list(self._evictable)
        in_use = self._hash_of.keys() - self._evictable.keys()
        self._retired |= in_use
        self._block_of.clear()
        self._hash_of.clear()
        self._evictable.clear()
        return free, len(in_use)

    def check_invariants(self, free: set[int]) -> None:
        """The two maps mirror each other; evictable blocks are cached and not on the free list;
        retired blocks are neither cached nor free."""
        assert len(self._block_of) == len(self._hash_of), "hash maps disagree in size"
        assert all(self._hash_of.get(b) == h for h, b in self._block_of.items()), "hash maps disagree"
        assert all(b in self._hash_of for b in self._evictable), "an evictable block is not cached"
        assert not free & self._hash_of.keys(), "a cached block is on the uncached free list"
        assert not self._retired & (free | self._hash_of.keys()), "a retired block is free or cached"
