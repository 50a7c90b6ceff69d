"""Rank 0's end of INTER_PROC_PORT: the HTTP worker processes seen as one front end by the engine.

`FrontendHub` has the engine-thread half of `EngineClient`'s interface (`take_commands`,
`publish`, `wait_for_work`, `wake`, `heartbeat`, `busy_since`, `ready`, `draining`), so the engine
loop runs unchanged; behind it are sockets to PUSH_MODE_HTTP_WORKERS processes, each running
HTTP, gRPC, tokenisation and detokenisation (http_worker.py, engine/remote_client.py).

Everything here runs on the engine thread, without a thread of its own: the sockets are polled
(non-blocking) at every loop turn and waited on (select) when the engine is idle.  So a worker's
abort is read at the next step whatever Paddle does with the GIL, and rank 0 runs no other Python
thread that a graph could starve.  The checks that must be global live here: a req_id in flight
on any worker is a 409, the in-flight capacity a 429 (`check_admission`, as in process).  The
workers learn readiness, draining and the engine's heartbeat from `state` and `beat` messages
(engine/hub_state.py); their questions (`metrics`, an operator's `control`) are answered to the
asker under the number it gave.
"""

from __future__ import annotations

import functools
import hmac
import logging
import secrets
import selectors
import time
from collections.abc import Callable
from typing import Any

from spmd_serve.engine.client import (
    REFUSAL_STATUS,
    AbortCommand,
    AddCommand,
    Command,
    ControlCommand,
    DuplicateRequestError,
    NotReadyError,
    QueueFullError,
    check_admission,
)
from spmd_serve.engine.hub_state import EngineStateMirror
from spmd_serve.engine.link import Link, LinkClosed, LinkPoller
from spmd_serve.engine.outputs import RequestOutput
from spmd_serve.engine.routes import Routes
from spmd_serve.engine.wire import Message, WireError, facts_from_hello, output_to_wire, params_from_wire, vocab_command

log = logging.getLogger("spmd_serve.engine")
TICK_S = 0.5  # how often `tick` (the worker supervisor's check) runs
MetricsRenderer = Callable[[str], tuple[bytes, str]]  # Accept header -> (body, content type)


