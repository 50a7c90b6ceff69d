"""Test harness for the front end in worker processes, in one test process: rank 0's
`FrontendHub` driven by a `FakeEngine` thread (as the engine loop drives it), and HTTP workers —
`IOServer` + `RemoteEngineClient` + `EngineLink` with the fake tokenizer — connected to it over real
loopback sockets, exactly as `spmd_serve.http_worker` wires a worker process.  `RawWorker` speaks
the wire format itself, for what a misbehaving or dying worker does."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from spmd_serve.engine.frontend_hub import FrontendHub
from spmd_serve.engine.metrics import render
from spmd_serve.engine.remote_client import EngineLink, RemoteEngineClient
from spmd_serve.engine.wire import FrameDecoder, Message, encode
from tests.support.fakes import FakeEngine, FakeTokenizer


def wait_for(cond: Callable[[], object], timeout: float = 5.0, what: str = "condition", poll: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout} s"
        time.sleep(poll)


class Worker:
    """One in-process HTTP worker: service + health + metrics ports, linked to the hub."""

    def __init__(self, hub: FrontendHub, index: int, capacity: int, **settings) -> None:
        from spmd_serve.frontend.server.app import IOServer
        from spmd_serve.frontend.server.metrics_service import MetricsService
        from spmd_serve.http_worker import tokenizer_facts

        self.client = RemoteEngineClient(capacity)
        sock = socket.create_connection(("127.0.0.1", hub.port))
        self.link = EngineLink(self.client, sock, index, hub.token, tokenizer_facts(FakeTokenizer()))
        self.metrics = MetricsService(self.client.fetch_metrics, "127.0.0.1", 0)
        # streams as long as a test wants: it ends them by closing them, not by waiting for them
        settings = {"host": "127.0.0.1", "http_port": 0, "health_port": 0, "max_seq_len": 256, "max_dec_len": 1 << 20}
        self.server = IOServer(self.client, FakeTokenizer(), services=[self.metrics, self.link], **settings)
        self.server.start(timeout=5)
        self.base = f"http://127.0.0.1:{self.server.http_port}"
        self.url = self.base + "/v1/chat/completions"
        self.health = f"http://127.0.0.1:{self.server.health_port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics.port}/metrics"


class RemoteHarness:
    """A hub with a fake engine behind it and `workers` in-process workers in front of it."""

    def __init__(self, workers: int = 2, capacity: int = 16, step_s: float = 0.002, ready: bool = True) -> None:
        self.registry = CollectorRegistry()
        self.scrapes = Counter("fake_scrapes", "rendered by the hub", registry=self.registry)
        self.handoffs: list[tuple[float, int]] = []
        self.hub = FrontendHub(0, capacity, self._render)
        self.hub.on_handoff = lambda s, n: self.handoffs.append((s, n))
        self.engine = FakeEngine(self.hub, step_s).start(ready=False)
        self.workers: list[Worker] = []
        try:
            for i in range(workers):
                self.workers.append(Worker(self.hub, i, capacity))
            wait_for(lambda: len(self.hub.workers) == workers, what="every worker's hello")
            if ready:
                self.set_ready()
        except BaseException:
            self.close()
            raise

    def _render(self, accept: str) -> tuple[bytes, str]:
        self.scrapes.inc()
        return render(self.registry, accept)

    def set_ready(self) -> None:
        self.hub.ready.set()
        self.hub.wake()
        wait_for(lambda: all(w.client.ready.is_set() for w in self.workers), what="ready on every worker")

    def crash_engine(self) -> None:
        """Rank 0 dies: its sockets close without a `bye`."""
        self.engine.stop()
        for link in list(self.hub.workers.values()):
            link.close()

    def close(self) -> None:
        for w in self.workers:
            w.server.stop(timeout=5)
        self.engine.stop()
        self.hub.close(timeout=1)


class RawWorker:
    """A connection to the hub that speaks the wire format directly."""

    def __init__(self, hub: FrontendHub) -> None:
        self.sock = socket.create_connection(("127.0.0.1", hub.port), timeout=5)
        self.decoder = FrameDecoder()
        self.pending: list[Message] = []  # received, not yet asked for

    def send(self, msg: Message) -> None:
        self.sock.sendall(encode(msg))

    def recv_until(self, kind: str, timeout: float = 5.0) -> Message:
        """The first message of `kind` (others skipped); AssertionError at EOF or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            while self.pending:
                msg = self.pending.pop(0)
                if msg["t"] == kind:
                    return msg
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            data = self.sock.recv(1 << 16)
            assert data, f"the hub closed the connection before a {kind!r} message"
            self.pending += self.decoder.feed(data)

    def closed_by_hub(self, timeout: float = 5.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(1 << 16):
                pass
        except ConnectionResetError:
            pass
        return True

    def close(self) -> None:
        self.sock.close()
