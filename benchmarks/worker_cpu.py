"""The HTTP worker's CPU per streamed token, without a model: a real `python -m spmd_serve.http_worker`
process (the model directory's tokenizer, its detokenizers) behind rank 0's real `FrontendHub`,
fed by the test suite's FakeEngine (one token per stream every `--step-ms`), and `--concurrency`
clients that read their streams from raw sockets, so that the clients cost the machine little.

    python benchmarks/worker_cpu.py MODEL_DIR [--concurrency 1] [--requests 16] [--output-len 128]
        [--step-ms 4] [--api openai|native]

Prints one JSON line: the worker's user and system CPU µs per token over the measured requests
(after one warm-up request per client).  On two cores a token's front-end CPU is taken from a rank
(RESULTS.md "Session 51"), so this is the number a cheaper front end has to lower.  The worker
imports spmd_serve from the working directory first (`python -m`): run it from the tree to measure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: the fake engine

from spmd_serve.config import ServeConfig  # noqa: E402
from spmd_serve.engine.frontend_hub import FrontendHub  # noqa: E402
from spmd_serve.engine.http_workers import HttpWorkers  # noqa: E402
from spmd_serve.rank0_frontend import worker_setup  # noqa: E402
from tests.support.fakes import FakeEngine  # noqa: E402
from tests.support.server_process import free_ports  # noqa: E402

# One client: `requests` streamed requests in turn, each read to its last chunk; prints the bytes.
CLIENT = r"""
import json, socket, sys
port, n, api, k = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
prompt = "The quick brown fox jumps over the lazy dog. " * 12
if api == "openai":
    body, path = {"model": "default", "prompt": prompt, "max_tokens": n, "min_tokens": n, "ignore_eos": True,
                  "temperature": 0, "stream": True}, b"/v1/completions"
else:
    body, path = {"text": prompt, "max_dec_len": n, "min_dec_len": n, "stream": True}, b"/v1/chat/completions"
data = json.dumps(body).encode()
head = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
total = 0
for _ in range(k):
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(head % (path, len(data)) + data)
        tail = b""
        while not tail.endswith(b"0\r\n\r\n"):  # the chunked body's end
            got = s.recv(1 << 16)
            if not got:
                break
            total, tail = total + len(got), (tail + got)[-8:]
print(total)
"""


def start_worker(model_dir: str, hub: FrontendHub) -> tuple[HttpWorkers, int]:
    """One HTTP worker connected to `hub`, set up as rank 0 sets up its workers (`worker_setup`);
    returns it and its 127.0.0.1 port (OpenAI, model "default", and native)."""
    http, health, metrics = free_ports(3)
    cfg = ServeConfig(
        model_dir=model_dir, host="127.0.0.1", http_port=http, health_port=health, metrics_port=metrics, grpc_port=-1
    )
    setup = worker_setup(cfg, cfg.max_seq_len + cfg.max_dec_len, hub.capacity, hub)
    workers = HttpWorkers(1, setup, dict(os.environ))
    workers.start()
    hub.wait_workers(1, 120, workers.exited)
    return workers, http


def run_clients(port: int, n: int, api: str, k: int, concurrency: int) -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", CLIENT, str(port), str(n), api, str(k)], stdout=subprocess.PIPE)
        for _ in range(concurrency)
    ]
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0 or int(out) == 0:
            raise RuntimeError(f"a client failed (exit {p.returncode}, {out!r})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", help="a model directory (its tokenizer is the worker's)")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=16, help="measured requests per client")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--step-ms", type=float, default=4.0, help="the fake engine's step")
    ap.add_argument("--api", choices=("openai", "native"), default="openai")
    args = ap.parse_args()
    hub = FrontendHub(0, max(64, 2 * args.concurrency))
    engine = FakeEngine(hub, args.step_ms / 1e3).start(ready=False)
    workers, http = start_worker(args.model_dir, hub)
    try:
        hub.ready.set()
        hub.wake()
        time.sleep(0.5)  # the state message reaches the worker
        run_clients(http, 8, args.api, 1, args.concurrency)  # warm-up
        proc = psutil.Process(workers.procs[0].pid)
        before, t0 = proc.cpu_times(), time.perf_counter()
        run_clients(http, args.output_len, args.api, args.requests, args.concurrency)
        wall, after = time.perf_counter() - t0, proc.cpu_times()
        tokens = args.concurrency * args.requests * args.output_len
        user, system = after.user - before.user, after.system - before.system
        result = {**vars(args), "tokens": tokens, "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 1)}
        result |= {"worker_user_us_per_token": round(1e6 * user / tokens, 1)}
        result |= {"worker_system_us_per_token": round(1e6 * system / tokens, 1)}
        result |= {"worker_us_per_token": round(1e6 * (user + system) / tokens, 1)}
        print(json.dumps(result))
    finally:
        engine.stop()  # first: the hub is the engine thread's until then
        workers.stopping = True
        hub.close()
        workers.stop()


if __name__ == "__main__":
    main()
