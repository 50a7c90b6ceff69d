"""The CPU cores of a rank: how many threads its graph ops run on, and which cores it is bound to.

SPMD_NUM_THREADS=auto (the default) gives each rank the cores this node lets the job use (its CPU
affinity, e.g. a container's cpuset) divided by the ranks on the node, so `mpirun -n 1` uses every
core and `-n 2` one half each.  With SPMD_BIND_CORES (default on) each rank is then bound to its own
share (local rank i: the i-th slice of the sorted cores), so the ranks' op threads never share a
core; measured in benchmarks/RESULTS.md ("Speed change 7").  When the launcher already bound the
ranks (their affinities differ, e.g. `mpirun --bind-to core`), each rank keeps its binding and
auto means its own cores.  Every node decides for itself, so the same holds across nodes.

The binding is applied to every thread the process has (Linux affinity is per thread) before the
op library's thread pool is made, whose workers inherit it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

AUTO = "auto"


class NodeComm(Protocol):
    def node_allgather(self, value: Any) -> tuple[int, list[Any]]:
        """(this rank's index among the ranks on its node, every such rank's value in that order)."""
        ...


@dataclass(frozen=True)
class RankCpus:
    threads: int
    cores: tuple[int, ...] | None  # bind the rank to these; None: leave its affinity as it is


def plan_rank_cpus(setting: str, local_rank: int, masks: list[tuple[int, ...]], bind: bool) -> RankCpus:
    """The threads and binding of local rank `local_rank`, given every local rank's CPU affinity
    (`masks`, by local rank) and SPMD_NUM_THREADS (`setting`: "auto" or a count)."""
    own = masks[local_rank]
    shared = all(m == own for m in masks)  # nobody bound the ranks: they split the node's cores
    share = len(own) // len(masks) if shared else len(own)
    threads = max(1, share) if setting == AUTO else int(setting)
    if not (bind and shared and len(masks) > 1 and 1 <= threads <= share):  # (more threads: let them spread)
        return RankCpus(threads, None)
    return RankCpus(threads, tuple(sorted(own)[local_rank * share : (local_rank + 1) * share]))


def bind_threads(cores: tuple[int, ...]) -> None:
    """Set the affinity of every thread of this process (threads made later inherit it)."""
    tids = [int(t) for t in os.listdir("/proc/self/task")] if Path("/proc/self/task").is_dir() else [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            continue


def setup_rank_cpus(comm: NodeComm, setting: str, bind: bool) -> RankCpus:
    """Collective over the ranks of the node (every rank calls it): decide, bind, return the plan."""
    local_rank, masks = comm.node_allgather(tuple(sorted(os.sched_getaffinity(0))))
    plan = plan_rank_cpus(setting, local_rank, [tuple(m) for m in masks], bind)
    if plan.cores is not None:
        bind_threads(plan.cores)
    return plan
