"""Prefix caching in the block manager and the scheduler: block hashes, sharing by reference count,
LRU eviction of free cached blocks, admission after the cached prefix, the watermark, preemption and
the counts reported for usage and /metrics."""

from __future__ import annotations

from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.block_manager import BlockManager
from spmd_serve.scheduler.prefix_cache import PrefixCache, chain_hashes
from spmd_serve.scheduler.request import Request
from tests.support.scheduler_harness import FakeModel, make_scheduler, reference, run


def _req(req_id: str, prompt: list[int], max_tokens: int = 2) -> Request:
    return Request(req_id, prompt, SamplingParams(max_tokens=max_tokens), eos_token_ids=frozenset({1}))


def _computed(bm: BlockManager, r: Request, num_tokens: int) -> None:
    """As if a step computed `num_tokens` of `r`: allocate, advance, commit."""
    assert bm.allocate(r, num_tokens)
    r.num_computed_tokens = num_tokens
    bm.commit(r)


def test_chain_hashes_name_the_whole_prefix():
    root = PrefixCache("model").root
    a = chain_hashes(root, [5, 6, 7, 8, 9], 2)
    assert len(a) == 2  # the partial last block has no hash
    assert chain_hashes(root, [5, 6, 7, 8], 2) == a
    changed = chain_hashes(root, [4, 6, 7, 8], 2)
    assert changed[0] != a[0] and changed[1] != a[1]  # an earlier token changes every later block
    assert chain_hashes(a[0], [7, 8], 2) == a[1:]  # resumable from any block
    other_model = chain_hashes(PrefixCache("model|kv_int8").root, [5, 6, 7, 8], 2)
    assert set(other_model).isdisjoint(a)
    assert chain_hashes(root, [1, 2**40], 2) != chain_hashes(root, [1, 2**40 + 1], 2)


def test_same_prefix_shares_blocks_and_never_the_last_token():
    bm = BlockManager(num_blocks=8, block_size=2, enable_caching=True)
    a = _req("a", [10, 11, 12, 13, 14])
    _computed(bm, a, 5)
    assert bm.cache is not None and bm.cache.num_cached == 2
    b = _req("b", [10, 11, 12, 13, 99, 98])
    hit = bm.match_prefix(b)
    assert hit == a.block_ids[:2]
    assert bm.allocate(b, 6, hit) and b.block_ids[:2] == hit and b.block_ids[2] not in a.block_ids
    assert [bm.ref_count(x) for x in hit] == [2, 2]
    # a prompt made only of cached blocks recomputes its last block: its last token needs logits
    c = _req("c", [10, 11, 12, 13])
    assert bm.match_prefix(c) == hit[:1]
    assert bm.match_prefix(_req("d", [10, 12, 11, 13, 14])) == []
    bm.check_invariants([a, b])


def test_free_cached_blocks_stay_until_evicted_least_recently_used_first():
    bm = BlockManager(num_blocks=4, block_size=2, enable_caching=True)
    a, b = _req("a", [1, 2, 3]), _req("b", [5, 6, 7])
    _computed(bm, a, 3)  # one full block cached, one partial
    _computed(bm, b, 3)
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 4 and bm.cache is not None and bm.cache.num_evictable == 2
    a_again = _req("a2", [1, 2, 3])
    assert bm.match_prefix(a_again) == [0]  # a's first block survived its owner
    c = _req("c", [9] * 7)
    assert bm.allocate(c, 7)  # 4 blocks: both plain free ones, then a's (older) and b's cached ones
    assert bm.cache.num_cached == 0 and bm.match_prefix(a_again) == []
    bm.check_invariants([a, b, c])


def test_a_hit_on_a_free_block_takes_it_out_of_the_evictable_set():
    bm = BlockManager(num_blocks=3, block_size=2, enable_caching=True)
    a = _req("a", [1, 2, 3])
    _computed(bm, a, 3)
    bm.free(a)
    b = _req("b", [1, 2, 4, 4, 4])
    hit = bm.match_prefix(b)
    assert bm.num_reclaimed(hit) == 1
    assert not bm.allocate(b, 7, hit)  # 1 cached + 3 new > 3 blocks: nothing changes
    assert bm.ref_count(hit[0]) == 0 and b.block_ids == []
    assert bm.allocate(b, 5, hit) and b.block_ids[0] == hit[0]
    assert bm.num_free_blocks == 0
    bm.check_invariants([a, b])


