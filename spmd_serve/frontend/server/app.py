"""An HTTP worker's IO thread: the Tornado applications (service and health) and `IOServer`, which
runs them on a fresh asyncio loop in a thread of its own.

This thread owns every public socket of its process.  It meets the engine only in the
EngineClient: in a worker process the `RemoteEngineClient` (engine/remote_client.py), whose link
to rank 0 is one of this loop's services; in the tests' in-process mode an `EngineClient` whose
outputs arrive through `loop.call_soon_threadsafe` once `attach_loop` has been called.
This is where the protocols are wired together (the native handler's OpenAI chat delegate); the
settings are `server.settings.IOSettings`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from typing import Any, Protocol

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application

from spmd_serve.engine.client import EngineClient
from spmd_serve.frontend.anthropic.handler import messages_routes
from spmd_serve.frontend.native.handler import NativeChatHandler, NotFoundHandler
from spmd_serve.frontend.openai.handlers import OpenAIServing, openai_routes, send_openai_error
from spmd_serve.frontend.openai.responses import responses_routes
from spmd_serve.frontend.openai.tokenize import tokenize_routes
from spmd_serve.frontend.server.admin import admin_routes
from spmd_serve.frontend.server.cors import CorsApplication
from spmd_serve.frontend.server.health import health_routes
from spmd_serve.frontend.server.openapi import openapi_route
from spmd_serve.frontend.server.settings import IOSettings
from spmd_serve.frontend.sglang.handler import generate_routes
from spmd_serve.frontend.sglang.info import info_routes

log = logging.getLogger(__name__)


class ServiceNotFound(NotFoundHandler):
    """The service port's default handler: a path under /v1/ is an OpenAI client's (the native API
    has only /v1/chat/completions), so it gets the OpenAI error body, whose message the `openai`
    client shows (it showed a bare "Error code: 404" for the native body); other paths the native one."""

    def prepare(self) -> None:
        method, path = self.request.method, self.request.path
        if not path.startswith("/v1/"):
            return super().prepare()
        send_openai_error(
            self,
            404,
            f"no such endpoint: {method} {path}; this server's OpenAI API is POST /v1/completions, "
            "POST /v1/chat/completions, GET /v1/models and GET /v1/models/<name>",
        )


def make_service_app(
    client: EngineClient, tokenizer: Any, settings: IOSettings, *, extra_handlers: list[tuple] | None = None
) -> Application:
    """The service port: native API, OpenAI API, health aliases, and `extra_handlers`; open to
    pages of any origin (server/cors.py)."""
    key = settings.api_key or None
    openai = OpenAIServing(client, tokenizer, settings.limits, settings.model_names, key)

    async def openai_chat(handler: Any, body: dict[str, Any]) -> None:
        await openai.handle(handler, "chat", body)

    native = {
        "client": client,
        "tokenizer": tokenizer,
        "limits": settings.limits,
        "max_body_size": settings.max_body_size,
        "api_key": key,
        "disable_streaming": bool(settings.disable_streaming),
        "openai_chat": openai_chat,
    }
    routes: list[tuple] = [(r"/v1/chat/completions", NativeChatHandler, native)]
    routes += openai_routes(openai, settings.max_body_size) + [openapi_route(settings)]
    routes += tokenize_routes(openai, settings.max_body_size) + responses_routes(openai, settings.max_body_size)
    routes += messages_routes(openai, settings.max_body_size) + generate_routes(openai, settings.max_body_size)
    routes += info_routes(openai, settings.live_threshold_s) + admin_routes(client, settings.max_body_size, key)
    routes += list(extra_handlers or [])
    routes += health_routes(client, settings.live_threshold_s, with_plain_health=True)
    return CorsApplication(routes, default_handler_class=ServiceNotFound)


def make_health_app(client: EngineClient, settings: IOSettings) -> Application:
    return Application(health_routes(client, settings.live_threshold_s), default_handler_class=NotFoundHandler)


def listen_http(
    app: Application, host: str, port: int, what: str, *, reuse_port: bool = False, **server_kw: Any
) -> tuple[HTTPServer, int]:
    """Serve `app` on host:port from the running loop; returns (server, bound port).  A port
    that cannot be bound raises OSError naming it and its variable (`what`), for ConfigError.
    `reuse_port`: several HTTP worker processes listen on the port (SO_REUSEPORT)."""
    try:
        socks = bind_sockets(port, host, reuse_port=reuse_port)
    except OSError as e:
        raise OSError(e.errno, f"cannot listen on {host}:{port} ({what}): {e.strerror or e}") from None
    server = HTTPServer(app, **server_kw)
    server.add_sockets(socks)
    return server, socks[0].getsockname()[1]


class IOService(Protocol):
    """Something else served from the IO loop (gRPC, metrics): bound in `start`, which raises
    OSError naming its port when it cannot listen; `stop` closes it within `grace` seconds."""

    async def start(self) -> None: ...

    async def stop(self, grace: float) -> None: ...


class IOServer:
    """Runs both apps on their own loop in a daemon thread.  `start()` returns once listening."""

    def __init__(
        self,
        client: EngineClient,
        tokenizer: Any,
        settings: IOSettings | None = None,
        *,
        extra_handlers: list[tuple] | None = None,
        services: list[IOService] | None = None,
        **overrides: Any,
    ) -> None:
        self.client, self.tokenizer = client, tokenizer
        self.services: list[IOService] = list(services or [])
        self.settings = dataclasses.replace(settings or IOSettings(), **overrides)
        self._extra = extra_handlers
        self.loop: asyncio.AbstractEventLoop | None = None
        self.http_port: int | None = None  # bound ports (useful when 0 was asked for)
        self.health_port: int | None = None
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None

    def start(self, timeout: float = 10.0) -> None:
        """Start the thread; raise (naming the port) if a port cannot be bound."""
        if self._thread is not None:
            raise RuntimeError("IOServer already started")
        self._thread = threading.Thread(target=self._main, name="spmd-io", daemon=True)
        self._thread.start()
        if not self._listening.wait(timeout):
            self.stop()
            raise TimeoutError(f"IO thread did not start listening within {timeout:g} s")
        if self._error is not None:
            self._thread.join(timeout)
            raise self._error

    @property
    def running(self) -> bool:
        """The IO thread is serving (False once it stopped or failed)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        """Close listeners and open connections (in-flight requests are aborted), join."""
        loop, stop = self.loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop closed meanwhile: nothing left to stop
                pass
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("IO thread did not stop within %g s", timeout)

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as e:  # surface it to start() rather than dying silently
            self._error = self._error or e
            log.exception("IO thread failed")
        finally:
            self._listening.set()
            loop.close()

    def _listen(self, app: Application, port: int, what: str) -> tuple[HTTPServer, int]:
        # max_body_size bounds every handler; the native one lifts it per request to send 413.
        s = self.settings
        return listen_http(app, s.host, port, what, reuse_port=s.reuse_port, max_body_size=s.max_body_size)

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self.client.attach_loop(asyncio.get_running_loop())
        servers: list[HTTPServer] = []
        started: list[IOService] = []
        s = self.settings
        try:
            if s.http_port != -1:
                app = make_service_app(self.client, self.tokenizer, s, extra_handlers=self._extra)
                server, self.http_port = self._listen(app, s.http_port, "SERVICE_HTTP_PORT")
                servers.append(server)
            if s.health_port != -1:
                server, self.health_port = self._listen(
                    make_health_app(self.client, s), s.health_port, "HEALTH_HTTP_PORT"
                )
                servers.append(server)
            for service in self.services:
                await service.start()
                started.append(service)
        except OSError as e:
            self._error = e
            for server in servers:
                server.stop()
            for service in started:
                await service.stop(0)
            return
        self._listening.set()
        await self._stop.wait()
        await self._shutdown(servers)

    async def _shutdown(self, servers: list[HTTPServer], grace: float = 2.0) -> None:
        for server in servers:
            server.stop()  # no new connections
        for service in self.services:
            try:
                await service.stop(grace)
            except Exception:  # one service failing to stop must not block the rest
                log.exception("stopping %s failed", type(service).__name__)
        try:  # closing a connection aborts its request
            await asyncio.wait_for(asyncio.gather(*(srv.close_all_connections() for srv in servers)), grace)
        except asyncio.TimeoutError:
            log.warning("open connections did not close within %g s", grace)
        # Outputs published from now on must not target a loop that is about to close.
        self.client.attach_loop(None)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks, timeout=grace) if tasks else None
