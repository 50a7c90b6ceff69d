"""`GET /metrics` on METRICS_HTTP_PORT (CONTRACT.md §6): the engine's Prometheus registry as text.

This module owns `MetricsService`, an `IOService` run on the front end's IO loop.  It only
serves: the text comes from a registry in this process (`engine.metrics.render`, with the content
type the scraper asked for: the classic text format by default, OpenMetrics when Prometheus
negotiates it), or, in an HTTP worker process, from rank 0's engine, which renders its registry
between two steps (`RemoteEngineClient.fetch_metrics`; 503 when the engine does not answer).  The
engine thread does all the recording (`spmd_serve.engine.metrics`).  Like health, it never asks
for the API key: scrapers and dashboards read it unauthenticated.  Every other path answers 404.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry
from tornado.httpserver import HTTPServer
from tornado.web import Application, RequestHandler

from spmd_serve.engine.client import NotReadyError
from spmd_serve.engine.metrics import render
from spmd_serve.frontend.native.handler import NotFoundHandler
from spmd_serve.frontend.server.app import listen_http

log = logging.getLogger(__name__)
Fetch = Callable[[str], Awaitable[tuple[bytes, str]]]  # Accept header -> (body, content type)


class MetricsHandler(RequestHandler):
    def initialize(self, fetch: Fetch) -> None:
        self.fetch = fetch

    async def get(self) -> None:
        try:
            body, content_type = await self.fetch(self.request.headers.get("Accept", ""))
        except (NotReadyError, asyncio.TimeoutError) as e:
            self.set_status(503)
            self.set_header("Content-Type", "application/json; charset=utf-8")
            why = str(e) or "the engine did not answer in time"
            self.finish(json.dumps({"error_code": 503, "error_msg": f"metrics unavailable: {why}"}))
            return
        self.set_header("Content-Type", content_type)
        self.finish(body)


def make_metrics_app(fetch: Fetch) -> Application:
    return Application([(r"/metrics", MetricsHandler, {"fetch": fetch})], default_handler_class=NotFoundHandler)


def _local(registry: CollectorRegistry) -> Fetch:
    async def fetch(accept: str) -> tuple[bytes, str]:
        return render(registry, accept)

    return fetch


class MetricsService:
    """Serves a registry of this process, or what `fetch` gets, at http://host:port/metrics
    while the IO loop runs."""

    def __init__(self, source: CollectorRegistry | Fetch, host: str, port: int, *, reuse_port: bool = False) -> None:
        self.fetch = _local(source) if isinstance(source, CollectorRegistry) else source
        self.host, self.port, self.reuse_port = host, port, reuse_port
        self._server: HTTPServer | None = None

    async def start(self) -> None:
        # Raises OSError naming METRICS_HTTP_PORT; the server turns it into its one-line error.
        self._server, self.port = listen_http(
            make_metrics_app(self.fetch), self.host, self.port, "METRICS_HTTP_PORT", reuse_port=self.reuse_port
        )

    async def stop(self, grace: float) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.stop()
        try:  # a scrape is short; one stuck past the grace period is simply dropped
            await asyncio.wait_for(server.close_all_connections(), grace)
        except asyncio.TimeoutError:
            log.warning("metrics connections did not close within %g s", grace)