def test_duplicate_content_stays_private():
    bm = BlockManager(num_blocks=4, block_size=2, enable_caching=True)
    a, b = _req("a", [1, 2, 3]), _req("b", [1, 2, 3])
    assert bm.allocate(a, 3) and bm.allocate(b, 3)  # both computed block [1, 2] in the same step
    for r in (a, b):
        r.num_computed_tokens = 3
        bm.commit(r)
    assert bm.cache is not None and bm.cache.num_cached == 1
    bm.free(b)
    assert bm.num_free_blocks == 2 and bm.cache.num_evictable == 0  # b's copy went to the plain list
    bm.check_invariants([a, b])


def test_second_request_starts_after_the_cached_prefix_and_gets_the_same_tokens():
    sched = make_scheduler(enable_prefix_caching=True, block_size=4)
    system = list(range(200, 213))  # 13 tokens: 3 full blocks
    a, b = _req("a", system + [7, 8], 3), _req("b", system + [9], 3)
    trace = run(sched, {0: [a], 5: [b]})
    b_first = next(s for o in trace for s in o.seqs if s.request is b)
    assert (b_first.start, b_first.num_new_tokens) == (12, 2)
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 12)
    assert sum(o.prefix_queries for o in trace) == 15 + 14
    assert sum(o.prefix_hits for o in trace) == 12
    for r in (a, b):
        assert (r.output_token_ids, r.finish_reason) == reference(r, 256)


def test_multi_turn_prompt_reuses_the_blocks_written_while_decoding():
    sched = make_scheduler(enable_prefix_caching=True, block_size=4)
    first = _req("t1", list(range(300, 306)), 7)  # 6 + 7 tokens, 12 of them computed
    history = first.prompt_token_ids + reference(first, 256)[0]
    second = _req("t2", history + [5, 6], 2)  # the next turn: the whole chat so far + new text
    run(sched, {0: [first], 20: [second]})
    assert first.output_token_ids == history[6:] and second.num_cached_tokens == 12
    assert second.output_token_ids == reference(second, 256)[0]


def test_without_caching_nothing_is_shared_or_counted():
    sched = make_scheduler(block_size=4)
    system = list(range(200, 213))
    a, b = _req("a", system + [7, 8]), _req("b", system + [9])
    trace = run(sched, {0: [a], 4: [b]})
    assert b.num_cached_tokens == 0 and sum(o.prefix_queries + o.prefix_hits for o in trace) == 0


def test_cached_free_blocks_count_as_free_for_the_watermark():
    # a leaves 4 cached free blocks; the watermark is 0.5 x 8 = 4 used blocks while c runs
    sched = make_scheduler(enable_prefix_caching=True, block_size=2, num_blocks=8, block_ratio=0.5)
    a = _req("a", list(range(100, 109)), 1)
    run(sched, {0: [a]})
    c = _req("c", [50, 51], 6)
    sched.add_request(c)
    model = FakeModel(sched)
    out = sched.schedule()
    sched.update(out, model.step(out))
    b = _req("b", list(range(100, 109)) + [60], 1)
    sched.add_request(b)
    out = sched.schedule()
    assert [s.request.req_id for s in out.seqs] == ["c"]  # 4 hit blocks + 1 new: over the watermark
    sched.update(out, model.step(out))
    sched.abort_request("b")
    # 1 hit block (free: it becomes used) + 1 new next to c's 2: 4 used <= 4, although 4 blocks were
    # already holding a's K/V before; had cached free blocks counted as used, nothing could start
    b2 = _req("b2", [100, 101, 102], 1)
    sched.add_request(b2)
    out = sched.schedule()
    assert [(s.request.req_id, s.start) for s in out.seqs] == [("c", 3), ("b2", 2)]
    sched.check_invariants()


