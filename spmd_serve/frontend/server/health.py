"""Health endpoints (CONTRACT.md §6): `/v2/health/live`, `/v2/health/ready` and, on the service
port, `/health`, answering from the rules in `frontend.common.liveness`.

Both answer 200 with a small JSON body when true and 503 with the native error shape otherwise.
They never require the API key: load balancers and `start_server` poll them unauthenticated.
"""

from __future__ import annotations

import json
from typing import Any

from tornado.web import RequestHandler

from spmd_serve.engine.client import EngineClient
from spmd_serve.frontend.common.liveness import DEFAULT_LIVE_THRESHOLD_S, is_live, is_ready


class _HealthHandler(RequestHandler):
    def initialize(self, client: EngineClient, live_threshold_s: float = DEFAULT_LIVE_THRESHOLD_S) -> None:
        self.client = client
        self.live_threshold_s = live_threshold_s

    def check(self) -> tuple[bool, str]:
        raise NotImplementedError

    def _answer(self, body: bool) -> None:
        ok, why = self.check()
        payload: dict[str, Any] = {"status": "ok"} if ok else {"error_code": 503, "error_msg": why}
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


def health_routes(
    client: EngineClient, live_threshold_s: float = DEFAULT_LIVE_THRESHOLD_S, with_plain_health: bool = False
) -> list[tuple[str, type, dict[str, Any]]]:
    """Routes for a tornado Application; `/health` (liveness) is added on the service port."""
    kw = {"client": client, "live_threshold_s": live_threshold_s}
    routes: list[tuple[str, type, dict[str, Any]]] = [
        (r"/v2/health/live", LiveHandler, kw),
        (r"/v2/health/ready", ReadyHandler, kw),
    ]
    if with_plain_health:
        routes.append((r"/health", LiveHandler, kw))
    return routes
