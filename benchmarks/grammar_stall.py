"""Whether a new JSON schema stalls the other requests' streams: while one plain completion streams
from `mpirun -n 1 spmd_serve` (the tiny demo model with a long context), --schemas requests each
send a schema never seen before (--props optional properties: a compile of ~0.1-0.3 s), one after
another.  Prints the plain stream's gaps between frames while they run (median, p99, max, and how
many exceed 100 ms), and each JSON request's time.

    PYTHONPATH=<tree> python benchmarks/grammar_stall.py [--schemas 4] [--props 40] [--model DIR]

Run it with PYTHONPATH at the tree to measure (the server imports spmd_serve from there): before and
after a change, back to back.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.stream_gaps import long_model_dir  # noqa: E402
from tests.support.server_process import ServerProcess  # noqa: E402


def schema(k: int, props: int) -> dict:
    kinds = ({"type": "integer"}, {"type": "string"}, {"type": ["number", "null"]})
    return {"type": "object", "properties": {f"p{k}_{i}": kinds[i % 3] for i in range(props)}}


def stream(base: str, frames: list[float], done: threading.Event) -> None:
    body = {"model": "default", "prompt": "Once upon a time", "max_tokens": 6000, "stream": True,
            "ignore_eos": True, "temperature": 0}  # fmt: skip
    with requests.post(base + "/v1/completions", json=body, stream=True, timeout=600) as res:
        if res.status_code != 200:
            print(f"the plain stream: {res.status_code} {res.text}", flush=True)
            return
        for line in res.iter_lines():
            if line.startswith(b"data: {"):
                frames.append(time.monotonic())
            if done.is_set():
                return


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schemas", type=int, default=4)
    ap.add_argument("--props", type=int, default=40)
    ap.add_argument("--model", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or long_model_dir(1, Path(tmp))
        with ServerProcess(1, str(model), Path(tmp) / "server.log", MAX_DEC_LEN="8000") as srv:
            base = f"http://127.0.0.1:{srv.http_port}"
            frames: list[float] = []
            done = threading.Event()
            reader = threading.Thread(target=stream, args=(base, frames, done), daemon=True)
            reader.start()
            while len(frames) < 50 and reader.is_alive():
                time.sleep(0.05)
            start, took = time.monotonic(), []
            for k in range(args.schemas):
                t = time.monotonic()
                body = {"model": "default", "prompt": "{", "max_tokens": 4, "guided_json": schema(k, args.props)}
                requests.post(base + "/v1/completions", json=body, timeout=120).raise_for_status()
                took.append(time.monotonic() - t)
            end = time.monotonic()
            done.set()
    gaps = [(b - a) * 1e3 for a, b in zip(frames, frames[1:]) if start <= b <= end]
    big = [
        (round(a, 3), round((b - a) * 1e3)) for a, b in zip(frames, frames[1:]) if start <= b <= end and b - a > 0.04
    ]
    print("big gaps (start, ms):", big)
    gaps.sort()
    print(f"plain stream during {args.schemas} new schemas of {args.props} properties ({end - start:.2f} s):")
    print(f"  frames {len(gaps)}, gap median {statistics.median(gaps):.1f} ms, p99 "
          f"{gaps[int(0.99 * (len(gaps) - 1))]:.1f} ms, max {gaps[-1]:.1f} ms, over 100 ms: "
          f"{sum(g > 100 for g in gaps)}")  # fmt: skip
    print("  JSON requests: " + ", ".join(f"{t * 1e3:.0f} ms" for t in took))


if __name__ == "__main__":
    main()