def test_preempted_request_resumes_from_its_own_cached_blocks():
    sched = make_scheduler(enable_prefix_caching=True, block_size=2, num_blocks=6, max_num_batched_tokens=16)
    a = _req("a", list(range(100, 106)), 4)  # grows to 10 tokens: 5 blocks
    b = _req("b", list(range(120, 124)), 4)  # 8 tokens: 4 blocks; 9 blocks needed, 6 exist
    trace = run(sched, {0: [a, b]})
    assert b.num_preemptions == 1 and trace[1].preempted == [b]  # at 5 tokens, 2 blocks computed
    # a's growth evicted b's last block (freed first, so least recently used) but not its first
    resumed = [s for o in trace for s in o.seqs if s.request is b][1]
    assert (resumed.start, resumed.num_new_tokens) == (2, 3)
    assert b.num_cached_tokens == 0  # usage reports the first admission's hit only
    for r in (a, b):
        assert (r.output_token_ids, r.finish_reason) == reference(r, 256)


def test_a_cache_salt_shares_blocks_only_with_the_same_salt():
    """vLLM's cache_salt: a salted prompt's blocks are found by requests of its salt alone, and it
    finds no unsalted (or otherwise salted) ones."""
    bm = BlockManager(num_blocks=16, block_size=2, enable_caching=True)
    prompt = [10, 11, 12, 13, 14]

    def salted(req_id: str, salt: str) -> Request:
        return Request(req_id, prompt, SamplingParams(max_tokens=2, cache_salt=salt), eos_token_ids=frozenset({1}))

    a = salted("a", "tenant-1")
    _computed(bm, a, 5)
    assert bm.match_prefix(_req("plain", prompt)) == []
    assert bm.match_prefix(salted("b", "tenant-2")) == []
    assert bm.match_prefix(salted("c", "tenant-1")) == a.block_ids[:2]
    plain = _req("plain2", prompt)
    _computed(bm, plain, 5)
    assert bm.match_prefix(_req("plain3", prompt)) == plain.block_ids[:2] != a.block_ids[:2]
    assert PrefixCache("m").root_for("") == PrefixCache("m").root != PrefixCache("m").root_for("s")
    assert PrefixCache("m").root_for("s") != PrefixCache("m2").root_for("s")  # (still the model's chain)


def test_a_reset_forgets_every_prefix_also_of_blocks_running_requests_share():
    bm = BlockManager(num_blocks=8, block_size=2, enable_caching=True)
    idle, a = _req("idle", [20, 21, 22]), _req("a", [10, 11, 12, 13, 14])
    _computed(bm, idle, 3)
    bm.free(idle)  # its block is free and cached
    _computed(bm, a, 5)
    b = _req("b", [10, 11, 12, 13, 99])
    assert bm.allocate(b, 5, bm.match_prefix(b))  # b shares a's two blocks
    shared = b.block_ids[:2]
    assert bm.reset_prefix_cache() == (1, 2) and bm.num_free_blocks == 8 - 4
    assert bm.cache is not None and bm.cache.num_cached == 0 and bm.cache.num_evictable == 0
    assert bm.match_prefix(_req("c", [10, 11, 12, 13, 5])) == [] and bm.match_prefix(_req("d", [20, 21, 22])) == []
    bm.check_invariants([a, b])  # a and b still share what they shared
    bm.free(a)
    assert [bm.ref_count(x) for x in shared] == [1, 1]
    bm.check_invariants([b])
    bm.free(b)  # the retired blocks are plain free blocks now, not cached ones
    assert bm.num_free_blocks == 8 and bm.cache.num_evictable == 0
    bm.check_invariants([])
    again = _req("again", [10, 11, 12, 13, 14])
    _computed(bm, again, 5)  # computed anew after the reset: cached again
    assert bm.match_prefix(_req("e", [10, 11, 12, 13, 7])) == again.block_ids[:2]
    assert BlockManager(4, 2).reset_prefix_cache() == (0, 0)  # caching off: nothing to forget
