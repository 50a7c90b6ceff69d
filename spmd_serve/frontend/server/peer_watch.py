"""An HTTP worker's watch over the ranks on its node (rank 0 sends their pids once all loaded).

When a rank dies, mpirun notices and ends the whole job, but that takes it a second or two, and
meanwhile rank 0's engine thread may be blocked in a collective with the dead rank: it can neither
answer nor fail its requests.  A worker's IO thread is never blocked, so it checks every `poll_s` that the
processes of the ranks on this node are alive (`POLL_S`).  When one is gone: the server stops admitting (503),
health turns 503 naming the rank, and every request in flight ends with an error frame (503) instead
of a cut connection.  Ranks on other nodes are left to mpirun, whose daemons notice their deaths.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psutil

from spmd_serve.engine.client import EngineClient

log = logging.getLogger(__name__)
POLL_S = 0.1  # a few /proc reads: ~0.1 % of a core


class PeerWatch:
    """An IOService (see frontend/server/app.py): started and stopped with the IO loop."""

    def __init__(self, client: EngineClient, poll_s: float = POLL_S) -> None:
        self.client, self.poll_s = client, poll_s
        self._peers: dict[int, psutil.Process] = {}
        self._task: asyncio.Task | None = None

    def watch(self, peers: dict[int, int]) -> None:
        """Start watching these ranks (world rank -> pid); called once every rank has loaded.
        A psutil.Process remembers its start time, so a reused pid does not pass for the rank."""
        procs = {}
        for rank, pid in peers.items():
            try:
                procs[rank] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                procs[rank] = None
        self._peers = procs  # one assignment: the IO thread sees the old dict or the new one

    def dead(self) -> list[tuple[int, int | None]]:
        """(rank, pid) of every watched rank whose process is gone (exited, killed, a zombie)."""
        return [(rank, p.pid if p else None) for rank, p in sorted(self._peers.items()) if not _alive(p)]

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self, grace: float) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            dead = self.dead()
            if dead:
                self._fail(dead)
                return

    def _fail(self, dead: list[tuple[int, int | None]]) -> None:
        ranks = ", ".join(f"rank {r} (pid {pid})" for r, pid in dead)
        msg = f"{ranks} exited unexpectedly: the server is going down"
        log.error("%s; failing %d request(s) in flight", msg, self.client.num_in_flight)
        self.client.failure = msg
        self.client.draining.set()
        self.client.fail_all(503, msg)


def _alive(p: psutil.Process | None) -> bool:
    try:
        return p is not None and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
