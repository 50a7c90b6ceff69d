"""The HTTP worker processes (PUSH_MODE_HTTP_WORKERS) as rank 0 starts, restarts and stops them.

`HttpWorkers` runs `python -m spmd_serve.http_worker` once per worker, each given its setup (the
IO settings, the hub's port and token, its index) as JSON on its stdin, so that neither the API
key nor the token shows in a process listing.  A worker's environment is rank 0's without the MPI
variables: it is no rank (stop_server finds rank 0 by OMPI_COMM_WORLD_RANK) and never calls MPI;
it keeps SPMD_SERVE_RUN_ID, so stop_server still finds it as one of the job's processes.
A worker may run on every core the job has on the node (`cores`), not only on rank 0's: a child
inherits its parent's binding, and at `-n 2` rank 0 is bound to one core, where the worker's
~0.3 ms a token always preempted rank 0 (its publish of a token took 0.15-0.39 ms there, against
~0.07 of CPU), even while rank 1's core idled waiting for the plan.  On two cores the served
throughput read level (RESULTS.md "Session 50"): the worker's time then lands on rank 1 as often.
A worker runs under SCHED_BATCH (any user may ask it; every thread it starts inherits it): woken by a
token, it waits for a free core or the current task's slice rather than preempting a rank's thread
on the spot.  Where the ranks' threads fill the cores (a CPU node), a preempted thread stalls the
whole step (the pool waits for its task, and rank 0's main thread runs the interpreter's serial
part alone); a worker's token then goes out a little later, and the step does not stall
(--demo small, c = 1, 2 cores: +5-13 % output tokens/s, RESULTS.md "Session 75").  Where cores are
free, as on a GPU node, the policy changes nothing.

`check()` runs on the engine thread (the hub's tick): a worker that exited is logged with its
exit status and started again, at once the first time, then with a growing pause while it keeps
dying within seconds (a crash loop must not eat rank 0's core).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any

log = logging.getLogger("spmd_serve.engine")
_MPI_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "OPAL_")
QUICK_DEATH_S = 10.0  # a worker that dies sooner than this after its start is restarted with a pause
MAX_PAUSE_S = 30.0


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def worker_environ(environ: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if not k.startswith(_MPI_PREFIXES)}


class HttpWorkers:
    """`count` worker processes; `setup` is what every one of them reads from stdin; `cores`: the
    CPUs they may run on (None: rank 0's own)."""

    def __init__(
        self, count: int, setup: dict[str, Any], environ: dict[str, str], cores: frozenset[int] | None = None
    ) -> None:
        self.count, self.setup, self.cores = count, setup, cores
        self.environ = worker_environ(environ)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.restarts = 0
        self._started_at: dict[int, float] = {}
        self._quick_deaths: dict[int, int] = {}
        self._due: dict[int, float] = {}  # worker -> when it may be started again
        self.stopping = False

    def start(self) -> None:
        for i in range(self.count):
            self._spawn(i, None)

    def _spawn(self, i: int, state: dict[str, Any] | None) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spmd_serve.http_worker"], stdin=subprocess.PIPE, env=self.environ, close_fds=True
        )
        assert proc.stdin is not None
        # set before the new interpreter starts a thread (it waits for its setup): every later one inherits them
        with contextlib.suppress(OSError):  # it died at once: check() sees the exit
            if self.cores:
                os.sched_setaffinity(proc.pid, self.cores)
            os.sched_setscheduler(proc.pid, os.SCHED_BATCH, os.sched_param(0))
        try:
            proc.stdin.write(json.dumps({**self.setup, "worker": i, "state": state}).encode())
            proc.stdin.close()
        except BrokenPipeError:  # it died at once: check() sees the exit
            pass
        self.procs[i], self._started_at[i] = proc, time.monotonic()

    def pids(self) -> dict[int, int]:
        return {i: p.pid for i, p in self.procs.items()}

    def exited(self) -> str:
        """At start-up: why a worker is already gone ("" while all run)."""
        for i, proc in sorted(self.procs.items()):
            rc = proc.poll()
            if rc is not None:
                return f"HTTP worker {i} {describe_exit(rc)} before it was ready (its log lines are above)"
        return ""

    def check(self, state: dict[str, Any] | None = None) -> None:
        """Restart every worker that exited (with a pause when it keeps dying quickly).  `state` is
        the engine's (the hub's state message): a replacement starts from it, so one that joins the
        public ports of a ready server is ready before it binds them."""
        now = time.monotonic()
        for i, proc in list(self.procs.items()):
            if i in self._due:
                if now >= self._due[i] and not self.stopping:
                    del self._due[i]
                    self.restarts += 1
                    self._spawn(i, state)
                continue
            rc = proc.poll()
            if rc is None or self.stopping:
                continue
            quick = now - self._started_at[i] < QUICK_DEATH_S
            self._quick_deaths[i] = self._quick_deaths.get(i, 0) + 1 if quick else 0
            pause = min(2.0 ** (self._quick_deaths[i] - 1), MAX_PAUSE_S) if quick else 0.0
            log.error(
                "HTTP worker %d (pid %d) %s; starting it again%s",
                i,
                proc.pid,
                describe_exit(rc),
                f" in {pause:g} s" if pause else "",
            )
            self._due[i] = now + pause

    def stop(self, timeout: float = 10.0) -> None:
        """After the hub's `bye`: wait for the workers to finish their answers and exit; then
        terminate, then kill what is left."""
        self.stopping = True
        deadline = time.monotonic() + timeout
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            for proc in self.procs.values():
                if sig is not None and proc.poll() is None:
                    proc.send_signal(sig)
            for proc in self.procs.values():
                try:
                    proc.wait(max(deadline - time.monotonic(), 0.1) if sig is None else 5.0)
                except subprocess.TimeoutExpired:
                    pass
            if all(p.poll() is not None for p in self.procs.values()):
                return