class FrontendHub(EngineStateMirror):
    """Listens on 127.0.0.1:port; use from one thread (the engine's), `wake` from any."""

    def __init__(self, port: int, capacity: int, render_metrics: MetricsRenderer | None = None) -> None:
        super().__init__()
        self.capacity = capacity
        self.token = secrets.token_hex(16)  # a worker proves it was started by this rank 0
        self.render_metrics = render_metrics
        self.on_handoff: Callable[[float, int], None] | None = None
        self.tick: Callable[[], None] | None = None  # the supervisor's restart check
        self.start_errors: list[str] = []  # hellos of workers that could not start
        self.eos_token_ids: frozenset[int] = frozenset()  # the tokenizer's, from the first hello
        self.warm_up_ids: list[int] = []
        self._poller = LinkPoller(port)
        self.port = self._poller.port
        self.workers: dict[int, Link] = {}  # worker index -> its authenticated link
        self._routes: Routes[Link] = Routes()
        self._pending: list[Command] = []
        self._peers: dict[int, int] = {}
        self._tick_at = 0.0
        self._closed = False

    # ---- the engine thread's interface ----------------------------------------------------
    def take_commands(self) -> list[Command]:
        self._poll(0.0)
        cmds, self._pending = self._pending, []
        return cmds

    def wait_for_work(self, timeout: float) -> None:
        """Return when a command is waiting, after any socket event, or after `timeout`."""
        if not self._pending:
            self._poll(timeout)

    def wake(self) -> None:
        """From any thread or a signal handler: end a `wait_for_work` now."""
        self._poller.wake()

    def publish(self, outputs: list[RequestOutput]) -> None:
        """Send each output to the worker that owns its request; unknown ids (aborted) drop."""
        batches: dict[Link, list[Any]] = {}
        for out in outputs:
            route = self._routes.get(out.req_id)
            if route is None:
                continue
            link, n = route
            if out.finished:
                self._routes.pop(out.req_id)
            batches.setdefault(link, []).append(output_to_wire(out, n))
        now = time.monotonic()
        for link, items in batches.items():
            self._send(link, {"t": "out", "at": now, "o": items})

    @property
    def num_in_flight(self) -> int:
        return len(self._routes)

    # ---- start-up and shutdown ------------------------------------------------------------
    def wait_workers(self, count: int, timeout: float, exited: Callable[[], str]) -> None:
        """Until `count` workers said hello (their ports are bound).  RuntimeError with the
        reason when one could not start (`start_errors`, or `exited()` naming a dead one)."""
        deadline = time.monotonic() + timeout
        while len(self.workers) < count:
            gone = exited()
            if gone and not self.start_errors:  # it may have sent why and exited during this rank's load
                for _ in range(3):  # accept, then read
                    self._poll(0)
            if problem := self.start_errors[0] if self.start_errors else gone:
                raise RuntimeError(problem)
            if time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP workers did not start within {timeout:g} s")
            self._poll(0.05)

    def set_peers(self, peers: dict[int, int]) -> None:
        """The other ranks on this node (rank -> pid), for the workers' PeerWatch."""
        self._peers = dict(peers)
        self._broadcast(self._peers_msg())

    def close(self, timeout: float = 5.0) -> None:
        """Tell every worker the server is stopping (after the engine's last outputs), flush."""
        if self._closed:
            return
        self._closed = True
        # requests that reached the hub after the engine's last turn: never admitted, still owed an end
        self.publish([RequestOutput.error(req_id, 503, "server is shutting down") for req_id in list(self._routes)])
        self._sync_state()
        for link in list(self.workers.values()):
            try:
                link.send({"t": "bye"})
            except LinkClosed:
                pass
            link.flush_blocking(timeout)
        for link in self._routes.owners():
            link.close()
        self._poller.close()

    # ---- sockets ----------------------------------------------------------------------------
    def _poll(self, timeout: float) -> None:
        new, ready = self._poller.poll(timeout)
        for link in new:
            self._routes.connect(link)
        for link, events in ready:
            self._service(link, events)
        self._sync_state()
        now = time.monotonic()
        if self.tick is not None and now - self._tick_at >= TICK_S:
            self._tick_at = now
            self.tick()

    def _service(self, link: Link, events: int) -> None:
        try:
            if events & selectors.EVENT_WRITE:
                link.flush()
            if events & selectors.EVENT_READ:
                for msg in link.read():
                    self._handle(link, msg)
            self._poller.update(link)
        except (LinkClosed, WireError, KeyError, TypeError, ValueError) as e:
            self._drop(link, str(e) if isinstance(e, (LinkClosed, WireError)) else f"malformed message: {e!r}")

    def _send(self, link: Link, msg: Message) -> None:
        try:
            link.send(msg)
            if link.wants_write:  # the rest goes when the socket turns writable
                self._poller.update(link)
        except LinkClosed as e:
            self._drop(link, str(e))

    def _broadcast(self, msg: Message) -> None:
        for link in list(self.workers.values()):
            self._send(link, msg)

    def _drop(self, link: Link, why: str) -> None:
        """A worker's connection ended: the engine aborts every request it had in flight."""
        if not self._routes.connected(link):
            return
        requests = self._routes.disconnect(link)
        self._pending += [AbortCommand(req_id) for req_id in requests]
        if link.worker is None:
            log.info("closed a connection on INTER_PROC_PORT before its hello: %s", why)
        else:
            if self.workers.get(link.worker) is link:
                del self.workers[link.worker]
            text = "HTTP worker %d (pid %d) disconnected (%s): %d request(s) aborted"
            log.warning(text, link.worker, link.pid, why, len(requests))
        self._poller.forget(link)

    # ---- messages ---------------------------------------------------------------------------
    def _handle(self, link: Link, msg: Message) -> None:
        kind = msg["t"]
        if link.worker is None:
            self._hello(link, msg)
        elif kind == "add":
            self._add(link, msg["n"], msg["id"], msg["prompt"], msg["params"], msg["at"])
        elif kind == "abort":
            req_id = self._routes.pop_number(link, msg["n"])
            if req_id is not None:
                self._pending.append(AbortCommand(req_id, str(msg["reason"]), float(msg["at"])))
        elif kind == "vocab":  # (every worker may send it: the engine keeps the first)
            self._pending.append(vocab_command(msg))
        elif kind == "handoff":
            if self.on_handoff is not None:
                self.on_handoff(float(msg["s"]), int(msg["n"]))
        elif kind == "control":  # answered after the engine did it, to the asking worker
            reply = functools.partial(self._answer, link, msg["q"])
            self._pending.append(ControlCommand(str(msg["op"]), dict(msg["args"]), reply))
        elif kind == "metrics":
            body, ctype = self.render_metrics(str(msg["accept"])) if self.render_metrics else (b"", "text/plain")
            self._send(link, {"t": "metrics", "q": msg["q"], "body": body.decode(), "type": ctype})
        else:
            raise WireError(f"unknown message {kind!r}")

    def _answer(self, link: Link, q: int, result: dict[str, Any]) -> None:
        self._send(link, {"t": "control", "q": q, "r": result})

    def _hello(self, link: Link, msg: Message) -> None:
        if msg["t"] != "hello" or not hmac.compare_digest(str(msg.get("token", "")), self.token):
            raise WireError("a connection that is not one of our workers")
        worker, link.pid = int(msg["worker"]), int(msg["pid"])
        if not msg["ok"]:
            self.start_errors.append(str(msg["error"]))
            raise LinkClosed(f"worker {worker} could not start")
        old = self.workers.get(worker)
        if old is not None:
            self._drop(old, "replaced by a new process")
        if not self.warm_up_ids:  # every worker loads the same tokenizer: the first one's facts
            self.eos_token_ids, self.warm_up_ids = facts_from_hello(msg)
        link.worker = worker
        self.workers[worker] = link
        log.info("HTTP worker %d (pid %d) connected", worker, link.pid)
        self._send(link, self._state_msg(self._state()))
        if self._peers:
            self._send(link, self._peers_msg())

    def _add(self, link: Link, n: int, req_id: str, prompt: list[int], params: Any, at: float) -> None:
        if not (isinstance(n, int) and isinstance(req_id, str) and isinstance(prompt, list)):
            raise WireError("malformed add")
        try:
            check_admission(req_id, self.ready.is_set(), self.draining.is_set(), self._routes, self.capacity)
        except (NotReadyError, DuplicateRequestError, QueueFullError) as e:  # to this worker's request only
            err = RequestOutput.error(req_id, REFUSAL_STATUS[type(e)], str(e))
            self._send(link, {"t": "out", "at": time.monotonic(), "o": [output_to_wire(err, n)]})
            return
        self._routes.add(link, n, req_id)
        self._pending.append(AddCommand(req_id, prompt, params_from_wire(params), float(at)))

    def _peers_msg(self) -> Message:
        return {"t": "peers", "peers": {str(r): pid for r, pid in self._peers.items()}}
