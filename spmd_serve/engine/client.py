"""The hand-off between an IO thread (asyncio: HTTP, gRPC) and an engine thread in one process:
the in-process mode, which the http-tier tests run over a fake engine.  The server itself runs its
front end in HTTP worker processes (engine/remote_client.py, engine/frontend_hub.py), which keep
this interface and share `check_admission`.

The IO side calls `add_request` / `abort` from the event loop; the engine thread calls
`wait_for_work`, `take_commands` and `publish`.  Outputs reach the IO side through per-request
asyncio queues fed with `loop.call_soon_threadsafe`, so the IO thread never blocks on the engine
and the engine never touches asyncio objects directly.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from spmd_serve.engine import json_masks
from spmd_serve.engine.outputs import RequestOutput
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.scheduler import QueueFullError

__all__ = [
    "REFUSAL_STATUS",
    "AbortCommand",
    "AddCommand",
    "ControlCommand",
    "DuplicateRequestError",
    "EngineClient",
    "NotReadyError",
    "QueueFullError",
    "RequestOutput",
    "check_admission",
]


HANDOFF_WAIT_S = 0.02  # the engine waits at most this long for the IO thread to take outputs


class DuplicateRequestError(Exception):
    """A request with this req_id is still in flight (HTTP 409)."""


class NotReadyError(Exception):
    """The engine is not ready or is draining (HTTP 503)."""


REFUSAL_STATUS: dict[type[Exception], int] = {NotReadyError: 503, DuplicateRequestError: 409, QueueFullError: 429}


def check_admission(req_id: str, ready: bool, draining: bool, in_flight: Collection[str], capacity: int) -> None:
    """May a request with this id be submitted now?  Raises one of REFUSAL_STATUS's errors if not.
    The one rule for the in-process client and for rank 0's hub over several HTTP workers."""
    if not ready or draining:
        raise NotReadyError("server is not ready" if not ready else "server is shutting down")
    if req_id in in_flight:
        raise DuplicateRequestError(f"req_id {req_id!r} is already in flight")
    if len(in_flight) >= capacity:
        raise QueueFullError(
            f"too many requests in flight ({len(in_flight)}); "
            f"the limit is BATCH_SIZE + MAX_CACHED_TASK_NUM = {capacity}"
        )


@dataclass
class AddCommand:
    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)


@dataclass
class AbortCommand:
    req_id: str
    reason: str = "abort"  # "stop": the front end found a stop string (a normal end)
    requested_at: float = field(default_factory=time.monotonic)  # for the abort-delay metric


@dataclass
class VocabCommand:
    """Every token's bytes, sent before the first JSON-schema request (engine/json_masks.py)."""

    token_bytes: list[bytes]


@dataclass
class ControlCommand:
    """An operator's request of the engine itself (engine/control.py), done between two steps and
    answered through `reply` (called once, on the engine thread, with a JSON-able dict)."""

    op: str
    args: dict[str, Any]
    reply: Callable[[dict[str, Any]], None]


Command = AddCommand | AbortCommand | VocabCommand | ControlCommand


