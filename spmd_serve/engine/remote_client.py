"""An HTTP worker process's `EngineClient`: the same interface for the front end, forwarded over
INTER_PROC_PORT to rank 0's `FrontendHub` (engine/frontend_hub.py).

The front end (native, OpenAI, gRPC, health, PeerWatch) calls `add_request`, `abort`,
`fail_all`, reads `ready` / `draining` / `heartbeat` / `busy_since` / `failure`, and reads outputs
from per-request asyncio queues exactly as in process.  Here everything runs on the worker's IO
loop: `add_request` checks what this worker can know (ready, draining, its own ids and capacity)
and writes an `add` frame; the hub repeats the checks over all workers and answers a refusal as the
request's only output (409, 429, 503).  Each request gets this worker's own number `n`, so the
outputs of an aborted request can never reach a later one with the same req_id.  The engine
thread's half of the base class (`take_commands`, `publish`, ...) is not used in a worker.

`EngineLink` is the IO service that owns the connection: hello, the reader task, and the end —
`bye` (the server is stopping: wait for the open requests to answer) or EOF (rank 0 is gone:
fail every request with 503).  `done` is set then, and the worker process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from spmd_serve.engine import json_masks
from spmd_serve.engine.client import EngineClient, NotReadyError, check_admission
from spmd_serve.engine.outputs import RequestOutput
from spmd_serve.engine.wire import (
    FrameDecoder,
    Message,
    WireError,
    encode,
    output_from_wire,
    params_to_wire,
    vocab_to_wire,
)  # fmt: skip
from spmd_serve.sampling_params import SamplingParams

HANDOFF_REPORT_S = 0.2  # how often the hand-off times go back to the engine's /metrics
STOP_GRACE_S = 5.0  # after `bye`: how long the open requests may take to write their last frame


class RemoteEngineClient(EngineClient):
    """The front end's engine, in a worker process; use on the IO loop only."""

    def __init__(self, capacity: int, state: dict[str, Any] | None = None) -> None:
        """`state`: the engine's state when rank 0 started this worker (a replacement of a dead
        worker of a ready server starts ready: it answers at once, never a 503 while its link
        comes up); the state messages after the hello keep it current."""
        super().__init__(capacity)
        self._writer: asyncio.WriteTransport | None = None
        # Messages written before the link is up (requests that reach a ready replacement while
        # its hello is being sent) wait here and follow the hello; None once the link is up or gone.
        self._early: list[bytes] | None = []
        if state is not None:
            self.on_message({"t": "state", **state})
        self._n = 0
        self._ids: dict[str, int] = {}  # req_id -> n, while its outputs may come
        self._by_n: dict[int, str] = {}
        self._open: set[str] = set()  # submitted and not yet closed by its handler
        self._answers: dict[int, asyncio.Future[Message]] = {}  # a question's number -> rank 0's answer
        self._handoff = [0.0, 0]  # seconds, batches not yet reported
        self._report: asyncio.TimerHandle | None = None
        self.on_peers: Callable[[dict[int, int]], None] | None = None

    # ---- the front end's interface ----------------------------------------------------------
    def add_request(
        self, req_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> asyncio.Queue[RequestOutput]:
        check_admission(req_id, self.ready.is_set(), self.draining.is_set(), self._streams, self.capacity)
        if not self.linked:
            raise NotReadyError("server is not ready")
        self._n += 1
        n = self._n
        stream: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._streams[req_id], self._ids[req_id], self._by_n[n] = stream, n, req_id
        self._open.add(req_id)
        add = {"n": n, "id": req_id, "prompt": list(prompt_token_ids), "params": params_to_wire(params)}
        self._send({"t": "add", **add, "at": time.monotonic()})
        return stream

    def provide_vocabulary(self, tokenizer: Any) -> None:
        """The engine's copy goes on this link, ahead of the request that needs it."""
        if not self._vocab_sent:
            self._send(vocab_to_wire(json_masks.vocabulary_bytes(tokenizer)))
            self._vocab_sent = True

    def abort(self, req_id: str, reason: str = "abort") -> None:
        self._open.discard(req_id)
        if self._streams.pop(req_id, None) is not None:
            n = self._ids.pop(req_id)
            del self._by_n[n]
            self._send({"t": "abort", "n": n, "reason": reason, "at": time.monotonic()})

    def fail_all(self, error_code: int, error_msg: str) -> None:
        """End every request in flight with an error now (a rank died), and every question waiting
        for rank 0's answer with NotReadyError; the engine is told to drop the requests too, in case
        it is still there to hear it."""
        for req_id, stream in list(self._streams.items()):
            self.abort(req_id)
            self._open.add(req_id)  # its handler has yet to write the error
            stream.put_nowait(RequestOutput.error(req_id, error_code, error_msg))
        for answer in self._answers.values():  # questions rank 0 will never answer
            if not answer.done():
                answer.set_exception(NotReadyError(error_msg))

    async def fetch_metrics(self, accept: str, timeout: float = 10.0) -> tuple[bytes, str]:
        """The engine's /metrics text, rendered on rank 0; NotReadyError or TimeoutError."""
        if not self.linked:
            raise NotReadyError("the engine is not connected")
        self._report_handoff()  # this worker's pending hand-off times count in this scrape
        answer = await self._ask({"t": "metrics", "accept": accept}, timeout)
        return str(answer["body"]).encode(), str(answer["type"])

    async def control(self, op: str, args: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        """As the in-process client's, over the link: rank 0's hub hands it to the engine."""
        if not self.ready.is_set() or not self.linked:
            raise NotReadyError("server is not ready")
        answer = await self._ask({"t": "control", "op": op, "args": args}, timeout)
        return dict(answer["r"])

    async def _ask(self, msg: Message, timeout: float) -> Message:
        """Send a question (numbered here) and wait for the answer rank 0 sends back with its number."""
        q = self._n = self._n + 1
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._answers[q] = future
        self._send({**msg, "q": q})
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._answers.pop(q, None)

    @property
    def num_open(self) -> int:
        """Requests whose handlers have not closed them yet."""
        return len(self._open)

    @property
    def linked(self) -> bool:
        """The link to rank 0 is up or still coming up (messages are written or wait for it)."""
        return self._writer is not None or self._early is not None

    # ---- from the engine ---------------------------------------------------------------------
    def connected(self, writer: asyncio.WriteTransport | None, hello: Message | None = None) -> None:
        """The link is up (`hello` first, then what waited for it) or gone (None)."""
        early, self._early = self._early or [], None
        self._writer = writer
        if writer is not None and hello is not None:
            writer.write(encode(hello))
            for data in early:
                writer.write(data)

    def on_message(self, msg: Message) -> None:
        kind = msg["t"]
        if kind == "out":
            self._deliver_items(msg["o"], float(msg["at"]))
        elif kind == "beat":
            now = time.monotonic()
            self.heartbeat, self.busy_since = now, now if msg["busy"] else None
        elif kind == "state":
            (self.ready.set if msg["ready"] else self.ready.clear)()
            if msg["draining"]:
                self.draining.set()
            self.failure = self.failure or str(msg["failure"])
        elif kind == "peers" and self.on_peers is not None:
            self.on_peers({int(r): int(pid) for r, pid in msg["peers"].items()})
        elif kind in ("metrics", "control"):  # an answer
            future = self._answers.get(int(msg["q"]))
            if future is not None and not future.done():
                future.set_result(msg)
        elif kind != "peers":
            raise WireError(f"unknown message {kind!r}")

    def _deliver_items(self, items: list[Any], published_at: float) -> None:
        self._handoff[0] += time.monotonic() - published_at
        self._handoff[1] += 1
        if self._report is None:
            self._report = asyncio.get_running_loop().call_later(HANDOFF_REPORT_S, self._report_handoff)
        for item in items:
            req_id = self._by_n.get(item[0])
            if req_id is None:
                continue  # aborted here meanwhile
            out = output_from_wire(item, req_id)
            stream = self._streams[req_id]
            if out.finished:
                del self._streams[req_id], self._ids[req_id], self._by_n[item[0]]
            stream.put_nowait(out)

    def _report_handoff(self) -> None:
        if self._report is not None:
            self._report.cancel()
            self._report = None
        (seconds, batches), self._handoff = self._handoff, [0.0, 0]
        if batches:
            self._send({"t": "handoff", "s": seconds, "n": batches})

    def _send(self, msg: Message) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(encode(msg))
        elif self._early is not None:
            self._early.append(encode(msg))


class EngineLink(asyncio.Protocol):
    """The IO service that connects a worker's client to rank 0 (started last: the ports are
    bound by then, and the hello says so).  A protocol rather than a StreamReader task: frames are
    cut and delivered in `data_received`, one event-loop turn per step's outputs fewer."""

    def __init__(
        self,
        client: RemoteEngineClient,
        sock: socket.socket,
        worker: int,
        token: str,
        facts: dict[str, Any] | None = None,
    ) -> None:
        """`facts`: what rank 0's engine needs from the tokenizer (`tokenizer_facts`), in the hello."""
        self.client, self.sock, self.worker, self.token = client, sock, worker, token
        self.facts = facts or {}
        self.done = threading.Event()  # the server is stopping or rank 0 is gone: exit
        self.stopped_cleanly = False
        self._decoder = FrameDecoder()
        self._transport: asyncio.Transport | None = None
        self._ending: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_connection(lambda: self, sock=self.sock)
        hello = {"t": "hello", "worker": self.worker, "pid": os.getpid(), "token": self.token, "ok": True, **self.facts}
        self.client.connected(transport, hello)

    async def stop(self, grace: float) -> None:
        if self._ending is not None and not self._ending.done():
            self._ending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ending
        self.client.connected(None)
        if self._transport is not None:
            self._transport.close()

    # ---- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._ending is not None:
            return
        try:
            for msg in self._decoder.feed(data):
                if msg["t"] == "bye":
                    self.stopped_cleanly = True
                    self._end("bye")
                    return
                self.client.on_message(msg)
        except (WireError, KeyError, TypeError, ValueError) as e:
            self._end(str(e) or type(e).__name__)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(str(exc) if exc else "connection closed")

    def _end(self, why: str) -> None:
        if self._ending is None:
            self._ending = asyncio.get_running_loop().create_task(self._finish(why))

    async def _finish(self, why: str) -> None:
        client = self.client
        client.draining.set()
        if not self.stopped_cleanly:
            if not client.failure:
                client.failure = f"rank 0 (pid {os.getppid()}) exited unexpectedly ({why}): the server is going down"
            client.fail_all(503, client.failure)
        deadline = time.monotonic() + STOP_GRACE_S  # let the handlers write their last frames
        while client.num_open and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self.done.set()


def report_start_failure(sock: socket.socket, worker: int, token: str, error: str) -> None:
    """The hello of a worker that could not start (a busy port, a bad tokenizer): rank 0 prints it
    as its one start-up error line."""
    hello = {"t": "hello", "worker": worker, "pid": os.getpid(), "token": token, "ok": False, "error": error}
    with contextlib.suppress(OSError):
        sock.sendall(encode(hello))
