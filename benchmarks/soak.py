"""Memory soak (issue 17 item 6): a mixed load against `mpirun -n 2 spmd_serve` on loopback for
`--minutes`, sampling every rank's RSS, its malloc heap and the free KV blocks; prints the curve.

    python benchmarks/soak.py [--minutes 30] [--clients 12] [--sample-s 30] [--model-dir DIR] [--json OUT]
                              [--env NAME=VALUE ...]

MODEL_DIR defaults to the trained demo model exported for two ranks (`ensure_demo_model`).  Each
client loops over a random mix: native streams read to the end, native and OpenAI streams dropped
after a few frames (the client closes the socket), native and OpenAI requests without streaming,
and junk bodies (bad JSON, wrong types, out-of-range numbers, unknown fields: each must be a 4xx).

Every `--sample-s` the soak reads the `inference_server_metrics` block gauges from /metrics and, for
each rank and HTTP worker, its VmRSS from /proc and its heap: `kill -USR2` makes the process print
`heap-report {json}` (worker/malloc.py) — `in_use` (what C/C++ code holds) and `py_blocks`
(Python's live small objects) grow with a leak, `free_held` (freed pages glibc keeps, up to
MALLOC_KEEP_BYTES per arena) is retention.  Columns: MB, and thousands of Python blocks.  At the end
it waits for the engine to go idle and checks every KV block is free (exit 1 otherwise, or on a
failed request).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root: tests.support

from tests.support.metrics_scrape import Samples  # noqa: E402
from tests.support.server_process import ServerProcess, rank_pid  # noqa: E402

WORDS = "the a river city light story long night small house over under old new green quiet".split()
JUNK: list[tuple[bytes | dict, str]] = [
    (b"{not json", "native"),
    (b"\xff\xfe\x00garbage", "native"),
    ({"text": 12}, "native"),
    ({"text": "hi", "max_dec_len": -5}, "native"),
    ({"text": "hi", "eos_token_ids": [2**64]}, "native"),
    ({"text": "hi", "temperature": "hot"}, "native"),
    ({"messages": [{"role": "user"}]}, "native"),
    ({"model": "nope", "prompt": "hi"}, "completions"),
    ({"prompt": "hi", "max_tokens": 10**30}, "completions"),
    ({"messages": "hi", "max_tokens": 4}, "chat"),
    ({"prompt": "hi", "logprobs": 10**6}, "completions"),
]
HEAP_REPORT = re.compile(r"heap-report (\{[^{}]*\})")


def rss(pid: int) -> int:
    """VmRSS of `pid` in bytes (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.choice((4, 16, 60, 200, 400))))


