"""The MoE combine over the ranks: all-reduce of partial outputs vs an all-to-all dispatch (issue 14).

    mpirun -n 2 python benchmarks/moe_combine.py [--reps 200]

Every rank holds every token of the step (attention is tensor-parallel, so the residual stream is
replicated) and runs its own experts.  Two ways to give every rank the routed output [T, H]:

* all-reduce (what the export does, in the graph): each rank's partial [T, H] (its experts'
  weighted outputs, zero where none of its experts was routed), one MPI_Allreduce;
* all-to-all: each rank sends the rows it computed (only tokens routed to one of its experts) to
  the token's owner rank (tokens split evenly), MPI_Alltoallv; owners sum the rows they receive;
  then MPI_Allgatherv puts the replicated [T, H] back for the next attention.

Routing is drawn at random (each token k distinct experts of E), so the row counts are those of a
balanced router.  Both are timed on the same host buffers with the same MPI (mpi4py; the in-graph
op calls the same MPI_Allreduce), median of `--reps`, after a barrier.  Rank 0 prints one line per
shape: microseconds of each and their ratio.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def routed_rows(t: int, e: int, k: int, ranks: int, rank: int, rng) -> np.ndarray:
    """Tokens routed to at least one of `rank`'s experts (experts split evenly over the ranks)."""
    idx = np.argsort(rng.random((t, e)), axis=1)[:, :k]  # k distinct experts per token
    return np.flatnonzero(((idx // (e // ranks)) == rank).any(axis=1))


def time_it(fn, comm, reps: int) -> float:
    times = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def measure(comm, t: int, h: int, e: int, k: int, reps: int) -> tuple[float, float, float]:
    from mpi4py import MPI

    n, r = comm.Get_size(), comm.Get_rank()
    rng = np.random.default_rng(0)  # same routing on every rank (the router is replicated)
    partial = np.random.default_rng(r).standard_normal((t, h)).astype(np.float32)
    reduced = np.empty_like(partial)
    rows_of = [routed_rows(t, e, k, n, q, rng) for q in range(n)]
    mine = rows_of[r]
    owner = np.minimum(mine * n // max(t, 1), n - 1)  # token i belongs to rank i * n // T
    send = np.ascontiguousarray(partial[mine])
    send_counts = np.bincount(owner, minlength=n) * h
    owned = [np.arange(t)[np.minimum(np.arange(t) * n // max(t, 1), n - 1) == q] for q in range(n)]
    recv_rows = [np.intersect1d(rows_of[q], owned[r]) for q in range(n)]
    recv_counts = np.array([len(x) for x in recv_rows]) * h
    recv = np.empty(int(recv_counts.sum()), np.float32)
    out = np.empty((t, h), np.float32)
    gather_counts = np.array([len(o) for o in owned]) * h
    local = np.zeros((len(owned[r]), h), np.float32)

    def allreduce() -> None:
        comm.Allreduce(partial, reduced, op=MPI.SUM)

    def alltoall() -> None:
        comm.Alltoallv([send, send_counts, MPI.FLOAT], [recv, recv_counts, MPI.FLOAT])
        local[:] = 0
        off = 0
        for q in range(n):  # sum what each rank computed for the tokens this rank owns
            rows = recv_rows[q]
            pos = np.searchsorted(owned[r], rows)
            local[pos] += recv[off : off + len(rows) * h].reshape(-1, h)
            off += len(rows) * h
        comm.Allgatherv(local, [out, gather_counts, MPI.FLOAT])

    a, b = time_it(allreduce, comm, reps), time_it(alltoall, comm, reps)
    return a, b, float(np.mean([len(x) for x in rows_of]) / max(t, 1))


def main() -> None:
    from mpi4py import MPI

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    shapes = [("deepseek-tiny", 64, 8, 2), ("DeepSeek-V3", 7168, 256, 8)]
    for name, h, e, k in shapes:
        for t in (1, 32, 256):
            a, b, frac = measure(comm, t, h, e, k, args.reps)
            if comm.Get_rank() == 0:
                print(
                    f"{name:14s} H={h:5d} E={e:3d} k={k} T={t:4d} ranks={comm.Get_size()}: "
                    f"all-reduce {a:8.1f} us, all-to-all + all-gather {b:8.1f} us "
                    f"(x{b / a:.2f}; a rank computes {frac:.0%} of the tokens)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
