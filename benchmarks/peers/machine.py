"""The machine the comparison shares with other jobs: what it is, and how busy its cores are.

Two cores, shared with other agents' test runs: a server measured while another process holds a
core is measured slow (llama.cpp's and Paddle's worker threads wait on each other at every op).
The runner waits, bounded, for quiet cores before each row and records how busy they were.
"""
from __future__ import annotations

import os
import platform
import time
from pathlib import Path


def cpu_busy(window_s: float) -> float:
    """Fraction of all cores busy (any process) over `window_s`, from /proc/stat."""
    def sample() -> tuple[int, int]:
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = v[3] + v[4]                                   # idle + iowait
        return sum(v) - idle, sum(v)

    b0, t0 = sample()
    time.sleep(window_s)
    b1, t1 = sample()
    return (b1 - b0) / max(t1 - t0, 1)


def wait_quiet(max_busy: float, timeout_s: float) -> float:
    """Wait (bounded) until the cores are at most `max_busy` busy (called before a server starts:
    an idle MPI rank may spin).  Returns the last busy fraction seen, which the report records."""
    deadline = time.monotonic() + timeout_s
    while True:
        busy = cpu_busy(2.0)
        if busy <= max_busy or time.monotonic() > deadline:
            if busy > max_busy:
                print(f"  (machine still {busy:.0%} busy after {timeout_s:.0f} s; measuring anyway)", flush=True)
            return busy


def machine() -> dict:
    """What the report records about the machine."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    return {"cpu": cpu, "nproc": os.cpu_count(), "python": platform.python_version(), "loadavg": os.getloadavg()}