class Client(threading.Thread):
    """One client: random requests until `deadline`; counts outcomes in `tally` (shared, locked)."""

    def __init__(self, idx: int, base: str, model: str, deadline: float, tally: Counter, lock: threading.Lock):
        super().__init__(daemon=True, name=f"client{idx}")
        self.rng, self.base, self.model, self.deadline = random.Random(idx), base, model, deadline
        self.tally, self.lock = tally, lock

    def count(self, what: str) -> None:
        with self.lock:
            self.tally[what] += 1

    def run(self) -> None:
        kinds = ["stream", "stream", "drop", "drop", "plain", "openai_stream", "openai_drop", "openai", "junk", "junk"]
        while time.monotonic() < self.deadline:
            kind = self.rng.choice(kinds)
            try:
                self.count(kind if getattr(self, kind)() else f"{kind}_error")
            except requests.RequestException as e:
                self.count(f"{kind}_error")
                print(f"[{self.name}] {kind}: {e}", file=sys.stderr, flush=True)

    def post(self, path: str, body: Any, stream: bool = False) -> requests.Response:
        kw: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
        return requests.post(self.base + path, stream=stream, timeout=300, **kw)

    def native(self, stream: bool) -> dict:
        n = self.rng.randint(4, 256)
        body = {"text": prompt(self.rng), "max_dec_len": n, "stream": stream, "topp": 0.9, "temperature": 0.8}
        return body | ({"min_dec_len": n} if self.rng.random() < 0.5 else {})  # half run to max_dec_len

    def read_lines(self, res: requests.Response, keep: int | None) -> bool:
        """Reads a stream to its end (True if it ended with a final frame) or drops it after `keep` lines."""
        last = b""
        for i, line in enumerate(res.iter_lines()):
            if keep is not None and i >= keep:
                res.close()  # the client goes away mid-stream
                return True
            last = line or last
        return res.status_code == 200 and (b'"is_end": 1' in last or b"[DONE]" in last or b'"is_end":1' in last)

    def stream(self) -> bool:
        return self.read_lines(self.post("/v1/chat/completions", self.native(True), stream=True), None)

    def drop(self) -> bool:
        return self.read_lines(
            self.post("/v1/chat/completions", self.native(True), stream=True), self.rng.randint(1, 4)
        )

    def plain(self) -> bool:
        return self.post("/v1/chat/completions", self.native(False)).status_code == 200

    def openai_body(self, stream: bool) -> dict:
        n = self.rng.randint(4, 128)
        common = {"model": self.model, "max_tokens": n, "stream": stream, "min_tokens": n // 2, "ignore_eos": True}
        if self.rng.random() < 0.5:
            return common | {"prompt": prompt(self.rng), "n": 2}
        return common | {
            "messages": [{"role": "user", "content": prompt(self.rng)}],
            "logprobs": True,
            "top_logprobs": 2,
        }

    def openai_path(self, body: dict) -> str:
        return "/v1/completions" if "prompt" in body else "/v1/chat/completions"

    def openai_stream(self, keep: int | None = None) -> bool:
        body = self.openai_body(True)
        return self.read_lines(self.post(self.openai_path(body), body, stream=True), keep)

    def openai_drop(self) -> bool:
        return self.openai_stream(self.rng.randint(1, 4))

    def openai(self) -> bool:
        body = self.openai_body(False)
        return self.post(self.openai_path(body), body).status_code == 200

    def junk(self) -> bool:
        body, kind = self.rng.choice(JUNK)
        if isinstance(body, dict) and kind != "native":
            body = {"model": self.model, **body}
        path = {"native": "/v1/chat/completions", "completions": "/v1/completions", "chat": "/v1/chat/completions"}
        return 400 <= self.post(path[kind], body).status_code < 500


class Sampler:
    """The curve: one row per sample of every process's RSS and heap report (the two ranks and rank 0's
    HTTP worker), and the KV blocks."""

    def __init__(self, srv: ServerProcess, metrics_url: str) -> None:
        self.srv, self.metrics_url, self.rows = srv, metrics_url, []  # type: ignore[var-annotated]
        self.ranks = {f"rank{r}": rank_pid(srv, r) for r in (0, 1)}
        self.log_seen = 0

    def processes(self) -> dict[str, int]:
        """who → pid, the HTTP workers found again each time (rank 0 restarts one that exits)."""
        return self.ranks | {f"http{i}": pid for i, pid in enumerate(sorted(self.srv.http_worker_pids()))}

    def heap(self, procs: dict[str, int]) -> dict[str, dict]:
        """Asks each process for its heap report and reads the answers out of the job's log."""
        for pid in procs.values():
            os.kill(pid, signal.SIGUSR2)
        got: dict[str, dict] = {}
        end = time.monotonic() + 30  # a rank answers between graphs: within a step
        while len(got) < len(procs) and time.monotonic() < end:
            time.sleep(0.2)
            text = self.srv.log()
            for m in HEAP_REPORT.finditer(text, self.log_seen):  # the processes' lines may interleave
                rep = json.loads(m.group(1))
                got[rep["who"]] = rep
            if len(got) == len(procs):
                self.log_seen = len(text)
        return got

    def sample(self, t0: float, tally: Counter) -> dict:
        m = Samples(requests.get(self.metrics_url, timeout=30).text).original()
        procs = self.processes()
        heap = self.heap(procs)
        mb = 1 / 2**20
        row: dict = {
            "t_min": round((time.monotonic() - t0) / 60, 2),
            "requests": sum(v for k, v in tally.items() if not k.endswith("_error")),
            "errors": sum(v for k, v in tally.items() if k.endswith("_error")),
            "load1": round(os.getloadavg()[0], 1),
            "running": int(m["batch_size"]),
            "free_blocks": int(m["block_num"]),
            "total_blocks": int(m["max_block_num"]),
        }
        for who, pid in procs.items():  # -1: no answer (the process did not report in 30 s)
            h = heap.get(who, {})
            row[f"{who}_rss_mb"] = round(rss(pid) * mb, 1)
            row[f"{who}_in_use_mb"] = round(h.get("in_use", -mb) * mb, 1)
            row[f"{who}_free_held_mb"] = round(h.get("free_held", -mb) * mb, 1)
            row[f"{who}_py_kblocks"] = round(h.get("py_blocks", -1000) / 1000, 1)
        self.rows.append(row)
        return row


def print_row(row: dict, header: bool) -> None:
    if header:
        print(" ".join(f"{k.removesuffix('_mb'):>{max(7, len(k) - 3)}}" for k in row), flush=True)
    print(" ".join(f"{v!s:>{max(7, len(k) - 3)}}" for k, v in row.items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--sample-s", type=float, default=30.0)
    ap.add_argument("--model-dir")
    ap.add_argument("--json")
    ap.add_argument("--log", default="/tmp/soak-server.log")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server (repeatable)")
    args = ap.parse_args()
    if args.model_dir is None:
        from spmd_serve.export import ensure_demo_model

        args.model_dir = str(ensure_demo_model(tp=2))
    env = dict(e.split("=", 1) for e in args.env)
    srv = ServerProcess(2, args.model_dir, Path(args.log), USE_WARMUP="1", **env)
    srv.start(timeout=600)
    try:
        base = f"http://127.0.0.1:{srv.http_port}"
        model = requests.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]
        sampler = Sampler(srv, f"http://127.0.0.1:{srv.env['METRICS_HTTP_PORT']}/metrics")
        tally: Counter = Counter()
        lock = threading.Lock()
        t0 = time.monotonic()
        print_row(sampler.sample(t0, tally), True)
        deadline = t0 + args.minutes * 60
        clients = [Client(i, base, model, deadline, tally, lock) for i in range(args.clients)]
        for c in clients:
            c.start()
        while time.monotonic() < deadline:
            time.sleep(min(args.sample_s, max(0.0, deadline - time.monotonic())))
            if srv.proc.poll() is not None:
                raise SystemExit(f"server exited with {srv.proc.returncode}:\n{srv.log()[-3000:]}")
            print_row(sampler.sample(t0, tally), False)
        for c in clients:
            c.join(330)  # a request in flight at the deadline finishes (timeout 300 s)
        idle_end = time.monotonic() + 120
        while (row := sampler.sample(t0, tally))["running"] and time.monotonic() < idle_end:
            time.sleep(1)
        print_row(row, False)
        result = {
            "args": vars(args),
            "tally": dict(sorted(tally.items())),
            "rows": sampler.rows,
            "all_blocks_free": row["free_blocks"] == row["total_blocks"],
        }
        print(json.dumps({k: result[k] for k in ("tally", "all_blocks_free")}), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    finally:
        srv.stop()
    if row["errors"] or not result["all_blocks_free"]:
        raise SystemExit("soak: failed requests or KV blocks still in use after the load (see above)")


if __name__ == "__main__":
    main()
