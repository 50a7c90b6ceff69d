"""All MPI traffic of the server: plan broadcast, tensor-parallel collectives, job abort.

This is the only module that imports mpi4py (DESIGN §6).  Workers wait for the next plan with a
non-blocking Ibcast on the small header plus Test() and a short sleep, because a rank blocked in a
plain MPI receive busy-polls a whole core (DESIGN §2); the payload then follows with a blocking
Bcast, which is fast because rank 0 sends it right after the header.  The start-up collectives
(node queries, the load agreement, one writer per node) first meet at a sleep-polled Ibarrier for
the same reason: a rank that loads faster would otherwise spin a core for as long as the slowest
rank loads, exports the demo model or waits for its HTTP workers — on a 2-core machine, the core
those need.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import NoReturn, TypeVar

import numpy as np

# A rank waiting inside MPI (the graph's allreduce while its peer is late) yields its core between
# polls instead of spinning on it: with one core a rank, the HTTP workers and clients share those
# cores, and a spinning rank kept them off its own while the peer it waited for was the one they
# preempted.  TP = 2 served, --demo small, 3 interleaved rounds: median out tok/s 1.08x / 1.17x /
# 1.05x at c = 1 / 8 / 32 (RESULTS.md "Session 35").  Open MPI reads it at MPI_Init, i.e. at the
# import below; a value the user set wins.
os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
from mpi4py import MPI  # noqa: E402  (after the setting above)

from spmd_serve.fast_exit import flush_and_exit
from spmd_serve.protocol import HEADER_LEN, StepPlan

log = logging.getLogger(__name__)
T = TypeVar("T")
IDLE_POLL_S = 0.0005  # worker sleep between Test() calls while idle (~4 % CPU, DESIGN §2)
# ... and in the first STEP_POLL_WINDOW_S after a step, where a busy server's next plan comes: at
# `-n 2`, batch 1, the ranks' all-reduce wait fell 0.15-0.28 ms a step and output tok/s rose 1.04x
# (six alternated pairs; RESULTS.md "Session 45").  Sleeps, not a spin: a spin starved the node's
# other processes (session 23); with these sleeps its stream test beside two hogs read level.
# 10 us sleeps, with the polling thread's timer slack cut to PLAN_TIMER_SLACK_NS (Linux's default
# 50 us slack made every short sleep ~60-100 us): the worker saw the plan 71 -> 34 us (medians)
# after rank 0 sent it (RESULTS.md "Session 46").
STEP_POLL_S, STEP_POLL_WINDOW_S = 0.00001, 0.003
MEET_POLL_S = 0.002  # the same while waiting at start-up and exit, where latency does not matter
PR_SET_TIMERSLACK, PLAN_TIMER_SLACK_NS = 29, 1000  # <linux/prctl.h>


def tighten_timer_slack(ns: int = PLAN_TIMER_SLACK_NS) -> bool:
    """Let this thread's sleeps end within `ns` of their time (Linux's default slack is 50 us, which
    a 10 us poll would mostly be).  False where there is no prctl (not Linux); nothing changed."""
    try:
        return bool(ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, ns, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def meet(comm: MPI.Comm) -> None:
    """Barrier on `comm` that sleeps instead of spinning while the others have not arrived."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(MEET_POLL_S)


