"""Issue 6's goals, measured: each figure printed against its target (the numbers are the point,
not a pass/fail test — nothing here asserts on time).

    spmd_serve export --demo small --out /tmp/perf-small-tp1 --tp 1
    spmd_serve export --demo small --out /tmp/perf-small-tp2 --tp 2
    python benchmarks/goals.py --tp1 /tmp/perf-small-tp1 --tp2 /tmp/perf-small-tp2 [--reps 3] [--only NAME ...]

Goals (names for --only): `bandwidth` batch-1 decode vs the copy-bandwidth bound, `flops` batch-32
FLOP rate vs a numpy matmul of the same shapes, `overhead` engine overhead at batch 32 (offline
engine, decode steps), `overhead_served` the same goal on the served engine (`mpirun spmd_serve`
and 32 concurrent HTTP requests, phases from /metrics: benchmarks/goal_served.py), `tp2` TP=2 vs
TP=1 batch-1 decode speed, `paddlenlp` engine output throughput at concurrency 32 vs PaddleNLP's
own `generate` serving the same prompts one after another — both timed over the same work, prefill
and 48 forced output tokens of the same 16-token prompts (the engine from admission to its last
token) —, `frontend` frames/s of the HTTP front end over a fake engine.  Engine goals run
benchmarks/goal_engine.py under mpirun (`--reps` times, median); each reference figure is taken
in the same run as the figure it divides.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GOALS = ("bandwidth", "flops", "overhead", "overhead_served", "tp2", "paddlenlp", "frontend")


def mpi_env() -> dict[str, str]:
    env = dict(
        os.environ,
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        GLOG_minloglevel="2",
        OMPI_MCA_btl_vader_single_copy_mechanism="none",
        OPENBLAS_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def engine_run(
    model_dir: str, n: int, batch: int, threads: int | None = None, output_len: int = 48, segments: int = 1
) -> dict:
    """One goal_engine.py run under `mpirun -n n`, each rank with `threads` threads (None: the
    server's default, the cores divided by the ranks); its JSON line.  `segments`: TP = 1's decode
    in that many parts, each with the copy bandwidth of its moment (goal_engine.py)."""
    cmd = [
        "mpirun",
        "-n",
        str(n),
        "--oversubscribe",
        "--bind-to",
        "none",
        sys.executable,
        str(HERE / "goal_engine.py"),
        model_dir,
        "--batch",
        str(batch),
        "--output-len",
        str(output_len),
        "--threads",
        str(threads or max(1, (os.cpu_count() or 1) // n)),
        "--segments",
        str(segments),
    ]
    out = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=900)
    for line in out.stdout.splitlines():
        if line.startswith("GOAL_ENGINE "):
            return json.loads(line.split(" ", 1)[1])
    raise RuntimeError(f"goal_engine failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def median_of(runs: list[dict], key) -> float:
    return statistics.median(key(r) for r in runs)


def report(name: str, figure: float, target: str, ok: bool, detail: str) -> dict:
    print(f"{name:10s} {figure:10.3f}  target {target:8s} {'MET' if ok else 'NOT MET':8s} {detail}", flush=True)
    return {"goal": name, "figure": figure, "target": target, "met": ok, "detail": detail}


def overhead_ms(ms: dict) -> float:
    """Step time minus graph segments and collectives (KV writes and feed building count as overhead)."""
    graph = sum(v for k, v in ms.items() if k.startswith("segment_")) + ms["allreduce"] + ms["gather_logits"]
    step = sum(ms[p] for p in ("schedule", "broadcast", "execute", "sample", "update"))
    return step - graph


def paddlenlp_rate(num_prompts: int, input_len: int, output_len: int) -> float:
    """Output tokens/s of PaddleNLP's LlamaForCausalLM.generate (greedy, KV cache, exactly
    `output_len` tokens, prefill included) on the demo-small weights, one prompt after another
    (tests/support/paddlenlp_reference.py loads it); the prompts are goal_engine.py's first ones."""
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from spmd_serve.export.demo.checkpoint import write_demo_checkpoint
    from tests.support.paddlenlp_reference import load_reference_model, reference_generate

    with tempfile.TemporaryDirectory() as tmp:
        write_demo_checkpoint(Path(tmp), "small")  # the checkpoint `export --demo small` exports
        model = load_reference_model(tmp)
    rng = np.random.default_rng(0)
    prompts = [[1] + rng.integers(10, 1000, input_len - 1).tolist() for _ in range(num_prompts)]
    reference_generate(model, prompts[0], 4)  # warm-up
    t = time.perf_counter()
    tokens = sum(len(reference_generate(model, p, output_len)) for p in prompts)  # a list of ids
    return tokens / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp1", default="/tmp/perf-small-tp1")
    ap.add_argument("--tp2", default="/tmp/perf-small-tp2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", nargs="*", choices=GOALS, default=list(GOALS))
    ap.add_argument("--paddlenlp-prompts", type=int, default=4)
    ap.add_argument("--json", help="write every run and figure here")
    ap.add_argument("--threads-per-rank", type=int, help="default: the cores divided by the ranks, as the server")
    args = ap.parse_args()
    threads = args.threads_per_rank
    want, results, runs = set(args.only), [], {}
    if "bandwidth" in want:  # the decode in parts, a copy after each (see below)
        runs["tp1_b1"] = [engine_run(args.tp1, 1, 1, threads, segments=4) for _ in range(args.reps)]
    if "tp2" in want:
        # whole runs: a copy between parts would evict the small model's weights from the L3 (300 MB
        # here) and slow TP = 1's next part
        runs["tp1_b1_whole"] = [engine_run(args.tp1, 1, 1, threads) for _ in range(args.reps)]
        runs["tp2_b1"] = [engine_run(args.tp2, 2, 1, threads) for _ in range(args.reps)]
    if want & {"flops", "overhead", "paddlenlp"}:
        runs["tp1_b32"] = [engine_run(args.tp1, 1, 32, threads) for _ in range(args.reps)]
    if "bandwidth" in want:
        # the roofline is the copy bandwidth of the rank's threads (issue 16: two threads on this
        # machine), measured in the same process after each quarter of the decode steps: the
        # figure is the median over every part of every rep (the VM's bandwidth swings within
        # minutes); `whole_run` divides the whole decode by one copy measured after it, as before
        r = runs["tp1_b1"]
        parts = [(x["weight_bytes_per_step"], p) for x in r for p in x["segments"]]
        frac = statistics.median(w * p["steps_per_s"] / p["copy_threads_Bps"] for w, p in parts)
        whole = median_of(r, lambda x: x["weight_bytes_per_step"] * x["steps_per_s"] / x["copy_bandwidth_threads_Bps"])
        results.append(
            report(
                "bandwidth",
                frac,
                ">= 0.70",
                frac >= 0.7,
                f"{median_of(r, lambda x: x['steps_per_s']):.2f} steps/s x "
                f"{r[0]['weight_bytes_per_step'] / 1e6:.0f} MB / copy "
                f"{median_of(r, lambda x: x['copy_bandwidth_threads_Bps']) / 1e9:.1f} GB/s (read+write, "
                f"{r[0]['threads']} threads; one thread "
                f"{median_of(r, lambda x: x['copy_bandwidth_Bps']) / 1e9:.1f} GB/s); median of "
                f"{len(parts)} parts, each against its own copy (whole_run {whole:.2f})",
            )
        )
    if "flops" in want:
        r = runs["tp1_b32"]
        frac = median_of(r, lambda x: x["flops_per_token"] * x["tokens_per_s"] / x["numpy_matmul_flops"])
        results.append(
            report(
                "flops",
                frac,
                ">= 0.60",
                frac >= 0.6,
                f"{median_of(r, lambda x: x['flops_per_token'] * x['tokens_per_s']) / 1e9:.1f} GFLOP/s "
                f"vs numpy {median_of(r, lambda x: x['numpy_matmul_flops']) / 1e9:.1f} GFLOP/s (1 thread)",
            )
        )
    if "overhead" in want:
        r = runs["tp1_b32"]
        frac = median_of(r, lambda x: overhead_ms(x["ms_per_step"]) / (1e3 / x["steps_per_s"]))
        results.append(
            report(
                "overhead",
                frac,
                "<= 0.10",
                frac <= 0.1,
                f"{median_of(r, lambda x: overhead_ms(x['ms_per_step'])):.2f} ms of "
                f"{median_of(r, lambda x: 1e3 / x['steps_per_s']):.1f} ms per step",
            )
        )
    if "overhead_served" in want:
        sys.path.insert(0, str(ROOT))
        from goal_served import served_overhead

        r = [served_overhead(args.tp1, 1, 32, 12, 48) for _ in range(args.reps)]
        runs["served_b32"] = r
        frac = median_of(r, lambda x: x["overhead_fraction"])
        results.append(
            report(
                "overhead_served",
                frac,
                "<= 0.10",
                frac <= 0.1,
                f"{median_of(r, lambda x: x['overhead_ms_per_step']):.2f} ms of "
                f"{median_of(r, lambda x: x['step_ms']):.1f} ms per step, 32 HTTP requests x 48 tokens; "
                f"io hand-off {median_of(r, lambda x: x['io_handoff_ms_per_handoff']):.2f} ms a batch (HTTP worker)",
            )
        )
    if "tp2" in want:
        t1, t2 = (median_of(runs[k], lambda x: x["steps_per_s"]) for k in ("tp1_b1_whole", "tp2_b1"))
        ar = median_of(runs["tp2_b1"], lambda x: x["ms_per_step"]["allreduce"])
        # batch-1 decode streams the weights: two ranks can go at most (their summed copy bandwidth
        # while both copy) / (one process's alone) times faster than one, whatever the software
        bw2 = median_of(runs["tp2_b1"], lambda x: x.get("copy_bandwidth_concurrent_Bps", 0))
        bw1 = median_of(runs["tp1_b1_whole"], lambda x: x["copy_bandwidth_Bps"])
        # issue 16: within 10 % of TP = 1 on the same cores (two threads); issue 6's 1.6x was
        # against TP = 1 on one thread (--threads-per-rank 1)
        target = 0.9 if runs["tp1_b1_whole"][0]["threads"] > 1 else 1.6
        results.append(
            report(
                "tp2",
                t2 / t1,
                f">= {target}",
                t2 / t1 >= target,
                f"TP=2 {t2:.1f} vs TP=1 {t1:.1f} steps/s; TP=2 allreduce {ar:.1f} ms/step; "
                f"memory-bound ceiling {2 * bw2 / bw1:.2f}x (copy {2 * bw2 / 1e9:.1f} GB/s by 2 ranks "
                f"at once vs {bw1 / 1e9:.1f} GB/s by 1)",
            )
        )
    if "paddlenlp" in want:
        ours = median_of(runs["tp1_b32"], lambda x: x["whole_tokens_per_s"])  # prefill included, as generate()
        ref = paddlenlp_rate(args.paddlenlp_prompts, 16, 48)
        results.append(
            report(
                "paddlenlp",
                ours / ref,
                ">= 10",
                ours / ref >= 10,
                f"engine {ours:.0f} tok/s at batch 32 vs PaddleNLP generate {ref:.1f} tok/s sequential "
                "(both: 16-token prompts, prefill + 48 tokens)",
            )
        )
    if "frontend" in want:
        sys.path.insert(0, str(HERE))
        from frontend_server import frontend_frames_per_s

        rates = [frontend_frames_per_s(64, 200, mpi_env()) for _ in range(args.reps)]
        fps = statistics.median(rates)
        results.append(
            report(
                "frontend",
                fps,
                ">= 10000",
                fps >= 1e4,
                f"64 streams x 200 frames, fake engine step_s=0, native NDJSON; runs {rates}",
            )
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
