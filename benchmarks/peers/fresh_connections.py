"""Run a command-line entry point with aiohttp opening a fresh connection per request.

Why: llama-server (llama.cpp 0c1e57098, its vendored cpp-httplib) closes the TCP connection after
every *streamed* response although it answered `Keep-Alive: timeout=5, max=100`; a client that
reuses the connection for its next request gets "Server disconnected" (every second request on
one connection, measured).  `spmd_serve bench` keeps connections alive (one aiohttp connector
for the run), so against llama-server about a quarter of its requests failed.  vLLM's serving
benchmark opens a session per request; this shim gives `spmd_serve bench` the same behaviour
(`TCPConnector(force_close=True)`) for *both* servers of the comparison, without changing it.

    python -m benchmarks.peers.fresh_connections SCRIPT_OR_MODULE bench ARGS...

SCRIPT_OR_MODULE: a console script path (e.g. .venv/bin/spmd_serve) or `-m MODULE`.
"""
from __future__ import annotations

import runpy
import sys

import aiohttp


def force_close_by_default() -> None:
    """Every TCPConnector made from now on closes its connection after each response."""
    original = aiohttp.TCPConnector.__init__

    def init(self, *args, **kwargs):
        kwargs.setdefault("force_close", True)
        original(self, *args, **kwargs)

    aiohttp.TCPConnector.__init__ = init


def main(argv: list[str]) -> None:
    force_close_by_default()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
