"""`python -m spmd_serve.http_worker`: one HTTP worker process of the master node.

Rank 0 starts PUSH_MODE_HTTP_WORKERS of these (engine/http_workers.py) and writes each one's setup
as JSON on its stdin.  A worker serves the public ports — native and OpenAI HTTP, gRPC, health
and /metrics, every port shared by all workers (SO_REUSEPORT) — with its own tokenizer, chat
templates and detokenizers, and reaches the engine through a `RemoteEngineClient` connected to
rank 0's INTER_PROC_PORT.  Its PeerWatch watches the ranks on this node.  It never imports MPI or
Paddle's inference: the GIL it runs under is its own, so a step never delays a frame or a cancel.

It reports its start (ports bound, tokenizer loaded) or the one-line reason it could not start in
its hello, and it exits when rank 0 says `bye` (after the open requests have answered) or when the
connection to rank 0 ends (after failing every request in flight with 503).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import socket
import sys
from typing import Any


def _setup_logging(worker: int) -> None:
    logging.basicConfig(
        level=os.environ.get("SPMD_LOG_LEVEL", "INFO"),
        stream=sys.stderr,
        format=f"%(asctime)s http{worker} %(levelname)s %(name)s: %(message)s",
    )


WARM_UP_TEXT = "Warm-up request: hello world."


def tokenizer_facts(tokenizer: Any) -> dict[str, Any]:
    """What rank 0's engine needs from the tokenizer, sent in the hello so that rank 0 never loads
    one (a PaddleNLP import: seconds and ~200 MB in the engine's process): the EOS ids generation
    stops on and the warm-up prompt's ids."""
    warm_up = tokenizer.encode(WARM_UP_TEXT) or [tokenizer.bos_token_id or 1]
    return {"eos": [int(i) for i in tokenizer.eos_token_ids], "warm_up": [int(i) for i in warm_up]}


def _serve(setup: dict[str, Any], sock: socket.socket) -> tuple[Any, Any]:
    """Start every service; returns (io server, engine link).  OSError/ValueError name a problem."""
    from spmd_serve.engine.remote_client import EngineLink, RemoteEngineClient
    from spmd_serve.frontend.server.app import IOServer
    from spmd_serve.frontend.server.metrics_service import MetricsService
    from spmd_serve.frontend.server.peer_watch import PeerWatch
    from spmd_serve.frontend.server.settings import IOSettings
    from spmd_serve.frontend.text import paddlenlp_import
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

    paddlenlp_import.prefer_light()  # this process only tokenizes: PaddleNLP's tokenizers alone (~4 s sooner)
    try:
        tokenizer = ServingTokenizer.from_model_dir(setup["model_dir"], setup["use_hf_tokenizer"])
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load the tokenizer of {setup['model_dir']}: {e}") from None
    raw = setup["settings"]
    settings = IOSettings(**{**raw, "model_names": tuple(raw["model_names"]), "reuse_port": True})
    client = RemoteEngineClient(setup["capacity"], setup.get("state"))
    peers = PeerWatch(client)
    client.on_peers = peers.watch
    services: list[Any] = [peers]
    if setup["metrics_port"] != -1:
        services.append(MetricsService(client.fetch_metrics, settings.host, setup["metrics_port"], reuse_port=True))
    if setup["grpc_port"] != -1:
        from spmd_serve.frontend.triton.service import GrpcService

        services.append(GrpcService.from_settings(client, tokenizer, settings, setup["grpc_port"]))
    link = EngineLink(client, sock, setup["worker"], setup["token"], tokenizer_facts(tokenizer))
    services.append(link)  # last: its hello tells rank 0 that every port is bound
    io = IOServer(client, tokenizer, settings, services=services)
    io.start(timeout=60)
    return io, link


def main() -> int:
    from spmd_serve.engine.remote_client import report_start_failure

    setup = json.loads(sys.stdin.buffer.read())  # from rank 0, never from the network
    worker, token = int(setup["worker"]), str(setup["token"])
    _setup_logging(worker)
    from spmd_serve.worker.malloc import install_heap_report

    install_heap_report(f"http{worker}")  # `kill -USR2 <pid>`: heap and Python objects (benchmarks/soak.py)
    # ^C in a terminal reaches the whole process group: rank 0 drains and then says bye.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log = logging.getLogger("spmd_serve.http_worker")
    try:
        sock = socket.create_connection(("127.0.0.1", setup["port"]), timeout=30)
    except OSError as e:  # started just as rank 0 stopped: nothing to serve
        log.warning("cannot reach rank 0 on INTER_PROC_PORT %s (%s): exiting", setup["port"], e)
        return 1
    try:
        io, link = _serve(setup, sock)
    except (OSError, ValueError, TimeoutError) as e:
        report_start_failure(sock, worker, token, str(e))
        return 2
    gc.freeze()  # start-up's objects out of full collections' walks (as on the ranks: server.py)
    log.info("serving (pid %d)", os.getpid())
    while not link.done.wait(1.0):
        if not io.running:  # the IO thread failed (logged): exit, and rank 0 starts another worker
            return 1
    io.stop()
    return 0 if link.stopped_cleanly else 1


if __name__ == "__main__":
    from spmd_serve.fast_exit import flush_and_exit

    flush_and_exit(main())  # rank 0 waits for its workers to exit: no seconds of Paddle teardown
