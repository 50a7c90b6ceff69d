"""Issue 17 item 3's figures: the front end in rank 0's IO thread against the front end in HTTP
worker processes, on the same machine, interleaved (A B A B ...) so that load from elsewhere falls
on both sides alike.  Nothing here asserts on time.

    spmd_serve export --demo small --out /tmp/small-tp1 --tp 1
    mkdir /tmp/before && git archive dbbe208 | tar -x -C /tmp/before     # the IO-thread front end
    python benchmarks/frontend_ab.py --model /tmp/small-tp1 --tree before=/tmp/before --tree after=. \\
        [--tree after2=.:PUSH_MODE_HTTP_WORKERS=2] [--rounds 2] [--json out.json]

A tree whose export format differs from --model's gets its own: `--tree before=/tmp/before:MODEL_DIR=/tmp/old`.

Per server (`mpirun -n 1 spmd_serve` with the tree on PYTHONPATH, BATCH_SIZE=32): `spmd_serve
bench` (openai-completions, input 128 / output 64, 32 prompts released at once, concurrency 32:
TTFT, ITL, output tok/s); then, while `--load` native streams keep the engine and the front end
busy, the latency of `GET /v2/health/live` (`--probes` times: an answer that needs no engine, so
it shows how long the front end itself waits) and the cancel latency of tests/mpi/test_grpc_mpi.py's
flaky test — a gRPC stream cancelled after 30 frames, and the time until its req_id is accepted
again (`--cancels` times); last, health checks again for `--prefill-s` seconds while prompts of
`--prefill-len` tokens are prefilled one after another (graphs of ~0.5 s that hold rank 0's GIL).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: the Triton helpers


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Server:
    """`mpirun -n 1 spmd_serve` from one source tree, on free ports."""

    def __init__(self, tree: Path, model: str, extra: dict[str, str]) -> None:
        http, grpc, health, metrics, inter = free_ports(5)
        self.http, self.grpc, self.health, self.metrics = http, grpc, health, metrics
        self.env = dict(
            os.environ,
            PYTHONPATH=str(tree),
            OMPI_ALLOW_RUN_AS_ROOT="1",
            OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
            GLOG_minloglevel="2",
            MODEL_DIR=model,
            MP_NUM="1",
            HOST="127.0.0.1",
            SERVICE_HTTP_PORT=str(http),
            SERVICE_GRPC_PORT=str(grpc),
            HEALTH_HTTP_PORT=str(health),
            METRICS_HTTP_PORT=str(metrics),
            INTER_PROC_PORT=str(inter),
            BATCH_SIZE="32",
            MAX_SEQ_LEN="1024",
            MAX_DEC_LEN="2048",
            BLOCK_BS="40",
        )
        self.env.update(extra)  # a tree's own settings win (e.g. its MODEL_DIR: exports are per version)
        self.log = tempfile.NamedTemporaryFile("wb", prefix="frontend_ab_", suffix=".log", delete=False)
        cmd = ["mpirun", "-n", "1", "--bind-to", "none", sys.executable, "-m", "spmd_serve"]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start; see {self.log.name}")
            time.sleep(0.5)

    def _ready(self) -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{self.health}/v2/health/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        rank0 = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        for pid in rank0:
            os.kill(int(pid), 15)  # rank 0 drains and stops everything
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def bench(server: Server, model: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "spmd_serve", "bench", "--backend", "openai-completions"]
    cmd += ["--base-url", f"http://127.0.0.1:{server.http}", "--tokenizer", model, "--input-len", "128"]
    cmd += ["--output-len", "64", "--num-prompts", "32", "--concurrency", "32", "--warmup", "1"]
    cmd += ["--metrics-url", f"http://127.0.0.1:{server.metrics}/metrics", "--json", str(out), "--no-progress"]
    subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True, capture_output=True, timeout=900)
    return json.loads(out.read_text())["runs"][0]


def background_streams(server: Server, n: int, stop: threading.Event) -> list[threading.Thread]:
    """n native streams that run until `stop` (then their connections close: aborted)."""

    def one(i: int) -> None:
        body = {"text": f"Tell me story number {i}.", "max_dec_len": 2000, "min_dec_len": 2000, "stream": True}
        url = f"http://127.0.0.1:{server.http}/v1/chat/completions"
        with requests.post(url, json=body, stream=True, timeout=300) as res:
            for _ in res.iter_lines():
                if stop.is_set():
                    return

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def probe_latencies(server: Server, n: int, seconds: float = float("inf")) -> list[float]:
    """Seconds per health check (n of them, or as many as `seconds` allow), 20 ms apart."""
    out: list[float] = []
    end = time.monotonic() + seconds
    while len(out) < n and time.monotonic() < end:
        t0 = time.monotonic()
        requests.get(f"http://127.0.0.1:{server.health}/v2/health/live", timeout=30)
        out.append(time.monotonic() - t0)
        time.sleep(0.02)
    return out


def during_prefills(server: Server, prompt_len: int, seconds: float) -> tuple[list[float], list[float]]:
    """(health check seconds, long-prompt request seconds) while long prompts run back to back."""
    stop, done = threading.Event(), []

    def prefills() -> None:
        k = 0
        while not stop.is_set():
            ids = [5 + (7 * i + k) % 900 for i in range(prompt_len)]
            t0 = time.monotonic()
            url = f"http://127.0.0.1:{server.http}/v1/chat/completions"
            requests.post(url, json={"input_ids": ids, "max_dec_len": 1}, timeout=300).raise_for_status()
            done.append(time.monotonic() - t0)
            k += 1

    thread = threading.Thread(target=prefills, daemon=True)
    thread.start()
    time.sleep(2)
    probes = probe_latencies(server, 1 << 30, seconds)
    stop.set()
    thread.join(300)
    return probes, done


def cancel_latencies(server: Server, n: int) -> list[float]:
    """tests/mpi/test_grpc_mpi.py's scenario, n times: seconds from the cancel to the id's reuse."""
    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException

    from tests.support.triton_helpers import Stream, in_tensor

    out = []
    triton = tg.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    for k in range(n):
        rid = f"cancel-{k}"
        stream = Stream(triton)
        stream.send({"text": "go on", "req_id": rid, "max_dec_len": 1000, "min_dec_len": 1000})
        for _ in range(30):
            stream.got.get(timeout=120)
        cancelled = time.monotonic()
        triton.stop_stream(cancel_requests=True)
        while True:
            try:
                triton.infer("model", in_tensor({"text": "x", "req_id": rid, "max_dec_len": 1}))
                break
            except InferenceServerException as e:
                assert e.status() == "StatusCode.ALREADY_EXISTS", e
                time.sleep(0.001)
        out.append(time.monotonic() - cancelled)
    triton.close()
    return out


def measure(name: str, tree: Path, extra: dict[str, str], args: argparse.Namespace, out_dir: Path) -> dict:
    server = Server(tree, args.model, extra)
    try:
        run = bench(server, args.model, out_dir / f"{name}.json")
        stop = threading.Event()
        threads = background_streams(server, args.load, stop)
        time.sleep(3)  # the load's prefills are done: decoding at batch load + 1
        probes = probe_latencies(server, args.probes)
        cancels = cancel_latencies(server, args.cancels)
        stop.set()
        for t in threads:
            t.join(30)
        prefill_probes, prefills = during_prefills(server, args.prefill_len, args.prefill_s)
    finally:
        server.stop()
    return {
        "tree": name,
        "bench": run,
        "probe_s": probes,
        "cancel_s": cancels,
        "prefill_probe_s": prefill_probes,
        "prefill_s": prefills,
    }


def ms(values: list[float]) -> str:
    """median / p99 / max, in ms"""
    v = sorted(values)
    return f"{1e3 * statistics.median(v):.1f} / {1e3 * v[int(0.99 * (len(v) - 1))]:.1f} / {1e3 * v[-1]:.0f}"


HEADER = (
    "| front end | TTFT ms mean / median / p99 | ITL ms mean / median / p99 | out tok/s "
    "| health ms (decode load) | cancel ms | health ms (long prefills) | long prompt ms |"
)


def row(r: dict) -> str:
    b = r["bench"]
    ttft, itl = b["ttft_ms"], b["itl_ms"]
    return (
        f"| {r['tree']} | {ttft['mean']:.0f} / {ttft['median']:.0f} / {ttft['p99']:.0f} "
        f"| {itl['mean']:.1f} / {itl['median']:.1f} / {itl['p99']:.0f} | {b['output_throughput']:.1f} "
        f"| {ms(r['probe_s'])} | {ms(r['cancel_s'])} | {ms(r['prefill_probe_s'])} "
        f"| {1e3 * statistics.median(r['prefill_s']):.0f} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--tree", action="append", required=True, help="NAME=PATH[:VAR=VALUE,...]")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--load", type=int, default=16, help="native streams running during the cancels")
    p.add_argument("--cancels", type=int, default=10)
    p.add_argument("--probes", type=int, default=200)
    p.add_argument("--prefill-len", type=int, default=1000, help="prompt tokens of the long prompts")
    p.add_argument("--prefill-s", type=float, default=30.0)
    p.add_argument("--json")
    args = p.parse_args()
    trees = []
    for spec in args.tree:
        name, _, rest = spec.partition("=")
        path, _, env = rest.partition(":")
        trees.append((name, Path(path).resolve(), dict(kv.split("=", 1) for kv in env.split(",") if kv)))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for name, path, extra in trees:
                results.append({"round": rnd, **measure(name, path, extra, args, Path(tmp))})
                print(row(results[-1]), flush=True)
    print(HEADER)
    for r in results:
        print(row(r))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
