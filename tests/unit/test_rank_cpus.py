"""Threads per rank and the cores each rank is bound to (spmd_serve/worker/rank_cpus.py)."""

from __future__ import annotations

import os

import pytest

from spmd_serve.worker.rank_cpus import RankCpus, plan_rank_cpus, setup_rank_cpus

NODE = (0, 1, 2, 3, 4, 5, 6, 7)


@pytest.mark.parametrize(
    "setting,ranks,bind,want",
    [
        ("auto", 1, True, [RankCpus(8, None)]),  # alone: every core, nothing to separate
        ("auto", 2, True, [RankCpus(4, (0, 1, 2, 3)), RankCpus(4, (4, 5, 6, 7))]),
        ("auto", 3, True, [RankCpus(2, (0, 1)), RankCpus(2, (2, 3)), RankCpus(2, (4, 5))]),
        ("auto", 2, False, [RankCpus(4, None), RankCpus(4, None)]),
        ("2", 2, True, [RankCpus(2, (0, 1, 2, 3)), RankCpus(2, (4, 5, 6, 7))]),  # fewer threads than cores
        ("8", 2, True, [RankCpus(8, None), RankCpus(8, None)]),  # more than its share: not confined
        ("auto", 16, True, [RankCpus(1, None)] * 16),  # more ranks than cores
    ],
)
def test_ranks_split_the_cores_of_their_node(setting, ranks, bind, want):
    assert [plan_rank_cpus(setting, r, [NODE] * ranks, bind) for r in range(ranks)] == want


def test_a_binding_from_the_launcher_is_kept():
    """mpirun --bind-to core already gave each rank its own cores: auto = those, no re-binding."""
    masks = [(0, 1), (2, 3)]
    assert [plan_rank_cpus("auto", r, masks, True) for r in range(2)] == [RankCpus(2, None)] * 2


def test_setup_binds_this_process_and_its_threads():
    before = os.sched_getaffinity(0)
    mine = tuple(sorted(before))
    if len(mine) < 2:
        pytest.skip("needs two cores")

    class TwoRanks:  # this process is local rank 1 of 2 ranks that share the node's cores
        @staticmethod
        def node_allgather(value):
            return 1, [value, value]

    try:
        plan = setup_rank_cpus(TwoRanks(), "auto", True)
        half = len(mine) // 2
        assert plan == RankCpus(half, mine[half : 2 * half])
        assert os.sched_getaffinity(0) == set(plan.cores)
    finally:
        for tid in map(int, os.listdir("/proc/self/task")):
            os.sched_setaffinity(tid, before)
