"""Cross-origin access to the service port, as vLLM and SGLang serve it by default (Starlette's
CORSMiddleware with every origin, method and header allowed, no credentials): a browser page
may call the native and OpenAI APIs and read the answers.

* `CorsHeaders`, an output transform: every response to a request that names an `Origin` gets
  `Access-Control-Allow-Origin: *`, errors and streams included.
* `CorsApplication` answers every OPTIONS request itself, whatever the path (the middleware too
  sits in front of the routes): a browser's preflight gets 204 with the methods and the headers it
  asked for, so that `Authorization` and `Content-Type: application/json` may follow; the handlers
  never see an OPTIONS request, which before answered 405.

Credentials (cookies) are not allowed: the API key travels in `Authorization`, which a page must
hold itself, so a page of another origin learns nothing it could not already ask for.
"""

from __future__ import annotations

from typing import Any

from tornado.httputil import HTTPHeaders, HTTPServerRequest
from tornado.web import Application, OutputTransform, RequestHandler

ALLOWED_METHODS = "GET, POST, OPTIONS"
MAX_AGE_S = 600  # how long a browser may reuse a preflight's answer (Starlette's default)


class CorsHeaders(OutputTransform):
    """Adds `Access-Control-Allow-Origin: *` to the response of a request with an `Origin`."""

    def __init__(self, request: HTTPServerRequest) -> None:
        super().__init__(request)
        self.cross_origin = "Origin" in request.headers

    def transform_first_chunk(
        self, status_code: int, headers: HTTPHeaders, chunk: bytes, finishing: bool
    ) -> tuple[int, HTTPHeaders, bytes]:
        if self.cross_origin:
            headers["Access-Control-Allow-Origin"] = "*"
        return status_code, headers, chunk


class PreflightHandler(RequestHandler):
    """An OPTIONS request on any path: 204, the methods, and (for a preflight) the headers asked for."""

    def options(self, *args: Any) -> None:
        self.set_status(204)
        self.set_header("Allow", ALLOWED_METHODS)
        if "Access-Control-Request-Method" in self.request.headers:
            self.set_header("Access-Control-Allow-Methods", ALLOWED_METHODS)
            asked = self.request.headers.get("Access-Control-Request-Headers", "")
            if asked:
                self.set_header("Access-Control-Allow-Headers", asked)
            self.set_header("Access-Control-Max-Age", str(MAX_AGE_S))
        self.finish()


class CorsApplication(Application):
    """A tornado Application whose OPTIONS requests go to `PreflightHandler` and whose responses
    pass through `CorsHeaders`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_transform(CorsHeaders)

    def find_handler(self, request: HTTPServerRequest, **kwargs: Any) -> Any:
        if request.method == "OPTIONS":
            return self.get_handler_delegate(request, PreflightHandler)
        return super().find_handler(request, **kwargs)
