"""`GET /metrics` on METRICS_HTTP_PORT (CONTRACT.md §6): the engine's Prometheus registry as text.

This module owns `MetricsService`, an `IOService` run on rank 0's IO loop.  It only renders
(`prometheus_client` encoders, with the content type the scraper asked for: the classic text
format by default, OpenMetrics when Prometheus negotiates it); the engine thread does all the
recording (`spmd_serve.engine.metrics`).  Like health, it never asks for the API key: scrapers
and dashboards read it unauthenticated.  Every other path answers 404.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from tornado.httpserver import HTTPServer
from tornado.web import Application, RequestHandler

from spmd_serve.frontend.native.handler import NotFoundHandler
from spmd_serve.frontend.server.app import listen_http

log = logging.getLogger(__name__)


class MetricsHandler(RequestHandler):
    def initialize(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def get(self) -> None:
        encode, content_type = choose_encoder(self.request.headers.get("Accept", ""))
        self.set_header("Content-Type", content_type)
        self.finish(encode(self.registry))


def make_metrics_app(registry: CollectorRegistry) -> Application:
    return Application([(r"/metrics", MetricsHandler, {"registry": registry})], default_handler_class=NotFoundHandler)


class MetricsService:
    """Serves `registry` at http://host:port/metrics while the IO loop runs."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry, self.host, self.port = registry, host, port
        self._server: HTTPServer | None = None

    async def start(self) -> None:
        # Raises OSError naming METRICS_HTTP_PORT; the server turns it into its one-line error.
        self._server, self.port = listen_http(
            make_metrics_app(self.registry), self.host, self.port, "METRICS_HTTP_PORT"
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
