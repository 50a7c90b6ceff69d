"""The real Engine loop in a thread with fake ranks (tests/support/fakes.py), and its EngineClient
on an asyncio loop in another thread, as on rank 0: requests are added and read on the IO loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

from spmd_serve.engine.client import EngineClient, RequestOutput
from spmd_serve.engine.engine import Engine
from spmd_serve.scheduler.scheduler import SchedulerConfig
from tests.support.fakes import FakeComm, FakeRunner


class LoopThread:
    """An asyncio loop in a thread, as rank 0's IO thread: requests are added and read there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, fn, *args):
        async def run():
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(5)

    def read_all(self, queue: asyncio.Queue, timeout: float = 20) -> list[RequestOutput]:
        async def drain() -> list[RequestOutput]:
            outs = []
            while not (outs and outs[-1].finished):
                outs.append(await queue.get())
            return outs

        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(drain(), timeout), self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


Rig = tuple[Callable[..., Engine], EngineClient, LoopThread, FakeComm]


def engine_rig(step_s: float, **sched: Any) -> Iterator[Rig]:
    """Body of a fixture: yields (start(**engine_kw) -> a running Engine, client, io, comm); every
    engine started is stopped after the test (and must end).  `sched`: SchedulerConfig fields."""
    io = LoopThread()
    client = EngineClient(capacity=8)
    client.attach_loop(io.loop)
    client.ready.set()
    cfg = SchedulerConfig(
        max_num_seqs=4,
        num_blocks=512,
        block_size=4,
        block_ratio=1.0,
        max_waiting=8,
        max_num_batched_tokens=64,
        max_model_len=1024,
        **sched,
    )
    comm = FakeComm()
    made: list[tuple[Engine, threading.Thread]] = []

    def start(drain_timeout_s: float = 60.0, **kw: Any) -> Engine:
        eng = Engine(cfg, comm, FakeRunner(step_s=step_s), client, frozenset(), drain_timeout_s=drain_timeout_s, **kw)
        made.append((eng, threading.Thread(target=eng.run, daemon=True)))
        made[-1][1].start()
        return eng

    yield start, client, io, comm
    for eng, t in made:
        eng.stop_event.set(), eng.abort_event.set(), client.wake()  # whatever the test did
        t.join(10)
        assert not t.is_alive(), "engine loop did not end"
    io.close()
