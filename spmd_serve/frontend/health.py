"""Health endpoints (CONTRACT.md §6): liveness and readiness of rank 0's engine, read from the
EngineClient without touching the engine thread.

live  = the engine loop beat recently, or a step is in progress (a long prefill is not a hang) and
        has not run longer than a generous bound (a step stuck in a collective is a hang), and
        no rank is known to have died (`client.failure`, set by the PeerWatch);
ready = every rank has loaded its model (`client.ready`), none has died, and the server is not
        draining.
Both answer 200 with a small JSON body when true and 503 with the native error shape otherwise.
They never require the API key: load balancers and `start_server` poll them unauthenticated.
"""
from __future__ import annotations

import json
import time
from typing import Any

from tornado.web import RequestHandler

from spmd_serve.engine.client import EngineClient

DEFAULT_LIVE_THRESHOLD_S = 10.0
# One step is at most SPMD_MAX_NUM_BATCHED_TOKENS tokens (chunked prefill), seconds even for a big
# model on CPU; a step this long means a rank is stuck (e.g. a peer hung inside a collective).
DEFAULT_STEP_LIMIT_S = 300.0


def is_live(client: EngineClient, threshold_s: float = DEFAULT_LIVE_THRESHOLD_S,
            step_limit_s: float = DEFAULT_STEP_LIMIT_S) -> tuple[bool, str]:
    """(alive?, reason when not)."""
    if client.failure:
        return False, client.failure
    busy_since = client.busy_since          # read once: the engine thread clears it
    if busy_since is not None:              # inside a step: it beats again when the step ends
        busy = time.monotonic() - busy_since
        if busy < step_limit_s:
            return True, ""
        return False, (f"an engine step has been running for {busy:.0f} s (limit "
                       f"{step_limit_s:g} s): a rank is stuck")
    age = time.monotonic() - client.heartbeat
    if age < threshold_s:
        return True, ""
    return False, f"engine loop has not reported for {age:.1f} s (limit {threshold_s:g} s)"


def is_ready(client: EngineClient) -> tuple[bool, str]:
    if client.failure:
        return False, client.failure
    if client.draining.is_set():
        return False, "server is shutting down"
    if not client.ready.is_set():
        return False, "model is not loaded yet"
    return True, ""


class _HealthHandler(RequestHandler):
    def initialize(self, client: EngineClient,
                   live_threshold_s: float = DEFAULT_LIVE_THRESHOLD_S) -> None:
        self.client = client
        self.live_threshold_s = live_threshold_s

    def check(self) -> tuple[bool, str]:
        raise NotImplementedError

    def _answer(self, body: bool) -> None:
        ok, why = self.check()
        payload: dict[str, Any] = ({"status": "ok"} if ok
                                   else {"error_code": 503, "error_msg": why})
        self.set_status(200 if ok else 503)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        # HEAD must carry the status only (probes often use it).
        self.finish(json.dumps(payload) if body else None)

    def get(self) -> None:
        self._answer(body=True)

    def head(self) -> None:
        self._answer(body=False)


class LiveHandler(_HealthHandler):
    def check(self) -> tuple[bool, str]:
        return is_live(self.client, self.live_threshold_s)


class ReadyHandler(_HealthHandler):
    def check(self) -> tuple[bool, str]:
        return is_ready(self.client)


def health_routes(client: EngineClient, live_threshold_s: float = DEFAULT_LIVE_THRESHOLD_S,
                  with_plain_health: bool = False) -> list[tuple[str, type, dict[str, Any]]]:
    """Routes for a tornado Application; `/health` (liveness) is added on the service port."""
    kw = {"client": client, "live_threshold_s": live_threshold_s}
    routes: list[tuple[str, type, dict[str, Any]]] = [
        (r"/v2/health/live", LiveHandler, kw),
        (r"/v2/health/ready", ReadyHandler, kw),
    ]
    if with_plain_health:
        routes.append((r"/health", LiveHandler, kw))
    return routes