class EngineClient:
    """Thread-safe bridge, shared by the IO and engine threads of one process."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # BATCH_SIZE + MAX_CACHED_TASK_NUM
        self._cv = threading.Condition()
        self._commands: collections.deque[Command] = collections.deque()
        self._vocab_sent = False
        self._streams: dict[str, asyncio.Queue[RequestOutput]] = {}
        # A req_id may be reused as soon as its request is aborted, while outputs the engine
        # computed for the aborted one are still on their way to the IO loop.  Each batch of
        # commands the engine takes starts an epoch; a stream accepts only outputs published
        # in or after the epoch in which the engine took its AddCommand.
        self._epoch = 0
        self._since: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._io_thread: int | None = None
        self.ready = threading.Event()  # set once every rank has loaded its model
        self.draining = threading.Event()  # set on shutdown: new requests get 503
        self.heartbeat = time.monotonic()  # engine loop liveness, read by /health/live
        self.busy_since: float | None = None  # a step in progress (a long prefill is no hang)
        # Set (with `draining`) by the IO thread when the job goes down without rank 0 having
        # decided it, e.g. a rank died: why, for health answers and the requests' error frames.
        self.failure = ""
        # Called on the IO thread with the seconds from publishing a batch to its delivery, and
        # the number of batches (the engine sets it: the io_handoff step phase).
        self.on_handoff: Callable[[float, int], None] | None = None

    # ---- IO thread -------------------------------------------------------------------------
    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Called on the IO thread, whose outputs then go to `loop`."""
        self._loop = loop
        self._io_thread = threading.get_ident()

    def add_request(
        self, req_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> asyncio.Queue[RequestOutput]:
        """Queue a request; returns the queue its outputs arrive on.  Call from the IO loop."""
        with self._cv:
            check_admission(req_id, self.ready.is_set(), self.draining.is_set(), self._streams, self.capacity)
            stream: asyncio.Queue[RequestOutput] = asyncio.Queue()
            self._streams[req_id] = stream
            self._commands.append(AddCommand(req_id, list(prompt_token_ids), params))
            self._cv.notify()
        return stream

    def provide_vocabulary(self, tokenizer: Any) -> None:
        """Before a request with a JSON schema: the engine gets every token's bytes, once."""
        if not self._vocab_sent:
            with self._cv:
                self._commands.append(VocabCommand(json_masks.vocabulary_bytes(tokenizer)))
            self._vocab_sent = True

    def abort(self, req_id: str, reason: str = "abort") -> None:
        """Stop generating for req_id (client gone, deadline; reason "stop": a stop string was
        seen).  Idempotent."""
        with self._cv:
            self._since.pop(req_id, None)
            if self._streams.pop(req_id, None) is not None:
                self._commands.append(AbortCommand(req_id, reason))
                self._cv.notify()

    async def control(self, op: str, args: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        """Ask the engine to do `op` between two steps (engine/control.py); its answer, or
        NotReadyError (no engine loop yet) or TimeoutError (no answer within `timeout`).  A draining
        engine still answers: an operator may abort what keeps it from stopping."""
        if not self.ready.is_set():
            raise NotReadyError("server is not ready")
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[dict[str, Any]] = loop.create_future()

        def settle(result: dict[str, Any]) -> None:  # on the IO loop
            if not answer.done():  # (it may have timed out)
                answer.set_result(result)

        def reply(result: dict[str, Any]) -> None:  # on the engine thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
                loop.call_soon_threadsafe(settle, result)

        with self._cv:
            self._commands.append(ControlCommand(op, dict(args), reply))
            self._cv.notify()
        return await asyncio.wait_for(answer, timeout)

    def fail_all(self, error_code: int, error_msg: str) -> None:
        """End every request in flight with an error frame now, without the engine (which may be
        blocked in a collective with a dead rank).  Call from the IO loop."""
        with self._cv:
            streams = list(self._streams.items())
            self._streams.clear()
            self._since.clear()
        for req_id, stream in streams:
            stream.put_nowait(RequestOutput.error(req_id, error_code, error_msg))

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    # ---- engine thread ---------------------------------------------------------------------
    def wait_for_work(self, timeout: float) -> None:
        """Block (no MPI, no spinning) until a command arrives or timeout passes."""
        with self._cv:
            if not self._commands:
                self._cv.wait(timeout)

    def wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def take_commands(self) -> list[Command]:
        with self._cv:
            cmds = list(self._commands)
            self._commands.clear()
            self._epoch += 1
            for cmd in cmds:  # an add whose stream is gone (aborted already) has no epoch
                if isinstance(cmd, AddCommand) and cmd.req_id in self._streams:
                    self._since[cmd.req_id] = self._epoch
        return cmds

    def publish(self, outputs: list[RequestOutput]) -> None:
        """Deliver one step's outputs to their streams (thread-safe; drops unknown ids), and give
        the IO thread the GIL until it has handed them on (at most HANDOFF_WAIT_S).

        Why wait: Paddle's predictor.run holds the GIL for the whole graph (measured: a Python
        thread gets ~0.2 % of its idle progress during run()), so outputs published just before
        the next step would otherwise sit in the IO loop's queue until that step ends — a whole
        step of latency per token, in bursts.  The IO work has to happen anyway; this makes it
        happen now instead of somewhere inside the next step."""
        loop = self._loop  # read once: the IO thread may detach it while stopping
        if not outputs or loop is None:
            return
        handed_on = threading.Event()
        try:
            # _epoch is written by this (the engine) thread only: no lock needed to read it
            loop.call_soon_threadsafe(self._deliver, outputs, self._epoch, time.perf_counter(), handed_on)
        except RuntimeError:  # loop closed during shutdown: nobody is listening any more
            return
        if threading.get_ident() != self._io_thread:  # never wait for ourselves
            handed_on.wait(HANDOFF_WAIT_S)

    def _deliver(
        self,
        outputs: list[RequestOutput],
        epoch: int,
        published_at: float = 0.0,
        handed_on: threading.Event | None = None,
    ) -> None:
        if self.on_handoff is not None and published_at:
            self.on_handoff(time.perf_counter() - published_at, 1)
        for out in outputs:
            with self._cv:
                if self._since.get(out.req_id, epoch + 1) > epoch:
                    continue  # for an earlier request with this id, aborted since
                stream = self._streams.get(out.req_id)
                if out.finished:
                    self._streams.pop(out.req_id, None)
                    self._since.pop(out.req_id, None)
            if stream is not None:
                stream.put_nowait(out)
        if handed_on is not None:
            # Queued after the callbacks of the tasks these outputs woke: set once they have run
            # (written their frames to the sockets).
            asyncio.get_running_loop().call_soon(handed_on.set)
