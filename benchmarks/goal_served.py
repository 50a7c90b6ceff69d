"""Issue 6's engine-overhead goal on the served engine (issue 17 item 5): `mpirun -n N spmd_serve`
with its HTTP worker, `batch` concurrent native requests, the step phases read from `/metrics`
(`spmd_serve:step_phase_seconds_total`, engine/step_stats.py) before and after them.

    python benchmarks/goal_served.py MODEL_DIR [--batch 32] [--input-words 12] [--output-len 48]

Overhead = the steps' time minus the graphs' (every `segment_<i>`, `allreduce`, `gather_logits`),
over the steps' time: schedule, plan broadcast, feed building, KV writes, sampling, the
scheduler's update and handing outputs to the front end, for the same requests the goal counts
(prefill steps included).  `io_handoff` (the front end delivering a batch into the requests'
queues, in the HTTP worker) is outside the step and reported beside it.  Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP = ("schedule", "broadcast", "execute", "sample", "update")


def phase_seconds(metrics_url: str) -> tuple[dict[str, float], float, float]:
    """({phase: seconds}, steps, io hand-offs) from one scrape."""
    import requests

    from tests.support.metrics_scrape import P, Samples

    s = Samples(requests.get(metrics_url, timeout=30).text)
    phases = {dict(k)["phase"]: v for (name, k), v in s.values.items() if name == P + "step_phase_seconds_total"}
    return phases, s.get("step_duration_seconds_count"), s.get("io_handoffs_total")


def served_overhead(model_dir: str, n: int, batch: int, input_words: int, output_len: int) -> dict:
    import requests

    from tests.support.server_process import ServerProcess

    words = "the quick brown fox jumps over a lazy dog near river bank at dawn".split()
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(n, model_dir, Path(tmp) / "server.log") as srv:
        metrics = f"http://127.0.0.1:{srv.env['METRICS_HTTP_PORT']}/metrics"

        def ask(i: int) -> int:
            text = " ".join(words[(i + k) % len(words)] for k in range(input_words))
            body = {"text": text, "max_dec_len": output_len, "min_dec_len": output_len, "temperature": 0}
            res = requests.post(srv.url, json=body, timeout=600).json()
            assert res["error_code"] == 0, res
            return int(res["tokens_all_num"])

        ask(-1)  # warm-up
        p0, steps0, handoffs0 = phase_seconds(metrics)
        t = time.perf_counter()
        with ThreadPoolExecutor(batch) as pool:
            tokens = sum(pool.map(ask, range(batch)))
        elapsed = time.perf_counter() - t
        p1, steps1, handoffs1 = phase_seconds(metrics)
    d = {k: p1[k] - p0.get(k, 0.0) for k in p1}
    steps = steps1 - steps0
    step_s = sum(d[k] for k in STEP)
    graph_s = (
        sum(v for k, v in d.items() if k.startswith("segment_")) + d.get("allreduce", 0) + d.get("gather_logits", 0)
    )
    return {
        "model_dir": model_dir,
        "ranks": n,
        "batch": batch,
        "steps": steps,
        "tokens": tokens,
        "tokens_per_s": tokens / elapsed,
        "ms_per_step": {k: 1e3 * v / max(steps, 1) for k, v in d.items()},
        "overhead_fraction": (step_s - graph_s) / step_s,
        "overhead_ms_per_step": 1e3 * (step_s - graph_s) / max(steps, 1),
        "step_ms": 1e3 * step_s / max(steps, 1),
        "io_handoff_ms_per_handoff": 1e3 * d.get("io_handoff", 0.0) / max(handoffs1 - handoffs0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("-n", type=int, default=1, help="ranks (the export's TP degree)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--input-words", type=int, default=12)
    ap.add_argument("--output-len", type=int, default=48)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    res = served_overhead(args.model_dir, args.n, args.batch, args.input_words, args.output_len)
    print("GOAL_SERVED " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
