"""BlockManager: ceil-division sizing, all-or-nothing growth, slot math, and invariant checking."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.block_manager import BlockManager
from spmd_serve.scheduler.request import Request, RequestStatus


def _req(req_id: str) -> Request:
    return Request(req_id, [1, 2, 3], SamplingParams())


def test_blocks_for_is_ceil_division():
    bm = BlockManager(num_blocks=8, block_size=4)
    assert [bm.blocks_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_rejects_degenerate_pool():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, 4)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, 0)


def test_allocate_grows_incrementally_and_frees_everything():
    bm = BlockManager(num_blocks=4, block_size=2)
    r = _req("a")
    assert bm.allocate(r, 3) and len(r.block_ids) == 2
    assert bm.allocate(r, 4) and len(r.block_ids) == 2  # still covered: no new block
    assert bm.allocate(r, 5) and len(r.block_ids) == 3
    assert (bm.num_used_blocks, bm.num_free_blocks) == (3, 1)
    bm.free(r)
    assert r.block_ids == [] and bm.num_free_blocks == 4
    bm.check_invariants([r])


def test_allocate_is_all_or_nothing():
    bm = BlockManager(num_blocks=3, block_size=2)
    a, b = _req("a"), _req("b")
    assert bm.allocate(a, 4)
    assert not bm.can_allocate(b, 3)
    assert not bm.allocate(b, 3)  # needs 2, only 1 free
    assert b.block_ids == [] and bm.num_free_blocks == 1
    assert bm.can_allocate(b, 2) and bm.allocate(b, 2)
    bm.check_invariants([a, b])


def test_slot_maps_positions_through_the_block_table():
    bm = BlockManager(num_blocks=4, block_size=4)
    r = _req("a")
    r.block_ids = [2, 0]  # hand-built table
    bm._free = [3, 1]
    assert [bm.slot(r, p) for p in range(8)] == [8, 9, 10, 11, 0, 1, 2, 3]
    with pytest.raises(IndexError):
        bm.slot(r, 8)


def test_freed_blocks_are_reused():
    bm = BlockManager(num_blocks=2, block_size=1)
    a, b = _req("a"), _req("b")
    assert bm.allocate(a, 2)
    owned = set(a.block_ids)
    bm.free(a)
    assert bm.allocate(b, 2) and set(b.block_ids) == owned


def test_check_invariants_catches_double_ownership():
    bm = BlockManager(num_blocks=4, block_size=1)
    a, b = _req("a"), _req("b")
    bm.allocate(a, 1)
    b.block_ids = list(a.block_ids)
    with pytest.raises(AssertionError, match="owned by"):
        bm.check_invariants([a, b])


def test_check_invariants_catches_owned_free_block_and_leak():
    bm = BlockManager(num_blocks=4, block_size=1)
    a = _req("a")
    a.block_ids = [bm._free[-1]]  # owned but never taken off the list
    with pytest.raises(AssertionError, match="also free"):
        bm.check_invariants([a])
    a.block_ids = []
    bm.allocate(a, 2)
    with pytest.raises(AssertionError, match="leak"):
        bm.check_invariants([])  # the owner was not reported


def test_check_invariants_catches_finished_owner():
    bm = BlockManager(num_blocks=2, block_size=1)
    a = _req("a")
    bm.allocate(a, 1)
    a.finish(RequestStatus.FINISHED_ABORTED)
    with pytest.raises(AssertionError, match="finished"):
        bm.check_invariants([a])


@settings(max_examples=200, deadline=None)
@given(
    num_blocks=st.integers(1, 10),
    block_size=st.integers(1, 4),
    ops=st.lists(st.tuples(st.integers(0, 3), st.integers(-1, 20)), max_size=40),
)
def test_random_allocate_free_keeps_invariants(num_blocks, block_size, ops):
    """op (i, n): n == -1 frees request i, otherwise grows it to n tokens."""
    bm = BlockManager(num_blocks, block_size)
    reqs = [_req(str(i)) for i in range(4)]
    for i, n in ops:
        r = reqs[i]
        if n < 0:
            bm.free(r)
            continue
        before = list(r.block_ids)
        fits = bm.can_allocate(r, n)
        assert bm.allocate(r, n) == fits
        if fits:
            assert len(r.block_ids) == max(len(before), bm.blocks_for(n))
            assert r.block_ids[: len(before)] == before  # growth never moves old blocks
        else:
            assert r.block_ids == before
        bm.check_invariants(reqs)
    for r in reqs:
        bm.free(r)
    assert bm.num_free_blocks == num_blocks
