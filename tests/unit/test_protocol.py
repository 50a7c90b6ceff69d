"""The rank-0 → workers step contract: spmd_serve/protocol.py and engine/plan_builder.py.

Covers: StepPlan header/payload → unpack round trip (through raw bytes, as MPI carries it) for
random shapes including B=1, T=1, MB=1, and shutdown plans; `grid_indices` against a loop
reference; and `build_plan` on real Scheduler/Request objects over whole runs (chunked prefill,
decode, preemption/recompute): ids, positions, query/ctx lengths, 0-padded block tables and the
slot mapping `block_ids[p // bs] * bs + p % bs` of every scheduled position.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from spmd_serve.engine.plan_builder import build_plan
from spmd_serve.protocol import HEADER_LEN, RUN, RUN_DRAFT, SHUTDOWN, StepPlan, grid_indices
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import Scheduler, SchedulerConfig


def random_plan(rng: np.random.Generator, b: int, mb: int, max_q: int = 9) -> StepPlan:
    qlens = rng.integers(1, max_q + 1, b)
    t = int(qlens.sum())
    return StepPlan(
        kind=RUN,
        step_id=int(rng.integers(0, 2**40)),
        input_ids=rng.integers(0, 50000, t),
        positions=rng.integers(0, 4096, t),
        query_lens=qlens,
        ctx_lens=rng.integers(0, 4096, b),
        block_tables=rng.integers(0, 1000, (b, mb)),
        slot_mapping=rng.integers(0, 10**6, t),
    )


def over_the_wire(plan: StepPlan) -> StepPlan:
    """What a worker reconstructs: fixed-size int64 header, then an int64 payload of its length."""
    header = np.frombuffer(plan.header().tobytes(), np.int64)
    assert header.shape == (HEADER_LEN,)
    payload = np.frombuffer(plan.payload().tobytes(), np.int64)
    assert payload.shape == (int(header[5]),)
    return StepPlan.unpack(header, payload)


def assert_plans_equal(a: StepPlan, b: StepPlan) -> None:
    assert (a.kind, a.step_id) == (b.kind, b.step_id)
    for name in ("input_ids", "positions", "query_lens", "ctx_lens", "block_tables", "slot_mapping"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape, name
        assert y.dtype == np.int64, name
        np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.mark.parametrize("b,mb,max_q", [(1, 1, 1), (1, 1, 9), (3, 1, 1), (1, 5, 1), (4, 3, 9), (7, 12, 30), (32, 2, 1)])
def test_round_trip_shapes(b, mb, max_q):
    rng = np.random.default_rng(b * 100 + mb)
    for _ in range(5):
        plan = random_plan(rng, b, mb, max_q)
        got = over_the_wire(plan)
        assert_plans_equal(plan, got)
        assert (got.num_seqs, got.num_tokens) == (b, int(plan.query_lens.sum()))
        h = plan.header()
        assert list(h[:5]) == [RUN, plan.step_id, b, plan.num_tokens, mb]
        assert h[5] == 3 * plan.num_tokens + 2 * b + b * mb


def test_round_trip_random_shapes():
    rng = np.random.default_rng(0)
    for _ in range(200):
        plan = random_plan(rng, int(rng.integers(1, 20)), int(rng.integers(1, 20)), int(rng.integers(1, 40)))
        assert_plans_equal(plan, over_the_wire(plan))


@pytest.mark.parametrize("h", [1, 3, 64])
def test_draft_plans_carry_their_hidden_rows(h):
    """An MTP draft plan's [T, H] float32 rows travel in the int64 payload, bit for bit (T * H odd
    too); a speculative RUN plan of the same length is not mistaken for one."""
    rng = np.random.default_rng(h)
    for b, mb in ((1, 1), (3, 2), (5, 4)):
        base = random_plan(rng, b, mb)
        rows = rng.standard_normal((base.num_tokens, h)).astype(np.float32)
        plan = dataclasses.replace(base, kind=RUN_DRAFT, hidden=rows)
        got = over_the_wire(plan)
        assert_plans_equal(plan, got)
        assert got.hidden is not None and got.hidden.shape == rows.shape and got.hidden.dtype == np.float32
        assert got.hidden.tobytes() == rows.tobytes() and not got.speculative
        assert plan.header()[5] == 3 * plan.num_tokens + 2 * b + b * mb + 1 + -(-rows.size // 2)
        assert over_the_wire(base).hidden is None
        sub = plan.select(np.array([b - 1]), 16)  # a pass of its last sequence keeps that one's rows
        assert sub.hidden is not None and np.array_equal(sub.hidden, rows[-int(base.query_lens[-1]) :])


def test_shutdown_plan():
    plan = StepPlan.shutdown(41)
    assert list(plan.header()) == [SHUTDOWN, 41, 0, 0, 0, 0]
    assert plan.payload().shape == (0,)
    got = over_the_wire(plan)
    assert (got.kind, got.step_id, got.num_seqs, got.num_tokens) == (SHUTDOWN, 41, 0, 0)
    assert got.block_tables.shape == (0, 0)


# ---------------------------------------------------------------- grid_indices


def ref_grid(query_lens: list[int]):
    b, t, s = len(query_lens), sum(query_lens), max(query_lens)
    pad = [[t] * s for _ in range(b)]
    unpad, last, tok = [], [], 0
    for i, q in enumerate(query_lens):
        for j in range(q):
            pad[i][j] = tok
            unpad.append(i * s + j)
            tok += 1
        last.append(tok - 1)
    return np.array(pad), np.array(unpad), np.array(last)


@pytest.mark.parametrize("qlens", [[1], [7], [1, 1, 1], [3, 1, 4, 1, 5], [1, 9], [9, 1], [2, 2]])
def test_grid_indices_fixed(qlens):
    for got, want in zip(grid_indices(np.array(qlens, np.int64)), ref_grid(qlens)):
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want)


def test_grid_indices_random_and_consistent():
    rng = np.random.default_rng(1)
    for _ in range(200):
        qlens = rng.integers(1, 20, rng.integers(1, 12))
        pad, unpad, last = grid_indices(qlens)
        for got, want in zip((pad, unpad, last), ref_grid(list(qlens))):
            np.testing.assert_array_equal(got, want)
        # unpad ∘ pad is the identity on the T real tokens
        t = int(qlens.sum())
        np.testing.assert_array_equal(pad.reshape(-1)[unpad], np.arange(t))


# ---------------------------------------------------------------- build_plan on a real scheduler


def check_plan(plan: StepPlan, out, bm, step_id: int) -> None:
    block_size = bm.block_size
    seqs = out.seqs
    assert (plan.kind, plan.step_id) == (RUN, step_id)
    mb = max(len(s.request.block_ids) for s in seqs)
    assert plan.block_tables.shape == (len(seqs), mb)
    ids, pos, slots = [], [], []
    for i, s in enumerate(seqs):
        r = s.request
        assert plan.query_lens[i] == s.num_new_tokens
        assert plan.ctx_lens[i] == s.start
        row = list(plan.block_tables[i])
        assert row == r.block_ids + [0] * (mb - len(r.block_ids))
        for p in range(s.start, s.start + s.num_new_tokens):
            ids.append(r.all_token_ids[p])
            pos.append(p)
            slots.append(r.block_ids[p // block_size] * block_size + p % block_size)
            assert slots[-1] == bm.slot(r, p)
    np.testing.assert_array_equal(plan.input_ids, ids)
    np.testing.assert_array_equal(plan.positions, pos)
    np.testing.assert_array_equal(plan.slot_mapping, slots)
    assert len(set(slots)) == len(slots), "two tokens of one step write the same cache slot"
    assert_plans_equal(plan, over_the_wire(plan))


@pytest.mark.parametrize("block_size,num_blocks,budget", [(4, 64, 64), (16, 32, 48), (1, 200, 7), (4, 12, 32)])
def test_build_plan_follows_the_scheduler(block_size, num_blocks, budget):
    rng = np.random.default_rng(block_size * 1000 + num_blocks)
    sched = Scheduler(
        SchedulerConfig(
            max_num_seqs=6,
            num_blocks=num_blocks,
            block_size=block_size,
            block_ratio=1.0,
            max_waiting=100,
            max_num_batched_tokens=budget,
            max_model_len=256,
        )
    )
    for i in range(10):
        prompt = list(rng.integers(3, 1000, int(rng.integers(1, 30))))
        sched.add_request(Request(f"r{i}", prompt, SamplingParams(max_tokens=int(rng.integers(1, 12)))))
    step, preempted = 0, 0
    while sched.has_unfinished():
        out = sched.schedule()
        assert not out.is_empty
        preempted += len(out.preempted)
        plan = build_plan(out, step, block_size)
        check_plan(plan, out, sched.block_manager, step)
        sched.update(out, {s.request.req_id: int(rng.integers(3, 1000)) for s in out.seqs if s.samples})
        sched.check_invariants()
        step += 1
        assert step < 1000
    if num_blocks == 12:
        assert preempted > 0, "the tight pool was meant to exercise preemption/recompute"


def test_split_by_query_len_separates_decodes_from_prefill_chunks():
    from spmd_serve.protocol import split_by_query_len

    groups = split_by_query_len(np.array([1, 7, 1, 3, 1]))
    assert [g.tolist() for g in groups] == [[0, 2, 4], [1, 3]]
    assert [g.tolist() for g in split_by_query_len(np.array([1, 1]))] == [[0, 1]]
    assert [g.tolist() for g in split_by_query_len(np.array([4]))] == [[0]]


def test_select_keeps_each_sequences_tokens_and_trims_block_tables():
    bs = 4
    q, ctx = np.array([1, 5, 1]), np.array([9, 0, 2])
    tables = np.array([[3, 4, 5, 0], [6, 7, 0, 0], [8, 0, 0, 0]])
    t = int(q.sum())
    plan = StepPlan(RUN, 7, np.arange(100, 100 + t), np.arange(t) * 10, q, ctx, tables, np.arange(t) + 50)
    sub = plan.select(np.array([0, 2]), bs)
    assert sub.input_ids.tolist() == [100, 106] and sub.slot_mapping.tolist() == [50, 56]
    assert sub.query_lens.tolist() == [1, 1] and sub.ctx_lens.tolist() == [9, 2]
    assert sub.block_tables.tolist() == [[3, 4, 5], [8, 0, 0]]  # ceil((9 + 1) / 4) = 3 blocks reached
    pre = plan.select(np.array([1]), bs)
    assert pre.input_ids.tolist() == [101, 102, 103, 104, 105] and pre.block_tables.tolist() == [[6, 7]]
