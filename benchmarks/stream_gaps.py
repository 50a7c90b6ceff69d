"""How promptly a long stream's frames reach a client on this node while `mpirun -n N spmd_serve`
decodes it, and how long each process waited for a core meanwhile (/proc schedstat).

A change that makes a rank take more CPU (e.g. a worker polling for the next plan without
sleeping) can starve the processes that share the node with the ranks: the front end, the client,
a monitoring agent.  Session 23's spin did: frames stalled for seconds (RESULTS.md "Session 23").
Run it before and after such a change:

    python benchmarks/stream_gaps.py [--tp 2] [--tokens 3000] [--hogs 0] [--model DIR]

Without --model it builds the tiny demo model with a long context (tests/support/long_model.py:
the request can run for minutes) and exports it at --tp.  `--hogs N` runs N `yes` processes
beside the job, as CI's hogged runs do.  Prints the first frame's delay, the largest gaps between
frames, and per process (ranks, HTTP worker, this client) CPU seconds run and seconds waited.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import long_model  # noqa: E402
from tests.support.server_process import ServerProcess, rank_pid  # noqa: E402


def long_model_dir(tp: int, work: Path) -> Path:
    """The tiny demo weights with long_model.CONTEXT positions, exported at `tp`."""
    from spmd_serve.export import export_checkpoint
    from spmd_serve.export.demo.checkpoint import write_demo_checkpoint

    ckpt = long_model.write_long_checkpoint(write_demo_checkpoint(work / "tiny", "tiny"), work / "tiny-long")
    return export_checkpoint(ckpt, work / f"tp{tp}-long", tp=tp, graph_ops="cpp")


def sched_seconds(pid: int) -> tuple[float, float]:
    """(seconds run on a CPU, seconds waited on a run queue) of every thread of `pid`."""
    run = wait = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
            r, w, _ = f.read().split()
        run, wait = run + int(r), wait + int(w)
    return run / 1e9, wait / 1e9


def job_processes(srv: ServerProcess, tp: int) -> dict[str, int]:
    """name -> pid of the job's ranks, its HTTP workers, and this client."""
    named = {f"rank {r}": rank_pid(srv, r) for r in range(tp)}
    named.update({f"HTTP worker {pid}": pid for pid in srv.http_worker_pids()})
    named["client"] = os.getpid()
    return named


def measure(srv: ServerProcess, tp: int, tokens: int) -> None:
    procs = job_processes(srv, tp)
    before = {name: sched_seconds(pid) for name, pid in procs.items()}
    body = {"text": "Tell me a long story.", "max_dec_len": tokens, "min_dec_len": tokens, "stream": True}
    t0 = time.monotonic()
    res = requests.post(srv.url, json=body, stream=True, timeout=120)
    arrivals = [time.monotonic() - t0 for line in res.iter_lines() if line]
    after = {name: sched_seconds(pid) for name, pid in procs.items()}
    gaps = sorted((b - a for a, b in zip(arrivals, arrivals[1:])), reverse=True)[:5]
    print(f"{len(arrivals)} frames: first after {arrivals[0]:.3f} s, last after {arrivals[-1]:.2f} s")
    print("largest gaps between frames (s): " + ", ".join(f"{g:.3f}" for g in gaps))
    for name in procs:
        (r0, w0), (r1, w1) = before[name], after[name]
        print(f"  {name:<20} ran {r1 - r0:6.2f} s  waited for a core {w1 - w0:6.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=3000)
    ap.add_argument("--hogs", type=int, default=0, help="`yes` processes beside the job")
    ap.add_argument("--model", help="a served model directory (default: the long-context tiny demo)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else long_model_dir(args.tp, Path(tmp))
        hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(args.hogs)]
        try:
            with ServerProcess(args.tp, str(model), Path(tmp) / "server.log", **long_model.SERVER_ENV) as srv:
                measure(srv, args.tp, args.tokens)
        finally:
            for h in hogs:
                h.kill()


if __name__ == "__main__":
    main()