class Comm:
    def __init__(self, comm: MPI.Comm | None = None) -> None:
        self.comm = comm or MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._polling_thread: int | None = None  # the thread whose timer slack recv_plan cut

    # ---- plan broadcast ---------------------------------------------------------------------
    def send_plan(self, plan: StepPlan) -> None:
        """Rank 0: header (matches the workers' pending Ibcast), then payload."""
        if self.size == 1:
            return
        header = plan.header()
        self.comm.Ibcast(header, root=0).Wait()
        if header[5]:
            self.comm.Bcast(plan.payload(), root=0)

    def recv_plan(self) -> StepPlan:
        """Workers: sleep-poll for the header, then receive the payload."""
        if self._polling_thread != threading.get_ident():  # slack is per thread: once for the one that polls
            tighten_timer_slack()
            self._polling_thread = threading.get_ident()
        header = np.zeros(HEADER_LEN, np.int64)
        req = self.comm.Ibcast(header, root=0)
        fast_until = time.monotonic() + STEP_POLL_WINDOW_S  # the next step's plan is likely this soon
        while not req.Test():
            time.sleep(STEP_POLL_S if time.monotonic() < fast_until else IDLE_POLL_S)
        payload = np.empty(int(header[5]), np.int64)
        if header[5]:
            self.comm.Bcast(payload, root=0)
        return StepPlan.unpack(header, payload)

    # ---- tensor-parallel collectives --------------------------------------------------------
    def allreduce_(self, x: np.ndarray) -> np.ndarray:
        """In-place sum over ranks of a float32 partial (e.g. [T, H] after o_proj/down_proj)."""
        if self.size > 1:
            self.comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        return x

    def gather_vocab(self, logits_local: np.ndarray) -> np.ndarray | None:
        """[B, V_local] shards → [B, V_local * size] on rank 0 (None elsewhere)."""
        if self.size == 1:
            return logits_local
        logits_local = np.ascontiguousarray(logits_local, dtype=np.float32)
        buf = np.empty((self.size, *logits_local.shape), np.float32) if self.rank == 0 else None
        self.comm.Gather(logits_local, buf, root=0)
        if buf is None:
            return None
        return np.concatenate(list(buf), axis=1)  # [size, B, Vl] → [B, size*Vl]

    @contextlib.contextmanager
    def _node(self) -> Iterator[MPI.Comm]:
        """The ranks on this node as a communicator, after the others have arrived (`meet`; the
        split is collective and would spin); freed on exit."""
        meet(self.comm)
        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            yield local
        finally:
            local.Free()

    def ranks_on_node(self) -> int:
        """How many ranks of this job share this node (and its memory)."""
        with self._node() as local:
            return local.Get_size()

    def node_allgather(self, value):
        """(this rank's index among the ranks on its node, every such rank's `value` in that order)
        (collective: every rank calls it)."""
        with self._node() as local:
            return local.Get_rank(), local.allgather(value)

    def local_peer_pids(self) -> dict[int, int]:
        """World rank -> pid of the other ranks on this node (collective: every rank calls it)."""
        with self._node() as local:
            pairs = local.allgather((self.rank, os.getpid()))
        return {r: pid for r, pid in pairs if r != self.rank}

    def barrier(self) -> None:
        meet(self.comm)

    def allgather_flags(self, ok: bool, message: str) -> list[tuple[bool, str]]:
        """Start-up agreement: every rank learns whether every other rank loaded fine."""
        meet(self.comm)
        return self.comm.allgather((ok, message))

    def exit_now(self, code: int = 0) -> NoReturn:
        """End this rank after a clean stop, MPI finalised first (mpirun counts a rank that exits
        without it as failed), without the interpreter's teardown (spmd_serve/fast_exit.py).  Every
        rank calls it at a clean stop; the workers arrive first and wait for rank 0's front end."""
        meet(self.comm)
        flush_and_exit(code, finalize=MPI.Finalize)

    def abort(self, code: int = 1) -> None:
        """End the whole job now (an error on one rank must never leave the others hanging)."""
        sys.stdout.flush()
        sys.stderr.flush()
        self.comm.Abort(code)


def node_local_first(comm: Comm, make: Callable[[], T]) -> T:
    """Run `make` on the first rank of each node, then on the others once it finished (one
    writer per node for files such as the demo model; ranks on other nodes see their own disk)."""
    local = comm.comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        result = make() if local.Get_rank() == 0 else None
        meet(local)
        return result if result is not None else make()
    finally:
        local.Free()
