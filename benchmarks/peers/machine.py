"""The machine the comparison shares with other jobs: what it is, and how busy its cores are.

Two cores, shared with other agents' test runs: a server measured while another process holds a
core is measured slow (llama.cpp's and Paddle's worker threads wait on each other at every op).
The runner waits, bounded, for quiet cores before each measurement, measures how much CPU other
processes took during it (`ForeignCpu`), and repeats a level that others disturbed.
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import time
from pathlib import Path

# the CPU features the kernels' speed turns on (ops/cpu_kernels: AVX-512 or AVX2 FMAs, the exact int8
# path's VNNI and AMX) and llama.cpp's (VNNI dot products for Q8_0): the VMs lent change between sessions
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8")


def machine() -> dict:
    """What the report records about the machine: the CPU's name, family/model and its ISA flags."""
    info: dict[str, str] = {}
    for ln in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = ln.partition(":")
        info.setdefault(key.strip(), value.strip())  # the first processor's
    flags = set(info.get("flags", "").split())
    return {
        "cpu": info.get("model name", platform.processor()),
        "cpu_family_model": f"{info.get('cpu family', '?')}/{info.get('model', '?')}",
        "isa": [f for f in ISA_FLAGS if f in flags],
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg": os.getloadavg(),
    }


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its live descendants (a server: mpirun and its ranks)."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
        for p in (root, *root.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
    except psutil.Error:
        pass
    return total


def _busy_s() -> float:
    """CPU seconds all cores have been busy since boot (/proc/stat, less idle and iowait)."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


class ForeignCpu:
    """How much of the machine *other* processes used while a measurement ran: all busy CPU time
    less the server's process tree and our waited children (the bench client), over wall time x
    cores.  0 is a clean measurement; 0.5 means another job held one of the two cores throughout."""

    def __init__(self, server_pid: int) -> None:
        self.pid = server_pid
        self.t0, self.busy0, self.own0 = time.monotonic(), _busy_s(), self._own()

    def _own(self) -> float:
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        me = resource.getrusage(resource.RUSAGE_SELF)
        return _tree_cpu_s(self.pid) + kids.ru_utime + kids.ru_stime + me.ru_utime + me.ru_stime

    def share(self) -> float:
        wall = max(time.monotonic() - self.t0, 1e-6)
        foreign = (_busy_s() - self.busy0) - (self._own() - self.own0)
        return max(foreign, 0.0) / (wall * (os.cpu_count() or 1))


def wait_quiet(server_pid: int, max_foreign: float, timeout_s: float) -> float:
    """Wait (bounded) until other processes use at most `max_foreign` of the cores over 2 s (the
    server's own idle CPU, e.g. a spinning MPI rank, does not count).  Returns the last share seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        meter = ForeignCpu(server_pid)
        time.sleep(2.0)
        share = meter.share()
        if share <= max_foreign or time.monotonic() > deadline:
            if share > max_foreign:
                print(
                    f"  (others still use {share:.0%} of the cores after {timeout_s:.0f} s; measuring anyway)",
                    flush=True,
                )
            return share
